//! kubernetes-reflector: a source's `reflection-*` annotations (automatic
//! mirrors), and mirrors made by hand that name their source (`reflects`).
//! The annotations are the configuration of the namespace of the object
//! that carries them: the source's for its automatic mirrors, the
//! mirror's for one made by hand; the rule is a tenant rule there (see
//! `shared::Owner`).

use serde_json::{Value, json};

use super::SourceReport;
use super::patterns::{Anchoring, Selector, everything_but, pattern_list, regex_globs};
use super::shared::{
    Context, Conversion, Draft, Named, Owner, Source, Targets, annotation, pulled_source, renaming,
    spec_of, str_at, strip_all,
};
use crate::api::selector::Glob;

pub(super) const TOOL: &str = "kubernetes-reflector";
pub(super) const PREFIX: &str = "reflector.v1.k8s.emberstack.com/";
const SOURCE_KEYS: [&str; 6] = [
    "reflection-allowed",
    "reflection-allowed-namespaces",
    "reflection-allowed-namespaces-selector",
    "reflection-auto-enabled",
    "reflection-auto-namespaces",
    "reflection-auto-namespaces-selector",
];

fn reflector_annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    annotation(object, &format!("{PREFIX}{key}"))
}

/// The patterns of a comma-separated namespace list annotation.
fn patterns_of<'a>(object: &'a Value, key: &str) -> Vec<&'a str> {
    reflector_annotation(object, key)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// A .NET boolean, as reflector parses it.
fn flag(object: &Value, key: &str) -> bool {
    reflector_annotation(object, key).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

pub(super) fn convert(object: &Value, context: &Context) -> Option<Conversion> {
    if str_at(object, &["apiVersion"]) != Some("v1")
        || !matches!(str_at(object, &["kind"]), Some("Secret" | "ConfigMap"))
    {
        return None;
    }
    let is_source = SOURCE_KEYS
        .iter()
        .any(|key| reflector_annotation(object, key).is_some());
    // An automatic mirror names its source too; its source's annotations
    // are its configuration.
    let mirrored =
        reflector_annotation(object, "reflects").filter(|_| !flag(object, "auto-reflects"));
    if !is_source && mirrored.is_none() {
        return None;
    }
    let named = Named::of(object)?;
    let mut report = named.report(TOOL);
    let mut drafts = Vec::new();
    if is_source {
        match automatic(object, &named, context, &mut report) {
            Ok(draft) => drafts.extend(draft),
            Err(why) => report.unmapped(why),
        }
    }
    if let Some(reflects) = mirrored {
        match by_hand(&named, reflects, context, &mut report) {
            Ok(draft) => drafts.extend(draft),
            Err(why) => report.unmapped(why),
        }
    }
    Some(report.with(drafts))
}

/// The rule that makes a source's automatic mirrors, if it has any.
fn automatic(
    object: &Value,
    named: &Named,
    context: &Context,
    report: &mut SourceReport,
) -> Result<Option<Draft>, String> {
    let auto = flag(object, "reflection-auto-enabled");
    if !flag(object, "reflection-allowed") {
        if auto {
            return Err("reflection-auto-enabled needs reflection-allowed: true, which it lacks: reflector makes no mirrors of it, and no rule is made".into());
        }
        report.exact(
            "reflection-allowed is not true: reflector copies nothing of it, and no rule is made",
        );
        return Ok(None);
    }
    if !auto {
        report.exact("reflection-allowed without reflection-auto-enabled permits mirrors made by hand only: by itself it copies nothing; each mirror that names this source is imported on its own");
        return Ok(None);
    }
    if object
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("helm.sh"))
    {
        return Err(
            "reflector ignores Secrets of a helm.sh type, and Copyrator never copies them".into(),
        );
    }
    let allowed = reach(object, "reflection-allowed-namespaces", report)?;
    let auto = reach(object, "reflection-auto-namespaces", report)?;
    let mut targets = allowed.and(auto)?;
    if let Some(why) = targets.refusal() {
        return Err(why);
    }
    if targets.reaches_nothing() {
        return Err("the namespaces it allows and those it mirrors into have none in common: reflector makes no mirrors, and no rule is made".into());
    }
    // No tool mirrors a source into its own namespace.
    if let Some(include) = &mut targets.include {
        include.retain(|glob| *glob != named.namespace);
        if include.is_empty() {
            report.exact("the namespaces it allows and those it mirrors into meet only in its own namespace, where reflector mirrors nothing: it copies nothing, and no rule is made");
            return Ok(None);
        }
    }
    report.exact(format!(
        "automatic mirrors go into {}: the rule copies there",
        targets.describe()
    ));
    report.exact("namespaces made later get mirrors, and mirrors go when their source goes, when reflection is switched off and when their namespace stops matching: as the rule's copies do");
    report.exact("reflector copies the data (and a Secret's type) only, none of the source's labels and annotations: the rule strips them all (transform.stripLabels, stripAnnotations: [\"*\"])");
    report.differs("reflector leaves an edited mirror alone until its source changes (it compares versions, not content); the rule restores it (syncPolicy: Sync)");
    if let Some(note) = targets.protected_note(TOOL, context.options) {
        report.differs(note);
    }
    let mut entries = vec![("transform", strip_all(true))];
    entries.extend(targets.to_json().map(|t| ("targets", t)));
    Ok(Some(Draft {
        name: named.rule_name("reflector"),
        owner: Owner::of_namespace(&named.namespace, context.options),
        api_version: named.api_version.clone(),
        kind: named.kind.clone(),
        source: Source::Named {
            namespace: named.namespace.clone(),
            name: named.name.clone(),
        },
        spec: spec_of(&entries),
        naming: None,
    }))
}

