//! When a copy may be written again: per-object exponential backoff for
//! failed writes, and for copies that another writer keeps changing back
//! (contested copies). Plain data, no I/O; time is passed in.
//!
//! A failed write of a copy is retried only when its backoff expires or
//! when what should be written changes (the source, the rule, the target
//! namespace). A restore of a copy that someone changed back is allowed at
//! once the first time and then with doubling delays, so that two writers
//! that disagree settle into a slow exchange instead of a hot loop; only a
//! restore that was written counts (a refused one fought nobody).
//!
//! Refused writes (403, an admission policy, a quota) of one rule share a
//! gate: while it is shut, one of them at a time (a probe, taken in turn)
//! is tried on a short doubling schedule; when a probe goes through, the
//! cause is lifted and every refused copy of the rule goes at once.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::kinds::Kind;
use crate::api::rule::RuleKey;

/// `(kind, namespace, name)` of a copy.
pub(crate) type CopyKey = (Kind, String, String);

/// Restores in a row after which a copy counts as contested.
pub(crate) const CONTESTED_AFTER: u32 = 3;

/// Why a write failed, as far as when to try again is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureClass {
    /// 409: the object changed meanwhile; the next try uses fresh state.
    Conflict,
    /// 429: the API server is throttling; `Retry-After` is honoured.
    Throttled,
    /// 403, an admission policy, a quota: it will not change by itself.
    Refused,
    /// 403 to the operator itself: it may not act as the ServiceAccount
    /// the rule writes as (no `impersonate` granted). A refusal too.
    ImpersonationRefused,
    /// 422 naming a field: the object itself is invalid (an annotation too
    /// long, a bad key). Written again only when what would be written
    /// changes (the source, the rule, the target namespace), or after
    /// [`Policy::invalid_hold`].
    Invalid,
    /// 5xx, a timeout, a broken connection.
    Transient,
}

impl FailureClass {
    /// A refusal that will not change by itself: probed behind its
    /// rule's gate rather than retried on its own.
    pub(crate) fn is_refusal(self) -> bool {
        matches!(
            self,
            FailureClass::Refused | FailureClass::ImpersonationRefused
        )
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            FailureClass::Conflict => "conflict",
            FailureClass::Throttled => "throttled",
            FailureClass::Refused => "refused",
            FailureClass::ImpersonationRefused => "impersonation_refused",
            FailureClass::Invalid => "invalid",
            FailureClass::Transient => "transient",
        }
    }
}

/// A failed write: its class, the API server's own words, and how long it
/// asked us to wait.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Failure {
    pub(crate) class: FailureClass,
    pub(crate) message: String,
    pub(crate) retry_after: Option<Duration>,
}

/// The schedule: delays double from `base` up to `max`, with jitter.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// First delay after a failure that may pass by itself (409, 5xx).
    pub(crate) base: Duration,
    /// First delay after a refusal (403, 422, quota, policy).
    pub(crate) refusal_base: Duration,
    /// First delay after a 429 that gave no `Retry-After` (API Priority
    /// and Fairness gives none a client can read): short, since the writes
    /// in flight shrink with every burst of 429s (see `write_limit`).
    pub(crate) throttled_base: Duration,
    pub(crate) max: Duration,
    /// How long an invalid copy waits when nothing changes.
    pub(crate) invalid_hold: Duration,
    /// The longest wait between two probes of a rule's refused writes:
    /// how soon a lifted refusal is noticed, whatever its age.
    pub(crate) refusal_probe_max: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            refusal_base: Duration::from_secs(2),
            throttled_base: Duration::from_millis(250),
            max: Duration::from_secs(300),
            invalid_hold: Duration::from_secs(3600),
            refusal_probe_max: Duration::from_secs(6),
        }
    }
}

impl Policy {
    /// The `n`th delay (n >= 1) from `base`, jittered by ±20 %.
    fn delay(&self, base: Duration, n: u32, key: &CopyKey) -> Duration {
        self.delay_up_to(base, self.max, n, key)
    }

    /// As [`Policy::delay`], up to `max`.
    fn delay_up_to(&self, base: Duration, max: Duration, n: u32, key: &impl Hash) -> Duration {
        let exponent = n.saturating_sub(1).min(20);
        let plain = base.saturating_mul(1 << exponent).min(max);
        plain.mul_f64(jitter(key, n))
    }

    /// How long a copy must stay untouched before its contest is over.
    fn quiet_after(&self, restores: u32) -> Duration {
        let plain = self
            .base
            .saturating_mul(1 << restores.saturating_sub(1).min(20))
            .min(self.max);
        (plain * 4).max(Duration::from_secs(30))
    }
}

