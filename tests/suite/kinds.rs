//! Rules that copy any namespaced kind (`spec.objectType`), against a real
//! control plane and the real binary:
//!
//! * one test per kind (Role, RoleBinding, ServiceAccount, NetworkPolicy
//!   and a custom resource of a small CRD installed here): copies appear in
//!   two namespaces with the source's payload (every top-level field but
//!   apiVersion, kind, metadata and status), its labels and annotations and
//!   Copyrator's tracking metadata; they follow a change of the source, are
//!   pruned when it is deleted, and removed by the rule's finalizer; the
//!   gauge `copyrator_kind_watches` counts the kind while a rule needs it.
//!   The operator's `--kinds` names each kind in another of its forms
//!   (`Kind.group`, a bare core `Kind`, `*`).
//! * a RoleBinding copy whose `roleRef` must change (immutable) is deleted
//!   and created again;
//! * kinds the operator cannot or may not copy (denied, cluster-scoped,
//!   unknown, not enabled) are `Ready=False` with their reason, while a
//!   ConfigMap rule of the same operator still copies;
//! * the CRD refuses `ruleType` together with `spec.objectType`, and an
//!   `objectType` without `kind` or `apiVersion`;
//! * a source owned by a controller is not copied but listed in
//!   `status.refusedSources`, while its siblings are copied;
//! * a RoleBinding that an operator without `bind` may not create (RBAC
//!   escalation prevention) is `Ready=False`, reason `SyncFailed`;
//! * a RoleBinding copy to a Role is written only where the Role of that
//!   name grants what the source namespace's does, and follows both Roles;
//!   an operator that may not watch Roles copies no RoleBinding
//!   (`Forbidden`);
//! * `syncPolicy: CreateOnly` with a default-deny NetworkPolicy.
//!
//! "Nothing happens" is checked for [`QUIET`] only after a positive signal
//! that the operator has acted on the same change.

use std::collections::BTreeSet;

use std::time::Duration;

use crate::common::cluster_objects::ClusterObjects;
use crate::common::dynamic::*;
use crate::common::rbac::{ClusterScoped, Grant, Identity, grants_of};
use crate::common::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const KIND_WATCHES: &str = "copyrator_kind_watches";

fn roles() -> ApiResource {
    ApiResource::erase::<Role>(&())
}

fn role_bindings() -> ApiResource {
    ApiResource::erase::<RoleBinding>(&())
}

/// `spec` with `rbacSourcesTrusted: true`, which a rule that copies Roles
/// or RoleBindings needs: the sources of these tests are written by the
/// tests alone.
fn trusting_rbac_sources(spec: Value) -> Value {
    with(spec, "/spec/rbacSourcesTrusted", json!(true))
}

fn cluster_roles() -> ApiResource {
    ApiResource::erase::<ClusterRole>(&())
}

fn service_accounts() -> ApiResource {
    ApiResource::erase::<ServiceAccount>(&())
}

fn network_policies() -> ApiResource {
    ApiResource::erase::<NetworkPolicy>(&())
}

// ---------------------------------------------------------------------------
// the custom resource

const WIDGET_GROUP: &str = "kinds.copyrator.test";
const WIDGET_CRD: &str = "widgets.kinds.copyrator.test";

fn widgets() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget"),
        "widgets",
    )
}

/// A namespaced kind with a free-form `spec`, a top-level `colour` and a
/// `status` that is no subresource (so a test can set it on the source).
fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGET_CRD},
        "spec": {
            "group": WIDGET_GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "colour": {"type": "string"},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    })
}

static WIDGET_CRD_INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// Applies the Widget CRD (server-side, forced: the same object whoever
/// applies it, so parallel tests and test binaries may all do so) and waits
/// until it is Established and served. It stays installed, as the
/// CopyratorRule CRD does.
async fn ensure_widget_crd(client: &Client) {
    WIDGET_CRD_INSTALLED
        .get_or_init(|| install_widget_crd(client.clone()))
        .await;
}

async fn install_widget_crd(client: Client) {
    apply_crd(client, &widget_crd(), &widgets()).await;
}

// ---------------------------------------------------------------------------
// helpers of this file

/// Ready False with `reason` and a message that mentions every one of `words`.
fn not_ready_saying(rule: &Value, reason: &str, words: &[&str]) -> Result<(), String> {
    let ready = ready_condition(rule).ok_or_else(|| short_status(rule))?;
    let message = ready["message"].as_str().unwrap_or_default();
    if ready["status"] == "False"
        && ready["reason"] == reason
        && words.iter().all(|w| message.contains(w))
    {
        Ok(())
    } else {
        Err(short_status(rule))
    }
}

/// Ready True at the current generation, with these `sources` and `copies`.
fn ready_with(rule: &Value, sources: u64, copies: u64) -> Result<(), String> {
    is_ready(rule)?;
    let seen = (
        status_u64(rule, "sources").unwrap_or(0),
        status_u64(rule, "copies").unwrap_or(0),
    );
    if seen == (sources, copies) {
        Ok(())
    } else {
        Err(format!(
            "sources and copies {seen:?}, want {:?}: {}",
            (sources, copies),
            short_status(rule)
        ))
    }
}

