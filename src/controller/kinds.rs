//! The kind a rule names by `objectType`: resolved by API discovery,
//! registered once, and its copies watched from the first rule that needs
//! them to the last; for RoleBindings, the Roles they bind too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::Role;
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, verbs};
use tokio::task::{JoinHandle, JoinSet};

use crate::Error;
use crate::api::kinds::{Discovered, Kind, RBAC_GROUP};
use crate::api::rule::{CopyratorRule, ObjectType, RuleKey};
use crate::cache::index::Object;
use crate::cache::roles::RoleRules;
use crate::cluster::foreign::follow_foreign;
use crate::cluster::watch::{Change, WatchEnd, Watching, follow, watch_config};
use crate::controller::site::{Site, SiteName};
use crate::controller::state::Shared;
use crate::core::plan::concerns_namespace;
use crate::core::resolve::InvalidRule;
use crate::core::scope::Touch;
use crate::sync::{lock, read, write};

/// How soon a rule whose kind the API server does not serve looks again:
/// its CustomResourceDefinition may be installed after it.
pub(crate) const UNKNOWN_KIND_RETRY: Duration = Duration::from_secs(30);

/// The verbs a copied kind must support: sources are listed and watched,
/// copies created, updated, deleted, and a taken name read.
const NEEDED_VERBS: [&str; 6] = [
    verbs::LIST,
    verbs::WATCH,
    verbs::GET,
    verbs::CREATE,
    verbs::UPDATE,
    verbs::DELETE,
];

/// Where a rule's kind stands before its pass.
#[derive(Debug, PartialEq)]
pub(crate) enum KindReadiness {
    /// `ruleType`, or no kind named: resolving the rule says the rest.
    NothingToPrepare,
    /// Registered and its copies listed.
    Ready,
    /// Registered; its copy watch has yet to list.
    Listing,
    /// Not copied: the status says why, and when to look again.
    Refused(InvalidRule, Option<Duration>),
}

/// Resolve the kind `rule` names, register it and start watching its
/// copies; a rule of the view (not one `copyrator plan` reads from a file)
/// only while it is in the view. Only a failure to reach the API server is
/// an error.
pub(crate) async fn prepare(
    shared: &Arc<Shared>,
    rule: &CopyratorRule,
    in_view: bool,
) -> Result<KindReadiness, Error> {
    let Some(object_type) = rule.object_type() else {
        return Ok(KindReadiness::NothingToPrepare);
    };
    if rule.effective_rule_type().is_some() {
        return Ok(KindReadiness::NothingToPrepare);
    }
    if let Some(refusal) = object_type.refusal(&shared.trust.policy) {
        return Ok(KindReadiness::Refused(refusal, None));
    }
    let Some((group, version)) = object_type.group_version() else {
        return Ok(KindReadiness::NothingToPrepare);
    };
    let builtin = Kind::find(group, &object_type.kind).is_some_and(|k| !k.info().generic);
    if !builtin && rule.is_tenant(&shared.trust) {
        return Ok(KindReadiness::Refused(
            crate::core::resolve::tenant_kind_refusal(&shared.trust),
            None,
        ));
    }
    // Before discovery: a rule refused for its trust starts no watch. A
    // deleted one goes on: its copies are found through the kind's watch.
    if !rule.is_deleting()
        && let Some(refusal) = rule.untrusted_rbac_sources()
    {
        return Ok(KindReadiness::Refused(refusal, None));
    }
    // A refusal stands for its retry interval: a namespace event queues
    // every unresolved rule, and each must not cost a lookup.
    let refusal_key = format!("{group}/{version}/{}", object_type.kind);
    let standing = lock(&shared.home.cluster.kind_refusals).standing(&refusal_key, Instant::now());
    if let Some((invalid, again)) = standing {
        return Ok(KindReadiness::Refused(invalid, again));
    }
    let kind = match kind_to_watch(shared, object_type, group, version).await? {
        Ok(kind) => kind,
        Err(readiness) => {
            if let KindReadiness::Refused(invalid, again) = &readiness {
                lock(&shared.home.cluster.kind_refusals).remember(
                    refusal_key,
                    invalid,
                    *again,
                    Instant::now(),
                );
            }
            return Ok(readiness);
        }
    };
    if !watch_copies(shared, kind, in_view.then(|| rule.key())) {
        // The rule went meanwhile: nothing to watch for it.
        return Ok(KindReadiness::Listing);
    }
    Ok(listed(shared, kind))
}

