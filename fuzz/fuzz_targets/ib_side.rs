//! rds-ib's verbs-only side channel: the frame header (`parse_header`), the
//! parameters (`Params::decode`) and the handshake's every step
//! (`Server::on_hello`, `on_client_params`, `on_ready`; `Client::
//! on_challenge`, `on_server_params`, `on_ready`), fed genuine frames of
//! clients and servers holding the key or another key, replayed to other
//! sessions, reflected to the other role, altered, cut or extended, and raw
//! bytes.
//!
//! Checked: the header and parameter decoders accept exactly the documented
//! format and what they accept re-encodes byte for byte; a step that
//! authenticates accepts only a frame that a party holding the same key
//! produced for the other role in a session with the same nonces (and, for
//! SERVER_PARAMS, bound to the CLIENT_PARAMS this client sent), and returns
//! the parameters that party sent; a HELLO is accepted only when well
//! formed; errors are typed, never panics.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use rds_fuzz::{Counting, Input, peak_during};
use rds_ib::sidechannel::{
    Client, HEADER_LEN, HELLO_LEN, Key, Kind, MAGIC, NONCE_LEN, PARAMS_LEN, Params, Server, SideError, VERSION,
    parse_header,
};

#[global_allocator]
static ALLOC: Counting = Counting;

const KINDS: [Kind; 5] = [Kind::Hello, Kind::Challenge, Kind::ClientParams, Kind::ServerParams, Kind::Ready];

fn kind_of(v: u8) -> Option<Kind> {
    KINDS.iter().copied().find(|k| *k as u8 == v)
}

/// `parse_header` by the documented layout.
fn reference_header(h: &[u8]) -> Result<(Kind, usize), SideError> {
    if h.len() < HEADER_LEN {
        return Err(SideError::Truncated { need: HEADER_LEN, got: h.len() });
    }
    if h[..4] != MAGIC {
        return Err(SideError::BadMagic(h[..4].try_into().unwrap()));
    }
    if h[4] != VERSION {
        return Err(SideError::Version(h[4]));
    }
    let kind = kind_of(h[5]).ok_or(SideError::UnknownKind(h[5]))?;
    let len = usize::from(u16::from_be_bytes([h[6], h[7]]));
    let want = match kind {
        Kind::Hello => 32,
        Kind::Challenge => 64,
        Kind::ClientParams | Kind::ServerParams => 112,
        Kind::Ready => 32,
    };
    if len != want {
        return Err(SideError::BadLength { kind, len });
    }
    Ok((kind, len))
}

/// The pure decoders on the raw input.
fn codec(data: &[u8]) {
    let (r, peak) = peak_during(|| parse_header(data));
    assert_eq!(peak, 0);
    assert_eq!(r, reference_header(data));
    if let Ok((kind, len)) = r {
        assert_eq!(len, kind.body_len());
    }
    // Parameters: any slice; exactly 80 bytes may decode, and then
    // re-encode to the same bytes.
    for b in [data, data.get(..PARAMS_LEN).unwrap_or(data)] {
        let (r, peak) = peak_during(|| Params::decode(b));
        assert_eq!(peak, 0);
        match r {
            Ok(p) => {
                assert_eq!(b.len(), PARAMS_LEN);
                assert_eq!(&p.encode().unwrap()[..], b, "params round-trip byte for byte");
                assert!(p.qpn >= 2 && p.qpn <= 0xff_ffff && p.psn <= 0xff_ffff);
                assert!(matches!(p.mtu, 256 | 512 | 1024 | 2048 | 4096));
                assert!(!p.local.is_unspecified() && !p.peer.is_unspecified());
            }
            Err(e) => {
                if b.len() == PARAMS_LEN {
                    assert!(matches!(e, SideError::BadField(_)), "{e:?}");
                } else {
                    assert!(matches!(e, SideError::Truncated { .. } | SideError::Trailing { .. }), "{e:?}");
                }
                let _ = (e.errno(), e.to_string(), std::io::Error::from(e));
            }
        }
    }
}

