//! Coming from another tool, against a real control plane and the real
//! binary: the objects and annotations another tool leaves (as its docs
//! say it leaves them: kubernetes-reflector, config-syncer and
//! ClusterSecret cannot be built here) are read by `copyrator import`,
//! which prints a rule with `adopt: true` and the label its source needs
//! (the source namespace's rule, a tenant rule, for the annotations on a
//! source, whose targets accept it; the operator's for a ClusterSecret);
//! `plan` shows every copy adopted and nothing else (exit 2); applied, the
//! rule takes every copy over with one metadata patch each (same uid, same
//! data, the tool's marks gone), and a later source change reaches them
//! all. The operator runs as the chart's ServiceAccount (its rendered RBAC,
//! nothing more), and its requests are read from the audit log.
//! (`hack/migration-run` does the same with kubernetes-replicator itself.)

use std::collections::BTreeMap;

use crate::common::audit::{Audit, Query, WRITE_VERBS};
use crate::common::rbac::{
    Binding, ClusterScoped, as_the_chart, bind_as, chart_impersonation_role, service_account_may,
};
use crate::common::tenant::{Tenant, copier_may_edit};
use crate::common::*;
use chrono::Utc;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde::Deserialize;
use serde_json::{Value, json};

/// Copies made by the other tool.
const COPIES: usize = 100;

/// One tool's migration: how it was configured and what it left.
struct Case {
    test: &'static str,
    kind: Kind,
    /// Its name in import's report.
    tool: &'static str,
    /// The prefixes of its marks, none left after adoption.
    marks: &'static [&'static str],
    /// Labels the target namespaces carry (a tool that selects by them).
    namespace_labels: fn(&TestNs) -> Vec<(String, String)>,
    /// The source's metadata (its annotations configure the tool).
    source_meta: fn(&TestNs) -> Value,
    /// The metadata the tool gave each copy of `source`.
    copy_meta: fn(&TestNs, &Obj) -> Value,
    /// The configuration import reads from a file rather than the cluster
    /// (a ClusterSecret: its CRD is not installed here), and the source
    /// named in its report.
    file: Option<fn(&TestNs, &str) -> String>,
    report_source: fn(&str) -> String,
    /// The name of the tool's copies (the source is `settings`).
    copy_name: &'static str,
    /// Whether its configuration is the source namespace's (annotations on
    /// the source), so that its rule is a tenant rule there, rather than
    /// the cluster admins' (cluster-scoped), an admin rule.
    tenant: bool,
}

fn no_labels(_: &TestNs) -> Vec<(String, String)> {
    Vec::new()
}

fn config_map_source(src: &str) -> String {
    format!("ConfigMap {src}/settings")
}

const REFLECTOR: &str = "reflector.v1.k8s.emberstack.com/";
const KUBED: &str = "kubed.appscode.com/";

fn reflector() -> Case {
    Case {
        test: "migrate-reflector",
        kind: Kind::ConfigMap,
        tool: "kubernetes-reflector",
        marks: &[REFLECTOR],
        namespace_labels: no_labels,
        // As reflector's README says to annotate a source: allowed and
        // auto-reflected into the namespaces its regex matches.
        source_meta: |t| {
            let pattern = format!("{}-t.*", t.prefix);
            json!({"annotations": {
                format!("{REFLECTOR}reflection-allowed"): "true",
                format!("{REFLECTOR}reflection-allowed-namespaces"): pattern,
                format!("{REFLECTOR}reflection-auto-enabled"): "true",
                format!("{REFLECTOR}reflection-auto-namespaces"): pattern,
            }})
        },
        // Its mirrors: the data alone, and its marks.
        copy_meta: |_, source| {
            json!({"annotations": {
                format!("{REFLECTOR}auto-reflects"): "True",
                format!("{REFLECTOR}reflects"): format!("{}/settings", source.namespace),
                format!("{REFLECTOR}reflected-version"): source.resource_version,
                format!("{REFLECTOR}reflected-at"): "\"2026-11-27T10:00:00.0000000+00:00\"",
            }})
        },
        file: None,
        report_source: config_map_source,
        copy_name: "settings",
        tenant: true,
    }
}

fn config_syncer() -> Case {
    Case {
        test: "migrate-kubed",
        kind: Kind::ConfigMap,
        tool: "config-syncer",
        marks: &[KUBED],
        // Its sync annotation is a namespace selector.
        namespace_labels: |t| vec![("app".to_owned(), t.prefix.clone())],
        source_meta: |t| {
            json!({"labels": {"tier": "shared"}, "annotations": {
                format!("{KUBED}sync"): format!("app={}", t.prefix),
                "owner": "platform",
            }})
        },
        // Its copies: the source's labels and annotations but its sync
        // keys, and its origin marks.
        copy_meta: |_, source| {
            json!({
                "labels": {
                    "tier": "shared",
                    format!("{KUBED}origin.name"): "settings",
                    format!("{KUBED}origin.namespace"): source.namespace,
                    format!("{KUBED}origin.cluster"): "",
                },
                "annotations": {
                    "owner": "platform",
                    format!("{KUBED}origin"): json!({"uid": source.uid, "name": "settings",
                        "namespace": source.namespace, "resourceVersion": source.resource_version})
                        .to_string(),
                },
            })
        },
        file: None,
        report_source: config_map_source,
        copy_name: "settings",
        tenant: true,
    }
}

