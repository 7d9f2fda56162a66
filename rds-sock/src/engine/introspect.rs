//! What an engine shows of itself: counters, connections, sockets, queues,
//! the snapshot rds-info reads (`RDS_INFO_*`), and the node for tests.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use rds_core::{Node, PathId, RdsTransport};

use super::Engine;
use crate::info::{NodeIdent, Snapshot, ipc, kernel};

impl Engine {
    /// Runs `f` on the node (for introspection and tests).
    pub fn with_node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.inner.run(f)
    }

    /// Counters as `RDS_INFO_COUNTERS` (and `rds-info -c`) list them: the
    /// kernel's core counters, the TCP transport's, then our own: the
    /// core's, the transports', the engine's node lock
    /// ([`Engine::node_lock_stats`]) and its sockets' readiness
    /// descriptors (`engine_fd_*`: descriptor updates, and those a poll
    /// left for later).
    pub fn counters(&self) -> Vec<(String, u64)> {
        let core = self.inner.run(|n| n.counters().clone());
        rds_core::info::counters_in_kernel_order(&core, &self.outer_counters())
    }

    /// The counters kept outside the node: the transports' and the
    /// engine's own.
    fn outer_counters(&self) -> Vec<(&'static str, u64)> {
        #[allow(unused_mut)]
        let mut c = self.inner.tcp.counters();
        #[cfg(feature = "ib")]
        if let Some(ib) = &self.inner.ib {
            c.extend(ib.counters());
        }
        let l = self.node_lock_stats();
        c.extend([
            ("engine_node_lock_taken", l.taken),
            ("engine_node_lock_waited", l.waited),
            ("engine_node_lock_wait_us", l.wait_us),
        ]);
        let f = &self.inner.fd_counts;
        c.extend([
            ("engine_fd_raised", f.raised.load(Ordering::Relaxed)),
            ("engine_fd_owed", f.owed.load(Ordering::Relaxed)),
            ("engine_fd_owed_ticked", f.owed_ticked.load(Ordering::Relaxed)),
        ]);
        c
    }

    /// Fault injection (tests, operators): cuts the TCP connection of a
    /// path in both directions as a failing connection would, wherever its
    /// byte streams are, without telling the node
    /// ([`rds_tcp::TcpTransport::abort_path`]). The node sees the connection end,
    /// gets what was already received, resends what was not acked and
    /// reconnects. Returns whether the path had a connection.
    pub fn abort_tcp_path(&self, path: PathId) -> bool {
        self.inner.tcp.abort_path(path)
    }

    /// Connections of the TCP transport (as `rds-info -T`).
    pub fn tcp_connections(&self) -> Vec<rds_core::TransportConnInfo> {
        self.inner.tcp.conn_info()
    }

    /// Connections with every path (`rds-info -n`); a path's SENDING flag
    /// is set while its transport is transmitting.
    pub fn connections(&self) -> Vec<rds_core::ConnSnapshot> {
        let mut conns = self.inner.run(|n| n.info_connections());
        mark_sending(&mut conns, &self.inner.tcp.conn_info());
        conns
    }

    /// Sockets (`rds-info -k`).
    pub fn sockets(&self) -> Vec<rds_core::SockSnapshot> {
        self.inner.run(|n| n.info_sockets())
    }

    /// Messages of the send, retransmit or receive queues (`rds-info -s`,
    /// `-t`, `-r`).
    pub fn messages(&self, q: rds_core::Queue) -> Vec<rds_core::MsgSnapshot> {
        self.inner.run(|n| n.info_messages(q))
    }

    /// Everything at once: the node's part taken under one lock, then the
    /// transport's sockets.
    pub fn snapshot(&self) -> Snapshot {
        use rds_core::Queue;
        let (node, core, mut connections, sockets, send, retrans, recv) = self.inner.run(|n| {
            let mut addresses: Vec<IpAddr> = n.locals().map(|(a, _)| *a).collect();
            addresses.sort();
            let node = NodeIdent {
                pid: std::process::id(),
                engine: self.inner.number,
                uid: ipc::euid(),
                command: std::fs::read_to_string("/proc/self/comm").map(|c| c.trim().to_string()).unwrap_or_default(),
                addresses,
                gen_num: n.config().gen_num,
                npaths: n.config().npaths,
                tcp_port: self.inner.tcp.config().port,
            };
            (
                node,
                n.counters().clone(),
                n.info_connections(),
                n.info_sockets(),
                n.info_messages(Queue::Send),
                n.info_messages(Queue::Retrans),
                n.info_messages(Queue::Recv),
            )
        });
        let tcp = self.inner.tcp.conn_info();
        mark_sending(&mut connections, &tcp);
        let counters = rds_core::info::counters_in_kernel_order(&core, &self.outer_counters());
        Snapshot { node, counters, connections, sockets, send, retrans, recv, tcp }
    }

    /// `getsockopt(SOL_RDS, RDS_INFO_*, buf, &optlen)` with `optlen =
    /// buf.len()`: the kernel's packed structs, ENOSPC with the needed
    /// length when `buf` is short (see [`kernel`]).
    pub fn rds_info_getsockopt(&self, opt: i32, buf: &mut [u8]) -> Result<kernel::InfoOk, kernel::InfoError> {
        kernel::getsockopt(&self.snapshot(), opt, buf)
    }

    /// Where this engine serves its snapshots, if it does.
    pub fn info_socket_path(&self) -> Option<PathBuf> {
        self.inner.info.lock().as_ref().map(|s| s.path().to_path_buf())
    }

    /// The engine's number in this process (0 for the first).
    pub fn number(&self) -> u32 {
        self.inner.number
    }
}

/// Sets SENDING on the paths whose transport connection is transmitting.
fn mark_sending(conns: &mut [rds_core::ConnSnapshot], tcp: &[rds_core::TransportConnInfo]) {
    for t in tcp.iter().filter(|t| t.sending) {
        let Some(p) = t.path else { continue };
        if let Some(path) = conns.get_mut(p.conn.0 as usize).and_then(|c| c.paths.get_mut(usize::from(p.index))) {
            path.flags |= rds_core::info::conn_flags::SENDING;
        }
    }
}
