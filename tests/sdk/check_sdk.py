"""Drives Warren with the public Baponi Python SDK (pip install baponi).

Run by tests/tests/gateway_sdk.rs inside a virtualenv it makes. Arguments
come from the environment: WARREN_URL and the test keys. Any failed check
raises, and the test fails with this script's output.
"""

import asyncio
import os
import threading
import warnings

from baponi import (
    APIValidationError,
    AsyncBaponi,
    AuthenticationError,
    Baponi,
    BaponiError,
    ForbiddenError,
    KeepaliveEvent,
    OutputEvent,
    RateLimitError,
    ResultEvent,
    StatusEvent,
    ThreadBusyError,
)

warnings.simplefilter("ignore")  # plain-http base URL warning: loopback only
URL = os.environ["WARREN_URL"]
KEYS = {name: os.environ[f"WARREN_KEY_{name.upper()}"] for name in ("main", "single", "off", "bashonly", "files", "vol")}


def client(key="main", **kw):
    return Baponi(api_key=KEYS[key], base_url=URL, **kw)


def check_execute():
    c = client()
    r = c.execute("print(sum(range(100)))")
    assert (r.success, r.stdout, r.stderr, r.exit_code, r.error) == (True, "4950\n", "", 0, None), r
    r = c.execute("console.log('node ' + (6 * 7))", language="node")
    assert r.stdout == "node 42\n", r
    r = c.execute("echo out; echo err >&2; exit 3", language="bash")
    assert (r.success, r.stdout, r.stderr, r.exit_code) == (False, "out\n", "err\n", 3), r
    r = c.execute("import time; print('partial', flush=True); time.sleep(30)", timeout=1)
    assert (r.success, r.error, r.stdout) == (False, "timeout", "partial\n"), r
    r = c.execute("import os; print(os.environ.get('FROM_SDK'))", env_vars={"FROM_SDK": "yes"}, metadata={"user": "u1"})
    assert r.stdout == "yes\n", r


def check_stream():
    c = client()
    kinds = []
    with c.execute_stream("echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c", language="bash") as s:
        for ev in s:
            kinds.append(type(ev).__name__)
            if isinstance(ev, OutputEvent):
                kinds[-1] += f":{ev.stream}:{ev.data.strip()}"
        result = s.get_final_result()
        assert s.trace_id and s.trace_id.startswith("trc_"), s.trace_id
    kinds = [k for k in kinds if k != KeepaliveEvent.__name__]
    assert kinds == [
        StatusEvent.__name__,
        "OutputEvent:stdout:a",
        "OutputEvent:stderr:b",
        "OutputEvent:stdout:c",
        ResultEvent.__name__,
    ], kinds
    assert (result.success, result.stdout, result.stderr) == (True, "a\nc\n", "b\n"), result


def check_async():
    async def main():
        async with AsyncBaponi(api_key=KEYS["main"], base_url=URL) as c:
            rs = await asyncio.gather(*(c.execute(f"print({i} * 2)") for i in range(4)))
            assert [r.stdout for r in rs] == ["0\n", "2\n", "4\n", "6\n"], rs

    asyncio.run(main())


def expect(exc, fn):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError(f"expected {exc.__name__}")


def check_errors():
    e = expect(AuthenticationError, lambda: Baponi(api_key="sk-wrn-" + "Z" * 40, base_url=URL).execute("print(1)"))
    assert e.status_code == 401 and e.error_type == "invalid_api_key", repr(e)
    e = expect(ForbiddenError, lambda: client("off").execute("print(1)"))
    assert e.status_code == 403, repr(e)
    # Limits the SDK does not know about are the server's: 400 → APIValidationError.
    e = expect(APIValidationError, lambda: client("bashonly").execute("print(1)", language="python"))
    assert e.status_code == 400 and "language" in e.message, repr(e)
    e = expect(APIValidationError, lambda: client().execute("print(1)", timeout=3000))
    assert "timeout" in e.message, repr(e)
    e = expect(APIValidationError, lambda: client().execute("print(1)", sub_paths=["/data/nomount/x"]))
    assert "sub_paths" in e.message, repr(e)


