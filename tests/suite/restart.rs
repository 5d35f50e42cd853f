//! "The operator restarts or its watch breaks: converges from the cluster's
//! state alone; no copy is lost or duplicated" — and a resync of a state that
//! is already right writes nothing.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use serde_json::json;

const CM: Kind = Kind::ConfigMap;
const SECRET: Kind = Kind::Secret;

#[tokio::test]
async fn restart_converges_from_cluster_state_alone() {
    let t = TestNs::new("restart").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let a = t.create_source(CM, &op, "a", &[], &[("k", "a")]).await;
    t.create_source(CM, &op, "b", &[], &[("k", "b1")]).await;
    let d = t.create_source(CM, &op, "d", &[], &[("k", "d")]).await;
    for ns in [&t1, &t2] {
        for s in [&a, &d] {
            t.wait_copy(CM, ns, s, &op, "r").await;
        }
    }
    let kept = t.must_get(CM, &t2, "a").await;
    let rule_uid = t.rule_uid(&op, "r").await;

    // The operator dies without notice; the cluster changes meanwhile.
    operator.crash();
    t.delete(CM, &t1, "a").await; // a copy deleted by someone
    let b = t.set_data(CM, &op, "b", &[("k", Some("b2"))]).await; // a source changed
    t.delete(CM, &op, "d").await; // a source deleted: its copies are orphans now
    let c = t.create_source(CM, &op, "c", &[], &[("k", "c")]).await; // a new source
    let t3 = t.ns("t3").await; // a new namespace

    let _operator = Operator::start(&t, &op, &[]);
    for ns in [&t1, &t2, &t3] {
        for s in [&a, &b, &c] {
            t.wait_copy(CM, ns, s, &op, "r").await;
        }
    }
    for ns in [&t1, &t2] {
        t.wait_gone(
            CM,
            ns,
            "d",
            "its source was deleted while the operator was down",
        )
        .await;
    }
    let now = t.must_get(CM, &t2, "a").await;
    assert_eq!(
        now.uid, kept.uid,
        "a copy that was right was recreated on restart"
    );

    let copies = t.list_labelled(CM, LABEL_RULE_UID, &rule_uid).await;
    let mut names: Vec<String> = copies
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect();
    names.sort();
    let mut want: Vec<String> = [&t1, &t2, &t3]
        .iter()
        .flat_map(|ns| ["a", "b", "c"].map(|n| format!("{ns}/{n}")))
        .collect();
    want.sort();
    assert_eq!(names, want, "the copies of the rule after the restart");

    t.wait_rule(&op, "r", "Ready with 3 sources, 3 targets, 9 copies", |r| {
        is_ready(r)?;
        let got = (
            status_u64(r, "sources"),
            status_u64(r, "targetNamespaces"),
            status_u64(r, "copies"),
        );
        if got == (Some(3), Some(3), Some(9)) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
}

/// resourceVersion (and managedFields) of the rules, the sources and every copy.
async fn snapshot(t: &TestNs, op: &str, rules: &[(&str, Kind)]) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    for (name, kind) in rules {
        let rule = t.get_rule(op, name).await;
        s.insert(
            format!("rule {op}/{name}"),
            format!(
                "rv {} status {}",
                rule["metadata"]["resourceVersion"], rule["status"]
            ),
        );
        let uid = rule["metadata"]["uid"].as_str().unwrap().to_string();
        for o in t.list_labelled(*kind, LABEL_RULE_UID, &uid).await {
            s.insert(
                format!("{kind:?} {}/{}", o.namespace, o.name),
                format!(
                    "rv {} managedFields {:?}",
                    o.resource_version, o.managed_fields
                ),
            );
        }
        for o in t.list_labelled(*kind, TEST_LABEL, &t.prefix).await {
            if !o.is_copy() {
                s.insert(
                    format!("source {kind:?} {}/{}", o.namespace, o.name),
                    format!(
                        "rv {} managedFields {:?}",
                        o.resource_version, o.managed_fields
                    ),
                );
            }
        }
    }
    s
}

fn diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Result<(), String> {
    let mut out = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => out.push(format!("{k}: deleted (was {v})")),
            Some(w) if w != v => out.push(format!("{k}:\n    before {v}\n    after  {w}")),
            _ => {}
        }
    }
    for (k, v) in after {
        if !before.contains_key(k) {
            out.push(format!("{k}: created ({v})"));
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(format!("{} writes:\n  {}", out.len(), out.join("\n  ")))
    }
}

