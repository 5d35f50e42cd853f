//! `copyrator plan`: the rules it reads from files, which rules it plans,
//! what it reports for them, how the report is printed, and its exit code.
//! Pure; what a rule would do comes from `reconcile::preview` (at home)
//! and `member_pass::member_preview` (in each member).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::api::rule::{CopyratorRule, RuleKey};
use crate::api::{GROUP, KIND, VERSION};
use crate::core::preview::{PlannedChange, Preview, Skip};

/// Exit code when nothing would change.
pub(crate) const EXIT_NO_CHANGES: u8 = 0;
/// Exit code on an error, a bad rule among them.
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code when something would change (for CI).
pub(crate) const EXIT_CHANGES: u8 = 2;

/// UIDs given to the rules of a file that do not exist yet: never a live
/// rule's (those are UUIDs), so no copy of a live rule counts as theirs.
const NEW_RULE_UID_PREFIX: &str = "copyrator-plan-new-";

/// Why `copyrator plan` could not say what would happen.
#[derive(Debug, Error)]
pub(crate) enum PlanError {
    #[error("reading {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{file}, document {document}: not valid YAML: {source}")]
    Yaml {
        file: String,
        document: usize,
        #[source]
        source: serde_yaml::Error,
    },

    #[error("{file}, document {document}: {problem}")]
    NotARule {
        file: String,
        document: usize,
        problem: String,
    },

    #[error("{file}, document {document}: not a valid CopyratorRule: {source}")]
    Malformed {
        file: String,
        document: usize,
        #[source]
        source: serde_json::Error,
    },

    #[error("{file}: no CopyratorRule in it")]
    NoRules { file: String },

    #[error("rule {rule} is given twice: in {first} and in {second}")]
    Duplicate {
        rule: String,
        first: String,
        second: String,
    },

    #[error("rule {rule}: {why}")]
    NotFollowed { rule: String, why: String },

    #[error(
        "the API server did not list {missing} within {seconds} s (the warnings above say why)"
    )]
    CachesNotListed { missing: String, seconds: u64 },

    #[error("its API server did not answer within {seconds} s")]
    MemberSilent { seconds: u64 },

    #[error("its API server cannot be reached: {0}")]
    MemberUnreachable(String),

    #[error(
        "its API server did not list {missing} within {seconds} s (the warnings above say why)"
    )]
    MemberNotListed { missing: String, seconds: u64 },

    #[error("its inventory entry cannot be used: {reason}: {message}")]
    MemberUnusable { reason: String, message: String },

    #[error("the sources of these rules were not listed within {seconds} s: {rules}")]
    SourcesNotListed { rules: String, seconds: u64 },

    #[error("printing the plan as JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// A rule read from a file, with where it came from.
#[derive(Clone, Debug)]
pub(crate) struct FileRule {
    pub(crate) rule: CopyratorRule,
    /// `file, document N`, for messages.
    pub(crate) origin: String,
}

/// The CopyratorRules in one file's text: YAML documents separated by
/// `---`, each a CopyratorRule in either form the CRD takes (or a `List`
/// of them, as `kubectl get -o yaml` prints). Empty documents are passed
/// over; a rule without `metadata.namespace` is in `default_namespace`.
pub(crate) fn parse_rules(
    file: &str,
    text: &str,
    default_namespace: &str,
) -> Result<Vec<FileRule>, PlanError> {
    let mut rules = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let document_number = index + 1;
        let value = Value::deserialize(document).map_err(|source| PlanError::Yaml {
            file: file.to_owned(),
            document: document_number,
            source,
        })?;
        let not_a_rule = |problem: String| PlanError::NotARule {
            file: file.to_owned(),
            document: document_number,
            problem,
        };
        let items = match value {
            Value::Null => continue,
            Value::Object(ref object) if is_list(object) => match object.get("items") {
                Some(Value::Array(items)) => items.clone(),
                Some(Value::Null) | None => Vec::new(),
                Some(_) => return Err(not_a_rule("the list's items are not a list".into())),
            },
            Value::Object(_) => vec![value],
            _ => return Err(not_a_rule("a CopyratorRule is a YAML mapping".into())),
        };
        for item in items {
            let rule = rule_from(item, default_namespace).map_err(|problem| match problem {
                Problem::NotARule(problem) => not_a_rule(problem),
                Problem::Malformed(source) => PlanError::Malformed {
                    file: file.to_owned(),
                    document: document_number,
                    source,
                },
            })?;
            rules.push(FileRule {
                rule,
                origin: format!("{file}, document {document_number}"),
            });
        }
    }
    if rules.is_empty() {
        return Err(PlanError::NoRules {
            file: file.to_owned(),
        });
    }
    Ok(rules)
}

