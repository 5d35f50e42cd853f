//! Many clusters: a rule at home keeps copies in member clusters, with the
//! guarantees it gives at home. A home control plane and two member
//! control planes (`hack/test` starts them; see tests/common/members.rs).

use std::time::Duration;

use crate::common::members::{Member, OUTAGE, members};
use crate::common::prometheus;
use crate::common::rbac::{Binding, bind_as};
use crate::common::tenant::{bind_copier, copier_may_edit};
use crate::common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SOURCE_CLUSTER: &str = "copyrator.flant.com/source-cluster";
/// Within this a change reaches every member that answers.
const CONVERGE: Duration = Duration::from_secs(30);

pub(crate) fn member_rule(t: &TestNs, clusters: Value) -> Value {
    with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/targets/clusters",
        clusters,
    )
}

/// The data of `ns/name` in a member, or why not yet as `want`.
async fn member_copy(member: &Member, ns: &str, name: &str) -> Result<ConfigMap, String> {
    Api::<ConfigMap>::namespaced(member.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| err_msg(&e))?
        .ok_or_else(|| format!("no {ns}/{name} in member {}", member.name))
}

pub(crate) async fn wait_member_copy(
    member: &Member,
    ns: &str,
    name: &str,
    data: &[(&str, &str)],
) -> ConfigMap {
    let want = map(data);
    wait_until(
        format!("{ns}/{name} in member {} with {want:?}", member.name),
        CONVERGE,
        async || {
            let copy = member_copy(member, ns, name).await?;
            let labels = copy.metadata.labels.clone().unwrap_or_default();
            if !labels.contains_key("copyrator.flant.com/rule-uid") {
                return Err("not labelled as a copy".into());
            }
            let annotations = copy.metadata.annotations.clone().unwrap_or_default();
            if annotations.get(SOURCE_CLUSTER).map(String::as_str) != Some("home") {
                return Err(format!(
                    "{SOURCE_CLUSTER} is {:?}",
                    annotations.get(SOURCE_CLUSTER)
                ));
            }
            match copy.data.clone().unwrap_or_default() == want {
                true => Ok(copy),
                false => Err(format!("data {:?}", copy.data)),
            }
        },
    )
    .await
}

async fn wait_member_gone(member: &Member, ns: &str, name: &str, why: &str) {
    wait_until(
        format!("{ns}/{name} gone from member {} ({why})", member.name),
        CONVERGE,
        async || match member_copy(member, ns, name).await {
            Ok(_) => Err("still there".into()),
            Err(e) if e.starts_with("no ") => Ok(()),
            Err(e) => Err(e),
        },
    )
    .await;
}

/// The rule's `status.clusters` entry of a member.
pub(crate) fn cluster_entry<'a>(rule: &'a Value, name: &str) -> Option<&'a Value> {
    rule["status"]["clusters"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

pub(crate) async fn wait_member_status(
    t: &TestNs,
    op: &str,
    member: &str,
    ready: bool,
    reason: &str,
) -> Value {
    t.wait_rule(
        op,
        "r",
        &format!("member {member} ready={ready} ({reason})"),
        |rule| {
            let entry = cluster_entry(rule, member).ok_or_else(|| short_status(rule))?;
            if entry["ready"] == ready && entry["reason"] == reason {
                Ok(())
            } else {
                Err(format!("{entry}"))
            }
        },
    )
    .await
}

/// A source reaches a member by name and one by label, next to home;
/// follows the source, is repaired when edited there, fills a new
/// namespace there, and the status lists each member with its counts.
#[tokio::test]
async fn copies_reach_members_and_stay_true() {
    let t = TestNs::new("members-reach").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    a.register(&t.client, &op, &[]).await;
    b.register(&t.client, &op, &[("env", "prod")]).await;
    t.create_rule(
        &op,
        "r",
        member_rule(
            &t,
            json!({"names": [a.name], "selector": {"matchLabels": {"env": "prod"}}}),
        ),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);

    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &home_t1, &source, &op, "r").await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v1")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v1")]).await;

    // Updates propagate.
    t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v2")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v2")]).await;

    // Drift in a member is repaired.
    Api::<ConfigMap>::namespaced(a.client.clone(), &a_t1)
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "edited"}})),
        )
        .await
        .expect("edit the copy in member a");
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v2")]).await;

    // A new namespace in a member is filled.
    let b_t2 = b.ns(&t, "t2").await;
    wait_member_copy(&b, &b_t2, "cfg", &[("k", "v2")]).await;

    // The status lists both, with their copies; the counts cover all.
    let rule = t
        .wait_rule(&op, "r", "both members synced with their copies", |rule| {
            let a_ok = cluster_entry(rule, &a.name)
                .is_some_and(|c| c["ready"] == true && c["copies"] == 1);
            let b_ok = cluster_entry(rule, &b.name)
                .is_some_and(|c| c["ready"] == true && c["copies"] == 2);
            match a_ok && b_ok && rule["status"]["clustersReady"] == "2/2" {
                true => Ok(()),
                false => Err(format!("{}", rule["status"])),
            }
        })
        .await;
    assert_eq!(
        status_u64(&rule, "copies"),
        Some(4),
        "1 at home + 1 in a + 2 in b: {}",
        rule["status"]
    );
}

