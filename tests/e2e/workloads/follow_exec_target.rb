# test_follow.py: the image exec'd by `ruby -e 'exec RUBY, this file'`: one thread besides main, then a child that
# execs /bin/true (not Ruby: listed as skipped).
t = Thread.new do
  x = 0
  100_000.times { x += 1 }
  sleep 0.005
  x
end
t.join
system("/bin/true") or exit(3)
