//! What is never copied, where copies never go (a source's own namespace,
//! protected namespaces), what a copy carries and what it does not,
//! immutable objects, secrets out of logs, and rules only the operator can
//! judge.

use crate::common::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

#[tokio::test]
async fn service_account_token_and_helm_release_secrets_are_never_copied() {
    let t = TestNs::new("special-secrets").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let sas: Api<ServiceAccount> = Api::namespaced(t.client.clone(), &op);
    wait_until(
        format!("ServiceAccount {op}/default"),
        TIMEOUT,
        async || {
            sas.get_opt("default")
                .await
                .map_err(|e| err_msg(&e))?
                .map(|_| ())
                .ok_or("not yet".to_string())
        },
    )
    .await;
    let labels = json!({TEST_LABEL: t.prefix});
    t.create_json(SECRET, &op, "sa-token", json!({
        "metadata": {"labels": labels, "annotations": {"kubernetes.io/service-account.name": "default"}},
        "type": "kubernetes.io/service-account-token",
    }))
    .await;
    t.create_json(SECRET, &op, "sh.helm.release.v1.demo.v1", json!({
        "metadata": {"labels": {TEST_LABEL: t.prefix, "owner": "helm", "name": "demo", "version": "1"}},
        "type": "helm.sh/release.v1",
        "stringData": {"release": "H4sIAAAAAAAA"},
    }))
    .await;
    let _operator = Operator::start(&t, &op, &[]);
    let ok = t
        .create_source(SECRET, &op, "ordinary", &[], &[("k", "v")])
        .await;
    t.wait_copy(SECRET, &t1, &ok, &op, "r").await;
    assert_for(
        "no copy of the service-account-token or helm release Secret",
        QUIET,
        async || {
            for name in ["sa-token", "sh.helm.release.v1.demo.v1"] {
                if let Some(o) = t.try_get(SECRET, &t1, name).await? {
                    return Err(format!(
                        "{name} was copied: type {:?} labels {:?}",
                        o.type_, o.labels
                    ));
                }
            }
            Ok(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_copy_is_never_a_source() {
    let t = TestNs::new("copy-not-source").await;
    let op = t.ns("op").await;
    let src = t.ns("src").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    // Rule a: src -> t1. Rule b: t1 -> t2 with the same selector, which the
    // copies in t1 match (they carry the source's labels).
    let ra = with(
        rule_spec(CM, t.selector(), &[&t1]),
        "/spec/namespace",
        json!(src),
    );
    let rb = with(
        rule_spec(CM, t.selector(), &[&t2]),
        "/spec/namespace",
        json!(t1),
    );
    t.create_rule(&op, "a", ra).await;
    t.create_rule(&op, "b", rb).await;
    let _operator = Operator::start(&t, &op, &[]);
    let s = t
        .create_source(CM, &src, "from-src", &[], &[("k", "v")])
        .await;
    let own = t
        .create_source(CM, &t1, "own-of-t1", &[], &[("k", "w")])
        .await;
    t.wait_copy(CM, &t1, &s, &op, "a").await;
    t.wait_copy(CM, &t2, &own, &op, "b").await;
    t.assert_absent(CM, &t2, "from-src", "a copy is never a source")
        .await;
    let copy = t.must_get(CM, &t1, "from-src").await;
    assert_eq!(
        copy.label(LABEL_RULE_UID),
        Some(t.rule_uid(&op, "a").await.as_str()),
        "rule b took over the copy of rule a"
    );
    let rb = t.get_rule(&op, "b").await;
    assert_eq!(
        status_u64(&rb, "sources"),
        Some(1),
        "rule b counts a copy as a source: {}",
        rb["status"]
    );
}

#[tokio::test]
async fn a_source_is_never_copied_onto_its_own_namespace() {
    let t = TestNs::new("not-onto-itself").await;
    let op = t.ns("op").await;
    let src = t.ns("src").await;
    let t1 = t.ns("t1").await;
    // include matches every namespace of the test, the source's own included.
    let spec = with(
        rule_spec(CM, t.selector(), &[t.glob("")]),
        "/spec/namespace",
        json!(src),
    );
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &[]);
    let s = t.create_source(CM, &src, "s", &[], &[("k", "v")]).await;
    t.wait_copy(CM, &t1, &s, &op, "r").await;
    assert!(
        t.get(CM, &op, "s").await.is_none(),
        "the operator's own namespace is protected from globs"
    );
    t.assert_unchanged(
        CM,
        &src,
        "s",
        &s.resource_version,
        "the source namespace is never a target",
    )
    .await;
    let now = t.must_get(CM, &src, "s").await;
    assert!(
        !now.is_copy() && now.label(LABEL_MANAGED_BY).is_none(),
        "the source was turned into a copy: {now:?}"
    );
    assert!(
        !now.managers.iter().any(|m| m == FIELD_MANAGER),
        "copyrator wrote the source: {:?}",
        now.managed_fields
    );
    let rule = t
        .wait_rule(
            &op,
            "r",
            "Ready with 1 target namespace, 1 protected",
            |r| {
                is_ready(r)?;
                if status_u64(r, "targetNamespaces") == Some(1)
                    && status_u64(r, "protectedNamespaces") == Some(1)
                {
                    Ok(())
                } else {
                    Err(short_status(r))
                }
            },
        )
        .await;
    let conflicts = rule
        .pointer("/status/conflicts")
        .cloned()
        .unwrap_or(Value::Null);
    let in_source_namespace = conflicts
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["namespace"] == src.as_str()));
    assert!(
        !in_source_namespace,
        "the source namespace is reported as a conflict: {conflicts}"
    );
}

/// Ready at the current generation, with `targets` target namespaces and
/// `protected` protected ones left out.
fn ready_counting(rule: &Value, targets: u64, protected: u64) -> Result<(), String> {
    is_ready(rule)?;
    let counts = (
        status_u64(rule, "targetNamespaces").unwrap_or(0),
        status_u64(rule, "protectedNamespaces").unwrap_or(0),
    );
    if counts == (targets, protected) {
        Ok(())
    } else {
        Err(format!(
            "targetNamespaces and protectedNamespaces {counts:?}, want {:?}: {}",
            (targets, protected),
            short_status(rule)
        ))
    }
}

/// `--protected-namespaces` names namespaces, by name or by glob, that no
/// glob, namespace selector or "all namespaces" default reaches: only an
/// exact name in `targets.include` does, and the status counts the others
/// in `protectedNamespaces`. The flag replaces the default list, so it
/// names the system namespaces again.
#[tokio::test]
async fn protected_namespaces_are_reached_only_by_their_exact_name() {
    let t = TestNs::new("protected-flag").await;
    let op = t.ns("op").await;
    let team = [("team", t.prefix.as_str())];
    let open = t.ns_labelled("open", &team).await;
    let vault = t.ns_labelled("vault", &team).await;
    let guard = t.ns_labelled("guard-1", &team).await;
    let protected = format!(
        "kube-system,kube-public,kube-node-lease,{vault},{}",
        t.glob("guard-")
    );
    let _operator = Operator::start(&t, &op, &["--protected-namespaces", &protected]);
    let route = |r: &str| json!({TEST_LABEL: t.prefix, "route": r});
    let by_glob = t
        .create_source(CM, &op, "by-glob", &[("route", "glob")], &[("k", "v")])
        .await;
    let by_selector = t
        .create_source(
            CM,
            &op,
            "by-selector",
            &[("route", "selector")],
            &[("k", "v")],
        )
        .await;
    // It reaches every namespace of the cluster: a name of the test's own,
    // and taken out of the namespaces that outlive the test should it fail
    // before the rule's finalizer does so.
    let everywhere_name = format!("{}-everywhere", t.prefix);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        t.cleanup_later(CM, ns, &everywhere_name);
    }
    let everywhere = t
        .create_source(
            CM,
            &op,
            &everywhere_name,
            &[("route", "everywhere")],
            &[("k", "v")],
        )
        .await;
    let by_name = t
        .create_source(CM, &op, "by-name", &[("route", "name")], &[("k", "v")])
        .await;
    t.create_rule(&op, "glob", rule_spec(CM, route("glob"), &[t.glob("")]))
        .await;
    t.create_rule(
        &op,
        "selector",
        json!({"spec": {"ruleType": "configmap", "selector": route("selector"),
            "targets": {"namespaceSelector": {"matchLabels": {"team": t.prefix}}}}}),
    )
    .await;
    t.create_rule(
        &op,
        "everywhere",
        json!({"spec": {"ruleType": "configmap", "selector": route("everywhere")}}),
    )
    .await;
    t.create_rule(
        &op,
        "named",
        rule_spec(CM, route("name"), &[&open, &vault, &guard]),
    )
    .await;

    // An exact name reaches both protected namespaces.
    for ns in [&open, &vault, &guard] {
        t.wait_copy(CM, ns, &by_name, &op, "named").await;
    }
    t.wait_rule(&op, "named", "Ready, 3 targets, none protected", |r| {
        ready_counting(r, 3, 0)
    })
    .await;
    // A glob and a selector reach the open namespace alone, and count both
    // protected ones (the operator's own namespace holds the sources, so it
    // is no target of theirs and not counted).
    for (rule, copy) in [("glob", &by_glob), ("selector", &by_selector)] {
        t.wait_copy(CM, &open, copy, &op, rule).await;
        t.wait_rule(&op, rule, "Ready, 1 target, 2 protected", |r| {
            ready_counting(r, 1, 2)
        })
        .await;
    }
    // No targets: every namespace of the cluster but the five protected.
    // (Not asked to be Ready: namespaces of tests running beside this one
    // come and go, and a write into one that is going may be refused.)
    t.wait_copy(CM, &open, &everywhere, &op, "everywhere").await;
    t.wait_rule(&op, "everywhere", "5 protected", |r| {
        match status_u64(r, "protectedNamespaces") {
            Some(5) => Ok(()),
            other => Err(format!(
                "protectedNamespaces {other:?}: {}",
                short_status(r)
            )),
        }
    })
    .await;
    let mut kept_out: Vec<(&str, &str)> = Vec::new();
    for ns in [&vault, &guard] {
        for copy in [&by_glob, &by_selector, &everywhere] {
            kept_out.push((ns, &copy.name));
        }
    }
    for ns in ["kube-system", "kube-public", "kube-node-lease"] {
        kept_out.push((ns, &everywhere.name));
    }
    assert_for("no copy in a protected namespace", QUIET, async || {
        for (ns, name) in &kept_out {
            if t.try_get(CM, ns, name).await?.is_some() {
                return Err(format!("a copy reached {ns}/{name}"));
            }
        }
        Ok(())
    })
    .await;

    // Its finalizer takes the copies out of every other namespace.
    t.delete_rule(&op, "everywhere").await;
    t.wait_rule_gone(&op, "everywhere", "its finalizer removes its copies")
        .await;
}

