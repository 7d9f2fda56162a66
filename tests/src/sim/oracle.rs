//! The simulator's oracle: what every message accepted by `send` became,
//! and the checks of the delivery invariant (see the module docs of
//! [`crate::sim`] for the exact statement).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

/// Payloads start with this tag, then the message id (u64 LE), then filler
/// derived from the id, so a delivered payload names its message and any
/// corruption or truncation is caught.
pub const TAG: [u8; 4] = *b"RSIM";
/// The smallest payload the workload sends (tag + id).
pub const MIN_LEN: usize = 12;

/// Pseudo-random filler the payloads are cut from.
fn filler() -> &'static [u8] {
    static F: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut v = Vec::with_capacity(FILLER);
        while v.len() < FILLER {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    })
}

const FILLER: usize = 128 << 10;

/// Builds the payload of message `id` with `len` bytes (`len >= MIN_LEN`):
/// the tag, the id, then filler from an offset the id chooses.
pub fn payload(id: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&TAG);
    v.extend_from_slice(&id.to_le_bytes());
    let at = (id.wrapping_mul(0x9e37_79b9) % (FILLER / 2) as u64) as usize;
    v.extend_from_slice(&filler()[at..at + len - MIN_LEN]);
    v
}

/// The message id a payload names, if it is one of ours.
pub fn id_of(p: &[u8]) -> Option<u64> {
    if p.len() < MIN_LEN || p[..4] != TAG {
        return None;
    }
    Some(u64::from_le_bytes(p[4..12].try_into().unwrap()))
}

/// Why an undelivered message is allowed to be missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Excuse {
    /// The sending node instance died with it queued or unacked.
    SenderDied,
    /// The destination instance had it (socket receive queue, or acked in
    /// its transport's receive buffer) and died before the application
    /// read it.
    ReceiverDied,
    /// Mainline only: sent by a restarted instance and dropped by the
    /// receiver as an old retransmission, because the receiver, unable to
    /// see the restart, still held the previous instance's sequence.
    StaleSequence,
    /// Sent to an instance of the destination that died before acking it;
    /// the survivor (unable to see the restart: Mainline) resent it, and the
    /// destination's new instance dropped it as meant for its previous
    /// instance (`RecvOutcome::Stale`), as a 6.1 kernel's peer must.
    StaleReceiver,
}

#[derive(Clone, Debug)]
pub struct Msg {
    pub flow: u32,
    /// Index in the flow (accept order).
    pub idx: u32,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// Sending socket (unique across node instances).
    pub src_uid: u32,
    pub src_node: usize,
    pub len: u32,
    pub accepted_at: u64,
    /// Receiver instances that delivered it to the application, in order.
    pub deliveries: Vec<u32>,
    /// Accepted before an RDS_CANCEL_SENT_TO of its flow.
    pub cancellable: bool,
    pub excuse: Option<Excuse>,
}

#[derive(Clone, Debug, Default)]
pub struct Flow {
    pub msgs: Vec<u64>,
    /// Highest index delivered, per receiver instance (Mainline) or overall
    /// (key 0, Full).
    pub last: BTreeMap<u32, u32>,
    /// Messages RDS_CANCEL_SENT_TO reported dropped for this flow.
    pub cancelled: u64,
}

/// The record of one run.
#[derive(Default)]
pub struct Oracle {
    pub msgs: Vec<Msg>,
    pub flows: Vec<Flow>,
    flow_index: HashMap<(u32, SocketAddr), u32>,
    /// Mainline handshake: restarts are not detectable, so a message may be
    /// delivered again by a later instance of the receiver (see the docs).
    pub mainline: bool,
    pub delivered: u64,
}

impl Oracle {
    pub fn new(mainline: bool) -> Oracle {
        Oracle { mainline, ..Oracle::default() }
    }

    /// A send was accepted; returns the message id to put in the payload.
    pub fn next_id(&self) -> u64 {
        self.msgs.len() as u64
    }

    #[allow(clippy::too_many_arguments)]
    pub fn accepted(
        &mut self,
        id: u64,
        src_uid: u32,
        src_node: usize,
        src: SocketAddr,
        dst: SocketAddr,
        len: usize,
        now: u64,
    ) {
        assert_eq!(id, self.msgs.len() as u64);
        let next = self.flows.len() as u32;
        let flow = *self.flow_index.entry((src_uid, dst)).or_insert(next);
        if flow == next {
            self.flows.push(Flow::default());
        }
        let f = &mut self.flows[flow as usize];
        let idx = f.msgs.len() as u32;
        f.msgs.push(id);
        self.msgs.push(Msg {
            flow,
            idx,
            src,
            dst,
            src_uid,
            src_node,
            len: len as u32,
            accepted_at: now,
            deliveries: Vec::new(),
            cancellable: false,
            excuse: None,
        });
    }

