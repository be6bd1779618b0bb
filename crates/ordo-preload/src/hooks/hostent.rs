//! The older resolver interface: gethostbyname, gethostbyname2 and their `_r` forms, and
//! gethostbyaddr and gethostbyaddr_r. With the tunnel's name servers set (`DNS =`) they are
//! answered as getaddrinfo and getnameinfo are ([`crate::resolve`]): otherwise a program
//! using them (Perl's gethostbyname, python's gethostbyname_ex and gethostbyaddr, older C
//! programs) would ask the host's servers, and its names would leak outside the tunnel.
//! Numbers, names in `/etc/hosts`, loopback addresses, and everything without `DNS =` are
//! the C library's.
//!
//! A `struct hostent` and everything it points to are laid out in the caller's buffer (the
//! `_r` forms; ERANGE when it is too small) or in one static buffer (the others, whose result
//! stays valid until the next call, as the C library's).

use crate::{real, resolve};
use libc::{c_char, c_int, c_void, hostent, socklen_t};
use std::cell::UnsafeCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;

/// h_errno's values (netdb.h).
const HOST_NOT_FOUND: c_int = 1;
const TRY_AGAIN: c_int = 2;
const NO_DATA: c_int = 4;

extern "C" {
    /// Where the calling thread's h_errno is (glibc and musl).
    fn __h_errno_location() -> *mut c_int;
}

/// What a lookup through the tunnel gave: the entry's names and addresses, or h_errno.
struct Entry {
    name: String,
    aliases: Vec<String>,
    family: c_int,
    addresses: Vec<IpAddr>,
}

/// The h_errno of a [`resolve`] error.
fn h_errno_of(eai: c_int) -> c_int {
    match eai {
        libc::EAI_AGAIN => TRY_AGAIN,
        resolve::EAI_NODATA => NO_DATA,
        _ => HOST_NOT_FOUND,
    }
}

/// The entry of `name`'s addresses of `family` through the tunnel; None: the C library's.
fn by_name(name: *const c_char, family: c_int) -> Option<Result<Entry, c_int>> {
    let dns = resolve::settings()?;
    if name.is_null() || !matches!(family, libc::AF_INET | libc::AF_INET6) {
        return None;
    }
    // SAFETY: a NUL-terminated string, as gethostbyname(3) promises.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_str().ok()?;
    if !crate::resolve::resolved_by_tunnel(name, None) {
        return None;
    }
    let found = std::panic::catch_unwind(|| resolve::lookup(dns, name, family)).ok()?;
    Some(found.map_err(h_errno_of).map(|f| {
        let aliases = (f.canonical != name).then(|| name.to_string()).into_iter().collect();
        Entry {
            name: f.canonical,
            aliases,
            family,
            addresses: (f.addresses.into_iter())
                .filter(|a| a.is_ipv6() == (family == libc::AF_INET6))
                .collect(),
        }
    }))
}

/// The entry of the address at `addr` (`len` bytes of `family`) through the tunnel; None:
/// the C library's.
fn by_address(addr: *const c_void, len: socklen_t, family: c_int) -> Option<Result<Entry, c_int>> {
    let dns = resolve::settings()?;
    if addr.is_null() {
        return None;
    }
    let ip: IpAddr = match (family, len) {
        // SAFETY: `len` readable bytes at `addr`, as gethostbyaddr(3) promises.
        (libc::AF_INET, 4) => Ipv4Addr::from(unsafe { *addr.cast::<[u8; 4]>() }).into(),
        // SAFETY: as above.
        (libc::AF_INET6, 16) => Ipv6Addr::from(unsafe { *addr.cast::<[u8; 16]>() }).into(),
        _ => return None,
    };
    if ip.is_loopback() || resolve::hosts_name_of(ip).is_some() {
        return None;
    }
    let name = std::panic::catch_unwind(|| resolve::reverse(dns, ip)).ok()?;
    Some(name.map_err(h_errno_of).map(|name| Entry {
        name,
        aliases: Vec::new(),
        family,
        addresses: vec![ip],
    }))
}

