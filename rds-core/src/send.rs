//! The send side (`net/rds/send.c`): `sendmsg`, queueing with sequence
//! numbers and send-buffer accounting, transmit with ACK_REQUIRED pacing,
//! acks, RDMA completion, cancel, and putting unacked messages back for
//! retransmission when a path resets. Which path a message takes is
//! [`crate::mprds`]'s; the path lifecycle is [`crate::path`]'s.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::connection::Connection;
use crate::message::{MsgFlags, Notification, QueuedMsg, RdmaOp, TxMessage, rdma_flags, rdma_status};
use crate::node::Node;
use crate::path::{Path, PathState};
use crate::types::{ConnId, Errno, PathId, Payload, SockId, TransportKind};
use crate::wire::{self, Ext, Header, MAX_MSG_SIZE};

/// Extras of one `sendmsg` beyond address and payload (ancillary data).
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    /// `RDS_CMSG_RDMA_ARGS`.
    pub rdma: Option<RdmaOp>,
    /// `RDS_CMSG_RDMA_DEST` / `RDS_CMSG_RDMA_MAP`: cookie announced to the peer.
    pub rdma_dest: Option<u64>,
    /// The caller will block and retry on EAGAIN/ENOBUFS (for counters and
    /// wake-ups only; the core itself never blocks).
    pub blocking: bool,
}

/// Summary of messages still queued, per (local, peer) address pair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unsent {
    pub laddr: Option<IpAddr>,
    pub faddr: Option<IpAddr>,
    /// Never transmitted.
    pub queued: usize,
    /// Transmitted, not yet acked.
    pub unacked: usize,
    pub bytes: usize,
}

impl Node {
    /// `sendmsg`. Never blocks: EAGAIN when the send buffer is full and
    /// ENOBUFS when the destination port is congested; a blocking caller
    /// waits for a [`crate::Output::Wake`] of this socket and retries.
    pub fn send(
        &mut self,
        s: SockId,
        dst: Option<SocketAddr>,
        payload: &Payload,
        opts: &SendOptions,
    ) -> Result<usize, Errno> {
        let sock = self.sock(s).ok_or(Errno::EINVAL)?;
        let dst = match dst {
            Some(d) if crate::sock::not_unicast(d.ip()) => return Err(Errno::EINVAL),
            Some(d) => d,
            None => sock.conn_addr.ok_or(Errno::ENOTCONN)?,
        };
        let bound = sock.bound.ok_or(Errno::ENOTCONN)?;
        // rds_sendmsg: an IPv4 source cannot send to an IPv6 address or the
        // reverse (EOPNOTSUPP).
        if bound.is_ipv4() != dst.is_ipv4() {
            return Err(Errno::EOPNOTSUPP);
        }
        let len = payload.len();
        // rds_rdma_bytes: the size limit applies to the remote vector's length.
        let rdma_len = opts.rdma.as_ref().map_or(0, |r| usize::try_from(r.remote_len).unwrap_or(usize::MAX));
        if len as u64 > sock.sndbuf_limit() || len.max(rdma_len) > MAX_MSG_SIZE {
            return Err(Errno::EMSGSIZE);
        }
        let kind = sock.transport.unwrap_or(TransportKind::Tcp);
        let tos = sock.tos;
        let conn = match sock.last_conn {
            // (A collected connection's id finds nothing: look it up again.)
            Some((f, c)) if f == dst.ip() && self.conns.contains(c) => c,
            _ => {
                let c = self.conn_for(bound.ip(), dst.ip(), kind, tos);
                self.sock_mut(s).unwrap().last_conn = Some((dst.ip(), c));
                c
            }
        };
        // Our own sends are not limited: a peer evicted meanwhile is kept.
        self.conn_mut(conn).evicted = false;
        let caps = self.caps_of(self.conn(conn).kind);
        if opts.rdma.is_some() && !caps.rdma {
            return Err(Errno::EOPNOTSUPP);
        }
        // An RDMA_DEST cookie names an MR of this socket; only transports with
        // RDMA have any (the kernel answers EINVAL for an unknown key). It must
        // never go out over TCP: a 6.1 receiver crashes on it in recvmsg.
        if opts.rdma_dest.is_some() && !caps.rdma {
            return Err(Errno::EINVAL);
        }

        let (index, pre_hs, gated) = self.select_path(s, conn, bound.port());
        let pid = PathId { conn, index: index as u8 };
        self.connect_if_down(pid);

        // rds_cong_wait
        let congested = self.ep.cong.congested(&dst.ip(), dst.port());
        if congested {
            if !std::mem::replace(&mut self.sock_mut(s).unwrap().seen_congestion, true) {
                self.cong_watch(s);
            }
            let sock = self.sock_mut(s).unwrap();
            if opts.blocking {
                self.ep.counters.cong_send_blocked += 1;
                self.want_write(s);
            } else {
                if sock.cong_monitor {
                    sock.cong_mask |= crate::cong::monitor_mask(dst.port());
                }
                self.ep.counters.cong_send_error += 1;
            }
            return Err(Errno::ENOBUFS);
        }

        // rds_send_queue_rm: accepted while the *old* byte count is below the
        // limit, so the last message may overshoot it.
        let sock = self.sock_mut(s).unwrap();
        if sock.snd_bytes >= sock.sndbuf_limit() {
            self.ep.counters.send_queue_full += 1;
            self.want_write(s);
            return Err(Errno::EAGAIN);
        }
        sock.snd_bytes += len as u64;
        let ack_required = sock.snd_bytes >= sock.sndbuf_limit() / 2;
        if pre_hs {
            *sock.lane0(conn) += 1;
        }
        let mut hdr = Header::data(bound.port(), dst.port(), len as u32);
        if let Some(cookie) = opts.rdma_dest {
            let _ = hdr.push_extension(Ext::RdmaDest { rkey: cookie as u32, offset: (cookie >> 32) as u32 });
        }
        let msg = QueuedMsg {
            hdr,
            payload: payload.clone(),
            sock: Some(s),
            flags: MsgFlags { ack_required, ..MsgFlags::default() },
            rdma: opts.rdma.clone().map(Arc::new),
            lane0_of: pre_hs.then_some(0),
            gated,
        };
        if gated {
            self.ep.counters.mprds_lane_hold += 1;
        }
        self.enqueue(pid, msg);
        self.wake(s, false);
        Ok(len)
    }

