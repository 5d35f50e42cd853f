//! In-memory views of the cluster that reconciles read: objects reduced to
//! what copying needs, namespaces, and copies indexed by rule. Plain data
//! structures, no I/O.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::kinds::Kind;
use crate::cache::mark::{self, Place, Verdict};

/// `(namespace, name)` of a namespaced object.
pub(crate) type ObjectKey = (String, String);

/// An object reduced to what copying needs: identity, labels, annotations
/// and the payload fields of its kind, with hashes of its content. Managed
/// fields and everything else the API server returns are dropped, and
/// copies are kept [compact](Object::into_compact), so caches stay small.
///
/// Of a copy's labels and annotations, Copyrator owns those its field
/// manager set (read from `managedFields`); only those decide whether the
/// copy is right. The others belong to their writers and are kept as they
/// are on every write.
#[derive(Clone, PartialEq)]
pub(crate) struct Object {
    pub(crate) namespace: Arc<str>,
    pub(crate) name: Arc<str>,
    pub(crate) uid: String,
    pub(crate) resource_version: String,
    /// All labels; in a compact copy only those Copyrator does not own.
    pub(crate) labels: BTreeMap<String, String>,
    /// All annotations; in a compact copy only those Copyrator does not own.
    pub(crate) annotations: BTreeMap<String, String>,
    /// Payload fields (`data`, `binaryData`, `type`, `immutable`), normalized:
    /// nulls, empty maps and `immutable: false` are left out.
    pub(crate) payload: BTreeMap<String, Value>,
    /// Hash of the payload alone.
    pub(crate) payload_hash: u64,
    /// [`meta_entry_hash`] of every label and annotation Copyrator's field
    /// manager owns, sorted (shared: the copies of one source hold the same).
    pub(crate) owned_meta: Arc<[u64]>,
    /// The `copyrator.flant.com/rule-uid` label: set on copies. Left out
    /// unless the mark proves it (its owner tag): a label anyone may set
    /// makes no object a copy, nor a copy another rule's.
    pub(crate) rule_uid: Option<Arc<str>>,
    /// Copyrator made this object, a copy of its rule at its place: it
    /// carries a mark whose identity tag is right (see `cache::mark`; so a
    /// copy stays one when someone strips its rule-UID label, and an object
    /// carrying Copyrator's labels, annotations and field manager without
    /// the mark is none).
    pub(crate) authored: bool,
    /// Not [`Object::authored`], yet `managedFields` say Copyrator's field
    /// manager set its rule-UID label or rule annotation: a copy written
    /// before copies carried marks (or under another key), or a forgery.
    /// Taken back only where it already holds what the rule would write.
    pub(crate) unproven: bool,
    /// The `copyrator.flant.com/rule` annotation: the rule that made a copy.
    pub(crate) rule_ref: Option<Arc<str>>,
    /// The `copyrator.flant.com/source` annotation: a copy's source.
    pub(crate) source_ref: Option<Arc<str>>,
    /// The label `copyrator.flant.com/sync-policy: CreateOnly`: a copy
    /// handed over to its namespace, which Copyrator never writes again.
    pub(crate) create_only: bool,
    /// The label `copyrator.flant.com/on-rule-deleted: Orphan`: handed over,
    /// not deleted, when its rule is gone.
    pub(crate) orphan_with_rule: bool,
    /// The annotation `copyrator.flant.com/adopted-from`: the object was
    /// made by another tool (named) or an earlier rule, and adopted
    /// (`spec.adopt`). Never owned by Copyrator's field manager, so later
    /// writes keep it as they keep others' keys.
    pub(crate) adopted_from: Option<Arc<str>>,
    /// The field manager other than Copyrator that wrote last (from `managedFields`).
    pub(crate) other_writer: Option<Arc<str>>,
    /// `Kind/name` of the controller that owns this object (an owner
    /// reference with `controller: true`), for kinds named by `objectType`.
    pub(crate) controller: Option<Arc<str>>,
    /// Hash of the desired copy Copyrator last wrote to this object; kept
    /// across versions, so that a change back is recognised as such.
    pub(crate) written_for: Option<u64>,
    /// This version is the API server's answer to that write, accepted as
    /// right even where an admission webhook added keys to it.
    pub(crate) settled: bool,
    /// The payload is provably what Copyrator wrote: the mark's content
    /// tag is right for it, and since Copyrator's last write was seen the
    /// payload did not change. Only such a copy's content may be handed on
    /// to other namespaces (a staged rollout's earlier content).
    pub(crate) intact: bool,
}

// Secret payloads must never reach a log line, so Debug shows identity only.
impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("resource_version", &self.resource_version)
            .finish_non_exhaustive()
    }
}

/// Keep only the payload fields of `kind`, in a canonical form.
pub(crate) fn normalize_payload(
    kind: Kind,
    fields: impl IntoIterator<Item = (String, Value)>,
) -> BTreeMap<String, Value> {
    // `false` is the default of ConfigMap and Secret fields; of another
    // kind's it may not be (`automountServiceAccountToken`).
    let generic = kind.info().generic;
    fields
        .into_iter()
        .filter(|(field, value)| {
            kind.is_payload_field(field)
                && match value {
                    Value::Null => false,
                    Value::Bool(false) => generic,
                    // A CRD may require `spec: {}`.
                    Value::Object(_) if generic => true,
                    Value::Object(map) => !map.is_empty(),
                    _ => true,
                }
        })
        .collect()
}

/// Feed a JSON value to a hasher with object keys in sorted order, so that
/// equal values hash equally whatever order their keys arrived in.
fn hash_value(value: &Value, state: &mut impl Hasher) {
    match value {
        Value::Null => 0u8.hash(state),
        Value::Bool(b) => (1u8, b).hash(state),
        Value::Number(n) => (2u8, n.to_string()).hash(state),
        Value::String(s) => (3u8, s).hash(state),
        Value::Array(items) => {
            (4u8, items.len()).hash(state);
            for item in items {
                hash_value(item, state);
            }
        }
        Value::Object(map) => {
            (5u8, map.len()).hash(state);
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for key in keys {
                key.hash(state);
                hash_value(&map[key], state);
            }
        }
    }
}

/// About how many bytes a JSON value takes held: its strings and keys,
/// eight for anything else.
fn value_bytes(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(value_bytes).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| k.len() + value_bytes(v)).sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
    }
}

pub(crate) fn payload_hash(payload: &BTreeMap<String, Value>) -> u64 {
    let mut state = DefaultHasher::new();
    for (field, value) in payload {
        field.hash(&mut state);
        hash_value(value, &mut state);
    }
    state.finish()
}

