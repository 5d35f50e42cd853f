//! `spec.rollout.restartConsumers` against a real control plane: the
//! Deployments, StatefulSets and DaemonSets that use a changed copy get a
//! pod-template annotation (no node runs their pods here: the annotation is
//! what rolls them, and `make e2e` shows a roll on a node), exactly those,
//! once per content; a rule without the field never touches a workload;
//! a refused patch is reported once, not retried in a storm.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::audit::{Audit, Query};
use crate::common::members::{Member, OUTAGE, members};
use crate::common::rbac::{ClusterScoped, Grant, Identity, grants_of, operator_rules};
use crate::common::*;
use chrono::Utc;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const PREFIX: &str = "copyrator.flant.com/restart-";
/// How long "nothing more happens" is watched for.
const QUIET: Duration = Duration::from_secs(6);

pub(crate) fn workload_resource(kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_ascii_lowercase());
    ApiResource {
        group: "apps".into(),
        version: "v1".into(),
        api_version: "apps/v1".into(),
        kind: kind.into(),
        plural,
    }
}

/// A pod spec whose one container has `container` merged in, and `volumes`.
pub(crate) fn pod(container: Value, volumes: Value) -> Value {
    let mut c = json!({"name": "c", "image": "copyrator", "imagePullPolicy": "Never"});
    c.as_object_mut()
        .unwrap()
        .extend(container.as_object().unwrap().clone());
    json!({"containers": [c], "volumes": volumes})
}

/// Creates the workload `kind` `ns/name` with `pod` as its pod spec and
/// `annotations` on the workload itself.
pub(crate) async fn workload(
    t: &TestNs,
    kind: &str,
    ns: &str,
    name: &str,
    pod: Value,
    annotations: Value,
) {
    workload_as(&t.client, kind, ns, name, pod, annotations).await;
}

/// [`workload`], created through `client` (a tenant's).
pub(crate) async fn workload_as(
    client: &kube::Client,
    kind: &str,
    ns: &str,
    name: &str,
    pod: Value,
    annotations: Value,
) {
    let mut spec = json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
    });
    if kind == "StatefulSet" {
        spec["serviceName"] = json!(name);
    }
    let body = json!({
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": spec,
    });
    let object: DynamicObject = serde_json::from_value(body).unwrap();
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &workload_resource(kind))
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {kind} {ns}/{name}: {}", err_msg(&e)));
}

/// The restart annotations of a workload's pod template, and its generation.
pub(crate) async fn restarts_of(
    t: &TestNs,
    kind: &str,
    ns: &str,
    name: &str,
) -> (BTreeMap<String, String>, i64) {
    restarts_as(&t.client, kind, ns, name).await
}

/// [`restarts_of`], read through `client` (a tenant's).
pub(crate) async fn restarts_as(
    client: &kube::Client,
    kind: &str,
    ns: &str,
    name: &str,
) -> (BTreeMap<String, String>, i64) {
    let object =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &workload_resource(kind))
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading {kind} {ns}/{name}: {}", err_msg(&e)));
    let annotations: BTreeMap<String, String> =
        object.data["spec"]["template"]["metadata"]["annotations"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.starts_with(PREFIX))
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
    (annotations, object.metadata.generation.unwrap_or_default())
}

/// The workloads of [`consumers`], by kind and name.
const ALL: [(&str, &str); 8] = [
    ("Deployment", "uses-a"),
    ("Deployment", "uses-b"),
    ("Deployment", "whole"),
    ("Deployment", "projected-a"),
    ("Deployment", "unrelated"),
    ("Deployment", "opted-out"),
    ("StatefulSet", "sts-whole"),
    ("DaemonSet", "ds-init-a"),
];

