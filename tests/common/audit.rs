//! The API server's audit log, read as the tests see it: who sent which
//! request, for what, when, and how it was answered.
//!
//! The control plane of the tests writes a Metadata-level audit log (JSON
//! lines, `--audit-log-mode=batch`) to the file named by
//! `COPYRATOR_AUDIT_LOG` (`hack/test` sets it before `hack/cluster up`).
//! Each line is parsed with serde_json; a request is counted once, by its
//! `auditID`: a finished request by its `ResponseComplete` (or `Panic`)
//! event, a watch still open by its `ResponseStarted` event. A request's
//! time is when the API server received it (`requestReceivedTimestamp`,
//! else `stageTimestamp`).
//!
//! ```ignore
//! let audit = Audit::start();
//! // ... the operator runs ...
//! audit.settle(&t.client, end).await;
//! let writes = audit.count(&Query::user(&user).verbs(WRITE_VERBS).resource("configmaps").between(start, end));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Client;
use serde_json::Value;

use super::{POLL, wait_until};

/// The environment variable naming the audit log file.
pub const AUDIT_LOG_ENV: &str = "COPYRATOR_AUDIT_LOG";

/// Verbs that change an object.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// The audit user name of a ServiceAccount.
pub fn service_account_user(namespace: &str, account: &str) -> String {
    format!("system:serviceaccount:{namespace}:{account}")
}

/// The audit log's path; panics when the control plane has none.
pub fn log_path() -> PathBuf {
    match std::env::var_os(AUDIT_LOG_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "{AUDIT_LOG_ENV} is not set: these tests count the operator's requests in the API \
             server's audit log. Start the control plane with an audit log: \
             `export {AUDIT_LOG_ENV}=/tmp/copyrator-audit.log; eval \"$(hack/cluster up)\"` \
             (hack/test does this), and run the tests with the variable set."
        ),
    }
}

/// One request as the audit log records it.
#[derive(Clone, Debug)]
pub struct AuditEvent {
    pub audit_id: String,
    pub stage: String,
    pub verb: String,
    /// The authenticated user (`user.username`).
    pub username: String,
    /// The user it acted as (`impersonatedUser.username`), when it impersonated one.
    pub impersonated: Option<String>,
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// `responseStatus.code`.
    pub code: Option<u16>,
    /// When the API server received the request.
    pub received: DateTime<Utc>,
    pub stage_timestamp: DateTime<Utc>,
    pub request_uri: String,
}

fn time(v: &Value, field: &str) -> Option<DateTime<Utc>> {
    v.get(field)?.as_str()?.parse::<DateTime<Utc>>().ok()
}

fn string(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)?.as_str().map(str::to_string)
}

impl AuditEvent {
    /// One audit log line; `Err` when it is not an audit event.
    pub fn parse(line: &str) -> Result<AuditEvent, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
        let stage_timestamp = time(&v, "stageTimestamp").ok_or("no stageTimestamp")?;
        Ok(AuditEvent {
            audit_id: string(&v, "/auditID").ok_or("no auditID")?,
            stage: string(&v, "/stage").ok_or("no stage")?,
            verb: string(&v, "/verb").unwrap_or_default(),
            username: string(&v, "/user/username").unwrap_or_default(),
            impersonated: string(&v, "/impersonatedUser/username"),
            resource: string(&v, "/objectRef/resource"),
            subresource: string(&v, "/objectRef/subresource"),
            namespace: string(&v, "/objectRef/namespace"),
            name: string(&v, "/objectRef/name"),
            code: v
                .pointer("/responseStatus/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok()),
            received: time(&v, "requestReceivedTimestamp").unwrap_or(stage_timestamp),
            stage_timestamp,
            request_uri: string(&v, "/requestURI").unwrap_or_default(),
        })
    }

    /// Whom the request was authorized as: the impersonated user if any,
    /// else the authenticated one.
    pub fn effective_user(&self) -> &str {
        self.impersonated.as_deref().unwrap_or(&self.username)
    }

    /// The request's final event (rather than the start of its response).
    fn is_final(&self) -> bool {
        self.stage == "ResponseComplete" || self.stage == "Panic"
    }
}

