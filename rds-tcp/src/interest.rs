//! A connection's registration with its reactor's epoll: which events
//! it asks for, and when that changes ([`Registered`], kept under
//! `PathConn::interest`, whose lock orders the changes).
//!
//! - **Writable events only while a write waits for room.** A connection
//!   is registered for both while it connects; the first writable event
//!   that finds no write waiting takes them off ([`Inner::drop_writable`]),
//!   and a write that hits `EAGAIN` puts them back
//!   ([`Inner::want_writable`]). With them on, every segment the peer
//!   acknowledges wakes the reactor (the socket's write-space callback):
//!   a wake-up per message sent, for nothing.
//! - **Readable events off while an assisting thread reads the
//!   connection itself** (`PathConn::quiet`, `crate::assist`,
//!   [`Inner::refresh_quiet`]).
//!
//! Putting events back makes epoll look at the socket once more, so what
//! came while they were off still brings an event.

use mio::Interest;
use mio::unix::SourceFd;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::SeqCst;

use crate::Inner;
use crate::path_conn::{PathConn, Registered};

impl Inner {
    /// Adds writable events to the registration of `conn`, for a write
    /// that hit `EAGAIN` (after `wait_writable` is set): room that came
    /// back since the `EAGAIN` still brings an event (module docs).
    pub(crate) fn want_writable(&self, conn: &PathConn) {
        let mut reg = conn.interest.lock();
        let want = Registered { writable: true, ..*reg };
        self.register_as(conn, &mut reg, want);
    }

    /// After a writable event: no write waits for room, so writable events
    /// come off the registration (the lock orders this against a writer
    /// adding them back).
    pub(crate) fn drop_writable(&self, conn: &PathConn) {
        let mut reg = conn.interest.lock();
        if reg.writable && !conn.wait_writable.load(SeqCst) {
            let want = Registered { writable: false, ..*reg };
            self.register_as(conn, &mut reg, want);
        }
    }

    /// Readable events on the registration exactly while no assisting
    /// thread took them off (`PathConn::quiet`, `crate::assist`).
    pub(crate) fn refresh_quiet(&self, conn: &PathConn) {
        let mut reg = conn.interest.lock();
        let want = Registered { readable: conn.quiet.load(SeqCst) == 0, ..*reg };
        self.register_as(conn, &mut reg, want);
    }

    /// Changes the registration of `conn` to `want` (with the lock held).
    /// An error leaves it as it was: the reactor deregistered it (it is
    /// closing).
    fn register_as(&self, conn: &PathConn, reg: &mut Registered, want: Registered) {
        if *reg == want {
            return;
        }
        let interest = match (want.readable, want.writable) {
            (true, true) => Some(Interest::READABLE | Interest::WRITABLE),
            (true, false) => Some(Interest::READABLE),
            (false, true) => Some(Interest::WRITABLE),
            // Nothing: errors and hang-ups still come (epoll always
            // reports them). Not mio's `PRIORITY`: a socket's data wakes
            // an `EPOLLPRI` waiter too (`sys::epoll_quiet`), which made
            // the reactor sleep and wake once more per message an
            // assisting thread read (qperf `rds_lat` in the VM rig: 1.6
            // voluntary switches of the reactor per round trip against
            // 0.5 `epoll_wait` calls).
            (false, false) => None,
        };
        let fd = conn.stream.as_raw_fd();
        let registry = &self.reactors[conn.reactor].registry;
        let done = match interest {
            Some(i) => registry.reregister(&mut SourceFd(&fd), conn.token, i),
            None => crate::sys::epoll_quiet(registry.as_raw_fd(), fd, conn.token),
        };
        if done.is_ok() {
            *reg = want;
        }
    }
}
