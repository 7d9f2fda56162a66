//! Unit tests of `codec.rs`.

use super::*;

fn sample() -> Snapshot {
    let a: IpAddr = "127.0.0.1".parse().unwrap();
    let b: IpAddr = "fd00::2".parse().unwrap();
    Snapshot {
        node: NodeIdent {
            pid: 4242,
            engine: 3,
            uid: 1000,
            command: "rds-sink".into(),
            addresses: vec![a, b],
            gen_num: 77,
            npaths: 8,
            tcp_port: 16385,
        },
        counters: vec![("conn_reset".into(), 1), ("tcp_sndbuf_full".into(), u64::MAX)],
        connections: vec![ConnSnapshot {
            id: ConnId(5),
            laddr: a,
            faddr: "127.0.0.2".parse().unwrap(),
            transport: TransportKind::Tcp,
            tos: 0,
            npaths: 8,
            peer_gen: 9,
            paths: (0..8)
                .map(|i| PathSnapshot {
                    index: i,
                    state: if i < 4 { PathState::Up } else { PathState::Connecting },
                    flags: if i < 4 { 4 } else { 2 },
                    next_tx_seq: 10 + u64::from(i),
                    next_rx_seq: 20,
                    send_queue: 1,
                    retrans: 2,
                    queued_bytes: 3,
                    connects: 4,
                })
                .collect(),
        }],
        sockets: vec![SockSnapshot {
            inum: 1 << 33,
            bound: Some(SocketAddr::new(b, 4000)),
            connected: None,
            sndbuf: 1,
            rcvbuf: 2,
            snd_bytes: 3,
            rcv_bytes: 4,
            recv_queue: 5,
            transport: Some(TransportKind::Loop),
            congested: true,
            cong_monitor: false,
        }],
        send: vec![MsgSnapshot { seq: 1, len: 2, laddr: a, lport: 3, faddr: b, fport: 4, tos: 0, path: Some(7) }],
        retrans: vec![],
        recv: vec![MsgSnapshot { seq: 9, len: 8, laddr: b, lport: 7, faddr: a, fport: 6, tos: 0, path: None }],
        tcp: vec![TransportConnInfo {
            path: Some(PathId { conn: ConnId(5), index: 2 }),
            local: Some("127.0.0.1:40000".parse().unwrap()),
            peer: None,
            hdr_rem: 48,
            data_rem: 1,
            last_sent_nxt: 2,
            last_expected_una: 3,
            last_seen_una: 4,
            sending: true,
            detail: "state=up".into(),
        }],
    }
}

#[test]
fn snapshot_round_trips() {
    let s = sample();
    let body = encode_snapshot(&s, sections::ALL);
    assert_eq!(decode_snapshot(&body).unwrap(), s);
}

#[test]
fn only_the_wanted_sections_travel() {
    let s = sample();
    let body = encode_snapshot(&s, sections::COUNTERS | sections::RECV);
    let d = decode_snapshot(&body).unwrap();
    assert_eq!(d.counters, s.counters);
    assert_eq!(d.recv, s.recv);
    assert_eq!(d.node, NodeIdent::default());
    assert!(d.connections.is_empty() && d.sockets.is_empty() && d.send.is_empty() && d.tcp.is_empty());
}

#[test]
fn unknown_sections_and_appended_fields_are_skipped() {
    let s = sample();
    let mut w = W::default();
    w.section(30, |w| w.u64(1));
    // A counters section whose records carry an extra trailing field.
    w.section(tag(sections::COUNTERS), |w| {
        w.list(&s.counters, |w, (n, v)| {
            w.str(n);
            w.u64(*v);
            w.u32(0xdead);
        })
    });
    let d = decode_snapshot(&w.0).unwrap();
    assert_eq!(d.counters, s.counters);
}

#[test]
fn truncated_or_corrupt_bodies_are_errors_not_panics() {
    let body = encode_snapshot(&sample(), sections::ALL);
    for cut in 1..body.len() {
        // Any prefix either parses (cut at a section boundary) or fails.
        let _ = decode_snapshot(&body[..cut]);
    }
    assert!(decode_snapshot(&body[..body.len() - 1]).is_err());
    let mut huge = Vec::new();
    huge.extend_from_slice(&tag(sections::COUNTERS).to_le_bytes());
    huge.extend_from_slice(&4u32.to_le_bytes());
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode_snapshot(&huge).is_err(), "a huge count is refused before allocating");
}

#[test]
fn request_and_header_checks() {
    let req = encode_request(sections::COUNTERS);
    assert_eq!(decode_request(&req), Ok(sections::COUNTERS));
    let mut v2 = req;
    v2[4] = 2;
    assert_eq!(decode_request(&v2), Err(Status::Version));
    let mut junk = req;
    junk[0] = b'X';
    assert_eq!(decode_request(&junk), Err(Status::BadRequest));
    let h = encode_response_header(Status::Denied, 0);
    assert_eq!(decode_response_header(&h), Ok((VERSION, Status::Denied, 0)));
    let h = encode_response_header(Status::Ok, MAX_BODY + 1);
    assert!(decode_response_header(&h).is_err());
}
