# Starts Puma on the Rails app, following the end-to-end workload protocol (tests/e2e/rvlib.py): prints "ready", blocks
# reading one line of stdin, so rvbpfd attaches while only the main thread exists and the whole boot is recorded,
# then runs Puma::CLI with this script's arguments until SIGTERM stops it, and prints "done".
$stdout.sync = true
$stdout.write("ready\n")
$stdin.gets
require "puma/cli"
Puma::CLI.new(ARGV).run
$stdout.write("done\n")
