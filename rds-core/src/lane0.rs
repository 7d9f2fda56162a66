//! The lane-0 hold: a socket's messages sent on path 0 before the
//! multipath handshake keep its later messages off its own lane until the
//! peer has *read* them.
//!
//! Before the path count is known every message goes on path 0
//! (`Connection::select_path`); after it, a socket's messages go on its
//! lane (`Node::take_lane`: a socket that sent before the count was known
//! keeps its port's). A message on the lane must not be delivered
//! before the socket's earlier messages on path 0, and the two paths are
//! separate byte streams that the peer reads in whatever order its
//! transport finds them ready. The acks of RDS-TCP say only that the
//! peer's TCP queued the bytes (`snd_una`), not that its RDS read them: a
//! peer that reads the lane's socket first (it became ready in the same
//! poll round, or path 0's bytes were still in its receive queue when it
//! looked) delivers the lane's message first. (The kernel reads each
//! socket from its data-ready callback as segments arrive, which keeps
//! that order in practice; a userspace reader has no such callback, and
//! ours once tried to read path 0 before every lane, which still left a
//! window: bytes that came to path 0, and then to the lane, between its
//! look at path 0 and its read of the lane.)
//!
//! So the hold ends when the peer shows it read them: a pong answering a
//! probe ping sent on path 0 after them. The peer processes a path's
//! messages in order and answers a ping when it processes it, after
//! everything before it was delivered (`rds_recv_incoming`, and
//! [`Node::received`] here). Pongs come back in the order of the pings:
//! the k-th pong answers the k-th ping (`Path::proof_pings`, in transmit
//! order, popped per pong; `Path::read_through` becomes the popped ping's
//! sequence number). A kernel answers every ping; we answer every probe
//! ping too, up to `mprds::PROBE_PONGS_QUEUED` pongs waiting (beyond that
//! one pong answers several, and the k-th pong answers a later ping than
//! the k-th: taking it for the k-th is still safe). The count runs
//! across path 0's connections: a ping is answered once (a retransmitted
//! one the peer had before is dropped by the duplicate rule, its first
//! copy was answered), and an answer the peer queued and could not
//! deliver before its connection ended is resent on the next one, first
//! (every message of a path is). So a ping's number waits for its pong
//! from its first transmission until a pong takes it, whatever connection
//! either comes on; clearing them at a reset once took an old ping's pong,
//! resent on the new connection, for the answer to the new connection's
//! ping, and ended a hold while the held messages resent there were still
//! unread. (A peer that restarts leaves numbers no pong will take: its
//! new instance's pongs take them first, which only delays, as above.)
//! The reverse would not be safe: pongs the peer queued for a previous
//! instance of ours and never sent reach this one, which would count them
//! for its own pings. Ours drop such pongs when the restart shows
//! (`Connection::peer_gen_update`). A 6.1 kernel keeps them (at a
//! restart it flushes only its retransmit queue), so right after a
//! restart of ours a kernel peer may end a hold early: a gap, not seen in
//! a test (the kernel reads as its TCP receives, so the bytes it acked
//! and has not read are few).
//! So that no hold waits for an answer that will not come, a pong that
//! leaves a hold unproven asks again (a fresh ping), and so does a check
//! of path 0 after [`PROOF_CHECK_AFTER`], doubling, while holds remain;
//! after [`PROOF_CHECKS_MAX`] checks without any pong the peer is taken
//! for one that answers no ping (`ping_enable` off) and its holds end
//! (`mprds_proof_unanswered`).
//!
//! A held message that was acked (or cancelled after it was sent) moves to
//! `Path::lane0_wire` (per socket: its highest sequence and how many)
//! until `read_through` passes it; one that is still queued or unacked
//! keeps its count on the socket (`Sock::lane0_backlog`) as before. The
//! hold costs one round trip more than the acks did, once per socket per
//! handshake. Holds outlive path 0's connection: the peer reads what its
//! TCP had of the old connection before it takes the next one for the
//! same path, and the next instance's ping asks. A socket whose lane is
//! path 0, or a peer that turns out to have one path, holds nothing.

use std::time::{Duration, Instant};

use crate::message::QueuedMsg;
use crate::node::{Node, Timer};
use crate::path::{Path, PathState};
use crate::types::{ConnId, PathId, SockId};
use crate::wire::PROBE_PORT;

