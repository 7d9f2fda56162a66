//! The RDMA CM private data of an RDS-IB connection and the protocol
//! version negotiation carried in it.
//!
//! The active side puts a `struct rds_ib_connect_private` (IPv4, 32 bytes)
//! or `struct rds6_ib_connect_private` (IPv6, 56 bytes) into its connect
//! request; the passive side answers with the same structure in its accept.
//! Both forms are the two addresses followed by a common 24-byte part; all
//! multi-byte fields are big-endian, the last 4 bytes are structure padding
//! (sent as zero, ignored on receive):
//!
//! | v4 off | v6 off | size | field                                     |
//! |--------|--------|------|-------------------------------------------|
//! | 0      | 0      | 4/16 | saddr (sender's address)                  |
//! | 4      | 16     | 4/16 | daddr (receiver's address)                |
//! | 8      | 32     | 1    | protocol major                            |
//! | 9      | 33     | 1    | protocol minor                            |
//! | 10     | 34     | 2    | protocol minor mask (supported minors)    |
//! | 12     | 36     | 1    | tos                                       |
//! | 13     | 37     | 1    | reserved                                  |
//! | 14     | 38     | 2    | reserved (UEK: negotiated fragment size)  |
//! | 16     | 40     | 8    | ack_seq: last sequence the sender received|
//! | 24     | 48     | 4    | credit: initial posted receives (0 = no flow control) |
//! | 28     | 52     | 4    | padding                                   |
//!
//! Version negotiation follows mainline `rds_ib_protocol_compatible` (passive
//! side), `rds_ib_cm_connect_complete` (both sides) and the REJECTED branch of
//! the RDMA CM event handler (active side): see [`passive_negotiate`],
//! [`version_usable`] and [`ActiveNegotiation`].
//!
//! Decoders never panic: short or garbage input gives a typed error or the
//! kernel's answer for it.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rds_core::wire::{PROTOCOL_3_0, PROTOCOL_3_1, PROTOCOL_4_0, PROTOCOL_4_1};

/// Size of `struct rds_ib_connect_private` (IPv4).
pub const PRIVATE_V4_LEN: usize = 32;
/// Size of `struct rds6_ib_connect_private` (IPv6).
pub const PRIVATE_V6_LEN: usize = 56;
/// Minor versions this implementation (and mainline) supports, as the bit
/// mask sent in `protocol_minor_mask` (`RDS_IB_SUPPORTED_PROTOCOLS`):
/// minors 0 and 1 of major 4.
pub const SUPPORTED_MINOR_MASK: u16 = 0x0003;
/// The version an active side proposes first (`RDS_PROTOCOL_VERSION`, 4.1).
pub const PROPOSED_VERSION: u16 = PROTOCOL_4_1;
/// The compatibility version (`RDS_PROTOCOL_COMPAT_VERSION`, 3.1).
pub const COMPAT_VERSION: u16 = PROTOCOL_3_1;
/// The consumer-defined reject value meaning "incompatible protocol version"
/// (`RDS_RDMA_REJ_INCOMPAT`).
pub const REJ_INCOMPAT: i32 = 1;

/// `RDS_PROTOCOL(major, minor)`.
pub const fn version(major: u8, minor: u8) -> u16 {
    ((major as u16) << 8) | minor as u16
}

/// The major number of a version.
pub const fn major(v: u16) -> u8 {
    (v >> 8) as u8
}

/// The minor number of a version.
pub const fn minor(v: u16) -> u8 {
    v as u8
}

/// Address family of a connection; selects the private data layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Size of the private data structure of this family.
    pub const fn private_len(self) -> usize {
        match self {
            Family::V4 => PRIVATE_V4_LEN,
            Family::V6 => PRIVATE_V6_LEN,
        }
    }

    /// Offset of the common part (protocol major) in the structure.
    const fn cmn_offset(self) -> usize {
        match self {
            Family::V4 => 8,
            Family::V6 => 32,
        }
    }
}

/// The two addresses of the private data, in the structure's family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrivAddrs {
    V4 { saddr: Ipv4Addr, daddr: Ipv4Addr },
    V6 { saddr: Ipv6Addr, daddr: Ipv6Addr },
}