fn cluster_secret() -> Case {
    Case {
        test: "migrate-csec",
        kind: Kind::Secret,
        tool: "ClusterSecret",
        marks: &["clustersecret.io"],
        namespace_labels: no_labels,
        source_meta: |_| json!({}),
        // Its Secrets: its label and annotations, the data of the Secret
        // its valueFrom names.
        copy_meta: |_, _| {
            json!({
                "labels": {"clustersecret.io": "true"},
                "annotations": {
                    "clustersecret.io/created-by": "ClusterSecrets",
                    "clustersecret.io/version": "0.0.14",
                    "clustersecret.io/last-sync": "2026-11-27T10:00:00",
                },
            })
        },
        // As its README's example: the data from another Secret.
        file: Some(|t, src| {
            format!(
                "apiVersion: clustersecret.io/v1\nkind: ClusterSecret\nmetadata:\n  name: settings\n\
                 matchNamespace:\n  - \"{}-t.*\"\ndata:\n  valueFrom:\n    secretKeyRef:\n      \
                 name: settings\n      namespace: {src}\n",
                t.prefix
            )
        }),
        report_source: |_| "ClusterSecret settings".to_owned(),
        copy_name: "settings",
        tenant: false,
    }
}

/// A ClusterSecret of another name than the Secret its `valueFrom` names:
/// its Secrets take the ClusterSecret's name (`transform.name`).
fn cluster_secret_renamed() -> Case {
    Case {
        test: "migrate-csec-renamed",
        file: Some(|t, src| {
            format!(
                "apiVersion: clustersecret.io/v1\nkind: ClusterSecret\nmetadata:\n  name: shared-settings\n\
                 matchNamespace:\n  - \"{}-t.*\"\ndata:\n  valueFrom:\n    secretKeyRef:\n      \
                 name: settings\n      namespace: {src}\n",
                t.prefix
            )
        }),
        report_source: |_| "ClusterSecret shared-settings".to_owned(),
        copy_name: "shared-settings",
        ..cluster_secret()
    }
}

#[tokio::test]
async fn mirrors_reflector_made_are_imported_planned_and_adopted_without_a_payload_write() {
    migrate(reflector()).await;
}

#[tokio::test]
async fn copies_config_syncer_made_are_imported_planned_and_adopted_without_a_payload_write() {
    migrate(config_syncer()).await;
}

#[tokio::test]
async fn secrets_cluster_secret_made_are_imported_planned_and_adopted_without_a_payload_write() {
    migrate(cluster_secret()).await;
}

#[tokio::test]
async fn secrets_a_cluster_secret_of_another_name_made_are_adopted_under_its_name() {
    migrate(cluster_secret_renamed()).await;
}

/// The body of an object of `kind` with `meta` and the data `k`.
fn body(kind: Kind, meta: Value, value: &str) -> Value {
    match kind {
        Kind::ConfigMap => json!({"metadata": meta, "data": {"k": value}}),
        Kind::Secret => json!({"metadata": meta, "type": "Opaque", "stringData": {"k": value}}),
    }
}

