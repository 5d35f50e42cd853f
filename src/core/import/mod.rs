//! Other copying tools' configuration as CopyratorRules, pure: Kyverno's
//! generate rules and GeneratingPolicies, kubernetes-reflector's,
//! kubernetes-replicator's and config-syncer's annotations, ClusterSecrets.
//! Each configuration found gets a report of what maps exactly, what
//! differs and what cannot be mapped. Secret data is never read into the
//! output: only names and keys.
//!
//! Copyrator selects sources by label only, so a rule made from a
//! configuration that names one source selects the label
//! `copyrator.flant.com/import.<rule>: "true"`, which the caller asks the
//! user to put on that source ([`SourceLabel`]). Every rule adopts the
//! copies already in place (`spec.adopt: true`).
//!
//! A rule has no more authority than whoever wrote the configuration it
//! is made from (`shared::Owner`). Cluster-scoped configuration (a
//! ClusterPolicy, a GeneratingPolicy, a ClusterSecret) is the cluster
//! admins': its rules are made in the operator's namespace. A namespace's
//! configuration (the annotations of reflector, replicator and
//! config-syncer on its objects) makes tenant rules in that namespace,
//! which write only where namespaces accept them and take from elsewhere
//! only what sources consent to give; a source label is asked for only on
//! objects of the rule's own namespace. Kyverno lets a namespaced Policy
//! clone only within its namespace: it makes a rule of that namespace
//! where it clones a source there under another name, else none.
//!
//! A copy named otherwise than its source (Kyverno's `generate.name`, an
//! object that pulls or mirrors under its own name, a ClusterSecret of
//! another name than its source) is named by the rule's `transform.name`:
//! Kyverno's as the source's name with a prefix and/or a suffix where the
//! copy's name is that, otherwise as one fixed name (a template without
//! `{name}`), which fits as each such rule selects one source.

mod cert_manager;
mod cluster_secret;
#[cfg(test)]
mod corpus;
mod kubed;
mod kyverno;
mod patterns;
mod reflector;
mod replicator;
mod shared;

use serde::Serialize;

/// Options of a conversion.
pub(crate) struct Options {
    /// The operator's namespace, where the rules made from cluster-scoped
    /// configuration (and from this namespace's own) go.
    pub(crate) rule_namespace: String,
}

/// What the conversion made of the objects it was given.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Imported {
    /// CopyratorRules as whole objects (apiVersion flant.com/v1, kind
    /// CopyratorRule, metadata {name, namespace}, spec), by name.
    pub(crate) rules: Vec<serde_json::Value>,
    /// Labels to put on sources before applying the rules.
    pub(crate) source_labels: Vec<SourceLabel>,
    /// One per configuration found (a Kyverno rule, an annotated object, a
    /// ClusterSecret ...), by tool and source.
    pub(crate) reports: Vec<SourceReport>,
}

/// A label a rule selects its source by, to be put on that source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SourceLabel {
    /// `ConfigMap`, `Secret`, or another kind.
    pub(crate) kind: String,
    pub(crate) api_version: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) value: String,
}

/// What became of one configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SourceReport {
    /// `Kyverno`, `kubernetes-reflector`, `kubernetes-replicator`,
    /// `config-syncer` or `ClusterSecret`.
    pub(crate) tool: String,
    /// The configuration: `ClusterPolicy sync-secrets, rule
    /// sync-image-pull-secret`, `Secret default/regcred`, `ClusterSecret
    /// global-secret`.
    pub(crate) source: String,
    /// Names of the rules made from it (maybe none).
    pub(crate) rules: Vec<String>,
    /// What maps exactly.
    pub(crate) exact: Vec<String>,
    /// What differs and how, with the closest rule setting chosen.
    pub(crate) differs: Vec<String>,
    /// What cannot be mapped, and why.
    pub(crate) unmapped: Vec<String>,
}

