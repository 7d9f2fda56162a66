//! The simulated network: TCP-like connections between the nodes' path
//! ends (two byte streams carrying the real wire encoding, segments with
//! latency, a window, acks from the peer's kernel, FIN and reset), the
//! nodes' reactors that read them, and the loopback transport. See
//! [`crate::sim`] for the model.

use std::collections::VecDeque;
use std::net::IpAddr;

use rds_core::wire::{FrameDecoder, HEADER_LEN, Kind};
use rds_core::{Accept, DownReason, PathId, PathInfo, RxMessage, TransportKind, TxMessage, addr_cmp};

use super::oracle;
use super::world::{Ev, MS, Res, Sim, US, shuffle};

/// How long a shutdown waits for the peer's FIN (rds-tcp's default).
pub(super) const SHUTDOWN_DRAIN: u64 = 2_000 * MS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum St {
    Connecting,
    Open,
    /// We asked for the shutdown: FIN sent, reading until the peer's FIN.
    Draining,
    Gone,
}

pub(super) struct End {
    pub(super) node: usize,
    pub(super) inc: u32,
    /// The node's path and instance this end serves (the acceptor gets it
    /// from `accept`).
    pub(super) path: Option<(PathId, u64)>,
    pub(super) laddr: IpAddr,
    pub(super) state: St,
    pub(super) xmit_sched: bool,
    pub(super) want_room: bool,
    /// The connection was reset: the reactor's next pass drains what
    /// arrived and reports it down (in path order, like any event).
    pub(super) closing: bool,
}

/// One direction of a connection: bytes written by one end, read by the other.
pub(super) struct Stream {
    /// Bytes from `buf[off]` (stream offset `base`, consumed by the reader's
    /// transport) to `written`.
    pub(super) buf: Vec<u8>,
    pub(super) off: usize,
    pub(super) base: u64,
    pub(super) written: u64,
    /// Bytes that reached the reader's kernel (and were acked by it).
    pub(super) arrived: u64,
    /// The connection broke: bytes beyond this never arrive.
    pub(super) cut: Option<u64>,
    /// FIN after this many bytes.
    pub(super) fin: Option<u64>,
    /// (end offset, sequence) of sequenced messages, for acks.
    pub(super) seqs: VecDeque<(u64, u64)>,
    /// (end offset, message id) of our data messages, for the oracle.
    pub(super) recs: VecDeque<(u64, u64)>,
    pub(super) last_arrival: u64,
    pub(super) last_ack: u64,
    pub(super) decoder: FrameDecoder,
}

impl Stream {
    pub(super) fn new() -> Stream {
        Stream {
            buf: Vec::new(),
            off: 0,
            base: 0,
            written: 0,
            arrived: 0,
            cut: None,
            fin: None,
            seqs: VecDeque::new(),
            recs: VecDeque::new(),
            last_arrival: 0,
            last_ack: 0,
            decoder: FrameDecoder::default(),
        }
    }
}

pub(super) struct Conn {
    pub(super) ends: [End; 2],
    /// `s[d]` is written by end `d`.
    pub(super) s: [Stream; 2],
    /// Bytes a writer may have unread by the peer (TCP window + buffers).
    pub(super) window: u64,
    pub(super) lat: u64,
    pub(super) reset: bool,
    /// The connector's ephemeral source port.
    pub(super) port: u16,
    /// A deferred accept is offered again by a timer.
    pub(super) retry_sched: bool,
}

