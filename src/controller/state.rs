//! The state shared by the watches, the workers and the HTTP server: the
//! in-memory views of the cluster, the work queue, per-rule memory and
//! per-copy backoff.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::sync::{lock, read, write};

use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use tracing::warn;

use crate::api::kinds::{Kind, MAX_KINDS};
use crate::api::rule::{ConflictEntry, CopyratorRule, RuleKey};
use crate::cache::index::{CopyIndex, NamespaceInfo, ObjectKey};
use crate::cluster::leader::LeaderGate;
use crate::cluster::sources::SourceHub;
use crate::cluster::writer::Writer;
use crate::controller::queue::Queue;
use crate::core::backoff::Backoffs;
use crate::core::backoff::ReadPause;
use crate::core::kind_refusals::KindRefusals;
use crate::core::resolve::{ResolvedRule, Trust};
use crate::core::scope::Touch;
use crate::ops::http::Health;
use crate::ops::metrics::Metrics;

/// Which caches have their first full list.
pub struct Synced {
    rules: AtomicBool,
    namespaces: AtomicBool,
    /// By kind: false while the kind's copy watch has yet to list; true
    /// once it has, or while the kind is not watched (nothing to wait for).
    copies: [AtomicBool; MAX_KINDS],
    /// Rung on every change, for [`Synced::wait_all`].
    changed: tokio::sync::Notify,
}

impl Default for Synced {
    fn default() -> Self {
        let copies = [const { AtomicBool::new(true) }; MAX_KINDS];
        // The built-in kinds are watched from the start, unless disabled.
        for kind in Kind::builtin() {
            copies[kind.index()].store(false, Ordering::Release);
        }
        Self {
            rules: AtomicBool::new(false),
            namespaces: AtomicBool::new(false),
            copies,
            changed: tokio::sync::Notify::new(),
        }
    }
}

impl Synced {
    /// The caches every pass needs: rules, namespaces, built-in kinds'
    /// copies (another kind's copy watch starts with its first rule).
    pub fn all(&self) -> bool {
        self.rules.load(Ordering::Acquire)
            && self.namespaces.load(Ordering::Acquire)
            && Kind::builtin().all(|kind| self.copies_of(kind))
    }

    pub fn copies_of(&self, kind: Kind) -> bool {
        self.copies[kind.index()].load(Ordering::Acquire)
    }

    pub fn set_copies_of(&self, kind: Kind, listed: bool) {
        self.copies[kind.index()].store(listed, Ordering::Release);
        self.changed.notify_waiters();
    }

    pub fn set_rules_listed(&self) {
        self.rules.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    pub fn set_namespaces_listed(&self) {
        self.namespaces.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Returns once every cache a pass needs has its first list.
    pub async fn wait_all(&self) {
        loop {
            // Registered before the check, so that no change in between is missed.
            let changed = self.changed.notified();
            if self.all() {
                return;
            }
            changed.await;
        }
    }

    /// What has not been listed yet, for messages.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.rules.load(Ordering::Acquire) {
            missing.push("the CopyratorRules".to_owned());
        }
        if !self.namespaces.load(Ordering::Acquire) {
            missing.push("the namespaces".to_owned());
        }
        for kind in Kind::all() {
            if !self.copies_of(kind) {
                missing.push(format!("the {kind} copies"));
            }
        }
        missing
    }
}

/// The part of the settings the controller reads, besides the trust
/// policy ([`Shared::trust`]).
#[derive(Clone, Debug)]
pub struct Options {
    /// Follow only the rule of this name (`--rule-name`).
    pub rule_name: Option<String>,
    /// Writes in flight at most (`--write-concurrency`).
    pub write_concurrency: u32,
    /// Client-side pacing of requests (`--api-qps`, `--api-burst`).
    pub api_qps: f64,
    pub api_burst: u32,
    /// Source watches at most (`--max-source-watches`).
    pub max_source_watches: u32,
    /// Keep every copy watch started, needed or not: `copyrator plan`
    /// plans rules that are in no view.
    pub keep_kind_watches: bool,
}