/// Copies go from a member that leaves the rule's selection, from one that
/// leaves the inventory, and from every cluster when the rule is deleted.
#[tokio::test]
async fn copies_leave_members_that_leave() {
    let t = TestNs::new("members-leave").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    a.register(&t.client, &op, &[("env", "prod")]).await;
    b.register(&t.client, &op, &[("env", "prod")]).await;
    t.create_rule(
        &op,
        "r",
        member_rule(&t, json!({"selector": {"matchLabels": {"env": "prod"}}})),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    t.wait_copy(CM, &home_t1, &source, &op, "r").await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v")]).await;

    // b leaves the selection: its copy goes; a's stays.
    b.register(&t.client, &op, &[("env", "dev")]).await;
    wait_member_gone(
        &b,
        &b_t1,
        "cfg",
        "b no longer matches the rule's cluster selector",
    )
    .await;
    member_copy(&a, &a_t1, "cfg")
        .await
        .expect("a still selected");

    // a leaves the inventory: its copy goes too.
    a.unregister(&t.client, &op).await;
    wait_member_gone(&a, &a_t1, "cfg", "a left the inventory").await;
    t.must_get(CM, &home_t1, "cfg").await;

    // Back in the inventory, then the rule goes: every copy goes with it.
    a.register(&t.client, &op, &[("env", "prod")]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "its finalizer deleted every copy")
        .await;
    wait_member_gone(&a, &a_t1, "cfg", "the rule was deleted").await;
    t.wait_gone(CM, &home_t1, "cfg", "the rule was deleted")
        .await;
}

/// The operator's `copyrator_api_writes_total` for ConfigMaps of `verb`
/// sent to `cluster`, from its /metrics.
async fn writes_to(operator: &Operator, cluster: &str, verb: &str) -> Result<f64, String> {
    let wanted = [("cluster", cluster), ("verb", verb), ("kind", "ConfigMap")];
    prometheus::operator_metric(operator.port, "copyrator_api_writes_total", &wanted)
        .await?
        .ok_or_else(|| format!("no copyrator_api_writes_total series for cluster {cluster}"))
}

/// A neighbour in member a rewrites the copy's data every 2 s for a
/// minute: the operator restores it and then backs off (its updates to a,
/// counted by the `cluster` label of `copyrator_api_writes_total`, stay
/// well below the neighbour's 30 changes), b is untouched, and once the
/// neighbour stops, a's copy is right again.
#[tokio::test]
async fn a_copy_contested_in_a_member_is_backed_off_there() {
    const FIGHT_FOR: Duration = Duration::from_secs(60);
    const FIGHT_EVERY: Duration = Duration::from_secs(2);
    /// The backoff allows about 10 restores in the minute (tests/suite/neighbours.rs
    /// holds the home cluster to 15); without it, every change is one.
    const MAX_UPDATES: f64 = 15.0;
    let t = TestNs::new("members-contest").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    t.ns("t1").await;
    a.register(&t.client, &op, &[]).await;
    b.register(&t.client, &op, &[]).await;
    t.create_rule(
        &op,
        "r",
        member_rule(&t, json!({"names": [a.name, b.name]})),
    )
    .await;
    let operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v")]).await;
    let b_before = member_copy(&b, &b_t1, "cfg").await.expect("b's copy");
    let before = writes_to(&operator, &a.name, "update")
        .await
        .expect("the operator's writes to a");

    let neighbour = PatchParams {
        field_manager: Some("neighbour".into()),
        ..PatchParams::default()
    };
    let copies = Api::<ConfigMap>::namespaced(a.client.clone(), &a_t1);
    let start = std::time::Instant::now();
    let mut changes = 0u32;
    let mut said_contested = None;
    let mut last_seen = Value::Null;
    while start.elapsed() < FIGHT_FOR {
        copies
            .patch(
                "cfg",
                &neighbour,
                &Patch::Merge(json!({"data": {"k": format!("neighbour-{changes}")}})),
            )
            .await
            .unwrap_or_else(|e| panic!("the neighbour's change {changes}: {}", err_msg(&e)));
        changes += 1;
        // The rule says so as it would at home, naming the member.
        let rule = t.get_rule(&op, "r").await;
        let first = &rule["status"]["contested"][0];
        last_seen = rule.clone();
        if first["cluster"] == a.name.as_str()
            && first["writer"] == "neighbour"
            && cluster_entry(&rule, &a.name).is_some_and(|e| e["reason"] == "CopiesContested")
        {
            said_contested.get_or_insert(rule["status"]["conditions"].clone());
        }
        tokio::time::sleep(FIGHT_EVERY).await;
    }
    let said = said_contested.unwrap_or_else(|| {
        panic!(
            "in {FIGHT_FOR:?} of changes the rule never listed a's copy as contested: {}",
            short_status(&last_seen)
        )
    });
    println!("while contested: {said}");
    let updates = writes_to(&operator, &a.name, "update")
        .await
        .expect("the operator's writes to a")
        - before;
    let b_updates = writes_to(&operator, &b.name, "update")
        .await
        .expect("the operator's writes to b");
    println!(
        "the neighbour changed a's copy {changes} times in {FIGHT_FOR:?}; the operator updated it \
         {updates} times, and b's copy {b_updates} times"
    );
    assert!(
        (1.0..=MAX_UPDATES).contains(&updates),
        "the operator updated a's contested copy {updates} times for {changes} changes \
         (between 1 and {MAX_UPDATES})"
    );
    assert_eq!(b_updates, 0.0, "b's copy was never changed, nor written");
    let b_after = member_copy(&b, &b_t1, "cfg").await.expect("b's copy");
    assert_eq!(
        b_after.metadata.resource_version, b_before.metadata.resource_version,
        "b's copy is untouched"
    );
    // The neighbour stopped: a's copy is restored within the backoff's
    // longest wait (5 min).
    wait_until(
        "a's copy restored once the neighbour stopped",
        Duration::from_secs(330),
        async || match member_copy(&a, &a_t1, "cfg").await?.data {
            Some(data) if data.get("k").map(String::as_str) == Some("v") => Ok(()),
            data => Err(format!("data {data:?}")),
        },
    )
    .await;
}

/// Copies of a rule deleted while no operator ran (its finalizer removed
/// by hand) are orphans in a member too: the next operator collects them
/// there, by their rule-UID label, as it does at home.
#[tokio::test]
async fn orphans_in_a_member_are_collected() {
    let t = TestNs::new("members-orphans").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let a = members().await.remove(0);
    let a_t1 = a.ns(&t, "t1").await;
    let home_t1 = t.ns("t1").await;
    a.register(&t.client, &op, &[]).await;
    t.create_rule(&op, "r", member_rule(&t, json!({"names": [a.name]})))
        .await;
    let mut operator = Operator::start(&t, &op, &["--member-clusters"]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    t.wait_copy(CM, &home_t1, &source, &op, "r").await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    operator.crash();

    // The rule goes without its finalizer running.
    t.patch_rule(&op, "r", json!({"metadata": {"finalizers": null}}))
        .await;
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "deleted with no finalizer")
        .await;
    member_copy(&a, &a_t1, "cfg")
        .await
        .expect("no operator ran: a's copy is still there");

    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    wait_member_gone(&a, &a_t1, "cfg", "its rule is gone: an orphan").await;
    t.wait_gone(CM, &home_t1, "cfg", "its rule is gone: an orphan")
        .await;
}

/// `deletionPolicy` holds in members: a member that leaves the rule's
/// selection keeps its copy handed over (`targetLeft: Orphan`), and the
/// rule's deletion hands over its copies everywhere (`ruleDeleted:
/// Orphan`). Then `copyrator release --member-clusters --copies delete`,
/// with the operator stopped, deletes another rule's copies at home and in
/// the member, leaves those handed over, and removes the finalizer.
#[tokio::test]
async fn deletion_policy_and_release_hold_in_members() {
    let t = TestNs::new("members-deletion").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    a.register(&t.client, &op, &[("env", "prod")]).await;
    b.register(&t.client, &op, &[("env", "prod")]).await;
    let orphaning = with(
        member_rule(&t, json!({"selector": {"matchLabels": {"env": "prod"}}})),
        "/spec/deletionPolicy",
        json!({"targetLeft": "Orphan", "ruleDeleted": "Orphan"}),
    );
    t.create_rule(&op, "r", orphaning).await;
    let mut operator = Operator::start(&t, &op, &["--member-clusters"]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    t.wait_copy(CM, &home_t1, &source, &op, "r").await;
    let in_a = wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    let in_b = wait_member_copy(&b, &b_t1, "cfg", &[("k", "v")]).await;

    // b leaves the selection: its copy is handed over, not deleted.
    b.register(&t.client, &op, &[("env", "dev")]).await;
    wait_member_handed_over(&b, &in_b, "b left the rule's cluster selector").await;
    // The rule is deleted: its copies are handed over at home and in a.
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "its finalizer handed its copies over")
        .await;
    wait_member_handed_over(&a, &in_a, "the rule was deleted under Orphan").await;
    t.wait_obj(CM, &home_t1, "cfg", "handed over at home", |o| {
        match o.label("copyrator.flant.com/sync-policy") {
            Some("CreateOnly") => Ok(()),
            other => Err(format!("sync-policy {other:?}")),
        }
    })
    .await;

    // Another rule, default policy, copies a second source into a.
    t.create_rule(&op, "plain", member_rule(&t, json!({"names": [a.name]})))
        .await;
    let other = t.create_source(CM, &op, "other", &[], &[("o", "1")]).await;
    t.wait_copy(CM, &home_t1, &other, &op, "plain").await;
    wait_member_copy(&a, &a_t1, "other", &[("o", "1")]).await;
    t.wait_rule_ready(&op, "plain").await;
    operator.stop();
    let released = copyrator(
        &[
            "release",
            "--namespace",
            &op,
            "--member-clusters",
            "--copies",
            "delete",
        ],
        None,
    )
    .await;
    released.assert_exit(0);
    wait_member_gone(&a, &a_t1, "other", "release --copies delete").await;
    t.wait_gone(CM, &home_t1, "other", "release --copies delete")
        .await;
    wait_member_handed_over(&a, &in_a, "a copy handed over stays").await;
    let plain = t.get_rule(&op, "plain").await;
    assert!(
        plain["metadata"]["finalizers"].is_null(),
        "released: {}",
        plain["metadata"]
    );
}

/// Waits until the member's copy `before` (same uid) is handed over to
/// its namespace.
async fn wait_member_handed_over(member: &Member, before: &ConfigMap, why: &str) {
    let ns = before.metadata.namespace.clone().unwrap_or_default();
    let name = before.metadata.name.clone().unwrap_or_default();
    wait_until(
        format!("{ns}/{name} handed over in member {} ({why})", member.name),
        CONVERGE,
        async || {
            let copy = member_copy(member, &ns, &name).await?;
            if copy.metadata.uid != before.metadata.uid {
                return Err(format!("replaced: uid {:?}", copy.metadata.uid));
            }
            let labels = copy.metadata.labels.unwrap_or_default();
            match labels
                .get("copyrator.flant.com/sync-policy")
                .map(String::as_str)
            {
                Some("CreateOnly") => Ok(()),
                other => Err(format!("sync-policy {other:?}")),
            }
        },
    )
    .await;
}

/// Member a registered, a rule `r` of `op` with `local: false` copying
/// into a's `t1`, the operator started with `--member-clusters`, and the
/// source `cfg` copied there.
async fn copied_into_member_a_only(t: &TestNs, op: &str) -> (Member, Operator) {
    let [a, _b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(t, "t1").await;
    a.register(&t.client, op, &[]).await;
    t.create_rule(
        op,
        "r",
        member_rule(t, json!({"names": [a.name], "local": false})),
    )
    .await;
    let operator = Operator::start(t, op, &["--member-clusters"]);
    t.create_source(CM, op, "cfg", &[], &[("k", "v")]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    (a, operator)
}

/// A rule with `local: false` keeps copies in members only.
#[tokio::test]
async fn local_false_keeps_copies_in_members_only() {
    let t = TestNs::new("members-nolocal").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    let (_a, _operator) = copied_into_member_a_only(&t, &op).await;
    t.wait_rule_ready(&op, "r").await;
    t.assert_absent(CM, &home_t1, "cfg", "local: false").await;
}

/// `createOnlyCopies` counts the copies handed over in members as those at
/// home, and each member's entry counts its own.
#[tokio::test]
async fn create_only_copies_count_in_every_cluster() {
    let t = TestNs::new("members-createonly").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    let [a, _b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    a.register(&t.client, &op, &[]).await;
    t.create_rule(
        &op,
        "r",
        with(
            member_rule(&t, json!({"names": [a.name]})),
            "/spec/syncPolicy",
            json!("CreateOnly"),
        ),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    t.wait_obj(CM, &home_t1, "cfg", "a copy at home", |_| Ok(()))
        .await;
    t.wait_rule(&op, "r", "createOnlyCopies 2, 1 of them in a", |rule| {
        let entry = cluster_entry(rule, &a.name).ok_or_else(|| short_status(rule))?;
        match (
            status_u64(rule, "createOnlyCopies"),
            entry["createOnlyCopies"].as_u64(),
        ) {
            (Some(2), Some(1)) => Ok(()),
            _ => Err(format!("{}; a: {entry}", short_status(rule))),
        }
    })
    .await;
}

/// A foreign object that holds a place in a member goes: the copy is
/// written there at once and the member's conflict leaves the status and
/// the metrics, not at the next resync (an hour here). The rule is there
/// before the operator starts.
#[tokio::test]
async fn a_place_freed_in_a_member_is_filled_at_once() {
    a_place_freed_in_a_member(RuleComes::First, "members-freed").await;
}

/// The same for a rule whose first pass in the member meets the foreign
/// object: the member is listed and the rule's sources too (another rule
/// watches them) when the rule is created.
#[tokio::test]
async fn a_place_freed_in_a_member_is_filled_at_once_for_a_new_rule() {
    a_place_freed_in_a_member(RuleComes::Later, "members-freed-new").await;
}

#[derive(PartialEq)]
enum RuleComes {
    First,
    Later,
}

async fn a_place_freed_in_a_member(comes: RuleComes, test: &str) {
    let t = TestNs::new(test).await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, _b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    a.create_plain(
        CM,
        &a_t1,
        "cfg",
        &[("owner", "someone-else")],
        &[("mine", "yes")],
    )
    .await;
    a.register(&t.client, &op, &[]).await;
    let rule = member_rule(&t, json!({"names": [a.name], "local": false}));
    let operator = if comes == RuleComes::First {
        t.create_rule(&op, "r", rule).await;
        let operator =
            Operator::start(&t, &op, &["--member-clusters", "--resync-interval", "3600"]);
        t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
        operator
    } else {
        let a_w1 = a.ns(&t, "w1").await;
        let warm = with(rule.clone(), "/spec/targets/include", json!([t.glob("w")]));
        t.create_rule(&op, "warm", warm).await;
        let operator =
            Operator::start(&t, &op, &["--member-clusters", "--resync-interval", "3600"]);
        t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
        wait_member_copy(&a, &a_w1, "cfg", &[("k", "v")]).await;
        t.create_rule(&op, "r", rule).await;
        operator
    };
    let member_conflicts = async |want: u32| {
        t.wait_rule(&op, "r", &format!("member a: {want} conflicts"), |rule| {
            let entry = cluster_entry(rule, &a.name).ok_or_else(|| short_status(rule))?;
            match entry["conflicts"].as_u64() {
                Some(n) if n == u64::from(want) => Ok(()),
                _ => Err(format!("{entry}")),
            }
        })
        .await;
        wait_until(
            format!("copyrator_member_conflicts_skipped of a is {want}"),
            CONVERGE,
            async || {
                let labels = [("cluster", a.name.as_str())];
                match prometheus::operator_metric(
                    operator.port,
                    "copyrator_member_conflicts_skipped",
                    &labels,
                )
                .await?
                {
                    Some(n) if n == f64::from(want) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    };
    member_conflicts(1).await;
    // The rule's own counts and list cover the member, which its entry names,
    // and so does the Event.
    let conflict_count = async |want: u64| {
        let rule = t
            .wait_rule(&op, "r", &format!("conflictCount {want}"), |rule| {
                let listed = rule["status"]["conflicts"].as_array().map_or(0, Vec::len);
                match status_u64(rule, "conflictCount") {
                    Some(n) if n == want && listed as u64 == want => Ok(()),
                    _ => Err(short_status(rule)),
                }
            })
            .await;
        rule["status"]["conflicts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let listed = conflict_count(1).await;
    assert_eq!(
        (
            listed[0]["cluster"].as_str(),
            listed[0]["namespace"].as_str()
        ),
        (Some(a.name.as_str()), Some(a_t1.as_str())),
        "the conflict names its member: {listed:?}"
    );
    let in_a = format!("{a_t1}/cfg in member cluster {}", a.name);
    let event = wait_until(
        "a ConflictSkipped Event naming member a",
        CONVERGE,
        async || {
            let events = t.events_regarding(&op, "r").await;
            events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("ConflictSkipped"))
                .filter_map(|e| e.note.clone())
                .find(|note| note.contains(&in_a))
                .ok_or_else(|| format!("{} events", events.len()))
        },
    )
    .await;
    println!("member a's conflict: {event}");

    Api::<ConfigMap>::namespaced(a.client.clone(), &a_t1)
        .delete("cfg", &Default::default())
        .await
        .expect("delete the foreign object in member a");
    let freed = std::time::Instant::now();
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    let written = freed.elapsed();
    member_conflicts(0).await;
    conflict_count(0).await;
    eprintln!(
        "member a: the freed place held its copy {} ms after the foreign object was deleted; the status and metrics said so {} ms after",
        written.as_millis(),
        freed.elapsed().as_millis()
    );
}

/// A member whose API server is down is reported within 30 s, never
/// delays the others, and converges once it answers again.
#[tokio::test]
async fn an_unreachable_member_is_reported_and_holds_up_no_one() {
    let t = TestNs::new("members-down").await;
    let _down = OUTAGE.write().await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    a.register(&t.client, &op, &[]).await;
    b.register(&t.client, &op, &[]).await;
    t.create_rule(
        &op,
        "r",
        member_rule(&t, json!({"names": [a.name, b.name]})),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v1")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v1")]).await;

    let _restart = a.start_api_server_on_drop();
    a.stop_api_server();
    let stopped = std::time::Instant::now();
    let rule = wait_member_status(&t, &op, &a.name, false, "ClusterUnreachable").await;
    // A figure for the record (the deadline above is what the test asserts).
    eprintln!(
        "member a unreachable in the rule's status {:.1} s after its API server stopped",
        stopped.elapsed().as_secs_f64()
    );
    let ready = ready_condition(&rule).cloned().unwrap_or_default();
    assert_eq!(ready["reason"], "ClusterUnreachable", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains(&a.name)),
        "the Ready message names the member: {ready}"
    );

    wait_until(
        "a ClusterUnreachable Event on the rule",
        CONVERGE,
        async || {
            let events = t.events_regarding(&op, "r").await;
            match events
                .iter()
                .any(|e| e.reason.as_deref() == Some("ClusterUnreachable"))
            {
                true => Ok(()),
                false => Err(format!("{} Events, none ClusterUnreachable", events.len())),
            }
        },
    )
    .await;

    // Home and b follow a change while a is down.
    t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    let source = t.must_get(CM, &op, &source.name).await;
    t.wait_copy(CM, &home_t1, &source, &op, "r").await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v2")]).await;

    let starting = std::time::Instant::now();
    a.start_api_server();
    let ready_after = starting.elapsed();
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v2")]).await;
    eprintln!(
        "member a converged {:.1} s after its API server was started ({:.1} s until it answered /readyz)",
        starting.elapsed().as_secs_f64(),
        ready_after.as_secs_f64()
    );
    wait_member_status(&t, &op, &a.name, true, "Synced").await;
}

/// A name the inventory does not hold is reported, not fatal.
#[tokio::test]
async fn a_member_not_in_the_inventory_is_reported() {
    let t = TestNs::new("members-unknown").await;
    let op = t.ns("op").await;
    t.ns("t1").await;
    t.create_rule(&op, "r", member_rule(&t, json!({"names": ["nowhere"]})))
        .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let rule = wait_member_status(&t, &op, "nowhere", false, "ClusterNotFound").await;
    assert_eq!(rule["status"]["clustersReady"], "0/1", "{}", rule["status"]);
}

/// Without `--member-clusters` a rule that targets members says so, and
/// its copies at home are kept as ever.
#[tokio::test]
async fn members_off_is_reported_and_home_is_kept() {
    let t = TestNs::new("members-off").await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    t.create_rule(&op, "r", member_rule(&t, json!({"names": ["a"]})))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    t.wait_copy(CM, &home_t1, &source, &op, "r").await;
    t.wait_rule(&op, "r", "Ready=False, MemberClustersDisabled", |rule| {
        not_ready_because(rule, "MemberClustersDisabled")
    })
    .await;
}

/// The server and CA of a member's admin kubeconfig, for a ClusterProfile's
/// access provider.
pub(crate) fn server_and_ca(member: &Member) -> (String, String) {
    let config = kube::config::Kubeconfig::from_yaml(&member.kubeconfig_yaml())
        .expect("the member's kubeconfig");
    let cluster = config.clusters[0]
        .cluster
        .clone()
        .expect("the member's cluster entry");
    (
        cluster.server.expect("a server"),
        cluster.certificate_authority_data.expect("the CA, inline"),
    )
}

/// A token of a new ServiceAccount of member `b` (bound to cluster-admin:
/// what a member needs at least is tests/suite/member_side.rs's matter).
fn member_token(member: &Member, ns: &str, account: &str) -> String {
    member.kubectl(&["-n", ns, "create", "serviceaccount", account]);
    member.kubectl(&[
        "create",
        "clusterrolebinding",
        &format!("{ns}-{account}"),
        "--clusterrole=cluster-admin",
        &format!("--serviceaccount={ns}:{account}"),
    ]);
    member.kubectl(&["-n", ns, "create", "token", account, "--duration=1h"])
}

/// A ClusterProfile (server and CA in its access provider) and the Secret
/// labelled `copyrator.flant.com/cluster-profile` with its name, holding a
/// token, make a member; a new token in that Secret is taken without a
/// restart.
#[tokio::test]
async fn a_cluster_profile_makes_a_member_and_its_token_rotates() {
    let t = TestNs::new("members-profile").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [_a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let b_t1 = b.ns(&t, "t1").await;
    let crd: Value = serde_yaml::from_str(include_str!(
        "../../crd/clusterprofile.multicluster.x-k8s.io.yaml"
    ))
    .expect("the ClusterProfile CRD");
    let profiles_resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
        "clusterprofiles",
    );
    apply_crd(t.client.clone(), &crd, &profiles_resource).await;
    let profile_name = format!("{}-prof", t.prefix);
    let (server, ca) = server_and_ca(&b);
    let token = member_token(&b, &b_t1, "copyrator");
    let token_secret = |token: &str| {
        serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(json!({
            "metadata": {"name": profile_name, "namespace": op,
                         "labels": {"copyrator.flant.com/cluster-profile": profile_name}},
            "stringData": {"token": token},
        }))
        .expect("a Secret")
    };
    t.secrets(&op)
        .create(&Default::default(), &token_secret(&token))
        .await
        .expect("the token Secret");
    let profiles: Api<kube::api::DynamicObject> =
        Api::namespaced_with(t.client.clone(), &op, &profiles_resource);
    let profile: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1",
        "kind": "ClusterProfile",
        "metadata": {"name": profile_name, "labels": {"tier": "edge"}},
        "spec": {"displayName": "b", "clusterManager": {"name": "tests"}},
    }))
    .expect("a ClusterProfile");
    profiles
        .create(&Default::default(), &profile)
        .await
        .expect("the ClusterProfile");
    profiles
        .patch_status(
            &profile_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"accessProviders": [
                {"name": "secretreader", "cluster": {"server": server, "certificate-authority-data": ca}}
            ]}})),
        )
        .await
        .expect("the ClusterProfile's access provider");
    t.create_rule(
        &op,
        "r",
        member_rule(
            &t,
            json!({"selector": {"matchLabels": {"tier": "edge"}}, "local": false}),
        ),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v1")]).await;
    wait_member_status(&t, &op, &profile_name, true, "Synced").await;

    // A new token: the member is reconnected with it and keeps up.
    let rotated = member_token(&b, &b_t1, "copyrator-next");
    t.secrets(&op)
        .patch(
            &profile_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": rotated}})),
        )
        .await
        .expect("the rotated token");
    // The old token stops working: only the new one can write from now on.
    b.kubectl(&["-n", &b_t1, "delete", "serviceaccount", "copyrator"]);
    // The API server caches a token it accepted for a few seconds: from
    // when it refuses the old one, only the new one can write.
    wait_until("the old token refused", CONVERGE, async || {
        let out = std::process::Command::new("kubectl")
            .args(["--kubeconfig", "/dev/null", "--insecure-skip-tls-verify"])
            .args([
                "--server", &server, "--token", &token, "get", "--raw", "/api",
            ])
            .output()
            .map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Err("the old token is still accepted".into()),
            false => Ok(()),
        }
    })
    .await;
    t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v2")]).await;

    // Revoked: the member is reported as refusing the credentials.
    b.kubectl(&["-n", &b_t1, "delete", "serviceaccount", "copyrator-next"]);
    let rule = wait_member_status(&t, &op, &profile_name, false, "CredentialsRefused").await;
    assert_eq!(
        ready_condition(&rule).map(|c| c["reason"].clone()),
        Some(json!("CredentialsRefused")),
        "{}",
        rule["status"]
    );
    for account in ["copyrator", "copyrator-next"] {
        let _ = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&b.kubeconfig_path)
            .args(["delete", "clusterrolebinding", &format!("{b_t1}-{account}")])
            .output();
    }
}