/// An Argo CD repository Secret copied into the namespace of another Argo
/// CD instance is a repository Secret there too: it keeps
/// `argocd.argoproj.io/secret-type` (what it is), so the instance finds
/// it as Argo CD does, by that label; it loses what says which
/// application tracks the source (the instance label, the tracking
/// annotation), so no Argo CD takes it for its own.
#[tokio::test]
async fn an_argo_cd_repository_secret_copy_is_one_too() {
    let t = TestNs::new("argocd-repo").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    t.create_json(
        SECRET,
        &op,
        "repo-platform",
        json!({
            "metadata": {
                "labels": {
                    TEST_LABEL: t.prefix,
                    "argocd.argoproj.io/secret-type": "repository",
                    "app.kubernetes.io/instance": "platform",
                    "argocd.argoproj.io/instance": "platform",
                },
                "annotations": {
                    "argocd.argoproj.io/tracking-id": "platform:/Secret:argocd/repo-platform",
                    "managed-by": "platform-team",
                },
            },
            "type": "Opaque",
            "stringData": {"type": "git", "url": "https://git.example.com/platform.git"},
        }),
    )
    .await;
    // As Argo CD finds its repositories: by the label, in its namespace.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(t.client.clone(), &t1);
    let repositories = ListParams::default().labels("argocd.argoproj.io/secret-type=repository");
    let found = wait_until(
        "a repository Secret in t1, found by its label",
        TIMEOUT,
        async || {
            let listed = secrets.list(&repositories).await.map_err(|e| err_msg(&e))?;
            match listed.items.as_slice() {
                [one] => Ok(one.clone()),
                other => Err(format!("{} found", other.len())),
            }
        },
    )
    .await;
    assert_eq!(found.metadata.name.as_deref(), Some("repo-platform"));
    let copy = t
        .wait_obj(SECRET, &t1, "repo-platform", "a copy", |o| {
            if o.is_copy() {
                Ok(())
            } else {
                Err(format!("{o:?}"))
            }
        })
        .await;
    copy.data_is(&[
        ("type", "git"),
        ("url", "https://git.example.com/platform.git"),
    ])
    .unwrap();
    for label in ["app.kubernetes.io/instance", "argocd.argoproj.io/instance"] {
        assert!(
            copy.label(label).is_none(),
            "{label} travelled: {:?}",
            copy.labels
        );
    }
    assert!(
        copy.annotation("argocd.argoproj.io/tracking-id").is_none(),
        "the tracking annotation travelled: {:?}",
        copy.annotations
    );
    assert_eq!(copy.annotation("managed-by"), Some("platform-team"));
}

