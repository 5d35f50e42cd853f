//! The inventory of member clusters, read from the operator's namespace:
//! Secrets labelled `copyrator.flant.com/cluster` holding a kubeconfig
//! (Cluster API's layout), and SIG Multicluster `ClusterProfile`s with the
//! Secret of their token (KEP-5339's secret reader's layout; the Secret is
//! tied to its profile by its own name or label, never named by the
//! profile: see `cluster::inventory`). Members appear, go
//! and have their credentials rotated while the operator runs: each
//! change of the inventory is compared with the members started, by name
//! and by the fingerprint of their credentials (`cluster::inventory`).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::ResourceExt;
use kube::api::{DynamicObject, ListParams};
use kube::runtime::events::EventType;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::api::kinds::Kind;
use crate::api::rule::RuleKey;
use crate::cluster::client::{ApiServer, Transport, clients_with_deadlines};
use crate::cluster::context::{Cluster, Limits};
use crate::cluster::credential_plugin::{PluginCredentials, RUN_DEADLINE};
use crate::cluster::inventory::{self, InsecureMembers, MemberAccess};
use crate::cluster::provider_file::PluginRun;
use crate::cluster::reader::{Objects, Reader};
use crate::cluster::watch::{Change, WatchEnd, Watching, follow, watch_config};
use crate::controller::members::{Member, Reach, UnusableMember};
use crate::controller::protection::{Followed, spawn_protection_watch};
use crate::controller::site::{Site, SiteName};
use crate::controller::state::Shared;
use crate::core::scope::Touch;
use crate::core::status::Unanswered;
use crate::error::Error;
use crate::ops::http::Health;
use crate::ops::metrics::{ClusterMetrics, PluginRunLabels};
use crate::sync::{lock, read, write};

/// How soon the ClusterProfile watch is tried again where the resource is
/// not served (its CRD is not installed).
const PROFILES_UNSERVED_RETRY: Duration = Duration::from_secs(60);

/// How often a member's API server is asked whether it answers, and how
/// long it has to answer: an unreachable member shows in its rules'
/// statuses within two rounds (well within 30 s).
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(5);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// A watch request that gets no answer brings the next probe forward,
/// but never closer than this to the last one.
const PROBE_MIN_GAP: Duration = Duration::from_secs(1);

/// Passes at once per member: enough to keep its share of the writes busy.
const WORKERS_PER_MEMBER: usize = 2;

/// What a member is started from: its name and labels in the inventory,
/// its API configuration, and the fingerprint of its credentials.
pub(crate) struct MemberStart {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) fingerprint: u64,
    pub(crate) config: kube::Config,
    /// Its entry in the inventory, at home: where Events about it go.
    pub(crate) entry: ObjectReference,
    /// The plugin of the provider file its credentials come from.
    pub(crate) plugin: Option<PluginRun>,
}

/// A member's limits. The request rate is per API server, and a member is
/// one of its own: it gets the whole `--api-qps` and `--api-burst`. The
/// writes in flight are connections of this process: a member gets a
/// quarter of `--write-concurrency` (at least 2), so that many members do
/// not multiply the operator's sockets.
fn member_limits(limits: Limits) -> Limits {
    Limits {
        write_concurrency: (limits.write_concurrency / 4).max(2),
        api_qps: limits.api_qps,
        api_burst: limits.api_burst,
        max_source_watches: 0,
        max_tenant_source_bytes: 0,
        acting_for_extra: limits.acting_for_extra,
    }
}

/// Start a member: its site, watches, workers and probe.
pub(crate) fn start_member(
    shared: &Arc<Shared>,
    start: MemberStart,
) -> Result<Arc<Member>, String> {
    let name = start.name.clone();
    shared.metrics.cluster_started(&name, false);
    let entry = start.entry.clone();
    let member = member_views(shared, start)?;
    let site = member.site.clone();
    let mut tasks = lock(&member.tasks);
    if let Some(protection) = &shared.options.member_copy_protection {
        let followed = Followed {
            name: protection.clone(),
            cluster: name.clone(),
            said_on: entry,
        };
        tasks.push(spawn_protection_watch(
            shared.clone(),
            site.clone(),
            followed,
        ));
    }
    tasks.push(tokio::spawn(crate::controller::workers::run_site_workers(
        shared.clone(),
        site,
        WORKERS_PER_MEMBER,
        shared.stopping(),
    )));
    tasks.push(tokio::spawn(probe(
        Arc::downgrade(shared),
        Arc::downgrade(&member),
    )));
    drop(tasks);
    info!(member = name.as_str(), "member cluster started");
    Ok(member)
}

