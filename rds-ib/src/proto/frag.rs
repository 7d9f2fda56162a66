//! Fragmentation of messages into IB SEND frames and their reassembly.
//!
//! On IB a message of `h_len` payload bytes travels as `ceil(h_len / 4096)`
//! SEND work requests (one for a 0-byte message). Every frame is a copy of
//! the message's 48-byte header followed by up to [`FRAG_SIZE`] payload
//! bytes. All frames of a message carry the same `h_sequence`, `h_len`,
//! `h_sport`, `h_dport`, flags and extension headers; `h_ack` and `h_credit`
//! are filled in per frame when it is posted and the checksum is recomputed
//! for each frame. Only the first frame of a posted batch carries the
//! advertised credits (`h_credit`, at most 255); the others carry 0.
//!
//! Work request flags follow `rds_ib_xmit`: the last fragment of a message is
//! SOLICITED (it wakes the receiver) and SIGNALED (its completion releases
//! the message); other frames are SIGNALED once every `max_unsignaled_wr + 1`
//! work requests ([`SignalState`]); when flow control cuts a message short,
//! the last frame of the batch is SIGNALED and SOLICITED too.
//!
//! The receive side ([`Reassembler`]) checks every frame as
//! `rds_ib_process_recv` does (at least a header, valid checksum, ack-only
//! frames recognised even between fragments, later fragments matching the
//! first fragment's sequence, length and ports) and is stricter than the
//! kernel in two ways that a kernel sender never trips: `h_len` above 1 MiB
//! is refused at the first fragment (nothing larger is ever buffered, and no
//! more than `h_len` bytes are ever allocated), and every fragment must carry
//! exactly `min(remaining, 4096)` payload bytes (the kernel counts fragments
//! as 4096 bytes whatever they carry, which would deliver garbage).

use core::fmt;
use core::ops::Range;

use rds_core::wire::{self, HEADER_LEN, Header, MAX_MSG_SIZE};

/// Payload bytes per fragment (`RDS_FRAG_SIZE`).
pub const FRAG_SIZE: usize = wire::FRAG_SIZE;

/// Default of `net.rds.ib.max_unsignaled_wr`.
pub const DEFAULT_MAX_UNSIGNALED_WR: u32 = 16;

/// Number of SEND work requests a message of `len` payload bytes needs.
pub fn frag_count(len: usize) -> usize {
    if len == 0 { 1 } else { len.div_ceil(FRAG_SIZE) }
}

/// The completion signaling of a send queue (`i_unsignaled_wrs`): every
/// `max_unsignaled + 1`-th work request is signaled, and a forced signal
/// (last fragment of a message) restarts the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalState {
    max_unsignaled: u32,
    countdown: u32,
}

impl SignalState {
    /// `max_unsignaled` is `net.rds.ib.max_unsignaled_wr` (1..=64 in the
    /// kernel; 0 signals every work request).
    pub fn new(max_unsignaled: u32) -> SignalState {
        SignalState { max_unsignaled, countdown: max_unsignaled }
    }

    pub fn max_unsignaled(&self) -> u32 {
        self.max_unsignaled
    }

    /// Whether the next work request is signaled (`rds_ib_set_wr_signal_state`).
    pub fn next(&mut self, notify: bool) -> bool {
        if self.countdown == 0 || notify {
            self.countdown = self.max_unsignaled;
            true
        } else {
            self.countdown -= 1;
            false
        }
    }

    /// The last fragment of a message is signaled; if the regular pacing had
    /// not signaled it, the count restarts.
    fn force(&mut self) {
        self.countdown = self.max_unsignaled;
    }
}

impl Default for SignalState {
    fn default() -> Self {
        SignalState::new(DEFAULT_MAX_UNSIGNALED_WR)
    }
}

/// One SEND work request: the header copy (SGE 0) and the payload range of
/// the message (SGE 1; empty for a 0-byte message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutFrame {
    /// Index of the fragment within its message.
    pub index: usize,
    /// The header of this frame, checksummed.
    pub header: [u8; HEADER_LEN],
    /// Byte range of the message payload this frame carries.
    pub payload: Range<usize>,
    pub signaled: bool,
    pub solicited: bool,
    /// The message's last fragment (its completion releases the message).
    pub last: bool,
}

/// Errors building an outgoing message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragError {
    /// The header's `h_len` is not the payload length.
    LenMismatch { h_len: u32, payload: usize },
    /// Payload above [`MAX_MSG_SIZE`] (a congestion map is 8 KiB).
    TooLong { len: usize },
}

impl fmt::Display for FragError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FragError::LenMismatch { h_len, payload } => {
                write!(f, "h_len {h_len} does not match a payload of {payload} bytes")
            }
            FragError::TooLong { len } => write!(f, "message of {len} bytes exceeds {MAX_MSG_SIZE}"),
        }
    }
}

impl std::error::Error for FragError {}

