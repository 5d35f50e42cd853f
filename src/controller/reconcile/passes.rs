//! Whole passes of `reconcile` through the writer's seam: their requests
//! answered from memory, and checked in the order they were sent.

use super::*;
use crate::api::kinds::Kind;
use crate::cluster::fake_objects::{FakeObjects, api_error, config_map};
use crate::controller::member_pass::member_pass;
use crate::controller::state::test_shared_gated;
use crate::controller::test_support::{
    add_namespaces, copy, home, home_with, key, member, resolved, rule, source,
};
use crate::core::resolve::Trust;
use serde_json::{Value, json};

/// The rule `ops/r` of `spec` in the view, copying the source `ops/ca`
/// into the namespaces t1 and t2 of the home cluster, its sources listed.
fn stage(shared: &Arc<Shared>, spec: Value) -> CopyratorRule {
    let rule = rule("rule-1", spec);
    add_namespaces(&shared.home, &["ops", "t1", "t2"]);
    let synced = &shared.home.cluster.views.synced;
    synced.set_rules_listed();
    synced.set_namespaces_listed();
    synced.set_copies_of(Kind::ConfigMap, true);
    shared.set_rule(key(), Arc::new(rule.clone()));
    let resolved = resolved(&rule);
    let mut hub = lock(&shared.home.cluster.sources);
    hub.set(&resolved);
    hub.listed_for_tests(&resolved.key, &[source("ca")]);
    rule
}

fn targets() -> Value {
    json!({"targets": {"include": ["t*"]}})
}

/// A rule that has no finalizer yet.
fn without_finalizer(mut spec: Value) -> Value {
    spec["metadata"] = json!({"name": "r", "namespace": "ops", "uid": "rule-1", "generation": 1});
    spec
}

/// A rule being deleted, its finalizer still on.
fn deleted(mut spec: Value) -> Value {
    spec["metadata"] = json!({"name": "r", "namespace": "ops", "uid": "rule-1", "generation": 1,
        "finalizers": [crate::FINALIZER], "deletionTimestamp": "2026-01-01T00:00:00Z"});
    spec
}

async fn pass(shared: &Arc<Shared>) -> Option<Duration> {
    reconcile(shared, &key(), Scope::everything())
        .await
        .expect("a pass")
}

/// The requests sent, as `verb namespace/name`.
fn sent(store: &FakeObjects) -> Vec<String> {
    store
        .requests()
        .into_iter()
        .map(|(verb, namespace, name)| format!("{verb} {namespace}/{name}"))
        .collect()
}

