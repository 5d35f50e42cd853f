//! The operator's provider file (`--clusterprofile-provider-file`): which
//! credential plugin runs for which access provider of a ClusterProfile,
//! in the format the cluster-inventory-api library reads (`{"providers":
//! [{"name", "execConfig", "profileSourcedCLIArgsPolicy", ...}]}`), so that
//! one file serves every consumer of a fleet.
//!
//! The file is the operator's; a profile only says where its cluster is.
//! Nothing a profile says chooses a program, its environment or a proxy;
//! the arguments it adds (KEP-5339's additional-args extension) reach the
//! plugin only where the file's provider says `Append`.

use std::collections::BTreeSet;

use kube::config::Cluster;
use serde::Deserialize;
use serde_json::Value;

/// The credentials-plugin API versions a plugin may speak.
const PLUGIN_API_VERSIONS: [&str; 2] = [
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// The extension of a profile's cluster that is handed to the plugin as
/// `ExecCredential.spec.cluster.config`.
pub(crate) const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// KEP-5339's arguments a profile adds to the plugin's.
const ADDITIONAL_ARGS_EXTENSION: &str =
    "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ProviderFileError {
    #[error("the provider file is not JSON of the form {{\"providers\": [...]}}: {0}")]
    Unreadable(String),
    #[error("the provider file names the provider {0:?} more than once")]
    Duplicate(String),
    #[error("a provider of the provider file has no name")]
    Unnamed,
    #[error("provider {provider:?}: {why}")]
    Refused { provider: String, why: String },
}

/// The operator's providers, in the file's order: the first that a
/// profile lists is the one used for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderFile {
    providers: Vec<Provider>,
}

/// One provider: its name (as profiles list it) and the plugin it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Provider {
    pub(crate) name: String,
    pub(crate) plugin: Plugin,
    /// Whether a profile's additional arguments are appended to the plugin's.
    pub(crate) append_profile_args: bool,
}

/// A plugin as the file names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plugin {
    pub(crate) api_version: String,
    /// An absolute path: no search of `PATH` decides what runs.
    pub(crate) command: String,
    pub(crate) args: Vec<String>,
    /// The only environment the plugin gets besides `KUBERNETES_EXEC_INFO`.
    pub(crate) env: Vec<(String, String)>,
    /// Whether the plugin is told the cluster (server, CA and the
    /// profile's exec extension) in `KUBERNETES_EXEC_INFO`.
    pub(crate) provide_cluster_info: bool,
}

/// What runs for one member: the plugin, with the arguments the profile
/// may add, and what it is told of the cluster.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PluginRun {
    pub(crate) provider: String,
    pub(crate) command: String,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// The `KUBERNETES_EXEC_INFO` JSON: an ExecCredential with its spec.
    pub(crate) exec_info: Value,
}

// The file's shape, as the library reads it.
#[derive(Deserialize)]
struct FileShape {
    providers: Vec<ProviderShape>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProviderShape {
    #[serde(default)]
    name: String,
    exec_config: Option<ExecShape>,
    #[serde(default, rename = "profileSourcedCLIArgsPolicy")]
    profile_sourced_cli_args_policy: String,
    #[serde(default)]
    profile_sourced_env_vars_policy: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecShape {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvShape>,
    #[serde(default)]
    provide_cluster_info: bool,
    #[serde(default)]
    interactive_mode: String,
}

#[derive(Deserialize)]
struct EnvShape {
    name: String,
    #[serde(default)]
    value: String,
}

impl ProviderFile {
    /// The file's providers, or why the file cannot be used (the operator
    /// then does not start: a provider file is never half read).
    pub(crate) fn parse(text: &[u8]) -> Result<Self, ProviderFileError> {
        let shape: FileShape = serde_json::from_slice(text)
            .map_err(|e| ProviderFileError::Unreadable(e.to_string()))?;
        let mut seen = BTreeSet::new();
        let mut providers = Vec::with_capacity(shape.providers.len());
        for provider in shape.providers {
            if provider.name.is_empty() {
                return Err(ProviderFileError::Unnamed);
            }
            if !seen.insert(provider.name.clone()) {
                return Err(ProviderFileError::Duplicate(provider.name));
            }
            providers.push(Provider::from_shape(provider)?);
        }
        Ok(Self { providers })
    }

    /// The first of the file's providers that `listed` (the names of a
    /// profile's access providers) holds.
    pub(crate) fn choose<'a>(&'a self, listed: &[&str]) -> Option<&'a Provider> {
        self.providers
            .iter()
            .find(|provider| listed.contains(&provider.name.as_str()))
    }

    pub(crate) fn providers(&self) -> &[Provider] {
        &self.providers
    }
}

