//! rds-rdma-peer: RDMA READ / WRITE through the socket API over RDS-IB, for
//! the VM test `tests/ib_vm_rdma.rs`. Runs on our engine (feature `ib`) or,
//! with `--kernel`, on the guest kernel's AF_RDS sockets (`rds_rdma`)
//! through raw `sendmsg`/`recvmsg` with the uapi's ancillary data, so the
//! same script drives ours<->ours, ours->kernel and kernel->ours.
//!
//! ```text
//! rds-rdma-peer [--kernel] target LOCAL LPORT PEER PPORT N
//!     registers a buffer A of N bytes starting 100 bytes into a page,
//!     filled with pattern 1, and a 4 KiB buffer B (USE_ONCE), and
//!     announces both (messages "MR" and "MR1" with an RDMA_DEST cookie:
//!     ours: GET_MR + RDMA_DEST; kernel: RDMA_MAP, its only way on 6.1
//!     with FRWR, where setsockopt(RDS_GET_MR) is EOPNOTSUPP). Then it
//!     receives until "DONE": on "W" it checks A is pattern 2 byte for
//!     byte, on "W2 OFF LEN" that A[OFF..OFF+LEN] is pattern 3 and the rest
//!     still pattern 2, on "W3" that B starts with 64 bytes of pattern 4
//!     (ours: then FREE_MR of B is EINVAL: the use-once MR went with the
//!     message). Finally FREE_MR of A (ok) and again (EINVAL).
//! rds-rdma-peer [--kernel] initiator LOCAL LPORT PEER PPORT N
//!     receives "MR" and "MR1" with their cookies; RDMA READ of A (N bytes,
//!     remote address 0) with "R", NOTIFY_ME token 1: the status must be
//!     0 and the local buffer pattern 1 (ours: the op held a handle to the
//!     buffer while in flight and none once acked: `HOLD R during n after
//!     m in_flight f`, f 0 when the message was acked before the look); RDMA WRITE of pattern 2 over A with
//!     "W" (token 2); a FENCEd WRITE of 1000 bytes of pattern 3 at remote
//!     address 37 from two local buffers with "W2 37 1000" (token 3); a
//!     WRITE of 64 bytes of pattern 4 to B with "W3" (token 4; ours drops
//!     its handle to the buffer right after the send); "DONE".
//! ```
//!
//! Lines: `BOUND`, `COOKIE name 0x.. offset o`, `DEST name 0x..`,
//! `STATUS token t status s`, `READ verified ok|BAD`, `VERIFY name ok|BAD
//! at i`, `FREE ...`, `KGETMR errno e` (kernel), `BENCH ...`, then
//! `RESULT ok|FAIL why`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use rds_core::message::rdma_flags as F;
use rds_sock::{RdmaBuf, RdmaOp, RdmaSeg, RdsSocket, RecvFlags, SendFlags, TransportKind};

const OFF: usize = 100;
const TIMEOUT: Duration = Duration::from_secs(90);

fn pattern(k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 7 + k * 13) % 251) as u8).collect()
}

/// `barrier $BARRIER 90` when BARRIER is set (both sides bound).
fn barrier() {
    if let Ok(name) = std::env::var("BARRIER") {
        let _ = Command::new("barrier").arg(name).arg("90").status();
    }
}

enum Got {
    Data { msg: Vec<u8>, dest: Option<u64> },
    Status { token: u64, status: i32 },
}

trait Ep {
    /// Registers the segment and announces the cookie in `msg`.
    fn map_send(&self, seg: &RdmaSeg, flags: u32, msg: &[u8], dst: SocketAddr) -> io::Result<u64>;
    fn send(&self, msg: &[u8], dst: SocketAddr, op: Option<RdmaOp>) -> io::Result<()>;
    fn recv(&self) -> io::Result<Got>;
    fn free(&self, cookie: u64) -> io::Result<()>;
    /// Waits a while until what was sent is acked (ours; the kernel's
    /// socket keeps sending after close). A kernel peer acks a message
    /// without ACK_REQUIRED only with its next traffic.
    fn finish(&self) {}
    /// Notifications that arrive within 3 s (ours only).
    fn late_statuses(&self) -> Vec<(u64, i32)> {
        Vec::new()
    }
    /// Whether an op holds handles to its RdmaBufs (ours; the kernel takes
    /// addresses and pins the pages itself).
    fn holds(&self) -> bool {
        false
    }
    /// Whether every message sent so far was acked, now (ours).
    fn all_acked(&self) -> bool {
        true
    }
}

