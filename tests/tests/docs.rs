//! The documentation book (`docs/`): its generated reference pages match
//! the schemas they come from, every link between its pages (and from the
//! README into it) lands on a page and heading that exist, every page is in
//! the table of contents, and mdBook builds it.

use std::path::{Path, PathBuf};
use std::process::Command;

use warren_e2e::docs;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn book() -> PathBuf {
    root().join("docs/src")
}

/// Writes `text` to `rel` under `WARREN_UPDATE_GENERATED`, then fails when
/// the committed file differs.
fn generated(rel: &str, text: &str) {
    let path = book().join(rel);
    if std::env::var_os("WARREN_UPDATE_GENERATED").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == text, "{} is stale: WARREN_UPDATE_GENERATED=1 cargo nextest run -p warren-e2e --test docs", path.display());
}

#[test]
fn the_crd_reference_matches_the_crds() {
    let mut crds = Vec::new();
    for entry in std::fs::read_dir(root().join("crds")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            crds.push(serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap());
        }
    }
    assert_eq!(crds.len(), 4, "four kinds");
    let page = docs::crd_reference(&crds);
    for field in ["`spec.sandboxRef.name`", "`spec.resources.cpu`", "`spec.provider`", "`status.conditions`"] {
        assert!(page.contains(field), "{field} missing from the CRD reference");
    }
    generated("reference/crds.md", &page);
}

#[test]
fn the_http_reference_matches_the_openapi_document() {
    let openapi: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root().join("api-gateway/openapi.json")).unwrap()).unwrap();
    let page = docs::http_reference(&openapi);
    for needle in ["## `POST /v1/sandbox/execute`", "## ExecuteRequest", "`thread_id`"] {
        assert!(page.contains(needle), "{needle} missing from the HTTP reference");
    }
    generated("reference/http-api.md", &page);
}

/// The pages of the book, with `{{#include}}`d files expanded as mdBook
/// does (links in them resolve from the including page).
fn pages() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&book(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = docs::read_page(&p);
            assert!(!text.contains("(include "), "{}: an include failed:\n{text}", p.display());
            (p, text)
        })
        .collect()
}

#[test]
fn every_link_in_the_book_lands() {
    let root = book();
    let mut broken = Vec::new();
    for (page, text) in pages() {
        for link in docs::links(&page, &text) {
            if let Some(why) = docs::check(&root, &link) {
                broken.push(format!("{}:{}: {why}", link.page.strip_prefix(&root).unwrap().display(), link.line));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_is_in_the_table_of_contents() {
    let summary = std::fs::read_to_string(book().join("SUMMARY.md")).unwrap();
    let listed: Vec<String> = docs::links(&book().join("SUMMARY.md"), &summary).into_iter().map(|l| l.target).collect();
    for (page, _) in pages() {
        let rel = page.strip_prefix(book()).unwrap().display().to_string();
        if rel != "SUMMARY.md" {
            assert!(listed.contains(&rel), "{rel} is not in docs/src/SUMMARY.md");
        }
    }
}

/// The README is the front door: short, the two commands first, and its
/// links into the book land.
#[test]
fn the_readme_starts_with_the_two_commands_and_links_into_the_book() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(lines <= 200, "README.md has {lines} lines; the book holds the rest");
    let first_block = text.split("```").nth(1).unwrap_or_default();
    assert!(first_block.contains("./scripts/run-local.sh") && first_block.contains("./scripts/test.sh"), "the README's first code block is the two commands");
    let mut broken = Vec::new();
    for link in docs::links(&root().join("README.md"), &text) {
        if let Some(why) = docs::check(&root(), &link) {
            broken.push(format!("README.md:{}: {why}", link.line));
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// mdBook (installed by the test command, `WARREN_MDBOOK`) builds the book
/// without a warning.
#[test]
fn mdbook_builds_the_book() {
    let Some(mdbook) = std::env::var_os("WARREN_MDBOOK") else {
        eprintln!("SKIPPED mdbook_builds_the_book: WARREN_MDBOOK is not set (./scripts/test.sh installs mdBook and sets it)");
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(&mdbook).arg("build").arg(root().join("docs")).arg("--dest-dir").arg(out.path()).output().expect("running mdbook");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "mdbook build failed:\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "mdbook warned:\n{stderr}");
    for page in ["index.html", "tour.html", "reference/crds.html", "reference/http-api.html", "security.html", "operations/chart.html"] {
        assert!(out.path().join(page).exists(), "{page} not built");
    }
    let security = std::fs::read_to_string(out.path().join("security.html")).unwrap();
    assert!(security.contains("threat model") || security.contains("Threat model"), "SECURITY.md not included");
}