pub(crate) fn content_hash(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    payload_hash: u64,
) -> u64 {
    let mut state = DefaultHasher::new();
    labels.hash(&mut state);
    annotations.hash(&mut state);
    payload_hash.hash(&mut state);
    state.finish()
}

/// Whether a metadata entry is a label or an annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MetaMap {
    Label,
    Annotation,
}

/// The hash of one label or annotation, key and value.
pub(crate) fn meta_entry_hash(map: MetaMap, key: &str, value: &str) -> u64 {
    let mut state = DefaultHasher::new();
    (map, key, value).hash(&mut state);
    state.finish()
}

/// The labels and annotations Copyrator's field manager owns, as
/// `managedFields` records them; `None` when the object carries no
/// `managedFields` at all (then every key counts as Copyrator's, which only
/// ever makes it write more, never less).
pub(crate) fn owned_meta_keys(
    managed_fields: Option<&[ManagedFieldsEntry]>,
) -> Option<HashSet<(MetaMap, String)>> {
    let entries = managed_fields.filter(|m| !m.is_empty())?;
    let mut owned = HashSet::new();
    for entry in entries
        .iter()
        .filter(|e| e.manager.as_deref() == Some(crate::FIELD_MANAGER))
    {
        let Some(FieldsV1(fields)) = &entry.fields_v1 else {
            continue;
        };
        for (map, field) in [
            (MetaMap::Label, "f:labels"),
            (MetaMap::Annotation, "f:annotations"),
        ] {
            if let Some(keys) = fields
                .get("f:metadata")
                .and_then(|m| m.get(field))
                .and_then(Value::as_object)
            {
                for key in keys.keys() {
                    if let Some(key) = key.strip_prefix("f:") {
                        owned.insert((map, key.to_owned()));
                    }
                }
            }
        }
    }
    Some(owned)
}

/// The field manager other than Copyrator that wrote last.
fn last_other_writer(managed_fields: Option<&[ManagedFieldsEntry]>) -> Option<Arc<str>> {
    managed_fields?
        .iter()
        .filter(|e| {
            e.manager
                .as_deref()
                .is_some_and(|m| m != crate::FIELD_MANAGER)
        })
        .max_by_key(|e| e.time.as_ref().map(|t| t.0))
        .and_then(|e| e.manager.as_deref())
        .map(crate::cache::intern::string)
}

impl Object {
    /// An object whose labels and annotations all count as Copyrator's.
    pub(crate) fn new(
        namespace: impl AsRef<str>,
        name: impl AsRef<str>,
        uid: String,
        resource_version: String,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        payload: BTreeMap<String, Value>,
    ) -> Self {
        let mut object = Self {
            payload_hash: 0,
            owned_meta: Arc::new([]),
            rule_uid: None,
            authored: true,
            unproven: false,
            rule_ref: None,
            source_ref: None,
            create_only: false,
            orphan_with_rule: false,
            adopted_from: None,
            namespace: crate::cache::intern::string(namespace.as_ref()),
            name: crate::cache::intern::string(name.as_ref()),
            uid,
            resource_version,
            labels,
            annotations,
            payload,
            other_writer: None,
            controller: None,
            written_for: None,
            settled: false,
            intact: true,
        };
        object.rehash();
        object
    }