// ---- ours ----------------------------------------------------------------

struct Ours(RdsSocket);

impl Ep for Ours {
    fn map_send(&self, seg: &RdmaSeg, flags: u32, msg: &[u8], dst: SocketAddr) -> io::Result<u64> {
        let cookie = self.0.get_mr(seg, flags)?;
        self.0.send_msg(msg, Some(dst), &SendFlags { rdma_dest: Some(cookie), ..SendFlags::default() })?;
        Ok(cookie)
    }
    fn send(&self, msg: &[u8], dst: SocketAddr, op: Option<RdmaOp>) -> io::Result<()> {
        self.0.send_msg(msg, Some(dst), &SendFlags { rdma: op, ..SendFlags::default() }).map(|_| ())
    }
    fn recv(&self) -> io::Result<Got> {
        let mut buf = vec![0u8; 1 << 16];
        let m = self.0.recv_msg(&mut buf, RecvFlags::default())?;
        if let Some((token, status)) = m.rdma_status {
            return Ok(Got::Status { token, status });
        }
        buf.truncate(m.len);
        Ok(Got::Data { msg: buf, dest: m.rdma_dest })
    }
    fn free(&self, cookie: u64) -> io::Result<()> {
        self.0.free_mr(cookie, 0)
    }
    fn finish(&self) {
        if !self.0.flush(Duration::from_secs(10)) {
            println!("FLUSH timed out");
        }
    }
    fn holds(&self) -> bool {
        true
    }
    fn all_acked(&self) -> bool {
        self.0.flush(Duration::ZERO)
    }
    fn late_statuses(&self) -> Vec<(u64, i32)> {
        let _ = self.0.set_read_timeout(Some(Duration::from_secs(3)));
        let mut v = Vec::new();
        while let Ok(Got::Status { token, status }) = self.recv() {
            v.push((token, status));
        }
        v
    }
}

// ---- the kernel's AF_RDS ---------------------------------------------------

const AF_RDS: i32 = 21;
const SOL_RDS: i32 = 276;
const SO_RDS_TRANSPORT: i32 = 8;
const RDS_GET_MR: i32 = 2;
const RDS_FREE_MR: i32 = 3;
const CMSG_RDMA_ARGS: i32 = 1;
const CMSG_RDMA_DEST: i32 = 2;
const CMSG_RDMA_MAP: i32 = 3;
const CMSG_RDMA_STATUS: i32 = 4;

struct Kernel(i32);

fn sin(a: SocketAddr) -> libc::sockaddr_in {
    let IpAddr::V4(v4) = a.ip() else { panic!("IPv4 only") };
    libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(v4).to_be() },
        sin_zero: [0; 8],
    }
}

fn cvt(r: isize) -> io::Result<usize> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) }
}

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

