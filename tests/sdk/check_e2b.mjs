// Drives Warren with the unmodified E2B JS SDK (npm `e2b`), core calls:
// create, commands.run, files write/read/list, connect from a second
// client, kill. Run by tests/tests/e2b_sdk.rs; E2B_JS_SDK is the package.
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
assert.equal(await sbx.kill(), true);
await assert.rejects(Sandbox.connect(sbx.sandboxId), (e) => e instanceof NotFoundError || /not found/i.test(String(e)));
console.log("ok js core calls");