/// The (namespace, name) of every entry of `status.refusedSources`, and
/// `status.refusedSourceCount`.
fn refused_sources(rule: &Value) -> (Vec<(String, String)>, u64) {
    let listed = rule
        .pointer("/status/refusedSources")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["namespace"].as_str().unwrap_or_default().to_string(),
                        e["name"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (listed, status_u64(rule, "refusedSourceCount").unwrap_or(0))
}

/// The value of the gauge `copyrator_kind_watches` the operator serves (the
/// sum of its series; 0 when the family is declared without any).
async fn kind_watches(operator: &Operator) -> Result<f64, String> {
    match http_get(operator.port, "/metrics").await? {
        (200, text) => match metric_family(&text, KIND_WATCHES) {
            Some(n) => Ok(n),
            None if text
                .lines()
                .any(|l| l.starts_with(&format!("# TYPE {KIND_WATCHES} "))) =>
            {
                Ok(0.0)
            }
            None => Err(format!("no {KIND_WATCHES} on /metrics")),
        },
        (code, body) => Err(format!("/metrics answered {code}: {body}")),
    }
}

async fn wait_kind_watches(operator: &Operator, want: f64, why: &str) {
    wait_until(
        format!("{KIND_WATCHES} to be {want} ({why})"),
        TIMEOUT,
        async || match kind_watches(operator).await? {
            n if n == want => Ok(()),
            n => Err(format!("{KIND_WATCHES} {n}")),
        },
    )
    .await;
}

/// A source's `status` (set where the kind has no status subresource) is
/// no part of what copies carry.
fn no_status_carried(copy: &DynObj, source: &DynObj) -> Result<(), String> {
    let given = |o: &DynObj| {
        o.json
            .get("status")
            .and_then(Value::as_object)
            .is_some_and(|s| !s.is_empty())
    };
    if given(source) && given(copy) {
        Err(format!(
            "copy {}/{} carries a status: {}",
            copy.namespace(),
            copy.name(),
            copy.json["status"]
        ))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// one test per kind

/// What a kind's test varies.
struct KindCase {
    test: &'static str,
    ar: ApiResource,
    /// The operator's `--kinds`.
    kinds: &'static str,
    /// The source's top-level fields besides metadata.
    payload: Value,
    /// A JSON merge patch of the source that changes its payload.
    change: Value,
}

/// Two sources of the kind in the operator's namespace, a rule naming the
/// kind with `spec.objectType`, two target namespaces:
///
/// * each source is copied to both, with its payload, labels and
///   annotations and the tracking metadata; the rule is Ready with 2
///   sources and 4 copies; `copyrator_kind_watches` counts one kind more;
/// * a change of source `a` reaches both of its copies;
/// * `a` deleted: its copies are pruned, `b`'s stay;
/// * the rule deleted: its finalizer removes `b`'s copies, and the kind is
///   no longer watched.
async fn copies_follow_the_source(case: KindCase) {
    let KindCase {
        test,
        ar,
        kinds,
        payload,
        change,
    } = case;
    let t = TestNs::new(test).await;
    let op = t.ns("op").await;
    let targets = [t.ns("t1").await, t.ns("t2").await];
    let mut operator = Operator::start(&t, &op, &["--kinds", kinds]);
    operator.wait_ready().await;
    // A kind `--kinds` names is watched at start until it is clear that
    // no copy of a gone rule is left; with no rule, none stays watched.
    let watches_before = 0.0;
    wait_kind_watches(&operator, watches_before, "no rule yet").await;

    let labels = [("tier", "web")];
    let annotations = [("example.com/note", "carried to copies")];
    let mut sources = Vec::new();
    for name in ["a", "b"] {
        sources.push(
            t.create_dyn_source(&ar, &op, name, &labels, &annotations, payload.clone())
                .await,
        );
    }
    let mut spec = object_rule_spec(&ar, t.selector(), &[t.glob("t")]);
    if ar.group == "rbac.authorization.k8s.io" {
        spec = trusting_rbac_sources(spec);
    }
    t.create_rule(&op, "r", spec).await;
    for ns in &targets {
        for source in &sources {
            let copy = t.wait_dyn_copy(&ar, ns, source, &op, "r").await;
            no_status_carried(&copy, source).unwrap();
        }
    }
    t.wait_rule(&op, "r", "Ready, 2 sources, 4 copies", |r| {
        ready_with(r, 2, 4)
    })
    .await;
    wait_kind_watches(&operator, watches_before + 1.0, "a rule needs the kind").await;

    // The source changes: both of its copies follow.
    let changed = t.patch_dyn(&ar, &op, "a", change.clone()).await;
    assert_ne!(
        changed.payload(),
        sources[0].payload(),
        "the test's change {change} does not change the payload"
    );
    for ns in &targets {
        t.wait_dyn_copy(&ar, ns, &changed, &op, "r").await;
    }

    // The source is deleted: its copies are pruned, the other's stay.
    t.delete_dyn(&ar, &op, "a").await;
    for ns in &targets {
        t.wait_dyn_gone(&ar, ns, "a", "its source is deleted").await;
    }
    t.wait_rule(&op, "r", "Ready, 1 source, 2 copies", |r| {
        ready_with(r, 1, 2)
    })
    .await;
    let rule_uid = t.rule_uid(&op, "r").await;
    for ns in &targets {
        let copy = t.must_get_dyn(&ar, ns, "b").await;
        check_dyn_copy(&copy, &sources[1], &op, "r", &rule_uid).unwrap();
    }

    // The rule is deleted: its finalizer removes its copies; no rule needs
    // the kind any more.
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "its finalizer has removed its copies")
        .await;
    for ns in &targets {
        t.wait_dyn_gone(&ar, ns, "b", "its rule is deleted").await;
    }
    wait_kind_watches(&operator, watches_before, "no rule needs the kind").await;
    operator.assert_running();
}

#[tokio::test]
async fn role_copies_follow_their_source() {
    copies_follow_the_source(KindCase {
        test: "kinds-role",
        ar: roles(),
        kinds: "Role.rbac.authorization.k8s.io",
        payload: json!({"rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
        ]}),
        change: json!({"rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        ]}),
    })
    .await;
}

/// Bound to ClusterRole `view`; `roleRef` is immutable, so `subjects` change.
#[tokio::test]
async fn role_binding_copies_follow_their_source() {
    copies_follow_the_source(KindCase {
        test: "kinds-rolebinding",
        ar: role_bindings(),
        kinds: "configmap,secret,RoleBinding.rbac.authorization.k8s.io",
        payload: json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "readers"}],
        }),
        change: json!({"subjects": [
            {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "readers"},
            {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "jane"},
        ]}),
    })
    .await;
}

