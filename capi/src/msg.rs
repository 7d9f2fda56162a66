//! sendmsg / recvmsg over a `msghdr`: iovecs, addresses, control messages,
//! flags, and blocking by waiting on the socket's real descriptor.
//!
//! Blocking: a receive waits in `poll` on the readiness descriptor
//! (readable exactly when the socket is) and on the TCP connections its
//! next message will likely come on, which it reads itself
//! ([`rds_sock::RdsSocket::recv_msg_wait`]). `poll` is never restarted
//! after a signal handler: a receive with no timeout restarts its wait
//! itself when every signal with a handler has SA_RESTART, and fails with
//! EINTR otherwise, as the kernel's `rds_recvmsg` does for the signal that
//! came (a process with handlers of both kinds sees EINTR for either). A
//! receive with SO_RCVTIMEO and every blocking send fail with EINTR on any
//! signal (the kernel would restart those with SA_RESTART). A timed-out
//! wait is ETIMEDOUT, as the kernel's RDS says (not EAGAIN).

use std::mem::size_of;
use std::net::SocketAddr;
use std::time::SystemTime;

use libc::{c_int, cmsghdr, msghdr};
use rds_sock::{Deadline, RecvFlags, RecvMeta, SendFlags};

use crate::table::Entry;
use crate::{Errno, addr, io_errno};

/// `UIO_MAXIOV`: more iovecs is EMSGSIZE.
const UIO_MAXIOV: usize = 1024;
/// The largest RDS message (`RDS_MAX_MSG_SIZE`): a gather buffer never
/// needs more.
const MAX_MSG: usize = 1 << 20;

const SOL_RDS: c_int = 276;
const RDS_CMSG_RDMA_ARGS: c_int = 1;
const RDS_CMSG_RDMA_DEST: c_int = 2;
const RDS_CMSG_RDMA_MAP: c_int = 3;
const RDS_CMSG_RDMA_STATUS: c_int = 4;
const RDS_CMSG_CONG_UPDATE: c_int = 5;
const RDS_CMSG_ATOMIC_FADD: c_int = 6;
const RDS_CMSG_MASKED_ATOMIC_CSWP: c_int = 9;
const SCM_TIMESTAMP_NEW: c_int = 63;

/// The iovecs of a `msghdr`, checked as `import_iovec` does.
///
/// # Safety
/// `iov` is NULL or points to `n` readable iovecs.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: usize) -> Result<&'a [libc::iovec], Errno> {
    if n > UIO_MAXIOV {
        return Err(libc::EMSGSIZE);
    }
    if n == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: n readable iovecs (the caller's promise).
    let v = unsafe { std::slice::from_raw_parts(iov, n) };
    let mut total: usize = 0;
    for i in v {
        if i.iov_len > isize::MAX as usize {
            return Err(libc::EINVAL);
        }
        if i.iov_base.is_null() && i.iov_len > 0 {
            return Err(libc::EFAULT);
        }
        total = total.checked_add(i.iov_len).ok_or(libc::EINVAL)?;
    }
    Ok(v)
}

/// Every signal that has a handler has SA_RESTART (the synchronous fault
/// signals excepted: they interrupt no wait).
fn handlers_restart() -> bool {
    (1..libc::SIGRTMAX()).all(|sig| {
        if matches!(sig, libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGKILL | libc::SIGSTOP) {
            return true;
        }
        // SAFETY: sigaction only reads the current action into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only queries; `old` is valid for writes.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            return true;
        }
        old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN || old.sa_flags & libc::SA_RESTART != 0
    })
}

/// RDS_CMSG_RDMA_MAP's `struct rds_get_mr_args`: the segment to register,
/// where to write the cookie, the MR flags.
pub struct MapReq {
    seg: rds_sock::RdmaSeg,
    cookie_addr: u64,
    flags: u32,
}

/// A C caller's memory as RdmaBuf segments.
///
/// # Safety
/// The kernel's contract for RDMA buffers: `addr..addr + len` is the
/// caller's memory until the operation or MR is done with it.
unsafe fn raw_seg(addr: u64, len: u64) -> Result<rds_sock::RdmaSeg, Errno> {
    if addr.checked_add(len).is_none() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { rds_sock::RdmaBuf::from_raw(addr, len) }.all())
}

