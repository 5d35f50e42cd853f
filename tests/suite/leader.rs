//! Leader election under faults that leave the leader alive but cut off:
//!
//! * a leader paused with SIGSTOP past its Lease, resumed after the standby
//!   took over, writes nothing and reports itself as no leader at once;
//! * a leader whose connections to the API server stall (a TCP proxy that
//!   keeps them open and forwards nothing) closes its write gate within the
//!   renew deadline, before the standby may take the Lease: the two are
//!   never both leaders.
//!
//! Each test prints what it measured.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::faults::{StallProxy, api_server_address, kubeconfig_with_server, signal};
use crate::common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

const CM: Kind = Kind::ConfigMap;

/// client-go's default Lease duration; the renew deadline is 2/3 of it.
const LEASE_SECONDS: u64 = 15;
const RENEW_DEADLINE: Duration = Duration::from_secs(LEASE_SECONDS * 2 / 3);

/// A leader-electing replica; `env` e.g. a KUBECONFIG through a proxy.
fn replica(t: &TestNs, ns: &str, lease: &str, env: &[(&str, &str)]) -> Operator {
    let args = [
        "run",
        "--namespace",
        ns,
        "--log-level",
        "info",
        "--leader-election",
        "--lease-name",
        lease,
        "--lease-duration",
        &LEASE_SECONDS.to_string(),
    ]
    .map(String::from)
    .to_vec();
    Operator::start_with_env(t, args, env)
}

async fn metrics(port: u16) -> Result<String, String> {
    match http_get(port, "/metrics").await? {
        (200, body) => Ok(body),
        (code, body) => Err(format!("GET /metrics answered {code}: {body}")),
    }
}

