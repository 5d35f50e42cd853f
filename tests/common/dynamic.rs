//! Objects of any kind, for rules that name one with `spec.objectType`:
//! kube's [`DynamicObject`] through an [`ApiResource`], looked at as the
//! JSON the API server returned.
//!
//! ```ignore
//! let roles = ApiResource::erase::<Role>(&());
//! let source = t.create_dyn_source(&roles, &op, "reader", &[], json!({"rules": [...]})).await;
//! t.create_rule(&op, "r", object_rule_spec(&roles, t.selector(), &[t.glob("t")])).await;
//! t.wait_dyn_copy(&roles, &t1, &source, &op, "r").await;
//! ```

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Map, Value, json};

use super::{
    MetaView, QUIET, TIMEOUT, TestNs, assert_for, check_copy_meta, err_msg, map, wait_until,
};

/// Top-level fields that are no part of an object's payload: what a copy
/// carries is every other top-level field of its source.
pub const NOT_PAYLOAD: &[&str] = &["apiVersion", "kind", "metadata", "status"];

/// `{"spec": {"objectType": {apiVersion, kind}, "selector", "targets": {"include"}}}`
/// for the kind of `ar`.
pub fn object_rule_spec<S: AsRef<str>>(ar: &ApiResource, selector: Value, include: &[S]) -> Value {
    object_type_spec(&ar.api_version, &ar.kind, selector, include)
}

/// As [`object_rule_spec`], for any `apiVersion` and `kind` (served or not).
pub fn object_type_spec<S: AsRef<str>>(
    api_version: &str,
    kind: &str,
    selector: Value,
    include: &[S],
) -> Value {
    let include: Vec<&str> = include.iter().map(AsRef::as_ref).collect();
    json!({"spec": {
        "objectType": {"apiVersion": api_version, "kind": kind},
        "selector": selector,
        "targets": {"include": include},
    }})
}

/// An object of any kind as the API server returned it.
#[derive(Clone, Debug)]
pub struct DynObj {
    pub json: Value,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    managers: Vec<String>,
}