    pub(crate) fn from_dynamic(kind: Kind, object: DynamicObject) -> Self {
        let meta = object.metadata;
        let fields = match object.data {
            Value::Object(map) => map.into_iter().collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let owned = owned_meta_keys(meta.managed_fields.as_deref());
        let other_writer = last_other_writer(meta.managed_fields.as_deref());
        // The mark is checked here and not kept: it is no label or
        // annotation a copy is compared by.
        let mut annotations = meta.annotations.unwrap_or_default();
        let mark = annotations.remove(crate::ANNOTATION_MARK);
        let mut object = Self::new(
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
            meta.uid.unwrap_or_default(),
            meta.resource_version.unwrap_or_default(),
            meta.labels.unwrap_or_default(),
            annotations,
            normalize_payload(kind, fields),
        );
        object.other_writer = other_writer;
        if kind.info().generic {
            object.controller = meta
                .owner_references
                .iter()
                .flatten()
                .find(|owner| owner.controller == Some(true))
                .map(|owner| format!("{}/{}", owner.kind, owner.name).into());
        }
        let verdict = object
            .rule_ref
            .as_deref()
            .map_or_else(Verdict::default, |rule| {
                let place = Place {
                    kind,
                    namespace: &object.namespace,
                    name: &object.name,
                    rule,
                    rule_uid: object.rule_uid.as_deref().unwrap_or_default(),
                };
                mark::verify(&place, &object.payload, mark.as_deref())
            });
        let claimed_by_copyrator = owned.as_ref().is_none_or(|owned| {
            owned.contains(&(MetaMap::Label, crate::LABEL_RULE_UID.to_owned()))
                || owned.contains(&(MetaMap::Annotation, crate::ANNOTATION_RULE.to_owned()))
        });
        object.authored = verdict.identity;
        object.intact = verdict.content;
        object.unproven = !verdict.identity
            && claimed_by_copyrator
            && (object.rule_uid.is_some() || object.rule_ref.is_some());
        // Which rule a copy belongs to is what its mark proves, never the
        // label alone: relabelled, it is a copy of no rule's UID (and of
        // the rule its identity names, which puts the label back).
        if !verdict.owner {
            object.rule_uid = None;
        }
        if let Some(owned) = owned {
            object.set_owned(|map, key| owned.contains(&(map, key.to_owned())));
        }
        object
    }

    /// Whether this object carries Copyrator's labels from rule `rule`
    /// (`namespace/name`) without its mark ([`Object::unproven`]) and holds
    /// `payload_hash`: taken back by one write that marks it.
    pub(crate) fn is_unproven_copy_of(&self, rule: &str, payload_hash: u64) -> bool {
        self.unproven
            && !self.create_only
            && self.rule_ref.as_deref() == Some(rule)
            && self.payload_hash == payload_hash
    }

    /// Whether this object is a copy Copyrator wrote for rule `rule`
    /// (`namespace/name`) whose rule-UID label someone removed or changed.
    pub(crate) fn is_unlabelled_copy_of(&self, rule: &str) -> bool {
        self.authored
            && self.rule_uid.is_none()
            && !self.create_only
            && self.rule_ref.as_deref() == Some(rule)
    }

    /// Recompute the hashes and references after changing labels,
    /// annotations or payload; every label and annotation counts as owned.
    pub(crate) fn rehash(&mut self) {
        self.payload_hash = payload_hash(&self.payload);
        let shared = |value: Option<&String>| value.map(|v| crate::cache::intern::string(v));
        self.rule_uid = shared(self.labels.get(crate::LABEL_RULE_UID));
        self.rule_ref = shared(self.annotations.get(crate::ANNOTATION_RULE));
        self.source_ref = shared(self.annotations.get(crate::ANNOTATION_SOURCE));
        self.adopted_from = shared(self.annotations.get(crate::ANNOTATION_ADOPTED_FROM));
        self.create_only = self
            .labels
            .get(crate::LABEL_SYNC_POLICY)
            .is_some_and(|v| v == crate::CREATE_ONLY);
        self.orphan_with_rule = self
            .labels
            .get(crate::LABEL_ON_RULE_DELETED)
            .is_some_and(|v| v == crate::ORPHAN);
        self.set_owned(|_, _| true);
    }

    /// Record which labels and annotations Copyrator owns.
    pub(crate) fn set_owned(&mut self, owns: impl Fn(MetaMap, &str) -> bool) {
        let mut owned: Vec<u64> = self
            .labels
            .iter()
            .map(|(k, v)| (MetaMap::Label, k, v))
            .chain(
                self.annotations
                    .iter()
                    .map(|(k, v)| (MetaMap::Annotation, k, v)),
            )
            // Where an object came from stays with it, as another's key
            // does: no write of Copyrator's removes it.
            .filter(|(map, key, _)| *key != crate::ANNOTATION_ADOPTED_FROM && owns(*map, key))
            .map(|(map, key, value)| meta_entry_hash(map, key, value))
            .collect();
        owned.sort_unstable();
        owned.dedup();
        self.owned_meta = crate::cache::intern::hashes(&owned);
    }

    /// Whether Copyrator owns `key` with exactly `value`.
    pub(crate) fn owns(&self, map: MetaMap, key: &str, value: &str) -> bool {
        let entry = meta_entry_hash(map, key, value);
        self.owned_meta.binary_search(&entry).is_ok()
    }

    /// What a copy needs in the cache: the payload hash, the hashes of the
    /// labels and annotations Copyrator owns, the others in full (they are
    /// written back unchanged), its rule and source references, and the
    /// payload fields that decide a recreate. Data is dropped, so memory
    /// does not grow with the size of what is copied.
    pub(crate) fn into_compact(mut self) -> Self {
        let owned = self.owned_meta.clone();
        let is_owned = |map: MetaMap, key: &str, value: &str| {
            owned
                .binary_search(&meta_entry_hash(map, key, value))
                .is_ok()
        };
        self.labels = std::mem::take(&mut self.labels)
            .into_iter()
            .filter(|(k, v)| !is_owned(MetaMap::Label, k, v))
            .collect();
        self.annotations = std::mem::take(&mut self.annotations)
            .into_iter()
            .filter(|(k, v)| !is_owned(MetaMap::Annotation, k, v))
            .collect();
        self.payload = std::mem::take(&mut self.payload)
            .into_iter()
            .filter(|(k, _)| crate::api::kinds::decides_recreate(k))
            .collect();
        self
    }

    /// About how many bytes holding this object takes: its strings,
    /// labels, annotations and payload (a ConfigMap's data counts as its
    /// length). What a tenant namespace's sources are bounded by.
    pub(crate) fn approximate_bytes(&self) -> u64 {
        let map = |m: &BTreeMap<String, String>| -> usize {
            m.iter().map(|(k, v)| k.len() + v.len()).sum()
        };
        let strings = self.namespace.len()
            + self.name.len()
            + self.uid.len()
            + self.resource_version.len()
            + map(&self.labels)
            + map(&self.annotations);
        let payload: usize = self
            .payload
            .iter()
            .map(|(field, value)| field.len() + value_bytes(value))
            .sum();
        (strings + payload) as u64
    }

    pub(crate) fn key(&self) -> ObjectKey {
        (self.namespace.to_string(), self.name.to_string())
    }

    pub(crate) fn rule_uid(&self) -> Option<&str> {
        self.rule_uid.as_deref()
    }

    pub(crate) fn object_type(&self) -> Option<&str> {
        self.payload.get("type").and_then(Value::as_str)
    }

    pub(crate) fn is_immutable(&self) -> bool {
        self.payload.get("immutable") == Some(&Value::Bool(true))
    }

    /// Whether `self` is a newer version of the same object than `other`.
    /// Resource versions are opaque, but the API server's are etcd revisions;
    /// when either does not parse, the incoming one is taken.
    pub(crate) fn is_not_older_than(&self, other: &Object) -> bool {
        if self.uid != other.uid {
            return true;
        }
        match (
            self.resource_version.parse::<u64>(),
            other.resource_version.parse::<u64>(),
        ) {
            (Ok(mine), Ok(theirs)) => mine >= theirs,
            _ => true,
        }
    }
}

/// What a reconcile needs to know of a namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct NamespaceInfo {
    pub(crate) labels: BTreeMap<String, String>,
    /// `deletionTimestamp` is set: nothing is written there any more.
    pub(crate) terminating: bool,
    /// The `copyrator.flant.com/accept-from` annotation, split: namespaces
    /// (names or globs) whose tenant rules may write here.
    pub(crate) accept_from: Vec<crate::api::selector::Glob>,
    /// The `copyrator.flant.com/adopt-from` annotation, split: namespaces
    /// whose tenant rules may adopt any object here and delete it later.
    pub(crate) adopt_from: Vec<crate::api::selector::Glob>,
}

impl NamespaceInfo {
    /// What a namespace's metadata says: its labels, whether it is
    /// terminating, and whom it accepts copies from.
    pub(crate) fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        Self {
            labels: meta.labels.clone().unwrap_or_default(),
            terminating: meta.deletion_timestamp.is_some(),
            accept_from: Self::accept_from(
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(crate::ANNOTATION_ACCEPT_FROM))
                    .map(String::as_str),
            ),
            adopt_from: Self::accept_from(
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(crate::ANNOTATION_ADOPT_FROM))
                    .map(String::as_str),
            ),
        }
    }

    /// Parse the `accept-from` annotation; entries that are no valid glob
    /// are ignored (they accept nothing).
    pub(crate) fn accept_from(annotation: Option<&str>) -> Vec<crate::api::selector::Glob> {
        crate::api::selector::glob_list(annotation)
    }

    /// Whether this namespace accepts copies from tenant rules of `namespace`.
    pub(crate) fn accepts(&self, namespace: &str) -> bool {
        self.accept_from.iter().any(|g| g.matches(namespace))
    }

    /// Whether this namespace lets tenant rules of `namespace` adopt any
    /// object here, and delete what they adopted.
    pub(crate) fn adopts_from(&self, namespace: &str) -> bool {
        self.adopt_from.iter().any(|g| g.matches(namespace))
    }
}