/// Workloads in `ns` that use the ConfigMap `cfg` in each way, one that
/// uses another, and one that opted out.
async fn consumers(t: &TestNs, ns: &str) {
    let key_ref = |key: &str| json!({"env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": key}}}]});
    let none = json!({});
    workload(
        t,
        "Deployment",
        ns,
        "uses-a",
        pod(key_ref("a"), json!([])),
        none.clone(),
    )
    .await;
    let b_volume =
        json!([{"name": "v", "configMap": {"name": "cfg", "items": [{"key": "b", "path": "b"}]}}]);
    workload(
        t,
        "Deployment",
        ns,
        "uses-b",
        pod(json!({}), b_volume),
        none.clone(),
    )
    .await;
    let env_from = json!({"envFrom": [{"configMapRef": {"name": "cfg"}}]});
    workload(
        t,
        "Deployment",
        ns,
        "whole",
        pod(env_from, json!([])),
        none.clone(),
    )
    .await;
    let projected_a = json!([{"name": "v", "projected": {"sources": [
        {"configMap": {"name": "cfg", "items": [{"key": "a", "path": "a"}]}}
    ]}}]);
    workload(
        t,
        "Deployment",
        ns,
        "projected-a",
        pod(json!({}), projected_a),
        none.clone(),
    )
    .await;
    let other = json!({"envFrom": [{"configMapRef": {"name": "other"}}]});
    workload(
        t,
        "Deployment",
        ns,
        "unrelated",
        pod(other, json!([])),
        none.clone(),
    )
    .await;
    let whole_volume = json!([{"name": "v", "configMap": {"name": "cfg"}}]);
    workload(
        t,
        "Deployment",
        ns,
        "opted-out",
        pod(json!({}), whole_volume.clone()),
        json!({"copyrator.flant.com/restart": "false"}),
    )
    .await;
    let projected_whole =
        json!([{"name": "v", "projected": {"sources": [{"configMap": {"name": "cfg"}}]}}]);
    workload(
        t,
        "StatefulSet",
        ns,
        "sts-whole",
        pod(json!({}), projected_whole),
        none.clone(),
    )
    .await;
    let mut ds = pod(json!({}), json!([]));
    let mut init = json!({"name": "init", "image": "copyrator", "imagePullPolicy": "Never"});
    init.as_object_mut()
        .unwrap()
        .extend(key_ref("a").as_object().unwrap().clone());
    ds["initContainers"] = json!([init]);
    workload(t, "DaemonSet", ns, "ds-init-a", ds, none).await;
}

/// Every workload of [`ALL`]: its restart annotations and generation.
async fn snapshot(t: &TestNs, ns: &str) -> BTreeMap<&'static str, (BTreeMap<String, String>, i64)> {
    let mut all = BTreeMap::new();
    for (kind, name) in ALL {
        all.insert(name, restarts_of(t, kind, ns, name).await);
    }
    all
}

/// The names among `ALL` whose annotations differ between two snapshots.
fn rolled(
    before: &BTreeMap<&'static str, (BTreeMap<String, String>, i64)>,
    after: &BTreeMap<&'static str, (BTreeMap<String, String>, i64)>,
) -> BTreeSet<&'static str> {
    after
        .iter()
        .filter(|(name, (annotations, _))| before.get(*name).map(|b| &b.0) != Some(annotations))
        .map(|(name, _)| *name)
        .collect()
}