/// (`copyrator_leader`, sum of `copyrator_api_writes_total`) of one process.
async fn gauge_and_writes(port: u16) -> Result<(f64, f64), String> {
    let text = metrics(port).await?;
    let leader = metric_family(&text, "copyrator_leader").ok_or("no copyrator_leader series")?;
    let writes = metric_family(&text, "copyrator_api_writes_total").unwrap_or(0.0);
    Ok((leader, writes))
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

/// Whether the Lease identity `holder` is the process `op`.
fn is_holder(holder: &Option<String>, op: &Operator) -> bool {
    match (holder, op.pid()) {
        (Some(h), Some(pid)) => h.ends_with(&format!("-{pid}")),
        _ => false,
    }
}

/// Waits until `op` reports `copyrator_leader 1` and the Lease names it.
async fn wait_leads(t: &TestNs, op: &Operator, ns: &str, lease: &str) {
    wait_until(
        format!("process {:?} to lead", op.pid()),
        TIMEOUT,
        async || {
            let (gauge, _) = gauge_and_writes(op.port).await?;
            let holder = lease_holder(t, ns, lease).await?;
            if gauge == 1.0 && is_holder(&holder, op) {
                Ok(())
            } else {
                Err(format!("gauge {gauge}, Lease holder {holder:?}"))
            }
        },
    )
    .await;
}

/// Waits until exactly one of two replicas leads; its index.
async fn wait_one_leader(t: &TestNs, ops: &[Operator], ns: &str, lease: &str) -> usize {
    wait_until("exactly one leader", TIMEOUT, async || {
        let a = gauge_and_writes(ops[0].port).await?.0;
        let b = gauge_and_writes(ops[1].port).await?.0;
        let holder = lease_holder(t, ns, lease).await?;
        match (a, b) {
            (1.0, 0.0) if is_holder(&holder, &ops[0]) => Ok(0),
            (0.0, 1.0) if is_holder(&holder, &ops[1]) => Ok(1),
            _ => Err(format!("gauges {a} {b}, Lease holder {holder:?}")),
        }
    })
    .await
}

/// Waits until the write counter of `op` has not moved for 2 s: nothing
/// in flight. Its value.
async fn wait_idle(op: &Operator) -> f64 {
    let mut last = (f64::NAN, Instant::now());
    wait_until("the leader to be idle for 2 s", TIMEOUT, async || {
        let (_, writes) = gauge_and_writes(op.port).await?;
        if writes != last.0 {
            last = (writes, Instant::now());
        }
        if last.1.elapsed() >= Duration::from_secs(2) {
            Ok(writes)
        } else {
            Err(format!("writes {writes}"))
        }
    })
    .await
}

/// Waits until the copy in every target carries `v`.
async fn wait_converged(t: &TestNs, targets: &[String], v: &str) {
    wait_until(format!("every copy to carry v={v}"), TIMEOUT, async || {
        for ns in targets {
            match t.try_get(CM, ns, "shared").await? {
                Some(o) if o.data.get("v").map(String::as_str) == Some(v) => {}
                other => return Err(format!("{ns}: {:?}", other.map(|o| o.data))),
            }
        }
        Ok(())
    })
    .await;
}

/// Every target holds a right copy of the source, and no other copy exists.
async fn assert_copies_right(t: &TestNs, op: &str, targets: &[String]) {
    let src = t.must_get(CM, op, "shared").await;
    let uid = t.rule_uid(op, "r").await;
    for ns in targets {
        let copy = t.must_get(CM, ns, "shared").await;
        if let Err(e) = check_copy(&copy, &src, op, "r", &uid) {
            panic!("{e}");
        }
    }
    let copies = t.list_labelled(CM, LABEL_RULE_UID, &uid).await;
    assert_eq!(
        copies.len(),
        targets.len(),
        "copies: {:?}",
        copies
            .iter()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .collect::<Vec<_>>()
    );
}

/// A source `op/shared` and a rule `op/r` copying it to `targets`.
async fn scenario(t: &TestNs, op: &str, targets: &[String]) {
    let src = t.create_source(CM, op, "shared", &[], &[("v", "1")]).await;
    t.create_rule(op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    for ns in targets {
        t.wait_copy(CM, ns, &src, op, "r").await;
    }
    t.wait_rule_ready(op, "r").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_resumed_after_sigstop_writes_nothing_while_the_standby_holds_the_lease() {
    let t = TestNs::new("leader-sigstop").await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 1..=6 {
        targets.push(t.ns(&format!("t{i}")).await);
    }
    let lease = format!("{}-lease", t.prefix);
    let mut ops = vec![replica(&t, &op, &lease, &[]), replica(&t, &op, &lease, &[])];
    for o in ops.iter_mut() {
        o.wait_ready().await;
    }
    let leader = wait_one_leader(&t, &ops, &op, &lease).await;
    let standby = 1 - leader;
    scenario(&t, &op, &targets).await;
    // Stopped while idle: a write already past the gate is not what this tests.
    let writes_before = wait_idle(&ops[leader]).await;
    let (_, standby_writes_before) = gauge_and_writes(ops[standby].port).await.unwrap();
    assert_eq!(
        standby_writes_before, 0.0,
        "the standby wrote before leading"
    );

    signal(&ops[leader], "STOP");
    let stopped_at = Instant::now();
    // Work for the leader to wake up to: its watches hold these events.
    t.set_data(CM, &op, "shared", &[("v", Some("2"))]).await;
    let takeover = wait_until(
        "the standby to hold the Lease",
        Duration::from_secs(LEASE_SECONDS + 15),
        async || {
            let holder = lease_holder(&t, &op, &lease).await?;
            if is_holder(&holder, &ops[standby]) {
                Ok(stopped_at.elapsed())
            } else {
                Err(format!("holder {holder:?}"))
            }
        },
    )
    .await;
    wait_converged(&t, &targets, "2").await;
    let first_write = stopped_at.elapsed();
    // More for the sleeper to see: another change and a copy edited by hand.
    t.set_data(CM, &op, "shared", &[("v", Some("3"))]).await;
    wait_converged(&t, &targets, "3").await;
    t.set_data(CM, &targets[0], "shared", &[("v", Some("edited"))])
        .await;
    wait_converged(&t, &targets, "3").await;
    let (_, standby_writes) = gauge_and_writes(ops[standby].port).await.unwrap();
    assert!(
        standby_writes >= targets.len() as f64,
        "the standby's writes: {standby_writes}"
    );

    signal(&ops[leader], "CONT");
    let resumed_at = Instant::now();
    t.set_data(CM, &op, "shared", &[("v", Some("4"))]).await;
    let mut closed_after = None;
    let mut scrapes = 0;
    while resumed_at.elapsed() < Duration::from_secs(6) {
        if let Ok((gauge, writes)) = gauge_and_writes(ops[leader].port).await {
            scrapes += 1;
            let at = resumed_at.elapsed();
            assert_eq!(
                writes, writes_before,
                "the resumed process wrote {at:?} after SIGCONT while the standby held the Lease"
            );
            match (gauge, closed_after) {
                (0.0, None) => closed_after = Some(at),
                (0.0, Some(_)) => {}
                (g, _) => {
                    panic!("the resumed process reports copyrator_leader {g} {at:?} after SIGCONT")
                }
            }
        }
        // Every scrape since SIGCONT reads 0 (the match above): the first
        // one that answers already does, whenever that is.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed_after = closed_after.expect("scraped the resumed process");
    wait_converged(&t, &targets, "4").await;
    assert_copies_right(&t, &op, &targets).await;
    let holder = lease_holder(&t, &op, &lease).await.unwrap();
    assert!(is_holder(&holder, &ops[standby]), "holder {holder:?}");
    let (old_gauge, old_writes) = gauge_and_writes(ops[leader].port).await.unwrap();
    let (new_gauge, new_writes) = gauge_and_writes(ops[standby].port).await.unwrap();
    assert_eq!((old_gauge, new_gauge), (0.0, 1.0));
    assert_eq!(old_writes, writes_before, "the resumed process wrote");
    ops[leader].assert_running();
    println!(
        "SIGSTOP of the leader (lease {LEASE_SECONDS} s): the standby held the Lease after {takeover:?}, \
         its copies were converged {first_write:?} after the stop; after SIGCONT the old leader's \
         copyrator_leader read 0 at the first scrape ({closed_after:?}, {scrapes} scrapes in 6 s all 0), \
         its writes stayed {old_writes} (the standby's: {new_writes})"
    );
}

/// `copyrator_leader` of (leader, standby), sampled every 100 ms.
type Samples = Arc<Mutex<Vec<(Instant, Option<f64>, Option<f64>)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_by_a_stalled_network_stops_leading_before_the_standby_takes_over() {
    let t = TestNs::new("leader-stall").await;
    let op = t.ns("op").await;
    let targets = vec![t.ns("t1").await, t.ns("t2").await];
    let lease = format!("{}-lease", t.prefix);
    let proxy = StallProxy::start(api_server_address().await).await;
    let kubeconfig = kubeconfig_with_server(&t, &proxy.url());
    let kubeconfig = kubeconfig.to_str().expect("a UTF-8 path");
    // The replica behind the proxy leads; the other waits.
    let mut leader = replica(&t, &op, &lease, &[("KUBECONFIG", kubeconfig)]);
    leader.wait_ready().await;
    wait_leads(&t, &leader, &op, &lease).await;
    let mut standby = replica(&t, &op, &lease, &[]);
    standby.wait_ready().await;
    scenario(&t, &op, &targets).await;

    let samples: Samples = Arc::default();
    let (stop_sampling, mut sampling) = tokio::sync::watch::channel(false);
    let sampler = {
        let samples = samples.clone();
        let ports = (leader.port, standby.port);
        tokio::spawn(async move {
            loop {
                let a = gauge_and_writes(ports.0).await.ok().map(|(g, _)| g);
                let b = gauge_and_writes(ports.1).await.ok().map(|(g, _)| g);
                samples.lock().unwrap().push((Instant::now(), a, b));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = sampling.changed() => return,
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, writes_before) = gauge_and_writes(leader.port).await.unwrap();

    proxy.stall();
    let stalled_at = Instant::now();
    t.set_data(CM, &op, "shared", &[("v", Some("2"))]).await;
    let mut gate_closed = None;
    let mut takeover = None;
    let limit = Duration::from_secs(LEASE_SECONDS + 15);
    while gate_closed.is_none() || takeover.is_none() {
        assert!(
            stalled_at.elapsed() < limit,
            "after the stall: gate closed {gate_closed:?}, takeover {takeover:?} within {limit:?}"
        );
        let old = gauge_and_writes(leader.port).await.map(|(g, _)| g);
        let new = gauge_and_writes(standby.port).await.map(|(g, _)| g);
        assert!(
            old != Ok(1.0) || new != Ok(1.0),
            "both replicas report copyrator_leader 1 {:?} after the stall",
            stalled_at.elapsed()
        );
        if gate_closed.is_none() && old == Ok(0.0) {
            gate_closed = Some(stalled_at.elapsed());
        }
        if takeover.is_none()
            && lease_holder(&t, &op, &lease)
                .await
                .is_ok_and(|h| is_holder(&h, &standby))
        {
            takeover = Some(stalled_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (gate_closed, takeover) = (gate_closed.unwrap(), takeover.unwrap());
    // The election went on trying: its Lease requests time out rather than hang.
    let logs = leader.logs();
    assert!(
        logs.contains("no answer within"),
        "no Lease request of the stalled leader timed out; log:\n{logs}"
    );
    wait_converged(&t, &targets, "2").await;
    let converged = stalled_at.elapsed();

    // The network comes back: the old leader sees the new holder and stays out.
    proxy.resume();
    assert_for(
        "the old leader to stay out",
        Duration::from_secs(4),
        async || match gauge_and_writes(leader.port).await? {
            (0.0, writes) if writes == writes_before => Ok(()),
            other => Err(format!(
                "(copyrator_leader, writes) {other:?}, writes before the stall {writes_before}"
            )),
        },
    )
    .await;
    let _ = stop_sampling.send(true);
    sampler.await.unwrap();
    assert_copies_right(&t, &op, &targets).await;
    leader.assert_running();

    let samples = samples.lock().unwrap().clone();
    let both: Vec<Duration> = samples
        .iter()
        .filter(|(_, a, b)| *a == Some(1.0) && *b == Some(1.0))
        .map(|(at, _, _)| at.saturating_duration_since(stalled_at))
        .collect();
    let standby_led = samples
        .iter()
        .find(|(at, _, b)| *at > stalled_at && *b == Some(1.0))
        .map(|(at, _, _)| *at - stalled_at);
    println!(
        "stall of the leader's connections (lease {LEASE_SECONDS} s, renew deadline {RENEW_DEADLINE:?}): \
         its gate closed after {gate_closed:?}, the standby held the Lease after {takeover:?} and reported \
         copyrator_leader 1 after {standby_led:?}; copies converged after {converged:?}; \
         {} samples of both gauges, both 1 in {}",
        samples.len(),
        both.len()
    );
    assert!(
        both.is_empty(),
        "both replicas reported copyrator_leader 1 at {both:?} after the stall"
    );
    assert!(
        samples
            .iter()
            .any(|(at, a, b)| *at < stalled_at && *a == Some(1.0) && *b == Some(0.0)),
        "no sample before the stall shows the leader leading"
    );
    // What the renew deadline is for: the stalled leader's gate is shut
    // before the standby may take the Lease (the order, not the delay).
    assert!(
        gate_closed < takeover,
        "the gate closed {gate_closed:?} after the stall, the standby took over after {takeover:?}"
    );
}

/// The standby keeps its caches and its rules' source watches warm: when
/// the leader is killed with a change pending, the standby writes after
/// acquiring the Lease without listing anything first (the API server's
/// audit log, each replica acting as a user of its own). The time from
/// acquiring the Lease to the first write is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_standby_writes_after_taking_over_without_listing_again() {
    let audit = common::audit::Audit::start();
    let t = TestNs::new("leader-takeover").await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 1..=4 {
        targets.push(t.ns(&format!("t{i}")).await);
    }
    let lease = format!("takeover-{}", random5());
    let users: Vec<String> = (0..2)
        .map(|i| format!("{}-replica-{i}", operator_user(&t)))
        .collect();
    let kubeconfigs: Vec<String> = users
        .iter()
        .map(|u| operator_kubeconfig(&t, None, Some(u)).display().to_string())
        .collect();
    let mut ops: Vec<Operator> = kubeconfigs
        .iter()
        .map(|k| replica(&t, &op, &lease, &[("KUBECONFIG", k.as_str())]))
        .collect();
    for o in &mut ops {
        o.wait_ready().await;
    }
    scenario(&t, &op, &targets).await;
    let leader = wait_one_leader(&t, &ops, &op, &lease).await;
    let standby = 1 - leader;
    let (_, standby_writes) = gauge_and_writes(ops[standby].port)
        .await
        .expect("standby metrics");
    assert_eq!(
        standby_writes, 0.0,
        "the standby wrote while the leader led"
    );

    ops[leader].crash();
    let died = std::time::SystemTime::now();
    t.set_data(CM, &op, "shared", &[("v", Some("2"))]).await;
    // The standby's first write: its write counter's first increase.
    let first_write = wait_until(
        "the standby's first write",
        Duration::from_secs(LEASE_SECONDS + 15),
        async || match gauge_and_writes(ops[standby].port).await? {
            (_, writes) if writes > 0.0 => Ok(std::time::SystemTime::now()),
            (gauge, _) => Err(format!("no write yet (leader gauge {gauge})")),
        },
    )
    .await;
    let acquired = Api::<Lease>::namespaced(t.client.clone(), &op)
        .get(&lease)
        .await
        .map_err(|e| err_msg(&e))
        .expect("reading the Lease")
        .spec
        .and_then(|s| s.acquire_time)
        .expect("the Lease has an acquire time");
    let acquired = std::time::UNIX_EPOCH
        + Duration::from_micros(u64::try_from(acquired.0.as_microsecond()).expect("after 1970"));
    wait_converged(&t, &targets, "2").await;
    let converged = std::time::SystemTime::now();
    let secs = |a: std::time::SystemTime, b: std::time::SystemTime| {
        b.duration_since(a)
            .map_or_else(|e| -e.duration().as_secs_f64(), |d| d.as_secs_f64())
    };
    let to_first_write = secs(acquired, first_write);
    println!(
        "takeover: leader killed -> Lease acquired {:.2} s, acquired -> first write {:.2} s \
         (metrics polled every 150 ms), killed -> every copy right {:.2} s",
        secs(died, acquired),
        to_first_write,
        secs(died, converged)
    );
    assert!(
        to_first_write >= 0.0,
        "the standby wrote {:.2} s before it took the Lease",
        -to_first_write
    );
    let acquired_at = chrono::DateTime::<chrono::Utc>::from(acquired);
    let first_write_at = chrono::DateTime::<chrono::Utc>::from(first_write);
    audit.settle(&t.client, first_write_at).await;
    let listed = audit.matching(
        &common::audit::Query::user(&users[standby])
            .verbs(&["list"])
            .between(acquired_at, first_write_at),
    );
    assert!(
        listed.is_empty(),
        "the standby listed again between taking the Lease and its first write: {}",
        listed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    );
    assert_copies_right(&t, &op, &targets).await;
}

/// A rule staged `canary` (namespaces `…-tz*`, which sort after the
/// rest's, so that a pass would reach the rest first; a pause of `pause`
/// seconds), then the rest.
fn staged_rule(t: &TestNs, pause: u32) -> serde_json::Value {
    with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/rollout",
        serde_json::json!({
            "stages": [{"name": "canary", "include": [t.glob("tz")], "pauseSeconds": pause}],
            "settleTimeoutSeconds": 600,
        }),
    )
}

/// `v` of the ConfigMap `ns/shared`, and its resourceVersion.
async fn shared_v(t: &TestNs, ns: &str) -> Result<(String, u64), String> {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(t.client.clone(), ns)
        .get("shared")
        .await
        .map_err(|e| err_msg(&e))?;
    let v = cm
        .data
        .as_ref()
        .and_then(|d| d.get("v"))
        .cloned()
        .unwrap_or_default();
    let version = cm
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default()
        .parse()
        .map_err(|e| format!("resourceVersion: {e}"))?;
    Ok((v, version))
}

/// Waits until every copy in `namespaces` carries `v`; their versions.
async fn wait_all_at(t: &TestNs, namespaces: &[String], v: &str) -> Vec<u64> {
    wait_until(format!("every copy at v={v}"), TIMEOUT, async || {
        let mut versions = Vec::new();
        for ns in namespaces {
            match shared_v(t, ns).await? {
                (now, version) if now == v => versions.push(version),
                (now, _) => return Err(format!("{ns} at v={now}")),
            }
        }
        Ok(versions)
    })
    .await
}

/// The rule's first rollout as its status records it.
async fn first_rollout(t: &TestNs, op: &str) -> Result<serde_json::Value, String> {
    let rule = t.rules(op).get("r").await.map_err(|e| err_msg(&e))?;
    let rule = serde_json::to_value(rule).map_err(|e| e.to_string())?;
    Ok(rule["status"]["rollouts"][0].clone())
}

/// The leader stopped (as a Pod deleted) while the canary pauses: the
/// standby that takes over shows the same stage, the same time the canary
/// settled (so the same pause deadline), writes nothing to the canary or
/// the rest meanwhile, and opens the rest no earlier than that deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_goes_on_from_the_recorded_stage_and_pause_deadline() {
    const PAUSE: u32 = 40;
    let t = TestNs::new("leader-rollout-pause").await;
    let op = t.ns("op").await;
    let canary = vec![t.ns("tz1").await];
    let rest = vec![t.ns("ta1").await, t.ns("ta2").await];
    let lease = format!("rollout-{}", random5());
    let mut ops: Vec<Operator> = (0..2).map(|_| replica(&t, &op, &lease, &[])).collect();
    for o in &mut ops {
        o.wait_ready().await;
    }
    t.create_source(CM, &op, "shared", &[], &[("v", "1")]).await;
    t.create_rule(&op, "r", staged_rule(&t, PAUSE)).await;
    wait_all_at(&t, &[canary.clone(), rest.clone()].concat(), "1").await;
    t.wait_rule_ready(&op, "r").await;
    let leader = wait_one_leader(&t, &ops, &op, &lease).await;

    t.set_data(CM, &op, "shared", &[("v", Some("2"))]).await;
    let canary_v2 = wait_all_at(&t, &canary, "2").await;
    let pausing = wait_until("the canary pauses", TIMEOUT, async || {
        let first = first_rollout(&t, &op).await?;
        match first["phase"].as_str() {
            Some("Pausing") => Ok(first),
            _ => Err(format!("{first}")),
        }
    })
    .await;
    let rest_v1 = wait_all_at(&t, &rest, "1").await;

    ops[leader].stop();
    let standby = 1 - leader;
    wait_leads(&t, &ops[standby], &op, &lease).await;
    assert_for(
        "the new leader holds where the rollout stood",
        QUIET,
        async || {
            let now = first_rollout(&t, &op).await?;
            for field in ["stage", "phase", "openedAt", "settledAt", "content"] {
                if now[field] != pausing[field] {
                    return Err(format!("{field}: {} then {}", pausing[field], now[field]));
                }
            }
            for (ns, before) in canary
                .iter()
                .zip(&canary_v2)
                .chain(rest.iter().zip(&rest_v1))
            {
                let (_, version) = shared_v(&t, ns).await?;
                if version != *before {
                    return Err(format!("{ns} was written"));
                }
            }
            Ok(())
        },
    )
    .await;

    let settled_at =
        chrono::DateTime::parse_from_rfc3339(pausing["settledAt"].as_str().expect("settledAt"))
            .expect("an RFC 3339 time");
    let deadline = settled_at + chrono::Duration::seconds(i64::from(PAUSE));
    wait_until(
        "the rest opens",
        Duration::from_secs(u64::from(PAUSE) + 30),
        async || {
            for ns in &rest {
                match shared_v(&t, ns).await? {
                    (v, _) if v == "2" => {}
                    (v, _) => return Err(format!("{ns} at v={v}")),
                }
            }
            Ok(())
        },
    )
    .await;
    let seen = chrono::Utc::now();
    assert!(
        seen >= deadline,
        "the rest got v=2 at {seen}, before the pause's deadline {deadline}"
    );
}

/// The leader killed while the canary's writes are half done (its writes
/// slowed to 4 a second): the new leader finishes the canary, and writes
/// the rest only after every canary copy holds the new content (each
/// copy's resourceVersion, from one etcd, orders the writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_halfway_through_a_stage_leaves_the_new_one_to_finish_it_first() {
    let t = TestNs::new("leader-rollout-kill").await;
    let op = t.ns("op").await;
    let mut canary = Vec::new();
    for i in 1..=12 {
        canary.push(t.ns(&format!("tz{i:02}")).await);
    }
    let rest = vec![t.ns("ta1").await];
    let lease = format!("rollout-{}", random5());
    let slow = [("API_QPS", "4"), ("API_BURST", "1")];
    let mut ops: Vec<Operator> = (0..2).map(|_| replica(&t, &op, &lease, &slow)).collect();
    for o in &mut ops {
        o.wait_ready().await;
    }
    t.create_source(CM, &op, "shared", &[], &[("v", "1")]).await;
    t.create_rule(&op, "r", staged_rule(&t, 0)).await;
    wait_all_at(&t, &[canary.clone(), rest.clone()].concat(), "1").await;
    t.wait_rule_ready(&op, "r").await;
    let leader = wait_one_leader(&t, &ops, &op, &lease).await;

    t.set_data(CM, &op, "shared", &[("v", Some("2"))]).await;
    let written = wait_until("some of the canary written", TIMEOUT, async || {
        let mut at_v2 = 0;
        for ns in &canary {
            if shared_v(&t, ns).await?.0 == "2" {
                at_v2 += 1;
            }
        }
        match at_v2 {
            0 => Err("none yet".to_owned()),
            n => Ok(n),
        }
    })
    .await;
    ops[leader].crash();
    assert!(
        written < canary.len(),
        "the canary was written whole ({written}) before the leader was killed"
    );
    let canary_v2 = wait_all_at(&t, &canary, "2").await;
    let rest_v2 = wait_all_at(&t, &rest, "2").await;
    let last_canary = canary_v2.iter().max().copied().unwrap_or_default();
    assert!(
        rest_v2.iter().all(|v| *v > last_canary),
        "the rest was written (versions {rest_v2:?}) before the canary was done (last {last_canary})"
    );
}
