//! Leader election on a coordination.k8s.io/v1 Lease: only the holder
//! writes; a standby keeps its caches warm and takes over when the Lease
//! expires or is released.
//!
//! The algorithm is client-go's (`tools/leaderelection`): every retry period
//! each candidate reads the Lease; the holder renews it, a candidate takes it
//! when it is free or has not been renewed for its duration (measured on the
//! candidate's own clock, from when it last saw the Lease change, so clock
//! skew does not matter). Every write carries the resourceVersion read, so
//! two candidates never both win. On shutdown the leader clears the holder,
//! and a standby takes over within one retry period.
//!
//! Leadership is bounded in time, not only a flag: it lasts until the start
//! of the last successful round plus the renew deadline, on the monotonic
//! clock. A standby cannot take the Lease before it has seen that renewal
//! (which landed after the round started) and waited a whole Lease duration,
//! which is longer than the renew deadline; so the leader stops writing
//! before anyone else may start. Every Lease request has a timeout, so a
//! hung connection costs a round and never freezes the election, and the
//! gate closes at its deadline even while a request hangs. `is_leader`
//! checks the deadline itself: a process resumed after SIGSTOP refuses to
//! write before any of its tasks has run.
//!
//! Why not a crate: kube ships no Lease election, and this module first
//! wrapped kube-lease-manager 0.13, whose state reached us as a flag. It
//! was replaced so that a released Lease wakes the standby within one
//! retry period; since then leadership is a deadline, which closes the
//! write gate before any standby may take the Lease, even while a renewal
//! hangs. No measurement compared the two: the reasons are behaviour, which
//! the tests bound (`tests/suite/operations.rs`: takeover after SIGKILL and after
//! SIGTERM; `tests/suite/leader.rs`: a leader paused or cut off writes nothing
//! beside the new one). Documented, not benchmarked: after SIGTERM a
//! standby takes over within a second or two (docs/operations.md).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
// Tokio's clock is the monotonic one (it keeps running while the process is
// stopped) and can be paused in unit tests.
use tokio::time::Instant;
use tracing::{info, warn};

use crate::FIELD_MANAGER;
use crate::ops::metrics::Metrics;

/// The instant this process's leadership runs out; shared by the election
/// and every gate. `None`: not leading.
#[derive(Clone, Default)]
struct Deadline(Arc<Mutex<Option<Instant>>>);

impl Deadline {
    fn get(&self) -> Option<Instant> {
        // An Instant is Copy: a poisoned lock cannot hold a torn value.
        *crate::sync::lock(&self.0)
    }

    fn set(&self, until: Option<Instant>) {
        *crate::sync::lock(&self.0) = until;
    }

    fn holds_at(&self, now: Instant) -> bool {
        self.get().is_some_and(|until| now < until)
    }
}

/// Whether this process may write now, and a way to wait until it may.
#[derive(Clone)]
pub(crate) struct LeaderGate {
    receiver: watch::Receiver<bool>,
    /// Set under an election; without one the flag alone decides.
    deadline: Option<Deadline>,
}

impl LeaderGate {
    pub(crate) fn always() -> (Self, watch::Sender<bool>) {
        let (sender, receiver) = watch::channel(true);
        (
            Self {
                receiver,
                deadline: None,
            },
            sender,
        )
    }

    /// The flag and, under an election, the deadline: checked here rather
    /// than left to the election task, which may not have run yet after a
    /// pause.
    pub(crate) fn is_leader(&self) -> bool {
        *self.receiver.borrow()
            && self
                .deadline
                .as_ref()
                .is_none_or(|d| d.holds_at(Instant::now()))
    }

