//! The attach service (`inner::stack::service`) against what applications may send it: bytes
//! that are not a request, a request without its descriptor or with the wrong kind, half a
//! request, and a request for a family the stack has no address in. Each gets its error
//! (or is dropped), and the service still serves a good request afterwards: the stack sends
//! the connection's SYN towards the plane, or a UDP socket's datagrams.

use nix::sys::socket::{sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
use ordo::inner::stack::service::Service;
use ordo::inner::stack::{StackPort, StackSettings};
use ordo::port::{InnerPort, InnerRead};
use ordo_attach::{Op, Reply, Request, REPLY_LEN};
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The service, its port, and a thread that plays the plane's reader: it runs the stack's
/// turns as the plane does (woken by the stack's descriptor) and passes on what the stack
/// sends.
struct Running {
    port: Arc<StackPort>,
    packets: Mutex<mpsc::Receiver<Vec<u8>>>,
    _service: Service,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
    _dir: TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.reader.take() {
            let _ = t.join();
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start() -> Running {
    let dir = std::env::temp_dir().join(format!("ordo-stack-test.{}.{:?}", std::process::id(), Instant::now()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("attach.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let settings = StackSettings {
        addresses: vec!["10.99.0.1/24".parse().unwrap()],
        mtu: 1420,
        attachers: ordo::inner::stack::Attachers::own(),
    };
    let (port, stack) = StackPort::new(1, settings.mtu).unwrap();
    let port = Arc::new(port);
    let service = Service::start(stack, &settings, listener).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, packets) = mpsc::channel();
    let reader = {
        let (port, stop) = (port.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reader = port.reader(0);
            let mut out = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let mut p = libc::pollfd {
                    fd: reader.wait_fd().unwrap(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 10) };
                reader.read(&mut out, 64).unwrap();
                for packet in out.drain(..) {
                    let _ = tx.send(packet.packet().to_vec());
                }
            }
        })
    };
    Running {
        port,
        packets: Mutex::new(packets),
        _service: service,
        socket,
        stop,
        reader: Some(reader),
        _dir: TempDir(dir),
    }
}

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC).unwrap()
}

/// Sends `bytes` (with `fd` if given) on a fresh connection; the reply, or None if the
/// service closed the connection without one.
fn ask(socket: &Path, bytes: &[u8], fd: Option<i32>) -> Option<Reply> {
    let mut c = UnixStream::connect(socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let fds = fd.map(|f| [f]);
    let cmsgs: Vec<ControlMessage> = fds.iter().map(|f| ControlMessage::ScmRights(f)).collect();
    sendmsg::<()>(c.as_raw_fd(), &[IoSlice::new(bytes)], &cmsgs, MsgFlags::empty(), None).unwrap();
    let mut reply = [0u8; REPLY_LEN];
    c.read_exact(&mut reply).ok()?;
    Some(Reply::decode(&reply).expect("the service's reply decodes"))
}

fn listen_request(addr: &str) -> Vec<u8> {
    Request {
        op: Op::ListenTcp,
        addr: addr.parse().unwrap(),
        nonblocking: None,
        v6_only: false,
    }
    .encode()
    .to_vec()
}

fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap()
}

fn connect_request(addr: &str) -> Vec<u8> {
    Request {
        op: Op::ConnectTcp,
        addr: addr.parse().unwrap(),
        nonblocking: None,
        v6_only: false,
    }
    .encode()
    .to_vec()
}

/// The next packet the stack sends towards the plane, within `timeout`.
fn next_packet(r: &Running, timeout: Duration) -> Option<Vec<u8>> {
    r.packets.lock().unwrap().recv_timeout(timeout).ok()
}

