//! `sockaddr_in` / `sockaddr_in6` in and out, with the socket layer's
//! checks (`move_addr_to_kernel` / `move_addr_to_user`).

use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{sockaddr, sockaddr_in, sockaddr_in6, socklen_t};

use crate::Errno;

/// The largest address the kernel copies in (`sizeof(sockaddr_storage)`).
const MAX_LEN: usize = size_of::<libc::sockaddr_storage>();

/// What `how` a family error is: bind and sendmsg say EINVAL, connect
/// EAFNOSUPPORT.
#[derive(Clone, Copy)]
pub enum Use {
    Bind,
    Connect,
    Send,
}

/// Reads an address of `len` bytes at `p`, as rds_bind / rds_connect /
/// rds_sendmsg check it: shorter than the family's struct is EINVAL, a
/// family other than AF_INET / AF_INET6 EINVAL (EAFNOSUPPORT for connect),
/// a NULL pointer with a length EFAULT, a length above
/// `sizeof(sockaddr_storage)` EINVAL.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes.
pub unsafe fn read(p: *const sockaddr, len: socklen_t, how: Use) -> Result<SocketAddr, Errno> {
    let len = len as usize;
    if len > MAX_LEN {
        return Err(libc::EINVAL);
    }
    if len < size_of::<libc::sa_family_t>() {
        return Err(libc::EINVAL);
    }
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: len >= 2 readable bytes at p (the caller's promise); read
    // unaligned: a C caller may pass any byte buffer.
    let family = unsafe { std::ptr::read_unaligned(p.cast::<libc::sa_family_t>()) };
    match i32::from(family) {
        libc::AF_INET => {
            if len < size_of::<sockaddr_in>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: len covers a sockaddr_in.
            let sin = unsafe { std::ptr::read_unaligned(p.cast::<sockaddr_in>()) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            if len < size_of::<sockaddr_in6>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: len covers a sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(p.cast::<sockaddr_in6>()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(sin6.sin6_port), 0, sin6.sin6_scope_id)))
        }
        _ => Err(match how {
            Use::Connect => libc::EAFNOSUPPORT,
            Use::Bind | Use::Send => libc::EINVAL,
        }),
    }
}

/// An address as the kernel's socket layer holds it before copying out.
pub struct Raw {
    pub storage: libc::sockaddr_storage,
    pub len: usize,
}

/// `a` as the kernel reports it: `sockaddr_in` for IPv4 (and IPv4-mapped),
/// `sockaddr_in6` otherwise; `None` is AF_UNSPEC in a `sockaddr_in`'s size
/// (rds_getname of an unbound, unconnected socket).
pub fn encode(a: Option<SocketAddr>) -> Raw {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let p = (&mut storage as *mut libc::sockaddr_storage).cast::<u8>();
    let v4 = |ip: Ipv4Addr, port: u16| sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let len = match a {
        None => size_of::<sockaddr_in>(),
        Some(SocketAddr::V4(a)) => {
            // SAFETY: storage is larger than and aligned for sockaddr_in.
            unsafe { p.cast::<sockaddr_in>().write(v4(*a.ip(), a.port())) };
            size_of::<sockaddr_in>()
        }
        Some(SocketAddr::V6(a)) => match a.ip().to_ipv4_mapped() {
            Some(ip) => {
                // SAFETY: as above.
                unsafe { p.cast::<sockaddr_in>().write(v4(ip, a.port())) };
                size_of::<sockaddr_in>()
            }
            None => {
                let sin6 = sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: storage is larger than and aligned for sockaddr_in6.
                unsafe { p.cast::<sockaddr_in6>().write(sin6) };
                size_of::<sockaddr_in6>()
            }
        },
    };
    Raw { storage, len }
}

/// `move_addr_to_user`: copies at most `*lenp` bytes of `raw` to `p` and
/// stores the full length in `*lenp`. EFAULT for a NULL `lenp`, or a NULL
/// `p` with a non-zero `*lenp`.
///
/// # Safety
/// `lenp` is NULL or valid for a read and a write; `p` is NULL or valid
/// for `*lenp` bytes of writes.
pub unsafe fn write(raw: &Raw, p: *mut sockaddr, lenp: *mut socklen_t) -> Result<(), Errno> {
    if lenp.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: lenp is valid (the caller's promise).
    let want = unsafe { lenp.read_unaligned() } as i32;
    if want < 0 {
        return Err(libc::EINVAL);
    }
    let n = (want as usize).min(raw.len);
    if n > 0 {
        if p.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: p has room for `want` >= n bytes; the source is our storage.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw.storage as *const libc::sockaddr_storage).cast::<u8>(), p.cast(), n)
        };
    }
    // SAFETY: as above.
    unsafe { lenp.write_unaligned(raw.len as socklen_t) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_round_trip_and_short_lengths() {
        let a: SocketAddr = "127.0.0.2:4000".parse().unwrap();
        let raw = encode(Some(a));
        assert_eq!(raw.len, 16);
        let p = (&raw.storage as *const libc::sockaddr_storage).cast::<sockaddr>();
        // SAFETY: raw.storage holds 128 readable bytes.
        unsafe {
            assert_eq!(read(p, 16, Use::Bind), Ok(a));
            assert_eq!(read(p, 15, Use::Bind), Err(libc::EINVAL));
            assert_eq!(read(p, 1, Use::Bind), Err(libc::EINVAL));
            assert_eq!(read(p, 129, Use::Bind), Err(libc::EINVAL));
            assert_eq!(read(std::ptr::null(), 16, Use::Bind), Err(libc::EFAULT));
        }
        let mut out = [0u8; 8];
        let mut len: socklen_t = 8;
        // SAFETY: out has 8 bytes, len is valid.
        unsafe { write(&raw, out.as_mut_ptr().cast(), &mut len).unwrap() };
        assert_eq!(len, 16, "the full length comes back");
        assert_eq!(&out[..4], &[2, 0, 0x0f, 0xa0], "family AF_INET, port 4000 big-endian, truncated copy");
    }

    #[test]
    fn v6_and_mapped() {
        let a: SocketAddr = "[fd00::1]:7".parse().unwrap();
        let raw = encode(Some(a));
        assert_eq!(raw.len, 28);
        let p = (&raw.storage as *const libc::sockaddr_storage).cast::<sockaddr>();
        // SAFETY: 128 readable bytes.
        unsafe {
            assert_eq!(read(p, 28, Use::Send), Ok(a));
            assert_eq!(read(p, 27, Use::Send), Err(libc::EINVAL));
        }
        let m: SocketAddr = "[::ffff:10.0.0.1]:9".parse().unwrap();
        assert_eq!(encode(Some(m)).len, 16);
        let none = encode(None);
        assert_eq!(none.len, 16);
        assert_eq!(none.storage.ss_family, 0);
    }

    #[test]
    fn unknown_family() {
        let mut raw = encode(Some("1.2.3.4:5".parse().unwrap()));
        raw.storage.ss_family = libc::AF_UNIX as libc::sa_family_t;
        let p = (&raw.storage as *const libc::sockaddr_storage).cast::<sockaddr>();
        // SAFETY: 128 readable bytes.
        unsafe {
            assert_eq!(read(p, 16, Use::Bind), Err(libc::EINVAL));
            assert_eq!(read(p, 16, Use::Connect), Err(libc::EAFNOSUPPORT));
        }
    }
}
