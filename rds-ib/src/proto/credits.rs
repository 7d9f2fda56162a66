//! Credit flow control and acks of an RDS-IB connection, sans I/O.
//!
//! **Credits** ([`Credits`], `rds_ib_send_grab_credits`,
//! `rds_ib_send_add_credits`, `rds_ib_advertise_credits`): the rule is the
//! general layer's, [`rds_core::credits`] (what send and posted credits
//! are, the last send credit kept for a frame that advertises, at most
//! [`MAX_ADV_CREDIT`] per header, [`CREDIT_UPDATE_THRESHOLD`], the 16-bit
//! bounds, the negotiation). The IB transport declares it uses it
//! ([`rds_core::TransportCaps::credits`]) and feeds it here: the `h_credit`
//! byte of every received frame, the initial credits of the private data
//! or the side channel's parameters, the receive buffers it reposts; what
//! a grab yields becomes the `h_credit` of the frames it posts. Received
//! credits while "send full" make the transport pull again.
//!
//! **Acks** ([`AckState`], `rds_ib_set_ack`, `rds_ib_attempt_ack`,
//! `rds_ib_piggyb_ack`, `rds_ib_ack_send_complete`). Every frame carries
//! `h_ack`, the sequence of the last complete message received (congestion
//! maps excluded). An explicit ack is *requested* when a complete message
//! had ACK_REQUIRED (the core's pacing, [`rds_core::TxMessage::ack_required`])
//! or when a credit update is due; a data frame posted meanwhile
//! piggybacks it and clears the request, otherwise an ack-only frame is sent
//! (it needs a send credit like any frame). Only one ack-only frame is in
//! flight at a time; a request made meanwhile is served when its send
//! completes. A received `h_ack` above the last one seen acks everything up
//! to it ([`rds_core::TransportSink::acked`]).
//!
//! [`FlowControl`] combines both the way `rds_ib_xmit` and the receive
//! completion handler use them.
//!
//! **Receive flow control** ([`RxGate`], [`rds_core::RdsTransport::rx_flow`]).
//! While the core has a path paused, a receive buffer that completes is
//! reassembled (its bytes are copied out, the message is held, never
//! dropped) but not reposted, and so not granted to the peer again. The
//! posted ring drains: with credit flow control the peer runs out of send
//! credits once it used the ones it had (at most the ring, [`RxGate`]'s
//! test shows it); without (a mainline kernel advertises 0 credits) its
//! next send meets an empty receive queue and gets RNR NAKs, which it
//! retries without end (`rnr_retry_count` 7 in both directions), so its
//! QP neither fails nor drops anything. Either way what a paused
//! connection holds is at most one receive ring of fragments. The resume
//! reposts the held buffers in one go and grants them.

pub use rds_core::credits::{CREDIT_UPDATE_THRESHOLD, CreditGrant, Credits, MAX_ADV_CREDIT, MAX_CREDITS};

/// Ack state of one connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckState {
    next: u64,
    requested: bool,
    in_flight: bool,
    recv: u64,
}

/// An ack-only frame to post: its `h_ack` and `h_credit`
/// ([`crate::proto::frag::ack_only_header`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckOnly {
    pub ack: u64,
    pub credit: u8,
}

impl AckState {
    pub fn new() -> AckState {
        AckState::default()
    }

    /// A complete message arrived (`rds_ib_process_recv` + `rds_ib_set_ack`):
    /// its sequence becomes the ack to send unless it is a congestion map,
    /// and ACK_REQUIRED requests an explicit ack.
    pub fn on_message(&mut self, seq: u64, h_flags: u8) {
        if h_flags != rds_core::wire::flags::CONG_BITMAP {
            self.next = seq;
        }
        if h_flags & rds_core::wire::flags::ACK_REQUIRED != 0 {
            self.requested = true;
        }
    }

    /// Request an explicit ack (credit update due).
    pub fn request(&mut self) {
        self.requested = true;
    }

    pub fn requested(&self) -> bool {
        self.requested
    }

    /// An ack-only frame is posted and not completed.
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The ack we would send now.
    pub fn current(&self) -> u64 {
        self.next
    }

