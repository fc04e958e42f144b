// The report's GVL blame view in a real browser, on a recorded gvl_hog trace (tests/e2e/workloads/gvl_hog.rb:
// HogKlass.spin holds the GVL in a CPU loop while four IO threads do pipe round trips, each ending with a wait for the
// lock). Records it with rvbpfd (needs root and the test Ruby), builds its report, opens it from disk in headless
// Chromium (Debian's, via playwright-core) and checks what a user sees:
//   - the blame flame graph beside the CPU one, whose heaviest self frame is HogKlass.spin, and the top blockers table
//     naming the hog's thread running HogKlass.spin first;
//   - clicking an IO thread's longest GVL wait in the timeline: the card names the hog's thread as the holder, the
//     HogKlass.spin part with its provenance (sampled) and its samples, and the parts add up to the wait;
//   - a second recording with --max-overhead 1 (HOG_LOCK_EVERY=1000: the hog traps enough to pause the probes): the
//     blame flame graph holds the waits estimated from the samples' GVL readings under an "(estimated: tracing
//     paused)" root frame, the heading says how much was estimated, and the hog still tops it.
// The hog's thread is found from the trace file itself (the thread whose on-CPU samples end in HogKlass.spin).
//
//   RVBPFD_BIN=build/rvbpfd RVBPFD_BUILD_DIR=build node --test tests/browser/report_blame.test.mjs
//
// Environment: as report.test.mjs (RVBPFD_TRACE: use this gvl_hog trace instead of recording one).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { buildReport, clickBlock, fileUrl, launchChromium, readTrace, recordWorkload } from "./lib.mjs";

const HOG = "HogKlass.spin";

let page, context, userDataDir, workDir, hogLabel, hogThread;
const pageErrors = [];

// The Ruby thread most of whose samples end in HogKlass.spin, and its label as the trace names it.
function hogOf(trace) {
  const counts = new Map();
  for (const e of trace.events) {
    if (e.event === "sample" && trace.leaf(e) === HOG) counts.set(e.ruby_thread, (counts.get(e.ruby_thread) || 0) + 1);
  }
  const [thread] = [...counts].sort((a, b) => b[1] - a[1])[0] || [null];
  return { thread, label: trace.threadLabel(thread) };
}

before(async () => {
  const rvbpfd = process.env.RVBPFD_BIN;
  assert.ok(rvbpfd && existsSync(rvbpfd), "set RVBPFD_BIN to the rvbpfd binary");
  workDir = process.env.RVBPFD_BUILD_DIR || mkdtempSync(path.join(tmpdir(), "rvbpfd-browser-"));
  mkdirSync(workDir, { recursive: true });
  const tracePath = process.env.RVBPFD_TRACE ||
      recordWorkload(rvbpfd, "gvl_hog", path.join(workDir, "report-blame-test.rvtrace"), ["--hz", "99"]);
  ({ thread: hogThread, label: hogLabel } = hogOf(readTrace(tracePath)));
  assert.notEqual(hogThread, null, `no on-CPU sample of ${tracePath} ends in ${HOG}`);
  const report = buildReport(rvbpfd, tracePath, path.join(workDir, "report-blame-test.html"));
  ({ context, userDataDir } = await launchChromium());
  page = await context.newPage();
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  page.on("console", (msg) => { if (msg.type() === "error") pageErrors.push(msg.text()); });
  await page.goto(fileUrl(report));
  await page.waitForSelector('body[data-ready="1"]', { timeout: 30_000 });
});

after(async () => {
  if (context) await context.close();
  if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
});

