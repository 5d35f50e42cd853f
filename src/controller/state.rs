//! The controller's state, shared by the watches, the workers and the HTTP
//! server: the cluster it serves (`cluster::context::Cluster`), the rules
//! as watched and resolved, the work queue, per-rule memory and per-copy
//! backoff, and the order in which their locks may be taken.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use crate::cluster::context::{Cluster, Limits};
use crate::sync::{lock, read, write};

use kube::runtime::events::{Event as KubeEvent, EventType};
use tracing::warn;

use crate::api::kinds::Kind;
use crate::api::rule::{CopyratorRule, RuleKey};
use crate::cache::index::{CopyIndex, NamespaceInfo, ObjectKey};
use crate::cluster::foreign::ForeignEvent;
use crate::cluster::leader::LeaderGate;
use crate::controller::members::{Member, Members};
use crate::controller::site::{RuleMemory, RuleNotes, Site, SiteName};
use crate::core::foreign::ForeignChange;
use crate::core::resolve::{ResolvedRule, Trust};
use crate::core::scope::Touch;
use crate::ops::http::Health;
use crate::ops::metrics::{ClusterMetrics, Metrics};

/// The part of the settings the controller reads, besides the trust
/// policy ([`Shared::trust`]).
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Follow only the rule of this name (`--rule-name`).
    pub(crate) rule_name: Option<String>,
    /// How hard the operator may push the API server.
    pub(crate) limits: Limits,
    /// Keep every copy watch started, needed or not: `copyrator plan`
    /// plans rules that are in no view.
    pub(crate) keep_kind_watches: bool,
    /// This cluster's name in copies kept in member clusters
    /// (`--cluster-name`).
    pub(crate) cluster_name: String,
    /// Read the inventory of member clusters (`--member-clusters`).
    pub(crate) member_clusters: bool,
    /// Accept members reached over plain http or without checking their
    /// certificate (`--allow-insecure-members`).
    pub(crate) allow_insecure_members: bool,
    /// The copy protection followed in each member
    /// (`--member-copy-protection`).
    pub(crate) member_copy_protection: Option<String>,
    /// The credential plugins members of ClusterProfiles may be reached
    /// through (`--clusterprofile-provider-file`).
    pub(crate) provider_file: Option<Arc<crate::cluster::provider_file::ProviderFile>>,
    /// Kubeconfig Secrets whose user runs a command of the provider file
    /// are accepted (`--allow-kubeconfig-plugins`).
    pub(crate) allow_kubeconfig_plugins: bool,
    /// A workload is rolled at most once in this long
    /// (`--min-restart-interval`).
    pub(crate) min_restart_interval: std::time::Duration,
}

/// The rules as watched, by key and by UID, kept together under one lock
/// so that the two never disagree. Reads see the map by key.
#[derive(Default)]
pub(crate) struct RuleView {
    by_key: HashMap<RuleKey, Arc<CopyratorRule>>,
    by_uid: HashMap<String, RuleKey>,
    /// UIDs of rules that left, and when: the answer to a write sent
    /// before a rule went may arrive after its delete event (a paused or
    /// busy process reads both at once), and must not bring it back. A UID
    /// is never reused, so one seen gone stays gone.
    gone: HashMap<String, std::time::Instant>,
}

/// How long a gone rule's UID is remembered: longer than any write to it
/// can take to be answered.
const GONE_RULES_REMEMBERED: std::time::Duration = std::time::Duration::from_secs(600);

impl std::ops::Deref for RuleView {
    type Target = HashMap<RuleKey, Arc<CopyratorRule>>;

    fn deref(&self) -> &Self::Target {
        &self.by_key
    }
}

impl RuleView {
    /// Takes `rule` at `key`; a rule of another UID it replaces (deleted and
    /// made again while no delete event reached us) is no live rule any more.
    fn insert(&mut self, key: RuleKey, rule: Arc<CopyratorRule>) {
        if let Some(previous) = self.by_key.get(&key)
            && previous.uid() != rule.uid()
            && let Some(old) = previous.uid().map(str::to_owned)
        {
            self.by_uid.remove(&old);
            self.went(old);
        }
        if let Some(uid) = rule.uid() {
            self.by_uid.insert(uid.to_owned(), key.clone());
        }
        self.by_key.insert(key, rule);
    }

