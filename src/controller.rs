//! The reconcile loop: a queue of rules, workers that plan each rule from
//! the in-memory views and carry the plan out, then publish its status.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::Notify;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::config::Settings;
use crate::index::{CopyIndex, NamespaceInfo, ObjectKey};
use crate::kinds::Kind;
use crate::leader::LeaderGate;
use crate::metrics::Metrics;
use crate::plan::{self, Action, DeleteReason, Inputs, Plan};
use crate::rule::{ConflictEntry, ConflictPolicy, CopyratorRule, RuleKey, Trust};
use crate::status::{self, Observed};
use crate::watch::{SourceWatch, read, write};
use crate::writer::{Outcome, Writer};
use crate::{Error, FIELD_MANAGER, FINALIZER};

/// Which caches have their first full list.
#[derive(Default)]
pub struct Synced {
    pub rules: AtomicBool,
    pub namespaces: AtomicBool,
    pub copies: [AtomicBool; 2],
}

impl Synced {
    pub fn all(&self) -> bool {
        self.rules.load(Ordering::Acquire)
            && self.namespaces.load(Ordering::Acquire)
            && self.copies.iter().all(|c| c.load(Ordering::Acquire))
    }
}

/// Rules waiting for a reconcile. A rule is queued at most once, and never
/// reconciled by two workers at once: events during its reconcile queue it
/// again for one more pass, which is how bursts coalesce.
pub struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct QueueState {
    pending: VecDeque<RuleKey>,
    queued: HashSet<RuleKey>,
    running: HashSet<RuleKey>,
    again: HashSet<RuleKey>,
}

impl Queue {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            state: Mutex::new(QueueState::default()),
            notify: Notify::new(),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn add(&self, key: RuleKey) {
        let mut state = self.lock();
        if state.running.contains(&key) {
            state.again.insert(key);
        } else if state.queued.insert(key.clone()) {
            state.pending.push_back(key);
            self.metrics.queue_depth.set(state.pending.len() as i64);
            self.notify.notify_one();
        }
    }

