//! The sans-IO pieces of rds-ib used together the way the transport does:
//! the CM private data negotiates version and flow control, messages are
//! fragmented under credit control, frames cross a simulated in-order RC
//! channel into bounded receive rings, are reassembled, and acks flow back.
//! Checks content, order and counts of what is delivered and acked.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use rds_core::types::Rng;
use rds_core::wire::{self, Header, MAX_MSG_SIZE, PROTOCOL_3_1, PROTOCOL_4_1};
use rds_ib::credits::FlowControl;
use rds_ib::frag::{OutMessage, Reassembler, RxKind, SignalState, ack_only_header, frag_count};
use rds_ib::private::{
    ActiveNegotiation, ConnectPrivate, Family, PrivAddrs, RejectAction, passive_negotiate, reject_data,
};

/// One frame on the simulated channel: header and payload bytes.
type WireFrame = Vec<u8>;

struct Peer {
    fc: FlowControl,
    sig: SignalState,
    rx: Reassembler,
    ring: u32,
    rx_posted: u32,
    /// Messages waiting: the message state and its payload.
    queue: VecDeque<(OutMessage, Vec<u8>)>,
    next_seq: u64,
    received: Vec<(Header, Vec<u8>)>,
    acked: u64,
    ack_frames_sent: u64,
}

impl Peer {
    fn new(ring: u32, flowctl: bool) -> Peer {
        let mut fc = FlowControl::new(flowctl);
        fc.on_refill(ring);
        Peer {
            fc,
            sig: SignalState::new(4),
            rx: Reassembler::default(),
            ring,
            rx_posted: ring,
            queue: VecDeque::new(),
            next_seq: 1,
            received: Vec::new(),
            acked: 0,
            ack_frames_sent: 0,
        }
    }

    fn enqueue(&mut self, payload: Vec<u8>, ack_required: bool) -> Header {
        let mut h = Header::data(2000 + (self.next_seq % 3) as u16, 3000, payload.len() as u32);
        h.sequence = self.next_seq;
        self.next_seq += 1;
        let m = OutMessage::new(h, payload.len(), ack_required).unwrap();
        self.queue.push_back((m, payload));
        h
    }

    fn send(&mut self, wire: &mut VecDeque<WireFrame>) -> bool {
        let Some((m, payload)) = self.queue.front_mut() else { return false };
        let wanted = m.remaining() as u32;
        let Some(b) = self.fc.data_batch(wanted, m.is_fresh()) else { return false };
        let mut frames = Vec::new();
        let n = m.next_batch(b.frames as usize, b.ack, b.adv_credits, &mut self.sig, &mut frames);
        assert_eq!(n as u32, b.frames);
        for f in frames {
            let mut w = f.header.to_vec();
            w.extend_from_slice(&payload[f.payload]);
            wire.push_back(w);
        }
        if m.is_done() {
            self.queue.pop_front();
        }
        true
    }

    fn attempt_ack(&mut self, wire: &mut VecDeque<WireFrame>) {
        if let Some(a) = self.fc.attempt_ack() {
            self.ack_frames_sent += 1;
            wire.push_back(ack_only_header(a.ack, a.credit).to_vec());
        }
    }

    /// Returns whether the frame was an ack-only frame.
    /// `sender_limited`: the sender's sends are credit-limited, so a receive
    /// must be posted for every frame (no RNR).
    fn receive(&mut self, frame: &[u8], back: &mut VecDeque<WireFrame>, sender_limited: bool) -> bool {
        if sender_limited {
            assert!(self.rx_posted > 0, "frame arrived with no receive posted");
        }
        self.rx_posted = self.rx_posted.saturating_sub(1);
        let got = self.rx.on_frame(frame).expect("valid frame");
        let (acked, _kick) = self.fc.on_frame(got.ack, got.credit);
        if let Some(a) = acked {
            self.acked = a;
        }
        let is_ack = got.kind == RxKind::AckOnly;
        if let RxKind::Message { header, payload } = got.kind {
            self.fc.acks.on_message(header.sequence, header.flags);
            self.received.push((header, payload));
        }
        self.attempt_ack(back);
        is_ack
    }