/// A member with its site and the watches that fill its views (its
/// namespaces and the copies there), and nothing that works on them:
/// `copyrator plan` reads these views and writes nothing.
pub(crate) fn member_views(
    shared: &Arc<Shared>,
    start: MemberStart,
) -> Result<Arc<Member>, String> {
    let limits = member_limits(shared.options.limits);
    let plugin = start
        .plugin
        .map(|run| Arc::new(plugin_credentials(shared, &start.name, run)));
    let clients = clients_with_deadlines(
        start.config,
        Transport::Mixed,
        limits.write_concurrency as usize,
        ApiServer::Member(plugin.clone()),
    )
    .map_err(|e| e.to_string())?;
    // Its watches report to a health of their own: a member's trouble is
    // said in its rules' statuses, never by failing the operator's probes.
    let health = Arc::new(Health::new(Duration::from_secs(3600)));
    let cluster = Cluster::new(
        clients,
        limits,
        ClusterMetrics::new(shared.metrics.clone(), &start.name),
        shared.leader.clone(),
        health,
        // Sources stay home: a member has no source watch to report.
        Arc::new(|_: &RuleKey, _: Touch| {}),
        // The gauge of writes in flight speaks of the home cluster.
        None,
    );
    let site = Arc::new(Site::new(
        SiteName::Member(start.name.clone()),
        cluster,
        shared.metrics.clone(),
    ));
    let member = Arc::new(Member {
        site: site.clone(),
        labels: RwLock::new(start.labels),
        fingerprint: start.fingerprint,
        reach: Mutex::new(Reach::Connecting),
        reports: Mutex::default(),
        metrics: shared.metrics.clone(),
        leaving: AtomicBool::new(false),
        tasks: Mutex::default(),
        plugin,
    });
    let mut tasks = vec![crate::controller::watches::spawn_namespace_watch(
        shared.clone(),
        site.clone(),
    )];
    for kind in Kind::builtin() {
        if shared.trust.policy.kinds.has_builtin(kind) {
            tasks.push(crate::controller::kinds::spawn_copy_watch(
                shared.clone(),
                site.clone(),
                kind,
            ));
        } else {
            site.cluster.views.synced.set_copies_of(kind, true);
        }
    }
    // Members copy the built-in kinds: no other kind is watched there.
    for kind in Kind::all().filter(|k| k.info().generic) {
        site.cluster.views.synced.set_copies_of(kind, true);
    }
    site.cluster.views.synced.set_rules_listed();
    *lock(&member.tasks) = tasks;
    Ok(member)
}

/// The credentials a member's plugin gives, each run counted in
/// `copyrator_credential_plugin_runs_total`.
fn plugin_credentials(shared: &Shared, member: &str, run: PluginRun) -> PluginCredentials {
    let (metrics, cluster) = (shared.metrics.clone(), member.to_owned());
    let observe = Arc::new(move |provider: &str, result: &'static str| {
        metrics
            .credential_plugin_runs
            .get_or_create(&PluginRunLabels {
                cluster: cluster.clone(),
                provider: provider.to_owned(),
                result,
            })
            .inc();
    });
    PluginCredentials::new(run, observe)
}

/// Ask the member's API server, every [`PROBE_EVERY`], whether it answers;
/// a change is said in the log and in the statuses of the rules that
/// select the member, and a member that answers again gets every pass.
async fn probe(shared: std::sync::Weak<Shared>, member: std::sync::Weak<Member>) {
    loop {
        let Some((reader, pause, plugin)) = member.upgrade().map(|m| {
            (
                m.site.cluster.reader.clone(),
                m.site.cluster.read_pause.clone(),
                m.plugin.clone(),
            )
        }) else {
            return;
        };
        let answer = ask(&reader, plugin.as_ref()).await;
        let (Some(shared), Some(member)) = (shared.upgrade(), member.upgrade()) else {
            return;
        };
        let next = match answer {
            Answer::Version(version) => {
                crate::controller::versions::report(&shared.metrics, member.name(), &version);
                Reach::Reachable
            }
            Answer::Failed { message, why } => unreachable_since(&member, message, why),
        };
        // While it does not answer, its watches send nothing: the probe
        // alone asks, and its answer lets them go again.
        member
            .site
            .cluster
            .read_pause
            .set_held(matches!(next, Reach::Unreachable { .. }));
        let previous = std::mem::replace(&mut *lock(&member.reach), next.clone());
        let changed = previous.reason() != next.reason();
        if changed {
            reach_changed(&shared, &member, &next);
            announce_reach(&shared, &member, &previous, &next).await;
        }
        drop((shared, member));
        // A watch that fails asks for the next probe now: a member that
        // stops answering is held (and said) before its watches retry.
        tokio::time::sleep(PROBE_MIN_GAP).await;
        tokio::select! {
            () = tokio::time::sleep(PROBE_EVERY.saturating_sub(PROBE_MIN_GAP)) => {}
            () = pause.next_failure() => {}
        }
    }
}

