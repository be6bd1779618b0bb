//! getaddrinfo and getnameinfo: with the tunnel's name servers set (`DNS =`), names are
//! resolved through them ([`crate::resolve`]).

use crate::resolve::resolved_by_tunnel;
use crate::{addr, real, resolve};
use libc::{c_int, sockaddr, socklen_t};

/// getaddrinfo(3): with the tunnel's name servers set (`DNS =`), a name the host's
/// `/etc/hosts` does not know is looked up through them ([`resolve`]); the result is built
/// by the C library from the addresses found, so that services, socket types and
/// `freeaddrinfo` are all its own. Numeric hosts, and everything without `DNS =`, are the C
/// library's.
///
/// # Safety
/// As getaddrinfo(3).
#[no_mangle]
pub unsafe extern "C" fn getaddrinfo(
    node: *const libc::c_char,
    service: *const libc::c_char,
    hints: *const libc::addrinfo,
    res: *mut *mut libc::addrinfo,
) -> c_int {
    let through_tunnel = match resolve::settings() {
        Some(dns) if !node.is_null() && !res.is_null() => {
            // SAFETY: `node` is a NUL-terminated string, as getaddrinfo(3) promises.
            let name = unsafe { std::ffi::CStr::from_ptr(node) };
            // SAFETY: `hints` is null or readable, as getaddrinfo(3) promises.
            let hints = unsafe { hints.as_ref() };
            name.to_str()
                .ok()
                .filter(|n| resolved_by_tunnel(n, hints))
                .map(|n| (dns, n))
        }
        _ => None,
    };
    let Some((dns, name)) = through_tunnel else {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::getaddrinfo(node, service, hints, res) };
    };
    match std::panic::catch_unwind(|| {
        // SAFETY: the caller's arguments, as getaddrinfo(3) promises them.
        unsafe { addrinfo_from_tunnel(dns, name, service, hints, res) }
    }) {
        Ok(r) => r,
        Err(_) => libc::EAI_SYSTEM,
    }
}

/// getnameinfo(3): with the tunnel's name servers set (`DNS =`), an address's name is asked
/// of them (its PTR record) unless `/etc/hosts` names it or the caller asks for the number;
/// the service's name and every other case are the C library's.
///
/// # Safety
/// As getnameinfo(3).
#[no_mangle]
pub unsafe extern "C" fn getnameinfo(
    sa: *const sockaddr,
    salen: socklen_t,
    host: *mut libc::c_char,
    hostlen: socklen_t,
    serv: *mut libc::c_char,
    servlen: socklen_t,
    flags: c_int,
) -> c_int {
    let wanted = !host.is_null() && hostlen > 0 && flags & libc::NI_NUMERICHOST == 0;
    // SAFETY: the caller's address, as getnameinfo(3) promises it.
    let ip = wanted
        .then(|| unsafe { addr::read(sa, salen) })
        .flatten()
        .map(|a| addr::unmapped(a).ip());
    let (Some(dns), Some(ip)) = (resolve::settings(), ip) else {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::getnameinfo(sa, salen, host, hostlen, serv, servlen, flags) };
    };
    if ip.is_loopback() || resolve::hosts_name_of(ip).is_some() {
        // SAFETY: as above.
        return unsafe { real::getnameinfo(sa, salen, host, hostlen, serv, servlen, flags) };
    }
    std::panic::catch_unwind(|| {
        let name = match resolve::reverse(dns, ip) {
            Ok(name) => name,
            Err(e) if flags & libc::NI_NAMEREQD != 0 => return e,
            // No name: the number, as the C library gives it.
            Err(_) => {
                // SAFETY: the caller's arguments, the number asked for.
                return unsafe {
                    real::getnameinfo(sa, salen, host, hostlen, serv, servlen, flags | libc::NI_NUMERICHOST)
                };
            }
        };
        let name = if flags & libc::NI_NOFQDN != 0 {
            name.split('.').next().unwrap_or(&name).to_string()
        } else {
            name
        };
        if name.len() + 1 > hostlen as usize {
            return libc::EAI_OVERFLOW;
        }
        // SAFETY: `host` has `hostlen` writable bytes, more than the name and its NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), host.cast::<u8>(), name.len());
            *host.add(name.len()) = 0;
        }
        if serv.is_null() || servlen == 0 {
            return 0;
        }
        // SAFETY: the caller's address and service buffer; the host part is done.
        unsafe { real::getnameinfo(sa, salen, std::ptr::null_mut(), 0, serv, servlen, flags) }
    })
    .unwrap_or(libc::EAI_SYSTEM)
}

/// # Safety
/// As getaddrinfo(3): `service` null or a string, `hints` null or readable, `res` writable.
unsafe fn addrinfo_from_tunnel(
    dns: &ordo_attach::Dns,
    name: &str,
    service: *const libc::c_char,
    hints: *const libc::addrinfo,
    res: *mut *mut libc::addrinfo,
) -> c_int {
    // SAFETY: the caller's contract.
    let asked: Option<libc::addrinfo> = unsafe { hints.as_ref() }.copied();
    let family = asked.map_or(libc::AF_UNSPEC, |h| h.ai_family);
    let mut found = match resolve::lookup(dns, name, family) {
        Ok(f) => f,
        Err(eai) => return eai,
    };
    // IPv4 first: any peer reaches it, where the tunnel may carry no IPv6.
    found.addresses.sort_by_key(|a| a.is_ipv6());
    found.addresses.dedup();
    // SAFETY: addrinfo is plain data; all zeros is "no hints".
    let mut numeric: libc::addrinfo = asked.unwrap_or(unsafe { std::mem::zeroed() });
    // The C library makes each entry from the number; the name and the host's address
    // families are this lookup's business, not its.
    numeric.ai_flags = (numeric.ai_flags | libc::AI_NUMERICHOST) & !(libc::AI_CANONNAME | libc::AI_ADDRCONFIG);
    let mut head: *mut libc::addrinfo = std::ptr::null_mut();
    let mut tail: *mut libc::addrinfo = std::ptr::null_mut();
    // An address the hints rule out is skipped; an error about the request itself (its
    // service, its socket type) is the same for every address, and is the answer.
    let mut error = libc::EAI_NONAME;
    for a in &found.addresses {
        let Ok(text) = std::ffi::CString::new(a.to_string()) else {
            continue;
        };
        let mut part: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: a numeric host, the caller's service, our hints, our result pointer.
        let r = unsafe { real::getaddrinfo(text.as_ptr(), service, &numeric, &mut part) };
        if r != 0 || part.is_null() {
            error = if r != 0 { r } else { libc::EAI_NONAME };
            continue;
        }
        if head.is_null() {
            head = part;
        } else {
            // SAFETY: `tail` is the last entry of the chain built so far, ours to link.
            unsafe { (*tail).ai_next = part };
        }
        tail = part;
        loop {
            // SAFETY: `tail` is an entry of the C library's fresh list.
            let next = unsafe { (*tail).ai_next };
            if next.is_null() {
                break;
            }
            tail = next;
        }
    }
    if head.is_null() {
        return error;
    }
    if asked.is_some_and(|h| h.ai_flags & libc::AI_CANONNAME != 0) {
        if let Ok(canonical) = std::ffi::CString::new(found.canonical) {
            // SAFETY: the first entry is ours; freeaddrinfo frees its name with free(3), so
            // the name is made by the C library's strdup.
            unsafe { (*head).ai_canonname = libc::strdup(canonical.as_ptr()) };
        }
    }
    // SAFETY: `res` is writable, as getaddrinfo(3) promises.
    unsafe { *res = head };
    0
}