async fn migrate(case: Case) {
    let t = TestNs::new(case.test).await;
    let kind = case.kind;
    let op = t.ns("op").await;
    let src = t.ns("src").await;
    let labels = (case.namespace_labels)(&t);
    let labels: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut targets = Vec::new();
    for i in 0..COPIES {
        let ns = t.ns_labelled(&format!("t{i:02}"), &labels).await;
        // A tenant rule of the source's namespace writes only where it is
        // accepted.
        if case.tenant {
            t.accept_from(&ns, &src).await;
        }
        targets.push(ns);
    }
    if case.tenant {
        // It writes as the source namespace's ServiceAccount, which may
        // edit there and in every target.
        let mut edits: Vec<&str> = targets.iter().map(String::as_str).collect();
        edits.push(&src);
        copier_may_edit(&t, &src, &edits).await;
    }
    let source = t
        .create_json(
            kind,
            &src,
            "settings",
            body(kind, (case.source_meta)(&t), "v1"),
        )
        .await;
    let mut before = BTreeMap::new();
    for ns in &targets {
        let meta = (case.copy_meta)(&t, &source);
        let copy = t
            .create_json(kind, ns, case.copy_name, body(kind, meta, "v1"))
            .await;
        before.insert(ns.clone(), copy);
    }

    // import, from the live cluster (or the tool's file).
    let mut args = vec!["import", "--namespace", &op, "-o", "json"];
    let file = case.file.map(|f| f(&t, &src));
    let path = std::env::temp_dir().join(format!("{}.yaml", t.prefix));
    if let Some(text) = &file {
        std::fs::write(&path, text).expect("the tool's file written");
        args.extend(["-f", path.to_str().expect("a UTF-8 path")]);
    }
    let imported = copyrator(&args, None).await;
    imported.assert_exit(0);
    let imported = imported.json();
    let wanted = (case.report_source)(&src);
    let report = imported["reports"]
        .as_array()
        .and_then(|reports| reports.iter().find(|r| r["source"] == wanted.as_str()))
        .unwrap_or_else(|| panic!("no report of {wanted}: {imported}"));
    println!("import's report: {report}");
    assert_eq!(report["tool"], case.tool);
    let name = report["rules"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no rule made: {report}"))
        .to_owned();
    let rule = imported["rules"]
        .as_array()
        .and_then(|rules| {
            rules
                .iter()
                .find(|r| r["metadata"]["name"] == name.as_str())
        })
        .expect("the rule")
        .clone();
    assert_eq!(rule["spec"]["adopt"], true, "{rule}");
    let rule_ns = if case.tenant { &src } else { &op };
    assert_eq!(rule["metadata"]["namespace"], rule_ns.as_str(), "{rule}");
    let label = imported["sourceLabels"]
        .as_array()
        .and_then(|labels| labels.iter().find(|l| l["namespace"] == src.as_str()))
        .expect("a label for the source")
        .clone();
    let key = label["key"].as_str().expect("a key");
    t.patch(
        kind,
        &src,
        "settings",
        json!({"metadata": {"labels": {key: label["value"]}}}),
    )
    .await;

    // plan, of the rule as printed: every copy adopted, nothing else; exit 2.
    let mut followed = vec!["--namespace", op.as_str()];
    if case.tenant {
        followed.extend(["--all-namespaces", "--rule-name", &name]);
    }
    let mut args = followed.clone();
    args.extend(["-f", "-"]);
    let text = serde_yaml::to_string(&rule).expect("the rule as YAML");
    let plan = copyrator_plan(&args, Some(&text)).await;
    plan.assert_exit(2);
    let totals = format!("rule {rule_ns}/{name}: {COPIES} adopt");
    assert!(
        plan.stdout.lines().any(|l| l == totals),
        "no line {totals:?}: {}",
        plan.stdout
    );
    t.create_rule(rule_ns, &name, json!({"spec": rule["spec"]}))
        .await;

    // Applied, the operator running as the chart's ServiceAccount:
    // adopted, one patch each.
    let cluster = ClusterScoped::new();
    let values: &[&str] = if case.tenant {
        &["--set", "operator.allNamespaces=true"]
    } else {
        &[]
    };
    let id = as_the_chart(&t, &cluster, &op, values).await;
    if case.tenant {
        // The rule's namespace lets the operator act as its account (the
        // chart's opt-in RoleBinding).
        let impersonate = format!("{}-impersonate", t.prefix);
        chart_impersonation_role(&t, &cluster, values, &impersonate).await;
        let opt_in = Binding {
            role_kind: "ClusterRole",
            role: &impersonate,
            account_namespace: &op,
            account: "copyrator",
        };
        bind_as(&t.client, &src, "copyrator-may-act-here", opt_in).await;
        wait_until(
            format!("{} to act as {src}'s copyrator", id.user),
            TIMEOUT,
            async || {
                let attributes = json!({"group": "", "resource": "serviceaccounts",
                                        "verb": "impersonate", "name": "copyrator",
                                        "namespace": src});
                match service_account_may(&t.client, &id.user, &op, attributes).await? {
                    true => Ok(()),
                    false => Err("not yet".to_owned()),
                }
            },
        )
        .await;
    }
    let user = id.user.clone();
    let audit = Audit::start();
    let started = Utc::now();
    let mut run = vec!["run".to_owned()];
    run.extend(followed.iter().map(|arg| arg.to_string()));
    let _operator = Operator::start_with_env(&t, run, &[("KUBECONFIG", &id.kubeconfig)]);
    let status = t
        .wait_rule(rule_ns, &name, "every copy adopted", |r| {
            match (status_u64(r, "adoptedCopies"), status_u64(r, "copies")) {
                (Some(n), Some(c)) if n == COPIES as u64 && c == COPIES as u64 => Ok(()),
                _ => Err(short_status(r)),
            }
        })
        .await;
    println!("status: {}", status["status"]);
    for ns in &targets {
        let now = t.must_get(kind, ns, case.copy_name).await;
        assert_eq!(now.uid, before[ns].uid, "{ns}: the same object");
        assert_eq!(now.data, before[ns].data, "{ns}: the same data");
        let left: Vec<&String> = now
            .labels
            .keys()
            .chain(now.annotations.keys())
            .filter(|k| case.marks.iter().any(|mark| k.starts_with(mark)))
            .collect();
        assert!(
            left.is_empty(),
            "{ns}: {}'s marks stay: {left:?}",
            case.tool
        );
    }
    audit.settle(&t.client, Utc::now()).await;
    let writes_as = |who: &str| {
        let mut writes: BTreeMap<String, usize> = BTreeMap::new();
        for ns in &targets {
            let q = Query::user(who)
                .verbs(WRITE_VERBS)
                .resource(match kind {
                    Kind::ConfigMap => "configmaps",
                    Kind::Secret => "secrets",
                })
                .namespace(ns)
                .between(started, Utc::now() + chrono::Duration::days(1));
            for (verb, n) in audit.by_verb(&q) {
                *writes.entry(verb).or_default() += n;
            }
        }
        writes
    };
    // A tenant rule's writes are sent as its namespace's ServiceAccount.
    let writer = if case.tenant {
        format!("system:serviceaccount:{src}:copyrator")
    } else {
        user.clone()
    };
    let writes = writes_as(&writer);
    println!("the writes ({writer}) where the copies were: {writes:?}");
    assert_eq!(writes, BTreeMap::from([("patch".to_owned(), COPIES)]));
    if case.tenant {
        assert_eq!(writes_as(&user), BTreeMap::new(), "writes as the operator");
    }
    let refused: Vec<_> = [&user, &writer]
        .into_iter()
        .flat_map(|who| audit.matching(&Query::user(who).code(403).between(started, Utc::now())))
        .collect();
    assert!(
        refused.is_empty(),
        "the API server refused requests of the chart's ServiceAccount: {}",
        refused
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    );

    // A change of the source reaches every copy (checked by their data: a
    // rule may strip what the tool did not copy).
    t.set_data(kind, &src, "settings", &[("k", Some("v2"))])
        .await;
    for ns in &targets {
        wait_until(
            format!("{ns}/{} to follow", case.copy_name),
            TIMEOUT,
            async || {
                t.must_get(kind, ns, case.copy_name)
                    .await
                    .data_is(&[("k", "v2")])
            },
        )
        .await;
    }
    if file.is_some() {
        let _ = std::fs::remove_file(&path);
    }
}

// ---------------------------------------------------------------------------
// a tenant's configuration

/// Kyverno's namespaced policies, served by a stand-in of Kyverno's CRD
/// (the real one where it is installed, as `hack/migration-run kyverno`
/// installs it).
fn kyverno_policies() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kyverno.io", "v1", "Policy"),
        "policies",
    )
}

