//! How the operator sends its requests to one API server.

/// How the operator sends its requests to one API server: how hard it
/// may push it, and what its writes as a ServiceAccount say.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Writes in flight at most (`--write-concurrency`).
    pub(crate) write_concurrency: u32,
    /// Client-side pacing of requests (`--api-qps`, `--api-burst`).
    pub(crate) api_qps: f64,
    pub(crate) api_burst: u32,
    /// Source watches at most (`--max-source-watches`).
    pub(crate) max_source_watches: u32,
    /// The bytes of sources the rules of one tenant namespace may make the
    /// operator hold (`--max-tenant-source-mib`).
    pub(crate) max_tenant_source_bytes: u64,
    /// Writes as a ServiceAccount carry the impersonation extra
    /// `copyrator.flant.com/acting-for` (`--acting-for-extra`).
    pub(crate) acting_for_extra: bool,
}

impl Limits {
    /// Unit tests only: small limits, no pacing.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self {
            write_concurrency: 4,
            api_qps: 0.0,
            api_burst: 1,
            max_source_watches: 10,
            max_tenant_source_bytes: 1 << 24,
            acting_for_extra: false,
        }
    }
}
