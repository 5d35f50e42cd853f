//! The installation's mark key (see `cache::mark`): read from a Secret in
//! the operator's namespace, made there with fresh random bytes by the
//! first process that finds none. Every replica reads the same Secret, so
//! all sign and check with one key; the Secret outlives upgrades, and
//! deleting it makes every copy unproven until it is marked again.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Error as KubeError};
use ring::rand::{SecureRandom, SystemRandom};
use tracing::{info, warn};

use crate::cache::mark::{KEY_BYTES, MarkKey};
use crate::error::describe;

/// The Secret's data key that holds the key.
pub(crate) const DATA_KEY: &str = "key";
/// The longest pause between tries of a request the API server did not
/// answer (they start a second apart and double).
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// Tries in a row that find the Secret made and gone again before the
/// operator gives up.
const TRIES: u32 = 6;

#[derive(Debug, thiserror::Error)]
pub(crate) enum MarkKeyError {
    #[error("reading or creating the mark key Secret {namespace}/{name}: {message}")]
    Api {
        namespace: String,
        name: String,
        message: String,
    },
    #[error(
        "the mark key Secret {namespace}/{name} holds no usable key under data.{DATA_KEY}: {why}; \
         delete it to have a new key made (every copy is then marked again)"
    )]
    Unusable {
        namespace: String,
        name: String,
        why: String,
    },
    #[error("no random bytes for a new mark key")]
    Random,
}

/// The API server did not answer, failed or throttled: as a write would
/// be retried.
fn transient(err: &KubeError) -> bool {
    use crate::core::backoff::FailureClass;
    matches!(
        crate::cluster::writer::classify(err).class,
        FailureClass::Transient | FailureClass::Throttled
    )
}

/// The key in Secret `namespace/name`, made if there is none.
pub(crate) async fn load_or_create(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<MarkKey, MarkKeyError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let api_error = |err: &KubeError| MarkKeyError::Api {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        message: describe(err),
    };
    // Drawn before they may be needed: a process that cannot draw random
    // bytes cannot start safely, whether or not the Secret exists.
    let mut fresh = vec![0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut fresh)
        .map_err(|_| MarkKeyError::Random)?;
    let mut pause = Duration::from_secs(1);
    let mut raced = 0;
    while raced < TRIES {
        match read_or_make(&api, name, &fresh).await {
            Ok(Some(secret)) => return key_of(&secret, namespace, name),
            // Made by another replica meanwhile: read it.
            Ok(None) => raced += 1,
            // The API server did not answer: nothing works without it,
            // so wait for it as every watch does.
            Err(err) if transient(&err) => {
                warn!(
                    namespace,
                    secret = name,
                    error = describe(&err).as_str(),
                    "the mark key cannot be read yet; trying again"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(err) => return Err(api_error(&err)),
        }
    }
    Err(MarkKeyError::Api {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        message: "created and gone again meanwhile, each time".to_owned(),
    })
}

/// The Secret, made if absent; `None` when another process made it first.
async fn read_or_make(
    api: &Api<Secret>,
    name: &str,
    fresh: &[u8],
) -> Result<Option<Secret>, KubeError> {
    if let Some(secret) = api.get_opt(name).await? {
        return Ok(Some(secret));
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                crate::LABEL_MANAGED_BY.to_owned(),
                crate::FIELD_MANAGER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            DATA_KEY.to_owned(),
            ByteString(fresh.to_vec()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    };
    let params = PostParams {
        field_manager: Some(crate::FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, &secret).await {
        Ok(created) => {
            info!(secret = name, "made a new mark key");
            Ok(Some(created))
        }
        Err(KubeError::Api(status)) if status.code == 409 => Ok(None),
        Err(err) => Err(err),
    }
}

fn key_of(secret: &Secret, namespace: &str, name: &str) -> Result<MarkKey, MarkKeyError> {
    let unusable = |why: String| MarkKeyError::Unusable {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        why,
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(DATA_KEY))
        .ok_or_else(|| unusable("it is missing".to_owned()))?;
    MarkKey::from_bytes(&bytes.0).map_err(|e| unusable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: Option<Vec<u8>>) -> Secret {
        Secret {
            data: data.map(|d| BTreeMap::from([(DATA_KEY.to_owned(), ByteString(d))])),
            ..Secret::default()
        }
    }

    #[test]
    fn a_missing_or_short_key_is_refused_saying_so_without_its_bytes() {
        let err = |s: &Secret| key_of(s, "op", "k").err().map(|e| e.to_string());
        assert!(key_of(&secret(Some(vec![9; KEY_BYTES])), "op", "k").is_ok());
        let missing = err(&secret(None)).unwrap_or_default();
        assert!(
            missing.contains("op/k") && missing.contains("it is missing"),
            "{missing}"
        );
        let short = err(&secret(Some(vec![9; 5]))).unwrap_or_default();
        assert!(short.contains("has 5 bytes"), "{short}");
        assert!(
            !short.contains("9, 9"),
            "no key bytes in the message: {short}"
        );
    }
}
