//! Threads and fork.
//!
//! `pthread_create` is intercepted only to mark the threads the RDS stack
//! starts (see [`crate::guard`]): a thread created while the creating thread
//! is inside the stack runs marked; every other thread starts as the program
//! made it. `fork`: a handler registered with `pthread_atfork` (after the
//! first RDS socket, see [`register_fork_handler`]) calls `rds_fork_child`
//! in the child, so that a child (qperf's server forks per test) opens RDS
//! sockets of its own.

use libc::c_void;

use crate::{capi, guard, real};

pub(crate) type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;

struct Start {
    f: StartFn,
    arg: *mut c_void,
}

extern "C" fn marked_start(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the Box<Start> pthread_create below leaked for this thread.
    let s = unsafe { Box::from_raw(p.cast::<Start>()) };
    guard::mark_thread();
    (s.f)(s.arg)
}

/// # Safety
/// As libc's `pthread_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pthread_create(
    t: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut c_void,
) -> libc::c_int {
    if !guard::inside() {
        // SAFETY: the program's own arguments, unchanged.
        return unsafe { real::pthread_create(t, attr, start, arg) };
    }
    let s = Box::into_raw(Box::new(Start { f: start, arg }));
    // SAFETY: marked_start takes back the box; the rest is the caller's.
    let r = unsafe { real::pthread_create(t, attr, marked_start, s.cast()) };
    if r != 0 {
        // SAFETY: the thread was not created, the box is still ours.
        drop(unsafe { Box::from_raw(s) });
    }
    r
}

extern "C" fn fork_child() {
    // SAFETY: called in the child right after fork, as rds-capi asks.
    guard::enter((), || unsafe { capi::rds_fork_child() });
}

/// Registers the child handler, once, after the first RDS socket exists.
///
/// Not at load: glibc runs child handlers in the order they were
/// registered, and rds-capi's own handler (registered by its constructor or
/// by its first `rds_socket`) must run first: it releases the table lock its
/// prepare handler took, which `rds_fork_child` needs.
pub(crate) fn register_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a child handler (a function that lives as long as the process).
        unsafe { libc::pthread_atfork(None, None, Some(fork_child)) };
    });
}
