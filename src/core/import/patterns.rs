//! Other tools' namespace patterns as Copyrator's globs, and label
//! selectors written as text (`env=prod,tier notin (a,b)`) or as JSON, as
//! rule selectors.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use serde_json::{Value, json};

use crate::api::selector::{Glob, LabelSelector};

/// How a tool applies a regular expression to a namespace's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Anchoring {
    /// The leftmost match must cover the whole name (reflector: .NET
    /// `Regex.Match` and a length check); alternatives are tried in order.
    Whole,
    /// `^` and `$` are added to the text where it lacks them (replicator):
    /// in `a|b` they bind to the first and the last alternative only.
    Strict,
    /// A match at the start of the name is enough (ClusterSecret: Python
    /// `re.match`).
    Start,
}

/// A pattern as globs that match exactly the namespace names it matches.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Globs {
    pub(super) globs: Vec<String>,
    /// What is worth saying about how they were found.
    pub(super) notes: Vec<String>,
}

/// Why no globs match exactly what a pattern matches, and the closest
/// ones, which match more.
#[derive(Debug, PartialEq)]
pub(super) struct Inexact {
    pub(super) why: String,
    pub(super) closest: Vec<String>,
    /// The pattern is no regular expression at all: the tool that reads
    /// it fails on it.
    pub(super) not_a_regex: bool,
}

/// One element of an alternative, as far as globs are concerned.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Atom {
    Char(char),
    /// `.`
    AnyOne,
    /// `.*`
    AnyRun,
    /// What no glob says (a class, a group, a repeated character); the
    /// character it cannot match without, if one.
    Opaque(Option<char>),
}

#[derive(Debug, Default)]
struct Alternative {
    starts: bool,
    ends: bool,
    atoms: Vec<Atom>,
}

/// The globs that match exactly the names `pattern` matches as `anchoring` says.
pub(super) fn regex_globs(pattern: &str, anchoring: Anchoring) -> Result<Globs, Inexact> {
    let not_a_regex = |why| Inexact {
        why,
        closest: Vec::new(),
        not_a_regex: true,
    };
    let texts = split_alternatives(pattern).map_err(not_a_regex)?;
    let alternatives = texts
        .iter()
        .map(|text| parse_alternative(text))
        .collect::<Result<Vec<_>, _>>()
        .map_err(not_a_regex)?;
    let mut out = Globs::default();
    let mut inexact = Vec::new();
    let mut closest = Vec::new();
    let mut shadowing = Vec::new();
    for (index, alternative) in alternatives.iter().enumerate() {
        let place = Place {
            pattern,
            text: &texts[index],
            first: index == 0,
            last: index + 1 == alternatives.len(),
            alternated: alternatives.len() > 1,
        };
        match place.outcome(alternative, anchoring, &mut shadowing) {
            Outcome::Glob(glob) => {
                if !glob.is_empty() && !out.globs.contains(&glob) {
                    out.globs.push(glob.clone());
                }
                closest.push(glob);
            }
            Outcome::Nothing(note) => out.notes.push(note),
            Outcome::Inexact(why, glob) => {
                inexact.push(why);
                closest.push(glob);
            }
        }
    }
    if inexact.is_empty() {
        return Ok(out);
    }
    closest.retain(|g| Glob::new(g).is_ok());
    closest.dedup();
    Err(Inexact {
        why: inexact.join("; "),
        closest,
        not_a_regex: false,
    })
}

/// Where an alternative stands in its pattern.
struct Place<'a> {
    pattern: &'a str,
    text: &'a str,
    first: bool,
    last: bool,
    alternated: bool,
}

/// What one alternative comes to.
enum Outcome {
    /// This glob (empty: it matches no name).
    Glob(String),
    /// It matches no namespace, for the reason said.
    Nothing(String),
    /// No glob says it, for the reason said; the closest glob.
    Inexact(String, String),
}

