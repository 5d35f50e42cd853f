//! Watches that keep the in-memory views current and put the rules an event
//! concerns on the work queue.
//!
//! Memory stays flat as unrelated objects grow: copies are watched by their
//! label, and each rule's sources (see `sources`) by the rule's own
//! selector, server-side. Namespaces are watched as metadata.
//! kube's watcher resumes from the last resourceVersion after a break and
//! lists again only when the API server says that version is gone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use tokio::task::JoinHandle;

use crate::api::rule::{CopyratorRule, RuleKey};
use crate::cache::index::NamespaceInfo;
use crate::cluster::watch::{Change, Watching, follow, watch_config};
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::identity::Identity;
use crate::core::scope::Touch;
use crate::sync::{lock, read, write};

pub(crate) fn spawn_rule_watch(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let reader = &shared.home.cluster.reader;
        let rules = if shared.trust.all_namespaces {
            reader.everywhere::<CopyratorRule>()
        } else {
            reader.within::<CopyratorRule>(&shared.trust.operator_namespace)
        };
        let mut config = watch_config();
        if let Some(name) = &shared.options.rule_name {
            config = config.fields(&format!("metadata.name={name}"));
        }
        let convert = |rule: CopyratorRule| (rule.key(), Arc::new(rule));
        follow(
            rules,
            config,
            Watching {
                name: "copyratorrules",
                health: &shared.health,
                pause: &shared.home.cluster.read_pause,
                stop_if_unserved: false,
            },
            convert,
            |change| match change {
                Change::Listed(rules) => rules_listed(&shared, rules),
                Change::Applied((key, rule)) => shared.set_rule(key, rule),
                Change::Deleted((key, _)) => shared.forget_rule(&key),
            },
        )
        .await;
    })
}

pub(crate) fn spawn_namespace_watch(shared: Arc<Shared>, site: Arc<Site>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let namespaces = site
            .cluster
            .reader
            .everywhere::<PartialObjectMeta<Namespace>>();
        let convert = |meta: PartialObjectMeta<Namespace>| {
            (meta.name_any(), NamespaceInfo::of(&meta.metadata))
        };
        follow(
            namespaces,
            watch_config(),
            Watching {
                name: "namespaces",
                health: &site.cluster.health,
                pause: &site.cluster.read_pause,
                stop_if_unserved: false,
            },
            convert,
            |change| match change {
                Change::Listed(listed) => namespaces_listed(&shared, &site, listed),
                Change::Applied((name, next)) => namespace_applied(&shared, &site, &name, next),
                Change::Deleted((name, _)) => namespace_deleted(&shared, &site, &name),
            },
        )
        .await;
    })
}

/// Follow RBAC (see [`crate::cluster::access::follow_rbac`]) from the
/// first time a rule asks what its ServiceAccount may do: each change
/// forgets the answers kept at once, and the rules that write as
/// ServiceAccounts are queued ([`rbac_changed`]) at most every
/// [`RBAC_SETTLES`], however many RBAC objects change meanwhile.
pub(crate) fn spawn_rbac_watch(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let cluster = &shared.home.cluster;
        cluster.access.until_wanted().await;
        let changed = tokio::sync::Notify::new();
        let follow = crate::cluster::access::follow_rbac(
            &cluster.reader,
            &cluster.health,
            &cluster.read_pause,
            || {
                cluster.access.forget();
                changed.notify_one();
            },
            || cluster.access.followed(),
        );
        let requeue = async {
            loop {
                changed.notified().await;
                rbac_changed(&shared);
                tokio::time::sleep(RBAC_SETTLES).await;
            }
        };
        tokio::join!(follow, requeue);
    })
}

/// The least time between two requeues for RBAC changes: a burst of them
/// (a namespace made with its RoleBindings, a Helm release of Roles) is
/// one pass of each rule that writes as a ServiceAccount.
const RBAC_SETTLES: std::time::Duration = std::time::Duration::from_millis(500);

