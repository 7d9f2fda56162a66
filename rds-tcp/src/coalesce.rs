//! Write coalescing of one-way streams: when an application thread's send
//! leaves its message queued for the next write instead of writing it now
//! ([`Inner::hold_until`]), and how long that window is on this machine
//! ([`WriteCost`]).
//!
//! A run of [`COALESCE_RUN`] sends on a connection, each within the window
//! of the one before and with no readable event on the connection's
//! reactor in between (a one-way stream), or such a run of the sending
//! thread's on any connections ([`THREAD_RUN`]: a thread streaming to
//! many peers in turn), makes a send that finds the connection written
//! less than a window ago leave its message queued;
//! the next send after the window, or the reactor through its timer at the
//! window's end, writes everything queued at once (`tcp_tx_coalesced`
//! counts those sends). A message sent after a pause, a reply, and
//! request/response traffic go out immediately.
//!
//! A send that comes later than the window but within [`RUN_KEEP`]
//! windows of the one before (and with no readable event in between)
//! writes at once, as any send after the window does, but leaves the run
//! as it was instead of ending it ([`run_after`]): a stream whose sending
//! thread is now and then held up (preempted, or a write that took long,
//! such as one whose receiver's TCP processing ran in its system call, as
//! on a local link) is still a stream, and its next sends within the
//! window are coalesced again at once instead of after another
//! [`COALESCE_RUN`] writes of one message each. When every such hold-up
//! ended the run, a one-way stream of 8 KiB messages on the host loopback
//! (`rds-scale peers`: one sending thread, 64 messages to a peer before the
//! next) started a new run every 12 to 30 sends and wrote most of its
//! messages one `sendmsg` each. With 256 peers in turn (a visit of 64
//! messages each, every visit a pause of its connection's run), the
//! thread's run took the share of that thread's sends left to a batched
//! write from 53-68% to 71-84% and its CPU time per message from 3.7-3.9
//! to 3.2-3.4 µs (host, 2 alternating runs of 3 rounds, 2026-11-29; 7.9
//! against 9.5-10.4 µs in a run on a busier machine).
//!
//! # The window
//!
//! What a coalesced message saves is one transmit: a pull from the core
//! and a `sendmsg`, whose cost depends on the machine far more than the
//! rest of a send does (under emulation, as in the VM rig, a system call
//! and everything else cost ten to fifty times what they cost on the
//! host). A fixed window that fits the host (20 µs) never holds a message
//! where every send takes longer than that, so the stream that would gain
//! most pays a transmit per message. The window is therefore
//! [`TcpConfig::coalesce`] or [`COST_FACTOR`] times what a transmit of one
//! small message was measured to cost on this connection, whichever is
//! longer, up to [`TcpConfig::coalesce_max`]:
//! - one in [`SAMPLE_EVERY`] transmits of at most two messages is timed
//!   (one more clock read), from the send's clock read to the end of its
//!   write, and kept as a moving average;
//! - only transmits whose messages average at most [`SMALL_MSG`] bytes
//!   stretch the window that much: holding larger messages back for a
//!   window left the receiver idle (qperf `rds_bw`, 8 KiB, VM rig: 15% less
//!   with a 300 µs window than with 20 µs, where 64 B gained 2.5x and 1 KiB
//!   1.1-1.8x); those up to [`MID_MSG`] are written in batches instead
//!   (below), larger ones pay their copy per byte, not per call, and keep
//!   the window at its floor;
//! - a coalesced stream writes many messages per transmit, which are not
//!   timed, so the window does not feed on itself.
//!
//! # Batches of mid-size messages
//!
//! A stream of messages of 2 to 8 KiB (more than [`SMALL_MSG`], at most
//! [`MID_MSG`]) where one transmit was measured to cost at least the
//! window's floor ([`TcpConfig::coalesce`]; on the host it costs a few µs
//! and nothing changes there) is written in batches of about [`MID_BATCH`]
//! bytes: a send of the run leaves its message queued until the
//! connection holds a batch's worth, and the send that completes it writes
//! them all in its own thread (`PathConn::held` counts the sends held since
//! the last write; `tcp_tx_batch_full` counts the sends that wrote a
//! batch). The window, [`MID_COST_FACTOR`] times the transmit's cost,
//! bounds the wait: a send later than that after the one before writes
//! what is held at once (a pause is not a stream), and the reactor writes
//! a batch a window after its first message if no send completed it
//! (`PathConn::flush_due`: a timer armed for an earlier batch waits for
//! it). Holding by count rather than by time keeps the receiver fed (the
//! time window above had idled it), while a `sendmsg` of 64 KiB costs the
//! sending thread one call and one TCP segment (on a local link: one pass
//! of the receiver's TCP processing in that call, one ack back) where eight
//! of 8 KiB cost eight. qperf `rds_bw` in the VM rig, alternating rounds of
//! one boot (the kernel's RDS-TCP 45-49 and 28-29 MB/s): 8 KiB 50-60 ->
//! 66-77 MB/s, 4 KiB 30-39 -> 51-65; 1 KiB, 16 KiB, 64 KiB and `rds_lat`
//! unchanged. Batches of 32 KiB did less (8 KiB 57-67, 4 KiB 53-56 where
//! 64 KiB gave 67-98 and 57-67 in that boot), and messages of 16 KiB lost
//! by it (89-109 -> 78-93 MB/s), so they are left out.
//!
//! # Handing a stream's writes to the reactor
//!
//! Where the last sampled transmit carried messages of at most
//! [`HANDOFF_MSG`] bytes, a send of a stream (the run above) that comes
//! after the window's end does not write either: it leaves its message
//! queued and has the reactor flush at once (its timer;
//! `tcp_tx_handed_off` counts those sends). Every write of such a stream
//! is then the reactor's, in its thread, and the
//! application's thread only queues: its `sendmsg` (and, on a local link,
//! the receiving side's TCP processing, which runs in the sending
//! thread's system call) was most of what a small message cost it, and
//! the sending thread was the stream's bottleneck (qperf `rds_bw` of 64 B
//! in the VM rig: the sending qperf thread at 100% of a vCPU; with the
//! writes in the reactor, medians of 4 alternating rounds, 48 -> 66 k
//! messages/s). Larger messages keep writing in the caller's thread when
//! the window is over, and request/response traffic never reaches the run.
//! [`TcpConfig::stream_handoff`] turns it off.
//!
//! [`TcpConfig::coalesce`]: crate::TcpConfig::coalesce
//! [`TcpConfig::coalesce_max`]: crate::TcpConfig::coalesce_max
//! [`TcpConfig::stream_handoff`]: crate::TcpConfig::stream_handoff

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::Inner;
use crate::path_conn::{self, PathConn};
use crate::stats::inc;