/// A factor in [0.8, 1.2), different per copy (or rule) and per step.
fn jitter(key: &impl Hash, n: u32) -> f64 {
    0.8 + 0.4 * crate::core::jitter::fraction(&(key, n))
}

/// Whether a write may go now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Admission {
    Go,
    /// Not before `until`; `why` says what is being waited out.
    Wait {
        until: Instant,
        why: Waiting,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Waiting {
    /// The last write failed with this.
    Failed(Failure),
    /// The last write was refused (this) and the rule's refusal gate is
    /// shut: the copy may become the next probe ([`Backoffs::pick_probe`]).
    Refused(Failure),
    /// Another writer keeps changing the copy back.
    Contested { writer: String },
}

#[derive(Clone, Debug)]
struct Entry {
    rule: RuleKey,
    failures: u32,
    /// What the failed write wanted to write: a different copy may go at once.
    failed_for: u64,
    retry_at: Instant,
    last_failure: Option<Failure>,
    restores: u32,
    /// Someone else deleted the copy Copyrator wrote for this hash.
    deleted_for: Option<u64>,
    next_restore_at: Option<Instant>,
    last_restore: Option<Instant>,
    /// The write admitted last restores what this writer changed back; it
    /// counts as a restore once it is written.
    restoring: Option<String>,
    writer: String,
    announced: bool,
}

impl Entry {
    fn new(rule: &RuleKey, now: Instant) -> Self {
        Self {
            rule: rule.clone(),
            failures: 0,
            failed_for: 0,
            retry_at: now,
            last_failure: None,
            restores: 0,
            deleted_for: None,
            next_restore_at: None,
            last_restore: None,
            restoring: None,
            writer: String::new(),
            announced: false,
        }
    }

    fn is_contested(&self) -> bool {
        self.restores >= CONTESTED_AFTER
    }

    fn is_refused(&self) -> bool {
        self.failures > 0
            && self
                .last_failure
                .as_ref()
                .is_some_and(|f| f.class.is_refusal())
    }
}

/// A rule's refused writes: when the next probe may go, and which copy
/// went last (probes are taken in turn, so that a refusal lifted in one
/// namespace is found even while another namespace still refuses).
#[derive(Clone, Debug)]
struct RefusalGate {
    probes: u32,
    probe_at: Instant,
    last_probe: Option<CopyKey>,
}

/// A contested copy, for the status and the Event.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Contest {
    pub(crate) kind: Kind,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) writer: String,
}

/// Backoff state of the copies that need it (failed or contested); copies
/// that are simply right take no memory here.
#[derive(Default)]
pub(crate) struct Backoffs {
    policy: Policy,
    entries: HashMap<CopyKey, Entry>,
    gates: HashMap<RuleKey, RefusalGate>,
}

