//! The RDS wire format: the 48-byte header, its flags, extension headers, the
//! header checksum, the congestion-map message and the TCP stream framing.
//!
//! Everything here is pure data transformation. Decoders take untrusted bytes
//! and return typed errors; none of them panics, whatever the input.
//!
//! Layout of `struct rds_header` (all multi-byte fields big-endian):
//!
//! | off | size | field      |
//! |-----|------|------------|
//! | 0   | 8    | h_sequence |
//! | 8   | 8    | h_ack      |
//! | 16  | 4    | h_len      |
//! | 20  | 2    | h_sport    |
//! | 22  | 2    | h_dport    |
//! | 24  | 1    | h_flags    |
//! | 25  | 1    | h_credit   |
//! | 26  | 4    | h_padding  |
//! | 30  | 2    | h_csum     |
//! | 32  | 16   | h_exthdr   |

use core::fmt;

/// Size of `struct rds_header` on the wire.
pub const HEADER_LEN: usize = 48;
/// Size of the extension-header area at the end of the header.
pub const EXTHDR_SPACE: usize = 16;
/// Largest payload (and largest RDMA transfer) of one message: 1 MiB.
pub const MAX_MSG_SIZE: usize = 1 << 20;
/// Payload size of a congestion-map update: 65536 bits.
pub const CONG_MAP_BYTES: usize = 8192;
/// Payload bytes per IB fragment (`RDS_FRAG_SIZE`).
pub const FRAG_SIZE: usize = 4096;
/// TCP listener port of RDS-TCP (IANA registered).
pub const RDS_TCP_PORT: u16 = 16385;
/// RDMA CM port for IPv4 connections.
pub const RDS_RDMA_CM_PORT: u16 = 18634;
/// Reserved source port of the multipath handshake probe ping (`RDS_FLAG_PROBE_PORT`).
pub const PROBE_PORT: u16 = 1;
/// Maximum number of paths per connection (`RDS_MPATH_WORKERS`).
pub const MPATH_WORKERS: usize = 8;

/// Protocol version 3.0.
pub const PROTOCOL_3_0: u16 = 0x0300;
/// Protocol version 3.1 (mainline core and TCP; IB compat version).
pub const PROTOCOL_3_1: u16 = 0x0301;
/// Protocol version 4.0.
pub const PROTOCOL_4_0: u16 = 0x0400;
/// Protocol version 4.1 (what IB proposes first).
pub const PROTOCOL_4_1: u16 = 0x0401;

/// Bits of `h_flags`.
pub mod flags {
    /// The payload is the 8 KiB congestion bitmap. Receivers test equality.
    pub const CONG_BITMAP: u8 = 0x01;
    /// The receiver should send an explicit ack (IB only on the wire).
    pub const ACK_REQUIRED: u8 = 0x02;
    /// A resend after reconnect.
    pub const RETRANSMITTED: u8 = 0x04;
    /// UEK heartbeat ping.
    pub const HB_PING: u8 = 0x08;
    /// UEK heartbeat pong.
    pub const HB_PONG: u8 = 0x10;
    /// An RDMA_BYTES extension header follows (UEK, 2026 net-next).
    pub const EXTHDR_EXTENSION: u8 = 0x20;
}

/// Errors of the wire decoders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Fewer than 48 bytes where a header was expected.
    Truncated { have: usize },
    /// `h_len` above [`MAX_MSG_SIZE`] (or the configured limit).
    TooLong { len: u32, max: u32 },
    /// A congestion-map message whose length is not 8192.
    BadCongMapLen { len: u32 },
    /// The header checksum does not verify.
    BadChecksum,
    /// No room left in the 16-byte extension area.
    ExtSpaceFull,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { have } => write!(f, "truncated RDS header: {have} of 48 bytes"),
            WireError::TooLong { len, max } => write!(f, "h_len {len} exceeds the limit {max}"),
            WireError::BadCongMapLen { len } => {
                write!(f, "congestion map of {len} bytes (expected {CONG_MAP_BYTES})")
            }
            WireError::BadChecksum => f.write_str("RDS header checksum mismatch"),
            WireError::ExtSpaceFull => f.write_str("no room in the 16-byte extension header area"),
        }
    }
}

