//! YAML that every reader takes for what was meant: kubectl, Helm and
//! PyYAML read YAML 1.1, where `yes`, `on`, `y`, `~`, `1_000`, `1:30` or
//! `2001-12-14` are no strings, and most other readers YAML 1.2. A string
//! is written plain only where both read it as that string (letters first,
//! then letters, digits, `.`, `_`, `/`, `-`, and none of YAML 1.1's words);
//! a multi-line string as a literal block where that keeps it exactly;
//! every other string double-quoted, with JSON's escapes (which both read).
//! Neither `serde_yaml` nor its forks quote what YAML 1.1 reads otherwise.

use std::fmt::Write as _;

use serde_json::Value;

/// `value` as a YAML document (block style), ending in a newline.
pub(crate) fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => mapping(&mut out, map, 0, false),
        Value::Array(items) if !items.is_empty() => sequence(&mut out, items, 0),
        scalar => {
            out.push_str(&inline(scalar, 2));
            out.push('\n');
        }
    }
    out
}

/// The keys of `map` at `indent`; the first on the current line if
/// `first_inline` (a sequence item's, after its `- `).
fn mapping(
    out: &mut String,
    map: &serde_json::Map<String, Value>,
    indent: usize,
    first_inline: bool,
) {
    for (index, (key, value)) in map.iter().enumerate() {
        if index > 0 || !first_inline {
            pad(out, indent);
        }
        out.push_str(&key_string(key));
        out.push(':');
        nested(out, value, indent + 2, true);
    }
}

fn sequence(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        pad(out, indent);
        out.push('-');
        nested(out, item, indent + 2, false);
    }
}

/// A value after `key:` or `-`: a non-empty collection on the lines below
/// (a sequence item's mapping starts on its `- ` line), a scalar inline.
fn nested(out: &mut String, value: &Value, indent: usize, after_key: bool) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push(if after_key { '\n' } else { ' ' });
            mapping(out, map, indent, !after_key);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            // A sequence under a key sits at the key's own indentation.
            sequence(out, items, if after_key { indent - 2 } else { indent });
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar, indent));
            out.push('\n');
        }
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn inline(value: &Value, indent: usize) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s, indent),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

/// A string as a value whose block lines (if any) are indented `indent`.
fn string(s: &str, indent: usize) -> String {
    if plain(s) {
        return s.to_owned();
    }
    literal_block(s, indent).unwrap_or_else(|| double_quoted(s))
}

/// A string as a key: plain or double-quoted (a block is no key).
fn key_string(s: &str) -> String {
    if plain(s) {
        s.to_owned()
    } else {
        double_quoted(s)
    }
}

