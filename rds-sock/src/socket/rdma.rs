//! RDMA through the socket API (`RDS_GET_MR`, `RDS_GET_MR_FOR_DEST`,
//! `RDS_FREE_MR`, `RDS_CMSG_RDMA_MAP`, the checks of `RDS_CMSG_RDMA_ARGS`
//! and `RDS_CMSG_RDMA_DEST`, use-once releases on receive), with the
//! kernel's errno values. Memory a peer or the device may read or write is
//! always an [`RdmaBuf`] (ranges of it: [`RdmaSeg`]), which every
//! registration keeps alive until the device is done with it, so safe code
//! cannot hand a peer memory it does not own; the raw forms for a C ABI
//! ([`RdsSocket::get_mr_raw`], [`RdmaBuf::from_raw`]) are `unsafe fn`s
//! with the kernel's contract written down. Only sockets bound over IB
//! (rds-ib, feature `ib`) can register memory; elsewhere GET_MR is
//! EOPNOTSUPP as in the kernel for a transport without `get_mr` (TCP),
//! FREE_MR EINVAL, and an RDMA_ARGS send EOPNOTSUPP.

use std::io;
use std::net::SocketAddr;

use rds_core::wire::Header;
use rds_core::{Errno, RdmaBuf, RdmaOp, RdmaSeg, TransportKind};

use super::{RdsSocket, err};

impl RdsSocket {
    /// The bound address and transport, ENOTCONN if unbound.
    fn rdma_binding(&self) -> io::Result<(SocketAddr, Option<TransportKind>)> {
        self.run(|n| {
            let local = n.local_addr(self.id)?;
            let t = n.getsockopt(self.id, rds_core::SockOpt::Transport(0)).ok();
            Some((local, t))
        })
        .map(|(l, t)| {
            (l, t.and_then(|v| if v == u64::from(TransportKind::Ib.uapi()) { Some(TransportKind::Ib) } else { None }))
        })
        .ok_or_else(|| err(Errno::ENOTCONN))
    }

    /// `RDS_GET_MR`: registers the segment (a range of an [`RdmaBuf`]) for
    /// RDMA by peers; returns the cookie (`rkey | in-page offset << 32`) to
    /// send them (with [`crate::SendFlags::rdma_dest`]). A peer addresses
    /// the segment's byte `k` as `remote_addr` `k` with this cookie, and
    /// may read and write it until the MR is released: by
    /// [`RdsSocket::free_mr`], by the arrival of the message of an RDMA
    /// that used it when `flags` has `USE_ONCE`, or by the socket's close
    /// (after the engine's shutdown no connection reaches it any more, but
    /// it stays registered until then). The MR holds a handle to the
    /// buffer until it is deregistered, so the memory outlives every access
    /// of the peer whatever the caller drops; read the peer's writes with
    /// [`RdmaBuf::read_at`].
    /// `flags`: `USE_ONCE`, `READWRITE`, `INVALIDATE` (accepted, no effect).
    ///
    /// Errors: ENOTCONN unbound; EOPNOTSUPP when the socket's transport is
    /// not IB (TCP); EINVAL for an empty segment (a range beyond its
    /// buffer cannot be formed: [`RdmaBuf::seg`] is EINVAL); EMSGSIZE above
    /// 1 MiB (plus partial pages); ENOMEM beyond the MR limit; EFAULT when
    /// the memory cannot be registered.
    ///
    /// Raw addresses are not accepted (a safe caller could name memory it
    /// does not own):
    ///
    /// ```compile_fail
    /// # let sock = rds_sock::RdsSocket::new().unwrap();
    /// let cookie = sock.get_mr(0xdead_0000u64, 4096u64, 0);
    /// ```
    ///
    /// The C ABI's raw form is [`RdsSocket::get_mr_raw`].
    pub fn get_mr(&self, seg: &RdmaSeg, flags: u32) -> io::Result<u64> {
        let (local, t) = self.rdma_binding()?;
        #[cfg(feature = "ib")]
        if t == Some(TransportKind::Ib) {
            if let Some(ib) = self.engine.ib() {
                return ib.get_mr(local.ip(), self.id.number(), seg, u64::from(flags));
            }
        }
        let _ = (local, t, seg, flags);
        Err(err(Errno::EOPNOTSUPP))
    }

