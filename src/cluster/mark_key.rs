//! The installation's mark key (see `cache::mark`): kept in a Secret of
//! the operator's namespace, made there with fresh random bytes by the
//! first process that finds none. Every replica reads the same Secret, so
//! all sign and check with one key; the Secret outlives upgrades, and
//! deleting it makes every copy unproven until it is marked again.
//!
//! Only a Secret the operator made counts. Whoever may have a Secret of
//! that name created in the operator's namespace would otherwise choose
//! the key, and with it forge every mark: a tenant, through a copying
//! tool that writes where a source's owner says (or through a rule of
//! Copyrator's own that copies into this namespace), before the
//! operator's first start or after the key was deleted. So the operator
//! proves its own: once the API server gave the Secret it created a uid,
//! it writes beside the key a tag of that uid under the key
//! (`copyrator.flant.com/mark-key-proof`, [`crate::cache::mark::key_proof`]).
//! Such a writer never learns the uid in time, nor may write the Secret
//! afterwards. Anyone who may read or update Secrets there could read the
//! key anyway; this does not defend against them.
//!
//! A Secret without a valid proof (planted, made by an administrator
//! without one, or holding no usable key) is reported (a warning and
//! `copyrator_mark_key_refused_total`) and replaced by a new key: deleted,
//! on the condition that it is still the Secret judged, and made again.
//! Nothing about it is fatal: what the API server refuses (RBAC, say) is
//! reported and tried again, doubling the pause up to 30 s, and the
//! operator stays alive meanwhile, not ready.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Error as KubeError;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use ring::rand::{SecureRandom, SystemRandom};
use tracing::{info, warn};

use crate::cache::mark::{self, KEY_BYTES, MarkKey};
use crate::error::describe;
use crate::ops::http::Health;
use crate::ops::metrics::Metrics;

/// The Secret's data key that holds the key.
pub(crate) const DATA_KEY: &str = "key";
/// The longest pause between tries after a failure.
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// How long a Secret without a proof is given before it is judged: the
/// replica that made it may be between its create and its proof.
const GRACE: Duration = Duration::from_secs(2);
/// Rounds in a row that find the Secret changed under them before a
/// pause.
const RACES: u32 = 6;

#[derive(Debug, thiserror::Error)]
pub(crate) enum MarkKeyError {
    #[error("no random bytes for a new mark key")]
    Random,
    #[error("the new mark key: {0}")]
    Fresh(#[from] mark::KeyTooShort),
}

/// Why a round failed: the API server's answer, or this process's key.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Api(#[from] KubeError),
    #[error(transparent)]
    Key(#[from] MarkKeyError),
}

/// The key of this process's fresh bytes (of [`KEY_BYTES`]: never short).
fn fresh_key(fresh: &[u8]) -> Result<MarkKey, MarkKeyError> {
    Ok(MarkKey::from_bytes(fresh)?)
}

/// Why a key Secret is not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    /// It holds no key of [`KEY_BYTES`] under [`DATA_KEY`].
    Unusable(String),
    /// It carries no proof that the operator made it.
    Unproven,
    /// Its proof is not of its uid under its key.
    ProofMismatch,
}

impl Refusal {
    fn reason(&self) -> String {
        match self {
            Refusal::Unusable(why) => {
                format!("it holds no usable key under data.{DATA_KEY}: {why}")
            }
            Refusal::Unproven => format!(
                "it carries no {} (the operator writes one on the Secret it made)",
                crate::ANNOTATION_MARK_KEY_PROOF
            ),
            Refusal::ProofMismatch => format!(
                "its {} is not of this Secret's uid under its key",
                crate::ANNOTATION_MARK_KEY_PROOF
            ),
        }
    }
}

/// The key of a Secret the operator made, or why it is refused.
fn proven_key(secret: &Secret) -> Result<MarkKey, Refusal> {
    let key = key_of(secret)?;
    let proof = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::ANNOTATION_MARK_KEY_PROOF))
        .ok_or(Refusal::Unproven)?;
    let uid = secret.metadata.uid.as_deref().unwrap_or_default();
    match !uid.is_empty() && mark::proves(&key, uid, proof) {
        true => Ok(key),
        false => Err(Refusal::ProofMismatch),
    }
}

fn key_bytes(secret: &Secret) -> Option<&[u8]> {
    secret
        .data
        .as_ref()
        .and_then(|data| data.get(DATA_KEY))
        .map(|bytes| bytes.0.as_slice())
}

