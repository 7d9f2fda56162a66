//! When a blocking call gives up: [`Deadline`].
//!
//! A timeout (`SO_RCVTIMEO`, `SO_SNDTIMEO`) starts when the call first has
//! to wait, as the kernel's does (`rds_recvmsg` and `rds_sendmsg` count
//! their `sock_rcvtimeo`/`sock_sndtimeo` in jiffies from their wait), and
//! the clock is read only then: a receive that finds a message queued, or
//! a send with room, reads no clock. A clock read is a system call where
//! the clocksource has no vDSO support (the VM rig's hpet; Xen guests), and
//! a program that sets a receive timeout made one per receive before: with
//! 16 messages in flight, about one per message and side (rds-window in the
//! rig, 2026-11-30), where its wait was needed about one receive in twelve.

use std::time::{Duration, Instant};

/// When a blocking send or receive gives up (`ETIMEDOUT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// Never: the call waits until it can complete (or a signal or the
    /// engine's end interrupts it).
    Never,
    /// At this instant. One already past still lets the call take what is
    /// there without waiting.
    At(Instant),
    /// This long after the call first waits (a socket's timeout). The clock
    /// is read when the wait starts; a call that does not wait reads none.
    After(Duration),
}

impl Deadline {
    /// A socket timeout as a deadline: `None` never expires.
    pub fn after(timeout: Option<Duration>) -> Deadline {
        timeout.map_or(Deadline::Never, Deadline::After)
    }

    /// Whether it never expires.
    pub fn is_never(&self) -> bool {
        *self == Deadline::Never
    }

    /// The instant it expires at, starting a timeout's count now if it
    /// had not started: call it when the call is about to wait. `None`:
    /// never (also for a timeout too long to be an instant).
    pub(crate) fn start(&mut self) -> Option<Instant> {
        if let Deadline::After(t) = *self {
            *self = Instant::now().checked_add(t).map_or(Deadline::Never, Deadline::At);
        }
        match *self {
            Deadline::At(at) => Some(at),
            _ => None,
        }
    }

    /// [`Deadline::start`] for a wait that polls, and the length of its
    /// first poll when a timeout starts now: the whole timeout, with no
    /// second clock read (`None`: the first poll computes its length from
    /// the instant, or polls without end).
    pub(crate) fn start_polling(&mut self) -> (Option<Instant>, Option<Duration>) {
        let first = match *self {
            Deadline::After(t) => Some(t),
            _ => None,
        };
        let at = self.start();
        (at, first.filter(|_| at.is_some()))
    }
}

impl From<Option<Instant>> for Deadline {
    /// `None`: never.
    fn from(at: Option<Instant>) -> Deadline {
        at.map_or(Deadline::Never, Deadline::At)
    }
}

impl From<Instant> for Deadline {
    fn from(at: Instant) -> Deadline {
        Deadline::At(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_starts_when_the_wait_does_and_then_stays() {
        let mut d = Deadline::after(Some(Duration::from_millis(300)));
        assert_eq!(d, Deadline::After(Duration::from_millis(300)));
        std::thread::sleep(Duration::from_millis(50));
        let before = Instant::now();
        let at = d.start().unwrap();
        assert!(at >= before + Duration::from_millis(300), "counted from before the wait");
        assert!(at <= Instant::now() + Duration::from_millis(300));
        assert_eq!(d, Deadline::At(at));
        // Started once: the next wait of the same call keeps it.
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(d.start(), Some(at));
    }

    #[test]
    fn a_wait_that_polls_first_polls_for_the_whole_timeout_it_starts() {
        let t = Duration::from_millis(300);
        let before = Instant::now();
        let (at, first) = Deadline::After(t).start_polling();
        assert!(at.unwrap() >= before + t);
        assert_eq!(first, Some(t));
        // An instant, never, and a timeout too long for an instant: no
        // first length of its own.
        let at = Instant::now();
        assert_eq!(Deadline::At(at).start_polling(), (Some(at), None));
        assert_eq!(Deadline::Never.start_polling(), (None, None));
        assert_eq!(Deadline::After(Duration::MAX).start_polling(), (None, None));
    }

    #[test]
    fn never_and_an_instant_and_a_timeout_too_long_for_one() {
        let mut n = Deadline::after(None);
        assert!(n.is_never());
        assert_eq!(n.start(), None);
        let at = Instant::now();
        let mut d = Deadline::from(Some(at));
        assert_eq!(d.start(), Some(at));
        assert_eq!(Deadline::from(None), Deadline::Never);
        let mut huge = Deadline::After(Duration::MAX);
        assert_eq!(huge.start(), None);
        assert!(huge.is_never());
    }
}
