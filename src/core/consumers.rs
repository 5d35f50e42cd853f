//! Consumers of a copy, for `spec.rollout.restartConsumers`: which pod
//! templates use a ConfigMap or Secret and which of its keys, the hash of
//! what they use, and whether a workload's pod template needs a new
//! restart annotation (which rolls it).
//!
//! The annotation is `copyrator.flant.com/restart-<16 hex digits of the
//! SHA-256 of "Kind/name">` (a per-copy key that fits the 63 characters of
//! an annotation's name whatever the copy is called); its value is 32 hex
//! digits of an HMAC-SHA-256, under the installation's key, of the keys and
//! values the workload uses (a plain hash would let anyone who may read
//! the workload guess a short Secret value). The same content always gives
//! the same value, so writing it again never rolls a workload twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};
use ring::digest::{SHA256, digest};
use serde_json::Value;

use crate::api::kinds::Kind;
use crate::cache::mark;
use crate::core::plan::Desired;
use crate::{ANNOTATION_RESTART, ANNOTATION_RESTART_PREFIX};

/// What a pod template uses of one ConfigMap or Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Use {
    /// Every key (a volume without `items`, `envFrom`).
    Whole,
    /// These keys alone (volume `items`, `env[].valueFrom`).
    Keys(BTreeSet<String>),
}

impl Use {
    fn join(self, other: Use) -> Use {
        match (self, other) {
            (Use::Keys(mut a), Use::Keys(b)) => {
                a.extend(b);
                Use::Keys(a)
            }
            _ => Use::Whole,
        }
    }
}

fn items_use(items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>) -> Use {
    match items {
        Some(items) if !items.is_empty() => {
            Use::Keys(items.iter().map(|i| i.key.clone()).collect())
        }
        _ => Use::Whole,
    }
}

fn volume_uses(volume: &Volume, kind: Kind, name: &str) -> Vec<Use> {
    let mut uses = Vec::new();
    if kind == Kind::ConfigMap {
        if let Some(cm) = volume.config_map.as_ref().filter(|cm| cm.name == name) {
            uses.push(items_use(cm.items.as_ref()));
        }
    } else if kind == Kind::Secret
        && let Some(secret) = volume
            .secret
            .as_ref()
            .filter(|s| s.secret_name.as_deref() == Some(name))
    {
        uses.push(items_use(secret.items.as_ref()));
    }
    let sources = volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten());
    for source in sources {
        if kind == Kind::ConfigMap
            && let Some(cm) = source.config_map.as_ref().filter(|cm| cm.name == name)
        {
            uses.push(items_use(cm.items.as_ref()));
        }
        if kind == Kind::Secret
            && let Some(secret) = source.secret.as_ref().filter(|s| s.name == name)
        {
            uses.push(items_use(secret.items.as_ref()));
        }
    }
    uses
}

fn container_uses(container: &Container, kind: Kind, name: &str) -> Vec<Use> {
    let mut uses = Vec::new();
    for from in container.env_from.iter().flatten() {
        let named = if kind == Kind::ConfigMap {
            from.config_map_ref.as_ref().map(|r| r.name.as_str())
        } else if kind == Kind::Secret {
            from.secret_ref.as_ref().map(|r| r.name.as_str())
        } else {
            None
        };
        if named == Some(name) {
            uses.push(Use::Whole);
        }
    }
    for var in container.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        let key = if kind == Kind::ConfigMap {
            from.config_map_key_ref
                .as_ref()
                .filter(|r| r.name == name)
                .map(|r| r.key.clone())
        } else if kind == Kind::Secret {
            from.secret_key_ref
                .as_ref()
                .filter(|r| r.name == name)
                .map(|r| r.key.clone())
        } else {
            None
        };
        if let Some(key) = key {
            uses.push(Use::Keys(BTreeSet::from([key])));
        }
    }
    uses
}

/// What `spec` uses of the ConfigMap or Secret `name` (volumes, projected
/// volumes, and `envFrom` and `env[].valueFrom` of containers and init
/// containers); `None` when nothing, and for every other kind.
pub(crate) fn use_of(spec: &PodSpec, kind: Kind, name: &str) -> Option<Use> {
    let volumes = spec
        .volumes
        .iter()
        .flatten()
        .flat_map(|v| volume_uses(v, kind, name));
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| container_uses(c, kind, name));
    volumes.chain(containers).reduce(Use::join)
}