impl Kernel {
    fn open(local: SocketAddr) -> io::Result<Kernel> {
        // SAFETY: plain socket calls with valid arguments.
        unsafe {
            let fd = libc::socket(AF_RDS, libc::SOCK_SEQPACKET, 0);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let k = Kernel(fd);
            let ib: i32 = 0;
            k.setopt(SOL_RDS, SO_RDS_TRANSPORT, &ib.to_ne_bytes())?;
            let big: i32 = 8 << 20;
            k.setopt(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &big.to_ne_bytes())?;
            k.setopt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &big.to_ne_bytes())?;
            let tv = libc::timeval { tv_sec: TIMEOUT.as_secs() as i64, tv_usec: 0 };
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), 16);
            let sa = sin(local);
            if libc::bind(fd, (&sa as *const libc::sockaddr_in).cast(), 16) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(k)
        }
    }

    fn setopt(&self, level: i32, name: i32, v: &[u8]) -> io::Result<()> {
        // SAFETY: v is valid for its length.
        if unsafe { libc::setsockopt(self.0, level, name, v.as_ptr().cast(), v.len() as u32) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn sendmsg(&self, msg: &[u8], dst: SocketAddr, cmsg: Option<(i32, Vec<u8>)>) -> io::Result<()> {
        let mut sa = sin(dst);
        let mut iov = libc::iovec { iov_base: msg.as_ptr() as *mut _, iov_len: msg.len() };
        let mut ctl = vec![0u64; 32];
        // SAFETY: msghdr and control buffer built per cmsg(3); all pointers
        // are valid for the call.
        unsafe {
            let mut mh: libc::msghdr = std::mem::zeroed();
            mh.msg_name = (&mut sa as *mut libc::sockaddr_in).cast();
            mh.msg_namelen = 16;
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            if let Some((ty, data)) = &cmsg {
                mh.msg_control = ctl.as_mut_ptr().cast();
                mh.msg_controllen = libc::CMSG_SPACE(data.len() as u32) as usize;
                let c = libc::CMSG_FIRSTHDR(&mh);
                (*c).cmsg_level = SOL_RDS;
                (*c).cmsg_type = *ty;
                (*c).cmsg_len = libc::CMSG_LEN(data.len() as u32) as usize;
                std::ptr::copy_nonoverlapping(data.as_ptr(), libc::CMSG_DATA(c), data.len());
            }
            cvt(libc::sendmsg(self.0, &mh, 0))?;
        }
        Ok(())
    }
}

impl Ep for Kernel {
    fn map_send(&self, seg: &RdmaSeg, flags: u32, msg: &[u8], dst: SocketAddr) -> io::Result<u64> {
        // The kernel pins the pages; the caller keeps the buffer until the
        // socket closes (target's buffers live to its end).
        let mut cookie: u64 = 0;
        let args = u64s(&[seg.addr(), seg.len() as u64, &mut cookie as *mut u64 as u64, u64::from(flags)]);
        self.sendmsg(msg, dst, Some((CMSG_RDMA_MAP, args)))?;
        // SAFETY: written by the kernel through its address during sendmsg.
        Ok(unsafe { std::ptr::read_volatile(&cookie) })
    }
    fn send(&self, msg: &[u8], dst: SocketAddr, op: Option<RdmaOp>) -> io::Result<()> {
        let Some(op) = op else { return self.sendmsg(msg, dst, None) };
        // The initiator keeps the op's buffers until its status arrived.
        let vecs: Vec<u64> = op.local.iter().flat_map(|s| [s.addr(), s.len() as u64]).collect();
        let args = u64s(&[
            op.remote_cookie,
            op.remote_addr,
            op.remote_len,
            vecs.as_ptr() as u64,
            op.local.len() as u64,
            u64::from(op.flags),
            op.user_token,
        ]);
        self.sendmsg(msg, dst, Some((CMSG_RDMA_ARGS, args)))
    }
    fn recv(&self) -> io::Result<Got> {
        let mut buf = vec![0u8; 1 << 16];
        let mut ctl = vec![0u64; 64];
        // SAFETY: all-zero is a valid sockaddr_in.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut dest = None;
        // SAFETY: as in sendmsg; the kernel fills the buffers within their lengths.
        unsafe {
            let mut mh: libc::msghdr = std::mem::zeroed();
            mh.msg_name = (&mut sa as *mut libc::sockaddr_in).cast();
            mh.msg_namelen = 16;
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            mh.msg_control = ctl.as_mut_ptr().cast();
            mh.msg_controllen = ctl.len() * 8;
            let n = cvt(libc::recvmsg(self.0, &mut mh, 0))?;
            let mut c = libc::CMSG_FIRSTHDR(&mh);
            while !c.is_null() {
                let d = libc::CMSG_DATA(c);
                if (*c).cmsg_level == SOL_RDS && (*c).cmsg_type == CMSG_RDMA_STATUS {
                    let token = std::ptr::read_unaligned(d as *const u64);
                    let status = std::ptr::read_unaligned(d.add(8) as *const i32);
                    return Ok(Got::Status { token, status });
                }
                if (*c).cmsg_level == SOL_RDS && (*c).cmsg_type == CMSG_RDMA_DEST {
                    dest = Some(std::ptr::read_unaligned(d as *const u64));
                }
                c = libc::CMSG_NXTHDR(&mh, c);
            }
            buf.truncate(n);
        }
        Ok(Got::Data { msg: buf, dest })
    }
    fn free(&self, cookie: u64) -> io::Result<()> {
        self.setopt(SOL_RDS, RDS_FREE_MR, &u64s(&[cookie, 0]))
    }
}

// ---- the scenario ------------------------------------------------------------

fn next_data(ep: &dyn Ep, statuses: &mut Vec<(u64, i32)>) -> Result<(Vec<u8>, Option<u64>), String> {
    loop {
        match ep.recv().map_err(|e| format!("recv: {e}"))? {
            Got::Data { msg, dest } => return Ok((msg, dest)),
            Got::Status { token, status } => {
                println!("STATUS token {token} status {status}");
                statuses.push((token, status));
            }
        }
    }
}

fn wait_status(
    ep: &dyn Ep,
    statuses: &mut Vec<(u64, i32)>,
    early: &mut Vec<Vec<u8>>,
    token: u64,
) -> Result<i32, String> {
    let t0 = Instant::now();
    loop {
        if let Some(p) = statuses.iter().position(|s| s.0 == token) {
            return Ok(statuses.remove(p).1);
        }
        if t0.elapsed() > TIMEOUT {
            return Err(format!("no status for token {token}"));
        }
        match ep.recv().map_err(|e| format!("recv (status {token}): {e}"))? {
            Got::Status { token, status } => {
                println!("STATUS token {token} status {status}");
                statuses.push((token, status));
            }
            // The peer's reply may come before our notification (the
            // kernel gives no order between the two): kept for wait_ok.
            Got::Data { msg, .. } => {
                println!("EARLY {}", String::from_utf8_lossy(&msg));
                early.push(msg);
            }
        }
    }
}

fn verify(name: &str, got: &[u8], want: &[u8]) -> bool {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None if got.len() == want.len() => {
            println!("VERIFY {name} ok len {}", got.len());
            true
        }
        p => {
            println!("VERIFY {name} BAD at {:?}", p);
            false
        }
    }
}

