//! The receive side (`net/rds/recv.c`): the duplicate and stale rules,
//! answering pings, delivery to sockets, `recvmsg` ([`Node::recv`]) and
//! receive flow control (a socket's hard cap and the node's budget pause
//! the path that delivered). Congestion maps received go to
//! [`crate::cong`], handshake probes and pongs to [`crate::mprds`].

use std::net::SocketAddr;

use crate::message::{Incoming, Received, RxMessage};
use crate::node::Node;
use crate::node::Output;
use crate::path::{Path, PathState};
use crate::sock::Sock;
use crate::types::{ConnId, Errno, PathId, SockId};
use crate::wire::{Ext, Header, Kind, PROBE_PORT};

/// What the core made of a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvOutcome {
    Delivered,
    /// Answered with a pong (and, for a probe, negotiated paths).
    Ping,
    /// A probe pong: paths negotiated.
    ProbePong,
    /// A congestion-map update was applied.
    CongMap,
    /// Dropped: an old retransmission.
    DupDropped,
    /// Dropped: a retransmission of a message first sent to a previous
    /// instance of this node (it came first on the first connection this
    /// instance had on the path; `recv_drop_stale`).
    Stale,
    /// Dropped: no socket bound to the destination port, or the one bound
    /// there uses another transport than the connection's.
    NoSocket,
    /// Delivered, and the path is now paused ([`crate::Output::RxFlow`]):
    /// the socket is over its hard cap or the node over its receive budget.
    DeliveredPaused,
    /// Ignored (ping from port 0, stale connection instance).
    Ignored,
    /// The peer broke the protocol; the path is being reset.
    ProtocolError,
}

/// The hard receive cap ([`crate::NodeConfig::rcv_hard_factor`]) is never
/// below this. A peer that respects congestion still sends to a congested
/// port until our map reaches it: what fits in its TCP window and our
/// transport's read batch, on each of 8 paths, many MiB. Those datagrams
/// are queued whatever the cap (our TCP acked them); crossing the cap
/// pauses the path, which stalls every socket served by it, so the cap is
/// far above what a conformant peer makes us hold.
pub const RCV_HARD_FLOOR: u64 = 256 << 20;

/// Why a path's reading is paused: sockets over their hard cap that it
/// delivered to, and whether it delivered beyond the node's budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RxPause {
    socks: Vec<SockId>,
    budget: bool,
}

/// What a socket holds against its hard cap and the node's budget.
pub(crate) fn sock_held(sock: &Sock) -> u64 {
    sock.rcv_bytes.saturating_add((sock.recv_queue.len() as u64).saturating_mul(RCV_MSG_OVERHEAD))
}

/// What a queued message costs besides its payload (its header, addresses,
/// payload handle and queue slot: about 200 bytes), counted against the
/// hard cap, so that a flood of empty messages is bounded too. The socket's
/// own accounting (`rcv_bytes`, congestion) counts payload bytes only, as
/// the kernel does.
pub const RCV_MSG_OVERHEAD: u64 = 256;

impl Node {
    /// A complete message arrived on a path (`rds_recv_incoming`, and the
    /// transports' congestion-map receive).
    pub fn received(&mut self, pid: PathId, inst: u64, msg: RxMessage) -> RecvOutcome {
        let Some(path) = self.path(pid) else { return RecvOutcome::Ignored };
        if path.inst != inst || !matches!(path.state, PathState::Up | PathState::Disconnecting) || path.crossed {
            return RecvOutcome::Ignored;
        }
        // Anything on a connection shows the peer took it; a congestion map
        // on another path may show it took the one connection we had started
        // and it had not yet shown it took (a 6.1 kernel sends its map when
        // it accepts a connection, on whichever path transmits first; it
        // may arrive before our end of the new connection reported it up):
        // `Connection::map_received`.
        if msg.header.kind() == Kind::CongMap {
            let digest = crate::cong::map_digest(&msg.payload);
            let (confirm, withheld) = self.conn_mut(pid.conn).map_received(pid.index, digest);
            self.ep.counters.mprds_confirm_withheld += withheld;
            for i in confirm {
                self.confirm_path(PathId { conn: pid.conn, index: i });
            }
        } else {
            self.confirm_path(pid);
        }
        // The peer's first message on this connection lifts the hold
        // (`complete_path`) once it has been processed.
        if self.path(pid).is_some_and(|p| p.hold) {
            self.path_mut(pid).unwrap().hold = false;
            let r = self.received(pid, inst, msg);
            self.kick(pid);
            return r;
        }
        // Loopback: what was sent on (a -> b) arrives on (b -> a), so that
        // delivery, the duplicate rule and pongs work as for any peer. Flow
        // control applies to the path the transport reads (a -> b).
        let via = pid;
        let pid = if self.conn(pid.conn).kind == crate::types::TransportKind::Loop {
            let c = self.conn(pid.conn);
            let (l, f, tos) = (c.laddr, c.faddr, c.tos);
            PathId { conn: self.conn_for(f, l, crate::types::TransportKind::Loop, tos), index: 0 }
        } else {
            pid
        };
        let conn = pid.conn;
        self.conn_mut(conn).heard = true;
        let hdr = msg.header;
        let kind = hdr.kind();
        if kind == Kind::CongMap {
            return self.cong_recv(pid, &msg);
        }

        // The duplicate and stale rules (`Path::rx_sequence`).
        match self.path_mut(pid).unwrap().rx_sequence(&hdr) {
            Ok(()) => {}
            Err(RecvOutcome::DupDropped) => {
                self.ep.counters.recv_drop_old_seq += 1;
                return RecvOutcome::DupDropped;
            }
            Err(r) => {
                self.ep.counters.recv_drop_stale += 1;
                return r;
            }
        }

        if self.ep.cfg.ping_enable && hdr.dport == 0 {
            if hdr.sport == 0 {
                return RecvOutcome::Ignored;
            }
            self.ep.counters.recv_ping += 1;
            // A probe's generation first: a restart it reveals drops the
            // pongs still queued for the dead instance
            // (`Connection::peer_gen_update`), not the answer to this one.
            if kind == Kind::ProbePing {
                self.hs_exthdrs(conn, pid.index, &msg);
            }
            self.send_probe(pid, 0, hdr.sport);
            if kind == Kind::ProbePing {
                self.start_mprds(conn);
            }
            return RecvOutcome::Ping;
        }
        if kind == Kind::ProbePong {
            self.hs_exthdrs(conn, pid.index, &msg);
            self.start_mprds(conn);
            // After the handshake's count: with it known, a hold this pong
            // leaves unproven asks again.
            self.read_proof(pid);
            return RecvOutcome::ProbePong;
        }
        self.deliver(conn, msg, via)
    }

