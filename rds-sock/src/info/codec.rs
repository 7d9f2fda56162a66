//! The info protocol's byte format (ours; version 1).
//!
//! One request and one response per connection, all integers
//! little-endian:
//!
//! ```text
//! request   "RDSI" | u16 version | u16 flags (0) | u32 sections wanted
//! response  "RDSI" | u16 version | u16 status | u32 body length | body
//! body      sections, each: u16 tag | u32 length | content
//! ```
//!
//! `status` is [`Status`]: 0 OK, 1 bad request, 2 unsupported version (the
//! response carries the server's version), 3 denied (the peer's uid is
//! neither ours nor 0). Section tags are the bit numbers of
//! [`super::sections`]; a reader skips tags it does not know. Lists are a
//! u32 count and length-prefixed records (u32 length, then the fields), so
//! a newer writer may append fields that an older reader skips. Strings are
//! u32 length and UTF-8; addresses a family byte (0 none, 4, 6) and the
//! octets; socket addresses an address and a u16 port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use rds_core::{
    ConnId, ConnSnapshot, MsgSnapshot, PathId, PathSnapshot, PathState, SockSnapshot, TransportConnInfo, TransportKind,
};

use super::{NodeIdent, Snapshot, sections};

pub const MAGIC: [u8; 4] = *b"RDSI";
pub const VERSION: u16 = 1;
/// Length of a request and of a response header.
pub const HEADER_LEN: usize = 12;
/// Largest body a reader accepts.
pub const MAX_BODY: usize = 256 << 20;

/// Response status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    BadRequest = 1,
    Version = 2,
    Denied = 3,
}

impl Status {
    fn from_u16(v: u16) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::BadRequest,
            2 => Status::Version,
            3 => Status::Denied,
            _ => return None,
        })
    }
}

/// A decoding failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed info message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

fn bad(what: &str) -> DecodeError {
    DecodeError(what.to_string())
}

pub fn encode_request(sections: u32) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..4].copy_from_slice(&MAGIC);
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[8..12].copy_from_slice(&sections.to_le_bytes());
    b
}

/// The sections a request asks for, or the status to answer it with.
pub fn decode_request(b: &[u8; HEADER_LEN]) -> Result<u32, Status> {
    if b[..4] != MAGIC {
        return Err(Status::BadRequest);
    }
    if u16::from_le_bytes([b[4], b[5]]) != VERSION {
        return Err(Status::Version);
    }
    Ok(u32::from_le_bytes(b[8..12].try_into().unwrap()))
}

pub fn encode_response_header(status: Status, body_len: usize) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[..4].copy_from_slice(&MAGIC);
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[6..8].copy_from_slice(&(status as u16).to_le_bytes());
    b[8..12].copy_from_slice(&(body_len as u32).to_le_bytes());
    b
}

/// (server version, status, body length).
pub fn decode_response_header(b: &[u8; HEADER_LEN]) -> Result<(u16, Status, usize), DecodeError> {
    if b[..4] != MAGIC {
        return Err(bad("bad magic"));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    let status = Status::from_u16(u16::from_le_bytes([b[6], b[7]])).ok_or_else(|| bad("unknown status"))?;
    let len = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
    if len > MAX_BODY {
        return Err(bad("body too long"));
    }
    Ok((version, status, len))
}

// ----------------------------------------------------------------------
// Writer and reader
// ----------------------------------------------------------------------

#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn addr(&mut self, a: Option<IpAddr>) {
        match a {
            None => self.u8(0),
            Some(IpAddr::V4(v)) => {
                self.u8(4);
                self.0.extend_from_slice(&v.octets());
            }
            Some(IpAddr::V6(v)) => {
                self.u8(6);
                self.0.extend_from_slice(&v.octets());
            }
        }
    }
    fn sockaddr(&mut self, a: Option<SocketAddr>) {
        self.addr(a.map(|a| a.ip()));
        self.u16(a.map_or(0, |a| a.port()));
    }
    /// A length-prefixed record.
    fn record(&mut self, f: impl FnOnce(&mut W)) {
        let at = self.0.len();
        self.u32(0);
        f(self);
        let len = (self.0.len() - at - 4) as u32;
        self.0[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    fn list<T>(&mut self, items: &[T], mut f: impl FnMut(&mut W, &T)) {
        self.u32(items.len() as u32);
        for it in items {
            self.record(|w| f(w, it));
        }
    }
    fn section(&mut self, tag: u16, f: impl FnOnce(&mut W)) {
        self.u16(tag);
        self.record(f);
    }
}

struct R<'a> {
    b: &'a [u8],
}

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(bad("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| bad("bad string"))
    }
    fn addr(&mut self) -> Result<Option<IpAddr>, DecodeError> {
        Ok(match self.u8()? {
            0 => None,
            4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(self.take(4)?).unwrap()))),
            6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(self.take(16)?).unwrap()))),
            _ => return Err(bad("bad address family")),
        })
    }
    fn need_addr(&mut self) -> Result<IpAddr, DecodeError> {
        self.addr()?.ok_or_else(|| bad("missing address"))
    }
    fn sockaddr(&mut self) -> Result<Option<SocketAddr>, DecodeError> {
        let a = self.addr()?;
        let port = self.u16()?;
        Ok(a.map(|a| SocketAddr::new(a, port)))
    }
    fn record(&mut self) -> Result<R<'a>, DecodeError> {
        let n = self.u32()? as usize;
        Ok(R { b: self.take(n)? })
    }
    fn list<T>(&mut self, mut f: impl FnMut(&mut R<'a>) -> Result<T, DecodeError>) -> Result<Vec<T>, DecodeError> {
        let n = self.u32()? as usize;
        // Every record takes at least its 4-byte length.
        if n > self.b.len() / 4 {
            return Err(bad("list longer than its section"));
        }
        (0..n).map(|_| f(&mut self.record()?)).collect()
    }
}

