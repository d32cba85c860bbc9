//! A clone of the repository must explain itself. The early design notes (a model spec, a serving
//! spec and an architecture page) lived outside it; their content is now in docs/model.md and
//! docs/serving.md. These tests fail when a source or document cites the outside notes again, when
//! a citation of the form `docs/<page>.md, "<Section>"` names a section the page lacks, and when the
//! README's layout table and the crates' manifests disagree.

use std::fs;
use std::path::{Path, PathBuf};

/// Pages of the project's own documentation that other files cite by section.
const CITED_PAGES: &[&str] = &["docs/model.md", "docs/serving.md"];

/// File names of the outside notes. Built with `concat!` so this file does not cite them itself.
const OUTSIDE_NAMES: &[&str] = &[
    concat!("serving", ".md"),
    concat!("model-architecture", ".md"),
    concat!("architecture", ".md"),
];

/// Paths into the directory that held the outside notes.
const OUTSIDE_PATHS: &[&str] = &[
    concat!("../", "shared"),
    concat!("shared/", "spec"),
    concat!("shared/", "design"),
];

/// Section-number citations of the outside spec (the project's own docs cite sections by name).
const OUTSIDE_SECTION_MARK: &str = concat!("spec ", "§");

/// Directories (relative to the repository root) that hold build output, version control data,
/// local tool environments or generated fuzz inputs rather than sources and documents.
const SKIPPED_DIRS: &[&str] = &[
    "target",
    ".git",
    ".venv",
    ".whl",
    "fuzz/target",
    "fuzz/corpus",
    "fuzz/artifacts",
];

/// File kinds that hold sources or prose. Files without an extension (scripts such as .ci/run) are
/// read too; everything else (weights, .npy fixtures, images) is data.
const TEXT_EXTENSIONS: &[&str] = &[
    "rs", "md", "py", "sh", "cu", "cuh", "toml", "txt", "json", "jsonl", "yml", "yaml",
];

/// What is wrong with `line`, if it cites a document outside the repository.
fn outside_citation(line: &str) -> Option<String> {
    if let Some(path) = OUTSIDE_PATHS.iter().find(|p| line.contains(*p)) {
        return Some(format!("a path into the outside notes (`{path}`)"));
    }
    if line.contains(OUTSIDE_SECTION_MARK) {
        return Some(format!(
            "`{OUTSIDE_SECTION_MARK}N` (a section of the outside spec)"
        ));
    }
    for name in OUTSIDE_NAMES {
        for (at, _) in line.match_indices(name) {
            let own_page = line[..at].ends_with("docs/");
            if !own_page {
                return Some(format!("`{name}` without `docs/` (an outside note)"));
            }
        }
    }
    None
}

/// `(page, section)` for every `docs/<page>.md, "<Section>"` citation in `line`.
fn section_citations(line: &str) -> Vec<(&'static str, &str)> {
    let mut found = Vec::new();
    for page in CITED_PAGES {
        let opening = format!("{page}, \"");
        for (at, _) in line.match_indices(&opening) {
            let rest = &line[at + opening.len()..];
            if let Some(end) = rest.find('"') {
                found.push((*page, &rest[..end]));
            }
        }
    }
    found
}

fn headings(page_text: &str) -> Vec<&str> {
    page_text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim())
        .collect()
}

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every source and document file under the root, as paths relative to it.
fn text_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(repo_root().join(&dir))
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let relative = dir.join(entry.file_name());
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                if !SKIPPED_DIRS.iter().any(|s| relative == Path::new(s)) {
                    pending.push(relative);
                }
            } else if kind.is_file() {
                let text_kind = relative
                    .extension()
                    .is_none_or(|e| TEXT_EXTENSIONS.iter().any(|t| e == *t));
                if text_kind {
                    files.push(relative);
                }
            }
        }
    }
    files.sort();
    files
}

