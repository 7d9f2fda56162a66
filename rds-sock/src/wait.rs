//! A wait for a socket's next wake-up that a signal interrupts
//! ([`crate::RdsSocket::send_msg_wait`]), for the C ABI's blocking send.
//!
//! The kernel's blocking `sendmsg` sleeps on the socket (a full send
//! buffer) or on the destination's congestion map (`rds_cong_wait`) until
//! the event that lets it go on, and a signal ends the sleep. The C ABI
//! waited on the readiness descriptor for `POLLOUT`, which says nothing of
//! a congested port, so a send to one slept 50 us doubling to 1 ms and
//! tried again: woken late, or for nothing (qperf `rds_bw` of 64 KiB on
//! the host loopback: about 1,000 such naps a second while the receiver's
//! socket went congested and back). Every event that can let a send go on
//! already wakes the socket (room in the send buffer: `want_write`; a
//! congestion map update: every socket that saw congestion) and moves its
//! event count; this wait ends on exactly that, in a `ppoll` on an
//! eventfd that the wake-up writes, which a signal interrupts as it
//! interrupts the kernel's wait.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use crate::engine::SockShared;

/// A second thread waiting on the same socket while one holds its
/// eventfd naps this long at most and lets its caller try again.
const SHARED_NAP: Duration = Duration::from_micros(200);

/// Writes 1 to an eventfd (a wake-up for the thread in `ppoll`). A full
/// counter (EAGAIN, after 2^64 - 2 writes nobody read) still reads as
/// readable: nothing is lost.
pub(crate) fn eventfd_signal(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live local array to an eventfd this
    // socket's state owns (kept open as long as the state, which the
    // caller holds).
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

fn new_eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new
    // descriptor that nothing else owns.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drain(fd: RawFd) {
    let mut buf = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live local buffer; the
    // descriptor is non-blocking (EAGAIN when there is nothing).
    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
}

/// `ppoll` on `fd` (POLLIN, or nothing when `fd` is -1) until `deadline`
/// (None: no end), at most `cap`: `Ok(())` when it returned, `EINTR`
/// when a signal handler ran, `ETIMEDOUT` at the deadline.
fn ppoll_until(fd: RawFd, deadline: Option<Instant>, cap: Option<Duration>) -> io::Result<()> {
    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    if left.is_some_and(|l| l.is_zero()) {
        return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
    }
    let wait = match (left, cap) {
        (Some(l), Some(c)) => Some(l.min(c)),
        (l, c) => l.or(c),
    };
    let ts = wait.map(|w| libc::timespec {
        tv_sec: w.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: w.subsec_nanos() as _,
    });
    let mut p = libc::pollfd { fd, events: if fd >= 0 { libc::POLLIN } else { 0 }, revents: 0 };
    let tp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one valid pollfd (a negative fd is ignored by ppoll); `tp`
    // is null or points at a live local; no signal mask.
    let r = unsafe { libc::ppoll(&mut p, 1, tp, std::ptr::null()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
        return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
    }
    Ok(())
}

/// Waits until the socket's wake-up count is past `snap` (taken before
/// the attempt that failed), `deadline` (`ETIMEDOUT`) or a signal
/// handler ran (`EINTR`). Spurious returns are possible: the caller tries
/// again.
pub(crate) fn wait_events(sh: &SockShared, snap: u64, deadline: Option<Instant>) -> io::Result<()> {
    let w = &sh.waiter;
    let efd = match w.efd.get() {
        Some(fd) => fd,
        None => {
            let fd = new_eventfd()?;
            // A thread that raced us set its own; ours closes here.
            let _ = w.efd.set(fd);
            w.efd.get().expect("set above")
        }
    };
    if w.busy.swap(true, SeqCst) {
        // Another thread holds the eventfd: a short nap (bounded), then
        // the caller tries again.
        return if sh.snapshot() != snap { Ok(()) } else { ppoll_until(-1, deadline, Some(SHARED_NAP)) };
    }
    // Busy before the look at the count: a wake-up after the look
    // writes the eventfd; one before it moved the count. What the eventfd
    // held from before is stale: drained first.
    drain(efd.as_raw_fd());
    let r = if sh.snapshot() != snap { Ok(()) } else { ppoll_until(efd.as_raw_fd(), deadline, None) };
    w.busy.store(false, SeqCst);
    r
}
