"""Drives Warren's /mcp endpoint with the official MCP Python client (PyPI
`mcp`), as Claude Desktop, Claude Code or Cursor would: a URL and a Bearer
key. Run by tests/tests/mcp.rs with WARREN_URL and WARREN_KEY; any failed
check raises.
"""

import asyncio
import os

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

URL = os.environ["WARREN_URL"] + "/mcp"
KEY = os.environ["WARREN_KEY"]


async def session_checks():
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        async with streamable_http_client(URL, http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                assert init.server_info.name == "warren", init
                tools = {t.name: t for t in (await s.list_tools()).tools}
                assert {"sandbox_execute", "files_list", "files_download", "files_upload"} <= set(tools), tools
                ex = tools["sandbox_execute"]
                assert "print" in ex.description.lower() and "thread_id" in ex.input_schema["properties"], ex
                assert ex.input_schema["required"] == ["code"], ex.input_schema
                print("ok initialize_and_list_tools", flush=True)

                for language, code, want in (
                    ("python", "print(6 * 7)", "42\n"),
                    ("node", "console.log([1, 2, 3].map(x => x * 2).join(','))", "2,4,6\n"),
                    ("bash", "echo $((40 + 2))", "42\n"),
                ):
                    r = await s.call_tool("sandbox_execute", {"code": code, "language": language})
                    assert not r.is_error, (language, r)
                    assert r.structured_content["stdout"] == want and r.structured_content["exit_code"] == 0, (language, r)
                    assert "exit_code: 0" in r.content[0].text and want in r.content[0].text, r
                print("ok sandbox_execute_python_node_bash", flush=True)

                r = await s.call_tool("sandbox_execute", {"code": "import sys; print('bad', file=sys.stderr); sys.exit(3)"})
                assert r.is_error and r.structured_content["exit_code"] == 3 and "bad" in r.content[0].text, r
                r = await s.call_tool("sandbox_execute", {"code": "print(1)", "language": "ruby"})
                assert r.is_error and "language" in r.content[0].text, r
                print("ok failures_are_tool_errors", flush=True)

                # A thread keeps its home; files go in and out of it.
                r = await s.call_tool("files_upload", {"source": "thread", "id": "mcp-t", "path": "notes/in.txt", "content": "from mcp"})
                assert not r.is_error, r
                r = await s.call_tool("sandbox_execute", {"code": "import os\nh = os.path.expanduser('~')\nprint(open(h + '/notes/in.txt').read())\nopen(h + '/notes/out.txt', 'w').write('answer')", "thread_id": "mcp-t", "timeout": 30})
                assert r.structured_content["stdout"] == "from mcp\n", r
                r = await s.call_tool("files_list", {"source": "thread", "id": "mcp-t"})
                assert "notes/in.txt" in r.content[0].text and "notes/out.txt" in r.content[0].text, r
                r = await s.call_tool("files_download", {"source": "thread", "id": "mcp-t", "path": "notes/out.txt"})
                assert r.content[0].text == "answer", r
                r = await s.call_tool("files_download", {"source": "thread", "id": "mcp-t", "path": "../../etc/passwd"})
                assert r.is_error and "path" in r.content[0].text, r
                print("ok files_round_trip", flush=True)


async def bad_key():
    # One pooled client for both: a refusal sent before the body was read
    # says `connection: close`, so the client opens a new connection for the
    # next request instead of racing the gateway's close.
    async with httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        for headers in ({}, {"Authorization": "Bearer sk-wrn-" + "Z" * 40}):
            r = await http.post(URL, json=body, headers={"Accept": "application/json, text/event-stream", **headers})
            assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer", (r.status_code, r.text)
            assert r.headers.get("connection") == "close", r.headers
    # The client itself fails to initialize with a wrong key.
    try:
        async with create_mcp_http_client(headers={"Authorization": "Bearer sk-wrn-" + "Y" * 40}) as http:
            async with streamable_http_client(URL, http_client=http) as (read, write):
                async with ClientSession(read, write) as s:
                    await asyncio.wait_for(s.initialize(), 30)
    except BaseException as e:  # anyio wraps it in an exception group
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        print("ok bad_key", flush=True)
        return
    raise AssertionError("initialize succeeded with a wrong key")


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def traced_call():
    """A caller's W3C trace context on the MCP request reaches the program."""
    headers = {"Authorization": f"Bearer {KEY}", "traceparent": TRACEPARENT, "tracestate": "mcp=1"}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(URL, http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                r = await s.call_tool("sandbox_execute", {"code": "import os; print(os.environ['TRACEPARENT'], os.environ['TRACESTATE'])"})
                assert r.structured_content["stdout"] == f"{TRACEPARENT} mcp=1\n", r
    print("ok traced_call", flush=True)


asyncio.run(session_checks())
asyncio.run(bad_key())
asyncio.run(traced_call())