impl Sim {
    pub(super) fn connect(&mut self, n: usize, info: PathInfo) {
        self.report.connects += 1;
        let j = self.owner[&info.faddr];
        let c = self.next_conn;
        self.next_conn += 1;
        let lat = match self.rng.below(4) {
            0 => self.rand(5 * US, 50 * US),
            1 | 2 => self.rand(50 * US, 500 * US),
            _ => self.rand(500 * US, 3 * MS),
        };
        let window = [4u64 << 10, 16 << 10, 64 << 10, 256 << 10][self.rng.below(4) as usize];
        let inc = self.nodes[n].inc;
        let jinc = self.nodes[j].inc;
        let end = |node, inc, path, laddr| End {
            node,
            inc,
            path,
            laddr,
            state: St::Connecting,
            xmit_sched: false,
            want_room: false,
            closing: false,
        };
        let mut conn = Conn {
            ends: [end(n, inc, Some((info.id, info.inst)), info.laddr), end(j, jinc, None, info.faddr)],
            s: [Stream::new(), Stream::new()],
            window,
            lat,
            reset: false,
            port: 32768 + self.rng.below(28000) as u16,
            retry_sched: false,
        };
        self.nodes[n].ends.insert((info.id, info.inst), (c, 0));
        let syn = self.now + lat;
        if self.nodes[j].node.is_none() {
            conn.reset = true;
            conn.ends[1].state = St::Gone;
        } else {
            let d = self.rand(0, 300 * US);
            self.sched(syn + d, Ev::AcceptArrive { c });
        }
        self.conns.insert(c, conn);
        self.sched(syn + lat, Ev::Established { c });
    }

    pub(super) fn end_info(&self, c: u64, e: usize) -> Option<(usize, u32, PathId, u64)> {
        let end = &self.conns.get(&c)?.ends[e];
        let (p, i) = end.path?;
        Some((end.node, end.inc, p, i))
    }

