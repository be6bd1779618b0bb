//! The XDP path on a real interface, a veth pair between two network namespaces each test
//! makes: attached with a BPF link, the program hands the socket Ordo's datagrams and lets
//! the kernel's traffic through (ping, other ports), keeps any other program off the
//! interface, and leaves with its process even when that process is killed with SIGKILL;
//! frames Ordo writes reach the kernel across the link; and the kernel tells Ordo how a
//! datagram leaves. Needs root, as the XDP path does.

use ordo::outer::xdp::bpf::{Link, Map, Program, XdpMode};
use ordo::outer::xdp::filter::{self, Filter, Verdict};
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces, joined by veth-a (in `a`, 192.0.2.1) and veth-b (in `b`, 192.0.2.2);
/// removed on drop. Each test has its own, named after it, as tests run at once.
struct Namespaces {
    a: String,
    b: String,
}

impl Namespaces {
    fn new(test: &str) -> Namespaces {
        let ns = Namespaces {
            a: format!("ordo-xdp-{test}-a"),
            b: format!("ordo-xdp-{test}-b"),
        };
        let (a, b) = (ns.a.as_str(), ns.b.as_str());
        for n in [a, b] {
            // Left over from a run that was killed, if any.
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(Stdio::null())
                .status();
            ip(&["netns", "add", n]);
        }
        ip(&[
            "-n", a, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns", b,
        ]);
        ip(&["-n", a, "addr", "add", "192.0.2.1/24", "dev", "veth-a"]);
        ip(&["-n", b, "addr", "add", "192.0.2.2/24", "dev", "veth-b"]);
        ip(&["-n", a, "link", "set", "veth-a", "up"]);
        ip(&["-n", b, "link", "set", "veth-b", "up"]);
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn xdp_attached(ns: &str, dev: &str) -> bool {
    ip(&["-n", ns, "link", "show", "dev", dev]).contains("prog/xdp")
}

fn ping(ns: &str, to: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c", "3", "-i", "0.2", "-W", "2", to])
        .stdout(Stdio::null())
        .status()
        .expect("ping runs")
        .success()
}

/// Ordo's program and its maps, as `load` makes them.
struct Loaded {
    program: Program,
    sockets: Map,
    counters: Map,
    _settings: Map,
}

/// Loads Ordo's program for port 51820 on 192.0.2.1, with its maps.
fn load() -> Loaded {
    let sockets = Map::sockets("xsks", 1).unwrap();
    let counters = Map::counters("verdicts", Verdict::ALL.len() as u32).unwrap();
    let settings = Map::values("settings", filter::SETTINGS).unwrap();
    settings.set_u32(filter::PORT_KEY, filter::port_value(51820)).unwrap();
    let filter = Filter {
        port: 51820,
        addresses: vec!["192.0.2.1".parse().unwrap()],
    };
    let insns = filter.program(sockets.as_raw_fd(), counters.as_raw_fd(), settings.as_raw_fd());
    let program = Program::load_xdp("ordo", &insns).unwrap_or_else(|e| panic!("{e}"));
    Loaded {
        program,
        sockets,
        counters,
        _settings: settings,
    }
}

fn ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name; the call only reads it.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(i, 0, "{name} exists");
    i
}

/// Run by the test below inside namespace A, as a process of its own: attaches the program
/// to veth-a, says so, and waits to be killed.
#[test]
#[ignore = "a helper process of xdp_program_leaves_with_its_process"]
fn xdp_holder() {
    let Loaded { program, .. } = load();
    let _link = Link::xdp(&program, ifindex("veth-a"), XdpMode::Any).expect("attached");
    println!("\nORDO-XDP-ATTACHED");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn xdp_program_leaves_with_its_process() {
    let ns = Namespaces::new("leave");
    let (ns_a, ns_b) = (ns.a.as_str(), ns.b.as_str());
    let me = std::env::current_exe().unwrap();
    let mut holder = Command::new("ip")
        .args(["netns", "exec", ns_a])
        .arg(&me)
        .args([
            "--ignored",
            "--exact",
            "xdp_holder",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.trim() == "ORDO-XDP-ATTACHED")),
        "the holder attached the program"
    );
    assert!(xdp_attached(ns_a, "veth-a"), "ip link shows the program");
    // The kernel's own traffic crosses the program: ARP and ICMP both ways.
    assert!(ping(ns_b, "192.0.2.1"), "B reaches A through the program");
    assert!(ping(ns_a, "192.0.2.2"), "A reaches B");
    // Another program cannot take the interface while Ordo's is on it.
    let err = ip_netns_attach_second(ns_a);
    assert!(
        err.contains("Device or resource busy") || err.contains("EBUSY"),
        "refused: {err}"
    );

    // SIGKILL: no clean-up runs, and the link's last descriptor closes with the process.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let gone = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        !xdp_attached(ns_a, "veth-a")
    });
    assert!(gone, "the program left with its process");
    assert!(ping(ns_b, "192.0.2.1"), "and the interface works without it");
}

