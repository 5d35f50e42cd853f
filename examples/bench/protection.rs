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

/// The label that puts a source, and so its copies, in one arm: values of
/// one length, so that the copies of both arms are of one size.
const ARM_LABEL: &str = "bench.copyrator.flant.com/arm";
const ARMS: [&str; 2] = ["unguarded", "protected"];

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
/// the binding narrowed to copies of the protected arm ([`ARM_LABEL`]),
/// and every source labelled with its arm; after them the binding is
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
        "value": {"key": ARM_LABEL, "operator": "In", "values": [ARMS[1]]}}]);
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
        for source in 0..updates.sources_per_rule {
            let source_name = updates.layout.source_name(rule, source);
            let source_ref = (
                updates.source_namespaces[rule].as_str(),
                source_name.as_str(),
            );
            let arm = ARMS[usize::from(with.contains(&source))];
            super::propagate_with_labels(
                updates.client,
                updates.copies,
                source_ref,
                &format!("p{sent}"),
                &json!({ARM_LABEL: arm}),
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
        self.times_by(protected, |_| false)
    }

    /// [`Self::times`], with the arms swapped in each block of four for
    /// which `swapped` says so.
    fn times_by(&self, protected: bool, swapped: impl Fn(usize) -> bool) -> Vec<Duration> {
        self.runs
            .iter()
            .enumerate()
            .filter(|(place, run)| (run.0 != swapped(place / 4)) == protected)
            .map(|(_, run)| run.1)
            .collect()
    }

    /// The protected p99 over the unprotected one, the arms swapped in
    /// the blocks `swapped` names.
    fn p99_ratio_by(&self, swapped: impl Fn(usize) -> bool + Copy) -> f64 {
        let p99 = |protected| percentile(&self.times_by(protected, swapped), 0.99).as_secs_f64();
        p99(true) / p99(false).max(f64::EPSILON)
    }

    /// How far the p99 ratio moves by chance alone: the 5th and 95th
    /// percentiles of it over `draws` random swaps of the arms, each
    /// block of four (without, with, with, without) swapped or not. A
    /// ratio outside them is more than the machine's noise.
    pub(super) fn p99_ratio_by_chance(&self, draws: usize) -> (f64, f64) {
        // xorshift64: reproducible, and no dependency for a benchmark.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let blocks = self.runs.len().div_ceil(4);
        let mut ratios: Vec<f64> = (0..draws.max(1))
            .map(|_| {
                let swaps: Vec<bool> = (0..blocks)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state & 1 == 1
                    })
                    .collect();
                self.p99_ratio_by(|block| swaps[block])
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
        (at(0.05), at(0.95))
    }

    /// The mean time of each arm: (without, with).
    pub(super) fn means(&self) -> (Duration, Duration) {
        let mean = |protected| {
            let times = self.times(protected);
            times.iter().sum::<Duration>() / u32::try_from(times.len().max(1)).unwrap_or(u32::MAX)
        };
        (mean(false), mean(true))
    }

    /// Every update, one a line: `place,arm,milliseconds`.
    pub(super) fn write_series(&self, path: &Path) -> Result<()> {
        let mut out = String::from("place,arm,ms\n");
        for (place, (protected, took)) in self.runs.iter().enumerate() {
            out += &format!(
                "{},{},{}\n",
                place + 1,
                ARMS[usize::from(*protected)],
                took.as_millis()
            );
        }
        std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
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
