//! What the fleet's agent counts, shown with the interface's figures (`ordo show`, the
//! metrics' `ordo_part_*{part="fleet"}`): whether etcd answers and at which revision, how
//! many peers the records name and how many the agent put on the interface, its return
//! routes; records refused, etcd lost, changes applied.

use crate::port::Counter;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct FleetFigures {
    pub etcd_up: AtomicU64,
    pub revision: AtomicU64,
    pub records: AtomicU64,
    pub peers: AtomicU64,
    pub return_routes: AtomicU64,
    pub records_refused: AtomicU64,
    pub etcd_lost: AtomicU64,
    pub changes_applied: AtomicU64,
    /// A gateway that shares sessions: its id, the other gateways up, the sessions it holds,
    /// and the writes of their records.
    pub gateway: AtomicU64,
    pub gateways_up: AtomicU64,
    pub sessions_held: AtomicU64,
    pub session_writes: AtomicU64,
}

impl FleetFigures {
    pub fn counters(&self) -> Vec<Counter> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            Counter::level("etcd_up", get(&self.etcd_up)),
            Counter::level("revision", get(&self.revision)),
            Counter::level("records", get(&self.records)),
            Counter::level("peers", get(&self.peers)),
            Counter::level("return_routes", get(&self.return_routes)),
            Counter::new("records_refused", get(&self.records_refused)),
            Counter::new("etcd_lost", get(&self.etcd_lost)),
            Counter::new("changes_applied", get(&self.changes_applied)),
            Counter::level("gateway", get(&self.gateway)),
            Counter::level("gateways_up", get(&self.gateways_up)),
            Counter::level("sessions_held", get(&self.sessions_held)),
            Counter::new("session_writes", get(&self.session_writes)),
        ]
    }

    pub fn set(a: &AtomicU64, v: u64) {
        a.store(v, Ordering::Relaxed);
    }

    pub fn bump(a: &AtomicU64, by: u64) {
        a.fetch_add(by, Ordering::Relaxed);
    }
}
