//! The command line: settings, the `plan` subcommand's report, and `probe`.

pub mod plan;
pub mod probe;
pub mod report;
pub mod run;
pub mod settings;
