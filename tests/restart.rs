//! "The operator restarts or its watch breaks: converges from the cluster's
//! state alone; no copy is lost or duplicated" — and a resync of a state that
//! is already right writes nothing.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::json;

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

#[tokio::test]
async fn restart_converges_from_cluster_state_alone() {
    let t = TestNs::new("restart").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let a = t.create_source(CM, &op, "a", &[], &[("k", "a")]).await;
    t.create_source(CM, &op, "b", &[], &[("k", "b1")]).await;
    let d = t.create_source(CM, &op, "d", &[], &[("k", "d")]).await;
    for ns in [&t1, &t2] {
        for s in [&a, &d] {
            t.wait_copy(CM, ns, s, &op, "r").await;
        }
    }
    let kept = t.must_get(CM, &t2, "a").await;
    let rule_uid = t.rule_uid(&op, "r").await;

    // The operator dies without notice; the cluster changes meanwhile.
    operator.crash();
    t.delete(CM, &t1, "a").await; // a copy deleted by someone
    let b = t.set_data(CM, &op, "b", &[("k", Some("b2"))]).await; // a source changed
    t.delete(CM, &op, "d").await; // a source deleted: its copies are orphans now
    let c = t.create_source(CM, &op, "c", &[], &[("k", "c")]).await; // a new source
    let t3 = t.ns("t3").await; // a new namespace

    let _operator = Operator::start(&t, &op, &[]);
    for ns in [&t1, &t2, &t3] {
        for s in [&a, &b, &c] {
            t.wait_copy(CM, ns, s, &op, "r").await;
        }
    }
    for ns in [&t1, &t2] {
        t.wait_gone(
            CM,
            ns,
            "d",
            "its source was deleted while the operator was down",
        )
        .await;
    }
    let now = t.must_get(CM, &t2, "a").await;
    assert_eq!(
        now.uid, kept.uid,
        "a copy that was right was recreated on restart"
    );

    let copies = t.list_labelled(CM, LABEL_RULE_UID, &rule_uid).await;
    let mut names: Vec<String> = copies
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect();
    names.sort();
    let mut want: Vec<String> = [&t1, &t2, &t3]
        .iter()
        .flat_map(|ns| ["a", "b", "c"].map(|n| format!("{ns}/{n}")))
        .collect();
    want.sort();
    assert_eq!(names, want, "the copies of the rule after the restart");

    t.wait_rule(&op, "r", "Ready with 3 sources, 3 targets, 9 copies", |r| {
        is_ready(r)?;
        let got = (
            status_u64(r, "sources"),
            status_u64(r, "targetNamespaces"),
            status_u64(r, "copies"),
        );
        if got == (Some(3), Some(3), Some(9)) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
}

/// resourceVersion (and managedFields) of the rules, the sources and every copy.
async fn snapshot(t: &TestNs, op: &str, rules: &[(&str, Kind)]) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    for (name, kind) in rules {
        let rule = t.get_rule(op, name).await;
        s.insert(
            format!("rule {op}/{name}"),
            format!(
                "rv {} status {}",
                rule["metadata"]["resourceVersion"], rule["status"]
            ),
        );
        let uid = rule["metadata"]["uid"].as_str().unwrap().to_string();
        for o in t.list_labelled(*kind, LABEL_RULE_UID, &uid).await {
            s.insert(
                format!("{kind:?} {}/{}", o.namespace, o.name),
                format!(
                    "rv {} managedFields {:?}",
                    o.resource_version, o.managed_fields
                ),
            );
        }
        for o in t.list_labelled(*kind, TEST_LABEL, &t.prefix).await {
            if !o.is_copy() {
                s.insert(
                    format!("source {kind:?} {}/{}", o.namespace, o.name),
                    format!(
                        "rv {} managedFields {:?}",
                        o.resource_version, o.managed_fields
                    ),
                );
            }
        }
    }
    s
}

fn diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Result<(), String> {
    let mut out = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => out.push(format!("{k}: deleted (was {v})")),
            Some(w) if w != v => out.push(format!("{k}:\n    before {v}\n    after  {w}")),
            _ => {}
        }
    }
    for (k, v) in after {
        if !before.contains_key(k) {
            out.push(format!("{k}: created ({v})"));
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(format!("{} writes:\n  {}", out.len(), out.join("\n  ")))
    }
}