/// Events of `reason` regarding the rule `ns/name`, their notes.
async fn notes(t: &TestNs, ns: &str, name: &str, reason: &str) -> Vec<String> {
    t.events_regarding(ns, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// `copyrator_consumer_restarts_total`, every kind.
async fn restarts_total(port: u16) -> Result<f64, String> {
    let (_, metrics) = http_get(port, "/metrics").await?;
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("copyrator_consumer_restarts_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Waits until the operator has rolled `want` workloads in all.
async fn wait_restarts(operator: &Operator, want: f64) {
    wait_until(
        format!("{want} consumer restarts"),
        TIMEOUT,
        async || match restarts_total(operator.port).await? {
            n if n == want => Ok(()),
            n => Err(format!("{n}")),
        },
    )
    .await;
}

fn restart_spec(t: &TestNs, include: &str) -> Value {
    restart_spec_of(CM, t, include)
}

/// [`restart_spec`] for a rule of `kind`.
fn restart_spec_of(kind: Kind, t: &TestNs, include: &str) -> Value {
    with(
        rule_spec(kind, t.selector(), &[include]),
        "/spec/rollout",
        json!({"restartConsumers": true}),
    )
}

/// A change of the source rolls exactly the workloads that use what
/// changed: a key-naming one only for its keys, a whole-object one on any
/// change, never an unrelated or opted-out one; the same content written
/// again (a neighbour's edit of the copy restored) rolls nothing.
#[tokio::test]
async fn exactly_the_consumers_roll_once_per_content() {
    let t = TestNs::new("restart-exact").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "roll", restart_spec(&t, &t.glob("t1")))
        .await;
    let operator = Operator::start(&t, &op, &["--min-restart-interval", "0"]);
    let source = t
        .create_source(CM, &op, "cfg", &[], &[("a", "1"), ("b", "1")])
        .await;
    t.wait_copy(CM, &t1, &source, &op, "roll").await;
    consumers(&t, &t1).await;
    let start = snapshot(&t, &t1).await;
    assert!(
        start.values().all(|(a, _)| a.is_empty()),
        "a copy created rolls nothing: {start:?}"
    );

    // Key b changes: whoever uses b or the whole object rolls.
    let source = t.set_data(CM, &op, "cfg", &[("b", Some("2"))]).await;
    t.wait_copy(CM, &t1, &source, &op, "roll").await;
    wait_restarts(&operator, 3.0).await;
    let after_b = snapshot(&t, &t1).await;
    assert_eq!(
        rolled(&start, &after_b),
        BTreeSet::from(["uses-b", "whole", "sts-whole"]),
        "b changed: {after_b:?}"
    );

    // Key a changes: its users and the whole-object ones roll, uses-b does not.
    let source = t.set_data(CM, &op, "cfg", &[("a", Some("2"))]).await;
    t.wait_copy(CM, &t1, &source, &op, "roll").await;
    wait_restarts(&operator, 8.0).await;
    let after_a = snapshot(&t, &t1).await;
    assert_eq!(
        rolled(&after_b, &after_a),
        BTreeSet::from(["uses-a", "projected-a", "ds-init-a", "whole", "sts-whole"]),
        "a changed: {after_a:?}"
    );

    // A neighbour edits the copy; Copyrator restores it: the same content
    // as the workloads carry, so nothing rolls.
    let edited = t
        .set_data(CM, &t1, "cfg", &[("a", Some("neighbour"))])
        .await;
    t.wait_obj(CM, &t1, "cfg", "the copy restored", |o| {
        if o.resource_version == edited.resource_version {
            return Err("not yet written back".into());
        }
        o.data_is(&[("a", "2"), ("b", "2")])
    })
    .await;
    assert_for("no workload to roll again", QUIET, async || {
        let now = snapshot(&t, &t1).await;
        if now == after_a {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    for name in ["unrelated", "opted-out"] {
        assert!(after_a[name].0.is_empty(), "{name} never rolls");
    }
    assert_eq!(
        restarts_total(operator.port).await,
        Ok(8.0),
        "3 then 5 restarts"
    );
    let said = notes(&t, &op, "roll", "ConsumersRestarted").await;
    assert!(
        said.iter()
            .any(|n| n.contains("Deployment") && n.contains("workloads")),
        "an Event names the workloads: {said:?}"
    );
}

/// A rule without `restartConsumers` never lists or patches a workload;
/// turning it on rolls nothing by itself, and the next change rolls the
/// consumers.
#[tokio::test]
async fn no_patch_without_restart_consumers_and_none_when_turned_on() {
    let t = TestNs::new("restart-off").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let audit = Audit::start();
    let started = Utc::now();
    t.create_rule(&op, "plain", rule_spec(CM, t.selector(), &[t.glob("t1")]))
        .await;
    let user = operator_user(&t);
    let kubeconfig = operator_kubeconfig(&t, None, Some(&user));
    let _operator = Operator::start_with_env(
        &t,
        ["run", "--namespace", &op, "--min-restart-interval", "0"]
            .map(String::from)
            .to_vec(),
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let source = t.create_source(CM, &op, "cfg", &[], &[("a", "1")]).await;
    t.wait_copy(CM, &t1, &source, &op, "plain").await;
    let whole = json!({"envFrom": [{"configMapRef": {"name": "cfg"}}]});
    workload(
        &t,
        "Deployment",
        &t1,
        "app",
        pod(whole, json!([])),
        json!({}),
    )
    .await;
    let source = t.set_data(CM, &op, "cfg", &[("a", Some("2"))]).await;
    t.wait_copy(CM, &t1, &source, &op, "plain").await;
    tokio::time::sleep(QUIET).await;
    let quiet = Utc::now();
    audit.settle(&t.client, quiet).await;
    let touched = Query::user(&user)
        .resource("deployments")
        .between(started, quiet);
    assert_eq!(
        audit.count(&touched),
        0,
        "a rule without restartConsumers never lists or patches workloads: {:?}",
        audit.matching(&touched)
    );

    // Turned on: a pass over everything, and still nothing rolls.
    t.patch_rule(
        &op,
        "plain",
        json!({"spec": {"rollout": {"restartConsumers": true}}}),
    )
    .await;
    t.wait_rule_ready(&op, "plain").await;
    assert_for(
        "nothing rolled by turning the field on",
        QUIET,
        async || {
            let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
            if annotations.is_empty() {
                Ok(())
            } else {
                Err(format!("{annotations:?}"))
            }
        },
    )
    .await;
    let turned_on = Utc::now();
    audit.settle(&t.client, turned_on).await;
    let patches = Query::user(&user)
        .verbs(&["patch", "update"])
        .resource("deployments")
        .between(started, turned_on);
    assert_eq!(
        audit.count(&patches),
        0,
        "no workload written: {:?}",
        audit.matching(&patches)
    );

    // The next change rolls the consumer.
    let source = t.set_data(CM, &op, "cfg", &[("a", Some("3"))]).await;
    t.wait_copy(CM, &t1, &source, &op, "plain").await;
    wait_until("the Deployment rolled", TIMEOUT, async || {
        let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
        if annotations.len() == 1 {
            Ok(())
        } else {
            Err(format!("{annotations:?}"))
        }
    })
    .await;
    let end = Utc::now();
    audit.settle(&t.client, end).await;
    let patches = Query::user(&user)
        .verbs(&["patch"])
        .resource("deployments")
        .between(turned_on, end);
    assert_eq!(audit.count(&patches), 1, "one patch, for one change");

    // A roll cut short (the annotation left at an older value, as when the
    // operator stopped between the copy's write and the patch) is
    // finished by the next pass over everything (a new generation here).
    let (rolled, _) = restarts_of(&t, "Deployment", &t1, "app").await;
    let (key, value) = rolled.iter().next().unwrap();
    let stale =
        json!({"spec": {"template": {"metadata": {"annotations": {key.as_str(): "older"}}}}});
    Api::<DynamicObject>::namespaced_with(t.client.clone(), &t1, &workload_resource("Deployment"))
        .patch("app", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .expect("the annotation set back");
    t.patch_rule(&op, "plain", json!({"spec": {"prune": true}}))
        .await;
    wait_until("the roll finished", TIMEOUT, async || {
        let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
        match annotations.get(key) {
            Some(now) if now == value => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Without the verbs on workloads, a change is still copied, the refusal
/// is said once in a Warning Event, and the operator does not hammer the
/// API server with retries.
#[tokio::test]
async fn a_refused_restart_is_reported_once_not_stormed() {
    let t = TestNs::new("restart-refused").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let granted = grants_of(&json!({ "rules": operator_rules() }));
    let denied = BTreeSet::from([
        Grant::new("apps", "deployments", "list"),
        Grant::new("apps", "deployments", "patch"),
    ]);
    let id = Identity::create(&t, &cluster, &op, "copyrator", &granted, &BTreeSet::new()).await;
    id.wait_effective(&t.client, &op, &granted, &denied).await;
    t.create_rule(&op, "roll", restart_spec(&t, &t.glob("t1")))
        .await;
    let audit = Audit::start();
    let started = Utc::now();
    let mut operator = Operator::start_with_env(
        &t,
        ["run", "--namespace", &op, "--min-restart-interval", "0"]
            .map(String::from)
            .to_vec(),
        &[("KUBECONFIG", &id.kubeconfig)],
    );
    let source = t.create_source(CM, &op, "cfg", &[], &[("a", "1")]).await;
    t.wait_copy(CM, &t1, &source, &op, "roll").await;
    let whole = json!({"envFrom": [{"configMapRef": {"name": "cfg"}}]});
    workload(
        &t,
        "Deployment",
        &t1,
        "app",
        pod(whole, json!([])),
        json!({}),
    )
    .await;
    for value in ["2", "3", "4"] {
        let source = t.set_data(CM, &op, "cfg", &[("a", Some(value))]).await;
        t.wait_copy(CM, &t1, &source, &op, "roll").await;
    }
    wait_until("a RestartRefused Warning", TIMEOUT, async || {
        let seen = notes(&t, &op, "roll", "RestartRefused").await;
        match seen.first() {
            Some(note) if note.contains("forbidden") || note.contains("cannot list") => Ok(()),
            _ => Err(format!("{seen:?}")),
        }
    })
    .await;
    tokio::time::sleep(QUIET).await;
    operator.assert_running();
    let warnings = t
        .events_regarding(&op, "roll")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("RestartRefused"))
        .map(|e| e.series.map_or(1, |s| s.count))
        .sum::<i32>();
    assert_eq!(warnings, 1, "said once while it lasts");
    let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
    assert!(annotations.is_empty(), "{annotations:?}");
    let end = Utc::now();
    audit.settle(&t.client, end).await;
    let tries = Query::user(&id.user)
        .resource("deployments")
        .between(started, end);
    let count = audit.count(&tries);
    assert!(
        (1..=6).contains(&count),
        "one list per changing pass at most (4 changes), not a storm: {count}: {:?}",
        audit.by_verb(&tries)
    );
    assert!(
        operator.logs().contains("restarting consumers refused"),
        "a log line says it"
    );
}

/// In a member cluster, the consumers of a copy there roll as at home.
#[tokio::test]
async fn consumers_roll_in_a_member() {
    let t = TestNs::new("restart-member").await;
    let _up = OUTAGE.read().await;
    let op = t.ns("op").await;
    let member: Member = members().await.into_iter().next().expect("a member");
    let m_t1 = member.ns(&t, "t1").await;
    member.register(&t.client, &op, &[]).await;
    let spec = with(
        restart_spec(&t, &t.glob("t1")),
        "/spec/targets/clusters",
        json!({"names": [member.name], "local": false}),
    );
    t.create_rule(&op, "roll", spec).await;
    let _operator = Operator::start(
        &t,
        &op,
        &["--member-clusters", "--min-restart-interval", "0"],
    );
    let source = t.create_source(CM, &op, "cfg", &[], &[("a", "1")]).await;
    let configmaps = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let copy_is = async |value: &str| -> Result<(), String> {
        let copy = Api::<DynamicObject>::namespaced_with(member.client.clone(), &m_t1, &configmaps)
            .get_opt(&source.name)
            .await
            .map_err(|e| err_msg(&e))?
            .ok_or("no copy yet")?;
        match copy.data["data"]["a"].as_str() {
            Some(v) if v == value => Ok(()),
            other => Err(format!("a = {other:?}")),
        }
    };
    wait_until("the copy in the member", TIMEOUT, async || {
        copy_is("1").await
    })
    .await;
    let whole = json!({"envFrom": [{"configMapRef": {"name": "cfg"}}]});
    let body = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "app", "namespace": m_t1},
        "spec": {
            "selector": {"matchLabels": {"app": "app"}},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": pod(whole, json!([]))},
        },
    });
    let deployments = workload_resource("Deployment");
    let in_member =
        Api::<DynamicObject>::namespaced_with(member.client.clone(), &m_t1, &deployments);
    in_member
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .expect("a Deployment in the member");
    t.set_data(CM, &op, "cfg", &[("a", Some("2"))]).await;
    wait_until("the copy changed in the member", TIMEOUT, async || {
        copy_is("2").await
    })
    .await;
    wait_until("the Deployment in the member rolled", TIMEOUT, async || {
        let d = in_member.get("app").await.map_err(|e| err_msg(&e))?;
        let rolled = d.data["spec"]["template"]["metadata"]["annotations"]
            .as_object()
            .is_some_and(|a| a.keys().any(|k| k.starts_with(PREFIX)));
        if rolled {
            Ok(())
        } else {
            Err(format!("{}", d.data["spec"]["template"]["metadata"]))
        }
    })
    .await;
    wait_until("an Event naming the member", TIMEOUT, async || {
        let said = notes(&t, &op, "roll", "ConsumersRestarted").await;
        if said
            .iter()
            .any(|n| n.contains(&format!("in cluster {}", member.name)))
        {
            Ok(())
        } else {
            Err(format!("{said:?}"))
        }
    })
    .await;
}

/// A change that reaches many namespaces lists each workload kind across
/// the cluster, a page at a time, rather than namespace by namespace, and
/// rolls the consumers in every one of them.
#[tokio::test]
async fn many_namespaces_are_listed_across_the_cluster() {
    let t = TestNs::new("restart-many").await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 0..10 {
        targets.push(t.ns(&format!("m{i}")).await);
    }
    t.create_rule(&op, "roll", restart_spec(&t, &t.glob("m")))
        .await;
    let user = operator_user(&t);
    let kubeconfig = operator_kubeconfig(&t, None, Some(&user));
    let operator = Operator::start_with_env(
        &t,
        ["run", "--namespace", &op, "--min-restart-interval", "0"]
            .map(String::from)
            .to_vec(),
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let source = t.create_source(CM, &op, "cfg", &[], &[("a", "1")]).await;
    let whole = json!({"envFrom": [{"configMapRef": {"name": "cfg"}}]});
    for ns in &targets {
        t.wait_copy(CM, ns, &source, &op, "roll").await;
        workload(
            &t,
            "Deployment",
            ns,
            "app",
            pod(whole.clone(), json!([])),
            json!({}),
        )
        .await;
    }
    let audit = Audit::start();
    let changed = Utc::now();
    t.set_data(CM, &op, "cfg", &[("a", Some("2"))]).await;
    wait_restarts(&operator, 10.0).await;
    // The kinds are listed one after the other, each rolled as it is
    // listed: StatefulSets and DaemonSets are listed after the Deployments
    // rolled.
    let kinds = ["deployments", "statefulsets", "daemonsets"];
    let mut workload_lists = wait_until("every workload kind listed", TIMEOUT, async || {
        let end = Utc::now();
        audit.settle(&t.client, end).await;
        let lists = audit.matching(&Query::user(&user).verbs(&["list"]).between(changed, end));
        let workload_lists: Vec<_> = lists
            .into_iter()
            .filter(|e| kinds.contains(&e.resource.as_deref().unwrap_or("")))
            .collect();
        let listed: BTreeSet<&str> = workload_lists
            .iter()
            .filter_map(|e| e.resource.as_deref())
            .collect();
        if listed.len() == kinds.len() {
            Ok(workload_lists)
        } else {
            Err(format!("listed so far: {listed:?}"))
        }
    })
    .await;
    workload_lists.sort_by_key(|e| e.received);
    let uris: Vec<&str> = workload_lists
        .iter()
        .map(|e| e.request_uri.as_str())
        .collect();
    // The pass's lists, in the order the API server received them, until
    // every kind was listed: one each (a later pass may list again).
    let mut seen = BTreeSet::new();
    let first_pass = workload_lists
        .iter()
        .take_while(|e| {
            let all_before = seen.len() == kinds.len();
            seen.insert(e.resource.as_deref().unwrap_or(""));
            !all_before
        })
        .count();
    assert_eq!(
        first_pass, 3,
        "one list per workload kind, across the cluster: {uris:?}"
    );
    assert!(
        workload_lists.iter().all(|e| e.namespace.is_none()),
        "none namespace by namespace: {uris:?}"
    );
    for ns in &targets {
        let (annotations, _) = restarts_of(&t, "Deployment", ns, "app").await;
        assert_eq!(annotations.len(), 1, "{ns}: {annotations:?}");
    }
}

/// A patch that fails for a while (an admission policy refuses it, 422) is
/// said in a Warning and tried again with backoff, with no new change of
/// the source: the consumer rolls once the policy is gone.
#[tokio::test]
async fn a_failed_restart_is_tried_again() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let t = TestNs::new("restart-retry").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "roll", restart_spec(&t, &t.glob("t1")))
        .await;
    let _operator = Operator::start(&t, &op, &["--min-restart-interval", "0"]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("a", "1")]).await;
    t.wait_copy(CM, &t1, &source, &op, "roll").await;
    let whole = json!({"envFrom": [{"configMapRef": {"name": "cfg"}}]});
    workload(
        &t,
        "Deployment",
        &t1,
        "app",
        pod(whole, json!([])),
        json!({}),
    )
    .await;
    let name = format!("{}-frozen", t.prefix);
    let policy = ApiResource::erase::<ValidatingAdmissionPolicy>(&());
    let binding = ApiResource::erase::<ValidatingAdmissionPolicyBinding>(&());
    cluster
        .create(
            &t.client,
            &policy,
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": ["apps"], "apiVersions": ["v1"],
                        "operations": ["UPDATE"], "resources": ["deployments"],
                    }]},
                    "validations": [{"expression": "false", "message": "deployments are frozen", "reason": "Invalid"}],
                },
            }),
        )
        .await;
    cluster
        .create(
            &t.client,
            &binding,
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {
                    "policyName": name,
                    "validationActions": ["Deny"],
                    "matchResources": {"namespaceSelector": {"matchExpressions": [{
                        "key": "kubernetes.io/metadata.name", "operator": "In", "values": [t1],
                    }]}},
                },
            }),
        )
        .await;
    let deployments = Api::<DynamicObject>::namespaced_with(
        t.client.clone(),
        &t1,
        &workload_resource("Deployment"),
    );
    let probe = json!({"metadata": {"annotations": {"probe": "1"}}});
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    wait_until(
        "the policy to refuse Deployment patches",
        TIMEOUT,
        async || match deployments
            .patch("app", &dry_run, &Patch::Merge(&probe))
            .await
        {
            Err(e) if err_msg(&e).contains("frozen") => Ok(()),
            other => Err(format!(
                "{:?}",
                other.map(|_| "accepted").map_err(|e| err_msg(&e))
            )),
        },
    )
    .await;

    t.set_data(CM, &op, "cfg", &[("a", Some("2"))]).await;
    wait_until("a RestartFailed Warning", TIMEOUT, async || {
        let seen = notes(&t, &op, "roll", "RestartFailed").await;
        match seen.first() {
            Some(note) if note.contains("frozen") => Ok(()),
            _ => Err(format!("{seen:?}")),
        }
    })
    .await;
    let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
    assert!(annotations.is_empty(), "refused: {annotations:?}");
    cluster.delete(&t.client, &binding, &name).await;
    cluster.delete(&t.client, &policy, &name).await;
    wait_until(
        "the Deployment rolled on a later try",
        Duration::from_secs(60),
        async || {
            let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
            if annotations.len() == 1 {
                Ok(())
            } else {
                Err(format!("{annotations:?}"))
            }
        },
    )
    .await;
}