    fn want_write(&mut self, s: SockId) {
        let sock = self.sock_mut(s).unwrap();
        if !sock.wants_write {
            sock.wants_write = true;
            self.ep.write_waiters.push(s);
        }
    }

    /// Queues a message on a path with the next sequence number.
    pub(crate) fn enqueue(&mut self, pid: PathId, msg: QueuedMsg) {
        self.path_mut(pid).expect("path exists").enqueue(msg);
        self.ep.counters.send_queued += 1;
        self.kick(pid);
    }

    /// Next messages to transmit on a path, moved to its retransmit queue;
    /// a pending congestion-map update goes first. At most about `budget`
    /// payload bytes. Returns whether more remain queued.
    pub fn pull(&mut self, pid: PathId, inst: u64, budget: usize, out: &mut Vec<TxMessage>) -> bool {
        let Some(c) = self.conns.get(pid.conn) else { return false };
        let Some(path) = c.paths.get(usize::from(pid.index)) else { return false };
        if path.inst != inst || path.state != PathState::Up {
            return false;
        }
        let conn = pid.conn;
        let (laddr, sends_map) = (c.laddr, self.caps_of(c.kind).sends_cong_map);
        if let Some(lane_map) = self.conns[conn].take_map_due(pid.index, sends_map) {
            let header = self.map_header(laddr, pid.index, !lane_map);
            let map = self.ep.cong.map(laddr);
            out.push(TxMessage {
                header,
                payload: Payload::copy_from(map.as_bytes()),
                ack_required: false,
                rdma: None,
            });
            self.map_taken(laddr);
        }
        // A held path sends only its maps, and on the first connection of a
        // fresh connection object our leading probe (`probe_first`).
        let held = self.path(pid).unwrap().hold;
        if held && !self.conn(conn).probe_passes_hold(pid.index) {
            return false;
        }
        // On a connection the peer has not evidently taken yet
        // (`Path::confirmed`) only maps and our leading probes go out, no
        // socket's message: a 6.1 kernel that finds no free slot for it
        // resets it, and what its TCP had already acked would be lost. (The
        // probe lets a peer that stays silent until it hears from us answer.)
        let (max_packets, max_bytes) = (self.ep.cfg.max_unacked_packets, self.ep.cfg.max_unacked_bytes);
        let mut flushed = Vec::new();
        let ep = &self.ep;
        let lane_held = |s: SockId| ep.sock(s).is_some_and(|k| k.lane0_count(conn) > 0);
        let path = &mut self.conns[conn].paths[usize::from(pid.index)];
        let counts = path.transmit(budget, held, (max_packets, max_bytes), lane_held, out, &mut flushed);
        self.ep.counters.send_ack_required += counts.ack_required;
        self.ep.counters.send_rdma += counts.rdma;
        for m in flushed {
            let status = if m.rdma.is_some() { rdma_status::DROPPED } else { rdma_status::OTHER_ERROR };
            if m.flags.flush {
                self.ep.counters.send_drop_flushed += 1;
                if let Some(s) = m.sock {
                    if let Some(k) = self.sock_mut(s) {
                        k.flushed += 1;
                    }
                }
            }
            self.remove_from_sock(conn, &m, status);
        }
        if self.path(pid).unwrap().send_queue.is_empty() {
            self.ep.counters.send_queue_empty += 1;
        }
        let ep = &self.ep;
        self.path(pid).unwrap().more_to_send(|s| ep.sock(s).is_some_and(|k| k.lane0_count(conn) > 0))
    }

