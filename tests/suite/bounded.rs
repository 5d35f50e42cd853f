//! Bounded under any input (design.md, "Scale" and "Operations"): no
//! single rule can flood the API server, outgrow the Pod's memory or drown
//! the logs. Measured against a real control plane, with the operator under
//! a ServiceAccount of its own so that its requests are counted in the API
//! server's audit log (`COPYRATOR_AUDIT_LOG`, see `common::audit`).
//!
//! * A rule that names 1,000 source namespaces (the most a rule may name;
//!   5,000 are refused in its status) costs a few watches, not 1,000:
//!   connections, LIST and WATCH requests and memory stay bounded, and the
//!   rule has a status within seconds.
//! * Reads throttled by API Priority and Fairness are retried after the
//!   wait the API server asks for, by every watch together.
//! * A copy the API server refuses as invalid (422) is reported once (one
//!   Event, no series of them) and not written again until its rule or its
//!   source changes.
//! * A rule whose sources take long to list (its reads throttled by API
//!   Priority and Fairness) says `WaitingForSources` meanwhile, then
//!   converges.
//! * A cold start logs a summary per rule, not a line per copy.
//!
//! Each test prints what it measured before it checks its bounds.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::audit::{Audit, AuditEvent, Query, WRITE_VERBS};
use crate::common::logs::LogLine;
use crate::common::rbac::{ClusterScoped, Grant, Identity, grants_of, operator_rules};
use crate::common::rule_versions::RuleVersions;
use crate::common::*;
use chrono::Utc;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const MINUTE: Duration = Duration::from_secs(60);
const READ_VERBS: &[&str] = &["list", "watch"];

// ===========================================================================
// helpers of this file

/// The grants of [`operator_rules`].
fn operator_grants() -> BTreeSet<Grant> {
    grants_of(&json!({ "rules": operator_rules() }))
}

/// A ServiceAccount of the test's own for the operator, with [`operator_grants`].
async fn identity(t: &TestNs, cluster: &ClusterScoped, namespace: &str, account: &str) -> Identity {
    let granted = operator_grants();
    let id = Identity::create(t, cluster, namespace, account, &granted, &BTreeSet::new()).await;
    id.wait_effective(&t.client, namespace, &granted, &BTreeSet::new())
        .await;
    id
}

/// The operator as `id`, JSON logs at the default level, once it is ready.
async fn start_operator(t: &TestNs, namespace: &str, id: &Identity) -> Operator {
    let mut operator = launch_operator(t, namespace, id, &[]);
    operator.wait_ready().await;
    operator
}

/// The operator as `id`, JSON logs at the default level, with the
/// arguments `extra` too; started, not yet ready.
fn launch_operator(t: &TestNs, namespace: &str, id: &Identity, extra: &[&str]) -> Operator {
    let mut args: Vec<String> = ["run", "--namespace", namespace, "--log-format", "json"]
        .map(String::from)
        .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    Operator::start_with_env(t, args, &[("KUBECONFIG", &id.kubeconfig)])
}

/// Source watches enough for a watch per namespace of the 60 a rule names
/// in the tests of API Priority and Fairness.
const A_WATCH_PER_NAMESPACE: [&str; 2] = ["--max-source-watches", "100"];

/// The process's established TCP connections to `port`. An unreadable
/// count is an error: read as 0, it would pass every bound.
fn connections_to(pid: u32, port: u16) -> Result<usize, String> {
    common::sockets::established(pid, |_, remote| remote == port)
        .map_err(|e| format!("the connections of process {pid} from /proc: {e}"))
}

/// Peaks of the operator's memory and connections, sampled twice a second
/// until dropped; the first value that cannot be read ends the sampling
/// with its error.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<(u64, usize), String>>,
}

impl Sampler {
    fn start(pid: u32, api_port: u16) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut rss, mut connections) = (0, 0);
            while !flag.load(Ordering::Relaxed) {
                rss = rss.max(rss_kib(pid)?);
                connections = connections.max(connections_to(pid, api_port)?);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok((rss, connections))
        });
        Sampler { stop, task }
    }

    /// `(peak RSS KiB, peak connections)`; panics if a sample could not be read.
    async fn finish(self) -> (u64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.task
            .await
            .expect("the sampler")
            .unwrap_or_else(|e| panic!("sampling the operator's memory and connections: {e}"))
    }
}

fn ready_status(rule: &Value) -> Option<(String, String, String)> {
    ready_condition(rule).map(|c| {
        let s = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
        (s("status"), s("reason"), s("message"))
    })
}