/// A copy of the segment's bytes.
fn contents(seg: &RdmaSeg) -> Vec<u8> {
    let mut v = vec![0u8; seg.len()];
    seg.buf().read_at(seg.offset(), &mut v).expect("a segment is inside its buffer");
    v
}

fn target(ep: &dyn Ep, kernel: bool, peer: SocketAddr, n: usize) -> Result<(), String> {
    // A starts OFF bytes into a page (RdmaBuf::new is page-aligned).
    let a_buf = RdmaBuf::new(n + OFF);
    a_buf.write_at(OFF, &pattern(1, n)).map_err(|e| e.to_string())?;
    let b_buf = RdmaBuf::new(4096);
    let a = a_buf.seg(OFF, n).map_err(|e| e.to_string())?;
    let b = b_buf.all();
    barrier();
    // A first message brings the connection up (the kernel registers an
    // RDMA_MAP region on the connection's QP).
    ep.send(b"HI", peer, None).map_err(|e| format!("send HI: {e}"))?;
    std::thread::sleep(Duration::from_secs(2));
    let ca = ep.map_send(&a, 0, b"MR", peer).map_err(|e| format!("map A: {e}"))?;
    println!("COOKIE A {ca:#x} offset {}", ca >> 32);
    let cb = ep.map_send(&b, F::USE_ONCE, b"MR1", peer).map_err(|e| format!("map B: {e}"))?;
    println!("COOKIE B {cb:#x} offset {}", cb >> 32);
    let mut bad = 0;
    let mut st = Vec::new();
    loop {
        let (msg, _) = next_data(ep, &mut st)?;
        let text = String::from_utf8_lossy(&msg).into_owned();
        println!("GOT {text}");
        let w: Vec<&str> = text.split_whitespace().collect();
        let step = w.first().copied().unwrap_or("");
        match w.first().copied() {
            Some("W") => bad += !verify("W", &contents(&a), &pattern(2, n)) as u32,
            Some("W2") => {
                let off: usize = w[1].parse().unwrap_or(0);
                let len: usize = w[2].parse().unwrap_or(0);
                let mut want = pattern(2, n);
                want[off..off + len].copy_from_slice(&pattern(3, len));
                bad += !verify("W2", &contents(&a), &want) as u32;
            }
            Some("W3") => {
                let mut want = vec![0u8; 4096];
                want[..64].copy_from_slice(&pattern(4, 64));
                bad += !verify("W3", &contents(&b), &want) as u32;
                if !kernel {
                    match ep.free(cb) {
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => println!("USEONCE released ok"),
                        r => {
                            println!("USEONCE BAD free {r:?}");
                            bad += 1;
                        }
                    }
                }
            }
            Some("DONE") => {
                ep.send(b"OK DONE", peer, None).map_err(|e| format!("send OK: {e}"))?;
                ep.finish();
                break;
            }
            _ => {}
        }
        // The initiator's next op waits for this: its notification only
        // says the data reached our HCA, not that we looked at it.
        if matches!(step, "R" | "W" | "W2" | "W3") {
            ep.send(format!("OK {step}").as_bytes(), peer, None).map_err(|e| format!("send OK: {e}"))?;
        }
    }
    match ep.free(ca) {
        Ok(()) => println!("FREE ok"),
        Err(e) => {
            println!("FREE BAD {e}");
            bad += 1;
        }
    }
    match ep.free(ca) {
        Err(e) => println!("FREE again errno {}", e.raw_os_error().unwrap_or(0)),
        Ok(()) => {
            println!("FREE again BAD ok");
            bad += 1;
        }
    }
    if bad > 0 { Err(format!("{bad} bad")) } else { Ok(()) }
}