impl Place<'_> {
    fn outcome(
        &self,
        alternative: &Alternative,
        anchoring: Anchoring,
        shadowing: &mut Vec<String>,
    ) -> Outcome {
        let (pattern, text) = (self.pattern, self.text);
        if let Some(c) = impossible_char(&alternative.atoms) {
            return Outcome::Nothing(format!(
                "{pattern:?}: {text:?} matches no namespace ({c:?} never occurs in a namespace name)"
            ));
        }
        let (starts, ends) = match anchoring {
            Anchoring::Whole => (true, true),
            Anchoring::Strict => (
                alternative.starts || self.first,
                alternative.ends || self.last,
            ),
            Anchoring::Start => (true, alternative.ends),
        };
        let glob = anchored(&core(&alternative.atoms), starts, ends);
        let it = if self.alternated {
            format!("{text:?}")
        } else {
            "it".to_owned()
        };
        if alternative
            .atoms
            .iter()
            .any(|a| matches!(a, Atom::Opaque(_)))
        {
            return Outcome::Inexact(
                format!(
                    "{it} uses what a glob cannot say: a class, a group, a repeated character or an anchor inside"
                ),
                glob,
            );
        }
        if anchoring == Anchoring::Whole && self.alternated {
            match whole_alternative(alternative, shadowing) {
                Some(Shadow::Wildcard) => {
                    return Outcome::Inexact(
                        format!(
                            "{text:?} has a wildcard in an alternation: reflector takes the first alternative that matches at the start, which need not cover the whole name"
                        ),
                        glob,
                    );
                }
                Some(Shadow::By(earlier)) => {
                    return Outcome::Nothing(format!(
                        "{pattern:?}: {text:?} never matches, as {earlier:?} is tried first and matches the start of the name"
                    ));
                }
                None => {}
            }
        }
        if !glob.is_empty() && Glob::new(&glob).is_err() {
            return Outcome::Inexact(format!("{it} makes no valid glob ({glob:?})"), glob);
        }
        Outcome::Glob(glob)
    }
}

enum Shadow {
    Wildcard,
    By(String),
}

/// Whether a literal alternative of reflector's can match a whole name:
/// not when an earlier one is a part of its start (that one is taken, and
/// its match is shorter than the name).
fn whole_alternative(alternative: &Alternative, shadowing: &mut Vec<String>) -> Option<Shadow> {
    if alternative
        .atoms
        .iter()
        .any(|a| matches!(a, Atom::AnyOne | Atom::AnyRun))
    {
        return Some(Shadow::Wildcard);
    }
    let literal = core(&alternative.atoms);
    if let Some(earlier) = shadowing
        .iter()
        .find(|e| literal.starts_with(e.as_str()) && literal.len() > e.len())
    {
        return Some(Shadow::By(earlier.clone()));
    }
    // An alternative ending in `$` matches only the whole name, so it
    // never takes a longer name's match.
    if !alternative.ends {
        shadowing.push(literal);
    }
    None
}

/// Each pattern of a list, as globs; those no glob says exactly, apart.
#[derive(Debug, Default)]
pub(super) struct PatternList {
    pub(super) globs: Vec<String>,
    pub(super) notes: Vec<String>,
    pub(super) inexact: Vec<(String, Inexact)>,
}

pub(super) fn pattern_list<'a>(
    patterns: impl IntoIterator<Item = &'a str>,
    anchoring: Anchoring,
) -> PatternList {
    let mut list = PatternList::default();
    for pattern in patterns {
        match regex_globs(pattern, anchoring) {
            Ok(found) => {
                for glob in found.globs {
                    if !list.globs.contains(&glob) {
                        list.globs.push(glob);
                    }
                }
                list.notes.extend(found.notes);
            }
            Err(inexact) => list.inexact.push((pattern.to_owned(), inexact)),
        }
    }
    list
}

impl PatternList {
    /// Whether the patterns match `name`: surely (an exact glob does),
    /// surely not (neither an exact glob nor the closest ones of the rest,
    /// which match more), or `None` when that cannot be told.
    pub(super) fn matches(&self, name: &str) -> Option<bool> {
        let any = |globs: &[String]| {
            globs
                .iter()
                .filter_map(|g| Glob::new(g).ok())
                .any(|g| g.matches(name))
        };
        if any(&self.globs) {
            return Some(true);
        }
        let told = self
            .inexact
            .iter()
            .all(|(_, inexact)| !inexact.closest.is_empty() && !any(&inexact.closest));
        told.then_some(false)
    }