/// A frame some party produced, with the session it belongs to.
#[derive(Clone)]
struct Sent {
    from_client: bool,
    key: usize,
    kind: Kind,
    nc: [u8; NONCE_LEN],
    ns: [u8; NONCE_LEN],
    /// SERVER_PARAMS: the CLIENT_PARAMS body it is bound to.
    bound: [u8; PARAMS_LEN],
    bytes: Vec<u8>,
}

struct C {
    c: Client,
    key: usize,
    nc: [u8; NONCE_LEN],
    ns: Option<[u8; NONCE_LEN]>,
    sent: Option<[u8; PARAMS_LEN]>,
}

struct S {
    s: Server,
    key: usize,
    ns: [u8; NONCE_LEN],
    nc: Option<[u8; NONCE_LEN]>,
    client_raw: Option<[u8; PARAMS_LEN]>,
}

fn params(inp: &mut Input) -> Params {
    let sel = inp.u8();
    let addr = |inp: &mut Input, v6: bool| -> IpAddr {
        if v6 { IpAddr::V6(Ipv6Addr::from(inp.array::<16>())) } else { IpAddr::V4(Ipv4Addr::from(inp.array::<4>())) }
    };
    Params {
        qpn: if sel & 1 != 0 { inp.u32() } else { 2 + u32::from(inp.u16()) },
        psn: if sel & 2 != 0 { inp.u32() } else { inp.u32() & 0xff_ffff },
        gid: inp.array::<16>(),
        lid: inp.u16(),
        mtu: if sel & 4 != 0 { inp.u16() } else { 256 << (inp.u8() % 5) },
        rds_version: inp.u16(),
        path: inp.u16(),
        credits: inp.u32(),
        tos: inp.u8(),
        ack_seq: inp.u64(),
        local: addr(inp, sel & 8 != 0),
        peer: addr(inp, sel & 16 != 0),
    }
}

fn nonce(inp: &mut Input) -> [u8; NONCE_LEN] {
    // Few distinct nonces, so that sessions sometimes share them.
    [inp.u8() % 4; NONCE_LEN]
}

fn body(m: &[u8], at: usize, n: usize) -> Vec<u8> {
    m[at..at + n].to_vec()
}

