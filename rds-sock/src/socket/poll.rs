//! Waiting for a socket to turn readable while reading its connections
//! in the waiting thread ([`rds_tcp::RxAssist`]): the blocking receive's
//! wait (`RdsSocket::wait_readable`) and [`RdsSocket::poll_with`], a
//! `poll(2)` of the socket's descriptor among a program's others.
//!
//! A program that polls its RDS descriptor and then receives without
//! blocking (rds-tools' rds-stress, an event loop on `poll`) waited for the
//! reactor to read each message and raise the descriptor: two threads
//! woken per message where a blocking receive wakes one.
//! [`RdsSocket::poll_with`] polls the connections the next message will
//! likely come on beside the caller's descriptors, as the blocking
//! receive does, and reads what arrives itself; the poll reports the
//! socket readable and the receive that follows (or a later poll, or
//! another thread) finds the message queued. The socket's descriptor is
//! raised for it only when needed: not when the receive that follows
//! takes it, which saves the descriptor's two system calls per message
//! (`engine/owed.rs`; a wait on the descriptor elsewhere sees it within
//! [`rds_tcp::ASSIST_LINGER`]). The LD_PRELOAD shim's `poll`
//! calls it through rds-capi's `rds_poll` when a program polls one RDS
//! descriptor for reading.

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use rds_tcp::RxAssist;

use super::{RdsSocket, STREAM_SKIP};
use crate::deadline::Deadline;

/// Poll sets up to this long (the caller's descriptors and the assisted
/// connections) are built on the stack: no allocation per wait.
pub(super) const POLL_STACK: usize = 16;

impl RdsSocket {
    /// The connections a wait for this socket's next message reads itself,
    /// if any: the paths of the address pair its last message came over
    /// (its lane alone once a wait learnt it), none for the
    /// [`STREAM_SKIP`] waits after one that read a stream.
    pub(super) fn assist_begin(&self) -> Option<RxAssist> {
        let skip = &self.shared.assist_skip;
        if skip.load(Relaxed) > 0 {
            skip.fetch_sub(1, Relaxed);
            return None;
        }
        let hint = *self.shared.rx_hint.lock();
        let lane = self.shared.rx_lane.load(Relaxed);
        let wide = self.shared.rx_wide.swap(false, Relaxed);
        let quiet = self.shared.sent_since_wait.swap(false, Relaxed);
        hint.and_then(|(l, f)| self.engine.inner.rx_assist(l, f, lane, wide, quiet))
    }

    /// The socket's descriptor ended a wait: when the wait had not learnt
    /// its lane, what woke it came through the reactor, perhaps on another
    /// lane, and the next wait polls every path and learns it. The lane
    /// stays (its readable events stay off the reactor while a thread
    /// waits): an answer the reactor took because it came before the wait
    /// began would otherwise leave every later one to the reactor too.
    pub(super) fn assist_woken_by_fd(&self, assist: Option<&RxAssist>) {
        if assist.is_some_and(|a| a.lane() == 0) {
            self.shared.rx_wide.store(true, Relaxed);
        }
    }

    /// Reads the assisted connections `ready` (their indexes in `a`) and
    /// delivers what they hold; whether any read delivered. Remembers the
    /// lane for the next wait, and after a read that took a one-way stream
    /// leaves the next waits to the reactor, which reads ahead while the
    /// receiver works through the queue (a socket that sends between its
    /// receives keeps reading its lane: `rds_tcp::ASSIST_LINGER`).
    pub(super) fn assist_read(&self, a: &mut RxAssist, ready: impl Iterator<Item = usize>) -> bool {
        let mut read = false;
        for i in ready {
            read |= a.read(i);
        }
        if a.lane() != 0 {
            self.shared.rx_lane.store(a.lane(), Relaxed);
        }
        if a.read_a_stream() && !a.asked_quiet() {
            self.shared.assist_skip.store(STREAM_SKIP, Relaxed);
        }
        read
    }

