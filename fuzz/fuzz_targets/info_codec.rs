//! rds-sock's rds-info codec (`info::codec`): the request a local client
//! sends (`decode_request`), the response header and the snapshot body a
//! node answers with (`decode_response_header`, `decode_snapshot`), as a
//! hostile client or a hostile node would write them.
//!
//! Two kinds of input: raw bytes (a request or response header, then a
//! body), and a snapshot built from the input, encoded with some sections
//! and then altered (bytes flipped, inserted, removed, cut), which reaches
//! the body's records faster. Checked: headers decode by the documented
//! layout and re-encode to the same bytes (the request's unused flags
//! aside); a body decodes to an error or to a snapshot whose encoding
//! decodes to the same snapshot and is a fixed point; an encoded snapshot
//! decodes to exactly its wanted sections; the memory a body costs is
//! bounded by a small multiple of its length, whatever its counts say.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use rds_core::{
    ConnId, ConnSnapshot, MsgSnapshot, PathId, PathSnapshot, PathState, SockSnapshot, TransportConnInfo, TransportKind,
};
use rds_fuzz::{Counting, Input, peak_during};
use rds_sock::info::codec::{
    HEADER_LEN, MAGIC, MAX_BODY, Status, VERSION, decode_request, decode_response_header, decode_snapshot,
    encode_request, encode_response_header, encode_snapshot,
};
use rds_sock::info::{NodeIdent, Snapshot, sections};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap bytes a body may cost per byte of it (the largest decoded record
/// is a few times its encoding, and vectors grow by doubling).
const PER_BYTE: usize = 8;

fn headers(h: &[u8; HEADER_LEN]) {
    let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
    // A request.
    let want = if h[..4] != MAGIC {
        Err(Status::BadRequest)
    } else if u16_at(4) != VERSION {
        Err(Status::Version)
    } else {
        Ok(u32_at(8))
    };
    assert_eq!(decode_request(h), want);
    if let Ok(w) = want {
        let mut canon = *h;
        canon[6..8].fill(0);
        assert_eq!(encode_request(w), canon);
    }
    // A response header.
    let status = match u16_at(6) {
        0 => Some(Status::Ok),
        1 => Some(Status::BadRequest),
        2 => Some(Status::Version),
        3 => Some(Status::Denied),
        _ => None,
    };
    let len = u32_at(8) as usize;
    match decode_response_header(h) {
        Ok((version, st, n)) => {
            assert!(h[..4] == MAGIC && Some(st) == status && n == len && n <= MAX_BODY);
            assert_eq!(version, u16_at(4));
            if version == VERSION {
                assert_eq!(&encode_response_header(st, n), h);
            }
        }
        Err(e) => {
            assert!(h[..4] != MAGIC || status.is_none() || len > MAX_BODY, "{e}");
        }
    }
}

/// Decodes a body and checks what it gives.
fn body(b: &[u8]) {
    let (r, peak) = peak_during(|| decode_snapshot(b));
    assert!(peak <= PER_BYTE * b.len() + 256, "a body of {} bytes cost {peak} bytes", b.len());
    match r {
        Ok(s) => {
            assert!(s.connections.iter().all(|c| !c.paths.is_empty()));
            let e = encode_snapshot(&s, sections::ALL);
            let again = decode_snapshot(&e).expect("an encoded snapshot decodes");
            assert_eq!(again, s, "decode(encode(s)) == s");
            assert_eq!(encode_snapshot(&again, sections::ALL), e, "the encoding is a fixed point");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn addr(inp: &mut Input) -> IpAddr {
    if inp.bool() {
        IpAddr::V6(Ipv6Addr::from(inp.array::<16>()))
    } else {
        IpAddr::V4(Ipv4Addr::from(inp.array::<4>()))
    }
}

fn sockaddr(inp: &mut Input) -> Option<SocketAddr> {
    if inp.u8().is_multiple_of(3) { None } else { Some(SocketAddr::new(addr(inp), inp.u16())) }
}

fn kind(v: u8) -> TransportKind {
    [TransportKind::Ib, TransportKind::Tcp, TransportKind::Loop][usize::from(v) % 3]
}

fn string(inp: &mut Input) -> String {
    let n = usize::from(inp.u8() % 24);
    String::from_utf8_lossy(inp.bytes(n)).into_owned()
}

fn msg(inp: &mut Input) -> MsgSnapshot {
    MsgSnapshot {
        seq: inp.u64(),
        len: inp.u32(),
        laddr: addr(inp),
        lport: inp.u16(),
        faddr: addr(inp),
        fport: inp.u16(),
        tos: inp.u8(),
        path: Some(inp.u8()).filter(|p| *p != 0xff),
    }
}

fn count(inp: &mut Input) -> usize {
    usize::from(inp.u8() % 5)
}

/// A snapshot made of the input (every field a value the codec carries).
fn snapshot(inp: &mut Input) -> Snapshot {
    let node = NodeIdent {
        pid: inp.u32(),
        engine: inp.u32(),
        uid: inp.u32(),
        command: string(inp),
        addresses: (0..count(inp)).map(|_| addr(inp)).collect(),
        gen_num: inp.u32(),
        npaths: inp.u8(),
        tcp_port: inp.u16(),
    };
    let counters = (0..count(inp)).map(|_| (string(inp), inp.u64())).collect();
    let connections = (0..count(inp))
        .map(|_| ConnSnapshot {
            id: ConnId(inp.u32()),
            laddr: addr(inp),
            faddr: addr(inp),
            transport: kind(inp.u8()),
            tos: inp.u8(),
            npaths: inp.u8(),
            peer_gen: inp.u32(),
            paths: (0..1 + count(inp))
                .map(|_| PathSnapshot {
                    index: inp.u8(),
                    state: [
                        PathState::Down,
                        PathState::Connecting,
                        PathState::Disconnecting,
                        PathState::Up,
                        PathState::Resetting,
                        PathState::Error,
                    ][usize::from(inp.u8()) % 6],
                    flags: inp.u8(),
                    next_tx_seq: inp.u64(),
                    next_rx_seq: inp.u64(),
                    send_queue: inp.u64() as usize,
                    retrans: inp.u64() as usize,
                    queued_bytes: inp.u64(),
                    connects: inp.u64(),
                })
                .collect(),
        })
        .collect();
    let sockets = (0..count(inp))
        .map(|_| SockSnapshot {
            inum: inp.u64(),
            bound: sockaddr(inp),
            connected: sockaddr(inp),
            sndbuf: inp.u32(),
            rcvbuf: inp.u32(),
            snd_bytes: inp.u64(),
            rcv_bytes: inp.u64(),
            recv_queue: inp.u64() as usize,
            transport: Some(inp.u8()).filter(|v| v % 4 != 3).map(kind),
            congested: inp.bool(),
            cong_monitor: inp.bool(),
        })
        .collect();
    let send = (0..count(inp)).map(|_| msg(inp)).collect();
    let retrans = (0..count(inp)).map(|_| msg(inp)).collect();
    let recv = (0..count(inp)).map(|_| msg(inp)).collect();
    let tcp = (0..count(inp))
        .map(|_| TransportConnInfo {
            path: if inp.bool() { Some(PathId { conn: ConnId(inp.u32()), index: inp.u8() }) } else { None },
            local: sockaddr(inp),
            peer: sockaddr(inp),
            hdr_rem: inp.u64(),
            data_rem: inp.u64(),
            last_sent_nxt: inp.u32(),
            last_expected_una: inp.u32(),
            last_seen_una: inp.u32(),
            sending: inp.bool(),
            detail: string(inp),
        })
        .collect();
    Snapshot { node, counters, connections, sockets, send, retrans, recv, tcp }
}

/// The sections of `s` in `want`, the others empty.
fn only(s: &Snapshot, want: u32) -> Snapshot {
    let on = |bit: u32| want & bit != 0;
    let pick = |bit: u32, v: &Vec<MsgSnapshot>| if on(bit) { v.clone() } else { Vec::new() };
    Snapshot {
        node: if on(sections::NODE) { s.node.clone() } else { NodeIdent::default() },
        counters: if on(sections::COUNTERS) { s.counters.clone() } else { Vec::new() },
        connections: if on(sections::CONNECTIONS) { s.connections.clone() } else { Vec::new() },
        sockets: if on(sections::SOCKETS) { s.sockets.clone() } else { Vec::new() },
        send: pick(sections::SEND, &s.send),
        retrans: pick(sections::RETRANS, &s.retrans),
        recv: pick(sections::RECV, &s.recv),
        tcp: if on(sections::TCP) { s.tcp.clone() } else { Vec::new() },
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let mode = inp.u8();
    if mode & 1 == 0 {
        // Raw: a 12-byte header, then a body.
        let h = inp.array::<HEADER_LEN>();
        headers(&h);
        body(inp.rest());
        return;
    }
    // Built: a snapshot encoded with some sections, then altered.
    let want = inp.u32() | if mode & 2 != 0 { sections::ALL } else { 0 };
    let s = snapshot(&mut inp);
    let mut enc = encode_snapshot(&s, want);
    assert_eq!(
        decode_snapshot(&enc).as_ref(),
        Ok(&only(&s, want)),
        "an encoded snapshot decodes to its wanted sections"
    );
    for _ in 0..(mode >> 2) % 8 {
        if enc.is_empty() {
            break;
        }
        let at = usize::from(inp.u16()) % enc.len();
        match inp.u8() % 5 {
            0 | 1 => enc[at] ^= inp.u8() | 1,
            2 => enc.insert(at, inp.u8()),
            3 => {
                enc.remove(at);
            }
            _ => enc.truncate(at),
        }
    }
    body(&enc);
});
