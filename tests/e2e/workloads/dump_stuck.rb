# Workload for test_dump.py: a process that is stuck in every way `rvbpfd dump` tells apart, and stays so until it is
# killed. Two threads lock two Mutexes in opposite order (a deadlock), one counts in Ruby code forever (the CPU
# thread), one reads a pipe nobody writes, one pops an empty Queue, one pushes to a full SizedQueue, one waits on a
# ConditionVariable, one waits to enter a Monitor the main thread holds, and the main thread sleeps. Each thread
# names itself and, on the line where it blocks, first records CRuby's own frames with tests/golden's
# RvGolden.capture (every thread's rb_profile_thread_frames, to $RVGOLDEN_OUT/<name>.json): the dump must give the
# same frames below the leaf (RvGolden.capture there, the blocking call in the dump, with Thread::Mutex#sleep above
# ConditionVariable#wait; the CPU thread's leaf is its own method, whose line is the loop's, 0 under YJIT). The
# Queue, SizedQueue, ConditionVariable and Monitor are named by address (their inspect) in $RVGOLDEN_OUT/objects.json.
# Needs RVGOLDEN_DIR (the built extension) and RVGOLDEN_OUT (a directory). Prints "ready" once every thread has
# recorded its frames, then the main thread sleeps.
$LOAD_PATH.unshift(ENV.fetch("RVGOLDEN_DIR"))
require "rvgolden"
require "json"
require "monitor"

OUT = ENV.fetch("RVGOLDEN_OUT")

class Worker
  def self.crunch(name)
    RvGolden.capture("#{OUT}/#{name}.json", false); count = 0; count += 1 while true
  end

  def self.lock_both(name, first, second, mine, theirs)
    first.lock
    mine << :locked
    theirs.pop
    RvGolden.capture("#{OUT}/#{name}.json", false); second.lock
  end

  def self.pull(name, r) = (RvGolden.capture("#{OUT}/#{name}.json", false); r.read(1))
  def self.take(name, q) = (RvGolden.capture("#{OUT}/#{name}.json", false); q.pop)
  def self.give(name, q) = (RvGolden.capture("#{OUT}/#{name}.json", false); q.push(:more))
  def self.await(name, m, cv) = m.synchronize { RvGolden.capture("#{OUT}/#{name}.json", false); cv.wait(m) }
  def self.enter(name, mon) = (RvGolden.capture("#{OUT}/#{name}.json", false); mon.synchronize { })
end

m1 = Thread::Mutex.new
m2 = Thread::Mutex.new
qa = Thread::Queue.new
qb = Thread::Queue.new
r, _w = IO.pipe
empty = Thread::Queue.new
full = Thread::SizedQueue.new(1)
full << :full
cv_mutex = Thread::Mutex.new
cv = Thread::ConditionVariable.new
mon = Monitor.new
Thread.current.name = "main"
mon.enter  # held by the main thread while it sleeps
# The objects as Ruby names them (inspect shows the address): the dump must name the same ones.
File.write(File.join(OUT, "objects.json"),
           JSON.generate({"queue" => empty, "szq" => full, "cv" => cv, "mon" => mon}
                           .transform_values { |o| o.inspect[/0x\h+/] }))
threads = [
  Thread.new { Thread.current.name = "lock_a"; Worker.lock_both("lock_a", m1, m2, qa, qb) },
  Thread.new { Thread.current.name = "lock_b"; Worker.lock_both("lock_b", m2, m1, qb, qa) },
  Thread.new { Thread.current.name = "cpu"; Worker.crunch("cpu") },
  Thread.new { Thread.current.name = "pipe"; Worker.pull("pipe", r) },
  Thread.new { Thread.current.name = "queue"; Worker.take("queue", empty) },
  Thread.new { Thread.current.name = "szq"; Worker.give("szq", full) },
  Thread.new { Thread.current.name = "cv"; Worker.await("cv", cv_mutex, cv) },
  Thread.new { Thread.current.name = "mon"; Worker.enter("mon", mon) },
]
names = %w[lock_a lock_b cpu pipe queue szq cv mon]
Thread.pass until names.all? { |n| File.exist?(File.join(OUT, "#{n}.json")) }
RvGolden.capture("#{OUT}/main.json", false); $stdout.write("ready\n"); $stdout.flush; sleep
threads.each(&:join)
