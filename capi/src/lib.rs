//! # rds-capi: the C ABI of userspace RDS (`librds.so`, `librds.a`)
//!
//! The kernel's AF_RDS socket calls, each under an `rds_` name with libc's
//! signature: `rds_socket(AF_RDS, SOCK_SEQPACKET, 0)`, `rds_bind`,
//! `rds_sendmsg`, `rds_recvmsg`, `rds_setsockopt`, ... (declared in
//! `capi/include/rds_capi.h`). They return -1 with `errno` set as the
//! kernel's AF_RDS would, and leave `errno` alone on success. No panic
//! crosses the boundary: one becomes EIO. The LD_PRELOAD shim
//! (`preload/`) calls these for descriptors where `rds_is_rds_fd` says 1.
//!
//! An RDS descriptor is a real kernel descriptor that is readable and
//! writable exactly when the RDS socket is (rds-sock's readiness
//! descriptor), so `poll`, `select` and `epoll` (level and edge) work on
//! it unchanged. Sockets are served by one engine per process ([`table`]),
//! started by the first `rds_socket` from the environment:
//!
//! | variable | meaning |
//! | --- | --- |
//! | `RDS_TCP_PORT` | the RDS-TCP port (default 16385, the kernel's) |
//! | `RDS_NPATHS` | paths per peer, 1..=8 (default 8, mprds) |
//! | `RDS_TRANSPORT` | `tcp` or `ib`: SO_RDS_TRANSPORT for sockets that did not set it, applied at bind |
//! | `RDS_INFO_DIR` | where `rds-info` finds this process (default `$XDG_RUNTIME_DIR/rds-rs`, else `/tmp/rds-rs-<uid>`) |
//! | `RDS_IB_PSK_FILE`, `RDS_IB_PSK_TCP` | IB's verbs-only setup and whether it also serves TCP (builds with IB) |
//!
//! Modules: [`table`] (descriptor numbers, the engine, fork), `addr`
//! (sockaddr in and out), `msg` (sendmsg / recvmsg, cmsgs, blocking),
//! `opts` (setsockopt / getsockopt / ioctl / fcntl), `poll` (`rds_poll`:
//! `poll` that reads an RDS socket's connections while it waits).
//!
//! A blocking receive waits on the descriptor itself; a blocking send
//! until the event that lets it go on (room in the send buffer, the
//! congestion map update that clears its destination port) wakes it
//! ([`rds_sock::RdsSocket::send_msg_wait`]). A blocking receive
//! without SO_RCVTIMEO follows SA_RESTART as the kernel's (restarted with
//! it, EINTR without); a receive with SO_RCVTIMEO and a blocking send fail
//! with EINTR on any signal (the kernel would restart them under
//! SA_RESTART). Timeouts are ETIMEDOUT, as the kernel's RDS.
//!
//! Edge-triggered epoll reports a change of readiness: a datagram that
//! arrives while earlier ones are still queued raises no new edge (the
//! kernel's socket wakes its waiters on each); programs that read until
//! EAGAIN, as edge-triggered programs must, see no difference.
//!
//! fork: the child's copy of an RDS socket fails every call with EBADF
//! but `rds_close` (the engine's threads do not exist there); the parent's
//! sockets are untouched; sockets the child opens start an engine of its
//! own. `rds_fork_child` does this (with `Engine::forget_after_fork`, which
//! also clears the dead threads out of parking_lot's wait queue); the
//! library registers it with `pthread_atfork` when it is loaded and on the
//! first `rds_socket`. As after any fork of a multithreaded process, a lock
//! that another thread held at the instant of fork stays taken in the
//! child; forking while other threads are inside RDS calls is not safe.

// The C ABI takes raw pointers as the kernel's system calls do, checks
// NULL as the kernel checks its user pointers, and otherwise trusts them,
// as libc does: the entry points are `extern "C" fn`s with libc's
// signatures, not `unsafe fn`s.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

