//! Copyrator's benchmark: drives a local control plane and the release
//! operator binary as a separate process, and prints each figure beside its
//! target. Run it through `hack/bench` (or `make bench`), which starts a
//! control plane of its own with an audit log.
//!
//! Copies are observed through a watch, never by polling lists. Requests
//! are counted from the API server's audit log, by the operator's own
//! identity (a ServiceAccount token), per phase. CPU time and connections
//! to the API server are read from the operator's `/proc` entries.
//!
//! At the end a run prints one line `BENCH-RESULT <json>` with its size,
//! every figure and every verdict, for `hack/bench-matrix`.
//!
//! With `--members` (from `hack/bench --clusters C`) it runs the cluster
//! mode instead: see `bench/clusters.rs`.

#[path = "bench/clusters.rs"]
mod clusters;
#[path = "bench/protection.rs"]
mod protection;
#[path = "../tests/common/sockets.rs"]
mod sockets;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

const OPERATOR_NS: &str = "bench-op";
const SOURCE_NS: &str = "bench-src";
const TARGET_PREFIX: &str = "bench-t-";
const NEW_PREFIX: &str = "bench-tn-";
const UNRELATED_NS: &str = "bench-unrelated";
const ACCOUNT: &str = "copyrator-bench";
const RULE_UID_LABEL: &str = "copyrator.flant.com/rule-uid";
/// Labels the plain client's objects (in place of the rule-UID label, which
/// would make them copies of a rule that does not exist).
const BASELINE_LABEL: &str = "bench-baseline.example.com/rule-uid";
/// A UID's length, for the plain client's objects' shape.
const STAND_IN_UID: &str = "00000000-0000-4000-8000-000000000000";
/// How many places the benchmark frees (see "freed places").
const FREED_PLACES: usize = 10;

struct Args {
    operator: PathBuf,
    audit_log: PathBuf,
    namespaces: usize,
    sources: usize,
    /// R rules, each with a source namespace of its own holding M sources,
    /// all targeting the same N namespaces: R×M×N copies.
    rules: usize,
    new_namespaces: usize,
    unrelated: usize,
    updates: usize,
    concurrency: usize,
    resync_seconds: u64,
    /// A smoke run: too small for its timings to mean anything, so a
    /// missed target is printed but does not fail the run.
    smoke: bool,
    /// The rules roll changes out in two stages: a canary of the first 10
    /// target namespaces, then the rest (`rollout.stages`, no pause).
    stages: bool,
    /// Member control planes: the cluster mode (see `bench/clusters.rs`).
    members: Vec<clusters::MemberArg>,
    /// Each rule is a tenant's, in its own source namespace, followed with
    /// `--all-namespaces`; the targets accept them (`accept-from`).
    tenants: bool,
    /// The tenant rules act as the ServiceAccount `copyrator` of their
    /// namespace (`--tenant-identity service-account`), which may read and
    /// write ConfigMaps everywhere (`edit`, bound to every ServiceAccount).
    impersonate: bool,
    /// The chart's copy protection (its policy and binding, rendered):
    /// update propagation is measured with and without it, alternating.
    copy_protection: Option<PathBuf>,
    /// Updates each way with and without it (default 600).
    protection_updates: Option<usize>,
    /// Where to write every one of them (`place,arm,ms`).
    protection_series: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        operator: PathBuf::from("target/x86_64-unknown-linux-gnu/release/copyrator"),
        audit_log: PathBuf::new(),
        namespaces: 500,
        sources: 20,
        rules: 1,
        new_namespaces: 20,
        unrelated: 10_000,
        updates: 10,
        concurrency: 16,
        resync_seconds: 15,
        smoke: false,
        stages: false,
        members: Vec::new(),
        tenants: false,
        impersonate: false,
        copy_protection: None,
        protection_updates: None,
        protection_series: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--operator" => args.operator = value()?.into(),
            "--audit-log" => args.audit_log = value()?.into(),
            "--namespaces" => args.namespaces = value()?.parse()?,
            "--sources" => args.sources = value()?.parse()?,
            "--rules" => args.rules = value()?.parse()?,
            "--new-namespaces" => args.new_namespaces = value()?.parse()?,
            "--unrelated" => args.unrelated = value()?.parse()?,
            "--updates" => args.updates = value()?.parse()?,
            "--write-concurrency" => args.concurrency = value()?.parse()?,
            "--resync-interval" => args.resync_seconds = value()?.parse()?,
            "--smoke" => args.smoke = true,
            "--stages" => args.stages = true,
            "--tenants" => args.tenants = true,
            "--impersonate" => {
                args.tenants = true;
                args.impersonate = true;
            }
            "--members" => args.members = clusters::parse_members(&value()?)?,
            "--copy-protection" => args.copy_protection = Some(value()?.into()),
            "--protection-updates" => args.protection_updates = Some(value()?.parse()?),
            "--protection-series" => args.protection_series = Some(value()?.into()),
            other => bail!("unknown flag {other}; see hack/bench"),
        }
    }
    ensure!(
        !args.audit_log.as_os_str().is_empty(),
        "--audit-log is required"
    );
    ensure!(args.rules >= 1, "--rules must be at least 1");
    ensure!(
        args.members.is_empty() || args.rules == 1,
        "--members runs one rule; leave --rules out"
    );
    ensure!(
        args.members.is_empty() || args.copy_protection.is_none(),
        "--copy-protection measures the home cluster alone; leave --members out"
    );
    ensure!(
        !args.tenants || (args.members.is_empty() && args.rules > 1),
        "--tenants and --impersonate run many rules (--rules) in one cluster"
    );
    Ok(args)
}

/// Names of the rules and their sources. One rule keeps the names it always
/// had (rule `bench`, sources `shared-03` in `bench-src`); with more, rule
/// `bench-r0042` copies `r0042-s03` from `bench-src-r0042`: source names are
/// unique across rules, so copies never collide.
#[derive(Clone, Copy)]
struct Layout {
    rules: usize,
}

impl Layout {
    fn rule_name(self, rule: usize) -> String {
        if self.rules == 1 {
            "bench".to_string()
        } else {
            format!("bench-r{rule:04}")
        }
    }

    fn source_namespace(self, rule: usize) -> String {
        if self.rules == 1 {
            SOURCE_NS.to_string()
        } else {
            format!("{SOURCE_NS}-r{rule:04}")
        }
    }

