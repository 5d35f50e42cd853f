//! The inventory of member clusters, read without a client: each member's
//! name, labels and connection (a `kube::Config`) from one of two layouts
//! in the operator's namespace, and a fingerprint of that connection.
//!
//! - Cluster API's: a Secret labelled `copyrator.flant.com/cluster: NAME`
//!   ([`crate::LABEL_CLUSTER`]) holding a kubeconfig under the data key
//!   `value` ([`from_cluster_secret`]).
//! - SIG Multicluster's: a ClusterProfile (KEP-4322,
//!   `multicluster.x-k8s.io/v1alpha1`) whose `status.accessProviders`
//!   give the server and CA, and a Secret holding the bearer token under
//!   the data key `token`, as KEP-5339's secret reader keeps it
//!   ([`from_cluster_profile`]).
//!
//! Credentials go only where their owner sent them. A profile's token
//! Secret is tied to the profile by the Secret's writer: it is labelled
//! [`crate::LABEL_CLUSTER_PROFILE`] with the profile's name
//! ([`tied_token_secrets`]); neither the profile nor a name ties it, so
//! whoever may write ClusterProfiles cannot send another member's token,
//! or any Secret's `token`, to a server of their choosing. A server reached over plain `http://`,
//! or with `insecure-skip-tls-verify`, is refused in both layouts unless
//! the operator allows it ([`InsecureMembers`]).
//!
//! Only what a kubeconfig holds inline is used. A user that gets its
//! credentials from a command (`exec`) or a plugin (`auth-provider`) is
//! refused before kube sees it, so nothing an inventory names ever runs;
//! so is anything that names a file (the operator's Pod has none of
//! them) and a proxy (the operator's client does not use one). Credential
//! values never reach a message or `Debug`: a parser's words are withheld
//! where they could quote the data.
//!
//! Which Secrets and profiles to read, and what to do with a member whose
//! fingerprint changed, is the watcher's business; this module reads one.

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject};
use kube::client::{ConfigExt, RustlsTlsError};
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, KubeconfigError, LoadDataError,
    NamedAuthInfo, NamedCluster, NamedContext,
};
use kube::core::GroupVersionKind;
use secrecy::{ExposeSecret, SecretString};

use crate::cluster::provider_file::{PluginRun, ProviderFile};
use serde_json::Value;

/// The data key of a cluster Secret that holds the kubeconfig (Cluster
/// API's `<cluster>-kubeconfig` Secrets use the same key).
pub(crate) const KUBECONFIG_KEY: &str = "value";
/// The data key of a token Secret (KEP-5339's secret reader).
pub(crate) const TOKEN_KEY: &str = "token";
/// The access provider KEP-5339's secret reader serves; a profile's
/// provider of that name is preferred (see [`from_cluster_profile`]).
pub(crate) const SECRET_READER: &str = "secretreader";
/// The cluster extension that carries an exec plugin's per-cluster
/// configuration; KEP-5339's secret reader takes the Secret's name from its
/// `clusterName`. Copyrator does not: a profile's writer would then choose
/// whose token the profile's server receives. It is read only to say so
/// where the tied Secret is missing.
pub(crate) const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

/// The flag that lets members be reached over plain `http://` or without
/// verifying their certificate.
pub(crate) const ALLOW_INSECURE_FLAG: &str = "--allow-insecure-members";

/// Whether a member may be reached over plain `http://`, or with
/// `insecure-skip-tls-verify: true` (the operator's
/// `--allow-insecure-members`). Either sends the member's credentials to
/// whatever answers at the server's address: in clear text over the
/// network, or to a server whose certificate nobody checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InsecureMembers {
    /// Such a member is unusable, reason [`Unusable::INSECURE_CONNECTION`].
    Refused,
    Allowed,
}

impl InsecureMembers {
    pub(crate) fn allowed_if(allow: bool) -> Self {
        if allow { Self::Allowed } else { Self::Refused }
    }
}

pub(crate) const CLUSTER_PROFILE_GROUP: &str = "multicluster.x-k8s.io";
pub(crate) const CLUSTER_PROFILE_VERSION: &str = "v1alpha1";
pub(crate) const CLUSTER_PROFILE_KIND: &str = "ClusterProfile";
pub(crate) const CLUSTER_PROFILE_PLURAL: &str = "clusterprofiles";

/// The ClusterProfile resource, for an `Api<DynamicObject>`.
pub(crate) fn cluster_profile_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            CLUSTER_PROFILE_GROUP,
            CLUSTER_PROFILE_VERSION,
            CLUSTER_PROFILE_KIND,
        ),
        CLUSTER_PROFILE_PLURAL,
    )
}

/// Which layout of the inventory a member was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum InventorySource {
    /// A Secret labelled [`crate::LABEL_CLUSTER`] holding a kubeconfig.
    Secret,
    /// A ClusterProfile and its token Secret.
    ClusterProfile,
}

/// Why a member cannot be reached: `reason` is a word for a condition or
/// an Event, `message` a sentence for the user. Neither holds a credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unusable {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl Unusable {
    /// The member's name is empty (the label's value, or the profile's name).
    pub(crate) const NAME_INVALID: &'static str = "NameInvalid";
    /// The cluster Secret has no data key `value`.
    pub(crate) const KUBECONFIG_MISSING: &'static str = "KubeconfigMissing";
    /// The kubeconfig does not parse, names no usable context, or what it
    /// holds (server, CA, client certificate) cannot be used.
    pub(crate) const KUBECONFIG_INVALID: &'static str = "KubeconfigInvalid";
    /// The user gets its credentials from `exec` or `auth-provider`.
    pub(crate) const EXEC_CREDENTIALS_UNSUPPORTED: &'static str = "ExecCredentialsUnsupported";
    /// A file is named where only inline data is accepted.
    pub(crate) const FILE_REFERENCE_UNSUPPORTED: &'static str = "FileReferenceUnsupported";
    /// The cluster entry names a `proxy-url`.
    pub(crate) const PROXY_UNSUPPORTED: &'static str = "ProxyUnsupported";
    /// The server is `http://`, or the cluster sets
    /// `insecure-skip-tls-verify`, and the operator does not allow it
    /// ([`InsecureMembers`]).
    pub(crate) const INSECURE_CONNECTION: &'static str = "InsecureConnection";
    /// The profile lists no access provider with a `cluster.server`.
    pub(crate) const NO_ACCESS_PROVIDER: &'static str = "NoAccessProvider";
    /// The chosen access provider's cluster (server, CA) cannot be used.
    pub(crate) const ACCESS_PROVIDER_INVALID: &'static str = "AccessProviderInvalid";
    /// No Secret tied to the profile, or one without a non-empty data key
    /// `token`.
    pub(crate) const TOKEN_MISSING: &'static str = "TokenMissing";
    /// A provider file is given, none of its providers is listed by the
    /// profile, and no Secret is tied to it.
    pub(crate) const NO_MATCHING_PROVIDER: &'static str = "NoMatchingProvider";
    /// More than one Secret is tied to the profile (labelled
    /// [`crate::LABEL_CLUSTER_PROFILE`] with its name): none is used.
    pub(crate) const TOKEN_SECRET_AMBIGUOUS: &'static str = "TokenSecretAmbiguous";
    /// A token that an HTTP header cannot carry (not text, a line break).
    pub(crate) const TOKEN_INVALID: &'static str = "TokenInvalid";

    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl std::error::Error for Unusable {}

/// One member of the inventory, as read from its source.
#[derive(Clone)]
pub(crate) struct MemberAccess {
    /// The member's name: the label's value, or the profile's name.
    pub(crate) name: String,
    /// Its labels, for rules' cluster selectors: the Secret's or the profile's.
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) from: InventorySource,
    /// The name of the object of the inventory that lists it (the cluster
    /// Secret's, or the profile's): where Events about the member go.
    pub(crate) entry: String,
    /// What a client for the member is built from, or why there is none.
    pub(crate) config: Result<kube::Config, Unusable>,
    /// The plugin of the operator's provider file that gives its
    /// credentials (the config then carries none).
    pub(crate) plugin: Option<PluginRun>,
    /// A hash of all that the connection depends on (server, CA, TLS
    /// settings, credentials) and nothing else: a watcher that sees it
    /// unchanged keeps its client through a change of labels, and one that
    /// sees it change builds a new one, without holding the credentials to
    /// compare. Its keys are drawn once per process, so it is comparable
    /// only within one process, and a logged fingerprint cannot be used to
    /// test guesses of a password.
    pub(crate) fingerprint: u64,
}

impl MemberAccess {
    fn new(
        name: String,
        labels: BTreeMap<String, String>,
        (from, entry): (InventorySource, String),
        connection: Result<(kube::Config, Option<PluginRun>), Unusable>,
    ) -> Self {
        let (config, plugin) = match connection {
            Ok((config, plugin)) => (Ok(config), plugin),
            Err(unusable) => (Err(unusable), None),
        };
        let fingerprint = fingerprint(&config, plugin.as_ref());
        Self {
            name,
            labels,
            from,
            entry,
            config,
            plugin,
            fingerprint,
        }
    }
}

// Credentials never reach a log line: the connection shows where it leads
// and which kinds of credentials it carries, never their values.
impl fmt::Debug for MemberAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("MemberAccess");
        out.field("name", &self.name)
            .field("labels", &self.labels)
            .field("from", &self.from)
            .field("entry", &self.entry);
        match &self.config {
            Ok(config) => out.field("config", &Ok::<_, ()>(Connection(config))),
            Err(unusable) => out.field("config", &Err::<(), _>(unusable)),
        };
        out.field("fingerprint", &format_args!("{:016x}", self.fingerprint))
            .finish()
    }
}

/// A `kube::Config` shown without its credentials.
struct Connection<'a>(&'a kube::Config);

impl fmt::Debug for Connection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = self.0;
        let uri = &config.cluster_url;
        // Only scheme, host and port: a URL could carry a user and password.
        let server = format!(
            "{}://{}{}",
            uri.scheme_str().unwrap_or_default(),
            uri.host().unwrap_or_default(),
            uri.port_u16().map(|p| format!(":{p}")).unwrap_or_default()
        );
        f.debug_struct("Config")
            .field("server", &server)
            .field("tls_server_name", &config.tls_server_name)
            .field("accept_invalid_certs", &config.accept_invalid_certs)
            .field("root_certs", &config.root_cert.as_ref().map_or(0, Vec::len))
            .field("credentials", &credential_kinds(&config.auth_info))
            .finish_non_exhaustive()
    }
}

