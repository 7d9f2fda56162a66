//! `Header::decode` on arbitrary bytes: never panics, fails only on length,
//! round-trips byte for byte, and a recomputed checksum verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rds_core::wire::{self, HEADER_LEN, Header, WireError};

fuzz_target!(|data: &[u8]| {
    match Header::decode(data) {
        Ok(h) => {
            assert!(data.len() >= HEADER_LEN);
            let b = h.to_bytes();
            assert_eq!(&b[..], &data[..HEADER_LEN], "decode/encode is byte-exact");
            assert_eq!(Header::from_bytes(&b), h);
            let c = h.to_bytes_checksummed();
            assert!(wire::verify_checksum(&c), "a recomputed checksum verifies");
            // Only h_csum differs between the two encodings.
            assert_eq!(&c[..30], &b[..30]);
            assert_eq!(&c[32..], &b[32..]);
            assert!(h.extensions().count() <= wire::EXTHDR_SPACE);
            let _ = (h.kind(), h.is_retransmitted(), format!("{h:?}"));
        }
        Err(e) => {
            assert!(data.len() < HEADER_LEN);
            assert_eq!(e, WireError::Truncated { have: data.len() });
        }
    }
});
