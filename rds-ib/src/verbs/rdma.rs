//! RDMA READ / WRITE operations of messages (`RDS_CMSG_RDMA_ARGS`), as the
//! kernel's `rds_ib_xmit_rdma` runs them:
//!
//! * posted on the connection's QP right before the message's SENDs (so
//!   an RDMA WRITE lands before the message that announces it); one work
//!   request per local buffer, each taking a send-ring slot, each signaled;
//!   READWRITE in the op's flags is a WRITE, otherwise a READ;
//! * the remote address is the op's `remote_addr` plus the cookie's
//!   offset, the rkey the cookie's low 32 bits;
//! * each local buffer (a segment of an `RdmaBuf`) is registered
//!   (`ibv_reg_mr`) for the op's duration and released when its last work
//!   request completed (or with the QP); the registration holds a handle
//!   to the buffer, so the memory cannot be freed while the device may
//!   still read or write it, whatever the caller or the core drop first;
//! * FENCE puts `IBV_SEND_FENCE` on the message's first SEND (the SEND waits
//!   for the READ, as `rds_ib_xmit` fences the data after an RDMA);
//! * the op's status once its last work request completed is
//!   [`take_rdma_done`](super::IbConnection::take_rdma_done)'s
//!   (sequence, `RDS_RDMA_*`): success, REMOTE_ERROR for a remote access
//!   error, OTHER_ERROR for any other failure; a flushed op reports
//!   nothing (`rds_ib_send_complete` ignores flushes): the core reports it
//!   when it drops the message (never retransmitted with its op).

use std::collections::HashMap;
use std::io;
use std::ptr;

use rdma_sys as sys;
use rds_core::RdmaOp;
use rds_core::message::{rdma_flags, rdma_status};

use super::mr::{LocalMr, cookie_key, cookie_offset, register_local};
use super::{IbConnection, err};

/// Most local buffers of one op (one send-ring slot each).
pub const MAX_RDMA_SGES: usize = 64;

struct Pending {
    left: usize,
    status: i32,
    flushed: bool,
    /// The local buffers' registrations, each holding its buffer alive;
    /// deregistered when the op's last work request completed, or with the
    /// connection (after its QP is destroyed).
    _mrs: Vec<LocalMr>,
}

/// The RDMA ops in flight on a connection.
#[derive(Default)]
pub(crate) struct RdmaState {
    /// Send-ring slot of each posted RDMA work request: its op's sequence.
    by_slot: HashMap<usize, u64>,
    ops: HashMap<u64, Pending>,
    done: Vec<(u64, i32)>,
    /// The next SEND is fenced.
    fence_next: bool,
    /// Ops completed: (success, failed).
    pub completed: (u64, u64),
    /// Registrations of ops whose post failed part way: kept for the
    /// connection's life (dropped after its QP is destroyed).
    failed_posts: Vec<Vec<LocalMr>>,
}

impl RdmaState {
    /// Whether the SEND about to be posted carries `IBV_SEND_FENCE`.
    pub(crate) fn take_fence(&mut self) -> bool {
        std::mem::take(&mut self.fence_next)
    }

    /// A send completion: if `slot` was an RDMA work request, account it.
    pub(crate) fn on_wc(&mut self, slot: u64, status: sys::ibv_wc_status::Type) {
        let Some(seq) = self.by_slot.remove(&(slot as usize)) else { return };
        let Some(p) = self.ops.get_mut(&seq) else { return };
        p.left = p.left.saturating_sub(1);
        match status {
            sys::ibv_wc_status::IBV_WC_SUCCESS => {}
            sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR => p.flushed = true,
            sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR if p.status == rdma_status::SUCCESS => {
                p.status = rdma_status::REMOTE_ERROR
            }
            _ if p.status == rdma_status::SUCCESS => p.status = rdma_status::OTHER_ERROR,
            _ => {}
        }
        if p.left == 0 {
            let p = self.ops.remove(&seq).unwrap();
            // A flush after a real failure still reports the failure.
            if !p.flushed || p.status != rdma_status::SUCCESS {
                if p.status == rdma_status::SUCCESS {
                    self.completed.0 += 1;
                } else {
                    self.completed.1 += 1;
                }
                self.done.push((seq, p.status));
            }
        }
    }
}