use libc::{c_int, c_long, c_ulong, c_void, msghdr, size_t, sockaddr, socklen_t, ssize_t};

mod addr;
mod msg;
mod opts;
mod poll;
pub mod table;

/// AF_RDS / PF_RDS.
pub const AF_RDS: c_int = 21;

/// An errno value.
pub type Errno = i32;

pub(crate) fn last_errno() -> Errno {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

pub(crate) fn io_errno(e: io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

pub(crate) fn cvt(r: c_int) -> Result<c_int, Errno> {
    if r < 0 { Err(last_errno()) } else { Ok(r) }
}

fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs an entry point: errno set on failure (and restored on success, as
/// a system call leaves it), a panic turned into EIO.
fn ffi<T>(fail: T, f: impl FnOnce() -> Result<T, Errno>) -> T {
    // SAFETY: as in set_errno.
    let saved = unsafe { *libc::__errno_location() };
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => {
            set_errno(saved);
            v
        }
        Ok(Err(e)) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// `socket(AF_RDS, SOCK_SEQPACKET [| SOCK_NONBLOCK | SOCK_CLOEXEC], 0)`.
/// EAFNOSUPPORT for another domain, EINVAL for other type flags,
/// ESOCKTNOSUPPORT for another type or a protocol (as `rds_create`).
#[unsafe(no_mangle)]
pub extern "C" fn rds_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    ffi(-1, || {
        table::register_atfork();
        if domain != AF_RDS {
            return Err(libc::EAFNOSUPPORT);
        }
        let flags = ty & (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        if base & !0xf != 0 {
            return Err(libc::EINVAL);
        }
        if base != libc::SOCK_SEQPACKET || protocol != 0 {
            return Err(libc::ESOCKTNOSUPPORT);
        }
        table::open(flags & libc::SOCK_NONBLOCK != 0, flags & libc::SOCK_CLOEXEC != 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_bind(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        // SAFETY: `a` is NULL or holds `len` bytes (the caller's contract).
        let a = unsafe { addr::read(a, len, addr::Use::Bind) }?;
        if !e.transport_set.load(Ordering::Relaxed) {
            if let Some(t) = table::env_transport() {
                e.sock.set_transport_raw(t).map_err(io_errno)?;
            }
        }
        e.sock.bind(a).map_err(io_errno).map(|_| 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_connect(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        // SAFETY: as in rds_bind.
        let a = unsafe { addr::read(a, len, addr::Use::Connect) }?;
        e.sock.connect(a).map_err(io_errno).map(|_| 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_getsockname(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        let local = e.sock.local_addr().map_err(io_errno)?;
        // rds_getname: unbound is AF_UNSPEC, or the connected address's
        // family with a zero address.
        let shown = if local.ip().is_unspecified() && local.port() == 0 {
            match e.sock.peer_addr().ok() {
                None => None,
                Some(SocketAddr::V6(p)) if p.ip().to_ipv4_mapped().is_none() => {
                    Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0))
                }
                Some(_) => Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)),
            }
        } else {
            Some(local)
        };
        // SAFETY: `a` / `len` NULL or valid (the caller's contract).
        unsafe { addr::write(&addr::encode(shown), a, len) }.map(|_| 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_getpeername(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        let peer = e.sock.peer_addr().map_err(io_errno)?;
        // SAFETY: as in rds_getsockname.
        unsafe { addr::write(&addr::encode(Some(peer)), a, len) }.map(|_| 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_sendmsg(fd: c_int, m: *const msghdr, flags: c_int) -> ssize_t {
    ffi(-1, || {
        let e = table::get(fd)?;
        if m.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: a valid msghdr (the caller's contract); read unaligned.
        let m = unsafe { m.read_unaligned() };
        // SAFETY: its pointers are NULL or valid for their lengths.
        unsafe { msg::sendmsg(&e, &m, flags) }.map(|n| n as ssize_t)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    a: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    ffi(-1, || {
        let e = table::get(fd)?;
        if !a.is_null() && alen as usize > std::mem::size_of::<libc::sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        let mut iov = libc::iovec { iov_base: buf.cast_mut(), iov_len: len };
        // SAFETY: a zeroed msghdr is valid plain data.
        let mut m: msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_name = a.cast_mut().cast();
        m.msg_namelen = if a.is_null() { 0 } else { alen };
        // SAFETY: buf holds len bytes, a holds alen (the caller's contract).
        unsafe { msg::sendmsg(&e, &m, flags) }.map(|n| n as ssize_t)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_recvmsg(fd: c_int, m: *mut msghdr, flags: c_int) -> ssize_t {
    ffi(-1, || {
        let e = table::get(fd)?;
        if m.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: a valid msghdr (the caller's contract).
        let mut h = unsafe { m.read_unaligned() };
        // SAFETY: its pointers are NULL or valid for their lengths.
        let n = unsafe { msg::recvmsg(&e, &mut h, flags) }?;
        // SAFETY: as above; writes back the lengths and flags.
        unsafe { m.write_unaligned(h) };
        Ok(n as ssize_t)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    a: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    ffi(-1, || {
        let e = table::get(fd)?;
        let mut iov = libc::iovec { iov_base: buf, iov_len: len };
        // SAFETY: zeroed plain data.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: a zeroed msghdr is valid plain data.
        let mut m: msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        if !a.is_null() {
            m.msg_name = (&mut storage as *mut libc::sockaddr_storage).cast();
            m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
        }
        // SAFETY: buf holds len writable bytes (the caller's contract).
        let n = unsafe { msg::recvmsg(&e, &mut m, flags) }?;
        if !a.is_null() {
            let raw = addr::Raw { storage, len: m.msg_namelen as usize };
            // SAFETY: a / alen valid (the caller's contract).
            unsafe { addr::write(&raw, a, alen) }?;
        }
        Ok(n as ssize_t)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_setsockopt(fd: c_int, level: c_int, name: c_int, v: *const c_void, len: socklen_t) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        // SAFETY: v holds len bytes (the caller's contract).
        unsafe { opts::set(&e, level, name, v, len) }.map(|_| 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_getsockopt(fd: c_int, level: c_int, name: c_int, v: *mut c_void, len: *mut socklen_t) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        // SAFETY: len valid, v holds *len bytes (the caller's contract).
        unsafe { opts::get(&e, level, name, v, len) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        // SAFETY: arg is what the request takes (the caller's contract).
        unsafe { opts::ioctl(fd, &e, req, arg) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    ffi(-1, || {
        let e = table::get(fd)?;
        opts::fcntl(fd, &e, cmd, arg)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_close(fd: c_int) -> c_int {
    ffi(-1, || table::close(fd).map(|_| 0))
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_dup(fd: c_int) -> c_int {
    ffi(-1, || table::dup_min(fd, 0, false))
}

/// `dup2`: `old` need not be ours (then `new`, if ours, is forgotten as
/// the kernel's dup2 closes it).
#[unsafe(no_mangle)]
pub extern "C" fn rds_dup2(old: c_int, new: c_int) -> c_int {
    ffi(-1, || table::dup3(old, new, 0, true))
}

#[unsafe(no_mangle)]
pub extern "C" fn rds_dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    ffi(-1, || table::dup3(old, new, flags, false))
}

/// 1 if `fd` is an RDS descriptor of this library (lock-free below 2^20).
#[unsafe(no_mangle)]
pub extern "C" fn rds_is_rds_fd(fd: c_int) -> c_int {
    c_int::from(table::is_ours(fd))
}

/// In a child after fork: forget the parent's engine and sockets (see the
/// crate docs). Idempotent; also run by the library's atfork handler.
#[unsafe(no_mangle)]
pub extern "C" fn rds_fork_child() {
    let _ = catch_unwind(table::fork_child);
}

extern "C" fn init() {
    table::register_atfork();
}

/// The library's constructor: registers the atfork handlers at load.
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
