# Runs a Sidekiq process on LedgerPostingJob (jobs.rb), following the end-to-end workload protocol
# (tests/e2e/rvlib.py): prints "ready", blocks reading one line of stdin (rvbpfd attaches while only the main thread
# exists), then pushes JOBS_TOTAL jobs to the Redis of REDIS_URL and runs Sidekiq::CLI with this script's arguments
# (-r jobs.rb among them). The last job sends SIGTERM; Sidekiq stops and exits 0.
$stdout.sync = true
$stdout.write("ready\n")
$stdin.gets
require "sidekiq/cli"
require_relative "jobs"
Sidekiq::Client.push_bulk("class" => LedgerPostingJob, "args" => Array.new(LedgerPostingJob::TOTAL) { |i| [i] })
$stdout.write("pushed #{LedgerPostingJob::TOTAL}\n")
cli = Sidekiq::CLI.instance
cli.parse(ARGV.dup)
cli.run
