//! Logging: text or JSON lines on standard error, filtered by an env-filter.

use tracing_subscriber::EnvFilter;

use crate::{Error, Result};

/// How log lines are written: text for people, JSON for collectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// kube's HTTP layer logs an ERROR line of its own for every failed
/// request; the operator reports failures aggregated per rule instead, so
/// those lines are off unless directives ask for them.
const QUIET_CLIENT: &str = "kube_client::client::builder=off";

pub(crate) fn init(level: &str, format: LogFormat) -> Result<()> {
    let directives = if level.contains("kube") {
        level.to_owned()
    } else {
        format!("{level},{QUIET_CLIENT}")
    };
    let filter = EnvFilter::try_new(&directives)
        .map_err(|e| Error::Config(format!("--log-level {level:?}: {e}")))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    installed.map_err(|e| Error::Config(format!("installing the logger: {e}")))
}
