//! A Secret's chosen keys as a ConfigMap (`transform.toKind: ConfigMap`):
//! the public half of a Secret, such as a CA, where workloads and other
//! namespaces read it without the private key. Only the keys
//! `transform.keys.include` selects travel; a key that looks like a private
//! key travels only when the rule names it exactly, and a value that is
//! not UTF-8 text (a ConfigMap's `data` holds text) does not travel at all:
//! either keeps the source from being copied, with why.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::cache::index::Object;
use crate::core::resolve::ResolvedRule;

/// PEM's armour around a private key, of every algorithm: `-----BEGIN RSA
/// PRIVATE KEY-----`, `-----BEGIN PRIVATE KEY-----`, `-----BEGIN ENCRYPTED
/// PRIVATE KEY-----`, `-----BEGIN OPENSSH PRIVATE KEY-----`.
const PEM_PRIVATE_KEY: &str = "PRIVATE KEY-----";

/// Why a key looks like a private key, if it does.
fn looks_private(key: &str, text: &str) -> Option<&'static str> {
    if key.ends_with(".key") || key == "key" {
        return Some("its name ends in .key");
    }
    let armoured = text
        .lines()
        .any(|line| line.starts_with("-----BEGIN ") && line.trim_end().ends_with(PEM_PRIVATE_KEY));
    armoured.then_some("its value holds a PEM private key")
}

/// A Secret's `data` value (base64, as the API server gives it) as text,
/// if it is UTF-8.
fn text_of(encoded: &Value) -> Option<String> {
    let bytes: k8s_openapi::ByteString = serde_json::from_value(encoded.clone()).ok()?;
    String::from_utf8(bytes.0).ok()
}

/// Why the Secret `source` cannot be copied as a ConfigMap by `rule`, if
/// it cannot: a selected key that looks like a private key and that the
/// rule does not name exactly, or one whose value is not UTF-8 text.
/// `None` as well for a rule that copies Secrets as Secrets. Selecting the
/// keys takes glob steps from `steps`; `Err` when they ran out.
pub(crate) fn refusal(
    rule: &ResolvedRule,
    source: &Object,
    steps: &mut u64,
) -> Result<Option<String>, OutOfSteps> {
    if !rule.transform.to_config_map {
        return Ok(None);
    }
    let Some(Value::Object(data)) = source.payload.get("data") else {
        return Ok(None);
    };
    let keys = &rule.transform.keys;
    for (key, value) in data {
        if keys
            .name_on_copies_within(key, steps)
            .ok_or(OutOfSteps)?
            .is_none()
        {
            continue;
        }
        let Some(text) = text_of(value) else {
            return Ok(Some(format!(
                "its key {key:?} is not UTF-8 text, and a ConfigMap holds text (transform.toKind: \
                 ConfigMap)"
            )));
        };
        if let Some(why) = looks_private(key, &text)
            && !rule.transform.exact_keys.contains(key)
        {
            return Ok(Some(format!(
                "its key {key:?} looks like a private key ({why}): a ConfigMap copy carries it \
                 only when transform.keys.include names it exactly"
            )));
        }
    }
    Ok(None)
}

/// The glob steps of a pass ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfSteps;

/// The payload of a ConfigMap holding `selected`, a Secret's payload with
/// its keys selected and renamed: its `data` as text, nothing else (a
/// Secret's `type` and `immutable` say nothing of the ConfigMap). A value
/// that is not text is left out ([`refusal`] keeps such a source from
/// being copied).
pub(crate) fn config_map_payload(selected: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    let Some(Value::Object(data)) = selected.get("data") else {
        return BTreeMap::new();
    };
    let text: serde_json::Map<String, Value> = data
        .iter()
        .filter_map(|(key, value)| Some((key.clone(), Value::String(text_of(value)?))))
        .collect();
    BTreeMap::from([("data".to_owned(), Value::Object(text))])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::core::plan::tests::rule;

    fn b64(text: &[u8]) -> Value {
        serde_json::to_value(k8s_openapi::ByteString(text.to_vec())).expect("base64")
    }

    fn secret(data: &[(&str, &[u8])]) -> Object {
        let mut o =
            crate::cache::index::tests::object("src", "tls", "uid-tls", 1, &[("copy", "yes")]);
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), b64(v)))
            .collect();
        o.payload.insert("data".into(), Value::Object(data));
        o.payload.insert("type".into(), json!("kubernetes.io/tls"));
        o.rehash();
        o
    }

    fn to_config_map(include: &[&str]) -> ResolvedRule {
        rule(json!({
            "ruleType": "secret",
            "selector": {"copy": "yes"},
            "spec": {"transform": {"toKind": "ConfigMap", "keys": {"include": include}}},
        }))
    }

    fn refused(rule: &ResolvedRule, source: &Object) -> Result<Option<String>, OutOfSteps> {
        let mut steps = u64::MAX;
        refusal(rule, source, &mut steps)
    }

    const KEY_PEM: &[u8] = b"-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\n";

    #[test]
    fn only_the_named_keys_travel_as_text_and_nothing_of_the_secret_else() {
        let r = to_config_map(&["ca.crt"]);
        assert_eq!(r.copy_kind, crate::api::kinds::Kind::ConfigMap);
        let s = secret(&[("ca.crt", b"CA"), ("tls.crt", b"T"), ("tls.key", KEY_PEM)]);
        assert_eq!(refused(&r, &s), Ok(None));
        let copy = crate::core::plan::desired_copy(&r, &s);
        assert_eq!(copy.kind, crate::api::kinds::Kind::ConfigMap);
        assert_eq!(
            copy.payload,
            BTreeMap::from([("data".to_owned(), json!({"ca.crt": "CA"}))])
        );
    }

    #[test]
    fn a_key_that_looks_private_travels_only_when_named_exactly() {
        let globbed = to_config_map(&["*"]);
        let by_name = secret(&[("ca.crt", b"CA"), ("tls.key", b"K")]);
        let why = refused(&globbed, &by_name).expect("within steps");
        assert_eq!(
            why.as_deref(),
            Some(
                "its key \"tls.key\" looks like a private key (its name ends in .key): a ConfigMap \
                 copy carries it only when transform.keys.include names it exactly"
            )
        );
        let by_content = secret(&[("bundle.pem", KEY_PEM)]);
        let why = refused(&globbed, &by_content).expect("within steps");
        assert!(why.is_some_and(|w| w.contains("holds a PEM private key")));
        // Named exactly, it is the rule's choice.
        let named = to_config_map(&["ca.crt", "tls.key"]);
        assert_eq!(refused(&named, &by_name), Ok(None));
        // The reason never holds the value.
        let why = refused(&globbed, &by_content)
            .expect("within steps")
            .unwrap_or_default();
        assert!(!why.contains("MHcC"), "{why}");
    }

    #[test]
    fn a_value_that_is_not_text_is_refused_with_its_own_reason() {
        let r = to_config_map(&["*.der"]);
        let s = secret(&[("ca.der", &[0xff, 0xfe, 0x00])]);
        let why = refused(&r, &s).expect("within steps");
        assert!(why.is_some_and(|w| w.contains("\"ca.der\" is not UTF-8 text")));
        assert_eq!(refusal(&r, &s, &mut 0), Err(OutOfSteps));
    }
}
