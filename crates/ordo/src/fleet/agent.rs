//! The thread that keeps an interface in step with its fleet in etcd: it reads every record
//! under the fleet's prefix, then watches the prefix from the revision it read at, and after
//! each change (and once a second, for changes made behind its back) makes the interface's
//! peers agree ([`super::reconcile`]), and its return routes ([`super::routes`]) with the
//! sessions it holds: at once when a handshake completes (the core's count of them is looked
//! at ten times a second), else once a second. A gateway that shares sessions
//! (`FleetGateway =`) also registers itself, writes the records of the sessions it holds
//! ([`super::sessions`]), both on a lease of its own, and gives the core the fleet's view:
//! which other gateways are up and which sessions they hold. When etcd cannot be reached the
//! interface keeps what it has, and the agent reads everything again once etcd answers.

use super::figures::FleetFigures;
use super::gateways::{self, GatewayRecord};
use super::reconcile;
use super::records::FleetRecords;
use super::routes::{self, ReturnRoutes};
use super::sessions::{self, SessionPlan, SessionRecord};
use super::store::{Dial, Lease};
use super::FleetSettings;
use crate::device::peers::{CoreCopy, PeerCopy};
use crate::device::Device;
use anyhow::{bail, Context, Result};
use etcd_client::{Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use ordo_proto::fleet::GatewayId;
use ordo_proto::interface::FleetView;
use ordo_proto::PublicKey;
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How often the interface is compared with the records when nothing happens.
const RECHECK: Duration = Duration::from_secs(1);
/// How often the core's count of completed handshakes is looked at.
const PROBE: Duration = Duration::from_millis(100);
/// The wait before dialling etcd again after a failure, doubling up to the longest.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_LONGEST: Duration = Duration::from_secs(5);
/// Longest the first read of the records may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The lease of a gateway's own records: as long as a session may live (REJECT_AFTER_TIME),
/// so that when the gateway dies the others can still take over its clients that stay quiet
/// for a while; its going down is said by its health record, not by this lease.
const LEASE_TTL: Duration = Duration::from_secs(180);

/// An agent ready to start: its settings checked and its files read.
pub struct Agent {
    prefix: String,
    dial: Dial,
    ifname: String,
    route_table: Option<u32>,
    gateway: Option<Gateway>,
}

/// This interface as a gateway that shares its sessions.
#[derive(Clone, Copy)]
struct Gateway {
    id: GatewayId,
    /// Where the others pass it datagrams (at the interface's listen port).
    address: IpAddr,
}

/// What the agent knows: the records, the peers it put on the interface, its return routes.
#[derive(Default)]
struct State {
    prefix: String,
    gateway: Option<Gateway>,
    records: FleetRecords,
    owned: BTreeSet<PublicKey>,
    routes: Option<ReturnRoutes>,
    /// While etcd answers, for a gateway: the client and the lease its records go on.
    link: Option<(Client, i64)>,
    /// The session records written on the current lease.
    written: BTreeMap<PublicKey, SessionRecord>,
    /// The view the core has.
    view: FleetView,
    /// The gateway's record as last written in this connection (its port follows the
    /// interface's listen port, which may be set after the agent starts).
    registered: Option<GatewayRecord>,
    /// This gateway's health record: None until one is seen (no watch, or not yet), then
    /// whether it is there. While its watch has withdrawn it, it announces no return routes.
    healthy: Option<bool>,
    /// The core's count of completed handshakes at the last pass, and when that was.
    handshakes: u64,
    last_pass: Option<Instant>,
    figures: Arc<FleetFigures>,
}

impl Agent {
    /// Checks the settings and reads the TLS files (before a daemon drops its privileges).
    pub fn prepare(settings: &FleetSettings, ifname: &str) -> Result<Agent> {
        let prefix = settings
            .prefix()
            .context("fleet settings without a fleet: set Fleet = NAME too")?;
        let gateway = match (settings.gateway, settings.address) {
            (Some(id), Some(address)) => Some(Gateway {
                id: GatewayId(id),
                address,
            }),
            (None, None) => None,
            (Some(_), None) => bail!("FleetGateway needs FleetAddress: where the other gateways reach this one"),
            (None, Some(_)) => bail!("FleetAddress without FleetGateway: this gateway's id in the fleet"),
        };
        Ok(Agent {
            prefix,
            dial: Dial::prepare(settings).context("the fleet's etcd settings")?,
            ifname: ifname.to_string(),
            route_table: settings.route_table,
            gateway,
        })
    }

    /// Starts the agent's thread, which runs as long as the process.
    pub fn start(self, device: Arc<Device>) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let figures = Arc::new(FleetFigures::default());
        if let Some(g) = self.gateway {
            // Before the thread: the sessions made from now on name this gateway.
            device.core().set_fleet_gateway(Some(g.id));
            FleetFigures::set(&figures.gateway, u64::from(g.id.0));
        }
        let shown = figures.clone();
        device.add_part("fleet", Box::new(move || shown.counters()));
        std::thread::Builder::new()
            .name("ordo-fleet".into())
            .spawn(move || runtime.block_on(self.run(device, figures)))?;
        Ok(())
    }

    async fn run(self, device: Arc<Device>, figures: Arc<FleetFigures>) {
        let mut state = State {
            prefix: self.prefix.clone(),
            gateway: self.gateway,
            figures,
            ..State::default()
        };
        if let Some(table) = self.route_table {
            match ReturnRoutes::open(&self.ifname, table).await {
                Ok(r) => state.routes = Some(r),
                Err(e) => log::warn!("fleet: no return routes: {e:#}"),
            }
        }
        let mut retry = RETRY_FIRST;
        // Whether etcd is out of reach: said once when it goes, once when it is back.
        let mut failing = false;
        loop {
            let Err(e) = self.follow(&device, &mut state, &mut failing).await;
            state.link = None;
            if failing {
                log::debug!("fleet: etcd: {e:#}");
                retry = (retry * 2).min(RETRY_LONGEST);
            } else {
                log::warn!(
                    "fleet: etcd at {}: {e:#}; keeping the {} fleet peers this interface has, and trying again",
                    self.dial.endpoints(),
                    state.owned.len()
                );
                failing = true;
                retry = RETRY_FIRST;
                FleetFigures::set(&state.figures.etcd_up, 0);
                FleetFigures::bump(&state.figures.etcd_lost, 1);
            }
            // Meanwhile the interface is still kept as the records last said.
            let until = tokio::time::Instant::now() + retry;
            loop {
                pass_if_due(&device, &mut state).await;
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(PROBE.min(left)).await;
            }
        }
    }

    /// One connection's life: read everything, then follow the changes. Returns only with
    /// the error that ended it.
    async fn follow(&self, device: &Arc<Device>, state: &mut State, failing: &mut bool) -> Result<Infallible> {
        let mut client = self.dial.connect().await?;
        let read = client.get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()));
        let response = tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .context("reading the records: no answer")?
            .context("reading the records")?;
        let revision = response.header().map(|h| h.revision()).context("no revision")?;
        state.records.clear();
        state.healthy = None;
        for kv in response.kvs() {
            self.take(state, kv.key(), kv.value());
        }
        let mut lease = match self.gateway {
            Some(_) => Some(Lease::grant(&mut client, LEASE_TTL).await?),
            None => None,
        };
        // A new lease: this gateway's session records go on it, written again (on the last
        // lease they would go when it expires).
        state.written.clear();
        state.link = lease.as_ref().map(|l| (client.clone(), l.id));
        state.registered = None;
        pass(device, state).await;
        log::info!(
            "fleet: {} peers from etcd at {} (revision {revision}){}",
            state.records.peers.len(),
            self.dial.endpoints(),
            if *failing { ", caught up" } else { "" }
        );
        *failing = false;
        FleetFigures::set(&state.figures.etcd_up, 1);
        FleetFigures::set(&state.figures.revision, revision as u64);
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1)
            .with_progress_notify();
        let mut stream = client.watch(self.prefix.as_str(), Some(options)).await?;
        let mut probe = tokio::time::interval(PROBE);
        let mut renew = tokio::time::interval(lease.as_ref().map_or(LEASE_TTL, Lease::renew_every));
        loop {
            tokio::select! {
                message = stream.message() => {
                    let Some(response) = message? else { bail!("etcd ended the watch") };
                    if response.canceled() {
                        bail!("etcd cancelled the watch: {}", response.cancel_reason());
                    }
                    if let Some(h) = response.header() {
                        FleetFigures::set(&state.figures.revision, h.revision() as u64);
                    }
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        match event.event_type() {
                            EventType::Put => self.take(state, kv.key(), kv.value()),
                            EventType::Delete => self.forget(state, kv.key()),
                        }
                    }
                    // The events of one response (one transaction) are applied together.
                    pass(device, state).await;
                }
                _ = probe.tick() => pass_if_due(device, state).await,
                _ = renew.tick(), if lease.is_some() => {
                    lease.as_mut().expect("a lease").renew().await?;
                }
            }
        }
    }

    /// Takes a record in, and says why if it is refused.
    fn take(&self, state: &mut State, key: &[u8], value: &[u8]) {
        if let Err(refused) = state.records.take(&self.prefix, key, value) {
            log::warn!("fleet: record {} refused: {}", refused.key, refused.reason);
            FleetFigures::bump(&state.figures.records_refused, 1);
        }
        self.note_health(state);
    }

    fn forget(&self, state: &mut State, key: &[u8]) {
        state.records.forget(&self.prefix, key);
        self.note_health(state);
    }

    /// Whether this gateway's own health record is there, once one has been seen.
    fn note_health(&self, state: &mut State) {
        let Some(g) = self.gateway else { return };
        let now = state.records.healthy.contains(&g.id);
        if state.healthy.is_some() || now {
            if state.healthy == Some(true) && !now {
                log::warn!(
                    "fleet: gateway {} withdrawn by its watch: no return routes from here",
                    g.id.0
                );
            }
            state.healthy = Some(now);
        }
    }
}

