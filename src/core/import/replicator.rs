//! kubernetes-replicator: a source's push annotations (`replicate-to`,
//! `replicate-to-matching`), and objects that pull from a source
//! (`replicate-from`), which the source permits (`replication-allowed*`).
//! The annotations are the configuration of the namespace of the object
//! that carries them: the source's for a push, the pulling object's for a
//! pull; the rule is a tenant rule there (see `shared::Owner`).

use serde_json::{Value, json};

use super::SourceReport;
use super::patterns::{Anchoring, Selector, everything_but, pattern_list};
use super::shared::{
    Context, Conversion, Draft, Named, Owner, Source, Targets, annotation, kind_notes,
    pulled_source, renaming, spec_of, str_at, strip_all,
};

pub(super) const TOOL: &str = "kubernetes-replicator";
pub(super) const PREFIX: &str = "replicator.v1.mittwald.de/";

fn replicator_annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    annotation(object, &format!("{PREFIX}{key}"))
}

/// The kinds replicator copies.
fn is_replicated_kind(object: &Value) -> bool {
    matches!(
        (str_at(object, &["apiVersion"]), str_at(object, &["kind"])),
        (Some("v1"), Some("Secret" | "ConfigMap" | "ServiceAccount"))
            | (
                Some("rbac.authorization.k8s.io/v1"),
                Some("Role" | "RoleBinding")
            )
    )
}

pub(super) fn convert(object: &Value, context: &Context) -> Option<Conversion> {
    if !is_replicated_kind(object) {
        return None;
    }
    let has = |key: &str| replicator_annotation(object, key).is_some();
    let pushes = has("replicate-to") || has("replicate-to-matching");
    let pulls = replicator_annotation(object, "replicate-from");
    let permits = has("replication-allowed") || has("replication-allowed-namespaces");
    if !pushes && pulls.is_none() && !permits {
        return None;
    }
    let named = Named::of(object)?;
    let mut report = named.report(TOOL);
    let mut drafts = Vec::new();
    if pushes {
        match push(object, &named, context, &mut report) {
            Ok(draft) => drafts.push(draft),
            Err(why) => report.unmapped(why),
        }
    }
    if let Some(from) = pulls {
        match pull(&named, from, context, &mut report) {
            Ok(draft) => drafts.push(draft),
            Err(why) => report.unmapped(why),
        }
    }
    if permits {
        report.exact("replication-allowed permits pulls: by itself it copies nothing; each object that pulls from it (replicate-from) is imported on its own");
    }
    Some(report.with(drafts))
}