/// The namespaces one of a source's lists and its selector reach: a
/// namespace matching either.
#[derive(Debug)]
enum Reach {
    All,
    /// Every namespace but those these globs match (a negative lookahead).
    AllBut(Vec<String>),
    Names(Vec<String>),
    Labels(Selector),
}

fn reach(object: &Value, list_key: &str, report: &mut SourceReport) -> Result<Reach, String> {
    let selector_key = format!("{list_key}-selector");
    let list = patterns_of(object, list_key);
    let selector = match reflector_annotation(object, &selector_key) {
        Some(text) => Selector::parse(text).map_err(|e| {
            format!("{selector_key} {text:?} is not a selector a rule can hold: {e}")
        })?,
        None => None,
    };
    match (list.is_empty(), selector) {
        (true, None) => Ok(Reach::All),
        (true, Some(selector)) => Ok(Reach::Labels(selector)),
        (false, Some(_)) => Err(format!(
            "{list_key} and {selector_key} are both set: reflector reaches a namespace that matches either, while a rule's targets must match both"
        )),
        (false, None) => {
            if let [pattern] = list[..]
                && let Some(excluded) = everything_but(pattern)
            {
                report.exact(format!(
                    "{list_key} {pattern:?} says every namespace but those matching {}: the rule's targets.exclude",
                    excluded.join(", ")
                ));
                return Ok(Reach::AllBut(excluded));
            }
            let found = pattern_list(list, Anchoring::Whole);
            for note in &found.notes {
                report.exact(note.clone());
            }
            for line in found
                .inexact_lines("it is left out, so the namespaces only it matches get no copies")
            {
                report.differs(line);
            }
            if found.globs.is_empty() && !found.inexact.is_empty() {
                return Err(format!("no pattern of {list_key} has an exact glob"));
            }
            Ok(Reach::Names(found.globs))
        }
    }
}

impl Reach {
    /// The namespaces both reach, as a rule's targets.
    fn and(self, other: Self) -> Result<Targets, String> {
        Ok(match (self, other) {
            (Self::AllBut(mut a), Self::AllBut(b)) => {
                for glob in b {
                    if !a.contains(&glob) {
                        a.push(glob);
                    }
                }
                Targets {
                    exclude: a,
                    ..Targets::default()
                }
            }
            (Self::AllBut(exclude), other) | (other, Self::AllBut(exclude)) => Targets {
                exclude,
                ..Self::All.and(other)?
            },
            (Self::All, Self::All) => Targets::default(),
            (Self::All, Self::Names(globs)) | (Self::Names(globs), Self::All) => {
                Targets::including(globs)
            }
            (Self::All, Self::Labels(selector)) | (Self::Labels(selector), Self::All) => Targets {
                selector: Some(selector),
                ..Targets::default()
            },
            (Self::Labels(a), Self::Labels(b)) => Targets {
                selector: Some(a.and(&b)),
                ..Targets::default()
            },
            (Self::Names(globs), Self::Labels(selector))
            | (Self::Labels(selector), Self::Names(globs)) => Targets {
                include: Some(globs),
                selector: Some(selector),
                ..Targets::default()
            },
            (Self::Names(a), Self::Names(b)) => Targets::including(common_globs(&a, &b).ok_or(
                "reflection-allowed-namespaces and reflection-auto-namespaces differ and both hold wildcards: no list of globs matches just the namespaces both match",
            )?),
        })
    }
}