/// Makes `kyverno.io/v1` Policies creatable, where Kyverno's own CRD is
/// not installed: a CRD of that name with a free-form spec (left alone
/// where one exists). And lets a namespace's admins write them, as
/// Kyverno's chart does (its ClusterRole `kyverno:rbac:admin:policies`,
/// aggregated into `admin`).
async fn serve_kyverno_policies(client: &Client) {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "policies.kyverno.io"},
        "spec": {
            "group": "kyverno.io",
            "scope": "Namespaced",
            "names": {"kind": "Policy", "listKind": "PolicyList", "plural": "policies",
                      "singular": "policy", "shortNames": ["pol"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }}},
            }],
        },
    });
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let present = crds
        .get_opt("policies.kyverno.io")
        .await
        .unwrap_or_else(|e| panic!("reading the CRD policies.kyverno.io: {}", err_msg(&e)))
        .is_some();
    if !present {
        apply_crd(client.clone(), &crd, &kyverno_policies()).await;
    }
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "copyrator-tests-kyverno-policies-to-admin",
                     "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
        "rules": [{"apiGroups": ["kyverno.io"], "resources": ["policies"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
    });
    let roles = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
        "clusterroles",
    );
    let role: DynamicObject = serde_json::from_value(role).expect("a ClusterRole");
    match Api::<DynamicObject>::all_with(client.clone(), &roles)
        .create(&PostParams::default(), &role)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("the ClusterRole for Kyverno's policies: {}", err_msg(&e)),
    }
}

/// A Policy of Kyverno's in `namespace` whose rule clones `from/name` into
/// `namespace` as `copy`, when a ConfigMap appears there.
fn clone_policy(namespace: &str, policy: &str, from: &str, name: &str, copy: &str) -> Value {
    json!({
        "apiVersion": "kyverno.io/v1", "kind": "Policy",
        "metadata": {"name": policy, "namespace": namespace},
        "spec": {"rules": [{
            "name": "take",
            "match": {"any": [{"resources": {"kinds": ["ConfigMap"]}}]},
            "generate": {"apiVersion": "v1", "kind": "Secret", "name": copy, "namespace": namespace,
                         "synchronize": true, "clone": {"namespace": from, "name": name}},
        }]},
    })
}

