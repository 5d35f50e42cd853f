//! The command line: settings, the `plan` subcommand's report, and `probe`.

pub mod probe;
pub mod report;
pub mod settings;
