//! The functions of `rds-capi` the shim calls (its C ABI: libc's signatures,
//! -1 and errno on failure, as the kernel). They are linked into this shared
//! object from the `rds_capi` rlib; declaring them here keeps the shim
//! independent of how that crate spells its Rust types.

use libc::{c_int, c_long, c_ulong, c_void, msghdr, size_t, sockaddr, socklen_t, ssize_t};

unsafe extern "C" {
    pub(crate) fn rds_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    pub(crate) fn rds_bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    pub(crate) fn rds_getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    pub(crate) fn rds_connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    pub(crate) fn rds_getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    pub(crate) fn rds_sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    pub(crate) fn rds_sendto(
        fd: c_int,
        buf: *const c_void,
        n: size_t,
        flags: c_int,
        addr: *const sockaddr,
        len: socklen_t,
    ) -> ssize_t;
    pub(crate) fn rds_recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    pub(crate) fn rds_recvfrom(
        fd: c_int,
        buf: *mut c_void,
        n: size_t,
        flags: c_int,
        addr: *mut sockaddr,
        len: *mut socklen_t,
    ) -> ssize_t;
    pub(crate) fn rds_setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    pub(crate) fn rds_getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    pub(crate) fn rds_ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int;
    pub(crate) fn rds_fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
    pub(crate) fn rds_close(fd: c_int) -> c_int;
    pub(crate) fn rds_dup(fd: c_int) -> c_int;
    pub(crate) fn rds_dup2(old: c_int, new: c_int) -> c_int;
    pub(crate) fn rds_dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    pub(crate) fn rds_is_rds_fd(fd: c_int) -> c_int;
    pub(crate) fn rds_poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    pub(crate) fn rds_fork_child();
}