/// A RoleBinding whose `roleRef` changes is a new object (the API server
/// never lets `roleRef` change, on the source as on a copy): the source is
/// deleted and made again bound to another role. The rule keeps copies of
/// gone sources (`prune: false`), so nothing but a recreate can bring the
/// new `roleRef` to the copies: each ends with it, and with a new UID.
#[tokio::test]
async fn a_role_binding_copy_whose_role_ref_changes_is_recreated() {
    let t = TestNs::new("kinds-roleref").await;
    let ar = role_bindings();
    let op = t.ns("op").await;
    let targets = [t.ns("t1").await, t.ns("t2").await];
    let mut operator = Operator::start(
        &t,
        &op,
        &[
            "--kinds",
            "configmap,secret,RoleBinding.rbac.authorization.k8s.io",
        ],
    );
    operator.wait_ready().await;
    let bound_to = |role: &str| {
        json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "readers"}],
        })
    };
    let viewers = t
        .create_dyn_source(&ar, &op, "readers", &[], &[], bound_to("view"))
        .await;
    t.create_rule(
        &op,
        "r",
        with(
            trusting_rbac_sources(object_rule_spec(&ar, t.selector(), &[t.glob("t")])),
            "/spec/prune",
            json!(false),
        ),
    )
    .await;
    let mut first = Vec::new();
    for ns in &targets {
        first.push(t.wait_dyn_copy(&ar, ns, &viewers, &op, "r").await);
    }

    t.delete_dyn(&ar, &op, "readers").await;
    let editors = t
        .create_dyn_source(&ar, &op, "readers", &[], &[], bound_to("edit"))
        .await;
    for (ns, before) in targets.iter().zip(&first) {
        let after = t.wait_dyn_copy(&ar, ns, &editors, &op, "r").await;
        assert_eq!(after.json["roleRef"]["name"], "edit", "copy {ns}/readers");
        assert_ne!(
            after.uid(),
            before.uid(),
            "copy {ns}/readers has the new roleRef but was not made again"
        );
    }
    t.wait_rule(&op, "r", "Ready, 1 source, 2 copies", |r| {
        ready_with(r, 1, 2)
    })
    .await;
    operator.assert_running();
}

/// A core kind, named bare in `--kinds`.
#[tokio::test]
async fn service_account_copies_follow_their_source() {
    copies_follow_the_source(KindCase {
        test: "kinds-serviceaccount",
        ar: service_accounts(),
        kinds: "ServiceAccount",
        payload: json!({
            "automountServiceAccountToken": false,
            "imagePullSecrets": [{"name": "registry"}],
        }),
        change: json!({
            "automountServiceAccountToken": true,
            "imagePullSecrets": [{"name": "registry"}, {"name": "mirror"}],
        }),
    })
    .await;
}

/// Enabled by `*`.
#[tokio::test]
async fn network_policy_copies_follow_their_source() {
    copies_follow_the_source(KindCase {
        test: "kinds-networkpolicy",
        ar: network_policies(),
        kinds: "configmap,secret,*",
        payload: json!({"spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
        }}),
        change: json!({"spec": {
            "podSelector": {"matchLabels": {"app": "api"}},
            "ingress": [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8080}]}],
        }}),
    })
    .await;
}

/// A custom resource: `spec`, another top-level field, and a `status` that
/// copies do not carry.
#[tokio::test]
async fn custom_resource_copies_follow_their_source() {
    let client = Client::try_default()
        .await
        .expect("a Kubernetes client from KUBECONFIG");
    ensure_widget_crd(&client).await;
    copies_follow_the_source(KindCase {
        test: "kinds-widget",
        ar: widgets(),
        kinds: "Widget.kinds.copyrator.test",
        payload: json!({
            "spec": {"size": 3, "tags": ["a", "b"], "nested": {"deep": {"on": true}}},
            "colour": "blue",
            "status": {"phase": "Made"},
        }),
        change: json!({"spec": {"size": 4, "nested": {"deep": {"on": false}}}, "colour": "green"}),
    })
    .await;
}

// ---------------------------------------------------------------------------
// kinds that are not copied

