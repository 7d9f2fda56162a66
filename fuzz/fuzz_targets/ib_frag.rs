//! rds-ib's fragment reassembler (`Reassembler::on_frame` / `on_parts`) fed
//! arbitrary sequences of frames on one connection: genuine fragments of
//! messages built by `OutMessage` (sent in batches, with acks and credits),
//! delivered in order or lost, duplicated, truncated, corrupted (with the
//! checksum fixed or not), interleaved with ack-only frames, frames of
//! other messages and raw bytes.
//!
//! Checked against a reference written here from the module's rules: every
//! frame gets exactly the reference's answer (ack-only, partial, the
//! complete message with the first fragment's header and the payload
//! assembled, or the typed error, after which no partial message is kept);
//! a message is delivered only from fragments that all match its first one
//! and tile its `h_len` exactly; the bytes held never exceed the limit and
//! no buffer grows beyond `h_len`; the counters count what happened. The
//! `h_ack` / `h_credit` of every valid frame go to a `FlowControl` as the
//! receive handler does: credits stay within 16 bits, acks only advance.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rds_core::wire::{self, HEADER_LEN, Header, MAX_MSG_SIZE};
use rds_fuzz::{Counting, Input, peak_during};
use rds_ib::credits::{FlowControl, MAX_CREDITS};
use rds_ib::frag::{
    FRAG_SIZE, OutMessage, Reassembler, RecvError, RxCounters, RxFrame, RxKind, SignalState, ack_only_header,
    frag_count,
};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes of frames fed per input at most (keeps each run short).
const BUDGET: usize = 3 << 20;

/// The reassembly rules of frag.rs's module docs, kept simple.
struct Model {
    max: u32,
    cur: Option<(Header, Vec<u8>)>,
    counters: RxCounters,
}

impl Model {
    fn frame(&mut self, f: &[u8]) -> Result<RxFrame, RecvError> {
        let Some((hdr, payload)) = f.split_first_chunk::<HEADER_LEN>() else {
            return self.fail(RecvError::NoHeader { byte_len: f.len() });
        };
        if !wire::verify_checksum(hdr) {
            self.cur = None;
            self.counters.bad_checksum += 1;
            return Err(RecvError::BadChecksum);
        }
        let h = Header::from_bytes(hdr);
        if h.sport == 0 && h.dport == 0 && payload.is_empty() {
            self.counters.ack_received += 1;
            return Ok(RxFrame { ack: h.ack, credit: h.credit, kind: RxKind::AckOnly });
        }
        let (first, mut buf) = match self.cur.take() {
            None if h.len > self.max => return self.fail(RecvError::TooLong { len: h.len, max: self.max }),
            None => (h, Vec::new()),
            Some((first, buf)) => {
                if (first.sequence, first.len, first.sport, first.dport) != (h.sequence, h.len, h.sport, h.dport) {
                    return self.fail(RecvError::Mismatch { expected_seq: first.sequence, got_seq: h.sequence });
                }
                (first, buf)
            }
        };
        let due = (first.len as usize - buf.len()).min(FRAG_SIZE);
        if payload.len() != due {
            return self.fail(RecvError::FragLen { expected: due, got: payload.len() });
        }
        buf.extend_from_slice(payload);
        self.counters.total_frags += 1;
        if buf.len() == first.len as usize {
            self.counters.total_incs += 1;
            Ok(RxFrame { ack: h.ack, credit: h.credit, kind: RxKind::Message { header: first, payload: buf } })
        } else {
            self.cur = Some((first, buf));
            Ok(RxFrame { ack: h.ack, credit: h.credit, kind: RxKind::Partial })
        }
    }

    fn fail(&mut self, e: RecvError) -> Result<RxFrame, RecvError> {
        self.cur = None;
        self.counters.protocol_errors += 1;
        Err(e)
    }

    fn remaining(&self) -> usize {
        self.cur.as_ref().map_or(0, |(h, b)| h.len as usize - b.len())
    }
}

