"""What this machine's kernel costs before Warren does anything (#30).

Two floors Warren cannot go under, measured with nothing of Warren running:

* namespaces: bash `echo 1` in a loop of fork -> unshare(the six namespaces a
  sandbox gets) -> fork (the new pid namespace's first process) -> exec, with
  four drivers for the two cores, against the same loop without unshare. No
  mounts, cgroups, seccomp, gRPC or HTTP: what is left per call for those is
  the gap between this rate and a target rate.
* exit: from a Python program's last line to its parent seeing it exit, for
  a plain interpreter and one holding a large import (frozen out of the
  collector, as a warm interpreter's are), each with a normal exit and with
  os._exit (the kernel tearing the address space down, and nothing else).

Run as root on an otherwise quiet machine:  python3 -S tests/benches/floors.py

`--floor` measures only the six-namespace loop and prints one line,
`floor <calls/s> <CPU µs per call>` (the drivers' and their children's
user + system time), for a benchmark that sets Warren against it in the
same run (tests/benches/throughput_floor.rs).
"""

import ctypes
import os
import resource
import statistics
import subprocess
import sys
import time

NAMESPACES = 0x10000000 | 0x20000000 | 0x00020000 | 0x40000000 | 0x08000000 | 0x04000000
NET = 0x40000000
SECONDS = 5
DRIVERS = 4
EXITS = 40


def one_call(libc, flags):
    pid = os.fork()
    if pid == 0:
        if flags and libc.unshare(flags) != 0:
            os._exit(99)
        child = os.fork()
        if child == 0:
            os.execv("/bin/bash", ["bash", "-c", "echo 1 >/dev/null"])
        _, status = os.waitpid(child, 0)
        os._exit(0 if status == 0 else 98)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit("a call failed (status %d): run as root" % status)


def rate(libc, flags, seconds=SECONDS):
    end = time.monotonic() + seconds
    r, w = os.pipe()
    drivers = []
    for _ in range(DRIVERS):
        pid = os.fork()
        if pid == 0:
            n = 0
            while time.monotonic() < end:
                one_call(libc, flags)
                n += 1
            os.write(w, b"%d\n" % n)
            os._exit(0)
        drivers.append(pid)
    for pid in drivers:
        os.waitpid(pid, 0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        return sum(int(n) for n in f.read().split()) / seconds


def floor(libc):
    """The six-namespace rate, and the CPU each call took (µs): what the
    drivers and everything they forked used, all of it reaped."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    per_second = rate(libc, NAMESPACES)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print("floor %.1f %.1f" % (per_second, cpu * 1e6 / max(per_second * SECONDS, 1)), flush=True)


def python(code):
    # Without `site` (a host's .pth files import things at startup), its
    # directories on the path by hand.
    import site
    return [sys.executable, "-S", "-c", "import sys; sys.path += %r\n%s" % (site.getsitepackages(), code)]


def heaviest():
    for name in ("pandas", "boto3", "numpy"):
        if subprocess.run(python("import " + name), capture_output=True).returncode == 0:
            return name
    return None


def exit_ms(body, ending):
    r, w = os.pipe()
    code = "import os\n%s\nos.write(%d, b'x')\n%s\n" % (body, w, ending)
    child = subprocess.Popen(python(code), pass_fds=(w,))
    os.close(w)
    os.read(r, 1)
    start = time.perf_counter()
    child.wait()
    took = time.perf_counter() - start
    os.close(r)
    return took * 1000


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if sys.argv[1:] == ["--floor"]:
        return floor(libc)
    print("namespaces: bash `echo 1`, %d drivers, %d s each" % (DRIVERS, SECONDS))
    for name, flags in [("bare", 0), ("six namespaces", NAMESPACES), ("five (no network)", NAMESPACES & ~NET)] * 2:
        print("  %-18s %6.0f calls/s" % (name, rate(libc, flags)))
    module = heaviest()
    cases = [("plain", "pass")]
    if module:
        cases.append((module, "import %s, gc; gc.freeze()" % module))
    print("exit: last line -> parent sees the exit, p50 of %d (interleaved)" % EXITS)
    times = {(c, e): [] for c, _ in cases for e in ("exit", "os._exit")}
    for _ in range(EXITS):
        for case, body in cases:
            times[(case, "exit")].append(exit_ms(body, ""))
            times[(case, "os._exit")].append(exit_ms(body, "os._exit(0)"))
    for (case, ending), ms in times.items():
        print("  %-8s %-9s %6.2f ms" % (case, ending, statistics.median(ms)))


if __name__ == "__main__":
    main()
