// The report's endpoint filter in a real browser (issue 47 item 3): the endpoints rvbpfd derives from the stacks
// (model/endpoint.h: Rails actions here) are offered in the toolbar; choosing one dims the other endpoints' blocks on
// the timeline, keeps only its stacks in the CPU and GVL blame flame graphs, and the card of a block names its
// endpoint. The expected numbers are computed here from the trace itself (a sample counts for endpoint X when its
// stack holds the frame X), independently of rvbpfd's rule.
//
// Two modes:
//   - by default (ctest e2e.report_browser_endpoints) on a trace this test writes: Rails-shaped stacks (Puma, Rails'
//     dispatch, two actions) and a thread outside any request; no root, no Ruby;
//   - RVBPFD_ENDPOINTS_TRACE=FILE and RVBPFD_ENDPOINTS_EXPECT=A,B,...: on a recording (tests/e2e/test_rails.py runs it
//     on its Rails recording), expecting at least those endpoints.
// Either way every thread lane is labelled as rvbpfd's tools label the thread (Thread#name included), and with
// RVBPFD_EXPECT_THREAD_NAME=TEXT (default "puma srv tp") some lane's label holds that text.
//
//   RVBPFD_BIN=build/rvbpfd RVBPFD_BUILD_DIR=build node --test tests/browser/report_endpoints.test.mjs
//
// Leaves <build>/report-endpoints-screenshot.png.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { buildReport, clickBlock, fileUrl, launchChromium, readTrace, run } from "./lib.mjs";

const GEMS = "/usr/share/rubygems-integration/all/gems/actionpack-7.2.2.2/lib";
// Frames: id -> [label, path, line, kind]; stacks leaf first (as a Rails 7.2 request on Puma names them).
const FRAMES = {
  1: ["Puma::ThreadPool#spawn_thread", "/gems/puma/thread_pool.rb", 167, "ruby"],
  2: ["Puma::Server#process_client", "/gems/puma/server.rb", 472, "ruby"],
  3: ["AbstractController::Base#process_action", `${GEMS}/abstract_controller/base.rb`, 226, "ruby"],
  4: ["ActionController::BasicImplicitRender#send_action", `${GEMS}/action_controller/metal/basic_implicit_render.rb`, 8, "ruby"],
  5: ["LedgerController#cpu", "/app/application.rb", 90, "ruby"],
  6: ["LedgerCruncher.reconcile", "/app/application.rb", 46, "ruby"],
  7: ["LedgerController#nap", "/app/application.rb", 102, "ruby"],
  8: ["Kernel#sleep", "<cfunc>", 0, "cfunc"],
  9: ["Thread::ConditionVariable#wait", "<cfunc>", 0, "cfunc"],
};
const STACKS = {
  1: [6, 5, 4, 3, 2, 1],  // in LedgerController#cpu's work
  2: [8, 7, 4, 3, 2, 1],  // LedgerController#nap sleeping
  3: [7, 4, 3, 2, 1],     // in LedgerController#nap itself
  4: [9, 1],              // an idle pool thread: no endpoint
};

