//! The clients the operator talks to the API server with. Every request has
//! a deadline. By default (`mixed`) the watches and lists share one HTTP/2
//! connection over TLS, so their number (one per rule-independent watch,
//! however many rules there are) costs no connections (past
//! [`WATCHES_PER_CONNECTION`] source watches, another connection carries
//! the next ones: the API server serves a bounded number of streams on
//! one connection), while writes go
//! over HTTP/1, a connection per write in flight (at most
//! `--write-concurrency`): the API server serves writes spread over
//! connections measurably faster than the same writes on one HTTP/2
//! connection. So the connections stay bounded by a setting whatever the
//! number of rules or watches.
//!
//! Why not kube's default client (what `Client::try_from(Config)` builds,
//! still used over plain http): its TLS connector offers HTTP/1 alone, a
//! connection per request in flight and one per watch. Measured by the
//! benchmark (BENCHMARKS.md, "`--api-transport mixed`"): this split holds
//! 17 connections at the peak at every size (1 + 16 writes), against 25–26
//! with HTTP/1 alone at 10,000 copies (the target is at most 20) and 20–22
//! with the split but no cap on write connections. One HTTP/2 connection
//! for everything holds 1, but a cold start of 10,000 copies took 13.33 s
//! against a plain client's 9.26 s (1.44×), where the split took 1.08×.
//!
//! A member cluster's API server is at an address the inventory's writer
//! chose, and may be no Kubernetes API server at all: its clients pass an
//! error answer on only where it is a Kubernetes Status, and put one of
//! their own (the status code and a fixed reason) in place of anything
//! else, before kube reads it ([`ApiServer::Member`]). So no page of
//! whatever answers there reaches a status, an Event or a log.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use std::sync::Arc;

use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ConfigExt, DynBody};
use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{BoxError, ServiceBuilder, ServiceExt};

use crate::cluster::credential_plugin::{PluginAuthLayer, PluginCredentials};

