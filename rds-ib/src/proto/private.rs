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
mod tests;