/// A message being sent: its frames as bytes on the wire.
struct Sending {
    frames: Vec<Vec<u8>>,
    next: usize,
}

fn build(inp: &mut Input, signal: &mut SignalState) -> Sending {
    let sel = inp.u8();
    // Mostly small messages (fast runs); 1 MiB ones now and then.
    let len = match sel % 16 {
        0 | 1 => 0,
        2 | 3 => usize::from(inp.u8()) + 1,
        4 => FRAG_SIZE - 1,
        5 => FRAG_SIZE,
        6 => FRAG_SIZE + 1,
        7 => 2 * FRAG_SIZE,
        8..=13 => usize::from(inp.u16()) % (5 * FRAG_SIZE),
        14 => MAX_MSG_SIZE - usize::from(inp.u8()),
        _ => MAX_MSG_SIZE + 1 + usize::from(inp.u8()),
    };
    let mut h = Header::data(u16::from(inp.u8() % 4), u16::from(inp.u8() % 4), len as u32);
    h.sequence = u64::from(inp.u8() % 8);
    h.flags = inp.u8() & 0x0f;
    h.exthdr[..4].copy_from_slice(&inp.array::<4>());
    let fill = inp.u8();
    let payload: Vec<u8> = (0..len).map(|i| fill ^ (i as u8) ^ ((i >> 8) as u8)).collect();
    let mut frames = Vec::new();
    match OutMessage::new(h, len, sel & 0x80 != 0) {
        Ok(mut m) => {
            let mut out = Vec::new();
            while !m.is_done() {
                // Batches as credits allow, each with its own ack and credits.
                let granted = usize::from(inp.u8() % 8) + 1;
                let before = out.len();
                let n = m.next_batch(granted, inp.u64() % 16, inp.u8(), signal, &mut out);
                assert_eq!(n, out.len() - before);
                assert!(n >= 1 && n <= granted);
            }
            assert_eq!(out.len(), frag_count(len));
            assert!(out.last().unwrap().last && out.last().unwrap().solicited && out.last().unwrap().signaled);
            for f in &out {
                let mut v = f.header.to_vec();
                v.extend_from_slice(&payload[f.payload.clone()]);
                frames.push(v);
            }
        }
        Err(_) => {
            // Too long to send: its first fragment as a hostile peer would.
            assert!(len > MAX_MSG_SIZE);
            let mut v = h.to_bytes_checksummed().to_vec();
            v.extend_from_slice(&payload[..FRAG_SIZE]);
            frames.push(v);
        }
    }
    Sending { frames, next: 0 }
}

