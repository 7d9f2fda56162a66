//! The wire formats and arithmetic of rds-stress, kept apart from the
//! binary so they can be unit tested.
//!
//! Everything here follows rds-tools' rds-stress (facts, not code): the
//! packed 63-byte test header at the start of every message, the payload
//! pattern of `-v`, the options block the active side sends over the TCP
//! control connection, the power-of-two RTT buckets and the column layout
//! of the statistics lines.

use std::net::Ipv4Addr;

/// Size of the packed IPv4 test header (`MIN_MSG_BYTES`), also the default
/// and the minimum of the ack and request sizes.
pub const HEADER_SIZE: usize = 63;
/// A request: the receiver answers it with an ack.
pub const OP_REQ: u8 = 1;
/// The answer to a request.
pub const OP_ACK: u8 = 2;
/// Buckets of the RTT histogram: [1, 2), [2, 4), ... microseconds.
pub const MAX_BUCKETS: usize = 16;
/// The largest RDS message (the kernel's `RDS_MAX_MSG_SIZE`).
pub const MAX_MSG_SIZE: usize = 1 << 20;

/// The test header: sequence number per (sender, receiver) pair, both
/// endpoints, the slot in the request pipeline and the operation, then
/// the RDMA fields of `-D` (the original copies them in host byte order:
/// little-endian here): the op the requester asks for ([`RDMA_OP_READ`],
/// [`RDMA_OP_WRITE`]), its buffer's address (for its own checks), the
/// remote address to use (0: the start of the MR), the pattern of `-v`,
/// the cookie (0 on the wire of a request: it travels as RDMA_DEST /
/// RDMA_MAP), the size and the vector count. The async fields stay 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub seq: u32,
    pub from_addr: Ipv4Addr,
    pub to_addr: Ipv4Addr,
    pub from_port: u16,
    pub to_port: u16,
    pub index: u16,
    pub op: u8,
    pub rdma_op: u8,
    pub rdma_addr: u64,
    pub rdma_phyaddr: u64,
    pub rdma_pattern: u64,
    pub rdma_key: u64,
    pub rdma_size: u32,
    pub rdma_vector: u32,
}

/// `rdma_op` of a request: the passive side RDMA-reads the requester's buffer.
pub const RDMA_OP_READ: u8 = 1;
/// `rdma_op` of a request: the passive side RDMA-writes the requester's buffer.
pub const RDMA_OP_WRITE: u8 = 2;

impl Default for Header {
    fn default() -> Header {
        Header {
            seq: 0,
            from_addr: Ipv4Addr::UNSPECIFIED,
            to_addr: Ipv4Addr::UNSPECIFIED,
            from_port: 0,
            to_port: 0,
            index: 0,
            op: 0,
            rdma_op: 0,
            rdma_addr: 0,
            rdma_phyaddr: 0,
            rdma_pattern: 0,
            rdma_key: 0,
            rdma_size: 0,
            rdma_vector: 0,
        }
    }
}

impl Header {
    /// Writes the packed header (network byte order) into `buf[..63]`.
    pub fn encode(&self, buf: &mut [u8]) {
        let b = &mut buf[..HEADER_SIZE];
        b.fill(0);
        b[0..4].copy_from_slice(&self.seq.to_be_bytes());
        b[4..8].copy_from_slice(&self.from_addr.octets());
        b[8..12].copy_from_slice(&self.to_addr.octets());
        b[12..14].copy_from_slice(&self.from_port.to_be_bytes());
        b[14..16].copy_from_slice(&self.to_port.to_be_bytes());
        b[16..18].copy_from_slice(&self.index.to_be_bytes());
        b[18] = self.op;
        b[19] = self.rdma_op;
        b[20..28].copy_from_slice(&self.rdma_addr.to_le_bytes());
        b[28..36].copy_from_slice(&self.rdma_phyaddr.to_le_bytes());
        b[36..44].copy_from_slice(&self.rdma_pattern.to_le_bytes());
        b[44..52].copy_from_slice(&self.rdma_key.to_le_bytes());
        b[52..56].copy_from_slice(&self.rdma_size.to_le_bytes());
        b[56..60].copy_from_slice(&self.rdma_vector.to_le_bytes());
        // retry 60, rdma_remote_err 61, pending 62
    }