    #[cfg(test)]
    /// Wait until this process leads; returns at once if it does.
    pub(crate) async fn wait_for_leadership(&mut self) {
        loop {
            // A closed channel means shutdown; the caller's stop signal ends the wait.
            if self.receiver.wait_for(|leading| *leading).await.is_err() {
                return;
            }
            if self.is_leader() {
                return;
            }
            // Open but run out: the election closes the gate at once, and
            // reopens it only through a change of the flag.
            if self.receiver.changed().await.is_err() {
                return;
            }
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.receiver.clone()
    }

    /// When this process's right to write runs out; `None` without an
    /// election (it never does). A write still in flight then is abandoned.
    pub(crate) fn leading_until(&self) -> Option<Instant> {
        self.deadline.as_ref().and_then(Deadline::get)
    }
}

/// The election's side of the gate.
struct Control {
    sender: watch::Sender<bool>,
    deadline: Deadline,
    renew_deadline: Duration,
    metrics: Arc<Metrics>,
    lease: String,
    identity: String,
}

impl Control {
    fn new(
        renew_deadline: Duration,
        metrics: Arc<Metrics>,
        lease: String,
        identity: String,
    ) -> (Self, LeaderGate) {
        let (sender, receiver) = watch::channel(false);
        let deadline = Deadline::default();
        let gate = LeaderGate {
            receiver,
            deadline: Some(deadline.clone()),
        };
        let control = Self {
            sender,
            deadline,
            renew_deadline,
            metrics,
            lease,
            identity,
        };
        (control, gate)
    }

    fn is_open(&self) -> bool {
        *self.sender.borrow()
    }

    /// When the gate closes unless renewed; None when closed.
    fn open_until(&self) -> Option<Instant> {
        if self.is_open() {
            self.deadline.get()
        } else {
            None
        }
    }

    /// A round that started at `started` took or renewed the Lease.
    fn renewed(&self, started: Instant) {
        let until = started + self.renew_deadline;
        let now = Instant::now();
        if until <= now {
            // The answer arrived after the deadline it would set (the process
            // was paused, or the round was slow): a standby may hold it by now.
            self.close("the renewal completed after its renew deadline");
            return;
        }
        if self.is_open() && !self.deadline.holds_at(now) {
            // Ran out before this renewal: a new term, so that waiters and
            // subscribers see the gate close and open again.
            self.close("the Lease was not renewed within the renew deadline");
        }
        self.deadline.set(Some(until));
        self.publish(true, "acquired or renewed the Lease");
    }

    fn close(&self, reason: &'static str) {
        // The deadline first: `is_leader` answers false from here on.
        self.deadline.set(None);
        self.publish(false, reason);
    }

    fn publish(&self, leading: bool, reason: &'static str) {
        if self.is_open() == leading {
            return;
        }
        info!(
            lease = self.lease.as_str(),
            identity = self.identity.as_str(),
            leading,
            reason,
            "leadership changed"
        );
        self.metrics.leader.set(i64::from(leading));
        // send_replace: the value must change even when no gate is left.
        self.sender.send_replace(leading);
    }

    /// Runs `work`, closing the gate meanwhile when its deadline passes: a
    /// hung request or a long sleep never keeps this process leading.
    async fn expiring<F: Future>(&self, work: F) -> F::Output {
        let mut work = std::pin::pin!(work);
        loop {
            let Some(until) = self.open_until() else {
                return work.await;
            };
            tokio::select! {
                // The deadline first: after a pause, expiry is handled before
                // a result that is already too late.
                biased;
                () = tokio::time::sleep_until(until) => {
                    self.close("the Lease was not renewed within the renew deadline");
                }
                output = &mut work => return output,
            }
        }
    }
}

/// Timing of an election, derived from the Lease duration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    pub(crate) lease_duration: Duration,
    /// A leader that has not renewed for this long stops writing.
    pub(crate) renew_deadline: Duration,
    /// How often candidates read and the leader renews.
    pub(crate) retry_period: Duration,
}

impl Timing {
    pub(crate) fn from_lease_duration(lease_duration: Duration) -> Self {
        Self {
            lease_duration,
            renew_deadline: lease_duration * 2 / 3,
            retry_period: (lease_duration / 7)
                .clamp(Duration::from_millis(500), Duration::from_secs(2)),
        }
    }

