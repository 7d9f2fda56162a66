//! Unit tests of `credits.rs`.

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
