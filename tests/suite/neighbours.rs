//! Living with neighbours (design.md): what the operator does when others
//! touch its copies or refuse its writes, measured against a real control
//! plane.
//!
//! * Labels and annotations another tool adds never cause a write; the
//!   operator's own labels are put back.
//! * A copy someone keeps changing back is contested: restored, then backed
//!   off, and reported in the status, in an Event and in a metric.
//! * A write refused by an admission policy, by RBAC or by API Priority and
//!   Fairness is reported and retried on a schedule, never in a storm; a
//!   refused copy is written at once when its rule, its source or its
//!   target namespace changes.
//! * A neighbour that keeps the copies' resourceVersions moving (409 on
//!   every update) does not make the operator write in a loop.
//!
//! Every test runs the operator under a ServiceAccount of its own, so that
//! its requests are counted in the API server's audit log
//! (`COPYRATOR_AUDIT_LOG`, see `common::audit`), and with JSON logs, whose
//! lines are parsed and counted by level. Each test prints what it measured
//! before it checks its bounds.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::audit::{Audit, Query, WRITE_VERBS, service_account_user};
use crate::common::cluster_objects::{
    ClusterObjects, ar, refuse_configmap_writes, refuse_configmap_writes_unless, stop_refusing,
    wait_admitted,
};
use crate::common::rbac::{operator_rules, service_account_may};
use crate::common::rule_versions::RuleVersions;
use crate::common::*;
use chrono::{DateTime, Utc};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;

/// A measured window.
const MINUTE: Duration = Duration::from_secs(60);
/// The longest a refused or contested copy may wait for its next write
/// (the backoff maximum is 5 min), plus its jitter.
const CONVERGE: Duration = Duration::from_secs(330);
/// Bounds while a namespace refuses the operator's writes, per minute.
const MAX_REQUESTS_REFUSED_NS: usize = 15;
const MAX_LOG_LINES: usize = 10;

// ===========================================================================
// helpers of this file

/// As [`operator_rules`], but ConfigMaps and Secrets only read.
fn reader_rules() -> Value {
    let mut rules = operator_rules();
    rules[0]["verbs"] = json!(["get", "list", "watch"]);
    rules
}

/// The operator's identity in a test.
struct Identity {
    namespace: String,
    /// Its audit user name.
    user: String,
    kubeconfig: String,
}

/// Asks the API server whether the ServiceAccount may `verb` `resource`
/// (core group) in `namespace` (None: cluster-wide).
async fn can(
    client: &Client,
    id: &Identity,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
) -> Result<bool, String> {
    let attributes =
        json!({"group": "", "resource": resource, "verb": verb, "namespace": namespace});
    service_account_may(client, &id.user, &id.namespace, attributes).await
}

async fn wait_access(t: &TestNs, id: &Identity, verb: &str, namespace: Option<&str>, want: bool) {
    wait_until(
        format!(
            "{} to {} be allowed to {verb} configmaps in {namespace:?}",
            id.user,
            if want { "" } else { "no longer" }
        ),
        TIMEOUT,
        async || match can(&t.client, id, verb, "configmaps", namespace).await? {
            got if got == want => Ok(()),
            got => Err(format!("allowed: {got}")),
        },
    )
    .await;
}

/// A ServiceAccount `account` in `namespace`, bound cluster-wide to a
/// ClusterRole of its own with `rules`, and a kubeconfig for it.
async fn operator_identity(
    t: &TestNs,
    cluster: &ClusterObjects,
    namespace: &str,
    account: &str,
    rules: Value,
) -> Identity {
    create_service_account(&t.client, namespace, account).await;
    let role = format!("{}-{account}", t.prefix);
    cluster
        .create(
            &t.client,
            &ar::<ClusterRole>(),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role}, "rules": rules,
            }),
        )
        .await;
    cluster
        .create(
            &t.client,
            &ar::<ClusterRoleBinding>(),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            }),
        )
        .await;
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{role}.kubeconfig"));
    service_account_kubeconfig(namespace, account, &path);
    let id = Identity {
        namespace: namespace.to_string(),
        user: service_account_user(namespace, account),
        kubeconfig: path.to_string_lossy().into_owned(),
    };
    // Some of these operators may not create Secrets: their mark key is
    // made for them.
    t.provision_mark_key(namespace).await;
    wait_access(t, &id, "list", None, true).await;
    id
}

/// The operator as `id`, JSON logs at info, once it is ready.
async fn start_operator(t: &TestNs, namespace: &str, id: &Identity) -> Operator {
    let mut operator = launch_operator(t, namespace, id);
    operator.wait_ready().await;
    operator
}

/// The operator as `id`, JSON logs at info; started, not yet ready.
fn launch_operator(t: &TestNs, namespace: &str, id: &Identity) -> Operator {
    Operator::start_with_env(
        t,
        vec![
            "run".into(),
            "--namespace".into(),
            namespace.into(),
            "--log-format".into(),
            "json".into(),
            "--log-level".into(),
            "info".into(),
        ],
        &[("KUBECONFIG", &id.kubeconfig)],
    )
}

/// The operator's log lines in a window, by level (parsed as JSON).
struct LogLines {
    /// INFO, WARN and ERROR lines in the window.
    info_plus: usize,
    by_level: BTreeMap<String, usize>,
    /// INFO+ lines in the window by message.
    by_message: BTreeMap<String, usize>,
    /// Lines (anywhere in the log) that are not JSON objects with a
    /// timestamp and a level.
    not_json: usize,
}

fn log_lines(operator: &Operator, from: DateTime<Utc>, to: DateTime<Utc>) -> LogLines {
    let mut out = LogLines {
        info_plus: 0,
        by_level: BTreeMap::new(),
        by_message: BTreeMap::new(),
        not_json: 0,
    };
    for line in operator.logs().lines() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Value>(line).ok().and_then(|v| {
            let at = v
                .get("timestamp")?
                .as_str()?
                .parse::<DateTime<Utc>>()
                .ok()?;
            let level = v.get("level")?.as_str()?.to_string();
            let message = v
                .get("message")
                .or_else(|| v.pointer("/fields/message"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            Some((at, level, message))
        });
        let Some((at, level, message)) = parsed else {
            out.not_json += 1;
            continue;
        };
        if at < from || at >= to {
            continue;
        }
        if matches!(level.as_str(), "INFO" | "WARN" | "ERROR") {
            out.info_plus += 1;
            *out.by_message.entry(message).or_default() += 1;
        }
        *out.by_level.entry(level).or_default() += 1;
    }
    out
}

/// Polls `f` every `every` for at most `timeout`, without panicking: the
/// value and when it came, or the last thing seen.
async fn poll<T>(
    timeout: Duration,
    every: Duration,
    mut f: impl AsyncFnMut() -> Result<T, String>,
) -> Result<(T, Duration), String> {
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return Ok((v, start.elapsed())),
            Err(last) if start.elapsed() >= timeout => {
                return Err(format!("not within {timeout:?}; last seen: {last}"));
            }
            Err(_) => {}
        }
        tokio::time::sleep(every).await;
    }
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

