//! `copyrator where NAMESPACE/NAME`: every copy of one source, in every
//! namespace of this cluster and (with `--member-clusters`) of each member,
//! with its state, read from the live clusters and written to standard
//! output; the exit code says whether every copy is current. Nothing is
//! written and nothing is watched: a few lists per cluster. What a place's
//! state is comes from `core::whereabouts` (pure).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::{Client, ResourceExt};
use serde::Serialize;
use thiserror::Error;

use crate::api::kinds::Kind;
use crate::api::rule::CopyratorRule;
use crate::cache::index::{NamespaceInfo, Object};
use crate::cli::settings::{PlanOutput, Settings, WhereArgs};
use crate::cluster::leader::LeaderGate;
use crate::cluster::reader::Reader;
use crate::controller::fleet;
use crate::controller::member_pass::in_member;
use crate::controller::state::Shared;
use crate::core::plan::source_rejection;
use crate::core::resolve::{ClusterOf, ResolvedRule};
use crate::core::whereabouts::{CopyRule, CopyState, Follower, Place, PlaceOf, copy_names, places};
use crate::ops::http::Health;
use crate::ops::metrics::Metrics;

/// Exit code when every copy is current.
pub(crate) const EXIT_CURRENT: u8 = 0;
/// Exit code on an error, a member out of reach among them, or when
/// copies were made by a rule the flags do not follow (a usage problem).
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code when some copy is not current.
pub(crate) const EXIT_NOT_CURRENT: u8 = 2;

/// The state word of a copy whose rule the flags do not follow.
const NOT_FOLLOWED: &str = "not followed";

/// How long a cluster has to answer at all, and then to each list.
const REACH_WITHIN: Duration = Duration::from_secs(10);

/// Why `copyrator where` cannot say where the copies are.
#[derive(Debug, Error)]
pub(crate) enum WhereError {
    #[error("{0:?} is not NAMESPACE/NAME")]
    NotASource(String),

    #[error("--kind {0:?}: `where` looks up configmap or secret")]
    UnknownKind(String),

    #[error("{kind} {place} does not exist")]
    NoSource { kind: Kind, place: String },

    #[error("{what}: its API server did not answer within {seconds} s")]
    Silent { what: String, seconds: u64 },

    #[error("{what}: {message}")]
    Lookup { what: String, message: String },

    #[error("printing the copies as JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// One copy, or one place that should hold one, as printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    pub(crate) cluster: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rule: Option<String>,
    /// Whom the rule writes the copy as, when not the operator: the
    /// ServiceAccount it acts as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) identity: Option<String>,
    /// `in place`, `create-only`, `stale`, `missing`, `contested`,
    /// `conflict`, `refused` or `unwanted`.
    pub(crate) state: &'static str,
    pub(crate) current: bool,
    /// The other writer of a contested copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) writer: Option<String>,
    /// Why, for a conflict, a refusal or an unwanted copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// What the copy holds: the first 8 hex digits of its payload's hash
    /// (as the source's `content`), when there is a copy. Copies of one
    /// content show one value; a staged rollout shows two.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<String>,
    /// What made the object before its rule adopted it (`spec.adopt`).
    #[serde(rename = "adoptedFrom", skip_serializing_if = "Option::is_none")]
    pub(crate) adopted_from: Option<String>,
}

impl Row {
    fn of(cluster: &str, place: Place) -> Self {
        let detail = place.state.detail().map(str::to_owned);
        let (writer, reason) = match place.state {
            CopyState::Contested { .. } => (detail, None),
            _ => (None, detail),
        };
        Self {
            cluster: cluster.to_owned(),
            namespace: place.namespace,
            name: place.name,
            rule: place.rule,
            identity: None,
            state: place.state.word(),
            current: place.state.is_current(),
            writer,
            reason,
            content: place.content.map(content_id),
            adopted_from: place.adopted_from,
        }
    }
}

/// A payload hash as `where` prints it.
pub(crate) fn content_id(hash: u64) -> String {
    format!("{:08x}", hash >> 32)
}

/// Whether a cluster was read, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ClusterRead {
    pub(crate) cluster: String,
    pub(crate) reached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
}