/// Lays `e` out in `ret` and the `len` bytes at `buf`: the pointer arrays first (aligned),
/// then the addresses, then the names. False if it does not fit.
///
/// # Safety
/// `ret` writable; `len` writable bytes at `buf`.
unsafe fn fill(e: &Entry, ret: *mut hostent, buf: *mut c_char, len: usize) -> bool {
    let word = std::mem::size_of::<*mut c_char>();
    let addr_len = if e.family == libc::AF_INET6 { 16 } else { 4 };
    let start = buf.align_offset(word);
    let pointers = (e.aliases.len() + 1 + e.addresses.len() + 1) * word;
    let names: usize = std::iter::once(&e.name).chain(&e.aliases).map(|n| n.len() + 1).sum();
    let need = start + pointers + e.addresses.len() * addr_len + names;
    if need > len {
        return false;
    }
    // SAFETY: every write below is within the `need` <= `len` bytes at `buf`, the pointer
    // arrays at a word-aligned offset.
    unsafe {
        let aliases = buf.add(start).cast::<*mut c_char>();
        let addr_list = aliases.add(e.aliases.len() + 1);
        let mut at = buf.add(start + pointers);
        for (i, a) in e.addresses.iter().enumerate() {
            let bytes: Vec<u8> = match a {
                IpAddr::V4(v4) => v4.octets().to_vec(),
                IpAddr::V6(v6) => v6.octets().to_vec(),
            };
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at.cast::<u8>(), addr_len);
            *addr_list.add(i) = at;
            at = at.add(addr_len);
        }
        *addr_list.add(e.addresses.len()) = std::ptr::null_mut();
        let mut put = |s: &str| {
            let p = at;
            std::ptr::copy_nonoverlapping(s.as_ptr(), p.cast::<u8>(), s.len());
            *p.add(s.len()) = 0;
            at = at.add(s.len() + 1);
            p
        };
        let name = put(&e.name);
        for (i, alias) in e.aliases.iter().enumerate() {
            *aliases.add(i) = put(alias);
        }
        *aliases.add(e.aliases.len()) = std::ptr::null_mut();
        *ret = hostent {
            h_name: name,
            h_aliases: aliases,
            h_addrtype: e.family,
            h_length: addr_len as c_int,
            h_addr_list: addr_list,
        };
    }
    true
}

/// The `_r` forms' ending: `found` laid out in the caller's `ret` and `buf`, `*result` and
/// `*h_errnop` set; the return value theirs (0, ERANGE, or ENOENT/EAGAIN for no entry).
///
/// # Safety
/// As gethostbyname_r(3).
unsafe fn reentrant(
    found: Result<Entry, c_int>,
    ret: *mut hostent,
    buf: *mut c_char,
    len: usize,
    result: *mut *mut hostent,
    h_errnop: *mut c_int,
) -> c_int {
    // SAFETY: the caller's pointers, as gethostbyname_r(3) promises them.
    unsafe {
        *result = std::ptr::null_mut();
        match found {
            Ok(e) if fill(&e, ret, buf, len) => {
                *result = ret;
                0
            }
            Ok(_) => {
                *h_errnop = TRY_AGAIN;
                libc::ERANGE
            }
            Err(h) => {
                *h_errnop = h;
                if h == TRY_AGAIN {
                    libc::EAGAIN
                } else {
                    libc::ENOENT
                }
            }
        }
    }
}

/// The buffer of the forms without `_r`.
struct Static {
    host: hostent,
    buf: [c_char; 8192],
}

struct Shared(UnsafeCell<Static>);
// SAFETY: written only under `LOCK`; what it points to after is the caller's to read, as
// with the C library's static buffer.
unsafe impl Sync for Shared {}

static SHARED: Shared = Shared(UnsafeCell::new(Static {
    host: hostent {
        h_name: std::ptr::null_mut(),
        h_aliases: std::ptr::null_mut(),
        h_addrtype: 0,
        h_length: 0,
        h_addr_list: std::ptr::null_mut(),
    },
    buf: [0; 8192],
}));
static LOCK: Mutex<()> = Mutex::new(());

/// The forms without `_r`: `found` in the static buffer, or null with h_errno set.
fn shared(found: Result<Entry, c_int>) -> *mut hostent {
    let _held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let s = SHARED.0.get();
    // SAFETY: the static buffer, written under the lock.
    let filled = match &found {
        Ok(e) => unsafe { fill(e, &mut (*s).host, (*s).buf.as_mut_ptr(), (*s).buf.len()) },
        Err(_) => false,
    };
    if filled {
        // SAFETY: as above.
        return unsafe { &mut (*s).host };
    }
    let h = found.err().unwrap_or(TRY_AGAIN);
    // SAFETY: the calling thread's h_errno.
    unsafe { *__h_errno_location() = h };
    std::ptr::null_mut()
}

/// gethostbyname(3).
///
/// # Safety
/// As gethostbyname(3).
#[no_mangle]
pub unsafe extern "C" fn gethostbyname(name: *const c_char) -> *mut hostent {
    match by_name(name, libc::AF_INET) {
        Some(found) => shared(found),
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::gethostbyname(name) },
    }
}

/// gethostbyname2(3).
///
/// # Safety
/// As gethostbyname2(3).
#[no_mangle]
pub unsafe extern "C" fn gethostbyname2(name: *const c_char, family: c_int) -> *mut hostent {
    match by_name(name, family) {
        Some(found) => shared(found),
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::gethostbyname2(name, family) },
    }
}

