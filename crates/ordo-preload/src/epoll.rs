//! The epoll registrations of sockets that may yet be swapped. A socket registered with an
//! epoll instance before it connects would lose its registration when the swap closes its
//! file (the kernel drops an epoll item with its file), and the program would wait forever:
//! so the registrations of sockets are remembered, and made again on the stand-in.

use crate::real;
use std::sync::Mutex;

/// Registrations remembered; the oldest is forgotten beyond.
const MAX: usize = 4096;

#[derive(Clone, Copy)]
struct Registration {
    epfd: i32,
    fd: i32,
    /// The socket's inode when registered: a closed and reused descriptor number is another
    /// socket, whose registration this is not.
    inode: u64,
    events: u32,
    data: u64,
}

static TABLE: Mutex<Vec<Registration>> = Mutex::new(Vec::new());

/// Notes a successful epoll_ctl on a socket.
pub fn note(epfd: i32, op: i32, fd: i32, event: Option<libc::epoll_event>) {
    let Some(inode) = crate::sockets::socket_inode(fd) else {
        return;
    };
    let mut t = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    t.retain(|r| !(r.epfd == epfd && r.fd == fd));
    if op == libc::EPOLL_CTL_DEL {
        return;
    }
    let Some(e) = event else { return };
    if t.len() >= MAX {
        t.remove(0);
    }
    t.push(Registration {
        epfd,
        fd,
        inode,
        events: e.events,
        data: e.u64,
    });
}

/// Makes again, on `fd`'s new file, the registrations the socket of inode `old` had under
/// that number.
pub fn carry_over(fd: i32, old: u64, new: u64) {
    let mut t = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    for r in t.iter_mut().filter(|r| r.fd == fd && r.inode == old) {
        let mut e = libc::epoll_event {
            events: r.events,
            u64: r.data,
        };
        // SAFETY: a valid epoll_event for the program's epoll instance and descriptor.
        unsafe { real::epoll_ctl(r.epfd, libc::EPOLL_CTL_ADD, fd, &mut e) };
        r.inode = new;
    }
}