/// One operator enables every kind not denied (`*`), another the default
/// kinds only. Rules naming a denied kind (Pod, and CopyratorRule, always
/// denied), a cluster-scoped kind, a kind no API serves, and a kind the
/// operator does not enable are each Ready=False with their reason, and
/// copy nothing; each operator's ConfigMap rule still copies, and both keep
/// running.
#[tokio::test]
async fn kinds_not_copied_are_reported_and_other_rules_still_copy() {
    let t = TestNs::new("kinds-reported").await;
    let wide = t.ns("op-wide").await;
    let plain = t.ns("op-plain").await;
    let t1 = t.ns("t1").await;
    let include = [t.glob("t")];
    let reported = [
        (&wide, "pod", "v1", "Pod", "DeniedKind"),
        (
            &wide,
            "rules",
            "flant.com/v1",
            "CopyratorRule",
            "DeniedKind",
        ),
        (
            &wide,
            "clusterrole",
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "ClusterScopedKind",
        ),
        (&wide, "unknown", "example.com/v1", "Nope", "UnknownKind"),
        (
            &plain,
            "netpol",
            "networking.k8s.io/v1",
            "NetworkPolicy",
            "KindNotEnabled",
        ),
    ];
    for (ns, name, api_version, kind, _) in &reported {
        t.create_rule(
            ns,
            name,
            object_type_spec(api_version, kind, t.selector(), &include),
        )
        .await;
    }
    for ns in [&wide, &plain] {
        t.create_rule(ns, "cm", rule_spec(CM, t.selector(), &include))
            .await;
    }
    // A source the rule of a kind not enabled would copy.
    let policies = network_policies();
    t.create_dyn_source(
        &policies,
        &plain,
        "deny",
        &[],
        &[],
        json!({"spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
    )
    .await;
    let mut wide_operator = Operator::start(&t, &wide, &["--kinds", "configmap,secret,*"]);
    let mut plain_operator = Operator::start(&t, &plain, &[]);

    for (ns, name, api_version, kind, reason) in &reported {
        t.wait_rule(
            ns,
            name,
            &format!("Ready False, reason {reason} ({kind}.{api_version})"),
            |r| not_ready_because(r, reason),
        )
        .await;
    }
    for (ns, name) in [(&wide, "cfg-wide"), (&plain, "cfg-plain")] {
        let source = t.create_source(CM, ns, name, &[], &[("k", "v")]).await;
        t.wait_copy(CM, &t1, &source, ns, "cm").await;
        t.wait_rule_ready(ns, "cm").await;
    }
    t.assert_dyn_absent(
        &policies,
        &t1,
        "deny",
        "NetworkPolicy is not in the operator's --kinds",
    )
    .await;
    // Still reported so after the quiet period, and still running.
    for (ns, name, _, _, reason) in &reported {
        not_ready_because(&t.get_rule(ns, name).await, reason).unwrap();
    }
    wide_operator.assert_running();
    plain_operator.assert_running();
}

// ---------------------------------------------------------------------------
// admission

/// No operator runs: the API server alone decides. A rule with
/// `spec.objectType` alone is accepted (the control); with `ruleType` as
/// well, at the top level or in `spec`, or with an `objectType` missing
/// `kind` or `apiVersion`, or with either malformed, it is refused.
#[tokio::test]
async fn admission_refuses_rule_type_with_object_type_and_a_malformed_object_type() {
    let t = TestNs::new("kinds-admission").await;
    let ns = t.ns("op").await;
    let sel = t.selector();
    let object_type = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding"});
    t.create_rule(
        &ns,
        "alone",
        json!({"spec": {"objectType": object_type, "selector": sel}}),
    )
    .await;
    refused(
        &t,
        &ns,
        "top-level-rule-type",
        json!({"ruleType": "configmap", "selector": sel, "spec": {"objectType": object_type}}),
        &["objectType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "spec-rule-type",
        json!({"spec": {"ruleType": "secret", "objectType": object_type, "selector": sel}}),
        &["objectType"],
    )
    .await;
    refused(
        &t,
        &ns,
        "missing-one",
        json!({"spec": {"objectType": {"apiVersion": "rbac.authorization.k8s.io/v1"}, "selector": sel}}),
        &["objectType", "kind"],
    )
    .await;
    refused(
        &t,
        &ns,
        "missing-other",
        json!({"spec": {"objectType": {"kind": "RoleBinding"}, "selector": sel}}),
        &["objectType", "apiVersion"],
    )
    .await;
    refused(
        &t,
        &ns,
        "bad-api-version",
        json!({"spec": {"objectType": {"apiVersion": "rbac/v1/extra", "kind": "RoleBinding"}, "selector": sel}}),
        &["objectType.apiVersion", "group/version"],
    )
    .await;
    refused(
        &t,
        &ns,
        "bad-kind",
        json!({"spec": {"objectType": {"apiVersion": "v1", "kind": "Role Binding"}, "selector": sel}}),
        &["objectType.kind", "kind name"],
    )
    .await;
}

// ---------------------------------------------------------------------------
// sources owned by a controller

/// Three Roles match: `free` (no owner), `referenced` (an ownerReference
/// that is not its controller) and `owned` (an ownerReference with
/// `controller: true`, to a real ConfigMap of the same namespace). The
/// first two are copied (without the ownerReference); `owned` is not, and
/// is listed in `status.refusedSources`. Once its ownerReference is
/// removed, it is copied and no longer listed.
#[tokio::test]
async fn a_controller_owned_source_is_refused_and_listed_while_its_siblings_are_copied() {
    let t = TestNs::new("kinds-owned").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let ar = roles();
    let owner = t.create_plain(CM, &op, "owner", &[], &[]).await;
    let owner_reference = |controller: bool| {
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid,
                "controller": controller}])
    };
    let labels = t.selector();
    let rules = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]);
    let role = |owners: Option<Value>| {
        let mut body = json!({"metadata": {"labels": labels}, "rules": rules});
        if let Some(owners) = owners {
            body["metadata"]["ownerReferences"] = owners;
        }
        body
    };
    let free = t.create_dyn(&ar, &op, "free", role(None)).await;
    let referenced = t
        .create_dyn(&ar, &op, "referenced", role(Some(owner_reference(false))))
        .await;
    t.create_dyn(&ar, &op, "owned", role(Some(owner_reference(true))))
        .await;
    t.create_rule(
        &op,
        "r",
        trusting_rbac_sources(object_rule_spec(&ar, t.selector(), &[t.glob("t")])),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--kinds", "Role.rbac.authorization.k8s.io"]);

    t.wait_dyn_copy(&ar, &t1, &free, &op, "r").await;
    t.wait_dyn_copy(&ar, &t1, &referenced, &op, "r").await;
    let rule = t
        .wait_rule(
            &op,
            "r",
            "the owned source in refusedSources",
            |r| match refused_sources(r) {
                (listed, 1) if listed == [(op.clone(), "owned".to_string())] => Ok(()),
                seen => Err(format!("refused sources {seen:?}: {}", short_status(r))),
            },
        )
        .await;
    let reason = rule["status"]["refusedSources"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !reason.is_empty(),
        "the refused source has no reason: {}",
        rule["status"]
    );
    t.assert_dyn_absent(&ar, &t1, "owned", "its controller owns it")
        .await;

    // No longer owned: copied like the others.
    let released = t
        .patch_dyn(
            &ar,
            &op,
            "owned",
            json!({"metadata": {"ownerReferences": null}}),
        )
        .await;
    assert_eq!(released.owner_references(), 0);
    t.wait_dyn_copy(&ar, &t1, &released, &op, "r").await;
    t.wait_rule(&op, "r", "no refused source", |r| {
        match refused_sources(r) {
            (listed, 0) if listed.is_empty() => Ok(()),
            seen => Err(format!("refused sources {seen:?}: {}", short_status(r))),
        }
    })
    .await;
}

