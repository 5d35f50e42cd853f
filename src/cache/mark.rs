//! Copyrator's marks: what only this installation can produce, so that
//! nobody else can make an object pass for one of its copies or read a
//! copy's content back from the restart annotation.
//!
//! Each copy carries the annotation `copyrator.flant.com/mark:
//! <identity>.<owner>.<content>`, three HMAC-SHA-256 tags (32 hex digits
//! each) under a per-installation key kept in a Secret of the operator's
//! namespace:
//!
//! - *identity* covers the kind, namespace, name and the rule
//!   (`namespace/name`) of the copy: Copyrator made a copy of this rule at
//!   this place. An object without it is not Copyrator's copy, whatever its
//!   labels and field managers say. Carried over to an object made again
//!   at the same place it proves nothing more than that.
//! - *owner* covers the same and the rule's UID (the
//!   `copyrator.flant.com/rule-uid` label it was written with): which rule
//!   the copy belongs to. A label anyone who may edit the copy can change
//!   decides nothing by itself; relabelled, the copy belongs to no rule's
//!   UID, and stays a copy of the rule its identity names.
//! - *content* covers the place, the rule's UID and the payload: this
//!   payload is what Copyrator wrote there for that rule. Only such content
//!   is handed on to other namespaces (a staged rollout's earlier content).
//!
//! A mark of the earlier form `<identity>.<content>` (without the owner)
//! proves the identity alone: such a copy belongs to no rule's UID and its
//! content to no rule, until its rule (the one its identity names) takes
//! it back by a write that marks it anew.
//!
//! The restart annotation's value is a tag under the same key of what a
//! workload uses, where it uses it (the copy's kind, namespace and name,
//! and the workload's): a reader of the workload learns nothing of the
//! Secret's values, and nobody can have the operator tag a content of
//! their choosing at another workload's place, so that a tenant's own
//! copies tell nothing of another's.
//!
//! The key is installed once per process ([`install`]), before anything
//! is decoded; until then no mark proves anything. The command-line
//! tools, which may not read the operator's Secret, take a well-formed
//! mark for what it says instead ([`trust_unchecked`]): what they print
//! is a preview. Without a key no restart value is computed.

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

/// Where a copy is, and for which rule (`namespace/name`, and its UID).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place<'a> {
    pub(crate) kind: Kind,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    pub(crate) rule: &'a str,
    /// The rule's UID; empty where none is known (an object without the
    /// rule-UID label), which no mark's owner tag is ever made for.
    pub(crate) rule_uid: &'a str,
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

fn owner_tag(key: &MarkKey, place: &Place<'_>) -> String {
    let mut feed = Feed::new(key, "copyrator owner").place(place);
    feed.part(place.rule_uid.as_bytes());
    feed.hex()
}

fn content_tag(key: &MarkKey, place: &Place<'_>, payload: &BTreeMap<String, Value>) -> String {
    let mut feed = Feed::new(key, "copyrator content").place(place);
    feed.part(place.rule_uid.as_bytes());
    feed.payload(payload).hex()
}

/// The mark of a copy at `place` holding `payload`, under `key`.
pub(crate) fn sign_with(
    key: &MarkKey,
    place: &Place<'_>,
    payload: &BTreeMap<String, Value>,
) -> String {
    format!(
        "{}.{}.{}",
        identity_tag(key, place),
        owner_tag(key, place),
        content_tag(key, place, payload)
    )
}

/// The mark of a copy at `place` holding `payload`; `None` without a key.
pub(crate) fn sign(place: &Place<'_>, payload: &BTreeMap<String, Value>) -> Option<String> {
    key().map(|key| sign_with(key, place, payload))
}

/// How many hex digits a rolled-out digest has: 64 bits, enough to tell
/// the few contents one source's copies hold apart, short enough to list
/// thousands of sources in a rule's status.
pub(crate) const ROLLED_OUT_DIGITS: usize = 16;

