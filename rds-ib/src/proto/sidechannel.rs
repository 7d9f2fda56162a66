//! The verbs-only setup's side channel (sans-IO): the messages two RDS-IB
//! nodes exchange over a TCP connection instead of RDMA CM, and the
//! challenge-response handshake that authenticates them with a pre-shared
//! key before either creates a queue pair.
//!
//! This is our own protocol (the kernel has no verbs-only mode); both ends
//! are this crate. Every message is a fixed-size frame:
//!
//! ```text
//! 0       4    5     6        8
//! | "RDIB" | v=1 | kind | body length (u16 BE) | body ...
//! ```
//!
//! | kind | sender | body | bytes |
//! | --- | --- | --- | --- |
//! | 1 HELLO | connecting side | its nonce `Nc` | 32 |
//! | 2 CHALLENGE | accepting side | its nonce `Ns`, proof | 32 + 32 |
//! | 3 CLIENT_PARAMS | connecting side | [`Params`], MAC | 80 + 32 |
//! | 4 SERVER_PARAMS | accepting side | [`Params`], MAC | 80 + 32 |
//! | 5 READY | both | MAC | 32 |
//!
//! Every proof and MAC is HMAC-SHA256 under the key over a label naming the
//! role and the step, both nonces, and the frame's own header and body (the
//! server's parameters also cover the client's, so the two are bound
//! together). The order:
//!
//! 1. the client sends HELLO with a fresh 32-byte nonce;
//! 2. the server answers CHALLENGE with its own fresh nonce and a proof of
//!    the key over both nonces (the client checks it, so it creates no QP
//!    for a server without the key);
//! 3. the client creates its QP and sends CLIENT_PARAMS with its MAC: the
//!    server checks it before it creates anything (an unauthenticated or
//!    replayed CLIENT_PARAMS, bound to an old `Ns`, is refused here);
//! 4. the server creates its QP, moves it to RTR and sends SERVER_PARAMS;
//! 5. each side, once its QP is in RTR and RTS, sends READY; a side
//!    starts sending RDS frames only after the peer's READY (so the peer's
//!    receive queue is in RTR).
//!
//! Nonces and PSNs come from the OS CSPRNG (`getrandom(2)`, [`crate::secrets`],
//! outside this sans-IO module, as is reading the key file). Tags are
//! compared in constant time. Any malformed, truncated, out-of-order or
//! unauthenticated frame is a typed [`SideError`]; nothing here panics on
//! input.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr};

use sha2::{Digest, Sha256};

/// The frame magic.
pub const MAGIC: [u8; 4] = *b"RDIB";
/// The side channel protocol version we speak.
pub const VERSION: u8 = 1;
/// Frame header bytes (magic, version, kind, body length).
pub const HEADER_LEN: usize = 8;
/// Nonce bytes.
pub const NONCE_LEN: usize = 32;
/// HMAC-SHA256 tag bytes.
pub const MAC_LEN: usize = 32;
/// Encoded [`Params`] bytes.
pub const PARAMS_LEN: usize = 80;
/// The shortest pre-shared key accepted.
pub const MIN_KEY_LEN: usize = 16;
/// The default TCP port of the side channel (RDMA CM's RDS port is 18634).
pub const DEFAULT_PORT: u16 = 18635;

/// Whole frame sizes.
pub const HELLO_LEN: usize = HEADER_LEN + NONCE_LEN;
pub const CHALLENGE_LEN: usize = HEADER_LEN + NONCE_LEN + MAC_LEN;
pub const PARAMS_MSG_LEN: usize = HEADER_LEN + PARAMS_LEN + MAC_LEN;
pub const READY_LEN: usize = HEADER_LEN + MAC_LEN;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Challenge = 2,
    ClientParams = 3,
    ServerParams = 4,
    Ready = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Challenge,
            3 => Kind::ClientParams,
            4 => Kind::ServerParams,
            5 => Kind::Ready,
            _ => return None,
        })
    }

    /// The body length of this kind (fixed).
    pub fn body_len(self) -> usize {
        match self {
            Kind::Hello => NONCE_LEN,
            Kind::Challenge => NONCE_LEN + MAC_LEN,
            Kind::ClientParams | Kind::ServerParams => PARAMS_LEN + MAC_LEN,
            Kind::Ready => MAC_LEN,
        }
    }
}