// ---------------------------------------------------------------------------
// RBAC escalation

/// What the operator may do here: every verb on the kinds it copies
/// (ConfigMaps, Secrets, RoleBindings), and what it needs besides (list
/// and watch on Roles, which RoleBinding copies are judged by); not
/// `bind` or `escalate`, and none of ClusterRole `admin`'s other grants.
fn restricted_grants() -> BTreeSet<Grant> {
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    grants_of(&json!({"rules": [
        {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": all},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": all},
        // RoleBinding copies are judged by the Roles they bind.
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["flant.com"], "resources": ["copyrators"],
         "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": ["flant.com"], "resources": ["copyrators/status"], "verbs": ["patch", "update"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]}))
}

/// The operator runs as a ServiceAccount of the test's own with
/// [`restricted_grants`]. A RoleBinding to a ClusterRole whose grants the
/// operator holds is copied (the control); one to ClusterRole `admin`,
/// whose grants it does not hold, is refused by the API server's escalation
/// prevention: its rule is Ready=False, reason SyncFailed, with a message
/// that says RBAC escalation, and no copy exists.
#[tokio::test]
async fn a_role_binding_the_operator_may_not_grant_fails_as_rbac_escalation() {
    let t = TestNs::new("kinds-escalation").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let ar = role_bindings();
    let bindable = format!("{}-bindable", t.prefix);
    cluster
        .create(
            &t.client,
            &cluster_roles(),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": bindable},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
            }),
        )
        .await;
    let granted = restricted_grants();
    let denied: BTreeSet<Grant> = [
        Grant::new("rbac.authorization.k8s.io", "clusterroles", "bind"),
        Grant::new("rbac.authorization.k8s.io", "clusterroles", "escalate"),
        Grant::new("rbac.authorization.k8s.io", "roles", "bind"),
        Grant::new("", "pods", "get"),
        Grant::new("apps", "deployments", "create"),
    ]
    .into_iter()
    .collect();
    let id = Identity::create(&t, &cluster, &op, "copyrator", &granted, &BTreeSet::new()).await;
    id.wait_effective(&t.client, &op, &granted, &denied).await;
    id.wait_effective(&t.client, &t1, &BTreeSet::new(), &denied)
        .await;

    let binding = |cluster_role: &str| {
        json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "team"}],
        })
    };
    let readers = t
        .create_dyn_source(
            &ar,
            &op,
            "readers",
            &[("which", "readers")],
            &[],
            binding(&bindable),
        )
        .await;
    t.create_dyn_source(
        &ar,
        &op,
        "admins",
        &[("which", "admins")],
        &[],
        binding("admin"),
    )
    .await;
    let which = |w: &str| json!({TEST_LABEL: t.prefix, "which": w});
    t.create_rule(
        &op,
        "readers",
        trusting_rbac_sources(object_rule_spec(&ar, which("readers"), &[t.glob("t")])),
    )
    .await;
    t.create_rule(
        &op,
        "admins",
        trusting_rbac_sources(object_rule_spec(&ar, which("admins"), &[t.glob("t")])),
    )
    .await;
    let mut operator = Operator::start_with_env(
        &t,
        vec![
            "run".into(),
            "--namespace".into(),
            op.clone(),
            "--log-level".into(),
            "info".into(),
            "--kinds".into(),
            "configmap,secret,RoleBinding.rbac.authorization.k8s.io".into(),
        ],
        &[("KUBECONFIG", &id.kubeconfig)],
    );

    t.wait_dyn_copy(&ar, &t1, &readers, &op, "readers").await;
    t.wait_rule_ready(&op, "readers").await;
    t.wait_rule(
        &op,
        "admins",
        "Ready False, reason SyncFailed, saying RBAC escalation",
        |r| not_ready_saying(r, "SyncFailed", &["RBAC escalation"]),
    )
    .await;
    t.assert_dyn_absent(
        &ar,
        &t1,
        "admins",
        "the operator may not grant what ClusterRole admin grants",
    )
    .await;
    operator.assert_running();
}

/// The conflict `r` lists at `namespace/name`, if any: its reason.
fn conflict_at(rule: &Value, namespace: &str, name: &str) -> Option<String> {
    rule["status"]["conflicts"]
        .as_array()?
        .iter()
        .find(|c| c["namespace"] == namespace && c["name"] == name)
        .map(|c| c["reason"].as_str().unwrap_or_default().to_owned())
}