    pub fn add_all(&self, keys: impl IntoIterator<Item = RuleKey>) {
        for key in keys {
            self.add(key);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub async fn next(&self) -> RuleKey {
        loop {
            {
                let mut state = self.lock();
                if let Some(key) = state.pending.pop_front() {
                    state.queued.remove(&key);
                    state.running.insert(key.clone());
                    self.metrics.queue_depth.set(state.pending.len() as i64);
                    if !state.pending.is_empty() {
                        // Wake another worker for the rest.
                        self.notify.notify_one();
                    }
                    return key;
                }
            }
            self.notify.notified().await;
        }
    }

    pub fn done(&self, key: &RuleKey) {
        let again = {
            let mut state = self.lock();
            state.running.remove(key);
            state.again.remove(key)
        };
        if again {
            self.add(key.clone());
        }
    }
}

/// A rule's memory between reconciles.
#[derive(Default)]
struct RuleMemory {
    /// Targets that hold a foreign object of the copy's name.
    known_conflicts: HashMap<ObjectKey, String>,
    /// Conflicts already announced by an Event.
    announced: HashSet<ConflictEntry>,
    /// Consecutive failed passes, for the retry backoff.
    failures: u32,
    copies: i64,
    conflicts: i64,
}

/// State shared by the watches, the workers and the HTTP server.
pub struct Shared {
    pub client: Client,
    pub settings: Settings,
    pub trust: Trust,
    pub rules: RwLock<HashMap<RuleKey, Arc<CopyratorRule>>>,
    rule_uids: RwLock<HashMap<String, RuleKey>>,
    pub namespaces: RwLock<BTreeMap<String, NamespaceInfo>>,
    copies: [RwLock<CopyIndex>; 2],
    sources: Mutex<HashMap<RuleKey, SourceWatch>>,
    memory: Mutex<HashMap<RuleKey, RuleMemory>>,
    pub synced: Synced,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    writer: Writer,
    recorder: Recorder,
    leader: LeaderGate,
    /// Only plan; never write (the `plan` subcommand).
    dry_run: bool,
}

impl Shared {
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Arc<Metrics>,
        leader: LeaderGate,
        dry_run: bool,
    ) -> Arc<Self> {
        let limiter = crate::ratelimit::RateLimiter::new(settings.api_qps, settings.api_burst);
        let writer = Writer::new(
            client.clone(),
            limiter,
            settings.write_concurrency,
            metrics.clone(),
            leader.clone(),
        );
        let reporter = Reporter {
            controller: "copyrator".into(),
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .ok(),
        };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            trust: Trust {
                operator_namespace: settings.namespace.clone(),
                all_namespaces: settings.all_namespaces,
            },
            client,
            settings,
            rules: RwLock::default(),
            rule_uids: RwLock::default(),
            namespaces: RwLock::default(),
            copies: [RwLock::default(), RwLock::default()],
            sources: Mutex::default(),
            memory: Mutex::default(),
            synced: Synced::default(),
            queue: Queue::new(metrics.clone()),
            metrics,
            writer,
            leader,
            dry_run,
        })
    }

    pub fn copies(&self, kind: Kind) -> &RwLock<CopyIndex> {
        &self.copies[kind as usize]
    }

    pub fn rule_by_uid(&self, uid: &str) -> Option<RuleKey> {
        read(&self.rule_uids).get(uid).cloned()
    }

    pub fn set_rule(&self, key: RuleKey, rule: Arc<CopyratorRule>) {
        if let Some(uid) = rule.uid() {
            write(&self.rule_uids).insert(uid.to_owned(), key.clone());
        }
        write(&self.rules).insert(key.clone(), rule);
        self.queue.add(key);
    }

    pub fn forget_rule(&self, key: &RuleKey) {
        if let Some(rule) = write(&self.rules).remove(key)
            && let Some(uid) = rule.uid()
        {
            write(&self.rule_uids).remove(uid);
        }
        self.sources_lock().remove(key);
        if let Some(memory) = self.memory_lock().remove(key) {
            self.metrics.copies_managed.dec_by(memory.copies);
            self.metrics.conflicts_skipped.dec_by(memory.conflicts);
        }
    }

    fn sources_lock(&self) -> std::sync::MutexGuard<'_, HashMap<RuleKey, SourceWatch>> {
        self.sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn memory_lock(&self) -> std::sync::MutexGuard<'_, HashMap<RuleKey, RuleMemory>> {
        self.memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_live_rule(&self, uid: &str) -> bool {
        read(&self.rule_uids).contains_key(uid)
    }

    fn event(
        &self,
        rule: &CopyratorRule,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) -> impl std::future::Future<Output = ()> + '_ {
        let reference = rule.object_ref(&());
        let event = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        let dry_run = self.dry_run;
        async move {
            if dry_run || !self.leader.is_leader() {
                return;
            }
            self.writer.pace().await;
            self.metrics.write("create", "Event");
            if let Err(e) = self.recorder.publish(&event, &reference).await {
                warn!(error = %e, reason = event.reason.as_str(), "recording an event failed");
            }
        }
    }
}

/// What a rule's pass did, for its status and the retry decision.
struct Pass {
    plan: Plan,
    conflicts: Vec<ConflictEntry>,
    written: u32,
    pruned: u32,
    pending: u32,
    errors: Vec<String>,
}

