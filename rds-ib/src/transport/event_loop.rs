//! The event thread of [`IbTransport`](super::IbTransport): it owns every
//! established connection, waits in `epoll` on the command eventfd and
//! each connection's CQ and CM channels, and moves messages between the
//! connections and the core (see [`super`]).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::raw::c_int;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rds_core::{DownReason, PathId, PathInfo, Payload, RxMessage, TxMessage};

use crate::proto::frag::OutMessage;
use crate::verbs::{IbConnection, Received};

use super::{Cmd, DRAIN_TIMEOUT, PULL_BUDGET, Shared, lock};

/// The established connection of a path, owned by the event thread, with
/// what it still has to post.
struct PathConnection {
    info: PathInfo,
    conn: IbConnection,
    token: u64,
    /// Messages pulled and not fully posted yet, the first possibly half.
    tx: VecDeque<(TxMessage, Option<OutMessage>)>,
    /// The highest `h_ack` reported to the core.
    acked: u64,
    /// The connection's flow counters already added to `Counters::flow`.
    fc_seen: crate::proto::credits::FlowCounters,
}

pub(super) struct EventLoop {
    shared: Arc<Shared>,
    epfd: c_int,
    conns: HashMap<PathId, PathConnection>,
    tokens: HashMap<u64, PathId>,
    next_token: u64,
}

const WAKE_TOKEN: u64 = u64::MAX;

impl EventLoop {
    pub(super) fn new(shared: Arc<Shared>) -> io::Result<EventLoop> {
        // SAFETY: plain epoll creation.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let ev = EventLoop { shared, epfd, conns: HashMap::new(), tokens: HashMap::new(), next_token: 0 };
        ev.ctl(libc::EPOLL_CTL_ADD, ev.shared.wake_fd, WAKE_TOKEN)?;
        Ok(ev)
    }

