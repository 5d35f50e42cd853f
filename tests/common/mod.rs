//! Harness for Copyrator's integration tests against a real control plane
//! (`eval "$(hack/cluster up)"` sets KUBECONFIG).
//!
//! * [`TestNs`]: per-test context: client, CRD installed, uniquely named
//!   namespaces that are deleted when it drops (also on panic).
//! * [`Operator`]: the `copyrator` binary as a child process with its output
//!   in a file; killed on drop, its log printed when the test failed.
//! * [`wait_until`] and friends: polling with clear timeout messages.
//! * [`service_account_kubeconfig`]: run the operator as a ServiceAccount.
//! * [`audit`]: the API server's audit log, to count requests by user.
//! * [`dynamic`]: objects of any kind (`DynamicObject`), for rules with
//!   `spec.objectType`, and the check of their copies.
//! * [`logs`]: the operator's log as structured lines (level, message,
//!   fields); [`operator_kubeconfig`] gives the operator an identity of its
//!   own (impersonation) and optionally another API server address.
//! * [`rule_versions`]: every version of a rule as a watch delivers them,
//!   for what a status must never say, or what it said first.
//! * [`helm`]: the chart rendered into objects, and releases installed
//!   with the pinned helm, at home or in a member.
//! * [`steps`]: a job of the operator as steps, each within a budget.
//! * [`members`]: the member clusters of the multi-cluster tests
//!   (`COPYRATOR_MEMBERS`), their kubeconfig Secrets in the home cluster,
//!   namespaces of a test in them, and their API servers stopped and
//!   started.
//!
//! Tests run in parallel against one cluster, so every test names its own
//! namespaces, selects its sources by a label value unique to the test and
//! restricts its rules' targets with `spec.targets.include`.

pub mod apf;
pub mod audit;
pub mod cluster_objects;
pub mod dynamic;
pub mod fault;
pub mod helm;
pub mod logs;
pub mod members;
pub mod prometheus;
pub mod proxy;
pub mod rbac;
pub mod rule_versions;
pub mod sockets;
pub mod steps;
pub mod tenant;

use std::collections::BTreeMap;
use std::fmt::Display;
use std::fs::File;
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
pub mod faults;

/// Default time to wait for the operator to act.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// How long "nothing happens" is watched, after a positive signal that the
/// operator has processed the change.
pub const QUIET: Duration = Duration::from_secs(3);
/// Poll period of every wait.
pub const POLL: Duration = Duration::from_millis(150);

pub const CRD_NAME: &str = "copyrators.flant.com";
pub const FINALIZER: &str = "copyrator.flant.com/cleanup";
pub const FIELD_MANAGER: &str = "copyrator";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_RULE_UID: &str = "copyrator.flant.com/rule-uid";
pub const ANNOTATION_RULE: &str = "copyrator.flant.com/rule";
pub const ANNOTATION_SOURCE: &str = "copyrator.flant.com/source";
pub const ANNOTATION_SOURCE_UID: &str = "copyrator.flant.com/source-uid";
/// On a copy handed over to its namespace (`CreateOnly`), never written again.
pub const LABEL_SYNC_POLICY: &str = "copyrator.flant.com/sync-policy";
/// On an adopted copy: what made it.
pub const ANNOTATION_ADOPTED_FROM: &str = "copyrator.flant.com/adopted-from";
/// Label every test source carries; its value is the test's unique prefix.
pub const TEST_LABEL: &str = "copyrator-test";

/// On the mark key Secret: the proof that its key's holder wrote it after
/// the Secret got its uid.
pub const MARK_KEY_PROOF: &str = "copyrator.flant.com/mark-key-proof";

/// The proof of a mark key Secret, as docs/trust.md tells an administrator
/// to make it: HMAC-SHA-256 of `copyrator-mark-key:<uid>` under the key,
/// in hex.
pub fn mark_key_proof(key: &[u8], uid: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&key, format!("copyrator-mark-key:{uid}").as_bytes());
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The first half of Copyrator's mark (`<identity>.<content>`) of a copy
/// of `kind` at `namespace/name` for `rule` (`namespace/name`) under `key`:
/// HMAC-SHA-256 of the domain and those four parts, each after its length
/// (8 bytes, big-endian), 32 hex digits. What whoever knows the key can
/// forge.
pub fn copy_identity_tag(
    key: &[u8],
    kind: &str,
    namespace: &str,
    name: &str,
    rule: &str,
) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut feed = ring::hmac::Context::with_key(&key);
    for part in ["copyrator copy", kind, namespace, name, rule] {
        feed.update(&(part.len() as u64).to_be_bytes());
        feed.update(part.as_bytes());
    }
    let tag: String = feed
        .sign()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    tag[..32].to_string()
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_copyrator")
}

pub fn rule_resource() -> ApiResource {
    ApiResource {
        group: "flant.com".into(),
        version: "v1".into(),
        api_version: "flant.com/v1".into(),
        kind: "CopyratorRule".into(),
        plural: "copyrators".into(),
    }
}

// ---------------------------------------------------------------------------
// waiting

