//! The rings of a connection: posting receives, sending messages as
//! fragments under credit control, ack-only frames, reaping both
//! completion queues (reassembly, acks, credits), receive flow control,
//! and the blocking helpers ([`IbConnection::send`], [`IbConnection::poll`],
//! [`IbConnection::wait_acked`]) of the probes.

use std::io;
use std::ptr;
use std::time::{Duration, Instant};

use rdma_sys as sys;
use rds_core::wire::{self, HEADER_LEN, Header};

use super::qp::{IbConnection, Received};
use super::{RECV_WR, err};
use crate::proto::frag::{FRAG_SIZE, OutFrame, OutMessage, RecvError, RxKind, ack_only_header};

impl IbConnection {
    pub(super) fn post_recv(&mut self, i: usize) -> io::Result<()> {
        let mut sge = [
            sys::ibv_sge {
                addr: self.rx_hdr.addr(i * HEADER_LEN),
                length: HEADER_LEN as u32,
                lkey: self.rx_hdr.lkey(),
            },
            sys::ibv_sge {
                addr: self.rx_data.addr(i * FRAG_SIZE),
                length: FRAG_SIZE as u32,
                lkey: self.rx_data.lkey(),
            },
        ];
        let mut wr = sys::ibv_recv_wr { wr_id: i as u64, next: ptr::null_mut(), sg_list: sge.as_mut_ptr(), num_sge: 2 };
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; wr and its SGEs are valid for the call and
        // point into registered buffers of this connection.
        let ret = unsafe { sys::ibv_post_recv(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(err(ret, "ibv_post_recv"));
        }
        self.rx_posted += 1;
        Ok(())
    }

    /// Sends one message of `payload` from `sport` to `dport`; returns its
    /// sequence number. Blocks (polling the send CQ) while the send ring is
    /// full, at most until `deadline`.
    pub fn send(&mut self, sport: u16, dport: u16, payload: &[u8], deadline: Instant) -> io::Result<u64> {
        if !self.up {
            return Err(err(libc::ENOTCONN, "RDS-IB send"));
        }
        let seq = self.next_seq;
        let h = Header { sequence: seq, len: payload.len() as u32, sport, dport, ..Header::default() };
        let mut msg = OutMessage::new(h, payload.len(), true).map_err(|e| err(libc::EMSGSIZE, &e.to_string()))?;
        self.next_seq += 1;
        let mut frames = Vec::new();
        while !msg.is_done() {
            // One slot stays free for an ack-only frame.
            while self.tx_free.len() < 2 {
                if Instant::now() >= deadline {
                    return Err(err(libc::ETIMEDOUT, "RDS-IB send ring full"));
                }
                if !self.reap_send()? {
                    self.poll_cm()?;
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            let want = (self.tx_free.len() - 1).min(msg.remaining()) as u32;
            let first = msg.is_fresh();
            let Some(batch) = self.fc.data_batch(want, first) else {
                return Err(err(libc::ENOBUFS, "RDS-IB send: no credits"));
            };
            frames.clear();
            let n = msg.next_batch(batch.frames as usize, batch.ack, batch.adv_credits, &mut self.sig, &mut frames);
            self.fc.give_back(batch.frames - n as u32);
            self.post_frames(&frames, payload)?;
        }
        self.stats.tx_messages += 1;
        Ok(seq)
    }

    pub(super) fn post_frames(&mut self, frames: &[OutFrame], payload: &[u8]) -> io::Result<()> {
        let n = frames.len();
        let mut sges = vec![[sys::ibv_sge { addr: 0, length: 0, lkey: 0 }; 2]; n];
        // SAFETY: an all-zero ibv_send_wr is valid (null pointers, no flags).
        let mut wrs: Vec<sys::ibv_send_wr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut slots = Vec::with_capacity(n);
        for (k, f) in frames.iter().enumerate() {
            let Some(slot) = self.tx_free.pop() else {
                return Err(err(libc::ENOBUFS, "RDS-IB send ring"));
            };
            slots.push(slot);
            self.tx_hdr.buf[slot * HEADER_LEN..(slot + 1) * HEADER_LEN].copy_from_slice(&f.header);
            let data = &payload[f.payload.clone()];
            self.tx_data.buf[slot * FRAG_SIZE..slot * FRAG_SIZE + data.len()].copy_from_slice(data);
            sges[k][0] = sys::ibv_sge {
                addr: self.tx_hdr.addr(slot * HEADER_LEN),
                length: HEADER_LEN as u32,
                lkey: self.tx_hdr.lkey(),
            };
            sges[k][1] = sys::ibv_sge {
                addr: self.tx_data.addr(slot * FRAG_SIZE),
                length: data.len() as u32,
                lkey: self.tx_data.lkey(),
            };
            let mut flags = 0;
            if f.signaled {
                flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if f.solicited {
                flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
            }
            if self.rdma.take_fence() {
                flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
            }
            wrs[k].wr_id = slot as u64;
            wrs[k].sg_list = sges[k].as_mut_ptr();
            wrs[k].num_sge = if data.is_empty() { 1 } else { 2 };
            wrs[k].opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
            wrs[k].send_flags = flags;
        }
        for k in 1..n {
            let next: *mut sys::ibv_send_wr = &mut wrs[k];
            wrs[k - 1].next = next;
        }
        if n == 0 {
            return Ok(());
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chained WRs and their SGEs are valid for
        // the call and point into this connection's registered buffers.
        let ret = unsafe { sys::ibv_post_send(self.qp(), wrs.as_mut_ptr(), &mut bad) };
        if ret != 0 {
            self.tx_free.extend(slots);
            return Err(err(ret, "ibv_post_send"));
        }
        self.tx_inflight.extend(slots.into_iter().map(|s| (s, false)));
        self.stats.tx_frames += n as u64;
        Ok(())
    }

    pub(super) fn post_ack(&mut self, ack: u64, credit: u8) -> io::Result<()> {
        let Some(slot) = self.tx_free.pop() else {
            self.fc.acks.send_failed();
            return Ok(());
        };
        let hdr = ack_only_header(ack, credit);
        self.tx_hdr.buf[slot * HEADER_LEN..(slot + 1) * HEADER_LEN].copy_from_slice(&hdr);
        let mut sge = sys::ibv_sge {
            addr: self.tx_hdr.addr(slot * HEADER_LEN),
            length: HEADER_LEN as u32,
            lkey: self.tx_hdr.lkey(),
        };
        // SAFETY: an all-zero ibv_send_wr is valid.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = slot as u64;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0 | sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: as in post_frames, for one WR.
        let ret = unsafe { sys::ibv_post_send(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            self.tx_free.push(slot);
            self.fc.acks.send_failed();
            return Err(err(ret, "ibv_post_send (ack)"));
        }
        self.tx_inflight.push_back((slot, true));
        self.stats.tx_acks += 1;
        Ok(())
    }

    /// Polls the send CQ; a completion frees its slot and every earlier
    /// (unsignaled) one. Send completions never complete a message (only
    /// the peer's `h_ack` does), so a flushed one only frees its slot.
    /// Returns whether anything completed.
    pub(super) fn reap_send(&mut self) -> io::Result<bool> {
        // SAFETY: ibv_wc is plain data; all-zero is valid.
        let mut wc: [sys::ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let mut any = false;
        loop {
            // SAFETY: the CQ is live; wc has room for 16 entries.
            let n = unsafe { sys::ibv_poll_cq(self.send_cq, 16, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(err(libc::EIO, "ibv_poll_cq (send)"));
            }
            for w in &wc[..n as usize] {
                self.rdma.on_wc(w.wr_id, w.status);
                if w.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                    if w.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                        self.stats.tx_flushed += 1;
                    }
                    self.fail(false, format!("send completion status {} (wr {})", w.status, w.wr_id));
                }
                // A flushed WR is always signaled (flushes complete every
                // WR), so it frees exactly its own slot and earlier ones.
                while let Some((slot, is_ack)) = self.tx_inflight.pop_front() {
                    self.tx_free.push(slot);
                    if is_ack {
                        self.fc.acks.send_complete();
                    }
                    if slot as u64 == w.wr_id {
                        break;
                    }
                }
            }
            any |= n > 0;
            if n < 16 {
                break;
            }
        }
        if self.failed.is_some() {
            return Err(self.failure_error());
        }
        Ok(any)
    }

    /// Polls the receive CQ, reassembles, reposts buffers, queues complete
    /// messages. After a failure (a bad completion or a protocol error)
    /// completions are only drained: flushed receives are counted, nothing
    /// is reposted or delivered. Returns whether anything completed.
    pub(super) fn reap_recv(&mut self) -> io::Result<bool> {
        // SAFETY: ibv_wc is plain data; all-zero is valid.
        let mut wc: [sys::ibv_wc; 32] = unsafe { std::mem::zeroed() };
        let mut any = false;
        loop {
            // SAFETY: the CQ is live; wc has room for 32 entries.
            let n = unsafe { sys::ibv_poll_cq(self.recv_cq, 32, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(err(libc::EIO, "ibv_poll_cq (recv)"));
            }
            for w in &wc[..n as usize] {
                self.rx_posted = self.rx_posted.saturating_sub(1);
                if w.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                    if w.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                        self.stats.rx_flushed += 1;
                    }
                    self.fail(false, format!("receive completion status {}", w.status));
                    continue;
                }
                if self.failed.is_some() {
                    continue;
                }
                let i = w.wr_id as usize;
                if i >= RECV_WR {
                    self.fail(true, "receive completion of an unknown buffer".into());
                    continue;
                }
                let len = w.byte_len as usize;
                self.stats.rx_frames += 1;
                let res = if len < HEADER_LEN {
                    Err(RecvError::NoHeader { byte_len: len })
                } else {
                    let mut hdr = [0u8; HEADER_LEN];
                    hdr.copy_from_slice(&self.rx_hdr.buf[i * HEADER_LEN..(i + 1) * HEADER_LEN]);
                    let plen = (len - HEADER_LEN).min(FRAG_SIZE);
                    self.reasm.on_parts(&hdr, &self.rx_data.buf[i * FRAG_SIZE..i * FRAG_SIZE + plen])
                };
                let frame = match res {
                    Ok(f) => f,
                    Err(e) => {
                        self.fail(true, e.to_string());
                        continue;
                    }
                };
                // Paused: the bytes are copied out (the message is held in
                // `ready`), the buffer waits for the resume.
                if self.gate.completed(i) {
                    match self.post_recv(i) {
                        Ok(()) => self.fc.on_refill(1),
                        Err(e) => self.fail(false, e.to_string()),
                    }
                }
                self.fc.on_frame(frame.ack, frame.credit);
                match frame.kind {
                    RxKind::AckOnly => self.stats.rx_acks += 1,
                    RxKind::Partial => {}
                    RxKind::Message { header, payload } => {
                        if header.flags == wire::flags::CONG_BITMAP {
                            self.stats.rx_cong_maps += 1;
                        }
                        self.fc.acks.on_message(header.sequence, header.flags);
                        self.stats.rx_messages += 1;
                        self.ready.push_back(Received { header, payload });
                    }
                }
            }
            any |= n > 0;
            if n < 32 {
                break;
            }
        }
        if self.failed.is_some() {
            return Err(self.failure_error());
        }
        if self.eager_acks && self.fc.acks.current() > self.eager_acked {
            // Everything received so far gets acked when the receive CQ
            // runs dry, whether or not the sender asked: its last messages
            // are not left waiting for traffic in the other direction.
            self.eager_acked = self.fc.acks.current();
            self.fc.acks.request();
        }
        if let Some(a) = self.fc.attempt_ack() {
            self.post_ack(a.ack, a.credit)?;
        }
        Ok(any)
    }

    /// Receive flow control ([`rds_core::RdsTransport::rx_flow`]): while
    /// paused, receive buffers that complete are reassembled (the messages
    /// wait in [`IbConnection::take_ready`], the owner does not take them) but not
    /// reposted, so the peer runs out of credits, or without credit flow
    /// control meets RNR and retries (see [`crate::proto::credits`]); at most one
    /// ring ([`RECV_WR`] fragments) is held. Resuming reposts the held
    /// buffers and grants them (an ack-only credit update when due).
    pub fn set_rx_paused(&mut self, paused: bool) -> io::Result<()> {
        if paused == self.gate.paused() {
            return Ok(());
        }
        let bufs = self.gate.set(paused);
        if self.failed.is_some() || bufs.is_empty() {
            return Ok(());
        }
        let n = bufs.len() as u32;
        for i in bufs {
            if let Err(e) = self.post_recv(i) {
                self.fail(false, e.to_string());
                return Err(self.failure_error());
            }
        }
        self.fc.on_refill(n);
        if let Some(a) = self.fc.attempt_ack() {
            self.post_ack(a.ack, a.credit)?;
        }
        Ok(())
    }

    /// Receive flow control: (times paused, receive buffers held now, most
    /// held at once).
    pub fn rx_gate(&self) -> (u64, usize, usize) {
        (self.gate.pauses, self.gate.held(), self.gate.peak)
    }

    /// Whether receiving is paused ([`IbConnection::set_rx_paused`]).
    pub fn rx_gate_paused(&self) -> bool {
        self.gate.paused()
    }

    /// Bytes of the complete messages waiting in [`IbConnection::take_ready`]
    /// (payload plus header).
    pub fn ready_bytes(&self) -> usize {
        self.ready.iter().map(|r| r.payload.len() + HEADER_LEN).sum()
    }

    /// Complete messages received so far, in order.
    pub fn take_ready(&mut self, out: &mut Vec<Received>) {
        out.extend(self.ready.drain(..));
    }

    /// Posts as many fragments of `msg` (whose payload is `payload`) as the
    /// send ring and the send credits allow, one slot always kept for an
    /// ack-only frame. Returns whether the whole message is posted; if not,
    /// call again after send completions (or credits) arrive.
    pub fn post_message(&mut self, msg: &mut OutMessage, payload: &[u8]) -> io::Result<bool> {
        if !self.up {
            return Err(self.failure_error());
        }
        let mut frames = Vec::new();
        while !msg.is_done() {
            if self.tx_free.len() < 2 {
                return Ok(false);
            }
            let want = (self.tx_free.len() - 1).min(msg.remaining()) as u32;
            let first = msg.is_fresh();
            let Some(batch) = self.fc.data_batch(want, first) else {
                return Ok(false);
            };
            frames.clear();
            let n = msg.next_batch(batch.frames as usize, batch.ack, batch.adv_credits, &mut self.sig, &mut frames);
            self.fc.give_back(batch.frames - n as u32);
            self.post_frames(&frames, payload)?;
        }
        self.stats.tx_messages += 1;
        Ok(true)
    }

    /// Requests an explicit ack of everything received so far.
    pub fn ack_now(&mut self) -> io::Result<()> {
        self.fc.acks.request();
        if let Some(a) = self.fc.attempt_ack() {
            self.post_ack(a.ack, a.credit)?;
        }
        Ok(())
    }

    /// Drives completions and CM events until a message is ready or
    /// `deadline` passes (`None`).
    pub fn poll(&mut self, deadline: Instant) -> io::Result<Option<Received>> {
        loop {
            if let Some(m) = self.ready.pop_front() {
                return Ok(Some(m));
            }
            let busy = self.reap_recv()? | self.reap_send()?;
            if !self.ready.is_empty() {
                continue;
            }
            self.poll_cm()?;
            if Instant::now() >= deadline {
                return Ok(None);
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Drives completions until the peer acked `seq` (its `h_ack`), queueing
    /// whatever arrives meanwhile.
    pub fn wait_acked(&mut self, seq: u64, deadline: Instant) -> io::Result<bool> {
        while self.fc.acks.peer_acked() < seq {
            let busy = self.reap_recv()? | self.reap_send()?;
            self.poll_cm()?;
            if Instant::now() >= deadline {
                return Ok(false);
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(true)
    }
}