#[tokio::test]
async fn tracking_and_server_metadata_are_not_carried() {
    let t = TestNs::new("tracking-stripped").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let owner = t.create_plain(CM, &op, "owner", &[], &[]).await;
    let _operator = Operator::start(
        &t,
        &op,
        &["--strip-keys", "example.com/*,audit.example.org/id"],
    );
    let s = t
        .create_json(CM, &op, "tracked", json!({
            "metadata": {
                "labels": {
                    TEST_LABEL: t.prefix,
                    "keep": "yes",
                    "app.kubernetes.io/instance": "release-x",
                    "helm.sh/chart": "chart-1.0.0",
                    "argocd.argoproj.io/instance": "app-x",
                    "app.kubernetes.io/managed-by": "Helm",
                    "kapp.k14s.io/app": "1700000000",
                    "kustomize.toolkit.fluxcd.io/name": "apps",
                    "helm.toolkit.fluxcd.io/name": "release-x",
                    "objectset.rio.cattle.io/hash": "abc",
                    "example.com/team": "a",
                },
                "annotations": {
                    "keep": "yes",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"v1\"}",
                    "argocd.argoproj.io/sync-wave": "1",
                    "argocd.argoproj.io/tracking-id": "app:/ConfigMap:x/tracked",
                    "meta.helm.sh/release-name": "release-x",
                    "meta.helm.sh/release-namespace": "x",
                    "kapp.k14s.io/identity": "v1;x/ConfigMap/tracked",
                    "kustomize.toolkit.fluxcd.io/checksum": "0",
                    "objectset.rio.cattle.io/applied": "x",
                    "config.kubernetes.io/origin": "path: cm.yaml",
                    "audit.example.org/id": "42",
                },
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid}],
            },
            "data": {"k": "v"},
        }))
        .await;
    let copy = t
        .wait_obj(CM, &t1, "tracked", "a copy", |o| {
            if o.is_copy() {
                Ok(())
            } else {
                Err(format!("{o:?}"))
            }
        })
        .await;
    copy.data_is(&[("k", "v")]).unwrap();
    assert_eq!(copy.label("keep"), Some("yes"), "{:?}", copy.labels);
    assert_eq!(
        copy.annotation("keep"),
        Some("yes"),
        "{:?}",
        copy.annotations
    );
    assert_eq!(
        copy.label(LABEL_MANAGED_BY),
        Some("copyrator"),
        "{:?}",
        copy.labels
    );
    for l in [
        "app.kubernetes.io/instance",
        "helm.sh/chart",
        "argocd.argoproj.io/instance",
        "kapp.k14s.io/app",
        "kustomize.toolkit.fluxcd.io/name",
        "helm.toolkit.fluxcd.io/name",
        "objectset.rio.cattle.io/hash",
        "example.com/team",
    ] {
        assert!(
            copy.label(l).is_none(),
            "label {l} carried to the copy: {:?}",
            copy.labels
        );
    }
    for a in [
        "kubectl.kubernetes.io/last-applied-configuration",
        "argocd.argoproj.io/sync-wave",
        "argocd.argoproj.io/tracking-id",
        "meta.helm.sh/release-name",
        "meta.helm.sh/release-namespace",
        "kapp.k14s.io/identity",
        "kustomize.toolkit.fluxcd.io/checksum",
        "objectset.rio.cattle.io/applied",
        "config.kubernetes.io/origin",
        "audit.example.org/id",
    ] {
        assert!(
            copy.annotation(a).is_none(),
            "annotation {a} carried to the copy: {:?}",
            copy.annotations
        );
    }
    assert_eq!(
        copy.owner_references, 0,
        "ownerReferences carried to the copy"
    );
    assert_ne!(copy.uid, s.uid);
    assert_eq!(copy.annotation(ANNOTATION_SOURCE_UID), Some(s.uid.as_str()));
    assert_eq!(
        copy.annotation(ANNOTATION_SOURCE),
        Some(format!("{op}/tracked").as_str())
    );
    assert_eq!(
        copy.annotation(ANNOTATION_RULE),
        Some(format!("{op}/r").as_str())
    );
}