#[tokio::test]
async fn resync_of_a_correct_state_writes_nothing() {
    let t = TestNs::new("zero-writes").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "rc", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(&op, "rs", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let mut first = Operator::start(&t, &op, &[]);
    let a = t.create_source(CM, &op, "a", &[], &[("k", "a")]).await;
    let b = t
        .create_json(
            CM,
            &op,
            "b",
            json!({
                "metadata": {"labels": {TEST_LABEL: t.prefix}, "annotations": {"note": "n"}},
                "data": {"k": "b"},
                "binaryData": {"bin": b64(b"\x00\x01")},
            }),
        )
        .await;
    let s = t
        .create_source(SECRET, &op, "s", &[("team", "x")], &[("password", "p")])
        .await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &a, &op, "rc").await;
        t.wait_copy(CM, ns, &b, &op, "rc").await;
        t.wait_copy(SECRET, ns, &s, &op, "rs").await;
    }
    t.wait_rule(&op, "rc", "Ready with 4 copies", |r| {
        is_ready(r)?;
        if status_u64(r, "copies") == Some(4) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
    t.wait_rule(&op, "rs", "Ready with 2 copies", |r| {
        is_ready(r)?;
        if status_u64(r, "copies") == Some(2) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
    let rules = [("rc", CM), ("rs", SECRET)];

    // Let the first operator settle: nothing changes for 3 s.
    let mut last = snapshot(&t, &op, &rules).await;
    let mut stable_since = std::time::Instant::now();
    wait_until(
        "the first operator to settle (no writes for 3 s)",
        Duration::from_secs(60),
        async || {
            let now = snapshot(&t, &op, &rules).await;
            if now != last {
                last = now;
                stable_since = std::time::Instant::now();
            }
            if stable_since.elapsed() >= Duration::from_secs(3) {
                Ok(())
            } else {
                Err(format!("{last:?}"))
            }
        },
    )
    .await;
    first.stop();

    // A new operator with a 2 s resync finds everything right: zero writes.
    let before = snapshot(&t, &op, &rules).await;
    // 2 rules, 3 sources, 6 copies: the snapshot sees everything it must.
    assert_eq!(before.len(), 11, "snapshot: {before:#?}");
    let mut second = Operator::start(&t, &op, &["--resync-interval", "2"]);
    second.wait_ready().await;
    assert_for(
        "no write by a restarted operator over ~4 resyncs of a correct state",
        Duration::from_secs(8),
        async || diff(&before, &snapshot(&t, &op, &rules).await),
    )
    .await;
    second.assert_running();

    // The second operator was live all along: it puts back a deleted copy.
    t.delete(CM, &t1, "a").await;
    t.wait_copy(CM, &t1, &a, &op, "rc").await;
}

#[tokio::test]
async fn rule_deleted_while_the_operator_is_down_is_cleaned_up_on_restart() {
    let t = TestNs::new("deleted-while-down").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let s = t.create_source(SECRET, &op, "s", &[], &[("k", "v")]).await;
    t.wait_copy(SECRET, &t1, &s, &op, "r").await;
    let uid = t.rule_uid(&op, "r").await;
    operator.crash();

    t.delete_rule(&op, "r").await;
    // The finalizer holds the rule while no operator runs.
    assert_for(
        "the rule to be held by its finalizer",
        QUIET,
        async || match t.try_get_rule(&op, "r").await? {
            Some(_) => Ok(()),
            None => Err("the rule is gone with no operator running".into()),
        },
    )
    .await;
    let _operator = Operator::start(&t, &op, &[]);
    t.wait_rule_gone(&op, "r", "the restarted operator cleans up")
        .await;
    assert!(
        t.get(SECRET, &t1, "s").await.is_none(),
        "copy left after the cleanup"
    );
    assert!(
        t.list_labelled(SECRET, LABEL_RULE_UID, &uid)
            .await
            .is_empty()
    );
}

/// A rule that vanished without its finalizer (force-deleted: the
/// finalizer removed by hand while no operator ran) leaves copies that
/// nobody owns: the next operator collects them by the rule-UID label at
/// start. Copies of a rule this operator is not responsible for (another
/// namespace's operator) are left alone.
#[tokio::test]
async fn copies_of_a_force_deleted_rule_are_collected_at_start() {
    let t = TestNs::new("force-deleted").await;
    let op = t.ns("op").await;
    let other_op = t.ns("other").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(&other_op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let mut other = Operator::start(&t, &other_op, &[]);
    let s = t.create_source(CM, &op, "s", &[], &[("k", "v")]).await;
    let o = t
        .create_source(CM, &other_op, "o", &[], &[("k", "v")])
        .await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &s, &op, "r").await;
        t.wait_copy(CM, ns, &o, &other_op, "r").await;
    }
    let uid = t.rule_uid(&op, "r").await;
    let other_uid = t.rule_uid(&other_op, "r").await;
    operator.crash();
    other.crash();

    // Force-deleted: the finalizer stripped, the rule gone.
    t.patch_rule(&op, "r", json!({"metadata": {"finalizers": null}}))
        .await;
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "force-deleted").await;
    assert_eq!(
        t.list_labelled(CM, LABEL_RULE_UID, &uid).await.len(),
        2,
        "the copies outlive the force-deleted rule while no operator runs"
    );

    let _operator = Operator::start(&t, &op, &[]);
    wait_until(
        "the copies of the force-deleted rule to be collected",
        TIMEOUT,
        async || match t.list_labelled(CM, LABEL_RULE_UID, &uid).await.len() {
            0 => Ok(()),
            n => Err(format!("{n} copies left")),
        },
    )
    .await;
    // The other operator's rule is alive but its operator is down: its copies stay.
    assert_for(
        "the other operator's copies to stay",
        QUIET,
        async || match t.list_labelled(CM, LABEL_RULE_UID, &other_uid).await.len() {
            2 => Ok(()),
            n => Err(format!("{n} copies of the other rule")),
        },
    )
    .await;
}
