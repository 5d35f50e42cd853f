//! ClusterSecret (clustersecret.io/v1): a Secret of the ClusterSecret's
//! name in the namespaces `matchNamespace` matches and `avoidNamespaces`
//! does not, from another Secret (`data.valueFrom.secretKeyRef`, of that
//! name or another: the rule's copies are named as the ClusterSecret) or
//! from data inline, which is never read into the output. A ClusterSecret is
//! cluster-scoped, written by the cluster's admins: its rule is an admin
//! rule.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::SourceReport;
use super::patterns::{Anchoring, pattern_list};
use super::shared::{
    Context, Conversion, Draft, Owner, Source, Targets, at, group_version, renaming, str_at,
};
use crate::api::selector::{
    Glob, validate_data_key, validate_label_key, validate_label_value, validate_qualified_name,
};

const TOOL: &str = "ClusterSecret";

pub(super) fn convert(object: &Value, context: &Context) -> Option<Conversion> {
    if group_version(object) != ("clustersecret.io", "v1")
        || str_at(object, &["kind"]) != Some("ClusterSecret")
    {
        return None;
    }
    let name = str_at(object, &["metadata", "name"])?;
    let mut report = SourceReport::new(TOOL, format!("ClusterSecret {name}"));
    let draft = targets(object, &mut report).and_then(|targets| {
        if let Some(note) = targets.protected_note(TOOL, context.options) {
            report.differs(note);
        }
        source(object, name, &targets, &mut report)
    });
    Some(match draft {
        Ok(draft) => report.with(vec![draft]),
        Err(why) => {
            report.unmapped(why);
            report.alone()
        }
    })
}