/// The pod-template annotation for the copy `kind`/`name`.
pub(crate) fn restart_key(kind: Kind, name: &str) -> String {
    let hash = digest(&SHA256, format!("{kind}/{name}").as_bytes());
    format!(
        "{ANNOTATION_RESTART_PREFIX}{}",
        mark::hex(hash.as_ref(), 16)
    )
}

fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The restart annotation's value for what `used` takes of a copy's
/// `payload` (its data fields): a tag under the installation's key (see
/// `cache::mark`), so that it says nothing of the values to whoever reads
/// the workload. A key the workload names but the copy lacks counts as
/// absent, so its arrival changes the value too.
pub fn used_hash(kind: Kind, payload: &BTreeMap<String, Value>, used: &Use) -> String {
    mark::restart_value(&used_text(kind, payload, used))
}

/// The canonical text of what `used` takes of `payload`.
fn used_text(kind: Kind, payload: &BTreeMap<String, Value>, used: &Use) -> String {
    let fields: Vec<(&str, &serde_json::Map<String, Value>)> = kind
        .info()
        .data_fields
        .iter()
        .filter_map(|f| payload.get(*f).and_then(Value::as_object).map(|m| (*f, m)))
        .collect();
    let mut text = String::from(match used {
        Use::Whole => "whole;",
        Use::Keys(_) => "keys;",
    });
    let mut add = |field: &str, key: &str, value: Option<&Value>| {
        for part in [field, key, &value.map(value_text).unwrap_or_default()] {
            text.push_str(&part.len().to_string());
            text.push(':');
            text.push_str(part);
        }
    };
    match used {
        Use::Whole => {
            for (field, map) in &fields {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                for key in keys {
                    add(field, key, map.get(key));
                }
            }
        }
        Use::Keys(keys) => {
            for key in keys {
                match fields.iter().find_map(|(f, m)| m.get(key).map(|v| (*f, v))) {
                    Some((field, value)) => add(field, key, Some(value)),
                    None => add("-", key, None),
                }
            }
        }
    }
    text
}

/// A digest of each data key's value: what a copy held, remembered
/// between passes so that a workload that never carried the annotation
/// rolls only when what it uses changed.
pub(crate) type KeyDigests = BTreeMap<String, u64>;

/// The [`KeyDigests`] of a payload.
pub(crate) fn key_digests(kind: Kind, payload: &BTreeMap<String, Value>) -> KeyDigests {
    let mut digests = KeyDigests::new();
    for field in kind.info().data_fields {
        for (key, value) in payload
            .get(*field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let text = format!("{field}\0{}", value_text(value));
            let hash = digest(&SHA256, text.as_bytes());
            let mut first = [0u8; 8];
            first.copy_from_slice(&hash.as_ref()[..8]);
            digests
                .entry(key.clone())
                .or_insert(u64::from_be_bytes(first));
        }
    }
    digests
}

/// Whether what `used` takes differs between two contents.
pub(crate) fn used_changed(before: &KeyDigests, after: &KeyDigests, used: &Use) -> bool {
    match used {
        Use::Whole => before != after,
        Use::Keys(keys) => keys.iter().any(|k| before.get(k) != after.get(k)),
    }
}

/// Whether a workload's own annotations keep it from being rolled.
pub(crate) fn opted_out(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(ANNOTATION_RESTART))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
}

/// A copy to look at for its consumers: what it holds, why, and what it
/// held before (its data keys' digests), where known.
pub(crate) type Entry = (Arc<Desired>, Trigger, Option<Arc<KeyDigests>>);

/// Why a workload is looked at for a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// A write changed the copy's data: a consumer whose annotation is
    /// missing or different rolls.
    Changed,
    /// A pass over the whole rule checks a copy it did not change: only a
    /// consumer that carries the annotation with another value rolls (a
    /// roll cut short between the copy's write and the workload's patch).
    Recheck,
}

/// A ConfigMap or Secret copy as it stands, for its consumers.
pub(crate) struct CopyContent<'a> {
    pub(crate) kind: Kind,
    pub(crate) name: &'a str,
    pub(crate) payload: &'a BTreeMap<String, Value>,
    pub(crate) trigger: Trigger,
    /// What the copy held before a [`Trigger::Changed`] write, where known:
    /// a workload without the annotation rolls only if what it uses differs
    /// (unknown: it rolls).
    pub(crate) before: Option<&'a KeyDigests>,
}

/// A Deployment, StatefulSet or DaemonSet as far as rolling it goes.
pub(crate) struct Workload<'a> {
    /// The workload's own annotations (where the opt-out is).
    pub(crate) annotations: Option<&'a BTreeMap<String, String>>,
    /// Its pod template's annotations.
    pub(crate) template_annotations: Option<&'a BTreeMap<String, String>>,
    pub(crate) spec: &'a PodSpec,
}