    /// The transport confirms delivery of every message up to `seq` on the
    /// path (TCP: the peer's TCP acked its last byte; IB: the peer's h_ack).
    pub fn acked(&mut self, pid: PathId, inst: u64, seq: u64) {
        let Some(path) = self.conns.get_mut(pid.conn).and_then(|c| c.paths.get_mut(usize::from(pid.index))) else {
            return;
        };
        if path.inst != inst {
            return;
        }
        // The acked messages go through the endpoint's reused list: an ack
        // allocates nothing.
        let mut done = std::mem::take(&mut self.ep.acked);
        path.take_acked(seq, &mut done);
        let mut held = false;
        for mut m in done.drain(..) {
            self.ep.counters.send_drop_acked += 1;
            // A message that held its socket's lane holds it until the
            // peer shows it read it (`crate::lane0`), not just its TCP.
            if let (Some(s), Some(_)) = (m.sock, m.lane0_of.take()) {
                self.lane0_left(pid.conn, s, m.hdr.sequence, 1);
                held = true;
            }
            self.remove_from_sock(pid.conn, &m, rdma_status::SUCCESS);
        }
        self.ep.acked = done;
        if held {
            self.ask_read_proof(pid.conn, false);
        }
    }

    /// The transport completed the RDMA op of message `seq` on the path
    /// with an `RDS_RDMA_*` status (`rds_rdma_send_complete`): the socket's
    /// notification is queued now (NOTIFY_ME, or a failure with RECVERR),
    /// once; the message itself still waits for its ack (or is dropped).
    pub fn rdma_complete(&mut self, pid: PathId, inst: u64, seq: u64, status: i32) {
        let Some(path) = self.path_mut(pid) else { return };
        if path.inst != inst {
            return;
        }
        let Some((s, op)) = path.rdma_done(seq) else { return };
        let Some(sock) = self.sock_mut(s) else { return };
        if op.flags & rdma_flags::NOTIFY_ME != 0 || (status != rdma_status::SUCCESS && sock.recverr) {
            sock.notify_queue.push_back(Notification { user_token: op.user_token, status });
            self.wake(s, false);
        }
    }

