//! Prometheus metrics, served at /metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub(crate) result: &'static str,
}

/// A failed write, in the cluster it was sent to (the home cluster's name
/// is `--cluster-name`; a member's, its inventory name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FailureLabels {
    pub(crate) class: &'static str,
    pub(crate) cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WriteLabels {
    pub(crate) verb: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) cluster: String,
}

/// The classes of [`Metrics::write_failures`].
const FAILURE_CLASSES: [&str; 5] = ["conflict", "throttled", "refused", "invalid", "transient"];

/// A rule, named apart from the `namespace` label that Prometheus gives
/// every scraped target.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RuleLabels {
    pub(crate) rule_namespace: String,
    pub(crate) rule: String,
}

pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) reconciles: Family<ResultLabels, Counter>,
    pub(crate) reconcile_duration: Histogram,
    pub(crate) copies_examined: Counter,
    pub(crate) api_writes: Family<WriteLabels, Counter>,
    pub(crate) copies_managed: Gauge,
    pub(crate) conflicts_skipped: Gauge,
    pub(crate) copies_contested: Gauge,
    pub(crate) write_failures: Family<FailureLabels, Counter>,
    pub(crate) queue_depth: Gauge,
    pub(crate) leader: Gauge,
    pub(crate) source_watches: Gauge,
    pub(crate) kind_watches: Gauge,
    pub(crate) write_concurrency: Gauge,
    pub(crate) resyncs: Family<CauseLabels, Counter>,
    pub(crate) rule_ready: Family<RuleLabels, Gauge>,
    /// 1 while a member cluster's API server answers, 0 while it does not;
    /// one series per member of the inventory.
    pub(crate) member_reachable: Family<ClusterLabels, Gauge>,
    /// Copies in place in a member cluster, across its rules.
    pub(crate) member_copies: Family<ClusterLabels, Gauge>,
    /// Copies not made in a member cluster because a foreign object holds
    /// the name, across its rules.
    pub(crate) member_conflicts: Family<ClusterLabels, Gauge>,
    /// Workloads rolled by `rollout.restartConsumers`, by kind.
    pub(crate) consumer_restarts: Family<WorkloadLabels, Counter>,
    /// Reviews of /metrics callers asked of the API server, by verdict.
    pub(crate) metrics_reviews: Family<VerdictLabels, Counter>,
    /// /metrics callers answered 503 unreviewed: `--max-metrics-reviews`
    /// reviews were in flight.
    pub(crate) metrics_reviews_busy: Counter,
    /// Mark key Secrets found that this installation's operator did not
    /// make (or that hold no usable key), each reported and replaced.
    pub(crate) mark_key_refused: Counter,
    /// The Kubernetes release each cluster's API server reports.
    cluster_version: Family<VersionLabels, Gauge>,
    /// 1 for a cluster older than the oldest supported release.
    cluster_below_floor: Family<ClusterLabels, Gauge>,
    /// 1 while the chart's copy protection is in force in a cluster.
    pub(crate) copy_protection_in_force: Family<ClusterLabels, Gauge>,
    /// Runs of members' credential plugins, by member, provider and result.
    pub(crate) credential_plugin_runs: Family<PluginRunLabels, Counter>,
    /// The version each cluster reported last, so that an upgrade
    /// replaces its series.
    versions_seen: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// A run of a member's credential plugin: `ok`, or why it gave no token.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PluginRunLabels {
    pub(crate) cluster: String,
    pub(crate) provider: String,
    pub(crate) result: &'static str,
}

/// A cluster and the `gitVersion` its API server reports.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VersionLabels {
    pub(crate) cluster: String,
    pub(crate) version: String,
}

/// What a review of a /metrics caller found.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VerdictLabels {
    pub(crate) verdict: &'static str,
}

/// A workload kind: Deployment, StatefulSet or DaemonSet.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WorkloadLabels {
    pub(crate) kind: &'static str,
}

/// A member cluster, by its name in the inventory (the cardinality is the
/// inventory's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterLabels {
    pub(crate) cluster: String,
}

