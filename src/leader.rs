//! Leader election on a coordination.k8s.io/v1 Lease: only the holder
//! writes; a standby keeps its caches warm and takes over when the Lease
//! expires or is released.
//!
//! The algorithm is client-go's: every retry period each candidate reads
//! the Lease; the holder renews it, a candidate takes it when it is free or
//! has not been renewed for its duration (measured on the candidate's own
//! clock, from when it last saw the Lease change, so clock skew does not
//! matter). Every write carries the resourceVersion read, so two candidates
//! never both win. A leader that cannot renew within two thirds of the
//! duration stops writing before anyone else may take over. On shutdown the
//! leader clears the holder, and a standby takes over within one retry period.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::{FIELD_MANAGER, Result};

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
        // A closed channel means shutdown; the caller's stop signal ends the wait.
        let _ = self.receiver.wait_for(|leading| *leading).await;
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.receiver.clone()
    }
}

/// Timing of an election, derived from the Lease duration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops writing.
    pub renew_deadline: Duration,
    /// How often candidates read and the leader renews.
    pub retry_period: Duration,
}

impl Timing {
    pub fn from_lease_duration(lease_duration: Duration) -> Self {
        Self {
            lease_duration,
            renew_deadline: lease_duration * 2 / 3,
            retry_period: (lease_duration / 7)
                .clamp(Duration::from_millis(500), Duration::from_secs(2)),
        }
    }
}

/// What a candidate knows of the Lease between reads.
struct Observed {
    resource_version: Option<String>,
    holder: Option<String>,
    /// When the record last changed, on our own clock.
    changed_at: Instant,
}

/// Whether `me` may take or keep the Lease, given what was observed.
fn may_acquire(observed: &Observed, me: &str, lease_duration: Duration, now: Instant) -> bool {
    match observed.holder.as_deref() {
        None | Some("") => true,
        Some(holder) if holder == me => true,
        Some(_) => now.duration_since(observed.changed_at) >= lease_duration,
    }
}

struct Candidate {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    observed: Option<Observed>,
}

impl Candidate {
    fn spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let ours =
            previous.and_then(|s| s.holder_identity.as_deref()) == Some(self.identity.as_str());
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: if ours {
                previous.and_then(|s| s.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
            ..Default::default()
        }
    }

    /// One round: read, then take or renew if allowed. Ok(true) when we hold it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None)),
            };
            return match self.api.create(&params, &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        self.observe(&lease);
        let Some(observed) = &self.observed else {
            return Ok(false);
        };
        if !may_acquire(
            observed,
            &self.identity,
            self.timing.lease_duration,
            Instant::now(),
        ) {
            return Ok(false);
        }
        let mut next = lease.clone();
        next.spec = Some(self.spec(lease.spec.as_ref()));
        match self.api.replace(&self.name, &params, &next).await {
            Ok(updated) => {
                self.observe(&updated);
                Ok(true)
            }
            // Someone else wrote first: they hold it.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn observe(&mut self, lease: &Lease) {
        let resource_version = lease.metadata.resource_version.clone();
        let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        let unchanged = self
            .observed
            .as_ref()
            .is_some_and(|o| o.resource_version == resource_version);
        if !unchanged {
            self.observed = Some(Observed {
                resource_version,
                holder,
                changed_at: Instant::now(),
            });
        }
    }

    /// Clear the holder so that a standby takes over at once.
    async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.api
            .replace(&self.name, &params, &lease)
            .await
            .map(|_| ())
    }
}

/// A running election; `stop` stops writing and releases the Lease.
pub struct Election {
    lease: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

pub fn start(
    client: Client,
    namespace: &str,
    lease_name: &str,
    lease_duration: Duration,
    metrics: Arc<Metrics>,
) -> (LeaderGate, Election) {
    let identity = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "copyrator".into());
    let identity = format!("{identity}-{}", std::process::id());
    let lease = format!("{namespace}/{lease_name}");
    let mut candidate = Candidate {
        api: Api::namespaced(client, namespace),
        name: lease_name.to_owned(),
        identity,
        timing: Timing::from_lease_duration(lease_duration),
        observed: None,
    };
    let (gate_sender, gate_receiver) = watch::channel(false);
    let (stop, mut stop_receiver) = watch::channel(false);
    let lease_for_task = lease.clone();
    let task = tokio::spawn(async move {
        let lease = lease_for_task.as_str();
        let mut last_renewal: Option<Instant> = None;
        loop {
            let leading = match candidate.try_acquire_or_renew().await {
                Ok(true) => {
                    last_renewal = Some(Instant::now());
                    true
                }
                Ok(false) => {
                    last_renewal = None;
                    false
                }
                Err(e) => {
                    warn!(lease, error = %e, "reading or renewing the Lease failed");
                    // Keep leading only while the last renewal is fresh enough.
                    last_renewal.is_some_and(|t| t.elapsed() < candidate.timing.renew_deadline)
                }
            };
            if *gate_sender.borrow() != leading {
                info!(
                    lease,
                    identity = candidate.identity.as_str(),
                    leading,
                    "leadership changed"
                );
                metrics.leader.set(i64::from(leading));
                let _ = gate_sender.send(leading);
            }
            tokio::select! {
                _ = tokio::time::sleep(candidate.timing.retry_period) => {}
                _ = stop_receiver.changed() => break,
            }
        }
        // Stop writing first, then hand the Lease over.
        let was_leading = *gate_sender.borrow();
        metrics.leader.set(0);
        let _ = gate_sender.send(false);
        if was_leading {
            match candidate.release().await {
                Ok(()) => info!(lease, "released the Lease"),
                Err(e) => {
                    warn!(lease, error = %e, "releasing the Lease failed; a standby takes over when it expires")
                }
            }
        }
    });
    (
        LeaderGate {
            receiver: gate_receiver,
        },
        Election { lease, stop, task },
    )
}

impl Election {
    /// Stop leading and release the Lease so that a standby takes over at once.
    pub async fn stop(self, within: Duration) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(within, self.task).await.is_err() {
            warn!(lease = self.lease.as_str(), "releasing the Lease timed out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(holder: Option<&str>, age: Duration) -> (Observed, Instant) {
        let now = Instant::now();
        (
            Observed {
                resource_version: Some("1".into()),
                holder: holder.map(str::to_owned),
                changed_at: now.checked_sub(age).unwrap_or(now),
            },
            now,
        )
    }

    #[test]
    fn free_expired_and_own_leases_may_be_taken() {
        let duration = Duration::from_secs(15);
        let (o, now) = observed(None, Duration::ZERO);
        assert!(may_acquire(&o, "me", duration, now));
        let (o, now) = observed(Some(""), Duration::ZERO);
        assert!(may_acquire(&o, "me", duration, now));
        let (o, now) = observed(Some("me"), Duration::from_secs(1));
        assert!(may_acquire(&o, "me", duration, now));
        let (o, now) = observed(Some("other"), Duration::from_secs(14));
        assert!(
            !may_acquire(&o, "me", duration, now),
            "another holder's fresh Lease"
        );
        let (o, now) = observed(Some("other"), Duration::from_secs(16));
        assert!(
            may_acquire(&o, "me", duration, now),
            "not renewed for its duration"
        );
    }

    #[test]
    fn timing_renews_well_before_expiry() {
        let t = Timing::from_lease_duration(Duration::from_secs(15));
        assert_eq!(t.retry_period, Duration::from_secs(2));
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        let short = Timing::from_lease_duration(Duration::from_secs(2));
        assert_eq!(short.retry_period, Duration::from_millis(500));
        assert!(short.renew_deadline < short.lease_duration);
    }
}
