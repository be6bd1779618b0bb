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
//! whole within [`REQUEST_DEADLINE`], and the numbers of pending requests, of connections
//! taken at a turn and of connections are bounded. A guest has a share of the connections
//! ([`GUEST_SHARE`]), the guests together leave the owner [`OWNER_RESERVE`], and only the
//! owner and root may take a port below 1024 (as the kernel's CAP_NET_BIND_SERVICE).

use super::admission::{Admission, Decision};
use super::datagram::{self, Flow};
use super::link::{Link, Wires};
use super::readiness::{Readiness, Ready, Watched, Watcher, HANG_UP, READABLE, WRITABLE};
use super::settings::StackSettings;
use super::unix::{hung_up, peer_closed};
use crate::host::wakeup::WakeUp;
use crate::port::buffers;
use ordo_attach::rights::Rights;
use ordo_attach::{Op, Reply, Request, REQUEST_LEN};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint};
use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Each TCP connection's receive and send buffers in the stack: the window it can offer, and
/// the data it can have in flight. One flow's window must cover what the tunnel holds in
/// flight at full speed (its queues included): 1 MB held one flow back on this machine's
/// veth receiving, not sending (scripts/bench-stack.sh). The kernel grows a socket's buffers
/// up to 6 MB receiving and 4 MB sending (tcp_rmem, tcp_wmem). The memory is touched only as
/// data passes through; a peer can fill a receive buffer whose application does not read, so
/// only [`LARGE_RECEIVE_BUFFERS`] sockets at once have the large one, the others
/// [`SMALL_RECEIVE_BUFFER`] (many connections at once share the bandwidth: each needs less),
/// and the whole is bounded by [`MAX_CONNECTIONS`].
const RECEIVE_BUFFER: usize = 4 * 1024 * 1024;
const SMALL_RECEIVE_BUFFER: usize = 512 * 1024;
pub const LARGE_RECEIVE_BUFFERS: usize = 128;
const SEND_BUFFER: usize = 1024 * 1024;
/// How long a new connection may take to be established (Linux gives up after about 127 s
/// of SYN retransmissions by default; applications usually time out sooner themselves).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an application may take to send its whole request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Requests being read at once; more wait in the listen backlog.
const MAX_PENDING_REQUESTS: usize = 64;
/// Connections to the attach socket taken at one turn, refused ones included: a flood of
/// refused users cannot keep the turn (and the plane's thread) accepting.
const MAX_ACCEPTS_PER_TURN: usize = 64;
/// How often a request waiting for its user's admission looks again.
const ADMISSION_POLL: Duration = Duration::from_millis(10);
/// Connections at once (at most [`RECEIVE_BUFFER`] + [`SEND_BUFFER`] each, most of them
/// [`SMALL_RECEIVE_BUFFER`] + [`SEND_BUFFER`]); a request beyond is refused with
/// EMFILE. A UDP socket's connect counts the UDP sockets too.
const MAX_CONNECTIONS: usize = 1024;
/// A guest user's connections, listeners and UDP sockets at most.
const GUEST_SHARE: usize = MAX_CONNECTIONS / 4;
/// What the guests together leave to the owner (and root).
const OWNER_RESERVE: usize = MAX_CONNECTIONS / 4;
/// Ports below this are the owner's and root's (the kernel's ip_unprivileged_port_start).
const PRIVILEGED_PORTS: u16 = 1024;
/// Local ports of connections (the kernel's default ephemeral range is 32768-60999; the
/// stack has its own addresses, so it may use the IANA range).
const EPHEMERAL: std::ops::RangeInclusive<u16> = 49152..=65535;

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

/// A request being read: the bytes so far and the descriptors that came with them (at most
/// two are kept).
struct PendingRequest {
    control: Watched<UnixStream>,
    bytes: Vec<u8>,
    passed: Vec<OwnedFd>,
    deadline: Instant,
    /// The user at the other end (SO_PEERCRED).
    uid: u32,
    /// Whether it may attach; false while its user is being looked up.
    admitted: bool,
}

/// A non-blocking connect's stand-in, to be made writable once established.
struct Unfill {
    /// Filler bytes still to discard from the application's end.
    left: u32,
    /// A copy of the application's end, to give it back its send buffer.
    app_end: OwnedFd,
    sndbuf: u32,
}

/// Listening sockets the stack keeps ready per listener (a smoltcp socket listens until a
/// connection arrives and then is that connection): the backlog of SYNs answered at once.
const LISTEN_BACKLOG: usize = 8;

/// An application's listening socket in the stack.
struct Listener {
    /// One of the stack's addresses, or the unspecified address of a family: all of the
    /// stack's addresses the listener [`takes`].
    local: SocketAddr,
    /// On `::`: IPv6 connections only.
    v6_only: bool,
    /// The service's end of the application's listening socket (a Unix seqpacket pair):
    /// each accepted connection is sent over it with its descriptor.
    app: Watched<OwnedFd>,
    /// The stack's sockets listening for it, [`LISTEN_BACKLOG`] on each address it takes.
    ready: Vec<ListeningSocket>,
    /// On the unspecified address: the application's kernel socket listening on the same
    /// port, whose connections are handed over as they are.
    kernel: Option<Watched<TcpListener>>,
    /// The application's end had no room for the last kernel connection: wait until it has,
    /// leaving the kernel's connections in the kernel's backlog meanwhile.
    app_full: bool,
    /// ... nor for one of the stack's, which waits established meanwhile.
    stack_waiting: bool,
    /// A kernel connection accepted when the application's end had no room, for it next.
    held: Option<std::net::TcpStream>,
    /// The user whose program listens.
    uid: u32,
}

