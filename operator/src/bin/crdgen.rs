//! Writes the CRD YAML into `crds/` and `charts/warren/crds/`.

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in warren_operator::crds::DIRS {
        let dir = root.join(dir);
        std::fs::create_dir_all(&dir)?;
        for (name, yaml) in warren_operator::crds::render() {
            std::fs::write(dir.join(&name), yaml)?;
            println!("wrote {}", dir.join(name).display());
        }
    }
    Ok(())
}
