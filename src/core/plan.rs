//! Which copies a rule should have, with what content, and what to write to
//! get there: a pure function of the rule, its sources, the namespaces and
//! the copies that exist.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use crate::api::kinds::Kind;
use crate::api::rule::{ConflictEntry, ConflictPolicy, Disposal, SyncPolicy};
use crate::api::selector::KeyGlob;
use crate::cache::index::{CopyIndex, MetaMap, NamespaceInfo, Object, ObjectKey, meta_entry_hash};
use crate::cache::roles::RoleIndex;
use crate::core::grants;
use crate::core::resolve::{Deletion, ResolvedKeys, ResolvedRule};
use crate::core::scope::Scope;
use crate::{
    ANNOTATION_ALLOW_TO, ANNOTATION_RULE, ANNOTATION_SOURCE, ANNOTATION_SOURCE_UID, CREATE_ONLY,
    LABEL_MANAGED_BY, LABEL_ON_RULE_DELETED, LABEL_RULE_UID, LABEL_SYNC_POLICY, ORPHAN,
};

/// A copy as it should be, in any target namespace: a copy's content does
/// not depend on where it lands, so one `Desired` serves every target.
#[derive(Clone, PartialEq)]
pub(crate) struct Desired {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) payload: BTreeMap<String, Value>,
    /// `namespace/name` of the source.
    pub(crate) source: String,
    pub(crate) content_hash: u64,
    pub(crate) payload_hash: u64,
    /// [`meta_entry_hash`] of every label and annotation, sorted (shared
    /// with the copies that hold exactly these).
    pub(crate) meta_entries: Arc<[u64]>,
}

impl std::fmt::Debug for Desired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} from {}", self.kind, self.name, self.source)
    }
}

impl Desired {
    /// Whether `current` already is this copy, judged from what Copyrator
    /// owns alone: the payload, and the labels and annotations it sets.
    /// Keys that others added do not matter; a key Copyrator set that is no
    /// longer wanted (a label removed from the source) does. The API
    /// server's answer to Copyrator's own write of this copy is right too,
    /// even where an admission webhook added a key to it.
    pub(crate) fn is_satisfied_by(&self, current: &Object) -> bool {
        (current.settled && current.written_for == Some(self.content_hash))
            || self.matches(current, true)
    }

    /// The payload and every wanted label and annotation are right; when
    /// `strict`, no label or annotation of Copyrator's is left over either.
    pub(crate) fn matches(&self, current: &Object, strict: bool) -> bool {
        if current.payload_hash != self.payload_hash {
            return false;
        }
        let owns_wanted = |entry: &u64| current.owned_meta.binary_search(entry).is_ok();
        if current.labels.is_empty() && current.annotations.is_empty() {
            // Nobody else holds a key (the usual case): what Copyrator owns
            // must be what it wants, compared as sorted hash lists.
            return if strict {
                *current.owned_meta == *self.meta_entries
            } else {
                self.meta_entries.iter().all(owns_wanted)
            };
        }
        let has = |map: MetaMap, key: &str, value: &str| {
            let others = match map {
                MetaMap::Label => &current.labels,
                MetaMap::Annotation => &current.annotations,
            };
            current.owns(map, key, value) || others.get(key).is_some_and(|v| v == value)
        };
        let wanted_present = self.labels.iter().all(|(k, v)| has(MetaMap::Label, k, v))
            && self
                .annotations
                .iter()
                .all(|(k, v)| has(MetaMap::Annotation, k, v));
        wanted_present
            && (!strict
                || current
                    .owned_meta
                    .iter()
                    .all(|entry| self.meta_entries.binary_search(entry).is_ok()))
    }

    /// This copy with `payload` instead of its own (the content a stage
    /// not reached yet keeps, see `core::rollout`).
    pub(crate) fn with_payload(&self, payload: BTreeMap<String, Value>) -> Desired {
        let payload_hash = crate::cache::index::payload_hash(&payload);
        Desired {
            content_hash: crate::cache::index::content_hash(
                &self.labels,
                &self.annotations,
                payload_hash,
            ),
            payload_hash,
            payload,
            ..self.clone()
        }
    }

    /// Whether `current` holds what Copyrator last wrote for this very copy
    /// and someone changed it since: writing again is a restore.
    pub(crate) fn is_changed_back(&self, current: &Object) -> bool {
        current.written_for == Some(self.content_hash) && !self.is_satisfied_by(current)
    }

    /// Whether `current` cannot be updated into this copy and must be replaced:
    /// it is immutable and its payload differs, or a field the API server
    /// never lets change (a Secret's `type`) differs.
    pub(crate) fn needs_recreate(&self, current: &Object) -> bool {
        (current.is_immutable() && current.payload_hash != self.payload_hash)
            || self
                .kind
                .info()
                .immutable_fields
                .iter()
                .any(|field| current.payload.get(*field) != self.payload.get(*field))
    }
}

/// Why a copy no longer belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeleteReason {
    /// Its source is gone or no longer matches.
    SourceGone,
    /// Its namespace (or cluster) is no longer a target.
    TargetLeft,
    /// The rule is being deleted, or is gone.
    RuleDeleted,
}

impl DeleteReason {
    /// Whether the rule's pass found the copy no longer belongs (its
    /// `prune`), rather than the rule going.
    pub(crate) fn is_prune(self) -> bool {
        self != DeleteReason::RuleDeleted
    }

    /// What `deletion` says becomes of a copy for this reason.
    pub(crate) fn disposal(self, deletion: &Deletion) -> Disposal {
        match self {
            DeleteReason::SourceGone => deletion.source_gone,
            DeleteReason::TargetLeft => deletion.target_left,
            DeleteReason::RuleDeleted => deletion.rule_deleted,
        }
    }
}

/// One write.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    Create {
        desired: Arc<Desired>,
        namespace: String,
    },
    Update {
        desired: Arc<Desired>,
        current: Arc<Object>,
    },
    Recreate {
        desired: Arc<Desired>,
        current: Arc<Object>,
    },
    Delete {
        current: Arc<Object>,
        reason: DeleteReason,
    },
    /// Orphan the copy: hand it over to its namespace (the label
    /// `copyrator.flant.com/sync-policy: CreateOnly`), never to be written again.
    HandOver {
        current: Arc<Object>,
        reason: DeleteReason,
    },
    /// Take over `current`, which holds `desired`'s payload already: one
    /// metadata patch (Copyrator's labels, annotations and mark; other
    /// tools' marks removed), no payload write.
    Adopt {
        desired: Arc<Desired>,
        current: Arc<Object>,
    },
}

impl Action {
    pub(crate) fn verb(&self) -> &'static str {
        match self {
            Action::Create { .. } => "create",
            Action::Update { .. } => "update",
            Action::Recreate { .. } => "recreate",
            Action::Delete { .. } => "delete",
            Action::HandOver { .. } => "orphan",
            Action::Adopt { .. } => "adopt",
        }
    }

    /// What becomes of `current`, which no longer belongs for `reason`,
    /// under `disposal`.
    pub(crate) fn dispose(current: Arc<Object>, reason: DeleteReason, disposal: Disposal) -> Self {
        match disposal {
            Disposal::Delete => Action::Delete { current, reason },
            Disposal::Orphan => Action::HandOver { current, reason },
        }
    }

    /// `(namespace, name)` written.
    pub(crate) fn target(&self) -> (&str, &str) {
        match self {
            Action::Create { desired, namespace } => (namespace, &desired.name),
            Action::Update { current, .. }
            | Action::Recreate { current, .. }
            | Action::Delete { current, .. }
            | Action::HandOver { current, .. }
            | Action::Adopt { current, .. } => (&current.namespace, &current.name),
        }
    }

    /// `namespace/name` of the source, where there is one.
    pub(crate) fn source(&self) -> &str {
        match self {
            Action::Create { desired, .. }
            | Action::Update { desired, .. }
            | Action::Recreate { desired, .. }
            | Action::Adopt { desired, .. } => &desired.source,
            Action::Delete { current, .. } | Action::HandOver { current, .. } => {
                current.source_ref.as_deref().unwrap_or_default()
            }
        }
    }
}

/// What a rule needs, and what is missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Plan {
    pub(crate) actions: Vec<Action>,
    pub(crate) conflicts: Vec<ConflictEntry>,
    pub(crate) sources: u32,
    pub(crate) target_namespaces: u32,
    /// Places that should hold a copy, everywhere the rule reaches
    /// (conflicts included), whatever the scope.
    pub(crate) places: u32,
    /// Places and copies the plan looked at (its cost, whatever it found).
    pub(crate) examined: u32,
    /// Within the scope: copies that should exist (conflicts left out).
    pub(crate) desired: u32,
    /// Of those, how many are already right.
    pub(crate) in_place: u32,
    /// Sources shadowed by another of the same name, at every place they
    /// would reach (whatever the scope).
    pub(crate) shadowed: Vec<ConflictEntry>,
    /// Namespaces the targets would reach but for their protection.
    pub(crate) protected_namespaces: u32,
    /// Namespaces a tenant rule's targets would reach but that do not accept it.
    pub(crate) not_accepting_namespaces: u32,
    /// Sources refused for their type: `(namespace/name, why)`.
    pub(crate) refused_sources: Vec<(String, String)>,
    /// Computing the copies (stripping the sources' labels and
    /// annotations, selecting their data keys) took more than
    /// [`GLOB_STEPS_PER_PASS`]: the plan stopped there and holds no
    /// action (a rule too costly to follow writes and deletes nothing).
    pub(crate) too_costly: bool,
}

/// Everything a plan is computed from.
pub(crate) struct Inputs<'a> {
    pub(crate) rule: &'a ResolvedRule,
    pub(crate) namespaces: &'a BTreeMap<String, NamespaceInfo>,
    /// Candidate sources: what the rule's source watches hold. They are checked again here.
    pub(crate) sources: &'a [Arc<Object>],
    pub(crate) copies: &'a CopyIndex,
    /// UIDs of the rules this operator can see (a copy of an unknown rule with
    /// this rule's name is an earlier incarnation of it and is adopted).
    pub(crate) live_rule_uids: &'a dyn Fn(&str) -> bool,
    /// Targets already known to hold a foreign object of the same name.
    pub(crate) known_conflicts: &'a HashMap<ObjectKey, String>,
    /// The copies to look at: what changed since the last pass.
    pub(crate) scope: &'a Scope,
    /// The cluster's Roles (watched while RoleBindings are copied): a
    /// RoleBinding copy is written only where the Role it binds grants what
    /// the source's Role grants (see [`grants::refusal`]).
    pub(crate) roles: &'a RoleIndex,
}

/// Whether an object can be a source of `rule`, and if not, why.
pub(crate) fn source_rejection(rule: &ResolvedRule, object: &Object) -> Option<&'static str> {
    if object.labels.contains_key(LABEL_RULE_UID) {
        return Some("it is a copy made by Copyrator");
    }
    if !rule
        .source_namespaces
        .iter()
        .any(|ns| **ns == *object.namespace)
    {
        return Some("it is not in a source namespace of the rule");
    }
    if !rule.selector.matches(&object.labels) {
        return Some("it does not match the selector");
    }
    if is_pulled(rule, object) && !rule.consent_by_rights && !allows_to(object, &rule.key.namespace)
    {
        return Some("it does not allow copies into the rule's namespace");
    }
    // Last: only an object that would be a source is worth naming as refused.
    if rule.policy.refuses_source(rule.kind, object).is_some() {
        return Some(NOT_COPIED_TYPE);
    }
    None
}

/// [`source_rejection`]'s reason for a source of a type that is not copied.
const NOT_COPIED_TYPE: &str = "its type is not copied";

/// Whether `source` comes to a tenant rule from another namespace: it is
/// copied only with its consent, and only into the rule's own namespace.
pub(crate) fn is_pulled(rule: &ResolvedRule, source: &Object) -> bool {
    rule.tenant && *source.namespace != rule.key.namespace
}

/// Whether `source` consents to copies into `namespace`: its
/// `copyrator.flant.com/allow-to` annotation lists the namespace or a glob
/// that matches it.
pub(crate) fn allows_to(source: &Object, namespace: &str) -> bool {
    annotations_allow_to(&source.annotations, namespace)
}

/// Whether an object's `annotations` consent to copies into `namespace`
/// (see [`allows_to`]).
pub(crate) fn annotations_allow_to(
    annotations: &BTreeMap<String, String>,
    namespace: &str,
) -> bool {
    crate::api::selector::glob_list(annotations.get(ANNOTATION_ALLOW_TO).map(String::as_str))
        .iter()
        .any(|glob| glob.matches(namespace))
}

/// The glob steps one pass may take to compute its copies: to strip the
/// sources' labels and annotations (`transform.stripLabels`,
/// `.stripAnnotations`, `--strip-keys`) and to select their data keys
/// (`transform.keys.include`, `.exclude`). Some 30 ms; an ordinary rule
/// takes a step or two per key and pattern, or the key's length for a
/// pattern that starts with `*`. A rule's patterns and its sources' keys
/// are a tenant's to choose, and a glob against a key costs up to the
/// product of their lengths.
pub(crate) const GLOB_STEPS_PER_PASS: u64 = 30_000_000;

/// `map` without the keys that never travel; `None` when matching them
/// took more than `steps` (what is left of the pass's).
fn stripped(
    map: &BTreeMap<String, String>,
    strip: &[KeyGlob],
    policy_strip: &[KeyGlob],
    steps: &mut u64,
) -> Option<BTreeMap<String, String>> {
    let mut kept = BTreeMap::new();
    'keys: for (key, value) in map {
        if key.as_str() == LABEL_MANAGED_BY {
            continue;
        }
        // The tracking globs are literal prefixes, a few steps a key: not
        // counted, so that no rule's ordinary keys ever make it too costly.
        if crate::core::tracking::globs().any(|glob| glob.matches(key)) {
            continue;
        }
        for glob in strip.iter().chain(policy_strip) {
            if glob.matches_within(key, steps)? {
                continue 'keys;
            }
        }
        kept.insert(key.clone(), value.clone());
    }
    Some(kept)
}

/// The payload copies carry: the source's, with only the data keys the
/// rule selects, under their names on copies (the rule's validation makes
/// sure no two land on one name). A data field left with no key is left
/// out, as the API server leaves out an empty one. `None` when matching
/// the keys took more than `steps`.
fn selected_payload(
    kind: Kind,
    keys: &ResolvedKeys,
    payload: &BTreeMap<String, Value>,
    steps: &mut u64,
) -> Option<BTreeMap<String, Value>> {
    let data_fields = kind.info().data_fields;
    let mut out = BTreeMap::new();
    for (field, value) in payload {
        match value {
            Value::Object(entries) if data_fields.contains(&field.as_str()) => {
                let mut selected = serde_json::Map::new();
                for (key, value) in entries {
                    if let Some(name) = keys.name_on_copies_within(key, steps)? {
                        selected.insert(name.to_owned(), value.clone());
                    }
                }
                if !selected.is_empty() {
                    out.insert(field.clone(), Value::Object(selected));
                }
            }
            _ => {
                out.insert(field.clone(), value.clone());
            }
        }
    }
    Some(out)
}

/// The copy of `source` that `rule` puts into every target.
pub(crate) fn desired_copy(rule: &ResolvedRule, source: &Object) -> Desired {
    let mut unlimited = u64::MAX;
    desired_copy_within(rule, source, &mut unlimited)
        .expect("u64::MAX glob steps are never used up")
}

/// [`desired_copy`], matching keys (labels and annotations stripped, data
/// keys selected) within `steps`; `None` when they ran out.
pub(crate) fn desired_copy_within(
    rule: &ResolvedRule,
    source: &Object,
    steps: &mut u64,
) -> Option<Desired> {
    let transform = &rule.transform;
    let mut labels = stripped(
        &source.labels,
        &transform.strip_labels,
        &rule.policy.strip_keys,
        steps,
    )?;
    labels.extend(transform.add_labels.clone());
    labels.insert(LABEL_MANAGED_BY.into(), "copyrator".into());
    labels.insert(LABEL_RULE_UID.into(), rule.uid.clone());
    if rule.sync_policy == SyncPolicy::CreateOnly {
        // Kept with the copy, so that it stays its namespace's after the
        // rule changes or goes (finalizer, orphan collection, adoption).
        labels.insert(LABEL_SYNC_POLICY.into(), CREATE_ONLY.into());
    }
    if rule.deletion.rule_deleted == Disposal::Orphan {
        // Kept with the copy, so that it is handed over even when its rule
        // goes without its finalizer (orphan collection reads it).
        labels.insert(LABEL_ON_RULE_DELETED.into(), ORPHAN.into());
    }
    let mut annotations = stripped(
        &source.annotations,
        &transform.strip_annotations,
        &rule.policy.strip_keys,
        steps,
    )?;
    annotations.extend(transform.add_annotations.clone());
    annotations.insert(ANNOTATION_RULE.into(), rule.key.to_string());
    annotations.insert(
        ANNOTATION_SOURCE.into(),
        format!("{}/{}", source.namespace, source.name),
    );
    annotations.insert(ANNOTATION_SOURCE_UID.into(), source.uid.clone());
    let (payload, payload_hash) = if transform.keys.is_identity() {
        (source.payload.clone(), source.payload_hash)
    } else {
        let mut payload = selected_payload(rule.kind, &transform.keys, &source.payload, steps)?;
        if transform.to_config_map {
            payload = crate::core::text_copy::config_map_payload(&payload);
        }
        let hash = crate::cache::index::payload_hash(&payload);
        (payload, hash)
    };
    let mut meta_entries: Vec<u64> = labels
        .iter()
        .map(|(k, v)| meta_entry_hash(MetaMap::Label, k, v))
        .chain(
            annotations
                .iter()
                .map(|(k, v)| meta_entry_hash(MetaMap::Annotation, k, v)),
        )
        .collect();
    meta_entries.sort_unstable();
    meta_entries.dedup();
    Some(Desired {
        meta_entries: crate::cache::intern::hashes(&meta_entries),
        kind: rule.copy_kind,
        name: transform.naming.name_unchecked(&source.name).into_owned(),
        content_hash: crate::cache::index::content_hash(&labels, &annotations, payload_hash),
        payload_hash,
        labels,
        annotations,
        payload,
        source: format!("{}/{}", source.namespace, source.name),
    })
}