test("the blame flame graph is beside the CPU one and its heaviest frame is the hog's method", async () => {
  assert.deepEqual(pageErrors, []);
  const boxes = await page.evaluate(() => ["flame", "blame-flame"].map((id) => {
    const e = document.getElementById(id), r = e.getBoundingClientRect();
    return { hidden: e.hidden, top: r.top, left: r.left, width: r.width };
  }));
  assert.equal(boxes[0].hidden, false);
  assert.equal(boxes[1].hidden, false);
  assert.ok(Math.abs(boxes[0].top - boxes[1].top) < 2 && boxes[1].left > boxes[0].left + boxes[0].width - 1,
            `side by side: ${JSON.stringify(boxes)}`);
  const st = await page.evaluate(() => window.rvReport.blameFlame.state());
  assert.equal(st.thread, "all");
  const total = await page.evaluate(() => window.rvReport.data.blameTotal);
  assert.ok(total > 0, "the IO threads waited for the GVL");
  assert.equal(st.total, total);
  const self = await page.evaluate(() => window.rvReport.blameFlame.selfByLabel());
  assert.equal(self[0].label, HOG, JSON.stringify(self.slice(0, 5)));
  assert.ok(self[0].ns > total / 2, `${HOG} has ${self[0].ns} of ${total} ns`);
  // Drawn: of the real frames with self weight, the hog's method has the most, with a visible width. (Not the widest:
  // a caller such as Kernel#loop is drawn with its children, so it is wider as soon as any stack ends in it.)
  const rects = await page.evaluate(() => window.rvReport.blameFlame.rects().filter((r) => !r.caller && r.self > 0 && r.path));
  const heaviest = rects.sort((a, b) => b.self - a.self)[0];
  assert.equal(heaviest.label, HOG, JSON.stringify(rects.slice(0, 3)));
  assert.ok(heaviest.x1 - heaviest.x0 >= 1, JSON.stringify(heaviest));
  // The top blockers table: the hog's thread running HogKlass.spin first.
  const first = await page.$eval("#blame-top tbody tr", (tr) => ({ ...tr.dataset }));
  assert.equal(first.holder, hogLabel);
  assert.equal(first.threads, "1");
  assert.equal(first.frame, HOG);
  // One row per Ruby method across threads: no method twice, and a C function only beneath its Ruby method.
  const rows = await page.$$eval("#blame-top tbody tr", (trs) => trs.map((tr) => ({
    frame: tr.dataset.frame, calls: [...tr.querySelectorAll(".blame-call")].map((c) => c.dataset.call) })));
  assert.equal(new Set(rows.map((r) => r.frame)).size, rows.length, JSON.stringify(rows));
  const top = await page.evaluate(() => window.rvReport.blameFlame.top());
  for (const x of top) {
    assert.equal(x.holders.reduce((a, h) => a + h.ns, 0), x.ns, JSON.stringify(x));
    assert.ok(!top.some((y) => y.calls.some((c) => c.label === x.frame)), `${x.frame} is a row and a call`);
  }
});

test("the holder selector shows one holder's part of the blame", async () => {
  await page.selectOption("#blame-holder", String(hogThread));
  const st = await page.evaluate(() => window.rvReport.blameFlame.state());
  const top = await page.evaluate(() => window.rvReport.blameFlame.top());
  // A row is a method across threads: the hog's part of each row is its holder share.
  const hogNs = top.flatMap((x) => x.holders).filter((h) => h.holder === hogLabel).reduce((a, h) => a + h.ns, 0);
  assert.equal(st.total, hogNs);
  const self = await page.evaluate(() => window.rvReport.blameFlame.selfByLabel());
  assert.equal(self[0].label, HOG);
  await page.selectOption("#blame-holder", "all");
});

