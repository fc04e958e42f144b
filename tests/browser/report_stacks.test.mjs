// The report's stacks and flame graph in a real browser, on a hand-written trace (docs/rvtrace.md: frame and stack
// dictionary lines, events with "stack", gvl_released with a derived "reason", "sample" events), so it needs no
// root, no Ruby and no stack-recording producer. Run by ctest (tests/browser/CMakeLists.txt) or by hand:
//
//   RVBPFD_BIN=build/rvbpfd RVBPFD_BUILD_DIR=build node --test tests/browser/report_stacks.test.mjs
//
// Environment: RVBPFD_BIN (required), RVBPFD_BUILD_DIR (where the traces, reports and report-stacks-screenshot.png
// go; default a temp dir), RVBPFD_CHROMIUM (default /usr/bin/chromium).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { buildReport, fileUrl, launchChromium } from "./lib.mjs";

const SUSPENDED = "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED";
const RESUMED = "RUBY_INTERNAL_THREAD_EVENT_RESUMED";
// A frame label that would be markup if the page ever parsed trace text as HTML.
const HOSTILE = '</script><b id="injected">x</b>';

// Frames: id -> [label, path, line, kind].
const FRAMES = {
  1: ["<main>", "/app/main.rb", 1, "ruby"],
  2: ["Worker#run", "/app/worker.rb", 10, "ruby"],
  3: ["Integer#times", "<cfunc>", 0, "cfunc"],
  4: ["Worker#hot", "/app/worker.rb", 20, "ruby"],
  5: ["Worker#cold", "/app/worker.rb", 30, "ruby"],
  6: ["Kernel#sleep", "<cfunc>", 0, "cfunc"],
  7: [HOSTILE, "/app/<evil>&.rb", 7, "ruby"],
  8: ["Worker#hot", "/app/worker.rb", 21, "ruby"],  // the same function at another line: merged in the flame graph
};
// Stacks, leaf first.
const STACKS = {
  1: [4, 3, 2, 1],   // hot
  2: [5, 3, 2, 1],   // cold
  3: [6, 2, 1],      // where thread 2 sleeps
  4: [2, 1],         // in Worker#run itself
  5: [7, 1],         // the hostile frame
  6: [8, 3, 2, 1],   // hot, another line
};
// Samples per [thread, stack]: thread 2 spends 70 of the 100 samples in Worker#hot (60 + 10 at line 21).
const SAMPLES = [[2, 1, 60], [2, 6, 10], [3, 2, 20], [2, 4, 5], [3, 5, 5]];

