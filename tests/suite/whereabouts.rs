//! `copyrator where NAMESPACE/NAME`: every copy of a source, at home and in
//! a member cluster, with its state read from the live clusters, and the
//! exit code that says whether all are current; also as a kubectl plugin
//! (`kubectl copyrator where ...`). A home control plane and one member
//! (`COPYRATOR_MEMBERS`, see tests/common/members.rs).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::members::{Member, OUTAGE, members};
use crate::common::*;
use serde_json::{Value, json};

const CM: Kind = Kind::ConfigMap;
const CONVERGE: Duration = Duration::from_secs(30);

/// Runs `<program> <args>` (the binary, or `kubectl` with `path_first`
/// ahead on the PATH), killed after [`PLAN_DEADLINE`].
async fn run(program: &str, args: &[&str], path_first: Option<&Path>) -> PlanOutcome {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in OPERATOR_ENV {
        command.env_remove(var);
    }
    if let Some(dir) = path_first {
        let path = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("{}:{path}", dir.display()));
    }
    let output = tokio::time::timeout(PLAN_DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} did not finish within {PLAN_DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("running {program} {args:?}: {e}"));
    PlanOutcome {
        args: args.iter().map(|a| a.to_string()).collect(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `copyrator where <args>`.
pub(crate) async fn copyrator_where(args: &[&str]) -> PlanOutcome {
    let mut all = vec!["where"];
    all.extend(args);
    run(bin(), &all, None).await
}

/// `(cluster, namespace, state)` of each copy in the JSON report, in its order.
fn states(report: &Value) -> Vec<(String, String, String)> {
    report["copies"]
        .as_array()
        .expect("copies")
        .iter()
        .map(|c| {
            let field = |name: &str| c[name].as_str().unwrap_or_default().to_owned();
            (field("cluster"), field("namespace"), field("state"))
        })
        .collect()
}

fn state(cluster: &str, ns: &str, state: &str) -> (String, String, String) {
    (cluster.into(), ns.into(), state.into())
}

async fn wait_member_copy(member: &Member, ns: &str, name: &str, data: &[(&str, &str)]) {
    wait_until(
        format!("{ns}/{name} in member {} with {data:?}", member.name),
        CONVERGE,
        async || {
            let copy = member
                .try_get(CM, ns, name)
                .await?
                .ok_or_else(|| "no copy yet".to_owned())?;
            if !copy.is_copy() {
                return Err("not labelled as a copy".into());
            }
            copy.data_is(data)
        },
    )
    .await;
}

#[tokio::test]
async fn where_lists_each_copy_at_home_and_in_a_member_and_says_which_are_current() {
    // Member a answers for the whole test (and its namespaces' cleanup).
    let _up = OUTAGE.read().await;
    let t = TestNs::new("where").await;
    let a = members().await.into_iter().next().expect("member a");
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let t2 = t.ns("t2").await;
    let t3 = t.ns("t3").await;
    let a_t1 = a.ns(&t, "t1").await;
    a.register(&t.client, &op, &[]).await;
    // t3 holds a foreign object of the name `taken` before any copy.
    t.create_plain(CM, &t3, "taken", &[], &[("mine", "x")])
        .await;
    let body = with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/targets/clusters",
        json!({"names": [a.name]}),
    );
    t.create_rule(&op, "r", body).await;
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v1")]).await;
    let taken = t.create_source(CM, &op, "taken", &[], &[("k", "v1")]).await;
    let mut operator = Operator::start(&t, &op, &["--member-clusters"]);
    for ns in [&t1, &t2, &t3] {
        t.wait_copy(CM, ns, &source, &op, "r").await;
    }
    t.wait_copy(CM, &t1, &taken, &op, "r").await;
    wait_member_copy(&a, &a_t1, "cfg", &[("k", "v1")]).await;
    t.wait_rule(
        &op,
        "r",
        "the conflict in its status",
        |rule| match status_u64(rule, "conflictCount") {
            Some(1) => Ok(()),
            other => Err(format!("conflictCount {other:?}")),
        },
    )
    .await;

    // All current: each listed in place, home and member; exit 0.
    let source_ref = format!("{op}/cfg");
    let args = ["--namespace", &op, "--member-clusters", "-o", "json"];
    let current = copyrator_where(&[&[source_ref.as_str()][..], &args[..]].concat()).await;
    current.assert_exit(0);
    let report = current.json();
    assert_eq!(
        states(&report),
        [
            state("home", &t1, "in place"),
            state("home", &t2, "in place"),
            state("home", &t3, "in place"),
            state(&a.name, &a_t1, "in place"),
        ],
        "{}",
        current.stdout
    );
    assert_eq!(report["source"], source_ref);
    assert_eq!(report["kind"], "ConfigMap");
    assert_eq!(report["rules"], json!([format!("{op}/r")]));
    // Every copy holds the source's content, and says so.
    let content = report["content"].as_str().expect("the source's content");
    assert_eq!(content.len(), 8, "{content}");
    assert_eq!(
        report["copies"][0],
        json!({"cluster": "home", "namespace": t1, "name": "cfg", "rule": format!("{op}/r"),
            "state": "in place", "current": true, "content": content})
    );
    assert!(
        report["copies"]
            .as_array()
            .expect("copies")
            .iter()
            .all(|c| c["content"] == content),
        "{}",
        current.stdout
    );
    assert_eq!(
        report["clusters"],
        json!([{"cluster": "home", "reached": true}, {"cluster": a.name, "reached": true}])
    );

    // A foreign object holding the name is a conflict, with why; exit 2.
    let taken_ref = format!("{op}/taken");
    let conflict = copyrator_where(&[taken_ref.as_str(), "--namespace", &op]).await;
    conflict.assert_exit(2);
    assert!(
        conflict.stdout.contains(&format!(
            "home: {t3}/taken conflict (rule {op}/r): a ConfigMap not made by Copyrator is there\n"
        )),
        "{}",
        conflict.stdout
    );
    assert!(
        conflict.stdout.contains(&format!(
            "home: {t1}/taken in place (rule {op}/r) [content "
        )),
        "{}",
        conflict.stdout
    );

    // The operator stopped and the source changed: every copy is stale; exit 2.
    operator.stop();
    t.set_data(CM, &op, "cfg", &[("k", Some("v2"))]).await;
    let stale = copyrator_where(&[&[source_ref.as_str()][..], &args[..]].concat()).await;
    stale.assert_exit(2);
    assert_eq!(
        states(&stale.json()),
        [
            state("home", &t1, "stale"),
            state("home", &t2, "stale"),
            state("home", &t3, "stale"),
            state(&a.name, &a_t1, "stale"),
        ],
        "{}",
        stale.stdout
    );
    let text = copyrator_where(&[source_ref.as_str(), "--namespace", &op]).await;
    text.assert_exit(2);
    let content = stale.json()["content"]
        .as_str()
        .expect("the source's content")
        .to_owned();
    assert_eq!(
        text.stdout.lines().last(),
        Some(
            format!("ConfigMap {source_ref} [content {content}]: 3 places, 0 current, 3 not")
                .as_str()
        ),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains("v2") && !text.stdout.contains("v1"));

    // A member that cannot be reached: a line that says so, and exit 1.
    let mut gone = a.clone();
    gone.name = "gone".into();
    let unreachable = a
        .kubeconfig_with_token("not-a-token")
        .replace(&a.server_and_ca().0, "https://127.0.0.1:9");
    gone.register_kubeconfig(&t.client, &op, &[], &unreachable)
        .await;
    let partial =
        copyrator_where(&[source_ref.as_str(), "--namespace", &op, "--member-clusters"]).await;
    partial.assert_exit(1);
    assert!(
        partial.stdout.contains("gone: not read: ")
            && partial
                .stdout
                .contains(&format!("{}: {a_t1}/cfg stale", a.name)),
        "{}",
        partial.stdout
    );
    assert!(
        partial.stderr.contains("cluster gone could not be read"),
        "{}",
        partial.stderr
    );
}

#[tokio::test]
async fn a_create_only_copy_is_shown_as_such_and_not_stale() {
    let t = TestNs::new("where-once").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    let body = with(
        rule_spec(CM, t.selector(), &[t.glob("t")]),
        "/spec/syncPolicy",
        json!("CreateOnly"),
    );
    t.create_rule(&op, "once", body).await;
    let source = t.create_source(CM, &op, "seed", &[], &[("k", "v1")]).await;
    let mut operator = Operator::start(&t, &op, &[]);
    t.wait_copy(CM, &t1, &source, &op, "once").await;
    operator.stop();
    // Its namespace owns it now: a changed source makes it no less current.
    t.set_data(CM, &op, "seed", &[("k", Some("v2"))]).await;
    let source_ref = format!("{op}/seed");
    let found = copyrator_where(&[source_ref.as_str(), "--namespace", &op]).await;
    found.assert_exit(0);
    // The copy holds v1, the source v2: two contents, each named.
    let report = copyrator_where(&[source_ref.as_str(), "--namespace", &op, "-o", "json"])
        .await
        .json();
    let (copy, now) = (&report["copies"][0]["content"], &report["content"]);
    assert_ne!(copy, now, "{report}");
    let (copy, now) = (copy.as_str().unwrap_or(""), now.as_str().unwrap_or(""));
    assert_eq!(
        found.stdout,
        format!(
            "home: {t1}/seed create-only (rule {op}/once) [content {copy}]\nConfigMap {source_ref} [content {now}]: 1 places, 1 current, 0 not\n"
        )
    );
    // Errors exit 1, usage errors too (clap's own 2 would say "not current").
    let missing = copyrator_where(&[&format!("{op}/nothing"), "--namespace", &op]).await;
    missing.assert_exit(1);
    assert!(
        missing
            .stderr
            .contains(&format!("ConfigMap {op}/nothing does not exist")),
        "{}",
        missing.stderr
    );
    copyrator_where(&["not-a-source"]).await.assert_exit(1);
    copyrator_where(&[]).await.assert_exit(1);
    copyrator_where(&["a/b", "-o", "yaml"]).await.assert_exit(1);
}

/// `where` as a user types it first, without `--namespace`: the copies
/// of a rule in the operator's namespace are said to be made by a rule
/// those flags do not follow, with the flag that would, and it exits 1 (a
/// usage problem), not 2 (copies not current). With that flag, all is
/// current.
#[tokio::test]
async fn copies_of_a_rule_the_flags_do_not_follow_say_which_flag_would() {
    let t = TestNs::new("where-flags").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "app", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let _operator = Operator::start(&t, &op, &[]);
    let source = t.create_source(CM, &op, "cfg", &[], &[("k", "v")]).await;
    t.wait_copy(CM, &t1, &source, &op, "app").await;
    let source_ref = format!("{op}/cfg");

    // No --namespace: the default, `default`.
    let found = copyrator_where(&[source_ref.as_str()]).await;
    found.assert_exit(1);
    let why = format!(
        "made by rule {op}/app, which --namespace default does not follow: pass --namespace {op}"
    );
    let line = found
        .stdout
        .lines()
        .find(|line| line.starts_with(&format!("home: {t1}/cfg ")))
        .unwrap_or_else(|| panic!("no line for {t1}/cfg:\n{}", found.stdout));
    assert!(
        line.contains("not followed") && line.ends_with(&why),
        "{line}"
    );
    let summary = found.stdout.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with(&format!("ConfigMap {source_ref} "))
            && summary.ends_with(&format!("; 1 {why}")),
        "{summary}"
    );
    let report = copyrator_where(&[source_ref.as_str(), "-o", "json"])
        .await
        .json();
    assert_eq!(
        states(&report),
        vec![state("home", &t1, "not followed")],
        "{report}"
    );

    copyrator_where(&[source_ref.as_str(), "--namespace", &op])
        .await
        .assert_exit(0);
}

