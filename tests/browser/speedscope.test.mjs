// `rvbpfd export --speedscope` opened in the real speedscope app: the `speedscope` npm package's built app
// (node_modules/speedscope/dist/release) and the export are served on loopback, Debian's Chromium (playwright-core)
// loads the app with #profileURL= pointing at the export, and the test checks what speedscope shows: every profile
// (one per Ruby thread, then "GVL blame" and "wall clock") by name, and in the blame profile's sandwich view the
// hog's method with all of the blamed time. The trace is written here (no root, no Ruby):
//   thread 2 holds the GVL 0-90 ms (samples in Hog.spin), threads 3 and 4 wait for it from 10 ms; then each runs
//   1 ms in Io#poll.
//
//   RVBPFD_BIN=build/rvbpfd node --test tests/browser/speedscope.test.mjs
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { HERE, launchChromium, run } from "./lib.mjs";

const APP_DIR = path.join(HERE, "node_modules", "speedscope", "dist", "release");
const MS = 1_000_000;

function writeTrace(file) {
  const lines = [];
  const push = (o) => lines.push(JSON.stringify(o));
  push({ rvtrace: 1, recorder: "rvbpfd", recorder_version: "test", pid: 4242, ruby_version: "3.4.5", clock: "monotonic",
         origin_ns: 1_000_000, started_at: "2025-01-01T00:00:00.000000Z",
         channels: ["thread_hook_site", "gc_hook_site", "probe", "perf_event"], main_thread: 1, sample_hz: 100,
         stacks: "release" });
  push({ frame: { id: 1, label: "<main>", path: "/app/main.rb", line: 1, kind: "ruby" } });
  push({ frame: { id: 2, label: "Hog.spin", path: "/app/hog.rb", line: 5, kind: "ruby" } });
  push({ frame: { id: 3, label: "Io#poll", path: "/app/io.rb", line: 9, kind: "ruby" } });
  push({ stack: { id: 1, frames: [2, 1] } });
  push({ stack: { id: 2, frames: [3, 1] } });
  for (const th of [2, 3, 4]) push({ thread: { ruby_thread: th, main: false } });
  const CRUBY = { wants_gvl: "RUBY_INTERNAL_THREAD_EVENT_READY", gvl_acquired: "RUBY_INTERNAL_THREAD_EVENT_RESUMED",
                  gvl_released: "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED",
                  thread_exited: "RUBY_INTERNAL_THREAD_EVENT_EXITED" };
  const ev = (t, event, th, extra = {}) => {
    const tid = th === null ? null : 700 + th;
    const source = event === "sample" ? "perf_event" : th === null ? "daemon" : "thread_hook_site";
    push({ t_ns: t, ruby_thread: th, native_tid: tid, probe_tid: tid, event, cruby_event: CRUBY[event] || null, source,
           provenance: "observed", ...extra });
  };
  ev(0, "tracing_started", null);
  ev(0, "gvl_acquired", 2);
  ev(10 * MS, "wants_gvl", 3);
  ev(10 * MS, "wants_gvl", 4);
  for (let t = 15; t < 90; t += 10) ev(t * MS, "sample", 2, { stack: 1 });
  ev(90 * MS, "gvl_released", 2, { stack: 1, reason: "sleep", reason_provenance: "derived" });
  ev(90 * MS, "gvl_acquired", 3);
  ev(91 * MS, "gvl_released", 3, { stack: 2 });
  ev(91 * MS, "gvl_acquired", 4);
  ev(92 * MS, "gvl_released", 4, { stack: 2 });
  ev(100 * MS, "tracing_stopped", null);
  push({ summary: { duration_ms: 100, events_dropped: 0, ring_high_water_bytes: 0, late_events: 0 } });
  writeFileSync(file, lines.join("\n") + "\n");
}

let context, userDataDir, workDir, server, page, doc;
const pageErrors = [];