    fn source_name(self, rule: usize, source: usize) -> String {
        if self.rules == 1 {
            format!("shared-{source:02}")
        } else {
            format!("r{rule:04}-s{source:02}")
        }
    }

    /// The plain client's object standing for that source's copy.
    fn baseline_name(self, rule: usize, source: usize) -> String {
        if self.rules == 1 {
            format!("baseline-{source:02}")
        } else {
            format!("baseline-r{rule:04}-s{source:02}")
        }
    }
}

/// The copies seen through the benchmark's own watch: `(namespace, name)`
/// to the `version` key of their data, and every change in order, so that
/// a wait looks at what changed since it last looked, never at every copy
/// per event (a scan of 100,000 copies per event would take the CPU the
/// operator and the API server are measured with).
#[derive(Default)]
struct Copies {
    seen: Mutex<Seen>,
    changed: Notify,
}

type CopyKey = (String, String);

#[derive(Default)]
struct Seen {
    versions: HashMap<CopyKey, String>,
    /// Every change: the copy and its version (`None`: deleted).
    log: Vec<(CopyKey, Option<String>)>,
}

impl Copies {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn record(&self, key: CopyKey, version: Option<String>) {
        let mut seen = self.seen();
        match &version {
            Some(v) => seen.versions.insert(key.clone(), v.clone()),
            None => seen.versions.remove(&key),
        };
        seen.log.push((key, version));
    }

    /// Wait until `predicate` holds for `want` copies; the time it took.
    async fn wait_for(
        &self,
        want: usize,
        limit: Duration,
        predicate: impl Fn(&CopyKey, &str) -> bool,
    ) -> Result<Duration> {
        let start = Instant::now();
        // The copies that hold now, then only the changes after them.
        let (mut holding, mut read) = {
            let seen = self.seen();
            let holding: HashSet<CopyKey> = seen
                .versions
                .iter()
                .filter(|(k, v)| predicate(k, v))
                .map(|(k, _)| k.clone())
                .collect();
            (holding, seen.log.len())
        };
        loop {
            let notified = self.changed.notified();
            {
                let seen = self.seen();
                for (key, version) in &seen.log[read..] {
                    match version {
                        Some(v) if predicate(key, v) => holding.insert(key.clone()),
                        _ => holding.remove(key),
                    };
                }
                read = seen.log.len();
            }
            let have = holding.len();
            if have >= want {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                bail!("only {have} of {want} copies after {limit:?}");
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
    }
}

/// Set the `version` key of the source `namespace/name`.
async fn set_source_version(client: &Client, source: (&str, &str), version: &str) -> Result<()> {
    set_source_version_and_labels(client, source, version, &json!({})).await
}

/// [`set_source_version`], setting `labels` of the source in the same write.
async fn set_source_version_and_labels(
    client: &Client,
    (namespace, name): (&str, &str),
    version: &str,
    labels: &Value,
) -> Result<()> {
    let sources: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"metadata": {"labels": labels}, "data": {"version": version}});
    sources
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .context("updating a source")
}

/// Update a source to `version`: the time until `want` copies of it (by
/// its name) have it.
async fn propagate(
    client: &Client,
    copies: &Copies,
    source: (&str, &str),
    version: &str,
    want: usize,
) -> Result<Duration> {
    propagate_with_labels(client, copies, source, version, &json!({}), want).await
}

/// [`propagate`], setting `labels` of the source in the same write (its
/// copies carry them once they have the version).
async fn propagate_with_labels(
    client: &Client,
    copies: &Copies,
    source: (&str, &str),
    version: &str,
    labels: &Value,
    want: usize,
) -> Result<Duration> {
    let began = Instant::now();
    set_source_version_and_labels(client, source, version, labels).await?;
    copies
        .wait_for(want, Duration::from_secs(120), |(_, copy), v| {
            copy == source.1 && v == version
        })
        .await?;
    Ok(began.elapsed())
}

/// Follows the ConfigMaps carrying `label` into `copies`.
fn watch_copies(client: Client, copies: Arc<Copies>, label: &'static str) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<ConfigMap> = Api::all(client);
        let config = watcher::Config::default().labels(label);
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        loop {
            let event = match stream.try_next().await {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(e) => {
                    eprintln!("bench: copy watch error: {e}");
                    continue;
                }
            };
            let key = |cm: &ConfigMap| {
                (
                    cm.metadata.namespace.clone().unwrap_or_default(),
                    cm.metadata.name.clone().unwrap_or_default(),
                )
            };
            let version = |cm: &ConfigMap| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("version").cloned())
                    .unwrap_or_default()
            };
            match event {
                Event::Apply(cm) | Event::InitApply(cm) => {
                    copies.record(key(&cm), Some(version(&cm)));
                }
                Event::Delete(cm) => copies.record(key(&cm), None),
                Event::Init | Event::InitDone => continue,
            }
            copies.changed.notify_waiters();
        }
    })
}

/// The plain client's object standing for the copy of source `index`: the
/// copies' shape (as many labels and annotations, of the same lengths).
fn baseline_object(name: &str, origin: &str, index: usize, version: &str) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({
        // `bench: off`, not the sources' `bench: yes`: no rule selects it.
        "metadata": {"name": name,
                     "labels": {"bench": "off",
                                "app.kubernetes.io/managed-by": "bench",
                                BASELINE_LABEL: STAND_IN_UID},
                     "annotations": {"copyrator.flant.com/rule": format!("{OPERATOR_NS}/bench"),
                                     "copyrator.flant.com/source": origin,
                                     "copyrator.flant.com/source-uid": STAND_IN_UID}},
        "data": source_data(index, version),
    }))?)
}

fn source_data(index: usize, version: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("version".to_string(), version.to_string()),
        (
            "settings.yaml".to_string(),
            format!("source: {index}\nfeature: enabled\nlimit: 100\n"),
        ),
    ])
}

async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    create_namespace_with(client, name, json!({})).await
}

/// A namespace with these annotations.
async fn create_namespace_with(client: &Client, name: &str, annotations: Value) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating namespace {name}")),
    }
}

/// A target's annotations: with `--tenants`, it accepts every tenant's
/// copies (`bench-src-r0000` and on).
fn target_annotations(args: &Args) -> Value {
    if args.tenants {
        json!({"copyrator.flant.com/accept-from": format!("{SOURCE_NS}-*")})
    } else {
        json!({})
    }
}