#[test]
fn bad_requests_get_errors_and_a_good_one_still_connects() {
    let r = start();
    let eproto = Some(libc::EPROTO);
    // Not a request at all.
    let junk = vec![0x5a; connect_request("10.99.0.2:80").len()];
    assert_eq!(ask(&r.socket, &junk, None).map(|x| x.errno), eproto);
    // A request without the descriptor it needs.
    assert_eq!(
        ask(&r.socket, &connect_request("10.99.0.2:80"), None).map(|x| x.errno),
        eproto
    );
    // A request with a descriptor that is not a Unix stream socket (a pipe).
    let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
    let got = ask(&r.socket, &connect_request("10.99.0.2:80"), Some(pipe_r.as_raw_fd()));
    assert_eq!(got.map(|x| x.errno), eproto);
    // A family the stack has no address in.
    let (_mine, theirs) = pair();
    let got = ask(&r.socket, &connect_request("[fd99::2]:80"), Some(theirs.as_raw_fd()));
    assert_eq!(got.map(|x| x.errno), Some(libc::EADDRNOTAVAIL));
    // Half a request, then the application goes away; and one that closes at once.
    {
        let mut c = UnixStream::connect(&r.socket).unwrap();
        c.write_all(&connect_request("10.99.0.2:80")[..7]).unwrap();
    }
    drop(UnixStream::connect(&r.socket).unwrap());
    assert!(
        next_packet(&r, Duration::from_millis(200)).is_none(),
        "a bad request sent a packet"
    );

    // A good request: the stack sends a SYN from its address to the destination.
    let (_mine, theirs) = pair();
    let mut c = send_connect(&r.socket, &theirs);
    let syn = next_packet(&r, Duration::from_secs(5)).expect("a SYN towards the plane");
    assert_eq!(syn[0] >> 4, 4, "IPv4");
    assert_eq!(syn[9], 6, "TCP");
    assert_eq!(&syn[12..16], &[10, 99, 0, 1], "from the stack's address");
    assert_eq!(&syn[16..20], &[10, 99, 0, 2], "to the destination");
    let tcp = &syn[usize::from(syn[0] & 0xf) * 4..];
    assert_eq!(u16::from_be_bytes([tcp[2], tcp[3]]), 80);
    assert_eq!(tcp[13] & 0x12, 0x02, "SYN without ACK");
    // Nobody answers: no reply yet (the connect waits for the peer).
    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut reply = [0u8; REPLY_LEN];
    assert!(c.read_exact(&mut reply).is_err(), "answered before the peer did");
}

#[test]
fn a_request_sent_slowly_is_dropped_after_its_deadline_and_others_are_served_meanwhile() {
    let r = start();
    let mut slow = UnixStream::connect(&r.socket).unwrap();
    slow.write_all(&connect_request("10.99.0.2:80")[..3]).unwrap();
    // Meanwhile another application is served.
    let junk = vec![0u8; connect_request("10.99.0.2:80").len()];
    assert_eq!(ask(&r.socket, &junk, None).map(|x| x.errno), Some(libc::EPROTO));
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 1];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the slow request was answered");
    assert!(start.elapsed() < Duration::from_secs(8), "not dropped in time");
}

#[test]
fn listen_and_non_blocking_requests_are_checked() {
    let r = start();
    let errno = |bytes: &[u8], fds: &[i32]| -> Option<i32> {
        let mut c = UnixStream::connect(&r.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let cmsgs = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsgs };
        sendmsg::<()>(c.as_raw_fd(), &[IoSlice::new(bytes)], cmsgs, MsgFlags::empty(), None).unwrap();
        let mut reply = [0u8; REPLY_LEN];
        c.read_exact(&mut reply).ok()?;
        Some(Reply::decode(&reply).unwrap().errno)
    };
    // A listening socket must be a seqpacket pair's end, not a stream's.
    let (_a, stream) = pair();
    assert_eq!(
        errno(&listen_request("10.99.0.1:80"), &[stream.as_raw_fd()]),
        Some(libc::EPROTO)
    );
    // Only the stack's own addresses.
    let (_b, sp) = seqpacket_pair();
    assert_eq!(
        errno(&listen_request("10.99.0.7:80"), &[sp.as_raw_fd()]),
        Some(libc::EADDRNOTAVAIL)
    );
    // A port is listened on once.
    let (_c, sp1) = seqpacket_pair();
    assert_eq!(errno(&listen_request("10.99.0.1:80"), &[sp1.as_raw_fd()]), Some(0));
    let (_d, sp2) = seqpacket_pair();
    assert_eq!(
        errno(&listen_request("10.99.0.1:80"), &[sp2.as_raw_fd()]),
        Some(libc::EADDRINUSE)
    );
    // A non-blocking connect needs the application's end as well as the service's.
    let nonblocking = Request {
        op: Op::ConnectTcp,
        addr: "10.99.0.2:80".parse().unwrap(),
        nonblocking: Some(ordo_attach::Filler {
            filler: 0,
            sndbuf: 4096,
        }),
        v6_only: false,
    }
    .encode();
    let (_e, theirs) = pair();
    assert_eq!(errno(&nonblocking, &[theirs.as_raw_fd()]), Some(libc::EPROTO));
}