/// `(namespace, name)` of a cached copy, sharing the copy's strings.
type SharedKey = (Arc<str>, Arc<str>);

/// Every copy of one kind in the cluster, by namespace and name, and by the
/// rule that made it. Keys share the copies' strings, and a lookup by
/// `&str` allocates nothing, so a pass over 100,000 copies stays cheap.
#[derive(Default)]
pub(crate) struct CopyIndex {
    by_namespace: HashMap<Arc<str>, HashMap<Arc<str>, Arc<Object>>>,
    by_rule: HashMap<Arc<str>, HashSet<SharedKey>>,
    /// Per rule UID, how many of its copies are handed over (`create_only`).
    create_only_by_rule: HashMap<Arc<str>, usize>,
    /// Per rule UID, how many of its copies it adopted (`adopted_from`).
    adopted_by_rule: HashMap<Arc<str>, usize>,
    len: usize,
    /// UIDs of the latest deleted copies, oldest first, each with the
    /// resourceVersion it went at: the answer to our own write can arrive
    /// after the watch reported the copy deleted, and must not bring a
    /// deleted copy back into the cache.
    gone: VecDeque<Arc<str>>,
    gone_set: HashMap<Arc<str>, Option<u64>>,
}

/// How many deleted UIDs are remembered: far more than the writes in
/// flight at any moment, which is all the race needs.
const GONE_REMEMBERED: usize = 4096;

impl CopyIndex {
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<&Arc<Object>> {
        self.by_namespace.get(namespace)?.get(name)
    }

    /// The copies in one namespace, by name.
    pub(crate) fn in_namespace(&self, namespace: &str) -> Option<&HashMap<Arc<str>, Arc<Object>>> {
        self.by_namespace.get(namespace)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies labelled with a rule's UID.
    pub(crate) fn owned_by<'a>(
        &'a self,
        rule_uid: &str,
    ) -> impl Iterator<Item = &'a Arc<Object>> + 'a {
        self.by_rule
            .get(rule_uid)
            .into_iter()
            .flatten()
            .filter_map(|(namespace, name)| self.get(namespace, name))
    }

    /// The rule UIDs that label at least one copy.
    pub(crate) fn rule_uids(&self) -> impl Iterator<Item = &str> {
        self.by_rule.keys().map(|uid| &**uid)
    }

    pub(crate) fn count_owned_by(&self, rule_uid: &str) -> usize {
        self.by_rule.get(rule_uid).map_or(0, HashSet::len)
    }

    /// How many copies labelled with a rule's UID are handed over to their
    /// namespaces (created under `syncPolicy: CreateOnly`).
    pub(crate) fn count_create_only(&self, rule_uid: &str) -> usize {
        self.create_only_by_rule.get(rule_uid).copied().unwrap_or(0)
    }

    /// How many copies of a rule's it adopted (`spec.adopt`).
    pub(crate) fn count_adopted(&self, rule_uid: &str) -> usize {
        self.adopted_by_rule.get(rule_uid).copied().unwrap_or(0)
    }

