//! Source watches shared by every rule, within a budget of watches.
//!
//! A rule needs the objects of one kind that match its selector in its
//! source namespaces. Rules that need the same kind, namespace and selector
//! share one watch, filtered by the selector on the server. When the rules
//! together need more such watches than `--max-source-watches`, the kinds
//! with the most needs get one watch across all namespaces instead, whose
//! objects are kept only where some rule wants them. So the connections and
//! requests do not grow with the number of rules or the length of a rule's
//! namespace list, and memory follows what the rules select.
//!
//! The rules of a tenant namespace share one watch per kind and source
//! namespace whatever their selectors, so that a source is fetched and held
//! once however many of them select it, and what those watches hold
//! together stays within a bound ([`TenantBytes`]).
//!
//! A watch lists again when the rules want more from it (a new namespace
//! or selector), after a short pause so that a burst of new rules costs one
//! list, and never before its previous list finished.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::api::kinds::Kind;
use crate::api::rule::RuleKey;
use crate::api::selector::LabelSelector;
use crate::cache::index::Object;
use crate::cluster::client::WatchConnections;
use crate::cluster::watch::{Change, FailureRun, Folder, lasts, map_event, wait_out, watch_config};
use crate::core::backoff::{ReadPause, WatchBackoff};
use crate::core::resolve::ResolvedRule;
use crate::core::scope::Touch;
use crate::sync::{lock, read, write};

/// Called with each rule whose sources changed.
pub(crate) type OnChange = Arc<dyn Fn(&RuleKey, Touch) + Send + Sync>;

/// A new list of a watch across all namespaces waits this long for more
/// rules to want more from it.
const RELIST_AFTER: Duration = Duration::from_millis(250);

/// What one rule needs from the source watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SourceNeed {
    pub(crate) kind: Kind,
    pub(crate) selector: LabelSelector,
    /// Sorted, without duplicates.
    pub(crate) namespaces: Vec<String>,
    /// A tenant rule's own namespace: from every other namespace it only
    /// pulls what consents to copies there (see [`Interest::wants`]).
    pub(crate) pulls_into: Option<String>,
}

impl SourceNeed {
    pub(crate) fn of(rule: &ResolvedRule) -> Self {
        let mut namespaces = rule.source_namespaces.clone();
        namespaces.sort();
        namespaces.dedup();
        Self {
            kind: rule.kind,
            selector: rule.selector.clone(),
            namespaces,
            pulls_into: rule.tenant.then(|| rule.key.namespace.clone()),
        }
    }

    /// The namespace a source of `namespace` may be pulled into, when it
    /// is a pull (a tenant rule's source namespace other than its own).
    fn pull_into(&self, namespace: &str) -> Option<&str> {
        self.pulls_into.as_deref().filter(|own| *own != namespace)
    }
}

/// Where a watch looks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum WatchScope {
    Namespace(String),
    AllNamespaces,
}

/// The longest selector a watch's name shows as it is.
const SELECTOR_SHOWN: usize = 80;

/// One watch: a kind, a scope, and the label selector the API server
/// filters it by (empty: every object but our copies).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct WatchKey {
    pub(crate) kind: Kind,
    pub(crate) scope: WatchScope,
    pub(crate) selector: String,
    /// Every rule it serves pulls from its namespace: it watches metadata
    /// alone, and reads an object whole only when it consents (nothing of
    /// what does not consent is fetched or held).
    pub(crate) pulls_only: bool,
    /// The tenant namespace whose rules alone it serves (one watch per
    /// kind and namespace for all their selectors): what it holds counts
    /// against that namespace's bound ([`TenantBytes`]).
    pub(crate) tenant: Option<String>,
}

impl WatchKey {
    /// For the log and the rules' status: its kind, scope and selector; a
    /// long selector (a rule's to choose) by a hash, so that no rule's
    /// size reaches a log line.
    fn name(&self) -> String {
        let hashed;
        let selector = if self.selector.is_empty() {
            "any labels"
        } else if self.selector.len() > SELECTOR_SHOWN {
            let mut state = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(&self.selector, &mut state);
            hashed = format!("selector {:016x}", std::hash::Hasher::finish(&state));
            hashed.as_str()
        } else {
            self.selector.as_str()
        };
        let sources = if self.pulls_only {
            "consenting sources"
        } else {
            "sources"
        };
        let rules = match &self.tenant {
            Some(tenant) => format!(" for the rules of {tenant}"),
            None => String::new(),
        };
        match &self.scope {
            WatchScope::Namespace(ns) => {
                format!("{} {sources} in {ns} ({selector}){rules}", self.kind)
            }
            WatchScope::AllNamespaces => {
                format!("{} sources in all namespaces ({selector})", self.kind)
            }
        }
    }
}

/// Which rules want which objects of a watch: by namespace, the rules'
/// selectors. An object no rule wants is not kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Interest {
    by_namespace: BTreeMap<String, Vec<Wanted>>,
}

/// One rule's want of a namespace's objects.
#[derive(Clone, Debug, PartialEq)]
struct Wanted {
    selector: LabelSelector,
    rule: RuleKey,
    /// A pull: only objects that consent to copies into this namespace.
    pull_into: Option<String>,
}

impl Interest {
    fn add(&mut self, namespace: &str, need: &SourceNeed, rule: &RuleKey) {
        self.by_namespace
            .entry(namespace.to_owned())
            .or_default()
            .push(Wanted {
                selector: need.selector.clone(),
                rule: rule.clone(),
                pull_into: need.pull_into(namespace).map(str::to_owned),
            });
    }

    /// Whether some rule wants an object of `namespace` with these labels
    /// and annotations: its selector matches, and for a pull the object's
    /// `copyrator.flant.com/allow-to` consents.
    pub(crate) fn wants(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> bool {
        self.by_namespace.get(namespace).is_some_and(|wanted| {
            wanted.iter().any(|w| {
                w.selector.matches(labels)
                    && w.pull_into.as_deref().is_none_or(|into| {
                        crate::core::plan::annotations_allow_to(annotations, into)
                    })
            })
        })
    }

    fn wants_object(&self, object: &Object) -> bool {
        self.wants(&object.namespace, &object.labels, &object.annotations)
    }

    /// The rules that want an object of these labels in this namespace.
    pub(crate) fn rules_for<'a>(
        &'a self,
        namespace: &str,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a RuleKey> + 'a {
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|w| w.selector.matches(labels))
            .map(|w| &w.rule)
    }

    pub(crate) fn rules(&self) -> BTreeSet<&RuleKey> {
        self.by_namespace
            .values()
            .flatten()
            .map(|w| &w.rule)
            .collect()
    }

    /// The (namespace, selector, pull) wants, for comparing interests.
    fn wanted(&self) -> BTreeSet<(&str, String, Option<&str>)> {
        self.by_namespace
            .iter()
            .flat_map(|(ns, wanted)| {
                wanted
                    .iter()
                    .map(move |w| (ns.as_str(), w.selector.to_query(), w.pull_into.as_deref()))
            })
            .collect()
    }

    /// Whether this wants something `before` did not (then a watch across
    /// all namespaces must list again: it dropped those objects).
    pub(crate) fn wants_more_than(&self, before: &Interest) -> bool {
        !self.wanted().is_subset(&before.wanted())
    }
}

/// The most source watches the rules of one tenant namespace need
/// together (a watch per kind and source namespace, whatever their
/// selectors): past it, the rules that would need more, taken in name
/// order, wait, saying why, until others of the namespace go. One rule
/// names at most [`crate::core::resolve::MAX_TENANT_SOURCE_NAMESPACES`]
/// namespaces; this bounds what many rules take.
pub(crate) const MAX_TENANT_SOURCE_WATCHES: usize = 64;

/// The watches to run, and the rules left without theirs.
#[derive(Debug, Default)]
pub(crate) struct WatchPlan {
    pub(crate) watches: BTreeMap<WatchKey, Interest>,
    /// Tenant rules past [`MAX_TENANT_SOURCE_WATCHES`], with why.
    pub(crate) over_budget: BTreeMap<RuleKey, String>,
}