/// Probe pings in flight on path 0 from which a read proof is still asked
/// for more (`Node::ask_read_proof`).
pub const PROOF_PINGS_MAX: usize = 16;

/// After a hold of acked messages appears, when path 0 checks that the
/// peer's proof came (`Node::proof_due`); each check that finds no pong
/// since the previous one doubles the next.
pub const PROOF_CHECK_AFTER: Duration = Duration::from_millis(500);

/// Checks in a row without a pong after which the peer is taken for one
/// that does not answer pings (`ping_enable` off): its holds end at the
/// acks, as they did before this rule.
pub const PROOF_CHECKS_MAX: u8 = 3;

impl Node {
    /// Messages of socket `s` that held its lane left path 0's queues on
    /// the wire (acked, or cancelled after they were sent), the last
    /// numbered `seq`: the hold goes on until the peer shows it read them,
    /// unless it already did, or the peer has one path (no lane to hold).
    pub(crate) fn lane0_left(&mut self, conn: ConnId, s: SockId, seq: u64, n: u32) {
        if self.lane0_needless(conn, s) || seq < self.conn(conn).paths[0].read_through {
            self.release_lane0(conn, s, n);
            return;
        }
        let hint = self.ep.now_hint;
        let p0 = &mut self.conn_mut(conn).paths[0];
        p0.hold_lane0(seq, s, n);
        if p0.proof_at.is_none() {
            // From the latest `now` given (the path's accept or path up
            // gave one before any ack): a check that comes early only
            // asks again.
            if let Some(at) = hint.map(|t| t + PROOF_CHECK_AFTER) {
                p0.proof_at = Some(at);
                self.schedule(at, Timer::Proof(conn));
            }
        }
    }

    /// Path 0's check of its holds (module docs): nothing unproven, or a
    /// pong since the last check, starts the count again; otherwise a
    /// fresh ping asks again, and after [`PROOF_CHECKS_MAX`] checks the
    /// holds end (`mprds_proof_unanswered`).
    pub(crate) fn proof_due(&mut self, conn: ConnId, now: Instant) {
        let npaths = self.conn(conn).npaths;
        let p0 = &mut self.conn_mut(conn).paths[0];
        p0.proof_at = None;
        if p0.lane0_wire.is_empty() {
            p0.proof_checks = 0;
            return;
        }
        if p0.state != PathState::Up || npaths == 0 {
            // Path 0's next instance asks when it comes up, the handshake's
            // pong when the count is known; no check counts meanwhile.
            let at = now + PROOF_CHECK_AFTER;
            p0.proof_at = Some(at);
            self.schedule(at, Timer::Proof(conn));
            return;
        }
        p0.proof_checks = if std::mem::take(&mut p0.pong_since_check) { 0 } else { p0.proof_checks + 1 };
        if p0.proof_checks >= PROOF_CHECKS_MAX {
            p0.proof_checks = 0;
            self.ep.counters.mprds_proof_unanswered += 1;
            self.release_held(conn, |_| true);
            return;
        }
        let at = now + PROOF_CHECK_AFTER * (1 << p0.proof_checks);
        p0.proof_at = Some(at);
        self.schedule(at, Timer::Proof(conn));
        self.ask_read_proof(conn, true);
    }

    /// Whether socket `s` has no lane to hold on `conn`: the peer has one
    /// path, or the socket's lane is path 0 (`Node::lane_now`).
    fn lane0_needless(&self, conn: ConnId, s: SockId) -> bool {
        let c = self.conn(conn);
        match c.npaths {
            0 => false,
            1 => true,
            _ => self.lane_now(s, conn).is_none_or(|lane| lane == 0),
        }
    }

    /// One message of socket `s` (or `n`) no longer holds its lane.
    pub(crate) fn release_lane0(&mut self, conn: ConnId, s: SockId, n: u32) {
        let Some(sock) = self.sock_mut(s) else { return };
        let held = sock.lane0(conn);
        *held = held.saturating_sub(n);
        if *held == 0 {
            for i in 1..self.conn(conn).paths.len() {
                self.kick(PathId { conn, index: i as u8 });
            }
        }
    }