/// The kinds of credentials a user carries, by name.
fn credential_kinds(user: &AuthInfo) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    if user.token.is_some() {
        kinds.push("token");
    }
    if user.username.is_some() && user.password.is_some() {
        kinds.push("basic");
    }
    if user.client_certificate_data.is_some() {
        kinds.push("client certificate");
    }
    kinds
}

/// The member a cluster Secret describes: `None` when it lacks the label
/// [`crate::LABEL_CLUSTER`]; with an [`Unusable`] config when its
/// kubeconfig is missing, bad or asks for what is refused.
///
/// The kubeconfig's `current-context` is used, or its only context when it
/// names none. The context's cluster and user are checked (no `exec`, no
/// `auth-provider`, no file, no proxy; no `http://` or
/// `insecure-skip-tls-verify` unless `insecure` allows them) before kube
/// builds the config.
pub(crate) async fn from_cluster_secret(
    secret: &Secret,
    insecure: InsecureMembers,
    plugins: Option<&ProviderFile>,
) -> Option<MemberAccess> {
    let name = secret
        .metadata
        .labels
        .as_ref()?
        .get(crate::LABEL_CLUSTER)?
        .clone();
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    let config = cluster_secret_config(secret, &name, insecure, plugins).await;
    let entry = secret.metadata.name.clone().unwrap_or_default();
    Some(MemberAccess::new(
        name,
        labels,
        (InventorySource::Secret, entry),
        config,
    ))
}

async fn cluster_secret_config(
    secret: &Secret,
    name: &str,
    insecure: InsecureMembers,
    plugins: Option<&ProviderFile>,
) -> Result<(kube::Config, Option<PluginRun>), Unusable> {
    if name.is_empty() {
        return Err(Unusable::new(
            Unusable::NAME_INVALID,
            format!(
                "the label {} is empty: its value is the member's name",
                crate::LABEL_CLUSTER
            ),
        ));
    }
    let data = secret
        .data
        .as_ref()
        .and_then(|data| data.get(KUBECONFIG_KEY))
        .ok_or_else(|| {
            Unusable::new(
                Unusable::KUBECONFIG_MISSING,
                format!("the Secret has no data key `{KUBECONFIG_KEY}` holding a kubeconfig"),
            )
        })?;
    let text = std::str::from_utf8(&data.0).map_err(|_| {
        Unusable::new(
            Unusable::KUBECONFIG_INVALID,
            format!("the data key `{KUBECONFIG_KEY}` is not text, so no kubeconfig"),
        )
    })?;
    let kubeconfig = Kubeconfig::from_yaml(text)
        .map_err(|err| Unusable::new(Unusable::KUBECONFIG_INVALID, describe_parse_error(&err)))?;
    let mut entries = chosen_entries(&kubeconfig)?;
    let plugin = match plugins {
        Some(file) if entries.user.exec.is_some() => Some(kubeconfig_plugin(&mut entries, file)?),
        _ => None,
    };
    let config = build_config(entries, Unusable::KUBECONFIG_INVALID, insecure).await?;
    Ok((config, plugin))
}

/// The plugin of the operator's provider file that a kubeconfig's user
/// runs (`--allow-kubeconfig-plugins`): its command must be one the file
/// names, and it runs as the file says, with the kubeconfig's arguments
/// only where that provider appends a profile's, and never with the
/// kubeconfig's environment. The user then holds nothing else.
fn kubeconfig_plugin(entries: &mut Entries, file: &ProviderFile) -> Result<PluginRun, Unusable> {
    let refused = |message: String| Unusable::new(Unusable::EXEC_CREDENTIALS_UNSUPPORTED, message);
    let Some(exec) = entries.user.exec.take() else {
        return Err(refused(format!("{} runs no command", entries.user_is)));
    };
    let command = exec.command.unwrap_or_default();
    let provider = file
        .providers()
        .iter()
        .find(|provider| provider.plugin.command == command)
        .ok_or_else(|| {
            refused(format!(
                "{} runs {command:?}, which the operator's provider file does not name, and \
                 Copyrator runs no other command",
                entries.user_is
            ))
        })?;
    let user = &entries.user;
    if user.token.is_some()
        || user.client_certificate_data.is_some()
        || user.username.is_some()
        || user.auth_provider.is_some()
    {
        return Err(refused(format!(
            "{} runs a command and holds other credentials too: keep one",
            entries.user_is
        )));
    }
    let mut run = provider
        .run_for(&entries.cluster)
        .map_err(|why| Unusable::new(Unusable::KUBECONFIG_INVALID, why))?;
    if provider.append_profile_args {
        run.args.extend(exec.args.unwrap_or_default());
    }
    Ok(run)
}

/// Why a kubeconfig does not parse. The YAML parser's own message can
/// quote the text around the fault, which may be a token or a key, so
/// only where the fault is is said.
fn describe_parse_error(err: &KubeconfigError) -> String {
    match err {
        KubeconfigError::Parse(parse) => {
            let at = parse
                .location()
                .map(|at| format!(" (line {}, column {})", at.line(), at.column()))
                .unwrap_or_default();
            format!(
                "the data key `{KUBECONFIG_KEY}` does not parse as a kubeconfig{at}; the parser's \
                 words are withheld, as they may quote the Secret's data"
            )
        }
        other => format!("the data key `{KUBECONFIG_KEY}` holds no usable kubeconfig: {other}"),
    }
}

/// The cluster and user entries a member is reached with, and how
/// messages name them.
struct Entries {
    cluster_is: String,
    cluster: Cluster,
    user_is: String,
    user: AuthInfo,
    namespace: Option<String>,
}

/// The entries of the kubeconfig's current context, or of its only one.
fn chosen_entries(kubeconfig: &Kubeconfig) -> Result<Entries, Unusable> {
    let invalid = |message: String| Unusable::new(Unusable::KUBECONFIG_INVALID, message);
    let named = match kubeconfig.current_context.as_deref() {
        Some(current) if !current.is_empty() => kubeconfig
            .contexts
            .iter()
            .find(|context| context.name == current)
            .ok_or_else(|| {
                invalid(format!(
                    "the kubeconfig's current-context {current:?} names no context"
                ))
            })?,
        _ => match kubeconfig.contexts.as_slice() {
            [only] => only,
            [] => return Err(invalid("the kubeconfig has no context".to_owned())),
            many => {
                return Err(invalid(format!(
                    "the kubeconfig has {} contexts and no current-context to choose one",
                    many.len()
                )));
            }
        },
    };
    let context = named.context.as_ref().ok_or_else(|| {
        invalid(format!(
            "the kubeconfig's context {:?} is empty",
            named.name
        ))
    })?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|cluster| cluster.name == context.cluster)
        .and_then(|cluster| cluster.cluster.clone())
        .ok_or_else(|| {
            invalid(format!(
                "the kubeconfig's context {:?} names the cluster {:?}, which it does not hold",
                named.name, context.cluster
            ))
        })?;
    let user = match &context.user {
        None => AuthInfo::default(),
        Some(user) => kubeconfig
            .auth_infos
            .iter()
            .find(|named_user| &named_user.name == user)
            .map(|named_user| named_user.auth_info.clone().unwrap_or_default())
            .ok_or_else(|| {
                invalid(format!(
                    "the kubeconfig's context {:?} names the user {user:?}, which it does not hold",
                    named.name
                ))
            })?,
    };
    Ok(Entries {
        cluster_is: format!("the cluster {:?}", context.cluster),
        cluster,
        user_is: format!("the user {:?}", context.user.as_deref().unwrap_or_default()),
        user,
        namespace: context.namespace.clone(),
    })
}

/// The name the entries go by in the kubeconfig kube is given.
const MEMBER: &str = "member";