/// `(cluster, action, namespace, name)` of each change of a JSON plan, in
/// its order.
fn cluster_changes(plan: &PlanOutcome) -> Vec<(String, String, String, String)> {
    plan.change_values()
        .iter()
        .map(|c| {
            (
                change_field(c, "cluster"),
                change_field(c, "action"),
                change_field(c, "namespace"),
                change_field(c, "name"),
            )
        })
        .collect()
}

fn planned(cluster: &str, action: &str, ns: &str) -> (String, String, String, String) {
    (cluster.into(), action.into(), ns.into(), "cfg".into())
}

/// `copyrator plan --member-clusters -f` covers the members: creates in a
/// and b, each named by its cluster, and nothing written; once the
/// operator has converged, the same file is no change, a file that drops
/// b deletes in b only, one with `local: false` deletes at home only; and
/// a member that cannot be reached is reported, fails the plan, and does
/// not keep the others from being planned.
#[tokio::test]
async fn plan_says_what_each_member_would_get() {
    let t = TestNs::new("members-plan").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let home_t1 = t.ns("t1").await;
    let [a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let b_t1 = b.ns(&t, "t1").await;
    a.register(&t.client, &op, &[]).await;
    b.register(&t.client, &op, &[]).await;
    t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let rule = format!("{op}/r");
    let file = |name: &str, clusters: Value| {
        t.rule_file(
            name,
            &[TestNs::rule_manifest(None, "r", &member_rule(&t, clusters))],
        )
    };
    let both = file("both", json!({"names": [a.name, b.name]}));
    let plan_of = async |file: &str, output: &str| {
        copyrator_plan(
            &[
                "--namespace",
                &op,
                "--member-clusters",
                "-f",
                file,
                "-o",
                output,
            ],
            None,
        )
        .await
    };

    let plan = plan_of(&both, "json").await;
    plan.assert_exit(2);
    assert_eq!(
        cluster_changes(&plan),
        [
            planned("home", "create", &home_t1),
            planned(&a.name, "create", &a_t1),
            planned(&b.name, "create", &b_t1),
        ],
        "{}",
        plan.stdout
    );
    assert_eq!(
        plan.json()["clusters"],
        json!([
            {"cluster": "home", "planned": true},
            {"cluster": a.name, "planned": true},
            {"cluster": b.name, "planned": true},
        ])
    );
    let text = plan_of(&both, "text").await;
    text.assert_exit(2);
    let line = |cluster: &str, ns: &str| {
        format!("{cluster}: create ConfigMap {ns}/cfg (rule {rule}, source {op}/cfg)")
    };
    assert_eq!(
        text.stdout.lines().collect::<Vec<_>>(),
        [
            line("home", &home_t1),
            line(&a.name, &a_t1),
            line(&b.name, &b_t1),
            format!("rule {rule}: 3 create"),
        ],
        "{}",
        text.stderr
    );
    for (member, ns) in [(&a, &a_t1), (&b, &b_t1)] {
        assert!(
            member_copy(member, ns, "cfg").await.is_err(),
            "plan wrote a copy in member {}",
            member.name
        );
    }

    // The rule applied as in the file, and converged.
    t.create_rule(
        &op,
        "r",
        member_rule(&t, json!({"names": [a.name, b.name]})),
    )
    .await;
    let mut operator = Operator::start(&t, &op, &["--member-clusters"]);
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v")]).await;
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v")]).await;
    t.wait_rule_ready(&op, "r").await;
    operator.stop();

    let same = plan_of(&both, "json").await;
    same.assert_exit(0);
    assert_eq!(cluster_changes(&same), [], "{}", same.stdout);

    let only_a = plan_of(&file("only-a", json!({"names": [a.name]})), "json").await;
    only_a.assert_exit(2);
    assert_eq!(
        cluster_changes(&only_a),
        [planned(&b.name, "delete", &b_t1)],
        "{}",
        only_a.stdout
    );

    let away = json!({"names": [a.name, b.name], "local": false});
    let members_only = plan_of(&file("away", away), "json").await;
    members_only.assert_exit(2);
    assert_eq!(
        cluster_changes(&members_only),
        [planned("home", "delete", &home_t1)],
        "{}",
        members_only.stdout
    );
    member_copy(&b, &b_t1, "cfg")
        .await
        .expect("plan deleted the copy in b");

    // A member whose API server does not answer: reported, exit 1, and
    // the others are still planned.
    let mut gone = a.clone();
    gone.name = "gone".into();
    let unreachable = a
        .kubeconfig_with_token("not-a-token")
        .replace(&a.server_and_ca().0, "https://127.0.0.1:9");
    gone.register_kubeconfig(&t.client, &op, &[], &unreachable)
        .await;
    let partial = plan_of(&file("only-a-again", json!({"names": [a.name]})), "text").await;
    partial.assert_exit(1);
    let lines: Vec<&str> = partial.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "{}: delete ConfigMap {b_t1}/cfg (rule {rule}, source {op}/cfg)",
            b.name
        ),
        "{}",
        partial.stdout
    );
    assert!(
        lines.len() == 3
            && lines[1].starts_with("gone: not planned: its API server cannot be reached")
            && lines[2] == format!("rule {rule}: 1 delete"),
        "{}",
        partial.stdout
    );
    assert!(
        partial
            .stderr
            .contains("error: member cluster gone could not be planned: "),
        "{}",
        partial.stderr
    );
}

