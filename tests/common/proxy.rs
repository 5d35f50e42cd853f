//! A TCP proxy between the operator and the API server that can fail the
//! way networks do. TLS goes through end to end (the server certificate
//! names 127.0.0.1).
//!
//! * [`Mode::Forward`]: bytes flow.
//! * [`Mode::Stall`]: a half-dead network. Every connection open when it
//!   begins stays open but carries no byte again, in either direction, and
//!   never closes on the proxy's side: what either end sends is lost, as
//!   when a NAT or a load balancer forgets its connections. A client waits
//!   on such a connection until its own deadline gives up. Connections
//!   opened during the stall are held (their bytes too) and go through once
//!   the network heals, as a connect whose SYN is retransmitted would.
//! * [`Mode::Cut`]: every connection is dropped (both ends see it close)
//!   and new ones are held until forwarding resumes.
//!
//! The proxy counts the connections it accepts, by the mode they arrived in:
//! an operator that retries in a loop opens many.
//!
//! Apart from the mode, [`Proxy::hold_h2_replies`] holds what the API server
//! sends on connections whose TLS ClientHello offers HTTP/2 (the operator's
//! watches and lists, by default) while HTTP/1 connections (its writes)
//! flow: watch events arrive late, as they do behind a slow link, and in
//! order once [`Proxy::release_h2_replies`] is called.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Stall,
    Cut,
}

#[derive(Default)]
struct Counts {
    /// Connections accepted, by the mode at their arrival.
    forward: AtomicUsize,
    stall: AtomicUsize,
    cut: AtomicUsize,
}

/// The mode, and the stalls so far: a connection accepted before the
/// latest stall began is dead.
type State = (Mode, u64);

pub struct Proxy {
    pub port: u16,
    state: watch::Sender<State>,
    /// Whether the replies on HTTP/2 connections are held.
    h2_held: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    counts: Arc<Counts>,
    task: JoinHandle<()>,
}

/// Waits until the bytes of a connection accepted after `stalls` stalls may
/// flow; `false` when the proxy is gone. A connection a later stall
/// caught waits for ever (until its task ends).
async fn forwarding(state: &mut watch::Receiver<State>, stalls: u64) -> bool {
    state
        .wait_for(|(mode, now)| *mode == Mode::Forward && *now == stalls)
        .await
        .is_ok()
}

/// Copies `from` to `to`, holding every chunk read until it may flow (and,
/// with `held`, until that is false).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    stalls: u64,
    mut held: Option<watch::Receiver<bool>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                if state.borrow().1 == stalls {
                    let _ = to.shutdown().await;
                }
                return;
            }
            Ok(n) => n,
        };
        if let Some(held) = held.as_mut()
            && held.wait_for(|held| !*held).await.is_err()
        {
            return;
        }
        if !forwarding(&mut state, stalls).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Reads the client's first TLS record (its ClientHello) from `inbound`;
/// returns the bytes read, to be sent on, and whether it offers HTTP/2.
async fn read_client_hello(inbound: &mut TcpStream) -> Option<(Vec<u8>, bool)> {
    let mut hello = vec![0u8; 5];
    inbound.read_exact(&mut hello).await.ok()?;
    if hello[0] != 0x16 {
        // Not TLS: nothing to wait for.
        return Some((hello, false));
    }
    let length = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
    hello.resize(5 + length, 0);
    inbound.read_exact(&mut hello[5..]).await.ok()?;
    let offers_h2 = alpn_protocols(&hello).is_some_and(|p| p.iter().any(|p| *p == b"h2"));
    Some((hello, offers_h2))
}

