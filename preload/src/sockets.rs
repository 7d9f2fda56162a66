//! The socket calls that are not data transfer: creation, addresses,
//! options, ioctl, fcntl, close and dup. Each goes to rds-capi when its
//! descriptor is an RDS socket and to libc otherwise; `socket` and
//! `socketpair` decide on the address family.

use libc::{c_int, c_long, c_ulong, c_void, sockaddr, socklen_t};

use crate::{AF_RDS, capi, guard, real};

/// `dispatch!(fd, rds_call, libc_call)`: rds-capi for an RDS socket, libc
/// otherwise; both calls get the caller's arguments unchanged.
macro_rules! dispatch {
    ($fd:expr, $rds:expr, $real:expr) => {
        if guard::is_rds($fd) {
            // SAFETY: the caller's arguments, passed on unchanged; rds-capi checks them as the kernel does.
            guard::enter(-1, || unsafe { $rds })
        } else {
            // SAFETY: the caller's arguments, passed on unchanged to libc.
            unsafe { $real }
        }
    };
}
pub(crate) use dispatch;

/// `-1` with `errno`.
pub(crate) fn fail(e: c_int) -> c_int {
    guard::set_errno(e);
    -1
}

/// # Safety
/// As libc's `socket`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if domain == AF_RDS && !guard::inside() {
        // SAFETY: plain integers.
        let fd = guard::enter(-1, || unsafe { capi::rds_socket(domain, ty, protocol) });
        if fd >= 0 {
            crate::threads::register_fork_handler();
        }
        fd
    } else {
        // SAFETY: plain integers.
        unsafe { real::socket(domain, ty, protocol) }
    }
}

/// The kernel creates both RDS sockets, then refuses to pair them.
///
/// # Safety
/// As libc's `socketpair`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socketpair(domain: c_int, ty: c_int, protocol: c_int, sv: *mut c_int) -> c_int {
    if domain == AF_RDS && !guard::inside() {
        let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        return fail(if base != libc::SOCK_SEQPACKET || protocol != 0 {
            libc::ESOCKTNOSUPPORT
        } else {
            libc::EOPNOTSUPP
        });
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::socketpair(domain, ty, protocol, sv) }
}

/// # Safety
/// As libc's `bind`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    dispatch!(fd, capi::rds_bind(fd, addr, len), real::bind(fd, addr, len))
}

/// # Safety
/// As libc's `connect`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    dispatch!(fd, capi::rds_connect(fd, addr, len), real::connect(fd, addr, len))
}

/// # Safety
/// As libc's `getsockname`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    dispatch!(fd, capi::rds_getsockname(fd, addr, len), real::getsockname(fd, addr, len))
}

/// # Safety
/// As libc's `getpeername`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    dispatch!(fd, capi::rds_getpeername(fd, addr, len), real::getpeername(fd, addr, len))
}

/// RDS has no listen, accept or shutdown (`sock_no_*`: EOPNOTSUPP).
///
/// # Safety
/// As libc's `listen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    if guard::is_rds(fd) {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::listen(fd, backlog) }
}

/// # Safety
/// As libc's `accept`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if guard::is_rds(fd) {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::accept(fd, addr, len) }
}

/// The kernel checks the flags before it looks at the descriptor.
///
/// # Safety
/// As libc's `accept4`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if flags & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) != 0 {
        return fail(libc::EINVAL);
    }
    if guard::is_rds(fd) {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::accept4(fd, addr, len, flags) }
}

/// # Safety
/// As libc's `shutdown`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if guard::is_rds(fd) {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { real::shutdown(fd, how) }
}

/// # Safety
/// As libc's `setsockopt`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    dispatch!(fd, capi::rds_setsockopt(fd, level, name, val, len), real::setsockopt(fd, level, name, val, len))
}

/// # Safety
/// As libc's `getsockopt`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    dispatch!(fd, capi::rds_getsockopt(fd, level, name, val, len), real::getsockopt(fd, level, name, val, len))
}

/// Variadic in C; every request this RDS knows takes a pointer (or nothing).
///
/// # Safety
/// As libc's `ioctl`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    dispatch!(fd, capi::rds_ioctl(fd, req, arg), real::ioctl(fd, req, arg))
}

/// Variadic in C: the third argument, an int or a pointer by `cmd`, is read
/// as a `long`, which carries either.
///
/// # Safety
/// As libc's `fcntl`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    dispatch!(fd, capi::rds_fcntl(fd, cmd, arg), real::fcntl(fd, cmd, arg))
}

/// glibc's name for `fcntl` in programs built with 64-bit file offsets.
///
/// # Safety
/// As libc's `fcntl64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    dispatch!(fd, capi::rds_fcntl(fd, cmd, arg), real::fcntl64(fd, cmd, arg))
}

/// # Safety
/// As libc's `close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    dispatch!(fd, capi::rds_close(fd), real::close(fd))
}

/// # Safety
/// As libc's `dup`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    dispatch!(fd, capi::rds_dup(fd), real::dup(fd))
}

/// rds-capi also sees the call when only `new` is an RDS socket: dup2 closes
/// it.
///
/// # Safety
/// As libc's `dup2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let ours = guard::is_rds(old) || (old != new && guard::is_rds(new));
    if ours {
        // SAFETY: plain integers.
        guard::enter(-1, || unsafe { capi::rds_dup2(old, new) })
    } else {
        // SAFETY: plain integers.
        unsafe { real::dup2(old, new) }
    }
}

/// # Safety
/// As libc's `dup3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let ours = guard::is_rds(old) || (old != new && guard::is_rds(new));
    if ours {
        // SAFETY: plain integers.
        guard::enter(-1, || unsafe { capi::rds_dup3(old, new, flags) })
    } else {
        // SAFETY: plain integers.
        unsafe { real::dup3(old, new, flags) }
    }
}