#[test]
fn udp_sockets_are_checked_and_their_datagrams_leave_as_sent() {
    let r = start();
    let udp_request = |addr: &str| {
        Request {
            op: Op::ConnectUdp,
            addr: addr.parse().unwrap(),
            nonblocking: None,
            v6_only: false,
        }
        .encode()
    };
    // A UDP socket's stand-in is a seqpacket pair's end, not a stream's.
    let (_a, stream) = pair();
    assert_eq!(
        ask(&r.socket, &udp_request("10.99.0.2:53"), Some(stream.as_raw_fd())).map(|r| r.errno),
        Some(libc::EPROTO)
    );
    // A family the stack has no address in, and port 0, are refused.
    let (_b, sp) = seqpacket_pair();
    assert_eq!(
        ask(&r.socket, &udp_request("[fd99::2]:53"), Some(sp.as_raw_fd())).map(|r| r.errno),
        Some(libc::EADDRNOTAVAIL)
    );
    let (_c, sp) = seqpacket_pair();
    assert_eq!(
        ask(&r.socket, &udp_request("10.99.0.2:0"), Some(sp.as_raw_fd())).map(|r| r.errno),
        Some(libc::EINVAL)
    );
    // A good one: named at once, and each record the application writes leaves as one
    // datagram from its address to its remote, payload unchanged.
    let (app, theirs) = seqpacket_pair();
    let reply = ask(&r.socket, &udp_request("10.99.0.2:53"), Some(theirs.as_raw_fd())).expect("a reply");
    assert_eq!(reply.errno, 0);
    let local = reply.local.expect("a local address");
    assert_eq!(local.ip().to_string(), "10.99.0.1");
    assert_eq!(reply.remote, Some("10.99.0.2:53".parse().unwrap()));
    drop(theirs);
    let mut app = UnixStream::from(app);
    app.write_all(b"hello").unwrap();
    let p = next_packet(&r, Duration::from_secs(5)).expect("the datagram");
    assert_eq!(p[9], 17, "UDP");
    assert_eq!(&p[12..20], &[10, 99, 0, 1, 10, 99, 0, 2]);
    assert_eq!(u16::from_be_bytes([p[20], p[21]]), local.port());
    assert_eq!(u16::from_be_bytes([p[22], p[23]]), 53);
    assert_eq!(&p[28..], b"hello");
    // Larger than the tunnel carries in one packet: dropped and counted, and the next one
    // still leaves.
    app.write_all(&[7u8; 1420]).unwrap();
    app.write_all(b"again").unwrap();
    let p = next_packet(&r, Duration::from_secs(5)).expect("the next datagram");
    assert_eq!(&p[28..], b"again");
    let too_big = r
        .port
        .counters()
        .into_iter()
        .find(|c| c.name == "drop_stack_datagram_too_big");
    assert_eq!(too_big.map(|c| c.value), Some(1));
}