/// Reconcile one rule: its cleanup when deleted, its finalizer, its plan,
/// and its status.
pub async fn reconcile(shared: &Arc<Shared>, key: &RuleKey) -> Result<(), Error> {
    let Some(rule) = read(&shared.rules).get(key).cloned() else {
        shared.sources_lock().remove(key);
        return Ok(());
    };
    let uid = rule.uid().unwrap_or_default().to_owned();
    if rule.is_deleting() {
        if rule.has_finalizer() {
            return cleanup(shared, &rule, &uid).await;
        }
        return Ok(());
    }
    if !rule.has_finalizer() && !shared.dry_run {
        set_finalizer(shared, &rule, true).await?;
    }

    let resolved = match rule.resolve(&shared.trust) {
        Ok(resolved) => resolved,
        Err(invalid) => {
            // An invalid rule changes nothing: a typo must not prune copies cluster-wide.
            shared.sources_lock().remove(key);
            shared.metrics.reconciled("invalid");
            let observed = Observed {
                generation: rule.metadata.generation,
                rule_type: rule
                    .effective_rule_type()
                    .map(|t| t.kind().info().rule_type.to_string()),
                copies: shared
                    .copies
                    .iter()
                    .map(|c| read(c).count_owned_by(&uid) as u32)
                    .sum(),
                problem: Some((invalid.reason.to_string(), invalid.message.clone())),
                ..Default::default()
            };
            let changed = publish_status(shared, &rule, &observed).await?;
            if changed {
                shared
                    .event(
                        &rule,
                        EventType::Warning,
                        invalid.reason,
                        "Validate",
                        invalid.message,
                    )
                    .await;
            }
            return Ok(());
        }
    };

    // Sources: start (or restart) the watches this rule needs and wait for their list.
    let sources = {
        let mut watches = shared.sources_lock();
        let fingerprint = SourceWatch::fingerprint_of(&resolved);
        if watches
            .get(key)
            .is_none_or(|w| w.fingerprint != fingerprint)
        {
            watches.insert(key.clone(), SourceWatch::start(shared, &resolved));
        }
        match watches.get(key) {
            Some(watch) if watch.is_synced() => watch.snapshot(),
            // The watch queues the rule again once it has listed.
            _ => return Ok(()),
        }
    };

    let pass = run_plan(shared, &rule, &resolved, &sources).await;
    let mut problem = None;
    if !pass.errors.is_empty() {
        problem = Some((
            "SyncFailed".to_string(),
            format!(
                "{} writes failed; first: {}",
                pass.errors.len(),
                pass.errors[0]
            ),
        ));
    }
    let observed = Observed {
        generation: rule.metadata.generation,
        rule_type: Some(resolved.kind.info().rule_type.to_string()),
        sources: pass.plan.sources,
        target_namespaces: pass.plan.target_namespaces,
        copies: pass.plan.in_place + pass.written,
        conflicts: pass.conflicts.clone(),
        problem,
        pending: pass.pending,
    };
    publish_status(shared, &rule, &observed).await?;

    // Events for what changed: new conflicts, prunes, failures.
    let new_conflicts: Vec<ConflictEntry> = {
        let mut memory = shared.memory_lock();
        let memory = memory.entry(key.clone()).or_default();
        let current: HashSet<ConflictEntry> = pass.conflicts.iter().cloned().collect();
        let fresh = current.difference(&memory.announced).cloned().collect();
        memory.announced = current;
        let copies = i64::from(observed.copies);
        let conflicts = pass.conflicts.len() as i64;
        shared.metrics.copies_managed.inc_by(copies - memory.copies);
        shared
            .metrics
            .conflicts_skipped
            .inc_by(conflicts - memory.conflicts);
        memory.copies = copies;
        memory.conflicts = conflicts;
        fresh
    };
    for conflict in new_conflicts.iter().take(5) {
        shared
            .event(
                &rule,
                EventType::Warning,
                "ConflictSkipped",
                "Copy",
                format!(
                    "{} {}/{} not written: {}",
                    resolved.kind, conflict.namespace, conflict.name, conflict.reason
                ),
            )
            .await;
    }
    if pass.pruned > 0 {
        shared
            .event(
                &rule,
                EventType::Normal,
                "Pruned",
                "Delete",
                format!("deleted {} copies that no longer belong", pass.pruned),
            )
            .await;
    }
    if let Some(first) = pass.errors.first() {
        shared
            .event(
                &rule,
                EventType::Warning,
                "SyncFailed",
                "Copy",
                format!("{} writes failed; first: {first}", pass.errors.len()),
            )
            .await;
        return Err(Error::Sync(first.clone()));
    }
    if pass.pending > 0 {
        shared.queue.add(key.clone());
    }
    Ok(())
}