fn kind_code(k: Option<TransportKind>) -> u8 {
    k.map_or(0xff, |k| k.uapi() as u8)
}

fn kind_of(v: u8) -> Result<Option<TransportKind>, DecodeError> {
    Ok(match v {
        0xff => None,
        3 => Some(TransportKind::Loop),
        v => Some(TransportKind::from_uapi(i32::from(v)).ok_or_else(|| bad("bad transport"))?),
    })
}

fn state_of(v: u8) -> Result<PathState, DecodeError> {
    Ok(match v {
        0 => PathState::Down,
        1 => PathState::Connecting,
        2 => PathState::Disconnecting,
        3 => PathState::Up,
        4 => PathState::Resetting,
        5 => PathState::Error,
        _ => return Err(bad("bad path state")),
    })
}

fn tag(bit: u32) -> u16 {
    bit.trailing_zeros() as u16
}

// ----------------------------------------------------------------------
// Snapshot
// ----------------------------------------------------------------------

fn write_msg(w: &mut W, m: &MsgSnapshot) {
    w.u64(m.seq);
    w.u32(m.len);
    w.addr(Some(m.laddr));
    w.u16(m.lport);
    w.addr(Some(m.faddr));
    w.u16(m.fport);
    w.u8(m.tos);
    w.u8(m.path.unwrap_or(0xff));
}

fn read_msg(r: &mut R<'_>) -> Result<MsgSnapshot, DecodeError> {
    Ok(MsgSnapshot {
        seq: r.u64()?,
        len: r.u32()?,
        laddr: r.need_addr()?,
        lport: r.u16()?,
        faddr: r.need_addr()?,
        fport: r.u16()?,
        tos: r.u8()?,
        path: Some(r.u8()?).filter(|p| *p != 0xff),
    })
}

/// The body of a response with the sections in `want`.
pub fn encode_snapshot(s: &Snapshot, want: u32) -> Vec<u8> {
    let mut w = W::default();
    let on = |bit: u32| want & bit != 0;
    if on(sections::NODE) {
        w.section(tag(sections::NODE), |w| {
            let n = &s.node;
            w.u32(n.pid);
            w.u32(n.engine);
            w.u32(n.uid);
            w.str(&n.command);
            w.list(&n.addresses, |w, a| w.addr(Some(*a)));
            w.u32(n.gen_num);
            w.u8(n.npaths);
            w.u16(n.tcp_port);
        });
    }
    if on(sections::COUNTERS) {
        w.section(tag(sections::COUNTERS), |w| {
            w.list(&s.counters, |w, (n, v)| {
                w.str(n);
                w.u64(*v);
            })
        });
    }
    if on(sections::CONNECTIONS) {
        w.section(tag(sections::CONNECTIONS), |w| {
            w.list(&s.connections, |w, c| {
                w.u32(c.id.0);
                w.addr(Some(c.laddr));
                w.addr(Some(c.faddr));
                w.u8(kind_code(Some(c.transport)));
                w.u8(c.tos);
                w.u8(c.npaths);
                w.u32(c.peer_gen);
                w.list(&c.paths, |w, p| {
                    w.u8(p.index);
                    w.u8(p.state as u8);
                    w.u8(p.flags);
                    w.u64(p.next_tx_seq);
                    w.u64(p.next_rx_seq);
                    w.u64(p.send_queue as u64);
                    w.u64(p.retrans as u64);
                    w.u64(p.queued_bytes);
                    w.u64(p.connects);
                });
            })
        });
    }
    if on(sections::SOCKETS) {
        w.section(tag(sections::SOCKETS), |w| {
            w.list(&s.sockets, |w, k| {
                w.u64(k.inum);
                w.sockaddr(k.bound);
                w.sockaddr(k.connected);
                w.u32(k.sndbuf);
                w.u32(k.rcvbuf);
                w.u64(k.snd_bytes);
                w.u64(k.rcv_bytes);
                w.u64(k.recv_queue as u64);
                w.u8(kind_code(k.transport));
                w.u8(k.congested as u8);
                w.u8(k.cong_monitor as u8);
            })
        });
    }
    for (bit, list) in [(sections::SEND, &s.send), (sections::RETRANS, &s.retrans), (sections::RECV, &s.recv)] {
        if on(bit) {
            w.section(tag(bit), |w| w.list(list, write_msg));
        }
    }
    if on(sections::TCP) {
        w.section(tag(sections::TCP), |w| {
            w.list(&s.tcp, |w, t| {
                match t.path {
                    Some(p) => {
                        w.u8(1);
                        w.u32(p.conn.0);
                        w.u8(p.index);
                    }
                    None => w.u8(0),
                }
                w.sockaddr(t.local);
                w.sockaddr(t.peer);
                w.u64(t.hdr_rem);
                w.u64(t.data_rem);
                w.u32(t.last_sent_nxt);
                w.u32(t.last_expected_una);
                w.u32(t.last_seen_una);
                w.u8(t.sending as u8);
                w.str(&t.detail);
            })
        });
    }
    w.0
}