/// Sends in a row on a connection, each within the coalescing window of
/// the one before and with no readable event on the connection's reactor
/// in between, from which a send inside the window is left to the
/// window's flush. Request/response traffic (a reply between two sends)
/// and up to 16 messages in flight (their acks come back between sends)
/// are written at once: waiting for the window added it to every round
/// trip (`rds-stress -d 1` on loopback: 3x the round trip), and with 16 in
/// flight it cost more message rate than the saved `writev` calls brought
/// (`-d 16`). A one-way stream (`rds-gen`) reaches it at once, and one
/// `writev` per window instead of one per message is what its bandwidth
/// gains.
pub(crate) const COALESCE_RUN: u32 = 16;

/// A send later than the window but within this many windows of the
/// send before keeps the run it continues (module docs, [`run_after`]);
/// a longer pause ends it.
pub(crate) const RUN_KEEP: u64 = 8;

/// The run of stream-like sends that a send continues (module docs):
/// `run` the run before it, `quiet` whether no readable event came since
/// the send before, `gap` the time since that send and `window` the
/// coalescing window (nanoseconds). One more within the window, the same
/// within [`RUN_KEEP`] windows, otherwise 0 (a pause, or a reply).
pub(crate) fn run_after(run: u32, quiet: bool, gap: u64, window: u64) -> u32 {
    match quiet {
        true if gap < window => run.saturating_add(1),
        true if gap < window.saturating_mul(RUN_KEEP) => run,
        _ => 0,
    }
}