/// A server bound to the unspecified address listens on the stack's addresses and, through
/// the kernel socket it passes, on the host's: the kernel's connections come over the same
/// pair, as the kernel's sockets. The second descriptor must be that: a TCP socket listening
/// on the request's port. Listeners whose addresses overlap exclude each other, as the
/// kernel's do; IPv4 and an IPV6_V6ONLY `::` do not.
#[test]
fn a_wildcard_listener_takes_the_kernel_s_connections_too() {
    use nix::sys::socket::{recvmsg, ControlMessageOwned};
    use std::net::{TcpListener, TcpStream};
    let r = start();
    let errno = |request: &Request, fds: &[i32]| -> Option<i32> {
        let mut c = UnixStream::connect(&r.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let cmsgs = [ControlMessage::ScmRights(fds)];
        sendmsg::<()>(
            c.as_raw_fd(),
            &[IoSlice::new(&request.encode())],
            &cmsgs,
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let mut reply = [0u8; REPLY_LEN];
        c.read_exact(&mut reply).ok()?;
        Some(Reply::decode(&reply).unwrap().errno)
    };
    let listen = |addr: &str, v6_only: bool| Request {
        op: Op::ListenTcp,
        addr: addr.parse().unwrap(),
        nonblocking: None,
        v6_only,
    };
    let kernel = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = kernel.local_addr().unwrap().port();
    let wildcard = listen(&format!("0.0.0.0:{port}"), false);
    // Not a listening TCP socket: a Unix socket, a TCP socket not listening, another port.
    let (_a, stream) = pair();
    let other = TcpListener::bind("0.0.0.0:0").unwrap();
    let idle = TcpStream::connect(other.local_addr().unwrap()).unwrap();
    for bad in [stream.as_raw_fd(), idle.as_raw_fd(), other.as_raw_fd()] {
        let (_b, sp) = seqpacket_pair();
        assert_eq!(errno(&wildcard, &[sp.as_raw_fd(), bad]), Some(libc::EPROTO));
    }
    // Nor on a specific address.
    let (_c, sp) = seqpacket_pair();
    let specific = listen(&format!("10.99.0.1:{port}"), false);
    assert_eq!(
        errno(&specific, &[sp.as_raw_fd(), kernel.as_raw_fd()]),
        Some(libc::EPROTO)
    );
    // The good one.
    let (app, sp) = seqpacket_pair();
    assert_eq!(errno(&wildcard, &[sp.as_raw_fd(), kernel.as_raw_fd()]), Some(0));
    drop((sp, kernel));
    // Overlapping listeners are refused; an IPv6-only one on the same port is not.
    for (request, want) in [
        (specific, libc::EADDRINUSE),
        (listen(&format!("[::]:{port}"), false), libc::EADDRINUSE),
        (listen(&format!("[::]:{port}"), true), 0),
    ] {
        let (_d, sp) = seqpacket_pair();
        assert_eq!(errno(&request, &[sp.as_raw_fd()]), Some(want), "{:?}", request.addr);
    }
    // A connection to the host's loopback arrives over the application's end, with the
    // kernel's socket, which carries the bytes both ways.
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; ordo_attach::ACCEPTED_LEN];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(app.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty()).unwrap();
    let fd = match msg.cmsgs().unwrap().next() {
        Some(ControlMessageOwned::ScmRights(fds)) => fds[0],
        other => panic!("no descriptor: {other:?}"),
    };
    let accepted = ordo_attach::Accepted::decode(&buf).unwrap();
    assert!(accepted.kernel);
    assert_eq!(accepted.local, format!("127.0.0.1:{port}").parse().unwrap());
    assert_eq!(accepted.remote, client.local_addr().unwrap());
    // SAFETY: the descriptor the message just brought, ours alone.
    let mut conn = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    conn.write_all(b"from the server").unwrap();
    let mut got = [0u8; 15];
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"from the server");
}