#[tokio::test]
async fn transform_adds_and_strips_labels_and_annotations() {
    let t = TestNs::new("transform").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let spec = with(
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
        "/spec/transform",
        json!({
            "addLabels": {"added": "label"},
            "addAnnotations": {"example.com/added": "annotation"},
            "stripLabels": ["drop-me", "strip.example.com/*"],
            "stripAnnotations": ["drop.example.com/*", "secret-note"],
        }),
    );
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &[]);
    t.create_json(SECRET, &op, "s", json!({
        "metadata": {
            "labels": {TEST_LABEL: t.prefix, "keep": "1", "drop-me": "x", "strip.example.com/a": "x", "strip.example.com/b": "y"},
            "annotations": {"keep": "1", "drop.example.com/z": "x", "secret-note": "x"},
        },
        "stringData": {"k": "v"},
    }))
    .await;
    let copy = t
        .wait_obj(SECRET, &t1, "s", "a copy", |o| {
            if o.is_copy() {
                Ok(())
            } else {
                Err(format!("{o:?}"))
            }
        })
        .await;
    copy.data_is(&[("k", "v")]).unwrap();
    assert_eq!(copy.label("keep"), Some("1"), "{:?}", copy.labels);
    assert_eq!(
        copy.label("added"),
        Some("label"),
        "addLabels: {:?}",
        copy.labels
    );
    assert_eq!(
        copy.label(TEST_LABEL),
        Some(t.prefix.as_str()),
        "{:?}",
        copy.labels
    );
    for l in ["drop-me", "strip.example.com/a", "strip.example.com/b"] {
        assert!(
            copy.label(l).is_none(),
            "stripLabels left {l}: {:?}",
            copy.labels
        );
    }
    assert_eq!(copy.annotation("keep"), Some("1"), "{:?}", copy.annotations);
    assert_eq!(
        copy.annotation("example.com/added"),
        Some("annotation"),
        "addAnnotations: {:?}",
        copy.annotations
    );
    for a in ["drop.example.com/z", "secret-note"] {
        assert!(
            copy.annotation(a).is_none(),
            "stripAnnotations left {a}: {:?}",
            copy.annotations
        );
    }
    assert_eq!(copy.label(LABEL_MANAGED_BY), Some("copyrator"));
    assert!(copy.annotation(ANNOTATION_SOURCE_UID).is_some());
}