def hold(key, thread_id=None):
    """Starts a long execution; returns once it runs, with a function that
    cancels it through the SDK's stream (a client that only disconnects
    would leave it running, resumable) and checks the answer."""
    started = threading.Event()
    stop = threading.Event()
    answers = []

    def run():
        with client(key).execute_stream("echo go; sleep 30", language="bash", thread_id=thread_id) as s:
            for ev in s:
                if isinstance(ev, OutputEvent):
                    started.set()
                    stop.wait(30)
                    answers.append(s.cancel())
                    return

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30), "the held execution never started"

    def release():
        stop.set()
        t.join()
        assert [a.status for a in answers] == ["cancelled"], answers

    return release


def check_rate_limit_and_thread_busy():
    release = hold("single")
    try:
        e = expect(RateLimitError, lambda: client("single", max_retries=0).execute("print(1)"))
        assert e.status_code == 429 and e.retry_after == 1.0, repr(e)
    finally:
        release()
    # The cancelled execution gave its slot back.
    assert client("single").execute("print(1)").stdout == "1\n"
    release = hold("main", thread_id="sdk-thread")
    try:
        e = expect(ThreadBusyError, lambda: client().execute("print(1)", thread_id="sdk-thread"))
        assert e.status_code == 409 and e.error_type == "thread_busy", repr(e)
    finally:
        release()


def check_anthropic_tool():
    """The SDK's Anthropic integration, as an agent loop would use it: the
    tool definition goes to the model, the model's tool_use goes to the handler."""
    from baponi.anthropic import create_code_sandbox

    tool, handle = create_code_sandbox(api_key=KEYS["main"], base_url=URL, metadata={"agent": "sdk-test"})
    assert tool["name"] and "code" in tool["input_schema"]["properties"], tool
    text = handle(tool["name"], {"code": "print(6 * 7)", "language": "python"})
    assert "42" in text, text
    text = handle(tool["name"], {"code": "echo oops >&2; exit 2", "language": "bash"})
    assert "oops" in text and "2" in text, text


def check_async_execution():
    """execute_webhook without a URL: 202, then poll, get and replay."""
    c = client()
    h = c.execute_webhook("print(6 * 7)", metadata={"job": "sdk"})
    assert h.trace_id.startswith("trc_"), h.trace_id
    st = h.wait(poll_interval=0.05, timeout=60)
    assert (st.status, st.stdout, st.exit_code, st.error) == ("success", "42\n", 0, None), st
    got = c.get_execution(h.trace_id)
    assert (got.status, got.delivery_mode) == ("success", "async") and got.created_at and got.completed_at, got
    events = list(c.reconnect_stream(h.trace_id))
    assert isinstance(events[0], StatusEvent) and isinstance(events[-1], ResultEvent), events
    assert events[-1].result.stdout == "42\n", events[-1]
    after = list(c.reconnect_stream(h.trace_id, after_seq=events[0].seq))
    assert [e.seq for e in after] == [e.seq for e in events[1:]], (after, events)
    # Another key's view of it, and an id that never existed: 404.
    for other, trace in ((client("bashonly"), h.trace_id), (c, "trc_doesnotexist0000")):
        e = expect(BaponiError, lambda: other.get_execution(trace))
        assert e.status_code == 404, repr(e)


def check_cancel():
    """A running async execution is cancelled where it runs; wait() sees it."""
    c = client()
    # One write of the whole line: print() writes "up" and "\n" apart
    # (unbuffered), and a cancel between the two would cut the line.
    h = c.execute_webhook("import sys, time\nsys.stdout.write('up\\n')\nsys.stdout.flush()\ntime.sleep(300)", timeout=60)
    with c.reconnect_stream(h.trace_id) as s:
        for ev in s:
            if isinstance(ev, OutputEvent):
                break
    assert c.get_execution(h.trace_id).status == "running"
    r = c.cancel_execution(h.trace_id)
    assert (r.trace_id, r.status) == (h.trace_id, "cancelled"), r
    st = h.wait(poll_interval=0.05, timeout=30)
    assert st.status == "cancelled" and st.stdout == "up\n", st
    # Cancelling what has ended answers with how it ended.
    assert c.cancel_execution(h.trace_id).status == "cancelled"