#[tokio::test]
async fn resync_of_a_correct_state_writes_nothing() {
    let t = TestNs::new("zero-writes").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "rc", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(&op, "rs", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let mut first = Operator::start(&t, &op, &[]);
    let a = t.create_source(CM, &op, "a", &[], &[("k", "a")]).await;
    let b = t
        .create_json(
            CM,
            &op,
            "b",
            json!({
                "metadata": {"labels": {TEST_LABEL: t.prefix}, "annotations": {"note": "n"}},
                "data": {"k": "b"},
                "binaryData": {"bin": b64(b"\x00\x01")},
            }),
        )
        .await;
    let s = t
        .create_source(SECRET, &op, "s", &[("team", "x")], &[("password", "p")])
        .await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &a, &op, "rc").await;
        t.wait_copy(CM, ns, &b, &op, "rc").await;
        t.wait_copy(SECRET, ns, &s, &op, "rs").await;
    }
    t.wait_rule(&op, "rc", "Ready with 4 copies", |r| {
        is_ready(r)?;
        if status_u64(r, "copies") == Some(4) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
    t.wait_rule(&op, "rs", "Ready with 2 copies", |r| {
        is_ready(r)?;
        if status_u64(r, "copies") == Some(2) {
            Ok(())
        } else {
            Err(short_status(r))
        }
    })
    .await;
    let rules = [("rc", CM), ("rs", SECRET)];

    // Let the first operator settle: nothing changes for 3 s.
    let mut last = snapshot(&t, &op, &rules).await;
    let mut stable_since = std::time::Instant::now();
    wait_until(
        "the first operator to settle (no writes for 3 s)",
        Duration::from_secs(60),
        async || {
            let now = snapshot(&t, &op, &rules).await;
            if now != last {
                last = now;
                stable_since = std::time::Instant::now();
            }
            if stable_since.elapsed() >= Duration::from_secs(3) {
                Ok(())
            } else {
                Err(format!("{last:?}"))
            }
        },
    )
    .await;
    first.stop();

    // A new operator with a 2 s resync finds everything right: zero writes.
    let before = snapshot(&t, &op, &rules).await;
    // 2 rules, 3 sources, 6 copies: the snapshot sees everything it must.
    assert_eq!(before.len(), 11, "snapshot: {before:#?}");
    let mut second = Operator::start(&t, &op, &["--resync-interval", "2"]);
    second.wait_ready().await;
    let resyncs_before = resyncs(&second, "interval").await;
    assert_for(
        "no write by a restarted operator over ~4 resyncs of a correct state",
        Duration::from_secs(8),
        async || diff(&before, &snapshot(&t, &op, &rules).await),
    )
    .await;
    // The window saw resyncs: what it proves rests on them.
    let resyncs_after = resyncs(&second, "interval").await;
    assert!(
        resyncs_after >= resyncs_before + 2.0,
        "only {} resyncs ran in the window (from {resyncs_before} to {resyncs_after})",
        resyncs_after - resyncs_before
    );
    second.assert_running();

    // The second operator was live all along: it puts back a deleted copy.
    t.delete(CM, &t1, "a").await;
    t.wait_copy(CM, &t1, &a, &op, "rc").await;
}

#[tokio::test]
async fn rule_deleted_while_the_operator_is_down_is_cleaned_up_on_restart() {
    let t = TestNs::new("deleted-while-down").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(SECRET, t.selector(), &[t.glob("t")]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let s = t.create_source(SECRET, &op, "s", &[], &[("k", "v")]).await;
    t.wait_copy(SECRET, &t1, &s, &op, "r").await;
    let uid = t.rule_uid(&op, "r").await;
    operator.crash();

    t.delete_rule(&op, "r").await;
    // The finalizer holds the rule while no operator runs.
    assert_for(
        "the rule to be held by its finalizer",
        QUIET,
        async || match t.try_get_rule(&op, "r").await? {
            Some(_) => Ok(()),
            None => Err("the rule is gone with no operator running".into()),
        },
    )
    .await;
    let _operator = Operator::start(&t, &op, &[]);
    t.wait_rule_gone(&op, "r", "the restarted operator cleans up")
        .await;
    assert!(
        t.get(SECRET, &t1, "s").await.is_none(),
        "copy left after the cleanup"
    );
    assert!(
        t.list_labelled(SECRET, LABEL_RULE_UID, &uid)
            .await
            .is_empty()
    );
}

/// A rule that vanished without its finalizer (force-deleted: the
/// finalizer removed by hand while no operator ran) leaves copies that
/// nobody owns: the next operator collects them by the rule-UID label at
/// start. Copies of a rule this operator is not responsible for (another
/// namespace's operator) are left alone.
#[tokio::test]
async fn copies_of_a_force_deleted_rule_are_collected_at_start() {
    let t = TestNs::new("force-deleted").await;
    let op = t.ns("op").await;
    let other_op = t.ns("other").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    t.create_rule(&other_op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let mut operator = Operator::start(&t, &op, &[]);
    let mut other = Operator::start(&t, &other_op, &[]);
    let s = t.create_source(CM, &op, "s", &[], &[("k", "v")]).await;
    let o = t
        .create_source(CM, &other_op, "o", &[], &[("k", "v")])
        .await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &s, &op, "r").await;
        t.wait_copy(CM, ns, &o, &other_op, "r").await;
    }
    let uid = t.rule_uid(&op, "r").await;
    let other_uid = t.rule_uid(&other_op, "r").await;
    operator.crash();
    other.crash();

    // Force-deleted: the finalizer stripped, the rule gone.
    t.patch_rule(&op, "r", json!({"metadata": {"finalizers": null}}))
        .await;
    t.delete_rule(&op, "r").await;
    t.wait_rule_gone(&op, "r", "force-deleted").await;
    assert_eq!(
        t.list_labelled(CM, LABEL_RULE_UID, &uid).await.len(),
        2,
        "the copies outlive the force-deleted rule while no operator runs"
    );

    let _operator = Operator::start(&t, &op, &[]);
    wait_collected(&t, &uid).await;
    // The other operator's rule is alive but its operator is down: its copies stay.
    assert_for(
        "the other operator's copies to stay",
        QUIET,
        async || match t.list_labelled(CM, LABEL_RULE_UID, &other_uid).await.len() {
            2 => Ok(()),
            n => Err(format!("{n} copies of the other rule")),
        },
    )
    .await;
}

/// The operator's resident memory in KiB and its open sockets, from /proc.
fn process_footprint(operator: &Operator) -> (u64, usize) {
    let pid = operator.pid().expect("the operator runs");
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status");
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("reading /proc fd")
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
        })
        .count();
    (rss, sockets)
}

