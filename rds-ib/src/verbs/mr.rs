//! Memory registration for RDMA operations (`RDS_GET_MR`, `RDS_FREE_MR`,
//! `RDS_CMSG_RDMA_MAP`): user memory registered on the shared PD of the
//! device that serves a socket's bound address, named to the peer by a
//! cookie formed as the kernel forms it.
//!
//! The cookie is `rkey | offset << 32` where `offset` is the in-page offset
//! of the buffer's first byte (`rds_rdma_make_cookie(r_key, addr &
//! ~PAGE_MASK)`). A peer's RDMA to the cookie targets the remote address
//! `remote_vec.addr + offset` (`rds_cmsg_rdma_args`); the kernel registers
//! its MRs zero-based over whole pages (`ib_map_mr_sg_zbva`), so address 0
//! of its MR is the start of the buffer's first page and `remote_vec.addr`
//! is an offset from the buffer's first byte. Our MRs give the same
//! addressing: each is registered with `ibv_reg_mr_iova` at the buffer's
//! exact range with iova = the in-page offset, so iova `offset + k` is the
//! buffer's byte `k` (no byte outside the buffer is exposed, unlike the
//! kernel's whole pages).
//!
//! The memory is a segment of an `RdmaBuf` ([`RdmaSeg`]), never a raw
//! address: a registration holds a handle to the buffer and drops it only
//! after `ibv_dereg_mr`, so the peer (or the device for a local op) never
//! reaches memory that was freed, whatever the caller drops first.
//!
//! MRs belong to a socket (an opaque `owner` number): FREE_MR and RDMA_DEST
//! only find the caller's own, a USE_ONCE MR is released when a message of
//! an RDMA that used it arrives ([`MrTable::unuse`]), and closing the socket
//! releases all of them ([`MrTable::drop_owner`]). At most [`MAX_MRS`] are
//! registered at a time (ENOMEM beyond).

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::os::raw::{c_int, c_void};
use std::sync::{Arc, Mutex};

use rdma_sys as sys;
use rds_core::RdmaSeg;

use super::cm::CmChannel;
use super::{Verbs, errno, sockaddr_v4};

/// Most MRs registered at a time, over all sockets.
pub const MAX_MRS: usize = 4096;
/// Page size the cookie offset is taken against (x86-64, as the kernel's).
pub const PAGE_SIZE: u64 = 4096;
/// Largest MR: 1 MiB plus the partial pages at both ends, as
/// `RDS_MAX_MSG_SIZE` bounds an RDMA.
pub const MAX_MR_BYTES: u64 = (1 << 20) + 2 * PAGE_SIZE;

const READWRITE: u64 = 0x0001;
const USE_ONCE: u64 = 0x0008;

/// Forms a cookie (`rds_rdma_make_cookie`).
pub fn make_cookie(rkey: u32, offset: u32) -> u64 {
    u64::from(rkey) | (u64::from(offset) << 32)
}

/// The rkey of a cookie.
pub fn cookie_key(cookie: u64) -> u32 {
    cookie as u32
}

/// The offset of a cookie.
pub fn cookie_offset(cookie: u64) -> u32 {
    (cookie >> 32) as u32
}

struct UserMr {
    mr: *mut sys::ibv_mr,
    owner: u64,
    use_once: bool,
    /// The registered memory, kept alive until the MR is deregistered (in
    /// `drop`, before this field goes).
    _mem: RdmaSeg,
}

