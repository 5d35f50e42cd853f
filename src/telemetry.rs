//! Logging: text or JSON lines on standard error, filtered by an env-filter.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::{Error, Result};

pub fn init(level: &str, format: LogFormat) -> Result<()> {
    let filter = EnvFilter::try_new(level)
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