    /// Timeout of one Lease request: a round (a read and a write) takes at
    /// most half the renew deadline, so one hung connection leaves time for
    /// another round before leadership runs out.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.renew_deadline / 4
    }
}

/// Why a Lease request failed.
#[derive(Debug, thiserror::Error)]
enum LeaseError {
    #[error("{verb} Lease {lease}: {source}")]
    Api {
        verb: &'static str,
        lease: String,
        #[source]
        source: kube::Error,
    },
    #[error("{verb} Lease {lease}: no answer within {after:?}")]
    TimedOut {
        verb: &'static str,
        lease: String,
        after: Duration,
    },
}

impl LeaseError {
    /// Someone else wrote the Lease first (create or replace lost the race).
    fn is_conflict(&self) -> bool {
        matches!(self, LeaseError::Api { source: kube::Error::Api(status), .. } if status.code == 409)
    }
}

/// The Lease requests an election makes: the API server's, or a fake in
/// the unit tests.
trait LeaseStore: Send + Sync + 'static {
    fn get(&self) -> impl Future<Output = kube::Result<Option<Lease>>> + Send;
    fn create(&self, lease: &Lease) -> impl Future<Output = kube::Result<Lease>> + Send;
    fn replace(&self, lease: &Lease) -> impl Future<Output = kube::Result<Lease>> + Send;
}

struct ApiStore {
    api: Api<Lease>,
    name: String,
}

fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

impl LeaseStore for ApiStore {
    async fn get(&self) -> kube::Result<Option<Lease>> {
        self.api.get_opt(&self.name).await
    }

    async fn create(&self, lease: &Lease) -> kube::Result<Lease> {
        self.api.create(&write_params(), lease).await
    }

    async fn replace(&self, lease: &Lease) -> kube::Result<Lease> {
        self.api.replace(&self.name, &write_params(), lease).await
    }
}

/// What a candidate knows of the Lease between reads.
struct LeaseSeen {
    resource_version: Option<String>,
    holder: Option<String>,
    /// When the record last changed, on our own clock.
    changed_at: Instant,
}

/// Whether `me` may take or keep the Lease, given what was observed.
fn may_acquire(observed: &LeaseSeen, me: &str, lease_duration: Duration, now: Instant) -> bool {
    match observed.holder.as_deref() {
        None | Some("") => true,
        Some(holder) if holder == me => true,
        Some(_) => now.duration_since(observed.changed_at) >= lease_duration,
    }
}

struct Candidate<S> {
    store: S,
    name: String,
    /// `namespace/name`, for messages.
    lease: String,
    identity: String,
    timing: Timing,
    observed: Option<LeaseSeen>,
}

impl<S: LeaseStore> Candidate<S> {
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

    /// One Lease request, bounded so that a hung connection fails the round.
    async fn request<T>(
        &self,
        verb: &'static str,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, LeaseError> {
        let after = self.timing.request_timeout();
        match tokio::time::timeout(after, request).await {
            Ok(result) => result.map_err(|source| LeaseError::Api {
                verb,
                lease: self.lease.clone(),
                source,
            }),
            Err(_) => Err(LeaseError::TimedOut {
                verb,
                lease: self.lease.clone(),
                after,
            }),
        }
    }

    /// One round: read, then take or renew if allowed. Ok(true) when we hold it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaseError> {
        let Some(lease) = self.request("get", self.store.get()).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None)),
            };
            return match self.request("create", self.store.create(&lease)).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(e) if e.is_conflict() => Ok(false),
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
        match self.request("replace", self.store.replace(&next)).await {
            Ok(updated) => {
                self.observe(&updated);
                Ok(true)
            }
            // Someone else wrote first: they hold it.
            Err(e) if e.is_conflict() => Ok(false),
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
            self.observed = Some(LeaseSeen {
                resource_version,
                holder,
                changed_at: Instant::now(),
            });
        }
    }

    /// Clear the holder so that a standby takes over at once.
    async fn release(&mut self) -> Result<(), LeaseError> {
        let Some(mut lease) = self.request("get", self.store.get()).await? else {
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
        self.request("replace", self.store.replace(&lease))
            .await
            .map(|_| ())
    }
}

