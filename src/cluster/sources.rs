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
//! A watch across all namespaces lists again when the rules want more from
//! it (a new namespace or selector), after a short pause so that a burst of
//! new rules costs one list, and never before its previous list finished.

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
use crate::cluster::watch::{Change, Folder, map_event, wait_out, watch_config};
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
        match &self.scope {
            WatchScope::Namespace(ns) => format!("{} {sources} in {ns} ({selector})", self.kind),
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
/// together (a watch per kind, namespace and selector): past it, the rules
/// that would need more, taken in name order, wait, saying why, until
/// others of the namespace go. One rule names at most
/// [`crate::core::resolve::MAX_TENANT_SOURCE_NAMESPACES`] namespaces; this
/// bounds what many rules take.
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
    let mut taken: HashMap<&str, BTreeSet<(Kind, &str, String)>> = HashMap::new();
    let mut over = BTreeMap::new();
    for (rule, need) in needs {
        let Some(tenant) = need.pulls_into.as_deref() else {
            continue;
        };
        let query = need.selector.to_query();
        let held = taken.entry(tenant).or_default();
        let more: Vec<(Kind, &str, String)> = need
            .namespaces
            .iter()
            .map(|ns| (need.kind, ns.as_str(), query.clone()))
            .filter(|watch| !held.contains(watch))
            .collect();
        if held.len() + more.len() > MAX_TENANT_SOURCE_WATCHES {
            over.insert(
                rule.clone(),
                format!(
                    "not watched: the rules of namespace {tenant} would need more than \
                     {MAX_TENANT_SOURCE_WATCHES} source watches together (one per kind, \
                     namespace and selector); this rule waits until others of the namespace \
                     need fewer"
                ),
            );
        } else {
            held.extend(more);
        }
    }
    over
}

/// One kind's wanted `(namespace, selector)` pairs, each with whether only
/// pulls, and only tenant rules, want it.
type KindPairs<'a> = BTreeMap<(&'a str, String), (bool, bool)>;

/// Per kind, the (namespace, selector) pairs `needs` want, and whether
/// only pulls, and only tenant rules, want each.
fn wanted_pairs<'a>(needs: impl Iterator<Item = &'a SourceNeed>) -> BTreeMap<Kind, KindPairs<'a>> {
    let mut pairs: BTreeMap<Kind, KindPairs<'_>> = BTreeMap::new();
    for need in needs {
        let query = need.selector.to_query();
        let kind_pairs = pairs.entry(need.kind).or_default();
        let tenant = need.pulls_into.is_some();
        for ns in &need.namespaces {
            let pull = need.pull_into(ns).is_some();
            kind_pairs
                .entry((ns.as_str(), query.clone()))
                .and_modify(|(only_pulls, only_tenants)| {
                    *only_pulls &= pull;
                    *only_tenants &= tenant;
                })
                .or_insert((pull, tenant));
        }
    }
    pairs
}

