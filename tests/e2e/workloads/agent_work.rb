# Fleet agent workload (tests/e2e/test_agent.py, benchmarks/agent_budget.py): ARGV[0] names the hot method
# (hot_a .. hot_e), so each process's CPU profile has its own recognisable frame. Two threads run it and contend for
# a mutex and the GVL (gvl_wait and gvl_held by stack), a third runs GC.start periodically (gc). ARGV[1], when given,
# is the iteration count per burst, ARGV[2] the sleep between bursts (s) and ARGV[3] the GC period (s): the benchmark
# uses a lighter mix.
# Prints "ready <pid>" (and " worker <pid>" with AGENT_WORK_FORK=1, below) once running; a line (or EOF) on stdin
# ends it cleanly.
class AgentWork
  def initialize(iterations)
    @iterations = iterations
    @lock = Mutex.new
  end

  def burn
    x = 0
    @iterations.times { |i| x += i * i }
    x
  end

  def hot_a = @lock.synchronize { burn }
  def hot_b = @lock.synchronize { burn }
  def hot_c = @lock.synchronize { burn }
  def hot_d = @lock.synchronize { burn }
  def hot_e = @lock.synchronize { burn }
end

name = ARGV.fetch(0)
iterations = Integer(ARGV.fetch(1, "20000"))
pause = Float(ARGV.fetch(2, "0.004"))
gc_period = Float(ARGV.fetch(3, "0.25"))

# Starts the worker and GC threads; returns a proc that stops and joins them.
def start(name, iterations, pause, gc_period)
  work = AgentWork.new(iterations)
  stop = false
  workers = Array.new(2) do
    Thread.new do
      until stop
        work.public_send(name)
        sleep pause
      end
    end
  end
  gc = Thread.new do
    until stop
      GC.start
      sleep gc_period
    end
  end
  lambda do
    stop = true
    workers.each(&:join)
    gc.join
  end
end

# AGENT_WORK_FORK=1: also fork a worker process (like a preforking server's), which never execs; it runs the same
# workload and is stopped with SIGTERM when the parent ends.
worker = nil
if ENV["AGENT_WORK_FORK"] == "1"
  worker = fork do
    stopper = start(name, iterations, pause, gc_period)
    Signal.trap("TERM") { exit!(0) }
    sleep
    stopper.call
  end
end
stopper = start(name, iterations, pause, gc_period)
$stdout.puts "ready #{Process.pid}#{worker ? " worker #{worker}" : ""}"
$stdout.flush
$stdin.gets
stopper.call
if worker
  Process.kill("TERM", worker)
  Process.wait(worker)
end
