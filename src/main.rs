//! The `copyrator` binary: the library's command line
//! ([`copyrator::cli::entry`]) does everything.

fn main() -> std::process::ExitCode {
    copyrator::cli::entry::main()
}
