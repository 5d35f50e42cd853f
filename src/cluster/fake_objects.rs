//! Unit tests only: objects of one kind in memory, answering the writer's
//! requests as the API server does (uids, resourceVersions, 404 and 409
//! with preconditions, a namespace being terminated, `managedFields` for
//! labels and annotations), with failures that a test queues and a record
//! of every request, its writes to rules and Events among them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::DynamicObject;
use kube::core::Status;
use serde_json::{Map, Value, json};

use crate::sync::lock;

/// A request the store answered: its verb, namespace and name.
pub(crate) type Request = (&'static str, String, String);

#[derive(Default)]
pub(crate) struct FakeObjects {
    state: std::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<(String, String), DynamicObject>,
    version: u64,
    terminating: BTreeSet<String>,
    /// Answers to give instead of the store's own, by verb and namespace,
    /// in order.
    failures: VecDeque<(&'static str, String, kube::Error)>,
    requests: Vec<Request>,
    /// Whom each request was sent as, in order (`operator`, or the
    /// ServiceAccount's user name).
    identities: Vec<String>,
}

/// A client that is never asked anything (its server address is closed):
/// for the parts of a test's state that need one to be built.
pub(crate) fn never_asked_client() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
    kube::Client::try_from(config).expect("a client")
}

/// The read and write clients of a cluster, never asked anything.
pub(crate) fn never_asked_clients() -> crate::cluster::client::Clients {
    let client = never_asked_client();
    crate::cluster::client::Clients {
        read: client.clone(),
        write: client,
        more_reads: None,
    }
}

/// A ConfigMap `namespace/name` with `labels` and `data`, as read.
pub(crate) fn config_map(namespace: &str, name: &str, labels: Value, data: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace,
                     "uid": format!("uid-{namespace}-{name}"),
                     "resourceVersion": "1", "labels": labels},
        "data": data,
    }))
    .expect("a ConfigMap")
}

pub(crate) fn api_error(code: u16, message: &str, reason: &str) -> kube::Error {
    kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
}

impl State {
    /// The queued failure for `verb`, if one is first in line for it.
    fn injected(&mut self, verb: &'static str, namespace: &str, name: &str) -> Option<kube::Error> {
        self.requests
            .push((verb, namespace.to_owned(), name.to_owned()));
        let at = self
            .failures
            .iter()
            .position(|(v, ns, _)| *v == verb && ns == namespace)?;
        self.failures.remove(at).map(|(_, _, error)| error)
    }

    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }
}

/// Who set each label and annotation: as the API server tracks it for a
/// write (a create owns every key; an update owns the keys whose values it
/// changed or added, and the others keep their writer).
fn track_owners(previous: Option<&DynamicObject>, next: &mut DynamicObject, manager: &str) {
    let owner_of = |o: &DynamicObject| -> BTreeMap<(String, String), String> {
        let mut owners = BTreeMap::new();
        for entry in o.metadata.managed_fields.iter().flatten() {
            let Some(FieldsV1(fields)) = &entry.fields_v1 else {
                continue;
            };
            for map in ["f:labels", "f:annotations"] {
                for key in fields["f:metadata"][map].as_object().into_iter().flatten() {
                    owners.insert(
                        (map.to_owned(), key.0.clone()),
                        entry.manager.clone().unwrap_or_default(),
                    );
                }
            }
        }
        owners
    };
    let held = previous.map(owner_of).unwrap_or_default();
    let value = |o: &DynamicObject, map: &str, key: &str| -> Option<String> {
        let key = key.strip_prefix("f:")?;
        match map {
            "f:labels" => o.metadata.labels.as_ref()?.get(key).cloned(),
            _ => o.metadata.annotations.as_ref()?.get(key).cloned(),
        }
    };
    let mut by_manager: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let keys = |map: &str| -> Vec<String> {
        let keys: Vec<String> = match map {
            "f:labels" => next
                .metadata
                .labels
                .iter()
                .flatten()
                .map(|(k, _)| k.clone())
                .collect(),
            _ => next
                .metadata
                .annotations
                .iter()
                .flatten()
                .map(|(k, _)| k.clone())
                .collect(),
        };
        keys.into_iter().map(|k| format!("f:{k}")).collect()
    };
    for map in ["f:labels", "f:annotations"] {
        for key in keys(map) {
            let unchanged = previous.is_some_and(|p| value(p, map, &key) == value(next, map, &key));
            let owner = match held.get(&(map.to_owned(), key.clone())) {
                Some(owner) if unchanged => owner.clone(),
                _ => manager.to_owned(),
            };
            let fields = by_manager.entry(owner).or_default();
            let metadata = fields
                .entry("f:metadata")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .map(|m| m.entry(map).or_insert_with(|| json!({})));
            if let Some(Value::Object(entries)) = metadata {
                entries.insert(key, json!({}));
            }
        }
    }
    next.metadata.managed_fields = Some(
        by_manager
            .into_iter()
            .map(|(manager, fields)| ManagedFieldsEntry {
                manager: Some(manager),
                operation: Some("Update".to_owned()),
                fields_type: Some("FieldsV1".to_owned()),
                fields_v1: Some(FieldsV1(Value::Object(fields))),
                ..ManagedFieldsEntry::default()
            })
            .collect(),
    );
}