/// `struct rds_rdma_args` as an [`rds_sock::RdmaOp`] (the local iovecs read
/// from `local_vec_addr`).
///
/// # Safety
/// `d` is the cmsg's data; its addresses are the caller's memory.
unsafe fn rdma_args(d: &[u8]) -> Result<rds_sock::RdmaOp, Errno> {
    use crate::opts::u64_at;
    if d.len() < 56 {
        return Err(libc::EINVAL);
    }
    let (vec_addr, nr) = (u64_at(d, 24), u64_at(d, 32));
    if nr > UIO_MAXIOV as u64 {
        return Err(libc::EMSGSIZE);
    }
    if vec_addr == 0 && nr > 0 {
        return Err(libc::EFAULT);
    }
    let mut local = Vec::with_capacity(nr as usize);
    for i in 0..nr as usize {
        // SAFETY: nr iovecs of 16 bytes at vec_addr (the caller's promise).
        let v = unsafe { ((vec_addr as usize + 16 * i) as *const [u64; 2]).read_unaligned() };
        // SAFETY: as this function's contract.
        local.push(unsafe { raw_seg(v[0], v[1]) }?);
    }
    Ok(rds_sock::RdmaOp {
        remote_cookie: u64_at(d, 0),
        remote_addr: u64_at(d, 8),
        remote_len: u64_at(d, 16),
        local,
        flags: u64_at(d, 40) as u32,
        user_token: u64_at(d, 48),
    })
}

/// The control messages of an outgoing `msghdr` (CMSG_OK as the kernel).
///
/// # Safety
/// `m.msg_control` is NULL or points to `m.msg_controllen` readable bytes;
/// the RDMA cmsgs' addresses are the caller's memory (the kernel's contract).
unsafe fn send_cmsgs(m: &msghdr) -> Result<(SendFlags, Option<MapReq>), Errno> {
    let mut f = SendFlags::default();
    let mut map = None;
    if m.msg_control.is_null() || m.msg_controllen < size_of::<cmsghdr>() {
        return Ok((f, map));
    }
    let base = m.msg_control.cast::<u8>();
    let end = m.msg_controllen;
    let mut off = 0usize;
    while off + size_of::<cmsghdr>() <= end {
        // SAFETY: a header's worth of bytes at base + off is within the buffer.
        let h = unsafe { std::ptr::read_unaligned(base.add(off).cast::<cmsghdr>()) };
        if h.cmsg_len < size_of::<cmsghdr>() || h.cmsg_len > end - off {
            return Err(libc::EINVAL);
        }
        // SAFETY: cmsg_len bytes from off are within the buffer.
        let data = unsafe {
            std::slice::from_raw_parts(base.add(off + size_of::<cmsghdr>()), h.cmsg_len - size_of::<cmsghdr>())
        };
        if h.cmsg_level == SOL_RDS {
            match h.cmsg_type {
                RDS_CMSG_RDMA_DEST => {
                    let c: [u8; 8] = data.get(..8).and_then(|d| d.try_into().ok()).ok_or(libc::EINVAL)?;
                    f.rdma_dest = Some(u64::from_ne_bytes(c));
                }
                RDS_CMSG_RDMA_ARGS => {
                    // SAFETY: the caller's promise about the addresses.
                    f.rdma = Some(unsafe { rdma_args(data) }?);
                }
                RDS_CMSG_RDMA_MAP => {
                    use crate::opts::u64_at;
                    if data.len() < 32 {
                        return Err(libc::EINVAL);
                    }
                    // SAFETY: the caller's promise about the addresses.
                    let seg = unsafe { raw_seg(u64_at(data, 0), u64_at(data, 8)) }?;
                    map = Some(MapReq { seg, cookie_addr: u64_at(data, 16), flags: u64_at(data, 24) as u32 });
                }
                // Atomics: neither transport here has them (the kernel over
                // TCP says EOPNOTSUPP too).
                RDS_CMSG_ATOMIC_FADD..=RDS_CMSG_MASKED_ATOMIC_CSWP => return Err(libc::EOPNOTSUPP),
                _ => return Err(libc::EINVAL),
            }
        }
        // CMSG_NXTHDR: the next header at the aligned end of this one.
        let step = (h.cmsg_len + size_of::<usize>() - 1) & !(size_of::<usize>() - 1);
        off += step;
    }
    if (f.rdma.is_some()) && (map.is_some() || f.rdma_dest.is_some()) {
        // rds_rm_size: (DEST, MAP) never with (ARGS, atomics).
        return Err(libc::EINVAL);
    }
    Ok((f, map))
}

