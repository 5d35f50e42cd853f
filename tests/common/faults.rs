//! Faults to inject from a test: a TCP proxy to the API server that can
//! stall (connections stay open, no byte moves), a kubeconfig that points
//! at it, and signals to the operator process (SIGSTOP / SIGCONT).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Operator, TestNs, random5};

/// The API server address of `$KUBECONFIG`'s current cluster.
pub async fn api_server_address() -> SocketAddr {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG is set");
    api_server_address_of(std::path::Path::new(&path)).await
}

/// The API server address of a kubeconfig's first cluster.
pub async fn api_server_address_of(kubeconfig: &std::path::Path) -> SocketAddr {
    let text = std::fs::read_to_string(kubeconfig)
        .unwrap_or_else(|e| panic!("reading {}: {e}", kubeconfig.display()));
    let config: serde_yaml::Value = serde_yaml::from_str(&text).expect("a YAML kubeconfig");
    let server = config["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("a server URL")
        .to_string();
    let hostport = server
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    tokio::net::lookup_host(hostport.as_str())
        .await
        .unwrap_or_else(|e| panic!("resolving {hostport}: {e}"))
        .next()
        .expect("an address")
}

/// A kubeconfig equal to `$KUBECONFIG` but for the API server address.
pub fn kubeconfig_with_server(t: &TestNs, server: &str) -> PathBuf {
    let original = std::env::var("KUBECONFIG").expect("KUBECONFIG is set");
    let text =
        std::fs::read_to_string(&original).unwrap_or_else(|e| panic!("reading {original}: {e}"));
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("a YAML kubeconfig");
    let clusters = config["clusters"]
        .as_sequence_mut()
        .expect("the kubeconfig lists clusters");
    for cluster in clusters {
        cluster["cluster"]["server"] = serde_yaml::Value::String(server.to_string());
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fault-kubeconfigs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{}.kubeconfig", t.prefix, random5()));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// A TCP proxy on 127.0.0.1 to `upstream` (TLS passes through end to end;
/// the API server's certificate names 127.0.0.1). `stall` makes it stop
/// moving bytes in both directions while every connection stays open, and
/// new ones are still accepted: a half-dead network, not a refused one.
/// `resume` moves the held bytes on.
pub struct StallProxy {
    pub port: u16,
    forwarding: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl StallProxy {
    pub async fn start(upstream: SocketAddr) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (forwarding, on) = watch::channel(true);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let on = on.clone();
                connections.spawn(async move {
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::join!(
                        pump(in_read, out_write, on.clone()),
                        pump(out_read, in_write, on)
                    );
                });
            }
        });
        StallProxy {
            port,
            forwarding,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn stall(&self) {
        self.forwarding.send_replace(false);
    }

    pub fn resume(&self) {
        self.forwarding.send_replace(true);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops the JoinSet, which aborts every connection.
        self.task.abort();
    }
}

/// Moves bytes one way while forwarding is on; a chunk read just before a
/// stall is held until it ends.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut on: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if on.wait_for(|on| *on).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if on.wait_for(|on| *on).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `kill -<signal> <pid>` of the operator (STOP, CONT, ...).
pub fn signal(operator: &Operator, signal: &str) {
    let pid = operator
        .pid()
        .expect("the operator process is running")
        .to_string();
    let ok = Command::new("kill")
        .args([format!("-{signal}"), pid.clone()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{signal} {pid} failed");
    if signal == "STOP" {
        wait_all_threads_stopped(&pid);
    }
}

/// `kill` returns once SIGSTOP is queued; the threads stop only when the
/// one picked to take it gets scheduled, which on a loaded machine can be
/// tens of milliseconds later. Until then the process keeps working.
fn wait_all_threads_stopped(pid: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let states = thread_states(pid);
        if !states.is_empty() && states.iter().all(|s| matches!(s, 'T' | 'Z')) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} not stopped 10 s after SIGSTOP: thread states {states:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The state letter of each thread of `pid`, from /proc/PID/task/*/stat
/// (the field after the parenthesised command name).
fn thread_states(pid: &str) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
            stat.rsplit_once(')')?.1.trim_start().chars().next()
        })
        .collect()
}