    /// The highest `h_ack` received so far.
    pub fn peer_acked(&self) -> u64 {
        self.recv
    }

    /// The `h_ack` of a received frame; returns the sequence to report as
    /// acked when it advances.
    pub fn on_peer_ack(&mut self, h_ack: u64) -> Option<u64> {
        if h_ack > self.recv {
            self.recv = h_ack;
            Some(h_ack)
        } else {
            None
        }
    }

    /// The ack a data frame piggybacks (`rds_ib_piggyb_ack`); clears a
    /// pending request. Returns the ack and whether a request was served.
    pub fn piggyback(&mut self) -> (u64, bool) {
        (self.next, std::mem::take(&mut self.requested))
    }

    /// `rds_ib_attempt_ack`: an ack-only frame if one is requested, none is
    /// in flight and a send credit is available (taking posted credits to
    /// advertise with it).
    pub fn attempt(&mut self, credits: &mut Credits, counters: &mut FlowCounters) -> Option<AckOnly> {
        if !self.requested {
            return None;
        }
        if self.in_flight {
            counters.ack_send_delayed += 1;
            return None;
        }
        let g = credits.grab(1, false, MAX_ADV_CREDIT);
        if g.got == 0 {
            counters.tx_throttle += 1;
            // Posted credits are only taken with a send credit.
            debug_assert_eq!(g.advertise, 0);
            return None;
        }
        self.requested = false;
        self.in_flight = true;
        counters.ack_sent += 1;
        if g.advertise > 0 {
            counters.tx_credit_updates += 1;
        }
        Some(AckOnly { ack: self.next, credit: g.advertise as u8 })
    }

    /// The ack-only frame's send completed: another may go.
    pub fn send_complete(&mut self) {
        self.in_flight = false;
    }

    /// Posting the ack-only frame failed: it is requested again.
    pub fn send_failed(&mut self) {
        self.in_flight = false;
        self.requested = true;
    }
}

/// Flow control counters under the kernel's names (`ib_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// `ib_tx_throttle`: a send or ack found no credit.
    pub tx_throttle: u64,
    /// `ib_tx_credit_updates`: frames that advertised credits.
    pub tx_credit_updates: u64,
    /// `ib_rx_credit_updates`: received frames that granted credits.
    pub rx_credit_updates: u64,
    /// `ib_ack_sent`: ack-only frames posted.
    pub ack_sent: u64,
    /// `ib_ack_send_delayed`: an ack was due while one was in flight.
    pub ack_send_delayed: u64,
    /// `ib_ack_send_piggybacked`: a requested ack went out on a data frame.
    pub ack_send_piggybacked: u64,
}

impl FlowCounters {
    /// What grew since `earlier` (a snapshot of the same counters).
    pub fn since(&self, earlier: &FlowCounters) -> FlowCounters {
        FlowCounters {
            tx_throttle: self.tx_throttle.saturating_sub(earlier.tx_throttle),
            tx_credit_updates: self.tx_credit_updates.saturating_sub(earlier.tx_credit_updates),
            rx_credit_updates: self.rx_credit_updates.saturating_sub(earlier.rx_credit_updates),
            ack_sent: self.ack_sent.saturating_sub(earlier.ack_sent),
            ack_send_delayed: self.ack_send_delayed.saturating_sub(earlier.ack_send_delayed),
            ack_send_piggybacked: self.ack_send_piggybacked.saturating_sub(earlier.ack_send_piggybacked),
        }
    }

    pub fn add(&mut self, more: &FlowCounters) {
        self.tx_throttle += more.tx_throttle;
        self.tx_credit_updates += more.tx_credit_updates;
        self.rx_credit_updates += more.rx_credit_updates;
        self.ack_sent += more.ack_sent;
        self.ack_send_delayed += more.ack_send_delayed;
        self.ack_send_piggybacked += more.ack_send_piggybacked;
    }