/// A RoleBinding copy follows the Roles it binds, in the target and in
/// the source namespace: a binding to the Role `reader` is copied into
/// `t1`, whose `reader` grants the same, and not into `t2`, which has
/// none (listed with why); `t2`'s `reader` made the same: copied there;
/// `t1`'s changed: its copy is deleted; the source's changed to match
/// `t1`'s: copied into `t1` again, and deleted from `t2`, which differs now.
#[tokio::test]
async fn a_role_binding_copy_follows_the_roles_it_binds() {
    let t = TestNs::new("kinds-bound-role").await;
    let op = t.ns("op").await;
    let (t1, t2) = (t.ns("t1").await, t.ns("t2").await);
    let (roles, ar) = (roles(), role_bindings());
    let reads = |verbs: &[&str]| json!({"rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs}]});
    t.create_dyn(&roles, &op, "reader", reads(&["get"])).await;
    t.create_dyn(&roles, &t1, "reader", reads(&["get"])).await;
    let source = t
        .create_dyn_source(
            &ar,
            &op,
            "readers",
            &[],
            &[],
            json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
                "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "readers"}],
            }),
        )
        .await;
    t.create_rule(
        &op,
        "r",
        trusting_rbac_sources(object_rule_spec(&ar, t.selector(), &[t.glob("t")])),
    )
    .await;
    let _operator = Operator::start(
        &t,
        &op,
        &[
            "--kinds",
            "configmap,secret,RoleBinding.rbac.authorization.k8s.io",
        ],
    );
    t.wait_dyn_copy(&ar, &t1, &source, &op, "r").await;
    let refused_in = |namespace: &str, why: &'static str| {
        let namespace = namespace.to_owned();
        move |r: &Value| match conflict_at(r, &namespace, "readers") {
            Some(reason) if reason.contains(why) => Ok(()),
            _ => Err(short_status(r)),
        }
    };
    t.wait_rule(&op, "r", "t2 refused", refused_in(&t2, "does not exist in"))
        .await;
    t.assert_dyn_absent(&ar, &t2, "readers", "t2 has no Role reader")
        .await;

    t.create_dyn(&roles, &t2, "reader", reads(&["get"])).await;
    t.wait_dyn_copy(&ar, &t2, &source, &op, "r").await;

    t.patch_dyn(&roles, &t1, "reader", reads(&["get", "list"]))
        .await;
    t.wait_dyn_gone(&ar, &t1, "readers", "t1's Role grants more now")
        .await;
    t.wait_rule(
        &op,
        "r",
        "t1 refused",
        refused_in(&t1, "grants other rules"),
    )
    .await;

    t.patch_dyn(&roles, &op, "reader", reads(&["list", "get"]))
        .await;
    t.wait_dyn_copy(&ar, &t1, &source, &op, "r").await;
    t.wait_dyn_gone(
        &ar,
        &t2,
        "readers",
        "t2's Role grants less than the source's now",
    )
    .await;
    t.wait_rule(
        &op,
        "r",
        "t2 refused",
        refused_in(&t2, "grants other rules"),
    )
    .await;
}

/// A rule that copied RoleBindings and then no longer trusts its sources
/// (as a rule written before `rbacSourcesTrusted` existed reads after an
/// upgrade) reads `RBACSourcesNotTrusted` and keeps its copies as they
/// are, also across a restart of an operator that copies every kind (no
/// watch of RoleBindings runs for it then); deleted, it removes them.
#[tokio::test]
async fn a_rule_that_stops_trusting_its_sources_keeps_its_copies_until_deleted() {
    let t = TestNs::new("kinds-untrusted").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let ar = role_bindings();
    let source = t
        .create_dyn_source(
            &ar,
            &op,
            "viewers",
            &[],
            &[],
            json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "team"}],
            }),
        )
        .await;
    t.create_rule(
        &op,
        "r",
        trusting_rbac_sources(object_rule_spec(&ar, t.selector(), &[&t1])),
    )
    .await;
    let every_kind = ["--kinds", "configmap,secret,*"];
    let mut operator = Operator::start(&t, &op, &every_kind);
    let copy = t.wait_dyn_copy(&ar, &t1, &source, &op, "r").await;
    t.patch_rule(&op, "r", json!({"spec": {"rbacSourcesTrusted": false}}))
        .await;
    t.wait_rule(&op, "r", "RBACSourcesNotTrusted", |r| {
        not_ready_because(r, "RBACSourcesNotTrusted")
    })
    .await;
    operator.stop();
    let mut operator = Operator::start(&t, &op, &every_kind);
    operator.wait_ready().await;
    t.assert_dyn_unchanged(
        &ar,
        &t1,
        "viewers",
        copy.resource_version(),
        "a rule that no longer trusts its sources changes nothing",
    )
    .await;
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "its finalizer has removed its copies")
        .await;
    t.wait_dyn_gone(&ar, &t1, "viewers", "its rule is deleted")
        .await;
    operator.assert_running();
}

/// An operator that may copy RoleBindings but not list and watch Roles
/// cannot judge a copy by the Role it binds: the rule reads `Forbidden`,
/// naming roles, and nothing is copied (no watch is left failing).
#[tokio::test]
async fn an_operator_that_may_not_watch_roles_copies_no_role_binding() {
    let t = TestNs::new("kinds-no-roles").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let ar = role_bindings();
    let without_roles: BTreeSet<Grant> = restricted_grants()
        .into_iter()
        .filter(|g| g.resource != "roles")
        .collect();
    let roles_denied: BTreeSet<Grant> = ["list", "watch"]
        .into_iter()
        .map(|verb| Grant::new("rbac.authorization.k8s.io", "roles", verb))
        .collect();
    let id = Identity::create(
        &t,
        &cluster,
        &op,
        "copyrator",
        &without_roles,
        &BTreeSet::new(),
    )
    .await;
    id.wait_effective(&t.client, &op, &without_roles, &roles_denied)
        .await;
    t.create_dyn_source(
        &ar,
        &op,
        "viewers",
        &[],
        &[],
        json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "team"}],
        }),
    )
    .await;
    t.create_rule(
        &op,
        "r",
        trusting_rbac_sources(object_rule_spec(&ar, t.selector(), &[&t1])),
    )
    .await;
    let mut operator = Operator::start_with_env(
        &t,
        [
            "run",
            "--namespace",
            &op,
            "--kinds",
            "configmap,secret,RoleBinding.rbac.authorization.k8s.io",
        ]
        .map(String::from)
        .to_vec(),
        &[("KUBECONFIG", &id.kubeconfig)],
    );
    t.wait_rule(&op, "r", "Ready False, Forbidden, naming roles", |r| {
        not_ready_saying(r, "Forbidden", &["list roles", "watch roles"])
    })
    .await;
    t.assert_dyn_absent(&ar, &t1, "viewers", "the Roles cannot be watched")
        .await;
    operator.assert_running();
}

