# The bundled example: two CPU-bound threads with a sleep in the middle, about one second in all.
#
#   sudo rvbpfd -o cpu_threads.rvtrace -- ruby examples/cpu_threads.rb
#   rvbpfd inspect cpu_threads.rvtrace
#
# What to look for in the trace: the two threads take turns holding the GVL in 100 ms timeslices (gvl_released /
# wants_gvl on one, gvl_acquired on the other); each thread's Kernel#sleep (sleep_enter, then gvl_released) lets the
# other run alone; thread_started runs on the main thread's native thread, gvl_acquired on the thread's own.

def burn(seconds)
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  iterations = 0
  iterations += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  iterations
end

started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
threads = 2.times.map do |i|
  Thread.new do
    work = burn(0.25)
    sleep 0.2
    work + burn(0.25)
  end
end
counts = threads.map(&:value)
elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
puts format("2 threads, %d loop iterations, %.2f s", counts.sum, elapsed)
