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

use std::fmt::Debug;
use std::hash::BuildHasher;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::core::backoff::{ReadPause, WatchBackoff};
use crate::ops::http::Health;
use crate::cache::index::{NamespaceInfo, Object};
use crate::api::kinds::Kind;
use crate::api::rule::{CopyratorRule, RuleKey};
use crate::core::scope::Touch;
use crate::controller::state::{Shared, lock, log_watch_error, read, watch_config, write};

/// What a watch event means for a cache: a complete list replaces it.
pub enum Change<K> {
    Listed(Vec<K>),
    Applied(K),
    Deleted(K),
}

/// Gathers the objects of a list (`Init`, `InitApply`…, `InitDone`) so
/// that a cache is replaced at once, never left half-listed.
pub struct Folder<K> {
    pending: Option<Vec<K>>,
}

impl<K> Default for Folder<K> {
    fn default() -> Self {
        Self { pending: None }
    }
}

impl<K> Folder<K> {
    pub fn fold(&mut self, event: Event<K>) -> Option<Change<K>> {
        match event {
            Event::Init => {
                self.pending = Some(Vec::new());
                None
            }
            Event::InitApply(object) => {
                if let Some(pending) = self.pending.as_mut() {
                    pending.push(object);
                }
                None
            }
            Event::InitDone => Some(Change::Listed(self.pending.take().unwrap_or_default())),
            Event::Apply(object) => Some(Change::Applied(object)),
            Event::Delete(object) => Some(Change::Deleted(object)),
        }
    }
}

pub fn map_event<K, T>(event: Event<K>, convert: impl Fn(K) -> T) -> Event<T> {
    match event {
        Event::Init => Event::Init,
        Event::InitApply(object) => Event::InitApply(convert(object)),
        Event::InitDone => Event::InitDone,
        Event::Apply(object) => Event::Apply(convert(object)),
        Event::Delete(object) => Event::Delete(convert(object)),
    }
}

/// The retry wait a throttled read (429) asks for, if it was one.
fn throttled(error: &watcher::Error) -> Option<Option<std::time::Duration>> {
    let status = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(status) => status.as_ref(),
            _ => return None,
        },
        watcher::Error::WatchError(status) => status.as_ref(),
        watcher::Error::NoResourceVersion => return None,
    };
    (status.code == 429).then(|| {
        status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| std::time::Duration::from_secs(u64::from(s)))
    })
}

/// Whether a failed watch request says the API server does not serve the
/// resource (404: the CustomResourceDefinition of the kind was deleted).
fn unserved(error: &watcher::Error) -> bool {
    let code = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code,
        watcher::Error::WatchError(status) => status.code,
        _ => return false,
    };
    code == 404
}

/// How a followed watch ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Followed {
    /// Its stream ended.
    Ended,
    /// The API server no longer serves the resource.
    Unserved,
}

/// After a failed watch request: report it, and when the API server
/// throttles reads, wait with every other watch (see [`ReadPause`]) on top
/// of this watch's own backoff.
pub async fn cool_down(health: &Health, pause: &ReadPause, name: &str, error: &watcher::Error) {
    log_watch_error(health, name, error);
    if let Some(retry_after) = throttled(error) {
        pause.throttled(Instant::now(), retry_after);
    }
    wait_out(pause).await;
}

/// While reads are paused, wait; each watch then waits a random part of a
/// second more, so that they do not all come back in the same instant.
pub async fn wait_out(pause: &ReadPause) {
    while let Some(until) = pause.until(Instant::now()) {
        let spread = std::collections::hash_map::RandomState::new().hash_one(until) % 1000;
        tokio::time::sleep_until(until + std::time::Duration::from_millis(spread)).await;
    }
}

