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
use std::sync::atomic::Ordering;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backoff::WatchBackoff;
use crate::index::{NamespaceInfo, Object};
use crate::kinds::Kind;
use crate::rule::{CopyratorRule, RuleKey};
use crate::state::{Shared, lock, log_watch_error, read, watch_config, write};

pub fn spawn_rule_watch(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let settings = &shared.settings;
        let api: Api<CopyratorRule> = if settings.all_namespaces {
            Api::all(shared.client.clone())
        } else {
            Api::namespaced(shared.client.clone(), &settings.namespace)
        };
        let mut config = watch_config();
        if let Some(name) = &settings.rule_name {
            config = config.fields(&format!("metadata.name={name}"));
        }
        let mut pending: Option<HashMap<RuleKey, Arc<CopyratorRule>>> = None;
        let mut stream = watcher::watcher(api, config)
            .backoff(WatchBackoff::default())
            .boxed();
        loop {
            let event = match stream.try_next().await {
                Ok(Some(event)) => {
                    // `Init` comes before every list attempt, failed ones too.
                    if !matches!(event, Event::Init) {
                        shared.health.watch_ok("copyratorrules");
                    }
                    event
                }
                Ok(None) => return,
                Err(e) => {
                    log_watch_error(&shared.health, "copyratorrules", &e);
                    continue;
                }
            };
            match event {
                Event::Init => pending = Some(HashMap::new()),
                Event::InitApply(rule) => {
                    if let Some(pending) = pending.as_mut() {
                        pending.insert(rule.key(), Arc::new(rule));
                    }
                }
                Event::InitDone => {
                    let listed = pending.take().unwrap_or_default();
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
                    shared.synced.rules.store(true, Ordering::Release);
                    shared.queue.add_all(read(&shared.rules).keys().cloned());
                }
                Event::Apply(rule) => {
                    shared.set_rule(rule.key(), Arc::new(rule));
                }
                Event::Delete(rule) => shared.forget_rule(&rule.key()),
            }
        }
    })
}

pub fn spawn_namespace_watch(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(shared.client.clone());
        let mut pending: Option<BTreeMap<String, NamespaceInfo>> = None;
        let mut stream = watcher::watcher(api, watch_config())
            .backoff(WatchBackoff::default())
            .boxed();
        loop {
            let event = match stream.try_next().await {
                Ok(Some(event)) => {
                    if !matches!(event, Event::Init) {
                        shared.health.watch_ok("namespaces");
                    }
                    event
                }
                Ok(None) => return,
                Err(e) => {
                    log_watch_error(&shared.health, "namespaces", &e);
                    continue;
                }
            };
            let info = |meta: &PartialObjectMeta<Namespace>| NamespaceInfo {
                labels: meta.labels().clone(),
                terminating: meta.metadata.deletion_timestamp.is_some(),
                accept_from: NamespaceInfo::accept_from(
                    meta.annotations()
                        .get(crate::ANNOTATION_ACCEPT_FROM)
                        .map(String::as_str),
                ),
            };
            let changed = match event {
                Event::Init => {
                    pending = Some(BTreeMap::new());
                    false
                }
                Event::InitApply(meta) => {
                    if let Some(pending) = pending.as_mut() {
                        pending.insert(meta.name_any(), info(&meta));
                    }
                    false
                }
                Event::InitDone => {
                    let listed = pending.take().unwrap_or_default();
                    *write(&shared.namespaces) = listed;
                    shared.synced.namespaces.store(true, Ordering::Release);
                    true
                }
                Event::Apply(meta) => {
                    let next = info(&meta);
                    let name = meta.name_any();
                    let previous = write(&shared.namespaces).insert(name.clone(), next.clone());
                    let changed = previous.as_ref() != Some(&next);
                    if changed {
                        // A refused write into it may succeed now.
                        lock(&shared.backoffs).forget_namespace(&name);
                    }
                    changed
                }
                Event::Delete(meta) => write(&shared.namespaces).remove(&meta.name_any()).is_some(),
            };
            if changed {
                // Which rules target a namespace is decided by each rule's
                // plan; enqueueing all is cheap because reconciles coalesce.
                shared.queue.add_all(read(&shared.rules).keys().cloned());
            }
        }
    })
}

pub fn spawn_copy_watch(shared: Arc<Shared>, kind: Kind) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<DynamicObject> = Api::all_with(shared.client.clone(), &kind.api_resource());
        let config = watch_config().labels(crate::LABEL_RULE_UID);
        let mut pending: Option<Vec<Arc<Object>>> = None;
        let mut stream = watcher::watcher(api, config)
            .backoff(WatchBackoff::default())
            .boxed();
        let index = shared.copies(kind);
        loop {
            let event = match stream.try_next().await {
                Ok(Some(event)) => {
                    if !matches!(event, Event::Init) {
                        shared.health.watch_ok(kind.info().plural);
                    }
                    event
                }
                Ok(None) => return,
                Err(e) => {
                    log_watch_error(&shared.health, kind.info().plural, &e);
                    continue;
                }
            };
            let touched: Vec<String> = match event {
                Event::Init => {
                    pending = Some(Vec::new());
                    Vec::new()
                }
                Event::InitApply(object) => {
                    if let Some(pending) = pending.as_mut() {
                        pending.push(Arc::new(Object::from_dynamic(kind, object).into_compact()));
                    }
                    Vec::new()
                }
                Event::InitDone => {
                    let listed = pending.take().unwrap_or_default();
                    let touched = write(index).replace_all(listed);
                    shared.synced.copies[kind as usize].store(true, Ordering::Release);
                    touched.into_iter().collect()
                }
                Event::Apply(object) => {
                    write(index).upsert(Arc::new(Object::from_dynamic(kind, object).into_compact()))
                }
                Event::Delete(object) => {
                    let namespace = object.namespace().unwrap_or_default();
                    let name = object.name_any();
                    let removed = write(index).take(
                        &namespace,
                        &name,
                        object.uid().as_deref().unwrap_or_default(),
                    );
                    // Our own deletes left the cache already: this one was
                    // someone else's. A copy we wrote that keeps being deleted
                    // is contested like one that keeps being changed back.
                    if let Some(removed) = &removed
                        && let (Some(written_for), Some(rule)) = (
                            removed.written_for,
                            removed.rule_uid().and_then(|uid| shared.rule_by_uid(uid)),
                        )
                    {
                        lock(&shared.backoffs).deleted_by_others(
                            &(kind, namespace, name),
                            &rule,
                            written_for,
                            Instant::now(),
                        );
                    }
                    removed
                        .and_then(|o| o.rule_uid().map(str::to_owned))
                        .into_iter()
                        .collect()
                }
            };
            for uid in touched {
                if let Some(key) = shared.rule_by_uid(&uid) {
                    shared.queue.add(key);
                }
            }
        }
    })
}
