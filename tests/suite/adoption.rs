//! Adoption (`spec.adopt`) against a real control plane and the real
//! binary: objects another tool made at a rule's places, holding what the
//! rule would write, are taken over by one metadata patch each (same uid,
//! same data, no payload write, no consumer rolled, the tool's marks
//! gone); one holding other content stays a conflict; and copies an
//! earlier rule of the same name handed over (`ruleDeleted: Orphan`) are
//! taken back by the rule created again, as a GitOps tool replaces it.
//! The operator runs as the chart's ServiceAccount (its rendered RBAC,
//! nothing more); its requests are read from the API server's audit log.

use std::collections::BTreeMap;

use crate::common::audit::{Audit, Query, WRITE_VERBS};
use crate::common::rbac::{ClusterScoped, as_the_chart};
use crate::common::*;
use crate::restart_consumers::{pod, restarts_of, workload};
use crate::whereabouts::copyrator_where;
use chrono::Utc;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;

/// The labels Kyverno's clone rule puts on what it generates (with the
/// source's own labels, which it copies too).
fn kyverno_labels(source: &Obj) -> Value {
    let mut labels: serde_json::Map<String, Value> = source
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    for (key, value) in [
        ("app.kubernetes.io/managed-by", "kyverno"),
        ("generate.kyverno.io/policy-name", "sync-settings"),
        ("generate.kyverno.io/rule-name", "clone"),
        (
            "generate.kyverno.io/source-namespace",
            source.namespace.as_str(),
        ),
        ("generate.kyverno.io/source-uid", source.uid.as_str()),
        ("generate.kyverno.io/trigger-kind", "Namespace"),
    ] {
        labels.insert(key.to_owned(), json!(value));
    }
    Value::Object(labels)
}

/// The operator's write requests (verb → count) in `namespaces` since `from`.
fn writes_in(
    audit: &Audit,
    user: &str,
    namespaces: &[String],
    from: chrono::DateTime<Utc>,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for ns in namespaces {
        let q = Query::user(user)
            .verbs(WRITE_VERBS)
            .resource("configmaps")
            .namespace(ns)
            .between(from, Utc::now() + chrono::Duration::days(1));
        for (verb, n) in audit.by_verb(&q) {
            *out.entry(verb).or_default() += n;
        }
    }
    out
}

