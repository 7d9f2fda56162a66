//! Counters under the kernel's names (`struct rds_statistics` without the
//! `s_` prefix), in the kernel's order, followed by counters of our own.

macro_rules! counters {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $field: u64,)* }

        impl $name {
            /// Names in order, as `rds-info -c` prints them.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// (name, value) pairs in order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$((stringify!($field), self.$field)),*].into_iter()
            }

            /// Adds every counter of `other` to this one.
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

counters! {
    /// Core counters (`net/rds/stats.c`), plus our own at the end.
    Counters {
        conn_reset,
        recv_drop_bad_checksum,
        recv_drop_old_seq,
        recv_drop_no_sock,
        recv_drop_dead_sock,
        recv_deliver_raced,
        recv_delivered,
        recv_queued,
        recv_immediate_retry,
        recv_delayed_retry,
        recv_ack_required,
        recv_rdma_bytes,
        recv_ping,
        send_queue_empty,
        send_queue_full,
        send_lock_contention,
        send_lock_queue_raced,
        send_immediate_retry,
        send_delayed_retry,
        send_drop_acked,
        send_ack_required,
        send_queued,
        send_rdma,
        send_rdma_bytes,
        send_pong,
        page_remainder_hit,
        page_remainder_miss,
        copy_to_user,
        copy_from_user,
        cong_update_queued,
        cong_update_received,
        cong_send_error,
        cong_send_blocked,
        recv_bytes_added_to_sock,
        recv_bytes_freed_fromsock,
        send_stuck_rm,
        // --- ours (not in the kernel) ---
        /// Frames that violated the protocol (bad length, bad map, ...); the path was reset.
        recv_drop_bad_frame,
        /// Messages dropped because a peer restart flushed them (RDS_MSG_FLUSH).
        send_drop_flushed,
        /// Messages dropped by RDS_CANCEL_SENT_TO or socket close.
        send_drop_cancelled,
        /// Peer generation-number changes seen (peer restarts).
        peer_restart,
        /// Messages dropped because a socket exceeded the hard receive cap:
        /// always 0 since receive flow control (a path is paused instead,
        /// `recv_pause`); kept so that tools reading it see no drops.
        recv_drop_over_limit,
        /// Multipath handshake probes sent (with `mprds_confirm_probe`).
        mprds_probe_sent,
        /// Messages held on a path until the peer read the socket's path-0
        /// backlog (`crate::lane0`).
        mprds_lane_hold,
        /// Retransmissions that arrived on a path's first connection: sent
        /// to a previous instance of this node, dropped.
        recv_drop_stale,
        /// Paths paused (their transport stops reading) because a socket
        /// went over its hard receive cap or the node over its receive
        /// budget (`Output::RxFlow`).
        recv_pause,
        /// Paused paths resumed by the application's reads.
        recv_resume,
        /// Inbound connections refused because the node already serves
        /// `NodeConfig::max_peers` peers (none of them evictable).
        conn_refused_peer_limit,
        /// Peers that never sent a message, evicted to admit a new peer at
        /// the peer limit.
        conn_evicted_silent,
        /// Connections collected after staying down and idle
        /// (`NodeConfig::conn_idle_gc`).
        conn_collected,
        /// Pongs not queued because one to the same port was still
        /// waiting on the path (a ping flood against a closed window).
        send_pong_coalesced,
        /// Congestion maps from a peer without map versions (a kernel)
        /// received within `cong::MAP_REORDER_NS` of its previous map,
        /// which came on another path, and their receive times do not
        /// order them: a port stays congested only if both say so
        /// (`Node::map_order`).
        cong_update_reordered,
        /// Congestion maps from a peer without map versions that arrived
        /// on another path before the map applied last (their receive
        /// times say so): not applied (`Node::map_order`).
        cong_update_stale,
        /// Probes sent on a connection of ours that the peer had not
        /// evidently taken after `NodeConfig::confirm_probe_after` (its
        /// answer confirms it, `Path::confirmed`).
        mprds_confirm_probe,
        /// Connections of ours dropped (to connect again) because the peer
        /// had still not evidently taken them after four confirm checks
        /// (`Node::confirm_due`).
        mprds_confirm_drop,
        /// Connections of ours a congestion map on another path did not
        /// confirm: the map was an update (its bitmap changed) or more than
        /// one connection was waiting for the peer's sign
        /// (`Connection::map_received`), once per connection and map.
        mprds_confirm_withheld,
        /// Probe pings sent on path 0 to learn that the peer read a
        /// socket's messages sent there before the handshake, which hold
        /// its lane until then (`crate::lane0`).
        mprds_read_proof,
        /// Lane-0 holds ended at the acks because the peer answered no
        /// probe ping for several checks (a peer with `ping_enable` off).
        mprds_proof_unanswered,
        /// Congestions of our sockets that ended before a message arrived
        /// during them: no map update went out for either edge
        /// (`Node::recheck_congestion`).
        cong_update_spared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_order() {
        let c = Counters { recv_delivered: 3, ..Counters::default() };
        assert_eq!(Counters::NAMES[0], "conn_reset");
        let v: Vec<_> = c.iter().filter(|(_, v)| *v != 0).collect();
        assert_eq!(v, vec![("recv_delivered", 3)]);
        let mut d = Counters::default();
        d.add(&c);
        d.add(&c);
        assert_eq!(d.recv_delivered, 6);
    }
}
