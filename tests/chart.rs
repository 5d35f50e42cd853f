//! The Helm chart: its RBAC is exactly what the operator uses (rendered and
//! checked statically), it is enough for the whole job (the operator runs
//! as the chart's ServiceAccount against the real API server), and install,
//! upgrade and uninstall work.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use common::audit::{Audit, Query, WRITE_VERBS, service_account_user};
use common::*;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

fn chart_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/chart").to_string()
}

/// The pinned helm: on PATH after `eval "$(hack/cluster up)"`, or in the cache.
fn helm() -> Command {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("helm").is_file()))
        .unwrap_or(false);
    if on_path {
        return Command::new("helm");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME is set");
    let cached = cache.join("copyrator/k8s-1.37.2/bin/helm");
    assert!(
        cached.is_file(),
        "helm is neither on PATH nor at {}; run hack/cluster build",
        cached.display()
    );
    Command::new(cached)
}

fn run(mut cmd: Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn render(args: &[&str]) -> Vec<Value> {
    let mut cmd = helm();
    cmd.args([
        "template",
        "copyrator",
        &chart_dir(),
        "--namespace",
        "copyrator",
    ])
    .args(args);
    let yaml = run(cmd, "helm template");
    serde_yaml::Deserializer::from_str(&yaml)
        .filter_map(|doc| {
            let value: Value = serde::Deserialize::deserialize(doc).ok()?;
            (!value.is_null()).then_some(value)
        })
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("the chart renders no {kind}"))
}

fn grants(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        for group in rule["apiGroups"].as_array().expect("apiGroups") {
            for resource in rule["resources"].as_array().expect("resources") {
                for verb in rule["verbs"].as_array().expect("verbs") {
                    out.insert((
                        group.as_str().unwrap_or_default().to_string(),
                        resource.as_str().unwrap_or_default().to_string(),
                        verb.as_str().unwrap_or_default().to_string(),
                    ));
                }
            }
        }
    }
    out
}

fn set(items: &[(&str, &str, &str)]) -> BTreeSet<(String, String, String)> {
    items
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect()
}

