//! Who is calling: the program, or the RDS stack inside this object.
//!
//! The shim exports libc's names, so every call to `read`, `send`, `close`
//! ... made by the RDS stack itself (rds-capi, rds-sock, mio, std) also lands
//! in the shim: for instance the readiness descriptor handed to the program
//! is kept in sync with `send` / `recv` on that very descriptor. Those calls
//! must reach the kernel. Two marks on the calling thread say so:
//!
//! * a depth counter, raised for the duration of every call into rds-capi
//!   ([`enter`]): whatever the stack calls on this thread meanwhile goes to
//!   libc;
//! * threads started while the mark is up (the engine's and the transport's
//!   threads, see [`crate::threads`]) carry it for their whole life.
//!
//! A program's signal handler that runs while its thread is inside a
//! blocking RDS call shares the mark: an RDS socket used from such a handler
//! would reach the kernel's descriptor (a plain socket pair), not RDS.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// True while this thread is inside the RDS stack (or is one of its threads).
pub(crate) fn inside() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Marks this thread as the RDS stack's for good (set at its start).
pub(crate) fn mark_thread() {
    DEPTH.with(|d| d.set(d.get() + 1));
}

pub(crate) fn set_errno(e: libc::c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Calls `f` (a call into rds-capi) with this thread marked; a panic does not
/// cross the C boundary: it becomes `fail` with errno EIO.
pub(crate) fn enter<R: Copy>(fail: R, f: impl FnOnce() -> R) -> R {
    DEPTH.with(|d| d.set(d.get() + 1));
    let r = catch_unwind(AssertUnwindSafe(f));
    DEPTH.with(|d| d.set(d.get() - 1));
    match r {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// Whether `fd` is an RDS socket the program owns (false for every call made
/// from inside the RDS stack).
pub(crate) fn is_rds(fd: libc::c_int) -> bool {
    // SAFETY: rds_is_rds_fd only looks the number up.
    fd >= 0 && !inside() && enter(0, || unsafe { crate::capi::rds_is_rds_fd(fd) }) != 0
}