/// With `--impersonate`: the ServiceAccount `copyrator` in each tenant's
/// namespace, and `edit` (read and write ConfigMaps) for every
/// ServiceAccount in every namespace, so that the tenants' rights decide
/// nothing and the run measures impersonation's own cost.
async fn tenant_accounts(client: &Client, namespaces: &[String], concurrency: usize) -> Result<()> {
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench-tenants-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "Group", "name": "system:serviceaccounts", "apiGroup": "rbac.authorization.k8s.io"}],
    }))?;
    match bindings.create(&PostParams::default(), &binding).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).context("binding edit to every ServiceAccount"),
    }
    in_parallel(namespaces.len(), concurrency, |i| {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespaces[i]);
        async move {
            let account: ServiceAccount =
                serde_json::from_value(json!({"metadata": {"name": "copyrator"}}))?;
            match accounts.create(&PostParams::default(), &account).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(e).context("creating a tenant's ServiceAccount"),
            }
        }
    })
    .await
}

/// Run `count` requests with `concurrency` in flight.
async fn in_parallel<F, Fut>(count: usize, concurrency: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let results: Vec<Result<()>> = futures::stream::iter(0..count)
        .map(f)
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

struct Phase {
    name: &'static str,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
}

struct Operator {
    child: Child,
    port: u16,
}

/// An operator left running by a failed run would retry its watches
/// forever against the control plane the run takes down.
impl Drop for Operator {
    fn drop(&mut self) {
        // After `stop` the child is reaped, and this does nothing.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Operator {
    /// The operator's log of run `run` (1: the first run, 2: the restart).
    fn log_path(run: u32) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("copyrator-bench-operator-{run}.log"))
    }

    fn start(args: &Args, kubeconfig: &str, port: u16, run: u32) -> Result<Self> {
        let log = std::fs::File::create(Self::log_path(run))?;
        let mut command = Command::new(&args.operator);
        if !args.members.is_empty() {
            // In both of the cluster mode's runs, the one without members
            // included: they differ by the members alone.
            command.arg("--member-clusters");
        }
        if args.tenants {
            command.arg("--all-namespaces");
        }
        if args.tenants {
            // Said either way: the run to compare with writes as the operator.
            let identity = if args.impersonate {
                "service-account"
            } else {
                "operator"
            };
            command.args(["--tenant-identity", identity]);
        }
        let child = command
            .args([
                "run",
                "--namespace",
                OPERATOR_NS,
                "--listen-address",
                &format!("127.0.0.1:{port}"),
                "--write-concurrency",
                &args.concurrency.to_string(),
                "--resync-interval",
                &args.resync_seconds.to_string(),
                "--log-level",
                "info",
            ])
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", args.operator.display()))?;
        Ok(Self { child, port })
    }

    fn status_kib(&self, field: &str) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(field)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
            .with_context(|| format!("{field} not in /proc/{}/status", self.child.id()))
    }

    /// CPU time the process has used so far (utime + stime), in seconds.
    fn cpu_seconds(&self, ticks_per_second: f64) -> Result<f64> {
        let path = format!("/proc/{}/stat", self.child.id());
        let stat = std::fs::read_to_string(&path)?;
        // The command name, in parentheses, may hold spaces: count fields
        // after its closing one, where field 3 (the state) comes first.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .with_context(|| format!("no command name in {path}"))?
            .1
            .split_whitespace()
            .collect();
        let field = |number: usize| -> Result<u64> {
            fields
                .get(number - 3)
                .with_context(|| format!("field {number} missing in {path}"))?
                .parse()
                .with_context(|| format!("field {number} of {path}"))
        };
        Ok((field(14)? + field(15)?) as f64 / ticks_per_second)
    }

    async fn metrics(&self) -> Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok(body)
    }

    /// Waits until the operator's write counter has stood still for a few
    /// seconds (a status written a moment after the last copy then lands
    /// before a window that must see no writes, not in it).
    async fn settle_writes(&self) -> Result<()> {
        const QUIET: Duration = Duration::from_secs(3);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = metric_sum(&self.metrics().await?, "copyrator_api_writes_total");
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < QUIET {
            if Instant::now() > deadline {
                bail!("the operator still wrote after 60 s without changes");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = metric_sum(&self.metrics().await?, "copyrator_api_writes_total");
            if now != last {
                last = now;
                quiet_since = Instant::now();
            }
        }
        Ok(())
    }

    /// Waits for /readyz; `limit` grows with the size, since a restart
    /// lists every copy before it is ready.
    async fn wait_ready(&self, limit: Duration) -> Result<Duration> {
        let began = Instant::now();
        while began.elapsed() < limit {
            if let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                stream
                    .write_all(
                        b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                    )
                    .await?;
                let mut body = String::new();
                stream.read_to_string(&mut body).await?;
                if body.starts_with("HTTP/1.1 200") {
                    return Ok(began.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the operator did not become ready in {} s", limit.as_secs())
    }

    fn stop(mut self) -> Result<()> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        self.child.wait()?;
        Ok(())
    }
}

/// The API server's endpoints: the addresses its kubeconfig URL resolves
/// to, with the port.
fn api_server_endpoints(server: &str) -> Result<HashSet<(IpAddr, u16)>> {
    let authority = server
        .split_once("://")
        .map_or(server, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        && !authority.ends_with(']');
    let authority = if has_port {
        authority.to_string()
    } else if server.starts_with("http://") {
        format!("{authority}:80")
    } else {
        format!("{authority}:443")
    };
    let endpoints: HashSet<(IpAddr, u16)> = authority
        .to_socket_addrs()
        .with_context(|| format!("resolving the API server {server}"))?
        .map(|a| (sockets::canonical(a.ip()), a.port()))
        .collect();
    ensure!(
        !endpoints.is_empty(),
        "no address for the API server {server}"
    );
    Ok(endpoints)
}

/// The process's established TCP connections to one of `endpoints`.
fn api_connections(pid: u32, endpoints: &HashSet<(IpAddr, u16)>) -> Result<usize> {
    Ok(sockets::established(pid, |ip, port| {
        endpoints.contains(&(ip, port))
    })?)
}

/// Clock ticks per second, the unit of `/proc/<pid>/stat`'s CPU times.
fn clock_ticks() -> Result<f64> {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("getconf CLK_TCK")?;
    ensure!(out.status.success(), "getconf CLK_TCK failed");
    let ticks: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("getconf CLK_TCK printed no number")?;
    ensure!(ticks > 0.0, "getconf CLK_TCK printed {ticks}");
    Ok(ticks)
}

fn metric_sum(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A kubeconfig with a token for the operator's own ServiceAccount, so that
/// the audit log tells its requests apart; and the API server's URL in it.
async fn operator_kubeconfig(client: &Client) -> Result<(String, String)> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NS);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": ACCOUNT}}))?;
    let _ = accounts.create(&PostParams::default(), &account).await;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": OPERATOR_NS}],
    }))?;
    let _ = bindings.create(&PostParams::default(), &binding).await;
    let token = Command::new("kubectl")
        .args([
            "create",
            "token",
            ACCOUNT,
            "--namespace",
            OPERATOR_NS,
            "--duration",
            "2h",
        ])
        .output()
        .context("kubectl create token")?;
    ensure!(
        token.status.success(),
        "kubectl create token: {}",
        String::from_utf8_lossy(&token.stderr)
    );
    let admin = kube::config::Kubeconfig::read().context("reading the admin kubeconfig")?;
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("no cluster in the kubeconfig")?;
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "bench", "cluster": {"server": cluster.server, "certificate-authority": cluster.certificate_authority}}],
        "users": [{"name": ACCOUNT, "user": {"token": String::from_utf8_lossy(&token.stdout).trim()}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": ACCOUNT}}],
        "current-context": "bench",
    });
    let path = std::env::temp_dir().join("copyrator-bench.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok((
        path.to_string_lossy().into_owned(),
        cluster.server.unwrap_or_default(),
    ))
}

