//! The few system calls std, mio and socket2 do not wrap: `SIOCOUTQ`, a
//! gathering send that raises no SIGPIPE, and a `timerfd` for
//! sub-millisecond reactor wake-ups.

use std::fs::File;
use std::io::{self, IoSlice, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Bytes in the socket's send queue not yet acknowledged by the peer
/// (`ioctl(SIOCOUTQ)`, which is `TIOCOUTQ` for TCP sockets).
pub(crate) fn outq(fd: RawFd) -> io::Result<u64> {
    let mut v: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one c_int through a pointer to a live local.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut v as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(v).unwrap_or(0))
}

/// `writev` that never raises SIGPIPE: `sendmsg` with `MSG_NOSIGNAL`, as
/// the kernel's RDS-TCP sends. The engine writes in the caller's thread,
/// inside programs whose SIGPIPE is the default (C programs under the
/// preload shim, qperf among them): a write to a connection the peer
/// reset (EPIPE) must be an error for the path, not the end of the
/// program. `writev` raises the signal on EPIPE.
pub(crate) fn send_vectored(fd: RawFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix (std's guarantee); the
    // kernel only reads through msg_iov.
    msg.msg_iov = iov.as_ptr().cast_mut().cast();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` points at `iov`, which outlives the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// A non-blocking monotonic one-shot timer usable as a mio source.
pub(crate) struct TimerFd {
    file: File,
}

impl TimerFd {
    pub(crate) fn new() -> io::Result<TimerFd> {
        // SAFETY: plain syscall with constant flags; the result is checked.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by timerfd_create and is owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(TimerFd { file: File::from(owned) })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Fires once after `after` (at least 1 µs), replacing any earlier setting.
    pub(crate) fn arm(&mut self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_micros(1));
        self.set(after)
    }

    fn set(&self, after: Duration) -> io::Result<()> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: after.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: libc::c_long::from(after.subsec_nanos() as i32),
            },
        };
        // SAFETY: `spec` is a valid itimerspec; the old-value pointer may be null.
        let r = unsafe { libc::timerfd_settime(self.fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consumes an expiration (after the fd polled readable); returns
    /// whether there was one.
    pub(crate) fn clear(&mut self) -> bool {
        let mut buf = [0u8; 8];
        matches!((&self.file).read(&mut buf), Ok(8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Shutdown, TcpListener, TcpStream};

    /// A send after our own shutdown is EPIPE, and no SIGPIPE is raised:
    /// with the signal blocked in this thread, a raised one would stay
    /// pending (Linux never discards a blocked signal as ignored), so the
    /// test sees it without the process dying. Then `writev` does raise it
    /// (the test can fail).
    #[test]
    fn send_vectored_raises_no_sigpipe() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _peer = l.accept().unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        // SAFETY: sigset operations on locals; the mask is this thread's
        // and is restored below; sigtimedwait with a zero timeout only
        // takes a pending SIGPIPE of this thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            let mut old: libc::sigset_t = std::mem::zeroed();
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old), 0);
            let pending = || {
                let mut p: libc::sigset_t = std::mem::zeroed();
                libc::sigpending(&mut p);
                libc::sigismember(&p, libc::SIGPIPE) == 1
            };
            let take = || {
                let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
            };
            take();
            let buf = [1u8; 16];
            let iov = [IoSlice::new(&buf), IoSlice::new(&buf)];
            let e = send_vectored(s.as_raw_fd(), &iov).unwrap_err();
            let after_send = pending();
            let w = libc::writev(s.as_raw_fd(), iov.as_ptr().cast(), 2);
            let after_writev = pending();
            take();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
            assert!(!after_send, "send_vectored raised SIGPIPE");
            assert_eq!(w, -1);
            assert!(after_writev, "writev raises SIGPIPE (the control)");
        }
    }
}