/// `"..."` with `\` and `"` escaped, and every character YAML may not
/// hold raw (controls, DEL, C1, the byte-order mark) as `\uXXXX`: escapes
/// YAML 1.1 and 1.2 read alike.
fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || c == '\u{feff}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// YAML 1.1's words for true, false and null (any case is taken here, a
/// superset of the forms it reads so).
const WORDS: [&str; 9] = ["y", "n", "yes", "no", "true", "false", "on", "off", "null"];

/// Whether `s` reads as itself written plain, in YAML 1.1 and 1.2 alike:
/// it starts with a letter (no number, timestamp, `.inf`, `~`, `<<` or
/// indicator does), holds no `:`, `#` or space, and is no word of YAML
/// 1.1's.
fn plain(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !WORDS.iter().any(|w| w.eq_ignore_ascii_case(s))
}

/// `s` as a literal block (`|` keeping its one final newline, `|-` for
/// none) where that reads back exactly: printable text, no tab or carriage
/// return, no line ending in a space, the first not starting with one, and
/// at most one final newline.
fn literal_block(s: &str, indent: usize) -> Option<String> {
    if !s.contains('\n')
        || s.ends_with("\n\n")
        || s.starts_with([' ', '\n'])
        || s.chars().any(|c| c.is_control() && c != '\n')
        || s.lines().any(|line| line.ends_with(' '))
    {
        return None;
    }
    let (body, chomp) = match s.strip_suffix('\n') {
        Some(body) => (body, "|"),
        None => (s, "|-"),
    };
    let mut out = chomp.to_owned();
    for line in body.split('\n') {
        out.push('\n');
        if !line.is_empty() {
            let _ = write!(out, "{:indent$}{line}", "");
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use serde_json::json;

    /// Every form YAML 1.1 reads as no string (bools, nulls, numbers in each
    /// notation, sexagesimals, timestamps, merge and value keys), and some
    /// that YAML 1.2 reads so.
    const SPECIAL: &[&str] = &[
        "y",
        "Y",
        "yes",
        "Yes",
        "YES",
        "n",
        "N",
        "no",
        "No",
        "NO",
        "true",
        "True",
        "TRUE",
        "false",
        "False",
        "FALSE",
        "on",
        "On",
        "ON",
        "off",
        "Off",
        "OFF",
        "~",
        "null",
        "Null",
        "NULL",
        "",
        "1",
        "-1",
        "+1",
        "1.0",
        "1e3",
        "1.5E+3",
        "0x1F",
        "0o17",
        "017",
        "0b101",
        "1_000",
        "1:30",
        "190:20:30.15",
        "-1:30",
        ".inf",
        "-.Inf",
        "+.INF",
        ".NaN",
        ".nan",
        "2001-12-14",
        "2001-12-14t21:59:43.10-05:00",
        "2001-12-14 21:59:43.10 -5",
        "<<",
        "=",
        "-",
        "?",
        ":",
        "a: b",
        "#x",
        "x #y",
        "'q'",
        "\"q\"",
        "@x",
        "`x`",
        "!x",
        "&x",
        "*x",
        "%x",
        "|",
        ">",
        "[x]",
        "{x}",
        "x,y",
        " lead",
        "trail ",
        "two\nlines",
        "end\n",
        "tab\tx",
        "é",
        "0",
        "00",
        "1.",
        ".5",
        "1__0",
        "0.1.2",
        "v1.0",
        "x-1",
        "a/b",
        "a.b",
    ];

    fn rule_with_labels(labels: &[(String, String)]) -> Value {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        json!({
            "apiVersion": "flant.com/v1",
            "kind": "CopyratorRule",
            "metadata": {"name": "r", "labels": labels.clone()},
            "spec": {
                "ruleType": "configmap",
                "selector": labels.clone(),
                "targets": {"namespaceSelector": {"matchLabels": labels}},
                "transform": {"keys": {"include": ["a*", "b"]}},
                "description": "two\nlines\n",
            },
        })
    }

    /// Label keys and values: the special forms, and strings of the
    /// characters labels and YAML care about.
    fn label() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(SPECIAL).prop_map(str::to_owned),
            "[a-zA-Z0-9._/:+~ -]{0,12}",
            "[0-9][0-9._:eExXoObB+-]{0,8}",
        ]
    }

    fn cases(count: usize) -> Vec<Value> {
        let strategy = proptest::collection::vec((label(), label()), 1..6);
        let mut runner = TestRunner::deterministic();
        let mut out: Vec<Value> = SPECIAL
            .iter()
            .map(|s| rule_with_labels(&[((*s).to_owned(), (*s).to_owned())]))
            .collect();
        for _ in 0..count {
            let tree = strategy.new_tree(&mut runner).expect("a case");
            out.push(rule_with_labels(&tree.current()));
        }
        out
    }

    #[test]
    fn every_document_reads_back_as_itself_under_yaml_1_2() {
        for case in cases(500) {
            let text = to_string(&case);
            let read: Value =
                serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{e}: not YAML:\n{text}"));
            assert_eq!(read, case, "read otherwise:\n{text}");
        }
    }

    /// PyYAML is the YAML 1.1 reader at hand (kubectl's and Helm's read
    /// 1.1 as well); `hack/test` installs it where it is missing.
    #[test]
    fn every_document_reads_back_as_itself_under_yaml_1_1() {
        let cases = cases(2_000);
        let stream: String = cases
            .iter()
            .map(|case| format!("---\n{}", to_string(case)))
            .collect();
        let script = "import json, sys, yaml\n\
            docs = list(yaml.safe_load_all(sys.stdin.read()))\n\
            json.dump(docs, sys.stdout)\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs (hack/test installs PyYAML)");
        let mut stdin = child.stdin.take().expect("a stdin");
        let writer = std::thread::spawn(move || {
            use std::io::Write as _;
            stdin
                .write_all(stream.as_bytes())
                .expect("the documents written")
        });
        let output = child.wait_with_output().expect("python3 ends");
        writer.join().expect("the writer ends");
        assert!(
            output.status.success(),
            "PyYAML: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let read: Vec<Value> = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(read.len(), cases.len());
        for (read, case) in read.iter().zip(&cases) {
            assert_eq!(
                read,
                case,
                "read otherwise under YAML 1.1:\n{}",
                to_string(case)
            );
        }
    }

    #[test]
    fn plain_where_both_read_a_string_quoted_elsewhere() {
        let text = to_string(&json!({"matchLabels": {"adopt": "yes", "team": "web", "v": "1.0"}}));
        assert_eq!(
            text,
            "matchLabels:\n  adopt: \"yes\"\n  team: web\n  v: \"1.0\"\n"
        );
        let text =
            to_string(&json!({"list": [{"a": 1, "b": [true, null]}, "x"], "e": {}, "f": []}));
        assert_eq!(
            text,
            "e: {}\nf: []\nlist:\n- a: 1\n  b:\n  - true\n  - null\n- x\n"
        );
        assert_eq!(
            to_string(&json!({"d": "one\ntwo\n", "e": "one\n\ntwo"})),
            "d: |\n  one\n  two\ne: |-\n  one\n\n  two\n"
        );
    }
}