// --- immutable parts ------------------------------------------------------------

/// With prune false the copy outlives its source, so a source recreated with
/// other immutable parts meets the old copy: it must be deleted and recreated.
#[tokio::test]
async fn secret_type_change_recreates_the_copy() {
    let t = TestNs::new("secret-type").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let spec = with(
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
        "/spec/prune",
        json!(false),
    );
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &["--secret-types", "example.com/other"]);
    let old = t.create_source(SECRET, &op, "s", &[], &[("k", "v1")]).await;
    let old_copy = t.wait_copy(SECRET, &t1, &old, &op, "r").await;
    assert_eq!(old_copy.type_.as_deref(), Some("Opaque"));

    // A Secret's type cannot change: the source is recreated with another one.
    t.delete(SECRET, &op, "s").await;
    t.wait_gone(SECRET, &op, "s", "deleted by the test").await;
    let new = t
        .create_json(
            SECRET,
            &op,
            "s",
            json!({
                "metadata": {"labels": {TEST_LABEL: t.prefix}},
                "type": "example.com/other",
                "stringData": {"k": "v2"},
            }),
        )
        .await;
    let new_copy = t.wait_copy(SECRET, &t1, &new, &op, "r").await;
    assert_eq!(new_copy.type_.as_deref(), Some("example.com/other"));
    assert_ne!(
        new_copy.uid, old_copy.uid,
        "the copy's type changed without a new object?"
    );
}

