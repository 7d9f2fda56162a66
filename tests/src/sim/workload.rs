//! The simulated applications: each node's bound sockets, sending random
//! messages to random destinations (blocking or not) and reading what
//! arrives, and the final round once faults stop. See [`crate::sim`].

use std::net::SocketAddr;

use rds_core::{Errno, Payload, Received, SendOptions, SockId};

use super::oracle;
use super::world::{Ev, MAX_LEN, MS, Phase, Res, Sim, US};

#[derive(Clone, Debug)]
pub(super) struct SockSpec {
    pub(super) addr: SocketAddr,
    pub(super) sndbuf: u32,
    pub(super) rcvbuf: u32,
    pub(super) blocking: bool,
}

pub(super) struct AppSock {
    pub(super) id: SockId,
    pub(super) uid: u32,
    pub(super) spec: SockSpec,
    pub(super) snd_limit: u64,
    pub(super) rcv_limit: u64,
    pub(super) stall_until: u64,
    /// A blocking send is waiting for a Wake.
    pub(super) waiting: bool,
    pub(super) send_sched: bool,
    pub(super) recv_sched: bool,
    /// Payload bytes on the socket's receive queue (tracked from outcomes).
    pub(super) queued: u64,
    /// Final round: destinations still to send one message to.
    pub(super) finals: Vec<SocketAddr>,
}

impl Sim {
    pub(super) fn app_send(&mut self, n: usize, inc: u32, i: usize) -> Res {
        self.nodes[n].socks[i].send_sched = false;
        if self.p.sink == Some(n) {
            return Ok(());
        }
        let dst = match self.phase {
            Phase::Work => self.dsts[self.rng.below(self.dsts.len() as u64) as usize],
            Phase::Drain => match self.nodes[n].socks[i].finals.last() {
                Some(d) => *d,
                None => return Ok(()),
            },
            Phase::Done => return Ok(()),
        };
        let k = &self.nodes[n].socks[i];
        let (s, uid, src, blocking, limit) =
            (k.id, k.uid, k.spec.addr, k.spec.blocking || self.phase == Phase::Drain, k.snd_limit);
        let len = match self.rng.below(100) {
            0..=79 => self.rand(oracle::MIN_LEN as u64, 1500),
            80..=97 => self.rand(1500, 8192),
            _ => self.rand(8192, MAX_LEN as u64),
        }
        .min(limit) as usize;
        let len = len.max(oracle::MIN_LEN);
        let id = self.oracle.next_id();
        let payload = Payload::copy_from(&oracle::payload(id, len));
        let opts = SendOptions { blocking, ..SendOptions::default() };
        let r = self.node(n).send(s, Some(dst), &payload, &opts);
        tr!(self, "n{n} send {src} -> {dst} id {id} len {len}: {r:?}");
        match r {
            Ok(_) => {
                self.oracle.accepted(id, uid, n, src, dst, len, self.now);
                self.report.accepted += 1;
                let snd = self.node(n).snd_bytes(s);
                if snd > limit + MAX_LEN as u64 {
                    return Err(format!("n{n} {src}: send buffer holds {snd} bytes, limit {limit}"));
                }
                if self.phase == Phase::Drain {
                    self.nodes[n].socks[i].finals.pop();
                }
                let d = if self.phase == Phase::Drain { 0 } else { self.gap(self.p.send_gap) };
                self.nodes[n].socks[i].send_sched = true;
                self.sched(self.now + d, Ev::AppSend { n, inc, s: i });
            }
            Err(e) if e == Errno::EAGAIN || e == Errno::ENOBUFS => {
                if e == Errno::EAGAIN {
                    self.report.send_eagain += 1;
                } else {
                    self.report.send_enobufs += 1;
                }
                if blocking {
                    // Wait for the node's Wake of this socket.
                    self.nodes[n].socks[i].waiting = true;
                } else {
                    let d = self.gap(self.p.send_gap);
                    self.nodes[n].socks[i].send_sched = true;
                    self.sched(self.now + d, Ev::AppSend { n, inc, s: i });
                }
            }
            Err(e) => return Err(format!("n{n} {src}: send to {dst} failed with {e}")),
        }
        Ok(())
    }

    pub(super) fn app_recv(&mut self, n: usize, inc: u32, i: usize) -> Res {
        self.nodes[n].socks[i].recv_sched = false;
        if self.nodes[n].socks[i].stall_until > self.now {
            return Ok(());
        }
        let s = self.nodes[n].socks[i].id;
        let budget = 1 + self.rng.below(32);
        for _ in 0..budget {
            match self.node(n).recv(s, false) {
                Ok(Received::Data(m)) => {
                    let len = m.payload.len() as u64;
                    let k = &mut self.nodes[n].socks[i];
                    k.queued = k.queued.checked_sub(len).ok_or_else(|| format!("n{n}: read more than was queued"))?;
                    let id = oracle::id_of(&m.payload);
                    tr!(self, "n{n} app {} reads {:?} from {}", m.to, id, m.from);
                    self.oracle.delivered(inc, m.from, m.to, &m.payload)?;
                }
                Ok(Received::CongUpdate { .. }) => {}
                Ok(other) => return Err(format!("n{n}: unexpected {other:?}")),
                Err(e) if e == Errno::EAGAIN => break,
                Err(e) => return Err(format!("n{n}: recv failed with {e}")),
            }
        }
        if self.node(n).readiness(s).readable && !self.nodes[n].socks[i].recv_sched {
            self.nodes[n].socks[i].recv_sched = true;
            let d = self.rand(0, 50 * US);
            self.sched(self.now + d, Ev::AppRecv { n, inc, s: i });
        }
        Ok(())
    }

    pub(super) fn end_work(&mut self) {
        tr!(self, "faults stop; draining");
        self.phase = Phase::Drain;
        for n in 0..self.nodes.len() {
            self.nodes[n].reactor_stall = 0;
            let inc = self.nodes[n].inc;
            let alive = self.nodes[n].node.is_some();
            for i in 0..self.nodes[n].socks.len() {
                let k = &mut self.nodes[n].socks[i];
                k.stall_until = 0;
                k.finals = if self.p.sink == Some(n) { Vec::new() } else { self.dsts.clone() };
                if alive {
                    if !k.recv_sched {
                        k.recv_sched = true;
                        self.sched(self.now, Ev::AppRecv { n, inc, s: i });
                    }
                    let k = &mut self.nodes[n].socks[i];
                    if !k.send_sched && !k.waiting {
                        k.send_sched = true;
                        self.sched(self.now, Ev::AppSend { n, inc, s: i });
                    }
                }
            }
        }
        self.sched(self.now + 5 * MS, Ev::Check);
    }
}
