# Workload: a Queue producer and a consumer; the consumer blocks on pop whenever the queue is empty.
# Protocol: see cpu_sleep.rb.
$stdout.write("ready\n"); $stdout.flush
$stdin.gets
q = Queue.new
producer = Thread.new do
  100.times do |i|
    q.push(i)
    sleep 0.001 if i % 5 == 0
  end
  q.push(:stop)
end
consumer = Thread.new do
  sum = 0
  while (v = q.pop) != :stop
    sum += v
  end
  sum
end
producer.join
raise "queue: sum #{consumer.value}" unless consumer.value == (0...100).sum
$stdout.write("done\n"); $stdout.flush
