//! The labels and annotations of other tools (and Copyrator's own) that
//! never travel to copies, with why: shared by the planner, which strips
//! them, and the rule's validation, which refuses to add them.

use crate::api::selector::KeyGlob;
use std::collections::BTreeMap;

/// Labels and annotations that never travel to a copy, each with why:
/// what says who owns or tracks the source (a copy carrying it would be
/// taken for that owner's: reported out of sync, pruned, or rewritten by
/// it), and the directives that owner reads when it deploys the source;
/// and Copyrator's own. What says what the object is (Argo CD's
/// `argocd.argoproj.io/secret-type`, say) travels. `--strip-keys` adds
/// more. docs/rules.md lists each with the same reason.
pub(crate) const TRACKING_KEYS: &[(&str, &str)] = &[
    (
        "kubectl.kubernetes.io/last-applied-configuration",
        "kubectl apply's record of what it applied: ownership, and a second copy of the source's data",
    ),
    (
        "app.kubernetes.io/instance",
        "Argo CD's default tracking label (and the Helm release's instance): a copy carrying it is reported OutOfSync and pruned",
    ),
    (
        "argocd.argoproj.io/instance",
        "Argo CD's tracking label where it is configured to use its own",
    ),
    (
        "argocd.argoproj.io/tracking-id",
        "Argo CD's tracking annotation: names the application that owns the source",
    ),
    (
        "argocd.argoproj.io/sync-wave",
        "a directive to the Argo CD application that deploys the source",
    ),
    (
        "argocd.argoproj.io/sync-options",
        "a directive to the Argo CD application that deploys the source",
    ),
    (
        "argocd.argoproj.io/compare-options",
        "a directive to the Argo CD application that deploys the source",
    ),
    (
        "argocd.argoproj.io/hook",
        "a directive to the Argo CD application that deploys the source",
    ),
    (
        "argocd.argoproj.io/hook-delete-policy",
        "a directive to the Argo CD application that deploys the source",
    ),
    ("meta.helm.sh/*", "the Helm release that owns the source"),
    ("helm.sh/chart", "the Helm chart that made the source"),
    (
        "helm.sh/hook",
        "a directive to the Helm release that deploys the source",
    ),
    (
        "helm.sh/hook-weight",
        "a directive to the Helm release that deploys the source",
    ),
    (
        "helm.sh/hook-delete-policy",
        "a directive to the Helm release that deploys the source",
    ),
    (
        "helm.sh/resource-policy",
        "a directive to the Helm release that deploys the source",
    ),
    (
        "kapp.k14s.io/*",
        "kapp's ownership and tracking (app, association, identity, original) and its deploy directives; none says what the object is",
    ),
    (
        "kustomize.toolkit.fluxcd.io/*",
        "the Flux Kustomization that owns the source, and its directives (reconcile, prune, ssa)",
    ),
    (
        "helm.toolkit.fluxcd.io/*",
        "the Flux HelmRelease that owns the source",
    ),
    (
        "objectset.rio.cattle.io/*",
        "the Fleet (wrangler) apply set that owns the source: wrangler deletes objects of its set it did not apply",
    ),
    (
        "config.kubernetes.io/*",
        "Kustomize's and kpt's origin and inventory ownership (owning-inventory), and their apply directives",
    ),
    (
        "copyrator.flant.com/*",
        "Copyrator's own: a copy gets its own tracking keys",
    ),
    (
        "generate.kyverno.io/*",
        "Kyverno's marks on what its generate rules made: a copy carrying them is taken for the policy's, rewritten or deleted with it",
    ),
    (
        "reflector.v1.k8s.emberstack.com/*",
        "kubernetes-reflector's directives and its marks on the mirrors it made: a copy carrying them would be mirrored on, or taken for a mirror",
    ),
    (
        "replicator.v1.mittwald.de/*",
        "kubernetes-replicator's directives and its marks on the replicas it made: a copy carrying them would be replicated on, or taken for a replica",
    ),
    (
        "kubed.appscode.com/*",
        "config-syncer's (kubed's) directives and its marks on the copies it made: a copy carrying them would be synced on, or taken for kubed's",
    ),
    (
        "clustersecret.io",
        "ClusterSecret's label on the Secrets it made",
    ),
    (
        "clustersecret.io/*",
        "ClusterSecret's marks on the Secrets it made (`created-by` lets it overwrite them)",
    ),
];