/// What `copyrator where` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Found {
    /// `namespace/name`.
    pub(crate) source: String,
    pub(crate) kind: String,
    /// What the source holds, as each copy's `content` says it (the first
    /// 8 hex digits of its payload's hash; a rule that selects keys gives
    /// its copies content of their own).
    pub(crate) content: String,
    /// Rules that copy the source, `namespace/name`, sorted.
    pub(crate) rules: Vec<String>,
    /// Home's first, then the members' by name; by namespace within one.
    pub(crate) copies: Vec<Row>,
    /// Every cluster looked at, home first.
    pub(crate) clusters: Vec<ClusterRead>,
}

impl Found {
    /// 1 when a cluster could not be read or a copy was made by a rule
    /// the flags do not follow, else 2 when a copy is not current, else 0.
    pub(crate) fn exit_code(&self) -> u8 {
        if self.clusters.iter().any(|c| !c.reached) || !self.not_followed().is_empty() {
            EXIT_FAILED
        } else if self.copies.iter().any(|c| !c.current) {
            EXIT_NOT_CURRENT
        } else {
            EXIT_CURRENT
        }
    }

    /// A line per copy (`cluster: namespace/name state (rule r): why`), a
    /// line per cluster not read, then a summary.
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        for row in &self.copies {
            out.push_str(&format!(
                "{}: {}/{} {}",
                row.cluster, row.namespace, row.name, row.state
            ));
            match (&row.rule, &row.identity) {
                (Some(rule), Some(identity)) => {
                    out.push_str(&format!(" (rule {rule}, as {identity})"));
                }
                (Some(rule), None) => out.push_str(&format!(" (rule {rule})")),
                _ => {}
            }
            if let Some(content) = &row.content {
                out.push_str(&format!(" [content {content}]"));
            }
            if let Some(maker) = &row.adopted_from {
                out.push_str(&format!(" (adopted from {maker})"));
            }
            if let Some(writer) = &row.writer {
                out.push_str(&format!(": changed back by {writer}"));
            }
            if let Some(reason) = &row.reason {
                out.push_str(&format!(": {reason}"));
            }
            out.push('\n');
        }
        for cluster in self.clusters.iter().filter(|c| !c.reached) {
            let why = cluster.message.as_deref().unwrap_or("not read");
            out.push_str(&format!("{}: not read: {why}\n", cluster.cluster));
        }
        let source = format!("{} {}", self.kind, self.source);
        if self.copies.is_empty() && self.rules.is_empty() {
            out.push_str(&format!("no rule copies {source}\n"));
        } else {
            let current = self.copies.iter().filter(|c| c.current).count();
            out.push_str(&format!(
                "{source} [content {}]: {} places, {current} current, {} not",
                self.content,
                self.copies.len(),
                self.copies.len() - current
            ));
            let adopted = self
                .copies
                .iter()
                .filter(|c| c.adopted_from.is_some())
                .count();
            if adopted > 0 {
                out.push_str(&format!(", {adopted} adopted"));
            }
            for (reason, copies) in self.not_followed() {
                out.push_str(&format!("; {copies} {reason}"));
            }
            out.push('\n');
        }
        out
    }

    /// Why copies' rules are not followed, each reason once, with how many
    /// copies it concerns.
    fn not_followed(&self) -> BTreeMap<&str, usize> {
        let mut reasons = BTreeMap::new();
        for row in self.copies.iter().filter(|r| r.state == NOT_FOLLOWED) {
            if let Some(reason) = &row.reason {
                *reasons.entry(reason.as_str()).or_insert(0) += 1;
            }
        }
        reasons
    }

    pub(crate) fn json(&self) -> Result<String, WhereError> {
        let mut text = serde_json::to_string_pretty(self).map_err(WhereError::Json)?;
        text.push('\n');
        Ok(text)
    }
}