/// The copy each copy's name wants (its winner's: the first source
/// namespace wins a name, as in the plan; none where sources collide on a
/// name of `transform.name`), for the names a pass over a scope may look at. Computed from the rule and its sources alone, before
/// the plan takes the views' locks: it is the part of a pass that grows
/// with what the sources hold (their keys and data), and no other rule's
/// pass, nor the health probe, waits for it.
#[derive(Default)]
pub(crate) struct DesiredCopies {
    by_name: HashMap<String, Arc<Desired>>,
    /// Computing them took more than [`GLOB_STEPS_PER_PASS`]: some are
    /// missing, and a plan from them holds nothing.
    pub(crate) too_costly: bool,
}

impl DesiredCopies {
    /// The copy named `name`, if it was computed.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Desired>> {
        self.by_name.get(name)
    }

    /// Every copy computed.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Desired>> {
        self.by_name.values()
    }
}

/// The copies of `rule`'s sources that a pass over `scope` may need,
/// within [`GLOB_STEPS_PER_PASS`] together.
pub(crate) fn desired_copies(
    rule: &ResolvedRule,
    sources: &[Arc<Object>],
    scope: &Scope,
) -> DesiredCopies {
    let sources = SourcesByName::gather(rule, sources, &mut Plan::default());
    let wanted = names_scope_may_need(scope);
    let mut steps = GLOB_STEPS_PER_PASS;
    let mut out = DesiredCopies::default();
    for (name, same_name) in &sources.by_name {
        if wanted
            .as_ref()
            .is_some_and(|wanted| !wanted.contains(name.as_ref()))
            || sources.collide(same_name)
        {
            continue;
        }
        match desired_copy_within(rule, same_name[0], &mut steps) {
            Some(desired) => {
                out.by_name.insert(name.to_string(), Arc::new(desired));
            }
            None => {
                out.too_costly = true;
                break;
            }
        }
    }
    out
}

/// The copies' names whose places a pass over `scope` may look at, as
/// [`Planner::names_in_scope`] picks them; `None` for every name (some
/// namespace is in scope as a whole).
fn names_scope_may_need(scope: &Scope) -> Option<HashSet<&str>> {
    if scope.is_everything() || scope.namespaces().next().is_some() {
        return None;
    }
    Some(
        scope
            .names()
            .chain(scope.copies().map(|(_, name)| name))
            .collect(),
    )
}

/// What keeps a namespace that a rule's targets match from receiving copies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LeftOut {
    /// Protected: only an exact name reaches it.
    pub(crate) protected: u32,
    /// A tenant rule's target that does not accept the rule's namespace.
    pub(crate) not_accepted: u32,
}

/// Why a namespace that a rule's targets match receives nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Exclusion {
    /// Protected: only an exact name in `targets.include` reaches it.
    Protected,
    /// A tenant rule's target whose consent annotation does not name the rule's namespace.
    NotAccepting,
}

/// Whether `rule` may write into the namespace `name` that its targets
/// match, and if not, why.
fn exclusion(rule: &ResolvedRule, name: &str, info: &NamespaceInfo) -> Option<Exclusion> {
    // A tenant writes only where it is welcome; its own namespace is its
    // own, in its own cluster alone.
    let own = rule.in_own_cluster && name == rule.key.namespace;
    let granted = rule
        .granted_targets
        .as_ref()
        .is_some_and(|granted| granted.contains(name));
    let welcome = !rule.tenant || own || granted || info.accepts(&rule.key.namespace);
    if !welcome {
        return Some(Exclusion::NotAccepting);
    }
    let allowed = !rule.policy.is_protected(name) || rule.targets.names_exactly(name);
    (!allowed).then_some(Exclusion::Protected)
}

/// Whether `rule` targets the home namespace `name`, with these labels:
/// its targets match it and the rule keeps copies at home at all
/// (`targets.clusters.local`). Under `local: false` no home namespace is a
/// target, so the rule's home copies are pruned as in namespaces that
/// stopped matching (when `prune`), and none counts as left out: the rule
/// never asked for them, and naming each would be noise.
fn targets_at_home(rule: &ResolvedRule, name: &str, labels: &BTreeMap<String, String>) -> bool {
    rule.clusters.local && rule.targets.matches(name, labels)
}

/// The namespaces a rule targets (terminating ones included), and how many
/// more it would target but for their protection or their consent.
pub(crate) fn target_namespaces<'a>(
    rule: &ResolvedRule,
    namespaces: &'a BTreeMap<String, NamespaceInfo>,
) -> (Vec<(&'a String, &'a NamespaceInfo)>, LeftOut) {
    let mut left_out = LeftOut::default();
    let targets = namespaces
        .iter()
        .filter(|(name, info)| targets_at_home(rule, name, &info.labels))
        .filter(|(name, info)| {
            let Some(exclusion) = exclusion(rule, name, info) else {
                return true;
            };
            // A source namespace receives nothing of its own anyway: not worth a mention.
            if !rule.source_namespaces.contains(name) {
                match exclusion {
                    Exclusion::Protected => left_out.protected += 1,
                    Exclusion::NotAccepting => left_out.not_accepted += 1,
                }
            }
            false
        })
        .collect();
    (targets, left_out)
}

/// For a rule whose consent is its identity's rights: the namespaces its
/// targets match that do not accept it by annotation, whose grant to
/// write there is to be asked (see `ResolvedRule::granted_targets`).
pub(crate) fn targets_to_ask<'a>(
    rule: &ResolvedRule,
    namespaces: &'a BTreeMap<String, NamespaceInfo>,
) -> Vec<&'a str> {
    if !rule.consent_by_rights || !rule.in_own_cluster {
        return Vec::new();
    }
    namespaces
        .iter()
        .filter(|(name, info)| {
            targets_at_home(rule, name, &info.labels)
                && **name != rule.key.namespace
                && !rule.source_namespaces.contains(name)
                && !info.accepts(&rule.key.namespace)
        })
        .map(|(name, _)| name.as_str())
        .collect()
}

/// The namespaces [`target_namespaces`] counts as left out, by name and
/// why, in name order (for `copyrator plan`; a pass needs only the counts).
pub(crate) fn left_out_namespaces<'a>(
    rule: &ResolvedRule,
    namespaces: &'a BTreeMap<String, NamespaceInfo>,
) -> Vec<(&'a str, Exclusion)> {
    namespaces
        .iter()
        .filter(|(name, info)| {
            targets_at_home(rule, name, &info.labels) && !rule.source_namespaces.contains(name)
        })
        .filter_map(|(name, info)| exclusion(rule, name, info).map(|e| (name.as_str(), e)))
        .collect()
}

/// Whether a change of the namespace `name` (from `before` to `after`,
/// either absent when it was created or deleted) may change what `rule`
/// does: it holds the rule's sources, or the rule targets it before or
/// after (its labels or consent changed). Other rules need no pass.
/// Under `targets.clusters.local: false` a namespace the targets match
/// still concerns the rule: a pass there prunes what the rule left in it.
pub(crate) fn concerns_namespace(
    rule: &ResolvedRule,
    name: &str,
    before: Option<&NamespaceInfo>,
    after: Option<&NamespaceInfo>,
) -> bool {
    rule.source_namespaces.iter().any(|ns| ns == name)
        || [before, after]
            .into_iter()
            .flatten()
            .any(|info| rule.targets.matches(name, &info.labels))
}

/// Compute what `inputs.rule` needs.
#[cfg(test)]
pub(crate) fn plan(inputs: &Inputs<'_>) -> Plan {
    let desired = desired_copies(inputs.rule, inputs.sources, inputs.scope);
    plan_with(inputs, &desired)
}

/// Compute what `inputs.rule` needs, from the copies its sources want
/// ([`desired_copies`] for the same rule, sources and scope).
pub(crate) fn plan_with(inputs: &Inputs<'_>, desired: &DesiredCopies) -> Plan {
    let mut out = Plan::default();
    let sources = SourcesByName::gather(inputs.rule, inputs.sources, &mut out);
    if desired.too_costly {
        out.too_costly = true;
        return out;
    }
    let (targets, left_out) = target_namespaces(inputs.rule, inputs.namespaces);
    out.protected_namespaces = left_out.protected;
    out.not_accepting_namespaces = left_out.not_accepted;
    let mut planner = Planner {
        inputs,
        sources: &sources,
        shadowing: sources.shadowing(),
        desired,
        live_targets: HashSet::with_capacity(targets.len()),
        out,
    };
    for (namespace, info) in targets {
        // A terminating namespace receives nothing, and what is there of
        // ours is kept out of pruning too.
        if !info.terminating {
            planner.plan_target(namespace);
        }
    }
    if inputs.rule.prune {
        planner.plan_prunes();
    }
    planner.finish()
}

/// A plan's sources by the name of their copies (`transform.name`, by
/// default their own), those of one name in the order of the rule's
/// source namespaces: the first namespace wins a name, unless the rule
/// renames its copies; then sources that meet on a name get no copy.
struct SourcesByName<'a> {
    rule: &'a ResolvedRule,
    by_name: BTreeMap<Cow<'a, str>, Vec<&'a Object>>,
    /// Names whose winning source is pulled from another namespace: they
    /// land in the rule's own namespace alone.
    pulled_names: u32,
    /// Names that sources meet on under `transform.name`: they land nowhere.
    colliding_names: u32,
    /// Where the sources are, `(namespace, name)`, for a rule that renames
    /// its copies: a copy's name may be a source's there (for a rule that
    /// does not, a copy's place holds a source only where a source of its
    /// name is, see [`SourcesByName::lands_in`]).
    renamed_sources: HashSet<(&'a str, &'a str)>,
}

impl<'a> SourcesByName<'a> {
    /// The `candidates` that are sources of `rule`, counted in `out`, which
    /// also names those refused for their type alone.
    fn gather(rule: &'a ResolvedRule, candidates: &'a [Arc<Object>], out: &mut Plan) -> Self {
        let mut by_name: BTreeMap<Cow<'a, str>, Vec<&Object>> = BTreeMap::new();
        let mut renamed_sources = HashSet::new();
        let naming = &rule.transform.naming;
        let mut steps = GLOB_STEPS_PER_PASS;
        for source in candidates {
            match source_rejection(rule, source) {
                None => {}
                // A source the rule would copy but for its type (never one that
                // a tenant rule may not see: that is rejected before).
                Some(NOT_COPIED_TYPE) => {
                    if let Some(why) = rule.policy.refuses_source(rule.kind, source) {
                        out.refused_sources
                            .push((format!("{}/{}", source.namespace, source.name), why));
                    }
                    continue;
                }
                Some(_) => continue,
            }
            // Refused for what it holds, as for its type: no source of the rule.
            let as_text = crate::core::text_copy::refusal(rule, source, &mut steps)
                .unwrap_or_else(|_| Some("choosing its keys took too long".to_owned()));
            if let Some(why) = as_text {
                out.refused_sources
                    .push((format!("{}/{}", source.namespace, source.name), why));
                continue;
            }
            out.sources += 1;
            if !naming.is_same() {
                renamed_sources.insert((&*source.namespace, &*source.name));
            }
            match naming.copy_name(&source.name) {
                Ok(name) => by_name.entry(name).or_default().push(source),
                Err(why) => out.refused_sources.push((
                    format!("{}/{}", source.namespace, source.name),
                    why.to_string(),
                )),
            }
        }
        for same_name in by_name.values_mut() {
            same_name.sort_by_key(|s| {
                rule.source_namespaces
                    .iter()
                    .position(|ns| **ns == *s.namespace)
            });
        }
        let renamed = !naming.is_same();
        let collide = |same_name: &[&Object]| renamed && same_name.len() > 1;
        let pulled_names = by_name
            .values()
            .filter(|same_name| !collide(same_name) && is_pulled(rule, same_name[0]))
            .count() as u32;
        let colliding_names = by_name
            .values()
            .filter(|same_name| collide(same_name))
            .count() as u32;
        Self {
            rule,
            by_name,
            pulled_names,
            colliding_names,
            renamed_sources,
        }
    }

    /// Whether `same_name`, the sources whose copies take one name, meet
    /// there: under `transform.name`, none of them is copied (which one a
    /// copy holds could not be told from its name), and the name is no
    /// place that should hold a copy; otherwise the first source namespace
    /// wins.
    fn collide(&self, same_name: &[&Object]) -> bool {
        same_name.len() > 1 && !self.rule.transform.naming.is_same()
    }

    /// Whether the winner among `same_name` (the sources of one name) is
    /// pulled from another namespace.
    fn winner_is_pulled(&self, same_name: &[&Object]) -> bool {
        is_pulled(self.rule, same_name[0])
    }

    /// Whether the winner among `same_name` (the sources whose copies are
    /// named `name`) lands in `namespace`: never where a source is the
    /// object of that name (for a rule that keeps its sources' names, the
    /// source itself), and a pulled one only in the rule's namespace.
    fn lands_in(&self, name: &str, same_name: &[&Object], namespace: &str) -> bool {
        let holds_a_source = if self.rule.copy_kind != self.rule.kind {
            // A copy of another kind (`transform.toKind`) is no source.
            false
        } else if self.rule.transform.naming.is_same() {
            same_name.iter().any(|s| &*s.namespace == namespace)
        } else {
            self.renamed_sources.contains(&(namespace, name))
        };
        !holds_a_source
            && (namespace == self.rule.key.namespace || !self.winner_is_pulled(same_name))
    }

    /// How many names land in `namespace`, in scope or not.
    fn landing_in(&self, namespace: &str) -> u32 {
        if is_source_namespace(self.rule, namespace) {
            self.by_name
                .iter()
                .filter(|(name, same_name)| {
                    !self.collide(same_name) && self.lands_in(name, same_name, namespace)
                })
                .count() as u32
        } else if namespace == self.rule.key.namespace {
            self.by_name.len() as u32 - self.colliding_names
        } else {
            self.by_name.len() as u32 - self.colliding_names - self.pulled_names
        }
    }