    fn remove(&mut self, key: &RuleKey) -> Option<Arc<CopyratorRule>> {
        let rule = self.by_key.remove(key)?;
        if let Some(uid) = rule.uid() {
            self.by_uid.remove(uid);
            self.went(uid.to_owned());
        }
        Some(rule)
    }

    fn went(&mut self, uid: String) {
        let now = std::time::Instant::now();
        self.gone
            .retain(|_, at| now.duration_since(*at) < GONE_RULES_REMEMBERED);
        self.gone.insert(uid, now);
    }

    /// Whether the rule of `uid` left the view (deleted, or replaced by
    /// another of its name).
    fn is_gone(&self, uid: Option<&str>) -> bool {
        uid.is_some_and(|uid| self.gone.contains_key(uid))
    }
}

/// Whether a rule's spec says anything of clusters (its resolution, which
/// may not have run yet, says which).
fn names_clusters(rule: &CopyratorRule) -> bool {
    rule.spec
        .as_ref()
        .and_then(|spec| spec.targets.as_ref())
        .is_some_and(|targets| targets.clusters.is_some())
}

/// The controller's state, shared by the watches, the workers and the HTTP
/// server: the cluster it serves, what it follows, the rules, and what it
/// remembers of each rule and each copy between passes.
///
/// Lock order. Where one lock is held while another is taken, they come in
/// this order, never the reverse: the cluster's `kind_watches`, then
/// `resolved`, `memory`, the views' `namespaces`, the views' `copies` (one
/// kind at a time), the views' `roles`, `rules`, `backoffs`. (A plan reads
/// the views and asks `rules` whether a copy's rule is alive; a rule taken
/// in asks `backoffs` to forget it.) The cluster's `sources` and `kind_refusals`, and the
/// queue's own lock, are never held while another is taken. With members:
/// `memory`, `backoffs` and the views are each site's own, and no two
/// sites' locks are held at once; the members' `started` comes before
/// the views (a member that left is let go when it holds no copy); a
/// member's `labels`, `reach` and `reports` are never held while another
/// lock is taken, nor are the rules' `notes` (kept once, at home).
pub(crate) struct Shared {
    /// The cluster the operator runs in: its rules, sources and copies.
    pub(crate) home: Arc<Site>,
    pub(crate) options: Options,
    pub(crate) trust: Trust,
    pub(crate) rules: RwLock<RuleView>,
    /// Each valid rule as its last pass resolved it: which namespaces
    /// concern it, so that a namespace event queues only those rules.
    pub(crate) resolved: RwLock<HashMap<RuleKey, Arc<ResolvedRule>>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) leader: LeaderGate,
    pub(crate) health: Arc<Health>,
    /// Rung when a rule leaves the view, for the task that stops the copy
    /// watches no rule needs.
    pub(crate) rules_gone: tokio::sync::Notify,
    /// The member clusters of the inventory.
    pub(crate) members: Members,
    /// What each rule remembers once of what it said (each site's passes
    /// keep their own memory: `Site::memory`).
    pub(crate) notes: std::sync::Mutex<HashMap<RuleKey, RuleNotes>>,
    /// Set once at shutdown: work loops (home's and every member's) stop.
    stop: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn new(
        clients: crate::cluster::client::Clients,
        trust: Trust,
        options: Options,
        metrics: Arc<Metrics>,
        leader: LeaderGate,
        health: Arc<Health>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|weak: &std::sync::Weak<Self>| {
            let weak = weak.clone();
            // A source event queues the rules it concerns: a message to
            // the controller, which sits above the cluster's watches.
            let queue_rule = Arc::new(move |key: &RuleKey, touch: Touch| {
                if let Some(shared) = weak.upgrade() {
                    shared.queue_everywhere(key, touch);
                }
            });
            metrics.cluster_started(&options.cluster_name, true);
            let cluster = Cluster::new(
                clients,
                options.limits,
                ClusterMetrics::new(metrics.clone(), &options.cluster_name),
                leader.clone(),
                health.clone(),
                queue_rule,
                Some(metrics.write_concurrency.clone()),
            );
            Self {
                home: Arc::new(Site::new(SiteName::Home, cluster, metrics.clone())),
                trust,
                options,
                rules: RwLock::default(),
                resolved: RwLock::default(),
                metrics,
                leader,
                health,
                rules_gone: tokio::sync::Notify::new(),
                members: Members::default(),
                notes: std::sync::Mutex::default(),
                stop: tokio::sync::watch::Sender::new(false),
            }
        })
    }

    /// Told when the work loops are to stop.
    pub(crate) fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Stop the work loops, home's and every member's.
    pub(crate) fn stop_work(&self) {
        self.stop.send_replace(true);
    }

    /// The rules a site has passes for: every rule at home; in a member,
    /// those whose targets select it and those that still hold copies or
    /// state there.
    pub(crate) fn rules_for(&self, site: &SiteName) -> Vec<RuleKey> {
        // The rules are read first and let go: the checks below take locks
        // that come before `rules` in the lock order.
        let rules: Vec<(RuleKey, Option<String>)> = read(&self.rules)
            .iter()
            .map(|(key, rule)| (key.clone(), rule.uid().map(str::to_owned)))
            .collect();
        let Some(name) = site.member() else {
            return rules.into_iter().map(|(key, _)| key).collect();
        };
        let Some(member) = self.members.get(name) else {
            return Vec::new();
        };
        let held = lock(&member.site.memory)
            .keys()
            .cloned()
            .collect::<HashSet<_>>();
        rules
            .into_iter()
            .filter(|(key, uid)| {
                held.contains(key)
                    || self.names_member(key, &member)
                    || uid
                        .as_deref()
                        .is_some_and(|uid| member.holds_copies_of(uid))
            })
            .map(|(key, _)| key)
            .collect()
    }

    /// The rules whose targets (as last resolved) select a member.
    pub(crate) fn rules_naming(&self, member: &Member) -> Vec<RuleKey> {
        let keys: Vec<RuleKey> = read(&self.rules).keys().cloned().collect();
        let labels = read(&member.labels).clone();
        let resolved = read(&self.resolved);
        keys.into_iter()
            .filter(|key| {
                resolved
                    .get(key)
                    .is_some_and(|rule| rule.clusters.selects(member.name(), &labels))
            })
            .collect()
    }

    /// Whether a rule's targets (as last resolved) select a member.
    pub(crate) fn names_member(&self, key: &RuleKey, member: &Member) -> bool {
        let labels = read(&member.labels).clone();
        read(&self.resolved)
            .get(key)
            .is_some_and(|rule| rule.clusters.selects(member.name(), &labels))
    }

    /// Members that left the inventory and hold no copy of a rule any more go.
    pub(crate) fn retire_left_members(&self) {
        let uids: Vec<String> = read(&self.rules)
            .values()
            .filter_map(|rule| rule.uid().map(str::to_owned))
            .collect();
        let gone = self.members.retire_left(
            &uids,
            crate::controller::members::MEMBER_CLEANUP_GIVES_UP_AFTER,
        );
        for name in gone {
            self.metrics.cluster_gone(&name);
        }
    }

    /// A site's name as copies and `copyrator plan` name it: the home
    /// cluster's `--cluster-name`, or the member's name in the inventory.
    pub(crate) fn cluster_name<'a>(&'a self, site: &'a SiteName) -> &'a str {
        site.member().unwrap_or(&self.options.cluster_name)
    }

    /// Queue a rule's pass at home, and in every member where it has one.
    pub(crate) fn queue_everywhere(&self, key: &RuleKey, touch: Touch) {
        self.home.queue.add(key.clone(), touch.clone());
        let rule = read(&self.rules).get(key).cloned();
        for member in self.members.all() {
            let concerned = lock(&member.site.memory).contains_key(key)
                || rule.as_ref().is_some_and(|rule| {
                    names_clusters(rule)
                        || rule.uid().is_some_and(|uid| member.holds_copies_of(uid))
                });
            if concerned {
                member.site.queue.add(key.clone(), touch.clone());
            }
        }
    }

    pub(crate) fn copies(&self, kind: Kind) -> &RwLock<CopyIndex> {
        self.home.cluster.views.copies(kind)
    }

    pub(crate) fn rule_by_uid(&self, uid: &str) -> Option<RuleKey> {
        read(&self.rules).by_uid.get(uid).cloned()
    }

    /// Take a rule as watched or as returned by our own write. A version
    /// older than the one held is ignored; a changed spec lets every copy
    /// that waits out a backoff be written at once. A rule whose spec,
    /// deletion and finalizers are as they were (its status changed) gets a
    /// pass that looks at no copy: it only says its status again if needed.
    pub(crate) fn set_rule(&self, key: RuleKey, rule: Arc<CopyratorRule>) {
        let asks_the_same = read(&self.rules)
            .get(&key)
            .is_some_and(|held| asks_the_same(held, &rule));
        if self.set_rule_quietly(key.clone(), rule) {
            if asks_the_same {
                self.home.queue.add(key, Touch::Nothing);
            } else {
                self.queue_everywhere(&key, Touch::All);
            }
        }
    }

    /// Take the answer to our own status write: the rule as the API server
    /// holds it now. That may be a newer spec than the pass read (a change
    /// made while the pass ran), and its watch event, older than this
    /// answer, will be ignored: so a changed spec is queued here, as its
    /// watch event would have queued it. An unchanged one queues nothing
    /// (the pass that wrote the status has said all there is).
    pub(crate) fn take_status_answer(&self, key: RuleKey, rule: Arc<CopyratorRule>) {
        let asks_the_same = read(&self.rules)
            .get(&key)
            .is_some_and(|held| asks_the_same(held, &rule));
        if self.set_rule_quietly(key.clone(), rule) && !asks_the_same {
            self.queue_everywhere(&key, Touch::All);
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
        {
            let mut rules = write(&self.rules);
            if rules.is_gone(rule.uid()) {
                return false;
            }
            if let Some(previous) = rules.get(&key) {
                let same_object = previous.uid() == rule.uid();
                if same_object && is_older(&rule, previous) {
                    return false;
                }
                if !same_object || previous.metadata.generation != rule.metadata.generation {
                    lock(&self.home.backoffs).forget_rule(&key);
                }
            }
            // A rule of another UID replaced here (deleted and made again
            // while no delete event reached us, as on a relist) is no live
            // rule any more: its copies are adopted, not taken for another's.
            rules.insert(key.clone(), rule.clone());
        }
        self.metrics
            .rule_readiness(&key.namespace, &key.name, Some(rule.is_ready()));
        true
    }

    /// Forget a rule and everything held for it.
    pub(crate) fn forget_rule(&self, key: &RuleKey) {
        write(&self.rules).remove(key);
        self.metrics.rule_readiness(&key.namespace, &key.name, None);
        write(&self.resolved).remove(key);
        lock(&self.home.cluster.sources).remove(key);
        self.metrics
            .source_watches
            .set(lock(&self.home.cluster.sources).watch_count() as i64);
        lock(&self.home.backoffs).forget_rule(key);
        self.drop_memory(key);
        self.metrics
            .copies_contested
            .set(lock(&self.home.backoffs).contested_total() as i64);
        // The copy watches of kinds no rule needs any more stop: a message
        // to their task (kinds::release_on_rules_gone), which sits above this view.
        self.rules_gone.notify_one();
    }

    /// Drop what is held for a rule that is gone: its memory (with its share
    /// of the gauges) and anything queued for it. A pass that was under way
    /// when the rule went may have brought its memory back.
    pub(crate) fn drop_memory(&self, key: &RuleKey) {
        self.home.queue.forget(key);
        lock(&self.home.memory).remove(key);
        if let Some(notes) = lock(&self.notes).remove(key) {
            self.metrics.copies_managed.dec_by(notes.copies);
            self.metrics.conflicts_skipped.dec_by(notes.conflicts);
        }
        for member in self.members.all() {
            member.site.queue.forget(key);
            lock(&member.site.memory).remove(key);
            lock(&member.site.backoffs).forget_rule(key);
            member.report(key, None);
        }
    }

    /// Queue the rules a change of namespace `name` concerns, for that
    /// namespace alone; a rule not resolved yet (new, or invalid), or one
    /// taking sources from it, looks at everything, to be safe.
    pub(crate) fn namespace_changed(
        &self,
        site: &Site,
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
            site.queue.add(key, touch);
        }
    }

    /// A copy at `(namespace, name)` changed or went: the rules that skipped
    /// that place as a conflict (another rule's copy was there, or one
    /// handed over), and those that still owe a write there (another
    /// rule's copy that came is a conflict now), look at it again.
    pub(crate) fn copy_place_changed(&self, site: &Site, namespace: &str, name: &str) {
        let concerned: Vec<RuleKey> = lock(&site.memory)
            .iter()
            .filter(|(_, memory)| memory.tally.is_unsettled(namespace, name))
            .map(|(key, _)| key.clone())
            .collect();
        for key in concerned {
            site.queue
                .add(key, Touch::Copy(namespace.to_owned(), name.to_owned()));
        }
    }

    /// The foreign watch of `kind` at `site` saw `event`: each rule that
    /// copied that kind there at its last pass brings what it believes of
    /// the place up to date, and looks at the place again where that
    /// changed; after a break in the watch, at every place it believed
    /// held. Rules not resolved now (an invalid one) keep following too.
    pub(crate) fn foreign_changed(&self, site: &Site, kind: Kind, event: ForeignEvent) {
        let at = match &event {
            ForeignEvent::Started => None,
            ForeignEvent::Applied(object) => Some((
                (object.namespace.to_string(), object.name.to_string()),
                ForeignChange::Applied(object),
            )),
            ForeignEvent::Gone { namespace, name } => {
                Some(((namespace.clone(), name.clone()), ForeignChange::Gone))
            }
        };
        let mut again: Vec<(RuleKey, ObjectKey)> = Vec::new();
        {
            let mut memory = lock(&site.memory);
            for (key, memory) in memory.iter_mut() {
                let RuleMemory {
                    known_conflicts,
                    tally,
                    ..
                } = memory;
                if !known_conflicts.follows(kind) {
                    continue;
                }
                match &at {
                    None => again.extend(
                        known_conflicts
                            .forget_all()
                            .into_iter()
                            .map(|place| (key.clone(), place)),
                    ),
                    Some((place, change)) => {
                        if known_conflicts.foreign_changed(tally, place, *change) {
                            again.push((key.clone(), place.clone()));
                        }
                    }
                }
            }
        }
        for (key, (namespace, name)) in again {
            site.queue.add(key, Touch::Copy(namespace, name));
        }
    }

    pub(crate) fn is_live_rule(&self, uid: &str) -> bool {
        read(&self.rules).by_uid.contains_key(uid)
    }

    /// Publish an Event on a rule (only the leader does).
    pub(crate) async fn event(
        &self,
        rule: &CopyratorRule,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.home.cluster.writer.rule_event(rule, &event).await {
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

/// The controller's state over a client that is never asked anything:
/// for unit tests that read and change the views and memories alone.
#[cfg(test)]
pub(crate) fn test_shared() -> Arc<Shared> {
    test_shared_with(Trust::new("ops", false))
}

/// [`test_shared`] under `trust`.
#[cfg(test)]
pub(crate) fn test_shared_with(trust: Trust) -> Arc<Shared> {
    test_shared_gated(trust).0
}

/// [`test_shared_with`], leading until `false` is sent on the sender.
#[cfg(test)]
pub(crate) fn test_shared_gated(trust: Trust) -> (Arc<Shared>, tokio::sync::watch::Sender<bool>) {
    use std::time::Duration;
    let clients = crate::cluster::fake_objects::never_asked_clients();
    let (gate, lead) = LeaderGate::always();
    let shared = Shared::new(
        clients,
        trust,
        Options {
            rule_name: None,
            limits: Limits::for_tests(),
            keep_kind_watches: false,
            cluster_name: "home".to_owned(),
            member_clusters: false,
            min_restart_interval: std::time::Duration::from_secs(30),
            allow_insecure_members: false,
            member_copy_protection: None,
            provider_file: None,
            allow_kubeconfig_plugins: false,
        },
        Arc::new(Metrics::default()),
        gate,
        Arc::new(Health::new(Duration::from_secs(60))),
    );
    (shared, lead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scope::Scope;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn shared() -> Arc<Shared> {
        test_shared()
    }

    fn rule(uid: &str, generation: i64, version: u64) -> Arc<CopyratorRule> {
        Arc::new(CopyratorRule {
            metadata: ObjectMeta {
                namespace: Some("ops".into()),
                name: Some("r".into()),
                uid: Some(uid.into()),
                generation: Some(generation),
                resource_version: Some(version.to_string()),
                ..ObjectMeta::default()
            },
            ..CopyratorRule::default()
        })
    }

    fn key() -> RuleKey {
        RuleKey {
            namespace: "ops".into(),
            name: "r".into(),
        }
    }

    /// What is queued now, rule by rule (the queue is emptied).
    async fn queued(shared: &Shared) -> Vec<(RuleKey, Scope)> {
        let mut out = Vec::new();
        while !shared.home.queue.is_empty() {
            let next = tokio::time::timeout(Duration::from_secs(1), shared.home.queue.next()).await;
            let (key, scope) = next.expect("a queued rule is handed out");
            shared.home.queue.done(&key);
            out.push((key, scope));
        }
        out
    }

    #[tokio::test]
    async fn a_new_spec_is_a_pass_over_everything_and_a_new_status_one_over_nothing() {
        let shared = shared();
        shared.set_rule(key(), rule("u1", 1, 10));
        let first = queued(&shared).await;
        assert!(first.len() == 1 && first[0].1.is_everything(), "{first:?}");
        // Its status written (same generation): a pass that looks at no copy.
        shared.set_rule(key(), rule("u1", 1, 11));
        let status = queued(&shared).await;
        assert!(status.len() == 1 && status[0].1.is_empty(), "{status:?}");
        // An older version than the one held is ignored.
        shared.set_rule(key(), rule("u1", 2, 9));
        assert!(queued(&shared).await.is_empty());
        assert_eq!(read(&shared.rules)[&key()].metadata.generation, Some(1));
    }

    #[tokio::test]
    async fn a_status_answer_with_a_new_spec_queues_the_pass_its_event_would() {
        let shared = shared();
        shared.set_rule(key(), rule("u1", 1, 10));
        queued(&shared).await;
        shared.take_status_answer(key(), rule("u1", 1, 12));
        assert!(
            queued(&shared).await.is_empty(),
            "the same spec: nothing more to say"
        );
        shared.take_status_answer(key(), rule("u1", 2, 14));
        let changed = queued(&shared).await;
        assert!(
            changed.len() == 1 && changed[0].1.is_everything(),
            "{changed:?}"
        );
        // The watch event of that change, older than the answer, changes nothing.
        shared.set_rule(key(), rule("u1", 2, 13));
        assert!(queued(&shared).await.is_empty());
    }

    #[tokio::test]
    async fn a_rule_made_again_under_its_name_leaves_no_live_old_uid() {
        let shared = shared();
        shared.set_rule(key(), rule("u1", 1, 10));
        assert!(shared.is_live_rule("u1"));
        shared.set_rule(key(), rule("u2", 1, 20));
        assert!(
            !shared.is_live_rule("u1"),
            "the old rule's copies are orphans to adopt"
        );
        assert_eq!(shared.rule_by_uid("u2"), Some(key()));
        shared.forget_rule(&key());
        assert!(!shared.is_live_rule("u2"));
        assert!(read(&shared.rules).is_empty());
        // The copy watches hear that a rule left.
        tokio::time::timeout(Duration::from_secs(1), shared.rules_gone.notified())
            .await
            .expect("rules_gone rung");
    }

    #[tokio::test]
    async fn an_answer_to_a_write_read_after_the_rules_delete_does_not_bring_it_back() {
        let shared = shared();
        shared.set_rule(key(), rule("u1", 1, 10));
        queued(&shared).await;
        // The watch's delete, then the answer to a status write sent before.
        shared.forget_rule(&key());
        shared.take_status_answer(key(), rule("u1", 1, 11));
        assert!(!shared.is_live_rule("u1"), "its copies are orphans");
        assert!(read(&shared.rules).is_empty());
        assert!(queued(&shared).await.is_empty());
        // Another rule of the name (a new UID) is taken.
        shared.set_rule(key(), rule("u2", 1, 20));
        assert!(shared.is_live_rule("u2"));
        // And one replaced under its name stays gone too.
        shared.take_status_answer(key(), rule("u1", 1, 12));
        assert_eq!(shared.rule_by_uid("u2"), Some(key()));
        assert!(!shared.is_live_rule("u1"));
    }

    #[tokio::test]
    async fn a_namespace_change_reaches_an_unresolved_rule_as_a_pass_over_everything() {
        let shared = shared();
        shared.set_rule(key(), rule("u1", 1, 10));
        queued(&shared).await;
        let info = NamespaceInfo {
            labels: BTreeMap::new(),
            terminating: false,
            accept_from: Vec::new(),
            adopt_from: Vec::new(),
        };
        shared.namespace_changed(&shared.home, "t1", None, Some(&info));
        let touched = queued(&shared).await;
        assert!(
            touched.len() == 1 && touched[0].1.is_everything(),
            "{touched:?}"
        );
    }
}
