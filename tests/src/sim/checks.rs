//! The invariants the simulator checks: on every receive outcome (bounds,
//! no drop for a missing socket or a bad frame, what a restart excuses), at
//! quiescence, and at the end of a run against the oracle. See
//! [`crate::sim`] for the invariant, exactly.

use std::collections::BTreeMap;

use rds_core::{HandshakeExts, RecvOutcome};

use super::net::St;
use super::oracle::{Excuse, Msg};
use super::world::{Ev, MS, Phase, Res, Sim};

/// Simulated time allowed for the run to quiesce once faults stop.
pub(super) const QUIESCE_LIMIT: u64 = 120_000 * MS;

impl Sim {
    pub(super) fn outcome(&mut self, n: usize, id: Option<u64>, len: u64, o: RecvOutcome) -> Res {
        match o {
            RecvOutcome::Delivered => {
                let Some(id) = id else { return Ok(()) };
                let dst = self.oracle.msgs[id as usize].dst;
                let inc = self.nodes[n].inc;
                let Some(i) = self.nodes[n].socks.iter().position(|k| k.spec.addr == dst) else {
                    return Err(format!("n{n} queued message {id} for {dst}, which it does not serve"));
                };
                let k = &mut self.nodes[n].socks[i];
                k.queued += len;
                let bound = k.rcv_limit + self.rcv_bound_extra;
                if k.queued > bound {
                    return Err(format!("n{n} {dst}: receive queue {} bytes exceeds the bound {bound}", k.queued));
                }
                let _ = inc;
                Ok(())
            }
            RecvOutcome::DupDropped => {
                // Mainline: a restarted sender's retransmission dropped by
                // a receiver still holding the old instance's sequence.
                if let Some(id) = id {
                    let src = self.oracle.msgs[id as usize].src_node;
                    if self.p.handshake == HandshakeExts::Mainline && self.nodes[src].deaths > 0 {
                        self.oracle.excuse(id, Excuse::StaleSequence);
                    }
                }
                Ok(())
            }
            RecvOutcome::Stale => {
                // A restarted receiver drops what was resent to it but had
                // been sent to its previous instance. A Full survivor learns
                // the new generation before it resends anything and flushes
                // (reports) such messages: there a stale drop is a loss
                // nobody reports.
                match id {
                    Some(id) if self.nodes[n].deaths > 0 && self.p.handshake == HandshakeExts::Mainline => {
                        self.oracle.excuse(id, Excuse::StaleReceiver);
                        Ok(())
                    }
                    Some(id) if self.nodes[n].deaths > 0 => Err(format!(
                        "n{n} dropped message {id} as stale: a Full peer resent it before learning of the restart"
                    )),
                    _ => Err(format!("n{n} (never restarted) dropped message {id:?} as stale")),
                }
            }
            RecvOutcome::NoSocket => Err(format!("n{n}: message {id:?} for a port nobody bound")),
            RecvOutcome::ProtocolError => Err(format!("n{n}: protocol error on message {id:?}")),
            _ => Ok(()),
        }
    }

    /// Whether everything drained: all alive, nothing queued, in flight,
    /// unread or waiting.
    pub(super) fn quiet(&mut self) -> bool {
        for n in 0..self.nodes.len() {
            let Some(node) = self.nodes[n].node.as_ref() else { return false };
            if !node.unsent().is_empty() {
                return false;
            }
            for k in &self.nodes[n].socks {
                if k.queued > 0 || k.waiting || !k.finals.is_empty() || node.readiness(k.id).readable {
                    return false;
                }
            }
        }
        for conn in self.conns.values() {
            for e in 0..2 {
                if conn.ends[e].state != St::Gone && !conn.reset {
                    let s = &conn.s[e];
                    if s.written != s.base {
                        return false;
                    }
                }
            }
        }
        true
    }

    pub(super) fn check(&mut self) -> Res {
        if self.quiet() {
            self.quiet_checks += 1;
            if self.quiet_checks >= 2 {
                self.phase = Phase::Done;
                return Ok(());
            }
        } else {
            self.quiet_checks = 0;
        }
        if self.now > self.p.work + QUIESCE_LIMIT {
            return Err(format!(
                "no quiescence {}s after the faults stopped\n{}",
                QUIESCE_LIMIT / 1_000 / MS,
                self.dump()
            ));
        }
        self.sched(self.now + 5 * MS, Ev::Check);
        Ok(())
    }

    pub(super) fn final_checks(&mut self) -> Res {
        let mut flushed_by_uid = BTreeMap::new();
        for n in 0..self.nodes.len() {
            let node = self.nodes[n].node.as_ref().unwrap();
            let c = node.counters();
            for (name, v) in [
                ("recv_drop_no_sock", c.recv_drop_no_sock),
                ("recv_drop_over_limit", c.recv_drop_over_limit),
                ("recv_drop_bad_frame", c.recv_drop_bad_frame),
            ] {
                if v != 0 {
                    return Err(format!("n{n}: counter {name} = {v}"));
                }
            }
            let mut sum = 0;
            for k in &self.nodes[n].socks {
                let f = node.flushed(k.id);
                sum += f;
                flushed_by_uid.insert(k.uid, f);
                if node.snd_bytes(k.id) != 0 || node.pending_messages(k.id) != 0 {
                    return Err(format!("n{n} {}: messages still pending after quiescence", k.spec.addr));
                }
            }
            // The counter also counts flushed probes and pongs (no socket).
            if sum > c.send_drop_flushed {
                return Err(format!("n{n}: send_drop_flushed {} but sockets report {sum}", c.send_drop_flushed));
            }
            if self.p.handshake == HandshakeExts::Mainline && (c.send_drop_flushed != 0 || c.peer_restart != 0) {
                return Err(format!("n{n}: a Mainline node detected a restart"));
            }
        }
        for uid in self.dead_uids.clone() {
            let ids: Vec<u64> =
                self.oracle.msgs.iter().enumerate().filter(|(_, m)| m.src_uid == uid).map(|(i, _)| i as u64).collect();
            for id in ids {
                self.oracle.excuse(id, Excuse::SenderDied);
            }
        }
        let nodes = &self.nodes;
        let flushed = |uid: u32| flushed_by_uid.get(&uid).copied();
        let flushable = |m: &Msg| {
            let dn = nodes.iter().position(|x| x.addrs.contains(&m.dst.ip())).unwrap();
            nodes[dn].deaths > 0 && nodes[m.src_node].detections.iter().any(|t| *t >= m.accepted_at)
        };
        self.report.summary = self.oracle.check_complete(&flushed, &flushable)?;
        Ok(())
    }
}
