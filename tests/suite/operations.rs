//! Operating Copyrator: what an operator of the operator relies on.
//!
//! * `/metrics`: every family is exposed and the counters follow what the
//!   operator did (writes by verb and kind, copies managed, conflicts).
//! * `/healthz` and `/readyz`: ready only once the caches have synced (an
//!   API server held back by a TCP proxy, and an unreachable one); healthy
//!   until a watch has failed for `--stuck-after` (a proxy refusing
//!   connections, and healthy again after) or queued work has made no
//!   progress for that long (a half-dead network).
//! * Leader election on a Lease: one writer, a warm standby, takeover after
//!   SIGKILL within the lease duration and after SIGTERM within seconds.
//! * Graceful shutdown on SIGTERM and SIGINT, idle and during a burst, and
//!   a successor that converges without losing or duplicating a copy.
//! * Secret values never reach logs (debug text, trace JSON), events or the
//!   rule's status.
//! * `--log-format json`: every line is JSON, write lines name rule,
//!   namespace and name.
//!
//! Every test works in namespaces of its own and restricts its rules'
//! targets with `spec.targets.include`, so they run in parallel with others.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::audit::{Audit, AuditEvent, Query, WRITE_VERBS};
use crate::common::faults::api_server_address;
use crate::common::logs::LogLine;
use crate::common::*;
use chrono::Utc;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::Value;

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

/// The flags of a leader-electing replica with a short Lease.
const LEASE_SECONDS: u64 = 6;

// ===========================================================================
// helpers of this file

