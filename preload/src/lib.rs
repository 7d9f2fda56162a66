//! `librdspreload.so`: run an unmodified AF_RDS program on this userspace
//! RDS.
//!
//! ```text
//! LD_PRELOAD=target/release/librdspreload.so qperf ...
//! ```
//!
//! Loaded with `LD_PRELOAD`, the object exports libc's socket functions
//! under libc's names. `socket(AF_RDS (21), SOCK_SEQPACKET, 0)` returns a
//! descriptor served by rds-capi (the C ABI over `rds-sock`): a real kernel
//! descriptor whose poll state is the RDS socket's, so `poll`, `select` and
//! `epoll` work on it untouched. Every call on an RDS descriptor goes to
//! rds-capi; every other call goes to libc's own function, unchanged (found
//! with `dlsym(RTLD_NEXT)`), as rdma-core's librspreload does for rsockets.
//!
//! Modules:
//! * `sockets`: socket, socketpair, bind, connect, getsockname, getpeername,
//!   listen / accept / accept4 / shutdown (EOPNOTSUPP on RDS, as the
//!   kernel), setsockopt, getsockopt, ioctl, fcntl / fcntl64, close, dup,
//!   dup2, dup3;
//! * `io`: sendto, sendmsg, send, write, writev, sendmmsg, recvfrom,
//!   recvmsg, recv, read, readv, recvmmsg and glibc's fortified `__*_chk`
//!   forms, with the kernel's rules for read / write on a socket;
//! * `poll`: poll and glibc's fortified `__poll_chk` (rds-capi's
//!   `rds_poll` when the set holds one RDS descriptor asking for POLLIN);
//! * `threads`: pthread_create (marks the RDS stack's own threads) and the
//!   fork handler (`rds_fork_child` in the child);
//! * `guard`: which calls come from the RDS stack itself and must reach
//!   libc; no panic crosses the C boundary (EIO);
//! * `real`: libc's functions, resolved once;
//! * `capi`: the rds-capi functions called.
//!
//! The README's section "Run an existing program on it" has the table of
//! what is intercepted and the environment variables.

// Links rds-capi's rlib (library name `rds`) into the object; the shim calls
// its functions through the declarations in `capi`.
use rds as _;

mod capi;
mod guard;
mod io;
mod poll;
mod real;
mod sockets;
mod threads;

/// The kernel's AF_RDS.
pub(crate) const AF_RDS: libc::c_int = 21;
