# Warren's files.watch_dir, inside the live sandbox as its user: inotify
# through ctypes (no package needed). `__warren_watch_stream` prints one
# JSON event a line until it is killed (envd's WatchDir stream).
# `__warren_watch_serve` keeps the events for `__warren_watch_take`, which
# prints those gathered since the last take after MARK (CreateWatcher and
# GetWatcherEvents). A watcher keeps at most MAX_EVENTS between takes.
import ctypes, ctypes.util, json, os, select, socket, struct, sys

SOCKETS = "/tmp/.warren-watchers"
MAX_EVENTS = 10000
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_ISDIR, IN_NONBLOCK, IN_CLOEXEC = 0x40000000, 0x800, 0x80000
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
KINDS = [(IN_CREATE, "EVENT_TYPE_CREATE"), (IN_MODIFY, "EVENT_TYPE_WRITE"), (IN_DELETE, "EVENT_TYPE_REMOVE"),
         (IN_MOVED_FROM, "EVENT_TYPE_RENAME"), (IN_MOVED_TO, "EVENT_TYPE_CREATE"), (IN_ATTRIB, "EVENT_TYPE_CHMOD")]


class _Watcher:
    def __init__(self, root, recursive):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.root, self.recursive, self.dirs = root.rstrip("/") or "/", recursive, {}
        if not os.path.isdir(self.root):
            raise NotADirectoryError(self.root)
        self.add(self.root)
        if recursive:
            for d, subdirs, _ in os.walk(self.root):
                for s in subdirs:
                    self.add(os.path.join(d, s))

    def add(self, path):
        wd = self.libc.inotify_add_watch(self.fd, path.encode(), MASK)
        if wd >= 0:
            self.dirs[wd] = path

    def events(self):
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        out, i = [], 0
        while i + 16 <= len(data):
            wd, mask, _cookie, n = struct.unpack_from("iIII", data, i)
            name = data[i + 16:i + 16 + n].split(b"\0", 1)[0].decode("utf-8", "replace")
            i += 16 + n
            base = self.dirs.get(wd)
            if base is None or not name:
                continue
            full = os.path.join(base, name)
            if self.recursive and mask & IN_CREATE and mask & IN_ISDIR:
                self.add(full)
            rel = os.path.relpath(full, self.root)
            for bit, kind in KINDS:
                if mask & bit:
                    out.append({"name": rel, "type": kind})
                    break
        return out


def __warren_watch_stream(root, recursive):
    w = _Watcher(root, recursive)
    sys.stdout.write(json.dumps({"start": True}) + "\n")
    sys.stdout.flush()
    while True:
        select.select([w.fd], [], [])
        for e in w.events():
            sys.stdout.write(json.dumps(e) + "\n")
        sys.stdout.flush()


def __warren_watch_serve(ident, root, recursive):
    w = _Watcher(root, recursive)
    os.makedirs(SOCKETS, mode=0o700, exist_ok=True)
    path = os.path.join(SOCKETS, ident + ".sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    kept = []
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([w.fd, server], [], [])
        if w.fd in ready:
            kept.extend(w.events())
            del kept[:-MAX_EVENTS]
        if server in ready:
            conn, _ = server.accept()
            with conn:
                conn.sendall(json.dumps(kept).encode())
            kept = []


def __warren_watch_take(ident, mark):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.path.join(SOCKETS, ident + ".sock"))
    except OSError:
        sys.stdout.write(mark + json.dumps({"err": "not_found"}) + "\n")
        return
    data = b""
    while True:
        more = conn.recv(1 << 20)
        if not more:
            break
        data += more
    sys.stdout.write(mark + json.dumps({"events": json.loads(data or b"[]")}) + "\n")
