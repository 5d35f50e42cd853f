//! A tenant's rule acts as a ServiceAccount of its namespace
//! (`--tenant-identity service-account`): its writes are sent impersonating
//! that account, so the API server decides what it may write, and a source
//! enters its plan only once a SubjectAccessReview says the account may
//! `get` it. The tenants hold only the built-in `admin` role in their
//! namespace; the targets' admins grant the account what it may write.

use chrono::Utc;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::audit::{Audit, Query};
use crate::common::rbac::as_the_chart;
use crate::common::rbac::rbac;
use crate::common::rbac::{Binding, ClusterScoped, bind_as, chart_impersonation_role};
use crate::common::tenant::Tenant;
use crate::common::*;

const CM: Kind = Kind::ConfigMap;

/// The account tenant rules act as unless they name another.
const ACCOUNT: &str = "copyrator";

fn user_of(namespace: &str) -> String {
    format!("system:serviceaccount:{namespace}:{ACCOUNT}")
}

/// A RoleBinding `name` in `namespace` of the ClusterRole `role` to the
/// ServiceAccount `account_namespace/copyrator`, made by the namespace's
/// owner (the test's admin).
async fn bind(t: &TestNs, namespace: &str, name: &str, role: &str, account_namespace: &str) {
    let binding = Binding {
        role_kind: "ClusterRole",
        role,
        account_namespace,
        account: ACCOUNT,
    };
    bind_as(&t.client, namespace, name, binding).await;
}

/// The tenant makes the ServiceAccount its rules act as, in its namespace.
async fn make_account(tenant: &Tenant) {
    tenant
        .create(
            &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&()),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}}),
        )
        .await;
}

async fn unbind(t: &TestNs, namespace: &str, name: &str) {
    Api::<DynamicObject>::namespaced_with(
        t.client.clone(),
        namespace,
        &rbac("RoleBinding", "rolebindings"),
    )
    .delete(name, &DeleteParams::default())
    .await
    .unwrap_or_else(|e| {
        panic!(
            "deleting the RoleBinding {namespace}/{name}: {}",
            err_msg(&e)
        )
    });
}

