//! The operator's log, read as structured lines: level, message and fields,
//! never searched for a substring (a timestamp such as `40.740318Z`
//! contains "403").
//!
//! * `--log-format json` (tracing's JSON with flattened events): each line
//!   is parsed with serde_json; [`parse_json`] refuses a line that is not a
//!   JSON object, so a test sees every line.
//! * the default text format (`<timestamp> <LEVEL> [span{..}: ]message
//!   key=value ...`, ANSI colours stripped) is parsed by [`LogLine::parse_text`]
//!   for the tests that must look at text logs.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

/// One log line: its time, level, message and fields (the event's own
/// fields; for JSON also those of the current span, where the event has
/// none of that name).
#[derive(Clone, Debug)]
pub struct LogLine {
    pub timestamp: DateTime<Utc>,
    /// `TRACE`, `DEBUG`, `INFO`, `WARN` or `ERROR`.
    pub level: String,
    pub message: String,
    pub fields: Map<String, Value>,
}

impl LogLine {
    /// A line of `--log-format json`.
    pub fn parse_json(line: &str) -> Result<LogLine, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
        let Value::Object(mut fields) = v else {
            return Err("not a JSON object".into());
        };
        let timestamp = fields
            .remove("timestamp")
            .and_then(|t| t.as_str().and_then(|t| t.parse::<DateTime<Utc>>().ok()))
            .ok_or("no RFC 3339 timestamp")?;
        let level = match fields.remove("level") {
            Some(Value::String(l)) => l,
            _ => return Err("no level".into()),
        };
        let message = match fields.remove("message") {
            Some(Value::String(m)) => m,
            Some(other) => other.to_string(),
            None => match fields.get_mut("fields").and_then(|f| f.as_object_mut()) {
                Some(f) => f
                    .remove("message")
                    .and_then(|m| m.as_str().map(str::to_string))
                    .unwrap_or_default(),
                None => String::new(),
            },
        };
        if let Some(Value::Object(span)) = fields.get("span").cloned() {
            for (k, v) in span {
                if k != "name" {
                    fields.entry(k).or_insert(v);
                }
            }
        }
        Ok(LogLine {
            timestamp,
            level,
            message,
            fields,
        })
    }

    /// A line of the text format; `Err` for what is not a log line.
    pub fn parse_text(line: &str) -> Result<LogLine, String> {
        let line = strip_ansi(line);
        let line = line.trim_end();
        let (timestamp, rest) = line.split_once(' ').ok_or("no timestamp")?;
        let timestamp = timestamp
            .parse::<DateTime<Utc>>()
            .map_err(|e| format!("no RFC 3339 timestamp ({e})"))?;
        let rest = rest.trim_start();
        let (level, mut rest) = rest.split_once(' ').unwrap_or((rest, ""));
        if !["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level) {
            return Err(format!("no level: {level:?}"));
        }
        // Span prefixes: `name{field=value ...}:` repeated, then a space.
        while let Some(after) = strip_span(rest) {
            rest = after;
        }
        let rest = rest.trim_start();
        // The message runs up to the first ` key=` field.
        let mut cut = rest.len();
        let bytes = rest.as_bytes();
        for (i, _) in rest.match_indices(' ') {
            let tail = &rest[i + 1..];
            let key_len = tail
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
                .count();
            if key_len > 0 && bytes.get(i + 1 + key_len) == Some(&b'=') {
                cut = i;
                break;
            }
        }
        let (message, mut tail) = (rest[..cut].to_string(), rest[cut..].trim_start());
        // A line that is only fields (no message) starts with `key=`.
        let message = if message.contains('=') && !message.contains(' ') {
            tail = rest;
            String::new()
        } else {
            message
        };
        let mut fields = Map::new();
        while !tail.is_empty() {
            let (key, after) = tail.split_once('=').ok_or("a field without =")?;
            let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = quoted.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, e)) = chars.next() {
                                value.push(e);
                            }
                        }
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                (Value::String(value), &quoted[end.min(quoted.len())..])
            } else {
                let (raw, after) = after.split_once(' ').unwrap_or((after, ""));
                let value = serde_json::from_str::<Value>(raw)
                    .ok()
                    .filter(|v| v.is_number() || v.is_boolean())
                    .unwrap_or_else(|| Value::String(raw.to_string()));
                (value, after)
            };
            fields.insert(key.trim().to_string(), value);
            tail = after.trim_start();
        }
        Ok(LogLine {
            timestamp,
            level: level.to_string(),
            message,
            fields,
        })
    }

    /// A field as a string (strings only).
    pub fn str(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    /// A field as a number (numbers only).
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.fields.get(key).and_then(Value::as_u64)
    }

    /// `message` is exactly this and every `(field, value)` is a string field of that value.
    pub fn is(&self, message: &str, fields: &[(&str, &str)]) -> bool {
        self.message == message && fields.iter().all(|(k, v)| self.str(k) == Some(*v))
    }
}

impl std::fmt::Display for LogLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {:?} {}",
            self.timestamp
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            self.level,
            self.message,
            Value::Object(self.fields.clone())
        )
    }
}

fn strip_span(s: &str) -> Option<&str> {
    let name_len = s
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b':')
        .count();
    if name_len == 0 || s.as_bytes().get(name_len) != Some(&b'{') {
        return None;
    }
    let close = s[name_len..].find('}')? + name_len;
    let after = &s[close + 1..];
    after.strip_prefix(": ").or_else(|| after.strip_prefix(':'))
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Every non-empty whole line of a `--log-format json` log (a last line
/// still being written is left out); `Err` names the first line that is
/// not a JSON log line.
pub fn parse_json(log: &str) -> Result<Vec<LogLine>, String> {
    let whole = log.rfind('\n').map_or("", |end| &log[..end]);
    whole
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| LogLine::parse_json(l).map_err(|e| format!("log line {}: {e}: {l}", i + 1)))
        .collect()
}

/// The lines of a text log that are log lines (others, such as a panic
/// message, are left out).
pub fn parse_text(log: &str) -> Vec<LogLine> {
    log.lines()
        .filter_map(|l| LogLine::parse_text(l).ok())
        .collect()
}