/// What a member's probe heard.
enum Answer {
    Version(Box<k8s_openapi::apimachinery::pkg::version::Info>),
    /// In what words, and why.
    Failed {
        message: String,
        why: Unanswered,
    },
}

/// Ask a member's API server for its version. Where a plugin gives its
/// credentials, a token first: the plugin's failure (not a deadline of
/// the request waiting for it) is then what its status says.
async fn ask(reader: &Reader, plugin: Option<&Arc<PluginCredentials>>) -> Answer {
    if let Some(plugin) = plugin {
        let waited = RUN_DEADLINE + PROBE_MIN_GAP;
        match tokio::time::timeout(waited, plugin.token()).await {
            Ok(Ok(_)) => {}
            Ok(Err(failure)) => {
                return Answer::Failed {
                    message: failure.to_string(),
                    why: Unanswered::NoCredentials,
                };
            }
            Err(_) => {
                return Answer::Failed {
                    message: format!(
                        "no credentials from the plugin of provider {:?} within {} s",
                        plugin.provider(),
                        waited.as_secs()
                    ),
                    why: Unanswered::NoCredentials,
                };
            }
        }
    }
    match tokio::time::timeout(PROBE_TIMEOUT, reader.version()).await {
        Ok(Ok(version)) => Answer::Version(Box::new(version)),
        Ok(Err(error)) => Answer::Failed {
            why: match &error {
                kube::Error::Api(status) if matches!(status.code, 401 | 403) => {
                    Unanswered::CredentialsRefused
                }
                _ => Unanswered::NoAnswer,
            },
            message: crate::error::describe(&error),
        },
        Err(_) => Answer::Failed {
            message: format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
            why: Unanswered::NoAnswer,
        },
    }
}

fn unreachable_since(member: &Member, message: String, why: Unanswered) -> Reach {
    let since = match &*lock(&member.reach) {
        Reach::Unreachable { since, .. } => *since,
        _ => Instant::now(),
    };
    Reach::Unreachable {
        message,
        since,
        why,
    }
}

fn reach_changed(shared: &Arc<Shared>, member: &Arc<Member>, reach: &Reach) {
    let name = member.name();
    match reach {
        Reach::Reachable => {
            info!(member = name, "member cluster reachable");
            shared.metrics.member_reachable(name, Some(true));
            // Whatever waited for it goes now; copies of rules deleted
            // while it did not answer go too (once its copies are listed).
            member
                .site
                .queue
                .add_all(shared.rules_for(&member.site.name), Touch::All);
            let (shared, site) = (shared.clone(), member.site.clone());
            let mut tasks = lock(&member.tasks);
            tasks.retain(|task| !task.is_finished());
            tasks.push(tokio::spawn(async move {
                site.cluster.views.synced.wait_all().await;
                crate::controller::finalizer::collect_orphans_in(
                    &shared,
                    &site,
                    "member reachable",
                )
                .await;
            }));
        }
        Reach::Unreachable { message, .. } => {
            warn!(
                member = name,
                error = message.as_str(),
                "member cluster unreachable"
            );
            shared.metrics.member_reachable(name, Some(false));
        }
        Reach::Connecting => {}
    }
    // The statuses that name it say so.
    shared
        .home
        .queue
        .add_all(shared.rules_naming(member), Touch::Nothing);
}

