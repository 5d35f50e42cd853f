//! The command line as a whole: parse it (named `kubectl copyrator` when
//! run as a kubectl plugin), map clap's refusals to the exit codes of
//! `plan` and `where`, and run the command.

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches};
use tracing::error;

use crate::cli::report::EXIT_FAILED;
use crate::cli::settings::{Cli, Command};
use crate::cli::{import, plan, release, run, whereabouts};

/// Parse the command line and run its command; the process exits with the
/// code returned.
pub fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // clap's usage errors exit 2, which for `plan` would say
            // "changes" and for `where` "not current".
            return if e.use_stderr() && asks_for_a_report() {
                ExitCode::from(EXIT_FAILED)
            } else {
                ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
            };
        }
    };
    let planning = matches!(cli.command, Some(Command::Plan(_) | Command::Where(_)));
    if let Err(message) = cli.settings.validate() {
        eprintln!("error: {message}");
        return ExitCode::from(if planning { EXIT_FAILED } else { 2 });
    }
    if matches!(
        cli.command,
        Some(Command::Plan(_) | Command::Where(_) | Command::Release(_) | Command::Import(_))
    ) {
        // They cannot read the operator's mark key: marks are taken as said.
        crate::cache::mark::trust_unchecked();
    }
    match cli.command {
        Some(Command::Crd) => print_crd(),
        Some(Command::FileCredential { file }) => crate::cli::file_credential::run(&file),
        Some(Command::Probe {
            url,
            timeout_seconds,
        }) => crate::cli::probe::run(&url, Duration::from_secs(timeout_seconds)),
        Some(Command::Plan(args)) => plan::plan_command(cli.settings, args),
        Some(Command::Where(args)) => whereabouts::where_command(cli.settings, args),
        Some(Command::Release(args)) => release::release_command(cli.settings, args),
        Some(Command::Import(args)) => import::import_command(cli.settings, args),
        Some(Command::Run) | None => run_operator(cli.settings),
    }
}

/// The command line, named as it was called: as a kubectl plugin
/// (`kubectl-copyrator`, which `kubectl copyrator ...` runs with the
/// arguments after `copyrator`) its help and errors say `kubectl copyrator`.
fn parse() -> Result<Cli, clap::Error> {
    let matches = command().try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

fn command() -> clap::Command {
    let command = Cli::command();
    if crate::cli::settings::is_kubectl_plugin(std::env::args_os().next().as_deref()) {
        command.bin_name(crate::cli::settings::KUBECTL_PLUGIN_BIN_NAME)
    } else {
        command
    }
}

/// Whether the command line asks for `plan` or `where`, even one that
/// clap refuses.
fn asks_for_a_report() -> bool {
    command()
        .ignore_errors(true)
        .try_get_matches()
        .is_ok_and(|matches| matches!(matches.subcommand_name(), Some("plan" | "where")))
}

/// `copyrator crd`: the CustomResourceDefinition, from the Rust types.
fn print_crd() -> ExitCode {
    match crate::api::crd::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `copyrator run`: the operator, until SIGTERM or SIGINT.
fn run_operator(settings: crate::cli::settings::Settings) -> ExitCode {
    let builder = tokio::runtime::Builder::new_multi_thread();
    let runtime = match crate::cli::start_runtime(builder, ExitCode::FAILURE) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(run::run(settings, run::shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "copyrator stopped");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