/// The election loop: a round every retry period, the gate closed at its
/// deadline whatever a round or a sleep is waiting for.
async fn run<S: LeaseStore>(
    mut candidate: Candidate<S>,
    control: Control,
    mut stop: watch::Receiver<bool>,
) {
    let timing = candidate.timing;
    loop {
        let started = Instant::now();
        // Bounded as a whole too, whatever the store does: no round outlasts
        // the renew deadline.
        let round = tokio::time::timeout(timing.renew_deadline, candidate.try_acquire_or_renew());
        let outcome = tokio::select! {
            outcome = control.expiring(round) => outcome,
            _ = stop.changed() => break,
        };
        match outcome {
            Ok(Ok(true)) => control.renewed(started),
            Ok(Ok(false)) => control.close("another process holds the Lease"),
            // Still leading until the deadline, if leading: a failed round
            // is no proof that someone else holds the Lease.
            Ok(Err(e)) => warn!(
                lease = control.lease.as_str(),
                error = %e,
                leading = control.is_open(),
                "reading or renewing the Lease failed"
            ),
            Err(_) => warn!(
                lease = control.lease.as_str(),
                after = ?timing.renew_deadline,
                leading = control.is_open(),
                "a round of the election timed out"
            ),
        }
        tokio::select! {
            () = control.expiring(tokio::time::sleep(timing.retry_period)) => {}
            _ = stop.changed() => break,
        }
    }
    // Stop writing first, then hand the Lease over.
    let was_leading = control.is_open();
    control.close("shutting down");
    if was_leading {
        match candidate.release().await {
            Ok(()) => info!(lease = control.lease.as_str(), "released the Lease"),
            Err(e) => warn!(
                lease = control.lease.as_str(),
                error = %e,
                "releasing the Lease failed; a standby takes over when it expires"
            ),
        }
    }
}

/// A running election; `stop` stops writing and releases the Lease.
pub(crate) struct Election {
    lease: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

pub(crate) fn start(
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
    let timing = Timing::from_lease_duration(lease_duration);
    let candidate = Candidate {
        store: ApiStore {
            api: Api::namespaced(client, namespace),
            name: lease_name.to_owned(),
        },
        name: lease_name.to_owned(),
        lease: lease.clone(),
        identity: identity.clone(),
        timing,
        observed: None,
    };
    let (control, gate) = Control::new(timing.renew_deadline, metrics, lease.clone(), identity);
    let (stop, stop_receiver) = watch::channel(false);
    let task = tokio::spawn(run(candidate, control, stop_receiver));
    (gate, Election { lease, stop, task })
}

impl Election {
    /// Stop leading and release the Lease so that a standby takes over at once.
    pub(crate) async fn stop(self, within: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            task.abort();
            warn!(lease = self.lease.as_str(), "releasing the Lease timed out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn observed(holder: Option<&str>, age: Duration) -> (LeaseSeen, Instant) {
        let now = Instant::now();
        (
            LeaseSeen {
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
        assert!(t.lease_duration > t.renew_deadline && t.renew_deadline > t.retry_period);
        // A round is a read and a write: two rounds fit in the renew deadline.
        assert!(4 * t.request_timeout() <= t.renew_deadline);
        let short = Timing::from_lease_duration(Duration::from_secs(2));
        assert_eq!(short.retry_period, Duration::from_millis(500));
        assert!(short.renew_deadline < short.lease_duration);
    }

    const LEASE: Duration = Duration::from_secs(15);

    fn conflict() -> kube::Error {
        kube::Error::Api(
            Status::failure("the object has been modified", "Conflict")
                .with_code(409)
                .boxed(),
        )
    }

    /// A Lease held in memory, with resourceVersions like the API server's,
    /// and a switch that makes every request hang.
    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<FakeState>>);

    #[derive(Default)]
    struct FakeState {
        lease: Option<Lease>,
        version: u64,
        hang: bool,
        writes: usize,
        /// When each read started: a round starts with its read.
        reads: Vec<Instant>,
    }

    impl Fake {
        fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
            crate::sync::lock(&self.0)
        }

        fn hang(&self, hang: bool) {
            self.state().hang = hang;
        }

        fn writes(&self) -> usize {
            self.state().writes
        }

        fn reads(&self) -> Vec<Instant> {
            self.state().reads.clone()
        }

        fn holder(&self) -> Option<String> {
            self.state()
                .lease
                .as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.holder_identity.clone())
        }

        /// Another process takes the Lease (as if ours had expired).
        fn taken_by(&self, other: &str) {
            let mut state = self.state();
            state.version += 1;
            let version = state.version.to_string();
            if let Some(lease) = state.lease.as_mut() {
                lease.metadata.resource_version = Some(version);
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = Some(other.into());
                }
            }
        }

