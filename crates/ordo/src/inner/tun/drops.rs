//! Packets the TUN device dropped because its queue for us was full, as the kernel counts
//! them (the interface's TX drops), so that `ordo show` names a loss nobody in Ordo saw.
//!
//! Read from /proc/thread-self/net, which is the network namespace of the calling thread
//! (/proc/self/net would be the main thread's).

use std::fs;

/// Packets the kernel dropped on their way into the interface `ifname` (its TX drops: for a
/// TUN device, a full queue). None if there is no such interface here.
pub fn tun_queue_drops(ifname: &str) -> Option<u64> {
    tx_dropped(&fs::read_to_string("/proc/thread-self/net/dev").ok()?, ifname)
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
            let tun = match super::super::device::Tun::create(name) {
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
