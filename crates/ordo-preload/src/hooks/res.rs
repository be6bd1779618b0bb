//! The resolver's raw interface and the asynchronous lookup, with `DNS =` set: res_query,
//! res_search, res_querydomain and res_send (with their res_n forms and the `__res_` names
//! glibc's header gives them), and getaddrinfo_a. glibc's run their queries through internal
//! calls a preload library cannot see, to the host's name servers; these ask the tunnel's
//! instead ([`resolve::exchange`]). Without `DNS =`, they are the C library's.

use crate::resolve;
use libc::{c_char, c_int, c_uchar, c_void};
use simple_dns::{Name, Packet, PacketFlag, Question, CLASS, QCLASS, QTYPE, TYPE};
use std::ffi::CStr;

/// h_errno's values (netdb.h).
const HOST_NOT_FOUND: c_int = 1;
const TRY_AGAIN: c_int = 2;
const NO_RECOVERY: c_int = 3;
const NO_DATA: c_int = 4;

extern "C" {
    fn __h_errno_location() -> *mut c_int;
}

fn set_h_errno(value: c_int) {
    // SAFETY: the C library's thread-local h_errno.
    unsafe { *__h_errno_location() = value };
}

type QueryFn = unsafe extern "C" fn(*const c_char, c_int, c_int, *mut c_uchar, c_int) -> c_int;
type SendFn = unsafe extern "C" fn(*const c_uchar, c_int, *mut c_uchar, c_int) -> c_int;
type QueryDomainFn = unsafe extern "C" fn(*const c_char, *const c_char, c_int, c_int, *mut c_uchar, c_int) -> c_int;

/// The C library's function `name` (NUL-terminated), for calls without `DNS =`.
fn real(name: &'static [u8]) -> usize {
    // SAFETY: a NUL-terminated literal; dlsym only reads it.
    let a = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if a == 0 {
        std::process::abort();
    }
    a
}

/// A query for `name`, of `class` and `type`, as res_mkquery(3) makes it: recursion desired.
fn query(name: &str, class: c_int, ty: c_int) -> Option<Vec<u8>> {
    let mut id = [0u8; 2];
    // SAFETY: getrandom writes at most the 2 bytes of `id`.
    unsafe { libc::getrandom(id.as_mut_ptr().cast(), 2, 0) };
    let mut q = Packet::new_query(u16::from_ne_bytes(id));
    q.set_flags(PacketFlag::RECURSION_DESIRED);
    let class = QCLASS::CLASS(CLASS::try_from(u16::try_from(class).ok()?).ok()?);
    let qtype = QTYPE::TYPE(TYPE::from(u16::try_from(ty).ok()?));
    q.questions
        .push(Question::new(Name::new(name).ok()?, qtype, class, false));
    q.build_bytes_vec().ok()
}

/// Copies `answer` to the caller's buffer of `room` bytes; returns its length, or -1 with
/// h_errno set as res_query(3) does for an answer that says no.
///
/// # Safety
/// `out` points to `room` writable bytes.
unsafe fn give(answer: &[u8], out: *mut c_uchar, room: c_int) -> c_int {
    let n = answer.len().min(room.max(0) as usize);
    // SAFETY: the caller's buffer has `room` bytes; we write at most that many.
    unsafe { std::ptr::copy_nonoverlapping(answer.as_ptr(), out, n) };
    let rcode = answer.get(3).map_or(2, |b| b & 0x0f);
    let answers = answer.get(6..8).map_or(0, |a| u16::from_be_bytes([a[0], a[1]]));
    let h = match rcode {
        0 if answers > 0 => return n as c_int,
        0 => NO_DATA,
        3 => HOST_NOT_FOUND,
        2 => TRY_AGAIN,
        _ => NO_RECOVERY,
    };
    set_h_errno(h);
    -1
}