    /// A line for each pattern left out, saying the closest globs.
    pub(super) fn inexact_lines(&self, left_out: &str) -> Vec<String> {
        self.inexact
            .iter()
            .map(|(pattern, inexact)| {
                let closest = if inexact.closest.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the closest globs, which match more, are {}",
                        inexact.closest.join(", ")
                    )
                };
                format!(
                    "pattern {pattern:?} has no exact glob ({}): {left_out}{closest}",
                    inexact.why
                )
            })
            .collect()
    }
}

/// The globs of the names a pattern that says only "every namespace but
/// these" leaves out: a negative lookahead of plain names (`(?!a|b).*`,
/// `^(?!(a|b)$).*$`), as each tool anchors it (each reads it alike: the
/// match must start at the name's start). A name followed by `$` inside
/// the lookahead leaves out that name alone, one without leaves out every
/// name it starts (`b*`). `None` for any other pattern.
pub(super) fn everything_but(pattern: &str) -> Option<Vec<String>> {
    let text = pattern.trim();
    let text = text.strip_prefix('^').unwrap_or(text);
    let rest = text.strip_prefix("(?!")?;
    let close = closing_paren(rest)?;
    let (inner, after) = (&rest[..close], &rest[close + 1..]);
    let after = after.strip_suffix('$').unwrap_or(after);
    if after != ".*" && after != ".+" {
        return None;
    }
    let (inner, all_whole) = match inner.strip_suffix('$') {
        Some(inner) => (inner, true),
        None => (inner, false),
    };
    let inner = match inner.strip_prefix('(') {
        Some(grouped) if closing_paren(grouped) == Some(grouped.len() - 1) => {
            let grouped = &grouped[..grouped.len() - 1];
            grouped.strip_prefix("?:").unwrap_or(grouped)
        }
        _ => inner,
    };
    let mut globs = Vec::new();
    for alternative in inner.split('|') {
        let (name, whole) = match alternative.strip_suffix('$') {
            Some(name) => (name, true),
            None => (alternative, all_whole),
        };
        if name.is_empty() || !name.chars().all(is_namespace_char) {
            return None;
        }
        globs.push(if whole {
            name.to_owned()
        } else {
            format!("{name}*")
        });
    }
    Some(globs)
}

/// Where the group opened just before `text` closes, if it does.
fn closing_paren(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `core` with the wildcards that the anchors leave open around it.
fn anchored(core: &str, starts: bool, ends: bool) -> String {
    let mut glob = String::new();
    if !starts {
        glob.push('*');
    }
    glob.push_str(core);
    if !ends {
        glob.push('*');
    }
    while glob.contains("**") {
        glob = glob.replace("**", "*");
    }
    glob
}

/// The glob of the atoms; what no glob says becomes `*`.
fn core(atoms: &[Atom]) -> String {
    atoms
        .iter()
        .map(|atom| match atom {
            Atom::Char(c) => c.to_string(),
            Atom::AnyOne => "?".to_owned(),
            Atom::AnyRun | Atom::Opaque(_) => "*".to_owned(),
        })
        .collect()
}

/// A character every match needs and no namespace name holds.
fn impossible_char(atoms: &[Atom]) -> Option<char> {
    atoms.iter().find_map(|atom| match atom {
        Atom::Char(c) | Atom::Opaque(Some(c)) if !is_namespace_char(*c) => Some(*c),
        _ => None,
    })
}

fn is_namespace_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// The alternatives of `pattern` at its top level.
fn split_alternatives(pattern: &str) -> Result<Vec<String>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '[' => i = class_end(&chars, i)?,
            '(' => i = group_end(&chars, i)?,
            '|' => {
                parts.push(chars[start..i].iter().collect());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(chars[start..].iter().collect());
    Ok(parts)
}

/// The index of the `]` that closes the class opened at `open`.
fn class_end(chars: &[char], open: usize) -> Result<usize, String> {
    let mut i = open + 1;
    if chars.get(i) == Some(&'^') {
        i += 1;
    }
    if chars.get(i) == Some(&']') {
        i += 1;
    }
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            ']' => return Ok(i),
            _ => {}
        }
        i += 1;
    }
    Err("a '[' is never closed".to_owned())
}

