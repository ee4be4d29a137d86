"""Drives Warren with the unmodified E2B Python SDKs (`e2b`,
`e2b-code-interpreter` from PyPI).

Run by tests/tests/e2b_sdk.rs inside a virtualenv it makes. The SDKs are
configured only by their own environment variables: E2B_API_URL and
E2B_SANDBOX_URL (the gateway), E2B_API_KEY (an ApiKey's e2b_ alias).
WARREN_E2B_OTHER_KEY is another key's alias. Any failed check raises, and
the test fails with this script's output; each check prints "ok NAME".
"""

import asyncio
import io
import os
import time

import httpx

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    PtySize,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    TimeoutException,
)
from e2b_code_interpreter import Sandbox as CodeSandbox

OTHER = os.environ["WARREN_E2B_OTHER_KEY"]


def raises(exc, fn, *args, contains=None, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        if contains is not None:
            assert contains in str(e), f"{exc.__name__} without {contains!r}: {e}"
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def check_create_run(sbx):
    r = sbx.commands.run("echo $GREETING from $(basename $PWD); echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("hi from sandbox\n", "err\n", 0), r
    seen = []
    r = sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append, envs={"X": "y"})
    assert "".join(seen) == "1\n2\n3\n" and r.stdout == "1\n2\n3\n", (seen, r)
    assert sbx.commands.run("echo $X", envs={"X": "per-call"}).stdout == "per-call\n"
    e = raises(CommandExitException, sbx.commands.run, "echo out; exit 3")
    assert (e.exit_code, e.stdout) == (3, "out\n"), e
    # background=True: the handle streams the command to its end.
    h = sbx.commands.run("echo bg; echo bg-err >&2", background=True)
    done = h.wait()
    assert (done.stdout, done.stderr, done.exit_code) == ("bg\n", "bg-err\n", 0), done
    r = sbx.commands.run("pwd", cwd="/home/user")
    assert r.stdout == "/home/sandbox\n", r


def check_files(sbx):
    info = sbx.files.write("/home/user/a.txt", "hello")
    assert info.path == "/home/user/a.txt" and info.name == "a.txt", info
    assert sbx.files.read("/home/user/a.txt") == "hello"
    assert sbx.files.read("a.txt", format="bytes") == bytearray(b"hello")
    sbx.files.write("data/blob.bin", bytes(range(256)) * 64)
    assert bytes(sbx.files.read("/home/user/data/blob.bin", format="bytes")) == bytes(range(256)) * 64
    # A binary file object streams through the gateway (33 MiB: more than it
    # ever holds of one upload); a body of unknown length larger than that is
    # refused with the reason.
    big = 33 << 20
    sbx.files.write("big.bin", io.BytesIO(b"w" * big))
    assert sbx.commands.run("wc -c < big.bin && rm big.bin").stdout.strip() == str(big)
    chunked = httpx.post(os.environ["E2B_SANDBOX_URL"] + "/files", params={"path": "chunks.bin"},
                         headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token,
                                  "Content-Type": "application/octet-stream"},
                         # One byte past what the gateway reads: nothing is
                         # left unsent when it refuses (no reset races the answer).
                         content=(c for c in [b"c" * (1 << 20)] * 32 + [b"c" * ((64 << 10) + 1)]))
    assert chunked.status_code == 413 and "at most" in chunked.text, (chunked.status_code, chunked.text)
    # What a command writes, the files API reads, and the other way round.
    sbx.commands.run("mkdir -p out && printf made > out/by-command.txt")
    assert sbx.files.read("out/by-command.txt") == "made"
    assert sbx.commands.run("cat a.txt").stdout == "hello"
    names = sorted(e.name for e in sbx.files.list("/home/user"))
    assert {"a.txt", "data", "out"} <= set(names), names
    deep = sorted(e.path for e in sbx.files.list("/home/user", depth=2))
    assert "/home/user/data/blob.bin" in deep, deep
    assert sbx.files.exists("a.txt") and not sbx.files.exists("nope.txt")
    i = sbx.files.get_info("/home/user/data")
    assert i.type.value == "dir" and i.name == "data", i
    assert sbx.files.get_info("a.txt").size == 5
    assert sbx.files.make_dir("/home/user/new/dir") is True
    assert sbx.files.make_dir("/home/user/new/dir") is False
    moved = sbx.files.rename("a.txt", "/home/user/new/b.txt")
    assert moved.path == "/home/user/new/b.txt", moved
    assert not sbx.files.exists("a.txt") and sbx.files.read("new/b.txt") == "hello"
    sbx.files.remove("/home/user/new")
    assert not sbx.files.exists("new")
    raises(NotFoundException, sbx.files.read, "/home/user/missing.txt")
    # Files are read and written inside the sandbox, as its user: a link
    # leads where its own commands could go, never to the node's files.
    sbx.commands.run("ln -s /etc/shadow shadow-link && ln -s / root-link")
    raises(NotFoundException, sbx.files.read, "shadow-link")
    assert sbx.files.read("root-link/etc/hostname") == sbx.commands.run("cat /etc/hostname").stdout
    sbx.files.write("root-link/tmp/planted-by-e2b", "x")
    assert sbx.commands.run("cat /tmp/planted-by-e2b").stdout == "x"
    assert not os.path.exists("/tmp/planted-by-e2b")
    sbx.commands.run("rm -rf shadow-link root-link")
    # The whole file system is the sandbox's: /tmp lasts between calls,
    # what its user may not write is refused.
    sbx.files.write("/tmp/t.txt", "tmp")
    assert sbx.commands.run("cat /tmp/t.txt").stdout == "tmp"
    raises(SandboxException, sbx.files.write, "/etc/x", "no")