fn fix_checksum(f: &mut [u8]) {
    if f.len() >= HEADER_LEN {
        let h = Header::from_bytes(f[..HEADER_LEN].try_into().unwrap());
        f[..HEADER_LEN].copy_from_slice(&h.to_bytes_checksummed());
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let setup = inp.u8();
    let max = if setup & 3 != 0 { MAX_MSG_SIZE as u32 } else { u32::from(setup >> 2) * 512 };
    let mut r = Reassembler::new(max);
    let mut model = Model { max, cur: None, counters: RxCounters::default() };
    let mut fc = FlowControl::new(setup & 4 != 0);
    fc.credits.set_flow_control(true, u32::from(setup >> 3));
    let mut signal = SignalState::new(u32::from(setup >> 4));
    let mut sending: Option<Sending> = None;
    let mut last: Vec<u8> = Vec::new();
    let mut fed = 0usize;
    let mut peer_acked = 0u64;

    for _ in 0..600 {
        let Some(op) = inp.byte() else { break };
        if fed > BUDGET {
            break;
        }
        if sending.as_ref().is_none_or(|s| s.next >= s.frames.len()) || op % 16 == 0 {
            sending = Some(build(&mut inp, &mut signal));
            if op % 16 == 0 {
                continue;
            }
        }
        let s = sending.as_mut().unwrap();
        let genuine = s.frames[s.next].clone();
        let frame: Vec<u8> = match op % 16 {
            // In order, as sent (most of the time).
            1..=6 => {
                s.next += 1;
                genuine
            }
            // Lost.
            7 => {
                s.next += 1;
                continue;
            }
            // Delivered again.
            8 => last.clone(),
            // A byte changed, the checksum fixed or not.
            9 | 10 => {
                s.next += 1;
                let mut f = genuine;
                let at = usize::from(inp.u16()) % f.len().max(1);
                if let Some(b) = f.get_mut(at) {
                    *b ^= inp.u8() | 1;
                }
                if op % 16 == 10 {
                    fix_checksum(&mut f);
                }
                f
            }
            // Cut short, or with bytes added.
            11 => {
                s.next += 1;
                let mut f = genuine;
                let n = usize::from(inp.u16());
                if inp.bool() {
                    f.truncate(n % (f.len() + 1));
                } else {
                    f.extend(std::iter::repeat_n(0xa5, n % 64 + 1));
                }
                f
            }
            // An ack-only frame between fragments.
            12 => ack_only_header(inp.u64() % 32, inp.u8()).to_vec(),
            // Raw bytes, the checksum made valid or not.
            13 | 14 => {
                let n = usize::from(inp.u16()) % (HEADER_LEN + FRAG_SIZE + 8);
                let mut f = inp.bytes(n).to_vec();
                if op % 16 == 14 {
                    fix_checksum(&mut f);
                }
                f
            }
            // A genuine header whose length field was rewritten.
            _ => {
                s.next += 1;
                let mut f = genuine;
                let mut h = Header::from_bytes(f[..HEADER_LEN].try_into().unwrap());
                h.len = match inp.u8() % 4 {
                    0 => h.len.wrapping_add(1),
                    1 => h.len.wrapping_sub(1),
                    2 => u32::MAX,
                    _ => inp.u32(),
                };
                f[..HEADER_LEN].copy_from_slice(&h.to_bytes_checksummed());
                f
            }
        };
        fed += frame.len();

        let want = model.frame(&frame);
        let (got, peak) = if op & 0x10 != 0 && frame.len() >= HEADER_LEN {
            // The two SGEs of a receive work request.
            let hdr: [u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().unwrap();
            peak_during(|| r.on_parts(&hdr, &frame[HEADER_LEN..]))
        } else {
            peak_during(|| r.on_frame(&frame))
        };
        // What is buffered: at most the message's h_len, never above the limit.
        assert!(peak <= max as usize, "{peak} bytes allocated with a limit of {max}");
        assert_eq!(got, want, "frame of {} bytes", frame.len());
        assert_eq!(r.remaining(), model.remaining());
        assert_eq!(r.is_idle(), model.cur.is_none());
        assert!(r.remaining() <= max as usize);
        assert_eq!(r.counters(), model.counters);
        match got {
            Ok(rx) => {
                if let RxKind::Message { header, payload } = &rx.kind {
                    assert_eq!(payload.len(), header.len as usize);
                    assert!(payload.capacity() <= (header.len as usize).max(1), "never more than h_len");
                    assert!(header.len <= max);
                    fc.acks.on_message(header.sequence, header.flags);
                }
                let (acked, _) = fc.on_frame(rx.ack, rx.credit);
                if rx.ack > peer_acked {
                    assert_eq!(acked, Some(rx.ack));
                    peer_acked = rx.ack;
                } else {
                    assert_eq!(acked, None, "acks only advance");
                }
                assert!(fc.credits.send_credits() <= MAX_CREDITS);
                if let Some(a) = fc.attempt_ack() {
                    assert!(fc.acks.in_flight());
                    assert_eq!(a.ack, fc.acks.current());
                    fc.acks.send_complete();
                }
            }
            Err(e) => {
                assert!(r.is_idle(), "{e}: the partial message is dropped");
            }
        }
        last = frame;
    }
});