/// A pass if one is due: a handshake completed since the last, or a second went by.
async fn pass_if_due(device: &Arc<Device>, state: &mut State) {
    let handshakes = device.core().stats.handshakes_completed;
    let due = state.last_pass.is_none_or(|t| t.elapsed() >= RECHECK);
    if due || handshakes != state.handshakes {
        pass(device, state).await;
    }
}

/// Makes the interface agree with the records, the session records with the sessions it
/// holds, and its return routes with them.
async fn pass(device: &Arc<Device>, state: &mut State) {
    state.handshakes = device.core().stats.handshakes_completed;
    state.last_pass = Some(Instant::now());
    let mut peers = CoreCopy::of(&device.core()).peers();
    let (plan, owned) = reconcile::plan(&state.records.peers, &state.owned, &peers);
    if let Some(plan) = plan {
        let changed = plan.peers.len();
        match crate::uapi::apply(device, plan) {
            Ok(()) => {
                log::debug!("fleet: {changed} peers changed");
                FleetFigures::bump(&state.figures.changes_applied, changed as u64);
                state.owned = owned;
                peers = CoreCopy::of(&device.core()).peers();
            }
            Err(e) => log::warn!("fleet: applying {changed} peer changes failed: {}", e.message),
        }
    } else {
        state.owned = owned;
    }
    FleetFigures::set(&state.figures.records, state.records.peers.len() as u64);
    FleetFigures::set(&state.figures.peers, state.owned.len() as u64);
    let mut elsewhere = BTreeSet::new();
    if let Some(g) = state.gateway {
        share_sessions(device, state, g, &peers).await;
        elsewhere = sessions::elsewhere(g.id, &state.records.sessions);
    }
    if let Some(routes) = &mut state.routes {
        // Withdrawn by its watch: the LAN's traffic for its clients must go elsewhere.
        let withdrawn = state.healthy == Some(false);
        // The fleet's clients only (not the watch's probe, nor a [Peer] of the file), and
        // not those another gateway has taken since.
        let ours: Vec<PeerCopy> = (peers.into_iter())
            .filter(|p| !withdrawn && state.owned.contains(&p.public_key) && !elsewhere.contains(&p.public_key))
            .collect();
        let want = routes::wanted(&ours, SystemTime::now());
        if routes.sync(&want).await {
            FleetFigures::set(&state.figures.return_routes, want.len() as u64);
        }
    }
}

