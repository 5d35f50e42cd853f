//! `copyrator probe URL`: asks a running operator's /healthz or /readyz and
//! exits 0 on 200, so that an image with nothing but this binary (a `helm
//! test` Pod, say) can check an operator without curl or a shell.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ProbeError {
    #[error("{0}: only http://HOST:PORT/PATH is understood")]
    BadUrl(String),
    #[error("{url}: {message}")]
    Failed { url: String, message: String },
    #[error("{url} answered {status}: {body}")]
    NotOk {
        url: String,
        status: u16,
        body: String,
    },
}

/// `http://host[:port]/path` as (host, port, path).
pub(crate) fn parse_url(url: &str) -> Result<(String, u16, String), ProbeError> {
    let bad = || ProbeError::BadUrl(url.to_string());
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    // An IPv6 address is in brackets: its colons are not the port's.
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']').ok_or_else(bad)?;
            match after.strip_prefix(':') {
                Some(port) => (host, port.parse::<u16>().map_err(|_| bad())?),
                None if after.is_empty() => (host, 80),
                None => return Err(bad()),
            }
        }
        None => match authority.split_once(':') {
            Some((host, port)) => (host, port.parse::<u16>().map_err(|_| bad())?),
            None => (authority, 80),
        },
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port, path.to_string()))
}

/// The status code and the body of an HTTP/1.0 answer.
pub(crate) fn parse_answer(answer: &str) -> Option<(u16, &str)> {
    let status_line = answer.lines().next()?;
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Some((status, body))
}

/// GET `url`; Ok when it answers 200 within `timeout`.
pub(crate) async fn probe(url: &str, timeout: Duration) -> Result<(), ProbeError> {
    let (host, port, path) = parse_url(url)?;
    let failed = |message: String| ProbeError::Failed {
        url: url.to_string(),
        message,
    };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| failed(format!("connecting: {e}")))?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| failed(format!("sending: {e}")))?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| failed(format!("reading: {e}")))?;
        Ok::<_, ProbeError>(String::from_utf8_lossy(&answer).into_owned())
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| failed(format!("no answer within {timeout:?}")))??;
    match parse_answer(&answer) {
        Some((200, _)) => Ok(()),
        Some((status, body)) => Err(ProbeError::NotOk {
            url: url.to_string(),
            status,
            body: body.trim().to_string(),
        }),
        None => Err(failed("not an HTTP answer".into())),
    }
}

/// `copyrator probe URL`: a current-thread runtime, one request; exit 0
/// on 200, 1 otherwise (said on standard error).
pub(crate) fn run(url: &str, timeout: Duration) -> std::process::ExitCode {
    let builder = tokio::runtime::Builder::new_current_thread();
    let runtime = match crate::cli::start_runtime(builder, std::process::ExitCode::FAILURE) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(probe(url, timeout)) {
        Ok(()) => {
            println!("{url}: ok");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_port_and_path() {
        assert_eq!(
            parse_url("http://10.0.0.7:8080/readyz"),
            Ok(("10.0.0.7".into(), 8080, "/readyz".into()))
        );
        assert_eq!(
            parse_url("http://copyrator.ops.svc"),
            Ok(("copyrator.ops.svc".into(), 80, "/".into()))
        );
        assert_eq!(
            parse_url("http://[::1]:9/healthz"),
            Ok(("::1".into(), 9, "/healthz".into()))
        );
        for bad in [
            "https://a:1/",
            "a:1/healthz",
            "http://:80/",
            "http://a:port/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn answers_give_status_and_body() {
        assert_eq!(
            parse_answer(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 11\r\n\r\nnot synced\n"
            ),
            Some((503, "not synced\n"))
        );
        assert_eq!(
            parse_answer("HTTP/1.1 200 OK\r\n\r\nok\n"),
            Some((200, "ok\n"))
        );
        assert_eq!(parse_answer("garbage"), None);
    }

    #[tokio::test]
    async fn a_probe_passes_on_200_and_fails_otherwise() {
        let serve = |answer: &'static str| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(async move {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 512];
                let _ = stream.read(&mut request).await;
                let _ = stream.write_all(answer.as_bytes()).await;
            });
            port
        };
        let ok = serve("HTTP/1.1 200 OK\r\n\r\nok\n").await;
        assert_eq!(
            probe(
                &format!("http://127.0.0.1:{ok}/readyz"),
                Duration::from_secs(5)
            )
            .await,
            Ok(())
        );
        let not_ready = serve("HTTP/1.1 503 Service Unavailable\r\n\r\nnot synced\n").await;
        let url = format!("http://127.0.0.1:{not_ready}/readyz");
        assert_eq!(
            probe(&url, Duration::from_secs(5)).await,
            Err(ProbeError::NotOk {
                url: url.clone(),
                status: 503,
                body: "not synced".into()
            })
        );
        let closed = serve("").await;
        assert!(
            probe(
                &format!("http://127.0.0.1:{closed}/"),
                Duration::from_secs(5)
            )
            .await
            .is_err()
        );
    }
}
