//! Follows the chart's copy protection (`--copy-protection`: its
//! ValidatingAdmissionPolicy and binding, read only) and says whether it is
//! in force: `copyrator_copy_protection_in_force`, and a warning in the log
//! and a Warning Event on the policy each time it stops being (deleted,
//! weakened, or failing type checking). Restoring edited copies stays the
//! backstop meanwhile.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::cluster::watch::{Change, Watching, follow, watch_config};
use crate::controller::state::Shared;
use crate::core::protection::judge;
use crate::ops::metrics::ClusterLabels;
use crate::sync::lock;

/// What the watches last saw, and whether it was in force.
#[derive(Default)]
struct Seen {
    policy: Option<ValidatingAdmissionPolicy>,
    binding: Option<ValidatingAdmissionPolicyBinding>,
    /// None until both watches have listed.
    in_force: Option<bool>,
    listed: (bool, bool),
}

pub(crate) fn spawn_protection_watch(shared: Arc<Shared>, name: String) -> JoinHandle<()> {
    tokio::spawn(async move {
        let seen = Mutex::new(Seen::default());
        let changed = tokio::sync::Notify::new();
        let config = watch_config().fields(&format!("metadata.name={name}"));
        let cluster = &shared.home.cluster;
        let watching = |what| Watching {
            name: what,
            health: &cluster.health,
            pause: &cluster.read_pause,
            stop_if_unserved: false,
        };
        let policy = follow(
            cluster.reader.everywhere::<ValidatingAdmissionPolicy>(),
            config.clone(),
            watching("copy protection policy"),
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
            watching("copy protection binding"),
            |b| b,
            |change| {
                let mut seen = lock(&seen);
                seen.listed.1 = true;
                seen.binding = latest(change);
                changed.notify_one();
            },
        );
        let report = async {
            loop {
                changed.notified().await;
                report(&shared, &name, &seen).await;
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

async fn report(shared: &Shared, name: &str, seen: &Mutex<Seen>) {
    let (verdict, was) = {
        let mut seen = lock(seen);
        if seen.listed != (true, true) {
            return;
        }
        let verdict = judge(name, seen.policy.as_ref(), seen.binding.as_ref());
        let was = seen.in_force.replace(verdict.is_ok());
        (verdict, was)
    };
    let cluster = &shared.options.cluster_name;
    shared
        .metrics
        .copy_protection_in_force
        .get_or_create(&ClusterLabels {
            cluster: cluster.clone(),
        })
        .set(i64::from(verdict.is_ok()));
    match (verdict, was) {
        (Ok(()), Some(false)) => {
            info!(cluster, protection = name, "copy protection in force again")
        }
        (Ok(()), _) => {}
        (Err(_), Some(false)) => {}
        (Err(why), _) => {
            warn!(
                cluster,
                protection = name,
                reason = why.as_str(),
                "copy protection not in force: live copies can be edited (they are put back)"
            );
            let reference = ObjectReference {
                api_version: Some("admissionregistration.k8s.io/v1".into()),
                kind: Some("ValidatingAdmissionPolicy".into()),
                name: Some(name.to_owned()),
                ..ObjectReference::default()
            };
            let event = Event {
                type_: EventType::Warning,
                reason: "CopyProtectionOff".into(),
                note: Some(format!(
                    "copies are not protected at admission: {why}; restore it (helm upgrade)"
                )),
                action: "Watch".into(),
                secondary: None,
            };
            if let Err(e) = shared
                .home
                .cluster
                .writer
                .event_on(&reference, &event)
                .await
            {
                warn!(error = %crate::error::describe(&e), "recording an event failed");
            }
        }
    }
}
