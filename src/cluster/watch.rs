//! Following one watch of the API server: the watcher's events folded
//! into changes of a cache, its failures retried with backoff (and every
//! watch paused while the API server throttles reads), and an unserved
//! resource told apart from a failure.
//!
//! kube's watcher resumes from the last resourceVersion after a break and
//! lists again only when the API server says that version is gone.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use kube::Resource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::warn;

use crate::cluster::reader::Objects;
use crate::core::backoff::{ReadPause, WatchBackoff};
use crate::ops::http::Health;

/// Seconds after which the API server ends a watch (it is then resumed
/// from its last version); the watcher also gives up on a watch that has
/// been silent a few seconds longer, so a hung connection is replaced.
pub(crate) const WATCH_TIMEOUT_SECONDS: u32 = 15;

pub(crate) fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS)
}

pub(crate) fn log_watch_error(health: &Health, what: &str, error: &watcher::Error) {
    health.watch_failed(what);
    // Secret payloads are never part of a watch error; only the request is.
    warn!(watch = what, error = %error, "watch failed; retrying with backoff");
}

/// What a watch event means for a cache: a complete list replaces it.
pub(crate) enum Change<K> {
    Listed(Vec<K>),
    Applied(K),
    Deleted(K),
}

/// Gathers the objects of a list (`Init`, `InitApply`…, `InitDone`) so
/// that a cache is replaced at once, never left half-listed.
pub(crate) struct Folder<K> {
    pending: Option<Vec<K>>,
}

impl<K> Default for Folder<K> {
    fn default() -> Self {
        Self { pending: None }
    }
}

impl<K> Folder<K> {
    /// The objects of the list under way, so far.
    pub(crate) fn pending_mut(&mut self) -> impl Iterator<Item = &mut K> {
        self.pending.iter_mut().flatten()
    }