thread_local! {
    /// The calling thread's run of stream-like sends on any connection
    /// ([`run_after`], each send against the thread's send before it,
    /// whatever its connection) and its last send's clock read: a thread
    /// that streams to many peers in turn (a visit of a few dozen messages
    /// each) is a stream on each connection it comes back to, which the
    /// connection's own run, ended by the pause between two visits, would
    /// learn again at every visit ([`COALESCE_RUN`] writes of one message
    /// each first). A visit's first send still writes at once (its
    /// connection was not written within the window), so a thread that
    /// sends one message to each of many peers holds none back.
    static THREAD_RUN: std::cell::Cell<(u32, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The window is this many times the measured cost of a transmit (8 did
/// no better in the VM rig: qperf `rds_bw`, 64 B and 1 KiB, 3 rounds
/// alternating in one boot).
pub(crate) const COST_FACTOR: u64 = 4;

/// Messages averaging at most this many bytes (header included) leave
/// their stream's writes to the reactor after the window's end (module
/// docs).
pub(crate) const HANDOFF_MSG: u64 = 512;

/// One in this many transmits of at most two messages is timed.
pub(crate) const SAMPLE_EVERY: u32 = 8;

/// Messages averaging at most this many bytes (header included) stretch
/// the window to [`COST_FACTOR`] times their transmit's cost.
pub(crate) const SMALL_MSG: u64 = 2048 + rds_core::wire::HEADER_LEN as u64;

/// Messages averaging more than [`SMALL_MSG`] bytes and at most this many
/// (header included) are written in batches (module docs, "Batches of
/// mid-size messages"); larger ones do not stretch the window.
pub(crate) const MID_MSG: u64 = (8 << 10) + rds_core::wire::HEADER_LEN as u64;

/// The window of a stream of mid-size messages is this many times the
/// measured cost of a transmit (of one or two of them): the gap between
/// two of its sends that each write is about one transmit and a copy, so
/// the run of [`run_after`] grows within it.
pub(crate) const MID_COST_FACTOR: u64 = 2;

/// A mid-size stream's write carries about this many bytes of messages:
/// the largest TCP segment Linux builds (GSO).
pub(crate) const MID_BATCH: u64 = 64 << 10;

/// The measured cost of one transmit on a connection (see the module
/// docs): a moving average of sampled transmits of small or mid-size
/// messages. A transmit that carries a congestion map is not sampled
/// (`TxState::queued_has_map`): its 8 KiB said nothing of the stream's
/// messages, and classed a stream of 16 KiB ones as mid-size until the
/// next sample (1 in 8 transmits of one or two messages), which held a
/// batch or two of them.
#[derive(Default)]
pub(crate) struct WriteCost {
    /// Nanoseconds, the average of the samples (an eighth of each new one
    /// against the rest); 0 before the first, and after a sample of large
    /// messages.
    avg_ns: AtomicU64,
    /// Bytes per message (header included) of the last sample, which the
    /// window's factor ([`factor_of`]), the batch and [`WriteCost::tiny`]
    /// follow; 0 before the first.
    each: AtomicU64,
    /// Transmits of at most two messages since the last sample.
    count: AtomicU32,
}

/// The window's factor of a transmit's cost for messages of `each` bytes
/// (header included): [`COST_FACTOR`] for small ones, [`MID_COST_FACTOR`]
/// for mid-size ones, 0 (the window stays at its floor) for larger ones
/// and before any sample (`each` 0).
fn factor_of(each: u64) -> u64 {
    if each == 0 {
        0
    } else if each <= SMALL_MSG {
        COST_FACTOR
    } else if each <= MID_MSG {
        MID_COST_FACTOR
    } else {
        0
    }
}

impl WriteCost {
    /// A transmit of `msgs` messages (`bytes` on the wire) is about to be
    /// written: whether to time it. `carries_map` (asked only of a
    /// transmit of one or two messages): one of them is a congestion map,
    /// which is not sampled (the struct's docs).
    pub fn sample_due(&self, msgs: usize, carries_map: impl FnOnce() -> bool) -> bool {
        (1..=2).contains(&msgs) && !carries_map() && self.count.fetch_add(1, Relaxed) % SAMPLE_EVERY == 0
    }

    /// A timed transmit of `msgs` messages and `bytes` took `ns`.
    pub fn record(&self, ns: u64, msgs: usize, bytes: u64) {
        let each = bytes.checked_div(msgs as u64).unwrap_or(u64::MAX).max(1);
        let factor = factor_of(each);
        // Samples of another size class start the average afresh.
        let old = match factor_of(self.each.swap(each, Relaxed)) {
            f if f == factor => self.avg_ns.load(Relaxed),
            _ => 0,
        };
        if factor == 0 {
            self.avg_ns.store(0, Relaxed);
            return;
        }
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.avg_ns.store(new.max(1), Relaxed);
    }

    /// The messages a write of a mid-size stream carries: 0 when the last
    /// sample was not of mid-size messages, or its transmits cost less
    /// than `floor` nanoseconds (the window's floor).
    pub fn batch(&self, floor: u64) -> u32 {
        let each = self.each.load(Relaxed);
        if factor_of(each) != MID_COST_FACTOR || self.avg_ns.load(Relaxed) < floor {
            return 0;
        }
        MID_BATCH.div_ceil(each).max(2) as u32
    }

    /// Whether the last sampled transmit carried messages of at most
    /// [`HANDOFF_MSG`] bytes each on average.
    pub fn tiny(&self) -> bool {
        (1..=HANDOFF_MSG).contains(&self.each.load(Relaxed))
    }

    /// The window in nanoseconds: at least `floor`, at most `cap` (unless
    /// `floor` is more).
    pub fn window(&self, floor: u64, cap: u64) -> u64 {
        let stretched = self.avg_ns.load(Relaxed).saturating_mul(factor_of(self.each.load(Relaxed)));
        floor.max(stretched.min(cap))
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Inner {
    /// Called by an application thread's send at `now` (its clock read):
    /// whether the message stays queued for the window's flush (counted
    /// in `tcp_tx_coalesced`; the reactor's timer flushes at the window's
    /// end unless a flush is pending already) instead of being written
    /// now, and until when; the caller arms the flush with [`Inner::hold`].
    /// Atomics only: a send makes it under the core's lock
    /// (`crate::TcpTransport::claim_xmit`).
    pub(crate) fn hold_until(&self, conn: &std::sync::Arc<PathConn>, now: u64) -> Option<u64> {
        let window = conn.write_cost.window(nanos(self.cfg.coalesce), nanos(self.cfg.coalesce_max));
        let prev = conn.last_send.swap(now, SeqCst);
        let last_rx = self.reactors[conn.reactor].last_rx.load(SeqCst);
        let gap = now.saturating_sub(prev);
        // Threads sending on one connection at once may lose each other's
        // step of the run here: it only decides when to batch writes.
        let run = run_after(conn.send_run.load(SeqCst), last_rx < prev, gap, window);
        conn.send_run.store(run, SeqCst);
        let thread_run = THREAD_RUN
            .try_with(|t| {
                let (run, prev) = t.get();
                let run = run_after(run, last_rx < prev, now.saturating_sub(prev), window);
                t.set((run, now));
                run
            })
            .unwrap_or(0);
        if run.max(thread_run) < COALESCE_RUN {
            return None;
        }
        let batch = conn.write_cost.batch(nanos(self.cfg.coalesce));
        if batch > 0 {
            // A mid-size stream (module docs, "Batches of mid-size
            // messages"): the send that completes a batch writes it, as
            // does one later than the window after the send before; the
            // reactor writes what is held a window after the batch began,
            // if no send did.
            if gap >= window {
                return None;
            }
            let held = conn.held.fetch_add(1, SeqCst);
            if held + 1 >= batch {
                // (Beyond the batch when its write could not go out: the
                // socket is full, and the reactor writes when it drains.)
                if held + 1 == batch {
                    inc(&self.stats.tx_batch_full);
                }
                return None;
            }
            let due = now.saturating_add(window);
            if held == 0 {
                // A flush pending for the batch before waits for this one.
                conn.flush_due.store(due, SeqCst);
            }
            return Some(due);
        }
        let due = conn.last_write.load(SeqCst).saturating_add(window);
        if now >= due {
            // The window is over. A stream of small messages leaves the
            // write to the reactor all the same (module docs, "Handing a
            // stream's writes to the reactor"), unless this send came
            // after a hold-up (later than the window: it writes at once,
            // as it would have if that had ended the run); any other
            // writes now.
            if !(self.cfg.stream_handoff && conn.write_cost.tiny() && gap < window) {
                return None;
            }
            inc(&self.stats.tx_handed_off);
        }
        // Written moments ago, in a run of sends each moments after the
        // one before (a stream): let this window's messages go out
        // together; the reactor flushes at the window's end (at once when
        // it is over).
        Some(due.max(now))
    }

    /// A send at `now` leaves its message queued (`tcp_tx_coalesced`): the
    /// reactor writes what is queued at `at` unless a flush is pending
    /// already (`PathConn::flush_due` says when that one is for).
    pub(crate) fn hold(&self, conn: &std::sync::Arc<PathConn>, at: u64, now: u64) {
        inc(&self.stats.tx_coalesced);
        if !conn.flush_pending.swap(true, SeqCst) {
            conn.flush_due.store(at, SeqCst);
            self.reactors[conn.reactor].flush_at(conn.clone(), path_conn::instant_of(at), path_conn::instant_of(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_small_transmits_within_its_bounds() {
        let c = WriteCost::default();
        assert_eq!(c.window(20_000, 500_000), 20_000, "nothing measured: the floor");
        c.record(60_000, 1, 112);
        assert_eq!(c.window(20_000, 500_000), 240_000);
        c.record(2_000, 1, 112);
        // 60_000 - 7_500 + 250
        assert_eq!(c.window(20_000, 500_000), 4 * 52_750);
        c.record(1_000_000, 1, 112);
        assert_eq!(c.window(20_000, 500_000), 500_000, "capped");
        assert_eq!(c.window(900_000, 500_000), 900_000, "a floor above the cap wins");
        c.record(60_000, 1, 16384 + 48);
        assert_eq!(c.window(20_000, 500_000), 20_000, "large messages: back to the floor");
        c.record(3_000, 2, 2 * 1072);
        assert_eq!(c.window(20_000, 500_000), 20_000, "4 x 3 us is below the floor");
    }

    /// Mid-size messages: a window of twice their transmit's cost and
    /// batches of 64 KiB, where a transmit costs at least the floor; a
    /// sample of another size class starts the average afresh.
    #[test]
    fn mid_size_messages_are_batched_where_a_transmit_costs_the_floor() {
        let c = WriteCost::default();
        assert_eq!(c.batch(20_000), 0, "nothing measured");
        c.record(100_000, 1, 8192 + 48);
        assert_eq!(c.window(20_000, 500_000), 200_000);
        assert_eq!(c.batch(20_000), 8, "65,536 / 8,240, rounded up");
        assert_eq!(c.batch(100_001), 0, "a transmit cheaper than the floor");
        c.record(60_000, 2, 2 * (4096 + 48));
        // 100_000 - 12_500 + 7_500
        assert_eq!(c.window(20_000, 500_000), 2 * 95_000);
        assert_eq!(c.batch(20_000), 16);
        c.record(60_000, 1, 2048 + 49);
        // 95_000 - 11_875 + 7_500; 65,536 / 2,097 rounded up.
        assert_eq!((c.window(20_000, 500_000), c.batch(20_000)), (2 * 90_625, 32), "2 KiB + 1 is mid-size");
        c.record(60_000, 1, 8192 + 49);
        assert_eq!((c.window(20_000, 500_000), c.batch(20_000)), (20_000, 0), "larger: the floor, no batch");
        c.record(60_000, 1, 1024 + 48);
        assert_eq!((c.window(20_000, 500_000), c.batch(20_000)), (240_000, 0), "small: stretched, no batch");
        c.record(2_000, 1, 8192 + 48);
        assert_eq!((c.window(20_000, 500_000), c.batch(20_000)), (20_000, 0), "afresh: 2 x 2 us, below the floor");
        c.record(100_000, 0, 0);
        assert_eq!((c.window(20_000, 500_000), c.batch(1)), (20_000, 0), "no message");
    }

    /// The run grows by one send within the window, survives a send
    /// held up for less than `RUN_KEEP` windows, and ends at a longer
    /// pause or at a readable event, whatever its length.
    #[test]
    fn a_run_survives_a_hold_up_not_a_pause_or_a_reply() {
        let w = 20_000;
        assert_eq!(run_after(0, true, 5_000, w), 1);
        assert_eq!(run_after(16, true, w - 1, w), 17);
        assert_eq!(run_after(16, true, w, w), 16, "held up: kept, not grown");
        assert_eq!(run_after(16, true, RUN_KEEP * w - 1, w), 16);
        assert_eq!(run_after(16, true, RUN_KEEP * w, w), 0, "a pause ends it");
        assert_eq!(run_after(16, false, 1_000, w), 0, "a reply ends it");
        assert_eq!(run_after(u32::MAX, true, 1, w), u32::MAX);
        assert_eq!(run_after(5, true, u64::MAX - 1, u64::MAX / 2), 5, "no overflow");
        assert_eq!(run_after(5, true, 1, 0), 0, "no window: no run");
    }

    #[test]
    fn one_in_eight_transmits_of_one_or_two_messages_is_timed() {
        let c = WriteCost::default();
        assert!(!c.sample_due(0, || false));
        assert!(!c.sample_due(3, || panic!("asked of a batch")), "a batch is never timed");
        assert!(!c.sample_due(1, || true), "a congestion map is never timed");
        let due: Vec<bool> = (0..16).map(|_| c.sample_due(1, || false)).collect();
        assert_eq!(due.iter().filter(|d| **d).count(), 2);
        assert!(due[0] && due[8]);
    }
}
