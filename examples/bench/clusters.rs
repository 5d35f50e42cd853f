//! The benchmark's cluster mode (`--members name=kubeconfig[:auditlog],...`,
//! from `hack/bench --clusters C`): one rule copies N×M ConfigMaps into
//! the home cluster and into each of C member clusters.
//!
//! The operator runs twice, with `--member-clusters` both times:
//!
//! 1. **without members** (the inventory empty): the rule copies into home
//!    only; cold start and idle, then its CPU time and memory. The rule is
//!    then deleted (the operator deletes its copies) and the operator stops.
//! 2. **with C members** (their kubeconfig Secrets registered): the rule,
//!    made again, copies into home and every member. Cold start (until the
//!    benchmark's watches have seen every copy in every cluster) and idle,
//!    then CPU time and memory at the same point as run 1, so that what a
//!    member costs is (run 2 − run 1) / C; then U source updates, each
//!    until every cluster has it.
//!
//! Before both, the plain client writes as many objects of the copies'
//! shape into home and the members as run 2 makes copies, with the same
//! concurrency in total as the default mode's baseline, interleaved over
//! the clusters, timed until its watches in every cluster saw them.
//!
//! In each member the operator works as a ServiceAccount holding exactly
//! the chart's member-side role (`chart/templates/member-side.yaml`), so
//! that the member's audit log tells its requests apart and the run proves
//! that role enough. Its connections to each API server are sampled from
//! `/proc` as in the default mode, per endpoint.

use super::*;

use std::path::Path;

use futures::future::try_join_all;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The label that names a member on its kubeconfig Secret, and the data
/// key of the kubeconfig there (Cluster API's layout; docs/clusters.md).
const CLUSTER_LABEL: &str = "copyrator.flant.com/cluster";
const KUBECONFIG_KEY: &str = "value";
/// The label on the members' Secrets that the rule's cluster selector asks for.
const MEMBER_LABEL: (&str, &str) = ("bench", "member");
/// The member-side ClusterRole (and its binding) in each member.
const MEMBER_ROLE: &str = "copyrator-bench-member";

/// An API server's addresses and port.
type Endpoints = HashSet<(IpAddr, u16)>;

/// A member control plane as `--members` names it.
#[derive(Clone, Debug)]
pub struct MemberArg {
    name: String,
    kubeconfig: PathBuf,
    audit_log: Option<PathBuf>,
}

/// `name=kubeconfig[:auditlog],...` (paths without `:` or `,`).
pub fn parse_members(value: &str) -> Result<Vec<MemberArg>> {
    let mut members: Vec<MemberArg> = Vec::new();
    for entry in value.split(',').filter(|e| !e.trim().is_empty()) {
        let (name, paths) = entry
            .split_once('=')
            .with_context(|| format!("--members: {entry:?} is not name=kubeconfig[:auditlog]"))?;
        let name = name.trim();
        // It names the Secret cluster-<name> and is the member's name in the
        // operator's inventory, which takes DNS labels.
        ensure!(
            !name.is_empty()
                && name.len() <= 50
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !name.starts_with('-')
                && !name.ends_with('-')
                && name != "home",
            "--members: the member name {name:?} is not a DNS label other than `home`"
        );
        ensure!(
            !members.iter().any(|m| m.name == name),
            "--members names {name} twice"
        );
        let (kubeconfig, audit_log) = match paths.split_once(':') {
            Some((kubeconfig, audit)) => (kubeconfig, Some(PathBuf::from(audit))),
            None => (paths, None),
        };
        members.push(MemberArg {
            name: name.to_string(),
            kubeconfig: PathBuf::from(kubeconfig),
            audit_log,
        });
    }
    ensure!(!members.is_empty(), "--members names no member");
    Ok(members)
}

/// A cluster the rule copies into: home or a member.
struct Site {
    name: String,
    /// An admin client of it (the benchmark's own requests).
    client: Client,
    /// Its API server's addresses, to count the operator's connections.
    endpoints: Endpoints,
    audit_log: Option<PathBuf>,
    /// The operator's copies there, seen through a watch.
    copies: Arc<Copies>,
    /// The plain client's objects there, seen through a watch.
    baseline: Arc<Copies>,
    /// The operator's peak of connections to it during run 2.
    peak: Arc<AtomicUsize>,
}