/// `rds_sendmsg`.
///
/// # Safety
/// `m` is a valid msghdr whose pointers are NULL or valid for their lengths.
pub unsafe fn sendmsg(e: &Entry, m: &msghdr, flags: c_int) -> Result<usize, Errno> {
    if flags & !libc::MSG_DONTWAIT != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let namelen = if m.msg_name.is_null() { 0 } else { m.msg_namelen };
    let dst = if namelen != 0 {
        // SAFETY: msg_name has msg_namelen bytes (the caller's promise).
        Some(unsafe { addr::read(m.msg_name.cast(), namelen.min(128), addr::Use::Send) }?)
    } else {
        None
    };
    // SAFETY: the caller's promise about msg_iov.
    let iov = unsafe { iovecs(m.msg_iov, m.msg_iovlen) }?;
    // SAFETY: the caller's promise about msg_control.
    let (mut sf, map) = unsafe { send_cmsgs(m) }?;
    sf.dontwait = true;
    let gathered;
    let data: &[u8] = match iov {
        [] => &[],
        // SAFETY: a checked iovec: base non-NULL or len 0, len readable bytes.
        [one] if !one.iov_base.is_null() => unsafe { std::slice::from_raw_parts(one.iov_base.cast(), one.iov_len) },
        [_] => &[],
        many => {
            // At most one byte past the largest message: enough for the
            // send to refuse a longer one with EMSGSIZE, without copying
            // (and allocating for) all of it first.
            let mut v = Vec::with_capacity(many.iter().map(|i| i.iov_len).sum::<usize>().min(MAX_MSG + 1));
            for i in many.iter().filter(|i| i.iov_len > 0) {
                let take = i.iov_len.min(MAX_MSG + 1 - v.len());
                // SAFETY: as above (a prefix of the checked iovec).
                v.extend_from_slice(unsafe { std::slice::from_raw_parts(i.iov_base.cast::<u8>(), take) });
                if v.len() > MAX_MSG {
                    break;
                }
            }
            gathered = v;
            &gathered
        }
    };
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    match map {
        None => send(e, data, dst, &sf, dontwait),
        Some(req) => {
            let (n, cookie) = e.sock.send_rdma_map(data, dst, &req.seg, req.flags, &sf).map_err(io_errno)?;
            crate::opts::put_cookie(req.cookie_addr, cookie)?;
            Ok(n)
        }
    }
}

/// Sends; a blocking socket waits while it has no room (EAGAIN) or the
/// destination port is congested (ENOBUFS), until the event that lets the
/// send go on (room, a congestion map update: the kernel's socket wait and
/// `rds_cong_wait`), interruptibly (EINTR), up to SO_SNDTIMEO
/// (ETIMEDOUT): [`rds_sock::RdsSocket::send_msg_wait`].
pub fn send(e: &Entry, data: &[u8], dst: Option<SocketAddr>, sf: &SendFlags, dontwait: bool) -> Result<usize, Errno> {
    let blocking = !dontwait && !e.nonblock.load(std::sync::atomic::Ordering::Relaxed);
    if blocking {
        e.sock.send_msg_wait(data, dst, sf, Deadline::after(*e.sndtimeo.lock())).map_err(io_errno)
    } else {
        e.sock.send_msg(data, dst, sf).map_err(io_errno)
    }
}

/// Writes control messages into a `msghdr` as the kernel's `put_cmsg`.
struct Ctl {
    base: *mut u8,
    cap: usize,
    used: usize,
    truncated: bool,
}

impl Ctl {
    fn put(&mut self, level: c_int, ty: c_int, data: &[u8]) {
        let left = self.cap - self.used;
        if self.base.is_null() || left < size_of::<cmsghdr>() {
            self.truncated = true;
            return;
        }
        let mut len = size_of::<cmsghdr>() + data.len();
        if left < len {
            self.truncated = true;
            len = left;
        }
        // SAFETY: a zeroed cmsghdr is valid plain data.
        let mut h: cmsghdr = unsafe { std::mem::zeroed() };
        h.cmsg_len = len as _;
        h.cmsg_level = level;
        h.cmsg_type = ty;
        // SAFETY: `left` >= header + (len - header) bytes are writable at base + used.
        unsafe {
            let p = self.base.add(self.used);
            p.cast::<cmsghdr>().write_unaligned(h);
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(size_of::<cmsghdr>()), len - size_of::<cmsghdr>());
        }
        let space = (len + size_of::<usize>() - 1) & !(size_of::<usize>() - 1);
        self.used += space.min(left);
    }
}