before(async () => {
  const rvbpfd = process.env.RVBPFD_BIN;
  assert.ok(rvbpfd && existsSync(rvbpfd), "set RVBPFD_BIN to the rvbpfd binary");
  assert.ok(existsSync(path.join(APP_DIR, "index.html")),
            `no speedscope app at ${APP_DIR}: run tools/install-browser-deps.sh (npm ci in tests/browser)`);
  workDir = mkdtempSync(path.join(tmpdir(), "rvbpfd-speedscope-"));
  const trace = path.join(workDir, "hog.rvtrace");
  const exported = path.join(workDir, "hog.speedscope.json");
  writeTrace(trace);
  run(rvbpfd, ["export", "--speedscope", trace, "-o", exported]);
  doc = JSON.parse(readFileSync(exported, "utf8"));
  // The app's files and the export, from loopback only.
  server = createServer((req, res) => {
    const url = new URL(req.url, "http://127.0.0.1");
    const file = url.pathname === "/profile.json" ? exported
                                                  : path.join(APP_DIR, path.normalize(url.pathname).replace(/^\/+/, ""));
    if (!file.startsWith(APP_DIR) && file !== exported) { res.writeHead(403).end(); return; }
    if (!existsSync(file)) { res.writeHead(404).end(); return; }
    const types = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".json": "application/json",
                    ".wasm": "application/wasm", ".png": "image/png" };
    res.writeHead(200, { "content-type": types[path.extname(file)] || "application/octet-stream" });
    res.end(readFileSync(file));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const base = `http://127.0.0.1:${server.address().port}`;
  ({ context, userDataDir } = await launchChromium());
  page = await context.newPage();
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  await page.goto(`${base}/index.html#profileURL=${encodeURIComponent(base + "/profile.json")}`);
});

after(async () => {
  if (context) await context.close();
  if (server) server.close();
  if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

test("the export has the thread profiles and the two named sampled profiles", () => {
  const names = doc.profiles.map((p) => p.name);
  assert.deepEqual(names.slice(0, 3), ["Thread #2", "Thread #3", "Thread #4"]);
  assert.equal(doc.profiles.length, 5);
  assert.match(names[3], /^GVL blame/);
  assert.match(names[4], /^wall clock/);
  assert.equal(doc.profiles[3].type, "sampled");
  // Threads 3 and 4 each waited 80 ms, then 4 waited 1 ms more while 3 ran Io#poll.
  assert.equal(doc.profiles[3].endValue, 161 * MS);
});

test("speedscope loads the export and names each profile", async () => {
  // The toolbar shows "<profile name> (i/n)"; "n" moves to the next profile.
  await page.waitForFunction(() => document.body.innerText.includes("(1/5)"), null, { timeout: 30_000 });
  const seen = [];
  for (let i = 1; i <= 5; ++i) {
    await page.waitForFunction((i) => document.body.innerText.includes(`(${i}/5)`), i, { timeout: 10_000 });
    seen.push(await page.evaluate(() => document.body.innerText));
    if (i < 5) await page.keyboard.press("n");
  }
  doc.profiles.forEach((p, i) => assert.ok(seen[i].includes(p.name), `profile ${i + 1}: ${p.name} not shown`));
  assert.deepEqual(pageErrors, []);
});

test("the blame profile's sandwich view has Hog.spin first, with 160 of the 161 ms blamed", async () => {
  await page.keyboard.press("p");  // from wall clock (5/5) back to GVL blame (4/5)
  await page.waitForFunction(() => document.body.innerText.includes("(4/5)"), null, { timeout: 10_000 });
  await page.keyboard.press("3");  // sandwich view: a table of frames with their total and self time
  await page.waitForFunction(() => document.body.innerText.includes("Hog.spin"), null, { timeout: 10_000 });
  const text = await page.evaluate(() => document.body.innerText);
  // Rows are "total", "self", "symbol name" lines, heaviest self first: Hog.spin first, 160 of the 161 ms.
  const lines = text.split("\n").map((l) => l.trim());
  const header = lines.findIndex((l) => l.startsWith("Total") && l.includes("Symbol Name"));
  assert.ok(header >= 0, text);
  assert.equal(lines[header + 3], "Hog.spin", text);
  assert.match(lines[header + 1], /^160\.00ms/, text);
  assert.match(lines[header + 2], /^160\.00ms/, text);
  await page.screenshot({ path: path.join(process.env.RVBPFD_BUILD_DIR || workDir, "speedscope-screenshot.png") });
  assert.deepEqual(pageErrors, []);
});
