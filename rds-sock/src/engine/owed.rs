//! Descriptor updates a wait left for later ([`crate::RdsSocket::poll_with`],
//! [`crate::RdsSocket::recv_msg_wait`]).
//!
//! A program that polls its RDS descriptor and then receives without
//! blocking (rds-tools' rds-stress, an event loop on `poll`) has its poll
//! read the socket's connection itself ([`rds_tcp::RxAssist`]). When that
//! read delivers the socket's next message, raising the descriptor (a
//! `send` of one byte on its socket pair, [`crate::readiness`]) only for
//! the receive that follows to lower it again (a `recv`) costs two system
//! calls per message for nothing: the poll reports the socket readable
//! itself, and the receive brings the descriptor up to date under its own
//! node call, where it finds the queue empty and the descriptor already
//! showing it so (`Inner::run_recv`, `SockShared::deferred`).
//!
//! The descriptor is then behind the socket until that receive: a wait on
//! it that does not go through [`crate::RdsSocket::poll_with`] or a
//! receive (`epoll_wait`, `select`, another thread already in `poll`)
//! would not see the message. So a poll leaves the update for later only
//! when its read left the lane lingering ([`rds_tcp::ASSIST_LINGER`]),
//! and it lists the socket here first: the reactor's timer then runs the
//! transport's linger tick within the linger ([`Inner::settle_owed`]),
//! which brings every listed descriptor that is still behind up to date
//! (`engine_fd_owed_ticked`). A message is thus shown on the descriptor
//! at most [`rds_tcp::ASSIST_LINGER`] late, never lost, as a lingering
//! lane's bytes are. A poll whose read did not leave its lane lingering
//! (a socket that sent nothing since its previous wait, a stream) raises
//! the descriptor at once, as before. The next poll of the socket, or a
//! blocking receive, brings an update left behind up to date before it
//! waits on the descriptor.
//!
//! A blocking receive whose own read delivered more than the message it
//! returns (a window of answers) leaves the rest queued the same way: its
//! wait lists the socket before its assist ends (`RdsSocket::owe_unless_settled`),
//! its end leaves the update for later while the socket is listed
//! (`Inner::settle_unless_owed`), and so does each receive that takes a
//! message and leaves more (`Inner::run_recv`, [`SockShared::keep_deferred`]);
//! the one that empties the queue finds the descriptor showing it empty
//! already, and a poll in between reports the socket readable without
//! raising it (`RdsSocket::report_queued`). Raising the descriptor for
//! the window and lowering it after the last of it cost two system calls
//! per wait.
//!
//! Counted: `engine_fd_raised` (readable bytes sent on any socket's
//! pair), `engine_fd_owed` (waits, a poll's or a blocking receive's, that
//! left the update for later) and `engine_fd_owed_ticked` (of those,
//! updates the tick made).

use std::sync::atomic::Ordering;

use rds_core::SockId;

use super::{Inner, SockShared};

impl Inner {
    /// Lists socket `s`, whose poll is about to leave its descriptor's
    /// update for later (`SockShared::deferred`), for the next linger tick
    /// ([`Inner::settle_owed`]). Called before the poll ends its assist, so
    /// that the tick the assist's linger brings comes after.
    pub(crate) fn owe_fd(&self, sh: &SockShared, s: SockId) {
        self.fd_counts.owed.fetch_add(1, Ordering::Relaxed);
        if !sh.owed_listed.swap(true, Ordering::SeqCst) {
            self.owed.lock().push(s);
            self.owed_any.store(true, Ordering::SeqCst);
        }
    }

    /// The TCP transport's linger tick ([`rds_tcp::TcpTransport::set_linger_tick`],
    /// on a reactor thread): brings the descriptors of the listed sockets
    /// that are still behind up to date. One atomic load when none is
    /// listed.
    pub(crate) fn settle_owed(&self) {
        if !self.owed_any.load(Ordering::SeqCst) {
            return;
        }
        self.owed_any.store(false, Ordering::SeqCst);
        let listed = std::mem::take(&mut *self.owed.lock());
        for s in listed {
            let Some(sh) = self.socks.read().get(&s).cloned() else { continue };
            sh.owed_listed.store(false, Ordering::SeqCst);
            if self.settle_deferred(&sh, s) {
                self.fd_counts.owed_ticked.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The end of a blocking receive ([`crate::RdsSocket::recv_msg_wait`]):
    /// brings socket `s`'s descriptor up to date when an update of it was
    /// left for later, unless the update showed more messages queued and
    /// the socket is listed for the linger tick: the receives that follow
    /// take them without moving the descriptor (the one that empties the
    /// queue finds it showing so), and a wait elsewhere sees them within
    /// the linger.
    pub(crate) fn settle_unless_owed(&self, sh: &SockShared, s: SockId) {
        if sh.deferred_shows_readable() && sh.owed_listed.load(Ordering::SeqCst) {
            return;
        }
        self.settle_deferred(sh, s);
    }

    /// Brings socket `s`'s descriptor up to date when an update of it was
    /// left for later (`SockShared::deferred`); whether one was.
    pub(crate) fn settle_deferred(&self, sh: &SockShared, s: SockId) -> bool {
        let owed = sh.deferred.load(Ordering::SeqCst) && sh.deferred.swap(false, Ordering::SeqCst);
        if owed {
            self.refresh_fd(sh, s);
        }
        owed
    }
}

impl SockShared {
    /// Under the node lock, in a receive that took an update left for
    /// later (`deferred`) and found the socket still readable: leaves it
    /// for later again while the socket is listed for the linger tick,
    /// which then brings it up to date. Whether the receive must not
    /// update the descriptor itself: kept, or the tick took it meanwhile
    /// (the tick stops listing before it takes the update, so a receive
    /// that finds the socket listed after leaving the update is sure of
    /// the tick).
    pub(crate) fn keep_deferred(&self) -> bool {
        self.deferred_readable.store(true, Ordering::SeqCst);
        self.deferred.store(true, Ordering::SeqCst);
        if self.owed_listed.load(Ordering::SeqCst) {
            return true;
        }
        !self.deferred.swap(false, Ordering::SeqCst)
    }
}