/// Ready once the copies of `kind` are listed, and for RoleBindings the
/// Roles they bind: a copy judged by Roles not listed yet would be refused
/// (and deleted) for a Role merely not seen.
fn listed(shared: &Shared, kind: Kind) -> KindReadiness {
    let synced = &shared.home.cluster.views.synced;
    if synced.copies_of(kind) && (!kind.is_role_binding() || synced.roles()) {
        KindReadiness::Ready
    } else {
        KindReadiness::Listing
    }
}

/// The registered kind `object_type` names, once the API server serves it
/// and RBAC lets the operator read it; otherwise where the rule stands.
async fn kind_to_watch(
    shared: &Shared,
    object_type: &ObjectType,
    group: &str,
    version: &str,
) -> Result<Result<Kind, KindReadiness>, Error> {
    let known = Kind::find(group, &object_type.kind);
    let kind = match known {
        // Built-in kinds are served in v1 alone, and watched from the start.
        Some(kind) if !kind.info().generic => {
            return Ok(Err(listed(shared, kind)));
        }
        // Watched: the API server serves it. Not watched (its last watch
        // stopped because its CRD went, or no rule needed it): ask again.
        Some(kind)
            if kind.info().version == version
                && lock(&shared.home.cluster.kind_watches).contains_key(&kind) =>
        {
            kind
        }
        // Unknown, or another version of a known kind: is it served?
        _ => {
            let found = match discover(shared, object_type, group, version).await? {
                Ok(found) => found,
                Err(refused) => return Ok(Err(refused)),
            };
            match known {
                // One version per kind: the first registered serves them all.
                Some(kind) => kind,
                None => {
                    if let Some(refused) =
                        refused_access(shared, &found.group, &found.kind, &found.plural).await?
                    {
                        return Ok(Err(refused));
                    }
                    match Kind::register(&found) {
                        Ok(kind) => kind,
                        Err(e) => {
                            return Ok(Err(KindReadiness::Refused(
                                InvalidRule {
                                    reason: "UnsupportedKind",
                                    message: e.to_string(),
                                },
                                Some(UNKNOWN_KIND_RETRY),
                            )));
                        }
                    }
                }
            }
        }
    };
    // RBAC may have changed since the kind's watch last stopped.
    if !lock(&shared.home.cluster.kind_watches).contains_key(&kind) {
        let info = kind.info();
        if let Some(refused) =
            refused_access(shared, info.group, info.api_kind, info.plural).await?
        {
            return Ok(Err(refused));
        }
    }
    Ok(Ok(kind))
}

/// Ask the API server what `object_type` is: what registering it needs,
/// or why it cannot be copied.
async fn discover(
    shared: &Shared,
    object_type: &ObjectType,
    group: &str,
    version: &str,
) -> Result<Result<Discovered, KindReadiness>, Error> {
    let gvk = GroupVersionKind::gvk(group, version, &object_type.kind);
    let name = object_type.name();
    let (resource, capabilities) = match shared.home.cluster.reader.discover_kind(&gvk).await {
        Ok(found) => found,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Ok(Err(unknown(object_type)));
        }
        Err(kube::Error::Discovery(_)) => return Ok(Err(unknown(object_type))),
        Err(e) => {
            return Err(Error::Lookup {
                what: format!("the kind {name} (API discovery)"),
                source: e,
            });
        }
    };
    if capabilities.scope == Scope::Cluster {
        return Ok(Err(KindReadiness::Refused(
            InvalidRule {
                reason: "ClusterScopedKind",
                message: format!(
                    "{name} is cluster-scoped: only namespaced kinds are copied into namespaces"
                ),
            },
            None,
        )));
    }
    let missing: Vec<&str> = NEEDED_VERBS
        .into_iter()
        .filter(|verb| !capabilities.supports_operation(verb))
        .collect();
    if !missing.is_empty() {
        return Ok(Err(KindReadiness::Refused(
            InvalidRule {
                reason: "UnsupportedKind",
                message: format!(
                    "{name} cannot be copied: the API server does not serve {} for it",
                    missing.join(", ")
                ),
            },
            None,
        )));
    }
    Ok(Ok(Discovered {
        group: resource.group,
        version: resource.version,
        kind: resource.kind,
        plural: resource.plural,
    }))
}