    /// `rds_send_remove_from_sock`: release a message's send-buffer bytes,
    /// notify RDMA completion, and release the mprds lane hold.
    fn remove_from_sock(&mut self, conn: ConnId, m: &QueuedMsg, status: i32) {
        let Some(s) = m.sock else { return };
        let mut unblocked = false;
        let Some(sock) = self.sock_mut(s) else { return };
        sock.snd_bytes = sock.snd_bytes.saturating_sub(m.payload.len() as u64);
        if let Some(op) = m.rdma.as_ref().filter(|_| !m.flags.rdma_notified) {
            if op.flags & rdma_flags::NOTIFY_ME != 0 || (status != rdma_status::SUCCESS && sock.recverr) {
                sock.notify_queue.push_back(Notification { user_token: op.user_token, status });
            }
        }
        if m.lane0_of.is_some() {
            let n = sock.lane0(conn);
            *n = n.saturating_sub(1);
            unblocked = *n == 0;
        }
        let waiting = sock.wants_write;
        if waiting {
            sock.wants_write = false;
            self.ep.write_waiters.retain(|w| *w != s);
        }
        self.wake(s, waiting);
        if unblocked {
            let n = self.conn(conn).paths.len();
            for i in 1..n {
                self.kick(PathId { conn, index: i as u8 });
            }
        }
    }

    /// Drops the socket's messages still queued or unacked, all of them or
    /// those to `dst` (`rds_send_drop_to`, RDS_CANCEL_SENT_TO). Messages a
    /// transport is already writing still complete on the wire, so a
    /// dropped message that was transmitted on path 0 before the handshake
    /// keeps holding its socket's lane until the peer shows it read it
    /// (`crate::lane0`): the socket's next messages must not overtake it
    /// on another path. Returns how many were dropped.
    pub fn drop_messages(&mut self, s: SockId, dst: Option<SocketAddr>) -> usize {
        let Some(bound) = self.sock(s).and_then(|k| k.bound) else { return 0 };
        let mut dropped = Vec::new();
        let mut wire = Vec::new();
        for c in self.conns.iter_mut() {
            if c.laddr != bound.ip() || dst.is_some_and(|d| d.ip() != c.faddr) {
                continue;
            }
            let (msgs, sent) = c.cancel(s, dst.map(|d| d.port()));
            dropped.extend(msgs.into_iter().map(|m| (c.id, m)));
            if let Some(last) = sent.iter().max() {
                wire.push((c.id, *last, sent.len() as u32));
            }
        }
        for (conn, last, n) in wire {
            self.lane0_left(conn, s, last, n);
            self.ask_read_proof(conn, false);
        }
        let n = dropped.len();
        self.ep.counters.send_drop_cancelled += n as u64;
        for (conn, m) in dropped {
            self.remove_from_sock(conn, &m, rdma_status::CANCELED);
        }
        n
    }

    /// Messages of socket `s` still queued or unacked. Only the
    /// connections from its bound address are looked at (no other carries
    /// its messages): a socket of a node with many peers, each on an
    /// address of its own, is not charged for the others' queues.
    pub fn pending_messages(&self, s: SockId) -> usize {
        let Some(bound) = self.sock(s).and_then(|k| k.bound) else { return 0 };
        self.conns
            .iter()
            .filter(|c| c.laddr == bound.ip())
            .flat_map(|c| c.paths.iter())
            .flat_map(|p| p.send_queue.iter().chain(p.retrans.iter()))
            .filter(|m| m.sock == Some(s))
            .count()
    }

    /// Messages still on send and retransmit queues, per connection.
    pub fn unsent(&self) -> Vec<Unsent> {
        self.conns.iter().filter_map(Connection::unsent).collect()
    }

    /// `rds_send_path_reset` (called when a path goes down).
    pub(crate) fn send_path_reset(&mut self, pid: PathId) {
        let (max_packets, max_bytes) = (self.ep.cfg.max_unacked_packets, self.ep.cfg.max_unacked_bytes);
        self.path_mut(pid).unwrap().reset_for_retransmit(max_packets, max_bytes);
    }
}

