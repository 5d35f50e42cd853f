//! Rules waiting for a reconcile, now or later.
//!
//! A rule is queued at most once and never reconciled by two workers at
//! once: events during its reconcile queue it again for one more pass,
//! which is how bursts coalesce. A rule can also be queued for later (a
//! copy in backoff); the earliest time asked for wins. Each rule carries
//! what touched it since its last pass (its [`Scope`]), so that its next
//! pass looks only at that.
//!
//! Why not kube-runtime's `Controller` and its scheduler: the scheduler
//! keeps one request per object (the reason for a request is no part of
//! its key) and the reconciler is handed the object alone, never what
//! changed. This queue keeps, for each rule, what touched it since its last
//! pass (its [`Scope`]), and holds a failing rule off even against events.
//! It was never measured against `Controller`; the measured figures are
//! those of the scope it carries (BENCHMARKS.md, "passes that look at what
//! changed"): operator CPU from cold start through idle 4.23 → 3.13 s at
//! 10,000 copies, 26.10 → 21.14 s at 100,000, 12.06 → 7.76 s at 1,000
//! rules; new-namespace fill p99 at 100,000 copies 84 ms, against 337 ms
//! when each new namespace cost a pass over every copy.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::api::rule::RuleKey;
use crate::core::scope::{Scope, Touch};
use crate::ops::metrics::Metrics;

pub(crate) struct Queue {
    state: Mutex<QueueState>,
    /// Wakes a worker when a rule is pending.
    work: Notify,
    /// Wakes the timer when an earlier deadline was added.
    timer: Notify,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct QueueState {
    pending: FairQueue,
    queued: HashSet<RuleKey>,
    running: HashSet<RuleKey>,
    again: HashSet<RuleKey>,
    /// Rules queued for later, by due time; `due` holds each rule's entry.
    delayed: BTreeSet<(Instant, RuleKey)>,
    due: HashMap<RuleKey, Instant>,
    /// Rules whose last pass failed as a whole: events do not bring them
    /// back before this time (a failing status write is no hot loop).
    held: HashMap<RuleKey, Instant>,
    /// What touched each rule since its last pass began.
    scopes: HashMap<RuleKey, Scope>,
}

/// The rules waiting for a worker, taken in turn by namespace: each
/// namespace with rules waiting gets one pass before any gets a second, so
/// that a namespace with thousands of rules (a tenant's) delays the rules
/// of others by one pass at a time, not by thousands.
#[derive(Default)]
struct FairQueue {
    by_namespace: HashMap<String, VecDeque<RuleKey>>,
    /// Namespaces with rules waiting, in the order of their next turn.
    turns: VecDeque<String>,
    len: usize,
}

impl FairQueue {
    fn push_back(&mut self, key: RuleKey) {
        let waiting = self.by_namespace.entry(key.namespace.clone()).or_default();
        if waiting.is_empty() {
            self.turns.push_back(key.namespace.clone());
        }
        waiting.push_back(key);
        self.len += 1;
    }

