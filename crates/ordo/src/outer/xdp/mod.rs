//! The outer side over AF_XDP (`Outer = xdp`): an XDP program on the outer
//! interface hands Ordo's UDP datagrams to AF_XDP sockets and passes everything else to the
//! kernel, which keeps the interface and a UDP socket on the port.
//!
//! The parts: the program ([`filter`], from instructions [`insn`] assembles: no BPF
//! compiler in the build); the kernel calls that load it, attach it with a BPF link that
//! leaves with the process, and count its verdicts ([`bpf`]); attaching in the best mode
//! the interface allows, or saying why not ([`attach`]); the headers Ordo writes in front
//! of what it sends ([`frame`]); one AF_XDP socket with its UMEM and rings (the `xdp`
//! crate's), receiving datagrams and sending frames ([`queue`]), with a peer's GSO batch
//! that generic mode delivers whole cut back into its messages ([`glued`]). How a datagram leaves
//! (route, source, hardware addresses) is the kernel's answer ([`route`]), kept current for
//! the sending threads by a thread of its own ([`paths`]). [`port`] puts them together as
//! an outer port.

pub mod attach;
pub mod bpf;
pub mod filter;
pub mod frame;
pub mod glued;
pub mod insn;
pub mod paths;
pub mod port;
pub mod queue;
pub mod route;
