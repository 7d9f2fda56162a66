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
mod tests;
