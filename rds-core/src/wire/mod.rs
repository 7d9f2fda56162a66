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

mod ext;
mod frame;

pub use ext::*;
pub use frame::*;

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
}
