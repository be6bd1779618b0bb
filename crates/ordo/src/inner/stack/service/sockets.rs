//! The stack's TCP sockets and ports: each socket's buffers (large ones for a bounded number,
//! ended sockets' kept for new ones), its settings, and the ephemeral ports of connections
//! and flows.

use super::State;
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;
use std::collections::HashSet;
use std::time::Instant;

/// Each TCP connection's receive and send buffers in the stack: the window it can offer, and
/// the data it can have in flight. One flow's window must cover what the tunnel holds in
/// flight at full speed (its queues included): 1 MB held one flow back on this machine's
/// veth receiving, not sending (scripts/bench-stack.sh). The kernel grows a socket's buffers
/// up to 6 MB receiving and 4 MB sending (tcp_rmem, tcp_wmem). The memory is touched only as
/// data passes through; a peer can fill a receive buffer whose application does not read, so
/// only [`LARGE_RECEIVE_BUFFERS`] sockets at once have the large one, the others
/// [`SMALL_RECEIVE_BUFFER`] (many connections at once share the bandwidth: each needs less),
/// and the whole is bounded by [`super::MAX_CONNECTIONS`].
pub(super) const RECEIVE_BUFFER: usize = 4 * 1024 * 1024;
pub(super) const SMALL_RECEIVE_BUFFER: usize = 512 * 1024;
pub const LARGE_RECEIVE_BUFFERS: usize = 128;
pub(super) const SEND_BUFFER: usize = 1024 * 1024;

/// Local ports of connections (the kernel's default ephemeral range is 32768-60999; the
/// stack has its own addresses, so it may use the IANA range).
pub(super) const EPHEMERAL: std::ops::RangeInclusive<u16> = 49152..=65535;

/// The TCP timestamp clock (RFC 7323): milliseconds, monotonic.
fn tsval() -> u32 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u32
}

/// A free port of `in_use` from the ephemeral range, taken, starting at `next`.
pub(super) fn take_port(in_use: &mut HashSet<u16>, next: &mut u16) -> Option<u16> {
    let span = EPHEMERAL.end() - EPHEMERAL.start() + 1;
    for _ in 0..span {
        let p = *next;
        *next = if p == *EPHEMERAL.end() {
            *EPHEMERAL.start()
        } else {
            p + 1
        };
        if in_use.insert(p) {
            return Some(p);
        }
    }
    None
}

/// A TCP socket's two buffers.
pub(super) struct SocketBuffers {
    pub(super) receive: tcp::SocketBuffer<'static>,
    pub(super) send: tcp::SocketBuffer<'static>,
}

/// Ended sockets' buffers kept for new ones: a socket's are megabytes, and allocating them
/// zeroed cost more than the rest of a connection's setup (a connection opened and closed
/// at a time). The most memory kept so is this many large receive and send buffers.
pub(super) const SPARE_BUFFERS: usize = 8;

/// A TCP socket of the stack, as every connection has it, over `buffers`.
pub(super) fn new_tcp_socket(buffers: SocketBuffers) -> tcp::Socket<'static> {
    let mut socket = tcp::Socket::new(buffers.receive, buffers.send);
    socket.set_congestion_control(tcp::CongestionControl::Cubic);
    socket.set_tsval_generator(Some(tsval));
    // Linux's floor (RFC 8961 allows it): a retransmission that loss recovery could not
    // repair waits 200 ms, not the 1 s of RFC 6298.
    socket.set_min_rto(MIN_RTO);
    socket
}

/// The floor of a connection's retransmission timeout.
const MIN_RTO: smoltcp::time::Duration = smoltcp::time::Duration::from_millis(200);

impl State {
    pub(super) fn take_port(&mut self) -> Option<u16> {
        take_port(&mut self.ports_in_use, &mut self.next_port)
    }

    pub(super) fn take_udp_port(&mut self) -> Option<u16> {
        take_port(&mut self.udp_ports_in_use, &mut self.next_port)
    }

    /// A TCP socket for a connection or a listener: the large receive buffer while fewer
    /// than [`LARGE_RECEIVE_BUFFERS`] sockets have it; an ended socket's buffers if one of
    /// that size is spare.
    pub(super) fn new_tcp_socket(&mut self) -> tcp::Socket<'static> {
        let receive = if self.large_receive_buffers < LARGE_RECEIVE_BUFFERS {
            self.large_receive_buffers += 1;
            RECEIVE_BUFFER
        } else {
            SMALL_RECEIVE_BUFFER
        };
        let spare = self.spare_buffers.iter().position(|b| b.receive.capacity() == receive);
        let buffers = match spare {
            Some(i) => self.spare_buffers.swap_remove(i),
            None => SocketBuffers {
                receive: tcp::SocketBuffer::new(vec![0; receive]),
                send: tcp::SocketBuffer::new(vec![0; SEND_BUFFER]),
            },
        };
        new_tcp_socket(buffers)
    }

    /// Removes a TCP socket, giving back its large receive buffer if it had one, and keeping
    /// its buffers for the next socket while fewer than [`SPARE_BUFFERS`] are kept.
    pub(super) fn remove_tcp(&mut self, h: SocketHandle) {
        if let smoltcp::socket::Socket::Tcp(s) = self.sockets.remove(h) {
            if s.recv_capacity() == RECEIVE_BUFFER {
                self.large_receive_buffers -= 1;
            }
            if self.spare_buffers.len() < SPARE_BUFFERS {
                let (receive, send) = s.into_buffers();
                self.spare_buffers.push(SocketBuffers { receive, send });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_taken_from_the_ephemeral_range_round_and_until_none_is_left() {
        let mut in_use = HashSet::from([*EPHEMERAL.end()]);
        let mut next = *EPHEMERAL.end();
        // The last is in use: the first of the range is next.
        assert_eq!(take_port(&mut in_use, &mut next), Some(*EPHEMERAL.start()));
        let left = EPHEMERAL.len() - 2;
        for _ in 0..left {
            let p = take_port(&mut in_use, &mut next).expect("a free port");
            assert!(EPHEMERAL.contains(&p));
        }
        assert_eq!(in_use.len(), EPHEMERAL.len());
        assert_eq!(take_port(&mut in_use, &mut next), None);
        in_use.remove(&50_000);
        assert_eq!(take_port(&mut in_use, &mut next), Some(50_000));
    }
}