fn utc(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap()
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The fewest restores the operator must make, within `window`, of a copy
/// that a neighbour changes back (or deletes) every `neighbour_period`.
/// The contest backoff (src/core/backoff.rs): the first two restores go at once,
/// then the delays double from 1 s, each at most 20 % longer by its jitter.
/// Each restore also waits for the neighbour's next change, and is allowed
/// `RESTORE_LATENCY` besides (the watch event, the pass and the write on a
/// loaded machine), so the count is a floor: the schedule alone gives 7
/// or 8 restores in a minute, this 6.
fn fewest_restores(window: Duration, neighbour_period: Duration) -> u32 {
    const BACKOFF_BASE: Duration = Duration::from_secs(1);
    const SLOWEST_JITTER: f64 = 1.2;
    const RESTORE_LATENCY: Duration = Duration::from_secs(5);
    let mut next_restore_at = RESTORE_LATENCY;
    let mut restores = 0;
    while next_restore_at <= window {
        restores += 1;
        let backoff = match restores {
            1 => Duration::ZERO,
            n => BACKOFF_BASE.mul_f64(SLOWEST_JITTER) * 2u32.pow(n - 2),
        };
        next_restore_at += backoff.max(neighbour_period) + RESTORE_LATENCY;
    }
    restores
}

/// How many of the requests counted by code were answered with success.
fn succeeded(by_code: &BTreeMap<u16, usize>) -> usize {
    by_code
        .iter()
        .filter(|(code, _)| (200..300).contains(*code))
        .map(|(_, n)| n)
        .sum()
}

/// Whether the copies of `sources` in `targets` made by the rule are all
/// right, in one list request.
async fn copies_right(
    t: &TestNs,
    rule: (&str, &str, &str),
    targets: &[String],
    sources: &[&Obj],
) -> Result<(), String> {
    let (rule_ns, rule_name, rule_uid) = rule;
    let lp = ListParams::default().labels(&format!("{LABEL_RULE_UID}={rule_uid}"));
    let copies: BTreeMap<(String, String), Obj> = Api::<ConfigMap>::all(t.client.clone())
        .list(&lp)
        .await
        .map_err(|e| err_msg(&e))?
        .items
        .into_iter()
        .map(Obj::from_configmap)
        .map(|o| ((o.namespace.clone(), o.name.clone()), o))
        .collect();
    let mut wrong = Vec::new();
    for ns in targets {
        for source in sources {
            let check = match copies.get(&(ns.clone(), source.name.clone())) {
                None => Err(format!("no copy {ns}/{}", source.name)),
                Some(copy) => check_copy(copy, source, rule_ns, rule_name, rule_uid),
            };
            if let Err(e) = check {
                wrong.push(e);
            }
        }
    }
    match wrong.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{} of {} copies not right; first: {first}",
            wrong.len(),
            targets.len() * sources.len()
        )),
    }
}

/// The sum of the samples of `name` carrying `labels` in a Prometheus text
/// exposition (None: no such sample).
fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> Result<Option<f64>, String> {
    let mut sum = None;
    for line in text.lines().map(str::trim) {
        let Some((series_name, series_labels, value)) = common::prometheus::sample(line)? else {
            continue;
        };
        let wanted = series_name == name
            && labels
                .iter()
                .all(|(k, v)| series_labels.get(*k).map(String::as_str) == Some(*v));
        if wanted {
            let value: f64 = value.parse().map_err(|e| format!("sample {line:?}: {e}"))?;
            *sum.get_or_insert(0.0) += value;
        }
    }
    Ok(sum)
}

/// A metric of the operator's /metrics, summed over its series.
async fn metric(operator: &Operator, name: &str) -> Result<Option<f64>, String> {
    let (code, body) = http_get(operator.port, "/metrics").await?;
    if code != 200 {
        return Err(format!("GET /metrics answered {code}"));
    }
    metric_sum(&body, name, &[])
}

/// The API server's own /metrics (as the admin of the kubeconfig).
fn api_server_metrics() -> String {
    let out = std::process::Command::new("kubectl")
        .args(["get", "--raw", "/metrics"])
        .output()
        .unwrap_or_else(|e| panic!("kubectl get --raw /metrics: cannot run: {e}"));
    assert!(
        out.status.success(),
        "kubectl get --raw /metrics failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rule's Ready condition as (status, message).
fn ready_of(rule: &Value) -> (String, String) {
    let c = ready_condition(rule);
    let field = |f: &str| {
        c.and_then(|c| c.get(f))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (field("status"), field("message"))
}

/// Ready False with a message that says why in words: contains `needle`
/// (case-insensitive) and is no debug dump of an API error.
fn refused_status(rule: &Value, needle: &str) -> Result<(), String> {
    let (status, message) = ready_of(rule);
    if status == "False"
        && message.to_lowercase().contains(&needle.to_lowercase())
        && !message.contains("Status {")
    {
        Ok(())
    } else {
        Err(format!("Ready {status:?}, message {message:?}"))
    }
}

/// The namespaces `t1` to `t{count}` of the test.
async fn target_namespaces(t: &TestNs, count: usize) -> Vec<String> {
    let mut targets = Vec::new();
    for i in 1..=count {
        targets.push(t.ns(&format!("t{i}")).await);
    }
    targets
}

/// Sources `src-00` to `src-{count - 1}` in `op`, each holding `k: v{i}`.
async fn numbered_sources(t: &TestNs, op: &str, count: usize) -> Vec<Obj> {
    let mut sources = Vec::new();
    for i in 0..count {
        let v = format!("v{i}");
        sources.push(
            t.create_source(CM, op, &format!("src-{i:02}"), &[], &[("k", &v)])
                .await,
        );
    }
    sources
}

/// The rule `cfgs` in `op`: the test's sources into every namespace
/// `t*` of the test; returns its UID.
async fn create_cfgs_rule(t: &TestNs, op: &str) -> String {
    let rule = t
        .create_rule(op, "cfgs", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    rule["metadata"]["uid"].as_str().unwrap().to_string()
}

/// Waits until `src` is copied into each of `targets` and the rule `cfgs`
/// is Ready.
async fn wait_copied(t: &TestNs, op: &str, src: &Obj, targets: &[String]) {
    for ns in targets {
        t.wait_copy(CM, ns, src, op, "cfgs").await;
    }
    t.wait_rule_ready(op, "cfgs").await;
}

/// The neighbour's patch parameters.
fn as_manager(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    }
}

/// A ClusterRole that lets its holder write ConfigMaps (not read them);
/// returns its name.
async fn configmap_writer_role(t: &TestNs, cluster: &ClusterObjects) -> String {
    let name = format!("{}-writer", t.prefix);
    cluster
        .create(
            &t.client,
            &ar::<ClusterRole>(),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                           "verbs": ["create", "update", "patch", "delete"]}],
            }),
        )
        .await;
    name
}

/// Setup shared by the refused-write tests: the operator's namespace, three
/// targets (the first is the one that will refuse), a source copied into
/// all of them, and the operator's identity. Returns (op, targets, source,
/// identity).
async fn refused_setup(
    t: &TestNs,
    cluster: &ClusterObjects,
    account: &str,
    rules: Value,
) -> (String, Vec<String>, Obj, Identity) {
    let op = t.ns("op").await;
    let targets = target_namespaces(t, 3).await;
    let id = operator_identity(t, cluster, &op, account, rules).await;
    let src = t.create_source(CM, &op, "a", &[], &[("k", "v1")]).await;
    (op, targets, src, id)
}

/// What the refused-write tests measure in their minute.
struct RefusedMinute {
    others_ok: Result<Duration, String>,
    /// When the status first said why, in words.
    status_seen: Option<Duration>,
    /// The Ready condition (status, message) at the end of the minute.
    ready_at_end: (String, String),
    status_at_end: Result<(), String>,
    requests: usize,
    by_verb: BTreeMap<String, usize>,
    by_code: BTreeMap<u16, usize>,
    lines: LogLines,
}

/// The refused namespace `targets[0]` gets two copies to write (one
/// created, one updated) while the others get them too; for a minute:
/// the operator's requests for that namespace, its INFO+ log lines, and
/// its status (Ready False, the reason in words).
#[allow(clippy::too_many_arguments)]
async fn refused_minute(
    t: &TestNs,
    audit: &Audit,
    operator: &Operator,
    id: &Identity,
    op: &str,
    targets: &[String],
    rule_uid: &str,
    status_needle: &str,
) -> (RefusedMinute, Obj, Obj) {
    let refused = &targets[0];
    let start = Instant::now();
    let start_utc = Utc::now();
    let a = t.set_data(CM, op, "a", &[("k", Some("v2"))]).await;
    let b = t.create_source(CM, op, "b", &[], &[("k", "b1")]).await;
    let others_ok = poll(TIMEOUT, POLL, async || {
        copies_right(t, (op, "cfgs", rule_uid), &targets[1..], &[&a, &b]).await
    })
    .await
    .map(|((), d)| d);
    let status_seen = poll(
        MINUTE.saturating_sub(start.elapsed()),
        POLL,
        async || match t.try_get_rule(op, "cfgs").await? {
            Some(rule) => refused_status(&rule, status_needle),
            None => Err("the rule is gone".into()),
        },
    )
    .await
    .ok()
    .map(|((), _)| start.elapsed());
    sleep_until(start + MINUTE).await;
    let rule = t.get_rule(op, "cfgs").await;
    let ready_at_end = ready_of(&rule);
    let status_at_end = refused_status(&rule, status_needle);
    let end_utc = start_utc + utc(MINUTE);
    audit.settle(&t.client, end_utc).await;
    let q = Query::user(&id.user)
        .namespace(refused)
        .between(start_utc, end_utc);
    let minute = RefusedMinute {
        others_ok,
        status_seen,
        ready_at_end,
        status_at_end,
        requests: audit.count(&q),
        by_verb: audit.by_verb(&q),
        by_code: audit.by_code(&q),
        lines: log_lines(operator, start_utc, end_utc),
    };
    (minute, a, b)
}