#[tokio::test]
async fn immutable_configmap_copy_is_recreated_with_new_data() {
    let t = TestNs::new("immutable-cm").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let spec = with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/prune",
        json!(false),
    );
    t.create_rule(&op, "r", spec).await;
    let _operator = Operator::start(&t, &op, &[]);
    let body = |v: &str| json!({"metadata": {"labels": {TEST_LABEL: t.prefix}}, "immutable": true, "data": {"k": v}});
    let old = t.create_json(CM, &op, "frozen", body("v1")).await;
    let old_copy = t.wait_copy(CM, &t1, &old, &op, "r").await;
    assert_eq!(old_copy.immutable, Some(true));

    // An immutable source changes by being recreated.
    t.delete(CM, &op, "frozen").await;
    t.wait_gone(CM, &op, "frozen", "deleted by the test").await;
    let new = t.create_json(CM, &op, "frozen", body("v2")).await;
    let new_copy = t.wait_copy(CM, &t1, &new, &op, "r").await;
    new_copy.data_is(&[("k", "v2")]).unwrap();
    assert_eq!(new_copy.immutable, Some(true));
    assert_ne!(new_copy.uid, old_copy.uid);
}

/// The same with the default prune: true: the end state is the new data,
/// however the operator got there.
#[tokio::test]
async fn immutable_secret_recreated_quickly_ends_with_new_data() {
    let t = TestNs::new("immutable-secret").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    let body = |v: &str| json!({"metadata": {"labels": {TEST_LABEL: t.prefix}}, "immutable": true, "type": "Opaque", "stringData": {"k": v}});
    let old = t.create_json(SECRET, &op, "frozen", body("v1")).await;
    t.wait_copy(SECRET, &t1, &old, &op, "r").await;
    t.delete(SECRET, &op, "frozen").await;
    t.wait_gone(SECRET, &op, "frozen", "deleted by the test")
        .await;
    let new = t.create_json(SECRET, &op, "frozen", body("v2")).await;
    let copy = t.wait_copy(SECRET, &t1, &new, &op, "r").await;
    copy.data_is(&[("k", "v2")]).unwrap();
    assert_eq!(copy.immutable, Some(true));
}

// --- secret values never reach a log line, an event or a status --------------------

