"""The E2B SDK's sandbox round trip next to the Baponi SDK's execute, same
gateway, same key, same run (tests/benches/e2b_sdk.rs starts them).
An E2B sandbox is a live sandbox: (2) is a process of a sandbox that stays
up, next to (7) a bare `bash -c 'echo 1'` on this machine; (8) is create →
first `commands.run("echo 1")` timed to its answer; (9) `run_code("x = 1")`
then `run_code("x + 1")` in one code context; (10) `files.list` of a directory
(envd's ListDir, a Python helper in the sandbox).

Each iteration, interleaved: (1) E2B `Sandbox.create()` +
`commands.run("echo 1")` + `kill()`; (2) E2B `commands.run("echo 1")` on a
sandbox created once; (3) Baponi `execute("echo 1", language="bash")`; (4) the same with a new
`thread_id` each call (what an E2B sandbox's first command is); (5) E2B `Sandbox.create()` →
first `commands.run("node -v")`, timed to the command's answer (the kill after it is not timed),
next to (6) a bare `node -v` on this machine.
Prints p50/p99 of each, ms, and the ratios to Baponi's and to the bare `node -v`.
"""

import os
import subprocess
import time

from baponi import Baponi
from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox

RUNS = int(os.environ.get("WARREN_BENCH_RUNS", "100"))
baponi = Baponi(api_key=os.environ["WARREN_BENCH_KEY"], base_url=os.environ["E2B_API_URL"])


phases = {"create": [], "run": [], "kill": []}


def e2b_round_trip():
    t0 = time.perf_counter()
    s = Sandbox.create()
    t1 = time.perf_counter()
    r = s.commands.run("echo 1")
    t2 = time.perf_counter()
    assert r.stdout == "1\n", r
    s.kill()
    t3 = time.perf_counter()
    for name, d in (("create", t1 - t0), ("run", t2 - t1), ("kill", t3 - t2)):
        phases[name].append(d * 1000)


kept = Sandbox.create(timeout=3600)
kept.files.write("/home/user/kept.txt", "kept")


def e2b_command():
    assert kept.commands.run("echo 1").stdout == "1\n"


def baponi_execute():
    r = baponi.execute("echo 1", language="bash")
    assert r.stdout == "1\n", r


fresh = iter(range(10**9))


def baponi_new_thread():
    r = baponi.execute("echo 1", language="bash", thread_id=f"bench-{os.getpid()}-{next(fresh)}")
    assert r.stdout == "1\n", r


def e2b_first_node():
    s = Sandbox.create()
    r = s.commands.run("node -v")
    assert r.stdout.startswith("v"), r
    return s


def bare_node():
    r = subprocess.run(["node", "-v"], capture_output=True, text=True, check=True)
    assert r.stdout.startswith("v"), r


def bare_bash():
    r = subprocess.run(["bash", "-c", "echo 1"], capture_output=True, text=True, check=True)
    assert r.stdout == "1\n", r


def e2b_first_echo():
    s = Sandbox.create()
    r = s.commands.run("echo 1")
    assert r.stdout == "1\n", r
    return s


ci = CodeSandbox.create(timeout=3600)


def run_code_pair():
    assert ci.run_code("x = 1").error is None
    assert ci.run_code("x + 1").text == "2"


def files_list():
    # envd's ListDir: one of Warren's Python helpers in the sandbox.
    assert any(e.name == "kept.txt" for e in kept.files.list("/home/user"))


cases = [("e2b create+run+kill", e2b_round_trip), ("e2b commands.run", e2b_command), ("baponi execute", baponi_execute),
         ("baponi, new thread", baponi_new_thread), ("e2b create→node -v", e2b_first_node), ("bare node -v", bare_node),
         ("bare bash -c echo 1", bare_bash), ("e2b create→echo 1", e2b_first_echo), ("run_code x=1; x+1", run_code_pair),
         ("e2b files.list", files_list)]
times = {name: [] for name, _ in cases}
for i in range(RUNS + 5):
    for name, fn in cases:
        t = time.perf_counter()
        left = fn()
        if i >= 5:
            times[name].append((time.perf_counter() - t) * 1000)
        if left is not None:
            left.kill()
kept.kill()
ci.kill()


def pct(xs, p):
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * p)]


base = (pct(times["baponi execute"], 0.5), pct(times["baponi execute"], 0.99))
print(f"{RUNS} iterations, interleaved; ms")
print(f"{'case':<22} {'p50':>8} {'p99':>8} {'p50/baponi':>11} {'p99/baponi':>11}")
for name, xs in times.items():
    p50, p99 = pct(xs, 0.5), pct(xs, 0.99)
    print(f"{name:<22} {p50:>8.2f} {p99:>8.2f} {p50 / base[0]:>10.2f}x {p99 / base[1]:>10.2f}x")
print("the round trip's phases (p50, ms): " + ", ".join(f"{n} {pct(xs[5:], 0.5):.2f}" for n, xs in phases.items()))
node = (pct(times["bare node -v"], 0.5), pct(times["bare node -v"], 0.99))
first = times["e2b create→node -v"]
print(f"e2b create→first node -v / bare node -v: p50 {pct(first, 0.5) / node[0]:.2f}x, p99 {pct(first, 0.99) / node[1]:.2f}x")
bash = (pct(times["bare bash -c echo 1"], 0.5), pct(times["bare bash -c echo 1"], 0.99))
live = (pct(times["e2b commands.run"], 0.5), pct(times["e2b commands.run"], 0.99))
print(f"e2b commands.run in a live sandbox - bare bash -c: p50 +{live[0] - bash[0]:.2f} ms, p99 +{live[1] - bash[1]:.2f} ms; "
      f"ratio p50 {live[0] / bash[0]:.2f}x, p99 {live[1] / bash[1]:.2f}x")
