//! The kernel's answers for the peers' endpoints ([`route::hop`]), kept current for the
//! threads that send: a thread of its own asks the kernel about each address they send to,
//! asks again soon after the kernel announces a change of links, neighbours or routes, and
//! retries each second the addresses whose next hop is not resolved yet. Senders read the
//! answers under a read lock and never wait for the kernel: an address without an answer
//! goes through the kernel's socket meanwhile.

use super::route::{self, Hop};
use futures::StreamExt;
use rtnetlink::sys::{AsyncSocket, SocketAddr};
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// The addresses kept at most: beyond, new ones go through the kernel for good.
const MAX_ADDRESSES: usize = 4096;
/// How often unresolved next hops are asked for again.
const RETRY: Duration = Duration::from_secs(1);
/// How soon after the kernel announces a change everything is asked for again: changes
/// come in bursts (a link going down takes its routes and neighbours with it).
const SETTLE: Duration = Duration::from_millis(20);
/// Requests waiting for the thread; beyond, a request is dropped (and made again by the
/// sender's next datagram).
const REQUESTS: usize = 256;

/// rtnetlink multicast groups (`RTMGRP_*` in include/uapi/linux/rtnetlink.h).
const GROUPS: u32 = 0x1 /* LINK */ | 0x4 /* NEIGH */ | 0x40 /* IPV4_ROUTE */ | 0x400 /* IPV6_ROUTE */;

/// What is known of an address: its hop, or that it has none usable yet (no route, or the
/// next hop not resolved).
type Known = HashMap<IpAddr, Option<Hop>>;

pub struct Paths {
    known: Arc<RwLock<Known>>,
    requests: Option<tokio::sync::mpsc::Sender<IpAddr>>,
    /// The thread, made ready where the port is made (its netlink socket in that network
    /// namespace) and started at the first look-up: after the daemon has dropped its
    /// privileges, which are each thread's own (capabilities, no_new_privs), so that no
    /// thread keeps what the process gave up.
    pending: Mutex<Option<Pending>>,
    started: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What starts the thread.
type Pending = Box<dyn FnOnce() -> io::Result<JoinHandle<()>> + Send>;

impl Paths {
    /// Makes ready the thread, in the calling thread's network namespace; it starts at the
    /// first look-up.
    pub fn start() -> io::Result<Paths> {
        let known = Arc::new(RwLock::new(Known::new()));
        let (requests, asked) = tokio::sync::mpsc::channel(REQUESTS);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (conn, handle, changes) = {
            let _enter = rt.enter();
            let (mut conn, handle, changes) = rtnetlink::new_connection()?;
            conn.socket_mut().socket_mut().bind(&SocketAddr::new(0, GROUPS))?;
            (conn, handle, changes)
        };
        let shared = known.clone();
        let pending: Pending = Box::new(move || {
            std::thread::Builder::new().name("ordo-paths".into()).spawn(move || {
                rt.block_on(async move {
                    tokio::spawn(conn);
                    keep(handle, shared, asked, changes).await;
                })
            })
        });
        Ok(Paths {
            known,
            requests: Some(requests),
            pending: Mutex::new(Some(pending)),
            started: AtomicBool::new(false),
            thread: Mutex::new(None),
        })
    }

    /// Starts the thread if it is not yet.
    fn ensure_started(&self) {
        if self.started.load(Ordering::Acquire) {
            return;
        }
        let Some(start) = self.pending.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        match start() {
            Ok(t) => *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t),
            // Every datagram then goes through the kernel's socket.
            Err(e) => log::error!("cannot start the thread that follows the kernel's routes: {e}"),
        }
        self.started.store(true, Ordering::Release);
    }

    /// How a datagram to `to` leaves, if the kernel has said and its next hop is resolved;
    /// otherwise None, and the thread is asked (once per address) to find out.
    pub fn get(&self, to: IpAddr) -> Option<Hop> {
        self.ensure_started();
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        match known.get(&to) {
            Some(hop) => *hop,
            None => {
                drop(known);
                if let Some(r) = &self.requests {
                    // Full: the next datagram asks again.
                    let _ = r.try_send(to);
                }
                None
            }
        }
    }
}

impl Drop for Paths {
    fn drop(&mut self) {
        // The thread ends when its requests end.
        self.requests.take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

async fn ask(handle: &rtnetlink::Handle, known: &RwLock<Known>, to: IpAddr) {
    // An error (the kernel's answer unreadable) counts as no answer, asked again later.
    let hop = route::hop(handle.clone(), to).await.ok().flatten();
    let hop = hop.filter(|h| h.to_mac.is_some());
    known.write().unwrap_or_else(|p| p.into_inner()).insert(to, hop);
}

/// The thread's loop: answers requests, notes the kernel's changes, and asks again for
/// everything soon after a change ([`SETTLE`]) and for what is unresolved each [`RETRY`];
/// until the requests end.
async fn keep<C>(
    handle: rtnetlink::Handle,
    known: Arc<RwLock<Known>>,
    mut asked: tokio::sync::mpsc::Receiver<IpAddr>,
    mut changes: futures::channel::mpsc::UnboundedReceiver<C>,
) {
    use tokio::time::Instant;
    let mut changed = false;
    let mut due = Instant::now() + RETRY;
    loop {
        tokio::select! {
            request = asked.recv() => {
                let Some(to) = request else { return };
                let full = known.read().unwrap_or_else(|p| p.into_inner()).len() >= MAX_ADDRESSES;
                if !full {
                    ask(&handle, &known, to).await;
                }
            }
            Some(_) = changes.next() => {
                changed = true;
                due = due.min(Instant::now() + SETTLE);
            }
            _ = tokio::time::sleep_until(due) => {
                let again: Vec<IpAddr> = {
                    let k = known.read().unwrap_or_else(|p| p.into_inner());
                    k.iter().filter(|(_, h)| changed || h.is_none()).map(|(a, _)| *a).collect()
                };
                changed = false;
                due = Instant::now() + RETRY;
                for to in again {
                    ask(&handle, &known, to).await;
                }
            }
        }
    }
}
