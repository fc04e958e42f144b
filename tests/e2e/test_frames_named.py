#!/usr/bin/env python3
"""Every frame named, from boot to exit (issue 46 item 4; docs/design.md "Naming frames before they go").

Per test Ruby, in launch mode with the defaults (--stacks=release, --hz 99), three short programs whose frames the VM
frees or takes away early:
  - `ruby -e 1` and `ruby -e 'p 1'`: RubyGems' boot (dozens of files whose top-level iseqs are garbage once loaded)
    and the process's exit, which used to come before the daemon had read its last records;
  - a chain of 30 files, each loaded by the previous one's require_relative, each releasing the GVL in its top-level
    code (a 2 ms sleep and a File.read) before it loads the next.
The chain once more in attach mode (`rvbpfd --pid`, attached while a gate script waits before its first
require_relative): the target is held too (--hold's default, the note on stderr says so), at GCs and at its exit.
Each recording has no `<unresolved ...>` frame in any stack, and has stacks at all (the chain: every file's
`<top (required)>` frame is named, with its path). The counts (stacks, unresolved) are printed per case.
Rule LINE_OF_EVAL_ISEQ (a known gap, counted and printed, not failed): on 3.3.8, in some runs the two frames of the
iseq RubyGems evals a gemspec into (under Kernel#eval, Gem::Specification#initialize) are `<unresolved line ...>`:
their label and path read fine from the same live iseq, and only Symbolizer::LineNumber refuses the pc. That is the
line table lookup, not an object freed before naming (what this test is about), and is left for its own fix.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rvlib  # noqa: E402

CHAIN_FILES = 30


def write_chain(d):
    """f00.rb .. f29.rb: each sleeps 2 ms, reads itself, then require_relative's the next; returns f00.rb."""
    for i in range(CHAIN_FILES):
        nxt = f'require_relative "f{i + 1:02d}"\n' if i + 1 < CHAIN_FILES else ""
        with open(os.path.join(d, f"f{i:02d}.rb"), "w") as f:
            f.write(f"# chain file {i}\nsleep 0.002\nFile.read(__FILE__)\n$chain = {i}\n{nxt}")
    return os.path.join(d, "f00.rb")


