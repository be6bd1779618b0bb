//! Drops that happen before the data plane sees a packet, as the kernel counts them: packets
//! the TUN device dropped because its queue for us was full, and datagrams our UDP sockets
//! dropped because their receive buffers were full. `ordo show` lists them beside Ordo's own
//! drops, so that a loss nobody in Ordo saw still has a name.
//!
//! Read from /proc/thread-self/net, which is the network namespace of the calling thread
//! (/proc/self/net would be the main thread's).

use std::fs;

/// Packets the kernel dropped on their way into the interface `ifname` (its TX drops: for a
/// TUN device, a full queue). None if there is no such interface here.
pub fn tun_queue_drops(ifname: &str) -> Option<u64> {
    tx_dropped(&fs::read_to_string("/proc/thread-self/net/dev").ok()?, ifname)
}

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

/// The TX drop column of `ifname` in the text of /proc/net/dev ("name: 8 RX fields, then
/// bytes packets errs drop ... of TX").
fn tx_dropped(dev: &str, ifname: &str) -> Option<u64> {
    dev.lines().find_map(|line| {
        let (name, fields) = line.split_once(':')?;
        if name.trim() != ifname {
            return None;
        }
        fields.split_whitespace().nth(11)?.parse().ok()
    })
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
    fn tx_drops_are_read_from_the_interface_line() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0\n\
wg-ordo-a:    1220      16    0    0    0     0          0         0 291279021  205144    0 15164    0     0       0          0\n";
        assert_eq!(tx_dropped(dev, "wg-ordo-a"), Some(15164));
        assert_eq!(tx_dropped(dev, "lo"), Some(0));
        assert_eq!(tx_dropped(dev, "wg"), None);
    }

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
        assert!(super::super::batch::set_int_option(
            &rx,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            4096
        ));
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

    /// A TUN queue of 8 that nobody reads: what does not fit is dropped and counted. Run in a
    /// network namespace of the test thread's own, so the interface and its traffic stay out
    /// of the machine's (the `ip` children inherit the thread's namespace).
    #[test]
    fn a_full_tun_queue_is_counted() {
        std::thread::spawn(|| {
            // SAFETY: unshare has no memory-safety preconditions; it moves only this thread.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "skipped: no network namespace here ({})",
                    std::io::Error::last_os_error()
                );
                return;
            }
            let name = "ordoq0";
            let tun = match super::super::tun::Tun::create(name) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("skipped: cannot create a TUN device here ({e})");
                    return;
                }
            };
            tun.set_tx_queue_len(8).unwrap();
            assert_eq!(tun.tx_queue_len().unwrap(), 8);
            let ip = |args: &[&str]| assert!(std::process::Command::new("ip").args(args).status().unwrap().success());
            ip(&["addr", "add", "10.201.0.1/24", "dev", name]);
            ip(&["link", "set", name, "up"]);
            assert_eq!(tun_queue_drops(name), Some(0));
            let s = UdpSocket::bind("10.201.0.1:0").unwrap();
            const SENT: u64 = 50;
            for _ in 0..SENT {
                s.send_to(&[1u8; 100], "10.201.0.2:9").unwrap();
            }
            // Eight wait in the queue; the kernel may have queued a few packets of its own
            // (IPv6 router solicitations) on the way up, which only adds drops. A qdisc may
            // hand the last ones over in a softirq a moment later: wait for them (bounded).
            let mut drops = 0;
            for _ in 0..200 {
                drops = tun_queue_drops(name).unwrap();
                if drops >= SENT - 8 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!((SENT - 8..=SENT + 8).contains(&drops), "{drops} drops");
            drop(tun);
        })
        .join()
        .unwrap();
    }
}
