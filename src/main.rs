use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info};

use copyrator::api::kinds::Kind;
use copyrator::cli::report::{self, FileRule, Followed, PlanError, Report};
use copyrator::cli::settings::{Cli, Command, PlanArgs, PlanOutput, Settings};
use copyrator::cluster::client::{Clients, Transport};
use copyrator::cluster::leader::{self, LeaderGate};
use copyrator::controller::state::Shared;
use copyrator::controller::watches;
use copyrator::core::plan::Action;
use copyrator::core::preview::{PlannedChange, Preview};
use copyrator::ops::http::{self, Health};
use copyrator::ops::metrics::Metrics;

/// Reconcile loops: one per write in flight (within these bounds), so that
/// a thousand rules with a few copies each keep the writer as busy as one
/// rule with thousands; writes stay bounded by `--write-concurrency`.
fn workers(write_concurrency: u32) -> usize {
    (write_concurrency as usize).clamp(4, 64)
}
/// Shutdown must finish well within Kubernetes' default 30 s grace period.
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(8);

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // clap's usage errors exit 2, which for `plan` would say "changes".
            return if e.use_stderr() && asks_for_plan() {
                ExitCode::from(report::EXIT_FAILED)
            } else {
                ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
            };
        }
    };
    let planning = matches!(cli.command, Some(Command::Plan(_)));
    if let Err(message) = cli.settings.validate() {
        eprintln!("error: {message}");
        return ExitCode::from(if planning { report::EXIT_FAILED } else { 2 });
    }
    match cli.command {
        Some(Command::Crd) => match copyrator::api::crd::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Probe {
            url,
            timeout_seconds,
        }) => probe(&url, Duration::from_secs(timeout_seconds)),
        Some(Command::Plan(args)) => plan_command(cli.settings, args),
        Some(Command::Run) | None => {
            let runtime = match start_runtime(tokio::runtime::Builder::new_multi_thread()) {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            match runtime.block_on(run(cli.settings)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    error!(error = format!("{e:#}"), "copyrator stopped");
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Whether the command line asks for `plan`, even one that clap refuses.
fn asks_for_plan() -> bool {
    Cli::command()
        .ignore_errors(true)
        .try_get_matches()
        .is_ok_and(|matches| matches.subcommand_name() == Some("plan"))
}

async fn shutdown_signal() -> &'static str {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => "SIGINT",
        _ = term => "SIGTERM",
    }
}

/// A client whose every request has a deadline: a hung or half-open
/// connection fails the request (and is dropped) instead of stalling a
/// worker. Watches end on the server after `WATCH_TIMEOUT_SECONDS`, well
/// within the deadline, and resume from where they were.
async fn api_clients(transport: Transport, writes_in_flight: usize) -> anyhow::Result<Clients> {
    let mut config = kube::Config::infer().await.context(
        "cannot find the Kubernetes API configuration (in-cluster, KUBECONFIG or ~/.kube/config)",
    )?;
    let deadline =
        Duration::from_secs(u64::from(copyrator::cluster::watch::WATCH_TIMEOUT_SECONDS) + 5);
    config.connect_timeout = Some(copyrator::cluster::client::CONNECT_TIMEOUT);
    config.read_timeout = Some(deadline);
    config.reset_reader_on_write = true;
    config.write_timeout = Some(Duration::from_secs(10));
    // kube's own retry of 429/503 (up to 15 times, hidden from us) would
    // multiply requests; failures come back to the per-copy backoff instead.
    config.default_retry = false;
    Ok(copyrator::cluster::client::build_clients(
        config,
        transport,
        deadline,
        writes_in_flight,
    )?)
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    copyrator::ops::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients = api_clients(settings.api_transport, settings.write_concurrency as usize).await?;
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::new(settings.stuck_after()));
    let (stop, stop_receiver) = watch::channel(false);

    let (gate, always_sender, election) = if settings.leader_election {
        let (gate, election) = leader::start(
            clients.read.clone(),
            &settings.namespace,
            &settings.lease_name,
            settings.lease_duration(),
            metrics.clone(),
        );
        (gate, None, Some(election))
    } else {
        let (gate, sender) = LeaderGate::always();
        metrics.leader.set(1);
        (gate, Some(sender), None)
    };

    let shared = Shared::new(
        clients,
        settings.trust(),
        settings.options(),
        metrics.clone(),
        gate,
        health.clone(),
        false,
    );
    {
        // Work pending counts only where this process should do it: the leader.
        let shared = Arc::downgrade(&shared);
        health.watch_work(move || {
            shared
                .upgrade()
                .is_some_and(|s| s.leader.is_leader() && !s.queue.is_empty())
        });
    }
    let tasks = spawn_watches(&shared);

    let server = {
        let mut stopped = stop_receiver.clone();
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        http::serve(
            settings.listen_address,
            health.clone(),
            metrics.clone(),
            shutdown,
        )
        .await?
    };
    health.alive.store(true, Ordering::Release);
    info!(
        namespace = settings.namespace.as_str(),
        all_namespaces = settings.all_namespaces,
        rule_name = settings.rule_name.as_deref().unwrap_or(""),
        leader_election = settings.leader_election,
        "copyrator started"
    );

    let signal = tokio::spawn(shutdown_signal());
    let mut signal = signal;
    // Caches first: a reconcile on a half-listed cache would prune what it has not seen yet.
    loop {
        if shared.synced.all() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            which = &mut signal => {
                info!(signal = which.unwrap_or("signal"), "stopping before the caches synced");
                return Ok(());
            }
        }
    }
    health.ready.store(true, Ordering::Release);
    info!("caches synced");
    tokio::spawn(copyrator::controller::kinds::watch_named_kinds(
        shared.clone(),
    ));

    let workers = tokio::spawn(copyrator::controller::workers::run_workers(
        shared.clone(),
        workers(settings.write_concurrency),
        stop_receiver.clone(),
    ));
    let resync = tokio::spawn(copyrator::controller::workers::run_resync(
        shared.clone(),
        settings.resync_interval(),
        stop_receiver.clone(),
    ));

    let which = signal.await.unwrap_or("signal");
    info!(signal = which, "shutting down");
    // Stop writing first, then hand the Lease over, then wait for in-flight work.
    if let Some(sender) = always_sender {
        let _ = sender.send(false);
    }
    if let Some(election) = election {
        election.stop(Duration::from_secs(3)).await;
    }
    let _ = stop.send(true);
    let finished = tokio::time::timeout(SHUTDOWN_WITHIN, async {
        let _ = workers.await;
        let _ = resync.await;
        let _ = server.await;
    })
    .await;
    if finished.is_err() {
        info!("in-flight work abandoned after the shutdown deadline");
    }
    for task in tasks {
        task.abort();
    }
    info!("stopped");
    Ok(())
}

