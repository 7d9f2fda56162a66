//! The send side (`net/rds/send.c`, parts of `connection.c` and
//! `threads.c`): queueing with sequence numbers and send-buffer accounting,
//! path selection (mprds), transmit, acks, cancel, reset and reconnect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::message::{MsgFlags, Notification, QueuedMsg, RdmaOp, TxMessage, rdma_flags, rdma_status};
use crate::node::{HandshakeExts, Node};
use crate::path::PathState;
use crate::types::{ConnId, Errno, PathId, Payload, SockId, TransportKind};
use crate::wire::{self, Ext, Header, MAX_MSG_SIZE, PROBE_PORT};

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
    /// waits for a [`Output::Wake`] of this socket and retries.
    pub fn send(
        &mut self,
        s: SockId,
        dst: Option<SocketAddr>,
        payload: &Payload,
        opts: &SendOptions,
    ) -> Result<usize, Errno> {
        let sock = self.sock(s).ok_or(Errno::EINVAL)?;
        let dst = match dst {
            Some(d) => {
                let bad = match d.ip() {
                    IpAddr::V4(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
                    IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                        Some(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
                        None => v6.is_unspecified() || v6.is_multicast(),
                    },
                };
                if bad {
                    return Err(Errno::EINVAL);
                }
                d
            }
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
        let congested = self.maps.get(&dst.ip()).is_some_and(|m| m.test(dst.port()));
        if congested {
            let sock = self.sock_mut(s).unwrap();
            sock.seen_congestion = true;
            if opts.blocking {
                self.counters.cong_send_blocked += 1;
                self.want_write(s);
            } else {
                if sock.cong_monitor {
                    sock.cong_mask |= crate::cong::monitor_mask(dst.port());
                }
                self.counters.cong_send_error += 1;
            }
            return Err(Errno::ENOBUFS);
        }

        // rds_send_queue_rm: accepted while the *old* byte count is below the
        // limit, so the last message may overshoot it.
        let sock = self.sock_mut(s).unwrap();
        if sock.snd_bytes >= sock.sndbuf_limit() {
            self.counters.send_queue_full += 1;
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
            self.counters.mprds_lane_hold += 1;
        }
        self.enqueue(pid, msg);
        self.wake(s, false);
        Ok(len)
    }

    fn want_write(&mut self, s: SockId) {
        let sock = self.sock_mut(s).unwrap();
        if !sock.wants_write {
            sock.wants_write = true;
            self.write_waiters.push(s);
        }
    }

    /// Chooses the path for a message of a socket bound to `port`:
    /// (index, sent before the handshake, held behind the path-0 backlog).
    fn select_path(&mut self, s: SockId, conn: ConnId, port: u16) -> (usize, bool, bool) {
        let c = self.conn(conn);
        if c.paths.len() == 1 {
            return (0, false, false);
        }
        if c.npaths == 0 {
            // Not negotiated yet: path 0, and ask the peer (rds_send_mprds_hash).
            self.maybe_probe(conn);
            // Negotiated again after every path went down: a socket whose
            // earlier messages still wait on another path keeps that path,
            // or the next ones would overtake them on path 0.
            let c = self.conn(conn);
            let waiting = (1..c.paths.len()).find(|&k| {
                let p = &c.paths[k];
                p.send_queue.iter().chain(p.retrans.iter()).any(|m| m.sock == Some(s))
            });
            if let Some(k) = waiting {
                return (k, false, false);
            }
            return (0, true, false);
        }
        let lane = self.lane_of(conn, port);
        if lane == 0 {
            return (0, false, false);
        }
        let backlog = self.sock(s).map_or(0, |k| k.lane0_count(conn));
        (lane, false, backlog > 0)
    }

    /// `RDS_MPATH_HASH`: the path of a socket bound to `port`. The kernel
    /// hashes the port with a per-socket random value; we use the port modulo
    /// the path count, which spreads consecutive ports (rds-stress tasks)
    /// over distinct paths. The choice is local: the peer never needs it.
    pub fn lane_of(&self, conn: ConnId, port: u16) -> usize {
        let n = self.conn(conn).active_paths();
        usize::from(port) % n
    }

    /// Queues a message on a path with the next sequence number.
    pub(crate) fn enqueue(&mut self, pid: PathId, mut msg: QueuedMsg) {
        let path = self.path_mut(pid).expect("path exists");
        msg.hdr.sequence = path.next_tx_seq;
        path.next_tx_seq += 1;
        path.send_queue.push_back(msg);
        self.counters.send_queued += 1;
        self.kick(pid);
    }

    /// Sends the multipath probe ping on path 0 if the path count is unknown
    /// and none is outstanding (`rds_send_ping`).
    pub(crate) fn maybe_probe(&mut self, conn: ConnId) {
        let c = self.conn(conn);
        if !self.caps_of(c.kind).mp_capable || c.npaths != 0 || c.ping_triggered {
            return;
        }
        self.conn_mut(conn).ping_triggered = true;
        self.counters.mprds_probe_sent += 1;
        self.send_probe(PathId { conn, index: 0 }, PROBE_PORT, 0);
    }

    /// The first connection of a fresh connection object (no path of it was
    /// ever up, so nothing queued was ever transmitted): our probe goes
    /// first, numbered before the queued messages, and is the one message
    /// that passes the hold (`pull`). A 6.1 kernel whose map went out on
    /// another of its connections stays silent on this one until a message
    /// of ours asks for an answer; an rds-rs peer with `Full` reads our map
    /// before it (a crossed connection is dropped before the probe counts)
    /// and sends its own map first. Renumbering is safe: none of these
    /// sequence numbers was on a wire yet.
    pub(crate) fn probe_first(&mut self, pid: PathId) {
        let Some(path) = self.path_mut(pid) else { return };
        let Some(at) = path.send_queue.iter().position(QueuedMsg::is_probe) else { return };
        if at == 0 || path.send_queue.iter().any(|m| m.flags.retransmitted) {
            return;
        }
        let first = path.send_queue[0].hdr.sequence;
        let probe = path.send_queue.remove(at).unwrap();
        path.send_queue.push_front(probe);
        for (i, m) in path.send_queue.iter_mut().enumerate() {
            m.hdr.sequence = first + i as u64;
        }
    }

    /// `rds_send_probe`: a zero-length control message (probe ping, pong).
    /// Probe pings and their pongs carry the handshake extension headers.
    pub(crate) fn send_probe(&mut self, pid: PathId, sport: u16, dport: u16) {
        let c = self.conn(pid.conn);
        let (faddr, kind) = (c.faddr, c.kind);
        if self.maps.get(&faddr).is_some_and(|m| m.test(dport)) {
            return;
        }
        // A pong never transmitted yet answers every ping from that port
        // (a ping flood against a closed window must not grow the queue).
        // Not one that was on a wire before: a restart of the peer flushes
        // those, and a handshake pong must still reach its new instance.
        if sport == 0
            && self.path(pid).is_some_and(|p| {
                p.send_queue.iter().any(|m| {
                    m.sock.is_none()
                        && m.hdr.sport == 0
                        && m.hdr.dport == dport
                        && m.payload.is_empty()
                        && !m.flags.retransmitted
                        && !m.flags.flush
                })
            })
        {
            self.counters.send_pong_coalesced += 1;
            return;
        }
        // s_send_pong counts every probe queued: probe pings and all pongs.
        self.counters.send_pong += 1;
        let mut hdr = Header::data(sport, dport, 0);
        let hs = (sport, dport) == (PROBE_PORT, 0) || (sport, dport) == (0, PROBE_PORT);
        if hs && self.caps_of(kind).mp_capable {
            let _ = hdr.push_extension(Ext::Npaths(u16::from(self.cfg.npaths)));
            if self.cfg.handshake_exts == HandshakeExts::Full {
                let _ = hdr.push_extension(Ext::GenNum(self.cfg.gen_num));
            }
        }
        let msg = QueuedMsg {
            hdr,
            payload: Payload::empty(),
            sock: None,
            flags: MsgFlags::default(),
            rdma: None,
            lane0_of: None,
            gated: false,
        };
        self.connect_if_down(pid);
        self.enqueue(pid, msg);
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
        let lane_map = c.map_queued && c.map_lane() == Some(usize::from(pid.index));
        let hello = path.hello_owed && c.peer_gen_maps;
        if (lane_map || hello) && self.caps_of(c.kind).sends_cong_map {
            let laddr = c.laddr;
            let header = self.map_header(laddr, pid.index, !lane_map);
            self.conn_mut(conn).map_queued &= !lane_map;
            self.path_mut(pid).unwrap().hello_owed = false;
            let map = self.maps.entry(laddr).or_default();
            out.push(TxMessage {
                header,
                payload: Payload::copy_from(map.as_bytes()),
                ack_required: false,
                rdma: None,
            });
        }
        // A held path sends only its maps, and on the first connection of a
        // fresh connection object our leading probe (`probe_first`).
        let held = self.path(pid).unwrap().hold;
        if held {
            let c = self.conn(conn);
            let probe = !c.peer_gen_maps
                && !c.heard
                && self.path(pid).unwrap().send_queue.front().is_some_and(QueuedMsg::is_probe);
            if !probe {
                return false;
            }
        }
        // On a connection the peer has not evidently taken yet
        // (`Path::confirmed`) only maps and our leading probes go out, no
        // socket's message: a 6.1 kernel that finds no free slot for it
        // resets it, and what its TCP had already acked would be lost. (The
        // probe lets a peer that stays silent until it hears from us answer.)
        let confirmed = self.path(pid).unwrap().confirmed;
        let (max_packets, max_bytes) = (self.cfg.max_unacked_packets, self.cfg.max_unacked_bytes);
        let mut sent = 0usize;
        let mut flushed = Vec::new();
        loop {
            if (sent >= budget || held) && sent > 0 {
                break;
            }
            let Some(front) = self.path(pid).unwrap().send_queue.front() else { break };
            if !confirmed && front.sock.is_some() {
                break;
            }
            if front.gated {
                let s = front.sock.unwrap();
                if self.sock(s).is_some_and(|k| k.lane0_count(conn) > 0) {
                    break;
                }
            }
            let path = &mut self.conns[conn].paths[usize::from(pid.index)];
            let mut m = path.send_queue.pop_front().unwrap();
            m.gated = false;
            // A restarted peer must not get messages meant for its previous
            // instance; an RDMA op is never retransmitted.
            if m.flags.flush || (m.flags.retransmitted && m.rdma.is_some()) {
                flushed.push(m);
                continue;
            }
            let len = m.payload.len() as u64;
            if path.unacked_packets == 0 || path.unacked_bytes < len {
                m.flags.ack_required = true;
                path.unacked_packets = max_packets;
                path.unacked_bytes = max_bytes;
                self.counters.send_ack_required += 1;
            } else {
                path.unacked_packets -= 1;
                path.unacked_bytes -= len;
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
                self.counters.send_rdma += 1;
            }
            path.retrans.push_back(m);
        }
        for m in flushed {
            let status = if m.rdma.is_some() { rdma_status::DROPPED } else { rdma_status::OTHER_ERROR };
            if m.flags.flush {
                self.counters.send_drop_flushed += 1;
                if let Some(s) = m.sock {
                    if let Some(k) = self.sock_mut(s) {
                        k.flushed += 1;
                    }
                }
            }
            self.remove_from_sock(conn, &m, status);
        }
        if self.path(pid).unwrap().send_queue.is_empty() {
            self.counters.send_queue_empty += 1;
        }
        let path = self.path(pid).unwrap();
        !path.send_queue.is_empty()
            && !path.send_queue.front().is_some_and(|m| {
                (!confirmed && m.sock.is_some())
                    || (m.gated && m.sock.and_then(|s| self.sock(s)).is_some_and(|k| k.lane0_count(conn) > 0))
            })
    }

    /// The header of a congestion-map update from our address `laddr`.
    /// With `HandshakeExts::Full` it also carries our GEN_NUM, the index of
    /// the path it travels on (h_sport) and a version (h_sequence, growing
    /// per address): the map lane moves when paths go down and come up, so
    /// two maps can travel on different connections and arrive in the
    /// wrong order; the receiver applies only newer versions. The first map
    /// on a path that is not the map lane is a hello (h_dport 1): its
    /// receiver takes the generation and the path from it, not the bitmap.
    /// Kernels read nothing of a map's header but h_len and h_flags.
    fn map_header(&mut self, laddr: IpAddr, index: u8, hello: bool) -> Header {
        let mut h = Header::cong_map();
        if self.cfg.handshake_exts == HandshakeExts::Full {
            h.sport = u16::from(index);
            h.dport = if hello { PROBE_PORT } else { 0 };
            let _ = h.push_extension(Ext::GenNum(self.cfg.gen_num));
            let v = self.map_versions.entry(laddr).or_insert((self.cfg.gen_num, 0));
            v.1 += 1;
            h.sequence = v.1;
        }
        h
    }

    /// The transport confirms delivery of every message up to `seq` on the
    /// path (TCP: the peer's TCP acked its last byte; IB: the peer's h_ack).
    pub fn acked(&mut self, pid: PathId, inst: u64, seq: u64) {
        let Some(path) = self.path_mut(pid) else { return };
        if path.inst != inst {
            return;
        }
        let mut done = Vec::new();
        while path.retrans.front().is_some_and(|m| m.hdr.sequence <= seq) {
            done.push(path.retrans.pop_front().unwrap());
        }
        for m in done {
            self.counters.send_drop_acked += 1;
            self.remove_from_sock(pid.conn, &m, rdma_status::SUCCESS);
        }
        let path = self.path_mut(pid).unwrap();
        if !path.lane0_wire.is_empty() {
            let (passed, wait) = std::mem::take(&mut path.lane0_wire).into_iter().partition(|(q, _)| *q <= seq);
            path.lane0_wire = wait;
            for (_, s) in passed {
                self.release_lane0(pid.conn, s);
            }
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
        let Some(m) = path.retrans.iter_mut().find(|m| m.hdr.sequence == seq && m.rdma.is_some()) else { return };
        if m.flags.rdma_notified {
            return;
        }
        m.flags.rdma_notified = true;
        let (Some(s), Some(op)) = (m.sock, m.rdma.clone()) else { return };
        let Some(sock) = self.sock_mut(s) else { return };
        if op.flags & rdma_flags::NOTIFY_ME != 0 || (status != rdma_status::SUCCESS && sock.recverr) {
            sock.notify_queue.push_back(Notification { user_token: op.user_token, status });
            self.wake(s, false);
        }
    }

    /// One message of socket `s` no longer holds its lane behind path 0.
    pub(crate) fn release_lane0(&mut self, conn: ConnId, s: SockId) {
        let Some(sock) = self.sock_mut(s) else { return };
        let n = sock.lane0(conn);
        *n = n.saturating_sub(1);
        if *n == 0 {
            for i in 1..self.conn(conn).paths.len() {
                self.kick(PathId { conn, index: i as u8 });
            }
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
            self.write_waiters.retain(|w| *w != s);
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
    /// keeps holding its socket's lane until path 0's acks pass it: the
    /// socket's next messages must not overtake it on another path. Returns
    /// how many were dropped.
    pub fn drop_messages(&mut self, s: SockId, dst: Option<SocketAddr>) -> usize {
        let Some(bound) = self.sock(s).and_then(|k| k.bound) else { return 0 };
        let mut dropped = Vec::new();
        for c in self.conns.iter_mut() {
            if c.laddr != bound.ip() || dst.is_some_and(|d| d.ip() != c.faddr) {
                continue;
            }
            let matches =
                |m: &crate::message::QueuedMsg| m.sock == Some(s) && dst.is_none_or(|d| d.port() == m.hdr.dport);
            for path in c.paths.iter_mut() {
                let mut wire = Vec::new();
                for (sent, q) in [(false, &mut path.send_queue), (true, &mut path.retrans)] {
                    let mut i = 0;
                    while i < q.len() {
                        if matches(&q[i]) {
                            let mut m = q.remove(i).unwrap();
                            if sent && m.lane0_of.take().is_some() {
                                wire.push((m.hdr.sequence, s));
                            }
                            dropped.push((c.id, m));
                        } else {
                            i += 1;
                        }
                    }
                }
                path.lane0_wire.extend(wire);
            }
        }
        let n = dropped.len();
        self.counters.send_drop_cancelled += n as u64;
        for (conn, m) in dropped {
            self.remove_from_sock(conn, &m, rdma_status::CANCELED);
        }
        n
    }

    /// Messages of socket `s` still queued or unacked.
    pub fn pending_messages(&self, s: SockId) -> usize {
        self.conns
            .iter()
            .flat_map(|c| c.paths.iter())
            .flat_map(|p| p.send_queue.iter().chain(p.retrans.iter()))
            .filter(|m| m.sock == Some(s))
            .count()
    }

    /// Messages still on send and retransmit queues, per connection.
    pub fn unsent(&self) -> Vec<Unsent> {
        self.conns
            .iter()
            .filter_map(|c| {
                let mut u = Unsent { laddr: Some(c.laddr), faddr: Some(c.faddr), ..Unsent::default() };
                for p in &c.paths {
                    u.queued += p.send_queue.iter().filter(|m| m.sock.is_some()).count();
                    u.unacked += p.retrans.iter().filter(|m| m.sock.is_some()).count();
                    u.bytes += p.queued().1;
                }
                (u.queued + u.unacked > 0).then_some(u)
            })
            .collect()
    }

    // ----------------------------------------------------------------
    // Path lifecycle
    // ----------------------------------------------------------------

    /// `rds_send_path_reset`.
    pub(crate) fn send_path_reset(&mut self, pid: PathId) {
        let (max_packets, max_bytes) = (self.cfg.max_unacked_packets, self.cfg.max_unacked_bytes);
        let path = self.path_mut(pid).unwrap();
        path.unacked_packets = max_packets;
        path.unacked_bytes = max_bytes;
        path.kick_queued = false;
        while let Some(mut m) = path.retrans.pop_back() {
            m.flags.ack_required = true;
            m.flags.retransmitted = true;
            path.send_queue.push_front(m);
        }
    }

    /// A GEN_NUM `gen_num` heard on path `pid` (in a probe, a pong or a
    /// Full map). Returns whether the path's connection speaks for the
    /// peer's current instance. A connection instance speaks for one peer
    /// instance: the first generation heard on it. A generation first heard
    /// on a connection older than the one that announced the current
    /// generation comes from a dead instance (a later connection reached
    /// the later instance): it is ignored, not taken for a restart.
    pub(crate) fn gen_heard(&mut self, pid: PathId, gen_num: u32) -> bool {
        if gen_num == 0 {
            return true;
        }
        let conn = pid.conn;
        let (peer_gen, gen_up_seq) = (self.conn(conn).peer_gen, self.conn(conn).gen_up_seq);
        let path = self.path_mut(pid).unwrap();
        if path.inst_gen != 0 {
            return path.inst_gen == peer_gen;
        }
        path.inst_gen = gen_num;
        let up_seq = path.up_seq;
        if gen_num != peer_gen && peer_gen != 0 && up_seq < gen_up_seq {
            return false;
        }
        let c = self.conn_mut(conn);
        c.gen_up_seq = c.gen_up_seq.max(up_seq);
        self.peer_gen_update(conn, gen_num, pid.index);
        true
    }

    /// Our peer announced generation `inst` on path `on`
    /// (`rds_conn_peer_gen_update`): if it changed, the peer restarted, and
    /// messages the old instance may have seen are flushed.
    ///
    /// Unlike the kernel, our transmit sequence numbers keep growing: acks
    /// name messages by sequence number (the kernel's TCP acks by byte
    /// offset), so numbering restarted on a live connection left 40, 41
    /// then 1, 2 on the retransmit queue, and the ack of 2 could never
    /// release 40. The new instance accepts any number. Its own numbering
    /// starts again, so we forget the old instance's: at once on the path
    /// that heard the new generation, and on the others when they next
    /// connect (until then they may still deliver what the old instance
    /// sent, which the old receive state deduplicates).
    pub(crate) fn peer_gen_update(&mut self, conn: ConnId, gen_num: u32, on: u8) {
        if gen_num == 0 {
            return;
        }
        let c = self.conn_mut(conn);
        let restarted = c.peer_gen != 0 && c.peer_gen != gen_num;
        c.peer_gen = gen_num;
        if !restarted {
            return;
        }
        self.counters.peer_restart += 1;
        let c = self.conn_mut(conn);
        for (i, path) in c.paths.iter_mut().enumerate() {
            if i == usize::from(on) {
                path.next_rx_seq = 0;
            } else {
                path.rx_reset = true;
            }
            for m in path.retrans.iter_mut() {
                m.flags.flush = true;
            }
            for m in path.send_queue.iter_mut().filter(|m| m.flags.retransmitted) {
                m.flags.flush = true;
            }
        }
        // Connections that came up before the one that announced the new
        // generation reach the dead instance: a message first written on
        // one now would be lost, then resent to the new instance as a
        // retransmission, which it must take for its predecessor's and
        // drop. Close them at once; they connect again, to the new one.
        let c = self.conn(conn);
        let fresh = c.paths[usize::from(on)].up_seq;
        let old: Vec<u8> = (0..c.paths.len())
            .filter(|&i| i != usize::from(on) && c.paths[i].state == PathState::Up && c.paths[i].up_seq < fresh)
            .map(|i| i as u8)
            .collect();
        for i in old {
            self.drop_path(PathId { conn, index: i });
        }
    }

    /// After the path count was (re)negotiated: messages queued on paths
    /// that are no longer used move to path 0 with new sequence numbers.
    pub(crate) fn rehome_paths(&mut self, conn: ConnId) {
        let n = self.conn(conn).active_paths();
        let total = self.conn(conn).paths.len();
        let mut moved = Vec::new();
        for i in n..total {
            let path = &mut self.conn_mut(conn).paths[i];
            moved.extend(path.retrans.drain(..));
            moved.extend(path.send_queue.drain(..));
        }
        moved.sort_by_key(|m| m.hdr.sequence);
        for mut m in moved {
            m.flags.retransmitted = false;
            m.hdr.flags &= !wire::flags::RETRANSMITTED;
            m.gated = false;
            self.enqueue(PathId { conn, index: 0 }, m);
        }
        for i in 1..n {
            self.kick(PathId { conn, index: i as u8 });
        }
    }

    /// The peer evidently took the path's connection: the next path may
    /// connect (`connect_worker`).
    pub(crate) fn confirm_path(&mut self, pid: PathId) {
        let Some(path) = self.path_mut(pid) else { return };
        if path.confirmed || path.state != PathState::Up {
            return;
        }
        path.confirmed = true;
        self.start_mprds(pid.conn);
        self.kick(pid);
    }

    /// Starts the extra paths once the count is known (`rds_start_mprds`).
    pub(crate) fn start_mprds(&mut self, conn: ConnId) {
        let c = self.conn(conn);
        if c.npaths > 1 && Node::is_smaller(&c.laddr, &c.faddr) {
            for i in 0..c.active_paths() {
                self.connect_if_down(PathId { conn, index: i as u8 });
            }
        }
    }
}
