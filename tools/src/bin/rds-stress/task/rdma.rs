//! `-D`: the RDMA of the tasks (`rdma_build_req`, `rdma_build_cmsg_xfer`,
//! `rdma_mark_completed` of the original): buffers per pipeline slot, their
//! pattern, the ancillary data of requests and acks, and the completions.

use rds_core::message::rdma_flags;
use rds_sock::{RdmaBuf, RdmaOp, RdmaSeg};
use rds_tools::errstr;
use rds_tools::stress::{Header, RDMA_OP_READ, RDMA_OP_WRITE};

use super::{Extra, Task};
use crate::options::{RDMA_ERROR, die, die_errno};

/// RDMA state of one peer, per pipeline slot (`-D`).
pub struct RdmaSlots {
    /// As requester: the buffer the peer reads or writes, and its cookie
    /// (0 when none is registered).
    pub buf: Vec<RdmaBuf>,
    pub cookie: Vec<u64>,
    /// As responder: the local buffer of the op we run, whether it is in
    /// flight, and (op, pattern) to check a READ with `-v`.
    pub local: Vec<RdmaBuf>,
    pub inflight: Vec<bool>,
    pub issued: Vec<(u8, u64)>,
    pub next_op: u8,
}

/// Fills `buf` with the original's 64-bit RDMA pattern.
fn rdma_fill(buf: &RdmaBuf, pattern: u64) {
    let words: Vec<u8> = pattern.to_ne_bytes().iter().copied().cycle().take(buf.len() / 8 * 8).collect();
    buf.write_at(0, &words).expect("in range");
}

/// The offset of the first word of `buf` that is not `pattern`.
pub fn rdma_check(buf: &RdmaBuf, pattern: u64) -> Option<usize> {
    buf.to_vec().chunks_exact(8).position(|w| w != pattern.to_ne_bytes()).map(|i| i * 8)
}

impl Task {
    /// `-D`, requester: the RDMA fields of request `h` (`rdma_build_req`),
    /// its buffer prepared for `-v`, and how the cookie goes along.
    pub fn rdma_req(&mut self, i: usize, h: &mut Header) -> Extra {
        let o = &self.run.o;
        let (size, vector, mode, verify) = (o.rdma_size, o.rdma_vector, o.rw_mode, o.verify != 0);
        let (get_mr, use_once) = (o.rdma_use_get_mr != 0, o.rdma_use_once != 0);
        let p = &mut self.peers[i];
        let seq = p.send_seq;
        let Some(r) = p.rdma.as_mut() else { return Extra::None };
        let q = h.index as usize;
        h.rdma_op = r.next_op;
        r.next_op = match mode {
            0 => 3 - r.next_op,
            1 => RDMA_OP_READ,
            _ => RDMA_OP_WRITE,
        };
        h.rdma_pattern = (u64::from(seq) << 32) | u64::from(std::process::id());
        h.rdma_addr = r.buf[q].addr();
        h.rdma_size = size;
        h.rdma_vector = vector;
        if verify {
            let fill = if h.rdma_op == RDMA_OP_READ { h.rdma_pattern } else { 0 };
            rdma_fill(&r.buf[q], fill);
        }
        let len = r.buf[q].len() as u64;
        let flags = rdma_flags::READWRITE | if use_once { rdma_flags::USE_ONCE } else { 0 };
        let _ = len;
        if !get_mr {
            return Extra::Map(r.buf[q].all(), flags);
        }
        if r.cookie[q] == 0 {
            // The MR keeps the slot's buffer alive until it is released.
            r.cookie[q] = self
                .sock
                .get_mr(&r.buf[q].all(), flags)
                .unwrap_or_else(|e| rdma_die("setsockopt(RDS_GET_MR) failed", &e));
        }
        Extra::Dest(r.cookie[q])
    }

    /// `-D`, responder: the RDMA op that goes with the ack of slot `q`
    /// (`rdma_build_cmsg_xfer`); EAGAIN while the slot's previous op has
    /// not completed.
    pub fn rdma_ack_op(&mut self, i: usize, q: usize, h: &Header) -> Result<Extra, i32> {
        let o = &self.run.o;
        let (verify, fence, depth) = (o.verify != 0, o.rdma_use_fence != 0, o.req_depth as usize);
        let Some(r) = self.peers[i].rdma.as_mut() else { return Ok(Extra::None) };
        if r.inflight[q] {
            return Err(libc::EAGAIN);
        }
        let size = u64::from(h.rdma_size);
        // The peer's header sizes our vector: a vector beyond the slot's
        // buffer (both sides were given the same -D and -I) is the peer's
        // bug, never memory outside the buffer.
        let local = (0..h.rdma_vector as usize)
            .map(|v| r.local[q].seg(size as usize * v, size as usize))
            .collect::<Result<Vec<RdmaSeg>, _>>()
            .unwrap_or_else(|_| {
                die(&format!(
                    "a request asks for an RDMA of {} x {size} bytes, beyond the slot's {} (-D / -I differ?)",
                    h.rdma_vector,
                    r.local[q].len()
                ))
            });
        let mut flags = rdma_flags::NOTIFY_ME;
        if h.rdma_op == RDMA_OP_WRITE {
            flags |= rdma_flags::READWRITE;
            if verify {
                rdma_fill(&r.local[q], h.rdma_pattern);
            }
        } else if fence {
            flags |= rdma_flags::FENCE;
        }
        r.issued[q] = (h.rdma_op, h.rdma_pattern);
        Ok(Extra::Op(RdmaOp {
            remote_cookie: h.rdma_key,
            remote_addr: h.rdma_phyaddr,
            remote_len: size * u64::from(h.rdma_vector),
            local,
            flags,
            user_token: (i * depth + q) as u64,
        }))
    }
}

impl Task {
    /// An RDMA notification (`rdma_mark_completed`): the slot is free again;
    /// with `-v` a READ's bytes are checked.
    pub fn rdma_completed(&mut self, token: u64, status: i32) {
        let depth = u64::from(self.run.o.req_depth);
        let (i, q) = ((token / depth) as usize, (token % depth) as usize);
        let verify = self.run.o.verify != 0;
        let Some(p) = self.peers.get_mut(i) else { die(&format!("RDMA notification with a bad token {token}")) };
        let Some(r) = p.rdma.as_mut() else { die("an RDMA notification without -D") };
        if status != 0 {
            let what = match status {
                1 => "remote error",
                2 => "operation was cancelled",
                3 => "operation was dropped",
                4 => "other error",
                _ => "unknown error",
            };
            println!("{}: RDMA op {q} failed: {what}", p.dst);
        } else if verify && r.issued[q].0 == RDMA_OP_READ {
            if let Some(off) = rdma_check(&r.local[q], r.issued[q].1) {
                die(&format!("-v: the RDMA READ from {} (slot {q}) differs from the pattern at offset {off}", p.dst));
            }
        }
        r.inflight[q] = false;
    }
}

pub fn rdma_die(what: &str, e: &std::io::Error) -> ! {
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        die(&format!("{what}: {}: {RDMA_ERROR}", errstr(e)));
    }
    die_errno(what, e)
}
