//! Coming from another tool, against a real control plane and the real
//! binary: the objects and annotations another tool leaves (as its docs
//! say it leaves them: kubernetes-reflector, config-syncer and
//! ClusterSecret cannot be built here) are read by `copyrator import`,
//! which prints a rule with `adopt: true` and the label its source needs;
//! `plan` shows every copy adopted and nothing else (exit 2); applied, the
//! rule takes every copy over with one metadata patch each (same uid, same
//! data, the tool's marks gone), and a later source change reaches them
//! all. The operator runs as the chart's ServiceAccount (its rendered RBAC,
//! nothing more), and its requests are read from the audit log.
//! (`hack/migration-run` does the same with kubernetes-replicator itself.)

use std::collections::BTreeMap;

use crate::common::audit::{Audit, Query, WRITE_VERBS};
use crate::common::rbac::{ClusterScoped, as_the_chart};
use crate::common::*;
use chrono::Utc;
use serde_json::{Value, json};

/// Copies made by the other tool.
const COPIES: usize = 100;

/// One tool's migration: how it was configured and what it left.
struct Case {
    test: &'static str,
    kind: Kind,
    /// Its name in import's report.
    tool: &'static str,
    /// The prefixes of its marks, none left after adoption.
    marks: &'static [&'static str],
    /// Labels the target namespaces carry (a tool that selects by them).
    namespace_labels: fn(&TestNs) -> Vec<(String, String)>,
    /// The source's metadata (its annotations configure the tool).
    source_meta: fn(&TestNs) -> Value,
    /// The metadata the tool gave each copy of `source`.
    copy_meta: fn(&TestNs, &Obj) -> Value,
    /// The configuration import reads from a file rather than the cluster
    /// (a ClusterSecret: its CRD is not installed here), and the source
    /// named in its report.
    file: Option<fn(&TestNs, &str) -> String>,
    report_source: fn(&str) -> String,
}

fn no_labels(_: &TestNs) -> Vec<(String, String)> {
    Vec::new()
}

fn config_map_source(src: &str) -> String {
    format!("ConfigMap {src}/settings")
}

const REFLECTOR: &str = "reflector.v1.k8s.emberstack.com/";
const KUBED: &str = "kubed.appscode.com/";

fn reflector() -> Case {
    Case {
        test: "migrate-reflector",
        kind: Kind::ConfigMap,
        tool: "kubernetes-reflector",
        marks: &[REFLECTOR],
        namespace_labels: no_labels,
        // As reflector's README says to annotate a source: allowed and
        // auto-reflected into the namespaces its regex matches.
        source_meta: |t| {
            let pattern = format!("{}-t.*", t.prefix);
            json!({"annotations": {
                format!("{REFLECTOR}reflection-allowed"): "true",
                format!("{REFLECTOR}reflection-allowed-namespaces"): pattern,
                format!("{REFLECTOR}reflection-auto-enabled"): "true",
                format!("{REFLECTOR}reflection-auto-namespaces"): pattern,
            }})
        },
        // Its mirrors: the data alone, and its marks.
        copy_meta: |_, source| {
            json!({"annotations": {
                format!("{REFLECTOR}auto-reflects"): "True",
                format!("{REFLECTOR}reflects"): format!("{}/settings", source.namespace),
                format!("{REFLECTOR}reflected-version"): source.resource_version,
                format!("{REFLECTOR}reflected-at"): "\"2026-11-27T10:00:00.0000000+00:00\"",
            }})
        },
        file: None,
        report_source: config_map_source,
    }
}

fn config_syncer() -> Case {
    Case {
        test: "migrate-kubed",
        kind: Kind::ConfigMap,
        tool: "config-syncer",
        marks: &[KUBED],
        // Its sync annotation is a namespace selector.
        namespace_labels: |t| vec![("app".to_owned(), t.prefix.clone())],
        source_meta: |t| {
            json!({"labels": {"tier": "shared"}, "annotations": {
                format!("{KUBED}sync"): format!("app={}", t.prefix),
                "owner": "platform",
            }})
        },
        // Its copies: the source's labels and annotations but its sync
        // keys, and its origin marks.
        copy_meta: |_, source| {
            json!({
                "labels": {
                    "tier": "shared",
                    format!("{KUBED}origin.name"): "settings",
                    format!("{KUBED}origin.namespace"): source.namespace,
                    format!("{KUBED}origin.cluster"): "",
                },
                "annotations": {
                    "owner": "platform",
                    format!("{KUBED}origin"): json!({"uid": source.uid, "name": "settings",
                        "namespace": source.namespace, "resourceVersion": source.resource_version})
                        .to_string(),
                },
            })
        },
        file: None,
        report_source: config_map_source,
    }
}