/// A socket of the stack listening on one address for a [`Listener`].
struct ListeningSocket {
    addr: IpAddr,
    handle: SocketHandle,
}

/// Whether a listener on `local` (`v6_only` on `::`) takes connections to `ip`.
fn takes(local: SocketAddr, v6_only: bool, ip: IpAddr) -> bool {
    match local.ip() {
        IpAddr::V4(a) if a.is_unspecified() => ip.is_ipv4(),
        IpAddr::V6(a) if a.is_unspecified() => ip.is_ipv6() || !v6_only,
        a => a == ip,
    }
}

/// Whether two listeners would take connections to the same address and port (the second
/// bind fails with EADDRINUSE, as the kernel's does).
fn overlaps(a: &Listener, local: SocketAddr, v6_only: bool) -> bool {
    if a.local.port() != local.port() {
        return false;
    }
    let probes: [IpAddr; 2] = [Ipv4Addr::UNSPECIFIED.into(), Ipv6Addr::UNSPECIFIED.into()];
    match (a.local.ip().is_unspecified(), local.ip().is_unspecified()) {
        (false, false) => a.local.ip() == local.ip(),
        (false, true) => takes(local, v6_only, a.local.ip()),
        (true, false) => takes(a.local, a.v6_only, local.ip()),
        // Two wildcards: a family both take (the unspecified addresses stand for theirs).
        (true, true) => probes
            .iter()
            .any(|p| takes(a.local, a.v6_only, *p) && takes(local, v6_only, *p)),
    }
}

