#!/usr/bin/env python3
"""The fleet agent's memory budget against hostile tenants (issue 45, item 3).

Three Ruby processes of an unprivileged user (`nobody`, setpriv) each define 1,100 methods whose names are 60 KB and
whose source paths are 60 KB (distinct), and recurse through all of them, each level calling the next from one of 16
call sites picked at random (so every method is seen at 16 pcs: ~17,600 distinct frames per process, each ~2 KiB once
the symbolizer cut its label and path to 1 KiB), for DURATION seconds, sampled at 99 Hz. The agent runs with
--memory-budget 64M and pushes to a fake Pyroscope; once every process was pushed and the budget evicted (at most
WAIT_MAX s: the first deep stacks of new 60 KB names take long to name on a loaded host), DURATION s more. Checked:
  - the agent's peak RSS (VmHWM in /proc/PID/status) stays under the budget plus BASE_MIB, the agent's fixed base
    (binary and libraries, BPF ring, sinks, the analysis of the VM binary; docs/deploy.md "Memory budget"): 64 MiB +
    96 MiB; without the budget the same run peaks at ~240 MiB (docs/benchmarks.md);
  - rvbpfd_memory_evictions_total > 0 and rvbpfd_memory_held_bytes <= rvbpfd_memory_budget_bytes on /metrics;
  - all three processes were attached, and profiles of each were pushed.
RVBPFD_BENCH_NO_BUDGET=1 runs the same without the --memory-budget flag and only prints the peak (for measuring
binaries without the flag).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_pyroscope  # noqa: E402
import rvlib  # noqa: E402

NOBODY = 65534
DURATION = 20
WAIT_MAX = 240
BUDGET_MIB = 64
BASE_MIB = 96
METHODS = 1100
NAME_BYTES = 60_000

HOSTILE_RB = r"""
n, len, secs = ARGV.map(&:to_i)
NAMES = (0...n).map { |i| :"m#{'%05d' % i}_#{'x' * len}" }
n.times do |i|
  call = i + 1 < n ? "__send__(nx, i + 1)" : "spin"
  sites = (0...16).map { |s| "when #{s} then #{call}" }.join("\n")
  Object.class_eval("def #{NAMES[i]}(i)\n nx = NAMES[i + 1]\n case rand(16)\n#{sites}\n end\nend\n",
                    "/srv/p#{'%05d' % i}_#{'p' * len}.rb", 1)
end
def spin
  x = 0
  20_000.times { x += 1 }
  x
