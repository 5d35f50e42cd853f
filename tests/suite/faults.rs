//! Faults (design.md, "What happens when": the operator restarts, its watch
//! breaks, the API server or etcd restarts, a connection hangs): what the
//! operator does when real parts fail under it, measured.
//!
//! Every test fans one rule out (3 ConfigMap sources into 30 namespaces),
//! breaks something in the middle, and measures how long after the fault
//! every copy is right again. It prints its figures (seconds to converge,
//! copies lost or wrong, the operator's requests from the audit log) before
//! it checks its bounds, and fails when a copy is lost or wrong after
//! convergence or a bound is exceeded.
//!
//! * the operator SIGKILLed in the middle of a fan-out, then restarted;
//! * the API server down for a minute, then changes as soon as it is back;
//! * etcd killed and restarted under a running API server;
//! * the operator cut off longer than the API server's watch history, with
//!   etcd compacted: its watches resume from a resourceVersion that is gone
//!   (410) and it lists again;
//! * a half-dead network (a proxy that keeps connections open but forwards
//!   nothing) for 30 s;
//! * a target namespace deleted in the middle of a fan-out.
//!
//! These tests stop the API server and etcd, so they run on a control plane
//! of their own (`COPYRATOR_FAULT_STATE`, see `common::fault`), one at a
//! time (`--test-threads=1`, and `common::fault::SERIAL`). They are `#[ignore]`d, so
//! the main `cargo test` run reports them as ignored, and `hack/test` runs
//! this binary with `--ignored` on its own control plane beside it; run
//! without that variable, a test fails saying so. The
//! operator runs as a ServiceAccount of its own, so that the audit log
//! (`COPYRATOR_FAULT_AUDIT_LOG`) names its requests.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::audit::{Query, WRITE_VERBS};
use crate::common::fault::{
    Component, FaultPlane, OperatorIdentity, Requests, RestartOnDrop, kubeconfig_with_server, secs,
};
use crate::common::faults::api_server_address_of;
use crate::common::proxy::Proxy;
use crate::common::*;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;

const CM: Kind = Kind::ConfigMap;
const TARGETS: usize = 30;
const SOURCES: [&str; 3] = ["a", "b", "c"];
const RULE: &str = "r";

/// How long a test waits for convergence before it reports what is wrong.
/// How fast it converges is printed, not asserted (the machines are
/// noisy): the watches' retry schedule (at most 3 s apart) and the request
/// deadlines (20 s) are what keep it short, and their unit tests pin them.
const CONVERGE_WAIT: Duration = Duration::from_secs(90);
/// The API server down (test b).
const API_SERVER_DOWN: Duration = Duration::from_secs(60);
/// etcd down (test c).
const ETCD_DOWN: Duration = Duration::from_secs(10);
/// The API server's watch cache keeps at least 75 s of events
/// (`DefaultEventFreshDuration`); a client cut off longer than that, while
/// the cluster keeps writing, cannot resume its watch there.
const WATCH_HISTORY: Duration = Duration::from_secs(80);
/// The half-dead network (test e).
const STALL: Duration = Duration::from_secs(30);
/// Connections the operator may open while the network is half-dead: its
/// five watches and its writes, each retried after a request deadline
/// (20 s) or with a backoff (watches: up to 3 s; writes: 1 s doubling).
const MAX_CONNECTIONS_STALLED: usize = 40;
/// Connections the operator may try while the API server is down a
/// minute: its five watches retry every 3 s or sooner (about 100 tries;
/// 116 seen), its writes and status back off from 1 s.
const MAX_CONNECTIONS_DOWN: usize = 200;
/// Requests the operator may send once a fault heals, beyond the writes
/// the changes need: lists and watches again, the rule's status, Events.
/// A retry storm sends many times the writes.
const MAX_EXTRA_REQUESTS: usize = 30;
/// How long the deleted namespace stays terminating (test f).
const NAMESPACE_HELD: Duration = Duration::from_secs(20);
/// Requests the operator may send to a namespace after it was deleted:
/// the writes already on their way, each failing once.
const MAX_REQUESTS_TO_DELETED_NS: usize = 10;
/// Error answers the operator may get while a target namespace goes away.
const MAX_ERRORS_NS_DELETED: usize = 15;

/// What every test holds: the control plane, the turn, and a guard that
/// starts etcd and the API server again if the test fails while they are
/// down (fields drop in order: the guard before the turn is released).
struct Fault {
    plane: FaultPlane,
    _restart: RestartOnDrop,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// Whether timing targets hold: only under a benchmark command
/// (`COPYRATOR_BENCH_TARGETS=1`), never in a test run.
fn bench_targets() -> bool {
    std::env::var("COPYRATOR_BENCH_TARGETS").is_ok_and(|v| v == "1")
}

async fn begin(test: &str) -> Fault {
    let Some(plane) = FaultPlane::from_env() else {
        panic!(
            "faults::{test}: COPYRATOR_FAULT_STATE is unset. This test kills the API server and \
             etcd, so it runs only on a control plane of its own: hack/test runs \
             `cargo test --test suite -- --ignored` on one"
        );
    };
    let turn = crate::common::fault::SERIAL.lock().await;
    Fault {
        _restart: plane.restart_on_drop(),
        plane,
        _turn: turn,
    }
}

// ===========================================================================
// one rule fanned out

/// The copies of one rule as they are in the cluster.
#[derive(Debug, Default)]
struct Tally {
    /// Copies present and right.
    right: usize,
    /// Expected copies that do not exist.
    missing: Vec<String>,
    /// Copies present but not right (what is wrong).
    wrong: Vec<String>,
    /// Copies of the rule where none belongs.
    extra: Vec<String>,
    /// The uid of every copy present, by (namespace, name).
    uids: BTreeMap<(String, String), String>,
}

impl Tally {
    fn present(&self) -> usize {
        self.right + self.wrong.len()
    }

    fn ok(&self) -> bool {
        self.missing.is_empty() && self.wrong.is_empty() && self.extra.is_empty()
    }