async fn run_plan(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    resolved: &crate::rule::ResolvedRule,
    sources: &[Arc<crate::index::Object>],
) -> Pass {
    let known_conflicts = shared
        .memory_lock()
        .get(&resolved.key)
        .map(|m| m.known_conflicts.clone())
        .unwrap_or_default();
    let mut plan = {
        let namespaces = read(&shared.namespaces);
        let copies = read(shared.copies(resolved.kind));
        let live = |uid: &str| shared.is_live_rule(uid);
        plan::plan(&Inputs {
            rule: resolved,
            namespaces: &namespaces,
            sources,
            copies: &copies,
            live_rule_uids: &live,
            known_conflicts: &known_conflicts,
        })
    };
    // Copies of another kind (the rule's type changed) no longer belong.
    let mut other_kind_deletions = Vec::new();
    if resolved.prune {
        let namespaces = read(&shared.namespaces);
        for kind in Kind::all().filter(|k| *k != resolved.kind) {
            for action in plan::cleanup(&resolved.uid, &namespaces, &read(shared.copies(kind))) {
                other_kind_deletions.push((kind, action));
            }
        }
    }
    let mut pass = Pass {
        conflicts: plan.conflicts.clone(),
        plan: Plan::default(),
        written: 0,
        pruned: 0,
        pending: 0,
        errors: Vec::new(),
    };
    let actions: Vec<(Kind, Action)> = std::mem::take(&mut plan.actions)
        .into_iter()
        .map(|a| (resolved.kind, a))
        .chain(other_kind_deletions)
        .collect();
    if shared.dry_run {
        for (kind, action) in &actions {
            let (namespace, name) = action.target();
            println!(
                "{} {kind} {namespace}/{name} (rule {})",
                action.verb(),
                resolved.key
            );
        }
        for conflict in &plan.conflicts {
            println!(
                "skip {} {}/{} (rule {}): {}",
                resolved.kind, conflict.namespace, conflict.name, resolved.key, conflict.reason
            );
        }
        pass.plan = plan;
        return pass;
    }
    let rule_name = resolved.key.to_string();
    let policy = resolved.conflict_policy;
    let concurrency = shared.settings.write_concurrency as usize;
    let results: Vec<(Kind, Action, Outcome)> = futures::stream::iter(actions)
        .map(|(kind, action)| {
            let shared = shared.clone();
            let rule_name = rule_name.clone();
            async move {
                let outcome = shared
                    .writer
                    .execute(kind, &action, policy, &rule_name)
                    .await;
                (kind, action, outcome)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;

    let mut new_conflicts = Vec::new();
    for (kind, action, outcome) in results {
        let (namespace, name) = action.target();
        let key = (namespace.to_owned(), name.to_owned());
        match outcome {
            Outcome::Written(object) => {
                // Write-through: the next pass sees our write even before its watch event.
                let mut index = write(shared.copies(kind));
                match object {
                    Some(object) => {
                        index.upsert(object);
                    }
                    None => {
                        index.remove(namespace, name);
                    }
                }
                match action {
                    Action::Delete {
                        reason: DeleteReason::Pruned,
                        ..
                    } => pass.pruned += 1,
                    Action::Delete { .. } => {}
                    _ => pass.written += 1,
                }
            }
            Outcome::Conflict(reason) => {
                new_conflicts.push((key.clone(), reason.clone()));
                pass.conflicts.push(ConflictEntry {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    reason,
                });
            }
            Outcome::Retry(reason) => {
                debug!(
                    rule = rule_name.as_str(),
                    namespace,
                    name,
                    reason = reason.as_str(),
                    "requeued"
                );
                if !matches!(action, Action::Delete { .. }) {
                    pass.pending += 1;
                } else {
                    shared.queue.add(resolved.key.clone());
                }
            }
            Outcome::Ignored(_) => {}
            Outcome::Failed(error) => pass.errors.push(error.to_string()),
        }
    }
    {
        let mut memory = shared.memory_lock();
        let memory = memory.entry(resolved.key.clone()).or_default();
        for (key, reason) in new_conflicts {
            memory.known_conflicts.insert(key, reason);
        }
        // A target that is ours now is no conflict any more.
        let copies = read(shared.copies(resolved.kind));
        memory.known_conflicts.retain(|(ns, name), _| {
            copies
                .get(ns, name)
                .is_none_or(|c| c.rule_uid() != rule.uid())
        });
    }
    pass.conflicts.sort();
    pass.conflicts.dedup();
    pass.plan = plan;
    pass
}

/// Publish the status if its content changed; returns whether it did.
async fn publish_status(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    observed: &Observed,
) -> Result<bool, Error> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let next = status::compute(rule.status.as_ref(), observed, &now);
    if rule
        .status
        .as_ref()
        .is_some_and(|s| status::same_content(s, &next))
        || shared.dry_run
    {
        return Ok(false);
    }
    if !shared.leader.is_leader() {
        return Ok(false);
    }
    let key = rule.key();
    let api: Api<CopyratorRule> = Api::namespaced(shared.client.clone(), &key.namespace);
    let body = json!({
        "apiVersion": format!("{}/{}", crate::rule::GROUP, crate::rule::VERSION),
        "kind": crate::rule::KIND,
        "status": next,
    });
    shared.writer.pace().await;
    shared.metrics.write("patch", "CopyratorRule");
    api.patch_status(
        &key.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|source| Error::Status {
        rule: key.to_string(),
        source: Box::new(source),
    })?;
    Ok(true)
}

async fn set_finalizer(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    present: bool,
) -> Result<(), Error> {
    let key = rule.key();
    let mut finalizers: Vec<String> = rule
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER.into());
    }
    let api: Api<CopyratorRule> = Api::namespaced(shared.client.clone(), &key.namespace);
    // The resourceVersion makes this a compare-and-swap of the whole list.
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": rule.metadata.resource_version}});
    if !shared.leader.is_leader() {
        return Ok(());
    }
    shared.writer.pace().await;
    shared.metrics.write("patch", "CopyratorRule");
    match api
        .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(updated) => {
            shared.set_rule(key, Arc::new(updated));
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Finalizer {
            rule: key.to_string(),
            source: Box::new(source),
        }),
    }
}