    /// The counters with the kernel's names.
    pub fn named(&self) -> [(&'static str, u64); 6] {
        [
            ("ib_tx_throttle", self.tx_throttle),
            ("ib_tx_credit_updates", self.tx_credit_updates),
            ("ib_rx_credit_updates", self.rx_credit_updates),
            ("ib_ack_sent", self.ack_sent),
            ("ib_ack_send_delayed", self.ack_send_delayed),
            ("ib_ack_send_piggybacked", self.ack_send_piggybacked),
        ]
    }
}

/// A batch of data frames the sender may post now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataBatch {
    /// Frames (send credits) obtained; at most the number wanted.
    pub frames: u32,
    /// Credits to advertise in the batch's first frame.
    pub adv_credits: u8,
    /// The `h_ack` of the batch's frames.
    pub ack: u64,
}

/// Credits and acks of one connection, used as `rds_ib_xmit` and the receive
/// completion handler use them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowControl {
    pub credits: Credits,
    pub acks: AckState,
    pub counters: FlowCounters,
}

impl FlowControl {
    /// See [`Credits::new`].
    pub fn new(flowctl: bool) -> FlowControl {
        FlowControl { credits: Credits::new(flowctl), ..FlowControl::default() }
    }

    /// Credits for the next `wanted` fragments of a message. `first` is
    /// whether this is the message's first batch: then the ack is
    /// piggybacked (serving a pending request), and since no ack-only frame
    /// will carry the pending credits now, all of them that fit are taken
    /// for this batch too. Later batches carry the current ack. `None` when
    /// no frame may be posted (the connection is send full).
    pub fn data_batch(&mut self, wanted: u32, first: bool) -> Option<DataBatch> {
        let g = self.credits.grab(wanted, false, MAX_ADV_CREDIT);
        if g.got == 0 {
            if self.credits.flow_control() {
                self.counters.tx_throttle += 1;
            }
            return None;
        }
        let mut adv = g.advertise;
        let ack = if first {
            let (ack, served) = self.acks.piggyback();
            if served {
                self.counters.ack_send_piggybacked += 1;
            }
            if self.credits.advertising() {
                adv += self.credits.grab(0, true, MAX_ADV_CREDIT - adv).advertise;
            }
            ack
        } else {
            self.acks.current()
        };
        if adv > 0 {
            self.counters.tx_credit_updates += 1;
        }
        Some(DataBatch { frames: g.got, adv_credits: adv as u8, ack })
    }

    /// Credits of a batch that were not used (the message had fewer frames
    /// left, or posting failed) go back. Returns true when the transport
    /// should pull again.
    pub fn give_back(&mut self, frames: u32) -> bool {
        if !self.credits.flow_control() {
            return false;
        }
        self.credits.add_send_credits(frames)
    }

    /// A valid frame arrived with `h_ack` and `h_credit`. Returns the
    /// sequence to report acked (if it advanced) and whether the transport
    /// should pull again (credits arrived while send full).
    pub fn on_frame(&mut self, h_ack: u64, h_credit: u8) -> (Option<u64>, bool) {
        let mut kick = false;
        if h_credit != 0 {
            self.counters.rx_credit_updates += 1;
            kick = self.credits.add_send_credits(u32::from(h_credit));
        }
        (self.acks.on_peer_ack(h_ack), kick)
    }

    /// `posted` receive buffers were (re)posted; requests a credit update
    /// when enough wait for advertisement.
    pub fn on_refill(&mut self, posted: u32) {
        if self.credits.advertise(posted) {
            self.acks.request();
        }
    }

    /// An ack-only frame to post now, if one is due and possible.
    pub fn attempt_ack(&mut self) -> Option<AckOnly> {
        self.acks.attempt(&mut self.credits, &mut self.counters)
    }
}

/// Receive flow control of one connection (see the module docs): which
/// completed receive buffers wait for a resume instead of being reposted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RxGate {
    paused: bool,
    /// Buffers that completed while paused, in completion order.
    held: Vec<usize>,
    /// Times the gate closed.
    pub pauses: u64,
    /// Most buffers held at once.
    pub peak: usize,
}

impl RxGate {
    /// Whether completed buffers are held rather than reposted.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Buffers held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Closes (`paused`) or opens the gate. Opening returns the held
    /// buffers, to be reposted (and granted) now, in completion order.
    pub fn set(&mut self, paused: bool) -> Vec<usize> {
        if paused && !self.paused {
            self.pauses += 1;
        }
        self.paused = paused;
        if paused { Vec::new() } else { std::mem::take(&mut self.held) }
    }

