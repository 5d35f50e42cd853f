//! Credentials from a plugin of the operator's provider file (see
//! [`crate::cluster::provider_file`]), for a member reached through a
//! ClusterProfile's access provider: a program that prints an
//! ExecCredential (the credentials-plugin contract of
//! `client.authentication.k8s.io`), run by the operator, never by the
//! profile's choice.
//!
//! - One run per member at a time: every request that needs a token waits
//!   for the one run under way.
//! - A run has a deadline ([`RUN_DEADLINE`]); a failed run is retried after
//!   a backoff that doubles to [`BACKOFF_MAX`].
//! - A token is renewed before its `expirationTimestamp` (a fifth of its
//!   life before, at least [`RENEW_MARGIN_MIN`]), and at once after the
//!   member answers 401 to it.
//! - What the plugin prints on its standard error, and its output when it
//!   cannot be read, reach nothing: a failure is said by a fixed reason and
//!   the exit code alone.
//!
//! Requests carry the token through [`PluginAuthLayer`].

use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use chrono::{DateTime, Utc};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use tower::BoxError;

use crate::cluster::provider_file::PluginRun;

/// How long a plugin may run.
pub(crate) const RUN_DEADLINE: Duration = Duration::from_secs(10);
/// The least time before its expiry at which a token is renewed.
const RENEW_MARGIN_MIN: Duration = Duration::from_secs(10);
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The most of a plugin's standard output that is read.
const OUTPUT_LIMIT: u64 = 1 << 20;

/// Why a plugin gave no credential, in fixed words: nothing the plugin
/// printed is in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PluginFailure {
    #[error("the credential plugin of provider {provider:?} could not be started")]
    NotStarted { provider: String },
    #[error(
        "the credential plugin of provider {provider:?} did not finish within {} s",
        deadline.as_secs_f64()
    )]
    TimedOut {
        provider: String,
        deadline: Duration,
    },
    #[error(
        "the credential plugin of provider {provider:?} failed (exit code {})",
        code.map_or_else(|| "none: killed by a signal".to_owned(), |c| c.to_string())
    )]
    Failed { provider: String, code: Option<i32> },
    #[error(
        "the credential plugin of provider {provider:?} printed no ExecCredential with a token \
         ({what})"
    )]
    NoToken {
        provider: String,
        what: &'static str,
    },
    /// Within the backoff after `last`: said as `last` (the time left
    /// would make the words change with every look).
    #[error("{last}")]
    Backoff {
        last: Box<PluginFailure>,
        next: Duration,
    },
}

impl PluginFailure {
    /// The result label of `copyrator_credential_plugin_runs_total`.
    pub(crate) fn result(&self) -> &'static str {
        match self {
            PluginFailure::NotStarted { .. } => "not_started",
            PluginFailure::TimedOut { .. } => "timed_out",
            PluginFailure::Failed { .. } => "failed",
            PluginFailure::NoToken { .. } => "no_token",
            PluginFailure::Backoff { .. } => "backoff",
        }
    }
}

/// A token, and when it is to be renewed.
struct Held {
    token: SecretString,
    renew_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    held: Option<Held>,
    /// Failed runs since the last that worked, and the last failure.
    failures: u32,
    failed: Option<(PluginFailure, Instant)>,
}