// Writes the trace; returns what the test needs to know about it. `withSamples` false drops every sample line.
function writeTrace(file, withSamples) {
  const lines = [];
  const push = (o) => lines.push(JSON.stringify(o));
  push({ rvtrace: 1, recorder: "rvbpfd", recorder_version: "test", pid: 4242, ruby_version: "3.4.5", clock: "monotonic",
         origin_ns: 1_000_000, started_at: "2025-01-01T00:00:00.000000Z",
         channels: ["thread_hook_site", "gc_hook_site", "probe", "perf_event"], main_thread: 1, sample_hz: 1000,
         stacks: "release" });
  const defined = { frame: new Set(), stack: new Set(), thread: new Set() };
  const useStack = (id) => {
    if (defined.stack.has(id)) return;
    for (const f of STACKS[id]) {
      if (defined.frame.has(f)) continue;
      defined.frame.add(f);
      const [label, p, line, kind] = FRAMES[f];
      push({ frame: { id: f, label, path: p, line, kind } });
    }
    defined.stack.add(id);
    push({ stack: { id, frames: STACKS[id] } });
  };
  const CRUBY = { thread_started: "RUBY_INTERNAL_THREAD_EVENT_STARTED", wants_gvl: "RUBY_INTERNAL_THREAD_EVENT_READY",
                  gvl_acquired: RESUMED, gvl_released: SUSPENDED, thread_exited: "RUBY_INTERNAL_THREAD_EVENT_EXITED" };
  let count = 0;
  const ev = (t, event, th, extra = {}) => {
    if (th !== null && !defined.thread.has(th)) { defined.thread.add(th); push({ thread: { ruby_thread: th, main: th === 1 } }); }
    if (extra.stack !== undefined) useStack(extra.stack);
    const tid = th === null ? null : 700 + th;
    const source = event === "sample" ? "perf_event" : th === null ? "daemon" : "thread_hook_site";
    push({ t_ns: t, ruby_thread: th, native_tid: tid, probe_tid: tid, event, cruby_event: CRUBY[event] || null, source,
           provenance: "observed", ...extra });
    return count++;
  };
  const MS = 1_000_000;
  const at = {};
  ev(0, "tracing_started", null);
  ev(1 * MS, "thread_started", 2); ev(1 * MS + 1000, "wants_gvl", 2);
  ev(2 * MS, "thread_started", 3); ev(2 * MS + 1000, "wants_gvl", 3);
  ev(3 * MS, "gvl_released", 1, { reason: "join", reason_provenance: "derived", stack: 4 });
  // Thread 2 runs 3..60 ms (samples), then sleeps with a stack: the released block the test clicks.
  at.t2run = ev(3 * MS + 100, "gvl_acquired", 2);
  let t = 4 * MS;
  const sampleRun = (th, from, to) => {
    for (const [sth, stack, n] of SAMPLES) {
      if (sth !== th) continue;
      for (let k = 0; k < n; k++) {
        t += Math.floor((to - from) / 120);
        if (withSamples) ev(t, "sample", th, { stack });
      }
    }
  };
  t = 4 * MS; sampleRun(2, 4 * MS, 60 * MS);
  at.t2release = ev(61 * MS, "gvl_released", 2, { reason: "sleep", reason_provenance: "derived", stack: 3 });
  at.t3run = ev(61 * MS + 100, "gvl_acquired", 3);
  t = 62 * MS; sampleRun(3, 62 * MS, 90 * MS);
  at.t3release = ev(91 * MS, "gvl_released", 3, { reason: "io", reason_provenance: "derived", stack: 5 });
  at.t2wants = ev(120 * MS, "wants_gvl", 2);
  ev(121 * MS, "gvl_acquired", 2);
  ev(125 * MS, "thread_exited", 2);
  ev(126 * MS, "tracing_stopped", null);
  writeFileSync(file, lines.join("\n") + "\n");
  return at;
}

let context, userDataDir, workDir, page, traceInfo, noSamplesReport;
const pageErrors = [];
const requests = [];

before(async () => {
  const rvbpfd = process.env.RVBPFD_BIN;
  assert.ok(rvbpfd && existsSync(rvbpfd), "set RVBPFD_BIN to the rvbpfd binary");
  workDir = process.env.RVBPFD_BUILD_DIR || mkdtempSync(path.join(tmpdir(), "rvbpfd-browser-stacks-"));
  mkdirSync(workDir, { recursive: true });
  const trace = path.join(workDir, "report-stacks-test.rvtrace");
  traceInfo = writeTrace(trace, true);
  const report = buildReport(rvbpfd, trace, path.join(workDir, "report-stacks-test.html"));
  const bare = path.join(workDir, "report-stacks-nosamples.rvtrace");
  writeTrace(bare, false);
  noSamplesReport = buildReport(rvbpfd, bare, path.join(workDir, "report-stacks-nosamples.html"));
  ({ context, userDataDir } = await launchChromium());
  page = await context.newPage();
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  page.on("console", (msg) => { if (msg.type() === "error") pageErrors.push(msg.text()); });
  page.on("request", (req) => { if (!req.url().startsWith("file:")) requests.push(req.url()); });
  await page.goto(fileUrl(report));
  await page.waitForSelector('body[data-ready="1"]', { timeout: 30_000 });
});

after(async () => {
  if (context) await context.close();
  if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
});