impl Backoffs {
    #[cfg(test)]
    pub(crate) fn new(policy: Policy) -> Self {
        Self {
            policy,
            entries: HashMap::new(),
            gates: HashMap::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// May `rule` write `wanted` (a hash of what it would write) to `key`
    /// now? `changed_back_by` is set when the write restores what the rule
    /// wrote before and someone changed since (the name of that writer).
    pub(crate) fn admit(
        &mut self,
        key: &CopyKey,
        rule: &RuleKey,
        wanted: u64,
        changed_back_by: Option<&str>,
        now: Instant,
    ) -> Admission {
        if let Some(entry) = self.entries.get_mut(key)
            && entry.failures > 0
        {
            {
                if entry.failed_for == wanted
                    && entry.is_refused()
                    && let Some(gate) = self.gates.get(rule)
                {
                    return Admission::Wait {
                        until: gate.probe_at,
                        why: Waiting::Refused(entry.last_failure.clone().unwrap_or(Failure {
                            class: FailureClass::Refused,
                            message: "an earlier write was refused".into(),
                            retry_after: None,
                        })),
                    };
                }
                if entry.failed_for == wanted && now < entry.retry_at {
                    return Admission::Wait {
                        until: entry.retry_at,
                        why: Waiting::Failed(entry.last_failure.clone().unwrap_or(Failure {
                            class: FailureClass::Transient,
                            message: "an earlier write failed".into(),
                            retry_after: None,
                        })),
                    };
                }
                if entry.failed_for != wanted {
                    // Something relevant changed: try the new content now.
                    entry.failures = 0;
                }
            }
        }
        let Some(writer) = changed_back_by else {
            return Admission::Go;
        };
        let policy = self.policy;
        let entry = self
            .entries
            .entry(key.clone())
            .or_insert_with(|| Entry::new(rule, now));
        if entry
            .last_restore
            .is_some_and(|last| now.duration_since(last) > policy.quiet_after(entry.restores))
        {
            // The last contest is long over: this is a new one.
            entry.restores = 0;
            entry.next_restore_at = None;
            entry.announced = false;
        }
        if let Some(at) = entry.next_restore_at
            && now < at
        {
            return Admission::Wait {
                until: at,
                why: Waiting::Contested {
                    writer: entry.writer.clone(),
                },
            };
        }
        entry.restoring = Some(writer.to_owned());
        Admission::Go
    }

    /// Of `candidates`, the copies of `rule` that wait behind its refusal
    /// gate in this pass ([`Waiting::Refused`]), the one to try now as the
    /// gate's probe, if a probe is due: the next after the last one tried,
    /// in key order. The next probe is due one step later, unless this one
    /// goes through ([`Backoffs::succeeded`] opens the gate).
    pub(crate) fn pick_probe(
        &mut self,
        rule: &RuleKey,
        candidates: &[CopyKey],
        now: Instant,
    ) -> Option<CopyKey> {
        let policy = self.policy;
        let gate = self.gates.get_mut(rule)?;
        if now < gate.probe_at {
            return None;
        }
        let next = match &gate.last_probe {
            Some(last) => candidates
                .iter()
                .filter(|c| *c > last)
                .min()
                .or_else(|| candidates.iter().min()),
            None => candidates.iter().min(),
        }?
        .clone();
        gate.probes += 1;
        gate.probe_at = now
            + policy.delay_up_to(
                policy.refusal_base,
                policy.refusal_probe_max,
                gate.probes,
                rule,
            );
        gate.last_probe = Some(next.clone());
        Some(next)
    }

    /// When `rule`'s next refusal probe is due, while its gate is shut.
    pub(crate) fn next_probe(&self, rule: &RuleKey) -> Option<Instant> {
        self.gates.get(rule).map(|g| g.probe_at)
    }

    /// Someone else deleted the copy Copyrator wrote for `written_for`.
    pub(crate) fn deleted_by_others(
        &mut self,
        key: &CopyKey,
        rule: &RuleKey,
        written_for: u64,
        now: Instant,
    ) {
        self.entries
            .entry(key.clone())
            .or_insert_with(|| Entry::new(rule, now))
            .deleted_for = Some(written_for);
    }

    /// Whether creating `wanted` at `key` puts back a copy someone deleted.
    pub(crate) fn was_deleted_by_others(&self, key: &CopyKey, wanted: u64) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| e.deleted_for == Some(wanted))
    }

    /// The write went through at `now`: its failure backoff is over (a
    /// contest is not: it ends when the copy stays quiet), and a restore
    /// counts. A refused write that went through means the refusal is
    /// lifted: every refused copy of its rule may go now. Returns whether
    /// that released copies (the rule wants a pass at once).
    pub(crate) fn succeeded(&mut self, key: &CopyKey, now: Instant) -> bool {
        let policy = self.policy;
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        let was_refused = entry.is_refused();
        if let Some(writer) = entry.restoring.take() {
            if entry
                .last_restore
                .is_some_and(|last| now.duration_since(last) > policy.quiet_after(entry.restores))
            {
                // The last contest is long over: this is a new one.
                entry.restores = 0;
                entry.announced = false;
            }
            entry.restores += 1;
            entry.last_restore = Some(now);
            // The first change back may be a person's edit: the next
            // restore goes at once too; from then on the delays double.
            entry.next_restore_at = Some(match entry.restores {
                1 => now,
                n => now + policy.delay(policy.base, n - 1, key),
            });
            entry.writer = writer;
        }
        let rule = entry.rule.clone();
        self.settle(key);
        if !was_refused {
            return false;
        }
        self.gates.remove(&rule);
        let mut released = false;
        for entry in self.entries.values_mut() {
            if entry.rule == rule && entry.is_refused() {
                entry.failures = 0;
                entry.last_failure = None;
                released = true;
            }
        }
        self.entries
            .retain(|_, e| e.failures > 0 || e.restores > 0 || e.deleted_for.is_some());
        released
    }