/// Polls `f` until it returns `Ok`, for at most `timeout`; panics with what
/// was awaited and the last thing seen otherwise.
pub async fn wait_until<T>(
    what: impl Display,
    timeout: Duration,
    mut f: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) => {
                if start.elapsed() >= timeout {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks `f` repeatedly for `period`; panics as soon as it returns `Err`.
pub async fn assert_for(
    what: impl Display,
    period: Duration,
    mut f: impl AsyncFnMut() -> Result<(), String>,
) {
    let start = Instant::now();
    loop {
        if let Err(seen) = f().await {
            panic!(
                "expected {what} for {period:?}, but after {:?}: {seen}",
                start.elapsed()
            );
        }
        if start.elapsed() >= period {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

pub fn err_msg(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

// ---------------------------------------------------------------------------
// uniqueness

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// Five random-enough lowercase characters from time, pid and a counter.
pub fn random5() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut x = nanos
        ^ ((std::process::id() as u64) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (0..5)
        .map(|i| ALPHABET[((x >> (i * 12)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

pub fn b64(bytes: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// The forms in which a secret value could leak into a log line, an Event
/// or a status: the text itself, its base64 (as a Secret's `data` holds
/// it), and the Rust Debug form of its bytes, `[104, 105]` for "hi", also
/// without the brackets (`104, 105`), as a `Vec<u8>` or a `ByteString`
/// prints inside a larger value. The value must be long and unique enough
/// not to occur by chance in any of these forms.
pub fn secret_forms(value: &str) -> Vec<String> {
    let bytes: Vec<String> = value.bytes().map(|b| b.to_string()).collect();
    let byte_list = bytes.join(", ");
    vec![
        value.to_string(),
        b64(value.as_bytes()),
        format!("[{byte_list}]"),
        byte_list,
    ]
}

// ---------------------------------------------------------------------------
// CRD

static CRD_INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// Applies `copyrator crd` (server-side, forced, tolerant of parallel
/// installers) and waits until the CRD is Established and served.
pub async fn ensure_crd(client: &Client) {
    CRD_INSTALLED
        .get_or_init(|| install_crd(client.clone()))
        .await;
}

async fn install_crd(client: Client) {
    let out = Command::new(bin())
        .arg("crd")
        .output()
        .expect("running `copyrator crd`");
    assert!(
        out.status.success(),
        "`copyrator crd` failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("`copyrator crd` prints UTF-8");
    let crd: Value = serde_yaml::from_str(&yaml).expect("`copyrator crd` prints one YAML document");
    assert_eq!(
        crd["kind"], "CustomResourceDefinition",
        "`copyrator crd` output: {yaml}"
    );
    assert_eq!(
        crd["metadata"]["name"], CRD_NAME,
        "`copyrator crd` output names the CRD"
    );
    apply_crd(client, &crd, &rule_resource()).await;
}

/// Applies the CustomResourceDefinition `crd` and waits until it is
/// Established and `served`, its resource, answers a list.
pub async fn apply_crd(client: Client, crd: &Value, served: &ApiResource) {
    let name = crd["metadata"]["name"]
        .as_str()
        .expect("the CRD has a name")
        .to_owned();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("copyrator-tests").force();
    wait_until(
        format!("the CRD {name} to be applied"),
        TIMEOUT,
        async || {
            api.patch(&name, &pp, &Patch::Apply(crd))
                .await
                .map(|_| ())
                .map_err(|e| err_msg(&e))
        },
    )
    .await;
    wait_until(
        format!("the CRD {name} to be Established"),
        TIMEOUT,
        async || {
            let crd = api.get(&name).await.map_err(|e| err_msg(&e))?;
            let established = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if established {
                Ok(())
            } else {
                Err(format!("{:?}", crd.status))
            }
        },
    )
    .await;
    let objects: Api<DynamicObject> = Api::namespaced_with(client, "default", served);
    wait_until(
        format!("{} to be served", served.plural),
        TIMEOUT,
        async || {
            objects
                .list(&ListParams::default().limit(1))
                .await
                .map(|_| ())
                .map_err(|e| err_msg(&e))
        },
    )
    .await;
}

/// Creates the rule and asserts the API server refuses it (422 Invalid)
/// with a message that mentions every word of `mentions`.
pub async fn refused(t: &TestNs, ns: &str, name: &str, body: Value, mentions: &[&str]) {
    match t.try_create_rule(ns, name, body.clone()).await {
        Ok(r) => panic!("the API server accepted the invalid rule {body}: {r}"),
        Err(e) => {
            let msg = err_msg(&e);
            assert!(
                matches!(&e, kube::Error::Api(s) if s.code == 422),
                "expected 422 Invalid for {body}, got {msg}"
            );
            for word in mentions {
                assert!(
                    msg.contains(word),
                    "the refusal of {body} does not mention {word:?}: {msg}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// exclusivity

/// An operator that serves every namespace (`--all-namespaces`) without
/// `--rule-name` takes every other test's rules as tenants' rules (it adds
/// its finalizer, writes their status, prunes their copies). Its tests live
/// in the `cluster_wide` binary, which cargo runs before `suite`, never
/// beside it, and take this lock for writing: one at a time.
#[allow(dead_code)] // taken in `tests/cluster_wide` only
pub static CLUSTER_WIDE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The binary these helpers are compiled into.
const TEST_BINARY: &str = env!("CARGO_CRATE_NAME");

/// Only the `cluster_wide` binary starts an operator that serves every
/// namespace and every rule name (see [`CLUSTER_WIDE`]).
fn assert_serves_only_its_own_rules(args: &[String], env: &[(&str, &str)]) {
    let every_namespace = args.iter().any(|a| a == "--all-namespaces")
        || env
            .iter()
            .any(|(key, value)| *key == "ALL_NAMESPACES" && *value == "true");
    let one_rule = args
        .iter()
        .any(|a| a == "--rule-name" || a.starts_with("--rule-name="))
        || env.iter().any(|(key, _)| *key == "RULE_NAME");
    assert!(
        !every_namespace || one_rule || TEST_BINARY == "cluster_wide",
        "an operator with --all-namespaces and no --rule-name serves every test's rules: \
         its test belongs in tests/cluster_wide (this is {TEST_BINARY})"
    );
}

// ---------------------------------------------------------------------------
// objects

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    pub fn rule_type(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// A ConfigMap or Secret as the tests look at it (Secret data decoded).
#[derive(Clone, Debug)]
pub struct Obj {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub data: BTreeMap<String, String>,
    pub binary_data: BTreeMap<String, Vec<u8>>,
    pub type_: Option<String>,
    pub immutable: Option<bool>,
    pub managers: Vec<String>,
    /// (manager, operation, time) of every managedFields entry.
    pub managed_fields: Vec<(String, String, String)>,
    pub owner_references: usize,
    pub deleting: bool,
}

impl Obj {
    fn from_meta(kind: Kind, m: ObjectMeta) -> Obj {
        let managed_fields: Vec<(String, String, String)> = m
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .map(|f| {
                (
                    f.manager.unwrap_or_default(),
                    f.operation.unwrap_or_default(),
                    f.time.map(|t| format!("{:?}", t.0)).unwrap_or_default(),
                )
            })
            .collect();
        Obj {
            kind,
            namespace: m.namespace.unwrap_or_default(),
            name: m.name.unwrap_or_default(),
            uid: m.uid.unwrap_or_default(),
            resource_version: m.resource_version.unwrap_or_default(),
            labels: m.labels.unwrap_or_default(),
            annotations: m.annotations.unwrap_or_default(),
            data: BTreeMap::new(),
            binary_data: BTreeMap::new(),
            type_: None,
            immutable: None,
            managers: managed_fields.iter().map(|f| f.0.clone()).collect(),
            managed_fields,
            owner_references: m.owner_references.map_or(0, |o| o.len()),
            deleting: m.deletion_timestamp.is_some(),
        }
    }

    pub fn from_configmap(cm: ConfigMap) -> Obj {
        let mut o = Obj::from_meta(Kind::ConfigMap, cm.metadata);
        o.data = cm.data.unwrap_or_default();
        o.binary_data = cm
            .binary_data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        o.immutable = cm.immutable;
        o
    }

    pub fn from_secret(s: Secret) -> Obj {
        let mut o = Obj::from_meta(Kind::Secret, s.metadata);
        o.data = s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        o.type_ = s.type_;
        o.immutable = s.immutable;
        o
    }

    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.get(k).map(String::as_str)
    }

    pub fn annotation(&self, k: &str) -> Option<&str> {
        self.annotations.get(k).map(String::as_str)
    }

    pub fn is_copy(&self) -> bool {
        self.labels.contains_key(LABEL_RULE_UID)
    }

    pub fn data_is(&self, want: &[(&str, &str)]) -> Result<(), String> {
        let want: BTreeMap<String, String> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if self.data == want {
            Ok(())
        } else {
            Err(format!(
                "{}/{} data is {:?}, want {:?}",
                self.namespace, self.name, self.data, want
            ))
        }
    }
}

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Checks that `copy` is a copy of `source` made by the rule `rule_ns/rule_name`
/// with uid `rule_uid`: data, type, labels, annotations and tracking metadata.
pub fn check_copy(
    copy: &Obj,
    source: &Obj,
    rule_ns: &str,
    rule_name: &str,
    rule_uid: &str,
) -> Result<(), String> {
    let at = format!("copy {}/{}", copy.namespace, copy.name);
    if copy.data != source.data {
        return Err(format!(
            "{at}: data {:?}, source has {:?}",
            copy.data, source.data
        ));
    }
    if copy.binary_data != source.binary_data {
        return Err(format!(
            "{at}: binaryData {:?}, source has {:?}",
            copy.binary_data, source.binary_data
        ));
    }
    if copy.type_ != source.type_ {
        return Err(format!(
            "{at}: type {:?}, source has {:?}",
            copy.type_, source.type_
        ));
    }
    if copy.immutable.unwrap_or(false) != source.immutable.unwrap_or(false) {
        return Err(format!(
            "{at}: immutable {:?}, source has {:?}",
            copy.immutable, source.immutable
        ));
    }
    check_copy_meta(&copy.meta(), &source.meta(), rule_ns, rule_name, rule_uid)
}

/// What [`check_copy_meta`] reads of an object, whatever its kind.
#[derive(Clone, Copy, Debug)]
pub struct MetaView<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    /// The field managers of its managedFields entries.
    pub managers: &'a [String],
    pub owner_references: usize,
}

impl Obj {
    pub fn meta(&self) -> MetaView<'_> {
        MetaView {
            namespace: &self.namespace,
            name: &self.name,
            uid: &self.uid,
            labels: &self.labels,
            annotations: &self.annotations,
            managers: &self.managers,
            owner_references: self.owner_references,
        }
    }
}

/// The metadata half of [`check_copy`], for a copy of any kind: `copy`
/// carries the labels and annotations of `source`, the tracking labels and
/// annotations of the rule `rule_ns/rule_name` (uid `rule_uid`), a
/// managedFields entry of Copyrator's field manager, and no ownerReference.
pub fn check_copy_meta(
    copy: &MetaView,
    source: &MetaView,
    rule_ns: &str,
    rule_name: &str,
    rule_uid: &str,
) -> Result<(), String> {
    let at = format!("copy {}/{}", copy.namespace, copy.name);
    let label = |k: &str| copy.labels.get(k).map(String::as_str);
    let annotation = |k: &str| copy.annotations.get(k).map(String::as_str);
    for (k, v) in source.labels {
        if copy.labels.get(k) != Some(v) {
            return Err(format!(
                "{at}: label {k}={:?}, source has {v:?}; labels {:?}",
                copy.labels.get(k),
                copy.labels
            ));
        }
    }
    for (k, v) in source.annotations {
        if copy.annotations.get(k) != Some(v) {
            return Err(format!(
                "{at}: annotation {k}={:?}, source has {v:?}",
                copy.annotations.get(k)
            ));
        }
    }
    let expect_label = [(LABEL_MANAGED_BY, "copyrator"), (LABEL_RULE_UID, rule_uid)];
    for (k, v) in expect_label {
        if label(k) != Some(v) {
            return Err(format!(
                "{at}: label {k}={:?}, want {v:?}; labels {:?}",
                label(k),
                copy.labels
            ));
        }
    }
    let rule_ref = format!("{rule_ns}/{rule_name}");
    let source_ref = format!("{}/{}", source.namespace, source.name);
    let expect_annotation = [
        (ANNOTATION_RULE, rule_ref.as_str()),
        (ANNOTATION_SOURCE, source_ref.as_str()),
        (ANNOTATION_SOURCE_UID, source.uid),
    ];
    for (k, v) in expect_annotation {
        if annotation(k) != Some(v) {
            return Err(format!(
                "{at}: annotation {k}={:?}, want {v:?}; annotations {:?}",
                annotation(k),
                copy.annotations
            ));
        }
    }
    if !copy.managers.iter().any(|m| m == FIELD_MANAGER) {
        return Err(format!(
            "{at}: no managedFields entry of manager {FIELD_MANAGER:?}: {:?}",
            copy.managers
        ));
    }
    if copy.owner_references != 0 {
        return Err(format!(
            "{at}: has {} ownerReferences",
            copy.owner_references
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// rule status

pub fn ready_condition(rule: &Value) -> Option<&Value> {
    rule.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

pub fn status_u64(rule: &Value, field: &str) -> Option<u64> {
    rule.pointer(&format!("/status/{field}"))?.as_u64()
}

pub fn short_status(rule: &Value) -> String {
    format!(
        "generation {} finalizers {} status {}",
        rule.pointer("/metadata/generation").unwrap_or(&Value::Null),
        rule.pointer("/metadata/finalizers").unwrap_or(&Value::Null),
        rule.get("status").unwrap_or(&Value::Null)
    )
}

/// Ready False with `reason`.
pub fn not_ready_because(rule: &Value, reason: &str) -> Result<(), String> {
    let ready = ready_condition(rule).ok_or_else(|| short_status(rule))?;
    if ready["status"] == "False" && ready["reason"] == reason {
        Ok(())
    } else {
        Err(short_status(rule))
    }
}

/// Ready True for the current generation.
pub fn is_ready(rule: &Value) -> Result<(), String> {
    let generation = rule.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = rule
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    let ready = ready_condition(rule).map(|c| c["status"].clone());
    if generation.is_some() && generation == observed && ready == Some(json!("True")) {
        Ok(())
    } else {
        Err(short_status(rule))
    }
}

// ---------------------------------------------------------------------------
// ConfigMaps and Secrets in any cluster (the home one, or a member)

/// Creates a ConfigMap or Secret `ns/name` from `body` in the cluster of `client`.
pub async fn create_obj(client: &Client, kind: Kind, ns: &str, name: &str, mut body: Value) -> Obj {
    body["metadata"]["name"] = json!(name);
    body["metadata"]["namespace"] = json!(ns);
    let pp = PostParams::default();
    let res = match kind {
        Kind::ConfigMap => {
            let cm: ConfigMap = serde_json::from_value(body).expect("a ConfigMap body");
            Api::<ConfigMap>::namespaced(client.clone(), ns)
                .create(&pp, &cm)
                .await
                .map(Obj::from_configmap)
        }
        Kind::Secret => {
            let s: Secret = serde_json::from_value(body).expect("a Secret body");
            Api::<Secret>::namespaced(client.clone(), ns)
                .create(&pp, &s)
                .await
                .map(Obj::from_secret)
        }
    };
    res.unwrap_or_else(|e| panic!("creating {kind:?} {ns}/{name}: {}", err_msg(&e)))
}

/// The body of an object with exactly `labels` and `data` (Secrets are Opaque).
pub fn plain_body(kind: Kind, labels: &[(&str, &str)], data: &[(&str, &str)]) -> Value {
    match kind {
        Kind::ConfigMap => json!({"metadata": {"labels": map(labels)}, "data": map(data)}),
        Kind::Secret => {
            json!({"metadata": {"labels": map(labels)}, "type": "Opaque", "stringData": map(data)})
        }
    }
}

pub async fn try_get_obj(
    client: &Client,
    kind: Kind,
    ns: &str,
    name: &str,
) -> Result<Option<Obj>, String> {
    match kind {
        Kind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map(|o| o.map(Obj::from_configmap)),
        Kind::Secret => Api::<Secret>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map(|o| o.map(Obj::from_secret)),
    }
    .map_err(|e| err_msg(&e))
}

/// JSON merge patch. A merge patch is idempotent, so one the connection
/// lost (a pooled connection the API server closed as it was reused) is
/// sent again, a few times; the API server's own answers are final.
pub async fn patch_obj(client: &Client, kind: Kind, ns: &str, name: &str, patch: Value) -> Obj {
    const ATTEMPTS: usize = 3;
    let pp = PatchParams::default();
    let mut attempt = 1;
    let res = loop {
        let res = match kind {
            Kind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), ns)
                .patch(name, &pp, &Patch::Merge(&patch))
                .await
                .map(Obj::from_configmap),
            Kind::Secret => Api::<Secret>::namespaced(client.clone(), ns)
                .patch(name, &pp, &Patch::Merge(&patch))
                .await
                .map(Obj::from_secret),
        };
        match res {
            Err(e) if !matches!(e, kube::Error::Api(_)) && attempt < ATTEMPTS => attempt += 1,
            res => break res,
        }
    };
    res.unwrap_or_else(|e| {
        panic!(
            "patching {kind:?} {ns}/{name} with {patch}: {}",
            err_msg(&e)
        )
    })
}

/// The merge patch that sets (`Some`) or removes (`None`) data keys of a
/// ConfigMap or Secret.
pub fn data_patch(kind: Kind, changes: &[(&str, Option<&str>)]) -> Value {
    match kind {
        Kind::ConfigMap => {
            let data: serde_json::Map<String, Value> = changes
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            json!({ "data": data })
        }
        Kind::Secret => {
            let set: serde_json::Map<String, Value> = changes
                .iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_string(), json!(v))))
                .collect();
            let del: serde_json::Map<String, Value> = changes
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| (k.to_string(), Value::Null))
                .collect();
            json!({ "stringData": set, "data": del })
        }
    }
}

// ---------------------------------------------------------------------------
// the per-test context

/// One test's view of the cluster: a client, a unique prefix, the namespaces
/// it made (deleted on drop) and helpers around ConfigMaps, Secrets and rules.
pub struct TestNs {
    pub client: Client,
    /// `t-<test>-<random>`; every namespace of the test starts with it, and it
    /// is the value of [`TEST_LABEL`] on the test's sources.
    pub prefix: String,
    namespaces: Mutex<Vec<String>>,
    extra_cleanup: Mutex<Vec<(Kind, String, String)>>,
    /// Namespaces the test made in member clusters (see [`members`]): the
    /// member's kubeconfig and the name.
    member_namespaces: Mutex<Vec<(PathBuf, String)>>,
    operators: AtomicUsize,
}

impl TestNs {
    pub async fn new(test: &str) -> TestNs {
        let short: String = test
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(20)
            .collect();
        let short = short.trim_matches('-').to_string();
        let prefix = format!("t-{short}-{}", random5());
        let client = Client::try_default()
            .await
            .expect("a Kubernetes client from KUBECONFIG; run `eval \"$(hack/cluster up)\"` first");
        ensure_crd(&client).await;
        TestNs {
            client,
            prefix,
            namespaces: Mutex::new(Vec::new()),
            extra_cleanup: Mutex::new(Vec::new()),
            member_namespaces: Mutex::new(Vec::new()),
            operators: AtomicUsize::new(0),
        }
    }

    /// The full name of the test namespace with this suffix (not created).
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.prefix)
    }

    /// A glob matching the test namespaces whose suffix starts with `suffix_prefix`.
    pub fn glob(&self, suffix_prefix: &str) -> String {
        format!("{}-{suffix_prefix}*", self.prefix)
    }

    /// The label selector every source of this test carries.
    pub fn selector(&self) -> Value {
        json!({ TEST_LABEL: self.prefix })
    }

    /// Source labels: the test label plus `extra`.
    pub fn labels(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v = vec![(TEST_LABEL.to_string(), self.prefix.clone())];
        v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        v
    }

    /// Creates the namespace `<prefix>-<suffix>` and returns its name.
    pub async fn ns(&self, suffix: &str) -> String {
        self.ns_labelled(suffix, &[]).await
    }

    pub async fn ns_labelled(&self, suffix: &str, labels: &[(&str, &str)]) -> String {
        let name = self.name(suffix);
        self.namespaces.lock().unwrap().push(name.clone());
        create_namespace(&self.client, &name, labels)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
    }

    /// Deletes `kind ns/name` when the test ends (for objects outside the test namespaces).
    pub fn cleanup_later(&self, kind: Kind, ns: &str, name: &str) {
        self.extra_cleanup
            .lock()
            .unwrap()
            .push((kind, ns.into(), name.into()));
    }

    /// Deletes the namespace `name` of the member cluster of `kubeconfig`
    /// when the test ends, as the test's own namespaces are.
    pub fn cleanup_member_namespace_later(&self, kubeconfig: PathBuf, name: &str) {
        self.member_namespaces
            .lock()
            .unwrap()
            .push((kubeconfig, name.into()));
    }

    pub fn namespaces(&self) -> Api<Namespace> {
        Api::all(self.client.clone())
    }

    /// Sets the namespace's `copyrator.flant.com/accept-from` annotation:
    /// it accepts the copies of tenant rules of the namespaces `from` lists.
    pub async fn accept_from(&self, ns: &str, from: &str) {
        self.namespaces()
            .patch(
                ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "copyrator.flant.com/accept-from": from,
                }}})),
            )
            .await
            .unwrap_or_else(|e| panic!("annotating namespace {ns}: {}", err_msg(&e)));
    }

    pub fn cms(&self, ns: &str) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub fn secrets(&self, ns: &str) -> Api<Secret> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub fn rules(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &rule_resource())
    }

    // --- ConfigMaps and Secrets -------------------------------------------

    /// Creates a ConfigMap or Secret from a JSON body (`metadata.namespace`
    /// and `metadata.name` are filled in); Secrets may use `stringData`.
    pub async fn create_json(&self, kind: Kind, ns: &str, name: &str, body: Value) -> Obj {
        create_obj(&self.client, kind, ns, name, body).await
    }

    /// Creates a source carrying the test label plus `labels`, with `data`
    /// (Secrets are Opaque).
    pub async fn create_source(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        data: &[(&str, &str)],
    ) -> Obj {
        let labels: BTreeMap<String, String> = self.labels(labels).into_iter().collect();
        let body = match kind {
            Kind::ConfigMap => json!({"metadata": {"labels": labels}, "data": map(data)}),
            Kind::Secret => {
                json!({"metadata": {"labels": labels}, "type": "Opaque", "stringData": map(data)})
            }
        };
        self.create_json(kind, ns, name, body).await
    }

    /// Creates an object without the test label.
    pub async fn create_plain(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        data: &[(&str, &str)],
    ) -> Obj {
        self.create_json(kind, ns, name, plain_body(kind, labels, data))
            .await
    }

    pub async fn try_get(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Obj>, String> {
        try_get_obj(&self.client, kind, ns, name).await
    }

    pub async fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Obj> {
        self.try_get(kind, ns, name)
            .await
            .unwrap_or_else(|e| panic!("reading {kind:?} {ns}/{name}: {e}"))
    }

    pub async fn must_get(&self, kind: Kind, ns: &str, name: &str) -> Obj {
        self.get(kind, ns, name)
            .await
            .unwrap_or_else(|| panic!("{kind:?} {ns}/{name} does not exist"))
    }

    /// JSON merge patch.
    pub async fn patch(&self, kind: Kind, ns: &str, name: &str, patch: Value) -> Obj {
        patch_obj(&self.client, kind, ns, name, patch).await
    }

    /// Sets (`Some`) or removes (`None`) data keys of a ConfigMap or Secret.
    pub async fn set_data(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        changes: &[(&str, Option<&str>)],
    ) -> Obj {
        self.patch(kind, ns, name, data_patch(kind, changes)).await
    }

    /// Annotates namespace `ns` to let tenant rules of `from` adopt
    /// objects there, and delete what they adopted.
    pub async fn adopt_from(&self, ns: &str, from: &str) {
        self.namespaces()
            .patch(
                ns,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                    "copyrator.flant.com/adopt-from": from,
                }}})),
            )
            .await
            .unwrap_or_else(|e| panic!("annotating namespace {ns}: {}", err_msg(&e)));
    }

    /// Sets (`Some`) or removes (`None`) labels.
    pub async fn set_labels(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        changes: &[(&str, Option<&str>)],
    ) -> Obj {
        let labels: serde_json::Map<String, Value> = changes
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        self.patch(kind, ns, name, json!({"metadata": {"labels": labels}}))
            .await
    }

    pub async fn delete(&self, kind: Kind, ns: &str, name: &str) {
        let dp = DeleteParams::default();
        let res = match kind {
            Kind::ConfigMap => self.cms(ns).delete(name, &dp).await.map(|_| ()),
            Kind::Secret => self.secrets(ns).delete(name, &dp).await.map(|_| ()),
        };
        if let Err(e) = res
            && !is_not_found(&e)
        {
            panic!("deleting {kind:?} {ns}/{name}: {}", err_msg(&e));
        }
    }

    /// Objects of `kind` with the label `key=value`, across all namespaces.
    pub async fn list_labelled(&self, kind: Kind, key: &str, value: &str) -> Vec<Obj> {
        let lp = ListParams::default().labels(&format!("{key}={value}"));
        match kind {
            Kind::ConfigMap => Api::<ConfigMap>::all(self.client.clone())
                .list(&lp)
                .await
                .map(|l| l.items.into_iter().map(Obj::from_configmap).collect()),
            Kind::Secret => Api::<Secret>::all(self.client.clone())
                .list(&lp)
                .await
                .map(|l| l.items.into_iter().map(Obj::from_secret).collect()),
        }
        .unwrap_or_else(|e| panic!("listing {kind:?} with {key}={value}: {}", err_msg(&e)))
    }

    /// Waits until `kind ns/name` exists and `check` accepts it.
    pub async fn wait_obj(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        what: &str,
        check: impl Fn(&Obj) -> Result<(), String>,
    ) -> Obj {
        wait_until(
            format!("{kind:?} {ns}/{name}: {what}"),
            TIMEOUT,
            async || match self.try_get(kind, ns, name).await? {
                None => Err("it does not exist".into()),
                Some(o) => check(&o).map(|()| o),
            },
        )
        .await
    }

    /// Waits until the copy `kind ns/name` of `source` exists and is right.
    pub async fn wait_copy(
        &self,
        kind: Kind,
        ns: &str,
        source: &Obj,
        rule_ns: &str,
        rule_name: &str,
    ) -> Obj {
        let rule_uid = self.rule_uid(rule_ns, rule_name).await;
        self.wait_obj(
            kind,
            ns,
            &source.name,
            &format!("a copy of {}/{}", source.namespace, source.name),
            |o| check_copy(o, source, rule_ns, rule_name, &rule_uid),
        )
        .await
    }

    pub async fn wait_gone(&self, kind: Kind, ns: &str, name: &str, why: &str) {
        wait_until(
            format!("{kind:?} {ns}/{name} to be deleted ({why})"),
            TIMEOUT,
            async || match self.try_get(kind, ns, name).await? {
                None => Ok(()),
                Some(o) => Err(format!(
                    "still there: labels {:?} data {:?} deleting {}",
                    o.labels, o.data, o.deleting
                )),
            },
        )
        .await
    }

    /// Asserts for [`QUIET`] that `kind ns/name` does not exist.
    pub async fn assert_absent(&self, kind: Kind, ns: &str, name: &str, why: &str) {
        assert_for(
            format!("no {kind:?} {ns}/{name} ({why})"),
            QUIET,
            async || match self.try_get(kind, ns, name).await? {
                None => Ok(()),
                Some(o) => Err(format!(
                    "it exists: labels {:?} annotations {:?} data {:?}",
                    o.labels, o.annotations, o.data
                )),
            },
        )
        .await
    }

    /// Asserts for [`QUIET`] that `kind ns/name` exists with resourceVersion `rv`.
    pub async fn assert_unchanged(&self, kind: Kind, ns: &str, name: &str, rv: &str, why: &str) {
        assert_for(
            format!("{kind:?} {ns}/{name} unchanged at resourceVersion {rv} ({why})"),
            QUIET,
            async || match self.try_get(kind, ns, name).await? {
                None => Err("it was deleted".into()),
                Some(o) if o.resource_version != rv => Err(format!(
                    "resourceVersion {}; labels {:?} data {:?} managers {:?}",
                    o.resource_version, o.labels, o.data, o.managed_fields
                )),
                Some(_) => Ok(()),
            },
        )
        .await
    }

    // --- rules --------------------------------------------------------------

    fn rule_object(ns: &str, name: &str, body: &Value) -> DynamicObject {
        let mut obj = json!({
            "apiVersion": "flant.com/v1",
            "kind": "CopyratorRule",
            "metadata": {"name": name, "namespace": ns},
        });
        for (k, v) in body.as_object().expect("a rule body is a JSON object") {
            if k == "metadata" {
                for (mk, mv) in v.as_object().expect("metadata is an object") {
                    obj["metadata"][mk] = mv.clone();
                }
            } else {
                obj[k] = v.clone();
            }
        }
        serde_json::from_value(obj).expect("a CopyratorRule body")
    }

    /// A rule as a manifest for `copyrator plan -f`: `body` as for
    /// [`TestNs::create_rule`]; without `ns`, no `metadata.namespace`.
    pub fn rule_manifest(ns: Option<&str>, name: &str, body: &Value) -> Value {
        let mut manifest =
            serde_json::to_value(Self::rule_object(ns.unwrap_or("-"), name, body)).unwrap();
        if ns.is_none() {
            manifest["metadata"]
                .as_object_mut()
                .expect("metadata is an object")
                .remove("namespace");
        }
        manifest
    }

    /// Writes `manifests` as one YAML file of documents separated by
    /// `---`, under `CARGO_TARGET_TMPDIR/plan-files/`; returns its path.
    pub fn rule_file(&self, file: &str, manifests: &[Value]) -> String {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plan-files");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}-{file}.yaml", self.prefix));
        let text = manifests
            .iter()
            .map(|m| serde_yaml::to_string(m).expect("a manifest renders as YAML"))
            .collect::<Vec<_>>()
            .join("---\n");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path.to_string_lossy().into_owned()
    }

    /// Creates a rule; `body` holds the top-level fields (`spec`, or the
    /// original `ruleType`/`selector`/`namespace`, optionally `metadata`).
    pub async fn try_create_rule(
        &self,
        ns: &str,
        name: &str,
        body: Value,
    ) -> Result<Value, kube::Error> {
        let obj = Self::rule_object(ns, name, &body);
        self.rules(ns)
            .create(&PostParams::default(), &obj)
            .await
            .map(|o| serde_json::to_value(o).unwrap())
    }

    pub async fn create_rule(&self, ns: &str, name: &str, body: Value) -> Value {
        self.try_create_rule(ns, name, body.clone())
            .await
            .unwrap_or_else(|e| panic!("creating rule {ns}/{name} {body}: {}", err_msg(&e)))
    }

    pub async fn try_get_rule(&self, ns: &str, name: &str) -> Result<Option<Value>, String> {
        self.rules(ns)
            .get_opt(name)
            .await
            .map(|o| o.map(|o| serde_json::to_value(o).unwrap()))
            .map_err(|e| err_msg(&e))
    }

    pub async fn get_rule(&self, ns: &str, name: &str) -> Value {
        self.try_get_rule(ns, name)
            .await
            .unwrap_or_else(|e| panic!("reading rule {ns}/{name}: {e}"))
            .unwrap_or_else(|| panic!("rule {ns}/{name} does not exist"))
    }

    pub async fn rule_uid(&self, ns: &str, name: &str) -> String {
        self.get_rule(ns, name).await["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// JSON merge patch of a rule.
    pub async fn patch_rule(&self, ns: &str, name: &str, patch: Value) -> Value {
        self.rules(ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|o| serde_json::to_value(o).unwrap())
            .unwrap_or_else(|e| panic!("patching rule {ns}/{name} with {patch}: {}", err_msg(&e)))
    }

    /// The mark key [`TestNs::provision_mark_key`] writes (32 bytes).
    pub fn mark_key(&self) -> Vec<u8> {
        (0..32u8)
            .map(|i| i.wrapping_mul(37) ^ self.prefix.len() as u8)
            .collect()
    }

    /// Make the operator's mark key Secret (`copyrator-mark-key`) in
    /// `namespace`, as an administrator would for an operator that may
    /// not create Secrets (docs/trust.md): the key, then the proof of the
    /// Secret's uid under it; a no-op where it exists.
    pub async fn provision_mark_key(&self, namespace: &str) {
        let key = self.mark_key();
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": "copyrator-mark-key"},
            "data": {"key": k8s_openapi::ByteString(key.clone())},
        }))
        .expect("a Secret");
        let api =
            Api::<k8s_openapi::api::core::v1::Secret>::namespaced(self.client.clone(), namespace);
        let created = match api.create(&PostParams::default(), &secret).await {
            Ok(created) => created,
            Err(kube::Error::Api(s)) if s.code == 409 => return,
            Err(e) => panic!("the mark key in {namespace}: {}", err_msg(&e)),
        };
        let uid = created.metadata.uid.clone().expect("a uid");
        let patch = json!({"metadata": {
            "resourceVersion": created.metadata.resource_version,
            "annotations": {MARK_KEY_PROOF: mark_key_proof(&key, &uid)},
        }});
        api.patch(
            "copyrator-mark-key",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("the mark key's proof in {namespace}: {}", err_msg(&e)));
    }

    pub async fn delete_rule(&self, ns: &str, name: &str) {
        if let Err(e) = self.rules(ns).delete(name, &DeleteParams::default()).await
            && !is_not_found(&e)
        {
            panic!("deleting rule {ns}/{name}: {}", err_msg(&e));
        }
    }

    pub async fn wait_rule(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> Result<(), String>,
    ) -> Value {
        wait_until(
            format!("rule {ns}/{name}: {what}"),
            TIMEOUT,
            async || match self.try_get_rule(ns, name).await? {
                None => Err("the rule does not exist".into()),
                Some(r) => check(&r).map(|()| r),
            },
        )
        .await
    }

    /// Waits until the rule's status describes its current generation
    /// (a pass over it was published), whatever it says.
    pub async fn wait_rule_observed(&self, ns: &str, name: &str, what: &str) -> Value {
        self.wait_rule(ns, name, what, |r| {
            match r["status"]["observedGeneration"] == r["metadata"]["generation"] {
                true => Ok(()),
                false => Err(short_status(r)),
            }
        })
        .await
    }

    /// Waits for Ready True at the current generation.
    pub async fn wait_rule_ready(&self, ns: &str, name: &str) -> Value {
        self.wait_rule(
            ns,
            name,
            "Ready True with observedGeneration = generation",
            is_ready,
        )
        .await
    }

    pub async fn wait_rule_gone(&self, ns: &str, name: &str, why: &str) {
        wait_until(
            format!("rule {ns}/{name} to be gone ({why})"),
            TIMEOUT,
            async || match self.try_get_rule(ns, name).await? {
                None => Ok(()),
                Some(r) => Err(short_status(&r)),
            },
        )
        .await
    }

    /// Events (events.k8s.io/v1) in `ns` regarding the object `name`.
    pub async fn events_regarding(&self, ns: &str, name: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing events in {ns}: {}", err_msg(&e)))
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    pub fn next_operator_id(&self) -> usize {
        self.operators.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let namespaces = std::mem::take(&mut *self.namespaces.lock().unwrap());
        let extra = std::mem::take(&mut *self.extra_cleanup.lock().unwrap());
        let member_namespaces = std::mem::take(&mut *self.member_namespaces.lock().unwrap());
        if namespaces.is_empty() && extra.is_empty() && member_namespaces.is_empty() {
            return;
        }
        clean_up_apart(move || async move {
            if let Ok(client) = Client::try_default().await {
                cleanup(&client, namespaces, extra).await;
            }
            for (kubeconfig, ns) in member_namespaces {
                if let Ok(client) = members::client_of_file(&kubeconfig).await {
                    cleanup(&client, vec![ns], Vec::new()).await;
                }
            }
        });
    }
}

/// Creates the namespace `name` with exactly `labels` in the cluster of `client`.
pub async fn create_namespace(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
) -> Result<(), String> {
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": map(labels)}
    }))
    .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map(|_| ())
        .map_err(|e| err_msg(&e))
}

