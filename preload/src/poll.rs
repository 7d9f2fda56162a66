//! `poll`: a program waiting on its RDS descriptor with `poll` gets the
//! blocking receive's way of waiting (rds-capi's `rds_poll`, rds-sock's
//! `RdsSocket::poll_with`): while it waits, the thread also polls the TCP
//! connections its socket's next message will likely come on and reads
//! what arrives itself, so a message wakes the program's thread alone
//! instead of the engine's reactor and then the program. `rds_poll` does
//! this when exactly one entry of the set is an RDS descriptor and it asks
//! for POLLIN, and is libc's `poll` for every other set; the result is
//! `poll`'s either way. `ppoll`, `select`, `pselect` and `epoll` are not
//! interposed: they work on the descriptor unchanged, the reactor reading
//! each message as before.

use libc::{c_int, nfds_t, pollfd, size_t};

use crate::{capi, guard, real};

/// # Safety
/// As libc's `poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    if guard::inside() || nfds == 0 {
        // SAFETY: the caller's arguments, unchanged.
        unsafe { real::poll(fds, nfds, timeout) }
    } else {
        // SAFETY: the caller's arguments, unchanged; rds_poll hands any set
        // that is not one RDS reader's to libc's poll as it is.
        guard::enter(-1, || unsafe { capi::rds_poll(fds, nfds, timeout) })
    }
}

/// # Safety
/// As glibc's `__poll_chk` (fortified `poll`): the set must hold `nfds`
/// entries within `fdslen` bytes, else libc's own check aborts the program.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(fds: *mut pollfd, nfds: nfds_t, timeout: c_int, fdslen: size_t) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < nfds as usize {
        // SAFETY: the caller's arguments, unchanged: libc reports the overflow.
        return unsafe { real::__poll_chk(fds, nfds, timeout, fdslen) };
    }
    // SAFETY: as `poll`, the set's size checked above.
    unsafe { poll(fds, nfds, timeout) }
}
