// Shared by the browser test and benchmarks/report_load.mjs: the system Chromium driven by playwright-core (no
// browser download), and running rvbpfd.
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
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
