//! What the copy protection costs the update path (`hack/bench
//! --copy-protection`): sources are updated one after another, in short
//! blocks with and without the chart's ValidatingAdmissionPolicy and
//! binding in force (rendered by `hack/bench` with the benchmark's
//! operator account exempt, as the chart exempts its own), each timed
//! until every copy has it. Alternating in short blocks, not one half after
//! the other, keeps a drift of the machine out of the comparison.

use super::*;

use std::path::Path;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use kube::api::DeleteParams;

/// How long a change of the binding may take to reach admission.
const TAKES_EFFECT_WITHIN: Duration = Duration::from_secs(30);

/// The update propagations measured without and with the protection.
pub(super) struct Propagations {
    /// Every update in order: whether protected, how many updates since
    /// the binding last changed, and its time.
    runs: Vec<(bool, usize, Duration)>,
}

/// Where the updates go, and which copy shows whether the protection is on.
pub(super) struct Updates<'a> {
    pub(super) client: &'a Client,
    pub(super) copies: &'a Copies,
    pub(super) layout: Layout,
    pub(super) source_namespaces: &'a [String],
    pub(super) copies_per_source: usize,
    pub(super) sources_per_rule: usize,
    /// A copy that the protection refuses the benchmark's admin to change.
    pub(super) probe: CopyKey,
}

/// `count` updates each way, in blocks of `block` alternating with and
/// without in the order without, with, with, without (so that a drift of
/// the machine that grows steadily weighs on both alike): the policy and
/// binding of `manifest` applied once, then the binding made again before
/// each protected block and deleted before each other one; the protection
/// is left off. After each change one update goes unmeasured, for what
/// the change itself may cost the API server.
pub(super) async fn measure(
    updates: &Updates<'_>,
    manifest: &Path,
    count: usize,
    block: usize,
) -> Result<Propagations> {
    let mut result = Propagations { runs: Vec::new() };
    // Applied once; then the binding alone is deleted and made again, by
    // the client: `kubectl apply` each time would load the API server
    // with its discovery and OpenAPI reads right before a protected
    // update, and charge that to the policy.
    let name = apply(manifest)?
        .into_iter()
        .find_map(|name| {
            name.strip_prefix("validatingadmissionpolicybinding.admissionregistration.k8s.io/")
                .map(str::to_owned)
        })
        .context("the manifest holds no ValidatingAdmissionPolicyBinding")?;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(updates.client.clone());
    let mut binding = bindings.get(&name).await.context("the binding applied")?;
    binding.metadata = kube::api::ObjectMeta {
        name: Some(name.clone()),
        labels: binding.metadata.labels.take(),
        ..Default::default()
    };
    // A policy with no binding is dropped by the API server, and compiled
    // again when one comes back (in blocks of 2, the first measured update
    // after each change was the slowest of a run). A second binding of the
    // policy that matches no object keeps it compiled; without the chart's
    // binding, each write then costs a label selector's test more than
    // with none.
    let keeper = keeper_of(&binding)?;
    toggle(&bindings, &keeper, true).await?;
    let block = block.max(1);
    let mut in_force = None;
    let mut since_change = 0;
    let mut sent = 0;
    for u in 0..2 * count {
        let protected = matches!((u / block) % 4, 1 | 2);
        if in_force != Some(protected) {
            toggle(&bindings, &binding, protected).await?;
            wait_protection(updates, protected).await?;
            in_force = Some(protected);
            since_change = 0;
            propagate(updates, sent).await?;
            sent += 1;
        }
        let took = propagate(updates, sent).await?;
        sent += 1;
        result.runs.push((protected, since_change, took));
        since_change += 1;
    }
    toggle(&bindings, &binding, false).await?;
    wait_protection(updates, false).await?;
    toggle(&bindings, &keeper, false).await?;
    Ok(result)
}

