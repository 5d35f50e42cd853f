//! What an operator of the operator sees: health, the HTTP server for
//! /metrics, /healthz and /readyz, the metrics, and logging.

pub(crate) mod http;
pub(crate) mod metrics;
pub(crate) mod metrics_auth;
pub(crate) mod telemetry;
