//! Member clusters for the multi-cluster tests: control planes beside the
//! home one (`COPYRATOR_MEMBER=1 hack/cluster up`: etcd, kube-apiserver and
//! kube-controller-manager, no scheduler, no node), into which a rule of the
//! home cluster copies too.
//!
//! * [`members`]: the members `hack/test` started, from `COPYRATOR_MEMBERS`
//!   (`name=kubeconfig,...`) and `COPYRATOR_MEMBER_STATES` (`name=state
//!   directory,...`), each with a client.
//! * [`Member::register`] / [`Member::unregister`]: the Secret in the home
//!   cluster that names a member, in Cluster API's kubeconfig Secret layout
//!   (the kubeconfig under the data key `value`).
//! * [`Member::ns`]: a namespace of the test in a member, deleted with the
//!   test's own ([`TestNs`]).
//! * [`Member::stop_api_server`] / [`Member::start_api_server`]: an outage
//!   of a member (`hack/cluster stop|start kube-apiserver` on its state).
//!   The members are shared by every test of a test binary, and those run in
//!   parallel: a test that stops one holds [`OUTAGE`] for writing, a test
//!   that needs them up holds it for reading.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tokio::sync::RwLock;

use super::{
    Kind, Obj, TIMEOUT, TestNs, b64, create_namespace, create_obj, data_patch, err_msg,
    is_not_found, map, patch_obj, plain_body, try_get_obj, wait_until,
};

/// The members' kubeconfigs: `name=path,...`.
pub const MEMBERS_ENV: &str = "COPYRATOR_MEMBERS";
/// The members' `hack/cluster` state directories: `name=path,...`.
pub const MEMBER_STATES_ENV: &str = "COPYRATOR_MEMBER_STATES";
/// The members' audit logs, where they keep one (the fault suite's
/// members): `name=path,...`.
pub const MEMBER_AUDIT_LOGS_ENV: &str = "COPYRATOR_MEMBER_AUDIT_LOGS";
/// The label that names the member on its kubeconfig Secret.
pub const LABEL_CLUSTER: &str = "copyrator.flant.com/cluster";
/// The data key of the kubeconfig in that Secret (Cluster API's).
pub const KUBECONFIG_KEY: &str = "value";
/// How long a probe of an API server may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Held for writing by a test that stops a member's API server, for
/// reading by a test that needs the members up (see the module's note).
pub static OUTAGE: RwLock<()> = RwLock::const_new(());

/// A member control plane.
#[derive(Clone)]
pub struct Member {
    /// Its name in `COPYRATOR_MEMBERS` (`a`, `b`).
    pub name: String,
    /// Its admin kubeconfig (`<state>/admin.kubeconfig`).
    pub kubeconfig_path: PathBuf,
    /// Its `hack/cluster` state directory.
    pub state: PathBuf,
    /// An admin client of it.
    pub client: Client,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("name", &self.name)
            .field("kubeconfig_path", &self.kubeconfig_path)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

fn how_to_start() -> String {
    format!(
        "run the tests with `make test` (hack/test starts two members), or start members \
         yourself, each with a state directory of its own: `COPYRATOR_MEMBER=1 \
         COPYRATOR_CLUSTER_STATE=/tmp/member-a hack/cluster up` (and /tmp/member-b), then \
         `export {MEMBERS_ENV}=a=/tmp/member-a/admin.kubeconfig,b=/tmp/member-b/admin.kubeconfig \
         {MEMBER_STATES_ENV}=a=/tmp/member-a,b=/tmp/member-b`"
    )
}

/// `name=path,...` from the variable `var`, in order.
fn parse_list(var: &str) -> Vec<(String, PathBuf)> {
    let value = match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "{var} is not set: these tests need member control planes; {}",
            how_to_start()
        ),
    };
    value
        .split(',')
        .filter(|entry| !entry.trim().is_empty())
        .map(|entry| {
            let (name, path) = entry.split_once('=').unwrap_or_else(|| {
                panic!(
                    "{var}={value:?}: {entry:?} is not name=path; {}",
                    how_to_start()
                )
            });
            let name = name.trim();
            assert!(
                !name.is_empty()
                    && name.len() <= 50
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !name.starts_with('-')
                    && !name.ends_with('-'),
                "{var}={value:?}: the member name {name:?} is not a DNS label \
                 (it names the Secret cluster-<name>)"
            );
            (name.to_string(), PathBuf::from(path.trim()))
        })
        .collect()
}