/// Objects Kyverno made in five namespaces, holding the source's data, are
/// adopted: one patch each, nothing created, updated or deleted there,
/// each the same object with the same data and none of Kyverno's marks,
/// its consumer not rolled. A sixth holding other data stays a conflict; an
/// empty seventh gets a copy. A later source change reaches every copy.
#[tokio::test]
async fn objects_another_tool_made_are_adopted_with_one_metadata_patch_each() {
    let t = TestNs::new("adopt").await;
    let op = t.ns("op").await;
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(t.ns(&format!("t{i}")).await);
    }
    let differs = t.ns("t-differs").await;
    let empty = t.ns("t-empty").await;
    let source = t
        .create_source(CM, &op, "settings", &[], &[("k", "v1")])
        .await;
    let mut before = BTreeMap::new();
    for ns in &held {
        let made = t
            .create_json(
                CM,
                ns,
                "settings",
                json!({"metadata": {"labels": kyverno_labels(&source)}, "data": {"k": "v1"}}),
            )
            .await;
        before.insert(ns.clone(), made);
    }
    t.create_json(
        CM,
        &differs,
        "settings",
        json!({"metadata": {"labels": kyverno_labels(&source)}, "data": {"k": "older"}}),
    )
    .await;
    let whole_volume = json!([{"name": "v", "configMap": {"name": "settings"}}]);
    workload(
        &t,
        "Deployment",
        &held[0],
        "app",
        pod(json!({}), whole_volume),
        json!({}),
    )
    .await;
    let (_, generation_before) = restarts_of(&t, "Deployment", &held[0], "app").await;

    let spec = with(
        with(
            rule_spec(CM, t.selector(), &[t.glob("t")]),
            "/spec/adopt",
            json!(true),
        ),
        "/spec/rollout",
        json!({"restartConsumers": true}),
    );
    t.create_rule(&op, "r", spec).await;

    // plan shows the migration before anything is written: five adopted,
    // one created, one left a conflict; exit 2, as something would change.
    let plan = copyrator_plan(&["--namespace", &op], None).await;
    plan.assert_exit(2);
    let rule_ref = format!("{op}/r");
    for ns in &held {
        let line = format!("adopt ConfigMap {ns}/settings (rule {rule_ref}, source {op}/settings)");
        assert!(
            plan.stdout.lines().any(|l| l == line),
            "no line {line:?}: {}",
            plan.stdout
        );
    }
    assert!(
        plan.stdout
            .lines()
            .any(|l| l == format!("rule {rule_ref}: 5 adopt, 1 create, 1 skip")),
        "{}",
        plan.stdout
    );
    println!("plan:\n{}", plan.stdout);
    let cluster = ClusterScoped::new();
    let id = as_the_chart(
        &t,
        &cluster,
        &op,
        &["--set", "rollout.restartConsumers=true"],
    )
    .await;
    let user = id.user.clone();
    let audit = Audit::start();
    let started = Utc::now();
    let _operator = Operator::start_with_env(
        &t,
        vec!["run".into(), "--namespace".into(), op.clone()],
        &[("KUBECONFIG", &id.kubeconfig)],
    );
    let rule = t
        .wait_rule(
            &op,
            "r",
            "five adopted, one conflict, six copies",
            |r| match (
                status_u64(r, "adoptedCopies"),
                status_u64(r, "conflictCount"),
                status_u64(r, "copies"),
            ) {
                (Some(5), Some(1), Some(6)) => Ok(()),
                _ => Err(short_status(r)),
            },
        )
        .await;
    println!("status: {}", rule["status"]);
    t.wait_copy(CM, &empty, &source, &op, "r").await;
    for ns in &held {
        let now = t.must_get(CM, ns, "settings").await;
        let was = &before[ns];
        assert_eq!(now.uid, was.uid, "{ns}: the same object");
        assert_eq!(now.data, was.data, "{ns}: the same data");
        let kyverno: Vec<&String> = now
            .labels
            .keys()
            .filter(|k| k.starts_with("generate.kyverno.io/"))
            .collect();
        assert!(
            kyverno.is_empty(),
            "{ns}: Kyverno's marks stay: {kyverno:?}"
        );
        assert_eq!(
            now.labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("copyrator"),
            "{ns}"
        );
        assert_eq!(
            now.annotations
                .get(ANNOTATION_ADOPTED_FROM)
                .map(String::as_str),
            Some("Kyverno"),
            "{ns}"
        );
    }
    // where says which copies were adopted, and from what (exit 2: the
    // conflict is no current copy).
    let found = copyrator_where(&[&format!("{op}/settings"), "--namespace", &op]).await;
    found.assert_exit(2);
    for ns in &held {
        let line = format!("home: {ns}/settings in place (rule {op}/r) [content ");
        assert!(
            found
                .stdout
                .lines()
                .any(|l| l.starts_with(&line) && l.ends_with("(adopted from Kyverno)")),
            "no adopted line for {ns}: {}",
            found.stdout
        );
    }
    assert!(
        found
            .stdout
            .contains("7 places, 6 current, 1 not, 5 adopted\n"),
        "{}",
        found.stdout
    );
    let kept = t.must_get(CM, &differs, "settings").await;
    assert_eq!(kept.data.get("k").map(String::as_str), Some("older"));
    let (restarts, generation) = restarts_of(&t, "Deployment", &held[0], "app").await;
    assert!(
        restarts.is_empty() && generation == generation_before,
        "adoption rolled the consumer: {restarts:?}, generation {generation} (was {generation_before})"
    );
    audit.settle(&t.client, Utc::now()).await;
    let writes = writes_in(&audit, &user, &held, started);
    println!("the operator's writes where Kyverno's objects were: {writes:?}");
    assert_eq!(
        writes,
        BTreeMap::from([("patch".to_owned(), held.len())]),
        "one patch per adopted object, and nothing else"
    );
    let writes = writes_in(&audit, &user, std::slice::from_ref(&differs), started);
    assert!(writes.is_empty(), "the conflict was written: {writes:?}");

    // Adopted copies are the rule's: they follow the source.
    let source = t.set_data(CM, &op, "settings", &[("k", Some("v2"))]).await;
    for ns in held.iter().chain([&empty]) {
        t.wait_copy(CM, ns, &source, &op, "r").await;
    }
}

