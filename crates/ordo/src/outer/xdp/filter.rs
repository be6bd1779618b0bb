//! The XDP program on the outer interface: it hands Ordo's AF_XDP sockets exactly the UDP
//! datagrams addressed to Ordo's listen port on one of the interface's own addresses, and
//! passes every other frame to the kernel untouched (ARP, neighbour discovery, other
//! protocols and ports, IPv4 with options, IPv6 with extension headers, fragments, VLAN
//! tags, anything too short to read). A datagram of Ordo's with no socket to take it is
//! passed too, to the kernel UDP socket that keeps the port. The program drops nothing.
//!
//! Each frame's verdict is counted in a per-CPU array ([`Verdict`]), read by
//! [`super::bpf::Map::sum`].

use super::insn::{Asm, Cmp, Label, Size, R0, R1, R10, R2, R3, R4, R5, R6, R7, R8, R9};
use std::net::IpAddr;

/// What the program did with a frame, and the index of its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Verdict {
    /// A datagram of Ordo's, redirected to its socket.
    ToSocket = 0,
    /// A datagram of Ordo's that no socket takes at its queue: passed to the kernel.
    NoSocket,
    /// Not IPv4 or IPv6 (ARP, a VLAN tag, ...).
    NotIp,
    /// IPv4 with options.
    IpOptions,
    /// An IPv4 fragment, which the kernel reassembles.
    Fragment,
    /// Not UDP, or IPv6 with extension headers.
    NotUdp,
    /// UDP for another address or port.
    NotOurs,
    /// Shorter than the headers it announces.
    Truncated,
    /// A datagram of Ordo's longer than an AF_XDP frame holds ([`MAX_DATAGRAM`]): a jumbo
    /// frame, or a peer's UDP GSO batch that generic mode hands over unsplit. The kernel
    /// socket takes it (the kernel splits a batch into its datagrams).
    TooLong,
}

impl Verdict {
    pub const ALL: [Verdict; 9] = [
        Verdict::ToSocket,
        Verdict::NoSocket,
        Verdict::NotIp,
        Verdict::IpOptions,
        Verdict::Fragment,
        Verdict::NotUdp,
        Verdict::NotOurs,
        Verdict::Truncated,
        Verdict::TooLong,
    ];

    /// The counter's name, as `ordo show` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::ToSocket => "xdp_to_socket",
            Verdict::NoSocket => "xdp_passed_no_socket",
            Verdict::NotIp => "xdp_passed_not_ip",
            Verdict::IpOptions => "xdp_passed_ip_options",
            Verdict::Fragment => "xdp_passed_fragment",
            Verdict::NotUdp => "xdp_passed_not_udp",
            Verdict::NotOurs => "xdp_passed_not_ours",
            Verdict::Truncated => "xdp_passed_truncated",
            Verdict::TooLong => "xdp_passed_too_long",
        }
    }
}

/// `enum xdp_action`.
pub const XDP_PASS: u32 = 2;
pub const XDP_REDIRECT: u32 = 4;

/// Kernel helpers (`enum bpf_func_id`).
const MAP_LOOKUP_ELEM: i32 = 1;
const REDIRECT_MAP: i32 = 51;

/// `struct xdp_md`: offsets of its fields.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;

/// Frame offsets: Ethernet, then IPv4 (20 bytes without options) or IPv6 (40), then UDP.
const ETH_LEN: i32 = 14;
const ETH_TYPE: i16 = 12;
const V4_END: i32 = ETH_LEN + 20;
const V6_END: i32 = ETH_LEN + 40;
const UDP_LEN: i32 = 8;
/// The longest UDP datagram (header included) redirected: its frame well inside a UMEM
/// frame (4 KB less the kernel's headroom, see `super::queue`), above any Ethernet MTU's
/// but jumbo ones.
pub const MAX_DATAGRAM: i32 = 3000;

/// Which datagrams are Ordo's: its listen port on these addresses. The addresses are
/// written into the program; the port is read from the settings map at [`PORT_KEY`] (see
/// [`port_value`]), so that a new listen port takes effect without loading a program,
/// which needs privileges the running daemon no longer has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub port: u16,
    pub addresses: Vec<IpAddr>,
}

/// The settings map's entries.
pub const PORT_KEY: u32 = 0;
pub const SETTINGS: u32 = 1;

/// The listen port as the settings map holds it: as the program reads the UDP header.
pub fn port_value(port: u16) -> u32 {
    wire16(port)
}