/// The ALPN protocols a TLS ClientHello record offers (RFC 8446 4.1.2,
/// RFC 7301); `None` when the record is not one.
fn alpn_protocols(record: &[u8]) -> Option<Vec<&[u8]>> {
    let u16_at = |b: &[u8], at: usize| -> Option<usize> {
        Some(usize::from(u16::from_be_bytes([
            *b.get(at)?,
            *b.get(at + 1)?,
        ])))
    };
    if record.first() != Some(&0x16) || record.get(5) != Some(&0x01) {
        return None;
    }
    // Handshake header (4 bytes), legacy version (2), random (32).
    let body = record.get(9..)?;
    let mut at = 34;
    at += 1 + usize::from(*body.get(at)?); // session id
    at += 2 + u16_at(body, at)?; // cipher suites
    at += 1 + usize::from(*body.get(at)?); // compression methods
    let end = at + 2 + u16_at(body, at)?;
    at += 2;
    while at + 4 <= end {
        let (kind, length) = (u16_at(body, at)?, u16_at(body, at + 2)?);
        at += 4;
        if kind == 0x10 {
            let list = body.get(at + 2..at + 2 + u16_at(body, at)?)?;
            let mut protocols = Vec::new();
            let mut i = 0;
            while i < list.len() {
                let n = usize::from(list[i]);
                protocols.push(list.get(i + 1..i + 1 + n)?);
                i += 1 + n;
            }
            return Some(protocols);
        }
        at += length;
    }
    Some(Vec::new())
}

impl Proxy {
    /// A proxy to `upstream`, forwarding.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (state, rx) = watch::channel((Mode::Forward, 0));
        let (h2_held, held_rx) = watch::channel(false);
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let counts: Arc<Counts> = Arc::default();
        let (live, counted) = (connections.clone(), counts.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (arrived, stalls) = *rx.borrow();
                match arrived {
                    Mode::Forward => &counted.forward,
                    Mode::Stall => &counted.stall,
                    Mode::Cut => &counted.cut,
                }
                .fetch_add(1, Ordering::Relaxed);
                let mut gate = rx.clone();
                let held = held_rx.clone();
                let connection = tokio::spawn(async move {
                    let mut inbound = inbound;
                    // A new connection reaches the API server only when
                    // bytes may flow.
                    if !forwarding(&mut gate, stalls).await {
                        return;
                    }
                    let Some((hello, offers_h2)) = read_client_hello(&mut inbound).await else {
                        return;
                    };
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    if outbound.write_all(&hello).await.is_err() {
                        return;
                    }
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::join!(
                        pump(in_read, out_write, gate.clone(), stalls, None),
                        pump(out_read, in_write, gate, stalls, offers_h2.then_some(held)),
                    );
                });
                let mut live = live.lock().unwrap();
                live.retain(|c| !c.is_finished());
                live.push(connection.abort_handle());
            }
        });
        Proxy {
            port,
            state,
            h2_held,
            connections,
            counts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn forward(&self) {
        self.state.send_modify(|s| s.0 = Mode::Forward);
    }

    /// Every open connection goes dead; new ones are held.
    pub fn stall(&self) {
        self.state.send_modify(|s| *s = (Mode::Stall, s.1 + 1));
    }

    /// Drops every connection and holds new ones.
    pub fn cut(&self) {
        self.state.send_modify(|s| s.0 = Mode::Cut);
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// From now on, what the API server sends on HTTP/2 connections is
    /// held (see the module's comment).
    pub fn hold_h2_replies(&self) {
        self.h2_held.send_replace(true);
    }

    /// What was held goes on, in order.
    pub fn release_h2_replies(&self) {
        self.h2_held.send_replace(false);
    }

    /// Connections accepted while forwarding, stalled and cut, so far.
    pub fn accepted(&self) -> (usize, usize, usize) {
        (
            self.counts.forward.load(Ordering::Relaxed),
            self.counts.stall.load(Ordering::Relaxed),
            self.counts.cut.load(Ordering::Relaxed),
        )
    }

    /// Connections open now (held ones included).
    pub fn open_connections(&self) -> usize {
        let mut live = self.connections.lock().unwrap();
        live.retain(|c| !c.is_finished());
        live.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}
