//! Python tools the tests run (the Baponi SDK, schemathesis), each in a
//! virtualenv under the target directory made from PyPI on first use.

use std::path::PathBuf;
use std::process::Command;

/// `target/<name>`, holding `spec` (`pip install` arguments, space
/// separated), made once and atomically so parallel runs never see a
/// half-built one. Remade when `spec` changes. Run its tools as
/// `bin/python -m …`: the venv is built under another name and moved, so
/// the shebangs of its `bin/` scripts point nowhere.
pub fn venv(name: &str, spec: &str) -> PathBuf {
    let target = crate::bin_dir().parent().expect("target dir").to_path_buf();
    let dir = target.join(name);
    if std::fs::read_to_string(dir.join("ok")).is_ok_and(|v| v == spec) {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let tmp = target.join(format!("{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3").args(["-m", "venv"]).arg(&tmp));
    run(Command::new(tmp.join("bin/pip")).args(["install", "--quiet", "--disable-pip-version-check"]).args(spec.split(' ')));
    std::fs::write(tmp.join("ok"), spec).unwrap();
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp); // another run finished first
    }
    dir
}

/// Runs `cmd`; panics with its output when it fails.
pub fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