/// A message being posted as fragments, possibly over several batches when
/// flow control hands out fewer credits than fragments.
#[derive(Clone, Debug)]
pub struct OutMessage {
    header: Header,
    len: usize,
    next: usize,
    count: usize,
}

impl OutMessage {
    /// Prepares a message: `header` as the core built it (sequence, ports,
    /// flags including RETRANSMITTED, extension headers) with `h_len` equal
    /// to `payload_len`; `ack_required` (the core's
    /// [`rds_core::TxMessage::ack_required`]) sets ACK_REQUIRED on the wire.
    pub fn new(header: Header, payload_len: usize, ack_required: bool) -> Result<OutMessage, FragError> {
        if payload_len > MAX_MSG_SIZE {
            return Err(FragError::TooLong { len: payload_len });
        }
        if header.len as usize != payload_len {
            return Err(FragError::LenMismatch { h_len: header.len, payload: payload_len });
        }
        let mut header = header;
        // Receivers recognise a congestion map by h_flags == CONG_BITMAP, so
        // a map never carries ACK_REQUIRED (the kernel never marks one).
        if ack_required && header.flags != wire::flags::CONG_BITMAP {
            header.flags |= wire::flags::ACK_REQUIRED;
        }
        header.credit = 0;
        header.csum = 0;
        Ok(OutMessage { header, len: payload_len, next: 0, count: frag_count(payload_len) })
    }

    /// The header template (ack, credit and checksum not filled in).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Total fragments of the message.
    pub fn frag_count(&self) -> usize {
        self.count
    }

    /// Fragments not posted yet.
    pub fn remaining(&self) -> usize {
        self.count - self.next
    }

    /// Whether no fragment has been posted yet.
    pub fn is_fresh(&self) -> bool {
        self.next == 0
    }

    pub fn is_done(&self) -> bool {
        self.next == self.count
    }

    /// Builds the next batch of at most `granted` frames (the work requests
    /// and send credits the caller obtained). Every frame carries `ack` in
    /// `h_ack`; the first carries `adv_credits` in `h_credit`. Returns the
    /// frames; the caller gives back `granted - frames.len()` unused credits.
    pub fn next_batch(
        &mut self,
        granted: usize,
        ack: u64,
        adv_credits: u8,
        signal: &mut SignalState,
        out: &mut Vec<OutFrame>,
    ) -> usize {
        let n = granted.min(self.remaining());
        let mut credit = adv_credits;
        for k in 0..n {
            let index = self.next;
            self.next += 1;
            let last = self.next == self.count;
            let start = index * FRAG_SIZE;
            let end = (start + FRAG_SIZE).min(self.len);
            let mut signaled = signal.next(false);
            let mut solicited = false;
            if k + 1 == n && !last {
                // Stopping short for lack of credits.
                signaled = true;
                solicited = true;
            }
            if last {
                solicited = true;
                if !signaled {
                    signal.force();
                    signaled = true;
                }
            }
            let mut h = self.header;
            h.ack = ack;
            h.credit = credit;
            credit = 0;
            out.push(OutFrame {
                index,
                header: h.to_bytes_checksummed(),
                payload: start..end.max(start),
                signaled,
                solicited,
                last,
            });
        }
        n
    }
}

/// The header of an ack-only frame (`rds_ib_send_ack`): ports 0, sequence
/// 0, length 0, flags 0, `h_ack` = the last sequence received, `h_credit` =
/// the advertised credits, checksummed.
pub fn ack_only_header(ack: u64, credit: u8) -> [u8; HEADER_LEN] {
    let h = Header { ack, credit, ..Header::default() };
    h.to_bytes_checksummed()
}

/// Protocol errors of the receive side. Each one ends the connection (the
/// transport reports [`rds_core::DownReason::ProtocolError`] and counts it);
/// the reassembler drops its partial message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// A completion of fewer than 48 bytes.
    NoHeader { byte_len: usize },
    /// The header checksum does not verify (`recv_drop_bad_checksum`).
    BadChecksum,
    /// A first fragment announcing more than the limit (1 MiB).
    TooLong { len: u32, max: u32 },
    /// A later fragment whose sequence, length or ports differ from the
    /// first fragment's ("fragment header mismatch").
    Mismatch { expected_seq: u64, got_seq: u64 },
    /// A fragment carrying a payload of the wrong size.
    FragLen { expected: usize, got: usize },
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RecvError::NoHeader { byte_len } => write!(f, "IB frame of {byte_len} bytes has no header"),
            RecvError::BadChecksum => f.write_str("IB frame header checksum mismatch"),
            RecvError::TooLong { len, max } => write!(f, "h_len {len} exceeds the limit {max}"),
            RecvError::Mismatch { expected_seq, got_seq } => {
                write!(f, "fragment header mismatch (message seq {expected_seq}, fragment seq {got_seq})")
            }
            RecvError::FragLen { expected, got } => {
                write!(f, "fragment of {got} payload bytes where {expected} were due")
            }
        }
    }
}