#[tokio::test]
async fn secret_values_never_reach_logs_events_or_status() {
    let t = TestNs::new("no-secret-logs").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let v1 = format!("hunter2-{}-first", random5());
    let v2 = format!("hunter2-{}-second", random5());
    // A foreign Secret in t2 makes a conflict (Warning event, status entry).
    t.create_plain(SECRET, &t2, "creds", &[], &[("password", "foreign")])
        .await;
    t.create_rule(&op, "r", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let mut operator = Operator::start(&t, &op, &["--log-level", "debug"]);
    let s = t
        .create_source(SECRET, &op, "creds", &[], &[("password", &v1)])
        .await;
    t.wait_copy(SECRET, &t1, &s, &op, "r").await;
    let s = t
        .set_data(SECRET, &op, "creds", &[("password", Some(&v2))])
        .await;
    t.wait_copy(SECRET, &t1, &s, &op, "r").await;
    t.wait_rule(&op, "r", "the conflict in status", |r| {
        if r.pointer("/status/conflicts")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty())
        {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
    // The copy is tampered with (put back), then the source goes (pruned).
    t.set_data(SECRET, &t1, "creds", &[("password", Some("tampered"))])
        .await;
    t.wait_copy(SECRET, &t1, &s, &op, "r").await;
    let status = t.get_rule(&op, "r").await["status"].to_string();
    t.delete(SECRET, &op, "creds").await;
    t.wait_gone(SECRET, &t1, "creds", "its source was deleted")
        .await;
    operator.stop();

    let logs = operator.logs();
    assert!(
        !logs.trim().is_empty(),
        "the operator logged nothing at debug level"
    );
    let mut events = String::new();
    for ns in [&op, &t1, &t2] {
        for e in Api::<k8s_openapi::api::events::v1::Event>::namespaced(t.client.clone(), ns)
            .list(&Default::default())
            .await
            .unwrap()
        {
            events.push_str(&serde_json::to_string(&e).unwrap());
        }
    }
    for value in [&v1, &v2] {
        for needle in secret_forms(value) {
            assert!(
                !logs.contains(&needle),
                "the secret value {value} (as {needle}) is in the operator log {}",
                operator.log_path.display()
            );
            assert!(
                !events.contains(&needle),
                "the secret value {value} (as {needle}) is in an event: {events}"
            );
            assert!(
                !status.contains(&needle),
                "the secret value {value} (as {needle}) is in the status: {status}"
            );
        }
    }
}

// --- invalid rules only the operator can judge --------------------------------------

/// Rules the structural schema cannot refuse but that cannot work (or would
/// select far too much). Each one the API server accepts must get Ready False
/// with a message and make no copy; one the schema refuses must name the field.
fn invalid_candidates(t: &TestNs) -> Vec<(&'static str, Value)> {
    let base = rule_spec(CM, t.selector(), &[t.glob("t")]);
    let selector = |s: Value| with(base.clone(), "/spec/selector", s);
    let ns_selector = |s: Value| with(base.clone(), "/spec/targets/namespaceSelector", s);
    vec![
        (
            "selector",
            selector(json!({"matchExpressions": [{"key": TEST_LABEL, "operator": "In"}]})),
        ),
        (
            "selector",
            selector(
                json!({"matchExpressions": [{"key": TEST_LABEL, "operator": "Sometimes", "values": ["x"]}]}),
            ),
        ),
        ("selector", selector(json!({"matchLabels": {}}))),
        ("selector", selector(json!({"matchExpressions": []}))),
        ("selector", selector(json!({TEST_LABEL: 1}))),
        ("selector", selector(json!({"bad key!": "x"}))),
        ("namespace", with(base.clone(), "/spec/namespace", json!(7))),
        (
            "namespace",
            with(base.clone(), "/spec/namespace", json!([])),
        ),
        (
            "namespaceSelector",
            ns_selector(json!({"matchExpressions": [{"key": "x", "operator": "In"}]})),
        ),
        (
            "namespaceSelector",
            ns_selector(
                json!({"matchExpressions": [{"key": "x", "operator": "Sometimes", "values": ["y"]}]}),
            ),
        ),
    ]
}

#[tokio::test]
async fn invalid_rule_gets_ready_false_and_the_operator_keeps_serving() {
    let t = TestNs::new("invalid-rule").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "good", rule_spec(CM, t.selector(), &[&t1]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let a = t.create_source(CM, &op, "a", &[], &[("k", "a")]).await;
    t.wait_copy(CM, &t1, &a, &op, "good").await;

    let mut accepted = Vec::new();
    for (i, (field, body)) in invalid_candidates(&t).into_iter().enumerate() {
        let name = format!("bad-{i}");
        match t.try_create_rule(&op, &name, body.clone()).await {
            Ok(_) => accepted.push((name, body)),
            Err(e) => {
                let msg = err_msg(&e);
                assert!(
                    msg.contains(field),
                    "refused without naming {field}: {msg} (rule {body})"
                );
                eprintln!("refused by the schema, as it should: {msg}");
            }
        }
    }
    // The candidates are rules the schema cannot refuse: were every one
    // refused, the operator's own judgement below would go unchecked.
    assert!(
        !accepted.is_empty(),
        "the API server refused every invalid candidate: none was left for the operator to \
         report Ready False (expected at least one the structural schema cannot refuse)"
    );
    for (name, body) in &accepted {
        let what = format!("Ready False with a message for the invalid rule {body}");
        let rule = t
            .wait_rule(&op, name, &what, |r| {
                let c = ready_condition(r).ok_or_else(|| short_status(r))?;
                let gen_ok =
                    r.pointer("/status/observedGeneration") == r.pointer("/metadata/generation");
                let msg_ok = c["message"].as_str().is_some_and(|m| !m.is_empty());
                if c["status"] == "False" && gen_ok && msg_ok {
                    Ok(())
                } else {
                    Err(short_status(r))
                }
            })
            .await;
        eprintln!("{name}: {}", ready_condition(&rule).unwrap());
        let uid = rule["metadata"]["uid"].as_str().unwrap();
        assert!(
            t.list_labelled(CM, LABEL_RULE_UID, uid).await.is_empty(),
            "the invalid rule {name} made copies"
        );
    }
    operator.assert_running();

    // Still serving: an existing rule follows its sources, and a new rule works.
    let b = t.create_source(CM, &op, "b", &[], &[("k", "b")]).await;
    t.wait_copy(CM, &t1, &b, &op, "good").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "good2", rule_spec(CM, t.selector(), &[&t2]))
        .await;
    t.wait_copy(CM, &t2, &a, &op, "good2").await;
    operator.assert_running();
}

/// The six Secret types of the default list (`Opaque`, `kubernetes.io/tls`,
/// `kubernetes.io/dockerconfigjson`, `kubernetes.io/dockercfg`,
/// `kubernetes.io/basic-auth`, `kubernetes.io/ssh-auth`) are copied; every
/// other type is refused with its reason in the rule's status and an Event,
/// unless a setting adds it.
#[tokio::test]
async fn only_listed_secret_types_are_copied_and_the_rest_are_reported() {
    let t = TestNs::new("secret-types").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let labels = json!({TEST_LABEL: t.prefix});
    let copied = [
        ("opaque", "Opaque", json!({"k": "v"})),
        (
            "tls",
            "kubernetes.io/tls",
            json!({"tls.crt": "c", "tls.key": "k"}),
        ),
        (
            "pull",
            "kubernetes.io/dockerconfigjson",
            json!({".dockerconfigjson": "{\"auths\":{}}"}),
        ),
        (
            "legacy-pull",
            "kubernetes.io/dockercfg",
            json!({".dockercfg": "{}"}),
        ),
        (
            "basic",
            "kubernetes.io/basic-auth",
            json!({"username": "u", "password": "p"}),
        ),
        (
            "ssh",
            "kubernetes.io/ssh-auth",
            json!({"ssh-privatekey": "k"}),
        ),
    ];
    let refused = [
        (
            "bootstrap",
            "bootstrap.kubernetes.io/token",
            json!({"token-id": "abcdef", "token-secret": "0123456789abcdef"}),
        ),
        ("custom", "example.com/custom", json!({"k": "v"})),
    ];
    for (name, type_, data) in copied.iter().chain(&refused) {
        t.create_json(
            SECRET,
            &op,
            name,
            json!({"metadata": {"labels": labels}, "type": type_, "stringData": data}),
        )
        .await;
    }
    let mut operator = Operator::start(&t, &op, &[]);
    for (name, _, _) in &copied {
        let source = t.must_get(SECRET, &op, name).await;
        t.wait_copy(SECRET, &t1, &source, &op, "r").await;
    }
    let rule = t
        .wait_rule(&op, "r", "the refused sources listed", |r| {
            let listed: Vec<&str> = r["status"]["refusedSources"]
                .as_array()
                .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
                .unwrap_or_default();
            if listed == ["bootstrap", "custom"] {
                Ok(())
            } else {
                Err(format!("refusedSources {}", r["status"]["refusedSources"]))
            }
        })
        .await;
    let reasons: Vec<&str> = rule["status"]["refusedSources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("is not copied") && r.contains("--secret-types")),
        "reasons: {reasons:?}"
    );
    assert_eq!(rule["status"]["refusedSourceCount"], 2);
    for (name, _, _) in &refused {
        assert!(
            t.get(SECRET, &t1, name).await.is_none(),
            "{name} was copied"
        );
    }
    wait_until(
        "a SourceRefused Event per refused source",
        TIMEOUT,
        async || {
            let notes: Vec<String> = t
                .events_regarding(&op, "r")
                .await
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("SourceRefused"))
                .filter_map(|e| e.note)
                .collect();
            let named = |name: &str| notes.iter().any(|n| n.contains(&format!("{op}/{name} ")));
            if named("bootstrap") && named("custom") {
                Ok(())
            } else {
                Err(format!("notes {notes:?}"))
            }
        },
    )
    .await;

    // A setting adds a type.
    operator.stop();
    let _operator = Operator::start(&t, &op, &["--secret-types", "example.com/custom"]);
    let custom = t.must_get(SECRET, &op, "custom").await;
    t.wait_copy(SECRET, &t1, &custom, &op, "r").await;
    assert!(t.get(SECRET, &t1, "bootstrap").await.is_none());
}
