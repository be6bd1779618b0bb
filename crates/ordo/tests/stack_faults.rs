//! The stack's TCP through a tunnel that reorders, delays and drops: two planes, A and B,
//! each with Ordo's own TCP/IP stack as its inner side and its attach service, joined by a
//! `MemoryOuter::pair` whose every receive half goes through a `FaultInjector`. A program's
//! connection made through A's service to a listener of B's carries bytes both ways at once
//! and every byte arrives, in order, within a bound far below what a sender that took each
//! reordering for a loss and collapsed would need. The kernel here has no netem, and
//! nftables drops but cannot reorder; this is the reordering test of the stack (the stack's
//! point 4). `tests/stack/stack.sh` (`lossy`) shows it over a real kernel and real peer.

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use ordo::inner::stack::service::Service;
use ordo::inner::stack::{StackPort, StackSettings};
use ordo::outer::faults::{FaultInjector, Faults};
use ordo::outer::memory::MemoryOuter;
use ordo::placement::model::{Model, PlacementSettings, Plan};
use ordo::plane::DataPlane;
use ordo::port::InnerPort;
use ordo::threads::{self, Stop};
use ordo_attach::{Accepted, Op, Reply, Request, ACCEPTED_LEN, REPLY_LEN};
use ordo_proto::{Interface, PrivateKey};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Plane = DataPlane<StackPort, FaultInjector<MemoryOuter>>;

/// Bytes each way.
const BYTES: usize = 8 << 20;
/// What the transfer may take under the faults below. Without them it takes well under a
/// second here; a sender that mistook each reordering for a loss, or waited for its timer,
/// would take minutes.
const BOUND: Duration = Duration::from_secs(60);

struct End {
    plane: Arc<Plane>,
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
    _service: Service,
    socket: PathBuf,
}

