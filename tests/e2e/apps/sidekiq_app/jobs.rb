# The Sidekiq 7.3 job of tests/e2e/test_sidekiq.py: LedgerPostingJob#perform does a little pure-Ruby work
# (LedgerPostingJob.tally), a short Kernel#sleep (an I/O stand-in) and takes a shared Mutex, contended (it sleeps
# 1 ms holding it). When the JOBS_TOTAL-th job has finished, the process sends itself SIGTERM: Sidekiq stops
# gracefully and exits 0, so the run is bounded by the number of jobs.
require "sidekiq"

class LedgerPostingJob
  include Sidekiq::Job

  LOCK = Thread::Mutex.new
  DONE = [0]
  TOTAL = Integer(ENV.fetch("JOBS_TOTAL"))

  def self.tally(seed, rounds)
    acc = seed
    rounds.times { |i| acc = (acc * 31 + i) % 1_000_003 }
    acc
  end

  def perform(n)
    v = self.class.tally(n, 20_000)
    sleep 0.002
    finished = LOCK.synchronize do
      v = self.class.tally(v, 2_000)
      sleep 0.001 # holding the lock: the other processors that reach it wait in Mutex#synchronize
      DONE[0] += 1
    end
    return unless finished == TOTAL

    $stdout.write("jobs done #{finished}\n")
    Process.kill("TERM", Process.pid)
  end
end