/// A client of the member, its API server's URL, and the CA that signs
/// the API server's certificate (base64, as `certificate-authority-data`).
async fn connect_member(member: &MemberArg) -> Result<(Client, String, String)> {
    let path = &member.kubeconfig;
    let file = Kubeconfig::read_from(path)
        .with_context(|| format!("member {}: reading {}", member.name, path.display()))?;
    let cluster = file
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .with_context(|| format!("member {}: no cluster in {}", member.name, path.display()))?;
    let server = cluster
        .server
        .clone()
        .with_context(|| format!("member {}: no server in {}", member.name, path.display()))?;
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => data.clone(),
        (None, Some(ca_path)) => {
            let ca_path = path.parent().unwrap_or(Path::new(".")).join(ca_path);
            let pem = std::fs::read(&ca_path).with_context(|| {
                format!(
                    "member {}: reading its CA {}",
                    member.name,
                    ca_path.display()
                )
            })?;
            // A ByteString serializes as base64, as a kubeconfig wants it.
            serde_json::to_value(ByteString(pem))?
                .as_str()
                .context("a ByteString serialized as no string")?
                .to_string()
        }
        (None, None) => bail!(
            "member {}: {} names no certificate authority",
            member.name,
            path.display()
        ),
    };
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("member {}: the kubeconfig {}", member.name, path.display()))?;
    let client = Client::try_from(config)
        .with_context(|| format!("member {}: a client of {}", member.name, path.display()))?;
    Ok((client, server, ca))
}

/// Creates `object`; one that exists already is fine (a setup run twice).
async fn create_or_keep<K>(api: &Api<K>, object: &K, what: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {what}")),
    }
}

/// In the member: the operator's ServiceAccount bound to the member-side
/// role; a kubeconfig (YAML) with the member's address, its CA and a token
/// of that ServiceAccount, as the home cluster's inventory holds it.
async fn member_identity(
    member: &MemberArg,
    client: &Client,
    server: &str,
    ca: &str,
) -> Result<String> {
    let what = |thing: &str| format!("{thing} in member {}", member.name);
    create_namespace(client, OPERATOR_NS)
        .await
        .with_context(|| what("the operator's namespace"))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NS);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": ACCOUNT}}))?;
    create_or_keep(&accounts, &account, &what("the ServiceAccount")).await?;
    // The chart's member-side role for kinds configmap,secret (the
    // operator's default --kinds): it lists and watches both kinds there.
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": MEMBER_ROLE},
        "rules": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["configmaps", "secrets"],
             "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        ],
    }))?;
    create_or_keep(
        &Api::<ClusterRole>::all(client.clone()),
        &role,
        &what("the member-side ClusterRole"),
    )
    .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": MEMBER_ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MEMBER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": OPERATOR_NS}],
    }))?;
    create_or_keep(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        &binding,
        &what("the member-side ClusterRoleBinding"),
    )
    .await?;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 7200}}))?;
    let token = accounts
        .create_token_request(ACCOUNT, &PostParams::default(), &request)
        .await
        .with_context(|| what("a token of the operator's ServiceAccount"))?
        .status
        .and_then(|status| status.token)
        .with_context(|| what("a TokenRequest answered without a token"))?;
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": member.name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": member.name, "context": {"cluster": member.name, "user": ACCOUNT}}],
        "current-context": member.name,
    });
    Ok(serde_yaml::to_string(&config)?)
}

/// The member's kubeconfig Secret in the home cluster's operator namespace.
async fn register_member(home: &Client, name: &str, kubeconfig: &str) -> Result<()> {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("cluster-{name}")),
            namespace: Some(OPERATOR_NS.into()),
            labels: Some(BTreeMap::from([
                (CLUSTER_LABEL.to_string(), name.to_string()),
                (MEMBER_LABEL.0.to_string(), MEMBER_LABEL.1.to_string()),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(home.clone(), OPERATOR_NS)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("registering member {name} (its kubeconfig Secret)"))?;
    Ok(())
}

/// The rule: sources `bench: yes` of the source namespace into `bench-t*`,
/// here and in every member labelled `bench: member`.
fn rule_object() -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flant.com/v1", "kind": "CopyratorRule",
        "metadata": {"name": "bench", "namespace": OPERATOR_NS},
        "spec": {"ruleType": "configmap", "selector": {"bench": "yes"},
                 "namespace": SOURCE_NS,
                 "targets": {"include": ["bench-t*"],
                             "clusters": {"selector": {"matchLabels": {MEMBER_LABEL.0: MEMBER_LABEL.1}},
                                          "local": true}}},
    }))?)
}

