//! Socket addresses between the C layout and Rust's.

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t, AF_INET, AF_INET6};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// An IPv4-mapped IPv6 address as the IPv4 address it stands for (how an IPv6 socket reaches
/// an IPv4 destination); others unchanged.
pub fn unmapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// The unspecified address of a socket family (`::` for AF_INET6, else 0.0.0.0).
pub fn unspecified(family: i32) -> std::net::IpAddr {
    if family == AF_INET6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    }
}

/// The address the kernel has bound the socket `fd` to (the C library's getsockname, not
/// the hook): None if it has no IP address; Err, with errno set, if the call failed.
pub fn kernel_name(fd: i32) -> Result<Option<SocketAddr>, ()> {
    // SAFETY: sockaddr_storage is plain data for which all zeros is valid.
    let mut name: sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: a sockaddr_storage and its length for the kernel's answer.
    if unsafe { crate::real::getsockname(fd, (&mut name as *mut sockaddr_storage).cast(), &mut len) } != 0 {
        return Err(());
    }
    // SAFETY: the kernel wrote a socket address of `len` bytes.
    Ok(unsafe { read((&name as *const sockaddr_storage).cast(), len) })
}

/// Whether `addr` is an AF_UNSPEC address (connect's way of dissolving a UDP association).
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
pub unsafe fn is_unspec(addr: *const sockaddr, len: socklen_t) -> bool {
    // SAFETY: the caller's contract.
    unsafe { is_family(addr, len, libc::AF_UNSPEC) }
}

/// Whether `addr` is long enough to hold a family, and that family is `family`.
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
pub unsafe fn is_family(addr: *const sockaddr, len: socklen_t, family: i32) -> bool {
    // SAFETY: the family is read only if `len` covers it.
    !addr.is_null()
        && (len as usize) >= std::mem::size_of::<libc::sa_family_t>()
        && i32::from(unsafe { std::ptr::read_unaligned(&(*addr).sa_family) }) == family
}

/// An AF_UNSPEC address read as IPv4, as a send on an IPv4 socket reads it
/// (net/ipv4/udp.c: a zeroed sockaddr_in whose family was forgotten); None if it is of
/// another family or too short.
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
pub unsafe fn unspec_as_ipv4(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    // SAFETY: the caller's contract.
    if !unsafe { is_unspec(addr, len) } || (len as usize) < std::mem::size_of::<sockaddr_in>() {
        return None;
    }
    // SAFETY: `len` covers a sockaddr_in (checked above); an unaligned read of it.
    let a: sockaddr_in = unsafe { std::ptr::read_unaligned(addr.cast()) };
    Some(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
        u16::from_be(a.sin_port),
    )))
}

/// The address at `addr` (`len` bytes), if it is IPv4 or IPv6 and long enough.
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
pub unsafe fn read(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family is readable (checked above); the reads below are of the
    // structure the family names, after checking that `len` covers it. Unaligned reads:
    // the caller's buffer may be any byte array.
    unsafe {
        match i32::from(std::ptr::read_unaligned(&(*addr).sa_family)) {
            AF_INET if len as usize >= std::mem::size_of::<sockaddr_in>() => {
                let a: sockaddr_in = std::ptr::read_unaligned(addr.cast());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            AF_INET6 if len as usize >= std::mem::size_of::<sockaddr_in6>() => {
                let a: sockaddr_in6 = std::ptr::read_unaligned(addr.cast());
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// `a` in the C layout, in the family of a socket of `family` (an IPv4 address on an IPv6
/// socket is IPv4-mapped, as the kernel reports it).
pub fn to_storage(a: SocketAddr, family: i32) -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain data for which all zeros is valid.
    let mut s: sockaddr_storage = unsafe { std::mem::zeroed() };
    let a = match (a, family) {
        (SocketAddr::V4(v4), AF_INET6) => SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0)),
        _ => a,
    };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = sockaddr_in {
                sin_family: AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than, and aligned for, every sockaddr type.
            unsafe { std::ptr::write((&mut s as *mut sockaddr_storage).cast(), sin) };
            std::mem::size_of::<sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = sockaddr_in6 {
                sin6_family: AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&mut s as *mut sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<sockaddr_in6>()
        }
    };
    (s, len as socklen_t)
}

/// Copies `a` to the caller's buffer as getsockname(2) does: truncated to `*len`, with `*len`
/// set to the full size.
///
/// # Safety
/// `out` points to `*len` writable bytes and `len` to a writable length.
pub unsafe fn write(a: SocketAddr, family: i32, out: *mut sockaddr, len: *mut socklen_t) {
    let (s, full) = to_storage(a, family);
    // SAFETY: the caller's buffer has `*len` bytes; we copy at most that many.
    unsafe {
        let n = (*len).min(full) as usize;
        std::ptr::copy_nonoverlapping((&s as *const sockaddr_storage).cast::<u8>(), out.cast::<u8>(), n);
        *len = full;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_both_families_and_maps_v4_on_v6_sockets() {
        for a in ["10.0.0.2:80", "[fd00::2]:443"] {
            let a: SocketAddr = a.parse().unwrap();
            let family = if a.is_ipv4() { AF_INET } else { AF_INET6 };
            let (s, len) = to_storage(a, family);
            // SAFETY: `s` holds `len` bytes of a sockaddr.
            assert_eq!(unsafe { read((&s as *const sockaddr_storage).cast(), len) }, Some(a));
        }
        let (s, len) = to_storage("10.0.0.2:80".parse().unwrap(), AF_INET6);
        // SAFETY: as above.
        let back = unsafe { read((&s as *const sockaddr_storage).cast(), len) };
        assert_eq!(back, Some("[::ffff:10.0.0.2]:80".parse().unwrap()));
        // Too short for its family: not an address.
        // SAFETY: as above, with a shorter length.
        assert_eq!(unsafe { read((&s as *const sockaddr_storage).cast(), 8) }, None);
    }
}