/// Runs the future `make` returns to its end on a thread of its own with
/// a runtime of its own, and waits for it: a guard that cleans up when it
/// drops may drop while the test's runtime is shutting down (or the test
/// panics).
pub fn clean_up_apart<F: Future<Output = ()>>(make: impl FnOnce() -> F + Send + 'static) {
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(make());
    });
    let _ = handle.join();
}

/// Best effort: remove the finalizers that would keep the namespaces
/// terminating once no operator runs, delete the rules, then the namespaces
/// (on the cluster of `client`: the home one, or a member without rules).
async fn cleanup(client: &Client, namespaces: Vec<String>, extra: Vec<(Kind, String, String)>) {
    let dp = DeleteParams::default();
    let pp = PatchParams::default();
    let strip = json!({"metadata": {"finalizers": null}});
    for (kind, ns, name) in extra {
        let _ = match kind {
            Kind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
            Kind::Secret => Api::<Secret>::namespaced(client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        };
    }
    for ns in &namespaces {
        let rules: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &rule_resource());
        if let Ok(list) = rules.list(&ListParams::default()).await {
            for r in list.items {
                if r.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                {
                    let name = r.metadata.name.as_deref().unwrap_or_default();
                    let _ = rules.patch(name, &pp, &Patch::Merge(&strip)).await;
                }
                // Gone right away (no finalizer, and this test's operator is
                // dead): an `--all-namespaces` operator of a later test must
                // not find the rule and put its finalizer back.
                let _ = rules
                    .delete(r.metadata.name.as_deref().unwrap_or_default(), &dp)
                    .await;
            }
        }
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        if let Ok(list) = cms.list(&ListParams::default()).await {
            for o in list.items {
                if o.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                {
                    let name = o.metadata.name.unwrap_or_default();
                    let _ = cms.patch(&name, &pp, &Patch::Merge(&strip)).await;
                }
            }
        }
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        if let Ok(list) = secrets.list(&ListParams::default()).await {
            for o in list.items {
                if o.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                {
                    let name = o.metadata.name.unwrap_or_default();
                    let _ = secrets.patch(&name, &pp, &Patch::Merge(&strip)).await;
                }
            }
        }
        let _ = Api::<Namespace>::all(client.clone()).delete(ns, &dp).await;
    }
}

