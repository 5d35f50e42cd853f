//! /metrics, /healthz and /readyz.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tracing::info;

use crate::ops::metrics::Metrics;
use crate::ops::metrics_auth::{Judge, Verdict};
use crate::{Error, Result};

/// A failing watch retries at least every few seconds (its backoff stops at
/// 3 s); one with no error for this long has come back, even if it had
/// nothing to report since. (A watch hung on a stalled connection errs only
/// every read timeout; the pending-work check catches that case.)
const WATCH_RECOVERED_AFTER: Duration = Duration::from_secs(10);

/// What the probes report.
pub(crate) struct Health {
    /// The watch and work loops are running.
    pub(crate) alive: AtomicBool,
    /// Every cache has its first full list (a standby is then ready to take over).
    pub(crate) ready: AtomicBool,
    started: Instant,
    /// Pending work without progress, or a watch failing, for this long is stuck.
    stuck_after: Duration,
    /// Milliseconds after `started` of the last progress.
    last_progress_ms: AtomicU64,
    /// A watch with no error for this long has recovered.
    watch_recovered_after: Duration,
    /// Watches failing now: since when, and their last error.
    failing_watches: Mutex<HashMap<String, (Instant, Instant)>>,
    /// Whether work waits that this process should be doing.
    work_pending: OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl Default for Health {
    fn default() -> Self {
        Self::new(Duration::from_secs(120))
    }
}

impl Health {
    pub(crate) fn new(stuck_after: Duration) -> Self {
        Self {
            alive: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            started: Instant::now(),
            stuck_after,
            watch_recovered_after: WATCH_RECOVERED_AFTER,
            last_progress_ms: AtomicU64::new(0),
            failing_watches: Mutex::default(),
            work_pending: OnceLock::new(),
        }
    }

    /// Tell the probe how to see pending work (the leader's queue).
    pub(crate) fn watch_work(&self, pending: impl Fn() -> bool + Send + Sync + 'static) {
        let _ = self.work_pending.set(Box::new(pending));
    }

    /// A reconcile or a request finished.
    pub(crate) fn progressed(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_progress_ms.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn watch_failed(&self, watch: &str) {
        let now = Instant::now();
        let mut failing = crate::sync::lock(&self.failing_watches);
        let entry = failing.entry(watch.to_owned()).or_insert((now, now));
        if now.duration_since(entry.1) > self.watch_recovered_after {
            // The last streak ended quietly (a resumed watch says nothing).
            entry.0 = now;
        }
        entry.1 = now;
    }

    /// A guard for a watch's task: when the task ends or is aborted (its
    /// future dropped), the watch is no failing watch any more, whatever
    /// it last reported.
    pub(crate) fn watch_guard(self: &Arc<Self>, watch: &str) -> WatchGuard {
        WatchGuard {
            health: self.clone(),
            watch: watch.to_owned(),
        }
    }

    /// Whether the watch `watch` has failed since it last worked.
    pub(crate) fn is_failing(&self, watch: &str) -> bool {
        crate::sync::lock(&self.failing_watches).contains_key(watch)
    }

    pub(crate) fn watch_ok(&self, watch: &str) {
        let mut failing = crate::sync::lock(&self.failing_watches);
        if !failing.is_empty() {
            failing.remove(watch);
        }
    }

    /// Why the operator is stuck, if it is.
    pub(crate) fn stuck(&self) -> Option<String> {
        if !self.alive.load(Ordering::Relaxed) {
            return Some("not running".into());
        }
        let failing = crate::sync::lock(&self.failing_watches)
            .iter()
            .filter(|(_, (since, last))| {
                last.elapsed() <= self.watch_recovered_after && since.elapsed() > self.stuck_after
            })
            .map(|(watch, (since, _))| format!("{watch} (for {} s)", since.elapsed().as_secs()))
            .next();
        if let Some(watch) = failing {
            return Some(format!("a watch keeps failing: {watch}"));
        }
        let pending = self.work_pending.get().is_some_and(|pending| pending());
        let idle = self.started.elapsed().as_millis() as u64
            - self
                .last_progress_ms
                .load(Ordering::Relaxed)
                .min(self.started.elapsed().as_millis() as u64);
        if pending && Duration::from_millis(idle) > self.stuck_after {
            return Some(format!(
                "work is pending and nothing progressed for {} s",
                idle / 1000
            ));
        }
        None
    }
}

/// See [`Health::watch_guard`].
pub(crate) struct WatchGuard {
    health: Arc<Health>,
    watch: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.health.watch_ok(&self.watch);
    }
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    /// With `--metrics-auth`: who may read /metrics.
    metrics_auth: Option<Arc<dyn Judge>>,
}

async fn serve_metrics(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if let Some(auth) = &state.metrics_auth {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let refused = match auth.verdict(authorization).await {
            Verdict::Allowed => None,
            Verdict::Unauthenticated => Some((StatusCode::UNAUTHORIZED, "Unauthorized\n")),
            Verdict::Forbidden => Some((StatusCode::FORBIDDEN, "Forbidden\n")),
            Verdict::Unavailable => Some((
                StatusCode::SERVICE_UNAVAILABLE,
                "the API server could not review the caller\n",
            )),
            Verdict::Busy => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "1")],
                    "too many callers are being reviewed; try again\n",
                )
                    .into_response();
            }
        };
        if let Some(refused) = refused {
            return refused.into_response();
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

fn probe(ok: bool, what: &'static str) -> (StatusCode, String) {
    if ok {
        (StatusCode::OK, "ok\n".into())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not {what}\n"))
    }
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    match state.health.stuck() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("stuck: {why}\n")),
    }
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    probe(state.health.ready.load(Ordering::Relaxed), "synced")
}

