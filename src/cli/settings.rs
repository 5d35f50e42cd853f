//! Command line and environment: every setting is a flag and an env var.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::api::kinds::{DeniedKinds, EnabledKinds};
use crate::cluster::client::Transport;
use crate::cluster::context::Limits;
use crate::controller::state::Options;
use crate::core::identity::TenantIdentity;
use crate::core::resolve::{CopyPolicy, DEFAULT_SERVICE_ACCOUNT, Trust};
pub(crate) use crate::ops::telemetry::LogFormat;
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(
    name = "copyrator",
    version,
    about = "Copies ConfigMaps and Secrets into other namespaces by CopyratorRule and keeps the copies true"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) settings: Settings,
}

/// How `kubectl copyrator ...` names this binary: kubectl runs a plugin
/// found on the PATH as `kubectl-copyrator`, with the arguments after
/// `copyrator`.
pub(crate) const KUBECTL_PLUGIN_FILE: &str = "kubectl-copyrator";
/// The command help and errors show when run as a kubectl plugin.
pub(crate) const KUBECTL_PLUGIN_BIN_NAME: &str = "kubectl copyrator";

/// `--default-service-account`: a ServiceAccount's name (a DNS-1123 subdomain).
fn service_account_name(value: &str) -> Result<String, String> {
    if crate::api::selector::is_dns_subdomain(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a ServiceAccount name: lowercase letters, digits, '-' and '.', at most 253"
        ))
    }
}

/// Whether the binary was started under the kubectl plugin's file name
/// (`argv[0]`, a path or a name).
pub(crate) fn is_kubectl_plugin(argv0: Option<&std::ffi::OsStr>) -> bool {
    argv0
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_stem)
        .is_some_and(|stem| stem == KUBECTL_PLUGIN_FILE)
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the operator (the default).
    Run,
    /// Print the CopyratorRule CustomResourceDefinition as YAML.
    Crd,
    /// Say what `run` would create, update, recreate and delete now, and
    /// what it would leave out, changing nothing; exit 0 when nothing would
    /// change, 2 when something would, 1 on an error or a refused rule.
    Plan(PlanArgs),
    /// Every copy of one source, in every namespace and cluster, with its
    /// state (in place, stale, missing, contested, conflict, refused,
    /// create-only, unwanted), read from the live clusters; exit 0 when
    /// every copy is current, 2 when some are not, 1 on an error.
    Where(WhereArgs),
    /// Let go of the rules before the operator goes (the chart's
    /// pre-delete hook): stop the operator's Deployment, delete the copies
    /// when asked to, and remove every rule's finalizer, so that no rule
    /// holds a namespace once no operator runs. Exit 0 when done, 1 on an error.
    Release(ReleaseArgs),
    /// Print CopyratorRules (with adopt: true) that do what the other
    /// copying tools' configuration in the cluster (or in -f files) does:
    /// Kyverno generate policies, kubernetes-reflector, kubernetes-replicator
    /// and config-syncer annotations, ClusterSecrets; with a report per
    /// source of what maps exactly, what differs and what cannot be mapped.
    /// Writes nothing. Exit 0, or 1 on an error.
    Import(ImportArgs),
    /// Print the token in FILE as an ExecCredential, its `exp` as its
    /// expiry: a credential plugin for members that trust this cluster's
    /// ServiceAccount issuer (the chart's projected `federatedToken`).
    /// Exit 1, saying why, when the file holds no token.
    FileCredential {
        /// The token's file, e.g. /var/run/secrets/copyrator/federated/token
        file: std::path::PathBuf,
    },
    /// Ask a running operator's /healthz or /readyz; exit 0 on 200, 1
    /// otherwise (for a `helm test` Pod, which has this binary alone).
    Probe {
        /// http://HOST:PORT/PATH, e.g. http://copyrator.ops.svc:8080/readyz
        url: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 5)]
        timeout_seconds: u64,
    },
}