/// Follow one watch until it ends, handing each change to `handle`.
/// Objects are converted as they come (`convert`), so that a long list is
/// held in its compact form. Failed requests are retried with
/// [`WatchBackoff`] and [`cool_down`]; with `stop_if_unserved`, a request
/// the API server answers 404 (the resource is not served) ends the watch
/// instead, its failure forgotten by the health check.
pub async fn follow<K, T>(
    api: Api<K>,
    config: watcher::Config,
    name: &str,
    shared: &Shared,
    stop_if_unserved: bool,
    convert: impl Fn(K) -> T,
    mut handle: impl FnMut(Change<T>),
) -> Followed
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    // Stopped or aborted (a kind no rule needs): no failing watch.
    let _forget_on_stop = shared.health.watch_guard(name);
    let mut stream = watcher::watcher(api, config)
        .backoff(WatchBackoff::default())
        .boxed();
    let mut folder = Folder::default();
    loop {
        // No request starts while the API server throttles reads.
        wait_out(&shared.read_pause).await;
        match stream.try_next().await {
            Ok(Some(event)) => {
                // `Init` comes before every list attempt, failed ones too.
                if !matches!(event, Event::Init) {
                    shared.health.watch_ok(name);
                    shared.read_pause.succeeded();
                }
                if let Some(change) = folder.fold(map_event(event, &convert)) {
                    handle(change);
                }
            }
            Ok(None) => return Followed::Ended,
            Err(e) if stop_if_unserved && unserved(&e) => {
                tracing::warn!(watch = name, error = %e, "the API server no longer serves this kind; its watch stops");
                return Followed::Unserved;
            }
            Err(e) => cool_down(&shared.health, &shared.read_pause, name, &e).await,
        }
    }
}

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
        let convert = |rule: CopyratorRule| (rule.key(), Arc::new(rule));
        follow(
            api,
            config,
            "copyratorrules",
            &shared,
            false,
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
                    shared.synced.rules.store(true, Ordering::Release);
                    shared
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

pub fn spawn_namespace_watch(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(shared.client.clone());
        let info = |meta: &PartialObjectMeta<Namespace>| NamespaceInfo {
            labels: meta.labels().clone(),
            terminating: meta.metadata.deletion_timestamp.is_some(),
            accept_from: NamespaceInfo::accept_from(
                meta.annotations()
                    .get(crate::ANNOTATION_ACCEPT_FROM)
                    .map(String::as_str),
            ),
        };
        let convert = |meta: PartialObjectMeta<Namespace>| (meta.name_any(), info(&meta));
        follow(
            api,
            watch_config(),
            "namespaces",
            &shared,
            false,
            convert,
            |change| match change {
                Change::Listed(listed) => {
                    *write(&shared.namespaces) = listed.into_iter().collect::<BTreeMap<_, _>>();
                    shared.synced.namespaces.store(true, Ordering::Release);
                    shared
                        .queue
                        .add_all(read(&shared.rules).keys().cloned(), Touch::All);
                }
                Change::Applied((name, next)) => {
                    let previous = write(&shared.namespaces).insert(name.clone(), next.clone());
                    if previous.as_ref() != Some(&next) {
                        // A refused write into it may succeed now.
                        lock(&shared.backoffs).forget_namespace(&name);
                        shared.namespace_changed(&name, previous.as_ref(), Some(&next));
                    }
                }
                Change::Deleted((name, _)) => {
                    let previous = write(&shared.namespaces).remove(&name);
                    if previous.is_some() {
                        shared.namespace_changed(&name, previous.as_ref(), None);
                    }
                }
            },
        )
        .await;
    })
}

pub fn spawn_copy_watch(shared: Arc<Shared>, kind: Kind) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<DynamicObject> = Api::all_with(shared.client.clone(), &kind.api_resource());
        let config = watch_config().labels(crate::LABEL_RULE_UID);
        let index = shared.copies(kind);
        let convert = |object| Arc::new(Object::from_dynamic(kind, object).into_compact());
        let followed = follow(
            api,
            config,
            kind.info().plural,
            &shared,
            kind.info().generic,
            convert,
            |change| {
                // The rules a change concerns, and what of theirs it touched.
                let (touched, touch): (Vec<String>, Touch) = match change {
                    Change::Listed(listed) => {
                        let touched = write(index).replace_all(listed);
                        shared.synced.set_copies_of(kind, true);
                        if kind.info().generic {
                            // Its rules waited for this list, copies or not.
                            for key in crate::controller::kinds::rules_naming(&shared, kind) {
                                shared.queue.add(key, Touch::All);
                            }
                            // Copies of rules gone while no operator ran.
                            let shared = shared.clone();
                            tokio::spawn(async move {
                                crate::controller::finalizer::collect_orphans(&shared, "kind listed").await;
                                crate::controller::kinds::release_unused(&shared);
                            });
                        }
                        (touched.into_iter().collect(), Touch::All)
                    }
                    Change::Applied(object) => {
                        let touch =
                            Touch::Copy(object.namespace.to_string(), object.name.to_string());
                        (write(index).upsert(object), touch)
                    }
                    Change::Deleted(object) => {
                        let namespace = object.namespace.clone();
                        let name = object.name.clone();
                        let removed = write(index).deleted(&namespace, &name, &object.uid);
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
                                &(kind, namespace.to_string(), name.to_string()),
                                &rule,
                                written_for,
                                Instant::now(),
                            );
                        }
                        // Not in the cache yet (the answer to our own create
                        // is still on its way): its rule must still hear of it.
                        let owner = removed
                            .as_ref()
                            .unwrap_or(&object)
                            .rule_uid()
                            .map(str::to_owned)
                            .into_iter()
                            .collect();
                        (owner, Touch::Copy(namespace.to_string(), name.to_string()))
                    }
                };
                for uid in touched {
                    if let Some(key) = shared.rule_by_uid(&uid) {
                        shared.queue.add(key, touch.clone());
                    }
                }
                if let Touch::Copy(namespace, name) = &touch {
                    shared.copy_place_changed(namespace, name);
                }
            },
        )
        .await;
        if followed == Followed::Unserved {
            crate::controller::kinds::kind_unserved(&shared, kind);
        }
    })
}