/// Why a side channel frame or step was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SideError {
    /// Fewer bytes than the frame needs.
    Truncated {
        need: usize,
        got: usize,
    },
    /// More bytes than the frame holds.
    Trailing {
        want: usize,
        got: usize,
    },
    BadMagic([u8; 4]),
    /// A side channel version we do not speak.
    Version(u8),
    /// A kind number that does not exist.
    UnknownKind(u8),
    /// A frame of another kind than the step expects.
    UnexpectedKind {
        want: Kind,
        got: Kind,
    },
    /// A body length other than the kind's.
    BadLength {
        kind: Kind,
        len: usize,
    },
    /// A parameter out of its range.
    BadField(&'static str),
    /// A proof or MAC did not verify: the peer does not have the key, or the
    /// frame was altered or replayed.
    AuthFailed,
    /// A step taken out of order.
    State(&'static str),
    /// A key shorter than [`MIN_KEY_LEN`].
    ShortKey(usize),
}

impl SideError {
    /// The errno this error maps to.
    pub fn errno(&self) -> i32 {
        match self {
            SideError::AuthFailed => libc::EACCES,
            SideError::Version(_) => libc::EPROTONOSUPPORT,
            SideError::State(_) | SideError::ShortKey(_) => libc::EINVAL,
            _ => libc::EPROTO,
        }
    }
}

impl fmt::Display for SideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SideError::Truncated { need, got } => write!(f, "side channel frame truncated ({got} of {need} bytes)"),
            SideError::Trailing { want, got } => {
                write!(f, "side channel frame too long ({got} bytes, {want} expected)")
            }
            SideError::BadMagic(m) => write!(f, "side channel: bad magic {m:02x?}"),
            SideError::Version(v) => write!(f, "side channel version {v} not supported (we speak {VERSION})"),
            SideError::UnknownKind(k) => write!(f, "side channel: unknown frame kind {k}"),
            SideError::UnexpectedKind { want, got } => {
                write!(f, "side channel: {got:?} frame where {want:?} was expected")
            }
            SideError::BadLength { kind, len } => write!(f, "side channel: {kind:?} frame with a {len}-byte body"),
            SideError::BadField(w) => write!(f, "side channel: bad {w}"),
            SideError::AuthFailed => write!(f, "side channel: authentication failed"),
            SideError::State(w) => write!(f, "side channel: out of order: {w}"),
            SideError::ShortKey(n) => write!(f, "side channel key of {n} bytes (at least {MIN_KEY_LEN} needed)"),
        }
    }
}

impl std::error::Error for SideError {}

impl From<SideError> for io::Error {
    fn from(e: SideError) -> io::Error {
        let kind = io::Error::from_raw_os_error(e.errno()).kind();
        io::Error::new(kind, format!("{e} (errno {})", e.errno()))
    }
}

/// HMAC-SHA256 (RFC 2104) over the concatenation of `parts`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut ipad = [0x36u8; BLOCK];
    let mut opad = [0x5cu8; BLOCK];
    for i in 0..BLOCK {
        ipad[i] ^= k[i];
        opad[i] ^= k[i];
    }
    let mut inner = Sha256::new();
    inner.update(ipad);
    for p in parts {
        inner.update(p);
    }
    let ih = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(opad);
    outer.update(ih);
    outer.finalize().into()
}

/// Equality of two byte strings in time independent of where they differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut d = 0u8;
    for (x, y) in a.iter().zip(b) {
        d |= x ^ y;
    }
    std::hint::black_box(d) == 0
}

/// A pre-shared key (at least [`MIN_KEY_LEN`] bytes). Its `Debug` does not
/// show the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Vec<u8>);