impl std::error::Error for WireError {}

/// A decoded `struct rds_header`. The extension area is kept raw so that a
/// decode/encode round trip is byte-exact; [`Header::extensions`] parses it.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub sequence: u64,
    pub ack: u64,
    pub len: u32,
    pub sport: u16,
    pub dport: u16,
    pub flags: u8,
    pub credit: u8,
    pub padding: [u8; 4],
    pub csum: u16,
    pub exthdr: [u8; EXTHDR_SPACE],
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Header");
        d.field("seq", &self.sequence)
            .field("ack", &self.ack)
            .field("len", &self.len)
            .field("sport", &self.sport)
            .field("dport", &self.dport)
            .field("flags", &format_args!("{:#04x}", self.flags));
        if self.credit != 0 {
            d.field("credit", &self.credit);
        }
        if self.csum != 0 {
            d.field("csum", &format_args!("{:#06x}", self.csum));
        }
        let exts: Vec<Ext> = self.extensions().collect();
        if !exts.is_empty() {
            d.field("ext", &exts);
        }
        d.finish()
    }
}

/// What kind of control message a header is, by the kernel's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `h_flags == CONG_BITMAP`: a congestion-map update.
    CongMap,
    /// sport 1 -> dport 0: the multipath handshake probe ping.
    ProbePing,
    /// sport 0 -> dport 1: the answer to a probe ping.
    ProbePong,
    /// dport 0 with a non-zero sport: a ping (answered with a pong, never delivered).
    Ping,
    /// sport 0, dport 0 and not a map: ignored by the kernel (ping from port 0).
    Null,
    /// Anything else: data for the socket bound to dport (including pongs, sport 0).
    Data,
}

impl Header {
    /// A data header as `rds_message_populate_header` builds it.
    pub fn data(sport: u16, dport: u16, len: u32) -> Header {
        Header { sport, dport, len, ..Header::default() }
    }

    /// The header of a congestion-map update: all zero except h_len 8192 and
    /// h_flags CONG_BITMAP.
    pub fn cong_map() -> Header {
        Header { len: CONG_MAP_BYTES as u32, flags: flags::CONG_BITMAP, ..Header::default() }
    }

    /// Decodes the first 48 bytes of `buf`. Never fails on content, only on length.
    pub fn decode(buf: &[u8]) -> Result<Header, WireError> {
        let b: &[u8; HEADER_LEN] =
            buf.get(..HEADER_LEN).and_then(|s| s.try_into().ok()).ok_or(WireError::Truncated { have: buf.len() })?;
        Ok(Header::from_bytes(b))
    }

    /// Decodes an exact 48-byte array.
    pub fn from_bytes(b: &[u8; HEADER_LEN]) -> Header {
        let u64_at = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_be_bytes(b[o..o + 2].try_into().unwrap());
        Header {
            sequence: u64_at(0),
            ack: u64_at(8),
            len: u32_at(16),
            sport: u16_at(20),
            dport: u16_at(22),
            flags: b[24],
            credit: b[25],
            padding: b[26..30].try_into().unwrap(),
            csum: u16_at(30),
            exthdr: b[32..48].try_into().unwrap(),
        }
    }