/// An unconnected UDP socket: bound at once with a marker; a marked record leaves as one
/// datagram to its header's destination; a record without a header before a connect has
/// nowhere to go, and a marked record that is not a header is malformed: both dropped and
/// counted; after a connect (itself a marked record), a record alone goes to the remote, and
/// after a disconnect nowhere again.
#[test]
fn unconnected_udp_sockets_send_where_each_record_says() {
    use ordo_attach::SendHeader;
    let r = start();
    let bind = |addr: &str| {
        Request {
            op: Op::BindUdp,
            addr: addr.parse().unwrap(),
            nonblocking: None,
            v6_only: false,
        }
        .encode()
    };
    let (_a, sp) = seqpacket_pair();
    assert_eq!(
        ask(&r.socket, &bind("10.99.0.7:53"), Some(sp.as_raw_fd())).map(|r| r.errno),
        Some(libc::EADDRNOTAVAIL)
    );
    let (app, theirs) = seqpacket_pair();
    let reply = ask(&r.socket, &bind("10.99.0.1:5353"), Some(theirs.as_raw_fd())).expect("a reply");
    assert_eq!(reply.errno, 0);
    assert_eq!(reply.local, Some("10.99.0.1:5353".parse().unwrap()));
    let marker = reply.marker.expect("a marker");
    // The same port again is taken; over TCP it is another port.
    let (_b, sp) = seqpacket_pair();
    assert_eq!(
        ask(&r.socket, &bind("10.99.0.1:5353"), Some(sp.as_raw_fd())).map(|r| r.errno),
        Some(libc::EADDRINUSE)
    );
    let (_c, sp) = seqpacket_pair();
    assert_eq!(
        ask(&r.socket, &listen_request("10.99.0.1:5353"), Some(sp.as_raw_fd())).map(|r| r.errno),
        Some(0)
    );
    let mut app = UnixStream::from(app);
    let record = |h: SendHeader, payload: &[u8]| {
        let mut v = h.encode(marker).to_vec();
        v.extend_from_slice(payload);
        v
    };
    app.write_all(b"nowhere").unwrap();
    let mut bad = record(SendHeader::To("10.99.0.2:53".parse().unwrap()), b"");
    bad[ordo_attach::MARKER_LEN] = 9;
    app.write_all(&bad).unwrap();
    app.write_all(&record(SendHeader::To("10.99.0.2:53".parse().unwrap()), b"to 53"))
        .unwrap();
    let p = next_packet(&r, Duration::from_secs(5)).expect("the datagram");
    assert_eq!(&p[12..20], &[10, 99, 0, 1, 10, 99, 0, 2]);
    assert_eq!(u16::from_be_bytes([p[20], p[21]]), 5353);
    assert_eq!(u16::from_be_bytes([p[22], p[23]]), 53);
    assert_eq!(&p[28..], b"to 53");
    app.write_all(&record(SendHeader::Connect("10.99.0.3:99".parse().unwrap()), b""))
        .unwrap();
    app.write_all(b"alone").unwrap();
    let p = next_packet(&r, Duration::from_secs(5)).expect("the datagram to the remote");
    assert_eq!(&p[16..20], &[10, 99, 0, 3]);
    assert_eq!(u16::from_be_bytes([p[22], p[23]]), 99);
    assert_eq!(&p[28..], b"alone");
    // A disconnect, then a record alone: nowhere to go again.
    app.write_all(&record(SendHeader::Disconnect, b"")).unwrap();
    app.write_all(b"alone again").unwrap();
    app.write_all(&record(SendHeader::To("10.99.0.2:53".parse().unwrap()), b"last"))
        .unwrap();
    let p = next_packet(&r, Duration::from_secs(5)).expect("the last datagram");
    assert_eq!(&p[28..], b"last");
    let counter = |name: &str| r.port.counters().into_iter().find(|c| c.name == name).map(|c| c.value);
    assert_eq!(counter("drop_stack_datagram_no_destination"), Some(2));
    assert_eq!(counter("drop_stack_datagram_malformed"), Some(1));
}