fn print_refused(test: &str, m: &RefusedMinute, refused: &str) {
    println!(
        "{test}: operator requests for {refused} in 60 s: {} (by verb {:?}, by code {:?})",
        m.requests, m.by_verb, m.by_code
    );
    println!(
        "{test}: operator INFO+ log lines in 60 s: {} (by level {:?}; non-JSON lines in the log: {})",
        m.lines.info_plus, m.lines.by_level, m.lines.not_json
    );
    println!("{test}: INFO+ lines by message: {:?}", m.lines.by_message);
    println!(
        "{test}: copies in the other namespaces right: {:?}",
        m.others_ok.as_ref().map(|d| secs(*d))
    );
    println!(
        "{test}: status said why in words first at: {:?}",
        m.status_seen.map(secs)
    );
    println!(
        "{test}: Ready at the end of the minute: {}, message: {}",
        m.ready_at_end.0, m.ready_at_end.1
    );
}

/// Once the refusal is lifted: wait for the refused namespace to converge,
/// print the minute's figures and check its bounds.
async fn converge_after_refusal(
    test: &str,
    t: &TestNs,
    rule: (&str, &str, &str),
    refused: &String,
    sources: &[&Obj],
    minute: &RefusedMinute,
    lifted: &str,
) {
    let converged = poll(CONVERGE, Duration::from_secs(1), async || {
        copies_right(t, rule, std::slice::from_ref(refused), sources).await
    })
    .await
    .map(|((), d)| d);
    print_refused(test, minute, refused);
    println!(
        "{test}: {refused} converged after {lifted}: {:?}",
        converged.as_ref().map(|d| secs(*d))
    );
    assert_refused(test, minute, &converged);
}

fn assert_refused(test: &str, m: &RefusedMinute, converged: &Result<Duration, String>) {
    let mut failures = Vec::new();
    if let Err(e) = &m.others_ok {
        failures.push(format!("copies into the other namespaces: {e}"));
    }
    if m.requests > MAX_REQUESTS_REFUSED_NS {
        failures.push(format!(
            "{} requests for the refusing namespace in 60 s (at most {MAX_REQUESTS_REFUSED_NS})",
            m.requests
        ));
    }
    if m.lines.info_plus > MAX_LOG_LINES {
        failures.push(format!(
            "{} INFO+ log lines in 60 s (at most {MAX_LOG_LINES}): {:?}",
            m.lines.info_plus, m.lines.by_message
        ));
    }
    if m.status_seen.is_none() {
        failures.push("the status never said why in words within the minute".to_string());
    }
    if m.status_at_end.is_err() {
        failures.push(format!(
            "at the end of the minute the status is not Ready False with the reason in words (no debug dump): Ready {}, message {:?}",
            m.ready_at_end.0, m.ready_at_end.1
        ));
    }
    if let Err(e) = converged {
        failures.push(format!("the namespace did not converge once allowed: {e}"));
    }
    assert!(failures.is_empty(), "{test}:\n  {}", failures.join("\n  "));
}

// ===========================================================================
// 1. labels and annotations of others

/// A neighbour adds a label and an annotation to each of 25 copies: the
/// operator writes nothing for a minute and the neighbour's keys stay.
/// Then the neighbour removes the operator's managed-by label from one
/// copy: it is back within 10 s.
#[tokio::test]
async fn neighbour_labels_and_annotations_cause_no_write_and_own_labels_come_back() {
    const TEST: &str = "neighbour-labels";
    let audit = Audit::start();
    let t = TestNs::new("nb-labels").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let targets = target_namespaces(&t, 5).await;
    let id = operator_identity(&t, &cluster, &op, "copyrator-labels", operator_rules()).await;
    let mut operator = start_operator(&t, &op, &id).await;
    let mut sources = Vec::new();
    for i in 1..=5 {
        let v = format!("v{i}");
        sources.push(
            t.create_source(CM, &op, &format!("cfg-{i}"), &[], &[("k", &v)])
                .await,
        );
    }
    let uid = create_cfgs_rule(&t, &op).await;
    let sources: Vec<&Obj> = sources.iter().collect();
    wait_until("25 copies right", MINUTE, async || {
        copies_right(&t, (&op, "cfgs", &uid), &targets, &sources).await
    })
    .await;
    t.wait_rule_ready(&op, "cfgs").await;

    let label = "neighbour.example.com/team";
    let annotation = "neighbour.example.com/checked";
    let neighbour = as_manager("neighbour");
    let start = Instant::now();
    let start_utc = Utc::now();
    for ns in &targets {
        for source in &sources {
            t.cms(ns)
                .patch(
                    &source.name,
                    &neighbour,
                    &Patch::Merge(json!({"metadata": {
                        "labels": {label: "blue"},
                        "annotations": {annotation: "yes"},
                    }})),
                )
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "the neighbour patching {ns}/{}: {}",
                        source.name,
                        err_msg(&e)
                    )
                });
        }
    }
    sleep_until(start + MINUTE).await;
    let end_utc = start_utc + utc(MINUTE);
    audit.settle(&t.client, end_utc).await;
    let q = Query::user(&id.user)
        .verbs(WRITE_VERBS)
        .resource("configmaps")
        .between(start_utc, end_utc);
    let writes = audit.count(&q);
    let by_verb = audit.by_verb(&q);
    let mut lost = Vec::new();
    for ns in &targets {
        for source in &sources {
            let copy = t.must_get(CM, ns, &source.name).await;
            if copy.label(label) != Some("blue") || copy.annotation(annotation) != Some("yes") {
                lost.push(format!("{ns}/{}", source.name));
            }
        }
    }

    // The operator's own label, removed by the neighbour, comes back.
    let (ns, name) = (&targets[0], &sources[0].name);
    t.cms(ns)
        .patch(
            name,
            &neighbour,
            &Patch::Merge(json!({"metadata": {"labels": {LABEL_MANAGED_BY: null}}})),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "removing {LABEL_MANAGED_BY} from {ns}/{name}: {}",
                err_msg(&e)
            )
        });
    let back = poll(Duration::from_secs(10), POLL, async || {
        match t.try_get(CM, ns, name).await? {
            Some(o) if o.label(LABEL_MANAGED_BY) == Some("copyrator") => Ok(()),
            Some(o) => Err(format!("labels {:?}", o.labels)),
            None => Err("the copy is gone".into()),
        }
    })
    .await
    .map(|((), d)| d);

    println!("{TEST}: operator writes in 60 s: {writes} (by verb {by_verb:?})");
    println!(
        "{TEST}: copies that lost the neighbour's label or annotation: {} of 25 {lost:?}",
        lost.len()
    );
    println!(
        "{TEST}: {LABEL_MANAGED_BY} back after: {:?}",
        back.as_ref().map(|d| secs(*d))
    );
    assert_eq!(
        writes, 0,
        "the operator wrote configmaps after a neighbour added labels and annotations: {by_verb:?}"
    );
    assert!(
        lost.is_empty(),
        "the neighbour's label or annotation was removed from {lost:?}"
    );
    if let Err(e) = back {
        panic!("{LABEL_MANAGED_BY} removed by a neighbour was not put back: {e}");
    }
    operator.assert_running();
}

// ===========================================================================
// 2. a contested copy

