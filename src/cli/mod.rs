//! The command line: settings, `run` (the operator's wiring), `plan` and
//! its report, and `probe`.

pub mod plan;
pub mod probe;
pub mod report;
pub mod run;
pub mod settings;