/// res_query(3) through the tunnel's servers.
fn tunnel_query(dns: &ordo_attach::Dns, name: &str, class: c_int, ty: c_int, out: *mut c_uchar, room: c_int) -> c_int {
    let Some(q) = query(name, class, ty) else {
        set_h_errno(NO_RECOVERY);
        return -1;
    };
    match resolve::exchange(dns, &q) {
        // SAFETY: the caller's buffer, as res_query(3) promises it.
        Some(answer) => unsafe { give(&answer, out, room) },
        None => {
            set_h_errno(TRY_AGAIN);
            -1
        }
    }
}

fn name_of(p: *const c_char) -> Option<String> {
    // SAFETY: a NUL-terminated string, as the resolver's functions take.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// res_query(3).
///
/// # Safety
/// As res_query(3).
#[no_mangle]
pub unsafe extern "C" fn res_query(
    dname: *const c_char,
    class: c_int,
    ty: c_int,
    answer: *mut c_uchar,
    anslen: c_int,
) -> c_int {
    match (resolve::settings(), name_of(dname)) {
        (Some(dns), Some(name)) => {
            std::panic::catch_unwind(|| tunnel_query(dns, &name, class, ty, answer, anslen)).unwrap_or(-1)
        }
        _ => {
            // SAFETY: the C library's res_query, the caller's arguments.
            unsafe { std::mem::transmute::<usize, QueryFn>(real(b"res_query\0"))(dname, class, ty, answer, anslen) }
        }
    }
}

/// res_search(3): the name, or it with each search domain (`DNS =`'s), as glibc tries them.
///
/// # Safety
/// As res_search(3).
#[no_mangle]
pub unsafe extern "C" fn res_search(
    dname: *const c_char,
    class: c_int,
    ty: c_int,
    answer: *mut c_uchar,
    anslen: c_int,
) -> c_int {
    match (resolve::settings(), name_of(dname)) {
        (Some(dns), Some(name)) => std::panic::catch_unwind(|| {
            let mut last = -1;
            for candidate in resolve::candidates(dns, &name) {
                last = tunnel_query(dns, &candidate, class, ty, answer, anslen);
                if last >= 0 {
                    break;
                }
            }
            last
        })
        .unwrap_or(-1),
        _ => {
            // SAFETY: the C library's res_search, the caller's arguments.
            unsafe { std::mem::transmute::<usize, QueryFn>(real(b"res_search\0"))(dname, class, ty, answer, anslen) }
        }
    }
}

/// res_querydomain(3): `name.domain`.
///
/// # Safety
/// As res_querydomain(3).
#[no_mangle]
pub unsafe extern "C" fn res_querydomain(
    name: *const c_char,
    domain: *const c_char,
    class: c_int,
    ty: c_int,
    answer: *mut c_uchar,
    anslen: c_int,
) -> c_int {
    match (resolve::settings(), name_of(name)) {
        (Some(dns), Some(n)) => {
            let full = match name_of(domain) {
                Some(d) => format!("{n}.{d}"),
                None => n,
            };
            std::panic::catch_unwind(|| tunnel_query(dns, &full, class, ty, answer, anslen)).unwrap_or(-1)
        }
        _ => {
            // SAFETY: the C library's res_querydomain, the caller's arguments.
            unsafe {
                std::mem::transmute::<usize, QueryDomainFn>(real(b"res_querydomain\0"))(
                    name, domain, class, ty, answer, anslen,
                )
            }
        }
    }
}

/// res_send(3): a whole query message, its answer.
///
/// # Safety
/// As res_send(3).
#[no_mangle]
pub unsafe extern "C" fn res_send(msg: *const c_uchar, msglen: c_int, answer: *mut c_uchar, anslen: c_int) -> c_int {
    let Some(dns) = resolve::settings().filter(|_| !msg.is_null() && msglen > 0) else {
        // SAFETY: the C library's res_send, the caller's arguments.
        return unsafe { std::mem::transmute::<usize, SendFn>(real(b"res_send\0"))(msg, msglen, answer, anslen) };
    };
    // SAFETY: the caller's message of `msglen` bytes.
    let q = unsafe { std::slice::from_raw_parts(msg, msglen as usize) }.to_vec();
    match std::panic::catch_unwind(|| resolve::exchange(dns, &q)) {
        Ok(Some(a)) => {
            let n = a.len().min(anslen.max(0) as usize);
            // SAFETY: the caller's buffer of `anslen` bytes; at most that many written.
            unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), answer, n) };
            n as c_int
        }
        _ => {
            set_h_errno(TRY_AGAIN);
            // SAFETY: errno is the thread's own.
            unsafe { *libc::__errno_location() = libc::ETIMEDOUT };
            -1
        }
    }
}