    /// An end reports its connection down (once) and stops.
    pub(super) fn report_down(&mut self, c: u64, e: usize, why: DownReason) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let end = &mut conn.ends[e];
        if end.state == St::Gone {
            return;
        }
        end.state = St::Gone;
        let (n, inc, path) = (end.node, end.inc, end.path);
        let other_gone = conn.ends[1 - e].state == St::Gone;
        if let Some((p, i)) = path {
            if self.alive(n, inc) {
                self.nodes[n].ends.remove(&(p, i));
                tr!(
                    self,
                    "n{n} path_down {}->{}/{} inst {i} {why:?} (conn {c})",
                    self.conns[&c].ends[e].laddr,
                    self.conns[&c].ends[1 - e].laddr,
                    p.index
                );
                let now = self.at(self.now);
                self.node(n).path_down(p, i, why, now);
                self.reoffer(n);
            }
        }
        if other_gone {
            self.conns.remove(&c);
        }
    }

    pub(super) fn reset_conn(&mut self, c: u64) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        if conn.reset {
            return;
        }
        conn.reset = true;
        for s in conn.s.iter_mut() {
            s.cut = Some(s.arrived);
        }
        for e in 0..2 {
            if self.conns[&c].ends[e].state != St::Gone {
                let d = self.rand(0, 2 * MS);
                self.sched(self.now + d, Ev::SeeClose { c, e });
            }
        }
    }

    pub(super) fn want_xmit(&mut self, c: u64, e: usize) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let end = &mut conn.ends[e];
        if end.state != St::Open || end.xmit_sched {
            return;
        }
        end.xmit_sched = true;
        let d = if self.rng.below(3) == 0 { 0 } else { self.rand(0, 30 * US) };
        self.sched(self.now + d, Ev::Xmit { c, e });
    }

    /// End `e` has bytes or a FIN to read: its node's reactor will pass.
    pub(super) fn want_read(&mut self, c: u64, e: usize) {
        let Some(conn) = self.conns.get(&c) else { return };
        let end = &conn.ends[e];
        if !matches!(end.state, St::Open | St::Draining) {
            return;
        }
        let (n, index) = (end.node, end.path.map_or(0, |p| p.0.index));
        self.nodes[n].ready.insert((index, c, e));
        if !self.nodes[n].pass_sched {
            self.nodes[n].pass_sched = true;
            let t = (self.now + self.rand(0, 200 * US)).max(self.nodes[n].reactor_stall);
            let inc = self.nodes[n].inc;
            self.sched(t, Ev::ReactorPass { n, inc });
        }
    }

    /// One pass of node `n`'s reactor: reads every connection with
    /// something to read, in any order (half the passes lower path indexes
    /// first, as one rds-tcp reactor sorts a poll batch; the others
    /// shuffled, as two reactors or a receiving thread that reads a lane
    /// itself may go). Nothing may depend on the order: a socket's
    /// pre-handshake messages on path 0 hold its lane until the peer
    /// shows it read them (`rds_core::lane0`), not until it read path 0
    /// first.
    pub(super) fn reactor_pass(&mut self, n: usize) -> Res {
        self.nodes[n].pass_sched = false;
        if self.nodes[n].reactor_stall > self.now {
            self.nodes[n].pass_sched = true;
            let (t, inc) = (self.nodes[n].reactor_stall, self.nodes[n].inc);
            self.sched(t, Ev::ReactorPass { n, inc });
            return Ok(());
        }
        let mut ready: Vec<_> = std::mem::take(&mut self.nodes[n].ready).into_iter().collect();
        if self.chance(50) {
            shuffle(&mut self.rng, &mut ready);
        }
        for (_, c, e) in ready {
            self.read(c, e)?;
        }
        Ok(())
    }

    pub(super) fn xmit(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get_mut(&c) else { return Ok(()) };
        conn.ends[e].xmit_sched = false;
        if conn.ends[e].state != St::Open {
            return Ok(());
        }
        let Some((n, inc, p, inst)) = self.end_info(c, e) else { return Ok(()) };
        if !self.alive(n, inc) {
            return Ok(());
        }
        let start = self.conns[&c].s[e].written;
        let mut out: Vec<TxMessage> = Vec::new();
        for _ in 0..64 {
            let conn = &self.conns[&c];
            let s = &conn.s[e];
            let unread = s.written - s.base;
            if unread >= conn.window {
                self.conns.get_mut(&c).unwrap().ends[e].want_room = true;
                break;
            }
            let room = (conn.window - unread) as usize;
            let budget = room.min([1usize << 10, 8 << 10, 64 << 10, 512 << 10][self.rng.below(4) as usize]);
            out.clear();
            let more = self.node(n).pull(p, inst, budget, &mut out);
            for m in &out {
                self.write_msg(c, e, m);
            }
            if !more {
                break;
            }
        }
        let end = self.conns[&c].s[e].written;
        if end > start {
            tr!(
                self,
                "n{n} xmit {}->{}/{} conn {c}: {} bytes",
                self.conns[&c].ends[e].laddr,
                self.conns[&c].ends[1 - e].laddr,
                p.index,
                end - start
            );
            self.segments(c, e, start, end);
        }
        Ok(())
    }

    pub(super) fn write_msg(&mut self, c: u64, e: usize, m: &TxMessage) {
        let s = &mut self.conns.get_mut(&c).unwrap().s[e];
        s.buf.extend_from_slice(&m.header.to_bytes());
        s.buf.extend_from_slice(&m.payload);
        s.written += (HEADER_LEN + m.payload.len()) as u64;
        if !m.is_cong_map() {
            s.seqs.push_back((s.written, m.header.sequence));
        }
        if m.header.kind() == Kind::Data {
            if let Some(id) = oracle::id_of(&m.payload) {
                s.recs.push_back((s.written, id));
            }
        }
    }

    /// Schedules the arrival of bytes `[from, to)` in 1..=3 segments.
    pub(super) fn segments(&mut self, c: u64, d: usize, from: u64, to: u64) {
        let k = 1 + self.rng.below(3);
        let mut cuts: Vec<u64> = (1..k).map(|_| from + self.rng.below(to - from)).collect();
        cuts.push(to);
        cuts.sort_unstable();
        cuts.dedup();
        for upto in cuts {
            let conn = &self.conns[&c];
            let jitter = self.rng.below(conn.lat / 2 + 1);
            let t = (self.now + conn.lat + jitter).max(conn.s[d].last_arrival);
            self.conns.get_mut(&c).unwrap().s[d].last_arrival = t;
            self.sched(t, Ev::Arrive { c, d, upto });
        }
    }

    pub(super) fn arrive(&mut self, c: u64, d: usize, upto: u64) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let r = 1 - d;
        let rnode = conn.ends[r].node;
        let rinc = conn.ends[r].inc;
        let receiver_up = conn.ends[r].state != St::Gone;
        let s = &mut conn.s[d];
        let new = upto.min(s.cut.unwrap_or(u64::MAX)).min(s.written);
        if new > s.arrived && receiver_up && self.nodes[rnode].node.is_some() && self.nodes[rnode].inc == rinc {
            s.arrived = new;
            let lat = conn.lat;
            let jitter = self.rng.below(lat / 2 + 1);
            let t = (self.now + lat + jitter).max(s.last_ack);
            s.last_ack = t;
            self.sched(t, Ev::Ack { c, d, upto: new });
        }
        self.want_read(c, r);
    }

    pub(super) fn ack(&mut self, c: u64, d: usize, upto: u64) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let end = &conn.ends[d];
        if end.state == St::Gone {
            return;
        }
        let n = end.node;
        if self.nodes[n].reactor_stall > self.now {
            // rds-tcp learns of acks in its reactor.
            let t = self.nodes[n].reactor_stall;
            self.sched(t, Ev::Ack { c, d, upto });
            return;
        }
        let mut last = None;
        let s = &mut conn.s[d];
        while s.seqs.front().is_some_and(|(off, _)| *off <= upto) {
            last = Some(s.seqs.pop_front().unwrap().1);
        }
        if let (Some(seq), Some((n, inc, p, i))) = (last, self.end_info(c, d)) {
            if self.alive(n, inc) {
                self.node(n).acked(p, i, seq);
            }
        }
    }

    pub(super) fn established(&mut self, c: u64) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        if conn.ends[0].state != St::Connecting {
            return Ok(());
        }
        let (n, inc) = (conn.ends[0].node, conn.ends[0].inc);
        if !self.alive(n, inc) {
            return Ok(());
        }
        if conn.reset {
            self.report_down(c, 0, DownReason::ConnectFailed);
            return Ok(());
        }
        let (l, f) = (conn.ends[0].laddr, conn.ends[1].laddr);
        if addr_cmp(&l, &f) != std::cmp::Ordering::Less {
            // The poke: the larger address never keeps a connection.
            self.reset_conn(c);
            self.report_down(c, 0, DownReason::DirectionRule);
            return Ok(());
        }
        let (p, i) = conn.ends[0].path.unwrap();
        self.conns.get_mut(&c).unwrap().ends[0].state = St::Open;
        tr!(self, "n{n} path_up {l}->{f}/{} inst {i} (conn {c})", p.index);
        let now = self.at(self.now);
        self.node(n).path_up(p, i, now);
        self.want_read(c, 0);
        self.want_xmit(c, 0);
        Ok(())
    }

    pub(super) fn accept_arrive(&mut self, c: u64) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        let (j, jinc) = (conn.ends[1].node, conn.ends[1].inc);
        if conn.ends[1].state != St::Connecting {
            return Ok(());
        }
        if !self.alive(j, jinc) {
            // The listener of a dead instance: the connection is reset.
            self.conns.get_mut(&c).unwrap().ends[1].state = St::Gone;
            self.reset_conn(c);
            return Ok(());
        }
        // A connection reset while it waited in the accept queue (or
        // deferred) is still offered: what arrived before is readable.
        let was_reset = conn.reset;
        let (l, f) = (conn.ends[1].laddr, conn.ends[0].laddr);
        let port = conn.port;
        let now = self.at(self.now);
        let a = self.node(j).accept(TransportKind::Tcp, l, f, port, now);
        tr!(self, "n{j} accept from {f} to {l}: {a:?} (conn {c})");
        match a {
            Accept::Path(info) => {
                if addr_cmp(&f, &l) != std::cmp::Ordering::Less {
                    return Err(format!("n{j} accepted a connection from the larger address {f} to {l}"));
                }
                let conn = self.conns.get_mut(&c).unwrap();
                conn.ends[1].path = Some((info.id, info.inst));
                conn.ends[1].state = St::Open;
                self.nodes[j].ends.insert((info.id, info.inst), (c, 1));
                self.want_read(c, 1);
                self.want_xmit(c, 1);
                if was_reset {
                    self.sched(self.now, Ev::SeeClose { c, e: 1 });
                }
            }
            Accept::Reject | Accept::RejectPeerLarger => {
                self.conns.get_mut(&c).unwrap().ends[1].state = St::Gone;
                self.reset_conn(c);
            }
            Accept::Defer => {
                // Kept unread (what arrives is still acked by the kernel)
                // and offered again after the node's next path_down, or
                // in a millisecond.
                if !self.nodes[j].deferred.contains(&c) {
                    self.nodes[j].deferred.push(c);
                }
                let conn = self.conns.get_mut(&c).unwrap();
                if !conn.retry_sched {
                    conn.retry_sched = true;
                    self.sched(self.now + MS, Ev::Reoffer { c });
                }
            }
        }
        Ok(())
    }

    /// Offers node `n`'s deferred connections again.
    pub(super) fn reoffer(&mut self, n: usize) {
        for c in std::mem::take(&mut self.nodes[n].deferred) {
            self.sched(self.now, Ev::AcceptArrive { c });
        }
    }

    pub(super) fn shutdown(&mut self, c: u64, e: usize) -> Res {
        let conn = self.conns.get_mut(&c).unwrap();
        match conn.ends[e].state {
            St::Connecting => {
                self.reset_conn(c);
                self.report_down(c, e, DownReason::ShutdownDone);
            }
            St::Open => {
                conn.ends[e].state = St::Draining;
                self.send_fin(c, e);
                self.sched(self.now + SHUTDOWN_DRAIN, Ev::DrainTimeout { c, e });
                self.want_read(c, e);
            }
            St::Draining | St::Gone => {}
        }
        Ok(())
    }

    pub(super) fn send_fin(&mut self, c: u64, e: usize) {
        let conn = self.conns.get_mut(&c).unwrap();
        let s = &mut conn.s[e];
        if s.fin.is_some() {
            return;
        }
        s.fin = Some(s.written);
        let t = (self.now + conn.lat).max(s.last_arrival);
        s.last_arrival = t;
        let upto = s.written;
        self.sched(t, Ev::Arrive { c, d: e, upto });
    }

    /// The transport of end `e` reads what arrived and hands complete
    /// messages to its node; handles the peer's FIN.
    pub(super) fn read(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        let (n, inc) = (conn.ends[e].node, conn.ends[e].inc);
        if !matches!(conn.ends[e].state, St::Open | St::Draining) || !self.alive(n, inc) {
            return Ok(());
        }
        let conn = self.conns.get_mut(&c).unwrap();
        let (p, inst) = conn.ends[e].path.unwrap();
        let s = &mut conn.s[1 - e];
        let avail = (s.arrived - s.base) as usize;
        let mut frames = Vec::new();
        let r = s.decoder.feed(&s.buf[s.off..s.off + avail], &mut |f| frames.push(f));
        s.off += avail;
        if s.off > 1 << 16 && s.off * 2 > s.buf.len() {
            s.buf.drain(..s.off);
            s.off = 0;
        }
        s.base = s.arrived;
        let base = s.base;
        while s.recs.front().is_some_and(|(off, _)| *off <= base) {
            s.recs.pop_front();
        }
        let fin_read = s.fin.is_some_and(|f| base >= f);
        if let Err(err) = r {
            return Err(format!("n{n} conn {c}: undecodable stream: {err}"));
        }
        for f in frames {
            let rx = RxMessage::from(f);
            let id = if rx.header.kind() == Kind::Data { oracle::id_of(&rx.payload) } else { None };
            let len = rx.payload.len() as u64;
            let detail = if self.verbose && rx.header.kind() == Kind::CongMap {
                let ports: Vec<u16> = rds_core::cong::CongMap::from_wire(&rx.payload)
                    .map(|m| m.congested_ports().take(8).collect())
                    .unwrap_or_default();
                format!(" sport {} dport {} congested {ports:?}", rx.header.sport, rx.header.dport)
            } else {
                String::new()
            };
            let o = self.node(n).received(p, inst, rx);
            tr!(
                self,
                "n{n} received on {}<-{}/{} inst {inst}: {o:?} {:?}{detail}",
                self.conns[&c].ends[e].laddr,
                self.conns[&c].ends[1 - e].laddr,
                p.index,
                id
            );
            self.outcome(n, id, len, o)?;
        }
        if fin_read {
            let state = self.conns[&c].ends[e].state;
            if state == St::Draining {
                self.report_down(c, e, DownReason::ShutdownDone);
            } else if state == St::Open {
                // The peer closed: we have everything it sent; close at once
                // (our FIN follows what we wrote, which the peer still reads).
                self.send_fin(c, e);
                self.report_down(c, e, DownReason::Closed);
            }
        }
        if self.conns.get(&c).is_some_and(|k| k.ends[e].closing && k.ends[e].state != St::Gone) {
            // Delivered what was read before the connection ended.
            let why = if self.conns[&c].ends[e].state == St::Draining {
                DownReason::ShutdownDone
            } else {
                DownReason::Closed
            };
            self.report_down(c, e, why);
        }
        // The writer of that stream may have room again.
        if let Some(conn) = self.conns.get_mut(&c) {
            if conn.ends[1 - e].want_room {
                conn.ends[1 - e].want_room = false;
                self.want_xmit(c, 1 - e);
            }
        }
        Ok(())
    }

    /// End `e` notices the reset: its reactor's next pass drains what
    /// arrived and reports the connection down.
    pub(super) fn see_close(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        let (n, inc, state) = (conn.ends[e].node, conn.ends[e].inc, conn.ends[e].state);
        if state == St::Gone || !self.alive(n, inc) {
            return Ok(());
        }
        if state == St::Connecting {
            // Established will report the failure.
            return Ok(());
        }
        self.conns.get_mut(&c).unwrap().ends[e].closing = true;
        self.want_read(c, e);
        Ok(())
    }

    pub(super) fn drain_timeout(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        if conn.ends[e].state != St::Draining {
            return Ok(());
        }
        self.read(c, e)?;
        if self.conns.get(&c).is_some_and(|k| k.ends[e].state == St::Draining) {
            self.reset_conn(c);
            self.report_down(c, e, DownReason::ShutdownDone);
        }
        Ok(())
    }

    pub(super) fn loop_serve(&mut self, n: usize, p: PathId, inst: u64) -> Res {
        let mut out = Vec::new();
        for _ in 0..1000 {
            out.clear();
            let more = self.node(n).pull(p, inst, 1 << 20, &mut out);
            let mut last = None;
            for m in out.drain(..) {
                if !m.is_cong_map() {
                    last = Some(m.header.sequence);
                }
                let id = if m.header.kind() == Kind::Data { oracle::id_of(&m.payload) } else { None };
                let len = m.payload.len() as u64;
                let rx = RxMessage::new(m.header, m.payload);
                let o = self.node(n).received(p, inst, rx);
                self.outcome(n, id, len, o)?;
            }
            if let Some(seq) = last {
                self.node(n).acked(p, inst, seq);
            }
            if !more {
                return Ok(());
            }
        }
        Err(format!("n{n}: loopback path keeps producing messages"))
    }
}
