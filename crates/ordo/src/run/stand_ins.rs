//! The stand-ins the supervisor put in supervised programs (run/connect.rs), by inode
//! (whatever descriptor number they have, dup'ed or inherited): what the program's socket
//! calls must say of them that a Unix socket would not. SO_ERROR says how a non-blocking
//! connect ended (a Unix socket says 0), getsockname and getpeername name the tunnel's
//! addresses (a Unix socket names itself). The preload library keeps the same for the
//! programs it reaches (crates/ordo-preload/src/sockets.rs).
//!
//! Bounded: the oldest are forgotten (there is no hook on close; socket inodes are not
//! soon reused).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Stand-ins remembered at most.
const MAX: usize = 4096;

/// How long SO_ERROR waits for the stack's answer to a connect it has not had yet: the
/// stack answers before it closes the stand-in, which is what woke the program.
const ANSWER_WAIT: Duration = Duration::from_millis(100);

#[derive(Default, Clone)]
pub struct StandIns(Arc<Mutex<VecDeque<StandIn>>>);

struct StandIn {
    inode: u64,
    names: Names,
    /// The connect's errno, until SO_ERROR reads it (then 0); None: no answer yet.
    answer: Option<i32>,
}

/// What getsockname and getpeername say of a stand-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Names {
    /// The family the program made its socket with: names are given in it.
    pub family: i32,
    /// Its address in the tunnel, once the stack has said.
    pub local: Option<SocketAddr>,
    pub remote: SocketAddr,
    /// Connected: false until the connect succeeded (getpeername: ENOTCONN).
    pub connected: bool,
}

impl StandIns {
    fn with<R>(&self, f: impl FnOnce(&mut VecDeque<StandIn>) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A stand-in put in place, its connect answered (`answer`) or not yet.
    pub fn made(&self, inode: u64, names: Names, answer: Option<i32>) {
        self.with(|all| {
            all.retain(|s| s.inode != inode);
            if all.len() >= MAX {
                all.pop_front();
            }
            all.push_back(StandIn { inode, names, answer });
        });
    }

    /// The stack's answer to the stand-in's connect, with its address in the tunnel.
    pub fn answered(&self, inode: u64, errno: i32, local: Option<SocketAddr>) {
        self.with(|all| {
            if let Some(s) = all.iter_mut().find(|s| s.inode == inode) {
                s.answer = Some(errno);
                s.names.connected = errno == 0;
                s.names.local = local.or(s.names.local);
            }
        });
    }

    pub fn forget(&self, inode: u64) {
        self.with(|all| all.retain(|s| s.inode != inode));
    }

    /// SO_ERROR of the stand-in `inode`: its connect's errno, once (then 0), waiting a
    /// moment for an answer not yet had. None: not a stand-in of ours.
    pub fn take_error(&self, inode: u64) -> Option<i32> {
        let deadline = Instant::now() + ANSWER_WAIT;
        loop {
            let answer = self.with(|all| {
                let s = all.iter_mut().find(|s| s.inode == inode)?;
                let answer = s.answer;
                if answer.is_some() {
                    s.answer = Some(0);
                }
                Some(answer)
            })?;
            match answer {
                Some(errno) => return Some(errno),
                None if Instant::now() >= deadline => return Some(0),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    pub fn names(&self, inode: u64) -> Option<Names> {
        self.with(|all| all.iter().find(|s| s.inode == inode).map(|s| s.names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            family: libc::AF_INET,
            local: None,
            remote: "10.0.0.2:80".parse().unwrap(),
            connected: false,
        }
    }

    #[test]
    fn a_failed_connect_is_told_once() {
        let s = StandIns::default();
        s.made(7, names(), None);
        s.answered(7, libc::ECONNREFUSED, None);
        assert_eq!(s.take_error(7), Some(libc::ECONNREFUSED));
        assert_eq!(s.take_error(7), Some(0));
        assert!(!s.names(7).unwrap().connected);
        assert_eq!(s.take_error(8), None);
    }

    #[test]
    fn a_connect_names_its_addresses() {
        let s = StandIns::default();
        s.made(7, names(), None);
        s.answered(7, 0, Some("10.0.0.1:40000".parse().unwrap()));
        let n = s.names(7).unwrap();
        assert!(n.connected);
        assert_eq!(n.local, Some("10.0.0.1:40000".parse().unwrap()));
        assert_eq!(s.take_error(7), Some(0));
        s.forget(7);
        assert_eq!(s.names(7), None);
    }

    #[test]
    fn the_oldest_are_forgotten() {
        let s = StandIns::default();
        for i in 0..MAX as u64 + 10 {
            s.made(i, names(), Some(0));
        }
        assert_eq!(s.names(0), None);
        assert!(s.names(MAX as u64 + 9).is_some());
    }
}