/// The lines of the report on `source` in import's YAML output.
fn report_lines<'a>(printed: &'a str, tool: &str, source: &str) -> Vec<&'a str> {
    let heading = format!("# {tool}: {source}");
    let mut lines = printed.lines().skip_while(|l| *l != heading);
    assert!(lines.next().is_some(), "no report on {source}:\n{printed}");
    lines.take_while(|l| l.starts_with("#   ")).collect()
}

/// The attack of a tenant (a ServiceAccount with `admin` in its namespace
/// only) on an import: a Kyverno Policy of its own that clones another
/// namespace's Secret into its namespace. Kyverno refuses such a Policy;
/// made an admin rule, and the victim's Secret labelled as the import
/// said, it would hand the Secret to the tenant. `copyrator import` of
/// the live cluster prints no rule of it and asks nothing of the victim's
/// Secret; a Policy cloning within its namespace under another name
/// becomes a rule of the tenant's namespace, into that namespace alone
/// (`transform.name`). The tenant's
/// own ConfigMap, annotated for reflector's mirrors everywhere, becomes a
/// rule of the tenant's namespace, applied with kubectl as printed: run
/// (with `--all-namespaces`), it adopts reflector's mirror in the
/// namespace that accepts the tenant and leaves the one in the namespace
/// that does not exactly as it was.
#[tokio::test]
async fn a_tenants_configuration_becomes_its_own_rules_never_the_operators() {
    let t = TestNs::new("import-tenant").await;
    let op = t.ns("op").await;
    let team = t.ns("team").await;
    let victim = t.ns("victim").await;
    let (accepting, refusing) = (t.ns("acc").await, t.ns("ref").await);
    t.accept_from(&accepting, &team).await;
    let secret = t
        .create_json(
            Kind::Secret,
            &victim,
            "db-creds",
            body(Kind::Secret, json!({}), "hunter2"),
        )
        .await;
    serve_kyverno_policies(&t.client).await;
    let tenant = Tenant::admin_of(&t, &team, "tenant").await;
    // Its rules write as its namespace's ServiceAccount, which may edit
    // in both namespaces: the annotation alone tells them apart.
    copier_may_edit(&t, &team, &[&team, &accepting, &refusing]).await;
    let user = format!("system:serviceaccount:{team}:tenant");
    wait_until(
        format!("{user} to write Kyverno's Policies in {team}"),
        TIMEOUT,
        async || {
            let attributes = json!({"group": "kyverno.io", "resource": "policies",
                                    "verb": "create", "namespace": team});
            match service_account_may(&t.client, &user, &team, attributes).await? {
                true => Ok(()),
                false => Err("not yet".to_owned()),
            }
        },
    )
    .await;
    // The attack, and a Policy that keeps within its namespace.
    tenant
        .create(
            &kyverno_policies(),
            clone_policy(&team, "steal", &victim, "db-creds", "db-creds"),
        )
        .await;
    tenant
        .create(
            &kyverno_policies(),
            clone_policy(&team, "local", &team, "settings", "settings-copy"),
        )
        .await;
    // Its ConfigMap, which reflector mirrored into every namespace.
    let shared: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "shared", "annotations": {
            format!("{REFLECTOR}reflection-allowed"): "true",
            format!("{REFLECTOR}reflection-auto-enabled"): "true",
        }},
        "data": {"k": "v1"},
    }))
    .expect("a ConfigMap");
    let shared = Api::<ConfigMap>::namespaced(tenant.client.clone(), &team)
        .create(&PostParams::default(), &shared)
        .await
        .unwrap_or_else(|e| panic!("the tenant's ConfigMap: {}", err_msg(&e)));
    let mut mirrors = Vec::new();
    for ns in [&accepting, &refusing] {
        let meta = json!({"annotations": {
            format!("{REFLECTOR}auto-reflects"): "True",
            format!("{REFLECTOR}reflects"): format!("{team}/shared"),
            format!("{REFLECTOR}reflected-version"): shared.metadata.resource_version,
        }});
        mirrors.push(
            t.create_json(
                Kind::ConfigMap,
                ns,
                "shared",
                body(Kind::ConfigMap, meta, "v1"),
            )
            .await,
        );
    }

    // The admin imports the live cluster (whose other objects are other
    // tests': what concerns this test names its namespaces).
    let imported = copyrator(&["import", "--namespace", &op], None).await;
    imported.assert_exit(0);
    let printed = &imported.stdout;
    let steal = report_lines(
        printed,
        "Kyverno",
        &format!("Policy {team}/steal, rule take"),
    );
    println!("the attack's report: {steal:#?}");
    assert_eq!(
        steal,
        [format!(
            "#   unmapped: it clones from \"{victim}\", not from its own namespace {team}: Kyverno refuses a namespaced Policy that clones from another namespace, so it never copied anything. A Policy is {team}'s configuration, and a rule made from it could take nothing from another namespace without the consent of its owner: no rule is made, and nothing is asked of \"{victim}\""
        )]
    );
    let local = report_lines(
        printed,
        "Kyverno",
        &format!("Policy {team}/local, rule take"),
    );
    assert!(
        local.contains(&"#   exact: copies are named settings-copy, the name generate.name gives them: the source's name settings with \"-copy\" after it (transform.name.suffix)")
            && !local.iter().any(|l| l.starts_with("#   unmapped:")),
        "{local:#?}"
    );
    let rules: Vec<Value> = serde_yaml::Deserializer::from_str(printed)
        .map(Value::deserialize)
        .collect::<Result<Vec<_>, _>>()
        .expect("YAML documents")
        .into_iter()
        .filter(|rule| !rule.is_null())
        .collect();
    let mentions = |text: &str| text.contains(&t.prefix);
    let ours: Vec<&Value> = rules.iter().filter(|r| mentions(&r.to_string())).collect();
    let rule = format!("reflector-configmap-{team}-shared");
    // The local Policy's rule, which the operator run here does not follow.
    let (ours, local): (Vec<&Value>, Vec<&Value>) = ours
        .into_iter()
        .partition(|r| r["metadata"]["name"] == rule.as_str());
    let [local] = local.as_slice() else {
        panic!("{local:#?}");
    };
    assert_eq!(local["metadata"]["namespace"], team.as_str());
    assert_eq!(local["spec"]["namespace"], team.as_str());
    assert_eq!(local["spec"]["targets"], json!({"include": [team]}));
    assert_eq!(
        local["spec"]["transform"],
        json!({"name": {"suffix": "-copy"}})
    );
    let local_rule = local["metadata"]["name"].as_str().unwrap_or_default();
    assert_eq!(ours.len(), 1, "{ours:#?}");
    assert_eq!(
        ours[0]["metadata"],
        json!({"name": rule, "namespace": team})
    );
    assert_eq!(ours[0]["spec"]["namespace"], team.as_str());
    let commands: Vec<&str> = printed
        .lines()
        .filter_map(|l| l.strip_prefix("#   kubectl "))
        .filter(|l| mentions(l))
        .collect();
    assert_eq!(
        commands,
        [
            format!("label configmap -n {team} shared copyrator.flant.com/import.{rule}=true"),
            format!("label secret -n {team} settings copyrator.flant.com/import.{local_rule}=true"),
        ]
    );

    // As printed: the label, then the rule applied with kubectl.
    let file = std::env::temp_dir().join(format!("{}-rules.yaml", t.prefix));
    let documents: Vec<String> = ours
        .iter()
        .map(|r| serde_yaml::to_string(r).expect("YAML"))
        .collect();
    std::fs::write(&file, documents.join("---\n")).expect("the rules written");
    let path = file.to_str().expect("a UTF-8 path").to_owned();
    let label: Vec<String> = commands[0].split(' ').map(str::to_owned).collect();
    tokio::task::spawn_blocking(move || {
        let label: Vec<&str> = label.iter().map(String::as_str).collect();
        kubectl(&label);
        kubectl(&["apply", "-f", &path]);
    })
    .await
    .expect("kubectl");
    let _ = std::fs::remove_file(&file);

    let mut operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &rule]);
    let status = t
        .wait_rule(
            &team,
            &rule,
            "the accepting namespace's mirror adopted",
            |r| match (
                status_u64(r, "adoptedCopies"),
                status_u64(r, "copies"),
                status_u64(r, "conflictCount"),
            ) {
                (Some(1), Some(1), Some(0)) => Ok(()),
                _ => Err(short_status(r)),
            },
        )
        .await;
    println!("status: {}", status["status"]);
    let adopted = t.must_get(Kind::ConfigMap, &accepting, "shared").await;
    assert_eq!(adopted.uid, mirrors[0].uid, "the same object");
    assert!(adopted.is_copy(), "{:?}", adopted.labels);
    let left = t.must_get(Kind::ConfigMap, &refusing, "shared").await;
    assert_eq!(
        (&left.resource_version, &left.annotations),
        (&mirrors[1].resource_version, &mirrors[1].annotations),
        "the mirror where the tenant may not write was touched"
    );
    // Nobody harmed: the victim's Secret as it was, and no copy of it.
    let now = t.must_get(Kind::Secret, &victim, "db-creds").await;
    assert_eq!(now.resource_version, secret.resource_version);
    assert!(t.get(Kind::Secret, &team, "db-creds").await.is_none());
    operator.assert_running();
}