end
STDOUT.puts "ready"
STDOUT.flush
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + secs
__send__(NAMES[0], 0) while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
"""


def as_nobody(argv):
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"] + argv


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main():
    args = rvlib.parse_args(__doc__.split("\n")[0])
    res = rvlib.Results()
    rvbpfd = rvlib.require_rvbpfd(args.rvbpfd)
    rvlib.require_bpf_environment()
    no_budget = os.environ.get("RVBPFD_BENCH_NO_BUDGET") == "1"
    name = (args.ruby or ["3.4.5-static"])[0]
    ruby = rvlib.Ruby(name, rvlib.find_ruby(args.source_dir, name), None)

    work = tempfile.mkdtemp(prefix="rvbpfd-agent-memory-")
    os.chmod(work, 0o755)
    script = os.path.join(work, "hostile.rb")
    with open(script, "w") as f:
        f.write(HOSTILE_RB)
    os.chmod(script, 0o644)
    recv_dir = os.path.join(work, "recv")
    os.makedirs(recv_dir)
    port_file = os.path.join(work, "port")
    receiver = rvlib.start_fake_pyroscope(recv_dir, port_file)
    procs, agent = [], None
    try:
        deadline = time.time() + 20
        while not os.path.exists(port_file) and time.time() < deadline:
            time.sleep(0.05)
        if not os.path.exists(port_file):
            raise rvlib.Fatal("fake_pyroscope did not start")
        port = int(open(port_file).read())
        env = dict(os.environ, **ruby.env)
        # Defining the methods takes a few seconds; they recurse once all three are ready.
        for _ in range(3):
            procs.append(subprocess.Popen(as_nobody([ruby.bin, script, str(METHODS), str(NAME_BYTES),
                                                     str(WAIT_MAX + 60)]),
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, cwd=work))
        for p in procs:
            if p.stdout.readline().strip() != b"ready":
                raise rvlib.Fatal(f"hostile Ruby {p.pid} did not start")
        argv = [rvbpfd, "agent", "--push-url", f"http://127.0.0.1:{port}", "--interval", "5", "--hz", "99",
                "--metrics-listen", "127.0.0.1:0", "--log-format", "json", "--host", "e2e-memory",
                "--include", "comm:ruby", "--cache-dir", os.path.join(work, "sites")]
        if not no_budget:
            argv += ["--memory-budget", f"{BUDGET_MIB}M"]
        agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log = rvlib.LineReader(agent.stderr)

        def records():
            out = []
            for line in list(log.lines):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
            return out

        started = None
        deadline = time.time() + 60
        while started is None and time.time() < deadline and agent.poll() is None:
            started = next((r for r in records() if r.get("msg") == "agent started"), None)
            time.sleep(0.1)
        if started is None:
            raise rvlib.Fatal("the agent did not start:\n" + "\n".join(log.lines[-20:]))
        mport = started.get("metrics_port")
        # DURATION seconds of hostile load once every process has been pushed and an eviction happened (a loaded
        # host takes long to name the first 1,100-deep stacks of 60 KB names), at most WAIT_MAX in all.
        until = time.time() + WAIT_MAX
        ready_at = None
        while time.time() < until and agent.poll() is None:
            time.sleep(2)
            if ready_at is None:
                pushed = {u["labels"].get("pid") for u in fake_pyroscope.load_uploads(recv_dir)}
                m = rvlib.agent_metrics(mport)
                if all(str(p.pid) in pushed for p in procs) and (no_budget or
                                                                 m.get("rvbpfd_memory_evictions_total", 0) > 0):
                    ready_at = time.time()
            elif time.time() > ready_at + DURATION:
                break
        alive = agent.poll() is None
        peak_mib = vm_hwm_kib(agent.pid) / 1024 if alive else -1
        m = rvlib.agent_metrics(mport) if alive else {}
        print(f"agent peak RSS (VmHWM) {peak_mib:.1f} MiB; budget {'none' if no_budget else BUDGET_MIB} MiB; "
              f"held {m.get('rvbpfd_memory_held_bytes', -1) / 2**20:.1f} MiB; evictions "
              f"{m.get('rvbpfd_memory_evictions_total')}; samples {m.get('rvbpfd_samples_total')}")
        with open(os.path.join(work, "agent.log"), "w") as f:
            f.write("\n".join(log.lines))
        print(f"agent log: {work}/agent.log")
        if no_budget:
            return
        res.check("the agent survived the hostile processes", [] if alive else
                  [f"agent exited {agent.returncode}: " + "\n".join(log.lines[-10:])])
        res.check(f"peak RSS {peak_mib:.1f} MiB < budget {BUDGET_MIB} MiB + base {BASE_MIB} MiB",
                  [] if 0 < peak_mib < BUDGET_MIB + BASE_MIB else [f"VmHWM {peak_mib:.1f} MiB"])
        prob = []
        if m.get("rvbpfd_memory_budget_bytes") != BUDGET_MIB << 20:
            prob.append(f"rvbpfd_memory_budget_bytes {m.get('rvbpfd_memory_budget_bytes')}")
        if not m.get("rvbpfd_memory_evictions_total", 0) > 0:
            prob.append(f"rvbpfd_memory_evictions_total {m.get('rvbpfd_memory_evictions_total')}")
        if not 0 < m.get("rvbpfd_memory_held_bytes", -1) <= BUDGET_MIB << 20:
            prob.append(f"rvbpfd_memory_held_bytes {m.get('rvbpfd_memory_held_bytes')}")
        res.check("the budget evicted and held at most the budget (/metrics)", prob)
        attached = {r.get("pid") for r in records() if r.get("msg") == "process attached"}
        pushed = {u["labels"].get("pid") for u in fake_pyroscope.load_uploads(recv_dir)}
        prob = [f"pid {p.pid} not attached" for p in procs if p.pid not in attached]
        prob += [f"no profile of pid {p.pid} pushed (pushed: {sorted(pushed)[:10]})" for p in procs
                 if str(p.pid) not in pushed]
        res.check("all three attached and profiles of each pushed", prob)
    except rvlib.Fatal as e:
        res.check("setup", [str(e)])
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        for p in procs:
            p.kill()
            p.wait()
        receiver.kill()
        receiver.wait()
    res.finish()


if __name__ == "__main__":
    main()