/// A source that keeps changing rolls its consumers at most once per
/// `--min-restart-interval`: four changes in a row roll a Deployment once
/// at the first, and once more with the last content when the interval is
/// up, not four times.
#[tokio::test]
async fn a_flapping_source_rolls_its_consumers_at_most_once_per_interval() {
    const INTERVAL: u64 = 8;
    let t = TestNs::new("restart-flap").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "roll", restart_spec(&t, &t1)).await;
    let operator = Operator::start(&t, &op, &["--min-restart-interval", &INTERVAL.to_string()]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("a", "0")]).await;
    t.wait_copy(CM, &t1, &source, &op, "roll").await;
    let whole = json!({"envFrom": [{"configMapRef": {"name": "cfg"}}]});
    workload(
        &t,
        "Deployment",
        &t1,
        "app",
        pod(whole, json!([])),
        json!({}),
    )
    .await;
    let flapping = std::time::Instant::now();
    let mut first_roll = None;
    for value in ["1", "2", "3", "4"] {
        let changed = t.set_data(CM, &op, "cfg", &[("a", Some(value))]).await;
        t.wait_copy(CM, &t1, &changed, &op, "roll").await;
        if first_roll.is_none() {
            wait_restarts(&operator, 1.0).await;
            first_roll = Some(restarts_of(&t, "Deployment", &t1, "app").await.0);
        }
    }
    // The last content rolls once the interval is up.
    wait_restarts(&operator, 2.0).await;
    let rolled_for = flapping.elapsed();
    let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
    println!("four changes, two rolls; the second {rolled_for:?} after the first change");
    assert_eq!(annotations.len(), 1, "{annotations:?}");
    assert_ne!(
        Some(&annotations),
        first_roll.as_ref(),
        "the last content rolled"
    );
    assert!(
        rolled_for >= Duration::from_secs(INTERVAL - 1),
        "the second roll came {rolled_for:?} after the first change"
    );
    assert_for("no third roll", QUIET, async || {
        match restarts_total(operator.port).await? {
            2.0 => Ok(()),
            n => Err(format!("{n} rolls")),
        }
    })
    .await;
}