/// Bind now (so a bad address fails at start), serve until `shutdown` resolves.
pub(crate) async fn serve(
    address: SocketAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    metrics_auth: Option<Arc<dyn Judge>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| Error::Listen {
            address: address.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| Error::Listen {
        address: address.to_string(),
        source,
    })?;
    info!(address = %bound, "serving /metrics, /healthz and /readyz");
    let app = Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            health,
            metrics,
            metrics_auth,
        });
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pending_work_without_progress_is_stuck_and_progress_heals_it() {
        let health = Health::new(Duration::from_millis(50));
        health.alive.store(true, Ordering::Relaxed);
        let pending = Arc::new(AtomicBool::new(false));
        let seen = pending.clone();
        health.watch_work(move || seen.load(Ordering::Relaxed));
        tokio::time::advance(Duration::from_millis(80)).await;
        assert_eq!(health.stuck(), None, "idle without work is fine");
        pending.store(true, Ordering::Relaxed);
        assert!(health.stuck().is_some_and(|why| why.contains("pending")));
        health.progressed();
        assert_eq!(health.stuck(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_failing_for_long_is_stuck_until_it_recovers() {
        let health = Health::new(Duration::from_millis(30));
        health.alive.store(true, Ordering::Relaxed);
        health.watch_failed("namespaces");
        assert_eq!(health.stuck(), None, "a short failure is fine");
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(health.stuck().is_some_and(|why| why.contains("namespaces")));
        health.watch_ok("namespaces");
        assert_eq!(health.stuck(), None);
    }

    /// A watch stopped while failing (its task aborted) fails no probe.
    #[tokio::test(start_paused = true)]
    async fn a_watch_that_stops_is_no_failing_watch() {
        let health = Arc::new(Health::new(Duration::from_millis(30)));
        health.alive.store(true, Ordering::Relaxed);
        let guard = health.watch_guard("Widget sources in ops");
        health.watch_failed("Widget sources in ops");
        tokio::time::advance(Duration::from_millis(40)).await;
        health.watch_failed("Widget sources in ops");
        assert!(health.stuck().is_some());
        drop(guard);
        assert_eq!(health.stuck(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_resumed_quietly_counts_as_recovered() {
        let mut health = Health::new(Duration::from_millis(30));
        health.watch_recovered_after = Duration::from_millis(60);
        health.alive.store(true, Ordering::Relaxed);
        health.watch_failed("copyratorrules");
        tokio::time::advance(Duration::from_millis(40)).await;
        health.watch_failed("copyratorrules");
        assert!(
            health.stuck().is_some(),
            "failing for longer than stuck_after"
        );
        // No error since, and no event either (nothing to report).
        tokio::time::advance(Duration::from_millis(80)).await;
        assert_eq!(health.stuck(), None);
        // A new failure starts a new streak.
        health.watch_failed("copyratorrules");
        assert_eq!(health.stuck(), None);
    }
}