/// The members of `COPYRATOR_MEMBERS` and `COPYRATOR_MEMBER_STATES`, in
/// the order listed, each with an admin client (built from
/// [`Member::kubeconfig_yaml`], as the operator builds one from the
/// Secret). Panics, saying how to start them, when either is unset.
pub async fn members() -> Vec<Member> {
    let kubeconfigs = parse_list(MEMBERS_ENV);
    let states: BTreeMap<String, PathBuf> = parse_list(MEMBER_STATES_ENV).into_iter().collect();
    assert!(
        !kubeconfigs.is_empty(),
        "{MEMBERS_ENV} names no member; {}",
        how_to_start()
    );
    let names: Vec<&String> = kubeconfigs.iter().map(|(n, _)| n).collect();
    assert!(
        names.len() == states.len() && names.iter().all(|n| states.contains_key(*n)),
        "{MEMBERS_ENV} names {names:?}, {MEMBER_STATES_ENV} names {:?}: they must name the same \
         members",
        states.keys().collect::<Vec<_>>()
    );
    let mut members = Vec::new();
    for (name, kubeconfig_path) in kubeconfigs {
        assert!(
            !members.iter().any(|m: &Member| m.name == name),
            "{MEMBERS_ENV} names the member {name} twice"
        );
        let state = states[&name].clone();
        assert!(
            kubeconfig_path.is_file(),
            "member {name}: no kubeconfig at {} ({MEMBERS_ENV}); {}",
            kubeconfig_path.display(),
            how_to_start()
        );
        assert!(
            state.join("member").is_file(),
            "member {name}: {} ({MEMBER_STATES_ENV}) holds no member control plane; {}",
            state.display(),
            how_to_start()
        );
        let yaml = self_contained_kubeconfig(&kubeconfig_path);
        let client = client_of_yaml(&yaml)
            .await
            .unwrap_or_else(|e| panic!("member {name}: {e}"));
        members.push(Member {
            name,
            kubeconfig_path,
            state,
            client,
        });
    }
    members
}

/// The member of that name, or a panic listing those there are.
pub async fn member(name: &str) -> Member {
    let all = members().await;
    let names: Vec<String> = all.iter().map(|m| m.name.clone()).collect();
    all.into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no member {name} in {MEMBERS_ENV}; there are {names:?}"))
}

/// The kubeconfig at `path` with the certificates and keys it names by
/// path put inline (`*-data`), the server address as it is.
fn self_contained_kubeconfig(path: &Path) -> String {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    let base = path.parent().unwrap_or(Path::new("."));
    let inline = |entry: &mut serde_yaml::Value, key: &str| {
        let Some(file) = entry.get(key).and_then(serde_yaml::Value::as_str) else {
            return;
        };
        let file = base.join(file);
        let bytes = std::fs::read(&file).unwrap_or_else(|e| {
            panic!(
                "reading {} (named by {}): {e}",
                file.display(),
                path.display()
            )
        });
        let map = entry.as_mapping_mut().unwrap();
        map.remove(key);
        map.insert(format!("{key}-data").into(), b64(&bytes).into());
    };
    for cluster in config["clusters"].as_sequence_mut().into_iter().flatten() {
        inline(&mut cluster["cluster"], "certificate-authority");
    }
    for user in config["users"].as_sequence_mut().into_iter().flatten() {
        inline(&mut user["user"], "client-certificate");
        inline(&mut user["user"], "client-key");
    }
    serde_yaml::to_string(&config).unwrap()
}