/// Writes the records of the sessions this gateway holds (while etcd answers), and gives the
/// core the fleet's view.
async fn share_sessions(device: &Arc<Device>, state: &mut State, g: Gateway, peers: &[PeerCopy]) {
    register(device, state, g).await;
    // The fleet's clients only: a peer of this gateway's own (its watch's probe, a [Peer] of
    // its file) is no other gateway's to take over.
    let clients = (peers.iter()).filter(|p| state.records.peers.contains_key(&p.public_key));
    let held = sessions::held(g.id, clients, SystemTime::now());
    FleetFigures::set(&state.figures.sessions_held, held.len() as u64);
    let plan = sessions::plan(g.id, &held, &state.records.sessions, &state.written);
    if let (false, Some((client, lease))) = (plan.is_empty(), state.link.as_mut()) {
        match write_sessions(client, *lease, &state.prefix, g.id, &plan).await {
            Ok(()) => {
                FleetFigures::bump(
                    &state.figures.session_writes,
                    (plan.puts.len() + plan.deletes.len()) as u64,
                );
                // As etcd has them now; the watch says so again shortly.
                for (k, r) in plan.puts {
                    state.records.sessions.insert(k, r.clone());
                    state.written.insert(k, r);
                }
                for k in plan.deletes {
                    state.records.sessions.remove(&k);
                    state.written.remove(&k);
                }
            }
            // The connection's own failure ends it; until then the next pass tries again.
            Err(e) => log::debug!("fleet: writing session records: {e:#}"),
        }
    }
    let view = sessions::view(
        g.id,
        &state.records.gateways,
        &state.records.healthy,
        &state.records.sessions,
    );
    FleetFigures::set(&state.figures.gateways_up, view.gateways.len() as u64);
    if view != state.view {
        device.core().set_fleet_view(view.clone());
        state.view = view;
    }
}

