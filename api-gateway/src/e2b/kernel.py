# Warren's code contexts (E2B's code interpreter), run inside the live
# sandbox as its user. `__warren_kernel` is one context: a Python
# interpreter that keeps its variables, serving one cell at a time on a Unix
# socket. `__warren_cell` is one run_code: it hands its cell to the context
# and prints what the cell prints; its report (results, error) follows MARK
# on stdout, which the gateway strips. Frames on the socket: a kind byte,
# a 4-byte big-endian length, the bytes.
import json, os, socket, struct, sys

SOCKETS = "/tmp/.warren-contexts"


def _warren_send(conn, kind, data):
    conn.sendall(kind + struct.pack(">I", len(data)) + data)


def _warren_recv(conn):
    head = b""
    while len(head) < 5:
        more = conn.recv(5 - len(head))
        if not more:
            return None, None
        head += more
    kind, n = head[:1], struct.unpack(">I", head[1:])[0]
    body = bytearray()
    while len(body) < n:
        more = conn.recv(min(1 << 20, n - len(body)))
        if not more:
            return None, None
        body += more
    return kind, bytes(body)


def __warren_kernel(ident, cwd):
    import ast, base64, io, linecache, signal, traceback

    os.makedirs(SOCKETS, mode=0o700, exist_ok=True)
    path = os.path.join(SOCKETS, ident + ".sock")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    os.environ.setdefault("MPLBACKEND", "Agg")
    if cwd:
        os.chdir(cwd)
    # SIGINT interrupts the running cell (a timeout), never the context.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    count = [0]

    class Stream(io.TextIOBase):
        def __init__(self, conn, kind):
            self.conn, self.kind = conn, kind

        def writable(self):
            return True

        def write(self, s):
            if s:
                try:
                    _warren_send(self.conn, self.kind, s.encode("utf-8", "replace"))
                except OSError:
                    pass
            return len(s)

    def formats(obj, main):
        out = {"text": repr(obj), "is_main_result": main}
        for attr, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"), ("_repr_png_", "png"),
                          ("_repr_jpeg_", "jpeg"), ("_repr_latex_", "latex"), ("_repr_json_", "json"), ("_repr_javascript_", "javascript")):
            f = getattr(obj, attr, None)
            if not callable(f):
                continue
            try:
                v = f()
            except Exception:
                continue
            if isinstance(v, tuple):
                v = v[0]
            if v is None:
                continue
            if isinstance(v, bytes):
                v = base64.b64encode(v).decode()
            out[key] = v
        return out

    def figures(results):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            try:
                fig.savefig(buf, format="png")
            except Exception:
                continue
            results.append({"text": repr(fig), "png": base64.b64encode(buf.getvalue()).decode(), "is_main_result": False})
        plt.close("all")

    def run(src, results):
        count[0] += 1
        name = "<cell-%d>" % count[0]
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        g["display"] = lambda *objs, **kw: results.extend(formats(o, False) for o in objs)
        tree = ast.parse(src, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), g)
        value = eval(compile(last, name, "eval"), g) if last is not None else None
        figures(results)
        if value is not None:
            results.append(formats(value, True))

    while True:
        conn, _ = server.accept()
        with conn:
            kind, body = _warren_recv(conn)
            if kind != b"c":
                continue
            ask = json.loads(body)
            saved_env = dict(os.environ)
            os.environ.update(ask.get("env") or {})
            out, err = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = Stream(conn, b"o"), Stream(conn, b"e")
            report = {"results": []}
            try:
                run(ask["code"], report["results"])
            except BaseException as e:
                tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
                report["error"] = {"name": type(e).__name__, "value": str(e), "traceback": "".join(traceback.format_exception(type(e), e, tb))}
            finally:
                sys.stdout.flush()
                sys.stdout, sys.stderr = out, err
                os.environ.clear()
                os.environ.update(saved_env)
            report["execution_count"] = count[0]
            try:
                _warren_send(conn, b"r", json.dumps(report, default=repr).encode())
            except OSError:
                pass


def __warren_cell(ident, code, env, mark):
    import time

    path = os.path.join(SOCKETS, ident + ".sock")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The context may still be starting.
    for _ in range(200):
        try:
            conn.connect(path)
            break
        except OSError:
            time.sleep(0.05)
    else:
        sys.stdout.write(mark + json.dumps({"error": {"name": "ContextNotReady", "value": "the context's interpreter is not running (restart the context)", "traceback": ""}}) + "\n")
        return
    _warren_send(conn, b"c", json.dumps({"code": code, "env": env}).encode())
    while True:
        kind, body = _warren_recv(conn)
        if kind is None:
            report = {"error": {"name": "ContextEnded", "value": "the context's interpreter ended during the cell (its variables are gone; restart the context)", "traceback": ""}}
            break
        if kind == b"o":
            sys.stdout.write(body.decode("utf-8", "replace"))
            sys.stdout.flush()
        elif kind == b"e":
            sys.stderr.write(body.decode("utf-8", "replace"))
            sys.stderr.flush()
        elif kind == b"r":
            report = json.loads(body)
            break
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout.write(mark + json.dumps(report) + "\n")
    sys.stdout.flush()
