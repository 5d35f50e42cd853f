//! Copies are read-only at admission (the chart's `copyProtection`): its
//! ValidatingAdmissionPolicy refuses an edit or a delete of a live copy by
//! anyone but Copyrator, naming the copy's source and rule. The operator
//! runs as the chart's ServiceAccount, tenant rules act as their
//! namespace's ServiceAccount with the acting-for extra
//! (`--acting-for-extra`), and the policy and its binding are the chart's
//! as rendered, named for the test and bound to its namespaces alone.

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::common::helm::{create_chart_policy, find_named, render};
use crate::common::members::client_of_file;
use crate::common::prometheus::{wait_copy_protection, wait_protection_off_event};
use crate::common::rbac::{
    Binding, ClusterScoped, as_the_chart, bind_as, chart_impersonation_role, rbac,
};
use crate::common::tenant::{COPIER, Tenant, copier_may_edit};
use crate::common::*;

const CM: Kind = Kind::ConfigMap;

/// The chart's policy and binding for `values`, named for the test, with
/// the test operator's user name for the chart's; and its acting-for
/// ClusterRole, bound to the test's operator.
async fn chart_protection(
    t: &TestNs,
    cluster: &ClusterScoped,
    values: &[&str],
    operator: &crate::common::rbac::Identity,
) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
    let docs = render(values);
    let name = format!("{}-copies-read-only", t.prefix);
    let policy = find_named(
        &docs,
        "ValidatingAdmissionPolicy",
        "copyrator-copies-read-only",
    );
    let text = serde_json::to_string(policy)
        .expect("the policy as JSON")
        .replace("system:serviceaccount:copyrator:copyrator", &operator.user);
    let policy: Value = serde_json::from_str(&text).expect("the policy");
    let binding = find_named(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "copyrator-copies-read-only",
    )
    .clone();
    create_chart_policy(&t.client, cluster, policy, binding, &name).await;
    // Its expressions type-check against the kinds it matches.
    let policies = Api::<ValidatingAdmissionPolicy>::all(t.client.clone());
    let warnings = wait_until("the policy's type check", TIMEOUT, async || {
        let policy = policies.get(&name).await.map_err(|e| err_msg(&e))?;
        let status = policy.status.unwrap_or_default();
        match (status.observed_generation, status.type_checking) {
            (Some(_), Some(checked)) => Ok(checked.expression_warnings.unwrap_or_default()),
            other => Err(format!("not checked yet: {other:?}")),
        }
    })
    .await;
    let said: Vec<String> = warnings
        .iter()
        .map(|w| format!("{}: {}", w.field_ref, w.warning))
        .collect();
    assert!(said.is_empty(), "the policy's type check warns: {said:?}");
    for role in ["copy-protection", "acting-for"] {
        grant_chart_role(t, cluster, &docs, role, operator).await;
    }
}

/// The chart's ClusterRole `copyrator-<role>`, named for the test, bound to
/// the test's operator.
async fn grant_chart_role(
    t: &TestNs,
    cluster: &ClusterScoped,
    docs: &[Value],
    role: &str,
    operator: &crate::common::rbac::Identity,
) {
    let role_name = format!("{}-{role}", t.prefix);
    let role = find_named(docs, "ClusterRole", &format!("copyrator-{role}"));
    // What it grants by name, it grants on the test's policy and binding.
    let text = serde_json::to_string(role)
        .expect("the role as JSON")
        .replace(
            "\"copyrator-copies-read-only\"",
            &format!("\"{}-copies-read-only\"", t.prefix),
        );
    let mut role: Value = serde_json::from_str(&text).expect("the role");
    role["metadata"] = json!({"name": role_name});
    cluster
        .create(&t.client, &rbac("ClusterRole", "clusterroles"), role)
        .await;
    cluster
        .create(
            &t.client,
            &rbac("ClusterRoleBinding", "clusterrolebindings"),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": role_name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role_name},
                "subjects": [{"kind": "ServiceAccount", "name": operator.account,
                              "namespace": operator.namespace}],
            }),
        )
        .await;
}

/// A client with the token of the ServiceAccount `namespace/account`.
async fn client_as(t: &TestNs, namespace: &str, account: &str) -> kube::Client {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{}-{namespace}-{account}.kubeconfig", t.prefix));
    let (ns, sa, file) = (namespace.to_owned(), account.to_owned(), path.clone());
    tokio::task::spawn_blocking(move || service_account_kubeconfig(&ns, &sa, &file))
        .await
        .expect("a kubeconfig");
    client_of_file(&path)
        .await
        .unwrap_or_else(|e| panic!("a client as {namespace}/{account}: {e}"))
}

