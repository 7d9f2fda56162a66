//! Ack polling on the reactor: the connections with messages awaiting
//! their TCP ack, `SIOCOUTQ` polled on the reactor's timer (backing off
//! while nothing changes) and after every event of a connection; a
//! connection that an event leaves with nothing unacked is no longer
//! watched. A connection whose transmit state a writing thread holds is
//! skipped, not waited for (the writer polls as it writes); the timer
//! keeps it watched and asks the writer to poll before it lets go
//! (`PathConn::ack_poll_owed`).

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use rds_core::types::later;

use super::Reactor;
use crate::path_conn::{CLOSED, PathConn};
use crate::stats::inc;

impl Reactor {
    pub(super) fn watch(&mut self, conn: Arc<PathConn>) {
        if conn.state() == CLOSED {
            conn.tx.lock().watched = false;
            return;
        }
        if !self.watch.iter().any(|c| Arc::ptr_eq(c, &conn)) {
            self.watch.push(conn);
        }
        self.ack_interval = self.inner.cfg.ack_poll_min;
        let at = later(Instant::now(), self.ack_interval);
        if self.next_ack_poll.is_none_or(|t| t > at) {
            self.next_ack_poll = Some(at);
        }
    }

    /// Polls `SIOCOUTQ` of every connection with messages awaiting acks.
    pub(super) fn poll_watched(&mut self, now: Instant) {
        inc(&self.inner.stats.ack_timer_polls);
        let mut progress = false;
        let mut reports = Vec::new();
        self.watch.retain(|c| {
            // A thread writing holds the transmit state across its
            // `writev`: it is asked to poll before it lets go
            // (`PathConn::ack_poll_owed`), not waited for. Waiting spun:
            // 82% of a 64 KiB qperf rds_bw sender's sched_yield calls
            // (perf, host loopback) were this lock's, each a system call
            // (and under the VM rig's emulation a costly one). The timer
            // backs off as without progress (not backing off woke the
            // reactor every `ack_poll_min` for nothing while a 64 KiB
            // message was written: qperf rds_bw 64 KiB in the VM rig,
            // 4 rounds, 44-55 MB/s against 63-75 waiting); the writer
            // polls as it lets go, and one that let go just before the
            // request was made leaves it to the next turn of the timer.
            let Some(mut tx) = c.tx.try_lock() else {
                c.ack_poll_owed.store(true, SeqCst);
                return true;
            };
            c.ack_poll_owed.store(false, SeqCst);
            let (seq, advanced) = tx.poll_acks(&c.stream);
            progress |= advanced;
            if let Some(s) = seq {
                reports.push((c.clone(), s));
            }
            if !tx.has_unacked() || c.state() == CLOSED {
                tx.watched = false;
                false
            } else {
                true
            }
        });
        if progress {
            inc(&self.inner.stats.write_space_calls);
        }
        if let Some(sink) = self.inner.sink() {
            for (c, s) in reports {
                sink.acked(c.info.id, c.info.inst, s);
            }
        }
        let (min, max) = (self.inner.cfg.ack_poll_min, self.inner.cfg.ack_poll_max);
        let now_ns = crate::path_conn::ns_of(now);
        let all_answered = !self.watch.is_empty() && self.watch.iter().all(|c| c.answered_within(now_ns, max));
        if all_answered {
            inc(&self.inner.stats.ack_timer_answered);
        }
        let answered = self.inner.cfg.ack_poll_answered;
        self.ack_interval = next_interval(self.ack_interval, progress, all_answered, (min, max, answered));
        self.next_ack_poll = (!self.watch.is_empty()).then(|| later(now, self.ack_interval));
    }

    /// Acks of one connection (after it was readable or writable). When
    /// that leaves nothing awaiting an ack, the connection is no longer
    /// watched: the next sequenced message sent watches it again. In
    /// request/response traffic the response brings the request's ack, so
    /// the ack timer is not needed at all.
    pub(super) fn poll_one(&mut self, conn: &Arc<PathConn>) {
        let (seq, advanced, done) = {
            // Busy: a thread is writing (holding it across `writev`); the
            // next event or the ack timer (which waits) polls instead.
            let Some(mut tx) = conn.tx.try_lock() else { return };
            if !tx.watched {
                return;
            }
            let (seq, advanced) = tx.poll_acks(&conn.stream);
            let done = !tx.has_unacked();
            if done {
                tx.watched = false;
            }
            (seq, advanced, done)
        };
        if done {
            self.watch.retain(|c| !Arc::ptr_eq(c, conn));
        }
        self.inner.acks_polled(self.inner.sink().as_deref(), conn, (seq, advanced));
    }