impl Provider {
    fn from_shape(shape: ProviderShape) -> Result<Self, ProviderFileError> {
        let refused = |why: String| ProviderFileError::Refused {
            provider: shape.name.clone(),
            why,
        };
        let exec = shape
            .exec_config
            .ok_or_else(|| refused("it has no execConfig".to_owned()))?;
        if !PLUGIN_API_VERSIONS.contains(&exec.api_version.as_str()) {
            return Err(refused(format!(
                "execConfig.apiVersion {:?} is not one of {PLUGIN_API_VERSIONS:?}",
                exec.api_version
            )));
        }
        if !exec.command.starts_with('/') {
            return Err(refused(format!(
                "execConfig.command {:?} is not an absolute path (no search of PATH chooses \
                 what runs)",
                exec.command
            )));
        }
        if !matches!(exec.interactive_mode.as_str(), "" | "Never") {
            return Err(refused(format!(
                "execConfig.interactiveMode {:?}: the operator has no terminal; say Never",
                exec.interactive_mode
            )));
        }
        let append_profile_args = match shape.profile_sourced_cli_args_policy.as_str() {
            "" | "Ignore" => false,
            "Append" => true,
            other => {
                return Err(refused(format!(
                    "profileSourcedCLIArgsPolicy {other:?} is not Append or Ignore"
                )));
            }
        };
        match shape.profile_sourced_env_vars_policy.as_str() {
            "" | "Ignore" => {}
            other => {
                return Err(refused(format!(
                    "profileSourcedEnvVarsPolicy {other:?}: a ClusterProfile never sets a \
                     plugin's environment here; leave it out or say Ignore"
                )));
            }
        }
        Ok(Self {
            name: shape.name,
            plugin: Plugin {
                api_version: exec.api_version,
                command: exec.command,
                args: exec.args,
                env: exec.env.into_iter().map(|e| (e.name, e.value)).collect(),
                provide_cluster_info: exec.provide_cluster_info,
            },
            append_profile_args,
        })
    }