impl DynObj {
    pub fn new(json: Value) -> DynObj {
        let strings = |field: &str| -> BTreeMap<String, String> {
            json["metadata"][field]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let labels = strings("labels");
        let annotations = strings("annotations");
        let managers = json["metadata"]["managedFields"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|f| f["manager"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default();
        DynObj {
            json,
            labels,
            annotations,
            managers,
        }
    }

    fn meta_str(&self, field: &str) -> &str {
        self.json["metadata"][field].as_str().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.meta_str("namespace")
    }

    pub fn name(&self) -> &str {
        self.meta_str("name")
    }

    pub fn uid(&self) -> &str {
        self.meta_str("uid")
    }

    pub fn resource_version(&self) -> &str {
        self.meta_str("resourceVersion")
    }

    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.get(k).map(String::as_str)
    }

    pub fn owner_references(&self) -> usize {
        self.json["metadata"]["ownerReferences"]
            .as_array()
            .map_or(0, Vec::len)
    }

    /// Every top-level field but apiVersion, kind, metadata and status.
    pub fn payload(&self) -> Map<String, Value> {
        self.json
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| !NOT_PAYLOAD.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn meta(&self) -> MetaView<'_> {
        MetaView {
            namespace: self.namespace(),
            name: self.name(),
            uid: self.uid(),
            labels: &self.labels,
            annotations: &self.annotations,
            managers: &self.managers,
            owner_references: self.owner_references(),
        }
    }
}

/// Checks that `copy` is a copy of `source` made by the rule
/// `rule_ns/rule_name` with uid `rule_uid`: the same payload (every
/// top-level field but apiVersion, kind, metadata and status), and the
/// metadata of [`check_copy_meta`].
pub fn check_dyn_copy(
    copy: &DynObj,
    source: &DynObj,
    rule_ns: &str,
    rule_name: &str,
    rule_uid: &str,
) -> Result<(), String> {
    let (have, want) = (copy.payload(), source.payload());
    if have != want {
        return Err(format!(
            "copy {}/{}: payload {}, source has {}",
            copy.namespace(),
            copy.name(),
            Value::Object(have),
            Value::Object(want)
        ));
    }
    check_copy_meta(&copy.meta(), &source.meta(), rule_ns, rule_name, rule_uid)
}

impl TestNs {
    pub fn dyn_api(&self, ar: &ApiResource, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, ar)
    }

    /// Creates an object of `ar` from `body` (its top-level fields, with
    /// an optional `metadata`); apiVersion, kind, name and namespace are
    /// filled in.
    pub async fn create_dyn(&self, ar: &ApiResource, ns: &str, name: &str, body: Value) -> DynObj {
        let mut obj = body;
        obj["apiVersion"] = json!(ar.api_version);
        obj["kind"] = json!(ar.kind);
        obj["metadata"]["name"] = json!(name);
        obj["metadata"]["namespace"] = json!(ns);
        let object: DynamicObject = serde_json::from_value(obj.clone())
            .unwrap_or_else(|e| panic!("a {} body {obj}: {e}", ar.kind));
        self.dyn_api(ar, ns)
            .create(&PostParams::default(), &object)
            .await
            .map(|o| DynObj::new(serde_json::to_value(o).unwrap()))
            .unwrap_or_else(|e| panic!("creating {} {ns}/{name} {obj}: {}", ar.kind, err_msg(&e)))
    }

    /// Creates a source: `payload` (its top-level fields besides metadata)
    /// with the test label plus `labels`, and `annotations`.
    pub async fn create_dyn_source(
        &self,
        ar: &ApiResource,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        payload: Value,
    ) -> DynObj {
        let labels: BTreeMap<String, String> = self.labels(labels).into_iter().collect();
        let mut body = payload;
        body["metadata"] = json!({"labels": labels, "annotations": map(annotations)});
        self.create_dyn(ar, ns, name, body).await
    }

    pub async fn try_get_dyn(
        &self,
        ar: &ApiResource,
        ns: &str,
        name: &str,
    ) -> Result<Option<DynObj>, String> {
        self.dyn_api(ar, ns)
            .get_opt(name)
            .await
            .map(|o| o.map(|o| DynObj::new(serde_json::to_value(o).unwrap())))
            .map_err(|e| err_msg(&e))
    }

    pub async fn must_get_dyn(&self, ar: &ApiResource, ns: &str, name: &str) -> DynObj {
        self.try_get_dyn(ar, ns, name)
            .await
            .unwrap_or_else(|e| panic!("reading {} {ns}/{name}: {e}", ar.kind))
            .unwrap_or_else(|| panic!("{} {ns}/{name} does not exist", ar.kind))
    }

    /// JSON merge patch.
    pub async fn patch_dyn(&self, ar: &ApiResource, ns: &str, name: &str, patch: Value) -> DynObj {
        self.dyn_api(ar, ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|o| DynObj::new(serde_json::to_value(o).unwrap()))
            .unwrap_or_else(|e| {
                panic!(
                    "patching {} {ns}/{name} with {patch}: {}",
                    ar.kind,
                    err_msg(&e)
                )
            })
    }

    pub async fn delete_dyn(&self, ar: &ApiResource, ns: &str, name: &str) {
        if let Err(e) = self
            .dyn_api(ar, ns)
            .delete(name, &DeleteParams::default())
            .await
            && !matches!(&e, kube::Error::Api(s) if s.code == 404)
        {
            panic!("deleting {} {ns}/{name}: {}", ar.kind, err_msg(&e));
        }
    }

    /// Waits until `ar ns/name` exists and `check` accepts it.
    pub async fn wait_dyn(
        &self,
        ar: &ApiResource,
        ns: &str,
        name: &str,
        what: &str,
        check: impl Fn(&DynObj) -> Result<(), String>,
    ) -> DynObj {
        wait_until(
            format!("{} {ns}/{name}: {what}", ar.kind),
            TIMEOUT,
            async || match self.try_get_dyn(ar, ns, name).await? {
                None => Err("it does not exist".into()),
                Some(o) => check(&o).map(|()| o),
            },
        )
        .await
    }

    /// Waits until the copy `ar ns/<source's name>` of `source` exists and is right.
    pub async fn wait_dyn_copy(
        &self,
        ar: &ApiResource,
        ns: &str,
        source: &DynObj,
        rule_ns: &str,
        rule_name: &str,
    ) -> DynObj {
        let rule_uid = self.rule_uid(rule_ns, rule_name).await;
        self.wait_dyn(
            ar,
            ns,
            source.name(),
            &format!("a copy of {}/{}", source.namespace(), source.name()),
            |o| check_dyn_copy(o, source, rule_ns, rule_name, &rule_uid),
        )
        .await
    }

    pub async fn wait_dyn_gone(&self, ar: &ApiResource, ns: &str, name: &str, why: &str) {
        wait_until(
            format!("{} {ns}/{name} to be deleted ({why})", ar.kind),
            TIMEOUT,
            async || match self.try_get_dyn(ar, ns, name).await? {
                None => Ok(()),
                Some(o) => Err(format!("still there: {}", o.json)),
            },
        )
        .await
    }

    /// Asserts for [`QUIET`] that `ar ns/name` does not exist.
    pub async fn assert_dyn_absent(&self, ar: &ApiResource, ns: &str, name: &str, why: &str) {
        assert_for(
            format!("no {} {ns}/{name} ({why})", ar.kind),
            QUIET,
            async || match self.try_get_dyn(ar, ns, name).await? {
                None => Ok(()),
                Some(o) => Err(format!("it exists: {}", o.json)),
            },
        )
        .await
    }

    /// Asserts for [`QUIET`] that `ar ns/name` exists at resourceVersion `rv`.
    pub async fn assert_dyn_unchanged(
        &self,
        ar: &ApiResource,
        ns: &str,
        name: &str,
        rv: &str,
        why: &str,
    ) {
        assert_for(
            format!(
                "{} {ns}/{name} unchanged at resourceVersion {rv} ({why})",
                ar.kind
            ),
            QUIET,
            async || match self.try_get_dyn(ar, ns, name).await? {
                None => Err("it was deleted".into()),
                Some(o) if o.resource_version() != rv => Err(format!("it changed: {}", o.json)),
                Some(_) => Ok(()),
            },
        )
        .await
    }
}