/// Requests by the operator's ServiceAccount in each phase, by verb
/// (SubjectAccessReviews as `review`).
fn audit_counts(path: &PathBuf, phases: &[Phase]) -> Result<Vec<BTreeMap<String, u64>>> {
    let user = format!("system:serviceaccount:{OPERATOR_NS}:{ACCOUNT}");
    let mut counts = vec![BTreeMap::new(); phases.len()];
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening the audit log {}", path.display()))?;
    for line in BufReader::new(file).lines() {
        let line = line?;
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if event["user"]["username"] != user.as_str() {
            continue;
        }
        // A watch is logged when its response starts; other requests when complete.
        let verb = event["verb"].as_str().unwrap_or_default();
        let stage = event["stage"].as_str().unwrap_or_default();
        if (verb == "watch" && stage != "ResponseStarted")
            || (verb != "watch" && stage != "ResponseComplete")
        {
            continue;
        }
        let Some(at) = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<DateTime<Utc>>().ok())
        else {
            continue;
        };
        // A SubjectAccessReview is a question, not a write: counted apart.
        let verb = if event["objectRef"]["resource"] == "subjectaccessreviews" {
            "review"
        } else {
            verb
        };
        if let Some(i) = phases.iter().position(|p| p.start <= at && at < p.end) {
            *counts[i].entry(verb.to_string()).or_default() += 1;
        }
    }
    Ok(counts)
}

fn writes_of(counts: &BTreeMap<String, u64>) -> u64 {
    ["create", "update", "patch", "delete"]
        .iter()
        .filter_map(|v| counts.get(*v))
        .sum()
}

/// Installs (or updates) the CopyratorRule CRD as the operator prints it.
async fn install_crd(args: &Args, client: &Client) -> Result<()> {
    let crd_yaml = Command::new(&args.operator)
        .arg("crd")
        .output()
        .context("copyrator crd")?;
    let crd: Value = serde_yaml::from_slice(&crd_yaml.stdout)?;
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
            ),
            "customresourcedefinitions",
        ),
    );
    crds.patch(
        "copyrators.flant.com",
        &PatchParams::apply("bench").force(),
        &Patch::Apply(&crd),
    )
    .await
    .context("installing the CRD")?;
    // Let the API server start serving the new resource.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// The API of the CopyratorRules in `namespace`.