// The names glibc's resolv.h gives these (`#define res_query __res_query`), and the forms
// with a resolver state, which is not used (the tunnel's servers are the state).

/// # Safety
/// As res_query(3).
#[no_mangle]
pub unsafe extern "C" fn __res_query(d: *const c_char, c: c_int, t: c_int, a: *mut c_uchar, l: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { res_query(d, c, t, a, l) }
}

/// # Safety
/// As res_search(3).
#[no_mangle]
pub unsafe extern "C" fn __res_search(d: *const c_char, c: c_int, t: c_int, a: *mut c_uchar, l: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { res_search(d, c, t, a, l) }
}

/// # Safety
/// As res_querydomain(3).
#[no_mangle]
pub unsafe extern "C" fn __res_querydomain(
    n: *const c_char,
    d: *const c_char,
    c: c_int,
    t: c_int,
    a: *mut c_uchar,
    l: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { res_querydomain(n, d, c, t, a, l) }
}

/// # Safety
/// As res_send(3).
#[no_mangle]
pub unsafe extern "C" fn __res_send(m: *const c_uchar, ml: c_int, a: *mut c_uchar, l: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { res_send(m, ml, a, l) }
}

type NQueryFn = unsafe extern "C" fn(*mut c_void, *const c_char, c_int, c_int, *mut c_uchar, c_int) -> c_int;
type NSendFn = unsafe extern "C" fn(*mut c_void, *const c_uchar, c_int, *mut c_uchar, c_int) -> c_int;

/// The form of `$plain` with a resolver state (res_nquery, res_nsearch): the state is the
/// C library's own without `DNS =`, and not used with it.
macro_rules! with_state {
    ($name:ident, $real:literal, $plain:ident) => {
        /// # Safety
        /// As the resolver's function of this name (resolv.h).
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            state: *mut c_void,
            d: *const c_char,
            c: c_int,
            t: c_int,
            a: *mut c_uchar,
            l: c_int,
        ) -> c_int {
            if resolve::settings().is_none() {
                // SAFETY: the C library's function of this name, the caller's arguments.
                return unsafe { std::mem::transmute::<usize, NQueryFn>(real($real))(state, d, c, t, a, l) };
            }
            // SAFETY: the caller's arguments.
            unsafe { $plain(d, c, t, a, l) }
        }
    };
}

with_state!(res_nquery, b"res_nquery\0", res_query);
with_state!(res_nsearch, b"res_nsearch\0", res_search);

/// # Safety
/// As res_nsend(3).
#[no_mangle]
pub unsafe extern "C" fn res_nsend(
    state: *mut c_void,
    m: *const c_uchar,
    ml: c_int,
    a: *mut c_uchar,
    l: c_int,
) -> c_int {
    if resolve::settings().is_none() {
        // SAFETY: the C library's res_nsend, the caller's arguments.
        return unsafe { std::mem::transmute::<usize, NSendFn>(real(b"res_nsend\0"))(state, m, ml, a, l) };
    }
    // SAFETY: the caller's arguments.
    unsafe { res_send(m, ml, a, l) }
}

/// # Safety
/// As res_nquery(3).
#[no_mangle]
pub unsafe extern "C" fn __res_nquery(
    s: *mut c_void,
    d: *const c_char,
    c: c_int,
    t: c_int,
    a: *mut c_uchar,
    l: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { res_nquery(s, d, c, t, a, l) }
}