/// Globs matching the names both lists match, when there are such.
fn common_globs(a: &[String], b: &[String]) -> Option<Vec<String>> {
    let literal = |globs: &[String]| globs.iter().all(|g| !g.contains(['*', '?']));
    let mut sorted = (a.to_vec(), b.to_vec());
    sorted.0.sort();
    sorted.1.sort();
    if sorted.0 == sorted.1 {
        return Some(a.to_vec());
    }
    let (names, globs) = if literal(a) {
        (a, b)
    } else if literal(b) {
        (b, a)
    } else {
        return None;
    };
    let globs: Vec<Glob> = globs.iter().filter_map(|g| Glob::new(g).ok()).collect();
    Some(
        names
            .iter()
            .filter(|n| globs.iter().any(|g| g.matches(n)))
            .cloned()
            .collect(),
    )
}

/// The rule that keeps a mirror made by hand: its source copied into its
/// namespace alone, under its name.
fn by_hand(
    mirror: &Named,
    reflects: &str,
    context: &Context,
    report: &mut SourceReport,
) -> Result<Option<Draft>, String> {
    let (namespace, name) = pulled_source(mirror, reflects, "reflects")?;
    let renaming = renaming(name, &mirror.name, false, "the name the mirror has")?;
    match context.find(&mirror.kind, namespace, name) {
        // An automatic mirror has its source's name: a mirror of another
        // name beside it is one of its own.
        Some(source)
            if renaming.is_none() && auto_mirrors_into(source, namespace, &mirror.namespace) =>
        {
            // One place, one rule: the source's automatic mirrors' rule
            // writes here already, and a second would meet its copy as a
            // conflict.
            report.differs(format!(
                "the source {} {namespace}/{name} also mirrors itself automatically into {}: the rule made for its automatic mirrors keeps this copy, and no rule of its own is made for it; that rule deletes it with its source (deletionPolicy.sourceGone: Delete), where reflector keeps a mirror made by hand, and it strips the labels someone put on this mirror",
                mirror.kind, mirror.namespace
            ));
            return Ok(None);
        }
        Some(source) => permitted(source, &mirror.namespace, report)?,
        None => report.differs(format!(
            "the source {} {namespace}/{name} was not among the objects read: whether it permits reflection into {} was not checked",
            mirror.kind, mirror.namespace
        )),
    }
    report.exact(format!(
        "a mirror made by hand of {} {namespace}/{name}: the rule copies it into {} alone, its source selected by the rule's import label, to be put on it",
        mirror.kind, mirror.namespace
    ));
    if let Some(renaming) = &renaming {
        report.exact(renaming.line.clone());
    }
    report.differs("reflector does not delete a mirror made by hand when its source goes; the closest is deletionPolicy.sourceGone: Orphan, which keeps the copy and hands it over to its namespace");
    Ok(Some(Draft {
        name: mirror.rule_name("reflector"),
        owner: Owner::of_namespace(&mirror.namespace, context.options),
        api_version: mirror.api_version.clone(),
        kind: mirror.kind.clone(),
        source: Source::Named {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        spec: spec_of(&[
            ("targets", json!({"include": [mirror.namespace]})),
            ("deletionPolicy", json!({"sourceGone": "Orphan"})),
            ("transform", strip_all(true)),
        ]),
        naming: renaming.map(|r| r.name),
    }))
}

/// Whether `source` (in `source_namespace`) surely mirrors itself
/// automatically into `namespace`: reflection and auto-reflection on, and
/// both namespace lists (empty: every namespace) allowing it by an exact
/// glob. Selectors are not read here: they only make it unsure.
fn auto_mirrors_into(source: &Value, source_namespace: &str, namespace: &str) -> bool {
    if namespace == source_namespace
        || !flag(source, "reflection-allowed")
        || !flag(source, "reflection-auto-enabled")
    {
        return false;
    }
    [
        "reflection-allowed-namespaces",
        "reflection-auto-namespaces",
    ]
    .iter()
    .all(|key| {
        let selector = format!("{key}-selector");
        let list = patterns_of(source, key);
        let has_selector =
            reflector_annotation(source, &selector).is_some_and(|s| !s.trim().is_empty());
        match (list.is_empty(), has_selector) {
            (true, false) => true,
            (true, true) => false,
            (false, _) => pattern_list(list, Anchoring::Whole).matches(namespace) == Some(true),
        }
    })
}

/// Whether the source lets reflector fill a mirror in `namespace`; an
/// error when it surely does not.
fn permitted(source: &Value, namespace: &str, report: &mut SourceReport) -> Result<(), String> {
    if !flag(source, "reflection-allowed") {
        return Err("the source does not allow reflection (reflection-allowed), so reflector does not fill this mirror: no rule is made".into());
    }
    let selector = reflector_annotation(source, "reflection-allowed-namespaces-selector")
        .filter(|s| !s.trim().is_empty());
    let patterns = patterns_of(source, "reflection-allowed-namespaces");
    if patterns.is_empty() && selector.is_none() {
        return Ok(());
    }
    // reflector tries the patterns in order and fails on one that is no
    // regular expression: a mirror no earlier pattern allows is never filled.
    for (index, pattern) in patterns.iter().enumerate() {
        let Err(inexact) = regex_globs(pattern, Anchoring::Whole) else {
            continue;
        };
        if !inexact.not_a_regex {
            continue;
        }
        if pattern_list(patterns[..index].iter().copied(), Anchoring::Whole).matches(namespace)
            != Some(true)
        {
            return Err(format!(
                "the source's reflection-allowed-namespaces holds {pattern:?}, which is no regular expression ({}): reflector fails on it and never fills this mirror in {namespace}, so it copies nothing here, and no rule is made",
                inexact.why
            ));
        }
    }
    match (
        pattern_list(patterns, Anchoring::Whole).matches(namespace),
        selector,
    ) {
        (Some(true), _) => return Ok(()),
        (Some(false), None) => {
            return Err(format!(
                "the source's reflection-allowed-namespaces does not allow {namespace}, so reflector does not fill this mirror: no rule is made"
            ));
        }
        _ => {}
    }
    report.differs(format!(
        "whether the source allows reflection into {namespace} (by a pattern without an exact glob, or by the labels of the namespace) was not checked"
    ));
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{Value, json};

    use super::super::kyverno::tests::yaml;
    use super::super::shared::import_label_key;
    use super::super::shared::tests::{converted, copy_name_of, says};
    use super::super::{Imported, SourceReport};

    // RF README.md §Usage: a source that permits reflection.
    const SOURCE: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: source-secret
  annotations:
    reflector.v1.k8s.emberstack.com/reflection-allowed: "true"
    reflector.v1.k8s.emberstack.com/reflection-allowed-namespaces: "namespace-1,namespace-2,namespace-[0-9]*"
    reflector.v1.k8s.emberstack.com/reflection-allowed-namespaces-selector: "env=production"
data:
  ...
"#;

    // RF README.md §Usage: a mirror made by hand.
    const MIRROR: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: mirror-secret
  annotations:
    reflector.v1.k8s.emberstack.com/reflects: "default/source-secret"
data:
  ...
"#;

    pub(crate) fn documented() -> Vec<Value> {
        vec![yaml(SOURCE), yaml(MIRROR)]
    }

    fn report_on<'a>(imported: &'a Imported, source: &str) -> &'a SourceReport {
        imported
            .reports
            .iter()
            .find(|r| r.source == source)
            .unwrap_or_else(|| panic!("no report on {source}: {:#?}", imported.reports))
    }

    const KEY: &str = "reflector.v1.k8s.emberstack.com/";

    #[test]
    fn the_documented_source_permits_mirrors_by_hand_and_the_mirror_of_another_name_is_a_rule() {
        let imported = converted(&documented());
        let name = "reflector-secret-default-mirror-secret";
        // Both in default: the mirror stands beside its source.
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "ruleType": "secret",
                    "selector": {import_label_key(name): "true"},
                    "namespace": "default",
                    "adopt": true,
                    "targets": {"include": ["default"]},
                    "deletionPolicy": {"sourceGone": "Orphan"},
                    "transform": {
                        "stripLabels": ["*"],
                        "stripAnnotations": ["*"],
                        "name": {"template": "mirror-secret"}
                    }
                }
            })]
        );
        assert_eq!(
            copy_name_of(&imported.rules[0], "source-secret"),
            "mirror-secret"
        );
        let labelled: Vec<(&str, &str)> = imported
            .source_labels
            .iter()
            .map(|l| (l.namespace.as_str(), l.name.as_str()))
            .collect();
        assert_eq!(labelled, [("default", "source-secret")]);
        let source = report_on(&imported, "Secret default/source-secret");
        assert_eq!(source.tool, "kubernetes-reflector");
        assert!(
            says(&source.exact, "permits mirrors made by hand only"),
            "{source:#?}"
        );
        assert!(
            says(&source.differs, "names no namespace: taken as default"),
            "{source:#?}"
        );
        let mirror = report_on(&imported, "Secret default/mirror-secret");
        assert_eq!(
            mirror.exact,
            [
                "a mirror made by hand of Secret default/source-secret: the rule copies it into default alone, its source selected by the rule's import label, to be put on it",
                "copies are named mirror-secret, the name the mirror has (transform.name.template)",
            ]
        );
        // Neither default/namespace-1/namespace-2 nor the selector says
        // default for sure.
        assert!(says(&mirror.differs, "was not checked"), "{mirror:#?}");
        assert!(!says(&mirror.differs, "allow-to"), "{mirror:#?}");
        assert!(mirror.unmapped.is_empty(), "{mirror:#?}");
    }

    fn mirror_in(namespace: &str) -> Value {
        let mut mirror = yaml(MIRROR);
        mirror["metadata"]["name"] = json!("source-secret");
        mirror["metadata"]["namespace"] = json!(namespace);
        mirror
    }

    #[test]
    fn a_mirror_by_hand_is_a_rule_into_its_namespace_that_orphans_it() {
        let imported = converted(&[yaml(SOURCE), mirror_in("team-a")]);
        let name = "reflector-secret-team-a-source-secret";
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {
                    "ruleType": "secret",
                    "selector": {import_label_key(name): "true"},
                    "namespace": "default",
                    "adopt": true,
                    "targets": {"include": ["team-a"]},
                    "deletionPolicy": {"sourceGone": "Orphan"},
                    "transform": {"stripLabels": ["*"], "stripAnnotations": ["*"]}
                }
            })]
        );
        // The source is default's: only its owner may label it, and let
        // team-a take it.
        assert!(
            imported.source_labels.is_empty(),
            "{:#?}",
            imported.source_labels
        );
        let mirror = report_on(&imported, "Secret team-a/source-secret");
        assert!(
            says(
                &mirror.differs,
                &format!(
                    "the rule takes Secret default/source-secret only while its owner consents: the annotation copyrator.flant.com/allow-to on it listing team-a, and the label {}=true, which only the owner of default may put on it",
                    import_label_key(name)
                )
            ),
            "{mirror:#?}"
        );
        assert!(
            says(&mirror.differs, "deletionPolicy.sourceGone: Orphan"),
            "{mirror:#?}"
        );
        // team-a is not listed, but the namespace-[0-9]* pattern and the
        // selector may allow it.
        assert!(says(&mirror.differs, "was not checked"), "{mirror:#?}");
        assert!(mirror.unmapped.is_empty(), "{mirror:#?}");
    }

    #[test]
    fn a_mirror_its_source_does_not_allow_is_unmapped() {
        let mut source = yaml(SOURCE);
        source["metadata"]["annotations"][format!("{KEY}reflection-allowed-namespaces-selector")] =
            Value::Null;
        source["metadata"]["annotations"][format!("{KEY}reflection-allowed-namespaces")] =
            json!("namespace-1");
        let imported = converted(&[source.clone(), mirror_in("team-a")]);
        assert!(imported.rules.is_empty());
        assert!(says(
            &report_on(&imported, "Secret team-a/source-secret").unmapped,
            "does not allow team-a"
        ));
        let allowed = converted(&[source.clone(), mirror_in("namespace-1")]);
        assert_eq!(allowed.rules.len(), 1);
        // A pattern that is no regular expression: reflector fails on it,
        // unless an earlier pattern allows the mirror's namespace.
        source["metadata"]["annotations"][format!("{KEY}reflection-allowed-namespaces")] =
            json!("*");
        let broken = converted(&[source.clone(), mirror_in("team-a")]);
        assert!(broken.rules.is_empty(), "{:#?}", broken.rules);
        assert!(says(
            &report_on(&broken, "Secret team-a/source-secret").unmapped,
            "\"*\", which is no regular expression"
        ));
        source["metadata"]["annotations"][format!("{KEY}reflection-allowed-namespaces")] =
            json!("team-a,*");
        assert_eq!(
            converted(&[source.clone(), mirror_in("team-a")])
                .rules
                .len(),
            1
        );
        source["metadata"]["annotations"][format!("{KEY}reflection-allowed")] = json!("false");
        let denied = converted(&[source, mirror_in("namespace-1")]);
        assert!(denied.rules.is_empty());
    }

    #[test]
    fn a_mirror_by_hand_where_its_source_mirrors_itself_anyway_makes_no_second_rule() {
        let mut source = yaml(SOURCE);
        source["metadata"]["annotations"][format!("{KEY}reflection-allowed-namespaces-selector")] =
            Value::Null;
        source["metadata"]["annotations"][format!("{KEY}reflection-allowed-namespaces")] =
            json!("team-.*");
        source["metadata"]["annotations"][format!("{KEY}reflection-auto-enabled")] = json!("true");
        source["metadata"]["annotations"][format!("{KEY}reflection-auto-namespaces")] =
            json!("team-a,team-b");
        let imported = converted(&[source.clone(), mirror_in("team-a")]);
        assert_eq!(imported.rules.len(), 1, "{:#?}", imported.rules);
        assert_eq!(
            imported.rules[0]["spec"]["targets"]["include"],
            json!(["team-a", "team-b"]),
            "the automatic mirrors' rule"
        );
        let mirror = report_on(&imported, "Secret team-a/source-secret");
        assert!(
            says(&mirror.differs, "no rule of its own is made"),
            "{mirror:#?}"
        );
        // A mirror where the source does not mirror itself keeps its rule.
        let elsewhere = converted(&[source.clone(), mirror_in("team-c")]);
        assert_eq!(elsewhere.rules.len(), 2, "{:#?}", elsewhere.reports);
        // So does one of another name, beside the automatic mirror.
        let mut renamed = mirror_in("team-a");
        renamed["metadata"]["name"] = json!("local-secret");
        let renamed = converted(&[source, renamed]);
        assert_eq!(renamed.rules.len(), 2, "{:#?}", renamed.reports);
        let mirror = report_on(&renamed, "Secret team-a/local-secret");
        assert!(!says(&mirror.differs, "no rule of its own"), "{mirror:#?}");
        assert_eq!(mirror.rules, ["reflector-secret-team-a-local-secret"]);
        let rule = renamed
            .rules
            .iter()
            .find(|r| r["metadata"]["name"] == "reflector-secret-team-a-local-secret")
            .expect("the mirror's rule");
        assert_eq!(copy_name_of(rule, "source-secret"), "local-secret");
    }

    #[test]
    fn a_tenants_mirror_of_a_source_not_read_asks_nothing_of_the_source() {
        let mut mirror = mirror_in("team-a");
        mirror["metadata"]["name"] = json!("db-creds");
        mirror["metadata"]["annotations"][format!("{KEY}reflects")] = json!("victim/db-creds");
        let imported = converted(&[mirror]);
        let [rule] = imported.rules.as_slice() else {
            panic!("{:#?}", imported.rules);
        };
        // A rule of team-a's, which the operator follows only under the
        // consent of victim's Secret.
        assert_eq!(rule["metadata"]["namespace"], "team-a");
        assert_eq!(rule["spec"]["namespace"], "victim");
        assert!(
            imported.source_labels.is_empty(),
            "{:#?}",
            imported.source_labels
        );
        let report = &imported.reports[0];
        assert!(says(&report.differs, "was not checked"), "{report:#?}");
        assert!(
            says(
                &report.differs,
                "which only the owner of victim may put on it"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "this is team-a's configuration, written by whoever may edit objects there: the rule is team-a's, a tenant rule, followed only when the operator runs with --all-namespaces, and never with conflictPolicy: Overwrite"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "the rule reads and writes as a ServiceAccount of team-a (copyrator"
            ),
            "{report:#?}"
        );
    }

    fn auto_source(annotations: Value) -> Value {
        let mut source = yaml(SOURCE);
        source["metadata"]["namespace"] = json!("default");
        let mut all = json!({format!("{KEY}reflection-allowed"): "True", format!("{KEY}reflection-auto-enabled"): "true"});
        for (key, value) in annotations.as_object().into_iter().flatten() {
            all[format!("{KEY}{key}")] = value.clone();
        }
        source["metadata"]["annotations"] = all;
        source
    }

    #[test]
    fn automatic_mirrors_are_a_rule_into_the_namespaces_both_lists_allow() {
        let imported = converted(&[auto_source(json!({
            "reflection-allowed-namespaces": "namespace-1,namespace-2,namespace-[0-9]*",
            "reflection-auto-namespaces": "namespace-1,namespace-3"
        }))]);
        let spec = &imported.rules[0]["spec"];
        assert_eq!(
            imported.rules[0]["metadata"]["name"],
            "reflector-secret-default-source-secret"
        );
        // namespace-3 is not allowed, namespace-2 not mirrored into.
        assert_eq!(spec["targets"], json!({"include": ["namespace-1"]}));
        assert_eq!(
            spec["transform"],
            json!({"stripLabels": ["*"], "stripAnnotations": ["*"]})
        );
        assert_eq!(spec.get("deletionPolicy"), None);
        let report = &imported.reports[0];
        assert!(
            says(
                &report.differs,
                "pattern \"namespace-[0-9]*\" has no exact glob"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "the closest globs, which match more, are namespace-*"
            ),
            "{report:#?}"
        );
        assert_eq!(imported.source_labels[0].name, "source-secret");
    }

    #[test]
    fn selectors_and_lists_of_automatic_mirrors_map_where_a_rule_can_say_them() {
        let labels = converted(&[auto_source(json!({
            "reflection-allowed-namespaces-selector": "env=production",
            "reflection-auto-namespaces": "team-.*"
        }))]);
        assert_eq!(
            labels.rules[0]["spec"]["targets"],
            json!({"include": ["team-*"], "namespaceSelector": {"matchLabels": {"env": "production"}}})
        );
        let both = converted(&[auto_source(json!({
            "reflection-allowed-namespaces": "a",
            "reflection-allowed-namespaces-selector": "env=production"
        }))]);
        assert!(both.rules.is_empty());
        assert!(
            says(&both.reports[0].unmapped, "matches either"),
            "{:#?}",
            both.reports
        );
        let wildcards = converted(&[auto_source(json!({
            "reflection-allowed-namespaces": "team-.*",
            "reflection-auto-namespaces": "team-a.*"
        }))]);
        assert!(wildcards.rules.is_empty());
        assert!(says(&wildcards.reports[0].unmapped, "no list of globs"));
        let needs_allowed = converted(&[auto_source(json!({"reflection-allowed": "no"}))]);
        assert!(needs_allowed.rules.is_empty());
        assert!(says(
            &needs_allowed.reports[0].unmapped,
            "needs reflection-allowed"
        ));
    }

    #[test]
    fn every_namespace_but_some_is_the_rules_targets_exclude() {
        let imported = converted(&[auto_source(json!({
            "reflection-allowed-namespaces": "^(?!(kube-system|kube-public)$).*$",
            "reflection-auto-namespaces": "(?!secret-).*"
        }))]);
        assert_eq!(
            imported.rules[0]["spec"]["targets"],
            json!({"exclude": ["kube-system", "kube-public", "secret-*"]})
        );
        let report = &imported.reports[0];
        assert!(report.unmapped.is_empty(), "{report:#?}");
        let only_auto = converted(&[auto_source(json!({
            "reflection-allowed-namespaces": "namespace-1,namespace-2",
            "reflection-auto-namespaces": "(?!namespace-2$).*"
        }))]);
        assert_eq!(
            only_auto.rules[0]["spec"]["targets"],
            json!({"include": ["namespace-1", "namespace-2"], "exclude": ["namespace-2"]})
        );
    }

    /// Both lists meet only in the source's own namespace: neither tool
    /// copies anything, and the report says so, with no rule and no label.
    #[test]
    fn lists_that_meet_only_in_the_sources_namespace_copy_nothing() {
        let source = auto_source(json!({
            "reflection-allowed-namespaces": "default,namespace-1",
            "reflection-auto-namespaces": "default"
        }));
        let imported = converted(&[source]);
        assert!(imported.rules.is_empty(), "{:#?}", imported.rules);
        assert!(imported.source_labels.is_empty());
        let report = &imported.reports[0];
        assert!(
            report.unmapped.is_empty() && report.differs.is_empty(),
            "{report:#?}"
        );
        assert!(
            report
                .exact
                .iter()
                .any(|l| l.contains("meet only in its own namespace")),
            "{report:#?}"
        );
        assert!(
            !report
                .exact
                .iter()
                .any(|l| l.contains("the rule copies there"))
        );
        // Beside another namespace, the source's own is left out.
        let source = auto_source(json!({
            "reflection-allowed-namespaces": "default,namespace-1",
            "reflection-auto-namespaces": "default,namespace-1"
        }));
        let imported = converted(&[source]);
        assert_eq!(
            imported.rules[0]["spec"]["targets"],
            json!({"include": ["namespace-1"]})
        );
    }

    /// RFL README.md, "cert-manager support": the annotations go on the
    /// Certificate's `spec.secretTemplate` (or an Ingress's
    /// `cert-manager.io/secret-template`), and reach the Secret.
    #[test]
    fn cert_managers_secret_templates_are_read_as_their_secrets() {
        let annotations = json!({
            format!("{KEY}reflection-allowed"): "true",
            format!("{KEY}reflection-allowed-namespaces"): "namespace-1,namespace-2",
            format!("{KEY}reflection-auto-enabled"): "true",
            format!("{KEY}reflection-auto-namespaces"): "namespace-1"
        });
        let certificate = json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "web", "namespace": "certs"},
            "spec": {"secretName": "web-tls", "secretTemplate": {"annotations": annotations.clone()},
                     "issuerRef": {"name": "ca"}, "dnsNames": ["web.example.com"]}
        });
        let ingress = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "shop", "namespace": "certs", "annotations": {
                "cert-manager.io/cluster-issuer": "ca",
                "cert-manager.io/secret-template": json!({"annotations": annotations}).to_string()
            }},
            "spec": {"tls": [{"hosts": ["shop.example.com"], "secretName": "shop-tls"}]}
        });
        let imported = converted(&[certificate.clone(), ingress]);
        assert_eq!(imported.rules.len(), 2, "{:#?}", imported.reports);
        for secret in ["shop-tls", "web-tls"] {
            let report = imported
                .reports
                .iter()
                .find(|r| r.source.ends_with(&format!("its Secret certs/{secret}")))
                .unwrap_or_else(|| panic!("no report of {secret}: {:#?}", imported.reports));
            assert!(
                report.exact[0].starts_with("cert-manager puts"),
                "{report:#?}"
            );
            assert!(report.unmapped.is_empty(), "{report:#?}");
        }
        let names: Vec<&str> = imported
            .source_labels
            .iter()
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(names, ["shop-tls", "web-tls"]);
        assert_eq!(
            imported.rules[1]["spec"]["targets"],
            json!({"include": ["namespace-1"]})
        );
        // With the Secret read too, it is converted once, as itself.
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "web-tls", "namespace": "certs",
                         "annotations": certificate["spec"]["secretTemplate"]["annotations"]}});
        let imported = converted(&[certificate, secret]);
        assert_eq!(imported.reports.len(), 1, "{:#?}", imported.reports);
        assert_eq!(imported.reports[0].source, "Secret certs/web-tls");
    }

    #[test]
    fn a_mirror_that_names_itself_copies_nothing() {
        let mut mirror = mirror_in("default");
        mirror["metadata"]["annotations"][format!("{KEY}reflects")] =
            json!("default/source-secret");
        let imported = converted(&[mirror]);
        assert!(imported.rules.is_empty());
        assert_eq!(
            imported.reports[0].unmapped,
            ["reflects names this object itself: it copies nothing, and no rule is made"]
        );
    }

    #[test]
    fn automatic_mirrors_are_not_configuration() {
        let mut mirror = mirror_in("team-a");
        mirror["metadata"]["annotations"][format!("{KEY}auto-reflects")] = json!("True");
        let imported = converted(&[mirror]);
        assert!(imported.reports.is_empty(), "{:#?}", imported.reports);
    }
}
