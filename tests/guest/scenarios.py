"""Scenarios run in the cgroup-v2 test guest against this build's gateway and
agent (tests/guest/run.sh starts them). Standard library only. Each check
prints one `WARREN-RESULT {json}` line; the host test asserts every line.

    scenarios.py wait URL
    scenarios.py run URL KEY PLACEMENT DELEGATED_GROUP DATA_DIR
    scenarios.py killed URL KEY AGENT_PID CGROUP_ROOT
    scenarios.py after_restart URL KEY CGROUP_ROOT
"""

import glob
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

PLACEMENT = "?"
MIB = 1 << 20


def result(check, ok, detail=""):
    line = {"placement": PLACEMENT, "check": check, "ok": bool(ok), "detail": str(detail)[:600]}
    print("WARREN-RESULT " + json.dumps(line), flush=True)


def execute(url, key, code, language="python", timeout=60, **extra):
    body = dict(code=code, language=language, timeout=timeout, **extra)
    req = urllib.request.Request(
        url + "/v1/sandbox/execute",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout + 120) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return {"http_status": e.code, **json.loads(e.read() or b"{}")}


def sandbox_groups(root):
    return [p for p in glob.glob(root + "/**/sbx-*", recursive=True) if os.path.isdir(p)]


def wait(url):
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("the gateway did not become ready")


def run(url, key, group, data):
    v2_peak = kernel_at_least(5, 19)  # memory.peak
    # Placement: every sandbox group (pre-warmed ones exist already) lies in
    # the agent's delegated group, so its limits cover them.
    groups = sandbox_groups("/sys/fs/cgroup")
    inside = [g for g in groups if g.startswith(group.rstrip("/") + "/warren/")]
    result("sandboxes_under_the_agents_group", groups and inside == groups, f"{groups}")

    r = execute(url, key, "import sys; print('py', sys.version_info[0])")
    result("python", r.get("stdout") == "py 3\n" and r.get("exit_code") == 0, r)
    r = execute(url, key, "console.log('node', 6*7)", "node")
    result("node", r.get("stdout") == "node 42\n" and r.get("exit_code") == 0, r)
    r = execute(url, key, "echo bash $((6*7)); exit 3", "bash")
    result("bash", r.get("stdout") == "bash 42\n" and r.get("exit_code") == 3, r)

    r = execute(url, key, "echo before; sleep 30; echo after", "bash", timeout=2)
    result("timeout_keeps_partial_output", r.get("timed_out") and r.get("error") == "timeout" and r.get("stdout") == "before\n", r)

    r = execute(url, key, "b = bytearray(1 << 30)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')")
    result("oom", r.get("oom_killed") and r.get("error") == "memory_limit_exceeded" and "survived" not in r.get("stdout", ""), r)

    code = (
        "import os, time\nn = 0\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(5); os._exit(0)\n    n += 1\n"
        "print(n)"
    )
    r = execute(url, key, code)
    forks = int(r.get("stdout", "0").strip() or 0)
    result("pids_limit", 0 < forks < 64, r)

    # Two busy processes for 3 s under a 0.5-CPU quota: without the quota
    # they would use about twice the wall time.
    r = execute(url, key, "for i in 1 2; do (while :; do :; done) & done; sleep 3; kill %1 %2", "bash")
    cpu, wall = r.get("cpu_ms", 0), r.get("duration_ms", 0)
    result("cpu_quota", r.get("exit_code") == 0 and 0 < cpu < 0.75 * wall, f"cpu_ms={cpu} duration_ms={wall}")

    r = execute(url, key, "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass")
    result("cpu_ms", r.get("cpu_ms", 0) >= 450, f"cpu_ms={r.get('cpu_ms')}")

    r = execute(url, key, "b = bytearray(100 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint(len(b))")
    peak = r.get("peak_memory_bytes")
    if v2_peak:
        result("peak_memory_bytes", isinstance(peak, int) and 100 * MIB <= peak <= 256 * MIB, f"peak={peak}")
    else:
        result("peak_memory_bytes_null_without_memory_peak", peak is None and r.get("exit_code") == 0, f"peak={peak}")

    thread = f"t-{PLACEMENT}".replace("_", "-")
    r1 = execute(url, key, "echo one >> ~/calls; wc -l < ~/calls", "bash", thread_id=thread)
    r2 = execute(url, key, "echo two >> ~/calls; wc -l < ~/calls", "bash", thread_id=thread)
    if kernel_at_least(5, 19):
        result("thread_home", r1.get("stdout") == "1\n" and r2.get("stdout") == "2\n", f"{r1} / {r2}")
    else:
        # No overlay on id-mapped layers: refused with its own code, nothing ran.
        refused = all(r.get("error") == "thread_mount_error" and r.get("exit_code") == -1 for r in (r1, r2))
        result("thread_home_refused_without_idmapped_overlay", refused, f"{r1} / {r2}")

    code = (
        "import csv, os\nrows = list(csv.reader(open('/data/files/in.csv')))\n"
        "with open('/data/files/out.txt', 'w') as f:\n    f.write(str(len(rows)))\n"
        "print(repr(open('/data/files/out.txt').read()), os.stat('/data/files/out.txt').st_size)"
    )
    r = execute(url, key, code)
    written = open(os.path.join(data, "out.txt")).read() if os.path.exists(os.path.join(data, "out.txt")) else None
    result("storage_mount", r.get("exit_code") == 0 and written == "2", f"{r} / {written!r}")
    if written is not None:
        os.unlink(os.path.join(data, "out.txt"))
    # The same without closing the file: the interpreter closes it at exit.
    r = execute(url, key, "open('/data/files/out2.txt', 'w').write('x' * 3)")
    path = os.path.join(data, "out2.txt")
    written = open(path).read() if os.path.exists(path) else None
    result("storage_mount_closed_at_exit", r.get("exit_code") == 0 and written == "xxx", f"{r} / {written!r}")
    if written is not None:
        os.unlink(path)