    fn summary(&self) -> String {
        format!(
            "{} right, {} missing, {} wrong, {} extra; first missing {:?}, first wrong {:?}, first extra {:?}",
            self.right,
            self.missing.len(),
            self.wrong.len(),
            self.extra.len(),
            self.missing.first(),
            self.wrong.first(),
            self.extra.first()
        )
    }
}

/// A rule `op/r` copying the sources a, b and c (in `op`) into 30 target
/// namespaces, and the operator's identity.
struct FanOut {
    t: TestNs,
    op: String,
    targets: Vec<String>,
    /// Namespaces deleted by the test: copies there are not counted.
    deleted: Vec<String>,
    /// The sources as last written.
    sources: BTreeMap<String, Obj>,
    rule_uid: String,
    id: OperatorIdentity,
}

impl FanOut {
    /// Namespaces, identity, sources and rule; no operator yet.
    async fn new(test: &str) -> FanOut {
        let t = TestNs::new(test).await;
        let op = t.ns("op").await;
        let id = OperatorIdentity::new(&t, &op, "copyrator").await;
        let suffixes: Vec<String> = (0..TARGETS).map(|i| format!("t{i:02}")).collect();
        let targets: Vec<String> =
            futures::future::join_all(suffixes.iter().map(|s| t.ns(s))).await;
        let mut sources = BTreeMap::new();
        for name in SOURCES {
            let o = t
                .create_source(CM, &op, name, &[], &[("v", "1"), ("name", name)])
                .await;
            sources.insert(name.to_string(), o);
        }
        t.create_rule(&op, RULE, rule_spec(CM, t.selector(), &[t.glob("t")]))
            .await;
        let rule_uid = t.rule_uid(&op, RULE).await;
        FanOut {
            t,
            op,
            targets,
            deleted: Vec::new(),
            sources,
            rule_uid,
            id,
        }
    }

    fn expected(&self) -> usize {
        self.targets.len() * self.sources.len()
    }

    /// The operator as the test's ServiceAccount, through `kubeconfig`.
    fn operator(&self, kubeconfig: &str, extra: &[&str]) -> Operator {
        let mut args: Vec<String> = ["run", "--namespace", &self.op, "--log-level", "info"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        Operator::start_with_env(&self.t, args, &[("KUBECONFIG", kubeconfig)])
    }

    /// The operator as the test's ServiceAccount, slowed down (10 writes a
    /// second, one at a time), once a third of the copies are written; and
    /// the copies then.
    async fn slow_operator_a_third_in(&self) -> (Operator, Tally) {
        let slow = [
            "--api-qps",
            "10",
            "--api-burst",
            "1",
            "--write-concurrency",
            "1",
        ];
        let operator = self.operator(self.id.kubeconfig_str(), &slow);
        let third = self.expected() / 3;
        let tally = wait_until(
            format!("{third} of {} copies to be written", self.expected()),
            TIMEOUT,
            async || match self.tally().await? {
                t if t.present() >= third => Ok(t),
                t => Err(t.summary()),
            },
        )
        .await;
        (operator, tally)
    }

    /// Every copy of the rule, in one list request.
    async fn tally(&self) -> Result<Tally, String> {
        let lp = ListParams::default().labels(&format!("{LABEL_RULE_UID}={}", self.rule_uid));
        let copies = Api::<ConfigMap>::all(self.t.client.clone())
            .list(&lp)
            .await
            .map_err(|e| err_msg(&e))?
            .items;
        let mut tally = Tally::default();
        let mut seen = BTreeSet::new();
        for copy in copies.into_iter().map(Obj::from_configmap) {
            let key = (copy.namespace.clone(), copy.name.clone());
            if self.deleted.contains(&copy.namespace) {
                continue;
            }
            tally.uids.insert(key.clone(), copy.uid.clone());
            match self.sources.get(&copy.name) {
                Some(source) if self.targets.contains(&copy.namespace) => {
                    seen.insert(key);
                    match check_copy(&copy, source, &self.op, RULE, &self.rule_uid) {
                        Ok(()) => tally.right += 1,
                        Err(e) => tally.wrong.push(e),
                    }
                }
                _ => tally
                    .extra
                    .push(format!("{}/{}", copy.namespace, copy.name)),
            }
        }
        for ns in &self.targets {
            for name in self.sources.keys() {
                if !seen.contains(&(ns.clone(), name.clone())) {
                    tally.missing.push(format!("{ns}/{name}"));
                }
            }
        }
        Ok(tally)
    }

    /// Polls until every copy is right: how long after `from` that was, or
    /// what was still wrong after `within`.
    async fn converge(&self, from: Instant, within: Duration) -> Result<Duration, String> {
        let mut last = String::from("nothing read yet");
        while from.elapsed() < within {
            match self.tally().await {
                Ok(t) if t.ok() => return Ok(from.elapsed()),
                Ok(t) => last = t.summary(),
                Err(e) => last = e,
            }
            tokio::time::sleep(POLL).await;
        }
        Err(format!("not within {within:?}: {last}"))
    }

    /// Waits until every copy is right (the starting point of a test).
    async fn wait_converged(&self, what: &str) {
        if let Err(e) = self.converge(Instant::now(), CONVERGE_WAIT).await {
            panic!("{what}: the fan-out did not converge: {e}");
        }
        self.t.wait_rule_ready(&self.op, RULE).await;
    }

    /// Sets `v` of a source, retried while the API server cannot take it.
    async fn change_source(&mut self, name: &str, v: &str) {
        let api: Api<ConfigMap> = Api::namespaced(self.t.client.clone(), &self.op);
        let patch = json!({"data": {"v": v}});
        let cm = wait_until(
            format!("source {}/{name} to take v={v}", self.op),
            TIMEOUT,
            async || {
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| err_msg(&e))
            },
        )
        .await;
        self.sources
            .insert(name.to_string(), Obj::from_configmap(cm));
    }