/// # Safety
/// As res_nsearch(3).
#[no_mangle]
pub unsafe extern "C" fn __res_nsearch(
    s: *mut c_void,
    d: *const c_char,
    c: c_int,
    t: c_int,
    a: *mut c_uchar,
    l: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { res_nsearch(s, d, c, t, a, l) }
}

/// # Safety
/// As res_nsend(3).
#[no_mangle]
pub unsafe extern "C" fn __res_nsend(s: *mut c_void, m: *const c_uchar, ml: c_int, a: *mut c_uchar, l: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { res_nsend(s, m, ml, a, l) }
}

/// glibc's `struct gaicb` (netdb.h): a request of getaddrinfo_a(3), whose result and error
/// (read by gai_error) are written into it.
#[repr(C)]
pub struct Gaicb {
    ar_name: *const c_char,
    ar_service: *const c_char,
    ar_request: *const libc::addrinfo,
    ar_result: *mut libc::addrinfo,
    ret: c_int,
    reserved: [c_int; 5],
}

type GaiFn = unsafe extern "C" fn(c_int, *mut *mut Gaicb, c_int, *mut libc::sigevent) -> c_int;

/// getaddrinfo_a(3): each request answered through the tunnel's servers (the library's
/// getaddrinfo), before it returns; then, asked not to wait (GAI_NOWAIT), the notification
/// the caller asked for: a signal, or its function on a thread of its own.
///
/// # Safety
/// As getaddrinfo_a(3).
#[no_mangle]
pub unsafe extern "C" fn getaddrinfo_a(
    mode: c_int,
    list: *mut *mut Gaicb,
    nitems: c_int,
    sevp: *mut libc::sigevent,
) -> c_int {
    if resolve::settings().is_none() || list.is_null() {
        // SAFETY: the C library's getaddrinfo_a, the caller's arguments.
        return unsafe { std::mem::transmute::<usize, GaiFn>(real(b"getaddrinfo_a\0"))(mode, list, nitems, sevp) };
    }
    for i in 0..nitems.max(0) as usize {
        // SAFETY: `list` has `nitems` entries, each null or a request, as getaddrinfo_a(3) says.
        let Some(r) = (unsafe { (*list.add(i)).as_mut() }) else {
            continue;
        };
        // SAFETY: the request's own strings and hints, and its result's place.
        r.ret = unsafe { super::resolver::getaddrinfo(r.ar_name, r.ar_service, r.ar_request, &mut r.ar_result) };
    }
    const GAI_NOWAIT: c_int = 1;
    // SAFETY: `sevp` is null or the caller's notification, as getaddrinfo_a(3) says.
    if let (GAI_NOWAIT, Some(e)) = (mode, unsafe { sevp.as_ref() }) {
        notify(e);
    }
    0
}

/// The notification `e` asks for, now.
fn notify(e: &libc::sigevent) {
    match e.sigev_notify {
        libc::SIGEV_SIGNAL => {
            // SAFETY: sigqueue to this process with the caller's value.
            unsafe { libc::sigqueue(libc::getpid(), e.sigev_signo, e.sigev_value) };
        }
        libc::SIGEV_THREAD => {
            // struct sigevent: the value, the signal, the kind, then (a union) the function
            // and its thread's attributes, at 16 bytes in on 64-bit Linux.
            // SAFETY: `e` is a whole struct sigevent (64 bytes); the function pointer is at
            // offset 16 for SIGEV_THREAD.
            let f =
                unsafe { std::ptr::read_unaligned((e as *const libc::sigevent).cast::<u8>().add(16).cast::<usize>()) };
            if f == 0 {
                return;
            }
            let value = e.sigev_value.sival_ptr as usize;
            std::thread::spawn(move || {
                // SAFETY: the caller's notification function, taking a union sigval (a
                // pointer-sized value).
                let f = unsafe { std::mem::transmute::<usize, extern "C" fn(usize)>(f) };
                f(value);
            });
        }
        _ => {}
    }
}