    /// Encodes into 48 bytes, `h_csum` as stored in the struct.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.encode_into(&mut b);
        b
    }

    /// Encodes into the given 48 bytes.
    pub fn encode_into(&self, b: &mut [u8; HEADER_LEN]) {
        b[0..8].copy_from_slice(&self.sequence.to_be_bytes());
        b[8..16].copy_from_slice(&self.ack.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        b[20..22].copy_from_slice(&self.sport.to_be_bytes());
        b[22..24].copy_from_slice(&self.dport.to_be_bytes());
        b[24] = self.flags;
        b[25] = self.credit;
        b[26..30].copy_from_slice(&self.padding);
        b[30..32].copy_from_slice(&self.csum.to_be_bytes());
        b[32..48].copy_from_slice(&self.exthdr);
    }

    /// Encodes with a freshly computed checksum (as IB sends every frame).
    pub fn to_bytes_checksummed(&self) -> [u8; HEADER_LEN] {
        let mut h = *self;
        h.csum = 0;
        let mut b = h.to_bytes();
        let c = checksum(&b);
        b[30..32].copy_from_slice(&c.to_be_bytes());
        b
    }

    /// Classifies the header the way `rds_recv_incoming` and the TCP receive
    /// path do. The congestion-map test is an equality test on `h_flags`.
    pub fn kind(&self) -> Kind {
        if self.flags == flags::CONG_BITMAP {
            return Kind::CongMap;
        }
        match (self.sport, self.dport) {
            (PROBE_PORT, 0) => Kind::ProbePing,
            (0, PROBE_PORT) => Kind::ProbePong,
            (0, 0) => Kind::Null,
            (_, 0) => Kind::Ping,
            _ => Kind::Data,
        }
    }

    pub fn is_retransmitted(&self) -> bool {
        self.flags & flags::RETRANSMITTED != 0
    }

    /// Iterates over the extension headers by the kernel's parsing rule.
    pub fn extensions(&self) -> ExtIter<'_> {
        ExtIter { area: &self.exthdr, pos: 0 }
    }

    /// Number of bytes of the extension area in use (up to the terminator).
    fn ext_used(&self) -> usize {
        let mut it = self.extensions();
        while it.next().is_some() {}
        it.pos.min(EXTHDR_SPACE)
    }

    /// Appends an extension header after the existing ones (the 2026 kernel
    /// behaviour). Mainline 6.1 refuses a second one; use
    /// [`Header::push_extension_limited`] to get that behaviour.
    pub fn push_extension(&mut self, ext: Ext) -> Result<(), WireError> {
        let used = self.ext_used();
        let need = 1 + ext.body_len();
        if used + need > EXTHDR_SPACE {
            return Err(WireError::ExtSpaceFull);
        }
        self.exthdr[used] = ext.type_byte();
        ext.write_body(&mut self.exthdr[used + 1..used + need]);
        // Terminate the list (as the kernel's rds_message_add_extension
        // does): bytes left after the old end must not parse as more headers.
        if let Some(b) = self.exthdr.get_mut(used + need) {
            *b = ext_type::NONE;
        }
        Ok(())
    }

    /// Appends an extension header only if fewer than `limit` are present.
    /// Returns `Ok(false)` when the limit refused it (silently, as mainline's
    /// `rds_message_add_extension` does).
    pub fn push_extension_limited(&mut self, ext: Ext, limit: usize) -> Result<bool, WireError> {
        if self.extensions().count() >= limit {
            return Ok(false);
        }
        self.push_extension(ext).map(|_| true)
    }
}

/// The 16-bit one's-complement Internet checksum over the 48-byte header
/// (the caller zeroes `h_csum` first when computing).
pub fn checksum(b: &[u8; HEADER_LEN]) -> u16 {
    let mut sum: u32 = 0;
    for w in b.chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// `rds_message_verify_checksum`: a zero `h_csum` is accepted, otherwise the
/// sum over the whole header including `h_csum` must fold to zero.
pub fn verify_checksum(b: &[u8; HEADER_LEN]) -> bool {
    b[30] == 0 && b[31] == 0 || checksum(b) == 0
}

/// Extension header types (`RDS_EXTHDR_*`).
pub mod ext_type {
    pub const NONE: u8 = 0;
    pub const VERSION: u8 = 1;
    pub const RDMA: u8 = 2;
    pub const RDMA_DEST: u8 = 3;
    pub const RDMA_BYTES: u8 = 4;
    pub const NPATHS: u8 = 5;
    pub const GEN_NUM: u8 = 6;
    pub const CAP_BITS: u8 = 7;
    pub const SPORT_IDX: u8 = 8;
    pub const CSUM: u8 = 9;
    /// Types at or above this stop the parser.
    pub const MAX: u8 = 16;
}

/// Body length of an extension type: the kernel's `rds_exthdr_size` table
/// (newest definitions; types without an entry have size 0).
pub fn ext_body_len(ty: u8) -> usize {
    match ty {
        ext_type::VERSION | ext_type::RDMA | ext_type::GEN_NUM | ext_type::CAP_BITS => 4,
        ext_type::RDMA_DEST | ext_type::RDMA_BYTES | ext_type::CSUM => 8,
        ext_type::NPATHS => 2,
        ext_type::SPORT_IDX => 1,
        _ => 0,
    }
}

/// A parsed extension header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    Version(u32),
    /// rkey of the MR an RDMA op used (the peer may release a use-once MR).
    Rdma {
        rkey: u32,
    },
    /// Destination of a peer-initiated RDMA; becomes the RDMA_DEST cookie.
    RdmaDest {
        rkey: u32,
        offset: u32,
    },
    /// RDMA byte count (UEK / 2026): 4 bytes, a flags byte, 3 bytes of padding.
    RdmaBytes {
        bytes: u32,
        rflags: u8,
    },
    /// Number of paths the sender supports.
    Npaths(u16),
    /// Sender's generation number.
    GenNum(u32),
    /// UEK capability bits.
    CapBits(u32),
    /// "My TCP source port encodes the path index" (body is a dummy byte).
    SportIdx,
    /// UEK RDMA checksum.
    Csum {
        value: u32,
        enabled: bool,
    },
    /// A type below 16 that has no entry in the size table (size 0).
    Unknown(u8),
}