/// With `--allow-tenant-clusters`, a tenant rule's copies reach a member
/// only where that member's namespace accepts the tenant's namespace: the
/// member's namespace of the same name is someone else's. A platform CA a
/// tenant of `team-a` pulls lands in the member's `team-a` only once that
/// namespace says `accept-from: team-a`.
#[tokio::test]
async fn a_tenant_rule_writes_into_a_member_only_where_the_namespace_accepts_it() {
    let t = TestNs::new("members-tenant").await;
    let _up = OUTAGE.read().await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let shared = t.ns("shared").await;
    let [_a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let b_team_a = b.ns(&t, "team-a").await;
    assert_eq!(b_team_a, team_a, "the member's namespace of the same name");
    b.register(&t.client, &op, &[]).await;
    t.create_json(
        CM,
        &shared,
        "ca",
        json!({"metadata": {"labels": {TEST_LABEL: t.prefix},
                            "annotations": {"copyrator.flant.com/allow-to": team_a.as_str()}},
               "data": {"ca.crt": "x"}}),
    )
    .await;
    t.create_rule(
        &team_a,
        &rule,
        json!({"spec": {"ruleType": "configmap", "selector": t.selector(),
                        "namespace": [shared.as_str()],
                        "targets": {"clusters": {"names": [b.name], "local": false}}}}),
    )
    .await;
    // It writes as team-a's ServiceAccount: reading `shared` at home, and
    // editing the member's team-a (granted before it accepts: the
    // annotation alone decides).
    copier_may_edit(&t, &team_a, &[&team_a, &shared]).await;
    bind_copier(&b.client, &b_team_a, &team_a).await;
    let _operator = Operator::start(
        &t,
        &op,
        &[
            "--member-clusters",
            "--all-namespaces",
            "--allow-tenant-clusters",
            "--rule-name",
            &rule,
        ],
    );
    t.wait_rule(
        &team_a,
        &rule,
        "the member reported",
        |r| match cluster_entry(r, &b.name) {
            Some(entry) if entry["ready"] == true => Ok(()),
            _ => Err(short_status(r)),
        },
    )
    .await;
    assert_for(
        "nothing in the member's team-a",
        QUIET,
        async || match member_copy(&b, &b_team_a, "ca").await {
            Err(_) => Ok(()),
            Ok(copy) => Err(format!("a copy: {:?}", copy.metadata.labels)),
        },
    )
    .await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(b.client.clone())
        .patch(
            &b_team_a,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "copyrator.flant.com/accept-from": team_a.as_str()}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("the member's team-a accepts: {}", err_msg(&e)));
    wait_member_copy(&b, &b_team_a, "ca", &[("ca.crt", "x")]).await;
}

