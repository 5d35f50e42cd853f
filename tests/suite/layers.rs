//! The layers of `src/` (ARCHITECTURE.md): each folder uses only itself
//! and the folders below it, and no files import each other in a circle.
//! Read from the source's own `crate::` paths (test modules left out);
//! needs no cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top; a folder may use those before it. The root files
/// (`lib.rs`, `error.rs`, `sync.rs`) import no layer.
const LAYERS: &[&str] = &[
    "api",
    "ops",
    "cache",
    "core",
    "cluster",
    "controller",
    "cli",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path under `src/` (`core/plan.rs` → `["core", "plan"]`,
/// `core/mod.rs` → `["core"]`, `lib.rs` → `[]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("a file under src");
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The text without `#[cfg(test)] mod … { … }` blocks and line comments.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at..];
        let Some(open) = after.find('{') else { break };
        if !after[..open].contains("mod ") {
            out.push_str(&rest[..at + "#[cfg(test)]".len()]);
            rest = &rest[at + "#[cfg(test)]".len()..];
            continue;
        }
        out.push_str(&rest[..at]);
        let mut depth = 0;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules a file names by `crate::` paths, grouped imports included.
fn imports(text: &str, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let end = rest
            .find(|c: char| {
                !(c.is_alphanumeric()
                    || c == '_'
                    || c == ':'
                    || c == '{'
                    || c == ','
                    || c == ' '
                    || c == '\n')
            })
            .unwrap_or(rest.len());
        let path = &rest[..end];
        match path.split_once('{') {
            Some((base, group)) => {
                let group = group.split('}').next().unwrap_or_default();
                for item in group.split(',') {
                    paths.push(format!("{base}{}", item.trim()));
                }
            }
            None => paths.push(path.to_owned()),
        }
    }
    paths
        .iter()
        .filter_map(|path| {
            let parts: Vec<String> = path
                .split("::")
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect();
            (1..=parts.len())
                .rev()
                .map(|n| parts[..n].to_vec())
                .find(|prefix| modules.contains(prefix))
        })
        .collect()
}

fn layer_of(module: &[String]) -> Option<usize> {
    let top = module.first()?;
    if module.len() == 1 && !LAYERS.contains(&top.as_str()) {
        return None; // a root file
    }
    LAYERS.iter().position(|layer| layer == top)
}

fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(&src, f), f.clone()))
        .collect();
    let names: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(module, file)| {
            let text = std::fs::read_to_string(file).expect("a source file");
            let used = imports(&without_tests(&text), &names)
                .into_iter()
                // A module's own children are part of it.
                .filter(|used| used != module && !used.starts_with(module))
                .collect();
            (module.clone(), used)
        })
        .collect()
}

#[test]
fn every_folder_uses_only_itself_and_the_folders_below() {
    let graph = graph();
    assert!(graph.len() > 40, "src/ read: {} modules", graph.len());
    let mut upward = Vec::new();
    for (module, used) in &graph {
        let Some(from) = layer_of(module) else {
            // Root files import no layer.
            for target in used {
                if layer_of(target).is_some() {
                    upward.push(format!(
                        "{} (a root file) -> {}",
                        module.join("/"),
                        target.join("/")
                    ));
                }
            }
            continue;
        };
        for target in used {
            if layer_of(target).is_some_and(|to| to > from) {
                upward.push(format!("{} -> {}", module.join("/"), target.join("/")));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that go up a layer ({}):\n{}",
        LAYERS.join(" < "),
        upward.join("\n")
    );
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let graph = graph();
    // Depth-first search for a back edge; the first circle found is named.
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(
                path[at..]
                    .iter()
                    .chain([node])
                    .map(|m| m.join("/"))
                    .collect(),
            );
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(circle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            panic!("files that import each other: {}", circle.join(" -> "));
        }
    }
}
