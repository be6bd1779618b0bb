//! The device's outer side: kernel UDP sockets, or AF_XDP beside them (`Outer = xdp`). One
//! enum rather than a generic device, as for the inner side (see `super::inner`).

use crate::outer::udp::{UdpPort, UdpReceive};
use crate::outer::xdp::port::{XdpPort, XdpReceive};
use crate::port::{Counter, Datagram, OuterPort, OuterReceive, SteeringException};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

pub enum OuterSide {
    Udp(UdpPort),
    Xdp(XdpPort),
}

pub enum OuterSideReceive {
    Udp(UdpReceive),
    Xdp(XdpReceive),
}

impl OuterSide {
    pub fn listen_port(&self) -> u16 {
        match self {
            OuterSide::Udp(u) => u.listen_port(),
            OuterSide::Xdp(x) => x.listen_port(),
        }
    }

    pub fn rebind(&self, port: u16, fwmark: u32) -> io::Result<()> {
        match self {
            OuterSide::Udp(u) => u.rebind(port, fwmark),
            OuterSide::Xdp(x) => x.rebind(port, fwmark),
        }
    }

    /// Every socket marked `mark`, or none changed (those done go back to `old`).
    pub fn set_fwmark(&self, mark: u32, old: u32) -> io::Result<()> {
        match self {
            OuterSide::Udp(u) => u.set_fwmark(mark, old),
            OuterSide::Xdp(x) => x.set_fwmark(mark, old),
        }
    }

    pub fn shutdown(&self) {
        match self {
            OuterSide::Udp(u) => u.shutdown(),
            OuterSide::Xdp(x) => x.shutdown(),
        }
    }

    /// Which path runs, as `ordo show` says it: `udp`, or `xdp` with each interface's mode.
    pub fn describe(&self) -> String {
        match self {
            OuterSide::Udp(_) => "udp".into(),
            OuterSide::Xdp(x) => format!("xdp on {}", x.describe()),
        }
    }
}

impl OuterPort for OuterSide {
    type Receive = OuterSideReceive;

    fn receivers(&self, queue: usize) -> Vec<OuterSideReceive> {
        match self {
            OuterSide::Udp(u) => u.receivers(queue).into_iter().map(OuterSideReceive::Udp).collect(),
            OuterSide::Xdp(x) => x.receivers(queue).into_iter().map(OuterSideReceive::Xdp).collect(),
        }
    }

    fn send(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        match self {
            OuterSide::Udp(u) => u.send(queue, to, payloads),
            OuterSide::Xdp(x) => x.send(queue, to, payloads),
        }
    }

    fn steer(&self, exceptions: &[SteeringException]) {
        match self {
            OuterSide::Udp(u) => u.steer(exceptions),
            OuterSide::Xdp(x) => x.steer(exceptions),
        }
    }

    fn counters(&self) -> Vec<Counter> {
        match self {
            OuterSide::Udp(u) => u.counters(),
            OuterSide::Xdp(x) => x.counters(),
        }
    }
}

impl OuterReceive for OuterSideReceive {
    fn wait_fd(&mut self) -> Option<RawFd> {
        match self {
            OuterSideReceive::Udp(u) => u.wait_fd(),
            OuterSideReceive::Xdp(x) => x.wait_fd(),
        }
    }

    fn recv(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        match self {
            OuterSideReceive::Udp(u) => u.recv(out),
            OuterSideReceive::Xdp(x) => x.recv(out),
        }
    }

    fn recv_waiting(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        match self {
            OuterSideReceive::Udp(u) => u.recv_waiting(out),
            OuterSideReceive::Xdp(x) => x.recv_waiting(out),
        }
    }
}
