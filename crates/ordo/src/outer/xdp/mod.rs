//! The outer side over AF_XDP (issue 21, `Outer = xdp`): an XDP program on the outer
//! interface hands Ordo's UDP datagrams to AF_XDP sockets and passes everything else to the
//! kernel, which keeps the interface and a UDP socket on the port.
//!
//! Built so far: the program ([`filter`], from instructions [`insn`] assembles: no BPF
//! compiler in the build); the kernel calls that load it, attach it with a BPF link that
//! leaves with the process, and count its verdicts ([`bpf`]); attaching in the best mode
//! the interface allows, or saying why not ([`attach`]); the headers Ordo writes in
//! front of what it sends ([`frame`]); one AF_XDP socket with its UMEM and rings (the
//! `xdp` crate's), receiving datagrams and sending frames ([`queue`]). How a datagram leaves
//! (route, source, hardware addresses) is the kernel's answer ([`route`]), kept current for
//! the sending threads by a thread of its own ([`paths`]). Not yet: the port itself
//! (`Outer = xdp`), whose design waits on one question: a socket takes frames only from the
//! NIC queue it is bound to, which the sender's hash picks, not Ordo's receiver index.

pub mod attach;
pub mod bpf;
pub mod filter;
pub mod frame;
pub mod insn;
pub mod paths;
pub mod queue;
pub mod route;