/// The restart annotation says nothing of what it stands for. A Secret
/// holds a 4-digit PIN that a Deployment reads; after the PIN changes, the
/// Deployment's pod template carries a restart annotation, which anyone
/// who may read the Deployment sees. Hashing each of the 10,000 PINs as
/// an unkeyed restart value would be finds none of them among its digits:
/// the value is a tag under the installation's key.
#[tokio::test]
async fn the_restart_annotation_does_not_reveal_a_short_secret() {
    use copyrator::core::consumers::{Use, unkeyed_hash};
    let secret = Kind::Secret;
    let t = TestNs::new("restart-pin").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "roll", restart_spec_of(secret, &t, &t1))
        .await;
    let operator = Operator::start(&t, &op, &["--min-restart-interval", "0"]);
    let source = t
        .create_source(secret, &op, "db", &[], &[("pin", "1111")])
        .await;
    t.wait_copy(secret, &t1, &source, &op, "roll").await;
    let uses_pin = json!({"env": [{"name": "PIN",
        "valueFrom": {"secretKeyRef": {"name": "db", "key": "pin"}}}]});
    workload(
        &t,
        "Deployment",
        &t1,
        "app",
        pod(uses_pin, json!([])),
        json!({}),
    )
    .await;
    let source = t
        .set_data(secret, &op, "db", &[("pin", Some("4821"))])
        .await;
    t.wait_copy(secret, &t1, &source, &op, "roll").await;
    wait_restarts(&operator, 1.0).await;
    let (annotations, _) = restarts_of(&t, "Deployment", &t1, "app").await;
    let carried = annotations
        .values()
        .next()
        .unwrap_or_else(|| panic!("no restart annotation: {annotations:?}"))
        .clone();
    let key = Use::Keys(BTreeSet::from(["pin".to_owned()]));
    let unkeyed = |pin: &str| {
        let encoded = k8s_openapi::ByteString(pin.as_bytes().to_vec());
        let payload = BTreeMap::from([("data".to_owned(), json!({"pin": encoded}))]);
        unkeyed_hash(copyrator::api::kinds::Kind::Secret, &payload, &key)
    };
    // The digits after the form's prefix (`v3-`), whatever it is.
    let digits = carried.rsplit('-').next().unwrap_or_default();
    let found: Vec<String> = (0..10_000)
        .map(|pin| format!("{pin:04}"))
        .filter(|pin| unkeyed(pin) == digits)
        .collect();
    assert!(
        found.is_empty(),
        "the restart annotation {carried} gives the PIN away: {found:?}"
    );
    println!("restart annotation {carried}: no PIN of 10,000 hashes to it");
}