    /// RDS_CANCEL_SENT_TO of (socket, dst) dropped `n` messages: everything
    /// of the flow accepted so far may be missing (at most `n` of them).
    pub fn cancelled(&mut self, src_uid: u32, dst: SocketAddr, n: usize) {
        let Some(&flow) = self.flow_index.get(&(src_uid, dst)) else {
            if n != 0 {
                // Nothing was ever accepted for this flow.
                self.flows.push(Flow::default());
            }
            return;
        };
        let f = &mut self.flows[flow as usize];
        f.cancelled += n as u64;
        for id in f.msgs.clone() {
            self.msgs[id as usize].cancellable = true;
        }
    }

    /// The application of receiver instance `inc` read a datagram.
    pub fn delivered(&mut self, inc: u32, from: SocketAddr, to: SocketAddr, payload: &[u8]) -> Result<(), String> {
        let Some(id) = id_of(payload) else {
            return Err(format!("{to} received a payload that is not ours ({} bytes)", payload.len()));
        };
        let Some(m) = self.msgs.get_mut(id as usize) else {
            return Err(format!("{to} received unknown message id {id}"));
        };
        if payload.len() != m.len as usize || payload != payload_of(id, m.len as usize).as_slice() {
            return Err(format!("message {id}: payload corrupted ({} bytes, sent {})", payload.len(), m.len));
        }
        if from != m.src || to != m.dst {
            return Err(format!("message {id} from {} to {} was delivered as from {from} to {to}", m.src, m.dst));
        }
        if !m.deliveries.is_empty() {
            let allowed = self.mainline && m.deliveries.iter().all(|d| *d < inc);
            if !allowed {
                return Err(format!(
                    "message {id} (flow {} #{}, {} -> {}) delivered twice (receiver instances {:?} then {inc})",
                    m.flow, m.idx, m.src, m.dst, m.deliveries
                ));
            }
        }
        m.deliveries.push(inc);
        let key = if self.mainline { inc } else { 0 };
        let f = &mut self.flows[m.flow as usize];
        if let Some(&last) = f.last.get(&key) {
            if m.idx <= last {
                let prev = f.msgs[last as usize];
                return Err(format!(
                    "flow {} ({} -> {}) out of order: #{} (message {id}) delivered after #{last} (message {prev})",
                    m.flow, m.src, m.dst, m.idx
                ));
            }
        }
        f.last.insert(key, m.idx);
        self.delivered += 1;
        Ok(())
    }

    pub fn excuse(&mut self, id: u64, why: Excuse) {
        if let Some(m) = self.msgs.get_mut(id as usize) {
            if m.deliveries.is_empty() && m.excuse.is_none() {
                m.excuse = Some(why);
            }
        }
    }

    /// Final accounting. `flushed(uid)` is the survivor node's
    /// `Node::flushed` of that socket (None for sockets of dead instances),
    /// `flushable(msg)` says whether a restart can explain its loss.
    pub fn check_complete(
        &self,
        flushed: &dyn Fn(u32) -> Option<u64>,
        flushable: &dyn Fn(&Msg) -> bool,
    ) -> Result<Summary, String> {
        let mut s = Summary::default();
        // Per flow: cancelled budget; per socket: flush budget. Messages
        // only a cancel can explain get the cancel budget first.
        let mut cancel_left: Vec<u64> = self.flows.iter().map(|f| f.cancelled).collect();
        let mut flush_need: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        let missing = |m: &Msg| m.deliveries.is_empty() && m.excuse.is_none();
        let mut cancelled = vec![false; self.msgs.len()];
        for pass_flushable in [false, true] {
            for (id, m) in self.msgs.iter().enumerate() {
                if missing(m) && m.cancellable && flushable(m) == pass_flushable && cancel_left[m.flow as usize] > 0 {
                    cancel_left[m.flow as usize] -= 1;
                    cancelled[id] = true;
                }
            }
        }
        for (id, m) in self.msgs.iter().enumerate() {
            if !m.deliveries.is_empty() {
                s.delivered += 1;
                continue;
            }
            match m.excuse {
                Some(Excuse::SenderDied) => {
                    s.sender_died += 1;
                    continue;
                }
                Some(Excuse::ReceiverDied) => {
                    s.receiver_died += 1;
                    continue;
                }
                Some(Excuse::StaleSequence) => {
                    s.stale_sequence += 1;
                    continue;
                }
                Some(Excuse::StaleReceiver) => {
                    s.stale_receiver += 1;
                    continue;
                }
                None => {}
            }
            if cancelled[id] {
                s.cancelled += 1;
                continue;
            }
            flush_need.entry(m.src_uid).or_default().push(id as u64);
        }
        for (uid, ids) in flush_need {
            let m0 = &self.msgs[ids[0] as usize];
            let budget = flushed(uid);
            let ok = match budget {
                // A dead instance's socket: covered by SenderDied already.
                None => false,
                Some(b) => ids.len() as u64 <= b && ids.iter().all(|id| flushable(&self.msgs[*id as usize])),
            };
            if !ok {
                let list: Vec<String> = ids
                    .iter()
                    .take(8)
                    .map(|id| {
                        let m = &self.msgs[*id as usize];
                        format!("{id} (flow {} #{}, to {}, cancellable {})", m.flow, m.idx, m.dst, m.cancellable)
                    })
                    .collect();
                return Err(format!(
                    "{} message(s) of socket {} ({}) lost, not explained (flushed reported: {:?}): {}",
                    ids.len(),
                    uid,
                    m0.src,
                    budget,
                    list.join(", ")
                ));
            }
            s.flushed += ids.len() as u64;
        }
        Ok(s)
    }
}