    /// `RDS_GET_MR` with a raw address, as the kernel's AF_RDS takes it
    /// (for a C ABI / LD_PRELOAD shim): registers `len` bytes at `addr`.
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must be memory of this process, valid for reads
    /// and writes, that nothing frees, unmaps or reuses and that Rust code
    /// does not access through references until the MR is released:
    /// [`RdsSocket::free_mr`] of its cookie returned, or the message of an
    /// RDMA that used a `USE_ONCE` MR was received, or the socket was
    /// dropped (each deregisters before it returns; after that the device
    /// never touches the memory; an engine's shutdown alone does not). Until
    /// then the peer may read and write it at any time. This is the
    /// kernel's contract for `RDS_GET_MR` (see [`RdmaBuf::from_raw`]).
    pub unsafe fn get_mr_raw(&self, addr: u64, len: u64, flags: u32) -> io::Result<u64> {
        if addr.checked_add(len).is_none() {
            return Err(err(Errno::EINVAL));
        }
        // SAFETY: the caller's promise, which covers every handle the MR
        // holds (it drops them when released).
        let buf = unsafe { RdmaBuf::from_raw(addr, len) };
        self.get_mr(&buf.all(), flags)
    }

    /// `RDS_GET_MR_FOR_DEST`: as [`RdsSocket::get_mr`] (the kernel ignores
    /// the destination too).
    pub fn get_mr_for_dest(&self, _dest: SocketAddr, seg: &RdmaSeg, flags: u32) -> io::Result<u64> {
        self.get_mr(seg, flags)
    }

    /// `RDS_FREE_MR`: releases this socket's MR named by `cookie`. EINVAL
    /// when it has none of that key, and (as the kernel without a
    /// transport `flush_mrs`) for any cookie on a socket that is not bound
    /// over IB; a zero cookie on IB ("flush unused MRs") does nothing.
    pub fn free_mr(&self, cookie: u64, _flags: u32) -> io::Result<()> {
        let bound = self.rdma_binding();
        #[cfg(feature = "ib")]
        if let Ok((_, Some(TransportKind::Ib))) = bound {
            if let Some(ib) = self.engine.ib() {
                return ib.free_mr(self.id.number(), cookie);
            }
        }
        let _ = (bound, cookie);
        Err(err(Errno::EINVAL))
    }

    /// `sendmsg` with `RDS_CMSG_RDMA_MAP`: registers the segment (as
    /// [`RdsSocket::get_mr`], which see for how long the peer may use it)
    /// and sends `buf` to `dst` announcing the cookie (an RDMA_DEST
    /// extension); returns (bytes sent, cookie). The MR is released again
    /// when the send fails.
    pub fn send_rdma_map(
        &self,
        buf: &[u8],
        dst: Option<SocketAddr>,
        seg: &RdmaSeg,
        map_flags: u32,
        flags: &crate::SendFlags,
    ) -> io::Result<(usize, u64)> {
        if flags.rdma_dest.is_some() {
            // Only one cookie per message (rds_cmsg_rdma_map / _dest).
            return Err(err(Errno::EINVAL));
        }
        let cookie = self.get_mr(seg, map_flags)?;
        let f = crate::SendFlags { rdma_dest: Some(cookie), ..flags.clone() };
        match self.send_msg(buf, dst, &f) {
            Ok(n) => Ok((n, cookie)),
            Err(e) => {
                let _ = self.free_mr(cookie, 0);
                Err(e)
            }
        }
    }