/// A 16-bit field in network order as a little-endian load reads it.
fn wire16(v: u16) -> u32 {
    u32::from(v.to_be().to_ne_bytes()[0]) | u32::from(v.to_be().to_ne_bytes()[1]) << 8
}

impl Filter {
    /// The program, with the socket, counters and settings maps named by descriptor: each
    /// datagram of Ordo's goes to the socket at its receive queue's index in `sockets`.
    pub fn program(&self, sockets: i32, counters: i32, settings: i32) -> Vec<super::insn::Insn> {
        let mut a = Asm::new();
        let [ipv4, ipv6, ours, pass, count, out, truncated, sized, too_long] = [(); 9].map(|_| a.label());
        let verdict = |a: &mut Asm, v: Verdict, pass: Label| {
            a.mov_imm(R7, v as i32);
            a.jump(pass);
        };
        // r6: the context; r2, r3: the frame's start and end; r7: the verdict; r8: the action
        // (before it, the UDP length); r9: the destination port.
        a.mov(R6, R1);
        a.load(Size::U32, R2, R6, MD_DATA);
        a.load(Size::U32, R3, R6, MD_DATA_END);
        // Each read is preceded by a check that the frame is that long (the verifier
        // insists): r4 = start + length, beyond the end: truncated.
        let need = |a: &mut Asm, len: i32| {
            a.mov(R4, R2);
            a.add_imm(R4, len);
            a.jump_reg(Cmp::Gt, R4, R3, truncated);
        };
        // The UDP header after an IP header that ends at `l3_end`: to Ordo's port (the
        // settings map's) goes on. The call takes r1-r5; `ours` needs only r6.
        let to_port = |a: &mut Asm, l3_end: i32| {
            need(a, l3_end + UDP_LEN);
            a.load(Size::U16, R9, R2, (l3_end + 2) as i16);
            a.load(Size::U16, R8, R2, (l3_end + 4) as i16);
            a.mov_imm(R1, PORT_KEY as i32);
            a.store(Size::U32, R10, -8, R1);
            a.mov(R2, R10);
            a.add_imm(R2, -8);
            a.load_map(R1, settings);
            a.call(MAP_LOOKUP_ELEM);
            let unset = a.label();
            a.jump_imm(Cmp::Eq, R0, 0, unset);
            a.load(Size::U32, R1, R0, 0);
            a.jump_reg(Cmp::Eq, R9, R1, sized);
            a.place(unset);
        };
        need(&mut a, ETH_LEN);
        a.load(Size::U16, R5, R2, ETH_TYPE);
        a.jump32_imm(Cmp::Eq, R5, wire16(0x0800), ipv4);
        a.jump32_imm(Cmp::Eq, R5, wire16(0x86dd), ipv6);
        verdict(&mut a, Verdict::NotIp, pass);

        a.place(ipv4);
        need(&mut a, V4_END);
        a.load(Size::U8, R5, R2, ETH_LEN as i16);
        let plain = a.label();
        a.jump32_imm(Cmp::Eq, R5, 0x45, plain);
        verdict(&mut a, Verdict::IpOptions, pass);
        a.place(plain);
        let udp4 = a.label();
        a.load(Size::U8, R5, R2, (ETH_LEN + 9) as i16);
        a.jump32_imm(Cmp::Eq, R5, 17, udp4);
        verdict(&mut a, Verdict::NotUdp, pass);
        a.place(udp4);
        // The more-fragments flag and the fragment offset.
        let whole = a.label();
        a.load(Size::U16, R5, R2, (ETH_LEN + 6) as i16);
        a.and_imm(R5, wire16(0x3fff) as i32);
        a.jump32_imm(Cmp::Eq, R5, 0, whole);
        verdict(&mut a, Verdict::Fragment, pass);
        a.place(whole);
        // With no address of a family, the code that would follow a match is left out: the
        // verifier refuses instructions that no path reaches.
        let v4s: Vec<u32> = (self.addresses.iter())
            .filter_map(|a| match a {
                IpAddr::V4(v4) => Some(u32::from_le_bytes(v4.octets())),
                IpAddr::V6(_) => None,
            })
            .collect();
        if !v4s.is_empty() {
            let addressed4 = a.label();
            a.load(Size::U32, R5, R2, (ETH_LEN + 16) as i16);
            for v4 in v4s {
                a.jump32_imm(Cmp::Eq, R5, v4, addressed4);
            }
            verdict(&mut a, Verdict::NotOurs, pass);
            a.place(addressed4);
            to_port(&mut a, V4_END);
        }
        verdict(&mut a, Verdict::NotOurs, pass);

        a.place(ipv6);
        need(&mut a, V6_END);
        let udp6 = a.label();
        a.load(Size::U8, R5, R2, (ETH_LEN + 6) as i16);
        a.jump32_imm(Cmp::Eq, R5, 17, udp6);
        verdict(&mut a, Verdict::NotUdp, pass);
        a.place(udp6);
        let v6s: Vec<[u8; 16]> = (self.addresses.iter())
            .filter_map(|a| match a {
                IpAddr::V6(v6) => Some(v6.octets()),
                IpAddr::V4(_) => None,
            })
            .collect();
        if !v6s.is_empty() {
            let addressed6 = a.label();
            // The destination address as two 64-bit halves, each compared whole.
            a.load(Size::U64, R5, R2, (ETH_LEN + 24) as i16);
            a.load(Size::U64, R4, R2, (ETH_LEN + 32) as i16);
            for o in v6s {
                let next = a.label();
                a.load_imm64(R1, u64::from_le_bytes(o[..8].try_into().expect("8 bytes")));
                a.jump_reg(Cmp::Ne, R5, R1, next);
                a.load_imm64(R1, u64::from_le_bytes(o[8..].try_into().expect("8 bytes")));
                a.jump_reg(Cmp::Eq, R4, R1, addressed6);
                a.place(next);
            }
            verdict(&mut a, Verdict::NotOurs, pass);
            a.place(addressed6);
            to_port(&mut a, V6_END);
        }
        verdict(&mut a, Verdict::NotOurs, pass);

        // Ordo's: to the socket at the frame's receive queue, or, with none there, passed
        // (the lower bits of the flags are the action when the map has no entry).
        // Ordo's port: by the UDP header's length, not the frame's, which in multi-buffer
        // mode is the first buffer's only.
        a.place(sized);
        a.from_be16(R8);
        a.jump_imm(Cmp::Gt, R8, MAX_DATAGRAM, too_long);
        a.jump(ours);
        a.place(too_long);
        verdict(&mut a, Verdict::TooLong, pass);
        a.place(ours);
        a.load(Size::U32, R2, R6, MD_RX_QUEUE_INDEX);
        a.load_map(R1, sockets);
        a.mov_imm(R3, XDP_PASS as i32);
        a.call(REDIRECT_MAP);
        a.mov(R8, R0);
        a.mov_imm(R7, Verdict::ToSocket as i32);
        a.jump32_imm(Cmp::Eq, R0, XDP_REDIRECT, count);
        a.mov_imm(R7, Verdict::NoSocket as i32);
        a.jump(count);

        a.place(truncated);
        a.mov_imm(R7, Verdict::Truncated as i32);
        a.place(pass);
        a.mov_imm(R8, XDP_PASS as i32);
        // Count the verdict: counters[r7] += 1 (this CPU's, so no atomics).
        a.place(count);
        a.store(Size::U32, R10, -4, R7);
        a.mov(R2, R10);
        a.add_imm(R2, -4);
        a.load_map(R1, counters);
        a.call(MAP_LOOKUP_ELEM);
        a.jump_imm(Cmp::Eq, R0, 0, out);
        a.load(Size::U64, R1, R0, 0);
        a.add_imm(R1, 1);
        a.store(Size::U64, R0, 0, R1);
        a.place(out);
        a.mov(R0, R8);
        a.exit();
        a.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::bpf::{Map, Program};
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const PORT: u16 = 51820;
    const OURS_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 200);
    const OURS_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x2);

    /// An Ethernet frame of `ethertype` around `l3`.
    fn frame(ethertype: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    fn udp(dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut u = 40000u16.to_be_bytes().to_vec();
        u.extend_from_slice(&dport.to_be_bytes());
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        u
    }

    fn v4(to: Ipv4Addr, proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0];
        p.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 1]);
        p.extend_from_slice(&frag.to_be_bytes());
        p.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1]);
        p.extend_from_slice(&to.octets());
        p.extend_from_slice(l4);
        p
    }

    fn v6(to: Ipv6Addr, next: u8, l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        p.extend_from_slice(&[next, 64]);
        p.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).octets());
        p.extend_from_slice(&to.octets());
        p.extend_from_slice(l4);
        p
    }

    /// The program loaded as the kernel checks it, run on frames without an interface (the
    /// socket map empty, so Ordo's datagrams are passed as having no socket): each frame's
    /// verdict and the counters. Needs root (CAP_BPF), as the XDP path does.
    #[test]
    fn each_frame_gets_its_verdict_and_only_ordos_datagrams_are_taken() {
        let sockets = Map::sockets("test_xsks", 4).unwrap();
        let counters = Map::counters("test_verdicts", Verdict::ALL.len() as u32).unwrap();
        let settings = Map::values("test_settings", SETTINGS).unwrap();
        settings.set_u32(PORT_KEY, port_value(PORT)).unwrap();
        let filter = Filter {
            port: PORT,
            addresses: vec![OURS_V4.into(), OURS_V6.into()],
        };
        let insns = filter.program(
            std::os::fd::AsRawFd::as_raw_fd(&sockets),
            std::os::fd::AsRawFd::as_raw_fd(&counters),
            std::os::fd::AsRawFd::as_raw_fd(&settings),
        );
        let program = Program::load_xdp("ordo_test", &insns).unwrap_or_else(|e| panic!("{e}"));
        let wg = [4u8, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0];
        let other_v4 = Ipv4Addr::new(10, 0, 0, 7);
        let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
            (
                "ours, IPv4",
                frame(0x0800, &v4(OURS_V4, 17, 0x4000, &udp(PORT, &wg))),
                Verdict::NoSocket,
            ),
            (
                "ours, IPv6",
                frame(0x86dd, &v6(OURS_V6, 17, &udp(PORT, &wg))),
                Verdict::NoSocket,
            ),
            ("ARP", frame(0x0806, &[0; 28]), Verdict::NotIp),
            ("VLAN", frame(0x8100, &[0; 46]), Verdict::NotIp),
            (
                "another port",
                frame(0x0800, &v4(OURS_V4, 17, 0, &udp(53, &wg))),
                Verdict::NotOurs,
            ),
            (
                "another address",
                frame(0x0800, &v4(other_v4, 17, 0, &udp(PORT, &wg))),
                Verdict::NotOurs,
            ),
            (
                "another IPv6 address",
                frame(0x86dd, &v6(Ipv6Addr::LOCALHOST, 17, &udp(PORT, &wg))),
                Verdict::NotOurs,
            ),
            ("TCP", frame(0x0800, &v4(OURS_V4, 6, 0, &[0; 20])), Verdict::NotUdp),
            ("ICMPv6", frame(0x86dd, &v6(OURS_V6, 58, &[0; 24])), Verdict::NotUdp),
            (
                "first fragment",
                frame(0x0800, &v4(OURS_V4, 17, 0x2000, &udp(PORT, &wg))),
                Verdict::Fragment,
            ),
            (
                "later fragment",
                frame(0x0800, &v4(OURS_V4, 17, 0x0005, &wg)),
                Verdict::Fragment,
            ),
            (
                "IPv4 options",
                {
                    let mut p = v4(OURS_V4, 17, 0, &udp(PORT, &wg));
                    p[0] = 0x46;
                    frame(0x0800, &p)
                },
                Verdict::IpOptions,
            ),
            ("IPv4 without its header", frame(0x0800, &[]), Verdict::Truncated),
            (
                "a UDP GSO batch, unsplit",
                frame(0x0800, &v4(OURS_V4, 17, 0, &udp(PORT, &[0; MAX_DATAGRAM as usize]))),
                Verdict::TooLong,
            ),
            (
                "short UDP header",
                frame(0x0800, &v4(OURS_V4, 17, 0, &[0x9c, 0x40, 0xca])),
                Verdict::Truncated,
            ),
        ];
        for (what, f, _) in &cases {
            assert_eq!(program.test_run(f).unwrap(), XDP_PASS, "{what}: passed");
        }
        for v in Verdict::ALL {
            let expected = cases.iter().filter(|c| c.2 == v).count() as u64;
            assert_eq!(counters.sum(v as u32).unwrap(), expected, "{}", v.name());
        }
        // A new port in the map moves the program with it, without a new program.
        let ours = frame(0x0800, &v4(OURS_V4, 17, 0, &udp(PORT, &wg)));
        let before = counters.sum(Verdict::NotOurs as u32).unwrap();
        settings.set_u32(PORT_KEY, port_value(PORT + 1)).unwrap();
        program.test_run(&ours).unwrap();
        assert_eq!(
            counters.sum(Verdict::NotOurs as u32).unwrap(),
            before + 1,
            "the old port is not ours"
        );
        let moved = frame(0x0800, &v4(OURS_V4, 17, 0, &udp(PORT + 1, &wg)));
        let no_socket = counters.sum(Verdict::NoSocket as u32).unwrap();
        program.test_run(&moved).unwrap();
        assert_eq!(
            counters.sum(Verdict::NoSocket as u32).unwrap(),
            no_socket + 1,
            "the new port is"
        );
    }
}
