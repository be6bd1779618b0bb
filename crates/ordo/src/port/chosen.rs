//! Ports whose backend is chosen at run time: an interface's file says `Inner = stack` or
//! `Outer = xdp`, and the controls above the plane (UAPI, daemon, show) want one device type
//! whichever was chosen. [`ChosenOuter`] and [`ChosenInner`] hold any backend behind the
//! port traits, so that a new backend needs no forwarding code here or in the device; the
//! indirect call per batch costs nothing next to the system call behind it.

use super::{
    Counter, Datagram, DeliveryRun, InnerPort, InnerRead, OuterPort, OuterReceive, PacketBuf, SteeringException,
};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// A receive half of a [`ChosenOuter`].
pub type ChosenReceive = Box<dyn OuterReceive>;

/// A read half of a [`ChosenInner`].
pub type ChosenRead = Box<dyn InnerRead>;

/// Any outer port.
pub struct ChosenOuter(Box<dyn OuterPort<Receive = ChosenReceive>>);

/// Any inner port.
pub struct ChosenInner(Box<dyn InnerPort<Read = ChosenRead>>);

impl ChosenOuter {
    pub fn new<O: OuterPort>(port: O) -> ChosenOuter {
        ChosenOuter(Box::new(Boxing(port)))
    }
}

impl ChosenInner {
    pub fn new<I: InnerPort>(port: I) -> ChosenInner {
        ChosenInner(Box::new(Boxing(port)))
    }
}

/// A port whose halves are boxed, so that every backend has the same half type.
struct Boxing<P>(P);

impl<O: OuterPort> OuterPort for Boxing<O> {
    type Receive = ChosenReceive;

    fn receivers(&self, queue: usize) -> Vec<ChosenReceive> {
        let halves = self.0.receivers(queue).into_iter();
        halves.map(|r| Box::new(r) as ChosenReceive).collect()
    }

    fn send(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        self.0.send(queue, to, payloads)
    }

    fn steer(&self, exceptions: &[SteeringException]) {
        self.0.steer(exceptions)
    }

    fn counters(&self) -> Vec<Counter> {
        self.0.counters()
    }

    fn listen_port(&self) -> u16 {
        self.0.listen_port()
    }

    fn rebind(&self, port: u16, fwmark: u32) -> io::Result<()> {
        self.0.rebind(port, fwmark)
    }

    fn set_fwmark(&self, mark: u32, old: u32) -> io::Result<()> {
        self.0.set_fwmark(mark, old)
    }

    fn shutdown(&self) {
        self.0.shutdown()
    }

    fn describe(&self) -> String {
        self.0.describe()
    }
}

impl<I: InnerPort> InnerPort for Boxing<I> {
    type Read = ChosenRead;

    fn reader(&self, queue: usize) -> ChosenRead {
        Box::new(self.0.reader(queue))
    }

    fn write(&self, queue: usize, run: &mut DeliveryRun<'_>) {
        self.0.write(queue, run)
    }

    fn mtu(&self) -> Option<usize> {
        self.0.mtu()
    }

    fn counters(&self) -> Vec<Counter> {
        self.0.counters()
    }

    fn shutdown(&self) {
        self.0.shutdown()
    }
}

impl OuterPort for ChosenOuter {
    type Receive = ChosenReceive;

    fn receivers(&self, queue: usize) -> Vec<ChosenReceive> {
        self.0.receivers(queue)
    }

    fn send(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        self.0.send(queue, to, payloads)
    }

    fn steer(&self, exceptions: &[SteeringException]) {
        self.0.steer(exceptions)
    }

    fn counters(&self) -> Vec<Counter> {
        self.0.counters()
    }

    fn listen_port(&self) -> u16 {
        self.0.listen_port()
    }

    fn rebind(&self, port: u16, fwmark: u32) -> io::Result<()> {
        self.0.rebind(port, fwmark)
    }

    fn set_fwmark(&self, mark: u32, old: u32) -> io::Result<()> {
        self.0.set_fwmark(mark, old)
    }

    fn shutdown(&self) {
        self.0.shutdown()
    }

    fn describe(&self) -> String {
        self.0.describe()
    }
}

impl InnerPort for ChosenInner {
    type Read = ChosenRead;

    fn reader(&self, queue: usize) -> ChosenRead {
        self.0.reader(queue)
    }

    fn write(&self, queue: usize, run: &mut DeliveryRun<'_>) {
        self.0.write(queue, run)
    }

    fn mtu(&self) -> Option<usize> {
        self.0.mtu()
    }

    fn counters(&self) -> Vec<Counter> {
        self.0.counters()
    }

    fn shutdown(&self) {
        self.0.shutdown()
    }
}

impl OuterReceive for ChosenReceive {
    fn wait_fd(&mut self) -> Option<RawFd> {
        (**self).wait_fd()
    }

    fn recv(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        (**self).recv(out)
    }

    fn recv_waiting(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        (**self).recv_waiting(out)
    }
}

impl InnerRead for ChosenRead {
    fn wait_fd(&mut self) -> Option<RawFd> {
        (**self).wait_fd()
    }

    fn read(&mut self, out: &mut Vec<PacketBuf>, max: usize) -> io::Result<()> {
        (**self).read(out, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inner::memory::MemoryInner;
    use crate::outer::faults::{FaultInjector, Faults};
    use crate::outer::memory::MemoryOuter;

    /// A chosen port is its backend: what is sent arrives through the other end's chosen
    /// halves, and its controls and counters are the backend's.
    #[test]
    fn a_chosen_outer_port_forwards_everything_to_its_backend() {
        let (a_addr, b_addr): (SocketAddr, SocketAddr) =
            ("192.0.2.1:1".parse().unwrap(), "192.0.2.2:1".parse().unwrap());
        let (a, b) = MemoryOuter::pair(a_addr, 1, b_addr, 1).unwrap();
        let a = ChosenOuter::new(a);
        let b = ChosenOuter::new(FaultInjector::new(b, Faults::default()));
        assert_eq!(a.describe(), "memory");
        assert_eq!(b.describe(), "memory with faults");
        assert_eq!(a.listen_port(), 0);
        assert_eq!(a.rebind(51820, 0).unwrap_err().kind(), io::ErrorKind::Unsupported);
        assert_eq!(a.send(0, b_addr, &[b"one", b"two"]), 2);
        let mut got = Vec::new();
        let mut half = b.receivers(0).pop().unwrap();
        half.recv(&mut got).unwrap();
        let payloads: Vec<&[u8]> = got.iter().map(|d| &d.data[..]).collect();
        assert_eq!(payloads, [&b"one"[..], b"two"]);
        assert_eq!(got[0].src, a_addr);
        let sent = a
            .counters()
            .into_iter()
            .find(|c| c.name == "memory_outer_sent")
            .unwrap();
        assert_eq!(sent.value, 2);
        assert!(b.counters().iter().any(|c| c.name == "fault_dropped"));
    }

    /// A chosen inner port reads what its backend holds, and its shutdown reaches the
    /// backend: the read halves fail from then on.
    #[test]
    fn a_chosen_inner_port_reads_and_shuts_down_its_backend() {
        let memory = MemoryInner::keeping(1).unwrap();
        assert!(memory.inject(0, b"packet"));
        let inner = ChosenInner::new(memory);
        let mut read = inner.reader(0);
        let mut out = Vec::new();
        read.read(&mut out, 8).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].packet(), b"packet");
        inner.shutdown();
        assert!(read.read(&mut out, 8).is_err(), "a shut-down port's reader fails");
    }
}
