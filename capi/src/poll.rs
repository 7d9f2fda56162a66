//! `rds_poll`: `poll(2)` that, while it waits for an RDS socket to turn
//! readable, reads the socket's connections itself
//! ([`rds_sock::RdsSocket::poll_with`]).

use std::time::Duration;

use libc::{c_int, nfds_t, pollfd};

use crate::{Errno, cvt, ffi, io_errno, table};

/// The most entries `rds_poll` looks through for RDS descriptors; a
/// longer set is left to libc's `poll` as it is (the kernel's own limit
/// is RLIMIT_NOFILE, which it checks).
const SCAN_MAX: nfds_t = 1 << 16;

/// `poll(2)` of `fds`. When exactly one of them is an RDS descriptor and
/// it asks for `POLLIN`, the wait also polls the TCP connections that
/// socket's next message will likely come on and reads and delivers what
/// arrives there in the calling thread, as a blocking receive does: a
/// message then wakes this thread alone, where it woke the engine's
/// reactor, which read it and raised the descriptor. The result is
/// `poll`'s: every entry's `revents`, the count of nonzero ones, 0 on
/// timeout, -1 with `errno` (`EINTR` on a signal, never restarted). Any
/// other set is libc's `poll` unchanged. The LD_PRELOAD shim's `poll`
/// calls it for the program's own threads.
#[unsafe(no_mangle)]
pub extern "C" fn rds_poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    ffi(-1, || {
        if fds.is_null() || nfds == 0 || nfds > SCAN_MAX {
            // SAFETY: the caller's arguments, unchanged (the kernel checks them).
            return cvt(unsafe { libc::poll(fds, nfds, timeout) });
        }
        // SAFETY: `fds` points at `nfds` pollfds (the caller's contract,
        // as for poll; a bad pointer is the caller's fault, as with libc).
        let set = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
        match one_rds_reader(set) {
            Some((me, e)) => {
                let wait = u64::try_from(timeout).ok().map(Duration::from_millis);
                let n = e.sock.poll_with(set, me, wait).map_err(io_errno)?;
                Ok(n as c_int)
            }
            // SAFETY: as above.
            None => cvt(unsafe { libc::poll(fds, nfds, timeout) }),
        }
    })
}

/// The one RDS descriptor of `set` and its socket, when there is exactly
/// one and it asks for `POLLIN`.
fn one_rds_reader(set: &[pollfd]) -> Option<(usize, std::sync::Arc<table::Entry>)> {
    let mut found = None;
    for (i, p) in set.iter().enumerate() {
        if table::is_ours(p.fd) {
            if found.is_some() {
                return None;
            }
            found = Some(i);
        }
    }
    let me = found?;
    if set[me].events & libc::POLLIN == 0 {
        return None;
    }
    let e: Result<_, Errno> = table::get(set[me].fd);
    e.ok().map(|e| (me, e))
}
