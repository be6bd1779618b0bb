//! Batched UDP I/O for Linux, the socket layer under Ordo's kernel-UDP outer port and its load
//! generator (as `quinn-udp` is for quinn): it knows sockets and system calls, not WireGuard.
//!
//! - [`Receiver`]: recvmmsg moves up to [`BATCH`] datagrams per system call, and with UDP GRO
//!   (one receive returns many coalesced datagrams) splits them again without copying;
//! - [`send_batch`]: sendmmsg, and UDP GSO (one send carries many equal-sized datagrams,
//!   split by the kernel or the NIC) where the route takes it ([`Gso`]);
//! - [`udp_receive_drops`]: what the kernel dropped before a receive saw it.
//!
//! Both offloads are detected at run time: GRO is asked for and used if granted; GSO is used
//! until a send fails in the way that means "not supported here", then not again for that
//! destination.

mod addr;
mod drops;
mod options;
mod recv;
mod send;

pub use drops::udp_receive_drops;
pub use options::{disable_gro, enable_gro, gso_supported, set_int_option};
pub use recv::{Receiver, SLOT_RECEIVES};
pub use send::{send_batch, Gso};

use bytes::BytesMut;
use std::net::SocketAddr;

/// Datagrams per recvmmsg or sendmmsg system call.
pub const BATCH: usize = 32;

/// A received datagram.
pub struct Datagram {
    /// Its bytes; from a [`Receiver`], a slice of the receive buffer it arrived in, not copied.
    pub data: BytesMut,
    /// Where it came from.
    pub src: SocketAddr,
}

/// Room for one control message carrying an int, 8-byte aligned.
type CmsgBuf = [u64; 4];