/// The annotations to set on `workload`'s pod template for `copies`
/// (empty when none is due): for each copy it uses, the hash of what it
/// uses, where that differs from what it carries.
pub(crate) fn restarts_due(
    workload: &Workload<'_>,
    copies: &[CopyContent<'_>],
) -> BTreeMap<String, String> {
    let mut due = BTreeMap::new();
    if opted_out(workload.annotations) {
        return due;
    }
    for copy in copies {
        let Some(used) = use_of(workload.spec, copy.kind, copy.name) else {
            continue;
        };
        let key = restart_key(copy.kind, copy.name);
        let carried = workload.template_annotations.and_then(|a| a.get(&key));
        if carried.is_none() {
            let unchanged = copy.before.is_some_and(|before| {
                !used_changed(before, &key_digests(copy.kind, copy.payload), &used)
            });
            if copy.trigger == Trigger::Recheck || unchanged {
                continue;
            }
        }
        let text = used_text(copy.kind, copy.payload, &used);
        let value = mark::restart_value(&text);
        // A value from before restart values were keyed stands for the
        // same content: replacing it would roll the workload for nothing.
        let current =
            carried.is_some_and(|c| *c == value || *c == mark::unkeyed_restart_value(&text));
        if !current {
            due.insert(key, value);
        }
    }
    due
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: Value) -> PodSpec {
        serde_json::from_value(value).expect("a pod spec")
    }

    fn payload(data: Value) -> BTreeMap<String, Value> {
        BTreeMap::from([("data".to_owned(), data)])
    }

    fn keys(k: &[&str]) -> Option<Use> {
        Some(Use::Keys(k.iter().map(|k| (*k).to_owned()).collect()))
    }

    fn container(extra: Value) -> Value {
        let mut c = json!({"name": "c", "image": "i"});
        c.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        c
    }

    #[test]
    fn every_place_a_pod_names_a_config_map_is_found() {
        let cases = [
            (
                json!({"containers": [container(json!({}))], "volumes": [{"name": "v", "configMap": {"name": "cm"}}]}),
                Some(Use::Whole),
            ),
            (
                json!({"containers": [container(json!({}))], "volumes": [{"name": "v", "configMap": {"name": "cm", "items": [{"key": "a", "path": "a"}]}}]}),
                keys(&["a"]),
            ),
            (
                json!({"containers": [container(json!({}))], "volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": "cm", "items": [{"key": "b", "path": "b"}]}}]}}]}),
                keys(&["b"]),
            ),
            (
                json!({"containers": [container(json!({"envFrom": [{"configMapRef": {"name": "cm"}}]}))]}),
                Some(Use::Whole),
            ),
            (
                json!({"containers": [container(json!({}))], "initContainers": [container(json!({"env": [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}}]}))]}),
                keys(&["a"]),
            ),
            (
                json!({"containers": [container(json!({"env": [
                    {"name": "E", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}},
                    {"name": "F", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "c"}}}
                ]}))]}),
                keys(&["a", "c"]),
            ),
            (
                json!({"containers": [container(json!({"env": [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}}], "envFrom": [{"configMapRef": {"name": "cm"}}]}))]}),
                Some(Use::Whole),
            ),
            (
                json!({"containers": [container(json!({"envFrom": [{"configMapRef": {"name": "other"}}, {"secretRef": {"name": "cm"}}]}))], "volumes": [{"name": "v", "secret": {"secretName": "cm"}}]}),
                None,
            ),
        ];
        for (i, (pod, want)) in cases.into_iter().enumerate() {
            assert_eq!(use_of(&spec(pod), Kind::ConfigMap, "cm"), want, "case {i}");
        }
    }

    #[test]
    fn every_place_a_pod_names_a_secret_is_found() {
        let cases = [
            (
                json!({"containers": [container(json!({}))], "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
                Some(Use::Whole),
            ),
            (
                json!({"containers": [container(json!({}))], "volumes": [{"name": "v", "secret": {"secretName": "s", "items": [{"key": "a", "path": "a"}]}}]}),
                keys(&["a"]),
            ),
            (
                json!({"containers": [container(json!({}))], "volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s"}}]}}]}),
                Some(Use::Whole),
            ),
            (
                json!({"containers": [container(json!({"envFrom": [{"secretRef": {"name": "s"}}]}))]}),
                Some(Use::Whole),
            ),
            (
                json!({"containers": [container(json!({"env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}))]}),
                keys(&["k"]),
            ),
            (
                json!({"containers": [container(json!({"envFrom": [{"configMapRef": {"name": "s"}}]}))], "volumes": [{"name": "v", "configMap": {"name": "s"}}]}),
                None,
            ),
        ];
        for (i, (pod, want)) in cases.into_iter().enumerate() {
            assert_eq!(use_of(&spec(pod), Kind::Secret, "s"), want, "case {i}");
        }
    }

    #[test]
    fn a_hash_covers_exactly_the_keys_used_and_is_stable() {
        let before = payload(json!({"a": "1", "b": "2"}));
        let b_changed = payload(json!({"a": "1", "b": "3"}));
        let reordered: BTreeMap<String, Value> =
            serde_json::from_str(r#"{"data": {"b": "2", "a": "1"}}"#).expect("json");
        let a = Use::Keys(BTreeSet::from(["a".to_owned()]));
        let cm = Kind::ConfigMap;
        assert_eq!(
            used_hash(cm, &before, &a),
            used_hash(cm, &b_changed, &a),
            "b is not used"
        );
        assert_ne!(
            used_hash(cm, &before, &Use::Whole),
            used_hash(cm, &b_changed, &Use::Whole)
        );
        assert_eq!(
            used_hash(cm, &before, &Use::Whole),
            used_hash(cm, &reordered, &Use::Whole)
        );
        assert_eq!(
            used_hash(cm, &before, &a),
            used_hash(cm, &before.clone(), &a)
        );
        let gone = payload(json!({"b": "2"}));
        assert_ne!(
            used_hash(cm, &before, &a),
            used_hash(cm, &gone, &a),
            "a key going away counts"
        );
        let empty = payload(json!({"a": ""}));
        assert_ne!(
            used_hash(cm, &empty, &a),
            used_hash(cm, &gone, &a),
            "empty is not absent"
        );
        let split = payload(json!({"a": "1b", "b": "2"}));
        let joined = payload(json!({"a": "1", "b": "b2"}));
        assert_ne!(
            used_hash(cm, &split, &Use::Whole),
            used_hash(cm, &joined, &Use::Whole)
        );
        // What workloads carry from before values were keyed is pinned:
        // it is taken as current, so that keying rolls no consumer.
        assert_eq!(
            mark::unkeyed_restart_value(&used_text(cm, &before, &Use::Whole)),
            "c36734778f62599efef9daaca3536618"
        );
        assert_ne!(
            used_hash(cm, &before, &Use::Whole),
            "c36734778f62599efef9daaca3536618",
            "keyed"
        );
        assert_eq!(used_hash(cm, &before, &a).len(), 32);
    }

    #[test]
    fn restart_keys_fit_an_annotation_name_for_any_copy() {
        let long = "x".repeat(253);
        let key = restart_key(Kind::Secret, &long);
        let (prefix, name) = key.split_once('/').expect("a prefixed key");
        assert_eq!(prefix, "copyrator.flant.com");
        assert!(name.len() <= 63, "{name}");
        assert_ne!(
            restart_key(Kind::Secret, "a"),
            restart_key(Kind::ConfigMap, "a")
        );
        assert_eq!(
            restart_key(Kind::Secret, "a"),
            restart_key(Kind::Secret, "a")
        );
    }

    fn deployment_spec() -> PodSpec {
        spec(json!({"containers": [container(json!({"env": [
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}}
        ]}))]}))
    }

    #[test]
    fn a_patch_is_due_once_per_content() {
        let pod = deployment_spec();
        let v1 = payload(json!({"a": "1", "b": "2"}));
        let changed = |p| {
            vec![CopyContent {
                kind: Kind::ConfigMap,
                name: "cm",
                payload: p,
                trigger: Trigger::Changed,
                before: None,
            }]
        };
        let fresh = Workload {
            annotations: None,
            template_annotations: None,
            spec: &pod,
        };
        let due = restarts_due(&fresh, &changed(&v1));
        assert_eq!(
            due.len(),
            1,
            "a consumer without the annotation rolls on a change"
        );
        let carried = due.clone();
        let rolled = Workload {
            annotations: None,
            template_annotations: Some(&carried),
            spec: &pod,
        };
        assert!(
            restarts_due(&rolled, &changed(&v1)).is_empty(),
            "same content, no roll"
        );
        let b_only = payload(json!({"a": "1", "b": "9"}));
        assert!(
            restarts_due(&rolled, &changed(&b_only)).is_empty(),
            "b is not its key"
        );
        let a_too = payload(json!({"a": "5", "b": "9"}));
        assert_eq!(restarts_due(&rolled, &changed(&a_too)).len(), 1);
        let opted = BTreeMap::from([(ANNOTATION_RESTART.to_owned(), "false".to_owned())]);
        let out = Workload {
            annotations: Some(&opted),
            template_annotations: None,
            spec: &pod,
        };
        assert!(restarts_due(&out, &changed(&a_too)).is_empty(), "opted out");
        let other = CopyContent {
            kind: Kind::ConfigMap,
            name: "other",
            payload: &a_too,
            trigger: Trigger::Changed,
            before: None,
        };
        assert!(
            restarts_due(&fresh, &[other]).is_empty(),
            "an unrelated copy"
        );
    }

    /// A workload that carries the value of before keys, for the content
    /// the copy still holds, is not rolled for the new form of the value;
    /// once the content changes it gets the keyed value.
    #[test]
    fn an_unkeyed_value_of_unchanged_content_stands() {
        let pod = deployment_spec();
        let v1 = payload(json!({"a": "1"}));
        let v2 = payload(json!({"a": "2"}));
        let used = use_of(&pod, Kind::ConfigMap, "cm").expect("the pod uses cm");
        let key = restart_key(Kind::ConfigMap, "cm");
        let unkeyed = mark::unkeyed_restart_value(&used_text(Kind::ConfigMap, &v1, &used));
        let carried = BTreeMap::from([(key.clone(), unkeyed)]);
        let workload = Workload {
            annotations: None,
            template_annotations: Some(&carried),
            spec: &pod,
        };
        let copy = |payload| CopyContent {
            kind: Kind::ConfigMap,
            name: "cm",
            payload,
            trigger: Trigger::Recheck,
            before: None,
        };
        assert!(restarts_due(&workload, &[copy(&v1)]).is_empty());
        assert_eq!(
            restarts_due(&workload, &[copy(&v2)]),
            BTreeMap::from([(key, used_hash(Kind::ConfigMap, &v2, &used))])
        );
    }

    #[test]
    fn a_recheck_finishes_a_roll_but_starts_none() {
        let pod = deployment_spec();
        let v2 = payload(json!({"a": "2"}));
        let recheck = [CopyContent {
            kind: Kind::ConfigMap,
            name: "cm",
            payload: &v2,
            trigger: Trigger::Recheck,
            before: None,
        }];
        let never = Workload {
            annotations: None,
            template_annotations: None,
            spec: &pod,
        };
        assert!(
            restarts_due(&never, &recheck).is_empty(),
            "enabling rolls nothing"
        );
        let old = BTreeMap::from([(restart_key(Kind::ConfigMap, "cm"), "old".to_owned())]);
        let behind = Workload {
            annotations: None,
            template_annotations: Some(&old),
            spec: &pod,
        };
        let due = restarts_due(&behind, &recheck);
        assert_eq!(due.len(), 1, "a roll cut short is finished");
        let done = Workload {
            annotations: None,
            template_annotations: Some(&due),
            spec: &pod,
        };
        assert!(restarts_due(&done, &recheck).is_empty());
    }

    #[test]
    fn a_workload_never_rolled_rolls_only_when_what_it_uses_changed() {
        let pod = deployment_spec();
        let fresh = Workload {
            annotations: None,
            template_annotations: None,
            spec: &pod,
        };
        let cm = Kind::ConfigMap;
        let v1 = payload(json!({"a": "1", "b": "1"}));
        let b_changed = payload(json!({"a": "1", "b": "2"}));
        let a_changed = payload(json!({"a": "2", "b": "1"}));
        let before = key_digests(cm, &v1);
        let change = |p, before| {
            [CopyContent {
                kind: cm,
                name: "cm",
                payload: p,
                trigger: Trigger::Changed,
                before,
            }]
        };
        assert!(restarts_due(&fresh, &change(&b_changed, Some(&before))).is_empty());
        assert_eq!(
            restarts_due(&fresh, &change(&a_changed, Some(&before))).len(),
            1
        );
        assert_eq!(
            restarts_due(&fresh, &change(&b_changed, None)).len(),
            1,
            "what it held is unknown: it rolls"
        );
        assert!(
            restarts_due(&fresh, &change(&v1, Some(&before))).is_empty(),
            "a copy restored to what it held rolls nothing"
        );
        assert!(used_changed(
            &before,
            &key_digests(cm, &b_changed),
            &Use::Whole
        ));
        let reordered: BTreeMap<String, Value> =
            serde_json::from_str(r#"{"data": {"b": "1", "a": "1"}}"#).expect("json");
        assert_eq!(before, key_digests(cm, &reordered));
    }
}