impl PrivAddrs {
    /// Builds from two addresses of the same family; `None` when they differ.
    pub fn new(saddr: IpAddr, daddr: IpAddr) -> Option<PrivAddrs> {
        match (saddr, daddr) {
            (IpAddr::V4(saddr), IpAddr::V4(daddr)) => Some(PrivAddrs::V4 { saddr, daddr }),
            (IpAddr::V6(saddr), IpAddr::V6(daddr)) => Some(PrivAddrs::V6 { saddr, daddr }),
            _ => None,
        }
    }

    pub fn family(&self) -> Family {
        match self {
            PrivAddrs::V4 { .. } => Family::V4,
            PrivAddrs::V6 { .. } => Family::V6,
        }
    }

    pub fn saddr(&self) -> IpAddr {
        match *self {
            PrivAddrs::V4 { saddr, .. } => IpAddr::V4(saddr),
            PrivAddrs::V6 { saddr, .. } => IpAddr::V6(saddr),
        }
    }

    pub fn daddr(&self) -> IpAddr {
        match *self {
            PrivAddrs::V4 { daddr, .. } => IpAddr::V4(daddr),
            PrivAddrs::V6 { daddr, .. } => IpAddr::V6(daddr),
        }
    }
}

/// A decoded `rds_ib_connect_private` / `rds6_ib_connect_private`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectPrivate {
    pub addrs: PrivAddrs,
    pub protocol_major: u8,
    pub protocol_minor: u8,
    /// Bit `n` set: minor `n` of `protocol_major` is supported.
    pub protocol_minor_mask: u16,
    /// Type of service of the connection (`dp_tos`).
    pub tos: u8,
    pub reserved1: u8,
    /// Reserved in mainline; UEK puts the negotiated fragment size here.
    pub reserved2: u16,
    /// The last sequence number the sender received on this connection
    /// (processed by the receiver as an ack; 0 = none).
    pub ack_seq: u64,
    /// The sender's initial posted receive credits; 0 turns flow control off.
    pub credit: u32,
}

/// Errors of the private data decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrivateError {
    /// No private data at all.
    Empty,
    /// Fewer bytes than the structure of the family.
    Truncated { have: usize, need: usize },
}

impl fmt::Display for PrivateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PrivateError::Empty => f.write_str("RDS-IB connection without private data"),
            PrivateError::Truncated { have, need } => {
                write!(f, "RDS-IB private data of {have} bytes (need {need})")
            }
        }
    }
}

impl std::error::Error for PrivateError {}

impl ConnectPrivate {
    /// The private data a side sends (`rds_ib_cm_fill_conn_param`): the
    /// given version, the supported minor mask, the tos, the last received
    /// sequence and the credits to advertise (0 when flow control is off).
    pub fn new(addrs: PrivAddrs, version: u16, tos: u8, ack_seq: u64, credit: u32) -> ConnectPrivate {
        ConnectPrivate {
            addrs,
            protocol_major: major(version),
            protocol_minor: minor(version),
            protocol_minor_mask: SUPPORTED_MINOR_MASK,
            tos,
            reserved1: 0,
            reserved2: 0,
            ack_seq,
            credit,
        }
    }

    pub fn family(&self) -> Family {
        self.addrs.family()
    }

    /// `RDS_PROTOCOL(major, minor)` of the structure.
    pub fn version(&self) -> u16 {
        version(self.protocol_major, self.protocol_minor)
    }

    /// Encodes into the family's exact size (32 or 56 bytes), padding zeroed.
    pub fn encode(&self) -> Vec<u8> {
        let fam = self.family();
        let mut b = vec![0u8; fam.private_len()];
        match self.addrs {
            PrivAddrs::V4 { saddr, daddr } => {
                b[0..4].copy_from_slice(&saddr.octets());
                b[4..8].copy_from_slice(&daddr.octets());
            }
            PrivAddrs::V6 { saddr, daddr } => {
                b[0..16].copy_from_slice(&saddr.octets());
                b[16..32].copy_from_slice(&daddr.octets());
            }
        }
        let c = &mut b[fam.cmn_offset()..];
        c[0] = self.protocol_major;
        c[1] = self.protocol_minor;
        c[2..4].copy_from_slice(&self.protocol_minor_mask.to_be_bytes());
        c[4] = self.tos;
        c[5] = self.reserved1;
        c[6..8].copy_from_slice(&self.reserved2.to_be_bytes());
        c[8..16].copy_from_slice(&self.ack_seq.to_be_bytes());
        c[16..20].copy_from_slice(&self.credit.to_be_bytes());
        b
    }

