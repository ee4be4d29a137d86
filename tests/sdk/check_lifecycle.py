"""A live sandbox's lifecycle as its callers see it (issue #46), with the
unmodified E2B SDK (e2b from PyPI) and its info as JSON: run by
tests/tests/live_lifecycle.rs against a key whose ApiKey sets
liveIdleSeconds: 30. E2B_API_URL/E2B_SANDBOX_URL name the gateway,
E2B_API_KEY the key. Prints "ok lifecycle" when every check passed.

- `status` (Banata's names) in the sandbox's info: ready, active while a
  process a caller started runs, ready again once it ended;
- calls keep a sandbox running past its idle limit; so does a stream a
  caller holds open (a followed command);
- a background process alone does not: once nobody has called for the
  idle limit it is paused (`status` paused, `statusReason` says idle), its
  home saved, and connecting resumes it with its files."""

import json
import os
import time
import urllib.request

from e2b import Sandbox

API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
IDLE = 30


def info(sid):
    req = urllib.request.Request(f"{API}/sandboxes/{sid}", headers={"X-API-KEY": KEY})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def until(what, test, bound):
    """Polls `test` (returning a value or None) until it gives one, at most
    `bound` seconds: the bound is generous, what is asserted is the state."""
    end = time.monotonic() + bound
    while True:
        v = test()
        if v is not None:
            return v
        assert time.monotonic() < end, f"{what}: not within {bound} s"
        time.sleep(0.5)


sbx = Sandbox.create(timeout=900)
sid = sbx.sandbox_id
first = info(sid)
assert first["state"] == "running" and first["status"] in ("ready", "active"), first

# Active while a command a caller started runs (as the node reports it), ready after.
h = sbx.commands.run("sleep 600", background=True)
until("active", lambda: info(sid)["status"] == "active" or None, 60)
sbx.commands.kill(h.pid)
until("ready again", lambda: info(sid)["status"] == "ready" or None, 60)

# Calls keep it running past its idle limit.
sbx.files.write("/home/user/kept.txt", "saved at the idle pause")
end = time.monotonic() + IDLE + 15
while time.monotonic() < end:
    assert sbx.commands.run("true").exit_code == 0
    assert info(sid)["state"] == "running", "paused while it was being called"
    time.sleep(2)

# So does a command a caller follows (its stream open), without any call.
followed = sbx.commands.run(f"sleep {IDLE + 15}; echo done", background=True)
assert followed.wait().stdout == "done\n"
assert info(sid)["state"] == "running", "paused while a caller followed a command"

# A background process nobody follows does not: paused once idle.
bg = sbx.commands.run("sleep 3600", background=True)
bg.disconnect()
started = time.monotonic()
paused = until("paused for idleness", lambda: (lambda v: v if v["state"] == "paused" else None)(info(sid)), IDLE + 90)
assert time.monotonic() - started >= IDLE - 1, "paused before its idle limit"
assert paused["status"] == "paused" and "idle" in paused.get("statusReason", ""), paused

# Connecting resumes it, its home as the pause saved it; the process is gone.
again = Sandbox.connect(sid)
assert info(sid)["status"] in ("ready", "active") and "statusReason" not in info(sid), info(sid)
assert again.files.read("/home/user/kept.txt") == "saved at the idle pause"
assert all("sleep 3600" not in " ".join([p.cmd] + p.args) for p in again.commands.list())
again.kill()
print("ok lifecycle")