fn status_of(shared: &Shared) -> RuleStatus {
    read(&shared.rules)
        .get(&key())
        .and_then(|r| r.status.clone())
        .expect("a status written")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finalizer_goes_on_before_the_first_copy_is_written() {
    let (shared, store) = home();
    stage(&shared, without_finalizer(targets()));
    pass(&shared).await;
    let sent = sent(&store);
    assert_eq!(
        sent.first().map(String::as_str),
        Some("finalizers ops/r"),
        "{sent:?}"
    );
    let mut creates: Vec<&str> = sent
        .iter()
        .filter(|s| s.starts_with("create "))
        .map(String::as_str)
        .collect();
    creates.sort_unstable();
    assert_eq!(creates, ["create t1/ca", "create t2/ca"]);
    assert_eq!(sent.last().map(String::as_str), Some("status ops/r"));
    assert_eq!(status_of(&shared).copies, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_finalizer_writes_no_copy() {
    let (shared, store) = home();
    stage(&shared, without_finalizer(targets()));
    store.fail_next(
        "finalizers",
        "ops",
        api_error(403, "copyratorrules is forbidden", "Forbidden"),
    );
    let failed = reconcile(&shared, &key(), Scope::everything()).await;
    assert!(matches!(failed, Err(Error::Finalizer { .. })), "{failed:?}");
    assert_eq!(sent(&store), ["finalizers ops/r"]);
    assert!(store.stored("t1", "ca").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_sends_nothing_at_all() {
    let (shared, lead) = test_shared_gated(Trust::new("ops", false));
    let (shared, store) = home_with(shared);
    let staged = stage(&shared, without_finalizer(targets()));
    copy(&shared.home, &resolved(&staged), "t1", "ca").await;
    let before = sent(&store);
    lead.send_replace(false);
    pass(&shared).await;
    assert_eq!(sent(&store), before, "no finalizer, copy or status sent");
    assert!(store.stored("t2", "ca").is_none());
    // Nor for a rule being deleted: its copy and finalizer stay.
    shared.set_rule(key(), Arc::new(rule("rule-1", deleted(targets()))));
    pass(&shared).await;
    assert_eq!(sent(&store), before, "nothing sent");
    assert!(store.stored("t1", "ca").is_some());
    // Leading again, the same pass writes.
    lead.send_replace(true);
    pass(&shared).await;
    assert!(store.stored("t1", "ca").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_rules_copies_go_before_its_finalizer() {
    let (shared, store) = home();
    let staged = stage(&shared, targets());
    for namespace in ["t1", "t2"] {
        copy(&shared.home, &resolved(&staged), namespace, "ca").await;
    }
    let before = sent(&store).len();
    shared.set_rule(key(), Arc::new(rule("rule-1", deleted(targets()))));
    pass(&shared).await;
    let sent = sent(&store).split_off(before);
    let finalizer = sent.iter().position(|s| s == "finalizers ops/r");
    let deletes: Vec<usize> = sent
        .iter()
        .enumerate()
        .filter(|(_, s)| s.starts_with("delete t"))
        .map(|(at, _)| at)
        .collect();
    assert_eq!(deletes.len(), 2, "{sent:?}");
    assert!(
        finalizer.is_some_and(|f| deletes.iter().all(|d| *d < f)),
        "{sent:?}"
    );
    assert!(store.stored("t1", "ca").is_none() && store.stored("t2", "ca").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_rule_whose_copy_could_not_go_keeps_its_finalizer() {
    let (shared, store) = home();
    let staged = stage(&shared, targets());
    for namespace in ["t1", "t2"] {
        copy(&shared.home, &resolved(&staged), namespace, "ca").await;
    }
    shared.set_rule(key(), Arc::new(rule("rule-1", deleted(targets()))));
    store.fail_next(
        "delete",
        "t2",
        api_error(403, "configmaps are frozen in t2", "Forbidden"),
    );
    let failed = reconcile(&shared, &key(), Scope::everything()).await;
    assert!(
        matches!(&failed, Err(Error::Cleanup { count: 1, first, .. }) if first.contains("frozen in t2")),
        "{failed:?}"
    );
    assert!(!sent(&store).iter().any(|s| s == "finalizers ops/r"));
    assert!(store.stored("t2", "ca").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_conflict_reaches_the_rules_status() {
    let (shared, _home_store) = home();
    let (a, member_store) = member(&shared, "a", &["t1", "t2"]);
    // Another tool's ConfigMap holds the copy's name in a's t1.
    member_store.put(
        "t1",
        "someone",
        config_map("t1", "ca", json!({}), json!({"k": "theirs"})),
    );
    let spec =
        json!({"targets": {"include": ["t*"], "clusters": {"names": ["a"], "local": false}}});
    stage(&shared, spec);
    member_pass(&shared, &a, &key(), Scope::everything())
        .await
        .expect("a member pass");
    assert!(member_store.stored("t2", "ca").is_some(), "t2 copied");
    pass(&shared).await;
    let status = status_of(&shared);
    let clusters = status.clusters.expect("the members' statuses");
    let of_a = clusters.iter().find(|c| c.name == "a").expect("a's status");
    assert_eq!((of_a.conflicts, of_a.copies), (1, 1), "{of_a:?}");
    assert_eq!(of_a.reason.as_deref(), Some("SyncedWithConflicts"));
}