/// Label values that YAML 1.1 (kubectl's, Helm's reader) takes for no
/// string, yet valid label values: each must reach the API server as the
/// string it is.
const YAML_1_1_LABEL_VALUES: &[&str] = &[
    "yes",
    "Yes",
    "no",
    "NO",
    "on",
    "Off",
    "y",
    "N",
    "true",
    "null",
    "1",
    "1.0",
    "0o17",
    "017",
    "0x1F",
    "1_000",
    "1e3",
    "2001-12-14",
    "nan",
];

/// What `import` prints applies as printed: a Kyverno ClusterPolicy whose
/// clones go to namespaces selected by labels whose values YAML 1.1 reads
/// as booleans, numbers or dates, and whose sources are selected so as
/// well. The printed YAML goes through `kubectl apply --dry-run=server`,
/// and the spec the API server would store is the spec `import -o json`
/// says.
#[tokio::test]
async fn imported_rules_apply_as_printed_whatever_yaml_1_1_reads() {
    let t = TestNs::new("import-apply").await;
    let op = t.ns("op").await;
    let labels: BTreeMap<String, String> = YAML_1_1_LABEL_VALUES
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("l{i}"), (*v).to_owned()))
        .collect();
    let policy = json!({
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "yaml-1-1"},
        "spec": {"rules": [{
            "name": "sync",
            "match": {"any": [{"resources": {
                "kinds": ["Namespace"],
                "selector": {"matchLabels": labels.clone()},
            }}]},
            "generate": {
                "namespace": "{{request.object.metadata.name}}",
                "synchronize": true,
                "cloneList": {
                    "namespace": "staging",
                    "kinds": ["v1/ConfigMap"],
                    "selector": {"matchLabels": {"allowedToBeCloned": "yes"}},
                },
            },
        }]},
    });
    // Written as JSON, which is YAML whose strings every reader reads so.
    let path = std::env::temp_dir().join(format!("{}-policy.yaml", t.prefix));
    std::fs::write(&path, policy.to_string()).expect("the policy written");
    let file = path.to_str().expect("a UTF-8 path");
    let (printed, intended) = apply_import_as_printed(&t, &op, file).await;
    let _ = std::fs::remove_file(&path);
    assert!(!intended.is_empty(), "no rule imported: {printed}");
    assert!(
        printed.contains("\"yes\""),
        "a label value yes is quoted:\n{printed}"
    );
    let selected = &intended[0]["spec"]["targets"]["namespaceSelector"]["matchLabels"];
    assert_eq!(selected, &json!(labels), "every label kept as a string");
}