    /// No write is owed at `key` any more (the place turned out to hold a
    /// foreign object): an earlier failure is moot, and no restore was made.
    pub(crate) fn no_longer_owed(&mut self, key: &CopyKey) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.restoring = None;
        }
        self.settle(key);
    }

    fn settle(&mut self, key: &CopyKey) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.failures = 0;
            entry.last_failure = None;
            entry.deleted_for = None;
            if entry.restores == 0 {
                self.entries.remove(key);
            }
        }
    }

    /// The write failed; returns when it may be tried again.
    pub(crate) fn failed(
        &mut self,
        key: &CopyKey,
        rule: &RuleKey,
        wanted: u64,
        failure: Failure,
        now: Instant,
    ) -> Instant {
        let policy = self.policy;
        let entry = self
            .entries
            .entry(key.clone())
            .or_insert_with(|| Entry::new(rule, now));
        if entry.failed_for != wanted {
            entry.failures = 0;
        }
        entry.failures += 1;
        entry.failed_for = wanted;
        entry.restoring = None;
        if failure.class.is_refusal() {
            // Refused writes wait behind their rule's gate; a refusal that
            // finds no gate (the first, or one after the gate opened) shuts it.
            let rule = rule.clone();
            let gate = self
                .gates
                .entry(rule.clone())
                .or_insert_with(|| RefusalGate {
                    probes: 0,
                    probe_at: now,
                    last_probe: None,
                });
            if gate.probes == 0 && gate.probe_at <= now {
                gate.probes = 1;
                gate.probe_at = now
                    + policy.delay_up_to(policy.refusal_base, policy.refusal_probe_max, 1, &rule);
            }
            let probe_at = gate.probe_at;
            entry.retry_at = probe_at;
            entry.last_failure = Some(failure);
            return probe_at;
        }
        let base = match failure.class {
            FailureClass::Refused | FailureClass::ImpersonationRefused => policy.refusal_base,
            FailureClass::Throttled => policy.throttled_base,
            _ => policy.base,
        };
        let mut delay = match failure.class {
            FailureClass::Invalid => policy.invalid_hold,
            _ => policy.delay(base, entry.failures, key),
        };
        if let Some(asked) = failure.retry_after {
            delay = delay.max(asked.min(policy.max));
        }
        entry.retry_at = now + delay;
        entry.last_failure = Some(failure);
        entry.retry_at
    }

    /// Copies of `rule` whose last write failed, with the failure and when
    /// they may be tried again.
    pub(crate) fn failures(&self, rule: &RuleKey) -> Vec<(CopyKey, Failure, Instant)> {
        let probe_at = self.next_probe(rule);
        self.entries
            .iter()
            .filter(|(_, e)| e.rule == *rule)
            .filter_map(|(key, e)| {
                let retry_at = match probe_at {
                    Some(at) if e.is_refused() => at,
                    _ => e.retry_at,
                };
                e.last_failure
                    .clone()
                    .map(|failure| (key.clone(), failure, retry_at))
            })
            .collect()
    }

    /// Contested copies of `rule`, sorted.
    pub(crate) fn contested(&self, rule: &RuleKey) -> Vec<Contest> {
        let mut out: Vec<Contest> = self
            .entries
            .iter()
            .filter(|(_, e)| e.rule == *rule && e.is_contested())
            .map(|((kind, namespace, name), e)| Contest {
                kind: *kind,
                namespace: namespace.clone(),
                name: name.clone(),
                writer: e.writer.clone(),
            })
            .collect();
        out.sort();
        out
    }

    /// Contests of `rule` not announced yet; they count as announced now.
    pub(crate) fn take_unannounced(&mut self, rule: &RuleKey) -> Vec<Contest> {
        let mut out = Vec::new();
        for ((kind, namespace, name), entry) in &mut self.entries {
            if entry.rule == *rule && entry.is_contested() && !entry.announced {
                entry.announced = true;
                out.push(Contest {
                    kind: *kind,
                    namespace: namespace.clone(),
                    name: name.clone(),
                    writer: entry.writer.clone(),
                });
            }
        }
        out.sort();
        out
    }

    /// Every contested copy of every rule.
    pub(crate) fn contested_total(&self) -> usize {
        self.entries.values().filter(|e| e.is_contested()).count()
    }

    /// The rule changed or went away: everything it waited for may go now.
    pub(crate) fn forget_rule(&mut self, rule: &RuleKey) {
        self.entries.retain(|_, e| e.rule != *rule);
        self.gates.remove(rule);
    }

    /// RBAC changed: the refused writes of `rules` (those that write as a
    /// ServiceAccount, whose rights just may have changed) may go now.
    pub(crate) fn forget_refusals_of(&mut self, rules: &std::collections::HashSet<RuleKey>) {
        self.entries.retain(|_, e| {
            if rules.contains(&e.rule) && e.is_refused() {
                e.failures = 0;
                e.last_failure = None;
            }
            e.failures > 0 || e.restores > 0
        });
        self.gates.retain(|rule, _| !rules.contains(rule));
    }

    /// A namespace changed: failed writes into it may go now.
    pub(crate) fn forget_namespace(&mut self, namespace: &str) {
        self.entries.retain(|(_, ns, _), e| {
            if ns == namespace {
                e.failures = 0;
                e.last_failure = None;
            }
            e.failures > 0 || e.restores > 0
        });
    }

    /// Drop what no longer holds anything back: contests that went quiet,
    /// failures whose retry time passed long ago (the copy is no longer
    /// wanted, or was written by another path).
    pub(crate) fn sweep(&mut self, now: Instant) {
        let policy = self.policy;
        self.entries.retain(|_, e| {
            let failing = e.failures > 0 && now < e.retry_at + policy.max * 2;
            let contesting = e
                .last_restore
                .is_some_and(|last| now.duration_since(last) <= policy.quiet_after(e.restores));
            failing || contesting
        });
        let entries = &self.entries;
        self.gates
            .retain(|rule, _| entries.values().any(|e| e.rule == *rule && e.is_refused()));
    }
}

