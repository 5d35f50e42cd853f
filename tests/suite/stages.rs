//! Staged rollouts (`spec.rollout.stages`) against a real control plane
//! and the real binary: a source's new content reaches the namespaces of a
//! stage only after the stage before settled and paused; a stage that
//! does not settle halts the rollout (`RolloutHalted`) and later stages
//! keep their content; a new namespace of a stage not reached gets the
//! content rolled out before; `copyrator where` shows which copies hold
//! which content.
//!
//! Without a node, a Deployment never becomes available: the halted
//! stage's consumers are real workloads that do not become available.

use std::time::Duration;

use crate::common::rbac::{ClusterScoped, as_the_chart};
use crate::common::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
/// The canary's pause.
const PAUSE: Duration = Duration::from_secs(8);

/// A rule over the test's sources into all its namespaces, in two stages:
/// the namespaces labelled `stage=canary`, then the rest.
fn staged_rule(t: &TestNs, rollout: Value) -> Value {
    with(
        rule_spec(CM, t.selector(), &[t.glob("")]),
        "/spec/rollout",
        rollout,
    )
}

fn canary_then_rest(pause: Duration, settle_timeout: u64) -> Value {
    json!({
        "stages": [{"name": "canary", "namespaceSelector": {"matchLabels": {"stage": "canary"}},
                    "pauseSeconds": pause.as_secs()}],
        "settleTimeoutSeconds": settle_timeout,
    })
}

/// The time Copyrator last wrote `copy`, from its managedFields (seconds).
fn written_at(copy: &Obj) -> chrono::DateTime<chrono::Utc> {
    let (_, _, time) = copy
        .managed_fields
        .iter()
        .filter(|(manager, _, _)| manager == "copyrator")
        .max_by(|a, b| a.2.cmp(&b.2))
        .unwrap_or_else(|| panic!("{}/{} has no write of copyrator", copy.namespace, copy.name));
    chrono::DateTime::parse_from_rfc3339(time)
        .unwrap_or_else(|e| panic!("managedFields time {time}: {e}"))
        .with_timezone(&chrono::Utc)
}

/// The rule's `status.rollouts` entry of `source`, or why not as `phase`.
fn rollout_at(rule: &Value, source: &str, stage: &str, phase: &str) -> Result<(), String> {
    let entry = rule["status"]["rollouts"]
        .as_array()
        .and_then(|r| r.iter().find(|e| e["source"] == source))
        .ok_or_else(|| format!("no rollout of {source}: {}", short_status(rule)))?;
    if entry["stage"] == stage && entry["phase"] == phase {
        Ok(())
    } else {
        Err(format!("{entry}"))
    }
}

