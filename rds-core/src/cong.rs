//! Congestion maps: one 65536-bit bitmap per address.
//!
//! Port `p` is bit `p % 8` of byte `p / 8` (the kernel's little-endian bit
//! order over two 4 KiB pages). A local map says which of our ports are
//! congested and is sent to peers; a peer's map (received in a
//! congestion-map message) says which of its ports we must not send to.

use crate::wire::{CONG_MAP_BYTES, WireError};

/// `RDS_CONG_MONITOR_MASK(port)`: the port group bit of a port.
pub fn monitor_mask(port: u16) -> u64 {
    1u64 << (port % 64)
}

/// A 65536-port congestion bitmap.
#[derive(Clone, PartialEq, Eq)]
pub struct CongMap {
    bits: Box<[u8; CONG_MAP_BYTES]>,
}

impl Default for CongMap {
    fn default() -> Self {
        CongMap { bits: Box::new([0; CONG_MAP_BYTES]) }
    }
}

impl std::fmt::Debug for CongMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set: Vec<u16> = self.congested_ports().take(16).collect();
        write!(f, "CongMap{set:?}")
    }
}

impl CongMap {
    pub fn new() -> CongMap {
        CongMap::default()
    }

    /// Parses a congestion-map payload; it must be exactly 8192 bytes.
    pub fn from_wire(payload: &[u8]) -> Result<CongMap, WireError> {
        let arr: &[u8; CONG_MAP_BYTES] =
            payload.try_into().map_err(|_| WireError::BadCongMapLen { len: payload.len() as u32 })?;
        Ok(CongMap { bits: Box::new(*arr) })
    }

    /// The 8192-byte wire form.
    pub fn as_bytes(&self) -> &[u8; CONG_MAP_BYTES] {
        &self.bits
    }

    pub fn set(&mut self, port: u16) {
        self.bits[usize::from(port / 8)] |= 1 << (port % 8);
    }

    pub fn clear(&mut self, port: u16) {
        self.bits[usize::from(port / 8)] &= !(1 << (port % 8));
    }

    pub fn test(&self, port: u16) -> bool {
        self.bits[usize::from(port / 8)] & (1 << (port % 8)) != 0
    }

    /// Ports whose bit is set, ascending.
    pub fn congested_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.bits
            .iter()
            .enumerate()
            .flat_map(|(i, b)| (0..8u16).filter(move |bit| b & (1 << bit) != 0).map(move |bit| (i as u16) * 8 + bit))
    }

    /// Replaces this map with `new` and returns the port-group mask of ports
    /// that went from congested to uncongested (what IB reports to
    /// RDS_CONG_MONITOR users; TCP in the kernel reports all ones).
    pub fn update_from(&mut self, new: &CongMap) -> u64 {
        // Port p is bit p % 64 of little-endian word p / 64, and its group
        // bit is p % 64: the mask is the union of the words' cleared bits.
        let mut mask = 0u64;
        for (old, new) in self.bits.chunks_exact(8).zip(new.bits.chunks_exact(8)) {
            let old = u64::from_le_bytes(old.try_into().unwrap());
            let new = u64::from_le_bytes(new.try_into().unwrap());
            mask |= old & !new;
        }
        *self.bits = *new.bits;
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn little_endian_bit_order() {
        let mut m = CongMap::new();
        m.set(0);
        m.set(9);
        m.set(32768);
        m.set(65535);
        let b = m.as_bytes();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[1], 0x02);
        assert_eq!(b[4096], 0x01, "port 32768 is the first bit of the second page");
        assert_eq!(b[8191], 0x80);
        assert!(m.test(9) && !m.test(8));
        assert_eq!(m.congested_ports().collect::<Vec<_>>(), vec![0, 9, 32768, 65535]);
        m.clear(9);
        assert!(!m.test(9));
    }

    #[test]
    fn wrong_length_is_rejected() {
        assert_eq!(CongMap::from_wire(&[0; 8191]), Err(WireError::BadCongMapLen { len: 8191 }));
        assert!(CongMap::from_wire(&[0; 8192]).is_ok());
    }

    #[test]
    fn uncongested_mask() {
        let mut old = CongMap::new();
        old.set(5);
        old.set(69);
        old.set(7);
        let mut new = CongMap::new();
        new.set(7);
        new.set(100);
        let mask = old.update_from(&new);
        assert_eq!(mask, monitor_mask(5), "5 and 69 share port group 5");
        assert_eq!(old, new);
        // Every port: the mask is the union of the cleared ports' groups.
        let mut a = CongMap::new();
        for p in (0..=65535u16).step_by(7) {
            a.set(p);
        }
        let mut b = a.clone();
        for p in [7u16, 70, 4095, 65534, 32767] {
            b.clear(p);
        }
        let want = [7u16, 70, 4095, 65534, 32767].iter().filter(|p| a.test(**p)).fold(0, |m, p| m | monitor_mask(*p));
        assert_eq!(a.update_from(&b), want);
        assert_ne!(want, 0);
    }
}
