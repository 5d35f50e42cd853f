//! Copyrator's marks: what only this installation can produce, so that
//! nobody else can make an object pass for one of its copies or read a
//! copy's content back from the restart annotation.
//!
//! Each copy carries the annotation `copyrator.flant.com/mark:
//! <identity>.<content>`, two HMAC-SHA-256 tags (32 hex digits each) under
//! a per-installation key kept in a Secret of the operator's namespace:
//!
//! - *identity* covers the kind, namespace, name and the rule
//!   (`namespace/name`) of the copy: Copyrator made a copy of this rule at
//!   this place. An object without it is not Copyrator's copy, whatever its
//!   labels and field managers say. Carried over to an object made again
//!   at the same place it proves nothing more than that.
//! - *content* covers the same and the payload: this payload is what
//!   Copyrator wrote there. Only such content is handed on to other
//!   namespaces (a staged rollout's earlier content).
//!
//! The restart annotation's value is a tag of what a workload uses under
//! the same key, so that a reader of the workload learns nothing of the
//! Secret's values.
//!
//! The key is installed once per process ([`install`]), before anything
//! is decoded; until then no mark proves anything. The command-line
//! tools, which may not read the operator's Secret, take a well-formed
//! mark for what it says instead ([`trust_unchecked`]) and hash restart
//! values without a key: what they print is a preview.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use ring::hmac;
use serde_json::Value;

use crate::api::kinds::Kind;

/// The key's least length, in bytes.
pub(crate) const KEY_BYTES: usize = 32;
/// Hex digits of each tag in a mark.
const TAG_DIGITS: usize = 32;

/// The per-installation key.
pub(crate) struct MarkKey(hmac::Key);

/// A key of fewer than [`KEY_BYTES`] bytes.
#[derive(Debug, thiserror::Error)]
#[error("the mark key has {0} bytes; at least {KEY_BYTES} are needed")]
pub(crate) struct KeyTooShort(pub usize);

impl MarkKey {
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, KeyTooShort> {
        if bytes.len() < KEY_BYTES {
            return Err(KeyTooShort(bytes.len()));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }
}

/// How this process checks marks.
enum Checking {
    /// Under the installation's key (the operator).
    Key(MarkKey),
    /// Not at all: a well-formed mark is taken for what it says (the
    /// command-line previews, which may not read the key).
    Unchecked,
}

static CHECKING: OnceLock<Checking> = OnceLock::new();

/// Install this process's key; `false` if a way of checking was chosen
/// before (the first stays).
pub(crate) fn install(key: MarkKey) -> bool {
    CHECKING.set(Checking::Key(key)).is_ok()
}

/// Take well-formed marks for what they say, for a process that cannot
/// read the key (`plan`, `where`, `release`). Until a process chooses,
/// no mark proves anything.
pub(crate) fn trust_unchecked() -> bool {
    CHECKING.set(Checking::Unchecked).is_ok()
}

fn checking() -> Option<&'static Checking> {
    // Unit tests all run under one fixed key, whatever order they run in.
    #[cfg(test)]
    install_test_key();
    CHECKING.get()
}

fn key() -> Option<&'static MarkKey> {
    match checking() {
        Some(Checking::Key(key)) => Some(key),
        _ => None,
    }
}

/// Where a copy is, and for which rule (`namespace/name`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place<'a> {
    pub(crate) kind: Kind,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    pub(crate) rule: &'a str,
}

/// Feeds parts to an HMAC, each prefixed by its length, so that no two
/// different sequences of parts feed the same bytes.
struct Feed(hmac::Context);

impl Feed {
    fn new(key: &MarkKey, domain: &str) -> Self {
        let mut feed = Self(hmac::Context::with_key(&key.0));
        feed.part(domain.as_bytes());
        feed
    }

    fn part(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
    }

    fn place(mut self, place: &Place<'_>) -> Self {
        for part in [place.kind.name(), place.namespace, place.name, place.rule] {
            self.part(part.as_bytes());
        }
        self
    }

