//! What an operator of the operator sees: health, the HTTP server for
//! /metrics, /healthz and /readyz, the metrics, and logging.

pub mod http;
pub mod metrics;
pub mod metrics_auth;
pub mod telemetry;
