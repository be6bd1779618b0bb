//! Ordo's XDP program on a real interface (a veth pair between two network namespaces this
//! test makes): attached with a BPF link, it lets the kernel's traffic through (ping), keeps
//! any other program off the interface, and leaves with its process even when that process
//! is killed with SIGKILL. Needs root, as the XDP path does.

use ordo::outer::xdp::bpf::{Link, Map, Program, XdpMode};
use ordo::outer::xdp::filter::{Filter, Verdict};
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

const NS_A: &str = "ordo-xdp-test-a";
const NS_B: &str = "ordo-xdp-test-b";

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The two namespaces, joined by veth-a (in A, 192.0.2.1) and veth-b (in B, 192.0.2.2);
/// removed on drop.
struct Namespaces;

impl Namespaces {
    fn new() -> Namespaces {
        for ns in [NS_A, NS_B] {
            // Left over from a run that was killed, if any.
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
            ip(&["netns", "add", ns]);
        }
        ip(&[
            "-n", NS_A, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns", NS_B,
        ]);
        ip(&["-n", NS_A, "addr", "add", "192.0.2.1/24", "dev", "veth-a"]);
        ip(&["-n", NS_B, "addr", "add", "192.0.2.2/24", "dev", "veth-b"]);
        ip(&["-n", NS_A, "link", "set", "veth-a", "up"]);
        ip(&["-n", NS_B, "link", "set", "veth-b", "up"]);
        Namespaces
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in [NS_A, NS_B] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
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

/// Loads Ordo's program for port 51820 on 192.0.2.1, with its maps.
fn load() -> (Program, Map, Map) {
    let sockets = Map::sockets("xsks", 1).unwrap();
    let counters = Map::counters("verdicts", Verdict::ALL.len() as u32).unwrap();
    let filter = Filter {
        port: 51820,
        addresses: vec!["192.0.2.1".parse().unwrap()],
    };
    let program = Program::load_xdp("ordo", &filter.program(sockets.as_raw_fd(), counters.as_raw_fd()))
        .unwrap_or_else(|e| panic!("{e}"));
    (program, sockets, counters)
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
    let (program, _sockets, _counters) = load();
    let _link = Link::xdp(&program, ifindex("veth-a"), XdpMode::Any).expect("attached");
    println!("\nORDO-XDP-ATTACHED");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn xdp_program_leaves_with_its_process() {
    let _ns = Namespaces::new();
    let me = std::env::current_exe().unwrap();
    let mut holder = Command::new("ip")
        .args(["netns", "exec", NS_A])
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
    assert!(xdp_attached(NS_A, "veth-a"), "ip link shows the program");
    // The kernel's own traffic crosses the program: ARP and ICMP both ways.
    assert!(ping(NS_B, "192.0.2.1"), "B reaches A through the program");
    assert!(ping(NS_A, "192.0.2.2"), "A reaches B");
    // Another program cannot take the interface while Ordo's is on it.
    let err = ip_netns_attach_second(NS_A);
    assert!(
        err.contains("Device or resource busy") || err.contains("EBUSY"),
        "refused: {err}"
    );

    // SIGKILL: no clean-up runs, and the link's last descriptor closes with the process.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let gone = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        !xdp_attached(NS_A, "veth-a")
    });
    assert!(gone, "the program left with its process");
    assert!(ping(NS_B, "192.0.2.1"), "and the interface works without it");
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
    let (program, _sockets, _counters) = load();
    match Link::xdp(&program, ifindex("veth-a"), XdpMode::Any) {
        Ok(_) => println!("attached over the other program"),
        Err(e) => println!("refused: {e}"),
    }
}