test("a budgeted recording's blame flame graph shows the estimated waits apart, and the hog still tops it", async () => {
  const rvbpfd = process.env.RVBPFD_BIN;
  const tracePath = recordWorkload(rvbpfd, "gvl_hog", path.join(workDir, "report-blame-budget-test.rvtrace"),
                                   ["--hz", "99", "--max-overhead", "1"], { HOG_LOCK_EVERY: "1000" });
  const hog = hogOf(readTrace(tracePath));
  const report = buildReport(rvbpfd, tracePath, path.join(workDir, "report-blame-budget-test.html"));
  const budgeted = await context.newPage();
  const errors = [];
  budgeted.on("pageerror", (err) => errors.push(String(err)));
  await budgeted.goto(fileUrl(report));
  await budgeted.waitForSelector('body[data-ready="1"]', { timeout: 30_000 });
  const d = await budgeted.evaluate(() => ({ total: window.rvReport.data.blameTotal,
                                             estimated: window.rvReport.data.blameEstimated }));
  assert.ok(d.estimated > 0, `nothing estimated: the probes were not paused (${JSON.stringify(d)})`);
  const st = await budgeted.evaluate(() => window.rvReport.blameFlame.state());
  assert.equal(st.total, d.total + d.estimated, "the flame graph holds the observed and the estimated blame");
  const estimatedRoot = await budgeted.evaluate(() => window.rvReport.blameFlame.rects()
      .filter((r) => r.label === "(estimated: tracing paused)").reduce((a, r) => a + r.ns, 0));
  assert.equal(estimatedRoot, d.estimated, "the estimated blame sits under its own root frame");
  const info = await budgeted.$eval("#blame-info", (e) => e.textContent);
  assert.match(info, /estimated from the samples' GVL readings while tracing was paused/);
  const self = await budgeted.evaluate(() => window.rvReport.blameFlame.selfByLabel());
  assert.equal(self[0].label, HOG, JSON.stringify(self.slice(0, 5)));
  const first = await budgeted.$eval("#blame-top tbody tr", (tr) => ({ ...tr.dataset }));
  assert.equal(first.holder, hog.label);
  assert.equal(first.frame, HOG);
  assert.deepEqual(errors, []);
  await budgeted.close();
});

test("clicking an IO thread's longest GVL wait names the hog's thread as holder, running HogKlass.spin", async () => {
  // The longest wants_gvl block of a thread other than the hog (an IO thread waiting for the lock).
  const pick = await page.evaluate((hog) => {
    const d = window.rvReport.data, wants = d.names.state.indexOf("wants_gvl");
    let best = null;
    for (const t of d.threads) {
      if (t.id === hog) continue;
      for (let i = 0; i < t.n; i++) {
        if (t.st[i] === wants && (!best || t.e[i] - t.s[i] > best.w)) best = { lane: "thread-" + t.id, i, w: t.e[i] - t.s[i] };
      }
    }
    return best;
  }, hogThread);
  assert.ok(pick, "an IO thread waited for the GVL");
  const card = await clickBlock(page, pick.lane, "block", pick.i);
  assert.equal(card.kind, "block");
  assert.ok(Number(card.blameWaits) >= 1, card.text);
  assert.equal(card.blameHolder, hogLabel, card.text);
  assert.equal(card.blameFrame, HOG, card.text);
  // What the card lists: the hog as the heaviest holder, its HogKlass.spin part sampled from its on-CPU samples.
  const shown = await page.evaluate(() => {
    const w = document.querySelector("#card .blame-wait");
    const holders = [...w.querySelectorAll(".blame-holder")].map((h) => ({
      holder: h.dataset.holder, ns: Number(h.dataset.ns), text: h.textContent,
      parts: [...h.querySelectorAll(".blame-part")].map((p) => ({ ...p.dataset, text: p.textContent })) }));
    return { start: Number(w.dataset.startNs), end: Number(w.dataset.endNs), holders };
  });
  assert.equal(shown.holders[0].holder, hogLabel);
  const spin = shown.holders[0].parts.find((p) => p.frame === HOG);
  assert.ok(spin, JSON.stringify(shown.holders[0]));
  assert.equal(spin.source, "sampled");
  assert.match(spin.text, /\d+ on-CPU samples? of the holder inside the wait/);
  assert.match(shown.holders[0].text, /holder derived/);
  // Every nanosecond of the wait is blamed on someone (or on nobody, said so).
  const blamed = shown.holders.reduce((a, h) => a + h.ns, 0);
  assert.equal(blamed, shown.end - shown.start);
  assert.ok(shown.holders[0].ns > (shown.end - shown.start) / 2);
  await page.click("#zoom-fit");
  const out = path.join(workDir, "report-blame-screenshot.png");
  await page.screenshot({ path: out, fullPage: true });
  console.log(`screenshot: ${out}`);
  assert.deepEqual(pageErrors, []);
});