/// `rds_recvmsg` into `m`: data into the iovecs, the sender into
/// `msg_name`, cmsgs into `msg_control`, MSG_TRUNC / MSG_CTRUNC into
/// `msg_flags`.
///
/// # Safety
/// `m` is a valid msghdr whose pointers are NULL or valid for their lengths.
pub unsafe fn recvmsg(e: &Entry, m: &mut msghdr, flags: c_int) -> Result<usize, Errno> {
    if flags & libc::MSG_OOB != 0 {
        return Ok(0);
    }
    if flags & libc::MSG_ERRQUEUE != 0 {
        // Nothing is ever queued on the error queue.
        return Err(libc::EAGAIN);
    }
    // SAFETY: the caller's promise about msg_iov.
    let iov = unsafe { iovecs(m.msg_iov, m.msg_iovlen) }?;
    let mut gather = Vec::new();
    let buf: &mut [u8] = match iov {
        // SAFETY: a checked iovec: len writable bytes at a non-NULL base.
        [one] if !one.iov_base.is_null() => unsafe { std::slice::from_raw_parts_mut(one.iov_base.cast(), one.iov_len) },
        many => {
            gather.resize(many.iter().map(|i| i.iov_len).sum::<usize>().min(MAX_MSG), 0);
            &mut gather
        }
    };
    let meta = recv(e, buf, flags)?;
    if iov.len() > 1 {
        let mut src = &gather[..meta.len.min(gather.len())];
        for i in iov.iter().filter(|i| i.iov_len > 0) {
            let n = src.len().min(i.iov_len);
            // SAFETY: n <= iov_len writable bytes at iov_base.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), i.iov_base.cast::<u8>(), n) };
            src = &src[n..];
        }
    }
    if !m.msg_name.is_null() {
        let raw = addr::encode(meta.from);
        let len = if meta.from.is_some() { raw.len } else { 0 };
        let n = len.min(m.msg_namelen as usize);
        // SAFETY: msg_name has msg_namelen >= n writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw.storage as *const libc::sockaddr_storage).cast::<u8>(),
                m.msg_name.cast(),
                n,
            )
        };
        m.msg_namelen = len as libc::socklen_t;
    }
    let mut ctl = Ctl { base: m.msg_control.cast(), cap: m.msg_controllen, used: 0, truncated: false };
    put_cmsgs(e, &meta, &mut ctl);
    m.msg_controllen = ctl.used;
    let mut out = flags & libc::MSG_CMSG_CLOEXEC;
    if meta.truncated {
        out |= libc::MSG_TRUNC;
    }
    if ctl.truncated {
        out |= libc::MSG_CTRUNC;
    }
    m.msg_flags = out;
    Ok(meta.len)
}

fn put_cmsgs(e: &Entry, meta: &RecvMeta, ctl: &mut Ctl) {
    if let Some(mask) = meta.cong_update {
        ctl.put(SOL_RDS, RDS_CMSG_CONG_UPDATE, &mask.to_ne_bytes());
    }
    if let Some((token, status)) = meta.rdma_status {
        // struct rds_rdma_notify { __u64 user_token; __s32 status; } (16 bytes).
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&token.to_ne_bytes());
        b[8..12].copy_from_slice(&status.to_ne_bytes());
        ctl.put(SOL_RDS, RDS_CMSG_RDMA_STATUS, &b);
    }
    if let Some(cookie) = meta.rdma_dest {
        ctl.put(SOL_RDS, RDS_CMSG_RDMA_DEST, &cookie.to_ne_bytes());
    }
    if let Some(t) = meta.timestamp {
        let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        // struct timeval and struct __kernel_sock_timeval are both two
        // 64-bit fields on the 64-bit targets we build for.
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&(d.as_secs() as i64).to_ne_bytes());
        b[8..].copy_from_slice(&i64::from(d.subsec_micros()).to_ne_bytes());
        let ty = if e.timestamp.load(std::sync::atomic::Ordering::Relaxed) == 2 {
            SCM_TIMESTAMP_NEW
        } else {
            libc::SCM_TIMESTAMP
        };
        ctl.put(libc::SOL_SOCKET, ty, &b);
    }
}

/// Receives into `buf`, waiting on the descriptor when the socket blocks.
pub fn recv(e: &Entry, buf: &mut [u8], flags: c_int) -> Result<RecvMeta, Errno> {
    let rf = RecvFlags { peek: flags & libc::MSG_PEEK != 0, trunc: flags & libc::MSG_TRUNC != 0, dontwait: true };
    let blocking = flags & libc::MSG_DONTWAIT == 0 && !e.nonblock.load(std::sync::atomic::Ordering::Relaxed);
    if !blocking {
        return e.sock.recv_msg(buf, rf).map_err(io_errno);
    }
    // Waits in poll on the socket's descriptor and on the TCP connections
    // its next message will likely come on, which it reads itself
    // (`RdsSocket::recv_msg_wait`). A signal interrupts that poll; with no
    // timeout the wait then restarts when every signal with a handler has
    // SA_RESTART (where the kernel's `rds_recvmsg` would be restarted),
    // else fails with EINTR (see the module docs).
    // A timeout starts when the receive waits (no clock read for one
    // that finds a message: `Deadline`).
    let deadline = Deadline::after(*e.rcvtimeo.lock());
    loop {
        match e.sock.recv_msg_wait(buf, rf, deadline).map_err(io_errno) {
            Err(libc::EINTR) if deadline.is_never() && handlers_restart() => continue,
            r => return r,
        }
    }
}