/// The index of the `)` that closes the group opened at `open`.
fn group_end(chars: &[char], open: usize) -> Result<usize, String> {
    let mut depth = 0;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '[' => i = class_end(chars, i)?,
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Err("a '(' is never closed".to_owned())
}

fn parse_alternative(text: &str) -> Result<Alternative, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut alternative = Alternative::default();
    let mut i = 0;
    if chars.first() == Some(&'^') {
        alternative.starts = true;
        i = 1;
    }
    let mut end = chars.len();
    let escapes_before = chars[..end.saturating_sub(1)]
        .iter()
        .rev()
        .take_while(|c| **c == '\\')
        .count();
    if end > i && chars[end - 1] == '$' && escapes_before % 2 == 0 {
        alternative.ends = true;
        end -= 1;
    }
    while i < end {
        let (atom, next) = atom_at(&chars[..end], i)?;
        i = quantified(atom, &chars[..end], next, &mut alternative.atoms)?;
    }
    Ok(alternative)
}

/// The atom at `i` and the index after it.
fn atom_at(chars: &[char], i: usize) -> Result<(Atom, usize), String> {
    Ok(match chars[i] {
        '\\' => match chars.get(i + 1) {
            None => return Err("it ends in a lone '\\'".to_owned()),
            Some(e) if e.is_ascii_alphanumeric() => (Atom::Opaque(None), i + 2),
            Some(e) => (Atom::Char(*e), i + 2),
        },
        '.' => (Atom::AnyOne, i + 1),
        '[' => (Atom::Opaque(None), class_end(chars, i)? + 1),
        '(' => (Atom::Opaque(None), group_end(chars, i)? + 1),
        '*' | '+' | '?' => return Err(format!("a {:?} repeats nothing", chars[i])),
        ')' => return Err("a ')' closes nothing".to_owned()),
        '^' | '$' => (Atom::Opaque(None), i + 1),
        c => (Atom::Char(c), i + 1),
    })
}

/// Push `atom` as a quantifier after it changes it; the index after both.
fn quantified(
    atom: Atom,
    chars: &[char],
    next: usize,
    atoms: &mut Vec<Atom>,
) -> Result<usize, String> {
    let Some(&q) = chars
        .get(next)
        .filter(|c| matches!(c, '*' | '+' | '?' | '{'))
    else {
        atoms.push(atom);
        return Ok(next);
    };
    let mut after = next + 1;
    if q == '{' {
        after = chars[next..]
            .iter()
            .position(|c| *c == '}')
            .map(|p| next + p + 1)
            .ok_or("a '{' is never closed")?;
    }
    // A lazy or possessive quantifier takes another match than the greedy one.
    let lazy = matches!(chars.get(after), Some('?' | '+'));
    if lazy {
        after += 1;
    }
    let changed: &[Atom] = match (atom, q, lazy) {
        (Atom::AnyOne, '*', false) => &[Atom::AnyRun],
        (Atom::AnyOne, '+', false) => &[Atom::AnyOne, Atom::AnyRun],
        (Atom::Char(c) | Atom::Opaque(Some(c)), '+', _) => &[Atom::Opaque(Some(c))],
        _ => &[Atom::Opaque(None)],
    };
    atoms.extend_from_slice(changed);
    Ok(after)
}

/// A label selector: labels that must be equal, and expressions.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Selector {
    labels: BTreeMap<String, String>,
    expressions: Vec<Expression>,
}

#[derive(Clone, Debug, PartialEq)]
struct Expression {
    key: String,
    operator: &'static str,
    values: Vec<String>,
}