/// The strings of a list field; `default` when there is none.
fn list<'a>(object: &'a Value, field: &str, default: &[&'a str]) -> Vec<&'a str> {
    match object.get(field).and_then(Value::as_array) {
        Some(items) => items.iter().filter_map(Value::as_str).collect(),
        None => default.to_vec(),
    }
}

/// The namespaces that get the Secret: `matchNamespace` and
/// `avoidNamespaces` are regular expressions matched at the start of the
/// name (Python `re.match`).
fn targets(object: &Value, report: &mut SourceReport) -> Result<Targets, String> {
    let matching = list(object, "matchNamespace", &[".*"]);
    let avoiding = list(object, "avoidNamespaces", &[]);
    let include = pattern_list(matching.iter().copied(), Anchoring::Start);
    let exclude = pattern_list(avoiding.iter().copied(), Anchoring::Start);
    for note in include.notes.iter().chain(&exclude.notes) {
        report.exact(note.clone());
    }
    for line in
        include.inexact_lines("it is left out, so the namespaces only it matches get no copies")
    {
        report.differs(line);
    }
    if let Some((pattern, inexact)) = exclude.inexact.first() {
        return Err(format!(
            "avoidNamespaces pattern {pattern:?} has no exact glob ({}): a rule without it would copy where ClusterSecret does not",
            inexact.why
        ));
    }
    if include.globs.is_empty() {
        return Err(
            "matchNamespace matches no namespace that a glob can say: no rule is made".into(),
        );
    }
    let every = include.globs == ["*"];
    let targets = Targets {
        include: (!every).then_some(include.globs),
        exclude: exclude.globs,
        selector: None,
    };
    if let Some(why) = targets.refusal() {
        return Err(why);
    }
    report.exact(format!(
        "matchNamespace {matching:?} and avoidNamespaces {avoiding:?} match the start of a namespace's name: the rule copies into {}",
        targets.describe()
    ));
    Ok(targets)
}

/// The rule's source: the Secret `valueFrom.secretKeyRef` names; data
/// inline has none.
fn source(
    object: &Value,
    name: &str,
    targets: &Targets,
    report: &mut SourceReport,
) -> Result<Draft, String> {
    let secret_type = str_at(object, &["type"]).unwrap_or("Opaque");
    let data = object.get("data").and_then(Value::as_object);
    let Some(reference) = data.and_then(|d| d.get("valueFrom")) else {
        let keys: Vec<&str> = data
            .into_iter()
            .flat_map(|d| d.keys())
            .map(String::as_str)
            .collect();
        if keys.is_empty() {
            return Err(
                "it holds no data and no data.valueFrom.secretKeyRef: it copies nothing".into(),
            );
        }
        return Err(format!(
            "the data is inline (keys {}): there is no source Secret, and Copyrator copies only Secrets that exist. Create a Secret {name} of type {secret_type} holding these keys in a namespace of your choice, and a rule that copies it into {}",
            keys.join(", "),
            targets.describe()
        ));
    };
    if data.is_some_and(|d| d.len() > 1) {
        return Err("data holds valueFrom and other keys, which ClusterSecret refuses".into());
    }
    let reference = at(reference, &["secretKeyRef"]).ok_or("valueFrom has no secretKeyRef")?;
    let (Some(namespace), Some(source_name)) = (
        str_at(reference, &["namespace"]),
        str_at(reference, &["name"]),
    ) else {
        return Err("secretKeyRef names no namespace and name".into());
    };
    let renaming = renaming(source_name, name, false, "the ClusterSecret's name")?;
    let mut spec = Map::new();
    if let Some(targets) = targets.to_json() {
        spec.insert("targets".into(), targets);
    }
    spec.insert("transform".into(), transform(object, reference, report)?);
    say_the_rest(secret_type, namespace, targets, (name, source_name), report);
    report.exact(format!(
        "the source, Secret {namespace}/{source_name}, is selected by the rule's import label, to be put on it"
    ));
    if let Some(renaming) = &renaming {
        report.exact(renaming.line.clone());
    }
    Ok(Draft {
        name: format!("clustersecret-{name}"),
        owner: Owner::Admin,
        api_version: "v1".into(),
        kind: "Secret".into(),
        source: Source::Named {
            namespace: namespace.to_owned(),
            name: source_name.to_owned(),
        },
        spec,
        naming: renaming.map(|r| r.name),
    })
}

fn say_the_rest(
    secret_type: &str,
    namespace: &str,
    targets: &Targets,
    (copy, source): (&str, &str),
    report: &mut SourceReport,
) {
    report.differs(format!(
        "ClusterSecret gives its copies the type {secret_type} (its type field); Copyrator gives them the source Secret's type: they match when the source is of type {secret_type}"
    ));
    report.differs("ClusterSecret reads the source again only when the ClusterSecret changes or its operator restarts, and restores an edited copy only then; the rule follows the source and restores copies at once (syncPolicy: Sync)");
    report.exact("copies are deleted with the ClusterSecret: the rule deletes them when it is deleted (deletionPolicy.ruleDeleted: Delete)");
    report.exact("a Secret of that name that ClusterSecret did not make is left alone: the rule adopts one holding the same content and skips one holding other content (conflictPolicy: Skip)");
    let globs: Vec<Glob> = targets
        .include
        .iter()
        .flatten()
        .filter_map(|g| Glob::new(g).ok())
        .collect();
    let reached = targets.include.is_none() || globs.iter().any(|g| g.matches(namespace));
    let avoided = targets
        .exclude
        .iter()
        .filter_map(|g| Glob::new(g).ok())
        .any(|g| g.matches(namespace));
    if reached && !avoided && copy != source {
        report.exact(format!(
            "ClusterSecret also writes its Secret into {namespace}, the source's namespace, and so does the rule: there the copy {copy} stands beside its source {source}"
        ));
    } else if reached && !avoided {
        report.differs(format!(
            "ClusterSecret also writes its Secret into {namespace}, the source's namespace; there the Secret of that name is the source itself, which Copyrator never writes"
        ));
    }
}

/// The copies' labels and annotations (the ClusterSecret's, as it filters
/// them; none of the source Secret's) and data keys.
fn transform(
    object: &Value,
    reference: &Value,
    report: &mut SourceReport,
) -> Result<Value, String> {
    let mut transform = json!({"stripLabels": ["*"], "stripAnnotations": ["*"]});
    let labels = carried(object, "labels", &["app.kubernetes.io"], report);
    let annotations = carried(
        object,
        "annotations",
        &["kopf.zalando.org", "kubectl.kubernetes.io"],
        report,
    );
    if !labels.is_empty() {
        transform["addLabels"] = json!(labels);
    }
    if !annotations.is_empty() {
        transform["addAnnotations"] = json!(annotations);
    }
    report.exact("copies carry the ClusterSecret's labels and annotations (transform.addLabels, addAnnotations), less app.kubernetes.io labels and kopf.zalando.org and kubectl.kubernetes.io annotations, and none of the source Secret's own (stripLabels, stripAnnotations: [\"*\"])");
    report.differs("ClusterSecret's BLOCKED_LABELS setting, not seen here, may leave out other labels than app.kubernetes.io ones");
    if let Some(keys) = reference.get("keys").and_then(Value::as_array) {
        let keys: Vec<&str> = keys.iter().filter_map(Value::as_str).collect();
        if let Some(bad) = keys.iter().find(|k| validate_data_key(k).is_err()) {
            return Err(format!(
                "secretKeyRef.keys holds {bad:?}, which is no data key"
            ));
        }
        report.exact(format!(
            "secretKeyRef.keys: copies carry only the keys {} (transform.keys.include)",
            keys.join(", ")
        ));
        transform["keys"] = json!({"include": keys});
    }
    Ok(transform)
}

/// The ClusterSecret's labels or annotations that ClusterSecret puts on
/// its copies, and that a rule may add.
fn carried(
    object: &Value,
    field: &str,
    blocked: &[&str],
    report: &mut SourceReport,
) -> BTreeMap<String, String> {
    let mut carried = BTreeMap::new();
    for (key, value) in at(object, &["metadata", field])
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let Some(value) = value.as_str() else {
            continue;
        };
        if blocked.iter().any(|b| key.starts_with(b)) {
            continue;
        }
        if let Some(why) = crate::core::tracking::never_travels(key) {
            report.differs(format!(
                "the ClusterSecret's {field} key {key} goes onto ClusterSecret's copies, never onto Copyrator's: {why}"
            ));
            continue;
        }
        let reserved =
            key.starts_with("copyrator.flant.com/") || key == "app.kubernetes.io/managed-by";
        let valid = if field == "labels" {
            validate_label_key(key).is_ok() && validate_label_value(value).is_ok()
        } else {
            validate_qualified_name(key).is_ok()
        };
        if reserved || !valid {
            report.unmapped(format!(
                "the {field} key {key:?} cannot go on Copyrator's copies"
            ));
            continue;
        }
        carried.insert(key.clone(), value.to_owned());
    }
    carried
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{Value, json};

    use super::super::kyverno::tests::yaml;
    use super::super::shared::import_label_key;
    use super::super::shared::tests::{converted, copy_name_of, says};

    // CSEC README.md
    const WILDCARD: &str = r"
kind: ClusterSecret
apiVersion: clustersecret.io/v1
metadata:
  namespace: clustersecret
  name: default-wildcard-certifiate
matchNamespace:
  - prefix_ns-*
  - anothernamespace
avoidNamespaces:
  - supersecret-ns
data:
  tls.crt: BASE64
  tls.key: BASE64
";

    // CSEC yaml/Object_example/obj.yaml
    const GLOBAL: &str = r"
# A demo custom resource for the Kopf example operators.
apiVersion: clustersecret.io/v1
kind: ClusterSecret
metadata:
  namespace: clustersecret
  name: global-secret
  labels:
    somelabel: somevalue
  annotations:
    someannotation: somevalue
matchNamespace:
  - 'prefix_ns-.+'
  - 'anothernamespace'
  - 'cluster.*'
avoidNamespaces:
  - supersecret-ns
  - default
  - kube-system
data:
  tls.crt: MTIzNDU2Cg==
  tls.key: Nzg5MTAxMTIxMgo=
";

    // CSEC yaml/Object_example/value-from-obj.yaml
    const VALUE_FROM: &str = r"
# A demo custom resource for the Kopf example operators.
apiVersion: clustersecret.io/v1
kind: ClusterSecret
metadata:
  name: value-from
  namespace: clustersecret
  labels:
    somelabel: somevalue
  annotations:
    someannotation: somevalue
matchNamespace:
  - '.*'
avoidNamespaces:
  - 'default'
  - 'kube-system'
# as output in kubectl create secret docker-registry regkey --docker-server my.docker.registry --docker-username adminuser --docker-password adminpass -o yaml --dry-run
data:
  valueFrom:
    secretKeyRef:
#it requires obj2.yaml first. 
            name: global-secret2
            namespace: clustersecret
";

    pub(crate) fn documented() -> Vec<Value> {
        [WILDCARD, GLOBAL, VALUE_FROM]
            .into_iter()
            .map(yaml)
            .collect()
    }

    #[test]
    fn a_cluster_secret_without_data_says_so() {
        let mut object = yaml(GLOBAL);
        if let Some(map) = object.as_object_mut() {
            map.remove("data");
        }
        let imported = converted(&[object]);
        assert!(imported.rules.is_empty());
        assert!(
            says(&imported.reports[0].unmapped, "it holds no data"),
            "{:?}",
            imported.reports[0]
        );
    }

    #[test]
    fn inline_data_is_unmapped_and_names_its_keys_only() {
        let imported = converted(&[yaml(GLOBAL)]);
        assert!(imported.rules.is_empty());
        let report = &imported.reports[0];
        assert_eq!(
            (report.tool.as_str(), report.source.as_str()),
            ("ClusterSecret", "ClusterSecret global-secret")
        );
        assert!(
            says(
                &report.unmapped,
                "the data is inline (keys tls.crt, tls.key)"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.unmapped,
                "the namespaces matching anothernamespace*, cluster* but supersecret-ns*, default*, kube-system*"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.exact,
                "\"prefix_ns-.+\" matches no namespace ('_' never"
            ),
            "{report:#?}"
        );
        let text = serde_json::to_string(&imported).expect("serializes");
        assert!(
            !text.contains("MTIzNDU2Cg==") && !text.contains("Nzg5MTAxMTIxMgo="),
            "{text}"
        );
    }

    #[test]
    fn the_readme_pattern_meant_as_a_glob_is_read_as_cluster_secret_reads_it() {
        let imported = converted(&[yaml(WILDCARD)]);
        let report = &imported.reports[0];
        assert!(
            says(&report.exact, "\"prefix_ns-*\" matches no namespace"),
            "{report:#?}"
        );
        assert!(
            says(
                &report.unmapped,
                "the namespaces matching anothernamespace* but supersecret-ns*"
            ),
            "{report:#?}"
        );
    }

    #[test]
    fn a_source_of_another_name_is_a_rule_naming_copies_as_the_cluster_secret() {
        let imported = converted(&[yaml(VALUE_FROM)]);
        let name = "clustersecret-value-from";
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "copyrator"},
                "spec": {
                    "ruleType": "secret",
                    "selector": {import_label_key(name): "true"},
                    "namespace": "clustersecret",
                    "adopt": true,
                    "targets": {"exclude": ["default*", "kube-system*"]},
                    "transform": {
                        "stripLabels": ["*"], "stripAnnotations": ["*"],
                        "addLabels": {"somelabel": "somevalue"},
                        "addAnnotations": {"someannotation": "somevalue"},
                        "name": {"template": "value-from"}
                    }
                }
            })]
        );
        assert_eq!(
            copy_name_of(&imported.rules[0], "global-secret2"),
            "value-from"
        );
        let labelled: Vec<(&str, &str)> = imported
            .source_labels
            .iter()
            .map(|l| (l.namespace.as_str(), l.name.as_str()))
            .collect();
        assert_eq!(labelled, [("clustersecret", "global-secret2")]);
        let report = &imported.reports[0];
        assert_eq!(
            report.exact[report.exact.len() - 3..],
            [
                "ClusterSecret also writes its Secret into clustersecret, the source's namespace, and so does the rule: there the copy value-from stands beside its source global-secret2",
                "the source, Secret clustersecret/global-secret2, is selected by the rule's import label, to be put on it",
                "copies are named value-from, the ClusterSecret's name (transform.name.template)",
            ]
        );
        assert!(!says(&report.differs, "the source itself"), "{report:#?}");
        assert!(report.unmapped.is_empty(), "{report:#?}");
    }

    #[test]
    fn a_source_of_its_name_is_a_rule_carrying_the_cluster_secrets_labels() {
        let mut object = yaml(VALUE_FROM);
        object["data"]["valueFrom"]["secretKeyRef"] =
            json!({"name": "value-from", "namespace": "clustersecret", "keys": ["tls.crt"]});
        object["metadata"]["labels"]["app.kubernetes.io/name"] = json!("left-out");
        object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
            json!("{}");
        // What Argo CD puts on the ClusterSecret it manages.
        object["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"] =
            json!("apps:clustersecret.io/ClusterSecret:clustersecret/value-from");
        let imported = converted(&[object]);
        let name = "clustersecret-value-from";
        assert_eq!(
            imported.rules,
            [json!({
                "apiVersion": "flant.com/v1",
                "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": "copyrator"},
                "spec": {
                    "ruleType": "secret",
                    "selector": {import_label_key(name): "true"},
                    "namespace": "clustersecret",
                    "adopt": true,
                    "targets": {"exclude": ["default*", "kube-system*"]},
                    "transform": {
                        "stripLabels": ["*"], "stripAnnotations": ["*"],
                        "addLabels": {"somelabel": "somevalue"},
                        "addAnnotations": {"someannotation": "somevalue"},
                        "keys": {"include": ["tls.crt"]}
                    }
                }
            })]
        );
        assert_eq!(imported.source_labels[0].namespace, "clustersecret");
        let report = &imported.reports[0];
        assert!(says(&report.differs, "the type Opaque"), "{report:#?}");
        assert!(
            says(
                &report.differs,
                "ClusterSecret also writes its Secret into clustersecret, the source's namespace; there the Secret of that name is the source itself, which Copyrator never writes"
            ),
            "{report:#?}"
        );
        assert!(
            says(
                &report.differs,
                "also match kube-public, kube-node-lease, copyrator,"
            ),
            "{report:#?}"
        );
        assert!(says(&report.exact, "transform.keys.include"), "{report:#?}");
        assert!(
            says(
                &report.differs,
                "annotations key argocd.argoproj.io/tracking-id goes onto ClusterSecret's copies, never onto Copyrator's"
            ),
            "{report:#?}"
        );
    }

    #[test]
    fn an_avoided_pattern_without_an_exact_glob_leaves_the_rule_out() {
        let mut object = yaml(VALUE_FROM);
        object["data"]["valueFrom"]["secretKeyRef"]["name"] = json!("value-from");
        object["avoidNamespaces"] = json!(["team-[0-9]"]);
        let imported = converted(&[object]);
        assert!(imported.rules.is_empty());
        assert!(says(
            &imported.reports[0].unmapped,
            "avoidNamespaces pattern \"team-[0-9]\" has no exact glob"
        ));
    }
}