// ---------------------------------------------------------------------------
// identities

/// Creates the ServiceAccount `namespace/account`.
pub async fn create_service_account(client: &Client, namespace: &str, account: &str) {
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "creating ServiceAccount {namespace}/{account}: {}",
                err_msg(&e)
            )
        });
}

/// Writes a kubeconfig for the ServiceAccount `namespace/account` (a real
/// token from `kubectl create token`, valid for an hour) to `path`, with the
/// server and CA of the admin kubeconfig: an operator started with it as
/// KUBECONFIG runs as that ServiceAccount, under its RBAC, and the audit log
/// names it `system:serviceaccount:<namespace>:<account>`.
pub fn service_account_kubeconfig(namespace: &str, account: &str, path: &std::path::Path) {
    let token = service_account_token(namespace, account);
    let admin = kube::config::Kubeconfig::read().expect("reading the admin kubeconfig");
    let cluster = admin.clusters[0]
        .cluster
        .as_ref()
        .expect("a cluster in the kubeconfig");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": cluster.server,
            "certificate-authority": cluster.certificate_authority,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}],
        "current-context": "c",
    });
    std::fs::write(
        path,
        serde_yaml::to_string(&config).expect("kubeconfig as YAML"),
    )
    .expect("writing the kubeconfig");
}