impl Ext {
    pub fn type_byte(&self) -> u8 {
        match self {
            Ext::Version(_) => ext_type::VERSION,
            Ext::Rdma { .. } => ext_type::RDMA,
            Ext::RdmaDest { .. } => ext_type::RDMA_DEST,
            Ext::RdmaBytes { .. } => ext_type::RDMA_BYTES,
            Ext::Npaths(_) => ext_type::NPATHS,
            Ext::GenNum(_) => ext_type::GEN_NUM,
            Ext::CapBits(_) => ext_type::CAP_BITS,
            Ext::SportIdx => ext_type::SPORT_IDX,
            Ext::Csum { .. } => ext_type::CSUM,
            Ext::Unknown(t) => *t,
        }
    }

    pub fn body_len(&self) -> usize {
        ext_body_len(self.type_byte())
    }

    fn write_body(&self, out: &mut [u8]) {
        match *self {
            Ext::Version(v) | Ext::Rdma { rkey: v } | Ext::GenNum(v) | Ext::CapBits(v) => {
                out.copy_from_slice(&v.to_be_bytes())
            }
            Ext::RdmaDest { rkey, offset } => {
                out[..4].copy_from_slice(&rkey.to_be_bytes());
                out[4..].copy_from_slice(&offset.to_be_bytes());
            }
            Ext::RdmaBytes { bytes, rflags } => {
                out[..4].copy_from_slice(&bytes.to_be_bytes());
                out[4] = rflags;
                out[5..].fill(0);
            }
            Ext::Npaths(n) => out.copy_from_slice(&n.to_be_bytes()),
            Ext::SportIdx => out[0] = 0,
            Ext::Csum { value, enabled } => {
                out[..4].copy_from_slice(&value.to_be_bytes());
                out[4] = enabled as u8;
                out[5..].fill(0);
            }
            Ext::Unknown(_) => {}
        }
    }

    fn parse(ty: u8, body: &[u8]) -> Ext {
        let be32 = |o: usize| u32::from_be_bytes(body[o..o + 4].try_into().unwrap());
        match ty {
            ext_type::VERSION => Ext::Version(be32(0)),
            ext_type::RDMA => Ext::Rdma { rkey: be32(0) },
            ext_type::RDMA_DEST => Ext::RdmaDest { rkey: be32(0), offset: be32(4) },
            ext_type::RDMA_BYTES => Ext::RdmaBytes { bytes: be32(0), rflags: body[4] },
            ext_type::NPATHS => Ext::Npaths(u16::from_be_bytes([body[0], body[1]])),
            ext_type::GEN_NUM => Ext::GenNum(be32(0)),
            ext_type::CAP_BITS => Ext::CapBits(be32(0)),
            ext_type::SPORT_IDX => Ext::SportIdx,
            ext_type::CSUM => Ext::Csum { value: be32(0), enabled: body[4] != 0 },
            t => Ext::Unknown(t),
        }
    }
}

