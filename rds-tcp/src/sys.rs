//! The few system calls std, mio and socket2 do not wrap: `SIOCOUTQ`,
//! `IP_BIND_ADDRESS_NO_PORT`, `SO_RCVBUFFORCE`, `TCP_WINDOW_CLAMP`,
//! `SO_TIMESTAMPNS` and the `recvmsg` that returns its stamps, a
//! `timerfd` for sub-millisecond reactor wake-ups, and an epoll
//! registration for no event but errors and hang-ups.

use std::fs::File;
use std::io::{self, IoSliceMut, Read};
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

/// `setsockopt(fd, level, name, &v)` for one `c_int`.
fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt reads one c_int through a pointer to a live local
    // of the length passed; the descriptor is a plain integer.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `SO_TIMESTAMPNS`: the kernel stamps the segments it receives for the
/// socket with the time they arrived, and [`recv_stamped`] returns the
/// stamp of the last one a read took from.
pub(crate) fn timestamp_ns(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// `recvmsg` into `bufs` (no flags): the bytes read, and with
/// [`timestamp_ns`] the kernel's receive time (`CLOCK_REALTIME`, ns since
/// the Unix epoch) of the last segment the read took bytes from
/// (`SCM_TIMESTAMPNS`; `tcp_recvmsg` keeps the stamp of each segment it
/// copies from, so the last one's; segments merged in the receive queue
/// carry the later one's). `None` when the socket has no stamps.
pub(crate) fn recv_stamped(fd: RawFd, bufs: &mut [IoSliceMut<'_>]) -> io::Result<(usize, Option<u64>)> {
    /// Room for one `SCM_TIMESTAMPNS` (`CMSG_SPACE(16)`: 32 bytes) and
    /// more, aligned for `cmsghdr`.
    #[repr(C, align(8))]
    struct Control([u8; 64]);
    let mut control = Control([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSliceMut is ABI compatible with iovec on Unix (std's guarantee).
    msg.msg_iov = bufs.as_mut_ptr().cast();
    msg.msg_iovlen = bufs.len() as _;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    // SAFETY: msg points at live buffers for the call: the iovecs (each
    // into a borrowed slice of its length) and the control buffer of the
    // length given; the kernel writes only within them.
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: the CMSG_* walk stays within msg_controllen bytes of the
    // control buffer the kernel filled (it set msg_controllen to what it
    // wrote); the payload is read unaligned, after a length check.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let want = libc::CMSG_LEN(std::mem::size_of::<libc::timespec>() as u32) as usize;
            if (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_TIMESTAMPNS
                && (*c).cmsg_len as usize >= want
            {
                let t: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                stamp = u64::try_from(t.tv_sec).ok().map(|s| s * 1_000_000_000 + t.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, stamp))
}

/// `SO_RCVBUFFORCE`: `SO_RCVBUF` without the `net.core.rmem_max` cap,
/// for a process with `CAP_NET_ADMIN` (`EPERM` otherwise). The kernel
/// doubles the value, as for `SO_RCVBUF`.
pub(crate) fn rcvbuf_force(fd: RawFd, n: usize) -> io::Result<()> {
    let n = libc::c_int::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, n)
}

/// `TCP_WINDOW_CLAMP`: the largest receive window the socket advertises.
pub(crate) fn window_clamp(fd: RawFd, n: u32) -> io::Result<()> {
    let n = libc::c_int::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP, n)
}

/// The socket's `TCP_WINDOW_CLAMP`.
pub(crate) fn window_clamp_of(fd: RawFd) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` (one c_int) bytes through a
    // pointer to a live local and the length through another.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(v).unwrap_or(0))
}

/// Sets the socket's `TCP_WINDOW_CLAMP` to `clamp` if it is above it
/// (never raises it); whether it did.
pub(crate) fn lower_window_clamp(fd: RawFd, clamp: u32) -> io::Result<bool> {
    if window_clamp_of(fd)? <= clamp {
        return Ok(false);
    }
    window_clamp(fd, clamp)?;
    Ok(true)
}

/// `net.core.rmem_max`, the largest `SO_RCVBUF` a process without
/// `CAP_NET_ADMIN` may set (read once; `None` if it cannot be read).
pub(crate) fn rmem_max() -> Option<usize> {
    static RMEM_MAX: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *RMEM_MAX.get_or_init(|| std::fs::read_to_string("/proc/sys/net/core/rmem_max").ok()?.trim().parse().ok())
}

/// Sets `IP_BIND_ADDRESS_NO_PORT` on a socket about to be bound to port 0:
/// the bind checks the address without taking an ephemeral port (which it
/// would otherwise hold until the socket closes, and fail with
/// `EADDRINUSE` when the range is used up). IPv6 sockets take it too.
pub(crate) fn bind_address_no_port(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1)
}

/// Changes the registration of `fd` on the epoll instance `epfd` (a mio
/// registry's, under `token`) to ask for no event: errors and hang-ups
/// still come (epoll always adds them), edge-triggered as mio registers.
///
/// mio's smallest interest, `PRIORITY` (`EPOLLPRI`), does not do this for
/// a socket: its data-ready callback wakes its waiters with `EPOLLIN |
/// EPOLLPRI | EPOLLRDNORM | EPOLLRDBAND`, so every segment that brings
/// bytes still wakes the epoll waiter, which then polls the socket, finds
/// nothing it asked for, and sleeps again without returning.
pub(crate) fn epoll_quiet(epfd: RawFd, fd: RawFd, token: mio::Token) -> io::Result<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLET as u32, u64: token.0 as u64 };
    // SAFETY: epoll_ctl reads one epoll_event through a pointer to a live
    // local; the descriptors are plain integers (a closed one is EBADF).
    let r = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    use mio::net::TcpStream;
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token};
    use std::io::Write;
    use std::time::Instant;

    /// `lower_window_clamp` lowers a clamp above the one asked for (as a
    /// kernel that recomputed it left it) and leaves one at or below it.
    #[test]
    fn lower_window_clamp_only_lowers() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let fd = rx.as_raw_fd();
        window_clamp(fd, 4 << 20).unwrap();
        assert!(lower_window_clamp(fd, 1 << 20).unwrap());
        assert_eq!(window_clamp_of(fd).unwrap(), 1 << 20);
        assert!(!lower_window_clamp(fd, 1 << 20).unwrap());
        window_clamp(fd, 512 << 10).unwrap();
        assert!(!lower_window_clamp(fd, 1 << 20).unwrap());
        assert_eq!(window_clamp_of(fd).unwrap(), 512 << 10);
    }

    /// This thread's voluntary context switches so far.
    fn voluntary_switches() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Registers the accepted end of a loopback TCP pair with `Interest::READABLE`,
    /// then `quiet` it (or not); a thread waits in `poll` for 600 ms while
    /// 20 segments come in. Returns the events it got and how many times
    /// it slept (voluntary switches during the wait).
    fn wait_through_segments(quiet: impl FnOnce(&Poll, RawFd)) -> (usize, u64) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        tx.set_nodelay(true).unwrap();
        let (rx, _) = l.accept().unwrap();
        rx.set_nonblocking(true).unwrap();
        let rx = TcpStream::from_std(rx);
        let fd = rx.as_raw_fd();
        let mut poll = Poll::new().unwrap();
        poll.registry().register(&mut SourceFd(&fd), Token(7), Interest::READABLE).unwrap();
        quiet(&poll, fd);
        let waiter = std::thread::spawn(move || {
            let mut events = Events::with_capacity(8);
            let before = voluntary_switches();
            let start = Instant::now();
            let mut got = 0;
            while let Some(left) = Duration::from_millis(600).checked_sub(start.elapsed()) {
                poll.poll(&mut events, Some(left)).unwrap();
                got += events.iter().count();
            }
            (got, voluntary_switches() - before, rx)
        });
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..20 {
            tx.write_all(&[1u8; 64]).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        let (got, slept, _rx) = waiter.join().unwrap();
        (got, slept)
    }

    /// A connection registered for nothing (`epoll_quiet`) does not wake
    /// the epoll waiter when bytes come; mio's `PRIORITY`, the control,
    /// wakes it at each segment without reporting anything, which is why
    /// the registration does not use it.
    #[test]
    fn quiet_registration_sleeps_through_data() {
        let (got, slept) = wait_through_segments(|p, fd| epoll_quiet(p.as_raw_fd(), fd, Token(7)).unwrap());
        assert_eq!(got, 0, "no event reported");
        assert!(slept <= 5, "slept {slept} times: woken by data it did not ask for");
        let (got, slept) = wait_through_segments(|p, fd| {
            p.registry().reregister(&mut SourceFd(&fd), Token(7), Interest::PRIORITY).unwrap()
        });
        assert_eq!(got, 0, "EPOLLPRI reports nothing for plain data");
        assert!(slept >= 15, "the control slept only {slept} times: it should be woken by each of 20 segments");
    }

    /// A quiet registration still reports a reset connection.
    #[test]
    fn quiet_registration_reports_a_reset() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = socket2::Socket::from(std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let (rx, _) = l.accept().unwrap();
        rx.set_nonblocking(true).unwrap();
        let fd = rx.as_raw_fd();
        let mut poll = Poll::new().unwrap();
        poll.registry().register(&mut SourceFd(&fd), Token(7), Interest::READABLE).unwrap();
        epoll_quiet(poll.as_raw_fd(), fd, Token(7)).unwrap();
        tx.set_linger(Some(Duration::ZERO)).unwrap();
        drop(tx);
        let mut events = Events::with_capacity(8);
        poll.poll(&mut events, Some(Duration::from_secs(5))).unwrap();
        let e = events.iter().next().expect("an event for the reset");
        assert_eq!(e.token(), Token(7));
        assert!(e.is_error() || e.is_read_closed(), "{e:?}");
    }
}