impl IbConnection {
    /// Posts the RDMA operation of message `seq` (whose SENDs follow).
    /// `Ok(false)`: the send ring has no room for it now (try again after
    /// completions). An op without local buffers or with more than
    /// [`MAX_RDMA_SGES`], or with a buffer that cannot be registered, fails
    /// (OTHER_ERROR) without ending the connection; an error means the
    /// connection is down or the post failed.
    pub fn post_rdma(&mut self, seq: u64, op: &RdmaOp) -> io::Result<bool> {
        if !self.up {
            return Err(self.failure_error());
        }
        let bufs: Vec<&rds_core::RdmaSeg> = op.local.iter().filter(|s| !s.is_empty()).collect();
        if bufs.is_empty() || bufs.len() > MAX_RDMA_SGES || bufs.iter().any(|s| s.len() > u32::MAX as usize) {
            // The socket layer refuses these (EINVAL / EMSGSIZE); never
            // reached from it, and never a reason to end the connection.
            self.rdma.completed.1 += 1;
            self.rdma.done.push((seq, rdma_status::OTHER_ERROR));
            return Ok(true);
        }
        // One slot stays free for an ack-only frame, one for the first SEND.
        if self.tx_free.len() < bufs.len() + 2 {
            return Ok(false);
        }
        // SAFETY: the QP is live; its pd is the connection's PD.
        let pd = unsafe { (*self.qp()).pd };
        let mut mrs = Vec::with_capacity(bufs.len());
        for seg in &bufs {
            match register_local(pd, seg) {
                Ok(m) => mrs.push(m),
                Err(_) => {
                    self.rdma.completed.1 += 1;
                    self.rdma.done.push((seq, rdma_status::OTHER_ERROR));
                    return Ok(true);
                }
            }
        }
        let write = op.flags & rdma_flags::READWRITE != 0;
        let opcode = if write { sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE } else { sys::ibv_wr_opcode::IBV_WR_RDMA_READ };
        let rkey = cookie_key(op.remote_cookie);
        let mut raddr = op.remote_addr.wrapping_add(u64::from(cookie_offset(op.remote_cookie)));
        let n = bufs.len();
        let mut sges: Vec<sys::ibv_sge> = bufs
            .iter()
            .zip(&mrs)
            .map(|(seg, m)| sys::ibv_sge { addr: seg.addr(), length: seg.len() as u32, lkey: m.lkey() })
            .collect();
        // SAFETY: an all-zero ibv_send_wr is valid (null pointers, no flags).
        let mut wrs: Vec<sys::ibv_send_wr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut slots = Vec::with_capacity(n);
        for k in 0..n {
            let slot = self.tx_free.pop().expect("checked room");
            slots.push(slot);
            wrs[k].wr_id = slot as u64;
            wrs[k].sg_list = &mut sges[k];
            wrs[k].num_sge = 1;
            wrs[k].opcode = opcode;
            wrs[k].send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            wrs[k].wr.rdma = sys::rdma_t { remote_addr: raddr, rkey };
            raddr = raddr.wrapping_add(bufs[k].len() as u64);
        }
        for k in 1..n {
            let next: *mut sys::ibv_send_wr = &mut wrs[k];
            wrs[k - 1].next = next;
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chained WRs and SGEs are valid for the
        // call, and each SGE names exactly a segment registered above, whose
        // registration (and with it the memory) is kept in `Pending` until
        // the work requests complete or the QP is destroyed.
        let ret = unsafe { sys::ibv_post_send(self.qp(), wrs.as_mut_ptr(), &mut bad) };
        if ret != 0 {
            // The work requests before `bad` may have been posted: their
            // registrations (and memory) stay until the connection, whose
            // QP goes first, is dropped; the error ends the connection.
            self.rdma.failed_posts.push(mrs);
            self.tx_free.extend(slots);
            return Err(err(ret, "ibv_post_send (RDMA)"));
        }
        for s in &slots {
            self.rdma.by_slot.insert(*s, seq);
        }
        self.tx_inflight.extend(slots.into_iter().map(|s| (s, false)));
        self.rdma.ops.insert(seq, Pending { left: n, status: rdma_status::SUCCESS, flushed: false, _mrs: mrs });
        self.rdma.fence_next = op.flags & rdma_flags::FENCE != 0;
        Ok(true)
    }

    /// RDMA ops completed since the last call: (message sequence,
    /// `RDS_RDMA_*` status).
    pub fn take_rdma_done(&mut self, out: &mut Vec<(u64, i32)>) {
        out.append(&mut self.rdma.done);
    }

    /// RDMA ops completed on this connection: (successful, failed).
    pub fn rdma_completed(&self) -> (u64, u64) {
        self.rdma.completed
    }
}