fn ready_reason(rule: &Value) -> String {
    ready_condition(rule)
        .and_then(|c| c["reason"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Every write of a tenant rule's copies carries its ServiceAccount as the
/// impersonated user, and none goes without it. A target whose RoleBinding
/// for the account is deleted gets no new content, and the rule's status
/// gives the API server's refusal; restored, the target converges.
#[tokio::test]
async fn a_tenant_rule_writes_as_its_service_account_and_no_further_than_its_rights() {
    let t = TestNs::new("acting").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let home = t.ns("home").await;
    let (t1, t2) = (t.ns("t1").await, t.ns("t2").await);
    let tenant = Tenant::admin_of(&t, &home, "owner").await;
    // The tenant makes the account its rule acts as, and lets it read the
    // namespace's ConfigMaps; each target's owner accepts the tenant's
    // copies and lets the account write there.
    make_account(&tenant).await;
    bind(&t, &home, "copyrator-reads", "view", &home).await;
    for ns in [&t1, &t2] {
        t.accept_from(ns, &home).await;
        bind(&t, ns, "copyrator-writes", "edit", &home).await;
    }
    let src = t.create_source(CM, &home, "cfg", &[], &[("k", "v1")]).await;
    let audit = Audit::start();
    let started = Utc::now();
    tenant
        .create_rule(
            &rule,
            rule_spec(CM, t.selector(), &[t1.as_str(), t2.as_str()]),
        )
        .await;
    let mut operator = Operator::start(
        &t,
        &op,
        &[
            "--all-namespaces",
            "--rule-name",
            &rule,
            "--tenant-identity",
            "service-account",
        ],
    );
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &src, &home, &rule).await;
    }
    // The copies land before the pass's status does: wait for the status.
    let status = t
        .wait_rule_observed(&home, &rule, "a status for the first pass")
        .await;
    assert_eq!(
        status.pointer("/status/identity"),
        Some(&json!(user_of(&home))),
        "{}",
        short_status(&status)
    );
    // `where` and `plan` say whom each copy is written as.
    let found = crate::whereabouts::copyrator_where(&[
        &format!("{home}/cfg"),
        "--all-namespaces",
        "--tenant-identity",
        "service-account",
        "--rule-name",
        &rule,
    ])
    .await;
    for ns in [&t1, &t2] {
        let line = format!(
            "home: {ns}/cfg in place (rule {home}/{rule}, as {}) [content ",
            user_of(&home)
        );
        assert!(
            found.stdout.lines().any(|l| l.starts_with(&line)),
            "no line {line:?} in:\n{}{}",
            found.stdout,
            found.stderr
        );
    }
    // A change of the rule, planned from a file before it is applied.
    let t3 = t.ns("t3").await;
    t.accept_from(&t3, &home).await;
    let widened = rule_spec(CM, t.selector(), &[t1.as_str(), t2.as_str(), t3.as_str()]);
    let manifest = serde_yaml::to_string(&TestNs::rule_manifest(Some(&home), &rule, &widened))
        .expect("the rule renders as YAML");
    let planned = copyrator_plan(
        &[
            "--all-namespaces",
            "--tenant-identity",
            "service-account",
            "--rule-name",
            &rule,
            "-f",
            "-",
        ],
        Some(&manifest),
    )
    .await;
    let create = format!(
        "create ConfigMap {t3}/cfg (rule {home}/{rule}, source {home}/cfg, as {})",
        user_of(&home)
    );
    assert!(
        planned.stdout.lines().any(|l| l == create),
        "no line {create:?} in:\n{}{}",
        planned.stdout,
        planned.stderr
    );

    // The target's owner takes the account's rights away: the next
    // content is refused there, in the API server's words.
    unbind(&t, &t2, "copyrator-writes").await;
    wait_until(
        "the RoleBinding's removal to take effect",
        TIMEOUT,
        async || {
            let attributes = json!({"group": "", "resource": "configmaps", "verb": "update",
                                "namespace": t2});
            match crate::common::rbac::service_account_may(
                &t.client,
                &user_of(&home),
                &home,
                attributes,
            )
            .await?
            {
                false => Ok(()),
                true => Err("still allowed".to_owned()),
            }
        },
    )
    .await;
    let src = t.set_data(CM, &home, "cfg", &[("k", Some("v2"))]).await;
    t.wait_copy(CM, &t1, &src, &home, &rule).await;
    let refusal = format!(
        "User \"{}\" cannot update resource \"configmaps\" in API group \"\" in the namespace \"{t2}\"",
        user_of(&home)
    );
    let refused = t
        .wait_rule(&home, &rule, "the refusal in the status", |r| {
            let c = ready_condition(r).ok_or_else(|| short_status(r))?;
            let message = c["message"].as_str().unwrap_or_default();
            if c["status"] == "False" && c["reason"] == "SyncFailed" && message.contains(&refusal) {
                Ok(())
            } else {
                Err(short_status(r))
            }
        })
        .await;
    println!(
        "refused: {}",
        ready_condition(&refused).unwrap_or(&Value::Null)
    );
    let held = t.must_get(CM, &t2, "cfg").await;
    assert_eq!(
        held.data.get("k").map(String::as_str),
        Some("v1"),
        "t2 kept v1"
    );

    // Restored: the target converges.
    bind(&t, &t2, "copyrator-writes", "edit", &home).await;
    t.wait_copy(CM, &t2, &src, &home, &rule).await;
    t.wait_rule(&home, &rule, "Ready again", |r| {
        match ready_reason(r).as_str() {
            "Synced" => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;

    audit.settle(&t.client, Utc::now()).await;
    let writes = ["create", "update", "patch", "delete"];
    let mut seen = 0;
    for ns in [&t1, &t2] {
        let query = Query {
            verbs: Some(writes.iter().map(|v| v.to_string()).collect()),
            resource: Some("configmaps".into()),
            namespace: Some(ns.clone()),
            name: Some("cfg".into()),
            from: Some(started),
            ..Query::default()
        };
        for event in audit.matching(&query) {
            seen += 1;
            assert_eq!(
                event.impersonated.as_deref(),
                Some(user_of(&home).as_str()),
                "a write of the tenant rule's copy not sent as its account: {event}"
            );
        }
    }
    // Two creates, two updates (one refused), and the update let through.
    assert!(seen >= 5, "only {seen} writes of the copies were logged");
    operator.assert_running();
}

/// A source the rule's ServiceAccount may not `get` is never copied, and
/// its status says so; once a Role grants it, it is copied; revoked, its
/// copy is pruned as a source gone.
#[tokio::test]
async fn a_source_its_service_account_may_not_read_is_not_copied_until_a_role_grants_it() {
    let t = TestNs::new("reading").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let home = t.ns("home").await;
    let t1 = t.ns("t1").await;
    let tenant = Tenant::admin_of(&t, &home, "owner").await;
    make_account(&tenant).await;
    // The account may read `open` alone, by name.
    let roles = rbac("Role", "roles");
    let grant = |names: &[&str]| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "copyrator-reads", "namespace": home},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "resourceNames": names, "verbs": ["get"]}],
        })
    };
    let role: DynamicObject = serde_json::from_value(grant(&["open"])).expect("a Role");
    Api::<DynamicObject>::namespaced_with(tenant.client.clone(), &home, &roles)
        .create(&PostParams::default(), &role)
        .await
        .unwrap_or_else(|e| panic!("the tenant's Role: {}", err_msg(&e)));
    let reads = Binding {
        role_kind: "Role",
        role: "copyrator-reads",
        account_namespace: &home,
        account: ACCOUNT,
    };
    bind_as(&tenant.client, &home, "copyrator-reads", reads).await;
    t.accept_from(&t1, &home).await;
    bind(&t, &t1, "copyrator-writes", "edit", &home).await;
    let open = t.create_source(CM, &home, "open", &[], &[("k", "v")]).await;
    let closed = t
        .create_source(CM, &home, "closed", &[], &[("k", "v")])
        .await;
    tenant
        .create_rule(&rule, rule_spec(CM, t.selector(), &[t1.as_str()]))
        .await;
    let mut operator = Operator::start(
        &t,
        &op,
        &[
            "--all-namespaces",
            "--rule-name",
            &rule,
            "--tenant-identity",
            "service-account",
        ],
    );
    t.wait_copy(CM, &t1, &open, &home, &rule).await;
    let said = t
        .wait_rule(&home, &rule, "closed named as not readable", |r| {
            let refused = r
                .pointer("/status/refusedSources")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let names_closed = refused.iter().any(|s| {
                s["name"] == "closed" && s["reason"] == format!("{} may not get it", user_of(&home))
            });
            if ready_reason(r) == "SourceNotReadable" && names_closed {
                Ok(())
            } else {
                Err(short_status(r))
            }
        })
        .await;
    println!("not readable: {}", said["status"]);
    t.assert_absent(CM, &t1, "closed", "the account may not get it")
        .await;

    // Granted: copied.
    Api::<DynamicObject>::namespaced_with(tenant.client.clone(), &home, &roles)
        .patch(
            "copyrator-reads",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": grant(&["open", "closed"])["rules"]})),
        )
        .await
        .unwrap_or_else(|e| panic!("granting: {}", err_msg(&e)));
    t.wait_copy(CM, &t1, &closed, &home, &rule).await;
    t.wait_rule(&home, &rule, "Ready", |r| match ready_reason(r).as_str() {
        "Synced" => Ok(()),
        _ => Err(short_status(r)),
    })
    .await;

    // Revoked: its copy goes, as a source gone.
    Api::<DynamicObject>::namespaced_with(tenant.client.clone(), &home, &roles)
        .patch(
            "copyrator-reads",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": grant(&["open"])["rules"]})),
        )
        .await
        .unwrap_or_else(|e| panic!("revoking: {}", err_msg(&e)));
    t.wait_gone(
        CM,
        &t1,
        "closed",
        "the account may no longer get its source",
    )
    .await;
    assert!(t.try_get(CM, &t1, "open").await.ok().flatten().is_some());
    operator.assert_running();
}

