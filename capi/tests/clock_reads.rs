//! What a socket timeout costs a call that does not wait: no clock read.
//!
//! A clock read is a system call where the clocksource has no vDSO support
//! (the VM rig's hpet, Xen guests). The kernel counts `SO_RCVTIMEO` and
//! `SO_SNDTIMEO` from the call's wait; so does the C ABI
//! (`rds_sock::Deadline`), which read the clock on every receive and send
//! of a socket with a timeout before. This binary counts its threads' clock
//! reads: its own `clock_gettime` preempts libc's for every call in the
//! executable (std's `Instant::now` and `SystemTime::now` among them).

use std::cell::Cell;
use std::mem::size_of;

use libc::{c_int, socklen_t};
use rds::*;

mod calls;
use calls::{bound, errno, poll1, sa};

thread_local! {
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// Counts this thread's clock reads, then reads the clock as libc's would
/// (the system call; a test binary does not need the vDSO's speed).
///
/// # Safety
/// As `clock_gettime(2)`: `ts` valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clock_gettime(clock: libc::clockid_t, ts: *mut libc::timespec) -> c_int {
    READS.with(|r| r.set(r.get() + 1));
    // SAFETY: the caller's clock and pointer, passed on to the system call
    // libc's function makes; the caller guarantees `ts`.
    unsafe { libc::syscall(libc::SYS_clock_gettime, clock, ts) as c_int }
}

// The C ABI's poll (librds.so exports it; the rlib's module keeps it out of
// the Rust API).
unsafe extern "C" {
    fn rds_poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
}

fn reads() -> u64 {
    READS.with(Cell::get)
}

fn set_timeout(fd: c_int, name: c_int, tv_sec: libc::time_t) {
    let tv = libc::timeval { tv_sec, tv_usec: 0 };
    let tl = size_of::<libc::timeval>() as socklen_t;
    assert_eq!(rds_setsockopt(fd, libc::SOL_SOCKET, name, (&tv as *const libc::timeval).cast(), tl), 0);
}

/// This thread's clock reads in `n` sends from `a` to `to` and in the `n`
/// receives of `b` (each once `b` polls readable: the receive does not
/// wait); checks every datagram's content and order.
fn clock_reads_of_calls(a: c_int, b: c_int, to: &str, n: u32) -> (u64, u64) {
    let (dst, dl) = sa(to);
    let (mut in_send, mut in_recv) = (0, 0);
    for i in 0..n {
        let msg = i.to_be_bytes();
        let r0 = reads();
        let sent = rds_sendto(a, msg.as_ptr().cast(), msg.len(), 0, (&dst as *const libc::sockaddr_storage).cast(), dl);
        in_send += reads() - r0;
        assert_eq!(sent, 4, "send {i}: {}", errno());
        assert_ne!(poll1(b, libc::POLLIN, 5000) & libc::POLLIN, 0, "datagram {i} never showed");
        let mut buf = [0u8; 8];
        let r0 = reads();
        let got = rds_recvfrom(b, buf.as_mut_ptr().cast(), buf.len(), 0, std::ptr::null_mut(), std::ptr::null_mut());
        in_recv += reads() - r0;
        assert_eq!(got, 4, "receive {i}: {}", errno());
        assert_eq!(buf[..4], msg, "datagram {i}");
    }
    (in_send, in_recv)
}

#[test]
fn a_socket_timeout_reads_no_clock_in_a_call_that_does_not_wait() {
    // The count sees std's clock reads.
    let r0 = reads();
    let _ = std::time::Instant::now();
    assert_eq!(reads() - r0, 1, "clock_gettime is not interposed");
    let a = bound("127.0.0.1:4301");
    let b = bound("127.0.0.2:4302");
    const N: u32 = 50;
    // Warm: the first datagram sets up the pair's connection.
    clock_reads_of_calls(a, b, "127.0.0.2:4302", 2);
    let (send_plain, recv_plain) = clock_reads_of_calls(a, b, "127.0.0.2:4302", N);
    set_timeout(a, libc::SO_SNDTIMEO, 5);
    set_timeout(b, libc::SO_RCVTIMEO, 5);
    let (send_timed, recv_timed) = clock_reads_of_calls(a, b, "127.0.0.2:4302", N);
    eprintln!(
        "clock reads in {N} calls: send {send_plain} / with SO_SNDTIMEO {send_timed}, receive {recv_plain} / with SO_RCVTIMEO {recv_timed}"
    );
    // One read per call before (N more); a few incidental ones allowed.
    assert!(send_timed <= send_plain + 2, "sends read the clock for their timeout: {send_timed} against {send_plain}");
    assert!(
        recv_timed <= recv_plain + 2,
        "receives read the clock for their timeout: {recv_timed} against {recv_plain}"
    );
    // The timeout still holds for a receive that waits: its clock is read
    // when the wait starts and when its poll ends (three reads before: the
    // call's, the wait's and the poll's end).
    let t0 = std::time::Instant::now();
    set_timeout(b, libc::SO_RCVTIMEO, 1);
    let mut buf = [0u8; 8];
    let r0 = reads();
    let got = rds_recvfrom(b, buf.as_mut_ptr().cast(), buf.len(), 0, std::ptr::null_mut(), std::ptr::null_mut());
    let waited = reads() - r0;
    assert_eq!((got, errno()), (-1, libc::ETIMEDOUT));
    assert!(t0.elapsed() >= std::time::Duration::from_millis(990), "{:?}", t0.elapsed());
    assert!(waited <= 2, "a receive that timed out read the clock {waited} times");
    // So does a poll of the socket with a timeout that passes.
    let mut p = libc::pollfd { fd: b, events: libc::POLLIN, revents: 0 };
    let t0 = std::time::Instant::now();
    let r0 = reads();
    // SAFETY: one pollfd, as poll(2) takes it.
    let n = unsafe { rds_poll(&mut p, 1, 300) };
    let polled = reads() - r0;
    assert_eq!(n, 0, "nothing to read: {}", errno());
    assert!(t0.elapsed() >= std::time::Duration::from_millis(295), "{:?}", t0.elapsed());
    assert!(polled <= 2, "a poll that timed out read the clock {polled} times");
    rds_close(a);
    rds_close(b);
}
