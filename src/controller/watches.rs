//! Watches that keep the in-memory views current and put the rules an event
//! concerns on the work queue.
//!
//! Memory stays flat as unrelated objects grow: copies are watched by their
//! label, and each rule's sources (see `sources`) by the rule's own
//! selector, server-side. Namespaces are watched as metadata.
//! kube's watcher resumes from the last resourceVersion after a break and
//! lists again only when the API server says that version is gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use tokio::task::JoinHandle;

use crate::api::rule::{CopyratorRule, RuleKey};
use crate::cache::index::NamespaceInfo;
use crate::cluster::watch::{Change, Watching, follow, watch_config};
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::scope::Touch;
use crate::sync::{lock, read, write};

pub(crate) fn spawn_rule_watch(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<CopyratorRule> = if shared.trust.all_namespaces {
            Api::all(shared.home.cluster.client.clone())
        } else {
            Api::namespaced(
                shared.home.cluster.client.clone(),
                &shared.trust.operator_namespace,
            )
        };
        let mut config = watch_config();
        if let Some(name) = &shared.options.rule_name {
            config = config.fields(&format!("metadata.name={name}"));
        }
        let convert = |rule: CopyratorRule| (rule.key(), Arc::new(rule));
        follow(
            api,
            config,
            Watching {
                name: "copyratorrules",
                health: &shared.health,
                pause: &shared.home.cluster.read_pause,
                stop_if_unserved: false,
            },
            convert,
            |change| match change {
                Change::Listed(rules) => {
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
                Change::Applied((key, rule)) => shared.set_rule(key, rule),
                Change::Deleted((key, _)) => shared.forget_rule(&key),
            },
        )
        .await;
    })
}

pub(crate) fn spawn_namespace_watch(shared: Arc<Shared>, site: Arc<Site>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(site.cluster.client.clone());
        let convert = |meta: PartialObjectMeta<Namespace>| {
            (meta.name_any(), NamespaceInfo::of(&meta.metadata))
        };
        follow(
            api,
            watch_config(),
            Watching {
                name: "namespaces",
                health: &site.cluster.health,
                pause: &site.cluster.read_pause,
                stop_if_unserved: false,
            },
            convert,
            |change| match change {
                Change::Listed(listed) => {
                    *write(&site.cluster.views.namespaces) =
                        listed.into_iter().collect::<BTreeMap<_, _>>();
                    site.cluster.views.synced.set_namespaces_listed();
                    site.queue.add_all(shared.rules_for(&site.name), Touch::All);
                }
                Change::Applied((name, next)) => {
                    let previous =
                        write(&site.cluster.views.namespaces).insert(name.clone(), next.clone());
                    if previous.as_ref() != Some(&next) {
                        // A refused write into it may succeed now.
                        lock(&site.backoffs).forget_namespace(&name);
                        shared.namespace_changed(&site, &name, previous.as_ref(), Some(&next));
                    }
                }
                Change::Deleted((name, _)) => {
                    let previous = write(&site.cluster.views.namespaces).remove(&name);
                    if previous.is_some() {
                        shared.namespace_changed(&site, &name, previous.as_ref(), None);
                    }
                }
            },
        )
        .await;
    })
}