/// Parses a response body; sections it does not carry stay empty.
pub fn decode_snapshot(body: &[u8]) -> Result<Snapshot, DecodeError> {
    let mut s = Snapshot::default();
    let mut r = R { b: body };
    while !r.b.is_empty() {
        let t = r.u16()?;
        let mut c = r.record()?;
        let c = &mut c;
        match t {
            t if t == tag(sections::NODE) => {
                s.node = NodeIdent {
                    pid: c.u32()?,
                    engine: c.u32()?,
                    uid: c.u32()?,
                    command: c.str()?,
                    addresses: c.list(|r| r.need_addr())?,
                    gen_num: c.u32()?,
                    npaths: c.u8()?,
                    tcp_port: c.u16()?,
                }
            }
            t if t == tag(sections::COUNTERS) => s.counters = c.list(|r| Ok((r.str()?, r.u64()?)))?,
            t if t == tag(sections::CONNECTIONS) => {
                s.connections = c.list(|r| {
                    Ok(ConnSnapshot {
                        id: ConnId(r.u32()?),
                        laddr: r.need_addr()?,
                        faddr: r.need_addr()?,
                        transport: kind_of(r.u8()?)?.ok_or_else(|| bad("connection without transport"))?,
                        tos: r.u8()?,
                        npaths: r.u8()?,
                        peer_gen: r.u32()?,
                        paths: r.list(|r| {
                            Ok(PathSnapshot {
                                index: r.u8()?,
                                state: state_of(r.u8()?)?,
                                flags: r.u8()?,
                                next_tx_seq: r.u64()?,
                                next_rx_seq: r.u64()?,
                                send_queue: r.u64()? as usize,
                                retrans: r.u64()? as usize,
                                queued_bytes: r.u64()?,
                                connects: r.u64()?,
                            })
                        })?,
                    })
                })?;
                if s.connections.iter().any(|c| c.paths.is_empty()) {
                    return Err(bad("connection without paths"));
                }
            }
            t if t == tag(sections::SOCKETS) => {
                s.sockets = c.list(|r| {
                    Ok(SockSnapshot {
                        inum: r.u64()?,
                        bound: r.sockaddr()?,
                        connected: r.sockaddr()?,
                        sndbuf: r.u32()?,
                        rcvbuf: r.u32()?,
                        snd_bytes: r.u64()?,
                        rcv_bytes: r.u64()?,
                        recv_queue: r.u64()? as usize,
                        transport: kind_of(r.u8()?)?,
                        congested: r.u8()? != 0,
                        cong_monitor: r.u8()? != 0,
                    })
                })?
            }
            t if t == tag(sections::SEND) => s.send = c.list(read_msg)?,
            t if t == tag(sections::RETRANS) => s.retrans = c.list(read_msg)?,
            t if t == tag(sections::RECV) => s.recv = c.list(read_msg)?,
            t if t == tag(sections::TCP) => {
                s.tcp = c.list(|r| {
                    let path = match r.u8()? {
                        0 => None,
                        _ => Some(PathId { conn: ConnId(r.u32()?), index: r.u8()? }),
                    };
                    Ok(TransportConnInfo {
                        path,
                        local: r.sockaddr()?,
                        peer: r.sockaddr()?,
                        hdr_rem: r.u64()?,
                        data_rem: r.u64()?,
                        last_sent_nxt: r.u32()?,
                        last_expected_una: r.u32()?,
                        last_seen_una: r.u32()?,
                        sending: r.u8()? != 0,
                        detail: r.str()?,
                    })
                })?
            }
            // A section of a newer version: skipped.
            _ => {}
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests;