/// A rule's memory between reconciles.
#[derive(Default)]
pub struct RuleMemory {
    /// Targets that hold a foreign object of the copy's name.
    pub known_conflicts: HashMap<ObjectKey, String>,
    /// Conflicts already announced by an Event.
    pub announced: HashSet<ConflictEntry>,
    /// Sources refused for their type, already announced by an Event.
    pub announced_refusals: HashSet<ConflictEntry>,
    /// When a status that only brings new counts is written.
    pub counts_due: Option<tokio::time::Instant>,
    /// Since when the rule waits for its source watches to list.
    pub waiting_since: Option<tokio::time::Instant>,
    /// Consecutive failed passes, for the retry backoff.
    pub failures: u32,
    /// What the rule's last failure line said, so that an unchanged
    /// failure is not logged on every pass.
    pub failure_log: Option<crate::core::pass_log::FailureLog>,
    pub copies: i64,
    pub conflicts: i64,
    /// What the rule's passes left unsettled, place by place.
    pub tally: crate::core::tally::Tally,
}

/// State shared by the watches, the workers and the HTTP server.
pub struct Shared {
    /// For watches and lists.
    pub client: Client,
    /// For statuses and finalizers (copies and Events go through the
    /// writer and the recorder, which hold it too).
    pub write_client: Client,
    pub options: Options,
    pub trust: Trust,
    pub rules: RwLock<HashMap<RuleKey, Arc<CopyratorRule>>>,
    /// Each valid rule as its last pass resolved it: which namespaces
    /// concern it, so that a namespace event queues only those rules.
    pub resolved: RwLock<HashMap<RuleKey, Arc<ResolvedRule>>>,
    rule_uids: RwLock<HashMap<String, RuleKey>>,
    pub namespaces: RwLock<BTreeMap<String, NamespaceInfo>>,
    /// By kind: the copies cluster-wide (only of kinds being watched).
    copies: Box<[RwLock<CopyIndex>]>,
    /// The copy watches of kinds named by `objectType`, started with the
    /// first rule that needs one and stopped after the last.
    pub kind_watches: Mutex<HashMap<Kind, tokio::task::JoinHandle<()>>>,
    /// Kinds refused for their retry interval (see [`KindRefusals`]).
    pub kind_refusals: Mutex<KindRefusals>,
    pub sources: Mutex<SourceHub>,
    /// Shared by every watch: a throttled read pauses them all.
    pub read_pause: Arc<ReadPause>,
    pub memory: Mutex<HashMap<RuleKey, RuleMemory>>,
    pub backoffs: Mutex<Backoffs>,
    pub synced: Synced,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    pub writer: Writer,
    recorder: Recorder,
    pub leader: LeaderGate,
    pub health: Arc<Health>,
    /// Rung when a rule leaves the view, for the task that stops the copy
    /// watches no rule needs.
    pub rules_gone: tokio::sync::Notify,
}

impl Shared {
    pub fn new(
        clients: crate::cluster::client::Clients,
        trust: Trust,
        options: Options,
        metrics: Arc<Metrics>,
        leader: LeaderGate,
        health: Arc<Health>,
    ) -> Arc<Self> {
        let limiter =
            crate::cluster::ratelimit::RateLimiter::new(options.api_qps, options.api_burst);
        let crate::cluster::client::Clients {
            read: client,
            write: write_client,
        } = clients;
        let writer = Writer::new(
            write_client.clone(),
            limiter,
            options.write_concurrency,
            metrics.clone(),
            leader.clone(),
            health.clone(),
        );
        let reporter = Reporter {
            controller: "copyrator".into(),
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .ok(),
        };
        let read_pause = Arc::new(ReadPause::default());
        Arc::new_cyclic(|weak: &std::sync::Weak<Self>| {
            let weak = weak.clone();
            let sources = SourceHub::new(
                client.clone(),
                health.clone(),
                read_pause.clone(),
                options.max_source_watches as usize,
                Arc::new(move |key: &RuleKey, touch: Touch| {
                    if let Some(shared) = weak.upgrade() {
                        shared.queue.add(key.clone(), touch);
                    }
                }),
            );
            Self {
                recorder: Recorder::new(write_client.clone(), reporter),
                trust,
                client,
                write_client,
                options,
                rules: RwLock::default(),
                resolved: RwLock::default(),
                rule_uids: RwLock::default(),
                namespaces: RwLock::default(),
                copies: (0..MAX_KINDS).map(|_| RwLock::default()).collect(),
                kind_watches: Mutex::default(),
                kind_refusals: Mutex::default(),
                sources: Mutex::new(sources),
                read_pause,
                memory: Mutex::default(),
                backoffs: Mutex::default(),
                synced: Synced::default(),
                queue: Queue::new(metrics.clone()),
                metrics,
                writer,
                leader,
                health,
                rules_gone: tokio::sync::Notify::new(),
            }
        })
    }