#[test]
fn nothing_cites_the_outside_notes() {
    let files = text_files();
    for expected in [
        "README.md",
        "crates/model/src/forward.rs",
        "docs/serving.md",
    ] {
        assert!(
            files.iter().any(|f| f == Path::new(expected)),
            "the walk missed {expected}: it would check nothing"
        );
    }
    let mut offences = Vec::new();
    for file in &files {
        // Files that are not UTF-8 are data, whatever their name.
        let Ok(text) = fs::read_to_string(repo_root().join(file)) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(why) = outside_citation(line) {
                offences.push(format!("{}:{}: {why}", file.display(), n + 1));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "cite docs/model.md or docs/serving.md instead:\n{}",
        offences.join("\n")
    );
}

#[test]
fn cited_sections_exist() {
    let pages: Vec<(&str, String)> = CITED_PAGES
        .iter()
        .map(|p| {
            let text = fs::read_to_string(repo_root().join(p))
                .unwrap_or_else(|e| panic!("{p} is cited across the repository: {e}"));
            (*p, text)
        })
        .collect();
    let mut citations = 0;
    let mut missing = Vec::new();
    for file in text_files() {
        let Ok(text) = fs::read_to_string(repo_root().join(&file)) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for (page, section) in section_citations(line) {
                citations += 1;
                let (_, page_text) = pages
                    .iter()
                    .find(|(p, _)| *p == page)
                    .expect("a cited page");
                if !headings(page_text).contains(&section) {
                    missing.push(format!(
                        "{}:{}: {page} has no section \"{section}\"",
                        file.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        citations > 0,
        "no section citations found: the scan checks nothing"
    );
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_rules_tell_outside_citations_from_our_own() {
    // Each sample is split inside its cited name so that this file does not cite it.
    let outside = [
        concat!("(see ../sha", "red/spec/serv", "ing.md §1)"),
        concat!("the MTP head (spec ", "§6)"),
        concat!(
            "mirrors sha",
            "red/spec/model-arch",
            "itecture.md line by line"
        ),
        concat!("(model-architecture", ".md §4/§5)"),
        concat!("counters of serving", ".md §2."),
        concat!("sha", "red/spec/serv", "ing.md section 1"),
        concat!("the design in architecture", ".md"),
    ];
    for line in outside {
        assert!(outside_citation(line).is_some(), "not flagged: {line}");
    }
    let own = [
        r#"counters of docs/serving.md, "Metrics"."#,
        r#"(docs/model.md, "Gated DeltaNet", chunked form)"#,
        "reproduces the founding failure (docs/serving.md)",
        "docs/benchmarks.md and docs/compatibility-flags.md",
    ];
    for line in own {
        assert_eq!(outside_citation(line), None, "flagged: {line}");
    }
    assert_eq!(
        section_citations(r#"see docs/model.md, "Norms" and docs/serving.md, "Health"."#),
        [("docs/model.md", "Norms"), ("docs/serving.md", "Health")]
    );
}

/// The workspace crates `crates/<name>/Cargo.toml` lists under `[dependencies]`, without the
/// `deltaserve-` prefix.
fn workspace_dependencies(manifest: &str) -> Vec<String> {
    let mut in_dependencies = false;
    let mut names = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if let (true, Some(rest)) = (in_dependencies, line.strip_prefix("deltaserve-")) {
            let end = rest.find(['.', ' ', '=']).unwrap_or(rest.len());
            names.push(rest[..end].to_string());
        }
    }
    names.sort();
    names
}

/// `(first path, dependencies)` of every README layout row.
fn readme_layout_rows(readme: &str) -> Vec<(String, Vec<String>)> {
    readme
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "| `crates/x` | owns | deps |" splits into ["", path, owns, deps, ""].
            let [_, path, _, deps, _] = cells[..] else {
                return None;
            };
            let path = path.split('`').nth(1)?;
            let mut deps: Vec<String> = match deps {
                "none" => Vec::new(),
                listed => listed.split(',').map(|d| d.trim().to_string()).collect(),
            };
            deps.sort();
            Some((path.to_string(), deps))
        })
        .collect()
}

/// `(crate, dependencies)` of every README layout row whose first path is a crate directory.
fn readme_crate_rows(readme: &str) -> Vec<(String, Vec<String>)> {
    readme_layout_rows(readme)
        .into_iter()
        .filter_map(|(path, deps)| Some((path.strip_prefix("crates/")?.to_string(), deps)))
        .collect()
}

#[test]
fn readme_layout_table_matches_the_crates() {
    let readme = fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let rows = readme_crate_rows(&readme);
    let mut crates: Vec<String> = fs::read_dir(repo_root().join("crates"))
        .expect("crates/")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    crates.sort();
    let mut listed: Vec<String> = rows.iter().map(|(c, _)| c.clone()).collect();
    listed.sort();
    assert_eq!(
        listed, crates,
        "README's layout table and crates/ list different crates"
    );
    for (name, readme_deps) in rows {
        let manifest =
            fs::read_to_string(repo_root().join("crates").join(&name).join("Cargo.toml"))
                .unwrap_or_else(|e| panic!("crates/{name}/Cargo.toml: {e}"));
        assert_eq!(
            readme_deps,
            workspace_dependencies(&manifest),
            "README's layout row of crates/{name} names other dependencies than its Cargo.toml"
        );
    }
}

#[test]
fn readme_layout_row_of_the_binary_matches_its_manifest() {
    let readme = fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let rows = readme_layout_rows(&readme);
    let Some((_, readme_deps)) = rows.iter().find(|(path, _)| path == "src/") else {
        panic!("README's layout table has no `src/` row");
    };
    let manifest = fs::read_to_string(repo_root().join("Cargo.toml")).expect("Cargo.toml");
    assert_eq!(
        readme_deps,
        &workspace_dependencies(&manifest),
        "README's layout row of src/ names other dependencies than the root Cargo.toml"
    );
}