impl Key {
    pub fn new(bytes: Vec<u8>) -> Result<Key, SideError> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(SideError::ShortKey(bytes.len()));
        }
        Ok(Key(bytes))
    }

    /// A key file's contents: the bytes with surrounding ASCII whitespace
    /// (a trailing newline) removed.
    pub fn from_file_contents(bytes: &[u8]) -> Result<Key, SideError> {
        Key::new(bytes.trim_ascii().to_vec())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

/// What one side tells the other about its queue pair and its end of the
/// RDS connection (what the RDMA CM private data and the CM itself carry
/// in the CM mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// The sender's QP number (24 bits).
    pub qpn: u32,
    /// The first PSN the sender will send with (24 bits).
    pub psn: u32,
    /// The sender's GID (RoCE: the IPv4-mapped address of its RoCE v2 GID).
    pub gid: [u8; 16],
    /// The sender's port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The sender's active path MTU in bytes (256, 512, 1024, 2048, 4096).
    pub mtu: u16,
    /// The RDS protocol version proposed (client) or chosen (server).
    pub rds_version: u16,
    /// The RDS path index (0: IB has no multipath).
    pub path: u16,
    /// Initial credits (0: no flow control, as the kernel advertises).
    pub credits: u32,
    /// Type of service.
    pub tos: u8,
    /// The last sequence the sender received on this path before (0).
    pub ack_seq: u64,
    /// The sender's RDS address.
    pub local: IpAddr,
    /// The RDS address the sender talks to.
    pub peer: IpAddr,
}