/// Seconds a connection may take to open.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle HTTP/2 connection is pinged, and how long an answer
/// may take before the connection counts as dead and is replaced (a
/// half-open connection would otherwise stall every request on it).
pub(crate) const PING_EVERY: Duration = Duration::from_secs(5);
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no client could be built for the API server.
#[derive(Debug, Error)]
pub(crate) enum BuildError {
    #[error("a credential plugin's token is sent over TLS only, and the server is http://")]
    PluginOverPlainHttp,
    #[error("cannot set up TLS to the API server: {0}")]
    Tls(#[source] kube::Error),
    #[error("cannot set up authentication to the API server: {0}")]
    Auth(#[source] kube::Error),
    #[error("invalid TLS server name {name:?}")]
    ServerName { name: String },
    #[error("cannot build the Kubernetes API client: {0}")]
    Kube(#[source] kube::Error),
}

/// Whose API server the clients speak to.
#[derive(Clone)]
pub(crate) enum ApiServer {
    /// The home cluster's: its answers are passed on as they come.
    Home,
    /// A member's, at an address the inventory names: an error answer
    /// that is not a Kubernetes Status is replaced by one that says only
    /// its status code, reason [`BODY_WITHHELD`]. Its requests carry the
    /// token of a credential plugin where one gives its credentials.
    Member(Option<Arc<PluginCredentials>>),
}

/// The reason of the Status a member's client puts in place of an error
/// answer that is not a Kubernetes Status.
pub(crate) const BODY_WITHHELD: &str = "BodyWithheld";

/// The most of an error answer a member's client reads to tell whether it
/// is a Kubernetes Status; a longer one is withheld.
const STATUS_READ_LIMIT: usize = 256 * 1024;

/// How the clients reach the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Transport {
    /// Watches and lists on one HTTP/2 connection, writes over HTTP/1 (a
    /// connection per write in flight).
    Mixed,
    /// Everything on one HTTP/2 connection.
    Http2,
    /// Everything over HTTP/1: a connection per request in flight, and one
    /// per watch.
    Http1,
}

/// The client for reads (watches, lists, the Lease) and the one for writes
/// (copies, statuses, Events, finalizers); the same client unless the
/// transport is `mixed`. Over plain http (no TLS to negotiate HTTP/2 by)
/// both are HTTP/1.
#[derive(Clone)]
pub(crate) struct Clients {
    pub(crate) read: kube::Client,
    pub(crate) write: kube::Client,
    /// Opens another connection for watches, where `read` multiplexes them
    /// on one HTTP/2 connection (see [`WatchConnections`]); none where each
    /// watch has a connection of its own anyway (HTTP/1).
    pub(crate) more_reads: Option<OpenRead>,
}

/// Builds another read client: a connection of its own.
pub(crate) type OpenRead = Arc<dyn Fn() -> Option<kube::Client> + Send + Sync>;

/// Source watches on one HTTP/2 connection, at most. The API server serves
/// at most `--http2-max-streams-per-connection` streams at once on one
/// connection, and kube-apiserver's default (0) means 100; a watch started
/// past it waits for a stream until its request times out, and its
/// sources' changes are seen only when it gets one. So the source watches
/// take another connection every this many, which leaves room on the first
/// for the other watches, lists and the Lease.
pub(crate) const WATCHES_PER_CONNECTION: usize = 64;

/// The connections the source watches ride on: the read client's, then
/// more, each opened when the ones before carry [`WATCHES_PER_CONNECTION`]
/// watches. A watch keeps its connection's slot until it stops.
pub(crate) struct WatchConnections {
    first: kube::Client,
    open_more: Option<OpenRead>,
    /// Each connection and the watches on it; the first is `first`.
    carrying: Vec<(kube::Client, usize)>,
}

impl WatchConnections {
    pub(crate) fn new(first: kube::Client, open_more: Option<OpenRead>) -> Self {
        Self {
            carrying: vec![(first.clone(), 0)],
            first,
            open_more,
        }
    }

    /// A connection for one more watch, and its slot (give it back with
    /// [`WatchConnections::release`]).
    pub(crate) fn take(&mut self) -> (kube::Client, usize) {
        if let Some(slot) = self
            .carrying
            .iter()
            .position(|(_, watches)| *watches < WATCHES_PER_CONNECTION)
        {
            self.carrying[slot].1 += 1;
            return (self.carrying[slot].0.clone(), slot);
        }
        // All full: another connection where one can be opened, else the
        // least loaded one (HTTP/1: every watch is a connection anyway).
        if let Some(client) = self.open_more.as_ref().and_then(|open| open()) {
            self.carrying.push((client.clone(), 1));
            return (client, self.carrying.len() - 1);
        }
        let slot = self
            .carrying
            .iter()
            .enumerate()
            .min_by_key(|(_, (_, watches))| *watches)
            .map_or(0, |(slot, _)| slot);
        match self.carrying.get_mut(slot) {
            Some((client, watches)) => {
                *watches += 1;
                (client.clone(), slot)
            }
            None => (self.first.clone(), 0),
        }
    }

    /// A watch on the connection of `slot` stopped.
    pub(crate) fn release(&mut self, slot: usize) {
        if let Some((_, watches)) = self.carrying.get_mut(slot) {
            *watches = watches.saturating_sub(1);
        }
    }

    /// The connections opened so far and the watches each carries.
    #[cfg(test)]
    pub(crate) fn load(&self) -> Vec<usize> {
        self.carrying.iter().map(|(_, watches)| *watches).collect()
    }
}

/// The clients for `config` over `transport`, with the deadline of [`build`].
/// `writes_in_flight` bounds the idle HTTP/1 connections kept for writes:
/// a connection handed back a moment after the next write started is
/// closed rather than kept beside the one that write opened.
/// The clients of one API server, every request with a deadline: a hung
/// or half-open connection fails the request (and is dropped) instead of
/// stalling a worker. Watches end on the server after
/// `WATCH_TIMEOUT_SECONDS`, well within the deadline, and resume from
/// where they were.
pub(crate) fn clients_with_deadlines(
    mut config: kube::Config,
    transport: Transport,
    writes_in_flight: usize,
    server: ApiServer,
) -> Result<Clients, BuildError> {
    let deadline = Duration::from_secs(u64::from(crate::cluster::watch::WATCH_TIMEOUT_SECONDS) + 5);
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(deadline);
    config.reset_reader_on_write = true;
    config.write_timeout = Some(Duration::from_secs(10));
    // kube's own retry of 429/503 (up to 15 times, hidden from us) would
    // multiply requests; failures come back to the per-copy backoff instead.
    config.default_retry = false;
    build_clients(config, transport, deadline, writes_in_flight, server)
}

pub(crate) fn build_clients(
    config: kube::Config,
    transport: Transport,
    deadline: Duration,
    writes_in_flight: usize,
    server: ApiServer,
) -> Result<Clients, BuildError> {
    let (read, write) = match transport {
        Transport::Http1 => (Transport::Http1, None),
        Transport::Http2 => (Transport::Http2, None),
        Transport::Mixed => (Transport::Http2, Some(Transport::Http1)),
    };
    // The writer never has more than `writes_in_flight` requests out, so a
    // write client of its own needs no more connections than that; a
    // client that also watches has no such bound (a watch holds its
    // connection for good).
    let read_client = build(
        config.clone(),
        read,
        deadline,
        writes_in_flight,
        None,
        server.clone(),
    )?;
    let more_reads: Option<OpenRead> =
        (read == Transport::Http2 && config.cluster_url.scheme_str() == Some("https")).then(|| {
            let (config, server) = (config.clone(), server.clone());
            Arc::new(move || {
                build(
                    config.clone(),
                    Transport::Http2,
                    deadline,
                    writes_in_flight,
                    None,
                    server.clone(),
                )
                .ok()
            }) as OpenRead
        });
    let write_client = match write {
        Some(write) => build(
            config,
            write,
            deadline,
            writes_in_flight,
            Some(writes_in_flight),
            server,
        )?,
        None => read_client.clone(),
    };
    Ok(Clients {
        read: read_client,
        write: write_client,
        more_reads,
    })
}

/// A client for `config` over `transport`. `deadline` bounds the wait for
/// each response's headers, and then for each part of its body: a watch
/// streams on as long as it brings something (the server ends it well
/// within the deadline when it has nothing to say), and a stream that
/// falls silent on a connection that is otherwise alive fails instead of
/// hanging.
pub(crate) fn build(
    config: kube::Config,
    transport: Transport,
    deadline: Duration,
    max_idle_http1: usize,
    max_connections: Option<usize>,
    server: ApiServer,
) -> Result<kube::Client, BuildError> {
    let https = config.cluster_url.scheme_str() == Some("https");
    if !https {
        return match server {
            ApiServer::Home => kube::Client::try_from(config).map_err(BuildError::Kube),
            // A plugin's token goes over TLS only.
            ApiServer::Member(Some(_)) => Err(BuildError::PluginOverPlainHttp),
            ApiServer::Member(None) => member_client(config),
        };
    }
    let http2 = transport != Transport::Http1;
    // The connector below asks for the protocol by ALPN itself.
    let tls = config.rustls_client_config().map_err(BuildError::Tls)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    let protocols = match &config.tls_server_name {
        Some(name) => {
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                name.clone()
                    .try_into()
                    .map_err(|_| BuildError::ServerName { name: name.clone() })?,
            ))
        }
        None => builder,
    };
    // Only the protocol asked for is offered: an HTTP/1 client offered
    // HTTP/2 by the server would multiplex every write on one connection.
    let connector = if http2 {
        protocols.enable_http2().wrap_connector(http)
    } else {
        protocols.enable_http1().wrap_connector(http)
    };
    let connector = CappedConnector {
        inner: connector,
        permits: max_connections.map(|n| Arc::new(Semaphore::new(n))),
    };
    // The deadline covers the TLS handshake too, and reads: the pings keep
    // a live connection from ever being silent that long.
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.set_read_timeout(Some(deadline));
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new());
    if http2 {
        // Known to be HTTP/2 before connecting: requests that start together
        // wait for the one connection instead of each opening its own.
        builder
            .http2_only(true)
            .http2_keep_alive_interval(PING_EVERY)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true);
    } else {
        builder.pool_max_idle_per_host(max_idle_http1);
    }
    let http_client = builder.build(connector);
    let default_namespace = config.default_namespace.clone();
    let plugin = match &server {
        ApiServer::Member(plugin) => plugin.clone().map(PluginAuthLayer),
        ApiServer::Home => None,
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(BuildError::Auth)?)
        .option_layer(plugin)
        .layer(config.extra_headers_layer().map_err(BuildError::Auth)?)
        .layer(tower::timeout::TimeoutLayer::new(deadline))
        .service(http_client.map_err(BoxError::from))
        .map_err(BoxError::from)
        .map_response(move |response| {
            response.map(|body| Box::new(IdleDeadline::new(body, deadline)) as Box<DynBody>)
        });
    Ok(match server {
        ApiServer::Home => kube::Client::new(service, default_namespace),
        ApiServer::Member(_) => kube::Client::new(StatusOnly { inner: service }, default_namespace),
    })
}