/// The metrics as one cluster's writer reports to them: each write
/// labelled with the cluster's name.
#[derive(Clone)]
pub(crate) struct ClusterMetrics {
    metrics: std::sync::Arc<Metrics>,
    cluster: String,
}

impl ClusterMetrics {
    pub(crate) fn new(metrics: std::sync::Arc<Metrics>, cluster: &str) -> Self {
        Self {
            metrics,
            cluster: cluster.to_owned(),
        }
    }

    pub(crate) fn write(&self, verb: &'static str, kind: &'static str) {
        self.metrics.write(&self.cluster, verb, kind);
    }

    pub(crate) fn write_failed(&self, class: &'static str) {
        self.metrics.write_failed(&self.cluster, class);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CauseLabels {
    pub(crate) cause: &'static str,
}

impl Default for Metrics {
    #[expect(
        clippy::too_many_lines,
        reason = "the registration of every metric with its help text, one after another: the list /metrics serves, read in one place"
    )]
    fn default() -> Self {
        let mut registry = Registry::with_prefix("copyrator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Rule reconciles by result (success, error, invalid)",
            reconciles.clone(),
        );
        let reconcile_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "reconcile_duration_seconds",
            "Time one rule reconcile takes, writes included",
            reconcile_duration.clone(),
        );
        let copies_examined = Counter::default();
        registry.register(
            "copies_examined",
            "Copies the rules' passes looked at (a pass looks only at what changed since the last)",
            copies_examined.clone(),
        );
        let api_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "api_writes",
            "Write requests sent to an API server by verb, kind and cluster",
            api_writes.clone(),
        );
        let copies_managed = Gauge::default();
        registry.register(
            "copies_managed",
            "Copies in place across all rules in the home cluster",
            copies_managed.clone(),
        );
        let conflicts_skipped = Gauge::default();
        registry.register(
            "conflicts_skipped",
            "Copies not made because another object holds the name, or because they would grant what their source does not",
            conflicts_skipped.clone(),
        );
        let copies_contested = Gauge::default();
        registry.register(
            "copies_contested",
            "Copies that another writer keeps changing back; writes to them back off",
            copies_contested.clone(),
        );
        let write_failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "write_failures",
            "Failed write requests by class (conflict, throttled, refused, invalid, transient) and cluster",
            write_failures.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Rules waiting to be reconciled",
            queue_depth.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this process holds the leader Lease (or runs without election)",
            leader.clone(),
        );
        let source_watches = Gauge::default();
        registry.register(
            "source_watches",
            "Source watches open, shared by all rules (at most --max-source-watches)",
            source_watches.clone(),
        );
        let kind_watches = Gauge::default();
        registry.register(
            "kind_watches",
            "Kinds named by objectType whose copies are watched: each from its first rule to its last",
            kind_watches.clone(),
        );
        let write_concurrency = Gauge::default();
        registry.register(
            "write_concurrency",
            "Copy writes allowed in flight now: --write-concurrency, halved when the API server \
             throttles (429) and grown back by one per round of writes that go through",
            write_concurrency.clone(),
        );
        let resyncs = Family::<CauseLabels, Counter>::default();
        registry.register(
            "resyncs",
            "Passes over every rule, with orphans collected first, by cause (start, interval, leading)",
            resyncs.clone(),
        );
        for cause in ["start", "interval", "leading"] {
            drop(resyncs.get_or_create(&CauseLabels { cause }));
        }
        let member_reachable = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "member_cluster_reachable",
            "Whether a member cluster's API server answers (1) or not (0)",
            member_reachable.clone(),
        );
        let rule_ready = Family::<RuleLabels, Gauge>::default();
        registry.register(
            "rule_ready",
            "1 while the rule's Ready condition is True, 0 otherwise (False, Unknown or no status yet)",
            rule_ready.clone(),
        );
        // Every series exists from the start, so that a first error is an
        // increase and not a new series that alerts cannot see (the write
        // series come with each cluster: `cluster_started`).
        for result in ["success", "error", "invalid"] {
            drop(reconciles.get_or_create(&ResultLabels { result }));
        }
        let member_copies = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "member_copies",
            "Copies in place in a member cluster, across all rules",
            member_copies.clone(),
        );
        let member_conflicts = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "member_conflicts_skipped",
            "Copies not made in a member cluster because a foreign object holds the name",
            member_conflicts.clone(),
        );
        let consumer_restarts = Family::<WorkloadLabels, Counter>::default();
        registry.register(
            "consumer_restarts",
            "Workloads rolled because a copy they use changed (rollout.restartConsumers), by kind",
            consumer_restarts.clone(),
        );
        for kind in ["Deployment", "StatefulSet", "DaemonSet"] {
            drop(consumer_restarts.get_or_create(&WorkloadLabels { kind }));
        }
        let metrics_reviews = Family::<VerdictLabels, Counter>::default();
        registry.register(
            "metrics_reviews",
            "Reviews of /metrics callers asked of the API server under --metrics-auth (a \
             TokenReview, and a SubjectAccessReview for a token it accepts), by verdict \
             (allowed, forbidden, unauthenticated, unavailable)",
            metrics_reviews.clone(),
        );
        let metrics_reviews_busy = Counter::default();
        registry.register(
            "metrics_reviews_busy",
            "/metrics callers answered 503 without a review: --max-metrics-reviews reviews were \
             in flight",
            metrics_reviews_busy.clone(),
        );
        let mark_key_refused = Counter::default();
        registry.register(
            "mark_key_refused",
            "Mark key Secrets refused at start: not made by this installation's operator (no \
             valid proof) or holding no usable key; each is replaced by a new key",
            mark_key_refused.clone(),
        );
        let cluster_version = Family::<VersionLabels, Gauge>::default();
        registry.register(
            "cluster_kubernetes_version",
            "1 for the Kubernetes version (gitVersion) each cluster's API server reports, home \
             and members",
            cluster_version.clone(),
        );
        let cluster_below_floor = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "cluster_below_supported_floor",
            "1 for a cluster older than the oldest supported Kubernetes release (Copyrator \
             keeps working there, untested), 0 otherwise",
            cluster_below_floor.clone(),
        );
        let copy_protection_in_force = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "copy_protection_in_force",
            "1 while the copy protection the operator was told to follow in a cluster (a \
             ValidatingAdmissionPolicy and its binding: --copy-protection at home, \
             --member-copy-protection in members) is in force there, 0 when either is \
             missing, weakened, fails type checking or cannot be read",
            copy_protection_in_force.clone(),
        );
        let credential_plugin_runs = Family::<PluginRunLabels, Counter>::default();
        registry.register(
            "credential_plugin_runs",
            "Runs of the credential plugins of members reached through a ClusterProfile's access \
             provider (--clusterprofile-provider-file), by member, provider and result: ok, \
             failed, timed_out, not_started or no_token",
            credential_plugin_runs.clone(),
        );
        Self {
            registry,
            credential_plugin_runs,
            cluster_version,
            cluster_below_floor,
            copy_protection_in_force,
            versions_seen: std::sync::Mutex::default(),
            reconciles,
            reconcile_duration,
            copies_examined,
            api_writes,
            copies_managed,
            conflicts_skipped,
            copies_contested,
            write_failures,
            queue_depth,
            leader,
            source_watches,
            kind_watches,
            write_concurrency,
            resyncs,
            rule_ready,
            member_reachable,
            member_copies,
            member_conflicts,
            consumer_restarts,
            metrics_reviews,
            metrics_reviews_busy,
            mark_key_refused,
        }
    }
}