/// A UDP server bound to every address brings its kernel socket: what arrives there comes
/// over the pair with its source, and a record marked for the host leaves by it. The second
/// descriptor must be a UDP socket bound to the request's port.
#[test]
fn a_wildcard_udp_socket_relays_the_kernel_s_datagrams_too() {
    use ordo_attach::{SendHeader, Source};
    use std::net::UdpSocket;
    let r = start();
    let kernel = UdpSocket::bind("0.0.0.0:0").unwrap();
    let port = kernel.local_addr().unwrap().port();
    let bind = Request {
        op: Op::BindUdp,
        addr: format!("0.0.0.0:{port}").parse().unwrap(),
        nonblocking: None,
        v6_only: false,
    }
    .encode();
    let errno = |fds: &[i32]| -> Option<Reply> {
        let mut c = UnixStream::connect(&r.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let cmsgs = [ControlMessage::ScmRights(fds)];
        sendmsg::<()>(c.as_raw_fd(), &[IoSlice::new(&bind)], &cmsgs, MsgFlags::empty(), None).unwrap();
        let mut reply = [0u8; REPLY_LEN];
        c.read_exact(&mut reply).ok()?;
        Some(Reply::decode(&reply).unwrap())
    };
    let other = UdpSocket::bind("0.0.0.0:0").unwrap();
    let tcp = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    for bad in [other.as_raw_fd(), tcp.as_raw_fd()] {
        let (_a, sp) = seqpacket_pair();
        assert_eq!(errno(&[sp.as_raw_fd(), bad]).map(|r| r.errno), Some(libc::EPROTO));
    }
    let (app, sp) = seqpacket_pair();
    let reply = errno(&[sp.as_raw_fd(), kernel.as_raw_fd()]).expect("a reply");
    assert_eq!(reply.errno, 0);
    let marker = reply.marker.expect("a marker");
    drop((sp, kernel));
    let mut app = UnixStream::from(app);
    app.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    client.send_to(b"from the host", ("127.0.0.1", port)).unwrap();
    let mut record = [0u8; 100];
    let n = app.read(&mut record).unwrap();
    assert_eq!(Source::decode(&record[..n]), Ok(Source(client.local_addr().unwrap())));
    assert_eq!(&record[ordo_attach::SOURCE_LEN..n], b"from the host");
    let mut answer = SendHeader::ToHost(client.local_addr().unwrap()).encode(marker).to_vec();
    answer.extend_from_slice(b"back");
    app.write_all(&answer).unwrap();
    let mut got = [0u8; 10];
    let (n, from) = client.recv_from(&mut got).unwrap();
    assert_eq!((&got[..n], from.port()), (&b"back"[..], port));
}

/// Sends a request to connect to 10.99.0.2:80 with `app` (the program's end), without
/// waiting for the answer; the connection it comes on.
fn send_connect(socket: &Path, app: &OwnedFd) -> UnixStream {
    let c = UnixStream::connect(socket).unwrap();
    let fds = [app.as_raw_fd()];
    sendmsg::<()>(
        c.as_raw_fd(),
        &[IoSlice::new(&connect_request("10.99.0.2:80"))],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    c
}

/// The window scale a SYN offers (RFC 7323's option), if any.
fn window_scale(tcp: &[u8]) -> Option<u8> {
    let options = &tcp[20..usize::from(tcp[12] >> 4) * 4];
    let mut i = 0;
    while i < options.len() {
        match options[i] {
            0 => return None,
            1 => i += 1,
            3 => return options.get(i + 2).copied(),
            _ => i += usize::from(*options.get(i + 1)?).max(2),
        }
    }
    None
}

#[test]
fn only_so_many_sockets_get_the_large_receive_buffer() {
    use ordo::inner::stack::service::LARGE_RECEIVE_BUFFERS;
    let r = start();
    let count = LARGE_RECEIVE_BUFFERS + 4;
    // Connects nobody answers, each kept open (its program's end and its request).
    let mut held = Vec::new();
    let mut scales = std::collections::HashMap::new();
    for _ in 0..count {
        let (mine, theirs) = pair();
        let c = send_connect(&r.socket, &theirs);
        held.push((mine, c));
        // One SYN per connect, told apart by its port (a retransmission repeats one).
        while scales.len() < held.len() {
            let syn = next_packet(&r, Duration::from_secs(5)).expect("a SYN towards the plane");
            let tcp = &syn[usize::from(syn[0] & 0xf) * 4..];
            let port = u16::from_be_bytes([tcp[0], tcp[1]]);
            scales.entry(port).or_insert(window_scale(tcp).expect("a window scale"));
        }
    }
    let large = *scales.values().max().unwrap();
    let with_large = scales.values().filter(|&&s| s == large).count();
    assert_eq!(with_large, LARGE_RECEIVE_BUFFERS, "window scales offered: {scales:?}");
    assert!(scales.values().all(|&s| s == large || s + 3 == large), "{scales:?}");
    // Programs that give up their connects give the large buffers back: a new connect has
    // one again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_mine, theirs) = pair();
        let _c = send_connect(&r.socket, &theirs);
        let syn = loop {
            let p = next_packet(&r, Duration::from_secs(5)).expect("a SYN towards the plane");
            let tcp = &p[usize::from(p[0] & 0xf) * 4..];
            if tcp[13] & 0x12 == 0x02 && !scales.contains_key(&u16::from_be_bytes([tcp[0], tcp[1]])) {
                break p;
            }
        };
        let tcp = &syn[usize::from(syn[0] & 0xf) * 4..];
        if window_scale(tcp) == Some(large) {
            break;
        }
        assert!(Instant::now() < deadline, "no large buffer came back");
        scales.insert(u16::from_be_bytes([tcp[0], tcp[1]]), 0);
    }
}
