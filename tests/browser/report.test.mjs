// The HTML report in a real browser: records a 4-thread trace with rvbpfd (needs root and the test Ruby), builds its
// report with `rvbpfd report`, opens it from disk in headless Chromium (Debian's, via playwright-core) and checks
// what a user sees. Run by ctest (tests/browser/CMakeLists.txt) or by hand:
//
//   RVBPFD_BIN=build/rvbpfd RVBPFD_BUILD_DIR=build node --test tests/browser/report.test.mjs
//
// Environment: RVBPFD_BIN (required), RVBPFD_BUILD_DIR (where the trace, report and report-screenshot.png go;
// default a temp dir), RVBPFD_RUBY (default: tools/build-test-rubies.sh --print-prefix 3.4.5-static + /bin/ruby),
// RVBPFD_TRACE (use this trace instead of recording one), RVBPFD_CHROMIUM (default /usr/bin/chromium).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { buildReport, clickBlock as clickReportBlock, fileUrl, launchChromium, readTrace, recordWorkload } from "./lib.mjs";

const RESUMED = "RUBY_INTERNAL_THREAD_EVENT_RESUMED";
const SUSPENDED = "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED";

let page, context, userDataDir, workDir, tracePath, traceThreads;
const pageErrors = [];
const requests = [];

// Records tests/e2e/workloads/bench_cpu4.rb (four CPU-bound threads).
function recordTrace(rvbpfd, out) { return recordWorkload(rvbpfd, "bench_cpu4", out); }

// Ruby thread ids the trace names (thread lines), read independently of rvbpfd.
function threadsOf(trace) {
  const ids = new Set();
  for (const line of readFileSync(trace, "utf8").split("\n")) {
    if (!line.startsWith('{"thread"')) continue;
    ids.add(JSON.parse(line).thread.ruby_thread);
  }
  return [...ids].sort((a, b) => a - b);
}

