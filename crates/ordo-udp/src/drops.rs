//! Datagrams our UDP sockets dropped because their receive buffers were full, as the kernel
//! counts them: a loss that happens before the data plane sees a datagram still gets a name
//! in `ordo show`.
//!
//! Read from /proc/thread-self/net, which is the network namespace of the calling thread
//! (/proc/self/net would be the main thread's).

use std::fs;

/// Receives dropped by every UDP socket (IPv4 and IPv6) bound to `port`, a full receive
/// buffer mostly: the kernel counts buffers, so a dropped GRO batch of many datagrams
/// counts once.
pub fn udp_receive_drops(port: u16) -> u64 {
    ["/proc/thread-self/net/udp", "/proc/thread-self/net/udp6"]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .map(|text| socket_drops(&text, port))
        .sum()
}

/// The sum of the drops column (the last) over the sockets of /proc/net/udp or udp6 whose
/// local port is `port`.
fn socket_drops(table: &str, port: u16) -> u64 {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit_once(':')?.1;
            if u16::from_str_radix(local_port, 16).ok()? != port {
                return None;
            }
            fields.last()?.parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn socket_drops_add_up_the_sockets_of_the_port() {
        let udp = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n  \
 1: 00000000:CA6C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 11 2 0000000000000000 7\n  \
 2: 00000000:CA6C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 12 2 0000000000000000 5\n  \
 3: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 13 2 0000000000000000 9\n";
        assert_eq!(socket_drops(udp, 51820), 12);
        assert_eq!(socket_drops(udp, 53), 9);
        assert_eq!(socket_drops(udp, 1), 0);
    }

    /// A socket whose receive buffer fills: what the kernel dropped is what did not arrive.
    #[test]
    fn a_full_receive_buffer_is_counted() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(crate::set_int_option(&rx, libc::SOL_SOCKET, libc::SO_RCVBUF, 4096));
        let port = rx.local_addr().unwrap().port();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = udp_receive_drops(port);
        const SENT: u64 = 200;
        for _ in 0..SENT {
            tx.send_to(&[7u8; 1000], rx.local_addr().unwrap()).unwrap();
        }
        // Loopback delivers in a softirq, usually before send_to returns but not always: read
        // until every datagram is either received or counted (bounded).
        rx.set_nonblocking(true).unwrap();
        let (mut received, mut dropped) = (0, 0);
        let mut buf = [0u8; 2000];
        for _ in 0..200 {
            while rx.recv(&mut buf).is_ok() {
                received += 1;
            }
            dropped = udp_receive_drops(port) - before;
            if received + dropped >= SENT {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(received < SENT, "a 4 KB buffer held {received} datagrams of 1000 bytes");
        assert_eq!(dropped, SENT - received);
    }
}
