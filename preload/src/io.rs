//! Data transfer: the send and receive families, and `read` / `write`,
//! which the kernel turns into `recvmsg` / `sendmsg` on a socket:
//!
//! * `read` / `readv` are `recvmsg` without an address, flags 0 (the socket's
//!   O_NONBLOCK still applies); a read of 0 bytes returns 0 at once, as
//!   `sock_read_iter` does.
//! * `write` / `writev` are `sendmsg` with MSG_EOR, which the kernel adds for
//!   every SOCK_SEQPACKET socket: RDS refuses MSG_EOR, so on the kernel a
//!   `write` to an RDS socket fails with EOPNOTSUPP, and so it does here.
//! * `send` / `recv` are `sendto` / `recvfrom` without an address.
//! * `sendmmsg` / `recvmmsg` loop over `sendmsg` / `recvmsg` as the kernel
//!   does (`recvmmsg`'s timeout is not applied).
//! * glibc's fortified `__read_chk`, `__recv_chk`, `__recvfrom_chk` check the
//!   buffer size first (libc's own version aborts when it is too small).

use libc::{c_int, c_uint, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use crate::sockets::dispatch;
use crate::{capi, guard, real};

/// A `msghdr` with no address and no control data over `iov`.
fn plain_msg(iov: *const iovec, cnt: c_int) -> msghdr {
    // SAFETY: msghdr is plain data; all zero is a valid empty header.
    let mut m: msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov.cast_mut();
    m.msg_iovlen = cnt as _;
    m
}

/// # Safety
/// As libc's `sendto`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    dispatch!(fd, capi::rds_sendto(fd, buf, n, flags, addr, len), real::sendto(fd, buf, n, flags, addr, len))
}

/// # Safety
/// As libc's `sendmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    dispatch!(fd, capi::rds_sendmsg(fd, msg, flags), real::sendmsg(fd, msg, flags))
}

/// # Safety
/// As libc's `send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    dispatch!(fd, capi::rds_sendto(fd, buf, n, flags, std::ptr::null(), 0), real::send(fd, buf, n, flags))
}

/// # Safety
/// As libc's `write`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if guard::is_rds(fd) {
        let iov = iovec { iov_base: buf.cast_mut(), iov_len: n };
        let m = plain_msg(&iov, 1);
        // SAFETY: `m` describes the caller's buffer of `n` bytes.
        guard::enter(-1, || unsafe { capi::rds_sendmsg(fd, &m, libc::MSG_EOR) })
    } else {
        // SAFETY: the caller's arguments, unchanged.
        unsafe { real::write(fd, buf, n) }
    }
}

/// # Safety
/// As libc's `writev`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if guard::is_rds(fd) {
        let m = plain_msg(iov, cnt);
        // SAFETY: `m` points at the caller's iovecs.
        guard::enter(-1, || unsafe { capi::rds_sendmsg(fd, &m, libc::MSG_EOR) })
    } else {
        // SAFETY: the caller's arguments, unchanged.
        unsafe { real::writev(fd, iov, cnt) }
    }
}

/// # Safety
/// As libc's `sendmmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: c_uint, flags: c_int) -> c_int {
    if !guard::is_rds(fd) {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::sendmmsg(fd, msgs, n, flags) };
    }
    let n = n.min(libc::UIO_MAXIOV as c_uint) as usize;
    for i in 0..n {
        // SAFETY: the caller passes `n` headers at `msgs`.
        let mm = unsafe { &mut *msgs.add(i) };
        // SAFETY: the caller's header, passed on.
        let r = guard::enter(-1, || unsafe { capi::rds_sendmsg(fd, &mm.msg_hdr, flags) });
        if r < 0 {
            return if i == 0 { -1 } else { i as c_int };
        }
        mm.msg_len = r as c_uint;
    }
    n as c_int
}

/// # Safety
/// As libc's `recvfrom`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    dispatch!(fd, capi::rds_recvfrom(fd, buf, n, flags, addr, len), real::recvfrom(fd, buf, n, flags, addr, len))
}

/// # Safety
/// As libc's `recvmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    dispatch!(fd, capi::rds_recvmsg(fd, msg, flags), real::recvmsg(fd, msg, flags))
}

/// # Safety
/// As libc's `recv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    dispatch!(
        fd,
        capi::rds_recvfrom(fd, buf, n, flags, std::ptr::null_mut(), std::ptr::null_mut()),
        real::recv(fd, buf, n, flags)
    )
}

/// `read` on an RDS socket: a datagram (cut to `n`), no address.
fn rds_read(fd: c_int, iov: *const iovec, cnt: c_int, total: usize) -> ssize_t {
    if total == 0 && cnt >= 0 {
        return 0;
    }
    let mut m = plain_msg(iov, cnt);
    // SAFETY: `m` points at the caller's buffers.
    guard::enter(-1, || unsafe { capi::rds_recvmsg(fd, &mut m, 0) })
}

/// # Safety
/// As libc's `read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if guard::is_rds(fd) {
        let iov = iovec { iov_base: buf, iov_len: n };
        rds_read(fd, &iov, 1, n)
    } else {
        // SAFETY: the caller's arguments, unchanged.
        unsafe { real::read(fd, buf, n) }
    }
}

/// # Safety
/// As libc's `readv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if guard::is_rds(fd) {
        let total = if cnt > 0 && !iov.is_null() {
            // SAFETY: the caller passes `cnt` iovecs.
            unsafe { std::slice::from_raw_parts(iov, cnt as usize) }.iter().map(|v| v.iov_len).sum()
        } else {
            1 // let rds-capi judge a bad count or pointer
        };
        rds_read(fd, iov, cnt, total)
    } else {
        // SAFETY: the caller's arguments, unchanged.
        unsafe { real::readv(fd, iov, cnt) }
    }
}

/// # Safety
/// As libc's `recvmmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    if !guard::is_rds(fd) {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) };
    }
    let mut flags = flags;
    let n = n.min(libc::UIO_MAXIOV as c_uint) as usize;
    for i in 0..n {
        // SAFETY: the caller passes `n` headers at `msgs`.
        let mm = unsafe { &mut *msgs.add(i) };
        // SAFETY: the caller's header, passed on.
        let r = guard::enter(-1, || unsafe { capi::rds_recvmsg(fd, &mut mm.msg_hdr, flags & !libc::MSG_WAITFORONE) });
        if r < 0 {
            return if i == 0 { -1 } else { i as c_int };
        }
        mm.msg_len = r as c_uint;
        if flags & libc::MSG_WAITFORONE != 0 {
            flags |= libc::MSG_DONTWAIT;
        }
    }
    n as c_int
}

/// # Safety
/// As glibc's `__read_chk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    if n <= buflen && guard::is_rds(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        unsafe { read(fd, buf, n) }
    } else {
        // SAFETY: the caller's arguments, unchanged (glibc aborts when n > buflen).
        unsafe { real::__read_chk(fd, buf, n, buflen) }
    }
}

/// # Safety
/// As glibc's `__recv_chk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    if n <= buflen && guard::is_rds(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        unsafe { recv(fd, buf, n, flags) }
    } else {
        // SAFETY: the caller's arguments, unchanged (glibc aborts when n > buflen).
        unsafe { real::__recv_chk(fd, buf, n, buflen, flags) }
    }
}

/// # Safety
/// As glibc's `__recvfrom_chk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n <= buflen && guard::is_rds(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        unsafe { recvfrom(fd, buf, n, flags, addr, len) }
    } else {
        // SAFETY: the caller's arguments, unchanged (glibc aborts when n > buflen).
        unsafe { real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, len) }
    }
}