    /// Queues the message on its socket. Nothing is dropped for memory: a
    /// socket over its hard cap, or the node over its budget, pauses `via`
    /// (the path the transport read it from) instead.
    fn deliver(&mut self, conn: ConnId, msg: RxMessage, via: PathId) -> RecvOutcome {
        let c = self.conn(conn);
        let (laddr, faddr) = (c.laddr, c.faddr);
        let hdr = msg.header;
        let to = SocketAddr::new(laddr, hdr.dport);
        let Some(s) = self.ep.bound.get(&to).copied() else {
            self.ep.counters.recv_drop_no_sock += 1;
            return RecvOutcome::NoSocket;
        };
        // A socket receives only over its own transport (the one bind or
        // SO_RDS_TRANSPORT chose), or from this node itself (loopback).
        // Stricter than the kernel, whose rds_find_bound matches (address,
        // port) whatever the connection's transport: otherwise anyone
        // reaching our RDS-TCP port would reach sockets bound to IB, and
        // the verbs-only setup's key would protect nothing. Counted as
        // the kernel counts its own no-such-socket drops.
        let kind = self.conn(conn).kind;
        if kind != crate::types::TransportKind::Loop && self.sock(s).and_then(|k| k.transport) != Some(kind) {
            self.ep.counters.recv_drop_no_sock += 1;
            return RecvOutcome::NoSocket;
        }
        self.heard_on_lane(s, conn, via.index, hdr.sport);
        let cap = self.rcv_cap(s);
        let sock = self.sock_mut(s).unwrap();
        let mut rdma_dest = None;
        for e in hdr.extensions() {
            if let Ext::RdmaDest { rkey, offset } = e {
                rdma_dest = Some(u64::from(rkey) | (u64::from(offset) << 32));
            }
        }
        let timestamp_ns = if sock.timestamp { msg.rx_time_ns } else { None };
        let len = msg.payload.len();
        sock.recv_queue.push_back(Incoming {
            from: SocketAddr::new(faddr, hdr.sport),
            to,
            payload: msg.payload,
            header: hdr,
            timestamp_ns,
            rdma_dest,
        });
        self.ep.counters.recv_queued += 1;
        self.ep.rx_held = self.ep.rx_held.saturating_add(len as u64 + RCV_MSG_OVERHEAD);
        self.rcvbuf_delta(s, len as i64);
        self.wake(s, false);
        let over_sock = self.sock(s).is_some_and(|k| sock_held(k) > cap);
        let over_budget = self.ep.rx_held > self.ep.cfg.rcv_budget;
        if over_sock || over_budget {
            self.rx_pause(via, over_sock.then_some(s), over_budget);
            return RecvOutcome::DeliveredPaused;
        }
        RecvOutcome::Delivered
    }

    /// The socket's hard receive cap.
    pub(crate) fn rcv_cap(&self, s: SockId) -> u64 {
        let hard = u64::from(self.ep.cfg.rcv_hard_factor.max(1));
        self.sock(s).map_or(RCV_HARD_FLOOR, |k| k.rcvbuf_limit().saturating_mul(hard).max(RCV_HARD_FLOOR))
    }

    /// Bytes queued on all sockets, against [`crate::NodeConfig::rcv_budget`].
    pub fn rx_held(&self) -> u64 {
        self.ep.rx_held
    }

    /// Whether reading the path is paused (receive flow control).
    pub fn rx_paused(&self, p: PathId) -> bool {
        self.ep.rx_paused.contains_key(&p)
    }

