//! The kind a rule names by `objectType`: resolved by API discovery,
//! registered once, and its copies watched from the first rule that needs
//! them to the last.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, verbs};

use crate::Error;
use crate::kinds::{Discovered, Kind};
use crate::rule::{CopyratorRule, InvalidRule, ObjectType, RuleKey};
use crate::state::{Shared, lock, read, write};

/// How soon a rule whose kind the API server does not serve looks again:
/// its CustomResourceDefinition may be installed after it.
pub const UNKNOWN_KIND_RETRY: Duration = Duration::from_secs(30);

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
pub enum KindReadiness {
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
pub async fn prepare(
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
    let kind = match Kind::find(group, &object_type.kind) {
        Some(kind) => kind,
        None => match discover(shared, object_type, group, version).await? {
            Ok(kind) => kind,
            Err(refused) => return Ok(refused),
        },
    };
    if !kind.info().generic {
        // Watched from the start.
        return Ok(if shared.synced.copies_of(kind) {
            KindReadiness::Ready
        } else {
            KindReadiness::Listing
        });
    }
    if !lock(&shared.kind_watches).contains_key(&kind)
        && let Some(refused) = refused_access(shared, kind).await?
    {
        return Ok(refused);
    }
    if !watch_copies(shared, kind, in_view.then(|| rule.key())) {
        // The rule went meanwhile: nothing to watch for it.
        return Ok(KindReadiness::Listing);
    }
    Ok(if shared.synced.copies_of(kind) {
        KindReadiness::Ready
    } else {
        KindReadiness::Listing
    })
}

/// Ask the API server what `object_type` is, and register it when it can
/// be copied.
async fn discover(
    shared: &Shared,
    object_type: &ObjectType,
    group: &str,
    version: &str,
) -> Result<Result<Kind, KindReadiness>, Error> {
    let gvk = GroupVersionKind::gvk(group, version, &object_type.kind);
    let name = object_type.name();
    let (resource, capabilities) = match kube::discovery::pinned_kind(&shared.client, &gvk).await {
        Ok(found) => found,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Ok(Err(unknown(object_type)));
        }
        Err(kube::Error::Discovery(_)) => return Ok(Err(unknown(object_type))),
        Err(e) => {
            return Err(Error::Lookup {
                what: format!("the kind {name} (API discovery)"),
                message: crate::writer::describe(&e),
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
    let found = Discovered {
        group: resource.group,
        version: resource.version,
        kind: resource.kind,
        plural: resource.plural,
    };
    Ok(Kind::register(&found).map_err(|e| {
        KindReadiness::Refused(
            InvalidRule {
                reason: "UnsupportedKind",
                message: e.to_string(),
            },
            Some(UNKNOWN_KIND_RETRY),
        )
    }))
}

/// How soon a rule whose kind the operator may not read looks again: its
/// RBAC may be granted meanwhile.
pub const FORBIDDEN_KIND_RETRY: Duration = Duration::from_secs(60);

/// Whether RBAC lets the operator list `kind` cluster-wide, asked before
/// its copy watch starts: a watch refused for good would keep failing
/// until the liveness probe restarts the operator.
async fn refused_access(shared: &Shared, kind: Kind) -> Result<Option<KindReadiness>, Error> {
    let api: Api<DynamicObject> = Api::all_with(shared.client.clone(), &kind.api_resource());
    let probe = ListParams::default().labels(crate::LABEL_RULE_UID).limit(1);
    match api.list_metadata(&probe).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(Some(KindReadiness::Refused(
            InvalidRule {
                reason: "Forbidden",
                message: format!(
                    "the operator may not list {} cluster-wide (RBAC): grant it get, list, watch, \
                     create, update and delete on {} (the chart's extraKinds); looked at again every {} s",
                    kind.info().rule_type,
                    kind.info().plural,
                    FORBIDDEN_KIND_RETRY.as_secs()
                ),
            },
            Some(FORBIDDEN_KIND_RETRY),
        ))),
        Err(e) => Err(Error::Lookup {
            what: format!("the copies of kind {}", kind.info().rule_type),
            message: crate::writer::describe(&e),
        }),
    }
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
    let mut watches = lock(&shared.kind_watches);
    if let Some(key) = &rule
        && !read(&shared.rules).contains_key(key)
    {
        return false;
    }
    if watches.contains_key(&kind) {
        return true;
    }
    shared.synced.set_copies_of(kind, false);
    watches.insert(kind, crate::watch::spawn_copy_watch(shared.clone(), kind));
    shared.metrics.kind_watches.set(watches.len() as i64);
    true
}

/// The kind `rule` names by `objectType`, if it is registered.
pub fn named_kind(rule: &CopyratorRule) -> Option<Kind> {
    let object_type = rule.object_type()?;
    let (group, _) = object_type.group_version()?;
    Kind::find(group, &object_type.kind)
}

/// Stop the copy watches of kinds no rule names any more and of which no
/// rule here has a copy left (a rule that changed its kind still has
/// copies of the old one to delete). Copies of rules that are not ours
/// (another operator's, or orphans) keep no watch running.
pub fn release_unused(shared: &Shared) {
    let mut watches = lock(&shared.kind_watches);
    if watches.is_empty() {
        return;
    }
    let named: Vec<Kind> = read(&shared.rules)
        .values()
        .filter_map(|rule| named_kind(rule))
        .collect();
    watches.retain(|kind, task| {
        let keep = named.contains(kind)
            || read(shared.copies(*kind))
                .rule_uids()
                .any(|uid| shared.is_live_rule(uid));
        if !keep {
            task.abort();
            write(shared.copies(*kind)).replace_all(Vec::new());
            // Not watched: nothing to wait for.
            shared.synced.set_copies_of(*kind, true);
        }
        keep
    });
    shared.metrics.kind_watches.set(watches.len() as i64);
}

/// The rules that name `kind` by `objectType`: queued once its copies
/// have listed, since they waited for that.
pub fn rules_naming(shared: &Shared, kind: Kind) -> Vec<RuleKey> {
    read(&shared.rules)
        .iter()
        .filter(|(_, rule)| named_kind(rule) == Some(kind))
        .map(|(key, _)| key.clone())
        .collect()
}
