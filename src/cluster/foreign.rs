//! The watch of the objects that no copy watch sees: every object of one
//! kind without Copyrator's rule-UID label, metadata only, followed from
//! the moment it starts and never listed or held. A rule that skipped a
//! place because a foreign object holds it learns from this watch when
//! that object goes or changes, so the place is filled at once instead of
//! at the next resync.
//!
//! Nothing is stored, so memory does not grow with the objects of the
//! kind; the watch starts at the current resource version (read by a list
//! of one object), so it never lists them either. When it has to start
//! again from a new version (the first start, or a version the API server
//! no longer has), what happened meanwhile is not known: it says so with
//! [`ForeignEvent::Started`], and the caller looks again at every place it
//! believed held.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use kube::runtime::watcher;

use crate::api::kinds::Kind;
use crate::cache::index::Object;
use crate::cluster::watch::{WATCH_TIMEOUT_SECONDS, Watching, cool_down, wait_out};
use crate::core::backoff::WatchBackoff;

/// What the foreign watch tells its caller.
#[derive(Debug)]
pub(crate) enum ForeignEvent {
    /// The watch starts (again) from the API server's current version:
    /// changes before that are not known.
    Started,
    /// A foreign object was created or changed: its metadata, as an
    /// [`Object`] without payload.
    Applied(Box<Object>),
    /// A foreign object went, or left what the watch selects (it gained
    /// the rule-UID label, so the copy watch sees it now).
    Gone { namespace: String, name: String },
}

/// What the watch selects: objects without the rule-UID label.
fn selector() -> String {
    format!("!{}", crate::LABEL_RULE_UID)
}

/// A watch that stays silent this long past its own timeout is taken for
/// a hung connection and replaced.
const SILENT_FOR: Duration = Duration::from_secs(WATCH_TIMEOUT_SECONDS as u64 + 5);

/// How one watch request ended.
enum WatchEnded {
    /// Its stream ended or went silent: resume from the last version.
    Resume,
    /// The API server no longer has the version: start from the current one.
    VersionGone,
    Failed(watcher::Error),
}

/// Follow the foreign objects of `kind` through `api` (all namespaces)
/// for as long as the caller keeps this future, handing each event to
/// `handle`. Failed requests are retried with [`WatchBackoff`], reported
/// to the health check under `watching.name` and paused with every other
/// watch while the API server throttles reads.
pub(crate) async fn follow_foreign(
    objects: crate::cluster::reader::Objects<DynamicObject>,
    kind: Kind,
    watching: Watching<'_>,
    mut handle: impl FnMut(ForeignEvent),
) {
    let api = objects.api();
    let Watching {
        name,
        health,
        pause,
        ..
    } = watching;
    let _forget_on_stop = health.watch_guard(name);
    let mut backoff = WatchBackoff::default();
    let mut version: Option<String> = None;
    loop {
        wait_out(pause).await;
        let failed = match &mut version {
            None => match current_version(&api).await {
                Ok(current) => {
                    handle(ForeignEvent::Started);
                    version = Some(current);
                    continue;
                }
                Err(e) => e,
            },
            Some(from) => {
                let mut answered = || {
                    health.watch_ok(name);
                    pause.succeeded();
                    backoff = WatchBackoff::default();
                };
                match follow_from(&api, kind, from, &mut answered, &mut handle).await {
                    WatchEnded::Resume => continue,
                    WatchEnded::VersionGone => {
                        version = None;
                        continue;
                    }
                    WatchEnded::Failed(e) => e,
                }
            }
        };
        cool_down(health, pause, name, &failed).await;
        if let Some(delay) = backoff.next() {
            tokio::time::sleep(delay).await;
        }
    }
}

/// The API server's current version for the foreign objects: a list of
/// one object at most, for its version alone.
async fn current_version(api: &Api<DynamicObject>) -> Result<String, watcher::Error> {
    let current = ListParams::default().labels(&selector()).limit(1);
    let list = api
        .list_metadata(&current)
        .await
        .map_err(watcher::Error::InitialListFailed)?;
    list.metadata
        .resource_version
        .ok_or(watcher::Error::NoResourceVersion)
}

/// One watch request from `version`, which follows each event it hands
/// to `handle`; `answered` is told of each event and bookmark (not of a
/// watch that starts and fails at once, so that its backoff grows and
/// the health check sees it failing).
async fn follow_from(
    api: &Api<DynamicObject>,
    kind: Kind,
    version: &mut String,
    answered: &mut impl FnMut(),
    handle: &mut impl FnMut(ForeignEvent),
) -> WatchEnded {
    let params = WatchParams::default()
        .labels(&selector())
        .timeout(WATCH_TIMEOUT_SECONDS);
    let mut stream = match api.watch_metadata(&params, version).await {
        Ok(stream) => stream.boxed(),
        Err(kube::Error::Api(status)) if status.code == 410 => return WatchEnded::VersionGone,
        Err(e) => return WatchEnded::Failed(watcher::Error::WatchStartFailed(e)),
    };
    loop {
        let event = match tokio::time::timeout(SILENT_FOR, stream.try_next()).await {
            // Hung, or ended by the API server (its timeout): resume.
            Err(_) | Ok(Ok(None)) => return WatchEnded::Resume,
            Ok(Err(e)) => return WatchEnded::Failed(watcher::Error::WatchFailed(e)),
            Ok(Ok(Some(event))) => event,
        };
        if !matches!(event, WatchEvent::Error(_)) {
            answered();
        }
        match event {
            WatchEvent::Added(meta) | WatchEvent::Modified(meta) => {
                if let Some(at) = &meta.metadata.resource_version {
                    version.clone_from(at);
                }
                handle(ForeignEvent::Applied(Box::new(metadata_object(kind, meta))));
            }
            WatchEvent::Deleted(meta) => {
                if let Some(at) = &meta.metadata.resource_version {
                    version.clone_from(at);
                }
                handle(ForeignEvent::Gone {
                    namespace: meta.metadata.namespace.unwrap_or_default(),
                    name: meta.metadata.name.unwrap_or_default(),
                });
            }
            WatchEvent::Bookmark(bookmark) => *version = bookmark.metadata.resource_version,
            WatchEvent::Error(status) if status.code == 410 => return WatchEnded::VersionGone,
            WatchEvent::Error(status) => {
                return WatchEnded::Failed(watcher::Error::WatchError(status));
            }
        }
    }
}

/// An object of `kind` as its metadata alone tells it.
fn metadata_object(kind: Kind, meta: kube::api::PartialObjectMeta<DynamicObject>) -> Object {
    let object = DynamicObject {
        types: None,
        metadata: meta.metadata,
        data: serde_json::Value::Null,
    };
    Object::from_dynamic(kind, object).into_compact()
}