/// The watches that fill the views: rules, namespaces, and the copies of
/// every kind the operator copies.
fn spawn_watches(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        watches::spawn_rule_watch(shared.clone()),
        watches::spawn_namespace_watch(shared.clone()),
        tokio::spawn(copyrator::controller::kinds::release_on_rules_gone(
            shared.clone(),
        )),
    ];
    for kind in Kind::builtin() {
        if shared.trust.policy.kinds.has_builtin(kind) {
            tasks.push(copyrator::controller::kinds::spawn_copy_watch(
                shared.clone(),
                kind,
            ));
        } else {
            // Never watched, never written: nothing to wait for.
            shared.synced.set_copies_of(kind, true);
        }
    }
    tasks
}

/// How long `plan` waits for the API server to answer at all.
const PLAN_REACH_WITHIN: Duration = Duration::from_secs(10);
/// How long `plan` waits for its caches, and then for the rules' sources.
const PLAN_LISTS_WITHIN: Duration = Duration::from_secs(30);

/// `copyrator plan`: the files first (a broken file needs no cluster), then
/// the report on standard output, refused rules and errors on standard
/// error, and the exit code.
fn plan_command(settings: Settings, args: PlanArgs) -> ExitCode {
    let failed = ExitCode::from(report::EXIT_FAILED);
    let from_files = if args.files.is_empty() {
        None
    } else {
        match read_rule_files(&args.files, &settings) {
            Ok(rules) => Some(rules),
            Err(e) => {
                eprintln!("error: {e}");
                return failed;
            }
        }
    };
    let runtime = match start_runtime(tokio::runtime::Builder::new_multi_thread()) {
        Ok(runtime) => runtime,
        Err(_) => return failed,
    };
    let report = match runtime.block_on(plan(settings, from_files)) {
        Ok(report) => report.sorted(),
        Err(e) => {
            eprintln!("error: {e:#}");
            return failed;
        }
    };
    let printed = match args.output {
        PlanOutput::Text => Ok(report.text()),
        PlanOutput::Json => report.json(),
    };
    let written = printed.map_err(anyhow::Error::from).and_then(|text| {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .context("writing the plan to standard output")
    });
    if let Err(e) = written {
        eprintln!("error: {e:#}");
        return failed;
    }
    for refusal in report.refusals() {
        eprintln!("error: {refusal}");
    }
    ExitCode::from(report.exit_code())
}