/// The config for the entries, after refusing what is not supported or
/// not allowed; `invalid` is the reason for what kube or TLS cannot use.
async fn build_config(
    entries: Entries,
    invalid: &'static str,
    insecure: InsecureMembers,
) -> Result<kube::Config, Unusable> {
    refuse_commands(&entries)?;
    refuse_files(&entries)?;
    refuse_proxy(&entries)?;
    refuse_insecure(&entries.cluster_is, &entries.cluster, insecure)?;
    check_token(&entries)?;
    let Entries {
        cluster_is,
        cluster,
        user,
        namespace,
        ..
    } = entries;
    // Only the chosen entries, so kube reads nothing else.
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: MEMBER.to_owned(),
            cluster: Some(cluster),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: MEMBER.to_owned(),
            auth_info: Some(user),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: MEMBER.to_owned(),
            context: Some(Context {
                cluster: MEMBER.to_owned(),
                user: Some(MEMBER.to_owned()),
                namespace,
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(MEMBER.to_owned()),
        ..Kubeconfig::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|err| Unusable::new(invalid, describe_config_error(&cluster_is, &err)))?;
    check_server(&config, &cluster_is, invalid, insecure)?;
    if config.root_cert.as_ref().is_some_and(Vec::is_empty) {
        return Err(Unusable::new(
            invalid,
            format!("the certificate-authority-data of {cluster_is} holds no PEM certificate"),
        ));
    }
    check_tls(&config, invalid)?;
    config.extra_headers_layer().map_err(|err| {
        Unusable::new(
            invalid,
            format!("the user's impersonation (`as`) cannot be sent: {err}"),
        )
    })?;
    Ok(config)
}

/// Refuses a user whose credentials come from running something.
fn refuse_commands(entries: &Entries) -> Result<(), Unusable> {
    let refused = |message: String| Unusable::new(Unusable::EXEC_CREDENTIALS_UNSUPPORTED, message);
    if entries.user.exec.is_some() {
        return Err(refused(format!(
            "{} gets its credentials by running a command (`exec`), and Copyrator never runs \
             what an inventory names: give the user a `token`, or `client-certificate-data` and \
             `client-key-data`",
            entries.user_is
        )));
    }
    if let Some(provider) = &entries.user.auth_provider {
        return Err(refused(format!(
            "{} gets its credentials from the auth-provider {:?}, a plugin Copyrator does not \
             run: give the user a `token`, or `client-certificate-data` and `client-key-data`",
            entries.user_is, provider.name
        )));
    }
    Ok(())
}

/// Refuses entries that name files: the operator's Pod does not have them.
fn refuse_files(entries: &Entries) -> Result<(), Unusable> {
    let named: Vec<&str> = [
        (
            entries.cluster.certificate_authority.is_some(),
            "certificate-authority",
        ),
        (
            entries.user.client_certificate.is_some(),
            "client-certificate",
        ),
        (entries.user.client_key.is_some(), "client-key"),
        (entries.user.token_file.is_some(), "tokenFile"),
    ]
    .into_iter()
    .filter_map(|(set, field)| set.then_some(field))
    .collect();
    if named.is_empty() {
        return Ok(());
    }
    Err(Unusable::new(
        Unusable::FILE_REFERENCE_UNSUPPORTED,
        format!(
            "{} or {} names a file (`{}`), and the operator's Pod has no such file: only inline \
             data is read (`certificate-authority-data`, `client-certificate-data`, \
             `client-key-data`, `token`)",
            entries.cluster_is,
            entries.user_is,
            named.join("`, `")
        ),
    ))
}

/// Refuses a proxy: the operator's client connects directly, and would
/// otherwise ignore it without a word.
fn refuse_proxy(entries: &Entries) -> Result<(), Unusable> {
    if entries
        .cluster
        .proxy_url
        .as_deref()
        .is_some_and(|url| !url.is_empty())
    {
        return Err(Unusable::new(
            Unusable::PROXY_UNSUPPORTED,
            format!(
                "{} names a proxy (`proxy-url`), which Copyrator's client does not use: the \
                 operator must reach the API server directly",
                entries.cluster_is
            ),
        ));
    }
    Ok(())
}

/// Refuses a cluster reached over plain `http://` or without checking its
/// certificate, unless `insecure` allows it: the credentials would go to
/// whatever answers at the address. Read from the entry as written, before
/// any credential is looked up.
fn refuse_insecure(
    cluster_is: &str,
    cluster: &Cluster,
    insecure: InsecureMembers,
) -> Result<(), Unusable> {
    if insecure == InsecureMembers::Allowed {
        return Ok(());
    }
    let plain_http = cluster
        .server
        .as_deref()
        .and_then(|server| server.parse::<http::Uri>().ok())
        .is_some_and(|uri| is_plain_http(&uri));
    if plain_http {
        return Err(plain_http_refusal(cluster_is));
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        return Err(unverified_refusal(cluster_is));
    }
    Ok(())
}

fn is_plain_http(uri: &http::Uri) -> bool {
    uri.scheme() == Some(&http::uri::Scheme::HTTP)
}

fn plain_http_refusal(cluster_is: &str) -> Unusable {
    insecure_refusal(format!(
        "the server of {cluster_is} is an http:// URL: the member's credentials would cross the \
         network unencrypted, to whatever answers at that address"
    ))
}

fn unverified_refusal(cluster_is: &str) -> Unusable {
    insecure_refusal(format!(
        "{cluster_is} sets insecure-skip-tls-verify: the member's credentials would go to \
         whatever answers at that address, its certificate unchecked; give the CA that signs it \
         (certificate-authority-data) instead"
    ))
}

fn insecure_refusal(why: String) -> Unusable {
    Unusable::new(
        Unusable::INSECURE_CONNECTION,
        format!("{why}; refused unless the operator runs with {ALLOW_INSECURE_FLAG}"),
    )
}

/// A token must fit an HTTP header: kube's client would panic on one that
/// does not (a line break, say) when it is built.
fn check_token(entries: &Entries) -> Result<(), Unusable> {
    let Some(token) = &entries.user.token else {
        return Ok(());
    };
    let token = token.expose_secret();
    if token.is_empty() {
        return Err(Unusable::new(
            Unusable::TOKEN_MISSING,
            format!("the token of {} is empty", entries.user_is),
        ));
    }
    if http::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
        return Err(Unusable::new(
            Unusable::TOKEN_INVALID,
            format!(
                "the token of {} holds characters an HTTP header cannot carry (a line break, or \
                 other than visible ASCII)",
                entries.user_is
            ),
        ));
    }
    Ok(())
}

/// What kube could not build, in words that quote no credential.
fn describe_config_error(cluster_is: &str, err: &KubeconfigError) -> String {
    match err {
        KubeconfigError::MissingClusterUrl => format!("{cluster_is} has no server"),
        KubeconfigError::ParseClusterUrl(err) => {
            format!("the server of {cluster_is} is not a URL: {err}")
        }
        KubeconfigError::LoadCertificateAuthority(err) => {
            format!("the certificate-authority-data of {cluster_is} cannot be read: {err}")
        }
        KubeconfigError::ParseCertificates(err) => format!(
            "the certificate-authority-data of {cluster_is} holds no PEM certificate: {err}"
        ),
        KubeconfigError::LoadClientCertificate(_) | KubeconfigError::LoadClientKey(_) => {
            "the client certificate or key cannot be read".to_owned()
        }
        // The others name contexts, clusters, files or settings, not data.
        other => other.to_string(),
    }
}

/// The server must be an https:// URL with a host (or http://, where
/// `insecure` allows it): the client takes anything else for plain http to
/// nowhere. As built by kube, after [`refuse_insecure`] read the entry.
fn check_server(
    config: &kube::Config,
    cluster_is: &str,
    invalid: &'static str,
    insecure: InsecureMembers,
) -> Result<(), Unusable> {
    let uri = &config.cluster_url;
    let refused = insecure == InsecureMembers::Refused;
    if refused && is_plain_http(uri) {
        return Err(plain_http_refusal(cluster_is));
    }
    if refused && config.accept_invalid_certs {
        return Err(unverified_refusal(cluster_is));
    }
    let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
    if (https || is_plain_http(uri)) && uri.host().is_some() {
        return Ok(());
    }
    let schemes = if refused {
        "an https:// URL"
    } else {
        "an https:// (or http://) URL"
    };
    Err(Unusable::new(
        invalid,
        format!("the server of {cluster_is} is not {schemes} with a host"),
    ))
}

/// The CA and the client certificate and key, checked as the client's TLS
/// setup will use them.
fn check_tls(config: &kube::Config, invalid: &'static str) -> Result<(), Unusable> {
    let mut probe = config.clone();
    // With no CA of its own the client trusts the platform's roots; an
    // empty set here checks the rest without reading those.
    if probe.root_cert.is_none() {
        probe.root_cert = Some(Vec::new());
    }
    match probe.rustls_client_config() {
        Ok(_) => Ok(()),
        Err(err) => Err(Unusable::new(invalid, describe_tls_error(&err))),
    }
}

/// A TLS setup error in words; those about the client's identity never
/// carry the parser's, which could quote a byte of the key.
fn describe_tls_error(err: &kube::Error) -> String {
    use KubeconfigError::{LoadClientCertificate, LoadClientKey};
    match err {
        kube::Error::InferKubeconfig(LoadClientKey(LoadDataError::NoBase64DataOrFile)) => {
            "the user has client-certificate-data but no client-key-data".to_owned()
        }
        kube::Error::InferKubeconfig(LoadClientCertificate(LoadDataError::NoBase64DataOrFile)) => {
            "the user has client-key-data but no client-certificate-data".to_owned()
        }
        kube::Error::InferKubeconfig(LoadClientCertificate(_)) => {
            "the user's client-certificate-data is not base64".to_owned()
        }
        kube::Error::InferKubeconfig(LoadClientKey(_)) => {
            "the user's client-key-data is not base64".to_owned()
        }
        kube::Error::RustlsTls(RustlsTlsError::AddRootCertificate(err)) => {
            format!("the certificate-authority-data holds a certificate that cannot be a CA: {err}")
        }
        kube::Error::RustlsTls(
            RustlsTlsError::InvalidIdentityPem(_) | RustlsTlsError::UnknownPrivateKeyFormat,
        ) => "the user's client-certificate-data and client-key-data are not a PEM certificate \
              and a PEM private key"
            .to_owned(),
        // rustls says what is wrong with the pair in its own fixed words.
        kube::Error::RustlsTls(RustlsTlsError::InvalidPrivateKey(err)) => {
            format!("the user's client certificate and key cannot be used together: {err}")
        }
        kube::Error::RustlsTls(err) => format!("the client's TLS cannot be set up: {err}"),
        _ => "the client's TLS cannot be set up".to_owned(),
    }
}

/// The member a ClusterProfile describes, with its token from the one
/// Secret of `secrets` (the operator namespace's) tied to it
/// ([`tied_token_secrets`]).
///
/// Server and CA come from the `cluster` of one of its access providers:
/// the one named `secretreader` (the provider whose token this reads) if
/// it has a `cluster.server`, otherwise the first that has one, in
/// `status.accessProviders` and then the deprecated
/// `status.credentialProviders` (those of a name not in the first). That
/// cluster is checked (no file, no proxy; no `http://` or
/// `insecure-skip-tls-verify` unless `insecure` allows them) before the
/// token is looked up. The token is the Secret's data key `token`,
/// whitespace around it trimmed.
pub(crate) async fn from_cluster_profile<'a>(
    profile: &DynamicObject,
    secrets: impl IntoIterator<Item = &'a Secret>,
    insecure: InsecureMembers,
    plugins: Option<&ProviderFile>,
) -> MemberAccess {
    let name = profile.metadata.name.clone().unwrap_or_default();
    let labels = profile.metadata.labels.clone().unwrap_or_default();
    let config = cluster_profile_config(profile, &name, secrets, (insecure, plugins)).await;
    let entry = (InventorySource::ClusterProfile, name.clone());
    MemberAccess::new(name, labels, entry, config)
}