fuzz_target!(|data: &[u8]| {
    codec(data);
    let keys = [Key::new(vec![0x4b; 32]).unwrap(), Key::new(b"another key, 24 bytes!!".to_vec()).unwrap()];
    let mut inp = Input(data);
    let mut clients: Vec<C> = Vec::new();
    let mut servers: Vec<S> = Vec::new();
    let mut sent: Vec<Sent> = Vec::new();

    for _ in 0..200 {
        let Some(op) = inp.byte() else { break };
        match op % 8 {
            // A new client (sends its HELLO) or server.
            0 => {
                if clients.len() < 3 {
                    let key = usize::from(op >> 7);
                    let nc = nonce(&mut inp);
                    let (c, hello) = Client::new(&keys[key], nc);
                    assert_eq!(hello.len(), HELLO_LEN);
                    assert_eq!(reference_header(&hello), Ok((Kind::Hello, NONCE_LEN)));
                    let s = Sent {
                        from_client: true,
                        key,
                        kind: Kind::Hello,
                        nc,
                        ns: [0; 32],
                        bound: [0; 80],
                        bytes: hello.to_vec(),
                    };
                    sent.push(s);
                    clients.push(C { c, key, nc, ns: None, sent: None });
                }
            }
            1 => {
                if servers.len() < 3 {
                    let key = usize::from(op >> 7);
                    let ns = nonce(&mut inp);
                    servers.push(S { s: Server::new(&keys[key], ns), key, ns, nc: None, client_raw: None });
                }
            }
            // A party produces its next frame (parameters or READY).
            2 => {
                let k = usize::from(inp.u8());
                if op & 0x10 != 0 && !clients.is_empty() {
                    let n = clients.len();
                    let c = &mut clients[k % n];
                    let (frame, kind) = if op & 0x20 != 0 {
                        let p = params(&mut inp);
                        let r = c.c.params(&p);
                        if let Err(SideError::BadField(_)) = r {
                            assert_eq!(p.encode().err(), r.as_ref().err().cloned());
                        }
                        (r.map(|m| m.to_vec()), Kind::ClientParams)
                    } else {
                        (c.c.ready().map(|m| m.to_vec()), Kind::Ready)
                    };
                    if let Ok(m) = frame {
                        let ns = c.ns.expect("a client produces frames only after the challenge");
                        if kind == Kind::ClientParams {
                            c.sent = Some(body(&m, HEADER_LEN, PARAMS_LEN).try_into().unwrap());
                        }
                        sent.push(Sent { from_client: true, key: c.key, kind, nc: c.nc, ns, bound: [0; 80], bytes: m });
                    }
                } else if !servers.is_empty() {
                    let n = servers.len();
                    let s = &mut servers[k % n];
                    let (frame, kind) = if op & 0x20 != 0 {
                        let p = params(&mut inp);
                        (s.s.params(&p).map(|m| m.to_vec()), Kind::ServerParams)
                    } else {
                        (s.s.ready().map(|m| m.to_vec()), Kind::Ready)
                    };
                    if let Ok(m) = frame {
                        let nc = s.nc.expect("a server produces frames only after HELLO");
                        let bound = s.client_raw.expect("and after the client's parameters");
                        sent.push(Sent { from_client: false, key: s.key, kind, nc, ns: s.ns, bound, bytes: m });
                    }
                }
            }
            // A frame delivered to a party: one that was sent (maybe altered)
            // or raw bytes.
            _ => {
                let frame: Vec<u8> = if op % 8 == 7 || sent.is_empty() {
                    let n = usize::from(inp.u8());
                    inp.bytes(n).to_vec()
                } else {
                    let i = usize::from(inp.u8()) % sent.len();
                    let mut f = sent[i].bytes.clone();
                    match op % 8 {
                        3 | 4 => {}
                        5 => {
                            let at = usize::from(inp.u8()) % f.len();
                            f[at] ^= inp.u8() | 1;
                        }
                        _ => match inp.u8() % 4 {
                            0 => f.truncate(usize::from(inp.u8()) % f.len()),
                            1 => f.push(inp.u8()),
                            // Relabelled as another kind (length adjusted).
                            _ => {
                                let k = KINDS[usize::from(inp.u8()) % 5];
                                f[5] = k as u8;
                                f[6..8].copy_from_slice(&(k.body_len() as u16).to_be_bytes());
                                f.resize(HEADER_LEN + k.body_len(), 0);
                            }
                        },
                    }
                    f
                };
                let k = usize::from(inp.u8());
                let matches = |s: &Sent, from_client: bool, kind: Kind, key: usize, nc: &[u8; 32], ns: &[u8; 32]| {
                    s.from_client == from_client
                        && s.kind == kind
                        && s.key == key
                        && &s.nc == nc
                        && &s.ns == ns
                        && s.bytes == frame
                };
                if op & 0x10 != 0 && !clients.is_empty() {
                    let n = clients.len();
                    let c = &mut clients[k % n];
                    let step = match (c.ns, c.sent) {
                        (None, _) => Kind::Challenge,
                        (Some(_), _) if op & 0x20 != 0 => Kind::ServerParams,
                        _ => Kind::Ready,
                    };
                    // Sometimes a step out of order.
                    let step = if op & 0x40 != 0 { KINDS[usize::from(inp.u8()) % 5] } else { step };
                    let r = match step {
                        Kind::Challenge => c.c.on_challenge(&frame).map(|()| None),
                        Kind::ServerParams => c.c.on_server_params(&frame).map(Some),
                        _ => c.c.on_ready(&frame).map(|()| None),
                    };
                    let step = if matches!(step, Kind::Challenge | Kind::ServerParams) { step } else { Kind::Ready };
                    match r {
                        Ok(got) => {
                            let ns: [u8; 32] = if step == Kind::Challenge {
                                frame[HEADER_LEN..HEADER_LEN + NONCE_LEN].try_into().unwrap()
                            } else {
                                c.ns.unwrap()
                            };
                            let origin = sent.iter().find(|s| {
                                matches(s, false, step, c.key, &c.nc, &ns)
                                    && (step != Kind::ServerParams || Some(s.bound) == c.sent)
                            });
                            assert!(origin.is_some(), "client accepted a {step:?} no server with its key sent it");
                            if let Some(p) = got {
                                assert_eq!(p.encode().unwrap()[..], frame[HEADER_LEN..HEADER_LEN + PARAMS_LEN]);
                            }
                            if step == Kind::Challenge {
                                c.ns = Some(ns);
                            }
                        }
                        Err(e) => {
                            let _ = (e.errno(), e.to_string());
                        }
                    }
                } else if !servers.is_empty() {
                    let n = servers.len();
                    let s = &mut servers[k % n];
                    let step = match (s.nc, s.client_raw) {
                        (None, _) => Kind::Hello,
                        (Some(_), None) => Kind::ClientParams,
                        _ => Kind::Ready,
                    };
                    // Sometimes a step out of order.
                    let step = if op & 0x40 != 0 { KINDS[usize::from(inp.u8()) % 5] } else { step };
                    let step = if matches!(step, Kind::Hello | Kind::ClientParams) { step } else { Kind::Ready };
                    let r = match step {
                        Kind::Hello => s.s.on_hello(&frame).map(|ch| Some(ch.to_vec())),
                        Kind::ClientParams => s.s.on_client_params(&frame).map(|p| {
                            assert_eq!(p.encode().unwrap()[..], frame[HEADER_LEN..HEADER_LEN + PARAMS_LEN]);
                            None
                        }),
                        _ => s.s.on_ready(&frame).map(|()| None),
                    };
                    match r {
                        Ok(challenge) => {
                            if step == Kind::Hello {
                                // Unauthenticated: any well-formed HELLO.
                                assert_eq!(frame.len(), HELLO_LEN);
                                assert_eq!(reference_header(&frame), Ok((Kind::Hello, NONCE_LEN)));
                                assert!(s.nc.is_none(), "HELLO accepted twice");
                                let nc: [u8; 32] = frame[HEADER_LEN..].try_into().unwrap();
                                s.nc = Some(nc);
                                let ch = challenge.unwrap();
                                assert_eq!(reference_header(&ch), Ok((Kind::Challenge, 64)));
                                assert_eq!(ch[HEADER_LEN..HEADER_LEN + NONCE_LEN], s.ns);
                                let ns = s.ns;
                                sent.push(Sent {
                                    from_client: false,
                                    key: s.key,
                                    kind: Kind::Challenge,
                                    nc,
                                    ns,
                                    bound: [0; 80],
                                    bytes: ch,
                                });
                            } else {
                                let nc = s.nc.expect("authenticated steps come after HELLO");
                                let origin = sent.iter().find(|x| matches(x, true, step, s.key, &nc, &s.ns));
                                assert!(origin.is_some(), "server accepted a {step:?} no client with its key sent it");
                                if step == Kind::ClientParams {
                                    s.client_raw = Some(frame[HEADER_LEN..HEADER_LEN + PARAMS_LEN].try_into().unwrap());
                                }
                            }
                        }
                        Err(e) => {
                            let _ = (e.errno(), e.to_string());
                        }
                    }
                }
            }
        }
    }
});