/// Told of every run: its provider and result ("ok", or a failure's).
pub(crate) type RunObserver = Arc<dyn Fn(&str, &'static str) + Send + Sync>;

/// A member's credentials from its plugin.
pub(crate) struct PluginCredentials {
    run: PluginRun,
    state: tokio::sync::Mutex<State>,
    observe: RunObserver,
    deadline: Duration,
}

impl PluginCredentials {
    pub(crate) fn new(run: PluginRun, observe: RunObserver) -> Self {
        Self {
            run,
            state: tokio::sync::Mutex::default(),
            observe,
            deadline: RUN_DEADLINE,
        }
    }

    pub(crate) fn provider(&self) -> &str {
        &self.run.provider
    }

    /// The token to send now: the one held while it is fresh, else a new
    /// one from a run (one at a time: others wait for it). The run goes on
    /// when the caller gives up waiting (a request's deadline), so that
    /// its result, a failure too, is kept for the next.
    pub(crate) async fn token(self: &Arc<Self>) -> Result<SecretString, PluginFailure> {
        // Every request asks: a fresh token is handed out here, and only a
        // run is spawned.
        if let Some(token) = fresh(&*self.state.lock().await) {
            return Ok(token);
        }
        let this = self.clone();
        tokio::spawn(async move { this.token_now().await })
            .await
            .unwrap_or_else(|_| {
                Err(PluginFailure::NotStarted {
                    provider: self.run.provider.clone(),
                })
            })
    }

    async fn token_now(&self) -> Result<SecretString, PluginFailure> {
        let mut state = self.state.lock().await;
        if let Some(token) = fresh(&state) {
            return Ok(token);
        }
        if let Some((last, at)) = &state.failed {
            let wait = backoff(state.failures);
            let next = (*at + wait).saturating_duration_since(Instant::now());
            if !next.is_zero() {
                return Err(PluginFailure::Backoff {
                    last: Box::new(last.clone()),
                    next,
                });
            }
        }
        let ran = run_plugin(&self.run, self.deadline).await;
        (self.observe)(
            &self.run.provider,
            ran.as_ref().map_or_else(PluginFailure::result, |_| "ok"),
        );
        match ran {
            Ok(held) => {
                let token = held.token.clone();
                state.held = Some(held);
                state.failures = 0;
                state.failed = None;
                Ok(token)
            }
            Err(failure) => {
                state.held = None;
                state.failures = state.failures.saturating_add(1);
                state.failed = Some((failure.clone(), Instant::now()));
                Err(failure)
            }
        }
    }

    /// The member refused `token` (401): the next request runs the plugin,
    /// unless a newer token is held already.
    pub(crate) async fn refused(&self, token: &SecretString) {
        let mut state = self.state.lock().await;
        if state
            .held
            .as_ref()
            .is_some_and(|held| held.token.expose_secret() == token.expose_secret())
        {
            state.held = None;
        }
    }
}

/// The token held, while it need not be renewed.
fn fresh(state: &State) -> Option<SecretString> {
    state
        .held
        .as_ref()
        .filter(|held| held.renew_at.is_none_or(|at| Instant::now() < at))
        .map(|held| held.token.clone())
}

fn backoff(failures: u32) -> Duration {
    BACKOFF_FIRST
        .saturating_mul(1u32 << failures.saturating_sub(1).min(6))
        .min(BACKOFF_MAX)
}

/// The ExecCredential a plugin prints, as far as it is read.
#[derive(Deserialize)]
struct ExecCredential {
    kind: Option<String>,
    status: Option<ExecStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecStatus {
    token: Option<String>,
    expiration_timestamp: Option<String>,
}

/// Run the plugin once: its token and when to renew it.
async fn run_plugin(run: &PluginRun, deadline: Duration) -> Result<Held, PluginFailure> {
    let provider = || run.provider.clone();
    let mut command = tokio::process::Command::new(&run.command);
    command
        .args(&run.args)
        // Only what the provider file says, and the contract's variable.
        .env_clear()
        .envs(run.env.iter().map(|(k, v)| (k, v)))
        .env("KUBERNETES_EXEC_INFO", run.exec_info.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|_| PluginFailure::NotStarted {
        provider: provider(),
    })?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| PluginFailure::NotStarted {
            provider: provider(),
        })?;
    let work = async {
        let mut output = Vec::new();
        let read = (&mut stdout)
            .take(OUTPUT_LIMIT)
            .read_to_end(&mut output)
            .await;
        let status = child.wait().await;
        (read.map(|_| output), status)
    };
    let (output, status) =
        tokio::time::timeout(deadline, work)
            .await
            .map_err(|_| PluginFailure::TimedOut {
                provider: provider(),
                deadline,
            })?;
    let status = status.map_err(|_| PluginFailure::NotStarted {
        provider: provider(),
    })?;
    if !status.success() {
        return Err(PluginFailure::Failed {
            provider: provider(),
            code: status.code(),
        });
    }
    let no_token = |what| PluginFailure::NoToken {
        provider: provider(),
        what,
    };
    let output = output.map_err(|_| no_token("its output could not be read"))?;
    let credential: ExecCredential =
        serde_json::from_slice(&output).map_err(|_| no_token("its output is not JSON"))?;
    if credential.kind.as_deref() != Some("ExecCredential") {
        return Err(no_token("its output is not of kind ExecCredential"));
    }
    let status = credential
        .status
        .ok_or_else(|| no_token("it has no status"))?;
    let token = status
        .token
        .filter(|t| !t.is_empty())
        .map(SecretString::from)
        .ok_or_else(|| no_token("status.token is missing (client certificates are not taken)"))?;
    if token.expose_secret().contains(['\r', '\n']) {
        return Err(no_token("status.token holds a line break"));
    }
    let renew_at = match status.expiration_timestamp {
        None => None,
        Some(text) => {
            let expires = DateTime::parse_from_rfc3339(&text)
                .map_err(|_| no_token("status.expirationTimestamp is not RFC 3339"))?
                .with_timezone(&Utc);
            Some(renew_at(Utc::now(), expires))
        }
    };
    Ok(Held { token, renew_at })
}

/// When a token that expires at `expires` (as of `now`) is renewed: a
/// fifth of its remaining life before, at least [`RENEW_MARGIN_MIN`].
fn renew_at(now: DateTime<Utc>, expires: DateTime<Utc>) -> Instant {
    let life = (expires - now).to_std().unwrap_or_default();
    let margin = (life / 5).max(RENEW_MARGIN_MIN);
    Instant::now() + life.saturating_sub(margin)
}

/// Adds the member's token to each request, and tells the credentials
/// when the member refuses it (401).
#[derive(Clone)]
pub(crate) struct PluginAuthLayer(pub(crate) Arc<PluginCredentials>);

impl<S> tower::Layer<S> for PluginAuthLayer {
    type Service = PluginAuth<S>;

    fn layer(&self, inner: S) -> PluginAuth<S> {
        PluginAuth {
            inner,
            credentials: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct PluginAuth<S> {
    inner: S,
    credentials: Arc<PluginCredentials>,
}

impl<S, B> tower::Service<http::Request<B>> for PluginAuth<S>
where
    S: tower::Service<http::Request<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send,
    B: Send + 'static,
    S::Response: ResponseStatus,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The service polled ready goes with this call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let credentials = self.credentials.clone();
        Box::pin(async move {
            let token = credentials.token().await?;
            let mut value =
                http::HeaderValue::try_from(format!("Bearer {}", token.expose_secret())).map_err(
                    |_| PluginFailure::NoToken {
                        provider: credentials.provider().to_owned(),
                        what: "status.token cannot be sent in a header",
                    },
                )?;
            value.set_sensitive(true);
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value);
            let response = inner.call(request).await.map_err(Into::into)?;
            if response.status_code() == http::StatusCode::UNAUTHORIZED {
                credentials.refused(&token).await;
            }
            Ok(response)
        })
    }
}

/// A response's status code, whatever its body.
pub(crate) trait ResponseStatus {
    fn status_code(&self) -> http::StatusCode;
}

impl<B> ResponseStatus for http::Response<B> {
    fn status_code(&self) -> http::StatusCode {
        self.status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    /// A plugin: a shell script printing `output` (after `before`).
    fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("the script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path.to_string_lossy().into_owned()
    }

    fn run_of(command: String) -> PluginRun {
        PluginRun {
            provider: "test".to_owned(),
            command,
            args: vec!["--an-arg".to_owned()],
            env: vec![("GIVEN".to_owned(), "yes".to_owned())],
            exec_info: json!({"apiVersion": "client.authentication.k8s.io/v1",
                              "kind": "ExecCredential", "spec": {"interactive": false}}),
        }
    }

    type Runs = Arc<Mutex<Vec<&'static str>>>;

    fn credentials(command: String) -> (Arc<PluginCredentials>, Runs) {
        credentials_within(command, RUN_DEADLINE)
    }

    fn credentials_within(command: String, deadline: Duration) -> (Arc<PluginCredentials>, Runs) {
        let runs: Runs = Arc::default();
        let seen = runs.clone();
        let observe: RunObserver = Arc::new(move |_, result| {
            seen.lock().expect("runs").push(result);
        });
        let mut credentials = PluginCredentials::new(run_of(command), observe);
        credentials.deadline = deadline;
        (Arc::new(credentials), runs)
    }

    /// A directory of this test's own, removed when dropped.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn temp() -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "copyrator-plugin-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    /// Prints a credential whose token is the shell's PID: each run's own.
    const PRINT_CREDENTIAL: &str = r#"echo "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t-$$\"}}""#;

    #[tokio::test]
    async fn a_token_is_held_until_the_member_refuses_it() {
        let dir = temp();
        let (credentials, runs) = credentials(script(dir.path(), "p", PRINT_CREDENTIAL));
        let first = credentials.token().await.expect("a token");
        let again = credentials.token().await.expect("a token");
        assert_eq!(first.expose_secret(), again.expose_secret());
        assert_eq!(*runs.lock().expect("runs"), ["ok"]);
        credentials.refused(&first).await;
        let renewed = credentials.token().await.expect("a token");
        assert_ne!(first.expose_secret(), renewed.expose_secret());
        assert_eq!(*runs.lock().expect("runs"), ["ok", "ok"]);
    }

    #[tokio::test]
    async fn the_plugin_gets_its_arguments_its_environment_and_nothing_else() {
        let dir = temp();
        let out = dir.path().join("seen");
        let body = format!(
            "echo \"$* GIVEN=$GIVEN HOME=${{HOME:-unset}} INFO=$KUBERNETES_EXEC_INFO\" > {}\n{PRINT_CREDENTIAL}",
            out.display()
        );
        let (credentials, _) = credentials(script(dir.path(), "p", &body));
        credentials.token().await.expect("a token");
        let seen = std::fs::read_to_string(&out).expect("what the plugin saw");
        assert!(
            seen.starts_with("--an-arg GIVEN=yes HOME=unset INFO={"),
            "{seen}"
        );
    }

    #[tokio::test]
    async fn a_token_is_renewed_before_it_expires() {
        let dir = temp();
        // Expires in 12 s: renewed at least 10 s before, so at once after 2 s.
        let body = r#"exp=$(date -u -d "+12 seconds" +%Y-%m-%dT%H:%M:%SZ)
echo "{\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t-$$\",\"expirationTimestamp\":\"$exp\"}}""#;
        let (credentials, runs) = credentials(script(dir.path(), "p", body));
        let first = credentials.token().await.expect("a token");
        let held = credentials.token().await.expect("a token");
        assert_eq!(first.expose_secret(), held.expose_secret(), "fresh: held");
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let renewed = credentials.token().await.expect("a token");
        assert_ne!(first.expose_secret(), renewed.expose_secret());
        assert_eq!(runs.lock().expect("runs").len(), 2);
    }

    #[tokio::test]
    async fn a_failing_plugin_says_its_exit_code_alone_and_backs_off() {
        let dir = temp();
        let body = "echo 'password=hunter2' >&2\necho 'token=hunter2'\nexit 3";
        let (credentials, runs) = credentials(script(dir.path(), "p", body));
        let failure = credentials.token().await.expect_err("a failure");
        assert_eq!(
            failure,
            PluginFailure::Failed {
                provider: "test".to_owned(),
                code: Some(3)
            }
        );
        assert!(!failure.to_string().contains("hunter2"), "{failure}");
        // Within its backoff the plugin does not run again.
        let again = credentials.token().await.expect_err("a failure");
        assert!(matches!(again, PluginFailure::Backoff { .. }), "{again}");
        assert!(
            again.to_string().contains("failed (exit code 3)"),
            "{again}"
        );
        assert_eq!(*runs.lock().expect("runs"), ["failed"]);
    }

    #[tokio::test]
    async fn output_that_is_no_credential_is_not_quoted() {
        let dir = temp();
        for (body, what) in [
            ("echo 'secret-value not json'", "its output is not JSON"),
            (r#"echo '{"kind":"Other","status":{"token":"x"}}'"#, "kind"),
            (
                r#"echo '{"kind":"ExecCredential","status":{}}'"#,
                "status.token",
            ),
        ] {
            let (credentials, _) = credentials(script(dir.path(), "p", body));
            let failure = credentials.token().await.expect_err("a failure");
            let said = failure.to_string();
            assert!(
                said.contains(what) && !said.contains("secret-value"),
                "{said}"
            );
        }
    }

    #[tokio::test]
    async fn a_plugin_that_hangs_fails_at_its_deadline() {
        let dir = temp();
        let (credentials, runs) = credentials_within(
            script(dir.path(), "p", "exec sleep 600"),
            Duration::from_millis(500),
        );
        // A caller that gives up first leaves the run to finish and be kept.
        let gave_up = tokio::time::timeout(Duration::from_millis(100), credentials.token()).await;
        assert!(gave_up.is_err(), "{gave_up:?}");
        tokio::time::sleep(Duration::from_millis(600)).await;
        let failure = credentials.token().await.expect_err("a failure");
        assert!(
            matches!(&failure, PluginFailure::Backoff { last, .. }
                if matches!(**last, PluginFailure::TimedOut { .. })),
            "{failure}"
        );
        assert_eq!(*runs.lock().expect("runs"), ["timed_out"]);
    }

    #[test]
    fn the_margin_is_a_fifth_of_the_life_and_at_least_ten_seconds() {
        let now = Utc::now();
        let at = |life: i64| {
            renew_at(now, now + chrono::Duration::seconds(life))
                .saturating_duration_since(Instant::now())
        };
        let close = |d: Duration, want: u64| d.as_secs().abs_diff(want) <= 1;
        assert!(close(at(60), 48));
        assert!(close(at(3600), 2880));
        assert!(close(at(30), 20));
        assert!(close(at(5), 0));
        assert_eq!(backoff(1), BACKOFF_FIRST);
        assert_eq!(backoff(20), BACKOFF_MAX);
    }
}