/// The watches that serve `needs`, and what each is wanted for: a watch
/// per kind, namespace and selector. Past `budget` watches of rules of the
/// operator's namespace, the kinds with the most such watches are watched
/// across all namespaces (filtered by the selector when every such rule of
/// the kind uses the same one). A tenant rule's watches stay in their
/// namespaces and count apart (a tenant rule names few namespaces, see
/// [`crate::core::resolve::MAX_TENANT_SOURCE_NAMESPACES`]): nothing a
/// tenant writes makes the operator list a kind across the cluster. A
/// namespace that only tenant rules pull from is watched for metadata
/// ([`WatchKey::pulls_only`]). The rules of one tenant namespace take at
/// most [`MAX_TENANT_SOURCE_WATCHES`] watches together.
pub(crate) fn plan_watches(needs: &BTreeMap<RuleKey, SourceNeed>, budget: usize) -> WatchPlan {
    let over_budget = over_tenant_budget(needs);
    let needs = || {
        needs
            .iter()
            .filter(|(rule, _)| !over_budget.contains_key(*rule))
    };
    let pairs = wanted_pairs(needs().map(|(_, need)| need));
    // The operator's own rules' pairs: those that count, and may move.
    let movable = |kind_pairs: &KindPairs<'_>| {
        kind_pairs
            .values()
            .filter(|(_, only_tenants)| !only_tenants)
            .count()
    };
    let mut across: BTreeSet<Kind> = BTreeSet::new();
    loop {
        let namespaced: usize = pairs
            .iter()
            .filter(|(kind, _)| !across.contains(kind))
            .map(|(_, p)| movable(p))
            .sum();
        if namespaced + across.len() <= budget.max(1) {
            break;
        }
        // The kind with the most namespaced watches goes across namespaces.
        let Some((&kind, _)) = pairs
            .iter()
            .filter(|(kind, p)| !across.contains(kind) && movable(p) > 0)
            .max_by_key(|(kind, p)| (movable(p), std::cmp::Reverse(**kind)))
        else {
            break;
        };
        across.insert(kind);
    }
    // Across namespaces, the API server still filters by the selector when
    // every rule of the kind that goes there uses the same one.
    let common_selector = |kind: Kind| {
        let selectors: BTreeSet<&str> = pairs[&kind]
            .iter()
            .filter(|(_, (_, only_tenants))| !only_tenants)
            .map(|((_, query), _)| query.as_str())
            .collect();
        match selectors.into_iter().collect::<Vec<_>>()[..] {
            [only] => only.to_owned(),
            _ => String::new(),
        }
    };
    let mut planned: BTreeMap<WatchKey, Interest> = BTreeMap::new();
    for (rule, need) in needs() {
        let query = need.selector.to_query();
        for ns in &need.namespaces {
            let (only_pulls, only_tenants) = pairs[&need.kind][&(ns.as_str(), query.clone())];
            let key = if across.contains(&need.kind) && !only_tenants {
                WatchKey {
                    kind: need.kind,
                    scope: WatchScope::AllNamespaces,
                    selector: common_selector(need.kind),
                    pulls_only: false,
                }
            } else {
                WatchKey {
                    kind: need.kind,
                    scope: WatchScope::Namespace(ns.clone()),
                    selector: query.clone(),
                    pulls_only: only_pulls,
                }
            };
            planned.entry(key).or_default().add(ns, need, rule);
        }
    }
    WatchPlan {
        watches: planned,
        over_budget,
    }
}

/// Objects by namespace and name.
type Store = HashMap<Arc<str>, HashMap<Arc<str>, Arc<Object>>>;

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
    /// The rule has no need registered.
    Unknown,
}

/// The shared source watches and the rules they serve.
pub(crate) struct SourceHub {
    client: Client,
    pause: Arc<ReadPause>,
    budget: usize,
    on_change: OnChange,
    needs: BTreeMap<RuleKey, SourceNeed>,
    watches: HashMap<WatchKey, Watch>,
    /// Each rule's watches and the generation each must have listed.
    served: HashMap<RuleKey, Vec<(WatchKey, u64)>>,
    /// Tenant rules left without watches, with why.
    over_budget: BTreeMap<RuleKey, String>,
}