    /// Count `object` in (`held`) or out of its rule's handed-over and
    /// adopted copies.
    fn count_handed_over(&mut self, object: &Object, held: bool) {
        let Some(uid) = object.rule_uid.as_ref() else {
            return;
        };
        let count = |counts: &mut HashMap<Arc<str>, usize>| {
            if held {
                *counts.entry(uid.clone()).or_default() += 1;
            } else if let Some(count) = counts.get_mut(uid) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(uid);
                }
            }
        };
        if object.create_only {
            count(&mut self.create_only_by_rule);
        }
        if object.adopted_from.is_some() {
            count(&mut self.adopted_by_rule);
        }
    }

    fn forget_owner(&mut self, rule_uid: &str, key: &SharedKey) {
        if let Some(keys) = self.by_rule.get_mut(rule_uid) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_rule.remove(rule_uid);
            }
        }
    }

    /// Insert or replace; returns the rule UIDs whose copies changed.
    /// An older version than the one held (our own write landed first) is ignored.
    /// Take the API server's answer to Copyrator's own write: the object
    /// exists, even if its UID was seen going (the copy watch selects by the
    /// rule-UID label, so a copy whose label someone removed is reported
    /// deleted, and comes back once the write puts the label back).
    /// Only a write newer than the version the UID went at counts: the
    /// answer to a create that someone deleted before the answer was taken
    /// is older than the delete, and brings nothing back.
    pub(crate) fn upsert_written(&mut self, object: Arc<Object>) -> Vec<String> {
        if let Some(went_at) = self.gone_set.get(object.uid.as_str()).copied() {
            let written_at = object.resource_version.parse::<u64>().ok();
            if let (Some(went_at), Some(written_at)) = (went_at, written_at)
                && written_at <= went_at
            {
                return Vec::new();
            }
            self.gone_set.remove(object.uid.as_str());
            self.gone.retain(|uid| **uid != *object.uid);
        }
        self.upsert(object)
    }

    pub(crate) fn upsert(&mut self, mut object: Arc<Object>) -> Vec<String> {
        let key: SharedKey = (object.namespace.clone(), object.name.clone());
        let mut touched = Vec::new();
        if self.gone_set.contains_key(object.uid.as_str()) {
            return touched;
        }
        if let Some(previous) = self.get(&key.0, &key.1) {
            if !object.is_not_older_than(previous) {
                return touched;
            }
            if previous.uid == object.uid {
                // A payload that changed other than by Copyrator's own
                // write (whose answer carries `written_for`), or that was
                // not intact before, is not intact now, whoever
                // `managedFields` name.
                if object.written_for.is_none()
                    && object.intact
                    && (previous.payload_hash != object.payload_hash || !previous.intact)
                {
                    Arc::make_mut(&mut object).intact = false;
                }
                // What Copyrator wrote is remembered across versions; the
                // watch echo of its own write stays the settled answer.
                let same_version = previous.resource_version == object.resource_version;
                if (object.written_for.is_none() && previous.written_for.is_some())
                    || (same_version && previous.settled && !object.settled)
                {
                    let next = Arc::make_mut(&mut object);
                    next.written_for = next.written_for.or(previous.written_for);
                    next.settled |= same_version && previous.settled;
                }
            }
            if **previous == *object {
                return touched;
            }
            if let Some(uid) = previous.rule_uid.clone() {
                touched.push(uid.to_string());
                if Some(&*uid) != object.rule_uid() {
                    self.forget_owner(&uid, &key);
                }
            }
        }
        if let Some(uid) = &object.rule_uid {
            self.by_rule
                .entry(uid.clone())
                .or_default()
                .insert(key.clone());
            if !touched.iter().any(|t| **t == **uid) {
                touched.push(uid.to_string());
            }
        }
        self.count_handed_over(&object, true);
        let previous = self
            .by_namespace
            .entry(key.0)
            .or_default()
            .insert(key.1, object);
        match previous {
            Some(previous) => self.count_handed_over(&previous, false),
            None => self.len += 1,
        }
        touched
    }

    /// Remove the deleted object of this UID (a newer object of the same
    /// name stays); returns the rule UID of the removed copy.
    pub(crate) fn remove(&mut self, gone: &Object) -> Option<String> {
        self.deleted(gone)
            .and_then(|o| o.rule_uid().map(str::to_owned))
    }

    /// `gone` was deleted (its UID at its resourceVersion, the delete's as
    /// the watch reports it): it leaves the cache, and no late answer or
    /// event about it brings it back. Returns what was held, if anything.
    pub(crate) fn deleted(&mut self, gone: &Object) -> Option<Arc<Object>> {
        let went_at = gone.resource_version.parse::<u64>().ok();
        match self.gone_set.get_mut(gone.uid.as_str()) {
            Some(known) => *known = (*known).max(went_at),
            None => {
                let uid: Arc<str> = Arc::from(gone.uid.as_str());
                self.gone_set.insert(uid.clone(), went_at);
                self.gone.push_back(uid);
                if self.gone.len() > GONE_REMEMBERED
                    && let Some(oldest) = self.gone.pop_front()
                {
                    self.gone_set.remove(&oldest);
                }
            }
        }
        self.take(&gone.namespace, &gone.name, &gone.uid)
    }

    /// Removes without remembering the UID: only [`CopyIndex::deleted`]
    /// calls it, so no caller can bypass that memory.
    fn take(&mut self, namespace: &str, name: &str, uid: &str) -> Option<Arc<Object>> {
        let in_namespace = self.by_namespace.get_mut(namespace)?;
        if in_namespace.get(name)?.uid != uid {
            return None;
        }
        let previous = in_namespace.remove(name)?;
        if in_namespace.is_empty() {
            self.by_namespace.remove(namespace);
        }
        self.len -= 1;
        self.count_handed_over(&previous, false);
        if let Some(rule_uid) = previous.rule_uid.clone() {
            self.forget_owner(
                &rule_uid,
                &(previous.namespace.clone(), previous.name.clone()),
            );
        }
        Some(previous)
    }

    /// Replace everything (after a full list); returns every rule UID seen
    /// before or after. A list that began before one of our own writes can
    /// arrive after it: where it holds an older version of an object held
    /// here, the held one stays (a pass would otherwise write it again
    /// with a stale version, and meet 409s).
    pub(crate) fn replace_all(&mut self, objects: Vec<Arc<Object>>) -> HashSet<String> {
        let mut touched: HashSet<String> = self.by_rule.keys().map(|k| k.to_string()).collect();
        let before = std::mem::take(&mut self.by_namespace);
        let held: HashMap<&str, &Arc<Object>> = before
            .values()
            .flat_map(HashMap::values)
            .map(|object| (object.uid.as_str(), object))
            .collect();
        self.by_rule.clear();
        self.create_only_by_rule.clear();
        self.adopted_by_rule.clear();
        self.len = 0;
        for object in objects {
            let newest = match held.get(object.uid.as_str()) {
                Some(held) if !object.is_not_older_than(held) => Arc::clone(held),
                _ => object,
            };
            touched.extend(self.upsert(newest));
        }
        self.by_namespace.shrink_to_fit();
        self.by_rule.shrink_to_fit();
        touched
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn object(
        ns: &str,
        name: &str,
        uid: &str,
        rv: u64,
        labels: &[(&str, &str)],
    ) -> Object {
        Object::new(
            ns,
            name,
            uid.into(),
            rv.to_string(),
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            BTreeMap::new(),
            BTreeMap::new(),
        )
    }

    #[test]
    fn a_list_older_than_our_own_write_keeps_the_write() {
        let mut index = CopyIndex::default();
        let labels = [(crate::LABEL_RULE_UID, "rule-1")];
        index.upsert_written(Arc::new(object("t1", "c", "copy-1", 20, &labels)));
        index.upsert(Arc::new(object("t2", "c", "copy-2", 12, &labels)));
        // The list began before the write at 20, and holds copy-2 as it is.
        index.replace_all(vec![
            Arc::new(object("t1", "c", "copy-1", 10, &labels)),
            Arc::new(object("t2", "c", "copy-2", 12, &labels)),
        ]);
        let kept = index.get("t1", "c").map(|o| o.resource_version.to_string());
        assert_eq!(kept.as_deref(), Some("20"), "our write stays");
        assert_eq!(index.len(), 2);
        // A copy the list no longer holds is gone, whatever was held.
        index.replace_all(vec![Arc::new(object("t2", "c", "copy-2", 15, &labels))]);
        assert!(index.get("t1", "c").is_none());
        let newer = index.get("t2", "c").map(|o| o.resource_version.to_string());
        assert_eq!(newer.as_deref(), Some("15"), "a newer list wins");
    }

    #[test]
    fn an_objects_bytes_grow_with_its_data_and_keys() {
        let small = object("ns", "n", "u", 1, &[("k", "v")]);
        let mut big = small.clone();
        big.payload.insert(
            "data".into(),
            serde_json::json!({"blob": "x".repeat(900 * 1024)}),
        );
        assert!(small.approximate_bytes() < 100);
        assert_eq!(
            big.approximate_bytes() - small.approximate_bytes(),
            ("data".len() + "blob".len() + 900 * 1024) as u64
        );
    }

    #[test]
    fn hashes_ignore_key_order_and_see_every_change() {
        let a: Value = serde_json::from_str(r#"{"x": "1", "y": {"b": 2, "a": [1, "s"]}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"y": {"a": [1, "s"], "b": 2}, "x": "1"}"#).unwrap();
        let payload = |v: &Value| BTreeMap::from([("data".to_string(), v.clone())]);
        assert_eq!(payload_hash(&payload(&a)), payload_hash(&payload(&b)));
        let c: Value = serde_json::from_str(r#"{"x": "1", "y": {"b": 3, "a": [1, "s"]}}"#).unwrap();
        assert_ne!(payload_hash(&payload(&a)), payload_hash(&payload(&c)));
        let mut o = object("ns", "n", "u", 1, &[("k", "v")]);
        let before = o.owned_meta.clone();
        o.annotations.insert("a".into(), "b".into());
        o.rehash();
        assert_ne!(before, o.owned_meta);
        assert!(o.owns(MetaMap::Annotation, "a", "b"));
        assert!(
            !o.owns(MetaMap::Label, "a", "b"),
            "labels and annotations differ"
        );
    }

    #[test]
    fn compact_copies_keep_what_comparing_needs() {
        let mut o = object(
            "ns",
            "n",
            "u",
            1,
            &[(crate::LABEL_RULE_UID, "r"), ("team", "a")],
        );
        o.annotations
            .insert(crate::ANNOTATION_SOURCE.into(), "src/n".into());
        o.annotations.insert("note".into(), "x".into());
        o.payload
            .insert("data".into(), serde_json::json!({"big": "x".repeat(1000)}));
        o.payload.insert("immutable".into(), Value::Bool(true));
        o.rehash();
        let (owned, payload) = (o.owned_meta.clone(), o.payload_hash);
        let compact = o.into_compact();
        assert_eq!(
            (compact.owned_meta.clone(), compact.payload_hash),
            (owned, payload)
        );
        assert_eq!(compact.rule_uid(), Some("r"));
        assert!(compact.is_immutable());
        assert!(!compact.payload.contains_key("data"));
        assert!(compact.labels.is_empty() && compact.annotations.is_empty());
        assert_eq!(compact.source_ref.as_deref(), Some("src/n"));
    }

    fn managed(manager: &str, time: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                time.parse().unwrap(),
            )),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    /// A copy as the API server returns it, written by Copyrator and then
    /// labelled by a neighbour.
    pub(crate) fn watched_copy(neighbour_fields: Value, labels: &[(&str, &str)]) -> DynamicObject {
        let mut o = DynamicObject::new("cm", &Kind::ConfigMap.api_resource()).within("t1");
        o.metadata.uid = Some("copy-uid".into());
        o.metadata.resource_version = Some("10".into());
        o.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        o.metadata.annotations = Some(BTreeMap::from([("note".into(), "mine".into())]));
        o.metadata.managed_fields = Some(vec![
            managed(
                crate::FIELD_MANAGER,
                "2026-01-01T00:00:00Z",
                serde_json::json!({"f:data": {"f:k": {}}, "f:metadata": {
                    "f:labels": {".": {}, "f:app": {}, "f:copyrator.flant.com/rule-uid": {}},
                    "f:annotations": {".": {}, "f:note": {}, "f:copyrator.flant.com/rule": {},
                                      "f:copyrator.flant.com/mark": {}}}}),
            ),
            managed("neighbour", "2026-01-02T00:00:00Z", neighbour_fields),
        ]);
        o.data = serde_json::json!({"data": {"k": "v"}});
        mark_as_copy(&mut o, "ops/r");
        o
    }

    /// Give `o` the rule annotation `rule` and the mark Copyrator writes
    /// (under the unit tests' key) for its place and payload.
    pub(crate) fn mark_as_copy(o: &mut DynamicObject, rule: &str) {
        crate::cache::mark::install_test_key();
        let payload = normalize_payload(
            Kind::ConfigMap,
            o.data.as_object().cloned().unwrap_or_default(),
        );
        let rule_uid = o
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::LABEL_RULE_UID))
            .cloned()
            .unwrap_or_default();
        let place = Place {
            kind: Kind::ConfigMap,
            namespace: o.metadata.namespace.as_deref().unwrap_or_default(),
            name: o.metadata.name.as_deref().unwrap_or_default(),
            rule,
            rule_uid: &rule_uid,
        };
        let signed = mark::sign(&place, &payload).expect("the test key is installed");
        let annotations = o.metadata.annotations.get_or_insert_default();
        annotations.insert(crate::ANNOTATION_RULE.to_owned(), rule.to_owned());
        annotations.insert(crate::ANNOTATION_MARK.to_owned(), signed);
    }

    #[test]
    fn ownership_comes_from_managed_fields() {
        let o = watched_copy(
            serde_json::json!({"f:metadata": {"f:labels": {"f:team": {}}}}),
            &[
                ("app", "web"),
                ("team", "blue"),
                (crate::LABEL_RULE_UID, "r"),
            ],
        );
        let object = Object::from_dynamic(Kind::ConfigMap, o).into_compact();
        assert!(object.owns(MetaMap::Label, "app", "web"));
        assert!(object.owns(MetaMap::Annotation, "note", "mine"));
        assert!(!object.owns(MetaMap::Label, "team", "blue"));
        assert_eq!(
            object.labels,
            BTreeMap::from([("team".to_string(), "blue".to_string())]),
            "a compact copy keeps only what others own, to write it back"
        );
        assert!(object.annotations.is_empty());
        assert_eq!(object.other_writer.as_deref(), Some("neighbour"));
        assert_eq!(object.rule_uid(), Some("r"));
    }

    /// A copy is recognised by its mark, not by labels, annotations and
    /// field managers that anyone may set.
    #[test]
    fn a_copy_is_recognised_by_its_mark_not_by_its_labels_or_field_manager() {
        let rule = "ops/r";
        // A copy whose rule-UID label a neighbour removed: its mark holds.
        let stripped = watched_copy(serde_json::json!({}), &[("app", "web")]);
        let object = Object::from_dynamic(Kind::ConfigMap, stripped);
        assert!(object.authored && !object.unproven);
        assert!(object.is_unlabelled_copy_of(rule));
        assert!(!object.is_unlabelled_copy_of("ops/other"));
        assert!(
            !object.annotations.contains_key(crate::ANNOTATION_MARK),
            "the mark is checked, not kept"
        );
        let unmarked = |manager: &str| {
            let mut o = watched_copy(
                serde_json::json!({}),
                &[(crate::LABEL_RULE_UID, "r"), ("app", "web")],
            );
            o.metadata
                .annotations
                .as_mut()
                .map(|a| a.remove(crate::ANNOTATION_MARK));
            o.metadata.managed_fields = Some(vec![managed(
                manager,
                "2026-01-01T00:00:00Z",
                serde_json::json!({"f:metadata": {
                    "f:labels": {"f:copyrator.flant.com/rule-uid": {}, "f:app": {}},
                    "f:annotations": {"f:copyrator.flant.com/rule": {}}}}),
            )]);
            Object::from_dynamic(Kind::ConfigMap, o)
        };
        // The same labels and annotations set by someone else: no copy.
        let forged = unmarked("kubectl-client-side-apply");
        assert!(!forged.authored && !forged.unproven);
        assert_eq!(forged.rule_uid(), None, "a forged label makes no copy");
        assert!(!forged.is_unlabelled_copy_of(rule));
        // Under Copyrator's field manager but without the mark: unproven,
        // taken back only where it holds what the rule would write.
        let claimed = unmarked(crate::FIELD_MANAGER);
        assert!(!claimed.authored && claimed.unproven);
        assert_eq!(claimed.rule_uid(), None);
        assert!(claimed.is_unproven_copy_of(rule, claimed.payload_hash));
        assert!(!claimed.is_unproven_copy_of(rule, claimed.payload_hash ^ 1));
        assert!(!claimed.is_unproven_copy_of("ops/other", claimed.payload_hash));
        // A mark carried to another name proves nothing.
        let mut moved = watched_copy(serde_json::json!({}), &[(crate::LABEL_RULE_UID, "r")]);
        moved.metadata.name = Some("other".into());
        let moved = Object::from_dynamic(Kind::ConfigMap, moved);
        assert!(!moved.authored && moved.unproven && !moved.intact);
    }

    #[test]
    fn without_managed_fields_everything_counts_as_ours() {
        let mut o = watched_copy(serde_json::json!({}), &[("app", "web")]);
        o.metadata.managed_fields = None;
        let object = Object::from_dynamic(Kind::ConfigMap, o);
        assert!(object.owns(MetaMap::Label, "app", "web"));
        assert!(object.other_writer.is_none());
    }

    #[test]
    fn what_copyrator_wrote_is_remembered_across_versions() {
        let mut index = CopyIndex::default();
        let uid = crate::LABEL_RULE_UID;
        let mut ours = object("a", "x", "1", 5, &[(uid, "r1")]);
        ours.written_for = Some(42);
        ours.settled = true;
        index.upsert(Arc::new(ours));
        // The watch echo of our own write: still settled, nothing touched.
        assert!(
            index
                .upsert(Arc::new(object("a", "x", "1", 5, &[(uid, "r1")])))
                .is_empty()
        );
        let held = index.get("a", "x").unwrap();
        assert_eq!((held.written_for, held.settled), (Some(42), true));
        // Someone else's newer version: what we wrote is remembered, not settled.
        index.upsert(Arc::new(object(
            "a",
            "x",
            "1",
            6,
            &[(uid, "r1"), ("k", "v")],
        )));
        let held = index.get("a", "x").unwrap();
        assert_eq!((held.written_for, held.settled), (Some(42), false));
        // A new object of the same name starts afresh.
        index.upsert(Arc::new(object("a", "x", "2", 7, &[(uid, "r1")])));
        assert_eq!(index.get("a", "x").unwrap().written_for, None);
    }

    #[test]
    fn a_payload_is_intact_only_while_its_content_tag_is_right() {
        let copy = watched_copy(
            serde_json::json!({"f:data": {"f:k": {}}}),
            &[(crate::LABEL_RULE_UID, "r")],
        );
        let object = Object::from_dynamic(Kind::ConfigMap, copy.clone());
        assert!(
            object.intact,
            "whoever managedFields name, the payload is what was marked"
        );
        let mut edited = copy;
        edited.data = serde_json::json!({"data": {"k": "EVIL"}});
        let object = Object::from_dynamic(Kind::ConfigMap, edited);
        assert!(object.authored, "still the copy");
        assert!(!object.intact, "but not its content");
    }

    /// A copy's rule is what its mark proves: relabelled with another
    /// rule's UID, it is no copy of that rule, and its content no rule's;
    /// it stays a copy of the rule its mark names, which takes it back.
    #[test]
    fn a_copy_relabelled_with_another_rules_uid_belongs_to_no_rule_by_that_uid() {
        let copy = watched_copy(
            serde_json::json!({"f:data": {"f:k": {}}}),
            &[(crate::LABEL_RULE_UID, "r")],
        );
        let object = Object::from_dynamic(Kind::ConfigMap, copy.clone());
        assert_eq!(object.rule_uid(), Some("r"));
        let mut relabelled = copy;
        relabelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert(crate::LABEL_RULE_UID.to_owned(), "admin-rule".to_owned());
        let object = Object::from_dynamic(Kind::ConfigMap, relabelled);
        assert!(object.authored, "still a copy of the rule its mark names");
        assert_eq!(object.rule_uid(), None, "but of no rule by that label");
        assert!(!object.intact, "and its content is no rule's");
        assert!(object.is_unlabelled_copy_of("ops/r"));
        let mut index = CopyIndex::default();
        index.upsert(Arc::new(object.into_compact()));
        assert_eq!(index.count_owned_by("admin-rule"), 0);
        assert_eq!(index.owned_by("admin-rule").count(), 0);
    }

    #[test]
    fn a_payload_changed_by_anyone_but_copyrator_stays_not_intact() {
        let mut index = CopyIndex::default();
        let uid = crate::LABEL_RULE_UID;
        let mut ours = object("a", "x", "1", 5, &[(uid, "r1")]);
        ours.written_for = Some(42);
        index.upsert(Arc::new(ours.clone()));
        // A newer version with another payload, whatever its managedFields
        // claim (a forged field manager): not intact.
        let mut edited = object("a", "x", "1", 6, &[(uid, "r1")]);
        edited.payload = BTreeMap::from([("data".to_owned(), serde_json::json!({"k": "EVIL"}))]);
        edited.rehash();
        index.upsert(Arc::new(edited));
        assert!(!index.get("a", "x").unwrap().intact);
        // A label added later changes nothing of that.
        index.upsert(Arc::new(object(
            "a",
            "x",
            "1",
            7,
            &[(uid, "r1"), ("k", "v")],
        )));
        assert!(!index.get("a", "x").unwrap().intact, "still not intact");
        // Copyrator's own write (its answer) makes it intact again.
        let mut restored = object("a", "x", "1", 8, &[(uid, "r1")]);
        restored.written_for = Some(42);
        index.upsert_written(Arc::new(restored));
        assert!(index.get("a", "x").unwrap().intact);
        // Its watch echo keeps it so.
        index.upsert(Arc::new(object("a", "x", "1", 8, &[(uid, "r1")])));
        assert!(index.get("a", "x").unwrap().intact);
    }

    #[test]
    fn payload_keeps_only_kind_fields_in_canonical_form() {
        let fields = vec![
            ("data".to_string(), serde_json::json!({"a": "1"})),
            ("binaryData".to_string(), serde_json::json!({})),
            ("immutable".to_string(), Value::Bool(false)),
            ("metadata".to_string(), serde_json::json!({"x": 1})),
            ("type".to_string(), Value::String("Opaque".into())),
        ];
        let cm = normalize_payload(Kind::ConfigMap, fields.clone());
        assert_eq!(cm.keys().collect::<Vec<_>>(), vec!["data"]);
        let secret = normalize_payload(Kind::Secret, fields);
        assert_eq!(secret.keys().collect::<Vec<_>>(), vec!["data", "type"]);
    }

    #[test]
    fn debug_never_shows_the_payload() {
        let mut o = object("ns", "s", "u", 1, &[]);
        o.payload
            .insert("data".into(), serde_json::json!({"password": "c2VjcmV0"}));
        let shown = format!("{o:?}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
    }

    #[test]
    fn copy_index_tracks_rules_and_ignores_stale_versions() {
        let mut index = CopyIndex::default();
        let uid = crate::LABEL_RULE_UID;
        assert_eq!(
            index.upsert(Arc::new(object("a", "x", "1", 5, &[(uid, "r1")]))),
            vec!["r1"]
        );
        assert_eq!(index.count_owned_by("r1"), 1);
        // An older event after our own write is ignored.
        assert!(
            index
                .upsert(Arc::new(object("a", "x", "1", 4, &[(uid, "r1")])))
                .is_empty()
        );
        assert_eq!(index.get("a", "x").unwrap().resource_version, "5");
        // Same content again: nothing to do.
        assert!(
            index
                .upsert(Arc::new(object("a", "x", "1", 5, &[(uid, "r1")])))
                .is_empty()
        );
        // Relabelled to another rule: both rules are touched.
        let touched = index.upsert(Arc::new(object("a", "x", "1", 6, &[(uid, "r2")])));
        assert_eq!(touched, vec!["r1", "r2"]);
        assert_eq!(index.count_owned_by("r1"), 0);
        assert_eq!(index.owned_by("r2").count(), 1);
        assert_eq!(
            index.remove(&object("a", "x", "other-uid", 6, &[])),
            None,
            "a newer object stays"
        );
        assert_eq!(
            index.remove(&object("a", "x", "1", 6, &[])).as_deref(),
            Some("r2")
        );
        assert!(index.is_empty());
        let touched = index.replace_all(vec![Arc::new(object("b", "y", "2", 1, &[(uid, "r3")]))]);
        assert!(touched.contains("r3"));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn copies_handed_over_are_counted_per_rule() {
        let mut index = CopyIndex::default();
        let uid = crate::LABEL_RULE_UID;
        let marked = [(uid, "r1"), (crate::LABEL_SYNC_POLICY, crate::CREATE_ONLY)];
        index.upsert(Arc::new(object("a", "x", "1", 5, &marked)));
        index.upsert(Arc::new(object("b", "x", "2", 5, &marked)));
        index.upsert(Arc::new(object("c", "x", "3", 5, &[(uid, "r1")])));
        assert!(index.get("a", "x").unwrap().create_only);
        assert!(!index.get("c", "x").unwrap().create_only);
        assert_eq!(index.count_create_only("r1"), 2);
        // The label removed, and put back: counted out and in again.
        index.upsert(Arc::new(object("a", "x", "1", 6, &[(uid, "r1")])));
        assert_eq!(index.count_create_only("r1"), 1);
        index.upsert(Arc::new(object("a", "x", "1", 7, &marked)));
        assert_eq!(index.count_create_only("r1"), 2);
        // A new version that changes nothing else counts once.
        index.upsert(Arc::new(object("a", "x", "1", 8, &marked)));
        assert_eq!(index.count_create_only("r1"), 2);
        index.remove(&object("b", "x", "2", 5, &[]));
        assert_eq!(index.count_create_only("r1"), 1);
        index.replace_all(Vec::new());
        assert_eq!(index.count_create_only("r1"), 0);
    }

    #[test]
    fn a_deleted_copy_is_not_brought_back_by_a_late_answer() {
        let mut index = CopyIndex::default();
        let uid = crate::LABEL_RULE_UID;
        // The watch reports the copy deleted (at the delete's version, 7)
        // before the answer to our create (version 5) is taken: neither
        // that answer nor a late event of it brings the copy back.
        assert!(index.deleted(&object("a", "x", "1", 7, &[])).is_none());
        let mut answer = object("a", "x", "1", 5, &[(uid, "r1")]);
        answer.written_for = Some(42);
        assert!(index.upsert_written(Arc::new(answer)).is_empty());
        assert!(
            index
                .upsert(Arc::new(object("a", "x", "1", 5, &[(uid, "r1")])))
                .is_empty()
        );
        assert!(index.get("a", "x").is_none());
        assert_eq!(index.count_owned_by("r1"), 0);
        // A new copy of the same name (another UID) is welcome.
        index.upsert(Arc::new(object("a", "x", "2", 8, &[(uid, "r1")])));
        assert_eq!(index.get("a", "x").unwrap().uid, "2");
        // The memory of deleted UIDs is bounded; the oldest are forgotten.
        for i in 0..GONE_REMEMBERED + 10 {
            index.deleted(&object("b", "y", &format!("g{i}"), 9, &[]));
        }
        assert_eq!(index.gone.len(), GONE_REMEMBERED);
        assert_eq!(index.gone_set.len(), GONE_REMEMBERED);
        assert!(!index.gone_set.contains_key("1"));
    }

    #[test]
    fn a_copy_whose_label_was_removed_comes_back_with_our_later_write() {
        let mut index = CopyIndex::default();
        let uid = crate::LABEL_RULE_UID;
        index.upsert(Arc::new(object("a", "x", "1", 5, &[(uid, "r1")])));
        // Someone removed the rule-UID label at version 6: the copy watch,
        // which selects by that label, reports it deleted.
        assert!(index.deleted(&object("a", "x", "1", 6, &[])).is_some());
        // Our write puts the label back (version 7): the copy is held again.
        let mut restored = object("a", "x", "1", 7, &[(uid, "r1")]);
        restored.written_for = Some(42);
        assert_eq!(index.upsert_written(Arc::new(restored)), ["r1"]);
        assert_eq!(
            index.get("a", "x").map(|o| o.resource_version.as_str()),
            Some("7")
        );
        // Its watch echo (added again, the label back) keeps it.
        index.upsert(Arc::new(object("a", "x", "1", 7, &[(uid, "r1")])));
        assert_eq!(index.count_owned_by("r1"), 1);
    }
}