/// A client of a member's API server on kube's own stack (for a command
/// that asks a little and goes, and for a member over plain http), with the
/// member's error answers passed on only where they are a Kubernetes
/// Status ([`ApiServer::Member`]).
pub(crate) fn member_client(config: kube::Config) -> Result<kube::Client, BuildError> {
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(BuildError::Kube)?
        .with_layer(&StatusOnlyLayer)
        .build())
}

/// Wraps a service in [`StatusOnly`].
struct StatusOnlyLayer;

impl<S> tower::Layer<S> for StatusOnlyLayer {
    type Service = StatusOnly<S>;

    fn layer(&self, inner: S) -> StatusOnly<S> {
        StatusOnly { inner }
    }
}

/// Passes an error answer (4xx, 5xx) on only where its body is a Kubernetes
/// Status (`"kind": "Status"`, `"apiVersion": "v1"`, as every Kubernetes
/// API server's is), and puts in place of any other one (an HTML page, a
/// text, JSON of another shape, or more than [`STATUS_READ_LIMIT`]) a
/// Status that says only its status code, reason [`BODY_WITHHELD`]. Other
/// answers pass as they come.
#[derive(Clone)]
struct StatusOnly<S> {
    inner: S,
}

impl<S, Request, B> tower::Service<Request> for StatusOnly<S>
where
    S: tower::Service<Request, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await.map_err(Into::into)?;
            let code = response.status();
            if !(code.is_client_error() || code.is_server_error()) {
                return Ok(response.map(|body| Box::new(body.map_err(Into::into)) as Box<DynBody>));
            }
            let (mut parts, body) = response.into_parts();
            let read = Limited::new(body, STATUS_READ_LIMIT).collect().await;
            let kept = match read {
                Ok(collected) => Some(collected.to_bytes()).filter(|bytes| is_status(bytes)),
                Err(error) if error.is::<LengthLimitError>() => None,
                Err(error) => return Err(error),
            };
            let body = match kept {
                Some(status) => status,
                None => {
                    for header in [
                        http::header::CONTENT_LENGTH,
                        http::header::CONTENT_ENCODING,
                        http::header::CONTENT_TYPE,
                    ] {
                        parts.headers.remove(header);
                    }
                    withheld(code)
                }
            };
            let body = Full::new(body).map_err(|never| -> BoxError { match never {} });
            Ok(http::Response::from_parts(
                parts,
                Box::new(body) as Box<DynBody>,
            ))
        })
    }
}