/// Runs kubectl and returns its standard output; panics when it fails.
/// Blocks: not on the runtime's threads where it may take long.
pub fn kubectl(args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .output()
        .expect("kubectl on PATH (eval \"$(hack/cluster up)\")");
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A token of the ServiceAccount `namespace/account` (`kubectl create
/// token`, valid for an hour). Blocks: not on the runtime's threads.
pub fn service_account_token(namespace: &str, account: &str) -> String {
    let out = Command::new("kubectl")
        .args([
            "create",
            "token",
            account,
            "--namespace",
            namespace,
            "--duration",
            "1h",
        ])
        .output()
        .unwrap_or_else(|e| panic!("kubectl create token: cannot run: {e}"));
    assert!(
        out.status.success(),
        "kubectl create token {account} --namespace {namespace} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A kubeconfig equal to `$KUBECONFIG` but for the API server address
/// (`server`, e.g. a proxy's) and the user the requests are made as
/// (`act_as`: impersonated, with the group `system:masters`, so that the
/// audit log tells the operator's requests from the test's own by
/// `impersonatedUser`). Written under `CARGO_TARGET_TMPDIR`.
pub fn operator_kubeconfig(t: &TestNs, server: Option<&str>, act_as: Option<&str>) -> PathBuf {
    let original = std::env::var("KUBECONFIG").expect("KUBECONFIG is set");
    let text =
        std::fs::read_to_string(&original).unwrap_or_else(|e| panic!("reading {original}: {e}"));
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("a YAML kubeconfig");
    if let Some(server) = server {
        let clusters = config["clusters"]
            .as_sequence_mut()
            .expect("the kubeconfig lists clusters");
        for cluster in clusters {
            cluster["cluster"]["server"] = serde_yaml::Value::String(server.to_string());
        }
    }
    if let Some(user) = act_as {
        let users = config["users"]
            .as_sequence_mut()
            .expect("the kubeconfig lists users");
        for u in users {
            u["user"]["as"] = serde_yaml::Value::String(user.to_string());
            u["user"]["as-groups"] = serde_yaml::Value::Sequence(vec![
                serde_yaml::Value::String("system:masters".into()),
                serde_yaml::Value::String("system:authenticated".into()),
            ]);
        }
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operator-kubeconfigs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{}.kubeconfig", t.prefix, random5()));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// A client that acts as `kubeconfig` says (e.g. as the user an
/// [`operator_kubeconfig`] impersonates), for requests made as the operator.
pub async fn client_of(kubeconfig: &std::path::Path) -> Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("reading the kubeconfig {}: {e}", kubeconfig.display()));
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("the kubeconfig {}: {e}", kubeconfig.display()));
    Client::try_from(config)
        .unwrap_or_else(|e| panic!("a client for {}: {e}", kubeconfig.display()))
}

/// A user name for an operator of this test to act as (see [`operator_kubeconfig`]).
/// The operator's resident memory in KiB, from /proc. An unreadable value
/// is an error: read as 0, it would pass every bound.
pub fn rss_kib(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .ok_or_else(|| format!("{path} has no VmRSS line"))?;
    value
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .map_err(|e| format!("VmRSS {value:?} in {path}: {e}"))
}

pub fn operator_user(t: &TestNs) -> String {
    format!("copyrator-test-operator:{}", t.prefix)
}

// ---------------------------------------------------------------------------
// the operator process

/// A running `copyrator` binary; killed when dropped. Its stdout and stderr
/// go to a file under `CARGO_TARGET_TMPDIR/operator-logs/`; the end of it is
/// printed when the test fails.
pub struct Operator {
    child: Option<Child>,
    pub log_path: PathBuf,
    pub port: u16,
    pub args: Vec<String>,
}

/// A port that nothing listens on (for a test that needs a refused
/// connection; nothing binds it afterwards).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The port an operator started with `--listen-address 127.0.0.1:0` bound,
/// from its log line `serving /metrics, /healthz and /readyz` (text or
/// JSON); 0 when the process ends first (a test of a refused start). It
/// binds before it talks to the API server, so the line comes at once.
fn bound_port(log_path: &std::path::Path, child: &mut Child) -> u16 {
    const SERVING: &str = "serving /metrics, /healthz and /readyz";
    let start = Instant::now();
    loop {
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        let address = log
            .lines()
            .filter_map(|line| {
                logs::LogLine::parse_json(line)
                    .or_else(|_| logs::LogLine::parse_text(line))
                    .ok()
            })
            .find(|line| line.message == SERVING)
            .and_then(|line| line.str("address").map(str::to_owned));
        if let Some(address) = address {
            return address
                .parse::<std::net::SocketAddr>()
                .unwrap_or_else(|e| panic!("the operator's address {address:?}: {e}"))
                .port();
        }
        if matches!(child.try_wait(), Ok(Some(_))) {
            return 0;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "the operator did not say which port it bound within {TIMEOUT:?}; its log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Environment variables of the operator's flags, removed from the child's
/// environment so that only the flags the test passes count (tests/suite/cli.rs
/// checks that every variable `copyrator --help` names is here), and of
/// its libraries' debugging switches.
pub const OPERATOR_ENV: &[&str] = &[
    "NAMESPACE",
    "RULE_NAME",
    "ALL_NAMESPACES",
    "ALLOW_TENANT_CLUSTERS",
    "TENANT_IDENTITY",
    "DEFAULT_SERVICE_ACCOUNT",
    "CONSENT_BY_RIGHTS",
    "ACTING_FOR_EXTRA",
    "COPY_PROTECTION",
    "MEMBER_COPY_PROTECTION",
    "CLUSTER_NAME",
    "MEMBER_CLUSTERS",
    "ALLOW_INSECURE_MEMBERS",
    "CLUSTERPROFILE_PROVIDER_FILE",
    "ALLOW_KUBECONFIG_PLUGINS",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "LISTEN_ADDRESS",
    "LEADER_ELECTION",
    "LEASE_NAME",
    "LEASE_DURATION",
    "MARK_KEY_SECRET",
    "WRITE_CONCURRENCY",
    "MAX_SOURCE_WATCHES",
    "MAX_TENANT_SOURCE_MIB",
    "API_TRANSPORT",
    "API_QPS",
    "API_BURST",
    "RESYNC_INTERVAL",
    "STUCK_AFTER",
    "METRICS_AUTH",
    "MAX_METRICS_REVIEWS",
    "MIN_RESTART_INTERVAL",
    "KINDS",
    "DENIED_KINDS",
    "PROTECTED_NAMESPACES",
    "SECRET_TYPES",
    "STRIP_KEYS",
    "RUST_LOG",
    "KUBE_RS_DEBUG_IMPERSONATE_USER",
    "KUBE_RS_DEBUG_IMPERSONATE_GROUP",
    "KUBE_RS_DEBUG_OVERRIDE_URL",
];

/// The environment the image sets (the Dockerfile's `ENV KEY=value`
/// lines), which every operator of the tests runs with.
pub fn image_env() -> Vec<(&'static str, &'static str)> {
    include_str!("../../Dockerfile")
        .lines()
        .filter_map(|line| line.strip_prefix("ENV ")?.split_once('='))
        .collect()
}

impl Operator {
    /// `copyrator run --namespace <namespace> --listen-address 127.0.0.1:<free> <extra...>`.
    pub fn start(t: &TestNs, namespace: &str, extra: &[&str]) -> Operator {
        let mut args: Vec<String> = vec!["run".into(), "--namespace".into(), namespace.into()];
        if !extra.contains(&"--log-level") {
            args.extend(["--log-level".into(), "info".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Operator::start_with(t, args)
    }

    /// The binary with exactly `args` plus `--listen-address 127.0.0.1:0`:
    /// it binds a port the kernel picks, and [`Operator::port`] is the one
    /// its log says it bound (a port chosen here and freed for the
    /// operator to bind could be taken by someone else meanwhile).
    pub fn start_with(t: &TestNs, args: Vec<String>) -> Operator {
        Operator::start_with_env(t, args, &[])
    }

    /// As [`Operator::start_with`], with extra environment variables (e.g.
    /// a KUBECONFIG of another identity).
    pub fn start_with_env(t: &TestNs, mut args: Vec<String>, env: &[(&str, &str)]) -> Operator {
        assert_serves_only_its_own_rules(&args, env);
        args.extend(["--listen-address".into(), "127.0.0.1:0".into()]);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operator-logs");
        std::fs::create_dir_all(&dir).unwrap();
        let log_path = dir.join(format!("{}-{}.log", t.prefix, t.next_operator_id()));
        let log = File::create(&log_path).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        for var in OPERATOR_ENV {
            cmd.env_remove(var);
        }
        // As the image runs it (its ENV lines: glibc's arenas capped).
        for (key, value) in image_env() {
            cmd.env(key, value);
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} {args:?}: {e}", bin()));
        let port = bound_port(&log_path, &mut child);
        Operator {
            child: Some(child),
            log_path,
            port,
            args,
        }
    }

    pub fn logs(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log_path) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// The log of an operator run with `--log-format json`, every line
    /// parsed; panics at a line that is not JSON.
    pub fn json_log(&self) -> Vec<logs::LogLine> {
        logs::parse_json(&self.logs()).unwrap_or_else(|e| {
            panic!(
                "the operator's log {} is not JSON lines: {e}",
                self.log_path.display()
            )
        })
    }

    /// The log lines of an operator run with the text format.
    pub fn text_log(&self) -> Vec<logs::LogLine> {
        logs::parse_text(&self.logs())
    }

    /// Waits until a line of the JSON log satisfies `matches`; returns it.
    pub async fn wait_log_line(
        &self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&logs::LogLine) -> bool,
    ) -> logs::LogLine {
        wait_until(format!("the operator to log {what}"), timeout, async || {
            let lines = logs::parse_json(&self.logs())?;
            match lines.iter().find(|l| matches(l)) {
                Some(l) => Ok(l.clone()),
                None => Err(format!(
                    "{} lines, the last: {}",
                    lines.len(),
                    lines
                        .iter()
                        .rev()
                        .take(3)
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" | ")
                )),
            }
        })
        .await
    }

    fn log_tail(&self, max: u64) -> String {
        let Ok(mut f) = File::open(&self.log_path) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process still runs (and has not exited on its own).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Panics (with the log) unless the process still runs.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!(
                "the operator exited ({status}); log:\n{}",
                self.log_tail(20_000)
            );
        }
    }

    /// Waits for `GET /readyz` to answer 200.
    pub async fn wait_ready(&mut self) {
        let port = self.port;
        let start = Instant::now();
        loop {
            self.assert_running();
            let last = match http_get(port, "/readyz").await {
                Ok((200, _)) => return,
                Ok((code, body)) => format!("{code} {body}"),
                Err(e) => e,
            };
            if start.elapsed() > TIMEOUT {
                panic!(
                    "timed out after {TIMEOUT:?} waiting for the operator's /readyz on 127.0.0.1:{port}; last: {last}"
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGTERM, then SIGKILL after 10 s. Returns how the process ended
    /// (`None` when it had to be killed or was not running).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// SIGKILL: the operator dies without any chance to clean up.
    /// The exit status if the process has exited (it is then forgotten).
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.crash();
        if std::thread::panicking() {
            eprintln!(
                "----- operator {:?} log ({}), last part -----\n{}\n----- end of operator log -----",
                self.args,
                self.log_path.display(),
                self.log_tail(30_000)
            );
        }
    }
}

/// The sum of every series of the metric family `name` in Prometheus text
/// (None: no series).
pub fn metric_family(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// A minimal HTTP/1.1 GET against 127.0.0.1:port: (status code, body).
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    http_get_with(port, path, &[]).await
}

/// [`http_get`] with more request headers.
pub async fn http_get_with(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let more: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{more}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .map_err(|_| "timed out".to_string())?
}

// ---------------------------------------------------------------------------
// copyrator plan

/// Longer than every wait of `copyrator plan` itself (the API server, the
/// caches, the sources), so that its own error is what a test sees.
pub const PLAN_DEADLINE: Duration = Duration::from_secs(90);

/// A string field of a change of a JSON plan; panics naming the change
/// when it has none.
pub fn change_field(change: &Value, field: &str) -> String {
    change[field]
        .as_str()
        .unwrap_or_else(|| panic!("change {change} has no {field}"))
        .to_owned()
}

/// What `copyrator plan` printed and how it exited.
pub struct PlanOutcome {
    pub args: Vec<String>,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// One change of `copyrator plan -o json`: `(action, kind, namespace,
/// name, rule, source)`.
pub type PlannedChange = (String, String, String, String, String, Option<String>);

impl PlanOutcome {
    /// Panics, with everything printed, unless the exit code is `code`.
    pub fn assert_exit(&self, code: i32) {
        assert_eq!(
            self.code,
            Some(code),
            "copyrator {:?} exited {:?}, not {code}\n--- stdout\n{}\n--- stderr\n{}",
            self.args,
            self.code,
            self.stdout,
            self.stderr
        );
    }

    /// The `-o json` document.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "copyrator {:?} printed no JSON document ({e}):\n{}\n--- stderr\n{}",
                self.args, self.stdout, self.stderr
            )
        })
    }

    /// The document's `changes` as printed, each a JSON object.
    pub fn change_values(&self) -> Vec<Value> {
        let document = self.json();
        document["changes"]
            .as_array()
            .unwrap_or_else(|| panic!("no changes list in {document}"))
            .clone()
    }

    /// The document's `changes`, in the order printed.
    pub fn changes(&self) -> Vec<PlannedChange> {
        self.change_values()
            .iter()
            .map(|c| {
                (
                    change_field(c, "action"),
                    change_field(c, "kind"),
                    change_field(c, "namespace"),
                    change_field(c, "name"),
                    change_field(c, "rule"),
                    c.get("source").and_then(Value::as_str).map(str::to_owned),
                )
            })
            .collect()
    }

    /// The document's `changes` that concern `namespaces` (the cluster is
    /// shared: a plan of every live rule sees other tests' rules too).
    pub fn changes_in(&self, namespaces: &[&str]) -> Vec<PlannedChange> {
        self.changes()
            .into_iter()
            .filter(|c| namespaces.contains(&c.2.as_str()))
            .collect()
    }
}

/// A planned change, for comparisons with [`PlanOutcome::changes`].
pub fn change(
    action: &str,
    kind: Kind,
    namespace: &str,
    name: &str,
    rule: &str,
    source: Option<&str>,
) -> PlannedChange {
    let kind = match kind {
        Kind::ConfigMap => "ConfigMap",
        Kind::Secret => "Secret",
    };
    (
        action.into(),
        kind.into(),
        namespace.into(),
        name.into(),
        rule.into(),
        source.map(str::to_owned),
    )
}

/// Runs `copyrator plan <args>` with `stdin` on its standard input (none
/// when `None`), killed after [`PLAN_DEADLINE`].
pub async fn copyrator_plan(args: &[&str], stdin: Option<&str>) -> PlanOutcome {
    let mut all = vec!["plan"];
    all.extend(args);
    copyrator(&all, stdin).await
}

/// Runs `copyrator <args>` (a subcommand and its arguments) without the
/// operator's environment variables, with `stdin` on its standard input
/// (none when `None`), killed after [`PLAN_DEADLINE`].
pub async fn copyrator(args: &[&str], stdin: Option<&str>) -> PlanOutcome {
    use tokio::io::AsyncWriteExt;
    let all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut command = tokio::process::Command::new(bin());
    command
        .args(&all)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in OPERATOR_ENV {
        command.env_remove(var);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {all:?}: {e}", bin()));
    if let Some(text) = stdin {
        let mut input = child.stdin.take().expect("a piped standard input");
        input
            .write_all(text.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("writing to the standard input of {all:?}: {e}"));
        // Closed here: the plan reads to the end.
    }
    let output = tokio::time::timeout(PLAN_DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("copyrator {all:?} did not finish within {PLAN_DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("waiting for copyrator {all:?}: {e}"));
    PlanOutcome {
        args: all,
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

// ---------------------------------------------------------------------------
// rule bodies

/// `{"spec": {"ruleType", "selector", "targets": {"include"}}}`.
pub fn rule_spec<S: AsRef<str>>(kind: Kind, selector: Value, include: &[S]) -> Value {
    let include: Vec<&str> = include.iter().map(AsRef::as_ref).collect();
    json!({"spec": {"ruleType": kind.rule_type(), "selector": selector, "targets": {"include": include}}})
}

/// Sets the field at a `/`-separated path, creating objects on the way.
pub fn with(mut v: Value, path: &str, value: Value) -> Value {
    let mut cur = &mut v;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for (i, p) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        if i == parts.len() - 1 {
            cur[*p] = value;
            break;
        }
        cur = cur
            .as_object_mut()
            .unwrap()
            .entry(p.to_string())
            .or_insert_with(|| json!({}));
    }
    v
}

/// The ConfigMap `ns/name` in the cluster of `client`.
pub async fn config_map_in(client: &Client, ns: &str, name: &str) -> Result<ConfigMap, String> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| err_msg(&e))?
        .ok_or_else(|| format!("no {ns}/{name}"))
}

/// Waits up to `within` until the ConfigMap `ns/name` in the cluster of
/// `client` holds `value` under `key`; it as then.
pub async fn wait_config_map_at(
    client: &Client,
    (ns, name): (&str, &str),
    (key, value): (&str, &str),
    within: Duration,
) -> ConfigMap {
    wait_until(
        format!("{ns}/{name} with {key}={value}"),
        within,
        async || {
            let copy = config_map_in(client, ns, name).await?;
            match copy.data.as_ref().and_then(|d| d.get(key)) {
                Some(v) if v == value => Ok(copy),
                other => Err(format!("{key}={other:?}")),
            }
        },
    )
    .await
}
