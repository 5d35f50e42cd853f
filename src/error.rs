use thiserror::Error;

/// Everything that can go wrong in the operator, with the context a user needs.
#[derive(Debug, Error)]
pub enum Error {
    #[error("{verb} {kind} {namespace}/{name}: {source}")]
    Write {
        verb: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("updating the status of rule {rule}: {source}")]
    Status {
        rule: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("updating the finalizer of rule {rule}: {source}")]
    Finalizer {
        rule: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    #[error("the HTTP server cannot listen on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{0}")]
    Sync(String),

    #[error("invalid setting: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