impl SourceHub {
    pub(crate) fn new(
        client: Client,
        pause: Arc<ReadPause>,
        budget: usize,
        on_change: OnChange,
    ) -> Self {
        Self {
            client,
            pause,
            budget,
            on_change,
            needs: BTreeMap::new(),
            watches: HashMap::new(),
            served: HashMap::new(),
            over_budget: BTreeMap::new(),
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
                // Its task forgets its failures as it ends (a guard).
                watch.task.abort();
            }
        }
        self.served.clear();
        for (key, interest) in planned {
            let generation = match self.watches.get(&key) {
                Some(watch) => {
                    let grew = interest.wants_more_than(&read(&watch.state.interest));
                    *write(&watch.state.interest) = interest;
                    if grew && key.scope == WatchScope::AllNamespaces {
                        watch.state.wanted.send_modify(|g| *g += 1);
                    } else {
                        // Objects no rule wants any more are dropped.
                        let interest = read(&watch.state.interest);
                        for (ns, objects) in write(&watch.state.store).iter_mut() {
                            objects.retain(|_, o| interest.wants(ns, &o.labels, &o.annotations));
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
            let namespaces: &[String] = match &watch_key.scope {
                WatchScope::Namespace(ns) => std::slice::from_ref(ns),
                WatchScope::AllNamespaces => &need.namespaces,
            };
            for ns in namespaces {
                if let Some(in_namespace) = store.get(ns.as_str()) {
                    objects.extend(
                        in_namespace
                            .values()
                            .filter(|o| need.selector.matches(&o.labels))
                            .cloned(),
                    );
                }
            }
        }
        Sources::Listed(objects)
    }

    fn start(&self, key: &WatchKey, interest: Interest) -> Watch {
        let (wanted, wanted_rx) = signal::channel(1);
        let state = Arc::new(WatchState {
            store: RwLock::default(),
            interest: RwLock::new(interest),
            listed: AtomicU64::new(0),
            wanted,
            failing: Mutex::new(None),
        });
        let task = tokio::spawn(run_watch(
            self.client.clone(),
            key.clone(),
            key.name(),
            state.clone(),
            wanted_rx,
            self.pause.clone(),
            self.on_change.clone(),
        ));
        Watch { state, task }
    }
}

impl Drop for SourceHub {
    fn drop(&mut self) {
        for watch in self.watches.values() {
            watch.task.abort();
        }
    }
}

async fn run_watch(
    client: Client,
    key: WatchKey,
    name: String,
    state: Arc<WatchState>,
    mut wanted: signal::Receiver<u64>,
    pause: Arc<ReadPause>,
    on_change: OnChange,
) {
    loop {
        let generation = *wanted.borrow_and_update();
        let mut stream = source_events(&client, &key, &state);
        let mut folder = Folder::default();
        let mut listed = false;
        let mut failures = FailureRun::default();
        loop {
            // No request starts while the API server throttles reads.
            wait_out(&pause).await;
            let item = tokio::select! {
                // A list that is under way finishes first.
                changed = wanted.changed(), if listed => {
                    if changed.is_err() {
                        return;
                    }
                    tokio::time::sleep(RELIST_AFTER).await;
                    break;
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
                    source_watch_failed(&state, &pause, &name, &e, failures.in_a_row).await;
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
            let Some(change) = folder.fold(event) else {
                continue;
            };
            let changed_name = match &change {
                Change::Applied(object) | Change::Deleted(object) => object.name.to_string(),
                Change::Listed(_) => String::new(),
            };
            let changed_rules = apply(&state, change);
            if let Some(rules) = changed_rules {
                for rule in rules {
                    on_change(&rule, Touch::Source(changed_name.clone()));
                }
            } else {
                listed = true;
                *lock(&state.failing) = None;
                state.listed.store(generation, Ordering::Release);
                debug!(watch = name.as_str(), "sources listed");
                let rules: Vec<RuleKey> =
                    read(&state.interest).rules().into_iter().cloned().collect();
                for rule in &rules {
                    on_change(rule, Touch::All);
                }
            }
        }
    }
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
    if let Some(fields) = kind.source_field_selector() {
        config = config.fields(&fields);
    }
    (api, config)
}

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

/// A source watch's failures since it last worked.
#[derive(Debug, Default)]
struct FailureRun {
    in_a_row: u32,
    /// The failures that last ([`lasts`]) since the last that did not:
    /// only they double the watch's own backoff, so that a refusal met as
    /// an API server comes back after a long outage waits a second, not a
    /// minute.
    lasting_in_a_row: u32,
}

impl FailureRun {
    /// Count a failure; the watch's own backoff after it (none for one
    /// that does not last: the shared read pause covers those).
    fn record(&mut self, lasting: bool) -> std::time::Duration {
        self.in_a_row = self.in_a_row.saturating_add(1);
        if !lasting {
            self.lasting_in_a_row = 0;
            return std::time::Duration::ZERO;
        }
        self.lasting_in_a_row = self.lasting_in_a_row.saturating_add(1);
        SOURCE_BACKOFF_FIRST
            .saturating_mul(1u32 << self.lasting_in_a_row.saturating_sub(1).min(8))
            .min(SOURCE_BACKOFF_MAX)
    }
}

/// Whether a source watch's failure is its own and will last: the API
/// server refused the request (a 4xx but a throttle or an expired
/// version), or it could not even be made. Those back off to a minute. A
/// server that does not answer, throttles or fails (5xx) is every watch's
/// matter: they wait together (the read pause) and come back as soon as
/// it does.
fn lasts(error: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error as Failed;
    let refused = |code: u16| (400..500).contains(&code) && code != 410 && code != 429;
    match error {
        Failed::InitialListFailed(e) | Failed::WatchStartFailed(e) | Failed::WatchFailed(e) => {
            match e {
                kube::Error::Api(status) => refused(status.code),
                kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => true,
                _ => false,
            }
        }
        Failed::WatchError(status) => refused(status.code),
        Failed::NoResourceVersion => false,
    }
}

/// A failing source watch's own backoff: from a second, doubling to a minute.
const SOURCE_BACKOFF_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
const SOURCE_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Take one change into the store. Returns the rules it concerns, or
/// `None` for a completed list (which concerns every rule of the watch).
fn apply(state: &WatchState, change: Change<Object>) -> Option<Vec<RuleKey>> {
    let interest = read(&state.interest);
    match change {
        Change::Listed(objects) => {
            let mut store = Store::new();
            for object in objects {
                if interest.wants_object(&object) {
                    store
                        .entry(object.namespace.clone())
                        .or_default()
                        .insert(object.name.clone(), Arc::new(object));
                }
            }
            *write(&state.store) = store;
            None
        }
        Change::Applied(object) => {
            let wanted = interest.wants_object(&object);
            let mut store = write(&state.store);
            let in_namespace = store.entry(object.namespace.clone()).or_default();
            let previous = if wanted {
                let object = Arc::new(object.clone());
                in_namespace.insert(object.name.clone(), object)
            } else {
                in_namespace.remove(&*object.name)
            };
            if previous.as_deref() == Some(&object) || (previous.is_none() && !wanted) {
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
        Change::Deleted(object) => {
            let mut store = write(&state.store);
            let Some(in_namespace) = store.get_mut(&*object.namespace) else {
                return Some(Vec::new());
            };
            // A newer object of the same name stays.
            if in_namespace
                .get(&*object.name)
                .is_none_or(|held| held.uid != object.uid)
            {
                return Some(Vec::new());
            }
            let removed = in_namespace.remove(&*object.name);
            if in_namespace.is_empty() {
                store.remove(&*object.namespace);
            }
            Some(
                removed
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
    /// watches together: the rules past it (in name order) get none and
    /// are told why; another tenant and the operator's own rules are not
    /// affected, and rules that add no watch of their own are served.
    #[test]
    fn a_tenants_rules_together_take_a_bounded_number_of_watches() {
        let namespaces: Vec<String> = (0..16).map(|i| format!("src-{i}")).collect();
        let namespaces: Vec<&str> = namespaces.iter().map(String::as_str).collect();
        let tenant_rule = |tenant: &str, i: usize| RuleKey {
            namespace: tenant.into(),
            name: format!("r{i:02}"),
        };
        let mut needs = BTreeMap::new();
        // Six rules of 16 watches each: four fit in 64.
        for i in 0..6 {
            let label = format!("l{i}");
            needs.insert(
                tenant_rule("team-a", i),
                tenant_need("team-a", &label, &namespaces),
            );
        }
        // Another rule with the selector of the first: no watch of its own.
        needs.insert(
            tenant_rule("team-a", 9),
            tenant_need("team-a", "l0", &namespaces),
        );
        needs.insert(
            tenant_rule("team-b", 0),
            tenant_need("team-b", "b0", &namespaces),
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

    /// Only lasting failures in a row double a watch's own backoff: after
    /// a long outage (connection failures), the first refusal as the API
    /// server comes back waits a second.
    #[test]
    fn only_lasting_failures_in_a_row_lengthen_a_watchs_own_backoff() {
        let secs = |d: std::time::Duration| d.as_secs();
        let mut run = FailureRun::default();
        for _ in 0..30 {
            assert_eq!(secs(run.record(false)), 0, "the outage: the shared pause");
        }
        assert_eq!(secs(run.record(true)), 1);
        assert_eq!(secs(run.record(true)), 2);
        assert_eq!(secs(run.record(true)), 4);
        for _ in 0..10 {
            run.record(true);
        }
        assert_eq!(secs(run.record(true)), 60, "at most a minute");
        run.record(false);
        assert_eq!(
            secs(run.record(true)),
            1,
            "a failure of another sort ends the run"
        );
        assert_eq!(run.in_a_row, 46);
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
                .find(|k| k.scope == WatchScope::Namespace(ns.into()))
                .map(|k| k.pulls_only)
        };
        assert_eq!(pulls_only("platform"), Some(true), "only pulled from");
        assert_eq!(pulls_only("team-a"), Some(false), "the rule's own");
        assert_eq!(
            pulls_only("shared"),
            Some(false),
            "an admin rule reads it too"
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
