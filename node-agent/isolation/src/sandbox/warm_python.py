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
# warm imports (`spec.warm.python.imports`), loaded before "ready", and
# ctypes, which is loaded while warm and then forgotten (a later `import
# ctypes` loads it afresh).


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

    def environ_setter():
        # The kernel shows the environment a process was exec'd with in
        # /proc/self/environ; a cold start was exec'd with the call's. At Go
        # the hook points the kernel at the call's environment instead, as
        # checkpoint/restore tools do (prctl PR_SET_MM_MAP: a process may
        # do it to itself, unprivileged; exe_fd -1 leaves /proc/self/exe).
        modules, finders = set(sys.modules), set(sys.path_importer_cache)
        import ctypes
        for name in set(sys.modules) - modules:
            del sys.modules[name]
        for path in set(sys.path_importer_cache) - finders:
            del sys.path_importer_cache[path]
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sbrk.restype = ctypes.c_void_p
        libc.malloc.restype = ctypes.c_void_p
        names = "start_code end_code start_data end_data start_brk brk start_stack arg_start arg_end env_start env_end auxv"
        fields = [(n, ctypes.c_uint64) for n in names.split()] + [("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]
        mm_map = type("mm_map", (ctypes.Structure,), {"_fields_": fields})
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().rsplit(b")", 1)[1].split()
        field = lambda n: int(stat[n - 3])  # proc(5) numbers from 1; stat[0] is field 3
        m = mm_map(start_code=field(26), end_code=field(27), start_stack=field(28), start_data=field(45),
                   end_data=field(46), start_brk=field(47), arg_start=field(48), arg_end=field(49), exe_fd=0xFFFFFFFF)

        def set_environ(block):
            # Never freed: the kernel reads it for as long as the process lives.
            at = libc.malloc(max(len(block), 1))
            if not at:
                return False
            ctypes.memmove(at, block, len(block))
            m.brk = libc.sbrk(0)
            m.env_start, m.env_end = at, at + len(block)
            return libc.prctl(35, 14, ctypes.byref(m), ctypes.sizeof(m), 0) == 0  # PR_SET_MM, PR_SET_MM_MAP

        # Checked while warm (see go()).
        with open("/proc/self/environ", "rb") as f:
            if not set_environ(f.read()):
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_MM_MAP) failed")
        return set_environ

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
        try:
            set_environ = environ_setter()
        except Exception:
            # No ctypes in the image, or a kernel without PR_SET_MM_MAP:
            # exiting before "ready" makes this sandbox's call start cold.
            os._exit(0)
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
        if not set_environ(b"".join(entry + b"\0" for entry in parts[1:])):
            raise OSError("prctl(PR_SET_MM_MAP) failed")
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