    /// The names that more than one source's copy takes, with their sources.
    fn shadowing(&self) -> Vec<(&str, &[&'a Object])> {
        self.by_name
            .iter()
            .filter(|(_, same_name)| same_name.len() > 1)
            .map(|(name, same_name)| (name.as_ref(), same_name.as_slice()))
            .collect()
    }
}

/// Whether `rule` takes sources from `namespace`.
fn is_source_namespace(rule: &ResolvedRule, namespace: &str) -> bool {
    rule.source_namespaces.iter().any(|ns| ns == namespace)
}

/// A plan under way: what it has found so far, and what it keeps from one
/// target namespace to the next.
struct Planner<'a> {
    inputs: &'a Inputs<'a>,
    sources: &'a SourcesByName<'a>,
    /// Computed once: see [`SourcesByName::shadowing`].
    shadowing: Vec<(&'a str, &'a [&'a Object])>,
    /// One desired copy per source name, shared by every target namespace.
    desired: &'a DesiredCopies,
    /// Targets that receive writes: pruning leaves what they want.
    live_targets: HashSet<&'a str>,
    out: Plan,
}

/// What one place in scope that a source lands in needs.
enum Placement {
    /// The copy there is right (or handed over, to a rule that only creates).
    InPlace,
    /// A copy should be there; this write makes it so.
    Write(Action),
    /// Another object holds the place and is left alone, for this reason.
    Conflict(String),
    /// The copy would grant there what its source does not grant in its
    /// own namespace: it is not written, for this reason, and the rule's
    /// copy there, if any, is deleted.
    Refused {
        reason: String,
        ours: Option<Arc<Object>>,
    },
}

impl<'a> Planner<'a> {
    /// Plan the live target `namespace`: count its places, name the
    /// sources shadowed there, and decide each place in scope.
    fn plan_target(&mut self, namespace: &'a str) {
        self.live_targets.insert(namespace);
        self.count_places(namespace);
        self.name_shadowed(namespace);
        let names = self.names_in_scope(namespace);
        if names.is_empty() {
            return;
        }
        let rule = self.inputs.rule;
        let copies_here = self.inputs.copies.in_namespace(namespace);
        for name in names {
            let Some(same_name) = self.sources.by_name.get(name) else {
                continue;
            };
            self.out.examined += 1;
            // A source never lands on its own namespace (in a source namespace
            // the object of that name is the source itself), and a pulled one
            // only on the rule's namespace. Sources that meet on a name of
            // `transform.name` land nowhere (see `name_shadowed`).
            if !self.sources.lands_in(name, same_name, namespace) || self.sources.collide(same_name)
            {
                continue;
            }
            // Computed for every name this scope can yield (both follow
            // `names_scope_may_need`), unless too costly: then no plan.
            let Some(desired) = self.desired.get(name) else {
                continue;
            };
            let current = copies_here.and_then(|copies| copies.get(name));
            let source_namespace = &same_name[0].namespace;
            let refused = grants::refusal(
                rule.kind,
                &desired.payload,
                source_namespace,
                namespace,
                self.inputs.roles,
            );
            let outcome = match refused {
                Some(why) => refuse(self.inputs, desired, current, why),
                None => decide(self.inputs, namespace, name, desired, current),
            };
            self.record(namespace, name, outcome);
        }
    }

    /// Count the places in `namespace` that should hold a copy, whatever
    /// the scope, and `namespace` as a target if it is one.
    fn count_places(&mut self, namespace: &str) {
        let receivable = self.sources.landing_in(namespace);
        self.out.places += receivable;
        // A source namespace counts as a target only where it receives
        // copies of other namespaces' sources.
        if !is_source_namespace(self.inputs.rule, namespace) || receivable > 0 {
            self.out.target_namespaces += 1;
        }
    }

    /// Name every source shadowed at `namespace` by another of its name,
    /// or that meets others on a name of `transform.name`, whatever the
    /// scope.
    fn name_shadowed(&mut self, namespace: &str) {
        for (name, same_name) in &self.shadowing {
            if !self.sources.lands_in(name, same_name, namespace) {
                continue;
            }
            if self.sources.collide(same_name) {
                let mut sources: Vec<String> = same_name
                    .iter()
                    .map(|s| format!("{}/{}", s.namespace, s.name))
                    .collect();
                sources.sort_unstable();
                self.out.shadowed.push(ConflictEntry {
                    cluster: None,
                    namespace: namespace.to_owned(),
                    name: (*name).to_owned(),
                    reason: format!(
                        "sources {} would all be copied as {name} (transform.name): none is copied here",
                        sources.join(", ")
                    ),
                });
                continue;
            }
            for shadowed in &same_name[1..] {
                self.out.shadowed.push(ConflictEntry {
                    cluster: None,
                    namespace: namespace.to_owned(),
                    name: (*name).to_owned(),
                    reason: format!(
                        "source {}/{} has the same name as {}/{}, which wins",
                        shadowed.namespace,
                        shadowed.name,
                        same_name[0].namespace,
                        same_name[0].name
                    ),
                });
            }
        }
    }

    /// The copies' names whose places in `namespace` the scope covers, in
    /// name order.
    fn names_in_scope(&self, namespace: &str) -> Vec<&'a str> {
        let scope = self.inputs.scope;
        let sources = self.sources;
        if scope.covers_namespace(namespace) {
            return sources.by_name.keys().map(AsRef::as_ref).collect();
        }
        let mut names: Vec<&'a str> = scope
            .names()
            .chain(scope.copies_in(namespace))
            .filter_map(|name| sources.by_name.get_key_value(name))
            .map(|(name, _)| name.as_ref())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Add what the place `namespace/name` needs to the plan.
    fn record(&mut self, namespace: &str, name: &str, outcome: Placement) {
        match outcome {
            Placement::InPlace => {
                self.out.desired += 1;
                self.out.in_place += 1;
            }
            Placement::Write(action) => {
                self.out.desired += 1;
                self.out.actions.push(action);
            }
            Placement::Conflict(reason) => self.out.conflicts.push(ConflictEntry {
                cluster: None,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason,
            }),
            Placement::Refused { reason, ours } => {
                if let Some(current) = ours {
                    self.out.actions.push(Action::Delete {
                        current,
                        reason: DeleteReason::SourceGone,
                    });
                }
                // Listed with the conflicts: a place skipped, and why.
                self.out.conflicts.push(ConflictEntry {
                    cluster: None,
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    reason,
                });
            }
        }
    }

    /// Delete the rule's copies in scope that no live target wants.
    fn plan_prunes(&mut self) {
        let inputs = self.inputs;
        for current in copies_in_scope(inputs.rule, inputs, inputs.scope) {
            self.out.examined += 1;
            // A namespace the cache has not seen yet may well be a target:
            // its copies wait until it has been seen.
            let prunable = inputs
                .namespaces
                .get(&*current.namespace)
                .is_some_and(|ns| !ns.terminating);
            // Ours at a live target with a source of its name from elsewhere:
            // `plan_target` wants it.
            let wanted = self.live_targets.contains(&*current.namespace)
                && self
                    .sources
                    .by_name
                    .get(&*current.name)
                    .is_some_and(|same_name| {
                        self.sources
                            .lands_in(&current.name, same_name, &current.namespace)
                    });
            // A copy handed over to its namespace is never pruned.
            if prunable && !wanted && !current.create_only {
                let reason = if self.live_targets.contains(&*current.namespace) {
                    DeleteReason::SourceGone
                } else {
                    DeleteReason::TargetLeft
                };
                let disposal = disposal_of(
                    current,
                    reason.disposal(&inputs.rule.deletion),
                    inputs.rule.tenant.then_some(&*inputs.rule.key.namespace),
                    inputs.namespaces,
                );
                self.out
                    .actions
                    .push(Action::dispose(current.clone(), reason, disposal));
            }
        }
    }

    /// The plan, its writes in the order of their targets, its conflicts
    /// and shadowed sources sorted and each named once.
    fn finish(self) -> Plan {
        let mut out = self.out;
        out.actions.sort_by(|a, b| a.target().cmp(&b.target()));
        out.conflicts.sort();
        out.conflicts.dedup();
        out.shadowed.sort();
        out.shadowed.dedup();
        out
    }
}

/// What the place `namespace/name` needs for `desired` to be there, with
/// `current` there if anything the copy cache holds is.
fn decide(
    inputs: &Inputs<'_>,
    namespace: &str,
    name: &str,
    desired: &Arc<Desired>,
    current: Option<&Arc<Object>>,
) -> Placement {
    if let Some(current) = current {
        return decide_over(inputs, desired, current);
    }
    match inputs
        .known_conflicts
        .get(&(namespace.to_owned(), name.to_owned()))
    {
        Some(reason) if inputs.rule.conflict_policy == ConflictPolicy::Skip => {
            Placement::Conflict(reason.clone())
        }
        _ => Placement::Write(Action::Create {
            desired: desired.clone(),
            namespace: namespace.to_owned(),
        }),
    }
}

/// What a place needs where `desired` may not be written, for `reason`
/// (see [`grants::refusal`]): the refusal, and the deletion of the rule's
/// copy there whatever `prune` and `deletionPolicy` say, since that copy
/// grants what its source does not. A copy handed over to its namespace
/// is the namespace's, as anywhere.
fn refuse(
    inputs: &Inputs<'_>,
    desired: &Arc<Desired>,
    current: Option<&Arc<Object>>,
    reason: String,
) -> Placement {
    match current {
        Some(current) if current.create_only => decide_over(inputs, desired, current),
        Some(current)
            if current.authored && is_ours(inputs.rule, current, inputs.live_rule_uids) =>
        {
            Placement::Refused {
                reason,
                ours: Some(current.clone()),
            }
        }
        _ => Placement::Refused { reason, ours: None },
    }
}

/// What a place that `current` holds needs for `desired` to be there.
fn decide_over(inputs: &Inputs<'_>, desired: &Arc<Desired>, current: &Arc<Object>) -> Placement {
    let rule = inputs.rule;
    if current.create_only {
        // Handed over to its namespace: never written again. For a rule
        // that only creates, it is the copy it made.
        let made_here = rule.sync_policy == SyncPolicy::CreateOnly
            && current.rule_uid() == Some(rule.uid.as_str());
        return if made_here {
            Placement::InPlace
        } else if may_adopt(
            claim_at(inputs, current),
            desired,
            current,
            &rule.key.to_string(),
        ) {
            Placement::Write(adopt(desired, current))
        } else {
            Placement::Conflict(handed_over_reason(current.rule_ref.as_deref()))
        };
    }
    if !current.authored {
        if current.is_unproven_copy_of(&rule.key.to_string(), desired.payload_hash) {
            // Copyrator's labels without its mark (written before copies
            // carried one), holding what the rule writes anyway: one write
            // marks it.
            return Placement::Write(rewrite(desired, current));
        }
        // Copyrator's labels set by someone else: a foreign object.
        if may_adopt(
            claim_at(inputs, current),
            desired,
            current,
            &rule.key.to_string(),
        ) {
            return Placement::Write(adopt(desired, current));
        }
        return match rule.conflict_policy {
            ConflictPolicy::Skip => Placement::Conflict(foreign_reason(rule.copy_kind, current)),
            ConflictPolicy::Overwrite => Placement::Write(rewrite(desired, current)),
        };
    }
    if !is_ours(rule, current, inputs.live_rule_uids) {
        let owner = current.rule_ref.as_deref().unwrap_or("another rule");
        return Placement::Conflict(format!("a copy made by rule {owner} is there"));
    }
    // A copy its mark does not prove this rule's by UID (its label
    // changed, or a mark of the earlier form) is written and marked anew.
    if desired.is_satisfied_by(current) && current.rule_uid().is_some() {
        Placement::InPlace
    } else {
        Placement::Write(rewrite(desired, current))
    }
}

fn adopt(desired: &Arc<Desired>, current: &Arc<Object>) -> Action {
    Action::Adopt {
        desired: desired.clone(),
        current: current.clone(),
    }
}

/// The claim of `inputs.rule` at the place `current` holds.
fn claim_at(inputs: &Inputs<'_>, current: &Object) -> Claim {
    Claim::in_namespace(
        inputs.rule,
        &current.namespace,
        inputs.namespaces.get(&*current.namespace),
    )
}

/// How a rule takes the objects it finds at its places that it did not
/// write: its `conflictPolicy`, and whether it adopts (`spec.adopt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) policy: ConflictPolicy,
    pub(crate) adopt: bool,
    /// A tenant rule where the namespace did not let it adopt any object
    /// (`copyrator.flant.com/adopt-from`): it adopts only what another
    /// copying tool's marks say came from the rule's own namespace.
    pub(crate) adopt_own_only: bool,
}

impl From<ConflictPolicy> for Claim {
    fn from(policy: ConflictPolicy) -> Self {
        Claim {
            policy,
            adopt: false,
            adopt_own_only: false,
        }
    }
}

/// A rule's claim where the namespace is not known: a tenant rule's
/// adoption is limited as in a namespace that did not let it adopt.
impl From<&ResolvedRule> for Claim {
    fn from(rule: &ResolvedRule) -> Self {
        Claim {
            policy: rule.conflict_policy,
            adopt: rule.adopt,
            adopt_own_only: rule.tenant,
        }
    }
}

impl Claim {
    /// `rule`'s claim in the namespace `name` (described by `info`): a
    /// tenant rule adopts any object only in its own namespace (in its own
    /// cluster) or where the namespace lets its namespace adopt.
    pub(crate) fn in_namespace(
        rule: &ResolvedRule,
        name: &str,
        info: Option<&NamespaceInfo>,
    ) -> Self {
        let own = rule.in_own_cluster && name == rule.key.namespace;
        let lets_adopt = own || info.is_some_and(|i| i.adopts_from(&rule.key.namespace));
        Claim {
            adopt_own_only: rule.tenant && !lets_adopt,
            ..Claim::from(rule)
        }
    }
}

/// How a copy of `rule` that no longer belongs is disposed of: as
/// `wanted`, but an object a tenant rule adopted is handed over, never
/// deleted, where its namespace did not let the rule's namespace adopt
/// (`copyrator.flant.com/adopt-from`). `tenant` is the namespace of a
/// tenant rule; none for a rule of the operator's namespace.
pub(crate) fn disposal_of(
    copy: &Object,
    wanted: Disposal,
    tenant: Option<&str>,
    namespaces: &BTreeMap<String, NamespaceInfo>,
) -> Disposal {
    let Some(tenant) = tenant else {
        return wanted;
    };
    let deletion_allowed = namespaces
        .get(&*copy.namespace)
        .is_some_and(|ns| ns.adopts_from(tenant));
    if copy.adopted_from.is_some() && !deletion_allowed {
        Disposal::Orphan
    } else {
        wanted
    }
}

/// Whether a rule that claims as `claim` (`rule`: `namespace/name`) adopts
/// `existing`, an object it did not write at a place of `desired`: only
/// when asked to; an object another tool made only if it holds `desired`'s
/// payload already; a copy handed over by an earlier rule of this name
/// (`deletionPolicy` Orphan, or `syncPolicy: CreateOnly`) also while its
/// mark proves it still holds what Copyrator wrote there (the source
/// changed since: no edit of its namespace's is lost by bringing it up to
/// date, which the rule's next pass does); never a copy of another rule.
pub(crate) fn may_adopt(claim: Claim, desired: &Desired, existing: &Object, rule: &str) -> bool {
    if !claim.adopt {
        return false;
    }
    // Decided before the content is looked at, so that what a tenant's
    // rule does (and its status says) tells nothing of an object's content
    // where it may not adopt.
    if claim.adopt_own_only {
        let rule_namespace = rule
            .split_once('/')
            .map_or(rule, |(namespace, _)| namespace);
        let from =
            crate::core::tracking::copied_from_namespace(&existing.labels, &existing.annotations);
        if existing.create_only || from != Some(rule_namespace) {
            return false;
        }
    }
    let ours_uid = desired.labels.get(LABEL_RULE_UID).map(String::as_str);
    if existing.create_only {
        // Handed over by a rule of this name; by this very rule it is the
        // copy a rule that only creates made, not one to take back.
        return existing.rule_ref.as_deref() == Some(rule)
            && existing.rule_uid() != ours_uid
            && (existing.intact || existing.payload_hash == desired.payload_hash);
    }
    if existing.payload_hash != desired.payload_hash {
        return false;
    }
    // Another tool's object, or one carrying Copyrator's labels that
    // Copyrator did not write. Copyrator's own copies are never adopted:
    // this rule's (and an earlier one's of its name) are its already,
    // another rule's are not to be taken.
    !existing.authored
}

/// The write that turns `current` into `desired`: an update, or a recreate
/// where `current` cannot be updated into it.
fn rewrite(desired: &Arc<Desired>, current: &Arc<Object>) -> Action {
    if desired.needs_recreate(current) {
        Action::Recreate {
            desired: desired.clone(),
            current: current.clone(),
        }
    } else {
        Action::Update {
            desired: desired.clone(),
            current: current.clone(),
        }
    }
}

/// The rule's own copies that `scope` covers: every one for a pass over
/// everything, else only those in the namespaces, of the names and at the
/// places touched.
fn copies_in_scope<'a>(
    rule: &'a ResolvedRule,
    inputs: &'a Inputs<'_>,
    scope: &'a Scope,
) -> Box<dyn Iterator<Item = &'a Arc<Object>> + 'a> {
    if scope.is_everything() {
        return Box::new(inputs.copies.owned_by(&rule.uid));
    }
    let ours = move |copy: &&Arc<Object>| copy.rule_uid() == Some(rule.uid.as_str());
    let in_namespaces = scope
        .namespaces()
        .filter_map(|ns| inputs.copies.in_namespace(ns))
        .flat_map(|copies| copies.values());
    let of_names = scope.names().flat_map(move |name| {
        inputs
            .namespaces
            .keys()
            .filter(move |ns| !scope.covers_namespace(ns))
            .filter_map(move |ns| inputs.copies.get(ns, name))
    });
    let at_places = scope
        .copies()
        .filter(move |(ns, name)| !scope.covers_namespace(ns) && !scope.names().any(|n| n == *name))
        .filter_map(|(ns, name)| inputs.copies.get(ns, name));
    Box::new(in_namespaces.chain(of_names).chain(at_places).filter(ours))
}

/// Why a copy handed over to its namespace (`syncPolicy: CreateOnly`) by
/// the rule `rule_ref` is not written.
pub(crate) fn handed_over_reason(rule_ref: Option<&str>) -> String {
    let rule = rule_ref.unwrap_or("(unknown)");
    format!(
        "a copy that rule {rule} handed over (syncPolicy CreateOnly, or deletionPolicy Orphan) is there and belongs to its namespace; delete it, or remove its label {LABEL_SYNC_POLICY}, to let this rule write it"
    )
}

/// Whether a copy at a target belongs to this rule: its mark proves the
/// rule's UID, or it names this rule and its UID belongs to no rule we know
/// (an earlier rule of the same name, whose copies this one adopts) or is
/// not proven (its rule-UID label removed or changed by someone: put back
/// by the write). Copies handed over to their namespaces are told apart
/// before.
fn is_ours(rule: &ResolvedRule, current: &Object, live_rule_uids: &dyn Fn(&str) -> bool) -> bool {
    let names_this_rule = || current.rule_ref.as_deref() == Some(&rule.key.to_string());
    match current.rule_uid() {
        Some(uid) if uid == rule.uid => true,
        Some(uid) => !live_rule_uids(uid) && names_this_rule(),
        None => names_this_rule(),
    }
}

/// What a create meets where the name is already taken by an object the
/// copy cache does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Occupied {
    /// A copy of this very rule (the cache is behind): nothing to write.
    Ours,
    /// Left alone, for this reason.
    Conflict(String),
    /// Taken over: the object is deleted and the copy created (its
    /// immutable parts differ).
    Recreate,
    /// Taken over: the object is replaced by the copy.
    Update,
    /// Taken over as it is: it holds the copy's payload already (see
    /// [`may_adopt`]); one metadata patch.
    Adopt,
}

/// Whether a create of `desired` by rule `rule` (`namespace/name`) takes
/// over `existing`, the object that holds the name: a copy of another rule
/// is never taken, a foreign object only under `Overwrite`, a copy of an
/// earlier rule of the same name always.
pub(crate) fn occupied(
    desired: &Desired,
    existing: &Object,
    claim: impl Into<Claim>,
    rule: &str,
) -> Occupied {
    let claim = claim.into();
    let policy = claim.policy;
    if may_adopt(claim, desired, existing, rule) {
        return Occupied::Adopt;
    }
    if existing.is_unlabelled_copy_of(rule)
        || existing.is_unproven_copy_of(rule, desired.payload_hash)
    {
        // Ours, its rule-UID label removed by someone: put back like any
        // other key Copyrator owns.
        return if desired.needs_recreate(existing) {
            Occupied::Recreate
        } else {
            Occupied::Update
        };
    }
    if let Some(uid) = existing.rule_uid() {
        if desired.labels.get(LABEL_RULE_UID).map(String::as_str) == Some(uid) {
            // Ours and right; ours but stale (the cache was behind) is updated.
            if desired.is_satisfied_by(existing) {
                return Occupied::Ours;
            }
            return if desired.needs_recreate(existing) {
                Occupied::Recreate
            } else {
                Occupied::Update
            };
        }
        // Handed over to its namespace by the rule that made it: no rule
        // takes it, not even a later one of the same name.
        if existing.create_only {
            return Occupied::Conflict(handed_over_reason(existing.rule_ref.as_deref()));
        }
        let owner = existing.rule_ref.as_deref().unwrap_or("another rule");
        if owner != rule {
            return Occupied::Conflict(format!("a copy made by rule {owner} is there"));
        }
    } else if policy == ConflictPolicy::Skip {
        return Occupied::Conflict(foreign_reason(desired.kind, existing));
    }
    if desired.needs_recreate(existing) {
        Occupied::Recreate
    } else {
        Occupied::Update
    }
}

