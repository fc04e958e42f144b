// Benchmark: how long a report of a one-million-event trace takes to open in headless Chromium (target: under 5 s).
// Not a test: it prints its measurements and exits 0 whatever they are.
//
//   node benchmarks/report_load.mjs --rvbpfd build/rvbpfd [--events 1000000] [--samples 100000] [--threads 8]
//                                   [--out-dir DIR]
//
// It writes a synthetic .rvtrace (threads trading the GVL in short slices, with sleeps, mutex waits, GC and a few
// events_dropped records; every gvl_released carries a stack and a release reason, and --samples CPU samples with
// stacks are spread over the trace, in the format of docs/rvtrace.md), builds its report with `rvbpfd report`, opens
// the report from disk and prints: the trace size, the report's size and build time, and the page's load time (from
// navigation start to the first frame drawn, as the page records it) plus the time of a zoom, a full redraw and a
// flame graph redraw. --samples 0 gives a trace without stacks.
// Needs tools/install-browser-deps.sh (Chromium and tests/browser/node_modules); no root.
import { createWriteStream, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { buildReport, fileUrl, launchChromium } from "../tests/browser/lib.mjs";

const { values: opts } = parseArgs({
  options: {
    rvbpfd: { type: "string" },
    events: { type: "string", default: "1000000" },
    samples: { type: "string", default: "100000" },
    threads: { type: "string", default: "8" },
    "out-dir": { type: "string" },
  },
});
if (!opts.rvbpfd) {
  console.error("usage: node benchmarks/report_load.mjs --rvbpfd PATH [--events N] [--threads N] [--out-dir DIR]");
  process.exit(2);
}
const targetEvents = Number(opts.events), nThreads = Number(opts.threads), nSamples = Number(opts.samples);
const outDir = opts["out-dir"] || mkdtempSync(path.join(tmpdir(), "rvbpfd-report-bench-"));

const CRUBY = {
  thread_started: "RUBY_INTERNAL_THREAD_EVENT_STARTED", wants_gvl: "RUBY_INTERNAL_THREAD_EVENT_READY",
  gvl_acquired: "RUBY_INTERNAL_THREAD_EVENT_RESUMED", gvl_released: "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED",
  thread_exited: "RUBY_INTERNAL_THREAD_EVENT_EXITED", gc_enter: "RUBY_INTERNAL_EVENT_GC_ENTER",
  gc_exit: "RUBY_INTERNAL_EVENT_GC_EXIT",
};
const SOURCE = { gc_enter: "gc_hook_site", gc_exit: "gc_hook_site", sleep_enter: "probe", mutex_lock_enter: "probe" };

async function writeTrace(file) {
  const out = createWriteStream(file);
  let buf = [], count = 0, t = 0;
  const flush = async () => {
    if (!out.write(buf.join(""))) await new Promise((r) => out.once("drain", r));
    buf = [];
  };
  const known = new Set();
  // Stacks: a small program of ~200 methods in a few files; stacks of depth 8-40 drawn from a fixed pool, so the
  // dictionary stays small the way a real program's does while the samples spread over many distinct stacks.
  const withStacks = nSamples > 0;
  const defined = new Set();
  const STACK_POOL = 3000;
  const stackPool = [];
  const useStack = (id) => {
    if (defined.has(id)) return;
    defined.add(id);
    for (const f of stackPool[id - 1]) {
      if (defined.has("f" + f)) continue;
      defined.add("f" + f);
      const cfunc = f % 7 === 0;
      buf.push(JSON.stringify({ frame: { id: f, label: cfunc ? `Kernel#m${f}` : `App::C${f % 13}#m${f}`,
        path: cfunc ? "<cfunc>" : `/app/lib/file${f % 17}.rb`, line: cfunc ? 0 : 10 + f, kind: cfunc ? "cfunc" : "ruby" } }) + "\n");
    }
    buf.push(`{"stack":{"id":${id},"frames":[${stackPool[id - 1].join(",")}]}}\n`);
  };
  const ev = (event, th, extra = "") => {
    const thread = th === null ? "null" : th;
    if (th !== null && !known.has(th)) { known.add(th); buf.push(`{"thread":{"ruby_thread":${th},"main":${th === 1}}}\n`); }
    const tid = th === null ? "null" : 5000 + th;
    const cruby = CRUBY[event] ? `"${CRUBY[event]}"` : "null";
    const source = SOURCE[event] || (event === "sample" ? "perf_event" : th === null ? "daemon" : "thread_hook_site");
    buf.push(`{"t_ns":${t},"ruby_thread":${thread},"native_tid":${tid},"probe_tid":${tid},"event":"${event}",` +
             `"cruby_event":${cruby},"source":"${source}","provenance":"observed"${extra}}\n`);
    count++;
  };
  // A small deterministic generator (xorshift), so every run measures the same trace.
  let seed = 0x2545f491;
  const rnd = (n) => { seed ^= seed << 13; seed ^= seed >>> 17; seed ^= seed << 5; return (seed >>> 0) % n; };
  for (let s = 0; s < STACK_POOL; s++) {
    const depth = 8 + rnd(33), frames = [];
    let f = 1 + rnd(5);  // a few roots
    for (let d = 0; d < depth; d++) { frames.push(f); f = 1 + ((f * 31 + rnd(4)) % 200); }
    stackPool.push(frames.reverse());  // leaf first
  }
  const REASONS = ["io", "sleep", "mutex", "queue", "timeslice"];
  // Samples per event slot, so they interleave with the scheduler events in time order.
  const sampleEvery = withStacks ? Math.max(1, targetEvents / nSamples) : Infinity;
  let sampleDebt = 0, samplesWritten = 0;
  buf.push(JSON.stringify({ rvtrace: 1, recorder: "rvbpfd", recorder_version: "bench", pid: 4242, ruby_version: "3.4.5",
    clock: "monotonic", origin_ns: 1000000, started_at: "2025-01-01T00:00:00.000000Z",
    channels: ["thread_hook_site", "gc_hook_site", "probe"], main_thread: 1 }) + "\n");
  ev("tracing_started", null);
  const threads = [];
  for (let k = 2; k < 2 + nThreads; k++) { t += 1000; ev("thread_started", k); ev("wants_gvl", k); threads.push(k); }
  t += 1000; ev("gvl_released", 1);
  let next = 0;
  while (count < targetEvents - 2 * nThreads - 2) {
    const th = threads[next]; next = (next + 1) % threads.length;
    t += 200 + rnd(2000); ev("gvl_acquired", th);
    t += 1000 + rnd(50000);
    const what = rnd(10);
    if (what === 0) { ev("sleep_enter", th); t += 2000; }
    else if (what === 1) { ev("mutex_lock_enter", th); t += 500; }
    else if (what === 2) { ev("gc_enter", null); t += 3000 + rnd(20000); ev("gc_exit", null); }
    else if (what === 3 && rnd(200) === 0) { t += 10; ev("events_dropped", null, `,"count":${1 + rnd(100)}`); }
    if (withStacks) {
      sampleDebt += 4 / sampleEvery;  // about four events per iteration
      while (sampleDebt >= 1 && samplesWritten < nSamples) {
        sampleDebt -= 1; samplesWritten++;
        const id = 1 + (rnd(8) === 0 ? rnd(STACK_POOL) : rnd(40));  // a few hot stacks, a long tail
        useStack(id);
        t += 1; ev("sample", th, `,"stack":${id}`);
      }
      const id = 1 + rnd(STACK_POOL);
      useStack(id);
      t += 10; ev("gvl_released", th, `,"reason":"${REASONS[rnd(REASONS.length)]}","reason_provenance":"derived","stack":${id}`);
    } else {
      t += 10; ev("gvl_released", th);
    }
    t += 10; ev("wants_gvl", th);
    if (buf.length > 10000) await flush();
  }
  t += 1000;
  for (const th of threads) { t += 100; ev("gvl_acquired", th); t += 100; ev("thread_exited", th); }
  ev("tracing_stopped", null);
  await flush();
  await new Promise((r) => out.end(r));
  return { count, samples: samplesWritten, stacks: [...defined].filter((d) => typeof d === "number").length };
}

const mb = (bytes) => (bytes / 1048576).toFixed(1) + " MB";
const trace = path.join(outDir, "report-bench.rvtrace");
let t0 = performance.now();
const written = await writeTrace(trace);
console.log(`trace: ${written.count} events (${written.samples} samples, ${written.stacks} stacks), ${nThreads} threads, ${mb(statSync(trace).size)} (${trace}), written in ${((performance.now() - t0) / 1000).toFixed(2)} s`);

const report = path.join(outDir, "report-bench.html");
t0 = performance.now();
buildReport(opts.rvbpfd, trace, report);
console.log(`rvbpfd report: ${mb(statSync(report).size)} in ${((performance.now() - t0) / 1000).toFixed(2)} s`);

const { context, userDataDir } = await launchChromium();
try {
  const page = await context.newPage();
  t0 = performance.now();
  await page.goto(fileUrl(report), { timeout: 120_000 });
  await page.waitForSelector('body[data-ready="1"]', { timeout: 120_000 });
  const wall = (performance.now() - t0) / 1000;
  const m = await page.evaluate(() => ({
    nav: performance.now(), script: window.rvReportLoadMs,
    blocks: window.rvReport.data.threads.reduce((n, t) => n + t.n, 0) + window.rvReport.data.owner.n,
  }));
  // A redraw of the whole trace (every lane, pixel-merged) and one at a 1 µs-wide view.
  const redraw = await page.evaluate(() => {
    const R = window.rvReport, m = R.data.meta, out = {};
    R.setView(m.start_ns, m.end_ns);
    let s = performance.now(); for (let i = 0; i < 10; i++) R.drawNow(); out.full = (performance.now() - s) / 10;
    const mid = (m.start_ns + m.end_ns) / 2;
    R.setView(mid - 500, mid + 500);
    s = performance.now(); for (let i = 0; i < 10; i++) R.drawNow(); out.micro = (performance.now() - s) / 10;
    if (R.flame) {
      s = performance.now(); for (let i = 0; i < 10; i++) R.flame.draw(); out.flame = (performance.now() - s) / 10;
      s = performance.now(); R.flame.select(R.data.threads[1].id); R.flame.select("all"); out.flameSelect = (performance.now() - s) / 2;
    }
    return out;
  });
  console.log(`load: ${wall.toFixed(2)} s from navigation to the first frame (page script ${(m.script / 1000).toFixed(2)} s; ` +
              `${m.blocks} blocks); target < 5 s: ${wall < 5 ? "met" : "NOT met"}`);
  console.log(`redraw: whole trace ${redraw.full.toFixed(1)} ms, 1 µs view ${redraw.micro.toFixed(1)} ms` +
              (redraw.flame !== undefined ? `; flame graph ${redraw.flame.toFixed(1)} ms, thread switch ${redraw.flameSelect.toFixed(1)} ms` : ""));
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