def kernel_at_least(major, minor):
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


def killed(url, key, agent_pid, root):
    """kill -9 of the agent while a program runs: the caller gets node_lost."""
    req = urllib.request.Request(
        url + "/v1/sandbox/execute",
        data=json.dumps({"code": "echo ready; sleep 60", "language": "bash", "timeout": 90}).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json", "Accept": "application/x-ndjson"},
    )
    lines = []
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            for raw in r:
                lines.append(raw.decode())
                if "ready" in raw.decode() and agent_pid:
                    busy = [g for g in sandbox_groups(root) if open(g + "/cgroup.procs").read().strip()]
                    with open("/tmp/killed-groups", "w") as f:
                        f.write("\n".join(busy))
                    os.kill(int(agent_pid), signal.SIGKILL)
                    agent_pid = None
    except urllib.error.HTTPError as e:
        lines.append(e.read().decode())
    except OSError as e:
        lines.append(f"connection: {e}")
    text = "".join(lines)
    result("caller_gets_node_lost", "node_lost" in text, text[-400:])


def after_restart(url, key, root):
    left = [g for g in open("/tmp/killed-groups").read().split("\n") if g]
    still = [g for g in left if os.path.isdir(g)]
    result("restart_removes_what_the_killed_agent_left", left and not still, f"killed-run groups {left}, still there {still}")
    r = execute(url, key, "print('after restart')")
    result("next_call_works", r.get("stdout") == "after restart\n", r)


def main():
    global PLACEMENT
    cmd = sys.argv[1]
    if cmd == "wait":
        wait(sys.argv[2])
    elif cmd == "run":
        url, key, PLACEMENT, group, data = sys.argv[2:7]
        run(url, key, group, data)
    elif cmd == "killed":
        PLACEMENT = "killed"
        killed(*sys.argv[2:6])
    elif cmd == "after_restart":
        PLACEMENT = "killed"
        wait(sys.argv[2])
        after_restart(*sys.argv[2:5])
    elif cmd == "kernel_below":
        major, minor = sys.argv[2].split(".")
        sys.exit(1 if kernel_at_least(int(major), int(minor)) else 0)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is a failed check, not a silent gap
        result("driver_crashed", False, repr(e))
        sys.exit(1)