    /// A JSON value in a canonical form: object keys sorted, every part
    /// tagged with its type.
    fn value(&mut self, value: &Value) {
        match value {
            Value::Null => self.part(b"n"),
            Value::Bool(b) => self.part(if *b { b"t" } else { b"f" }),
            Value::Number(n) => {
                self.part(b"#");
                self.part(n.to_string().as_bytes());
            }
            Value::String(s) => {
                self.part(b"s");
                self.part(s.as_bytes());
            }
            Value::Array(items) => {
                self.part(b"[");
                self.part(&(items.len() as u64).to_be_bytes());
                for item in items {
                    self.value(item);
                }
            }
            Value::Object(map) => {
                self.part(b"{");
                self.part(&(map.len() as u64).to_be_bytes());
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                for key in keys {
                    self.part(key.as_bytes());
                    self.value(&map[key]);
                }
            }
        }
    }

    fn payload(mut self, payload: &BTreeMap<String, Value>) -> Self {
        self.part(&(payload.len() as u64).to_be_bytes());
        for (field, value) in payload {
            self.part(field.as_bytes());
            self.value(value);
        }
        self
    }

    fn hex(self) -> String {
        hex(self.0.sign().as_ref(), TAG_DIGITS)
    }
}

/// The first `digits` hex digits of `bytes`.
pub(crate) fn hex(bytes: &[u8], digits: usize) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]])
        .take(digits)
        .map(char::from)
        .collect()
}

/// What signs a key Secret's uid: raw text, so that an administrator can
/// make it with `openssl dgst -sha256 -mac HMAC` (docs/trust.md). No tag
/// of [`Feed`] begins so (a feed begins with a length, a zero byte first).
fn key_proof_message(uid: &str) -> String {
    format!("copyrator-mark-key:{uid}")
}

/// The proof that the key Secret of this `uid` was made by whoever held
/// `key` after the API server gave the Secret its uid: HMAC-SHA-256 of
/// `copyrator-mark-key:<uid>` under the key, 64 hex digits. Whoever can
/// only have a Secret created (a copying tool writing on a source owner's
/// say, a create-only grant) learns neither the uid in time nor may write
/// it afterwards.
pub(crate) fn key_proof(key: &MarkKey, uid: &str) -> String {
    hex(
        hmac::sign(&key.0, key_proof_message(uid).as_bytes()).as_ref(),
        64,
    )
}

/// Whether `proof` is [`key_proof`] of `uid` under `key` (compared in
/// constant time).
pub(crate) fn proves(key: &MarkKey, uid: &str, proof: &str) -> bool {
    if proof.len() != 64 || !proof.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    let tag: Option<Vec<u8>> = proof
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect();
    tag.is_some_and(|tag| hmac::verify(&key.0, key_proof_message(uid).as_bytes(), &tag).is_ok())
}

fn identity_tag(key: &MarkKey, place: &Place<'_>) -> String {
    Feed::new(key, "copyrator copy").place(place).hex()
}

fn content_tag(key: &MarkKey, place: &Place<'_>, payload: &BTreeMap<String, Value>) -> String {
    Feed::new(key, "copyrator content")
        .place(place)
        .payload(payload)
        .hex()
}

/// The mark of a copy at `place` holding `payload`, under `key`.
pub(crate) fn sign_with(
    key: &MarkKey,
    place: &Place<'_>,
    payload: &BTreeMap<String, Value>,
) -> String {
    format!(
        "{}.{}",
        identity_tag(key, place),
        content_tag(key, place, payload)
    )
}

/// The mark of a copy at `place` holding `payload`; `None` without a key.
pub(crate) fn sign(place: &Place<'_>, payload: &BTreeMap<String, Value>) -> Option<String> {
    key().map(|key| sign_with(key, place, payload))
}

/// What a mark proves of an object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Copyrator made a copy of this rule at this place.
    pub(crate) identity: bool,
    /// And this payload is what it wrote there.
    pub(crate) content: bool,
}

