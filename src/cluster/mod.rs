//! All that talks to one API server: the clients and their pacing, the
//! writer, the Lease, and the shared source watches.

pub mod client;
pub mod context;
pub mod leader;
pub mod ratelimit;
pub mod sources;
pub mod watch;
pub mod write_limit;
pub mod writer;