    /// Deletes a copy, retried while the API server cannot take it.
    async fn delete_copy(&self, ns: &str, name: &str) {
        let api: Api<ConfigMap> = Api::namespaced(self.t.client.clone(), ns);
        wait_until(
            format!("copy {ns}/{name} to be deleted"),
            TIMEOUT,
            async || match api.delete(name, &Default::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(err_msg(&e)),
            },
        )
        .await;
    }

    /// The operator's requests received in `[from, to)`.
    fn requests(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Query {
        Query::user(&self.id.user).between(from, to)
    }
}

/// Panics when the operator sent more than the writes the changes need
/// plus [`MAX_EXTRA_REQUESTS`].
fn assert_no_storm(test: &str, what: &str, sent: usize, needed: usize) {
    assert!(
        sent <= needed + MAX_EXTRA_REQUESTS,
        "{test}: the operator sent {sent} requests {what}, for {needed} writes needed; the bound \
         is {needed} + {MAX_EXTRA_REQUESTS}"
    );
}

/// Panics unless the tally after convergence is right.
fn assert_all_right(test: &str, f: &FanOut, tally: &Tally) {
    assert!(
        tally.ok() && tally.right == f.expected(),
        "{test}: after convergence the copies are not all right ({} expected): {}",
        f.expected(),
        tally.summary()
    );
}

fn fmt_map<K: std::fmt::Display, V: std::fmt::Display>(m: &BTreeMap<K, V>) -> String {
    let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", parts.join(", "))
}

// ===========================================================================
// a. the operator SIGKILLed in the middle of a fan-out

/// Killed with some copies written and others not, a restarted operator
/// writes the rest from the cluster's state: every copy right, none lost,
/// none written twice (each copy created exactly once, none recreated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills the API server and etcd: runs on a control plane of its own (hack/test: --ignored)"]
async fn operator_sigkilled_mid_fan_out_converges_after_restart_without_duplicates() {
    const TEST: &str = "operator_sigkilled_mid_fan_out";
    let fault = begin(TEST).await;
    let f = FanOut::new("sigkill").await;
    let requests = Requests::start(&fault.plane);
    let start = Utc::now();
    // So that the kill lands in the middle of the fan-out.
    let (mut first, _) = f.slow_operator_a_third_in().await;
    first.crash();
    let killed_at = Utc::now();
    // Every request the first operator sent has landed once the audit log
    // holds a later one.
    requests.settle(&f.t.client, killed_at).await;
    let at_kill = f.tally().await.expect("listing the copies after the kill");
    let created_before = requests.count(
        &f.requests(start, killed_at + chrono::Duration::seconds(2))
            .verbs(&["create"])
            .resource("configmaps")
            .code(201),
    );

    let restarted = Instant::now();
    let restarted_wall = Utc::now();
    let mut second = f.operator(f.id.kubeconfig_str(), &[]);
    let converged = f.converge(restarted, CONVERGE_WAIT).await;
    let end = Utc::now();
    requests.settle(&f.t.client, end).await;
    let after = f.tally().await.expect("listing the copies");
    let all = f.requests(start, end + chrono::Duration::seconds(1));
    let created = requests.count(
        &all.clone()
            .verbs(&["create"])
            .resource("configmaps")
            .code(201),
    );
    let deleted = requests.count(&all.clone().verbs(&["delete"]).resource("configmaps"));
    let recreated: Vec<&(String, String)> = at_kill
        .uids
        .iter()
        .filter(|(k, uid)| after.uids.get(*k) != Some(*uid))
        .map(|(k, _)| k)
        .collect();
    let after_restart = requests.by_verb_resource(&f.requests(restarted_wall, end));

    println!(
        "{TEST}: at the kill {} of {} copies written ({} right), {} created by the first operator; \
         converged {} after the restart; after: {}; copies created in all {created}, deleted {deleted}, \
         recreated {}; the restarted operator's requests until convergence: {}",
        at_kill.present(),
        f.expected(),
        at_kill.right,
        created_before,
        converged.as_ref().map_or_else(|e| e.clone(), |d| secs(*d)),
        after.summary(),
        recreated.len(),
        fmt_map(&after_restart),
    );
    assert!(
        at_kill.present() > 0 && at_kill.present() < f.expected(),
        "{TEST}: the kill did not land in the middle of the fan-out: {} of {} copies written",
        at_kill.present(),
        f.expected()
    );
    if let Err(e) = converged {
        panic!("{TEST}: the restarted operator did not converge: {e}");
    }
    assert_all_right(TEST, &f, &after);
    assert!(
        recreated.is_empty(),
        "{TEST}: {} copies written before the kill were replaced; the first: {:?}",
        recreated.len(),
        &recreated[..recreated.len().min(3)]
    );
    assert_eq!(
        (created, deleted),
        (f.expected(), 0),
        "{TEST}: each copy must be created exactly once and none deleted"
    );
    second.assert_running();
}

// ===========================================================================
// b. the API server down for a minute

/// The API server is killed, stays down a minute, and comes back; as soon
/// as it answers, a source changes and a copy is deleted. Every copy is
/// right within seconds of the API server being ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills the API server and etcd: runs on a control plane of its own (hack/test: --ignored)"]
async fn api_server_down_a_minute_then_changes_converge_within_seconds_of_its_return() {
    const TEST: &str = "api_server_down_a_minute";
    let fault = begin(TEST).await;
    let mut f = FanOut::new("apiserver-down").await;
    // Through a proxy that only counts: the connections it accepts while the
    // API server is down are the operator's attempts to reach it.
    let proxy = Proxy::start(api_server_address_of(&fault.plane.kubeconfig).await).await;
    let kubeconfig = kubeconfig_with_server(&f.id.kubeconfig, &proxy.url());
    let mut op = f.operator(kubeconfig.to_str().unwrap(), &[]);
    f.wait_converged(TEST).await;
    let requests = Requests::start(&fault.plane);

    fault.plane.stop(Component::KubeApiserver);
    let (before, _, _) = proxy.accepted();
    tokio::time::sleep(API_SERVER_DOWN).await;
    op.assert_running();
    let (during, _, _) = proxy.accepted();
    let attempts = during - before;
    fault.plane.start(Component::KubeApiserver);
    let ready = Instant::now();
    let ready_wall = Utc::now();
    f.change_source("a", "2").await;
    let victim = f.targets[TARGETS / 2].clone();
    f.delete_copy(&victim, "b").await;
    let changed = ready.elapsed();
    let converged = f.converge(ready, CONVERGE_WAIT).await;
    let end = Utc::now();
    requests.settle(&f.t.client, end).await;
    let after = f.tally().await.expect("listing the copies");
    let window = f.requests(ready_wall, end);
    println!(
        "{TEST}: down {}; the operator tried {attempts} connections meanwhile; changes made {} \
         after the API server was ready; every copy right {} after it was ready; after: {}; the \
         operator's requests from its return to convergence: {} (codes {}, busiest second {})",
        secs(API_SERVER_DOWN),
        secs(changed),
        converged.as_ref().map_or_else(|e| e.clone(), |d| secs(*d)),
        after.summary(),
        fmt_map(&requests.by_verb_resource(&window)),
        fmt_map(&requests.by_code(&window)),
        requests.busiest_second(&window),
    );
    converged.unwrap_or_else(|e| panic!("{TEST}: {e}"));
    assert_all_right(TEST, &f, &after);
    assert!(
        attempts <= MAX_CONNECTIONS_DOWN,
        "{TEST}: the operator tried {attempts} connections while the API server was down {}; \
         the bound is {MAX_CONNECTIONS_DOWN}",
        secs(API_SERVER_DOWN)
    );
    // 30 copies of a updated, 1 copy of b created.
    let needed = TARGETS + 1;
    assert_no_storm(
        TEST,
        "from the API server's return to convergence",
        requests.count(&window),
        needed,
    );
    op.assert_running();
}

// ===========================================================================
// c. etcd killed and restarted

/// etcd is killed under a running API server and started again; then a
/// source changes. The copies follow within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills the API server and etcd: runs on a control plane of its own (hack/test: --ignored)"]
async fn etcd_killed_and_restarted_then_a_source_change_converges() {
    const TEST: &str = "etcd_killed_and_restarted";
    let fault = begin(TEST).await;
    let mut f = FanOut::new("etcd-restart").await;
    let mut op = f.operator(f.id.kubeconfig_str(), &[]);
    f.wait_converged(TEST).await;
    let requests = Requests::start(&fault.plane);

    let down_at = Utc::now();
    fault.plane.stop(Component::Etcd);
    tokio::time::sleep(ETCD_DOWN).await;
    op.assert_running();
    let started = Instant::now();
    let started_wall = Utc::now();
    fault.plane.start(Component::Etcd);
    f.change_source("a", "2").await;
    let changed = Instant::now();
    let converged = f.converge(changed, CONVERGE_WAIT).await;
    let end = Utc::now();
    requests.settle(&f.t.client, end).await;
    let after = f.tally().await.expect("listing the copies");
    let down = f.requests(down_at, started_wall);
    let back = f.requests(started_wall, end);
    println!(
        "{TEST}: etcd down {}; the source change was taken {} after etcd started; every copy right \
         {} after the change; after: {}; the operator's requests while etcd was down: {} (codes {}), \
         from its return to convergence: {} (busiest second {})",
        secs(ETCD_DOWN),
        secs(changed - started),
        converged.as_ref().map_or_else(|e| e.clone(), |d| secs(*d)),
        after.summary(),
        fmt_map(&requests.by_verb_resource(&down)),
        fmt_map(&requests.by_code(&down)),
        fmt_map(&requests.by_verb_resource(&back)),
        requests.busiest_second(&back),
    );
    converged.unwrap_or_else(|e| panic!("{TEST}: {e}"));
    assert_all_right(TEST, &f, &after);
    assert_no_storm(TEST, "while etcd was down", requests.count(&down), 0);
    // 30 copies of a updated.
    assert_no_storm(
        TEST,
        "from etcd's return to convergence",
        requests.count(&back),
        TARGETS,
    );
    op.assert_running();
}

// ===========================================================================
// d. watches resuming from a compacted resourceVersion

/// The current resourceVersion of ConfigMaps.
async fn current_rv(client: &kube::Client) -> String {
    Api::<ConfigMap>::all(client.clone())
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap_or_else(|e| panic!("listing ConfigMaps: {}", err_msg(&e)))
        .metadata
        .resource_version
        .expect("a list has a resourceVersion")
}

/// Whether a ConfigMap watch from `rv` is answered 410 Gone (as an error
/// status, or as the stream's first event).
async fn watch_gone(client: &kube::Client, rv: &str) -> Result<bool, String> {
    let api = Api::<ConfigMap>::all(client.clone());
    let stream = match api.watch(&WatchParams::default().timeout(1), rv).await {
        Err(kube::Error::Api(s)) if s.code == 410 => return Ok(true),
        Err(e) => return Err(err_msg(&e)),
        Ok(stream) => stream,
    };
    let mut stream = stream.boxed();
    match tokio::time::timeout(Duration::from_secs(10), stream.try_next()).await {
        Err(_) => Err("no answer to the watch within 10 s".into()),
        Ok(Err(e)) => Err(err_msg(&e)),
        Ok(Ok(Some(WatchEvent::Error(e)))) => {
            if e.code == 410 {
                Ok(true)
            } else {
                Err(format!("watch error {} {}", e.code, e.message))
            }
        }
        // Events after rv (or none before the timeout): still served.
        Ok(Ok(_)) => Ok(false),
    }
}

/// Whether etcd has compacted `rv` away: an exact list there is 410.
async fn exact_list_gone(client: &kube::Client, rv: &str) -> Result<(), String> {
    let lp = ListParams::default()
        .limit(1)
        .at(rv)
        .matching(kube::api::VersionMatch::Exact);
    match Api::<ConfigMap>::all(client.clone())
        .list_metadata(&lp)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 410 => Ok(()),
        Err(e) => Err(err_msg(&e)),
        Ok(_) => Err(format!("an exact list at {rv} is still served")),
    }
}

/// Writes ConfigMaps (outside the rule) until the API server's watch cache
/// no longer holds `rv`: etcd compaction alone does not end a watch the
/// cache serves, the cache's own history must have moved past it. How many
/// writes that took.
async fn churn_until_watch_gone(t: &TestNs, rv: &str) -> usize {
    const BATCH: usize = 100;
    const PARALLEL: usize = 10;
    const LIMIT: usize = 20_000;
    let ns = t.ns("churn").await;
    for i in 0..PARALLEL {
        t.create_plain(CM, &ns, &format!("churn-{i}"), &[], &[("n", "0")])
            .await;
    }
    let mut writes = 0;
    loop {
        match watch_gone(&t.client, rv).await {
            Ok(true) => return writes,
            Ok(false) => {}
            Err(e) => panic!("watching ConfigMaps from {rv}: {e}"),
        }
        assert!(
            writes < LIMIT,
            "the API server still serves a ConfigMap watch from {rv} after {writes} writes"
        );
        for round in 0..BATCH / PARALLEL {
            let n = (writes + round * PARALLEL).to_string();
            let names: Vec<String> = (0..PARALLEL).map(|i| format!("churn-{i}")).collect();
            let change = [("n", Some(n.as_str()))];
            futures::future::join_all(names.iter().map(|name| t.set_data(CM, &ns, name, &change)))
                .await;
        }
        writes += BATCH;
    }
}

/// The operator is cut off (a proxy drops its connections and holds new
/// ones) while sources change, for longer than the API server's watch
/// history, and etcd is compacted; when the proxy lets it through again,
/// its watches cannot resume (410 Gone): it lists again and converges.
///
/// Compaction alone is not enough: the API server serves a watch from its
/// watch cache, whose event history is its own (at least 75 s, and as many
/// events as came in that time), not etcd's. So the test outlasts that
/// window, compacts etcd (and sees the API server answer 410 for an exact
/// list at the old resourceVersion), then writes unrelated ConfigMaps until
/// the cache answers 410 to a watch from the resourceVersion of the cut:
/// every resourceVersion the operator can hold is at most that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills the API server and etcd: runs on a control plane of its own (hack/test: --ignored)"]
async fn watches_resuming_from_a_compacted_resource_version_relist_and_converge() {
    const TEST: &str = "compacted_resource_version";
    let fault = begin(TEST).await;
    let mut f = FanOut::new("compacted").await;
    let proxy = Proxy::start(api_server_address_of(&fault.plane.kubeconfig).await).await;
    let kubeconfig = kubeconfig_with_server(&f.id.kubeconfig, &proxy.url());
    let mut op = f.operator(kubeconfig.to_str().unwrap(), &[]);
    f.wait_converged(TEST).await;
    let requests = Requests::start(&fault.plane);

    proxy.cut();
    let cut_at = Utc::now();
    // The operator has seen nothing newer than this.
    let rv_cut = current_rv(&f.t.client).await;
    f.change_source("a", "2").await;
    f.change_source("c", "2").await;
    let victim = f.targets[3].clone();
    f.delete_copy(&victim, "b").await;
    tokio::time::sleep(WATCH_HISTORY).await;
    op.assert_running();
    let revision = fault.plane.compact();
    wait_until(
        format!("etcd to answer 410 for resourceVersion {rv_cut} (compacted at {revision})"),
        TIMEOUT,
        async || exact_list_gone(&f.t.client, &rv_cut).await,
    )
    .await;
    let churn = churn_until_watch_gone(&f.t, &rv_cut).await;

    let restored = Instant::now();
    let restored_wall = Utc::now();
    proxy.forward();
    let converged = f.converge(restored, CONVERGE_WAIT).await;
    let end = Utc::now();
    requests.settle(&f.t.client, end).await;
    let after = f.tally().await.expect("listing the copies");
    let back = f.requests(restored_wall, end);
    let lists = requests.count(&back.clone().verbs(&["list"]).resource("configmaps"));
    println!(
        "{TEST}: cut off {}; etcd compacted at revision {revision} (cut at resourceVersion \
         {rv_cut}); {churn} writes until the watch cache no longer held it; every copy right {} \
         after the proxy let the operator through; after: {}; the operator's requests while cut \
         off: {}, from the restore to convergence: {} (busiest second {})",
        secs((restored_wall - cut_at).to_std().unwrap()),
        converged.as_ref().map_or_else(|e| e.clone(), |d| secs(*d)),
        after.summary(),
        requests.count(&f.requests(cut_at, restored_wall)),
        fmt_map(&requests.by_verb_resource(&back)),
        requests.busiest_second(&back),
    );
    converged.unwrap_or_else(|e| panic!("{TEST}: {e}"));
    assert_all_right(TEST, &f, &after);
    assert!(
        lists > 0,
        "{TEST}: the operator converged without listing ConfigMaps again, though its resourceVersion was gone"
    );
    // 30 copies of a and 30 of c updated, 1 copy of b created.
    let needed = 2 * TARGETS + 1;
    assert_no_storm(
        TEST,
        "from the restore to convergence",
        requests.count(&back),
        needed,
    );
    op.assert_running();
}

// ===========================================================================
// e. a half-dead network

/// For 30 s the network between the operator and the API server is
/// half-dead: every connection open when it begins stays open but carries
/// nothing again (see `common::proxy`), while a source changes and a copy
/// is deleted. The operator gives up on the dead connections by its own
/// deadlines, opens only a few new ones meanwhile, and once the network
/// heals the copies converge without a burst of requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills the API server and etcd: runs on a control plane of its own (hack/test: --ignored)"]
async fn a_half_dead_network_for_30s_causes_no_storm_and_converges_after() {
    const TEST: &str = "half_dead_network";
    let fault = begin(TEST).await;
    let mut f = FanOut::new("half-dead").await;
    let proxy = Proxy::start(api_server_address_of(&fault.plane.kubeconfig).await).await;
    let kubeconfig = kubeconfig_with_server(&f.id.kubeconfig, &proxy.url());
    let mut op = f.operator(kubeconfig.to_str().unwrap(), &[]);
    f.wait_converged(TEST).await;
    let requests = Requests::start(&fault.plane);

    let (_, before_stall, _) = proxy.accepted();
    proxy.stall();
    let stalled_at = Utc::now();
    f.change_source("a", "2").await;
    let victim = f.targets[7].clone();
    f.delete_copy(&victim, "c").await;
    tokio::time::sleep(STALL).await;
    op.assert_running();
    let (_, during_stall, _) = proxy.accepted();
    let opened = during_stall - before_stall;
    let held = proxy.open_connections();

    let resumed = Instant::now();
    let resumed_wall = Utc::now();
    proxy.forward();
    let converged = f.converge(resumed, CONVERGE_WAIT).await;
    let end = Utc::now();
    requests.settle(&f.t.client, end).await;
    let after = f.tally().await.expect("listing the copies");
    let back = f.requests(resumed_wall, end);
    println!(
        "{TEST}: stalled {}; the operator opened {opened} connections during the stall ({held} \
         open at its end, dead or held); every copy right {} after the proxy forwarded again; after: {}; the \
         operator's requests received during the stall: {}, from the resume to convergence: {} \
         (codes {}, busiest second {})",
        secs(STALL),
        converged.as_ref().map_or_else(|e| e.clone(), |d| secs(*d)),
        after.summary(),
        requests.count(&f.requests(stalled_at, resumed_wall)),
        fmt_map(&requests.by_verb_resource(&back)),
        fmt_map(&requests.by_code(&back)),
        requests.busiest_second(&back),
    );
    converged.unwrap_or_else(|e| panic!("{TEST}: {e}"));
    assert_all_right(TEST, &f, &after);
    assert!(
        opened <= MAX_CONNECTIONS_STALLED,
        "{TEST}: the operator opened {opened} connections during the {} stall; the bound is {MAX_CONNECTIONS_STALLED}",
        secs(STALL)
    );
    // 30 copies of a updated, 1 copy of c created.
    let needed = TARGETS + 1;
    assert_no_storm(
        TEST,
        "from the resume to convergence",
        requests.count(&back),
        needed,
    );
    op.assert_running();
}

// ===========================================================================
// f. a target namespace deleted in the middle of a fan-out

/// A target namespace is deleted while the operator fans out, and stays
/// terminating a while (an object in it has a finalizer, as objects of
/// other controllers often do): the copies in every other namespace are
/// right, the rule is Ready meanwhile, the operator keeps running, sends
/// the dying namespace only the few writes already on their way, and gets
/// no storm of errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills the API server and etcd: runs on a control plane of its own (hack/test: --ignored)"]
async fn a_target_namespace_deleted_mid_fan_out_leaves_the_rest_right_and_the_rule_ready() {
    const TEST: &str = "namespace_deleted_mid_fan_out";
    const HOLD_FINALIZER: &str = "copyrator-test/hold";
    let fault = begin(TEST).await;
    let mut f = FanOut::new("ns-deleted").await;
    let requests = Requests::start(&fault.plane);
    let start = Utc::now();
    // So that the deletion lands in the middle of the fan-out.
    let (mut op, at_delete) = f.slow_operator_a_third_in().await;
    // The target with the fewest copies: the operator still means to write there.
    let victim = f
        .targets
        .iter()
        .min_by_key(|ns| at_delete.uids.keys().filter(|(n, _)| n == *ns).count())
        .unwrap()
        .clone();
    let victim_copies = at_delete.uids.keys().filter(|(n, _)| *n == victim).count();
    let fan_out = f.expected();
    f.t.create_json(
        CM,
        &victim,
        "hold",
        json!({"metadata": {"finalizers": [HOLD_FINALIZER]}}),
    )
    .await;
    f.t.namespaces()
        .delete(&victim, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("deleting namespace {victim}: {}", err_msg(&e)));
    let deleted = Instant::now();
    let deleted_wall = Utc::now();
    f.targets.retain(|ns| *ns != victim);
    f.deleted.push(victim.clone());

    let converged = f.converge(deleted, CONVERGE_WAIT).await;
    let ready = wait_until(
        format!(
            "rule {}/{RULE}: Ready True with {} copies in {} namespaces",
            f.op,
            f.expected(),
            f.targets.len()
        ),
        TIMEOUT,
        async || {
            let r =
                f.t.try_get_rule(&f.op, RULE)
                    .await?
                    .ok_or("the rule is gone")?;
            is_ready(&r)?;
            let copies = status_u64(&r, "copies");
            let targets = status_u64(&r, "targetNamespaces");
            if copies == Some(f.expected() as u64) && targets == Some(f.targets.len() as u64) {
                Ok(r)
            } else {
                Err(short_status(&r))
            }
        },
    )
    .await;
    let terminating =
        f.t.namespaces()
            .get(&victim)
            .await
            .map(|ns| ns.metadata.deletion_timestamp.is_some())
            .unwrap_or(false);
    // The namespace stays terminating a while, then goes.
    tokio::time::sleep(NAMESPACE_HELD.saturating_sub(deleted.elapsed())).await;
    f.t.cms(&victim)
        .patch(
            "hold",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap_or_else(|e| panic!("releasing {victim}/hold: {}", err_msg(&e)));
    wait_until(
        format!("namespace {victim} to be gone"),
        Duration::from_secs(120),
        async || match f.t.namespaces().get_opt(&victim).await {
            Ok(None) => Ok(()),
            Ok(Some(ns)) => Err(format!("phase {:?}", ns.status.and_then(|s| s.phase))),
            Err(e) => Err(err_msg(&e)),
        },
    )
    .await;
    let end = Utc::now();
    requests.settle(&f.t.client, end).await;
    let after = f.tally().await.expect("listing the copies");
    let to_victim = f.requests(deleted_wall, end).namespace(&victim);
    let all = f.requests(start, end);
    let errors: usize = requests
        .by_code(&all)
        .iter()
        .filter(|(code, _)| **code >= 400)
        .map(|(_, n)| n)
        .sum();
    let writes = requests.count(&all.clone().verbs(WRITE_VERBS));
    println!(
        "{TEST}: namespace {victim} deleted with {} of {fan_out} copies written ({victim_copies} \
         there), terminating for {}; the others right {} after; after: {}; the rule while it was \
         terminating: {}; the operator's requests to {victim} after its deletion: {} (codes {}); \
         its error answers in all {errors}, its writes {writes}",
        at_delete.present(),
        secs(NAMESPACE_HELD),
        converged.as_ref().map_or_else(|e| e.clone(), |d| secs(*d)),
        after.summary(),
        ready_condition(&ready).map_or("-".to_string(), |c| c.to_string()),
        fmt_map(&requests.by_verb_resource(&to_victim)),
        fmt_map(&requests.by_code(&to_victim)),
    );
    assert!(
        terminating,
        "{TEST}: namespace {victim} was not terminating when the rule was Ready"
    );
    converged.unwrap_or_else(|e| panic!("{TEST}: {e}"));
    assert_all_right(TEST, &f, &after);
    op.assert_running();
    let n = requests.count(&to_victim);
    assert!(
        n <= MAX_REQUESTS_TO_DELETED_NS,
        "{TEST}: {n} requests to the deleted namespace; the bound is {MAX_REQUESTS_TO_DELETED_NS}"
    );
    assert!(
        errors <= MAX_ERRORS_NS_DELETED,
        "{TEST}: {errors} error answers; the bound is {MAX_ERRORS_NS_DELETED}"
    );
}

// ===========================================================================
// throttled writes use the capacity they are given

/// Creates `count` ConfigMaps spread over `namespaces`, `concurrency` at a
/// time, each retried after its `Retry-After` (1 s when none) when the API
/// server throttles it: a plain client at a fixed concurrency. Returns how
/// long it took and how many answers were 429.
async fn plain_creates(
    client: &kube::Client,
    namespaces: &[String],
    prefix: &str,
    concurrency: usize,
    count: usize,
) -> (Duration, usize) {
    let started = Instant::now();
    let throttled = std::sync::atomic::AtomicUsize::new(0);
    futures::stream::iter(0..count)
        .map(|i| {
            let api: Api<ConfigMap> =
                Api::namespaced(client.clone(), &namespaces[i % namespaces.len()]);
            let throttled = &throttled;
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("{prefix}-{i:04}")},
                "data": {"k": "v"},
            }))
            .expect("a ConfigMap");
            async move {
                loop {
                    match api.create(&Default::default(), &cm).await {
                        Ok(_) => return,
                        Err(kube::Error::Api(s)) if s.code == 429 => {
                            throttled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let wait = s
                                .details
                                .as_ref()
                                .map(|d| d.retry_after_seconds)
                                .filter(|s| *s > 0)
                                .map_or(Duration::from_secs(1), |s| {
                                    Duration::from_secs(u64::from(s))
                                });
                            tokio::time::sleep(wait).await;
                        }
                        Err(e) => panic!("the plain client's create: {}", err_msg(&e)),
                    }
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
    (
        started.elapsed(),
        throttled.load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// From the first ConfigMap create that `query` matches (as the API server
/// received it) to the last one it answered 2xx.
fn create_span(requests: &Requests, query: &Query) -> Duration {
    let creates = requests.matching(&query.clone().verbs(&["create"]).resource("configmaps"));
    let first = creates.iter().map(|e| e.received).min();
    let last = creates
        .iter()
        .filter(|e| e.code.is_some_and(|c| (200..300).contains(&c)))
        .map(|e| e.stage_timestamp)
        .max();
    match (first, last) {
        (Some(first), Some(last)) => (last - first).to_std().unwrap_or_default(),
        _ => panic!("no ConfigMap created in the window"),
    }
}

/// The operator's ServiceAccount is throttled by API Priority and Fairness:
/// a priority level of 3 concurrency shares that rejects (429) what it
/// cannot seat. A plain client as that ServiceAccount creates 1,000
/// ConfigMaps at each of several fixed concurrencies; then two rules of
/// 1,000 copies each must converge with at most 10 % of the operator's
/// requests answered 429: its writes in flight shrink on 429 and grow back
/// on success, and each throttled copy waits its own `Retry-After` (a
/// writer that paused on every refusal took 205 s with 62 % of requests
/// refused on a level like this one).
///
/// How fast is a benchmark's question, not a test's: the figures are
/// printed here, and `hack/bench-throttled` runs this test alone on a
/// quiet control plane with `COPYRATOR_BENCH_TARGETS=1`, which holds the
/// faster rule's creates (first to last, from the audit log) to 3 times
/// the plain client's best.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills the API server and etcd: runs on a control plane of its own (hack/test: --ignored)"]
async fn writes_throttled_by_priority_and_fairness_use_the_capacity_they_are_given() {
    const TEST: &str = "apf_capacity";
    const SOURCES_N: usize = 50;
    const TARGETS_N: usize = 20;
    const COPIES: usize = SOURCES_N * TARGETS_N;
    const FIXED: [usize; 5] = [1, 2, 4, 8, 16];
    const MAX_SLOWDOWN: f64 = 3.0;
    const MAX_THROTTLED_SHARE: f64 = 0.10;
    let fault = begin(TEST).await;
    let t = TestNs::new("apf-capacity").await;
    let op = t.ns("op").await;
    let suffixes: Vec<String> = (0..TARGETS_N).map(|i| format!("t{i:02}")).collect();
    let targets: Vec<String> = futures::future::join_all(suffixes.iter().map(|s| t.ns(s))).await;
    let id = OperatorIdentity::new(&t, &op, "copyrator").await;
    let cluster = common::cluster_objects::ClusterObjects::new();
    common::apf::one_seat_for(
        &t.client,
        &cluster,
        &t.prefix,
        &op,
        "copyrator",
        common::apf::Throttled::All,
    )
    .await;
    for i in 0..SOURCES_N {
        t.create_source(CM, &op, &format!("s{i:02}"), &[], &[("k", "v")])
            .await;
    }

    let kubeconfig = kube::config::Kubeconfig::read_from(&id.kubeconfig)
        .expect("the ServiceAccount's kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("a client config for the ServiceAccount");
    let plain = kube::Client::try_from(config).expect("a client for the ServiceAccount");
    let requests = Requests::start(&fault.plane);
    let mut best: Option<(usize, Duration)> = None;
    let mut baseline = Vec::new();
    for concurrency in FIXED {
        let from = Utc::now();
        let (took, seen) = plain_creates(
            &plain,
            &targets,
            &format!("plain-{concurrency:02}"),
            concurrency,
            COPIES,
        )
        .await;
        // The client may retry a 429 itself: the audit log counts them all.
        let to = Utc::now();
        requests.settle(&t.client, to).await;
        let query = Query::user(&id.user).between(from, to);
        let span = create_span(&requests, &query);
        baseline.push(format!(
            "{concurrency} at once: {} (creates over {}; {} requests, {} answered 429, {seen} seen by the client)",
            secs(took),
            secs(span),
            requests.count(&query),
            requests.count(&query.clone().code(429))
        ));
        if best.is_none_or(|(_, b)| span < b) {
            best = Some((concurrency, span));
        }
    }
    let (best_concurrency, best_time) = best.expect("at least one fixed concurrency");

    let mut operator = Operator::start_with_env(
        &t,
        ["run", "--namespace", &op, "--log-level", "info"]
            .map(String::from)
            .to_vec(),
        &[("KUBECONFIG", id.kubeconfig_str())],
    );
    operator.wait_ready().await;
    // Two rules one after the other, each of 1,000 copies into namespaces
    // of its own: the operator's best of two against the plain client's
    // best of five, so that one noisy moment decides neither.
    let other_suffixes: Vec<String> = (0..TARGETS_N).map(|i| format!("u{i:02}")).collect();
    let other: Vec<String> =
        futures::future::join_all(other_suffixes.iter().map(|s| t.ns(s))).await;
    let all: Api<ConfigMap> = Api::all(t.client.clone());
    let mut runs = Vec::new();
    let (mut sent, mut throttled) = (0, 0);
    for (rule, glob) in [("r0", t.glob("t")), ("r1", t.glob("u"))] {
        let from = Utc::now();
        let started = Instant::now();
        t.create_rule(&op, rule, rule_spec(CM, t.selector(), &[glob]))
            .await;
        let uid = t.rule_uid(&op, rule).await;
        let copies = ListParams::default().labels(&format!("{LABEL_RULE_UID}={uid}"));
        wait_until(
            format!("{COPIES} copies of rule {rule}"),
            Duration::from_secs(600),
            async || {
                let listed = all.list_metadata(&copies).await.map_err(|e| err_msg(&e))?;
                if listed.items.len() == COPIES {
                    Ok(())
                } else {
                    Err(format!("{} of {COPIES} copies", listed.items.len()))
                }
            },
        )
        .await;
        let converged = started.elapsed();
        let to = Utc::now();
        requests.settle(&t.client, to).await;
        let query = Query::user(&id.user).between(from, to);
        sent += requests.count(&query);
        throttled += requests.count(&query.clone().code(429));
        runs.push((converged, create_span(&requests, &query)));
    }
    drop(other);
    // The plain client once more, at its best concurrency, right after the
    // operator's runs: on a machine that other tests load unevenly, the
    // operator is held to what a plain client managed under the same
    // load, the slower of its best before and this run after.
    let from = Utc::now();
    plain_creates(&plain, &targets, "plain-after", best_concurrency, COPIES).await;
    let to = Utc::now();
    requests.settle(&t.client, to).await;
    let after = create_span(&requests, &Query::user(&id.user).between(from, to));
    let reference = best_time.max(after);
    let span = runs.iter().map(|(_, span)| *span).min().expect("two runs");
    let share = throttled as f64 / sent.max(1) as f64;
    println!(
        "{TEST}: a plain client creating {COPIES} ConfigMaps: {}",
        baseline.join("; ")
    );
    println!(
        "{TEST}: the operator, two rules of {COPIES} copies: {} (all copies after the rule was \
         made, its creates over); the plain client's best: {} at {best_concurrency} at once, \
         and {} right after; {sent} requests, {throttled} answered 429 ({:.1} %)",
        runs.iter()
            .map(|(all, span)| format!("{} / {}", secs(*all), secs(*span)))
            .collect::<Vec<_>>()
            .join(", "),
        secs(best_time),
        secs(after),
        share * 100.0
    );
    let mut failures = Vec::new();
    // The writes compared with the writes: from the first create to the
    // last one taken, as the API server logged them (the time to see a new
    // rule and list its sources is no part of using the level's capacity).
    // Held as a target only under the benchmark command: beside the main
    // suite, this machine's load changes between the two measurements.
    let slowdown = span.as_secs_f64() / reference.as_secs_f64().max(0.001);
    println!("{TEST}: BENCH-FIGURE creates_slowdown={slowdown:.2} (target at most {MAX_SLOWDOWN})");
    if bench_targets() && slowdown > MAX_SLOWDOWN {
        failures.push(format!(
            "its creates took {}, more than {MAX_SLOWDOWN}× the plain client's {} (its best \
             before, or its run right after if slower)",
            secs(span),
            secs(reference)
        ));
    }
    if share > MAX_THROTTLED_SHARE {
        failures.push(format!(
            "{throttled} of {sent} requests answered 429 ({:.1} %, at most {:.0} %)",
            share * 100.0,
            MAX_THROTTLED_SHARE * 100.0
        ));
    }
    assert!(failures.is_empty(), "{TEST}:\n  {}", failures.join("\n  "));
    operator.assert_running();
}