/// Namespaces `t0` to `t2`, and an operator of `op` running as the chart's
/// ServiceAccount (its user name is what the audit log names).
async fn chart_operator_and_three_targets(
    t: &TestNs,
    cluster: &ClusterScoped,
    op: &str,
) -> (Vec<String>, String, Operator) {
    let mut targets = Vec::new();
    for i in 0..3 {
        targets.push(t.ns(&format!("t{i}")).await);
    }
    let id = as_the_chart(t, cluster, op, &[]).await;
    let operator = id.run_operator(t);
    (targets, id.user.clone(), operator)
}

/// A rule deleted under `ruleDeleted: Orphan` hands its copies over; the
/// same rule created again with `adopt` (what a GitOps tool does when it
/// replaces it) takes them back: one patch each, no create, update or
/// delete, the same objects, no longer handed over, following the source.
/// Without `adopt` they stay their namespaces' (a conflict each).
#[tokio::test]
async fn a_rule_created_again_takes_back_the_copies_it_handed_over() {
    let t = TestNs::new("adopt-again").await;
    let op = t.ns("op").await;
    let cluster = ClusterScoped::new();
    let (targets, user, _operator) = chart_operator_and_three_targets(&t, &cluster, &op).await;
    let orphaning = with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/deletionPolicy",
        json!({"ruleDeleted": "Orphan"}),
    );
    t.create_rule(&op, "r", orphaning.clone()).await;
    let source = t
        .create_source(CM, &op, "settings", &[], &[("k", "v1")])
        .await;
    for ns in &targets {
        t.wait_copy(CM, ns, &source, &op, "r").await;
    }
    t.delete_rule(&op, "r").await;
    let mut handed = BTreeMap::new();
    for ns in &targets {
        let copy = wait_until(
            format!("the copy in {ns} handed over"),
            TIMEOUT,
            async || {
                let copy = t.must_get(CM, ns, "settings").await;
                match copy.labels.get(LABEL_SYNC_POLICY).map(String::as_str) {
                    Some("CreateOnly") => Ok(copy),
                    other => Err(format!("{LABEL_SYNC_POLICY}: {other:?}")),
                }
            },
        )
        .await;
        handed.insert(ns.clone(), copy);
    }
    wait_until("the rule to be gone", TIMEOUT, async || {
        match t.rules(&op).get_opt("r").await.map_err(|e| err_msg(&e))? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;

    // Created again without adopt: the handed-over copies are conflicts.
    t.create_rule(&op, "r", orphaning.clone()).await;
    t.wait_rule(&op, "r", "three conflicts", |r| {
        match status_u64(r, "conflictCount") {
            Some(3) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    t.delete_rule(&op, "r").await;
    wait_until("the rule to be gone", TIMEOUT, async || {
        match t.rules(&op).get_opt("r").await.map_err(|e| err_msg(&e))? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;

    // Created again with adopt: taken back.
    let audit = Audit::start();
    let again = Utc::now();
    t.create_rule(&op, "r", with(orphaning, "/spec/adopt", json!(true)))
        .await;
    t.wait_rule(&op, "r", "three adopted, no conflict", |r| {
        match (
            status_u64(r, "adoptedCopies"),
            status_u64(r, "conflictCount"),
            status_u64(r, "copies"),
        ) {
            (Some(3), Some(0), Some(3)) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    for ns in &targets {
        let now = t.must_get(CM, ns, "settings").await;
        assert_eq!(now.uid, handed[ns].uid, "{ns}: the same object");
        assert_eq!(now.data, handed[ns].data, "{ns}: the same data");
        assert!(
            !now.labels.contains_key(LABEL_SYNC_POLICY),
            "{ns}: still handed over: {:?}",
            now.labels
        );
        assert_eq!(
            now.annotations
                .get(ANNOTATION_ADOPTED_FROM)
                .map(String::as_str),
            Some(format!("Copyrator rule {op}/r").as_str()),
            "{ns}"
        );
    }
    audit.settle(&t.client, Utc::now()).await;
    let writes = writes_in(&audit, &user, &targets, again);
    println!("the operator's writes since the rule was created again: {writes:?}");
    assert_eq!(
        writes,
        BTreeMap::from([("patch".to_owned(), targets.len())]),
        "one patch per copy taken back, and nothing else"
    );
    let source = t.set_data(CM, &op, "settings", &[("k", Some("v2"))]).await;
    for ns in &targets {
        t.wait_copy(CM, ns, &source, &op, "r").await;
    }
}

/// The source changed between the rule's deletion (`ruleDeleted: Orphan`)
/// and its creation again with `adopt`, as Kyverno's conformance scenario
/// for a reinstalled policy has it: each handed-over copy whose mark proves
/// it still holds what Copyrator wrote there is taken back and brought up
/// to date (a patch, then an update: the same object); the one its
/// namespace edited since stays its namespace's, a conflict, untouched.
#[tokio::test]
async fn a_rule_created_again_after_its_source_changed_takes_back_and_updates_unchanged_copies() {
    let t = TestNs::new("adopt-changed").await;
    let op = t.ns("op").await;
    let cluster = ClusterScoped::new();
    let (targets, user, _operator) = chart_operator_and_three_targets(&t, &cluster, &op).await;
    let rule = with(
        with(
            rule_spec(CM, t.selector(), &[t.glob("t")]),
            "/spec/deletionPolicy",
            json!({"ruleDeleted": "Orphan"}),
        ),
        "/spec/adopt",
        json!(true),
    );
    t.create_rule(&op, "r", rule.clone()).await;
    let source = t
        .create_source(CM, &op, "settings", &[], &[("k", "v1")])
        .await;
    for ns in &targets {
        t.wait_copy(CM, ns, &source, &op, "r").await;
    }
    t.delete_rule(&op, "r").await;
    let mut handed = BTreeMap::new();
    for ns in &targets {
        let copy = t
            .wait_obj(CM, ns, "settings", "handed over", |copy| {
                match copy.labels.get(LABEL_SYNC_POLICY).map(String::as_str) {
                    Some("CreateOnly") => Ok(()),
                    other => Err(format!("{LABEL_SYNC_POLICY}: {other:?}")),
                }
            })
            .await;
        handed.insert(ns.clone(), copy);
    }
    t.wait_rule_gone(&op, "r", "deleted under Orphan").await;

    let source = t.set_data(CM, &op, "settings", &[("k", Some("v2"))]).await;
    let edited = &targets[2];
    let theirs = t
        .set_data(CM, edited, "settings", &[("k", Some("theirs"))])
        .await;

    let audit = Audit::start();
    let again = Utc::now();
    t.create_rule(&op, "r", rule).await;
    let taken_back = &targets[..2];
    for ns in taken_back {
        let now = t.wait_copy(CM, ns, &source, &op, "r").await;
        assert_eq!(now.uid, handed[ns].uid, "{ns}: the same object");
        assert!(
            !now.labels.contains_key(LABEL_SYNC_POLICY),
            "{ns}: still handed over: {:?}",
            now.labels
        );
    }
    t.wait_rule(&op, "r", "the edited copy a conflict", |r| {
        match (status_u64(r, "conflictCount"), status_u64(r, "copies")) {
            (Some(1), Some(2)) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    t.assert_unchanged(
        CM,
        edited,
        "settings",
        &theirs.resource_version,
        "edited by its namespace since the hand-over",
    )
    .await;
    audit.settle(&t.client, Utc::now()).await;
    let writes = writes_in(&audit, &user, &targets, again);
    println!("the operator's writes since the rule was created again: {writes:?}");
    assert_eq!(
        writes,
        BTreeMap::from([
            ("patch".to_owned(), taken_back.len()),
            ("update".to_owned(), taken_back.len())
        ]),
        "a patch to take each unchanged copy back and an update to bring it up to date"
    );
}
