//! `CongMap::from_wire` on payloads of arbitrary length and content: only
//! exactly 8192 bytes are a map, which round-trips; `update_from` reports
//! exactly the port groups whose ports went from congested to clear.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rds_core::cong::{CongMap, monitor_mask};
use rds_core::wire::{CONG_MAP_BYTES, WireError};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    // Length: mostly 8192 (so the content is explored), else near it or small.
    let sel = u16::from_le_bytes([data[0], data[1]]);
    let len = match sel % 4 {
        0 | 1 => CONG_MAP_BYTES,
        2 => CONG_MAP_BYTES - 8 + usize::from(sel >> 2) % 17,
        _ => usize::from(sel >> 2) % 64,
    };
    let body = &data[2..];
    let payload: Vec<u8> = (0..len).map(|i| body[i % body.len()] ^ (i / body.len()) as u8).collect();
    match CongMap::from_wire(&payload) {
        Ok(map) => {
            assert_eq!(len, CONG_MAP_BYTES);
            assert_eq!(&map.as_bytes()[..], &payload[..]);
            let ports: Vec<u16> = map.congested_ports().collect();
            let bits: usize = payload.iter().map(|b| b.count_ones() as usize).sum();
            assert_eq!(ports.len(), bits);
            assert!(ports.windows(2).all(|w| w[0] < w[1]));
            assert!(ports.iter().all(|p| map.test(*p)));
            // Update an older map built from the same bytes shifted by one.
            let older: Vec<u8> = (0..CONG_MAP_BYTES).map(|i| payload[(i + 1) % CONG_MAP_BYTES]).collect();
            let mut old = CongMap::from_wire(&older).unwrap();
            let before = old.clone();
            let mask = old.update_from(&map);
            assert_eq!(old, map);
            let mut want = 0u64;
            for p in before.congested_ports() {
                if !map.test(p) {
                    want |= monitor_mask(p);
                }
            }
            assert_eq!(mask, want);
        }
        Err(e) => {
            assert_ne!(len, CONG_MAP_BYTES);
            assert_eq!(e, WireError::BadCongMapLen { len: len as u32 });
        }
    }
});