#[tokio::test]
async fn a_change_reaches_the_rest_only_after_the_canary_settled_and_paused() {
    let t = TestNs::new("stages").await;
    let op = t.ns("op").await;
    let canary = t.ns_labelled("c1", &[("stage", "canary")]).await;
    let rest = t.ns("r1").await;
    t.create_rule(&op, "r", staged_rule(&t, canary_then_rest(PAUSE, 60)))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    // A new source is not staged: nothing was rolled out before.
    let v1 = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &canary, &v1, &op, "r").await;
    let before = t.wait_copy(CM, &rest, &v1, &op, "r").await;
    t.wait_rule_ready(&op, "r").await;

    let v2 = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    let canary_copy = t.wait_copy(CM, &canary, &v2, &op, "r").await;
    let source_ref = format!("{op}/cfg");
    t.wait_rule(&op, "r", "the canary settled and pausing", |r| {
        rollout_at(r, &source_ref, "canary", "Pausing")?;
        match ready_condition(r) {
            Some(c) if c["reason"] == "RolloutProgressing" => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    let held = t.must_get(CM, &rest, "cfg").await;
    assert_eq!(
        held.resource_version, before.resource_version,
        "the rest was written before the canary's pause ended: {:?}",
        held.data
    );

    // A namespace of the rest created meanwhile gets the content rolled out
    // before (v1), as the rest holds.
    let late = t.ns("r2").await;
    t.wait_obj(CM, &late, "cfg", "v1, as the rest holds", |o| {
        o.data_is(&[("k", "v1")])
    })
    .await;

    // `where`: two contents, the rest's copies held.
    let report = copyrator(
        &["where", &source_ref, "--namespace", &op, "-o", "json"],
        None,
    )
    .await;
    report.assert_exit(2);
    let report = report.json();
    let row = |ns: &str| -> Value {
        report["copies"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["namespace"] == ns))
            .cloned()
            .unwrap_or_else(|| panic!("no row for {ns}: {report}"))
    };
    assert_eq!(row(&canary)["content"], report["content"], "{report}");
    assert_eq!(row(&canary)["state"], "in place");
    for ns in [&rest, &late] {
        assert_ne!(row(ns)["content"], report["content"], "{report}");
        assert_eq!(row(ns)["state"], "held", "{report}");
    }

    // After the pause the rest follows, and the rollout is over.
    let rest_copy = t.wait_copy(CM, &rest, &v2, &op, "r").await;
    t.wait_copy(CM, &late, &v2, &op, "r").await;
    let waited = written_at(&rest_copy) - written_at(&canary_copy);
    println!(
        "canary written, rest written {} s later (pause {} s)",
        waited.num_seconds(),
        PAUSE.as_secs()
    );
    assert!(
        waited.num_seconds() >= PAUSE.as_secs() as i64 - 1,
        "the rest was written {} s after the canary, within the pause",
        waited.num_seconds()
    );
    let done = t.wait_rule_ready(&op, "r").await;
    assert!(done["status"]["rollouts"].is_null(), "{}", done["status"]);
}

/// Where a rollout stands survives the operator: what the rule rolled out
/// is kept in its status, so that after a restart the rest keeps the
/// content rolled out before (and a namespace of the rest created while
/// the operator was down gets it), and the canary keeps the new one.
#[tokio::test]
async fn a_rollout_under_way_holds_the_rest_after_a_restart() {
    let t = TestNs::new("stages-restart").await;
    let op = t.ns("op").await;
    let canary = t.ns_labelled("c1", &[("stage", "canary")]).await;
    let rest = t.ns("r1").await;
    let long = Duration::from_secs(600);
    t.create_rule(&op, "r", staged_rule(&t, canary_then_rest(long, 600)))
        .await;
    // As the chart's ServiceAccount: the record goes through the status
    // writes the chart grants.
    let cluster = ClusterScoped::new();
    let id = as_the_chart(&t, &cluster, &op, &[]).await;
    let mut operator = id.run_operator(&t);
    let v1 = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &canary, &v1, &op, "r").await;
    t.wait_copy(CM, &rest, &v1, &op, "r").await;
    t.wait_rule_ready(&op, "r").await;

    let v2 = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &canary, &v2, &op, "r").await;
    let source_ref = format!("{op}/cfg");
    let rule = t
        .wait_rule(&op, "r", "the canary settled and pausing", |r| {
            rollout_at(r, &source_ref, "canary", "Pausing")
        })
        .await;
    let kept = rule["status"]["rolledOut"]["cfg"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        kept.split_whitespace().count(),
        2,
        "v1, which the rest holds, and v2: {}",
        rule["status"]
    );
    let held = t.must_get(CM, &rest, "cfg").await;

    operator.crash();
    let late = t.ns("r2").await;
    let _operator = id.run_operator(&t);
    t.wait_obj(CM, &late, "cfg", "v1, as the rest holds", |o| {
        o.data_is(&[("k", "v1")])
    })
    .await;
    t.wait_rule(&op, "r", "the rollout goes on from the canary", |r| {
        rollout_at(r, &source_ref, "canary", "Pausing")
    })
    .await;
    assert_for("the rest keeps v1, the canary v2", QUIET, async || {
        let now = t.must_get(CM, &rest, "cfg").await;
        if now.resource_version != held.resource_version {
            return Err(format!("the rest was written: {:?}", now.data));
        }
        t.must_get(CM, &canary, "cfg")
            .await
            .data_is(&[("k", "v2")])?;
        t.must_get(CM, &late, "cfg").await.data_is(&[("k", "v1")])
    })
    .await;
}