/// `count` source namespaces: `op`, then names of namespaces that do not
/// exist, unique to the test.
fn source_namespaces(t: &TestNs, op: &str, count: usize) -> Vec<String> {
    let absent = (0..count - 1).map(|i| format!("{}-absent-{i:04}", t.prefix));
    std::iter::once(op.to_owned()).chain(absent).collect()
}

/// A rule `name` in `op` that copies the test's ConfigMaps in each of
/// `namespaces` into `targets`.
async fn create_rule_over(
    t: &TestNs,
    op: &str,
    name: &str,
    namespaces: &[String],
    targets: &[String],
) -> Value {
    t.create_rule(
        op,
        name,
        json!({"spec": {
            "ruleType": "configmap",
            "selector": t.selector(),
            "namespace": namespaces,
            "targets": {"include": targets},
        }}),
    )
    .await
}

/// Waits up to `within` until the rule `op/name` is Ready with `copies`
/// copies; returns how long after `since` it was seen so.
async fn wait_ready_with_copies(
    t: &TestNs,
    op: &str,
    name: &str,
    copies: u64,
    since: Instant,
    within: Duration,
) -> Duration {
    wait_until("the rule to be Ready with its copies", within, async || {
        let rule = t.get_rule(op, name).await;
        is_ready(&rule)?;
        match status_u64(&rule, "copies") {
            Some(n) if n == copies => Ok(since.elapsed()),
            other => Err(format!("copies {other:?}: {}", short_status(&rule))),
        }
    })
    .await
}

fn info_lines(operator: &Operator) -> Vec<LogLine> {
    operator
        .json_log()
        .into_iter()
        .filter(|l| l.level != "DEBUG" && l.level != "TRACE")
        .collect()
}

// ===========================================================================
// tests

