//! `copyrator run`: the operator's wiring. The order is the contract:
//! caches list before any pass (a pass on a half-listed cache would prune
//! what it has not seen); on shutdown writes stop first, then the Lease is
//! handed over, then in-flight work finishes within a deadline, then every
//! task still running is aborted. Each shutdown step is logged as it ends
//! (`shutdown step`, with `step` and `done`), and a test reads that order.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

use crate::api::kinds::Kind;
use crate::cli::settings::Settings;
use crate::cluster::client::{Clients, Transport};
use crate::cluster::leader::{self, LeaderGate};
use crate::controller::state::Shared;
use crate::controller::{kinds, watches, workers};
use crate::ops::http::{self, Health};
use crate::ops::metrics::Metrics;

/// Reconcile loops: one per write in flight (within these bounds), so that
/// a thousand rules with a few copies each keep the writer as busy as one
/// rule with thousands; writes stay bounded by `--write-concurrency`.
fn workers_for(write_concurrency: u32) -> usize {
    (write_concurrency as usize).clamp(4, 64)
}

/// Shutdown must finish well within Kubernetes' default 30 s grace period.
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(8);

/// SIGINT or SIGTERM, whichever comes first; its name.
pub(crate) async fn shutdown_signal() -> &'static str {
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

/// The home cluster's clients, from the usual configuration.
pub(crate) async fn api_clients(
    transport: Transport,
    writes_in_flight: usize,
) -> anyhow::Result<Clients> {
    let config = kube::Config::infer().await.context(
        "cannot find the Kubernetes API configuration (in-cluster, KUBECONFIG or ~/.kube/config)",
    )?;
    Ok(crate::cluster::client::clients_with_deadlines(
        config,
        transport,
        writes_in_flight,
        crate::cluster::client::ApiServer::Home,
    )?)
}

/// The watches that fill the views (rules, namespaces, the copies of every
/// built-in kind the operator copies) and the task that stops the copy
/// watches no rule needs.
pub(crate) fn spawn_watches(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut tasks = spawn_rule_and_namespace_watches(shared);
    tasks.extend(spawn_copy_watches(shared));
    tasks
}

fn spawn_rule_and_namespace_watches(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    vec![
        watches::spawn_rule_watch(shared.clone()),
        watches::spawn_namespace_watch(shared.clone(), shared.home.clone()),
        tokio::spawn(kinds::release_on_rules_gone(shared.clone())),
        // Rules that write as ServiceAccounts: a change of their rights
        // counts at once (RBAC is watched once the first such rule asks).
        watches::spawn_rbac_watch(shared.clone()),
    ]
}

/// The copy watches, which decode copies: in `run`, started once the mark
/// key is installed.
fn spawn_copy_watches(shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for kind in Kind::builtin() {
        if shared.trust.policy.kinds.has_builtin(kind) {
            tasks.push(kinds::spawn_copy_watch(
                shared.clone(),
                shared.home.clone(),
                kind,
            ));
        } else {
            // Never watched, never written: nothing to wait for.
            shared.home.cluster.views.synced.set_copies_of(kind, true);
        }
    }
    tasks
}

/// What starts once home's caches have listed: the watches of the kinds
/// rules name, and the members (their passes read the rules' view).
fn spawn_after_sync(shared: &Arc<Shared>, member_clusters: bool) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![tokio::spawn(kinds::watch_named_kinds(shared.clone()))];
    if member_clusters {
        tasks.push(tokio::spawn(crate::controller::fleet::follow_inventory(
            shared.clone(),
        )));
    }
    tasks
}

/// Who may write: the Lease holder under leader election, else this
/// process alone (its gate is closed again at shutdown).
struct Leadership {
    gate: LeaderGate,
    always: Option<watch::Sender<bool>>,
    election: Option<leader::Election>,
}

fn leadership(settings: &Settings, clients: &Clients, metrics: &Arc<Metrics>) -> Leadership {
    if settings.leader_election {
        let (gate, election) = leader::start(
            clients.read.clone(),
            &settings.namespace,
            &settings.lease_name,
            settings.lease_duration(),
            metrics.clone(),
        );
        Leadership {
            gate,
            always: None,
            election: Some(election),
        }
    } else {
        let (gate, sender) = LeaderGate::always();
        metrics.leader.set(1);
        Leadership {
            gate,
            always: Some(sender),
            election: None,
        }
    }
}

/// Read (or make) the installation's mark key and install it.
async fn install_mark_key(settings: &Settings, shared: &Shared) -> anyhow::Result<()> {
    let key = crate::cluster::mark_key::load_or_create(
        &shared.home.cluster,
        &settings.namespace,
        &settings.mark_key_secret,
        &shared.metrics,
        &shared.health,
    )
    .await?;
    crate::cache::mark::install(key);
    Ok(())
}

/// `work`'s output, or the name of what asked to stop when that came first.
async fn unless_stopped<T>(
    work: impl Future<Output = T>,
    signal: &mut JoinHandle<&'static str>,
) -> Result<T, &'static str> {
    tokio::select! {
        done = work => Ok(done),
        which = signal => Err(which.unwrap_or("signal")),
    }
}

/// Stop before the operator got to work: its tasks aborted, its server
/// drained.
async fn stop_early(
    which: &'static str,
    before: &'static str,
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
) -> anyhow::Result<()> {
    info!(signal = which, "stopping before {before}");
    for task in tasks {
        task.abort();
    }
    let _ = stop.send(true);
    let _ = server.await;
    Ok(())
}