    /// Reads a packed header; `None` if `buf` is shorter than 63 bytes.
    pub fn decode(buf: &[u8]) -> Option<Header> {
        if buf.len() < HEADER_SIZE {
            return None;
        }
        let u16_at = |i: usize| u16::from_be_bytes([buf[i], buf[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(buf[i..i + 4].try_into().unwrap());
        let ip_at = |i: usize| Ipv4Addr::new(buf[i], buf[i + 1], buf[i + 2], buf[i + 3]);
        Some(Header {
            seq: u32_at(0),
            from_addr: ip_at(4),
            to_addr: ip_at(8),
            from_port: u16_at(12),
            to_port: u16_at(14),
            index: u16_at(16),
            op: buf[18],
            rdma_op: buf[19],
            rdma_addr: u64::from_le_bytes(buf[20..28].try_into().unwrap()),
            rdma_phyaddr: u64::from_le_bytes(buf[28..36].try_into().unwrap()),
            rdma_pattern: u64::from_le_bytes(buf[36..44].try_into().unwrap()),
            rdma_key: u64::from_le_bytes(buf[44..52].try_into().unwrap()),
            rdma_size: u32::from_le_bytes(buf[52..56].try_into().unwrap()),
            rdma_vector: u32::from_le_bytes(buf[56..60].try_into().unwrap()),
        })
    }

    /// The fields the receiver can predict (seq, addresses, ports, index,
    /// op): the original compares exactly these.
    pub fn basic_eq(&self, other: &Header) -> bool {
        (self.seq, self.from_addr, self.to_addr, self.from_port, self.to_port, self.index, self.op)
            == (other.seq, other.from_addr, other.to_addr, other.from_port, other.to_port, other.index, other.op)
    }

    /// The original's table of expected and received fields.
    pub fn mismatch_report(expected: &Header, got: &Header) -> String {
        fn row(name: &str, e: String, g: String) -> String {
            let eq = if e == g { " =" } else { "!=" };
            format!("{name:>10} {e:>15} {eq} {g:>15}\n")
        }
        let mut s = String::from(
            "An incoming message had a header which\ndidn't contain the fields we expected:\n    member        expected eq             got\n",
        );
        s += &row("seq", expected.seq.to_string(), got.seq.to_string());
        s += &row("from_addr", expected.from_addr.to_string(), got.from_addr.to_string());
        s += &row("from_port", expected.from_port.to_string(), got.from_port.to_string());
        s += &row("to_addr", expected.to_addr.to_string(), got.to_addr.to_string());
        s += &row("to_port", expected.to_port.to_string(), got.to_port.to_string());
        s += &row("index", expected.index.to_string(), got.index.to_string());
        s += &row("op", expected.op.to_string(), got.op.to_string());
        s
    }
}

/// The payload pattern of `-v`: `k = 11`, then `k = 41 * (k + 3) + (i >> 8)`
/// (a generator of Z(256), shifted by one in every 256-byte block so swapped
/// blocks show). The payload after the header is `pattern[..len - 63]`.
pub fn pattern(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut k: u32 = 11;
    for i in 0..len {
        v.push(k as u8);
        let next = i as u32 + 1;
        k = 41u32.wrapping_mul(k.wrapping_add(3)).wrapping_add(next >> 8) & 0xff;
    }
    v
}

/// Compares a received payload (after the header) with the pattern:
/// `None` if equal, else (first bad offset, bytes that differ).
pub fn check_pattern(payload: &[u8], pattern: &[u8]) -> Option<(usize, usize)> {
    let want = &pattern[..payload.len().min(pattern.len())];
    if payload.len() <= pattern.len() && payload == want {
        return None;
    }
    let mut first = None;
    let mut count = 0;
    for (i, b) in payload.iter().enumerate() {
        if pattern.get(i) != Some(b) {
            first.get_or_insert(i);
            count += 1;
        }
    }
    first.map(|f| (f, count))
}

/// The RTT bucket of the histogram: floor(log2(usec)), 0 for 0; values
/// beyond the last bucket land in it (the original indexes past its array).
pub fn bucket(rtt_usec: u64) -> usize {
    if rtt_usec == 0 { 0 } else { (63 - rtt_usec.leading_zeros() as usize).min(MAX_BUCKETS - 1) }
}

/// The column titles of the per-second lines.
pub fn stats_header() -> String {
    format!(
        "{:>4} {:>6} {:>6} {:>10} {:>10} {:>10} {:>7} {:>8} {:>5}",
        "tsks", "tx/s", "rx/s", "tx+rx K/s", "mbi K/s", "mbo K/s", "tx us/c", "rtt us", "cpu %"
    )
}

/// One statistics line (`%4u %6u %6u %10.2f %10.2f %10.2f %7.2f %8.2f %5.2f`).
#[allow(clippy::too_many_arguments)]
pub fn stats_line(
    tasks: u32,
    tx: u64,
    rx: u64,
    kbs: f64,
    mbi: f64,
    mbo: f64,
    tx_us: f64,
    rtt_us: f64,
    cpu: f64,
) -> String {
    format!("{tasks:>4} {tx:>6} {rx:>6} {kbs:>10.2} {mbi:>10.2} {mbo:>10.2} {tx_us:>7.2} {rtt_us:>8.2} {cpu:>5.2}")
}

/// Length of the options block of the original's first protocol version
/// (from `req_depth` up to, excluding, `tos`); what this rds-stress sends
/// when no TOS is asked for, and what every version of the original
/// passive side understands.
pub const OPTIONS_V1_SIZE: usize = 59;
/// The second version: a 16-byte version string, the V1 block, `tos` and
/// `async`.
pub const OPTIONS_V2_SIZE: usize = 77;
/// Length of the version string of V2.
pub const VERSION_LEN: usize = 16;
/// The version string sent in a V2 block (the rds-tools release whose
/// options layout this follows; an original passive side only reads V2
/// from an active side of its own version).
pub const WIRE_VERSION: &str = "2.0.7";

/// The options the active side tells the passive side (all of them: the
/// passive side runs with the active side's settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireOptions {
    pub req_depth: u32,
    pub req_size: u32,
    pub ack_size: u32,
    pub rdma_size: u32,
    /// The address the sender sends to (the passive side's).
    pub send_addr: Ipv4Addr,
    /// The sender's own address.
    pub receive_addr: Ipv4Addr,
    pub starting_port: u16,
    pub nr_tasks: u16,
    pub run_time: u32,
    pub summary_only: u8,
    pub rtprio: u8,
    pub tracing: u8,
    pub verify: u8,
    pub show_params: u8,
    pub show_perfdata: u8,
    pub use_cong_monitor: u8,
    pub rdma_use_once: u8,
    pub rdma_use_get_mr: u8,
    pub rdma_use_fence: u8,
    pub rdma_cache_mrs: u8,
    pub rdma_key_o_meter: u8,
    pub suppress_warnings: u8,
    pub simplex: u8,
    pub rw_mode: u8,
    pub rdma_vector: u32,
    pub rdma_alignment: u32,
    pub connect_retries: u32,
    pub tos: u8,
    pub async_send: u8,
}

impl Default for WireOptions {
    /// All zero (the unspecified address for both addresses).
    fn default() -> WireOptions {
        WireOptions::decode_v1(&[0u8; OPTIONS_V1_SIZE])
    }
}

impl WireOptions {
    /// The V1 block (network byte order).
    pub fn encode_v1(&self) -> [u8; OPTIONS_V1_SIZE] {
        let mut b = [0u8; OPTIONS_V1_SIZE];
        b[0..4].copy_from_slice(&self.req_depth.to_be_bytes());
        b[4..8].copy_from_slice(&self.req_size.to_be_bytes());
        b[8..12].copy_from_slice(&self.ack_size.to_be_bytes());
        b[12..16].copy_from_slice(&self.rdma_size.to_be_bytes());
        b[16..20].copy_from_slice(&self.send_addr.octets());
        b[20..24].copy_from_slice(&self.receive_addr.octets());
        b[24..26].copy_from_slice(&self.starting_port.to_be_bytes());
        b[26..28].copy_from_slice(&self.nr_tasks.to_be_bytes());
        b[28..32].copy_from_slice(&self.run_time.to_be_bytes());
        let flags = [
            self.summary_only,
            self.rtprio,
            self.tracing,
            self.verify,
            self.show_params,
            self.show_perfdata,
            self.use_cong_monitor,
            self.rdma_use_once,
            self.rdma_use_get_mr,
            self.rdma_use_fence,
            self.rdma_cache_mrs,
            self.rdma_key_o_meter,
            self.suppress_warnings,
            self.simplex,
            self.rw_mode,
        ];
        b[32..47].copy_from_slice(&flags);
        b[47..51].copy_from_slice(&self.rdma_vector.to_be_bytes());
        b[51..55].copy_from_slice(&self.rdma_alignment.to_be_bytes());
        b[55..59].copy_from_slice(&self.connect_retries.to_be_bytes());
        b
    }

    /// The V2 block: version string, V1, tos, async.
    pub fn encode_v2(&self) -> Vec<u8> {
        let mut v = vec![0u8; VERSION_LEN];
        v[..WIRE_VERSION.len()].copy_from_slice(WIRE_VERSION.as_bytes());
        v.extend_from_slice(&self.encode_v1());
        v.push(self.tos);
        v.push(self.async_send);
        debug_assert_eq!(v.len(), OPTIONS_V2_SIZE);
        v
    }

    /// Decodes a V1 block; `tos` and `async_send` stay 0.
    pub fn decode_v1(b: &[u8; OPTIONS_V1_SIZE]) -> WireOptions {
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let ip_at = |i: usize| Ipv4Addr::new(b[i], b[i + 1], b[i + 2], b[i + 3]);
        WireOptions {
            req_depth: u32_at(0),
            req_size: u32_at(4),
            ack_size: u32_at(8),
            rdma_size: u32_at(12),
            send_addr: ip_at(16),
            receive_addr: ip_at(20),
            starting_port: u16_at(24),
            nr_tasks: u16_at(26),
            run_time: u32_at(28),
            summary_only: b[32],
            rtprio: b[33],
            tracing: b[34],
            verify: b[35],
            show_params: b[36],
            show_perfdata: b[37],
            use_cong_monitor: b[38],
            rdma_use_once: b[39],
            rdma_use_get_mr: b[40],
            rdma_use_fence: b[41],
            rdma_cache_mrs: b[42],
            rdma_key_o_meter: b[43],
            suppress_warnings: b[44],
            simplex: b[45],
            rw_mode: b[46],
            rdma_vector: u32_at(47),
            rdma_alignment: u32_at(51),
            connect_retries: u32_at(55),
            tos: 0,
            async_send: 0,
        }
    }
}

/// Whether the first 16 bytes the passive side read are a V2 version
/// string (printable ASCII starting with a digit, NUL terminated) rather
/// than the start of a V1 block (whose first byte is the top byte of the
/// request depth, 0 for any sane depth).
pub fn is_version_string(first: &[u8]) -> bool {
    let Some(nul) = first.iter().position(|&c| c == 0) else { return false };
    nul > 0 && first[0].is_ascii_digit() && first[..nul].iter().all(|c| c.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_layout() {
        let h = Header {
            seq: 0x01020304,
            from_addr: Ipv4Addr::new(10, 0, 0, 1),
            to_addr: Ipv4Addr::new(10, 0, 0, 2),
            from_port: 4001,
            to_port: 4002,
            index: 7,
            op: OP_ACK,
            ..Header::default()
        };
        let mut b = [0xffu8; HEADER_SIZE + 4];
        h.encode(&mut b);
        assert_eq!(&b[0..4], &[1, 2, 3, 4]);
        assert_eq!(&b[4..8], &[10, 0, 0, 1]);
        assert_eq!(&b[12..14], &4001u16.to_be_bytes());
        assert_eq!(&b[16..18], &[0, 7]);
        assert_eq!(b[18], 2);
        assert!(b[19..HEADER_SIZE].iter().all(|&x| x == 0));
        assert_eq!(b[HEADER_SIZE], 0xff, "writes exactly 63 bytes");
        assert_eq!(Header::decode(&b).unwrap(), h);
        assert!(Header::decode(&b[..62]).is_none());
        // The RDMA fields, little-endian at their offsets.
        let r = Header {
            rdma_op: RDMA_OP_WRITE,
            rdma_addr: 0x1122,
            rdma_pattern: 7,
            rdma_key: 0x64_0000_0a0b,
            rdma_size: 4096,
            rdma_vector: 2,
            ..h
        };
        r.encode(&mut b);
        assert_eq!(
            (b[19], &b[20..22], &b[44..49], &b[52..54], b[56]),
            (2, &[0x22, 0x11][..], &[0x0b, 0x0a, 0, 0, 0x64][..], &[0, 0x10][..], 2)
        );
        assert_eq!(Header::decode(&b).unwrap(), r);
        let mut g = h;
        g.seq += 1;
        assert!(!h.basic_eq(&g));
        let r = Header::mismatch_report(&h, &g);
        assert!(r.contains("       seq        16909060 !=        16909061\n"), "{r}");
        assert!(r.contains(" from_addr        10.0.0.1  =        10.0.0.1\n"), "{r}");
    }

    #[test]
    fn pattern_is_the_originals() {
        let p = pattern(600);
        // k0 = 11; k1 = 41 * 14 = 574 = 62 (mod 256); k2 = 41 * 65 = 2665 = 105.
        assert_eq!(&p[..3], &[11, 62, 105]);
        // From i = 256 on, (i >> 8) = 1 is added.
        let mut k: u32 = 11;
        for (i, &b) in p.iter().enumerate() {
            assert_eq!(b, k as u8, "byte {i}");
            k = (41 * (k + 3) + ((i as u32 + 1) >> 8)) % 256;
        }
        assert_eq!(check_pattern(&p[..100], &p), None);
        let mut bad = p[..100].to_vec();
        bad[40] ^= 1;
        bad[41] ^= 1;
        assert_eq!(check_pattern(&bad, &p), Some((40, 2)));
    }

    #[test]
    fn buckets() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2), 1);
        assert_eq!(bucket(3), 1);
        assert_eq!(bucket(1023), 9);
        assert_eq!(bucket(1024), 10);
        assert_eq!(bucket(1 << 40), MAX_BUCKETS - 1);
    }

