//! The tasks: one thread per task (the original forks processes), each
//! with its socket bound to port + 1 + id, sending requests to every peer
//! task and answering theirs with acks (`-v` checks the pattern,
//! `--show-outliers` prints slow round trips), counting into its
//! [`TaskCtl`].

mod rdma;

use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rds_sock::{Engine, RdmaBuf, RdmaOp, RdmaSeg, RdsSocket, RecvFlags, SendFlags};
use rds_tools::stress::{
    HEADER_SIZE, Header, MAX_BUCKETS, OP_ACK, OP_REQ, RDMA_OP_READ, RDMA_OP_WRITE, WireOptions, bucket, check_pattern,
    pattern,
};
use rds_tools::{STOP, bind_error};

use crate::options::{Local, RDMA_ERROR, TRANSPORT, die, die_errno};
use crate::report::{Cells, NSTATS, S_ACK_RX, S_ACK_TX, S_MBI, S_MBO, S_REQ_RX, S_REQ_TX, S_RTT_NS, S_SEND_NS};
use rdma::{RdmaSlots, rdma_check, rdma_die};

/// Counters one task shares with the reporting thread: per cell a number of
/// events and a sum.
pub struct TaskCtl {
    cur: [[AtomicU64; 2]; NSTATS],
    pub hist: [AtomicU64; MAX_BUCKETS],
    ready: AtomicBool,
}

impl TaskCtl {
    pub fn new() -> TaskCtl {
        TaskCtl {
            cur: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
            ready: AtomicBool::new(false),
        }
    }

    fn inc(&self, cell: usize, v: u64) {
        self.cur[cell][0].fetch_add(1, Relaxed);
        self.cur[cell][1].fetch_add(v, Relaxed);
    }

    pub fn read(&self) -> Cells {
        std::array::from_fn(|i| (self.cur[i][0].load(Relaxed), self.cur[i][1].load(Relaxed)))
    }
}

/// What all tasks of this side share.
pub struct Run {
    /// The options as this side sees them: `receive_addr` ours,
    /// `send_addr` the peer's.
    pub o: WireOptions,
    pub local: Local,
    pub active: bool,
    /// The `-v` pattern, as long as the longest payload.
    pattern: Vec<u8>,
    pub ctl: Vec<TaskCtl>,
    pub start: OnceLock<Instant>,
    /// Stop sending (end of the run).
    pub stopping: AtomicBool,
    /// Leave.
    pub exit: AtomicBool,
    pub threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

pub fn start_children(o: WireOptions, active: bool, local: Local) -> Arc<Run> {
    let max = o.req_size.max(o.ack_size) as usize;
    let run = Arc::new(Run {
        pattern: pattern(max - HEADER_SIZE),
        ctl: (0..o.nr_tasks).map(|_| TaskCtl::new()).collect(),
        o,
        local,
        active,
        start: OnceLock::new(),
        stopping: AtomicBool::new(false),
        exit: AtomicBool::new(false),
        threads: std::sync::Mutex::new(Vec::new()),
    });
    for i in 0..run.o.nr_tasks {
        let r = run.clone();
        let h = std::thread::Builder::new()
            .name(format!("rds-stress-{i}"))
            .spawn(move || Task::setup(r, i).run())
            .unwrap_or_else(|e| die_errno(&format!("starting task {i} failed"), &e));
        run.threads.lock().unwrap().push(h);
    }
    // A task that fails to set up ends the process with its reason.
    while !run.ctl.iter().all(|c| c.ready.load(Relaxed)) {
        std::thread::sleep(Duration::from_millis(5));
    }
    run
}

/// One peer task, as seen by one of our tasks.
struct Peer {
    dst: SocketAddrV4,
    /// Requests sent and not yet acked.
    pending: u32,
    /// Requests received and not yet acked.
    unacked: u32,
    /// Sends failed with ENOBUFS; wait for a congestion update.
    congested: bool,
    send_seq: u32,
    recv_seq: u32,
    send_index: u32,
    recv_index: u32,
    send_time: Vec<Instant>,
    ack_header: Vec<Header>,
    /// `-D`: the RDMA buffers of every pipeline slot.
    rdma: Option<RdmaSlots>,
}

/// Ancillary data of one send.
enum Extra {
    None,
    /// RDMA_MAP of a buffer, with its flags.
    Map(RdmaSeg, u32),
    /// RDMA_DEST cookie.
    Dest(u64),
    /// RDMA_ARGS.
    Op(RdmaOp),
}

struct Task {
    run: Arc<Run>,
    id: u16,
    me: SocketAddrV4,
    sock: RdsSocket,
    fd: RawFd,
    peers: Vec<Peer>,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    cong_monitor: bool,
}

macro_rules! trace {
    ($t:expr, $($a:tt)*) => {
        if $t.run.o.tracing != 0 {
            eprintln!($($a)*);
        }
    };
}

fn is_again(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOBUFS))
}

