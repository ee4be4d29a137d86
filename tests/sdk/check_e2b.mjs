// Drives Warren with the unmodified E2B JS SDK (npm `e2b`), core calls:
// create, commands.run, files write/read/list, connect from a second
// client, kill; and the live sandbox: background commands, connect, stdin,
// kill by pid, a terminal, watchDir, a port. Run by tests/tests/e2b_sdk.rs;
// E2B_JS_SDK is the package.
import assert from "node:assert/strict";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { readFileSync } from "node:fs";

const dir = process.env.E2B_JS_SDK;
const pkg = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
const entry = pkg.exports?.["."]?.import?.default ?? pkg.exports?.["."]?.import ?? pkg.module ?? pkg.main;
const { Sandbox, CommandExitError, NotFoundError } = await import(pathToFileURL(path.join(dir, typeof entry === "string" ? entry : entry.default)).href);

const sbx = await Sandbox.create({ envs: { GREETING: "hi" }, metadata: { lang: "js" } });
const r = await sbx.commands.run("echo $GREETING from js");
assert.equal(r.stdout, "hi from js\n");
assert.equal(r.exitCode, 0);
await assert.rejects(sbx.commands.run("exit 4"), (e) => e instanceof CommandExitError && e.exitCode === 4);
await sbx.files.write("/home/user/js.txt", "written by js");
assert.equal(await sbx.files.read("/home/user/js.txt"), "written by js");
const names = (await sbx.files.list("/home/user")).map((e) => e.name);
assert.ok(names.includes("js.txt"), names.join(","));
const other = await Sandbox.connect(sbx.sandboxId);
assert.equal((await other.commands.run("cat js.txt")).stdout, "written by js");

// A live sandbox: a background command another client re-attaches to and feeds.
const bg = await sbx.commands.run("echo first; read l; echo got $l", { background: true, stdin: true });
const again = await other.commands.connect(bg.pid);
await other.commands.sendStdin(bg.pid, "js\n");
assert.equal((await again.wait()).stdout, "first\ngot js\n");
const sleeper = await sbx.commands.run("sleep 600", { background: true });
assert.ok((await sbx.commands.list()).some((p) => p.pid === sleeper.pid));
assert.equal(await sbx.commands.kill(sleeper.pid), true);
// A terminal.
let typed = "";
const decoder = new TextDecoder();
const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { typed += decoder.decode(d); } });
await sbx.pty.sendInput(term.pid, new TextEncoder().encode("echo $((6*7)); exit 0\n"));
await term.wait();
assert.ok(typed.includes("42"), typed);
// watchDir streams what happens in a directory.
const events = [];
await sbx.files.makeDir("/tmp/jsw");
const watcher = await sbx.files.watchDir("/tmp/jsw", (e) => events.push(e));
await sbx.files.write("/tmp/jsw/f.txt", "x");
for (let i = 0; i < 600 && !events.some((e) => e.name === "f.txt"); i++) await new Promise((r) => setTimeout(r, 50));
await watcher.stop();
assert.ok(events.some((e) => e.name === "f.txt" && e.type === "create"), JSON.stringify(events));
// A server's port through the gateway, by E2B's header routing.
await sbx.files.write("/tmp/site/i.txt", "port ok");
const server = await sbx.commands.run("cd /tmp/site && exec python3 -m http.server 8000 --bind 127.0.0.1", { background: true });
let body = "";
for (let i = 0; i < 600 && body !== "port ok"; i++) {
  const res = await fetch(`${process.env.E2B_SANDBOX_URL}/i.txt`, { headers: { "E2b-Sandbox-Id": sbx.sandboxId, "E2b-Sandbox-Port": "8000", "E2B-Traffic-Access-Token": sbx.trafficAccessToken } });
  body = await res.text();
  if (body !== "port ok") await new Promise((r) => setTimeout(r, 50));
}
assert.equal(body, "port ok");
await sbx.commands.kill(server.pid);
assert.equal(await sbx.kill(), true);
await assert.rejects(Sandbox.connect(sbx.sandboxId), (e) => e instanceof NotFoundError || /not found/i.test(String(e)));
console.log("ok js core calls");