/// An Event on each rule that targets the member when it stops answering,
/// and when it answers again (not when it first connects).
async fn announce_reach(shared: &Shared, member: &Member, previous: &Reach, next: &Reach) {
    let (type_, reason, note) = match (previous, next) {
        (_, Reach::Unreachable { message, .. }) => (
            EventType::Warning,
            next.reason(),
            format!(
                "member cluster {}: {message}; its copies are written when it answers again",
                member.name()
            ),
        ),
        (Reach::Unreachable { since, .. }, Reach::Reachable) => (
            EventType::Normal,
            "ClusterReachable",
            format!(
                "member cluster {} answers again, after {} s",
                member.name(),
                since.elapsed().as_secs()
            ),
        ),
        _ => return,
    };
    let rules: Vec<_> = shared
        .rules_naming(member)
        .into_iter()
        .filter_map(|key| read(&shared.rules).get(&key).cloned())
        .collect();
    for rule in rules {
        shared
            .event(&rule, type_, reason, "Connect", note.clone())
            .await;
    }
}

/// What the inventory watches hold: the operator namespace's Secrets and
/// ClusterProfiles, by name.
#[derive(Default)]
struct Inventory {
    secrets: std::sync::Mutex<BTreeMap<String, Secret>>,
    profiles: std::sync::Mutex<BTreeMap<String, DynamicObject>>,
    changed: Notify,
}

/// Follow the inventory until aborted: two watches, and the task that
/// starts, restarts and retires members as it changes.
pub(crate) async fn follow_inventory(shared: Arc<Shared>) {
    let inventory = Arc::new(Inventory::default());
    // The inventory's watches report to a health of their own: an operator
    // that may not read Secrets here still serves its home cluster.
    let health = Arc::new(Health::new(Duration::from_secs(3600)));
    let secrets = tokio::spawn(watch_secrets(
        shared.clone(),
        inventory.clone(),
        health.clone(),
    ));
    let profiles = tokio::spawn(watch_profiles(shared.clone(), inventory.clone(), health));
    let _abort_on_stop = AbortOnDrop(vec![secrets, profiles]);
    loop {
        inventory.changed.notified().await;
        let wanted = read_inventory(&shared, &inventory).await;
        apply(&shared, wanted);
    }
}

struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Follow one kind of the inventory into `held`, by name, telling
/// `changed` of every change; returns how the watch ended.
async fn follow_by_name<K>(
    objects: Objects<K>,
    watching: Watching<'_>,
    held: &std::sync::Mutex<BTreeMap<String, K>>,
    changed: &Notify,
) -> WatchEnd
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    follow(
        objects,
        watch_config(),
        watching,
        |object: K| (object.name_any(), object),
        |change| {
            let mut held = lock(held);
            match change {
                Change::Listed(listed) => *held = listed.into_iter().collect(),
                Change::Applied((name, object)) => {
                    held.insert(name, object);
                }
                Change::Deleted((name, _)) => {
                    held.remove(&name);
                }
            }
            drop(held);
            changed.notify_one();
        },
    )
    .await
}

async fn watch_secrets(shared: Arc<Shared>, inventory: Arc<Inventory>, health: Arc<Health>) {
    let secrets = shared
        .home
        .cluster
        .reader
        .within::<Secret>(&shared.trust.operator_namespace);
    let watching = Watching {
        name: "inventory secrets",
        health: &health,
        pause: &shared.home.cluster.read_pause,
        stop_if_unserved: false,
    };
    follow_by_name(secrets, watching, &inventory.secrets, &inventory.changed).await;
}

async fn watch_profiles(shared: Arc<Shared>, inventory: Arc<Inventory>, health: Arc<Health>) {
    let profiles = shared.home.cluster.reader.of(
        &inventory::cluster_profile_resource(),
        Some(&shared.trust.operator_namespace),
    );
    let mut said_unserved = false;
    loop {
        let watching = Watching {
            name: "clusterprofiles",
            health: &health,
            pause: &shared.home.cluster.read_pause,
            stop_if_unserved: true,
        };
        let followed = follow_by_name(
            profiles.clone(),
            watching,
            &inventory.profiles,
            &inventory.changed,
        )
        .await;
        if followed == WatchEnd::Unserved {
            // Said once: most clusters never install the resource.
            if !said_unserved {
                info!(
                    retry_seconds = PROFILES_UNSERVED_RETRY.as_secs(),
                    "ClusterProfiles (multicluster.x-k8s.io) are not served: members come from cluster Secrets only; looking again now and then"
                );
                said_unserved = true;
            }
            if !lock(&inventory.profiles).is_empty() {
                lock(&inventory.profiles).clear();
                inventory.changed.notify_one();
            }
        } else {
            said_unserved = false;
        }
        tokio::time::sleep(PROFILES_UNSERVED_RETRY).await;
    }
}