before(async () => {
  const rvbpfd = process.env.RVBPFD_BIN;
  assert.ok(rvbpfd && existsSync(rvbpfd), "set RVBPFD_BIN to the rvbpfd binary");
  workDir = process.env.RVBPFD_BUILD_DIR || mkdtempSync(path.join(tmpdir(), "rvbpfd-browser-"));
  mkdirSync(workDir, { recursive: true });
  tracePath = process.env.RVBPFD_TRACE || recordTrace(rvbpfd, path.join(workDir, "report-test.rvtrace"));
  traceThreads = threadsOf(tracePath);
  const report = buildReport(rvbpfd, tracePath, path.join(workDir, "report-test.html"));
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

async function range() {
  return page.$eval("#range", (r) => ({ start: Number(r.dataset.startNs), end: Number(r.dataset.endNs) }));
}

// Zooms onto block `index` of `lane` and clicks its middle with the mouse; returns the card's data attributes.
const clickBlock = (laneId, kind, index) => clickReportBlock(page, laneId, kind, index);

test("the page loads from disk without errors or network requests", async () => {
  assert.deepEqual(pageErrors, []);
  assert.deepEqual(requests, []);
  assert.ok(await page.evaluate(() => typeof window.rvReportLoadMs === "number"));
});

test("one lane per Ruby thread plus the GVL owner lane", async () => {
  assert.ok(traceThreads.length >= 5, `bench_cpu4 has main + 4 threads, the trace names ${traceThreads}`);
  const lanes = await page.$$eval('[data-lane^="thread-"]', (els) => els.map((e) => e.dataset.lane));
  assert.deepEqual(lanes, traceThreads.map((id) => "thread-" + id));
  assert.equal(await page.locator('[data-lane="gvl-owner"]').count(), 1);
  assert.equal(await page.locator('[data-lane="gc"]').count(), 1);
  assert.ok(await page.locator('[data-lane^="native-"]').count() >= 4, "a native-thread lane per pthread");
  // Each lane label is where its lane is drawn (the test clicks by these positions).
  for (const id of ["gvl-owner", ...lanes]) {
    const [label, rect] = await page.evaluate((id) => {
      const r = document.querySelector(`[data-lane="${id}"]`).getBoundingClientRect();
      return [{ y: r.top, h: r.height }, window.rvReport.laneRect(id)];
    }, id);
    assert.ok(Math.abs(label.y - rect.y) < 1.5 && Math.abs(label.h - rect.height) < 1.5, id);
  }
});

test("the owner lane never shows two owners at once", async () => {
  const problems = await page.evaluate(async () => {
    const R = window.rvReport, d = R.data, out = [];
    const o = d.owner;
    if (o.n < 10) out.push(`only ${o.n} owner blocks`);
    for (let i = 0; i < o.n; i++) {
      if (o.s[i] > o.e[i]) out.push(`owner block ${i} ends before it starts`);
      if (i > 0 && o.e[i - 1] > o.s[i]) out.push(`owner blocks ${i - 1} and ${i} overlap`);
      if ((d.names.owner_kind[o.k[i]] === "owned") !== (o.ow[i] >= 0)) out.push(`owner block ${i} has no owner`);
    }
    // The thread lanes agree: at most one thread is running (or in GC) at any moment.
    const running = [];
    for (const t of d.threads) {
      for (let i = 0; i < t.n; i++) {
        const st = d.names.state[t.st[i]];
        if ((st === "running" || st === "gc") && t.e[i] > t.s[i]) running.push([t.s[i], t.e[i], t.id]);
      }
    }
    running.sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < running.length; i++) {
      if (running[i - 1][1] > running[i][0]) out.push(`threads ${running[i - 1][2]} and ${running[i][2]} both run at ${running[i][0]}`);
    }
    // What is drawn: at several zoom levels the owner lane's rects never overlap.
    const m = d.meta;
    for (const frac of [1, 0.1, 0.01, 0.001]) {
      const span = (m.end_ns - m.start_ns) * frac, mid = (m.start_ns + m.end_ns) / 2;
      R.setView(mid - span / 2, mid + span / 2);
      R.drawNow();
      const rects = R.drawn().owner;
      if (rects.length === 0) out.push(`nothing drawn on the owner lane at zoom ${frac}`);
      for (let i = 1; i < rects.length; i++) {
        if (rects[i - 1][1] > rects[i][0] + 1e-9) out.push(`drawn owner rects ${i - 1} and ${i} overlap at zoom ${frac}`);
      }
    }
    return out;
  });
  assert.deepEqual(problems.slice(0, 10), []);
});

test("clicking a block shows the card with its CRuby event, provenance and rule", async () => {
  // A running block opened by the thread's RESUMED, a released block opened by SUSPENDED, and an owner block.
  const picks = await page.evaluate(() => {
    const R = window.rvReport, d = R.data, pick = {};
    const widest = (t, want) => {
      let best = -1;
      for (let i = 0; i < t.n; i++) {
        if (t.o[i] >= 0 && R.eventName(t.o[i]) === want && (best < 0 || t.e[i] - t.s[i] > t.e[best] - t.s[best])) best = i;
      }
      return best;
    };
    for (const t of d.threads) {
      if (pick.running === undefined) { const i = widest(t, "gvl_acquired"); if (i >= 0) pick.running = { lane: "thread-" + t.id, i, prov: d.names.prov[t.pv[i]] }; }
      if (pick.released === undefined) { const i = widest(t, "gvl_released"); if (i >= 0) pick.released = { lane: "thread-" + t.id, i, prov: d.names.prov[t.pv[i]], rule: d.names.rule[t.ru[i]] }; }
    }
    for (let i = 0; i < d.owner.n; i++) {
      if (d.names.owner_kind[d.owner.k[i]] === "owned" && d.owner.o[i] >= 0) { pick.owner = { lane: "gvl-owner", i, owner: d.owner.ow[i] }; break; }
    }
    return pick;
  });
  assert.ok(picks.running && picks.released && picks.owner, JSON.stringify(picks));

  let card = await clickBlock(picks.running.lane, "block", picks.running.i);
  assert.equal(card.kind, "block");
  assert.equal(card.lane, picks.running.lane);
  assert.equal(card.index, String(picks.running.i));
  assert.equal(card.crubyEvent, RESUMED);
  assert.equal(card.provenance, picks.running.prov);
  assert.match(card.text, /running/);
  assert.match(card.text, new RegExp(RESUMED));

  card = await clickBlock(picks.released.lane, "block", picks.released.i);
  assert.equal(card.lane, picks.released.lane);
  assert.equal(card.crubyEvent, SUSPENDED);
  assert.equal(card.provenance, picks.released.prov);
  assert.equal(card.rule, picks.released.rule);
  assert.match(card.text, /released/);

  card = await clickBlock("gvl-owner", "owner", picks.owner.i);
  assert.equal(card.kind, "owner");
  assert.equal(card.crubyEvent, RESUMED);
  assert.equal(card.provenance, "derived");
  assert.equal(card.rule, "owner_from_acquire");
  assert.match(card.text, /owner_from_acquire/);
});

test("zooming and panning change the visible range; hover shows timestamps and moves the event list", async () => {
  await page.click("#zoom-fit");
  const full = await range();
  assert.ok(full.end > full.start);

  await page.click("#zoom-in");
  const zoomed = await range();
  assert.ok(Math.abs((zoomed.end - zoomed.start) - (full.end - full.start) / 2) <= 2, JSON.stringify([full, zoomed]));

  // The wheel zooms around the mouse, down to microseconds.
  const owner = await page.evaluate(() => window.rvReport.laneRect("gvl-owner"));
  await page.mouse.move(owner.x + owner.width / 2, owner.y + owner.height / 2);
  for (let k = 0; k < 40; k++) await page.mouse.wheel(0, -400);
  await page.waitForFunction((prev) => Number(document.querySelector("#range").dataset.endNs) -
      Number(document.querySelector("#range").dataset.startNs) < prev, zoomed.end - zoomed.start);
  const deep = await range();
  assert.ok(deep.end - deep.start <= 10_000, `wheel reaches microseconds: ${deep.end - deep.start} ns visible`);

  // Dragging pans.
  await page.click("#zoom-fit");
  await page.click("#zoom-in");
  await page.click("#zoom-in");
  const before = await range();
  await page.mouse.move(owner.x + owner.width / 2, owner.y + 5);
  await page.mouse.down();
  await page.mouse.move(owner.x + owner.width / 2 + 200, owner.y + 5, { steps: 5 });
  await page.mouse.up();
  const panned = await range();
  assert.ok(panned.start < before.start, JSON.stringify([before, panned]));
  assert.ok(Math.abs((panned.end - panned.start) - (before.end - before.start)) <= 2);

  // Keys pan and zoom too.
  await page.keyboard.press("ArrowRight");
  assert.ok((await range()).start > panned.start);

  // Hover: a tooltip with timestamps, and the event list follows the cursor.
  await page.click("#zoom-fit");
  const lane = await page.evaluate(() => {
    const ids = [...document.querySelectorAll('[data-lane^="thread-"]')].map((e) => e.dataset.lane);
    return window.rvReport.laneRect(ids[ids.length - 1]);
  });
  await page.mouse.move(lane.x + lane.width * 0.2, lane.y + lane.height / 2);
  const first = await page.$eval("#event-rows tr.at", (tr) => tr.dataset.event);
  const tip = await page.$eval("#tooltip", (t) => ({ hidden: t.hidden, text: t.textContent }));
  assert.equal(tip.hidden, false);
  assert.match(tip.text, /\d+\.\d{6} – \d+\.\d{6} ms/);
  await page.mouse.move(lane.x + lane.width * 0.8, lane.y + lane.height / 2);
  const second = await page.$eval("#event-rows tr.at", (tr) => tr.dataset.event);
  assert.ok(Number(second) > Number(first), `event list follows the cursor: ${first} -> ${second}`);
});

// The trace's stack dictionaries, event stacks (in the model's order: stably sorted by t_ns) and samples, read from
// the file independently of rvbpfd.
test("a recorded trace's stacks: a released block's card lists its stack, the flame graph its samples", async (t) => {
  const meta = await page.evaluate(() => window.rvReport.data.meta);
  if (!meta.stacks) { t.skip("the trace has no stacks (recorded with --stacks=off?)"); return; }
  const st = readTrace(tracePath);
  // The widest released block whose gvl_released has a stack with frames. Main's Thread#join releases always have
  // one; the workers' only sometimes (they may run to completion without a timeslice switch).
  const pick = await page.evaluate(() => {
    const R = window.rvReport, d = R.data;
    let best = null;
    for (const t of d.threads) {
      for (let i = 0; i < t.n; i++) {
        const o = t.o[i];
        if (o < 0 || R.eventName(o) !== "gvl_released" || !R.stackOf(o) || R.stackOf(o).length === 0) continue;
        if (!best || t.e[i] - t.s[i] > best.w) best = { lane: "thread-" + t.id, i, o, w: t.e[i] - t.s[i] };
      }
    }
    return best;
  });
  assert.ok(pick, "a released block with a stack");
  const ev = st.events[pick.o];
  assert.equal(ev.event, "gvl_released");
  assert.ok(ev.stack !== undefined, JSON.stringify(ev));
  const card = await clickBlock(pick.lane, "block", pick.i);
  assert.equal(card.crubyEvent, SUSPENDED);
  assert.ok(Number(card.stacks) >= 1);
  const shown = await page.$$eval('#card ol.stack[data-which="opening"] li', (lis) => lis.map((li) => li.textContent));
  assert.deepEqual(shown, st.stackText(ev.stack).slice(0, 60));
  if (ev.reason) {
    assert.equal(card.releaseReason, ev.reason);
    assert.equal(card.releaseReasonProvenance, ev.reason_provenance);
  }

  const samples = st.events.filter((e) => e.event === "sample");
  assert.equal(meta.samples, samples.length);
  if (samples.length === 0) return;
  assert.equal(await page.$eval("#flame", (f) => f.hidden), false);
  const flame = await page.evaluate(() => window.rvReport.flame.state());
  assert.equal(flame.total, samples.length);
  // Where the samples are, by leaf function: when one holds most of them, it is the widest frame doing work.
  const leaf = new Map();
  for (const e of samples) {
    if (e.stack === undefined || st.stacks.get(e.stack).length === 0) continue;
    const f = st.frames.get(st.stacks.get(e.stack)[0]);
    leaf.set(f.label, (leaf.get(f.label) || 0) + 1);
  }
  const rects = await page.evaluate(() => window.rvReport.flame.rects().filter((r) => !r.caller));
  const [topLabel, topCount] = [...leaf].sort((a, b) => b[1] - a[1])[0] || [null, 0];
  if (topCount > samples.length / 2) {
    // The frame with the most samples of its own (self) is that function. Real frames only: the root (the thread
    // selector's row) and pseudo frames have no path, and the root holds the samples taken while a thread had no
    // Ruby frame as its own "self". (Not the widest frame with any self: its caller is wider and may have a few.)
    const selfByLabel = new Map();
    for (const r of rects) {
      if (r.self > 0 && r.path !== "") selfByLabel.set(r.label, (selfByLabel.get(r.label) || 0) + r.self);
    }
    const [mostSelf] = [...selfByLabel].sort((a, b) => b[1] - a[1])[0] || [null];
    assert.equal(mostSelf, topLabel);
  }
  // When every sample is at least a pixel wide, every frame is drawn: the samples ending in each function add up.
  if (samples.length <= flame.width) {
    const self = new Map();
    for (const r of rects) if (r.self > 0 && r.path !== "") self.set(r.label, (self.get(r.label) || 0) + r.self);
    for (const [label, n] of leaf) {
      if (st.frames.size && [...st.frames.values()].some((f) => f.label === label && f.path === "")) continue;  // pseudo frames
      assert.equal(self.get(label), n, `samples ending in ${label}`);
    }
  }
});

test("screenshot for CI", async () => {
  await page.click("#zoom-fit");
  const picks = await page.evaluate(() => {
    const t = window.rvReport.data.threads[1];
    const running = window.rvReport.data.names.state.indexOf("running");
    let best = 0;
    for (let i = 0; i < t.n; i++) if (t.st[i] === running && (t.st[best] !== running || t.e[i] - t.s[i] > t.e[best] - t.s[best])) best = i;
    return { lane: "thread-" + t.id, i: best };
  });
  await clickBlock(picks.lane, "block", picks.i);
  await page.click("#zoom-fit");
  const out = path.join(workDir, "report-screenshot.png");
  await page.screenshot({ path: out, fullPage: true });
  assert.ok(existsSync(out));
  console.log(`screenshot: ${out}`);
  assert.deepEqual(pageErrors, []);
});