/// A neighbour rewrites one copy's data every 2 s for a minute: the first
/// change is undone within 5 s, then the operator backs off (at most 15
/// writes to the copy in the minute, yet as many restores as the backoff's
/// schedule allows: [`fewest_restores`]) and reports the copy as contested
/// (status, Event naming the other writer, metric). Once the neighbour
/// stops, the copy is right again within the backoff maximum.
#[tokio::test]
async fn a_copy_rewritten_every_2s_is_contested_backed_off_and_reported() {
    const TEST: &str = "data-fighter";
    const FIGHTER: &str = "data-fighter";
    const FIGHT_PERIOD: Duration = Duration::from_secs(2);
    let audit = Audit::start();
    let t = TestNs::new("nb-fight").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let id = operator_identity(&t, &cluster, &op, "copyrator-fight", operator_rules()).await;
    let mut operator = start_operator(&t, &op, &id).await;
    let src = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let uid = create_cfgs_rule(&t, &op).await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &src, &op, "cfgs").await;
    }
    t.wait_rule_ready(&op, "cfgs").await;

    let fighter = as_manager(FIGHTER);
    let start = Instant::now();
    let start_utc = Utc::now();
    let mut next_change = start;
    let mut changes = 0u32;
    let mut first_change: Option<Instant> = None;
    let mut first_restored: Option<Duration> = None;
    let mut next_report_check = start;
    let mut status_seen: Option<Duration> = None;
    let mut max_contested_count = 0u64;
    let mut last_contested = Value::Null;
    let mut event_seen: Option<(Duration, String)> = None;
    let mut notes = std::collections::BTreeSet::new();
    let mut gauge_max: Option<f64> = None;
    let mut gauge_error = None;
    while start.elapsed() < MINUTE {
        let now = Instant::now();
        if now >= next_change {
            t.cms(&t1)
                .patch(
                    "cfg",
                    &fighter,
                    &Patch::Merge(json!({"data": {"k": format!("fighter-{changes}")}})),
                )
                .await
                .unwrap_or_else(|e| panic!("the fighter's change {changes}: {}", err_msg(&e)));
            changes += 1;
            first_change.get_or_insert(now);
            next_change += FIGHT_PERIOD;
        }
        if let (Some(at), None) = (first_change, first_restored)
            && let Ok(Some(copy)) = t.try_get(CM, &t1, "cfg").await
            && copy.data == src.data
        {
            first_restored = Some(at.elapsed());
        }
        if Instant::now() >= next_report_check {
            next_report_check += Duration::from_secs(1);
            if let Ok(Some(rule)) = t.try_get_rule(&op, "cfgs").await {
                let count = status_u64(&rule, "contestedCount").unwrap_or(0);
                max_contested_count = max_contested_count.max(count);
                let contested = rule
                    .pointer("/status/contested")
                    .cloned()
                    .unwrap_or(Value::Null);
                let listed = contested.as_array().is_some_and(|list| {
                    list.iter().any(|c| {
                        c["namespace"] == t1.as_str()
                            && c["name"] == "cfg"
                            && c["writer"] == FIGHTER
                    })
                });
                if count >= 1 && listed && status_seen.is_none() {
                    status_seen = Some(start.elapsed());
                }
                last_contested = contested;
            }
            if event_seen.is_none() {
                for e in t.events_regarding(&op, "cfgs").await {
                    if e.reason.as_deref() != Some("CopyContested") {
                        continue;
                    }
                    let note = e.note.clone().unwrap_or_default();
                    if note.contains(FIGHTER) {
                        event_seen = Some((start.elapsed(), note));
                        break;
                    }
                    notes.insert(note);
                }
            }
            match metric(&operator, "copyrator_copies_contested").await {
                Ok(Some(v)) => gauge_max = Some(gauge_max.map_or(v, |m: f64| m.max(v))),
                Ok(None) => {}
                Err(e) => gauge_error = Some(e),
            }
        }
        let pause = next_change
            .min(next_report_check)
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(250));
        tokio::time::sleep(pause).await;
    }
    let stopped = Instant::now();
    let end_utc = start_utc + utc(stopped - start);
    let converged = poll(CONVERGE, Duration::from_secs(1), async || {
        copies_right(&t, (&op, "cfgs", &uid), std::slice::from_ref(&t1), &[&src]).await
    })
    .await
    .map(|((), _)| stopped.elapsed());
    audit.settle(&t.client, end_utc).await;
    let q = Query::user(&id.user)
        .verbs(WRITE_VERBS)
        .resource("configmaps")
        .namespace(&t1)
        .name("cfg")
        .between(start_utc, end_utc);
    let writes = audit.count(&q);
    let by_code = audit.by_code(&q);
    let restores = succeeded(&by_code);
    let fewest = fewest_restores(MINUTE, FIGHT_PERIOD);

    println!("{TEST}: the fighter's changes in 60 s: {changes}");
    println!(
        "{TEST}: first change undone after: {:?}",
        first_restored.map(secs)
    );
    println!(
        "{TEST}: operator writes to the copy in 60 s: {writes} (by code {by_code:?}), \
         {restores} of them restores (at least {fewest} expected)"
    );
    println!(
        "{TEST}: status contestedCount max {max_contested_count}, copy listed with writer {FIGHTER} first at {:?}; last status.contested: {last_contested}",
        status_seen.map(secs)
    );
    println!(
        "{TEST}: CopyContested event naming {FIGHTER}: {:?} (other CopyContested notes: {notes:?})",
        event_seen.as_ref().map(|(d, n)| (secs(*d), n))
    );
    println!(
        "{TEST}: copyrator_copies_contested max: {gauge_max:?} (scrape error: {gauge_error:?})"
    );
    println!(
        "{TEST}: right again after the fighter stopped: {:?}",
        converged.as_ref().map(|d| secs(*d))
    );

    let mut failures = Vec::new();
    // Restored, not how soon: that a first change back goes at once (no
    // backoff) is the backoff's unit test
    // (an_occasional_edit_is_restored_at_once_and_is_no_contest).
    if first_restored.is_none() {
        failures.push("the first change was never undone".to_string());
    }
    if writes > 15 {
        failures.push(format!(
            "{writes} writes to the contested copy in 60 s (at most 15)"
        ));
    }
    // Backed off, not given up: the copy is still put back on schedule.
    if restores < fewest as usize {
        failures.push(format!(
            "{restores} restores of the contested copy in 60 s (at least {fewest}; by code {by_code:?})"
        ));
    }
    if status_seen.is_none() {
        failures.push(format!(
            "the status never had contestedCount >= 1 and {t1}/cfg listed with writer {FIGHTER} (max count {max_contested_count}, last list {last_contested})"
        ));
    }
    if event_seen.is_none() {
        failures.push(format!(
            "no CopyContested event on the rule naming {FIGHTER}"
        ));
    }
    if gauge_max.is_none_or(|v| v < 1.0) {
        failures.push(format!(
            "copyrator_copies_contested never >= 1 ({gauge_max:?})"
        ));
    }
    if let Err(e) = &converged {
        failures.push(format!("not right again after the fighter stopped: {e}"));
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
    operator.assert_running();
}

// ===========================================================================
// 3. an admission policy refuses

const FROZEN: &str = "configmaps are frozen in this namespace";

/// A ValidatingAdmissionPolicy denies ConfigMap writes in one target
/// namespace: a minute of bounded requests and logs, the reason in the
/// status; once the policy is gone, the namespace converges.
#[tokio::test]
async fn writes_refused_by_an_admission_policy_are_reported_and_retried_without_a_storm() {
    const TEST: &str = "admission-policy";
    let audit = Audit::start();
    let t = TestNs::new("nb-policy").await;
    let cluster = ClusterObjects::new();
    let (op, targets, src, id) =
        refused_setup(&t, &cluster, "copyrator-policy", operator_rules()).await;
    let frozen = targets[0].clone();
    let mut operator = start_operator(&t, &op, &id).await;
    let uid = create_cfgs_rule(&t, &op).await;
    wait_copied(&t, &op, &src, &targets).await;

    let policy = format!("{}-freeze", t.prefix);
    refuse_configmap_writes(
        &t,
        &cluster,
        &policy,
        &frozen,
        &["CREATE", "UPDATE"],
        "Invalid",
        FROZEN,
    )
    .await;

    let (minute, a, b) =
        refused_minute(&t, &audit, &operator, &id, &op, &targets, &uid, FROZEN).await;

    stop_refusing(&t, &cluster, &policy).await;
    converge_after_refusal(
        TEST,
        &t,
        (&op, "cfgs", &uid),
        &frozen,
        &[&a, &b],
        &minute,
        "the policy was deleted",
    )
    .await;
    operator.assert_running();
}

// ===========================================================================
// 4. RBAC refuses

