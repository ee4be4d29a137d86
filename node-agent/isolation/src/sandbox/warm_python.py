# Warren's warm start for Python (see warm.rs). The pool starts the
# interpreter as `python3 /run/warren/main.py` before the program exists;
# `site` imports this module from the user site under PYTHONUSERBASE. It
# adds an audit hook that holds the interpreter at `cpython.run_file` -- the
# moment, after every startup step, when the main script is about to be
# opened -- until init delivers the call. The hook then makes the process
# what a cold start would have made it (stdio, cwd, environment, the user
# site of the home now mounted), forgets itself, and returns: Python opens
# the real /run/warren/main.py and runs it as it always does.
#
# Only modules already loaded at startup are used (os, sys, site), so
# sys.modules is the same as in a cold start -- apart from the Sandbox's
# warm imports (`spec.warm.python.imports`), loaded before "ready".


def _arm():
    import os
    import site
    import sys

    ctrl, out, err = 500, 501, 502
    warm_base = os.environ.get("PYTHONUSERBASE", "")
    armed = [True]
    loaded = []

    def warm_imports():
        # The Sandbox's modules, from the image; what fails is reported
        # (once, on the Sandbox's status), never to a call.
        try:
            with open(os.path.join(warm_base, "modules"), "rb") as f:
                names = f.read().decode().split()
        except OSError:
            names = []
        failed = []
        for name in names:
            try:
                __import__(name)
                loaded.append(name.partition(".")[0])
            except BaseException as e:
                lines = ("%s: %s" % (type(e).__name__, e)).splitlines() or [type(e).__name__]
                failed.append("%s\x01%s" % (name, lines[0].replace("\0", " ")))
        if loaded:
            # What the imports made lives as long as this single-use
            # process: the collector need not walk it again, at every
            # collection nor at exit (boto3: 49 -> 9 ms of finalization).
            import gc
            gc.freeze()
        return names, failed

    def shadowed(added):
        # A module of the call's home (a thread's user site) would have been
        # imported cold instead of the image's one loaded here.
        finder = sys.modules["_frozen_importlib_external"].PathFinder
        return bool(added) and any(finder.find_spec(top, added) is not None for top in sorted(set(loaded)))

    def read_all(fd):
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                return b"".join(chunks)
            chunks.append(b)

    def user_site(at):
        # What site.main() does for the user site, at the position the warm
        # user site held (after the stdlib, before the system site dirs).
        site.USER_BASE = None
        site.USER_SITE = None
        path = site.getusersitepackages()
        if at is None or not site.ENABLE_USER_SITE or not os.path.isdir(path):
            return []
        n = len(sys.path)
        site.addsitedir(path)
        added = sys.path[n:]
        del sys.path[n:]
        sys.path[at:at] = added
        return added

    def go():
        names, failed = warm_imports()
        os.write(ctrl, ("R" + "".join("\0" + f for f in failed) + "\n").encode())
        msg = read_all(ctrl)
        if not msg:
            os._exit(0)
        parts = msg.split(b"\0")
        os.chdir(parts[0])
        os.environb.clear()
        for entry in parts[1:]:
            name, _, value = entry.partition(b"=")
            os.environb[name] = value
        at = None
        for i, p in enumerate(list(sys.path)):
            if warm_base and p.startswith(warm_base):
                at = i if at is None else at
                sys.path.remove(p)
        for key in list(sys.path_importer_cache):
            if warm_base and key.startswith(warm_base):
                del sys.path_importer_cache[key]
        for finder in sys.path_importer_cache.values():
            if hasattr(finder, "invalidate_caches"):
                finder.invalidate_caches()
        added = user_site(at)
        if names:
            if shadowed(added):
                os.write(ctrl, b"C")
                os._exit(0)
            os.write(ctrl, b"G")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (ctrl, out, err):
            os.close(fd)
        finder = sys.modules["_frozen_importlib_external"].PathFinder
        if added and finder.find_spec("usercustomize", added) is not None:
            # Startup looked for it everywhere but the call's user site.
            site.execusercustomize()
        sys.modules.pop(__name__, None)

    def hook(event, args):
        if armed[0] and event == "cpython.run_file":
            armed[0] = False
            try:
                go()
            except BaseException as e:
                text = ("warren: the warm interpreter failed: %r\n" % (e,)).encode()
                try:
                    os.write(err, text)
                except OSError:
                    os.write(2, text)
                os._exit(70)

    sys.addaudithook(hook)


_arm()
del _arm