def check_connect_from_a_second_client(sbx):
    other = Sandbox.connect(sbx.sandbox_id)
    assert other.commands.run("cat data/blob.bin | wc -c").stdout.strip() == str(256 * 64)
    # The sandbox's variables (sealed in the records) reach this client's commands too.
    assert other.commands.run("echo $GREETING").stdout == "hi\n"
    assert other.is_running()


def check_info_list_timeout(sbx):
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id and info.metadata == {"case": "conformance", "owner": "a b/c&d=e"}, info
    odd = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"owner": "a b/c&d=e"})).next_items()]
    assert odd == [sbx.sandbox_id], odd
    assert info.state.value == "running", info
    found = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"case": "conformance"})).next_items()]
    assert sbx.sandbox_id in found, found
    none = Sandbox.list(query=SandboxQuery(metadata={"case": "no-such"})).next_items()
    assert none == [], none
    before = sbx.get_info().end_at
    sbx.set_timeout(3600)
    assert sbx.get_info().end_at > before
    # Paging: one sandbox a page.
    extra = Sandbox.create(timeout=60, metadata={"case": "conformance"})
    pages = Sandbox.list(query=SandboxQuery(metadata={"case": "conformance"}), limit=1)
    ids = []
    while pages.has_next:
        ids += [s.sandbox_id for s in pages.next_items()]
    assert sorted(ids) == sorted([sbx.sandbox_id, extra.sandbox_id]), ids
    extra.kill()


def check_pause_resume(sbx):
    sbx.pause()
    assert sbx.get_info().state.value == "paused"
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.get_info().state.value == "running"
    assert resumed.commands.run("cat out/by-command.txt").stdout == "made"


def check_timeouts_and_limits(sbx):
    # A stream's timeout ends the stream, as in E2B: the command goes on
    # until it is killed.
    raises(TimeoutException, sbx.commands.run, "sleep 20", timeout=1)
    running = [p for p in sbx.commands.list() if p.args[-1:] == ["sleep 20"]]
    assert len(running) == 1, sbx.commands.list()
    assert sbx.commands.kill(running[0].pid) is True
    assert sbx.commands.kill(running[0].pid) is False
    # What Warren cannot do answers a clear error naming the limit.
    raises(SandboxException, sbx.commands.run, "id", user="root", contains="unprivileged user")
    raises(SandboxException, sbx.files.read, "a.txt", user="root", contains="unprivileged user")
    assert sbx.commands.run("id -un", user="user").exit_code == 0