/// The tenant rules whose watches would take their namespace's rules past
/// [`MAX_TENANT_SOURCE_WATCHES`], in name order, with why.
fn over_tenant_budget(needs: &BTreeMap<RuleKey, SourceNeed>) -> BTreeMap<RuleKey, String> {
    let mut taken: HashMap<&str, BTreeSet<(Kind, &str)>> = HashMap::new();
    let mut over = BTreeMap::new();
    for (rule, need) in needs {
        let Some(tenant) = need.pulls_into.as_deref() else {
            continue;
        };
        let held = taken.entry(tenant).or_default();
        let more: Vec<(Kind, &str)> = need
            .namespaces
            .iter()
            .map(|ns| (need.kind, ns.as_str()))
            .filter(|watch| !held.contains(watch))
            .collect();
        if held.len() + more.len() > MAX_TENANT_SOURCE_WATCHES {
            over.insert(
                rule.clone(),
                format!(
                    "not watched: the rules of namespace {tenant} would need more than \
                     {MAX_TENANT_SOURCE_WATCHES} source watches together (one per kind and \
                     source namespace); this rule waits until others of the namespace need fewer"
                ),
            );
        } else {
            held.extend(more);
        }
    }
    over
}

/// The watches that serve `needs`, and what each is wanted for.
///
/// The operator's own rules get a watch per kind, namespace and selector;
/// past `budget` such watches, the kinds with the most are watched across
/// all namespaces (filtered by the selector when every such rule of the
/// kind uses the same one).
///
/// The rules of a tenant namespace get one watch per kind and source
/// namespace, whatever their selectors, filtered on the server by the
/// requirements all those selectors share: each object is fetched and held
/// once however many of its rules select it, and counts once against the
/// namespace's bound. Their watches stay in their namespaces and count
/// apart (nothing a tenant writes makes the operator list a kind across
/// the cluster); a namespace the tenant only pulls from is watched for
/// metadata ([`WatchKey::pulls_only`]); and the rules of one tenant
/// namespace take at most [`MAX_TENANT_SOURCE_WATCHES`] watches together.
pub(crate) fn plan_watches(needs: &BTreeMap<RuleKey, SourceNeed>, budget: usize) -> WatchPlan {
    let over_budget = over_tenant_budget(needs);
    let served = || {
        needs
            .iter()
            .filter(|(rule, _)| !over_budget.contains_key(*rule))
    };
    let mut planned: BTreeMap<WatchKey, Interest> = BTreeMap::new();
    plan_own_watches(
        served().filter(|(_, need)| need.pulls_into.is_none()),
        budget,
        &mut planned,
    );
    plan_tenant_watches(
        served().filter_map(|(rule, need)| Some((rule, need, need.pulls_into.as_deref()?))),
        &mut planned,
    );
    WatchPlan {
        watches: planned,
        over_budget,
    }
}

/// The watches of the operator's own rules: one per kind, namespace and
/// selector, within `budget` (see [`plan_watches`]).
fn plan_own_watches<'a>(
    own: impl Iterator<Item = (&'a RuleKey, &'a SourceNeed)> + Clone,
    budget: usize,
    planned: &mut BTreeMap<WatchKey, Interest>,
) {
    let mut pairs: BTreeMap<Kind, BTreeSet<(&str, String)>> = BTreeMap::new();
    for (_, need) in own.clone() {
        let query = need.selector.to_query();
        let kind_pairs = pairs.entry(need.kind).or_default();
        for ns in &need.namespaces {
            kind_pairs.insert((ns.as_str(), query.clone()));
        }
    }
    let mut across: BTreeSet<Kind> = BTreeSet::new();
    loop {
        let namespaced: usize = pairs
            .iter()
            .filter(|(kind, _)| !across.contains(kind))
            .map(|(_, p)| p.len())
            .sum();
        if namespaced + across.len() <= budget.max(1) {
            break;
        }
        // The kind with the most namespaced watches goes across namespaces.
        let Some((&kind, _)) = pairs
            .iter()
            .filter(|(kind, p)| !across.contains(kind) && !p.is_empty())
            .max_by_key(|(kind, p)| (p.len(), std::cmp::Reverse(**kind)))
        else {
            break;
        };
        across.insert(kind);
    }
    // Across namespaces, the API server still filters by the selector when
    // every rule of the kind uses the same one.
    let common_selector = |kind: Kind| {
        let selectors: BTreeSet<&str> = pairs[&kind].iter().map(|(_, q)| q.as_str()).collect();
        match selectors.into_iter().collect::<Vec<_>>()[..] {
            [only] => only.to_owned(),
            _ => String::new(),
        }
    };
    for (rule, need) in own {
        let query = need.selector.to_query();
        for ns in &need.namespaces {
            let (scope, selector) = if across.contains(&need.kind) {
                (WatchScope::AllNamespaces, common_selector(need.kind))
            } else {
                (WatchScope::Namespace(ns.clone()), query.clone())
            };
            let key = WatchKey {
                kind: need.kind,
                scope,
                selector,
                pulls_only: false,
                tenant: None,
            };
            planned.entry(key).or_default().add(ns, need, rule);
        }
    }
}

/// The watches of tenant rules (with their namespace): one per tenant
/// namespace, kind and source namespace, filtered by what its rules'
/// selectors there share (see [`plan_watches`]).
fn plan_tenant_watches<'a>(
    tenants: impl Iterator<Item = (&'a RuleKey, &'a SourceNeed, &'a str)> + Clone,
    planned: &mut BTreeMap<WatchKey, Interest>,
) {
    let mut selectors: BTreeMap<(&str, Kind, &str), Vec<&LabelSelector>> = BTreeMap::new();
    for (_, need, tenant) in tenants.clone() {
        for ns in &need.namespaces {
            selectors
                .entry((tenant, need.kind, ns.as_str()))
                .or_default()
                .push(&need.selector);
        }
    }
    let shared: BTreeMap<(&str, Kind, &str), String> = selectors
        .into_iter()
        .map(|(at, selectors)| (at, LabelSelector::common(selectors).to_query()))
        .collect();
    for (rule, need, tenant) in tenants {
        for ns in &need.namespaces {
            let key = WatchKey {
                kind: need.kind,
                scope: WatchScope::Namespace(ns.clone()),
                selector: shared[&(tenant, need.kind, ns.as_str())].clone(),
                pulls_only: need.pull_into(ns).is_some(),
                tenant: Some(tenant.to_owned()),
            };
            planned.entry(key).or_default().add(ns, need, rule);
        }
    }
}

/// One source a watch keeps: whole, or, while the sources of its tenant
/// namespace are past their bound, only its size.
#[derive(Clone)]
struct Held {
    namespace: Arc<str>,
    name: Arc<str>,
    uid: String,
    /// [`Object::approximate_bytes`].
    bytes: u64,
    object: Option<Arc<Object>>,
}

impl Held {
    fn whole(object: Object) -> Self {
        Self {
            namespace: object.namespace.clone(),
            name: object.name.clone(),
            uid: object.uid.clone(),
            bytes: object.approximate_bytes(),
            object: Some(Arc::new(object)),
        }
    }
}

/// What a watch keeps: the sources its rules want, by namespace and name.
#[derive(Default)]
struct Store {
    objects: HashMap<Arc<str>, HashMap<Arc<str>, Held>>,
    /// The bytes of every source it keeps, whole or not.
    bytes: u64,
    /// Past its tenant namespace's bound: it keeps sizes, no object.
    past_bound: bool,
}

impl Store {
    fn insert(&mut self, mut held: Held) -> Option<Held> {
        if self.past_bound {
            held.object = None;
        }
        self.bytes += held.bytes;
        let previous = self
            .objects
            .entry(held.namespace.clone())
            .or_default()
            .insert(held.name.clone(), held);
        if let Some(previous) = &previous {
            self.bytes -= previous.bytes;
        }
        previous
    }