// ---------------------------------------------------------------------------
// syncPolicy: CreateOnly

/// The NetworkPolicy default-deny copied once (docs/kinds.md): rule `once`
/// (CreateOnly) fills `once1`, rule `sync` (Sync) fills `sync1` from the
/// same source, as a witness that each change was seen. The copy made once
/// carries the label that hands it over; an edit of it stays, a change of
/// the source does not reach it, and it stays when the source is deleted.
#[tokio::test]
async fn create_only_network_policy_is_copied_once_and_left_to_its_namespace() {
    let t = TestNs::new("kinds-once").await;
    let op = t.ns("op").await;
    let once = t.ns("once1").await;
    let synced = t.ns("sync1").await;
    let ar = network_policies();
    t.create_rule(
        &op,
        "once",
        with(
            object_rule_spec(&ar, t.selector(), &[t.glob("once")]),
            "/spec/syncPolicy",
            json!("CreateOnly"),
        ),
    )
    .await;
    t.create_rule(
        &op,
        "sync",
        object_rule_spec(&ar, t.selector(), &[t.glob("sync")]),
    )
    .await;
    let _operator = Operator::start(&t, &op, &["--kinds", "NetworkPolicy.networking.k8s.io"]);
    let source = t
        .create_dyn_source(
            &ar,
            &op,
            "default-deny",
            &[],
            &[],
            json!({"spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}),
        )
        .await;
    let once_uid = t.rule_uid(&op, "once").await;
    let copy = t
        .wait_dyn(
            &ar,
            &once,
            "default-deny",
            "a copy handed over (CreateOnly)",
            |o| {
                check_dyn_copy(o, &source, &op, "once", &once_uid)?;
                match o.label(LABEL_SYNC_POLICY) {
                    Some("CreateOnly") => Ok(()),
                    other => Err(format!("label {LABEL_SYNC_POLICY}={other:?}")),
                }
            },
        )
        .await;
    let sync_copy = t.wait_dyn_copy(&ar, &synced, &source, &op, "sync").await;
    assert_eq!(
        sync_copy.label(LABEL_SYNC_POLICY),
        None,
        "a Sync copy is not handed over"
    );
    assert_eq!(copy.payload(), source.payload());

    // Both copies edited by hand (egress allowed again): the Sync copy is
    // put back, the other stays as edited.
    let allow_egress = json!({"spec": {"policyTypes": ["Ingress"]}});
    let edited = t
        .patch_dyn(&ar, &once, "default-deny", allow_egress.clone())
        .await;
    t.patch_dyn(&ar, &synced, "default-deny", allow_egress)
        .await;
    t.wait_dyn_copy(&ar, &synced, &source, &op, "sync").await;
    t.assert_dyn_unchanged(
        &ar,
        &once,
        "default-deny",
        edited.resource_version(),
        "a copy handed over is not restored",
    )
    .await;
    assert_eq!(edited.json["spec"]["policyTypes"], json!(["Ingress"]));

    // The source changes: the Sync copy follows, the other does not.
    let source = t
        .patch_dyn(
            &ar,
            &op,
            "default-deny",
            json!({"spec": {"podSelector": {"matchLabels": {"app": "web"}}}}),
        )
        .await;
    t.wait_dyn_copy(&ar, &synced, &source, &op, "sync").await;
    t.assert_dyn_unchanged(
        &ar,
        &once,
        "default-deny",
        edited.resource_version(),
        "a copy handed over is not updated",
    )
    .await;

    // The source is deleted: the Sync copy is pruned, the other stays.
    t.delete_dyn(&ar, &op, "default-deny").await;
    t.wait_dyn_gone(&ar, &synced, "default-deny", "its source is gone")
        .await;
    t.assert_dyn_unchanged(
        &ar,
        &once,
        "default-deny",
        edited.resource_version(),
        "a copy handed over is never pruned",
    )
    .await;
    t.wait_rule(&op, "once", "no source, one copy handed over", |r| {
        is_ready(r)?;
        match status_u64(r, "createOnlyCopies") {
            Some(1) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
}

/// A rule of a kind named by `objectType` force-deleted (its finalizer
/// removed) while no operator ran leaves copies nobody owns: an operator
/// whose `--kinds` names the kind watches it from the start, collects
/// them, and then stops watching it.
#[tokio::test]
async fn copies_of_a_force_deleted_rule_of_another_kind_are_collected_at_start() {
    let t = TestNs::new("kinds-orphans").await;
    let op = t.ns("op").await;
    let targets = [t.ns("t1").await, t.ns("t2").await];
    let ar = roles();
    let kinds = ["--kinds", "configmap,secret,Role.rbac.authorization.k8s.io"];
    let mut operator = Operator::start(&t, &op, &kinds);
    operator.wait_ready().await;
    let source = t
        .create_dyn_source(
            &ar,
            &op,
            "reader",
            &[],
            &[],
            json!({"rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
        )
        .await;
    t.create_rule(
        &op,
        "r",
        trusting_rbac_sources(object_rule_spec(&ar, t.selector(), &[t.glob("t")])),
    )
    .await;
    for ns in &targets {
        t.wait_dyn(&ar, ns, "reader", "a copy of the Role", |o| {
            if o.payload() == source.payload() {
                Ok(())
            } else {
                Err(format!("payload {:?}", o.payload()))
            }
        })
        .await;
    }
    operator.crash();
    t.patch_rule(&op, "r", json!({"metadata": {"finalizers": null}}))
        .await;
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "force-deleted").await;
    for ns in &targets {
        assert!(
            matches!(t.try_get_dyn(&ar, ns, "reader").await, Ok(Some(_))),
            "the copy in {ns} outlives the force-deleted rule while no operator runs"
        );
    }

    let restarted = Operator::start(&t, &op, &kinds);
    for ns in &targets {
        t.wait_dyn_gone(&ar, ns, "reader", "its rule is gone").await;
    }
    wait_kind_watches(&restarted, 0.0, "the orphans are collected").await;
}

/// A kind whose CustomResourceDefinition is deleted while its copies are
/// watched: the watch stops, the rule reads `UnknownKind`, and the operator
/// stays healthy (a watch failing for good would fail its liveness probe,
/// here after 5 s), with no restart. Once the CRD is back, the rule finds
/// the kind again (it looks every 30 s) and copies anew.
#[tokio::test]
async fn a_kind_whose_crd_goes_reads_unknown_kind_and_recovers_without_a_restart() {
    let t = TestNs::new("kinds-crd-gone").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let group = format!("{}.copyrator.test", t.prefix);
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&group, "v1", "Gizmo"), "gizmos");
    let mut crd = widget_crd();
    crd["metadata"]["name"] = json!(format!("gizmos.{group}"));
    crd["spec"]["group"] = json!(group);
    crd["spec"]["names"] =
        json!({"kind": "Gizmo", "listKind": "GizmoList", "plural": "gizmos", "singular": "gizmo"});
    let cluster = ClusterObjects::new();
    let crds = ApiResource::erase::<CustomResourceDefinition>(&());
    let install = async || {
        cluster.create(&t.client, &crds, crd.clone()).await;
        apply_crd(t.client.clone(), &crd, &ar).await;
    };
    install().await;
    let mut operator = Operator::start(&t, &op, &["--kinds", "*", "--stuck-after", "5"]);
    operator.wait_ready().await;
    let payload = json!({"spec": {"size": 1}, "colour": "red"});
    t.create_dyn_source(&ar, &op, "g", &[], &[], payload.clone())
        .await;
    t.create_rule(
        &op,
        "r",
        object_rule_spec(&ar, t.selector(), std::slice::from_ref(&t1)),
    )
    .await;
    t.wait_dyn(&ar, &t1, "g", "the Gizmo's copy", |_| Ok(()))
        .await;
    t.wait_rule(&op, "r", "Ready with 1 copy", |r| ready_with(r, 1, 1))
        .await;

    cluster
        .delete(&t.client, &crds, &format!("gizmos.{group}"))
        .await;
    t.wait_rule(&op, "r", "UnknownKind once the CRD is gone", |r| {
        not_ready_saying(r, "UnknownKind", &["Gizmo"])
    })
    .await;
    // Longer than --stuck-after: a watch still failing would show by now.
    assert_for(
        "the operator stays healthy without its CRD",
        Duration::from_secs(8),
        async || match http_get(operator.port, "/healthz").await {
            Ok((200, _)) => Ok(()),
            Ok((code, body)) => Err(format!("/healthz answers {code}: {body}")),
            Err(e) => Err(e),
        },
    )
    .await;
    operator.assert_running();

    let crd_api: Api<CustomResourceDefinition> = Api::all(t.client.clone());
    wait_until("the CRD gone", TIMEOUT, async || {
        match crd_api.get_opt(&format!("gizmos.{group}")).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there (its objects are being deleted)".into()),
            Err(e) => Err(err_msg(&e)),
        }
    })
    .await;
    install().await;
    t.create_dyn_source(&ar, &op, "g", &[], &[], payload).await;
    wait_until(
        "the copy back once the CRD is (the rule looks every 30 s)",
        Duration::from_secs(90),
        async || match t.try_get_dyn(&ar, &t1, "g").await? {
            Some(_) => Ok(()),
            None => Err("no copy in t1".into()),
        },
    )
    .await;
    t.wait_rule(&op, "r", "Ready with 1 copy again", |r| ready_with(r, 1, 1))
        .await;
    operator.assert_running();
}

/// Under `--all-namespaces`, a rule outside the operator's namespace (a
/// tenant's) copies ConfigMaps and Secrets only: consent is given per
/// namespace, not per kind, so a Role copied where a namespace accepted
/// ConfigMaps would grant what it never agreed to. The same rule in the
/// operator's namespace copies the Role.
#[tokio::test]
async fn a_tenant_rule_may_not_copy_another_kind() {
    // The rule's name, unique to the test, keeps the operator to its rules.
    let t = TestNs::new("kinds-tenant").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let tenant = t.ns("tenant").await;
    let t1 = t.ns("t1").await;
    let ar = roles();
    let payload =
        json!({"rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]});
    t.create_dyn_source(&ar, &tenant, "reader", &[], &[], payload.clone())
        .await;
    t.create_dyn_source(&ar, &op, "op-reader", &[], &[], payload)
        .await;
    // t1 accepts copies from the tenant: the kind alone refuses them.
    t.namespaces()
        .patch(
            &t1,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                "copyrator.flant.com/accept-from": tenant,
            }}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating namespace {t1}: {}", err_msg(&e)));
    // Trusting the sources makes no tenant rule copy a Role.
    let spec = trusting_rbac_sources(object_rule_spec(&ar, t.selector(), &[t.glob("t")]));
    t.create_rule(&tenant, &rule, spec.clone()).await;
    t.create_rule(&op, &rule, spec).await;
    let _operator = Operator::start(
        &t,
        &op,
        &[
            "--all-namespaces",
            "--rule-name",
            &rule,
            "--kinds",
            "configmap,secret,*",
        ],
    );
    t.wait_rule(&tenant, &rule, "Ready False, Forbidden", |r| {
        not_ready_because(r, "Forbidden")
    })
    .await;
    t.wait_dyn(&ar, &t1, "op-reader", "the operator's rule's copy", |_| {
        Ok(())
    })
    .await;
    assert!(
        matches!(t.try_get_dyn(&ar, &t1, "reader").await, Ok(None)),
        "the tenant's Role was copied into {t1}"
    );
}
