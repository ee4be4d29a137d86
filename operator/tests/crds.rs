//! The committed CRDs (`crds/`, `charts/warren/crds/`) match the Rust types.
//! `cargo run -p warren-operator --bin crdgen` (or `WARREN_UPDATE_GENERATED=1
//! cargo test -p warren-operator --test crds`) rewrites them.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let update = std::env::var_os("WARREN_UPDATE_GENERATED").is_some();
    for dir in warren_operator::crds::DIRS {
        for (name, yaml) in warren_operator::crds::render() {
            let path = root.join(dir).join(&name);
            if update {
                std::fs::create_dir_all(root.join(dir)).unwrap();
                std::fs::write(&path, &yaml).unwrap();
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(committed == yaml, "{} is stale: run `cargo run -p warren-operator --bin crdgen`", path.display());
        }
    }
}

#[test]
fn crds_are_structural_and_validated() {
    for (name, yaml) in warren_operator::crds::render() {
        let v: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        let version = &v["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1", "{name}");
        assert_eq!(v["spec"]["scope"], "Namespaced", "{name}");
        assert!(version["subresources"]["status"].is_mapping(), "{name}: status subresource");
        assert!(version["additionalPrinterColumns"].as_sequence().is_some_and(|c| c.iter().any(|c| c["name"] == "Ready")), "{name}");
        let text = serde_yaml::to_string(&version["schema"]).unwrap();
        assert!(!text.contains("x-kubernetes-validations"), "{name}: CEL is not served by Kubernetes 1.20");
    }
}