    /// Decodes the structure of `family` from the start of `buf`. RDMA CM
    /// hands over a buffer larger than what the peer sent (zero-filled), so
    /// extra bytes are ignored; fewer bytes are an error.
    pub fn decode(buf: &[u8], family: Family) -> Result<ConnectPrivate, PrivateError> {
        let need = family.private_len();
        if buf.is_empty() {
            return Err(PrivateError::Empty);
        }
        let b = buf.get(..need).ok_or(PrivateError::Truncated { have: buf.len(), need })?;
        let addrs = match family {
            Family::V4 => PrivAddrs::V4 { saddr: ipv4_at(b, 0), daddr: ipv4_at(b, 4) },
            Family::V6 => PrivAddrs::V6 { saddr: ipv6_at(b, 0), daddr: ipv6_at(b, 16) },
        };
        let c = &b[family.cmn_offset()..];
        let mut ack = [0u8; 8];
        ack.copy_from_slice(&c[8..16]);
        let mut credit = [0u8; 4];
        credit.copy_from_slice(&c[16..20]);
        Ok(ConnectPrivate {
            addrs,
            protocol_major: c[0],
            protocol_minor: c[1],
            protocol_minor_mask: u16::from_be_bytes([c[2], c[3]]),
            tos: c[4],
            reserved1: c[5],
            reserved2: u16::from_be_bytes([c[6], c[7]]),
            ack_seq: u64::from_be_bytes(ack),
            credit: u32::from_be_bytes(credit),
        })
    }
}

fn ipv4_at(b: &[u8], o: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[o], b[o + 1], b[o + 2], b[o + 3])
}

fn ipv6_at(b: &[u8], o: usize) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[o..o + 16]);
    Ipv6Addr::from(a)
}

/// Why the passive side rejects a connect request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incompatible {
    /// The request carried no private data at all.
    NoPrivateData,
    /// A version we do not speak (neither 4.x with a common minor nor 3.1).
    Version { major: u8, minor: u8 },
}

impl Incompatible {
    /// The consumer-defined reject value the kernel sends for it (always
    /// [`REJ_INCOMPAT`]).
    pub fn reject_value(&self) -> i32 {
        REJ_INCOMPAT
    }
}

/// The passive side's choice of version for a connect request
/// (`rds_ib_protocol_compatible`, mainline since the 4.x protocol):
///
/// * no private data: reject;
/// * shorter than the family's structure, or major 0 (an old peer that sent
///   zeros): 4.0 (pre-4.x kernels answered 3.0 here). Such a connection is
///   later refused by [`version_usable`], as the kernel destroys it when it
///   completes;
/// * major 4 with minors in common with ours: 4.(highest common minor),
///   whatever the request's own minor says;
/// * exactly 3.1: 3.1;
/// * anything else: reject with [`REJ_INCOMPAT`].
pub fn passive_negotiate(data: &[u8], family: Family) -> Result<u16, Incompatible> {
    if data.is_empty() {
        return Err(Incompatible::NoPrivateData);
    }
    let dp = match ConnectPrivate::decode(data, family) {
        Ok(dp) if dp.protocol_major != 0 => dp,
        _ => return Ok(PROTOCOL_4_0),
    };
    let common = dp.protocol_minor_mask & SUPPORTED_MINOR_MASK;
    if dp.protocol_major == 4 && common != 0 {
        // 4.0 plus the index of the highest common bit.
        let highest = 15 - common.leading_zeros() as u16;
        Ok(PROTOCOL_4_0 + highest)
    } else if dp.version() == COMPAT_VERSION {
        Ok(COMPAT_VERSION)
    } else {
        Err(Incompatible::Version { major: dp.protocol_major, minor: dp.protocol_minor })
    }
}

/// Whether a connection that completed with `version` may carry traffic
/// (`rds_ib_cm_connect_complete`): 4.1 or later, or exactly 3.1. Anything
/// else is destroyed by the kernel ("version no longer supported").
pub fn version_usable(version: u16) -> bool {
    version >= PROPOSED_VERSION || version == COMPAT_VERSION
}

/// The consumer-defined reject data the passive side sends: the reject value
/// as a C `int` in the sender's byte order, little-endian on every platform
/// the kernel interop targets (x86-64, arm64).
pub fn reject_data(value: i32) -> [u8; 4] {
    value.to_le_bytes()
}

/// What the active side does with a REJECTED event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectAction {
    /// Drop the connection attempt (and reconnect later); `fallback` says the
    /// next attempt proposes 3.1.
    Drop { fallback: bool },
    /// A reject the kernel only logs (reject data with a value above 1):
    /// the attempt stays pending until the connect times out or is retried.
    Ignore,
}