/// `copyrator_resyncs_total{cause}`: passes over every rule so far.
async fn resyncs(operator: &Operator, cause: &str) -> f64 {
    gauge(
        operator,
        &format!("copyrator_resyncs_total{{cause=\"{cause}\"}}"),
    )
    .await
}

/// Rule `op/r` copies a source into t1 and t2 (an operator runs); returns
/// the rule's UID.
async fn rule_with_two_copies(t: &TestNs, op: &str) -> String {
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    t.create_rule(op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let s = t.create_source(CM, op, "s", &[], &[("k", "v")]).await;
    for ns in [&t1, &t2] {
        t.wait_copy(CM, ns, &s, op, "r").await;
    }
    t.rule_uid(op, "r").await
}

/// Strips the rule's finalizer and deletes it: its copies have no owner.
async fn force_delete(t: &TestNs, op: &str) {
    t.patch_rule(op, "r", json!({"metadata": {"finalizers": null}}))
        .await;
    t.delete_rule(op, "r").await;
    t.wait_rule_gone(op, "r", "force-deleted").await;
}

/// Waits until no copy of the rule of `uid` is left.
async fn wait_collected(t: &TestNs, uid: &str) {
    wait_until(
        "the copies of the force-deleted rule to be collected",
        TIMEOUT,
        async || match t.list_labelled(CM, LABEL_RULE_UID, uid).await.len() {
            0 => Ok(()),
            n => Err(format!("{n} copies left")),
        },
    )
    .await;
}

/// The operator's JSON log line saying it collected `deleted` orphans for
/// `cause`.
fn collected(operator: &Operator, cause: &str, deleted: u64) -> Result<(), String> {
    let lines = operator.json_log();
    let found = lines.iter().any(|l| {
        l.message == "collected the copies of rules that are gone"
            && l.str("cause") == Some(cause)
            && l.u64("deleted") == Some(deleted)
    });
    if found {
        Ok(())
    } else {
        let said: Vec<String> = lines
            .iter()
            .filter(|l| l.message == "collected the copies of rules that are gone")
            .map(|l| format!("{:?}", l.fields))
            .collect();
        Err(format!("no such line; collections logged: {said:?}"))
    }
}

/// A rule force-deleted while the operator is paused (SIGSTOP: a running
/// operator would put its finalizer back, or clean up as the rule goes):
/// resumed, it learns the rule is gone, and its copies are collected by the
/// next resync (the operator's log says so, with that cause).
#[tokio::test]
async fn copies_of_a_rule_force_deleted_under_a_paused_operator_are_collected_on_resync() {
    let t = TestNs::new("orphans-resync").await;
    let op = t.ns("op").await;
    let operator = Operator::start(&t, &op, &["--resync-interval", "3", "--log-format", "json"]);
    let uid = rule_with_two_copies(&t, &op).await;
    common::faults::signal(&operator, "STOP");
    force_delete(&t, &op).await;
    common::faults::signal(&operator, "CONT");
    wait_collected(&t, &uid).await;
    wait_until(
        "the log to say a resync collected them",
        TIMEOUT,
        async || collected(&operator, "interval", 2),
    )
    .await;
}

/// A rule force-deleted while its leader is down: the standby collects its
/// copies when it takes the Lease (its log says so, with that cause), not
/// only at its own start.
#[tokio::test]
async fn copies_of_a_rule_force_deleted_while_no_leader_runs_are_collected_on_taking_the_lease() {
    let t = TestNs::new("orphans-lease").await;
    let op = t.ns("op").await;
    let lease = format!("{}-lease", t.prefix);
    let flags = [
        "--leader-election",
        "--lease-name",
        &lease,
        "--lease-duration",
        "4",
        "--log-format",
        "json",
    ];
    let mut leader = Operator::start(&t, &op, &flags);
    leader.wait_ready().await;
    let uid = rule_with_two_copies(&t, &op).await;
    let mut standby = Operator::start(&t, &op, &flags);
    standby.wait_ready().await;
    leader.crash();
    force_delete(&t, &op).await;
    wait_collected(&t, &uid).await;
    wait_until(
        "the standby's log to say it collected them on taking the Lease",
        TIMEOUT,
        async || collected(&standby, "leading", 2),
    )
    .await;
}

/// The image's MALLOC_ARENA_MAX (Dockerfile).
const IMAGE_ARENAS: &str = "2";

/// The value of an unlabelled gauge on the operator's /metrics.
async fn gauge(operator: &Operator, name: &str) -> f64 {
    let (code, body) = http_get(operator.port, "/metrics")
        .await
        .expect("GET /metrics");
    assert_eq!(code, 200, "/metrics: {body}");
    body.lines()
        .find_map(|l| {
            let (series, value) = l.split_once(' ')?;
            (series == name).then(|| value.trim().parse::<f64>().ok())?
        })
        .unwrap_or_else(|| panic!("no gauge {name} on /metrics"))
}

/// Rules come and go by the hundred: everything held per rule (its source
/// watch, its state, its gauges) is released when it goes. After each
/// round gauges are back at zero and the sockets at their count before;
/// two rounds warm the allocator, and after the third memory is where the
/// second left it: a leak of 40 KiB a rule would add 4 MiB a round. The
/// operator runs with glibc's arenas capped as the image caps them
/// (Dockerfile: MALLOC_ARENA_MAX; every tested operator does): uncapped,
/// freed memory kept in the arenas of short-lived threads grew the RSS by
/// up to 4.4 MiB a round while the live heap stayed near 2 MiB.
#[tokio::test]
async fn everything_held_for_a_rule_is_released_when_it_goes() {
    const RULES: usize = 100;
    let t = TestNs::new("rules-churn").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    assert!(
        image_env().contains(&("MALLOC_ARENA_MAX", IMAGE_ARENAS)),
        "the Dockerfile no longer caps the arenas at {IMAGE_ARENAS}"
    );
    // Every tested operator runs with the image's environment.
    let mut operator = Operator::start(&t, &op, &[]);
    operator.wait_ready().await;
    let (_, sockets_at_start) = process_footprint(&operator);
    let mut rss_after_round = Vec::new();
    for round in 0..3 {
        for i in 0..RULES {
            let selector = json!({ TEST_LABEL: format!("{}-r{i}", t.prefix) });
            t.create_rule(
                &op,
                &format!("r{round}-{i}"),
                rule_spec(CM, selector, &[t.glob("t")]),
            )
            .await;
        }
        for i in 0..RULES {
            let labels = [(TEST_LABEL, format!("{}-r{i}", t.prefix))];
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            t.create_plain(CM, &op, &format!("s{round}-{i}"), &labels, &[("k", "v")])
                .await;
        }
        wait_until(
            format!("round {round}: {} copies", RULES * 2),
            Duration::from_secs(120),
            async || {
                let n = gauge(&operator, "copyrator_copies_managed").await as usize;
                if n == RULES * 2 {
                    Ok(())
                } else {
                    Err(format!("{n} copies managed"))
                }
            },
        )
        .await;
        let (rss_full, sockets_full) = process_footprint(&operator);
        for i in 0..RULES {
            t.delete_rule(&op, &format!("r{round}-{i}")).await;
        }
        for i in 0..RULES {
            t.wait_rule_gone(&op, &format!("r{round}-{i}"), "its finalizer ran")
                .await;
        }
        for ns in [&t1, &t2] {
            wait_until(
                format!("round {round}: no copies left in {ns}"),
                TIMEOUT,
                async || match t
                    .list_labelled(CM, LABEL_MANAGED_BY, "copyrator")
                    .await
                    .iter()
                    .filter(|o| o.namespace == *ns)
                    .count()
                {
                    0 => Ok(()),
                    n => Err(format!("{n} copies")),
                },
            )
            .await;
        }
        let gauges = wait_until(
            format!("round {round}: gauges back at zero"),
            TIMEOUT,
            async || {
                let values = (
                    gauge(&operator, "copyrator_copies_managed").await,
                    gauge(&operator, "copyrator_conflicts_skipped").await,
                    gauge(&operator, "copyrator_copies_contested").await,
                    gauge(&operator, "copyrator_queue_depth").await,
                );
                if values == (0.0, 0.0, 0.0, 0.0) {
                    Ok(values)
                } else {
                    Err(format!("{values:?}"))
                }
            },
        )
        .await;
        let (sockets_after, rss_after) = wait_until(
            format!("round {round}: the source watches closed"),
            TIMEOUT,
            async || {
                let (rss, sockets) = process_footprint(&operator);
                if sockets <= sockets_at_start + 2 {
                    Ok((sockets, rss))
                } else {
                    Err(format!(
                        "{sockets} sockets open, {sockets_at_start} at start"
                    ))
                }
            },
        )
        .await;
        println!(
            "rules-churn round {round}: {RULES} rules: {rss_full} KiB and {sockets_full} sockets with them; \
             after they went: {rss_after} KiB, {sockets_after} sockets ({sockets_at_start} at start), gauges {gauges:?}"
        );
        rss_after_round.push(rss_after);
        for i in 0..RULES {
            t.delete(CM, &op, &format!("s{round}-{i}")).await;
        }
    }
    let grown = rss_after_round[2].saturating_sub(rss_after_round[1]);
    assert!(
        grown <= 4 * 1024,
        "memory grew by {grown} KiB over a third round of {RULES} rules created and deleted \
         (after each round: {rss_after_round:?} KiB)"
    );
    operator.assert_running();
}
