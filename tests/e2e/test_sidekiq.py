#!/usr/bin/env python3
"""A real Sidekiq process with redis-server in a container, under Debian's own ruby3.3, recorded by rvbpfd in attach
mode.

In the root of tools/make-trixie-root.sh --apps (Debian trixie's ruby-sidekiq 7.3 and redis-server), each in new pid
and mount namespaces (applib, rvlib.Container; no network namespace, so both meet on the host's 127.0.0.1):
redis-server on a free loopback port (--save '' --appendonly no: nothing written), and Sidekiq with five processor
threads (tests/e2e/apps/sidekiq_app) and the in-process reference recorder loaded. rvbpfd attaches before Sidekiq is
required (serve.rb's protocol); then JOBS jobs of LedgerPostingJob are pushed and worked through (pure-Ruby work, a
short sleep and a contended Mutex each), and the last job stops the process (SIGTERM to itself: a graceful stop).

Checks:
  - Sidekiq exits 0 after all JOBS jobs ran;
  - scheduler, GC and Kernel#sleep / Mutex#lock probe events identical to the reference per thread (namespace tids
    one to one with the host's) and rvbpfd's trace holds the invariants;
  - the job's frames are named in stacks at release: LedgerPostingJob#perform in the stacks of releases in Kernel#sleep
    and in Mutex#synchronize, under Sidekiq's processor (Sidekiq::Processor#process).
  - the endpoint (issue 47 item 3): the pprof export's and inspect's only named endpoint is LedgerPostingJob.
Every frame of every stack is named, boot and exit included (no `<unresolved` frame: issue 46 item 4), up to rule
NON_MAIN_GC_NOT_HELD (applib.py).
"""
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import applib  # noqa: E402
import rvlib  # noqa: E402

JOBS = 60
CONCURRENCY = 5
JOB = "LedgerPostingJob#perform"


def redis_ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(container, port):
    log = open(os.path.join(container.workdir, "redis.log"), "wb")
    proc = subprocess.Popen(container.wrap(["/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", str(port),
                                            "--save", "", "--appendonly", "no", "--daemonize", "no"]),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=container.environment())
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if redis_ping(port):
            return proc
        time.sleep(0.1)
    rvlib._kill(proc)
    with open(os.path.join(container.workdir, "redis.log"), "rb") as f:
        tail = f.read()[-2000:].decode("utf-8", "replace")
    raise rvlib.RunError(f"redis-server did not answer PING on 127.0.0.1:{port} within 30 s; log:\n{tail}")


def job_problems(trace):
    p = []
    by_top = {}
    for e in applib.released_with(trace, JOB):
        labels = trace.stack_labels(e)
        by_top[labels[0]] = by_top.get(labels[0], 0) + 1
        if "Sidekiq::Processor#process" not in labels:
            p.append(f"a stack with {JOB} lacks Sidekiq::Processor#process: {labels[:40]}")
            break
    for top in ("Kernel#sleep", "Thread::Mutex#synchronize"):
        if not by_top.get(top):
            p.append(f"no release in {top} under {JOB} (releases under {JOB} by top frame: {by_top})")
    depths = [len(trace.stack_frames(e)) for e in applib.released_with(trace, JOB)]
    print(f"  stacks: releases under {JOB} by top frame {by_top}, {min(depths, default=0)}..{max(depths, default=0)} "
          f"frames deep; {applib.census_text(trace)}")
    return p + applib.unresolved_problems(trace)


def endpoint_problems(rvbpfd, trace):
    """Issue 47 item 3 (model/endpoint.h, rule sidekiq_job): the pprof export labels the job's samples, waits and
    blame endpoint=LedgerPostingJob, and names no other endpoint; inspect's endpoints section lists it."""
    prof, problem = rvlib.export_pprof(rvbpfd, trace.path, trace.path + ".endpoints.pb.gz")
    if problem:
        return [problem]
    wall = [t for t, _ in prof["sample_types"]].index("wall")
    by, rules = {}, set()
    for smp in prof["samples"]:
        e = smp["labels"].get("endpoint")
        by[e] = by.get(e, 0) + smp["values"][wall]
        if e not in ("-", None):
            rules.add(smp["labels"].get("endpoint_rule"))
    print(f"  endpoints: " + ", ".join(f"{e} {ns / 1e6:.0f} ms wall" for e, ns in sorted(by.items(), key=str)))
    p = []
    if sorted(e for e in by if e != "-") != ["LedgerPostingJob"] or rules != {"sidekiq_job"} or not by.get(
            "LedgerPostingJob"):
        p.append(f"endpoints {sorted(by, key=str)} with rules {rules}: want LedgerPostingJob (sidekiq_job) alone")
    r = subprocess.run([rvbpfd, "inspect", trace.path], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or "\n  LedgerPostingJob " not in r.stdout:
        p.append(f"inspect (exit {r.returncode}) has no endpoint row LedgerPostingJob: {r.stdout[-1500:]}")
    return p


def main():
    started = time.monotonic()
    args, res, rvbpfd, container, apps = applib.begin(__doc__)
    redis = app = None
    try:
        port = rvlib.free_port()
        redis = start_redis(container, port)
        app = applib.App(container, "sidekiq", f"{apps}/sidekiq_app/serve.rb",
                         ["-r", f"{apps}/sidekiq_app/jobs.rb", "-c", str(CONCURRENCY), "-t", "10"],
                         {"REDIS_URL": f"redis://127.0.0.1:{port}/0", "JOBS_TOTAL": str(JOBS),
                          "APP_ENV": "production"})
        app.start()
        app.attach(rvbpfd, ("--cache-dir", os.path.join(container.workdir, "cache")))
        t_go = time.monotonic()
        app.go()
        done = app.out.wait_for(lambda l: l.startswith("jobs done"), 90)
        run = app.finish()
        print(f"  sidekiq: {done!r} {time.monotonic() - t_go:.1f} s after go (boot included)")
        res.check(f"sidekiq: {JOBS} jobs worked through, exit 0",
                  ([] if done == f"jobs done {JOBS}" else [f"the last job never reported; {app.stderr()}"])
                  + [x for x in run.problems if "exited" in x and "rvbpfd" not in x])
        res.check("sidekiq: events identical to the in-process reference per thread (attach, pid+mount namespaces)",
                  applib.event_problems(run))
        if run.rv is not None:
            res.check(f"sidekiq: {JOB} named in stacks at release; every frame named", job_problems(run.rv))
            res.check("sidekiq: the job's endpoint is LedgerPostingJob in the pprof export and inspect (issue 47 "
                      "item 3)", endpoint_problems(rvbpfd, run.rv))
    except (rvlib.RunError, rvlib.Fatal, OSError) as e:
        res.check("sidekiq: run", [str(e)])
    finally:
        if app is not None:
            app.close()
        if redis is not None:
            rvlib._kill(redis)
        container.cleanup(args.keep)
        print(f"wall time {time.monotonic() - started:.1f} s")
    res.finish()


if __name__ == "__main__":
    main()