impl Drop for End {
    fn drop(&mut self) {
        self.stop.request("the test is over");
        // As the device does: the port's readers wake and see the stop.
        self.plane.inner.shutdown();
        self.plane.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct Side {
    key: PrivateKey,
    outer: SocketAddr,
    inner: &'static str,
}

fn end(me: &Side, them: &Side, outer: FaultInjector<MemoryOuter>, plan: Plan) -> End {
    let mut core = Interface::new(Instant::now());
    core.set_mtu(1420);
    core.set_private_key(Some(me.key.clone()));
    let peer = core.add_peer(them.key.public_key()).unwrap();
    core.set_endpoint(peer, them.outer);
    core.add_allowed_ip(peer, format!("{}/32", them.inner).parse().unwrap());
    let settings = StackSettings {
        addresses: vec![format!("{}/24", me.inner).parse().unwrap()],
        mtu: 1420,
        attachers: ordo::inner::stack::Attachers::own(),
    };
    let (inner, stack) = StackPort::new(plan.queues.len(), settings.mtu).unwrap();
    let plane = DataPlane::new(core, inner, outer, plan);
    plane.start();
    let stop = Arc::new(Stop::default());
    let threads = threads::start(&plane, &stop, || None).unwrap();
    let socket = std::env::temp_dir().join(format!(
        "ordo-stack-faults.{}.{}.{:?}",
        std::process::id(),
        me.inner,
        Instant::now()
    ));
    let service = Service::start(stack, &settings, UnixListener::bind(&socket).unwrap()).unwrap();
    End {
        plane,
        stop,
        threads,
        _service: service,
        socket,
    }
}

/// Sends `request` with `fd` to the service at `socket`; the connection its reply comes on.
fn ask(socket: &PathBuf, request: &Request, fd: RawFd) -> UnixStream {
    let c = UnixStream::connect(socket).unwrap();
    c.set_read_timeout(Some(BOUND)).unwrap();
    let fds = [fd];
    let cmsgs = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        c.as_raw_fd(),
        &[IoSlice::new(&request.encode())],
        &cmsgs,
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    c
}

fn reply(mut c: UnixStream) -> Reply {
    let mut r = [0u8; REPLY_LEN];
    c.read_exact(&mut r).unwrap();
    Reply::decode(&r).unwrap()
}

/// Writes `data` to `w` and, at the same time, reads as many bytes from `r`: both ways at
/// once, as a program would.
fn exchange(mut w: UnixStream, mut r: UnixStream, data: Arc<Vec<u8>>) -> JoinHandle<Vec<u8>> {
    let writer = std::thread::spawn(move || {
        w.write_all(&data).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
        w
    });
    std::thread::spawn(move || {
        r.set_read_timeout(Some(BOUND)).unwrap();
        let mut got = Vec::with_capacity(BYTES);
        r.read_to_end(&mut got).unwrap();
        let _keep_open_until_read = writer.join().unwrap();
        got
    })
}

#[test]
fn a_connection_through_a_reordering_lossy_tunnel_delivers_every_byte_in_order() {
    let mut rng = ChaCha20Rng::seed_from_u64(20);
    let a = Side {
        key: PrivateKey::generate(&mut rng),
        outer: "192.0.2.1:51820".parse().unwrap(),
        inner: "10.99.0.1",
    };
    let b = Side {
        key: PrivateKey::generate(&mut rng),
        outer: "192.0.2.2:51820".parse().unwrap(),
        inner: "10.99.0.2",
    };
    let config = PlacementSettings {
        model: Model::Inline,
        ..Default::default()
    };
    let (a_plan, b_plan) = (Plan::new(&config).unwrap(), Plan::new(&config).unwrap());
    let (a_outer, b_outer) = MemoryOuter::pair(a.outer, a_plan.queues.len(), b.outer, b_plan.queues.len()).unwrap();
    // Reordering on both receivers (swaps within a burst, and datagrams held back by more
    // than a round trip, which arrive after those sent later), and a little loss, once the
    // handshake is through.
    let faults = |seed| Faults {
        seed,
        drop: 0.002,
        reorder: 0.05,
        delay: 0.02,
        delay_by: Duration::from_millis(3),
        ..Faults::default()
    };
    let (a_outer, b_outer) = (
        FaultInjector::new(a_outer, Faults::default()),
        FaultInjector::new(b_outer, Faults::default()),
    );
    let a_end = end(&a, &b, a_outer, a_plan);
    let b_end = end(&b, &a, b_outer, b_plan);

    // B listens; A's program connects to it.
    let (b_listener, b_service_end) =
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
    let listen = Request {
        op: Op::ListenTcp,
        addr: "10.99.0.2:5001".parse().unwrap(),
        nonblocking: None,
        v6_only: false,
    };
    assert_eq!(reply(ask(&b_end.socket, &listen, b_service_end.as_raw_fd())).errno, 0);
    let (a_app, a_service_end) =
        socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC).unwrap();
    let connect = Request {
        op: Op::ConnectTcp,
        addr: "10.99.0.2:5001".parse().unwrap(),
        nonblocking: None,
        v6_only: false,
    };
    let answer = ask(&a_end.socket, &connect, a_service_end.as_raw_fd());
    drop(a_service_end);
    assert_eq!(reply(answer).errno, 0, "the connection through the tunnel");
    let mut buf = [0u8; ACCEPTED_LEN];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(b_listener.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty()).unwrap();
    let Some(ControlMessageOwned::ScmRights(fds)) = msg.cmsgs().unwrap().next() else {
        panic!("no connection came with the accept")
    };
    // SAFETY: the descriptor the message just brought, ours alone.
    let b_app = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    assert_eq!(Accepted::decode(&buf).unwrap().remote.ip().to_string(), "10.99.0.1");

    a_end.plane.outer.set_faults(faults(1));
    b_end.plane.outer.set_faults(faults(2));
    let mut data = vec![0u8; BYTES];
    rng.fill_bytes(&mut data);
    let (to_b, to_a) = (
        Arc::new(data.clone()),
        Arc::new(data.iter().rev().copied().collect::<Vec<u8>>()),
    );
    let (a_app, b_app) = (UnixStream::from(a_app), UnixStream::from(b_app));
    let started = Instant::now();
    let at_b = exchange(a_app.try_clone().unwrap(), b_app.try_clone().unwrap(), to_b.clone());
    let at_a = exchange(b_app, a_app, to_a.clone());
    let (at_b, at_a) = (at_b.join().unwrap(), at_a.join().unwrap());
    let took = started.elapsed();
    assert!(
        at_b == *to_b,
        "A to B: {} of {} bytes, or not in order",
        at_b.len(),
        BYTES
    );
    assert!(
        at_a == *to_a,
        "B to A: {} of {} bytes, or not in order",
        at_a.len(),
        BYTES
    );
    let counts = [a_end.plane.outer.counts(), b_end.plane.outer.counts()];
    let reordered: u64 = counts
        .iter()
        .map(|c| c.reordered.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    let delayed: u64 = counts
        .iter()
        .map(|c| c.delayed.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    let dropped: u64 = counts
        .iter()
        .map(|c| c.dropped.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    eprintln!(
        "{} MB each way in {:.2} s: {reordered} datagrams swapped, {delayed} held back, {dropped} dropped",
        BYTES >> 20,
        took.as_secs_f64()
    );
    assert!(reordered > 100 && delayed > 50, "the faults did not happen");
    assert!(took < BOUND, "took {took:?}");
}