/// Why a foreign object is left alone; one that carries Copyrator's labels
/// or annotations without Copyrator having written them is said to.
pub(crate) fn foreign_reason(kind: Kind, existing: &Object) -> String {
    let looks_like_a_copy =
        existing.rule_ref.is_some() || existing.labels.contains_key(LABEL_RULE_UID);
    if existing.unproven {
        format!(
            "a {kind} not made by Copyrator is there (it carries Copyrator's labels but not its \
             mark, and not the source's content)"
        )
    } else if looks_like_a_copy && !existing.authored {
        format!(
            "a {kind} not made by Copyrator is there (its Copyrator labels were set by another writer)"
        )
    } else {
        format!("a {kind} not made by Copyrator is there")
    }
}

/// The deletions of copies whose rule is gone without its finalizer having
/// run (force-deleted, or the finalizer removed by hand): their rule UID
/// is no live rule, and the rule they name is one this operator is
/// responsible for (`responsible(namespace/name)`) and does not exist, so
/// no rule of that name adopts them. Copies in namespaces the cache has
/// not seen, or that are terminating, are left alone, and so are copies
/// handed over to their namespaces (`syncPolicy: CreateOnly`).
pub(crate) fn orphans(
    copies: &CopyIndex,
    namespaces: &BTreeMap<String, NamespaceInfo>,
    live_rule_uid: &dyn Fn(&str) -> bool,
    responsible_for_missing_rule: &dyn Fn(&str) -> bool,
) -> Vec<Action> {
    let mut out: Vec<Action> = copies
        .rule_uids()
        .filter(|uid| !live_rule_uid(uid))
        .flat_map(|uid| copies.owned_by(uid))
        .filter(|c| {
            !c.create_only
                && c.rule_ref
                    .as_deref()
                    .is_some_and(responsible_for_missing_rule)
                && namespaces
                    .get(&*c.namespace)
                    .is_some_and(|ns| !ns.terminating)
        })
        .map(|c| {
            // Its rule is gone: the label is all that is left of its
            // policy. What it adopted is handed over: whether its rule
            // could delete it is not known any more.
            let disposal = if c.orphan_with_rule || c.adopted_from.is_some() {
                Disposal::Orphan
            } else {
                Disposal::Delete
            };
            Action::dispose(c.clone(), DeleteReason::RuleDeleted, disposal)
        })
        .collect();
    out.sort_by(|a, b| a.target().cmp(&b.target()));
    out
}