async fn cluster_profile_config<'a>(
    profile: &DynamicObject,
    name: &str,
    secrets: impl IntoIterator<Item = &'a Secret>,
    (insecure, plugins): (InsecureMembers, Option<&ProviderFile>),
) -> Result<(kube::Config, Option<PluginRun>), Unusable> {
    if name.is_empty() {
        return Err(Unusable::new(
            Unusable::NAME_INVALID,
            "the ClusterProfile has no name",
        ));
    }
    let listed = listed_providers(profile)?;
    // The operator's own plugin for the first of its providers the profile
    // lists; the profile only says where the cluster is.
    if let Some(file) = plugins {
        let names: Vec<&str> = listed.iter().map(|p| p.name.as_str()).collect();
        if let Some(chosen) = file.choose(&names)
            && let Some(provider) = listed.iter().find(|p| p.name == chosen.name)
        {
            let cluster_is = format!("the access provider {:?}", provider.name);
            let run = chosen
                .run_for(&provider.cluster)
                .map_err(|why| Unusable::new(Unusable::ACCESS_PROVIDER_INVALID, why))?;
            let entries = Entries {
                cluster_is,
                cluster: provider.cluster.clone(),
                user_is: format!("the plugin of provider {:?}", chosen.name),
                user: AuthInfo::default(),
                namespace: None,
            };
            let config = build_config(entries, Unusable::ACCESS_PROVIDER_INVALID, insecure).await?;
            return Ok((config, Some(run)));
        }
    }
    let provider = chosen_provider(listed.clone())?;
    let cluster_is = format!("the access provider {:?}", provider.name);
    // Where the token would go is judged before any token is looked up.
    refuse_insecure(&cluster_is, &provider.cluster, insecure)?;
    let secret = match tied_token_secrets(name, secrets).as_slice() {
        [] if plugins.is_some() => return Err(no_matching_provider(name, &listed, plugins)),
        [] => return Err(no_tied_secret(name, &provider)),
        [one] => *one,
        many => return Err(many_tied_secrets(name, many)),
    };
    let secret_name = secret.metadata.name.as_deref().unwrap_or_default();
    let token = token_from(secret)?;
    let entries = Entries {
        cluster_is,
        cluster: provider.cluster,
        user_is: format!("the Secret {secret_name:?}"),
        user: AuthInfo {
            token: Some(token),
            ..AuthInfo::default()
        },
        namespace: None,
    };
    let config = build_config(entries, Unusable::ACCESS_PROVIDER_INVALID, insecure).await?;
    Ok((config, None))
}

/// Why a profile cannot be reached where the operator has a provider file:
/// none of its providers is listed by the profile, and no Secret is tied
/// to it. No plugin runs and no connection is made.
fn no_matching_provider(
    profile: &str,
    listed: &[Provider],
    plugins: Option<&ProviderFile>,
) -> Unusable {
    let ours: Vec<&str> = plugins
        .map(|file| file.providers().iter().map(|p| p.name.as_str()).collect())
        .unwrap_or_default();
    let theirs: Vec<&str> = listed.iter().map(|p| p.name.as_str()).collect();
    Unusable::new(
        Unusable::NO_MATCHING_PROVIDER,
        format!(
            "the profile lists the access providers {theirs:?}, none of which the operator's \
             provider file names ({ours:?}), and no Secret is tied to it (labelled {}={profile})",
            crate::LABEL_CLUSTER_PROFILE
        ),
    )
}

/// The Secrets of `secrets` tied to the profile named `profile` by their
/// writers: those labelled [`crate::LABEL_CLUSTER_PROFILE`] with its name.
/// One is the profile's token Secret; none or more than one leave the
/// profile unusable. The profile has no say: what it names (KEP-5339's
/// `clusterName`) is not read.
///
/// A Secret's name ties it to nothing: any Secret of the operator's
/// namespace may hold a `token` (a ServiceAccount's, a bot's), and whoever
/// may create a profile of that name would otherwise have that token sent
/// to the server the profile names.
pub(crate) fn tied_token_secrets<'a>(
    profile: &str,
    secrets: impl IntoIterator<Item = &'a Secret>,
) -> Vec<&'a Secret> {
    secrets
        .into_iter()
        .filter(|secret| {
            secret
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(crate::LABEL_CLUSTER_PROFILE))
                .is_some_and(|tied_to| tied_to == profile)
        })
        .collect()
}

/// Why a profile has no token: no Secret is tied to it. Where its access
/// provider's `clusterName` names some other Secret (the secret reader's
/// way), the message says that name is not read, and how to tie one.
fn no_tied_secret(profile: &str, provider: &Provider) -> Unusable {
    let label = crate::LABEL_CLUSTER_PROFILE;
    let not_read = match exec_cluster_name(&provider.cluster) {
        Some(named) if named != profile => format!(
            "; the access provider's clusterName {named:?} ({EXEC_EXTENSION}) is not read, as a \
             profile may not choose whose token it is given: whoever may write that Secret can \
             label it {label}={profile}"
        ),
        _ => String::new(),
    };
    Unusable::new(
        Unusable::TOKEN_MISSING,
        format!(
            "no Secret in the operator's namespace is tied to the profile {profile:?}: the one \
             holding its token under the data key `{TOKEN_KEY}` must be labelled \
             {label}={profile} (a Secret's name ties it to nothing){not_read}"
        ),
    )
}

/// Why a profile has no token: more than one Secret is tied to it.
fn many_tied_secrets(profile: &str, secrets: &[&Secret]) -> Unusable {
    let mut names: Vec<&str> = secrets
        .iter()
        .map(|secret| secret.metadata.name.as_deref().unwrap_or_default())
        .collect();
    names.sort_unstable();
    Unusable::new(
        Unusable::TOKEN_SECRET_AMBIGUOUS,
        format!(
            "the Secrets {names:?} are each tied to the profile (labelled {}={profile}), and \
             none is used: leave one",
            crate::LABEL_CLUSTER_PROFILE
        ),
    )
}

/// An access provider of a profile.
#[derive(Clone)]
struct Provider {
    name: String,
    cluster: Cluster,
}

/// The provider a profile is reached through with a tied token Secret
/// (see [`from_cluster_profile`]): the secret reader's, else the first.
fn chosen_provider(mut usable: Vec<Provider>) -> Result<Provider, Unusable> {
    let at = usable
        .iter()
        .position(|provider| provider.name == SECRET_READER)
        .unwrap_or(0);
    if at < usable.len() {
        return Ok(usable.swap_remove(at));
    }
    Err(Unusable::new(
        Unusable::NO_ACCESS_PROVIDER,
        "the ClusterProfile's status lists no access provider with a cluster.server \
         (status.accessProviders)",
    ))
}

/// The access providers a profile lists with a `cluster.server`: those of
/// `status.accessProviders`, then those of the deprecated
/// `status.credentialProviders` of a name not in the first. None but one
/// that cannot be read: why.
fn listed_providers(profile: &DynamicObject) -> Result<Vec<Provider>, Unusable> {
    let status = profile.data.get("status");
    let listed = |field: &str| {
        status
            .and_then(|status| status.get(field))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    };
    let current = listed("accessProviders");
    let deprecated = listed("credentialProviders")
        .iter()
        .filter(|old| !current.iter().any(|new| new.get("name") == old.get("name")));
    let mut usable = Vec::new();
    let mut unreadable = None;
    for entry in current.iter().chain(deprecated) {
        let name = entry
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let Some(cluster) = entry.get("cluster") else {
            continue;
        };
        match serde_json::from_value::<Cluster>(cluster.clone()) {
            Ok(cluster) if cluster.server.as_deref().is_some_and(|s| !s.is_empty()) => {
                usable.push(Provider { name, cluster });
            }
            Ok(_) => {}
            // A profile's status holds no secret (KEP-5339), so serde's words may quote it.
            Err(err) => {
                unreadable.get_or_insert(Unusable::new(
                    Unusable::ACCESS_PROVIDER_INVALID,
                    format!("the cluster of the access provider {name:?} cannot be read: {err}"),
                ));
            }
        }
    }
    match unreadable {
        Some(unreadable) if usable.is_empty() => Err(unreadable),
        _ => Ok(usable),
    }
}

/// The `clusterName` of a cluster's [`EXEC_EXTENSION`], if it has one.
fn exec_cluster_name(cluster: &Cluster) -> Option<String> {
    cluster
        .extensions
        .as_ref()?
        .iter()
        .find(|extension| extension.name == EXEC_EXTENSION)?
        .extension
        .get("clusterName")?
        .as_str()
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

/// The token the Secret holds under the data key `token`.
fn token_from(secret: &Secret) -> Result<SecretString, Unusable> {
    let missing = |message: String| Unusable::new(Unusable::TOKEN_MISSING, message);
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let data = secret
        .data
        .as_ref()
        .and_then(|data| data.get(TOKEN_KEY))
        .ok_or_else(|| missing(format!("the Secret {name:?} has no data key `{TOKEN_KEY}`")))?;
    let token = std::str::from_utf8(&data.0).map_err(|_| {
        Unusable::new(
            Unusable::TOKEN_INVALID,
            format!("the token in the Secret {name:?} is not text"),
        )
    })?;
    // `kubectl create secret --from-file` keeps a file's last line break.
    let token = token.trim();
    if token.is_empty() {
        return Err(missing(format!(
            "the data key `{TOKEN_KEY}` of the Secret {name:?} is empty"
        )));
    }
    Ok(SecretString::from(token.to_owned()))
}

/// The hasher's keys, drawn once per process: fingerprints stay comparable
/// for the process's life, and one that is logged cannot be used offline
/// to test guesses of a password (with fixed keys it could).
fn fingerprint_keys() -> &'static RandomState {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new)
}

/// See [`MemberAccess::fingerprint`]. Everything of the config the client
/// is built from is hashed.
fn fingerprint(config: &Result<kube::Config, Unusable>, plugin: Option<&PluginRun>) -> u64 {
    let mut state = fingerprint_keys().build_hasher();
    if let Some(plugin) = plugin {
        "plugin".hash(&mut state);
        plugin.provider.hash(&mut state);
        plugin.command.hash(&mut state);
        plugin.args.hash(&mut state);
        plugin.env.hash(&mut state);
        plugin.exec_info.to_string().hash(&mut state);
    }
    match config {
        Ok(config) => {
            "usable".hash(&mut state);
            config.cluster_url.hash(&mut state);
            config.default_namespace.hash(&mut state);
            config.root_cert.hash(&mut state);
            config.accept_invalid_certs.hash(&mut state);
            config.tls_server_name.hash(&mut state);
            config.proxy_url.hash(&mut state);
            config.disable_compression.hash(&mut state);
            hash_user(&config.auth_info, &mut state);
        }
        Err(unusable) => {
            "unusable".hash(&mut state);
            unusable.reason.hash(&mut state);
            unusable.message.hash(&mut state);
        }
    }
    state.finish()
}