/// Iterator over extension headers: stops at type 0, a type >= 16, or when the
/// body would overrun the 16-byte area (`rds_message_next_extension`).
pub struct ExtIter<'a> {
    area: &'a [u8; EXTHDR_SPACE],
    pos: usize,
}

impl Iterator for ExtIter<'_> {
    type Item = Ext;
    fn next(&mut self) -> Option<Ext> {
        let ty = *self.area.get(self.pos)?;
        if ty == ext_type::NONE || ty >= ext_type::MAX {
            return None;
        }
        let len = ext_body_len(ty);
        let body = self.area.get(self.pos + 1..self.pos + 1 + len)?;
        self.pos += 1 + len;
        Some(Ext::parse(ty, body))
    }
}

/// Result of feeding bytes to a [`FrameDecoder`].
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub payload: Vec<u8>,
}

/// Splits an RDS-TCP byte stream into messages (`[48-byte header][h_len bytes]`
/// repeated). A message may span any number of reads and a read may hold any
/// number of messages.
///
/// Memory is bounded by the data actually received: the payload buffer grows
/// with the bytes that arrive, never to a hostile `h_len` up front, and `h_len`
/// above the limit is an error before any payload is buffered. A partial
/// payload holds at most about twice the bytes received plus
/// [`PAYLOAD_WINDOW_MIN`] (see [`FrameDecoder::payload_capacity`]), whether it
/// was fed ([`FrameDecoder::feed`]) or read in place
/// ([`FrameDecoder::read_direct`]), and every byte is zero-filled at most once.
#[derive(Debug)]
pub struct FrameDecoder {
    hdr: [u8; HEADER_LEN],
    hdr_have: usize,
    cur: Option<Partial>,
    max_len: u32,
    /// Bytes of the stream consumed so far (for introspection).
    consumed: u64,
}

/// A message whose payload is being received.
#[derive(Debug)]
struct Partial {
    header: Header,
    /// `buf[..have]` is the payload received so far; `buf[have..]` is
    /// zero-filled room offered to direct reads and not yet filled.
    buf: Vec<u8>,
    have: usize,
}

/// The first allocation of a payload, and the smallest direct-read window:
/// a payload's buffer then grows with what arrived (it at most doubles).
pub const PAYLOAD_WINDOW_MIN: usize = 16 * 1024;

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(MAX_MSG_SIZE as u32)
    }
}

impl FrameDecoder {
    /// A decoder that rejects `h_len` above `max_len`.
    pub fn new(max_len: u32) -> FrameDecoder {
        FrameDecoder { hdr: [0; HEADER_LEN], hdr_have: 0, cur: None, max_len, consumed: 0 }
    }

    /// Header bytes still missing before the next header is complete (0 while
    /// inside a payload).
    pub fn header_remaining(&self) -> usize {
        if self.cur.is_some() { 0 } else { HEADER_LEN - self.hdr_have }
    }

    /// Payload bytes still missing of the current message (0 between messages).
    pub fn payload_remaining(&self) -> usize {
        match &self.cur {
            Some(p) => p.header.len as usize - p.have,
            None => 0,
        }
    }

    /// Payload bytes received of the current message (0 between messages).
    pub fn payload_received(&self) -> usize {
        self.cur.as_ref().map_or(0, |p| p.have)
    }

    /// Bytes allocated for the current message's payload (0 between
    /// messages): at most `2 * payload_received() + PAYLOAD_WINDOW_MIN`.
    pub fn payload_capacity(&self) -> usize {
        self.cur.as_ref().map_or(0, |p| p.buf.capacity())
    }

    /// Total stream bytes consumed.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// True when the decoder is between messages (no partial header or payload).
    pub fn is_idle(&self) -> bool {
        self.cur.is_none() && self.hdr_have == 0
    }