/// The digest of content a staged rule rolled out for the copies of
/// `name` (its payload hash, [`crate::cache::index::payload_hash`]), as the
/// rule's status keeps it: keyed, so that it tells a reader nothing of the
/// content, and bound to the rule's UID and the copy's name. `None` without
/// a key: nothing is recorded, and no copy at other content is taken as
/// rolled out before.
pub(crate) fn rolled_out_digest(rule_uid: &str, name: &str, payload_hash: u64) -> Option<String> {
    key().map(|key| rolled_out_digest_with(key, rule_uid, name, payload_hash))
}

pub(crate) fn rolled_out_digest_with(
    key: &MarkKey,
    rule_uid: &str,
    name: &str,
    payload_hash: u64,
) -> String {
    let mut feed = Feed::new(key, "copyrator rolled out");
    feed.part(rule_uid.as_bytes());
    feed.part(name.as_bytes());
    feed.part(&payload_hash.to_be_bytes());
    hex(feed.0.sign().as_ref(), ROLLED_OUT_DIGITS)
}

/// What a mark proves of an object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Copyrator made a copy of this rule (`namespace/name`) at this place.
    pub(crate) identity: bool,
    /// And of the rule of this UID: the copy is that rule's.
    pub(crate) owner: bool,
    /// And this payload is what it wrote there for that rule.
    pub(crate) content: bool,
}

impl Verdict {
    /// Everything a well-formed mark says, taken as said.
    const TAKEN_AS_SAID: Verdict = Verdict {
        identity: true,
        owner: true,
        content: true,
    };

    /// What a mark of `tags` tags can say at most: one of the earlier form
    /// (identity and content, no owner) only the copy's identity, so that
    /// its rule takes it back by a write that marks it anew.
    fn of_form(self, tags: usize) -> Self {
        if tags == 3 {
            self
        } else {
            Verdict {
                identity: self.identity,
                ..Verdict::default()
            }
        }
    }
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
    let tags: Vec<&str> = mark.unwrap_or_default().split('.').collect();
    if !matches!(tags.len(), 2 | 3) || !tags.iter().all(|tag| well_formed(tag)) {
        return Verdict::default();
    }
    let Some(key) = key else {
        // No key to check against (a command-line preview): taken as said.
        return Verdict::TAKEN_AS_SAID.of_form(tags.len());
    };
    if !same(tags[0], &identity_tag(key, place)) {
        return Verdict::default();
    }
    let owner =
        tags.len() == 3 && !place.rule_uid.is_empty() && same(tags[1], &owner_tag(key, place));
    Verdict {
        identity: true,
        owner,
        content: owner && same(tags[2], &content_tag(key, place, payload)),
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

/// A workload that uses a copy: where the copy is, and the workload.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Consumer<'a> {
    pub(crate) copy_kind: Kind,
    pub(crate) copy_namespace: &'a str,
    pub(crate) copy_name: &'a str,
    /// `Deployment`, `StatefulSet` or `DaemonSet`.
    pub(crate) workload_kind: &'a str,
    pub(crate) workload_namespace: &'a str,
    pub(crate) workload_name: &'a str,
}

/// What a restart value of this version starts with: the values of
/// earlier versions are 32 hex digits alone (see [`RestartForm`]).
pub(crate) const RESTART_VALUE_PREFIX: &str = "v3-";

/// The restart annotation's value for `used` (the canonical text of what a
/// workload uses of a copy) at `consumer`, under `key`:
/// [`RESTART_VALUE_PREFIX`] and 32 hex digits. The same content at another
/// copy or workload has another value.
pub(crate) fn restart_value_with(key: &MarkKey, consumer: &Consumer<'_>, used: &str) -> String {
    let mut feed = Feed::new(key, "copyrator restart at");
    for part in [
        consumer.copy_kind.name(),
        consumer.copy_namespace,
        consumer.copy_name,
        consumer.workload_kind,
        consumer.workload_namespace,
        consumer.workload_name,
        used,
    ] {
        feed.part(part.as_bytes());
    }
    format!("{RESTART_VALUE_PREFIX}{}", feed.hex())
}

/// [`restart_value_with`] this process's key; `None` without one (no
/// value is written then).
pub(crate) fn restart_value(consumer: &Consumer<'_>, used: &str) -> Option<String> {
    key().map(|key| restart_value_with(key, consumer, used))
}

/// What a restart annotation's value is, as far as its form tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RestartForm {
    /// Of this version: [`RESTART_VALUE_PREFIX`] first.
    Placed,
    /// Of an earlier version: 32 lowercase hex digits, either the plain
    /// SHA-256 of what the workload used (before keys,
    /// [`unkeyed_restart_value`]) or a tag of it under the key without its
    /// place. The second is never computed again: comparing it with what a
    /// workload uses now would let whoever may write a workload and a copy
    /// test guesses of another workload's content (plant its value, and
    /// watch whether the operator rolls).
    Earlier,
    /// Anything else: written by someone else.
    Other,
}

