//! The transport's counters, under the kernel's names
//! (`rds_tcp_statistics`), as `RdsTransport::counters` reports them.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Counters under the kernel's names (`rds_tcp_statistics`).
#[derive(Default)]
pub(crate) struct Stats {
    /// Readable events handled (`sk_data_ready`).
    pub data_ready_calls: AtomicU64,
    /// Times the peer's TCP was seen to have acked more bytes
    /// (`sk_write_space`, where the kernel processes acks).
    pub write_space_calls: AtomicU64,
    /// Writes that found the socket's send buffer full.
    pub sndbuf_full: AtomicU64,
    /// An accepted connection took over a path whose own connect was in
    /// progress.
    pub connect_raced: AtomicU64,
    /// Accepted connections reset because the core did not take them.
    pub listen_closed_stale: AtomicU64,
    /// Connections that ended in the middle of a received message.
    pub rx_partial_discarded: AtomicU64,
    /// Connections that ended in the middle of a message being written.
    pub tx_partial: AtomicU64,
    /// Connections the core closed before the peer evidently took them,
    /// up on our side: reset, not drained (`PathInfo::taken`).
    pub reset_untaken: AtomicU64,
    /// Read passes made by application threads blocked in a receive
    /// (`crate::assist`), and readable events the reactor left to them.
    pub rx_assist_reads: AtomicU64,
    pub rx_assist_left: AtomicU64,
    /// Ack polls an application thread's read left to the reactor's ack
    /// timer (fewer than `ASSIST_ACK_LAZY_BYTES` awaiting acks; ours).
    pub rx_assist_acks_left: AtomicU64,
    /// Waits of application threads that took their lane's readable
    /// events off the reactor while they assisted (`quiet`, asked by a
    /// caller whose socket sent since its previous wait; ours).
    pub rx_assist_quiet: AtomicU64,
    /// Lingers the reactor ended: a receiving thread that read its
    /// answers on its lane left it off the reactor's registration after
    /// its wait and did not come back to wait within
    /// [`crate::ASSIST_LINGER`] (`crate::assist`; ours).
    pub rx_linger_expired: AtomicU64,
    /// Connections reset because a partly received message made no
    /// progress for [`crate::TcpConfig::rx_frame_timeout`].
    pub rx_frame_stalled: AtomicU64,
    /// Reads skipped because the core paused the path (receive flow
    /// control, [`RdsTransport::rx_flow`](rds_core::RdsTransport::rx_flow)).
    pub rx_paused: AtomicU64,
    /// Offers of an accepted connection the core deferred
    /// ([`rds_core::Accept::Defer`]): the first and every later one.
    pub accept_deferred: AtomicU64,
    /// Deferred connections reset because they waited `defer_max`.
    pub deferred_expired: AtomicU64,
    /// Deferred connections reset to make room for a newer one of the
    /// same peer (`defer_per_peer`).
    pub deferred_replaced: AtomicU64,
    /// `accept` failed for lack of descriptors (EMFILE/ENFILE) or memory.
    pub accept_no_resources: AtomicU64,
    /// Connections accepted and closed at once with the reserve descriptor
    /// while the process was out of descriptors.
    pub accept_shed: AtomicU64,
    /// Read passes ended by a short read (fewer bytes than offered: the
    /// socket was drained) instead of a read that returns `EAGAIN` (ours;
    /// see the `read` module of the reactor).
    pub rx_short_reads: AtomicU64,
    /// Sends left queued for the end of a write-coalescing window (ours;
    /// see [`crate::TcpConfig::coalesce`]).
    pub tx_coalesced: AtomicU64,
    /// Of those, the sends of a stream of small messages left to the
    /// reactor after the window's end (ours; see
    /// [`crate::TcpConfig::stream_handoff`]).
    pub tx_handed_off: AtomicU64,
    /// Sends that completed a batch of a stream of mid-size messages and
    /// wrote it (ours; see the `coalesce` module).
    pub tx_batch_full: AtomicU64,
    /// Sends left for the sending program's next kick, replies written as
    /// a batch (ours; see [`crate::TcpTransport::kick_later`]).
    pub tx_batched: AtomicU64,
    /// Ack timers armed at [`crate::TcpConfig::ack_poll_answered`] because
    /// the connection brought a message (not a congestion map) within
    /// [`crate::TcpConfig::ack_poll_max`]: when a wait for acks starts
    /// (`Inner::ack_timer`), and when the reactor's poll finds every
    /// watched connection answered (ours).
    pub ack_timer_answered: AtomicU64,
    /// Polls of the watched connections' acks on the reactor's ack timer
    /// (ours; the timer is a fallback, each of these a reactor wake-up).
    pub ack_timer_polls: AtomicU64,
    /// Window clamps of [`crate::AckHeadroom`] set again after the kernel
    /// raised them (ours; see `reactor::read::reassert_clamp`).
    pub window_clamp_reasserted: AtomicU64,
}

impl Stats {
    /// Every counter with its name (`tcp_*`), what
    /// `RdsTransport::counters` reports.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("tcp_data_ready_calls", self.data_ready_calls.load(Relaxed)),
            ("tcp_write_space_calls", self.write_space_calls.load(Relaxed)),
            ("tcp_sndbuf_full", self.sndbuf_full.load(Relaxed)),
            ("tcp_connect_raced", self.connect_raced.load(Relaxed)),
            ("tcp_listen_closed_stale", self.listen_closed_stale.load(Relaxed)),
            ("tcp_rx_partial_discarded", self.rx_partial_discarded.load(Relaxed)),
            ("tcp_tx_partial", self.tx_partial.load(Relaxed)),
            ("tcp_rx_assist_reads", self.rx_assist_reads.load(Relaxed)),
            ("tcp_rx_assist_left", self.rx_assist_left.load(Relaxed)),
            ("tcp_rx_frame_stalled", self.rx_frame_stalled.load(Relaxed)),
            ("tcp_rx_paused", self.rx_paused.load(Relaxed)),
            ("tcp_accept_deferred", self.accept_deferred.load(Relaxed)),
            ("tcp_deferred_expired", self.deferred_expired.load(Relaxed)),
            ("tcp_deferred_replaced", self.deferred_replaced.load(Relaxed)),
            ("tcp_accept_no_resources", self.accept_no_resources.load(Relaxed)),
            ("tcp_accept_shed", self.accept_shed.load(Relaxed)),
            ("tcp_rx_short_reads", self.rx_short_reads.load(Relaxed)),
            ("tcp_tx_coalesced", self.tx_coalesced.load(Relaxed)),
            ("tcp_tx_handed_off", self.tx_handed_off.load(Relaxed)),
            ("tcp_tx_batch_full", self.tx_batch_full.load(Relaxed)),
            ("tcp_tx_batched", self.tx_batched.load(Relaxed)),
            ("tcp_ack_timer_answered", self.ack_timer_answered.load(Relaxed)),
            ("tcp_ack_timer_polls", self.ack_timer_polls.load(Relaxed)),
            ("tcp_rx_assist_acks_left", self.rx_assist_acks_left.load(Relaxed)),
            ("tcp_rx_assist_quiet", self.rx_assist_quiet.load(Relaxed)),
            ("tcp_rx_linger_expired", self.rx_linger_expired.load(Relaxed)),
            ("tcp_reset_untaken", self.reset_untaken.load(Relaxed)),
            ("tcp_window_clamp_reasserted", self.window_clamp_reasserted.load(Relaxed)),
        ]
    }
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}