/// What each change of the ConfigMap `namespace/name` by `client` came
/// to: a label, an edit of its data, taking it over (its mark removed and
/// handed over), a delete (`Ok` where it was let through; the delete is
/// sent as a dry run).
async fn changes(client: &kube::Client, namespace: &str, name: &str) -> Vec<Result<(), String>> {
    let api = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let label = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"edited": "yes"}}})),
        )
        .await;
    let edit = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "edited"}})),
        )
        .await;
    // Taking it over oneself: the mark gone and handed over in the new
    // object, which no longer matches the binding's objectSelector; the
    // old one does, and decides.
    let take_over = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "copyrator.flant.com/rule-uid": null,
                "copyrator.flant.com/sync-policy": "CreateOnly",
            }}})),
        )
        .await;
    let delete = api
        .delete(
            name,
            &DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            },
        )
        .await;
    vec![
        label.map(|_| ()).map_err(|e| err_msg(&e)),
        edit.map(|_| ()).map_err(|e| err_msg(&e)),
        take_over.map(|_| ()).map_err(|e| err_msg(&e)),
        delete.map(|_| ()).map_err(|e| err_msg(&e)),
    ]
}

#[tokio::test]
async fn a_live_copy_is_read_only_to_all_but_copyrator_acting_for_its_rule() {
    let t = TestNs::new("protect").await;
    let scope = ("copyrator-test-protect", t.prefix.as_str());
    let op = t.ns_labelled("op", &[scope]).await;
    let home = t.ns_labelled("home", &[scope]).await;
    let t1 = t.ns_labelled("t1", &[scope]).await;
    let rule = t.prefix.clone();
    let cluster = ClusterScoped::new();
    let selector = format!(
        "copyProtection.namespaceSelector.matchLabels.copyrator-test-protect={}",
        t.prefix
    );
    let values = [
        "--set",
        "operator.allNamespaces=true",
        "--set",
        selector.as_str(),
    ];
    let operator_id = as_the_chart(&t, &cluster, &op, &values).await;
    chart_protection(&t, &cluster, &values, &operator_id).await;
    let protection = format!("{}-copies-read-only", t.prefix);
    let impersonate = format!("{}-impersonate", t.prefix);
    chart_impersonation_role(&t, &cluster, &values, &impersonate).await;

    // The tenant opts in to impersonation, and its copier may edit at home
    // and in t1, which accepts copies from home.
    let tenant = Tenant::admin_of(&t, &home, "owner").await;
    copier_may_edit(&t, &home, &[home.as_str(), t1.as_str()]).await;
    let opt_in = Binding {
        role_kind: "ClusterRole",
        role: &impersonate,
        account_namespace: &op,
        account: &operator_id.account,
    };
    bind_as(&tenant.client, &home, "copyrator-may-act-here", opt_in).await;
    t.accept_from(&t1, &home).await;
    let src = t.create_source(CM, &home, "cfg", &[], &[("k", "v")]).await;
    let kept = t.create_source(CM, &home, "kept", &[], &[("k", "v")]).await;
    tenant
        .create_rule(&rule, rule_spec(CM, t.selector(), &[t1.as_str()]))
        .await;
    let args: Vec<String> = [
        "run",
        "--namespace",
        &op,
        "--all-namespaces",
        "--rule-name",
        &rule,
        "--tenant-identity",
        "service-account",
        "--acting-for-extra",
        "--copy-protection",
        &protection,
    ]
    .map(str::to_owned)
    .into();
    let mut operator =
        Operator::start_with_env(&t, args, &[("KUBECONFIG", &operator_id.kubeconfig)]);
    t.wait_copy(CM, &t1, &src, &home, &rule).await;
    t.wait_copy(CM, &t1, &kept, &home, &rule).await;

    // t1's admin may not change the copy: each change is refused, naming
    // its source and rule, and the copy is as it was.
    let admin = Tenant::admin_of(&t, &t1, "admin").await;
    let said = format!(
        "copy of {home}/cfg, kept by rule {home}/{rule}: change the source, or hand the copy over"
    );
    // The policy takes effect through the API server's cache: a dry run
    // first, until it is refused.
    let probe = Api::<DynamicObject>::namespaced_with(
        admin.client.clone(),
        &t1,
        &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    wait_until("the policy to refuse t1's admin", TIMEOUT, async || {
        let label = json!({"metadata": {"labels": {"probe": "yes"}}});
        match probe.patch("cfg", &dry_run, &Patch::Merge(label)).await {
            Err(e) if err_msg(&e).contains(&said) => Ok(()),
            other => Err(format!(
                "{:?}",
                other.map(|_| "let through").map_err(|e| err_msg(&e))
            )),
        }
    })
    .await;
    let before = t.get(CM, &t1, "cfg").await.expect("the copy");
    let refused = changes(&admin.client, &t1, "cfg").await;
    assert!(
        refused
            .iter()
            .all(|r| r.as_ref().is_err_and(|e| e.contains(&said))),
        "t1's admin: {refused:?}"
    );
    let after = t.get(CM, &t1, "cfg").await.expect("the copy");
    assert_eq!(
        after.resource_version, before.resource_version,
        "the copy was changed"
    );

    // Nor may the tenant, holding its copier's own token (RBAC lets that
    // account edit in t1; only the operator acting for the rule may).
    let copier = client_as(&t, &home, COPIER).await;
    let refused = changes(&copier, &t1, "cfg").await;
    assert!(
        refused
            .iter()
            .all(|r| r.as_ref().is_err_and(|e| e.contains(&said))),
        "the copier's own token: {refused:?}"
    );

    // The operator, acting for the rule as that account, still writes.
    t.patch(CM, &home, "cfg", json!({"data": {"k": "v2"}}))
        .await;
    wait_until("the source's change in the copy", TIMEOUT, async || match t
        .get(CM, &t1, "cfg")
        .await
    {
        Some(copy) if copy.data.get("k").map(String::as_str) == Some("v2") => Ok(()),
        other => Err(format!("{:?}", other.map(|c| c.data))),
    })
    .await;

    // A copy handed over to its namespace (the rule's syncPolicy now
    // CreateOnly) is the namespace's: editable.
    tenant
        .patch_rule(&rule, json!({"spec": {"syncPolicy": "CreateOnly"}}))
        .await;
    wait_until("the copies handed over", TIMEOUT, async || {
        let copy = t.get(CM, &t1, "kept").await;
        let policy = copy
            .as_ref()
            .and_then(|c| c.labels.get("copyrator.flant.com/sync-policy"));
        match policy.map(String::as_str) {
            Some("CreateOnly") => Ok(()),
            other => Err(format!("sync-policy {other:?}")),
        }
    })
    .await;
    let allowed = changes(&admin.client, &t1, "kept").await;
    assert!(
        allowed.iter().all(Result::is_ok),
        "a copy handed over: {allowed:?}"
    );

    // The operator says whether the protection is in force: its binding
    // deleted, at once; put back (as `helm upgrade` would), again.
    wait_copy_protection(operator.port, "home", 1.0).await;
    let bindings = Api::<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    >::all(t.client.clone());
    let binding = bindings
        .get(&protection)
        .await
        .unwrap_or_else(|e| panic!("the binding: {}", err_msg(&e)));
    let deleted = std::time::Instant::now();
    bindings
        .delete(&protection, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the binding: {}", err_msg(&e)));
    wait_copy_protection(operator.port, "home", 0.0).await;
    let event = wait_protection_off_event(&t, ("default", &protection), TIMEOUT).await;
    let took = deleted.elapsed();
    assert!(
        event.note.as_deref().is_some_and(|n| n.contains(&format!(
            "the ValidatingAdmissionPolicyBinding {protection} is missing"
        ))),
        "{:?}",
        event.note
    );
    println!(
        "copy_protection: the binding's deletion reported within {} ms",
        took.as_millis()
    );
    let mut restored = binding.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: Some(protection.clone()),
        ..kube::api::ObjectMeta::default()
    };
    bindings
        .create(&kube::api::PostParams::default(), &restored)
        .await
        .unwrap_or_else(|e| panic!("restoring the binding: {}", err_msg(&e)));
    wait_copy_protection(operator.port, "home", 1.0).await;

    // Deleting a namespace that holds copies completes.
    let t2 = t.ns_labelled("t2", &[scope]).await;
    t.accept_from(&t2, &home).await;
    copier_may_edit(&t, &home, &[t2.as_str()]).await;
    tenant
        .patch_rule(&rule, json!({"spec": {"syncPolicy": "Sync", "targets": {"include": [t1.as_str(), t2.as_str()]}}}))
        .await;
    let src = t.get(CM, &home, "cfg").await.expect("the source");
    t.wait_copy(CM, &t2, &src, &home, &rule).await;
    t.namespaces()
        .delete(&t2, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {t2}: {}", err_msg(&e)));
    wait_until(
        "the namespace holding a copy to be deleted",
        TIMEOUT,
        async || match t.namespaces().get_opt(&t2).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|n| n.and_then(|n| n.status)))),
        },
    )
    .await;
    operator.assert_running();
}