/// Delays between a broken watch's attempts to come back: short, so that a
/// watch is back within seconds of the API server, and reset by the first
/// event that arrives (kube's `StreamBackoff` resets on every success).
/// A 410 Gone relists at the next attempt.
pub(crate) struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(250);
    pub(crate) const MAX: Duration = Duration::from_secs(3);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let plain = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(plain.mul_f64(0.8 + 0.4 * crate::core::jitter::fraction(&plain)))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// The pause of every watch's next request after the API server throttled
/// a read (429): its `Retry-After` (1 s when it gave none), doubling with
/// each throttled read in a row up to [`ReadPause::MAX`], with jitter. It
/// is shared by all watches, so a throttled client cools down as a whole
/// instead of reconnecting watch by watch.
#[derive(Default)]
pub(crate) struct ReadPause {
    state: std::sync::Mutex<ReadPauseState>,
    /// Told of a failed watch request that got no answer from the API
    /// server (or a 401): whoever checks its health may look at once.
    failed: tokio::sync::Notify,
}

#[derive(Default)]
struct ReadPauseState {
    until: Option<Instant>,
    in_a_row: u32,
    /// Set while the API server is known not to answer: no watch sends a
    /// request that would only fail, and log.
    held: bool,
}

impl ReadPause {
    pub(crate) const MAX: Duration = Duration::from_secs(30);
    /// How often a held watch looks again whether it may go: a released
    /// hold is followed within about this (plus the waiter's spread).
    pub(crate) const HELD_RECHECK: Duration = Duration::from_millis(500);

