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

/// The crate's top-level modules (`src/x.rs`, `src/x/…`) and, for each, the
/// others it names as `crate::y` outside comments and its tests.
fn module_graph(src: &Path) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut graph: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(src).unwrap().to_string_lossy().into_owned();
            let top = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
            if !rel.ends_with(".rs") || top == "lib" || top == "main" || top == "bin" || is_test_file(&rel) {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let deps = graph.entry(top.clone()).or_default();
            deps.extend(crate_references(&text).into_iter().filter(|d| *d != top));
        }
    }
    let known: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| known.contains(d));
    }
    graph
}

/// `text` without its test items: each `#[cfg(test)]` item (a `mod x;`
/// declaration, or a braced item to its matching brace) is left out, and
/// only it — a test module declared at the top hides nothing below it.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let (semi, brace) = (item.find(';'), item.find('{'));
        rest = match (semi, brace) {
            (Some(s), Some(b)) if s < b => &item[s + 1..],
            (Some(s), None) => &item[s + 1..],
            (_, Some(b)) => {
                let mut depth = 0usize;
                let end = item[b..].char_indices().find_map(|(i, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    (depth == 0).then_some(b + i + 1)
                });
                &item[end.unwrap_or(item.len())..]
            }
            (None, None) => "",
        };
    }
    out.push_str(rest);
    out
}

/// A source file compiled for tests only (declared under `#[cfg(test)]`
/// by its parent, by this project's naming).
fn is_test_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The modules `text` names as `crate::m` or `crate::{m, …}`, outside
/// comments and its `#[cfg(test)]` items.
fn crate_references(text: &str) -> BTreeSet<String> {
    let code = without_tests(text);
    let mut found = BTreeSet::new();
    for line in code.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
        // A trailing comment goes too.
        let mut rest = line.split(" // ").next().unwrap_or_default();
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or_default().split(',').map(str::trim).collect::<Vec<_>>(),
                None => vec![rest],
            };
            for n in names {
                let name: String = n.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
    }
    found
}

/// Modules that reach themselves through their imports, as sorted groups.
fn import_circles(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reaches = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&str> = graph[from].iter().map(String::as_str).collect();
        while let Some(m) = todo.pop() {
            if seen.insert(m.to_string()) {
                todo.extend(graph[m].iter().map(String::as_str));
            }
        }
        seen
    };
    let all: std::collections::BTreeMap<&str, BTreeSet<String>> = graph.keys().map(|m| (m.as_str(), reaches(m))).collect();
    let mut circles: Vec<Vec<String>> = Vec::new();
    for (m, r) in &all {
        if !r.contains(*m) {
            continue;
        }
        let group: Vec<String> = r.iter().filter(|o| all[o.as_str()].contains(*m)).cloned().collect();
        if !circles.contains(&group) {
            circles.push(group);
        }
    }
    circles
}

/// The submodules of `dir` (the directory of module `m`) and, for each,
/// the siblings it names as `super::x` (in its own file) or `crate::m::x`
/// (anywhere below it), outside comments and its tests.
fn submodule_graph(dir: &Path, m: &str) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut graph: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let sub = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
            if !rel.ends_with(".rs") || sub == "mod" || is_test_file(&rel) {
                continue;
            }
            let code = without_tests(&std::fs::read_to_string(&p).unwrap());
            let mut refs = crate_references(&code.replace(&format!("crate::{m}::"), "crate::"));
            if !rel.contains('/') {
                refs.extend(crate_references(&code.replace("super::", "crate::")));
            }
            graph.entry(sub.clone()).or_default().extend(refs.into_iter().filter(|d| *d != sub));
        }
    }
    let known: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| known.contains(d));
    }
    graph
}

/// Each role's modules layer: a module never reaches itself through its
/// imports (the gateway's HTTP edge sits on its features, they on the
/// execution service and state, those on agent access and records).
#[test]
fn role_crates_have_no_import_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for krate in ["api-gateway", "node-agent", "operator"] {
        let graph = module_graph(&root.join(krate).join("src"));
        assert!(graph.len() > 5, "{krate}: read its modules: {graph:?}");
        let circles = import_circles(&graph);
        assert!(circles.is_empty(), "{krate}: modules importing each other in a circle: {circles:?}");
        // And within each module made of several files.
        for m in graph.keys() {
            let dir = root.join(krate).join("src").join(m);
            if dir.is_dir() {
                let circles = import_circles(&submodule_graph(&dir, m));
                assert!(circles.is_empty(), "{krate}::{m}: submodules importing each other in a circle: {circles:?}");
            }
        }
    }
}

#[test]
fn the_circle_check_sees_imports_and_ignores_comments_and_tests() {
    let text = "//! Uses crate::doc.\nuse crate::{a, b::X};\nfn f() { crate::c::g() } // crate::d\n#[cfg(test)]\nmod tests { use crate::e; fn g() { crate::f::h() } }\n";
    assert_eq!(crate_references(text), ["a", "b", "c"].map(String::from).into());
    // A test module declared first hides nothing after it.
    let top = "#[cfg(test)]\nmod tests;\nuse crate::images;\n#[cfg(test)]\nmod more { use crate::x; }\nfn f() { crate::pool::g() }\n";
    assert_eq!(crate_references(top), ["images", "pool"].map(String::from).into());
    assert!(is_test_file("executor/tests.rs") && is_test_file("request_tests.rs") && !is_test_file("executor/mod.rs"));
    let g = |edges: &[(&str, &str)]| {
        let mut graph: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
        for (from, to) in edges {
            graph.entry(from.to_string()).or_default().insert(to.to_string());
            graph.entry(to.to_string()).or_default();
        }
        graph
    };
    assert!(import_circles(&g(&[("http", "exec"), ("exec", "nodes"), ("http", "nodes")])).is_empty());
    assert_eq!(import_circles(&g(&[("http", "exec"), ("exec", "nodes"), ("nodes", "exec"), ("x", "http")])), vec![vec!["exec".to_string(), "nodes".to_string()]]);
}