fn cluster_secret() -> Case {
    Case {
        test: "migrate-csec",
        kind: Kind::Secret,
        tool: "ClusterSecret",
        marks: &["clustersecret.io"],
        namespace_labels: no_labels,
        source_meta: |_| json!({}),
        // Its Secrets: its label and annotations, the data of the Secret
        // its valueFrom names.
        copy_meta: |_, _| {
            json!({
                "labels": {"clustersecret.io": "true"},
                "annotations": {
                    "clustersecret.io/created-by": "ClusterSecrets",
                    "clustersecret.io/version": "0.0.14",
                    "clustersecret.io/last-sync": "2026-11-27T10:00:00",
                },
            })
        },
        // As its README's example: the data from another Secret.
        file: Some(|t, src| {
            format!(
                "apiVersion: clustersecret.io/v1\nkind: ClusterSecret\nmetadata:\n  name: settings\n\
                 matchNamespace:\n  - \"{}-t.*\"\ndata:\n  valueFrom:\n    secretKeyRef:\n      \
                 name: settings\n      namespace: {src}\n",
                t.prefix
            )
        }),
        report_source: |_| "ClusterSecret settings".to_owned(),
    }
}

#[tokio::test]
async fn mirrors_reflector_made_are_imported_planned_and_adopted_without_a_payload_write() {
    migrate(reflector()).await;
}

#[tokio::test]
async fn copies_config_syncer_made_are_imported_planned_and_adopted_without_a_payload_write() {
    migrate(config_syncer()).await;
}

#[tokio::test]
async fn secrets_cluster_secret_made_are_imported_planned_and_adopted_without_a_payload_write() {
    migrate(cluster_secret()).await;
}

/// The body of an object of `kind` with `meta` and the data `k`.
fn body(kind: Kind, meta: Value, value: &str) -> Value {
    match kind {
        Kind::ConfigMap => json!({"metadata": meta, "data": {"k": value}}),
        Kind::Secret => json!({"metadata": meta, "type": "Opaque", "stringData": {"k": value}}),
    }
}

