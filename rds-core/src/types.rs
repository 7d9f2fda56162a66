//! Identifiers, payloads, errno values and small shared types.

use std::cmp::Ordering;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A socket of a [`crate::Node`]. Carries a generation so that an id of a
/// closed socket never names a later one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct SockId {
    pub(crate) idx: u32,
    pub(crate) generation: u32,
}

impl SockId {
    /// A stable number for introspection (like an inode number).
    pub fn number(&self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.idx)
    }
}

/// A connection: one per (local address, peer address, transport, tos).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// One path of a connection (`rds_conn_path`); index 0..npaths.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct PathId {
    pub conn: ConnId,
    pub index: u8,
}

/// Transports, numbered as `SO_RDS_TRANSPORT` numbers them where the uapi
/// has a number (`RDS_TRANS_IB` 0, `RDS_TRANS_TCP` 2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum TransportKind {
    Ib,
    Tcp,
    /// In-process delivery between addresses the same node serves.
    Loop,
}

impl TransportKind {
    /// The `SO_RDS_TRANSPORT` number (`Loop` has none in the uapi; 3).
    pub fn uapi(self) -> u32 {
        match self {
            TransportKind::Ib => 0,
            TransportKind::Tcp => 2,
            TransportKind::Loop => 3,
        }
    }

    /// From an `SO_RDS_TRANSPORT` number; `None` for numbers no transport has.
    pub fn from_uapi(v: i32) -> Option<TransportKind> {
        match v {
            0 => Some(TransportKind::Ib),
            2 => Some(TransportKind::Tcp),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Ib => "infiniband",
            TransportKind::Tcp => "tcp",
            TransportKind::Loop => "loopback",
        }
    }

    pub(crate) fn slot(self) -> usize {
        match self {
            TransportKind::Ib => 0,
            TransportKind::Tcp => 1,
            TransportKind::Loop => 2,
        }
    }
}

/// `SO_RDS_TRANSPORT` value `RDS_TRANS_NONE` (an unbound socket).
pub const RDS_TRANS_NONE: u32 = !0;
/// `RDS_TRANS_COUNT`: values at or above are invalid.
pub const RDS_TRANS_COUNT: i32 = 3;

pub use crate::payload::Payload;

/// A Linux errno value, as the kernel's RDS returns it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(1);
    pub const EINTR: Errno = Errno(4);
    pub const EAGAIN: Errno = Errno(11);
    pub const ENOMEM: Errno = Errno(12);
    pub const EFAULT: Errno = Errno(14);
    pub const EINVAL: Errno = Errno(22);
    pub const ENOTTY: Errno = Errno(25);
    pub const ENOSPC: Errno = Errno(28);
    pub const EPIPE: Errno = Errno(32);
    pub const EDESTADDRREQ: Errno = Errno(89);
    pub const EPROTOTYPE: Errno = Errno(91);
    pub const EMSGSIZE: Errno = Errno(90);
    pub const ENOPROTOOPT: Errno = Errno(92);
    pub const EOPNOTSUPP: Errno = Errno(95);
    pub const EAFNOSUPPORT: Errno = Errno(97);
    pub const EADDRINUSE: Errno = Errno(98);
    pub const EADDRNOTAVAIL: Errno = Errno(99);
    pub const ENETUNREACH: Errno = Errno(101);
    pub const ECONNRESET: Errno = Errno(104);
    pub const ENOBUFS: Errno = Errno(105);
    pub const EISCONN: Errno = Errno(106);
    pub const ENOTCONN: Errno = Errno(107);
    pub const ESHUTDOWN: Errno = Errno(108);
    pub const ETIMEDOUT: Errno = Errno(110);
    pub const ECONNREFUSED: Errno = Errno(111);
    pub const EHOSTUNREACH: Errno = Errno(113);
    pub const ECANCELED: Errno = Errno(125);

    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "EPERM",
            4 => "EINTR",
            11 => "EAGAIN",
            12 => "ENOMEM",
            14 => "EFAULT",
            22 => "EINVAL",
            25 => "ENOTTY",
            28 => "ENOSPC",
            32 => "EPIPE",
            89 => "EDESTADDRREQ",
            91 => "EPROTOTYPE",
            90 => "EMSGSIZE",
            92 => "ENOPROTOOPT",
            95 => "EOPNOTSUPP",
            97 => "EAFNOSUPPORT",
            98 => "EADDRINUSE",
            99 => "EADDRNOTAVAIL",
            101 => "ENETUNREACH",
            104 => "ECONNRESET",
            105 => "ENOBUFS",
            106 => "EISCONN",
            107 => "ENOTCONN",
            108 => "ESHUTDOWN",
            110 => "ETIMEDOUT",
            111 => "ECONNREFUSED",
            113 => "EHOSTUNREACH",
            125 => "ECANCELED",
            _ => "E?",
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.0)
    }
}