fn payload_of(id: u64, len: usize) -> Vec<u8> {
    payload(id, len)
}

/// What became of the accepted messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub delivered: u64,
    pub cancelled: u64,
    pub flushed: u64,
    pub sender_died: u64,
    pub receiver_died: u64,
    pub stale_sequence: u64,
    pub stale_receiver: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    /// Three messages of one flow, 0..3, of socket 1 (node 0).
    fn three() -> Oracle {
        let mut o = Oracle::new(false);
        for id in 0..3 {
            o.accepted(id, 1, 0, sa(5000), sa(4000), 20, 0);
        }
        o
    }

    fn deliver(o: &mut Oracle, inc: u32, id: u64) -> Result<(), String> {
        o.delivered(inc, sa(5000), sa(4000), &payload(id, 20))
    }

    #[test]
    fn duplicates_reordering_corruption_and_losses_are_caught() {
        let mut o = three();
        deliver(&mut o, 1, 0).unwrap();
        assert!(deliver(&mut o, 1, 0).unwrap_err().contains("delivered twice"));
        let mut o = three();
        deliver(&mut o, 1, 1).unwrap();
        assert!(deliver(&mut o, 1, 0).unwrap_err().contains("out of order"));
        let mut o = three();
        let mut p = payload(2, 20);
        p[15] ^= 1;
        assert!(o.delivered(1, sa(5000), sa(4000), &p).unwrap_err().contains("corrupted"));
        assert!(o.delivered(1, sa(5001), sa(4000), &payload(2, 20)).unwrap_err().contains("delivered as from"));
        // Message 1 missing: nothing explains it.
        let mut o = three();
        deliver(&mut o, 1, 0).unwrap();
        deliver(&mut o, 1, 2).unwrap();
        let none = |_: u32| Some(0);
        let err = o.check_complete(&none, &|_| true).unwrap_err();
        assert!(err.contains("1 message(s) of socket 1"), "{err}");
        // Reported flushed (and flushable): explained.
        let s = o.check_complete(&|_| Some(1), &|_| true).unwrap();
        assert_eq!((s.delivered, s.flushed), (2, 1));
        // Flushed count present but the message could not have been flushed.
        assert!(o.check_complete(&|_| Some(1), &|_| false).is_err());
    }

    #[test]
    fn cancels_excuse_at_most_what_they_dropped() {
        let mut o = three();
        o.cancelled(1, sa(4000), 1);
        deliver(&mut o, 1, 0).unwrap();
        // Two missing, one cancel: one is unexplained.
        assert!(o.check_complete(&|_| Some(0), &|_| false).is_err());
        o.cancelled(1, sa(4000), 1);
        let s = o.check_complete(&|_| Some(0), &|_| false).unwrap();
        assert_eq!(s.cancelled, 2);
    }

    #[test]
    fn mainline_allows_one_delivery_per_receiver_instance() {
        let mut o = Oracle::new(true);
        o.accepted(0, 1, 0, sa(5000), sa(4000), 20, 0);
        deliver(&mut o, 1, 0).unwrap();
        assert!(deliver(&mut o, 1, 0).is_err());
        deliver(&mut o, 2, 0).unwrap();
        assert!(deliver(&mut o, 2, 0).is_err());
    }
}
