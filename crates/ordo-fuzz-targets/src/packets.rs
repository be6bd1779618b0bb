//! Targets over IP packets: what a TUN read hands over (a virtio-net header, then a packet the
//! kernel may want split), the decrypted packets of a delivery run that are merged on their way
//! to TUN, and the headers that routing and offloads read.

use ordo::inner::tun::vnet::{self, Unpacked, VnetHdr, VNET_HDR_LEN};
use ordo::packet::coalesce::{self, coalesced_header, Write};
use ordo::packet::segment::segment;
use ordo::packet::{Offload, PartialChecksum, Segmentation};
use ordo::port::HEADROOM;

/// Any bytes as one read from TUN: a packet, its segments, or malformed; never a panic, and
/// every segment a well-formed packet no larger than what was read.
pub fn tun_read(data: &[u8]) {
    let mut frame = data.to_vec();
    let mut out = Vec::new();
    match vnet::unpack(&mut frame, &mut out) {
        Unpacked::Packet(p) => assert_eq!(p.len(), data.len() - VNET_HDR_LEN),
        Unpacked::Segmented(n) => {
            assert!(n >= 1 && n == out.len(), "{n} segments reported, {} made", out.len());
            for s in &out {
                assert!(
                    s.as_bytes()[..HEADROOM].iter().all(|&b| b == 0),
                    "the headroom was written"
                );
                let p = s.packet();
                assert!(p.len() <= data.len() - VNET_HDR_LEN, "a segment larger than the read");
                assert_eq!(declared_len(p), Some(p.len()), "a segment's IP length is not its size");
            }
        }
        Unpacked::Malformed => assert!(out.is_empty(), "a malformed read left segments"),
    }
}

/// The length an IPv4 or IPv6 header declares for its packet.
fn declared_len(p: &[u8]) -> Option<usize> {
    match p.first()? >> 4 {
        4 if p.len() >= 20 => Some(u16::from_be_bytes([p[2], p[3]]) as usize),
        6 if p.len() >= 40 => Some(40 + u16::from_be_bytes([p[4], p[5]]) as usize),
        _ => None,
    }
}

pub fn tun_read_seeds() -> Vec<Vec<u8>> {
    let frame = |o: Offload, p: Vec<u8>| {
        let mut f = vec![0u8; VNET_HDR_LEN];
        VnetHdr::of(&o).write(&mut f);
        f.extend_from_slice(&p);
        f
    };
    let partial = |start, offset| Some(PartialChecksum { start, offset });
    vec![
        frame(Offload::default(), tcp4(1, &[1; 100], 0x10)),
        frame(
            Offload {
                checksum: partial(20, 16),
                ..Offload::default()
            },
            tcp4(1, &[1; 100], 0x10),
        ),
        frame(
            Offload {
                segmentation: Segmentation::Tcp4,
                header_len: 40,
                segment_size: 500,
                checksum: partial(20, 16),
            },
            tcp4(1, &[2; 1800], 0x18),
        ),
        frame(
            Offload {
                segmentation: Segmentation::Tcp6,
                header_len: 60,
                segment_size: 400,
                checksum: partial(40, 16),
            },
            tcp6(1, &[3; 1000]),
        ),
        frame(
            Offload {
                segmentation: Segmentation::Udp,
                header_len: 28,
                segment_size: 300,
                checksum: partial(20, 6),
            },
            udp4(&[4; 1000]),
        ),
    ]
}

/// Any bytes as the decrypted packets of one delivery run (each behind a two-byte length):
/// the write plan takes each packet once and in order, and a merged packet splits back, as the
/// kernel would split it, into exactly the payloads that were merged.
pub fn tun_write(data: &[u8]) {
    let packets = split_run(data);
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let plan = coalesce::plan(&refs, true);
    let mut next = 0;
    for w in plan {
        match w {
            Write::Single(i) => {
                assert_eq!(i, next, "out of order");
                next += 1;
            }
            Write::Coalesced(a, b) => {
                assert!(a == next && b > a + 1 && b <= refs.len(), "bad run {a}..{b} at {next}");
                next = b;
                merged_splits_back(&refs[a..b]);
            }
        }
    }
    assert_eq!(next, refs.len(), "not every packet was planned");
}

