//! Single-use warm interpreters (#30): a Python program cannot tell a warm
//! start from a cold one except by time. The same programs run on an agent
//! with warm interpreters (each call checked to have taken one) and on one
//! without, and print, exit and die identically.

use std::time::Duration;

use warren_e2e::{request, skip_unless_root, Agent, Run};
use warren_proto::agent::{self as pb, Language, StatusRequest};

const T: Duration = Duration::from_secs(30);

/// Programs covering what a start decides: argv, `__main__`, paths, cwd,
/// stdio, environment, limits, signals, tracebacks and their files, exit
/// statuses, fork, subprocesses, threads, atexit, flushing on kill.
const PROGRAMS: &[&str] = &[
    "import sys; print(sys.argv, sys.orig_argv, sys.executable)",
    "print(__name__, __file__, __doc__, __package__, __spec__, __cached__, __loader__.name, __loader__.path)",
    "'''A docstring.'''\nprint(__doc__, sorted(globals()), type(__builtins__).__name__)",
    "import sys; print(sys.path)",
    "import sys; print(list(sys.path_importer_cache))",
    "import sys; print(sorted(sys.modules))",
    "import sys; print(sys.flags)",
    "import os; print(os.getcwd(), sorted(os.listdir('.')), sorted(os.listdir('/run/warren')))",
    "import sys; print(repr(sys.stdin.read()), sys.stdin.isatty(), sys.stdout.fileno(), sys.stderr.fileno())",
    "import os; print(sorted(os.environ.items()))",
    "print(open('/proc/self/environ', 'rb').read().split(b'\\0'), open('/proc/self/cmdline', 'rb').read())",
    "import subprocess; print(subprocess.run(['env'], capture_output=True, text=True).stdout)",
    "import subprocess, sys\nr = subprocess.run(['bash', '-c', 'echo $HOME $PWD; echo err >&2; exit 4'])\nprint(r.returncode)",
    "import os; print(sorted(os.listdir('/proc/self/fd')))",
    "import os; print(os.getpid(), os.getppid(), os.getuid(), os.getgid(), os.getgroups(), oct(os.umask(0)))",
    "import resource as r\nprint([r.getrlimit(x) for x in (r.RLIMIT_NOFILE, r.RLIMIT_NPROC, r.RLIMIT_FSIZE, r.RLIMIT_CORE, r.RLIMIT_MEMLOCK, r.RLIMIT_RTPRIO, r.RLIMIT_NICE)])",
    "import signal; print([str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGCHLD)])",
    "print([l.strip() for l in open('/proc/self/status') if l.startswith(('Cap', 'NoNewPrivs', 'Seccomp', 'Uid', 'Gid', 'Groups', 'TracerPid'))])",
    "import sys, locale\nprint(sys.stdout.encoding, sys.stdout.errors, sys.stdout.line_buffering, sys.stdout.write_through, sys.getfilesystemencoding(), locale.getpreferredencoding())",
    "import site; print(site.ENABLE_USER_SITE, site.USER_BASE, site.USER_SITE)",
    "import sys; print(sys.getrecursionlimit(), sys.prefix, sys.base_prefix, sys.platlibdir)",
    "print('héllo ✓'); import sys; print('ünï', file=sys.stderr)",
    "print('x' * 200000)",
    "def f():\n    raise ValueError('boom')\n\nf()",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e",
    "print(1\n",
    "def f():\n    f()\nf()",
    "input()",
    "raise KeyboardInterrupt",
    "import sys; sys.exit(3)",
    "import sys; sys.exit('bye')",
    "raise SystemExit(None)",
    "import os; print('x', flush=True); os._exit(5)",
    "import os, signal; print('term', flush=True); os.kill(os.getpid(), signal.SIGTERM)",
    "import os, signal, sys; sys.stdout.write('unflushed'); print('err', file=sys.stderr); os.kill(os.getpid(), signal.SIGKILL)",
    "import os\npid = os.fork()\nif pid == 0:\n    print('child', os.getppid())\n    os._exit(7)\n_, status = os.waitpid(pid, 0)\nprint('parent', os.waitstatus_to_exitcode(status))",
    "import threading\nseen = threading.Event()\ndef late():\n    seen.wait()\n    print('late')\nthreading.Thread(target=late).start()\nprint('main')\nseen.set()",
    "import threading\ndef f():\n    raise RuntimeError('in thread')\nt = threading.Thread(target=f, name='T')\nt.start()\nt.join()\nprint('joined')",
    "import atexit\natexit.register(print, 'bye')\nprint('hi')\nraise ValueError('after atexit')",
    "import warnings; warnings.warn('careful')",
    "import traceback\ndef f():\n    traceback.print_stack()\nf()",
    "import inspect; print(len(inspect.stack()), [f.function for f in inspect.stack()])",
    "from __future__ import annotations\nx: int = 1\nprint(__annotations__)",
    "# -*- coding: latin-1 -*-\nprint(repr('é'))",
    "open('/home/sandbox/f', 'w').write('x')\nimport os; print(os.listdir('/home/sandbox'), oct(os.stat('/home/sandbox').st_mode))",
];

