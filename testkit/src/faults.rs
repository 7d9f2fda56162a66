//! Fault injection as a wrapper, in the manner of smoltcp's
//! `phy::FaultInjector` (which wraps a device): a [`Link`] decides what
//! happens to each message a node puts on an in-memory link, and
//! [`FaultInjector`] wraps any link and, by a seeded schedule, drops,
//! delays, duplicates or cuts instead, and releases what it delayed in a
//! seeded order across paths (reordering). The test kit's
//! [`crate::net::Net`] sends every message through its `link` (the
//! [`Ideal`] one unless a test puts an injector there).
//!
//! The faults are those a reliable, in-order transport connection can
//! show RDS: a connection only loses bytes when it ends, and one path's
//! messages never overtake each other.

use crate::Rng;
use crate::net::WireMsg;

/// What the link does with one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Arrives now (and is acked).
    Deliver,
    /// Lost, and the connection with it (a reliable transport loses bytes
    /// only when its connection ends): the path is cut, the rest of the
    /// batch is lost too, and the sender resends after reconnecting.
    Drop,
    /// Arrives later, with every later message of its path (in order):
    /// when the net is otherwise idle, paths in the link's order.
    Delay,
    /// Arrives twice, the second copy marked RETRANSMITTED as a resend
    /// is (TCP never duplicates bytes; RDS duplicates are resends, which
    /// the receiver's duplicate rule drops).
    Duplicate,
    /// Arrives, then the connection is cut before its ack: the sender
    /// resends it after reconnecting (a duplicate the receiver drops).
    Cut,
}

/// An in-memory link: what happens to each message put on it.
pub trait Link {
    /// The fate of one message.
    fn transmit(&mut self, msg: &WireMsg) -> Verdict;
    /// Of `paths` paths with delayed messages (in the net's order), the
    /// one released next.
    fn release(&mut self, _paths: usize) -> usize {
        0
    }
    /// What a fault injector did (`None` for a link without faults).
    fn stats(&self) -> Option<FaultStats> {
        None
    }
}

/// The ideal link: everything arrives at once, in order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ideal;

impl Link for Ideal {
    fn transmit(&mut self, _: &WireMsg) -> Verdict {
        Verdict::Deliver
    }
}

/// How often each fault happens, per thousand messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultRates {
    pub drop: u64,
    pub delay: u64,
    pub duplicate: u64,
    pub cut: u64,
}

/// What a [`FaultInjector`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub delivered: u64,
    pub dropped: u64,
    pub delayed: u64,
    pub duplicated: u64,
    pub cut: u64,
}

/// Wraps a link: a message the inner link delivers meets a fault by the
/// seeded schedule `rates`; the same seed gives the same faults for the
/// same traffic.
pub struct FaultInjector<L> {
    inner: L,
    rng: Rng,
    pub rates: FaultRates,
    pub stats: FaultStats,
}

impl<L: Link> FaultInjector<L> {
    pub fn new(inner: L, seed: u64, rates: FaultRates) -> FaultInjector<L> {
        FaultInjector { inner, rng: Rng::new(seed), rates, stats: FaultStats::default() }
    }

    pub fn inner(&self) -> &L {
        &self.inner
    }
}

impl<L: Link> Link for FaultInjector<L> {
    fn transmit(&mut self, msg: &WireMsg) -> Verdict {
        let v = self.inner.transmit(msg);
        if v != Verdict::Deliver {
            return v;
        }
        let r = &self.rates;
        let mut roll = self.rng.below(1000);
        let (v, count) = 'pick: {
            for (v, pct) in [
                (Verdict::Drop, r.drop),
                (Verdict::Delay, r.delay),
                (Verdict::Duplicate, r.duplicate),
                (Verdict::Cut, r.cut),
            ] {
                if roll < pct {
                    break 'pick (v, v);
                }
                roll -= pct;
            }
            (Verdict::Deliver, Verdict::Deliver)
        };
        let s = &mut self.stats;
        match count {
            Verdict::Deliver => s.delivered += 1,
            Verdict::Drop => s.dropped += 1,
            Verdict::Delay => s.delayed += 1,
            Verdict::Duplicate => s.duplicated += 1,
            Verdict::Cut => s.cut += 1,
        }
        v
    }

    fn release(&mut self, paths: usize) -> usize {
        self.rng.below(paths as u64) as usize
    }

    fn stats(&self) -> Option<FaultStats> {
        Some(self.stats)
    }
}