fn rules_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("flant.com", "v1", "CopyratorRule"),
            "copyrators",
        ),
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let client = Client::try_default()
        .await
        .context("connecting to the control plane (KUBECONFIG)")?;
    if !args.members.is_empty() {
        return clusters::run(args, client).await;
    }
    let (n, m, r, k) = (
        args.namespaces,
        args.sources,
        args.rules,
        args.new_namespaces,
    );
    let layout = Layout { rules: r };
    eprintln!(
        "bench: N={n} namespaces, M={m} sources, R={r} rules, K={k} new namespaces, U={} unrelated ConfigMaps",
        args.unrelated
    );
    let limit = Duration::from_secs(600);
    let ticks_per_second = clock_ticks()?;

    // Setup: the CRD, namespaces, sources, the rules, the operator's identity.
    install_crd(&args, &client).await?;
    for ns in [OPERATOR_NS, UNRELATED_NS] {
        create_namespace(&client, ns).await?;
    }
    let source_namespaces: Vec<String> = (0..r).map(|rule| layout.source_namespace(rule)).collect();
    let targets: Vec<String> = (0..n).map(|i| format!("{TARGET_PREFIX}{i:04}")).collect();
    let target_annotations = target_annotations(&args);
    in_parallel(r + n, args.concurrency, |i| {
        let client = client.clone();
        let (name, annotations) = if i < r {
            (source_namespaces[i].clone(), json!({}))
        } else {
            (targets[i - r].clone(), target_annotations.clone())
        };
        async move { create_namespace_with(&client, &name, annotations).await }
    })
    .await?;
    if args.impersonate {
        tenant_accounts(&client, &source_namespaces, args.concurrency).await?;
    }
    // Source i is source i % M of rule i / M.
    in_parallel(r * m, args.concurrency, |i| {
        let (rule, source) = (i / m, i % m);
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &source_namespaces[rule]);
        let name = layout.source_name(rule, source);
        async move {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"bench": "yes"}},
                "data": source_data(i, "v0"),
            }))?;
            api.create(&PostParams::default(), &cm)
                .await
                .map(|_| ())
                .with_context(|| format!("creating the source {name}"))
        }
    })
    .await?;
    let (kubeconfig, server) = operator_kubeconfig(&client).await?;
    let endpoints = api_server_endpoints(&server)?;
    in_parallel(r, args.concurrency, |rule| {
        let name = layout.rule_name(rule);
        let source_namespace = source_namespaces[rule].clone();
        // A tenant's rule lives in its own (source) namespace.
        let rule_namespace = if args.tenants {
            source_namespace.clone()
        } else {
            OPERATOR_NS.to_owned()
        };
        let rules = rules_api(&client, &rule_namespace);
        let staged = args.stages;
        async move {
            let mut body = json!({
                "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
                "metadata": {"name": name, "namespace": rule_namespace},
                "spec": {"ruleType": "configmap", "selector": {"bench": "yes"},
                         "namespace": source_namespace, "targets": {"include": ["bench-t*"]}},
            });
            if staged {
                body["spec"]["rollout"] =
                    json!({"stages": [{"name": "canary", "include": ["bench-t-000?"]}]});
            }
            let object: DynamicObject = serde_json::from_value(body)?;
            rules
                .create(&PostParams::default(), &object)
                .await
                .map(|_| ())
                .with_context(|| format!("creating the rule {name}"))
        }
    })
    .await?;
    let copies = Arc::new(Copies::default());
    watch_copies(client.clone(), copies.clone(), RULE_UID_LABEL);
    let mut phases = Vec::new();

    // Baseline: a plain client writes the same N×R×M objects, same
    // concurrency. Object i goes to target i / (R×M), for source i % (R×M).
    let per_namespace = r * m;
    let copies_total = n * per_namespace;
    // A start lists every copy before it is ready: the bound grows with them.
    let ready_limit = Duration::from_secs(30 + copies_total as u64 / 1000);
    // The same writes: objects of the copies' shape (as many labels and
    // annotations, of the same lengths), seen through a watch of their own
    // as the copies are, and timed until that watch has seen them all, as
    // the cold start is.
    eprintln!("bench: baseline");
    let baseline_seen = Arc::new(Copies::default());
    let baseline_watch = watch_copies(client.clone(), baseline_seen.clone(), BASELINE_LABEL);
    let start = Utc::now();
    let began = Instant::now();
    in_parallel(copies_total, args.concurrency, |i| {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &targets[i / per_namespace]);
        let index = i % per_namespace;
        let (rule, source) = (index / m, index % m);
        let name = layout.baseline_name(rule, source);
        let origin = format!(
            "{}/{}",
            source_namespaces[rule],
            layout.source_name(rule, source)
        );
        let cm = baseline_object(&name, &origin, index, "v0");
        async move {
            let cm = cm?;
            let params = PostParams {
                field_manager: Some("bench".into()),
                ..Default::default()
            };
            api.create(&params, &cm)
                .await
                .map(|_| ())
                .context("baseline create")
        }
    })
    .await?;
    baseline_seen
        .wait_for(copies_total, limit, |_, v| v == "v0")
        .await?;
    let baseline = began.elapsed();
    phases.push(Phase {
        name: "baseline (plain client)",
        start,
        end: Utc::now(),
    });

    // Cold start. From here to the end of idle, the operator's connections
    // to the API server are sampled.
    eprintln!("bench: cold start");
    let port = free_port()?;
    let start = Utc::now();
    let operator = Operator::start(&args, &kubeconfig, port, 1)?;
    let peak_connections = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (pid, endpoints, peak) = (
            operator.child.id(),
            endpoints.clone(),
            peak_connections.clone(),
        );
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(250));
            loop {
                every.tick().await;
                // A process that is gone has no connections to count.
                if let Ok(count) = api_connections(pid, &endpoints) {
                    peak.fetch_max(count, Ordering::Relaxed);
                }
            }
        })
    };
    let cold = copies
        .wait_for(copies_total, limit, |(ns, _), v| {
            ns.starts_with(TARGET_PREFIX) && v == "v0"
        })
        .await?;
    operator.wait_ready(ready_limit).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    phases.push(Phase {
        name: "cold start",
        start,
        end: Utc::now(),
    });
    let peak_after_cold = operator.status_kib("VmHWM:")?;
    let cold_log_lines = log_lines(1);

    // New namespaces, one after another: each gets R×M copies.
    eprintln!("bench: new namespaces");
    let start = Utc::now();
    let mut fills = Vec::new();
    for i in 0..k {
        let name = format!("{NEW_PREFIX}{i:03}");
        let began = Instant::now();
        create_namespace_with(&client, &name, target_annotations.clone()).await?;
        copies
            .wait_for(per_namespace, Duration::from_secs(60), |(ns, _), _| {
                *ns == name
            })
            .await?;
        fills.push(began.elapsed());
    }
    phases.push(Phase {
        name: "new namespaces",
        start,
        end: Utc::now(),
    });

    // Update propagation: sources of rules spread over all R.
    eprintln!("bench: updates");
    let start = Utc::now();
    let mut propagations = Vec::new();
    let mut updated_rules = HashSet::new();
    let copies_per_source = n + k;
    for u in 0..args.updates {
        let rule = u * r / args.updates;
        let source = u % m;
        updated_rules.insert(rule);
        let version = format!("v{}", u + 1);
        let name = layout.source_name(rule, source);
        let source = (source_namespaces[rule].as_str(), name.as_str());
        propagations.push(propagate(&client, &copies, source, &version, copies_per_source).await?);
    }
    phases.push(Phase {
        name: "updates",
        start,
        end: Utc::now(),
    });

    // The same, alternately with and without the copy protection.
    let protected_updates = match &args.copy_protection {
        Some(manifest) => {
            eprintln!("bench: updates with and without copy protection");
            let start = Utc::now();
            let updates = protection::Updates {
                client: &client,
                copies: &copies,
                layout,
                source_namespaces: &source_namespaces,
                copies_per_source,
                sources_per_rule: m,
                probe_namespace: &targets[0],
            };
            // The p99 of a comparison needs samples: of 20 it is the
            // slowest, which the machine's noise decides (runs gave 0.80×
            // and 1.12×); of 300 each way it still moved by ±9 % by
            // chance alone; 600 each way (the sixth slowest), but in a
            // smoke run.
            let count = if args.smoke {
                args.updates
            } else {
                args.updates.max(600)
            };
            let count = args.protection_updates.unwrap_or(count);
            let measured = protection::measure(&updates, manifest, count).await?;
            eprintln!("bench: the slowest updates: {}", measured.slowest(10));
            if let Some(path) = &args.protection_series {
                measured.write_series(path)?;
            }
            phases.push(Phase {
                name: "updates with and without copy protection",
                start,
                end: Utc::now(),
            });
            Some(measured)
        }
        None => None,
    };

    // The API server's share of an update's propagation: the plain client
    // rewrites the N objects standing for one source's copies (whole
    // objects, as the operator writes them), timed until its watch saw
    // them all.
    eprintln!("bench: update baseline");
    let mut update_baselines = Vec::new();
    for u in 0..args.updates.clamp(1, 3) {
        let (rule, source) = (u * r / args.updates.max(1), u % m);
        let index = rule * m + source;
        let version = format!("b{}", u + 1);
        let name = layout.baseline_name(rule, source);
        let origin = format!(
            "{}/{}",
            source_namespaces[rule],
            layout.source_name(rule, source)
        );
        let began = Instant::now();
        in_parallel(n, args.concurrency, |t| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &targets[t]);
            let object = baseline_object(&name, &origin, index, &version);
            let name = name.clone();
            async move {
                let params = PostParams {
                    field_manager: Some("bench".into()),
                    ..Default::default()
                };
                api.replace(&name, &params, &object?)
                    .await
                    .map(|_| ())
                    .context("baseline update")
            }
        })
        .await?;
        baseline_seen
            .wait_for(n, limit, |(_, copy), v| *copy == name && v == version)
            .await?;
        update_baselines.push(began.elapsed());
    }
    baseline_watch.abort();
    let update_baseline_p50 = percentile(&update_baselines, 0.5);

    // Idle: longer than the resync interval.
    eprintln!("bench: idle for {} s", args.resync_seconds + 5);
    operator.settle_writes().await?;
    let writes_before = metric_sum(&operator.metrics().await?, "copyrator_api_writes_total");
    let start = Utc::now();
    tokio::time::sleep(Duration::from_secs(args.resync_seconds + 5)).await;
    phases.push(Phase {
        name: "idle (> resync interval)",
        start,
        end: Utc::now(),
    });
    // The first run ends here: its CPU time and connections.
    sampler.abort();
    let connections_end_of_idle = api_connections(operator.child.id(), &endpoints)?;
    let connections_peak = peak_connections
        .load(Ordering::Relaxed)
        .max(connections_end_of_idle);
    let cpu_first_run = operator.cpu_seconds(ticks_per_second)?;
    let idle_metric_writes = metric_sum(&operator.metrics().await?, "copyrator_api_writes_total")
        .saturating_sub(writes_before);

    // Restart on a converged cluster.
    eprintln!("bench: restart");
    let peak_first_run = operator.status_kib("VmHWM:")?.max(peak_after_cold);
    operator.stop()?;
    let start = Utc::now();
    let operator = Operator::start(&args, &kubeconfig, port, 2)?;
    let restart_ready = operator.wait_ready(ready_limit).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restart_metric_writes =
        metric_sum(&operator.metrics().await?, "copyrator_api_writes_total");
    phases.push(Phase {
        name: "restart",
        start,
        end: Utc::now(),
    });

    // Memory growth with unrelated ConfigMaps of 10 KiB.
    eprintln!("bench: {} unrelated ConfigMaps", args.unrelated);
    let rss_before = operator.status_kib("VmRSS:")?;
    let start = Utc::now();
    let payload = "x".repeat(10 * 1024);
    let unrelated: Api<ConfigMap> = Api::namespaced(client.clone(), UNRELATED_NS);
    in_parallel(args.unrelated, args.concurrency, |i| {
        let api = unrelated.clone();
        let payload = payload.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("unrelated-{i:05}"), "labels": {"app": "unrelated"}},
                "data": {"blob": payload},
            }))?;
            api.create(&PostParams::default(), &cm)
                .await
                .map(|_| ())
                .context("unrelated create")
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after = operator.status_kib("VmRSS:")?;
    phases.push(Phase {
        name: "unrelated objects",
        start,
        end: Utc::now(),
    });
    let peak = operator.status_kib("VmHWM:")?.max(peak_first_run);
    operator.stop()?;

    // Places freed by the foreign objects that held them: while no
    // operator runs, F copies of the first source are replaced by foreign
    // ConfigMaps of their name; a third run reports them as conflicts;
    // then each foreign object is deleted in turn, timed until its copy
    // is back (the watch above sees it).
    let freed_places: Vec<CopyKey> = targets
        .iter()
        .take(FREED_PLACES.min(n))
        .map(|ns| (ns.clone(), layout.source_name(0, 0)))
        .collect();
    eprintln!("bench: {} freed places", freed_places.len());
    for (namespace, name) in &freed_places {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        api.delete(name, &Default::default())
            .await
            .context("deleting a copy for a foreign object")?;
        let foreign: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"bench": "foreign"}},
            "data": {"owner": "someone-else"},
        }))?;
        // The deletion may still be under way: try until the name is free.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match api.create(&PostParams::default(), &foreign).await {
                Ok(_) => break,
                Err(kube::Error::Api(status))
                    if status.code == 409 && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("creating a foreign object at a copy's place"),
            }
        }
    }
    let operator = Operator::start(&args, &kubeconfig, port, 3)?;
    operator.wait_ready(ready_limit).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let conflicts = metric_sum(&operator.metrics().await?, "copyrator_conflicts_skipped");
        if conflicts as usize >= freed_places.len() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{conflicts} of {} foreign objects reported as conflicts after 60 s",
                freed_places.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let start = Utc::now();
    let mut freed_fills = Vec::new();
    for place in &freed_places {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &place.0);
        let began = Instant::now();
        api.delete(&place.1, &Default::default())
            .await
            .context("deleting a foreign object")?;
        copies
            .wait_for(1, Duration::from_secs(120), |key, _| key == place)
            .await?;
        freed_fills.push(began.elapsed());
    }
    phases.push(Phase {
        name: "freed places",
        start,
        end: Utc::now(),
    });
    operator.stop()?;

    // The audit log is written in batches: let the last one land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = audit_counts(&args.audit_log, &phases)?;
    let by_name = |name: &str| {
        phases
            .iter()
            .position(|p| p.name == name)
            .map(|i| &counts[i])
    };
    let idle_writes = by_name("idle (> resync interval)").map_or(0, writes_of);
    let restart_writes = by_name("restart").map_or(0, writes_of);

    let mb = |kib: u64| kib as f64 / 1024.0;
    let ratio = cold.as_secs_f64() / baseline.as_secs_f64();
    // Each target's name and whether it was met, in the table's order.
    let verdicts = RefCell::new(Vec::<(&'static str, bool)>::new());
    let verdict = |what: &'static str, ok: bool| {
        verdicts.borrow_mut().push((what, ok));
        if ok { "met" } else { "MISSED" }
    };
    println!();
    println!(
        "Copyrator benchmark: N={n} namespaces × M={m} sources × R={r} rules = {copies_total} copies, K={k}, U={}",
        args.unrelated
    );
    println!();
    println!("| figure | result | target | |");
    println!("|---|---|---|---|");
    println!(
        "| baseline: plain client, {copies_total} creates of the copies' shape, concurrency {}, until its watch saw them | {:.2} s ({:.0} writes/s) | the limit | |",
        args.concurrency,
        baseline.as_secs_f64(),
        copies_total as f64 / baseline.as_secs_f64()
    );
    // The time targets are for one rule's N×M copies. With many rules each
    // also writes its finalizer and its status (two writes per 10 copies at
    // 1,000 rules × 10), and a new namespace takes one copy and one status
    // write per rule: those figures are printed, and judged only by the
    // targets that apply to every size (memory, connections, idle and
    // restart writes).
    let (cold_target, cold_target_text) = cold_start_target(copies_total);
    let cold_verdict = if r == 1 {
        verdict("cold-start convergence", ratio <= cold_target)
    } else {
        "printed"
    };
    println!(
        "| cold-start convergence | {:.2} s ({:.2}× baseline) | {} | {cold_verdict} |",
        cold.as_secs_f64(),
        ratio,
        if r == 1 {
            cold_target_text
        } else {
            "for one rule only"
        },
    );
    let (fill50, fill99) = (percentile(&fills, 0.5), percentile(&fills, 0.99));
    let fill_verdict = if r == 1 {
        verdict("new-namespace fill", fill99 < Duration::from_secs(1))
    } else {
        "printed"
    };
    println!(
        "| new-namespace fill ({k} namespaces × {per_namespace} copies) | p50 {} ms, p99 {} ms | {} | {fill_verdict} |",
        fill50.as_millis(),
        fill99.as_millis(),
        if r == 1 {
            "p99 < 1 s"
        } else {
            "for one rule only"
        },
    );
    let (prop50, prop99) = (
        percentile(&propagations, 0.5),
        percentile(&propagations, 0.99),
    );
    let of_rules = if r > 1 {
        format!(", sources of {} rules", updated_rules.len())
    } else {
        String::new()
    };
    let staged = if args.stages {
        ", staged: a canary of 10 namespaces, then the rest"
    } else {
        ""
    };
    println!(
        "| update propagation ({} updates × {copies_per_source} copies{of_rules}{staged}) | p50 {} ms, p99 {} ms | p99 < 3 s | {} |",
        args.updates,
        prop50.as_millis(),
        prop99.as_millis(),
        verdict("update propagation", prop99 < Duration::from_secs(3))
    );
    let protection_figures = protected_updates.as_ref().map(|measured| {
        let p99 = |samples: &[Duration]| percentile(samples, 0.99).as_millis() as u64;
        let (times_without, times_with) = (measured.times(false), measured.times(true));
        let (without, with) = (p99(&times_without), p99(&times_with));
        let ratio = with as f64 / without.max(1) as f64;
        let (low, high) = measured.p99_ratio_by_chance(2000);
        let (mean_without, mean_with) = measured.means();
        let mean_ratio = mean_with.as_secs_f64() / mean_without.as_secs_f64().max(f64::EPSILON);
        println!(
            "| update propagation under copy protection ({} updates each, alternating between sources whose copies its binding selects and sources whose copies it does not) | p99 {with} ms with, {without} ms without ({ratio:.3}×); p50 {} ms with, {} ms without | p99 ≤ 1.05× without | {} |",
            times_with.len(),
            percentile(&times_with, 0.5).as_millis(),
            percentile(&times_without, 0.5).as_millis(),
            verdict("update propagation under copy protection", ratio <= 1.05)
        );
        println!(
            "| the same: its p99 ratio by chance alone (the arms swapped at random in blocks of four, 2,000 draws); the mean update | 90 % of draws within {low:.3}× to {high:.3}×; mean {} ms with, {} ms without ({mean_ratio:.3}×) | printed, no target | |",
            mean_with.as_millis(),
            mean_without.as_millis(),
        );
        (without, with, ratio, (low, high), mean_ratio)
    });
    println!(
        "| update baseline: plain client rewrites the {n} objects standing for one source's copies, until its watch saw them ({} samples) | p50 {} ms | printed, no target | |",
        update_baselines.len(),
        update_baseline_p50.as_millis(),
    );
    println!(
        "| idle writes ({} s, resync every {} s) | {idle_writes} (operator metrics: {idle_metric_writes}) | 0 | {} |",
        args.resync_seconds + 5,
        args.resync_seconds,
        verdict("idle writes", idle_writes == 0)
    );
    println!(
        "| restart writes (converged cluster) | {restart_writes} (operator metrics: {restart_metric_writes}) | 0 | {} |",
        verdict("restart writes", restart_writes == 0)
    );
    println!(
        "| restart: ready (every cache listed) after | {:.1} s | printed, no target | |",
        restart_ready.as_secs_f64()
    );
    let (memory_target, memory_target_text) = memory_target(copies_total);
    println!(
        "| peak RSS | {:.1} MiB | {memory_target_text} | {} |",
        mb(peak),
        verdict("peak RSS", mb(peak) < memory_target)
    );
    let growth = mb(rss_after.saturating_sub(rss_before));
    if args.unrelated == 0 {
        println!(
            "| RSS growth with unrelated 10 KiB ConfigMaps | not measured (U=0) | < 5 MiB for 10,000 | |"
        );
    } else {
        println!(
            "| RSS growth with {} unrelated 10 KiB ConfigMaps | {:.1} MiB ({:.1} → {:.1}) | < 5 MiB for 10,000 | {} |",
            args.unrelated,
            growth,
            mb(rss_before),
            mb(rss_after),
            verdict("RSS growth with unrelated objects", growth < 5.0)
        );
    }
    println!(
        "| operator CPU time (utime + stime), first run: cold start through idle | {cpu_first_run:.2} s | printed, no target | |"
    );
    println!(
        "| open connections to the API server, first run (sampled every 250 ms) | peak {connections_peak}; {connections_end_of_idle} at the end of idle | ≤ 20 | {} |",
        verdict("connections to the API server", connections_peak <= 20)
    );
    let (freed50, freed_max) = (
        percentile(&freed_fills, 0.5),
        freed_fills.iter().max().copied().unwrap_or_default(),
    );
    println!(
        "| freed place fill ({} foreign objects at copies' places deleted one by one, resync every {} s) | p50 {} ms, max {} ms | max < 1 s | {} |",
        freed_fills.len(),
        args.resync_seconds,
        freed50.as_millis(),
        freed_max.as_millis(),
        verdict("freed place fill", freed_max < Duration::from_secs(1))
    );
    let first_run_log_lines = log_lines(1);
    // One line per rule per pass that wrote, and one when its readiness
    // changes: a few dozen for one rule, two more per rule beside it.
    let log_target = 60 + 2 * (r - 1);
    println!(
        "| operator log lines at info: cold start; whole first run (fills, updates, idle) | {cold_log_lines}; {first_run_log_lines} | ≤ {log_target} at cold start | {} |",
        verdict("log lines", cold_log_lines <= log_target)
    );
    println!();
    println!(
        "API requests by the operator (audit log, user system:serviceaccount:{OPERATOR_NS}:{ACCOUNT}):"
    );
    println!();
    println!("| phase | requests by verb |");
    println!("|---|---|");
    for (phase, count) in phases.iter().zip(&counts) {
        let verbs: Vec<String> = count.iter().map(|(v, c)| format!("{v} {c}")).collect();
        println!(
            "| {} | {} |",
            phase.name,
            if verbs.is_empty() {
                "none".into()
            } else {
                verbs.join(", ")
            }
        );
    }
    let verdicts = verdicts.take();
    let missed: Vec<&str> = verdicts
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(what, _)| *what)
        .collect();
    if !missed.is_empty() && args.smoke {
        println!();
        println!(
            "smoke run: missed targets not enforced: {}",
            missed.join(", ")
        );
    }

    // One line for machines (hack/bench-matrix): the size, every figure,
    // every verdict.
    let seconds = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
    let rounded = |x: f64| (x * 1000.0).round() / 1000.0;
    let result = json!({
        "size": {
            "namespaces": n, "sources": m, "rules": r, "copies": copies_total,
            "new_namespaces": k, "unrelated": args.unrelated, "updates": args.updates,
            "write_concurrency": args.concurrency, "resync_seconds": args.resync_seconds,
        },
        "smoke": args.smoke,
        "stages": args.stages,
        "tenants": args.tenants,
        "impersonate": args.impersonate,
        "figures": {
            "baseline_s": seconds(baseline),
            "baseline_writes_per_s": rounded(copies_total as f64 / baseline.as_secs_f64()),
            "cold_start_s": seconds(cold),
            "cold_start_ratio": rounded(ratio),
            "fill_p50_ms": fill50.as_millis() as u64,
            "fill_p99_ms": fill99.as_millis() as u64,
            "update_p50_ms": prop50.as_millis() as u64,
            "update_p99_ms": prop99.as_millis() as u64,
            "update_baseline_p50_ms": update_baseline_p50.as_millis() as u64,
            "freed_fill_p50_ms": freed50.as_millis() as u64,
            "freed_fill_max_ms": freed_max.as_millis() as u64,
            "idle_writes": idle_writes,
            "idle_metric_writes": idle_metric_writes,
            "restart_writes": restart_writes,
            "restart_ready_s": rounded(restart_ready.as_secs_f64()),
            "restart_metric_writes": restart_metric_writes,
            "peak_rss_mib": rounded(mb(peak)),
            "rss_before_unrelated_mib": rounded(mb(rss_before)),
            "rss_after_unrelated_mib": rounded(mb(rss_after)),
            "rss_growth_mib": rounded(growth),
            "cpu_seconds": rounded(cpu_first_run),
            "connections_peak": connections_peak,
            "connections_end_of_idle": connections_end_of_idle,
            "log_lines_cold_start": cold_log_lines,
            "log_lines_first_run": first_run_log_lines,
            "update_p99_unprotected_ms": protection_figures.map(|f| f.0),
            "update_p99_protected_ms": protection_figures.map(|f| f.1),
            "update_p99_protected_ratio": protection_figures.map(|f| rounded(f.2)),
            "update_p99_protected_ratio_by_chance": protection_figures.map(|f| [rounded(f.3.0), rounded(f.3.1)]),
            "update_mean_protected_ratio": protection_figures.map(|f| rounded(f.4)),
        },
        "targets": {
            "cold_start_ratio_max": cold_target,
            "peak_rss_mib_below": memory_target,
        },
        "verdicts": verdicts
            .iter()
            .map(|(what, ok)| (what.to_string(), json!(if *ok { "met" } else { "MISSED" })))
            .collect::<serde_json::Map<String, Value>>(),
        "missed": missed,
    });
    finish(&result, &missed, args.smoke)
}

