//! Deletion you choose, against a real control plane and the real binary:
//! `spec.deletionPolicy` (`ruleDeleted`, `sourceGone`, `targetLeft`, each
//! `Delete` or `Orphan`), and `copyrator release` (the chart's pre-delete
//! hook), which removes every rule's finalizer and keeps or deletes the
//! copies.
//!
//! An orphaned copy is handed over to its namespace: it keeps its uid and
//! content, gains the label `copyrator.flant.com/sync-policy: CreateOnly`,
//! and is never written again. A rule under the default policy beside it
//! shows that each change was seen.

use crate::common::*;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;
const LABEL_ON_RULE_DELETED: &str = "copyrator.flant.com/on-rule-deleted";
const FINALIZER: &str = "copyrator.flant.com/cleanup";

/// A rule of `kind` over the test's sources into the namespaces `include`
/// matches, with `deletionPolicy` set to `policy`.
fn orphaning_spec<S: AsRef<str>>(t: &TestNs, kind: Kind, include: &[S], policy: Value) -> Value {
    with(
        rule_spec(kind, t.selector(), include),
        "/spec/deletionPolicy",
        policy,
    )
}

/// `copy` is the same object as `before` (same uid, same data), now
/// handed over to its namespace.
fn orphaned(copy: &Obj, before: &Obj) -> Result<(), String> {
    if copy.uid != before.uid {
        return Err(format!("replaced: uid {} (was {})", copy.uid, before.uid));
    }
    if copy.data != before.data {
        return Err(format!("data {:?} (was {:?})", copy.data, before.data));
    }
    match copy.label(LABEL_SYNC_POLICY) {
        Some("CreateOnly") => Ok(()),
        other => Err(format!(
            "label {LABEL_SYNC_POLICY}={other:?}, want CreateOnly"
        )),
    }
}

/// Waits until the copy `before` is handed over to its namespace.
async fn wait_orphaned(t: &TestNs, before: &Obj, why: &str) -> Obj {
    t.wait_obj(before.kind, &before.namespace, &before.name, why, |o| {
        orphaned(o, before)
    })
    .await
}