        /// Stores `lease` if `expected` is the current resourceVersion.
        fn write(&self, mut lease: Lease, expected: Option<String>) -> kube::Result<Lease> {
            let mut state = self.state();
            let current = state
                .lease
                .as_ref()
                .and_then(|l| l.metadata.resource_version.clone());
            if current != expected {
                return Err(conflict());
            }
            state.version += 1;
            state.writes += 1;
            lease.metadata.resource_version = Some(state.version.to_string());
            state.lease = Some(lease.clone());
            Ok(lease)
        }

        async fn maybe_hang(&self) {
            let hang = self.state().hang;
            if hang {
                std::future::pending::<()>().await;
            }
        }
    }

    impl LeaseStore for Fake {
        async fn get(&self) -> kube::Result<Option<Lease>> {
            self.state().reads.push(Instant::now());
            self.maybe_hang().await;
            Ok(self.state().lease.clone())
        }

        async fn create(&self, lease: &Lease) -> kube::Result<Lease> {
            self.maybe_hang().await;
            self.write(lease.clone(), None)
        }

        async fn replace(&self, lease: &Lease) -> kube::Result<Lease> {
            self.maybe_hang().await;
            self.write(lease.clone(), lease.metadata.resource_version.clone())
        }
    }

    struct Running {
        gate: LeaderGate,
        metrics: Arc<Metrics>,
        stop: watch::Sender<bool>,
        task: JoinHandle<()>,
    }