/// An upgrade rolls no workload. The operator is stopped, and Deployments
/// that read the PIN of the copy `db` carry the values earlier versions
/// wrote for it: the plain SHA-256 of before keys (`unkeyed`), and the tag
/// under the installation's key without the place (`keyed`); beside them
/// a Deployment whose roll to this content was cut short (`stale`, a
/// value of this version's form for another content) and one that reads
/// the whole copy and never rolled (`whole`). The new operator's pass over
/// the rule finishes the roll cut short and patches nothing else; a change
/// of a key they do not read rolls `whole` alone; a change of the PIN
/// rolls each once, and `unkeyed` and `keyed` get values of this version,
/// one each though they read the same content.
#[tokio::test]
async fn an_upgrade_rolls_no_workload_that_carries_an_earlier_value() {
    use copyrator::core::consumers::{Use, unkeyed_hash};
    use ring::{digest, hmac};
    let secret = Kind::Secret;
    let t = TestNs::new("restart-upgrade").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.provision_mark_key(&op).await;
    t.create_rule(&op, "roll", restart_spec_of(secret, &t, &t1))
        .await;
    let args = ["--min-restart-interval", "0"];
    let mut earlier = Operator::start(&t, &op, &args);
    let source = t
        .create_source(secret, &op, "db", &[], &[("pin", "4821"), ("other", "x")])
        .await;
    t.wait_copy(secret, &t1, &source, &op, "roll").await;
    earlier.stop();

    let hex = |bytes: &[u8]| -> String { bytes[..16].iter().map(|b| format!("{b:02x}")).collect() };
    let annotation = format!(
        "{PREFIX}{}",
        &hex(digest::digest(&digest::SHA256, b"Secret/db").as_ref())[..16]
    );
    // What a Deployment that reads `pin` uses of the copy, as the crate
    // writes it down: checked against its plain hash.
    let used_text = "keys;4:data3:pin8:NDgyMQ==";
    let pin = Use::Keys(BTreeSet::from(["pin".to_owned()]));
    let payload = BTreeMap::from([(
        "data".to_owned(),
        json!({"pin": b64(b"4821"), "other": b64(b"x")}),
    )]);
    let unkeyed = unkeyed_hash(copyrator::api::kinds::Kind::Secret, &payload, &pin);
    assert_eq!(
        hex(digest::digest(&digest::SHA256, used_text.as_bytes()).as_ref()),
        unkeyed
    );
    let placeless = {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &t.mark_key());
        let mut feed = hmac::Context::with_key(&key);
        for part in ["copyrator restart", used_text] {
            feed.update(&(part.len() as u64).to_be_bytes());
            feed.update(part.as_bytes());
        }
        hex(feed.sign().as_ref())
    };
    let reads_pin = json!({"env": [{"name": "PIN",
        "valueFrom": {"secretKeyRef": {"name": "db", "key": "pin"}}}]});
    let carrying = |value: &str| json!({annotation.as_str(): value});
    let stale = format!("v3-{}", "0".repeat(32));
    for (name, value) in [
        ("unkeyed", &unkeyed),
        ("keyed", &placeless),
        ("stale", &stale),
    ] {
        workload_carrying(
            &t,
            &t1,
            name,
            pod(reads_pin.clone(), json!([])),
            carrying(value),
        )
        .await;
    }
    let whole = json!({"envFrom": [{"secretRef": {"name": "db"}}]});
    workload(
        &t,
        "Deployment",
        &t1,
        "whole",
        pod(whole, json!([])),
        json!({}),
    )
    .await;
    let names = ["unkeyed", "keyed", "stale", "whole"];
    let before = snapshot_of(&t, &t1, &names).await;
    println!("carried before the upgrade: {before:?}");

    let operator = Operator::start(&t, &op, &args);
    wait_restarts(&operator, 1.0).await;
    let after_start = snapshot_of(&t, &t1, &names).await;
    assert_eq!(
        changed_among(&before, &after_start),
        BTreeSet::from(["stale"]),
        "the upgrade: {after_start:?}"
    );

    let source = t.set_data(secret, &op, "db", &[("other", Some("y"))]).await;
    t.wait_copy(secret, &t1, &source, &op, "roll").await;
    wait_restarts(&operator, 2.0).await;
    let after_other = snapshot_of(&t, &t1, &names).await;
    assert_eq!(
        changed_among(&after_start, &after_other),
        BTreeSet::from(["whole"]),
        "a key they do not read: {after_other:?}"
    );

    let source = t
        .set_data(secret, &op, "db", &[("pin", Some("4822"))])
        .await;
    t.wait_copy(secret, &t1, &source, &op, "roll").await;
    wait_restarts(&operator, 6.0).await;
    assert_for("no more rolls", QUIET, async || {
        match restarts_total(operator.port).await? {
            6.0 => Ok(()),
            n => Err(format!("{n} rolls")),
        }
    })
    .await;
    let after_pin = snapshot_of(&t, &t1, &names).await;
    for name in names {
        let (value, generation) = &after_pin[name];
        assert_eq!(*generation, after_other[name].1 + 1, "{name} rolled once");
        assert!(value.starts_with("v3-"), "{name} carries {value}");
    }
    assert_ne!(
        after_pin["unkeyed"].0, after_pin["keyed"].0,
        "the same content, read by two Deployments"
    );
}

