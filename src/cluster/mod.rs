//! All that talks to one API server, and the only code that does: the
//! clients and their pacing, the reader, the writer, the Lease, and the
//! shared source watches; and the inventory of member clusters, read into
//! what their clients are built from.

pub(crate) mod access;
pub(crate) mod client;
pub(crate) mod context;
pub(crate) mod credential_plugin;
#[cfg(test)]
pub(crate) mod fake_objects;
pub(crate) mod foreign;
pub(crate) mod impersonation;
pub(crate) mod inventory;
pub(crate) mod leader;
pub(crate) mod limits;
pub(crate) mod mark_key;
pub(crate) mod provider_file;
pub(crate) mod ratelimit;
pub(crate) mod reader;
pub(crate) mod sources;
pub(crate) mod token_reviews;
pub(crate) mod tool_writes;
pub(crate) mod watch;
pub(crate) mod write_limit;
pub(crate) mod writer;

/// Requests to an API server leave only from here: outside `cluster/`,
/// code reads through [`reader::Reader`] and writes through
/// [`writer::Writer`] (or, for `copyrator release`, [`tool_writes`]).
#[cfg(test)]
mod only_way_in {
    use std::path::{Path, PathBuf};

    /// What builds or sends a request (or asks the Lease) by itself.
    const SENDS: &[&str] = &[
        // kube's typed requests (watchers, reflectors and controllers
        // need one too).
        "Api::",
        "Api<",
        "kube::Api",
        // API discovery.
        "pinned_kind(",
        "pinned_group(",
        "discovery::group(",
        "Discovery::new",
        "discovery::oneshot",
        // The client's own requests.
        "apiserver_version(",
        ".request(",
        ".request_text(",
        ".request_stream(",
        ".request_events(",
        ".request_status(",
        "client.send(",
        "list_api_groups(",
        "list_api_group_resources(",
        "list_core_api_versions(",
        "list_core_api_resources(",
        "Recorder::new",
        "watcher::watcher(",
        "metadata_watcher(",
        // The Lease.
        "is_leader()",
    ];

    fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a readable source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                rust_files(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }

    /// `line` without its comment: from a `//` outside a string literal.
    fn code_of(line: &str) -> &str {
        let mut in_string = false;
        let mut escaped = false;
        let bytes = line.as_bytes();
        for (at, byte) in bytes.iter().enumerate() {
            match byte {
                _ if escaped => escaped = false,
                b'\\' if in_string => escaped = true,
                b'"' => in_string = !in_string,
                b'/' if !in_string && bytes.get(at + 1) == Some(&b'/') => return &line[..at],
                _ => {}
            }
        }
        line
    }

    /// Each line of `text` that sends a request, with what it uses;
    /// comments are left out.
    fn senders(text: &str) -> Vec<(usize, &'static str)> {
        text.lines()
            .enumerate()
            .filter_map(|(at, line)| {
                let code = code_of(line);
                SENDS
                    .iter()
                    .find(|sends| code.contains(*sends))
                    .map(|sends| (at + 1, *sends))
            })
            .collect()
    }

    #[test]
    fn a_line_that_sends_a_request_is_told_apart() {
        assert_eq!(
            senders("let a: Api<Secret> = x;\nErr(kube::Error::Api(s)) => {}\n// Api::all\n"),
            vec![(1, "Api<")]
        );
        assert_eq!(
            senders("client.apiserver_version().await"),
            vec![(1, "apiserver_version(")]
        );
        assert_eq!(
            senders(r#"let u = "http://x"; client.send(r).await; // Api::all"#),
            vec![(1, "client.send(")],
            "a // in a string is no comment"
        );
    }

    #[test]
    fn requests_are_sent_only_from_cluster() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let cluster = src.join("cluster");
        let mut outside = Vec::new();
        let mut inside = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).expect("a readable source file");
            let found = senders(&text);
            if file.starts_with(&cluster) {
                inside += found.len();
                continue;
            }
            let name = file
                .strip_prefix(&src)
                .unwrap_or(file)
                .display()
                .to_string();
            outside.extend(
                found
                    .into_iter()
                    .map(|(line, sends)| format!("{name}:{line} ({sends})")),
            );
        }
        assert!(files.len() > 50, "the sources were found: {}", files.len());
        assert!(inside > 0, "cluster/ sends the requests");
        assert!(
            outside.is_empty(),
            "requests sent from outside cluster/:\n{}",
            outside.join("\n")
        );
    }
}