/// Adoption in a member is the home pass's: an object another tool made
/// there, holding what the rule writes, is taken over as it is (same uid,
/// same data, the tool's marks gone) and counted in the member's entry and
/// the rule's `adoptedCopies`; one holding other content stays a conflict.
#[tokio::test]
async fn objects_another_tool_made_in_a_member_are_adopted_there() {
    let t = TestNs::new("members-adopt").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, _b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let a_t1 = a.ns(&t, "t1").await;
    let a_t2 = a.ns(&t, "t2").await;
    let kyverno = [
        ("app.kubernetes.io/managed-by", "kyverno"),
        ("generate.kyverno.io/policy-name", "sync-cfg"),
    ];
    let made = a
        .create_plain(CM, &a_t1, "cfg", &kyverno, &[("k", "v")])
        .await;
    a.create_plain(CM, &a_t2, "cfg", &kyverno, &[("k", "older")])
        .await;
    a.register(&t.client, &op, &[]).await;
    let rule = with(
        member_rule(&t, json!({"names": [a.name], "local": false})),
        "/spec/adopt",
        json!(true),
    );
    t.create_rule(&op, "r", rule).await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let rule = t
        .wait_rule(&op, "r", "member a: 1 adopted, 1 conflict", |rule| {
            let entry = cluster_entry(rule, &a.name).ok_or_else(|| short_status(rule))?;
            match (
                entry["adoptedCopies"].as_u64(),
                entry["conflicts"].as_u64(),
                status_u64(rule, "adoptedCopies"),
            ) {
                (Some(1), Some(1), Some(1)) => Ok(()),
                _ => Err(format!("{entry}")),
            }
        })
        .await;
    println!("status: {}", rule["status"]);
    let now = a
        .try_get(CM, &a_t1, "cfg")
        .await
        .expect("read")
        .expect("still there");
    assert_eq!(now.uid, made.uid, "the same object");
    assert!(
        now.is_copy(),
        "labelled as the rule's copy: {:?}",
        now.labels
    );
    assert!(
        !now.labels.contains_key("generate.kyverno.io/policy-name"),
        "{:?}",
        now.labels
    );
    let kept = a
        .try_get(CM, &a_t2, "cfg")
        .await
        .expect("read")
        .expect("still there");
    assert_eq!(kept.data.get("k").map(String::as_str), Some("older"));
}