// Zooms onto the block of `laneId` whose opening (or closing) event is `eventIndex` and clicks it with the mouse;
// returns the card's data attributes, its text and the stacks it lists.
async function clickBlockOf(laneId, which, eventIndex) {
  const target = await page.evaluate(([laneId, which, ei]) => {
    const R = window.rvReport, t = R.data.threads.find((x) => "thread-" + x.id === laneId);
    let i = -1;
    for (let k = 0; k < t.n; k++) if ((which === "opening" ? t.o[k] : t.c[k]) === ei) i = k;
    if (i < 0) return null;
    const s = t.s[i], e = t.e[i], pad = (e - s) * 0.5;
    R.setView(s - pad, e + pad);
    R.drawNow();
    const rect = R.laneRect(laneId);
    return { x: R.clientX((s + e) / 2), y: rect.y + rect.height / 2, index: i };
  }, [laneId, which, eventIndex]);
  assert.ok(target, `a block of ${laneId} with ${which} event ${eventIndex}`);
  await page.mouse.click(target.x, target.y);
  return page.$eval("#card", (c) => ({
    ...c.dataset, text: c.textContent,
    stackLists: [...c.querySelectorAll("ol.stack")].map((ol) => ({ which: ol.dataset.which, event: Number(ol.dataset.event),
      frames: [...ol.querySelectorAll("li")].map((li) => li.textContent) })),
    injected: c.querySelectorAll("#injected, b").length,
  }));
}

async function flameRects() { return page.evaluate(() => window.rvReport.flame.rects()); }
async function flameState() { return page.evaluate(() => window.rvReport.flame.state()); }
const width = (r) => r.x1 - r.x0;

test("the page loads without errors or network requests and shows the flame graph", async () => {
  assert.deepEqual(pageErrors, []);
  assert.deepEqual(requests, []);
  assert.equal(await page.$eval("#flame", (f) => f.hidden), false);
  assert.doesNotMatch(await page.$eval("#notes", (n) => n.textContent), /no CPU samples/);
  const meta = await page.evaluate(() => window.rvReport.data.meta);
  assert.equal(meta.samples, 100);
  assert.equal(meta.sample_hz, 1000);
});

test("clicking a released block shows the stack and the release reason of its gvl_released", async () => {
  const card = await clickBlockOf("thread-2", "opening", traceInfo.t2release);
  assert.equal(card.kind, "block");
  assert.equal(card.crubyEvent, SUSPENDED);
  assert.match(card.text, /released/);
  assert.equal(card.releaseReason, "sleep");
  assert.equal(card.releaseReasonProvenance, "derived");
  assert.match(card.text, /release reason\s*sleep\s*derived/);
  assert.equal(card.stackLists.length, 1, JSON.stringify(card.stackLists));
  assert.equal(card.stackLists[0].which, "opening");
  assert.equal(card.stackLists[0].event, traceInfo.t2release);
  // Leaf first, "label (path:line)", no line for C frames.
  assert.deepEqual(card.stackLists[0].frames,
      ["Kernel#sleep (<cfunc>)", "Worker#run (/app/worker.rb:10)", "<main> (/app/main.rb:1)"]);
});

test("a running block closed by a release shows the closing stack; trace text stays text", async () => {
  const card = await clickBlockOf("thread-3", "closing", traceInfo.t3release);
  assert.equal(card.crubyEvent, RESUMED);
  assert.equal(card.releaseReason, "io");
  assert.match(card.text, /release reason \(closing event\)/);
  assert.equal(card.stackLists.length, 1);
  assert.equal(card.stackLists[0].which, "closing");
  assert.deepEqual(card.stackLists[0].frames, [`${HOSTILE} (/app/<evil>&.rb:7)`, "<main> (/app/main.rb:1)"]);
  assert.equal(card.injected, 0, "a frame label was parsed as markup");
  assert.equal(await page.locator("#injected").count(), 0);
  // A block whose events have no stack (wants_gvl .. gvl_acquired) says so.
  const plain = await clickBlockOf("thread-2", "opening", traceInfo.t2wants);
  assert.equal(plain.stackLists.length, 0);
  assert.equal(plain.stacks, "0");
  assert.match(plain.text, /not recorded for the events of this block/);
});

