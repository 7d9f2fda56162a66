//! One TCP connection serving one instance of one RDS path: its transmit
//! state (messages pulled and not yet fully written, stream offsets of
//! messages awaiting their TCP ack) and its receive state (the frame
//! decoder).

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::SeqCst};

use mio::Token;
use parking_lot::Mutex;
use rds_core::wire::{FrameDecoder, HEADER_LEN};
use rds_core::{DownReason, PathInfo, Payload, TxMessage};

use crate::sys;

/// Connection states.
pub(crate) const CONNECTING: u8 = 0;
pub(crate) const UP: u8 = 1;
/// Shutdown requested: no more writes, reading until the peer's FIN.
pub(crate) const DRAINING: u8 = 2;
pub(crate) const CLOSED: u8 = 3;

/// Slices per `writev` (Linux `IOV_MAX` is 1024).
const IOV_BATCH: usize = 1024;

/// A message pulled from the core, being written.
pub(crate) struct TxItem {
    hdr: [u8; HEADER_LEN],
    payload: Payload,
}

impl TxItem {
    fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
}

#[derive(Default)]
pub(crate) struct TxState {
    /// Pulled messages not completely written; the first one has `head_off`
    /// bytes on the wire already.
    queue: VecDeque<TxItem>,
    head_off: usize,
    /// Stream bytes written to the socket.
    pub written: u64,
    /// Stream offset of the end of the last queued message.
    queued_end: u64,
    /// (end offset, sequence) of sequenced messages not yet acked.
    unacked: VecDeque<(u64, u64)>,
    /// Stream bytes the peer's TCP acknowledged, as last seen.
    pub acked: u64,
    /// End offset of the last sequenced message queued.
    pub expected_una: u64,
    /// The reactor polls this connection's acks.
    pub watched: bool,
    /// `written` when acks were last polled.
    polled_at: u64,
}

/// How a write attempt ended.
pub(crate) enum WriteRes {
    /// Everything queued is in the socket.
    Flushed,
    /// The socket's send buffer is full.
    WouldBlock,
}

impl TxState {
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Queues pulled messages; returns whether a sequenced message was added.
    pub fn enqueue(&mut self, msgs: &mut Vec<TxMessage>) -> bool {
        let mut tracked = false;
        for m in msgs.drain(..) {
            self.queued_end += m.wire_len() as u64;
            if !m.is_cong_map() {
                self.unacked.push_back((self.queued_end, m.header.sequence));
                self.expected_una = self.queued_end;
                tracked = true;
            }
            self.queue.push_back(TxItem { hdr: m.header.to_bytes(), payload: m.payload });
        }
        tracked
    }

    /// A message is partly written.
    pub fn mid_message(&self) -> bool {
        self.head_off > 0
    }

    pub fn queued_len(&self) -> usize {
        self.queue.len()
    }

    pub fn unacked_len(&self) -> usize {
        self.unacked.len()
    }

    pub fn has_unacked(&self) -> bool {
        !self.unacked.is_empty()
    }

    /// Bytes written since acks were last polled.
    pub fn written_since_poll(&self) -> u64 {
        self.written - self.polled_at
    }

    /// Reads `SIOCOUTQ` and returns the highest sequence now fully acked,
    /// plus whether the acked offset advanced. Called with the state locked,
    /// so `written` and the queue length are read consistently.
    pub fn poll_acks(&mut self, stream: &TcpStream) -> (Option<u64>, bool) {
        if self.unacked.is_empty() {
            return (None, false);
        }
        self.polled_at = self.written;
        let Ok(outq) = sys::outq(stream.as_raw_fd()) else { return (None, false) };
        let acked = self.written.saturating_sub(outq);
        let advanced = acked > self.acked;
        if advanced {
            self.acked = acked;
        }
        let mut seq = None;
        while let Some(&(end, s)) = self.unacked.front() {
            if end > self.acked {
                break;
            }
            seq = Some(s);
            self.unacked.pop_front();
        }
        (seq, advanced)
    }