/// `kubectl auth can-i impersonate serviceaccounts/<name> -n <namespace>`
/// as `user`: whether the API server says yes.
fn may_impersonate(user: &str, namespace: &str, target: &str) -> bool {
    let out = std::process::Command::new("kubectl")
        .args([
            "auth",
            "can-i",
            "impersonate",
            target,
            "--namespace",
            namespace,
            "--as",
            user,
        ])
        .output()
        .expect("kubectl on PATH");
    match String::from_utf8_lossy(&out.stdout).trim() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "kubectl auth can-i impersonate {target}: {other:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The chart's operator (`operator.tenantIdentity=serviceAccount`) may
/// impersonate only ServiceAccounts named `copyrator`, and only in a
/// namespace whose admin opted in with one RoleBinding of the chart's
/// `-impersonate` ClusterRole (which the built-in `admin` role may make).
/// Before, the rule's status says the impersonation was refused
/// (`ImpersonationForbidden`) and nothing is written.
#[tokio::test]
async fn the_charts_operator_impersonates_only_where_a_namespace_opted_in() {
    let t = TestNs::new("opt-in").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let home = t.ns("home").await;
    let t1 = t.ns("t1").await;
    let cluster = ClusterScoped::new();
    let values = [
        "--set",
        "operator.tenantIdentity=serviceAccount",
        "--set",
        "operator.allNamespaces=true",
    ];
    let operator_id = as_the_chart(&t, &cluster, &op, &values).await;
    // The chart's ClusterRole for impersonation, as the chart makes it
    // (named for this test).
    let impersonate = format!("{}-impersonate", t.prefix);
    let role = chart_impersonation_role(&t, &cluster, &values, &impersonate).await;
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["serviceaccounts"],
                "resourceNames": [ACCOUNT], "verbs": ["impersonate"]}]),
        "impersonation of the default account by name alone"
    );

    let tenant = Tenant::admin_of(&t, &home, "owner").await;
    make_account(&tenant).await;
    bind(&t, &home, "copyrator-reads", "view", &home).await;
    t.accept_from(&t1, &home).await;
    bind(&t, &t1, "copyrator-writes", "edit", &home).await;
    let src = t.create_source(CM, &home, "cfg", &[], &[("k", "v")]).await;
    tenant
        .create_rule(&rule, rule_spec(CM, t.selector(), &[t1.as_str()]))
        .await;
    let mut args: Vec<String> = vec!["run".into(), "--namespace".into(), op.clone()];
    args.extend(
        [
            "--all-namespaces",
            "--rule-name",
            &rule,
            "--tenant-identity",
            "service-account",
        ]
        .map(str::to_owned),
    );
    let mut operator =
        Operator::start_with_env(&t, args, &[("KUBECONFIG", &operator_id.kubeconfig)]);

    assert!(!may_impersonate(
        &operator_id.user,
        &home,
        "serviceaccounts/copyrator"
    ));
    let refused = t
        .wait_rule(
            &home,
            &rule,
            "the impersonation refused",
            |r| match ready_reason(r).as_str() {
                "ImpersonationForbidden" => Ok(()),
                _ => Err(short_status(r)),
            },
        )
        .await;
    println!(
        "before opting in: {}",
        ready_condition(&refused).unwrap_or(&Value::Null)
    );
    t.assert_absent(CM, &t1, "cfg", "the namespace has not opted in")
        .await;

    // The tenant opts in, as its namespace's admin.
    let opt_in = Binding {
        role_kind: "ClusterRole",
        role: &impersonate,
        account_namespace: &op,
        account: &operator_id.account,
    };
    bind_as(&tenant.client, &home, "copyrator-may-act-here", opt_in).await;
    t.wait_copy(CM, &t1, &src, &home, &rule).await;

    assert!(may_impersonate(
        &operator_id.user,
        &home,
        "serviceaccounts/copyrator"
    ));
    for (namespace, target) in [
        (home.as_str(), "serviceaccounts/owner"),
        (t1.as_str(), "serviceaccounts/copyrator"),
        (home.as_str(), "users/admin"),
        (home.as_str(), "groups/system:masters"),
    ] {
        assert!(
            !may_impersonate(&operator_id.user, namespace, target),
            "the operator may impersonate {target} in {namespace}"
        );
    }

    // A rule naming an account that does not exist says so.
    let other = t.ns("other").await;
    t.accept_from(&t1, &format!("{home},{other}")).await;
    t.create_rule(
        &other,
        &rule,
        with(
            rule_spec(CM, t.selector(), &[t1.as_str()]),
            "/spec/serviceAccountName",
            json!("ghost"),
        ),
    )
    .await;
    t.create_source(CM, &other, "other-cfg", &[], &[("k", "v")])
        .await;
    let missing = t
        .wait_rule(
            &other,
            &rule,
            "the account named missing",
            |r| match ready_reason(r).as_str() {
                "ServiceAccountMissing" => Ok(()),
                _ => Err(short_status(r)),
            },
        )
        .await;
    println!(
        "missing: {}",
        ready_condition(&missing).unwrap_or(&Value::Null)
    );
    // The home rule's account deleted with its rights: its copy is neither
    // pruned nor deleted (as an account that may do nothing), and the
    // rule says why.
    let audit = Audit::start();
    let gone_at = Utc::now();
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(t.client.clone(), &home)
        .delete(ACCOUNT, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the account: {}", err_msg(&e)));
    unbind(&t, &home, "copyrator-reads").await;
    unbind(&t, &t1, "copyrator-writes").await;
    t.wait_rule(
        &home,
        &rule,
        "its account missing",
        |r| match ready_reason(r).as_str() {
            "ServiceAccountMissing" => Ok(()),
            _ => Err(short_status(r)),
        },
    )
    .await;
    assert_for(
        "the copy to stay while the account is missing",
        QUIET,
        async || match t.get(CM, &t1, "cfg").await {
            Some(_) => Ok(()),
            None => Err("deleted".to_owned()),
        },
    )
    .await;
    audit.settle(&t.client, Utc::now()).await;
    let deletes = audit.matching(
        &Query::default()
            .verbs(&["delete"])
            .resource("configmaps")
            .namespace(&t1)
            .between(gone_at, Utc::now()),
    );
    assert!(
        deletes.is_empty(),
        "the copy was deleted (or tried) with no account to act as: {deletes:?}"
    );
    operator.assert_running();
}