/// What `copyrator plan` plans and how it prints it.
#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// Plan the CopyratorRules in this file instead of the live rules, each
    /// in place of the live rule of its name (repeatable; `-` reads standard
    /// input; documents separated by `---`). A rule without
    /// metadata.namespace is in --namespace.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub(crate) files: Vec<std::path::PathBuf>,

    /// `text`: a line per change and per skip, `no changes` when nothing
    /// would change; `json`: one document with `changes`, `skipped` and `rules`.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = PlanOutput::Text)]
    pub(crate) output: PlanOutput,
}

/// What `copyrator where` looks for and how it prints it.
#[derive(Debug, Args)]
pub(crate) struct WhereArgs {
    /// The source, `NAMESPACE/NAME`.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub(crate) source: String,

    /// The source's kind: `configmap` or `secret`.
    #[arg(long, default_value = "configmap")]
    pub(crate) kind: String,

    /// `text`: a line per copy and a summary; `json`: one document with
    /// `source`, `kind`, `copies` and `clusters`.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = PlanOutput::Text)]
    pub(crate) output: PlanOutput,
}

/// What `copyrator release` does.
#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    /// `keep`: the copies stay as they are; `delete`: the copies of the
    /// rules go, here and (with --member-clusters) in every member, but
    /// those handed over to their namespaces.
    #[arg(long, value_enum, default_value_t = CopiesOnRelease::Keep)]
    pub(crate) copies: CopiesOnRelease,

    /// Scale this Deployment of --namespace (the operator's) to 0 first and
    /// wait until its Pods are gone: a running operator puts finalizers back.
    #[arg(long, value_name = "NAME")]
    pub(crate) stop_deployment: Option<String>,

    /// Give up waiting for the Deployment's Pods after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub(crate) wait_seconds: u64,
}

/// What becomes of the copies when the operator is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CopiesOnRelease {
    Keep,
    Delete,
}