fn key_of(secret: &Secret) -> Result<MarkKey, Refusal> {
    let bytes = key_bytes(secret).ok_or_else(|| Refusal::Unusable("it is missing".to_owned()))?;
    MarkKey::from_bytes(bytes).map_err(|e| Refusal::Unusable(e.to_string()))
}

/// What one round found.
enum Round {
    Key(MarkKey),
    /// The Secret changed under this round: look again at once.
    Raced,
    /// A Secret without a valid proof, seen for the first time: look again
    /// after [`GRACE`].
    Grace,
}

/// Where the rounds of [`load_or_create`] are.
struct Rounds<'a> {
    api: Api<Secret>,
    namespace: &'a str,
    name: &'a str,
    /// Fresh random bytes, for the Secret this process makes.
    fresh: Vec<u8>,
    /// The uid of the Secret this process made and has not proven yet.
    made: Option<String>,
    /// The uid of a Secret without a valid proof, seen before (by uid: a
    /// Secret that keeps changing is judged all the same).
    judged: Option<String>,
    /// The uid of the Secret last reported refused (each is reported once).
    reported: Option<String>,
    metrics: &'a Metrics,
}

/// The key in Secret `namespace/name`, made if there is none (or replaced,
/// if the one there was not made by the operator). Returns only once it
/// has one; every failure meanwhile is logged and counts as progress for
/// `/healthz` (the operator waits, it is not stuck).
pub(crate) async fn load_or_create(
    cluster: &crate::cluster::context::Cluster,
    namespace: &str,
    name: &str,
    metrics: &Metrics,
    health: &Health,
) -> Result<MarkKey, MarkKeyError> {
    // Drawn before they may be needed: a process that cannot draw random
    // bytes cannot start safely, whether or not the Secret exists.
    let mut fresh = vec![0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut fresh)
        .map_err(|_| MarkKeyError::Random)?;
    let mut rounds = Rounds {
        api: Api::namespaced(cluster.client.clone(), namespace),
        namespace,
        name,
        fresh,
        made: None,
        judged: None,
        reported: None,
        metrics,
    };
    let mut pause = Duration::from_secs(1);
    let mut raced = 0;
    loop {
        health.progressed();
        match rounds.round().await {
            Ok(Round::Key(key)) => return Ok(key),
            Ok(Round::Raced) if raced < RACES => raced += 1,
            Ok(Round::Raced) => {
                warn!(
                    namespace,
                    secret = name,
                    "the mark key Secret keeps changing meanwhile; trying again"
                );
                raced = 0;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Ok(Round::Grace) => tokio::time::sleep(GRACE).await,
            Err(RoundError::Key(err)) => return Err(err),
            Err(RoundError::Api(err)) => {
                warn!(
                    namespace,
                    secret = name,
                    error = describe(&err).as_str(),
                    "the mark key cannot be read or made yet; trying again"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}

impl Rounds<'_> {
    async fn round(&mut self) -> Result<Round, RoundError> {
        let Some(secret) = self.api.get_opt(self.name).await.map_err(RoundError::Api)? else {
            return self.make().await;
        };
        let refusal = match proven_key(&secret) {
            Ok(key) => return Ok(Round::Key(key)),
            Err(refusal) => refusal,
        };
        let uid = secret.metadata.uid.clone().unwrap_or_default();
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        // The one this process made, as it made it: prove it.
        if refusal == Refusal::Unproven
            && self.made.as_deref() == Some(uid.as_str())
            && key_bytes(&secret) == Some(self.fresh.as_slice())
        {
            return self.prove(secret).await;
        }
        if self.judged.as_deref() != Some(uid.as_str()) {
            self.judged = Some(uid);
            return Ok(Round::Grace);
        }
        if self.reported.as_deref() != Some(uid.as_str()) {
            self.reported = Some(uid.clone());
            self.metrics.mark_key_refused.inc();
            warn!(
                namespace = self.namespace,
                secret = self.name,
                reason = refusal.reason().as_str(),
                "the mark key Secret was not made by this operator; it is replaced by a new key \
                 (every copy is marked again)"
            );
        }
        // On the condition that it did not change since this round read it: a
        // sibling replica's proof, landed meanwhile, makes it the key.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: Some(version),
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(self.name, &params).await {
            Ok(_) => Ok(Round::Raced),
            Err(KubeError::Api(status)) if status.code == 404 || status.code == 409 => {
                Ok(Round::Raced)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// A new Secret with the fresh key; proven at once.
    async fn make(&mut self) -> Result<Round, RoundError> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.name.to_owned()),
                labels: Some(BTreeMap::from([(
                    crate::LABEL_MANAGED_BY.to_owned(),
                    crate::FIELD_MANAGER.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                DATA_KEY.to_owned(),
                ByteString(self.fresh.clone()),
            )])),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        };
        match self.api.create(&post_params(), &secret).await {
            Ok(created) => {
                self.made = created.metadata.uid.clone();
                self.prove(created).await
            }
            // Made by another replica meanwhile: read it.
            Err(KubeError::Api(status)) if status.code == 409 => Ok(Round::Raced),
            Err(err) => Err(err.into()),
        }
    }

    /// `secret` (made by this process, holding its fresh key) with the
    /// proof of its uid, written on the condition that it did not change.
    async fn prove(&mut self, mut secret: Secret) -> Result<Round, RoundError> {
        let uid = secret.metadata.uid.clone().unwrap_or_default();
        let key = fresh_key(&self.fresh)?;
        secret.metadata.managed_fields = None;
        secret
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                crate::ANNOTATION_MARK_KEY_PROOF.to_owned(),
                mark::key_proof(&key, &uid),
            );
        match self.api.replace(self.name, &post_params(), &secret).await {
            Ok(_) => {
                info!(
                    namespace = self.namespace,
                    secret = self.name,
                    "made a new mark key"
                );
                self.made = None;
                Ok(Round::Key(key))
            }
            Err(KubeError::Api(status)) if status.code == 404 || status.code == 409 => {
                Ok(Round::Raced)
            }
            Err(err) => Err(err.into()),
        }
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(crate::FIELD_MANAGER.into()),
        ..PostParams::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(uid: &str, data: Option<Vec<u8>>, proof: Option<String>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                annotations: proof
                    .map(|p| BTreeMap::from([(crate::ANNOTATION_MARK_KEY_PROOF.to_owned(), p)])),
                ..ObjectMeta::default()
            },
            data: data.map(|d| BTreeMap::from([(DATA_KEY.to_owned(), ByteString(d))])),
            ..Secret::default()
        }
    }

    fn proof(seed: u8, uid: &str) -> String {
        let key = MarkKey::from_bytes(&[seed; KEY_BYTES]).expect("a key");
        mark::key_proof(&key, uid)
    }

    #[test]
    fn only_a_secret_proven_for_its_own_uid_gives_its_key() {
        let key = vec![9; KEY_BYTES];
        assert!(proven_key(&secret("u1", Some(key.clone()), Some(proof(9, "u1")))).is_ok());
        let refusal = |s: &Secret| proven_key(s).err();
        // Planted: a key and no proof, or a proof of another Secret's uid
        // (copied along with the key), or under another key.
        assert_eq!(
            refusal(&secret("u1", Some(key.clone()), None)),
            Some(Refusal::Unproven)
        );
        assert_eq!(
            refusal(&secret("u2", Some(key.clone()), Some(proof(9, "u1")))),
            Some(Refusal::ProofMismatch)
        );
        assert_eq!(
            refusal(&secret("u1", Some(key.clone()), Some(proof(8, "u1")))),
            Some(Refusal::ProofMismatch)
        );
        assert_eq!(
            refusal(&secret("u1", Some(key), Some("not a proof".into()))),
            Some(Refusal::ProofMismatch)
        );
        assert_eq!(
            refusal(&secret("", Some(vec![9; KEY_BYTES]), Some(proof(9, "")))),
            Some(Refusal::ProofMismatch),
            "a Secret without a uid proves nothing"
        );
    }

    #[test]
    fn a_missing_or_short_key_is_refused_saying_so_without_its_bytes() {
        let reason = |s: &Secret| proven_key(s).err().map(|r| r.reason());
        let missing = reason(&secret("u1", None, None)).unwrap_or_default();
        assert!(missing.contains("it is missing"), "{missing}");
        let short =
            reason(&secret("u1", Some(vec![9; 5]), Some(proof(9, "u1")))).unwrap_or_default();
        assert!(short.contains("has 5 bytes"), "{short}");
        assert!(
            !short.contains("9, 9"),
            "no key bytes in the message: {short}"
        );
    }
}