/// `copyrator where`: the report on standard output, errors and clusters
/// not read on standard error, and the exit code.
pub(crate) fn where_command(settings: Settings, args: WhereArgs) -> ExitCode {
    let failed = ExitCode::from(EXIT_FAILED);
    let builder = tokio::runtime::Builder::new_multi_thread();
    let runtime = match crate::cli::start_runtime(builder, failed) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let found = match runtime.block_on(find(settings, &args)) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("error: {e:#}");
            return failed;
        }
    };
    let printed = match args.output {
        PlanOutput::Text => Ok(found.text()),
        PlanOutput::Json => found.json(),
    };
    let written = printed.map_err(anyhow::Error::from).and_then(|text| {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .context("writing the copies to standard output")
    });
    if let Err(e) = written {
        eprintln!("error: {e:#}");
        return failed;
    }
    for cluster in found.clusters.iter().filter(|c| !c.reached) {
        let why = cluster.message.as_deref().unwrap_or("not read");
        eprintln!(
            "error: cluster {} could not be read: {why}",
            cluster.cluster
        );
    }
    ExitCode::from(found.exit_code())
}

/// The kind and `(namespace, name)` that `args` names.
fn parse_args(args: &WhereArgs) -> Result<(Kind, String, String), WhereError> {
    let kind = Kind::from_rule_type(&args.kind.to_ascii_lowercase())
        .ok_or_else(|| WhereError::UnknownKind(args.kind.clone()))?;
    match args.source.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((kind, namespace.to_owned(), name.to_owned()))
        }
        _ => Err(WhereError::NotASource(args.source.clone())),
    }
}

/// A request to a cluster, bounded by [`REACH_WITHIN`].
async fn bounded<T>(
    what: &str,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, WhereError> {
    match tokio::time::timeout(REACH_WITHIN, request).await {
        Err(_) => Err(WhereError::Silent {
            what: what.to_owned(),
            seconds: REACH_WITHIN.as_secs(),
        }),
        Ok(Err(e)) => Err(WhereError::Lookup {
            what: what.to_owned(),
            message: crate::error::describe(&e),
        }),
        Ok(Ok(answer)) => Ok(answer),
    }
}

/// The source and the rules that copy it, then the places in each cluster.
async fn find(settings: Settings, args: &WhereArgs) -> anyhow::Result<Found> {
    let (kind, namespace, name) = parse_args(args)?;
    crate::ops::telemetry::init(&settings.log_level, settings.log_format)?;
    let clients = crate::cli::run::api_clients(settings.api_transport, 1).await?;
    let client = clients.read.clone();
    let resource = kind.api_resource();
    let source_ref = format!("{namespace}/{name}");
    let source = bounded(
        &format!("reading {kind} {source_ref}"),
        Reader::new(client.clone())
            .of(&resource, Some(&namespace))
            .get_opt(&name),
    )
    .await?
    .ok_or_else(|| WhereError::NoSource {
        kind,
        place: source_ref.clone(),
    })?;
    let source = Object::from_dynamic(kind, source);
    let rules = live_rules(&client, &settings).await?;
    let live_uids: Vec<String> = rules
        .iter()
        .filter_map(|r| r.uid().map(str::to_owned))
        .collect();
    let followed = copying(&settings, &rules, kind, &source);
    let home = &settings.cluster_name;
    let at_home: Vec<Follower<'_>> = followed
        .iter()
        .map(|(rule, live)| Follower {
            rule,
            status: live.status.as_ref(),
            cluster: ClusterOf::Home,
        })
        .collect();
    let names = copy_names(kind, &name, &at_home);
    let (namespaces, copies) = read_cluster(&client, &names).await?;
    let mut elsewhere = BTreeMap::new();
    unfollowed_rules(
        &client,
        &settings,
        &live_uids,
        copies.values(),
        &mut elsewhere,
    )
    .await;
    let rule_of = |copy: &Object| copy_rule(copy, &live_uids, &elsewhere);
    let mut rows: Vec<Row> = places(&source, &at_home, &namespaces, &copies, &rule_of)
        .into_iter()
        .map(|place| Row::of(home, place))
        .collect();
    rows.extend(refused_source(home, &rules, &source_ref));
    let mut clusters = vec![ClusterRead {
        cluster: home.clone(),
        reached: true,
        message: None,
    }];
    if settings.member_clusters {
        let rules = Rules {
            followed: &followed,
            live_uids: &live_uids,
            home_client: &client,
        };
        let (member_rows, member_reads) =
            in_members(clients, &settings, (kind, &source), rules).await?;
        rows.extend(member_rows);
        clusters.extend(member_reads);
    }
    name_identities(&mut rows, &followed);
    let mut rule_names: Vec<String> = followed.iter().map(|(r, _)| r.key.to_string()).collect();
    rule_names.sort();
    Ok(Found {
        source: source_ref,
        kind: kind.to_string(),
        content: content_id(source.payload_hash),
        rules: rule_names,
        copies: rows,
        clusters,
    })
}

/// Each row of a rule that acts as a ServiceAccount names it.
fn name_identities(rows: &mut [Row], followed: &[(ResolvedRule, &CopyratorRule)]) {
    let identities: BTreeMap<String, String> = followed
        .iter()
        .filter_map(|(rule, _)| {
            let user = rule.identity.impersonated_user()?;
            Some((rule.key.to_string(), user))
        })
        .collect();
    for row in rows {
        row.identity = row.rule.as_ref().and_then(|r| identities.get(r).cloned());
    }
}

/// The rules the operator follows: in `--namespace`, or everywhere with
/// `--all-namespaces`.
pub(crate) async fn live_rules(
    client: &Client,
    settings: &Settings,
) -> Result<Vec<CopyratorRule>, WhereError> {
    let namespace = (!settings.all_namespaces).then_some(settings.namespace.as_str());
    let api = Reader::new(client.clone()).within_or_everywhere::<CopyratorRule>(namespace);
    Ok(bounded(
        "listing the CopyratorRules",
        api.list(&ListParams::default()),
    )
    .await?
    .items)
}

/// The rules of `rules` that `settings` follows and that copy `source`
/// (of `kind`), resolved.
fn copying<'a>(
    settings: &Settings,
    rules: &'a [CopyratorRule],
    kind: Kind,
    source: &Object,
) -> Vec<(ResolvedRule, &'a CopyratorRule)> {
    let trust = settings.trust();
    rules
        .iter()
        .filter(|rule| {
            settings
                .rule_name
                .as_deref()
                .is_none_or(|only| rule.key().name == only)
        })
        .filter_map(|rule| rule.resolve(&trust).ok().map(|resolved| (resolved, rule)))
        .filter(|(resolved, _)| {
            resolved.kind == kind && source_rejection(resolved, source).is_none()
        })
        .collect()
}