/// What `copyrator import` reads and how it prints it.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// Read the other tools' objects from this file instead of the live
    /// cluster (repeatable; `-` reads standard input; documents separated
    /// by `---`, or a `List`).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub(crate) files: Vec<std::path::PathBuf>,

    /// `yaml`: the report and the labels to put on sources as comments,
    /// then the rules; `json`: one document with `rules`, `sourceLabels`
    /// and `reports`.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = ImportOutput::Yaml)]
    pub(crate) output: ImportOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ImportOutput {
    Yaml,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PlanOutput {
    Text,
    Json,
}

#[derive(Clone, Debug, Args)]
pub(crate) struct Settings {
    /// The operator's namespace: rules are honoured here (and, with
    /// --all-namespaces, everywhere), and the leader-election Lease lives here.
    #[arg(long, env = "NAMESPACE", default_value = "default", global = true)]
    pub(crate) namespace: String,

    /// Follow only the rule of this name; unset means all rules.
    #[arg(long, env = "RULE_NAME", global = true)]
    pub(crate) rule_name: Option<String>,

    /// Honour rules in every namespace; a rule outside the operator's
    /// namespace (a tenant rule) then writes only where it is accepted and
    /// takes from other namespaces only what consents.
    #[arg(long, env = "ALL_NAMESPACES", default_value_t = false, global = true)]
    pub(crate) all_namespaces: bool,

    /// Let a tenant rule (one outside the operator's namespace, under
    /// --all-namespaces) keep copies in member clusters
    /// (`targets.clusters.names` or `.selector`); without it such a rule is
    /// refused (`Forbidden`).
    #[arg(
        long,
        env = "ALLOW_TENANT_CLUSTERS",
        default_value_t = false,
        global = true
    )]
    pub(crate) allow_tenant_clusters: bool,

    /// Whom tenant rules (outside the operator's namespace, under
    /// --all-namespaces) write as: `service-account` impersonates a
    /// ServiceAccount of the rule's namespace (`spec.serviceAccountName`,
    /// else --default-service-account), so that the API server refuses
    /// what it may not do; `operator` writes with the operator's own
    /// identity, the consent annotations the only check.
    #[arg(
        long,
        env = "TENANT_IDENTITY",
        value_enum,
        default_value_t = TenantIdentity::ServiceAccount,
        global = true
    )]
    pub(crate) tenant_identity: TenantIdentity,

    /// Writes sent as a ServiceAccount also carry the impersonation extra
    /// `copyrator.flant.com/acting-for: copyrator`, which that account,
    /// acting alone with its own token, cannot set: the chart's copy
    /// protection (a ValidatingAdmissionPolicy) lets them through. Needs
    /// `impersonate` on `userextras/copyrator.flant.com/acting-for`
    /// (group authentication.k8s.io) cluster-wide; the chart grants it
    /// and sets this with `copyProtection.mode`.
    #[arg(long, env = "ACTING_FOR_EXTRA", default_value_t = false, global = true)]
    pub(crate) acting_for_extra: bool,

    /// The name of the ValidatingAdmissionPolicy and binding that protect
    /// copies at admission (the chart's `<fullname>-copies-read-only`):
    /// followed, read only, and `copyrator_copy_protection_in_force` and a
    /// Warning Event say when either is missing, weakened or fails type
    /// checking. Needs list and watch on validatingadmissionpolicies
    /// and validatingadmissionpolicybindings. Unset: not followed.
    #[arg(long, env = "COPY_PROTECTION", global = true)]
    pub(crate) copy_protection: Option<String>,

    /// The name of the copy protection in each member cluster (the
    /// member side's `<fullname>-copies-read-only`), followed there as
    /// `--copy-protection` is at home: `copyrator_copy_protection_in_force`
    /// for the member, and a Warning Event on its inventory entry. Needs
    /// list and watch on both, in the member (the member side grants them).
    /// Unset: not followed.
    #[arg(long, env = "MEMBER_COPY_PROTECTION", global = true)]
    pub(crate) member_copy_protection: Option<String>,

    /// The provider file of ClusterProfile credential plugins (the
    /// cluster-inventory-api library's format: `{"providers": [{"name",
    /// "execConfig", "profileSourcedCLIArgsPolicy"}]}`): a member of a
    /// ClusterProfile that lists one of its providers is reached with a
    /// token from that provider's plugin, the first of the file's order.
    /// Read at start; a file that cannot be used stops the operator.
    #[arg(long, env = "CLUSTERPROFILE_PROVIDER_FILE", global = true)]
    pub(crate) clusterprofile_provider_file: Option<std::path::PathBuf>,

    /// Accept a cluster Secret whose kubeconfig user runs a command, where
    /// that command is one the provider file names: it runs as the file
    /// says (the kubeconfig's arguments only where that provider appends a
    /// profile's; its environment never). Without it, or for any other
    /// command, such a member is unusable, reason
    /// `ExecCredentialsUnsupported`. Needs --clusterprofile-provider-file.
    #[arg(
        long,
        env = "ALLOW_KUBECONFIG_PLUGINS",
        default_value_t = false,
        global = true,
        requires = "clusterprofile_provider_file"
    )]
    pub(crate) allow_kubeconfig_plugins: bool,

    /// The ServiceAccount of its own namespace that a tenant rule naming
    /// none (`spec.serviceAccountName`) writes as, under
    /// --tenant-identity service-account.
    #[arg(
        long,
        env = "DEFAULT_SERVICE_ACCOUNT",
        default_value = DEFAULT_SERVICE_ACCOUNT,
        value_parser = service_account_name,
        global = true
    )]
    pub(crate) default_service_account: String,

    /// Let a tenant rule that writes as a ServiceAccount take that
    /// account's rights as consent, without the annotations (a target
    /// namespace's accept-from, a pulled source's allow-to): it writes into
    /// the namespaces its targets match where the account may create the
    /// kind, and copies what the account may get. Off (the default), the
    /// annotations are required as well, so that a broad RoleBinding alone
    /// invites no copies.
    #[arg(
        long,
        env = "CONSENT_BY_RIGHTS",
        default_value_t = false,
        global = true
    )]
    pub(crate) consent_by_rights: bool,

    /// Log filter: a level (error, warn, info, debug, trace) or tracing
    /// env-filter directives such as `copyrator=debug,kube=info`.
    #[arg(long, env = "LOG_LEVEL", default_value = "info", global = true)]
    pub(crate) log_level: String,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub(crate) log_format: LogFormat,

    /// Address of the HTTP server for /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "LISTEN_ADDRESS",
        default_value = "0.0.0.0:8080",
        global = true
    )]
    pub(crate) listen_address: SocketAddr,

    /// Serve /metrics only to callers whose bearer token the API server
    /// accepts (TokenReview) and who may get the non-resource URL
    /// /metrics (SubjectAccessReview); /healthz and /readyz stay open.
    #[arg(long, env = "METRICS_AUTH", global = true)]
    pub(crate) metrics_auth: bool,

    /// With --metrics-auth: reviews of /metrics callers in flight at most.
    /// Concurrent requests with one token share a review; a caller whose
    /// token would need one more gets 503, and costs the API server nothing.
    #[arg(long, env = "MAX_METRICS_REVIEWS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256), global = true)]
    pub(crate) max_metrics_reviews: u32,

    /// Elect a leader on a coordination.k8s.io Lease so that only one replica writes.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = false, global = true)]
    pub(crate) leader_election: bool,

    /// Name of the leader-election Lease in the operator's namespace.
    #[arg(long, env = "LEASE_NAME", default_value = "copyrator", global = true)]
    pub(crate) lease_name: String,

    /// Seconds a leader's Lease lasts without renewal; a standby takes over after it.
    #[arg(long, env = "LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=600), global = true)]
    pub(crate) lease_duration: u64,

    /// Name of the Secret in the operator's namespace that holds the
    /// installation's mark key (made by the operator when absent): copies
    /// are recognised, and restart annotations computed, by it.
    #[arg(
        long,
        env = "MARK_KEY_SECRET",
        default_value = "copyrator-mark-key",
        global = true
    )]
    pub(crate) mark_key_secret: String,

    /// Keep copies in member clusters: read the inventory (cluster Secrets
    /// and ClusterProfiles) in the operator's namespace. Off, a rule that
    /// targets members is `Ready=False`, reason `MemberClustersDisabled`.
    /// With `plan`, plan each member too.
    #[arg(long, env = "MEMBER_CLUSTERS", default_value_t = false, global = true)]
    pub(crate) member_clusters: bool,

    /// Accept members whose server is plain `http://` or whose cluster sets
    /// `insecure-skip-tls-verify`: their credentials then go to whatever
    /// answers at that address. Without it such a member is unusable,
    /// reason `InsecureConnection`.
    #[arg(
        long,
        env = "ALLOW_INSECURE_MEMBERS",
        default_value_t = false,
        global = true
    )]
    pub(crate) allow_insecure_members: bool,

    /// This cluster's name, as copies in member clusters name it (annotation
    /// `copyrator.flant.com/source-cluster`) and as rule statuses list it.
    #[arg(long, env = "CLUSTER_NAME", default_value = "home", global = true)]
    pub(crate) cluster_name: String,

    /// Writes (create, update, delete) in flight at once.
    #[arg(long, env = "WRITE_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024), global = true)]
    pub(crate) write_concurrency: u32,

    /// Source watches open at once. Rules that need the same kind, namespace
    /// and selector share one; past this many, the kinds with the most are
    /// watched across all namespaces instead (one watch each), so that no
    /// rule or number of rules opens more connections.
    #[arg(long, env = "MAX_SOURCE_WATCHES", default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=1000), global = true)]
    pub(crate) max_source_watches: u32,

    /// MiB of sources the rules of one tenant namespace (under
    /// --all-namespaces) may make the operator hold together, each source
    /// counted once however many of them select it. A watch of theirs that
    /// would go past it holds its sources' sizes alone, and its rules read
    /// `Ready=False`, reason `SourcesTooLarge`, until they fit. The
    /// operator's own rules are not bounded.
    #[arg(long, env = "MAX_TENANT_SOURCE_MIB", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=65536), global = true)]
    pub(crate) max_tenant_source_mib: u64,

    /// How requests reach the API server: `mixed` carries the watches,
    /// lists and the Lease over one HTTP/2 connection (over TLS) and writes
    /// over HTTP/1, a connection per write in flight, so the connections
    /// stay at most `--write-concurrency` + 1 however many rules and
    /// watches there are; `http2` carries everything over one connection
    /// (measured: 10,000 copies written at 1.44× a plain HTTP/1 client's
    /// time, against 1.07×); `http1` opens a connection per request in
    /// flight, and one per watch.
    #[arg(long, env = "API_TRANSPORT", value_enum, default_value_t = Transport::Mixed, global = true)]
    pub(crate) api_transport: Transport,

    /// Requests per second the operator sends to the API server (watches not counted); 0 means no limit.
    #[arg(long, env = "API_QPS", default_value_t = 1000.0, global = true)]
    pub(crate) api_qps: f64,

    /// Requests the operator may send at once above --api-qps.
    #[arg(long, env = "API_BURST", default_value_t = 2000, global = true)]
    pub(crate) api_burst: u32,

    /// Kinds the operator copies: `configmap`, `secret`, `Kind.group` (such
    /// as `RoleBinding.rbac.authorization.k8s.io`), `Kind` for the core
    /// group (`ServiceAccount`), or `*` for every kind not denied. It
    /// watches, lists and writes only these, so RBAC needs no verb on others.
    #[arg(
        long,
        env = "KINDS",
        value_delimiter = ',',
        default_value = "configmap,secret",
        global = true
    )]
    pub(crate) kinds: Vec<String>,

    /// Kinds never copied, whatever --kinds says: `Kind` (in every API
    /// group) or `Kind.group`. CopyratorRules are never copied either.
    #[arg(
        long,
        env = "DENIED_KINDS",
        value_delimiter = ',',
        default_value = crate::api::kinds::DENIED_KINDS,
        global = true
    )]
    pub(crate) denied_kinds: Vec<String>,

    /// Namespaces (names or globs) that no glob, selector or default of a
    /// rule reaches: only an exact name in `targets.include`. The operator's
    /// own namespace is always protected.
    #[arg(
        long,
        env = "PROTECTED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system,kube-public,kube-node-lease",
        global = true
    )]
    pub(crate) protected_namespaces: Vec<String>,

    /// Secret types copied besides Opaque, kubernetes.io/tls,
    /// kubernetes.io/dockerconfigjson, kubernetes.io/dockercfg,
    /// kubernetes.io/basic-auth and kubernetes.io/ssh-auth (service-account
    /// tokens and Helm releases are never copied).
    #[arg(long, env = "SECRET_TYPES", value_delimiter = ',', global = true)]
    pub(crate) secret_types: Vec<String>,

    /// Label and annotation keys (globs such as `example.com/*`) never
    /// carried to copies, besides the tracking keys of kubectl, Argo CD,
    /// Helm, kapp, Flux, Fleet and Kustomize.
    #[arg(long, env = "STRIP_KEYS", value_delimiter = ',', global = true)]
    pub(crate) strip_keys: Vec<String>,

    /// Seconds after which /healthz fails when work is pending and nothing
    /// progresses, or a watch keeps failing (Kubernetes then restarts the Pod);
    /// the watches of rules' sources do not count.
    #[arg(long, env = "STUCK_AFTER", default_value_t = 120, value_parser = clap::value_parser!(u64).range(5..), global = true)]
    pub(crate) stuck_after: u64,

    /// Seconds a workload that `rollout.restartConsumers` rolled is left
    /// alone before it is rolled again (a source that keeps changing rolls
    /// its consumers at most this often; the last content is rolled out
    /// when the time is up).
    #[arg(long, env = "MIN_RESTART_INTERVAL", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86400), global = true)]
    pub(crate) min_restart_interval: u64,

    /// Seconds between full passes over every rule (a pass over a correct cluster writes nothing).
    #[arg(long, env = "RESYNC_INTERVAL", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..), global = true)]
    pub(crate) resync_interval: u64,
}