/// Constant-time equality of two tags.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn well_formed(tag: &str) -> bool {
    tag.len() == TAG_DIGITS && tag.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What `mark` (the annotation's value, if any) proves of an object at
/// `place` holding `payload`, under `key`.
pub(crate) fn verify_with(
    key: Option<&MarkKey>,
    place: &Place<'_>,
    payload: &BTreeMap<String, Value>,
    mark: Option<&str>,
) -> Verdict {
    let Some((identity, content)) = mark.and_then(|m| m.split_once('.')) else {
        return Verdict::default();
    };
    if !well_formed(identity) || !well_formed(content) {
        return Verdict::default();
    }
    let Some(key) = key else {
        // No key to check against (a command-line preview): taken as said.
        return Verdict {
            identity: true,
            content: true,
        };
    };
    if !same(identity, &identity_tag(key, place)) {
        return Verdict::default();
    }
    Verdict {
        identity: true,
        content: same(content, &content_tag(key, place, payload)),
    }
}

/// What `mark` proves of an object at `place` holding `payload`: nothing
/// before this process chose how to check marks.
pub(crate) fn verify(
    place: &Place<'_>,
    payload: &BTreeMap<String, Value>,
    mark: Option<&str>,
) -> Verdict {
    match checking() {
        Some(Checking::Key(key)) => verify_with(Some(key), place, payload, mark),
        Some(Checking::Unchecked) => verify_with(None, place, payload, mark),
        None => Verdict::default(),
    }
}

/// The restart annotation's value for `used` (the canonical text of what a
/// workload uses of a copy): a tag under `key`, or without a key a plain
/// SHA-256 (as before keys existed), each of 32 hex digits.
pub(crate) fn restart_value_with(key: Option<&MarkKey>, used: &str) -> String {
    match key {
        Some(key) => {
            let mut feed = Feed::new(key, "copyrator restart");
            feed.part(used.as_bytes());
            feed.hex()
        }
        None => unkeyed_restart_value(used),
    }
}

/// [`restart_value_with`] this process's key.
pub(crate) fn restart_value(used: &str) -> String {
    restart_value_with(key(), used)
}

/// The value a workload carries from before restart values were keyed:
/// taken as current while what it uses is unchanged, so that keying rolls
/// no workload.
pub(crate) fn unkeyed_restart_value(used: &str) -> String {
    hex(
        ring::digest::digest(&ring::digest::SHA256, used.as_bytes()).as_ref(),
        TAG_DIGITS,
    )
}

/// A fixed key for unit tests, installed once per test process.
#[cfg(test)]
pub(crate) fn install_test_key() {
    let _ = CHECKING.get_or_init(|| Checking::Key(test_key(7)));
}

#[cfg(test)]
pub(crate) fn test_key(seed: u8) -> MarkKey {
    MarkKey::from_bytes(&[seed; KEY_BYTES]).expect("a key of KEY_BYTES")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payload(value: Value) -> BTreeMap<String, Value> {
        BTreeMap::from([("data".to_owned(), value)])
    }

    const PLACE: Place<'static> = Place {
        kind: Kind::ConfigMap,
        namespace: "team-a",
        name: "trust-bundle",
        rule: "platform/r",
    };

    #[test]
    fn a_key_proof_binds_the_key_to_one_uid() {
        let key = test_key(1);
        let proof = key_proof(&key, "uid-1");
        assert_eq!(proof.len(), 64);
        assert!(proves(&key, "uid-1", &proof));
        assert!(!proves(&key, "uid-2", &proof), "another Secret's uid");
        assert!(!proves(&test_key(2), "uid-1", &proof), "another key");
        assert!(!proves(&key, "uid-1", &proof.to_uppercase()[..63]));
        assert!(!proves(&key, "uid-1", ""));
        // Not hex, and not ASCII (a slice at a byte would panic).
        assert!(!proves(&key, "uid-1", &"zz".repeat(32)));
        assert!(!proves(&key, "uid-1", &"é".repeat(32)));
        // Hex of either case is read (an administrator's openssl prints
        // lower case; nothing forbids upper).
        assert!(proves(&key, "uid-1", &proof.to_uppercase()));
        // The documented recipe: HMAC-SHA-256 of the raw text.
        let raw = hmac::sign(&key.0, b"copyrator-mark-key:uid-1");
        assert_eq!(proof, hex(raw.as_ref(), 64));
    }

    #[test]
    fn a_mark_proves_the_place_and_the_content_under_its_key_only() {
        let key = test_key(1);
        let good = payload(json!({"ca.crt": "GOOD"}));
        let mark = sign_with(&key, &PLACE, &good);
        let verdict = |key: &MarkKey, place: &Place<'_>, payload, mark: &str| {
            verify_with(Some(key), place, payload, Some(mark))
        };
        assert_eq!(
            verdict(&key, &PLACE, &good, &mark),
            Verdict {
                identity: true,
                content: true
            }
        );
        // Edited content: still the copy, no longer Copyrator's content.
        let evil = payload(json!({"ca.crt": "EVIL"}));
        assert_eq!(
            verdict(&key, &PLACE, &evil, &mark),
            Verdict {
                identity: true,
                content: false
            }
        );
        // Carried to another place or rule, or checked under another key:
        // proves nothing.
        for place in [
            Place {
                namespace: "team-b",
                ..PLACE
            },
            Place {
                name: "other",
                ..PLACE
            },
            Place {
                rule: "platform/other",
                ..PLACE
            },
            Place {
                kind: Kind::Secret,
                ..PLACE
            },
        ] {
            assert_eq!(verdict(&key, &place, &good, &mark), Verdict::default());
        }
        assert_eq!(
            verdict(&test_key(2), &PLACE, &good, &mark),
            Verdict::default()
        );
    }

    #[test]
    fn what_is_not_a_well_formed_mark_proves_nothing_even_without_a_key() {
        let good = payload(json!({"k": "v"}));
        for mark in [
            None,
            Some(""),
            Some("abc"),
            Some("x.y"),
            Some(&*"0".repeat(65)),
        ] {
            assert_eq!(verify_with(None, &PLACE, &good, mark), Verdict::default());
        }
        let forged = format!("{}.{}", "0".repeat(32), "0".repeat(32));
        assert!(verify_with(None, &PLACE, &good, Some(&forged)).content);
        assert_eq!(
            verify_with(Some(&test_key(1)), &PLACE, &good, Some(&forged)),
            Verdict::default()
        );
    }

    #[test]
    fn content_is_canonical_whatever_order_keys_arrived_in_and_tells_types_apart() {
        let key = test_key(1);
        let a: Value =
            serde_json::from_str(r#"{"x": "1", "y": {"b": 1, "a": [true]}}"#).expect("json");
        let b: Value =
            serde_json::from_str(r#"{"y": {"a": [true], "b": 1}, "x": "1"}"#).expect("json");
        assert_eq!(
            sign_with(&key, &PLACE, &payload(a)),
            sign_with(&key, &PLACE, &payload(b))
        );
        assert_ne!(
            sign_with(&key, &PLACE, &payload(json!({"x": "1"}))),
            sign_with(&key, &PLACE, &payload(json!({"x": 1})))
        );
        // Length prefixes: moving a boundary between parts changes the tag.
        assert_ne!(
            sign_with(&key, &PLACE, &payload(json!({"ab": "c"}))),
            sign_with(&key, &PLACE, &payload(json!({"a": "bc"})))
        );
    }

    #[test]
    fn a_keyed_restart_value_is_not_the_plain_hash_and_depends_on_the_key() {
        let used = "whole;4:data3:pin4:4821";
        let plain = unkeyed_restart_value(used);
        assert_eq!(restart_value_with(None, used), plain);
        let keyed = restart_value_with(Some(&test_key(1)), used);
        assert_eq!(keyed.len(), 32);
        assert_ne!(keyed, plain);
        assert_ne!(keyed, restart_value_with(Some(&test_key(2)), used));
        assert_eq!(keyed, restart_value_with(Some(&test_key(1)), used));
    }
}
