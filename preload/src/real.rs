//! libc's own functions, found once with `dlsym(RTLD_NEXT, name)`.
//!
//! Every exported function of the shim ends here for a descriptor that is not
//! an RDS socket, and so does every call made from inside the RDS stack (see
//! [`crate::guard`]). The address is looked up on first use and kept in an
//! atomic: no lock, no allocation, nothing that could call back into the shim
//! while it is being resolved (glibc's `dlsym` calls none of the functions
//! the shim exports).

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_long, c_ulong, c_void, msghdr, size_t, sockaddr, socklen_t, ssize_t};

/// The next definition of `name` (NUL-terminated) after ours; aborts with a
/// message when there is none (libc always has them: a missing one means
/// something is badly wrong and there is no sane errno to return).
fn resolve(slot: &AtomicUsize, name: &'static str) -> usize {
    let p = slot.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: `name` is a NUL-terminated static string; RTLD_NEXT is valid in a shared object.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if p == 0 {
        let msg = b"librdspreload: a libc function is missing (dlsym RTLD_NEXT)\n";
        // SAFETY: raw write(2) of a static buffer to stderr; no libc wrapper, no recursion.
        unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
        std::process::abort();
    }
    slot.store(p, Ordering::Relaxed);
    p
}

/// `real_fns! { name(arg: Type, ...) -> Ret; ... }` defines `real::name`,
/// which calls libc's `name`.
macro_rules! real_fns {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {
        $(
            pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
                static SLOT: AtomicUsize = AtomicUsize::new(0);
                let p = resolve(&SLOT, concat!(stringify!($name), "\0"));
                // SAFETY: `p` is libc's function of this name, whose C signature is this one.
                let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute::<usize, _>(p) };
                // SAFETY: the caller passes what libc's function requires (the same arguments it got).
                unsafe { f($($arg),*) }
            }
        )*
    };
}

real_fns! {
    socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    socketpair(domain: c_int, ty: c_int, protocol: c_int, sv: *mut c_int) -> c_int;
    bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    listen(fd: c_int, backlog: c_int) -> c_int;
    accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    __recvfrom_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    close(fd: c_int) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    __poll_chk(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    pthread_create(t: *mut libc::pthread_t, attr: *const libc::pthread_attr_t, start: crate::threads::StartFn, arg: *mut c_void) -> c_int;
}

/// `ioctl` and `fcntl` are variadic in C: they are called through a variadic
/// pointer so the callee sees the calling convention it was compiled for.
macro_rules! real_variadic {
    ($( $name:ident ( $a:ident : $at:ty, $b:ident : $bt:ty, $c:ident : $ct:ty ) -> $ret:ty; )*) => {
        $(
            pub(crate) unsafe fn $name($a: $at, $b: $bt, $c: $ct) -> $ret {
                static SLOT: AtomicUsize = AtomicUsize::new(0);
                let p = resolve(&SLOT, concat!(stringify!($name), "\0"));
                // SAFETY: `p` is libc's variadic function of this name.
                let f: unsafe extern "C" fn($at, $bt, ...) -> $ret = unsafe { std::mem::transmute::<usize, _>(p) };
                // SAFETY: the third argument is passed as the caller passed it to us.
                unsafe { f($a, $b, $c) }
            }
        )*
    };
}

real_variadic! {
    ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
    fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
}