impl Settings {
    /// Which rules the operator follows and where they may copy from.
    /// Settings that passed [`Settings::validate`] always give a policy;
    /// the defaults stand in otherwise.
    pub(crate) fn trust(&self) -> Trust {
        Trust {
            policy: Arc::new(
                self.copy_policy()
                    .unwrap_or_else(|_| CopyPolicy::defaults(&self.namespace)),
            ),
            operator_namespace: self.namespace.clone(),
            all_namespaces: self.all_namespaces,
            allow_tenant_clusters: self.allow_tenant_clusters,
            tenant_identity: self.tenant_identity,
            default_service_account: self.default_service_account.clone(),
            consent_annotations: !self.consent_by_rights,
        }
    }

    /// What the controller reads of the settings, besides the trust policy.
    pub(crate) fn options(&self) -> Options {
        Options {
            rule_name: self.rule_name.clone(),
            limits: Limits {
                write_concurrency: self.write_concurrency,
                api_qps: self.api_qps,
                api_burst: self.api_burst,
                max_source_watches: self.max_source_watches,
                max_tenant_source_bytes: self.max_tenant_source_mib * 1024 * 1024,
                acting_for_extra: self.acting_for_extra,
            },
            keep_kind_watches: false,
            cluster_name: self.cluster_name.clone(),
            member_clusters: self.member_clusters,
            allow_insecure_members: self.allow_insecure_members,
            member_copy_protection: self
                .member_copy_protection
                .clone()
                .filter(|name| !name.is_empty()),
            // Read by `load_options`, which may fail.
            provider_file: None,
            allow_kubeconfig_plugins: self.allow_kubeconfig_plugins,
            min_restart_interval: Duration::from_secs(self.min_restart_interval),
        }
    }

