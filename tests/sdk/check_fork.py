"""E2B's fork with the unmodified E2B SDK (e2b from PyPI), issue #47: run by
tests/tests/e2b_fork.rs. E2B_API_URL/E2B_SANDBOX_URL name the gateway,
E2B_API_KEY the key, WARREN_E2B_OTHER_KEY another key. Prints "ok fork"
when every check passed.

- a running sandbox forks into two, each a running sandbox whose home is
  the source's at the moment of the fork (files written by commands and by
  the Files API), its metadata and environment too;
- the forks and the source then go their own ways;
- processes are not forked: the source's background server keeps running,
  the forks have none;
- a paused sandbox forks from its saved home;
- another key cannot fork it, and a bad count is refused."""

import json
import os
import urllib.error
import urllib.request

from e2b import Sandbox
from e2b.exceptions import SandboxException

API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
OTHER = os.environ["WARREN_E2B_OTHER_KEY"]


def post(path, body, key=KEY):
    req = urllib.request.Request(f"{API}{path}", data=json.dumps(body).encode(), method="POST", headers={"X-API-KEY": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


src = Sandbox.create(metadata={"job": "prep"}, envs={"STAGE": "forked"})
src.commands.run("mkdir -p ~/proj && echo prepared > ~/proj/state && pip --version >/dev/null 2>&1; echo v1 > ~/proj/version")
src.files.write("/home/user/proj/notes.txt", "from the files api")
server = src.commands.run("sleep 600", background=True)

forks = src.fork(count=2)
assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
ids = {f.sandbox_id for f in forks}
assert len(ids) == 2 and src.sandbox_id not in ids, ids
for f in forks:
    assert f.is_running()
    out = f.commands.run("cat ~/proj/state ~/proj/version ~/proj/notes.txt; echo; echo $STAGE").stdout
    assert out == "prepared\nv1\nfrom the files api\nforked\n", out
    assert f.get_info().metadata.get("job") == "prep", f.get_info().metadata
    assert not [p for p in f.commands.list() if "sleep 600" in " ".join([p.cmd] + list(p.args))], "processes are not forked"

# Each goes its own way.
forks[0].files.write("/home/user/proj/state", "fork zero")
src.files.write("/home/user/proj/state", "source")
assert forks[1].files.read("/home/user/proj/state") == "prepared\n"
assert forks[0].files.read("/home/user/proj/state") == "fork zero"
assert src.files.read("/home/user/proj/state") == "source"
assert [p for p in src.commands.list() if p.pid == server.pid], "the source's process still runs"

# A paused sandbox forks from what it saved.
src.pause()
[late] = Sandbox.fork(src.sandbox_id, count=1)
assert late.files.read("/home/user/proj/state") == "source"

# Another key does not see it; a bad count changes nothing.
status, _ = post(f"/sandboxes/{src.sandbox_id}/fork", {"count": 1}, key=OTHER)
assert status == 404, status
for bad in [{"count": 0}, {"count": 21}, {"count": "two"}]:
    status, body = post(f"/sandboxes/{src.sandbox_id}/fork", bad)
    assert status == 400, (bad, status, body)
before = {s.sandbox_id for s in Sandbox.list().next_items()}
assert before == ids | {src.sandbox_id, late.sandbox_id}, before

for s in forks + [late]:
    s.kill()
Sandbox.kill(src.sandbox_id)
print("ok fork")