    pub fn copies(&self, kind: Kind) -> &RwLock<CopyIndex> {
        &self.copies[kind.index()]
    }

    pub fn rule_by_uid(&self, uid: &str) -> Option<RuleKey> {
        read(&self.rule_uids).get(uid).cloned()
    }

    /// Take a rule as watched or as returned by our own write. A version
    /// older than the one held is ignored; a changed spec lets every copy
    /// that waits out a backoff be written at once. A rule whose spec,
    /// deletion and finalizers are as they were (its status changed) gets a
    /// pass that looks at no copy: it only says its status again if needed.
    pub fn set_rule(&self, key: RuleKey, rule: Arc<CopyratorRule>) {
        let asks_the_same = read(&self.rules)
            .get(&key)
            .is_some_and(|held| asks_the_same(held, &rule));
        if self.set_rule_quietly(key.clone(), rule) {
            if asks_the_same {
                self.queue.add(key, Touch::Nothing);
            } else {
                self.queue.add(key, Touch::All);
            }
        }
    }

    /// Take the answer to our own status write: the rule as the API server
    /// holds it now. That may be a newer spec than the pass read (a change
    /// made while the pass ran), and its watch event, older than this
    /// answer, will be ignored: so a changed spec is queued here, as its
    /// watch event would have queued it. An unchanged one queues nothing
    /// (the pass that wrote the status has said all there is).
    pub fn take_status_answer(&self, key: RuleKey, rule: Arc<CopyratorRule>) {
        let asks_the_same = read(&self.rules)
            .get(&key)
            .is_some_and(|held| asks_the_same(held, &rule));
        if self.set_rule_quietly(key.clone(), rule) && !asks_the_same {
            self.queue.add(key, Touch::All);
        }
    }

