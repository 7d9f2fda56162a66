//! The faults the simulator injects during the work phase, by the seed's
//! schedule (one every `Params::fault_gap` on average): connection resets,
//! core-requested path resets, node deaths and restarts, application and
//! reactor stalls, RDS_CANCEL_SENT_TO. See [`crate::sim`].

use rds_core::{PathId, Received, SockId};

use super::net::St;
use super::oracle::{self, Excuse};
use super::world::{Ev, MS, Phase, Res, Sim, US};

impl Sim {
    pub(super) fn fault(&mut self) -> Res {
        if self.phase != Phase::Work {
            return Ok(());
        }
        let d = self.gap(self.p.fault_gap);
        self.sched(self.now + d, Ev::Fault);
        match self.rng.below(100) {
            0..=29 => {
                // A connection reset at whatever byte it is at.
                let live: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, k)| !k.reset && k.ends.iter().any(|e| e.state == St::Open))
                    .map(|(c, _)| *c)
                    .collect();
                if !live.is_empty() {
                    let c = live[self.rng.below(live.len() as u64) as usize];
                    tr!(self, "FAULT reset conn {c}");
                    self.report.resets += 1;
                    self.reset_conn(c);
                }
            }
            30..=39 => {
                // RDS_CONN_RESET-like: the core shuts a path down itself.
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                let ends: Vec<PathId> = self.nodes[n].ends.keys().map(|(p, _)| *p).collect();
                if self.nodes[n].node.is_some() && !ends.is_empty() {
                    let p = ends[self.rng.below(ends.len() as u64) as usize];
                    tr!(self, "FAULT n{n} resets path {}/{}", p.conn.0, p.index);
                    self.report.resets += 1;
                    self.node(n).reset_path(p);
                }
            }
            40..=47 => {
                if self.report.restarts < u64::from(self.p.restarts) {
                    let n = self.rng.below(self.nodes.len() as u64) as usize;
                    if self.nodes[n].node.is_some() {
                        self.kill(n);
                    }
                }
            }
            48..=69 => {
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                let i = self.rng.below(self.nodes[n].socks.len() as u64) as usize;
                let long = self.chance(30);
                let d = if long { self.rand(5 * MS, 40 * MS) } else { self.rand(100 * US, 3 * MS) };
                tr!(self, "FAULT n{n} app of {} stalls for {}us", self.nodes[n].specs[i].addr, d / US);
                self.report.stalls += 1;
                let k = &mut self.nodes[n].socks[i];
                k.stall_until = k.stall_until.max(self.now + d);
                let inc = self.nodes[n].inc;
                let t = self.nodes[n].socks[i].stall_until;
                self.sched(t, Ev::AppRecv { n, inc, s: i });
            }
            70..=79 => {
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                let d = self.rand(100 * US, 15 * MS);
                tr!(self, "FAULT n{n} reactor stalls for {}us", d / US);
                self.report.stalls += 1;
                self.nodes[n].reactor_stall = self.nodes[n].reactor_stall.max(self.now + d);
            }
            _ => {
                // RDS_CANCEL_SENT_TO of a random destination.
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                if self.nodes[n].node.is_none() {
                    return Ok(());
                }
                let i = self.rng.below(self.nodes[n].socks.len() as u64) as usize;
                let dst = self.dsts[self.rng.below(self.dsts.len() as u64) as usize];
                let (s, uid) = (self.nodes[n].socks[i].id, self.nodes[n].socks[i].uid);
                let k = self.node(n).drop_messages(s, Some(dst));
                tr!(self, "FAULT n{n} cancels {} -> {dst}: {k} dropped", self.nodes[n].specs[i].addr);
                self.report.cancels += 1;
                self.oracle.cancelled(uid, dst, k);
            }
        }
        Ok(())
    }

    /// Node `n` dies abruptly: its sockets, queues and transport buffers
    /// are gone; a new instance starts a little later.
    pub(super) fn kill(&mut self, n: usize) {
        tr!(self, "FAULT n{n} dies");
        self.report.restarts += 1;
        // Received but never read: on its sockets' queues...
        let ids: Vec<SockId> = self.nodes[n].socks.iter().map(|k| k.id).collect();
        for s in ids {
            while let Ok(r) = self.node(n).recv(s, false) {
                if let Received::Data(m) = r {
                    if let Some(id) = oracle::id_of(&m.payload) {
                        self.oracle.excuse(id, Excuse::ReceiverDied);
                    }
                }
            }
        }
        // ... and acked by its TCP but not yet read by its transport.
        let ends: Vec<(u64, usize)> = self.nodes[n].ends.values().copied().collect();
        let mut all: Vec<(u64, usize)> = self
            .conns
            .iter()
            .flat_map(|(c, k)| {
                (0..2).filter(move |e| k.ends[*e].node == n && k.ends[*e].state != St::Gone).map(move |e| (*c, e))
            })
            .collect();
        all.extend(ends);
        all.sort_unstable();
        all.dedup();
        for (c, e) in all {
            let Some(conn) = self.conns.get_mut(&c) else { continue };
            if conn.ends[e].inc != self.nodes[n].inc {
                continue;
            }
            let s = &mut conn.s[1 - e];
            let arrived = s.arrived;
            let lost: Vec<u64> = s.recs.iter().filter(|(off, _)| *off <= arrived).map(|(_, id)| *id).collect();
            s.cut = Some(arrived);
            conn.reset = true;
            conn.ends[e].state = St::Gone;
            let other = 1 - e;
            let other_state = conn.ends[other].state;
            for id in lost {
                self.oracle.excuse(id, Excuse::ReceiverDied);
            }
            if other_state != St::Gone {
                // The survivor sees the reset after the dead side's last bytes.
                let d = self.rand(0, 3 * MS);
                self.sched(self.now + d, Ev::SeeClose { c, e: other });
            } else {
                self.conns.remove(&c);
            }
        }
        for k in &self.nodes[n].socks {
            self.dead_uids.push(k.uid);
        }
        self.nodes[n].node = None;
        self.nodes[n].ends.clear();
        self.nodes[n].deaths += 1;
        let d = self.rand(0, 20 * MS);
        self.sched(self.now + d, Ev::Restart { n });
    }
}
