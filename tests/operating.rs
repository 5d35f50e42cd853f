//! Operating the operator: metrics, health probes, leader election with
//! takeover on SIGKILL and SIGTERM, graceful shutdown, and JSON logs.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

/// A metric's value: the sum over every series whose name and labels start
/// with `series` (e.g. `copyrator_api_writes_total{verb="create"`).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metrics(operator: &Operator) -> String {
    match http_get(operator.port, "/metrics").await {
        Ok((200, body)) => body,
        other => panic!("GET /metrics: {other:?}"),
    }
}

fn signal(operator: &Operator, name: &str) {
    let pid = operator.pid().expect("the operator runs").to_string();
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{name} {pid}");
}

/// Wait for the child to exit; its exit status and how long it took.
fn wait_exit(operator: &mut Operator, within: Duration) -> (std::process::ExitStatus, Duration) {
    let start = Instant::now();
    while start.elapsed() < within {
        if let Some(status) = operator.try_exit() {
            return (status, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "the operator did not exit within {within:?}; log:\n{}",
        operator.logs()
    );
}

#[tokio::test]
async fn metrics_expose_every_family_and_move() {
    let t = TestNs::new("metrics").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    let before = metrics(&operator).await;
    for family in [
        "copyrator_reconcile_duration_seconds_count",
        "copyrator_copies_managed",
        "copyrator_conflicts_skipped",
        "copyrator_queue_depth",
        "copyrator_leader 1",
    ] {
        assert!(before.contains(family), "{family} missing:\n{before}");
    }

    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(&op, "s", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let cm = t.create_source(CM, &op, "cm", &[], &[("k", "v")]).await;
    let secret = t
        .create_source(SECRET, &op, "sec", &[], &[("k", "v")])
        .await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &cm, &op, "r").await;
        t.wait_copy(SECRET, ns, &secret, &op, "s").await;
    }
    t.set_data(CM, &op, "cm", &[("k", Some("v2"))]).await;
    for ns in [&t1, &t2] {
        t.wait_obj(CM, ns, "cm", "the change propagated", |o| {
            o.data_is(&[("k", "v2")])
        })
        .await;
    }
    t.wait_rule_ready(&op, "r").await;

    let after = wait_until(
        "copies_managed to count the 4 copies",
        TIMEOUT,
        async || {
            let text = metrics(&operator).await;
            if metric(&text, "copyrator_copies_managed") == 4.0 {
                Ok(text)
            } else {
                Err(text
                    .lines()
                    .filter(|l| l.starts_with("copyrator_copies"))
                    .collect::<Vec<_>>()
                    .join("; "))
            }
        },
    )
    .await;
    for family in [
        "copyrator_reconciles_total{result=\"success\"}",
        "copyrator_reconcile_duration_seconds_bucket",
        "copyrator_reconcile_duration_seconds_sum",
        "copyrator_api_writes_total{verb=\"create\",kind=\"ConfigMap\"}",
        "copyrator_api_writes_total{verb=\"create\",kind=\"Secret\"}",
        "copyrator_api_writes_total{verb=\"update\",kind=\"ConfigMap\"}",
        "copyrator_api_writes_total{verb=\"patch\",kind=\"CopyratorRule\"}",
        "copyrator_conflicts_skipped 0",
        "copyrator_queue_depth",
        "copyrator_leader 1",
    ] {
        assert!(after.contains(family), "{family} missing:\n{after}");
    }
    let moved = |series: &str| metric(&after, series) - metric(&before, series);
    assert_eq!(
        moved("copyrator_api_writes_total{verb=\"create\",kind=\"ConfigMap\""),
        2.0
    );
    assert_eq!(
        moved("copyrator_api_writes_total{verb=\"create\",kind=\"Secret\""),
        2.0
    );
    assert_eq!(
        moved("copyrator_api_writes_total{verb=\"update\",kind=\"ConfigMap\""),
        2.0
    );
    assert!(moved("copyrator_reconciles_total{result=\"success\"") >= 2.0);
    assert!(moved("copyrator_reconcile_duration_seconds_count") >= 2.0);
}

#[tokio::test]
async fn readyz_waits_for_the_caches_and_healthz_does_not() {
    let t = TestNs::new("probes").await;
    let op = t.ns("op").await;
    // A kubeconfig whose server is a closed port: the loops run, nothing syncs.
    let admin = kube::config::Kubeconfig::read().expect("the admin kubeconfig");
    let mut dead = admin.clone();
    let closed = free_port();
    for cluster in &mut dead.clusters {
        if let Some(c) = cluster.cluster.as_mut() {
            c.server = Some(format!("https://127.0.0.1:{closed}"));
        }
    }
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{}-dead.kubeconfig", t.prefix));
    std::fs::write(
        &path,
        serde_yaml::to_string(&dead).expect("kubeconfig YAML"),
    )
    .expect("write kubeconfig");
    let path = path.to_string_lossy().into_owned();
    let mut unsynced = Operator::start_with_env(
        &t,
        vec!["run".into(), "--namespace".into(), op.clone()],
        &[("KUBECONFIG", &path)],
    );
    wait_until(
        "/healthz 200 without an API server",
        TIMEOUT,
        async || match http_get(unsynced.port, "/healthz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert_for(
        "/readyz 503 while nothing is synced",
        Duration::from_secs(3),
        async || match http_get(unsynced.port, "/readyz").await {
            Ok((503, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    unsynced.assert_running();

    // Against the real API server it turns ready, after "caches synced".
    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    assert!(
        operator.logs().contains("caches synced"),
        "/readyz answered 200 before the caches synced:\n{}",
        operator.logs()
    );
    assert!(matches!(
        http_get(operator.port, "/healthz").await,
        Ok((200, _))
    ));
}

/// An operator in `op` that elects a leader on the Lease `lease` (6 s).
fn start_elected(t: &TestNs, op: &str, lease: &str) -> Operator {
    let args = [
        "run",
        "--namespace",
        op,
        "--leader-election",
        "--lease-name",
        lease,
        "--lease-duration",
        "6",
    ];
    Operator::start_with(t, args.iter().map(|s| s.to_string()).collect())
}

async fn leader_of(operators: &[&Operator]) -> Result<usize, String> {
    let mut leaders = Vec::new();
    let mut seen = Vec::new();
    for (i, operator) in operators.iter().enumerate() {
        let text = metrics(operator).await;
        let value = metric(&text, "copyrator_leader");
        seen.push(value);
        if value == 1.0 {
            leaders.push(i);
        }
    }
    match leaders.as_slice() {
        [one] => Ok(*one),
        _ => Err(format!("copyrator_leader per process: {seen:?}")),
    }
}

fn writes(text: &str) -> f64 {
    metric(text, "copyrator_api_writes_total")
}

#[tokio::test]
async fn one_leader_writes_and_a_killed_leader_is_replaced() {
    let t = TestNs::new("leader-kill").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let lease = format!("{}-lease", t.prefix);
    let mut a = start_elected(&t, &op, &lease);
    let mut b = start_elected(&t, &op, &lease);
    a.wait_ready().await;
    b.wait_ready().await;
    let leader = wait_until("exactly one leader", TIMEOUT, async || {
        leader_of(&[&a, &b]).await
    })
    .await;

    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let source = t.create_source(CM, &op, "cm", &[], &[("k", "v1")]).await;
    t.wait_copy(CM, &t1, &source, &op, "r").await;
    t.wait_rule_ready(&op, "r").await;
    let (leading, standby) = if leader == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let standby_writes = writes(&metrics(standby).await);
    assert_eq!(
        standby_writes,
        0.0,
        "the standby wrote:\n{}",
        metrics(standby).await
    );
    assert!(writes(&metrics(leading).await) > 0.0);
    // The standby's caches are warm: it is ready.
    assert!(matches!(
        http_get(standby.port, "/readyz").await,
        Ok((200, _))
    ));

    leading.crash();
    let killed = Instant::now();
    t.set_data(CM, &op, "cm", &[("k", Some("v2"))]).await;
    wait_until(
        "the standby converges the change after the leader's SIGKILL",
        Duration::from_secs(6 + 15),
        async || match t.try_get(CM, &t1, "cm").await? {
            Some(copy) => copy.data_is(&[("k", "v2")]),
            None => Err("no copy".into()),
        },
    )
    .await;
    println!(
        "takeover after SIGKILL: change converged {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(metric(&metrics(standby).await, "copyrator_leader"), 1.0);
}

#[tokio::test]
async fn sigterm_releases_the_lease_for_a_near_immediate_takeover() {
    let t = TestNs::new("leader-term").await;
    let op = t.ns("op").await;
    let lease = format!("{}-lease", t.prefix);
    let mut a = start_elected(&t, &op, &lease);
    let mut b = start_elected(&t, &op, &lease);
    a.wait_ready().await;
    b.wait_ready().await;
    let leader = wait_until("exactly one leader", TIMEOUT, async || {
        leader_of(&[&a, &b]).await
    })
    .await;
    let (leading, standby) = if leader == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };

    signal(leading, "TERM");
    let (status, took) = wait_exit(leading, Duration::from_secs(10));
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        leading.logs()
    );
    let exited = Instant::now();
    wait_until(
        "the standby to lead within 5 s of the release",
        Duration::from_secs(5),
        async || {
            let value = metric(&metrics(standby).await, "copyrator_leader");
            if value == 1.0 {
                Ok(())
            } else {
                Err(format!("copyrator_leader {value}"))
            }
        },
    )
    .await;
    println!(
        "SIGTERM: leader exited in {took:?}; standby led {:?} after the exit",
        exited.elapsed()
    );
    assert!(
        leading.logs().contains("released the Lease"),
        "log:\n{}",
        leading.logs()
    );
}

async fn shutdown_within_deadline(sig: &str, during_burst: bool, test: &str) {
    let t = TestNs::new(test).await;
    let op = t.ns("op").await;
    let mut targets = Vec::new();
    for i in 0..if during_burst { 8 } else { 1 } {
        targets.push(t.ns(&format!("t{i}")).await);
    }
    let mut sources = Vec::new();
    if during_burst {
        for i in 0..15 {
            sources.push(
                t.create_source(CM, &op, &format!("cm{i}"), &[], &[("i", "x")])
                    .await,
            );
        }
    }
    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    if during_burst {
        t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
            .await;
        // Stop while it writes 120 copies.
        wait_until("the first copy", TIMEOUT, async || {
            match t.try_get(CM, &targets[0], "cm0").await? {
                Some(_) => Ok(()),
                None => Err("none yet".into()),
            }
        })
        .await;
    }
    signal(&operator, sig);
    let (status, took) = wait_exit(&mut operator, Duration::from_secs(10));
    assert!(
        status.success(),
        "{sig}: exit status {status}; log:\n{}",
        operator.logs()
    );
    println!("{sig} (burst: {during_burst}): exited in {took:?}");

    if during_burst {
        // A new operator finishes the job: every copy there, none twice.
        let _next = Operator::start(&t, &op, &[]);
        for ns in &targets {
            for source in &sources {
                t.wait_copy(CM, ns, source, &op, "r").await;
            }
        }
        let uid = t.rule_uid(&op, "r").await;
        let copies = t.list_labelled(CM, LABEL_RULE_UID, &uid).await;
        assert_eq!(copies.len(), targets.len() * sources.len());
    }
}

#[tokio::test]
async fn sigterm_when_idle_exits_cleanly() {
    shutdown_within_deadline("TERM", false, "term-idle").await;
}

#[tokio::test]
async fn sigint_when_idle_exits_cleanly() {
    shutdown_within_deadline("INT", false, "int-idle").await;
}

#[tokio::test]
async fn sigterm_during_a_burst_exits_in_time_and_nothing_is_lost() {
    shutdown_within_deadline("TERM", true, "term-burst").await;
}

#[tokio::test]
async fn json_logs_are_json_and_name_rule_source_and_target() {
    let t = TestNs::new("json-logs").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let source = t.create_source(CM, &op, "cm", &[], &[("k", "v")]).await;
    let operator = Operator::start(&t, &op, &["--log-format", "json", "--log-level", "debug"]);
    t.wait_copy(CM, &t1, &source, &op, "r").await;
    let logs = operator.logs();
    let mut write_lines = 0;
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if value["message"] == "wrote copy" {
            write_lines += 1;
            let expected = json!({
                "rule": format!("{op}/r"),
                "source": format!("{op}/cm"),
                "namespace": t1,
                "name": "cm",
                "action": "create",
            });
            for (key, want) in expected.as_object().into_iter().flatten() {
                assert_eq!(&value[key], want, "field {key} of {line}");
            }
            assert_eq!(
                value["span"]["rule"],
                format!("{op}/r"),
                "the reconcile span: {line}"
            );
        }
    }
    assert_eq!(write_lines, 1, "one line per write:\n{logs}");
}
