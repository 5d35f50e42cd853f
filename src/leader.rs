//! Leader election on a coordination.k8s.io/v1 Lease (kube-lease-manager):
//! only the holder writes; a standby keeps its caches warm and takes over
//! when the Lease expires or is released.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::{Error, Result};

/// Whether this process may write now, and a way to wait until it may.
#[derive(Clone)]
pub struct LeaderGate {
    receiver: watch::Receiver<bool>,
}

impl LeaderGate {
    pub fn always() -> (Self, watch::Sender<bool>) {
        let (sender, receiver) = watch::channel(true);
        (Self { receiver }, sender)
    }

    pub fn is_leader(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Wait until this process leads; returns at once if it does.
    pub async fn wait_for_leadership(&mut self) {
        // A closed channel means shutdown; the caller's shutdown signal ends it.
        let _ = self.receiver.wait_for(|leading| *leading).await;
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.receiver.clone()
    }
}

/// A running election; `stop` releases the Lease.
pub struct Election {
    lease: String,
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    manager: JoinHandle<kube_lease_manager::Result<LeaseManager>>,
}

pub async fn start(
    client: Client,
    namespace: &str,
    lease_name: &str,
    lease_duration: Duration,
    metrics: Arc<Metrics>,
) -> Result<(LeaderGate, Election)> {
    let identity = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "copyrator".into());
    let identity = format!("{identity}-{}", std::process::id());
    let seconds = lease_duration.as_secs().max(2);
    let manager = LeaseManagerBuilder::new(client, lease_name)
        .with_namespace(namespace)
        .with_identity(&identity)
        .with_duration(seconds)
        .with_grace((seconds / 3).max(1))
        .with_field_manager(crate::FIELD_MANAGER)
        .build()
        .await
        .map_err(|e| Error::Leader {
            lease: format!("{namespace}/{lease_name}"),
            detail: e.to_string(),
        })?;
    let (mut lease_state, manager) = manager.watch().await;
    let (gate_sender, gate_receiver) = watch::channel(false);
    let (stop, mut stop_receiver) = watch::channel(false);
    let lease = format!("{namespace}/{lease_name}");
    let lease_for_task = lease.clone();
    let task = tokio::spawn(async move {
        loop {
            let leading = *lease_state.borrow_and_update();
            if *gate_sender.borrow() != leading {
                info!(
                    lease = lease_for_task.as_str(),
                    identity = identity.as_str(),
                    leading,
                    "leadership changed"
                );
            }
            metrics.leader.set(i64::from(leading));
            let _ = gate_sender.send(leading);
            tokio::select! {
                changed = lease_state.changed() => if changed.is_err() {
                    warn!(lease = lease_for_task.as_str(), "the lease manager stopped");
                    metrics.leader.set(0);
                    let _ = gate_sender.send(false);
                    return;
                },
                _ = stop_receiver.changed() => {
                    // Stop writing first; dropping the lease state then releases the Lease.
                    metrics.leader.set(0);
                    let _ = gate_sender.send(false);
                    return;
                }
            }
        }
    });
    Ok((
        LeaderGate {
            receiver: gate_receiver,
        },
        Election {
            lease,
            task,
            stop,
            manager,
        },
    ))
}

impl Election {
    /// Stop leading and release the Lease so that a standby takes over at once.
    pub async fn stop(self, within: Duration) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        match tokio::time::timeout(within, self.manager).await {
            Ok(Ok(Ok(_))) => info!(lease = self.lease.as_str(), "released the Lease"),
            Ok(Ok(Err(e))) => {
                warn!(lease = self.lease.as_str(), error = %e, "releasing the Lease failed")
            }
            Ok(Err(e)) => {
                warn!(lease = self.lease.as_str(), error = %e, "the lease manager task failed")
            }
            Err(_) => warn!(lease = self.lease.as_str(), "releasing the Lease timed out"),
        }
    }
}