/// What clears a site of a rule's copies, all of which no longer belong for
/// `why` (the rule is deleted, or no longer targets the site, or no longer
/// copies their kind): each is deleted or handed over under `disposal` (as
/// [`disposal_of`] says for the rule, a tenant rule of the namespace
/// `tenant` or none), except in terminating namespaces (their deletion
/// takes the copies along) and those already handed over to their
/// namespaces.
pub(crate) fn cleanup(
    rule_uid: &str,
    why: DeleteReason,
    disposal: Disposal,
    tenant: Option<&str>,
    namespaces: &BTreeMap<String, NamespaceInfo>,
    copies: &CopyIndex,
) -> Vec<Action> {
    copies
        .owned_by(rule_uid)
        .filter(|c| {
            !c.create_only
                && !namespaces
                    .get(&*c.namespace)
                    .is_some_and(|ns| ns.terminating)
        })
        .map(|c| {
            let disposal = disposal_of(c, disposal, tenant, namespaces);
            Action::dispose(c.clone(), why, disposal)
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::rule::CopyratorRule;
    use crate::core::resolve::Trust;
    use crate::core::scope::Touch;
    use crate::core::tracking::TRACKING_KEYS;
    use serde_json::json;

    /// A cluster as a rule's plan sees it: its namespaces, the rule's
    /// candidate sources, the copy cache and the rule's known conflicts.
    pub(crate) struct World {
        pub(crate) namespaces: BTreeMap<String, NamespaceInfo>,
        pub(crate) sources: Vec<Arc<Object>>,
        pub(crate) copies: CopyIndex,
        pub(crate) known_conflicts: HashMap<ObjectKey, String>,
        pub(crate) roles: RoleIndex,
    }

    impl World {
        pub(crate) fn new(namespaces: &[&str]) -> Self {
            Self {
                namespaces: namespaces
                    .iter()
                    .map(|n| (n.to_string(), NamespaceInfo::default()))
                    .collect(),
                sources: Vec::new(),
                copies: CopyIndex::default(),
                known_conflicts: HashMap::new(),
                roles: RoleIndex::default(),
            }
        }

        pub(crate) fn source(
            &mut self,
            ns: &str,
            name: &str,
            labels: &[(&str, &str)],
            data: Value,
        ) -> Object {
            let mut o = crate::cache::index::tests::object(
                ns,
                name,
                &format!("uid-{ns}-{name}"),
                1,
                labels,
            );
            o.payload.insert("data".into(), data);
            o.rehash();
            self.sources.push(Arc::new(o.clone()));
            o
        }

        pub(crate) fn plan(&self, rule: &ResolvedRule) -> Plan {
            self.plan_within(rule, &Scope::everything())
        }

        pub(crate) fn plan_within(&self, rule: &ResolvedRule, scope: &Scope) -> Plan {
            let live = |uid: &str| uid == rule.uid;
            plan(&Inputs {
                rule,
                namespaces: &self.namespaces,
                sources: &self.sources,
                copies: &self.copies,
                live_rule_uids: &live,
                known_conflicts: &self.known_conflicts,
                scope,
                roles: &self.roles,
            })
        }

        /// The plan of a rule of `body`, of the same name as the rules
        /// before but created later (UID `rule-2`, the only live one).
        pub(crate) fn plan_of_later(&self, body: Value) -> Plan {
            let mut later = rule(body);
            later.uid = "rule-2".into();
            let live = |uid: &str| uid == "rule-2";
            plan(&Inputs {
                rule: &later,
                namespaces: &self.namespaces,
                sources: &self.sources,
                copies: &self.copies,
                live_rule_uids: &live,
                known_conflicts: &self.known_conflicts,
                scope: &Scope::everything(),
                roles: &self.roles,
            })
        }

        /// Apply a plan's writes to the world, as the API server would.
        pub(crate) fn apply(&mut self, plan: &Plan) {
            for action in &plan.actions {
                let (namespace, name) = action.target();
                let (namespace, name) = (namespace.to_owned(), name.to_owned());
                match action {
                    Action::Create { desired: d, .. }
                    | Action::Update { desired: d, .. }
                    | Action::Recreate { desired: d, .. }
                    | Action::Adopt { desired: d, .. } => {
                        let version = self
                            .copies
                            .get(&namespace, &name)
                            .and_then(|c| c.resource_version.parse::<u64>().ok())
                            .map_or(100, |v| v + 1);
                        // As the writer records Copyrator's own write.
                        let mut written = Object::new(
                            namespace.clone(),
                            name.clone(),
                            format!("copy-{namespace}-{name}"),
                            version.to_string(),
                            d.labels.clone(),
                            d.annotations.clone(),
                            d.payload.clone(),
                        );
                        written.written_for = Some(d.content_hash);
                        self.copies.upsert_written(Arc::new(written));
                    }
                    Action::Delete { current, .. } => {
                        self.copies.remove(current);
                    }
                    Action::HandOver { current, .. } => {
                        let mut handed = (**current).clone();
                        handed.create_only = true;
                        self.copies.upsert(Arc::new(handed));
                    }
                }
            }
        }
    }

    pub(crate) fn rule(body: Value) -> ResolvedRule {
        let mut value = body;
        value["metadata"] = json!({"name": "r", "namespace": "src", "uid": "rule-1"});
        let r: CopyratorRule = serde_json::from_value(value).unwrap();
        r.resolve(&Trust::new("src", false)).unwrap()
    }

    pub(crate) fn simple_rule() -> ResolvedRule {
        rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"}}))
    }

    pub(crate) fn verbs(plan: &Plan) -> Vec<(String, String, &'static str)> {
        plan.actions
            .iter()
            .map(|a| (a.target().0.to_owned(), a.target().1.to_owned(), a.verb()))
            .collect()
    }

    /// A copy whose rule-UID label is not proven by its mark (removed, or
    /// changed to another rule's UID) is its marked rule's to take back,
    /// and a conflict for any other rule, whatever UID the label names.
    #[test]
    fn a_relabelled_copy_is_its_marked_rules_and_a_conflict_for_others() {
        let r = simple_rule();
        let mut w = World::new(&["src", "t1"]);
        let source = w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let desired = desired_copy(&r, &source);
        // As `Object::from_dynamic` leaves a copy of `marked_rule` whose
        // label names the plan's rule but whose mark does not prove it.
        let relabelled = |marked_rule: &str, label: &str| {
            let mut labels = desired.labels.clone();
            labels.insert(LABEL_RULE_UID.into(), label.into());
            let mut annotations = desired.annotations.clone();
            annotations.insert(crate::ANNOTATION_RULE.into(), marked_rule.into());
            let mut copy = Object::new(
                "t1",
                "cm",
                "copy-uid".into(),
                "5".into(),
                labels,
                annotations,
                desired.payload.clone(),
            );
            copy.rule_uid = None;
            Arc::new(copy)
        };
        // Another rule's copy, labelled with this rule's UID.
        w.copies.upsert(relabelled("team-a/tenant-rule", &r.uid));
        let plan = w.plan(&r);
        assert!(plan.actions.is_empty(), "{:?}", verbs(&plan));
        assert_eq!(plan.conflicts.len(), 1);
        assert_eq!(
            plan.conflicts[0].reason,
            "a copy made by rule team-a/tenant-rule is there"
        );
        assert_eq!(plan.in_place, 0, "another rule's copy is not this one's");

        // This rule's copy, labelled with another rule's UID, or with its
        // own under a mark of the earlier form: written and marked anew.
        for label in ["rule-other", r.uid.as_str()] {
            let mut w = World::new(&["src", "t1"]);
            w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
            w.copies.upsert(relabelled("src/r", label));
            let plan = w.plan(&r);
            assert_eq!(verbs(&plan), [("t1".into(), "cm".into(), "update")]);
            assert!(plan.conflicts.is_empty());
        }
    }

    #[test]
    fn a_rule_whose_stripping_costs_too_much_plans_nothing() {
        // 64 patterns that backtrack over every long key of every source:
        // 60 letters after a star, again from each letter of the key.
        let patterns: Vec<String> = (0..64)
            .map(|i| format!("*{}b{i}", "a".repeat(60)))
            .collect();
        let r = rule(
            json!({"spec": {"ruleType": "configmap", "selector": {"copy": "yes"},
                            "targets": {"include": ["t*"]},
                            "transform": {"stripLabels": patterns}}}),
        );
        let mut w = World::new(&["src", "t1", "t2"]);
        let long = [
            "a".repeat(63),
            "a".repeat(63),
            "a".repeat(63),
            "a".repeat(60),
        ]
        .join(".");
        let mut labels: Vec<(String, String)> = (0..300)
            .map(|i| (format!("{long}/{}k{i}", "a".repeat(55)), "v".to_owned()))
            .collect();
        labels.push(("copy".to_owned(), "yes".to_owned()));
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        w.source("src", "cm", &labels, json!({"k": "v"}));
        let started = std::time::Instant::now();
        let p = w.plan(&r);
        assert!(p.too_costly);
        assert!(p.actions.is_empty(), "{:?}", verbs(&p));
        println!("stopped after {:?}", started.elapsed());

        // The same keys with plain patterns cost little, and are planned.
        let r = rule(
            json!({"spec": {"ruleType": "configmap", "selector": {"copy": "yes"},
                            "targets": {"include": ["t*"]},
                            "transform": {"stripLabels": ["k1*", "*.example.org/*"]}}}),
        );
        let p = w.plan(&r);
        assert!(!p.too_costly);
        assert_eq!(verbs(&p).len(), 2);
    }

    #[test]
    fn a_namespace_change_concerns_only_rules_that_source_or_target_it() {
        let r = rule(
            json!({"spec": {"ruleType": "configmap", "selector": {"copy": "yes"},
            "targets": {"include": ["team-*"], "exclude": ["team-x"]}}}),
        );
        let plain = NamespaceInfo::default();
        let labelled = |k: &str, v: &str| NamespaceInfo {
            labels: BTreeMap::from([(k.to_owned(), v.to_owned())]),
            ..NamespaceInfo::default()
        };
        assert!(
            concerns_namespace(&r, "team-a", None, Some(&plain)),
            "a new target"
        );
        assert!(
            concerns_namespace(&r, "team-a", Some(&plain), None),
            "a target gone"
        );
        assert!(
            concerns_namespace(&r, "src", Some(&plain), Some(&plain)),
            "its source namespace"
        );
        assert!(!concerns_namespace(&r, "other", None, Some(&plain)));
        assert!(
            !concerns_namespace(&r, "team-x", Some(&plain), Some(&plain)),
            "excluded"
        );
        let by_label = rule(
            json!({"spec": {"ruleType": "configmap", "selector": {"copy": "yes"},
            "targets": {"namespaceSelector": {"matchLabels": {"copies": "yes"}}}}}),
        );
        let on = labelled("copies", "yes");
        assert!(
            concerns_namespace(&by_label, "n", Some(&plain), Some(&on)),
            "starts to match"
        );
        assert!(
            concerns_namespace(&by_label, "n", Some(&on), Some(&plain)),
            "stops matching"
        );
        assert!(!concerns_namespace(
            &by_label,
            "n",
            Some(&plain),
            Some(&labelled("x", "y"))
        ));
    }

    #[test]
    fn fills_every_target_but_the_source_namespace() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        w.source("src", "other", &[("copy", "no")], json!({}));
        let p = w.plan(&simple_rule());
        assert_eq!(
            verbs(&p),
            vec![
                ("a".into(), "cm".into(), "create"),
                ("b".into(), "cm".into(), "create")
            ]
        );
        assert_eq!(
            (p.sources, p.target_namespaces, p.desired, p.in_place),
            (1, 2, 2, 0)
        );
    }

    #[test]
    fn a_correct_world_needs_no_writes() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let first = w.plan(&r);
        w.apply(&first);
        let second = w.plan(&r);
        assert!(second.actions.is_empty(), "{:?}", second.actions);
        assert_eq!(second.in_place, 2);
    }

    #[test]
    fn source_change_updates_and_edits_are_reverted() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        // Someone adds a key to the copy.
        let mut edited = (**w.copies.get("a", "cm").unwrap()).clone();
        edited
            .payload
            .insert("data".into(), json!({"k": "v", "extra": "x"}));
        edited.resource_version = "101".into();
        edited.rehash();
        w.copies.upsert(Arc::new(edited));
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("a".into(), "cm".into(), "update")]
        );
        // The source changes.
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v2"}));
        let p = w.plan(&r);
        let Action::Update { desired, .. } = &p.actions[0] else {
            panic!("{p:?}")
        };
        assert_eq!(desired.payload["data"], json!({"k": "v2"}));
    }

    /// The copy in `a` as the cache holds it, changed by `edit` and then
    /// owned by Copyrator only where `ours` says.
    fn edited_copy(
        w: &mut World,
        edit: impl FnOnce(&mut Object),
        ours: impl Fn(MetaMap, &str) -> bool,
    ) {
        let mut copy = (**w.copies.get("a", "cm").unwrap()).clone();
        edit(&mut copy);
        copy.rehash();
        copy.set_owned(ours);
        let version: u64 = copy.resource_version.parse().unwrap_or(100);
        copy.resource_version = (version + 1).to_string();
        w.copies.upsert(Arc::new(copy));
    }

    #[test]
    fn protected_namespaces_are_reached_only_by_their_exact_name() {
        let mut w = World::new(&["src", "a", "kube-system", "kube-public", "kube-node-lease"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        // No targets: every namespace but the protected ones (and the
        // operator's own, "src" here, which is the source namespace anyway).
        let p = w.plan(&simple_rule());
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "create")]);
        assert_eq!(p.protected_namespaces, 3);
        // A glob does not reach them either.
        let r = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"targets": {"include": ["kube-*", "a"]}}}));
        let p = w.plan(&r);
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "create")]);
        assert_eq!(p.protected_namespaces, 3);
        // The exact name does.
        let r = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"targets": {"include": ["kube-public", "a"]}}}));
        let p = w.plan(&r);
        assert_eq!(
            verbs(&p),
            vec![
                ("a".into(), "cm".into(), "create"),
                ("kube-public".into(), "cm".into(), "create")
            ]
        );
        assert_eq!(p.protected_namespaces, 0);
    }

    /// The tenant rule `team-a/r` with `adopt: true`.
    fn adopting_tenant_rule() -> ResolvedRule {
        let mut value = json!({"ruleType": "configmap", "selector": {"copy": "yes"},
                               "spec": {"adopt": true}});
        value["metadata"] = json!({"name": "r", "namespace": "team-a", "uid": "rule-1"});
        let r: CopyratorRule = serde_json::from_value(value).unwrap();
        let tenant = r.resolve(&Trust::new("ops", true)).unwrap();
        assert!(tenant.tenant && tenant.adopt);
        tenant
    }

    /// `victim` accepts team-a's copies, lets `adopt_from` adopt, and holds
    /// an object `pin` it made itself, holding `held`, labelled `labels`;
    /// team-a's source `pin` holds 4821.
    fn victim_world(adopt_from: Option<&str>, held: &str, labels: &[(&str, &str)]) -> World {
        let mut w = World::new(&["team-a", "victim"]);
        let victim = w.namespaces.get_mut("victim").unwrap();
        victim.accept_from = NamespaceInfo::accept_from(Some("team-a"));
        victim.adopt_from = NamespaceInfo::accept_from(adopt_from);
        w.source("team-a", "pin", &[("copy", "yes")], json!({"pin": "4821"}));
        let mut found = crate::cache::index::tests::object("victim", "pin", "v-1", 3, labels);
        found.payload.insert("data".into(), json!({"pin": held}));
        found.rehash();
        found.authored = false;
        found.rule_uid = None;
        found.set_owned(|_, _| false);
        w.copies.upsert(Arc::new(found));
        w
    }

    /// A tenant rule adopts an object it did not make only where the
    /// namespace lets its namespace adopt, or where another tool's mark
    /// says the object came from the rule's namespace; elsewhere, equal
    /// content or not, the object is the same conflict (its status tells
    /// nothing of the content).
    #[test]
    fn a_tenant_rule_adopts_only_where_let_and_its_status_tells_no_content() {
        let tenant = adopting_tenant_rule();
        // Not let: the right guess and a wrong one look the same.
        let plans: Vec<Plan> = ["4821", "0000"]
            .into_iter()
            .map(|held| victim_world(None, held, &[("team", "victim")]).plan(&tenant))
            .collect();
        for plan in &plans {
            assert!(plan.actions.is_empty(), "{:?}", verbs(plan));
            assert_eq!(plan.conflicts.len(), 1);
        }
        assert_eq!(plans[0].conflicts, plans[1].conflicts);
        assert_eq!(
            (plans[0].in_place, plans[0].desired),
            (plans[1].in_place, plans[1].desired)
        );
        // Another tool's mark saying it came from the rule's namespace.
        let from_own = [("generate.kyverno.io/source-namespace", "team-a")];
        let p = victim_world(None, "4821", &from_own).plan(&tenant);
        assert_eq!(verbs(&p), [("victim".into(), "pin".into(), "adopt")]);
        let from_else = [("generate.kyverno.io/source-namespace", "team-z")];
        assert!(
            victim_world(None, "4821", &from_else)
                .plan(&tenant)
                .actions
                .is_empty()
        );
        // Let by the namespace.
        let p = victim_world(Some("team-a"), "4821", &[]).plan(&tenant);
        assert_eq!(verbs(&p), [("victim".into(), "pin".into(), "adopt")]);
    }

    /// What a tenant rule adopted, no longer wanted, is handed over, not
    /// deleted, unless the namespace let the rule's namespace adopt; an
    /// admin rule's deletion policy stands.
    #[test]
    fn what_a_tenant_rule_adopted_is_deleted_only_where_it_was_let_adopt() {
        let mut adopted = crate::cache::index::tests::object(
            "victim",
            "pin",
            "v-1",
            4,
            &[(LABEL_RULE_UID, "rule-1")],
        );
        adopted
            .annotations
            .insert(crate::ANNOTATION_ADOPTED_FROM.into(), "Kyverno".into());
        adopted.rehash();
        let mut copies = CopyIndex::default();
        copies.upsert(Arc::new(adopted.clone()));
        for (adopt_from, disposal) in [(None, Disposal::Orphan), (Some("team-a"), Disposal::Delete)]
        {
            let w = victim_world(adopt_from, "0000", &[]);
            assert_eq!(
                disposal_of(&adopted, Disposal::Delete, Some("team-a"), &w.namespaces),
                disposal
            );
            assert_eq!(
                disposal_of(&adopted, Disposal::Delete, None, &w.namespaces),
                Disposal::Delete,
                "an admin rule's deletion policy stands"
            );
            let why = DeleteReason::RuleDeleted;
            let cleared = cleanup(
                "rule-1",
                why,
                Disposal::Delete,
                Some("team-a"),
                &w.namespaces,
                &copies,
            );
            let verb = if disposal == Disposal::Orphan {
                "orphan"
            } else {
                "delete"
            };
            assert_eq!(cleared.iter().map(Action::verb).collect::<Vec<_>>(), [verb]);
        }
    }

    #[test]
    fn a_tenant_rule_writes_only_where_its_namespace_is_accepted() {
        let mut w = World::new(&["team-a", "open", "closed", "globbed"]);
        w.namespaces.get_mut("open").unwrap().accept_from =
            NamespaceInfo::accept_from(Some("team-b, team-a"));
        w.namespaces.get_mut("globbed").unwrap().accept_from =
            NamespaceInfo::accept_from(Some("team-*"));
        w.source("team-a", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let mut value = json!({"ruleType": "configmap", "selector": {"copy": "yes"}});
        value["metadata"] = json!({"name": "r", "namespace": "team-a", "uid": "rule-1"});
        let r: CopyratorRule = serde_json::from_value(value.clone()).unwrap();
        let tenant = r.resolve(&Trust::new("ops", true)).unwrap();
        assert!(tenant.tenant);
        let p = w.plan(&tenant);
        assert_eq!(
            verbs(&p),
            vec![
                ("globbed".into(), "cm".into(), "create"),
                ("open".into(), "cm".into(), "create")
            ]
        );
        assert_eq!(p.not_accepting_namespaces, 1);
        // The same rule in the operator's own namespace needs no consent.
        let own = r.resolve(&Trust::new("team-a", true)).unwrap();
        assert!(!own.tenant);
        assert_eq!(w.plan(&own).actions.len(), 3);
        // A tenant rule may not overwrite.
        value["spec"] = json!({"conflictPolicy": "Overwrite"});
        let r: CopyratorRule = serde_json::from_value(value).unwrap();
        let refused = r.resolve(&Trust::new("ops", true)).unwrap_err();
        assert_eq!(refused.reason, "Forbidden");
    }

    /// Under --consent-by-rights, a tenant rule that acts as a
    /// ServiceAccount writes where the account may create the kind (as
    /// asked before the pass) or the namespace accepts it, and copies a
    /// source elsewhere without its allow-to (the account's `get` of it is
    /// asked before the pass too). Acting as the operator, it takes the
    /// annotations whatever the setting.
    #[test]
    fn a_rule_whose_consent_is_its_rights_writes_where_they_reach() {
        let mut w = World::new(&["team-a", "shared", "granted", "open", "other"]);
        w.namespaces.get_mut("open").unwrap().accept_from =
            NamespaceInfo::accept_from(Some("team-a"));
        w.source("shared", "cm", &[("copy", "yes")], json!({"k": "v"}));
        w.source("team-a", "own", &[("copy", "yes")], json!({"k": "v"}));
        let mut value = json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "namespace": ["shared", "team-a"], "spec": {"targets": {"include": ["*"]}}});
        value["metadata"] = json!({"name": "r", "namespace": "team-a", "uid": "rule-1"});
        let r: CopyratorRule = serde_json::from_value(value).unwrap();
        let mut trust = Trust::new("ops", true);
        trust.consent_annotations = false;
        trust.tenant_identity = crate::core::identity::TenantIdentity::ServiceAccount;
        let mut by_rights = r.resolve(&trust).unwrap();
        assert!(by_rights.consent_by_rights);
        assert_eq!(
            targets_to_ask(&by_rights, &w.namespaces),
            ["granted", "other"],
            "neither its own, the source's nor the accepting namespace is asked"
        );
        by_rights.granted_targets = Some(Arc::new(["granted".to_owned()].into()));
        let p = w.plan(&by_rights);
        // What it pulls lands in its own namespace alone, as ever.
        assert_eq!(
            verbs(&p),
            vec![
                ("granted".into(), "own".into(), "create"),
                ("open".into(), "own".into(), "create"),
                ("team-a".into(), "cm".into(), "create")
            ]
        );
        // Acting as the operator, the setting changes nothing.
        trust.tenant_identity = crate::core::identity::TenantIdentity::Operator;
        let as_operator = r.resolve(&trust).unwrap();
        assert!(!as_operator.consent_by_rights);
        assert!(targets_to_ask(&as_operator, &w.namespaces).is_empty());
        assert_eq!(
            verbs(&w.plan(&as_operator)),
            vec![("open".into(), "own".into(), "create")],
            "only where accepted, and the shared source does not allow it"
        );
    }

    /// In a member cluster, a namespace named as a tenant rule's own is
    /// someone else's: what the tenant pulls lands there only where that
    /// namespace accepts the tenant's, as everywhere else.
    #[test]
    fn in_a_member_a_tenants_namespace_name_is_not_its_own() {
        let mut w = World::new(&["team-a", "shared"]);
        let mut value = json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "namespace": ["shared"], "spec": {"targets": {"include": ["*"]}}});
        value["metadata"] = json!({"name": "r", "namespace": "team-a", "uid": "rule-1"});
        let r: CopyratorRule = serde_json::from_value(value).unwrap();
        let at_home = r.resolve(&Trust::new("ops", true)).unwrap();
        let mut source =
            crate::cache::index::tests::object("shared", "ca", "uid-ca", 1, &[("copy", "yes")]);
        source
            .annotations
            .insert(ANNOTATION_ALLOW_TO.into(), "team-a".into());
        source.payload.insert("data".into(), json!({"ca.crt": "x"}));
        source.rehash();
        w.sources.push(Arc::new(source));
        assert_eq!(
            verbs(&w.plan(&at_home)),
            vec![("team-a".into(), "ca".into(), "create")]
        );
        let in_member = ResolvedRule {
            in_own_cluster: false,
            ..at_home
        };
        assert!(w.plan(&in_member).actions.is_empty(), "no consent there");
        w.namespaces.get_mut("team-a").unwrap().accept_from =
            NamespaceInfo::accept_from(Some("team-a"));
        assert_eq!(
            verbs(&w.plan(&in_member)),
            vec![("team-a".into(), "ca".into(), "create")]
        );
    }

    /// A tenant rule pulls a source of another namespace into its own
    /// namespace alone, and only while the source allows it.
    #[test]
    fn a_tenant_rule_pulls_only_consenting_sources_into_its_own_namespace() {
        let mut w = World::new(&["team-a", "shared", "team-b", "open"]);
        w.namespaces.get_mut("open").unwrap().accept_from =
            NamespaceInfo::accept_from(Some("team-a"));
        let mut value = json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "namespace": ["team-a", "shared"], "spec": {"targets": {"include": ["*"]}}});
        value["metadata"] = json!({"name": "r", "namespace": "team-a", "uid": "rule-1"});
        let r: CopyratorRule = serde_json::from_value(value).unwrap();
        let tenant = r.resolve(&Trust::new("ops", true)).unwrap();
        let allow = |to: &str| {
            let mut o =
                crate::cache::index::tests::object("shared", "ca", "uid-ca", 1, &[("copy", "yes")]);
            o.annotations.insert(ANNOTATION_ALLOW_TO.into(), to.into());
            o.payload.insert("data".into(), json!({"ca.crt": "x"}));
            o.rehash();
            Arc::new(o)
        };
        // Without consent: the source does not count, nothing is pulled.
        w.source("shared", "ca", &[("copy", "yes")], json!({"ca.crt": "x"}));
        w.source("team-a", "own", &[("copy", "yes")], json!({"k": "v"}));
        let p = w.plan(&tenant);
        assert_eq!(p.sources, 1, "only the rule's own source");
        assert_eq!(verbs(&p), vec![("open".into(), "own".into(), "create")]);
        // With consent for another namespace only: still nothing.
        w.sources.retain(|s| &*s.name != "ca");
        w.sources.push(allow("team-b, team-c"));
        assert_eq!(w.plan(&tenant).sources, 1);
        // With consent (a glob): into the rule's own namespace, nowhere else,
        // though `open` accepts the rule's copies.
        w.sources.retain(|s| &*s.name != "ca");
        w.sources.push(allow("team-*"));
        let p = w.plan(&tenant);
        assert_eq!(p.sources, 2);
        assert_eq!(
            verbs(&p),
            vec![
                ("open".into(), "own".into(), "create"),
                ("team-a".into(), "ca".into(), "create")
            ]
        );
        assert_eq!(p.places, 2, "the counts agree with the places");
        w.apply(&p);
        assert!(w.plan(&tenant).actions.is_empty(), "converged");
        // Consent withdrawn: the pulled copy is pruned.
        w.sources.retain(|s| &*s.name != "ca");
        w.sources.push(allow("team-b"));
        assert_eq!(
            verbs(&w.plan(&tenant)),
            vec![("team-a".into(), "ca".into(), "delete")]
        );
        // The same rule in the operator's namespace needs no consent.
        let admin = CopyratorRule::resolve(
            &serde_json::from_value(json!({"metadata": {"name": "r", "namespace": "team-a", "uid": "rule-1"},
                "ruleType": "configmap", "selector": {"copy": "yes"}, "namespace": ["team-a", "shared"]}))
            .unwrap(),
            &Trust::new("team-a", true),
        )
        .unwrap();
        assert!(!admin.tenant);
        assert_eq!(w.plan(&admin).sources, 2);
    }

    /// A tenant rule learns nothing of another namespace's objects that do
    /// not consent: not even the names of those of a type never copied.
    #[test]
    fn a_tenant_rule_names_no_object_of_a_namespace_without_its_consent() {
        let mut w = World::new(&["team-a", "kube-system"]);
        let mut token =
            crate::cache::index::tests::object("kube-system", "token", "uid-t", 1, &[("a", "b")]);
        token
            .payload
            .insert("type".into(), json!("kubernetes.io/service-account-token"));
        token.rehash();
        w.sources.push(Arc::new(token));
        let r: CopyratorRule = serde_json::from_value(json!({
            "metadata": {"name": "r", "namespace": "team-a", "uid": "rule-1"},
            "ruleType": "secret", "selector": {"a": "b"}, "namespace": "kube-system"}))
        .unwrap();
        let tenant = r.resolve(&Trust::new("ops", true)).unwrap();
        let p = w.plan(&tenant);
        assert!(p.refused_sources.is_empty(), "{:?}", p.refused_sources);
        assert_eq!(p.sources, 0);
        // The operator's own rule is told why the token is not copied.
        let admin = r.resolve(&Trust::new("team-a", true)).unwrap();
        assert_eq!(w.plan(&admin).refused_sources.len(), 1);
    }

    /// A create that meets an object of this rule takes it as written only
    /// when it is right; a stale one (the cache was behind) is updated.
    #[test]
    fn a_create_that_finds_its_own_stale_copy_updates_it() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "old"}));
        let r = simple_rule();
        let first = w.plan(&r);
        w.apply(&first);
        let stale = w.copies.get("a", "cm").unwrap().clone();
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "new"}));
        let Some(Action::Update { desired, .. }) = w.plan(&r).actions.first().cloned() else {
            panic!("an update of a/cm")
        };
        assert_eq!(
            occupied(&desired, &stale, ConflictPolicy::Skip, "src/r"),
            Occupied::Update
        );
        let fresh = w.plan(&r);
        w.apply(&fresh);
        let right = w.copies.get("a", "cm").unwrap().clone();
        assert_eq!(
            occupied(&desired, &right, ConflictPolicy::Skip, "src/r"),
            Occupied::Ours
        );
    }

    #[test]
    fn the_namespaces_left_out_are_those_the_counts_count() {
        let mut w = World::new(&["src", "a", "kube-system", "kube-public", "closed", "open"]);
        w.namespaces.get_mut("open").unwrap().accept_from = NamespaceInfo::accept_from(Some("src"));
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        // The source namespace is the operator's own (protected), and
        // receives nothing of itself anyway: no mention.
        assert_eq!(
            left_out_namespaces(&r, &w.namespaces),
            [
                ("kube-public", Exclusion::Protected),
                ("kube-system", Exclusion::Protected)
            ]
        );
        assert_eq!(p.protected_namespaces, 2);
        let mut value = json!({"ruleType": "configmap", "selector": {"copy": "yes"}});
        value["metadata"] = json!({"name": "r", "namespace": "src", "uid": "rule-1"});
        let rule: CopyratorRule = serde_json::from_value(value).unwrap();
        let tenant = rule.resolve(&Trust::new("ops", true)).unwrap();
        let p = w.plan(&tenant);
        let left_out = left_out_namespaces(&tenant, &w.namespaces);
        assert_eq!(
            left_out,
            [
                ("a", Exclusion::NotAccepting),
                ("closed", Exclusion::NotAccepting),
                ("kube-public", Exclusion::NotAccepting),
                ("kube-system", Exclusion::NotAccepting)
            ]
        );
        assert_eq!(p.not_accepting_namespaces as usize, left_out.len());
        assert_eq!(verbs(&p), vec![("open".into(), "cm".into(), "create")]);
    }

    #[test]
    fn a_create_takes_over_a_foreign_object_only_under_overwrite() {
        let r = simple_rule();
        let mut source =
            crate::cache::index::tests::object("src", "cm", "uid-src", 1, &[("copy", "yes")]);
        source.payload.insert("data".into(), json!({"k": "v"}));
        source.rehash();
        let desired = desired_copy(&r, &source);
        let foreign = crate::cache::index::tests::object("a", "cm", "f", 1, &[]);
        assert_eq!(
            occupied(&desired, &foreign, ConflictPolicy::Skip, "src/r"),
            Occupied::Conflict("a ConfigMap not made by Copyrator is there".into())
        );
        assert_eq!(
            occupied(&desired, &foreign, ConflictPolicy::Overwrite, "src/r"),
            Occupied::Update
        );
        let mut immutable = foreign.clone();
        immutable.payload.insert("immutable".into(), json!(true));
        immutable.rehash();
        assert_eq!(
            occupied(&desired, &immutable, ConflictPolicy::Overwrite, "src/r"),
            Occupied::Recreate
        );

        let copy_of = |uid: &str, rule: &str| {
            let mut copy =
                crate::cache::index::tests::object("a", "cm", "c", 1, &[(LABEL_RULE_UID, uid)]);
            copy.annotations.insert(ANNOTATION_RULE.into(), rule.into());
            copy.rehash();
            copy
        };
        // This rule's own copy, but not as it should be: brought up to date.
        assert_eq!(
            occupied(
                &desired,
                &copy_of("rule-1", "src/r"),
                ConflictPolicy::Skip,
                "src/r"
            ),
            Occupied::Update
        );
        // Another rule's copy is never taken, whatever the policy.
        assert_eq!(
            occupied(
                &desired,
                &copy_of("rule-2", "src/other"),
                ConflictPolicy::Overwrite,
                "src/r"
            ),
            Occupied::Conflict("a copy made by rule src/other is there".into())
        );
        // An earlier rule of this name: its copy is adopted even under Skip.
        assert_eq!(
            occupied(
                &desired,
                &copy_of("rule-0", "src/r"),
                ConflictPolicy::Skip,
                "src/r"
            ),
            Occupied::Update
        );
        // This rule's copy whose rule-UID label someone removed (Copyrator
        // wrote it: `authored`): its label is put back.
        let mut stripped = crate::cache::index::tests::object("a", "cm", "c", 1, &[]);
        stripped
            .annotations
            .insert(ANNOTATION_RULE.into(), "src/r".into());
        stripped.rehash();
        assert_eq!(
            occupied(&desired, &stripped, ConflictPolicy::Skip, "src/r"),
            Occupied::Update
        );
        // Copyrator's labels and annotation on an object Copyrator did not
        // write: a foreign object, however it is labelled.
        let mut forged = copy_of("rule-1", "src/r");
        forged.authored = false;
        forged.rule_uid = None;
        assert_eq!(
            occupied(&desired, &forged, ConflictPolicy::Skip, "src/r"),
            Occupied::Conflict(
                "a ConfigMap not made by Copyrator is there (its Copyrator labels were set by another writer)"
                    .into()
            )
        );
        assert_eq!(
            occupied(&desired, &forged, ConflictPolicy::Overwrite, "src/r"),
            Occupied::Update
        );
    }

    /// An object carrying this rule's labels that Copyrator did not write
    /// is no copy: a conflict where a copy belongs, never pruned.
    #[test]
    fn a_forged_copy_is_neither_counted_nor_pruned() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let forged = |name: &str| {
            let mut o = crate::cache::index::tests::object(
                "a",
                name,
                "f",
                1,
                &[(LABEL_RULE_UID, r.uid.as_str())],
            );
            o.annotations
                .insert(ANNOTATION_RULE.into(), r.key.to_string());
            o.rehash();
            o.authored = false;
            o.rule_uid = None;
            Arc::new(o)
        };
        w.copies.upsert(forged("cm"));
        w.copies.upsert(forged("gone-source"));
        let p = w.plan(&r);
        assert_eq!(verbs(&p), vec![("b".into(), "cm".into(), "create")]);
        assert_eq!(p.conflicts.len(), 1, "{:?}", p.conflicts);
        assert_eq!(p.conflicts[0].namespace, "a");
        assert!(p.conflicts[0].reason.contains("not made by Copyrator"));
        assert_eq!(p.in_place, 0, "the forged object is not counted");
    }

    /// An object under Copyrator's field manager and labels but without
    /// its mark (a copy from before marks, or a forgery): taken back by
    /// one write where it holds what the rule writes there, a conflict
    /// where it holds anything else, never pruned.
    #[test]
    fn an_unmarked_copy_is_taken_back_only_where_it_holds_the_sources_content() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let unmarked = |namespace: &str, name: &str, value: &str| {
            let mut o = crate::cache::index::tests::object(
                namespace,
                name,
                "u",
                1,
                &[(LABEL_RULE_UID, r.uid.as_str())],
            );
            o.annotations
                .insert(ANNOTATION_RULE.into(), r.key.to_string());
            o.payload = BTreeMap::from([("data".to_owned(), json!({"k": value}))]);
            o.rehash();
            o.authored = false;
            o.unproven = true;
            o.rule_uid = None;
            Arc::new(o)
        };
        w.copies.upsert(unmarked("a", "cm", "v"));
        w.copies.upsert(unmarked("b", "cm", "EVIL"));
        w.copies.upsert(unmarked("a", "gone-source", "v"));
        let p = w.plan(&r);
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "update")]);
        assert_eq!(p.conflicts.len(), 1, "{:?}", p.conflicts);
        assert_eq!(p.conflicts[0].namespace, "b");
        assert!(
            p.conflicts[0].reason.contains("not its mark"),
            "{}",
            p.conflicts[0].reason
        );
        let desired = match &p.actions[0] {
            Action::Update { desired, .. } => desired.clone(),
            other => panic!("an update: {other:?}"),
        };
        let held = w.copies.get("a", "cm").expect("the unmarked copy");
        assert_eq!(
            occupied(&desired, held, ConflictPolicy::Skip, &r.key.to_string()),
            Occupied::Update,
            "a create that meets it takes it back too"
        );
    }

    #[test]
    fn only_listed_secret_types_are_copied_and_the_others_are_reported() {
        let mut w = World::new(&["src", "a"]);
        let r = rule(json!({"ruleType": "secret", "selector": {"copy": "yes"}}));
        for (name, t) in [
            ("opaque", "Opaque"),
            ("tls", "kubernetes.io/tls"),
            ("bootstrap", "bootstrap.kubernetes.io/token"),
            ("custom", "example.com/custom"),
        ] {
            w.source("src", name, &[("copy", "yes")], json!({"k": "dg=="}));
            let last = w.sources.len() - 1;
            let mut o = (*w.sources[last]).clone();
            o.payload.insert("type".into(), json!(t));
            o.rehash();
            w.sources[last] = Arc::new(o);
        }
        let p = w.plan(&r);
        let written: Vec<String> = p.actions.iter().map(|a| a.target().1.to_owned()).collect();
        assert_eq!(written, vec!["opaque", "tls"]);
        let refused: Vec<&str> = p.refused_sources.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(refused, vec!["src/bootstrap", "src/custom"]);
        assert!(
            p.refused_sources[0].1.contains("--secret-types"),
            "{:?}",
            p.refused_sources
        );
        // A setting adds a type; service-account tokens stay refused whatever it says.
        let mut with_custom = r.clone();
        with_custom.policy = Arc::new(
            crate::core::resolve::CopyPolicy::new("src", &[], &[], &["example.com/custom".into()])
                .unwrap(),
        );
        let p = w.plan(&with_custom);
        assert_eq!(p.actions.len(), 3);
        assert!(
            crate::core::resolve::CopyPolicy::new(
                "src",
                &[],
                &[],
                &["kubernetes.io/service-account-token".into()]
            )
            .is_err()
        );
    }

    #[test]
    fn tracking_keys_of_other_tools_and_configured_keys_never_travel() {
        let mut w = World::new(&["src", "a"]);
        let mut r = simple_rule();
        r.policy = Arc::new(
            crate::core::resolve::CopyPolicy::new("src", &[], &["example.com/*".into()], &[])
                .unwrap(),
        );
        let source = w.source(
            "src",
            "cm",
            &[
                ("copy", "yes"),
                ("kapp.k14s.io/app", "1"),
                ("kustomize.toolkit.fluxcd.io/name", "x"),
                ("helm.toolkit.fluxcd.io/name", "x"),
                ("objectset.rio.cattle.io/hash", "x"),
                ("config.kubernetes.io/origin", "x"),
                ("example.com/owner", "x"),
                ("team", "a"),
            ],
            json!({"k": "v"}),
        );
        let desired = desired_copy(&r, &source);
        let carried: Vec<&str> = desired
            .labels
            .keys()
            .map(String::as_str)
            .filter(|k| !k.starts_with("copyrator.flant.com/") && *k != LABEL_MANAGED_BY)
            .collect();
        assert_eq!(carried, vec!["copy", "team"]);
        let _ = &mut w;
    }

    /// What says what the object is travels; what says who owns or
    /// tracks it does not: an Argo CD repository Secret's copy is one too.
    #[test]
    fn what_an_object_is_travels_and_who_tracks_it_does_not() {
        let mut w = World::new(&["src", "a"]);
        let r = simple_rule();
        let mut source = w.source(
            "src",
            "repo",
            &[
                ("copy", "yes"),
                ("argocd.argoproj.io/secret-type", "repository"),
                ("argocd.argoproj.io/instance", "platform"),
                ("app.kubernetes.io/instance", "platform"),
                ("helm.sh/chart", "repos-1.0.0"),
            ],
            json!({"url": "https://git.example.com/repo.git"}),
        );
        for (key, value) in [
            (
                "argocd.argoproj.io/tracking-id",
                "platform:/Secret:src/repo",
            ),
            ("argocd.argoproj.io/sync-wave", "1"),
            ("meta.helm.sh/release-name", "repos"),
            ("helm.sh/resource-policy", "keep"),
            ("managed-by-team", "platform"),
        ] {
            source.annotations.insert(key.into(), value.into());
        }
        source.rehash();
        let desired = desired_copy(&r, &source);
        let labels: Vec<&str> = desired
            .labels
            .keys()
            .map(String::as_str)
            .filter(|k| !k.starts_with("copyrator.flant.com/") && *k != LABEL_MANAGED_BY)
            .collect();
        assert_eq!(labels, vec!["argocd.argoproj.io/secret-type", "copy"]);
        let annotations: Vec<&str> = desired
            .annotations
            .keys()
            .map(String::as_str)
            .filter(|k| !k.starts_with("copyrator.flant.com/"))
            .collect();
        assert_eq!(annotations, vec!["managed-by-team"]);
    }

    /// docs/rules.md gives each default key with its reason.
    #[test]
    fn every_stripped_key_is_documented_with_its_reason() {
        let page = include_str!("../../docs/rules.md");
        for (key, reason) in TRACKING_KEYS {
            assert!(
                page.contains(&format!("| `{key}` | {reason} |")),
                "docs/rules.md has no row for {key} with its reason"
            );
        }
    }

    #[test]
    fn nothing_is_pruned_in_a_namespace_the_cache_has_not_seen() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        // A copy of ours in a namespace the namespace watch has not delivered yet.
        let mut elsewhere = (**w.copies.get("a", "cm").unwrap()).clone();
        elsewhere.namespace = "new".into();
        elsewhere.uid = "copy-new".into();
        w.copies.upsert(Arc::new(elsewhere));
        assert!(w.plan(&r).actions.is_empty(), "{:?}", w.plan(&r).actions);
        // Once seen, it is judged like any other: a target, so it stays right.
        w.namespaces.insert("new".into(), NamespaceInfo::default());
        assert!(w.plan(&r).actions.is_empty());
    }

    #[test]
    fn copies_of_a_rule_gone_without_its_finalizer_are_orphans() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        let rule_ref = r.key.to_string();
        // The rule is live: nothing is an orphan.
        let live = |uid: &str| uid == "rule-1";
        let mine = |rule: &str| rule == rule_ref;
        assert!(orphans(&w.copies, &w.namespaces, &live, &mine).is_empty());
        // The rule is gone: both copies are.
        let gone = |_: &str| false;
        let found = orphans(&w.copies, &w.namespaces, &gone, &mine);
        assert_eq!(
            found.iter().map(|a| a.target().0).collect::<Vec<_>>(),
            vec!["a", "b"]
        );
        // Another operator's rule (or one of the same name that adopts them): none.
        let not_mine = |_: &str| false;
        assert!(orphans(&w.copies, &w.namespaces, &gone, &not_mine).is_empty());
        // A terminating namespace takes its copies along by itself.
        w.namespaces.get_mut("a").unwrap().terminating = true;
        assert_eq!(orphans(&w.copies, &w.namespaces, &gone, &mine).len(), 1);
    }

    #[test]
    fn keys_others_add_cause_no_write_and_are_kept() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        edited_copy(
            &mut w,
            |c| {
                c.labels.insert("cost-center".into(), "42".into());
                c.annotations.insert("policy/checked".into(), "yes".into());
            },
            |_, key| key != "cost-center" && key != "policy/checked",
        );
        assert!(w.plan(&r).actions.is_empty(), "no write for others' keys");
        let held = w.copies.get("a", "cm").unwrap();
        assert_eq!(
            held.labels.get("cost-center").map(String::as_str),
            Some("42")
        );
    }

    #[test]
    fn a_key_of_ours_changed_or_removed_by_others_is_restored() {
        let mut w = World::new(&["src", "a"]);
        w.source(
            "src",
            "cm",
            &[("copy", "yes"), ("app", "web")],
            json!({"k": "v"}),
        );
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        // Another writer sets our label to another value: it owns it now.
        edited_copy(
            &mut w,
            |c| {
                c.labels.insert("app".into(), "db".into());
            },
            |_, key| key != "app",
        );
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("a".into(), "cm".into(), "update")]
        );
        // Another writer takes our label over with the same value: still right.
        let p = w.plan(&r);
        w.apply(&p);
        edited_copy(&mut w, |_| {}, |_, key| key != "app");
        assert!(w.plan(&r).actions.is_empty());
        // Our managed-by label removed.
        let p = w.plan(&r);
        w.apply(&p);
        edited_copy(
            &mut w,
            |c| {
                c.labels.remove(LABEL_MANAGED_BY);
            },
            |_, _| true,
        );
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("a".into(), "cm".into(), "update")]
        );
    }

    #[test]
    fn a_label_removed_from_the_source_is_removed_from_its_copies() {
        let mut w = World::new(&["src", "a"]);
        w.source(
            "src",
            "cm",
            &[("copy", "yes"), ("tier", "1")],
            json!({"k": "v"}),
        );
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let p = w.plan(&r);
        let Action::Update { desired, current } = &p.actions[0] else {
            panic!("{p:?}")
        };
        assert!(!desired.labels.contains_key("tier"));
        assert!(
            !desired.is_changed_back(current),
            "a source change is no restore"
        );
    }

    #[test]
    fn a_data_key_others_add_is_put_back() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        edited_copy(
            &mut w,
            |c| {
                c.payload
                    .insert("data".into(), json!({"k": "v", "extra": "x"}));
            },
            |_, _| true,
        );
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("a".into(), "cm".into(), "update")]
        );
    }

    #[test]
    fn our_write_as_a_webhook_changed_it_is_right_but_a_later_change_back_is_a_restore() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        let desired = match &p.actions[0] {
            Action::Create { desired, .. } => desired.clone(),
            other => panic!("{other:?}"),
        };
        w.apply(&p);
        // The answer to our write carries a label a webhook added (attributed to us).
        let mut answer = (**w.copies.get("a", "cm").unwrap()).clone();
        answer.labels.insert("injected".into(), "1".into());
        answer.rehash();
        assert!(!desired.is_satisfied_by(&answer), "a leftover key of ours");
        assert!(desired.matches(&answer, false));
        answer.written_for = Some(desired.content_hash);
        answer.settled = true;
        w.copies.upsert(Arc::new(answer.clone().into_compact()));
        assert!(w.plan(&r).actions.is_empty(), "no fight with the webhook");
        // Someone changes the data back later: a restore of what we wrote.
        answer.payload.insert("data".into(), json!({"k": "other"}));
        answer.rehash();
        answer.settled = false;
        answer.resource_version = "102".into();
        w.copies.upsert(Arc::new(answer.into_compact()));
        let p = w.plan(&r);
        let Action::Update { desired, current } = &p.actions[0] else {
            panic!("{p:?}")
        };
        assert!(desired.is_changed_back(current));
    }

    #[test]
    fn unmatched_and_deleted_sources_are_pruned_only_with_prune() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        w.sources.clear();
        w.source("src", "cm", &[("copy", "no")], json!({"k": "v"}));
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("a".into(), "cm".into(), "delete")]
        );
        let keep = rule(
            json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": {"prune": false}}),
        );
        let mut w2 = World::new(&["src", "a"]);
        w2.source("src", "cm", &[("copy", "yes")], json!({}));
        let mut keep_uid = keep.clone();
        keep_uid.uid = "rule-1".into();
        let p = w2.plan(&keep_uid);
        w2.apply(&p);
        w2.sources.clear();
        assert!(w2.plan(&keep_uid).actions.is_empty());
    }

    /// `(namespace, verb, reason)` of each action that takes a copy away.
    fn disposals(plan: &Plan) -> Vec<(String, &'static str, DeleteReason)> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { current, reason } | Action::HandOver { current, reason } => {
                    Some((current.namespace.to_string(), a.verb(), *reason))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_deletion_policy_deletes_or_orphans_by_why_a_copy_no_longer_belongs() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let orphan_left = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"deletionPolicy": {"targetLeft": "Orphan"}}}));
        let p = w.plan(&orphan_left);
        w.apply(&p);
        // b leaves the targets: its copy is orphaned, not deleted.
        let mut narrowed = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"targets": {"exclude": ["b"]}, "deletionPolicy": {"targetLeft": "Orphan"}}}));
        narrowed.uid = orphan_left.uid.clone();
        let p = w.plan(&narrowed);
        assert_eq!(
            disposals(&p),
            vec![("b".into(), "orphan", DeleteReason::TargetLeft)]
        );
        w.apply(&p);
        assert!(w.copies.get("b", "cm").unwrap().create_only);
        assert!(w.plan(&narrowed).actions.is_empty(), "never written again");
        // The source stops matching: sourceGone is Delete (the default).
        w.sources.clear();
        w.source("src", "cm", &[("copy", "no")], json!({"k": "v"}));
        assert_eq!(
            disposals(&w.plan(&narrowed)),
            vec![("a".into(), "delete", DeleteReason::SourceGone)]
        );
        // Under sourceGone: Orphan it is handed over instead.
        let mut orphan_gone = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"deletionPolicy": {"sourceGone": "Orphan"}}}));
        orphan_gone.uid = orphan_left.uid.clone();
        assert_eq!(
            disposals(&w.plan(&orphan_gone)),
            vec![("a".into(), "orphan", DeleteReason::SourceGone)]
        );
    }

    #[test]
    fn a_rule_deleted_under_orphan_hands_its_copies_over_even_without_its_finalizer() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let keep = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"deletionPolicy": {"ruleDeleted": "Orphan"}}}));
        let p = w.plan(&keep);
        let Action::Create { desired, .. } = &p.actions[0] else {
            panic!("{p:?}")
        };
        assert_eq!(desired.labels[LABEL_ON_RULE_DELETED], ORPHAN);
        w.apply(&p);
        assert!(w.copies.get("a", "cm").unwrap().orphan_with_rule);
        let by_finalizer = cleanup(
            &keep.uid,
            DeleteReason::RuleDeleted,
            Disposal::Orphan,
            None,
            &w.namespaces,
            &w.copies,
        );
        assert_eq!(
            disposals(&Plan {
                actions: by_finalizer,
                ..Plan::default()
            }),
            vec![("a".into(), "orphan", DeleteReason::RuleDeleted)]
        );
        // Gone without its finalizer: the label says what to do.
        let collected = orphans(&w.copies, &w.namespaces, &|_| false, &|_| true);
        assert_eq!(
            disposals(&Plan {
                actions: collected,
                ..Plan::default()
            }),
            vec![("a".into(), "orphan", DeleteReason::RuleDeleted)]
        );
        // A rule under the default policy marks nothing, and is collected.
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let p = w.plan(&simple_rule());
        w.apply(&p);
        assert!(!w.copies.get("a", "cm").unwrap().orphan_with_rule);
        let collected = orphans(&w.copies, &w.namespaces, &|_| false, &|_| true);
        assert_eq!(collected[0].verb(), "delete");
    }

    /// A later rule of the same name that adopts (`spec.adopt`, what a
    /// rule re-created under GitOps asks for) takes back the copies an
    /// earlier one handed over, where they hold what it would write: one
    /// adoption each, no payload write. One whose content changed since
    /// stays its namespace's; another rule's name adopts nothing.
    #[test]
    fn copies_handed_over_are_taken_back_by_a_later_rule_of_their_name_that_adopts() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let p = w.plan(&create_only_rule());
        w.apply(&p);
        // The namespace b changed its copy since.
        let mut changed = (**w.copies.get("b", "cm").expect("the copy in b")).clone();
        changed
            .payload
            .insert("data".into(), json!({"k": "theirs"}));
        changed.rehash();
        // As the copy watch reports it: no write of Copyrator's.
        changed.written_for = None;
        w.copies.upsert(Arc::new(changed));
        let adopting = json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"adopt": true}});
        let p = w.plan_of_later(adopting.clone());
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "adopt")]);
        assert_eq!(p.conflicts.len(), 1, "{:?}", p.conflicts);
        assert_eq!(p.conflicts[0].namespace, "b");
        // Without adopt, both stay their namespaces'.
        let p = w.plan_of_later(json!({"ruleType": "configmap", "selector": {"copy": "yes"}}));
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        // A rule of another name adopts none of them.
        let mut other = rule(adopting.clone());
        other.key.name = "other".into();
        other.uid = "rule-3".into();
        assert!(
            !may_adopt(
                (&other).into(),
                &desired_copy(&other, &w.sources[0]),
                w.copies.get("a", "cm").expect("the copy"),
                &other.key.to_string()
            ),
            "another rule's hand-over is not taken"
        );
        // The source changed since the hand-over: the copy whose mark
        // proves it unchanged is taken back all the same (the writer's
        // adoption writes no payload: the next pass brings it up to date),
        // the one its namespace changed stays its namespace's.
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v2"}));
        let p = w.plan_of_later(adopting);
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "adopt")]);
        assert_eq!(p.conflicts.len(), 1, "{:?}", p.conflicts);
        assert_eq!(p.conflicts[0].namespace, "b");
    }

    fn create_only_rule() -> ResolvedRule {
        rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"syncPolicy": "CreateOnly"}}))
    }

    #[test]
    fn create_only_creates_missing_copies_and_then_never_writes_them() {
        let mut w = World::new(&["src", "a", "b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = create_only_rule();
        let p = w.plan(&r);
        assert_eq!(
            verbs(&p),
            vec![
                ("a".into(), "cm".into(), "create"),
                ("b".into(), "cm".into(), "create")
            ]
        );
        let Action::Create { desired, .. } = &p.actions[0] else {
            panic!("{p:?}")
        };
        assert_eq!(desired.labels[LABEL_SYNC_POLICY], CREATE_ONLY);
        assert_eq!(desired.labels[LABEL_RULE_UID], "rule-1");
        w.apply(&p);
        assert!(w.copies.get("a", "cm").unwrap().create_only);
        assert_eq!(w.copies.count_create_only("rule-1"), 2);

        // Someone edits a copy: it is theirs now, nothing is put back.
        edited_copy(
            &mut w,
            |c| {
                c.payload.insert("data".into(), json!({"k": "mine"}));
                c.labels.insert("team".into(), "a".into());
            },
            |_, _| true,
        );
        let p = w.plan(&r);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!((p.desired, p.in_place), (2, 2), "counted as copies");
        // The source changes: no update either.
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v2"}));
        let p = w.plan(&r);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        // A copy that is missing is created again, from the source as it is now.
        let gone = w.copies.get("b", "cm").unwrap().clone();
        w.copies.remove(&gone);
        let p = w.plan(&r);
        assert_eq!(verbs(&p), vec![("b".into(), "cm".into(), "create")]);
        let Action::Create { desired, .. } = &p.actions[0] else {
            panic!("{p:?}")
        };
        assert_eq!(desired.payload["data"], json!({"k": "v2"}));
    }

    #[test]
    fn create_only_copies_are_never_pruned_cleaned_up_or_collected() {
        let mut w = World::new(&["src", "team-a", "team-b"]);
        for ns in ["team-a", "team-b"] {
            w.namespaces
                .get_mut(ns)
                .unwrap()
                .labels
                .insert("env".into(), "dev".into());
        }
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        w.source("src", "other", &[("copy", "yes")], json!({"k": "v"}));
        let r = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"syncPolicy": "CreateOnly", "prune": true,
                     "targets": {"namespaceSelector": {"matchLabels": {"env": "dev"}}}}}));
        let p = w.plan(&r);
        assert_eq!(p.actions.len(), 4);
        w.apply(&p);
        // The namespace leaves the targets.
        w.namespaces.get_mut("team-b").unwrap().labels.clear();
        assert!(w.plan(&r).actions.is_empty(), "{:?}", w.plan(&r).actions);
        // One source stops matching, the other is deleted.
        w.sources.clear();
        w.source("src", "cm", &[("copy", "no")], json!({"k": "v"}));
        let p = w.plan(&r);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(w.copies.count_create_only("rule-1"), 4);
        // The rule is deleted: its finalizer leaves them.
        assert!(
            cleanup(
                &r.uid,
                DeleteReason::RuleDeleted,
                Disposal::Delete,
                None,
                &w.namespaces,
                &w.copies
            )
            .is_empty()
        );
        // The rule vanished without its finalizer: no orphans either.
        let gone = |_: &str| false;
        let mine = |rule: &str| rule == "src/r";
        assert!(orphans(&w.copies, &w.namespaces, &gone, &mine).is_empty());
    }

    #[test]
    fn a_copy_handed_over_is_taken_by_no_rule() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let p = w.plan(&create_only_rule());
        w.apply(&p);
        // The same rule switched to Sync: the copy stays its namespace's.
        let sync = simple_rule();
        let p = w.plan(&sync);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(p.conflicts.len(), 1);
        assert!(
            p.conflicts[0].reason.contains("CreateOnly")
                && p.conflicts[0].reason.contains(LABEL_SYNC_POLICY),
            "{}",
            p.conflicts[0].reason
        );
        // A later rule of the same name (the first one deleted) adopts no
        // copy handed over, whatever its policy; Overwrite changes nothing.
        for body in [
            json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": {"conflictPolicy": "Overwrite"}}),
            json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": {"syncPolicy": "CreateOnly"}}),
        ] {
            let p = w.plan_of_later(body);
            assert!(p.actions.is_empty(), "{:?}", p.actions);
            assert_eq!(p.conflicts.len(), 1);
            assert!(
                p.conflicts[0].reason.contains("src/r"),
                "{}",
                p.conflicts[0].reason
            );
        }
        // The label removed: the copy is the rule's again, right as it is,
        // and kept true from then on.
        edited_copy(
            &mut w,
            |c| {
                c.labels.remove(LABEL_SYNC_POLICY);
            },
            |_, _| true,
        );
        let p = w.plan(&sync);
        assert!(p.actions.is_empty() && p.conflicts.is_empty(), "{p:?}");
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v2"}));
        assert_eq!(
            verbs(&w.plan(&sync)),
            vec![("a".into(), "cm".into(), "update")]
        );
    }

    #[test]
    fn switching_to_create_only_hands_the_copies_over_once() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let p = w.plan(&simple_rule());
        w.apply(&p);
        let r = create_only_rule();
        let p = w.plan(&r);
        let Action::Update { desired, .. } = &p.actions[0] else {
            panic!("{p:?}")
        };
        assert_eq!(desired.labels[LABEL_SYNC_POLICY], CREATE_ONLY);
        w.apply(&p);
        assert!(w.plan(&r).actions.is_empty());
        assert!(
            cleanup(
                &r.uid,
                DeleteReason::RuleDeleted,
                Disposal::Delete,
                None,
                &w.namespaces,
                &w.copies
            )
            .is_empty()
        );
    }

    fn keys_rule(kind: &str, keys: Value) -> ResolvedRule {
        rule(json!({"ruleType": kind, "selector": {"copy": "yes"},
            "spec": {"transform": {"keys": keys}}}))
    }

    /// The payload of the one write of `plan`.
    fn written_payload(plan: &Plan) -> BTreeMap<String, Value> {
        match plan.actions.as_slice() {
            [Action::Create { desired, .. } | Action::Update { desired, .. }] => {
                desired.payload.clone()
            }
            other => panic!("one create or update expected: {other:?}"),
        }
    }

    #[test]
    fn copies_carry_the_selected_keys_under_their_new_names() {
        let mut w = World::new(&["src", "a"]);
        let mut source = w.source(
            "src",
            "cm",
            &[("copy", "yes")],
            json!({"ca.crt": "C", "tls.crt": "T", "tls.key": "K", "notes": "N"}),
        );
        source.payload.insert(
            "binaryData".into(),
            json!({"blob.crt": "AAE=", "raw": "AQ=="}),
        );
        source.rehash();
        w.sources = vec![Arc::new(source)];
        let r = keys_rule(
            "configmap",
            json!({"include": ["*.crt", "tls.*"], "exclude": ["tls.key"],
                   "rename": {"ca.crt": "root.pem", "blob.crt": "blob.pem"}}),
        );
        let p = w.plan(&r);
        let payload = written_payload(&p);
        assert_eq!(
            payload["data"],
            json!({"root.pem": "C", "tls.crt": "T"}),
            "exclude wins over include; renamed"
        );
        assert_eq!(payload["binaryData"], json!({"blob.pem": "AAE="}));
        // Written, the copy is right: no second write.
        w.apply(&p);
        assert!(w.plan(&r).actions.is_empty(), "{:?}", w.plan(&r).actions);
        // A key the rule leaves out, added to the copy by someone, is put back out.
        edited_copy(
            &mut w,
            |c| {
                c.payload.insert(
                    "data".into(),
                    json!({"root.pem": "C", "tls.crt": "T", "tls.key": "K"}),
                );
            },
            |_, _| true,
        );
        assert_eq!(
            written_payload(&w.plan(&r))["data"],
            json!({"root.pem": "C", "tls.crt": "T"})
        );
        // Without a key transform the payload travels whole.
        let whole = w.plan(&simple_rule());
        assert_eq!(
            written_payload(&whole)["binaryData"],
            json!({"blob.crt": "AAE=", "raw": "AQ=="})
        );
    }

    #[test]
    fn secret_keys_are_selected_and_renamed_too() {
        let mut w = World::new(&["src", "a"]);
        let mut source = w.source(
            "src",
            "s",
            &[("copy", "yes")],
            json!({"username": "dQ==", "password": "cA==", "host": "aA=="}),
        );
        source.payload.insert("type".into(), json!("Opaque"));
        source.rehash();
        w.sources = vec![Arc::new(source)];
        let r = keys_rule(
            "secret",
            json!({"exclude": ["host", "db-password"], "rename": {"password": "db-password"}}),
        );
        let payload = written_payload(&w.plan(&r));
        assert_eq!(
            payload["data"],
            json!({"username": "dQ==", "db-password": "cA=="})
        );
        assert_eq!(payload["type"], json!("Opaque"), "the type travels");
    }

    #[test]
    fn a_copy_with_no_selected_key_is_made_with_no_data() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = keys_rule("configmap", json!({"include": ["nothing-*"]}));
        let p = w.plan(&r);
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "create")]);
        assert!(written_payload(&p).is_empty(), "{:?}", written_payload(&p));
        w.apply(&p);
        assert!(w.plan(&r).actions.is_empty());
        // The rule changes its selection: the copies follow.
        let wider = keys_rule("configmap", json!({"include": ["k"]}));
        assert_eq!(written_payload(&w.plan(&wider))["data"], json!({"k": "v"}));
    }

    /// Data-key globs are matched within the pass's glob steps, as
    /// stripping is: patterns that backtrack over every long key make the
    /// rule too costly, and its plan holds nothing.
    #[test]
    fn a_rule_whose_key_selection_costs_too_much_plans_nothing() {
        // Each pattern backtracks from every letter of each key (within the
        // schema's caps: 243 characters, one `*`).
        let costly: Vec<String> = (0..2)
            .map(|i| format!("*{}b{i}", "a".repeat(240)))
            .collect();
        let mut w = World::new(&["src", "a"]);
        let key = |i: usize| format!("{}{i:04}", "a".repeat(246));
        let data: serde_json::Map<String, Value> =
            (0..1000).map(|i| (key(i), json!("v"))).collect();
        w.source("src", "cm", &[("copy", "yes")], Value::Object(data));
        for keys in [json!({"include": costly}), json!({"exclude": costly})] {
            let p = w.plan(&keys_rule("configmap", keys.clone()));
            assert!(p.too_costly, "{keys}");
            assert!(p.actions.is_empty(), "{:?}", verbs(&p));
        }
        // The same keys by cheaper patterns are planned.
        let p = w.plan(&keys_rule("configmap", json!({"include": ["k*", "*0001"]})));
        assert!(!p.too_costly);
        assert_eq!(written_payload(&p)["data"], json!({ key(1): "v" }));
    }

    /// The copies a pass needs are computed before the plan, for the
    /// source names its scope may look at: a change of one source computes
    /// that one's copy alone.
    #[test]
    fn a_pass_over_one_source_computes_that_sources_copy_alone() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "one", &[("copy", "yes")], json!({"k": "1"}));
        w.source("src", "two", &[("copy", "yes")], json!({"k": "2"}));
        let r = simple_rule();
        let names = |scope: &Scope| {
            let desired = desired_copies(&r, &w.sources, scope);
            let mut names: Vec<String> = desired.values().map(|d| d.name.clone()).collect();
            names.sort();
            names
        };
        assert_eq!(names(&Scope::everything()), ["one", "two"]);
        let mut one = Scope::default();
        one.add(Touch::Source("one".into()));
        assert_eq!(names(&one), ["one"]);
        let mut copy = Scope::default();
        copy.add(Touch::Copy("a".into(), "two".into()));
        assert_eq!(names(&copy), ["two"]);
        let mut namespace = Scope::default();
        namespace.add(Touch::Namespace("a".into()));
        assert_eq!(names(&namespace), ["one", "two"]);
        // The plan over that scope writes that source's copy alone.
        assert_eq!(
            verbs(&w.plan_within(&r, &one)),
            [("a".into(), "one".into(), "create")]
        );
    }

    #[test]
    fn namespace_leaving_the_targets_loses_its_copies() {
        let mut w = World::new(&["src", "team-a", "team-b"]);
        w.namespaces
            .get_mut("team-a")
            .unwrap()
            .labels
            .insert("env".into(), "dev".into());
        w.namespaces
            .get_mut("team-b")
            .unwrap()
            .labels
            .insert("env".into(), "dev".into());
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"targets": {"namespaceSelector": {"matchLabels": {"env": "dev"}}}}}));
        let p = w.plan(&r);
        assert_eq!(p.actions.len(), 2);
        w.apply(&p);
        w.namespaces.get_mut("team-b").unwrap().labels.clear();
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("team-b".into(), "cm".into(), "delete")]
        );
    }

    #[test]
    fn terminating_namespaces_get_no_writes() {
        let mut w = World::new(&["src", "a", "dying"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let r = simple_rule();
        let p = w.plan(&r);
        w.apply(&p);
        w.namespaces.get_mut("dying").unwrap().terminating = true;
        w.sources.clear();
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v2"}));
        w.source("src", "new", &[("copy", "yes")], json!({}));
        let p = w.plan(&r);
        assert!(
            p.actions.iter().all(|a| a.target().0 != "dying"),
            "{:?}",
            p.actions
        );
        assert_eq!(p.target_namespaces, 1);
        // Not even a deletion when the source goes away.
        w.sources.clear();
        let p = w.plan(&r);
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "delete")]);
        assert!(
            cleanup(
                &r.uid,
                DeleteReason::RuleDeleted,
                Disposal::Delete,
                None,
                &w.namespaces,
                &w.copies
            )
            .iter()
            .all(|a| a.target().0 != "dying")
        );
    }

    #[test]
    fn copies_tokens_and_helm_releases_are_never_sources() {
        let mut w = World::new(&["src", "a"]);
        let r = rule(json!({"ruleType": "secret", "selector": {"copy": "yes"}}));
        let mut token = w.source("src", "tok", &[("copy", "yes")], json!({}));
        token
            .payload
            .insert("type".into(), json!("kubernetes.io/service-account-token"));
        let mut helm = w.source("src", "rel", &[("copy", "yes")], json!({}));
        helm.payload
            .insert("type".into(), json!("helm.sh/release.v1"));
        w.sources = vec![Arc::new(token), Arc::new(helm)];
        w.source(
            "src",
            "copy",
            &[("copy", "yes"), (LABEL_RULE_UID, "other")],
            json!({}),
        );
        let p = w.plan(&r);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(p.sources, 0);
    }

    #[test]
    fn copies_carry_content_but_not_tracking_metadata() {
        let r = rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"},
            "spec": {"transform": {"addLabels": {"team": "x"}, "addAnnotations": {"note": "copied"},
                     "stripLabels": ["private/*"], "stripAnnotations": ["secret-note"]}}}));
        let mut source = crate::cache::index::tests::object(
            "src",
            "cm",
            "u-src",
            1,
            &[
                ("copy", "yes"),
                ("app.kubernetes.io/instance", "argo-app"),
                ("helm.sh/chart", "c-1"),
                ("private/x", "1"),
                ("keep", "me"),
            ],
        );
        for (k, v) in [
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
            ("argocd.argoproj.io/tracking-id", "t"),
            ("meta.helm.sh/release-name", "r"),
            ("secret-note", "n"),
            ("doc", "kept"),
        ] {
            source.annotations.insert(k.into(), v.into());
        }
        source.payload.insert("data".into(), json!({"k": "v"}));
        source.rehash();
        let d = desired_copy(&r, &source);
        assert_eq!(
            d.labels.keys().map(String::as_str).collect::<Vec<_>>(),
            vec![LABEL_MANAGED_BY, "copy", LABEL_RULE_UID, "keep", "team"]
        );
        assert_eq!(d.labels[LABEL_RULE_UID], "rule-1");
        assert_eq!(d.labels[LABEL_MANAGED_BY], "copyrator");
        assert_eq!(
            d.annotations.keys().map(String::as_str).collect::<Vec<_>>(),
            vec![
                ANNOTATION_RULE,
                ANNOTATION_SOURCE,
                ANNOTATION_SOURCE_UID,
                "doc",
                "note"
            ]
        );
        assert_eq!(d.annotations[ANNOTATION_SOURCE], "src/cm");
        assert_eq!(d.annotations[ANNOTATION_SOURCE_UID], "u-src");
        assert_eq!(d.annotations[ANNOTATION_RULE], "src/r");
        assert_eq!(d.payload["data"], json!({"k": "v"}));
    }

    #[test]
    fn foreign_objects_and_other_rules_copies_are_conflicts() {
        let mut w = World::new(&["src", "a", "b", "c"]);
        w.source("src", "cm", &[("copy", "yes")], json!({}));
        w.known_conflicts.insert(
            ("a".into(), "cm".into()),
            "a ConfigMap not made by Copyrator is there".into(),
        );
        let mut other =
            crate::cache::index::tests::object("b", "cm", "x", 1, &[(LABEL_RULE_UID, "rule-2")]);
        other
            .annotations
            .insert(ANNOTATION_RULE.into(), "src/other".into());
        other.rehash();
        w.copies.upsert(Arc::new(other));
        let r = simple_rule();
        let live = |uid: &str| uid == "rule-1" || uid == "rule-2";
        let p = plan(&Inputs {
            rule: &r,
            namespaces: &w.namespaces,
            sources: &w.sources,
            copies: &w.copies,
            live_rule_uids: &live,
            known_conflicts: &w.known_conflicts,
            scope: &Scope::everything(),
            roles: &w.roles,
        });
        assert_eq!(verbs(&p), vec![("c".into(), "cm".into(), "create")]);
        assert_eq!(p.conflicts.len(), 2);
        assert!(p.conflicts[1].reason.contains("src/other"));
        // Overwrite tries the foreign one again, never another rule's copy.
        let over = rule(
            json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": {"conflictPolicy": "Overwrite"}}),
        );
        let p = plan(&Inputs {
            rule: &over,
            namespaces: &w.namespaces,
            sources: &w.sources,
            copies: &w.copies,
            live_rule_uids: &live,
            known_conflicts: &w.known_conflicts,
            scope: &Scope::everything(),
            roles: &w.roles,
        });
        assert_eq!(
            verbs(&p),
            vec![
                ("a".into(), "cm".into(), "create"),
                ("c".into(), "cm".into(), "create")
            ]
        );
    }

    #[test]
    fn copies_of_a_deleted_rule_with_the_same_name_are_adopted() {
        let mut w = World::new(&["src", "a"]);
        w.source("src", "cm", &[("copy", "yes")], json!({}));
        let mut old =
            crate::cache::index::tests::object("a", "cm", "x", 1, &[(LABEL_RULE_UID, "old-uid")]);
        old.annotations
            .insert(ANNOTATION_RULE.into(), "src/r".into());
        old.rehash();
        w.copies.upsert(Arc::new(old));
        let p = w.plan(&simple_rule());
        assert_eq!(verbs(&p), vec![("a".into(), "cm".into(), "update")]);
    }

    #[test]
    fn immutable_parts_force_a_recreate() {
        let mut w = World::new(&["src", "a"]);
        let r = rule(json!({"ruleType": "secret", "selector": {"copy": "yes"}}));
        let mut s = w.source("src", "s", &[("copy", "yes")], json!({"k": "dg=="}));
        s.payload.insert("type".into(), json!("Opaque"));
        s.rehash();
        w.sources = vec![Arc::new(s.clone())];
        let p = w.plan(&r);
        w.apply(&p);
        s.payload.insert("type".into(), json!("kubernetes.io/tls"));
        s.rehash();
        w.sources = vec![Arc::new(s.clone())];
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("a".into(), "s".into(), "recreate")]
        );
        // immutable: true and data changed
        s.payload.insert("type".into(), json!("Opaque"));
        s.payload.insert("immutable".into(), json!(true));
        s.rehash();
        w.sources = vec![Arc::new(s.clone())];
        let p = w.plan(&r);
        w.apply(&p);
        s.payload.insert("data".into(), json!({"k": "dzI="}));
        s.rehash();
        w.sources = vec![Arc::new(s.clone())];
        assert_eq!(
            verbs(&w.plan(&r)),
            vec![("a".into(), "s".into(), "recreate")]
        );
        // Only labels change on an immutable copy: an update is enough.
        let mut labelled = s.clone();
        labelled.payload = w.copies.get("a", "s").unwrap().payload.clone();
        labelled.labels.insert("new".into(), "label".into());
        labelled.rehash();
        w.sources = vec![Arc::new(labelled)];
        assert_eq!(verbs(&w.plan(&r)), vec![("a".into(), "s".into(), "update")]);
    }

    #[test]
    fn two_sources_with_one_name_the_first_namespace_wins() {
        let mut w = World::new(&["ns1", "ns2", "t"]);
        w.source("ns2", "cm", &[("copy", "yes")], json!({"from": "2"}));
        w.source("ns1", "cm", &[("copy", "yes")], json!({"from": "1"}));
        let r = rule(
            json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "namespace": ["ns2", "ns1"]}),
        );
        let p = w.plan(&r);
        // ns1 and ns2 each hold the source themselves, so only t gets a copy.
        assert_eq!(verbs(&p), vec![("t".into(), "cm".into(), "create")]);
        let Action::Create { desired: d, .. } = &p.actions[0] else {
            panic!()
        };
        assert_eq!(d.source, "ns1/cm");
        assert_eq!(p.shadowed.len(), 1, "ns2/cm is named as shadowed at t");
        assert!(p.conflicts.is_empty(), "t still gets its copy");
    }

    #[test]
    fn narrowing_the_rule_prunes() {
        let mut w = World::new(&["src", "team-a", "team-b"]);
        w.source("src", "cm", &[("copy", "yes")], json!({}));
        let wide = simple_rule();
        let p = w.plan(&wide);
        w.apply(&p);
        let narrow = rule(
            json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": {"targets": {"exclude": ["team-b"]}}}),
        );
        assert_eq!(
            verbs(&w.plan(&narrow)),
            vec![("team-b".into(), "cm".into(), "delete")]
        );
    }

    /// A rule whose spec holds `extra` and `targets.clusters: clusters`.
    fn rule_with_clusters(extra: Value, clusters: Value) -> ResolvedRule {
        let mut spec = extra;
        spec["targets"] = json!({ "clusters": clusters });
        rule(json!({"ruleType": "configmap", "selector": {"copy": "yes"}, "spec": spec}))
    }

    /// A world whose two ordinary namespaces hold a copy of `src/cm` each,
    /// made by `simple_rule`, and which has a protected namespace too.
    fn world_with_home_copies() -> World {
        let mut w = World::new(&["src", "a", "b", "kube-system"]);
        w.source("src", "cm", &[("copy", "yes")], json!({"k": "v"}));
        let p = w.plan(&simple_rule());
        w.apply(&p);
        w
    }

    #[test]
    fn a_rule_that_keeps_its_home_cluster_plans_as_before() {
        let w = world_with_home_copies();
        for clusters in [
            json!({}),
            json!({"local": true}),
            json!({"names": ["east"]}),
            json!({"selector": {"matchLabels": {"region": "eu"}}, "local": true}),
        ] {
            let r = rule_with_clusters(json!({}), clusters.clone());
            assert!(r.clusters.local, "{clusters}");
            let p = w.plan(&r);
            assert!(p.actions.is_empty(), "{clusters}: {:?}", p.actions);
            assert_eq!(
                (
                    p.target_namespaces,
                    p.places,
                    p.in_place,
                    p.protected_namespaces
                ),
                (2, 2, 2, 1),
                "{clusters}"
            );
            assert_eq!(
                left_out_namespaces(&r, &w.namespaces),
                [("kube-system", Exclusion::Protected)],
                "{clusters}"
            );
        }
    }

    #[test]
    fn a_rule_that_leaves_its_home_cluster_prunes_its_copies_there() {
        let mut w = world_with_home_copies();
        let away = rule_with_clusters(json!({}), json!({"local": false, "names": ["east"]}));
        let p = w.plan(&away);
        assert_eq!(
            verbs(&p),
            vec![
                ("a".into(), "cm".into(), "delete"),
                ("b".into(), "cm".into(), "delete")
            ]
        );
        assert!(
            p.actions.iter().all(|a| matches!(
                a,
                Action::Delete {
                    reason: DeleteReason::TargetLeft,
                    ..
                }
            )),
            "{:?}",
            p.actions
        );
        // Its sources are still home; no home namespace is a target, and
        // none is named as left out.
        assert_eq!(
            (
                p.sources,
                p.target_namespaces,
                p.places,
                p.desired,
                p.protected_namespaces,
                p.not_accepting_namespaces
            ),
            (1, 0, 0, 0, 0, 0)
        );
        assert!(left_out_namespaces(&away, &w.namespaces).is_empty());
        // A pass over one namespace prunes there alone.
        let mut scope = Scope::default();
        scope.add(Touch::Namespace("a".into()));
        assert_eq!(
            verbs(&w.plan_within(&away, &scope)),
            vec![("a".into(), "cm".into(), "delete")]
        );
        w.apply(&p);
        assert!(w.plan(&away).actions.is_empty());
        // Back home, the copies are made again.
        assert_eq!(
            verbs(&w.plan(&simple_rule())),
            vec![
                ("a".into(), "cm".into(), "create"),
                ("b".into(), "cm".into(), "create")
            ]
        );
    }

    #[test]
    fn a_rule_that_leaves_its_home_cluster_without_prune_keeps_its_copies_there() {
        let w = world_with_home_copies();
        let keep = rule_with_clusters(
            json!({"prune": false}),
            json!({"local": false, "selector": {}}),
        );
        let p = w.plan(&keep);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!((p.target_namespaces, p.desired), (0, 0));
    }

    #[test]
    fn a_tenant_rule_away_from_home_counts_no_namespace_as_not_accepting() {
        let w = World::new(&["team-a", "closed", "other"]);
        let mut value = json!({"ruleType": "configmap", "selector": {"copy": "yes"}});
        value["metadata"] = json!({"name": "r", "namespace": "team-a", "uid": "rule-1"});
        let mut trust = Trust::new("ops", true);
        trust.allow_tenant_clusters = true;
        let home: CopyratorRule = serde_json::from_value(value.clone()).unwrap();
        let home = home.resolve(&trust).unwrap();
        assert_eq!(w.plan(&home).not_accepting_namespaces, 2);
        value["spec"] = json!({"targets": {"clusters": {"local": false, "names": ["east"]}}});
        let away: CopyratorRule = serde_json::from_value(value).unwrap();
        let away = away.resolve(&trust).unwrap();
        assert!(away.tenant);
        assert_eq!(w.plan(&away).not_accepting_namespaces, 0);
        assert!(left_out_namespaces(&away, &w.namespaces).is_empty());
    }

    /// A rule that copies RoleBindings labelled `copy: yes` from `src`
    /// into every other namespace (`extra` merged into its spec).
    fn role_binding_rule(extra: Value) -> ResolvedRule {
        let mut spec = json!({"ruleType": "configmap", "selector": {"copy": "yes"}});
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        let mut r = rule(json!({ "spec": spec }));
        r.kind = crate::core::grants::tests::role_binding_kind();
        r
    }

    /// The source `src/name`, a RoleBinding to the `role_kind` `role`.
    fn binding_source(w: &mut World, name: &str, role_kind: &str, role: &str) {
        let mut o = crate::cache::index::tests::object(
            "src",
            name,
            &format!("uid-{name}"),
            1,
            &[("copy", "yes")],
        );
        o.payload = crate::core::grants::tests::binding_to(role_kind, role);
        o.rehash();
        w.sources.push(Arc::new(o));
    }

    fn reason_at<'p>(plan: &'p Plan, namespace: &str, name: &str) -> &'p str {
        plan.conflicts
            .iter()
            .find(|c| c.namespace == namespace && c.name == name)
            .map_or("", |c| c.reason.as_str())
    }

    /// The attack: a binding in a namespace its writer controls, to a
    /// Role of a name that grants more elsewhere. A copy is written only
    /// where the Role it binds grants what the source's grants; elsewhere
    /// the place is listed with why, and a copy already there is deleted,
    /// whatever `prune` says. A binding to a ClusterRole goes everywhere.
    #[test]
    fn a_role_binding_copy_grants_only_what_its_source_grants() {
        use crate::cache::roles::tests::role;
        let reads_secrets =
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
        let reads_maps =
            json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]);
        let mut w = World::new(&["src", "same", "differs", "missing"]);
        w.roles.upsert(role("src", "reader", reads_maps.clone()));
        w.roles.upsert(role("same", "reader", reads_maps.clone()));
        w.roles
            .upsert(role("differs", "reader", reads_secrets.clone()));
        binding_source(&mut w, "to-role", "Role", "reader");
        binding_source(&mut w, "to-view", "ClusterRole", "view");
        let r = role_binding_rule(json!({"prune": false}));
        let p = w.plan(&r);
        assert_eq!(
            verbs(&p),
            vec![
                ("differs".into(), "to-view".into(), "create"),
                ("missing".into(), "to-view".into(), "create"),
                ("same".into(), "to-role".into(), "create"),
                ("same".into(), "to-view".into(), "create"),
            ]
        );
        assert_eq!(p.conflicts.len(), 2, "{:?}", p.conflicts);
        assert!(
            reason_at(&p, "differs", "to-role")
                .starts_with("the Role reader it binds grants other rules in differs than in src"),
            "{:?}",
            p.conflicts
        );
        assert!(reason_at(&p, "missing", "to-role").contains("does not exist in missing"));
        w.apply(&p);

        // The target's Role changes: the copy there grants what the source
        // does not, and goes, although the rule keeps copies it no longer wants.
        w.roles
            .upsert(role("same", "reader", reads_secrets.clone()));
        let p = w.plan(&r);
        assert_eq!(verbs(&p), vec![("same".into(), "to-role".into(), "delete")]);
        assert!(reason_at(&p, "same", "to-role").contains("grants other rules in same"));
        w.apply(&p);

        // The Roles come to agree: the copies are written.
        w.roles.upsert(role("src", "reader", reads_secrets.clone()));
        w.roles.upsert(role("missing", "reader", reads_secrets));
        let p = w.plan(&r);
        assert_eq!(
            verbs(&p),
            vec![
                ("differs".into(), "to-role".into(), "create"),
                ("missing".into(), "to-role".into(), "create"),
                ("same".into(), "to-role".into(), "create"),
            ]
        );
        assert!(p.conflicts.is_empty(), "{:?}", p.conflicts);
    }

    /// A Role that changes in a target namespace is reported as a touch of
    /// that namespace (`controller::kinds`): a pass over it plans the
    /// writes and refusals there that a pass over everything would.
    #[test]
    fn a_pass_over_a_namespace_whose_role_changed_plans_what_a_full_pass_would() {
        use crate::cache::roles::tests::role;
        let reads =
            |verb: &str| json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": [verb]}]);
        let mut w = World::new(&["src", "a", "b", "c"]);
        for namespace in ["src", "a", "b"] {
            w.roles.upsert(role(namespace, "reader", reads("get")));
        }
        binding_source(&mut w, "to-role", "Role", "reader");
        let r = role_binding_rule(json!({}));
        let first = w.plan(&r);
        assert_eq!(verbs(&first).len(), 2, "a and b");
        w.apply(&first);
        let at = |p: &Plan, namespace: &str| {
            let writes: Vec<_> = verbs(p)
                .into_iter()
                .filter(|(ns, ..)| ns == namespace)
                .collect();
            (writes, !reason_at(p, namespace, "to-role").is_empty())
        };
        for (namespace, rules, want) in [
            (
                "b",
                reads("list"),
                (vec![("b".into(), "to-role".into(), "delete")], true),
            ),
            (
                "c",
                reads("get"),
                (vec![("c".into(), "to-role".into(), "create")], false),
            ),
        ] {
            w.roles.upsert(role(namespace, "reader", rules));
            let mut scope = Scope::default();
            scope.add(Touch::Namespace(namespace.into()));
            let scoped = w.plan_within(&r, &scope);
            let full = w.plan(&r);
            assert_eq!(at(&scoped, namespace), want, "{namespace}");
            assert_eq!(verbs(&scoped), verbs(&full), "{namespace}: the same writes");
            assert_eq!(at(&full, namespace), want, "{namespace}");
            assert!(
                scoped.examined < full.examined,
                "{namespace}: looked at less"
            );
            w.apply(&scoped);
        }
    }

    /// A copy handed over to its namespace (`syncPolicy: CreateOnly`) is
    /// the namespace's: a refusal later neither deletes nor reports it.
    #[test]
    fn a_role_binding_copy_handed_over_stays_its_namespaces() {
        use crate::cache::roles::tests::role;
        let reads = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
        let mut w = World::new(&["src", "team"]);
        w.roles.upsert(role("src", "reader", reads.clone()));
        w.roles.upsert(role("team", "reader", reads));
        binding_source(&mut w, "to-role", "Role", "reader");
        let r = role_binding_rule(json!({"syncPolicy": "CreateOnly"}));
        let p = w.plan(&r);
        w.apply(&p);
        let mut handed = (**w.copies.get("team", "to-role").expect("the copy")).clone();
        handed.create_only = true;
        w.copies.upsert(Arc::new(handed));
        w.roles.upsert(role("team", "reader", json!([])));
        let p = w.plan(&r);
        assert!(p.actions.is_empty() && p.conflicts.is_empty(), "{p:?}");
        assert_eq!(p.in_place, 1);
    }
}