impl Metrics {
    /// A write request sent to the API server of `cluster`.
    pub(crate) fn write(&self, cluster: &str, verb: &'static str, kind: &'static str) {
        self.api_writes
            .get_or_create(&WriteLabels {
                verb,
                kind,
                cluster: cluster.to_owned(),
            })
            .inc();
    }

    pub(crate) fn write_failed(&self, cluster: &str, class: &'static str) {
        self.write_failures
            .get_or_create(&FailureLabels {
                class,
                cluster: cluster.to_owned(),
            })
            .inc();
    }

    /// The series of a cluster's writes, at 0: the home cluster's (which
    /// also writes its rules' statuses and Events) at start, a member's
    /// when it joins the inventory.
    pub(crate) fn cluster_started(&self, cluster: &str, home: bool) {
        let kinds = crate::api::kinds::Kind::all().filter(|kind| home || !kind.info().generic);
        let mut writes: Vec<(&'static str, &'static str)> = kinds
            .flat_map(|kind| ["create", "update", "delete"].map(|verb| (verb, kind.name())))
            .collect();
        if home {
            writes.extend([("patch", "CopyratorRule"), ("create", "Event")]);
        }
        for (verb, kind) in writes {
            drop(self.api_writes.get_or_create(&WriteLabels {
                verb,
                kind,
                cluster: cluster.to_owned(),
            }));
        }
        for class in FAILURE_CLASSES {
            drop(self.write_failures.get_or_create(&FailureLabels {
                class,
                cluster: cluster.to_owned(),
            }));
        }
    }