/// A deleted rule: delete every copy it made, then let the rule go.
async fn cleanup(shared: &Arc<Shared>, rule: &CopyratorRule, uid: &str) -> Result<(), Error> {
    let key = rule.key();
    let mut deleted = 0;
    let mut errors = Vec::new();
    let mut retry = false;
    for kind in Kind::all() {
        let actions = {
            let namespaces = read(&shared.namespaces);
            plan::cleanup(uid, &namespaces, &read(shared.copies(kind)))
        };
        if shared.dry_run {
            for action in &actions {
                let (namespace, name) = action.target();
                println!("delete {kind} {namespace}/{name} (rule {key} is being deleted)");
            }
            continue;
        }
        let rule_name = key.to_string();
        let outcomes: Vec<(Action, Outcome)> = futures::stream::iter(actions)
            .map(|action| {
                let rule_name = rule_name.clone();
                async move {
                    let outcome = shared
                        .writer
                        .execute(kind, &action, ConflictPolicy::Skip, &rule_name)
                        .await;
                    (action, outcome)
                }
            })
            .buffer_unordered(shared.settings.write_concurrency as usize)
            .collect()
            .await;
        for (action, outcome) in outcomes {
            let (namespace, name) = action.target();
            match outcome {
                Outcome::Written(_) | Outcome::Ignored(_) => {
                    write(shared.copies(kind)).remove(namespace, name);
                    deleted += 1;
                }
                Outcome::Retry(_) | Outcome::Conflict(_) => retry = true,
                Outcome::Failed(e) => errors.push(e.to_string()),
            }
        }
    }
    if shared.dry_run {
        return Ok(());
    }
    if let Some(first) = errors.first() {
        shared
            .event(
                rule,
                EventType::Warning,
                "CleanupFailed",
                "Delete",
                format!(
                    "{} copies could not be deleted; first: {first}",
                    errors.len()
                ),
            )
            .await;
        return Err(Error::Sync(first.clone()));
    }
    if retry {
        shared.queue.add(key);
        return Ok(());
    }
    shared
        .event(
            rule,
            EventType::Normal,
            "CopiesDeleted",
            "Delete",
            format!("the rule is being deleted: deleted its {deleted} copies"),
        )
        .await;
    info!(rule = %key, deleted, "rule deleted; its copies are gone");
    set_finalizer(shared, rule, false).await
}