/// `kind: List` (kubectl) or `CopyratorRuleList` (the API).
fn is_list(object: &serde_json::Map<String, Value>) -> bool {
    matches!(
        object.get("kind").and_then(Value::as_str),
        Some(kind) if kind == "List" || kind == format!("{KIND}List")
    )
}

enum Problem {
    NotARule(String),
    Malformed(serde_json::Error),
}

fn rule_from(value: Value, default_namespace: &str) -> Result<CopyratorRule, Problem> {
    let api_version = format!("{GROUP}/{VERSION}");
    let field = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_owned);
    match (field("apiVersion"), field("kind")) {
        (Some(v), Some(k)) if v == api_version && k == KIND => {}
        (Some(v), Some(k)) => {
            return Err(Problem::NotARule(format!(
                "{k} ({v}) is not a {KIND} ({api_version})"
            )));
        }
        _ => {
            return Err(Problem::NotARule(format!(
                "apiVersion and kind are required ({api_version}, {KIND})"
            )));
        }
    }
    let mut rule: CopyratorRule = serde_json::from_value(value).map_err(Problem::Malformed)?;
    if rule.metadata.name.as_deref().is_none_or(str::is_empty) {
        return Err(Problem::NotARule("metadata.name is required".into()));
    }
    if rule.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        rule.metadata.namespace = Some(default_namespace.to_owned());
    }
    // What the operator last saw of a live rule says nothing about this one.
    rule.status = None;
    Ok(rule)
}

/// The rules of several files, each given once.
pub(crate) fn gather(files: Vec<Vec<FileRule>>) -> Result<Vec<FileRule>, PlanError> {
    let mut seen: HashMap<RuleKey, String> = HashMap::new();
    let mut rules = Vec::new();
    for rule in files.into_iter().flatten() {
        if let Some(first) = seen.insert(rule.rule.key(), rule.origin.clone()) {
            return Err(PlanError::Duplicate {
                rule: rule.rule.key().to_string(),
                first,
                second: rule.origin,
            });
        }
        rules.push(rule);
    }
    Ok(rules)
}

/// Which rules the operator follows (`--namespace`, `--all-namespaces`,
/// `--rule-name`): a rule in a file that it would never follow is an error,
/// not an empty plan.
pub(crate) struct Followed<'a> {
    pub(crate) operator_namespace: &'a str,
    pub(crate) all_namespaces: bool,
    pub(crate) rule_name: Option<&'a str>,
}

impl Followed<'_> {
    pub(crate) fn check(&self, rule: &FileRule) -> Result<(), PlanError> {
        let key = rule.rule.key();
        let why = if !self.all_namespaces && key.namespace != self.operator_namespace {
            format!(
                "the operator follows rules only in its namespace {:?} (--namespace), unless --all-namespaces",
                self.operator_namespace
            )
        } else if let Some(only) = self.rule_name.filter(|only| *only != key.name) {
            format!("the operator follows only the rule named {only:?} (--rule-name)")
        } else {
            return Ok(());
        };
        Err(PlanError::NotFollowed {
            rule: format!("{key} ({})", rule.origin),
            why,
        })
    }
}

/// The rules to plan: those of the files, each in place of the live rule
/// of its name and keeping that rule's UID (so that its copies are
/// recognised and the plan shows what an edit prunes), a new one with a
/// UID of no live rule (so that it adopts the copies of an earlier rule of
/// its name, as `run` would); without files, every live rule. Sorted.
pub(crate) fn rules_to_plan(
    from_files: Option<Vec<FileRule>>,
    live: &HashMap<RuleKey, Arc<CopyratorRule>>,
) -> Vec<CopyratorRule> {
    let mut rules: Vec<CopyratorRule> = match from_files {
        None => live.values().map(|rule| (**rule).clone()).collect(),
        Some(from_files) => from_files
            .into_iter()
            .enumerate()
            .map(|(index, FileRule { mut rule, .. })| {
                let uid = match live.get(&rule.key()).and_then(|l| l.uid()) {
                    Some(uid) => uid.to_owned(),
                    None => format!("{NEW_RULE_UID_PREFIX}{index}"),
                };
                rule.metadata.uid = Some(uid);
                // Applying a rule never deletes it, whatever the file says.
                rule.metadata.deletion_timestamp = None;
                rule
            })
            .collect(),
    };
    rules.sort_by_key(CopyratorRule::key);
    rules
}

/// Whether the operator would follow a rule, and if not, what its status
/// would say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct RuleVerdict {
    pub(crate) rule: String,
    pub(crate) valid: bool,
    /// The reason of its Ready condition when refused (`InvalidRule`, `Forbidden`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// The message of its Ready condition when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
}

