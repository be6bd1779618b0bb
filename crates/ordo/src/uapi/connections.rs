//! The UAPI socket's open connections, bounded: at most [`MAX_CONNECTIONS`], each on a thread
//! of its own. One beyond them sheds the oldest connection that is idle (nothing of a request
//! read since it connected or since its last answer), so that clients that connect and say
//! nothing cannot keep `wg` out; if every one is busy, the new one is closed at once.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The open connections, the oldest first.
#[derive(Default, Clone)]
pub struct Connections {
    open: Arc<Mutex<BTreeMap<u64, Held>>>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

struct Held {
    /// A handle on the connection, to shut it down when shed.
    stream: UnixStream,
    busy: Arc<AtomicBool>,
}

/// A connection's place in the table, given back when dropped, and whether it is busy.
pub struct Slot {
    id: u64,
    connections: Connections,
    pub busy: Arc<AtomicBool>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Held>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for `stream`, shedding the oldest idle connection if all are taken; None if
    /// every one is busy.
    pub fn admit(&self, stream: &UnixStream) -> Option<Slot> {
        let handle = stream.try_clone().ok()?;
        let mut open = self.lock();
        if open.len() >= MAX_CONNECTIONS {
            let idle = open
                .iter()
                .find(|(_, h)| !h.busy.load(Ordering::Acquire))
                .map(|(id, _)| *id);
            let shed = open.remove(&idle?)?;
            // Its thread's read ends, and the thread with it.
            let _ = shed.stream.shutdown(Shutdown::Both);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let busy = Arc::new(AtomicBool::new(false));
        open.insert(
            id,
            Held {
                stream: handle,
                busy: busy.clone(),
            },
        );
        Some(Slot {
            id,
            connections: self.clone(),
            busy,
        })
    }

    /// How many are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A reader that marks its connection busy as soon as a byte of a request arrives.
pub struct MarkBusy<R> {
    pub inner: R,
    pub busy: Arc<AtomicBool>,
}

impl<R: Read> Read for MarkBusy<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.busy.store(true, Ordering::Release);
        }
        Ok(n)
    }
}

impl<R: BufRead> BufRead for MarkBusy<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let buf = self.inner.fill_buf()?;
        if !buf.is_empty() {
            self.busy.store(true, Ordering::Release);
        }
        Ok(buf)
    }

    fn consume(&mut self, amt: usize) {
        self.inner.consume(amt)
    }
}

/// A writer that marks its connection idle once an answer is written whole.
pub struct MarkIdle<W> {
    pub inner: W,
    pub busy: Arc<AtomicBool>,
}

impl<W: Write> Write for MarkIdle<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all(buf)?;
        self.busy.store(false, Ordering::Release);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Idle connections are shed oldest first to make room; busy ones are not, and with every
    /// one busy a new connection gets no place.
    #[test]
    fn idle_connections_are_shed_oldest_first() {
        let table = Connections::default();
        let mut kept = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let slot = table.admit(&ours).unwrap();
            kept.push((slot, ours, theirs));
        }
        // The first is busy (a request half read): the second, idle, is shed.
        kept[0].0.busy.store(true, Ordering::Release);
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let _new = table.admit(&ours).expect("an idle connection makes room");
        assert_eq!(table.len(), MAX_CONNECTIONS);
        let mut byte = [0u8; 1];
        assert_eq!(
            kept[1].1.read(&mut byte).unwrap(),
            0,
            "the oldest idle one is shut down"
        );
        kept[0].1.set_nonblocking(true).unwrap();
        assert!(
            kept[0].1.read(&mut byte).is_err(),
            "the busy one is untouched (would block)"
        );
        // Every one busy: no place.
        for (slot, _, _) in &kept {
            slot.busy.store(true, Ordering::Release);
        }
        _new.busy.store(true, Ordering::Release);
        let (ours, _theirs) = UnixStream::pair().unwrap();
        assert!(table.admit(&ours).is_none());
        drop(kept);
        assert_eq!(table.len(), 1, "places are given back");
    }
}
