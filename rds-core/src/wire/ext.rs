//! Extension headers: the 16-byte area at the end of the header, its
//! types and their bodies (`rds_message_add_extension`,
//! `rds_message_next_extension`).

use super::*;

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

    pub(super) fn write_body(&self, out: &mut [u8]) {
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
    pub(super) area: &'a [u8; EXTHDR_SPACE],
    pub(super) pos: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
