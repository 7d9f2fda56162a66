//! setsockopt / getsockopt / ioctl / fcntl of an RDS descriptor, with the
//! kernel's option numbers, lengths and errno.

use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use libc::{c_int, c_void, socklen_t};
use rds_sock::SockOpt;

use crate::table::{self, Entry};
use crate::{Errno, cvt, io_errno};

pub const SOL_RDS: c_int = 276;
pub const RDS_CANCEL_SENT_TO: c_int = 1;
pub const RDS_GET_MR: c_int = 2;
pub const RDS_FREE_MR: c_int = 3;
pub const RDS_RECVERR: c_int = 5;
pub const RDS_CONG_MONITOR: c_int = 6;
pub const RDS_GET_MR_FOR_DEST: c_int = 7;
pub const SO_RDS_TRANSPORT: c_int = 8;
pub const RDS_INFO_FIRST: c_int = 10000;
pub const RDS_INFO_LAST: c_int = 10017;
pub const SIOCRDSSETTOS: libc::c_ulong = 0x89E0;
pub const SIOCRDSGETTOS: libc::c_ulong = 0x89E1;
const SO_TIMESTAMP_OLD: c_int = 29;
const SO_TIMESTAMP_NEW: c_int = 63;
const SO_RCVTIMEO_NEW: c_int = 66;
const SO_SNDTIMEO_NEW: c_int = 67;

/// Reads an `int` option value (`optlen` checked by the caller).
///
/// # Safety
/// `v` is NULL or valid for 4 bytes of reads.
unsafe fn read_int(v: *const c_void) -> Result<c_int, Errno> {
    if v.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { v.cast::<c_int>().read_unaligned() })
}

/// # Safety
/// `v` is NULL or valid for `len` bytes of reads.
unsafe fn read_bytes<'a>(v: *const c_void, len: socklen_t) -> Result<&'a [u8], Errno> {
    if v.is_null() {
        return if len == 0 { Ok(&[]) } else { Err(libc::EFAULT) };
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(v.cast(), len as usize) })
}

fn timeval(b: &[u8]) -> Result<Option<Duration>, Errno> {
    let sec = i64::from_ne_bytes(b[..8].try_into().unwrap_or_default());
    let usec = i64::from_ne_bytes(b[8..16].try_into().unwrap_or_default());
    if !(0..1_000_000).contains(&usec) {
        return Err(libc::EDOM);
    }
    if sec < 0 {
        // The kernel makes a negative timeout 0, which waits not at all.
        return Ok(Some(Duration::from_nanos(1)));
    }
    if sec == 0 && usec == 0 {
        return Ok(None);
    }
    Ok(Some(Duration::from_secs(sec as u64) + Duration::from_micros(usec as u64)))
}

fn timeval_bytes(t: Option<Duration>) -> [u8; 16] {
    let (s, u) = t.map_or((0, 0), |d| (d.as_secs() as i64, i64::from(d.subsec_micros())));
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&s.to_ne_bytes());
    b[8..].copy_from_slice(&u.to_ne_bytes());
    b
}