    /// Feeds bytes; calls `on_frame` for every complete message in order.
    /// On error the stream is unusable (the connection must be reset); frames
    /// completed before the error have already been passed to `on_frame`.
    pub fn feed(&mut self, mut data: &[u8], on_frame: &mut dyn FnMut(Frame)) -> Result<(), WireError> {
        while !data.is_empty() {
            if let Some(p) = &mut self.cur {
                let take = (p.header.len as usize - p.have).min(data.len());
                // Into the zero-filled room a direct read left, then beyond.
                let room = (p.buf.len() - p.have).min(take);
                p.buf[p.have..p.have + room].copy_from_slice(&data[..room]);
                p.buf.extend_from_slice(&data[room..take]);
                p.have += take;
                data = &data[take..];
                self.consumed += take as u64;
                if let Some(f) = self.complete() {
                    on_frame(f);
                }
                continue;
            }
            let take = (HEADER_LEN - self.hdr_have).min(data.len());
            self.hdr[self.hdr_have..self.hdr_have + take].copy_from_slice(&data[..take]);
            self.hdr_have += take;
            self.consumed += take as u64;
            data = &data[take..];
            if self.hdr_have == HEADER_LEN {
                self.hdr_have = 0;
                let header = Header::from_bytes(&self.hdr);
                if header.len > self.max_len {
                    return Err(WireError::TooLong { len: header.len, max: self.max_len });
                }
                if header.len == 0 {
                    on_frame(Frame { header, payload: Vec::new() });
                } else {
                    let cap = (header.len as usize).min(PAYLOAD_WINDOW_MIN);
                    self.cur = Some(Partial { header, buf: Vec::with_capacity(cap), have: 0 });
                }
            }
        }
        Ok(())
    }

    /// The current message, if its payload is complete.
    fn complete(&mut self) -> Option<Frame> {
        let p = self.cur.as_ref()?;
        if p.have != p.header.len as usize {
            return None;
        }
        let Partial { header, mut buf, have } = self.cur.take()?;
        buf.truncate(have);
        Some(Frame { header, payload: buf })
    }