/// Waits for the target's `OK step`.
fn wait_ok(ep: &dyn Ep, st: &mut Vec<(u64, i32)>, early: &mut Vec<Vec<u8>>, step: &str) -> Result<(), String> {
    let m = if early.is_empty() { next_data(ep, st)?.0 } else { early.remove(0) };
    let m = String::from_utf8_lossy(&m).into_owned();
    if m == format!("OK {step}") { Ok(()) } else { Err(format!("expected OK {step}, got {m:?}")) }
}

fn initiator(ep: &dyn Ep, peer: SocketAddr, n: usize) -> Result<(), String> {
    let mut st = Vec::new();
    barrier();
    let mut dests = Vec::new();
    while dests.len() < 2 {
        let (m, c) = next_data(ep, &mut st)?;
        let m = String::from_utf8_lossy(&m).into_owned();
        println!("GOT {m} dest {c:?}");
        match (m.as_str(), c) {
            ("MR" | "MR1", Some(c)) => dests.push(c),
            ("MR" | "MR1", None) => return Err(format!("{m} without RDMA_DEST")),
            _ => {}
        }
    }
    let (ca, cb) = (dests[0], dests[1]);
    let mut early = Vec::new();
    println!("DEST A {ca:#x}");
    println!("DEST B {cb:#x}");
    let mut bad = 0;
    let op = |cookie, raddr, rlen, local: Vec<RdmaSeg>, flags, token| RdmaOp {
        remote_cookie: cookie,
        remote_addr: raddr,
        remote_len: rlen,
        local,
        flags: flags | F::NOTIFY_ME,
        user_token: token,
    };
    // READ A.
    let l = RdmaBuf::new(n);
    ep.send(b"R", peer, Some(op(ca, 0, n as u64, vec![l.all()], 0, 1))).map_err(|e| format!("send R: {e}"))?;
    // Ours: the op holds the buffer (queued, then registered) until its
    // work request completed and its message was acked. The handles are
    // counted first, then whether the message is still unacked: still
    // unacked then, it was unacked when they were counted, and a count
    // below 2 is a release before the ack. Acked already (the READ, its
    // completion and the ack can all beat this look on a loaded machine),
    // the look proves nothing either way: `in_flight 0`.
    let held = l.handles();
    let in_flight = !ep.all_acked();
    let s = wait_status(ep, &mut st, &mut early, 1)?;
    println!("READ status {s}");
    bad += (s != 0 || !verify("R", &l.to_vec(), &pattern(1, n))) as u32;
    wait_ok(ep, &mut st, &mut early, "R")?;
    if ep.holds() {
        ep.finish();
        let t0 = Instant::now();
        while l.handles() > 1 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("HOLD R during {held} after {} in_flight {}", l.handles(), in_flight as u8);
        bad += ((in_flight && held < 2) || l.handles() != 1) as u32;
    }
    // WRITE A.
    let w = RdmaBuf::from_slice(&pattern(2, n));
    ep.send(b"W", peer, Some(op(ca, 0, n as u64, vec![w.all()], F::READWRITE, 2)))
        .map_err(|e| format!("send W: {e}"))?;
    let s = wait_status(ep, &mut st, &mut early, 2)?;
    println!("WRITE status {s}");
    bad += (s != 0) as u32;
    wait_ok(ep, &mut st, &mut early, "W")?;
    // FENCEd WRITE of two local buffers at remote offset 37.
    let p3 = RdmaBuf::from_slice(&pattern(3, 1000));
    let local = vec![p3.seg(0, 500).map_err(|e| e.to_string())?, p3.seg(500, 500).map_err(|e| e.to_string())?];
    ep.send(b"W2 37 1000", peer, Some(op(ca, 37, 1000, local, F::READWRITE | F::FENCE, 3)))
        .map_err(|e| format!("send W2: {e}"))?;
    let s = wait_status(ep, &mut st, &mut early, 3)?;
    println!("WRITE2 status {s}");
    bad += (s != 0) as u32;
    wait_ok(ep, &mut st, &mut early, "W2")?;
    // WRITE B (use-once).
    let p4 = RdmaBuf::from_slice(&pattern(4, 64));
    ep.send(b"W3", peer, Some(op(cb, 0, 64, vec![p4.all()], F::READWRITE, 4))).map_err(|e| format!("send W3: {e}"))?;
    // Ours: the caller's handle goes at once; the op keeps the memory
    // alive, and the target still checks the bytes it got.
    let p4 = if ep.holds() { None } else { Some(p4) };
    let s = wait_status(ep, &mut st, &mut early, 4)?;
    println!("WRITE3 status {s}");
    bad += (s != 0) as u32;
    wait_ok(ep, &mut st, &mut early, "W3")?;
    // BADKEY=1: a WRITE with a wrong rkey fails at the peer: one
    // REMOTE_ERROR notification (the connection breaks and comes back; the
    // message is dropped, never retransmitted, and not notified again).
    let badkey = std::env::var("BADKEY").is_ok_and(|v| v == "1");
    if badkey {
        let p5 = RdmaBuf::from_slice(&pattern(5, 64));
        ep.send(b"BAD", peer, Some(op(ca ^ 0xff, 0, 64, vec![p5.all()], F::READWRITE, 5)))
            .map_err(|e| format!("send BAD: {e}"))?;
        let s = wait_status(ep, &mut st, &mut early, 5)?;
        println!("BADKEY status {s}");
        bad += (s != 1) as u32;
    }
    ep.send(b"DONE", peer, None).map_err(|e| format!("send DONE: {e}"))?;
    wait_ok(ep, &mut st, &mut early, "DONE")?;
    let late = ep.late_statuses();
    println!("LATE statuses {}", late.len());
    bad += !late.is_empty() as u32;
    // The kernel's ops used these buffers by address until their statuses.
    drop((l, w, p3, p4));
    if bad > 0 { Err(format!("{bad} bad")) } else { Ok(()) }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let kernel = args.first().is_some_and(|a| a == "--kernel");
    if kernel {
        args.remove(0);
    }
    if args.len() != 6 || !matches!(args[0].as_str(), "target" | "initiator") {
        eprintln!("usage: rds-rdma-peer [--kernel] target|initiator LOCAL LPORT PEER PPORT N");
        return ExitCode::from(2);
    }
    let res = (|| -> Result<(), String> {
        let local: SocketAddr = format!("{}:{}", args[1], args[2]).parse().map_err(|e| format!("local: {e}"))?;
        let peer: SocketAddr = format!("{}:{}", args[3], args[4]).parse().map_err(|e| format!("peer: {e}"))?;
        let n: usize = args[5].parse().map_err(|_| "bad N".to_string())?;
        let ep: Box<dyn Ep> = if kernel {
            let k = Kernel::open(local).map_err(|e| format!("kernel socket {local}: {e}"))?;
            // The setsockopt way, for the record (6.1 with FRWR: EOPNOTSUPP).
            let mut c: u64 = 0;
            let probe = [0u8; 64];
            let r = k.setopt(SOL_RDS, RDS_GET_MR, &u64s(&[probe.as_ptr() as u64, 64, &mut c as *mut u64 as u64, 0]));
            println!("KGETMR errno {}", r.err().and_then(|e| e.raw_os_error()).unwrap_or(0));
            let _ = k.free(c);
            Box::new(k)
        } else {
            let s = RdsSocket::new().map_err(|e| format!("socket: {e}"))?;
            s.set_transport(TransportKind::Ib).map_err(|e| format!("SO_RDS_TRANSPORT=IB: {e}"))?;
            s.set_send_buffer_size_force(8 << 20).map_err(|e| e.to_string())?;
            s.set_recv_buffer_size_force(8 << 20).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
            s.bind(local).map_err(|e| format!("bind {local}: {e}"))?;
            Box::new(Ours(s))
        };
        println!("BOUND {local} {}", if kernel { "kernel" } else { "ours" });
        if args[0] == "target" { target(&*ep, kernel, peer, n) } else { initiator(&*ep, peer, n) }
    })();
    rds_tests::report_result(res)
}