/// The send rules that need nothing but the connection.
impl Connection {
    /// `rds_send_drop_to`'s part on one connection: removes the messages
    /// of socket `s` (to `dport`, or all) from every path's queues and
    /// returns them, and the sequence numbers of those that were
    /// transmitted on path 0 before the handshake: they keep holding the
    /// socket's lane (`Node::lane0_left`), and no longer count on the
    /// socket (`lane0_of` taken).
    pub(crate) fn cancel(&mut self, s: SockId, dport: Option<u16>) -> (Vec<QueuedMsg>, Vec<u64>) {
        let matches = |m: &QueuedMsg| m.sock == Some(s) && dport.is_none_or(|p| p == m.hdr.dport);
        let mut dropped = Vec::new();
        let mut wire = Vec::new();
        for path in self.paths.iter_mut() {
            for (sent, q) in [(false, &mut path.send_queue), (true, &mut path.retrans)] {
                let mut i = 0;
                while i < q.len() {
                    if matches(&q[i]) {
                        let mut m = q.remove(i).unwrap();
                        if sent && m.lane0_of.take().is_some() {
                            wire.push(m.hdr.sequence);
                        }
                        dropped.push(m);
                    } else {
                        i += 1;
                    }
                }
            }
        }
        (dropped, wire)
    }

    /// The congestion map due on path `index` (see `Node::pull`): our map
    /// update if the path is the map lane and one is owed, or our hello
    /// (the first map on a path, for a peer whose maps carry GEN_NUM). If
    /// one is due and the transport sends maps, it is now sent: returns
    /// whether it is the update (else the hello).
    pub(crate) fn take_map_due(&mut self, index: u8, sends_map: bool) -> Option<bool> {
        let i = usize::from(index);
        let lane_map = self.map_queued && self.map_lane() == Some(i);
        let hello = self.paths[i].hello_owed && self.peer_gen_maps;
        if !(lane_map || hello) || !sends_map {
            return None;
        }
        self.map_queued &= !lane_map;
        self.paths[i].hello_owed = false;
        Some(lane_map)
    }

    /// On a held path (see `Node::complete_path`), whether the message at
    /// the front is the one that passes the hold: our leading probe on the
    /// first connection of a fresh connection object (`probe_first`).
    pub(crate) fn probe_passes_hold(&self, index: u8) -> bool {
        !self.peer_gen_maps
            && !self.heard
            && self.paths[usize::from(index)].send_queue.front().is_some_and(QueuedMsg::is_probe)
    }

    /// Sockets' messages still queued or unacked on the connection, if any.
    pub(crate) fn unsent(&self) -> Option<Unsent> {
        let mut u = Unsent { laddr: Some(self.laddr), faddr: Some(self.faddr), ..Unsent::default() };
        for p in &self.paths {
            u.queued += p.send_queue.iter().filter(|m| m.sock.is_some()).count();
            u.unacked += p.retrans.iter().filter(|m| m.sock.is_some()).count();
            u.bytes += p.queued().1;
        }
        (u.queued + u.unacked > 0).then_some(u)
    }
}

/// What [`Path::transmit`] counted.
pub(crate) struct TxCounts {
    /// Messages it asked an ack for (`s_send_ack_required`).
    pub ack_required: u64,
    /// Messages with an RDMA op (`s_send_rdma`).
    pub rdma: u64,
}