/// Waits until the rule is gone: the operator has deleted its copies
/// everywhere and let its finalizer go.
async fn wait_rule_gone(rules: &Api<DynamicObject>, limit: Duration) -> Result<()> {
    let began = Instant::now();
    while rules
        .get_opt("bench")
        .await
        .context("reading the rule")?
        .is_some()
    {
        ensure!(
            began.elapsed() < limit,
            "the rule was still there {} s after its deletion",
            limit.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Waits until the watch has seen every copy in the target namespaces go.
async fn wait_copies_gone(site: &Site, limit: Duration) -> Result<()> {
    let began = Instant::now();
    loop {
        let left = site
            .copies
            .seen()
            .versions
            .keys()
            .filter(|(ns, _)| ns.starts_with(TARGET_PREFIX))
            .count();
        if left == 0 {
            return Ok(());
        }
        ensure!(
            began.elapsed() < limit,
            "{}: {left} copies left {} s after the rule's deletion",
            site.name,
            limit.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one operator run measured, at the end of its idle phase.
struct RunFigures {
    /// From the operator's start until every copy was seen, per site.
    converged: Vec<Duration>,
    cpu_seconds: f64,
    peak_rss_kib: u64,
    rss_kib: u64,
    /// Connections per site at the end of idle.
    connections_end: Vec<usize>,
}

/// Starts the operator (run `run`), waits until the copies of every site
/// in `sites` are in place, lets its writes settle, stays idle longer than
/// the resync interval, and reads its figures. Returns it still running.
/// Pushes its phases ("cold start", "idle") named with `label`.
#[allow(clippy::too_many_arguments)]
async fn operator_run(
    args: &Args,
    kubeconfig: &str,
    sites: &[Site],
    want: usize,
    run: u32,
    label: &str,
    phases: &mut Vec<Phase>,
    ticks_per_second: f64,
) -> Result<(Operator, RunFigures)> {
    let limit = Duration::from_secs(600);
    let port = free_port()?;
    let start = Utc::now();
    let began = Instant::now();
    let operator = Operator::start(args, kubeconfig, port, run)?;
    // The connections to each API server, sampled until the end of idle.
    let sampler = {
        let pid = operator.child.id();
        let watched: Vec<(Endpoints, Arc<AtomicUsize>)> = sites
            .iter()
            .map(|s| (s.endpoints.clone(), s.peak.clone()))
            .collect();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(250));
            loop {
                every.tick().await;
                for (endpoints, peak) in &watched {
                    // A process that is gone has no connections to count.
                    if let Ok(count) = api_connections(pid, endpoints) {
                        peak.fetch_max(count, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let converged = try_join_all(sites.iter().map(|site| async move {
        site.copies
            .wait_for(want, limit, |(ns, _), v| {
                ns.starts_with(TARGET_PREFIX) && v == "v0"
            })
            .await
            .with_context(|| format!("{}: {label} cold start", site.name))?;
        Ok::<_, anyhow::Error>(began.elapsed())
    }))
    .await?;
    operator
        .wait_ready(Duration::from_secs(
            60 + want as u64 * sites.len() as u64 / 1000,
        ))
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    phases.push(Phase {
        name: if run == 1 {
            "without members: cold start"
        } else {
            "with members: cold start"
        },
        start,
        end: Utc::now(),
    });
    operator.settle_writes().await?;
    let start = Utc::now();
    tokio::time::sleep(Duration::from_secs(args.resync_seconds + 5)).await;
    phases.push(Phase {
        name: if run == 1 {
            "without members: idle"
        } else {
            "with members: idle"
        },
        start,
        end: Utc::now(),
    });
    sampler.abort();
    let connections_end = sites
        .iter()
        .map(|s| api_connections(operator.child.id(), &s.endpoints))
        .collect::<Result<Vec<_>>>()?;
    let figures = RunFigures {
        converged,
        cpu_seconds: operator.cpu_seconds(ticks_per_second)?,
        peak_rss_kib: operator.status_kib("VmHWM:")?,
        rss_kib: operator.status_kib("VmRSS:")?,
        connections_end,
    };
    Ok((operator, figures))
}

pub async fn run(args: Args, home: Client) -> Result<()> {
    let (n, m) = (args.namespaces, args.sources);
    let c = args.members.len();
    let per_cluster = n * m;
    let copies_total = per_cluster * (c + 1);
    let member_writes = (args.concurrency / 4).max(2);
    eprintln!(
        "bench: member clusters: N={n} namespaces × M={m} sources = {per_cluster} copies in home and in each of {c} members"
    );
    let limit = Duration::from_secs(600);
    let ticks_per_second = clock_ticks()?;

    // Setup: the CRD, home's namespaces and sources, the operator's
    // identity at home and in each member, the members' target namespaces.
    install_crd(&args, &home).await?;
    create_namespace(&home, OPERATOR_NS).await?;
    let targets: Vec<String> = (0..n).map(|i| format!("{TARGET_PREFIX}{i:04}")).collect();
    let (kubeconfig, server) = operator_kubeconfig(&home).await?;
    let mut sites = vec![Site {
        name: "home".into(),
        client: home.clone(),
        endpoints: api_server_endpoints(&server)?,
        audit_log: Some(args.audit_log.clone()),
        copies: Arc::default(),
        baseline: Arc::default(),
        peak: Arc::default(),
    }];
    let mut member_kubeconfigs = Vec::new();
    for member in &args.members {
        let (client, server, ca) = connect_member(member).await?;
        member_kubeconfigs.push(member_identity(member, &client, &server, &ca).await?);
        sites.push(Site {
            name: member.name.clone(),
            client,
            endpoints: api_server_endpoints(&server)?,
            audit_log: member.audit_log.clone(),
            copies: Arc::default(),
            baseline: Arc::default(),
            peak: Arc::default(),
        });
    }
    for site in &sites {
        in_parallel(n, args.concurrency, |i| {
            let (client, name) = (site.client.clone(), targets[i].clone());
            async move { create_namespace(&client, &name).await }
        })
        .await
        .with_context(|| format!("{}: target namespaces", site.name))?;
    }
    create_namespace(&home, SOURCE_NS).await?;
    in_parallel(m, args.concurrency, |i| {
        let api: Api<ConfigMap> = Api::namespaced(home.clone(), SOURCE_NS);
        let name = format!("shared-{i:02}");
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
    let mut watches = Vec::new();
    for site in &sites {
        watches.push(watch_copies(
            site.client.clone(),
            site.copies.clone(),
            RULE_UID_LABEL,
        ));
        watches.push(watch_copies(
            site.client.clone(),
            site.baseline.clone(),
            BASELINE_LABEL,
        ));
    }
    let mut phases = Vec::new();

    // Baseline: the plain client writes as many objects as run 2 makes
    // copies, `--write-concurrency` in flight over all clusters at once
    // (object i goes to cluster i % (C+1)), until every watch saw them.
    eprintln!(
        "bench: baseline ({copies_total} creates over {} clusters)",
        c + 1
    );
    let start = Utc::now();
    let began = Instant::now();
    in_parallel(copies_total, args.concurrency, |i| {
        let site = &sites[i % (c + 1)];
        let j = i / (c + 1);
        let (target, source) = (j / m, j % m);
        let api: Api<ConfigMap> = Api::namespaced(site.client.clone(), &targets[target]);
        let name = format!("baseline-{source:02}");
        let origin = format!("{SOURCE_NS}/shared-{source:02}");
        let cm = baseline_object(&name, &origin, source, "v0");
        let cluster = site.name.clone();
        async move {
            let params = PostParams {
                field_manager: Some("bench".into()),
                ..Default::default()
            };
            api.create(&params, &cm?)
                .await
                .map(|_| ())
                .with_context(|| format!("{cluster}: baseline create"))
        }
    })
    .await?;
    try_join_all(sites.iter().map(|site| async move {
        site.baseline
            .wait_for(per_cluster, limit, |_, v| v == "v0")
            .await
            .with_context(|| format!("{}: baseline", site.name))
    }))
    .await?;
    let baseline = began.elapsed();
    phases.push(Phase {
        name: "baseline (plain client)",
        start,
        end: Utc::now(),
    });

    // Run 1: no member in the inventory, home only.
    eprintln!("bench: run 1, without members");
    let rules = rules_api(&home, OPERATOR_NS);
    rules
        .create(&PostParams::default(), &rule_object()?)
        .await
        .context("creating the rule")?;
    let (operator, without) = operator_run(
        &args,
        &kubeconfig,
        &sites[..1],
        per_cluster,
        1,
        "without members",
        &mut phases,
        ticks_per_second,
    )
    .await?;
    // Its copies go with the rule, while it runs: run 2 starts cold.
    rules
        .delete("bench", &Default::default())
        .await
        .context("deleting the rule")?;
    wait_rule_gone(&rules, Duration::from_secs(120)).await?;
    wait_copies_gone(&sites[0], Duration::from_secs(60)).await?;
    operator.stop()?;
    // Only run 2's connections count.
    sites[0].peak.store(0, Ordering::Relaxed);

    // Run 2: the members registered, the rule made again.
    eprintln!("bench: run 2, with {c} member(s)");
    for (member, config) in args.members.iter().zip(&member_kubeconfigs) {
        register_member(&home, &member.name, config).await?;
    }
    rules
        .create(&PostParams::default(), &rule_object()?)
        .await
        .context("creating the rule again")?;
    let (operator, with) = operator_run(
        &args,
        &kubeconfig,
        &sites,
        per_cluster,
        2,
        "with members",
        &mut phases,
        ticks_per_second,
    )
    .await?;
    let cold = with.converged.iter().copied().max().unwrap_or_default();

    // Updates: each source change until every cluster has it.
    eprintln!("bench: {} updates", args.updates);
    let start = Utc::now();
    let mut propagations = Vec::new();
    for u in 0..args.updates {
        let name = format!("shared-{:02}", u % m);
        let version = format!("v{}", u + 1);
        let began = Instant::now();
        set_source_version(&home, (SOURCE_NS, &name), &version).await?;
        try_join_all(sites.iter().map(|site| {
            let (name, version) = (&name, &version);
            async move {
                site.copies
                    .wait_for(n, Duration::from_secs(120), |(_, copy), v| {
                        copy == name && v == version.as_str()
                    })
                    .await
                    .with_context(|| format!("{}: update {version}", site.name))
            }
        }))
        .await?;
        propagations.push(began.elapsed());
    }
    phases.push(Phase {
        name: "with members: updates",
        start,
        end: Utc::now(),
    });
    let peak_rss_kib = operator.status_kib("VmHWM:")?;
    operator.stop()?;
    for watch in &watches {
        watch.abort();
    }

    // The audit logs are written in batches: let the last ones land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts: Vec<Option<Vec<BTreeMap<String, u64>>>> = sites
        .iter()
        .map(|site| {
            site.audit_log
                .as_ref()
                .map(|path| {
                    audit_counts(path, &phases).with_context(|| format!("{}: audit", site.name))
                })
                .transpose()
        })
        .collect::<Result<_>>()?;
    let phase_counts = |site: usize, name: &str| -> Option<&BTreeMap<String, u64>> {
        let i = phases.iter().position(|p| p.name == name)?;
        Some(&counts[site].as_ref()?[i])
    };
    let total = |verbs: Option<&BTreeMap<String, u64>>| verbs.map(|v| v.values().sum::<u64>());

    // The report.
    let mb = |kib: u64| kib as f64 / 1024.0;
    let ratio = cold.as_secs_f64() / baseline.as_secs_f64();
    let per_member = |with: f64, without: f64| (with - without) / c as f64;
    let verdicts = RefCell::new(Vec::<(String, bool)>::new());
    let verdict = |what: String, ok: bool| {
        verdicts.borrow_mut().push((what, ok));
        if ok { "met" } else { "MISSED" }
    };
    let connection_target = 2 + member_writes;
    let members_text = if c == 1 {
        "1 member".to_string()
    } else {
        format!("{c} members")
    };
    println!();
    println!(
        "Copyrator benchmark, member clusters: N={n} namespaces × M={m} sources = {per_cluster} copies in each of {} clusters (home and {members_text}) = {copies_total} copies, write concurrency {} (a member's share {member_writes})",
        c + 1,
        args.concurrency,
    );
    println!();
    println!("| figure | result | target | |");
    println!("|---|---|---|---|");
    println!(
        "| baseline: plain client, {copies_total} creates of the copies' shape over {} clusters, concurrency {} in all, until its watches saw them | {:.2} s ({:.0} writes/s) | the limit | |",
        c + 1,
        args.concurrency,
        baseline.as_secs_f64(),
        copies_total as f64 / baseline.as_secs_f64()
    );
    let (cold_target, cold_target_text) = cold_start_target(copies_total);
    println!(
        "| cold start with {members_text}: every copy in every cluster | {:.2} s ({ratio:.2}× baseline) | {cold_target_text} | {} |",
        cold.as_secs_f64(),
        verdict("cold-start convergence".into(), ratio <= cold_target)
    );
    for (site, at) in sites.iter().zip(&with.converged) {
        println!(
            "| — {}: its {per_cluster} copies in place after | {:.2} s | printed, no target | |",
            site.name,
            at.as_secs_f64()
        );
    }
    println!(
        "| cold start without members (home only, {per_cluster} copies) | {:.2} s | printed, no target | |",
        without.converged[0].as_secs_f64()
    );
    println!(
        "| connections to home's API server (run 2, sampled every 250 ms) | peak {}; {} at the end of idle | ≤ 20 | {} |",
        sites[0].peak.load(Ordering::Relaxed),
        with.connections_end[0],
        verdict(
            "connections to home".into(),
            sites[0].peak.load(Ordering::Relaxed) <= 20
        )
    );
    for (i, site) in sites.iter().enumerate().skip(1) {
        let peak = site.peak.load(Ordering::Relaxed);
        println!(
            "| connections to {}'s API server | peak {peak}; {} at the end of idle | ≤ {connection_target} (2 + its write share {member_writes}) | {} |",
            site.name,
            with.connections_end[i],
            verdict(
                format!("connections to {}", site.name),
                peak <= connection_target
            )
        );
    }
    for (i, site) in sites.iter().enumerate() {
        let idle = phase_counts(i, "with members: idle").map(writes_of);
        match idle {
            Some(writes) => println!(
                "| {}: writes while idle ({} s, resync every {} s) | {writes} | 0 | {} |",
                site.name,
                args.resync_seconds + 5,
                args.resync_seconds,
                verdict(format!("idle writes in {}", site.name), writes == 0)
            ),
            None => println!(
                "| {}: writes while idle | not measured (no audit log) | 0 | |",
                site.name
            ),
        }
    }
    if !propagations.is_empty() {
        let (p50, p99) = (
            percentile(&propagations, 0.5),
            percentile(&propagations, 0.99),
        );
        println!(
            "| update propagation ({} updates × {n} copies in each of {} clusters) | p50 {} ms, p99 {} ms | p99 < 3 s | {} |",
            args.updates,
            c + 1,
            p50.as_millis(),
            p99.as_millis(),
            verdict("update propagation".into(), p99 < Duration::from_secs(3))
        );
    }
    let (memory_target, memory_target_text) = memory_target(copies_total);
    println!(
        "| peak RSS with {members_text} (cold start through updates) | {:.1} MiB | {memory_target_text} | {} |",
        mb(peak_rss_kib),
        verdict("peak RSS".into(), mb(peak_rss_kib) < memory_target)
    );
    println!(
        "| RSS at the end of idle: without members → with {c} | {:.1} → {:.1} MiB, {:+.1} MiB a member | printed, no target | |",
        mb(without.rss_kib),
        mb(with.rss_kib),
        per_member(mb(with.rss_kib), mb(without.rss_kib))
    );
    println!(
        "| peak RSS through idle: without members → with {c} | {:.1} → {:.1} MiB, {:+.1} MiB a member | printed, no target | |",
        mb(without.peak_rss_kib),
        mb(with.peak_rss_kib),
        per_member(mb(with.peak_rss_kib), mb(without.peak_rss_kib))
    );
    println!(
        "| operator CPU time, cold start through idle: without members → with {c} | {:.2} → {:.2} s, {:+.2} s a member ({per_cluster} copies) | printed, no target | |",
        without.cpu_seconds,
        with.cpu_seconds,
        per_member(with.cpu_seconds, without.cpu_seconds)
    );
    println!();
    println!(
        "API requests by the operator, per cluster (audit logs, user system:serviceaccount:{OPERATOR_NS}:{ACCOUNT}):"
    );
    println!();
    println!("| cluster | phase | requests by verb |");
    println!("|---|---|---|");
    for (i, site) in sites.iter().enumerate() {
        let Some(by_phase) = &counts[i] else {
            println!("| {} | all | not measured (no audit log) |", site.name);
            continue;
        };
        for (phase, count) in phases.iter().zip(by_phase) {
            if phase.name.starts_with("baseline") || (i > 0 && phase.name.starts_with("without")) {
                continue;
            }
            let verbs: Vec<String> = count.iter().map(|(v, c)| format!("{v} {c}")).collect();
            println!(
                "| {} | {} | {} |",
                site.name,
                phase.name,
                if verbs.is_empty() {
                    "none".into()
                } else {
                    verbs.join(", ")
                }
            );
        }
    }
    let verdicts = verdicts.take();
    let missed: Vec<&str> = verdicts
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(what, _)| what.as_str())
        .collect();
    if !missed.is_empty() && args.smoke {
        println!();
        println!(
            "smoke run: missed targets not enforced: {}",
            missed.join(", ")
        );
    }

    let seconds = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
    let rounded = |x: f64| (x * 1000.0).round() / 1000.0;
    let members_json: Vec<Value> = sites
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, site)| {
            json!({
                "name": site.name,
                "converged_s": seconds(with.converged[i]),
                "connections_peak": site.peak.load(Ordering::Relaxed),
                "connections_end_of_idle": with.connections_end[i],
                "requests_cold_start": total(phase_counts(i, "with members: cold start")),
                "requests_idle": total(phase_counts(i, "with members: idle")),
                "requests_updates": total(phase_counts(i, "with members: updates")),
                "writes_idle": phase_counts(i, "with members: idle").map(writes_of),
            })
        })
        .collect();
    let result = json!({
        "size": {
            "namespaces": n, "sources": m, "rules": 1, "members": c,
            "copies_per_cluster": per_cluster, "copies": copies_total,
            "updates": args.updates, "write_concurrency": args.concurrency,
            "member_write_concurrency": member_writes, "resync_seconds": args.resync_seconds,
        },
        "smoke": args.smoke,
        "figures": {
            "baseline_s": seconds(baseline),
            "baseline_writes_per_s": rounded(copies_total as f64 / baseline.as_secs_f64()),
            "cold_start_s": seconds(cold),
            "cold_start_ratio": rounded(ratio),
            "home_converged_s": seconds(with.converged[0]),
            "cold_start_without_members_s": seconds(without.converged[0]),
            "update_p50_ms": percentile(&propagations, 0.5).as_millis() as u64,
            "update_p99_ms": percentile(&propagations, 0.99).as_millis() as u64,
            "home_connections_peak": sites[0].peak.load(Ordering::Relaxed),
            "home_connections_end_of_idle": with.connections_end[0],
            "home_requests_cold_start": total(phase_counts(0, "with members: cold start")),
            "home_writes_idle": phase_counts(0, "with members: idle").map(writes_of),
            "peak_rss_mib": rounded(mb(peak_rss_kib)),
            "rss_end_of_idle_without_mib": rounded(mb(without.rss_kib)),
            "rss_end_of_idle_with_mib": rounded(mb(with.rss_kib)),
            "peak_rss_through_idle_without_mib": rounded(mb(without.peak_rss_kib)),
            "peak_rss_through_idle_with_mib": rounded(mb(with.peak_rss_kib)),
            "rss_per_member_mib": rounded(per_member(mb(with.rss_kib), mb(without.rss_kib))),
            "cpu_seconds_without": rounded(without.cpu_seconds),
            "cpu_seconds_with": rounded(with.cpu_seconds),
            "cpu_seconds_per_member": rounded(per_member(with.cpu_seconds, without.cpu_seconds)),
            "members": members_json,
        },
        "targets": {
            "cold_start_ratio_max": cold_target,
            "member_connections_max": connection_target,
            "home_connections_max": 20,
            "peak_rss_mib_below": memory_target,
        },
        "verdicts": verdicts
            .iter()
            .map(|(what, ok)| (what.clone(), json!(if *ok { "met" } else { "MISSED" })))
            .collect::<serde_json::Map<String, Value>>(),
        "missed": missed,
    });
    finish(&result, &missed, args.smoke)
}