/// `setsockopt`.
///
/// # Safety
/// `v` is NULL or valid for `len` bytes of reads.
pub unsafe fn set(e: &Entry, level: c_int, name: c_int, v: *const c_void, len: socklen_t) -> Result<(), Errno> {
    let s = &e.sock;
    let int = || -> Result<c_int, Errno> {
        if (len as usize) < size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: len >= 4 bytes at v (the caller's promise).
        unsafe { read_int(v) }
    };
    match (level, name) {
        (SOL_RDS, RDS_CANCEL_SENT_TO) => {
            if s.local_addr().map_err(io_errno)?.ip().is_unspecified() {
                return Err(libc::ENOTCONN);
            }
            if (len as usize) < size_of::<libc::sockaddr_in>() {
                return Err(libc::EINVAL);
            }
            // As rds_cancel_sent_to: shorter than a sockaddr_in6 is a
            // sockaddr_in, else a sockaddr_in6; the family is not looked at.
            let six = len as usize >= size_of::<libc::sockaddr_in6>();
            // SAFETY: len >= 16 (28 for six) bytes at v.
            let b = unsafe { read_bytes(v, if six { 28 } else { 16 }) }?;
            let port = u16::from_be_bytes([b[2], b[3]]);
            let dst = if six {
                let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&b[8..24]).unwrap_or_default());
                match ip.to_ipv4_mapped() {
                    Some(v4) => SocketAddr::new(IpAddr::V4(v4), port),
                    None => SocketAddr::new(IpAddr::V6(ip), port),
                }
            } else {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[4], b[5], b[6], b[7])), port)
            };
            s.cancel_sent_to(dst).map(|_| ()).map_err(io_errno)
        }
        (SOL_RDS, RDS_RECVERR) => s.set_recverr(int()? != 0).map_err(io_errno),
        (SOL_RDS, RDS_CONG_MONITOR) => s.set_cong_monitor(int()? != 0).map_err(io_errno),
        (SOL_RDS, SO_RDS_TRANSPORT) => {
            if s.option(SockOpt::Transport(0)).map_err(io_errno)? != u64::from(u32::MAX) {
                return Err(libc::EOPNOTSUPP);
            }
            if len as usize != size_of::<c_int>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: 4 bytes at v.
            let t = unsafe { read_int(v) }?;
            s.set_transport_raw(t).map_err(io_errno)?;
            e.transport_set.store(true, Ordering::Relaxed);
            Ok(())
        }
        (SOL_RDS, SO_TIMESTAMP_OLD | SO_TIMESTAMP_NEW) => {
            // rds_enable_recvtstamp: exactly an int, else EFAULT.
            if len as usize != size_of::<c_int>() {
                return Err(libc::EFAULT);
            }
            // SAFETY: 4 bytes at v.
            let on = unsafe { read_int(v) }? != 0;
            set_timestamp(e, name, on)
        }
        (SOL_RDS, RDS_GET_MR | RDS_GET_MR_FOR_DEST) => {
            // struct rds_get_mr_args { struct rds_iovec vec; u64 cookie_addr;
            // u64 flags; }, after a sockaddr_storage for FOR_DEST.
            let skip = if name == RDS_GET_MR { 0 } else { size_of::<libc::sockaddr_storage>() };
            if len as usize != skip + 32 {
                return Err(libc::EINVAL);
            }
            // SAFETY: len bytes at v.
            let b = unsafe { read_bytes(v, len) }?;
            let (addr, bytes, cookie_addr, flags) =
                (u64_at(b, skip), u64_at(b, skip + 8), u64_at(b, skip + 16), u64_at(b, skip + 24));
            // SAFETY: the kernel's contract for RDS_GET_MR, which a C caller
            // accepts: the memory is the caller's until the MR is released.
            let cookie = unsafe { s.get_mr_raw(addr, bytes, flags as u32) }.map_err(io_errno)?;
            put_cookie(cookie_addr, cookie)
        }
        (SOL_RDS, RDS_FREE_MR) => {
            // struct rds_free_mr_args { rds_rdma_cookie_t cookie; u64 flags; }
            if len as usize != 16 {
                return Err(libc::EINVAL);
            }
            // SAFETY: 16 bytes at v.
            let b = unsafe { read_bytes(v, 16) }?;
            s.free_mr(u64_at(b, 0), u64_at(b, 8) as u32).map_err(io_errno)
        }
        (SOL_RDS, _) => Err(libc::ENOPROTOOPT),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => s.set_send_buffer_size(int()?.max(0) as usize).map_err(io_errno),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => s.set_recv_buffer_size(int()?.max(0) as usize).map_err(io_errno),
        (libc::SOL_SOCKET, libc::SO_SNDBUFFORCE | libc::SO_RCVBUFFORCE) => {
            let n = int()?.max(0) as usize;
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err(libc::EPERM);
            }
            if name == libc::SO_SNDBUFFORCE {
                s.set_send_buffer_size_force(n).map_err(io_errno)
            } else {
                s.set_recv_buffer_size_force(n).map_err(io_errno)
            }
        }
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
            e.reuseaddr.store(int()? != 0, Ordering::Relaxed);
            Ok(())
        }
        (libc::SOL_SOCKET, SO_TIMESTAMP_OLD | SO_TIMESTAMP_NEW) => {
            let on = int()? != 0;
            set_timestamp(e, name, on)
        }
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO | SO_RCVTIMEO_NEW | SO_SNDTIMEO_NEW) => {
            if (len as usize) < 16 {
                return Err(libc::EINVAL);
            }
            // SAFETY: 16 bytes at v.
            let t = timeval(unsafe { read_bytes(v, 16) }?)?;
            let slot = if matches!(name, libc::SO_RCVTIMEO | SO_RCVTIMEO_NEW) { &e.rcvtimeo } else { &e.sndtimeo };
            *slot.lock() = t;
            Ok(())
        }
        (libc::SOL_SOCKET, _) => Err(libc::ENOPROTOOPT),
        _ => Err(libc::ENOPROTOOPT),
    }
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// Writes a cookie where `cookie_addr` (a C pointer, 0 for none) points,
/// as `__rds_rdma_map` does; EFAULT for an address the kernel could not
/// write is beyond what we can tell: a non-NULL address is trusted.
pub(crate) fn put_cookie(cookie_addr: u64, cookie: u64) -> Result<(), Errno> {
    if cookie_addr != 0 {
        // SAFETY: the caller named this address for the cookie (the
        // kernel's contract for cookie_addr).
        unsafe { (cookie_addr as usize as *mut u64).write_unaligned(cookie) };
    }
    Ok(())
}