    /// Writes queued messages until done or the socket is full.
    pub fn write(&mut self, stream: &TcpStream) -> io::Result<WriteRes> {
        while !self.queue.is_empty() {
            let res = {
                // Only as many slices as there are messages (two each).
                let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity((2 * self.queue.len()).min(IOV_BATCH));
                for (i, item) in self.queue.iter().enumerate() {
                    if iov.len() + 2 > IOV_BATCH {
                        break;
                    }
                    let skip = if i == 0 { self.head_off } else { 0 };
                    if skip < HEADER_LEN {
                        iov.push(IoSlice::new(&item.hdr[skip..]));
                    }
                    let pskip = skip.saturating_sub(HEADER_LEN);
                    if pskip < item.payload.len() {
                        iov.push(IoSlice::new(&item.payload[pskip..]));
                    }
                }
                (&*stream).write_vectored(&iov)
            };
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => self.advance(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(WriteRes::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(WriteRes::Flushed)
    }

    fn advance(&mut self, mut k: usize) {
        self.written += k as u64;
        while k > 0 {
            let Some(front) = self.queue.front() else { break };
            let rem = front.len() - self.head_off;
            if k >= rem {
                k -= rem;
                self.head_off = 0;
                self.queue.pop_front();
            } else {
                self.head_off += k;
                k = 0;
            }
        }
    }
}

pub(crate) struct RxState {
    pub decoder: FrameDecoder,
    /// When a read last brought bytes (or the path was resumed): a partial
    /// message older than `TcpConfig::rx_frame_timeout` resets the
    /// connection.
    pub progress_at: std::time::Instant,
}

static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Monotonic nanoseconds since the first call (for cheap atomics).
pub(crate) fn now_ns() -> u64 {
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

/// The instant of a [`now_ns`] value.
pub(crate) fn instant_of(ns: u64) -> std::time::Instant {
    rds_core::types::later(*EPOCH.get_or_init(std::time::Instant::now), std::time::Duration::from_nanos(ns))
}

/// One TCP connection serving one instance of one RDS path (the kernel's
/// `rds_tcp_connection`, one per `rds_conn_path`): the socket, its state,
/// the transmit and receive state, and the flags the transmitting threads
/// and the reactor share. A path that reconnects gets a new one (a new
/// `info.inst`); reports about an older one are ignored by the core.
pub(crate) struct PathConn {
    pub token: Token,
    pub reactor: usize,
    pub info: PathInfo,
    pub stream: TcpStream,
    pub local: Option<SocketAddr>,
    pub peer: SocketAddr,
    pub state: AtomicU8,
    /// `RDS_IN_XMIT`: a thread is transmitting on this connection.
    pub in_xmit: AtomicBool,
    /// Kicked while someone was transmitting: go around again.
    pub again: AtomicBool,
    /// A write hit EAGAIN: the reactor resumes on the next writable event.
    pub wait_writable: AtomicBool,
    /// Writable events seen (closes the race between EAGAIN and the event).
    pub wr_gen: AtomicU64,
    /// Why the connection is being closed, when the core asked.
    pub requested: Mutex<Option<DownReason>>,
    /// The peer's FIN or an error was seen: the connection is ending, so
    /// it is read to its end even while the core has its path paused, by
    /// every later pass too (one pass stops at the read budget).
    pub rx_ending: AtomicBool,
    pub tx: Mutex<TxState>,
    pub rx: Mutex<RxState>,
    /// [`now_ns`] of the last write (write coalescing).
    pub last_write: AtomicU64,
    /// The reactor will flush this connection at the end of a window.
    pub flush_pending: AtomicBool,
}

impl PathConn {
    pub fn new(
        token: Token,
        reactor: usize,
        info: PathInfo,
        stream: TcpStream,
        peer: SocketAddr,
        state: u8,
    ) -> PathConn {
        let local = stream.local_addr().ok();
        PathConn {
            token,
            reactor,
            info,
            stream,
            local,
            peer,
            state: AtomicU8::new(state),
            in_xmit: AtomicBool::new(false),
            again: AtomicBool::new(false),
            wait_writable: AtomicBool::new(false),
            wr_gen: AtomicU64::new(0),
            requested: Mutex::new(None),
            rx_ending: AtomicBool::new(false),
            tx: Mutex::new(TxState::default()),
            rx: Mutex::new(RxState { decoder: FrameDecoder::default(), progress_at: std::time::Instant::now() }),
            last_write: AtomicU64::new(0),
            flush_pending: AtomicBool::new(false),
        }
    }

    pub fn state(&self) -> u8 {
        self.state.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rds_core::wire::Header;
    use std::io::Read;
    use std::net::TcpListener;

    fn msg(seq: u64, len: usize) -> TxMessage {
        let mut header = Header::data(1000, 2000, len as u32);
        header.sequence = seq;
        let payload: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + seq) as u8).collect();
        TxMessage { header, payload: Payload::new(payload), ack_required: false, rdma: None }
    }

    /// Partial writes (a tiny send buffer, a reader that is late) never
    /// corrupt the stream, and acks cover exactly the messages whose last
    /// byte the peer acknowledged.
    #[test]
    fn partial_writes_keep_the_stream_exact() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx_sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        tx_sock.set_send_buffer_size(4096).unwrap();
        tx_sock.connect(&l.local_addr().unwrap().into()).unwrap();
        tx_sock.set_nonblocking(true).unwrap();
        let stream: TcpStream = tx_sock.into();
        let (mut rx, _) = l.accept().unwrap();

        let mut msgs: Vec<TxMessage> = (1..=200).map(|i| msg(i, (i as usize * 997) % 20_000)).collect();
        msgs.insert(3, TxMessage { header: Header::cong_map(), ..msg(0, 8192) });
        let mut expect = Vec::new();
        for m in &msgs {
            expect.extend_from_slice(&m.header.to_bytes());
            expect.extend_from_slice(&m.payload);
        }
        let mut st = TxState::default();
        assert!(st.enqueue(&mut msgs));
        assert_eq!(st.unacked_len(), 200, "the congestion map is not tracked");
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; expect.len()];
            rx.read_exact(&mut got).unwrap();
            assert!(got == expect, "byte stream differs");
        });
        let mut blocked = 0;
        let mut last_seq = 0;
        loop {
            match st.write(&stream).unwrap() {
                WriteRes::Flushed => break,
                WriteRes::WouldBlock => {
                    blocked += 1;
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
            if let (Some(s), _) = st.poll_acks(&stream) {
                assert!(s > last_seq);
                last_seq = s;
            }
        }
        assert!(blocked > 0, "the small buffer forced partial writes");
        reader.join().unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while last_seq < 200 {
            assert!(std::time::Instant::now() < until, "acks");
            if let (Some(s), _) = st.poll_acks(&stream) {
                last_seq = s;
            }
        }
        assert_eq!(st.acked, st.written);
        assert!(!st.has_unacked());
    }
}