/// Tries to attach a second program of ours to veth-a from another process inside `ns`;
/// returns its error.
fn ip_netns_attach_second(ns: &str) -> String {
    let me = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(&me)
        .args([
            "--ignored",
            "--exact",
            "xdp_second",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "a helper process of xdp_program_leaves_with_its_process"]
fn xdp_second() {
    let Loaded { program, .. } = load();
    match Link::xdp(&program, ifindex("veth-a"), XdpMode::Any) {
        Ok(_) => println!("attached over the other program"),
        Err(e) => println!("refused: {e}"),
    }
}

/// Moves this thread into namespace `ns` (network namespaces are per thread): the sockets
/// it makes and the interfaces it names are that namespace's from then on.
fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: setns on a namespace descriptor we hold, for this thread only.
    assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns");
}

/// Sends each (port, payload) from namespace `ns` to 192.0.2.1 with python3's UDP socket.
fn send_from(ns: &str, datagrams: &[(u16, &str)]) {
    let script = datagrams
        .iter()
        .map(|(port, payload)| format!("s.sendto(b'{payload}', ('192.0.2.1', {port}))"))
        .collect::<Vec<_>>()
        .join("\n");
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c"])
        .arg(format!(
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n{script}"
        ))
        .status()
        .unwrap()
        .success();
    assert!(ok, "python3 sent");
}

/// An AF_XDP socket in copy mode on queue 0 of interface `index`, with a UMEM of 64 frames.
/// Declared in drop order: the socket and its rings go before the UMEM they use.
struct Xsk {
    socket: xdp::socket::XdpSocket,
    rings: xdp::WakableRings,
    umem: xdp::Umem,
}

impl Xsk {
    fn on(index: u32) -> Xsk {
        let cfg = xdp::umem::UmemCfgBuilder {
            frame_count: 64,
            ..Default::default()
        };
        let umem = xdp::Umem::map(cfg.build().unwrap()).unwrap();
        let mut builder = xdp::socket::XdpSocketBuilder::new().unwrap();
        let (rings, mut flags) = builder
            .build_wakable_rings(&umem, xdp::RingConfigBuilder::default().build().unwrap())
            .unwrap();
        flags.force_copy();
        let socket = builder.bind(xdp::nic::NicIndex::new(index), 0, flags).unwrap();
        Xsk { socket, rings, umem }
    }
}

/// An AF_XDP socket on veth-a's queue 0 in the program's socket map: datagrams to Ordo's
/// port and address arrive there, byte for byte, and nowhere else; a datagram to another
/// port reaches the kernel's socket, and ping works, through the same program.
#[test]
fn ordos_datagrams_reach_its_xdp_socket_and_the_rest_the_kernel() {
    use xdp::slab::{HeapSlab, Slab};
    let ns = Namespaces::new("rx");
    enter(&ns.a);
    let Loaded {
        program,
        sockets,
        counters,
        ..
    } = load();
    let index = ifindex("veth-a");
    // The kernel keeps the port with a socket of its own, as the XDP port will.
    let kernel = std::net::UdpSocket::bind("192.0.2.1:51820").unwrap();
    kernel.set_nonblocking(true).unwrap();
    let elsewhere = std::net::UdpSocket::bind("192.0.2.1:5353").unwrap();
    elsewhere
        .set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .unwrap();

    let mut xsk = Xsk::on(index);
    // SAFETY: the UMEM outlives the socket and its rings (Xsk's drop order).
    unsafe { xsk.rings.fill_ring.enqueue(&mut xsk.umem, 32, true).unwrap() };
    sockets.set_socket(0, xsk.socket.as_raw_fd()).unwrap();
    let _link = Link::xdp(&program, index, XdpMode::Native).expect("veth takes native XDP");

    send_from(
        &ns.b,
        &[(51820, "one"), (5353, "elsewhere"), (51820, "two"), (51820, "three")],
    );

    let mut got = Vec::new();
    let mut slab = HeapSlab::with_capacity(16);
    let rx = xsk.rings.rx_ring.as_mut().unwrap();
    for _ in 0..30 {
        if got.len() == 3 {
            break;
        }
        let _ = xsk
            .socket
            .poll_read(xdp::socket::PollTimeout::new(Some(std::time::Duration::from_millis(
                100,
            ))));
        // SAFETY: the packets are freed back to the UMEM before it goes.
        unsafe { rx.recv(&xsk.umem, &mut slab) };
        while let Some(p) = slab.pop_back() {
            // Ethernet 14, IPv4 20, UDP 8: the payload follows.
            got.push(String::from_utf8_lossy(&p[42..]).into_owned());
            xsk.umem.free_packet(p);
        }
    }
    got.sort();
    assert_eq!(got, ["one", "three", "two"], "Ordo's datagrams, byte for byte");
    let mut buf = [0u8; 64];
    let n = elsewhere
        .recv(&mut buf)
        .expect("the other port's datagram reached the kernel");
    assert_eq!(&buf[..n], b"elsewhere");
    assert!(
        kernel.recv(&mut buf).is_err(),
        "the kernel's socket on the port got none of them"
    );
    assert_eq!(counters.sum(Verdict::ToSocket as u32).unwrap(), 3);
    assert!(counters.sum(Verdict::NotOurs as u32).unwrap() >= 1);
    assert!(ping(&ns.b, "192.0.2.1"), "ping crosses the program");
    assert!(
        counters.sum(Verdict::NotIp as u32).unwrap() >= 1,
        "ARP passed and counted"
    );
}

/// The hardware address of `dev` in namespace `ns`.
fn mac(ns: &str, dev: &str) -> [u8; 6] {
    let out = ip(&["-n", ns, "link", "show", "dev", dev]);
    let hex = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("an Ethernet address");
    let mut m = [0u8; 6];
    for (b, h) in m.iter_mut().zip(hex.split(':')) {
        *b = u8::from_str_radix(h, 16).unwrap();
    }
    m
}

/// Frames Ordo builds (ordo::outer::xdp::frame) and sends through an AF_XDP socket on
/// veth-a reach a kernel UDP socket in the other namespace: the kernel there checks the
/// headers and the checksums and reports our address and port as the source.
#[test]
fn frames_it_writes_reach_a_kernel_socket_across_the_link() {
    use ordo::outer::xdp::frame::{header_len, write_headers, Path};
    use xdp::slab::{HeapSlab, Slab};
    let ns = Namespaces::new("tx");
    let ns_b = ns.b.clone();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || {
        enter(&ns_b);
        let s = std::net::UdpSocket::bind("192.0.2.2:40000").unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(3))).unwrap();
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            got.push((buf[..n].to_vec(), from));
            if got.len() == 3 {
                break;
            }
        }
        got
    });
    ready.recv().unwrap();
    let path = Path {
        from_mac: mac(&ns.a, "veth-a"),
        to_mac: mac(&ns.b, "veth-b"),
        from: "192.0.2.1:51820".parse().unwrap(),
        to: "192.0.2.2:40000".parse().unwrap(),
    };
    enter(&ns.a);
    let index = ifindex("veth-a");
    let mut xsk = Xsk::on(index);

    let payloads: Vec<Vec<u8>> = (1..=3u8).map(|i| vec![i; 100 * usize::from(i) + 1]).collect();
    let mut slab = HeapSlab::with_capacity(4);
    for p in &payloads {
        // SAFETY: the packet goes back to the UMEM (through the completion ring) before the
        // UMEM is dropped.
        let mut packet = unsafe { xsk.umem.alloc() }.unwrap();
        let mut frame = vec![0u8; header_len(&path) + p.len()];
        frame[header_len(&path)..].copy_from_slice(p);
        assert!(write_headers(&path, &mut frame));
        packet.append(&frame).unwrap();
        assert!(slab.push_front(packet).is_none());
    }
    let tx = xsk.rings.tx_ring.as_mut().unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { tx.send(&mut slab, true) }.unwrap(), 3);

    let got = receiver.join().unwrap();
    assert_eq!(got.len(), 3, "every datagram arrived");
    for ((data, from), sent) in got.iter().zip(&payloads) {
        assert_eq!(data, sent, "byte for byte, in order");
        assert_eq!(*from, path.from, "from our address and port");
    }
    let mut done = 0;
    for _ in 0..100 {
        done += xsk.rings.completion_ring.dequeue(&mut xsk.umem, 64);
        if done == 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(done, 3, "the kernel gave every frame back");
}