def send(signed, body=None):
    """Uses a signed URL as the SDK hands it over (any HTTP client will do)."""
    import httpx

    return httpx.request(signed.method, signed.url, content=body, headers={h.name: h.value for h in signed.headers})


def check_files():
    """A file reaches a thread's home before a call; the results leave after it."""
    import httpx

    c = client()
    data = b"a,b\n1,2\n"
    u = c.upload_url(source="thread", id="sdk-files", path="in/data.csv", content_length=len(data), content_type="text/csv")
    assert u.method == "PUT" and u.url.startswith(URL) and u.expires_at, u
    r = send(u, data)
    assert r.status_code == 201, (r.status_code, r.text)
    code = "import os\nh = os.path.expanduser('~')\nprint(open(h + '/in/data.csv').read(), end='')\nopen(h + '/out.txt', 'w').write('result')"
    r = c.execute(code, thread_id="sdk-files")
    assert r.stdout == "a,b\n1,2\n", r
    files = {f.path: f.size for f in c.list_files(source="thread", id="sdk-files")}
    assert files.get("in/data.csv") == 8 and files.get("out.txt") == 6, files
    assert [f.path for f in c.list_files(source="thread", id="sdk-files", path="in")] == ["in/data.csv"]
    d = c.download_url(source="thread", id="sdk-files", path="out.txt")
    assert d.method == "GET" and send(d).content == b"result"
    # Single-purpose and tamper-proof: a download URL does not upload, a changed one is refused.
    assert httpx.put(d.url, content=b"x").status_code == 403
    assert httpx.get(d.url[:-3] + "AAA").status_code == 403
    # Exactly the declared length.
    u = c.upload_url(source="thread", id="sdk-files", path="in/b.txt", content_length=3)
    assert send(u, b"too long").status_code == 400
    # Another key's view: no such thread. A path out of the home: refused.
    e = expect(BaponiError, lambda: client("bashonly").list_files(source="thread", id="sdk-files"))
    assert e.status_code == 404, repr(e)
    e = expect(APIValidationError, lambda: c.upload_url(source="thread", id="sdk-files", path="../etc/passwd", content_length=1))
    assert "path" in e.message, repr(e)
    assert send(c.download_url(source="thread", id="sdk-files", path="missing.txt")).status_code == 404


def check_volume_files():
    """A managed volume: uploaded files are under /data/<mount>, results come back."""
    v = client("vol")
    r = send(v.upload_url(source="volume", id="work", path="reports/in.txt", content_length=5), b"hello")
    assert r.status_code == 201, (r.status_code, r.text)
    r = v.execute("print(open('/data/work/reports/in.txt').read()); open('/data/work/reports/out.txt', 'w').write('done')")
    assert r.stdout == "hello\n", r
    files = {f.path: f.size for f in v.list_files(source="volume", id="work", path="reports")}
    assert files == {"reports/in.txt": 5, "reports/out.txt": 4}, files
    assert send(v.download_url(source="volume", id="work", path="reports/out.txt")).content == b"done"
    # A volume the key does not mount is not there for it.
    e = expect(BaponiError, lambda: v.list_files(source="volume", id="other"))
    assert e.status_code == 404, repr(e)


def check_sub_paths():
    # The key's Sandbox mounts a Local directory at /data/files; sub_paths
    # narrows it to files/in for one call, as the SDK sends it.
    r = client("files").execute("import os; print(sorted(os.listdir('/data/files')))", sub_paths=["/data/files/in"])
    assert (r.success, r.stdout) == (True, "['a.txt']\n"), r
    r = client("files").execute("open('/data/files/out.txt', 'w').write('from the sdk')")
    assert r.success, r


for check in (
    check_execute,
    check_stream,
    check_async,
    check_errors,
    check_rate_limit_and_thread_busy,
    check_anthropic_tool,
    check_sub_paths,
    check_async_execution,
    check_cancel,
    check_files,
    check_volume_files,
):
    check()
    print("ok", check.__name__, flush=True)