#[cfg(test)]
mod stamp_tests {
    use std::io::{IoSliceMut, Write};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::{recv_stamped, timestamp_ns};

    fn now_ns() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
    }

    /// With `SO_TIMESTAMPNS` a read returns the kernel's receive time of
    /// the last segment it took: between the write and the read, and two
    /// segments 20 ms apart, read together, give the later one's; without
    /// the option, none.
    #[test]
    fn a_read_returns_its_last_segments_arrival() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        tx.set_nodelay(true).unwrap();
        let (rx, _) = l.accept().unwrap();
        let fd = rx.as_raw_fd();
        let mut buf = [0u8; 64];
        tx.write_all(b"plain").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let (n, t) = recv_stamped(fd, &mut [IoSliceMut::new(&mut buf)]).unwrap();
        assert_eq!((n, t), (5, None), "no stamps without the option");

        timestamp_ns(fd).unwrap();
        let before = now_ns();
        tx.write_all(b"first").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mid = now_ns();
        tx.write_all(b"second").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let after = now_ns();
        let (lo, hi) = buf.split_at_mut(3);
        let (n, t) = recv_stamped(fd, &mut [IoSliceMut::new(lo), IoSliceMut::new(hi)]).unwrap();
        assert_eq!(&buf[..n], b"firstsecond");
        let t = t.expect("a stamp");
        assert!(mid <= t && t <= after, "the second segment's arrival: {before} {mid} {t} {after}");
    }
}