/// Whether members may be reached over plain http or unverified TLS
/// (`--allow-insecure-members`).
fn insecure_members(shared: &Shared) -> InsecureMembers {
    InsecureMembers::allowed_if(shared.options.allow_insecure_members)
}

/// The members the inventory describes now, by name (see [`members_in`]).
async fn read_inventory(shared: &Shared, inventory: &Inventory) -> BTreeMap<String, MemberAccess> {
    let secrets = lock(&inventory.secrets).clone();
    let profiles = lock(&inventory.profiles).clone();
    members_in(&secrets, &profiles, shared).await
}

/// The members that the operator namespace's Secrets and ClusterProfiles
/// describe, by name: cluster Secrets first, then profiles (a profile of a
/// name a Secret took is left out, with a warning). A profile's token is
/// in the Secret tied to it (`inventory::tied_token_secrets`).
async fn members_in(
    secrets: &BTreeMap<String, Secret>,
    profiles: &BTreeMap<String, DynamicObject>,
    shared: &Shared,
) -> BTreeMap<String, MemberAccess> {
    let insecure = insecure_members(shared);
    let plugins = shared.options.provider_file.as_deref();
    // A kubeconfig's command runs only where the operator allows it, and
    // only as its provider file says.
    let kubeconfig_plugins = plugins.filter(|_| shared.options.allow_kubeconfig_plugins);
    let mut wanted = BTreeMap::new();
    for secret in secrets.values() {
        if let Some(access) =
            inventory::from_cluster_secret(secret, insecure, kubeconfig_plugins).await
        {
            wanted.insert(access.name.clone(), access);
        }
    }
    for profile in profiles.values() {
        let access =
            inventory::from_cluster_profile(profile, secrets.values(), insecure, plugins).await;
        if wanted.contains_key(&access.name) {
            warn!(
                member = access.name.as_str(),
                "a cluster Secret and a ClusterProfile name the same member: the Secret is used"
            );
            continue;
        }
        wanted.insert(access.name.clone(), access);
    }
    wanted
}

/// The inventory as it is now, read once (for `copyrator plan`, which
/// follows nothing): the members it describes, by name. Where the
/// ClusterProfile resource is not served, there are no profiles.
pub(crate) async fn list_inventory(
    shared: &Shared,
) -> Result<BTreeMap<String, MemberAccess>, Error> {
    let namespace = &shared.trust.operator_namespace;
    let reader = &shared.home.cluster.reader;
    let lookup = |what: &str| {
        let what = format!("the {what} of the member clusters' inventory in namespace {namespace}");
        move |source| Error::Lookup { what, source }
    };
    let secrets: BTreeMap<String, Secret> = reader
        .within::<Secret>(namespace)
        .list(&ListParams::default())
        .await
        .map_err(lookup("Secrets"))?
        .items
        .into_iter()
        .map(|secret| (secret.name_any(), secret))
        .collect();
    let profiles = reader.of(&inventory::cluster_profile_resource(), Some(namespace));
    let profiles = match profiles.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .map(|profile| (profile.name_any(), profile))
            .collect(),
        Err(kube::Error::Api(status)) if status.code == 404 => BTreeMap::new(),
        Err(source) => return Err(lookup("ClusterProfiles")(source)),
    };
    Ok(members_in(&secrets, &profiles, shared).await)
}

/// How an entry of the inventory can be started, or the reason and message
/// that say why it cannot be used.
pub(crate) fn member_start(
    shared: &Shared,
    access: &MemberAccess,
) -> Result<MemberStart, (&'static str, String)> {
    let name = &access.name;
    if *name == shared.options.cluster_name {
        return Err((
            "NameInvalid",
            format!("{name:?} is this cluster's own name (--cluster-name)"),
        ));
    }
    match &access.config {
        Ok(config) => Ok(MemberStart {
            name: name.clone(),
            labels: access.labels.clone(),
            fingerprint: access.fingerprint,
            config: config.clone(),
            entry: inventory_entry(shared, access),
            plugin: access.plugin.clone(),
        }),
        Err(why) => Err((why.reason, why.message.clone())),
    }
}

