// Warren's warm start for Node.js (see warm.rs). The pool starts
// `node /run/warren/main.js` before the program exists, with this file
// preloaded (`--require` in NODE_OPTIONS). It runs after Node's own startup
// and before the main module is resolved: it says "ready", waits for init to
// deliver the call, makes the process what a cold start would have made it
// (cwd, environment), forgets itself, and returns; Node then loads the real
// /run/warren/main.js as its main module, as it always does. The Sandbox's
// warm modules (`spec.warm.node.modules`) are required first, resolved as
// the main module will resolve them, so its require finds them cached.
'use strict';
(function warm() {
  const fs = require('fs');
  const Module = require('module');
  const [ctrl, out, err] = [500, 501, 502];
  try {
    const names = fs.readFileSync('/run/warren/.warm/modules', 'utf8').split('\n').filter(Boolean);
    const req = Module.createRequire('/run/warren/main.js');
    const loaded = [];
    const failed = [];
    for (const name of names) {
      try {
        req(name);
        loaded.push([name, req.resolve(name)]);
      } catch (e) {
        failed.push(`${name}\x01${String(e && e.message).split('\n')[0].replace(/\0/g, ' ')}`);
      }
    }
    fs.writeSync(ctrl, 'R' + failed.map((f) => '\0' + f).join('') + '\n');
    const chunks = [];
    const buf = Buffer.alloc(65536);
    for (;;) {
      const n = fs.readSync(ctrl, buf, 0, buf.length, null);
      if (n === 0) break;
      chunks.push(Buffer.from(buf.subarray(0, n)));
    }
    const msg = Buffer.concat(chunks);
    // The sandbox was discarded without a call.
    if (msg.length === 0) process.reallyExit(0);
    const parts = msg.toString('utf8').split('\0');
    process.chdir(parts[0]);
    for (const name of Object.keys(process.env)) delete process.env[name];
    for (const entry of parts.slice(1)) {
      const eq = entry.indexOf('=');
      process.env[entry.slice(0, eq)] = entry.slice(eq + 1);
    }
    if (names.length > 0) {
      // The call's home is mounted now: a module it holds would have been
      // loaded cold instead of the image's one loaded here.
      for (const key of Object.keys(Module._pathCache)) delete Module._pathCache[key];
      const resolves = ([name, path]) => { try { return req.resolve(name) === path; } catch { return false; } };
      const ok = loaded.every(resolves);
      fs.writeSync(ctrl, ok ? 'G' : 'C');
      if (!ok) process.reallyExit(0);
    }
    for (const fd of [ctrl, out, err]) fs.closeSync(fd);
    delete require.cache[__filename];
  } catch (e) {
    fs.writeSync(2, `warren: the warm interpreter failed: ${e}\n`);
    process.reallyExit(70);
  }
})();
