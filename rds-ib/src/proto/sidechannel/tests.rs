//! Unit tests of `sidechannel.rs`.

use super::*;
use crate::secrets::random_nonce;
use std::net::Ipv4Addr;

fn key(b: u8) -> Key {
    Key::new(vec![b; 32]).unwrap()
}

fn params(local: [u8; 4], peer: [u8; 4], qpn: u32) -> Params {
    Params {
        qpn,
        psn: 0x00ab_cdef,
        gid: Ipv4Addr::from(local).to_ipv6_mapped().octets(),
        lid: 0,
        mtu: 1024,
        rds_version: 0x0401,
        path: 0,
        credits: 0,
        tos: 0,
        ack_seq: 0,
        local: IpAddr::V4(Ipv4Addr::from(local)),
        peer: IpAddr::V4(Ipv4Addr::from(peer)),
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn hmac_matches_rfc4231() {
    // Test case 1.
    let t = hmac_sha256(&[0x0b; 20], &[b"Hi There"]);
    assert_eq!(t.to_vec(), hex("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"));
    // Test case 2, the data split in parts.
    let t = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
    assert_eq!(t.to_vec(), hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
    // Test case 6: a key longer than the block.
    let t = hmac_sha256(&[0xaa; 131], &[b"Test Using Larger Than Block-Size Key - Hash Key First"]);
    assert_eq!(t.to_vec(), hex("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"));
}

#[test]
fn ct_eq_compares() {
    assert!(ct_eq(b"abc", b"abc"));
    assert!(!ct_eq(b"abc", b"abd"));
    assert!(!ct_eq(b"abc", b"ab"));
}

#[test]
fn params_round_trip() {
    let mut p = params([10, 99, 0, 2], [10, 99, 0, 1], 0x11);
    p.lid = 7;
    p.credits = 123;
    p.ack_seq = u64::MAX - 5;
    p.tos = 3;
    p.path = 2;
    let b = p.encode().unwrap();
    assert_eq!(b.len(), PARAMS_LEN);
    assert_eq!(Params::decode(&b).unwrap(), p);
    let mut v6 = p;
    v6.local = "fd99::2".parse().unwrap();
    v6.peer = "fd99::1".parse().unwrap();
    assert_eq!(Params::decode(&v6.encode().unwrap()).unwrap(), v6);
}

#[test]
fn params_out_of_range_refused() {
    let p = params([1, 2, 3, 4], [1, 2, 3, 5], 0x11);
    for (bad, what) in [
        (Params { qpn: 1 << 24, ..p }, "QP number"),
        (Params { qpn: 1, ..p }, "QP number"),
        (Params { psn: 1 << 24, ..p }, "PSN"),
        (Params { mtu: 1500, ..p }, "MTU"),
        (Params { local: IpAddr::V4(Ipv4Addr::UNSPECIFIED), ..p }, "address"),
    ] {
        assert_eq!(bad.encode(), Err(SideError::BadField(what)));
    }
    let mut b = p.encode().unwrap();
    b[26..28].copy_from_slice(&1000u16.to_be_bytes());
    assert_eq!(Params::decode(&b), Err(SideError::BadField("MTU")));
    let mut b = p.encode().unwrap();
    b[38] = 1;
    assert_eq!(Params::decode(&b), Err(SideError::BadField("reserved bytes")));
    assert_eq!(Params::decode(&b[..10]), Err(SideError::Truncated { need: PARAMS_LEN, got: 10 }));
}

/// A whole handshake; returns what each side learnt.
fn handshake(ck: &Key, sk: &Key) -> Result<(Params, Params), SideError> {
    let (mut c, hello) = Client::new(ck, random_nonce().unwrap());
    let mut s = Server::new(sk, random_nonce().unwrap());
    let ch = s.on_hello(&hello)?;
    c.on_challenge(&ch)?;
    let cp = params([10, 0, 0, 2], [10, 0, 0, 1], 0x22);
    let m = c.params(&cp)?;
    let got_c = s.on_client_params(&m)?;
    let sp = params([10, 0, 0, 1], [10, 0, 0, 2], 0x33);
    let m = s.params(&sp)?;
    let got_s = c.on_server_params(&m)?;
    s.on_ready(&c.ready()?)?;
    c.on_ready(&s.ready()?)?;
    assert_eq!(got_c, cp);
    assert_eq!(got_s, sp);
    Ok((got_c, got_s))
}

#[test]
fn handshake_round_trip() {
    let (c, s) = handshake(&key(1), &key(1)).unwrap();
    assert_eq!(c.qpn, 0x22);
    assert_eq!(s.qpn, 0x33);
}

#[test]
fn wrong_key_refused_on_both_sides() {
    // The client checks the server's proof first.
    assert_eq!(handshake(&key(1), &key(2)).unwrap_err(), SideError::AuthFailed);
    // A client that ignores the bad proof still cannot get its
    // parameters past the server.
    let (mut c, hello) = Client::new(&key(1), [1; 32]);
    let mut s = Server::new(&key(2), [2; 32]);
    let ch = s.on_hello(&hello).unwrap();
    assert_eq!(c.on_challenge(&ch), Err(SideError::AuthFailed));
    assert!(matches!(c.params(&params([1, 1, 1, 1], [2, 2, 2, 2], 5)), Err(SideError::State(_))));
    let mut forged = Client { step: Step::Authenticated, ..Client::new(&key(1), [1; 32]).0 };
    forged.session = Some(Session { key: key(1), nc: [1; 32], ns: [2; 32] });
    let m = forged.params(&params([1, 1, 1, 1], [2, 2, 2, 2], 5)).unwrap();
    assert_eq!(s.on_client_params(&m), Err(SideError::AuthFailed));
    // The server stays unauthenticated: it will not produce params.
    assert!(matches!(s.params(&params([2, 2, 2, 2], [1, 1, 1, 1], 6)), Err(SideError::State(_))));
}

#[test]
fn replayed_client_params_refused() {
    let k = key(9);
    let (mut c, hello) = Client::new(&k, [3; 32]);
    let mut s1 = Server::new(&k, [4; 32]);
    c.on_challenge(&s1.on_hello(&hello).unwrap()).unwrap();
    let recorded = c.params(&params([1, 1, 1, 1], [2, 2, 2, 2], 5)).unwrap();
    assert!(s1.on_client_params(&recorded).is_ok());
    // The attacker replays the same HELLO and CLIENT_PARAMS to a new
    // server session: its fresh nonce makes the MAC fail.
    let mut s2 = Server::new(&k, [5; 32]);
    s2.on_hello(&hello).unwrap();
    assert_eq!(s2.on_client_params(&recorded), Err(SideError::AuthFailed));
    // A replayed CHALLENGE to a client with a new nonce fails too.
    let old_ch = Server::new(&k, [4; 32]).on_hello(&hello).unwrap();
    let (mut c2, _) = Client::new(&k, [6; 32]);
    assert_eq!(c2.on_challenge(&old_ch), Err(SideError::AuthFailed));
}

#[test]
fn tampered_frames_refused() {
    let k = key(7);
    let (mut c, hello) = Client::new(&k, [1; 32]);
    let mut s = Server::new(&k, [2; 32]);
    let ch = s.on_hello(&hello).unwrap();
    let mut bad = ch;
    bad[HEADER_LEN] ^= 1; // the server's nonce
    assert_eq!(Client::new(&k, [1; 32]).0.on_challenge(&bad), Err(SideError::AuthFailed));
    c.on_challenge(&ch).unwrap();
    let m = c.params(&params([1, 1, 1, 1], [2, 2, 2, 2], 5)).unwrap();
    // Every single byte of the body or tag flipped: refused.
    for i in HEADER_LEN..m.len() {
        let mut t = m;
        t[i] ^= 0x40;
        let mut s2 = Server::new(&k, [2; 32]);
        s2.on_hello(&hello).unwrap();
        assert_eq!(s2.on_client_params(&t), Err(SideError::AuthFailed), "byte {i}");
    }
    // A CLIENT_PARAMS relabelled as SERVER_PARAMS (reflection).
    let mut r = m;
    r[5] = Kind::ServerParams as u8;
    assert_eq!(c.on_server_params(&r), Err(SideError::AuthFailed), "a reflected frame does not verify");
    let got = s.on_client_params(&m).unwrap();
    assert_eq!(got.qpn, 5);
    // The server's READY cannot stand in for the client's.
    let sm = s.params(&params([2, 2, 2, 2], [1, 1, 1, 1], 6)).unwrap();
    c.on_server_params(&sm).unwrap();
    let server_ready = s.ready().unwrap();
    assert_eq!(s.on_ready(&server_ready), Err(SideError::AuthFailed));
    s.on_ready(&c.ready().unwrap()).unwrap();
}

#[test]
fn truncated_and_garbage_give_typed_errors() {
    let k = key(3);
    let (_, hello) = Client::new(&k, [1; 32]);
    for n in 0..hello.len() {
        let mut s = Server::new(&k, [2; 32]);
        let e = s.on_hello(&hello[..n]).unwrap_err();
        assert!(matches!(e, SideError::Truncated { .. }), "{n}: {e}");
        assert_eq!(e.errno(), libc::EPROTO);
    }
    let mut long = hello.to_vec();
    long.push(0);
    assert!(matches!(Server::new(&k, [2; 32]).on_hello(&long), Err(SideError::Trailing { .. })));
    let mut m = hello;
    m[0] = b'X';
    assert_eq!(Server::new(&k, [2; 32]).on_hello(&m), Err(SideError::BadMagic(*b"XDIB")));
    let mut m = hello;
    m[4] = 2;
    let e = Server::new(&k, [2; 32]).on_hello(&m).unwrap_err();
    assert_eq!(e, SideError::Version(2));
    assert_eq!(e.errno(), libc::EPROTONOSUPPORT);
    let mut m = hello;
    m[5] = 9;
    assert_eq!(Server::new(&k, [2; 32]).on_hello(&m), Err(SideError::UnknownKind(9)));
    let mut m = hello;
    m[7] = 31;
    assert_eq!(Server::new(&k, [2; 32]).on_hello(&m), Err(SideError::BadLength { kind: Kind::Hello, len: 31 }));
    assert_eq!(Server::new(&k, [2; 32]).on_client_params(&hello), Err(SideError::State("CLIENT_PARAMS before HELLO")));
    let mut s = Server::new(&k, [2; 32]);
    s.on_hello(&hello).unwrap();
    assert_eq!(
        s.on_client_params(&hello),
        Err(SideError::UnexpectedKind { want: Kind::ClientParams, got: Kind::Hello })
    );
    // Pseudo-random garbage of every length up to a params frame: an
    // error, never a panic.
    let mut x: u32 = 0x1234_5678;
    for n in 0..=PARAMS_MSG_LEN + 4 {
        let g: Vec<u8> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let mut s = Server::new(&k, [2; 32]);
        let _ = s.on_hello(&g);
        assert!(s.on_client_params(&g).is_err());
        assert!(parse_header(&g).is_err() || g.len() >= HEADER_LEN);
        assert!(Params::decode(&g).is_err() || g.len() == PARAMS_LEN);
        let (mut c, _) = Client::new(&k, [1; 32]);
        assert!(c.on_challenge(&g).is_err());
    }
}