/// A connection of an application through the stack.
struct Connection {
    handle: SocketHandle,
    /// The user whose program it is (a listener's, for a connection it accepted).
    uid: u32,
    /// The service's end of the application's socket pair (non-blocking).
    app: Watched<OwnedFd>,
    local_port: u16,
    /// Until the connection is established or fails: where to send the answer, and until
    /// when at most.
    waiting: Option<(Watched<UnixStream>, Instant)>,
    /// The application will send no more (it shut down writing or closed).
    app_done_writing: bool,
    /// The application was told the peer will send no more.
    told_app_eof: bool,
    /// For a non-blocking connect: what to undo once established.
    unfill: Option<Unfill>,
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
    /// Sockets with the large receive buffer ([`LARGE_RECEIVE_BUFFERS`] at most).
    large_receive_buffers: usize,
    /// Ended sockets' buffers, for new ones ([`SPARE_BUFFERS`] at most).
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

/// The user at the other end of `control` (SO_PEERCRED).
fn peer_uid(control: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are a valid buffer for SO_PEERCRED.
    let r = unsafe {
        libc::getsockopt(
            control.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// The TCP timestamp clock (RFC 7323): milliseconds, monotonic.
fn tsval() -> u32 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u32
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

    /// Takes new applications' connections to the attach socket.
    fn accept(&mut self) {
        if !self.listener.may_be(&self.ready, READABLE) {
            return;
        }
        let mut taken = 0;
        while self.pending.len() < MAX_PENDING_REQUESTS && taken < MAX_ACCEPTS_PER_TURN {
            let control = match self.listener.accept() {
                Ok((c, _)) => c,
                Err(_) => return,
            };
            taken += 1;
            let uid = peer_uid(&control);
            let decision = uid.map_or(Decision::Refused, |u| self.admission.decide(u));
            if decision == Decision::Refused {
                // Told why, so that the program's call fails with "permission denied"
                // rather than an unexplained end of the conversation.
                let _ = control.set_nonblocking(true);
                reply(&control, libc::EACCES, None, None);
                continue;
            }
            if control.set_nonblocking(true).is_err() {
                continue;
            }
            self.pending.push(PendingRequest {
                control: self.watcher.watch(control),
                bytes: Vec::with_capacity(REQUEST_LEN),
                passed: Vec::new(),
                deadline: Instant::now() + REQUEST_DEADLINE,
                uid: uid.unwrap_or(u32::MAX),
                admitted: decision == Decision::Admitted,
            });
        }
    }

    /// Reads what pending requests sent; a complete one is served, a bad or late one dropped
    /// (the application sees its request closed and fails its call).
    fn read_requests(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let done = if !p.control.may_be(&self.ready, READABLE) {
                now >= p.deadline
            } else {
                match recv_with_fds(p.control.as_raw_fd(), REQUEST_LEN - p.bytes.len()) {
                    Ok((bytes, fds)) => {
                        let closed = bytes.is_empty() && fds.is_empty();
                        p.bytes.extend_from_slice(&bytes);
                        // Descriptors beyond two are closed: the request is refused below if
                        // those kept are not what it needs.
                        let room = 2usize.saturating_sub(p.passed.len());
                        p.passed.extend(fds.into_iter().take(room));
                        closed || p.bytes.len() == REQUEST_LEN
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => now >= p.deadline,
                    Err(_) => true,
                }
            };
            if !p.admitted {
                match self.admission.decide(p.uid) {
                    Decision::Admitted => p.admitted = true,
                    // Its user is still being looked up: it waits, until its deadline.
                    Decision::Pending if now < p.deadline => {
                        i += 1;
                        continue;
                    }
                    Decision::Pending | Decision::Refused => {
                        let p = self.pending.swap_remove(i);
                        reply(&p.control, libc::EACCES, None, None);
                        continue;
                    }
                }
            }
            if !done {
                i += 1;
                continue;
            }
            let p = self.pending.swap_remove(i);
            if p.bytes.len() == REQUEST_LEN {
                self.serve(p);
            }
        }
    }

    fn serve(&mut self, p: PendingRequest) {
        let request = match Request::decode(&p.bytes) {
            Ok(r) => r,
            Err(_) => return reply(&p.control, libc::EPROTO, None, None),
        };
        if let Err(errno) = self.within_share(p.uid, &request) {
            return reply(&p.control, errno, None, None);
        }
        match request.op {
            Op::ConnectTcp => {
                let needed = if request.nonblocking.is_some() { 2 } else { 1 };
                if p.passed.len() != needed || !p.passed.iter().all(|fd| is_unix_stream(fd.as_raw_fd())) {
                    return reply(&p.control, libc::EPROTO, None, None);
                }
                let mut passed = p.passed.into_iter();
                let app = passed.next().expect("checked above");
                let unfill = request.nonblocking.map(|f| Unfill {
                    left: f.filler,
                    app_end: passed.next().expect("checked above"),
                    sndbuf: f.sndbuf,
                });
                if let Err(errno) = self.connect(request.addr, app, unfill, p.control.try_clone(), p.uid) {
                    reply(&p.control, errno, None, None);
                }
            }
            Op::ConnectUdp => {
                let app = match <[OwnedFd; 1]>::try_from(p.passed) {
                    Ok([fd]) if is_unix(fd.as_raw_fd(), libc::SOCK_SEQPACKET) => fd,
                    _ => return reply(&p.control, libc::EPROTO, None, None),
                };
                match self.connect_datagram(request.addr, app, p.uid) {
                    Ok(local) => reply(&p.control, 0, Some(local), Some(request.addr)),
                    Err(errno) => reply(&p.control, errno, None, None),
                }
            }
            Op::BindUdp => {
                let Some(Passed { app, kernel: host }) =
                    seqpacket_and_kernel(p.passed, |fd| host_datagram_socket(fd, request.addr))
                else {
                    return reply(&p.control, libc::EPROTO, None, None);
                };
                match self.bind_datagram(request.addr, request.v6_only, app, host, p.uid) {
                    Ok((local, marker)) => send_reply(
                        &p.control,
                        Reply {
                            errno: 0,
                            local: Some(local),
                            remote: None,
                            marker: Some(marker),
                        },
                    ),
                    Err(errno) => reply(&p.control, errno, None, None),
                }
            }
            Op::ListenTcp => {
                let Some(Passed { app, kernel }) =
                    seqpacket_and_kernel(p.passed, |fd| kernel_listener(fd, request.addr))
                else {
                    return reply(&p.control, libc::EPROTO, None, None);
                };
                match self.listen(request.addr, request.v6_only, app, kernel, p.uid) {
                    Ok(local) => reply(&p.control, 0, Some(local), None),
                    Err(errno) => reply(&p.control, errno, None, None),
                }
            }
        }
    }

    /// Whether `uid` may have what `request` asks for: a guest, a port below 1024 only as
    /// its own end of a connection (never bound, nor listened on), and its share of the
    /// connections, within what the guests together may have.
    fn within_share(&self, uid: u32, request: &Request) -> Result<(), i32> {
        if !self.admission.is_guest(uid) {
            return Ok(());
        }
        let binds = matches!(request.op, Op::ListenTcp | Op::BindUdp);
        if binds && request.addr.port() != 0 && request.addr.port() < PRIVILEGED_PORTS {
            return Err(libc::EACCES);
        }
        let owners = (self.connections.iter().map(|c| c.uid))
            .chain(self.listeners.iter().map(|l| l.uid))
            .chain(self.flows.iter().map(|f| f.uid));
        let (mut mine, mut guests) = (0, 0);
        for owner in owners {
            mine += usize::from(owner == uid);
            guests += usize::from(self.admission.is_guest(owner));
        }
        if mine >= GUEST_SHARE || guests >= MAX_CONNECTIONS - OWNER_RESERVE {
            return Err(libc::EMFILE);
        }
        Ok(())
    }

    /// Starts listening on `local` (port 0: one of the stack's free ports) for `app`, and,
    /// with `kernel`, handing over that socket's connections too.
    fn listen(
        &mut self,
        mut local: SocketAddr,
        v6_only: bool,
        app: OwnedFd,
        kernel: Option<TcpListener>,
        uid: u32,
    ) -> Result<SocketAddr, i32> {
        let wildcard = local.ip().is_unspecified();
        if !wildcard && !self.addresses.contains(&local.ip()) {
            return Err(libc::EADDRNOTAVAIL);
        }
        if self.listeners.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        if local.port() == 0 {
            local.set_port(self.take_port().ok_or(libc::EADDRNOTAVAIL)?);
        } else {
            if self.listeners.iter().any(|l| overlaps(l, local, v6_only)) {
                return Err(libc::EADDRINUSE);
            }
            // A port already listened on (on other addresses) is the listeners' already; any
            // other in use is a connection's.
            let shared = self.listeners.iter().any(|l| l.local.port() == local.port());
            if !shared && !self.ports_in_use.insert(local.port()) {
                return Err(libc::EADDRINUSE);
            }
        }
        // The kernel's socket is the program's open file until the program's descriptor is
        // swapped (after this answer): made non-blocking only once the answer is yes, so
        // that a refusal leaves the program's socket as it was.
        if let Some(Err(e)) = kernel.as_ref().map(|k| k.set_nonblocking(true)) {
            if !self.listeners.iter().any(|l| l.local.port() == local.port()) {
                self.ports_in_use.remove(&local.port());
            }
            return Err(errno_of(&e));
        }
        let mut l = Listener {
            local,
            v6_only,
            app: self.watcher.watch(app),
            ready: Vec::new(),
            kernel: kernel.map(|k| self.watcher.watch(k)),
            app_full: false,
            stack_waiting: false,
            held: None,
            uid,
        };
        let addresses: Vec<IpAddr> = (self.addresses.iter().copied())
            .filter(|a| takes(local, v6_only, *a))
            .collect();
        for addr in addresses {
            for _ in 0..LISTEN_BACKLOG {
                let handle = self.listening_socket(addr, local.port());
                l.ready.push(ListeningSocket { addr, handle });
            }
        }
        self.listeners.push(l);
        Ok(local)
    }

    fn listening_socket(&mut self, addr: IpAddr, port: u16) -> SocketHandle {
        let mut socket = self.new_tcp_socket();
        // Listening on an address of ours and a port of ours cannot fail.
        let _ = socket.listen(IpEndpoint::new(IpAddress::from(addr), port));
        self.sockets.add(socket)
    }

    /// Hands each listener's newly established connections to its application, the
    /// kernel's too; ends the listeners whose application closed them.
    fn accept_connections(&mut self) {
        let mut i = 0;
        while i < self.listeners.len() {
            let l = &self.listeners[i];
            if l.app.may_be(&self.ready, HANG_UP) && peer_closed(l.app.as_raw_fd()) {
                let l = self.listeners.swap_remove(i);
                for r in l.ready {
                    // Connections established but never accepted: reset, as the kernel does
                    // when a listening socket with a backlog is closed. The RST leaves with
                    // the stack's next poll, before which nothing reuses the handle.
                    let s = self.sockets.get_mut::<tcp::Socket>(r.handle);
                    if s.state() == tcp::State::Listen {
                        self.remove_tcp(r.handle);
                    } else {
                        s.abort();
                        self.closing.push(r.handle);
                    }
                }
                if !self.listeners.iter().any(|o| o.local.port() == l.local.port()) {
                    self.ports_in_use.remove(&l.local.port());
                }
                continue;
            }
            self.accept_from_stack(i);
            let l = &mut self.listeners[i];
            if l.held.is_some() || l.kernel.as_ref().is_some_and(|k| k.may_be(&self.ready, READABLE)) {
                hand_over_kernel_connections(l);
            }
            i += 1;
        }
    }

    /// The stack's established connections of listener `i`, to its application.
    fn accept_from_stack(&mut self, i: usize) {
        let mut k = 0;
        self.listeners[i].stack_waiting = false;
        // At the bound, established connections wait in the backlog (and further SYNs find
        // no listening socket) until others end.
        while k < self.listeners[i].ready.len() && self.connections.len() < MAX_CONNECTIONS {
            let ListeningSocket { addr, handle: h } = self.listeners[i].ready[k];
            let port = self.listeners[i].local.port();
            let s = self.sockets.get_mut::<tcp::Socket>(h);
            match s.state() {
                tcp::State::Listen | tcp::State::SynReceived => {
                    k += 1;
                    continue;
                }
                tcp::State::Closed => {
                    // Reset before it was established: listen again.
                    let _ = s.listen(IpEndpoint::new(IpAddress::from(addr), port));
                    k += 1;
                    continue;
                }
                _ => {}
            }
            let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
                k += 1;
                continue;
            };
            let accepted = ordo_attach::Accepted {
                local: to_std(local),
                remote: to_std(remote),
                kernel: false,
            };
            let Ok((ours, theirs)) = stream_pair() else {
                k += 1;
                continue;
            };
            if send_accepted(self.listeners[i].app.as_raw_fd(), &accepted, theirs.as_raw_fd()).is_err() {
                // The application's queue is full: it gets the connection when it has
                // accepted others (its end writable again wakes the stack).
                self.listeners[i].stack_waiting = true;
                k += 1;
                continue;
            }
            drop(theirs);
            let fresh = self.listening_socket(addr, port);
            self.listeners[i].ready[k].handle = fresh;
            let uid = self.listeners[i].uid;
            self.connections.push(Connection {
                handle: h,
                uid,
                app: self.watcher.watch(ours),
                // The listener's port stays taken while it listens.
                local_port: 0,
                waiting: None,
                app_done_writing: false,
                told_app_eof: false,
                unfill: None,
            });
            k += 1;
        }
    }

    fn connect(
        &mut self,
        to: SocketAddr,
        app: OwnedFd,
        unfill: Option<Unfill>,
        control: io::Result<UnixStream>,
        uid: u32,
    ) -> Result<(), i32> {
        if self.connections.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        let control = control.map_err(|e| errno_of(&e))?;
        if !self.addresses.iter().any(|a| a.is_ipv4() == to.is_ipv4()) {
            return Err(libc::EADDRNOTAVAIL);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        let local_port = self.take_port().ok_or(libc::EADDRNOTAVAIL)?;
        let mut socket = self.new_tcp_socket();
        let remote = IpEndpoint::new(IpAddress::from(to.ip()), to.port());
        if socket.connect(self.iface.context(), remote, local_port).is_err() {
            self.ports_in_use.remove(&local_port);
            return Err(libc::EINVAL);
        }
        let handle = self.sockets.add(socket);
        self.connections.push(Connection {
            handle,
            uid,
            app: self.watcher.watch(app),
            local_port,
            waiting: Some((self.watcher.watch(control), Instant::now() + CONNECT_TIMEOUT)),
            app_done_writing: false,
            told_app_eof: false,
            unfill,
        });
        Ok(())
    }

    /// Connects a UDP socket of the stack to `to` for `app`: bound to our address of `to`'s
    /// family and a free port. Nothing is sent yet, as with the kernel's connect on UDP.
    fn connect_datagram(&mut self, to: SocketAddr, app: OwnedFd, uid: u32) -> Result<SocketAddr, i32> {
        if self.connections.len() + self.flows.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        let ip = *self
            .addresses
            .iter()
            .find(|a| a.is_ipv4() == to.is_ipv4())
            .ok_or(libc::EADDRNOTAVAIL)?;
        if to.port() == 0 {
            return Err(libc::EINVAL);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        let local_port = self.take_udp_port().ok_or(libc::EADDRNOTAVAIL)?;
        let socket = datagram::new_socket(IpListenEndpoint {
            addr: Some(IpAddress::from(ip)),
            port: local_port,
        });
        self.flows.push(Flow {
            handle: self.sockets.add(socket),
            uid,
            app: self.watcher.watch(app),
            local_port,
            remote: Some(datagram::Remote::Tunnel(IpEndpoint::new(
                IpAddress::from(to.ip()),
                to.port(),
            ))),
            takes: datagram::Families::Both,
            host: None,
            marker: None,
            mtu: self.link.mtu,
        });
        Ok(SocketAddr::new(ip, local_port))
    }

    /// Binds an unconnected UDP socket of the stack to `local` (one of the stack's
    /// addresses, or the unspecified address for all of them; port 0 for a free one) for
    /// `app`, relaying its kernel socket `host` too if it brought one. Returns its address
    /// and the marker its headers start with.
    fn bind_datagram(
        &mut self,
        mut local: SocketAddr,
        v6_only: bool,
        app: OwnedFd,
        host: Option<UdpSocket>,
        uid: u32,
    ) -> Result<(SocketAddr, [u8; 8]), i32> {
        if self.connections.len() + self.flows.len() >= MAX_CONNECTIONS {
            return Err(libc::EMFILE);
        }
        let wildcard = local.ip().is_unspecified();
        if !wildcard && !self.addresses.contains(&local.ip()) {
            return Err(libc::EADDRNOTAVAIL);
        }
        set_nonblocking(app.as_raw_fd()).map_err(|e| errno_of(&e))?;
        if local.port() == 0 {
            local.set_port(self.take_udp_port().ok_or(libc::EADDRNOTAVAIL)?);
        } else if !self.udp_ports_in_use.insert(local.port()) {
            return Err(libc::EADDRINUSE);
        }
        // As in `listen`: the program's socket changed only once the answer is yes.
        if let Some(Err(e)) = host.as_ref().map(|h| h.set_nonblocking(true)) {
            self.udp_ports_in_use.remove(&local.port());
            return Err(errno_of(&e));
        }
        let socket = datagram::new_socket(IpListenEndpoint {
            addr: (!wildcard).then(|| IpAddress::from(local.ip())),
            port: local.port(),
        });
        let mut marker = [0u8; ordo_attach::MARKER_LEN];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut marker);
        self.flows.push(Flow {
            handle: self.sockets.add(socket),
            uid,
            app: self.watcher.watch(app),
            local_port: local.port(),
            remote: None,
            takes: match local.ip() {
                IpAddr::V4(_) => datagram::Families::V4,
                IpAddr::V6(_) if v6_only || !wildcard => datagram::Families::V6,
                IpAddr::V6(_) => datagram::Families::Both,
            },
            host: host.map(|h| self.watcher.watch(h)),
            marker: Some(marker),
            mtu: self.link.mtu,
        });
        Ok((local, marker))
    }

    /// Each flow's turn; a flow whose application closed its end is removed.
    fn relay_datagrams(&mut self) {
        let mut i = 0;
        while i < self.flows.len() {
            let f = &mut self.flows[i];
            let s = self.sockets.get_mut::<udp::Socket>(f.handle);
            if datagram::relay(f, s, &mut self.scratch, &self.link.wires.datagram_drops, &self.ready) {
                i += 1;
                continue;
            }
            let f = self.flows.swap_remove(i);
            self.sockets.remove(f.handle);
            self.udp_ports_in_use.remove(&f.local_port);
        }
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

    fn take_port(&mut self) -> Option<u16> {
        take_port(&mut self.ports_in_use, &mut self.next_port)
    }

    fn take_udp_port(&mut self) -> Option<u16> {
        take_port(&mut self.udp_ports_in_use, &mut self.next_port)
    }

    /// Moves bytes between each application and its TCP socket, answers connects that
    /// finished, and ends connections that are over.
    fn relay(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.connections.len() {
            let c = &mut self.connections[i];
            let s = self.sockets.get_mut::<tcp::Socket>(c.handle);
            // Each asked only if the set may have found it hung up.
            let ready = &self.ready;
            let gone = |may_be: bool, fd: RawFd| may_be && hung_up(fd);
            let abandoned = (c.waiting.as_ref()).is_some_and(|(control, _)| {
                gone(c.app.may_be(ready, HANG_UP), c.app.as_raw_fd())
                    || gone(control.may_be(ready, HANG_UP), control.as_raw_fd())
            });
            if abandoned {
                // The program closed a socket still connecting, or ended (which closes the
                // request its answer would go to; the service keeps a copy of a
                // non-blocking connect's stand-in, so that end alone does not tell): the
                // attempt is abandoned, as the kernel abandons a closed socket's SYN_SENT.
                s.abort();
                self.end(i);
                continue;
            }
            let mut failed = false;
            if let Some((control, deadline)) = &c.waiting {
                let answer = match s.state() {
                    tcp::State::SynSent | tcp::State::SynReceived if now < *deadline => None,
                    tcp::State::SynSent | tcp::State::SynReceived => {
                        s.abort();
                        Some(libc::ETIMEDOUT)
                    }
                    tcp::State::Closed => Some(libc::ECONNREFUSED),
                    _ => Some(0),
                };
                if let Some(errno) = answer {
                    let local = s.local_endpoint().map(to_std);
                    let remote = s.remote_endpoint().map(to_std);
                    reply(control, errno, local, remote);
                    c.waiting = None;
                    failed = errno != 0;
                }
            }
            if failed {
                self.end(i);
                continue;
            }
            if c.waiting.is_none() && !relay_one(c, s, &self.ready) {
                self.end(i);
                continue;
            }
            i += 1;
        }
    }

    fn end(&mut self, i: usize) {
        let c = self.connections.swap_remove(i);
        self.remove_tcp(c.handle);
        self.ports_in_use.remove(&c.local_port);
    }

    /// A TCP socket for a connection or a listener: the large receive buffer while fewer
    /// than [`LARGE_RECEIVE_BUFFERS`] sockets have it; an ended socket's buffers if one of
    /// that size is spare.
    fn new_tcp_socket(&mut self) -> tcp::Socket<'static> {
        let receive = if self.large_receive_buffers < LARGE_RECEIVE_BUFFERS {
            self.large_receive_buffers += 1;
            RECEIVE_BUFFER
        } else {
            SMALL_RECEIVE_BUFFER
        };
        let spare = self.spare_buffers.iter().position(|b| b.receive.capacity() == receive);
        let buffers = match spare {
            Some(i) => self.spare_buffers.swap_remove(i),
            None => SocketBuffers {
                receive: tcp::SocketBuffer::new(vec![0; receive]),
                send: tcp::SocketBuffer::new(vec![0; SEND_BUFFER]),
            },
        };
        new_tcp_socket(buffers)
    }

    /// Removes a TCP socket, giving back its large receive buffer if it had one, and keeping
    /// its buffers for the next socket while fewer than [`SPARE_BUFFERS`] are kept.
    fn remove_tcp(&mut self, h: SocketHandle) {
        if let smoltcp::socket::Socket::Tcp(s) = self.sockets.remove(h) {
            if s.recv_capacity() == RECEIVE_BUFFER {
                self.large_receive_buffers -= 1;
            }
            if self.spare_buffers.len() < SPARE_BUFFERS {
                let (receive, send) = s.into_buffers();
                self.spare_buffers.push(SocketBuffers { receive, send });
            }
        }
    }
}

/// A free port of `in_use` from the ephemeral range, taken, starting at `next`.
fn take_port(in_use: &mut HashSet<u16>, next: &mut u16) -> Option<u16> {
    let span = EPHEMERAL.end() - EPHEMERAL.start() + 1;
    for _ in 0..span {
        let p = *next;
        *next = if p == *EPHEMERAL.end() {
            *EPHEMERAL.start()
        } else {
            p + 1
        };
        if in_use.insert(p) {
            return Some(p);
        }
    }
    None
}

/// One established connection's turn; false once it is over. The application's end is read
/// only if `ready` may find it readable.
fn relay_one(c: &mut Connection, s: &mut tcp::Socket, ready: &Ready) -> bool {
    let fd = c.app.as_raw_fd();
    if let Some(u) = &mut c.unfill {
        // A non-blocking connect, now established: drop the filler that kept the stand-in
        // unwritable, and give it its send buffer back; the application sees it writable.
        let mut scratch = [0u8; 4096];
        while u.left > 0 {
            let want = scratch.len().min(u.left as usize);
            // SAFETY: reading into `scratch`, at most its length.
            let n = unsafe { libc::read(fd, scratch.as_mut_ptr().cast(), want) };
            if n <= 0 {
                break;
            }
            u.left -= n as u32;
        }
        if u.left > 0 {
            return true;
        }
        let half = libc::c_int::try_from(u.sndbuf / 2).unwrap_or(libc::c_int::MAX);
        // SAFETY: an int option on our copy of the application's end. The kernel doubles
        // what is set, as it did for the value the library read.
        unsafe {
            libc::setsockopt(
                u.app_end.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&half as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        c.unfill = None;
    }
    // Application to peer: read straight into the send buffer, until a read comes short (the
    // end had no more then; more later makes it ready again).
    let readable = c.app.may_be(ready, READABLE);
    while readable && !c.app_done_writing && s.can_send() {
        let r = s.send(|buf| {
            // SAFETY: reading into smoltcp's free send space, `buf.len()` writable bytes.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            (n.max(0) as usize, (n, n > 0 && (n as usize) < buf.len()))
        });
        match r {
            Ok((n, short)) if n > 0 => {
                if short {
                    break;
                }
                continue;
            }
            Ok((0, _)) => {
                c.app_done_writing = true;
                s.close();
            }
            Ok(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    s.abort();
                    return false;
                }
            }
            Err(_) => {}
        }
        break;
    }
    // Peer to application: write straight from the receive buffer.
    while s.can_recv() {
        let r = s.recv(|buf| {
            // SAFETY: writing the received bytes smoltcp hands us.
            let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
            (n.max(0) as usize, n)
        });
        match r {
            Ok(n) if n > 0 => continue,
            Ok(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    // The application closed its end: nobody will read what the peer sends.
                    s.abort();
                    return false;
                }
            }
            Err(_) => {}
        }
        break;
    }
    if !s.may_recv() && !s.can_recv() && !c.told_app_eof && s.state() != tcp::State::SynSent {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(fd, libc::SHUT_WR) };
        c.told_app_eof = true;
    }
    let over = matches!(s.state(), tcp::State::Closed | tcp::State::TimeWait) && !s.can_recv();
    !over
}

/// A TCP socket's two buffers.
struct SocketBuffers {
    receive: tcp::SocketBuffer<'static>,
    send: tcp::SocketBuffer<'static>,
}

/// Ended sockets' buffers kept for new ones: a socket's are megabytes, and allocating them
/// zeroed cost more than the rest of a connection's setup (a connection opened and closed
/// at a time). The most memory kept so is this many large receive and send buffers.
const SPARE_BUFFERS: usize = 8;

/// A TCP socket of the stack, as every connection has it, over `buffers`.
fn new_tcp_socket(buffers: SocketBuffers) -> tcp::Socket<'static> {
    let mut socket = tcp::Socket::new(buffers.receive, buffers.send);
    socket.set_congestion_control(tcp::CongestionControl::Cubic);
    socket.set_tsval_generator(Some(tsval));
    // Linux's floor (RFC 8961 allows it): a retransmission that loss recovery could not
    // repair waits 200 ms, not the 1 s of RFC 6298.
    socket.set_min_rto(MIN_RTO);
    socket
}

/// The floor of a connection's retransmission timeout.
const MIN_RTO: smoltcp::time::Duration = smoltcp::time::Duration::from_millis(200);

/// A non-blocking Unix stream pair: ours, and the application's.
fn stream_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    let flags = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    if unsafe { libc::socketpair(libc::AF_UNIX, flags, 0, fds.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: both are open descriptors that nothing else owns.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    set_nonblocking(ours.as_raw_fd())?;
    Ok((ours, theirs))
}

/// Sends an accepted connection and its descriptor over a listener's pair, without waiting.
fn send_accepted(fd: RawFd, a: &ordo_attach::Accepted, pass: RawFd) -> io::Result<()> {
    let bytes = a.encode();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut rights = Rights::default();
    let msg = rights.send_header(&mut iov, &[pass]);
    // SAFETY: `msg` points into `rights` and `iov`, alive for the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A listener's connections to its kernel socket, to its application as they are (kernel
/// sockets: the service relays nothing for them), while its end has room for them. One
/// accepted when it had none is held until it has (and the rest wait in the kernel's
/// backlog); room is looked at only once there is a connection to hand over, so an idle
/// listener costs the service's turn one accept.
fn hand_over_kernel_connections(l: &mut Listener) {
    let Some(kernel) = &l.kernel else { return };
    loop {
        let Some(conn) = l.held.take().or_else(|| kernel.accept().ok().map(|(c, _)| c)) else {
            l.app_full = false;
            return;
        };
        if !writable(l.app.as_raw_fd()) {
            l.held = Some(conn);
            l.app_full = true;
            return;
        }
        let (Ok(local), Ok(remote)) = (conn.local_addr(), conn.peer_addr()) else {
            continue;
        };
        let accepted = ordo_attach::Accepted {
            local,
            remote,
            kernel: true,
        };
        // Room was checked just above; should the send fail anyway, the connection is
        // closed (its client sees it reset) rather than kept without bound.
        let _ = send_accepted(l.app.as_raw_fd(), &accepted, conn.as_raw_fd());
    }
}

/// Whether a datagram or record fits in `fd`'s send buffer now.
fn writable(fd: RawFd) -> bool {
    let mut p = pollfd(fd, libc::POLLOUT);
    // SAFETY: one valid pollfd, no waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLOUT != 0 }
}

/// The descriptors of a listen or a UDP bind: the service's end of a seqpacket pair, and
/// maybe the program's kernel socket on the same port.
struct Passed<K> {
    app: OwnedFd,
    kernel: Option<K>,
}

/// [`Passed`] from what came with a request, the kernel socket checked by `kernel` (None:
/// not what it must be); None if they are not that: the request is refused.
fn seqpacket_and_kernel<K>(passed: Vec<OwnedFd>, kernel: impl FnOnce(OwnedFd) -> Option<K>) -> Option<Passed<K>> {
    let mut passed = passed.into_iter();
    let app = passed
        .next()
        .filter(|fd| is_unix(fd.as_raw_fd(), libc::SOCK_SEQPACKET))?;
    let kernel = match passed.next() {
        None => None,
        Some(fd) => Some(kernel(fd)?),
    };
    Some(Passed { app, kernel })
}

/// The application's kernel socket passed with a UDP bind to `addr` (the unspecified address
/// and a port): a UDP socket bound to that port, or None (the request is refused).
fn host_datagram_socket(fd: OwnedFd, addr: SocketAddr) -> Option<UdpSocket> {
    let udp = socket_int(fd.as_raw_fd(), libc::SO_PROTOCOL) == Some(libc::IPPROTO_UDP)
        && matches!(
            socket_int(fd.as_raw_fd(), libc::SO_DOMAIN),
            Some(libc::AF_INET | libc::AF_INET6)
        );
    if !udp || !addr.ip().is_unspecified() || addr.port() == 0 {
        return None;
    }
    let socket = UdpSocket::from(fd);
    (socket.local_addr().ok()?.port() == addr.port()).then_some(socket)
}

/// An int option of a socket at SOL_SOCKET.
fn socket_int(fd: RawFd, opt: libc::c_int) -> Option<libc::c_int> {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are a valid buffer for an int socket option.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, opt, (&mut v as *mut libc::c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// The application's kernel socket passed with a listen on `addr` (the unspecified address
/// and a port): a TCP socket listening on that port, or None (the request is refused).
fn kernel_listener(fd: OwnedFd, addr: SocketAddr) -> Option<TcpListener> {
    let int = |opt| socket_int(fd.as_raw_fd(), opt);
    let tcp = int(libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
        && matches!(int(libc::SO_DOMAIN), Some(libc::AF_INET | libc::AF_INET6))
        && int(libc::SO_ACCEPTCONN) == Some(1);
    if !tcp || !addr.ip().is_unspecified() {
        return None;
    }
    let listener = TcpListener::from(fd);
    (listener.local_addr().ok()?.port() == addr.port()).then_some(listener)
}

fn to_std(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(e.addr.into(), e.port)
}

fn pollfd(fd: RawFd, events: i16) -> libc::pollfd {
    libc::pollfd { fd, events, revents: 0 }
}

fn reply(control: &UnixStream, errno: i32, local: Option<SocketAddr>, remote: Option<SocketAddr>) {
    let r = Reply {
        errno,
        local,
        remote,
        marker: None,
    };
    send_reply(control, r);
}

fn send_reply(control: &UnixStream, r: Reply) {
    use std::io::Write;
    let bytes = r.encode();
    // The control socket is non-blocking and the reply is far smaller than its buffer; an
    // application that went away simply misses it.
    let _ = (&*control).write_all(&bytes);
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a Unix stream socket (what the protocol passes), not any other file an
/// application might send instead.
fn is_unix_stream(fd: RawFd) -> bool {
    is_unix(fd, libc::SOCK_STREAM)
}

/// Whether `fd` is a Unix socket of type `ty`.
fn is_unix(fd: RawFd, ty: libc::c_int) -> bool {
    socket_int(fd, libc::SO_DOMAIN) == Some(libc::AF_UNIX) && socket_int(fd, libc::SO_TYPE) == Some(ty)
}

/// Reads up to `max` bytes and the descriptors passed with them. Empty bytes and no
/// descriptor: the other end closed.
fn recv_with_fds(fd: RawFd, max: usize) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut bytes = vec![0u8; max];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut rights = Rights::default();
    let mut msg = rights.recv_header(&mut iov);
    // SAFETY: `msg` points into `rights` and `iov`, alive for the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: filled by the recvmsg above; its descriptors are ours alone.
    let fds = unsafe { ordo_attach::rights::received(&msg) };
    bytes.truncate(n as usize);
    Ok((bytes, fds))
}