def record(rvbpfd, ruby, args, out):
    env = dict(os.environ)
    for k in ("RUBYOPT", "RUBY_YJIT_ENABLE", "RVREF_OUT"):
        env.pop(k, None)
    env.update(ruby.env)
    p = subprocess.run([rvbpfd, "-o", out, "--hz", "99", "--", ruby.bin, *args], env=env, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        return None, [f"rvbpfd exited {p.returncode}: {p.stderr.strip()[-1500:]}"]
    return rvlib.Trace(out), []


def record_attached(rvbpfd, ruby, gate, out):
    """The gate script under `rvbpfd --pid`: attached while it waits, then let go; (trace, problems)."""
    env = dict(os.environ)
    for k in ("RUBYOPT", "RUBY_YJIT_ENABLE", "RVREF_OUT"):
        env.pop(k, None)
    env.update(ruby.env)
    target = subprocess.Popen([ruby.bin, gate], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    rv = None
    try:
        out_lines = rvlib.LineReader(target.stdout)
        if out_lines.wait_for(lambda l: l == "ready", 60) is None:
            return None, [f"the gate script never printed ready: {target.stderr.read()[-500:]!r}"]
        rv = subprocess.Popen([rvbpfd, "--pid", str(target.pid), "-o", out, "--hz", "99"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = rvlib.LineReader(rv.stderr)
        if err.wait_for(lambda l: l.startswith("rvbpfd: attached"), 60) is None:
            return None, [f"rvbpfd did not attach (exit {rv.poll()}): {err.text()[-1500:]}"]
        target.stdin.write(b"go\n")
        target.stdin.flush()
        rc = target.wait(60)
        rv_rc = rv.wait(60)
        err.t.join(5)
        problems = [] if rc == 0 else [f"the target exited {rc}"]
        if rv_rc != 0:
            return None, problems + [f"rvbpfd exited {rv_rc}: {err.text()[-1500:]}"]
        if "is traced with ptrace while recorded" not in err.text():
            problems.append(f"no hold note on rvbpfd's stderr (the target was not held): {err.text()[-800:]}")
        t = rvlib.Trace(out)
        t.problems = t.problems + problems
        return t, []
    except subprocess.TimeoutExpired as e:
        return None, [f"timed out: {e}"]
    finally:
        for p in (target, rv):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


LINE_RULE = "LINE_OF_EVAL_ISEQ"


def unresolved(t):
    """(stacks used by events, unresolved frame occurrences in them, distinct unresolved labels, occurrences of
    `<unresolved line` frames, which rule LINE_OF_EVAL_ISEQ counts apart)."""
    used = {e["stack"] for e in t.events if "stack" in e}
    count = line_only = 0
    labels = set()
    for sid in used:
        for fid in t.stacks.get(sid, []):
            label = t.frames.get(fid, {}).get("label", "")
            if label.startswith("<unresolved line "):
                line_only += 1
            elif label.startswith("<unresolved"):
                count += 1
                labels.add(label)
    return len(used), count, labels, line_only


def check_case(name, t, extra=None):
    p = list(t.problems)
    nstacks, count, labels, line_only = unresolved(t)
    print(f"  {name}: {nstacks} stacks, {count} unresolved frames ({len(labels)} distinct)" +
          (f"; {line_only} <unresolved line frames ({LINE_RULE})" if line_only else ""))
    if nstacks == 0:
        p.append("no stacks recorded at all")
    if count:
        p.append(f"{count} <unresolved frames in {nstacks} stacks, e.g. {sorted(labels)[:5]}")
    if extra:
        p += extra(t)
    return p


def chain_named(d):
    def check(t):
        tops = set()
        for f in t.frames.values():
            path = f.get("path", "")
            if f.get("label") == "<top (required)>" and os.path.dirname(path) == d:
                tops.add(os.path.basename(path))
        missing = [f"f{i:02d}.rb" for i in range(1, CHAIN_FILES) if f"f{i:02d}.rb" not in tops]
        return [f"top-level frames of {missing[:8]} never named"] if missing else []
    return check


def main():
    args, res, rvbpfd, rubies = rvlib.begin(__doc__)
    work = tempfile.mkdtemp(prefix="rvbpfd-frames-")
    os.chmod(work, 0o755)
    chain_dir = os.path.join(work, "chain")
    os.makedirs(chain_dir)
    os.chmod(chain_dir, 0o755)
    first = write_chain(chain_dir)
    gate = os.path.join(chain_dir, "gate.rb")
    with open(gate, "w") as f:
        f.write('$stdout.puts "ready"\n$stdout.flush\n$stdin.gets\nrequire_relative "f00"\n')
    cases = [("ruby -e 1", ["-e", "1"], None), ("ruby -e 'p 1'", ["-e", "p 1"], None),
             (f"{CHAIN_FILES}-file require_relative chain", [first], chain_named(chain_dir))]
    for ruby in rubies:
        for i, (name, rargs, extra) in enumerate(cases):
            out = os.path.join(work, f"{ruby.name}-{i}.rvtrace")
            t, problems = record(rvbpfd, ruby, rargs, out)
            if t is not None:
                problems = check_case(name, t, extra)
            res.check(f"{ruby.name}: {name}: every frame named (launch, --hz 99, stacks at release)", problems)
        out = os.path.join(work, f"{ruby.name}-attach.rvtrace")
        t, problems = record_attached(rvbpfd, ruby, gate, out)
        if t is not None:
            problems = check_case(f"attached: {CHAIN_FILES}-file chain", t, chain_named(chain_dir))
        res.check(f"{ruby.name}: attached, {CHAIN_FILES}-file chain: every frame named (--pid, held)", problems)
    res.finish(work, args.keep)


if __name__ == "__main__":
    main()