test("the flame graph shows the hot frame widest; hover shows its samples and share", async () => {
  await page.locator("#flame").scrollIntoViewIfNeeded();
  const st = await flameState();
  assert.equal(st.total, 100);
  assert.equal(st.zoom, "all threads");
  const rects = await flameRects();
  const hot = rects.filter((r) => r.label === "Worker#hot");
  assert.equal(hot.length, 1, "Worker#hot at two lines is one frame: " + JSON.stringify(hot));
  assert.equal(hot[0].samples, 70);
  assert.ok(Math.abs(width(hot[0]) - 0.7 * st.width) < 1, `${width(hot[0])} of ${st.width}`);
  // Every frame but its callers (the rows above that span it) is narrower.
  for (const r of rects) {
    if (r.label === "Worker#hot") continue;
    const caller = r.row < hot[0].row && r.x0 <= hot[0].x0 + 1e-6 && r.x1 >= hot[0].x1 - 1e-6;
    if (!caller) assert.ok(width(r) < width(hot[0]), `${r.label} is at least as wide as the hot frame`);
  }
  assert.ok(rects.some((r) => r.label === "Worker#cold" && width(r) > 0), "the other frames are drawn too");
  const canvas = await page.evaluate(() => window.rvReport.flame.canvasRect());
  await page.mouse.move(canvas.x + (hot[0].x0 + hot[0].x1) / 2, canvas.y + (hot[0].row + 0.5) * st.rowHeight);
  const tip = await page.$eval("#flame-tip", (t) => ({ hidden: t.hidden, text: t.textContent, label: t.dataset.label }));
  assert.equal(tip.hidden, false);
  assert.equal(tip.label, "Worker#hot");
  assert.match(tip.text, /70 samples · 70\.0% of all threads/);
  assert.match(tip.text, /\/app\/worker\.rb:20, 21/);
  assert.match(tip.text, /≈ 70\.000 ms on CPU/);
});

test("clicking a frame zooms into it; a caller row zooms back out", async () => {
  const st = await flameState();
  const clickFrame = async (label) => {
    const r = (await flameRects()).find((x) => x.label === label && !x.caller);
    assert.ok(r, `frame ${label} drawn`);
    const c = await page.evaluate(() => window.rvReport.flame.canvasRect());
    await page.mouse.click(c.x + (r.x0 + Math.min(r.x1, c.width)) / 2, c.y + (r.row + 0.5) * st.rowHeight);
  };
  await clickFrame("Worker#run");
  let s = await flameState();
  assert.equal(s.zoom, "Worker#run");
  assert.equal(s.zoomSamples, 95);
  assert.equal(await page.$eval("#flame", (f) => f.dataset.zoom), "Worker#run");
  let rects = await flameRects();
  const run = rects.find((r) => r.label === "Worker#run" && !r.caller);
  assert.ok(run.x0 === 0 && Math.abs(run.x1 - s.width) < 1e-6, JSON.stringify(run));
  const hot = rects.find((r) => r.label === "Worker#hot");
  assert.ok(Math.abs(width(hot) - (70 / 95) * s.width) < 1, JSON.stringify(hot));
  // Its callers stay drawn above it, full width, marked as callers.
  assert.deepEqual(rects.filter((r) => r.caller).map((r) => r.label), ["all threads", "<main>"]);

  await clickFrame("Worker#hot");
  s = await flameState();
  assert.equal(s.zoom, "Worker#hot");
  rects = await flameRects();
  const zoomedHot = rects.find((r) => r.label === "Worker#hot" && !r.caller);
  assert.ok(zoomedHot.x0 === 0 && Math.abs(zoomedHot.x1 - s.width) < 1e-6);
  assert.equal(rects.filter((r) => !r.caller && r.label === "Worker#cold").length, 0, "other frames leave the view");

  // A caller row zooms out to that caller; Reset to the root.
  const main = rects.find((r) => r.label === "<main>" && r.caller);
  const canvas = await page.evaluate(() => window.rvReport.flame.canvasRect());
  await page.mouse.click(canvas.x + 50, canvas.y + (main.row + 0.5) * st.rowHeight);
  assert.equal((await flameState()).zoom, "<main>");
  await page.click("#flame-reset");
  assert.equal((await flameState()).zoom, "all threads");
});