/// What the active side learned from the accept's private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Established {
    /// The connection's protocol version.
    pub version: u16,
    /// The peer's initial credits (0: no flow control).
    pub peer_credit: u32,
    /// The peer's last received sequence (0: none), to be processed as an ack.
    pub ack_seq: u64,
}

/// Why a completed connection is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub version: u16,
}

/// The active side's half of the negotiation, kept per connection across
/// connect attempts (`c_proposed_version`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveNegotiation {
    proposed: u16,
}

impl Default for ActiveNegotiation {
    fn default() -> Self {
        ActiveNegotiation { proposed: PROPOSED_VERSION }
    }
}

impl ActiveNegotiation {
    pub fn new() -> ActiveNegotiation {
        ActiveNegotiation::default()
    }

    /// The version the next connect request proposes.
    pub fn proposed(&self) -> u16 {
        self.proposed
    }

    /// The private data of the next connect request.
    pub fn request(&self, addrs: PrivAddrs, tos: u8, ack_seq: u64, credit: u32) -> ConnectPrivate {
        ConnectPrivate::new(addrs, self.proposed, tos, ack_seq, credit)
    }

    /// A REJECTED event with the consumer reject data `data` (`None` when the
    /// reject carried none). The kernel drops the attempt when there is no
    /// data or when at least 4 bytes hold an `int` <= 1 (0 from old kernels
    /// that rejected without data, 1 = [`REJ_INCOMPAT`], negative errnos);
    /// then, if the connection's tos is 0, it proposes 3.1 from now on.
    pub fn on_reject(&mut self, data: Option<&[u8]>, tos: u8) -> RejectAction {
        let drop = match data {
            None => true,
            Some(d) => match d.get(..4) {
                Some(b) => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) <= REJ_INCOMPAT,
                None => false,
            },
        };
        if !drop {
            return RejectAction::Ignore;
        }
        let fallback = tos == 0;
        if fallback {
            self.proposed = COMPAT_VERSION;
        }
        RejectAction::Drop { fallback }
    }

    /// The ESTABLISHED event with the accept's private data. The version is
    /// the one proposed unless the accept carries a full structure with a
    /// non-zero major, which then wins; credits and ack_seq count only from
    /// a full structure. A version [`version_usable`] refuses is an error
    /// (the kernel destroys the connection). On success later attempts
    /// propose the negotiated version.
    pub fn on_established(&mut self, data: &[u8], family: Family) -> Result<Established, Unsupported> {
        let mut est = Established { version: self.proposed, peer_credit: 0, ack_seq: 0 };
        if let Ok(dp) = ConnectPrivate::decode(data, family) {
            if dp.protocol_major != 0 {
                est.version = dp.version();
                est.peer_credit = dp.credit;
            }
            est.ack_seq = dp.ack_seq;
        }
        if !version_usable(est.version) {
            return Err(Unsupported { version: est.version });
        }
        self.proposed = est.version;
        Ok(est)
    }
}

/// The version a pre-4.x passive kernel answered for short or all-zero
/// private data; kept for documentation and tests of old-peer behaviour.
pub const LEGACY_DEFAULT_VERSION: u16 = PROTOCOL_3_0;

#[cfg(test)]
mod tests {
    use super::*;

    fn v4() -> PrivAddrs {
        PrivAddrs::V4 { saddr: Ipv4Addr::new(10, 0, 0, 1), daddr: Ipv4Addr::new(10, 0, 0, 2) }
    }

    fn v6() -> PrivAddrs {
        PrivAddrs::V6 { saddr: "fd00::1".parse().unwrap(), daddr: "fd00::2".parse().unwrap() }
    }

    /// The IPv4 layout, byte by byte from the documented field table.
    #[test]
    fn ipv4_vector_is_byte_exact() {
        let dp = ConnectPrivate {
            addrs: v4(),
            protocol_major: 4,
            protocol_minor: 1,
            protocol_minor_mask: 0x0003,
            tos: 7,
            reserved1: 0,
            reserved2: 0,
            ack_seq: 0x0102_0304_0506_0708,
            credit: 0x0000_0400,
        };
        let expect: [u8; 32] = [
            10, 0, 0, 1, // saddr
            10, 0, 0, 2, // daddr
            4, 1, // major, minor
            0x00, 0x03, // minor mask be16
            7, 0, // tos, reserved1
            0, 0, // reserved2
            1, 2, 3, 4, 5, 6, 7, 8, // ack_seq be64
            0, 0, 4, 0, // credit be32
            0, 0, 0, 0, // padding
        ];
        assert_eq!(dp.encode(), expect);
        assert_eq!(ConnectPrivate::decode(&expect, Family::V4), Ok(dp));
    }