function writeTrace(file) {
  const lines = [];
  const push = (o) => lines.push(JSON.stringify(o));
  push({ rvtrace: 1, recorder: "rvbpfd", recorder_version: "test", pid: 4242, ruby_version: "3.3.8", clock: "monotonic",
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
                  gvl_acquired: "RUBY_INTERNAL_THREAD_EVENT_RESUMED", gvl_released: "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED",
                  thread_exited: "RUBY_INTERNAL_THREAD_EVENT_EXITED" };
  const ev = (t, event, th, extra = {}) => {
    if (th !== null && !defined.thread.has(th)) {
      defined.thread.add(th);
      // Pool threads named as Puma names them (Thread#name): the lanes must carry the names.
      push({ thread: { ruby_thread: th, main: th === 1, ...(th > 1 ? { name: `puma srv tp 00${th - 1}` } : {}) } });
    }
    if (extra.stack !== undefined) useStack(extra.stack);
    const tid = th === null ? null : 700 + th;
    const source = event === "sample" ? "perf_event" : th === null ? "daemon" : "thread_hook_site";
    push({ t_ns: t, ruby_thread: th, native_tid: tid, probe_tid: tid, event, cruby_event: CRUBY[event] || null, source,
           provenance: "observed", ...extra });
  };
  const MS = 1_000_000;
  ev(0, "tracing_started", null);
  ev(1 * MS, "thread_started", 2); ev(1 * MS + 1000, "wants_gvl", 2);
  ev(1 * MS + 2000, "thread_started", 3); ev(1 * MS + 3000, "wants_gvl", 3);
  ev(1 * MS + 4000, "thread_started", 4); ev(1 * MS + 5000, "wants_gvl", 4);
  ev(2 * MS, "gvl_released", 1, { reason: "join", reason_provenance: "derived" });
  // Thread 2 runs the cpu action 3..40 ms (30 samples) while threads 3 and 4 wait for the GVL: blame on #cpu.
  ev(3 * MS, "gvl_acquired", 2);
  for (let k = 0; k < 30; k++) ev(4 * MS + k * MS, "sample", 2, { stack: 1 });
  ev(40 * MS, "gvl_released", 2, { reason: "io", reason_provenance: "derived", stack: 1 });
  // Thread 3 runs the nap action (10 samples), then sleeps in it.
  ev(40 * MS + 100, "gvl_acquired", 3);
  for (let k = 0; k < 10; k++) ev(41 * MS + k * MS, "sample", 3, { stack: 3 });
  ev(52 * MS, "gvl_released", 3, { reason: "sleep", reason_provenance: "derived", stack: 2 });
  // Thread 4, idle pool thread: 5 samples, no endpoint.
  ev(52 * MS + 100, "gvl_acquired", 4);
  for (let k = 0; k < 5; k++) ev(53 * MS + k * MS, "sample", 4, { stack: 4 });
  ev(60 * MS, "gvl_released", 4, { reason: "idle", reason_provenance: "derived", stack: 4 });
  ev(80 * MS, "tracing_stopped", null);
  writeFileSync(file, lines.join("\n") + "\n");
}

let context, userDataDir, workDir, page, trace, expected;
const pageErrors = [];

before(async () => {
  const rvbpfd = process.env.RVBPFD_BIN;
  assert.ok(rvbpfd && existsSync(rvbpfd), "set RVBPFD_BIN to the rvbpfd binary");
  workDir = process.env.RVBPFD_BUILD_DIR || mkdtempSync(path.join(tmpdir(), "rvbpfd-browser-endpoints-"));
  mkdirSync(workDir, { recursive: true });
  let file = process.env.RVBPFD_ENDPOINTS_TRACE;
  if (file) {
    expected = (process.env.RVBPFD_ENDPOINTS_EXPECT || "").split(",").filter(Boolean);
    // A recording is zstd-compressed: read here as plain JSON Lines.
    const plain = path.join(workDir, "report-endpoints-test.jsonl");
    const head = readFileSync(file).subarray(0, 4);
    if (head[0] === 0x28 && head[1] === 0xb5 && head[2] === 0x2f && head[3] === 0xfd) {
      writeFileSync(plain, run("zstd", ["-d", "-c", file], { encoding: "buffer" }).stdout);
      file = plain;
    }
  } else {
    file = path.join(workDir, "report-endpoints-test.rvtrace");
    writeTrace(file);
    expected = ["LedgerController#cpu", "LedgerController#nap"];
  }
  trace = readTrace(file);
  const report = buildReport(rvbpfd, file, path.join(workDir, "report-endpoints-test.html"));
  ({ context, userDataDir } = await launchChromium());
  page = await context.newPage();
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  page.on("console", (msg) => { if (msg.type() === "error") pageErrors.push(msg.text()); });
  await page.goto(fileUrl(report));
  await page.waitForSelector('body[data-ready="1"]', { timeout: 60_000 });
});

after(async () => {
  if (page && workDir) await page.screenshot({ path: path.join(workDir, "report-endpoints-screenshot.png"), fullPage: true });
  if (context) await context.close();
  if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
});

// Samples whose stack holds a frame labelled `endpoint` (all samples for null).
function samplesIn(endpoint) {
  let n = 0;
  for (const e of trace.events) {
    if (e.event !== "sample") continue;
    if (endpoint === null) { n++; continue; }
    const st = e.stack !== undefined ? trace.stacks.get(e.stack) : null;
    if (st && st.some((f) => trace.frames.get(f).label === endpoint)) n++;
  }
  return n;
}

async function choose(label) {
  await page.selectOption("#endpoint", { label });
  return page.evaluate(() => ({ flame: window.rvReport.flame.state(), blame: window.rvReport.blameFlame.state(),
                                flameLabels: [...new Set(window.rvReport.flame.rects().map((r) => r.label))],
                                blameLabels: [...new Set(window.rvReport.blameFlame.rects().map((r) => r.label))],
                                body: document.body.dataset.endpoint }));
}

test("every thread lane carries the thread's label, its Thread#name included", async () => {
  const labels = await page.$$eval(".lane-label", (ls) => ls.map((l) => l.dataset.lane + "\t" + l.firstChild.textContent));
  const byLane = new Map(labels.map((s) => s.split("\t")));
  for (const n of trace.threads.keys()) {
    const want = trace.threadLabel(n);
    assert.equal(byLane.get("thread-" + n), want, `lane of Ruby thread ${n}`);
  }
  const name = process.env.RVBPFD_EXPECT_THREAD_NAME || "puma srv tp";
  assert.ok([...byLane.values()].some((l) => l.includes(name)), `no lane label holds "${name}": ${[...byLane.values()]}`);
});

test("the toolbar offers every endpoint derived from the stacks, and '-'", async () => {
  assert.deepEqual(pageErrors, []);
  assert.equal(await page.$eval("#endpoint-box", (b) => b.hidden), false);
  const options = await page.$$eval("#endpoint option", (os) => os.map((o) => o.textContent));
  for (const e of expected) assert.ok(options.includes(e), `${e} among ${options}`);
  assert.equal(options[0], "all endpoints");
  assert.ok(options.includes("- (none)"));
  // Endpoints only name units of work: every named one is a Rails action here.
  for (const o of options.slice(1)) if (o !== "- (none)") assert.match(o, /^\w[\w:]*Controller#\w+$/, o);
});

test("choosing an endpoint keeps only its stacks in both flame graphs, and 'all' brings everything back", async () => {
  const all = await choose("all endpoints");
  assert.equal(all.flame.total, samplesIn(null));
  const action = expected.includes("LedgerController#cpu") ? "LedgerController#cpu" : expected[0];
  const one = await choose(action);
  assert.equal(one.body, action);
  assert.equal(one.flame.total, samplesIn(action), "the CPU flame graph keeps exactly the samples in the action");
  assert.ok(one.flame.total > 0 && one.flame.total < all.flame.total, JSON.stringify([one.flame, all.flame]));
  assert.ok(one.flameLabels.includes(action), one.flameLabels.join(", "));
  // The GVL blame the action caused to others: some, and less than all of it; its stacks all pass through the action.
  assert.ok(one.blame.total > 0 && one.blame.total <= all.blame.total, JSON.stringify([one.blame, all.blame]));
  assert.ok(one.blameLabels.includes(action), one.blameLabels.join(", "));
  const none = await choose("- (none)");
  assert.ok(!none.flameLabels.some((l) => expected.includes(l)), none.flameLabels.join(", "));
  const back = await choose("all endpoints");
  assert.equal(back.flame.total, all.flame.total);
  assert.equal(back.blame.total, all.blame.total);
});

test("the card of a block names its endpoint, and the filter dims the other endpoints' blocks", async () => {
  const action = expected[0];
  const found = await page.evaluate((action) => {
    const R = window.rvReport;
    for (const t of R.data.threads) {
      for (let i = 0; i < t.n; i++) {
        if (R.blockEndpoint(t.id, i) === action && t.e[i] - t.s[i] > 1000) return { lane: "thread-" + t.id, i };
      }
    }
    return null;
  }, action);
  assert.ok(found, `a block of endpoint ${action}`);
  await choose(action);
  const card = await clickBlock(page, found.lane, "block", found.i);
  assert.equal(card.endpoint, action);
  assert.match(card.text, /endpoint/);
  assert.match(card.text, /derived from the stack \(rule rails_action\)/);
  // The timeline's pixel in the middle of a block, drawn with the filter on `label`.
  const pixel = async (lane, i, label) => {
    await choose(label);
    return page.evaluate(([lane, i]) => {
      const R = window.rvReport, t = R.data.threads.find((x) => "thread-" + x.id === lane);
      const s = t.s[i], e = t.e[i], pad = (e - s) * 0.5;
      R.setView(s - pad, e + pad);
      R.drawNow();
      const c = document.getElementById("canvas"), r = c.getBoundingClientRect(), lr = R.laneRect(lane);
      const sx = c.width / r.width, sy = c.height / r.height;
      const x = Math.round((R.clientX((s + e) / 2) - r.left) * sx), y = Math.round((lr.y + lr.height / 2 - r.top) * sy);
      return Array.from(c.getContext("2d").getImageData(x, y, 1, 1).data);
    }, [lane, i]);
  };
  const other = await page.evaluate((action) => {
    const R = window.rvReport;
    for (const t of R.data.threads) {
      for (let i = 0; i < t.n; i++) {
        const st = R.data.names.state[t.st[i]];
        if (R.blockEndpoint(t.id, i) !== action && st === "running" && t.e[i] - t.s[i] > 1000) return { lane: "thread-" + t.id, i };
      }
    }
    return null;
  }, action);
  assert.ok(other, "a running block of another endpoint");
  assert.deepEqual(await pixel(found.lane, found.i, action), await pixel(found.lane, found.i, "all endpoints"),
                   "the chosen endpoint's block is drawn as without the filter");
  assert.notDeepEqual(await pixel(other.lane, other.i, action), await pixel(other.lane, other.i, "all endpoints"),
                      "another endpoint's block is dimmed");
  await choose("all endpoints");
  assert.deepEqual(pageErrors, []);
});