impl Selector {
    /// A selector in the API server's text form; `None` when it is empty
    /// (it selects everything).
    pub(super) fn parse(text: &str) -> Result<Option<Self>, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let mut selector = Self::default();
        for requirement in split_requirements(text)? {
            selector.add(&requirement)?;
        }
        selector.validate()?;
        Ok(Some(selector))
    }

    fn add(&mut self, requirement: &str) -> Result<(), String> {
        let requirement = requirement.trim();
        let expression = |key: &str, operator, values: Vec<String>| Expression {
            key: key.trim().to_owned(),
            operator,
            values,
        };
        if let Some(key) = requirement.strip_prefix('!') {
            self.expressions
                .push(expression(key, "DoesNotExist", Vec::new()));
        } else if let Some((head, rest)) = requirement.split_once('(') {
            let values = rest
                .strip_suffix(')')
                .ok_or_else(|| format!("{requirement:?} does not end in ')'"))?
                .split(',')
                .map(|v| v.trim().to_owned())
                .collect();
            let mut words = head.split_whitespace();
            let (Some(key), Some(operator), None) = (words.next(), words.next(), words.next())
            else {
                return Err(format!(
                    "{requirement:?} is not 'key in (...)' or 'key notin (...)'"
                ));
            };
            let operator = match operator {
                "in" => "In",
                "notin" => "NotIn",
                other => return Err(format!("{other:?} is not in or notin")),
            };
            self.expressions.push(expression(key, operator, values));
        } else if let Some((key, value)) = requirement.split_once("!=") {
            self.expressions
                .push(expression(key, "NotIn", vec![value.trim().to_owned()]));
        } else if let Some((key, value)) = requirement
            .split_once("==")
            .or_else(|| requirement.split_once('='))
        {
            self.require(key.trim(), value.trim());
        } else if requirement.contains(['<', '>']) {
            return Err(format!(
                "{requirement:?} compares numbers, which a rule's selector cannot"
            ));
        } else {
            self.expressions
                .push(expression(requirement, "Exists", Vec::new()));
        }
        Ok(())
    }

    fn require(&mut self, key: &str, value: &str) {
        match self.labels.get(key) {
            Some(known) if known != value => self.expressions.push(Expression {
                key: key.to_owned(),
                operator: "In",
                values: vec![value.to_owned()],
            }),
            _ => {
                self.labels.insert(key.to_owned(), value.to_owned());
            }
        }
    }

    /// A Kubernetes label selector as JSON (`matchLabels`, `matchExpressions`).
    pub(super) fn from_json(value: &Value) -> Result<Self, String> {
        let parsed: metav1::LabelSelector = serde_json::from_value(value.clone())
            .map_err(|e| format!("not a label selector: {e}"))?;
        let mut selector = Self::default();
        for (key, value) in parsed.match_labels.unwrap_or_default() {
            selector.require(&key, &value);
        }
        for expression in parsed.match_expressions.unwrap_or_default() {
            let operator = match expression.operator.as_str() {
                "In" => "In",
                "NotIn" => "NotIn",
                "Exists" => "Exists",
                "DoesNotExist" => "DoesNotExist",
                other => return Err(format!("unknown operator {other:?}")),
            };
            selector.expressions.push(Expression {
                key: expression.key,
                operator,
                values: expression.values.unwrap_or_default(),
            });
        }
        selector.validate()?;
        Ok(selector)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.expressions.is_empty()
    }

    /// Both selectors at once.
    pub(super) fn and(mut self, other: &Self) -> Self {
        for (key, value) in &other.labels {
            self.require(key, value);
        }
        for expression in &other.expressions {
            if !self.expressions.contains(expression) {
                self.expressions.push(expression.clone());
            }
        }
        self
    }

    /// What matches where this does not, when one requirement says it.
    pub(super) fn negated(&self) -> Option<Self> {
        let single = match (self.labels.iter().next(), self.expressions.as_slice()) {
            (Some((key, value)), []) if self.labels.len() == 1 => Expression {
                key: key.clone(),
                operator: "In",
                values: vec![value.clone()],
            },
            (None, [expression]) => expression.clone(),
            _ => return None,
        };
        let operator = match single.operator {
            "In" => "NotIn",
            "NotIn" => "In",
            "Exists" => "DoesNotExist",
            _ => "Exists",
        };
        Some(Self {
            labels: BTreeMap::new(),
            expressions: vec![Expression { operator, ..single }],
        })
    }

    pub(super) fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        if !self.labels.is_empty() {
            out.insert("matchLabels".into(), json!(self.labels));
        }
        if !self.expressions.is_empty() {
            let expressions: Vec<Value> = self
                .expressions
                .iter()
                .map(|e| {
                    if e.values.is_empty() {
                        json!({"key": e.key, "operator": e.operator})
                    } else {
                        json!({"key": e.key, "operator": e.operator, "values": e.values})
                    }
                })
                .collect();
            out.insert("matchExpressions".into(), Value::Array(expressions));
        }
        Value::Object(out)
    }

    /// The selector in the API server's text form, for reports.
    pub(super) fn text(&self) -> String {
        let labels = self.labels.iter().map(|(k, v)| format!("{k}={v}"));
        let expressions = self.expressions.iter().map(|e| match e.operator {
            "In" => format!("{} in ({})", e.key, e.values.join(",")),
            "NotIn" => format!("{} notin ({})", e.key, e.values.join(",")),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
        labels.chain(expressions).collect::<Vec<_>>().join(",")
    }

    fn validate(&self) -> Result<(), String> {
        let parsed: metav1::LabelSelector = serde_json::from_value(self.to_json())
            .map_err(|e| format!("not a label selector: {e}"))?;
        LabelSelector::from_k8s(&parsed).map(|_| ())
    }
}

/// The requirements of a selector's text: split at the commas outside parentheses.
fn split_requirements(text: &str) -> Result<Vec<String>, String> {
    let mut parts = Vec::new();
    let mut depth = 0u32;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    if parts.iter().any(|p| p.trim().is_empty()) {
        return Err(format!("{text:?} has an empty requirement"));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn globs(pattern: &str, anchoring: Anchoring) -> Vec<String> {
        regex_globs(pattern, anchoring)
            .map(|g| g.globs)
            .unwrap_or_else(|e| panic!("{pattern:?}: {}", e.why))
    }

    #[test]
    fn literals_and_dot_runs_become_globs_as_each_tool_anchors_them() {
        assert_eq!(globs("team-a", Anchoring::Whole), ["team-a"]);
        assert_eq!(globs("team-.*", Anchoring::Whole), ["team-*"]);
        assert_eq!(globs("^team-.+$", Anchoring::Whole), ["team-?*"]);
        assert_eq!(globs("team-.", Anchoring::Whole), ["team-?"]);
        assert_eq!(globs("team-a", Anchoring::Strict), ["team-a"]);
        // re.match needs a match at the start only.
        assert_eq!(globs("team-a", Anchoring::Start), ["team-a*"]);
        assert_eq!(globs("team-a$", Anchoring::Start), ["team-a"]);
        assert_eq!(globs(".*", Anchoring::Start), ["*"]);
        assert_eq!(globs("cluster.*", Anchoring::Start), ["cluster*"]);
        assert_eq!(globs(r"team\-a", Anchoring::Whole), ["team-a"]);
    }

    #[test]
    fn alternation_follows_each_tools_anchors() {
        assert_eq!(globs("a|b", Anchoring::Start), ["a*", "b*"]);
        // replicator's ^ and $ bind to the first and last alternative.
        assert_eq!(globs("a|b|c", Anchoring::Strict), ["a*", "*b*", "*c"]);
        assert_eq!(globs("^a$|^b$", Anchoring::Strict), ["a", "b"]);
        assert_eq!(globs("ab|cd", Anchoring::Whole), ["ab", "cd"]);
        // reflector takes "ns-1" at the start of "ns-10", shorter than the name.
        let found = regex_globs("ns-1|ns-10", Anchoring::Whole).expect("exact");
        assert_eq!(found.globs, ["ns-1"]);
        assert!(
            found.notes[0].contains("never matches"),
            "{:?}",
            found.notes
        );
        assert_eq!(globs("ns-1$|ns-10", Anchoring::Whole), ["ns-1", "ns-10"]);
    }

    #[test]
    fn a_negative_lookahead_of_plain_names_is_everything_but_them() {
        let cases: [(&str, Option<&[&str]>); 8] = [
            (
                "(?!kube-system|kube-public).*",
                Some(&["kube-system*", "kube-public*"]),
            ),
            (
                "^(?!(kube-system|default)$).*$",
                Some(&["kube-system", "default"]),
            ),
            (
                "^(?!kube-system$|team-a).+",
                Some(&["kube-system", "team-a*"]),
            ),
            ("(?!(?:a|b)$).*", Some(&["a", "b"])),
            ("(?!kube-.*).*", None),
            ("(?!a).*-x", None),
            ("team-.*", None),
            ("(?!a)", None),
        ];
        for (pattern, want) in cases {
            let got = everything_but(pattern);
            let want = want.map(|w| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
            assert_eq!(got, want, "{pattern}");
        }
    }

    #[test]
    fn classes_groups_and_repeated_characters_have_no_exact_glob() {
        for pattern in [
            "namespace-[0-9]*",
            "team-a+",
            "a(b|c)",
            r"team-\d",
            "team-a?",
            "team-.*?",
            "a{2}",
            "a^b",
        ] {
            let inexact = regex_globs(pattern, Anchoring::Whole).expect_err(pattern);
            assert!(!inexact.why.is_empty(), "{pattern}");
        }
        let inexact = regex_globs("namespace-[0-9]*", Anchoring::Whole).expect_err("class");
        assert_eq!(inexact.closest, ["namespace-*"]);
        let inexact = regex_globs("a.*|b", Anchoring::Whole).expect_err("wildcard alternative");
        assert!(inexact.why.contains("first alternative"), "{}", inexact.why);
        assert!(regex_globs("a)", Anchoring::Whole).is_err());
        assert!(regex_globs("*a", Anchoring::Whole).is_err());
    }

    #[test]
    fn a_character_no_namespace_holds_matches_nothing() {
        let found = regex_globs("prefix_ns-.+", Anchoring::Start).expect("nothing is exact");
        assert!(found.globs.is_empty());
        assert!(found.notes[0].contains("'_'"), "{:?}", found.notes);
        // A repeated '-' that may be absent does not save it.
        let found = regex_globs("prefix_ns-*", Anchoring::Start).expect("nothing is exact");
        assert!(found.globs.is_empty());
        let found = regex_globs(r"a\.b|c", Anchoring::Start).expect("exact");
        assert_eq!(found.globs, ["c*"]);
        assert!(
            regex_globs("Team", Anchoring::Whole)
                .expect("exact")
                .globs
                .is_empty()
        );
    }

    #[test]
    fn selectors_in_text_become_rule_selectors() {
        let selector =
            Selector::parse("my-label=value,my-other-label,my-other-label notin (foo,bar)\n")
                .expect("valid")
                .expect("not empty");
        assert_eq!(
            selector.to_json(),
            json!({
                "matchLabels": {"my-label": "value"},
                "matchExpressions": [
                    {"key": "my-other-label", "operator": "Exists"},
                    {"key": "my-other-label", "operator": "NotIn", "values": ["foo", "bar"]}
                ]
            })
        );
        assert_eq!(
            selector.text(),
            "my-label=value,my-other-label,my-other-label notin (foo,bar)"
        );
        let negated = Selector::parse("a!=b,!c,d in (e)")
            .expect("valid")
            .expect("not empty");
        assert_eq!(negated.text(), "a notin (b),!c,d in (e)");
        assert_eq!(Selector::parse(" ").expect("valid"), None);
        for bad in ["a>1", "a,,b", "a in (b", "a almost (b)", "-a=b"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_requirement_is_negated_and_two_are_not() {
        let negate = |text: &str| {
            Selector::parse(text)
                .ok()
                .flatten()
                .and_then(|s| s.negated())
                .map(|s| s.text())
        };
        assert_eq!(negate("a=b").as_deref(), Some("a notin (b)"));
        assert_eq!(negate("a notin (b,c)").as_deref(), Some("a in (b,c)"));
        assert_eq!(negate("a").as_deref(), Some("!a"));
        assert_eq!(negate("!a").as_deref(), Some("a"));
        assert_eq!(negate("a=b,c=d"), None);
    }
}
