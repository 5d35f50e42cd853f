//! The watches of each rule's sources: one per source namespace, filtered
//! by the rule's selector on the server, so memory follows what rules
//! select and not everything in the cluster.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::backoff::WatchBackoff;
use crate::http::Health;
use crate::index::{Object, ObjectKey};
use crate::rule::ResolvedRule;
use crate::state::{log_watch_error, read, watch_config, write};

/// Called when a rule's sources changed.
pub type OnChange = Arc<dyn Fn() + Send + Sync>;

/// The watches of one rule's sources: one per source namespace, filtered by
/// the rule's selector on the server.
pub struct SourceWatch {
    /// Restart when this changes: kind, selector and namespaces.
    pub fingerprint: String,
    pub objects: Arc<RwLock<HashMap<ObjectKey, Arc<Object>>>>,
    synced: Vec<Arc<AtomicBool>>,
    tasks: Vec<JoinHandle<()>>,
    /// The watches' names in the health report.
    names: Vec<String>,
    health: Arc<Health>,
}

impl SourceWatch {
    pub fn fingerprint_of(rule: &ResolvedRule) -> String {
        format!(
            "{}|{}|{}",
            rule.kind,
            rule.selector.to_query(),
            rule.source_namespaces.join(",")
        )
    }

    pub fn is_synced(&self) -> bool {
        self.synced.iter().all(|s| s.load(Ordering::Acquire))
    }

    pub fn snapshot(&self) -> Vec<Arc<Object>> {
        read(&self.objects).values().cloned().collect()
    }

    pub fn start(
        client: &Client,
        health: &Arc<Health>,
        rule: &ResolvedRule,
        on_change: OnChange,
    ) -> Self {
        let objects = Arc::new(RwLock::new(HashMap::new()));
        let mut synced = Vec::new();
        let mut tasks = Vec::new();
        let mut names = Vec::new();
        let selector = format!("{},!{}", rule.selector.to_query(), crate::LABEL_RULE_UID);
        for namespace in &rule.source_namespaces {
            let flag = Arc::new(AtomicBool::new(false));
            synced.push(flag.clone());
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &rule.kind.api_resource());
            let mut config = watch_config().labels(&selector);
            if let Some(fields) = rule.kind.source_field_selector() {
                config = config.fields(&fields);
            }
            let kind = rule.kind;
            let key = rule.key.clone();
            let objects = objects.clone();
            let on_change = on_change.clone();
            let health = health.clone();
            let watch_name = format!("sources of {} in {namespace}", rule.key);
            names.push(watch_name.clone());
            let namespace = namespace.clone();
            tasks.push(tokio::spawn(async move {
                let mut pending: Option<HashMap<ObjectKey, Arc<Object>>> = None;
                let mut stream = watcher::watcher(api, config)
                    .backoff(WatchBackoff::default())
                    .boxed();
                loop {
                    let event = match stream.try_next().await {
                        Ok(Some(event)) => {
                            if !matches!(event, Event::Init) {
                                health.watch_ok(&watch_name);
                            }
                            event
                        }
                        Ok(None) => return,
                        Err(e) => {
                            log_watch_error(&health, &watch_name, &e);
                            continue;
                        }
                    };
                    let changed = match event {
                        Event::Init => {
                            pending = Some(HashMap::new());
                            false
                        }
                        Event::InitApply(object) => {
                            let object = Object::from_dynamic(kind, object);
                            if let Some(pending) = pending.as_mut() {
                                pending.insert(object.key(), Arc::new(object));
                            }
                            false
                        }
                        Event::InitDone => {
                            let listed = pending.take().unwrap_or_default();
                            let mut map = write(&objects);
                            map.retain(|(ns, _), _| *ns != namespace);
                            map.extend(listed);
                            drop(map);
                            flag.store(true, Ordering::Release);
                            debug!(rule = %key, namespace = namespace.as_str(), "sources listed");
                            true
                        }
                        Event::Apply(object) => {
                            let object = Arc::new(Object::from_dynamic(kind, object));
                            let previous = write(&objects).insert(object.key(), object.clone());
                            previous.as_deref() != Some(&*object)
                        }
                        Event::Delete(object) => {
                            let key = (object.namespace().unwrap_or_default(), object.name_any());
                            let mut map = write(&objects);
                            // A newer object of the same name stays.
                            let same = map
                                .get(&key)
                                .is_some_and(|o| Some(o.uid.as_str()) == object.uid().as_deref());
                            same && map.remove(&key).is_some()
                        }
                    };
                    if changed {
                        on_change();
                    }
                }
            }));
        }
        Self {
            fingerprint: Self::fingerprint_of(rule),
            objects,
            synced,
            tasks,
            names,
            health: health.clone(),
        }
    }
}

impl Drop for SourceWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        // A watch that is gone is no failing watch.
        for name in &self.names {
            self.health.watch_ok(name);
        }
    }
}