fn exposed(secret: &Option<SecretString>) -> Option<&str> {
    secret.as_ref().map(ExposeSecret::expose_secret)
}

fn hash_user(user: &AuthInfo, state: &mut impl Hasher) {
    user.username.hash(state);
    exposed(&user.password).hash(state);
    exposed(&user.token).hash(state);
    user.client_certificate_data.hash(state);
    exposed(&user.client_key_data).hash(state);
    user.impersonate.hash(state);
    user.impersonate_uid.hash(state);
    user.impersonate_groups.hash(state);
    user.impersonate_user_extra
        .as_ref()
        .map(|extra| extra.iter().collect::<BTreeMap<_, _>>())
        .hash(state);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;
    use serde_json::json;

    // A CA and a client certificate it signed, with the client's key: made
    // for these tests alone, valid until 2126.
    const CA: &str = "-----BEGIN CERTIFICATE-----
MIIBfzCCASWgAwIBAgIUCLJk1BmlGvqdszSyQfH8OfO3eqUwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbWVtYmVyLWNhMCAXDTI2MTEyNDIxMzIxMFoYDzIxMjYxMDMx
MjEzMjEwWjAUMRIwEAYDVQQDDAltZW1iZXItY2EwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAQTseXWiojxzMiHRy5+m/wcdAlbT7xe+HdzXizv/SFhQ0I/8m0GLB6J
sTB9n0AvO+ErgxVoqdi0YIHzgxCyS4nwo1MwUTAdBgNVHQ4EFgQUW0pgFMIgqNyG
fC9uNZlzl+VGtUAwHwYDVR0jBBgwFoAUW0pgFMIgqNyGfC9uNZlzl+VGtUAwDwYD
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAtp5DldMUIGppfk3wi6wU
xZV5Fc1Wx2W+ErZgcLH6hC4CIBA+qR1wKGGTPy0uAQ0KUyWCrZfejE1FQEoSd2aL
XVMc
-----END CERTIFICATE-----
";
    const CLIENT_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBqjCCAVCgAwIBAgIUKbyMH58jx0IKHAy5OhCWDmz5/t8wCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbWVtYmVyLWNhMCAXDTI2MTEyNDIxNDAxN1oYDzIxMjYxMDMx
MjE0MDE3WjAjMRIwEAYDVQQDDAljb3B5cmF0b3IxDTALBgNVBAoMBHRlc3QwWTAT
BgcqhkjOPQIBBggqhkjOPQMBBwNCAATCGMg8bNK7dN18xxPShCdrPiEdIvrCqZQ7
j70Qkdu+L1fn9HJ26hXWz8k0XGi5beUYBufwfEEhRpVLm1FPD9J7o28wbTAJBgNV
HRMEAjAAMAsGA1UdDwQEAwIHgDATBgNVHSUEDDAKBggrBgEFBQcDAjAdBgNVHQ4E
FgQUqRvOcWzT+PxpiLGUZQ2GY2f9lu8wHwYDVR0jBBgwFoAUW0pgFMIgqNyGfC9u
NZlzl+VGtUAwCgYIKoZIzj0EAwIDSAAwRQIgYhZ7YfCma5QV1olBQdPd2gyuLkzz
CCRmykpx1B8ILd0CIQCH/G0oIUG1dFp09GdagSy0MxJR45YwZbi7Lx9Uw7LWOA==
-----END CERTIFICATE-----
";
    const CLIENT_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgqo8lFfMLrdDb/9UU
i7Z1392gHOzuvqes8v/fn6w2rvKhRANCAATCGMg8bNK7dN18xxPShCdrPiEdIvrC
qZQ7j70Qkdu+L1fn9HJ26hXWz8k0XGi5beUYBufwfEEhRpVLm1FPD9J7
-----END PRIVATE KEY-----
";
    const TOKEN: &str = "s3cr3t-token-0123456789abcdef";
    /// Another member's token, which a profile must never be given.
    const OTHER_TOKEN: &str = "s3cr3t-token-of-another-member";
    const SERVER: &str = "https://member-a.example:6443";

    fn base64(text: &str) -> String {
        let encoded = serde_json::to_value(ByteString(text.as_bytes().to_vec())).expect("encodes");
        encoded.as_str().expect("a string").to_owned()
    }

    /// The DER of a PEM certificate: its body, decoded.
    fn der(pem: &str) -> Vec<u8> {
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        serde_json::from_value::<ByteString>(json!(body))
            .expect("base64")
            .0
    }

    /// A kubeconfig with one cluster (the test CA) and the user `user`.
    fn kubeconfig(user: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: kind-member-a
  cluster:
    server: {SERVER}
    certificate-authority-data: {}
users:
- name: admin
  user:
{user}
contexts:
- name: member-a
  context:
    cluster: kind-member-a
    user: admin
    namespace: tenants
current-context: member-a
",
            base64(CA)
        )
    }

    fn token_user(token: &str) -> String {
        format!("    token: {token}")
    }

    fn cluster_secret(labels: &[(&str, &str)], data: Option<&str>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("member-a-kubeconfig".to_owned()),
                namespace: Some("copyrator".to_owned()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            data: data.map(|text| {
                BTreeMap::from([(
                    KUBECONFIG_KEY.to_owned(),
                    ByteString(text.as_bytes().to_vec()),
                )])
            }),
            ..Secret::default()
        }
    }

    async fn member(kubeconfig: &str) -> MemberAccess {
        secret_member(&cluster_secret(
            &[(crate::LABEL_CLUSTER, "member-a")],
            Some(kubeconfig),
        ))
        .await
        .expect("a labelled Secret is a member")
    }

    async fn refusal(kubeconfig: &str) -> Unusable {
        match member(kubeconfig).await.config {
            Ok(config) => panic!("accepted, leading to {}", config.cluster_url),
            Err(unusable) => unusable,
        }
    }

    /// The member a cluster Secret describes, where insecure members are refused.
    async fn secret_member(secret: &Secret) -> Option<MemberAccess> {
        from_cluster_secret(secret, InsecureMembers::Refused, None).await
    }

    /// The member a profile describes with the operator namespace's
    /// `secrets`, where insecure members are refused.
    async fn profile_member<'a>(
        profile: &DynamicObject,
        secrets: impl IntoIterator<Item = &'a Secret>,
    ) -> MemberAccess {
        from_cluster_profile(profile, secrets, InsecureMembers::Refused, None).await
    }

    fn bearer(config: &kube::Config) -> Option<&str> {
        exposed(&config.auth_info.token)
    }

    #[tokio::test]
    async fn a_token_user_gives_its_server_ca_and_token() {
        let member = member(&kubeconfig(&token_user(TOKEN))).await;
        assert_eq!(member.name, "member-a");
        assert_eq!(member.from, InventorySource::Secret);
        assert_eq!(
            member.labels.get(crate::LABEL_CLUSTER).map(String::as_str),
            Some("member-a")
        );
        let config = member.config.expect("usable");
        assert_eq!(config.cluster_url.to_string(), format!("{SERVER}/"));
        assert_eq!(config.root_cert, Some(vec![der(CA)]));
        assert_eq!(bearer(&config), Some(TOKEN));
        assert_eq!(config.default_namespace, "tenants");
        assert!(!config.accept_invalid_certs);
    }

    #[tokio::test]
    async fn a_client_certificate_user_gives_its_certificate_and_key() {
        let user = format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            base64(CLIENT_CERT),
            base64(CLIENT_KEY)
        );
        let config = member(&kubeconfig(&user)).await.config.expect("usable");
        assert_eq!(config.cluster_url.to_string(), format!("{SERVER}/"));
        assert_eq!(config.root_cert, Some(vec![der(CA)]));
        assert_eq!(
            config.auth_info.client_certificate_data,
            Some(base64(CLIENT_CERT))
        );
        assert_eq!(
            exposed(&config.auth_info.client_key_data),
            Some(base64(CLIENT_KEY).as_str())
        );
        assert_eq!(bearer(&config), None);
    }

    #[tokio::test]
    async fn a_client_certificate_without_its_key_or_not_pem_is_refused() {
        let alone = format!("    client-certificate-data: {}", base64(CLIENT_CERT));
        let refused = refusal(&kubeconfig(&alone)).await;
        assert_eq!(refused.reason, Unusable::KUBECONFIG_INVALID);
        assert!(refused.message.contains("no client-key-data"), "{refused}");

        let not_pem = format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            base64(CLIENT_CERT),
            base64("not a key")
        );
        let refused = refusal(&kubeconfig(&not_pem)).await;
        assert_eq!(refused.reason, Unusable::KUBECONFIG_INVALID);
    }

    #[tokio::test]
    async fn the_only_context_serves_without_a_current_context() {
        let text = kubeconfig(&token_user(TOKEN)).replace("current-context: member-a\n", "");
        let config = member(&text).await.config.expect("usable");
        assert_eq!(bearer(&config), Some(TOKEN));

        let two = text.replace(
            "contexts:\n",
            "contexts:\n- name: other\n  context:\n    cluster: kind-member-a\n",
        );
        let refused = refusal(&two).await;
        assert_eq!(refused.reason, Unusable::KUBECONFIG_INVALID);
        assert!(refused.message.contains("no current-context"), "{refused}");
    }

    /// A user running `command` with `args` and an environment variable.
    fn exec_user(command: &str, args: &str) -> String {
        format!(
            "    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: {command}
      args: {args}
      env: [{{name: LD_PRELOAD, value: /tmp/x.so}}]
      interactiveMode: Never"
        )
    }

    #[tokio::test]
    async fn a_kubeconfig_runs_only_a_command_of_the_provider_file_and_as_the_file_says() {
        let secret = |user: &str| {
            cluster_secret(
                &[(crate::LABEL_CLUSTER, "member-a")],
                Some(&kubeconfig(user)),
            )
        };
        let file = plugins(&["eks"]);
        let named = secret(&exec_user("/plugins/eks", "[\"--role\", \"admin\"]"));
        let member = from_cluster_secret(&named, InsecureMembers::Refused, Some(&file))
            .await
            .expect("a member");
        assert_eq!(bearer(&member.config.expect("usable")), None);
        let run = member.plugin.expect("a plugin");
        // The file's plugin, as the file says: no argument, no variable of
        // the kubeconfig's (its provider does not append them).
        assert_eq!(run.command, "/plugins/eks");
        assert!(run.args.is_empty(), "{:?}", run.args);
        assert!(run.env.is_empty(), "{:?}", run.env);
        assert_eq!(run.exec_info["spec"]["cluster"]["server"], SERVER);

        for (user, says) in [
            (exec_user("/bin/sh", "[\"-c\", \"true\"]"), "does not name"),
            (
                format!("{}\n{}", token_user(TOKEN), exec_user("/plugins/eks", "[]")),
                "other credentials",
            ),
        ] {
            let member = from_cluster_secret(&secret(&user), InsecureMembers::Refused, Some(&file))
                .await
                .expect("a member");
            let refused = member.config.expect_err("unusable");
            assert_eq!(refused.reason, Unusable::EXEC_CREDENTIALS_UNSUPPORTED);
            assert!(refused.message.contains(says), "{refused}");
            assert!(member.plugin.is_none());
        }
        // Without --allow-kubeconfig-plugins (no file given here): refused.
        let member = from_cluster_secret(&named, InsecureMembers::Refused, None)
            .await
            .expect("a member");
        assert_eq!(
            member.config.expect_err("unusable").reason,
            Unusable::EXEC_CREDENTIALS_UNSUPPORTED
        );
    }

    #[tokio::test]
    async fn an_exec_user_is_refused_and_its_command_never_runs() {
        let marker =
            std::env::temp_dir().join(format!("copyrator-exec-ran-{}", std::process::id()));
        let user = format!(
            "    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /bin/sh
      args: [\"-c\", \"touch {}\"]
      interactiveMode: Never
      provideClusterInfo: true",
            marker.display()
        );
        let refused = refusal(&kubeconfig(&user)).await;
        assert_eq!(refused.reason, Unusable::EXEC_CREDENTIALS_UNSUPPORTED);
        assert!(refused.message.contains("`exec`"), "{refused}");
        assert!(!marker.exists(), "the exec command ran");

        // Beside a token too: the user is refused, not half used.
        let both = format!("{}\n{user}", token_user(TOKEN));
        let refused = refusal(&kubeconfig(&both)).await;
        assert_eq!(refused.reason, Unusable::EXEC_CREDENTIALS_UNSUPPORTED);
        assert!(!marker.exists(), "the exec command ran");
    }

    #[tokio::test]
    async fn an_auth_provider_user_is_refused() {
        let user = "    auth-provider:
      name: oidc
      config:
        id-token: eyJhbGciOi.s3cr3t
        idp-issuer-url: https://issuer.example";
        let refused = refusal(&kubeconfig(user)).await;
        assert_eq!(refused.reason, Unusable::EXEC_CREDENTIALS_UNSUPPORTED);
        assert!(refused.message.contains("\"oidc\""), "{refused}");
        assert!(!refused.message.contains("s3cr3t"), "{refused}");
    }

    #[tokio::test]
    async fn files_are_refused_even_beside_inline_data() {
        let token_file = format!("{}\n    tokenFile: /var/run/token", token_user(TOKEN));
        let refused = refusal(&kubeconfig(&token_file)).await;
        assert_eq!(refused.reason, Unusable::FILE_REFERENCE_UNSUPPORTED);
        assert!(refused.message.contains("`tokenFile`"), "{refused}");

        let cert_files =
            "    client-certificate: /etc/member/tls.crt\n    client-key: /etc/member/tls.key";
        let refused = refusal(&kubeconfig(cert_files)).await;
        assert_eq!(refused.reason, Unusable::FILE_REFERENCE_UNSUPPORTED);
        assert!(
            refused
                .message
                .contains("`client-certificate`, `client-key`"),
            "{refused}"
        );

        let ca_file = kubeconfig(&token_user(TOKEN)).replace(
            "    server:",
            "    certificate-authority: /etc/member/ca.crt\n    server:",
        );
        let refused = refusal(&ca_file).await;
        assert_eq!(refused.reason, Unusable::FILE_REFERENCE_UNSUPPORTED);
        assert!(
            refused.message.contains("`certificate-authority`"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn a_proxy_is_refused() {
        let text = kubeconfig(&token_user(TOKEN)).replace(
            "    server:",
            "    proxy-url: http://proxy.example:3128\n    server:",
        );
        assert_eq!(refusal(&text).await.reason, Unusable::PROXY_UNSUPPORTED);
    }

    #[tokio::test]
    async fn a_token_that_no_header_can_carry_is_refused() {
        let text = kubeconfig("    token: \"two\\nlines\"");
        assert_eq!(refusal(&text).await.reason, Unusable::TOKEN_INVALID);
    }

    #[tokio::test]
    async fn a_server_that_is_no_url_is_refused() {
        for server in ["member-a.example:6443", "ftp://member-a.example"] {
            let text = kubeconfig(&token_user(TOKEN)).replace(SERVER, server);
            let refused = refusal(&text).await;
            assert_eq!(refused.reason, Unusable::KUBECONFIG_INVALID, "{server}");
        }
    }

    #[tokio::test]
    async fn a_secret_without_the_label_is_no_member() {
        let secret = cluster_secret(&[("app", "x")], Some(&kubeconfig(&token_user(TOKEN))));
        assert!(secret_member(&secret).await.is_none());
        let mut unlabelled = secret;
        unlabelled.metadata.labels = None;
        assert!(secret_member(&unlabelled).await.is_none());
    }

    #[tokio::test]
    async fn an_empty_label_or_a_missing_value_key_is_unusable() {
        let empty = cluster_secret(
            &[(crate::LABEL_CLUSTER, "")],
            Some(&kubeconfig(&token_user(TOKEN))),
        );
        let member = secret_member(&empty).await.expect("a member");
        assert_eq!(
            member.config.expect_err("unusable").reason,
            Unusable::NAME_INVALID
        );

        let no_value = cluster_secret(&[(crate::LABEL_CLUSTER, "member-a")], None);
        let member = secret_member(&no_value).await.expect("a member");
        assert_eq!(member.name, "member-a");
        assert_eq!(
            member.config.expect_err("unusable").reason,
            Unusable::KUBECONFIG_MISSING
        );
    }

    #[tokio::test]
    async fn garbage_is_refused_without_quoting_it() {
        for garbage in [
            format!("users:\n- name: a\n  user:\n    token: [{TOKEN}\n"),
            format!("users: {TOKEN}\n"),
            format!("clusters:\n- name: a\n  cluster:\n    server: {{{TOKEN}: 1}}\n"),
            format!("\t{TOKEN}: : :\n"),
            String::new(),
        ] {
            let refused = refusal(&garbage).await;
            assert_eq!(refused.reason, Unusable::KUBECONFIG_INVALID, "{garbage:?}");
            assert!(
                !refused.message.contains("s3cr3t"),
                "{garbage:?} quoted: {refused}"
            );
        }
        let not_text = cluster_secret(&[(crate::LABEL_CLUSTER, "member-a")], None);
        let mut not_text = not_text;
        not_text.data = Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_owned(),
            ByteString(vec![0xff, 0xfe, 0x00]),
        )]));
        let member = secret_member(&not_text).await.expect("a member");
        assert_eq!(
            member.config.expect_err("unusable").reason,
            Unusable::KUBECONFIG_INVALID
        );
    }

    #[tokio::test]
    async fn a_label_change_keeps_the_fingerprint_and_a_token_change_changes_it() {
        let text = kubeconfig(&token_user(TOKEN));
        let before = member(&text).await;
        let relabelled = secret_member(&cluster_secret(
            &[(crate::LABEL_CLUSTER, "member-a"), ("region", "eu")],
            Some(&text),
        ))
        .await
        .expect("a member");
        assert_ne!(before.labels, relabelled.labels);
        assert_eq!(before.fingerprint, relabelled.fingerprint);

        let rotated = member(&kubeconfig(&token_user("s3cr3t-token-rotated"))).await;
        assert_ne!(before.fingerprint, rotated.fingerprint);
        let moved = member(&text.replace(SERVER, "https://member-b.example:6443")).await;
        assert_ne!(before.fingerprint, moved.fingerprint);
        let refused = member(&kubeconfig("    tokenFile: /t")).await;
        assert_ne!(before.fingerprint, refused.fingerprint);
    }

    #[tokio::test]
    async fn debug_shows_no_credential() {
        let user = format!(
            "{}\n    client-certificate-data: {}\n    client-key-data: {}",
            token_user(TOKEN),
            base64(CLIENT_CERT),
            base64(CLIENT_KEY)
        );
        let member = member(&kubeconfig(&user)).await;
        let shown = format!("{member:?}");
        assert!(shown.contains("member-a"), "{shown}");
        assert!(shown.contains("member-a.example:6443"), "{shown}");
        assert!(shown.contains("client certificate"), "{shown}");
        for secret in [TOKEN, &base64(CLIENT_KEY), "MIGHAgEAMBMG"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        // kube's own Debug of the config redacts them too.
        let config = format!("{:?}", member.config);
        assert!(!config.contains(TOKEN) && !config.contains(&base64(CLIENT_KEY)));

        let profile = profile_member(
            &profile(providers()),
            Some(&token_secret("member-a", TOKEN)),
        )
        .await;
        let shown = format!("{profile:?}");
        assert!(shown.contains("token") && !shown.contains(TOKEN), "{shown}");
    }

    fn providers() -> Value {
        json!([{
            "name": SECRET_READER,
            "cluster": {
                "server": SERVER,
                "certificate-authority-data": base64(CA),
            },
        }])
    }

    fn profile(access_providers: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1",
            "kind": "ClusterProfile",
            "metadata": {
                "name": "member-a",
                "namespace": "copyrator",
                "labels": {"x-k8s.io/cluster-manager": "fleet", "region": "eu"},
            },
            "spec": {"displayName": "member-a", "clusterManager": {"name": "fleet"}},
            "status": {"accessProviders": access_providers},
        }))
        .expect("a ClusterProfile")
    }

    /// A Secret in the operator's namespace holding `token`, tied by the
    /// label to the profile of its own name.
    fn token_secret(name: &str, token: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("copyrator".to_owned()),
                labels: Some(BTreeMap::from([(
                    crate::LABEL_CLUSTER_PROFILE.to_owned(),
                    name.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                TOKEN_KEY.to_owned(),
                ByteString(token.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        }
    }

    #[tokio::test]
    async fn a_profile_with_server_ca_and_token_secret_gives_a_config() {
        let profile = profile(providers());
        let secrets = [
            token_secret("member-b", OTHER_TOKEN),
            token_secret("member-a", &format!("{TOKEN}\n")),
        ];
        let member = profile_member(&profile, &secrets).await;
        assert_eq!(member.name, "member-a");
        assert_eq!(member.from, InventorySource::ClusterProfile);
        assert_eq!(member.labels.get("region").map(String::as_str), Some("eu"));
        let config = member.config.expect("usable");
        assert_eq!(config.cluster_url.to_string(), format!("{SERVER}/"));
        assert_eq!(config.root_cert, Some(vec![der(CA)]));
        // The line break `--from-file` keeps is trimmed.
        assert_eq!(bearer(&config), Some(TOKEN));
    }

    #[tokio::test]
    async fn a_profile_without_its_token_secret_is_unusable() {
        let profile = profile(providers());
        let member = profile_member(&profile, None).await;
        let refused = member.config.expect_err("unusable");
        assert_eq!(refused.reason, Unusable::TOKEN_MISSING);
        assert!(refused.message.contains("\"member-a\""), "{refused}");

        for secret in [
            token_secret("member-b", TOKEN),
            token_secret("member-a", " \n"),
            Secret {
                data: None,
                ..token_secret("member-a", TOKEN)
            },
        ] {
            let member = profile_member(&profile, Some(&secret)).await;
            assert_eq!(
                member.config.expect_err("unusable").reason,
                Unusable::TOKEN_MISSING
            );
        }
        let two_lines = token_secret("member-a", "two\nlines");
        let member = profile_member(&profile, Some(&two_lines)).await;
        assert_eq!(
            member.config.expect_err("unusable").reason,
            Unusable::TOKEN_INVALID
        );
    }

    /// A provider file naming `names`, each running `/plugins/<name>`.
    fn plugins(names: &[&str]) -> ProviderFile {
        let providers: Vec<Value> = names
            .iter()
            .map(|name| {
                json!({"name": name, "execConfig": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": format!("/plugins/{name}"),
                    "provideClusterInfo": true}})
            })
            .collect();
        ProviderFile::parse(json!({ "providers": providers }).to_string().as_bytes())
            .expect("a provider file")
    }

    /// The profile's access providers of `names`, each at [`SERVER`].
    fn providers_named(names: &[&str]) -> Value {
        names
            .iter()
            .map(|name| {
                json!({"name": name, "cluster": {
                    "server": SERVER, "certificate-authority-data": base64(CA)}})
            })
            .collect()
    }

    #[tokio::test]
    async fn a_profile_listing_a_provider_of_the_file_is_reached_through_its_plugin() {
        let profile = profile(providers_named(&["gke", "eks"]));
        let file = plugins(&["eks", "gke"]);
        // A tied Secret is there too: the operator's file comes first.
        let secret = token_secret("member-a", TOKEN);
        let member = from_cluster_profile(
            &profile,
            Some(&secret),
            InsecureMembers::Refused,
            Some(&file),
        )
        .await;
        let config = member.config.expect("usable");
        assert_eq!(config.cluster_url.to_string(), format!("{SERVER}/"));
        assert_eq!(bearer(&config), None, "the plugin gives the token");
        let plugin = member.plugin.expect("a plugin");
        assert_eq!(
            (plugin.provider.as_str(), plugin.command.as_str()),
            ("eks", "/plugins/eks")
        );
        assert_eq!(plugin.exec_info["spec"]["cluster"]["server"], SERVER);
    }

    #[tokio::test]
    async fn a_profile_listing_none_of_the_files_providers_runs_no_plugin() {
        let profile = profile(providers_named(&["gke"]));
        let file = plugins(&["eks"]);
        let member =
            from_cluster_profile(&profile, None, InsecureMembers::Refused, Some(&file)).await;
        let refused = member.config.expect_err("unusable");
        assert_eq!(refused.reason, Unusable::NO_MATCHING_PROVIDER);
        assert!(
            refused.message.contains("[\"gke\"]") && refused.message.contains("[\"eks\"]"),
            "{refused}"
        );
        assert!(member.plugin.is_none());
        // The Secret tie of a profile stays as it was.
        let secret = token_secret("member-a", TOKEN);
        let member = from_cluster_profile(
            &profile,
            Some(&secret),
            InsecureMembers::Refused,
            Some(&file),
        )
        .await;
        assert_eq!(bearer(&member.config.expect("usable")), Some(TOKEN));
        assert!(member.plugin.is_none());
    }

    #[tokio::test]
    async fn a_change_of_the_plugin_changes_the_fingerprint() {
        let profile = profile(providers_named(&["eks"]));
        let fingerprint = async |file: &ProviderFile| {
            from_cluster_profile(&profile, None, InsecureMembers::Refused, Some(file))
                .await
                .fingerprint
        };
        let first = fingerprint(&plugins(&["eks"])).await;
        assert_eq!(first, fingerprint(&plugins(&["eks"])).await);
        // Another provider before it changes nothing; another plugin does.
        assert_eq!(first, fingerprint(&plugins(&["other", "eks"])).await);
        let other_plugin = json!({"providers": [{"name": "eks", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "/plugins/eks", "args": ["--region", "us"],
            "provideClusterInfo": true}}]});
        let other_plugin =
            ProviderFile::parse(other_plugin.to_string().as_bytes()).expect("a provider file");
        assert_ne!(first, fingerprint(&other_plugin).await);
        let mut moved = profile.clone();
        moved.data["status"]["accessProviders"][0]["cluster"]["extensions"] = json!([{"name": crate::cluster::provider_file::EXEC_EXTENSION,
                    "extension": {"clusterName": "b"}}]);
        let moved = from_cluster_profile(
            &moved,
            None,
            InsecureMembers::Refused,
            Some(&plugins(&["eks"])),
        )
        .await;
        assert_ne!(first, moved.fingerprint);
    }

    #[tokio::test]
    async fn a_profile_without_access_providers_is_unusable() {
        let secret = token_secret("member-a", TOKEN);
        for providers in [
            json!([]),
            json!([{"name": "google", "cluster": {}}]),
            json!([{"name": SECRET_READER}]),
        ] {
            let member = profile_member(&profile(providers), Some(&secret)).await;
            assert_eq!(
                member.config.expect_err("unusable").reason,
                Unusable::NO_ACCESS_PROVIDER
            );
        }
        let mut no_status = profile(json!([]));
        no_status.data = json!({"spec": {"clusterManager": {"name": "fleet"}}});
        let member = profile_member(&no_status, Some(&secret)).await;
        assert_eq!(
            member.config.expect_err("unusable").reason,
            Unusable::NO_ACCESS_PROVIDER
        );
    }

    #[tokio::test]
    async fn the_secret_reader_is_preferred() {
        let profile = profile(json!([
            {"name": "google", "cluster": {"server": "https://gateway.example/v1/member-a"}},
            {"name": SECRET_READER, "cluster": {
                "server": SERVER,
                "certificate-authority-data": base64(CA),
            }},
        ]));
        let member = profile_member(&profile, Some(&token_secret("member-a", TOKEN))).await;
        let config = member.config.expect("usable");
        assert_eq!(config.cluster_url.to_string(), format!("{SERVER}/"));

        // Without a secret reader, the first provider with a server.
        let first = self::profile(json!([
            {"name": "empty", "cluster": {}},
            {"name": "google", "cluster": {"server": "https://gateway.example/v1/member-a"}},
            {"name": "other", "cluster": {"server": SERVER}},
        ]));
        let member = profile_member(&first, Some(&token_secret("member-a", TOKEN))).await;
        assert_eq!(
            member.config.expect("usable").cluster_url.to_string(),
            "https://gateway.example/v1/member-a"
        );
    }

    #[tokio::test]
    async fn deprecated_credential_providers_are_read_after_access_providers() {
        let mut old = profile(json!([]));
        old.data["status"] = json!({"credentialProviders": providers()});
        let member = profile_member(&old, Some(&token_secret("member-a", TOKEN))).await;
        assert_eq!(
            member.config.expect("usable").cluster_url.to_string(),
            format!("{SERVER}/")
        );
    }

    #[tokio::test]
    async fn a_profile_is_refused_a_ca_file_a_proxy_or_a_bad_ca() {
        let secret = token_secret("member-a", TOKEN);
        for (cluster, reason) in [
            (
                json!({"server": SERVER, "certificate-authority": "/ca.crt"}),
                Unusable::FILE_REFERENCE_UNSUPPORTED,
            ),
            (
                json!({"server": SERVER, "proxy-url": "http://proxy.example:3128"}),
                Unusable::PROXY_UNSUPPORTED,
            ),
            (
                json!({"server": SERVER, "certificate-authority-data": base64("not a certificate")}),
                Unusable::ACCESS_PROVIDER_INVALID,
            ),
            (
                json!({"server": SERVER, "insecure-skip-tls-verify": "yes"}),
                Unusable::ACCESS_PROVIDER_INVALID,
            ),
        ] {
            let profile = profile(json!([{"name": SECRET_READER, "cluster": cluster}]));
            let member = profile_member(&profile, Some(&secret)).await;
            assert_eq!(
                member.config.expect_err("unusable").reason,
                reason,
                "{cluster}"
            );
        }
    }

    #[tokio::test]
    async fn a_profile_token_change_changes_the_fingerprint_and_a_label_change_does_not() {
        let secret = token_secret("member-a", TOKEN);
        let before = profile_member(&profile(providers()), Some(&secret)).await;
        let mut relabelled = profile(providers());
        relabelled.metadata.labels = Some(BTreeMap::from([("tier".to_owned(), "gold".to_owned())]));
        let after = profile_member(&relabelled, Some(&secret)).await;
        assert_eq!(before.fingerprint, after.fingerprint);
        let rotated = token_secret("member-a", "s3cr3t-token-rotated");
        let after = profile_member(&profile(providers()), Some(&rotated)).await;
        assert_ne!(before.fingerprint, after.fingerprint);
    }

    /// A Secret in the operator's namespace holding `token`, labelled
    /// `copyrator.flant.com/cluster-profile: <for_profile>`.
    const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";

    fn labelled_token_secret(name: &str, for_profile: &str, token: &str) -> Secret {
        let mut secret = token_secret(name, token);
        secret.metadata.labels = Some(BTreeMap::from([(
            crate::LABEL_CLUSTER_PROFILE.to_owned(),
            for_profile.to_owned(),
        )]));
        secret
    }

    /// The profile `member-a` reached through a secret reader whose
    /// `clusterName` names the Secret `named`, at `server`.
    fn profile_naming(named: &str, server: &str) -> DynamicObject {
        profile(json!([{"name": SECRET_READER, "cluster": {
            "server": server,
            "certificate-authority-data": base64(CA),
            "extensions": [{"name": EXEC_EXTENSION, "extension": {"clusterName": named}}],
        }}]))
    }

    #[tokio::test]
    async fn a_token_secret_is_tied_by_its_label() {
        let profile = profile(providers());
        let secrets = [
            labelled_token_secret("fleet-token-7", "member-a", TOKEN),
            token_secret("member-b", OTHER_TOKEN),
        ];
        let config = profile_member(&profile, &secrets)
            .await
            .config
            .expect("usable");
        assert_eq!(bearer(&config), Some(TOKEN));

        // A Secret named as the profile but labelled for another profile is
        // that other profile's: its writer said so.
        let elsewhere = [labelled_token_secret("member-a", "member-b", OTHER_TOKEN)];
        let refused = profile_member(&profile, &elsewhere)
            .await
            .config
            .expect_err("unusable");
        assert_eq!(refused.reason, Unusable::TOKEN_MISSING, "{refused}");
        assert_eq!(
            tied_token_secrets("member-b", &elsewhere)
                .iter()
                .map(|s| s.metadata.name.as_deref())
                .collect::<Vec<_>>(),
            [Some("member-a")]
        );
        // A ServiceAccount's token Secret is tied by the label as any other.
        let mut labelled = labelled_token_secret("sa-token-x", "member-a", TOKEN);
        labelled.type_ = Some(SERVICE_ACCOUNT_TOKEN.to_owned());
        let config = profile_member(&profile, [&labelled])
            .await
            .config
            .expect("usable");
        assert_eq!(bearer(&config), Some(TOKEN));
    }

    /// The attack: whoever may create a ClusterProfile names it as a Secret
    /// of the operator's namespace that holds a `token` but is no
    /// profile's (a bot's, a ServiceAccount's). Its name ties it to
    /// nothing: the profile has no token, and the message says how a
    /// Secret is tied.
    #[tokio::test]
    async fn an_unlabelled_secret_is_tied_to_no_profile_of_its_name() {
        let profile = profile(providers());
        let mut bots = token_secret("member-a", OTHER_TOKEN);
        bots.metadata.labels = None;
        let mut account_token = bots.clone();
        account_token.type_ = Some(SERVICE_ACCOUNT_TOKEN.to_owned());
        for secret in [bots, account_token] {
            assert!(tied_token_secrets("member-a", [&secret]).is_empty());
            let refused = profile_member(&profile, [&secret])
                .await
                .config
                .expect_err("no token of a Secret tied by its name alone");
            assert_eq!(refused.reason, Unusable::TOKEN_MISSING, "{refused}");
            assert!(
                refused
                    .message
                    .contains("must be labelled copyrator.flant.com/cluster-profile=member-a"),
                "{refused}"
            );
            assert!(!refused.message.contains("s3cr3t"), "{refused}");
        }
    }

    #[tokio::test]
    async fn two_tied_secrets_leave_the_profile_unusable() {
        let profile = profile(providers());
        for secrets in [
            vec![
                token_secret("member-a", TOKEN),
                labelled_token_secret("fleet-token-7", "member-a", OTHER_TOKEN),
            ],
            vec![
                labelled_token_secret("fleet-token-7", "member-a", TOKEN),
                labelled_token_secret("fleet-token-8", "member-a", OTHER_TOKEN),
            ],
        ] {
            let refused = profile_member(&profile, &secrets)
                .await
                .config
                .expect_err("unusable");
            assert_eq!(
                refused.reason,
                Unusable::TOKEN_SECRET_AMBIGUOUS,
                "{refused}"
            );
            for secret in &secrets {
                let name = secret.metadata.name.as_deref().unwrap_or_default();
                assert!(refused.message.contains(name), "{refused}");
            }
            assert!(!refused.message.contains("s3cr3t"), "{refused}");
        }
    }

    #[tokio::test]
    async fn the_cluster_name_extension_never_chooses_the_token_secret() {
        // The attack: a profile names another member's token Secret.
        let profile = profile_naming("member-b", SERVER);
        let theirs = [token_secret("member-b", OTHER_TOKEN)];
        let refused = profile_member(&profile, &theirs)
            .await
            .config
            .expect_err("another member's token is never used");
        assert_eq!(refused.reason, Unusable::TOKEN_MISSING, "{refused}");
        for said in [
            "\"member-a\"",
            "copyrator.flant.com/cluster-profile=member-a",
            "clusterName \"member-b\"",
            "is not read",
        ] {
            assert!(refused.message.contains(said), "{said}: {refused}");
        }

        // With a Secret tied to it, the profile gets that token, whatever
        // its extension names.
        let both = [
            token_secret("member-b", OTHER_TOKEN),
            token_secret("member-a", TOKEN),
        ];
        let config = profile_member(&profile, &both)
            .await
            .config
            .expect("usable");
        assert_eq!(bearer(&config), Some(TOKEN));
    }

    #[tokio::test]
    async fn an_http_server_is_refused_unless_allowed() {
        let http_server = "http://member-a.example:8080";
        let text = kubeconfig(&token_user(TOKEN)).replace(SERVER, http_server);
        let refused = refusal(&text).await;
        assert_eq!(refused.reason, Unusable::INSECURE_CONNECTION, "{refused}");
        assert!(refused.message.contains("http://"), "{refused}");
        assert!(refused.message.contains(ALLOW_INSECURE_FLAG), "{refused}");
        let secret = cluster_secret(&[(crate::LABEL_CLUSTER, "member-a")], Some(&text));
        let allowed = from_cluster_secret(&secret, InsecureMembers::Allowed, None)
            .await
            .expect("a member")
            .config
            .expect("usable where allowed");
        assert_eq!(allowed.cluster_url.to_string(), format!("{http_server}/"));

        // A profile is refused before any token is looked up: here it names
        // another member's Secret and has none of its own.
        let profile = profile_naming("member-b", http_server);
        let theirs = [token_secret("member-b", OTHER_TOKEN)];
        let refused = profile_member(&profile, &theirs)
            .await
            .config
            .expect_err("unusable");
        assert_eq!(refused.reason, Unusable::INSECURE_CONNECTION, "{refused}");
        let own = [token_secret("member-a", TOKEN)];
        let allowed = from_cluster_profile(&profile, &own, InsecureMembers::Allowed, None)
            .await
            .config
            .expect("usable where allowed");
        assert_eq!(allowed.cluster_url.to_string(), format!("{http_server}/"));
        assert_eq!(bearer(&allowed), Some(TOKEN));
    }

    #[tokio::test]
    async fn insecure_skip_tls_verify_is_refused_unless_allowed() {
        let text = kubeconfig(&token_user(TOKEN)).replace(
            "    server:",
            "    insecure-skip-tls-verify: true\n    server:",
        );
        let refused = refusal(&text).await;
        assert_eq!(refused.reason, Unusable::INSECURE_CONNECTION, "{refused}");
        assert!(
            refused.message.contains("insecure-skip-tls-verify"),
            "{refused}"
        );
        let secret = cluster_secret(&[(crate::LABEL_CLUSTER, "member-a")], Some(&text));
        let allowed = from_cluster_secret(&secret, InsecureMembers::Allowed, None)
            .await
            .expect("a member")
            .config
            .expect("usable where allowed");
        assert!(allowed.accept_invalid_certs);

        let profile = profile(json!([{"name": SECRET_READER, "cluster": {
            "server": SERVER,
            "insecure-skip-tls-verify": true,
        }}]));
        let own = [token_secret("member-a", TOKEN)];
        let refused = profile_member(&profile, &own)
            .await
            .config
            .expect_err("unusable");
        assert_eq!(refused.reason, Unusable::INSECURE_CONNECTION, "{refused}");
        let allowed = from_cluster_profile(&profile, &own, InsecureMembers::Allowed, None)
            .await
            .config
            .expect("usable where allowed");
        assert!(allowed.accept_invalid_certs);

        // `false` is the default, and changes nothing.
        let verified = kubeconfig(&token_user(TOKEN)).replace(
            "    server:",
            "    insecure-skip-tls-verify: false\n    server:",
        );
        assert!(
            !member(&verified)
                .await
                .config
                .expect("usable")
                .accept_invalid_certs
        );
    }

    #[test]
    fn the_cluster_profile_crd_serves_what_is_read() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let text = include_str!("../../crd/clusterprofile.multicluster.x-k8s.io.yaml");
        let crd: CustomResourceDefinition = serde_yaml::from_str(text).expect("a CRD");
        let resource = cluster_profile_resource();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("clusterprofiles.multicluster.x-k8s.io")
        );
        assert_eq!(crd.spec.group, resource.group);
        assert_eq!(crd.spec.names.kind, resource.kind);
        assert_eq!(crd.spec.names.plural, resource.plural);
        assert_eq!(crd.spec.scope, "Namespaced");
        let [version] = crd.spec.versions.as_slice() else {
            panic!("one version");
        };
        assert_eq!(version.name, resource.version);
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let schema = serde_json::to_value(&version.schema).expect("a schema");
        let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
        for providers in ["accessProviders", "credentialProviders"] {
            let cluster = &status[providers]["items"]["properties"]["cluster"];
            assert_eq!(
                cluster["properties"]["server"]["type"], "string",
                "{providers}"
            );
        }
    }
}