    pub(crate) fn fold(&mut self, event: Event<K>) -> Option<Change<K>> {
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

pub(crate) fn map_event<K, T>(event: Event<K>, convert: impl Fn(K) -> T) -> Event<T> {
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

/// Whether a failed watch request got no answer from the API server (a
/// connection refused, reset or timed out), or had its credentials
/// refused (401): the server itself may be gone, or shut to us. A 403 or
/// 404 for one resource says nothing about the server as a whole.
fn unanswered(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(status) => status.code == 401,
            _ => true,
        },
        watcher::Error::WatchError(status) => status.code == 401,
        watcher::Error::NoResourceVersion => false,
    }
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
pub(crate) enum WatchEnd {
    /// Its stream ended.
    Ended,
    /// The API server no longer serves the resource.
    Unserved,
}

/// After a failed watch request: report it, and when the API server
/// throttles reads, wait with every other watch (see [`ReadPause`]) on top
/// of this watch's own backoff.
pub(crate) async fn cool_down(
    health: &Health,
    pause: &ReadPause,
    name: &str,
    error: &watcher::Error,
) {
    log_watch_error(health, name, error);
    pause_after_failure(pause, error).await;
}

/// After a failed watch request: when the API server did not answer or
/// throttles reads, every watch waits (see [`ReadPause`]).
pub(crate) async fn pause_after_failure(pause: &ReadPause, error: &watcher::Error) {
    if unanswered(error) {
        pause.read_failed();
    }
    if let Some(retry_after) = throttled(error) {
        pause.throttled(Instant::now(), retry_after);
    }
    wait_out(pause).await;
}

/// While reads are paused, wait; each watch then waits a random part of a
/// second more, so that they do not all come back in the same instant.
pub(crate) async fn wait_out(pause: &ReadPause) {
    while let Some(until) = pause.until(Instant::now()) {
        let spread =
            std::time::Duration::from_secs(1).mul_f64(crate::core::jitter::fraction(&until));
        tokio::time::sleep_until(until + spread).await;
    }
}

/// One watch as [`follow`] runs it: its name (for the health check and
/// the log), what it reports to, and whether a resource the API server
/// stops serving ends it.
pub(crate) struct Watching<'a> {
    pub(crate) name: &'a str,
    pub(crate) health: &'a Arc<Health>,
    /// Shared by every watch of the API server: a throttled read pauses them all.
    pub(crate) pause: &'a ReadPause,
    pub(crate) stop_if_unserved: bool,
}

/// Follow one watch until it ends, handing each change to `handle`.
/// Objects are converted as they come (`convert`), so that a long list is
/// held in its compact form. Failed requests are retried with
/// [`WatchBackoff`] and [`cool_down`], and a refusal that lasts besides
/// with [`FailureRun`]'s backoff (to a minute); with `stop_if_unserved`, a request
/// the API server answers 404 (the resource is not served) ends the watch
/// instead, its failure forgotten by the health check.
pub(crate) async fn follow<K, T>(
    objects: Objects<K>,
    config: watcher::Config,
    watching: Watching<'_>,
    convert: impl Fn(K) -> T,
    mut handle: impl FnMut(Change<T>),
) -> WatchEnd
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let Watching {
        name,
        health,
        pause,
        stop_if_unserved,
    } = watching;
    // Stopped or aborted (a kind no rule needs): no failing watch.
    let _forget_on_stop = health.watch_guard(name);
    let mut stream = watcher::watcher(objects.api(), config)
        .backoff(WatchBackoff::default())
        .boxed();
    let mut folder = Folder::default();
    let mut failures = FailureRun::default();
    loop {
        // No request starts while the API server throttles reads.
        wait_out(pause).await;
        match stream.try_next().await {
            Ok(Some(event)) => {
                // `Init` comes before every list attempt, failed ones too
                // (and resets kube's backoff: a refusal that lasts is
                // slowed by `failures`).
                if !matches!(event, Event::Init) {
                    health.watch_ok(name);
                    pause.succeeded();
                    failures = FailureRun::default();
                }
                if let Some(change) = folder.fold(map_event(event, &convert)) {
                    handle(change);
                }
            }
            Ok(None) => return WatchEnd::Ended,
            Err(e) if stop_if_unserved && unserved(&e) => {
                // The caller says what it means (a kind gone, or an
                // optional resource never installed).
                tracing::debug!(watch = name, error = %e, "not served; the watch stops");
                return WatchEnd::Unserved;
            }
            Err(e) => {
                let backoff = failures.record(lasts(&e));
                cool_down(health, pause, name, &e).await;
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// A watch's failures since it last worked.
#[derive(Debug, Default)]
pub(crate) struct FailureRun {
    pub(crate) in_a_row: u32,
    /// The failures that last ([`lasts`]) since the last that did not:
    /// only they double the watch's own backoff, so that a refusal met as
    /// an API server comes back after a long outage waits a second, not a
    /// minute.
    lasting_in_a_row: u32,
}

impl FailureRun {
    /// Count a failure; the watch's own backoff after it (none for one
    /// that does not last: the shared read pause covers those).
    pub(crate) fn record(&mut self, lasting: bool) -> std::time::Duration {
        self.in_a_row = self.in_a_row.saturating_add(1);
        if !lasting {
            self.lasting_in_a_row = 0;
            return std::time::Duration::ZERO;
        }
        self.lasting_in_a_row = self.lasting_in_a_row.saturating_add(1);
        LASTING_BACKOFF_FIRST
            .saturating_mul(1u32 << self.lasting_in_a_row.saturating_sub(1).min(8))
            .min(LASTING_BACKOFF_MAX)
    }
}

/// Whether a watch's failure is its own and will last: the API
/// server refused the request (a 4xx but a throttle or an expired
/// version), or it could not even be made. Those back off to a minute. A
/// server that does not answer, throttles or fails (5xx) is every watch's
/// matter: they wait together (the read pause) and come back as soon as
/// it does.
pub(crate) fn lasts(error: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error as Failed;
    let refused = |code: u16| (400..500).contains(&code) && code != 410 && code != 429;
    match error {
        Failed::InitialListFailed(e) | Failed::WatchStartFailed(e) | Failed::WatchFailed(e) => {
            match e {
                kube::Error::Api(status) => refused(status.code),
                kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => true,
                _ => false,
            }
        }
        Failed::WatchError(status) => refused(status.code),
        Failed::NoResourceVersion => false,
    }
}

/// A failing watch's own backoff: from a second, doubling to a minute.
const LASTING_BACKOFF_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
const LASTING_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    /// Only lasting failures in a row double a watch's own backoff: after
    /// a long outage (connection failures), the first refusal as the API
    /// server comes back waits a second.
    #[test]
    fn only_lasting_failures_in_a_row_lengthen_a_watchs_own_backoff() {
        let secs = |d: std::time::Duration| d.as_secs();
        let mut run = FailureRun::default();
        for _ in 0..30 {
            assert_eq!(secs(run.record(false)), 0, "the outage: the shared pause");
        }
        assert_eq!(secs(run.record(true)), 1);
        assert_eq!(secs(run.record(true)), 2);
        assert_eq!(secs(run.record(true)), 4);
        for _ in 0..10 {
            run.record(true);
        }
        assert_eq!(secs(run.record(true)), 60, "at most a minute");
        run.record(false);
        assert_eq!(
            secs(run.record(true)),
            1,
            "a failure of another sort ends the run"
        );
        assert_eq!(run.in_a_row, 46);
    }

    fn folded(events: Vec<Event<u32>>) -> Vec<String> {
        let mut folder = Folder::default();
        events
            .into_iter()
            .filter_map(|event| folder.fold(event))
            .map(|change| match change {
                Change::Listed(all) => format!("listed {all:?}"),
                Change::Applied(one) => format!("applied {one}"),
                Change::Deleted(one) => format!("deleted {one}"),
            })
            .collect()
    }

    #[test]
    fn a_list_replaces_the_cache_at_once_and_only_when_complete() {
        let changes = folded(vec![
            Event::Init,
            Event::InitApply(1),
            Event::InitApply(2),
            Event::InitDone,
            Event::Apply(3),
            Event::Delete(1),
            // A relist that breaks off before its end says nothing; the
            // next complete one replaces the cache.
            Event::Init,
            Event::InitApply(7),
            Event::Init,
            Event::InitApply(8),
            Event::InitDone,
        ]);
        assert_eq!(
            changes,
            ["listed [1, 2]", "applied 3", "deleted 1", "listed [8]"]
        );
    }

    #[test]
    fn events_are_converted_as_they_come() {
        let doubled = map_event(Event::InitApply(4_u32), |n| n * 2);
        assert!(matches!(doubled, Event::InitApply(8)));
    }
}