/// Whether an answer's body is a Kubernetes Status.
fn is_status(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|value| value["kind"] == "Status" && value["apiVersion"] == "v1")
}

/// The Status said in place of an error answer that is not one: its
/// status code, and nothing of its body.
fn withheld(code: http::StatusCode) -> Bytes {
    let said = match code.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", code.as_u16()),
        None => format!("HTTP {}", code.as_u16()),
    };
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "code": code.as_u16(),
        "reason": BODY_WITHHELD,
        "message": format!("{said}, not a Kubernetes Status; its body is not shown"),
    });
    Bytes::from(status.to_string())
}

/// A connector that keeps at most as many connections open as it has
/// permits: each connection holds one until it is closed. Without it, a
/// connection on its way back to the pool as the next write starts makes
/// that write open one more, and the pool creeps past the writes in flight.
#[derive(Clone)]
struct CappedConnector<C> {
    inner: C,
    permits: Option<Arc<Semaphore>>,
}

impl<C> tower::Service<http::Uri> for CappedConnector<C>
where
    C: tower::Service<http::Uri> + Clone + Send + 'static,
    C::Future: Send,
    C::Response: Send,
    C::Error: Into<BoxError>,
{
    type Response = Capped<C::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        // The instance polled ready makes the call; a fresh clone stays.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let permits = self.permits.clone();
        Box::pin(async move {
            let permit = match permits {
                Some(permits) => Some(permits.acquire_owned().await.map_err(BoxError::from)?),
                None => None,
            };
            let io = inner.call(uri).await.map_err(Into::into)?;
            Ok(Capped {
                io,
                _permit: permit,
            })
        })
    }
}