    /// [`Settings::options`], with the files they name read: a file that
    /// cannot be used is an error.
    pub(crate) fn load_options(&self) -> Result<Options, crate::error::Error> {
        let mut options = self.options();
        if let Some(path) = &self.clusterprofile_provider_file {
            let invalid = |why: String| {
                crate::error::Error::Config(format!(
                    "--clusterprofile-provider-file {}: {why}",
                    path.display()
                ))
            };
            let text = std::fs::read(path).map_err(|e| invalid(e.to_string()))?;
            let file = crate::cluster::provider_file::ProviderFile::parse(&text)
                .map_err(|e| invalid(e.to_string()))?;
            options.provider_file = Some(std::sync::Arc::new(file));
        }
        Ok(options)
    }

    pub(crate) fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration)
    }

    pub(crate) fn stuck_after(&self) -> Duration {
        Duration::from_secs(self.stuck_after)
    }

    pub(crate) fn resync_interval(&self) -> Duration {
        Duration::from_secs(self.resync_interval)
    }

    /// What every rule is allowed, from these settings.
    pub(crate) fn copy_policy(&self) -> Result<CopyPolicy, String> {
        let mut policy = CopyPolicy::new(
            &self.namespace,
            &self.protected_namespaces,
            &self.strip_keys,
            &self.secret_types,
        )?;
        policy.denied_kinds =
            DeniedKinds::parse(&self.denied_kinds).map_err(|e| format!("--denied-kinds: {e}"))?;
        policy.kinds = self.enabled_kinds()?.without_denied(&policy.denied_kinds);
        Ok(policy)
    }

    /// The kinds `--kinds` enables.
    pub(crate) fn enabled_kinds(&self) -> Result<EnabledKinds, String> {
        EnabledKinds::parse(&self.kinds).map_err(|e| format!("--kinds: {e}"))
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        self.copy_policy()?;
        if !(self.api_qps >= 0.0 && self.api_qps.is_finite()) {
            return Err(format!("--api-qps must be 0 or more, not {}", self.api_qps));
        }
        if self.namespace.is_empty() {
            return Err("--namespace must not be empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_provider_file_is_read_at_start_and_one_that_cannot_be_used_stops_it() {
        assert!(
            Cli::try_parse_from(["copyrator", "--allow-kubeconfig-plugins"]).is_err(),
            "kubeconfig plugins without a provider file"
        );
        let dir = std::env::temp_dir().join(format!("copyrator-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let options_of = |text: &str| {
            let path = dir.join("providers.json");
            std::fs::write(&path, text).expect("the file");
            let cli = Cli::try_parse_from([
                "copyrator".as_ref(),
                "--clusterprofile-provider-file".as_ref(),
                path.as_os_str(),
            ])
            .expect("parses");
            cli.settings.load_options()
        };
        let good = r#"{"providers": [{"name": "eks", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": "/plugins/eks"}}]}"#;
        let options = options_of(good).expect("usable");
        assert_eq!(options.provider_file.map(|f| f.providers().len()), Some(1));
        let refused = options_of(r#"{"providers": [{"name": "eks"}]}"#)
            .expect_err("refused")
            .to_string();
        assert!(
            refused.contains("--clusterprofile-provider-file") && refused.contains("execConfig"),
            "{refused}"
        );
        let missing = Cli::try_parse_from([
            "copyrator",
            "--clusterprofile-provider-file",
            "/nonexistent/providers.json",
        ])
        .expect("parses");
        assert!(missing.settings.load_options().is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn defaults_and_subcommands() {
        let cli = Cli::try_parse_from(["copyrator"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.settings.write_concurrency, 16);
        assert!(!cli.settings.leader_election);
        let cli = Cli::try_parse_from([
            "copyrator",
            "plan",
            "--namespace",
            "ops",
            "--all-namespaces",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Plan(PlanArgs { ref files, output: PlanOutput::Text })) if files.is_empty()
        ));
        assert_eq!(cli.settings.namespace, "ops");
        assert!(cli.settings.all_namespaces);
        assert!(!cli.settings.allow_tenant_clusters);
        assert!(!cli.settings.trust().allow_tenant_clusters);
        let cli = Cli::try_parse_from(["copyrator", "--allow-tenant-clusters"]).unwrap();
        assert!(cli.settings.trust().allow_tenant_clusters);
        assert!(!cli.settings.options().allow_insecure_members);
        let cli = Cli::try_parse_from(["copyrator", "plan", "--allow-insecure-members"]).unwrap();
        assert!(cli.settings.options().allow_insecure_members);
        let cli = Cli::try_parse_from([
            "copyrator",
            "plan",
            "-f",
            "a.yaml",
            "--filename",
            "-",
            "-o",
            "json",
        ])
        .unwrap();
        match cli.command {
            Some(Command::Plan(args)) => {
                assert_eq!(
                    args.files,
                    [std::path::Path::new("a.yaml"), std::path::Path::new("-")]
                );
                assert_eq!(args.output, PlanOutput::Json);
            }
            other => panic!("not a plan: {other:?}"),
        }
        assert!(Cli::try_parse_from(["copyrator", "plan", "-o", "yaml"]).is_err());
        assert!(Cli::try_parse_from(["copyrator", "--write-concurrency", "0"]).is_err());
        assert!(Cli::try_parse_from(["copyrator", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn where_takes_a_source_a_kind_and_an_output_and_answers_as_a_kubectl_plugin() {
        // kubectl runs `kubectl-copyrator where x/y` for `kubectl copyrator where x/y`.
        let cli = Cli::try_parse_from(["kubectl-copyrator", "where", "shared/ca", "-o", "json"])
            .expect("parses");
        match cli.command {
            Some(Command::Where(args)) => {
                assert_eq!(args.source, "shared/ca");
                assert_eq!(args.kind, "configmap");
                assert_eq!(args.output, PlanOutput::Json);
            }
            other => panic!("not a where: {other:?}"),
        }
        let cli =
            Cli::try_parse_from(["copyrator", "where", "--kind", "secret", "a/b"]).expect("parses");
        assert!(matches!(cli.command, Some(Command::Where(ref a)) if a.kind == "secret"));
        assert!(Cli::try_parse_from(["copyrator", "where"]).is_err());
        for plugin in [
            "kubectl-copyrator",
            "/home/me/bin/kubectl-copyrator",
            "kubectl-copyrator.exe",
        ] {
            assert!(
                is_kubectl_plugin(Some(std::ffi::OsStr::new(plugin))),
                "{plugin}"
            );
        }
        for other in ["copyrator", "/usr/bin/copyrator", "kubectl"] {
            assert!(
                !is_kubectl_plugin(Some(std::ffi::OsStr::new(other))),
                "{other}"
            );
        }
        assert!(!is_kubectl_plugin(None));
    }
}