    /// `poll(2)` of `fds`, of which `fds[me]` is this socket's descriptor
    /// ([`std::os::fd::AsRawFd`], or a duplicate of it), for at most
    /// `timeout` (`None`: without end). When `fds[me]` asks for `POLLIN`
    /// it also polls the TCP connections the socket's next message will
    /// likely come on and reads and delivers what arrives on them in this
    /// thread, as a blocking receive does ([`RdsSocket::recv_msg_wait`]);
    /// a message it delivers to this socket is reported readable at once.
    /// Its descriptor shows it after the socket's next receive or poll, or
    /// within [`rds_tcp::ASSIST_LINGER`] (at once when the read left no
    /// lane lingering): a wait on the descriptor elsewhere (`epoll_wait`,
    /// another thread's `poll`) sees it that late, never not at all
    /// (`engine/owed.rs`). What it delivers to other sockets of the
    /// engine raises theirs.
    ///
    /// Fills in every entry's `revents` and returns how many are nonzero,
    /// 0 when the timeout passed, as `poll` does; fails with `poll`'s error
    /// (`EINTR` on a signal: never restarted). An `fds[me]` that does not
    /// ask for `POLLIN`, or an `me` out of range, makes it a plain `poll`.
    pub fn poll_with(&self, fds: &mut [libc::pollfd], me: usize, timeout: Option<Duration>) -> io::Result<usize> {
        // A timeout too long to be an instant never expires. The first
        // poll takes the whole timeout, with no second clock read.
        let (deadline, first) = Deadline::after(timeout).start_polling();
        let mut first = first.map(millis);
        let wants_in = fds.get(me).is_some_and(|p| p.events & libc::POLLIN != 0);
        if wants_in && self.shared.deferred_shows_readable() {
            return self.report_queued(fds, me);
        }
        // A socket that shows readable already (messages queued: a window
        // of answers, a stream) ends the poll at once: no connection to
        // read, and no wait, so the replies this thread holds stay held
        // for its next ones (`crate::batch`), as a blocking receive that
        // finds a message queued leaves them.
        let queued = wants_in && self.shared.fd_shows_readable();
        if !queued {
            crate::batch::release();
        }
        let inner = &self.engine.inner;
        let mut assist = if wants_in && !queued { self.assist_begin() } else { None };
        let mut set = PollSet::new();
        let r = loop {
            // An update an earlier poll (or this one's read, of a
            // writable change) left for later: the descriptor polled
            // below shows it.
            inner.settle_deferred(&self.shared, self.id);
            let ms = match first.take() {
                Some(ms) => ms,
                None => deadline.map_or(-1, |d| millis(d.saturating_duration_since(Instant::now()))),
            };
            // What its reads deliver to this socket leaves the descriptor
            // alone (`defer`): reported from here, the descriptor brought
            // up to date by the receive that follows (`engine/owed.rs`).
            let round = match self.poll_round(fds, me, &mut assist, &mut set, ms, Reads::Defer) {
                Ok(round) => round,
                Err(e) => break Err(e),
            };
            if round.ready > 0 {
                break Ok(round.ready);
            }
            if round.read && self.shared.deferred_shows_readable() {
                // Its read delivered this socket's next message: reported
                // without raising the descriptor, which stays behind until
                // the socket's next receive or poll, or the linger tick
                // that its lane's linger brings (listed before the assist
                // ends, so the tick comes after); without a linger, raised
                // now.
                self.owe_unless_settled(&mut assist);
                fds[me].revents = fds[me].events & libc::POLLIN;
                return Ok(1);
            }
            if round.read && self.shared.fd_shows_readable() {
                // The socket was readable already (the reactor's delivery
                // raced this read): reported without polling the set
                // again (as if the others' events came just after).
                fds[me].revents = fds[me].events & libc::POLLIN;
                break Ok(1);
            }
            // A read that delivered to other sockets goes around once
            // more; a poll that found nothing ends at the deadline (never
            // without one). A connection whose read took nothing was
            // handed back to the reactor: the next round polls one fewer.
            if !round.read && round.polled == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                break Ok(0);
            }
        };
        inner.settle_deferred(&self.shared, self.id);
        r
    }

    /// A poll of a socket with messages queued that a wait's read left its
    /// descriptor behind on (`SockShared::deferred`; the linger tick will
    /// raise it, `engine/owed.rs`): reports `fds[me]` readable without
    /// raising the descriptor, and the others' events as they are now
    /// (a poll with no timeout; none when `fds[me]` is all there is to
    /// ask). The replies this thread holds stay held (`crate::batch`), as
    /// for a socket whose descriptor shows it readable.
    fn report_queued(&self, fds: &mut [libc::pollfd], me: usize) -> io::Result<usize> {
        let asked = fds[me].events;
        fds[me].events &= !libc::POLLIN;
        let r = if fds.len() == 1 && fds[0].events == 0 {
            fds[0].revents = 0;
            0
        } else {
            // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) }
        };
        fds[me].events = asked;
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        fds[me].revents |= libc::POLLIN;
        Ok(fds.iter().filter(|p| p.revents != 0).count())
    }

    /// After a wait's read that delivered to this socket: when the update
    /// of the descriptor it left for later shows the socket readable (a
    /// message the wait reports, or more than the receive took), lists the
    /// socket for the linger tick and ends the assist (listed first, so
    /// that the tick its lane's linger brings comes after); without a
    /// linger, brings the descriptor up to date now (`engine/owed.rs`).
    pub(super) fn owe_unless_settled(&self, assist: &mut Option<RxAssist>) {
        if !self.shared.deferred_shows_readable() {
            return;
        }
        let inner = &self.engine.inner;
        inner.owe_fd(&self.shared, self.id);
        if !assist.take().is_some_and(RxAssist::finish) {
            inner.settle_deferred(&self.shared, self.id);
        }
    }

    /// One `poll` of `fds` and the connections `assist` holds, for `ms`
    /// milliseconds (-1: without end); reads the assisted connections it
    /// found readable. `reads`: whose the reads are ([`Reads`]). Inlined:
    /// a blocking receive's wait runs it once per message.
    #[inline(always)]
    pub(super) fn poll_round(
        &self,
        fds: &mut [libc::pollfd],
        me: usize,
        assist: &mut Option<RxAssist>,
        set: &mut PollSet,
        ms: libc::c_int,
        reads: Reads,
    ) -> io::Result<Round> {
        let mine = fds.len();
        let (all, idx) = set.build(fds, assist.as_ref());
        if fds.get(me).is_some_and(|p| p.events & libc::POLLIN != 0) {
            self.shared.settle_fd();
        }
        // SAFETY: `all` is a valid array of `all.len()` pollfds.
        let r = unsafe { libc::poll(all.as_mut_ptr(), all.len() as libc::nfds_t, ms) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut round = Round { polled: r as usize, ready: 0, read: false };
        for (p, a) in fds.iter_mut().zip(all.iter()) {
            p.revents = a.revents;
            round.ready += usize::from(a.revents != 0);
        }
        if round.ready > 0 {
            if fds.get(me).is_some_and(|p| p.revents & libc::POLLIN != 0) {
                self.assist_woken_by_fd(assist.as_ref());
            }
            return Ok(round);
        }
        if let Some(a) = assist {
            let by = &self.shared.assist_by;
            let mark = match reads {
                Reads::Defer => crate::engine::assist_mark(false),
                Reads::Take => crate::engine::assist_mark(true),
            };
            by.store(mark, std::sync::atomic::Ordering::SeqCst);
            let hit = all[mine..].iter().zip(&idx[mine..]).filter(|(p, _)| p.revents != 0).map(|(_, &i)| i);
            round.read = self.assist_read(a, hit);
            by.store(0, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(round)
    }
}

/// Whose reads a [`RdsSocket::poll_round`] makes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Reads {
    /// A poll's ([`RdsSocket::poll_with`]) or a blocking receive's that
    /// peeks: a wake-up they cause for this socket leaves its descriptor
    /// alone (`SockShared::assist_by`, `deferred`); the receive brings it
    /// up to date after, the poll when its read did not deliver this
    /// socket's next message, else the socket's next receive, poll or
    /// linger tick (`engine/owed.rs`).
    Defer,
    /// A blocking receive's that takes its message: the wake-up that
    /// delivers it takes it for the receive under the same node lock
    /// (`SockShared::taken`) and brings the descriptor up to date.
    Take,
}

/// What one [`RdsSocket::poll_round`] found.
pub(super) struct Round {
    /// `poll`'s count: entries with events, the caller's and the assisted
    /// connections'.
    pub(super) polled: usize,
    /// The caller's entries with events.
    pub(super) ready: usize,
    /// Reads of assisted connections delivered messages.
    pub(super) read: bool,
}

/// A wait's poll set: the caller's descriptors, then the assisted
/// connections (`idx`: their index in the assist), on the stack up to
/// [`POLL_STACK`] (a lane, or every path of a pair of up to 15, beside one
/// descriptor), else in vectors kept for the wait's rounds.
pub(super) struct PollSet {
    stack_fds: [libc::pollfd; POLL_STACK],
    stack_idx: [usize; POLL_STACK],
    heap_fds: Vec<libc::pollfd>,
    heap_idx: Vec<usize>,
}

const NO_FD: libc::pollfd = libc::pollfd { fd: -1, events: 0, revents: 0 };

impl PollSet {
    pub(super) fn new() -> PollSet {
        PollSet {
            stack_fds: [NO_FD; POLL_STACK],
            stack_idx: [0; POLL_STACK],
            heap_fds: Vec::new(),
            heap_idx: Vec::new(),
        }
    }

    /// The set for one round: `fds` (events asked, no revents), then the
    /// connections `assist` still polls, for reading.
    #[inline(always)]
    fn build(&mut self, fds: &[libc::pollfd], assist: Option<&RxAssist>) -> (&mut [libc::pollfd], &mut [usize]) {
        let mine = fds.len();
        let n = mine + assist.map_or(0, |a| a.fds().count());
        let (all, idx): (&mut [libc::pollfd], &mut [usize]) = if n <= POLL_STACK {
            (&mut self.stack_fds[..n], &mut self.stack_idx[..n])
        } else {
            self.heap_fds.resize(n, NO_FD);
            self.heap_idx.resize(n, 0);
            (&mut self.heap_fds[..], &mut self.heap_idx[..])
        };
        for (a, p) in all.iter_mut().zip(fds) {
            *a = libc::pollfd { revents: 0, ..*p };
        }
        if let Some(a) = assist {
            for (k, (i, afd)) in a.fds().enumerate().take(n - mine) {
                all[mine + k] = libc::pollfd { fd: afd, events: libc::POLLIN, revents: 0 };
                idx[mine + k] = i;
            }
        }
        (all, idx)
    }
}

/// `left` as `poll`'s timeout: milliseconds rounded up (never a busy loop
/// of zero timeouts before a deadline), at most `i32::MAX`.
pub(super) fn millis(left: Duration) -> libc::c_int {
    left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int
}
