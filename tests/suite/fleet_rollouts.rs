//! One staged rollout across the home cluster and two members: stages
//! that select clusters (`rollout.stages[].clusters`), an approval, and
//! where a rollout stands recorded in the rule's status, so that a new
//! operator process goes on from the same stage.

use crate::common::members::{Member, OUTAGE, members};
use crate::common::*;
use crate::members::{member_rule, wait_member_copy};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::{Value, json};
use std::time::Duration;

const CM: Kind = Kind::ConfigMap;
/// Within this a change reaches every member that answers.
const CONVERGE: Duration = Duration::from_secs(30);

/// The rule's first rollout, once it awaits the approval of `stage`.
fn awaiting(rule: &Value, stage: &str) -> Result<Value, String> {
    let first = &rule["status"]["rollouts"][0];
    if first["stage"] == stage && first["phase"] == "AwaitingApproval" {
        Ok(first.clone())
    } else {
        Err(format!("{}", rule["status"]["rollouts"]))
    }
}

/// `[staging: member a] → [eu: members labelled region=eu, approved by
/// hand] → rest (home)`: a change reaches member a first; member b (eu)
/// and home keep the old content, unwritten, while eu awaits its approval,
/// through a restart of the operator (the same stage, the same time it
/// was reached); an approval of other content changes nothing; the
/// approval of this content opens eu, then the rest.
#[tokio::test]
async fn a_rollout_spans_home_and_members_stage_by_stage_and_survives_a_restart() {
    let t = TestNs::new("fleet-rollout").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    let b_t2 = b.ns(&t, "t2").await;
    let home_t1 = t.ns("t1").await;
    a.register(&t.client, &op, &[("tier", "staging")]).await;
    b.register(&t.client, &op, &[("region", "eu")]).await;
    let rule = with(
        member_rule(&t, json!({"names": [a.name, b.name]})),
        "/spec/rollout",
        json!({
            "stages": [
                {"name": "staging", "clusters": {"names": [a.name]}, "pauseSeconds": 2},
                {"name": "eu", "clusters": {"selector": {"matchLabels": {"region": "eu"}}},
                 "approval": "Manual"},
            ],
            "settleTimeoutSeconds": 600,
        }),
    );
    t.create_rule(&op, "r", rule).await;
    let mut operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v1")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v1")]).await;
    wait_member_copy(&b, &b_t2, "cfg", &[("k", "v1")]).await;
    let home_v1 = wait_config_map_at(&t.client, (&home_t1, "cfg"), ("k", "v1"), CONVERGE).await;
    t.wait_rule_ready(&op, "r").await;
    let b_v1 = config_map_in(&b.client, &b_t1, "cfg")
        .await
        .expect("b's copy");

    t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v2")]).await;
    let reached = t
        .wait_rule(&op, "r", "eu awaits its approval", |rule| {
            awaiting(rule, "eu").map(|_| ())
        })
        .await;
    let reached = awaiting(&reached, "eu").expect("awaiting");
    let content = reached["content"].as_str().expect("a content").to_owned();
    let untouched = async || {
        let b_now = config_map_in(&b.client, &b_t1, "cfg").await?;
        let home_now = config_map_in(&t.client, &home_t1, "cfg").await?;
        if b_now.metadata.resource_version != b_v1.metadata.resource_version {
            return Err(format!("member b's copy was written: {:?}", b_now.data));
        }
        if home_now.metadata.resource_version != home_v1.metadata.resource_version {
            return Err(format!("home's copy was written: {:?}", home_now.data));
        }
        Ok(())
    };
    assert_for("eu and the rest keep v1", QUIET, untouched).await;

    // `plan` says each write's stage, and which its rollout holds; `where`
    // shows the places held in each cluster.
    let planned = copyrator_plan(
        &["--namespace", &op, "--member-clusters", "-o", "json"],
        None,
    )
    .await;
    let said: Vec<(String, String, String, bool)> = planned.json()["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| {
            let field = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
            (
                field("cluster"),
                field("namespace"),
                field("stage"),
                c["held"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            ("home".to_owned(), home_t1.clone(), "rest".to_owned(), true),
            (b.name.clone(), b_t1.clone(), "eu".to_owned(), true),
            (b.name.clone(), b_t2.clone(), "eu".to_owned(), true),
        ],
        "{}",
        planned.stdout
    );
    let found = crate::whereabouts::copyrator_where(&[
        &format!("{op}/cfg"),
        "--namespace",
        &op,
        "--member-clusters",
        "-o",
        "json",
    ])
    .await;
    let states: Vec<(String, String)> = found.json()["copies"]
        .as_array()
        .expect("copies")
        .iter()
        .map(|c| {
            let field = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
            (field("cluster"), field("state"))
        })
        .collect();
    for (cluster, state) in [
        ("home", "held"),
        (a.name.as_str(), "in place"),
        (b.name.as_str(), "held"),
    ] {
        assert!(
            states.contains(&(cluster.to_owned(), state.to_owned())),
            "{cluster} {state}: {}",
            found.stdout
        );
    }

    // A copy deleted in a stage not reached comes back with what that
    // stage holds.
    Api::<ConfigMap>::namespaced(b.client.clone(), &b_t2)
        .delete("cfg", &Default::default())
        .await
        .unwrap_or_else(|e| panic!("deleting b's copy in {b_t2}: {}", err_msg(&e)));
    wait_member_copy(&b, &b_t2, "cfg", &[("k", "v1")]).await;

    // A new process knows only what the status recorded.
    operator.crash();
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    assert_for("after the restart, eu still awaits", QUIET, async || {
        let rule = t.rules(&op).get("r").await.map_err(|e| err_msg(&e))?;
        let rule = serde_json::to_value(rule).map_err(|e| e.to_string())?;
        let now = awaiting(&rule, "eu")?;
        if now["openedAt"] != reached["openedAt"] {
            return Err(format!("reached again at {}", now["openedAt"]));
        }
        untouched().await
    })
    .await;

    let approve = |value: String| json!({"metadata": {"annotations": {"copyrator.flant.com/approve": value}}});
    t.patch_rule(&op, "r", approve("eu=0000000000000000".into()))
        .await;
    assert_for(
        "an approval of other content opens nothing",
        QUIET,
        untouched,
    )
    .await;
    t.patch_rule(&op, "r", approve(format!("eu={content}")))
        .await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v2")]).await;
    wait_config_map_at(&t.client, (&home_t1, "cfg"), ("k", "v2"), CONVERGE).await;
    t.wait_rule(
        &op,
        "r",
        "the rollout is over",
        |rule| match rule["status"]["rollouts"].as_array().map(Vec::len) {
            None | Some(0) => Ok(()),
            _ => Err(format!("{}", rule["status"]["rollouts"])),
        },
    )
    .await;
}
