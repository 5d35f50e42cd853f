//! `copyrator file-credential FILE`: a credential plugin in the operator's
//! own image, for members that trust this cluster's ServiceAccount issuer
//! (identity federation): it prints the token in FILE (the chart's
//! projected `federatedToken`, which the kubelet renews) as an
//! ExecCredential, with the token's `exp` as its expiry, so that the
//! operator reads it again before it expires. A provider of the provider
//! file names it: `"command": "/copyrator", "args": ["file-credential",
//! "/var/run/secrets/copyrator/federated/token"]`.

use std::path::Path;
use std::process::ExitCode;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

/// Read `path` and print its token as an ExecCredential; exit 1, saying
/// why (never the token), when it cannot.
pub(crate) fn run(path: &Path) -> ExitCode {
    let said = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|text| credential(&text));
    match said {
        Ok(credential) => {
            println!("{credential}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("error: {why}");
            ExitCode::from(1)
        }
    }
}

/// The ExecCredential for the token `text` holds.
fn credential(text: &str) -> Result<Value, String> {
    let token = text.trim();
    if token.is_empty() {
        return Err("the file holds no token".into());
    }
    if token.contains(['\r', '\n']) {
        return Err("the file holds more than one line".into());
    }
    let mut status = json!({ "token": token });
    if let Some(expires) = expiry(token) {
        status["expirationTimestamp"] =
            Value::String(expires.to_rfc3339_opts(SecondsFormat::Secs, true));
    }
    Ok(json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": status,
    }))
}

/// The `exp` claim of a JWT, where the token is one.
fn expiry(token: &str) -> Option<DateTime<Utc>> {
    let payload = token.split('.').nth(1)?;
    // base64url without padding, as JWTs have it, made standard base64.
    let mut standard: String = payload
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !standard.len().is_multiple_of(4) {
        standard.push('=');
    }
    let bytes: k8s_openapi::ByteString = serde_json::from_value(Value::String(standard)).ok()?;
    let claims: Value = serde_json::from_slice(&bytes.0).ok()?;
    DateTime::from_timestamp(claims.get("exp")?.as_i64()?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JWT-shaped token whose payload is `claims` (unsigned: only its
    /// shape matters here).
    fn jwt(claims: &Value) -> String {
        let encoded: Value =
            serde_json::to_value(k8s_openapi::ByteString(claims.to_string().into_bytes()))
                .expect("base64");
        let url: String = encoded
            .as_str()
            .expect("text")
            .trim_end_matches('=')
            .chars()
            .map(|c| match c {
                '+' => '-',
                '/' => '_',
                c => c,
            })
            .collect();
        format!("eyJhbGciOiJSUzI1NiJ9.{url}.c2lnbmF0dXJl")
    }

    #[test]
    fn a_token_is_printed_with_its_expiry() {
        let token = jwt(&json!({"sub": "system:serviceaccount:copyrator:copyrator",
                                "exp": 1_900_000_000, "aud": ["members"]}));
        let said = credential(&format!("{token}\n")).expect("a credential");
        assert_eq!(said["kind"], "ExecCredential");
        assert_eq!(said["status"]["token"], token.as_str());
        assert_eq!(
            said["status"]["expirationTimestamp"],
            "2030-03-17T17:46:40Z"
        );
    }

    #[test]
    fn a_token_without_a_readable_expiry_has_none_and_an_empty_file_is_refused() {
        let said = credential("opaque-token").expect("a credential");
        assert!(said["status"].get("expirationTimestamp").is_none());
        assert!(credential(" \n").is_err());
        let refused = credential("one\ntwo").expect_err("refused");
        assert!(!refused.contains("two"), "{refused}");
    }
}
