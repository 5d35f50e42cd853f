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

/// Copies `from` to `to`, holding every chunk read until it may flow.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    stalls: u64,
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
        if !forwarding(&mut state, stalls).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    /// A proxy to `upstream`, forwarding.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (state, rx) = watch::channel((Mode::Forward, 0));
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
                let connection = tokio::spawn(async move {
                    // A new connection reaches the API server only when
                    // bytes may flow.
                    if !forwarding(&mut gate, stalls).await {
                        return;
                    }
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::join!(
                        pump(in_read, out_write, gate.clone(), stalls),
                        pump(out_read, in_write, gate, stalls),
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
