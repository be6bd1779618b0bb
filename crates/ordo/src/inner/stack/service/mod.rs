//! The attach service: the stack's state and its turns ([`Stack`], run by the plane's
//! reader of queue 0). It owns smoltcp's interface and sockets, accepts applications'
//! requests on the attach socket (`ordo_attach`), and relays each connection's bytes between
//! the application's Unix socket and the stack's TCP socket, one copy each way (the
//! application's bytes are read straight into the TCP send buffer, and written straight from
//! the receive buffer); a connected UDP socket's datagrams likewise ([`super::datagram`]).
//!
//! Everything an application sends is untrusted: a request is decoded by `ordo_attach`
//! (any bytes give a message or an error), the descriptor that comes with it must be a Unix
//! stream socket, only this user (or root, or its guests) may attach (SO_PEERCRED, decided
//! without waiting on the user databases: [`super::admission`]), a request must arrive
//! whole within [`attach::REQUEST_DEADLINE`], and the numbers of pending requests, of
//! connections taken at a turn and of connections are bounded. A guest has a share of the
//! connections ([`attach::GUEST_SHARE`]), the guests together leave the owner
//! [`attach::OWNER_RESERVE`], and only the owner and root may take a port below 1024 (as the
//! kernel's CAP_NET_BIND_SERVICE).
//!
//! Here: the stack's state and one turn of it (what each part is asked at a turn, and when
//! the next is due). Its parts: [`attach`] (the requests), [`relay`] (TCP connections),
//! [`listeners`], [`datagrams`] (UDP requests), [`sockets`] (the stack's TCP sockets, their
//! buffers and ports) and [`fd`] (descriptor helpers).

mod attach;
mod datagrams;
mod fd;
mod listeners;
mod relay;
mod sockets;