/// `rds_addr_cmp`: addresses compared as big-endian 128-bit numbers, IPv4 as
/// IPv4-mapped IPv6. The smaller address connects.
pub fn addr_cmp(a: &IpAddr, b: &IpAddr) -> Ordering {
    to_v6(a).octets().cmp(&to_v6(b).octets())
}

/// IPv4 addresses as IPv4-mapped IPv6 (how the kernel stores them).
pub fn to_v6(a: &IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => *v6,
    }
}

/// A small deterministic PRNG (SplitMix64). Not for anything secret.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn addr_order_is_numeric() {
        let a: IpAddr = Ipv4Addr::new(10, 99, 0, 1).into();
        let b: IpAddr = Ipv4Addr::new(10, 99, 0, 2).into();
        let c: IpAddr = Ipv4Addr::new(9, 255, 255, 255).into();
        assert_eq!(addr_cmp(&a, &b), Ordering::Less);
        assert_eq!(addr_cmp(&c, &a), Ordering::Less);
        assert_eq!(addr_cmp(&a, &a), Ordering::Equal);
        // IPv4-mapped addresses sort below global IPv6 ones such as fd99::1.
        let v6: IpAddr = "fd99::1".parse().unwrap();
        assert_eq!(addr_cmp(&a, &v6), Ordering::Less);
    }

    #[test]
    fn rng_is_deterministic() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert!(a.below(10) < 10);
    }

    #[test]
    fn fast_map_keeps_every_address_and_port_apart() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        use std::net::SocketAddr;
        let mut m: FastMap<SocketAddr, u32> = FastMap::default();
        let mut hashes = std::collections::HashSet::new();
        let h = BuildHasherDefault::<FxHasher>::default();
        let mut n = 0u32;
        for host in 1..=64u8 {
            for port in [0u16, 1, 2, 4000, 4001, 16385, 65535] {
                let v4 = SocketAddr::new(Ipv4Addr::new(10, 0, 0, host).into(), port);
                let v6 = SocketAddr::new(format!("fd00::{host}").parse::<IpAddr>().unwrap(), port);
                for a in [v4, v6] {
                    assert!(m.insert(a, n).is_none());
                    hashes.insert(h.hash_one(a));
                    n += 1;
                }
            }
        }
        assert_eq!(m.len() as u32, n);
        assert_eq!(hashes.len() as u32, n, "no two of these keys hash alike");
        let probe = SocketAddr::new(Ipv4Addr::new(10, 0, 0, 7).into(), 4001);
        assert_eq!(m[&probe], (7 - 1) * 14 + 4 * 2);
        assert!(!m.contains_key(&SocketAddr::new(Ipv4Addr::new(10, 0, 1, 7).into(), 4001)));
        // Deterministic: the same key hashes alike in every process.
        assert_eq!(h.hash_one(probe), BuildHasherDefault::<FxHasher>::default().hash_one(probe));
    }
}

/// Further than any timer of a node needs to look (about 136 years).
const FAR: std::time::Duration = std::time::Duration::from_secs(1 << 32);

/// `now + d`, saturating: a configured duration too long to reach
/// (`Duration::MAX`, say) means "not in this process's lifetime" instead of
/// a panic on `Instant` overflow. Every deadline computed from a setting
/// goes through this.
pub fn later(now: std::time::Instant, d: std::time::Duration) -> std::time::Instant {
    now.checked_add(d.min(FAR)).unwrap_or(now)
}

#[cfg(test)]
mod later_tests {
    use super::later;
    use std::time::{Duration, Instant};

    #[test]
    fn later_saturates() {
        let now = Instant::now();
        assert_eq!(later(now, Duration::from_millis(5)), now + Duration::from_millis(5));
        assert!(later(now, Duration::MAX) > now + Duration::from_secs(100 * 365 * 86400));
    }
}

/// The hash map of the per-message lookups (bound ports, congestion maps,
/// paused paths; in the transports and the engine, paths by [`PathId`] and
/// sockets by [`SockId`]): keyed by values this node chose or bounded by
/// its peer limit, hashed with [`FxHasher`] instead of the standard
/// SipHash, which cost a tenth of a 64-byte message's step. Only for keys
/// a peer cannot pick: connections by peer address (`conn_index`) keep
/// SipHash.
pub type FastMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

/// A multiply hash in the manner of rustc's `FxHasher`: a few
/// instructions per word, deterministic, not resistant to chosen
/// collisions.
#[derive(Clone, Copy, Default, Debug)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    /// Folds each word in with a full 64x64 -> 128-bit multiply whose two
    /// halves are xored (foldhash's mixing): the high half carries every
    /// input bit into every output bit, which rustc's rotate-multiply does
    /// not (it let 51 of 896 socket addresses collide).
    fn add(&mut self, word: u64) {
        let p = u128::from(self.hash ^ word) * u128::from(Self::SEED);
        self.hash = (p as u64) ^ ((p >> 64) as u64);
    }
}

impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}
