//! The engine's settings ([`EngineConfig`]) and the limits it derives from
//! the process's (descriptors, randomness).

use std::path::PathBuf;
use std::time::Duration;

use rds_core::NodeConfig;
use rds_tcp::TcpConfig;

use crate::info::ipc;

/// Settings of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The general layer's settings (paths, buffers, backoff, ...).
    pub node: NodeConfig,
    /// RDS over TCP (port 16385 by default, reactor threads).
    pub tcp: TcpConfig,
    /// Where the engine serves its snapshots to `rds-info` (a Unix-domain
    /// socket in this directory, see [`crate::info::ipc`]); `None` serves
    /// none. Default: [`ipc::runtime_dir`].
    pub info_dir: Option<PathBuf>,
    /// In the verbs-only IB setup (a pre-shared key, `RDS_IB_PSK_FILE`;
    /// feature `ib`): also serve RDS-TCP on the addresses IB serves.
    /// Default `false`: there an address IB serves is served by IB alone,
    /// so nobody without the key reaches the node through it (port 16385
    /// refuses connections; sockets cannot bind it with SO_RDS_TRANSPORT
    /// = TCP, ENOPROTOOPT). With `true` both serve it and each socket
    /// receives only over its own transport. From `RDS_IB_PSK_TCP=1`.
    /// Ignored in the RDMA CM setup (TCP is always served there, as the
    /// kernel's rds_tcp listens on every address).
    pub ib_psk_tcp: bool,
}

/// The environment variable of [`EngineConfig::ib_psk_tcp`] (`1`: serve
/// RDS-TCP on the verbs-only setup's IB addresses too).
pub const ENV_IB_PSK_TCP: &str = "RDS_IB_PSK_TCP";

impl Default for EngineConfig {
    /// Kernel defaults; buffer limits read from this host's
    /// `net.core.{w,r}mem_{default,max}`; a random generation number; the TCP
    /// port from `RDS_TCP_PORT` if set; [`EngineConfig::ib_psk_tcp`] from
    /// `RDS_IB_PSK_TCP`; `NodeConfig::max_peers` within this
    /// process's descriptor limit ([`peers_for_fds`] of [`nofile_limit`],
    /// read now: set the limit before); deferred connections per peer
    /// (`TcpConfig::defer_per_peer`) = the path count.
    fn default() -> Self {
        let mut node = NodeConfig::default();
        let read = |name: &str, dflt: u32| {
            std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(dflt)
        };
        node.wmem_default = read("wmem_default", node.wmem_default);
        node.wmem_max = read("wmem_max", node.wmem_max);
        node.rmem_default = read("rmem_default", node.rmem_default);
        node.rmem_max = read("rmem_max", node.rmem_max);
        let r = random_u64();
        node.gen_num = (r as u32).max(1);
        node.seed = r;
        // Reconnects in order after a reset of all paths (see the field).
        node.reconnect_settle = Duration::from_millis(50);
        // Peers within the descriptors: a peer holds one connection per
        // path and may have as many deferred; RESERVED_FDS stay for the
        // process's own sockets, rds-info and the like.
        node.max_peers = node.max_peers.min(peers_for_fds(nofile_limit()));
        let mut tcp = TcpConfig::default();
        if let Some(p) = std::env::var("RDS_TCP_PORT").ok().and_then(|v| v.parse().ok()) {
            tcp.port = p;
        }
        tcp.defer_per_peer = usize::from(node.npaths.max(1));
        let ib_psk_tcp = std::env::var(ENV_IB_PSK_TCP).is_ok_and(|v| v.trim() == "1");
        EngineConfig { node, tcp, info_dir: Some(ipc::runtime_dir()), ib_psk_tcp }
    }
}

/// Descriptors [`EngineConfig::default`] keeps out of the peers' reach
/// (`NodeConfig::max_peers`): sockets (`RdsSocket::new`), rds-info's
/// connections, the application's own files.
pub const RESERVED_FDS: u64 = 256;

/// The soft `RLIMIT_NOFILE` of this process.
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `r`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return u64::from(u32::MAX);
    }
    r.rlim_cur
}

/// The peer limit for a descriptor limit: a quarter of what is left after
/// [`RESERVED_FDS`] (most peers use one or two connections; a peer of 8
/// paths uses 8, and what goes beyond is shed by the listener, not fatal),
/// at least 16.
pub fn peers_for_fds(nofile: u64) -> usize {
    usize::try_from((nofile.saturating_sub(RESERVED_FDS) / 4).max(16)).unwrap_or(usize::MAX)
}

/// 64 random bits from the kernel.
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 8 {
        // Never fatal: fall back to the clock.
        return std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    }
    u64::from_ne_bytes(b)
}
