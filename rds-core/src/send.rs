//! The send side (`net/rds/send.c`, parts of `connection.c` and
//! `threads.c`): queueing with sequence numbers and send-buffer accounting,
//! path selection (mprds), transmit, acks, cancel, reset and reconnect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conn::{DownReason, PathInfo, PathState};
use crate::message::{MsgFlags, Notification, QueuedMsg, RdmaOp, TxMessage, rdma_flags, rdma_status};
use crate::node::{HandshakeExts, Node, Output, Timer};
use crate::transport::Accept;
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
    fn probe_first(&mut self, pid: PathId) {
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
    fn release_lane0(&mut self, conn: ConnId, s: SockId) {
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

    /// `rds_conn_path_connect_if_down`.
    pub(crate) fn connect_if_down(&mut self, pid: PathId) {
        let Some(path) = self.path(pid) else { return };
        if path.state == PathState::Down && path.reconnect_at.is_none() {
            self.connect_worker(pid);
        }
    }

    /// `rds_connect_worker`: DOWN -> CONNECTING and ask the driver to connect.
    /// Paths other than 0 are only ever opened by the smaller address, and
    /// in order: path i once paths 0..i are up and the peer evidently took
    /// them (`Path::confirmed`), so that a peer that cannot tell which path
    /// a connection is for (no SPORT_IDX) gives it its lowest free slot, the
    /// right one (the kernel connects all at once and its peer takes them in
    /// arrival order, which crosses sequence spaces). A 6.1 kernel accepts
    /// in its own time: a connection established on our side may still
    /// wait in its accept queue, so "up" alone is not enough.
    pub(crate) fn connect_worker(&mut self, pid: PathId) {
        let c = self.conn(pid.conn);
        let caps = self.caps_of(c.kind);
        let smaller = Node::is_smaller(&c.laddr, &c.faddr);
        let i = usize::from(pid.index);
        if i > 0
            && (!smaller
                || i >= c.active_paths()
                || c.paths[..i].iter().any(|p| p.state != PathState::Up || !p.confirmed))
        {
            return;
        }
        let path = self.path_mut(pid).unwrap();
        if path.state != PathState::Down {
            return;
        }
        path.state = PathState::Connecting;
        path.inst += 1;
        if smaller || !caps.smaller_connects {
            path.rx_conns += 1;
        }
        let maps = self.conn(pid.conn).maps_rx;
        self.path_mut(pid).unwrap().maps_at_connect = maps;
        let info = self.conn(pid.conn).info(usize::from(pid.index));
        self.outputs.push_back(Output::Connect(info));
    }

    /// `rds_queue_reconnect`: first attempt at once, then after a random
    /// delay below a bound that doubles up to `reconnect_max`. Over TCP only
    /// the smaller address reconnects; the larger one re-pokes path 0 (with
    /// the same backoff) while it has messages queued on any path.
    pub(crate) fn queue_reconnect(&mut self, pid: PathId, now: Instant) {
        let c = self.conn(pid.conn);
        let caps = self.caps_of(c.kind);
        if caps.smaller_connects && !Node::is_smaller(&c.laddr, &c.faddr) && (pid.index != 0 || !c.has_queued()) {
            return;
        }
        if pid.index > 0 && usize::from(pid.index) >= c.active_paths() {
            return;
        }
        let settle = if pid.index > 0 && caps.mp_capable && Node::is_smaller(&c.laddr, &c.faddr) && !c.with_sport_idx {
            self.cfg.reconnect_settle
        } else {
            Duration::ZERO
        };
        let (min, max) = (self.cfg.reconnect_min, self.cfg.reconnect_max);
        let jitter = self.rng.next_u64();
        let path = self.path_mut(pid).unwrap();
        let at = if path.reconnect_delay.is_zero() {
            path.reconnect_delay = min;
            crate::types::later(now, settle)
        } else {
            let bound = path.reconnect_delay.as_nanos().max(1) as u64;
            let d = Duration::from_nanos(jitter % bound);
            path.reconnect_delay = path.reconnect_delay.saturating_mul(2).min(max);
            crate::types::later(now, d)
        };
        path.reconnect_at = Some(at);
        self.schedule(at, Timer::Reconnect(pid));
    }

    /// A transport connection of the path is established (active side), or
    /// an accepted one was assigned to it (`rds_connect_path_complete`).
    pub fn path_up(&mut self, pid: PathId, inst: u64) {
        let Some(path) = self.path_mut(pid) else { return };
        if path.inst != inst || path.state != PathState::Connecting {
            return;
        }
        self.complete_path(pid);
    }

    fn complete_path(&mut self, pid: PathId) {
        // With HandshakeExts::Full a new connection carries only our map
        // until the peer's first message on it arrived, if the peer is an
        // rds-rs node with Full (its maps carry GEN_NUM), or if we never
        // heard from the peer: a map is then what the peer sends first. That map tells whether the peer restarted before anything
        // meant for its previous instance goes out (so nothing is delivered
        // twice), and whether the connection is the peer's same path (an
        // accept race can pair different paths; such a connection is
        // dropped, `cong_recv`). A peer that resets the connection instead
        // of taking it got nothing it would have acked and then lost.
        let full = self.cfg.handshake_exts == HandshakeExts::Full;
        let sends_map = self.caps_of(self.conn(pid.conn).kind).sends_cong_map;
        // Only our own connections of a multipath connection need the
        // peer's confirmation (`connect_worker`); a map may have come already.
        let confirmed = {
            let c = self.conn(pid.conn);
            !self.caps_of(c.kind).mp_capable
                || !Node::is_smaller(&c.laddr, &c.faddr)
                || c.maps_rx > c.paths[usize::from(pid.index)].maps_at_connect
        };
        let c = self.conn_mut(pid.conn);
        let fresh = c.ups == 0;
        let hold = full && sends_map && (c.peer_gen_maps || !c.heard);
        c.ups += 1;
        let up_seq = c.ups;
        let path = self.path_mut(pid).unwrap();
        path.hold = hold;
        path.hello_owed = full && sends_map;
        path.inst_gen = 0;
        path.up_seq = up_seq;
        path.confirmed = confirmed;
        path.state = PathState::Up;
        path.reconnect_delay = Duration::ZERO;
        path.reconnect_at = None;
        path.connects += 1;
        if std::mem::take(&mut path.rx_reset) {
            path.next_rx_seq = 0;
        }
        // Every path that comes up makes us send our map (on the map lane).
        if self.caps_of(self.conn(pid.conn).kind).sends_cong_map {
            self.queue_map(pid.conn);
        }
        if pid.index == 0 {
            self.maybe_probe(pid.conn);
            if hold && fresh {
                self.probe_first(pid);
            }
        }
        // The next path of the fan-out (`connect_worker`).
        self.start_mprds(pid.conn);
        self.kick(pid);
    }

    /// An inbound transport connection from `faddr` to our `laddr`
    /// (`rds_tcp_accept_one`). `peer_port` is the peer's transport source
    /// port (used when the peer encodes the path index in it).
    pub fn accept(&mut self, kind: TransportKind, laddr: IpAddr, faddr: IpAddr, peer_port: u16) -> Accept {
        if !self.is_local(&laddr) || self.is_local(&faddr) {
            return Accept::Reject;
        }
        // A new peer, or one evicted meanwhile, needs room.
        let known = self.find_conn(laddr, faddr, kind);
        let evicted = known.is_some_and(|c| self.conn(c).evicted);
        if (known.is_none() || evicted) && !self.make_room() {
            self.counters.conn_refused_peer_limit += 1;
            return Accept::Reject;
        }
        let conn = self.conn_for(laddr, faddr, kind, 0);
        self.conn_mut(conn).evicted = false;
        let c = self.conn(conn);
        let caps = self.caps_of(c.kind);
        if caps.smaller_connects && Node::is_smaller(&laddr, &faddr) {
            // The poke: the larger peer has something for us on some path.
            // Path 0 connects, and the others too once their count is known.
            self.connect_if_down(PathId { conn, index: 0 });
            self.start_mprds(conn);
            return Accept::RejectPeerLarger;
        }
        // The slot: the one the peer's source port names when it encodes
        // the path index (SPORT_IDX); otherwise the lowest that is not up,
        // the next path of a peer that connects its paths in order (as we
        // do). A connection that cannot be placed yet waits (Defer) rather
        // than being reset, which would lose what the peer already wrote.
        let i = if c.with_sport_idx {
            usize::from(peer_port) % c.active_paths()
        } else {
            let n = if c.npaths == 0 { c.paths.len() } else { c.active_paths() };
            match (0..n).find(|&i| c.paths[i].state != PathState::Up) {
                // Before the handshake with path 0 up, this is either the
                // peer's path 0 again (ours is dead) or its path 1 (it
                // heard our probe): known once either happens.
                Some(i) if i > 0 && c.npaths == 0 => return Accept::Defer,
                Some(i) => i,
                None if n == 1 => 0,
                // Every path is up: one is dead, which one shows later.
                None => return Accept::Defer,
            }
        };
        let pid = PathId { conn, index: i as u8 };
        match self.path(pid).unwrap().state {
            PathState::Down | PathState::Connecting => {}
            // The peer only connects a path it has no connection for: ours
            // is dead. The new one waits until ours delivered what it read.
            PathState::Up => {
                self.drop_path(pid);
                return Accept::Defer;
            }
            _ => return Accept::Defer,
        }
        let path = self.path_mut(pid).unwrap();
        path.inst += 1;
        path.rx_conns += 1;
        self.complete_path(pid);
        Accept::Path(self.conn(conn).info(i))
    }

    /// The transport connection of a path is gone (or a connect failed, or a
    /// shutdown the core asked for finished). The path is reset: unacked
    /// messages go back to the front of the send queue marked RETRANSMITTED,
    /// and a reconnect is queued (`rds_conn_shutdown`).
    pub fn path_down(&mut self, pid: PathId, inst: u64, reason: DownReason, now: Instant) {
        let Some(path) = self.path_mut(pid) else { return };
        if path.inst != inst || path.state == PathState::Down {
            return;
        }
        let was_up = matches!(path.state, PathState::Up | PathState::Disconnecting);
        if reason == DownReason::ProtocolError {
            self.counters.recv_drop_bad_frame += 1;
        }
        if was_up {
            self.counters.conn_reset += 1;
        }
        self.send_path_reset(pid);
        // Cancelled messages that held lanes are no longer on a connection.
        for (_, s) in std::mem::take(&mut self.path_mut(pid).unwrap().lane0_wire) {
            self.release_lane0(pid.conn, s);
        }
        let conn = pid.conn;
        let path = self.path_mut(pid).unwrap();
        path.state = PathState::Down;
        path.inst += 1;
        if was_up && self.conn(conn).paths.len() > 1 && self.conn(conn).all_down() {
            // The peer may come back as a new instance with other settings:
            // negotiate the path count again on the next connection. (Not
            // after a failed connect: every send to an unreachable peer
            // would queue one more probe.)
            let c = self.conn_mut(conn);
            c.npaths = 0;
            c.ping_triggered = false;
        }
        // Our later paths that the peer has not evidently taken yet may sit in
        // its accept queue: a 6.1 kernel would give them the slot this path
        // just freed (its lowest free one), crossing sequence spaces. Close
        // them; they connect again in order after this one.
        let c = self.conn(conn);
        if self.caps_of(c.kind).mp_capable && Node::is_smaller(&c.laddr, &c.faddr) && !c.with_sport_idx {
            let later: Vec<usize> = (usize::from(pid.index) + 1..c.paths.len())
                .filter(|&k| match c.paths[k].state {
                    PathState::Connecting => true,
                    PathState::Up => !c.paths[k].confirmed,
                    _ => false,
                })
                .collect();
            for k in later {
                self.drop_path(PathId { conn, index: k as u8 });
            }
        }
        // A failed connect is tried again only for something to send (a
        // socket's messages, a map owed) or while another path of the peer
        // is up: a peer that vanished is not retried for ever (the kernel
        // does), and one that comes back connects, or pokes us, when it
        // has something. A connection that closed reconnects as in the
        // kernel (once, if the peer is gone). An evicted peer's connection
        // stays down (`Node::make_room`).
        let c = self.conn(conn);
        let others_up = c.paths.iter().any(|p| p.state == PathState::Up);
        let retry = reason != DownReason::ConnectFailed || c.has_queued() || others_up || c.map_queued;
        let poke_only = reason == DownReason::DirectionRule && self.path(pid).unwrap().send_queue.is_empty();
        if retry && !poke_only && !self.conn(conn).evicted {
            self.queue_reconnect(pid, now);
        }
        if self.conn(conn).all_down() {
            self.conn_all_down(conn, now);
        }
        // Senders blocked on this path may need to see the change.
        self.wake_writers();
    }

    /// The core drops a path itself (protocol error, peer restart). The
    /// driver closes the connection and then reports `path_down`.
    pub(crate) fn drop_path(&mut self, pid: PathId) {
        let Some(path) = self.path_mut(pid) else { return };
        if !matches!(path.state, PathState::Up | PathState::Connecting) {
            return;
        }
        path.state = PathState::Disconnecting;
        let info = self.conn(pid.conn).info(usize::from(pid.index));
        self.outputs.push_back(Output::Shutdown(info));
    }

    /// Resets the path's transport connection as if it had failed (like the
    /// kernel's RDS_CONN_RESET option); messages are retransmitted.
    pub fn reset_path(&mut self, pid: PathId) {
        self.drop_path(pid);
    }

    /// `rds_send_path_reset`.
    fn send_path_reset(&mut self, pid: PathId) {
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

    /// Information about a path (for drivers that lost track).
    pub fn path_info_of(&self, conn: ConnId, index: u8) -> Option<PathInfo> {
        self.path_info(PathId { conn, index })
    }
}