/// The copying tools whose copies a rule adopts (`spec.adopt`): the keys
/// each leaves on what it made, or reads as its directives, with the
/// tool's name. On adoption they are removed from the copy, so that the
/// tool (or its policy), removed later, neither deletes nor rewrites it.
/// Each is one of [`TRACKING_KEYS`] too: no copy carries them.
pub(crate) const COPIERS: &[(&str, &str)] = &[
    ("generate.kyverno.io/*", "Kyverno"),
    ("reflector.v1.k8s.emberstack.com/*", "kubernetes-reflector"),
    ("replicator.v1.mittwald.de/*", "kubernetes-replicator"),
    ("kubed.appscode.com/*", "config-syncer"),
    ("clustersecret.io", "ClusterSecret"),
    ("clustersecret.io/*", "ClusterSecret"),
];

/// Where another copying tool's marks say it copied an object from: the
/// source's namespace (Kyverno's clone label, config-syncer's origin
/// label, reflector's `reflects` annotation), if they say.
pub(crate) fn copied_from_namespace<'a>(
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
) -> Option<&'a str> {
    [
        "generate.kyverno.io/source-namespace",
        "kubed.appscode.com/origin.namespace",
    ]
    .into_iter()
    .find_map(|key| labels.get(key))
    .map(String::as_str)
    .or_else(|| {
        annotations
            .get("reflector.v1.k8s.emberstack.com/reflects")
            .and_then(|source| source.split_once('/'))
            .map(|(namespace, _)| namespace)
    })
}

/// Patterns with what they say (a reason, a tool), as globs.
type Globs = Vec<(KeyGlob, &'static str)>;

/// `patterns` as globs, each with what it says.
fn compiled(patterns: &'static [(&'static str, &'static str)]) -> Globs {
    patterns
        .iter()
        .filter_map(|(pattern, says)| KeyGlob::new(pattern).ok().map(|glob| (glob, *says)))
        .collect()
}

/// What the first of `globs` that matches `key` says.
fn first_match(globs: &'static Globs, key: &str) -> Option<&'static str> {
    globs
        .iter()
        .find(|(glob, _)| glob.matches(key))
        .map(|(_, says)| *says)
}

/// [`COPIERS`] as globs, made once.
static COPIER_GLOBS: std::sync::LazyLock<Globs> = std::sync::LazyLock::new(|| compiled(COPIERS));

/// The copying tool whose mark (or directive) `key` is, if it is one.
pub(crate) fn copier_mark(key: &str) -> Option<&'static str> {
    first_match(&COPIER_GLOBS, key)
}

/// [`TRACKING_KEYS`] as globs with their reasons, made once.
static TRACKING: std::sync::LazyLock<Globs> = std::sync::LazyLock::new(|| compiled(TRACKING_KEYS));

/// [`TRACKING_KEYS`] as globs.
pub(crate) fn globs() -> impl Iterator<Item = &'static KeyGlob> {
    TRACKING.iter().map(|(glob, _)| glob)
}

/// Why `key` never travels to a copy, if it is one of [`TRACKING_KEYS`].
pub(crate) fn never_travels(key: &str) -> Option<&'static str> {
    first_match(&TRACKING, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a copy is stripped of on adoption, no copy carries from its
    /// source either: each copier's pattern is a tracking key.
    #[test]
    fn where_a_tool_says_it_copied_from() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let none = map(&[]);
        assert_eq!(
            copied_from_namespace(
                &map(&[("generate.kyverno.io/source-namespace", "team-a")]),
                &none
            ),
            Some("team-a")
        );
        assert_eq!(
            copied_from_namespace(
                &none,
                &map(&[("reflector.v1.k8s.emberstack.com/reflects", "team-a/db")])
            ),
            Some("team-a")
        );
        assert_eq!(
            copied_from_namespace(
                &map(&[("kubed.appscode.com/origin.namespace", "team-a")]),
                &none
            ),
            Some("team-a")
        );
        assert_eq!(copied_from_namespace(&none, &none), None);
        assert_eq!(
            copied_from_namespace(
                &none,
                &map(&[("reflector.v1.k8s.emberstack.com/reflects", "no-slash")])
            ),
            None
        );
    }

    #[test]
    fn every_copiers_mark_is_a_tracking_key_and_is_told_apart() {
        for (pattern, tool) in COPIERS {
            assert!(
                TRACKING_KEYS.iter().any(|(key, _)| key == pattern),
                "{pattern} ({tool}) is no tracking key"
            );
        }
        assert_eq!(
            copier_mark("generate.kyverno.io/policy-name"),
            Some("Kyverno")
        );
        assert_eq!(copier_mark("clustersecret.io"), Some("ClusterSecret"));
        assert_eq!(
            copier_mark("replicator.v1.mittwald.de/replicated-keys"),
            Some("kubernetes-replicator")
        );
        assert_eq!(copier_mark("app.kubernetes.io/managed-by"), None);
        assert!(never_travels("kubed.appscode.com/origin.name").is_some());
    }
}