    /// What runs for a profile whose access provider of this name gives
    /// `cluster`: the arguments it adds only with `Append`; its cluster
    /// told to the plugin only with `provideClusterInfo`.
    pub(crate) fn run_for(&self, cluster: &Cluster) -> Result<PluginRun, String> {
        let extension = |name: &str| {
            cluster
                .extensions
                .iter()
                .flatten()
                .find(|extension| extension.name == name)
                .map(|extension| extension.extension.clone())
        };
        let mut args = self.plugin.args.clone();
        if self.append_profile_args
            && let Some(added) = extension(ADDITIONAL_ARGS_EXTENSION)
        {
            let added: Vec<String> = serde_json::from_value(added).map_err(|e| {
                format!("the extension {ADDITIONAL_ARGS_EXTENSION} is not a list of strings: {e}")
            })?;
            args.extend(added);
        }
        let mut spec = serde_json::json!({"interactive": false});
        if self.plugin.provide_cluster_info {
            let mut told = serde_json::json!({
                "server": cluster.server.clone().unwrap_or_default(),
            });
            if let Some(ca) = &cluster.certificate_authority_data {
                told["certificate-authority-data"] = Value::String(ca.clone());
            }
            if let Some(config) = extension(EXEC_EXTENSION) {
                told["config"] = config;
            }
            spec["cluster"] = told;
        }
        Ok(PluginRun {
            provider: self.name.clone(),
            command: self.plugin.command.clone(),
            args,
            env: self.plugin.env.clone(),
            exec_info: serde_json::json!({
                "apiVersion": self.plugin.api_version,
                "kind": "ExecCredential",
                "spec": spec,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file(providers: Value) -> Result<ProviderFile, ProviderFileError> {
        ProviderFile::parse(json!({ "providers": providers }).to_string().as_bytes())
    }

    fn provider(name: &str) -> Value {
        json!({"name": name, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": format!("/plugins/{name}"),
            "args": ["--flag"],
            "env": [{"name": "REGION", "value": "eu"}],
            "provideClusterInfo": true,
        }})
    }

    fn cluster(extensions: Value) -> Cluster {
        serde_json::from_value(json!({
            "server": "https://member.example:6443",
            "certificate-authority-data": "Q0E=",
            "extensions": extensions,
        }))
        .expect("a cluster")
    }

    #[test]
    fn the_first_provider_of_the_file_that_a_profile_lists_is_chosen() {
        let file = file(json!([provider("eks"), provider("token")])).expect("a file");
        // The file's order decides, not the profile's.
        let chosen = file.choose(&["token", "eks"]).map(|p| p.name.as_str());
        assert_eq!(chosen, Some("eks"));
        assert_eq!(
            file.choose(&["token"]).map(|p| p.name.as_str()),
            Some("token")
        );
        assert_eq!(file.choose(&["gke", "secretreader"]), None);
        assert_eq!(file.choose(&[]), None);
    }

    #[test]
    fn a_profile_adds_arguments_only_where_the_file_says_append() {
        let added = json!([{"name": ADDITIONAL_ARGS_EXTENSION, "extension": ["--as-root"]}]);
        let ignoring = file(json!([provider("eks")])).expect("a file");
        let run = ignoring.providers()[0]
            .run_for(&cluster(added.clone()))
            .expect("a run");
        assert_eq!(run.args, ["--flag"]);
        let mut appending = provider("eks");
        appending["profileSourcedCLIArgsPolicy"] = json!("Append");
        let appending = file(json!([appending])).expect("a file");
        let run = appending.providers()[0]
            .run_for(&cluster(added))
            .expect("a run");
        assert_eq!(run.args, ["--flag", "--as-root"]);
    }

    #[test]
    fn a_profile_never_sets_the_environment_nor_the_program() {
        let profile = cluster(json!([
            {"name": "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs",
             "extension": {"LD_PRELOAD": "/tmp/x.so"}},
            {"name": EXEC_EXTENSION, "extension": {"command": "/bin/sh", "clusterName": "a"}},
        ]));
        let file = file(json!([provider("eks")])).expect("a file");
        let run = file.providers()[0].run_for(&profile).expect("a run");
        assert_eq!(run.command, "/plugins/eks");
        assert_eq!(run.env, [("REGION".to_owned(), "eu".to_owned())]);
        // The exec extension is data for the plugin, nothing more.
        assert_eq!(
            run.exec_info["spec"]["cluster"]["config"],
            json!({"command": "/bin/sh", "clusterName": "a"})
        );
        assert_eq!(
            run.exec_info["spec"]["cluster"]["server"],
            "https://member.example:6443"
        );
        assert_eq!(run.exec_info["spec"]["interactive"], false);
        // A file that would let profiles set the environment is refused.
        for policy in ["AppendIfNotExists", "Replace"] {
            let mut lenient = provider("eks");
            lenient["profileSourcedEnvVarsPolicy"] = json!(policy);
            assert!(
                matches!(file_of(lenient), Err(ProviderFileError::Refused { .. })),
                "{policy}"
            );
        }
    }

    fn file_of(provider: Value) -> Result<ProviderFile, ProviderFileError> {
        file(json!([provider]))
    }

    #[test]
    fn without_provide_cluster_info_the_plugin_is_told_no_cluster() {
        let mut quiet = provider("token");
        quiet["execConfig"]["provideClusterInfo"] = json!(false);
        let file = file_of(quiet).expect("a file");
        let run = file.providers()[0]
            .run_for(&cluster(json!([])))
            .expect("a run");
        assert!(run.exec_info["spec"].get("cluster").is_none());
    }

    #[test]
    fn a_file_that_cannot_be_used_says_why() {
        assert!(matches!(
            ProviderFile::parse(b"providers: []"),
            Err(ProviderFileError::Unreadable(_))
        ));
        assert_eq!(
            file(json!([provider("eks"), provider("eks")])),
            Err(ProviderFileError::Duplicate("eks".to_owned()))
        );
        assert_eq!(
            file(json!([{"execConfig": {}}])),
            Err(ProviderFileError::Unnamed)
        );
        let refusals = [
            ("/execConfig", json!(null), "no execConfig"),
            (
                "/execConfig/apiVersion",
                json!("client.authentication.k8s.io/v1alpha1"),
                "apiVersion",
            ),
            ("/execConfig/command", json!("plugin"), "absolute path"),
            ("/execConfig/interactiveMode", json!("Always"), "terminal"),
            (
                "/profileSourcedCLIArgsPolicy",
                json!("Prepend"),
                "Append or Ignore",
            ),
        ];
        for (at, value, says) in refusals {
            let mut bad = provider("eks");
            let (parent, key) = at.rsplit_once('/').expect("a path");
            bad.pointer_mut(parent)
                .and_then(Value::as_object_mut)
                .expect("the parent object")
                .insert(key.to_owned(), value.clone());
            match file_of(bad) {
                Err(ProviderFileError::Refused { why, .. }) => {
                    assert!(why.contains(says), "{at}={value}: {why}")
                }
                other => panic!("{at}={value}: {other:?}"),
            }
        }
        // The library's own example shape is read.
        let library = json!({"providers": [{"name": "secretreader", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "/plugins/secretreader-plugin", "provideClusterInfo": true}}]});
        assert!(ProviderFile::parse(library.to_string().as_bytes()).is_ok());
    }
}