test("the flame graph can show one thread's samples", async () => {
  await page.selectOption("#flame-thread", "3");
  const s = await flameState();
  assert.equal(s.thread, 3);
  assert.equal(s.total, 25);
  const rects = await flameRects();
  assert.equal(rects.filter((r) => r.label === "Worker#hot").length, 0);
  const cold = rects.find((r) => r.label === "Worker#cold");
  assert.ok(Math.abs(width(cold) - 0.8 * s.width) < 1);
  await page.selectOption("#flame-thread", "all");
  assert.equal((await flameState()).total, 100);
});

test("screenshot with the stack card and the flame graph", async () => {
  await page.click("#zoom-fit");
  await clickBlockOf("thread-2", "opening", traceInfo.t2release);
  await page.click("#zoom-fit");
  const out = path.join(workDir, "report-stacks-screenshot.png");
  await page.screenshot({ path: out, fullPage: true });
  assert.ok(existsSync(out));
  console.log(`screenshot: ${out}`);
  assert.deepEqual(pageErrors, []);
});

test("both flame graphs are one section shape: the same parts in the same order, ids by their prefix", async () => {
  const shapes = await page.evaluate(() => ["flame", "blame-flame"].map((id) => {
    const sec = document.getElementById(id);
    const walk = (e) => [e.tagName, e.className, [...e.children].filter((c) => c.id !== "blame-top").map(walk)];
    return { parent: sec.parentElement.id, shape: walk(sec),
             ids: [...sec.querySelectorAll("[id]")].map((e) => e.id).filter((i) => i !== "blame-top") };
  }));
  assert.equal(shapes[0].parent, "flames");
  assert.equal(shapes[1].parent, "flames");
  assert.deepEqual(shapes[0].shape, shapes[1].shape);
  assert.deepEqual(shapes[0].ids, ["flame-info", "flame-thread", "flame-reset", "flame-path", "flame-plot",
                                   "flame-canvas", "flame-tip"]);
  assert.deepEqual(shapes[1].ids, ["blame-info", "blame-holder", "blame-reset", "blame-path", "blame-plot",
                                   "blame-canvas", "blame-tip"]);
  // The blame graph's top-blockers table sits between its head and its path, and only there.
  assert.equal(await page.$eval("#blame-top", (t) => t.previousElementSibling.className), "flame-head");
  assert.equal(await page.$eval("#flame .flame-head", (h) => h.nextElementSibling.className), "flame-path");
  assert.equal(await page.$$eval("#flame-template", (t) => t.length), 1);
});

test("without samples there is no flame graph, only the note", async () => {
  const p = await context.newPage();
  const errors = [];
  p.on("pageerror", (err) => errors.push(String(err)));
  await p.goto(fileUrl(noSamplesReport));
  await p.waitForSelector('body[data-ready="1"]', { timeout: 30_000 });
  assert.equal(await p.$eval("#flame", (f) => f.hidden), true);
  assert.match(await p.$eval("#notes", (n) => n.textContent), /no CPU samples, so none is shown/);
  assert.equal(await p.evaluate(() => window.rvReport.flame), null);
  // The stacks of the releases are still in the card.
  assert.deepEqual(await p.evaluate(() => window.rvReport.data.meta.samples), 0);
  assert.deepEqual(errors, []);
  await p.close();
});