    /// Ends the holds of acked messages on `conn` that `done` picks
    /// (`Path::lane0_wire` entries).
    fn release_held(&mut self, conn: ConnId, done: impl FnMut(&(u64, SockId, u32)) -> bool) {
        for (s, n) in self.conn_mut(conn).paths[0].take_lane0(done) {
            self.release_lane0(conn, s, n);
        }
    }

    /// A probe pong arrived on path `pid` (of the current instance): the
    /// oldest probe ping in flight there was read, and everything before
    /// it. The holds it passes end; one left unproven asks again.
    pub(crate) fn read_proof(&mut self, pid: PathId) {
        let Some(path) = self.path_mut(pid) else { return };
        path.pong_since_check = true;
        let Some(seq) = path.proof_pings.pop_front() else { return };
        path.read_through = path.read_through.max(seq);
        if pid.index != 0 {
            return;
        }
        let through = path.read_through;
        self.release_held(pid.conn, |&(q, _, _)| q < through);
        self.ask_read_proof(pid.conn, true);
    }

    /// Queues a probe ping on path 0 when a hold of acked messages waits
    /// for the peer's proof and no ping already asks for it: one queued and
    /// not yet sent, or (unless `after_pong`, see the module docs) one in
    /// flight sent after the held messages. Asked when an ack moves a hold
    /// to `lane0_wire`, when a pong leaves one, when the path count becomes
    /// known and when path 0 comes up; never while the count is unknown
    /// (the handshake's pong asks then).
    pub(crate) fn ask_read_proof(&mut self, conn: ConnId, after_pong: bool) {
        if self.conn(conn).npaths == 0 {
            return;
        }
        // Sockets with no lane to hold (the count became known) are free.
        let needless: Vec<SockId> =
            self.conn(conn).paths[0].lane0_wire.iter().map(|e| e.1).filter(|&s| self.lane0_needless(conn, s)).collect();
        if !needless.is_empty() {
            self.release_held(conn, |e| needless.contains(&e.1));
        }
        let p0 = &self.conn(conn).paths[0];
        let Some(last) = p0.lane0_wire.iter().map(|e| e.0).max() else { return };
        if p0.state != PathState::Up || p0.proof_pings.len() >= PROOF_PINGS_MAX {
            return;
        }
        let queued = p0.send_queue.iter().any(|m| m.is_probe() && m.hdr.sequence > last);
        // After a pong a ping in flight does not count: its pong may be
        // the one that just came (module docs).
        let in_flight = !after_pong && p0.proof_pings.iter().any(|&q| q > last);
        if queued || in_flight {
            return;
        }
        if self.send_probe(PathId { conn, index: 0 }, PROBE_PORT, 0) {
            self.ep.counters.mprds_read_proof += 1;
        }
    }
}

/// The hold's state on a path.
impl Path {
    /// Records a hold of `n` messages of socket `s` up to `seq` until
    /// `read_through` passes it (one entry per socket).
    pub(crate) fn hold_lane0(&mut self, seq: u64, s: SockId, n: u32) {
        match self.lane0_wire.iter_mut().find(|e| e.1 == s) {
            Some(e) => {
                e.0 = e.0.max(seq);
                e.2 += n;
            }
            None => self.lane0_wire.push((seq, s, n)),
        }
    }

    /// The holds `done` picks, removed: their sockets and message counts.
    pub(crate) fn take_lane0(&mut self, mut done: impl FnMut(&(u64, SockId, u32)) -> bool) -> Vec<(SockId, u32)> {
        let mut taken = Vec::new();
        self.lane0_wire.retain(|e| {
            if done(e) {
                taken.push((e.1, e.2));
                false
            } else {
                true
            }
        });
        taken
    }

    /// A message goes on the wire: a probe ping's number waits for its
    /// pong, from its first transmission (a retransmitted one is answered
    /// once too: by the peer's answer to the first, if it had it, resent
    /// if need be; else when it reads this one).
    /// Past [`PROOF_PINGS_MAX`] times four the newest are not recorded (a
    /// pong then takes an older number: safe, see the module docs).
    pub(crate) fn note_transmit(&mut self, m: &QueuedMsg) {
        if m.is_probe() && !m.flags.retransmitted && self.proof_pings.len() < 4 * PROOF_PINGS_MAX {
            self.proof_pings.push_back(m.hdr.sequence);
        }
    }
}
