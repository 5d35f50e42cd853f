//! The fault suite's own control plane (tests/suite/faults.rs): it kills the API
//! server and etcd, so it never runs against the shared one.
//!
//! * [`FaultPlane`]: the control plane named by `COPYRATOR_FAULT_STATE` (a
//!   `hack/cluster` state directory) and its audit log
//!   (`COPYRATOR_FAULT_AUDIT_LOG`); `stop`, `start` and `compact` run
//!   `hack/cluster` on it.
//! * [`Requests`]: that audit log read from a point on (the shared reader,
//!   `audit::Audit`, follows `COPYRATOR_AUDIT_LOG`, the main control plane's).
//! * [`OperatorIdentity`]: a ServiceAccount for the operator, so that the
//!   audit log names its requests.
//! * [`kubeconfig_with_server`]: a kubeconfig pointed at a proxy.
//!
//! The rest of the harness (`TestNs`, `service_account_kubeconfig`, kubectl)
//! reads `KUBECONFIG`; [`FaultPlane::from_env`] insists that it names the
//! fault control plane's admin kubeconfig, so that a test observes the
//! control plane it breaks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// One fault test at a time, of both fault suites (`faults` and
/// `member_faults`), also when `--test-threads` is not 1: each stops what
/// the others need.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

use super::audit::{Audit, AuditEvent, Query, service_account_user};
use super::{TestNs, create_service_account, err_msg, service_account_kubeconfig};

/// The state directory of the fault control plane (`hack/cluster` with
/// `COPYRATOR_CLUSTER_STATE` set to it).
pub const STATE_ENV: &str = "COPYRATOR_FAULT_STATE";
/// The audit log that control plane writes.
pub const AUDIT_ENV: &str = "COPYRATOR_FAULT_AUDIT_LOG";

/// A component of the control plane that `hack/cluster stop|start` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Etcd,
    KubeApiserver,
}

impl Component {
    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
        }
    }
}

/// The fault suite's control plane.
#[derive(Clone, Debug)]
pub struct FaultPlane {
    pub state: PathBuf,
    pub kubeconfig: PathBuf,
    pub audit_log: PathBuf,
    /// Components this handle stopped and has not started again.
    stopped: Arc<Mutex<Vec<Component>>>,
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

impl FaultPlane {
    /// The control plane of `COPYRATOR_FAULT_STATE`; `None` when that is
    /// unset (the fault tests are `#[ignore]`d in the main run, and
    /// `hack/test` runs them on a control plane of their own). Panics when
    /// it is set but the rest is missing or names another control plane.
    pub fn from_env() -> Option<FaultPlane> {
        let state = match std::env::var_os(STATE_ENV) {
            Some(s) if !s.is_empty() => PathBuf::from(s),
            _ => return None,
        };
        let how = format!(
            "start it with `COPYRATOR_CLUSTER_STATE={s} COPYRATOR_AUDIT_LOG=/tmp/faults-audit.log \
             hack/cluster up` and run `{STATE_ENV}={s} {AUDIT_ENV}=/tmp/faults-audit.log \
             KUBECONFIG={s}/admin.kubeconfig cargo test --test suite -- --ignored --test-threads=1 \
             faults:: --skip member_faults`",
            s = state.display()
        );
        let audit_log = match std::env::var_os(AUDIT_ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => panic!(
                "{AUDIT_ENV} is not set: the fault tests count the operator's requests in the \
                 audit log of the fault control plane ({STATE_ENV}={}); {how}",
                state.display()
            ),
        };
        let kubeconfig = state.join("admin.kubeconfig");
        assert!(
            kubeconfig.is_file(),
            "{STATE_ENV}={}: no control plane there (no admin.kubeconfig); {how}",
            state.display()
        );
        let recorded = std::fs::read_to_string(state.join("audit.path")).unwrap_or_else(|e| {
            panic!(
                "{STATE_ENV}={}: cannot read audit.path ({e}); the control plane predates the \
                 fault controls of hack/cluster: `hack/cluster down`, then {how}",
                state.display()
            )
        });
        assert!(
            !recorded.trim().is_empty() && same_file(Path::new(recorded.trim()), &audit_log),
            "{AUDIT_ENV}={} is not the audit log of the control plane in {} (it writes {:?}); {how}",
            audit_log.display(),
            state.display(),
            recorded.trim()
        );
        let env_kubeconfig = std::env::var_os("KUBECONFIG").map(PathBuf::from);
        assert!(
            env_kubeconfig
                .as_deref()
                .is_some_and(|k| same_file(k, &kubeconfig)),
            "KUBECONFIG={:?} is not {}: the test harness's client, cleanup and kubectl read \
             KUBECONFIG, and they must see the control plane this suite breaks; {how}",
            env_kubeconfig,
            kubeconfig.display()
        );
        Some(FaultPlane {
            state,
            kubeconfig,
            audit_log,
            stopped: Arc::default(),
        })
    }