/// RBAC changed (the answers kept are forgotten already): every rule that
/// writes as a ServiceAccount looks at everything, in every cluster, its
/// refused writes tried at once (a RoleBinding restored lets them).
fn rbac_changed(shared: &Shared) {
    let acting: HashSet<RuleKey> = read(&shared.resolved)
        .iter()
        .filter(|(_, resolved)| resolved.identity != Identity::Operator)
        .map(|(key, _)| key.clone())
        .collect();
    if acting.is_empty() {
        return;
    }
    let members = shared.members.all();
    let sites = std::iter::once(&shared.home).chain(members.iter().map(|m| &m.site));
    for site in sites {
        lock(&site.backoffs).forget_refusals_of(&acting);
        let there: Vec<RuleKey> = shared
            .rules_for(&site.name)
            .into_iter()
            .filter(|key| acting.contains(key))
            .collect();
        site.queue.add_all(there, Touch::All);
    }
}

/// The rules a (re)list found: those gone are forgotten, the rest taken,
/// and every rule is queued for a pass over everything (events may have
/// been missed while the watch was down).
fn rules_listed(shared: &Shared, rules: Vec<(RuleKey, Arc<CopyratorRule>)>) {
    let listed: HashMap<RuleKey, Arc<CopyratorRule>> = rules.into_iter().collect();
    let gone: Vec<RuleKey> = read(&shared.rules)
        .keys()
        .filter(|k| !listed.contains_key(*k))
        .cloned()
        .collect();
    for key in gone {
        shared.forget_rule(&key);
    }
    for (key, rule) in listed {
        shared.set_rule(key, rule);
    }
    shared.home.cluster.views.synced.set_rules_listed();
    shared
        .home
        .queue
        .add_all(read(&shared.rules).keys().cloned(), Touch::All);
}

/// The namespaces of `site` as a (re)list found them replace its view,
/// and every rule there looks at everything.
fn namespaces_listed(shared: &Shared, site: &Site, listed: Vec<(String, NamespaceInfo)>) {
    *write(&site.cluster.views.namespaces) = listed.into_iter().collect::<BTreeMap<_, _>>();
    site.cluster.views.synced.set_namespaces_listed();
    site.queue.add_all(shared.rules_for(&site.name), Touch::All);
}

/// A namespace came or changed: only a change that matters (labels,
/// phase) concerns the rules, and a write refused there may succeed now.
fn namespace_applied(shared: &Shared, site: &Site, name: &str, next: NamespaceInfo) {
    let previous = write(&site.cluster.views.namespaces).insert(name.to_owned(), next.clone());
    if previous.as_ref() != Some(&next) {
        lock(&site.backoffs).forget_namespace(name);
        shared.namespace_changed(site, name, previous.as_ref(), Some(&next));
    }
}