/// Why `settings` does not follow the rule `rule` (`namespace/name`), with
/// the flags that would; `None` when it does.
fn not_followed_by(settings: &Settings, rule: &str) -> Option<String> {
    let (namespace, name) = rule.split_once('/')?;
    let mut given = Vec::new();
    let mut wanted = Vec::new();
    if !settings.all_namespaces && namespace != settings.namespace {
        given.push(format!("--namespace {}", settings.namespace));
        wanted.push(format!("--namespace {namespace}"));
    }
    if let Some(only) = settings.rule_name.as_deref()
        && only != name
    {
        given.push(format!("--rule-name {only}"));
        wanted.push(format!("--rule-name {name}"));
    }
    (!given.is_empty()).then(|| {
        format!(
            "made by rule {rule}, which {} does not follow: pass {}",
            given.join(" "),
            wanted.join(" ")
        )
    })
}

/// Adds to `found` (rule `namespace/name` to why it is not followed) the
/// rules that `copies` name, that `settings` does not follow and that
/// exist: a rule listed alive (`live_uids`, the rules of `--namespace`)
/// exists; any other is read once (one that cannot be read is taken to
/// exist; one that is not found is gone).
async fn unfollowed_rules<'a>(
    home: &Client,
    settings: &Settings,
    live_uids: &[String],
    copies: impl Iterator<Item = &'a Object>,
    found: &mut BTreeMap<String, String>,
) {
    let mut asked = std::collections::BTreeSet::new();
    for copy in copies {
        let is_copy = copy.rule_uid().is_some() || copy.create_only;
        let Some(rule) = copy.rule_ref.as_deref() else {
            continue;
        };
        if !is_copy || found.contains_key(rule) || !asked.insert(rule.to_owned()) {
            continue;
        }
        let (Some(reason), Some((namespace, name))) =
            (not_followed_by(settings, rule), rule.split_once('/'))
        else {
            continue;
        };
        let live = copy
            .rule_uid()
            .is_some_and(|uid| live_uids.iter().any(|u| u == uid));
        let exists = live || {
            let api = Reader::new(home.clone()).within::<CopyratorRule>(namespace);
            bounded(&format!("reading the rule {rule}"), api.get_opt(name))
                .await
                .map_or(true, |rule| rule.is_some())
        };
        if exists {
            found.insert(rule.to_owned(), reason);
        }
    }
}