impl FakeObjects {
    /// Make the next `verb` request into `namespace` fail with `error`.
    pub(crate) fn fail_next(&self, verb: &'static str, namespace: &str, error: kube::Error) {
        lock(&self.state)
            .failures
            .push_back((verb, namespace.to_owned(), error));
    }

    /// Writes into `namespace` are refused as into a namespace being deleted.
    pub(crate) fn terminate(&self, namespace: &str) {
        lock(&self.state).terminating.insert(namespace.to_owned());
    }

    /// The writer's next request is sent as `identity`.
    pub(crate) fn sent_as(&self, identity: &crate::core::identity::Identity) {
        lock(&self.state).identities.push(identity.to_string());
    }

    /// Whom each request was sent as, in order.
    pub(crate) fn identities(&self) -> Vec<String> {
        lock(&self.state).identities.clone()
    }

    pub(crate) fn requests(&self) -> Vec<Request> {
        lock(&self.state).requests.clone()
    }

    /// The object as stored now.
    pub(crate) fn stored(&self, namespace: &str, name: &str) -> Option<DynamicObject> {
        lock(&self.state)
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Put an object there as `manager` would (no request recorded).
    pub(crate) fn put(
        &self,
        namespace: &str,
        manager: &str,
        mut object: DynamicObject,
    ) -> DynamicObject {
        let mut state = lock(&self.state);
        track_owners(None, &mut object, manager);
        let name = object.metadata.name.clone().unwrap_or_default();
        object.metadata.namespace = Some(namespace.to_owned());
        object.metadata.uid = Some(format!("uid-{name}-{}", state.version + 1));
        object.metadata.resource_version = Some(state.next_version());
        state
            .objects
            .insert((namespace.to_owned(), name), object.clone());
        object
    }

    pub(crate) fn create(
        &self,
        namespace: &str,
        object: &DynamicObject,
    ) -> kube::Result<DynamicObject> {
        let name = object.metadata.name.clone().unwrap_or_default();
        let mut state = lock(&self.state);
        if let Some(error) = state.injected("create", namespace, &name) {
            return Err(error);
        }
        if state.terminating.contains(namespace) {
            return Err(api_error(
                403,
                &format!(
                    "unable to create new content in namespace {namespace} because it is being terminated"
                ),
                "Forbidden",
            ));
        }
        if state
            .objects
            .contains_key(&(namespace.to_owned(), name.clone()))
        {
            return Err(api_error(409, "already exists", "AlreadyExists"));
        }
        drop(state);
        Ok(self.put(namespace, crate::FIELD_MANAGER, object.clone()))
    }

    pub(crate) fn get(&self, namespace: &str, name: &str) -> kube::Result<Option<DynamicObject>> {
        let mut state = lock(&self.state);
        if let Some(error) = state.injected("get", namespace, name) {
            return Err(error);
        }
        Ok(state
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned())
    }

    pub(crate) fn replace(
        &self,
        namespace: &str,
        object: &DynamicObject,
    ) -> kube::Result<DynamicObject> {
        let name = object.metadata.name.clone().unwrap_or_default();
        let mut state = lock(&self.state);
        if let Some(error) = state.injected("replace", namespace, &name) {
            return Err(error);
        }
        let key = (namespace.to_owned(), name);
        let Some(held) = state.objects.get(&key) else {
            return Err(api_error(404, "not found", "NotFound"));
        };
        if object.metadata.resource_version != held.metadata.resource_version {
            return Err(api_error(409, "the object has been modified", "Conflict"));
        }
        let mut next = object.clone();
        track_owners(Some(held), &mut next, crate::FIELD_MANAGER);
        next.metadata.uid.clone_from(&held.metadata.uid);
        next.metadata.namespace = Some(namespace.to_owned());
        next.metadata.resource_version = Some(state.next_version());
        state.objects.insert(key, next.clone());
        Ok(next)
    }

    pub(crate) fn merge_patch(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> kube::Result<DynamicObject> {
        let mut state = lock(&self.state);
        if let Some(error) = state.injected("patch", namespace, name) {
            return Err(error);
        }
        let key = (namespace.to_owned(), name.to_owned());
        let Some(held) = state.objects.get(&key).cloned() else {
            return Err(api_error(404, "not found", "NotFound"));
        };
        let wanted = patch["metadata"]["resourceVersion"].as_str();
        if wanted.is_some_and(|v| Some(v) != held.metadata.resource_version.as_deref()) {
            return Err(api_error(409, "the object has been modified", "Conflict"));
        }
        let mut next = held.clone();
        let merge = |held: &mut BTreeMap<String, String>, patch: &Value| {
            for (key, value) in patch.as_object().into_iter().flatten() {
                match value.as_str() {
                    Some(value) => {
                        held.insert(key.clone(), value.to_owned());
                    }
                    None => {
                        held.remove(key);
                    }
                }
            }
        };
        merge(
            next.metadata.labels.get_or_insert_default(),
            &patch["metadata"]["labels"],
        );
        merge(
            next.metadata.annotations.get_or_insert_default(),
            &patch["metadata"]["annotations"],
        );
        track_owners(Some(&held), &mut next, crate::FIELD_MANAGER);
        next.metadata.resource_version = Some(state.next_version());
        state.objects.insert(key, next.clone());
        Ok(next)
    }

    /// A write to `rule` itself (`status` or `finalizers`): answered as
    /// the rule with `change` made, at a new version.
    pub(crate) fn rule_write(
        &self,
        verb: &'static str,
        rule: &crate::api::rule::CopyratorRule,
        change: impl FnOnce(&mut crate::api::rule::CopyratorRule),
    ) -> kube::Result<crate::api::rule::CopyratorRule> {
        let namespace = rule.metadata.namespace.as_deref().unwrap_or_default();
        let name = rule.metadata.name.as_deref().unwrap_or_default();
        let mut state = lock(&self.state);
        if let Some(error) = state.injected(verb, namespace, name) {
            return Err(error);
        }
        let mut answer = rule.clone();
        change(&mut answer);
        answer.metadata.resource_version = Some(state.next_version());
        Ok(answer)
    }

    /// An Event on `rule`, recorded by its reason.
    pub(crate) fn event(
        &self,
        rule: &crate::api::rule::CopyratorRule,
        reason: &str,
    ) -> kube::Result<()> {
        let namespace = rule.metadata.namespace.as_deref().unwrap_or_default();
        let mut state = lock(&self.state);
        match state.injected("event", namespace, reason) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    pub(crate) fn delete(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
    ) -> kube::Result<()> {
        let mut state = lock(&self.state);
        if let Some(error) = state.injected("delete", namespace, name) {
            return Err(error);
        }
        let key = (namespace.to_owned(), name.to_owned());
        let Some(held) = state.objects.get(&key) else {
            return Err(api_error(404, "not found", "NotFound"));
        };
        if held.metadata.uid.as_deref() != Some(uid)
            || held.metadata.resource_version.as_deref() != Some(resource_version)
        {
            return Err(api_error(
                409,
                "Precondition failed: UID or ResourceVersion in precondition does not match",
                "Conflict",
            ));
        }
        state.objects.remove(&key);
        Ok(())
    }
}