impl std::fmt::Display for AuditEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let object = match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => format!(" {ns}/{name}"),
            (Some(ns), None) => format!(" in {ns}"),
            (None, Some(name)) => format!(" {name}"),
            (None, None) => String::new(),
        };
        write!(
            f,
            "{} {}{object} by {} at {}: {}",
            self.verb,
            self.resource.as_deref().unwrap_or("-"),
            self.effective_user(),
            self.received
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            self.code
                .map_or("no response".to_string(), |c| c.to_string()),
        )
    }
}

/// Which requests to count; every field left unset matches everything.
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// [`AuditEvent::effective_user`].
    pub user: Option<String>,
    pub verbs: Option<Vec<String>>,
    /// `objectRef.resource` (a subresource request matches its resource).
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub code: Option<u16>,
    /// Received at or after.
    pub from: Option<DateTime<Utc>>,
    /// Received before.
    pub to: Option<DateTime<Utc>>,
}

impl Query {
    /// Requests of one user (see [`service_account_user`]), or made as
    /// that user by impersonation.
    pub fn user(user: &str) -> Query {
        Query {
            user: Some(user.to_string()),
            ..Query::default()
        }
    }

    pub fn verbs(mut self, verbs: &[&str]) -> Query {
        self.verbs = Some(verbs.iter().map(|v| v.to_string()).collect());
        self
    }

    pub fn resource(mut self, resource: &str) -> Query {
        self.resource = Some(resource.to_string());
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Query {
        self.namespace = Some(namespace.to_string());
        self
    }

    pub fn name(mut self, name: &str) -> Query {
        self.name = Some(name.to_string());
        self
    }

    pub fn code(mut self, code: u16) -> Query {
        self.code = Some(code);
        self
    }

    /// Received in `[from, to)`.
    pub fn between(mut self, from: DateTime<Utc>, to: DateTime<Utc>) -> Query {
        self.from = Some(from);
        self.to = Some(to);
        self
    }

    pub fn matches(&self, e: &AuditEvent) -> bool {
        fn eq(want: &Option<String>, got: &Option<String>) -> bool {
            want.as_ref().is_none_or(|w| got.as_ref() == Some(w))
        }
        self.user.as_ref().is_none_or(|u| u == e.effective_user())
            && self.verbs.as_ref().is_none_or(|vs| vs.contains(&e.verb))
            && eq(&self.resource, &e.resource)
            && eq(&self.namespace, &e.namespace)
            && eq(&self.name, &e.name)
            && self.code.is_none_or(|c| e.code == Some(c))
            && self.from.is_none_or(|f| e.received >= f)
            && self.to.is_none_or(|t| e.received < t)
    }
}

#[derive(Default)]
struct State {
    /// Bytes of the file consumed (whole lines only).
    offset: u64,
    /// One event per request, in the order the log first mentions them.
    events: Vec<AuditEvent>,
    by_id: HashMap<String, usize>,
    /// Lines that are not audit events (should be none).
    unparsed: usize,
}

/// The audit log from the moment [`Audit::start`] was called: requests
/// received before it are not read.
pub struct Audit {
    path: PathBuf,
    state: Mutex<State>,
}

impl Audit {
    /// Starts reading at the current end of the log. Panics when
    /// `COPYRATOR_AUDIT_LOG` is unset or names no file.
    pub fn start() -> Audit {
        let path = log_path();
        if let Err(e) = std::fs::metadata(&path) {
            panic!(
                "the audit log {AUDIT_LOG_ENV}={} cannot be read ({e}): was the control \
                 plane started with this variable set (hack/cluster up enables auditing \
                 only then)?",
                path.display()
            )
        }
        Audit::at(path)
    }

    /// The audit log at `path` (another control plane's) from now on.
    pub fn at(path: PathBuf) -> Audit {
        let len = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("the audit log {} cannot be read: {e}", path.display()))
            .len();
        Audit {
            path,
            state: Mutex::new(State {
                offset: len,
                ..State::default()
            }),
        }
    }

