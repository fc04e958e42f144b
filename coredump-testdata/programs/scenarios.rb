# frozen_string_literal: true
# One process, many stack shapes. The main thread nests most call forms on its way to RvGolden.capture; other threads
# sit in the blocking states a profiler must name (sleep, Mutex, pipe IO, a 1,000-deep recursion, a busy loop).
# Run by tools/record-coredump-case (and tests/stacks' live test) with -rrvgolden and RVGOLDEN_OUT set: the capture
# writes CRuby's own view of every thread's stack and SIGSTOPs the process, GVL held.

module Mixin                       # included: frames show the module through the iclass
  def mixed
    yield
  end
end

module Around                      # prepended
  def wrapped
    super { yield }
  end
end

class Base
  include Mixin

  def wrapped
    yield
  end
end

class Foo < Base
  prepend Around

  def self.cls                     # singleton method on a class: Foo.cls
    yield
  end

  def bar                          # block and nested block inside a method
    [1].each do
      1.times do
        yield
      end
    end
  end

  define_method(:dm) do |&blk|     # define_method body: a bmethod
    blk.call
  end
end

Anon = Class.new do                # assigned after creation: permanent name "Anon"
  def named_later
    yield
  end
end
ANON_INSTANCE = Class.new do       # never named: #<Class:0x...>
  def hi
    yield
  end
end.new

OBJ = Object.new
def OBJ.single                     # singleton method on a plain object: #<Object:0x...>.single
  yield
end

def recurse(n, &blk)
  n.zero? ? blk.call : recurse(n - 1, &blk)
end

def nap
  sleep
end

def lock_it(m)
  m.synchronize { :never }
end

def read_pipe(r)
  r.read(1)
end

def spin
  x = 0
  loop { x += 1 }
end

def wait_until(threads, status)
  threads.each do |t|
    sleep 0.01 until t.status == status || t.status.nil? || t.status == false
  end
end

def capture_now
  out = ENV.fetch("RVGOLDEN_OUT")
  RvGolden.capture(out, ENV.fetch("RVGOLDEN_STOP", "1") == "1")
end

mutex = Mutex.new
reader, writer = IO.pipe
mutex.lock

sleeper = Thread.new { nap }
sleeper.name = "sleeper"
waiter = Thread.new { lock_it(mutex) }
waiter.name = "mutex"
io = Thread.new { read_pipe(reader) }
io.name = "io"
deep = Thread.new { recurse(1000) { sleep } }
deep.name = "deep"
wait_until([sleeper, waiter, io, deep], "sleep")
spinner = Thread.new { spin }
spinner.name = "spinner"
sleep 0.05 until spinner.status == "run" && spinner.backtrace.to_a.any? { |l| l.include?("spin") }
sleep 0.2

# The main thread: top-level blocks, Kernel#loop, Integer#times, Array#each, singleton methods, anonymous classes,
# included and prepended modules, define_method and eval, then the capture.
[1].each do
  2.times do |i|
    next if i.zero?
    loop do
      Foo.cls do
        Foo.new.bar do
          Foo.new.dm do
            OBJ.single do
              ANON_INSTANCE.hi do
                Anon.new.named_later do
                  Foo.new.mixed do
                    Foo.new.wrapped do
                      eval("capture_now", binding, "(scenario eval)", 1)
                    end
                  end
                end
              end
            end
          end
        end
      end
      break
    end
  end
end
writer.write("x")
