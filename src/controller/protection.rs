//! Follows the chart's copy protection (its ValidatingAdmissionPolicy and
//! binding, read only) in each cluster that has one to follow: at home
//! (`--copy-protection`) and in every member (`--member-copy-protection`).
//! It says whether each is in force: `copyrator_copy_protection_in_force`
//! per cluster, and a warning in the log and a Warning Event at home each
//! time one stops being (deleted, weakened, failing type checking, or not
//! readable). Restoring edited copies stays the backstop meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::cluster::watch::{Change, Watching, follow, watch_config};
use crate::controller::site::Site;
use crate::controller::state::Shared;
use crate::core::protection::judge;
use crate::ops::http::Health;
use crate::ops::metrics::ClusterLabels;
use crate::sync::lock;

/// A policy and binding whose watches have failed since the start for this
/// long, without ever listing, cannot be read: the protection is then said
/// not to be in force, since nobody can tell that it is.
const UNREADABLE_AFTER: Duration = Duration::from_secs(10);
/// How often an unlisted protection is looked at again.
const LOOK_AGAIN_EVERY: Duration = Duration::from_secs(5);

const POLICY_WATCH: &str = "copy protection policy";
const BINDING_WATCH: &str = "copy protection binding";

/// A copy protection to follow, and where its loss is said.
pub(crate) struct Followed {
    /// The policy's and its binding's name.
    pub(crate) name: String,
    /// The cluster it protects, as the metric's `cluster` label says it.
    pub(crate) cluster: String,
    /// The object at home whose Events say the protection is off: the
    /// policy itself at home; a member's entry in the inventory (no Event
    /// is ever written in a member).
    pub(crate) said_on: ObjectReference,
}

impl Followed {
    /// The home cluster's protection, `name`: its Events go on its policy.
    pub(crate) fn at_home(shared: &Shared, name: String) -> Self {
        Self {
            said_on: ObjectReference {
                api_version: Some("admissionregistration.k8s.io/v1".into()),
                kind: Some("ValidatingAdmissionPolicy".into()),
                name: Some(name.clone()),
                ..ObjectReference::default()
            },
            cluster: shared.options.cluster_name.clone(),
            name,
        }
    }
}

/// What the watches last saw, and whether it was in force.
#[derive(Default)]
struct Seen {
    policy: Option<ValidatingAdmissionPolicy>,
    binding: Option<ValidatingAdmissionPolicyBinding>,
    /// None until it was first judged.
    in_force: Option<bool>,
    listed: (bool, bool),
}

/// Follow `followed` in `site`'s API server until aborted.
pub(crate) fn spawn_protection_watch(
    shared: Arc<Shared>,
    site: Arc<Site>,
    followed: Followed,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let seen = Mutex::new(Seen::default());
        let changed = tokio::sync::Notify::new();
        let config = watch_config().fields(&format!("metadata.name={}", followed.name));
        let cluster = &site.cluster;
        // A health of their own: a protection that cannot be read is said
        // as not in force, and never fails the operator's probes.
        let health = Arc::new(Health::new(Duration::from_secs(3600)));
        let watching = |name| Watching {
            name,
            health: &health,
            pause: &cluster.read_pause,
            stop_if_unserved: false,
        };
        let policy = follow(
            cluster.reader.everywhere::<ValidatingAdmissionPolicy>(),
            config.clone(),
            watching(POLICY_WATCH),
            |p| p,
            |change| {
                let mut seen = lock(&seen);
                seen.listed.0 = true;
                seen.policy = latest(change);
                changed.notify_one();
            },
        );
        let binding = follow(
            cluster
                .reader
                .everywhere::<ValidatingAdmissionPolicyBinding>(),
            config,
            watching(BINDING_WATCH),
            |b| b,
            |change| {
                let mut seen = lock(&seen);
                seen.listed.1 = true;
                seen.binding = latest(change);
                changed.notify_one();
            },
        );
        let started = Instant::now();
        let report = async {
            loop {
                tokio::select! {
                    () = changed.notified() => {}
                    () = tokio::time::sleep(LOOK_AGAIN_EVERY) => {}
                }
                let unreadable = started.elapsed() >= UNREADABLE_AFTER
                    && (health.is_failing(POLICY_WATCH) || health.is_failing(BINDING_WATCH));
                report(&shared, &followed, &seen, unreadable).await;
            }
        };
        tokio::join!(policy, binding, report);
    })
}

/// The one object a watch by name holds after `change`.
fn latest<T>(change: Change<T>) -> Option<T> {
    match change {
        Change::Listed(mut listed) => listed.pop(),
        Change::Applied(object) => Some(object),
        Change::Deleted(_) => None,
    }
}

/// Judge what was seen, and say a change: the metric always, the log and
/// an Event when it stops being in force (`unreadable`: a watch has failed
/// since the start, and never listed).
async fn report(shared: &Shared, followed: &Followed, seen: &Mutex<Seen>, unreadable: bool) {
    let name = &followed.name;
    let (verdict, was) = {
        let mut seen = lock(seen);
        let verdict = if seen.listed == (true, true) {
            judge(name, seen.policy.as_ref(), seen.binding.as_ref())
        } else if unreadable && seen.in_force.is_none() {
            Err(format!(
                "the ValidatingAdmissionPolicy and binding {name} cannot be read \
                 (list and watch on them are refused, or fail)"
            ))
        } else {
            return;
        };
        let was = seen.in_force.replace(verdict.is_ok());
        (verdict, was)
    };
    let cluster = followed.cluster.as_str();
    shared
        .metrics
        .copy_protection_in_force
        .get_or_create(&ClusterLabels {
            cluster: cluster.to_owned(),
        })
        .set(i64::from(verdict.is_ok()));
    match (verdict, was) {
        (Ok(()), Some(false)) => {
            info!(cluster, protection = name, "copy protection in force again")
        }
        (Ok(()), _) | (Err(_), Some(false)) => {}
        (Err(why), _) => {
            warn!(
                cluster,
                protection = name,
                reason = why.as_str(),
                "copy protection not in force: live copies can be edited (they are put back)"
            );
            let event = Event {
                type_: EventType::Warning,
                reason: "CopyProtectionOff".into(),
                note: Some(format!(
                    "copies in cluster {cluster} are not protected at admission: {why}; \
                     restore it (helm upgrade)"
                )),
                action: "Watch".into(),
                secondary: None,
            };
            if let Err(e) = shared
                .home
                .cluster
                .writer
                .event_on(&followed.said_on, &event)
                .await
            {
                warn!(error = %crate::error::describe(&e), "recording an event failed");
            }
        }
    }
}
