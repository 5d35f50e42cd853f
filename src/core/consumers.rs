//! Consumers of a copy, for `spec.rollout.restartConsumers`: which pod
//! templates use a ConfigMap or Secret and which of its keys, the hash of
//! what they use, and whether a workload's pod template needs a new
//! restart annotation (which rolls it).
//!
//! The annotation is `copyrator.flant.com/restart-<16 hex digits of the
//! SHA-256 of "Kind/name">` (a per-copy key that fits the 63 characters of
//! an annotation's name whatever the copy is called); its value is `v3-`
//! and 32 hex digits of an HMAC-SHA-256, under the installation's key, of
//! the copy's place, the workload's, and the keys and values it uses (see
//! `cache::mark`: a plain hash would let anyone who may read the workload
//! guess a short Secret value, and a tag without the place would let a
//! tenant have its own copies tagged and match the tags). The same content
//! at the same place always gives the same value, so writing it again
//! never rolls a workload twice.
//!
//! Values that earlier versions wrote (32 hex digits alone, without the
//! place) are never compared with a tag: such a workload is treated as one
//! that never carried the annotation, and gets the new value at the next
//! roll a change of what it uses causes anyway.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};
use ring::digest::{SHA256, digest};
use serde_json::Value;

use crate::api::kinds::Kind;
use crate::cache::mark::{self, RestartForm};
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
/// `payload` (its data fields) at `consumer`: a tag under the
/// installation's key (see `cache::mark`), so that it says nothing of the
/// values to whoever reads the workload; `None` without a key. A key the
/// workload names but the copy lacks counts as absent, so its arrival
/// changes the value too.
pub(crate) fn restart_value(
    consumer: &mark::Consumer<'_>,
    payload: &BTreeMap<String, Value>,
    used: &Use,
) -> Option<String> {
    mark::restart_value(consumer, &used_text(consumer.copy_kind, payload, used))
}

/// The value versions before keys wrote for what `used` takes of
/// `payload`: a plain SHA-256, which anyone who may read a workload could
/// test guesses against.
pub fn unkeyed_hash(kind: Kind, payload: &BTreeMap<String, Value>, used: &Use) -> String {
    mark::unkeyed_restart_value(&used_text(kind, payload, used))
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
    pub(crate) namespace: &'a str,
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
    /// `Deployment`, `StatefulSet` or `DaemonSet`.
    pub(crate) kind: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    /// The workload's own annotations (where the opt-out is).
    pub(crate) annotations: Option<&'a BTreeMap<String, String>>,
    /// Its pod template's annotations.
    pub(crate) template_annotations: Option<&'a BTreeMap<String, String>>,
    pub(crate) spec: &'a PodSpec,
}

