//! A file descriptor whose poll state mirrors an RDS socket's readiness.
//!
//! An RDS socket here is not a kernel socket, yet programs want to put it in
//! `poll`, `epoll`, mio or tokio. We give each socket one end (`user`) of a
//! Unix stream socket pair and steer its state from the other end (`peer`):
//!
//! * readable: a byte sits in `user`'s receive queue (written from `peer`;
//!   a few when updates raced, see below); not readable: we read them
//!   back out of `user`.
//! * writable: `user`'s send buffer has room; not writable: we fill it
//!   (write from `user` until EAGAIN, never reading at `peer`); writable
//!   again: we drain `peer`.
//!
//! Readable and writable are thus independent and exact: POLLIN exactly
//! when the RDS socket would report POLLIN, POLLOUT exactly when it would
//! report POLLOUT. Every change is an edge for edge-triggered epoll.
//!
//! Keeping the pair in sync costs syscalls (one `send` when the socket
//! becomes readable, one `recv` when it stops being readable; the writable
//! side changes only when the send buffer fills), so it is only done once
//! somebody asked for the descriptor (`as_fd` / `as_raw_fd`).
//!
//! # The byte that wakes the reader is sent outside the lock
//!
//! The `send` that makes the descriptor readable wakes the thread polling
//! it, and the kernel often runs that thread at once on the sender's CPU,
//! preempting the sender as the call returns. The woken thread takes the
//! message and makes the descriptor not readable again, which needs the
//! pair's state. With that state locked across the `send`, it waited for
//! the preempted sender: per message, several `sched_yield` calls (the
//! lock's spin), a `futex` wait and two more context switches (VM rig,
//! qperf `rds_bw` under the shim, 4 s: 3.9 `sched_yield` and 0.56 `futex`
//! waits per 64 KiB message in the receiving thread; 5.8 and 0.83 per
//! wake-up at 8 KiB). So the `send` runs after the lock is let go, counted
//! (`started`), and the thread that makes the descriptor not readable
//! reads back whatever bytes are there (`drained`): in the case above the
//! byte that woke it, which the kernel queued before the wake-up, so it
//! finds every byte started and owes nothing. Only when a `send` was
//! started and has not queued its byte yet (its thread was preempted
//! between the lock and the call) is a drain owed (`owe`): that `send`'s
//! thread reads the byte back when its call returns, and a thread about to
//! poll the descriptor waits for that first ([`ReadyFd::settle`]), or its
//! poll would return at once on the stale byte. Measured the same way
//! after the change: 29 `sched_yield` and 6 `futex` calls in the 4 s, and
//! 0.91 context switches of the receiving thread per 64 KiB message
//! against 1.27 (bandwidth moved within the rig's noise).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use parking_lot::{Condvar, Mutex};

pub(crate) struct ReadyFd {
    user: OwnedFd,
    peer: OwnedFd,
    state: Mutex<State>,
    /// Signalled when an owed drain is done ([`ReadyFd::settle`]).
    settled: Condvar,
}

struct State {
    readable: bool,
    writable: bool,
    /// Sequence of the last applied update (older updates are ignored).
    applied: u64,
    /// Bytes `fill` wrote from `user` (what `drain` reads back at `peer`).
    filled: usize,
    /// Readable bytes sent (or being sent, outside the lock) from `peer`,
    /// and read back at `user`: `started - drained` may sit in `user`.
    started: u64,
    drained: u64,
    /// Not readable, with a byte started whose `send` had not queued it
    /// when the bytes were read back: its thread reads it back after the
    /// call (module docs).
    owe: bool,
}

fn cvt(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) }
}