/// The `BENCH-RESULT` line, then the verdict: exit 1 when a target was
/// missed (a smoke run's timings mean nothing, so it never fails).
fn finish(result: &Value, missed: &[&str], smoke: bool) -> Result<()> {
    println!();
    println!("BENCH-RESULT {result}");
    if missed.is_empty() || smoke {
        Ok(())
    } else {
        // A verdict, not a failure of the benchmark itself: no backtrace.
        eprintln!("bench: targets missed: {}", missed.join(", "));
        std::process::exit(1)
    }
}

/// Lines the operator's run `run` has logged so far.
fn log_lines(run: u32) -> usize {
    std::fs::read_to_string(Operator::log_path(run))
        .map(|log| log.lines().count())
        .unwrap_or(0)
}

/// The cold-start target for a number of copies, as a ratio to the
/// baseline, and how it reads: 1.1× up to 10,000 copies, 1.3× above.
fn cold_start_target(copies: usize) -> (f64, &'static str) {
    if copies <= 10_000 {
        (1.1, "≤ 1.1× baseline up to 10,000 copies")
    } else {
        (1.3, "≤ 1.3× baseline above 10,000 copies")
    }
}

/// The peak-memory target for a number of copies, in MiB, and how it reads:
/// 64 MiB up to 10,000 copies (1,000 rules × 10 copies included), 128 MiB
/// above, up to 100,000 copies.
fn memory_target(copies: usize) -> (f64, &'static str) {
    if copies <= 10_000 {
        (64.0, "< 64 MiB up to 10,000 copies")
    } else {
        (128.0, "< 128 MiB above 10,000 copies (up to 100,000)")
    }
}