/// Each cluster's Kubernetes version, home and member, is read from its
/// API server and reported: a version series per cluster naming exactly
/// what its `/version` says, and none of them below the supported floor
/// (the suite's control planes run a supported release; the verdict for an
/// older one is unit-tested in `core::versions` and `controller::versions`).
#[tokio::test]
async fn every_clusters_kubernetes_version_is_reported() {
    let t = TestNs::new("members-version").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let (a, operator) = copied_into_member_a_only(&t, &op).await;
    for (cluster, client) in [("home", &t.client), (a.name.as_str(), &a.client)] {
        let version = client
            .apiserver_version()
            .await
            .expect("the cluster's /version")
            .git_version;
        let series = [("cluster", cluster), ("version", version.as_str())];
        wait_until(
            format!("copyrator_cluster_kubernetes_version of {cluster} naming {version}"),
            CONVERGE,
            async || match prometheus::operator_metric(
                operator.port,
                "copyrator_cluster_kubernetes_version",
                &series,
            )
            .await?
            {
                Some(1.0) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
        let below = prometheus::operator_metric(
            operator.port,
            "copyrator_cluster_below_supported_floor",
            &[("cluster", cluster)],
        )
        .await
        .expect("a scrape");
        assert_eq!(
            below,
            Some(0.0),
            "{cluster} ({version}) is not below the floor"
        );
        println!("cluster version: {cluster} reported as {version}");
    }
}

/// A staged rule's rollout in a member goes on after a restart from where
/// it stood: the member's record of what was rolled out (its `clusters[]`
/// entry's `rolledOut`) keeps the rest of the member at the content rolled
/// out before while its canary pauses, a namespace of the rest made while
/// the operator was down gets that content too, and the canary keeps the
/// new one.
#[tokio::test]
async fn a_members_rollout_under_way_holds_the_rest_after_a_restart() {
    let t = TestNs::new("members-stages").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let [a, _b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let canary = a.ns_labelled(&t, "t-c1", &[("stage", "canary")]).await;
    let rest = a.ns(&t, "t-r1").await;
    a.register(&t.client, &op, &[]).await;
    let rule = with(
        member_rule(&t, json!({"names": [a.name], "local": false})),
        "/spec/rollout",
        json!({
            "stages": [{"name": "canary", "namespaceSelector": {"matchLabels": {"stage": "canary"}},
                        "pauseSeconds": 600}],
            "settleTimeoutSeconds": 600,
        }),
    );
    t.create_rule(&op, "r", rule).await;
    let mut operator = Operator::start(&t, &op, &["--member-clusters"]);
    t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    wait_member_copy(&a, &canary, "cfg", &[("k", "v1")]).await;
    wait_member_copy(&a, &rest, "cfg", &[("k", "v1")]).await;
    t.wait_rule_ready(&op, "r").await;

    t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    wait_member_copy(&a, &canary, "cfg", &[("k", "v2")]).await;
    t.wait_rule(
        &op,
        "r",
        "member a's record keeps v1, which its rest holds, and v2",
        |rule| {
            let entry = cluster_entry(rule, &a.name).ok_or_else(|| short_status(rule))?;
            let kept = entry["rolledOut"]["cfg"].as_str().unwrap_or_default();
            match kept.split_whitespace().count() {
                2 => Ok(()),
                _ => Err(format!("{entry}")),
            }
        },
    )
    .await;
    let held = member_copy(&a, &rest, "cfg")
        .await
        .expect("the rest's copy");

    operator.crash();
    let late = a.ns(&t, "t-r2").await;
    let _operator = Operator::start(&t, &op, &["--member-clusters"]);
    wait_member_copy(&a, &late, "cfg", &[("k", "v1")]).await;
    assert_for("the rest keeps v1, the canary v2", QUIET, async || {
        let now = member_copy(&a, &rest, "cfg").await?;
        if now.metadata.resource_version != held.metadata.resource_version {
            return Err(format!("the rest was written: {:?}", now.data));
        }
        let canary_data = member_copy(&a, &canary, "cfg").await?.data;
        if canary_data
            .as_ref()
            .and_then(|d| d.get("k"))
            .map(String::as_str)
            != Some("v2")
        {
            return Err(format!("the canary holds {canary_data:?}"));
        }
        let late_data = member_copy(&a, &late, "cfg").await?.data;
        match late_data
            .as_ref()
            .and_then(|d| d.get("k"))
            .map(String::as_str)
        {
            Some("v1") => Ok(()),
            _ => Err(format!("the late namespace holds {late_data:?}")),
        }
    })
    .await;
}

/// With `--tenant-identity service-account`, a tenant rule's writes in a
/// member are sent as its ServiceAccount too: a member namespace that
/// lets the account write gets the copy; once its RoleBinding goes, the
/// next content is refused there in the member API server's words, in the
/// member's entry of the rule's status.
#[tokio::test]
async fn a_tenant_rule_writes_as_its_service_account_in_a_member_too() {
    let t = TestNs::new("members-acting").await;
    let _up = OUTAGE.read().await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let team_a = t.ns("team-a").await;
    let [_a, b] = <[Member; 2]>::try_from(members().await).expect("two members");
    let b_t1 = b.ns(&t, "t1").await;
    b.register(&t.client, &op, &[]).await;
    create_service_account(&t.client, &team_a, "copyrator").await;
    let account = format!("system:serviceaccount:{team_a}:copyrator");
    let copier_as = |role| Binding {
        role_kind: "ClusterRole",
        role,
        account_namespace: &team_a,
        account: "copyrator",
    };
    bind_as(&t.client, &team_a, "copyrator-reads", copier_as("view")).await;
    bind_as(&b.client, &b_t1, "copyrator-writes", copier_as("edit")).await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(b.client.clone())
        .patch(
            &b_t1,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "copyrator.flant.com/accept-from": team_a.as_str()}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("the member's t1 accepts: {}", err_msg(&e)));
    t.create_source(CM, &team_a, "cfg", &[], &[("k", "v1")])
        .await;
    t.create_rule(
        &team_a,
        &rule,
        json!({"spec": {"ruleType": "configmap", "selector": t.selector(),
                        "targets": {"include": [b_t1.as_str()],
                                    "clusters": {"names": [b.name], "local": false}}}}),
    )
    .await;
    let _operator = Operator::start(
        &t,
        &op,
        &[
            "--member-clusters",
            "--all-namespaces",
            "--allow-tenant-clusters",
            "--tenant-identity",
            "service-account",
            "--rule-name",
            &rule,
        ],
    );
    wait_member_copy(&b, &b_t1, "cfg", &[("k", "v1")]).await;

    Api::<kube::api::DynamicObject>::namespaced_with(
        b.client.clone(),
        &b_t1,
        &crate::common::rbac::rbac("RoleBinding", "rolebindings"),
    )
    .delete("copyrator-writes", &Default::default())
    .await
    .unwrap_or_else(|e| panic!("taking the member's RoleBinding back: {}", err_msg(&e)));
    wait_until(
        "the member to see the RoleBinding gone",
        CONVERGE,
        async || {
            let attributes = json!({"group": "", "resource": "configmaps", "verb": "update",
                                "namespace": b_t1});
            match crate::common::rbac::service_account_may(&b.client, &account, &team_a, attributes)
                .await?
            {
                false => Ok(()),
                true => Err("still allowed".to_owned()),
            }
        },
    )
    .await;
    t.set_data(CM, &team_a, "cfg", &[("k", Some("v2"))]).await;
    let refusal = format!("User \"{account}\" cannot update resource \"configmaps\"");
    let refused = t
        .wait_rule(
            &team_a,
            &rule,
            "the member's refusal",
            |r| match cluster_entry(r, &b.name) {
                Some(entry)
                    if entry["reason"] == "SyncFailed"
                        && entry["message"]
                            .as_str()
                            .is_some_and(|m| m.contains(&refusal)) =>
                {
                    Ok(())
                }
                _ => Err(short_status(r)),
            },
        )
        .await;
    println!(
        "member refused: {}",
        cluster_entry(&refused, &b.name).unwrap_or(&Value::Null)
    );
    let kept = member_copy(&b, &b_t1, "cfg").await.expect("the copy stays");
    assert_eq!(
        kept.data.unwrap_or_default().get("k").map(String::as_str),
        Some("v1")
    );
}