/// The same for Node: argv, the main module, cwd, stdio, environment,
/// descriptors, errors and their stacks, exit codes, signals, events.
const NODE_PROGRAMS: &[&str] = &[
    "console.log(process.argv, process.argv0, process.execPath, process.execArgv)",
    "console.log(require.main === module, __filename, __dirname, module.id, module.paths)",
    "console.log(Object.keys(require.cache), module.children.length, module.parent, module.loaded)",
    "const fs = require('fs'); console.log(process.cwd(), fs.readdirSync('.'), fs.readdirSync('/run/warren'))",
    "console.log(Object.keys(process.env), Object.entries(process.env).sort(), typeof process.env.NODE_OPTIONS)",
    "console.log(require('child_process').execSync('env').toString())",
    "const fs = require('fs'); console.log(fs.readFileSync('/proc/self/environ', 'latin1').split('\\0'), fs.readFileSync('/proc/self/cmdline', 'latin1'))",
    "console.log(require('fs').readdirSync('/proc/self/fd'), require('fs').openSync('/dev/null'))",
    "console.log(process.pid, process.ppid, process.getuid(), process.getgid(), process.getgroups(), process.umask().toString(8))",
    "console.log(require('fs').readFileSync('/proc/self/status', 'utf8').split('\\n').filter(l => /^(Cap|NoNewPrivs|Seccomp|Uid|Gid|TracerPid)/.test(l)))",
    "console.log(process.stdout.constructor.name, process.stdout.isTTY, process.stderr.constructor.name, process.stdin.constructor.name)",
    "console.log(Object.keys(globalThis).sort(), process.title, process.release.name)",
    "console.log(process.listenerCount('SIGINT'), process.listenerCount('exit'), process.listeners('uncaughtException').length)",
    "console.log(new Error('e').stack)",
    "function f() { throw new Error('boom'); }\nf();",
    "Promise.reject(new Error('nope'));",
    "let x = ;",
    "process.exit(3)",
    "process.exitCode = 4; console.log('x')",
    "process.on('exit', c => console.log('exit', c)); console.log('hi')",
    "setTimeout(() => console.log('later'), 10); console.log('now')",
    "process.kill(process.pid, 'SIGTERM')",
    "process.stdout.write('written'); process.kill(process.pid, 'SIGKILL')",
    "const r = require('child_process').spawnSync('bash', ['-c', 'echo $HOME $PWD; exit 5']); console.log(r.status, r.stdout.toString())",
    "require('fs').writeFileSync('/home/sandbox/f', 'x'); console.log(require('fs').readdirSync('/home/sandbox'))",
];

async fn run(agent: &Agent, code: &str, thread: Option<&str>) -> Run {
    run_in(agent, Language::Python, code, thread).await
}

async fn run_in(agent: &Agent, language: Language, code: &str, thread: Option<&str>) -> Run {
    let mut req = request(language, code, T);
    req.env.insert("CALL_VAR".into(), "from the request".into());
    req.env.insert("TZ".into(), "UTC".into());
    req.thread = thread.map(thread_options);
    agent.run_request(req).await.unwrap()
}