/// The operator may write ConfigMaps only where a RoleBinding lets it; the
/// RoleBinding of one target namespace is deleted for a minute: bounded
/// requests and logs, "forbidden" in the status; restored, the namespace
/// converges.
#[tokio::test]
async fn writes_forbidden_by_rbac_are_reported_and_retried_without_a_storm() {
    const TEST: &str = "rbac-forbidden";
    let audit = Audit::start();
    let t = TestNs::new("nb-rbac").await;
    let cluster = ClusterObjects::new();
    let account = "copyrator-rbac";
    let (op, targets, src, id) = refused_setup(&t, &cluster, account, reader_rules()).await;
    let cut = targets[0].clone();
    let writer_role = configmap_writer_role(&t, &cluster).await;
    let binding = |ns: &str| -> RoleBinding {
        serde_json::from_value(json!({
            "metadata": {"name": "copyrator-write", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": writer_role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": op}],
        }))
        .unwrap()
    };
    let bindings = |ns: &str| Api::<RoleBinding>::namespaced(t.client.clone(), ns);
    for ns in &targets {
        bindings(ns)
            .create(&PostParams::default(), &binding(ns))
            .await
            .unwrap_or_else(|e| panic!("creating the RoleBinding in {ns}: {}", err_msg(&e)));
        wait_access(&t, &id, "create", Some(ns), true).await;
    }
    let mut operator = start_operator(&t, &op, &id).await;
    let uid = create_cfgs_rule(&t, &op).await;
    wait_copied(&t, &op, &src, &targets).await;

    bindings(&cut)
        .delete("copyrator-write", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the RoleBinding in {cut}: {}", err_msg(&e)));
    wait_access(&t, &id, "create", Some(&cut), false).await;

    let (minute, a, b) =
        refused_minute(&t, &audit, &operator, &id, &op, &targets, &uid, "forbidden").await;

    bindings(&cut)
        .create(&PostParams::default(), &binding(&cut))
        .await
        .unwrap_or_else(|e| panic!("restoring the RoleBinding in {cut}: {}", err_msg(&e)));
    converge_after_refusal(
        TEST,
        &t,
        (&op, "cfgs", &uid),
        &cut,
        &[&a, &b],
        &minute,
        "the RoleBinding was restored",
    )
    .await;
    operator.assert_running();
}

/// The operator loses its ConfigMap writes cluster-wide (its
/// ClusterRoleBinding is deleted) and someone deletes its 55 copies: each
/// restore is refused (403). That is a refusal, not a contest: for a minute
/// the rule reads SyncFailed in the API server's words and never
/// CopiesContested (status, Event and metric), its refused writes stay few
/// (each copy's first restore, then one probe at a time for the whole rule,
/// not a backoff per copy) and so do its log lines. Once the binding is back, the 55 copies return
/// together, well within a deadline that one copy per backoff step (the
/// behaviour this replaces, 77 s) cannot meet.
#[tokio::test]
async fn copies_deleted_while_writes_are_forbidden_are_refused_not_contested_and_return_together() {
    const TEST: &str = "rbac-revoked";
    const SOURCES: usize = 11;
    const TARGETS: usize = 5;
    /// Refused writes allowed in the minute for all 55 copies together:
    /// each deleted copy's first restore, then about one probe every 6 s.
    const MAX_REFUSED_WRITES: usize = SOURCES * TARGETS + 15;
    /// From the binding's return to all 55 copies back (the probe runs at
    /// least every 6 s, +20 % jitter; then one pass writes the rest).
    const RETURN_DEADLINE: Duration = Duration::from_secs(20);
    let audit = Audit::start();
    let t = TestNs::new("nb-revoked").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let targets = target_namespaces(&t, TARGETS).await;
    let account = "copyrator-revoked";
    let id = operator_identity(&t, &cluster, &op, account, reader_rules()).await;
    let writer = configmap_writer_role(&t, &cluster).await;
    let grant = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": writer},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": writer},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": op}],
    });
    cluster
        .create(&t.client, &ar::<ClusterRoleBinding>(), grant.clone())
        .await;
    wait_access(&t, &id, "create", Some(&targets[0]), true).await;
    let sources = numbered_sources(&t, &op, SOURCES).await;
    let sources: Vec<&Obj> = sources.iter().collect();
    let mut operator = start_operator(&t, &op, &id).await;
    let uid = create_cfgs_rule(&t, &op).await;
    wait_until("55 copies right", MINUTE, async || {
        copies_right(&t, (&op, "cfgs", &uid), &targets, &sources).await
    })
    .await;
    t.wait_rule_ready(&op, "cfgs").await;

    cluster
        .delete(&t.client, &ar::<ClusterRoleBinding>(), &writer)
        .await;
    wait_access(&t, &id, "create", Some(&targets[0]), false).await;
    let start = Instant::now();
    let start_utc = Utc::now();
    for ns in &targets {
        for source in &sources {
            t.delete(CM, ns, &source.name).await;
        }
    }
    // A minute of refusal, the status read all along.
    let mut contested_seen = Vec::new();
    let mut refused_seen = None;
    while start.elapsed() < MINUTE {
        let rule = t.get_rule(&op, "cfgs").await;
        let (_, message) = ready_of(&rule);
        let reason = ready_condition(&rule)
            .and_then(|c| c["reason"].as_str())
            .unwrap_or_default()
            .to_string();
        if reason == "CopiesContested" || status_u64(&rule, "contestedCount").unwrap_or(0) > 0 {
            contested_seen.push(format!("{reason}: {message}"));
        }
        if refused_seen.is_none()
            && reason == "SyncFailed"
            && refused_status(&rule, "forbidden").is_ok()
        {
            refused_seen = Some((start.elapsed(), message));
        }
        tokio::time::sleep(POLL).await;
    }
    let end_utc = start_utc + utc(MINUTE);
    audit.settle(&t.client, end_utc).await;
    let refused_writes = audit.count(
        &Query::user(&id.user)
            .verbs(WRITE_VERBS)
            .resource("configmaps")
            .code(403)
            .between(start_utc, end_utc),
    );
    let lines = log_lines(&operator, start_utc, end_utc);
    let contested_events: Vec<String> = t
        .events_regarding(&op, "cfgs")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CopyContested"))
        .map(|e| e.note.unwrap_or_default())
        .collect();
    let (code, metrics) = http_get(operator.port, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("/metrics: {e}"));
    assert_eq!(code, 200, "/metrics: {metrics}");
    let contested_gauge = metric_family(&metrics, "copyrator_copies_contested");

    cluster
        .create(&t.client, &ar::<ClusterRoleBinding>(), grant)
        .await;
    wait_access(&t, &id, "create", Some(&targets[0]), true).await;
    let restored = Instant::now();
    let returned = poll(RETURN_DEADLINE, POLL, async || {
        copies_right(&t, (&op, "cfgs", &uid), &targets, &sources).await
    })
    .await
    .map(|((), d)| d);
    println!(
        "{TEST}: refused writes for 55 copies in 60 s: {refused_writes}; INFO+ log lines: {} {:?}; \
         the status said why at {:?}; all 55 copies back {:?} after the binding returned",
        lines.info_plus,
        lines.by_message,
        refused_seen.as_ref().map(|(at, _)| secs(*at)),
        returned.as_ref().map(|d| secs(*d))
    );
    let mut failures = Vec::new();
    if !contested_seen.is_empty() {
        failures.push(format!(
            "the status called refused writes contested: {:?}",
            &contested_seen[..contested_seen.len().min(3)]
        ));
    }
    if !contested_events.is_empty() {
        failures.push(format!("CopyContested Events: {contested_events:?}"));
    }
    if contested_gauge != Some(0.0) {
        failures.push(format!(
            "copyrator_copies_contested is {contested_gauge:?}, not 0"
        ));
    }
    if refused_seen.is_none() {
        failures.push("the status never read SyncFailed with \"forbidden\" in the minute".into());
    }
    if refused_writes == 0 || refused_writes > MAX_REFUSED_WRITES {
        failures.push(format!(
            "{refused_writes} refused writes in the minute (expected 1 to {MAX_REFUSED_WRITES})"
        ));
    }
    if lines.info_plus > MAX_LOG_LINES {
        failures.push(format!(
            "{} INFO+ log lines in the minute (at most {MAX_LOG_LINES}): {:?}",
            lines.info_plus, lines.by_message
        ));
    }
    if let Err(e) = &returned {
        failures.push(format!(
            "not all 55 copies were back within {RETURN_DEADLINE:?} of the binding's return ({:?} so far): {e}",
            restored.elapsed()
        ));
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
    operator.assert_running();
}

// ===========================================================================
// 5. API Priority and Fairness