    fn refresh(&self) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap();
        let mut file = File::open(&self.path)
            .unwrap_or_else(|e| panic!("opening the audit log {}: {e}", self.path.display()));
        let len = file
            .metadata()
            .unwrap_or_else(|e| panic!("reading the audit log {}: {e}", self.path.display()))
            .len();
        // Shorter than what was read of it: the API server rotated it, and
        // what this test's requests wrote before is in another file.
        assert!(
            len >= state.offset,
            "the audit log {} was rotated while a test read it ({len} bytes, {} read before): \
             the control plane must be started with --audit-log-maxsize large enough",
            self.path.display(),
            state.offset
        );
        file.seek(SeekFrom::Start(state.offset))
            .unwrap_or_else(|e| panic!("seeking in the audit log {}: {e}", self.path.display()));
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)
            .unwrap_or_else(|e| panic!("reading the audit log {}: {e}", self.path.display()));
        // Only whole lines: the API server may be writing the last one.
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return state;
        };
        state.offset += end as u64 + 1;
        for line in buf[..end].split(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(line);
            if line.trim().is_empty() {
                continue;
            }
            let Ok(event) = AuditEvent::parse(&line) else {
                state.unparsed += 1;
                continue;
            };
            match state.by_id.get(&event.audit_id).copied() {
                Some(i) => {
                    if event.is_final() || !state.events[i].is_final() {
                        state.events[i] = event;
                    }
                }
                None => {
                    let i = state.events.len();
                    state.by_id.insert(event.audit_id.clone(), i);
                    state.events.push(event);
                }
            }
        }
        state
    }

    /// The requests matching `q` logged so far.
    pub fn matching(&self, q: &Query) -> Vec<AuditEvent> {
        self.refresh()
            .events
            .iter()
            .filter(|e| q.matches(e))
            .cloned()
            .collect()
    }

    pub fn count(&self, q: &Query) -> usize {
        self.refresh()
            .events
            .iter()
            .filter(|e| q.matches(e))
            .count()
    }

    /// Matching requests by response code (`0`: none recorded).
    pub fn by_code(&self, q: &Query) -> BTreeMap<u16, usize> {
        let mut out = BTreeMap::new();
        for e in self.refresh().events.iter().filter(|e| q.matches(e)) {
            *out.entry(e.code.unwrap_or(0)).or_default() += 1;
        }
        out
    }

    /// Matching requests by `verb resource` (e.g. `list configmaps`).
    pub fn by_verb_resource(&self, q: &Query) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for e in self.refresh().events.iter().filter(|e| q.matches(e)) {
            let what = match (&e.resource, &e.subresource) {
                (Some(r), Some(s)) => format!("{} {r}/{s}", e.verb),
                (Some(r), None) => format!("{} {r}", e.verb),
                _ => e.verb.clone(),
            };
            *out.entry(what).or_default() += 1;
        }
        out
    }

    /// Matching requests by verb.
    pub fn by_verb(&self, q: &Query) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for e in self.refresh().events.iter().filter(|e| q.matches(e)) {
            *out.entry(e.verb.clone()).or_default() += 1;
        }
        out
    }

    /// Matching requests per second received (Unix seconds → count).
    pub fn per_second(&self, q: &Query) -> BTreeMap<i64, usize> {
        let mut out = BTreeMap::new();
        for e in self.refresh().events.iter().filter(|e| q.matches(e)) {
            *out.entry(e.received.timestamp()).or_default() += 1;
        }
        out
    }

    /// The busiest second of the matching requests: (Unix second, count).
    pub fn busiest_second(&self, q: &Query) -> Option<(i64, usize)> {
        self.per_second(q)
            .into_iter()
            .max_by_key(|(second, n)| (*n, -second))
    }

    /// Waits until every request received before `until` is in the log:
    /// the log is written in batches (at most a second apart), so once it
    /// holds a request received two seconds after `until` the earlier ones
    /// have landed. The client sends a cheap request on each poll, so that
    /// there is always one to see.
    pub async fn settle(&self, client: &Client, until: DateTime<Utc>) {
        let mark = until + chrono::Duration::seconds(2);
        wait_until(
            format!("the audit log {} to reach {mark}", self.path.display()),
            Duration::from_secs(60),
            async || {
                if Utc::now() >= mark {
                    let _ = client.apiserver_version().await;
                }
                let state = self.refresh();
                match state.events.iter().map(|e| e.received).max() {
                    Some(last) if last >= mark => Ok(()),
                    last => Err(format!("the last request logged was received at {last:?}")),
                }
            },
        )
        .await;
        tokio::time::sleep(POLL).await;
    }
}