impl Task {
    /// The original's `rds_socket`: bind, buffers, congestion monitor,
    /// non-blocking, TOS.
    fn setup(run: Arc<Run>, id: u16) -> Task {
        let o = &run.o;
        let me = SocketAddrV4::new(o.receive_addr, o.starting_port + 1 + id);
        let sock = Engine::global()
            .and_then(|e| e.socket())
            .unwrap_or_else(|e| die_errno("socket(PF_RDS, SOCK_SEQPACKET) failed", &e));
        rds_tools::apply_transport(&sock, TRANSPORT.get().and_then(|t| t.as_deref())).unwrap_or_else(|e| die(&e));
        sock.bind(me.into()).unwrap_or_else(|e| die(&bind_error(me.into(), &e)));
        let warn = id == 0;
        let want = u64::from(o.nr_tasks) * u64::from(o.req_depth) * (u64::from(o.req_size) + u64::from(o.ack_size)) * 2;
        let bytes = want.min(i32::MAX as u64 / 2) as usize;
        sock.set_send_buffer_size_force(bytes)
            .unwrap_or_else(|e| die_errno(&format!("setsockopt(SNDBUF, {bytes}) failed"), &e));
        sock.set_recv_buffer_size_force(bytes)
            .unwrap_or_else(|e| die_errno(&format!("setsockopt(RCVBUF, {bytes}) failed"), &e));
        let snd = sock.send_buffer_size().unwrap_or_else(|e| die_errno("getsockopt(SNDBUF) failed", &e));
        if (snd as u64) / 2 < want && warn {
            eprintln!("getsockopt(SNDBUF) returned {snd}, we wanted {want} * 2");
        }
        let rcv = sock.recv_buffer_size().unwrap_or_else(|e| die_errno("getsockopt(RCVBUF) failed", &e));
        if (rcv as u64) / 2 < want && warn {
            eprintln!("getsockopt(RCVBUF) returned {rcv}, we need {want} * 2");
        }
        let mut cong_monitor = o.use_cong_monitor != 0;
        if cong_monitor {
            if let Err(e) = sock.set_cong_monitor(true) {
                if e.raw_os_error() != Some(libc::ENOPROTOOPT) {
                    die_errno("setsockopt(RDS_CONG_MONITOR) failed", &e);
                }
                if warn {
                    println!("Kernel does not support congestion monitoring; disabled");
                }
                cong_monitor = false;
            }
        }
        sock.set_nonblocking(true).unwrap_or_else(|e| die_errno("O_NONBLOCK failed", &e));
        if o.tos != 0 {
            sock.set_tos(o.tos).unwrap_or_else(|e| die_errno("ERROR: failed to set TOS", &e));
        }
        let fd = sock.as_raw_fd();
        let depth = o.req_depth as usize;
        let peers = (0..o.nr_tasks)
            .map(|j| Peer {
                dst: SocketAddrV4::new(o.send_addr, o.starting_port + 1 + j),
                pending: 0,
                unacked: 0,
                congested: false,
                send_seq: 0,
                recv_seq: 0,
                send_index: 0,
                recv_index: 0,
                send_time: vec![Instant::now(); depth],
                ack_header: vec![Header::default(); depth],
                rdma: (o.rdma_size != 0).then(|| {
                    let len = o.rdma_size as usize * o.rdma_vector as usize;
                    RdmaSlots {
                        buf: (0..depth).map(|_| RdmaBuf::new(len)).collect(),
                        cookie: vec![0; depth],
                        local: (0..depth).map(|_| RdmaBuf::new(len)).collect(),
                        inflight: vec![false; depth],
                        issued: vec![(0, 0); depth],
                        next_op: if o.rw_mode == 2 { RDMA_OP_WRITE } else { RDMA_OP_READ },
                    }
                }),
            })
            .collect();
        let max = o.req_size.max(o.ack_size) as usize;
        let mut sbuf = vec![0u8; max];
        if o.verify != 0 {
            sbuf[HEADER_SIZE..].copy_from_slice(&run.pattern);
        }
        let rbuf = vec![0u8; max];
        run.ctl[id as usize].ready.store(true, Relaxed);
        Task { id, me, sock, fd, peers, sbuf, rbuf, cong_monitor, run }
    }

