//! Unit tests of `frag.rs`.

use super::*;
use rds_core::types::Rng;
use rds_core::wire::{Ext, flags};

/// `n` > 0 as a `usize` bound of the property loops.
fn below(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

fn message(seq: u64, len: usize) -> (Header, Vec<u8>) {
    let mut h = Header::data(4000 + (seq % 7) as u16, 5000, len as u32);
    h.sequence = seq;
    let payload = (0..len).map(|i| (i as u64 * 31 + seq) as u8).collect();
    (h, payload)
}

/// Every frame of a message, as bytes on the wire, all in one batch.
fn frames_of(h: Header, payload: &[u8], ack_required: bool, ack: u64) -> (Vec<Vec<u8>>, Vec<OutFrame>) {
    let mut m = OutMessage::new(h, payload.len(), ack_required).unwrap();
    let mut out = Vec::new();
    let mut sig = SignalState::default();
    let n = m.next_batch(usize::MAX, ack, 0, &mut sig, &mut out);
    assert_eq!(n, frag_count(payload.len()));
    assert!(m.is_done());
    let wire = out
        .iter()
        .map(|f| {
            let mut v = f.header.to_vec();
            v.extend_from_slice(&payload[f.payload.clone()]);
            v
        })
        .collect();
    (wire, out)
}

#[test]
fn frame_counts_and_boundaries() {
    for (len, n) in [(0, 1), (1, 1), (4095, 1), (4096, 1), (4097, 2), (8192, 2), (MAX_MSG_SIZE, 256)] {
        assert_eq!(frag_count(len), n, "len {len}");
        let (h, p) = message(9, len);
        let (_, out) = frames_of(h, &p, false, 0);
        assert_eq!(out.len(), n);
        // The ranges tile the payload exactly.
        let mut at = 0;
        for f in &out {
            assert_eq!(f.payload.start, at);
            assert!(f.payload.len() <= FRAG_SIZE);
            at = f.payload.end;
        }
        assert_eq!(at, len);
    }
}

#[test]
fn every_frame_is_a_checksummed_header_copy() {
    let (mut h, p) = message(77, 3 * FRAG_SIZE + 10);
    h.flags |= flags::RETRANSMITTED;
    h.push_extension(Ext::RdmaDest { rkey: 5, offset: 6 }).unwrap();
    let mut m = OutMessage::new(h, p.len(), true).unwrap();
    let mut sig = SignalState::new(16);
    let mut out = Vec::new();
    // Two batches: 3 frames with 9 credits advertised, then the last with ack 12.
    assert_eq!(m.next_batch(3, 11, 9, &mut sig, &mut out), 3);
    assert_eq!(m.remaining(), 1);
    assert_eq!(m.next_batch(5, 12, 0, &mut sig, &mut out), 1);
    assert!(m.is_done());
    for (i, f) in out.iter().enumerate() {
        assert!(wire::verify_checksum(&f.header));
        assert_ne!(f.header[30..32], [0, 0], "checksum filled in");
        let fh = Header::from_bytes(&f.header);
        assert_eq!(fh.sequence, 77);
        assert_eq!(fh.len, p.len() as u32);
        assert_eq!((fh.sport, fh.dport), (h.sport, h.dport));
        assert_eq!(fh.flags, flags::RETRANSMITTED | flags::ACK_REQUIRED);
        assert_eq!(fh.exthdr, h.exthdr);
        assert_eq!(fh.ack, if i < 3 { 11 } else { 12 });
        assert_eq!(fh.credit, if i == 0 { 9 } else { 0 });
        assert_eq!(f.index, i);
    }
    // The batch cut short by credits ends signaled and solicited; the
    // message's last frame is solicited and signaled.
    let flags_of: Vec<(bool, bool, bool)> = out.iter().map(|f| (f.signaled, f.solicited, f.last)).collect();
    assert_eq!(flags_of, [(false, false, false), (false, false, false), (true, true, false), (true, true, true)]);
}

#[test]
fn zero_byte_message_is_one_frame() {
    let (h, p) = message(3, 0);
    let (wire, out) = frames_of(h, &p, false, 2);
    assert_eq!(out.len(), 1);
    assert_eq!(wire[0].len(), HEADER_LEN);
    assert!(out[0].last && out[0].solicited && out[0].signaled);
    let mut r = Reassembler::default();
    let got = r.on_frame(&wire[0]).unwrap();
    assert_eq!(got.ack, 2);
    assert_eq!(got.kind, RxKind::Message { header: Header::from_bytes(&out[0].header), payload: vec![] });
}

#[test]
fn signaling_every_max_plus_one_and_on_last() {
    for max in [0u32, 1, 3, 16] {
        let mut sig = SignalState::new(max);
        let (h, p) = message(1, 40 * FRAG_SIZE);
        let mut m = OutMessage::new(h, p.len(), false).unwrap();
        let mut out = Vec::new();
        m.next_batch(usize::MAX, 0, 0, &mut sig, &mut out);
        for (i, f) in out.iter().enumerate() {
            let paced = (i as u32 + 1) % (max + 1) == 0;
            assert_eq!(f.signaled, paced || f.last, "max {max} frame {i}");
            assert_eq!(f.solicited, f.last);
        }
        // After a forced signal the count restarts.
        let (h2, p2) = message(2, 0);
        let mut m2 = OutMessage::new(h2, p2.len(), false).unwrap();
        out.clear();
        m2.next_batch(1, 0, 0, &mut sig, &mut out);
        assert!(out[0].signaled);
        let mut next = Vec::new();
        for _ in 0..=max {
            next.push(sig.next(false));
        }
        let mut expect = vec![false; max as usize];
        expect.push(true);
        assert_eq!(next, expect, "max {max}");
    }
}

#[test]
fn congestion_map_never_gets_ack_required() {
    let h = Header::cong_map();
    let m = OutMessage::new(h, wire::CONG_MAP_BYTES, true).unwrap();
    assert_eq!(m.header().flags, flags::CONG_BITMAP);
    assert_eq!(m.frag_count(), 2);
    let d = Header::data(1, 2, 0);
    assert_eq!(OutMessage::new(d, 0, true).unwrap().header().flags, flags::ACK_REQUIRED);
}

#[test]
fn outgoing_length_errors() {
    let (h, _) = message(1, 10);
    assert_eq!(OutMessage::new(h, 11, false).unwrap_err(), FragError::LenMismatch { h_len: 10, payload: 11 });
    let big = Header::data(1, 2, MAX_MSG_SIZE as u32 + 1);
    assert_eq!(
        OutMessage::new(big, MAX_MSG_SIZE + 1, false).unwrap_err(),
        FragError::TooLong { len: MAX_MSG_SIZE + 1 }
    );
}

#[test]
fn ack_only_frame_layout() {
    let b = ack_only_header(0x0102_0304_0506_0708, 200);
    assert_eq!(b[0..8], [0; 8]);
    assert_eq!(b[8..16], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(b[16..25], [0; 9], "len, ports, flags");
    assert_eq!(b[25], 200);
    assert_eq!(b[32..48], [0; 16]);
    assert!(wire::verify_checksum(&b));
    let mut r = Reassembler::default();
    assert_eq!(r.on_frame(&b), Ok(RxFrame { ack: 0x0102_0304_0506_0708, credit: 200, kind: RxKind::AckOnly }));
    assert_eq!(r.counters().ack_received, 1);
}

#[test]
fn round_trips_at_the_boundaries() {
    let mut r = Reassembler::default();
    let sizes = [0, 1, 4095, 4096, 4097, 2 * FRAG_SIZE - 1, 2 * FRAG_SIZE + 1, MAX_MSG_SIZE - 1, MAX_MSG_SIZE];
    for (i, &len) in sizes.iter().enumerate() {
        let (h, p) = message(i as u64 + 1, len);
        let (wire, _) = frames_of(h, &p, i % 2 == 0, i as u64);
        let n = wire.len();
        for (k, w) in wire.iter().enumerate() {
            let got = r.on_frame(w).unwrap();
            assert_eq!(got.ack, i as u64);
            if k + 1 < n {
                assert_eq!(got.kind, RxKind::Partial);
                assert_eq!(r.remaining(), len - (k + 1) * FRAG_SIZE);
            } else {
                let RxKind::Message { header, payload } = got.kind else { panic!("len {len}: no message") };
                assert_eq!(header.sequence, h.sequence);
                assert_eq!(header.len as usize, len);
                assert_eq!(header.flags & flags::ACK_REQUIRED != 0, i % 2 == 0);
                assert!(payload == p, "len {len}: payload differs");
                assert!(payload.capacity() <= len.max(1), "never more than h_len allocated");
            }
        }
        assert!(r.is_idle());
    }
    let c = r.counters();
    assert_eq!(c.total_incs, sizes.len() as u64);
    assert_eq!(c.total_frags, sizes.iter().map(|&l| frag_count(l) as u64).sum::<u64>());
}

#[test]
fn ack_frames_may_interleave_fragments() {
    let (h, p) = message(5, 3 * FRAG_SIZE);
    let (wire, _) = frames_of(h, &p, false, 0);
    let mut r = Reassembler::default();
    assert_eq!(r.on_frame(&wire[0]).unwrap().kind, RxKind::Partial);
    assert_eq!(r.on_frame(&ack_only_header(4, 3)).unwrap(), RxFrame { ack: 4, credit: 3, kind: RxKind::AckOnly });
    assert_eq!(r.on_frame(&wire[1]).unwrap().kind, RxKind::Partial);
    assert!(matches!(r.on_frame(&wire[2]).unwrap().kind, RxKind::Message { .. }));
}

#[test]
fn oversized_first_fragment_is_refused_before_buffering() {
    let mut h = Header::data(1, 2, MAX_MSG_SIZE as u32 + 1);
    h.sequence = 1;
    let mut f = h.to_bytes_checksummed().to_vec();
    f.extend_from_slice(&[0u8; FRAG_SIZE]);
    let mut r = Reassembler::default();
    assert_eq!(r.on_frame(&f), Err(RecvError::TooLong { len: MAX_MSG_SIZE as u32 + 1, max: MAX_MSG_SIZE as u32 }));
    assert!(r.is_idle());
    // u32::MAX too, and a small configured limit.
    let mut r = Reassembler::new(8192);
    let h = Header::data(1, 2, 8193);
    assert!(matches!(r.on_frame(&h.to_bytes_checksummed()), Err(RecvError::TooLong { .. })));
    let h = Header::data(1, 2, u32::MAX);
    assert!(matches!(r.on_frame(&h.to_bytes_checksummed()), Err(RecvError::TooLong { .. })));
}

#[test]
fn corrupted_missing_reordered_and_mixed_fragments_are_refused() {
    let mut rng = Rng::new(0x1234_5678_9abc_def1);
    for round in 0..600u64 {
        // 3..=8 fragments, the last one strictly shorter than 4 KiB, so
        // that a reordered last fragment is detectable. (Reordering two
        // full fragments of one message is not: their headers are equal
        // by design, and RC delivers in order.)
        let nfr = 3 + below(&mut rng, 6);
        let len = (nfr - 1) * FRAG_SIZE + 1 + below(&mut rng, FRAG_SIZE - 1);
        let (h, p) = message(100 + round, len);
        let (wire, _) = frames_of(h, &p, false, 0);
        assert_eq!(wire.len(), nfr);
        let mut r = Reassembler::default();
        let case = round % 6;
        let err = match case {
            0 => {
                // A flipped bit anywhere in one header: bad checksum.
                let k = below(&mut rng, nfr);
                let mut w = wire[k].clone();
                let bit = below(&mut rng, HEADER_LEN * 8);
                w[bit / 8] ^= 1 << (bit % 8);
                if w[30] == 0 && w[31] == 0 {
                    // A zero checksum means "not checksummed": corrupt elsewhere.
                    w[bit / 8] ^= 1 << (bit % 8);
                    w[0] ^= 1;
                }
                for f in &wire[..k] {
                    assert_eq!(r.on_frame(f).unwrap().kind, RxKind::Partial);
                }
                r.on_frame(&w).unwrap_err()
            }
            1 => {
                // A missing fragment: refused at the short last fragment, or
                // (last one missing) when the next message begins.
                let k = 1 + below(&mut rng, nfr - 1);
                let mut first_err = None;
                for (i, f) in wire.iter().enumerate().filter(|(i, _)| *i != k) {
                    match r.on_frame(f) {
                        Ok(x) => assert_eq!(x.kind, RxKind::Partial),
                        Err(e) => {
                            assert!(i > k);
                            first_err = Some(e);
                            break;
                        }
                    }
                }
                match first_err {
                    Some(e) => e,
                    None => {
                        let (h2, p2) = message(1 << 40, 10);
                        let (w2, _) = frames_of(h2, &p2, false, 0);
                        r.on_frame(&w2[0]).unwrap_err()
                    }
                }
            }
            2 => {
                // Reordered: the last fragment overtakes a middle one.
                let k = 1 + below(&mut rng, nfr - 2);
                for f in &wire[..k] {
                    r.on_frame(f).unwrap();
                }
                r.on_frame(&wire[nfr - 1]).unwrap_err()
            }
            3 => {
                // A fragment of another message in the middle.
                let (h2, p2) = message(5000 + round, len);
                let (w2, _) = frames_of(h2, &p2, false, 0);
                r.on_frame(&wire[0]).unwrap();
                r.on_frame(&w2[1]).unwrap_err()
            }
            4 => {
                // A truncated frame (no header, or a short payload).
                let k = below(&mut rng, nfr);
                for f in &wire[..k] {
                    r.on_frame(f).unwrap();
                }
                let cut = below(&mut rng, wire[k].len());
                r.on_frame(&wire[k][..cut]).unwrap_err()
            }
            _ => {
                // Same sequence, different port or length.
                r.on_frame(&wire[0]).unwrap();
                let mut hb = [0u8; HEADER_LEN];
                hb.copy_from_slice(&wire[1][..HEADER_LEN]);
                let mut h2 = Header::from_bytes(&hb);
                if below(&mut rng, 2) == 0 {
                    h2.dport ^= 1;
                } else {
                    h2.len += 1;
                }
                let mut w = h2.to_bytes_checksummed().to_vec();
                w.extend_from_slice(&wire[1][HEADER_LEN..]);
                r.on_frame(&w).unwrap_err()
            }
        };
        match case {
            0 => assert_eq!(err, RecvError::BadChecksum),
            2 => assert!(matches!(err, RecvError::FragLen { expected: FRAG_SIZE, .. }), "{err:?}"),
            3 | 5 => assert!(matches!(err, RecvError::Mismatch { .. }), "{err:?}"),
            4 => assert!(matches!(err, RecvError::NoHeader { .. } | RecvError::FragLen { .. }), "{err:?}"),
            _ => assert!(matches!(err, RecvError::FragLen { .. } | RecvError::Mismatch { .. }), "{err:?}"),
        }
        assert!(r.is_idle(), "round {round}: partial message dropped after an error");
        assert_eq!(r.counters().total_incs, 0, "round {round}: no message completed");
        assert_eq!(r.counters().protocol_errors + r.counters().bad_checksum, 1);
    }
}

#[test]
fn random_frames_never_panic() {
    let mut rng = Rng::new(42);
    let mut r = Reassembler::new(3 * FRAG_SIZE as u32);
    for _ in 0..20_000 {
        let len = below(&mut rng, HEADER_LEN + FRAG_SIZE + 2);
        let mut f: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if len >= HEADER_LEN && below(&mut rng, 2) == 0 {
            // Make the checksum valid (or zero) so the deeper checks run.
            f[30] = 0;
            f[31] = 0;
            if below(&mut rng, 2) == 0 {
                let mut hb = [0u8; HEADER_LEN];
                hb.copy_from_slice(&f[..HEADER_LEN]);
                let c = wire::checksum(&hb);
                f[30..32].copy_from_slice(&c.to_be_bytes());
            }
        }
        let _ = r.on_frame(&f);
        assert!(r.remaining() <= 3 * FRAG_SIZE);
    }
}