/// Whether the plan covers a cluster, and if not, why: a member that
/// cannot be reached, used or listed is reported, not planned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ClusterVerdict {
    pub(crate) cluster: String,
    pub(crate) planned: bool,
    /// Why it could not be planned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
}

impl ClusterVerdict {
    pub(crate) fn planned(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_owned(),
            planned: true,
            message: None,
        }
    }

    pub(crate) fn not_planned(cluster: &str, why: String) -> Self {
        Self {
            cluster: cluster.to_owned(),
            planned: false,
            message: Some(why),
        }
    }
}

/// What `copyrator plan` found, printed as text or JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Report {
    /// The home cluster's name (`--cluster-name`): its entries come first.
    #[serde(skip)]
    pub(crate) home_cluster: String,
    pub(crate) changes: Vec<PlannedChange>,
    pub(crate) skipped: Vec<Skip>,
    pub(crate) rules: Vec<RuleVerdict>,
    /// Each cluster the plan covers, home first, when it covers member
    /// clusters (`--member-clusters`); empty, and left out, otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) clusters: Vec<ClusterVerdict>,
}

impl Report {
    /// An empty report of the home cluster named `home_cluster`.
    pub(crate) fn new(home_cluster: &str) -> Self {
        Self {
            home_cluster: home_cluster.to_owned(),
            ..Self::default()
        }
    }

    /// Take a rule's preview (one that is no longer waiting for its sources).
    pub(crate) fn add(&mut self, rule: &RuleKey, preview: Preview) {
        let (valid, reason, message) = match preview {
            Preview::WaitingForSources => return,
            Preview::Refused { reason, message } => (false, Some(reason), Some(message)),
            Preview::Planned { changes, skipped } => {
                self.changes.extend(changes);
                self.skipped.extend(skipped);
                (true, None, None)
            }
        };
        self.rules.push(RuleVerdict {
            rule: rule.to_string(),
            valid,
            reason,
            message,
        });
    }

    /// The same report in a stable order: the home cluster first, then the
    /// members by name; within a cluster, by rule, kind, namespace, name.
    pub(crate) fn sorted(mut self) -> Self {
        let home = std::mem::take(&mut self.home_cluster);
        let away = |cluster: &str| cluster != home;
        self.changes
            .sort_by(|a, b| (away(&a.cluster), a.order()).cmp(&(away(&b.cluster), b.order())));
        self.changes.dedup();
        self.skipped
            .sort_by(|a, b| (away(&a.cluster), a.order()).cmp(&(away(&b.cluster), b.order())));
        self.skipped.dedup();
        self.rules.sort_by(|a, b| a.rule.cmp(&b.rule));
        self.clusters
            .sort_by(|a, b| (away(&a.cluster), &a.cluster).cmp(&(away(&b.cluster), &b.cluster)));
        self.home_cluster = home;
        self
    }

    /// 1 when a rule is refused or a member cluster could not be planned,
    /// else 2 when something would change, else 0.
    pub(crate) fn exit_code(&self) -> u8 {
        if self.rules.iter().any(|r| !r.valid) || self.clusters.iter().any(|c| !c.planned) {
            EXIT_FAILED
        } else if self.changes.is_empty() {
            EXIT_NO_CHANGES
        } else {
            EXIT_CHANGES
        }
    }

