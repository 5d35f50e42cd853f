//! The work loops: workers that reconcile queued rules, the timer that
//! brings back rules waiting out a backoff, and the periodic resync.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use crate::api::rule::RuleKey;
use crate::cluster::sources::Sources;
use crate::controller::state::Shared;
use crate::core::scope::{Scope, Touch};
use crate::sync::{lock, read};

/// Backoff of a rule whose pass failed as a whole (status or finalizer write).
fn rule_retry_delay(failures: u32) -> Duration {
    Duration::from_millis(500 * 2u64.saturating_pow(failures.min(9))).min(Duration::from_secs(300))
}

/// Run `workers` reconcile loops until `stop` fires.
pub async fn run_workers(
    shared: Arc<Shared>,
    workers: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let timer = tokio::spawn({
        let shared = shared.clone();
        async move { shared.queue.run_timer().await }
    });
    let mut handles = Vec::new();
    // A standby works too: its passes write nothing (every write asks the
    // Lease first), but they start each rule's source watches and keep
    // every cache warm, so a takeover writes at once.
    for _ in 0..workers {
        let shared = shared.clone();
        let mut stop = stop.clone();
        handles.push(tokio::spawn(async move {
            loop {
                let (key, scope) = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    next = shared.queue.next() => next,
                };
                work_on(&shared, key, scope).await;
            }
        }));
    }
    let _ = stop.wait_for(|s| *s).await;
    for handle in handles {
        let _ = handle.await;
    }
    timer.abort();
}

async fn work_on(shared: &Arc<Shared>, key: RuleKey, scope: Scope) {
    let started = Instant::now();
    let span = info_span!("reconcile", rule = %key);
    let result = crate::controller::reconcile::reconcile(shared, &key, scope)
        .instrument(span)
        .await;
    shared
        .metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    shared.queue.done(&key);
    shared.health.progressed();
    let failures = {
        let mut memory = lock(&shared.memory);
        match (&result, memory.get_mut(&key)) {
            (Ok(_), Some(memory)) => {
                memory.failures = 0;
                0
            }
            (Ok(_), None) => 0,
            (Err(_), _) => {
                let memory = memory.entry(key.clone()).or_default();
                memory.failures += 1;
                memory.failures
            }
        }
    };
    if !read(&shared.rules).contains_key(&key) {
        // Gone while its pass ran: nothing of it stays behind.
        shared.drop_memory(&key);
        return;
    }
    match result {
        Ok(requeue) => {
            shared.metrics.reconciled("success");
            shared.queue.release(&key);
            if let Some(delay) = requeue {
                shared.queue.add_after(key, delay);
            }
        }
        Err(error) => {
            shared.metrics.reconciled("error");
            // Exponential backoff per rule, so a 403 or a dead API server is no hot loop.
            let delay = rule_retry_delay(failures);
            warn!(rule = %key, error = %error, retry_in = ?delay, "reconcile failed");
            // What the failed pass was to look at is not known to be done.
            shared.queue.carry(&key, Scope::everything());
            shared.queue.hold(key, delay);
        }
    }
}

/// Reconcile every rule again every `interval`, forgetting known conflicts
/// so that a foreign object that went away is noticed; and whenever this
/// process becomes the leader, since a standby's queue may be stale.
pub async fn run_resync(
    shared: Arc<Shared>,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
    let mut leading = shared.leader.subscribe();
    let mut election_running = true;
    // Copies of rules deleted while no operator ran.
    crate::controller::finalizer::collect_orphans(&shared, "start").await;
    shared.metrics.resynced("start");
    loop {
        // The select only decides; awaiting inside it would hold the stop
        // signal's guard across the await.
        let cause = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = ticker.tick() => {
                for memory in lock(&shared.memory).values_mut() {
                    memory.known_conflicts.clear();
                }
                lock(&shared.backoffs).sweep(Instant::now());
                // Names of namespaces and sources that are gone.
                crate::cache::intern::sweep();
                "interval"
            }
            changed = leading.changed(), if election_running => {
                // A closed channel means the election ended (shutdown).
                election_running = changed.is_ok();
                let now_leading = election_running && *leading.borrow_and_update();
                if !now_leading {
                    continue;
                }
                "leading"
            }
        };
        crate::controller::finalizer::collect_orphans(&shared, cause).await;
        shared.metrics.resynced(cause);
        // A kind no rule needs any more (one changed its kind, orphans went).
        crate::controller::kinds::release_unused(&shared);
        let keys: Vec<RuleKey> = read(&shared.rules).keys().cloned().collect();
        debug!(rules = keys.len(), "reconciling every rule");
        shared.queue.add_all(keys, Touch::All);
    }
}

/// Whether a rule's sources are listed (for `plan`, which waits for them).
pub fn sources_ready(shared: &Shared, key: &RuleKey) -> bool {
    matches!(
        lock(&shared.cluster.sources).sources(key),
        Sources::Listed(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_retries_double_to_five_minutes() {
        assert_eq!(rule_retry_delay(1), Duration::from_secs(1));
        assert_eq!(rule_retry_delay(2), Duration::from_secs(2));
        assert_eq!(rule_retry_delay(30), Duration::from_secs(256));
    }
}