/// One scrape of `/metrics`, parsed.
struct Scrape {
    text: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    fn parse(text: String) -> Result<Scrape, String> {
        let mut samples = Vec::new();
        for line in text.lines().map(str::trim) {
            let Some((name, labels, value)) = common::prometheus::sample(line)? else {
                continue;
            };
            let value: f64 = value
                .parse()
                .map_err(|e| format!("sample value in {line:?}: {e}"))?;
            samples.push((name.to_string(), labels, value));
        }
        Ok(Scrape { text, samples })
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = f64> + 'a {
        self.samples
            .iter()
            .filter(move |(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
    }

    /// The sum of every series of `name` carrying `labels` (None: no series).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut it = self.matching(name, labels).peekable();
        it.peek()?;
        Some(it.sum())
    }

    /// As [`Scrape::get`], an absent series counting 0 (a counter never incremented).
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    fn must(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in /metrics:\n{}", self.text))
    }

    /// The `# TYPE` of a family.
    fn family_type(&self, family: &str) -> Option<String> {
        self.text.lines().find_map(|l| {
            let rest = l.strip_prefix("# TYPE ")?;
            let (name, kind) = rest.split_once(' ')?;
            (name == family).then(|| kind.trim().to_string())
        })
    }

    fn label_values(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .filter_map(|(_, l, _)| l.get(label).cloned())
            .collect()
    }
}

async fn try_scrape(port: u16) -> Result<Scrape, String> {
    match http_get(port, "/metrics").await? {
        (200, body) => Scrape::parse(body),
        (code, body) => Err(format!("GET /metrics answered {code}: {body}")),
    }
}

async fn scrape(operator: &Operator) -> Scrape {
    try_scrape(operator.port)
        .await
        .unwrap_or_else(|e| panic!("scraping 127.0.0.1:{}/metrics: {e}", operator.port))
}

async fn status_of(port: u16, path: &str) -> Result<u16, String> {
    http_get(port, path).await.map(|(code, _)| code)
}

fn send_signal(operator: &Operator, signal: &str) {
    let pid = operator
        .pid()
        .expect("the operator process is running")
        .to_string();
    let ok = Command::new("kill")
        .args([format!("-{signal}"), pid.clone()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{signal} {pid} failed");
}

/// Polls for the process to exit; its status and the time it took.
async fn wait_exit(operator: &mut Operator, within: Duration) -> (ExitStatus, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = operator.try_exit() {
            return (status, start.elapsed());
        }
        if start.elapsed() > within {
            panic!(
                "the operator {:?} did not exit within {within:?}; log:\n{}",
                operator.args,
                tail(&operator.logs(), 6000)
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Waits until the operator (run with `--log-format json`) logs a line of
/// this exact message whose string fields have these values.
async fn wait_logged(
    operator: &Operator,
    message: &str,
    fields: &[(&str, &str)],
    timeout: Duration,
) -> LogLine {
    operator
        .wait_log_line(&format!("{message:?} {fields:?}"), timeout, |l| {
            l.is(message, fields)
        })
        .await
}

/// The lines of a JSON log with this exact message.
fn lines_of<'a>(lines: &'a [LogLine], message: &'a str) -> impl Iterator<Item = &'a LogLine> {
    lines.iter().filter(move |l| l.message == message)
}

/// Copies of `kind` made by the rule of this uid, as (namespace, name) → object.
async fn copies_of(t: &TestNs, kind: Kind, rule_uid: &str) -> BTreeMap<(String, String), Obj> {
    t.list_labelled(kind, LABEL_RULE_UID, rule_uid)
        .await
        .into_iter()
        .map(|o| ((o.namespace.clone(), o.name.clone()), o))
        .collect()
}

async fn lease_holder(t: &TestNs, ns: &str, name: &str) -> Result<Option<String>, String> {
    let lease = Api::<Lease>::namespaced(t.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| err_msg(&e))?;
    Ok(lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The Lease `ns/name`: (holder, acquireTime, renewTime, leaseDurationSeconds).
async fn lease_times(
    t: &TestNs,
    ns: &str,
    name: &str,
) -> (
    Option<String>,
    Option<chrono::DateTime<Utc>>,
    Option<chrono::DateTime<Utc>>,
    i64,
) {
    let spec = Api::<Lease>::namespaced(t.client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading the Lease {ns}/{name}: {}", err_msg(&e)))
        .spec
        .unwrap_or_default();
    let time = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>| {
        t.and_then(|t| chrono::DateTime::from_timestamp_micros(t.0.as_microsecond()))
    };
    (
        spec.holder_identity.filter(|h| !h.is_empty()),
        time(spec.acquire_time),
        time(spec.renew_time),
        i64::from(spec.lease_duration_seconds.unwrap_or_default()),
    )
}

/// `copyrator_leader` of each operator.
async fn leader_gauges(ops: &[Operator]) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    for op in ops {
        let s = try_scrape(op.port).await?;
        out.push(
            s.get("copyrator_leader", &[])
                .ok_or("no copyrator_leader series")?,
        );
    }
    Ok(out)
}

/// Waits until exactly one of `ops` reports `copyrator_leader 1` and the
/// others 0, and the Lease names that process; returns its index.
async fn wait_one_leader(t: &TestNs, ops: &[Operator], ns: &str, lease: &str) -> usize {
    wait_until("exactly one leader", TIMEOUT, async || {
        let gauges = leader_gauges(ops).await?;
        let leaders: Vec<usize> = (0..gauges.len()).filter(|i| gauges[*i] == 1.0).collect();
        let others_zero = gauges.iter().all(|g| *g == 0.0 || *g == 1.0);
        if leaders.len() != 1 || !others_zero {
            return Err(format!("copyrator_leader per process: {gauges:?}"));
        }
        let i = leaders[0];
        let holder = lease_holder(t, ns, lease).await?;
        let pid = ops[i].pid().ok_or("the leader is not running")?;
        match &holder {
            Some(h) if h.ends_with(&format!("-{pid}")) => Ok(i),
            other => Err(format!(
                "gauges {gauges:?}, but the Lease holder is {other:?}, not the process {pid}"
            )),
        }
    })
    .await
}

fn leader_flags(lease: &str) -> Vec<String> {
    vec![
        "--log-format".into(),
        "json".into(),
        "--leader-election".into(),
        "--lease-name".into(),
        lease.into(),
        "--lease-duration".into(),
        LEASE_SECONDS.to_string(),
    ]
}

fn start_replica(t: &TestNs, ns: &str, lease: &str) -> Operator {
    let flags = leader_flags(lease);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Operator::start(t, ns, &flags)
}

/// What the [`FaultProxy`] does with the operator's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Both ways, byte for byte.
    Forward,
    /// Nothing goes through, nothing is closed: connections open (TCP
    /// accepted) but carry no byte either way; those already open stall.
    Hold,
    /// Every connection is closed, new ones at once.
    Refuse,
}

/// A TCP proxy to the API server whose network can fail: forward, hold
/// (a held-back or half-dead API server: connections open, no byte moves)
/// or refuse (connections closed). TLS goes through end to end (the server
/// certificate names 127.0.0.1). It starts holding.
struct FaultProxy {
    port: u16,
    mode: tokio::sync::watch::Sender<Mode>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    /// Connections accepted while not forwarding.
    attempts_while_down: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// Waits until the proxy forwards; `false` when it refuses (or is gone).
async fn forwarding(mode: &mut tokio::sync::watch::Receiver<Mode>) -> bool {
    match mode.wait_for(|m| *m != Mode::Hold).await {
        Ok(m) => *m == Mode::Forward,
        Err(_) => false,
    }
}

/// One direction of a connection: each chunk read waits for the proxy to
/// forward before it is written on.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: tokio::sync::watch::Receiver<Mode>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !forwarding(&mut mode).await {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if !forwarding(&mut mode).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl FaultProxy {
    async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode, watch_mode) = tokio::sync::watch::channel(Mode::Hold);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let attempts_while_down = Arc::new(AtomicUsize::new(0));
        let (live, attempts) = (connections.clone(), attempts_while_down.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let now = *watch_mode.borrow();
                if now != Mode::Forward {
                    attempts.fetch_add(1, Ordering::Relaxed);
                }
                if now == Mode::Refuse {
                    drop(inbound);
                    continue;
                }
                let mut mode = watch_mode.clone();
                let connection = tokio::spawn(async move {
                    if !forwarding(&mut mode).await {
                        return;
                    }
                    let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::select! {
                        _ = pump(in_read, out_write, mode.clone()) => {}
                        _ = pump(out_read, in_write, mode) => {}
                    }
                });
                live.lock().unwrap().push(connection.abort_handle());
            }
        });
        FaultProxy {
            port,
            mode,
            connections,
            attempts_while_down,
            task,
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn open(&self) {
        let _ = self.mode.send(Mode::Forward);
    }

    fn close_all(&self) {
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// Drop every connection (both ends close) and hold new ones: a broken
    /// watch, then an API server that does not answer.
    fn cut(&self) {
        let _ = self.mode.send(Mode::Hold);
        self.close_all();
    }

    /// Close every connection, and each new one at once.
    fn refuse(&self) {
        let _ = self.mode.send(Mode::Refuse);
        self.close_all();
    }

    /// A half-dead network: every connection stays open and nothing moves.
    fn stall(&self) {
        let _ = self.mode.send(Mode::Hold);
    }

    fn attempts_while_down(&self) -> usize {
        self.attempts_while_down.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.refuse();
    }
}

/// Every events.k8s.io Event in `namespaces`, as JSON.
async fn events_in(t: &TestNs, namespaces: &[&String]) -> Vec<Value> {
    let mut out = Vec::new();
    for ns in namespaces {
        let list = Api::<Event>::namespaced(t.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing events in {ns}: {}", err_msg(&e)));
        out.extend(
            list.items
                .into_iter()
                .map(|e| serde_json::to_value(e).unwrap()),
        );
    }
    out
}

// ===========================================================================
// 1. metrics

/// Every metric family and its type.
const FAMILIES: &[(&str, &str)] = &[
    ("copyrator_reconciles", "counter"),
    ("copyrator_reconcile_duration_seconds", "histogram"),
    ("copyrator_api_writes", "counter"),
    ("copyrator_copies_managed", "gauge"),
    ("copyrator_conflicts_skipped", "gauge"),
    ("copyrator_queue_depth", "gauge"),
    ("copyrator_leader", "gauge"),
    ("copyrator_copies_contested", "gauge"),
    ("copyrator_write_failures", "counter"),
    ("copyrator_source_watches", "gauge"),
];
// copyrator_rule_ready has a series per rule, none before the first rule;
// tests/suite/chart.rs reads it from a scrape with a rule.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_every_family_and_follow_the_writes() {
    let t = TestNs::new("ops-metrics").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let t3 = t.ns("t3").await;
    // A foreign ConfigMap holds the name in t3: one conflict for the ConfigMap rule.
    let foreign = t
        .create_plain(
            CM,
            &t3,
            "cfg",
            &[("owner", "someone-else")],
            &[("mine", "yes")],
        )
        .await;

    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    let before = scrape(&operator).await;

    // The unlabelled families are there from the start (the labelled ones
    // are checked in `metrics_every_family_exists_before_its_first_event`).
    for gauge in [
        "copyrator_copies_managed",
        "copyrator_conflicts_skipped",
        "copyrator_queue_depth",
        "copyrator_reconcile_duration_seconds_count",
    ] {
        assert_eq!(
            before.get(gauge, &[]),
            Some(0.0),
            "{gauge} at start:\n{}",
            before.text
        );
    }
    assert_eq!(
        before.must("copyrator_leader", &[]),
        1.0,
        "no election: leader"
    );

    let cfg = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    let cred = t
        .create_source(SECRET, &op, "cred", &[], &[("token", "tok-1")])
        .await;
    let include = [t.glob("t")];
    t.create_rule(&op, "cms", rule_spec(CM, t.selector(), &include))
        .await;
    t.create_rule(&op, "secrets", rule_spec(SECRET, t.selector(), &include))
        .await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &cfg, &op, "cms").await;
    }
    for ns in [&t1, &t2, &t3] {
        t.wait_copy(SECRET, ns, &cred, &op, "secrets").await;
    }
    t.wait_rule(&op, "cms", "one conflict reported", |r| {
        is_ready(r)?;
        match status_u64(r, "conflictCount") {
            Some(1) => Ok(()),
            _ => Err(short_status(r)),
        }
    })
    .await;
    t.wait_rule_ready(&op, "secrets").await;
    // Change a source: two updates.
    let cfg = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &cfg, &op, "cms").await;
    }

    let cms_uid = t.rule_uid(&op, "cms").await;
    let secrets_uid = t.rule_uid(&op, "secrets").await;
    let made =
        copies_of(&t, CM, &cms_uid).await.len() + copies_of(&t, SECRET, &secrets_uid).await.len();
    assert_eq!(made, 5, "copies in the cluster: 2 ConfigMaps and 3 Secrets");

    // The gauges settle once the last reconcile has published.
    let after = wait_until(
        "copies_managed 5, conflicts_skipped 1, queue empty",
        TIMEOUT,
        async || {
            let s = try_scrape(operator.port).await?;
            let seen = (
                s.get("copyrator_copies_managed", &[]),
                s.get("copyrator_conflicts_skipped", &[]),
                s.get("copyrator_queue_depth", &[]),
            );
            if seen == (Some(made as f64), Some(1.0), Some(0.0)) {
                Ok(s)
            } else {
                Err(format!(
                    "(copies_managed, conflicts_skipped, queue_depth) = {seen:?}"
                ))
            }
        },
    )
    .await;

    // Every family is exposed, with its type.
    for (family, kind) in FAMILIES {
        assert_eq!(
            after.family_type(family).as_deref(),
            Some(*kind),
            "# TYPE of {family} in /metrics:\n{}",
            after.text
        );
    }
    // reconciles by result
    let successes = after.must("copyrator_reconciles_total", &[("result", "success")]);
    assert!(
        successes > before.sum("copyrator_reconciles_total", &[("result", "success")]),
        "successful reconciles did not rise: {successes}"
    );
    let results = after.label_values("copyrator_reconciles_total", "result");
    assert!(
        results
            .iter()
            .all(|r| ["success", "error", "invalid"].contains(&r.as_str())),
        "result label values: {results:?}"
    );
    // the histogram
    let count = after.must("copyrator_reconcile_duration_seconds_count", &[]);
    let sum = after.must("copyrator_reconcile_duration_seconds_sum", &[]);
    let inf = after.must(
        "copyrator_reconcile_duration_seconds_bucket",
        &[("le", "+Inf")],
    );
    assert!(count >= 1.0, "reconcile_duration count {count}");
    assert!(sum > 0.0, "reconcile_duration sum {sum}");
    assert_eq!(inf, count, "the +Inf bucket holds every observation");
    let mut buckets: Vec<(f64, f64)> = after
        .samples
        .iter()
        .filter(|(n, _, _)| n == "copyrator_reconcile_duration_seconds_bucket")
        .map(|(_, l, v)| {
            let le = l["le"].as_str();
            (
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                *v,
            )
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(buckets.len() >= 2, "histogram buckets: {buckets:?}");
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "cumulative buckets never decrease: {buckets:?}"
    );
    // writes by verb and kind
    let delta = |verb: &str, kind: &str| {
        after.sum(
            "copyrator_api_writes_total",
            &[("verb", verb), ("kind", kind)],
        ) - before.sum(
            "copyrator_api_writes_total",
            &[("verb", verb), ("kind", kind)],
        )
    };
    let (create_cm, create_secret, update_cm) = (
        delta("create", "ConfigMap"),
        delta("create", "Secret"),
        delta("update", "ConfigMap"),
    );
    println!(
        "writes during the scenario: create ConfigMap {create_cm}, create Secret {create_secret}, update ConfigMap {update_cm}, all {:?}",
        after
            .samples
            .iter()
            .filter(|(n, _, _)| n == "copyrator_api_writes_total")
            .map(|(_, l, v)| format!("{}/{}={v}", l["verb"], l["kind"]))
            .collect::<Vec<_>>()
    );
    // The conflict's create is refused (409) and still counted as a request.
    assert!(
        create_cm >= 2.0,
        "create ConfigMap writes rose by {create_cm}"
    );
    assert!(
        create_secret >= 3.0,
        "create Secret writes rose by {create_secret}"
    );
    assert!(
        update_cm >= 2.0,
        "update ConfigMap writes rose by {update_cm}"
    );
    assert_eq!(delta("delete", "ConfigMap"), 0.0, "nothing was deleted yet");
    assert_eq!(after.must("copyrator_leader", &[]), 1.0);

    // Deleting a rule takes its copies, and its share of the gauges, away.
    t.delete_rule(&op, "cms").await;
    t.wait_rule_gone(&op, "cms", "its finalizer ran").await;
    for ns in [&t1, &t2] {
        t.wait_gone(CM, ns, "cfg", "the rule was deleted").await;
    }
    let last = wait_until(
        "copies_managed 3 and conflicts_skipped 0",
        TIMEOUT,
        async || {
            let s = try_scrape(operator.port).await?;
            let seen = (
                s.get("copyrator_copies_managed", &[]),
                s.get("copyrator_conflicts_skipped", &[]),
            );
            if seen == (Some(3.0), Some(0.0)) {
                Ok(s)
            } else {
                Err(format!("(copies_managed, conflicts_skipped) = {seen:?}"))
            }
        },
    )
    .await;
    let deletes = last.sum(
        "copyrator_api_writes_total",
        &[("verb", "delete"), ("kind", "ConfigMap")],
    );
    assert!(deletes >= 2.0, "delete ConfigMap writes: {deletes}");
    let kept = t.must_get(CM, &t3, "cfg").await;
    assert_eq!(
        kept.resource_version, foreign.resource_version,
        "the foreign ConfigMap is untouched"
    );
    operator.assert_running();
}

/// A series that appears only with its first event breaks the usual alerts:
/// `increase(copyrator_reconciles_total{result="error"}[10m]) > 0` cannot
/// see the first error of a process when the series did not exist before
/// it (Prometheus' "avoid missing metrics"). A fresh operator declares
/// every family and exports 0 for the results it knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_every_family_exists_before_its_first_event() {
    let t = TestNs::new("ops-metrics-fresh").await;
    let op = t.ns("op").await;
    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    let fresh = scrape(&operator).await;
    let missing: Vec<&str> = FAMILIES
        .iter()
        .filter(|(family, kind)| fresh.family_type(family).as_deref() != Some(*kind))
        .map(|(family, _)| *family)
        .collect();
    assert!(
        missing.is_empty(),
        "families not declared by a fresh operator: {missing:?}\n/metrics:\n{}",
        fresh.text
    );
    for result in ["success", "error"] {
        assert_eq!(
            fresh.get("copyrator_reconciles_total", &[("result", result)]),
            Some(0.0),
            "copyrator_reconciles_total{{result={result:?}}} at start:\n{}",
            fresh.text
        );
    }
    operator.assert_running();
}

// ===========================================================================
// 2. health probes

/// `--stuck-after` of the tests that hold the API server back and expect
/// /healthz 200 meanwhile: longer than they hold it back.
const STUCK_AFTER_LONG: u64 = 60;

/// `run --namespace <op> --log-format json [--stuck-after <stuck_after>]` plus
/// `extra`, reaching the API server at `server` (`None`: as `$KUBECONFIG`
/// says) as the user `act_as` (`None`: the admin itself).
fn start_json_operator(
    t: &TestNs,
    op: &str,
    stuck_after: Option<u64>,
    server: Option<&str>,
    act_as: Option<&str>,
    extra: &[&str],
) -> Operator {
    let mut args: Vec<String> = ["run", "--namespace", op, "--log-format", "json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(stuck_after) = stuck_after {
        args.extend(["--stuck-after".into(), stuck_after.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let kubeconfig = operator_kubeconfig(t, server, act_as);
    Operator::start_with_env(t, args, &[("KUBECONFIG", kubeconfig.to_str().unwrap())])
}

/// `GET /healthz`: (code, body).
async fn healthz(port: u16) -> Result<(u16, String), String> {
    http_get(port, "/healthz").await
}

/// Polls /healthz until `want` accepts (code, body); every change of
/// answer is printed with the time since `since`.
async fn wait_healthz(
    operator: &mut Operator,
    what: &str,
    since: Instant,
    within: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> (u16, String, Duration) {
    let mut last: Option<(u16, String)> = None;
    loop {
        operator.assert_running();
        let seen = healthz(operator.port).await;
        let now = since.elapsed();
        if let Ok((code, body)) = &seen {
            let answer = (*code, body.trim().to_string());
            if last.as_ref() != Some(&answer) {
                println!("{now:>8.2?}: /healthz {} {:?}", answer.0, answer.1);
                last = Some(answer);
            }
            if want(*code, body) {
                return (*code, body.trim().to_string(), now);
            }
        }
        if now > within {
            panic!("/healthz did not turn {what} within {within:?}; last answer: {seen:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_200_only_once_the_caches_synced() {
    let t = TestNs::new("ops-readyz").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    // The operator reaches the API server only through a proxy that holds
    // every connection until the test opens it.
    let proxy = FaultProxy::start(api_server_address().await).await;
    let mut operator = start_json_operator(
        &t,
        &op,
        Some(STUCK_AFTER_LONG),
        Some(&proxy.url()),
        None,
        &[],
    );
    let started = Instant::now();
    let port = operator.port;

    wait_until(
        "/healthz to answer 200",
        TIMEOUT,
        async || match status_of(port, "/healthz").await {
            Ok(200) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    // Alive but not ready. /healthz stays 200 only while the failing
    // watches are younger than --stuck-after (see
    // `healthz_fails_while_the_api_server_refuses_connections_and_recovers`).
    assert_for(
        "/healthz 200 and /readyz 503 while the API server is held back",
        Duration::from_secs(4),
        async || {
            let health = status_of(port, "/healthz").await?;
            let ready = status_of(port, "/readyz").await?;
            if health != 200 || ready != 503 {
                return Err(format!("/healthz {health}, /readyz {ready}"));
            }
            let synced: Vec<String> = lines_of(&operator.json_log(), "caches synced")
                .map(ToString::to_string)
                .collect();
            if !synced.is_empty() {
                return Err(format!("the operator logged {synced:?}"));
            }
            Ok(())
        },
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(STUCK_AFTER_LONG),
        "the held-back window outlasted --stuck-after {STUCK_AFTER_LONG}"
    );
    operator.assert_running();

    let opened = Instant::now();
    proxy.open();
    wait_until(
        "/readyz 200 once the API server answers",
        TIMEOUT,
        async || match status_of(port, "/readyz").await {
            Ok(200) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    println!(
        "/readyz turned 200 {:?} after the API server became reachable",
        opened.elapsed()
    );
    wait_logged(&operator, "caches synced", &[], Duration::from_secs(5)).await;
    assert_eq!(status_of(port, "/healthz").await, Ok(200));

    // And it does its job through the proxy.
    let src = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t1.as_str()]))
        .await;
    t.wait_copy(CM, &t1, &src, &op, "r").await;
    assert_eq!(status_of(port, "/readyz").await, Ok(200));
    operator.assert_running();
}

/// An API server that never answers: never ready; alive for the first
/// `--stuck-after` seconds, then /healthz fails and names the failing
/// watch (Kubernetes restarts the Pod); SIGTERM still exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_stays_503_while_the_api_server_is_unreachable() {
    const STUCK_AFTER: u64 = 8;
    let t = TestNs::new("ops-unreach").await;
    let op = t.ns("op").await;
    let closed = format!("https://127.0.0.1:{}", free_port());
    let mut operator = start_json_operator(&t, &op, Some(STUCK_AFTER), Some(&closed), None, &[]);
    let started = Instant::now();
    let port = operator.port;
    wait_until(
        "/healthz to answer 200",
        TIMEOUT,
        async || match status_of(port, "/healthz").await {
            Ok(200) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    // The watches fail from the start; /healthz holds out until they have
    // failed for --stuck-after (the window ends 3 s before it).
    let window = Duration::from_secs(STUCK_AFTER - 3).saturating_sub(started.elapsed());
    assert_for(
        "/healthz 200 and /readyz 503 with no API server",
        window,
        async || {
            let health = status_of(port, "/healthz").await?;
            let ready = status_of(port, "/readyz").await?;
            if health == 200 && ready == 503 {
                Ok(())
            } else {
                Err(format!("/healthz {health}, /readyz {ready}"))
            }
        },
    )
    .await;
    let (_, body, after) = wait_healthz(
        &mut operator,
        "503 naming a failing watch",
        started,
        Duration::from_secs(STUCK_AFTER + 10),
        |code, body| code == 503 && body.starts_with("stuck: a watch keeps failing"),
    )
    .await;
    println!("/healthz 503 {after:?} after the start: {body}");
    assert_eq!(
        status_of(port, "/readyz").await,
        Ok(503),
        "ready without an API server"
    );
    operator.assert_running();
    let lines = operator.json_log();
    let synced: Vec<String> = lines_of(&lines, "caches synced")
        .map(ToString::to_string)
        .collect();
    assert!(
        synced.is_empty(),
        "logged without an API server: {synced:?}"
    );
    // The failing watches are reported, each by name.
    let failed: BTreeSet<&str> = lines_of(&lines, "watch failed; retrying with backoff")
        .filter(|l| l.level == "WARN")
        .filter_map(|l| l.str("watch"))
        .collect();
    for watch in ["copyratorrules", "namespaces"] {
        assert!(
            failed.contains(watch),
            "no WARN \"watch failed\" line for the {watch} watch; failed watches logged: {failed:?}"
        );
    }
    // A shutdown before the caches synced is still clean and quick.
    send_signal(&operator, "TERM");
    let (status, took) = wait_exit(&mut operator, Duration::from_secs(10)).await;
    println!("unsynced operator exited {status} {took:?} after SIGTERM");
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        operator.logs()
    );
}

/// `--stuck-after 5` and an API server that refuses every connection (the
/// proxy closes them): /healthz stays 200 while the failure is younger than
/// 5 s (a blip must not restart the Pod), turns 503 naming the failing
/// watch well within 15 s, and 200 again once connections go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_while_the_api_server_refuses_connections_and_recovers() {
    const STUCK_AFTER: u64 = 5;
    let t = TestNs::new("ops-healthz-refuse").await;
    let op = t.ns("op").await;
    let proxy = FaultProxy::start(api_server_address().await).await;
    proxy.open();
    let mut operator =
        start_json_operator(&t, &op, Some(STUCK_AFTER), Some(&proxy.url()), None, &[]);
    operator.wait_ready().await;
    assert_eq!(
        healthz(operator.port).await,
        Ok((200, "ok\n".to_string())),
        "a synced operator is healthy"
    );

    let refused = Instant::now();
    let refused_at = Utc::now();
    proxy.refuse();
    // Positive signal: the operator saw its watches fail.
    let first = operator
        .wait_log_line(
            "a watch failure after the refusal",
            Duration::from_secs(STUCK_AFTER),
            |l| l.message == "watch failed; retrying with backoff" && l.timestamp >= refused_at,
        )
        .await;
    println!(
        "{:>8.2?}: first watch failure logged: {first}",
        refused.elapsed()
    );
    let port = operator.port;
    assert_for(
        "/healthz 200 while the failure is younger than --stuck-after",
        Duration::from_secs(STUCK_AFTER - 1).saturating_sub(refused.elapsed()),
        async || match healthz(port).await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        },
    )
    .await;
    let (_, body, after) = wait_healthz(
        &mut operator,
        "503 naming a failing watch",
        refused,
        Duration::from_secs(15),
        |code, body| code == 503 && body.starts_with("stuck: a watch keeps failing"),
    )
    .await;
    println!("/healthz 503 {after:?} after the refusal: {body}");
    assert!(
        after >= Duration::from_secs(STUCK_AFTER - 1),
        "503 after {after:?}, before the watches had failed for --stuck-after {STUCK_AFTER} s"
    );

    let reopened = Instant::now();
    proxy.open();
    let (_, _, healed) = wait_healthz(
        &mut operator,
        "200 once the API server answers again",
        reopened,
        Duration::from_secs(15),
        |code, _| code == 200,
    )
    .await;
    println!("/healthz 200 again {healed:?} after connections went through");
    assert_eq!(status_of(port, "/readyz").await, Ok(200));
    operator.assert_running();
}

/// `--stuck-after 5` and a half-dead network: connections stay open and
/// carry nothing. The operator is in the middle of a burst (6 rules, 4
/// workers, one write at a time, so rules wait in its queue) when the
/// network dies: no write or reconcile can finish, and /healthz turns 503
/// naming the pending work within 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_when_work_is_queued_and_the_network_is_half_dead() {
    const STUCK_AFTER: u64 = 5;
    const RULES: usize = 6;
    const SOURCES: usize = 4;
    let t = TestNs::new("ops-healthz-stall").await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 0..3 {
        targets.push(t.ns(&format!("t{i}")).await);
    }
    for r in 0..RULES {
        let group = format!("g{r}");
        let mut selector = t.selector();
        selector["group"] = Value::String(group.clone());
        t.create_rule(
            &op,
            &format!("r{r}"),
            rule_spec(CM, selector, &[t.glob("t")]),
        )
        .await;
        for s in 0..SOURCES {
            t.create_source(
                CM,
                &op,
                &format!("c{r}-{s}"),
                &[("group", &group)],
                &[("n", "1")],
            )
            .await;
        }
    }
    let proxy = FaultProxy::start(api_server_address().await).await;
    proxy.open();
    let mut operator = start_json_operator(
        &t,
        &op,
        Some(STUCK_AFTER),
        Some(&proxy.url()),
        None,
        &[
            "--write-concurrency",
            "1",
            "--api-qps",
            "10",
            "--api-burst",
            "1",
        ],
    );
    // Stall as soon as the burst is under way.
    let first = wait_until("the first copy", TIMEOUT, async || {
        let copies = t.list_labelled(CM, TEST_LABEL, &t.prefix).await;
        let made = copies.iter().filter(|c| c.is_copy()).count();
        if made > 0 {
            Ok(made)
        } else {
            Err("no copy yet".to_string())
        }
    })
    .await;
    let stalled = Instant::now();
    proxy.stall();
    assert_eq!(healthz(operator.port).await.map(|(c, _)| c), Ok(200));
    let (_, body, after) = wait_healthz(
        &mut operator,
        "503 naming the pending work",
        stalled,
        Duration::from_secs(30),
        |code, body| code == 503 && body.starts_with("stuck: work is pending"),
    )
    .await;
    println!(
        "{first} of {} copies made when the network died; /healthz 503 {after:?} later: {body}",
        RULES * SOURCES * 3
    );
    assert!(
        after >= Duration::from_secs(STUCK_AFTER - 1),
        "503 after {after:?}, before --stuck-after {STUCK_AFTER} s without progress"
    );
    operator.assert_running();
}

// ===========================================================================
// 3. leader election

/// A source and a rule whose copies go to `t1` and `t2`.
async fn small_scenario(t: &TestNs, op: &str, targets: [&String; 2]) -> Obj {
    let src = t.create_source(CM, op, "shared", &[], &[("v", "1")]).await;
    t.create_rule(op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    for ns in targets {
        t.wait_copy(CM, ns, &src, op, "r").await;
    }
    t.wait_rule_ready(op, "r").await;
    src
}

/// Polls until every copy of `op/shared` holds `v`, for at most `within`;
/// how long it took.
async fn wait_converged(t: &TestNs, targets: [&String; 2], v: &str, within: Duration) -> Duration {
    let start = Instant::now();
    wait_until(format!("both copies to carry v={v}"), within, async || {
        for ns in targets {
            match t.try_get(CM, ns, "shared").await? {
                Some(o) if o.data.get("v").map(String::as_str) == Some(v) => {}
                other => return Err(format!("{ns}: {:?}", other.map(|o| o.data))),
            }
        }
        Ok(())
    })
    .await;
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_a_killed_leader_is_replaced_within_the_lease() {
    let t = TestNs::new("ops-leader-kill").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let lease = format!("{}-lease", t.prefix);
    let mut ops = vec![
        start_replica(&t, &op, &lease),
        start_replica(&t, &op, &lease),
    ];
    for o in ops.iter_mut() {
        o.wait_ready().await;
    }
    let leader = wait_one_leader(&t, &ops, &op, &lease).await;
    let standby = 1 - leader;
    println!(
        "leader: process {:?}, standby: process {:?}",
        ops[leader].pid(),
        ops[standby].pid()
    );

    let src = small_scenario(&t, &op, [&t1, &t2]).await;
    t.set_data(CM, &op, "shared", &[("v", Some("2"))]).await;
    wait_converged(&t, [&t1, &t2], "2", TIMEOUT).await;

    // Only the leader wrote; the standby is warm (ready) and silent.
    let on_leader = scrape(&ops[leader]).await;
    let on_standby = scrape(&ops[standby]).await;
    let writes_leader = on_leader.sum("copyrator_api_writes_total", &[]);
    let writes_standby = on_standby.sum("copyrator_api_writes_total", &[]);
    println!("api writes: leader {writes_leader}, standby {writes_standby}");
    assert!(writes_leader >= 4.0, "leader writes: {}", on_leader.text);
    assert_eq!(
        writes_standby, 0.0,
        "the standby wrote:\n{}",
        on_standby.text
    );
    assert_eq!(on_standby.must("copyrator_leader", &[]), 0.0);
    assert_eq!(on_leader.must("copyrator_leader", &[]), 1.0);
    assert_eq!(
        status_of(ops[standby].port, "/readyz").await,
        Ok(200),
        "the standby is ready"
    );
    assert_eq!(status_of(ops[standby].port, "/healthz").await, Ok(200));
    for ns in [&t1, &t2] {
        let copy = t.must_get(CM, ns, &src.name).await;
        assert!(
            !copy.managers.is_empty() && copy.managers.iter().all(|m| m == FIELD_MANAGER),
            "{ns}/{}: managedFields managers {:?}",
            copy.name,
            copy.managed_fields
        );
    }
    // Leadership is stable while the leader lives (well past one lease).
    assert_for(
        "one stable leader",
        Duration::from_secs(LEASE_SECONDS + 2),
        async || {
            let gauges = leader_gauges(&ops).await?;
            let mut want = vec![0.0; 2];
            want[leader] = 1.0;
            if gauges == want {
                Ok(())
            } else {
                Err(format!("{gauges:?}"))
            }
        },
    )
    .await;

    // SIGKILL the leader, change the source at once.
    let killed_pid = ops[leader].pid().unwrap();
    let killed_at = Instant::now();
    ops[leader].crash();
    // The dead leader's last renewal (it renews no more).
    let (_, _, last_renewal, duration) = lease_times(&t, &op, &lease).await;
    let last_renewal = last_renewal.expect("the Lease was renewed");
    t.set_data(CM, &op, "shared", &[("v", Some("3"))]).await;
    let limit = Duration::from_secs(LEASE_SECONDS + 10);
    let mut took_over = None;
    let mut converged = None;
    while took_over.is_none() || converged.is_none() {
        if killed_at.elapsed() > limit {
            panic!(
                "after SIGKILL of the leader: takeover {took_over:?}, convergence {converged:?} within {limit:?}"
            );
        }
        if took_over.is_none()
            && try_scrape(ops[standby].port)
                .await
                .is_ok_and(|s| s.get("copyrator_leader", &[]) == Some(1.0))
        {
            took_over = Some(killed_at.elapsed());
        }
        if converged.is_none() {
            let mut all = true;
            for ns in [&t1, &t2] {
                all &= t
                    .try_get(CM, ns, "shared")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|o| o.data.get("v").map(String::as_str) == Some("3"));
            }
            if all {
                converged = Some(killed_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (took_over, converged) = (took_over.unwrap(), converged.unwrap());
    println!(
        "SIGKILL of the leader (lease {LEASE_SECONDS} s): standby leads after {took_over:?}, the changed source is converged after {converged:?}"
    );
    // The standby waited for the Lease to expire: it never takes a live one
    // (the API server's own timestamps, not the test's clock).
    let (_, acquired, _, _) = lease_times(&t, &op, &lease).await;
    let expired = last_renewal + chrono::Duration::seconds(duration);
    assert!(
        acquired.is_some_and(|a| a >= expired),
        "the standby acquired the Lease at {acquired:?}, before the dead leader's (renewed at \
         {last_renewal}, for {duration} s) expired at {expired}"
    );
    let holder = lease_holder(&t, &op, &lease).await.unwrap();
    let survivor = ops[standby].pid().unwrap();
    assert!(
        holder
            .as_deref()
            .is_some_and(|h| h.ends_with(&format!("-{survivor}"))),
        "Lease holder {holder:?}, the survivor is {survivor}, the dead leader {killed_pid}"
    );
    let writes = scrape(&ops[standby])
        .await
        .sum("copyrator_api_writes_total", &[]);
    assert!(writes >= 2.0, "the new leader's writes: {writes}");
    // The new leader counts the copies it now manages.
    wait_until(
        "the new leader's copies_managed to be 2",
        TIMEOUT,
        async || {
            let s = try_scrape(ops[standby].port).await?;
            match s.get("copyrator_copies_managed", &[]) {
                Some(2.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    ops[standby].assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_lease_over_within_seconds() {
    let t = TestNs::new("ops-leader-term").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let lease = format!("{}-lease", t.prefix);
    let mut ops = vec![
        start_replica(&t, &op, &lease),
        start_replica(&t, &op, &lease),
    ];
    for o in ops.iter_mut() {
        o.wait_ready().await;
    }
    let leader = wait_one_leader(&t, &ops, &op, &lease).await;
    let standby = 1 - leader;
    small_scenario(&t, &op, [&t1, &t2]).await;

    // A renewal of the leader's: the Lease could expire no sooner than this plus its duration.
    let (_, _, renewed, duration) = lease_times(&t, &op, &lease).await;
    let renewed = renewed.expect("the Lease was renewed");
    let signalled = Instant::now();
    send_signal(&ops[leader], "TERM");
    let mut exited: Option<(ExitStatus, Duration)> = None;
    let mut took_over: Option<Duration> = None;
    while exited.is_none() || took_over.is_none() {
        let now = signalled.elapsed();
        if now > Duration::from_secs(20) {
            panic!("after SIGTERM of the leader: exit {exited:?}, takeover {took_over:?}");
        }
        if exited.is_none()
            && let Some(status) = ops[leader].try_exit()
        {
            exited = Some((status, signalled.elapsed()));
        }
        if took_over.is_none()
            && try_scrape(ops[standby].port)
                .await
                .is_ok_and(|s| s.get("copyrator_leader", &[]) == Some(1.0))
        {
            took_over = Some(signalled.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ((status, exit_after), took_over) = (exited.unwrap(), took_over.unwrap());
    let after_exit = took_over.saturating_sub(exit_after);
    println!(
        "SIGTERM of the leader: it exited ({status}) after {exit_after:?}; the standby led {took_over:?} after the signal ({after_exit:?} after the exit)"
    );
    assert!(
        status.success(),
        "the leader's exit status {status}; log:\n{}",
        ops[leader].logs()
    );
    // Handed over, not left to expire: the standby acquired the Lease
    // before the leader's last renewal could have run out.
    let (_, acquired, _, _) = lease_times(&t, &op, &lease).await;
    let would_expire = renewed + chrono::Duration::seconds(duration);
    assert!(
        acquired.is_some_and(|a| a < would_expire),
        "the standby acquired the Lease at {acquired:?}, not before the leader's renewal at \
         {renewed} would have expired ({would_expire}): it was not handed over"
    );
    let lease_ref = format!("{op}/{lease}");
    let released: Vec<String> = ops[leader]
        .json_log()
        .iter()
        .filter(|l| l.is("released the Lease", &[("lease", lease_ref.as_str())]))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        released.len(),
        1,
        "the leader logs releasing its Lease once: {released:?}; log:\n{}",
        tail(&ops[leader].logs(), 4000)
    );
    let holder = lease_holder(&t, &op, &lease).await.unwrap();
    let survivor = ops[standby].pid().unwrap();
    assert!(
        holder
            .as_deref()
            .is_some_and(|h| h.ends_with(&format!("-{survivor}"))),
        "Lease holder {holder:?}, the survivor is {survivor}"
    );
    // The new leader writes.
    t.set_data(CM, &op, "shared", &[("v", Some("2"))]).await;
    let took = wait_converged(&t, [&t1, &t2], "2", Duration::from_secs(10)).await;
    println!("the new leader converged a change in {took:?}");
    ops[standby].assert_running();
}

// ===========================================================================
// 4. graceful shutdown

/// The JSON log tells the shutdown, with its signal, then "stopped".
fn assert_shutdown_logged(operator: &Operator, signal: &str) {
    let lines = operator.json_log();
    let signal = format!("SIG{signal}");
    let shutting: Vec<&LogLine> = lines_of(&lines, "shutting down").collect();
    assert!(
        shutting.len() == 1 && shutting[0].str("signal") == Some(signal.as_str()),
        "one \"shutting down\" line naming {signal}: {shutting:?}"
    );
    let stopped: Vec<&LogLine> = lines_of(&lines, "stopped").collect();
    assert!(
        stopped.len() == 1 && stopped[0].timestamp >= shutting[0].timestamp,
        "one \"stopped\" line after the shutdown began: {stopped:?}"
    );
    assert_start_and_shutdown_order(&lines);
}

/// The operator's life in the order its log says it, read from the lines
/// in the order they were written: started, caches synced, then on
/// shutdown writes stop first, in-flight work finishes next, every other
/// task stops last, then "stopped".
fn assert_start_and_shutdown_order(lines: &[LogLine]) {
    let said: Vec<String> = lines
        .iter()
        .filter_map(|line| match line.message.as_str() {
            "shutdown step" => Some(format!(
                "step {}: {}",
                line.u64("step").unwrap_or(0),
                line.str("done").unwrap_or_default()
            )),
            "copyrator started" | "caches synced" | "shutting down" | "stopped" => {
                Some(line.message.clone())
            }
            _ => None,
        })
        .collect();
    let expected = [
        "copyrator started",
        "caches synced",
        "shutting down",
        "step 1: writes stopped",
        "step 2: in-flight work finished",
        "step 3: every other task stopped",
        "stopped",
    ];
    assert_eq!(
        said, expected,
        "the operator's start and shutdown, in log order"
    );
}

async fn shutdown_when_idle(test: &str, signal: &str) {
    let t = TestNs::new(test).await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let src = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    let mut operator = Operator::start(&t, &op, &["--log-format", "json"]);
    operator.wait_ready().await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t1.as_str()]))
        .await;
    let copy = t.wait_copy(CM, &t1, &src, &op, "r").await;
    t.wait_rule_ready(&op, "r").await;
    let idle = scrape(&operator).await;
    assert_eq!(idle.must("copyrator_queue_depth", &[]), 0.0);

    send_signal(&operator, signal);
    let (status, took) = wait_exit(&mut operator, Duration::from_secs(10)).await;
    println!("idle operator: SIG{signal} → exit {status} after {took:?}");
    assert!(
        status.success(),
        "SIG{signal}: exit status {status}; log:\n{}",
        operator.logs()
    );
    assert_shutdown_logged(&operator, signal);
    // A shutdown is not a rule deletion: the copy and the finalizer stay.
    t.assert_unchanged(
        CM,
        &t1,
        "cfg",
        &copy.resource_version,
        "the operator stopped",
    )
    .await;
    let rule = t.get_rule(&op, "r").await;
    assert!(
        rule["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER)),
        "the rule keeps its finalizer: {}",
        short_status(&rule)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_when_idle_exits_0_within_10s() {
    shutdown_when_idle("ops-idle-term", "TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_when_idle_exits_0_within_10s() {
    shutdown_when_idle("ops-idle-int", "INT").await;
}

/// `sources` ConfigMaps into `namespaces` target namespaces; the signal
/// goes as soon as the first copy exists. Then a new operator converges.
async fn shutdown_during_burst(test: &str, signal: &str, extra: &[&str]) {
    const SOURCES: usize = 20;
    const NAMESPACES: usize = 10;
    const COPIES: usize = SOURCES * NAMESPACES;
    let t = TestNs::new(test).await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 0..NAMESPACES {
        targets.push(t.ns(&format!("t{i:02}")).await);
    }
    let mut sources = Vec::new();
    for i in 0..SOURCES {
        sources.push(
            t.create_source(CM, &op, &format!("c{i:02}"), &[], &[("n", &i.to_string())])
                .await,
        );
    }
    // The operator acts as a user of its own: the audit log tells its
    // writes from everyone else's.
    let user = operator_user(&t);
    let audit = Audit::start();
    let started_at = Utc::now();
    let mut operator = start_json_operator(&t, &op, None, None, Some(&user), extra);
    operator.wait_ready().await;
    t.create_rule(&op, "burst", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let uid = t.rule_uid(&op, "burst").await;
    // Wait for the first copy: the burst is under way.
    wait_until("the first copy of the burst", TIMEOUT, async || {
        if t.list_labelled(CM, LABEL_RULE_UID, &uid).await.is_empty() {
            Err("no copy yet".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    let signal_at = Utc::now();
    send_signal(&operator, signal);
    let signalled = Instant::now();
    let (status, took) = wait_exit(&mut operator, Duration::from_secs(10)).await;
    let exit_at = Utc::now();
    let at_exit = t.list_labelled(CM, LABEL_RULE_UID, &uid).await.len();
    let lines = operator.json_log();
    let abandoned = lines_of(
        &lines,
        "in-flight work abandoned after the shutdown deadline",
    )
    .count();
    println!(
        "burst {extra:?}: SIG{signal}; exit {status} after {took:?} ({:?} since the signal); {at_exit} of {COPIES} copies at exit; abandoned lines: {abandoned}",
        signalled.elapsed(),
    );
    assert!(
        status.success(),
        "SIG{signal} during a burst: exit {status}; log:\n{}",
        tail(&operator.logs(), 8000)
    );
    assert_shutdown_logged(&operator, signal);

    // A successor converges: every copy exactly once, each one right.
    let mut successor = Operator::start(&t, &op, &[]);
    successor.wait_ready().await;
    let want: BTreeSet<(String, String)> = targets
        .iter()
        .flat_map(|ns| sources.iter().map(move |s| (ns.clone(), s.name.clone())))
        .collect();
    let copies = wait_until(
        format!("{} copies", want.len()),
        Duration::from_secs(60),
        async || {
            let copies = copies_of(&t, CM, &uid).await;
            let have: BTreeSet<(String, String)> = copies.keys().cloned().collect();
            if have == want {
                Ok(copies)
            } else {
                Err(format!(
                    "{} copies; missing {}, unexpected {:?}",
                    have.len(),
                    want.difference(&have).count(),
                    have.difference(&want).take(5).collect::<Vec<_>>()
                ))
            }
        },
    )
    .await;
    for ((ns, name), copy) in &copies {
        let source = sources.iter().find(|s| &s.name == name).unwrap();
        check_copy(copy, source, &op, "burst", &uid).unwrap_or_else(|e| panic!("{ns}/{name}: {e}"));
    }
    t.wait_rule(&op, "burst", "Ready with every copy counted", |r| {
        is_ready(r)?;
        if status_u64(r, "copies") == Some((SOURCES * NAMESPACES) as u64) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
    // Nothing more happens: no duplicate or late write.
    let settled: BTreeMap<(String, String), String> = copies
        .iter()
        .map(|(k, o)| (k.clone(), o.resource_version.clone()))
        .collect();
    assert_for("the copies to stay as they are", QUIET, async || {
        let now: BTreeMap<(String, String), String> = copies_of(&t, CM, &uid)
            .await
            .into_iter()
            .map(|(k, o)| (k, o.resource_version))
            .collect();
        if now == settled {
            Ok(())
        } else {
            Err(format!("{} copies, some rewritten or gone", now.len()))
        }
    })
    .await;
    // The signal came in the middle of the burst: the operator had made
    // some copies, not all, and was making them in the second before it.
    audit.settle(&t.client, exit_at).await;
    let created = |from, to| -> Vec<AuditEvent> {
        audit
            .matching(
                &Query::user(&user)
                    .verbs(&["create"])
                    .resource("configmaps")
                    .code(201)
                    .between(from, to),
            )
            .into_iter()
            .filter(|e| e.namespace.as_ref().is_some_and(|ns| targets.contains(ns)))
            .collect()
    };
    let before = created(started_at, signal_at).len();
    let last_second = created(signal_at - chrono::Duration::seconds(1), signal_at).len();
    let after = created(signal_at, exit_at).len();
    println!(
        "copies created by the operator: {before} before the signal ({last_second} in the second before it), {after} after it"
    );
    assert!(
        (1..COPIES).contains(&before),
        "the signal did not come during the burst: {before} of {COPIES} copies were created before it"
    );
    assert!(
        last_second > 0,
        "no copy was being created in the second before the signal ({before} before it)"
    );
    successor.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_burst_exits_0_within_10s_and_a_successor_converges() {
    shutdown_during_burst("ops-burst-term", "TERM", &[]).await;
}

/// Throttled to 50 requests/s, so the 200 writes take seconds and the
/// signal surely lands in the middle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_during_a_throttled_burst_exits_0_within_10s_and_a_successor_converges() {
    shutdown_during_burst(
        "ops-burst-int",
        "INT",
        &["--api-qps", "50", "--api-burst", "10"],
    )
    .await;
}

// ===========================================================================
// 5. secret values stay secret

/// Copy, rotate, edit a copy, a conflict, delete: then look for the values
/// in the log, in every event of the test's namespaces and in the status.
async fn secret_values_stay_out(test: &str, extra: &[&str]) {
    let t = TestNs::new(test).await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let t3 = t.ns("t3").await;
    let marker = format!("s3cr3t-{}", random5());
    let v1 = format!("{marker}-first");
    let v2 = format!("{marker}-rotated");
    let edited = format!("{marker}-edited");
    let foreign_value = format!("{marker}-foreign");
    let values = [&v1, &v2, &edited, &foreign_value];

    // A foreign Secret holds the name in t2.
    t.create_plain(SECRET, &t2, "cred", &[], &[("password", &foreign_value)])
        .await;
    let mut operator = Operator::start(&t, &op, extra);
    operator.wait_ready().await;
    let src = t
        .create_source(SECRET, &op, "cred", &[], &[("password", &v1)])
        .await;
    t.create_rule(
        &op,
        "secrets",
        rule_spec(SECRET, t.selector(), &[t.glob("t")]),
    )
    .await;
    for ns in [&t1, &t3] {
        t.wait_copy(SECRET, ns, &src, &op, "secrets").await;
    }
    let mut statuses = vec![
        t.wait_rule(&op, "secrets", "the conflict in t2 reported", |r| {
            is_ready(r)?;
            (status_u64(r, "conflictCount") == Some(1))
                .then_some(())
                .ok_or_else(|| short_status(r))
        })
        .await,
    ];
    // Rotate the value.
    let src = t
        .set_data(SECRET, &op, "cred", &[("password", Some(&v2))])
        .await;
    for ns in [&t1, &t3] {
        t.wait_copy(SECRET, ns, &src, &op, "secrets").await;
    }
    // Someone edits a copy: it is put back.
    t.set_data(SECRET, &t1, "cred", &[("password", Some(&edited))])
        .await;
    t.wait_copy(SECRET, &t1, &src, &op, "secrets").await;
    statuses.push(t.get_rule(&op, "secrets").await);
    // The source goes: its copies are pruned, the foreign one stays.
    t.delete(SECRET, &op, "cred").await;
    for ns in [&t1, &t3] {
        t.wait_gone(SECRET, ns, "cred", "its source was deleted")
            .await;
    }
    statuses.push(
        t.wait_rule(&op, "secrets", "no sources", |r| {
            (status_u64(r, "sources") == Some(0))
                .then_some(())
                .ok_or_else(|| short_status(r))
        })
        .await,
    );
    let foreign = t.must_get(SECRET, &t2, "cred").await;
    assert_eq!(foreign.data.get("password"), Some(&foreign_value));
    t.delete_rule(&op, "secrets").await;
    t.wait_rule_gone(&op, "secrets", "its finalizer ran").await;
    operator.stop();

    let needles: Vec<String> = values
        .iter()
        .flat_map(|v| secret_forms(v))
        .chain(secret_forms(&marker))
        .collect();
    let find = |hay: &str| -> Vec<String> {
        needles
            .iter()
            .filter(|n| hay.contains(n.as_str()))
            .cloned()
            .collect()
    };

    let logs = operator.logs();
    println!(
        "{test} {extra:?}: {} log lines, {} bytes",
        logs.lines().count(),
        logs.len()
    );
    // The log is not empty of what happened: per-copy lines (debug) name
    // the writes and the conflict, so the values had a chance to leak.
    let lines = if extra.contains(&"json") {
        operator.json_log()
    } else {
        operator.text_log()
    };
    for ns in [&t1, &t3] {
        assert!(
            lines.iter().any(|l| l.is(
                "wrote copy",
                &[("namespace", ns.as_str()), ("name", "cred")]
            )),
            "no \"wrote copy\" line for {ns}/cred:\n{}",
            tail(&logs, 4000)
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.is("conflict", &[("namespace", t2.as_str()), ("name", "cred")])),
        "no \"conflict\" line for {t2}/cred:\n{}",
        tail(&logs, 4000)
    );
    let leaked = find(&logs);
    if !leaked.is_empty() {
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| leaked.iter().any(|n| l.contains(n.as_str())))
            .take(5)
            .map(|l| tail(l, 600))
            .collect();
        panic!(
            "secret values {leaked:?} in the operator log ({extra:?}), e.g.:\n{}",
            lines.join("\n")
        );
    }

    let events = events_in(&t, &[&op, &t1, &t2, &t3]).await;
    assert!(
        events.iter().any(|e| e["reason"] == "ConflictSkipped"),
        "a ConflictSkipped event: {events:?}"
    );
    for event in &events {
        let text = event.to_string();
        let leaked = find(&text);
        assert!(
            leaked.is_empty(),
            "secret values {leaked:?} in an event: {text}"
        );
    }
    for status in &statuses {
        let text = status.to_string();
        let leaked = find(&text);
        assert!(
            leaked.is_empty(),
            "secret values {leaked:?} in the rule: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_values_never_reach_debug_logs_events_or_status() {
    secret_values_stay_out("ops-secret-debug", &["--log-level", "debug"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_values_never_reach_trace_json_logs_events_or_status() {
    secret_values_stay_out(
        "ops-secret-trace",
        &["--log-format", "json", "--log-level", "trace"],
    )
    .await;
}

// ===========================================================================
// 6. JSON logs

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_json_lines_and_writes_name_rule_namespace_and_name() {
    let t = TestNs::new("ops-json").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let t3 = t.ns("t3").await;
    t.create_plain(CM, &t3, "cfg", &[], &[("k", "foreign")])
        .await;
    let mut operator = Operator::start(&t, &op, &["--log-format", "json", "--log-level", "debug"]);
    operator.wait_ready().await;
    let src = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    t.create_rule(&op, "cfgs", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &src, &op, "cfgs").await;
    }
    let src = t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &src, &op, "cfgs").await;
    }
    t.delete(CM, &op, "cfg").await;
    for ns in [&t1, &t2] {
        t.wait_gone(CM, ns, "cfg", "its source was deleted").await;
    }
    let status = operator.stop();
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}");

    let logs = operator.logs();
    let mut lines = Vec::new();
    for (i, line) in logs.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line {} is not JSON ({e}): {line}", i + 1));
        assert!(
            v.is_object(),
            "log line {} is not a JSON object: {line}",
            i + 1
        );
        for field in ["timestamp", "level"] {
            assert!(
                v.get(field).is_some(),
                "log line {} has no {field}: {line}",
                i + 1
            );
        }
        lines.push(v);
    }
    let message = |v: &Value| {
        v.get("message")
            .or_else(|| v.pointer("/fields/message"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let field = |v: &Value, f: &str| {
        v.get(f)
            .or_else(|| v.pointer(&format!("/fields/{f}")))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let rule = format!("{op}/cfgs");
    let writes: Vec<&Value> = lines
        .iter()
        .filter(|v| ["wrote copy", "write failed", "conflict"].contains(&message(v).as_str()))
        .collect();
    for w in &writes {
        for f in ["rule", "namespace", "name"] {
            assert!(
                field(w, f).is_some_and(|s| !s.is_empty()),
                "write line without {f}: {w}"
            );
        }
    }
    let mut seen = BTreeSet::new();
    for w in &writes {
        if message(w) == "wrote copy" {
            assert_eq!(field(w, "rule").as_deref(), Some(rule.as_str()), "{w}");
            assert_eq!(field(w, "name").as_deref(), Some("cfg"), "{w}");
            assert_eq!(
                field(w, "source").unwrap_or_default(),
                format!("{op}/cfg"),
                "{w}"
            );
            seen.insert((
                field(w, "action").unwrap_or_default(),
                field(w, "namespace").unwrap(),
            ));
        }
    }
    for ns in [&t1, &t2] {
        for action in ["create", "update", "delete"] {
            assert!(
                seen.contains(&(action.to_string(), ns.to_string())),
                "no `wrote copy` line for {action} in {ns}; seen {seen:?}"
            );
        }
    }
    assert!(
        writes.iter().any(|w| message(w) == "conflict"
            && field(w, "namespace").as_deref() == Some(t3.as_str())
            && field(w, "rule").as_deref() == Some(rule.as_str())),
        "a conflict line names t3 and the rule: {writes:?}"
    );
    println!(
        "{} JSON log lines, {} write lines",
        lines.len(),
        writes.len()
    );
}

// ===========================================================================
// 7. broken watches

/// The design's last row: when the operator's connections to the API server
/// break (watches included) and the cluster changes meanwhile, it keeps
/// running and trying, and converges from the cluster's state once they
/// come back: no copy lost or duplicated. (That nothing of it reaches the
/// API server while the proxy cuts it off is the proxy's doing, not the
/// operator's: it is not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_watches_converge_when_the_api_server_is_back() {
    let t = TestNs::new("ops-watch-break").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let a = t.create_source(CM, &op, "a", &[], &[("v", "1")]).await;
    let proxy = FaultProxy::start(api_server_address().await).await;
    proxy.open();
    let user = operator_user(&t);
    let audit = Audit::start();
    let mut operator = start_json_operator(&t, &op, None, Some(&proxy.url()), Some(&user), &[]);
    t.wait_copy(CM, &t1, &a, &op, "r").await;

    proxy.cut();
    let cut_at = Utc::now();
    let cut = Instant::now();
    // While the operator is cut off: a source changes, a source appears,
    // a copy is deleted, and a namespace appears.
    let a = t.set_data(CM, &op, "a", &[("v", Some("2"))]).await;
    let b = t.create_source(CM, &op, "b", &[], &[("v", "1")]).await;
    t.delete(CM, &t1, "a").await;
    let t2 = t.ns("t2").await;
    // The positive signal that it is cut off: it tries to reconnect.
    wait_until(
        "the operator to try to reconnect through the proxy",
        TIMEOUT,
        async || match proxy.attempts_while_down() {
            0 => Err("no attempt yet".to_string()),
            _ => Ok(()),
        },
    )
    .await;
    let watch_failures = operator
        .json_log()
        .iter()
        .filter(|l| l.message == "watch failed; retrying with backoff" && l.timestamp >= cut_at)
        .count();
    println!(
        "cut off for {:?}: {} connections attempted, {watch_failures} watch failures logged",
        cut.elapsed(),
        proxy.attempts_while_down()
    );
    operator.assert_running();
    let reopened_at = Utc::now();

    proxy.open();
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &a, &op, "r").await;
        t.wait_copy(CM, ns, &b, &op, "r").await;
    }
    let uid = t.rule_uid(&op, "r").await;
    let copies = t.list_labelled(CM, LABEL_RULE_UID, &uid).await;
    assert_eq!(copies.len(), 4, "copies: {copies:?}");
    operator.assert_running();

    // The audit log: what the operator wrote once it was back.
    let end = Utc::now();
    audit.settle(&t.client, end).await;
    let mine = Query::user(&user);
    let writes_after = audit.by_verb(&mine.verbs(WRITE_VERBS).between(reopened_at, end));
    println!("the operator's writes after the reconnection: {writes_after:?}");
    assert!(
        writes_after.get("create").is_some_and(|n| *n >= 3),
        "the audit log shows the operator's copies after the reconnection: {writes_after:?}"
    );
}