fn merged_splits_back(run: &[&[u8]]) {
    let c = coalesced_header(run);
    let from = c.offload.header_len as usize;
    let mut merged = c.head.clone();
    for p in run {
        merged.extend_from_slice(&p[from..]);
    }
    assert!(merged.len() <= 65535, "a merged packet of {} bytes", merged.len());
    let mut out = Vec::new();
    assert!(segment(c.offload, &merged, &mut out), "a merged packet does not split");
    assert_eq!(
        out.len(),
        run.len(),
        "merged {} packets, split into {}",
        run.len(),
        out.len()
    );
    for (s, p) in out.iter().map(|s| s.packet()).zip(run) {
        assert_eq!(s.len(), p.len());
        assert_eq!(&s[from..], &p[from..], "a payload changed");
    }
}

/// A run of packets, each behind a two-byte big-endian length (cut short at the input's end).
fn split_run(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while data.len() >= 2 {
        let n = (u16::from_be_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
        out.push(data[2..2 + n].to_vec());
        data = &data[2 + n..];
    }
    out
}

pub fn tun_write_seeds() -> Vec<Vec<u8>> {
    let run = |packets: Vec<Vec<u8>>| {
        let mut b = Vec::new();
        for p in packets {
            b.extend_from_slice(&(p.len() as u16).to_be_bytes());
            b.extend_from_slice(&p);
        }
        b
    };
    vec![
        run(vec![
            tcp4(1000, &[1; 200], 0x10),
            tcp4(1200, &[2; 200], 0x10),
            tcp4(1400, &[3; 100], 0x18),
        ]),
        run(vec![
            udp4(&[5; 300]),
            udp4(&[6; 300]),
            udp4(&[7; 120]),
            tcp4(1, &[8; 10], 0x10),
        ]),
        run(vec![tcp6(1, &[9; 300]), tcp6(301, &[9; 300])]),
    ]
}

/// Any bytes as an inner packet: what routing reads of it (`ordo_proto::packet`) and what
/// offloads read (`ordo::packet::ip`) lie inside it.
pub fn ip_headers(data: &[u8]) {
    if let Some(h) = ordo_proto::packet::parse(data) {
        assert!(h.total_len <= data.len());
        assert_eq!(h.src.is_ipv4(), data[0] >> 4 == 4);
    }
    if let Some(t) = ordo::packet::ip::tcp_of(data) {
        assert_eq!(t.hdr_len + t.payload, data.len());
    }
    if let Some(u) = ordo::packet::ip::udp_of(data) {
        assert_eq!(u.ip_len + 8 + u.payload, data.len());
    }
}

pub fn ip_headers_seeds() -> Vec<Vec<u8>> {
    vec![tcp4(7, &[1; 40], 0x18), tcp6(7, &[2; 40]), udp4(&[3; 40])]
}

/// An IPv4 TCP segment 10.0.0.1:5201 -> 10.0.0.2:40000 (checksums left zero: offloads and
/// routing do not read them).
pub fn tcp4(seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
    let mut p = ipv4_header(6, 20 + payload.len());
    p.extend_from_slice(&tcp_header(seq, flags));
    p.extend_from_slice(payload);
    p
}

/// An IPv6 TCP segment with a 20-byte TCP header.
pub fn tcp6(seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    p[6] = 6;
    p[7] = 64;
    p[8] = 0xfd;
    p[23] = 1;
    p[24] = 0xfd;
    p[39] = 2;
    p.extend_from_slice(&tcp_header(seq, 0x10));
    p.extend_from_slice(payload);
    p
}

/// An IPv4 UDP datagram 10.0.0.1:5000 -> 10.0.0.2:6000.
pub fn udp4(payload: &[u8]) -> Vec<u8> {
    let mut p = ipv4_header(17, 8 + payload.len());
    let len = (8 + payload.len()) as u16;
    p.extend_from_slice(&[0x13, 0x88, 0x17, 0x70]);
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

fn ipv4_header(protocol: u8, l4_len: usize) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
    p[6] = 0x40;
    p[8] = 64;
    p[9] = protocol;
    p[12..16].copy_from_slice(&[10, 0, 0, 1]);
    p[16..20].copy_from_slice(&[10, 0, 0, 2]);
    p
}

fn tcp_header(seq: u32, flags: u8) -> [u8; 20] {
    let mut t = [0u8; 20];
    t[0..2].copy_from_slice(&5201u16.to_be_bytes());
    t[2..4].copy_from_slice(&40000u16.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t
}