/// Thread `id` of one test key.
fn thread_options(id: &str) -> pb::ThreadOptions {
    let r#ref = pb::ThreadRef { namespace: "default".into(), key_name: "k".into(), thread_id: id.into() };
    pb::ThreadOptions { r#ref: Some(r#ref), retention_seconds: 0, max_bytes: 1 << 30, max_threads: 0, history_versions: 0 }
}

/// Waits until the agent's pool is full (two per shape: plain sandboxes
/// and warm Python interpreters from the start), returns its warm starts.
async fn warm_ready(agent: &Agent) -> u64 {
    warm_ready_with(agent, 4).await
}

async fn warm_ready_with(agent: &Agent, sandboxes: u32) -> u64 {
    let mut client = agent.client().await.unwrap();
    for _ in 0..600 {
        let s = client.status(StatusRequest {}).await.unwrap().into_inner();
        if s.warm_sandboxes >= sandboxes {
            return s.warm_starts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the warm pool did not fill");
}

async fn warm_starts(agent: &Agent) -> u64 {
    agent.client().await.unwrap().status(StatusRequest {}).await.unwrap().into_inner().warm_starts
}

fn same(what: &str, warm: &Run, cold: &Run) {
    assert_eq!(
        (&warm.stdout, &warm.stderr, warm.exited.exit_code, warm.exited.signal),
        (&cold.stdout, &cold.stderr, cold.exited.exit_code, cold.exited.signal),
        "{what}: a warm start differs from a cold one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_and_cold_starts_are_indistinguishable() {
    if skip_unless_root("warm_and_cold_starts_are_indistinguishable") {
        return;
    }
    assert!(PROGRAMS.len() >= 30);
    let warm = Agent::start(&[]).await.unwrap();
    let cold = Agent::start(&["--warm-interpreters", "false"]).await.unwrap();
    for code in PROGRAMS {
        let before = warm_ready(&warm).await;
        let w = run(&warm, code, None).await;
        assert_eq!(warm_starts(&warm).await, before + 1, "{code:?} ran on a warm interpreter");
        let c = run(&cold, code, None).await;
        same(code, &w, &c);
    }
    assert_eq!(warm_starts(&cold).await, 0, "the cold agent starts every program cold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_and_cold_node_starts_are_indistinguishable() {
    if skip_unless_root("warm_and_cold_node_starts_are_indistinguishable") {
        return;
    }
    let warm = Agent::start(&[]).await.unwrap();
    let cold = Agent::start(&["--warm-interpreters", "false"]).await.unwrap();
    // Node's interpreters are warmed by demand: the first call starts cold.
    let before = warm_ready(&warm).await;
    assert_eq!(run_in(&warm, Language::Node, "console.log(1)", None).await.stdout, "1\n");
    assert_eq!(warm_starts(&warm).await, before, "a pool miss starts cold");
    for code in NODE_PROGRAMS {
        let before = warm_ready_with(&warm, 6).await;
        let w = run_in(&warm, Language::Node, code, None).await;
        assert_eq!(warm_starts(&warm).await, before + 1, "{code:?} ran on a warm interpreter");
        let c = run_in(&cold, Language::Node, code, None).await;
        same(code, &w, &c);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_interpreter_sees_the_threads_home_and_its_user_packages() {
    if skip_unless_root("a_warm_interpreter_sees_the_threads_home_and_its_user_packages") {
        return;
    }
    let warm = Agent::start(&[]).await.unwrap();
    let cold = Agent::start(&["--warm-interpreters", "false"]).await.unwrap();
    // A package installed in the thread's user site (as `pip install --user`
    // would), with a .pth file adding a directory of its own.
    let install = "import site, os\nd = site.getusersitepackages()\nos.makedirs(d + '/../extra', exist_ok=True)\n\
                   open(d + '/mymod.py', 'w').write('VALUE = 42\\n')\nopen(d + '/zz.pth', 'w').write('../extra\\n')\n\
                   open(d + '/../extra/other.py', 'w').write('NAME = \"other\"\\n')\n\
                   open(d + '/usercustomize.py', 'w').write('print(\"usercustomize ran\")\\n')\nprint('installed')";
    let use_it = "import mymod, other, sys, os\nprint(mymod.VALUE, other.NAME, mymod.__file__)\nprint(sys.path)\nprint(os.getcwd(), sorted(os.listdir('.')))";
    for agent in [&warm, &cold] {
        let r = run(agent, install, Some("t")).await;
        assert_eq!(r.stdout, "installed\n", "{}", r.stderr);
    }
    let before = warm_ready(&warm).await;
    let w = run(&warm, use_it, Some("t")).await;
    assert_eq!(warm_starts(&warm).await, before + 1, "the thread's call ran on a warm interpreter");
    let c = run(&cold, use_it, Some("t")).await;
    assert!(w.stdout.starts_with("usercustomize ran\n42 other /home/sandbox/.local/lib/python3"), "{}\n{}", w.stdout, w.stderr);
    same("a thread's user site", &w, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_interpreter_that_died_while_waiting_gives_a_cold_start() {
    if skip_unless_root("a_warm_interpreter_that_died_while_waiting_gives_a_cold_start") {
        return;
    }
    let warm = Agent::start(&[]).await.unwrap();
    let before = warm_ready(&warm).await;
    // Every waiting interpreter of this agent dies (as if OOM-killed while idle).
    let waiting = warm.waiting_interpreters();
    assert_eq!(waiting.len(), 2, "two warm interpreters wait in the pool");
    for pid in &waiting {
        assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    }
    let r = run(&warm, "import sys; print('ran', sys.argv)", None).await;
    assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.exited.exit_code), ("ran ['/run/warren/main.py']\n", "", 0));
    assert_eq!(warm_starts(&warm).await, before, "the call started cold, transparently");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_imports_are_loaded_before_the_call_unless_the_home_shadows_them() {
    if skip_unless_root("warm_imports_are_loaded_before_the_call_unless_the_home_shadows_them") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    // boto3 is in the host's dist-packages (a thread's user site comes first).
    let with_imports = |code: &str, thread: Option<&str>| {
        let mut req = request(Language::Python, code, T);
        req.warm_modules = vec!["boto3".into(), "no_such_module_xyz".into()];
        req.thread = thread.map(thread_options);
        req
    };
    let probe = "import sys; print('boto3' in sys.modules, 'no_such_module_xyz' in sys.modules)";
    // The first call of these modules misses the pool and starts cold.
    let before = warm_ready(&agent).await;
    let r = agent.run_request(with_imports(probe, None)).await.unwrap();
    assert_eq!((r.stdout.as_str(), warm_starts(&agent).await), ("False False\n", before));
    // Its demand warms interpreters that imported boto3 ahead of the call.
    let before = warm_ready_with(&agent, 6).await;
    let r = agent.run_request(with_imports(probe, None)).await.unwrap();
    assert_eq!((r.stdout.as_str(), r.stderr.as_str(), warm_starts(&agent).await), ("True False\n", "", before + 1));
    // A module that does not load is the program's business, as cold.
    let before = warm_ready_with(&agent, 6).await;
    let r = agent.run_request(with_imports("import no_such_module_xyz", None)).await.unwrap();
    assert!(r.stderr.contains("ModuleNotFoundError: No module named 'no_such_module_xyz'") && r.exited.exit_code == 1, "{}", r.stderr);
    assert_eq!(warm_starts(&agent).await, before + 1);
    // A thread's own boto3 (its user site) wins, as in a cold start: the
    // warm interpreter, holding the image's, hands the call to a cold one.
    let install = "import site, os\nd = site.getusersitepackages()\nos.makedirs(d)\nopen(d + '/boto3.py', 'w').write('WHOSE = \"mine\"\\n')";
    let r = agent.run_request(with_imports(install, Some("shadow"))).await.unwrap();
    assert_eq!(r.exited.exit_code, 0, "{}", r.stderr);
    let before = warm_ready_with(&agent, 6).await;
    let r = agent.run_request(with_imports("import boto3; print(boto3.WHOSE, boto3.__file__)", Some("shadow"))).await.unwrap();
    assert!(r.stdout.starts_with("mine /home/sandbox/.local/lib/python3"), "{}{}", r.stdout, r.stderr);
    assert_eq!(warm_starts(&agent).await, before, "the shadowed call started cold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_image_reports_the_warm_modules_that_do_not_load() {
    if skip_unless_root("warm_image_reports_the_warm_modules_that_do_not_load") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let warm = vec![
        pb::WarmModules { language: Language::Python as i32, modules: vec!["json".into(), "no_such_module_xyz".into()] },
        pb::WarmModules { language: Language::Node as i32, modules: vec!["fs".into(), "no-such-package-xyz".into()] },
    ];
    let r = client.warm_image(pb::WarmImageRequest { image: "host".into(), image_pull: None, warm }).await.unwrap().into_inner();
    let failed: Vec<(i32, &str)> = r.warm_failures.iter().map(|f| (f.language, f.module.as_str())).collect();
    assert_eq!(failed, [(Language::Python as i32, "no_such_module_xyz"), (Language::Node as i32, "no-such-package-xyz")], "{:?}", r.warm_failures);
    assert!(r.warm_failures[0].message.starts_with("ModuleNotFoundError: No module named"), "{:?}", r.warm_failures);
    assert!(r.warm_failures[1].message.contains("Cannot find module 'no-such-package-xyz'"), "{:?}", r.warm_failures);
    // Names, never paths.
    let bad = vec![pb::WarmModules { language: Language::Node as i32, modules: vec!["../../etc/passwd".into()] }];
    let err = client.warm_image(pb::WarmImageRequest { image: "host".into(), image_pull: None, warm: bad }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_stays_within_its_memory_budget_and_calls_still_run() {
    if skip_unless_root("the_pool_stays_within_its_memory_budget_and_calls_still_run") {
        return;
    }
    // A budget one sandbox already exceeds: each of the two shapes warmed
    // at start (plain, Python) may prepare one while the pool is empty, and
    // no more; calls past it start cold.
    let agent = Agent::start(&["--warm-pool-memory", "1"]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let mut most = 0;
    for i in 0..20 {
        let (language, code) = if i % 2 == 0 { (Language::Bash, "echo ok") } else { (Language::Python, "print('ok')") };
        let r = agent.run(language, code, T).await.unwrap();
        assert_eq!(r.stdout, "ok\n", "{}", r.stderr);
        let s = client.status(StatusRequest {}).await.unwrap().into_inner();
        most = most.max(s.warm_sandboxes);
    }
    assert!(most <= 2, "the pool held {most} idle sandboxes over its budget");
}

/// The attack: a Sandbox's warm module is image code the pool runs before
/// any call, charged to no key. This one leaves a thread spinning, so the
/// idle sandbox burns CPU for as long as it waits. A pooled sandbox that
/// does not stay idle is now discarded and counted, its shape starts cold
/// for a while (its modules then run inside the calls, on their keys), and
/// the node reports what its pool used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_import_that_keeps_running_loses_its_pool_and_is_counted() {
    if skip_unless_root("a_warm_import_that_keeps_running_loses_its_pool_and_is_counted") {
        return;
    }
    let registry = warren_e2e::registry::Registry::start().unwrap();
    let reference = registry.reference("tenant/spinning:1");
    let mut image = warren_e2e::registry::bash_python_image();
    let spin = b"import threading\ndef _spin():\n    while True:\n        pass\nthreading.Thread(target=_spin, daemon=True).start()\n";
    image.layers.push(warren_e2e::registry::tar_of(&[("usr/lib/python3.11/warren_spin.py", spin)]));
    let digest = image.push(&reference).await.unwrap();
    let agent = Agent::start(&[]).await.unwrap();
    let call = || {
        let mut req = request(Language::Python, "import sys; print('warren_spin' in sys.modules)", T);
        (req.image, req.image_digest) = (reference.clone(), digest.clone());
        req.warm_modules = vec!["warren_spin".into()];
        req
    };
    let mut client = agent.client().await.unwrap();
    let status = |mut c: warren_proto::agent::node_agent_client::NodeAgentClient<tonic::transport::Channel>| async move { c.status(StatusRequest {}).await.unwrap().into_inner() };
    // The first call misses the pool (cold); its demand warms an
    // interpreter that imports the module, which starts spinning.
    assert_eq!(agent.run_request(call()).await.unwrap().stdout, "False\n");
    let mut discarded = status(client.clone()).await;
    for _ in 0..600 {
        if discarded.idle_discards > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        discarded = status(client.clone()).await;
    }
    assert!(discarded.idle_discards >= 1, "the spinning sandbox was discarded");
    assert!(discarded.idle_cpu_ms >= 50, "what it burned is counted as the pool's: {} ms", discarded.idle_cpu_ms);
    // Its shape is not kept warm any more: the call starts cold and the
    // module runs inside it, on the caller's key.
    let before = client.status(StatusRequest {}).await.unwrap().into_inner().warm_starts;
    assert_eq!(agent.run_request(call()).await.unwrap().stdout, "False\n", "a cold start: the module is not preloaded");
    let after = status(client.clone()).await;
    assert_eq!(after.warm_starts, before, "no warm interpreter served it");
}
