//! Replies written as a batch ([`crate::TcpTransport::kick_later`]): a
//! program that works through messages already received (its socket has
//! more queued for it) and answers each one leaves its answers queued, and
//! they go out together, in one `writev`.
//!
//! Which sends may wait, and when the answering thread writes them, is the
//! socket layer's decision (rds-sock's `batch` module: a send by the thread
//! that last received from the socket while the socket has more received
//! messages queued; written every 8 such sends, with the first send that
//! finds nothing queued, before any wait). This module gives the bound: the
//! connection's reactor writes what such a send left queued at the latest
//! [`crate::TcpConfig::reply_batch`] ([`REPLY_BATCH_MAX`] by default) after
//! it (the flush of `crate::coalesce`'s windows, on the reactor's timer),
//! so a program that answers one message and then does something else for
//! long, without a send, a receive or a wait on the socket, delays its
//! answer by at most that much. The timer is only ever moved earlier and
//! one flush is pending per connection at a time, so the reactor wakes for
//! it at most once per `reply_batch` per connection, however many sends
//! wait.
//!
//! With 16 requests in flight, each answered (`rds-window`, 64 B, VM rig,
//! three rounds alternating in one boot), the answers and the requests
//! they let out went out up to 8 per write instead of one each: 15.5-17.7
//! k answers/s against 11.1-11.8 k before (the kernel's RDS-TCP: 6.1-10.5
//! k); on the host loopback 165-167 k against 126-151 k. One request in
//! flight never has a message queued when it sends, and is unchanged.
//! `tcp_tx_batched` counts the sends left for later.

use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use rds_core::PathInfo;

use crate::path_conn::UP;
use crate::stats::inc;

/// The longest a send left for later ([`crate::TcpTransport::kick_later`]) waits
/// for its write by default ([`crate::TcpConfig::reply_batch`]): the
/// reactor writes it then.
pub const REPLY_BATCH_MAX: Duration = Duration::from_millis(2);

impl crate::TcpTransport {
    /// A kick ([`rds_core::RdsTransport::kick`]) that leaves what is
    /// queued on `path` for the caller's next kick of it, with the
    /// reactor's write at the latest [`crate::TcpConfig::reply_batch`]
    /// from now (module docs). False when that is zero, the path is not
    /// up (a kick would do nothing either; it writes when it comes up) or
    /// the transport is closed: nothing was left, kick it now.
    pub fn kick_later(&self, path: PathInfo) -> bool {
        let within = self.inner.cfg.reply_batch;
        if within.is_zero() {
            return false;
        }
        let Some(conn) = self.inner.conn_of(&path).filter(|c| c.state() == UP) else {
            return false;
        };
        inc(&self.inner.stats.tx_batched);
        if !conn.flush_pending.swap(true, SeqCst) {
            let now = Instant::now();
            let reactor = conn.reactor;
            self.inner.reactors[reactor].flush_at(conn, now + within, now);
        }
        true
    }
}