/// What the operator's code calls: watches (list, watch), copy writes
/// (create, update, delete), a read on a name conflict (get), finalizer and
/// status patches, events (create; patch for a repeated event), and the Lease.
#[test]
fn rendered_rbac_has_no_wildcard_and_grants_only_what_the_operator_uses() {
    let docs = render(&[]);
    let cluster_role = find(&docs, "ClusterRole");
    for (group, resource, verb) in grants(cluster_role) {
        assert!(
            !group.contains('*') && !resource.contains('*') && !verb.contains('*'),
            "wildcard in the ClusterRole: {group}/{resource} {verb}"
        );
    }
    let mut expected = vec![
        ("flant.com", "copyrators", "list"),
        ("flant.com", "copyrators", "watch"),
        ("flant.com", "copyrators", "patch"),
        ("flant.com", "copyrators/status", "patch"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
    ];
    for resource in ["configmaps", "secrets"] {
        for verb in ["get", "list", "watch", "create", "update", "delete"] {
            expected.push(("", resource, verb));
        }
    }
    assert_eq!(grants(cluster_role), set(&expected));

    let role = find(&docs, "Role");
    assert_eq!(
        grants(role),
        set(&[
            ("coordination.k8s.io", "leases", "get"),
            ("coordination.k8s.io", "leases", "create"),
            ("coordination.k8s.io", "leases", "update"),
        ])
    );
    assert_eq!(role["metadata"]["namespace"], "copyrator");

    // Without leader election there is no Lease to grant.
    let docs = render(&["--set", "leaderElection.enabled=false"]);
    assert!(docs.iter().all(|d| d["kind"] != "Role"));
}

#[test]
fn deployment_runs_locked_down_with_probes() {
    let docs = render(&[]);
    let deployment = find(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["limits"]["memory"].is_string());
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert_eq!(
        container["image"], "copyrator:0.1.0",
        "the tag defaults to appVersion"
    );
    let env = container["env"].as_array().expect("env");
    let namespace = env
        .iter()
        .find(|e| e["name"] == "NAMESPACE")
        .expect("NAMESPACE env");
    assert_eq!(
        namespace["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    let leader = env
        .iter()
        .find(|e| e["name"] == "LEADER_ELECTION")
        .expect("LEADER_ELECTION env");
    assert_eq!(
        leader["value"], "true",
        "leader election is on by default in the chart"
    );
}

/// Uninstalls the release when the test ends, passed or not.
struct Release {
    name: String,
    namespace: String,
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = helm()
            .args(["uninstall", &self.name, "--namespace", &self.namespace])
            .output();
    }
}

/// The operator, running outside the cluster as the chart's ServiceAccount
/// (RBAC on), does its whole job: ConfigMap and Secret copies, a new
/// namespace filled, a copy repaired (update), a conflict (get), a prune,
/// status, events (one repeated, which patches it), the Lease, and a rule
/// deleted with its copies. A request of the ServiceAccount that the API
/// server answered 403 (its audit log) fails the test too, so a verb
/// missing from the chart cannot go unnoticed even where the operator
/// copes with the refusal.
#[tokio::test]
async fn operator_as_the_charts_service_account_does_its_whole_job() {
    let t = TestNs::new("chart-rbac").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let release = format!("copyrator-{}", random5());
    let mut install = helm();
    install.args([
        "install",
        &release,
        &chart_dir(),
        "--namespace",
        &op,
        "--set",
        "replicaCount=1",
    ]);
    run(install, "helm install");
    let _release = Release {
        name: release.clone(),
        namespace: op.clone(),
    };
    // No kubelet runs here, so the Deployment exists but no pod starts.
    let mut get = Command::new("kubectl");
    get.args([
        "get",
        "deployment",
        &release,
        "--namespace",
        &op,
        "-o",
        "name",
    ]);
    assert_eq!(
        run(get, "kubectl get deployment").trim(),
        format!("deployment.apps/{release}")
    );

    let kubeconfig =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{release}.kubeconfig"));
    service_account_kubeconfig(&op, &release, &kubeconfig);
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let user = service_account_user(&op, &release);
    let audit = Audit::start();
    let started = chrono::Utc::now();
    let mut operator = Operator::start_with_env(
        &t,
        vec![
            "run".into(),
            "--namespace".into(),
            op.clone(),
            "--leader-election".into(),
            "--lease-name".into(),
            release.clone(),
            "--lease-duration".into(),
            "5".into(),
        ],
        &[("KUBECONFIG", &kubeconfig)],
    );

    t.create_rule(&op, "cms", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(
        &op,
        "secrets",
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
    )
    .await;
    let cm = t
        .create_source(CM, &op, "settings", &[], &[("k", "v")])
        .await;
    let secret = t
        .create_source(SECRET, &op, "token", &[], &[("password", "p")])
        .await;
    t.wait_copy(CM, &t1, &cm, &op, "cms").await;
    t.wait_copy(SECRET, &t1, &secret, &op, "secrets").await;

    // A new namespace is filled.
    let t2 = t.ns("t2").await;
    t.wait_copy(CM, &t2, &cm, &op, "cms").await;
    t.wait_copy(SECRET, &t2, &secret, &op, "secrets").await;

    // Edited copies are put back (update), for both kinds.
    t.set_data(CM, &t1, "settings", &[("k", Some("edited"))])
        .await;
    t.wait_obj(CM, &t1, "settings", "the edit reverted", |o| {
        o.data_is(&[("k", "v")])
    })
    .await;
    t.set_data(SECRET, &t1, "token", &[("password", Some("edited"))])
        .await;
    t.wait_obj(SECRET, &t1, "token", "the edit reverted", |o| {
        o.data_is(&[("password", "p")])
    })
    .await;

    // A foreign object of a source's name is read and reported (get), for
    // both kinds: made first, then its namespace joins the targets.
    let t3 = t.ns("u3").await;
    t.create_plain(CM, &t3, "settings", &[], &[("mine", "1")])
        .await;
    t.create_plain(SECRET, &t3, "token", &[], &[("mine", "1")])
        .await;
    for rule in ["cms", "secrets"] {
        t.patch_rule(
            &op,
            rule,
            json!({"spec": {"targets": {"include": [t.glob("t"), t.glob("u")]}}}),
        )
        .await;
    }
    for rule in ["cms", "secrets"] {
        t.wait_rule(&op, rule, "the conflict in status", |r| {
            let conflicts = r
                .pointer("/status/conflicts")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if conflicts.iter().any(|c| c["namespace"] == t3.as_str()) {
                Ok(())
            } else {
                Err(short_status(r))
            }
        })
        .await;
    }

    // Two prunes with the same event note: the second patches the event.
    for round in 0..2 {
        let name = format!("extra-{round}");
        let extra = t.create_source(CM, &op, &name, &[], &[("n", "1")]).await;
        t.wait_copy(CM, &t1, &extra, &op, "cms").await;
        t.set_labels(CM, &op, &name, &[(TEST_LABEL, None)]).await;
        t.wait_gone(CM, &t1, &name, "the source stopped matching")
            .await;
        t.wait_gone(CM, &t2, &name, "the source stopped matching")
            .await;
    }
    wait_until(
        "a Pruned event for rule cms, repeated",
        TIMEOUT,
        async || {
            let events = t.events_regarding(&op, "cms").await;
            let pruned: Vec<_> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("Pruned"))
                .collect();
            let repeated = pruned
                .iter()
                .any(|e| e.series.as_ref().is_some_and(|s| s.count >= 2));
            if repeated {
                Ok(())
            } else {
                Err(format!(
                    "{} Pruned events, none with a series",
                    pruned.len()
                ))
            }
        },
    )
    .await;

    // Status written.
    t.wait_rule_ready(&op, "secrets").await;

    // A deleted rule takes its copies along.
    t.delete_rule(&op, "secrets").await;
    t.wait_gone(SECRET, &t1, "token", "its rule was deleted")
        .await;
    t.wait_gone(SECRET, &t2, "token", "its rule was deleted")
        .await;
    t.wait_rule_gone(&op, "secrets", "the finalizer let it go")
        .await;

    // The Lease is held by this operator.
    let mut lease = Command::new("kubectl");
    lease.args([
        "get",
        "lease",
        &release,
        "--namespace",
        &op,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(
        !run(lease, "kubectl get lease").trim().is_empty(),
        "the Lease has no holder"
    );

    operator.assert_running();

    // Every request the ServiceAccount sent meanwhile, as the API server
    // answered it: none refused with 403.
    let end = chrono::Utc::now();
    audit.settle(&t.client, end).await;
    let sent = Query::user(&user).between(started, end);
    let writes = audit.by_verb(&sent.clone().verbs(WRITE_VERBS));
    println!(
        "requests of {user}: by code {:?}, writes by verb {writes:?}",
        audit.by_code(&sent)
    );
    // The query sees the operator's requests (else "no 403" proves nothing).
    for verb in ["create", "update", "delete", "patch"] {
        assert!(
            writes.get(verb).is_some_and(|n| *n > 0),
            "no {verb} request of {user} in the audit log: {writes:?}"
        );
    }
    let refused = audit.matching(&sent.code(403));
    assert!(
        refused.is_empty(),
        "the API server refused {} requests of the chart's ServiceAccount (403):\n{}",
        refused.len(),
        refused
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// `helm upgrade` changes the Deployment; `helm uninstall` removes what
/// the release made and keeps the CRD (Helm never deletes `crds/`), so
/// rules and copies survive an uninstall.
#[tokio::test]
async fn helm_upgrade_and_uninstall() {
    let t = TestNs::new("chart-upgrade").await;
    let op = t.ns("op").await;
    let release = format!("copyrator-{}", random5());
    let mut install = helm();
    install.args(["install", &release, &chart_dir(), "--namespace", &op]);
    run(install, "helm install");
    let guard = Release {
        name: release.clone(),
        namespace: op.clone(),
    };

    let mut upgrade = helm();
    upgrade.args([
        "upgrade",
        &release,
        &chart_dir(),
        "--namespace",
        &op,
        "--reuse-values",
        "--set",
        "operator.logLevel=debug",
        "--set",
        "replicaCount=3",
    ]);
    run(upgrade, "helm upgrade");
    let mut get = Command::new("kubectl");
    get.args([
        "get",
        "deployment",
        &release,
        "--namespace",
        &op,
        "-o",
        "json",
    ]);
    let deployment: Value =
        serde_json::from_str(&run(get, "kubectl get deployment")).expect("deployment JSON");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e["name"] == "LOG_LEVEL" && e["value"] == "debug"),
        "the upgrade did not reach the Deployment: {env:?}"
    );
    let mut history = helm();
    history.args(["history", &release, "--namespace", &op, "-o", "json"]);
    let revisions: Value =
        serde_json::from_str(&run(history, "helm history")).expect("history JSON");
    assert_eq!(revisions.as_array().map(Vec::len), Some(2));

    drop(guard);
    for (kind, name) in [
        ("deployment", release.clone()),
        ("serviceaccount", release.clone()),
        ("clusterrole", release.clone()),
        ("clusterrolebinding", release.clone()),
    ] {
        let mut get = Command::new("kubectl");
        get.args([
            "get",
            kind,
            &name,
            "--namespace",
            &op,
            "--ignore-not-found",
            "-o",
            "name",
        ]);
        assert_eq!(
            run(get, "kubectl get").trim(),
            "",
            "{kind} {name} is left after uninstall"
        );
    }
    let mut crd = Command::new("kubectl");
    crd.args(["get", "crd", CRD_NAME, "-o", "name"]);
    assert_eq!(
        run(crd, "kubectl get crd").trim(),
        format!("customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}"),
        "helm uninstall must keep the CRD"
    );
}