fn namespace_deleted(shared: &Shared, site: &Site, name: &str) {
    let previous = write(&site.cluster.views.namespaces).remove(name);
    if previous.is_some() {
        shared.namespace_changed(site, name, previous.as_ref(), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::kinds::Kind;
    use crate::controller::test_support::{home, rule};
    use crate::core::backoff::{Failure, FailureClass};
    use crate::core::scope::Scope;
    use serde_json::json;
    use tokio::time::Instant;

    fn named(name: &str, uid: &str) -> (RuleKey, Arc<CopyratorRule>) {
        let rule = rule(
            uid,
            json!({
                "metadata": {"name": name, "namespace": "ops", "uid": uid}
            }),
        );
        (rule.key(), Arc::new(rule))
    }

    fn labelled(key: &str, value: &str) -> NamespaceInfo {
        NamespaceInfo {
            labels: [(key.to_owned(), value.to_owned())].into(),
            ..NamespaceInfo::default()
        }
    }

    /// Every rule queued so far, with what touched it.
    async fn drain(site: &Site) -> BTreeMap<String, Scope> {
        let mut queued = BTreeMap::new();
        while !site.queue.is_empty() {
            let (key, scope) = site.queue.next().await;
            site.queue.done(&key);
            queued.insert(key.to_string(), scope);
        }
        queued
    }

    #[tokio::test]
    async fn a_relist_forgets_the_rules_gone_and_looks_at_everything_of_the_rest() {
        let (shared, _) = home();
        let (a, b) = (named("a", "uid-a"), named("b", "uid-b"));
        rules_listed(&shared, vec![a.clone(), b.clone()]);
        drain(&shared.home).await;
        rules_listed(&shared, vec![b.clone()]);
        let held: Vec<String> = read(&shared.rules)
            .keys()
            .map(ToString::to_string)
            .collect();
        assert_eq!(held, ["ops/b"]);
        let queued = drain(&shared.home).await;
        assert_eq!(queued.keys().collect::<Vec<_>>(), ["ops/b"]);
        assert!(queued["ops/b"].is_everything(), "{:?}", queued["ops/b"]);
    }

    #[tokio::test]
    async fn a_namespace_event_that_changes_nothing_concerns_no_rule() {
        let (shared, _) = home();
        let site = shared.home.clone();
        rules_listed(&shared, vec![named("a", "uid-a")]);
        namespaces_listed(
            &shared,
            &site,
            vec![("team-a".into(), labelled("env", "dev"))],
        );
        assert!(read(&site.cluster.views.namespaces).contains_key("team-a"));
        drain(&site).await;
        namespace_applied(&shared, &site, "team-a", labelled("env", "dev"));
        assert!(drain(&site).await.is_empty(), "the same namespace again");
        namespace_applied(&shared, &site, "team-a", labelled("env", "prod"));
        assert_eq!(drain(&site).await.len(), 1, "a label changed");
        namespace_deleted(&shared, &site, "team-b");
        assert!(drain(&site).await.is_empty(), "a namespace never seen");
        namespace_deleted(&shared, &site, "team-a");
        assert_eq!(drain(&site).await.len(), 1, "a namespace gone");
        assert!(!read(&site.cluster.views.namespaces).contains_key("team-a"));
    }

    /// A change of RBAC concerns the rules that act as ServiceAccounts
    /// alone: each looks at everything, its refused writes tried at once;
    /// a rule of the operator keeps its refusals and is not queued.
    #[tokio::test]
    async fn a_change_of_rbac_lets_the_rules_acting_as_accounts_try_again() {
        let (shared, _) = home();
        let site = shared.home.clone();
        let (acting, acting_rule) = named("acting", "uid-acting");
        let (own, own_rule) = named("own", "uid-own");
        rules_listed(
            &shared,
            vec![
                (acting.clone(), acting_rule.clone()),
                (own.clone(), own_rule.clone()),
            ],
        );
        drain(&site).await;
        for (key, rule) in [(&acting, &acting_rule), (&own, &own_rule)] {
            let mut resolved = crate::controller::test_support::resolved(rule);
            if *key == acting {
                resolved.identity = Identity::ServiceAccount {
                    namespace: "ops".into(),
                    name: "copyrator".into(),
                };
            }
            write(&shared.resolved).insert(key.clone(), Arc::new(resolved));
            let refused = Failure {
                class: FailureClass::Refused,
                message: "forbidden".to_owned(),
                retry_after: None,
            };
            let copy = (Kind::ConfigMap, "team-a".to_owned(), key.name.clone());
            lock(&site.backoffs).failed(&copy, key, 1, refused, Instant::now());
        }
        rbac_changed(&shared);
        let queued = drain(&site).await;
        assert_eq!(queued.keys().collect::<Vec<_>>(), ["ops/acting"]);
        assert!(queued["ops/acting"].is_everything());
        assert!(lock(&site.backoffs).failures(&acting).is_empty());
        assert_eq!(lock(&site.backoffs).failures(&own).len(), 1);
    }

    #[tokio::test]
    async fn a_namespace_that_changed_lets_a_refused_write_there_be_tried_at_once() {
        let (shared, _) = home();
        let site = shared.home.clone();
        let (key, _) = named("a", "uid-a");
        namespaces_listed(
            &shared,
            &site,
            vec![("team-a".into(), labelled("env", "dev"))],
        );
        let refused = Failure {
            class: FailureClass::Refused,
            message: "denied by a policy".to_owned(),
            retry_after: None,
        };
        let copy = (Kind::ConfigMap, "team-a".to_owned(), "settings".to_owned());
        lock(&site.backoffs).failed(&copy, &key, 1, refused, Instant::now());
        namespace_applied(&shared, &site, "team-a", labelled("env", "dev"));
        assert_eq!(
            lock(&site.backoffs).failures(&key).len(),
            1,
            "nothing changed"
        );
        namespace_applied(&shared, &site, "team-a", labelled("policy", "off"));
        assert!(lock(&site.backoffs).failures(&key).is_empty());
    }
}