    fn refill(&mut self, wire: &mut VecDeque<WireFrame>) -> bool {
        let n = self.ring - self.rx_posted;
        self.rx_posted = self.ring;
        if n > 0 {
            self.fc.on_refill(n);
            self.attempt_ack(wire);
        }
        n > 0
    }
}

/// Connection setup through encoded private data. Both sides post their
/// receive rings first. `flowctl` is each side's local setting; a
/// `kernel_like` passive side counts its posted receives only after the
/// negotiation (the kernel fills its ring when the connection completes), so
/// it advertises 0 initial credits and flow control ends up off.
fn connect(ring_a: u32, ring_b: u32, flowctl: bool, kernel_like: bool) -> (Peer, Peer, u16) {
    let mut a = Peer::new(ring_a, flowctl);
    let mut b = Peer::new(ring_b, false);
    let addrs = PrivAddrs::V4 { saddr: Ipv4Addr::new(10, 9, 0, 1), daddr: Ipv4Addr::new(10, 9, 0, 2) };
    let mut neg = ActiveNegotiation::new();
    let credit_a = a.fc.credits.take_initial_advertisement();
    assert_eq!(credit_a, if flowctl { ring_a } else { 0 });
    let req = neg.request(addrs, 0, 0, credit_a).encode();
    // Passive side.
    let version = passive_negotiate(&req, Family::V4).unwrap();
    let dp = ConnectPrivate::decode(&req, Family::V4).unwrap();
    b.fc.credits.set_flow_control(flowctl, dp.credit);
    let b_adv = if kernel_like {
        0
    } else {
        // Our receives were posted before accepting: count them now.
        b.fc.on_refill(ring_b);
        b.fc.acks = Default::default();
        b.fc.credits.take_initial_advertisement()
    };
    let rep_addrs = PrivAddrs::V4 { saddr: Ipv4Addr::new(10, 9, 0, 2), daddr: Ipv4Addr::new(10, 9, 0, 1) };
    let rep = ConnectPrivate::new(rep_addrs, version, 0, 0, b_adv).encode();
    // Active side.
    let est = neg.on_established(&rep, Family::V4).unwrap();
    assert_eq!(est.version, version);
    a.fc.credits.set_flow_control(flowctl, est.peer_credit);
    if kernel_like {
        // The kernel-like peer posts (uncounted) receives now.
        b.fc.on_refill(ring_b);
    }
    (a, b, version)
}