    #[test]
    fn columns() {
        assert_eq!(stats_header(), "tsks   tx/s   rx/s  tx+rx K/s    mbi K/s    mbo K/s tx us/c   rtt us cpu %");
        assert_eq!(
            stats_line(1, 12345, 12344, 13622.5, 0.0, 0.0, 3.456, 80.0, -1.0),
            "   1  12345  12344   13622.50       0.00       0.00    3.46    80.00 -1.00"
        );
    }

    #[test]
    fn options_roundtrip() {
        let o = WireOptions {
            req_depth: 4,
            req_size: 1 << 20,
            ack_size: 63,
            send_addr: Ipv4Addr::new(127, 0, 0, 2),
            receive_addr: Ipv4Addr::new(127, 0, 0, 3),
            starting_port: 4000,
            nr_tasks: 3,
            run_time: 9,
            verify: 1,
            use_cong_monitor: 1,
            rdma_use_fence: 1,
            simplex: 1,
            rdma_vector: 1,
            connect_retries: 5,
            ..WireOptions::default()
        };
        let v1 = o.encode_v1();
        assert_eq!(&v1[16..20], &[127, 0, 0, 2]);
        assert_eq!(&v1[24..26], &4000u16.to_be_bytes());
        assert_eq!(WireOptions::decode_v1(&v1), o);
        assert!(!is_version_string(&v1[..16]));
        let mut t = o.clone();
        t.tos = 3;
        let v2 = t.encode_v2();
        assert_eq!(v2.len(), OPTIONS_V2_SIZE);
        assert!(is_version_string(&v2[..16]));
        assert_eq!(&v2[16..75], &v1[..]);
        assert_eq!(v2[75], 3);
    }
}