/// The rules of the `-f` files (`-` is standard input), each given once
/// and each one the operator would follow.
fn read_rule_files(files: &[PathBuf], settings: &Settings) -> Result<Vec<FileRule>, PlanError> {
    let mut parsed = Vec::with_capacity(files.len());
    for path in files {
        let (file, text) = if path.as_os_str() == "-" {
            let file = "standard input".to_owned();
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| PlanError::Read {
                    file: file.clone(),
                    source,
                })?;
            (file, text)
        } else {
            let file = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
                file: file.clone(),
                source,
            })?;
            (file, text)
        };
        parsed.push(report::parse_rules(&file, &text, &settings.namespace)?);
    }
    let rules = report::gather(parsed)?;
    let followed = Followed {
        operator_namespace: &settings.namespace,
        all_namespaces: settings.all_namespaces,
        rule_name: settings.rule_name.as_deref(),
    };
    for rule in &rules {
        followed.check(rule)?;
    }
    Ok(rules)
}

/// What `run` would do now for the rules of the files, each in place of
/// the live rule of its name, or without files for every live rule (and
/// the copies of rules that are gone): the views are filled as `run` fills
/// them, each rule waits for its sources, and nothing is written (the
/// gate is shut, and previews write nothing anyway).
async fn plan(settings: Settings, from_files: Option<Vec<FileRule>>) -> anyhow::Result<Report> {
    copyrator::ops::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients = api_clients(settings.api_transport, settings.write_concurrency as usize).await?;
    // One request first, so that an API server out of reach is said at once.
    tokio::time::timeout(PLAN_REACH_WITHIN, clients.read.apiserver_version())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the Kubernetes API server did not answer within {} s",
                PLAN_REACH_WITHIN.as_secs()
            )
        })?
        .context("cannot reach the Kubernetes API server")?;
    let (gate, shut) = LeaderGate::always();
    let _ = shut.send(false);
    let shared = Shared::new(
        clients,
        settings.trust(),
        settings.options(),
        Arc::new(Metrics::default()),
        gate,
        Arc::new(Health::new(settings.stuck_after())),
        true,
    );
    let tasks = spawn_watches(&shared);
    let planned = plan_with_views(&shared, from_files).await;
    for task in tasks {
        task.abort();
    }
    planned
}

async fn plan_with_views(
    shared: &Arc<Shared>,
    from_files: Option<Vec<FileRule>>,
) -> anyhow::Result<Report> {
    // A plan on half-listed caches would miss copies and prune nothing.
    let deadline = tokio::time::Instant::now() + PLAN_LISTS_WITHIN;
    while !shared.synced.all() {
        if tokio::time::Instant::now() >= deadline {
            return Err(PlanError::CachesNotListed {
                missing: shared.synced.missing().join(", "),
                seconds: PLAN_LISTS_WITHIN.as_secs(),
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let every_live_rule = from_files.is_none();
    let live = copyrator::sync::read(&shared.rules).clone();
    let mut pending = report::rules_to_plan(from_files, &live);
    let mut report = Report::default();
    // Every rule registers its sources in the first round, so that their
    // watches list together; later rounds ask only the rules still waiting.
    let deadline = tokio::time::Instant::now() + PLAN_LISTS_WITHIN;
    while !pending.is_empty() {
        let mut waiting = Vec::new();
        for rule in pending {
            match copyrator::controller::reconcile::preview(shared, &rule).await? {
                Preview::WaitingForSources => waiting.push(rule),
                preview => report.add(&rule.key(), preview),
            }
        }
        if !waiting.is_empty() {
            if tokio::time::Instant::now() >= deadline {
                let rules: Vec<String> = waiting.iter().map(|r| r.key().to_string()).collect();
                return Err(PlanError::SourcesNotListed {
                    rules: rules.join(", "),
                    seconds: PLAN_LISTS_WITHIN.as_secs(),
                }
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pending = waiting;
    }
    if every_live_rule {
        // `run` deletes these at start.
        for kind in Kind::all() {
            for action in copyrator::controller::finalizer::orphans(shared, kind) {
                if let Action::Delete { current, .. } = &action {
                    let rule = current.rule_ref.as_deref().unwrap_or_default();
                    report.changes.push(PlannedChange::of(rule, kind, &action));
                }
            }
        }
    }
    Ok(report)
}

/// An async runtime, or the exit code after saying why there is none.
fn start_runtime(
    mut builder: tokio::runtime::Builder,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("error: starting the async runtime: {e}");
        ExitCode::FAILURE
    })
}

/// `copyrator probe URL`: a current-thread runtime, one request.
fn probe(url: &str, timeout: Duration) -> ExitCode {
    let runtime = match start_runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(copyrator::cli::probe::probe(url, timeout)) {
        Ok(()) => {
            println!("{url}: ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