    fn elect(store: Fake) -> Running {
        let timing = Timing::from_lease_duration(LEASE);
        let metrics = Arc::new(Metrics::default());
        let candidate = Candidate {
            store,
            name: "l".into(),
            lease: "ns/l".into(),
            identity: "me".into(),
            timing,
            observed: None,
        };
        let (control, gate) = Control::new(
            timing.renew_deadline,
            metrics.clone(),
            "ns/l".into(),
            "me".into(),
        );
        let (stop, stop_receiver) = watch::channel(false);
        let task = tokio::spawn(run(candidate, control, stop_receiver));
        Running {
            gate,
            metrics,
            stop,
            task,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_whose_deadline_passed_answers_false_before_any_task_runs() {
        let renew_deadline = Timing::from_lease_duration(LEASE).renew_deadline;
        let metrics = Arc::new(Metrics::default());
        let (control, gate) =
            Control::new(renew_deadline, metrics.clone(), "ns/l".into(), "me".into());
        assert!(!gate.is_leader(), "closed before the first renewal");
        let started = Instant::now();
        control.renewed(started);
        assert!(gate.is_leader());
        assert_eq!(metrics.leader.get(), 1);

        tokio::time::advance(renew_deadline - Duration::from_millis(1)).await;
        assert!(gate.is_leader(), "1 ms before the deadline");
        // No task closes the flag here: the gate alone must refuse.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(*gate.subscribe().borrow(), "the flag is still open");
        assert!(!gate.is_leader(), "the deadline passed");

        // A round that started before the pause and answered after it is too late.
        control.renewed(started);
        assert!(!gate.is_leader());
        assert!(!*gate.subscribe().borrow());
        assert_eq!(metrics.leader.get(), 0);

        // A fresh round opens it again, and a waiter sees it.
        let mut waiter = gate.clone();
        control.renewed(Instant::now());
        tokio::time::timeout(Duration::from_secs(1), waiter.wait_for_leadership())
            .await
            .expect("a waiter sees the gate open");
        assert!(gate.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_does_not_keep_the_gate_open_past_the_renew_deadline() {
        let timing = Timing::from_lease_duration(LEASE);
        let fake = Fake::default();
        let mut running = elect(fake.clone());
        running.gate.wait_for_leadership().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(running.gate.is_leader(), "renews while the store answers");
        assert!(fake.writes() >= 3, "renewals: {}", fake.writes());

        fake.hang(true);
        let hung_at = Instant::now();
        let last_round = fake
            .reads()
            .into_iter()
            .filter(|r| *r < hung_at)
            .max()
            .expect("rounds before the hang");
        let mut leading = running.gate.subscribe();
        tokio::time::timeout(timing.lease_duration, leading.wait_for(|leading| !*leading))
            .await
            .expect("the gate closes while the renewal hangs")
            .expect("the election runs");
        let closed_after = Instant::now() - last_round;
        assert!(
            closed_after <= timing.renew_deadline + Duration::from_millis(2),
            "the gate closed {closed_after:?} after the last successful round began"
        );
        assert!(!running.gate.is_leader());
        assert_eq!(running.metrics.leader.get(), 0);

        // Closed for good while the store hangs, past the Lease duration;
        // the rounds go on (they time out).
        let reads_before = fake.reads().len();
        tokio::time::sleep(timing.lease_duration * 2).await;
        assert!(!running.gate.is_leader());
        assert!(!*leading.borrow());
        assert!(
            fake.reads().len() >= reads_before + 3,
            "hung rounds time out and are retried"
        );

        // Back: still the holder, so it renews and leads again.
        fake.hang(false);
        running.gate.wait_for_leadership().await;
        assert_eq!(running.metrics.leader.get(), 1);
        let _ = running.stop.send(true);
        running.task.await.expect("the election ends");
        assert_eq!(fake.holder(), None, "released on stop");
        assert!(!running.gate.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_resumed_after_a_pause_finds_another_holder_and_stays_closed() {
        let fake = Fake::default();
        let mut running = elect(fake.clone());
        running.gate.wait_for_leadership().await;
        assert_eq!(fake.holder().as_deref(), Some("me"));

        // As if stopped past the Lease duration while a standby took over
        // (and keeps renewing).
        fake.taken_by("other");
        let other = fake.clone();
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                other.taken_by("other");
            }
        });
        let writes = fake.writes();
        tokio::time::advance(LEASE + Duration::from_secs(5)).await;
        assert!(!running.gate.is_leader(), "closed as soon as it resumes");

        tokio::time::sleep(LEASE * 2).await;
        assert!(!running.gate.is_leader());
        assert!(!*running.gate.subscribe().borrow());
        assert_eq!(running.metrics.leader.get(), 0);
        assert_eq!(fake.writes(), writes, "wrote the other holder's Lease");
        assert_eq!(fake.holder().as_deref(), Some("other"));

        renewing.abort();
        let _ = running.stop.send(true);
        running.task.await.expect("the election ends");
        assert_eq!(
            fake.holder().as_deref(),
            Some("other"),
            "not released: not ours"
        );
    }
}
