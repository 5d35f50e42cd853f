//! The work loops: workers that reconcile queued rules, the timer that
//! brings back rules waiting out a backoff, and the periodic resync.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use crate::api::rule::RuleKey;
use crate::controller::members::Member;
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::scope::{Scope, Touch};
use crate::sync::{lock, read};

/// Backoff of a rule whose pass failed as a whole (status or finalizer write).
fn rule_retry_delay(failures: u32) -> Duration {
    Duration::from_millis(500 * 2u64.saturating_pow(failures.min(9))).min(Duration::from_secs(300))
}

/// Run `workers` reconcile loops at home until `stop` fires.
pub(crate) async fn run_workers(
    shared: Arc<Shared>,
    workers: usize,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let home = shared.home.clone();
    run_site_workers(shared, home, workers, stop).await;
}

/// Run `workers` loops over a site's queue until `stop` fires. Its tasks
/// belong to this future: a member's site that goes (its future aborted)
/// takes its workers and timer with it.
pub(crate) async fn run_site_workers(
    shared: Arc<Shared>,
    site: Arc<Site>,
    workers: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut timer = tokio::task::JoinSet::new();
    timer.spawn({
        let site = site.clone();
        async move { site.queue.run_timer().await }
    });
    let mut loops = tokio::task::JoinSet::new();
    // A standby works too: its passes write nothing (every write asks the
    // Lease first), but they start each rule's source watches and keep
    // every cache warm, so a takeover writes at once.
    for _ in 0..workers {
        let shared = shared.clone();
        let site = site.clone();
        let mut stop = stop.clone();
        loops.spawn(async move {
            loop {
                let (key, scope) = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    next = site.queue.next() => next,
                };
                let member = match site.name.member() {
                    None => None,
                    Some(name) => match shared.members.get(name) {
                        Some(member) if Arc::ptr_eq(&member.site, &site) => Some(member),
                        // Gone from the inventory, or started again with new
                        // credentials (a site of its own): this site's
                        // passes end with it.
                        _ => return,
                    },
                };
                work_on(&shared, &site, member.as_ref(), key, scope).await;
            }
        });
    }
    let _ = stop.wait_for(|s| *s).await;
    // Each loop finishes the pass it is in.
    while loops.join_next().await.is_some() {}
    timer.abort_all();
}

/// One pass over a rule in one cluster (home, or `member`), then its
/// requeue: when the pass asks, or after a backoff that grows with the
/// rule's failed passes there (a 403 or an API server that does not answer
/// is no hot loop).
async fn work_on(
    shared: &Arc<Shared>,
    site: &Site,
    member: Option<&Arc<Member>>,
    key: RuleKey,
    scope: Scope,
) {
    let started = Instant::now();
    let result = match member {
        None => {
            let span = info_span!("reconcile", rule = %key);
            crate::controller::reconcile::reconcile(shared, &key, scope)
                .instrument(span)
                .await
        }
        Some(member) => {
            let span = info_span!("member pass", rule = %key, member = member.name());
            crate::controller::member_pass::member_pass(shared, member, &key, scope)
                .instrument(span)
                .await
        }
    };
    site.queue.done(&key);
    if member.is_none() {
        shared
            .metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        shared.health.progressed();
    }
    let failures = failed_passes(site, &key, result.is_ok());
    if member.is_none() && !read(&shared.rules).contains_key(&key) {
        // Gone while its pass ran: nothing of it stays behind.
        shared.drop_memory(&key);
        return;
    }
    match result {
        Ok(requeue) => {
            if member.is_none() {
                shared.metrics.reconciled("success");
            }
            site.queue.release(&key);
            if let Some(delay) = requeue {
                site.queue.add_after(key, delay);
            }
        }
        Err(error) => {
            let delay = rule_retry_delay(failures);
            match member {
                None => {
                    shared.metrics.reconciled("error");
                    warn!(rule = %key, error = %error, retry_in = ?delay, "reconcile failed");
                }
                // Said in the rule's status at home (the member's reach).
                Some(member) => {
                    debug!(rule = %key, member = member.name(), error = %error, retry_in = ?delay, "member pass failed");
                }
            }
            // What the failed pass was to look at is not known to be done.
            site.queue.carry(&key, Scope::everything());
            site.queue.hold(key, delay);
        }
    }
}

/// The rule's failed passes in a row in `site`, after one that
/// succeeded (`ok`) or failed.
fn failed_passes(site: &Site, key: &RuleKey, ok: bool) -> u32 {
    let mut memory = lock(&site.memory);
    match (ok, memory.get_mut(key)) {
        (true, Some(memory)) => {
            memory.failures = 0;
            0
        }
        (true, None) => 0,
        (false, _) => {
            let memory = memory.entry(key.clone()).or_default();
            memory.failures += 1;
            memory.failures
        }
    }
}

/// Reconcile every rule again every `interval`, forgetting known conflicts
/// so that a foreign object that went away is noticed; and whenever this
/// process becomes the leader, since a standby's queue may be stale.
pub(crate) async fn run_resync(
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
                let members = shared.members.all();
                for site in std::iter::once(&shared.home).chain(members.iter().map(|m| &m.site)) {
                    for memory in lock(&site.memory).values_mut() {
                        memory.known_conflicts.clear();
                    }
                    lock(&site.backoffs).sweep(Instant::now());
                }
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
        for key in &keys {
            shared.queue_everywhere(key, Touch::All);
        }
        shared.retire_left_members();
    }
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