impl ReadyFd {
    pub fn new() -> io::Result<ReadyFd> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: socketpair writes two descriptors into the array we pass.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (user, peer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A small send buffer makes "not writable" cheap to reach.
        let small: libc::c_int = 4096;
        // SAFETY: setsockopt reads sizeof(int) bytes from a valid pointer.
        unsafe {
            libc::setsockopt(
                user.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let state =
            State { readable: false, writable: true, applied: 0, filled: 0, started: 0, drained: 0, owe: false };
        Ok(ReadyFd { user, peer, state: Mutex::new(state), settled: Condvar::new() })
    }

    pub fn raw(&self) -> RawFd {
        self.user.as_raw_fd()
    }

    /// Whether the descriptor shows the socket readable (as of the last
    /// update applied; a byte that makes it so may still be on its way).
    pub fn readable(&self) -> bool {
        self.state.lock().readable
    }

    /// Applies readiness computed at sequence `seq`; stale updates are
    /// ignored. Whether it raised the descriptor (sent a readable byte).
    pub fn update(&self, seq: u64, readable: bool, writable: bool) -> bool {
        let mut st = self.state.lock();
        if seq < st.applied {
            return false;
        }
        st.applied = seq;
        if writable != st.writable {
            if writable {
                drain(self.peer.as_raw_fd(), st.filled);
                st.filled = 0;
            } else {
                st.filled += fill(self.user.as_raw_fd());
            }
            st.writable = writable;
        }
        if readable == st.readable {
            return false;
        }
        st.readable = readable;
        if !readable {
            self.read_back(&mut st);
            return false;
        }
        // The byte that wakes a poller goes out after the lock (module docs).
        st.started += 1;
        drop(st);
        let sent = write_some(self.peer.as_raw_fd(), &[1u8]).is_ok_and(|n| n == 1);
        self.sent(sent);
        true
    }

    /// The `send` of a readable byte `update` started returned (`queued`:
    /// the byte is in `user`): reads it back if the descriptor stopped
    /// being readable before it was queued.
    fn sent(&self, queued: bool) {
        let mut st = self.state.lock();
        if !queued {
            // A byte per change never fills the buffer; whatever failed,
            // there is nothing to read back.
            st.started -= 1;
        }
        if st.owe {
            self.read_back(&mut st);
        }
    }

    /// Reads back at `user` every byte queued there, when the descriptor
    /// is not to be readable; a byte started and not yet queued is owed
    /// (`owe`) until its thread reads it back. Readable again: whatever
    /// is queued stays (one byte or more is readable), nothing is owed.
    fn read_back(&self, st: &mut State) {
        if !st.readable {
            st.drained += read_all(self.user.as_raw_fd());
            st.owe = st.started > st.drained;
        } else {
            st.owe = false;
        }
        if !st.owe {
            self.settled.notify_all();
        }
    }

    /// Waits until no drain is owed: a thread about to poll the descriptor
    /// calls it first, or a byte whose read-back its sender still owes
    /// (module docs) would end the poll at once, again and again, until
    /// that thread ran. Almost always returns at once.
    pub fn settle(&self) {
        let mut st = self.state.lock();
        while st.owe {
            // The sender reads its byte back as soon as its `send`
            // returns and signals; each wait is short all the same, and
            // looks again.
            self.settled.wait_for(&mut st, std::time::Duration::from_millis(10));
        }
    }
}

fn write_some(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: writes from a valid buffer of the given length.
    cvt(unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
}

/// Reads every byte queued on `fd` (the readable bytes `update` sent:
/// usually one, a few when sends raced), returning how many: one call
/// when it finds fewer than its buffer holds. The buffers here are small
/// or static: a zeroed buffer of a few KiB on the stack is a `memset` per
/// call, which glibc does with `rep stosb` from 2 KiB, and emulators (the
/// VM rig's QEMU TCG) run that at about 3 ns a byte: 12 µs for 4 KiB, per
/// message whose arrival made the descriptor readable.
fn read_all(fd: RawFd) -> u64 {
    let mut buf = [0u8; 16];
    let mut total = 0u64;
    loop {
        // SAFETY: reads into a valid buffer of the given length.
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if r <= 0 {
            return total;
        }
        total += r as u64;
        if (r as usize) < buf.len() {
            return total;
        }
    }
}

/// Reads back the `filled` bytes `fill` queued on `fd`: one call when it
/// gets them all (a short read then shows the queue empty), else until
/// `EAGAIN`.
fn drain(fd: RawFd, filled: usize) {
    // The bytes read are discarded: an uninitialised buffer on the stack
    // (no `memset`, see `read_once`, and no lock shared by every socket,
    // as a static buffer would need).
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); FILL_CHUNK];
    let mut left = filled;
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into the
        // buffer, which is valid for writes; nothing reads them.
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if r <= 0 {
            break;
        }
        let r = r as usize;
        left = left.saturating_sub(r);
        if left == 0 && r < buf.len() {
            break;
        }
    }
}

/// Bytes `fill` writes and `drain` reads per call.
const FILL_CHUNK: usize = 16384;