/// What is known of the rule `copy` names: not followed (`elsewhere`,
/// from [`unfollowed_rules`]), followed and alive, or gone.
fn copy_rule(
    copy: &Object,
    live_uids: &[String],
    elsewhere: &BTreeMap<String, String>,
) -> CopyRule {
    if let Some(reason) = copy
        .rule_ref
        .as_deref()
        .and_then(|rule| elsewhere.get(rule))
    {
        return CopyRule::NotFollowed(reason.clone());
    }
    if copy
        .rule_uid()
        .is_some_and(|uid| live_uids.iter().any(|u| u == uid))
    {
        CopyRule::Live
    } else {
        CopyRule::Gone
    }
}

/// The rules a `where` follows, as the members' places are judged.
struct Rules<'a> {
    followed: &'a [(ResolvedRule, &'a CopyratorRule)],
    live_uids: &'a [String],
    /// Where a rule that copies name is looked up.
    home_client: &'a Client,
}

/// A source that a rule refuses for its type: one row at the source, with
/// why (from the rule's status).
fn refused_source(cluster: &str, rules: &[CopyratorRule], source_ref: &str) -> Vec<Row> {
    rules
        .iter()
        .filter_map(|rule| {
            let status = rule.status.as_ref()?;
            let entry = status
                .refused_sources
                .iter()
                .find(|e| format!("{}/{}", e.namespace, e.name) == source_ref)?;
            Some(Row {
                cluster: cluster.to_owned(),
                namespace: entry.namespace.clone(),
                name: entry.name.clone(),
                rule: Some(rule.key().to_string()),
                identity: None,
                state: "refused",
                current: false,
                writer: None,
                reason: Some(format!("the source is not copied: {}", entry.reason)),
                content: None,
                adopted_from: None,
            })
        })
        .collect()
}

/// The objects of one cluster where copies may be, by kind, namespace and name.
type PlacesRead = BTreeMap<PlaceOf, Object>;

/// One cluster's namespaces, and its objects of each kind and name of
/// `names`, by place.
async fn read_cluster(
    client: &Client,
    names: &[(Kind, String)],
) -> Result<(BTreeMap<String, NamespaceInfo>, PlacesRead), WhereError> {
    let reader = Reader::new(client.clone());
    let namespaces = reader.everywhere::<Namespace>();
    let namespaces = bounded(
        "listing the namespaces",
        namespaces.list_metadata(&ListParams::default()),
    )
    .await?
    .items
    .into_iter()
    .map(|meta| (meta.name_any(), NamespaceInfo::of(&meta.metadata)))
    .collect();
    let mut copies = BTreeMap::new();
    for (kind, name) in names {
        let (kind, objects) = (*kind, reader.of(&kind.api_resource(), None));
        let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
        let found = bounded(
            &format!("listing the {kind}s named {name}"),
            objects.list(&by_name),
        )
        .await?;
        copies.extend(found.items.into_iter().map(|object| {
            let object = Object::from_dynamic(kind, object);
            (
                (kind, object.namespace.to_string(), object.name.to_string()),
                object,
            )
        }));
    }
    Ok((namespaces, copies))
}

