//! The command line: `entry` (parsing and exit codes), settings, `run`
//! (the operator's wiring), `plan` and
//! its report, `where` (the copies of one source), `import` (the other
//! copying tools' configuration as rules), `release` (the chart's
//! pre-delete hook) and `probe`.

pub mod entry;
pub(crate) mod file_credential;
pub(crate) mod import;
pub(crate) mod plan;
pub(crate) mod plan_members;
pub(crate) mod probe;
pub(crate) mod release;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod settings;
pub(crate) mod whereabouts;

/// An async runtime from `builder` (with I/O and time), or the exit code
/// after saying on standard error why there is none.
pub(crate) fn start_runtime(
    mut builder: tokio::runtime::Builder,
    failed: std::process::ExitCode,
) -> Result<tokio::runtime::Runtime, std::process::ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("error: starting the async runtime: {e}");
        failed
    })
}