/// A client as a kubeconfig (YAML text) says.
pub async fn client_of_yaml(yaml: &str) -> Result<Client, String> {
    let file = Kubeconfig::from_yaml(yaml).map_err(|e| format!("a kubeconfig: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("the kubeconfig: {e}"))?;
    Client::try_from(config).map_err(|e| format!("a client: {e}"))
}

/// A client as the kubeconfig file at `path` says.
pub async fn client_of_file(path: &Path) -> Result<Client, String> {
    let yaml = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    client_of_yaml(&yaml).await
}

/// Whether the API server of `client` answers (`/version`), within
/// [`PROBE_TIMEOUT`]; what went wrong if not.
pub async fn answers(client: &Client) -> Result<(), String> {
    match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(err_msg(&e)),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

impl Member {
    /// Its kubeconfig, self-contained: the certificates and the key that
    /// the file names by path (in its state directory) put inline, as in a
    /// Cluster API kubeconfig Secret, so that a reader needs no file of this
    /// machine; the server address as it is (`https://127.0.0.1:<port>`).
    pub fn kubeconfig_yaml(&self) -> String {
        self_contained_kubeconfig(&self.kubeconfig_path)
    }

    /// Its API server's address and the CA that signs its certificate
    /// (PEM, base64-encoded as a kubeconfig's `certificate-authority-data`),
    /// from the current context of its admin kubeconfig.
    pub fn server_and_ca(&self) -> (String, String) {
        let config = Kubeconfig::from_yaml(&self.kubeconfig_yaml())
            .unwrap_or_else(|e| panic!("member {}: its kubeconfig: {e}", self.name));
        let context = config
            .current_context
            .as_ref()
            .and_then(|current| config.contexts.iter().find(|c| &c.name == current))
            .and_then(|c| c.context.as_ref())
            .unwrap_or_else(|| panic!("member {}: no current context", self.name));
        let cluster = config
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
            .unwrap_or_else(|| panic!("member {}: no cluster {}", self.name, context.cluster));
        let server = cluster.server.clone().expect("a server");
        let ca = cluster
            .certificate_authority_data
            .clone()
            .expect("certificate-authority-data");
        (server, ca)
    }

    /// A self-contained kubeconfig for its API server (address and CA as in
    /// its admin kubeconfig) with `token` as the credentials: what a
    /// kubeconfig Secret of the inventory holds for a ServiceAccount of the
    /// member.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let (server, _) = self.server_and_ca();
        self.kubeconfig_with(&server, token)
    }

    /// As [`Member::kubeconfig_with_token`], through `server` (a proxy in
    /// front of its API server: TLS still names the API server).
    pub fn kubeconfig_with(&self, server: &str, token: &str) -> String {
        let (_, ca) = self.server_and_ca();
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {
                "server": server,
                "certificate-authority-data": ca,
            }}],
            "users": [{"name": "copyrator", "user": {"token": token}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": "copyrator"}}],
            "current-context": self.name,
        });
        serde_yaml::to_string(&config).expect("a kubeconfig as YAML")
    }

    /// A token of the ServiceAccount `namespace/account` of the member,
    /// valid for an hour (TokenRequest).
    pub async fn token(&self, namespace: &str, account: &str) -> String {
        let request: TokenRequest =
            serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
                .unwrap();
        Api::<ServiceAccount>::namespaced(self.client.clone(), namespace)
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "a token of {namespace}/{account} in member {}: {}",
                    self.name,
                    err_msg(&e)
                )
            })
            .status
            .and_then(|status| status.token)
            .expect("a TokenRequest answered with a token")
    }

    /// The ServiceAccount `namespace/account` of the member bound to
    /// `cluster-admin` by the ClusterRoleBinding `binding` (the member side's
    /// least privilege is proved in tests/suite/member_side.rs; here the identity
    /// names the operator's requests in the member's audit log); returns
    /// its audit user name. Binding it again (after the account was
    /// deleted and made anew) is fine.
    pub async fn operator_account(&self, namespace: &str, account: &str, binding: &str) -> String {
        super::create_service_account(&self.client, namespace, account).await;
        let crb: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }))
        .expect("a ClusterRoleBinding");
        match Api::<ClusterRoleBinding>::all(self.client.clone())
            .create(&PostParams::default(), &crb)
            .await
        {
            Ok(_) => {}
            Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 409) => {}
            Err(e) => panic!(
                "creating ClusterRoleBinding {binding} in member {}: {}",
                self.name,
                err_msg(&e)
            ),
        }
        super::audit::service_account_user(namespace, account)
    }

    /// Its audit log, from `COPYRATOR_MEMBER_AUDIT_LOGS`; panics, saying
    /// how to get one, where it keeps none.
    pub fn audit_log(&self) -> PathBuf {
        let logs: BTreeMap<String, PathBuf> =
            parse_list(MEMBER_AUDIT_LOGS_ENV).into_iter().collect();
        logs.get(&self.name).cloned().unwrap_or_else(|| {
            panic!(
                "{MEMBER_AUDIT_LOGS_ENV} names no audit log for member {}: start the member with \
                 COPYRATOR_AUDIT_LOG=<path> (hack/test does so for the fault suite's members)",
                self.name
            )
        })
    }

    /// A ConfigMap or Secret of the member, if it exists.
    pub async fn try_get(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Obj>, String> {
        try_get_obj(&self.client, kind, ns, name)
            .await
            .map_err(|e| format!("member {}: {e}", self.name))
    }

    /// Creates, in the member, an object with exactly `labels` and `data`.
    pub async fn create_plain(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        data: &[(&str, &str)],
    ) -> Obj {
        create_obj(&self.client, kind, ns, name, plain_body(kind, labels, data)).await
    }

    /// Sets (`Some`) or removes (`None`) data keys of an object of the member.
    pub async fn set_data(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        changes: &[(&str, Option<&str>)],
    ) -> Obj {
        patch_obj(&self.client, kind, ns, name, data_patch(kind, changes)).await
    }

    /// The name of its kubeconfig Secret in the home cluster.
    pub fn secret_name(&self) -> String {
        format!("cluster-{}", self.name)
    }

    /// Creates, or replaces (labels and data), the Secret `cluster-<name>`
    /// in `namespace` of the home cluster: labelled
    /// `copyrator.flant.com/cluster: <name>` and `labels`, the kubeconfig
    /// ([`Member::kubeconfig_yaml`]) under the data key `value`.
    pub async fn register(
        &self,
        home: &Client,
        namespace: &str,
        labels: &[(&str, &str)],
    ) -> Secret {
        self.register_kubeconfig(home, namespace, labels, &self.kubeconfig_yaml())
            .await
    }

    /// As [`Member::register`], with the kubeconfig `kubeconfig` (YAML
    /// text), e.g. [`Member::kubeconfig_with_token`]: the operator then
    /// works in the member as whoever that kubeconfig names.
    pub async fn register_kubeconfig(
        &self,
        home: &Client,
        namespace: &str,
        labels: &[(&str, &str)],
        kubeconfig: &str,
    ) -> Secret {
        let name = self.secret_name();
        let mut all_labels = map(labels);
        all_labels.insert(LABEL_CLUSTER.into(), self.name.clone());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.into()),
                labels: Some(all_labels),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                KUBECONFIG_KEY.to_string(),
                ByteString(kubeconfig.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        };
        let api: Api<Secret> = Api::namespaced(home.clone(), namespace);
        let pp = PostParams::default();
        wait_until(
            format!("the Secret {namespace}/{name} of member {}", self.name),
            TIMEOUT,
            async || match api.create(&pp, &secret).await {
                Ok(created) => Ok(created),
                Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 409) => {
                    let current = api.get(&name).await.map_err(|e| err_msg(&e))?;
                    let mut replacement = secret.clone();
                    replacement.metadata.resource_version = current.metadata.resource_version;
                    // A conflict (someone wrote it meanwhile) is tried again.
                    api.replace(&name, &pp, &replacement)
                        .await
                        .map_err(|e| err_msg(&e))
                }
                Err(e) => Err(err_msg(&e)),
            },
        )
        .await
    }

    /// Deletes its Secret from `namespace` of the home cluster (gone
    /// already is fine).
    pub async fn unregister(&self, home: &Client, namespace: &str) {
        let name = self.secret_name();
        let api: Api<Secret> = Api::namespaced(home.clone(), namespace);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => panic!(
                "deleting the Secret {namespace}/{name} of member {}: {}",
                self.name,
                err_msg(&e)
            ),
        }
    }

    /// Creates the namespace `t.name(suffix)` (the test's naming, the same
    /// name as the home namespace of that suffix) in this member; it is
    /// deleted when `t` drops, as the test's home namespaces are.
    pub async fn ns(&self, t: &TestNs, suffix: &str) -> String {
        self.ns_labelled(t, suffix, &[]).await
    }

    pub async fn ns_labelled(&self, t: &TestNs, suffix: &str, labels: &[(&str, &str)]) -> String {
        let name = t.name(suffix);
        t.cleanup_member_namespace_later(self.kubeconfig_path.clone(), &name);
        create_namespace(&self.client, &name, labels)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name} in member {}: {e}", self.name));
        name
    }

    /// Whether its API server answers (see [`answers`]).
    pub async fn answers(&self) -> Result<(), String> {
        answers(&self.client)
            .await
            .map_err(|e| format!("member {}: {e}", self.name))
    }

    /// Runs `kubectl <args>` as its admin; its standard output, trimmed.
    /// Fails the test, with kubectl's standard error, when kubectl fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig_path)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"));
        assert!(
            out.status.success(),
            "kubectl {args:?} on member {} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs `hack/cluster <args>` on its state directory; its standard
    /// output. Fails the test, with the script's standard error, when the
    /// script fails.
    pub fn cluster(&self, args: &[&str]) -> String {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/cluster");
        let out = Command::new(script)
            .args(args)
            .env("COPYRATOR_CLUSTER_STATE", &self.state)
            .env("COPYRATOR_MEMBER", "1")
            .output()
            .unwrap_or_else(|e| panic!("running {script} {args:?}: {e}"));
        assert!(
            out.status.success(),
            "hack/cluster {args:?} on member {} ({}) failed ({}):\n{}",
            self.name,
            self.state.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// SIGKILLs its API server; returns once the process is gone. Hold
    /// [`OUTAGE`] for writing, and see [`Member::start_api_server_on_drop`].
    pub fn stop_api_server(&self) {
        self.cluster(&["stop", "kube-apiserver"]);
    }

    /// Starts its API server again as `up` did (same port, flags and etcd);
    /// returns once `/readyz` answers 200.
    pub fn start_api_server(&self) {
        self.cluster(&["start", "kube-apiserver"]);
    }

    /// A guard that starts its API server again if the test panics while
    /// it is stopped, so that the next test finds the member up.
    pub fn start_api_server_on_drop(&self) -> StartOnDrop {
        StartOnDrop(self.clone())
    }
}

/// See [`Member::start_api_server_on_drop`].
pub struct StartOnDrop(Member);

impl Drop for StartOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A no-op when it runs.
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/cluster");
            let _ = Command::new(script)
                .args(["start", "kube-apiserver"])
                .env("COPYRATOR_CLUSTER_STATE", &self.0.state)
                .env("COPYRATOR_MEMBER", "1")
                .status();
        }
    }
}
