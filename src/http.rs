//! /metrics, /healthz and /readyz.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tracing::info;

use crate::metrics::Metrics;
use crate::{Error, Result};

/// What the probes report.
#[derive(Default)]
pub struct Health {
    /// The watch and work loops are running.
    pub alive: AtomicBool,
    /// Every cache has its first full list (a standby is then ready to take over).
    pub ready: AtomicBool,
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

async fn serve_metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

fn probe(ok: bool, what: &'static str) -> (StatusCode, String) {
    if ok {
        (StatusCode::OK, "ok\n".into())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not {what}\n"))
    }
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    probe(state.health.alive.load(Ordering::Relaxed), "running")
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    probe(state.health.ready.load(Ordering::Relaxed), "synced")
}

/// Bind now (so a bad address fails at start), serve until `shutdown` resolves.
pub async fn serve(
    address: SocketAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
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
        .with_state(AppState { health, metrics });
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    }))
}
