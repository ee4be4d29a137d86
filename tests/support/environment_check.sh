# Everyday operations agent-written code performs, each checked to behave
# as on an ordinary Linux machine of the sandbox's own size. Run by
# tests/tests/environment.rs inside a sandbox (bash), with CPUS and MEM_KB
# set to the sandbox's limits. Prints one line per check: "ok NAME" or
# "FAIL NAME: what happened". Needs python3 and node; git, sqlite3, npm and
# the procps tools where the image has them (a check of a missing tool says so).
set -u
W=$(mktemp -d /tmp/check.XXXXXX) || { echo "FAIL mktemp_dir: $?"; exit 0; }
cd "$W"
check() { # check NAME COMMAND... : ok when COMMAND exits 0
  local name=$1
  shift
  local out
  if out=$("$@" 2>&1); then echo "ok $name"; else echo "FAIL $name: $(echo "$out" | tail -3 | tr '\n' ' ')"; fi
}
equal() { # equal NAME EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then echo "ok $1"; else echo "FAIL $1: expected [$2], got [$3]"; fi
}
fails_with() { # fails_with NAME TEXT COMMAND... : ok when COMMAND fails saying TEXT
  local name=$1 text=$2
  shift 2
  local out
  if out=$("$@" 2>&1); then echo "FAIL $name: succeeded: $out"; return; fi
  case "$out" in *"$text"*) echo "ok $name" ;; *) echo "FAIL $name: $(echo "$out" | tail -2 | tr '\n' ' ')" ;; esac
}

# Temporary files: /tmp and /var/tmp, per call.
check tmp_write sh -c 'echo x > /tmp/marker && cat /tmp/marker'
check var_tmp_write sh -c 'echo x > /var/tmp/.bench_marker && cat /var/tmp/.bench_marker'
check mktemp_var_tmp sh -c 'f=$(mktemp -p /var/tmp) && test -f "$f"'
check python_tempfile python3 -c 'import tempfile; f = tempfile.NamedTemporaryFile(); f.write(b"x"); f.flush(); d = tempfile.mkdtemp(); print(f.name, d)'
check var_dirs test -d /var/tmp -a -d /var/cache -a -d /var/lib -a -d /var/log
equal var_tmp_sticky "1777" "$(stat -c %a /var/tmp)"
check run_lock flock /run/lock/check.lock true
check writable_places_nosuid_nodev python3 -c '
import sys
m = {l.split()[4]: l.split()[5] for l in open("/proc/self/mountinfo")}
# The mount each place lives on: its own, or the one above it (the host root stages /var whole).
on = lambda p: max((q for q in m if p == q or p.startswith(q.rstrip("/") + "/")), key=len)
places = ("/tmp", "/var/tmp", "/run/lock", "/var/cache", "/var/lib", "/var/log")
bad = [p for p in places if not {"nosuid", "nodev"} <= set(m[on(p)].split(","))]
missing = [p for p in ("/tmp", "/var/tmp", "/run/lock") if on(p) == "/"]
sys.exit(f"not nosuid,nodev: {bad}; on the root mount: {missing}" if bad or missing else 0)'
fails_with usr_read_only "Read-only file system" touch /usr/pwned
fails_with etc_read_only "" sh -c 'echo x > /etc/pwned'

# Who am I.
equal whoami sandbox "$(whoami)"
equal id_un sandbox "$(id -un)"
equal id_u 1000 "$(id -u)"
check getent_passwd getent passwd sandbox
equal tilde_user /home/sandbox "$(eval echo ~sandbox)"
equal env_identity "sandbox sandbox /bin/bash /home/sandbox" "$USER $LOGNAME $SHELL $HOME"
equal lang C.UTF-8 "$LANG"
equal getpass sandbox "$(python3 -c 'import getpass; print(getpass.getuser())')"
equal pwd_entry "sandbox /home/sandbox" "$(python3 -c 'import os, pwd; p = pwd.getpwuid(os.getuid()); print(p.pw_name, p.pw_dir)')"
equal hostname sandbox "$(hostname)"

# The sandbox's size.
equal nproc "$CPUS" "$(nproc)"
equal os_cpu_count "$CPUS" "$(python3 -c 'import os; print(os.cpu_count())')"
equal sched_getaffinity "$CPUS" "$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')"
equal proc_cpuinfo "$CPUS" "$(grep -c '^processor' /proc/cpuinfo)"
equal sys_cpu_online "$CPUS" "$(python3 -c 'n = 0
for part in open("/sys/devices/system/cpu/online").read().strip().split(","):
    a, _, b = part.partition("-")
    n += int(b or a) - int(a) + 1
print(n)')"
equal node_cpus "$CPUS $CPUS" "$(node -e 'const os = require("os"); console.log(os.cpus().length, os.availableParallelism())')"
equal meminfo_total "$MEM_KB" "$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
equal meminfo_swap "0" "$(awk '/^SwapTotal:/ {print $2}' /proc/meminfo)"
equal node_totalmem "$((MEM_KB * 1024))" "$(node -e 'console.log(require("os").totalmem())')"
# What tells the program its size is the sandbox's to read, not to change.
equal size_views_read_only "444 444 444 444" "$(stat -c %a /proc/meminfo /proc/cpuinfo /proc/stat /sys/devices/system/cpu/online | tr '\n' ' ' | sed 's/ $//')"
fails_with size_views_not_writable "ermission denied" sh -c 'echo 0 > /sys/devices/system/cpu/online'
if command -v free >/dev/null; then equal free_total "$MEM_KB" "$(free -k | awk '/^Mem:/ {print $2}')"; else echo "ok free_total (no procps in this image)"; fi

