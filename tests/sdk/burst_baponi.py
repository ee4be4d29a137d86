"""A burst through the Baponi SDK (tests/benches/burst.rs starts it):
WARREN_BURST (default 100) concurrent `execute("echo burst-<i>", language="bash")`
calls on one AsyncBaponi client. Prints one JSON line: how many succeeded,
each call's time (median, p99, ms) and the wall clock; then up to five
failures. The SDK's own retries are off unless WARREN_BURST_RETRIES says
otherwise, so what is counted is what the gateway answered.
"""

import asyncio
import json
import math
import os
import time

from baponi import AsyncBaponi

N = int(os.environ.get("WARREN_BURST", "100"))
RETRIES = int(os.environ.get("WARREN_BURST_RETRIES", "0"))


async def main():
    client = AsyncBaponi(api_key=os.environ["WARREN_BENCH_KEY"], base_url=os.environ["WARREN_BENCH_URL"], max_retries=RETRIES, timeout=120.0)

    async def one(i):
        t0 = time.perf_counter()
        r = await client.execute(f"echo burst-{i}", language="bash")
        if r.stdout != f"burst-{i}\n":
            raise AssertionError(f"call {i} printed {r.stdout!r}")
        return (time.perf_counter() - t0) * 1000

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(N)), return_exceptions=True)
    wall = (time.perf_counter() - start) * 1000
    await client.close()
    ok = sorted(r for r in results if isinstance(r, float))
    failed = [f"{type(r).__name__}: {r}" for r in results if not isinstance(r, float)]
    at = lambda q: ok[min(len(ok) - 1, max(0, math.ceil(q * len(ok)) - 1))] if ok else None
    print(json.dumps({"calls": N, "ok": len(ok), "median_ms": at(0.5), "p99_ms": at(0.99), "wall_ms": wall}))
    for f in failed[:5]:
        print(f"failed: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
