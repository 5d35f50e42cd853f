//! The import corpus: public configurations of each tool, collected with
//! their provenance in `tests/data/import-corpus/<tool>/`, each with the
//! outcome the tool's own behaviour calls for in its header (`# expected:
//! rule`, `unmapped` or `nothing`). Every case is either converted (and the
//! rules resolve) or reported, as its header says; `tests/suite/migration.rs`
//! applies what `import` prints for each with kubectl.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::shared::tests::{assert_rules_resolve, options};
use super::{Imported, SourceReport, import};

/// At least this many configurations, and this many of each tool.
const AT_LEAST: usize = 25;
const AT_LEAST_PER_TOOL: usize = 3;

/// The tools, as the corpus's directories and the reports name them.
const TOOLS: [(&str, &str); 5] = [
    ("kyverno", "Kyverno"),
    ("reflector", "kubernetes-reflector"),
    ("replicator", "kubernetes-replicator"),
    ("config-syncer", "config-syncer"),
    ("cluster-secret", "ClusterSecret"),
];

pub(crate) fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/import-corpus")
}

/// Every corpus file, sorted.
pub(crate) fn corpus_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for (dir, _) in TOOLS {
        let Ok(entries) = std::fs::read_dir(corpus_dir().join(dir)) else {
            continue;
        };
        files.extend(
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml")),
        );
    }
    files.sort();
    files
}

/// A header line `# NAME: value`.
fn header(text: &str, name: &str) -> Option<String> {
    text.lines()
        .take_while(|l| l.starts_with('#') || l.trim().is_empty())
        .find_map(|l| l.strip_prefix(&format!("# {name}:")))
        .map(|v| v.trim().to_owned())
}

fn documents(path: &Path, text: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(document)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
        match value {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                objects.extend(
                    o.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            other => objects.push(other),
        }
    }
    objects
}

fn lines(report: &SourceReport) -> impl Iterator<Item = &String> {
    report
        .exact
        .iter()
        .chain(&report.differs)
        .chain(&report.unmapped)
}

/// Whether the reports say that nothing is copied.
fn says_nothing_is_copied(imported: &Imported) -> bool {
    imported.reports.iter().flat_map(lines).any(|l| {
        ["copies nothing", "copy nothing", "makes no mirrors"]
            .iter()
            .any(|s| l.contains(s))
    })
}

/// Where one corpus file's import departs from its header.
fn check(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading: {e}"))?;
    let provenance = header(&text, "provenance").unwrap_or_default();
    if !provenance.starts_with("https://") {
        return Err(format!(
            "no '# provenance: https://...' header ({provenance:?})"
        ));
    }
    let tool_dir = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let tool = TOOLS
        .iter()
        .find(|(dir, _)| *dir == tool_dir)
        .map(|(_, name)| *name)
        .ok_or_else(|| format!("{tool_dir} is no tool of the corpus"))?;
    let expected = header(&text, "expected").unwrap_or_default();
    let imported = import(&documents(path, &text), &options());
    assert_rules_resolve(&imported);
    if imported.reports.is_empty() {
        return Err("import reports nothing of it".into());
    }
    if let Some(other) = imported.reports.iter().find(|r| r.tool != tool) {
        return Err(format!("a report of {} in a {tool} file", other.tool));
    }
    if let Some(silent) = imported.reports.iter().find(|r| lines(r).next().is_none()) {
        return Err(format!("the report of {} says nothing", silent.source));
    }
    let outcome = expected.split_whitespace().next().unwrap_or_default();
    let unmapped = imported.reports.iter().any(|r| !r.unmapped.is_empty());
    match outcome {
        "rule" if imported.rules.is_empty() => Err(format!(
            "expected a rule, none made: {:#?}",
            imported.reports
        )),
        "unmapped" if !imported.rules.is_empty() || !unmapped => Err(format!(
            "expected unmapped, got {} rules: {:#?}",
            imported.rules.len(),
            imported.reports
        )),
        "nothing" if !imported.rules.is_empty() || !says_nothing_is_copied(&imported) => {
            Err(format!(
                "expected 'copies nothing', got {} rules: {:#?}",
                imported.rules.len(),
                imported.reports
            ))
        }
        "rule" | "unmapped" | "nothing" => Ok(()),
        other => Err(format!(
            "'# expected:' is {other:?}, not rule, unmapped or nothing"
        )),
    }
}

#[test]
fn every_public_configuration_of_the_corpus_is_converted_or_reported_as_its_header_says() {
    let files = corpus_files();
    let mut failures = Vec::new();
    for path in &files {
        if let Err(why) = check(path) {
            failures.push(format!("{}: {why}", path.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        files.len() >= AT_LEAST,
        "{} corpus files, at least {AT_LEAST}",
        files.len()
    );
    for (dir, _) in TOOLS {
        let of_tool = files
            .iter()
            .filter(|f| {
                f.parent()
                    .and_then(Path::file_name)
                    .is_some_and(|n| n == dir)
            })
            .count();
        assert!(
            of_tool >= AT_LEAST_PER_TOOL,
            "{of_tool} {dir} files, at least {AT_LEAST_PER_TOOL}"
        );
    }
}
