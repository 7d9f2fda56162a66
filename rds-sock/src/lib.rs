//! # rds-sock: RDS sockets in userspace
//!
//! Reliable Datagram Sockets without the kernel module: a socket binds to an
//! address of this host and a port, and sends datagrams to any RDS socket
//! on any node; each arrives exactly once and in order per pair of sockets.
//! Peers may be other processes using this library or Linux kernels running
//! the `rds_tcp` module: the wire format is the kernel's.
//!
//! ```no_run
//! use rds_sock::RdsSocket;
//! let s = RdsSocket::new()?;                      // the process-wide engine
//! s.bind("127.0.0.1:4000".parse().unwrap())?;     // this process now serves 127.0.0.1
//! s.send_to(b"ping", "127.0.0.2:4000".parse().unwrap())?;
//! let mut buf = vec![0u8; 1 << 20];
//! let (n, from) = s.recv_from(&mut buf)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! ## How a process becomes a node
//!
//! An [`Engine`] is one RDS node: the addresses it serves, their
//! connections and its sockets. The first `bind` to an address makes the
//! engine serve it: it listens on `address:16385` (the kernel's RDS-TCP
//! port, `RDS_TCP_PORT` in the environment changes it for the global
//! engine). Only one process can serve an address: a second one gets
//! EADDRINUSE. Datagrams between addresses served by the same engine never
//! touch TCP (the kernel's loopback transport); anything else goes over TCP,
//! one connection per path, up to 8 paths per peer (mprds), or over IB
//! (feature `ib`) for sockets bound to an address of an RDMA device. A
//! socket receives only over its own transport. In the verbs-only IB setup
//! (`RDS_IB_PSK_FILE`) such an address is served by IB alone unless
//! `RDS_IB_PSK_TCP=1` ([`EngineConfig::ib_psk_tcp`]) adds RDS-TCP.
//!
//! Most programs use [`RdsSocket::new`], which starts the process-wide
//! [`Engine::global`] on first use. [`Engine::new`] starts further
//! independent nodes (tests, tools, several nodes in one process);
//! [`Engine::shutdown`] stops one and reports what was still unsent.
//!
//! ## Semantics
//!
//! Errors are `std::io::Error`s carrying the kernel's errno (see each
//! method). A message counts against the sender's send buffer until the
//! peer acknowledged it; blocking sends wait for room or for a congested
//! destination port to clear, non-blocking ones fail with EAGAIN or ENOBUFS.
//! A socket's descriptor ([`std::os::fd::AsRawFd`]) is readable and
//! writable exactly when the socket is, so it works with poll, epoll, mio
//! and tokio.
//!
//! ## Introspection
//!
//! [`Engine::snapshot`] (and [`Engine::connections`], [`Engine::sockets`],
//! [`Engine::messages`], [`Engine::counters`]) report what the kernel's
//! `RDS_INFO_*` options report, per path where we have 8;
//! [`Engine::rds_info_getsockopt`] builds the kernel's packed structs. Every
//! engine also answers `rds-info` from other processes of the same user on
//! a Unix-domain socket ([`info::ipc`]).
//!
//! Threads: the TCP transport runs a fixed number of reactor threads
//! (`TcpConfig::threads`) whatever the number of peers, plus one timer
//! thread per engine. Sends are written by the calling thread when the
//! connection has room, as the kernel does, except that a thread answering
//! messages it has not finished reading (its socket has more queued) has
//! its answers written together, up to 8 at a time, and at the latest when
//! it next finds nothing to read or waits (the `batch` module; the
//! reactor writes them within `rds_tcp::REPLY_BATCH_MAX` otherwise).

mod batch;
mod copy;
mod deadline;
mod engine;
pub mod info;
mod readiness;
mod socket;
mod wait;

pub use deadline::Deadline;
pub use engine::{
    ENV_IB_PSK_TCP, Engine, EngineConfig, NodeLockStats, RESERVED_FDS, ShutdownReport, nofile_limit, peers_for_fds,
};
pub use rds_core::{
    Errno, HandshakeExts, NodeConfig, Payload, RdmaBuf, RdmaOp, RdmaSeg, Readiness, SockOpt, TransportKind,
};
pub use rds_tcp::TcpConfig;
pub use socket::{RdsSocket, RecvFlags, RecvMeta, SendFlags};
