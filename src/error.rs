use thiserror::Error;

/// Everything that can go wrong in the operator, with the context a user needs.
#[derive(Debug, Error)]
pub enum Error {
    #[error("updating the status of rule {rule}: {message}")]
    Status { rule: String, message: String },

    #[error("updating the finalizer of rule {rule}: {message}")]
    Finalizer { rule: String, message: String },

    #[error("deleting the copies of rule {rule}: {count} could not be deleted; first: {first}")]
    Cleanup {
        rule: String,
        count: usize,
        first: String,
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

    #[error("looking up {what}: {message}")]
    Lookup { what: String, message: String },

    #[error("invalid setting: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