/// The send rules that need nothing but the path.
impl Path {
    /// The transmit loop of `Node::pull`: moves the next messages of the
    /// send queue to `out` and the retransmit queue, about `budget` payload
    /// bytes (one message if the path `held`), asking for acks by the
    /// ACK_REQUIRED pacing (`max` packets and bytes between them). A
    /// message meant for a restarted peer's previous instance (FLUSH), or
    /// an RDMA op to retransmit, goes to `flushed` instead. It stops before
    /// a socket's message while the peer has not confirmed the connection,
    /// and before a message whose socket's lane is held behind path 0
    /// (`lane_held`).
    pub(crate) fn transmit(
        &mut self,
        budget: usize,
        held: bool,
        max: (u32, u64),
        lane_held: impl Fn(SockId) -> bool,
        out: &mut Vec<TxMessage>,
        flushed: &mut Vec<QueuedMsg>,
    ) -> TxCounts {
        let (max_packets, max_bytes) = max;
        let confirmed = self.confirmed;
        let mut counts = TxCounts { ack_required: 0, rdma: 0 };
        let mut sent = 0usize;
        loop {
            if (sent >= budget || held) && sent > 0 {
                break;
            }
            let Some(front) = self.send_queue.front() else { break };
            if !confirmed && front.sock.is_some() {
                break;
            }
            if front.gated && lane_held(front.sock.unwrap()) {
                break;
            }
            let mut m = self.send_queue.pop_front().unwrap();
            m.gated = false;
            // A restarted peer must not get messages meant for its previous
            // instance; an RDMA op is never retransmitted.
            if m.flags.flush || (m.flags.retransmitted && m.rdma.is_some()) {
                flushed.push(m);
                continue;
            }
            let len = m.payload.len() as u64;
            if self.unacked_packets == 0 || self.unacked_bytes < len {
                m.flags.ack_required = true;
                self.unacked_packets = max_packets;
                self.unacked_bytes = max_bytes;
                counts.ack_required += 1;
            } else {
                self.unacked_packets -= 1;
                self.unacked_bytes -= len;
            }
            if m.flags.retransmitted {
                m.hdr.flags |= wire::flags::RETRANSMITTED;
            }
            sent += m.payload.len() + wire::HEADER_LEN;
            out.push(TxMessage {
                header: m.hdr,
                payload: m.payload.clone(),
                ack_required: m.flags.ack_required,
                rdma: m.rdma.clone(),
            });
            if m.rdma.is_some() {
                counts.rdma += 1;
            }
            self.note_transmit(&m);
            self.retrans.push_back(m);
        }
        counts
    }

    /// Whether the send queue holds a message the next pull can send (not
    /// one waiting for the peer's confirmation or behind a held lane).
    pub(crate) fn more_to_send(&self, lane_held: impl Fn(SockId) -> bool) -> bool {
        !self.send_queue.is_empty()
            && !self
                .send_queue
                .front()
                .is_some_and(|m| (!self.confirmed && m.sock.is_some()) || (m.gated && m.sock.is_some_and(&lane_held)))
    }

    /// Queues a message with the path's next sequence number.
    pub(crate) fn enqueue(&mut self, mut msg: QueuedMsg) {
        msg.hdr.sequence = self.next_tx_seq;
        self.next_tx_seq += 1;
        self.send_queue.push_back(msg);
    }

    /// The RDMA op of message `seq` completed: marks it notified (once) and
    /// returns its socket and op, for the socket's notification.
    pub(crate) fn rdma_done(&mut self, seq: u64) -> Option<(SockId, Arc<RdmaOp>)> {
        let m = self.retrans.iter_mut().find(|m| m.hdr.sequence == seq && m.rdma.is_some())?;
        if m.flags.rdma_notified {
            return None;
        }
        m.flags.rdma_notified = true;
        Some((m.sock?, m.rdma.clone()?))
    }

    /// Messages acked up to `seq` leave the retransmit queue (appended to
    /// `done`).
    pub(crate) fn take_acked(&mut self, seq: u64, done: &mut Vec<QueuedMsg>) {
        while self.retrans.front().is_some_and(|m| m.hdr.sequence <= seq) {
            done.push(self.retrans.pop_front().unwrap());
        }
    }

    /// `rds_send_path_reset`: unacked messages go back to the front of the
    /// send queue, marked RETRANSMITTED and asking for an ack, and the
    /// ACK_REQUIRED pacing restarts from the maxima.
    pub(crate) fn reset_for_retransmit(&mut self, max_packets: u32, max_bytes: u64) {
        self.unacked_packets = max_packets;
        self.unacked_bytes = max_bytes;
        self.kick_queued = false;
        // (`proof_pings` stay: the peer resends on the next connection
        // the pongs it could not deliver on this one, `crate::lane0`.)
        while let Some(mut m) = self.retrans.pop_back() {
            m.flags.ack_required = true;
            m.flags.retransmitted = true;
            self.send_queue.push_front(m);
        }
    }
}
