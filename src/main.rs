use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio::sync::watch;
use tracing::{error, info};

use copyrator::client::{Clients, Transport};
use copyrator::config::{Cli, Command, Settings};
use copyrator::controller;
use copyrator::http::{self, Health};
use copyrator::leader::{self, LeaderGate};
use copyrator::metrics::Metrics;
use copyrator::rule::RuleKey;
use copyrator::state::Shared;
use copyrator::{kinds::Kind, watch as watches};

/// Reconcile loops: one per write in flight (within these bounds), so that
/// a thousand rules with a few copies each keep the writer as busy as one
/// rule with thousands; writes stay bounded by `--write-concurrency`.
fn workers(write_concurrency: u32) -> usize {
    (write_concurrency as usize).clamp(4, 64)
}
/// Shutdown must finish well within Kubernetes' default 30 s grace period.
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(8);

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(message) = cli.settings.validate() {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    if let Some(Command::Crd) = cli.command {
        return match copyrator::crd::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Probe {
        url,
        timeout_seconds,
    }) = &cli.command
    {
        return probe(url, Duration::from_secs(*timeout_seconds));
    }
    let plan_only = matches!(cli.command, Some(Command::Plan));
    let runtime = match start_runtime(tokio::runtime::Builder::new_multi_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(run(cli.settings, plan_only)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "copyrator stopped");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
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
    let deadline = Duration::from_secs(u64::from(copyrator::state::WATCH_TIMEOUT_SECONDS) + 5);
    config.connect_timeout = Some(copyrator::client::CONNECT_TIMEOUT);
    config.read_timeout = Some(deadline);
    config.reset_reader_on_write = true;
    config.write_timeout = Some(Duration::from_secs(10));
    // kube's own retry of 429/503 (up to 15 times, hidden from us) would
    // multiply requests; failures come back to the per-copy backoff instead.
    config.default_retry = false;
    Ok(copyrator::client::build_clients(
        config,
        transport,
        deadline,
        writes_in_flight,
    )?)
}

async fn run(settings: Settings, plan_only: bool) -> anyhow::Result<()> {
    copyrator::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients = api_clients(settings.api_transport, settings.write_concurrency as usize).await?;
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::new(settings.stuck_after()));
    let (stop, stop_receiver) = watch::channel(false);

    let (gate, always_sender, election) = if settings.leader_election && !plan_only {
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
        settings.clone(),
        metrics.clone(),
        gate,
        health.clone(),
        plan_only,
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
    let mut tasks = vec![
        watches::spawn_rule_watch(shared.clone()),
        watches::spawn_namespace_watch(shared.clone()),
    ];
    for kind in Kind::all() {
        if shared.trust.policy.kinds.contains(&kind) {
            tasks.push(watches::spawn_copy_watch(shared.clone(), kind));
        } else {
            // Never watched, never written: nothing to wait for.
            shared.synced.copies[kind as usize].store(true, Ordering::Release);
        }
    }

    let server = if plan_only {
        None
    } else {
        let mut stopped = stop_receiver.clone();
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        Some(
            http::serve(
                settings.listen_address,
                health.clone(),
                metrics.clone(),
                shutdown,
            )
            .await?,
        )
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

    if plan_only {
        return plan(&shared).await;
    }

    let workers = tokio::spawn(controller::run_workers(
        shared.clone(),
        workers(settings.write_concurrency),
        stop_receiver.clone(),
    ));
    let resync = tokio::spawn(controller::run_resync(
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
        if let Some(server) = server {
            let _ = server.await;
        }
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

/// Print what `run` would do for every rule, and change nothing.
async fn plan(shared: &Arc<Shared>) -> anyhow::Result<()> {
    let mut keys: Vec<RuleKey> = copyrator::state::read(&shared.rules)
        .keys()
        .cloned()
        .collect();
    keys.sort();
    for key in keys {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            copyrator::reconcile::reconcile(shared, &key, copyrator::scope::Scope::everything())
                .await?;
            let ready = controller::sources_ready(shared, &key)
                || copyrator::state::read(&shared.rules)
                    .get(&key)
                    .is_none_or(|r| r.is_deleting() || r.resolve(&shared.trust).is_err());
            if ready {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the sources of rule {key} were not listed within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
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
    match runtime.block_on(copyrator::probe::probe(url, timeout)) {
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