/// With `rbac.writeCopies=false` the chart's operator holds no write right
/// on Secrets at all: a rule of its own namespace that names a
/// ServiceAccount (`spec.serviceAccountName`) still keeps its copies, every
/// write sent as that account, and the operator itself may not write a
/// Secret but its own mark key (in its own namespace).
#[tokio::test]
async fn an_operator_without_write_rights_keeps_copies_through_the_accounts_rules_name() {
    let t = TestNs::new("no-writes").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let (t1, t2) = (t.ns("t1").await, t.ns("t2").await);
    let cluster = ClusterScoped::new();
    let values = [
        "--set",
        "rbac.writeCopies=false",
        "--set",
        "operator.tenantIdentity=serviceAccount",
        "--set",
        "impersonation.serviceAccountNames={writer}",
    ];
    let operator_id = as_the_chart(&t, &cluster, &op, &values).await;
    for verb in ["create", "update", "patch", "delete"] {
        let attributes = json!({"group": "", "resource": "secrets", "verb": verb});
        assert!(
            !crate::common::rbac::service_account_may(
                &t.client,
                &operator_id.user,
                &op,
                attributes
            )
            .await
            .expect("a SubjectAccessReview"),
            "the operator may {verb} Secrets"
        );
    }
    // The chart's impersonation ClusterRole, bound in the operator's own
    // namespace, where the account the rule names lives.
    let impersonate = format!("{}-impersonate", t.prefix);
    chart_impersonation_role(&t, &cluster, &values, &impersonate).await;
    let opt_in = Binding {
        role_kind: "ClusterRole",
        role: &impersonate,
        account_namespace: &op,
        account: &operator_id.account,
    };
    bind_as(&t.client, &op, "copyrator-may-act-here", opt_in).await;
    create_service_account(&t.client, &op, "writer").await;
    let writer = format!("system:serviceaccount:{op}:writer");
    let writer_in = |role_kind, role| Binding {
        role_kind,
        role,
        account_namespace: &op,
        account: "writer",
    };
    for (ns, role) in [(&op, "view"), (&t1, "edit"), (&t2, "edit")] {
        let name = format!("writer-{role}");
        bind_as(&t.client, ns, &name, writer_in("ClusterRole", role)).await;
    }
    // `view` reads no Secrets: the account reads its sources by a Role.
    let reads: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "writer-reads", "namespace": op},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }))
    .expect("a Role");
    Api::<DynamicObject>::namespaced_with(t.client.clone(), &op, &rbac("Role", "roles"))
        .create(&PostParams::default(), &reads)
        .await
        .unwrap_or_else(|e| panic!("the reading Role: {}", err_msg(&e)));
    bind_as(
        &t.client,
        &op,
        "writer-reads",
        writer_in("Role", "writer-reads"),
    )
    .await;

    let secret = Kind::Secret;
    let src = t
        .create_source(secret, &op, "token", &[], &[("k", "v1")])
        .await;
    let audit = Audit::start();
    let started = Utc::now();
    t.create_rule(
        &op,
        &rule,
        with(
            rule_spec(secret, t.selector(), &[t.glob("t")]),
            "/spec/serviceAccountName",
            json!("writer"),
        ),
    )
    .await;
    let mut args: Vec<String> = vec!["run".into(), "--namespace".into(), op.clone()];
    args.extend(["--rule-name", &rule, "--tenant-identity", "service-account"].map(str::to_owned));
    let mut operator =
        Operator::start_with_env(&t, args, &[("KUBECONFIG", &operator_id.kubeconfig)]);
    for ns in [&t1, &t2] {
        t.wait_copy(secret, ns, &src, &op, &rule).await;
    }
    let src = t.set_data(secret, &op, "token", &[("k", Some("v2"))]).await;
    for ns in [&t1, &t2] {
        t.wait_copy(secret, ns, &src, &op, &rule).await;
    }
    t.delete(secret, &op, "token").await;
    for ns in [&t1, &t2] {
        t.wait_gone(secret, ns, "token", "its source is gone").await;
    }
    audit.settle(&t.client, Utc::now()).await;
    let mut seen = 0;
    for ns in [&t1, &t2] {
        let query = Query {
            verbs: Some(
                ["create", "update", "patch", "delete"]
                    .map(str::to_owned)
                    .to_vec(),
            ),
            resource: Some("secrets".into()),
            namespace: Some(ns.clone()),
            from: Some(started),
            ..Query::default()
        };
        for event in audit.matching(&query) {
            seen += 1;
            assert_eq!(
                (event.username.as_str(), event.impersonated.as_deref()),
                (operator_id.user.as_str(), Some(writer.as_str())),
                "a write of a copy not sent as the account the rule names: {event}"
            );
        }
    }
    assert!(seen >= 6, "only {seen} writes of the copies were logged");
    operator.assert_running();
}