# Processes, pools and signals.
check multiprocessing_pool python3 -c 'import multiprocessing as m, os
with m.Pool(os.cpu_count()) as p: assert p.map(abs, [-1, -2, -3]) == [1, 2, 3]'
check thread_pool python3 -c 'from concurrent.futures import ThreadPoolExecutor as T
with T() as t: assert list(t.map(str, [1, 2])) == ["1", "2"]'
check process_pool python3 -c 'from concurrent.futures import ProcessPoolExecutor as P
if __name__ == "__main__":
    with P() as p: assert list(p.map(abs, [-4])) == [4]'
equal subprocess_pipes "HELLO" "$(python3 -c 'import subprocess; print(subprocess.run("echo hello | tr a-z A-Z", shell=True, capture_output=True, text=True).stdout.strip())')"
equal signal_child "-15" "$(python3 -c 'import subprocess, signal; p = subprocess.Popen(["sleep", "30"]); p.send_signal(signal.SIGTERM); print(p.wait())')"
equal job_control "143" "$(bash -c 'sleep 30 & kill %1; wait %1; echo $?')"
check ulimit bash -c 'ulimit -a >/dev/null && ulimit -n'
check df df -k /tmp /home/sandbox
if command -v ps >/dev/null; then
  equal ps_only_sandbox "ok" "$(ps -e -o pid= -o user= | awk '$2 != "sandbox" && $1 != 1 {bad = 1} END {print bad ? "host processes: " NR : "ok"}')"
else echo "ok ps_only_sandbox (no procps in this image)"; fi
check proc_self sh -c 'cat /proc/self/status /proc/self/cmdline /proc/self/limits >/dev/null && ls /proc/self/fd >/dev/null'
check proc_uptime cat /proc/uptime
equal large_stdout 1048576 "$(python3 -c 'import sys; sys.stdout.write("x" * 1048576)' | wc -c)"
check os_release grep -q '^ID=' /etc/os-release
equal utf8_output "héllo ✓ utf-8" "$(python3 -c 'import sys; print("héllo ✓", sys.stdout.encoding)')"
check background_and_wait bash -c 'sleep 0.1 & pid=$!; wait $pid'
check dev_files sh -c 'head -c 16 /dev/urandom | wc -c && echo x > /dev/null'
check tls_context python3 -c 'import ssl; assert ssl.create_default_context().cert_store_stats()["x509_ca"] > 0'
check tar_roundtrip sh -c 'mkdir t && echo a > t/a && tar czf t.tgz t && rm -r t && tar xzf t.tgz && cat t/a'
check loopback_server python3 -c 'import http.server, threading, urllib.request
s = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=s.serve_forever, daemon=True).start()
assert urllib.request.urlopen("http://127.0.0.1:%d/" % s.server_port).status == 200'

# Tools and packages.
check sqlite_python python3 -c 'import sqlite3; c = sqlite3.connect("/tmp/db.sqlite"); c.execute("create table t(x)"); c.execute("insert into t values (1)"); c.commit(); assert c.execute("select x from t").fetchone() == (1,)'
if command -v git >/dev/null; then
  check git_commit sh -c 'git init -q repo && cd repo && echo a > a && git add a && git -c user.name=a -c user.email=a@example.test commit -qm first && git log --oneline | grep -q first'
else echo "ok git_commit (no git in this image)"; fi
check home_cache python3 -c 'import os; os.makedirs(os.path.expanduser("~/.cache/tool"), exist_ok=True)'
check python_venv python3 -m venv --without-pip /tmp/venv
check pip_user_wheel python3 -c '
import os, subprocess, sys, zipfile
whl = "/tmp/warrencheck-1.0-py3-none-any.whl"
with zipfile.ZipFile(whl, "w") as z:
    z.writestr("warrencheck.py", "VALUE = 42\n")
    z.writestr("warrencheck-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: warrencheck\nVersion: 1.0\n")
    z.writestr("warrencheck-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: check\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("warrencheck-1.0.dist-info/RECORD", "")
r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--user", "--no-index", "--break-system-packages", "--disable-pip-version-check", whl], capture_output=True, text=True)
assert r.returncode == 0, r.stderr
r = subprocess.run([sys.executable, "-c", "import warrencheck; print(warrencheck.VALUE)"], capture_output=True, text=True)
assert r.stdout.strip() == "42", r.stderr'
if command -v npm >/dev/null; then
  check npm_local_tarball sh -c 'mkdir -p pkg app && echo "{\"name\":\"warren-check\",\"version\":\"1.0.0\",\"main\":\"i.js\"}" > pkg/package.json && echo "module.exports = 42" > pkg/i.js && (cd pkg && npm pack --silent >/dev/null) && cd app && echo "{}" > package.json && npm install --silent --offline --no-audit --no-fund ../pkg/warren-check-1.0.0.tgz && node -e "process.exit(require(\"warren-check\") === 42 ? 0 : 1)"'
else echo "ok npm_local_tarball (no npm in this image)"; fi

# What a sandbox does not offer fails as on Linux, with the ordinary error.
fails_with raw_socket "Operation not permitted" python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)'
fails_with mount_refused "" mount -t tmpfs none /tmp
if command -v sudo >/dev/null; then fails_with sudo_refused "" sudo -n true; else fails_with sudo_refused "not found" sudo -n true; fi
# A Blocked sandbox has only loopback: no route, nothing leaves it.
fails_with no_route_when_blocked "unreachable" python3 -c 'import socket; socket.create_connection(("198.51.100.1", 80), timeout=2)'
echo done