/// A connection that gives its permit back when it is closed.
struct Capped<T> {
    io: T,
    _permit: Option<OwnedSemaphorePermit>,
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Capped<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Capped<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

impl<T: Connection> Connection for Capped<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
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

    /// Watches fill a connection up to the bound, then another is opened;
    /// a slot given back is taken again before a new connection is.
    #[tokio::test]
    async fn source_watches_take_another_connection_past_the_bound() {
        let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = opened.clone();
        let open: OpenRead = Arc::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(crate::cluster::fake_objects::never_asked_client())
        });
        let first = crate::cluster::fake_objects::never_asked_client();
        let mut connections = WatchConnections::new(first, Some(open));
        let slots: Vec<usize> = (0..WATCHES_PER_CONNECTION)
            .map(|_| connections.take().1)
            .collect();
        assert!(slots.iter().all(|slot| *slot == 0));
        assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(
            connections.take().1,
            1,
            "the next watch on a new connection"
        );
        assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(connections.load(), [WATCHES_PER_CONNECTION, 1]);
        connections.release(0);
        assert_eq!(
            connections.take().1,
            0,
            "a slot freed on the first is taken"
        );
        assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Where no connection can be opened, the least loaded one carries it.
        let mut http1 =
            WatchConnections::new(crate::cluster::fake_objects::never_asked_client(), None);
        for _ in 0..=WATCHES_PER_CONNECTION {
            http1.take();
        }
        assert_eq!(http1.load(), [WATCHES_PER_CONNECTION + 1]);
    }
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
    async fn connections_past_the_cap_wait_for_one_to_close() {
        use tower::Service;
        let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = opened.clone();
        let inner = tower::service_fn(move |_: http::Uri| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, BoxError>(())
            }
        });
        let mut connector = CappedConnector {
            inner,
            permits: Some(Arc::new(Semaphore::new(2))),
        };
        let uri = http::Uri::from_static("https://127.0.0.1:6443");
        let first = connector.call(uri.clone()).await;
        let second = connector.call(uri.clone()).await;
        assert!(first.is_ok() && second.is_ok());
        let mut third = connector.call(uri.clone());
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut third)
                .await
                .is_err(),
            "a third connection must wait while two are open"
        );
        assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 2);
        drop(first);
        assert!(third.await.is_ok(), "a closed connection makes room");
        assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_coming_is_read_whole() {
        let body = IdleDeadline::new(
            body_of(vec![(3, "a"), (3, "b"), (3, "c")]),
            Duration::from_secs(5),
        );
        let bytes = body.collect().await.map(|c| c.to_bytes());
        assert_eq!(bytes.ok().as_deref(), Some(&b"abc"[..]));
    }

    /// A service that answers every request with `code` and `body`.
    fn answering(
        code: u16,
        body: &'static str,
    ) -> impl tower::Service<
        http::Request<kube::client::Body>,
        Response = http::Response<Full<Bytes>>,
        Error = BoxError,
        Future = impl Future<Output = Result<http::Response<Full<Bytes>>, BoxError>> + Send,
    > + Clone {
        tower::service_fn(move |_: http::Request<kube::client::Body>| async move {
            let response = http::Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "text/html")
                .header(http::header::CONTENT_LENGTH, body.len())
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .map_err(BoxError::from)?;
            Ok::<_, BoxError>(response)
        })
    }

    /// What a member's client makes of that answer: its status code and body.
    async fn as_member_sees(code: u16, body: &'static str) -> (u16, String) {
        use tower::Service;
        let mut service = StatusOnly {
            inner: answering(code, body),
        };
        let request = http::Request::new(kube::client::Body::empty());
        let response = service.call(request).await.expect("an answer");
        let code = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        (code, String::from_utf8_lossy(&bytes).into_owned())
    }

    const PAGE: &str = "<html><body>internal admin page: db-password=hunter2</body></html>";
    const FORBIDDEN: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps is forbidden: User \"system:serviceaccount:copyrator:copyrator\" cannot list resource \"configmaps\"","reason":"Forbidden","details":{"kind":"configmaps"},"code":403}"#;

    #[tokio::test]
    async fn a_members_error_page_is_replaced_by_its_status_code() {
        for (code, body) in [
            (500, PAGE),
            (404, "404 page not found"),
            // JSON that is no Status: any object would parse as kube's.
            (
                403,
                r#"{"message":"db-password=hunter2","reason":"Forbidden"}"#,
            ),
            (502, ""),
        ] {
            let (seen_code, seen) = as_member_sees(code, body).await;
            assert_eq!(seen_code, code);
            assert!(
                !seen.contains("hunter2") && !seen.contains("page"),
                "{seen}"
            );
            let status: serde_json::Value = serde_json::from_str(&seen).expect("JSON");
            assert_eq!(status["kind"], "Status", "{seen}");
            assert_eq!(status["code"], code, "{seen}");
            assert_eq!(status["reason"], BODY_WITHHELD, "{seen}");
        }
    }

    #[tokio::test]
    async fn a_members_kubernetes_status_and_its_successes_pass_as_they_come() {
        assert_eq!(
            as_member_sees(403, FORBIDDEN).await,
            (403, FORBIDDEN.to_owned())
        );
        let version = r#"{"major":"1","minor":"37"}"#;
        assert_eq!(
            as_member_sees(200, version).await,
            (200, version.to_owned())
        );
        // A Status too long to be one is withheld, unread past the limit.
        let long: &'static str = Box::leak(
            FORBIDDEN
                .replace(
                    "cannot list",
                    &"cannot list ".repeat(STATUS_READ_LIMIT / 10),
                )
                .into_boxed_str(),
        );
        let (_, seen) = as_member_sees(403, long).await;
        assert!(seen.contains(BODY_WITHHELD), "{seen}");
    }

    #[tokio::test]
    async fn what_a_rule_is_told_of_a_members_error_page_is_its_status_code() {
        let client = kube::Client::new(
            StatusOnly {
                inner: answering(500, PAGE),
            },
            "default",
        );
        let error = client.apiserver_version().await.expect_err("a 500");
        let said = crate::error::describe(&error);
        assert_eq!(
            said,
            "HTTP 500 Internal Server Error, not a Kubernetes Status; its body is not shown \
             (BodyWithheld, 500)"
        );
        // A Kubernetes Status keeps the API server's words.
        let client = kube::Client::new(
            StatusOnly {
                inner: answering(403, FORBIDDEN),
            },
            "default",
        );
        let error = client.apiserver_version().await.expect_err("a 403");
        assert!(
            matches!(&error, kube::Error::Api(status) if status.code == 403 && status.reason == "Forbidden")
        );
        assert!(crate::error::describe(&error).contains("cannot list resource"));
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