fn shutdown_step(step: u8, done: &str) {
    info!(step, done, "shutdown step");
}

/// The HTTP server for /metrics and the probes, bound now, until `stopped`.
async fn serve_http(
    settings: &Settings,
    shared: &Shared,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let until_stopped = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let metrics_auth = settings.metrics_auth.then(|| {
        let reviewer =
            crate::cluster::token_reviews::TokenReviewer::new(shared.home.cluster.reader.clone());
        let reviews = crate::ops::metrics_auth::Reviews::new(
            reviewer,
            settings.max_metrics_reviews,
            shared.metrics.clone(),
        );
        Arc::new(reviews) as Arc<dyn crate::ops::metrics_auth::Judge>
    });
    Ok(http::serve(
        settings.listen_address,
        shared.health.clone(),
        shared.metrics.clone(),
        metrics_auth,
        until_stopped,
    )
    .await?)
}

/// Runs the operator until `shutdown` resolves (to the name of what asked,
/// such as a signal), then stops it in order.
pub(crate) async fn run(
    settings: Settings,
    shutdown: impl Future<Output = &'static str> + Send + 'static,
) -> anyhow::Result<()> {
    crate::ops::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients = api_clients(settings.api_transport, settings.write_concurrency as usize).await?;
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::new(settings.stuck_after()));
    let (stop, stopped) = watch::channel(false);
    let Leadership {
        gate,
        always,
        election,
    } = leadership(&settings, &clients, &metrics);
    let shared = Shared::new(
        clients,
        settings.trust(),
        settings.load_options()?,
        metrics.clone(),
        gate,
        health.clone(),
    );
    watch_pending_work(&health, &shared);
    let server = serve_http(&settings, &shared, stopped.clone()).await?;
    health.alive.store(true, Ordering::Release);
    info!(
        namespace = settings.namespace.as_str(),
        all_namespaces = settings.all_namespaces,
        rule_name = settings.rule_name.as_deref().unwrap_or(""),
        leader_election = settings.leader_election,
        "copyrator started"
    );

    let mut signal = tokio::spawn(shutdown);
    let mut tasks = spawn_rule_and_namespace_watches(&shared);
    tasks.push(tokio::spawn(crate::controller::versions::watch_home(
        shared.clone(),
    )));
    if let Some(name) = settings.copy_protection.clone().filter(|n| !n.is_empty()) {
        use crate::controller::protection::{Followed, spawn_protection_watch};
        let followed = Followed::at_home(&shared, name);
        tasks.push(spawn_protection_watch(
            shared.clone(),
            shared.home.clone(),
            followed,
        ));
    }
    // Before the copy watches: each copy decoded is checked against the key.
    match unless_stopped(install_mark_key(&settings, &shared), &mut signal).await {
        Ok(installed) => installed?,
        Err(which) => return stop_early(which, "the mark key was read", tasks, stop, server).await,
    }
    tasks.extend(spawn_copy_watches(&shared));
    // Caches first: a pass on a half-listed cache would prune what it has not seen yet.
    let synced = shared.home.cluster.views.synced.wait_all();
    if let Err(which) = unless_stopped(synced, &mut signal).await {
        return stop_early(which, "the caches synced", tasks, stop, server).await;
    }
    health.ready.store(true, Ordering::Release);
    info!("caches synced");
    tasks.extend(spawn_after_sync(&shared, settings.member_clusters));
    let working = [
        tokio::spawn(workers::run_workers(
            shared.clone(),
            workers_for(settings.write_concurrency),
            stopped.clone(),
        )),
        tokio::spawn(workers::run_resync(
            shared.clone(),
            settings.resync_interval(),
            stopped.clone(),
        )),
        server,
    ];

    let which = signal.await.unwrap_or("signal");
    info!(signal = which, "shutting down");
    shut_down(&shared, always, election, stop, working, tasks).await;
    info!("stopped");
    Ok(())
}

/// Writes stop first; a Lease holder then hands the Lease over, so that a
/// standby leads at once; in-flight work finishes within the deadline;
/// every other task is aborted.
async fn shut_down(
    shared: &Shared,
    always: Option<watch::Sender<bool>>,
    election: Option<leader::Election>,
    stop: watch::Sender<bool>,
    working: [JoinHandle<()>; 3],
    tasks: Vec<JoinHandle<()>>,
) {
    if let Some(sender) = always {
        let _ = sender.send(false);
        shutdown_step(1, "writes stopped");
    }
    if let Some(election) = election {
        election.stop(Duration::from_secs(3)).await;
        shutdown_step(1, "writes stopped, Lease released");
    }
    let _ = stop.send(true);
    // Members' work loops stop with home's; what they have in flight
    // finishes, or is abandoned at the deadline with the rest.
    shared.stop_work();
    let finished = tokio::time::timeout(SHUTDOWN_WITHIN, async {
        for task in working {
            let _ = task.await;
        }
    })
    .await;
    if finished.is_err() {
        info!("in-flight work abandoned after the shutdown deadline");
    }
    shutdown_step(2, "in-flight work finished");
    for task in tasks {
        task.abort();
    }
    shared.members.stop_all();
    shutdown_step(3, "every other task stopped");
}

/// Work pending counts for the health check only where this process
/// should do it: the leader.
fn watch_pending_work(health: &Health, shared: &Arc<Shared>) {
    let shared = Arc::downgrade(shared);
    health.watch_work(move || {
        shared
            .upgrade()
            .is_some_and(|s| s.home.cluster.writer.leads() && !s.home.queue.is_empty())
    });
}
