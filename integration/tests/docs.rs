//! The README and the guide as a reader follows them: every relative link lands on a file that
//! exists, and every `#fragment` on a heading of it (mdBook and GitHub name a heading's anchor
//! the same way for the headings here); and every page with Rust code is compiled by the
//! doctests (`src/lib.rs`). mdBook itself checks `SUMMARY.md` (`create-missing = false`); `.ci/run`
//! builds the guide and fails on its warnings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The Markdown pages a reader moves between: the README, the tests' map, the guide.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![
        root.join("README.md"),
        root.join("integration/tests/README.md"),
    ];
    let mut dirs = vec![root.join("guide/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The page's text outside code: fenced blocks and inline code spans are blanked.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            }
            out.push(if in_code { ' ' } else { c });
        }
        out.push('\n');
    }
    out
}

/// The targets of the inline links `[text](target)` of `text`.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut found = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_owned();
            found.push(target);
            rest = &rest[end..];
        }
    }
    found
}

/// The anchor mdBook and GitHub give a heading: lowercase, letters, digits, `-` and `_` kept,
/// spaces turned into `-`, everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every broken relative link of `pages`, as `page: target (why)`.
fn broken_links(pages: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            let shown = format!(
                "{}: {target}",
                page.strip_prefix(root()).unwrap_or(page).display()
            );
            if !file.exists() {
                broken.push(format!("{shown} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment {
                let heads = anchors(&std::fs::read_to_string(&file).unwrap_or_default());
                if !heads.contains(fragment) {
                    broken.push(format!("{shown} (no such heading)"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_lands_on_a_file_and_a_heading() {
    let broken = broken_links(&pages());
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_check_finds_a_broken_file_and_a_broken_heading() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("page.md");
    std::fs::write(dir.path().join("other.md"), "# A heading\n").unwrap();
    std::fs::write(
        &page,
        "# Page: the `idem` command\n\n[ok](other.md#a-heading) [self](#page-the-idem-command) \
         [gone](missing.md) [wrong](other.md#another) `[code](missing.md)`\n\n```text\n[x](y.md)\n```\n",
    )
    .unwrap();
    let broken: Vec<String> = broken_links(std::slice::from_ref(&page))
        .into_iter()
        .map(|b| b.rsplit(": ").next().unwrap().to_owned())
        .collect();
    assert_eq!(
        broken,
        [
            "missing.md (no such file)",
            "other.md#another (no such heading)"
        ]
    );
}

#[test]
fn every_page_with_rust_code_is_compiled_by_the_doctests() {
    let lib = std::fs::read_to_string(root().join("integration/src/lib.rs")).unwrap();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let has_rust = text.lines().any(|l| l.trim_start().starts_with("```rust"));
        let relative = page.strip_prefix(root()).unwrap().display().to_string();
        if has_rust {
            assert!(
                lib.contains(&format!("\"../../{relative}\"")),
                "{relative} has Rust code that no doctest compiles: add it to integration/src/lib.rs"
            );
        }
    }
}
