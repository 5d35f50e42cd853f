//! In-memory views of the cluster that reconciles read: objects reduced to
//! what copying needs, namespaces, and copies indexed by rule. Plain data
//! structures, no I/O.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::kinds::Kind;

/// `(namespace, name)` of a namespaced object.
pub type ObjectKey = (String, String);

/// An object reduced to what copying needs: identity, labels, annotations
/// and the payload fields of its kind, with hashes of its content. Managed
/// fields and everything else the API server returns are dropped, and
/// copies are kept [compact](Object::into_compact), so caches stay small.
#[derive(Clone, PartialEq)]
pub struct Object {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Payload fields (`data`, `binaryData`, `type`, `immutable`), normalized:
    /// nulls, empty maps and `immutable: false` are left out.
    pub payload: BTreeMap<String, Value>,
    /// Hash of labels, annotations and payload: a copy is right when its
    /// hash equals the desired one.
    pub content_hash: u64,
    /// Hash of the payload alone.
    pub payload_hash: u64,
    /// The `copyrator.flant.com/rule-uid` label: set on copies.
    pub rule_uid: Option<String>,
    /// The `copyrator.flant.com/rule` annotation: the rule that made a copy.
    pub rule_ref: Option<String>,
    /// The `copyrator.flant.com/source` annotation: a copy's source.
    pub source_ref: Option<String>,
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
pub fn normalize_payload(
    kind: Kind,
    fields: impl IntoIterator<Item = (String, Value)>,
) -> BTreeMap<String, Value> {
    let wanted = kind.info().payload_fields;
    fields
        .into_iter()
        .filter(|(field, value)| {
            wanted.contains(&field.as_str())
                && match value {
                    Value::Null | Value::Bool(false) => false,
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

pub fn payload_hash(payload: &BTreeMap<String, Value>) -> u64 {
    let mut state = DefaultHasher::new();
    for (field, value) in payload {
        field.hash(&mut state);
        hash_value(value, &mut state);
    }
    state.finish()
}

pub fn content_hash(
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

impl Object {
    pub fn new(
        namespace: String,
        name: String,
        uid: String,
        resource_version: String,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        payload: BTreeMap<String, Value>,
    ) -> Self {
        let payload_hash = payload_hash(&payload);
        Self {
            content_hash: content_hash(&labels, &annotations, payload_hash),
            payload_hash,
            rule_uid: labels.get(crate::LABEL_RULE_UID).cloned(),
            rule_ref: annotations.get(crate::ANNOTATION_RULE).cloned(),
            source_ref: annotations.get(crate::ANNOTATION_SOURCE).cloned(),
            namespace,
            name,
            uid,
            resource_version,
            labels,
            annotations,
            payload,
        }
    }

    pub fn from_dynamic(kind: Kind, object: DynamicObject) -> Self {
        let meta = object.metadata;
        let fields = match object.data {
            Value::Object(map) => map.into_iter().collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        Self::new(
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
            meta.uid.unwrap_or_default(),
            meta.resource_version.unwrap_or_default(),
            meta.labels.unwrap_or_default(),
            meta.annotations.unwrap_or_default(),
            normalize_payload(kind, fields),
        )
    }

    /// Recompute the hashes and references after changing labels, annotations or payload.
    pub fn rehash(&mut self) {
        self.payload_hash = payload_hash(&self.payload);
        self.content_hash = content_hash(&self.labels, &self.annotations, self.payload_hash);
        self.rule_uid = self.labels.get(crate::LABEL_RULE_UID).cloned();
        self.rule_ref = self.annotations.get(crate::ANNOTATION_RULE).cloned();
        self.source_ref = self.annotations.get(crate::ANNOTATION_SOURCE).cloned();
    }

    /// What a copy needs in the cache: the hashes, its rule and source
    /// references, and the payload fields that decide a recreate. Labels,
    /// annotations and data are dropped (maps are rebuilt, so no node of
    /// theirs stays allocated), and memory does not grow with their size.
    pub fn into_compact(mut self) -> Self {
        self.labels = BTreeMap::new();
        self.annotations = BTreeMap::new();
        self.payload = std::mem::take(&mut self.payload)
            .into_iter()
            .filter(|(k, _)| k == "type" || k == "immutable")
            .collect();
        self
    }

    pub fn key(&self) -> ObjectKey {
        (self.namespace.clone(), self.name.clone())
    }

    pub fn rule_uid(&self) -> Option<&str> {
        self.rule_uid.as_deref()
    }

    pub fn object_type(&self) -> Option<&str> {
        self.payload.get("type").and_then(Value::as_str)
    }

    pub fn is_immutable(&self) -> bool {
        self.payload.get("immutable") == Some(&Value::Bool(true))
    }

    /// Whether `self` is a newer version of the same object than `other`.
    /// Resource versions are opaque, but the API server's are etcd revisions;
    /// when either does not parse, the incoming one is taken.
    pub fn is_not_older_than(&self, other: &Object) -> bool {
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
pub struct NamespaceInfo {
    pub labels: BTreeMap<String, String>,
    /// `deletionTimestamp` is set: nothing is written there any more.
    pub terminating: bool,
}

/// Every copy of one kind in the cluster, by key and by the rule that made it.
#[derive(Default)]
pub struct CopyIndex {
    by_key: HashMap<ObjectKey, Arc<Object>>,
    by_rule: HashMap<String, HashSet<ObjectKey>>,
}

impl CopyIndex {
    pub fn get(&self, namespace: &str, name: &str) -> Option<&Arc<Object>> {
        self.by_key.get(&(namespace.to_owned(), name.to_owned()))
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Copies labelled with a rule's UID.
    pub fn owned_by<'a>(&'a self, rule_uid: &str) -> impl Iterator<Item = &'a Arc<Object>> + 'a {
        self.by_rule
            .get(rule_uid)
            .into_iter()
            .flatten()
            .filter_map(|key| self.by_key.get(key))
    }

    pub fn count_owned_by(&self, rule_uid: &str) -> usize {
        self.by_rule.get(rule_uid).map_or(0, HashSet::len)
    }

    /// Insert or replace; returns the rule UIDs whose copies changed.
    /// An older version than the one held (our own write landed first) is ignored.
    pub fn upsert(&mut self, object: Arc<Object>) -> Vec<String> {
        let key = object.key();
        let mut touched = Vec::new();
        if let Some(previous) = self.by_key.get(&key) {
            if !object.is_not_older_than(previous) {
                return touched;
            }
            if **previous == *object {
                return touched;
            }
            if let Some(uid) = previous.rule_uid() {
                touched.push(uid.to_owned());
                if Some(uid) != object.rule_uid()
                    && let Some(keys) = self.by_rule.get_mut(uid)
                {
                    keys.remove(&key);
                }
            }
        }
        if let Some(uid) = object.rule_uid() {
            self.by_rule
                .entry(uid.to_owned())
                .or_default()
                .insert(key.clone());
            if !touched.iter().any(|t| t == uid) {
                touched.push(uid.to_owned());
            }
        }
        self.by_key.insert(key, object);
        touched
    }

    /// Remove; returns the rule UID of the removed copy.
    pub fn remove(&mut self, namespace: &str, name: &str) -> Option<String> {
        let key = (namespace.to_owned(), name.to_owned());
        let previous = self.by_key.remove(&key)?;
        let uid = previous.rule_uid()?.to_owned();
        if let Some(keys) = self.by_rule.get_mut(&uid) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_rule.remove(&uid);
            }
        }
        Some(uid)
    }

    /// Replace everything (after a full list); returns every rule UID seen before or after.
    pub fn replace_all(&mut self, objects: Vec<Arc<Object>>) -> HashSet<String> {
        let mut touched: HashSet<String> = self.by_rule.keys().cloned().collect();
        self.by_key.clear();
        self.by_rule.clear();
        for object in objects {
            touched.extend(self.upsert(object));
        }
        touched
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn object(ns: &str, name: &str, uid: &str, rv: u64, labels: &[(&str, &str)]) -> Object {
        Object::new(
            ns.into(),
            name.into(),
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
    fn hashes_ignore_key_order_and_see_every_change() {
        let a: Value = serde_json::from_str(r#"{"x": "1", "y": {"b": 2, "a": [1, "s"]}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"y": {"a": [1, "s"], "b": 2}, "x": "1"}"#).unwrap();
        let payload = |v: &Value| BTreeMap::from([("data".to_string(), v.clone())]);
        assert_eq!(payload_hash(&payload(&a)), payload_hash(&payload(&b)));
        let c: Value = serde_json::from_str(r#"{"x": "1", "y": {"b": 3, "a": [1, "s"]}}"#).unwrap();
        assert_ne!(payload_hash(&payload(&a)), payload_hash(&payload(&c)));
        let mut o = object("ns", "n", "u", 1, &[("k", "v")]);
        let before = o.content_hash;
        o.annotations.insert("a".into(), "b".into());
        o.rehash();
        assert_ne!(before, o.content_hash);
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
        let (content, payload) = (o.content_hash, o.payload_hash);
        let compact = o.into_compact();
        assert_eq!(
            (compact.content_hash, compact.payload_hash),
            (content, payload)
        );
        assert_eq!(compact.rule_uid(), Some("r"));
        assert!(compact.is_immutable());
        assert!(!compact.payload.contains_key("data"));
        assert!(compact.labels.is_empty() && compact.annotations.is_empty());
        assert_eq!(compact.source_ref.as_deref(), Some("src/n"));
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
        assert_eq!(index.remove("a", "x").as_deref(), Some("r2"));
        assert!(index.is_empty());
        let touched = index.replace_all(vec![Arc::new(object("b", "y", "2", 1, &[(uid, "r3")]))]);
        assert!(touched.contains("r3"));
        assert_eq!(index.len(), 1);
    }
}