    fn pop_front(&mut self) -> Option<RuleKey> {
        let namespace = self.turns.pop_front()?;
        let waiting = self.by_namespace.get_mut(&namespace)?;
        let key = waiting.pop_front()?;
        if waiting.is_empty() {
            self.by_namespace.remove(&namespace);
        } else {
            self.turns.push_back(namespace);
        }
        self.len -= 1;
        Some(key)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Queue {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            state: Mutex::new(QueueState::default()),
            work: Notify::new(),
            timer: Notify::new(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        crate::sync::lock(&self.state)
    }

    /// Queue `key` for what `touch` changed.
    pub(crate) fn add(&self, key: RuleKey, touch: Touch) {
        let mut state = self.lock();
        self.add_locked(&mut state, key, touch);
    }

    fn add_locked(&self, state: &mut QueueState, key: RuleKey, touch: Touch) {
        state.scopes.entry(key.clone()).or_default().add(touch);
        self.enqueue_locked(state, key);
    }

    /// Keep `scope` for the rule's next pass without queueing it (a pass
    /// that could not look at what touched it).
    pub(crate) fn carry(&self, key: &RuleKey, scope: Scope) {
        if scope.is_empty() {
            return;
        }
        let mut state = self.lock();
        state.scopes.entry(key.clone()).or_default().merge(scope);
    }

    fn enqueue_locked(&self, state: &mut QueueState, key: RuleKey) {
        if let Some(until) = state.held.get(&key).copied() {
            if Instant::now() < until {
                self.delay_locked(state, key, until);
                return;
            }
            state.held.remove(&key);
        }
        if state.running.contains(&key) {
            state.again.insert(key);
        } else if state.queued.insert(key.clone()) {
            state.pending.push_back(key);
            self.metrics.queue_depth.set(state.pending.len() as i64);
            self.work.notify_one();
        }
    }

    pub(crate) fn add_all(&self, keys: impl IntoIterator<Item = RuleKey>, touch: Touch) {
        let mut state = self.lock();
        for key in keys {
            self.add_locked(&mut state, key, touch.clone());
        }
    }

    /// Queue `key` once `delay` has passed, unless it is due earlier already;
    /// that pass looks at what earlier passes left unwritten.
    pub(crate) fn add_after(&self, key: RuleKey, delay: Duration) {
        let at = Instant::now() + delay;
        let mut state = self.lock();
        self.delay_locked(&mut state, key, at);
    }

    /// Keep `key` off the queue until `delay` has passed, whatever events
    /// come meanwhile; then it gets one pass.
    pub(crate) fn hold(&self, key: RuleKey, delay: Duration) {
        let until = Instant::now() + delay;
        let mut state = self.lock();
        if let Some(previous) = state.due.remove(&key) {
            state.delayed.remove(&(previous, key.clone()));
        }
        state.held.insert(key.clone(), until);
        self.delay_locked(&mut state, key, until);
    }

    /// The rule's pass succeeded: events bring it back at once again.
    pub(crate) fn release(&self, key: &RuleKey) {
        self.lock().held.remove(key);
    }

    fn delay_locked(&self, state: &mut QueueState, key: RuleKey, at: Instant) {
        let at = state.held.get(&key).map_or(at, |held| at.max(*held));
        if let Some(previous) = state.due.get(&key).copied() {
            if previous <= at {
                return;
            }
            state.delayed.remove(&(previous, key.clone()));
        }
        let earliest = state.delayed.first().is_none_or(|(first, _)| at < *first);
        state.delayed.insert((at, key.clone()));
        state.due.insert(key, at);
        if earliest {
            self.timer.notify_one();
        }
    }

    /// Drop a rule that went away: nothing of it stays queued for later.
    pub(crate) fn forget(&self, key: &RuleKey) {
        let mut state = self.lock();
        state.held.remove(key);
        state.scopes.remove(key);
        if let Some(at) = state.due.remove(key) {
            state.delayed.remove(&(at, key.clone()));
        }
    }

    #[cfg(test)]
    /// Rules queued for later (for tests and metrics).
    pub(crate) fn delayed_len(&self) -> usize {
        self.lock().delayed.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().pending.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next rule to reconcile, and what touched it.
    pub(crate) async fn next(&self) -> (RuleKey, Scope) {
        loop {
            {
                let mut state = self.lock();
                if let Some(key) = state.pending.pop_front() {
                    state.queued.remove(&key);
                    let scope = state.scopes.remove(&key).unwrap_or_default();
                    state.running.insert(key.clone());
                    self.metrics.queue_depth.set(state.pending.len() as i64);
                    if !state.pending.is_empty() {
                        // Wake another worker for the rest.
                        self.work.notify_one();
                    }
                    return (key, scope);
                }
            }
            self.work.notified().await;
        }
    }

    pub(crate) fn done(&self, key: &RuleKey) {
        let mut state = self.lock();
        state.running.remove(key);
        if state.again.remove(key) {
            self.enqueue_locked(&mut state, key.clone());
        }
    }

    /// Move rules whose time has come onto the queue; runs until dropped.
    pub(crate) async fn run_timer(&self) {
        loop {
            let next = {
                let mut state = self.lock();
                let now = Instant::now();
                while let Some((at, _)) = state.delayed.first() {
                    if *at > now {
                        break;
                    }
                    if let Some((_, key)) = state.delayed.pop_first() {
                        state.due.remove(&key);
                        state.held.remove(&key);
                        self.add_locked(&mut state, key, Touch::Retry);
                    }
                }
                state.delayed.first().map(|(at, _)| *at)
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.timer.notified() => {}
                    }
                }
                None => self.timer.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RuleKey {
        RuleKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn queue() -> Arc<Queue> {
        Arc::new(Queue::new(Arc::new(Metrics::default())))
    }

    #[test]
    fn namespaces_take_turns() {
        let key = |namespace: &str, name: &str| RuleKey {
            namespace: namespace.into(),
            name: name.into(),
        };
        let mut queue = FairQueue::default();
        for i in 0..1000 {
            queue.push_back(key("tenant", &format!("r{i}")));
        }
        queue.push_back(key("ops", "admin"));
        queue.push_back(key("team-b", "b"));
        let first: Vec<String> = (0..3)
            .filter_map(|_| queue.pop_front())
            .map(|k| k.to_string())
            .collect();
        assert_eq!(first, ["tenant/r0", "ops/admin", "team-b/b"]);
        assert_eq!(queue.len(), 999);
        let rest: Vec<RuleKey> = std::iter::from_fn(|| queue.pop_front()).collect();
        assert_eq!(rest.len(), 999);
        assert_eq!(
            rest[0],
            key("tenant", "r1"),
            "the tenant's rules in their order"
        );
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn a_rule_is_queued_once_and_again_after_its_pass() {
        let q = queue();
        q.add(key("a"), Touch::All);
        q.add(key("a"), Touch::All);
        assert_eq!(q.len(), 1);
        let (k, _) = q.next().await;
        q.add(key("a"), Touch::All);
        assert_eq!(q.len(), 0, "running: queued again only when done");
        q.done(&k);
        assert_eq!(q.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_rules_come_due_in_order_and_the_earliest_wins() {
        let q = queue();
        let timer = tokio::spawn({
            let q = q.clone();
            async move { q.run_timer().await }
        });
        let start = Instant::now();
        q.add_after(key("late"), Duration::from_secs(10));
        q.add_after(key("soon"), Duration::from_secs(5));
        q.add_after(key("soon"), Duration::from_secs(8)); // later: ignored
        q.add_after(key("late"), Duration::from_secs(3)); // earlier: wins
        assert_eq!(q.delayed_len(), 2);
        assert_eq!(q.next().await.0, key("late"));
        assert_eq!(start.elapsed().as_secs(), 3);
        assert_eq!(q.next().await.0, key("soon"));
        assert_eq!(start.elapsed().as_secs(), 5);
        assert_eq!(q.delayed_len(), 0);
        q.add_after(key("gone"), Duration::from_secs(1));
        q.forget(&key("gone"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(q.is_empty());
        timer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_rule_ignores_events_until_its_time() {
        let q = queue();
        let timer = tokio::spawn({
            let q = q.clone();
            async move { q.run_timer().await }
        });
        let start = Instant::now();
        q.hold(key("failing"), Duration::from_secs(4));
        for _ in 0..10 {
            q.add(key("failing"), Touch::All);
        }
        assert!(q.is_empty(), "events do not bring a held rule back");
        assert_eq!(q.next().await.0, key("failing"));
        assert_eq!(start.elapsed().as_secs(), 4);
        q.done(&key("failing"));
        q.add(key("failing"), Touch::All);
        assert_eq!(q.len(), 1, "after its time, events count again");
        timer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn each_pass_gets_what_touched_its_rule_since_the_last_began() {
        let q = queue();
        let timer = tokio::spawn({
            let q = q.clone();
            async move { q.run_timer().await }
        });
        q.add(key("r"), Touch::Namespace("team-a".into()));
        q.add(key("r"), Touch::Source("cm".into()));
        let (k, scope) = q.next().await;
        assert!(scope.covers_namespace("team-a") && scope.covers("elsewhere", "cm"));
        assert!(!scope.is_everything() && !scope.covers("elsewhere", "other"));
        // Touched while its pass runs: the next pass gets it, not this one.
        q.add(key("r"), Touch::Copy("team-b".into(), "x".into()));
        q.carry(&k, {
            let mut unlooked = Scope::default();
            unlooked.add(Touch::Source("late".into()));
            unlooked
        });
        q.done(&k);
        let (k, scope) = q.next().await;
        assert!(scope.covers("team-b", "x") && scope.covers("any", "late"));
        assert!(
            !scope.covers_namespace("team-a"),
            "the first pass took that"
        );
        q.done(&k);
        // A backoff that runs out brings the rule back for its unwritten copies.
        q.add_after(key("r"), Duration::from_secs(2));
        let (_, scope) = q.next().await;
        assert!(scope.retries() && !scope.is_everything());
        timer.abort();
    }
}