    fn ctl(&self, op: c_int, fd: c_int, token: u64) -> io::Result<()> {
        let mut e = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
        // SAFETY: epfd and fd are live descriptors; e is valid for the call.
        if unsafe { libc::epoll_ctl(self.epfd, op, fd, &mut e) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub(super) fn run(&mut self) {
        // SAFETY: epoll_event is plain data.
        let mut evs: [libc::epoll_event; 64] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: evs has room for 64 events.
            let n = unsafe { libc::epoll_wait(self.epfd, evs.as_mut_ptr(), 64, 1000) };
            let n = if n < 0 { 0 } else { n as usize };
            for e in &evs[..n] {
                let token = e.u64;
                if token == WAKE_TOKEN {
                    let mut v: u64 = 0;
                    // SAFETY: reading 8 bytes into a live u64 from our eventfd.
                    unsafe { libc::read(self.shared.wake_fd, (&mut v as *mut u64).cast(), 8) };
                    continue;
                }
                let Some(&pid) = self.tokens.get(&(token >> 1)) else { continue };
                if token & 1 == 1 {
                    self.on_cq(pid);
                } else {
                    self.on_cm(pid);
                }
            }
            let cmds: Vec<Cmd> = lock(&self.shared.cmds).drain(..).collect();
            for c in cmds {
                if !self.on_cmd(c) {
                    self.close_all();
                    // SAFETY: our epoll descriptor, closed once.
                    unsafe { libc::close(self.epfd) };
                    return;
                }
            }
        }
    }

    fn on_cmd(&mut self, c: Cmd) -> bool {
        match c {
            Cmd::Close => return false,
            Cmd::Kick(pid, inst) => {
                if self.conns.get(&pid).is_some_and(|a| a.info.inst == inst) {
                    self.transmit(pid);
                }
            }
            Cmd::Shutdown(pid, inst) => {
                let connecting = {
                    let mut c = lock(&self.shared.connecting);
                    if c.get(&pid) == Some(&inst) {
                        c.remove(&pid);
                        true
                    } else {
                        false
                    }
                };
                if connecting {
                    if let Some(s) = self.shared.sink() {
                        s.path_down(pid, inst, DownReason::ShutdownDone);
                    }
                } else if self.conns.get(&pid).is_some_and(|a| a.info.inst == inst) {
                    self.teardown(pid, DownReason::ShutdownDone);
                } else if let Some(s) = self.shared.sink() {
                    // Nothing of that instance left: done already.
                    s.path_down(pid, inst, DownReason::ShutdownDone);
                }
            }
            Cmd::Connected(info, res) => {
                let current = {
                    let mut c = lock(&self.shared.connecting);
                    if c.get(&info.id) == Some(&info.inst) {
                        c.remove(&info.id);
                        true
                    } else {
                        false
                    }
                };
                match res {
                    Ok(conn) if current && !self.shared.stopped.load(Ordering::Acquire) => {
                        let ack = conn.peer_acked();
                        if self.install(info, conn, ack) {
                            if let Some(s) = self.shared.sink() {
                                s.path_up(info.id, info.inst);
                                if ack > 0 {
                                    s.acked(info.id, info.inst, ack);
                                }
                            }
                            // Completions that came before the descriptors
                            // were watched; then the first pull.
                            self.on_cq(info.id);
                        }
                    }
                    Ok(mut conn) => {
                        // Superseded (shut down, or an accepted connection
                        // took the path meanwhile).
                        conn.drain(Instant::now() + DRAIN_TIMEOUT);
                    }
                    Err(_) => {
                        lock(&self.shared.counters).connect_failed += 1;
                        if current {
                            if let Some(s) = self.shared.sink() {
                                s.path_down(info.id, info.inst, DownReason::ConnectFailed);
                            }
                        }
                    }
                }
            }
            Cmd::RxFlow(pid) => {
                if self.conns.contains_key(&pid) && !self.apply_rx_flow(pid) {
                    // Resumed: hand up what was held, then go on.
                    self.on_cq(pid);
                }
            }
            Cmd::Accepted(info, conn) if self.conns.get(&info.id).is_some_and(|a| a.info.inst > info.inst) => {
                // Established after a newer connection took the path (the
                // listener waits on several at once): the core has moved
                // on; this one goes (dropping it disconnects it).
                drop(conn);
            }
            Cmd::Accepted(info, conn) => {
                lock(&self.shared.connecting).remove(&info.id);
                let ack = conn.peer_acked();
                if self.install(info, conn, ack) {
                    if let Some(s) = self.shared.sink() {
                        if ack > 0 {
                            s.acked(info.id, info.inst, ack);
                        }
                    }
                    self.on_cq(info.id);
                }
            }
        }
        true
    }

    /// Registers a connection for a path (ending an older one of the path).
    fn install(&mut self, info: PathInfo, mut conn: IbConnection, acked: u64) -> bool {
        conn.set_eager_acks(true);
        if self.conns.contains_key(&info.id) {
            self.teardown(info.id, DownReason::Closed);
        }
        let token = self.next_token;
        self.next_token += 1;
        let (cm, cq) = (conn.cm_fd(), conn.cq_fd());
        let ok = self.ctl(libc::EPOLL_CTL_ADD, cm, token << 1).is_ok()
            && self.ctl(libc::EPOLL_CTL_ADD, cq, (token << 1) | 1).is_ok();
        self.tokens.insert(token, info.id);
        self.conns.insert(
            info.id,
            PathConnection { info, conn, token, tx: VecDeque::new(), acked, fc_seen: Default::default() },
        );
        if !ok {
            self.teardown(info.id, DownReason::Closed);
            return false;
        }
        // A path paused before (an earlier connection) stays paused.
        self.apply_rx_flow(info.id);
        true
    }

    /// Applies the path's receive flow control to its connection; returns
    /// whether it is paused. A failed repost ends the connection at its
    /// next completion (the error is kept in the connection).
    fn apply_rx_flow(&mut self, pid: PathId) -> bool {
        let paused = lock(&self.shared.rx_flow).get(&pid).is_some_and(|f| f.0);
        let Some(a) = self.conns.get_mut(&pid) else { return paused };
        if a.conn.rx_gate_paused() != paused {
            let _ = a.conn.set_rx_paused(paused);
            let mut c = lock(&self.shared.counters);
            if paused {
                c.rx_paused += 1;
            } else {
                c.rx_resumed += 1;
            }
        }
        paused
    }

    fn on_cq(&mut self, pid: PathId) {
        let paused = self.apply_rx_flow(pid);
        let Some(a) = self.conns.get_mut(&pid) else { return };
        let res = a.conn.on_cq_event();
        let mut ready = Vec::new();
        if paused {
            // Held in the connection, in order, until the resume (or the
            // connection's end: teardown hands them up).
            let held = a.conn.ready_bytes() as u64;
            let mut c = lock(&self.shared.counters);
            c.rx_held_peak = c.rx_held_peak.max(held);
        } else {
            a.conn.take_ready(&mut ready);
        }
        let (inst, peer_acked) = (a.info.inst, a.conn.peer_acked());
        let newly_acked = (peer_acked > a.acked).then(|| {
            a.acked = peer_acked;
            peer_acked
        });
        let protocol = a.conn.protocol_error();
        let fc = a.conn.flow_counters();
        let fc_new = fc.since(&a.fc_seen);
        a.fc_seen = fc;
        lock(&self.shared.counters).flow.add(&fc_new);
        let mut rdma_done = Vec::new();
        a.conn.take_rdma_done(&mut rdma_done);
        // Completions first: the notification of an op is queued before a
        // reply the peer sent after the op's message (reaped together).
        self.rdma_complete(pid, inst, rdma_done);
        self.deliver(pid, inst, ready);
        if let (Some(seq), Some(s)) = (newly_acked, self.shared.sink()) {
            s.acked(pid, inst, seq);
        }
        match res {
            Ok(_) => self.transmit(pid),
            Err(_) => self.teardown(pid, if protocol { DownReason::ProtocolError } else { DownReason::Closed }),
        }
    }

    fn on_cm(&mut self, pid: PathId) {
        let Some(a) = self.conns.get_mut(&pid) else { return };
        loop {
            match a.conn.poll_cm_event() {
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        self.teardown(pid, DownReason::Closed);
    }

    fn deliver(&self, pid: PathId, inst: u64, ready: Vec<Received>) {
        if ready.is_empty() {
            return;
        }
        lock(&self.shared.counters).rx_messages += ready.len() as u64;
        let mut msgs: Vec<RxMessage> =
            ready.into_iter().map(|r| RxMessage::new(r.header, Payload::new(r.payload))).collect();
        if let Some(s) = self.shared.sink() {
            s.received(pid, inst, &mut msgs);
        }
    }

    /// Reports completed RDMA operations (sequence, `RDS_RDMA_*`) to the core.
    fn rdma_complete(&self, pid: PathId, inst: u64, done: Vec<(u64, i32)>) {
        if done.is_empty() {
            return;
        }
        {
            let mut c = lock(&self.shared.counters);
            c.rdma_ops += done.len() as u64;
            c.rdma_failed += done.iter().filter(|d| d.1 != 0).count() as u64;
        }
        if let Some(s) = self.shared.sink() {
            for (seq, status) in done {
                s.rdma_complete(pid, inst, seq, status);
            }
        }
    }

    /// Posts pulled messages while the ring and the credits allow, pulling
    /// more from the core as the queue empties.
    fn transmit(&mut self, pid: PathId) {
        let Some(sink) = self.shared.sink() else { return };
        let mut failed = false;
        let mut sent = 0u64;
        loop {
            let Some(a) = self.conns.get_mut(&pid) else { return };
            if a.tx.is_empty() {
                let mut out = Vec::new();
                sink.pull(pid, a.info.inst, PULL_BUDGET, &mut out);
                // The sink may have called back into us; the entry is still
                // ours (only this thread changes the map).
                let Some(a) = self.conns.get_mut(&pid) else { return };
                if out.is_empty() {
                    break;
                }
                a.tx.extend(out.into_iter().map(|m| (m, None)));
                continue;
            }
            let (m, om) = a.tx.front_mut().unwrap();
            if om.is_none() {
                // An RDMA op goes first, and the message tells the peer its
                // rkey (RDS_EXTHDR_RDMA: a USE_ONCE MR is released on it).
                if let Some(op) = m.rdma.clone() {
                    match a.conn.post_rdma(m.header.sequence, &op) {
                        Ok(true) => {
                            let _ =
                                m.header.push_extension(rds_core::wire::Ext::Rdma { rkey: op.remote_cookie as u32 });
                        }
                        Ok(false) => break,
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
                match OutMessage::new(m.header, m.payload.len(), m.ack_required) {
                    Ok(o) => *om = Some(o),
                    Err(_) => {
                        // Never from the core (it bounds lengths); skip it.
                        a.tx.pop_front();
                        continue;
                    }
                }
            }
            let payload = m.payload.clone();
            let Some(o) = om.as_mut() else { break };
            match a.conn.post_message(o, &payload) {
                Ok(true) => {
                    a.tx.pop_front();
                    sent += 1;
                }
                Ok(false) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if sent > 0 {
            lock(&self.shared.counters).tx_messages += sent;
        }
        if failed {
            self.teardown(pid, DownReason::Closed);
        }
    }

    /// Ends a connection: disconnect, drain (delivering what completed
    /// before the flush), report `path_down`.
    fn teardown(&mut self, pid: PathId, reason: DownReason) {
        let Some(mut a) = self.conns.remove(&pid) else { return };
        self.tokens.remove(&a.token);
        let _ = self.ctl(libc::EPOLL_CTL_DEL, a.conn.cm_fd(), 0);
        let _ = self.ctl(libc::EPOLL_CTL_DEL, a.conn.cq_fd(), 0);
        let reason = if a.conn.protocol_error() { DownReason::ProtocolError } else { reason };
        a.conn.drain(Instant::now() + DRAIN_TIMEOUT);
        let mut ready = Vec::new();
        a.conn.take_ready(&mut ready);
        let st = a.conn.stats();
        {
            let mut c = lock(&self.shared.counters);
            c.conn_down += 1;
            c.rx_flushed += st.rx_flushed;
            c.tx_flushed += st.tx_flushed;
        }
        let inst = a.info.inst;
        let mut rdma_done = Vec::new();
        a.conn.take_rdma_done(&mut rdma_done);
        self.rdma_complete(pid, inst, rdma_done);
        self.deliver(pid, inst, ready);
        let peer_acked = a.conn.peer_acked();
        drop(a.conn);
        if let Some(s) = self.shared.sink() {
            if peer_acked > a.acked {
                s.acked(pid, inst, peer_acked);
            }
            s.path_down(pid, inst, reason);
        }
    }

    fn close_all(&mut self) {
        let pids: Vec<PathId> = self.conns.keys().copied().collect();
        for p in pids {
            self.teardown(p, DownReason::ShutdownDone);
        }
    }
}