    fn get(&self, namespace: &str, name: &str) -> Option<&Held> {
        self.objects.get(namespace)?.get(name)
    }

    fn remove(&mut self, namespace: &str, name: &str) -> Option<Held> {
        let in_namespace = self.objects.get_mut(namespace)?;
        let removed = in_namespace.remove(name);
        if in_namespace.is_empty() {
            self.objects.remove(namespace);
        }
        if let Some(removed) = &removed {
            self.bytes -= removed.bytes;
        }
        removed
    }

    /// Keep only the whole objects `wanted` says; sizes alone stay (their
    /// watch lists again to know).
    fn retain(&mut self, wanted: impl Fn(&str, &Object) -> bool) {
        let mut bytes = 0;
        for (namespace, objects) in &mut self.objects {
            objects.retain(|_, held| {
                held.object
                    .as_deref()
                    .is_none_or(|object| wanted(namespace, object))
            });
            bytes += objects.values().map(|held| held.bytes).sum::<u64>();
        }
        self.objects.retain(|_, objects| !objects.is_empty());
        self.bytes = bytes;
    }

    /// Let go of every object, keeping their sizes.
    fn drop_objects(&mut self) {
        self.past_bound = true;
        for held in self.objects.values_mut().flat_map(HashMap::values_mut) {
            held.object = None;
        }
    }
}

/// The bytes of sources that the watches of one tenant namespace's rules
/// hold together, and the bound they stay within (`--max-tenant-source-mib`).
/// A watch that would take them past it keeps its sources' sizes alone,
/// and its rules say so ([`Sources::TooLarge`]) until it fits again.
pub(crate) struct TenantBytes {
    bound: u64,
    held: Mutex<HashMap<WatchKey, u64>>,
    /// Bumped when a watch lets bytes go: one past the bound may fit now.
    released: signal::Sender<u64>,
}

impl TenantBytes {
    fn new(bound: u64) -> Self {
        Self {
            bound,
            held: Mutex::default(),
            released: signal::channel(0).0,
        }
    }

    fn others(held: &HashMap<WatchKey, u64>, key: &WatchKey) -> u64 {
        held.iter()
            .filter(|(k, _)| *k != key)
            .map(|(_, bytes)| *bytes)
            .sum()
    }

    /// Whether `key` could hold `bytes` beside what the others hold.
    fn fits(&self, key: &WatchKey, bytes: u64) -> bool {
        Self::others(&lock(&self.held), key).saturating_add(bytes) <= self.bound
    }

    /// Let `key` hold `bytes` if they fit; whether they did.
    fn try_hold(&self, key: &WatchKey, bytes: u64) -> bool {
        let mut held = lock(&self.held);
        if Self::others(&held, key).saturating_add(bytes) > self.bound {
            return false;
        }
        let before = held.insert(key.clone(), bytes).unwrap_or(0);
        drop(held);
        if bytes < before {
            self.released.send_modify(|g| *g += 1);
        }
        true
    }

    /// `key` holds nothing any more.
    fn release(&self, key: &WatchKey) {
        if lock(&self.held).remove(key).is_some_and(|bytes| bytes > 0) {
            self.released.send_modify(|g| *g += 1);
        }
    }
}

/// What a tenant watch holds is let go from its namespace's count when its
/// task ends, however it ends (stopped by the hub: aborted).
struct HeldBytes {
    ledger: Arc<TenantBytes>,
    key: WatchKey,
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.ledger.release(&self.key);
    }
}

/// What a watch's task shares with the hub.
struct WatchState {
    store: RwLock<Store>,
    interest: RwLock<Interest>,
    /// The interest generation of the last completed list (0: none yet).
    listed: AtomicU64,
    /// Bumped when a list is wanted (the interest grew).
    wanted: signal::Sender<u64>,
    /// Why its last request failed, while it has not listed since: told to
    /// the rules it serves, in their status. A source watch serves rules,
    /// which tenants write, so its failures never count against the
    /// operator's liveness.
    failing: Mutex<Option<String>>,
}

struct Watch {
    state: Arc<WatchState>,
    task: JoinHandle<()>,
    /// Its connection's slot in the hub's [`WatchConnections`].
    connection: usize,
}

/// What the hub has for a rule's sources.
#[derive(Debug)]
pub(crate) enum Sources {
    Listed(Vec<Arc<Object>>),
    /// Not all listed yet: how many of the rule's namespaces are, and why
    /// not, if something is wrong ("the last try failed: …", or why the
    /// rule is not watched).
    Waiting {
        listed: usize,
        of: usize,
        failing: Option<String>,
    },
    /// The sources of the rule's namespace's rules together are past the
    /// bound of what a tenant namespace may make the operator hold: why.
    TooLarge(String),
    /// The rule has no need registered.
    Unknown,
}

/// The shared source watches and the rules they serve.
pub(crate) struct SourceHub {
    connections: WatchConnections,
    pause: Arc<ReadPause>,
    budget: usize,
    on_change: OnChange,
    needs: BTreeMap<RuleKey, SourceNeed>,
    watches: HashMap<WatchKey, Watch>,
    /// Each rule's watches and the generation each must have listed.
    served: HashMap<RuleKey, Vec<(WatchKey, u64)>>,
    /// Tenant rules left without watches, with why.
    over_budget: BTreeMap<RuleKey, String>,
    /// The most bytes of sources the watches of one tenant namespace's
    /// rules may hold together.
    tenant_bound: u64,
    /// Per tenant namespace with watches, what they hold.
    tenants: HashMap<String, Arc<TenantBytes>>,
}

impl SourceHub {
    pub(crate) fn new(
        connections: WatchConnections,
        pause: Arc<ReadPause>,
        budget: usize,
        tenant_bound: u64,
        on_change: OnChange,
    ) -> Self {
        Self {
            connections,
            pause,
            budget,
            on_change,
            needs: BTreeMap::new(),
            watches: HashMap::new(),
            served: HashMap::new(),
            over_budget: BTreeMap::new(),
            tenant_bound,
            tenants: HashMap::new(),
        }
    }

    /// Register what a rule needs; watches start, stop or list again as
    /// the needs of all rules together ask.
    pub(crate) fn set(&mut self, rule: &ResolvedRule) {
        let need = SourceNeed::of(rule);
        if self.needs.get(&rule.key) == Some(&need) {
            return;
        }
        self.needs.insert(rule.key.clone(), need);
        self.replan();
    }

    pub(crate) fn remove(&mut self, key: &RuleKey) {
        if self.needs.remove(key).is_some() {
            self.replan();
        }
    }

    pub(crate) fn watch_count(&self) -> usize {
        self.watches.len()
    }

    fn replan(&mut self) {
        let WatchPlan {
            watches: planned,
            over_budget,
        } = plan_watches(&self.needs, self.budget);
        self.over_budget = over_budget;
        let stale: Vec<WatchKey> = self
            .watches
            .keys()
            .filter(|k| !planned.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            if let Some(watch) = self.watches.remove(&key) {
                // Its task forgets its failures, and lets go of what it
                // held in its tenant's count, as it ends (guards).
                watch.task.abort();
                self.connections.release(watch.connection);
            }
        }
        self.served.clear();
        for (key, interest) in planned {
            let generation = match self.watches.get(&key) {
                Some(watch) => {
                    let before = read(&watch.state.interest).clone();
                    let grew = interest.wants_more_than(&before);
                    let changed = interest != before;
                    *write(&watch.state.interest) = interest;
                    let past_bound = read(&watch.state.store).past_bound;
                    // What it dropped is listed again; past the bound it
                    // keeps sizes alone, and lists again to know which.
                    if grew || (changed && past_bound) {
                        watch.state.wanted.send_modify(|g| *g += 1);
                    } else {
                        // Objects no rule wants any more are dropped.
                        let interest = read(&watch.state.interest);
                        let mut store = write(&watch.state.store);
                        store.retain(|ns, o| interest.wants(ns, &o.labels, &o.annotations));
                        if let Some(ledger) = self.ledger_of(&key) {
                            ledger.try_hold(&key, store.bytes);
                        }
                    }
                    *watch.state.wanted.borrow()
                }
                None => {
                    let watch = self.start(&key, interest);
                    let generation = *watch.state.wanted.borrow();
                    self.watches.insert(key.clone(), watch);
                    generation
                }
            };
            if let Some(watch) = self.watches.get(&key) {
                for rule in read(&watch.state.interest).rules() {
                    self.served
                        .entry(rule.clone())
                        .or_default()
                        .push((key.clone(), generation));
                }
            }
        }
        let watches = &self.watches;
        self.tenants.retain(|tenant, _| {
            watches
                .keys()
                .any(|k| k.tenant.as_deref() == Some(tenant.as_str()))
        });
    }