async fn migrate(case: Case) {
    let t = TestNs::new(case.test).await;
    let kind = case.kind;
    let op = t.ns("op").await;
    let src = t.ns("src").await;
    let labels = (case.namespace_labels)(&t);
    let labels: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut targets = Vec::new();
    for i in 0..COPIES {
        targets.push(t.ns_labelled(&format!("t{i:02}"), &labels).await);
    }
    let source = t
        .create_json(
            kind,
            &src,
            "settings",
            body(kind, (case.source_meta)(&t), "v1"),
        )
        .await;
    let mut before = BTreeMap::new();
    for ns in &targets {
        let meta = (case.copy_meta)(&t, &source);
        let copy = t
            .create_json(kind, ns, "settings", body(kind, meta, "v1"))
            .await;
        before.insert(ns.clone(), copy);
    }

    // import, from the live cluster (or the tool's file).
    let mut args = vec!["import", "--namespace", &op, "-o", "json"];
    let file = case.file.map(|f| f(&t, &src));
    let path = std::env::temp_dir().join(format!("{}.yaml", t.prefix));
    if let Some(text) = &file {
        std::fs::write(&path, text).expect("the tool's file written");
        args.extend(["-f", path.to_str().expect("a UTF-8 path")]);
    }
    let imported = copyrator(&args, None).await;
    imported.assert_exit(0);
    let imported = imported.json();
    let wanted = (case.report_source)(&src);
    let report = imported["reports"]
        .as_array()
        .and_then(|reports| reports.iter().find(|r| r["source"] == wanted.as_str()))
        .unwrap_or_else(|| panic!("no report of {wanted}: {imported}"));
    println!("import's report: {report}");
    assert_eq!(report["tool"], case.tool);
    let name = report["rules"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no rule made: {report}"))
        .to_owned();
    let rule = imported["rules"]
        .as_array()
        .and_then(|rules| {
            rules
                .iter()
                .find(|r| r["metadata"]["name"] == name.as_str())
        })
        .expect("the rule")
        .clone();
    assert_eq!(rule["spec"]["adopt"], true, "{rule}");
    let label = imported["sourceLabels"]
        .as_array()
        .and_then(|labels| labels.iter().find(|l| l["namespace"] == src.as_str()))
        .expect("a label for the source")
        .clone();
    let key = label["key"].as_str().expect("a key");
    t.patch(
        kind,
        &src,
        "settings",
        json!({"metadata": {"labels": {key: label["value"]}}}),
    )
    .await;
    t.create_rule(&op, &name, json!({"spec": rule["spec"]}))
        .await;

    // plan: every copy adopted, nothing else; exit 2.
    let plan = copyrator_plan(&["--namespace", &op], None).await;
    plan.assert_exit(2);
    let totals = format!("rule {op}/{name}: {COPIES} adopt");
    assert!(
        plan.stdout.lines().any(|l| l == totals),
        "no line {totals:?}: {}",
        plan.stdout
    );

    // Applied, the operator running as the chart's ServiceAccount:
    // adopted, one patch each.
    let cluster = ClusterScoped::new();
    let id = as_the_chart(&t, &cluster, &op, &[]).await;
    let user = id.user.clone();
    let audit = Audit::start();
    let started = Utc::now();
    let _operator = Operator::start_with_env(
        &t,
        vec!["run".into(), "--namespace".into(), op.clone()],
        &[("KUBECONFIG", &id.kubeconfig)],
    );
    let status = t
        .wait_rule(&op, &name, "every copy adopted", |r| {
            match (status_u64(r, "adoptedCopies"), status_u64(r, "copies")) {
                (Some(n), Some(c)) if n == COPIES as u64 && c == COPIES as u64 => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    println!("status: {}", status["status"]);
    for ns in &targets {
        let now = t.must_get(kind, ns, "settings").await;
        assert_eq!(now.uid, before[ns].uid, "{ns}: the same object");
        assert_eq!(now.data, before[ns].data, "{ns}: the same data");
        let left: Vec<&String> = now
            .labels
            .keys()
            .chain(now.annotations.keys())
            .filter(|k| case.marks.iter().any(|mark| k.starts_with(mark)))
            .collect();
        assert!(
            left.is_empty(),
            "{ns}: {}'s marks stay: {left:?}",
            case.tool
        );
    }
    audit.settle(&t.client, Utc::now()).await;
    let mut writes: BTreeMap<String, usize> = BTreeMap::new();
    for ns in &targets {
        let q = Query::user(&user)
            .verbs(WRITE_VERBS)
            .resource(match kind {
                Kind::ConfigMap => "configmaps",
                Kind::Secret => "secrets",
            })
            .namespace(ns)
            .between(started, Utc::now() + chrono::Duration::days(1));
        for (verb, n) in audit.by_verb(&q) {
            *writes.entry(verb).or_default() += n;
        }
    }
    println!("the operator's writes where the copies were: {writes:?}");
    assert_eq!(writes, BTreeMap::from([("patch".to_owned(), COPIES)]));
    let refused = audit.matching(&Query::user(&user).code(403).between(started, Utc::now()));
    assert!(
        refused.is_empty(),
        "the API server refused requests of the chart's ServiceAccount: {}",
        refused
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    );

    // A change of the source reaches every copy (checked by their data: a
    // rule may strip what the tool did not copy).
    t.set_data(kind, &src, "settings", &[("k", Some("v2"))])
        .await;
    for ns in &targets {
        wait_until(format!("{ns}/settings to follow"), TIMEOUT, async || {
            t.must_get(kind, ns, "settings")
                .await
                .data_is(&[("k", "v2")])
        })
        .await;
    }
    if file.is_some() {
        let _ = std::fs::remove_file(&path);
    }
}
