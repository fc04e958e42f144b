// Shared by the browser test and benchmarks/report_load.mjs: the system Chromium driven by playwright-core (no
// browser download), and running rvbpfd.
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const SOURCE_DIR = path.resolve(HERE, "..", "..");
export const CHROMIUM = process.env.RVBPFD_CHROMIUM || "/usr/bin/chromium";

const SETUP_HINT = "run tools/install-browser-deps.sh (installs Debian's chromium and tests/browser/node_modules)";

// playwright-core from tests/browser/node_modules, whichever directory the caller runs in.
export function loadPlaywright() {
  const require = createRequire(path.join(HERE, "package.json"));
  try {
    return require("playwright-core");
  } catch (err) {
    throw new Error(`playwright-core is not installed in ${HERE}/node_modules: ${SETUP_HINT} (${err.message})`);
  }
}

export async function launchChromium() {
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM}: ${SETUP_HINT}`);
  const { chromium } = loadPlaywright();
  // A fresh profile per run, and nothing that talks to the network on its own.
  const userDataDir = mkdtempSync(path.join(tmpdir(), "rvbpfd-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
  return { context, userDataDir };
}

export function fileUrl(p) { return pathToFileURL(path.resolve(p)).href; }

// Runs a command; throws with its output when it fails.
export function run(cmd, args, options = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", maxBuffer: 64 << 20, ...options });
  if (r.error) throw new Error(`${cmd} ${args.join(" ")}: ${r.error.message}`);
  if (r.status !== 0) {
    throw new Error(`${cmd} ${args.join(" ")} exited with ${r.status}\n${r.stdout || ""}${r.stderr || ""}`);
  }
  return r;
}

// `rvbpfd report TRACE -o OUT`.
export function buildReport(rvbpfd, trace, out) {
  run(rvbpfd, ["report", trace, "-o", out]);
  if (!existsSync(out)) throw new Error(`rvbpfd report wrote no ${out}`);
  return out;
}

// The test Ruby: RVBPFD_RUBY, else tools/build-test-rubies.sh's 3.4.5-static.
export function testRuby() {
  if (process.env.RVBPFD_RUBY) return process.env.RVBPFD_RUBY;
  const prefix = run("bash", [path.join(SOURCE_DIR, "tools/build-test-rubies.sh"), "--print-prefix", "3.4.5-static"])
      .stdout.trim();
  return path.join(prefix, "bin", "ruby");
}

// Records tests/e2e/workloads/<workload>.rb launched by rvbpfd (`rvbpfd -o OUT [args] -- ruby workload`); the
// workloads wait for a line on stdin. Needs root (BPF uprobes) and the test Ruby. The trace is written as plain JSON
// Lines (--trace-format=jsonl) because these tests read it themselves, line by line, beside the report.
export function recordWorkload(rvbpfd, workload, out, args = [], env = {}) {
  const ruby = testRuby();
  if (!existsSync(ruby)) throw new Error(`no test Ruby at ${ruby}: build it with tools/build-test-rubies.sh`);
  if (process.getuid && process.getuid() !== 0) throw new Error("recording needs root (BPF uprobes)");
  run(rvbpfd, ["-o", out, "--trace-format=jsonl", ...args, "--", ruby, path.join(SOURCE_DIR, "tests/e2e/workloads", workload + ".rb")],
      { input: "go\n", timeout: 180_000, env: { ...process.env, ...env } });
  return out;
}

// A trace's frames, stacks and events (in time order), read independently of rvbpfd; stackText(id) is each frame of
// a stack as the report's card writes it, leaf first.
export function readTrace(trace) {
  const frames = new Map(), stacks = new Map(), events = [], threads = new Map();
  for (const line of readFileSync(trace, "utf8").split("\n")) {
    if (!line) continue;
    const o = JSON.parse(line);
    if (o.frame) frames.set(o.frame.id, o.frame);
    else if (o.stack && typeof o.stack === "object") stacks.set(o.stack.id, o.stack.frames);
    else if (o.thread && typeof o.thread === "object") threads.set(o.thread.ruby_thread, o.thread);
    else if (o.thread_info && typeof o.thread_info === "object") {
      // A name or namespace tid learnt or changed after the thread line (docs/rvtrace.md): the latest one counts.
      const t = threads.get(o.thread_info.ruby_thread);
      for (const k of ["name", "native_name", "ns_tid"]) if (t && k in o.thread_info) t[k] = o.thread_info[k];
    } else if (o.t_ns !== undefined) events.push(o);
  }
  events.sort((a, b) => a.t_ns - b.t_ns);  // Array.prototype.sort is stable
  const text = (f) => f.label + (f.path ? ` (${f.path}${f.line > 0 ? ":" + f.line : ""})` : f.line > 0 ? ` (line ${f.line})` : "");
  const stackText = (id) => stacks.get(id).map((f) => text(frames.get(f)));
  // The leaf frame's label of an event's stack, or null.
  const leaf = (e) => {
    const st = e.stack !== undefined ? stacks.get(e.stack) : null;
    return st && st.length ? frames.get(st[0]).label : null;
  };
  // How rvbpfd's tools label a thread (src/trace/reader.h ThreadLabelWithName): "main" or "Thread #N", then " (NAME)"
  // with NAME its Thread#name, else its native name unless that is the main thread's (every unnamed thread has it).
  const threadLabel = (n) => {
    const t = threads.get(n) || {};
    const main = [...threads.values()].find((x) => x.main);
    let name = t.name || "";
    if (!name && t.native_name && t.native_name !== (main && main.native_name)) name = t.native_name;
    const base = t.main ? "main" : `Thread #${n}`;
    return name && !(t.main && name === "main") ? `${base} (${name})` : base;
  };
  return { frames, stacks, events, threads, stackText, leaf, threadLabel };
}

// Zooms the report in `page` onto block `index` of `lane` (a thread lane, or "gvl-owner" with kind "owner") and
// clicks its middle with the mouse; returns the card's data attributes and text.
export async function clickBlock(page, laneId, kind, index) {
  const target = await page.evaluate(([laneId, kind, index]) => {
    const R = window.rvReport, d = R.data;
    const sp = kind === "owner" ? d.owner : d.threads.find((t) => "thread-" + t.id === laneId);
    const s = sp.s[index], e = sp.e[index], pad = (e - s) * 0.5;
    R.setView(s - pad, e + pad);
    R.drawNow();
    const rect = R.laneRect(laneId);
    return { x: R.clientX((s + e) / 2), y: rect.y + rect.height / 2 };
  }, [laneId, kind, index]);
  await page.mouse.click(target.x, target.y);
  return page.$eval("#card", (c) => ({ ...c.dataset, text: c.textContent }));
}