    fn state(&self) -> std::sync::MutexGuard<'_, ReadPauseState> {
        crate::sync::lock(&self.state)
    }

    /// A read was throttled at `now`; returns when reads may go again.
    pub(crate) fn throttled(&self, now: Instant, retry_after: Option<Duration>) -> Instant {
        let mut state = self.state();
        let asked = retry_after.unwrap_or(Duration::from_secs(1));
        if let Some(until) = state.until.filter(|u| *u > now) {
            // Sent before the pause began: the same burst, not a new
            // refusal, so the delay does not grow; but this answer's own
            // Retry-After is honoured too.
            let until = until.max(now + asked);
            state.until = Some(until);
            return until;
        }
        state.in_a_row = state.in_a_row.saturating_add(1);
        let grown = asked
            .saturating_mul(1 << state.in_a_row.saturating_sub(1).min(10))
            .min(Self::MAX.max(asked));
        // Jitter only lengthens: the asked time is a floor.
        let delay = grown.mul_f64(1.0 + 0.2 * crate::core::jitter::fraction(&state.in_a_row));
        let until = now + delay;
        state.until = Some(state.until.map_or(until, |u| u.max(until)));
        until
    }

    /// A read went through: the next throttled one starts from its own
    /// `Retry-After` again.
    pub(crate) fn succeeded(&self) {
        let mut state = self.state();
        if state.in_a_row > 0 {
            state.in_a_row = 0;
        }
    }

    /// A read failed without an answer (see `failed`).
    pub(crate) fn read_failed(&self) {
        self.failed.notify_one();
    }

    /// Returns at the next failed read (or at once, for one that failed
    /// since the last call).
    pub(crate) async fn next_failure(&self) {
        self.failed.notified().await;
    }

    /// Hold every read (`true`) until released (`false`).
    pub(crate) fn set_held(&self, held: bool) {
        self.state().held = held;
    }

    /// Until when reads wait, if they do at `now`.
    pub(crate) fn until(&self, now: Instant) -> Option<Instant> {
        let state = self.state();
        let throttled = state.until.filter(|u| *u > now);
        if state.held {
            return Some(throttled.map_or(now + Self::HELD_RECHECK, |u| {
                u.max(now + Self::HELD_RECHECK)
            }));
        }
        throttled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> CopyKey {
        (Kind::ConfigMap, "ns".into(), name.into())
    }

    fn rule() -> RuleKey {
        RuleKey {
            namespace: "ops".into(),
            name: "r".into(),
        }
    }

    fn refused() -> Failure {
        Failure {
            class: FailureClass::Refused,
            message: "configmaps are frozen in this namespace".into(),
            retry_after: None,
        }
    }

    #[test]
    fn an_invalid_copy_waits_until_what_it_would_write_changes() {
        let mut b = Backoffs::new(Policy::default());
        let now = Instant::now();
        let invalid = Failure {
            class: FailureClass::Invalid,
            message: "metadata.annotations: Too long: may not be more than 262144 bytes".into(),
            retry_after: None,
        };
        let at = b.failed(&key("a"), &rule(), 7, invalid, now);
        assert!(at - now >= Duration::from_secs(3600));
        for minutes in [1, 10, 59] {
            let later = now + Duration::from_secs(60 * minutes);
            assert!(
                matches!(
                    b.admit(&key("a"), &rule(), 7, None, later),
                    Admission::Wait { .. }
                ),
                "after {minutes} min"
            );
        }
        b.sweep(now + Duration::from_secs(600));
        assert!(matches!(
            b.admit(&key("a"), &rule(), 7, None, now + Duration::from_secs(601)),
            Admission::Wait { .. }
        ));
        // The source or the rule changed: written at once.
        assert_eq!(
            b.admit(&key("a"), &rule(), 8, None, now + Duration::from_secs(61)),
            Admission::Go
        );
    }

    #[test]
    fn held_reads_wait_until_released_and_a_throttle_still_counts() {
        let pause = ReadPause::default();
        let now = Instant::now();
        pause.set_held(true);
        // Held: always a short wait ahead, so a watch keeps looking.
        assert_eq!(pause.until(now), Some(now + ReadPause::HELD_RECHECK));
        let later = now + Duration::from_secs(600);
        assert_eq!(pause.until(later), Some(later + ReadPause::HELD_RECHECK));
        // A throttle longer than the recheck is kept while held…
        let throttled = pause.throttled(now, Some(Duration::from_secs(5)));
        assert_eq!(pause.until(now), Some(throttled));
        pause.set_held(false);
        // …and after the release, as before.
        assert_eq!(pause.until(now), Some(throttled));
        assert_eq!(pause.until(throttled), None);
    }

    #[test]
    fn throttled_reads_pause_for_retry_after_then_longer() {
        let pause = ReadPause::default();
        let now = Instant::now();
        assert_eq!(pause.until(now), None);
        let first = pause.throttled(now, Some(Duration::from_secs(2)));
        let waited = first - now;
        assert!(waited >= Duration::from_secs(2) && waited <= Duration::from_millis(2400));
        assert_eq!(pause.until(now), Some(first));
        // Refusals of requests sent before the pause began: the same pause.
        assert_eq!(pause.throttled(now, Some(Duration::from_secs(2))), first);
        // One that arrives later in the pause waits its own Retry-After
        // from its arrival, without doubling.
        let late = now + Duration::from_millis(1900);
        let extended = pause.throttled(late, Some(Duration::from_secs(2)));
        assert!(
            extended >= late + Duration::from_secs(2),
            "{:?}",
            extended - late
        );
        assert!(
            extended < late + Duration::from_millis(2100),
            "{:?}",
            extended - late
        );
        let first = extended;
        // Refused again once the pause is over: doubling.
        let mut at = first;
        let second = pause.throttled(at, Some(Duration::from_secs(2))) - at;
        assert!(second >= Duration::from_secs(4), "{second:?}");
        // Capped.
        for _ in 0..20 {
            at = pause.throttled(at, None);
        }
        let capped = pause.throttled(at, None) - at;
        assert!(capped <= ReadPause::MAX.mul_f64(1.2), "{capped:?}");
        // A read that went through starts the count again.
        pause.succeeded();
        let later = at + Duration::from_secs(100);
        assert_eq!(pause.until(later), None);
        let again = pause.throttled(later, None) - later;
        assert!(again < Duration::from_millis(1300), "{again:?}");
    }

    #[test]
    fn watch_backoff_stays_short_and_resets() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = (&mut b).take(10).collect();
        assert!(delays[0] < Duration::from_millis(400));
        assert!(delays.iter().all(|d| *d <= WatchBackoff::MAX.mul_f64(1.2)));
        assert!(delays[9] >= WatchBackoff::MAX.mul_f64(0.8));
        b.reset();
        assert!(b.next().unwrap() < Duration::from_millis(400));
    }

    #[test]
    fn new_content_or_a_namespace_change_goes_at_once() {
        let mut b = Backoffs::default();
        let now = Instant::now();
        b.failed(&key("a"), &rule(), 7, refused(), now);
        assert!(matches!(
            b.admit(&key("a"), &rule(), 7, None, now),
            Admission::Wait { .. }
        ));
        assert_eq!(b.admit(&key("a"), &rule(), 8, None, now), Admission::Go);
        b.failed(&key("a"), &rule(), 8, refused(), now);
        b.forget_namespace("ns");
        assert_eq!(b.admit(&key("a"), &rule(), 8, None, now), Admission::Go);
        b.failed(&key("a"), &rule(), 8, refused(), now);
        b.forget_rule(&rule());
        assert_eq!(b.admit(&key("a"), &rule(), 8, None, now), Admission::Go);
        assert!(b.is_empty());
    }

    #[test]
    fn retry_after_is_honoured() {
        let mut b = Backoffs::default();
        let now = Instant::now();
        let at = b.failed(
            &key("a"),
            &rule(),
            1,
            Failure {
                class: FailureClass::Throttled,
                message: "too many requests".into(),
                retry_after: Some(Duration::from_secs(20)),
            },
            now,
        );
        assert!(at >= now + Duration::from_secs(20));
    }

    #[test]
    fn success_clears_a_failure() {
        let mut b = Backoffs::default();
        let now = Instant::now();
        b.failed(&key("a"), &rule(), 7, refused(), now);
        b.succeeded(&key("a"), now);
        assert!(b.is_empty());
        assert_eq!(b.admit(&key("a"), &rule(), 7, None, now), Admission::Go);
    }

    #[test]
    fn a_writer_changing_back_every_2s_gets_few_restores_and_is_named() {
        let mut b = Backoffs::default();
        let start = Instant::now();
        let mut now = start;
        let mut restores = 0;
        let mut changed_back = true;
        // The other writer changes the copy back every 2 s for a minute; the
        // copy is re-planned every 100 ms while it is wrong.
        while now < start + Duration::from_secs(60) {
            if (now - start).as_millis().is_multiple_of(2000) {
                changed_back = true;
            }
            if changed_back && b.admit(&key("a"), &rule(), 7, Some("fighter"), now) == Admission::Go
            {
                b.succeeded(&key("a"), now);
                restores += 1;
                changed_back = false;
            }
            now += Duration::from_millis(100);
        }
        assert!((5..=8).contains(&restores), "{restores} restores");
        let contested = b.contested(&rule());
        assert_eq!(contested.len(), 1);
        assert_eq!(contested[0].writer, "fighter");
        assert_eq!(b.take_unannounced(&rule()).len(), 1);
        assert!(b.take_unannounced(&rule()).is_empty(), "announced once");
        assert_eq!(b.contested_total(), 1);
        // Once the copy stays quiet, the contest is over and memory is freed.
        b.sweep(now + Duration::from_secs(3600));
        assert!(b.is_empty());
    }

    #[test]
    fn a_copy_deleted_by_others_is_known_until_it_is_written_again() {
        let mut b = Backoffs::default();
        let now = Instant::now();
        assert!(!b.was_deleted_by_others(&key("a"), 7));
        b.deleted_by_others(&key("a"), &rule(), 7, now);
        assert!(b.was_deleted_by_others(&key("a"), 7));
        assert!(
            !b.was_deleted_by_others(&key("a"), 8),
            "other content is no restore"
        );
        b.succeeded(&key("a"), now);
        assert!(!b.was_deleted_by_others(&key("a"), 7));
    }

    #[test]
    fn an_occasional_edit_is_restored_at_once_and_is_no_contest() {
        let mut b = Backoffs::default();
        let start = Instant::now();
        for minute in 0..10 {
            let now = start + Duration::from_secs(60 * 10 * minute);
            assert_eq!(
                b.admit(&key("a"), &rule(), 7, Some("person"), now),
                Admission::Go
            );
            b.succeeded(&key("a"), now);
        }
        assert!(b.contested(&rule()).is_empty());
    }

    /// One refused write in flight at a time for the whole rule: refused
    /// writes of a copy deleted by someone, retried and refused again,
    /// fought nobody.
    #[test]
    fn restores_that_are_refused_are_no_contest() {
        let mut b = Backoffs::default();
        let start = Instant::now();
        let mut now = start;
        b.deleted_by_others(&key("a"), &rule(), 7, now);
        let mut attempts = 0;
        while now < start + Duration::from_secs(120) {
            let wait = b.admit(&key("a"), &rule(), 7, Some("whoever deleted it"), now);
            let probe = matches!(
                wait,
                Admission::Wait {
                    why: Waiting::Refused(_),
                    ..
                }
            )
            .then(|| b.pick_probe(&rule(), &[key("a")], now))
            .flatten();
            if wait == Admission::Go || probe.is_some() {
                attempts += 1;
                b.failed(&key("a"), &rule(), 7, refused(), now);
            }
            now += Duration::from_millis(100);
        }
        assert!(attempts > CONTESTED_AFTER as usize, "{attempts} attempts");
        assert!(b.contested(&rule()).is_empty(), "refused, not contested");
        assert!(b.take_unannounced(&rule()).is_empty());
        // Written at last: one restore, still no contest, the gate open.
        b.succeeded(&key("a"), now);
        assert!(b.contested(&rule()).is_empty());
        assert_eq!(b.next_probe(&rule()), None);
    }

    /// Every refused copy of a rule waits behind one gate: a single probe
    /// write every few seconds, taken in turn; once one goes through, every
    /// refused copy goes at once.
    #[test]
    fn a_rules_refused_writes_are_probed_one_at_a_time_and_released_together() {
        let mut b = Backoffs::default();
        let start = Instant::now();
        let copies: Vec<CopyKey> = (0..55).map(|i| key(&format!("c{i:02}"))).collect();
        for copy in &copies {
            assert_eq!(b.admit(copy, &rule(), 7, None, start), Admission::Go);
            b.failed(copy, &rule(), 7, refused(), start);
        }
        // Refused for a minute: passes every 100 ms, each probing at most one.
        let mut now = start;
        let mut probed = Vec::new();
        while now < start + Duration::from_secs(60) {
            let waiting: Vec<CopyKey> = copies
                .iter()
                .filter(|c| {
                    matches!(
                        b.admit(c, &rule(), 7, None, now),
                        Admission::Wait {
                            why: Waiting::Refused(_),
                            ..
                        }
                    )
                })
                .cloned()
                .collect();
            assert_eq!(waiting.len(), 55, "all wait behind the gate");
            if let Some(probe) = b.pick_probe(&rule(), &waiting, now) {
                probed.push(probe.clone());
                b.failed(&probe, &rule(), 7, refused(), now);
            }
            now += Duration::from_millis(100);
        }
        // 2 s, 4 s, then every 6 s (±20 %): about 10 writes in the minute.
        assert!((8..=13).contains(&probed.len()), "{} probes", probed.len());
        let distinct: std::collections::HashSet<_> = probed.iter().collect();
        assert_eq!(distinct.len(), probed.len(), "taken in turn: {probed:?}");
        // No more than the longest step, plus jitter, between two probes.
        let due = b.next_probe(&rule()).expect("the gate is shut");
        assert!(due <= now + Duration::from_millis(7200));
        // The cause is lifted: the next probe goes through, the others go at once.
        let waiting = copies.clone();
        let probe = b
            .pick_probe(&rule(), &waiting, due)
            .expect("a probe is due");
        assert!(b.succeeded(&probe, due), "the others are released");
        for copy in copies.iter().filter(|c| **c != probe) {
            assert_eq!(b.admit(copy, &rule(), 7, None, due), Admission::Go);
        }
        assert_eq!(b.next_probe(&rule()), None, "the gate is open");
    }

    /// A refusal in one namespace does not hold back the copies of another
    /// rule, and a copy whose content changed goes at once past the gate.
    #[test]
    fn the_gate_holds_one_rules_refused_writes_only() {
        let mut b = Backoffs::default();
        let now = Instant::now();
        let other = RuleKey {
            namespace: "ops".into(),
            name: "other".into(),
        };
        b.failed(&key("a"), &rule(), 7, refused(), now);
        assert!(matches!(
            b.admit(&key("a"), &rule(), 7, None, now),
            Admission::Wait {
                why: Waiting::Refused(_),
                ..
            }
        ));
        assert_eq!(b.admit(&key("b"), &other, 7, None, now), Admission::Go);
        assert_eq!(b.admit(&key("a"), &rule(), 8, None, now), Admission::Go);
        assert_eq!(b.pick_probe(&other, &[key("b")], now), None, "no gate");
    }
}