    /// What the watches of `key`'s tenant namespace hold, for a tenant's watch.
    fn ledger_of(&self, key: &WatchKey) -> Option<&Arc<TenantBytes>> {
        self.tenants.get(key.tenant.as_deref()?)
    }

    /// The rule's sources, once every watch it needs has listed them.
    pub(crate) fn sources(&self, key: &RuleKey) -> Sources {
        if let (Some(need), Some(why)) = (self.needs.get(key), self.over_budget.get(key)) {
            return Sources::Waiting {
                listed: 0,
                of: need.namespaces.len(),
                failing: Some(why.clone()),
            };
        }
        let (Some(need), Some(served)) = (self.needs.get(key), self.served.get(key)) else {
            return Sources::Unknown;
        };
        let listed = |(watch_key, generation): &(WatchKey, u64)| {
            self.watches
                .get(watch_key)
                .is_some_and(|w| w.state.listed.load(Ordering::Acquire) >= *generation)
        };
        if !served.iter().all(listed) {
            let namespaces_listed = served
                .iter()
                .filter(|w| listed(w))
                .map(|(k, _)| match k.scope {
                    WatchScope::Namespace(_) => 1,
                    WatchScope::AllNamespaces => need.namespaces.len(),
                })
                .sum::<usize>();
            let failing = served
                .iter()
                .filter(|w| !listed(w))
                .filter_map(|(k, _)| self.watches.get(k))
                .find_map(|w| lock(&w.state.failing).clone())
                .map(|failed| format!("the last try failed: {failed}"));
            return Sources::Waiting {
                listed: namespaces_listed.min(need.namespaces.len()),
                of: need.namespaces.len(),
                failing,
            };
        }
        let mut objects = Vec::new();
        for (watch_key, _) in served {
            let Some(watch) = self.watches.get(watch_key) else {
                continue;
            };
            let store = read(&watch.state.store);
            if store.past_bound {
                return Sources::TooLarge(self.too_large(watch_key, store.bytes));
            }
            let namespaces: &[String] = match &watch_key.scope {
                WatchScope::Namespace(ns) => std::slice::from_ref(ns),
                WatchScope::AllNamespaces => &need.namespaces,
            };
            for ns in namespaces {
                if let Some(in_namespace) = store.objects.get(ns.as_str()) {
                    objects.extend(
                        in_namespace
                            .values()
                            .filter_map(|held| held.object.as_ref())
                            .filter(|o| need.selector.matches(&o.labels))
                            .cloned(),
                    );
                }
            }
        }
        Sources::Listed(objects)
    }

    /// Unit tests only: the watches that serve `key` hold `objects` and
    /// have listed, as if their lists had come back (their tasks, with no
    /// API server to ask, are stopped).
    #[cfg(test)]
    pub(crate) fn listed_for_tests(&mut self, key: &RuleKey, objects: &[Object]) {
        for (watch_key, generation) in self.served.get(key).cloned().unwrap_or_default() {
            if let Some(watch) = self.watches.get(&watch_key) {
                watch.task.abort();
                let mut store = write(&watch.state.store);
                for object in objects {
                    store.insert(Held::whole(object.clone()));
                }
                watch.state.listed.store(generation, Ordering::Release);
            }
        }
    }

    /// Why the rules of a watch past its tenant namespace's bound are not
    /// followed; `selected`: the bytes of what it would hold.
    fn too_large(&self, key: &WatchKey, selected: u64) -> String {
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let tenant = key.tenant.as_deref().unwrap_or_default();
        format!(
            "the sources that the rules of namespace {tenant} select would take more than \
             the {:.0} MiB the operator holds for one namespace's rules \
             (--max-tenant-source-mib; {}s in {}: {:.1} MiB): none of these is held, and \
             nothing is copied, changed or deleted for this rule until they fit; select \
             fewer or smaller sources",
            mib(self.tenant_bound),
            key.kind,
            match &key.scope {
                WatchScope::Namespace(ns) => ns.as_str(),
                WatchScope::AllNamespaces => "all namespaces",
            },
            mib(selected),
        )
    }

    fn start(&mut self, key: &WatchKey, interest: Interest) -> Watch {
        let (wanted, wanted_rx) = signal::channel(1);
        let state = Arc::new(WatchState {
            store: RwLock::default(),
            interest: RwLock::new(interest),
            listed: AtomicU64::new(0),
            wanted,
            failing: Mutex::new(None),
        });
        let ledger = key.tenant.as_ref().map(|tenant| {
            self.tenants
                .entry(tenant.clone())
                .or_insert_with(|| Arc::new(TenantBytes::new(self.tenant_bound)))
                .clone()
        });
        let (client, connection) = self.connections.take();
        let task = tokio::spawn(run_watch(
            WatchTask {
                client,
                key: key.clone(),
                name: key.name(),
                state: state.clone(),
                pause: self.pause.clone(),
                on_change: self.on_change.clone(),
                ledger,
            },
            wanted_rx,
        ));
        Watch {
            state,
            task,
            connection,
        }
    }
}

impl Drop for SourceHub {
    fn drop(&mut self) {
        for watch in self.watches.values() {
            watch.task.abort();
        }
    }
}

/// What a watch's task works with.
struct WatchTask {
    client: Client,
    key: WatchKey,
    /// For the log.
    name: String,
    state: Arc<WatchState>,
    pause: Arc<ReadPause>,
    on_change: OnChange,
    /// A tenant's watch: what the watches of its namespace hold.
    ledger: Option<Arc<TenantBytes>>,
}

/// The bytes of a list under way, and whether it keeps sizes alone.
#[derive(Default)]
struct ListBytes {
    bytes: u64,
    past_bound: bool,
}

impl WatchTask {
    fn tell_all(&self) {
        let rules: Vec<RuleKey> = read(&self.state.interest)
            .rules()
            .into_iter()
            .cloned()
            .collect();
        for rule in &rules {
            (self.on_change)(rule, Touch::All);
        }
    }

    /// A list that would take the tenant past its bound goes on with
    /// sizes alone: it is never held whole.
    fn count(&self, event: &mut Event<Held>, folder: &mut Folder<Held>, list: &mut ListBytes) {
        let Some(ledger) = &self.ledger else {
            return;
        };
        match event {
            Event::Init => *list = ListBytes::default(),
            Event::InitApply(held) => {
                list.bytes = list.bytes.saturating_add(held.bytes);
                if !list.past_bound && !ledger.fits(&self.key, list.bytes) {
                    list.past_bound = true;
                    for pending in folder.pending_mut() {
                        pending.object = None;
                    }
                }
                if list.past_bound {
                    held.object = None;
                }
            }
            _ => {}
        }
    }