/// gethostbyname_r(3).
///
/// # Safety
/// As gethostbyname_r(3).
#[no_mangle]
pub unsafe extern "C" fn gethostbyname_r(
    name: *const c_char,
    ret: *mut hostent,
    buf: *mut c_char,
    len: usize,
    result: *mut *mut hostent,
    h_errnop: *mut c_int,
) -> c_int {
    match by_name(name, libc::AF_INET) {
        // SAFETY: the caller's arguments, as gethostbyname_r(3) promises them.
        Some(found) => unsafe { reentrant(found, ret, buf, len, result, h_errnop) },
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::gethostbyname_r(name, ret, buf, len, result, h_errnop) },
    }
}

/// gethostbyname2_r(3).
///
/// # Safety
/// As gethostbyname2_r(3).
#[no_mangle]
pub unsafe extern "C" fn gethostbyname2_r(
    name: *const c_char,
    family: c_int,
    ret: *mut hostent,
    buf: *mut c_char,
    len: usize,
    result: *mut *mut hostent,
    h_errnop: *mut c_int,
) -> c_int {
    match by_name(name, family) {
        // SAFETY: the caller's arguments, as gethostbyname2_r(3) promises them.
        Some(found) => unsafe { reentrant(found, ret, buf, len, result, h_errnop) },
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::gethostbyname2_r(name, family, ret, buf, len, result, h_errnop) },
    }
}

/// gethostbyaddr(3).
///
/// # Safety
/// As gethostbyaddr(3).
#[no_mangle]
pub unsafe extern "C" fn gethostbyaddr(addr: *const c_void, len: socklen_t, family: c_int) -> *mut hostent {
    match by_address(addr, len, family) {
        Some(found) => shared(found),
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::gethostbyaddr(addr, len, family) },
    }
}

/// gethostbyaddr_r(3).
///
/// # Safety
/// As gethostbyaddr_r(3).
#[no_mangle]
pub unsafe extern "C" fn gethostbyaddr_r(
    addr: *const c_void,
    len: socklen_t,
    family: c_int,
    ret: *mut hostent,
    buf: *mut c_char,
    buflen: usize,
    result: *mut *mut hostent,
    h_errnop: *mut c_int,
) -> c_int {
    match by_address(addr, len, family) {
        // SAFETY: the caller's arguments, as gethostbyaddr_r(3) promises them.
        Some(found) => unsafe { reentrant(found, ret, buf, buflen, result, h_errnop) },
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::gethostbyaddr_r(addr, len, family, ret, buf, buflen, result, h_errnop) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_laid_out_in_the_buffer_or_refused_when_it_does_not_fit() {
        let e = Entry {
            name: "web.ordo.test".into(),
            aliases: vec!["alias".into()],
            family: libc::AF_INET,
            addresses: vec![Ipv4Addr::new(10, 99, 0, 2).into(), Ipv4Addr::new(10, 99, 0, 3).into()],
        };
        // SAFETY: hostent is plain data.
        let mut ret: hostent = unsafe { std::mem::zeroed() };
        let mut buf = [0 as c_char; 200];
        // Unaligned on purpose: the pointer arrays are aligned inside.
        let (p, len) = (buf[1..].as_mut_ptr(), buf.len() - 1);
        // SAFETY: `len` bytes at `p`.
        assert!(unsafe { fill(&e, &mut ret, p, len) });
        // SAFETY: what fill wrote, within `buf`.
        unsafe {
            assert_eq!(std::ffi::CStr::from_ptr(ret.h_name).to_str(), Ok("web.ordo.test"));
            assert_eq!(std::ffi::CStr::from_ptr(*ret.h_aliases).to_str(), Ok("alias"));
            assert!((*ret.h_aliases.add(1)).is_null());
            assert_eq!((ret.h_addrtype, ret.h_length), (libc::AF_INET, 4));
            assert_eq!(*(*ret.h_addr_list.add(1)).cast::<[u8; 4]>(), [10, 99, 0, 3]);
            assert!((*ret.h_addr_list.add(2)).is_null());
        }
        let mut small = [0 as c_char; 40];
        // SAFETY: as above.
        assert!(!unsafe { fill(&e, &mut ret, small.as_mut_ptr(), small.len()) });
        let mut result = std::ptr::NonNull::dangling().as_ptr();
        let mut h = 0;
        // SAFETY: as above.
        let r = unsafe { reentrant(Ok(e), &mut ret, small.as_mut_ptr(), 40, &mut result, &mut h) };
        assert_eq!((r, result.is_null()), (libc::ERANGE, true));
    }
}