    /// Pauses reading `pid` on account of socket `s` and/or the budget.
    fn rx_pause(&mut self, pid: PathId, s: Option<SockId>, budget: bool) {
        let Some(info) = self.path_info(pid) else { return };
        let st = self.ep.rx_paused.entry(pid).or_default();
        let new = st.socks.is_empty() && !st.budget;
        if let Some(s) = s {
            if !st.socks.contains(&s) {
                st.socks.push(s);
            }
        }
        st.budget |= budget;
        if new {
            self.ep.counters.recv_pause += 1;
            self.push_rx_flow(info, true);
        }
    }

    /// Tells the transport to pause or resume reading a path; `seq` orders
    /// the signals across the threads that dispatch them.
    pub(crate) fn push_rx_flow(&mut self, path: crate::path::PathInfo, paused: bool) {
        self.ep.rx_flow_seq += 1;
        self.ep.outputs.push_back(Output::RxFlow { path, paused, seq: self.ep.rx_flow_seq });
    }

    /// Resumes the paused paths whose reasons are gone: their sockets are
    /// back under three quarters of their cap (or closed), the node under
    /// three quarters of its budget.
    pub(crate) fn rx_recheck(&mut self) {
        if self.ep.rx_paused.is_empty() {
            return;
        }
        let budget_ok = self.ep.rx_held <= self.ep.cfg.rcv_budget - self.ep.cfg.rcv_budget / 4;
        let mut st = std::mem::take(&mut self.ep.rx_paused);
        let mut resume = Vec::new();
        for (pid, p) in st.iter_mut() {
            p.socks.retain(|&s| {
                let cap = self.rcv_cap(s);
                self.sock(s).is_some_and(|k| sock_held(k) > cap - cap / 4)
            });
            if budget_ok {
                p.budget = false;
            }
            if p.socks.is_empty() && !p.budget {
                resume.push(*pid);
            }
        }
        resume.sort();
        for pid in resume {
            st.remove(&pid);
            if let Some(info) = self.path_info(pid) {
                self.ep.counters.recv_resume += 1;
                self.push_rx_flow(info, false);
            }
        }
        self.ep.rx_paused = st;
    }
}

impl Node {
    /// `recvmsg` (non-blocking; the driver waits). Notifications come first,
    /// then a congestion update, then data, as in `rds_recvmsg`. With `peek`
    /// the datagram stays queued; notifications and congestion updates are
    /// consumed even then (the kernel hands them out without looking at
    /// MSG_PEEK).
    pub fn recv(&mut self, s: SockId, peek: bool) -> Result<Received, Errno> {
        let sock = self.sock_mut(s).ok_or(Errno::EINVAL)?;
        sock.cong_poll_pending = false;
        if let Some(n) = sock.notify_queue.pop_front() {
            self.wake(s, false);
            return Ok(Received::RdmaStatus { user_token: n.user_token, status: n.status });
        }
        if sock.cong_notify != 0 {
            let mask = std::mem::take(&mut sock.cong_notify);
            self.wake(s, false);
            return Ok(Received::CongUpdate { mask });
        }
        let inc = if peek { sock.recv_queue.front().cloned() } else { sock.recv_queue.pop_front() };
        let Some(inc) = inc else {
            // Clearing the congestion-update flag may have changed readiness:
            // report it, or a later delivery would look like no change.
            self.wake(s, false);
            return Err(Errno::EAGAIN);
        };
        // s_recv_delivered counts every copy to the user, peeks included.
        self.ep.counters.recv_delivered += 1;
        if !peek {
            self.rcvbuf_delta(s, -(inc.payload.len() as i64));
            self.ep.rx_held = self.ep.rx_held.saturating_sub(inc.payload.len() as u64 + crate::recv::RCV_MSG_OVERHEAD);
            self.rx_recheck();
        }
        self.wake(s, false);
        Ok(Received::Data(inc))
    }
}

/// The receive rules that need nothing but the path.
impl Path {
    /// The duplicate rule: only a retransmission of something already seen
    /// is dropped (`DupDropped`); sequence numbers may skip forward
    /// (cancelled messages) and fall back (a restarted peer). A
    /// retransmission before anything else on the only connection of the
    /// path the peer could ever have sent on to this node was first sent to
    /// a previous instance of this node, which died without acking it:
    /// stale, not ours (`Stale`). (A peer resends its unacked messages
    /// first on a new connection; the 6.1 kernel cannot tell that we
    /// restarted, and would deliver them.) A message that passes advances
    /// the receive sequence.
    pub(crate) fn rx_sequence(&mut self, hdr: &Header) -> Result<(), RecvOutcome> {
        if hdr.sequence < self.next_rx_seq && hdr.is_retransmitted() {
            return Err(RecvOutcome::DupDropped);
        }
        if hdr.is_retransmitted() && self.rx_conns <= 1 && !self.rx_any && hdr.sport > PROBE_PORT {
            return Err(RecvOutcome::Stale);
        }
        self.next_rx_seq = hdr.sequence.wrapping_add(1);
        self.rx_any = true;
        Ok(())
    }
}
