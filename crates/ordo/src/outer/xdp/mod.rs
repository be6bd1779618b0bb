//! The outer side over AF_XDP (issue 21, `Outer = xdp`): an XDP program on the outer
//! interface hands Ordo's UDP datagrams to AF_XDP sockets and passes everything else to the
//! kernel, which keeps the interface and a UDP socket on the port.
//!
//! Built so far: the program ([`filter`], from instructions [`insn`] assembles: no BPF
//! compiler in the build), and the kernel calls that load it, attach it with a BPF link that
//! leaves with the process, and count its verdicts ([`bpf`]). Not yet: the sockets, their
//! rings and the port itself.

pub mod bpf;
pub mod filter;
pub mod insn;