/// The Deployment `ns/name` with `pod`, its pod template carrying
/// `template_annotations`.
async fn workload_carrying(
    t: &TestNs,
    ns: &str,
    name: &str,
    pod: Value,
    template_annotations: Value,
) {
    let body = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}, "annotations": template_annotations},
                         "spec": pod},
        },
    });
    let object: DynamicObject = serde_json::from_value(body).unwrap();
    Api::<DynamicObject>::namespaced_with(t.client.clone(), ns, &workload_resource("Deployment"))
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating Deployment {ns}/{name}: {}", err_msg(&e)));
}

/// The Deployments `names` of `ns`: the value of their one restart
/// annotation (empty without one), and their generation.
async fn snapshot_of<'a>(
    t: &TestNs,
    ns: &str,
    names: &[&'a str],
) -> BTreeMap<&'a str, (String, i64)> {
    let mut all = BTreeMap::new();
    for name in names {
        let (annotations, generation) = restarts_of(t, "Deployment", ns, name).await;
        assert!(annotations.len() <= 1, "{name}: {annotations:?}");
        let value = annotations.into_values().next().unwrap_or_default();
        all.insert(*name, (value, generation));
    }
    all
}

/// The names whose restart value differs between two snapshots.
fn changed_among<'a>(
    before: &BTreeMap<&'a str, (String, i64)>,
    after: &BTreeMap<&'a str, (String, i64)>,
) -> BTreeSet<&'a str> {
    after
        .iter()
        .filter(|(name, (value, _))| before.get(*name).map(|b| &b.0) != Some(value))
        .map(|(name, _)| *name)
        .collect()
}