    /// A member was disconnected (it left the inventory, or its entry can
    /// no longer be used): its series go, so the cardinality is the
    /// inventory's.
    pub(crate) fn cluster_gone(&self, cluster: &str) {
        self.member_reachable(cluster, None);
        self.forget_cluster_version(cluster);
        let labels = ClusterLabels {
            cluster: cluster.to_owned(),
        };
        self.member_copies.remove(&labels);
        self.member_conflicts.remove(&labels);
        self.copy_protection_in_force.remove(&labels);
        for kind in crate::api::kinds::Kind::all() {
            for verb in ["create", "update", "delete"] {
                self.api_writes.remove(&WriteLabels {
                    verb,
                    kind: kind.name(),
                    cluster: cluster.to_owned(),
                });
            }
        }
        for class in FAILURE_CLASSES {
            self.write_failures.remove(&FailureLabels {
                class,
                cluster: cluster.to_owned(),
            });
        }
    }

    /// The copies and conflicts of a member, across its rules.
    pub(crate) fn member_counts(&self, cluster: &str, copies: u64, conflicts: u64) {
        let labels = ClusterLabels {
            cluster: cluster.to_owned(),
        };
        self.member_copies
            .get_or_create(&labels)
            .set(i64::try_from(copies).unwrap_or(i64::MAX));
        self.member_conflicts
            .get_or_create(&labels)
            .set(i64::try_from(conflicts).unwrap_or(i64::MAX));
    }

    /// A pass over every rule began (its orphans collected), for `cause`.
    pub(crate) fn resynced(&self, cause: &'static str) {
        self.resyncs.get_or_create(&CauseLabels { cause }).inc();
    }