/// `import --namespace op -f file` as printed, applied with `kubectl apply
/// --dry-run=server`: the API server would store, for each rule, the spec
/// that `import -o json` means. Namespaces the printed rules live in (a
/// tenant rule's is its source's) are made first if missing, and removed
/// after. Returns what was printed and the rules meant.
async fn apply_import_as_printed(t: &TestNs, op: &str, file: &str) -> (String, Vec<Value>) {
    let printed = copyrator(&["import", "--namespace", op, "-f", file], None).await;
    printed.assert_exit(0);
    let intended = copyrator(
        &["import", "--namespace", op, "-f", file, "-o", "json"],
        None,
    )
    .await;
    intended.assert_exit(0);
    let intended = intended.json();
    let intended = intended["rules"].as_array().cloned().unwrap_or_default();
    if intended.is_empty() {
        return (printed.stdout, intended);
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(t.client.clone());
    let mut made = Vec::new();
    for rule in &intended {
        let namespace = rule["metadata"]["namespace"].as_str().unwrap_or_default();
        let exists = namespaces
            .get_opt(namespace)
            .await
            .unwrap_or_else(|e| panic!("reading namespace {namespace}: {e}"))
            .is_some();
        if !exists && !made.iter().any(|m| m == namespace) {
            let object = serde_json::from_value(json!({"metadata": {"name": namespace}}))
                .expect("a Namespace");
            namespaces
                .create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("making namespace {namespace}: {e}"));
            made.push(namespace.to_owned());
        }
    }
    let printed_path = std::env::temp_dir().join(format!(
        "{}-{}-rules.yaml",
        t.prefix,
        std::path::Path::new(file)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("import")
    ));
    std::fs::write(&printed_path, &printed.stdout).expect("the rules written");
    let stored = kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        printed_path.to_str().expect("a UTF-8 path"),
        "-o",
        "json",
    ]);
    let _ = std::fs::remove_file(&printed_path);
    for namespace in made {
        let _ = namespaces.delete(&namespace, &Default::default()).await;
    }
    let stored: Value = serde_json::from_str(&stored).expect("kubectl's JSON");
    let stored: Vec<Value> = match stored["kind"].as_str() {
        Some("List") => stored["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![stored],
    };
    assert_eq!(
        stored.len(),
        intended.len(),
        "{file}: one stored rule per printed rule"
    );
    for (stored, intended) in stored.iter().zip(&intended) {
        assert_eq!(
            stored["spec"], intended["spec"],
            "{file}: the API server would store another spec than import meant"
        );
    }
    (printed.stdout, intended)
}