#[tokio::test]
async fn a_canary_whose_consumers_are_not_available_halts_the_rollout() {
    let t = TestNs::new("stages-halt").await;
    let op = t.ns("op").await;
    let canary = t.ns_labelled("c1", &[("stage", "canary")]).await;
    let rest = t.ns("r1").await;
    let mut rollout = canary_then_rest(Duration::ZERO, 10);
    rollout["restartConsumers"] = json!(true);
    t.create_rule(&op, "r", staged_rule(&t, rollout)).await;
    let _operator = Operator::start(&t, &op, &[]);
    let v1 = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &canary, &v1, &op, "r").await;
    let before = t.wait_copy(CM, &rest, &v1, &op, "r").await;
    // A consumer in the canary: with no node here, it never becomes available.
    let deployments: Api<Deployment> = Api::namespaced(t.client.clone(), &canary);
    let web: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{"name": "app", "image": "example.invalid/app:1"}],
                    "volumes": [{"name": "config", "configMap": {"name": "cfg"}}],
                },
            },
        },
    }))
    .expect("a Deployment");
    deployments
        .create(&PostParams::default(), &web)
        .await
        .unwrap_or_else(|e| panic!("creating the Deployment: {}", err_msg(&e)));

    let v2 = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &canary, &v2, &op, "r").await;
    let source_ref = format!("{op}/cfg");
    let web_ref = format!("Deployment {canary}/web");
    let halted = t
        .wait_rule(&op, "r", "RolloutHalted, naming the Deployment", |r| {
            rollout_at(r, &source_ref, "canary", "Halted")?;
            match ready_condition(r) {
                Some(c)
                    if c["reason"] == "RolloutHalted"
                        && c["message"].as_str().unwrap_or("").contains(&web_ref) =>
                {
                    Ok(())
                }
                _ => Err(short_status(r)),
            }
        })
        .await;
    println!("{}", ready_condition(&halted).expect("Ready")["message"]);
    t.assert_unchanged(
        CM,
        &rest,
        "cfg",
        &before.resource_version,
        "a halted rollout leaves the rest on its content",
    )
    .await;

    // The workload is made available (scaled to none): the rollout goes on.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap_or_else(|e| panic!("scaling the Deployment: {}", err_msg(&e)));
    t.wait_copy(CM, &rest, &v2, &op, "r").await;
    t.wait_rule_ready(&op, "r").await;
}

/// With the rule's status wiped while the operator is down (a restore
/// that keeps no status), where the rollout stands is built again from
/// the copies' marks: the canary holds the new content, so it is done and
/// only its pause runs again; the rest keeps the old content, unwritten.
#[tokio::test]
async fn with_its_status_wiped_a_rollout_is_rebuilt_from_the_copies_marks() {
    let t = TestNs::new("stages-wiped").await;
    let op = t.ns("op").await;
    let canary = t.ns_labelled("c1", &[("stage", "canary")]).await;
    let rest = t.ns("r1").await;
    t.create_rule(
        &op,
        "r",
        staged_rule(&t, canary_then_rest(Duration::from_secs(600), 600)),
    )
    .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let v1 = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &canary, &v1, &op, "r").await;
    t.wait_copy(CM, &rest, &v1, &op, "r").await;
    t.wait_rule_ready(&op, "r").await;
    let v2 = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &canary, &v2, &op, "r").await;
    let source_ref = format!("{op}/cfg");
    let before = t
        .wait_rule(&op, "r", "the canary settled and pausing", |r| {
            rollout_at(r, &source_ref, "canary", "Pausing")
        })
        .await;
    let held = t.must_get(CM, &rest, "cfg").await;

    operator.crash();
    let wiped = t
        .rules(&op)
        .patch_status(
            "r",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": null})),
        )
        .await
        .unwrap_or_else(|e| panic!("wiping the status: {}", err_msg(&e)));
    let wiped = serde_json::to_value(wiped).expect("a rule");
    assert!(
        wiped["status"]["rolledOut"].is_null(),
        "{}",
        wiped["status"]
    );
    let _operator = Operator::start(&t, &op, &[]);
    let rebuilt = t
        .wait_rule(&op, "r", "the canary pausing again", |r| {
            rollout_at(r, &source_ref, "canary", "Pausing")
        })
        .await;
    let settled = |r: &serde_json::Value| r["status"]["rollouts"][0]["settledAt"].clone();
    assert_ne!(
        settled(&rebuilt),
        settled(&before),
        "the pause runs again from the rebuild"
    );
    assert_for("the rest keeps v1, the canary v2", QUIET, async || {
        let now = t.must_get(CM, &rest, "cfg").await;
        if now.resource_version != held.resource_version {
            return Err(format!("the rest was written: {:?}", now.data));
        }
        t.must_get(CM, &canary, "cfg").await.data_is(&[("k", "v2")])
    })
    .await;
}