    /// Take a change in (a complete list marks the watch listed at
    /// `generation`), and tell the rules it concerns; whether the watch
    /// should list again (it fits its tenant's bound again).
    fn take(&self, change: Change<Held>, generation: u64) -> bool {
        let changed_name = match &change {
            Change::Applied(held) | Change::Deleted(held) => held.name.to_string(),
            Change::Listed(_) => String::new(),
        };
        let changed_rules = apply(&self.state, change);
        let bound = self
            .ledger
            .as_deref()
            .map(|ledger| within_bound(&self.state, ledger, &self.key));
        if changed_rules.is_none() {
            // Only once the store holds the list: a rule served before
            // would take a source not listed yet for one deleted.
            *lock(&self.state.failing) = None;
            self.state.listed.store(generation, Ordering::Release);
            debug!(watch = self.name.as_str(), "sources listed");
        }
        match (bound, changed_rules) {
            (Some(Bound::WentPast), _) => {
                tracing::warn!(
                    watch = self.name.as_str(),
                    "a tenant namespace's sources are past their bound; holding their sizes alone"
                );
                self.tell_all();
            }
            // Past the bound its rules have nothing to learn but that they
            // fit again, which a new list tells them.
            (Some(Bound::Past { fits }), Some(_)) => return fits,
            (Some(Bound::Past { fits: true }), None) => {
                self.tell_all();
                return true;
            }
            (_, Some(rules)) => {
                for rule in rules {
                    (self.on_change)(&rule, Touch::Source(changed_name.clone()));
                }
            }
            (_, None) => self.tell_all(),
        }
        false
    }
}