/// How soon a rule whose kind the operator may not read looks again: its
/// RBAC may be granted meanwhile.
pub(crate) const FORBIDDEN_KIND_RETRY: Duration = Duration::from_secs(60);

/// Whether RBAC lets the operator list and watch `kind` (of `group`,
/// served as `plural`) cluster-wide, and for RoleBindings the Roles they
/// bind too (see [`follow_roles`]), asked before its copy watch starts: a
/// watch refused for good would keep failing until the liveness probe
/// restarts the operator.
async fn refused_access(
    shared: &Shared,
    group: &str,
    kind: &str,
    plural: &str,
) -> Result<Option<KindReadiness>, Error> {
    let mut resources = vec![(group, plural)];
    let binds_roles = group == RBAC_GROUP && kind == "RoleBinding";
    if binds_roles {
        resources.push((RBAC_GROUP, "roles"));
    }
    let mut refused = Vec::new();
    for (group, resource) in resources {
        for verb in [verbs::LIST, verbs::WATCH] {
            if !may(shared, group, resource, verb).await? {
                refused.push(format!("{verb} {resource}"));
            }
        }
    }
    if refused.is_empty() {
        return Ok(None);
    }
    let roles_too = if binds_roles {
        ", and list and watch on roles (a RoleBinding copy is written only where the Role it binds grants what the source's does)"
    } else {
        ""
    };
    Ok(Some(KindReadiness::Refused(
        InvalidRule {
            reason: "Forbidden",
            message: format!(
                "the operator may not {} cluster-wide (RBAC), needed to copy {}: grant it get, list, watch, create, \
                 update and delete on {} (the chart's extraKinds){roles_too}; looked at again every {} s",
                refused.join(" or "),
                crate::api::kinds::kind_name(group, kind),
                plural,
                FORBIDDEN_KIND_RETRY.as_secs()
            ),
        },
        Some(FORBIDDEN_KIND_RETRY),
    )))
}

