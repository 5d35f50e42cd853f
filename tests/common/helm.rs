//! The chart and the pinned helm: rendering (`helm template`) into objects,
//! and releases installed for a test, in the home cluster or a member.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn chart_dir() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/chart").to_string()
}

/// The pinned helm: on PATH after `eval "$(hack/cluster up)"`, or in the cache.
pub fn helm() -> Command {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("helm").is_file()))
        .unwrap_or(false);
    if on_path {
        return Command::new("helm");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME is set");
    let cached = cache.join("copyrator/k8s-1.37.2/bin/helm");
    assert!(
        cached.is_file(),
        "helm is neither on PATH nor at {}; run hack/cluster build",
        cached.display()
    );
    Command::new(cached)
}

/// Runs `cmd`; its standard output. Fails the test, with both outputs,
/// when it fails.
pub fn run(mut cmd: Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The objects of a multi-document YAML text, in order; a document that
/// does not parse fails the test: dropping it would hide what it holds
/// from every check.
pub fn documents(yaml: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .enumerate()
        .filter_map(|(i, doc)| {
            let value: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{what}: document {i} is not YAML: {e}\n{yaml}"));
            (!value.is_null()).then_some(value)
        })
        .collect()
}

/// `helm template copyrator ./chart --namespace copyrator <args>`, as
/// objects, but the Helm hooks (see [`render_hooks`]).
pub fn render(args: &[&str]) -> Vec<Value> {
    rendered(args).into_iter().filter(|d| !is_hook(d)).collect()
}

/// The Helm hooks the same command renders: objects made around an
/// install, a test or an uninstall, not kept with the release.
pub fn render_hooks(args: &[&str]) -> Vec<Value> {
    rendered(args).into_iter().filter(is_hook).collect()
}

/// Every object `helm template copyrator ./chart --namespace copyrator
/// <args>` renders.
fn rendered(args: &[&str]) -> Vec<Value> {
    let mut cmd = helm();
    cmd.args([
        "template",
        "copyrator",
        &chart_dir(),
        "--namespace",
        "copyrator",
    ])
    .args(args);
    let yaml = run(cmd, "helm template");
    documents(&yaml, &format!("helm template {args:?}"))
}

fn is_hook(doc: &Value) -> bool {
    !doc["metadata"]["annotations"]["helm.sh/hook"].is_null()
}

pub fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("the chart renders no {kind}"))
}

/// The object of `kind` named `name` that the chart renders.
pub fn find_named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders no {kind} {name}"))
}

/// The chart's ValidatingAdmissionPolicy `policy` and its binding (named
/// alike), both renamed `name` (the binding binding that name), made in the
/// cluster and deleted with `cluster`.
pub async fn create_chart_policy(
    client: &kube::Client,
    cluster: &super::rbac::ClusterScoped,
    mut policy: Value,
    mut binding: Value,
    name: &str,
) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use kube::core::ApiResource;
    policy["metadata"] = serde_json::json!({"name": name});
    binding["metadata"] = serde_json::json!({"name": name});
    binding["spec"]["policyName"] = serde_json::json!(name);
    cluster
        .create(
            client,
            &ApiResource::erase::<ValidatingAdmissionPolicy>(&()),
            policy,
        )
        .await;
    cluster
        .create(
            client,
            &ApiResource::erase::<ValidatingAdmissionPolicyBinding>(&()),
            binding,
        )
        .await;
}

/// Uninstalls the release when the test ends, passed or not.
pub struct Release {
    pub name: String,
    pub namespace: String,
    /// The cluster's kubeconfig; None: `$KUBECONFIG` (the home cluster).
    pub kubeconfig: Option<PathBuf>,
}

impl Release {
    /// `helm <args>` on the release's cluster.
    pub fn helm(&self) -> Command {
        helm_on(self.kubeconfig.as_deref())
    }
}

/// helm on the cluster of `kubeconfig` (None: `$KUBECONFIG`).
pub fn helm_on(kubeconfig: Option<&Path>) -> Command {
    let mut cmd = helm();
    if let Some(kubeconfig) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kubeconfig);
    }
    cmd
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self
            .helm()
            // No node runs the pre-delete hook's Job on the test control
            // planes (`make e2e` runs it on one): helm would wait for it.
            .args(["uninstall", &self.name, "--namespace", &self.namespace])
            .arg("--no-hooks")
            .output();
    }
}