    /// As [`Shared::set_rule`], without queueing the rule; returns whether
    /// the rule was taken.
    fn set_rule_quietly(&self, key: RuleKey, rule: Arc<CopyratorRule>) -> bool {
        if rule.is_deleting() && rule.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            // The API server let it go with its last finalizer: the answer
            // to that write, arriving after the watch's delete, must not
            // bring it back (nor forget a new rule of the same name).
            let held_uid = read(&self.rules)
                .get(&key)
                .map(|held| held.uid().map(str::to_owned));
            if held_uid.is_none_or(|uid| uid.as_deref() == rule.uid()) {
                self.forget_rule(&key);
            }
            return false;
        }
        let replaced_uid = {
            let mut rules = write(&self.rules);
            let mut replaced_uid = None;
            if let Some(previous) = rules.get(&key) {
                let same_object = previous.uid() == rule.uid();
                if same_object && is_older(&rule, previous) {
                    return false;
                }
                if !same_object || previous.metadata.generation != rule.metadata.generation {
                    lock(&self.backoffs).forget_rule(&key);
                }
                if !same_object {
                    // Deleted and made again while no delete event reached
                    // us (a relist): the old UID is no live rule any more,
                    // so its copies are adopted, not taken for another's.
                    replaced_uid = previous.uid().map(str::to_owned);
                }
            }
            rules.insert(key.clone(), rule.clone());
            replaced_uid
        };
        if let Some(old) = replaced_uid {
            write(&self.rule_uids).remove(&old);
        }
        self.metrics
            .rule_readiness(&key.namespace, &key.name, Some(rule.is_ready()));
        if let Some(uid) = rule.uid() {
            write(&self.rule_uids).insert(uid.to_owned(), key);
        }
        true
    }

    /// Forget a rule and everything held for it.
    pub fn forget_rule(&self, key: &RuleKey) {
        if let Some(rule) = write(&self.rules).remove(key)
            && let Some(uid) = rule.uid()
        {
            write(&self.rule_uids).remove(uid);
        }
        self.metrics.rule_readiness(&key.namespace, &key.name, None);
        write(&self.resolved).remove(key);
        lock(&self.sources).remove(key);
        self.metrics
            .source_watches
            .set(lock(&self.sources).watch_count() as i64);
        lock(&self.backoffs).forget_rule(key);
        self.drop_memory(key);
        self.metrics
            .copies_contested
            .set(lock(&self.backoffs).contested_total() as i64);
        // The copy watches of kinds no rule needs any more stop: a message
        // to their task (kinds::release_on_rules_gone), which sits above this view.
        self.rules_gone.notify_one();
    }

    /// Drop what is held for a rule that is gone: its memory (with its share
    /// of the gauges) and anything queued for it. A pass that was under way
    /// when the rule went may have brought its memory back.
    pub fn drop_memory(&self, key: &RuleKey) {
        self.queue.forget(key);
        if let Some(memory) = lock(&self.memory).remove(key) {
            self.metrics.copies_managed.dec_by(memory.copies);
            self.metrics.conflicts_skipped.dec_by(memory.conflicts);
        }
    }

    /// Queue the rules a change of namespace `name` concerns, for that
    /// namespace alone; a rule not resolved yet (new, or invalid), or one
    /// taking sources from it, looks at everything, to be safe.
    pub fn namespace_changed(
        &self,
        name: &str,
        before: Option<&NamespaceInfo>,
        after: Option<&NamespaceInfo>,
    ) {
        let resolved = read(&self.resolved);
        let concerned: Vec<(RuleKey, Touch)> = read(&self.rules)
            .keys()
            .filter_map(|key| match resolved.get(key) {
                None => Some((key.clone(), Touch::All)),
                Some(rule) if rule.source_namespaces.iter().any(|ns| ns == name) => {
                    Some((key.clone(), Touch::All))
                }
                Some(rule) => crate::core::plan::concerns_namespace(rule, name, before, after)
                    .then(|| (key.clone(), Touch::Namespace(name.to_owned()))),
            })
            .collect();
        drop(resolved);
        for (key, touch) in concerned {
            self.queue.add(key, touch);
        }
    }

    /// A copy at `(namespace, name)` changed or went: the rules that skipped
    /// that place as a conflict (another rule's copy was there, or one
    /// handed over), and those that still owe a write there (another
    /// rule's copy that came is a conflict now), look at it again.
    pub fn copy_place_changed(&self, namespace: &str, name: &str) {
        let concerned: Vec<RuleKey> = lock(&self.memory)
            .iter()
            .filter(|(_, memory)| memory.tally.is_unsettled(namespace, name))
            .map(|(key, _)| key.clone())
            .collect();
        for key in concerned {
            self.queue
                .add(key, Touch::Copy(namespace.to_owned(), name.to_owned()));
        }
    }

    pub fn is_live_rule(&self, uid: &str) -> bool {
        read(&self.rule_uids).contains_key(uid)
    }

    /// Publish an Event on a rule (only the leader does).
    pub async fn event(
        &self,
        rule: &CopyratorRule,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        if !self.leader.is_leader() {
            return;
        }
        let reference = rule.object_ref(&());
        let event = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        let _slot = self.writer.other_slot().await;
        self.metrics.write("create", "Event");
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            warn!(error = %crate::error::describe(&e), reason = event.reason.as_str(), "recording an event failed");
        }
    }
}

/// Whether `next` asks for what `held` asked: the same object, spec
/// (generation), deletion and finalizers. A status write changes none.
fn asks_the_same(held: &CopyratorRule, next: &CopyratorRule) -> bool {
    held.uid() == next.uid()
        && held.metadata.generation == next.metadata.generation
        && held.metadata.deletion_timestamp == next.metadata.deletion_timestamp
        && held.metadata.finalizers == next.metadata.finalizers
}

/// Whether `rule` is an older version of the same object than `held`.
/// Resource versions are etcd revisions on the API servers we know; when
/// either does not parse, the incoming one is taken.
fn is_older(rule: &CopyratorRule, held: &CopyratorRule) -> bool {
    let version = |r: &CopyratorRule| {
        r.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((version(rule), version(held)), (Some(new), Some(old)) if new < old)
}