/// Whether RBAC lets the operator `verb` `resource` of `group` cluster-wide.
async fn may(shared: &Shared, group: &str, resource: &str, verb: &str) -> Result<bool, Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                verb: Some(verb.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = shared
        .home
        .cluster
        .reader
        .self_review(&review)
        .await
        .map_err(|e| Error::Lookup {
            what: format!("whether the operator may {verb} {resource}"),
            source: e,
        })?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

fn unknown(object_type: &ObjectType) -> KindReadiness {
    KindReadiness::Refused(
        InvalidRule {
            reason: "UnknownKind",
            message: format!(
                "the API server serves no kind {} in {} (looked up again every {} s)",
                object_type.kind,
                object_type.api_version,
                UNKNOWN_KIND_RETRY.as_secs()
            ),
        },
        Some(UNKNOWN_KIND_RETRY),
    )
}

/// Start watching the copies of `kind` for `rule` (of the view) unless they are watched
/// already; false when the rule has left the view. Checked under the lock
/// [`release_unused`] takes after a rule leaves: a pass that began before
/// never starts a watch nothing would stop.
fn watch_copies(shared: &Arc<Shared>, kind: Kind, rule: Option<RuleKey>) -> bool {
    let mut watches = lock(&shared.home.cluster.kind_watches);
    if let Some(key) = &rule
        && !read(&shared.rules).contains_key(key)
    {
        return false;
    }
    if watches.contains_key(&kind) {
        return true;
    }
    shared.home.cluster.views.synced.set_copies_of(kind, false);
    if kind.is_role_binding() {
        shared.home.cluster.views.synced.set_roles(false);
    }
    watches.insert(
        kind,
        spawn_copy_watch(shared.clone(), shared.home.clone(), kind),
    );
    shared.metrics.kind_watches.set(watches.len() as i64);
    true
}

/// Watch the copies of each kind `--kinds` names by `Kind.group` (or a
/// bare core `Kind`) from the start, as ConfigMaps and Secrets are: so
/// that the copies of a rule deleted while no operator ran are found and
/// collected. Each watch stops once no rule needs it and no such copy is
/// left. A kind that cannot be watched is said in the log and left out.
pub(crate) async fn watch_named_kinds(shared: Arc<Shared>) {
    let named: Vec<(String, String)> = shared
        .trust
        .policy
        .kinds
        .named_kinds()
        .map(|(group, kind)| (group.to_owned(), kind.to_owned()))
        .collect();
    for (group, kind_name) in named {
        let name = crate::api::kinds::kind_name(&group, &kind_name);
        match watch_named_kind(&shared, &group, &kind_name).await {
            Ok(None) => {}
            Ok(Some(why)) => {
                tracing::warn!(
                    kind = name.as_str(),
                    why = why.as_str(),
                    "a kind --kinds names is not watched"
                );
            }
            Err(e) => {
                tracing::warn!(kind = name.as_str(), error = %e, "a kind --kinds names is not watched");
            }
        }
    }
}

/// [`watch_named_kinds`] for one kind; `Some(why)` when it is not watched.
async fn watch_named_kind(
    shared: &Arc<Shared>,
    group: &str,
    kind_name: &str,
) -> Result<Option<String>, Error> {
    if shared.trust.policy.denied_kinds.denies(group, kind_name) {
        return Ok(Some("it is denied (--denied-kinds)".into()));
    }
    let kind = match Kind::find(group, kind_name) {
        Some(kind) => kind,
        None => {
            let lookup = |e: kube::Error| Error::Lookup {
                what: format!("the API group {group:?} (API discovery)"),
                source: e,
            };
            let api_group = match shared.home.cluster.reader.discover_group(group).await {
                Ok(api_group) => api_group,
                Err(kube::Error::Discovery(_)) => {
                    return Ok(Some("no such API group is served".into()));
                }
                Err(e) => return Err(lookup(e)),
            };
            let Some((resource, capabilities)) = api_group.recommended_kind(kind_name) else {
                return Ok(Some("the API server serves no such kind".into()));
            };
            if capabilities.scope == Scope::Cluster {
                return Ok(Some("it is cluster-scoped".into()));
            }
            if !NEEDED_VERBS
                .into_iter()
                .all(|verb| capabilities.supports_operation(verb))
            {
                return Ok(Some("it does not serve every verb a copy needs".into()));
            }
            let found = Discovered {
                group: resource.group,
                version: resource.version,
                kind: resource.kind,
                plural: resource.plural,
            };
            if let Some(KindReadiness::Refused(refused, _)) =
                refused_access(shared, &found.group, &found.kind, &found.plural).await?
            {
                return Ok(Some(refused.message));
            }
            match Kind::register(&found) {
                Ok(kind) => kind,
                Err(e) => return Ok(Some(e.to_string())),
            }
        }
    };
    watch_copies(shared, kind, None);
    Ok(None)
}

/// The kind `rule` names by `objectType`, if it is registered.
pub(crate) fn named_kind(rule: &CopyratorRule) -> Option<Kind> {
    let object_type = rule.object_type()?;
    let (group, _) = object_type.group_version()?;
    Kind::find(group, &object_type.kind)
}

/// Stop unused copy watches each time a rule leaves the view (see
/// [`release_unused`]); runs for the operator's life.
pub(crate) async fn release_on_rules_gone(shared: Arc<Shared>) {
    loop {
        shared.rules_gone.notified().await;
        release_unused(&shared);
    }
}

/// Stop the copy watches of kinds no rule names any more and of which no
/// rule here has a copy left (a rule that changed its kind still has
/// copies of the old one to delete), nor an orphan to collect. Copies of
/// another operator's rules keep no watch running.
pub(crate) fn release_unused(shared: &Shared) {
    let mut watches = lock(&shared.home.cluster.kind_watches);
    // `copyrator plan` plans rules that are in no view: it keeps what it starts.
    if watches.is_empty() || shared.options.keep_kind_watches {
        return;
    }
    let named: Vec<Kind> = read(&shared.rules)
        .values()
        .filter_map(|rule| named_kind(rule))
        .collect();
    watches.retain(|kind, task| {
        // Orphans are kept watched until they are collected.
        let keep = named.contains(kind)
            || read(shared.copies(*kind))
                .rule_uids()
                .any(|uid| shared.is_live_rule(uid))
            || !crate::controller::finalizer::orphans(shared, *kind).is_empty();
        if !keep {
            task.abort();
            forget_watched(shared, *kind);
        }
        keep
    });
    shared.metrics.kind_watches.set(watches.len() as i64);
}

/// The API server stopped serving `kind` (its CustomResourceDefinition
/// was deleted) and its copy watch ended: forget the watch and its copies,
/// and queue the rules that name it, which then read `UnknownKind` until
/// the kind is served again (they look every [`UNKNOWN_KIND_RETRY`]).
pub(crate) fn kind_unserved(shared: &Shared, kind: Kind) {
    {
        let mut watches = lock(&shared.home.cluster.kind_watches);
        watches.remove(&kind);
        shared.metrics.kind_watches.set(watches.len() as i64);
    }
    forget_watched(shared, kind);
    for key in rules_naming(shared, kind) {
        shared.home.queue.add(key, crate::core::scope::Touch::All);
    }
}

/// What the watch of `kind`'s copies held, forgotten as it stops: its
/// copies (not watched: nothing to wait for), and for RoleBindings the
/// Roles (never judged unlisted: a rule of the kind waits for a new list).
fn forget_watched(shared: &Shared, kind: Kind) {
    let views = &shared.home.cluster.views;
    write(shared.copies(kind)).replace_all(Vec::new());
    views.synced.set_copies_of(kind, true);
    if kind.is_role_binding() {
        views.synced.set_roles(false);
        write(&views.roles).replace_all(Vec::new());
    }
}

/// The rules that name `kind` by `objectType`: queued once its copies
/// have listed, since they waited for that.
pub(crate) fn rules_naming(shared: &Shared, kind: Kind) -> Vec<RuleKey> {
    read(&shared.rules)
        .iter()
        .filter(|(_, rule)| named_kind(rule) == Some(kind))
        .map(|(key, _)| key.clone())
        .collect()
}

pub(crate) fn spawn_copy_watch(shared: Arc<Shared>, site: Arc<Site>, kind: Kind) -> JoinHandle<()> {
    tokio::spawn(async move {
        // The orphan collections this watch's lists start: dropped with
        // this task, which aborts them, whether it ends (its kind no longer
        // served) or is aborted (at shutdown, or by `release_unused`).
        let mut collections = JoinSet::new();
        let api = site.cluster.reader.of(&kind.api_resource(), None);
        let config = watch_config().labels(crate::LABEL_RULE_UID);
        let index = site.cluster.views.copies(kind);
        let convert = |object| Arc::new(Object::from_dynamic(kind, object).into_compact());
        let foreign_name = format!("{} (foreign)", kind.info().plural);
        let foreign = follow_foreign(
            api.clone(),
            kind,
            Watching {
                name: &foreign_name,
                health: &site.cluster.health,
                pause: &site.cluster.read_pause,
                stop_if_unserved: false,
            },
            |event| shared.foreign_changed(&site, kind, event),
        );
        let copies = follow(
            api,
            config,
            Watching {
                name: kind.info().plural,
                health: &site.cluster.health,
                pause: &site.cluster.read_pause,
                stop_if_unserved: kind.info().generic,
            },
            convert,
            |change| {
                // The rules a change concerns, and what of theirs it touched.
                let (touched, touch): (Vec<String>, Touch) = match change {
                    Change::Listed(listed) => {
                        copies_listed(&shared, &site, kind, listed, &mut collections)
                    }
                    Change::Applied(object) => {
                        let touch =
                            Touch::Copy(object.namespace.to_string(), object.name.to_string());
                        (write(index).upsert(object), touch)
                    }
                    Change::Deleted(object) => copy_deleted(&shared, &site, kind, &object),
                };
                for uid in touched {
                    if let Some(key) = shared.rule_by_uid(&uid) {
                        site.queue.add(key, touch.clone());
                    }
                }
                if let Touch::Copy(namespace, name) = &touch {
                    shared.copy_place_changed(&site, namespace, name);
                }
            },
        );
        // The foreign and Role watches last as long as the copy watch:
        // never end by themselves.
        let followed = tokio::select! {
            followed = copies => followed,
            () = foreign => WatchEnd::Ended,
            _ = follow_roles_for(&shared, &site, kind) => WatchEnd::Ended,
        };
        if followed == WatchEnd::Unserved {
            tracing::warn!(watch = kind.name(), cluster = %site.name, "the API server no longer serves this kind; its watch stops");
            if site.name == SiteName::Home {
                kind_unserved(&shared, kind);
            }
        }
    })
}

/// The Roles of the home cluster, followed beside the copies of
/// RoleBindings (see [`follow_roles`]); for any other kind, or in a
/// member (which receives no RoleBinding), never ready.
async fn follow_roles_for(shared: &Shared, site: &Site, kind: Kind) -> WatchEnd {
    if kind.is_role_binding() && site.name == SiteName::Home {
        follow_roles(shared, site).await
    } else {
        std::future::pending().await
    }
}

/// Follow the Roles of `site`, each reduced to what it grants (see
/// `core::grants`: a RoleBinding copy is written only where the Role it
/// binds grants what the source's does). A change of what a Role grants
/// queues the rules that copy RoleBindings where its namespace concerns
/// them; the rules wait for the first list.
async fn follow_roles(shared: &Shared, site: &Site) -> WatchEnd {
    let api = site.cluster.reader.everywhere::<Role>();
    let views = &site.cluster.views;
    follow(
        api,
        watch_config(),
        Watching {
            name: "roles",
            health: &site.cluster.health,
            pause: &site.cluster.read_pause,
            stop_if_unserved: false,
        },
        |role| RoleRules::of(&role),
        |change| match change {
            Change::Listed(listed) => {
                write(&views.roles).replace_all(listed);
                views.synced.set_roles(true);
                for key in rules_copying_role_bindings(shared) {
                    site.queue.add(key, Touch::All);
                }
            }
            Change::Applied(role) => {
                let namespace = role.namespace.clone();
                if write(&views.roles).upsert(role) {
                    role_changed(shared, site, &namespace);
                }
            }
            Change::Deleted(role) => {
                if write(&views.roles).remove(&role.namespace, &role.name) {
                    role_changed(shared, site, &role.namespace);
                }
            }
        },
    )
    .await
}

/// What a Role in `namespace` grants changed: each rule that copies
/// RoleBindings looks again at that namespace where it targets it (its
/// copies there bind the Role), or at everything where it takes sources
/// from there (its sources bind it). A rule not resolved yet looks at
/// everything.
fn role_changed(shared: &Shared, site: &Site, namespace: &str) {
    let concerned: Vec<(RuleKey, Touch)> = {
        let resolved = read(&shared.resolved);
        let namespaces = read(&site.cluster.views.namespaces);
        let info = namespaces.get(namespace);
        rules_copying_role_bindings(shared)
            .into_iter()
            .filter_map(|key| {
                let touch = match resolved.get(&key) {
                    None => Touch::All,
                    Some(rule) if rule.source_namespaces.iter().any(|ns| ns == namespace) => {
                        Touch::All
                    }
                    Some(rule) if concerns_namespace(rule, namespace, info, info) => {
                        Touch::Namespace(namespace.to_owned())
                    }
                    Some(_) => return None,
                };
                Some((key, touch))
            })
            .collect()
    };
    for (key, touch) in concerned {
        site.queue.add(key, touch);
    }
}

/// The rules that name RoleBinding by `objectType`.
fn rules_copying_role_bindings(shared: &Shared) -> Vec<RuleKey> {
    read(&shared.rules)
        .iter()
        .filter(|(_, rule)| named_kind(rule).is_some_and(Kind::is_role_binding))
        .map(|(key, _)| key.clone())
        .collect()
}

/// A full list of `kind`'s copies: the view replaced; the rules that
/// name a kind of their own waited for it; copies of rules gone while no
/// operator ran are collected, in a task of `collections`.
fn copies_listed(
    shared: &Arc<Shared>,
    site: &Site,
    kind: Kind,
    listed: Vec<Arc<Object>>,
    collections: &mut JoinSet<()>,
) -> (Vec<String>, Touch) {
    let index = site.cluster.views.copies(kind);
    let touched = write(index).replace_all(listed);
    site.cluster.views.synced.set_copies_of(kind, true);
    if kind.info().generic && site.name == SiteName::Home {
        // Its rules waited for this list, copies or not.
        for key in rules_naming(shared, kind) {
            shared.home.queue.add(key, Touch::All);
        }
        // Copies of rules gone while no operator ran, in a task beside the
        // watch: the deletes take a request each (longer while the API
        // server throttles), and the watch must not stop taking events
        // meanwhile. Finished collections are reaped first.
        while collections.try_join_next().is_some() {}
        let shared = shared.clone();
        collections.spawn(async move {
            crate::controller::finalizer::collect_orphans(&shared, "kind listed").await;
            release_unused(&shared);
        });
    }
    (touched.into_iter().collect(), Touch::All)
}

/// A copy of `kind` deleted: out of the view; deleted by someone else, a
/// copy we wrote counts towards its contest.
fn copy_deleted(
    shared: &Shared,
    site: &Site,
    kind: Kind,
    object: &Arc<Object>,
) -> (Vec<String>, Touch) {
    let index = site.cluster.views.copies(kind);
    let namespace = object.namespace.clone();
    let name = object.name.clone();
    let removed = write(index).deleted(object);
    // Our own deletes left the cache already: this one was
    // someone else's. A copy we wrote that keeps being deleted
    // is contested like one that keeps being changed back.
    if let Some(removed) = &removed
        && let (Some(written_for), Some(rule)) = (
            removed.written_for,
            removed.rule_uid().and_then(|uid| shared.rule_by_uid(uid)),
        )
    {
        lock(&site.backoffs).deleted_by_others(
            &(kind, namespace.to_string(), name.to_string()),
            &rule,
            written_for,
            tokio::time::Instant::now(),
        );
    }
    // Not in the cache yet (the answer to our own create
    // is still on its way): its rule must still hear of it.
    let owner = removed
        .as_ref()
        .unwrap_or(object)
        .rule_uid()
        .map(str::to_owned)
        .into_iter()
        .collect();
    (owner, Touch::Copy(namespace.to_string(), name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::test_support::{add_namespaces, copy, home, home_with, resolved, rule};
    use serde_json::json;

    fn naming(kind: &str, api_version: &str, name: &str) -> CopyratorRule {
        rule(
            &format!("uid-{name}"),
            json!({
                "metadata": {"name": name, "namespace": "ops", "uid": format!("uid-{name}")},
                "ruleType": null,
                "objectType": {"apiVersion": api_version, "kind": kind}
            }),
        )
    }

    #[tokio::test]
    async fn a_denied_kind_is_refused_before_any_lookup() {
        let (shared, _) = home();
        // The client answers nothing: a lookup would be an error.
        let readiness = prepare(&shared, &naming("Pod", "v1", "pods"), true)
            .await
            .expect("no lookup");
        let KindReadiness::Refused(refusal, None) = readiness else {
            panic!("not refused: {readiness:?}");
        };
        assert_eq!(refusal.reason, "DeniedKind", "{}", refusal.message);
    }

    /// The state of an operator that copies every kind not denied (`--kinds '*'`).
    fn every_kind() -> Arc<Shared> {
        let mut trust = crate::core::resolve::Trust::new("ops", false);
        Arc::make_mut(&mut trust.policy).kinds =
            crate::api::kinds::EnabledKinds::parse(&["*".to_owned()]).expect("valid kinds");
        home_with(crate::controller::state::test_shared_with(trust)).0
    }

    #[tokio::test]
    async fn a_kind_not_enabled_is_refused_before_any_lookup() {
        let (shared, _) = home();
        let readiness = prepare(
            &shared,
            &naming("Widget", "example.com/v1", "widgets"),
            true,
        )
        .await
        .expect("no lookup");
        assert!(
            matches!(&readiness, KindReadiness::Refused(r, None) if r.reason == "KindNotEnabled"),
            "{readiness:?}"
        );
    }

    #[tokio::test]
    async fn a_refusal_stands_for_its_interval_without_a_lookup() {
        let shared = every_kind();
        let rule = naming("Widget", "example.com/v1", "widgets");
        let standing = InvalidRule {
            reason: "UnknownKind",
            message: "the API server serves no kind Widget".to_owned(),
        };
        lock(&shared.home.cluster.kind_refusals).remember(
            "example.com/v1/Widget".to_owned(),
            &standing,
            Some(UNKNOWN_KIND_RETRY),
            Instant::now(),
        );
        let readiness = prepare(&shared, &rule, true).await.expect("no lookup");
        assert!(
            matches!(&readiness, KindReadiness::Refused(r, Some(_)) if r.reason == "UnknownKind"),
            "{readiness:?}"
        );
        // Without the standing refusal, the kind is looked up (and this
        // client cannot answer).
        assert!(prepare(&every_kind(), &rule, true).await.is_err());
    }

    /// RoleBinding, registered as API discovery would.
    fn role_bindings() -> Kind {
        Kind::register(&Discovered {
            group: RBAC_GROUP.to_owned(),
            version: "v1".to_owned(),
            kind: "RoleBinding".to_owned(),
            plural: "rolebindings".to_owned(),
        })
        .expect("registered")
    }

    #[tokio::test]
    async fn role_bindings_are_ready_only_once_the_roles_they_bind_are_listed_too() {
        let (shared, _) = home();
        let synced = &shared.home.cluster.views.synced;
        let role_bindings = role_bindings();
        synced.set_copies_of(role_bindings, false);
        synced.set_roles(false);
        assert_eq!(listed(&shared, role_bindings), KindReadiness::Listing);
        synced.set_copies_of(role_bindings, true);
        assert_eq!(listed(&shared, role_bindings), KindReadiness::Listing);
        synced.set_roles(true);
        assert_eq!(listed(&shared, role_bindings), KindReadiness::Ready);
        // Other kinds wait for their copies only.
        synced.set_roles(false);
        synced.set_copies_of(Kind::ConfigMap, true);
        assert_eq!(listed(&shared, Kind::ConfigMap), KindReadiness::Ready);
    }

    #[tokio::test]
    async fn a_copy_deleted_by_someone_else_counts_towards_its_contest() {
        let (shared, _) = home();
        let site = shared.home.clone();
        add_namespaces(&site, &["team-a"]);
        let rule = rule("uid-1", json!({}));
        shared.set_rule(rule.key(), Arc::new(rule.clone()));
        let resolved = resolved(&rule);
        copy(&site, &resolved, "team-a", "settings").await;
        let held = read(site.cluster.views.copies(Kind::ConfigMap))
            .get("team-a", "settings")
            .cloned()
            .expect("the copy is in the view");
        let wanted = held.written_for.expect("written by the operator");
        let key = (Kind::ConfigMap, "team-a".to_owned(), "settings".to_owned());
        let (owners, touch) = copy_deleted(&shared, &site, Kind::ConfigMap, &held);
        assert_eq!(owners, ["uid-1"]);
        assert_eq!(touch, Touch::Copy("team-a".into(), "settings".into()));
        assert!(lock(&site.backoffs).was_deleted_by_others(&key, wanted));
        // A delete of a copy the view never held (the answer to our own
        // create still on its way) still reaches its rule, and is no contest.
        let (shared, _) = home();
        let (owners, _) = copy_deleted(&shared, &shared.home, Kind::ConfigMap, &held);
        assert_eq!(owners, ["uid-1"]);
        assert!(!lock(&shared.home.backoffs).was_deleted_by_others(&key, wanted));
    }

    #[tokio::test]
    async fn a_copy_watch_stops_when_no_rule_names_its_kind_any_more() {
        let (shared, _) = home();
        let role_bindings = role_bindings();
        let rule = naming("RoleBinding", "rbac.authorization.k8s.io/v1", "bindings");
        shared.set_rule(rule.key(), Arc::new(rule.clone()));
        // A watch task that lives until it is aborted, which drops `alive`.
        let (alive, stopped) = tokio::sync::oneshot::channel::<()>();
        let watch = tokio::spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        });
        lock(&shared.home.cluster.kind_watches).insert(role_bindings, watch);
        shared
            .home
            .cluster
            .views
            .synced
            .set_copies_of(role_bindings, false);
        release_unused(&shared);
        assert!(lock(&shared.home.cluster.kind_watches).contains_key(&role_bindings));
        assert_eq!(rules_naming(&shared, role_bindings), [rule.key()]);
        shared.forget_rule(&rule.key());
        release_unused(&shared);
        assert!(!lock(&shared.home.cluster.kind_watches).contains_key(&role_bindings));
        tokio::time::timeout(std::time::Duration::from_secs(5), stopped)
            .await
            .expect("the watch task is aborted")
            .expect_err("and never finishes by itself");
        assert!(
            shared.home.cluster.views.synced.copies_of(role_bindings),
            "a kind not watched is nothing to wait for"
        );
    }
}