/// The object of the inventory that lists `access`, at home.
fn inventory_entry(shared: &Shared, access: &MemberAccess) -> ObjectReference {
    let (api_version, kind) = match access.from {
        inventory::InventorySource::Secret => ("v1".to_owned(), "Secret"),
        inventory::InventorySource::ClusterProfile => {
            let profile = inventory::cluster_profile_resource();
            (profile.api_version, inventory::CLUSTER_PROFILE_KIND)
        }
    };
    ObjectReference {
        api_version: Some(api_version),
        kind: Some(kind.to_owned()),
        namespace: Some(shared.trust.operator_namespace.clone()),
        name: Some(access.entry.clone()),
        ..ObjectReference::default()
    }
}

/// Start, restart or retire members to match the inventory.
fn apply(shared: &Arc<Shared>, wanted: BTreeMap<String, MemberAccess>) {
    let started_names: HashSet<String> = read(&shared.members.started).keys().cloned().collect();
    let mut unusable = BTreeMap::new();
    for (name, access) in &wanted {
        if let Err(why) = take(shared, name, access) {
            unusable.insert(
                name.clone(),
                UnusableMember {
                    labels: access.labels.clone(),
                    reason: why.0.to_owned(),
                    message: why.1,
                },
            );
        }
    }
    for name in started_names.difference(&wanted.keys().cloned().collect()) {
        if let Some(member) = shared.members.get(name)
            && !member.leaving.swap(true, Ordering::AcqRel)
        {
            info!(
                member = name.as_str(),
                "member cluster left the inventory: deleting its copies there"
            );
            member_changed(shared, &member.site.name);
        }
    }
    *write(&shared.members.unusable) = unusable;
    // The statuses list every member a rule names, usable or not.
    shared
        .home
        .queue
        .add_all(read(&shared.rules).keys().cloned(), Touch::Nothing);
}

/// Take one member of the inventory: start it, restart it with new
/// credentials, or take its new labels; or say why it cannot be used.
fn take(
    shared: &Arc<Shared>,
    name: &str,
    access: &MemberAccess,
) -> Result<(), (&'static str, String)> {
    let held = shared.members.get(name);
    let start = match member_start(shared, access) {
        Ok(start) => start,
        Err(why) => {
            if held.is_some() {
                retire(shared, name);
            }
            return Err(why);
        }
    };
    if let Some(member) = &held
        && member.fingerprint == access.fingerprint
        && !member.is_leaving()
    {
        if *read(&member.labels) != access.labels {
            *write(&member.labels) = access.labels.clone();
            member_changed(shared, &member.site.name);
        }
        return Ok(());
    }
    let member = start_member(shared, start).map_err(|message| ("ClientInvalid", message))?;
    if held.is_some() {
        info!(
            member = name,
            "member cluster credentials changed: reconnected"
        );
    }
    write(&shared.members.started).insert(name.to_owned(), member);
    member_changed(shared, &SiteName::Member(name.to_owned()));
    Ok(())
}

/// A member whose credentials can no longer be used: its tasks stop; its
/// rules' statuses say why.
fn retire(shared: &Shared, name: &str) {
    if write(&shared.members.started).remove(name).is_some() {
        shared.metrics.cluster_gone(name);
        warn!(
            member = name,
            "member cluster credentials unusable: disconnected"
        );
    }
}

/// A member started or its labels changed: every rule that concerns it
/// gets a pass there.
fn member_changed(shared: &Shared, site: &SiteName) {
    let Some(member) = site.member().and_then(|name| shared.members.get(name)) else {
        return;
    };
    member
        .site
        .queue
        .add_all(shared.rules_for(site), Touch::All);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_gets_the_whole_request_rate_and_a_quarter_of_the_writes_in_flight() {
        let home = Limits {
            write_concurrency: 16,
            api_qps: 50.0,
            api_burst: 100,
            max_source_watches: 8,
            max_tenant_source_bytes: 1 << 24,
            acting_for_extra: true,
        };
        let member = member_limits(home);
        assert_eq!(member.write_concurrency, 4);
        assert_eq!((member.api_qps, member.api_burst), (50.0, 100));
        assert_eq!(member.max_source_watches, 0, "sources stay home");
        assert!(
            member.acting_for_extra,
            "writes for tenants say so there too"
        );
        let small = member_limits(Limits {
            write_concurrency: 3,
            ..home
        });
        assert_eq!(small.write_concurrency, 2, "at least 2");
    }
}
