//! The RDMA services of [`IbTransport`] that the socket layer calls
//! (`RDS_GET_MR`, `RDS_GET_MR_FOR_DEST`, `RDS_FREE_MR`, RDMA_DEST checks,
//! use-once releases, socket close). Memory registration itself is in
//! [`crate::verbs::mr`]; the execution of RDMA operations in
//! `verbs/rdma.rs`.

use std::io;
use std::net::IpAddr;

use rds_core::RdmaSeg;

use crate::transport::{IbTransport, SetupMode};

impl IbTransport {
    /// `RDS_GET_MR`: registers the segment for the socket `owner` bound to
    /// `local` (the MR keeps its buffer alive until released); returns the
    /// cookie (`rkey | in-page offset << 32`). Errors as
    /// [`crate::verbs::mr::MrTable::get_mr`]; EOPNOTSUPP in verbs-only mode
    /// (not done there yet).
    pub fn get_mr(&self, local: IpAddr, owner: u64, seg: &RdmaSeg, flags: u64) -> io::Result<u64> {
        if matches!(self.cfg.mode, SetupMode::VerbsOnly { .. }) {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let local = match local {
            IpAddr::V4(a) => a,
            IpAddr::V6(a) => a.to_ipv4_mapped().ok_or_else(|| io::Error::from_raw_os_error(libc::EOPNOTSUPP))?,
        };
        self.mrs.get_mr(local, owner, seg, flags)
    }

    /// `RDS_FREE_MR`: EINVAL when `owner` has no MR of the cookie's key.
    pub fn free_mr(&self, owner: u64, cookie: u64) -> io::Result<()> {
        self.mrs.free_mr(owner, cookie)
    }

    /// Whether `owner` has an MR of `rkey` (an RDMA_DEST cookie must name one).
    pub fn owns_mr(&self, owner: u64, rkey: u32) -> bool {
        self.mrs.owns(owner, rkey)
    }

    /// A message of an RDMA that used `rkey` reached `owner`: releases a
    /// USE_ONCE MR (`rds_rdma_unuse`). Returns whether one was released.
    pub fn unuse_mr(&self, owner: u64, rkey: u32) -> bool {
        self.mrs.unuse(owner, rkey)
    }

    /// The socket `owner` closed: releases its MRs (`rds_rdma_drop_keys`).
    pub fn drop_mrs(&self, owner: u64) {
        self.mrs.drop_owner(owner)
    }

    /// MRs registered now.
    pub fn mr_count(&self) -> usize {
        self.mrs.count()
    }
}