/// The Event reasons on rule `ns/name`.
async fn event_reasons(t: &TestNs, ns: &str, name: &str) -> Vec<String> {
    t.events_regarding(ns, name)
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

/// A source that stops matching and a namespace that leaves the targets:
/// under `Orphan` their copies are handed over, under the default (rule
/// `witness`) deleted; an orphaned copy is not written again when its
/// source changes. `prune: false` with `sourceGone` is refused at admission.
#[tokio::test]
async fn orphaned_copies_stay_handed_over_when_the_source_goes_or_the_target_leaves() {
    let t = TestNs::new("del-orphan").await;
    let op = t.ns("op").await;
    let kept1 = t.ns_labelled("kept1", &[("team", "a")]).await;
    let kept2 = t.ns_labelled("kept2", &[("team", "a")]).await;
    let witness = t.ns_labelled("witness1", &[("team", "a")]).await;
    let team_a = json!({"matchLabels": {"team": "a"}});
    let policy = json!({"sourceGone": "Orphan", "targetLeft": "Orphan"});
    let spec = orphaning_spec(&t, CM, &[t.glob("kept")], policy);
    t.create_rule(
        &op,
        "keep",
        with(spec, "/spec/targets/namespaceSelector", team_a.clone()),
    )
    .await;
    let witness_spec = rule_spec(CM, t.selector(), &[t.glob("witness")]);
    t.create_rule(
        &op,
        "witness",
        with(witness_spec, "/spec/targets/namespaceSelector", team_a),
    )
    .await;
    let contradiction = with(
        orphaning_spec(&t, CM, &[t.glob("kept")], json!({"sourceGone": "Orphan"})),
        "/spec/prune",
        json!(false),
    );
    let refused = t
        .try_create_rule(&op, "contradiction", contradiction)
        .await
        .expect_err("prune: false with sourceGone is refused at admission");
    let refused = err_msg(&refused);
    assert!(refused.contains("prune: false"), "{refused}");
    let _operator = Operator::start(&t, &op, &[]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let copy1 = t.wait_copy(CM, &kept1, &source, &op, "keep").await;
    let copy2 = t.wait_copy(CM, &kept2, &source, &op, "keep").await;
    t.wait_copy(CM, &witness, &source, &op, "witness").await;

    // kept2 leaves the targets: its copy is handed over, not deleted.
    t.namespaces()
        .patch(
            &kept2,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": null}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("unlabelling namespace {kept2}: {}", err_msg(&e)));
    let handed2 = wait_orphaned(&t, &copy2, "its namespace left the targets").await;

    // The source stops matching: kept1's copy is handed over; the witness
    // rule (default Delete) deletes its copy.
    let test_label = TEST_LABEL;
    t.set_labels(CM, &op, "cfg", &[(test_label, None)]).await;
    t.wait_gone(CM, &witness, "cfg", "its source no longer matches (Delete)")
        .await;
    let handed1 = wait_orphaned(&t, &copy1, "its source no longer matches").await;
    t.wait_rule(
        &op,
        "keep",
        "two copies handed over",
        |r| match status_u64(r, "createOnlyCopies") {
            Some(2) => is_ready(r),
            other => Err(format!("createOnlyCopies {other:?}: {}", short_status(r))),
        },
    )
    .await;
    let reasons = event_reasons(&t, &op, "keep").await;
    assert!(
        reasons.iter().any(|r| r == "Orphaned"),
        "an Orphaned Event on the rule: {reasons:?}"
    );

    // The source matches again with new data: the witness copy follows;
    // the orphaned copies are never written again.
    t.set_labels(CM, &op, "cfg", &[(test_label, Some(&t.prefix))])
        .await;
    let source = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &witness, &source, &op, "witness").await;
    for handed in [&handed1, &handed2] {
        t.assert_unchanged(
            CM,
            &handed.namespace,
            "cfg",
            &handed.resource_version,
            "an orphaned copy is never written again",
        )
        .await;
    }
}

/// A rule deleted under `ruleDeleted: Orphan`: its finalizer hands its
/// copies over, then lets it go. One that goes without its finalizer while
/// no operator runs has its copies handed over by the next operator (the
/// label on them says so), while a default rule's copies are collected.
#[tokio::test]
async fn a_rule_deleted_under_orphan_leaves_its_copies_handed_over() {
    let t = TestNs::new("del-rule").await;
    let op = t.ns("op").await;
    let a = t.ns("a1").await;
    let b = t.ns("b1").await;
    let c = t.ns("c1").await;
    let keep = json!({"ruleDeleted": "Orphan"});
    t.create_rule(&op, "keep", orphaning_spec(&t, SECRET, &[&a], keep.clone()))
        .await;
    t.create_rule(&op, "forced", orphaning_spec(&t, SECRET, &[&b], keep))
        .await;
    t.create_rule(&op, "plain", rule_spec(SECRET, t.selector(), &[&c]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let source = t
        .create_source(SECRET, &op, "token", &[], &[("token", "t0k3n")])
        .await;
    let kept = t.wait_copy(SECRET, &a, &source, &op, "keep").await;
    assert_eq!(kept.label(LABEL_ON_RULE_DELETED), Some("Orphan"));
    let forced = t.wait_copy(SECRET, &b, &source, &op, "forced").await;
    let plain = t.wait_copy(SECRET, &c, &source, &op, "plain").await;
    assert_eq!(plain.label(LABEL_ON_RULE_DELETED), None);

    // Deleted with the operator running: the finalizer hands over.
    t.delete_rule(&op, "keep").await;
    t.wait_rule_gone(&op, "keep", "its finalizer let it go")
        .await;
    wait_orphaned(&t, &kept, "its rule was deleted under Orphan").await;

    // Gone without their finalizers while no operator runs.
    operator.stop();
    for rule in ["forced", "plain"] {
        t.rules(&op)
            .patch(
                rule,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap_or_else(|e| panic!("removing the finalizer of {rule}: {}", err_msg(&e)));
        t.delete_rule(&op, rule).await;
        t.wait_rule_gone(&op, rule, "no finalizer").await;
    }
    let _operator = Operator::start(&t, &op, &[]);
    t.wait_gone(
        SECRET,
        &c,
        "token",
        "a default rule's orphans are collected",
    )
    .await;
    wait_orphaned(
        &t,
        &forced,
        "its rule went under Orphan, without its finalizer",
    )
    .await;
}

/// `copyrator release` with the operator stopped: every rule loses its
/// finalizer (a rule deleted afterwards goes at once); `--copies keep`
/// leaves the copies, `--copies delete` deletes them but those handed over.
#[tokio::test]
async fn release_removes_the_finalizers_and_keeps_or_deletes_the_copies() {
    let t = TestNs::new("release").await;
    let op = t.ns("op").await;
    let a = t.ns("a1").await;
    let b = t.ns("b1").await;
    t.create_rule(&op, "sync", rule_spec(CM, t.selector(), &[&a]))
        .await;
    t.create_rule(
        &op,
        "once",
        with(
            rule_spec(CM, t.selector(), &[&b]),
            "/spec/syncPolicy",
            json!("CreateOnly"),
        ),
    )
    .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let synced = t.wait_copy(CM, &a, &source, &op, "sync").await;
    let once_uid = t.rule_uid(&op, "once").await;
    let handed = t
        .wait_obj(CM, &b, "cfg", "a copy handed over (CreateOnly)", |o| {
            check_copy(o, &source, &op, "once", &once_uid)
        })
        .await;
    for rule in ["sync", "once"] {
        t.wait_rule(&op, rule, "its finalizer", |r| has_finalizer(r, true))
            .await;
    }
    operator.stop();

    let kept = copyrator(&["release", "--namespace", &op], None).await;
    kept.assert_exit(0);
    for rule in ["sync", "once"] {
        has_finalizer(&t.get_rule(&op, rule).await, false)
            .unwrap_or_else(|e| panic!("after release: {e}"));
    }
    t.assert_unchanged(
        CM,
        &a,
        "cfg",
        &synced.resource_version,
        "release --copies keep leaves the copies",
    )
    .await;

    // Back under an operator, which puts the finalizers back; then
    // released again, deleting the copies.
    let mut operator = Operator::start(&t, &op, &[]);
    t.wait_rule(&op, "sync", "its finalizer back", |r| {
        has_finalizer(r, true)
    })
    .await;
    operator.stop();
    let deleted = copyrator(&["release", "--namespace", &op, "--copies", "delete"], None).await;
    deleted.assert_exit(0);
    assert!(
        deleted.stdout.contains("deleted 1 copies"),
        "{}",
        deleted.stdout
    );
    t.wait_gone(CM, &a, "cfg", "release --copies delete").await;
    t.assert_unchanged(
        CM,
        &b,
        "cfg",
        &handed.resource_version,
        "a copy handed over stays",
    )
    .await;
    // With no operator running, a deleted rule goes at once.
    t.delete_rule(&op, "sync").await;
    t.wait_rule_gone(&op, "sync", "released, no finalizer")
        .await;
}

/// Whether rule `r` carries our finalizer (`want`), or why not.
fn has_finalizer(r: &Value, want: bool) -> Result<(), String> {
    let has = r["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER));
    if has == want {
        Ok(())
    } else {
        Err(format!(
            "finalizers {}, want ours {}",
            r["metadata"]["finalizers"],
            if want { "there" } else { "gone" }
        ))
    }
}