    #[test]
    fn ipv6_vector_is_byte_exact() {
        let dp = ConnectPrivate::new(v6(), PROTOCOL_3_1, 0, 0xdead_beef_0000_0001, 0x0102_0304);
        let mut expect = [0u8; 56];
        expect[0..2].copy_from_slice(&[0xfd, 0x00]);
        expect[15] = 1;
        expect[16..18].copy_from_slice(&[0xfd, 0x00]);
        expect[31] = 2;
        expect[32] = 3; // major
        expect[33] = 1; // minor
        expect[34..36].copy_from_slice(&[0x00, 0x03]); // mask
        // tos 0, reserved 0
        expect[40..48].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1]);
        expect[48..52].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(dp.encode(), expect);
        assert_eq!(ConnectPrivate::decode(&expect, Family::V6), Ok(dp));
    }

    #[test]
    fn decode_ignores_trailing_bytes_and_rejects_short_input() {
        let dp = ConnectPrivate::new(v4(), PROTOCOL_4_1, 3, 9, 0);
        let mut big = dp.encode();
        big.extend_from_slice(&[0xaa; 60]);
        assert_eq!(ConnectPrivate::decode(&big, Family::V4), Ok(dp));
        assert_eq!(ConnectPrivate::decode(&[], Family::V4), Err(PrivateError::Empty));
        for n in 1..PRIVATE_V4_LEN {
            assert_eq!(
                ConnectPrivate::decode(&big[..n], Family::V4),
                Err(PrivateError::Truncated { have: n, need: 32 })
            );
        }
        // A v4 structure is too short for the v6 layout.
        assert_eq!(
            ConnectPrivate::decode(&dp.encode(), Family::V6),
            Err(PrivateError::Truncated { have: 32, need: 56 })
        );
    }

    #[test]
    fn garbage_never_panics_and_round_trips() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..80usize {
            let buf: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            for fam in [Family::V4, Family::V6] {
                if let Ok(dp) = ConnectPrivate::decode(&buf, fam) {
                    let enc = dp.encode();
                    // Everything but the padding is preserved.
                    let pad = fam.private_len() - 4;
                    assert_eq!(enc[..pad], buf[..pad]);
                    assert_eq!(enc[pad..], [0, 0, 0, 0]);
                }
                let _ = passive_negotiate(&buf, fam);
                let _ = ActiveNegotiation::new().on_established(&buf, fam);
                let _ = ActiveNegotiation::new().on_reject(Some(&buf), 0);
            }
        }
    }

    fn req(fam: Family, major: u8, minor: u8, mask: u16) -> Vec<u8> {
        let addrs = if fam == Family::V4 { v4() } else { v6() };
        let mut dp = ConnectPrivate::new(addrs, version(major, minor), 0, 0, 0);
        dp.protocol_minor_mask = mask;
        dp.encode()
    }

    #[test]
    fn passive_negotiation_follows_the_kernel() {
        for fam in [Family::V4, Family::V6] {
            assert_eq!(passive_negotiate(&[], fam), Err(Incompatible::NoPrivateData));
            // Short data or major 0: 4.0.
            assert_eq!(passive_negotiate(&[4, 1], fam), Ok(PROTOCOL_4_0));
            assert_eq!(passive_negotiate(&req(fam, 0, 0, 0), fam), Ok(PROTOCOL_4_0));
            assert_eq!(passive_negotiate(&[0u8; 92], fam), Ok(PROTOCOL_4_0));
            // 4.x: the highest common minor, whatever the minor field says.
            assert_eq!(passive_negotiate(&req(fam, 4, 1, 0x0003), fam), Ok(PROTOCOL_4_1));
            assert_eq!(passive_negotiate(&req(fam, 4, 0, 0x0003), fam), Ok(PROTOCOL_4_1));
            assert_eq!(passive_negotiate(&req(fam, 4, 1, 0x0001), fam), Ok(PROTOCOL_4_0));
            assert_eq!(passive_negotiate(&req(fam, 4, 7, 0xff02), fam), Ok(PROTOCOL_4_1));
            // 4.x without a common minor, and 3.1 with or without mask.
            assert_eq!(
                passive_negotiate(&req(fam, 4, 2, 0x0004), fam),
                Err(Incompatible::Version { major: 4, minor: 2 })
            );
            assert_eq!(passive_negotiate(&req(fam, 3, 1, 0x0003), fam), Ok(PROTOCOL_3_1));
            assert_eq!(passive_negotiate(&req(fam, 3, 1, 0), fam), Ok(PROTOCOL_3_1));
            // 3.0 and 5.x are rejected with value 1.
            let e = passive_negotiate(&req(fam, 3, 0, 0x0003), fam).unwrap_err();
            assert_eq!(e, Incompatible::Version { major: 3, minor: 0 });
            assert_eq!(e.reject_value(), REJ_INCOMPAT);
            assert!(passive_negotiate(&req(fam, 5, 0, 0x0003), fam).is_err());
        }
        // The v6 layout is read at v6 offsets: a v4 request on a v6 listener is short.
        assert_eq!(passive_negotiate(&req(Family::V4, 3, 1, 0), Family::V6), Ok(PROTOCOL_4_0));
        assert_eq!(reject_data(REJ_INCOMPAT), [1, 0, 0, 0]);
    }

    #[test]
    fn usable_versions() {
        assert!(version_usable(PROTOCOL_4_1));
        assert!(version_usable(PROTOCOL_3_1));
        assert!(!version_usable(PROTOCOL_4_0));
        assert!(!version_usable(PROTOCOL_3_0));
        assert!(!version_usable(LEGACY_DEFAULT_VERSION));
        assert!(version_usable(version(4, 2)));
    }

    #[test]
    fn active_side_falls_back_to_3_1_on_reject() {
        let mut a = ActiveNegotiation::new();
        assert_eq!(a.proposed(), PROTOCOL_4_1);
        let dp = a.request(v4(), 0, 5, 0);
        assert_eq!((dp.protocol_major, dp.protocol_minor, dp.protocol_minor_mask), (4, 1, 3));
        // A reject value above 1 is only logged.
        assert_eq!(a.on_reject(Some(&reject_data(2)), 0), RejectAction::Ignore);
        // Fewer than 4 bytes of data: ignored too (the kernel checks the length).
        assert_eq!(a.on_reject(Some(&[1, 0]), 0), RejectAction::Ignore);
        assert_eq!(a.proposed(), PROTOCOL_4_1);
        // With a tos the version is kept.
        assert_eq!(a.on_reject(Some(&reject_data(1)), 3), RejectAction::Drop { fallback: false });
        assert_eq!(a.proposed(), PROTOCOL_4_1);
        // Value 1, value 0, negative errno or no data: fall back to 3.1.
        for data in [Some(&reject_data(1)[..]), Some(&reject_data(0)[..]), Some(&reject_data(-95)[..]), None] {
            let mut a = ActiveNegotiation::new();
            assert_eq!(a.on_reject(data, 0), RejectAction::Drop { fallback: true });
            assert_eq!(a.proposed(), PROTOCOL_3_1);
            assert_eq!(a.request(v6(), 0, 0, 0).encode()[32..36], [3, 1, 0, 3]);
        }
    }

    #[test]
    fn active_side_takes_the_accepted_version() {
        // A 3.1 peer after fallback answers 3.1 with its credits and ack.
        let mut a = ActiveNegotiation::new();
        a.on_reject(None, 0);
        let rep = ConnectPrivate::new(v4(), PROTOCOL_3_1, 0, 42, 16).encode();
        assert_eq!(
            a.on_established(&rep, Family::V4),
            Ok(Established { version: PROTOCOL_3_1, peer_credit: 16, ack_seq: 42 })
        );
        assert_eq!(a.proposed(), PROTOCOL_3_1);

        // No private data in the accept: the proposed version stands.
        let mut a = ActiveNegotiation::new();
        assert_eq!(
            a.on_established(&[], Family::V4),
            Ok(Established { version: PROTOCOL_4_1, peer_credit: 0, ack_seq: 0 })
        );
        // An accept with 4.0 is refused, as the kernel destroys such a connection.
        let rep = ConnectPrivate::new(v4(), PROTOCOL_4_0, 0, 0, 0).encode();
        assert_eq!(a.on_established(&rep, Family::V4), Err(Unsupported { version: PROTOCOL_4_0 }));
        assert_eq!(a.proposed(), PROTOCOL_4_1);
    }
}