/// A binding of `binding`'s policy that matches no object (auditing, as
/// a binding must take some action).
fn keeper_of(
    binding: &ValidatingAdmissionPolicyBinding,
) -> Result<ValidatingAdmissionPolicyBinding> {
    let name = binding.metadata.name.as_deref().unwrap_or_default();
    let policy = binding.spec.policy_name.clone();
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-keeper")},
        "spec": {
            "policyName": policy,
            "validationActions": ["Audit"],
            "matchResources": {"objectSelector": {"matchExpressions": [
                {"key": "bench.copyrator.flant.com/never", "operator": "Exists"}]}},
        },
    }))?)
}

/// Make the binding (`on`), or delete it; either may be so already.
async fn toggle(
    bindings: &Api<ValidatingAdmissionPolicyBinding>,
    binding: &ValidatingAdmissionPolicyBinding,
    on: bool,
) -> Result<()> {
    let done = if on {
        bindings
            .create(&PostParams::default(), binding)
            .await
            .map(|_| ())
    } else {
        let name = binding.metadata.name.as_deref().unwrap_or_default();
        bindings
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ())
    };
    match done {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(()),
        Err(e) => Err(e).context("changing the copy protection's binding"),
    }
}

impl Propagations {
    /// The times of the updates with the protection in force (`true`), or
    /// without it.
    pub(super) fn times(&self, protected: bool) -> Vec<Duration> {
        self.runs
            .iter()
            .filter(|run| run.0 == protected)
            .map(|run| run.2)
            .collect()
    }

    /// The `n` slowest updates, slowest first: `with 812 ms (2nd after the
    /// change)` (the unmeasured one not counted), to tell a cost of the
    /// policy from one of changing it.
    pub(super) fn slowest(&self, n: usize) -> String {
        let mut runs = self.runs.clone();
        runs.sort_by_key(|run| std::cmp::Reverse(run.2));
        runs.iter()
            .take(n)
            .map(|(protected, since, took)| {
                format!(
                    "{} {} ms ({} after the change)",
                    if *protected { "with" } else { "without" },
                    took.as_millis(),
                    since + 1
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The `n`th update of this phase: the next source, round the rules, to a
/// version of its own; the time until every copy of it has that version.
async fn propagate(updates: &Updates<'_>, n: usize) -> Result<Duration> {
    let rules = updates.source_namespaces.len();
    let rule = n % rules;
    let source = (n / rules) % updates.sources_per_rule;
    let version = format!("p{}", n + 1);
    let name = updates.layout.source_name(rule, source);
    let source = (updates.source_namespaces[rule].as_str(), name.as_str());
    super::propagate(
        updates.client,
        updates.copies,
        source,
        &version,
        updates.copies_per_source,
    )
    .await
}

/// Wait until the admin's dry-run edit of the probe copy is refused by the
/// protection (`on`), or let through (`!on`).
async fn wait_protection(updates: &Updates<'_>, on: bool) -> Result<()> {
    let (namespace, name) = &updates.probe;
    let api: Api<ConfigMap> = Api::namespaced(updates.client.clone(), namespace);
    let params = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let edit = json!({"metadata": {"labels": {"bench-probe": "yes"}}});
    let start = Instant::now();
    loop {
        let refused = match api.patch(name, &params, &Patch::Merge(&edit)).await {
            Ok(_) => false,
            Err(kube::Error::Api(status)) if status.code == 403 => true,
            Err(e) => return Err(e).context("a dry-run edit of a copy"),
        };
        if refused == on {
            return Ok(());
        }
        if start.elapsed() > TAKES_EFFECT_WITHIN {
            bail!(
                "the copy protection is {} after {TAKES_EFFECT_WITHIN:?}",
                if refused { "still on" } else { "not on yet" }
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `kubectl apply -f manifest`: the names of what it applied.
fn apply(manifest: &Path) -> Result<Vec<String>> {
    let path = manifest.to_string_lossy();
    let out = kubectl(&["apply", "-f", &path, "-o", "name"])?;
    Ok(out.lines().map(str::to_owned).collect())
}

fn kubectl(args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .args(args)
        .output()
        .context("running kubectl")?;
    ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
