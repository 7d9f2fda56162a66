//! A file descriptor whose poll state mirrors an RDS socket's readiness.
//!
//! An RDS socket here is not a kernel socket, yet programs want to put it in
//! `poll`, `epoll`, mio or tokio. We give each socket one end (`user`) of a
//! Unix stream socket pair and steer its state from the other end (`peer`):
//!
//! * readable: one byte sits in `user`'s receive queue (written from `peer`);
//!   not readable: we read it back out of `user`.
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

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use parking_lot::Mutex;

pub(crate) struct ReadyFd {
    user: OwnedFd,
    peer: OwnedFd,
    state: Mutex<State>,
}

struct State {
    readable: bool,
    writable: bool,
    /// Sequence of the last applied update (older updates are ignored).
    applied: u64,
    /// Bytes `fill` wrote from `user` (what `drain` reads back at `peer`).
    filled: usize,
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
        Ok(ReadyFd { user, peer, state: Mutex::new(State { readable: false, writable: true, applied: 0, filled: 0 }) })
    }

    pub fn raw(&self) -> RawFd {
        self.user.as_raw_fd()
    }

    /// Whether the descriptor shows the socket readable (as of the last
    /// update applied).
    pub fn readable(&self) -> bool {
        self.state.lock().readable
    }

    /// Applies readiness computed at sequence `seq`; stale updates are ignored.
    pub fn update(&self, seq: u64, readable: bool, writable: bool) {
        let mut st = self.state.lock();
        if seq < st.applied {
            return;
        }
        st.applied = seq;
        if readable != st.readable {
            if readable {
                let _ = write_some(self.peer.as_raw_fd(), &[1u8]);
            } else {
                // Readable and not readable alternate under the state lock,
                // so `user` holds at most the one byte written above: one
                // read takes it (no second read to see EAGAIN).
                read_once(self.user.as_raw_fd());
            }
            st.readable = readable;
        }
        if writable != st.writable {
            if writable {
                drain(self.peer.as_raw_fd(), st.filled);
                st.filled = 0;
            } else {
                st.filled += fill(self.user.as_raw_fd());
            }
            st.writable = writable;
        }
    }
}

fn write_some(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: writes from a valid buffer of the given length.
    cvt(unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
}

/// Reads what is queued on `fd` with one call (the one byte `update`
/// wrote; up to 16). The buffers here are small or static: a zeroed
/// buffer of a few KiB on the stack is a `memset` per call, which glibc
/// does with `rep stosb` from 2 KiB, and emulators (the VM rig's QEMU
/// TCG) run that at about 3 ns a byte: 12 µs for 4 KiB, per message whose
/// arrival made the descriptor readable.
fn read_once(fd: RawFd) {
    let mut buf = [0u8; 16];
    // SAFETY: reads into a valid buffer of the given length.
    unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
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
}