/// The operator's ServiceAccount is throttled by a priority level of one
/// concurrency share that rejects what it cannot seat (429): a rule with
/// 100 copies still converges within 180 s, in at most 500 requests and
/// never more than 220 in one second: each copy written once in a second,
/// each write refused at most once more in that burst (the writes in
/// flight halve on a 429 and retry as soon as they may, to use the seats
/// they are given), and the reads; a retry storm goes far past that. At least one request must be answered 429, or
/// nothing was throttled.
#[tokio::test]
async fn throttled_by_priority_and_fairness_the_operator_converges_without_a_storm() {
    const TEST: &str = "apf-throttle";
    const SOURCES: usize = 10;
    const TARGETS: usize = 10;
    const COPIES: usize = SOURCES * TARGETS;
    let audit = Audit::start();
    let t = TestNs::new("nb-apf").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 0..TARGETS {
        targets.push(t.ns(&format!("t{i:02}")).await);
    }
    let account = "copyrator-apf";
    let id = operator_identity(&t, &cluster, &op, account, operator_rules()).await;
    let sources = numbered_sources(&t, &op, SOURCES).await;
    let sources: Vec<&Obj> = sources.iter().collect();

    let level = t.prefix.clone();
    apf::one_seat_for(
        &t.client,
        &cluster,
        &level,
        &op,
        account,
        apf::Throttled::All,
    )
    .await;

    let start = Instant::now();
    let start_utc = Utc::now();
    let mut operator = launch_operator(&t, &op, &id);
    let uid = create_cfgs_rule(&t, &op).await;
    let converged = poll(
        Duration::from_secs(180),
        Duration::from_secs(1),
        async || copies_right(&t, (&op, "cfgs", &uid), &targets, &sources).await,
    )
    .await
    .map(|((), d)| d);
    let end_utc = start_utc + utc(start.elapsed());
    let running = operator.is_running();
    audit.settle(&t.client, end_utc).await;
    let q = Query::user(&id.user).between(start_utc, end_utc);
    let total = audit.count(&q);
    let rejected = audit.count(&q.clone().code(429));
    let by_verb = audit.by_verb(&q);
    let busiest = audit.busiest_second(&q);
    let max_limit = 4 * COPIES + 100;
    // The API server's count of what the FlowSchema matched: without it
    // the test would prove nothing.
    let apf = api_server_metrics();
    let schema = [("flow_schema", level.as_str())];
    let of_schema = |name: &str| {
        metric_sum(&apf, name, &schema)
            .unwrap_or_else(|e| panic!("the API server's /metrics: {e}"))
            .unwrap_or(0.0)
    };
    let dispatched = of_schema("apiserver_flowcontrol_dispatched_requests_total");
    let apf_rejected = of_schema("apiserver_flowcontrol_rejected_requests_total");

    println!(
        "{TEST}: {COPIES} copies right after: {:?}",
        converged.as_ref().map(|d| secs(*d))
    );
    println!(
        "{TEST}: operator requests until then: {total} (429s: {rejected}; by verb {by_verb:?})"
    );
    println!(
        "{TEST}: busiest second: {:?} requests",
        busiest.map(|(_, n)| n)
    );
    println!(
        "{TEST}: the API server's flow control for the FlowSchema: {dispatched} dispatched, {apf_rejected} rejected"
    );
    println!("{TEST}: operator still running: {running}");
    assert!(
        dispatched + apf_rejected > 0.0,
        "the FlowSchema {level} matched none of the operator's requests: the test proves nothing"
    );
    assert!(
        rejected > 0,
        "no request of the operator was answered 429 (by verb {by_verb:?}): it was never \
         throttled, so the test proves nothing about throttling"
    );

    let mut failures = Vec::new();
    if let Err(e) = &converged {
        failures.push(format!("the rule did not converge: {e}"));
    }
    if total > max_limit {
        failures.push(format!(
            "{total} requests until convergence (at most {max_limit})"
        ));
    }
    let busiest_limit = 2 * COPIES + 20;
    if let Some((second, n)) = busiest
        && n > busiest_limit
    {
        failures.push(format!(
            "{n} requests in the second starting {} (at most {busiest_limit})",
            DateTime::<Utc>::from_timestamp(second, 0).unwrap_or_default()
        ));
    }
    if !running {
        failures.push("the operator exited".to_string());
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
}

// ===========================================================================
// 6. a 409 storm

/// A neighbour updates the data of three copies as fast as it can for
/// 30 s, so that every update the operator sends finds a newer version
/// (409): at most 15 operator writes per copy; once it stops, every copy is
/// right again within the backoff maximum.
#[tokio::test]
async fn a_neighbour_updating_copies_nonstop_causes_no_write_storm() {
    const TEST: &str = "conflict-storm";
    const STORM: Duration = Duration::from_secs(30);
    let audit = Audit::start();
    let t = TestNs::new("nb-storm").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let targets = target_namespaces(&t, 3).await;
    let id = operator_identity(&t, &cluster, &op, "copyrator-storm", operator_rules()).await;
    let mut operator = start_operator(&t, &op, &id).await;
    let src = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let uid = create_cfgs_rule(&t, &op).await;
    wait_copied(&t, &op, &src, &targets).await;

    let neighbour = as_manager("storm-neighbour");
    let start = Instant::now();
    let start_utc = Utc::now();
    let mut updates = 0u64;
    while start.elapsed() < STORM {
        let ns = &targets[updates as usize % targets.len()];
        t.cms(ns)
            .patch(
                "cfg",
                &neighbour,
                &Patch::Merge(json!({"data": {"k": format!("storm-{updates}")}})),
            )
            .await
            .unwrap_or_else(|e| panic!("the neighbour updating {ns}/cfg: {}", err_msg(&e)));
        updates += 1;
    }
    let stopped = Instant::now();
    let end_utc = start_utc + utc(stopped - start);
    let converged = poll(CONVERGE, Duration::from_secs(1), async || {
        copies_right(&t, (&op, "cfgs", &uid), &targets, &[&src]).await
    })
    .await
    .map(|((), _)| stopped.elapsed());
    audit.settle(&t.client, end_utc).await;
    let mut per_copy = Vec::new();
    for ns in &targets {
        let q = Query::user(&id.user)
            .verbs(WRITE_VERBS)
            .resource("configmaps")
            .namespace(ns)
            .name("cfg")
            .between(start_utc, end_utc);
        per_copy.push((ns.clone(), audit.count(&q), audit.by_code(&q)));
    }

    println!("{TEST}: the neighbour's updates in 30 s: {updates}");
    for (ns, writes, by_code) in &per_copy {
        println!("{TEST}: operator writes to {ns}/cfg in 30 s: {writes} (by code {by_code:?})");
    }
    println!(
        "{TEST}: every copy right after the neighbour stopped: {:?}",
        converged.as_ref().map(|d| secs(*d))
    );
    let mut failures = Vec::new();
    for (ns, writes, _) in &per_copy {
        if *writes > 15 {
            failures.push(format!("{writes} writes to {ns}/cfg in 30 s (at most 15)"));
        }
    }
    if let Err(e) = &converged {
        failures.push(format!("not right again after the neighbour stopped: {e}"));
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
    operator.assert_running();
}

// ===========================================================================
// 7. a mutating admission policy adds a label on every write

/// A MutatingAdmissionPolicy (the webhook-free form of a mutating webhook)
/// adds a label to every ConfigMap written into one target namespace, the
/// operator's writes included. The operator accepts its own write as the
/// API server answered it: one write per copy, then no fight, and a
/// source change is one more write, not a loop.
#[tokio::test]
async fn a_mutating_policy_adding_a_label_to_every_write_draws_no_loop() {
    const TEST: &str = "mutating-policy";
    const INJECTED: &str = "policy.example.com/injected";
    let audit = Audit::start();
    let t = TestNs::new("nb-mutate").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let mutated = t.ns("t1").await;
    let plain = t.ns("t2").await;
    let id = operator_identity(&t, &cluster, &op, "copyrator-mutate", operator_rules()).await;
    let policy = format!("{}-inject", t.prefix);
    cluster
        .create(
            &t.client,
            &ar::<MutatingAdmissionPolicy>(),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingAdmissionPolicy",
                "metadata": {"name": policy},
                "spec": {
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": [""], "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"],
                    }]},
                    "mutations": [{
                        "patchType": "ApplyConfiguration",
                        "applyConfiguration": {"expression": format!(
                            "Object{{metadata: Object.metadata{{labels: {{\"{INJECTED}\": \"yes\"}}}}}}"
                        )},
                    }],
                },
            }),
        )
        .await;
    cluster
        .create(
            &t.client,
            &ar::<MutatingAdmissionPolicyBinding>(),
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingAdmissionPolicyBinding",
                "metadata": {"name": policy},
                "spec": {
                    "policyName": policy,
                    "matchResources": {"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": mutated,
                    }}},
                },
            }),
        )
        .await;
    // Policies become active a moment after they are made: probe with a
    // dry-run create until the answer carries the label.
    let probe: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "probe"}})).unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_until("the mutating policy to be active", MINUTE, async || {
        let answer = t
            .cms(&mutated)
            .create(&dry_run, &probe)
            .await
            .map_err(|e| err_msg(&e))?;
        let labels = answer.metadata.labels.unwrap_or_default();
        if labels.contains_key(INJECTED) {
            Ok(())
        } else {
            Err(format!("labels {labels:?}"))
        }
    })
    .await;

    let mut operator = start_operator(&t, &op, &id).await;
    let src = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    let uid = create_cfgs_rule(&t, &op).await;
    let start_utc = Utc::now();
    let targets = [mutated.clone(), plain.clone()];
    wait_until("both copies right", MINUTE, async || {
        copies_right(&t, (&op, "cfgs", &uid), &targets, &[&src]).await
    })
    .await;
    let copy = t.must_get(CM, &mutated, "cfg").await;
    assert_eq!(
        copy.label(INJECTED),
        Some("yes"),
        "the policy labelled the copy"
    );

    // Quiet for 20 s: no write answers the policy's label.
    let quiet_from = Instant::now();
    sleep_until(quiet_from + Duration::from_secs(20)).await;
    let src = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    wait_until("both copies carry the change", MINUTE, async || {
        copies_right(&t, (&op, "cfgs", &uid), &targets, &[&src]).await
    })
    .await;
    sleep_until(Instant::now() + Duration::from_secs(10)).await;
    let end_utc = Utc::now();
    audit.settle(&t.client, end_utc).await;
    let writes = |ns: &str| {
        audit.count(
            &Query::user(&id.user)
                .verbs(WRITE_VERBS)
                .resource("configmaps")
                .namespace(ns)
                .between(start_utc, end_utc),
        )
    };
    let (in_mutated, in_plain) = (writes(&mutated), writes(&plain));
    println!(
        "{TEST}: operator writes over {:.0} s (a create, 20 s quiet, a source change, 10 s):          {in_mutated} into the mutated namespace, {in_plain} into the plain one",
        (end_utc - start_utc).num_milliseconds() as f64 / 1000.0
    );
    let copy = t.must_get(CM, &mutated, "cfg").await;
    assert_eq!(
        copy.label(INJECTED),
        Some("yes"),
        "the policy's label stays"
    );
    assert!(
        in_mutated <= in_plain + 1,
        "{in_mutated} writes into the mutated namespace against {in_plain} into the plain one: \
         the operator fought the policy"
    );
    operator.assert_running();
}

