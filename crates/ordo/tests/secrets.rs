//! No copy of a key is left in freed memory by the UAPI: a `set` carrying a private key and 40
//! peers with a preshared key, a `set` removing half of them, then a `get` that returns the
//! keys, served by a real device, then the device dropped, while the allocator looks at every
//! block freed for any 8 bytes of either key (raw) or 16 of their hex. Needs root (a TUN
//! device, in a network namespace of its own). `make test` runs it in the debug and the
//! release build: the optimiser changes where moved bytes and stale stack end up.

use ordo::device::Device;
use ordo::settings::InterfaceSettings;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use zeroize::Zeroizing;

const PRIVATE_HEX: &str = "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a";
const PRESHARED_HEX: &str = "188515093e952f5f22e865cef3012e72f8b5f0b598ac0309d5dacce3b70fcf52";
/// Peers' public keys: this one with its last byte replaced by the peer's number.
const PEER_HEX: &str = "b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85a8e75a33";
const PEERS: usize = 40;

fn peer_hex(i: usize) -> String {
    format!("{}{i:02x}", &PEER_HEX[..62])
}

/// The allocator of this test binary: the system's, looking at what is freed while armed.
struct Scanning;

static ARMED: AtomicBool = AtomicBool::new(false);
static HITS: AtomicUsize = AtomicUsize::new(0);
/// The size of the last block found holding a piece, to tell which allocation it was.
static LAST_HIT_SIZE: AtomicUsize = AtomicUsize::new(0);
/// Pieces of the secrets to look for (set before arming; never freed while armed).
static PIECES: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

// SAFETY: every call is passed to System unchanged; the scan only reads the block being freed,
// which is still allocated and `layout.size()` bytes long.
unsafe impl GlobalAlloc for Scanning {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ARMED.load(Ordering::Relaxed) {
            // Disarmed while scanning: the lock and the search allocate nothing, but be sure.
            ARMED.store(false, Ordering::Relaxed);
            let block = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            if let Ok(pieces) = PIECES.try_lock() {
                let found = pieces.iter().enumerate().find_map(|(i, p)| {
                    let at = block.windows(p.len()).position(|w| w == p.as_slice())?;
                    Some((i, at))
                });
                if let Some((piece, at)) = found {
                    HITS.fetch_add(1, Ordering::Relaxed);
                    LAST_HIT_SIZE.store(layout.size(), Ordering::Relaxed);
                    if std::env::var_os("ORDO_SECRETS_BACKTRACE").is_some() {
                        let backtrace = std::backtrace::Backtrace::force_capture();
                        eprintln!(
                            "piece {piece} at byte {at} of a {}-byte block:\n{backtrace}",
                            layout.size()
                        );
                    }
                }
            }
            ARMED.store(true, Ordering::Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Scanning = Scanning;

/// Every temporary that holds a key is wiped before it is freed: a block the test itself left
/// behind and the allocator handed out again would be found later, in another's hands.
fn pieces_of(hex: &str) -> Vec<Vec<u8>> {
    let raw: Zeroizing<Vec<u8>> = Zeroizing::new(
        (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect(),
    );
    let mut out: Vec<Vec<u8>> = raw.chunks(8).map(<[u8]>::to_vec).collect();
    out.extend(hex.as_bytes().chunks(16).map(<[u8]>::to_vec));
    out
}

/// A reader that hands over at most seven bytes at a time.
struct Trickle<'a>(&'a [u8]);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.len().min(out.len()).min(7);
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn no_key_is_left_in_freed_memory_by_the_uapi() {
    // SAFETY: geteuid reads a process attribute.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    // The device's TUN and sockets live in a namespace of this thread's own.
    // SAFETY: unshare affects only the calling thread's network namespace.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    {
        let mut pieces = PIECES.lock().unwrap();
        pieces.reserve(16);
        pieces.extend(pieces_of(PRIVATE_HEX));
        pieces.extend(pieces_of(PRESHARED_HEX));
    }
    let device = Device::create("ordosecrets", &InterfaceSettings::default()).expect("a TUN device");
    let mut request = Zeroizing::new(String::with_capacity(16 * 1024));
    {
        use std::fmt::Write;
        // Enough peers, each with the preshared key, that the peer table's nodes split when
        // they are added and merge when half are removed: moves of peers within the table.
        let _ = write!(request, "set=1\nprivate_key={PRIVATE_HEX}\nlisten_port=0\n");
        for i in 0..PEERS {
            let _ = write!(
                request,
                "public_key={}\npreshared_key={PRESHARED_HEX}\nallowed_ip=10.9.{i}.2/32\n",
                peer_hex(i)
            );
        }
        let _ = write!(request, "\nset=1\n");
        for i in 0..PEERS / 2 {
            let _ = write!(request, "public_key={}\nremove=true\n", peer_hex(i));
        }
        let _ = write!(request, "\nget=1\n\n");
    }
    let mut reply = Zeroizing::new(Vec::with_capacity(1 << 16));
    ARMED.store(true, Ordering::SeqCst);
    // Seven bytes a read, as a socket may hand a request over: key lines arrive in pieces.
    let reader = ordo::secret_text::SecretReader::new(Trickle(request.as_bytes()));
    ordo::uapi::serve_requests(&device, reader, &mut *reply).expect("served");
    drop(device);
    ARMED.store(false, Ordering::SeqCst);
    let reply = std::str::from_utf8(&reply).unwrap();
    // Two sets answered, then the get.
    assert!(
        reply.starts_with("errno=0\n\nerrno=0\n\nprivate_key=e84b5a6d"),
        "{reply}"
    );
    assert_eq!(
        reply.matches(&format!("preshared_key={PRESHARED_HEX}")).count(),
        PEERS / 2,
        "{reply}"
    );
    assert_eq!(
        HITS.load(Ordering::SeqCst),
        0,
        "blocks freed with a piece of a key in them, the last of {} bytes (ORDO_SECRETS_BACKTRACE=1 says where)",
        LAST_HIT_SIZE.load(Ordering::SeqCst)
    );
}
