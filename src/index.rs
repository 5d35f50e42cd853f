//! In-memory views of the cluster that reconciles read: objects reduced to
//! what copying needs, namespaces, and copies indexed by rule. Plain data
//! structures, no I/O.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::kinds::Kind;

/// `(namespace, name)` of a namespaced object.
pub type ObjectKey = (String, String);

/// An object reduced to what copying needs: identity, labels, annotations
/// and the payload fields of its kind. Managed fields and everything else
/// the API server returns are dropped, so caches stay small.
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

impl Object {
    pub fn from_dynamic(kind: Kind, object: DynamicObject) -> Self {
        let meta = object.metadata;
        let fields = match object.data {
            Value::Object(map) => map.into_iter().collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        Self {
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            uid: meta.uid.unwrap_or_default(),
            resource_version: meta.resource_version.unwrap_or_default(),
            labels: meta.labels.unwrap_or_default(),
            annotations: meta.annotations.unwrap_or_default(),
            payload: normalize_payload(kind, fields),
        }
    }

    pub fn key(&self) -> ObjectKey {
        (self.namespace.clone(), self.name.clone())
    }

    pub fn rule_uid(&self) -> Option<&str> {
        self.labels.get(crate::LABEL_RULE_UID).map(String::as_str)
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
        Object {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            resource_version: rv.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: BTreeMap::new(),
            payload: BTreeMap::new(),
        }
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
