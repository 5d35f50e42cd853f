//! Trust: who may create rules decides who may write.
//!
//! An operator with `--all-namespaces` would honour the rules of every test
//! that runs at the same time. Its test names all its rules alike and passes
//! `--rule-name` as well; in case that filter ever failed, it also holds
//! [`CLUSTER_WIDE`] for writing while every other test of this file holds it
//! for reading.

mod common;

use common::*;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;

fn has_finalizer(rule: &Value) -> bool {
    rule["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.contains(&json!(FINALIZER)))
}

#[tokio::test]
async fn rule_outside_the_operator_namespace_is_ignored_by_default() {
    let _shared = CLUSTER_WIDE.read().await;
    let t = TestNs::new("foreign-rule").await;
    let op = t.ns("op").await;
    let other = t.ns("other").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&other, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    let honoured = t.create_source(CM, &op, "in-op", &[], &[("k", "v")]).await;
    t.create_source(CM, &other, "in-other", &[], &[("k", "v")])
        .await;
    t.wait_copy(CM, &t1, &honoured, &op, "r").await;
    t.assert_absent(
        CM,
        &t1,
        "in-other",
        "the rule is outside the operator's namespace",
    )
    .await;
    let ignored = t.get_rule(&other, "r").await;
    assert!(
        !has_finalizer(&ignored),
        "the ignored rule got a finalizer: {}",
        short_status(&ignored)
    );
    assert!(
        ignored.get("status").is_none_or(Value::is_null),
        "the ignored rule got a status: {}",
        short_status(&ignored)
    );
}

/// All four rules share one name, unique to the test, and the operator runs
/// with `--rule-name` too: an `--all-namespaces` operator must not adopt the
/// rules of whatever else lives in the cluster.
#[tokio::test]
async fn all_namespaces_lets_a_foreign_rule_copy_only_from_its_own_namespace() {
    let _exclusive = CLUSTER_WIDE.write().await;
    let t = TestNs::new("all-namespaces").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let reach_ns = t.ns("o1").await;
    let list_ns = t.ns("o2").await;
    let own_ns = t.ns("o3").await;
    let src = t.ns("src").await;
    let t1 = t.ns("t1").await;
    let which = |w: &str| json!({TEST_LABEL: t.prefix, "which": w});
    // Outside the operator's namespace, naming another source namespace: refused.
    let reach = with(
        rule_spec(CM, which("reach"), &[t.glob("t")]),
        "/spec/namespace",
        json!(src),
    );
    t.create_rule(&reach_ns, &rule, reach).await;
    // The same with the original top-level form and a list.
    let reach_list = json!({
        "ruleType": "configmap",
        "selector": which("reach"),
        "namespace": [list_ns, src],
        "spec": {"targets": {"include": [t.glob("t")]}},
    });
    t.create_rule(&list_ns, &rule, reach_list).await;
    // Outside the operator's namespace, copying from its own namespace: fine.
    t.create_rule(&own_ns, &rule, rule_spec(CM, which("own"), &[t.glob("t")]))
        .await;
    // In the operator's namespace, copying from anywhere: fine.
    let from_src = with(
        rule_spec(CM, which("op"), &[t.glob("t")]),
        "/spec/namespace",
        json!(src),
    );
    t.create_rule(&op, &rule, from_src).await;

    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    let labels = |w: &'static str| [(TEST_LABEL, t.prefix.as_str()), ("which", w)];
    let stolen = t
        .create_plain(CM, &src, "stolen", &labels("reach"), &[("k", "v")])
        .await;
    let own = t
        .create_plain(CM, &own_ns, "own", &labels("own"), &[("k", "v")])
        .await;
    let shared = t
        .create_plain(CM, &src, "shared", &labels("op"), &[("k", "v")])
        .await;
    t.wait_copy(CM, &t1, &own, &own_ns, &rule).await;
    t.wait_copy(CM, &t1, &shared, &op, &rule).await;

    for ns in [&reach_ns, &list_ns] {
        let r = t
            .wait_rule(ns, &rule, "Ready False with a message", |r| {
                let c = ready_condition(r).ok_or_else(|| short_status(r))?;
                if c["status"] == "False" && c["message"].as_str().is_some_and(|m| !m.is_empty()) {
                    Ok(())
                } else {
                    Err(short_status(r))
                }
            })
            .await;
        eprintln!("{ns}: {}", ready_condition(&r).unwrap());
        let uid = r["metadata"]["uid"].as_str().unwrap();
        assert!(
            t.list_labelled(CM, LABEL_RULE_UID, uid).await.is_empty(),
            "rule {ns}/{rule} made copies"
        );
    }
    t.assert_absent(
        CM,
        &t1,
        &stolen.name,
        "a foreign rule may not copy from another namespace",
    )
    .await;
    for ns in [&op, &own_ns] {
        assert!(
            t.get(CM, ns, "stolen").await.is_none(),
            "stolen copied into {ns}"
        );
    }
    operator.assert_running();
}

#[tokio::test]
async fn rule_name_limits_the_operator_to_one_rule() {
    let _shared = CLUSTER_WIDE.read().await;
    let t = TestNs::new("rule-name").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let which = |w: &str| json!({TEST_LABEL: t.prefix, "which": w});
    t.create_rule(
        &op,
        "chosen",
        rule_spec(CM, which("chosen"), &[t.glob("t")]),
    )
    .await;
    t.create_rule(&op, "other", rule_spec(CM, which("other"), &[t.glob("t")]))
        .await;
    let _operator = Operator::start(&t, &op, &["--rule-name", "chosen"]);
    let a = t
        .create_plain(
            CM,
            &op,
            "a",
            &[(TEST_LABEL, &t.prefix), ("which", "chosen")],
            &[("k", "v")],
        )
        .await;
    t.create_plain(
        CM,
        &op,
        "b",
        &[(TEST_LABEL, &t.prefix), ("which", "other")],
        &[("k", "v")],
    )
    .await;
    t.wait_copy(CM, &t1, &a, &op, "chosen").await;
    t.assert_absent(CM, &t1, "b", "--rule-name names another rule")
        .await;
    let other = t.get_rule(&op, "other").await;
    assert!(
        !has_finalizer(&other),
        "the other rule got a finalizer: {}",
        short_status(&other)
    );
    assert!(
        other.get("status").is_none_or(Value::is_null),
        "the other rule got a status: {}",
        short_status(&other)
    );
}