/// What `import` prints for every configuration of the import corpus
/// (public configurations of each tool, `tests/data/import-corpus/`)
/// applies with kubectl as printed, and means what `-o json` says.
#[tokio::test]
async fn what_import_prints_for_every_corpus_configuration_applies_as_printed() {
    let t = TestNs::new("import-corpus").await;
    let op = t.ns("op").await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/import-corpus");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&root)
        .expect("the corpus")
        .filter_map(Result::ok)
        .flat_map(|tool| std::fs::read_dir(tool.path()).into_iter().flatten())
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 25, "{} corpus files", files.len());
    let mut rules = 0;
    for path in &files {
        let (_, intended) =
            apply_import_as_printed(&t, &op, path.to_str().expect("a UTF-8 path")).await;
        rules += intended.len();
    }
    println!(
        "import corpus: {} files, {rules} rules applied as printed",
        files.len()
    );
    assert!(rules > 0, "no corpus file made a rule");
}

/// A mirror reflector's users made by hand under another name than its
/// source (`reflects` on `settings-mirror`): `copyrator import` makes it a
/// rule of the mirror's namespace with `transform.name`, every line exact
/// or differing, none unmapped; applied as printed (the label and the
/// consent on the source, which its owner puts), the rule adopts the
/// mirror: the same object, the same data, reflector's marks gone.
#[tokio::test]
async fn a_mirror_made_by_hand_under_another_name_is_imported_and_adopted() {
    let t = TestNs::new("import-mirror").await;
    let op = t.ns("op").await;
    let src = t.ns("src").await;
    let t1 = t.ns("t1").await;
    let allowed = format!("{}-t.*", t.prefix);
    t.create_json(
        Kind::ConfigMap,
        &src,
        "settings",
        body(
            Kind::ConfigMap,
            json!({"annotations": {
                format!("{REFLECTOR}reflection-allowed"): "true",
                format!("{REFLECTOR}reflection-allowed-namespaces"): allowed,
            }}),
            "v1",
        ),
    )
    .await;
    let mirror = t
        .create_json(
            Kind::ConfigMap,
            &t1,
            "settings-mirror",
            body(
                Kind::ConfigMap,
                json!({"annotations": {format!("{REFLECTOR}reflects"): format!("{src}/settings")}}),
                "v1",
            ),
        )
        .await;
    let imported = copyrator(&["import", "--namespace", &op, "-o", "json"], None).await;
    imported.assert_exit(0);
    let imported = imported.json();
    let wanted = format!("ConfigMap {t1}/settings-mirror");
    let report = imported["reports"]
        .as_array()
        .and_then(|reports| reports.iter().find(|r| r["source"] == wanted.as_str()))
        .unwrap_or_else(|| panic!("no report of {wanted}: {imported}"));
    println!("import's report: {report}");
    assert_eq!(report["unmapped"], json!([]), "{report}");
    let name = report["rules"][0].as_str().expect("a rule made").to_owned();
    let rule = imported["rules"]
        .as_array()
        .and_then(|rules| {
            rules
                .iter()
                .find(|r| r["metadata"]["name"] == name.as_str())
        })
        .expect("the rule")
        .clone();
    assert_eq!(
        (
            &rule["metadata"]["namespace"],
            &rule["spec"]["transform"]["name"]
        ),
        (&json!(t1), &json!({"template": "settings-mirror"})),
        "{rule}"
    );
    // What the source's owner puts on it, as the report says (no command
    // is printed for an object outside the rule's namespace): the rule's
    // label and the consent to copies into the mirror's namespace.
    let selector = rule["spec"]["selector"].clone();
    let mut labels = selector.as_object().expect("a map of labels").clone();
    assert_eq!(labels.len(), 1, "{selector}");
    t.patch(
        Kind::ConfigMap,
        &src,
        "settings",
        json!({"metadata": {
            "labels": Value::Object(std::mem::take(&mut labels)),
            "annotations": {"copyrator.flant.com/allow-to": t1},
        }}),
    )
    .await;
    // The rule writes as its namespace's ServiceAccount, which may read
    // the source and edit where it copies.
    copier_may_edit(&t, &t1, &[&t1, &src]).await;
    t.create_rule(&t1, &name, json!({"spec": rule["spec"]}))
        .await;
    let _operator = Operator::start(&t, &op, &["--all-namespaces", "--rule-name", &name]);
    t.wait_rule(&t1, &name, "the mirror adopted", |r| {
        match (status_u64(r, "adoptedCopies"), status_u64(r, "copies")) {
            (Some(1), Some(1)) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    let now = t.must_get(Kind::ConfigMap, &t1, "settings-mirror").await;
    assert_eq!(now.uid, mirror.uid, "the same object");
    assert_eq!(now.data, mirror.data, "the same data");
    assert!(
        !now.annotations.keys().any(|k| k.starts_with(REFLECTOR)),
        "reflector's marks stay: {:?}",
        now.annotations
    );
    // Its source's change reaches it.
    t.set_data(Kind::ConfigMap, &src, "settings", &[("k", Some("v2"))])
        .await;
    t.wait_obj(
        Kind::ConfigMap,
        &t1,
        "settings-mirror",
        "following its source",
        |o| o.data_is(&[("k", "v2")]),
    )
    .await;
}
