//! What the copy protection costs the update path (`hack/bench
//! --copy-protection`): the chart's ValidatingAdmissionPolicy and binding
//! (rendered by `hack/bench` with the benchmark's operator account exempt,
//! as the chart exempts its own) are applied once, the binding narrowed to
//! the copies of half the sources; then sources of either half are updated
//! one after another, alternating, each timed until every copy has it.
//! Nothing changes in the API server between the two arms, and a stall of
//! the machine, which lasts several updates, weighs on both alike.

use super::*;

use std::path::Path;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use kube::api::DeleteParams;

/// How long a change of the binding may take to reach admission.
const TAKES_EFFECT_WITHIN: Duration = Duration::from_secs(30);

/// The label that puts a source, and so its copies, in the protected arm.
const ARM_LABEL: &str = "bench.copyrator.flant.com/protected";

/// The update propagations measured without and with the protection.
pub(super) struct Propagations {
    /// Every update in order: whether protected, and its time.
    runs: Vec<(bool, Duration)>,
}

/// Where the updates go.
pub(super) struct Updates<'a> {
    pub(super) client: &'a Client,
    pub(super) copies: &'a Copies,
    pub(super) layout: Layout,
    pub(super) source_namespaces: &'a [String],
    pub(super) copies_per_source: usize,
    pub(super) sources_per_rule: usize,
    /// A namespace holding a copy of every source of the first rule.
    pub(super) probe_namespace: &'a str,
}

impl Updates<'_> {
    /// Which sources of each rule are protected: the odd ones.
    fn sources_of(&self, protected: bool) -> Vec<usize> {
        (0..self.sources_per_rule)
            .filter(|source| (source % 2 == 1) == protected)
            .collect()
    }
}

/// `count` updates each way, in the order without, with, with, without
/// (so that a drift of the machine that grows steadily weighs on both
/// alike). Before them the policy and binding of `manifest` are applied,
/// the binding narrowed to copies that carry [`ARM_LABEL`], and the odd
/// sources of every rule given that label; after them the binding is
/// deleted.
pub(super) async fn measure(
    updates: &Updates<'_>,
    manifest: &Path,
    count: usize,
) -> Result<Propagations> {
    ensure!(
        updates.sources_per_rule >= 2,
        "--copy-protection compares two halves of each rule's sources: give --sources 2 or more"
    );
    let name = apply(manifest)?
        .into_iter()
        .find_map(|name| {
            name.strip_prefix("validatingadmissionpolicybinding.admissionregistration.k8s.io/")
                .map(str::to_owned)
        })
        .context("the manifest holds no ValidatingAdmissionPolicyBinding")?;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(updates.client.clone());
    // One more requirement of the chart's objectSelector; a write of the
    // other arm costs the API server the test of these labels, as every
    // ConfigMap write outside the copies does under the chart.
    let narrowed = json!([{"op": "add",
        "path": "/spec/matchResources/objectSelector/matchExpressions/-",
        "value": {"key": ARM_LABEL, "operator": "Exists"}}]);
    bindings
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(narrowed)?),
        )
        .await
        .context("narrowing the copy protection's binding to half the sources")?;
    let (with, without) = (updates.sources_of(true), updates.sources_of(false));
    let mut sent = 0;
    for rule in 0..updates.source_namespaces.len() {
        for &source in &with {
            let source_name = updates.layout.source_name(rule, source);
            let source = (
                updates.source_namespaces[rule].as_str(),
                source_name.as_str(),
            );
            let labels = json!({"metadata": {"labels": {ARM_LABEL: "yes"}}});
            sources_api(updates.client, source.0)
                .patch(source.1, &PatchParams::default(), &Patch::Merge(&labels))
                .await
                .context("labelling a source of the protected arm")?;
            super::propagate(
                updates.client,
                updates.copies,
                source,
                &format!("p{sent}"),
                updates.copies_per_source,
            )
            .await?;
            sent += 1;
        }
    }
    let probe = |source: usize| {
        (
            updates.probe_namespace.to_owned(),
            updates.layout.source_name(0, source),
        )
    };
    wait_protection(updates.client, &probe(with[0]), true).await?;
    ensure!(
        !refused(updates.client, &probe(without[0])).await?,
        "a copy of an unprotected source is protected: the binding was not narrowed"
    );
    let mut result = Propagations { runs: Vec::new() };
    let mut done = [0, 0];
    for u in 0..2 * count {
        let protected = matches!(u % 4, 1 | 2);
        let arm = usize::from(protected);
        let took = propagate(
            updates,
            if protected { &with } else { &without },
            done[arm],
            sent,
        )
        .await?;
        done[arm] += 1;
        sent += 1;
        result.runs.push((protected, took));
    }
    let deleted = bindings.delete(&name, &DeleteParams::default()).await;
    match deleted {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(e).context("deleting the copy protection's binding"),
    }
    wait_protection(updates.client, &probe(with[0]), false).await?;
    Ok(result)
}

impl Propagations {
    /// The times of the updates with the protection in force (`true`), or
    /// without it.
    pub(super) fn times(&self, protected: bool) -> Vec<Duration> {
        self.runs
            .iter()
            .filter(|run| run.0 == protected)
            .map(|run| run.1)
            .collect()
    }

    /// The `n` slowest updates, slowest first: `with 812 ms (#97)`, its
    /// place in the phase, to tell a cost of the policy from a stall of
    /// the machine (which slows updates in a row, of both arms).
    pub(super) fn slowest(&self, n: usize) -> String {
        let mut runs: Vec<(usize, &(bool, Duration))> = self.runs.iter().enumerate().collect();
        runs.sort_by_key(|(_, run)| std::cmp::Reverse(run.1));
        runs.iter()
            .take(n)
            .map(|(place, (protected, took))| {
                format!(
                    "{} {} ms (#{})",
                    if *protected { "with" } else { "without" },
                    took.as_millis(),
                    place + 1
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The `nth` update of an arm: the next of its `sources`, round the rules,
/// to a version of its own (`sent` so far in the phase); the time until
/// every copy of it has that version.
async fn propagate(
    updates: &Updates<'_>,
    sources: &[usize],
    nth: usize,
    sent: usize,
) -> Result<Duration> {
    let rules = updates.source_namespaces.len();
    let rule = nth % rules;
    let source = sources[(nth / rules) % sources.len()];
    let version = format!("p{sent}");
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

fn sources_api(client: &Client, namespace: &str) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), namespace)
}

/// Whether the protection refuses the benchmark's admin a dry-run edit of
/// the copy `probe`.
async fn refused(client: &Client, (namespace, name): &CopyKey) -> Result<bool> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let edit = json!({"metadata": {"labels": {"bench-probe": "yes"}}});
    match api.patch(name, &params, &Patch::Merge(&edit)).await {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(true),
        Err(e) => Err(e).context("a dry-run edit of a copy"),
    }
}

/// Wait until the admin's edit of the copy `probe` is refused (`on`), or
/// let through (`!on`).
async fn wait_protection(client: &Client, probe: &CopyKey, on: bool) -> Result<()> {
    let start = Instant::now();
    loop {
        let refused = refused(client, probe).await?;
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