    /// The IB-side checks of a send's RDMA ancillary data
    /// (`rds_cmsg_rdma_args`, `rds_cmsg_rdma_dest`): an RDMA_DEST cookie
    /// must name an MR of this socket (EINVAL); an op needs at least one
    /// local buffer, none empty (EINVAL; a segment is always inside its
    /// buffer), at most
    /// `rds_ib::verbs::MAX_RDMA_SGES` of them (EMSGSIZE; the kernel allows
    /// 1024), and no more local bytes than the remote length (EINVAL).
    /// Other transports are left to the core (EOPNOTSUPP / EINVAL).
    pub(super) fn check_rdma_send(&self, rdma: Option<&RdmaOp>, dest: Option<u64>) -> io::Result<()> {
        if rdma.is_none() && dest.is_none() {
            return Ok(());
        }
        let Ok((_, Some(TransportKind::Ib))) = self.rdma_binding() else { return Ok(()) };
        #[cfg(feature = "ib")]
        if let Some(ib) = self.engine.ib() {
            if let Some(c) = dest {
                if !ib.owns_mr(self.id.number(), c as u32) {
                    return Err(err(Errno::EINVAL));
                }
            }
        }
        if let Some(op) = rdma {
            #[cfg(feature = "ib")]
            let max = rds_ib::verbs::MAX_RDMA_SGES;
            #[cfg(not(feature = "ib"))]
            let max = usize::MAX;
            check_rdma_args(op, max).map_err(err)?;
        }
        Ok(())
    }

    /// A received message announcing that a peer's RDMA used one of our
    /// MRs (RDS_EXTHDR_RDMA): a USE_ONCE MR is released (`rds_rdma_unuse`).
    pub(super) fn rdma_unuse(&self, hdr: &Header) {
        #[cfg(feature = "ib")]
        if let Some(ib) = self.engine.ib() {
            for e in hdr.extensions() {
                if let rds_core::wire::Ext::Rdma { rkey } = e {
                    ib.unuse_mr(self.id.number(), rkey);
                }
            }
        }
        let _ = hdr;
    }

    /// The socket closes: its MRs go (`rds_rdma_drop_keys`).
    pub(super) fn rdma_drop_keys(&self) {
        #[cfg(feature = "ib")]
        if let Some(ib) = self.engine.ib() {
            ib.drop_mrs(self.id.number());
        }
    }
}

/// The local-vector checks of an RDMA_ARGS op (`rds_cmsg_rdma_args`): at
/// least one buffer, none empty (EINVAL), at most `max_sges` (EMSGSIZE), no
/// more local bytes than the remote length (EINVAL). A segment beyond its
/// buffer cannot exist ([`RdmaBuf::seg`] refuses it with EINVAL).
fn check_rdma_args(op: &RdmaOp, max_sges: usize) -> Result<(), Errno> {
    if op.local.is_empty() || op.local.iter().any(|s| s.is_empty()) {
        return Err(Errno::EINVAL);
    }
    if op.local.len() > max_sges {
        return Err(Errno::EMSGSIZE);
    }
    let total = op.local.iter().fold(0u64, |t, s| t.saturating_add(s.len() as u64));
    if total > op.remote_len {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(local: Vec<RdmaSeg>, remote_len: u64) -> RdmaOp {
        RdmaOp { remote_cookie: 1, remote_addr: 0, remote_len, local, flags: 0, user_token: 0 }
    }

    #[test]
    fn rdma_args_are_checked_as_the_kernel_does() {
        let b = RdmaBuf::new(4096);
        let seg = |o, l| b.seg(o, l).unwrap();
        assert_eq!(check_rdma_args(&op(vec![seg(0, 4096)], 4096), 64), Ok(()));
        assert_eq!(check_rdma_args(&op(vec![seg(0, 100), seg(100, 100)], 4096), 64), Ok(()));
        assert_eq!(check_rdma_args(&op(vec![], 4096), 64), Err(Errno::EINVAL), "no local buffer");
        assert_eq!(check_rdma_args(&op(vec![seg(0, 8), seg(8, 0)], 4096), 64), Err(Errno::EINVAL), "an empty one");
        assert_eq!(check_rdma_args(&op(vec![seg(0, 4096)], 4095), 64), Err(Errno::EINVAL), "more local than remote");
        let many: Vec<RdmaSeg> = (0..65).map(|i| seg(i, 1)).collect();
        assert_eq!(check_rdma_args(&op(many, 4096), 64), Err(Errno::EMSGSIZE), "too many buffers");
        // Beyond the buffer: no segment to pass at all.
        assert_eq!(b.seg(4000, 97).unwrap_err(), Errno::EINVAL);
        assert_eq!(b.seg(4097, 0).unwrap_err(), Errno::EINVAL);
        // None of this kept a handle.
        assert_eq!(b.handles(), 1);
    }
}
