//! Ordo's fuzz targets as plain functions over bytes, so that two drivers run the same code:
//! cargo-fuzz under libFuzzer for the long campaigns (`fuzz/`, `make fuzz-campaign`), and
//! [`short::run`] on the stable toolchain in `make test` (the kept corpus, then seeded
//! mutations of it). Each target asserts its invariants: a panic is a finding.
//!
//! Every path that takes bytes from outside has one: datagrams from the network (a live
//! session, the handshake responder, and a two-sided exchange under an adversary), packets
//! from TUN and decrypted packets on their way to it (offloads), the headers routing reads,
//! the UAPI, wg-quick files, the load generator's wire format, the CPU lists of the
//! configuration, and the attach protocol between applications and the user-space stack.
//! rtnetlink replies are parsed by the `netlink-packet-route` crate, not here.

pub mod attach;
pub mod packets;
pub mod proto;
pub mod session;
pub mod short;
pub mod text;

/// One fuzz target.
pub struct Target {
    /// Its name, as cargo-fuzz and the corpus folder (`fuzz/corpus/NAME`) know it.
    pub name: &'static str,
    /// Runs one input; panics when an invariant breaks.
    pub run: fn(&[u8]),
    /// Valid inputs to start from (written to the corpus by `make fuzz-campaign`).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

pub const TARGETS: &[Target] = &[
    Target {
        name: "receive",
        run: proto::receive,
        seeds: proto::receive_seeds,
    },
    Target {
        name: "handshake_responder",
        run: proto::handshake_responder,
        seeds: proto::handshake_responder_seeds,
    },
    Target {
        name: "session",
        run: session::run,
        seeds: session::seeds,
    },
    Target {
        name: "tun_read",
        run: packets::tun_read,
        seeds: packets::tun_read_seeds,
    },
    Target {
        name: "tun_write",
        run: packets::tun_write,
        seeds: packets::tun_write_seeds,
    },
    Target {
        name: "ip_headers",
        run: packets::ip_headers,
        seeds: packets::ip_headers_seeds,
    },
    Target {
        name: "uapi_set",
        run: text::uapi_set,
        seeds: text::uapi_set_seeds,
    },
    Target {
        name: "wgquick",
        run: text::wgquick,
        seeds: text::wgquick_seeds,
    },
    Target {
        name: "loadgen_wire",
        run: text::loadgen_wire,
        seeds: text::loadgen_wire_seeds,
    },
    Target {
        name: "cpu_list",
        run: text::cpu_list,
        seeds: text::cpu_list_seeds,
    },
    Target {
        name: "attach",
        run: attach::run,
        seeds: attach::seeds,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
