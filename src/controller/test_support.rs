//! Unit tests only: the controller's state over clients that are never
//! asked anything, with sites whose writes go to objects in memory
//! (`cluster::fake_objects`), and the rules, sources and copies the tests
//! put there.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};

use serde_json::{Value, json};

use crate::api::kinds::Kind;
use crate::api::rule::{ConflictPolicy, CopyratorRule, RuleKey};
use crate::cache::index::{NamespaceInfo, Object};
use crate::cluster::context::Cluster;
use crate::cluster::fake_objects::{FakeObjects, config_map};
use crate::cluster::writer::Outcome;
use crate::controller::members::{Member, Reach};
use crate::controller::site::{Site, SiteName};
use crate::controller::state::{Shared, test_shared};
use crate::core::plan::{Action, desired_copy};
use crate::core::resolve::ResolvedRule;
use crate::core::scope::Touch;
use crate::ops::http::Health;
use crate::ops::metrics::ClusterMetrics;
use crate::sync::{lock, write};

/// The controller's state, its home site answered from memory.
pub(crate) fn home() -> (Arc<Shared>, Arc<FakeObjects>) {
    home_with(test_shared())
}

/// [`home`] over `shared`'s state.
pub(crate) fn home_with(shared: Arc<Shared>) -> (Arc<Shared>, Arc<FakeObjects>) {
    let store = Arc::new(FakeObjects::default());
    shared.home.cluster.writer.answer_from(store.clone());
    (shared, store)
}

/// A member `name` of `shared`, reachable and listed, with the namespaces
/// `namespaces`, its writes answered from memory; no watch runs.
pub(crate) fn member(
    shared: &Arc<Shared>,
    name: &str,
    namespaces: &[&str],
) -> (Arc<Member>, Arc<FakeObjects>) {
    let cluster = Cluster::new(
        crate::cluster::fake_objects::never_asked_clients(),
        shared.options.limits,
        ClusterMetrics::new(shared.metrics.clone(), name),
        shared.leader.clone(),
        Arc::new(Health::new(std::time::Duration::from_secs(3600))),
        Arc::new(|_: &RuleKey, _: Touch| {}),
        None,
    );
    let store = Arc::new(FakeObjects::default());
    cluster.writer.answer_from(store.clone());
    let site = Arc::new(Site::new(
        SiteName::Member(name.to_owned()),
        cluster,
        shared.metrics.clone(),
    ));
    add_namespaces(&site, namespaces);
    let synced = &site.cluster.views.synced;
    synced.set_rules_listed();
    synced.set_namespaces_listed();
    for kind in Kind::builtin() {
        synced.set_copies_of(kind, true);
    }
    let member = Arc::new(Member {
        site,
        labels: RwLock::new(BTreeMap::new()),
        fingerprint: 0,
        reach: Mutex::new(Reach::Reachable),
        reports: Mutex::default(),
        metrics: shared.metrics.clone(),
        leaving: AtomicBool::new(false),
        tasks: Mutex::default(),
        plugin: None,
    });
    write(&shared.members.started).insert(name.to_owned(), member.clone());
    (member, store)
}

pub(crate) fn add_namespaces(site: &Site, namespaces: &[&str]) {
    let mut held = write(&site.cluster.views.namespaces);
    for namespace in namespaces {
        held.insert(
            (*namespace).to_owned(),
            NamespaceInfo {
                labels: BTreeMap::new(),
                terminating: false,
                accept_from: Vec::new(),
                adopt_from: Vec::new(),
            },
        );
    }
}

/// The rule `ops/r` of `uid` copying ConfigMaps labelled `copy: yes`, with
/// `spec` as its spec (`metadata` there replaces the rule's).
pub(crate) fn rule(uid: &str, mut spec: Value) -> CopyratorRule {
    let metadata = spec.as_object_mut().and_then(|s| s.remove("metadata"));
    let mut body = json!({
        "metadata": {"name": "r", "namespace": "ops", "uid": uid, "generation": 1,
                     "finalizers": [crate::FINALIZER]},
        "spec": {"ruleType": "configmap", "selector": {"copy": "yes"}},
    });
    if let Some(metadata) = metadata {
        body["metadata"] = metadata;
    }
    if let (Some(held), Value::Object(spec)) = (body["spec"].as_object_mut(), spec) {
        held.extend(spec);
    }
    serde_json::from_value(body).expect("a rule")
}

pub(crate) fn resolved(rule: &CopyratorRule) -> ResolvedRule {
    rule.resolve(&crate::core::resolve::Trust::new("ops", false))
        .expect("a valid rule")
}

/// The source `ops/name` (data `k: v`).
pub(crate) fn source(name: &str) -> Object {
    let object = config_map("ops", name, json!({"copy": "yes"}), json!({"k": "v"}));
    Object::from_dynamic(Kind::ConfigMap, object)
}

/// `rule`'s copy of the source `name` written into `namespace` of `site`,
/// and held in the site's copy view as its watch would hold it.
pub(crate) async fn copy(site: &Site, rule: &ResolvedRule, namespace: &str, name: &str) {
    let action = Action::Create {
        desired: Arc::new(desired_copy(rule, &source(name))),
        namespace: namespace.to_owned(),
    };
    let outcome = site
        .cluster
        .writer
        .execute(
            Kind::ConfigMap,
            &action,
            ConflictPolicy::Skip,
            "ops/r",
            &crate::core::identity::Identity::Operator,
        )
        .await;
    let Outcome::Written(Some(written)) = outcome else {
        panic!("not written: {outcome:?}");
    };
    write(site.cluster.views.copies(Kind::ConfigMap)).upsert(written);
}

/// A label of the object `namespace/name` as stored.
pub(crate) fn label(store: &FakeObjects, namespace: &str, name: &str, key: &str) -> Option<String> {
    let object = store.stored(namespace, name)?;
    object.metadata.labels?.get(key).cloned()
}

/// What `member` reports of the rule `ops/r` now.
pub(crate) fn report_of(member: &Member) -> Option<crate::core::report::ClusterReport> {
    lock(&member.reports).get(&key()).cloned()
}

pub(crate) fn key() -> RuleKey {
    RuleKey {
        namespace: "ops".into(),
        name: "r".into(),
    }
}