/// The places in each member of the inventory: each rule that selects the
/// member, as a member's pass follows it (its copies name this cluster as
/// their source's). A member that cannot be used or read is reported, not
/// read; the inventory itself unreadable is an error.
async fn in_members(
    clients: crate::cluster::client::Clients,
    settings: &Settings,
    (kind, source): (Kind, &Object),
    rules: Rules<'_>,
) -> anyhow::Result<(Vec<Row>, Vec<ClusterRead>)> {
    let Rules {
        followed,
        live_uids,
        home_client,
    } = rules;
    let home = &settings.cluster_name;
    let mut rows = Vec::new();
    let mut reads = Vec::new();
    for (member, reached) in member_clients(clients, settings).await? {
        let read = async {
            let (client, labels) = reached?;
            let here: Vec<(ResolvedRule, &CopyratorRule)> = followed
                .iter()
                .filter(|(rule, _)| rule.clusters.selects(&member, &labels))
                .map(|(rule, live)| (in_member(rule, home), *live))
                .collect();
            // A staged rule's rollouts span its clusters: its status at
            // home says which stage each has reached.
            let followers: Vec<Follower<'_>> = here
                .iter()
                .map(|(rule, live)| Follower {
                    rule,
                    status: live.status.as_ref(),
                    cluster: ClusterOf::Member(&member, &labels),
                })
                .collect();
            let names = copy_names(kind, &source.name, &followers);
            let (namespaces, copies) = read_cluster(&client, &names)
                .await
                .map_err(|e| e.to_string())?;
            let copies: PlacesRead = copies
                .into_iter()
                .filter(|(_, copy)| from_home(copy, home))
                .collect();
            let mut elsewhere = BTreeMap::new();
            unfollowed_rules(
                home_client,
                settings,
                live_uids,
                copies.values(),
                &mut elsewhere,
            )
            .await;
            let rule_of = |copy: &Object| copy_rule(copy, live_uids, &elsewhere);
            Ok::<_, String>(places(source, &followers, &namespaces, &copies, &rule_of))
        };
        match read.await {
            Ok(found) => {
                rows.extend(found.into_iter().map(|place| Row::of(&member, place)));
                reads.push(ClusterRead {
                    cluster: member.clone(),
                    reached: true,
                    message: None,
                });
            }
            Err(why) => reads.push(ClusterRead {
                cluster: member.clone(),
                reached: false,
                message: Some(why),
            }),
        }
    }
    Ok((rows, reads))
}

/// A client and the labels of each member cluster in the inventory, by
/// name, or why that member cannot be used. Nothing is started or written.
pub(crate) async fn member_clients(
    clients: crate::cluster::client::Clients,
    settings: &Settings,
) -> anyhow::Result<Vec<(String, Result<(Client, BTreeMap<String, String>), String>)>> {
    // Nothing is written: the gate is shut, as for `plan`.
    let (gate, shut) = LeaderGate::always();
    let _ = shut.send(false);
    let shared = Shared::new(
        clients,
        settings.trust(),
        settings.load_options()?,
        Arc::new(Metrics::default()),
        gate,
        Arc::new(Health::new(settings.stuck_after())),
    );
    let inventory = bounded_inventory(&shared).await?;
    let mut reached = Vec::with_capacity(inventory.len());
    for (member, access) in &inventory {
        let client = match fleet::member_start(&shared, access) {
            Ok(start) => member_client_once(start).await,
            Err((reason, message)) => Err(format!(
                "its inventory entry cannot be used: {reason}: {message}"
            )),
        };
        reached.push((member.clone(), client));
    }
    Ok(reached)
}