def check_ports(sbx):
    # The server's port through the gateway: by get_host's name, by E2B's
    # headers, and by path with a token of that port. Private: the sandbox's
    # traffic token or the port's token, nothing else.
    gateway = os.environ["E2B_SANDBOX_URL"]
    host = sbx.get_host(8000)
    assert host == f"8000-{sbx.sandbox_id}.sandbox.test", host
    traffic = {"E2B-Traffic-Access-Token": sbx.traffic_access_token}
    assert sbx.traffic_access_token
    r = httpx.get(gateway + "/t.txt", headers={"Host": host, **traffic})
    assert (r.status_code, r.text) == (200, "tmp"), (r.status_code, r.text)
    r = httpx.get(gateway + "/t.txt", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000", **traffic})
    assert (r.status_code, r.text) == (200, "tmp"), (r.status_code, r.text)
    api = {"X-API-KEY": os.environ["E2B_API_KEY"]}
    url = httpx.get(os.environ["E2B_API_URL"] + f"/sandboxes/{sbx.sandbox_id}/ports/8000", headers=api).json()
    r = httpx.get(gateway + url["path"] + "t.txt", params={"warren_token": url["token"]})
    assert (r.status_code, r.text) == (200, "tmp"), (r.status_code, r.text)
    # Refused: no token, the envd token, another port's token, another key's view.
    other_port = httpx.get(os.environ["E2B_API_URL"] + f"/sandboxes/{sbx.sandbox_id}/ports/8001", headers=api).json()["token"]
    for headers in ({"Host": host}, {"Host": host, "X-Access-Token": sbx._envd_access_token}, {"Host": host, "X-Warren-Port-Token": other_port}):
        r = httpx.get(gateway + "/t.txt", headers=headers)
        assert r.status_code == 502 and "tmp" not in r.text, (headers, r.status_code, r.text)
    assert httpx.get(os.environ["E2B_API_URL"] + f"/sandboxes/{sbx.sandbox_id}/ports/8000", headers={"X-API-KEY": OTHER}).status_code == 404
    # Nothing listening: a clear 502.
    r = httpx.get(gateway + "/", headers={"Host": f"8001-{sbx.sandbox_id}.sandbox.test", **traffic})
    assert r.status_code == 502 and "nothing listens" in r.text, (r.status_code, r.text)


def check_live(sbx):
    # Two commands at once, each waiting for the other.
    a = sbx.commands.run("touch /tmp/a; while [ ! -e /tmp/b ]; do sleep 0.05; done; echo a", background=True)
    b = sbx.commands.run("touch /tmp/b; while [ ! -e /tmp/a ]; do sleep 0.05; done; echo b", background=True)
    assert (a.wait().stdout, b.wait().stdout) == ("a\n", "b\n")
    # A background server outlives its call and answers the next ones.
    sbx.files.write("/tmp/site/t.txt", "tmp")
    server = sbx.commands.run("python3 -m http.server 8000 --bind 127.0.0.1", background=True, cwd="/tmp/site")
    got = sbx.commands.run("for i in $(seq 300); do python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/t.txt').read().decode())\" 2>/dev/null && break; sleep 0.1; done")
    assert got.stdout == "tmp\n", got
    assert server.pid in [p.pid for p in sbx.commands.list()]
    check_ports(sbx)
    # Another client re-attaches to a running command and sees its output.
    ticker = sbx.commands.run("echo first; read line; echo got $line", background=True, stdin=True)
    other = Sandbox.connect(sbx.sandbox_id)
    seen = []
    again = other.commands.connect(ticker.pid)
    other.commands.send_stdin(ticker.pid, "hello\n")
    done = again.wait(on_stdout=seen.append)
    assert done.stdout == "first\ngot hello\n" and "".join(seen) == done.stdout, (done, seen)
    # stdin, then its end.
    cat = sbx.commands.run("tr a-z A-Z", background=True, stdin=True)
    sbx.commands.send_stdin(cat.pid, "abc\n")
    sbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "ABC\n"
    # Kill by pid: the server, and what it started.
    assert sbx.commands.kill(server.pid) is True
    raises(CommandExitException, server.wait)
    # watch_dir: what happens in a directory while the sandbox lives.
    sbx.files.make_dir("/tmp/w")
    watcher = sbx.files.watch_dir("/tmp/w")
    sbx.files.write("/tmp/w/a.txt", "1")
    sbx.commands.run("mv /tmp/w/a.txt /tmp/w/b.txt && rm /tmp/w/b.txt")
    seen = set()
    for _ in range(600):
        seen |= {(e.name, e.type.value) for e in watcher.get_new_events()}
        if ("b.txt", "remove") in seen:
            break
        time.sleep(0.05)
    assert {("a.txt", "create"), ("a.txt", "write"), ("a.txt", "rename"), ("b.txt", "remove")} <= seen, seen
    watcher.stop()
    raises(SandboxException, watcher.get_new_events)
    raises(NotFoundException, sbx.files.watch_dir, "/tmp/no-such-dir")
    # A terminal: an interactive shell, typed into; its size as created.
    out = []
    term = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(term.pid, b"stty size; echo $((6*7)); exit 3\n")
    raises(CommandExitException, term.wait, on_pty=out.append)
    text = b"".join(out).decode()
    assert "24 80" in text and "42" in text, text
    # Resized while the shell waits at its prompt: it answers with the new
    # size. (Not sooner: readline sets a terminal up by reading its size and
    # writing it back, so a resize that lands between the two is undone by
    # the shell itself, on any terminal; its prompt comes after that.)
    out = []
    term = sbx.pty.create(PtySize(rows=24, cols=80))
    events = iter(term)
    for _, _, chunk in events:
        out.append(chunk)
        if prompted(b"".join(out)):
            break
    sbx.pty.resize(term.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(term.pid, b"stty size; exit 0\n")
    term.wait(on_pty=out.append)
    assert "40 100" in b"".join(out).decode(), out


def prompted(shown):
    """Whether an interactive bash has shown its prompt (`…$ ` or `…# `)."""
    return shown.rstrip(b" ").endswith((b"$", b"#"))


def check_isolation(sbx):
    # Another key cannot see, use or kill this sandbox.
    raises(NotFoundException, Sandbox.get_info, sbx.sandbox_id, api_key=OTHER)
    assert Sandbox.kill(sbx.sandbox_id, api_key=OTHER) is False
    raises(NotFoundException, Sandbox.connect, sbx.sandbox_id, api_key=OTHER)
    theirs = Sandbox.create(api_key=OTHER)
    mine = [s.sandbox_id for s in Sandbox.list().next_items()]
    assert theirs.sandbox_id not in mine, mine
    # This sandbox's access token does not open theirs (envd's health, raw).
    url = os.environ["E2B_SANDBOX_URL"] + "/health"
    mine_token = {"X-Access-Token": sbx._envd_access_token}
    assert httpx.get(url, headers={"E2b-Sandbox-Id": theirs.sandbox_id, **mine_token}).status_code == 502
    assert httpx.get(url, headers={"E2b-Sandbox-Id": sbx.sandbox_id, **mine_token}).status_code == 204
    assert httpx.get(url, headers={"E2b-Sandbox-Id": sbx.sandbox_id}).status_code == 502
    assert theirs.is_running()
    theirs.kill()


def check_errors():
    raises(AuthenticationException, Sandbox.create, api_key="e2b_" + "0" * 40)
    raises(SandboxException, Sandbox.create, template="no-such-template", contains="template")
    raises(SandboxException, Sandbox.create, network={"deny_out": ["0.0.0.0/0"]}, contains="network")


def check_kill(sbx):
    assert sbx.kill() is True
    raises(NotFoundException, Sandbox.connect, sbx.sandbox_id)
    assert Sandbox.kill(sbx.sandbox_id) is False
    assert not sbx.is_running()


def check_async():
    async def run():
        sbx = await AsyncSandbox.create(envs={"WHO": "async"})
        r = await sbx.commands.run("echo $WHO")
        assert r.stdout == "async\n", r
        await sbx.files.write("a.txt", "from async")
        assert await sbx.files.read("/home/user/a.txt") == "from async"
        # The async SDK watches with envd's stream.
        events = []
        handle = await sbx.files.watch_dir("/tmp", on_event=events.append)
        await sbx.files.write("/tmp/x.txt", "1")
        for _ in range(600):
            if any(e.name == "x.txt" for e in events):
                break
            await asyncio.sleep(0.05)
        await handle.stop()
        assert any(e.name == "x.txt" and e.type.value == "create" for e in events), events
        assert await sbx.kill() is True

    asyncio.run(run())


def check_code_interpreter():
    ci = CodeSandbox.create()
    ex = ci.run_code("import sys\nx = 20 + 22\nprint('hi')\nprint('oops', file=sys.stderr)\nx")
    assert ex.error is None, ex.error
    assert (ex.logs.stdout, ex.logs.stderr, ex.text) == (["hi\n"], ["oops\n"], "42"), ex
    ex = ci.run_code("def f():\n    return 1 / 0\nf()")
    assert ex.error.name == "ZeroDivisionError" and "f()" in ex.error.traceback, ex.error
    # Variables live on between cells, as in a notebook.
    assert ci.run_code("x + 1").text == "43"
    ci.files.write("state.txt", "kept")
    assert ci.run_code("open('state.txt').read()").text == "'kept'"
    # Rich results: what display() shows and the last expression's formats.
    ex = ci.run_code("class H:\n    def _repr_html_(self): return '<b>hi</b>'\ndisplay(H())\n{'a': 1}")
    assert [r.html for r in ex.results][:1] == ["<b>hi</b>"] and ex.results[-1].is_main_result and ex.text == "{'a': 1}", ex.results
    # Contexts: each its own variables; restart forgets them, remove ends it.
    ctx = ci.create_code_context()
    assert ci.run_code("x = 'other'", context=ctx).error is None
    assert ci.run_code("x", context=ctx).text == "'other'" and ci.run_code("x").text == "42"
    assert ctx.id in [c.id for c in ci.list_code_contexts()]
    ci.restart_code_context(ctx)
    assert ci.run_code("x", context=ctx).error.name == "NameError"
    ci.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in ci.list_code_contexts()]
    # A timeout interrupts the cell (KeyboardInterrupt); the context stays.
    raises(TimeoutException, ci.run_code, "import time\nfor i in range(300): time.sleep(0.1)\ny = 1", timeout=1)
    assert ci.run_code("x").text == "42"
    assert ci.run_code("y").error.name == "NameError", "the interrupted cell did not run on"
    ci.kill()


def main():
    sbx = Sandbox.create(timeout=600, metadata={"case": "conformance", "owner": "a b/c&d=e"}, envs={"GREETING": "hi"})
    for check in (check_create_run, check_files, check_connect_from_a_second_client, check_info_list_timeout,
                  check_pause_resume, check_timeouts_and_limits, check_live, check_isolation):
        check(sbx)
        print("ok", check.__name__, flush=True)
    check_errors()
    print("ok check_errors", flush=True)
    check_kill(sbx)
    print("ok check_kill", flush=True)
    check_async()
    print("ok check_async", flush=True)
    check_code_interpreter()
    print("ok check_code_interpreter", flush=True)


if __name__ == "__main__":
    main()