    pub(crate) fn reconciled(&self, result: &'static str) {
        self.reconciles
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The readiness of a rule, as its status says; `None` forgets the rule.
    pub(crate) fn rule_readiness(&self, namespace: &str, name: &str, ready: Option<bool>) {
        let labels = RuleLabels {
            rule_namespace: namespace.to_owned(),
            rule: name.to_owned(),
        };
        match ready {
            Some(ready) => {
                self.rule_ready.get_or_create(&labels).set(i64::from(ready));
            }
            None => {
                self.rule_ready.remove(&labels);
            }
        }
    }

    /// The version a cluster's API server reports; returns whether it is
    /// new for the cluster (first seen, or changed by an upgrade).
    pub(crate) fn cluster_version(&self, cluster: &str, version: &str, below_floor: bool) -> bool {
        let previous =
            crate::sync::lock(&self.versions_seen).insert(cluster.to_owned(), version.to_owned());
        if previous.as_deref() == Some(version) {
            return false;
        }
        if let Some(previous) = previous {
            self.cluster_version.remove(&VersionLabels {
                cluster: cluster.to_owned(),
                version: previous,
            });
        }
        self.cluster_version
            .get_or_create(&VersionLabels {
                cluster: cluster.to_owned(),
                version: version.to_owned(),
            })
            .set(1);
        self.cluster_below_floor
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_owned(),
            })
            .set(i64::from(below_floor));
        true
    }

    fn forget_cluster_version(&self, cluster: &str) {
        if let Some(previous) = crate::sync::lock(&self.versions_seen).remove(cluster) {
            self.cluster_version.remove(&VersionLabels {
                cluster: cluster.to_owned(),
                version: previous,
            });
        }
        self.cluster_below_floor.remove(&ClusterLabels {
            cluster: cluster.to_owned(),
        });
    }

    /// A member's reachability; `None` when it left the inventory.
    pub(crate) fn member_reachable(&self, cluster: &str, reachable: Option<bool>) {
        let labels = ClusterLabels {
            cluster: cluster.to_owned(),
        };
        match reachable {
            Some(reachable) => {
                self.member_reachable
                    .get_or_create(&labels)
                    .set(i64::from(reachable));
            }
            None => {
                self.member_reachable.remove(&labels);
            }
        }
    }

    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exposed() {
        let m = Metrics::default();
        m.cluster_started("home", true);
        m.write("home", "create", "ConfigMap");
        m.reconciled("success");
        m.reconcile_duration.observe(0.01);
        let text = m.encode();
        assert!(
            text.contains("copyrator_reconciles_total{result=\"error\"} 0"),
            "{text}"
        );
        assert!(
            text.contains(
                "copyrator_api_writes_total{verb=\"delete\",kind=\"Secret\",cluster=\"home\"} 0"
            ),
            "{text}"
        );
        for family in [
            "copyrator_reconciles_total{result=\"success\"} 1",
            "copyrator_reconcile_duration_seconds_count 1",
            "copyrator_api_writes_total{verb=\"create\",kind=\"ConfigMap\",cluster=\"home\"} 1",
            "copyrator_copies_managed 0",
            "copyrator_conflicts_skipped 0",
            "copyrator_copies_contested 0",
            "copyrator_write_failures_total{class=\"refused\",cluster=\"home\"} 0",
            "copyrator_queue_depth 0",
            "copyrator_leader 0",
        ] {
            assert!(text.contains(family), "{family} missing from\n{text}");
        }
    }

    #[test]
    fn a_rule_has_a_readiness_series_until_it_is_forgotten() {
        let m = Metrics::default();
        m.rule_readiness("ops", "main", Some(false));
        m.rule_readiness("ops", "other", Some(true));
        let text = m.encode();
        assert!(
            text.contains("copyrator_rule_ready{rule_namespace=\"ops\",rule=\"main\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("copyrator_rule_ready{rule_namespace=\"ops\",rule=\"other\"} 1"),
            "{text}"
        );
        m.rule_readiness("ops", "main", Some(true));
        m.rule_readiness("ops", "other", None);
        let text = m.encode();
        assert!(
            text.contains("copyrator_rule_ready{rule_namespace=\"ops\",rule=\"main\"} 1"),
            "{text}"
        );
        assert!(!text.contains("rule=\"other\""), "{text}");
    }

    #[test]
    fn a_member_has_its_series_while_it_is_in_the_inventory() {
        let m = Metrics::default();
        m.cluster_started("home", true);
        m.cluster_started("eu-1", false);
        m.write("eu-1", "update", "Secret");
        m.write_failed("eu-1", "refused");
        m.member_reachable("eu-1", Some(true));
        m.member_counts("eu-1", 12, 1);
        let text = m.encode();
        for series in [
            "copyrator_api_writes_total{verb=\"update\",kind=\"Secret\",cluster=\"eu-1\"} 1",
            "copyrator_api_writes_total{verb=\"create\",kind=\"ConfigMap\",cluster=\"eu-1\"} 0",
            "copyrator_write_failures_total{class=\"refused\",cluster=\"eu-1\"} 1",
            "copyrator_write_failures_total{class=\"refused\",cluster=\"home\"} 0",
            "copyrator_member_cluster_reachable{cluster=\"eu-1\"} 1",
            "copyrator_member_copies{cluster=\"eu-1\"} 12",
            "copyrator_member_conflicts_skipped{cluster=\"eu-1\"} 1",
        ] {
            assert!(text.contains(series), "{series} missing from\n{text}");
        }
        // A member copies the built-in kinds only, and writes no statuses.
        assert!(
            !text.contains("kind=\"CopyratorRule\",cluster=\"eu-1\""),
            "{text}"
        );
        m.cluster_gone("eu-1");
        let text = m.encode();
        assert!(!text.contains("eu-1"), "{text}");
        assert!(text.contains("cluster=\"home\""), "{text}");
    }
}