/// The form of a restart annotation's value.
pub(crate) fn restart_form(value: &str) -> RestartForm {
    if value.starts_with(RESTART_VALUE_PREFIX) {
        RestartForm::Placed
    } else if value.len() == TAG_DIGITS
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        RestartForm::Earlier
    } else {
        RestartForm::Other
    }
}

/// The value a workload carries from before restart values were keyed:
/// anyone can compute it, so comparing it tells nobody anything new; taken
/// as current while what the workload uses is unchanged, so that the
/// upgrade rolls no workload.
pub(crate) fn unkeyed_restart_value(used: &str) -> String {
    hex(
        ring::digest::digest(&ring::digest::SHA256, used.as_bytes()).as_ref(),
        TAG_DIGITS,
    )
}

/// The value the version before this one wrote: a tag of what the
/// workload used, without its place (kept for the tests alone, as nothing
/// computes it any more).
#[cfg(test)]
pub(crate) fn placeless_restart_value(key: &MarkKey, used: &str) -> String {
    let mut feed = Feed::new(key, "copyrator restart");
    feed.part(used.as_bytes());
    feed.hex()
}

/// The key [`install_test_key`] installs.
#[cfg(test)]
pub(crate) const TEST_KEY_SEED: u8 = 7;

/// A fixed key for unit tests, installed once per test process.
#[cfg(test)]
pub(crate) fn install_test_key() {
    let _ = CHECKING.get_or_init(|| Checking::Key(test_key(TEST_KEY_SEED)));
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
        rule_uid: "uid-r",
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
        assert_eq!(verdict(&key, &PLACE, &good, &mark), Verdict::TAKEN_AS_SAID);
        // Edited content: still the rule's copy, no longer Copyrator's content.
        let evil = payload(json!({"ca.crt": "EVIL"}));
        assert_eq!(
            verdict(&key, &PLACE, &evil, &mark),
            Verdict {
                identity: true,
                owner: true,
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
    fn a_copy_relabelled_with_another_rules_uid_is_no_copy_of_that_rule() {
        let key = test_key(1);
        let good = payload(json!({"ca.crt": "GOOD"}));
        let mark = sign_with(&key, &PLACE, &good);
        for rule_uid in ["uid-admin", ""] {
            let relabelled = Place { rule_uid, ..PLACE };
            assert_eq!(
                verify_with(Some(&key), &relabelled, &good, Some(&mark)),
                Verdict {
                    identity: true,
                    owner: false,
                    content: false
                },
                "a copy of {} still, but not of the rule of UID {rule_uid:?}, and its \
                 content no such rule's",
                PLACE.rule
            );
        }
    }

    #[test]
    fn a_rolled_out_digest_is_keyed_and_bound_to_the_rule_and_the_name() {
        let (one, two) = (test_key(1), test_key(2));
        let digest = rolled_out_digest_with(&one, "uid-1", "ca", 42);
        assert_eq!(digest.len(), ROLLED_OUT_DIGITS);
        assert_eq!(digest, rolled_out_digest_with(&one, "uid-1", "ca", 42));
        for other in [
            rolled_out_digest_with(&two, "uid-1", "ca", 42),
            rolled_out_digest_with(&one, "uid-2", "ca", 42),
            rolled_out_digest_with(&one, "uid-1", "cb", 42),
            rolled_out_digest_with(&one, "uid-1", "ca", 43),
        ] {
            assert_ne!(digest, other);
        }
    }

    #[test]
    fn a_mark_of_the_earlier_form_without_the_owner_proves_the_identity_alone() {
        let key = test_key(1);
        let good = payload(json!({"ca.crt": "GOOD"}));
        let earlier = format!(
            "{}.{}",
            identity_tag(&key, &PLACE),
            content_tag(&key, &PLACE, &good)
        );
        let identity_alone = Verdict {
            identity: true,
            ..Verdict::default()
        };
        assert_eq!(
            verify_with(Some(&key), &PLACE, &good, Some(&earlier)),
            identity_alone
        );
        assert_eq!(
            verify_with(None, &PLACE, &good, Some(&earlier)),
            identity_alone
        );
        let forged = format!("{}.{}", "0".repeat(32), "0".repeat(32));
        assert_eq!(
            verify_with(Some(&key), &PLACE, &good, Some(&forged)),
            Verdict::default()
        );
        let four = format!("{}.{}", sign_with(&key, &PLACE, &good), "0".repeat(32));
        assert_eq!(
            verify_with(Some(&key), &PLACE, &good, Some(&four)),
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
        let forged = ["0".repeat(32), "0".repeat(32), "0".repeat(32)].join(".");
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

    const CONSUMER: Consumer<'static> = Consumer {
        copy_kind: Kind::Secret,
        copy_namespace: "team-b",
        copy_name: "db",
        workload_kind: "Deployment",
        workload_namespace: "team-b",
        workload_name: "app",
    };

    #[test]
    fn a_restart_value_is_keyed_and_of_this_version() {
        let used = "keys;4:data3:pin8:NDgyMQ==";
        let value = restart_value_with(&test_key(1), &CONSUMER, used);
        let digits = value
            .strip_prefix(RESTART_VALUE_PREFIX)
            .unwrap_or_else(|| panic!("{value}"));
        assert_eq!(digits.len(), 32);
        assert_eq!(restart_form(&value), RestartForm::Placed);
        assert_ne!(digits, unkeyed_restart_value(used));
        assert_ne!(digits, placeless_restart_value(&test_key(1), used));
        assert_ne!(value, restart_value_with(&test_key(2), &CONSUMER, used));
        assert_eq!(value, restart_value_with(&test_key(1), &CONSUMER, used));
        assert_ne!(
            value,
            restart_value_with(&test_key(1), &CONSUMER, "keys;4:data3:pin8:NDgyMg==")
        );
    }

    /// A tenant that makes the operator tag a content at its own copy and
    /// workload learns nothing of the same content's value anywhere else.
    #[test]
    fn the_same_content_elsewhere_has_another_restart_value() {
        let key = test_key(1);
        let used = "keys;4:data3:pin8:NDgyMQ==";
        let victims = restart_value_with(&key, &CONSUMER, used);
        for elsewhere in [
            Consumer {
                copy_kind: Kind::ConfigMap,
                ..CONSUMER
            },
            Consumer {
                copy_namespace: "team-a",
                ..CONSUMER
            },
            Consumer {
                copy_name: "db-2",
                ..CONSUMER
            },
            Consumer {
                workload_kind: "StatefulSet",
                ..CONSUMER
            },
            Consumer {
                workload_namespace: "team-a",
                ..CONSUMER
            },
            Consumer {
                workload_name: "app-2",
                ..CONSUMER
            },
            // Length prefixes: a boundary moved between parts counts.
            Consumer {
                copy_name: "d",
                workload_kind: "bDeployment",
                ..CONSUMER
            },
        ] {
            assert_ne!(
                restart_value_with(&key, &elsewhere, used),
                victims,
                "{elsewhere:?}"
            );
        }
    }

    #[test]
    fn the_values_of_earlier_versions_are_told_by_their_form() {
        let used = "keys;4:data3:pin8:NDgyMQ==";
        assert_eq!(
            restart_form(&unkeyed_restart_value(used)),
            RestartForm::Earlier
        );
        assert_eq!(
            restart_form(&placeless_restart_value(&test_key(1), used)),
            RestartForm::Earlier
        );
        for other in [
            "",
            "false",
            "old",
            &"A".repeat(32),
            &"0".repeat(31),
            &"0".repeat(33),
        ] {
            assert_eq!(restart_form(other), RestartForm::Other, "{other}");
        }
    }
}