    /// After a readable event on `conn`, polls the acks of the other
    /// watched paths of the same RDS connection. A reply need not come on
    /// the path its request went on: a kernel's socket sends on the lane
    /// its port hashes to (ours on the request's, rds-core's mprds docs,
    /// "Lanes", unless it sent first), so a request goes on one lane and
    /// the answer comes back on another. Polling only the path with the
    /// event left the request's path to the ack timer: a
    /// `timerfd_settime`, a reactor wake-up, a timerfd read and an ioctl
    /// per message. The event also marks those paths as answered
    /// (`last_rx_event`), so the next message on them arms the ack timer
    /// at `ack_poll_answered`, a fallback, instead of `ack_poll_min`. Only
    /// events on a lane do this, not on path 0: in a stream the receiver's congestion updates come there,
    /// and the streaming lane, its acks then polled every 4 ms, starved
    /// its sender (qperf rds_bw 64 KiB on loopback: a third of its
    /// bandwidth; the polls alone still cost a fifth). Skipped when more
    /// than [`SIBLING_SCAN_MAX`] paths are watched (the scan is linear;
    /// the timer still polls them). With more than one reactor thread the
    /// paths of a connection are spread over them: only this reactor's
    /// watched paths are polled here, the others by their own reactors'
    /// events and timers.
    pub(super) fn poll_siblings(&mut self, conn: &Arc<PathConn>) {
        let id = conn.info.id;
        if id.index == 0 || self.watch.len() > SIBLING_SCAN_MAX {
            return;
        }
        let mut sib = std::mem::take(&mut self.siblings);
        sib.extend(self.watch.iter().filter(|c| c.info.id.conn == id.conn && c.info.id.index != id.index).cloned());
        let now = self.woke_ns;
        for c in &sib {
            c.last_rx_event.store(now, SeqCst);
            self.poll_one(c);
        }
        sib.clear();
        self.siblings = sib;
    }
}

/// The ack timer's interval after a poll of the watched connections
/// (`TcpConfig::ack_poll_min`, `ack_poll_max`, `ack_poll_answered`):
/// `answered` when every one was answered within `max` (request/response:
/// each answer polls the acks, `poll_one`, `poll_siblings` and the
/// assisting reader, so the timer stays the fallback `Inner::ack_timer`
/// armed it as; backing off from `min` instead woke the reactor every few
/// hundred microseconds for as long as the exchange went on), else `min`
/// after progress, else twice the last, up to `max`.
fn next_interval(
    last: Duration,
    progress: bool,
    all_answered: bool,
    (min, max, answered): (Duration, Duration, Duration),
) -> Duration {
    if all_answered {
        answered
    } else if progress {
        min
    } else {
        last.saturating_mul(2).min(max)
    }
}

/// The most watched paths `poll_siblings` scans for the paths of one
/// connection.
const SIBLING_SCAN_MAX: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_backs_off_unless_answered() {
        let (min, max, answered) = (Duration::from_micros(100), Duration::from_millis(4), Duration::from_millis(40));
        let b = (min, max, answered);
        // A stream waiting for acks: back to `min` on progress, doubling
        // without, never past `max`.
        assert_eq!(next_interval(Duration::from_millis(1), true, false, b), min);
        assert_eq!(next_interval(min, false, false, b), min * 2);
        assert_eq!(next_interval(Duration::from_millis(3), false, false, b), max);
        // Answered: the fallback, whatever came before.
        assert_eq!(next_interval(min, true, true, b), answered);
        assert_eq!(next_interval(min, false, true, b), answered);
        // Silent after that: back to the backoff, never past `max`.
        assert_eq!(next_interval(answered, false, false, b), max);
        assert_eq!(next_interval(answered, true, false, b), min);
    }
}