/// Writes this gateway's own record (where the others reach it), on its lease, when it is
/// not yet in etcd as it is now.
async fn register(device: &Arc<Device>, state: &mut State, g: Gateway) {
    let record = GatewayRecord {
        forward: SocketAddr::new(g.address, device.listen_port()),
    };
    let Some((client, lease)) = state.link.as_mut() else {
        return;
    };
    if state.registered == Some(record) {
        return;
    }
    let key = gateways::gateway_key(&state.prefix, g.id);
    let value = serde_json::to_vec(&record).expect("a gateway record is JSON");
    match client.put(key, value, Some(PutOptions::new().with_lease(*lease))).await {
        Ok(_) => {
            log::info!("fleet: gateway {} registered, reached at {}", g.id.0, record.forward);
            state.registered = Some(record);
        }
        Err(e) => log::debug!("fleet: registering gateway {}: {e:#}", g.id.0),
    }
}

/// Puts the records of sessions held here, on the gateway's lease, and deletes those of
/// sessions that ended here, each only if it still says what this gateway wrote (another
/// gateway may have taken the client since).
async fn write_sessions(
    client: &mut Client,
    lease: i64,
    prefix: &str,
    me: GatewayId,
    plan: &SessionPlan,
) -> Result<()> {
    for (k, r) in &plan.puts {
        let value = serde_json::to_vec(r).expect("a session record is JSON");
        let key = sessions::session_key(prefix, k);
        client
            .put(key, value, Some(PutOptions::new().with_lease(lease)))
            .await?;
    }
    for k in &plan.deletes {
        let key = sessions::session_key(prefix, k);
        let current = client.get(key.as_str(), None).await?;
        let Some(kv) = current.kvs().first() else { continue };
        let mine = serde_json::from_slice::<sessions::SessionRecord>(kv.value()).is_ok_and(|r| r.gateway == me.0);
        if mine {
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision())])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            client.txn(txn).await?;
        }
    }
    Ok(())
}
