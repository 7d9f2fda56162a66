//! `Header::extensions` on an arbitrary 16-byte extension area (and
//! `push_extension` on top of it): the parser never reads past the area,
//! what it parses re-encodes to something that parses the same, and an
//! appended extension header is read back after the existing ones.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rds_core::wire::{EXTHDR_SPACE, Ext, Header, ext_body_len};

fuzz_target!(|data: &[u8]| {
    let mut h = Header::default();
    let n = data.len().min(EXTHDR_SPACE);
    h.exthdr[..n].copy_from_slice(&data[..n]);
    let exts: Vec<Ext> = h.extensions().collect();
    let used: usize = exts.iter().map(|e| 1 + e.body_len()).sum();
    assert!(used <= EXTHDR_SPACE, "parsed {used} bytes of a 16-byte area");
    for e in &exts {
        assert_eq!(e.body_len(), ext_body_len(e.type_byte()));
        assert!(e.type_byte() != 0 && e.type_byte() < 16);
    }
    // Re-encoding what was parsed gives an area that parses the same.
    let mut again = Header::default();
    for e in &exts {
        again.push_extension(*e).expect("what fitted before fits again");
    }
    assert_eq!(again.extensions().collect::<Vec<_>>(), exts);
    // Appending after the parsed ones: read back as the last entry.
    let extra = match data.get(EXTHDR_SPACE).copied().unwrap_or(0) % 3 {
        0 => Ext::SportIdx,
        1 => Ext::Npaths(u16::from(data.get(17).copied().unwrap_or(8))),
        _ => Ext::GenNum(0xdead_beef),
    };
    let mut pushed = h;
    if pushed.push_extension(extra).is_ok() {
        let mut want = exts.clone();
        want.push(extra);
        assert_eq!(pushed.extensions().collect::<Vec<_>>(), want, "area {:?}", h.exthdr);
    } else {
        assert!(used + 1 + extra.body_len() > EXTHDR_SPACE);
    }
});