// ===========================================================================
// 8. a neighbour keeps deleting a copy

/// A neighbour deletes one copy every 2 s for 40 s: the copy is put back
/// at once at first, then with growing delays (at most 10 creates, at
/// least [`fewest_restores`]); after the neighbour stops it is back.
#[tokio::test]
async fn a_copy_deleted_again_and_again_is_put_back_with_growing_delays() {
    const TEST: &str = "deleter";
    const PERIOD: Duration = Duration::from_secs(40);
    const DELETE_EVERY: Duration = Duration::from_secs(2);
    let audit = Audit::start();
    let t = TestNs::new("nb-delete").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let target = t.ns("t1").await;
    let id = operator_identity(&t, &cluster, &op, "copyrator-deleted", operator_rules()).await;
    let mut operator = start_operator(&t, &op, &id).await;
    let src = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let uid = create_cfgs_rule(&t, &op).await;
    let targets = [target.clone()];
    wait_until("the copy", MINUTE, async || {
        copies_right(&t, (&op, "cfgs", &uid), &targets, &[&src]).await
    })
    .await;

    let start = Instant::now();
    let start_utc = Utc::now();
    let mut deletions = 0;
    let mut next = start;
    while start.elapsed() < PERIOD {
        sleep_until(next).await;
        next += DELETE_EVERY;
        if t.try_get(CM, &target, "cfg").await.ok().flatten().is_some() {
            match t.cms(&target).delete("cfg", &DeleteParams::default()).await {
                Ok(_) => deletions += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => panic!("deleting the copy: {}", err_msg(&e)),
            }
        }
    }
    // Reported as contested, as a copy changed back is: the status names
    // the copy and its other writer, an Event says so, and the gauge counts it.
    let rule_now = t.get_rule(&op, "cfgs").await;
    let listed = rule_now
        .pointer("/status/contested")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["namespace"] == target.as_str() && c["name"] == "cfg")
        });
    let contested_events = t
        .events_regarding(&op, "cfgs")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CopyContested"))
        .count();
    let gauge = metric(&operator, "copyrator_copies_contested").await;
    let end_utc = start_utc + utc(PERIOD);
    let back = poll(
        Duration::from_secs(330),
        Duration::from_secs(1),
        async || copies_right(&t, (&op, "cfgs", &uid), &targets, &[&src]).await,
    )
    .await
    .map(|((), d)| d);
    audit.settle(&t.client, end_utc).await;
    let creates_query = Query::user(&id.user)
        .verbs(&["create"])
        .resource("configmaps")
        .namespace(&target)
        .between(start_utc, end_utc);
    let creates = audit.count(&creates_query);
    let by_code = audit.by_code(&creates_query);
    let put_back = succeeded(&by_code);
    let fewest = fewest_restores(PERIOD, DELETE_EVERY);
    println!(
        "{TEST}: the neighbour deleted the copy {deletions} times in {} s; the operator created it {creates} times \
         (by code {by_code:?}; at least {fewest} expected); back after the neighbour stopped: {:?}",
        PERIOD.as_secs(),
        back.as_ref().map(|d| secs(*d))
    );
    assert!(
        creates <= 10,
        "{creates} creates answered {deletions} deletions in {} s",
        PERIOD.as_secs()
    );
    // Growing delays, not giving up: the copy is still put back on schedule.
    assert!(
        put_back >= fewest as usize,
        "the copy was put back {put_back} times after {deletions} deletions in {} s (at least {fewest}; by code {by_code:?})",
        PERIOD.as_secs()
    );
    assert!(
        listed && status_u64(&rule_now, "contestedCount").is_some_and(|n| n >= 1),
        "the status does not report t1/cfg as contested: {}",
        short_status(&rule_now)
    );
    assert!(contested_events >= 1, "no CopyContested Event on the rule");
    assert!(
        gauge.as_ref().is_ok_and(|g| g.is_some_and(|g| g >= 1.0)),
        "copyrator_copies_contested is {gauge:?}"
    );
    assert!(back.is_ok(), "the copy is not back: {back:?}");
    operator.assert_running();
}

// ===========================================================================
// 9. a refused copy goes at once when what it waits for changes
//
// A rule's refused copies wait behind one gate, which tries one of them at
// a time, in turn, every few seconds; a change of the rule, of a copy's
// source or of its target namespace lets that copy go at once. Each test
// makes one copy (the witness) the last in turn and waits until its turn
// has passed; then the API server would take the witness (its policy is
// gone, or the change itself makes it acceptable), and the change is made:
// the witness is written before the gate tries another copy (but for one
// try that may fall due at that very moment), where waiting its turn would
// have taken three tries of the others first. No timing is asserted: the
// audit log gives the order.

const REFUSED: &str = "configmaps are refused here";

/// The operator's ConfigMap writes that were refused (403).
fn refused_writes(user: &str) -> Query {
    Query::user(user)
        .verbs(&["create", "update"])
        .resource("configmaps")
        .code(403)
}

/// Waits until the operator has tried to write the copy `namespace/name`
/// twice and was refused both times: its first write, then its turn among
/// the rule's refused copies.
async fn wait_turn_passed(audit: &Audit, user: &str, namespace: &str, name: &str) {
    let q = refused_writes(user).namespace(namespace).name(name);
    wait_until(
        format!("the copy {namespace}/{name} to be refused twice"),
        MINUTE,
        async || match audit.count(&q) {
            n if n >= 2 => Ok(()),
            n => Err(format!("refused {n} times")),
        },
    )
    .await;
}

