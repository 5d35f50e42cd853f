//! One cluster as one unit: everything the operator holds for one API
//! server, its clients, its writer, the pause a
//! throttled read puts on its watches, the views its watches fill, its
//! shared source watches, and the copy watches and refusals of the kinds
//! its API server serves. The controller holds one; more clusters would
//! each be one of these.
//!
//! Its locks take their place in the controller's lock order
//! (`controller::state::Shared`): `kind_watches` first of all (a kind
//! watch is kept while a rule names it or a copy needs it), the views'
//! `namespaces`, `copies` and `roles` in the middle; `sources` and
//! `kind_refusals` are never held while another lock is taken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use prometheus_client::metrics::gauge::Gauge;
use tokio::task::JoinHandle;

use crate::api::kinds::Kind;
use crate::cache::views::Views;
use crate::cluster::access::Access;
use crate::cluster::client::{Clients, WatchConnections};
use crate::cluster::leader::LeaderGate;
pub(crate) use crate::cluster::limits::Limits;
use crate::cluster::ratelimit::RateLimiter;
use crate::cluster::reader::Reader;
use crate::cluster::sources::{OnChange, SourceHub};
use crate::cluster::writer::Writer;
use crate::core::backoff::ReadPause;
use crate::core::kind_refusals::KindRefusals;
use crate::ops::http::Health;
use crate::ops::metrics::ClusterMetrics;

pub(crate) struct Cluster {
    /// For watches and lists, here in `cluster/`; elsewhere through `reader`.
    pub(in crate::cluster) client: Client,
    /// Lists, lookups and reviews as the operator.
    pub(crate) reader: Reader,
    /// Every write: copies, statuses, finalizers, Events, restarts.
    pub(crate) writer: Writer,
    /// Shared by every watch: a throttled read pauses them all.
    pub(crate) read_pause: Arc<ReadPause>,
    pub(crate) views: Views,
    pub(crate) sources: Mutex<SourceHub>,
    /// The copy watches of kinds named by `objectType`, started with the
    /// first rule that needs one and stopped after the last.
    pub(crate) kind_watches: Mutex<HashMap<Kind, JoinHandle<()>>>,
    /// Kinds refused for their retry interval (see [`KindRefusals`]).
    pub(crate) kind_refusals: Mutex<KindRefusals>,
    /// What its watches report: the process's own for the home cluster
    /// (liveness, readiness), one of its own for a member, whose troubles
    /// never fail the operator's probes.
    pub(crate) health: Arc<Health>,
    /// What the ServiceAccounts rules write as may read, as the API
    /// server answers it.
    pub(crate) access: Access,
}

impl Cluster {
    /// `on_source_change` is told of each rule a source event concerns (the
    /// controller queues it: a message up, not a call). The writer reports
    /// the writes it allows in flight to `concurrency_gauge` where given
    /// (the home cluster's; a member's would overwrite it).
    pub(crate) fn new(
        clients: Clients,
        limits: Limits,
        metrics: ClusterMetrics,
        leader: LeaderGate,
        health: Arc<Health>,
        on_source_change: OnChange,
        concurrency_gauge: Option<Gauge>,
    ) -> Self {
        let Clients {
            read: client,
            write: write_client,
            more_reads,
        } = clients;
        let limiter = RateLimiter::new(limits.api_qps, limits.api_burst);
        let writer = Writer::new(
            write_client.clone(),
            limiter,
            limits,
            metrics,
            leader,
            health.clone(),
            concurrency_gauge,
        );
        let read_pause = Arc::new(ReadPause::default());
        let sources = SourceHub::new(
            WatchConnections::new(client.clone(), more_reads),
            read_pause.clone(),
            limits.max_source_watches as usize,
            limits.max_tenant_source_bytes,
            on_source_change,
        );
        Self {
            access: Access::new(client.clone(), health.clone()),
            reader: Reader::new(client.clone()),
            client,
            writer,
            read_pause,
            views: Views::default(),
            sources: Mutex::new(sources),
            kind_watches: Mutex::default(),
            kind_refusals: Mutex::default(),
            health,
        }
    }
}
