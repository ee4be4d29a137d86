//! The workspace's layers, read from Cargo's own dependency graph
//! (`cargo tree`, offline, from the lockfile): what each role links.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Every package in `package`'s normal (non-dev, non-build) dependency
/// closure, by name.
fn closure(package: &str) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none", "--format", "{p}", "-p", package])
        .output()
        .expect("running cargo tree");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

/// The operator reconciles objects and probes buckets; it never mounts a
/// filesystem or touches a sandbox, so none of that code is in its binary.
#[test]
fn the_operator_links_no_fuse_server_and_no_isolation_code() {
    let deps = closure("warren-operator");
    assert!(deps.contains("warren-objects"), "the operator's probe comes from warren-objects: {deps:?}");
    for absent in ["fuser", "warren-storage", "warren-isolation", "warren-network", "warren-image", "libseccomp"] {
        assert!(!deps.contains(absent), "warren-operator depends on {absent}");
    }
}

/// The crates that touch the kernel know nothing of Kubernetes.
#[test]
fn kernel_crates_are_free_of_kubernetes() {
    for krate in ["warren-isolation", "warren-storage", "warren-objects", "warren-network", "warren-image"] {
        let deps = closure(krate);
        for absent in ["kube", "kube-client", "kube-runtime", "k8s-openapi"] {
            assert!(!deps.contains(absent), "{krate} depends on {absent}");
        }
    }
}

/// Functions longer than this need a reason, in a `// Long: …` comment
/// right above them (among their doc comment and attributes).
const MAX_FN_LINES: usize = 60;

/// `(path, line, name, lines)` of every function in `text` over the limit
/// without a reason. Functions are found by their signature line and end
/// at the closing brace at the signature's indentation (the workspace's
/// formatting); test modules count too.
fn long_functions(path: &str, text: &str) -> Vec<(String, usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let trimmed = l.trim_start();
        let indent = l.len() - trimmed.len();
        let sig = ["pub(crate) ", "pub(super) ", "pub ", ""].iter().find_map(|v| trimmed.strip_prefix(v)).map(|r| r.trim_start_matches("async ").trim_start_matches("unsafe "));
        let Some(name) = sig.and_then(|r| r.strip_prefix("fn ")).map(|r| r.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or_default().to_string()) else {
            i += 1;
            continue;
        };
        // A declaration without a body (trait method) ends with `;` first.
        let Some(open) = (i..lines.len()).find(|&j| lines[j].trim_end().ends_with('{') || lines[j].trim_end().ends_with(';')) else { break };
        if lines[open].trim_end().ends_with(';') {
            i = open + 1;
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let end = (open + 1..lines.len()).find(|&j| lines[j] == close).unwrap_or(lines.len() - 1);
        let n = end - i + 1;
        let reason = lines[..i].iter().rev().take_while(|p| {
            let p = p.trim_start();
            p.starts_with("//") || p.starts_with("#[")
        });
        if n > MAX_FN_LINES && !reason.into_iter().any(|p| p.trim_start().starts_with("// Long: ")) {
            found.push((path.to_string(), i + 1, name, n));
        }
        i = end + 1;
    }
    found
}

/// No function of the product crates runs over 60 lines unless a comment
/// says why (the end-to-end scenarios in `tests/` are exempt: a scenario
/// reads top to bottom).
#[test]
fn no_long_function_without_a_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut long = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(&root).unwrap().display().to_string();
            if p.is_dir() {
                let skip = ["target", "tests", ".git", "gen", "node_modules", "docs", "charts", "examples", "crds", "scripts"];
                if !skip.iter().any(|s| p.file_name().is_some_and(|n| n == *s)) {
                    stack.push(p);
                }
            } else if rel.ends_with(".rs") {
                long.extend(long_functions(&rel, &std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    long.sort();
    let list: Vec<String> = long.iter().map(|(p, l, n, len)| format!("{p}:{l} {n}: {len} lines")).collect();
    assert!(long.is_empty(), "functions over {MAX_FN_LINES} lines without a `// Long: …` reason:\n{}", list.join("\n"));
}

#[test]
fn the_length_check_sees_bodies_and_reasons() {
    let body = |n: usize| (0..n).map(|_| "    x();\n").collect::<String>();
    let long = format!("pub async fn a() {{\n{}}}\n", body(70));
    assert_eq!(long_functions("f.rs", &long).len(), 1);
    let reasoned = format!("/// Doc.\n// Long: one arm per kind.\n#[inline]\nfn a() {{\n{}}}\n", body(70));
    assert!(long_functions("f.rs", &reasoned).is_empty());
    let short = format!("fn a() {{\n{}}}\ntrait T {{\n    fn b(&self);\n}}\n", body(10));
    assert!(long_functions("f.rs", &short).is_empty());
}
