//! The few system calls std, mio and socket2 do not wrap: `SIOCOUTQ` and
//! a `timerfd` for sub-millisecond reactor wake-ups.

use std::fs::File;
use std::io::{self, Read};
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
