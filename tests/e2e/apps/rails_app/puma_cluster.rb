# Puma configuration of tests/e2e/test_cluster.py: the Rails app in cluster mode, two workers forked from a master
# that loaded the app (preload_app!); threads and bind come from the command line.
# Each worker loads the in-process reference recorder itself (rvref, from the -I path) before its server starts, with
# its own output file RVREF_WORKER_DIR/worker-INDEX-PID.ref.rvtrace: the master does not load it (a recorder loaded
# there would be inherited by the workers, each writing its file over the master's), and a worker writes its file
# when it exits normally (SIGTERM from the master, or to the worker itself, which the master then forks again).
raise_exception_on_sigterm false
workers 2
preload_app!
# The test stops a worker to have the master fork a new one: the master checks its workers every second (default 5).
worker_check_interval 1
silence_fork_callback_warning
# A worker that does not stop within 6 s of SIGTERM is killed (default 30): test_cluster's rule WORKER_SHUTDOWN_HANG.
worker_shutdown_timeout 6

POOL_THREAD = /\Apuma srv tp \d/

on_worker_boot do |index|
  dir = ENV["RVREF_WORKER_DIR"]
  if dir
    ENV["RVREF_OUT"] = "#{dir}/worker-#{index}-#{Process.pid}.ref.rvtrace"
    ENV["RVREF_PROBES"] = "1"
    require "rvref"
    # Rule WORKER_SHUTDOWN_HANG: a worker's server thread can hang in IO#close once its pool has stopped. One second
    # after the pool's threads are gone the worker exits through its main thread instead (SystemExit: the at_exit
    # handlers run, so the reference writes its file); a worker that stops normally is gone by then.
    Thread.new do
      pool = -> { Thread.list.any? { |t| POOL_THREAD.match?(t.name.to_s) } }
      sleep 0.25 until pool.call
      sleep 0.25 while pool.call
      sleep 1
      Thread.main.raise(SystemExit.new(0))
    end
  end
end