/// Convert every recognised object among `objects` (Kubernetes objects as
/// JSON: Kyverno ClusterPolicy/Policy, GeneratingPolicy, objects carrying
/// reflector, replicator or config-syncer annotations, ClusterSecrets);
/// others are ignored. The same objects in any order give the same result.
pub(crate) fn import(objects: &[serde_json::Value], options: &Options) -> Imported {
    let distinct = shared::distinct_objects(objects);
    let objects: Vec<serde_json::Value> = distinct.iter().map(|(o, _)| o.clone()).collect();
    let context = shared::Context {
        objects: &objects,
        options,
    };
    let mut conversions = Vec::new();
    for (object, definitions) in &distinct {
        let mut of_object = Vec::new();
        of_object.extend(kyverno::convert(object, &context));
        of_object.extend(reflector::convert(object, &context));
        of_object.extend(cert_manager::convert(object, &context));
        of_object.extend(replicator::convert(object, &context));
        of_object.extend(kubed::convert(object, &context));
        of_object.extend(cluster_secret::convert(object, &context));
        if *definitions > 1 {
            for conversion in &mut of_object {
                conversion.report.differs.insert(0, format!(
                    "the input defines this object {definitions} times, differently: one was read (the same whatever their order), but the cluster holds the one applied last: check which it is"
                ));
            }
        }
        conversions.extend(of_object);
    }
    shared::assemble(conversions, options)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::shared::tests::{assert_rules_resolve, options};
    use super::*;

    /// What `import` makes of `objects`, every rule checked.
    fn converted(objects: &[serde_json::Value]) -> Imported {
        let imported = import(objects, &options());
        assert_rules_resolve(&imported);
        imported
    }

    fn everything() -> Vec<serde_json::Value> {
        let mut objects = kyverno::tests::documented();
        objects.extend(reflector::tests::documented());
        objects.extend(replicator::tests::documented());
        objects.extend(kubed::tests::documented());
        objects.extend(cluster_secret::tests::documented());
        objects
    }

    #[test]
    fn objects_of_no_tool_are_ignored() {
        let objects = vec![
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "plain", "namespace": "default",
                                "annotations": {"example.com/sync": "true"}},
                   "data": {"a": "b"}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
            json!({"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
                   "metadata": {"name": "validate-only"},
                   "spec": {"rules": [{"name": "check", "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                                        "validate": {"pattern": {"spec": {}}}}]}}),
            json!({"apiVersion": "example.com/v1", "kind": "ClusterSecret", "metadata": {"name": "x"}}),
            json!("not an object"),
            json!(null),
        ];
        let imported = converted(&objects);
        assert!(imported.rules.is_empty(), "{:?}", imported.rules);
        assert!(imported.source_labels.is_empty());
        assert!(imported.reports.is_empty(), "{:?}", imported.reports);
    }

    #[test]
    fn the_same_objects_in_another_order_give_the_same_result() {
        let mut objects = everything();
        // Two versions of one object: the same one counts, whichever came first.
        let mut older = kubed::tests::documented()[0].clone();
        older["metadata"]["annotations"] = json!({"kubed.appscode.com/sync": "app=old"});
        objects.insert(0, older.clone());
        let imported = converted(&objects);
        assert!(imported.rules.len() > 5, "{}", imported.rules.len());
        assert_rules_resolve(&imported);
        let expected = serde_json::to_string(&imported).expect("serializes");
        let mut shuffled = objects.clone();
        shuffled.reverse();
        let half = shuffled.len() / 2;
        shuffled.rotate_left(half);
        // Read twice, as from the cluster and a file, and inside a List.
        shuffled.push(json!({"apiVersion": "v1", "kind": "List", "items": objects.clone()}));
        let again = serde_json::to_string(&converted(&shuffled)).expect("serializes");
        assert_eq!(again, expected);
        let newer = kubed::tests::documented()[0].clone();
        assert_eq!(
            serde_json::to_string(&converted(&[older.clone(), newer.clone()])).expect("serializes"),
            serde_json::to_string(&converted(&[newer, older.clone()])).expect("serializes"),
            "two versions of one object, either first"
        );
        // And the report says the input defined it twice.
        let twice = converted(&[older.clone(), kubed::tests::documented()[0].clone()]);
        assert!(
            twice.reports.iter().all(|r| r
                .differs
                .iter()
                .any(|d| d.starts_with("the input defines this object 2 times, differently"))),
            "{:#?}",
            twice.reports
        );
        let once = converted(&[older.clone(), older.clone()]);
        assert!(
            once.reports
                .iter()
                .all(|r| !r.differs.iter().any(|d| d.contains("times, differently"))),
            "the same definition twice is one: {:#?}",
            once.reports
        );
        let names: Vec<&str> = imported
            .rules
            .iter()
            .filter_map(|r| r["metadata"]["name"].as_str())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted, "by name, each once");
    }

    #[test]
    fn rules_live_where_their_configuration_does() {
        let mut objects = everything();
        // A tenant's Policy and mirror that reach into another namespace.
        objects.push(kyverno::tests::tenant_policy(kyverno::tests::policy_clone(
            "clone",
            json!({"namespace": "victim", "name": "db-creds"}),
        )));
        objects.push(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db-creds", "namespace": "team-a", "annotations": {
                "reflector.v1.k8s.emberstack.com/reflects": "victim/db-creds"}}}));
        let imported = converted(&objects);
        let mut tenant_rules = 0;
        for report in &imported.reports {
            // `Secret team-a/x`, `Policy team-a/p, rule r`; a cluster-scoped
            // object's source names no namespace.
            let configured_in = report
                .source
                .split_once(' ')
                .and_then(|(_, rest)| rest.split_once('/'))
                .map_or("copyrator", |(namespace, _)| namespace);
            for name in &report.rules {
                let rule = imported
                    .rules
                    .iter()
                    .find(|r| r["metadata"]["name"] == name.as_str())
                    .expect("the rule");
                assert_eq!(
                    rule["metadata"]["namespace"], configured_in,
                    "{}: {rule}",
                    report.source
                );
                tenant_rules += usize::from(configured_in != "copyrator");
            }
        }
        assert!(tenant_rules >= 3, "{tenant_rules}");
        // A rule's source label is asked for only in its own namespace,
        // or by the operator's own rules.
        for label in &imported.source_labels {
            let name = label
                .key
                .strip_prefix("copyrator.flant.com/import.")
                .expect("an import label");
            let rule = imported
                .rules
                .iter()
                .find(|r| r["metadata"]["name"] == name)
                .expect("the rule");
            assert!(
                [label.namespace.as_str(), "copyrator"]
                    .contains(&rule["metadata"]["namespace"].as_str().unwrap_or_default()),
                "{label:?} for {rule}"
            );
        }
        let victim = |r: &&serde_json::Value| r["spec"]["namespace"] == "victim";
        let pulls: Vec<_> = imported.rules.iter().filter(victim).collect();
        assert_eq!(pulls.len(), 1, "the mirror's: {pulls:?}");
        assert_eq!(pulls[0]["metadata"]["namespace"], "team-a");
        assert!(
            imported
                .source_labels
                .iter()
                .all(|l| l.namespace != "victim")
        );
    }

    #[test]
    fn secret_data_never_appears_in_the_output() {
        let secret = "c3VwZXJzZWNyZXQtdmFsdWU=";
        let mut objects = everything();
        for object in &mut objects {
            if let Some(data) = object.get_mut("data").and_then(|d| d.as_object_mut()) {
                for value in data.values_mut() {
                    if value.is_string() {
                        *value = json!(secret);
                    }
                }
            }
        }
        objects.push(json!({
            "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "data-policy"},
            "spec": {"rules": [{"name": "make", "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]},
                "generate": {"apiVersion": "v1", "kind": "Secret", "name": "made",
                             "namespace": "{{request.object.metadata.name}}",
                             "data": {"data": {"password": secret}}}}]}
        }));
        objects.push(json!({
            "apiVersion": "policies.kyverno.io/v1", "kind": "GeneratingPolicy", "metadata": {"name": "data-gpol"},
            "spec": {
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["namespaces"]}]},
                "variables": [{"name": "nsName", "expression": "object.metadata.name"}],
                "generate": [{"expression": format!(
                    "generator.Apply(variables.nsName, [dyn({{\"apiVersion\": \"v1\", \"kind\": \"Secret\", \"data\": {{\"password\": \"{secret}\"}}}})])"
                )}]
            }
        }));
        objects.push(json!({
            "apiVersion": "clustersecret.io/v1", "kind": "ClusterSecret", "metadata": {"name": "inline"},
            "data": {"password": secret}
        }));
        let imported = converted(&objects);
        let text = serde_json::to_string(&imported).expect("serializes");
        assert!(!text.contains(secret), "{text}");
        assert!(text.contains("password"), "keys are named");
    }
}