use crate::host::wakeup::WakeUp;
use crate::inner::stack::admission::Admission;
use crate::inner::stack::datagram::{self, Flow};
use crate::inner::stack::link::{Link, Wires};
use crate::inner::stack::readiness::{Readiness, Ready, Watched, Watcher, HANG_UP, READABLE, WRITABLE};
use crate::inner::stack::settings::StackSettings;
use crate::port::buffers;
use attach::{PendingRequest, ADMISSION_POLL, MAX_PENDING_REQUESTS};
use listeners::Listener;
use relay::Connection;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint};
pub use sockets::LARGE_RECEIVE_BUFFERS;
use sockets::{SocketBuffers, EPHEMERAL};
use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Connections at once (at most [`sockets::RECEIVE_BUFFER`] + [`sockets::SEND_BUFFER`] each,
/// most of them [`sockets::SMALL_RECEIVE_BUFFER`] + [`sockets::SEND_BUFFER`]); a request
/// beyond is refused with EMFILE. A UDP socket's connect counts the UDP sockets too.
const MAX_CONNECTIONS: usize = 1024;

/// The stack and its service's state, run by the plane's thread that reads the port's queue
/// 0 ([`Stack::turn`]), shared between that reader and the service's handle ([`Service`]).
pub struct Stack {
    pub wires: Arc<Wires>,
    /// The readiness set's descriptor: the queue's to wait on.
    wait_fd: RawFd,
    running: Mutex<Running>,
    /// Signalled when a lingering stack has ended.
    ended: Condvar,
    /// Rung to have the stack take a turn (a linger begins).
    wake: WakeUp,
    /// Whether `wake` was rung since a turn last cleared it: so that a turn reads it only
    /// then, not at every turn.
    rung: AtomicBool,
}

/// What a turn works on: the stack (None before the service starts and after it ends), and
/// what wakes it.
struct Running {
    readiness: Readiness,
    state: Option<State>,
    /// While lingering: until when, at most.
    linger_until: Option<Instant>,
}

impl Stack {
    /// A stack with no service yet, over `wires`: the plane may run its turns already.
    pub fn new(wires: Arc<Wires>) -> io::Result<Stack> {
        let readiness = Readiness::new()?;
        let wake = WakeUp::new()?;
        readiness.add_lasting(wires.to_stack.fd())?;
        readiness.add_lasting(wires.to_plane.fd())?;
        readiness.add_lasting(wake.as_raw_fd())?;
        Ok(Stack {
            wait_fd: readiness.fd(),
            wires,
            running: Mutex::new(Running {
                readiness,
                state: None,
                linger_until: None,
            }),
            ended: Condvar::new(),
            wake,
            rung: AtomicBool::new(false),
        })
    }

    /// The descriptor that is readable when the stack has something to do.
    pub fn wait_fd(&self) -> RawFd {
        self.wait_fd
    }

    fn ring(&self) {
        // The flag after the ring: a turn that sees the flag finds the ring to clear (the
        // other order could leave a ring no turn clears, and the set readable for ever).
        self.wake.ring();
        self.rung.store(true, Ordering::SeqCst);
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One turn of the stack: what the plane delivered and what applications wrote into it,
    /// what it made out to the plane ([`Wires::to_plane`]), requests answered, and its
    /// readiness set to what it waits for next. Without a service, what the plane delivers
    /// is dropped: nothing would take it.
    pub fn turn(&self) {
        if self.rung.swap(false, Ordering::SeqCst) {
            self.wake.clear();
        }
        let mut running = self.running();
        let Running {
            readiness,
            state,
            linger_until,
        } = &mut *running;
        let Some(s) = state else {
            let mut dropped = Vec::new();
            self.wires.to_stack.take(&mut dropped, usize::MAX);
            buffers::give(dropped);
            readiness.arm(None);
            return;
        };
        if let Some(until) = *linger_until {
            s.pending.clear();
            if Instant::now() >= until || s.all_delivered() {
                *state = None;
                readiness.arm(None);
                self.ended.notify_all();
                return;
            }
        }
        s.ready = readiness.ready();
        let deadline = s.turn();
        readiness.arm(deadline.into_iter().chain(*linger_until).min());
    }
}

/// The running service: the stack's state until it is dropped (which ends every connection).
pub struct Service {
    stack: Arc<Stack>,
}

/// How long [`Service::linger`] waits, at most, for connections to deliver what they hold.
pub const LINGER: Duration = Duration::from_secs(30);

impl Service {
    /// Starts the stack's service on `stack`, answering applications on `listener`; the
    /// plane's reader runs it.
    pub fn start(stack: Arc<Stack>, settings: &StackSettings, listener: UnixListener) -> io::Result<Service> {
        listener.set_nonblocking(true)?;
        {
            let mut running = stack.running();
            let watcher = running.readiness.watcher();
            let state = State::new(stack.wires.clone(), settings, listener, watcher);
            running.state = Some(state);
        }
        stack.ring();
        Ok(Service { stack })
    }

    /// Takes no more requests, and returns once every connection has delivered what it
    /// holds and ended (its FIN acknowledged, or reset), or after [`LINGER`]: as the kernel
    /// keeps sending a closed socket's data after its process exits. For `ordo run`, whose
    /// program has ended (which closed the program's ends of the connections). The plane
    /// must still run: its reader takes the turns.
    pub fn linger(self) {
        let mut running = self.stack.running();
        running.linger_until = Some(Instant::now() + LINGER);
        self.stack.ring();
        // A little longer than the linger itself, should the plane have stopped.
        let _ = (self.stack.ended).wait_timeout_while(running, LINGER + Duration::from_secs(1), |r| r.state.is_some());
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let state = self.stack.running().state.take();
        drop(state);
    }
}

struct State {
    link: Link,
    iface: Interface,
    sockets: SocketSet<'static>,
    listener: Watched<UnixListener>,
    pending: Vec<PendingRequest>,
    connections: Vec<Connection>,
    listeners: Vec<Listener>,
    /// Applications' connected UDP sockets.
    flows: Vec<Flow>,
    /// Where a flow's datagram is read before the stack queues it.
    scratch: Vec<u8>,
    /// Sockets reset whose RST the next poll sends; removed after it.
    closing: Vec<SocketHandle>,
    /// TCP's ports taken (listeners' and connections'), and UDP's: one number in each is two
    /// ports (a DNS server binds 53 in both).
    ports_in_use: HashSet<u16>,
    udp_ports_in_use: HashSet<u16>,
    /// Sockets with the large receive buffer ([`sockets::LARGE_RECEIVE_BUFFERS`] at most).
    large_receive_buffers: usize,
    /// Ended sockets' buffers, for new ones ([`sockets::SPARE_BUFFERS`] at most).
    spare_buffers: Vec<SocketBuffers>,
    next_port: u16,
    addresses: Vec<IpAddr>,
    started: Instant,
    /// Registers the applications' descriptors in the stack's readiness set.
    watcher: Watcher,
    /// What the set found ready at this turn's start: the descriptors the turn asks.
    ready: Ready,
    admission: Admission,
}

fn to_std(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(e.addr.into(), e.port)
}

impl State {
    fn new(wires: Arc<Wires>, settings: &StackSettings, listener: UnixListener, watcher: Watcher) -> State {
        let mut link = Link::new(wires, settings.mtu);
        let mut config = Config::new(HardwareAddress::Ip);
        let seed = rand_core::RngCore::next_u64(&mut rand_core::OsRng);
        config.random_seed = seed;
        let started = Instant::now();
        let mut iface = Interface::new(config, &mut link, smoltcp::time::Instant::from_micros(0));
        let addresses: Vec<IpAddr> = settings.addresses.iter().map(|n| n.addr()).collect();
        iface.update_ip_addrs(|addrs| {
            for net in &settings.addresses {
                // The table's size is a build-time constant; addresses beyond it are left out
                // (and the connect to a family without one fails with EADDRNOTAVAIL).
                let _ = addrs.push(IpCidr::new(IpAddress::from(net.addr()), net.prefix_len()));
            }
        });
        // The medium has no link layer: every destination is reached by handing the packet
        // to the plane, which routes it by the peers' allowed IPs. A default route through
        // our own address says so to smoltcp.
        for a in &addresses {
            match a {
                IpAddr::V4(v4) => {
                    let _ = iface.routes_mut().add_default_ipv4_route(*v4);
                }
                IpAddr::V6(v6) => {
                    let _ = iface.routes_mut().add_default_ipv6_route(*v6);
                }
            }
        }
        let next_port = *EPHEMERAL.start() + (seed % 16384) as u16;
        State {
            link,
            iface,
            sockets: SocketSet::new(Vec::new()),
            listener: watcher.watch(listener),
            pending: Vec::new(),
            connections: Vec::new(),
            listeners: Vec::new(),
            flows: Vec::new(),
            scratch: vec![0; 65_536],
            closing: Vec::new(),
            ports_in_use: HashSet::new(),
            udp_ports_in_use: HashSet::new(),
            large_receive_buffers: 0,
            spare_buffers: Vec::new(),
            next_port,
            addresses,
            started,
            watcher,
            ready: Ready::everything(),
            admission: Admission::new(settings.attachers.clone()),
        }
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.started.elapsed().as_micros() as i64)
    }

    /// One turn (see [`Stack::turn`]); returns when the stack next needs one, if no
    /// descriptor wakes it before.
    fn turn(&mut self) -> Option<Instant> {
        self.link.take_delivered();
        let now = self.now();
        self.iface.poll(now, &mut self.link, &mut self.sockets);
        self.accept();
        self.read_requests();
        self.accept_connections();
        self.relay();
        self.relay_datagrams();
        let now = self.now();
        self.iface.poll(now, &mut self.link, &mut self.sockets);
        for h in std::mem::take(&mut self.closing) {
            self.remove_tcp(h);
        }
        self.want();
        self.deadline()
    }

    /// Registers each descriptor for what the stack can act on now: the plane's deliveries
    /// and the service's own are always in the set.
    fn want(&mut self) {
        let room = if self.pending.len() < MAX_PENDING_REQUESTS {
            READABLE
        } else {
            0
        };
        self.listener.want(room);
        for p in &mut self.pending {
            p.control.want(READABLE);
        }
        // A listener's application closing it wakes the stack (a hang-up); one whose
        // application had no room for a connection wakes it when it has; one with a kernel
        // socket, when that has a connection to hand over.
        for l in &mut self.listeners {
            let full = l.app_full || l.stack_waiting;
            l.app.want(HANG_UP | if full { WRITABLE } else { 0 });
            if let Some(k) = &mut l.kernel {
                k.want(if l.app_full { 0 } else { READABLE });
            }
        }
        for c in &mut self.connections {
            let s = self.sockets.get::<tcp::Socket>(c.handle);
            let mut events = 0;
            if c.waiting.is_none() && !c.app_done_writing && s.may_send() && s.send_queue() < s.send_capacity() {
                events |= READABLE;
            }
            if s.can_recv() {
                events |= WRITABLE;
            }
            if let Some((control, _)) = &mut c.waiting {
                // A program that gives up on a connect closes its socket, or ends.
                events |= HANG_UP;
                control.want(HANG_UP);
            }
            // None: a connection the application closed is not woken by its hang-up while
            // the stack ends it.
            c.app.want(events);
        }
        for f in &mut self.flows {
            f.app.want(datagram::wanted(self.sockets.get::<udp::Socket>(f.handle)));
            if let Some(h) = &mut f.host {
                h.want(READABLE);
            }
        }
    }

    /// When the stack next needs a turn, if nothing wakes it before: its own timers, a
    /// request's deadline, a connect's.
    fn deadline(&mut self) -> Option<Instant> {
        let now = self.now();
        let timers = (self.iface.poll_delay(now, &self.sockets))
            .map(|d| Instant::now() + Duration::from_micros(d.total_micros()));
        let requests = self.pending.iter().map(|p| p.deadline);
        let admissions = self
            .pending
            .iter()
            .any(|p| !p.admitted)
            .then(|| Instant::now() + ADMISSION_POLL);
        let connects = self.connections.iter().filter_map(|c| c.waiting.as_ref().map(|w| w.1));
        timers
            .into_iter()
            .chain(requests)
            .chain(connects)
            .chain(admissions)
            .min()
    }

    /// Whether every connection's own data and FIN were acknowledged (or it ended).
    fn all_delivered(&self) -> bool {
        let datagrams_sent = (self.flows.iter()).all(|f| self.sockets.get::<udp::Socket>(f.handle).send_queue() == 0);
        datagrams_sent
            && self.connections.iter().all(|c| {
                matches!(
                    self.sockets.get::<tcp::Socket>(c.handle).state(),
                    tcp::State::Closed | tcp::State::TimeWait | tcp::State::FinWait2
                )
            })
    }
}