    /// For large payloads: `read` fills the next payload bytes straight into
    /// the message's buffer (no copy through an intermediate buffer) and
    /// returns how many it wrote. The window it gets holds at most `max`
    /// bytes, never more than the payload still missing, and never more
    /// than what was already received or [`PAYLOAD_WINDOW_MIN`] (so the
    /// buffer grows with what arrives: a 1 MiB `h_len` followed by a
    /// trickle costs what the trickle brought, not 1 MiB). Room offered
    /// and not filled is kept for the next read: each byte is zero-filled
    /// once.
    ///
    /// Returns the bytes read and the message if it is now complete.
    /// `read`'s error is passed through (nothing is committed). Fails with
    /// `InvalidInput` when no payload is in progress (see
    /// [`FrameDecoder::payload_remaining`]) or `read` claims more bytes than
    /// its window (nothing is committed either: the decoder never trusts a
    /// count it did not offer).
    pub fn read_direct(
        &mut self,
        max: usize,
        read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
    ) -> std::io::Result<(usize, Option<Frame>)> {
        let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
        let Some(p) = self.cur.as_mut() else { return Err(invalid("no payload in progress")) };
        let want = (p.header.len as usize - p.have).min(max.max(1)).min(p.have.max(PAYLOAD_WINDOW_MIN));
        let end = p.have + want;
        if p.buf.len() < end {
            p.buf.reserve_exact(end - p.buf.len());
            p.buf.resize(end, 0);
        }
        let n = read(&mut p.buf[p.have..end])?;
        if n > want {
            return Err(invalid("read_direct: more bytes reported than offered"));
        }
        p.have += n;
        self.consumed += n as u64;
        Ok((n, self.complete()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_is_byte_exact() {
        let mut raw = [0u8; HEADER_LEN];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        let h = Header::from_bytes(&raw);
        assert_eq!(h.to_bytes(), raw);
        assert_eq!(h.sequence, u64::from_be_bytes(raw[0..8].try_into().unwrap()));
        assert_eq!(h.len, u32::from_be_bytes(raw[16..20].try_into().unwrap()));
        assert_eq!(h.sport, u16::from_be_bytes(raw[20..22].try_into().unwrap()));
        assert_eq!(h.csum, u16::from_be_bytes(raw[30..32].try_into().unwrap()));
    }

    #[test]
    fn truncated_header_is_an_error() {
        assert_eq!(Header::decode(&[0; 47]), Err(WireError::Truncated { have: 47 }));
        assert!(Header::decode(&[0; 48]).is_ok());
    }

    #[test]
    fn checksum_round_trip() {
        let mut h = Header::data(5000, 4000, 16);
        h.sequence = 7;
        let b = h.to_bytes_checksummed();
        assert!(verify_checksum(&b));
        let mut bad = b;
        bad[20] ^= 1;
        assert!(!verify_checksum(&bad));
        // A zero checksum is always accepted.
        assert!(verify_checksum(&h.to_bytes()));
    }

    #[test]
    fn extensions_append_and_limit() {
        let mut h = Header::default();
        assert!(h.push_extension_limited(Ext::Npaths(8), 1).unwrap());
        assert!(!h.push_extension_limited(Ext::GenNum(0xdeadbeef), 1).unwrap());
        assert_eq!(h.exthdr, [5, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        h.push_extension(Ext::GenNum(0xdeadbeef)).unwrap();
        h.push_extension(Ext::SportIdx).unwrap();
        assert_eq!(h.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8), Ext::GenNum(0xdeadbeef), Ext::SportIdx]);
        // 3 + 5 + 2 = 10 used; an 8-byte body needs 9 more.
        assert_eq!(h.push_extension(Ext::RdmaDest { rkey: 1, offset: 2 }), Err(WireError::ExtSpaceFull));
    }

    #[test]
    fn pushed_extension_terminates_the_list() {
        // Parsing stops at type 44 (>= 16); what follows it is garbage.
        let mut h = Header { exthdr: [44, 10, 10, 5, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], ..Header::default() };
        assert_eq!(h.extensions().count(), 0);
        h.push_extension(Ext::SportIdx).unwrap();
        assert_eq!(h.extensions().collect::<Vec<_>>(), vec![Ext::SportIdx]);
        assert_eq!(h.exthdr[..3], [8, 0, 0]);
        // A header that fills the area exactly has no room for a terminator.
        let mut f = Header::default();
        for e in [Ext::GenNum(1), Ext::GenNum(2), Ext::Npaths(3)] {
            f.push_extension(e).unwrap();
        }
        assert_eq!(f.push_extension(Ext::Npaths(4)), Ok(()));
        assert_eq!(
            f.extensions().collect::<Vec<_>>(),
            [Ext::GenNum(1), Ext::GenNum(2), Ext::Npaths(3), Ext::Npaths(4)]
        );
    }

    #[test]
    fn decoder_splits_any_segmentation() {
        let mut stream = Vec::new();
        let mut expect = Vec::new();
        for (i, len) in [0usize, 1, 47, 48, 49, 5000, 0, 3].iter().enumerate() {
            let mut h = Header::data(100 + i as u16, 200, *len as u32);
            h.sequence = i as u64 + 1;
            let payload: Vec<u8> = (0..*len).map(|j| (i * 31 + j) as u8).collect();
            stream.extend_from_slice(&h.to_bytes());
            stream.extend_from_slice(&payload);
            expect.push((h, payload));
        }
        for chunk in [1, 2, 7, 48, 49, 1000, stream.len()] {
            let mut d = FrameDecoder::default();
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                d.feed(c, &mut |f| got.push((f.header, f.payload))).unwrap();
            }
            assert!(d.is_idle());
            assert_eq!(got, expect, "chunk size {chunk}");
        }
    }

    #[test]
    fn decoder_rejects_oversized_len_before_buffering() {
        let h = Header::data(1, 2, (MAX_MSG_SIZE + 1) as u32);
        let mut d = FrameDecoder::default();
        let err = d.feed(&h.to_bytes(), &mut |_| panic!("no frame")).unwrap_err();
        assert_eq!(err, WireError::TooLong { len: MAX_MSG_SIZE as u32 + 1, max: MAX_MSG_SIZE as u32 });
    }

    #[test]
    fn direct_reads_complete_a_frame() {
        let h = Header::data(1, 2, 10);
        let mut d = FrameDecoder::default();
        d.feed(&h.to_bytes(), &mut |_| panic!()).unwrap();
        let (n, f) = d
            .read_direct(100, |buf| {
                assert_eq!(buf.len(), 10);
                buf[..4].copy_from_slice(b"abcd");
                Ok(4)
            })
            .unwrap();
        assert_eq!((n, f.is_none()), (4, true));
        assert_eq!(d.payload_remaining(), 6);
        let (n, f) = d
            .read_direct(100, |buf| {
                assert_eq!(buf.len(), 6);
                buf.copy_from_slice(b"efghij");
                Ok(6)
            })
            .unwrap();
        assert_eq!(n, 6);
        assert_eq!(f.unwrap().payload, b"abcdefghij");
        assert!(d.is_idle());
    }

    /// A read that claims more than its window, or a direct read with no
    /// payload in progress, is an error that commits nothing (it was an
    /// arithmetic underflow in `commit_direct`).
    #[test]
    fn direct_read_mismatch_is_an_error() {
        let mut d = FrameDecoder::default();
        let e = d.read_direct(100, |_| Ok(5)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        d.feed(&Header::data(1, 2, 10).to_bytes(), &mut |_| panic!()).unwrap();
        let e = d.read_direct(4, |b| Ok(b.len() + 1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!((d.payload_remaining(), d.consumed()), (10, 48));
        let e = d.read_direct(4, |_| Err(std::io::ErrorKind::WouldBlock.into())).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        let (n, f) = d
            .read_direct(100, |b| {
                b.copy_from_slice(b"0123456789");
                Ok(10)
            })
            .unwrap();
        assert_eq!((n, f.unwrap().payload), (10, b"0123456789".to_vec()));
    }

    /// A 1 MiB `h_len` followed by a trickle: the buffer grows with what
    /// arrived (at most twice it plus the minimal window), each direct read
    /// is offered a bounded window, and no byte is zero-filled twice.
    #[test]
    fn payload_memory_grows_with_arrivals() {
        let len = MAX_MSG_SIZE;
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        for step in [1usize, 100, 5000, 70_000] {
            let mut d = FrameDecoder::default();
            d.feed(&Header::data(1, 2, len as u32).to_bytes(), &mut |_| panic!()).unwrap();
            assert!(d.payload_capacity() <= PAYLOAD_WINDOW_MIN, "{}", d.payload_capacity());
            let (mut pos, mut reads, mut offered_new) = (0usize, 0usize, 0usize);
            let mut done = None;
            while done.is_none() {
                let before = d.payload_capacity();
                let mut window = 0;
                let (n, f) = d
                    .read_direct(MAX_MSG_SIZE, |buf| {
                        window = buf.len();
                        let n = step.min(buf.len());
                        buf[..n].copy_from_slice(&payload[pos..pos + n]);
                        Ok(n)
                    })
                    .unwrap();
                assert!(window <= pos.max(PAYLOAD_WINDOW_MIN), "window {window} after {pos} bytes");
                offered_new += d.payload_capacity().saturating_sub(before);
                pos += n;
                reads += 1;
                assert!(reads <= len, "bounded");
                if f.is_none() {
                    assert!(
                        d.payload_capacity() <= 2 * d.payload_received() + PAYLOAD_WINDOW_MIN,
                        "step {step}: {} bytes held for {} received",
                        d.payload_capacity(),
                        d.payload_received()
                    );
                }
                done = f;
            }
            let f = done.unwrap();
            assert!(f.payload == payload, "step {step}: payload differs");
            assert_eq!(pos, len);
            // Zero-filled (allocated) bytes in total: about the payload, not
            // the payload per read.
            assert!(offered_new <= 2 * len, "step {step}: {offered_new} bytes zero-filled");
        }
    }

    /// Fed in small pieces (the reactor's buffered path), a hostile 1 MiB
    /// `h_len` also holds only about what arrived.
    #[test]
    fn fed_payload_memory_grows_with_arrivals() {
        let mut d = FrameDecoder::default();
        d.feed(&Header::data(1, 2, MAX_MSG_SIZE as u32).to_bytes(), &mut |_| panic!()).unwrap();
        for i in 0..100_000usize {
            d.feed(&[i as u8], &mut |_| panic!()).unwrap();
            assert!(d.payload_capacity() <= 2 * d.payload_received() + PAYLOAD_WINDOW_MIN);
        }
        assert_eq!(d.payload_received(), 100_000);
    }
}