/// A client of a member for one look: where a credential plugin gives its
/// credentials, with one token of it.
async fn member_client_once(
    mut start: fleet::MemberStart,
) -> Result<(Client, BTreeMap<String, String>), String> {
    if let Some(run) = start.plugin.take() {
        let credentials = Arc::new(crate::cluster::credential_plugin::PluginCredentials::new(
            run,
            Arc::new(|_: &str, _: &'static str| {}),
        ));
        let token = credentials.token().await.map_err(|e| e.to_string())?;
        start.config.auth_info.token = Some(token);
    }
    let client = crate::cluster::client::member_client(start.config).map_err(|e| e.to_string())?;
    Ok((client, start.labels))
}

/// The inventory, within [`REACH_WITHIN`].
async fn bounded_inventory(
    shared: &Shared,
) -> anyhow::Result<BTreeMap<String, crate::cluster::inventory::MemberAccess>> {
    tokio::time::timeout(REACH_WITHIN, fleet::list_inventory(shared))
        .await
        .map_err(|_| WhereError::Silent {
            what: "reading the member clusters' inventory".into(),
            seconds: REACH_WITHIN.as_secs(),
        })?
        .context("reading the member clusters' inventory")
}

/// Whether an object in a member is a copy of a source of this cluster
/// (`--cluster-name`), or no copy at all (a foreign object stays in view:
/// it may hold a target's name).
fn from_home(object: &Object, home: &str) -> bool {
    (object.rule_uid().is_none() && !object.create_only)
        || object
            .annotations
            .get(crate::ANNOTATION_SOURCE_CLUSTER)
            .is_some_and(|c| c == home)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn row(cluster: &str, namespace: &str, state: CopyState) -> Row {
        Row::of(
            cluster,
            Place {
                namespace: namespace.into(),
                name: "ca".into(),
                content: None,
                rule: Some("ops/r".into()),
                state,
                adopted_from: None,
            },
        )
    }

    fn found(copies: Vec<Row>, clusters: Vec<ClusterRead>) -> Found {
        Found {
            source: "shared/ca".into(),
            kind: "ConfigMap".into(),
            content: "0123abcd".into(),
            rules: vec!["ops/r".into()],
            copies,
            clusters,
        }
    }

    fn reached(cluster: &str) -> ClusterRead {
        ClusterRead {
            cluster: cluster.into(),
            reached: true,
            message: None,
        }
    }

    #[test]
    fn an_adopted_copy_says_what_made_it_and_the_summary_counts_them() {
        let mut adopted = row("home", "t1", CopyState::InPlace);
        adopted.adopted_from = Some("Kyverno".into());
        let found = found(
            vec![adopted, row("home", "t2", CopyState::InPlace)],
            vec![reached("home")],
        );
        assert_eq!(
            found.text(),
            "home: t1/ca in place (rule ops/r) (adopted from Kyverno)\n\
             home: t2/ca in place (rule ops/r)\n\
             ConfigMap shared/ca [content 0123abcd]: 2 places, 2 current, 0 not, 1 adopted\n"
        );
        let json = found.json().expect("JSON");
        assert!(json.contains("\"adoptedFrom\": \"Kyverno\""), "{json}");
    }

    #[test]
    fn text_is_a_line_per_copy_then_a_summary_and_the_exit_code_says_whether_all_are_current() {
        let all_current = found(
            vec![
                row("home", "t1", CopyState::InPlace),
                row("home", "t2", CopyState::CreateOnly),
            ],
            vec![reached("home")],
        );
        assert_eq!(all_current.exit_code(), EXIT_CURRENT);
        assert_eq!(
            all_current.text(),
            "home: t1/ca in place (rule ops/r)\n\
             home: t2/ca create-only (rule ops/r)\n\
             ConfigMap shared/ca [content 0123abcd]: 2 places, 2 current, 0 not\n"
        );
        let some_not = found(
            vec![
                row("home", "t1", CopyState::Stale),
                row(
                    "a",
                    "t1",
                    CopyState::Contested {
                        writer: "kubectl-edit".into(),
                    },
                ),
            ],
            vec![reached("home"), reached("a")],
        );
        assert_eq!(some_not.exit_code(), EXIT_NOT_CURRENT);
        assert!(
            some_not
                .text()
                .contains("a: t1/ca contested (rule ops/r): changed back by kubectl-edit\n"),
            "{}",
            some_not.text()
        );
        let mut member_down = all_current.clone();
        member_down.clusters.push(ClusterRead {
            cluster: "b".into(),
            reached: false,
            message: Some("listing the namespaces: connection refused".into()),
        });
        assert_eq!(member_down.exit_code(), EXIT_FAILED);
        assert!(
            member_down
                .text()
                .contains("b: not read: listing the namespaces: connection refused\n")
        );
        let nothing = found(Vec::new(), vec![reached("home")]);
        let nothing = Found {
            rules: Vec::new(),
            ..nothing
        };
        assert_eq!(nothing.text(), "no rule copies ConfigMap shared/ca\n");
        assert_eq!(nothing.exit_code(), EXIT_CURRENT);
    }

    fn settings(flags: &[&str]) -> Settings {
        let argv = std::iter::once("copyrator").chain(flags.iter().copied());
        crate::cli::settings::Cli::try_parse_from(argv)
            .expect("valid flags")
            .settings
    }

    #[test]
    fn a_rule_the_flags_do_not_follow_is_named_with_the_flags_that_would() {
        let default = settings(&["--namespace", "default"]);
        assert_eq!(
            not_followed_by(&default, "copyrator/app").as_deref(),
            Some(
                "made by rule copyrator/app, which --namespace default does not follow: pass --namespace copyrator"
            )
        );
        assert_eq!(not_followed_by(&default, "default/app"), None);
        let everywhere = settings(&["--namespace", "default", "--all-namespaces"]);
        assert_eq!(not_followed_by(&everywhere, "copyrator/app"), None);
        let one_rule = settings(&["--namespace", "copyrator", "--rule-name", "web"]);
        assert_eq!(
            not_followed_by(&one_rule, "copyrator/app").as_deref(),
            Some(
                "made by rule copyrator/app, which --rule-name web does not follow: pass --rule-name app"
            )
        );
    }

    /// A copy of a rule that exists, is listed alive (in `--namespace`)
    /// but is not `--rule-name`, is not followed: never "no longer copies".
    #[test]
    fn a_live_rule_the_flags_do_not_follow_is_not_followed() {
        let copy = Object::new(
            "t1",
            "ca",
            "uid-copy".into(),
            "1".into(),
            [(crate::LABEL_RULE_UID.to_owned(), "uid-app".to_owned())].into(),
            [(crate::ANNOTATION_RULE.to_owned(), "ops/app".to_owned())].into(),
            BTreeMap::new(),
        );
        let live = vec!["uid-app".to_owned()];
        let why =
            "made by rule ops/app, which --rule-name web does not follow: pass --rule-name app";
        let elsewhere = BTreeMap::from([("ops/app".to_owned(), why.to_owned())]);
        assert_eq!(
            copy_rule(&copy, &live, &elsewhere),
            CopyRule::NotFollowed(why.into())
        );
        assert_eq!(copy_rule(&copy, &live, &BTreeMap::new()), CopyRule::Live);
        assert_eq!(copy_rule(&copy, &[], &BTreeMap::new()), CopyRule::Gone);
    }

    #[test]
    fn copies_of_a_rule_not_followed_are_said_on_their_line_and_in_the_summary_and_exit_1() {
        let why = "made by rule copyrator/app, which --namespace default does not follow: pass --namespace copyrator";
        let report = Found {
            rules: Vec::new(),
            ..found(
                vec![
                    row("home", "t1", CopyState::NotFollowed { reason: why.into() }),
                    row("home", "t2", CopyState::NotFollowed { reason: why.into() }),
                ],
                vec![reached("home")],
            )
        };
        assert_eq!(report.exit_code(), EXIT_FAILED);
        let text = report.text();
        assert!(
            text.contains(&format!("home: t1/ca not followed (rule ops/r): {why}\n")),
            "{text}"
        );
        assert!(
            text.ends_with(&format!(
                "ConfigMap shared/ca [content 0123abcd]: 2 places, 0 current, 2 not; 2 {why}\n"
            )),
            "{text}"
        );
    }

    #[test]
    fn json_names_cluster_state_and_why_of_each_copy() {
        let report = found(
            vec![row(
                "home",
                "t3",
                CopyState::Conflict {
                    reason: "a ConfigMap not made by Copyrator is there".into(),
                },
            )],
            vec![reached("home")],
        );
        let document: serde_json::Value =
            serde_json::from_str(&report.json().expect("renders")).expect("one document");
        assert_eq!(
            document["copies"][0],
            serde_json::json!({"cluster": "home", "namespace": "t3", "name": "ca", "rule": "ops/r",
                "state": "conflict", "current": false,
                "reason": "a ConfigMap not made by Copyrator is there"})
        );
        assert_eq!(document["source"], "shared/ca");
        assert_eq!(
            document["clusters"],
            serde_json::json!([{"cluster": "home", "reached": true}])
        );
    }

    #[test]
    fn a_source_is_namespace_slash_name_of_a_configmap_or_secret() {
        let args = |source: &str, kind: &str| WhereArgs {
            source: source.into(),
            kind: kind.into(),
            output: PlanOutput::Text,
        };
        assert!(matches!(
            parse_args(&args("shared/ca", "Secret")),
            Ok((Kind::Secret, ref ns, ref n)) if ns == "shared" && n == "ca"
        ));
        for bad in ["ca", "/ca", "shared/", "a/b/c"] {
            assert!(
                matches!(
                    parse_args(&args(bad, "configmap")),
                    Err(WhereError::NotASource(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_args(&args("a/b", "pod")),
            Err(WhereError::UnknownKind(_))
        ));
    }
}
