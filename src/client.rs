//! The client the operator talks to the API server with. Every request has
//! a deadline, and over TLS every request and watch shares one HTTP/2
//! connection, so the number of connections does not grow with the number
//! of rules, watches or writes in flight (HTTP/1 needs one per request in
//! flight, and a watch holds one for its whole life).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ConfigExt, DynBody};
use thiserror::Error;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// Seconds a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle HTTP/2 connection is pinged, and how long an answer
/// may take before the connection counts as dead and is replaced (a
/// half-open connection would otherwise stall every request on it).
pub const PING_EVERY: Duration = Duration::from_secs(5);
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("cannot set up TLS to the API server: {0}")]
    Tls(#[source] kube::Error),
    #[error("cannot set up authentication to the API server: {0}")]
    Auth(#[source] kube::Error),
    #[error("invalid TLS server name {name:?}")]
    ServerName { name: String },
}

/// How the client reaches the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// One HTTP/2 connection over TLS (HTTP/1 when the server URL is plain http).
    Http2,
    /// kube's own client: a connection per request in flight.
    Http1,
}

/// A client for `config` over `transport`. `deadline` bounds the wait for
/// each response's headers, and then for each part of its body: a watch
/// streams on as long as it brings something (the server ends it well
/// within the deadline when it has nothing to say), and a stream that
/// falls silent on a connection that is otherwise alive fails instead of
/// hanging.
pub fn build(
    config: kube::Config,
    transport: Transport,
    deadline: Duration,
) -> Result<kube::Client, BuildError> {
    let https = config.cluster_url.scheme_str() == Some("https");
    if transport == Transport::Http1 || !https {
        return kube::Client::try_from(config).map_err(BuildError::Kube);
    }
    // The connector below asks for HTTP/2 by ALPN itself.
    let tls = config.rustls_client_config().map_err(ClientError::Tls)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    let connector = match &config.tls_server_name {
        Some(name) => {
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                name.clone()
                    .try_into()
                    .map_err(|_| ClientError::ServerName { name: name.clone() })?,
            ))
        }
        None => builder,
    }
    .enable_http2()
    .wrap_connector(http);
    // The deadline covers the TLS handshake too, and reads: the pings keep
    // a live connection from ever being silent that long.
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.set_read_timeout(Some(deadline));
    let http_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        // Known to be HTTP/2 before connecting: requests that start together
        // wait for the one connection instead of each opening its own.
        .http2_only(true)
        .http2_keep_alive_interval(PING_EVERY)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let default_namespace = config.default_namespace.clone();
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(ClientError::Auth)?)
        .layer(config.extra_headers_layer().map_err(ClientError::Auth)?)
        .layer(tower::timeout::TimeoutLayer::new(deadline))
        .service(http_client.map_err(BoxError::from))
        .map_err(BoxError::from)
        .map_response(move |response| {
            response.map(|body| Box::new(IdleDeadline::new(body, deadline)) as Box<DynBody>)
        });
    Ok(kube::Client::new(service, default_namespace))
}

#[derive(Debug, Error)]
pub enum BuildError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot build the Kubernetes API client: {0}")]
    Kube(#[source] kube::Error),
}

/// A response body that fails when nothing arrives for `idle`.
struct IdleDeadline<B> {
    inner: B,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<B> IdleDeadline<B> {
    fn new(inner: B, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
        }
    }
}

impl<B> Body for IdleDeadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = tokio::time::Instant::now() + this.idle;
                this.timer.as_mut().reset(next);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "nothing received from the API server for {} s",
                    this.idle.as_secs()
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    fn body_of(
        parts: Vec<(u64, &'static str)>,
    ) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
        let stream = futures::stream::iter(parts).then(|(delay, text)| async move {
            tokio::time::sleep(Duration::from_secs(delay)).await;
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(text.as_bytes())))
        });
        StreamBody::new(Box::pin(stream))
    }

    use futures::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_coming_is_read_whole() {
        let body = IdleDeadline::new(
            body_of(vec![(3, "a"), (3, "b"), (3, "c")]),
            Duration::from_secs(5),
        );
        let bytes = body.collect().await.map(|c| c.to_bytes());
        assert_eq!(bytes.ok().as_deref(), Some(&b"abc"[..]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_falls_silent_fails() {
        let body = IdleDeadline::new(body_of(vec![(1, "a"), (30, "b")]), Duration::from_secs(5));
        let error = body.collect().await.err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("nothing received from the API server for 5 s")
        );
    }
}
