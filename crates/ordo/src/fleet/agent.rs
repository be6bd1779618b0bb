//! The thread that keeps an interface's fleet peers in step with etcd: it reads every
//! record, then watches the prefix from the revision it read at, and after each change (and
//! once a second, for changes made behind its back) makes the interface agree
//! ([`super::reconcile`]), and its return routes ([`super::routes`]) with the sessions it
//! holds: at once when a handshake completes (the core's count of them is looked at ten
//! times a second), else once a second. When etcd cannot be reached the interface keeps the
//! peers it has, and the agent reads everything again once etcd answers.

use super::figures::FleetFigures;
use super::reconcile;
use super::record::{self, FleetPeer};
use super::routes::{self, ReturnRoutes};
use super::store::Dial;
use super::FleetSettings;
use crate::device::peers::CoreCopy;
use crate::device::Device;
use anyhow::{bail, Context, Result};
use etcd_client::{EventType, GetOptions, WatchOptions};
use ordo_proto::PublicKey;
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
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

/// An agent ready to start: its settings checked and its files read.
pub struct Agent {
    prefix: String,
    dial: Dial,
    ifname: String,
    route_table: Option<u32>,
}

/// What the agent knows: the records, the peers it put on the interface, its return routes.
#[derive(Default)]
struct State {
    desired: BTreeMap<PublicKey, FleetPeer>,
    owned: BTreeSet<PublicKey>,
    routes: Option<ReturnRoutes>,
    /// The core's count of completed handshakes at the last pass, and when that was.
    handshakes: u64,
    last_pass: Option<Instant>,
    figures: Arc<FleetFigures>,
}

impl Agent {
    /// Checks the settings and reads the TLS files (before a daemon drops its privileges).
    pub fn prepare(settings: &FleetSettings, ifname: &str) -> Result<Agent> {
        let prefix = settings.prefix().context("no fleet name")?;
        Ok(Agent {
            prefix,
            dial: Dial::prepare(settings).context("the fleet's etcd settings")?,
            ifname: ifname.to_string(),
            route_table: settings.route_table,
        })
    }

    /// Starts the agent's thread, which runs as long as the process.
    pub fn start(self, device: Arc<Device>) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let figures = Arc::new(FleetFigures::default());
        let shown = figures.clone();
        device.add_part("fleet", Box::new(move || shown.counters()));
        std::thread::Builder::new()
            .name("ordo-fleet".into())
            .spawn(move || runtime.block_on(self.run(device, figures)))?;
        Ok(())
    }

    async fn run(self, device: Arc<Device>, figures: Arc<FleetFigures>) {
        let mut state = State {
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
        let peers = record::peers_prefix(&self.prefix);
        let read = client.get(peers.as_str(), Some(GetOptions::new().with_prefix()));
        let response = tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .context("reading the records: no answer")?
            .context("reading the records")?;
        let revision = response.header().map(|h| h.revision()).context("no revision")?;
        state.desired.clear();
        for kv in response.kvs() {
            self.put(state, kv.key(), kv.value());
        }
        pass(device, state).await;
        log::info!(
            "fleet: {} peers from etcd at {} (revision {revision}){}",
            state.desired.len(),
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
        let mut stream = client.watch(peers.as_str(), Some(options)).await?;
        let mut probe = tokio::time::interval(PROBE);
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
                            EventType::Put => self.put(state, kv.key(), kv.value()),
                            EventType::Delete => {
                                if let Ok(key) = record::parse_key(&self.prefix, kv.key()) {
                                    state.desired.remove(&key);
                                }
                            }
                        }
                    }
                    // The events of one response (one transaction) are applied together.
                    pass(device, state).await;
                }
                _ = probe.tick() => pass_if_due(device, state).await,
            }
        }
    }

    /// Takes a record in. One that is refused removes the peer it named, if any: what
    /// cannot be read for certain is not let by on what it said before.
    fn put(&self, state: &mut State, key: &[u8], value: &[u8]) {
        match record::parse_record(&self.prefix, key, value) {
            Ok((public_key, peer)) => {
                state.desired.insert(public_key, peer);
            }
            Err(refused) => {
                log::warn!("fleet: record {} refused: {}", refused.key, refused.reason);
                FleetFigures::bump(&state.figures.records_refused, 1);
                if let Ok(public_key) = record::parse_key(&self.prefix, key) {
                    state.desired.remove(&public_key);
                }
            }
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

/// Makes the interface agree with the records, and its return routes with its sessions.
async fn pass(device: &Arc<Device>, state: &mut State) {
    state.handshakes = device.core().stats.handshakes_completed;
    state.last_pass = Some(Instant::now());
    let mut peers = CoreCopy::of(&device.core()).peers();
    let (plan, owned) = reconcile::plan(&state.desired, &state.owned, &peers);
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
    FleetFigures::set(&state.figures.records, state.desired.len() as u64);
    FleetFigures::set(&state.figures.peers, state.owned.len() as u64);
    if let Some(routes) = &mut state.routes {
        let want = routes::wanted(&peers, SystemTime::now());
        if routes.sync(&want).await {
            FleetFigures::set(&state.figures.return_routes, want.len() as u64);
        }
    }
}
