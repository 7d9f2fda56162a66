//! The reactor's shared timer ([`TimerShared`]): one `timerfd` per reactor,
//! armed by the reactor and by transmitting threads (ack polling, the end
//! of a write-coalescing window), only ever moved earlier; deadlines
//! [`COARSE`] away or more are left to epoll's own timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::path_conn::PathConn;

/// The reactor's timer, shared so that a transmitting thread can start ack
/// polling without waking the reactor.
pub(super) struct TimerShared {
    pub fd: Option<crate::sys::TimerFd>,
    /// When the timerfd fires, if armed.
    pub at: Option<Instant>,
    /// Connections that started awaiting acks, not yet seen by the reactor.
    pub watch_in: Vec<Arc<PathConn>>,
    /// Connections to flush at the end of their coalescing window.
    pub flush_in: Vec<(Instant, Arc<PathConn>)>,
    /// Connections a receiving thread left lingering (`crate::assist`),
    /// not yet seen by the reactor. As every deadline here, a linger's end
    /// only ever moves the timer earlier: a renewal of one linger never
    /// postpones the end of another (which would then never come while
    /// the first is renewed); a renewed linger wakes the reactor once per
    /// [`crate::ASSIST_LINGER`] at most.
    pub linger_in: Vec<Arc<PathConn>>,
}

impl TimerShared {
    /// Unarmed, with nothing listed; `fd` `None` where no timerfd could be
    /// made (every deadline is then epoll's timeout).
    pub fn new(fd: Option<crate::sys::TimerFd>) -> TimerShared {
        TimerShared { fd, at: None, watch_in: Vec::new(), flush_in: Vec::new(), linger_in: Vec::new() }
    }

    /// Makes the timerfd fire at `at` or earlier. An armed timer is only
    /// ever moved earlier, never later: a deadline that went away (the
    /// acks it was for came with an event) costs at most one early
    /// wake-up, where moving it each time costs a `timerfd_settime` per
    /// message. False without a timerfd or when arming failed.
    pub fn arm_at(&mut self, at: Instant, now: Instant) -> bool {
        match &mut self.fd {
            Some(fd) => {
                if self.at.is_none_or(|x| at < x) {
                    if fd.arm(at.saturating_duration_since(now)).is_err() {
                        return false;
                    }
                    self.at = Some(at);
                }
                true
            }
            None => false,
        }
    }
}

/// Deadlines at least this far away are left to epoll's timeout (whole
/// milliseconds, rounded up by mio) instead of the timerfd: the stall
/// sweep, drains, accept retries and deferred connections need no finer
/// resolution, and they then cost no `timerfd_settime`.
pub(super) const COARSE: Duration = Duration::from_millis(2);

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared timer is moved earlier, never later: a deadline that
    /// went away costs one early wake-up, not a `timerfd_settime` per
    /// message; and it fires at the earliest deadline asked for.
    #[test]
    fn timer_only_moves_earlier() {
        let mut t = TimerShared::new(crate::sys::TimerFd::new().ok());
        assert!(t.fd.is_some(), "timerfd available");
        let now = Instant::now();
        let (near, mid, far) =
            (now + Duration::from_millis(100), now + Duration::from_secs(2), now + Duration::from_secs(5));
        assert!(t.arm_at(mid, now));
        assert_eq!(t.at, Some(mid));
        assert!(t.arm_at(far, now), "a later deadline is covered by the armed one");
        assert_eq!(t.at, Some(mid), "not moved later");
        assert!(t.arm_at(near, now));
        assert_eq!(t.at, Some(near), "moved earlier");
        // It fires at the earliest deadline (100 ms), long before the
        // middle one (2 s).
        let fd = t.fd.as_mut().unwrap();
        assert!(!fd.clear(), "not fired yet");
        std::thread::sleep(Duration::from_millis(400));
        assert!(fd.clear(), "fired at the earliest deadline");
    }
}
