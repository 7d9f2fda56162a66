//! Unit tests of `private.rs`.

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
        assert_eq!(ConnectPrivate::decode(&big[..n], Family::V4), Err(PrivateError::Truncated { have: n, need: 32 }));
    }
    // A v4 structure is too short for the v6 layout.
    assert_eq!(ConnectPrivate::decode(&dp.encode(), Family::V6), Err(PrivateError::Truncated { have: 32, need: 56 }));
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
        assert_eq!(passive_negotiate(&req(fam, 4, 2, 0x0004), fam), Err(Incompatible::Version { major: 4, minor: 2 }));
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
