// A burst through the unmodified E2B JS SDK (npm `e2b`): WARREN_BURST
// (default 100) concurrent Sandbox.create() + commands.run() + kill(), as
// peers are measured. Prints one JSON line: how many succeeded, the time
// from create to the first command's result (median, p99) and the wall
// clock; then up to five failures. Exits 1 when any call failed.
// E2B_JS_SDK is the package; WARREN_BURST_TIMEOUT_MS, when set, is passed
// as the SDK's request and command timeouts (default: the SDK's own).
import path from "node:path";
import { pathToFileURL } from "node:url";
import { readFileSync } from "node:fs";

const dir = process.env.E2B_JS_SDK;
const pkg = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
const entry = pkg.exports?.["."]?.import?.default ?? pkg.exports?.["."]?.import ?? pkg.module ?? pkg.main;
const { Sandbox } = await import(pathToFileURL(path.join(dir, typeof entry === "string" ? entry : entry.default)).href);

const n = Number(process.env.WARREN_BURST ?? 100);
const limit = process.env.WARREN_BURST_TIMEOUT_MS ? Number(process.env.WARREN_BURST_TIMEOUT_MS) : undefined;
const opts = limit ? { requestTimeoutMs: limit, timeoutMs: limit } : {};

async function one(i) {
  const t0 = performance.now();
  const sbx = await Sandbox.create(limit ? { requestTimeoutMs: limit } : {});
  const r = await sbx.commands.run(`echo burst-${i}`, opts);
  const first = performance.now() - t0;
  if (r.stdout !== `burst-${i}\n`) throw new Error(`command ${i} printed ${JSON.stringify(r.stdout)}`);
  await sbx.kill(limit ? { requestTimeoutMs: limit } : {});
  return first;
}

const start = performance.now();
const settled = await Promise.allSettled(Array.from({ length: n }, (_, i) => one(i)));
const wall = performance.now() - start;
const ok = settled.filter((s) => s.status === "fulfilled").map((s) => s.value).sort((a, b) => a - b);
const at = (q) => (ok.length ? ok[Math.min(ok.length - 1, Math.ceil(q * ok.length) - 1)] : null);
const failed = settled.filter((s) => s.status === "rejected").map((s) => `${s.reason?.name}: ${s.reason?.message}`);
console.log(JSON.stringify({ calls: n, ok: ok.length, median_ms: at(0.5), p99_ms: at(0.99), wall_ms: wall }));
for (const f of failed.slice(0, 5)) console.log(`failed: ${f}`);
process.exit(failed.length ? 1 : 0);
