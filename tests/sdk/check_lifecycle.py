"""A live sandbox's lifecycle as its callers see it (issue #46), with the
unmodified E2B SDK (e2b from PyPI) and its info as JSON: run by
tests/tests/live_lifecycle.rs against a key whose ApiKey sets
liveIdleSeconds: 30 and publicPorts: true. E2B_API_URL/E2B_SANDBOX_URL
name the gateway, E2B_API_KEY the key, WARREN_E2B_OTHER_KEY a key without
publicPorts. Prints "ok lifecycle" when every check passed.

- an idempotent create: the same key twice is one sandbox;
- public ports: a sandbox created with allowPublicTraffic answers on its
  port without a token, one created without does not, and a key without
  publicPorts cannot ask for it;

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
import urllib.error
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


def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def serve(s):
    s.files.write("/tmp/site/t.txt", "public")
    s.commands.run("python3 -m http.server 8000 --bind 127.0.0.1", background=True, cwd="/tmp/site")
    s.commands.run("for i in $(seq 300); do python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/t.txt')\" 2>/dev/null && break; sleep 0.1; done")
    return f"{os.environ['E2B_SANDBOX_URL']}/sandboxes/{s.sandbox_id}/ports/8000/t.txt"


# Idempotent create (#47): a retry with the same key answers the same
# sandbox; the key with another request is refused.
once = Sandbox.create(idempotency_key="lifecycle-once", timeout=600)
assert Sandbox.create(idempotency_key="lifecycle-once", timeout=600).sandbox_id == once.sandbox_id
try:
    Sandbox.create(idempotency_key="lifecycle-once", timeout=601)
    raise AssertionError("the key made a second sandbox for another request")
except AssertionError:
    raise
except Exception as e:
    assert "Idempotency-Key" in str(e), e
once.kill()

public = Sandbox.create(network={"allow_public_traffic": True})
assert info(public.sandbox_id)["status"] in ("ready", "active")
assert fetch(serve(public)) == (200, "public")
private = Sandbox.create()
got = fetch(serve(private))
assert got[0] == 502 and "public" not in got[1], got
try:
    Sandbox.create(network={"allow_public_traffic": True}, api_key=os.environ["WARREN_E2B_OTHER_KEY"])
    raise AssertionError("a key without publicPorts made a public sandbox")
except Exception as e:
    assert "publicPorts" in str(e), e
public_url = f"{os.environ['E2B_SANDBOX_URL']}/sandboxes/{public.sandbox_id}/ports/8000/t.txt"
public.kill()
private.kill()
assert fetch(public_url)[0] == 502, "a killed sandbox's public port still answers"

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
