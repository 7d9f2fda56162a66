//! Ack polling on the reactor: the connections with messages awaiting
//! their TCP ack, `SIOCOUTQ` polled on the reactor's timer (backing off
//! while nothing changes) and after every event of a connection; a
//! connection that an event leaves with nothing unacked is no longer
//! watched.

use std::sync::Arc;
use std::time::Instant;

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
    pub(super) fn poll_watched(&mut self) {
        let mut progress = false;
        let mut reports = Vec::new();
        self.watch.retain(|c| {
            let mut tx = c.tx.lock();
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
        self.ack_interval = if progress { min } else { self.ack_interval.saturating_mul(2).min(max) };
        self.next_ack_poll = (!self.watch.is_empty()).then(|| later(Instant::now(), self.ack_interval));
    }

    /// Acks of one connection (after it was readable or writable). When
    /// that leaves nothing awaiting an ack, the connection is no longer
    /// watched: the next sequenced message sent watches it again. In
    /// request/response traffic the response brings the request's ack, so
    /// the ack timer is not needed at all.
    pub(super) fn poll_one(&mut self, conn: &Arc<PathConn>) {
        let (seq, advanced, done) = {
            let mut tx = conn.tx.lock();
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
        if advanced {
            inc(&self.inner.stats.write_space_calls);
        }
        if let (Some(s), Some(sink)) = (seq, self.inner.sink()) {
            sink.acked(conn.info.id, conn.info.inst, s);
        }
    }
}