impl Drop for UserMr {
    fn drop(&mut self) {
        // SAFETY: a live registration, released once. Once this returns the
        // device no longer touches the memory (a peer's work request still
        // in flight to it fails with a remote access error, as with a kernel
        // MR that was freed); only then is `_mem`'s handle dropped.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

/// A local buffer registered for the duration of one RDMA operation; the
/// memory stays alive until the registration is gone.
pub(crate) struct LocalMr {
    mr: *mut sys::ibv_mr,
    _mem: RdmaSeg,
}

impl LocalMr {
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a live registration (released only in drop).
        unsafe { (*self.mr).lkey }
    }
}

impl Drop for LocalMr {
    fn drop(&mut self) {
        // SAFETY: a live registration, released once. The work requests
        // using it completed, or their QP is gone, or (if the op is dropped
        // early) the device fails them with a protection error from now on:
        // after deregistration it does not touch the memory, whose handle
        // `_mem` is dropped only after this.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

/// Registers the segment for a local RDMA work request (a READ writes into
/// it); the registration keeps the segment's buffer alive.
pub(crate) fn register_local(pd: *mut sys::ibv_pd, seg: &RdmaSeg) -> io::Result<LocalMr> {
    if seg.is_empty() || seg.len() > u32::MAX as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int;
    // SAFETY: the segment is `len` bytes of live memory inside its
    // RdmaBuf (checked when it was formed), accessed by Rust only through
    // atomics while shared; the LocalMr holds a handle to it until it is
    // deregistered, so the device never reaches freed memory. `pd` is the
    // connection's live PD.
    let mr = unsafe { sys::ibv_reg_mr(pd, seg.addr() as *mut c_void, seg.len(), access) };
    if mr.is_null() {
        return Err(errno());
    }
    Ok(LocalMr { mr, _mem: seg.clone() })
}

/// The length checks of `__rds_rdma_map`: EINVAL for an empty segment,
/// EMSGSIZE above [`MAX_MR_BYTES`]. (A segment is inside its buffer by
/// construction, so its range neither wraps nor leaves the buffer.)
pub fn check_mr_seg(seg: &RdmaSeg) -> io::Result<()> {
    let len = seg.len() as u64;
    if len == 0 || seg.addr().checked_add(len).is_none() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    if len > MAX_MR_BYTES {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok(())
}

/// The MRs of a transport, keyed by rkey.
pub struct MrTable {
    verbs: Arc<Verbs>,
    mrs: Mutex<HashMap<u32, UserMr>>,
}

// SAFETY: the MR pointers are library objects usable from any thread; the
// map is behind a mutex.
unsafe impl Send for MrTable {}
// SAFETY: as above.
unsafe impl Sync for MrTable {}

impl MrTable {
    pub fn new(verbs: Arc<Verbs>) -> MrTable {
        MrTable { verbs, mrs: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, UserMr>> {
        self.mrs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `__rds_rdma_map`: registers the segment (readable and writable by
    /// the peer) for the socket `owner` bound to `local`; returns the
    /// cookie. The MR keeps the segment's buffer alive until it is
    /// released. EINVAL for an empty segment, EMSGSIZE above
    /// [`MAX_MR_BYTES`], ENOMEM beyond [`MAX_MRS`], ENODEV when no device
    /// serves `local`, EFAULT when the memory cannot be registered.
    pub fn get_mr(&self, local: Ipv4Addr, owner: u64, seg: &RdmaSeg, flags: u64) -> io::Result<u64> {
        let e = io::Error::from_raw_os_error;
        check_mr_seg(seg)?;
        let (addr, len) = (seg.addr(), seg.len() as u64);
        if self.lock().len() >= MAX_MRS {
            return Err(e(libc::ENOMEM));
        }
        let pd = self.pd_for_addr(local)?;
        let offset = addr % PAGE_SIZE;
        let access = (sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0) as c_int;
        // SAFETY: `len` bytes at `addr` are live memory inside the segment's
        // RdmaBuf, which Rust accesses only through atomics while shared;
        // the UserMr below holds a handle to it until the MR is
        // deregistered, so the peer never reaches freed memory. `pd` is a
        // live PD of the transport. iova = in-page offset makes the MR's
        // addresses the kernel's zero-based ones.
        let mr = unsafe { sys::ibv_reg_mr_iova(pd, addr as *mut c_void, len as usize, offset, access) };
        if mr.is_null() {
            let err = errno();
            return Err(match err.raw_os_error() {
                Some(libc::ENOMEM) => err,
                _ => e(libc::EFAULT),
            });
        }
        let _ = flags & READWRITE;
        let m = UserMr { mr, owner, use_once: flags & USE_ONCE != 0, _mem: seg.clone() };
        // SAFETY: a live registration.
        let rkey = unsafe { (*mr).rkey };
        // A live rkey is never handed out twice; were it, the old entry
        // would be deregistered (then its memory released) here.
        let old = self.lock().insert(rkey, m);
        drop(old);
        Ok(make_cookie(rkey, offset as u32))
    }

    /// `rds_free_mr`: releases the owner's MR named by `cookie`; EINVAL when
    /// it has none of that key (a zero cookie, "flush unused MRs", is a
    /// no-op: nothing is cached).
    pub fn free_mr(&self, owner: u64, cookie: u64) -> io::Result<()> {
        if cookie == 0 {
            return Ok(());
        }
        let mut mrs = self.lock();
        match mrs.get(&cookie_key(cookie)) {
            Some(m) if m.owner == owner => {
                let m = mrs.remove(&cookie_key(cookie));
                drop(mrs);
                drop(m);
                Ok(())
            }
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    /// Whether `owner` has an MR of this rkey (RDMA_DEST: EINVAL if not).
    pub fn owns(&self, owner: u64, rkey: u32) -> bool {
        self.lock().get(&rkey).is_some_and(|m| m.owner == owner)
    }

    /// `rds_rdma_unuse`: a message of an RDMA that used `rkey` arrived for
    /// `owner`; a USE_ONCE MR is released. Returns whether one was.
    pub fn unuse(&self, owner: u64, rkey: u32) -> bool {
        let mut mrs = self.lock();
        if mrs.get(&rkey).is_some_and(|m| m.owner == owner && m.use_once) {
            let m = mrs.remove(&rkey);
            drop(mrs);
            drop(m);
            return true;
        }
        false
    }

    /// `rds_rdma_drop_keys`: the socket closed.
    pub fn drop_owner(&self, owner: u64) {
        let gone: Vec<UserMr> = {
            let mut mrs = self.lock();
            let keys: Vec<u32> = mrs.iter().filter(|(_, m)| m.owner == owner).map(|(k, _)| *k).collect();
            keys.into_iter().filter_map(|k| mrs.remove(&k)).collect()
        };
        drop(gone);
    }

    /// MRs registered now.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// The shared PD of the device that serves `local` (the CM's device
    /// context, the one connections use).
    fn pd_for_addr(&self, local: Ipv4Addr) -> io::Result<*mut sys::ibv_pd> {
        let ch = CmChannel::new()?;
        let guard = ch.create_id()?;
        let id = guard.0;
        let mut sa = sockaddr_v4(local, 0);
        // SAFETY: id is live; sa is valid for the call.
        if unsafe { sys::rdma_bind_addr(id, &mut sa as *mut _ as *mut libc::sockaddr) } != 0 {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        // SAFETY: id is live; verbs is librdmacm's process-wide context of
        // the device, which outlives the id.
        let ctx = unsafe { (*id).verbs };
        if ctx.is_null() {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        self.verbs.pd_for(ctx)
    }
}

impl Drop for MrTable {
    fn drop(&mut self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rds_core::RdmaBuf;

    #[test]
    fn mr_lengths_are_checked_before_registration() {
        let b = RdmaBuf::new(MAX_MR_BYTES as usize + 1);
        let errno = |off, len| check_mr_seg(&b.seg(off, len).unwrap()).err().and_then(|e| e.raw_os_error());
        assert_eq!(errno(0, 1), None);
        assert_eq!(errno(0, MAX_MR_BYTES as usize), None);
        assert_eq!(errno(5, 0), Some(libc::EINVAL));
        assert_eq!(errno(0, MAX_MR_BYTES as usize + 1), Some(libc::EMSGSIZE));
        assert_eq!(b.handles(), 1);
    }

    #[test]
    fn cookies_carry_the_in_page_offset() {
        let b = RdmaBuf::new(3 * PAGE_SIZE as usize);
        let seg = b.seg(PAGE_SIZE as usize + 100, 10).unwrap();
        let c = make_cookie(0xabcd, seg.in_page_offset() as u32);
        assert_eq!((cookie_key(c), cookie_offset(c)), (0xabcd, 100));
    }
}
