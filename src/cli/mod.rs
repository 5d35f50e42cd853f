//! The command line: `entry` (parsing and exit codes), settings, `run`
//! (the operator's wiring), `plan` and
//! its report, `where` (the copies of one source), `release` (the chart's
//! pre-delete hook) and `probe`.

pub mod entry;
pub mod plan;
pub mod plan_members;
pub mod probe;
pub mod release;
pub mod report;
pub mod run;
pub mod settings;
pub mod whereabouts;

/// An async runtime from `builder` (with I/O and time), or the exit code
/// after saying on standard error why there is none.
pub fn start_runtime(
    mut builder: tokio::runtime::Builder,
    failed: std::process::ExitCode,
) -> Result<tokio::runtime::Runtime, std::process::ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("error: starting the async runtime: {e}");
        failed
    })
}