/// The annotations to set on `workload`'s pod template for `copies`
/// (empty when none is due): for each copy it uses, the value of what it
/// uses there, where that differs from what it carries.
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
        let consumer = mark::Consumer {
            copy_kind: copy.kind,
            copy_namespace: copy.namespace,
            copy_name: copy.name,
            workload_kind: workload.kind,
            workload_namespace: workload.namespace,
            workload_name: workload.name,
        };
        let text = used_text(copy.kind, copy.payload, &used);
        let Some(value) = mark::restart_value(&consumer, &text) else {
            continue;
        };
        let key = restart_key(copy.kind, copy.name);
        let carried = workload.template_annotations.and_then(|a| a.get(&key));
        let is_due = match carried.map(|c| (c, mark::restart_form(c))) {
            Some((carried, RestartForm::Placed | RestartForm::Other)) => *carried != value,
            // The plain hash of what it uses now: the same content, and
            // anyone could compute it.
            Some((carried, RestartForm::Earlier))
                if *carried == mark::unkeyed_restart_value(&text) =>
            {
                false
            }
            // Never carried one, or an earlier version's value, which is
            // never compared (see `mark::RestartForm::Earlier`): it rolls
            // for a change of what it uses, and a pass that only checks
            // starts no roll.
            None | Some((_, RestartForm::Earlier)) => {
                let unchanged = copy.before.is_some_and(|before| {
                    !used_changed(before, &key_digests(copy.kind, copy.payload), &used)
                });
                copy.trigger == Trigger::Changed && !unchanged
            }
        };
        if is_due {
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

    /// Where the tests' workload uses the ConfigMap `cm`.
    const AT: mark::Consumer<'static> = mark::Consumer {
        copy_kind: Kind::ConfigMap,
        copy_namespace: "t1",
        copy_name: "cm",
        workload_kind: "Deployment",
        workload_namespace: "t1",
        workload_name: "web",
    };

    /// The restart value of what `used` takes of `payload` at [`AT`].
    fn value(payload: &BTreeMap<String, Value>, used: &Use) -> String {
        restart_value(&AT, payload, used).expect("the test key is installed")
    }

    /// The workload of [`AT`].
    fn web<'a>(
        spec: &'a PodSpec,
        annotations: Option<&'a BTreeMap<String, String>>,
        template_annotations: Option<&'a BTreeMap<String, String>>,
    ) -> Workload<'a> {
        Workload {
            kind: AT.workload_kind,
            namespace: AT.workload_namespace,
            name: AT.workload_name,
            annotations,
            template_annotations,
            spec,
        }
    }

    /// The copy of [`AT`], holding `payload`.
    fn cm<'a>(
        payload: &'a BTreeMap<String, Value>,
        trigger: Trigger,
        before: Option<&'a KeyDigests>,
    ) -> CopyContent<'a> {
        CopyContent {
            kind: AT.copy_kind,
            namespace: AT.copy_namespace,
            name: AT.copy_name,
            payload,
            trigger,
            before,
        }
    }

    #[test]
    fn a_value_covers_exactly_the_keys_used_and_is_stable() {
        let before = payload(json!({"a": "1", "b": "2"}));
        let b_changed = payload(json!({"a": "1", "b": "3"}));
        let reordered: BTreeMap<String, Value> =
            serde_json::from_str(r#"{"data": {"b": "2", "a": "1"}}"#).expect("json");
        let a = Use::Keys(BTreeSet::from(["a".to_owned()]));
        assert_eq!(value(&before, &a), value(&b_changed, &a), "b is not used");
        assert_ne!(value(&before, &Use::Whole), value(&b_changed, &Use::Whole));
        assert_eq!(value(&before, &Use::Whole), value(&reordered, &Use::Whole));
        assert_eq!(value(&before, &a), value(&before.clone(), &a));
        let gone = payload(json!({"b": "2"}));
        assert_ne!(
            value(&before, &a),
            value(&gone, &a),
            "a key going away counts"
        );
        let empty = payload(json!({"a": ""}));
        assert_ne!(value(&empty, &a), value(&gone, &a), "empty is not absent");
        let split = payload(json!({"a": "1b", "b": "2"}));
        let joined = payload(json!({"a": "1", "b": "b2"}));
        assert_ne!(value(&split, &Use::Whole), value(&joined, &Use::Whole));
        // What workloads carry from before values were keyed is pinned:
        // it is taken as current, so that the upgrade rolls no consumer.
        let cm = Kind::ConfigMap;
        assert_eq!(
            unkeyed_hash(cm, &before, &Use::Whole),
            "c36734778f62599efef9daaca3536618"
        );
        let keyed = value(&before, &Use::Whole);
        assert!(!keyed.contains("c36734778f62599efef9daaca3536618"), "keyed");
        assert_eq!(keyed.len(), mark::RESTART_VALUE_PREFIX.len() + 32);
    }

    /// The place is in the value: two workloads that use the same content
    /// of copies of the same name, in two namespaces, carry two values.
    #[test]
    fn the_same_content_used_elsewhere_gets_another_value() {
        let pod = deployment_spec();
        let v1 = payload(json!({"a": "1"}));
        let here = restarts_due(&web(&pod, None, None), &[cm(&v1, Trigger::Changed, None)]);
        let elsewhere = restarts_due(
            &Workload {
                namespace: "t2",
                ..web(&pod, None, None)
            },
            &[CopyContent {
                namespace: "t2",
                ..cm(&v1, Trigger::Changed, None)
            }],
        );
        assert_eq!(
            here.keys().collect::<Vec<_>>(),
            elsewhere.keys().collect::<Vec<_>>()
        );
        assert_ne!(here, elsewhere);
        // Planted on this workload, the other's value is not its own: a
        // pass that only checks writes its own back.
        let planted = elsewhere.clone();
        assert_eq!(
            restarts_due(
                &web(&pod, None, Some(&planted)),
                &[cm(&v1, Trigger::Recheck, None)]
            ),
            here
        );
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
        let changed = |p| [cm(p, Trigger::Changed, None)];
        let fresh = web(&pod, None, None);
        let due = restarts_due(&fresh, &changed(&v1));
        assert_eq!(
            due.len(),
            1,
            "a consumer without the annotation rolls on a change"
        );
        let carried = due.clone();
        let rolled = web(&pod, None, Some(&carried));
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
        let out = web(&pod, Some(&opted), None);
        assert!(restarts_due(&out, &changed(&a_too)).is_empty(), "opted out");
        let other = CopyContent {
            name: "other",
            ..cm(&a_too, Trigger::Changed, None)
        };
        assert!(
            restarts_due(&fresh, &[other]).is_empty(),
            "an unrelated copy"
        );
    }

    /// The values an earlier version wrote for the content the copy holds:
    /// the plain hash of before keys, and the tag without the place.
    fn earlier_values(content: &BTreeMap<String, Value>) -> [(&'static str, String); 2] {
        let pod = deployment_spec();
        let used = use_of(&pod, Kind::ConfigMap, "cm").expect("the pod uses cm");
        let text = used_text(Kind::ConfigMap, content, &used);
        let key = mark::test_key(mark::TEST_KEY_SEED);
        [
            ("unkeyed", mark::unkeyed_restart_value(&text)),
            ("place-less", mark::placeless_restart_value(&key, &text)),
        ]
    }

    /// The upgrade rolls nothing: a workload that carries an earlier
    /// version's value of what the copy holds is not rolled by a pass that
    /// checks, nor by a change of keys it does not use; a change of what
    /// it uses rolls it, with a value of this version.
    #[test]
    fn an_earlier_value_of_unchanged_content_stands_until_what_it_uses_changes() {
        let pod = deployment_spec();
        let v1 = payload(json!({"a": "1", "b": "1"}));
        let b_changed = payload(json!({"a": "1", "b": "2"}));
        let a_changed = payload(json!({"a": "2", "b": "1"}));
        let before = key_digests(Kind::ConfigMap, &v1);
        let key = restart_key(Kind::ConfigMap, "cm");
        for (form, earlier) in earlier_values(&v1) {
            let carried = BTreeMap::from([(key.clone(), earlier)]);
            let workload = web(&pod, None, Some(&carried));
            let due = |copy| restarts_due(&workload, &[copy]);
            assert!(due(cm(&v1, Trigger::Recheck, None)).is_empty(), "{form}");
            assert!(
                due(cm(&b_changed, Trigger::Changed, Some(&before))).is_empty(),
                "{form}: b is not its key"
            );
            let used = use_of(&pod, Kind::ConfigMap, "cm").expect("the pod uses cm");
            assert_eq!(
                due(cm(&a_changed, Trigger::Changed, Some(&before))),
                BTreeMap::from([(key.clone(), value(&a_changed, &used))]),
                "{form}: a changed"
            );
        }
    }

    /// An earlier version's tag without the place is never compared with
    /// what a workload uses: were it, a tenant could plant another
    /// workload's value on its own, with a guess in its copy, and see from
    /// whether its workload rolls whether the guess was right. The plain
    /// hash may be compared: anyone can compute it.
    #[test]
    fn an_earlier_keyed_value_tells_nothing_by_whether_it_rolls() {
        let pod = deployment_spec();
        let right = payload(json!({"a": "4821"}));
        let wrong = payload(json!({"a": "1234"}));
        let unused = payload(json!({"a": "4821", "b": "x"}));
        let before_right = key_digests(Kind::ConfigMap, &right);
        let before_wrong = key_digests(Kind::ConfigMap, &wrong);
        let key = restart_key(Kind::ConfigMap, "cm");
        let [_, (_, planted)] = earlier_values(&right);
        let [_, (_, unrelated)] = earlier_values(&wrong);
        let cases = [
            (cm(&right, Trigger::Recheck, None), "a pass that checks"),
            (
                cm(&right, Trigger::Changed, None),
                "a change, before unknown",
            ),
            (
                cm(&right, Trigger::Changed, Some(&before_wrong)),
                "a change to the guess",
            ),
            (
                cm(&unused, Trigger::Changed, Some(&before_right)),
                "a change of another key",
            ),
        ];
        for (copy, case) in cases {
            let with = |value: &String| {
                let carried = BTreeMap::from([(key.clone(), value.clone())]);
                restarts_due(
                    &web(&pod, None, Some(&carried)),
                    std::slice::from_ref(&copy),
                )
            };
            assert_eq!(with(&planted), with(&unrelated), "{case}");
        }
        // The plain hash of what it uses now stands, even when what the
        // copy held before is unknown.
        let [(_, unkeyed), _] = earlier_values(&right);
        let carried = BTreeMap::from([(key.clone(), unkeyed)]);
        assert!(
            restarts_due(
                &web(&pod, None, Some(&carried)),
                &[cm(&right, Trigger::Changed, None)]
            )
            .is_empty()
        );
    }

    #[test]
    fn a_recheck_finishes_a_roll_but_starts_none() {
        let pod = deployment_spec();
        let v1 = payload(json!({"a": "1"}));
        let v2 = payload(json!({"a": "2"}));
        let recheck = [cm(&v2, Trigger::Recheck, None)];
        assert!(
            restarts_due(&web(&pod, None, None), &recheck).is_empty(),
            "enabling rolls nothing"
        );
        let key = restart_key(Kind::ConfigMap, "cm");
        let used = use_of(&pod, Kind::ConfigMap, "cm").expect("the pod uses cm");
        for stale in [value(&v1, &used), "edited".to_owned()] {
            let old = BTreeMap::from([(key.clone(), stale)]);
            let due = restarts_due(&web(&pod, None, Some(&old)), &recheck);
            assert_eq!(due.len(), 1, "a roll cut short is finished: {old:?}");
            assert!(restarts_due(&web(&pod, None, Some(&due)), &recheck).is_empty());
        }
    }

    #[test]
    fn a_workload_never_rolled_rolls_only_when_what_it_uses_changed() {
        let pod = deployment_spec();
        let fresh = web(&pod, None, None);
        let v1 = payload(json!({"a": "1", "b": "1"}));
        let b_changed = payload(json!({"a": "1", "b": "2"}));
        let a_changed = payload(json!({"a": "2", "b": "1"}));
        let kind = Kind::ConfigMap;
        let before = key_digests(kind, &v1);
        let change = |p, before| [cm(p, Trigger::Changed, before)];
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
            &key_digests(kind, &b_changed),
            &Use::Whole
        ));
        let reordered: BTreeMap<String, Value> =
            serde_json::from_str(r#"{"data": {"b": "1", "a": "1"}}"#).expect("json");
        assert_eq!(before, key_digests(kind, &reordered));
    }
}