fn run(seed: u64, flowctl: bool, kernel_like: bool) {
    let mut rng = Rng::new(seed);
    let ring_a = 17 + rng.below(40) as u32;
    let ring_b = 17 + rng.below(40) as u32;
    let (mut a, mut b, version) = connect(ring_a, ring_b, flowctl, kernel_like);
    assert_eq!(version, PROTOCOL_4_1);
    let on = flowctl && !kernel_like;
    assert_eq!(a.fc.credits.flow_control(), on);
    // A kernel-like passive side limits its sends by our initial credits
    // even though it answered 0; we keep granting credits to it.
    assert_eq!(b.fc.credits.flow_control(), flowctl);
    assert_eq!(a.fc.credits.advertising(), flowctl);
    if flowctl {
        assert_eq!(b.fc.credits.send_credits(), ring_a);
    }
    if on {
        assert_eq!(a.fc.credits.send_credits(), ring_b);
    }
    let (mut ab, mut ba) = (VecDeque::new(), VecDeque::new());
    let sizes = [0usize, 1, 4095, 4096, 4097, 3 * 4096 + 5, MAX_MSG_SIZE];
    let mut expect_b = Vec::new();
    let mut expect_a = Vec::new();
    let n = 40;
    for i in 0..n {
        let len = if i < sizes.len() as u64 { sizes[i as usize] } else { rng.below(20_000) as usize };
        let p: Vec<u8> = (0..len).map(|k| (k as u64 ^ seed ^ i) as u8).collect();
        let h = a.enqueue(p.clone(), i + 1 == n || rng.below(8) == 0);
        expect_b.push((h.sequence, p));
        let len = rng.below(9000) as usize;
        let p: Vec<u8> = (0..len).map(|k| (k as u64 * 7 + i) as u8).collect();
        let h = b.enqueue(p.clone(), i + 1 == n);
        expect_a.push((h.sequence, p));
    }
    let mut steps = 0;
    loop {
        let mut progress = false;
        match rng.below(4) {
            0 => progress |= a.send(&mut ab),
            1 => progress |= b.send(&mut ba),
            _ => {}
        }
        for _ in 0..rng.below(4) {
            if let Some(f) = ab.pop_front() {
                progress = true;
                if b.receive(&f, &mut ba, a.fc.credits.flow_control()) {
                    a.fc.acks.send_complete();
                    a.attempt_ack(&mut ab);
                }
            }
            if let Some(f) = ba.pop_front() {
                progress = true;
                if a.receive(&f, &mut ab, b.fc.credits.flow_control()) {
                    b.fc.acks.send_complete();
                    b.attempt_ack(&mut ba);
                }
            }
        }
        progress |= a.refill(&mut ab);
        progress |= b.refill(&mut ba);
        let idle = a.queue.is_empty() && b.queue.is_empty() && ab.is_empty() && ba.is_empty();
        if idle && !progress {
            break;
        }
        steps += 1;
        assert!(steps < 200_000, "seed {seed}: stalled");
    }
    let got_b: Vec<(u64, Vec<u8>)> = b.received.iter().map(|(h, p)| (h.sequence, p.clone())).collect();
    let got_a: Vec<(u64, Vec<u8>)> = a.received.iter().map(|(h, p)| (h.sequence, p.clone())).collect();
    assert!(got_b == expect_b, "seed {seed}: A->B content or order");
    assert!(got_a == expect_a, "seed {seed}: B->A content or order");
    assert_eq!((a.acked, b.acked), (n, n), "seed {seed}: everything acked");
    let frames: u64 = expect_b.iter().map(|(_, p)| frag_count(p.len()) as u64).sum();
    assert_eq!(b.rx.counters().total_frags, frames);
    assert_eq!(b.rx.counters().total_incs, n);
    assert_eq!(b.rx.counters().ack_received, a.ack_frames_sent);
    assert!(a.rx.is_idle() && b.rx.is_idle());
}

#[test]
fn full_pipeline_without_flow_control() {
    for seed in 0..6 {
        run(seed * 7919, false, false);
    }
}

#[test]
fn full_pipeline_with_flow_control() {
    // Receive rings of 17..56 buffers against 1 MiB messages (256 frames):
    // every message needs many credit round trips.
    for seed in 0..6 {
        run(seed * 104_729 + 3, true, false);
    }
}

#[test]
fn kernel_like_passive_peer_keeps_getting_credits() {
    for seed in 0..3 {
        run(seed * 31 + 11, true, true);
    }
}

#[test]
fn reject_then_compat_version() {
    // A 3.1-only passive peer rejects 4.1 with value 1; the active side
    // retries with 3.1 and the peer accepts it.
    let addrs = PrivAddrs::V4 { saddr: Ipv4Addr::new(10, 9, 0, 1), daddr: Ipv4Addr::new(10, 9, 0, 2) };
    let mut neg = ActiveNegotiation::new();
    let req = neg.request(addrs, 0, 0, 0).encode();
    assert_eq!(req[8..12], [4, 1, 0, 3]);
    let old_peer = |data: &[u8]| {
        let dp = ConnectPrivate::decode(data, Family::V4).unwrap();
        if dp.version() == PROTOCOL_3_1 { Ok(PROTOCOL_3_1) } else { Err(reject_data(1)) }
    };
    let rej = old_peer(&req).unwrap_err();
    assert_eq!(neg.on_reject(Some(&rej), 0), RejectAction::Drop { fallback: true });
    let req = neg.request(addrs, 0, 0, 0).encode();
    assert_eq!(passive_negotiate(&req, Family::V4), Ok(PROTOCOL_3_1));
    let v = old_peer(&req).unwrap();
    let rep = ConnectPrivate::new(addrs, v, 0, 0, 0).encode();
    assert_eq!(neg.on_established(&rep, Family::V4).unwrap().version, PROTOCOL_3_1);
    // Headers still verify under the same checksum on either version.
    assert!(wire::verify_checksum(&ack_only_header(1, 0)));
}