/// Writes to `fd` until its send buffer is full; returns the bytes
/// written. One call usually does it: the buffer is larger than the send
/// buffer, and a write that stopped short of it found the buffer full
/// (no second call to see `EAGAIN`).
fn fill(fd: RawFd) -> usize {
    static ZEROS: [u8; FILL_CHUNK] = [0; FILL_CHUNK];
    let buf = &ZEROS;
    let mut total = 0;
    while let Ok(n) = write_some(fd, buf) {
        total += n;
        if n < buf.len() {
            break;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll(fd: RawFd) -> (bool, bool) {
        let mut p = libc::pollfd { fd, events: libc::POLLIN | libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        assert!(r >= 0);
        (p.revents & libc::POLLIN != 0, p.revents & libc::POLLOUT != 0)
    }

    #[test]
    fn all_four_states() {
        let r = ReadyFd::new().unwrap();
        assert_eq!(poll(r.raw()), (false, true));
        r.update(1, true, true);
        assert_eq!(poll(r.raw()), (true, true));
        r.update(2, true, false);
        assert_eq!(poll(r.raw()), (true, false));
        r.update(3, false, false);
        assert_eq!(poll(r.raw()), (false, false));
        r.update(4, false, true);
        assert_eq!(poll(r.raw()), (false, true));
        // A stale update is ignored.
        r.update(3, true, false);
        assert_eq!(poll(r.raw()), (false, true));
        // Not writable and back, twice: each fill is drained whole.
        for seq in [5, 7] {
            r.update(seq, false, false);
            assert_eq!(poll(r.raw()), (false, false));
            r.update(seq + 1, false, true);
            assert_eq!(poll(r.raw()), (false, true));
        }
    }

    /// What `update` does before its `send` (the byte not queued yet).
    fn start_readable(r: &ReadyFd, seq: u64) {
        let mut st = r.state.lock();
        st.applied = seq;
        st.readable = true;
        st.started += 1;
    }

    /// The common race: the `send` queued the byte and woke the reader,
    /// which ran before the sender's call returned. The reader reads the
    /// byte back itself: nothing owed, no wait, and the sender's return
    /// reads nothing.
    #[test]
    fn the_woken_reader_reads_the_byte_back_itself() {
        let r = ReadyFd::new().unwrap();
        start_readable(&r, 1);
        assert_eq!(write_some(r.peer.as_raw_fd(), &[1]).unwrap(), 1);
        assert_eq!(poll(r.raw()), (true, true));
        r.update(2, false, true);
        assert!(!r.state.lock().owe);
        assert_eq!(poll(r.raw()), (false, true));
        r.settle();
        r.sent(true);
        assert_eq!(poll(r.raw()), (false, true));
        let st = r.state.lock();
        assert_eq!((st.started, st.drained, st.owe), (1, 1, false));
    }

    /// The rare race: the reader ran before the sender's `send` queued the
    /// byte. The read-back is owed; a poller waits for it (`settle`); the
    /// sender reads its byte back when its call returns.
    #[test]
    fn a_byte_queued_after_the_reader_is_read_back_by_its_sender() {
        use std::sync::Arc;
        use std::sync::mpsc;
        use std::time::Duration;
        let r = Arc::new(ReadyFd::new().unwrap());
        start_readable(&r, 1);
        r.update(2, false, true);
        assert!(r.state.lock().owe);
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let r = r.clone();
            std::thread::spawn(move || {
                r.settle();
                tx.send(()).unwrap();
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "settle waits while a read-back is owed");
        // The byte lands (a stale POLLIN), then its sender's call returns.
        assert_eq!(write_some(r.peer.as_raw_fd(), &[1]).unwrap(), 1);
        assert_eq!(poll(r.raw()), (true, true));
        r.sent(true);
        assert_eq!(poll(r.raw()), (false, true));
        rx.recv_timeout(Duration::from_secs(5)).expect("settle returns once the byte is read back");
        waiter.join().unwrap();
        let st = r.state.lock();
        assert_eq!((st.started, st.drained, st.owe), (1, 1, false));
    }

    /// Readable again before the late byte landed: the byte stays (one or
    /// more bytes are readable), nothing is owed, and the next "not
    /// readable" reads every byte back.
    #[test]
    fn readable_again_keeps_the_late_byte() {
        let r = ReadyFd::new().unwrap();
        start_readable(&r, 1);
        r.update(2, false, true);
        assert!(r.state.lock().owe);
        r.update(3, true, true);
        assert_eq!(poll(r.raw()), (true, true));
        assert_eq!(write_some(r.peer.as_raw_fd(), &[1]).unwrap(), 1);
        r.sent(true);
        assert!(!r.state.lock().owe);
        assert_eq!(poll(r.raw()), (true, true));
        r.update(4, false, true);
        assert_eq!(poll(r.raw()), (false, true));
        let st = r.state.lock();
        assert_eq!((st.started, st.drained, st.owe), (2, 2, false));
    }

    /// The readiness a test update with sequence `seq` asks for (both
    /// sides change often, in no simple pattern).
    fn wanted(seq: u64) -> (bool, bool) {
        let h = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 40 & 1 == 1, h >> 50 & 1 == 1)
    }

    /// Threads racing their updates (sequences taken before the call, so
    /// they arrive out of order, as the engine's do): once every call
    /// returned, the descriptor shows the newest update and every byte
    /// sent was read back or is the readable one.
    #[test]
    fn racing_updates_end_at_the_newest() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
        const THREADS: u64 = 4;
        const EACH: u64 = 20_000;
        let r = Arc::new(ReadyFd::new().unwrap());
        let next = Arc::new(AtomicU64::new(1));
        let start = Arc::new(std::sync::Barrier::new(THREADS as usize));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (r, next, start) = (r.clone(), next.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..EACH {
                        let seq = next.fetch_add(1, SeqCst);
                        let (rd, wr) = wanted(seq);
                        r.update(seq, rd, wr);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let last = next.load(SeqCst) - 1;
        assert_eq!(last, THREADS * EACH);
        assert_eq!(poll(r.raw()), wanted(last));
        {
            let st = r.state.lock();
            assert!(!st.owe);
            assert_eq!(st.started == st.drained, !wanted(last).0, "no byte left unless readable");
        }
        // It goes on toggling exactly.
        for (k, want) in [(true, false), (false, true), (true, true), (false, false)].into_iter().enumerate() {
            r.update(last + 1 + k as u64, want.0, want.1);
            assert_eq!(poll(r.raw()), want);
        }
    }
}