async fn run_watch(task: WatchTask, mut wanted: signal::Receiver<u64>) {
    let (key, state, pause, name) = (&task.key, &task.state, &task.pause, task.name.as_str());
    let _held = task.ledger.clone().map(|ledger| HeldBytes {
        ledger,
        key: key.clone(),
    });
    // A watch of the operator's own rules is never past a bound: a
    // receiver whose sender is gone, never polled.
    let mut released = match &task.ledger {
        Some(ledger) => ledger.released.subscribe(),
        None => signal::channel(0).1,
    };
    loop {
        let generation = *wanted.borrow_and_update();
        let mut stream = source_events(&task.client, key, state);
        let mut folder: Folder<Held> = Folder::default();
        let mut listed = false;
        let mut failures = FailureRun::default();
        let mut list = ListBytes::default();
        loop {
            // No request starts while the API server throttles reads.
            wait_out(pause).await;
            let past_bound = task.ledger.is_some() && read(&state.store).past_bound;
            let item = tokio::select! {
                // A list that is under way finishes first.
                changed = wanted.changed(), if listed => {
                    if changed.is_err() {
                        return;
                    }
                    tokio::time::sleep(RELIST_AFTER).await;
                    break;
                }
                // Another watch of the tenant let bytes go: once this one
                // fits, it lists again to hold its sources whole.
                _ = released.changed(), if listed && past_bound => {
                    if fits_now(state, task.ledger.as_deref(), key) {
                        break;
                    }
                    continue;
                }
                item = stream.try_next() => item,
            };
            let event = match item {
                Ok(Some(event)) => {
                    if !matches!(event, Some(Event::Init)) {
                        failures = FailureRun::default();
                        pause.succeeded();
                    }
                    match event {
                        Some(event) => event,
                        None => continue,
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    let backoff = failures.record(lasts(&e));
                    source_watch_failed(state, pause, name, &e, failures.in_a_row).await;
                    tokio::time::sleep(backoff).await;
                    if key.pulls_only {
                        // A consenting object could not be read: list
                        // again rather than go on without it.
                        break;
                    }
                    continue;
                }
            };
            // A long list keeps only what some rule wants.
            if let Event::InitApply(object) = &event
                && !read(&state.interest).wants_object(object)
            {
                continue;
            }
            let mut event = map_event(event, Held::whole);
            task.count(&mut event, &mut folder, &mut list);
            let Some(change) = folder.fold(event) else {
                continue;
            };
            listed |= matches!(change, Change::Listed(_));
            if task.take(change, generation) {
                break;
            }
        }
    }
}

/// How a tenant watch's store stands against its namespace's bound after a change.
#[derive(Debug, PartialEq)]
enum Bound {
    /// Held, and counted.
    Within,
    /// It would have taken the namespace past the bound: its objects are
    /// let go, their sizes kept.
    WentPast,
    /// It keeps sizes alone; `fits`: what it selects would fit now.
    Past { fits: bool },
}

/// Count what the watch `key` now holds against its tenant's bound, or let
/// go of its objects where it does not fit.
fn within_bound(state: &WatchState, ledger: &TenantBytes, key: &WatchKey) -> Bound {
    let mut store = write(&state.store);
    if store.past_bound {
        let fits = ledger.fits(key, store.bytes);
        drop(store);
        ledger.release(key);
        return Bound::Past { fits };
    }
    if ledger.try_hold(key, store.bytes) {
        return Bound::Within;
    }
    store.drop_objects();
    drop(store);
    ledger.release(key);
    Bound::WentPast
}

/// Whether a watch past its tenant's bound would fit now.
fn fits_now(state: &WatchState, ledger: Option<&TenantBytes>, key: &WatchKey) -> bool {
    ledger.is_some_and(|ledger| ledger.fits(key, read(&state.store).bytes))
}

/// The events of the watch `key` as objects; `None` for one that is
/// nothing to the watch's store. A watch of pulls alone watches metadata
/// and reads whole only the objects that consent.
fn source_events(
    client: &Client,
    key: &WatchKey,
    state: &Arc<WatchState>,
) -> futures::stream::BoxStream<'static, Result<Option<Event<Object>>, watcher::Error>> {
    let kind = key.kind;
    let (api, config) = watch_request(client.clone(), key);
    if !key.pulls_only {
        return watcher::watcher(api, config)
            .backoff(WatchBackoff::default())
            .map_ok(move |event| Some(map_event(event, |o| Object::from_dynamic(kind, o))))
            .boxed();
    }
    let resource = kind.api_resource();
    let metadata: Api<PartialObjectMeta<DynamicObject>> = match &key.scope {
        WatchScope::Namespace(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        WatchScope::AllNamespaces => Api::all_with(client.clone(), &resource),
    };
    let state = state.clone();
    watcher::watcher(metadata, config)
        .backoff(WatchBackoff::default())
        .and_then(move |event| {
            let (api, state) = (api.clone(), state.clone());
            // A read that failed fails the watch, which lists again: a
            // list without that object would read as its source gone.
            async move {
                consenting(&api, kind, &state, event)
                    .await
                    .map_err(watcher::Error::WatchFailed)
            }
        })
        .boxed()
}

/// A metadata event of a watch of pulls, as an event of the whole object
/// where it consents; a change that takes consent away drops the object.
async fn consenting(
    api: &Api<DynamicObject>,
    kind: Kind,
    state: &WatchState,
    event: Event<PartialObjectMeta<DynamicObject>>,
) -> Result<Option<Event<Object>>, kube::Error> {
    Ok(match event {
        Event::Init => Some(Event::Init),
        Event::InitDone => Some(Event::InitDone),
        Event::InitApply(meta) => read_if_consenting(api, kind, state, &meta)
            .await?
            .map(Event::InitApply),
        Event::Apply(meta) => Some(match read_if_consenting(api, kind, state, &meta).await? {
            Some(object) => Event::Apply(object),
            None => Event::Delete(metadata_only(meta)),
        }),
        Event::Delete(meta) => Some(Event::Delete(metadata_only(meta))),
    })
}

/// The object of `meta` read whole, if some rule of the watch wants it
/// (its consent included, judged from its metadata and again from what is
/// read); `Err` when it could not be read.
async fn read_if_consenting(
    api: &Api<DynamicObject>,
    kind: Kind,
    state: &WatchState,
    meta: &PartialObjectMeta<DynamicObject>,
) -> Result<Option<Object>, kube::Error> {
    let wanted = |object: &Object| read(&state.interest).wants_object(object);
    let (Some(name), stub) = (meta.metadata.name.clone(), metadata_only(meta.clone())) else {
        return Ok(None);
    };
    if !wanted(&stub) {
        return Ok(None);
    }
    match api.get_opt(&name).await {
        Ok(Some(object)) => {
            let object = Object::from_dynamic(kind, object);
            Ok(wanted(&object).then_some(object))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    }
}

/// An object of which only the metadata is known (no payload).
fn metadata_only(meta: PartialObjectMeta<DynamicObject>) -> Object {
    let meta = meta.metadata;
    Object::new(
        meta.namespace.unwrap_or_default(),
        meta.name.unwrap_or_default(),
        meta.uid.unwrap_or_default(),
        meta.resource_version.unwrap_or_default(),
        meta.labels.unwrap_or_default(),
        meta.annotations.unwrap_or_default(),
        BTreeMap::new(),
    )
}

/// The API and the label and field selectors of the watch `key`.
fn watch_request(client: Client, key: &WatchKey) -> (Api<DynamicObject>, watcher::Config) {
    let kind = key.kind;
    let api: Api<DynamicObject> = match &key.scope {
        WatchScope::Namespace(ns) => Api::namespaced_with(client, ns, &kind.api_resource()),
        WatchScope::AllNamespaces => Api::all_with(client, &kind.api_resource()),
    };
    // Copies are never sources.
    let labels = if key.selector.is_empty() {
        format!("!{}", crate::LABEL_RULE_UID)
    } else {
        format!("{},!{}", key.selector, crate::LABEL_RULE_UID)
    };
    let mut config = watch_config().labels(&labels);
    if key.tenant.is_some() {
        // A page is read whole before any of it is counted against the
        // tenant's bound: a small page keeps that to a few MiB.
        config = config.page_size(TENANT_LIST_PAGE);
    }
    if let Some(fields) = kind.source_field_selector() {
        config = config.fields(&fields);
    }
    (api, config)
}

/// Objects per page of a tenant watch's list (of at most about 1 MiB each).
const TENANT_LIST_PAGE: u32 = 16;

/// The longest failure a rule's status quotes of a source watch.
const FAILURE_SHOWN: usize = 300;

/// After a source watch's request failed (`in_a_row` times now): keep why
/// for the rules it serves, log it, and wait as every watch does while the
/// API server throttles or does not answer. A failure that lasts
/// ([`lasts`]) waits besides a backoff of its own ([`FailureRun`]) that
/// doubles to a minute, so that a watch that cannot work (a refused or
/// malformed request, failing before it is even sent) costs one try a
/// minute.
async fn source_watch_failed(
    state: &WatchState,
    pause: &ReadPause,
    name: &str,
    error: &kube::runtime::watcher::Error,
    in_a_row: u32,
) {
    let mut words = error.to_string();
    if words.len() > FAILURE_SHOWN {
        let mut end = FAILURE_SHOWN;
        while !words.is_char_boundary(end) {
            end -= 1;
        }
        words.truncate(end);
        words.push('…');
    }
    tracing::warn!(
        watch = name,
        error = words.as_str(),
        failures_in_a_row = in_a_row,
        "source watch failed; retrying with backoff"
    );
    *lock(&state.failing) = Some(words);
    crate::cluster::watch::pause_after_failure(pause, error).await;
}

/// Take one change into the store. Returns the rules it concerns, or
/// `None` for a completed list (which concerns every rule of the watch).
/// A list of sizes alone (past the tenant's bound) leaves the store so.
fn apply(state: &WatchState, change: Change<Held>) -> Option<Vec<RuleKey>> {
    let interest = read(&state.interest);
    match change {
        Change::Listed(listed) => {
            let mut store = Store::default();
            for held in listed {
                match &held.object {
                    Some(object) if !interest.wants_object(object) => {}
                    Some(_) => {
                        store.insert(held);
                    }
                    None => {
                        store.past_bound = true;
                        store.insert(held);
                    }
                }
            }
            if store.past_bound {
                store.drop_objects();
            }
            *write(&state.store) = store;
            None
        }
        Change::Applied(held) => {
            let Some(object) = held.object.clone() else {
                return Some(Vec::new());
            };
            let wanted = interest.wants_object(&object);
            let mut store = write(&state.store);
            let previous = if wanted {
                store.insert(held)
            } else {
                store.remove(&object.namespace, &object.name)
            };
            if store.past_bound {
                return Some(Vec::new());
            }
            let previous = previous.and_then(|held| held.object);
            if previous.as_deref() == Some(&*object) || (previous.is_none() && !wanted) {
                return Some(Vec::new());
            }
            let mut rules: BTreeSet<RuleKey> = interest
                .rules_for(&object.namespace, &object.labels)
                .cloned()
                .collect();
            if let Some(previous) = &previous {
                rules.extend(
                    interest
                        .rules_for(&previous.namespace, &previous.labels)
                        .cloned(),
                );
            }
            Some(rules.into_iter().collect())
        }
        Change::Deleted(held) => {
            let mut store = write(&state.store);
            // A newer object of the same name stays.
            if store
                .get(&held.namespace, &held.name)
                .is_none_or(|kept| kept.uid != held.uid)
            {
                return Some(Vec::new());
            }
            let removed = store.remove(&held.namespace, &held.name);
            Some(
                removed
                    .and_then(|r| r.object)
                    .map(|r| {
                        interest
                            .rules_for(&r.namespace, &r.labels)
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::selector::Requirement;

    fn rule(name: &str) -> RuleKey {
        RuleKey {
            namespace: "ops".into(),
            name: name.into(),
        }
    }

    fn need(kind: Kind, label: &str, namespaces: &[&str]) -> SourceNeed {
        SourceNeed {
            kind,
            selector: LabelSelector::new(vec![Requirement::In(label.into(), vec!["true".into()])]),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            pulls_into: None,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_long_selector_is_named_by_a_hash() {
        let key = |selector: String| WatchKey {
            kind: Kind::ConfigMap,
            scope: WatchScope::Namespace("team-a".into()),
            selector,
            pulls_only: false,
            tenant: None,
        };
        assert_eq!(
            key("copy=true".into()).name(),
            "ConfigMap sources in team-a (copy=true)"
        );
        let long = format!("app in ({})", vec!["x".repeat(61); 1100].join(","));
        let name = key(long.clone()).name();
        assert!(name.len() < 80, "{name}");
        assert!(
            name.starts_with("ConfigMap sources in team-a (selector "),
            "{name}"
        );
        assert_ne!(
            name,
            key(long.replace('x', "y")).name(),
            "selectors told apart"
        );
    }

    fn tenant_need(own: &str, label: &str, namespaces: &[&str]) -> SourceNeed {
        SourceNeed {
            pulls_into: Some(own.to_owned()),
            ..need(Kind::Secret, label, namespaces)
        }
    }

    #[test]
    fn a_tenant_rule_never_makes_a_watch_across_namespaces() {
        // Nine source namespaces, past a budget of eight, edited often.
        let namespaces: Vec<String> = (0..9).map(|i| format!("src-{i}")).collect();
        let namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
        let tenant = RuleKey {
            namespace: "team-a".into(),
            name: "pull".into(),
        };
        for label in ["a", "b", "c"] {
            let needs = BTreeMap::from([
                (tenant.clone(), tenant_need("team-a", label, &namespaces)),
                (rule("admin"), need(Kind::Secret, "copy", &["ops", "ops2"])),
            ]);
            let planned = plan_watches(&needs, 8).watches;
            assert!(
                planned.keys().all(|k| k.scope != WatchScope::AllNamespaces),
                "{:?}",
                planned.keys().collect::<Vec<_>>()
            );
            assert!(planned.keys().all(|k| !k.selector.is_empty()));
            assert_eq!(planned.len(), 11);
        }
    }

    /// Many rules of one tenant take at most MAX_TENANT_SOURCE_WATCHES
    /// watches together (one per kind and source namespace): the rules past
    /// it (in name order) get none and are told why; another tenant and the
    /// operator's own rules are not affected, and rules that add no watch
    /// of their own (other selectors in the same namespaces) are served.
    #[test]
    fn a_tenants_rules_together_take_a_bounded_number_of_watches() {
        let namespaces = |rule: usize| -> Vec<String> {
            (0..16).map(|i| format!("src-{}", rule * 16 + i)).collect()
        };
        let tenant_rule = |tenant: &str, i: usize| RuleKey {
            namespace: tenant.into(),
            name: format!("r{i:02}"),
        };
        let mut needs = BTreeMap::new();
        // Six rules of 16 namespaces each: four fit in 64.
        for i in 0..6 {
            let label = format!("l{i}");
            let own = namespaces(i);
            let own: Vec<&str> = own.iter().map(String::as_str).collect();
            needs.insert(
                tenant_rule("team-a", i),
                tenant_need("team-a", &label, &own),
            );
        }
        // Another rule in the namespaces of the first, by another selector:
        // no watch of its own.
        let first = namespaces(0);
        let first: Vec<&str> = first.iter().map(String::as_str).collect();
        needs.insert(
            tenant_rule("team-a", 9),
            tenant_need("team-a", "l9", &first),
        );
        needs.insert(
            tenant_rule("team-b", 0),
            tenant_need("team-b", "b0", &first),
        );
        needs.insert(rule("admin"), need(Kind::ConfigMap, "copy", &["ops"]));
        let plan = plan_watches(&needs, 8);
        let over: Vec<String> = plan.over_budget.keys().map(ToString::to_string).collect();
        assert_eq!(over, ["team-a/r04", "team-a/r05"]);
        assert!(plan.over_budget.values().all(|why| why.contains("team-a")));
        let serves = |rule: &RuleKey| {
            plan.watches
                .values()
                .filter(|interest| interest.rules().contains(rule))
                .count()
        };
        assert_eq!(serves(&tenant_rule("team-a", 3)), 16);
        assert_eq!(serves(&tenant_rule("team-a", 4)), 0);
        assert_eq!(
            serves(&tenant_rule("team-a", 9)),
            16,
            "shares r00's watches"
        );
        assert_eq!(serves(&tenant_rule("team-b", 0)), 16);
        assert_eq!(serves(&rule("admin")), 1);
        // team-a's 64 + team-b's 16 + the admin rule's 1 (r09 shares r00's).
        assert_eq!(plan.watches.len(), 81);
    }

    /// The attack of 40 rules whose selectors differ only by a
    /// `DoesNotExist` on a made-up key: one watch of the tenant's
    /// namespace, filtered by what the selectors share, serves them all,
    /// and still tells each rule's sources apart. Another tenant's rule of
    /// the same selector has a watch of its own.
    #[test]
    fn a_tenants_rules_share_one_watch_per_kind_and_namespace_whatever_their_selectors() {
        let mut needs = BTreeMap::new();
        let made_up = |i: usize| {
            LabelSelector::new(vec![
                Requirement::In("app".into(), vec!["web".into()]),
                Requirement::DoesNotExist(format!("made-up-{i}")),
            ])
        };
        for i in 0..40 {
            needs.insert(
                RuleKey {
                    namespace: "team-a".into(),
                    name: format!("r{i:02}"),
                },
                SourceNeed {
                    kind: Kind::ConfigMap,
                    selector: made_up(i),
                    namespaces: vec!["team-a".into()],
                    pulls_into: Some("team-a".into()),
                },
            );
        }
        let other = RuleKey {
            namespace: "team-b".into(),
            name: "r".into(),
        };
        needs.insert(
            other.clone(),
            SourceNeed {
                kind: Kind::ConfigMap,
                selector: made_up(0),
                namespaces: vec!["team-b".into()],
                pulls_into: Some("team-b".into()),
            },
        );
        let planned = plan_watches(&needs, 8).watches;
        assert_eq!(planned.len(), 2, "{:?}", planned.keys().collect::<Vec<_>>());
        let (key, interest) = planned
            .iter()
            .find(|(k, _)| k.tenant.as_deref() == Some("team-a"))
            .expect("team-a's watch");
        assert_eq!(key.scope, WatchScope::Namespace("team-a".into()));
        assert_eq!(key.selector, "app=web");
        assert!(!key.pulls_only, "its own namespace");
        assert_eq!(interest.rules().len(), 40);
        let none = BTreeMap::new();
        let web = labels(&[("app", "web")]);
        assert_eq!(interest.rules_for("team-a", &web).count(), 40);
        let tagged = labels(&[("app", "web"), ("made-up-3", "x")]);
        assert_eq!(interest.rules_for("team-a", &tagged).count(), 39);
        assert!(interest.wants("team-a", &web, &none));
        assert!(!interest.wants("team-a", &labels(&[("app", "db")]), &none));
        assert!(
            planned
                .iter()
                .any(|(k, i)| k.tenant.as_deref() == Some("team-b") && i.rules().contains(&other))
        );
    }

    fn watch_state(interest: Interest) -> WatchState {
        WatchState {
            store: RwLock::default(),
            interest: RwLock::new(interest),
            listed: AtomicU64::new(0),
            wanted: signal::channel(0).0,
            failing: Mutex::new(None),
        }
    }

    /// A ConfigMap of `team-a` with `kib` KiB of data.
    fn big(name: &str, uid: &str, kib: usize) -> Held {
        let mut object =
            crate::cache::index::tests::object("team-a", name, uid, 1, &[("app", "web")]);
        object.payload.insert(
            "data".into(),
            serde_json::json!({"blob": "x".repeat(kib * 1024)}),
        );
        object.rehash();
        Held::whole(object)
    }

    /// What a tenant namespace's watches hold stays within its bound: a
    /// watch that would go past it keeps its sources' sizes alone (none
    /// whole, so its rules read [`Sources::TooLarge`]), and holds them
    /// whole again once another watch of the tenant lets go of enough.
    #[test]
    fn a_tenants_watches_hold_at_most_its_bound_together() {
        let tenant_need = SourceNeed {
            kind: Kind::ConfigMap,
            selector: LabelSelector::new(vec![Requirement::In("app".into(), vec!["web".into()])]),
            namespaces: vec!["team-a".into()],
            pulls_into: Some("team-a".into()),
        };
        let rule = RuleKey {
            namespace: "team-a".into(),
            name: "r".into(),
        };
        let planned = plan_watches(&BTreeMap::from([(rule, tenant_need)]), 8).watches;
        let (key, interest) = planned.into_iter().next().expect("a watch");
        let other_key = WatchKey {
            kind: Kind::Secret,
            ..key.clone()
        };
        let ledger = TenantBytes::new(4 * 1024 * 1024);
        assert!(
            ledger.try_hold(&other_key, 2 * 1024 * 1024),
            "2 MiB elsewhere"
        );
        let state = watch_state(interest);
        let released = ledger.released.subscribe();

        // Two sources of 900 KiB fit beside the 2 MiB.
        apply(
            &state,
            Change::Listed(vec![big("a", "1", 900), big("b", "2", 900)]),
        );
        assert_eq!(within_bound(&state, &ledger, &key), Bound::Within);
        let held = |state: &WatchState| {
            let store = read(&state.store);
            let whole = store
                .objects
                .values()
                .flat_map(HashMap::values)
                .filter(|h| h.object.is_some())
                .count();
            (whole, store.bytes / 1024)
        };
        assert_eq!(held(&state).0, 2);

        // A third goes past: every payload is let go, the sizes stay.
        apply(&state, Change::Applied(big("c", "3", 900)));
        assert_eq!(within_bound(&state, &ledger, &key), Bound::WentPast);
        let (whole, kib) = held(&state);
        assert_eq!(whole, 0, "nothing held whole past the bound");
        assert!(kib >= 2700, "{kib} KiB counted");
        assert!(read(&state.store).past_bound);
        assert_eq!(
            lock(&ledger.held).get(&key).copied().unwrap_or(0),
            0,
            "nothing counted for it"
        );
        // Changes past the bound keep the count: one deleted, still past.
        apply(&state, Change::Deleted(big("c", "3", 900)));
        assert_eq!(
            within_bound(&state, &ledger, &key),
            Bound::Past { fits: true },
            "1.8 MiB beside 2 MiB fit in 4"
        );

        // A list that would go past keeps sizes alone from the start.
        let state = watch_state(read(&state.interest).clone());
        assert!(ledger.try_hold(&other_key, 3 * 1024 * 1024));
        let mut sized = big("a", "1", 900);
        sized.object = None;
        apply(&state, Change::Listed(vec![sized, big("b", "2", 900)]));
        assert_eq!(held(&state).0, 0);
        assert_eq!(
            within_bound(&state, &ledger, &key),
            Bound::Past { fits: false }
        );
        // The other watch goes: this one fits, and is told so.
        ledger.release(&other_key);
        assert!(released.has_changed().unwrap_or(false));
        assert!(fits_now(&state, Some(&ledger), &key));
    }

    #[test]
    fn a_namespace_only_pulled_from_is_watched_for_metadata_and_holds_only_consent() {
        let tenant = RuleKey {
            namespace: "team-a".into(),
            name: "pull".into(),
        };
        let needs = BTreeMap::from([
            (
                tenant.clone(),
                tenant_need("team-a", "copy", &["team-a", "platform", "shared"]),
            ),
            (rule("admin"), need(Kind::Secret, "copy", &["shared"])),
        ]);
        let planned = plan_watches(&needs, 8).watches;
        let pulls_only = |ns: &str| {
            planned
                .keys()
                .find(|k| k.scope == WatchScope::Namespace(ns.into()) && k.tenant.is_some())
                .map(|k| k.pulls_only)
        };
        assert_eq!(pulls_only("platform"), Some(true), "only pulled from");
        assert_eq!(pulls_only("team-a"), Some(false), "the rule's own");
        assert_eq!(
            pulls_only("shared"),
            Some(true),
            "the tenant's own watch, apart from the admin rule's"
        );
        assert!(
            planned
                .keys()
                .any(|k| k.scope == WatchScope::Namespace("shared".into())
                    && k.tenant.is_none()
                    && !k.pulls_only),
            "the admin rule's watch reads whole"
        );
        let (_, interest) = planned
            .iter()
            .find(|(k, _)| k.pulls_only)
            .expect("the pull watch");
        let wanted = labels(&[("copy", "true")]);
        let consents = labels(&[(crate::ANNOTATION_ALLOW_TO, "team-*")]);
        let elsewhere = labels(&[(crate::ANNOTATION_ALLOW_TO, "team-b")]);
        assert!(interest.wants("platform", &wanted, &consents));
        assert!(!interest.wants("platform", &wanted, &elsewhere));
        assert!(!interest.wants("platform", &wanted, &BTreeMap::new()));
    }

    #[test]
    fn rules_with_the_same_sources_share_one_watch() {
        let needs = BTreeMap::from([
            (rule("a"), need(Kind::ConfigMap, "copy", &["ops"])),
            (rule("b"), need(Kind::ConfigMap, "copy", &["ops"])),
        ]);
        let planned = plan_watches(&needs, 8).watches;
        assert_eq!(planned.len(), 1);
        let (key, interest) = planned.iter().next().expect("one watch");
        assert_eq!(key.scope, WatchScope::Namespace("ops".into()));
        assert_eq!(key.selector, "copy=true");
        assert_eq!(interest.rules(), BTreeSet::from([&rule("a"), &rule("b")]));
    }

    #[test]
    fn the_last_rule_to_go_stops_the_watch() {
        let mut needs = BTreeMap::from([
            (rule("a"), need(Kind::ConfigMap, "copy", &["ops"])),
            (rule("b"), need(Kind::ConfigMap, "copy", &["ops"])),
        ]);
        needs.remove(&rule("a"));
        assert_eq!(plan_watches(&needs, 8).watches.len(), 1);
        needs.remove(&rule("b"));
        assert!(plan_watches(&needs, 8).watches.is_empty());
    }

    #[test]
    fn a_long_namespace_list_becomes_one_watch_across_namespaces() {
        let many: Vec<String> = (0..5000).map(|i| format!("ns-{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let needs = BTreeMap::from([
            (rule("big"), need(Kind::ConfigMap, "copy", &many)),
            (rule("small"), need(Kind::Secret, "copy", &["ops"])),
        ]);
        let planned = plan_watches(&needs, 8).watches;
        assert_eq!(planned.len(), 2);
        let across = planned
            .keys()
            .find(|k| k.kind == Kind::ConfigMap)
            .expect("a configmap watch");
        assert_eq!(across.scope, WatchScope::AllNamespaces);
        // Every rule of the kind uses the same selector: still filtered on the server.
        assert_eq!(across.selector, "copy=true");
        let secrets = planned
            .keys()
            .find(|k| k.kind == Kind::Secret)
            .expect("a secret watch");
        assert_eq!(secrets.scope, WatchScope::Namespace("ops".into()));
    }

    #[test]
    fn many_rules_stay_within_the_budget() {
        let needs: BTreeMap<RuleKey, SourceNeed> = (0..1000)
            .map(|i| {
                let ns = format!("src-{i}");
                let label = format!("rule-{i}");
                (rule(&label), need(Kind::ConfigMap, &label, &[ns.as_str()]))
            })
            .collect();
        let planned = plan_watches(&needs, 8).watches;
        assert_eq!(planned.len(), 1);
        let (key, interest) = planned.iter().next().expect("one watch");
        assert_eq!(key.scope, WatchScope::AllNamespaces);
        // Different selectors: the server cannot filter, memory does.
        assert_eq!(key.selector, "");
        let none = BTreeMap::new();
        assert!(interest.wants("src-7", &labels(&[("rule-7", "true")]), &none));
        assert!(!interest.wants("src-7", &labels(&[("rule-8", "true")]), &none));
        assert!(!interest.wants("elsewhere", &labels(&[("rule-7", "true")]), &none));
        assert_eq!(
            interest
                .rules_for("src-7", &labels(&[("rule-7", "true")]))
                .collect::<Vec<_>>(),
            vec![&rule("rule-7")]
        );
    }

    #[test]
    fn within_the_budget_every_namespace_has_its_own_watch() {
        let needs = BTreeMap::from([(
            rule("a"),
            need(Kind::ConfigMap, "copy", &["one", "two", "three"]),
        )]);
        let planned = plan_watches(&needs, 3).watches;
        assert_eq!(planned.len(), 3);
        assert!(
            planned
                .keys()
                .all(|k| matches!(k.scope, WatchScope::Namespace(_)))
        );
        assert_eq!(plan_watches(&needs, 2).watches.len(), 1);
    }

    #[test]
    fn an_interest_that_grows_asks_for_a_new_list() {
        let one = plan_watches(
            &BTreeMap::from([(rule("a"), need(Kind::ConfigMap, "copy", &["x", "y"]))]),
            1,
        )
        .watches;
        let two = plan_watches(
            &BTreeMap::from([
                (rule("a"), need(Kind::ConfigMap, "copy", &["x", "y"])),
                (rule("b"), need(Kind::ConfigMap, "copy", &["z"])),
            ]),
            1,
        )
        .watches;
        let before = one.values().next().expect("a watch");
        let after = two.values().next().expect("a watch");
        assert!(after.wants_more_than(before));
        assert!(!before.wants_more_than(after));
        // Another rule wanting what is already listed needs no new list.
        let same = plan_watches(
            &BTreeMap::from([
                (rule("a"), need(Kind::ConfigMap, "copy", &["x", "y"])),
                (rule("c"), need(Kind::ConfigMap, "copy", &["x"])),
            ]),
            1,
        )
        .watches;
        assert!(
            !same
                .values()
                .next()
                .expect("a watch")
                .wants_more_than(before)
        );
    }
}