/// Run `workers` reconcile loops until `stop` fires.
pub async fn run_workers(
    shared: Arc<Shared>,
    workers: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut handles = Vec::new();
    for _ in 0..workers {
        let shared = shared.clone();
        let mut stop = stop.clone();
        let mut leader = shared.leader.clone();
        handles.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    _ = leader.wait_for_leadership() => {}
                }
                let key = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    key = shared.queue.next() => key,
                };
                let started = Instant::now();
                let span = info_span!("reconcile", rule = %key);
                let result = reconcile(&shared, &key).instrument(span).await;
                shared
                    .metrics
                    .reconcile_duration
                    .observe(started.elapsed().as_secs_f64());
                shared.queue.done(&key);
                let failures = {
                    let mut memory = shared.memory_lock();
                    let memory = memory.entry(key.clone()).or_default();
                    match &result {
                        Ok(()) => memory.failures = 0,
                        Err(_) => memory.failures += 1,
                    }
                    memory.failures
                };
                match result {
                    Ok(()) => shared.metrics.reconciled("success"),
                    Err(error) => {
                        shared.metrics.reconciled("error");
                        // Exponential backoff per rule, so a 403 or a dead API server is no hot loop.
                        let delay =
                            Duration::from_millis(500 * 2u64.saturating_pow(failures.min(7)));
                        warn!(rule = %key, error = %error, retry_in = ?delay, "reconcile failed");
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            shared.queue.add(key);
                        });
                    }
                }
            }
        }));
    }
    let _ = stop.wait_for(|s| *s).await;
    for handle in handles {
        let _ = handle.await;
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
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    let mut leading = shared.leader.subscribe();
    let mut election_running = true;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = ticker.tick() => {
                for memory in shared.memory_lock().values_mut() {
                    memory.known_conflicts.clear();
                }
            }
            changed = leading.changed(), if election_running => {
                // A closed channel means the election ended (shutdown).
                election_running = changed.is_ok();
                if !election_running || !*leading.borrow_and_update() {
                    continue;
                }
            }
        }
        let keys: Vec<RuleKey> = read(&shared.rules).keys().cloned().collect();
        debug!(rules = keys.len(), "reconciling every rule");
        shared.queue.add_all(keys);
    }
}

/// Whether a rule's sources are listed (for `plan`, which waits for them).
pub fn sources_ready(shared: &Shared, key: &RuleKey) -> bool {
    shared
        .sources_lock()
        .get(key)
        .is_some_and(SourceWatch::is_synced)
}
