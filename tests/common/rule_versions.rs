//! Every version of one rule, as a watch delivers them: for checks that a
//! status never said something, or what it said first, which polling could
//! miss between two reads.
//!
//! ```ignore
//! let versions = RuleVersions::start(&t, &op, "r").await;
//! t.create_rule(&op, "r", body).await;
//! // ... the operator works ...
//! for rule in versions.seen()? { /* every version since start */ }
//! ```

use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use serde_json::Value;
use tokio::task::JoinHandle;

use super::{TestNs, err_msg};

/// The versions of one rule seen since [`RuleVersions::start`], collected
/// in the background until dropped.
pub struct RuleVersions {
    seen: Arc<Mutex<Result<Vec<Value>, String>>>,
    task: JoinHandle<()>,
}

impl RuleVersions {
    /// Starts watching the rule `ns/name`, which may not exist yet; its
    /// current version, if any, is the first one seen.
    pub async fn start(t: &TestNs, ns: &str, name: &str) -> RuleVersions {
        let api: Api<DynamicObject> = t.rules(ns);
        let by_name = format!("metadata.name={name}");
        let listed = api
            .list(&ListParams::default().fields(&by_name))
            .await
            .unwrap_or_else(|e| panic!("listing rule {ns}/{name}: {}", err_msg(&e)));
        let mut version = listed
            .metadata
            .resource_version
            .expect("a list has a resourceVersion");
        let current: Vec<Value> = listed
            .items
            .into_iter()
            .map(|rule| serde_json::to_value(rule).unwrap())
            .collect();
        let seen = Arc::new(Mutex::new(Ok(current)));
        let record = seen.clone();
        let what = format!("rule {ns}/{name}");
        let task = tokio::spawn(async move {
            // A watch ends on the server after its timeout; the next one
            // goes on from the last version seen, so none is missed.
            loop {
                let params = WatchParams::default().fields(&by_name).timeout(60);
                let events = match api.watch(&params, &version).await {
                    Ok(events) => events,
                    Err(e) => {
                        *record.lock().unwrap() = Err(format!("watching {what}: {}", err_msg(&e)));
                        return;
                    }
                };
                let mut events = events.boxed();
                loop {
                    match events.try_next().await {
                        Ok(Some(WatchEvent::Added(rule) | WatchEvent::Modified(rule))) => {
                            version = rule.metadata.resource_version.clone().unwrap_or_default();
                            if let Ok(seen) = record.lock().unwrap().as_mut() {
                                seen.push(serde_json::to_value(rule).unwrap());
                            }
                        }
                        Ok(Some(WatchEvent::Bookmark(mark))) => {
                            version = mark.metadata.resource_version;
                        }
                        Ok(Some(WatchEvent::Deleted(_))) => {}
                        Ok(Some(WatchEvent::Error(e))) => {
                            *record.lock().unwrap() =
                                Err(format!("watching {what}: {} {}", e.code, e.message));
                            return;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            *record.lock().unwrap() =
                                Err(format!("watching {what}: {}", err_msg(&e)));
                            return;
                        }
                    }
                }
            }
        });
        RuleVersions { seen, task }
    }

    /// Every version seen so far, in order; `Err` when the watch broke (and
    /// versions may have been missed).
    pub fn seen(&self) -> Result<Vec<Value>, String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for RuleVersions {
    fn drop(&mut self) {
        self.task.abort();
    }
}