    /// Runs `hack/cluster <args>` on this control plane; its standard
    /// output. Panics when it fails.
    pub fn cluster(&self, args: &[&str]) -> String {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/cluster");
        let out = Command::new(script)
            .args(args)
            .env("COPYRATOR_CLUSTER_STATE", &self.state)
            .output()
            .unwrap_or_else(|e| panic!("running {script} {args:?}: {e}"));
        assert!(
            out.status.success(),
            "hack/cluster {args:?} on {} failed ({}):\n{}",
            self.state.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// SIGKILL; returns once the process is gone.
    pub fn stop(&self, c: Component) {
        self.stopped.lock().unwrap().push(c);
        self.cluster(&["stop", c.name()]);
    }

    /// Starts it as `hack/cluster up` did; returns once it is ready (etcd
    /// healthy, the API server's `/readyz` 200).
    pub fn start(&self, c: Component) {
        self.cluster(&["start", c.name()]);
        self.stopped.lock().unwrap().retain(|s| *s != c);
    }

    /// Compacts etcd to its current revision; that revision.
    pub fn compact(&self) -> u64 {
        let out = self.cluster(&["compact"]);
        out.trim()
            .parse()
            .unwrap_or_else(|e| panic!("hack/cluster compact printed {out:?}, not a revision: {e}"))
    }

    /// Starts etcd and the API server again when a test stopped them and
    /// then failed, so that the next test finds a working control plane.
    pub fn restart_on_drop(&self) -> RestartOnDrop {
        RestartOnDrop(self.clone())
    }
}

/// See [`FaultPlane::restart_on_drop`].
pub struct RestartOnDrop(FaultPlane);

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        let stopped = std::mem::take(&mut *self.0.stopped.lock().unwrap());
        // etcd first: the API server is ready only with it.
        for c in [Component::Etcd, Component::KubeApiserver] {
            if stopped.contains(&c) {
                eprintln!("starting {} again after a failed fault test", c.name());
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/cluster");
                let _ = Command::new(script)
                    .args(["start", c.name()])
                    .env("COPYRATOR_CLUSTER_STATE", &self.0.state)
                    .status();
            }
        }
    }
}

// ---------------------------------------------------------------------------
// the audit log

/// The fault control plane's audit log (or another, [`Requests::at`])
/// from the moment [`Requests::start`] was called, read by [`Audit`]: a
/// request is counted once, by its `auditID`, as its final stage.
pub struct Requests(Audit);

impl Requests {
    pub fn start(plane: &FaultPlane) -> Requests {
        Requests::at(plane.audit_log.clone())
    }

    /// The audit log at `path` from now on (a member's, for instance).
    pub fn at(path: PathBuf) -> Requests {
        Requests(Audit::at(path))
    }

    pub fn matching(&self, q: &Query) -> Vec<AuditEvent> {
        self.0.matching(q)
    }

    pub fn count(&self, q: &Query) -> usize {
        self.0.count(q)
    }

    /// Matching requests by `verb resource` (e.g. `list configmaps`).
    pub fn by_verb_resource(&self, q: &Query) -> BTreeMap<String, usize> {
        self.0.by_verb_resource(q)
    }

    /// Matching requests by response code (`0`: none recorded).
    pub fn by_code(&self, q: &Query) -> BTreeMap<u16, usize> {
        self.0.by_code(q)
    }

    /// The most requests received in one second.
    pub fn busiest_second(&self, q: &Query) -> usize {
        self.0.busiest_second(q).map_or(0, |(_, n)| n)
    }

    /// See [`Audit::settle`].
    pub async fn settle(&self, client: &Client, until: DateTime<Utc>) {
        self.0.settle(client, until).await;
    }
}

// ---------------------------------------------------------------------------
// the operator's identity

/// A ServiceAccount for the operator, bound to `cluster-admin` (RBAC is
/// proved elsewhere: chart.rs; here the identity only names the operator's
/// requests in the audit log), and a kubeconfig for it. The binding is
/// deleted on drop.
pub struct OperatorIdentity {
    /// Its audit user name.
    pub user: String,
    pub kubeconfig: PathBuf,
    binding: String,
}

impl OperatorIdentity {
    pub async fn new(t: &TestNs, namespace: &str, account: &str) -> OperatorIdentity {
        create_service_account(&t.client, namespace, account).await;
        let binding = format!("{}-{account}", t.prefix);
        let crb: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }))
        .unwrap();
        Api::<ClusterRoleBinding>::all(t.client.clone())
            .create(&PostParams::default(), &crb)
            .await
            .unwrap_or_else(|e| panic!("creating ClusterRoleBinding {binding}: {}", err_msg(&e)));
        let kubeconfig =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{binding}.kubeconfig"));
        service_account_kubeconfig(namespace, account, &kubeconfig);
        OperatorIdentity {
            user: service_account_user(namespace, account),
            kubeconfig,
            binding,
        }
    }

    pub fn kubeconfig_str(&self) -> &str {
        self.kubeconfig.to_str().expect("a UTF-8 path")
    }
}

impl Drop for OperatorIdentity {
    fn drop(&mut self) {
        let binding = std::mem::take(&mut self.binding);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(client) = Client::try_default().await {
                    let _ = Api::<ClusterRoleBinding>::all(client)
                        .delete(&binding, &DeleteParams::default())
                        .await;
                }
            });
        })
        .join();
    }
}

/// A copy of the kubeconfig at `path` with every cluster's server set to
/// `server` (TLS still names the API server: the proxy passes it through).
pub fn kubeconfig_with_server(path: &Path, server: &str) -> PathBuf {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("a YAML kubeconfig");
    for cluster in config["clusters"]
        .as_sequence_mut()
        .expect("the kubeconfig lists clusters")
    {
        cluster["cluster"]["server"] = serde_yaml::Value::String(server.to_string());
    }
    let out = path.with_extension(format!("via-{}.kubeconfig", super::random5()));
    std::fs::write(&out, serde_yaml::to_string(&config).unwrap()).unwrap();
    out
}

/// Seconds with one decimal, for the printed figures.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
