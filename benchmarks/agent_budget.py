#!/usr/bin/env python3
"""Fleet agent budget benchmark (not a test): what `rvbpfd agent` itself costs with many Ruby processes.

The budgets (issue 13): the agent's own CPU at most 0.5% of one core and its peak RSS at most 60 MB, with 50 Ruby
processes sampled at 19 Hz (the fleet default) with scheduler events on.

Setup: N (default 50) Ruby processes, alternating the two test Rubies (3.3.8 shared libruby, 3.4.5 static), each
running tests/e2e/workloads/agent_work.rb with a light mix (two threads doing a short burst under a mutex then
sleeping, a third running GC.start every second: about 2-3% of a core each on this 2-core VM, so scheduler events,
stacks at release and samples all flow; 50 x 5-10% would need more cores than this machine has). Then the agent with
its fleet defaults (--hz 19, --stacks release, --interval 15, --max-overhead 5) pushing to the loopback receiver
tests/e2e/fake_pyroscope.py. After a warm-up (all processes attached, the first interval cut), over --seconds
(default 60):
  - agent CPU: (utime + stime) delta of /proc/AGENT/stat over the wall time, % of one core (the budget's figure,
    what `rvbpfd_agent_cpu_seconds_total` reports; counted in 10 ms clock ticks: steps of 0.017% of a core over 60 s);
  - the same to the nanosecond: the delta of every agent thread's run time (/proc/AGENT/task/*/schedstat), which
    tells apart changes smaller than a tick in A/B runs;
  - agent RSS: VmRSS at the end and VmHWM (peak) from /proc/AGENT/status;
  - events/s and samples/s the agent handled (rvbpfd_events_total / rvbpfd_samples_total on its /metrics);
  - the Ruby processes' own CPU (context), profiles built and delivered, drops.
Prints a table and the verdict against the budgets; --json writes the figures.

The receiver answers at once, in one segment, as a real server does; --backend-delay-ms N makes it answer N ms later
(a backend across a network: the agent's delivery thread then sleeps and wakes once per upload).

--cold-cache gives the agent an empty site cache, so its peak RSS includes the first analysis of each Ruby binary
(a fresh host), not only the steady state.

Usage: sudo benchmarks/agent_budget.py --build-dir build [--processes 50] [--seconds 60] [--warmup 25]
       [--backend-delay-ms 0] [--cold-cache]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
E2E = os.path.join(REPO, "tests", "e2e")
sys.path.insert(0, E2E)
import fake_pyroscope  # noqa: E402

CPU_BUDGET_PCT = 0.5
RSS_BUDGET_BYTES = 60 * 1000 * 1000
RUBIES = ("3.3.8-shared", "3.4.5-static")
HZ = os.sysconf("SC_CLK_TCK")


def ruby_bin(name):
    prefix = subprocess.run(["bash", os.path.join(REPO, "tools", "build-test-rubies.sh"), "--print-prefix", name],
                            check=True, capture_output=True, text=True).stdout.strip()
    path = os.path.join(prefix, "bin", "ruby")
    if not os.access(path, os.X_OK):
        sys.exit(f"test Ruby {name} missing at {prefix}: run tools/build-test-rubies.sh")
    return path


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime, stime (fields 14 and 15 of stat)


def run_ns(pid):
    """CPU time of all of pid's threads now, ns (schedstat's first field: time on a CPU). A thread that ended since
    the last call is missing from the difference: the agent's threads live as long as it does."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def status_bytes(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--processes", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=25)
    ap.add_argument("--iterations", default="5000", help="loop iterations per burst in each worker thread")
    ap.add_argument("--pause", default="0.03", help="sleep between bursts (s)")
    ap.add_argument("--gc-period", default="1.0", help="seconds between GC.start calls in each process")
    ap.add_argument("--backend-delay-ms", type=float, default=0.0,
                    help="the receiver answers each push this much later (a backend across a network)")
    ap.add_argument("--cold-cache", action="store_true",
                    help="give the agent an empty site cache (its first analysis of each Ruby binary is measured)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (the agent loads BPF)")
    rvbpfd = os.path.join(os.path.abspath(args.build_dir), "rvbpfd")
    rubies = [ruby_bin(r) for r in RUBIES]
    work = tempfile.mkdtemp(prefix="rvbpfd-agent-bench-")
    recv = os.path.join(work, "recv")
    os.makedirs(recv)
    port_file = os.path.join(work, "port")
    receiver = subprocess.Popen([sys.executable, os.path.join(E2E, "fake_pyroscope.py"), "--port", "0",
                                 "--out-dir", recv, "--port-file", port_file,
                                 "--response-delay-ms", str(args.backend_delay_ms)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs, agent = [], None
    try:
        while not os.path.exists(port_file):
            time.sleep(0.05)
        port = int(open(port_file).read())
        hot = ("hot_a", "hot_b", "hot_c", "hot_d")
        for i in range(args.processes):
            p = subprocess.Popen([rubies[i % 2], os.path.join(E2E, "workloads", "agent_work.rb"), hot[i % 4],
                                  args.iterations, args.pause, args.gc_period],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            procs.append(p)
        for p in procs:
            if not p.stdout.readline().startswith(b"ready"):
                sys.exit(f"a workload did not start (pid {p.pid})")
        log_path = os.path.join(work, "agent.log")
        log = open(log_path, "w")
        agent_cmd = [rvbpfd, "agent", "--push-url", f"http://127.0.0.1:{port}", "--metrics-listen", "127.0.0.1:0",
                     "--log-format", "json"]
        if args.cold_cache:
            agent_cmd += ["--cache-dir", os.path.join(work, "sites")]
        agent = subprocess.Popen(agent_cmd,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        mport = None
        deadline = time.time() + 60
        while mport is None and time.time() < deadline:
            time.sleep(0.2)
            for line in open(log_path):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("msg") == "agent started":
                    mport = rec.get("metrics_port")
        if mport is None:
            sys.exit("the agent did not start:\n" + open(log_path).read()[-2000:])
        time.sleep(args.warmup)
        m0 = metrics(mport)
        if m0.get("rvbpfd_processes_watched", 0) < args.processes:
            print(f"warning: only {m0.get('rvbpfd_processes_watched')} of {args.processes} processes watched")
        t0 = time.time()
        a0 = cpu_seconds(agent.pid)
        n0 = run_ns(agent.pid)
        r0 = sum(cpu_seconds(p.pid) for p in procs)
        time.sleep(args.seconds)
        t1 = time.time()
        a1 = cpu_seconds(agent.pid)
        n1 = run_ns(agent.pid)
        r1 = sum(cpu_seconds(p.pid) for p in procs)
        m1 = metrics(mport)
        rss = status_bytes(agent.pid, "VmRSS")
        hwm = status_bytes(agent.pid, "VmHWM")
        wall = t1 - t0
        cpu_pct = 100.0 * (a1 - a0) / wall
        fig = {
            "processes": args.processes,
            "watched": m1.get("rvbpfd_processes_watched", 0),
            "binaries_probed": m1.get("rvbpfd_binaries_probed", 0),
            "seconds": round(wall, 1),
            "agent_cpu_pct_of_one_core": round(cpu_pct, 3),
            "agent_run_pct_of_one_core": round(100.0 * (n1 - n0) / 1e9 / wall, 4),
            "agent_rss_bytes": rss,
            "agent_rss_peak_bytes": hwm,
            "events_per_s": round((m1.get("rvbpfd_events_total", 0) - m0.get("rvbpfd_events_total", 0)) / wall, 1),
            "samples_per_s": round((m1.get("rvbpfd_samples_total", 0) - m0.get("rvbpfd_samples_total", 0)) / wall, 1),
            "profiles_built": m1.get("rvbpfd_profiles_built_total", 0),
            "push_delivered": m1.get("rvbpfd_push_delivered_total", 0),
            "dropped_ring_full_events": m1.get('rvbpfd_dropped_total{reason="ring_full_events"}', 0),
            "dropped_ring_full_samples": m1.get('rvbpfd_dropped_total{reason="ring_full_samples"}', 0),
            "dropped_queue_full": m1.get('rvbpfd_dropped_total{reason="queue_full"}', 0),
            "ruby_cpu_pct_total": round(100.0 * (r1 - r0) / wall, 1),
            "load_avg_1m": os.getloadavg()[0],
        }
        cpu_ok = cpu_pct <= CPU_BUDGET_PCT
        rss_ok = hwm <= RSS_BUDGET_BYTES
        print(f"rvbpfd agent, {args.processes} Ruby processes ({', '.join(RUBIES)} alternating), --hz 19, "
              f"--stacks release, {wall:.0f} s after {args.warmup:.0f} s warm-up")
        print(f"{'figure':<38} {'value':>14}  budget")
        print(f"{'agent CPU (% of one core)':<38} {cpu_pct:>14.3f}  <= {CPU_BUDGET_PCT}%  "
              f"{'PASS' if cpu_ok else 'FAIL'}")
        print(f"{'  the same, from run time in ns':<38} {fig['agent_run_pct_of_one_core']:>14.4f}")
        print(f"{'agent RSS now / peak (MB)':<38} {rss / 1e6:>6.1f} / {hwm / 1e6:>5.1f}  "
              f"<= {RSS_BUDGET_BYTES / 1e6:.0f} MB  {'PASS' if rss_ok else 'FAIL'}")
        print(f"{'processes watched / binaries probed':<38} {fig['watched']:>6.0f} / {fig['binaries_probed']:>5.0f}")
        print(f"{'events/s handled':<38} {fig['events_per_s']:>14.1f}")
        print(f"{'samples/s handled':<38} {fig['samples_per_s']:>14.1f}")
        print(f"{'profiles built / delivered':<38} {fig['profiles_built']:>6.0f} / {fig['push_delivered']:>5.0f}")
        print(f"{'dropped: ring events/samples, queue':<38} {fig['dropped_ring_full_events']:.0f}/"
              f"{fig['dropped_ring_full_samples']:.0f}, {fig['dropped_queue_full']:.0f}")
        print(f"{'Ruby processes CPU total (% of a core)':<38} {fig['ruby_cpu_pct_total']:>14.1f}")
        print(f"{'load average (1 min)':<38} {fig['load_avg_1m']:>14.2f}")
        print(f"verdict: {'PASS' if cpu_ok and rss_ok else 'FAIL'} (CPU {'within' if cpu_ok else 'over'} budget, "
              f"RSS {'within' if rss_ok else 'over'} budget)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(fig, f, indent=1)
    finally:
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
        for p in procs:
            try:
                p.stdin.write(b"\n")
                p.stdin.flush()
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        receiver.terminate()
        receiver.wait()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