    fn ctl(&self) -> &TaskCtl {
        &self.run.ctl[self.id as usize]
    }

    fn run(mut self) {
        // Sleep until we are supposed to start.
        let start = loop {
            if let Some(s) = self.run.start.get() {
                break *s;
            }
            if self.run.exit.load(Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let do_work = self.run.o.simplex == 0 || self.run.active;
        let mut events = libc::POLLIN | libc::POLLOUT;
        let mut cancelled = false;
        while !self.run.exit.load(Relaxed) {
            let mut pfd = [libc::pollfd { fd: self.fd, events, revents: 0 }];
            // The socket's poll: while it waits for POLLIN it reads the
            // connection the answers come on itself, as a blocking receive
            // does, instead of waiting for the reactor to read and raise
            // the descriptor.
            let r = match self.sock.poll_with(&mut pfd, 0, Some(Duration::from_millis(100))) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => die_errno("poll failed", &e),
            };
            let pfd = pfd[0];
            if r == 0 {
                // Nothing for a while: retry congested destinations in case
                // their update went by.
                for p in &mut self.peers {
                    p.congested = false;
                }
            }
            events = libc::POLLIN;
            if pfd.revents & libc::POLLIN != 0 {
                while self.recv_one() {}
            }
            if self.run.stopping.load(Relaxed) {
                if self.run.local.cancel_sent_to && STOP.load(Relaxed) && !cancelled {
                    cancelled = true;
                    self.cancel_sent_to();
                }
                continue;
            }
            // Keep the pipeline full.
            let can_send = pfd.revents & libc::POLLOUT != 0;
            for i in 0..self.peers.len() {
                if self.cong_monitor && self.peers[i].congested {
                    continue;
                }
                if let Err(e) = self.send_anything(i, can_send, do_work) {
                    events |= libc::POLLOUT;
                    // EAGAIN: our send buffer is full; ENOBUFS: this
                    // destination is congested, others may not be.
                    if e == libc::ENOBUFS {
                        self.peers[i].congested = true;
                    }
                }
            }
        }
    }

    fn cancel_sent_to(&self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        for p in &self.peers {
            let t0 = Instant::now();
            if let Err(e) = self.sock.cancel_sent_to(p.dst.into()) {
                die_errno(&format!("RDS_CANCEL_SENT_TO[{}] failed", p.dst.port() - self.run.o.starting_port - 1), &e);
            }
            println!("RDS_CANCEL_SENT_TO({})[{tid}] took {} msec", p.dst, t0.elapsed().as_millis());
        }
    }

    /// Acks what we owe, then requests up to the depth. Err(errno) when a
    /// send would block (EAGAIN, ENOBUFS) or `can_send` is false.
    fn send_anything(&mut self, i: usize, can_send: bool, do_work: bool) -> Result<(), i32> {
        let depth = self.run.o.req_depth;
        while self.peers[i].unacked > 0 {
            if !can_send {
                return Err(libc::EAGAIN);
            }
            let p = &self.peers[i];
            let q = ((p.recv_index + depth - p.unacked) % depth) as usize;
            let mut h = p.ack_header[q];
            let extra = if h.rdma_op != 0 { self.rdma_ack_op(i, q, &h)? } else { Extra::None };
            self.send_packet(i, &mut h, self.run.o.ack_size as usize, extra)?;
            if h.rdma_op != 0 {
                if let Some(r) = self.peers[i].rdma.as_mut() {
                    r.inflight[q] = true;
                }
            }
            self.ctl().inc(S_ACK_TX, u64::from(self.run.o.ack_size));
            trace!(self, "ACK: {} -> {} seq {} index {}", self.me, self.peers[i].dst, h.seq, h.index);
            self.peers[i].unacked -= 1;
        }
        while do_work && self.peers[i].pending < depth {
            if !can_send {
                return Err(libc::EAGAIN);
            }
            let p = &self.peers[i];
            let mut h = Header {
                op: OP_REQ,
                from_addr: *self.me.ip(),
                from_port: self.me.port(),
                to_addr: *p.dst.ip(),
                to_port: p.dst.port(),
                index: p.send_index as u16,
                ..Header::default()
            };
            let extra = self.rdma_req(i, &mut h);
            let start = Instant::now();
            let n = self.send_packet(i, &mut h, self.run.o.req_size as usize, extra)?;
            let took = start.elapsed();
            let p = &mut self.peers[i];
            p.send_time[p.send_index as usize] = start;
            p.send_index = (p.send_index + 1) % depth;
            p.pending += 1;
            self.ctl().inc(S_REQ_TX, n as u64);
            self.ctl().inc(S_SEND_NS, took.as_nanos() as u64);
            trace!(self, "REQ: {} -> {} seq {} index {}", self.me, self.peers[i].dst, h.seq, h.index);
        }
        Ok(())
    }

    /// Sends one message of `size` bytes with header `h` (its seq filled
    /// in here) to peer `i`, with `extra` as ancillary data.
    fn send_packet(&mut self, i: usize, h: &mut Header, size: usize, extra: Extra) -> Result<usize, i32> {
        let p = &mut self.peers[i];
        h.seq = p.send_seq;
        h.encode(&mut self.sbuf);
        let dst = p.dst.into();
        let q = h.index as usize;
        let res = match extra {
            Extra::None => self.sock.send_to(&self.sbuf[..size], dst),
            Extra::Dest(c) => self.sock.send_msg(
                &self.sbuf[..size],
                Some(dst),
                &SendFlags { rdma_dest: Some(c), ..SendFlags::default() },
            ),
            Extra::Op(op) => {
                self.sock.send_msg(&self.sbuf[..size], Some(dst), &SendFlags { rdma: Some(op), ..SendFlags::default() })
            }
            Extra::Map(seg, flags) => {
                match self.sock.send_rdma_map(&self.sbuf[..size], Some(dst), &seg, flags, &SendFlags::default()) {
                    Ok((n, cookie)) => {
                        if let Some(r) = p.rdma.as_mut() {
                            r.cookie[q] = cookie;
                        }
                        Ok(n)
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match res {
            Ok(n) if n == size => {
                p.send_seq = p.send_seq.wrapping_add(1);
                Ok(n)
            }
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => rdma_die(&format!("sendmsg({})", p.dst), &e),
            Ok(n) => die(&format!("sendto() truncated - {n}")),
            Err(e) if is_again(&e) => Err(e.raw_os_error().unwrap_or(libc::EAGAIN)),
            Err(e) => die_errno(&format!("sendto({}) failed", p.dst), &e),
        }
    }

    /// Receives one message or notification; false when there is none.
    fn recv_one(&mut self) -> bool {
        let m = match self.sock.recv_msg(&mut self.rbuf, RecvFlags::default()) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return false,
            Err(e) => die_errno("recvmsg() failed", &e),
        };
        let now = Instant::now();
        if let Some((token, status)) = m.rdma_status {
            self.rdma_completed(token, status);
            return true;
        }
        if let Some(mask) = m.cong_update {
            for p in &mut self.peers {
                if mask & (1u64 << (p.dst.port() % 64)) != 0 {
                    p.congested = false;
                }
            }
        }
        let Some(from) = m.from else { return true };
        let len = m.len;
        if len < HEADER_SIZE {
            die(&format!("recvmsg() returned short data: {len} (from {from})"));
        }
        let SocketAddr::V4(from) = from else { die(&format!("message from an IPv6 address {from}")) };
        let o = &self.run.o;
        let ti = i64::from(from.port()) - i64::from(o.starting_port) - 1;
        if ti < 0 || ti >= i64::from(o.nr_tasks) {
            die(&format!("received bad task index {ti} (a message from {from})"));
        }
        let ti = ti as usize;
        let depth = o.req_depth;
        let got = Header::decode(&self.rbuf[..len]).unwrap();
        let p = &self.peers[ti];
        let expect_index = match got.op {
            OP_REQ => {
                self.run.ctl[self.id as usize].inc(S_REQ_RX, len as u64);
                if len != o.req_size as usize {
                    die(&format!("req size {len}, not {} (from {from})", o.req_size));
                }
                p.recv_index
            }
            OP_ACK => {
                self.run.ctl[self.id as usize].inc(S_ACK_RX, len as u64);
                if len != o.ack_size as usize {
                    die(&format!("ack size {len}, not {} (from {from})", o.ack_size));
                }
                // The ack of the oldest outstanding request.
                (p.send_index + depth - p.pending) % depth
            }
            op => die(&format!("unknown op {op} (from {from})")),
        };
        let expected = Header {
            op: got.op,
            seq: p.recv_seq,
            from_addr: *from.ip(),
            from_port: from.port(),
            to_addr: *self.me.ip(),
            to_port: self.me.port(),
            index: expect_index as u16,
            ..Header::default()
        };
        if !expected.basic_eq(&got) {
            print!("{}", Header::mismatch_report(&expected, &got));
            die(&format!("header from {from} to id {} bogus", self.me.port()));
        }
        if got.rdma_op != 0 {
            if o.rdma_size == 0 {
                die(&format!("a message from {from} asks for RDMA: {RDMA_ERROR}"));
            }
            if got.rdma_size != o.rdma_size || got.rdma_vector != o.rdma_vector {
                die(&format!("Unexpected RDMA size {} x {} in a message from {from}", got.rdma_size, got.rdma_vector));
            }
            if got.rdma_op != RDMA_OP_READ && got.rdma_op != RDMA_OP_WRITE {
                die(&format!("Unexpected RDMA op {} in a message from {from}", got.rdma_op));
            }
            if got.op == OP_REQ && m.rdma_dest.is_none() {
                die(&format!("an RDMA request from {from} without a cookie (RDMA_DEST)"));
            }
        }
        if o.verify != 0 {
            let payload = &self.rbuf[HEADER_SIZE..len];
            if let Some((off, count)) = check_pattern(payload, &self.run.pattern) {
                let total = payload.len();
                println!(
                    "An incoming message has a corrupted payload at offset {off}; {count} out of {total} bytes corrupted"
                );
                let what = if got.op == OP_REQ { "request" } else { "ack" };
                die(&format!(
                    "-v: the {what} seq {} from {from} to {} is corrupted at payload offset {off} \
                     (message offset {}): {count} of {total} payload bytes differ from the pattern",
                    got.seq,
                    self.me,
                    off + HEADER_SIZE
                ));
            }
        }
        trace!(
            self,
            "recv {}: {} <- {from} seq {} index {}",
            if got.op == OP_REQ { "REQ" } else { "ACK" },
            self.me,
            got.seq,
            got.index
        );
        let me = self.me;
        let threshold = self.run.local.rtt_threshold;
        let histogram = self.run.local.show_histogram;
        let ctl = &self.run.ctl[self.id as usize];
        let p = &mut self.peers[ti];
        if got.op == OP_ACK {
            let rtt = now.saturating_duration_since(p.send_time[expect_index as usize]);
            ctl.inc(S_RTT_NS, rtt.as_nanos() as u64);
            let us = rtt.as_micros() as u64;
            if threshold.is_some_and(|t| us > t) {
                eprintln!("Found RTT = {us:#x}");
            }
            if histogram {
                ctl.hist[bucket(us)].fetch_add(1, Relaxed);
            }
            p.pending = p.pending.saturating_sub(1);
            if got.rdma_op != 0 {
                let q = expect_index as usize;
                let len = u64::from(got.rdma_size) * u64::from(got.rdma_vector);
                // WRITE: the peer wrote our buffer (RDMA in); READ: it read it.
                ctl.inc(if got.rdma_op == RDMA_OP_WRITE { S_MBI } else { S_MBO }, len);
                let (use_once, verify) = (self.run.o.rdma_use_once != 0, self.run.o.verify != 0);
                if let Some(r) = p.rdma.as_mut() {
                    if verify && got.rdma_op == RDMA_OP_WRITE {
                        if let Some(off) = rdma_check(&r.buf[q], got.rdma_pattern) {
                            die(&format!(
                                "-v: the RDMA WRITE of {from} into slot {q} differs from the pattern at offset {off}"
                            ));
                        }
                    }
                    if !use_once && r.cookie[q] != 0 {
                        self.sock
                            .free_mr(r.cookie[q], 0)
                            .unwrap_or_else(|e| die_errno("setsockopt(RDS_FREE_MR) failed", &e));
                    }
                    r.cookie[q] = 0;
                }
            }
        } else {
            // Build the ack right away; it is sent when the socket has room.
            let mut ack = Header {
                op: OP_ACK,
                from_addr: *me.ip(),
                from_port: me.port(),
                to_addr: *p.dst.ip(),
                to_port: p.dst.port(),
                index: p.recv_index as u16,
                ..Header::default()
            };
            if got.rdma_op != 0 {
                // rdma_build_ack: echo the request's RDMA fields; the
                // cookie came as RDMA_DEST.
                ack.rdma_op = got.rdma_op;
                ack.rdma_size = got.rdma_size;
                ack.rdma_vector = got.rdma_vector;
                ack.rdma_addr = got.rdma_addr;
                ack.rdma_phyaddr = got.rdma_phyaddr;
                ack.rdma_pattern = got.rdma_pattern;
                ack.rdma_key = m.rdma_dest.unwrap_or(0);
            }
            p.ack_header[p.recv_index as usize] = ack;
            p.unacked += 1;
            p.recv_index = (p.recv_index + 1) % depth;
        }
        p.recv_seq = p.recv_seq.wrapping_add(1);
        true
    }
}