fn ip16(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

fn ip_from16(b: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(b);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

impl Params {
    pub fn encode(&self) -> Result<[u8; PARAMS_LEN], SideError> {
        self.check()?;
        let mut b = [0u8; PARAMS_LEN];
        b[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.to_be_bytes());
        b[8..24].copy_from_slice(&self.gid);
        b[24..26].copy_from_slice(&self.lid.to_be_bytes());
        b[26..28].copy_from_slice(&self.mtu.to_be_bytes());
        b[28..30].copy_from_slice(&self.rds_version.to_be_bytes());
        b[30..32].copy_from_slice(&self.path.to_be_bytes());
        b[32..36].copy_from_slice(&self.credits.to_be_bytes());
        b[36] = self.tos;
        b[40..48].copy_from_slice(&self.ack_seq.to_be_bytes());
        b[48..64].copy_from_slice(&ip16(self.local));
        b[64..80].copy_from_slice(&ip16(self.peer));
        Ok(b)
    }

    pub fn decode(b: &[u8]) -> Result<Params, SideError> {
        if b.len() < PARAMS_LEN {
            return Err(SideError::Truncated { need: PARAMS_LEN, got: b.len() });
        }
        if b.len() > PARAMS_LEN {
            return Err(SideError::Trailing { want: PARAMS_LEN, got: b.len() });
        }
        let u16_at = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let a16 = |o: usize| {
            let mut x = [0u8; 16];
            x.copy_from_slice(&b[o..o + 16]);
            x
        };
        if b[37..40] != [0, 0, 0] {
            return Err(SideError::BadField("reserved bytes"));
        }
        let mut ack = [0u8; 8];
        ack.copy_from_slice(&b[40..48]);
        let p = Params {
            qpn: u32_at(0),
            psn: u32_at(4),
            gid: a16(8),
            lid: u16_at(24),
            mtu: u16_at(26),
            rds_version: u16_at(28),
            path: u16_at(30),
            credits: u32_at(32),
            tos: b[36],
            ack_seq: u64::from_be_bytes(ack),
            local: ip_from16(a16(48)),
            peer: ip_from16(a16(64)),
        };
        p.check()?;
        Ok(p)
    }

    fn check(&self) -> Result<(), SideError> {
        if self.qpn > 0x00ff_ffff || self.qpn < 2 {
            return Err(SideError::BadField("QP number"));
        }
        if self.psn > 0x00ff_ffff {
            return Err(SideError::BadField("PSN"));
        }
        if !matches!(self.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(SideError::BadField("MTU"));
        }
        if self.local.is_unspecified() || self.peer.is_unspecified() {
            return Err(SideError::BadField("address"));
        }
        Ok(())
    }
}

fn header(kind: Kind) -> [u8; HEADER_LEN] {
    let len = kind.body_len() as u16;
    let l = len.to_be_bytes();
    [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION, kind as u8, l[0], l[1]]
}

/// Checks a frame header; returns its kind and the body length that
/// follows (for readers: read [`HEADER_LEN`] bytes, then this many).
pub fn parse_header(h: &[u8]) -> Result<(Kind, usize), SideError> {
    if h.len() < HEADER_LEN {
        return Err(SideError::Truncated { need: HEADER_LEN, got: h.len() });
    }
    let magic = [h[0], h[1], h[2], h[3]];
    if magic != MAGIC {
        return Err(SideError::BadMagic(magic));
    }
    if h[4] != VERSION {
        return Err(SideError::Version(h[4]));
    }
    let kind = Kind::from_u8(h[5]).ok_or(SideError::UnknownKind(h[5]))?;
    let len = u16::from_be_bytes([h[6], h[7]]) as usize;
    if len != kind.body_len() {
        return Err(SideError::BadLength { kind, len });
    }
    Ok((kind, len))
}

/// Splits a whole frame of kind `want` into header and body.
fn parse_frame(msg: &[u8], want: Kind) -> Result<(&[u8], &[u8]), SideError> {
    let (kind, len) = parse_header(msg)?;
    if kind != want {
        return Err(SideError::UnexpectedKind { want, got: kind });
    }
    let need = HEADER_LEN + len;
    if msg.len() < need {
        return Err(SideError::Truncated { need, got: msg.len() });
    }
    if msg.len() > need {
        return Err(SideError::Trailing { want: need, got: msg.len() });
    }
    Ok(msg.split_at(HEADER_LEN))
}

/// The MAC labels (the first input of each HMAC, after the key).
pub const L_SERVER_PROOF: &[u8] = b"rds-ib side channel v1: server proof";
pub const L_CLIENT_PARAMS: &[u8] = b"rds-ib side channel v1: client params";
pub const L_SERVER_PARAMS: &[u8] = b"rds-ib side channel v1: server params";
pub const L_CLIENT_READY: &[u8] = b"rds-ib side channel v1: client ready";
pub const L_SERVER_READY: &[u8] = b"rds-ib side channel v1: server ready";

/// What both sides know once the nonces are exchanged.
struct Session {
    key: Key,
    nc: [u8; NONCE_LEN],
    ns: [u8; NONCE_LEN],
}

impl Session {
    fn mac(&self, label: &[u8], rest: &[&[u8]]) -> [u8; MAC_LEN] {
        let mut parts: Vec<&[u8]> = vec![label, &self.nc, &self.ns];
        parts.extend_from_slice(rest);
        hmac_sha256(&self.key.0, &parts)
    }

    fn params_msg(
        &self,
        kind: Kind,
        label: &[u8],
        p: &Params,
        bound: &[u8],
    ) -> Result<[u8; PARAMS_MSG_LEN], SideError> {
        let h = header(kind);
        let body = p.encode()?;
        let tag = self.mac(label, &[bound, &h, &body]);
        let mut out = [0u8; PARAMS_MSG_LEN];
        out[..HEADER_LEN].copy_from_slice(&h);
        out[HEADER_LEN..HEADER_LEN + PARAMS_LEN].copy_from_slice(&body);
        out[HEADER_LEN + PARAMS_LEN..].copy_from_slice(&tag);
        Ok(out)
    }

    /// Verifies a params frame; the MAC before anything in the body counts.
    fn open_params(
        &self,
        msg: &[u8],
        kind: Kind,
        label: &[u8],
        bound: &[u8],
    ) -> Result<(Params, [u8; PARAMS_LEN]), SideError> {
        let (h, body) = parse_frame(msg, kind)?;
        let (p, tag) = body.split_at(PARAMS_LEN);
        if !ct_eq(&self.mac(label, &[bound, h, p]), tag) {
            return Err(SideError::AuthFailed);
        }
        let mut raw = [0u8; PARAMS_LEN];
        raw.copy_from_slice(p);
        Ok((Params::decode(p)?, raw))
    }

    fn ready_msg(&self, label: &[u8]) -> [u8; READY_LEN] {
        let h = header(Kind::Ready);
        let tag = self.mac(label, &[&h]);
        let mut out = [0u8; READY_LEN];
        out[..HEADER_LEN].copy_from_slice(&h);
        out[HEADER_LEN..].copy_from_slice(&tag);
        out
    }

    fn open_ready(&self, msg: &[u8], label: &[u8]) -> Result<(), SideError> {
        let (h, body) = parse_frame(msg, Kind::Ready)?;
        if ct_eq(&self.mac(label, &[h]), body) { Ok(()) } else { Err(SideError::AuthFailed) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Start,
    Authenticated,
    ParamsSent,
    Established,
    Ready,
}

/// The connecting side of the handshake.
pub struct Client {
    key: Key,
    nc: [u8; NONCE_LEN],
    session: Option<Session>,
    sent: Option<[u8; PARAMS_LEN]>,
    step: Step,
}

impl Client {
    /// Starts a handshake with a fresh nonce `nc`; returns the HELLO frame
    /// to send.
    pub fn new(key: &Key, nc: [u8; NONCE_LEN]) -> (Client, [u8; HELLO_LEN]) {
        let mut hello = [0u8; HELLO_LEN];
        hello[..HEADER_LEN].copy_from_slice(&header(Kind::Hello));
        hello[HEADER_LEN..].copy_from_slice(&nc);
        (Client { key: key.clone(), nc, session: None, sent: None, step: Step::Start }, hello)
    }

    /// The server's CHALLENGE: checks its proof of the key. Only after this
    /// may the client create its QP.
    pub fn on_challenge(&mut self, msg: &[u8]) -> Result<(), SideError> {
        if self.step != Step::Start {
            return Err(SideError::State("CHALLENGE after the handshake started"));
        }
        let (h, body) = parse_frame(msg, Kind::Challenge)?;
        let mut ns = [0u8; NONCE_LEN];
        ns.copy_from_slice(&body[..NONCE_LEN]);
        let s = Session { key: self.key.clone(), nc: self.nc, ns };
        if !ct_eq(&s.mac(L_SERVER_PROOF, &[h]), &body[NONCE_LEN..]) {
            return Err(SideError::AuthFailed);
        }
        self.session = Some(s);
        self.step = Step::Authenticated;
        Ok(())
    }

    /// The CLIENT_PARAMS frame for `p` (after [`Client::on_challenge`]).
    pub fn params(&mut self, p: &Params) -> Result<[u8; PARAMS_MSG_LEN], SideError> {
        let s = match (&self.session, self.step) {
            (Some(s), Step::Authenticated) => s,
            _ => return Err(SideError::State("params before the server proved the key")),
        };
        let m = s.params_msg(Kind::ClientParams, L_CLIENT_PARAMS, p, &[])?;
        let mut raw = [0u8; PARAMS_LEN];
        raw.copy_from_slice(&m[HEADER_LEN..HEADER_LEN + PARAMS_LEN]);
        self.sent = Some(raw);
        self.step = Step::ParamsSent;
        Ok(m)
    }

    /// The server's SERVER_PARAMS: verified (bound to what we sent) and
    /// decoded.
    pub fn on_server_params(&mut self, msg: &[u8]) -> Result<Params, SideError> {
        let (Some(s), Some(sent), Step::ParamsSent) = (&self.session, &self.sent, self.step) else {
            return Err(SideError::State("SERVER_PARAMS before CLIENT_PARAMS"));
        };
        let (p, _) = s.open_params(msg, Kind::ServerParams, L_SERVER_PARAMS, sent)?;
        self.step = Step::Established;
        Ok(p)
    }

    /// Our READY frame (once our QP is in RTS).
    pub fn ready(&self) -> Result<[u8; READY_LEN], SideError> {
        match (&self.session, self.step) {
            (Some(s), Step::Established | Step::Ready) => Ok(s.ready_msg(L_CLIENT_READY)),
            _ => Err(SideError::State("READY before the parameters were exchanged")),
        }
    }

    /// The server's READY.
    pub fn on_ready(&mut self, msg: &[u8]) -> Result<(), SideError> {
        let (Some(s), Step::Established) = (&self.session, self.step) else {
            return Err(SideError::State("READY before the parameters were exchanged"));
        };
        s.open_ready(msg, L_SERVER_READY)?;
        self.step = Step::Ready;
        Ok(())
    }
}

/// The accepting side of the handshake.
pub struct Server {
    key: Key,
    ns: [u8; NONCE_LEN],
    session: Option<Session>,
    client_raw: Option<[u8; PARAMS_LEN]>,
    step: Step,
}

impl Server {
    /// A handshake answering with the fresh nonce `ns`.
    pub fn new(key: &Key, ns: [u8; NONCE_LEN]) -> Server {
        Server { key: key.clone(), ns, session: None, client_raw: None, step: Step::Start }
    }

    /// The client's HELLO; returns the CHALLENGE frame to send.
    pub fn on_hello(&mut self, msg: &[u8]) -> Result<[u8; CHALLENGE_LEN], SideError> {
        if self.step != Step::Start || self.session.is_some() {
            return Err(SideError::State("HELLO twice"));
        }
        let (_, body) = parse_frame(msg, Kind::Hello)?;
        let mut nc = [0u8; NONCE_LEN];
        nc.copy_from_slice(body);
        let s = Session { key: self.key.clone(), nc, ns: self.ns };
        let h = header(Kind::Challenge);
        let proof = s.mac(L_SERVER_PROOF, &[&h]);
        let mut out = [0u8; CHALLENGE_LEN];
        out[..HEADER_LEN].copy_from_slice(&h);
        out[HEADER_LEN..HEADER_LEN + NONCE_LEN].copy_from_slice(&self.ns);
        out[HEADER_LEN + NONCE_LEN..].copy_from_slice(&proof);
        self.session = Some(s);
        Ok(out)
    }

    /// The client's CLIENT_PARAMS: the client is authenticated only if this
    /// returns `Ok`. Nothing (no QP) may be created before.
    pub fn on_client_params(&mut self, msg: &[u8]) -> Result<Params, SideError> {
        let (Some(s), Step::Start) = (&self.session, self.step) else {
            return Err(SideError::State("CLIENT_PARAMS before HELLO"));
        };
        let (p, raw) = s.open_params(msg, Kind::ClientParams, L_CLIENT_PARAMS, &[])?;
        self.client_raw = Some(raw);
        self.step = Step::Authenticated;
        Ok(p)
    }

    /// Our SERVER_PARAMS frame (after the client authenticated).
    pub fn params(&mut self, p: &Params) -> Result<[u8; PARAMS_MSG_LEN], SideError> {
        let (Some(s), Some(craw), Step::Authenticated) = (&self.session, &self.client_raw, self.step) else {
            return Err(SideError::State("params before the client authenticated"));
        };
        let m = s.params_msg(Kind::ServerParams, L_SERVER_PARAMS, p, craw)?;
        self.step = Step::Established;
        Ok(m)
    }

    /// Our READY frame (once our QP is in RTS).
    pub fn ready(&self) -> Result<[u8; READY_LEN], SideError> {
        match (&self.session, self.step) {
            (Some(s), Step::Established | Step::Ready) => Ok(s.ready_msg(L_SERVER_READY)),
            _ => Err(SideError::State("READY before the parameters were exchanged")),
        }
    }

    /// The client's READY.
    pub fn on_ready(&mut self, msg: &[u8]) -> Result<(), SideError> {
        let (Some(s), Step::Established) = (&self.session, self.step) else {
            return Err(SideError::State("READY before the parameters were exchanged"));
        };
        s.open_ready(msg, L_CLIENT_READY)?;
        self.step = Step::Ready;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