/// The rule that pushes a source into the namespaces its annotations select.
fn push(
    object: &Value,
    named: &Named,
    context: &Context,
    report: &mut SourceReport,
) -> Result<Draft, String> {
    let owner = Owner::of_namespace(&named.namespace, context.options);
    owner.kind_refusal(&named.api_version, &named.kind)?;
    let targets = push_targets(object, report)?;
    if let Some(why) = targets.refusal() {
        return Err(why);
    }
    if targets.reaches_nothing() {
        return Err(
            "replicate-to matches no namespace: replicator copies nowhere, and no rule is made"
                .into(),
        );
    }
    report.exact(format!(
        "copies go into {}: the rule copies there",
        targets.describe()
    ));
    report.exact("namespaces made later get copies, as with the rule");
    if replicator_annotation(object, "replicate-to-matching").is_some() {
        report.exact("copies go when their namespace stops matching replicate-to-matching, as the rule's do (deletionPolicy.targetLeft: Delete)");
    }
    report.exact("copies stay when the annotations are removed from the source: the rule keeps them when it is deleted (deletionPolicy.ruleDeleted: Orphan)");
    let strip_labels = replicator_annotation(object, "strip-labels").is_some();
    if strip_labels {
        report.exact("strip-labels: none of the source's labels and annotations are copied (transform.stripLabels, stripAnnotations: [\"*\"])");
    } else {
        report.exact("the source's labels are copied, its annotations not (transform.stripAnnotations: [\"*\"])");
    }
    if replicator_annotation(object, "replicate-to").is_some() {
        report.differs("when the source is deleted, replicator deletes the objects of its name in the namespaces replicate-to matches without anchors (a part of the name is enough, so more than it copied into), and of a Secret or ConfigMap whose keys changed it removes its keys only; the rule deletes its own copies (deletionPolicy.sourceGone: Delete)");
    } else {
        // replicate-to-matching alone: replicator's deletion lists the
        // namespaces the selector matches then, and deletes there.
        report.differs("when the source is deleted, replicator deletes the object of its name in every namespace replicate-to-matching selects at that time, whoever made it, and of a Secret or ConfigMap whose keys changed it removes its keys only; the rule deletes its own copies (deletionPolicy.sourceGone: Delete)");
    }
    report.differs("replicator leaves an edited copy alone until its source changes (it compares versions); the rule restores it (syncPolicy: Sync)");
    report.differs(format!("replicator overwrites an object of that name that it did not make; the rule adopts one holding the same content and skips one holding other content (conflictPolicy: Skip); {}", owner.overwrite_note()));
    if replicator_annotation(object, "keep-owner-references") == Some("true") {
        report.differs("keep-owner-references: replicator copies the source's ownerReferences, Copyrator does not");
    }
    for note in kind_notes(&named.api_version, &named.kind, TOOL) {
        report.differs(note);
    }
    if let Some(note) = targets.protected_note(TOOL, context.options) {
        report.differs(note);
    }
    let mut entries = vec![
        ("deletionPolicy", json!({"ruleDeleted": "Orphan"})),
        ("transform", strip_all(strip_labels)),
    ];
    entries.extend(targets.to_json().map(|t| ("targets", t)));
    Ok(Draft {
        name: named.rule_name("replicator"),
        owner,
        api_version: named.api_version.clone(),
        kind: named.kind.clone(),
        source: Source::Named {
            namespace: named.namespace.clone(),
            name: named.name.clone(),
        },
        spec: spec_of(&entries),
        naming: None,
    })
}

/// The namespaces `replicate-to` (patterns, matched whole) and
/// `replicate-to-matching` (a selector) select, either one.
fn push_targets(object: &Value, report: &mut SourceReport) -> Result<Targets, String> {
    if let Some(pattern) = replicator_annotation(object, "replicate-to").map(str::trim)
        && !pattern.contains(',')
        && replicator_annotation(object, "replicate-to-matching").is_none()
        && let Some(excluded) = everything_but(pattern)
    {
        report.exact(format!(
            "replicate-to {pattern:?} says every namespace but those matching {}: the rule's targets.exclude",
            excluded.join(", ")
        ));
        return Ok(Targets {
            exclude: excluded,
            ..Targets::default()
        });
    }
    let names = replicator_annotation(object, "replicate-to").map(|list| {
        let found = pattern_list(list.split(',').map(str::trim), Anchoring::Strict);
        for note in &found.notes {
            report.exact(note.clone());
        }
        for line in
            found.inexact_lines("it is left out, so the namespaces only it matches get no copies")
        {
            report.differs(line);
        }
        found
    });
    if let Some(found) = &names
        && found.globs.is_empty()
        && !found.inexact.is_empty()
    {
        return Err("no pattern of replicate-to has an exact glob".into());
    }
    let names = names.map(|found| found.globs);
    let Some(matching) = replicator_annotation(object, "replicate-to-matching") else {
        return Ok(Targets {
            include: names,
            ..Targets::default()
        });
    };
    let selector = Selector::parse(matching).map_err(|e| {
        format!("replicate-to-matching {matching:?} is not a selector a rule can hold: {e}")
    })?;
    match (names, selector) {
        (_, None) => {
            report.exact("replicate-to-matching is empty, which selects every namespace");
            Ok(Targets::default())
        }
        (None, Some(selector)) => Ok(Targets {
            selector: Some(selector),
            ..Targets::default()
        }),
        (Some(globs), Some(selector)) => {
            report.unmapped(format!(
                "replicate-to-matching {}: replicator copies into the namespaces either annotation selects, while a rule's targets must match all they say, and a second rule would claim the same copies where both select: the namespaces only the selector selects get no copies from this rule",
                selector.text()
            ));
            Ok(Targets::including(globs))
        }
    }
}