    /// Receive buffer `buf` completed and its contents were taken: true
    /// when it is to be reposted now, false when the gate holds it.
    pub fn completed(&mut self, buf: usize) -> bool {
        if !self.paused {
            return true;
        }
        self.held.push(buf);
        self.peak = self.peak.max(self.held.len());
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rds_core::types::Rng;
    use rds_core::wire::flags;
    use std::collections::VecDeque;

    #[test]
    fn ack_requests_piggyback_and_one_ack_in_flight() {
        let mut f = FlowControl::new(false);
        f.acks.on_message(5, 0);
        assert_eq!(f.attempt_ack(), None, "not requested");
        f.acks.on_message(6, flags::ACK_REQUIRED);
        assert_eq!(f.attempt_ack(), Some(AckOnly { ack: 6, credit: 0 }));
        // A second request while the first is in flight waits.
        f.acks.on_message(7, flags::ACK_REQUIRED);
        assert_eq!(f.attempt_ack(), None);
        assert_eq!(f.counters.ack_send_delayed, 1);
        f.acks.send_complete();
        assert_eq!(f.attempt_ack(), Some(AckOnly { ack: 7, credit: 0 }));
        f.acks.send_complete();
        // A congestion map (h_flags exactly CONG_BITMAP) does not move the
        // ack; any other flag makes it data, as in the kernel's equality test.
        f.acks.on_message(0, flags::CONG_BITMAP);
        assert_eq!(f.acks.current(), 7);
        assert!(!f.acks.requested());
        f.acks.on_message(7, flags::RETRANSMITTED | flags::ACK_REQUIRED);
        assert_eq!(f.acks.current(), 7);
        // A data batch piggybacks the request.
        let b = f.data_batch(3, true).unwrap();
        assert_eq!(b, DataBatch { frames: 3, adv_credits: 0, ack: 7 });
        assert_eq!(f.counters.ack_send_piggybacked, 1);
        assert_eq!(f.attempt_ack(), None);
        // Failed posting requests again.
        f.acks.request();
        assert!(f.attempt_ack().is_some());
        f.acks.send_failed();
        assert!(f.acks.requested() && !f.acks.in_flight());
        // Received acks only move forward.
        assert_eq!(f.on_frame(10, 0), (Some(10), false));
        assert_eq!(f.on_frame(9, 0), (None, false));
        assert_eq!(f.on_frame(10, 0), (None, false));
    }

    #[test]
    fn ack_only_frames_need_a_credit() {
        let mut f = FlowControl::new(false);
        f.credits.set_flow_control(true, 1);
        f.acks.request();
        // One credit, nothing posted: it is held back.
        assert_eq!(f.attempt_ack(), None);
        assert_eq!(f.counters.tx_throttle, 1);
        assert!(f.acks.requested());
        // Posting 16 buffers requests an update and frees the last credit.
        f.on_refill(16);
        assert_eq!(f.attempt_ack(), Some(AckOnly { ack: 0, credit: 16 }));
        assert_eq!(f.credits.send_credits(), 0);
        assert_eq!(f.counters.tx_credit_updates, 1);
    }

    #[test]
    fn first_batch_takes_all_pending_credits() {
        let mut f = FlowControl::new(false);
        f.credits.set_flow_control(true, 100);
        f.on_refill(20);
        let b = f.data_batch(2, true).unwrap();
        assert_eq!((b.frames, b.adv_credits), (2, 20));
        f.on_refill(5);
        // A later batch of the same message takes them only with credits used.
        let b = f.data_batch(1, false).unwrap();
        assert_eq!((b.frames, b.adv_credits), (1, 5));
        assert!(!f.give_back(0));
        assert_eq!(f.credits.send_credits(), 97);
    }

    // ---- randomized two-peer schedule ----------------------------------

    #[derive(Debug)]
    enum Kind {
        Data { seq: u64, last: bool, ack_required: bool },
        Ack,
    }

    #[derive(Debug)]
    struct Frame {
        ack: u64,
        credit: u8,
        kind: Kind,
    }

    struct Peer {
        fc: FlowControl,
        ring: u32,
        /// Receive buffers posted to the QP and not consumed.
        rx_posted: u32,
        /// Messages to send: (seq, fragments left, fragments total, ack_required).
        queue: VecDeque<(u64, u32, u32, bool)>,
        next_seq: u64,
        /// Sequences received complete, in order.
        delivered: Vec<u64>,
        frags_seen: u32,
        acked: u64,
    }

    impl Peer {
        fn new(ring: u32) -> Peer {
            let mut fc = FlowControl::new(true);
            fc.on_refill(ring);
            Peer {
                fc,
                ring,
                rx_posted: ring,
                queue: VecDeque::new(),
                next_seq: 1,
                delivered: Vec::new(),
                frags_seen: 0,
                acked: 0,
            }
        }

        fn enqueue(&mut self, frags: u32, ack_required: bool) {
            self.queue.push_back((self.next_seq, frags, frags, ack_required));
            self.next_seq += 1;
        }

        /// Posts as much of the head message as credits allow.
        fn send(&mut self, wire: &mut VecDeque<Frame>) -> bool {
            let Some(&(seq, left, total, ackreq)) = self.queue.front() else { return false };
            let Some(b) = self.fc.data_batch(left, left == total) else { return false };
            assert!(b.frames <= left);
            let mut credit = b.adv_credits;
            for i in 0..b.frames {
                let last = i + 1 == left;
                wire.push_back(Frame { ack: b.ack, credit, kind: Kind::Data { seq, last, ack_required: ackreq } });
                credit = 0;
            }
            if b.frames == left {
                self.queue.pop_front();
            } else {
                self.queue.front_mut().unwrap().1 -= b.frames;
            }
            true
        }

        fn attempt_ack(&mut self, wire: &mut VecDeque<Frame>) -> bool {
            match self.fc.attempt_ack() {
                Some(a) => {
                    wire.push_back(Frame { ack: a.ack, credit: a.credit, kind: Kind::Ack });
                    true
                }
                None => false,
            }
        }

        fn refill(&mut self, wire: &mut VecDeque<Frame>) -> bool {
            let n = self.ring - self.rx_posted;
            if n == 0 {
                return false;
            }
            self.rx_posted = self.ring;
            self.fc.on_refill(n);
            self.attempt_ack(wire);
            true
        }

        /// Receives one frame; returns whether it was an ack-only frame
        /// (whose sender's send completion then runs).
        fn receive(&mut self, f: Frame, wire_back: &mut VecDeque<Frame>) -> bool {
            assert!(self.rx_posted > 0, "receiver not ready (RNR): credits overran the ring");
            self.rx_posted -= 1;
            let (acked, _kick) = self.fc.on_frame(f.ack, f.credit);
            if let Some(a) = acked {
                assert!(a > self.acked);
                self.acked = a;
            }
            let is_ack = matches!(f.kind, Kind::Ack);
            if let Kind::Data { seq, last, ack_required } = f.kind {
                self.frags_seen += 1;
                if last {
                    let fl = if ack_required { flags::ACK_REQUIRED } else { 0 };
                    self.fc.acks.on_message(seq, fl);
                    self.delivered.push(seq);
                }
            }
            self.attempt_ack(wire_back);
            is_ack
        }
    }

    fn adv_in_flight(w: &VecDeque<Frame>) -> u32 {
        w.iter().map(|f| u32::from(f.credit)).sum()
    }

    /// Every posted receive buffer of `rx` is accounted for exactly once: as
    /// a send credit of the peer, as credits advertised in flight, as
    /// credits not advertised yet, or as a frame in flight towards it.
    fn check_conservation(tx: &Peer, rx: &Peer, to_rx: &VecDeque<Frame>, to_tx: &VecDeque<Frame>) {
        let c = &tx.fc.credits;
        assert!(c.send_credits() <= rx.ring && rx.fc.credits.posted_credits() <= rx.ring);
        assert_eq!(
            rx.rx_posted,
            c.send_credits() + adv_in_flight(to_tx) + rx.fc.credits.posted_credits() + to_rx.len() as u32,
            "credit conservation"
        );
    }

    #[test]
    fn randomized_schedules_conserve_credits_and_never_deadlock() {
        for seed in 1..=200u64 {
            let mut rng = Rng::new(seed);
            let ring_a = 17 + rng.below(48) as u32;
            let ring_b = 17 + rng.below(48) as u32;
            let mut a = Peer::new(ring_a);
            let mut b = Peer::new(ring_b);
            // Connection setup: each side advertises its posted buffers.
            let adv_a = a.fc.credits.take_initial_advertisement();
            let adv_b = b.fc.credits.take_initial_advertisement();
            assert!(a.fc.credits.set_flow_control(true, adv_b));
            assert!(b.fc.credits.set_flow_control(true, adv_a));
            let (mut ab, mut ba) = (VecDeque::<Frame>::new(), VecDeque::<Frame>::new());
            let msgs = 30 + rng.below(60);
            let max_frags = 1 + rng.below(40) as u32;
            let mut sent = (0u64, 0u64);
            for _ in 0..3000 {
                match rng.below(9) {
                    0 if sent.0 < msgs => {
                        sent.0 += 1;
                        a.enqueue(1 + rng.below(u64::from(max_frags)) as u32, rng.below(8) == 0 || sent.0 == msgs);
                    }
                    1 if sent.1 < msgs => {
                        sent.1 += 1;
                        b.enqueue(1 + rng.below(u64::from(max_frags)) as u32, rng.below(8) == 0 || sent.1 == msgs);
                    }
                    2 => {
                        a.send(&mut ab);
                    }
                    3 => {
                        b.send(&mut ba);
                    }
                    4 => {
                        if let Some(f) = ab.pop_front() {
                            if b.receive(f, &mut ba) {
                                a.fc.acks.send_complete();
                                a.attempt_ack(&mut ab);
                            }
                        }
                    }
                    5 => {
                        if let Some(f) = ba.pop_front() {
                            if a.receive(f, &mut ab) {
                                b.fc.acks.send_complete();
                                b.attempt_ack(&mut ba);
                            }
                        }
                    }
                    6 => {
                        a.refill(&mut ab);
                    }
                    7 => {
                        b.refill(&mut ba);
                    }
                    _ => {}
                }
                check_conservation(&a, &b, &ab, &ba);
                check_conservation(&b, &a, &ba, &ab);
            }
            // Finish the traffic, then drain: every step does whatever is
            // possible; progress must continue until everything is delivered.
            while sent.0 < msgs {
                sent.0 += 1;
                a.enqueue(1 + rng.below(u64::from(max_frags)) as u32, sent.0 == msgs);
            }
            while sent.1 < msgs {
                sent.1 += 1;
                b.enqueue(1 + rng.below(u64::from(max_frags)) as u32, sent.1 == msgs);
            }
            let mut steps = 0;
            loop {
                let mut progress = false;
                progress |= a.send(&mut ab);
                progress |= b.send(&mut ba);
                while let Some(f) = ab.pop_front() {
                    progress = true;
                    if b.receive(f, &mut ba) {
                        a.fc.acks.send_complete();
                        a.attempt_ack(&mut ab);
                    }
                    check_conservation(&a, &b, &ab, &ba);
                }
                while let Some(f) = ba.pop_front() {
                    progress = true;
                    if a.receive(f, &mut ab) {
                        b.fc.acks.send_complete();
                        b.attempt_ack(&mut ba);
                    }
                    check_conservation(&b, &a, &ba, &ab);
                }
                progress |= a.refill(&mut ab);
                progress |= b.refill(&mut ba);
                check_conservation(&a, &b, &ab, &ba);
                check_conservation(&b, &a, &ba, &ab);
                if !progress {
                    break;
                }
                steps += 1;
                assert!(steps < 100_000, "seed {seed}: no quiescence");
            }
            let all: Vec<u64> = (1..=msgs).collect();
            assert_eq!(a.queue.len() + b.queue.len(), 0, "seed {seed}: deadlock with data queued");
            assert_eq!(b.delivered, all, "seed {seed}: A->B delivery");
            assert_eq!(a.delivered, all, "seed {seed}: B->A delivery");
            // The last message of each side had ACK_REQUIRED: fully acked.
            assert_eq!((a.acked, b.acked), (msgs, msgs), "seed {seed}: final acks");
            assert!(!a.fc.acks.in_flight() && !b.fc.acks.in_flight());
        }
    }

    /// Receive flow control with credits: a receiver whose gate is closed
    /// reposts nothing, so a sender with 500 messages of 3 fragments queued
    /// stops after at most one ring (64 frames) with no RNR (`receive`
    /// asserts a posted buffer); the resume reposts and grants the held
    /// buffers, and every message arrives exactly once, in order, acked.
    #[test]
    fn paused_receiver_stops_a_credit_sender_after_one_ring_and_resumes() {
        const RING: u32 = 64;
        let mut a = Peer::new(RING);
        let mut b = Peer::new(RING);
        let adv_a = a.fc.credits.take_initial_advertisement();
        let adv_b = b.fc.credits.take_initial_advertisement();
        assert!(a.fc.credits.set_flow_control(true, adv_b));
        assert!(b.fc.credits.set_flow_control(true, adv_a));
        for k in 0..500 {
            a.enqueue(3, k == 499);
        }
        let mut gate = RxGate::default();
        assert!(gate.set(true).is_empty());
        let (mut ab, mut ba) = (VecDeque::<Frame>::new(), VecDeque::<Frame>::new());
        let mut next_buf = 0usize;
        // Runs until nothing moves; b reposts only what the gate lets go.
        let mut run =
            |a: &mut Peer, b: &mut Peer, gate: &mut RxGate, ab: &mut VecDeque<Frame>, ba: &mut VecDeque<Frame>| {
                for step in 0.. {
                    assert!(step < 100_000, "no quiescence");
                    let mut progress = a.send(ab);
                    while let Some(f) = ab.pop_front() {
                        progress = true;
                        if b.receive(f, ba) {
                            a.fc.acks.send_complete();
                            a.attempt_ack(ab);
                        }
                        next_buf += 1;
                        if gate.completed(next_buf % RING as usize) {
                            b.rx_posted += 1;
                            b.fc.on_refill(1);
                            b.attempt_ack(ba);
                        }
                    }
                    while let Some(f) = ba.pop_front() {
                        progress = true;
                        if a.receive(f, ab) {
                            b.fc.acks.send_complete();
                            b.attempt_ack(ba);
                        }
                    }
                    progress |= a.refill(ab);
                    if !progress {
                        break;
                    }
                }
            };
        run(&mut a, &mut b, &mut gate, &mut ab, &mut ba);
        // Stopped by credits: b took at most its ring, holds every buffer
        // it consumed, and a still has most of its messages queued.
        assert!(b.frags_seen <= RING, "frames received while paused: {}", b.frags_seen);
        assert!(b.frags_seen >= RING - 2, "the sender used its credits: {}", b.frags_seen);
        assert_eq!(gate.held(), b.frags_seen as usize);
        assert_eq!(b.rx_posted, RING - b.frags_seen);
        assert_eq!(b.delivered, (1..=u64::from(b.frags_seen / 3)).collect::<Vec<_>>());
        assert!(a.queue.len() >= 500 - 22, "queued: {}", a.queue.len());
        assert!(a.fc.credits.send_full() || a.fc.credits.send_credits() <= 1);
        assert_eq!((gate.pauses, gate.peak), (1, b.frags_seen as usize));
        // Still nothing moves while paused.
        let seen = b.frags_seen;
        run(&mut a, &mut b, &mut gate, &mut ab, &mut ba);
        assert_eq!(b.frags_seen, seen);
        // Resume: the held buffers are reposted and granted.
        let bufs = gate.set(false);
        assert_eq!(bufs.len(), seen as usize);
        b.rx_posted += bufs.len() as u32;
        b.fc.on_refill(bufs.len() as u32);
        b.attempt_ack(&mut ba);
        run(&mut a, &mut b, &mut gate, &mut ab, &mut ba);
        assert_eq!(b.delivered, (1..=500).collect::<Vec<_>>(), "every message once, in order");
        assert_eq!(b.frags_seen, 1500);
        assert!(a.queue.is_empty());
        assert_eq!(a.acked, 500, "the last message had ACK_REQUIRED: all acked");
        assert_eq!((gate.held(), gate.pauses), (0, 1));
    }
}
