# Warren's E2B filesystem calls, run inside the sandbox against its home.
# One JSON answer on stdout after the marker; paths reported as E2B spells
# the home. Reads only its argument; follows no symlink it lists.
import json, os, shutil, stat, sys, time

HOME, E2B_HOME, MARK = "/home/sandbox", "/home/user", "\x1ewarren-e2b-fs "
MAX_ENTRIES = 10000


def reported(p):
    return E2B_HOME + p[len(HOME):] if p == HOME or p.startswith(HOME + "/") else p


def entry(p):
    st = os.lstat(p)
    kind = "FILE_TYPE_SYMLINK" if stat.S_ISLNK(st.st_mode) else "FILE_TYPE_DIRECTORY" if stat.S_ISDIR(st.st_mode) else "FILE_TYPE_FILE"
    e = {
        "name": os.path.basename(p) or p,
        "type": kind,
        "path": reported(p),
        "size": str(st.st_size),
        "mode": stat.S_IMODE(st.st_mode),
        "permissions": stat.filemode(st.st_mode),
        "owner": str(st.st_uid),
        "group": str(st.st_gid),
        "modifiedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime)),
    }
    if kind == "FILE_TYPE_SYMLINK":
        e["symlinkTarget"] = reported(os.readlink(p))
    return e


def listing(root, depth):
    out, todo = [], [(root, 1)]
    while todo:
        d, level = todo.pop(0)
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            out.append(entry(p))
            if len(out) >= MAX_ENTRIES:
                return out
            if level < depth and os.path.isdir(p) and not os.path.islink(p):
                todo.append((p, level + 1))
    return out


def run(a):
    op, p = a["op"], a.get("path", HOME)
    if op == "stat":
        return {"entry": entry(p)}
    if op == "list":
        if not os.path.isdir(p):
            raise NotADirectoryError(p)
        return {"entries": listing(p, max(1, a.get("depth", 1)))}
    if op == "mkdir":
        if os.path.lexists(p):
            return {"exists": True}
        os.makedirs(p)
        return {"entry": entry(p)}
    if op == "move":
        os.makedirs(os.path.dirname(a["to"]) or "/", exist_ok=True)
        os.rename(p, a["to"])
        return {"entry": entry(a["to"])}
    if op == "remove":
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
        return {}
    raise ValueError("unknown operation")


def main(raw):
    try:
        out = {"ok": run(json.loads(raw))}
    except FileNotFoundError as e:
        out = {"err": "not_found", "message": "no such file or directory: " + reported(e.filename or "")}
    except (NotADirectoryError, IsADirectoryError, FileExistsError, OSError, ValueError) as e:
        out = {"err": "invalid_argument", "message": "%s: %s" % (type(e).__name__, reported(getattr(e, "filename", "") or "") or e)}
    sys.stdout.write(MARK + json.dumps(out) + "\n")