/// The route, source and hardware addresses Ordo writes come from the kernel: a neighbour
/// not yet resolved has none (its datagrams go through the kernel), one that answered has
/// its own, a destination behind a gateway gets the gateway's, and one with no route none.
#[test]
fn the_kernel_says_how_a_datagram_leaves() {
    use ordo::outer::xdp::route::Routes;
    let ns = Namespaces::new("route");
    ip(&["-n", &ns.a, "addr", "add", "fd00::1/64", "dev", "veth-a", "nodad"]);
    ip(&["-n", &ns.b, "addr", "add", "fd00::2/64", "dev", "veth-b", "nodad"]);
    ip(&["-n", &ns.a, "route", "add", "198.51.100.0/24", "via", "192.0.2.2"]);
    let (a_mac, b_mac) = (mac(&ns.a, "veth-a"), mac(&ns.b, "veth-b"));
    enter(&ns.a);
    let routes = Routes::open().unwrap();
    let index = ifindex("veth-a");

    let hop = routes.hop("192.0.2.2".parse().unwrap()).unwrap().expect("a route");
    assert_eq!(hop.ifindex, index);
    assert_eq!(hop.source, "192.0.2.1".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(hop.next_hop, "192.0.2.2".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(hop.from_mac, a_mac);
    assert_eq!(hop.mtu, 1500, "veth's");
    assert_eq!(hop.to_mac, None, "nothing has asked for B's address yet");

    assert!(ping(&ns.a, "192.0.2.2"));
    let hop = routes.hop("192.0.2.2".parse().unwrap()).unwrap().unwrap();
    assert_eq!(hop.to_mac, Some(b_mac), "resolved by the kernel");
    let hop = routes.hop("198.51.100.7".parse().unwrap()).unwrap().unwrap();
    assert_eq!(
        hop.next_hop,
        "192.0.2.2".parse::<std::net::IpAddr>().unwrap(),
        "the gateway"
    );
    assert_eq!(hop.to_mac, Some(b_mac));
    assert_eq!(routes.hop("203.0.113.1".parse().unwrap()).unwrap(), None, "no route");

    let ok = Command::new("ip")
        .args([
            "netns", "exec", &ns.a, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", "fd00::2",
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "ping over IPv6");
    let hop = routes.hop("fd00::2".parse().unwrap()).unwrap().unwrap();
    assert_eq!(hop.source, "fd00::1".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(hop.to_mac, Some(b_mac));
}

/// Waits up to 3 s for `paths` to give `want` for `to`.
fn settles(
    paths: &ordo::outer::xdp::paths::Paths,
    to: &str,
    want: impl Fn(Option<ordo::outer::xdp::route::Hop>) -> bool,
) -> bool {
    let to = to.parse().unwrap();
    (0..150).any(|_| {
        let ok = want(paths.get(to));
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        ok
    })
}

/// The answers kept for the senders follow the kernel: a next hop resolved after the first
/// ask is found by the retry, a neighbour's new hardware address and a new or removed route
/// are picked up from the kernel's announcements.
#[test]
fn the_answers_follow_the_kernel() {
    use ordo::outer::xdp::paths::Paths;
    let ns = Namespaces::new("paths");
    let b_mac = mac(&ns.b, "veth-b");
    enter(&ns.a);
    let paths = Paths::start().unwrap();
    assert_eq!(paths.get("192.0.2.2".parse().unwrap()), None, "not asked before");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        paths.get("192.0.2.2".parse().unwrap()),
        None,
        "asked, but B is not resolved"
    );
    assert!(ping(&ns.a, "192.0.2.2"));
    assert!(
        settles(&paths, "192.0.2.2", |h| h.and_then(|h| h.to_mac) == Some(b_mac)),
        "resolved"
    );

    let moved = [0x02, 0, 0, 0, 0, 0x99];
    ip(&[
        "-n",
        &ns.a,
        "neigh",
        "replace",
        "192.0.2.2",
        "lladdr",
        "02:00:00:00:00:99",
        "dev",
        "veth-a",
    ]);
    assert!(
        settles(&paths, "192.0.2.2", |h| h.and_then(|h| h.to_mac) == Some(moved)),
        "a new address"
    );

    assert_eq!(paths.get("198.51.100.7".parse().unwrap()), None);
    ip(&["-n", &ns.a, "route", "add", "198.51.100.0/24", "via", "192.0.2.2"]);
    assert!(settles(&paths, "198.51.100.7", |h| h.is_some()), "a new route");
    ip(&["-n", &ns.a, "route", "del", "198.51.100.0/24"]);
    assert!(settles(&paths, "198.51.100.7", |h| h.is_none()), "the route gone");
}

/// The program goes on natively where the driver can (veth), in generic mode where it
/// cannot (loopback), not over another program (Busy), and not at all without the
/// privileges, each refusal with a reason the caller can print before carrying on over UDP.
#[test]
fn attach_chooses_the_mode_and_says_why_not() {
    use ordo::outer::xdp::attach::{attach, zero_copy, Mode, Unavailable};
    let ns = Namespaces::new("attach");
    enter(&ns.a);
    let filter = Filter {
        port: 51820,
        addresses: vec!["192.0.2.1".parse().unwrap()],
    };
    let veth = attach(ifindex("veth-a"), &filter, 2, None).unwrap();
    assert_eq!(veth.mode, Mode::Native);
    let lo = attach(ifindex("lo"), &filter, 2, None).unwrap();
    assert_eq!(lo.mode, Mode::Generic);
    assert!(ip(&["-n", &ns.a, "link", "show", "dev", "lo"]).contains("xdpgeneric"));
    match attach(ifindex("veth-a"), &filter, 2, None) {
        Err(e @ Unavailable::Busy) => assert!(e.to_string().contains("another XDP program")),
        other => panic!("a second program on veth-a: {:?}", other.map(|a| a.mode)),
    }
    // veth has no zero-copy: its sockets copy.
    let xsk = Xsk::on(ifindex("veth-a"));
    assert!(!zero_copy(xsk.socket.as_raw_fd()).unwrap());
    drop((veth, lo));

    // Capabilities are per thread: this one gives up those XDP needs.
    let index = ifindex("veth-a");
    let refused = std::thread::scope(|s| {
        s.spawn(|| {
            for c in [
                caps::Capability::CAP_BPF,
                caps::Capability::CAP_SYS_ADMIN,
                caps::Capability::CAP_NET_ADMIN,
            ] {
                caps::drop(None, caps::CapSet::Effective, c).unwrap();
            }
            attach(index, &filter, 2, None).map(|a| a.mode)
        })
        .join()
        .unwrap()
    });
    match refused {
        Err(e @ Unavailable::NotPermitted(_)) => assert!(e.to_string().contains("CAP_BPF"), "{e}"),
        other => panic!("without privileges: {other:?}"),
    }
}

/// An XskQueue (outer/xdp/queue.rs) as Ordo binds it on veth (copy mode, no need_wakeup):
/// see `receives_and_answers`.
#[test]
fn an_xsk_queue_receives_and_answers() {
    use ordo::outer::xdp::queue::Binding;
    receives_and_answers("queue", Binding::COPY);
}

/// The same, bound with need_wakeup as on a zero-copy driver: the flags Ordo maps are the
/// kernel's (it asks for a TX wake-up from the bind on, and never for a fill wake-up in
/// copy mode), and the wake-ups they lead to carry the traffic.
#[test]
fn an_xsk_queue_with_need_wakeup_reads_the_kernels_flags() {
    use ordo::outer::xdp::queue::Binding;
    receives_and_answers(
        "wakeup",
        Binding {
            zero_copy: false,
            need_wakeup: true,
        },
    );
}

/// With Ordo's program, a peer's datagrams arrive as Datagrams with their source, and
/// answers sent to that source on the path the kernel gives reach the peer's socket; a
/// program in the other namespace checks them.
fn receives_and_answers(test: &str, binding: ordo::outer::xdp::queue::Binding) {
    use ordo::outer::xdp::attach::attach;
    use ordo::outer::xdp::frame::Path;
    use ordo::outer::xdp::queue::{Wakeups, XskQueue};
    use ordo::outer::xdp::route::Routes;
    let ns = Namespaces::new(test);
    enter(&ns.a);
    let filter = Filter {
        port: 51820,
        addresses: vec!["192.0.2.1".parse().unwrap()],
    };
    let index = ifindex("veth-a");
    let attached = attach(index, &filter, 1, None).unwrap();
    let mut q = XskQueue::bind_as(index, 0, binding).unwrap();
    assert!(!q.zero_copy(), "veth copies");
    let asked = binding.need_wakeup.then_some(Wakeups { tx: true, fill: false });
    assert_eq!(q.wakeups(), asked);
    attached.sockets.set_socket(0, q.as_raw_fd()).unwrap();
    // The peer: three datagrams, then the answers, printed.
    let peer = Command::new("ip")
        .args(["netns", "exec", &ns.b, "python3", "-c"])
        .arg(
            "import socket\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.bind(('192.0.2.2', 40000))\n\
             s.settimeout(5)\n\
             for m in (b'one', b'two', b'three'):\n    s.sendto(m, ('192.0.2.1', 51820))\n\
             for _ in range(3):\n    d, a = s.recvfrom(100)\n    print(d.decode(), a[0], a[1])\n",
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..50 {
        if got.len() == 3 {
            break;
        }
        let mut pfd = libc::pollfd {
            fd: q.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, of the count passed.
        unsafe { libc::poll(&mut pfd, 1, 100) };
        assert_eq!(q.recv(&mut got), 0, "nothing malformed");
    }
    let sources: Vec<_> = got.iter().map(|d| d.src).collect();
    assert_eq!(sources, vec!["192.0.2.2:40000".parse().unwrap(); 3]);
    let hop = Routes::open().unwrap().hop(got[0].src.ip()).unwrap().unwrap();
    let path = Path {
        from_mac: hop.from_mac,
        to_mac: hop.to_mac.expect("the peer's ARP taught the kernel its address"),
        from: "192.0.2.1:51820".parse().unwrap(),
        to: got[0].src,
    };
    // The kernel dropped nothing it was given for this socket.
    let stats = q.statistics().unwrap();
    assert_eq!((stats.rx_dropped, stats.rx_ring_full), (0, 0), "{stats:?}");
    let answers: Vec<Vec<u8>> = got.iter().map(|d| d.data.to_ascii_uppercase()).collect();
    // Answered from another thread: the queue moves between threads (the port keeps it
    // behind a mutex, used by whichever thread sends).
    let sender = std::thread::spawn(move || {
        let refs: Vec<&[u8]> = answers.iter().map(|a| a.as_slice()).collect();
        q.send(&path, &refs)
    });
    assert_eq!(sender.join().unwrap(), 3);
    let out = peer.wait_with_output().unwrap();
    assert!(out.status.success(), "the peer got its answers");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ONE 192.0.2.1 51820\nTWO 192.0.2.1 51820\nTHREE 192.0.2.1 51820\n"
    );
}