    /// A line per change, then a line per skip, then a line per cluster
    /// not planned, then `no changes` when nothing would change. Where the
    /// plan covers member clusters, each line starts with its cluster's
    /// name (`a: create ...`).
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        let named = !self.clusters.is_empty();
        let cluster = |name: &str| {
            if named {
                format!("{name}: ")
            } else {
                String::new()
            }
        };
        for change in &self.changes {
            out.push_str(&format!(
                "{}{} {} {}/{} (rule {}",
                cluster(&change.cluster),
                change.action,
                change.kind,
                change.namespace,
                change.name,
                change.rule
            ));
            if let Some(source) = &change.source {
                out.push_str(&format!(", source {source}"));
            }
            if let Some(identity) = &change.identity {
                out.push_str(&format!(", as {identity}"));
            }
            if let Some(stage) = &change.stage {
                out.push_str(&format!(", stage {stage}"));
                if change.held {
                    out.push_str(", held until it opens");
                }
            }
            out.push_str(")\n");
        }
        for skip in &self.skipped {
            let place = match &skip.namespace {
                Some(namespace) => format!("{namespace}/{}", skip.name),
                None => skip.name.clone(),
            };
            out.push_str(&format!(
                "{}skip {} {place} (rule {}): {}\n",
                cluster(&skip.cluster),
                skip.kind,
                skip.rule,
                skip.reason
            ));
        }
        let not_planned: Vec<&ClusterVerdict> =
            self.clusters.iter().filter(|c| !c.planned).collect();
        for verdict in &not_planned {
            out.push_str(&format!(
                "{}not planned: {}\n",
                cluster(&verdict.cluster),
                verdict.message.as_deref().unwrap_or_default()
            ));
        }
        for line in self.rule_totals() {
            out.push_str(&line);
            out.push('\n');
        }
        match (self.changes.is_empty(), not_planned.is_empty()) {
            (true, true) => out.push_str("no changes\n"),
            (true, false) => out.push_str("no changes in the clusters planned\n"),
            (false, _) => {}
        }
        out
    }

    /// For each rule with a change or a copy skipped, what it would do in
    /// all (`rule ops/r: 5 adopt, 1 create, 1 skip`): a migration's shape at
    /// a glance.
    fn rule_totals(&self) -> Vec<String> {
        const ORDER: [&str; 6] = ["adopt", "create", "update", "recreate", "delete", "orphan"];
        let mut totals: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
        for change in &self.changes {
            *totals
                .entry(change.rule.as_str())
                .or_default()
                .entry(change.action)
                .or_default() += 1;
        }
        for skip in self.skipped.iter().filter(|s| s.namespace.is_some()) {
            *totals
                .entry(skip.rule.as_str())
                .or_default()
                .entry("skip")
                .or_default() += 1;
        }
        totals
            .into_iter()
            .map(|(rule, counts)| {
                let parts: Vec<String> = ORDER
                    .iter()
                    .chain(&["skip"])
                    .filter_map(|verb| counts.get(verb).map(|n| format!("{n} {verb}")))
                    .collect();
                format!("rule {rule}: {}", parts.join(", "))
            })
            .collect()
    }

    /// The whole report as one JSON document.
    pub(crate) fn json(&self) -> Result<String, PlanError> {
        let mut text = serde_json::to_string_pretty(self).map_err(PlanError::Json)?;
        text.push('\n');
        Ok(text)
    }

    /// A line per refused rule, for standard error: its status's reason
    /// and message, word for word; and a line per member cluster that
    /// could not be planned, with why.
    pub(crate) fn refusals(&self) -> Vec<String> {
        let rules = self.rules.iter().filter(|r| !r.valid).map(|r| {
            format!(
                "rule {} is refused: {}: {}",
                r.rule,
                r.reason.as_deref().unwrap_or_default(),
                r.message.as_deref().unwrap_or_default()
            )
        });
        let clusters = self.clusters.iter().filter(|c| !c.planned).map(|c| {
            format!(
                "member cluster {} could not be planned: {}",
                c.cluster,
                c.message.as_deref().unwrap_or_default()
            )
        });
        rules.chain(clusters).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::kinds::Kind;
    use crate::api::rule::ConflictEntry;
    use crate::cache::index::Object;
    use crate::core::identity::Identity;
    use crate::core::plan::{Action, DeleteReason, Exclusion};
    use serde_json::json;
    use std::collections::BTreeMap;

    fn key(namespace: &str, name: &str) -> RuleKey {
        RuleKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    const TWO_FORMS: &str = r#"
# the original form, without a namespace
apiVersion: flant.com/v1
kind: CopyratorRule
metadata:
  name: main-rule
ruleType: configmap
selector:
  copyrator: "true"
namespace: default
---
---
apiVersion: flant.com/v1
kind: CopyratorRule
metadata:
  name: registry
  namespace: tenant
spec:
  ruleType: secret
  selector:
    matchLabels:
      copyrator: "true"
  targets:
    include: ["demo-*"]
status:
  copies: 3
"#;

    #[test]
    fn every_document_of_a_file_is_a_rule_in_either_form() {
        let rules = parse_rules("rules.yaml", TWO_FORMS, "ops").expect("the file parses");
        let keys: Vec<String> = rules.iter().map(|r| r.rule.key().to_string()).collect();
        assert_eq!(keys, ["ops/main-rule", "tenant/registry"]);
        // The empty document between the two still counts.
        assert_eq!(rules[1].origin, "rules.yaml, document 3");
        assert!(rules[0].rule.rule_type.is_some(), "top-level form");
        let spec = rules[1].rule.spec.as_ref().expect("spec form");
        assert!(spec.targets.is_some());
        assert!(rules[1].rule.status.is_none(), "a file's status is ignored");
    }

    #[test]
    fn a_list_holds_rules_too() {
        let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: flant.com/v1
  kind: CopyratorRule
  metadata: {name: a}
  ruleType: configmap
  selector: {x: "y"}
- apiVersion: flant.com/v1
  kind: CopyratorRule
  metadata: {name: b, namespace: other}
  ruleType: secret
  selector: {x: "y"}
"#;
        let rules = parse_rules("-", text, "ops").expect("the list parses");
        let keys: Vec<String> = rules.iter().map(|r| r.rule.key().to_string()).collect();
        assert_eq!(keys, ["ops/a", "other/b"]);
    }

    fn parse_error(text: &str) -> String {
        match parse_rules("f.yaml", text, "ops") {
            Ok(rules) => panic!("{text:?} parsed into {} rules", rules.len()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn what_is_not_a_rule_is_an_error_naming_the_file_and_document() {
        let rule = "apiVersion: flant.com/v1\nkind: CopyratorRule\nmetadata: {name: a}\nruleType: configmap\nselector: {x: y}\n";
        let deployment =
            format!("{rule}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d}}\n");
        assert_eq!(
            parse_error(&deployment),
            "f.yaml, document 2: Deployment (apps/v1) is not a CopyratorRule (flant.com/v1)"
        );
        assert!(
            parse_error("metadata: {name: a}\n")
                .starts_with("f.yaml, document 1: apiVersion and kind are required")
        );
        assert!(parse_error("- a\n- b\n").contains("a YAML mapping"));
        assert!(parse_error("a: [b\n").starts_with("f.yaml, document 1: not valid YAML"));
        assert!(
            parse_error("apiVersion: flant.com/v1\nkind: CopyratorRule\nmetadata: {name: a}\nruleType: deployment\n")
                .starts_with("f.yaml, document 1: not a valid CopyratorRule")
        );
        assert_eq!(
            parse_error("apiVersion: flant.com/v1\nkind: CopyratorRule\nruleType: configmap\n"),
            "f.yaml, document 1: metadata.name is required"
        );
        assert_eq!(
            parse_error("---\n# nothing\n"),
            "f.yaml: no CopyratorRule in it"
        );
        assert_eq!(parse_error(""), "f.yaml: no CopyratorRule in it");
    }

    #[test]
    fn a_rule_given_twice_is_an_error() {
        let a = parse_rules("a.yaml", TWO_FORMS, "ops").expect("parses");
        let b = parse_rules("b.yaml", TWO_FORMS, "ops").expect("parses");
        let err = gather(vec![a.clone(), b]).expect_err("a duplicate");
        assert_eq!(
            err.to_string(),
            "rule ops/main-rule is given twice: in a.yaml, document 1 and in b.yaml, document 1"
        );
        assert_eq!(gather(vec![a]).expect("no duplicate").len(), 2);
    }

    #[test]
    fn only_rules_the_operator_follows_can_be_planned() {
        let rules = parse_rules("rules.yaml", TWO_FORMS, "ops").expect("parses");
        let (own, tenant) = (&rules[0], &rules[1]);
        let followed = Followed {
            operator_namespace: "ops",
            all_namespaces: false,
            rule_name: None,
        };
        assert!(followed.check(own).is_ok());
        let err = followed.check(tenant).expect_err("outside the namespace");
        assert!(
            err.to_string()
                .starts_with("rule tenant/registry (rules.yaml, document 3): the operator follows rules only in its namespace \"ops\""),
            "{err}"
        );
        let everywhere = Followed {
            all_namespaces: true,
            rule_name: Some("registry"),
            ..followed
        };
        assert!(everywhere.check(tenant).is_ok());
        assert!(everywhere.check(own).is_err(), "--rule-name names another");
    }

    fn live_rule(namespace: &str, name: &str, uid: &str) -> Arc<CopyratorRule> {
        let mut rule = CopyratorRule::default();
        rule.metadata.namespace = Some(namespace.into());
        rule.metadata.name = Some(name.into());
        rule.metadata.uid = Some(uid.into());
        Arc::new(rule)
    }

    #[test]
    fn a_file_rule_keeps_the_uid_of_the_live_rule_it_replaces_and_a_new_one_gets_none() {
        let mut from_files = parse_rules("rules.yaml", TWO_FORMS, "ops").expect("parses");
        // A file from `kubectl get -o yaml` of another rule carries its UID.
        from_files[1].rule.metadata.uid = Some("uid-of-live".into());
        from_files[0].rule.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let live: HashMap<RuleKey, Arc<CopyratorRule>> = [
            (
                key("ops", "main-rule"),
                live_rule("ops", "main-rule", "uid-of-live"),
            ),
            (
                key("ops", "other"),
                live_rule("ops", "other", "uid-of-other"),
            ),
        ]
        .into_iter()
        .collect();
        let rules = rules_to_plan(Some(from_files), &live);
        assert_eq!(rules.len(), 2, "only the file's rules");
        assert_eq!(rules[0].key(), key("ops", "main-rule"));
        assert_eq!(rules[0].uid(), Some("uid-of-live"));
        assert!(!rules[0].is_deleting());
        let new_uid = rules[1].uid().expect("a new rule has a UID");
        assert!(
            live.values().all(|l| l.uid() != Some(new_uid)),
            "{new_uid} is a live rule's"
        );

        let every_live = rules_to_plan(None, &live);
        let keys: Vec<RuleKey> = every_live.iter().map(CopyratorRule::key).collect();
        assert_eq!(keys, [key("ops", "main-rule"), key("ops", "other")]);
    }

    fn object(namespace: &str, name: &str, source: Option<&str>) -> Arc<Object> {
        let annotations: BTreeMap<String, String> = source
            .map(|s| (crate::ANNOTATION_SOURCE.to_owned(), s.to_owned()))
            .into_iter()
            .collect();
        Arc::new(Object::new(
            namespace,
            name,
            "uid".into(),
            "1".into(),
            BTreeMap::new(),
            annotations,
            [("data".to_owned(), json!({"password": "s3cret"}))]
                .into_iter()
                .collect(),
        ))
    }

    fn delete(namespace: &str, name: &str, source: Option<&str>) -> Action {
        Action::Delete {
            current: object(namespace, name, source),
            reason: DeleteReason::SourceGone,
        }
    }

    fn sample() -> Report {
        let rule = key("ops", "r");
        let mut report = Report::default();
        report.add(
            &key("ops", "z"),
            Preview::Refused {
                reason: "InvalidRule".into(),
                message: "targets.include: \"A*\" is not a valid pattern".into(),
            },
        );
        report.add(
            &rule,
            Preview::Planned {
                changes: vec![
                    PlannedChange::of(
                        "home",
                        "ops/r",
                        Kind::Secret,
                        &delete("t2", "pull", Some("ops/pull")),
                    ),
                    PlannedChange::of("home", "ops/r", Kind::Secret, &delete("t1", "old", None)),
                ],
                skipped: vec![
                    Skip::namespace("home", &rule, "kube-system", Exclusion::Protected),
                    Skip::copy(
                        "home",
                        "ops/r",
                        Kind::Secret,
                        &ConflictEntry {
                            cluster: None,
                            namespace: "t3".into(),
                            name: "pull".into(),
                            reason: "a Secret not made by Copyrator is there".into(),
                        },
                    ),
                ],
            },
        );
        report.add(&key("ops", "waiting"), Preview::WaitingForSources);
        report.sorted()
    }

    #[test]
    fn text_is_a_line_per_change_then_per_skip_in_a_stable_order() {
        let report = sample();
        assert_eq!(
            report.text(),
            "delete Secret t1/old (rule ops/r)\n\
             delete Secret t2/pull (rule ops/r, source ops/pull)\n\
             skip Namespace kube-system (rule ops/r): protected: only its exact name in targets.include reaches it\n\
             skip Secret t3/pull (rule ops/r): a Secret not made by Copyrator is there\n\
             rule ops/r: 2 delete, 1 skip\n"
        );
        let mut shuffled = report.clone();
        shuffled.changes.reverse();
        shuffled.skipped.reverse();
        shuffled.rules.reverse();
        assert_eq!(shuffled.sorted(), report);
        assert!(!report.text().contains("s3cret"));
    }

    #[test]
    fn nothing_to_change_says_so_and_skips_are_no_changes() {
        let rule = key("ops", "r");
        let mut report = Report::default();
        report.add(
            &rule,
            Preview::Planned {
                changes: Vec::new(),
                skipped: vec![Skip::namespace(
                    "home",
                    &rule,
                    "kube-public",
                    Exclusion::Protected,
                )],
            },
        );
        assert_eq!(report.exit_code(), EXIT_NO_CHANGES);
        assert_eq!(report.text().lines().last(), Some("no changes"));
        assert_eq!(Report::default().text(), "no changes\n");
    }

    #[test]
    fn json_is_one_document_with_changes_skips_and_rules() {
        let report = sample();
        let document: Value =
            serde_json::from_str(&report.json().expect("renders")).expect("one JSON document");
        assert_eq!(
            document["changes"][1],
            json!({"cluster": "home", "action": "delete", "kind": "Secret", "namespace": "t2", "name": "pull", "rule": "ops/r", "source": "ops/pull"})
        );
        assert_eq!(document["changes"][0].get("source"), None);
        assert_eq!(
            document["skipped"][0],
            json!({"cluster": "home", "kind": "Namespace", "name": "kube-system", "rule": "ops/r", "reason": "protected: only its exact name in targets.include reaches it"})
        );
        assert_eq!(
            document["rules"],
            json!([
                {"rule": "ops/r", "valid": true},
                {"rule": "ops/z", "valid": false, "reason": "InvalidRule", "message": "targets.include: \"A*\" is not a valid pattern"}
            ])
        );
        assert!(!report.json().expect("renders").contains("s3cret"));
    }

    #[test]
    fn exit_code_is_1_for_a_refused_rule_2_for_changes_0_otherwise() {
        assert_eq!(Report::default().exit_code(), EXIT_NO_CHANGES);
        let refused = sample();
        assert_eq!(refused.exit_code(), EXIT_FAILED);
        assert_eq!(
            refused.refusals(),
            ["rule ops/z is refused: InvalidRule: targets.include: \"A*\" is not a valid pattern"]
        );
        let mut changes = refused;
        changes.rules.retain(|r| r.valid);
        assert_eq!(changes.exit_code(), EXIT_CHANGES);
        assert!(changes.refusals().is_empty());
        // A refused rule with nothing else to do still fails.
        let mut only_refused = Report::default();
        only_refused.add(
            &key("ops", "z"),
            Preview::Refused {
                reason: "Forbidden".into(),
                message: "m".into(),
            },
        );
        assert_eq!(only_refused.exit_code(), EXIT_FAILED);
    }

    #[test]
    fn each_rule_says_what_it_would_do_in_all() {
        let change = |action: &'static str, namespace: &str, rule: &str| PlannedChange {
            cluster: "home".into(),
            action,
            kind: "ConfigMap".into(),
            namespace: namespace.into(),
            name: "cfg".into(),
            rule: rule.into(),
            source: Some("ops/cfg".into()),
            identity: None,
            stage: None,
            held: false,
        };
        let mut report = Report::new("home");
        report.add(
            &RuleKey {
                namespace: "ops".into(),
                name: "r".into(),
            },
            Preview::Planned {
                changes: vec![
                    change("create", "t3", "ops/r"),
                    change("adopt", "t1", "ops/r"),
                    change("adopt", "t2", "ops/r"),
                    change("delete", "t1", "ops/other"),
                ],
                skipped: vec![Skip::copy(
                    "home",
                    "ops/r",
                    Kind::ConfigMap,
                    &ConflictEntry {
                        namespace: "t4".into(),
                        name: "cfg".into(),
                        reason: "held".into(),
                        ..ConflictEntry::default()
                    },
                )],
            },
        );
        let text = report.sorted().text();
        let totals: Vec<&str> = text.lines().filter(|l| l.starts_with("rule ")).collect();
        assert_eq!(
            totals,
            [
                "rule ops/other: 1 delete",
                "rule ops/r: 2 adopt, 1 create, 1 skip"
            ],
            "{text}"
        );
    }

    #[test]
    fn a_change_names_its_target_and_source() {
        let change = PlannedChange::of(
            "home",
            "ops/r",
            Kind::ConfigMap,
            &delete("t1", "cfg", Some("ops/cfg")),
        );
        assert_eq!(
            change,
            PlannedChange {
                cluster: "home".into(),
                action: "delete",
                kind: "ConfigMap".into(),
                namespace: "t1".into(),
                name: "cfg".into(),
                rule: "ops/r".into(),
                source: Some("ops/cfg".into()),
                identity: None,
                stage: None,
                held: false,
            }
        );
        let tenants = change.clone().sent_as(&Identity::ServiceAccount {
            namespace: "team".into(),
            name: "copyrator".into(),
        });
        let mut report = Report::new("home");
        report.changes.push(tenants);
        assert!(
            report.text().starts_with(
                "delete ConfigMap t1/cfg (rule ops/r, source ops/cfg, as system:serviceaccount:team:copyrator)\n"
            ),
            "{}",
            report.text()
        );
        let skip = Skip::source(
            "home",
            "ops/r",
            Kind::Secret,
            "ops/token",
            "bound to a ServiceAccount",
        );
        assert_eq!(
            (skip.namespace.as_deref(), skip.name.as_str()),
            (Some("ops"), "token")
        );
        let tenant = Skip::namespace("home", &key("team", "r"), "t9", Exclusion::NotAccepting);
        assert!(
            tenant.reason.contains("namespace team"),
            "{}",
            tenant.reason
        );
    }

    fn create(cluster: &str, namespace: &str) -> PlannedChange {
        PlannedChange {
            cluster: cluster.into(),
            action: "create",
            kind: "ConfigMap".into(),
            namespace: namespace.into(),
            name: "cfg".into(),
            rule: "ops/r".into(),
            source: Some("ops/cfg".into()),
            identity: None,
            stage: None,
            held: false,
        }
    }

    /// A plan of one rule at home ("main") and in members a and b, member
    /// c not planned; entries given out of order.
    fn with_members() -> Report {
        let rule = key("ops", "r");
        let mut report = Report::new("main");
        report.add(
            &rule,
            Preview::Planned {
                changes: vec![
                    create("b", "t1"),
                    create("main", "t2"),
                    create("a", "t1"),
                    create("main", "t1"),
                ],
                skipped: vec![
                    Skip::namespace("b", &rule, "kube-system", Exclusion::Protected),
                    Skip::namespace("main", &rule, "kube-system", Exclusion::Protected),
                ],
            },
        );
        report.clusters = vec![
            ClusterVerdict::planned("b"),
            ClusterVerdict::not_planned("c", "its API server did not answer within 10 s".into()),
            ClusterVerdict::planned("a"),
            ClusterVerdict::planned("main"),
        ];
        report.sorted()
    }

    #[test]
    fn with_members_each_line_names_its_cluster_home_first_then_members_by_name() {
        let report = with_members();
        assert_eq!(
            report.text(),
            "main: create ConfigMap t1/cfg (rule ops/r, source ops/cfg)\n\
             main: create ConfigMap t2/cfg (rule ops/r, source ops/cfg)\n\
             a: create ConfigMap t1/cfg (rule ops/r, source ops/cfg)\n\
             b: create ConfigMap t1/cfg (rule ops/r, source ops/cfg)\n\
             main: skip Namespace kube-system (rule ops/r): protected: only its exact name in targets.include reaches it\n\
             b: skip Namespace kube-system (rule ops/r): protected: only its exact name in targets.include reaches it\n\
             c: not planned: its API server did not answer within 10 s\n\
             rule ops/r: 4 create\n"
        );
        let clusters: Vec<&str> = report.clusters.iter().map(|c| c.cluster.as_str()).collect();
        assert_eq!(clusters, ["main", "a", "b", "c"]);
        let mut shuffled = report.clone();
        shuffled.changes.reverse();
        shuffled.skipped.reverse();
        shuffled.clusters.reverse();
        assert_eq!(shuffled.sorted(), report);
    }

    #[test]
    fn with_members_json_names_the_cluster_of_each_entry_and_lists_the_clusters() {
        let document: Value = serde_json::from_str(&with_members().json().expect("renders"))
            .expect("one JSON document");
        let clusters: Vec<&str> = document["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .map(|c| c["cluster"].as_str().expect("a cluster on each change"))
            .collect();
        assert_eq!(clusters, ["main", "main", "a", "b"]);
        assert_eq!(document["skipped"][1]["cluster"], "b");
        assert_eq!(
            document["clusters"],
            json!([
                {"cluster": "main", "planned": true},
                {"cluster": "a", "planned": true},
                {"cluster": "b", "planned": true},
                {"cluster": "c", "planned": false, "message": "its API server did not answer within 10 s"}
            ])
        );
        assert_eq!(document.get("home_cluster"), None);
        // Without members the clusters are left out, and each entry still
        // names its cluster.
        let home_only: Value =
            serde_json::from_str(&sample().json().expect("renders")).expect("one JSON document");
        assert_eq!(home_only.get("clusters"), None);
        assert_eq!(home_only["changes"][0]["cluster"], "home");
    }

    #[test]
    fn a_member_not_planned_fails_the_plan_and_says_why() {
        let report = with_members();
        assert_eq!(report.exit_code(), EXIT_FAILED, "changes, but c unplanned");
        assert_eq!(
            report.refusals(),
            ["member cluster c could not be planned: its API server did not answer within 10 s"]
        );
        let mut all_planned = report.clone();
        all_planned.clusters.retain(|c| c.planned);
        assert_eq!(all_planned.exit_code(), EXIT_CHANGES);
        assert!(all_planned.refusals().is_empty());
        all_planned.changes.clear();
        assert_eq!(all_planned.exit_code(), EXIT_NO_CHANGES);
        assert_eq!(all_planned.text().lines().last(), Some("no changes"));

        let mut nothing_but_c = report;
        nothing_but_c.changes.clear();
        assert_eq!(nothing_but_c.exit_code(), EXIT_FAILED);
        assert_eq!(
            nothing_but_c.text().lines().last(),
            Some("no changes in the clusters planned")
        );
    }
}
