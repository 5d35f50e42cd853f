//! Each cluster's Kubernetes version, read from its API server and reported:
//! a metric per cluster, and one warning line when a cluster is older than
//! the supported floor (the operator keeps working there).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::version::Info;
use tracing::{info, warn};

use crate::controller::state::Shared;
use crate::core::versions::{FLOOR, NEWEST, Support, support_of};
use crate::ops::metrics::Metrics;

/// How often the home cluster's version is read again (an upgrade under a
/// running operator is reported within this).
const HOME_EVERY: Duration = Duration::from_secs(600);
/// How soon an unanswered read of it is tried again.
const HOME_RETRY: Duration = Duration::from_secs(15);

/// Take a cluster's `/version` answer: its metric series, and, the first
/// time a version is seen for the cluster, one line in the log.
pub(crate) fn report(metrics: &Metrics, cluster: &str, answer: &Info) {
    let support = support_of(answer);
    let version = answer.git_version.as_str();
    if !metrics.cluster_version(cluster, version, support.below_floor()) {
        return;
    }
    let (floor, newest) = (FLOOR.to_string(), NEWEST.to_string());
    match support {
        Support::BelowFloor(release) => warn!(
            cluster,
            version,
            release = %release,
            floor = floor.as_str(),
            "this cluster runs a Kubernetes release older than the oldest supported; Copyrator \
             keeps working there, but that release is not tested"
        ),
        Support::AboveNewest(release) => info!(
            cluster,
            version,
            release = %release,
            newest = newest.as_str(),
            "this cluster runs a Kubernetes release newer than the newest tested"
        ),
        Support::Supported(_) | Support::Unknown => {
            info!(cluster, version, "cluster version");
        }
    }
}

/// Read the home cluster's version now and every [`HOME_EVERY`]; runs
/// until dropped.
pub(crate) async fn watch_home(shared: Arc<Shared>) {
    let reader = shared.home.cluster.reader.clone();
    let cluster = shared.options.cluster_name.clone();
    loop {
        let wait = match reader.version().await {
            Ok(answer) => {
                report(&shared.metrics, &cluster, &answer);
                HOME_EVERY
            }
            Err(error) => {
                warn!(
                    cluster = cluster.as_str(),
                    error = %crate::error::describe(&error),
                    "could not read the cluster's version; trying again"
                );
                HOME_RETRY
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(minor: &str, git_version: &str) -> Info {
        Info {
            major: "1".into(),
            minor: minor.into(),
            git_version: git_version.into(),
            ..Info::default()
        }
    }

    #[test]
    fn a_cluster_below_the_floor_is_reported_once_per_version_and_an_upgrade_replaces_it() {
        let metrics = Metrics::default();
        let below = answer("32", "v1.32.9");
        report(&metrics, "eu-1", &below);
        let text = metrics.encode();
        assert!(
            text.contains("copyrator_cluster_below_supported_floor{cluster=\"eu-1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "copyrator_cluster_kubernetes_version{cluster=\"eu-1\",version=\"v1.32.9\"} 1"
            ),
            "{text}"
        );
        assert!(
            !metrics.cluster_version("eu-1", "v1.32.9", true),
            "the same version again is no news"
        );
        report(&metrics, "eu-1", &answer("33", "v1.33.1"));
        let text = metrics.encode();
        assert!(
            text.contains("copyrator_cluster_below_supported_floor{cluster=\"eu-1\"} 0"),
            "{text}"
        );
        assert!(
            !text.contains("v1.32.9"),
            "the old version's series went: {text}"
        );
        metrics.cluster_gone("eu-1");
        let text = metrics.encode();
        assert!(!text.contains("cluster=\"eu-1\""), "{text}");
    }
}
