//! Steering in the kernel: a classic BPF program attached to a SO_REUSEPORT group of UDP
//! sockets (one per queue) picks the socket for each datagram from our receiver index, as
//! `ordo_proto::steering` defines it, so that a peer's datagrams reach its queue's thread.
//!
//! The kernel runs the program with the datagram's UDP payload at offset 0; an index past
//! the group's size, or a read past the end of a short datagram, falls back to the kernel's
//! own hash, which is fine: those are initiations and garbage, that any queue may take.

use ordo_proto::messages::TYPE_RESPONSE;
use ordo_proto::steering::SteeringException;
use std::io;
use std::os::fd::AsRawFd;

/// Not in the libc crate for Linux (it is for Android); the value is the same.
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

fn op(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Most exceptions a program carries (two instructions each, within the kernel's 4096). More
/// would only come from hundreds of peers moved within one rekey interval; those beyond wait
/// for their move's handshake.
pub const MAX_EXCEPTIONS: usize = 1024;

/// The program: the receiver index (at 8 in a response, at 4 otherwise); first the
/// exceptions, each sending its receiver index to its queue; then the rule, the
/// index's low byte modulo the number of queues (`ordo_proto::steering::queue_of_message`).
/// Exceptions are how a peer moved to another queue gets its datagrams there at once: its
/// session's index still names the old queue (`Interface::steering_overrides`).
pub fn program(queues: u32, exceptions: &[SteeringException]) -> Vec<libc::sock_filter> {
    use libc::*;
    let ldw = |at: u32| op(BPF_LD | BPF_W | BPF_ABS, at, 0, 0);
    let mut p = vec![
        op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),
        // A response carries the peer's index first and ours at 8: jump to that load.
        op(BPF_JMP | BPF_JEQ | BPF_K, TYPE_RESPONSE as u32, 0, 2),
        ldw(8),
        op(BPF_JMP | BPF_JA, 1, 0, 0),
        ldw(4),
    ];
    // A word load reads network (big-endian) order; indices travel little-endian.
    for e in exceptions.iter().take(MAX_EXCEPTIONS) {
        p.push(op(BPF_JMP | BPF_JEQ | BPF_K, e.receiver.swap_bytes(), 0, 1));
        p.push(op(BPF_RET | BPF_K, e.queue, 0, 0));
    }
    // The index's low byte is the word's top byte.
    p.push(op(BPF_ALU | BPF_RSH | BPF_K, 24, 0, 0));
    p.push(op(BPF_ALU | BPF_MOD | BPF_K, queues.max(1), 0, 0));
    p.push(op(BPF_RET | BPF_A, 0, 0, 0));
    p
}

/// Attaches the program to the reuseport group of `sock` (it applies to the whole group),
/// replacing the one attached before.
pub fn attach(sock: &impl AsRawFd, queues: u32, exceptions: &[SteeringException]) -> io::Result<()> {
    let mut prog = program(queues, exceptions);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: the kernel copies `len` instructions from `filter`, which points into `prog`,
    // alive for the call; the option value is one sock_fprog of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::sockets::Sockets;
    use ordo_proto::messages::{TYPE_DATA, TYPE_INITIATION};
    use ordo_proto::steering::SteeringException;
    use ordo_proto::steering::{index_for_queue, queue_of_message};
    use std::net::UdpSocket;
    use std::time::Duration;

    /// Real sockets: four queues bound with SO_REUSEPORT on one port; data messages and
    /// responses whose receiver index names queue q arrive on socket q, exactly as the
    /// protocol side computes it.
    #[test]
    fn the_kernel_steers_each_message_to_its_queue() {
        let group = Sockets::bind_queues(0, 0, 4).unwrap();
        let port = group[0].port;
        for s in &group {
            s.v4.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        }
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut expected = Vec::new();
        for (n, queue) in [3u32, 0, 2, 1, 1, 3, 0, 2].into_iter().enumerate() {
            let index = index_for_queue(0x5a5a_5a00 ^ (n as u32 * 0x0101_0137), queue, 4);
            let mut msg = if n % 2 == 0 {
                let mut m = vec![TYPE_DATA, 0, 0, 0];
                m.extend_from_slice(&index.to_le_bytes());
                m
            } else {
                let mut m = vec![super::TYPE_RESPONSE, 0, 0, 0, 0xee, 0xee, 0xee, 0xee];
                m.extend_from_slice(&index.to_le_bytes());
                m
            };
            msg.extend_from_slice(&[n as u8; 24]);
            assert_eq!(queue_of_message(&msg, 4), Some(queue));
            client.send_to(&msg, ("127.0.0.1", port)).unwrap();
            expected.push((queue, msg));
        }
        for (queue, msg) in expected {
            let mut buf = [0u8; 256];
            let n = group[queue as usize].v4.recv(&mut buf).expect("arrived on its queue");
            assert_eq!(&buf[..n], &msg[..]);
        }
        // An initiation (the peer's index only) lands on some queue, and is not lost.
        client
            .send_to(&[TYPE_INITIATION, 0, 0, 0, 7, 0, 0, 0], ("127.0.0.1", port))
            .unwrap();
        let got = group.iter().any(|s| {
            s.v4.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            s.v4.recv(&mut [0u8; 64]).is_ok()
        });
        assert!(got);
    }

    /// A moved peer: its session's index names queue 0 by the rule, an exception sends it
    /// (data and responses) to queue 3; other indices keep the rule; a new program replaces
    /// the old one.
    #[test]
    fn an_exception_sends_a_moved_peers_index_to_its_new_queue() {
        let group = Sockets::bind_queues(0, 0, 4).unwrap();
        let port = group[0].port;
        for s in &group {
            s.v4.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        }
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let moved = index_for_queue(0x1234_5678, 0, 4);
        let other = index_for_queue(0x0bad_cafe, 0, 4);
        let data = |index: u32| {
            let mut m = vec![TYPE_DATA, 0, 0, 0];
            m.extend_from_slice(&index.to_le_bytes());
            m.extend_from_slice(&[9; 24]);
            m
        };
        let response = |index: u32| {
            let mut m = vec![super::TYPE_RESPONSE, 0, 0, 0, 0xee, 0xee, 0xee, 0xee];
            m.extend_from_slice(&index.to_le_bytes());
            m.extend_from_slice(&[8; 24]);
            m
        };
        let arrives_on = |msg: &[u8]| {
            client.send_to(msg, ("127.0.0.1", port)).unwrap();
            let mut buf = [0u8; 256];
            (0..4)
                .find(|&q| {
                    group[q].v4.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                    group[q].v4.recv(&mut buf).is_ok_and(|n| buf[..n] == *msg)
                })
                .expect("arrived on some queue")
        };
        let exception = |receiver, queue| SteeringException { receiver, queue };
        let exceptions = [
            exception(moved.wrapping_sub(1), 1),
            exception(moved, 3),
            exception(moved.wrapping_add(1), 2),
        ];
        super::attach(&group[0].v4, 4, &exceptions).unwrap();
        assert_eq!(arrives_on(&data(moved)), 3);
        assert_eq!(arrives_on(&response(moved)), 3);
        assert_eq!(arrives_on(&data(other)), 0);
        super::attach(&group[0].v4, 4, &[]).unwrap();
        assert_eq!(arrives_on(&data(moved)), 0, "the rule again");
        assert!(
            super::program(4, &vec![exception(1, 1); 5000]).len() <= 4096,
            "within the kernel's limit"
        );
    }
}