fn set_timestamp(e: &Entry, name: c_int, on: bool) -> Result<(), Errno> {
    e.sock.set_timestamp(on).map_err(io_errno)?;
    let v = match (on, name) {
        (false, _) => 0,
        (true, SO_TIMESTAMP_NEW) => 2,
        (true, _) => 1,
    };
    e.timestamp.store(v, Ordering::Relaxed);
    Ok(())
}

/// Copies `val` out as `sock_getsockopt` does: at most `*lenp` bytes, then
/// the copied length into `*lenp`.
///
/// # Safety
/// `v` valid for `*lenp` bytes of writes; `lenp` valid (checked non-NULL).
unsafe fn put(v: *mut c_void, lenp: *mut socklen_t, want: usize, val: &[u8]) -> Result<(), Errno> {
    let n = want.min(val.len());
    if n > 0 {
        if v.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(val.as_ptr(), v.cast::<u8>(), n) };
    }
    // SAFETY: the caller's promise.
    unsafe { lenp.write_unaligned(n as socklen_t) };
    Ok(())
}

/// `getsockopt`; returns the syscall's value (RDS_INFO_* return the size of
/// one record, as the kernel does; everything else 0).
///
/// # Safety
/// `lenp` NULL or valid; `v` NULL or valid for `*lenp` bytes of writes.
pub unsafe fn get(e: &Entry, level: c_int, name: c_int, v: *mut c_void, lenp: *mut socklen_t) -> Result<c_int, Errno> {
    if lenp.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: lenp valid (the caller's promise).
    let want = unsafe { lenp.read_unaligned() } as i32;
    if want < 0 {
        return Err(libc::EINVAL);
    }
    let want = want as usize;
    let s = &e.sock;
    let opt = |o: SockOpt| s.option(o).map_err(io_errno);
    let int = |x: u64| -> Result<c_int, Errno> {
        // SAFETY: the caller's promise.
        unsafe { put(v, lenp, want, &(x as c_int).to_ne_bytes()) }.map(|_| 0)
    };
    // The SOL_RDS ints fail with EINVAL when the buffer is short.
    let rds_int = |x: u64| if want < size_of::<c_int>() { Err(libc::EINVAL) } else { int(x) };
    match (level, name) {
        (SOL_RDS, RDS_INFO_FIRST..=RDS_INFO_LAST) => {
            let mut buf = vec![0u8; want];
            match s.engine().rds_info_getsockopt(name, &mut buf) {
                Ok(ok) => {
                    // SAFETY: the caller's promise.
                    unsafe { put(v, lenp, ok.len, &buf[..ok.len]) }?;
                    Ok(ok.each as c_int)
                }
                Err(rds_sock::info::kernel::InfoError::NoSpace { needed }) => {
                    // SAFETY: the caller's promise.
                    unsafe { lenp.write_unaligned(needed as socklen_t) };
                    Err(libc::ENOSPC)
                }
                Err(err) => Err(err.errno().0),
            }
        }
        (SOL_RDS, RDS_RECVERR) => rds_int(opt(SockOpt::RecvErr(false))?),
        (SOL_RDS, SO_RDS_TRANSPORT) => rds_int(opt(SockOpt::Transport(0))?),
        (SOL_RDS, _) => Err(libc::ENOPROTOOPT),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => int(opt(SockOpt::SndBuf(0))?),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => int(opt(SockOpt::RcvBuf(0))?),
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => int(u64::from(e.reuseaddr.load(Ordering::Relaxed))),
        (libc::SOL_SOCKET, SO_TIMESTAMP_OLD) => int(u64::from(e.timestamp.load(Ordering::Relaxed) == 1)),
        (libc::SOL_SOCKET, SO_TIMESTAMP_NEW) => int(u64::from(e.timestamp.load(Ordering::Relaxed) == 2)),
        (libc::SOL_SOCKET, libc::SO_TYPE) => int(libc::SOCK_SEQPACKET as u64),
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => int(crate::AF_RDS as u64),
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => int(0),
        (libc::SOL_SOCKET, libc::SO_ERROR) => int(0),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO | SO_RCVTIMEO_NEW | SO_SNDTIMEO_NEW) => {
            let slot = if matches!(name, libc::SO_RCVTIMEO | SO_RCVTIMEO_NEW) { &e.rcvtimeo } else { &e.sndtimeo };
            let t = *slot.lock();
            // SAFETY: the caller's promise.
            unsafe { put(v, lenp, want, &timeval_bytes(t)) }.map(|_| 0)
        }
        _ => Err(libc::ENOPROTOOPT),
    }
}