/// The rule that fills an object that pulls from a source: the source
/// copied into that object's namespace alone, under that object's name.
fn pull(
    target: &Named,
    from: &str,
    context: &Context,
    report: &mut SourceReport,
) -> Result<Draft, String> {
    let owner = Owner::of_namespace(&target.namespace, context.options);
    owner.kind_refusal(&target.api_version, &target.kind)?;
    let (namespace, name) = pulled_source(target, from, "replicate-from")?;
    let renaming = renaming(name, &target.name, false, "the name the replica has")?;
    match context.find(&target.kind, namespace, name) {
        Some(source) => permitted(source, &target.namespace, report)?,
        None => report.differs(format!(
            "the source {} {namespace}/{name} was not among the objects read: whether it permits replication into {} was not checked",
            target.kind, target.namespace
        )),
    }
    report.exact(format!(
        "pulls {} {namespace}/{name}: the rule copies it into {} alone, its source selected by the rule's import label, to be put on it",
        target.kind, target.namespace
    ));
    if let Some(renaming) = &renaming {
        report.exact(renaming.line.clone());
    }
    report.differs("when the source goes, replicator empties this object (removes its data) instead of deleting it; the closest is deletionPolicy.sourceGone: Orphan, which keeps it as it is, data and all");
    report.differs("how replicator treats the labels of an object that pulls was not researched (unconfirmed): the rule's copy carries the source's labels, none of its annotations");
    for note in kind_notes(&target.api_version, &target.kind, TOOL) {
        report.differs(note);
    }
    Ok(Draft {
        name: target.rule_name("replicator"),
        owner,
        api_version: target.api_version.clone(),
        kind: target.kind.clone(),
        source: Source::Named {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        spec: spec_of(&[
            ("targets", json!({"include": [target.namespace]})),
            ("deletionPolicy", json!({"sourceGone": "Orphan"})),
            ("transform", strip_all(false)),
        ]),
        naming: renaming.map(|r| r.name),
    })
}

/// Go's `strconv.ParseBool` true.
fn go_true(text: &str) -> bool {
    matches!(text, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Whether the source lets replicator fill an object in `namespace`; an
/// error when it surely does not.
fn permitted(source: &Value, namespace: &str, report: &mut SourceReport) -> Result<(), String> {
    let denied = |why: &str| {
        format!(
            "{why}, so replicator does not fill this object (unless it runs with --allow-all): no rule is made"
        )
    };
    if !replicator_annotation(source, "replication-allowed").is_some_and(go_true) {
        return Err(denied(
            "the source does not allow replication (replication-allowed)",
        ));
    }
    let Some(list) = replicator_annotation(source, "replication-allowed-namespaces") else {
        return Err(denied("the source names no replication-allowed-namespaces"));
    };
    match pattern_list(list.split(',').map(str::trim), Anchoring::Strict).matches(namespace) {
        Some(true) => Ok(()),
        Some(false) => Err(denied(&format!(
            "the source's replication-allowed-namespaces does not allow {namespace}"
        ))),
        None => {
            report.differs(format!(
                "whether the source's replication-allowed-namespaces allows {namespace} (by a pattern without an exact glob) was not checked"
            ));
            Ok(())
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{Value, json};

    use super::super::kyverno::tests::yaml;
    use super::super::shared::import_label_key;
    use super::super::shared::tests::{converted, copy_name_of, says};

    // RP README.md: push by name.
    const PUSH_TO: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: test-secret
  annotations:
    replicator.v1.mittwald.de/replicate-to: "my-ns-1,namespace-[0-9]*"
data:
  key1: <value>
"#;

    // RP README.md: push by label selector.
    const PUSH_MATCHING: &str = r"
apiVersion: v1
kind: Secret
metadata:
  name: test-secret
  annotations:
    replicator.v1.mittwald.de/replicate-to-matching: >
      my-label=value,my-other-label,my-other-label notin (foo,bar)
data:
  key1: <value>
";

    // RP README.md: an object that pulls.
    const PULL: &str = r"
apiVersion: v1
kind: Secret
metadata:
  name: secret-replica
  annotations:
    replicator.v1.mittwald.de/replicate-from: default/some-secret
data: {}
";

    // RP README.md §Step 1: the source that permits pulls.
    const PULL_SOURCE: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: test-secret
  annotations:
    replicator.v1.mittwald.de/replication-allowed: "true"
    replicator.v1.mittwald.de/replication-allowed-namespaces: "my-ns-1,namespace-[0-9]*"
data:
  key1: <value>
"#;

    /// The documented objects; the three of one name in namespaces of
    /// their own, so that none stands for another.
    pub(crate) fn documented() -> Vec<Value> {
        [
            (PUSH_TO, "push-to"),
            (PUSH_MATCHING, "push-matching"),
            (PULL, "default"),
            (PULL_SOURCE, "pull-source"),
        ]
        .into_iter()
        .map(|(text, namespace)| {
            let mut object = yaml(text);
            object["metadata"]["namespace"] = json!(namespace);
            object
        })
        .collect()
    }

    #[test]
    fn a_push_by_name_is_a_rule_into_the_names_a_glob_can_say() {
        let imported = converted(&[yaml(PUSH_TO)]);
        let name = "replicator-secret-default-test-secret";
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
                    "targets": {"include": ["my-ns-1"]},
                    "deletionPolicy": {"ruleDeleted": "Orphan"},
                    "transform": {"stripAnnotations": ["*"]}
                }
            })]
        );
        assert_eq!(imported.source_labels[0].name, "test-secret");
        let report = &imported.reports[0];
        assert_eq!(report.tool, "kubernetes-replicator");
        assert_eq!(report.source, "Secret default/test-secret");
        assert!(
            says(
                &report.differs,
                "pattern \"namespace-[0-9]*\" has no exact glob"
            ),
            "{report:#?}"
        );
        assert!(says(&report.differs, "namespace-*"), "{report:#?}");
        assert!(says(&report.differs, "without anchors"), "{report:#?}");
        assert!(
            says(&report.exact, "deletionPolicy.ruleDeleted: Orphan"),
            "{report:#?}"
        );
        assert!(
            says(&report.differs, "the rule is default's, a tenant rule"),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "a tenant rule may not use conflictPolicy: Overwrite"
            ),
            "{report:#?}"
        );
    }

    /// "Every namespace but these", as a negative lookahead of plain
    /// names: the rule's targets.exclude.
    #[test]
    fn a_push_to_every_namespace_but_some_excludes_them() {
        let mut object = yaml(PUSH_TO);
        object["metadata"]["annotations"]["replicator.v1.mittwald.de/replicate-to"] =
            json!("(?!kube-system$|kube-public$|team-).*");
        let imported = converted(&[object]);
        assert_eq!(
            imported.rules[0]["spec"]["targets"],
            json!({"exclude": ["kube-system", "kube-public", "team-*"]})
        );
        let report = &imported.reports[0];
        assert!(report.unmapped.is_empty(), "{report:#?}");
        assert!(says(&report.exact, "targets.exclude"), "{report:#?}");
    }

    #[test]
    fn a_push_by_selector_is_a_rule_with_that_namespace_selector() {
        let imported = converted(&[yaml(PUSH_MATCHING)]);
        assert_eq!(
            imported.rules[0]["spec"]["targets"],
            json!({"namespaceSelector": {
                "matchLabels": {"my-label": "value"},
                "matchExpressions": [
                    {"key": "my-other-label", "operator": "Exists"},
                    {"key": "my-other-label", "operator": "NotIn", "values": ["foo", "bar"]}
                ]
            }})
        );
        let report = &imported.reports[0];
        assert!(
            says(
                &report.differs,
                "kube-system, kube-public, kube-node-lease, copyrator where their labels match"
            ),
            "{report:#?}"
        );
        assert!(report.unmapped.is_empty(), "{report:#?}");
        // Its deletion reaches the namespaces the selector matches, not
        // what a name pattern matches without anchors.
        assert!(
            says(
                &report.differs,
                "in every namespace replicate-to-matching selects"
            ),
            "{report:#?}"
        );
        assert!(!says(&report.differs, "without anchors"), "{report:#?}");
    }

    #[test]
    fn the_documented_pull_is_a_rule_naming_its_copy_as_the_replica_and_the_source_only_permits() {
        let imported = converted(&[yaml(PULL), yaml(PULL_SOURCE)]);
        let name = "replicator-secret-default-secret-replica";
        // It pulls default/some-secret into its own namespace, beside it.
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
                        "stripAnnotations": ["*"],
                        "name": {"template": "secret-replica"}
                    }
                }
            })]
        );
        assert_eq!(
            copy_name_of(&imported.rules[0], "some-secret"),
            "secret-replica"
        );
        let labelled: Vec<(&str, &str)> = imported
            .source_labels
            .iter()
            .map(|l| (l.namespace.as_str(), l.name.as_str()))
            .collect();
        assert_eq!(
            labelled,
            [("default", "some-secret")],
            "its own namespace's"
        );
        let pull = imported
            .reports
            .iter()
            .find(|r| r.source == "Secret default/secret-replica")
            .expect("reported");
        assert_eq!(
            pull.exact,
            [
                "pulls Secret default/some-secret: the rule copies it into default alone, its source selected by the rule's import label, to be put on it",
                "copies are named secret-replica, the name the replica has (transform.name.template)",
            ]
        );
        assert!(pull.unmapped.is_empty(), "{pull:#?}");
        assert!(
            says(&pull.differs, "the rule is default's, a tenant rule"),
            "{pull:#?}"
        );
        // Within its own namespace it asks no one's consent.
        assert!(!says(&pull.differs, "allow-to"), "{pull:#?}");
        assert!(!says(&pull.differs, "accept-from"), "{pull:#?}");
        // test-secret is not what it pulls.
        assert!(says(&pull.differs, "was not checked"), "{pull:#?}");
        let source = imported
            .reports
            .iter()
            .find(|r| r.source == "Secret default/test-secret")
            .expect("reported");
        assert!(says(&source.exact, "permits pulls"), "{source:#?}");
        assert!(source.rules.is_empty());
    }

    #[test]
    fn a_pull_under_another_name_from_another_namespace_asks_its_owner() {
        let mut source = yaml(PULL_SOURCE);
        source["metadata"]["namespace"] = json!("default");
        let mut pull = pull_into("my-ns-1");
        pull["metadata"]["name"] = json!("local-copy");
        let imported = converted(&[source, pull]);
        let name = "replicator-secret-my-ns-1-local-copy";
        let [rule] = imported.rules.as_slice() else {
            panic!("{:#?}", imported.reports);
        };
        assert_eq!(
            rule["metadata"],
            json!({"name": name, "namespace": "my-ns-1"})
        );
        assert_eq!(rule["spec"]["namespace"], "default");
        assert_eq!(rule["spec"]["targets"], json!({"include": ["my-ns-1"]}));
        assert_eq!(copy_name_of(rule, "test-secret"), "local-copy");
        assert!(imported.source_labels.is_empty(), "default's object");
        let report = imported
            .reports
            .iter()
            .find(|r| r.source == "Secret my-ns-1/local-copy")
            .expect("reported");
        assert!(
            says(
                &report.exact,
                "copies are named local-copy, the name the replica has (transform.name.template)"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "the annotation copyrator.flant.com/allow-to on it listing my-ns-1"
            ),
            "{report:#?}"
        );
        // An object that names itself pulls nothing.
        let mut itself = yaml(PULL);
        itself["metadata"]["annotations"]["replicator.v1.mittwald.de/replicate-from"] =
            json!("default/secret-replica");
        let itself = converted(&[itself]);
        assert!(itself.rules.is_empty());
        assert_eq!(
            itself.reports[0].unmapped,
            ["replicate-from names this object itself: it copies nothing, and no rule is made"]
        );
    }

    fn pull_into(namespace: &str) -> Value {
        let mut pull = yaml(PULL);
        pull["metadata"]["name"] = json!("test-secret");
        pull["metadata"]["namespace"] = json!(namespace);
        pull["metadata"]["annotations"]["replicator.v1.mittwald.de/replicate-from"] =
            json!("default/test-secret");
        pull
    }

    #[test]
    fn a_pull_the_source_allows_is_a_rule_into_its_namespace() {
        let mut source = yaml(PULL_SOURCE);
        source["metadata"]["namespace"] = json!("default");
        let imported = converted(&[source.clone(), pull_into("my-ns-1")]);
        let name = "replicator-secret-my-ns-1-test-secret";
        assert_eq!(imported.rules[0]["metadata"]["name"], name);
        assert_eq!(imported.rules[0]["metadata"]["namespace"], "my-ns-1");
        assert!(
            imported.source_labels.is_empty(),
            "default's object, not my-ns-1's"
        );
        assert_eq!(
            imported.rules[0]["spec"],
            json!({
                "ruleType": "secret",
                "selector": {import_label_key(name): "true"},
                "namespace": "default",
                "adopt": true,
                "targets": {"include": ["my-ns-1"]},
                "deletionPolicy": {"sourceGone": "Orphan"},
                "transform": {"stripAnnotations": ["*"]}
            })
        );
        let report = imported
            .reports
            .iter()
            .find(|r| r.source == "Secret my-ns-1/test-secret")
            .expect("reported");
        assert!(says(&report.differs, "empties this object"), "{report:#?}");
        assert!(
            says(
                &report.differs,
                "the annotation copyrator.flant.com/allow-to on it listing my-ns-1"
            ),
            "{report:#?}"
        );
        let refused = converted(&[source.clone(), pull_into("other")]);
        assert!(refused.rules.is_empty());
        assert!(
            refused
                .reports
                .iter()
                .any(|r| says(&r.unmapped, "does not allow other"))
        );
        let unknown = converted(&[source, pull_into("namespace-5")]);
        assert_eq!(
            unknown.rules.len(),
            1,
            "a pattern without an exact glob may allow it"
        );
        assert!(
            unknown
                .reports
                .iter()
                .any(|r| says(&r.differs, "was not checked"))
        );
    }

    #[test]
    fn stripped_labels_roles_and_both_push_annotations() {
        let mut role = yaml(PUSH_TO);
        role["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
        role["kind"] = json!("Role");
        role["metadata"]["namespace"] = json!("copyrator");
        role["metadata"]["annotations"]["replicator.v1.mittwald.de/strip-labels"] = json!("");
        role["metadata"]["annotations"]["replicator.v1.mittwald.de/replicate-to-matching"] =
            json!("team");
        let imported = converted(&[role]);
        let spec = &imported.rules[0]["spec"];
        assert_eq!(
            spec["objectType"],
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role"})
        );
        assert_eq!(spec["rbacSourcesTrusted"], true);
        assert_eq!(
            spec["transform"],
            json!({"stripLabels": ["*"], "stripAnnotations": ["*"]})
        );
        assert_eq!(spec["targets"], json!({"include": ["my-ns-1"]}));
        let report = &imported.reports[0];
        assert!(
            says(&report.unmapped, "replicate-to-matching team"),
            "{report:#?}"
        );
        assert!(
            says(&report.differs, "rbacSourcesTrusted: true"),
            "{report:#?}"
        );
    }

    #[test]
    fn a_tenants_roles_and_service_accounts_make_no_rule() {
        for (api_version, kind) in [
            ("rbac.authorization.k8s.io/v1", "RoleBinding"),
            ("v1", "ServiceAccount"),
        ] {
            let mut push = yaml(PUSH_TO);
            push["apiVersion"] = json!(api_version);
            push["kind"] = json!(kind);
            push["metadata"]["namespace"] = json!("team-a");
            let mut pull = pull_into("team-a");
            pull["apiVersion"] = json!(api_version);
            pull["kind"] = json!(kind);
            for object in [push, pull] {
                let imported = converted(&[object]);
                assert!(imported.rules.is_empty(), "{kind}: {:#?}", imported.rules);
                assert!(imported.source_labels.is_empty());
                assert!(
                    says(
                        &imported.reports[0].unmapped,
                        "this is team-a's configuration, so its rule would be team-a's (a tenant rule), and a tenant rule copies ConfigMaps and Secrets only"
                    ),
                    "{:#?}",
                    imported.reports
                );
            }
        }
    }
}