#[tokio::test]
async fn a_rule_naming_1000_source_namespaces_costs_a_few_watches() {
    // The most a rule may name (5,000 is refused; see below).
    const NAMESPACES: usize = 1000;
    let audit = Audit::start();
    let t = TestNs::new("bd-many").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let targets = vec![t.ns("t0").await, t.ns("t1").await, t.ns("t2").await];
    let id = identity(&t, &cluster, &op, "copyrator-many").await;
    t.create_source(CM, &op, "one", &[], &[("k", "1")]).await;
    t.create_source(CM, &op, "two", &[], &[("k", "2")]).await;
    let operator = start_operator(&t, &op, &id).await;
    let pid = operator.pid().expect("the operator runs");
    let api_port = common::faults::api_server_address().await.port();
    let rss_before = rss_kib(pid).unwrap_or_else(|e| panic!("the operator's memory: {e}"));
    let connections_before =
        connections_to(pid, api_port).unwrap_or_else(|e| panic!("the operator's connections: {e}"));

    let namespaces = source_namespaces(&t, &op, NAMESPACES);
    let window_start = Utc::now();
    let created = Instant::now();
    let sampler = Sampler::start(pid, api_port);
    create_rule_over(&t, &op, "many", &namespaces, &targets).await;
    let first_status = wait_until("the rule to have a Ready condition", TIMEOUT, async || {
        let rule = t.get_rule(&op, "many").await;
        match ready_status(&rule) {
            Some(ready) => Ok((created.elapsed(), ready)),
            None => Err("no status yet".to_string()),
        }
    })
    .await;
    let ready_after = wait_ready_with_copies(&t, &op, "many", 6, created, MINUTE).await;
    for ns in &targets {
        t.must_get(CM, ns, "one").await;
        t.must_get(CM, ns, "two").await;
    }
    // The measured minute.
    let window_end = window_start + chrono::Duration::from_std(MINUTE).expect("a minute");
    let rest = MINUTE.saturating_sub(created.elapsed());
    tokio::time::sleep(rest).await;
    let (peak_rss, peak_connections) = sampler.finish().await;
    audit.settle(&t.client, window_end).await;
    let reads = Query::user(&id.user)
        .verbs(READ_VERBS)
        .between(window_start, window_end);
    let read_count = audit.count(&reads);
    let by_verb = audit.by_verb(&reads);
    let throttled = audit.count(
        &Query::user(&id.user)
            .code(429)
            .between(window_start, window_end),
    );
    let growth_mib = peak_rss.saturating_sub(rss_before) as f64 / 1024.0;
    println!(
        "1,000-namespace rule: first status after {:?} ({:?}), Ready with 6 copies after {ready_after:?}; \
         in the minute: {read_count} LIST/WATCH {by_verb:?}, {throttled} answered 429, \
         connections to the API server {connections_before} before, at most {peak_connections}; \
         RSS {} MiB before, peak {} MiB (+{growth_mib:.1} MiB)",
        first_status.0,
        first_status.1,
        rss_before / 1024,
        peak_rss / 1024,
    );
    // How soon the status and the copies came is printed above, not
    // asserted: the waits' deadlines say only that they came.
    assert!(
        peak_connections <= 20,
        "{peak_connections} connections to the API server"
    );
    assert!(read_count <= 200, "{read_count} LIST and WATCH requests");
    assert_eq!(throttled, 0, "requests answered 429");
    assert!(growth_mib <= 16.0, "memory grew by {growth_mib:.1} MiB");

    // 5,000 names: refused in the status at once, and nothing else changes.
    let five_thousand = source_namespaces(&t, &op, 5000);
    create_rule_over(&t, &op, "five-thousand", &five_thousand, &targets).await;
    t.wait_rule(
        &op,
        "five-thousand",
        "InvalidRule naming the limit",
        |rule| match ready_status(rule) {
            Some((status, reason, message))
                if status == "False" && reason == "InvalidRule" && message.contains("1000") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    t.wait_rule_ready(&op, "many").await;
}

#[tokio::test]
async fn reads_throttled_by_priority_and_fairness_wait_and_the_rule_converges() {
    let audit = Audit::start();
    let t = TestNs::new("bd-apf").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let targets = vec![t.ns("t0").await, t.ns("t1").await];
    let id = identity(&t, &cluster, &op, "copyrator-apf-reads").await;
    t.create_source(CM, &op, "one", &[], &[("k", "1")]).await;
    // A watch per namespace (the budget allows them), all starting at
    // once against a priority level with one seat.
    let namespaces = source_namespaces(&t, &op, 60);
    create_rule_over(&t, &op, "many", &namespaces, &targets).await;
    // A priority level with one seat that rejects what does not fit, and
    // every request of the operator in it.
    apf::one_seat_for(
        &t.client,
        &cluster,
        &t.prefix,
        &id.namespace,
        &id.account,
        apf::Throttled::All,
    )
    .await;
    let window_start = Utc::now();
    let started = Instant::now();
    let operator = launch_operator(&t, &op, &id, &A_WATCH_PER_NAMESPACE);
    let converged = wait_ready_with_copies(&t, &op, "many", 2, started, MINUTE * 2).await;
    let window_end = Utc::now();
    audit.settle(&t.client, window_end).await;
    let reads = Query::user(&id.user)
        .verbs(&["get", "list", "watch"])
        .between(window_start, window_end);
    let all_reads = audit.matching(&reads);
    let throttled: Vec<&AuditEvent> = all_reads.iter().filter(|e| e.code == Some(429)).collect();
    // Each throttled read is tried again no sooner than the second the API
    // server asks for (the next request of the same URI).
    let mut early = Vec::new();
    for refused in &throttled {
        let next = all_reads
            .iter()
            .filter(|e| e.request_uri == refused.request_uri && e.received > refused.received)
            .map(|e| e.received)
            .min();
        if let Some(next) = next
            && next - refused.received < chrono::Duration::milliseconds(950)
        {
            early.push((refused.request_uri.clone(), next - refused.received));
        }
    }
    let busiest = audit.busiest_second(&reads);
    println!(
        "reads throttled: converged after {converged:?}; {} reads, {} answered 429, busiest second {busiest:?}, \
         {} retried within 0.95 s: {early:?}",
        all_reads.len(),
        throttled.len(),
        early.len()
    );
    drop(operator);
    assert!(
        !throttled.is_empty(),
        "no read was throttled: the test did not test anything"
    );
    assert!(early.is_empty(), "throttled reads retried early: {early:?}");
    // Each of the 63 watches lists and watches about once, and again
    // after a throttled attempt: never a storm.
    assert!(
        all_reads.len() <= 63 * 2 + 4 * throttled.len() + 40,
        "{} reads",
        all_reads.len()
    );
}

#[tokio::test]
async fn a_copy_refused_as_invalid_is_reported_once_and_written_again_when_its_rule_or_source_changes()
 {
    let audit = Audit::start();
    let t = TestNs::new("bd-invalid").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let targets = vec![t.ns("t0").await, t.ns("t1").await, t.ns("t2").await];
    let id = identity(&t, &cluster, &op, "copyrator-invalid").await;
    // Each fits; together they pass the API server's 256 KiB for all annotations.
    let big = "x".repeat(200 * 1024);
    t.create_source(CM, &op, "big", &[], &[("k", "1")]).await;
    t.patch(
        CM,
        &op,
        "big",
        json!({"metadata": {"annotations": {"example.com/big": big}}}),
    )
    .await;
    let operator = start_operator(&t, &op, &id).await;
    let window_start = Utc::now();
    t.create_rule(
        &op,
        "invalid",
        json!({"spec": {
            "ruleType": "configmap",
            "selector": t.selector(),
            "targets": {"include": targets},
            "transform": {"addAnnotations": {"example.com/more": "y".repeat(100 * 1024)}},
        }}),
    )
    .await;
    let reported = t
        .wait_rule(
            &op,
            "invalid",
            "Ready=False with the API server's reason",
            |rule| match ready_status(rule) {
                Some((status, _, message)) if status == "False" && message.contains("Too long") => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    let reported = ready_status(&reported);
    let window_end = window_start + chrono::Duration::from_std(MINUTE).expect("a minute");
    tokio::time::sleep((window_end - Utc::now()).to_std().unwrap_or(Duration::ZERO)).await;
    audit.settle(&t.client, window_end).await;
    let writes = audit.count(
        &Query::user(&id.user)
            .verbs(WRITE_VERBS)
            .resource("configmaps")
            .between(window_start, window_end),
    );
    // Events of one reason fold into one object with a `series` (its
    // count) when they recur: one Event without a series was said once.
    let sync_failed: Vec<(Option<String>, Option<i32>)> = t
        .events_regarding(&op, "invalid")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SyncFailed"))
        .map(|e| (e.note, e.series.map(|s| s.count)))
        .collect();
    println!(
        "invalid copies: {writes} ConfigMap writes in the minute after the rule; status {reported:?}; \
         SyncFailed Events (note, series count): {sync_failed:?}"
    );
    assert!(writes <= 5, "{writes} ConfigMap writes in a minute");
    assert!(
        matches!(sync_failed.as_slice(), [(Some(_), None)]),
        "not exactly one SyncFailed Event said once: {sync_failed:?}"
    );
    // The rule changes, not what its copies would be (an exclude that
    // matches nothing): each copy is written again, and refused again.
    let changed = Utc::now();
    t.patch_rule(
        &op,
        "invalid",
        json!({"spec": {"targets": {"exclude": [format!("{}-none", t.prefix)]}}}),
    )
    .await;
    let again = Query::user(&id.user)
        .verbs(WRITE_VERBS)
        .resource("configmaps")
        .code(422)
        .between(changed, changed + chrono::Duration::hours(1));
    wait_until(
        "each copy written again once the rule changed",
        TIMEOUT,
        async || {
            let written: BTreeSet<String> = audit
                .matching(&again)
                .into_iter()
                .filter_map(|e| e.namespace)
                .collect();
            if targets.iter().all(|ns| written.contains(ns)) {
                Ok(())
            } else {
                Err(format!("refused writes into {written:?}"))
            }
        },
    )
    .await;
    // The source changes: the copies are written at once.
    t.patch(
        CM,
        &op,
        "big",
        json!({"metadata": {"annotations": {"example.com/big": "small"}}}),
    )
    .await;
    for ns in &targets {
        t.wait_obj(
            CM,
            ns,
            "big",
            "a copy once the source fits",
            |copy| match copy.annotation("example.com/big") {
                Some("small") => Ok(()),
                other => Err(format!("example.com/big: {other:?}")),
            },
        )
        .await;
    }

    drop(operator);
}

/// A rule names 60 source namespaces, and API Priority and Fairness holds
/// back the operator's reads there: its LIST and WATCH requests of
/// ConfigMaps within a namespace go to a priority level with one seat that
/// rejects what does not fit (429), and a throttled read pauses every watch
/// for a second or more. So listing the sources takes longer than half a
/// second, and the status says so meanwhile (`Ready=Unknown`, reason
/// `WaitingForSources`, how many of the 60 namespaces are listed); then the
/// rule converges. Every version of the rule is watched: that status lasts
/// only while the listing does.
#[tokio::test]
async fn a_rule_whose_sources_take_long_to_list_says_waiting_for_sources_then_converges() {
    const NAMESPACES: usize = 60;
    let audit = Audit::start();
    let t = TestNs::new("bd-waiting").await;
    let cluster = ClusterScoped::new();
    let op = t.ns("op").await;
    let target = t.ns("t0").await;
    let account = "copyrator-waiting";
    let id = identity(&t, &cluster, &op, account).await;
    let source = t.create_source(CM, &op, "one", &[], &[("k", "1")]).await;
    apf::one_seat_for(
        &t.client,
        &cluster,
        &t.prefix,
        &op,
        account,
        apf::Throttled::NamespacedReads("configmaps"),
    )
    .await;
    // A watch per source namespace (the budget allows them), all starting
    // at once.
    let mut operator = launch_operator(&t, &op, &id, &A_WATCH_PER_NAMESPACE);
    operator.wait_ready().await;

    let namespaces = source_namespaces(&t, &op, NAMESPACES);
    let window_start = Utc::now();
    let versions = RuleVersions::start(&t, &op, "many").await;
    create_rule_over(&t, &op, "many", &namespaces, std::slice::from_ref(&target)).await;
    t.wait_copy(CM, &target, &source, &op, "many").await;
    wait_ready_with_copies(&t, &op, "many", 1, Instant::now(), MINUTE * 2).await;
    let window_end = Utc::now();
    audit.settle(&t.client, window_end).await;
    let throttled = audit.count(
        &Query::user(&id.user)
            .verbs(READ_VERBS)
            .resource("configmaps")
            .code(429)
            .between(window_start, window_end),
    );
    let said: Vec<(String, String, String)> = versions
        .seen()
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .filter_map(ready_status)
        .collect();
    println!(
        "waiting for sources: {throttled} reads of the source namespaces answered 429; \
         Ready conditions in turn: {said:?}"
    );
    assert!(
        throttled > 0,
        "no read of a source namespace was throttled: the test did not test anything"
    );
    // "listing the sources: N of 60 source namespaces listed": N, when it says that.
    let of = format!(" of {NAMESPACES} source namespaces listed");
    let listed = |message: &str| {
        // What the last failed try said may follow.
        let counts = message
            .split("; the last try failed")
            .next()
            .unwrap_or(message);
        counts
            .strip_prefix("listing the sources: ")
            .and_then(|m| m.strip_suffix(&of))
            .and_then(|n| n.parse::<usize>().ok())
    };
    let waiting = said.iter().position(|(status, reason, message)| {
        status == "Unknown"
            && reason == "WaitingForSources"
            && listed(message).is_some_and(|n| n < NAMESPACES)
    });
    let ready = said.iter().position(|(status, _, _)| status == "True");
    assert!(
        matches!((waiting, ready), (Some(w), Some(r)) if w < r),
        "the status did not say WaitingForSources, counting the listed namespaces, before Ready: {said:?}"
    );
    operator.assert_running();
}

#[tokio::test]
async fn a_cold_start_of_100_copies_logs_a_summary_not_a_line_per_copy() {
    const SOURCES: usize = 10;
    let t = TestNs::new("bd-logs").await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 0..10 {
        targets.push(t.ns(&format!("t{i}")).await);
    }
    for i in 0..SOURCES {
        t.create_source(CM, &op, &format!("src-{i}"), &[], &[("k", "v")])
            .await;
    }
    t.create_rule(
        &op,
        "hundred",
        json!({"spec": {
            "ruleType": "configmap",
            "selector": t.selector(),
            "targets": {"include": targets},
        }}),
    )
    .await;
    let mut operator = Operator::start(&t, &op, &["--log-format", "json"]);
    operator.wait_ready().await;
    t.wait_rule(&op, "hundred", "Ready with 100 copies", |rule| {
        is_ready(rule)?;
        match status_u64(rule, "copies") {
            Some(100) => Ok(()),
            other => Err(format!("copies {other:?}")),
        }
    })
    .await;
    // Whatever the pass logs has been written once the rule is Ready and
    // its transition is logged.
    let lines = wait_until("the readiness line", TIMEOUT, async || {
        let lines = info_lines(&operator);
        if lines
            .iter()
            .any(|l| l.message == "rule readiness changed" && l.str("ready") == Some("True"))
        {
            Ok(lines)
        } else {
            Err(format!("{} lines, none says Ready", lines.len()))
        }
    })
    .await;
    let created: u64 = lines
        .iter()
        .filter(|l| l.message == "rule pass")
        .filter_map(|l| l.u64("created"))
        .sum();
    let by_message: BTreeMap<&str, usize> = lines.iter().fold(BTreeMap::new(), |mut counts, l| {
        *counts.entry(l.message.as_str()).or_default() += 1;
        counts
    });
    println!(
        "cold start of 100 copies: {} lines at info and above {by_message:?}; created {created}",
        lines.len()
    );
    assert!(lines.len() <= 30, "{} log lines", lines.len());
    assert_eq!(
        created, 100,
        "the copies created, as the summaries count them"
    );
}