/// When the API server received the operator's first write of the copy
/// `namespace/name` that it took.
async fn wait_written(audit: &Audit, user: &str, namespace: &str, name: &str) -> DateTime<Utc> {
    let q = Query::user(user)
        .verbs(&["create", "update"])
        .resource("configmaps")
        .namespace(namespace)
        .name(name);
    wait_until(
        format!("the operator's write of {namespace}/{name} in the audit log"),
        TIMEOUT,
        async || {
            audit
                .matching(&q)
                .into_iter()
                .filter(|e| matches!(e.code, Some(200 | 201)))
                .map(|e| e.received)
                .min()
                .ok_or_else(|| "none yet".to_string())
        },
    )
    .await
}

/// The operator's refused writes of copies other than `namespace/name`,
/// received in `[from, to)`: the gate's tries of the others.
async fn tries_of_others(
    t: &TestNs,
    audit: &Audit,
    user: &str,
    (namespace, name): (&str, &str),
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Vec<String> {
    audit.settle(&t.client, to).await;
    audit
        .matching(&refused_writes(user).between(from, to))
        .into_iter()
        .filter(|e| !(e.namespace.as_deref() == Some(namespace) && e.name.as_deref() == Some(name)))
        .map(|e| e.to_string())
        .collect()
}

/// The copy `namespace/name` (refused until `changed`, when what the words
/// say happened) is written by `user`, and at once: at most one refused
/// try of another copy between the change and its write.
async fn assert_written_at_once(
    test: &str,
    t: &TestNs,
    audit: &Audit,
    user: &str,
    (namespace, name): (&str, &str),
    (changed, what): (DateTime<Utc>, &str),
) {
    let written = wait_written(audit, user, namespace, name).await;
    let between = tries_of_others(t, audit, user, (namespace, name), changed, written).await;
    println!(
        "{test}: the copy was written {:.3} s after {what}; refused tries of other copies between: {between:?}",
        (written - changed).as_seconds_f64()
    );
    assert!(
        between.len() <= 1,
        "{test}: the copy waited its turn behind the rule's refusal gate: {between:?}"
    );
}

/// A rule copying one source into four namespaces, each of which refuses
/// the copy (403): the first three whatever it holds, the last in turn
/// (the witness) until [`GatedRule::let_witness_through`].
struct GatedRule {
    op: String,
    witness: String,
    source: Obj,
    id: Identity,
    operator: Operator,
    policy: String,
}

impl GatedRule {
    async fn start(
        t: &TestNs,
        cluster: &ClusterObjects,
        audit: &Audit,
        account: &str,
    ) -> GatedRule {
        let op = t.ns("op").await;
        let mut others = Vec::new();
        for i in 1..=3 {
            others.push(t.ns(&format!("t{i}")).await);
        }
        // Last in turn: the copies are tried in the order of their namespaces.
        let witness = t.ns("tz").await;
        let id = operator_identity(t, cluster, &op, account, operator_rules()).await;
        let source = t.create_source(CM, &op, "z", &[], &[("k", "v")]).await;
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        refuse_configmap_writes_unless(
            t,
            cluster,
            &format!("{}-others", t.prefix),
            &others,
            &["CREATE", "UPDATE"],
            "Forbidden",
            REFUSED,
            "false",
        )
        .await;
        let policy = format!("{}-witness", t.prefix);
        refuse_configmap_writes(
            t,
            cluster,
            &policy,
            &witness,
            &["CREATE", "UPDATE"],
            "Forbidden",
            REFUSED,
        )
        .await;
        let operator = start_operator(t, &op, &id).await;
        create_cfgs_rule(t, &op).await;
        wait_turn_passed(audit, &id.user, &witness, "z").await;
        GatedRule {
            op,
            witness,
            source,
            id,
            operator,
            policy,
        }
    }

    /// The witness's policy goes (the operator cannot see that): its copy
    /// would go through, were it tried.
    async fn let_witness_through(&self, t: &TestNs, cluster: &ClusterObjects) {
        stop_refusing(t, cluster, &self.policy).await;
        wait_admitted(t, &self.witness).await;
    }
}

/// A copy refused until its source changes: the witness `z` is refused
/// until its data is new, three copies before it in turn (`a1` to `a3`)
/// whatever they hold. Right after `z`'s turn its source changes, and the
/// copy is written at once.
#[tokio::test]
async fn a_refused_copy_is_written_at_once_when_its_source_changes() {
    const TEST: &str = "at-once-source";
    let audit = Audit::start();
    let t = TestNs::new("nb-at-once-source").await;
    let cluster = ClusterObjects::new();
    let op = t.ns("op").await;
    let target = t.ns("t").await;
    let id = operator_identity(&t, &cluster, &op, "copyrator-at-once", operator_rules()).await;
    for name in ["a1", "a2", "a3", "z"] {
        t.create_source(CM, &op, name, &[], &[("v", "old")]).await;
    }
    refuse_configmap_writes_unless(
        &t,
        &cluster,
        &format!("{}-refuse", t.prefix),
        &[&target],
        &["CREATE", "UPDATE"],
        "Forbidden",
        REFUSED,
        "object.metadata.name == 'z' && has(object.data) && 'v' in object.data \
         && object.data['v'] == 'new'",
    )
    .await;
    let mut operator = start_operator(&t, &op, &id).await;
    t.create_rule(&op, "cfgs", rule_spec(CM, t.selector(), &[&target]))
        .await;
    wait_turn_passed(&audit, &id.user, &target, "z").await;

    let changed = Utc::now();
    let z = t.set_data(CM, &op, "z", &[("v", Some("new"))]).await;
    t.wait_copy(CM, &target, &z, &op, "cfgs").await;
    assert_written_at_once(
        TEST,
        &t,
        &audit,
        &id.user,
        (&target, "z"),
        (changed, "its source changed"),
    )
    .await;
    operator.assert_running();
}

/// A copy refused until its target namespace changes: right after the
/// witness namespace's turn, its policy goes and the namespace gets a
/// label; the copy there is written at once.
#[tokio::test]
async fn a_refused_copy_is_written_at_once_when_its_target_namespace_changes() {
    const TEST: &str = "at-once-namespace";
    let audit = Audit::start();
    let t = TestNs::new("nb-at-once-ns").await;
    let cluster = ClusterObjects::new();
    let mut gated = GatedRule::start(&t, &cluster, &audit, "copyrator-at-once").await;
    gated.let_witness_through(&t, &cluster).await;

    let changed = Utc::now();
    t.namespaces()
        .patch(
            &gated.witness,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/changed": "yes"}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("labelling {}: {}", gated.witness, err_msg(&e)));
    t.wait_copy(CM, &gated.witness, &gated.source, &gated.op, "cfgs")
        .await;
    assert_written_at_once(
        TEST,
        &t,
        &audit,
        &gated.id.user,
        (&gated.witness, "z"),
        (changed, "its namespace changed"),
    )
    .await;
    gated.operator.assert_running();
}

/// A copy refused until its rule changes (in a way that changes no copy:
/// an exclude that matches nothing): right after the witness namespace's
/// turn, its policy goes and the rule changes. The pass for the new
/// generation writes every copy at once, so the first status of that
/// generation already counts the witness's copy; waiting its turn, it
/// would count none.
#[tokio::test]
async fn a_refused_copy_is_written_at_once_when_its_rule_changes() {
    const TEST: &str = "at-once-rule";
    let audit = Audit::start();
    let t = TestNs::new("nb-at-once-rule").await;
    let cluster = ClusterObjects::new();
    let mut gated = GatedRule::start(&t, &cluster, &audit, "copyrator-at-once").await;
    gated.let_witness_through(&t, &cluster).await;

    let versions = RuleVersions::start(&t, &gated.op, "cfgs").await;
    let changed = t
        .patch_rule(
            &gated.op,
            "cfgs",
            json!({"spec": {"targets": {"exclude": [t.name("none")]}}}),
        )
        .await;
    let generation = changed["metadata"]["generation"].clone();
    t.wait_copy(CM, &gated.witness, &gated.source, &gated.op, "cfgs")
        .await;
    let first = wait_until(
        "the first status of the rule's new generation",
        TIMEOUT,
        async || {
            versions
                .seen()?
                .into_iter()
                .find(|r| r.pointer("/status/observedGeneration") == Some(&generation))
                .ok_or_else(|| format!("none at generation {generation} yet"))
        },
    )
    .await;
    println!(
        "{TEST}: the first status of generation {generation}: {}",
        first["status"]
    );
    assert_eq!(
        status_u64(&first, "copies"),
        Some(1),
        "{TEST}: the first pass of the changed rule did not write the copy: {}",
        first["status"]
    );
    gated.operator.assert_running();
}