/// With `--consent-by-rights`, a namespace that lets the tenant rule's
/// ServiceAccount write the kind there has consented, with no annotation;
/// one that does not is neither written to nor named or counted in the
/// rule's status. Without the setting, the same RoleBinding alone invites
/// nothing.
#[tokio::test]
async fn with_consent_by_rights_a_rolebinding_is_a_namespaces_consent() {
    let t = TestNs::new("by-rights").await;
    let rule = t.prefix.clone();
    let op = t.ns("op").await;
    let home = t.ns("home").await;
    let (granted, closed) = (t.ns("t-granted").await, t.ns("t-closed").await);
    let tenant = Tenant::admin_of(&t, &home, "owner").await;
    make_account(&tenant).await;
    bind(&t, &home, "copyrator-reads", "view", &home).await;
    bind(&t, &granted, "copyrator-writes", "edit", &home).await;
    let src = t.create_source(CM, &home, "cfg", &[], &[("k", "v")]).await;
    tenant
        .create_rule(&rule, rule_spec(CM, t.selector(), &[t.glob("t-")]))
        .await;
    let acting = [
        "--all-namespaces",
        "--rule-name",
        rule.as_str(),
        "--tenant-identity",
        "service-account",
    ];

    // The annotations required (the default): nothing is written.
    let mut operator = Operator::start(&t, &op, &acting);
    t.wait_rule(&home, &rule, "synced with no target", |r| {
        match (ready_reason(r).as_str(), status_u64(r, "targetNamespaces")) {
            ("Synced", Some(0)) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    t.assert_absent(CM, &granted, "cfg", "no annotation accepts the tenant")
        .await;
    operator.stop();

    let with_rights: Vec<&str> = acting
        .iter()
        .copied()
        .chain(["--consent-by-rights"])
        .collect();
    let mut operator = Operator::start(&t, &op, &with_rights);
    t.wait_copy(CM, &granted, &src, &home, &rule).await;
    let status = t
        .wait_rule(&home, &rule, "one target, ready", |r| {
            match (ready_reason(r).as_str(), status_u64(r, "targetNamespaces")) {
                ("Synced", Some(1)) => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    t.assert_absent(CM, &closed, "cfg", "its account may not write there")
        .await;
    let said = status["status"].to_string();
    assert!(!said.contains(&closed), "the status names {closed}: {said}");
    assert_eq!(
        status_u64(&status, "notAcceptingNamespaces").unwrap_or(0),
        0
    );

    // The RoleBinding goes: the namespace no longer consents and leaves
    // the rule's targets. Its copy there stays, since the account may no
    // longer delete it: the rule's status says so, and the namespace's
    // owner may delete it.
    unbind(&t, &granted, "copyrator-writes").await;
    let left = t
        .wait_rule(&home, &rule, "no target, the delete refused", |r| {
            let message = ready_condition(r)
                .and_then(|c| c["message"].as_str())
                .unwrap_or_default();
            match (status_u64(r, "targetNamespaces"), ready_reason(r).as_str()) {
                (Some(0), "SyncFailed") if message.contains("cannot delete resource") => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    println!("after the RoleBinding went: {}", left["status"]);
    assert!(
        t.try_get(CM, &granted, "cfg")
            .await
            .ok()
            .flatten()
            .is_some()
    );
    operator.assert_running();
}
