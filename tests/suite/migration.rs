//! Coming from another tool, against a real control plane and the real
//! binary: the objects and annotations another tool leaves (here
//! kubernetes-reflector's, as its docs say it leaves them: it cannot be
//! built here) are read by `copyrator import` from the live cluster, which
//! prints a rule with `adopt: true` and the label its source needs; `plan`
//! shows every mirror adopted and nothing deleted (exit 2); applied, the
//! rule takes every mirror over with one metadata patch each (same uid,
//! same data, reflector's marks gone), and a later source change reaches
//! them all. The operator's requests are read from the audit log.

use std::collections::BTreeMap;

use crate::common::audit::{Audit, Query, WRITE_VERBS};
use crate::common::*;
use chrono::Utc;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const REFLECTOR: &str = "reflector.v1.k8s.emberstack.com/";
/// Mirrors made by the other tool; CI's API server takes them quickly.
const MIRRORS: usize = 20;

#[tokio::test]
async fn mirrors_reflector_made_are_imported_planned_and_adopted_without_a_payload_write() {
    let t = TestNs::new("migrate-reflector").await;
    let op = t.ns("op").await;
    let src = t.ns("src").await;
    let mut targets = Vec::new();
    for i in 0..MIRRORS {
        targets.push(t.ns(&format!("t{i:02}")).await);
    }
    // The source as reflector's README says to annotate it: allowed and
    // auto-reflected into the namespaces its regex matches.
    let pattern = format!("{}-t.*", t.prefix);
    let source = t
        .create_json(
            CM,
            &src,
            "settings",
            json!({"metadata": {"annotations": {
                format!("{REFLECTOR}reflection-allowed"): "true",
                format!("{REFLECTOR}reflection-allowed-namespaces"): pattern,
                format!("{REFLECTOR}reflection-auto-enabled"): "true",
                format!("{REFLECTOR}reflection-auto-namespaces"): pattern,
            }}, "data": {"k": "v1"}}),
        )
        .await;
    // Its mirrors as reflector leaves them: the data alone, and its marks.
    let mut before = BTreeMap::new();
    for ns in &targets {
        let mirror = t
            .create_json(
                CM,
                ns,
                "settings",
                json!({"metadata": {"annotations": {
                    format!("{REFLECTOR}auto-reflects"): "True",
                    format!("{REFLECTOR}reflects"): format!("{src}/settings"),
                    format!("{REFLECTOR}reflected-version"): source.resource_version,
                    format!("{REFLECTOR}reflected-at"): "\"2026-11-27T10:00:00.0000000+00:00\"",
                }}, "data": {"k": "v1"}}),
            )
            .await;
        before.insert(ns.clone(), mirror);
    }

    // import, from the live cluster.
    let imported = copyrator(&["import", "--namespace", &op, "-o", "json"], None).await;
    imported.assert_exit(0);
    let imported = imported.json();
    let wanted = format!("ConfigMap {src}/settings");
    let report = imported["reports"]
        .as_array()
        .and_then(|reports| reports.iter().find(|r| r["source"] == wanted.as_str()))
        .unwrap_or_else(|| panic!("no report of {wanted}: {imported}"));
    println!("import's report: {report}");
    assert_eq!(report["tool"], "kubernetes-reflector");
    let name = report["rules"][0].as_str().expect("a rule made").to_owned();
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
        CM,
        &src,
        "settings",
        json!({"metadata": {"labels": {key: label["value"]}}}),
    )
    .await;
    t.create_rule(&op, &name, json!({"spec": rule["spec"]}))
        .await;

    // plan: every mirror adopted, nothing else; exit 2.
    let plan = copyrator_plan(&["--namespace", &op], None).await;
    plan.assert_exit(2);
    let totals = format!("rule {op}/{name}: {MIRRORS} adopt");
    assert!(
        plan.stdout.lines().any(|l| l == totals),
        "no line {totals:?}: {}",
        plan.stdout
    );
    println!("plan's summary: {totals}");

    // Applied: adopted, one patch each.
    let user = operator_user(&t);
    let audit = Audit::start();
    let started = Utc::now();
    let kubeconfig = operator_kubeconfig(&t, None, Some(&user));
    let _operator = Operator::start_with_env(
        &t,
        vec!["run".into(), "--namespace".into(), op.clone()],
        &[("KUBECONFIG", kubeconfig.to_str().expect("a UTF-8 path"))],
    );
    let status = t
        .wait_rule(&op, &name, "every mirror adopted", |r| {
            match (status_u64(r, "adoptedCopies"), status_u64(r, "copies")) {
                (Some(n), Some(c)) if n == MIRRORS as u64 && c == MIRRORS as u64 => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    println!("status: {}", status["status"]);
    for ns in &targets {
        let now = t.must_get(CM, ns, "settings").await;
        assert_eq!(now.uid, before[ns].uid, "{ns}: the same object");
        assert_eq!(now.data, before[ns].data, "{ns}: the same data");
        let left: Vec<&String> = now
            .annotations
            .keys()
            .filter(|k| k.starts_with(REFLECTOR))
            .collect();
        assert!(left.is_empty(), "{ns}: reflector's marks stay: {left:?}");
    }
    audit.settle(&t.client, Utc::now()).await;
    let mut writes: BTreeMap<String, usize> = BTreeMap::new();
    for ns in &targets {
        let q = Query::user(&user)
            .verbs(WRITE_VERBS)
            .resource("configmaps")
            .namespace(ns)
            .between(started, Utc::now() + chrono::Duration::days(1));
        for (verb, n) in audit.by_verb(&q) {
            *writes.entry(verb).or_default() += n;
        }
    }
    println!("the operator's writes where the mirrors were: {writes:?}");
    assert_eq!(writes, BTreeMap::from([("patch".to_owned(), MIRRORS)]));

    // The other tool's configuration removed; a change reaches every copy.
    let remove: serde_json::Map<String, Value> = [
        "reflection-allowed",
        "reflection-allowed-namespaces",
        "reflection-auto-enabled",
        "reflection-auto-namespaces",
    ]
    .iter()
    .map(|k| (format!("{REFLECTOR}{k}"), Value::Null))
    .collect();
    t.patch(
        CM,
        &src,
        "settings",
        json!({"metadata": {"annotations": remove}}),
    )
    .await;
    t.set_data(CM, &src, "settings", &[("k", Some("v2"))]).await;
    // (The rule strips the source's labels and annotations, as reflector
    // copies none: the copies are checked by their data.)
    for ns in &targets {
        wait_until(format!("{ns}/settings to follow"), TIMEOUT, async || {
            t.must_get(CM, ns, "settings").await.data_is(&[("k", "v2")])
        })
        .await;
    }
}