/// `ioctl`: SIOCRDSSETTOS / SIOCRDSGETTOS (an `unsigned char`), FIONBIO (an
/// `int`, as the VFS does for every file), FIOCLEX / FIONCLEX. Anything
/// else is ENOTTY, FIONREAD included: the kernel's AF_RDS has no FIONREAD.
///
/// # Safety
/// `arg` NULL or valid for the request's argument.
pub unsafe fn ioctl(fd: RawFd, e: &Entry, req: libc::c_ulong, arg: *mut c_void) -> Result<c_int, Errno> {
    match req {
        SIOCRDSSETTOS => {
            if arg.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: one byte at arg.
            let tos = unsafe { arg.cast::<u8>().read() };
            e.sock.set_tos(tos).map_err(io_errno).map(|_| 0)
        }
        SIOCRDSGETTOS => {
            if arg.is_null() {
                return Err(libc::EFAULT);
            }
            let tos = e.sock.option(SockOpt::Tos(0)).map_err(io_errno)? as u8;
            // SAFETY: one writable byte at arg.
            unsafe { arg.cast::<u8>().write(tos) };
            Ok(0)
        }
        r if r == libc::FIONBIO => {
            if arg.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: an int at arg.
            let on = unsafe { arg.cast::<c_int>().read_unaligned() } != 0;
            e.nonblock.store(on, Ordering::Relaxed);
            Ok(0)
        }
        // SAFETY: per-descriptor flags of a number the table owns.
        r if r == libc::FIOCLEX || r == libc::FIONCLEX => cvt(unsafe { libc::ioctl(fd, r, arg) }),
        _ => Err(libc::ENOTTY),
    }
}

/// `fcntl`: O_NONBLOCK lives in the socket's entry (shared by dups, as the
/// open file's flags are); FD_CLOEXEC and the rest on the real number.
pub fn fcntl(fd: RawFd, e: &Entry, cmd: c_int, arg: libc::c_long) -> Result<c_int, Errno> {
    match cmd {
        libc::F_GETFL => Ok(libc::O_RDWR | if e.nonblock.load(Ordering::Relaxed) { libc::O_NONBLOCK } else { 0 }),
        libc::F_SETFL => {
            e.nonblock.store(arg as c_int & libc::O_NONBLOCK != 0, Ordering::Relaxed);
            Ok(0)
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            if arg < 0 {
                return Err(libc::EINVAL);
            }
            table::dup_min(fd, arg, cmd == libc::F_DUPFD_CLOEXEC)
        }
        // SAFETY: fcntl on a number the table owns; the argument is passed
        // through as the kernel would take it.
        _ => cvt(unsafe { libc::fcntl(fd, cmd, arg) }),
    }
}