#[tokio::test]
async fn kubectl_runs_it_as_the_copyrator_plugin() {
    let t = TestNs::new("where-kubectl").await;
    let op = t.ns("op").await;
    let t1 = t.ns("t1").await;
    t.create_rule(&op, "r", rule_spec(CM, t.selector(), &[t.glob("t")]))
        .await;
    let source = t.create_source(CM, &op, "plug", &[], &[("k", "v")]).await;
    let _operator = Operator::start(&t, &op, &[]);
    t.wait_copy(CM, &t1, &source, &op, "r").await;

    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("plugin-{}", t.prefix));
    std::fs::create_dir_all(&dir).expect("a directory for the plugin");
    let plugin = dir.join("kubectl-copyrator");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(bin(), &plugin).expect("a symlink named kubectl-copyrator");
    let source_ref = format!("{op}/plug");
    let found = run(
        "kubectl",
        &[
            "copyrator",
            "where",
            &source_ref,
            "--namespace",
            &op,
            "-o",
            "json",
        ],
        Some(&dir),
    )
    .await;
    found.assert_exit(0);
    assert_eq!(
        states(&found.json()),
        [state("home", &t1, "in place")],
        "{}",
        found.stdout
    );
    // Its help names it as kubectl does.
    let help = run("kubectl", &["copyrator", "where", "--help"], Some(&dir)).await;
    help.assert_exit(0);
    assert!(
        help.stdout.contains("Usage: kubectl copyrator where"),
        "{}",
        help.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}
