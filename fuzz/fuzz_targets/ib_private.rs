//! rds-ib's RDMA CM private data (`ConnectPrivate::decode`, both the IPv4
//! 32-byte and the IPv6 56-byte form) and what is decided from it: the
//! passive side's version choice, the active side's handling of the accept
//! and of a reject, and the credits the peer offers.
//!
//! Checked for both families on every input: decoding allocates nothing and
//! fails exactly on empty or short input; what decodes re-encodes to the
//! input's bytes (padding zeroed) and decodes back the same; the version
//! choice, the accept and the reject follow the documented rules (a
//! reference written here from the module's docs); peer credits stay within
//! the kernel's 16 bits.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use rds_core::wire::{PROTOCOL_3_1, PROTOCOL_4_0, PROTOCOL_4_1};
use rds_fuzz::{Counting, peak_during};
use rds_ib::credits::{Credits, MAX_CREDITS};
use rds_ib::private::{
    ActiveNegotiation, COMPAT_VERSION, ConnectPrivate, Established, Family, Incompatible, PROPOSED_VERSION, PrivAddrs,
    PrivateError, RejectAction, Unsupported, passive_negotiate, version_usable,
};

#[global_allocator]
static ALLOC: Counting = Counting;

/// The passive side's rules, from `passive_negotiate`'s documentation.
fn reference_passive(data: &[u8], fam: Family) -> Result<u16, Incompatible> {
    if data.is_empty() {
        return Err(Incompatible::NoPrivateData);
    }
    let (need, off) = match fam {
        Family::V4 => (32, 8),
        Family::V6 => (56, 32),
    };
    if data.len() < need || data[off] == 0 {
        return Ok(PROTOCOL_4_0);
    }
    let (major, minor) = (data[off], data[off + 1]);
    let mask = u16::from_be_bytes([data[off + 2], data[off + 3]]);
    if major == 4 && mask & 0b10 != 0 {
        Ok(PROTOCOL_4_1)
    } else if major == 4 && mask & 0b01 != 0 {
        Ok(PROTOCOL_4_0)
    } else if (major, minor) == (3, 1) {
        Ok(PROTOCOL_3_1)
    } else {
        Err(Incompatible::Version { major, minor })
    }
}

fn check_family(data: &[u8], fam: Family, setup: u8) {
    let (need, off) = match fam {
        Family::V4 => (32, 8),
        Family::V6 => (56, 32),
    };
    assert_eq!(fam.private_len(), need);
    let (r, peak) = peak_during(|| ConnectPrivate::decode(data, fam));
    assert_eq!(peak, 0, "decoding allocates nothing");
    let decoded = match r {
        Ok(dp) => {
            assert!(data.len() >= need);
            assert_eq!(dp.addrs.family(), fam);
            let enc = dp.encode();
            assert_eq!(enc.len(), need);
            assert_eq!(enc[..need - 4], data[..need - 4], "everything but the padding round-trips");
            assert_eq!(enc[need - 4..], [0, 0, 0, 0], "padding sent as zero");
            assert_eq!(ConnectPrivate::decode(&enc, fam), Ok(dp));
            // Field by field at the documented offsets.
            let alen = off / 2;
            let ip = |b: &[u8]| -> IpAddr {
                if alen == 4 {
                    IpAddr::from(<[u8; 4]>::try_from(b).unwrap())
                } else {
                    IpAddr::from(<[u8; 16]>::try_from(b).unwrap())
                }
            };
            assert_eq!(dp.addrs.saddr(), ip(&data[..alen]));
            assert_eq!(dp.addrs.daddr(), ip(&data[alen..off]));
            assert_eq!(PrivAddrs::new(dp.addrs.saddr(), dp.addrs.daddr()), Some(dp.addrs));
            assert_eq!(dp.version(), u16::from_be_bytes([data[off], data[off + 1]]));
            assert_eq!(dp.ack_seq, u64::from_be_bytes(data[off + 8..off + 16].try_into().unwrap()));
            assert_eq!(dp.credit, u32::from_be_bytes(data[off + 16..off + 20].try_into().unwrap()));
            Some(dp)
        }
        Err(PrivateError::Empty) => {
            assert!(data.is_empty());
            None
        }
        Err(e @ PrivateError::Truncated { have, need: n }) => {
            assert_eq!((have, n), (data.len(), need));
            assert!(have > 0 && have < need);
            assert!(!e.to_string().is_empty());
            None
        }
    };

    // The passive side.
    let chosen = passive_negotiate(data, fam);
    assert_eq!(chosen, reference_passive(data, fam));
    if let Err(e) = chosen {
        assert_eq!(e.reject_value(), 1);
    }

    // The active side, fresh or after a reject that made it fall back.
    let mut a = ActiveNegotiation::new();
    if setup & 1 != 0 {
        assert_eq!(a.on_reject(None, 0), RejectAction::Drop { fallback: true });
        assert_eq!(a.proposed(), COMPAT_VERSION);
    }
    let before = a.proposed();
    let full = decoded.filter(|dp| dp.protocol_major != 0);
    let want = full.map_or(before, |dp| dp.version());
    match a.on_established(data, fam) {
        Ok(est) => {
            let credit = full.map_or(0, |dp| dp.credit);
            let ack_seq = decoded.map_or(0, |dp| dp.ack_seq);
            assert_eq!(est, Established { version: want, peer_credit: credit, ack_seq });
            assert!(version_usable(est.version));
            assert_eq!(a.proposed(), est.version, "later attempts propose what was negotiated");
        }
        Err(u) => {
            assert_eq!(u, Unsupported { version: want });
            assert!(!version_usable(want));
            assert_eq!(a.proposed(), before);
        }
    }

    // Credits a peer offers in its private data stay within 16 bits, and
    // only a non-zero offer turns limiting on.
    if let Some(dp) = decoded {
        let mut c = Credits::new(setup & 2 != 0);
        let limited = c.set_flow_control(setup & 4 != 0, dp.credit);
        assert_eq!(limited, setup & 4 != 0 && dp.credit != 0);
        assert!(c.send_credits() <= MAX_CREDITS);
        assert_eq!(c.send_credits(), if limited { dp.credit.min(MAX_CREDITS) } else { 0 });
        assert!(!c.advertise(u32::from(setup)) || c.posted_credits() <= MAX_CREDITS);
    }
}

fuzz_target!(|data: &[u8]| {
    let setup = data.last().copied().unwrap_or(0);
    check_family(data, Family::V4, setup);
    check_family(data, Family::V6, setup);

    // A reject's consumer data: dropped (and, with tos 0, falling back to
    // 3.1) when it holds at least 4 bytes of a little-endian int <= 1.
    let tos = setup >> 4;
    let mut a = ActiveNegotiation::new();
    let drop = data.len() >= 4 && i32::from_le_bytes(data[..4].try_into().unwrap()) <= 1;
    let got = a.on_reject(Some(data), tos);
    if drop {
        assert_eq!(got, RejectAction::Drop { fallback: tos == 0 });
        assert_eq!(a.proposed(), if tos == 0 { COMPAT_VERSION } else { PROPOSED_VERSION });
    } else {
        assert_eq!(got, RejectAction::Ignore);
        assert_eq!(a.proposed(), PROPOSED_VERSION);
    }
});
