//! What a child process does with an engine it inherited across fork.

use parking_lot::{Condvar, Mutex};

use super::Engine;

/// Takes the waiters of a condvar and of its mutex out of parking_lot's
/// queue: a waiter sits under the condvar's address, or under the mutex's
/// once a notify requeued it there.
fn forget_waiters<T>(cond: &Condvar, mutex: &Mutex<T>) {
    // SAFETY: only the raw mutex's address is taken.
    let raw = unsafe { mutex.raw() } as *const parking_lot::RawMutex as usize;
    forget_key(cond as *const Condvar as usize);
    forget_key(raw);
}

fn forget_key(key: usize) {
    // SAFETY: unpark_all only touches parking_lot's global queue and the
    // queued threads' parker words. In the child those threads do not exist;
    // their entries (in their stacks, which the child still maps: glibc keeps
    // them for reuse) are taken out of the queue before any new thread of
    // the child can reuse that memory, which is the point.
    unsafe { parking_lot_core::unpark_all(key, parking_lot_core::DEFAULT_UNPARK_TOKEN) };
}

impl Engine {
    /// In the child of a fork: forgets this engine without running its drop
    /// (its threads do not exist in the child, a drop would wait for them),
    /// after taking its threads' entries out of parking_lot's process-wide
    /// wait queue. Those entries live in the dead threads' stacks; glibc
    /// hands such stacks to the child's new threads, whose own entries would
    /// then corrupt the queue (the child's engine would spin forever in a
    /// lock operation). The timer thread waits there whenever it is idle,
    /// and threads blocked in [`crate::RdsSocket`] calls too.
    ///
    /// Call it before the child starts any thread (a `pthread_atfork` child
    /// handler does). What it cannot repair: a lock another thread of the
    /// parent held at the instant of fork (POSIX allows only
    /// async-signal-safe calls in the child of a multithreaded process).
    ///
    /// The answers this thread held for a batch (`crate::batch`) are
    /// forgotten too: they would be written into the parent's connections.
    pub fn forget_after_fork(self) {
        crate::batch::forget_after_fork();
        forget_waiters(&self.inner.timer_cond, &self.inner.state);
        if let Some(socks) = self.inner.socks.try_read() {
            for sh in socks.values() {
                forget_waiters(&sh.cond, &sh.events);
            }
        }
        std::mem::forget(self);
    }
}