impl std::error::Error for RecvError {}

/// What one received frame amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum RxKind {
    /// An ack-only frame: no RDS message.
    AckOnly,
    /// A fragment of a message still incomplete.
    Partial,
    /// The last fragment: the complete message (the first fragment's header
    /// and the payload).
    Message { header: Header, payload: Vec<u8> },
}

/// A received frame: the piggybacked ack and credits every valid frame
/// carries, and what it completed.
#[derive(Debug, PartialEq, Eq)]
pub struct RxFrame {
    /// `h_ack`: the peer received everything up to this sequence.
    pub ack: u64,
    /// `h_credit`: send credits the peer grants (0: none).
    pub credit: u8,
    pub kind: RxKind,
}

/// Receive counters under the kernel's names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxCounters {
    /// `ib_rx_total_frags`: data frames accepted.
    pub total_frags: u64,
    /// `ib_rx_total_incs`: complete messages.
    pub total_incs: u64,
    /// `ib_ack_received`: ack-only frames.
    pub ack_received: u64,
    /// `recv_drop_bad_checksum`.
    pub bad_checksum: u64,
    /// Frames refused for any other protocol error.
    pub protocol_errors: u64,
}

#[derive(Debug)]
struct Partial {
    header: Header,
    buf: Vec<u8>,
}

/// Reassembles the frames of one connection into messages.
#[derive(Debug)]
pub struct Reassembler {
    cur: Option<Partial>,
    max_len: u32,
    counters: RxCounters,
}

impl Default for Reassembler {
    fn default() -> Self {
        Reassembler::new(MAX_MSG_SIZE as u32)
    }
}

impl Reassembler {
    /// A reassembler refusing `h_len` above `max_len`.
    pub fn new(max_len: u32) -> Reassembler {
        Reassembler { cur: None, max_len, counters: RxCounters::default() }
    }

    /// No message in progress.
    pub fn is_idle(&self) -> bool {
        self.cur.is_none()
    }

    /// Payload bytes still due for the message in progress.
    pub fn remaining(&self) -> usize {
        self.cur.as_ref().map_or(0, |p| p.header.len as usize - p.buf.len())
    }

    pub fn counters(&self) -> RxCounters {
        self.counters
    }

    /// A frame that arrived in one buffer (header then payload).
    pub fn on_frame(&mut self, frame: &[u8]) -> Result<RxFrame, RecvError> {
        match frame.split_first_chunk::<HEADER_LEN>() {
            Some((hdr, payload)) => self.on_parts(hdr, payload),
            None => {
                self.fail();
                Err(RecvError::NoHeader { byte_len: frame.len() })
            }
        }
    }

    /// A frame received into the two SGEs of a receive work request: the
    /// 48-byte header buffer and the payload bytes of the fragment buffer
    /// (`byte_len - 48` of them).
    pub fn on_parts(&mut self, hdr: &[u8; HEADER_LEN], payload: &[u8]) -> Result<RxFrame, RecvError> {
        if !wire::verify_checksum(hdr) {
            self.counters.bad_checksum += 1;
            self.cur = None;
            return Err(RecvError::BadChecksum);
        }
        let ih = Header::from_bytes(hdr);
        let (ack, credit) = (ih.ack, ih.credit);
        if ih.sport == 0 && ih.dport == 0 && payload.is_empty() {
            self.counters.ack_received += 1;
            return Ok(RxFrame { ack, credit, kind: RxKind::AckOnly });
        }
        let partial = match self.cur.take() {
            None => {
                if ih.len > self.max_len {
                    self.fail();
                    return Err(RecvError::TooLong { len: ih.len, max: self.max_len });
                }
                Partial { header: ih, buf: Vec::with_capacity(ih.len as usize) }
            }
            Some(p) => {
                let f = &p.header;
                if f.sequence != ih.sequence || f.len != ih.len || f.sport != ih.sport || f.dport != ih.dport {
                    self.fail();
                    return Err(RecvError::Mismatch { expected_seq: f.sequence, got_seq: ih.sequence });
                }
                p
            }
        };
        let due = (partial.header.len as usize - partial.buf.len()).min(FRAG_SIZE);
        if payload.len() != due {
            self.fail();
            return Err(RecvError::FragLen { expected: due, got: payload.len() });
        }
        let mut partial = partial;
        partial.buf.extend_from_slice(payload);
        self.counters.total_frags += 1;
        if partial.buf.len() == partial.header.len as usize {
            self.counters.total_incs += 1;
            let Partial { header, buf } = partial;
            Ok(RxFrame { ack, credit, kind: RxKind::Message { header, payload: buf } })
        } else {
            self.cur = Some(partial);
            Ok(RxFrame { ack, credit, kind: RxKind::Partial })
        }
    }

    fn fail(&mut self) {
        self.cur = None;
        self.counters.protocol_errors += 1;
    }
}

#[cfg(test)]
mod tests {
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
}
