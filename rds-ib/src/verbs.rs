//! The verbs path (feature `verbs`): devices, the shared protection domain,
//! RDMA CM connection setup with the kernel's private data, one RC queue
//! pair per connection with its completion queues, the receive ring and the
//! send path, on `rdma-sys`.
//!
//! An [`IbConnection`] is driven by its owner calling [`IbConnection::send`] and
//! [`IbConnection::poll`]; [`crate::transport`] owns the connections behind
//! [`rds_core::RdsTransport`] (its event thread polls them, its listener
//! threads accept without blocking on any one peer). What it does follows
//! the kernel's `rds_rdma`:
//!
//! * RDMA CM in the TCP port space, port [`RDS_IB_PORT`] (18634) for IPv4
//!   and [`RDS_CM_PORT`] (16385) for IPv6, as the kernel's two listeners;
//!   address and route resolution with a 5000 ms timeout; `retry_count`
//!   [`RETRY_COUNT`] (the kernel's `rds_ib_retry_count`) and
//!   `rnr_retry_count` 7 (infinite: mainline runs without credit flow
//!   control and relies on RNR retry);
//! * credit flow control offered by default ([`Verbs::set_flow_control`]):
//!   the connect request and the accept advertise the posted receive ring,
//!   every reposted buffer is granted again in `h_credit` (an ack-only
//!   frame once 16 wait), and our sends are limited by credits when both
//!   sides advertised some; a mainline kernel advertises 0, which turns it
//!   off ([`crate::proto::credits`]);
//! * the connect request carries `rds_ib_connect_private` proposing 4.1
//!   ([`crate::proto::private`]), falling back to 3.1 after a reject with value 1;
//!   the passive side answers with the version `passive_negotiate` picks and
//!   rejects incompatible requests with the reject value 1;
//! * one RC QP per connection; a ring of [`RECV_WR`] receive work requests of
//!   two SGEs each (the 48-byte header buffer and a 4 KiB fragment buffer),
//!   refilled as each completes; SENDs of two SGEs (a header copy and the
//!   fragment, one SGE for a 0-byte message), signaled and solicited as
//!   [`crate::proto::frag`] decides; explicit ack-only frames as
//!   [`crate::proto::credits`] decides.
//!
//! Device contexts: librdmacm opens every RDMA device once per process and
//! hands that context out in `rdma_cm_id::verbs`; a QP must be created on a
//! PD of that very context. So [`Verbs`] keeps one PD per CM device context,
//! shared by every connection on that device, instead of opening devices a
//! second time. [`device_names`] lists the devices with `ibv_get_device_list`.
//!
//! Layout, one file per verbs object:
//!
//! * `verbs/device.rs`: the devices ([`device_names`], [`addr_has_device`])
//!   and [`Verbs`], the protection domain of each device context;
//! * `verbs/cm.rs`: the RDMA CM event channel and ids, the connection
//!   parameters, the active side's connect ([`IbConnection::connect`]) and
//!   [`StalledRequest`];
//! * `verbs/listener.rs`: the passive side, [`Listener`];
//! * `verbs/qp.rs`: [`IbConnection`], the RC queue pair with its completion
//!   queues, registered ring buffers, CQ and CM events, drain and teardown;
//! * `verbs/rings.rs`: posting to and reaping the send and receive rings
//!   (fragments, ack-only frames, credits, reassembly, receive flow control);
//! * [`mr`] and `verbs/rdma.rs`: memory registration and RDMA READ / WRITE;
//! * `verbs/side.rs`: the verbs-only setup ([`SideListener`],
//!   [`IbConnection::connect_side`]).
//!
//! Every `unsafe` block is a call into libibverbs/librdmacm or a read of
//! memory they own, each with its `// SAFETY:` reason.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::c_int;

mod cm;
mod device;
mod listener;
pub mod mr;
mod qp;
mod rdma;
mod rings;
mod side;

pub use cm::{REJ_RETRY, StalledRequest, cm_port};
pub use device::{Verbs, addr_has_device, device_names};
pub use listener::{ESTABLISH_TIMEOUT, Listener, MAX_PENDING_ACCEPTS, MAX_PENDING_ACCEPTS_PER_SOURCE};
pub use qp::{ConnError, ConnStats, IbConnection, Received};
pub use rdma::MAX_RDMA_SGES;
pub use side::{HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES, MAX_PENDING_PER_SOURCE, PortInfo, SideEvent, SideListener};

/// The RDMA CM port of RDS over IPv4 (`RDS_PORT` 18634).
pub const RDS_IB_PORT: u16 = 18634;
/// The RDMA CM port of RDS over IPv6 (`RDS_CM_PORT` 16385, the kernel's
/// second listener, IPv6 requests only).
pub const RDS_CM_PORT: u16 = 16385;
/// Receive work requests posted per connection.
pub const RECV_WR: usize = 512;
/// Send slots (header copy + 4 KiB buffer) per connection.
pub const SEND_WR: usize = 256;
/// Transport retries of an RC QP before its sends fail with
/// `IBV_WC_RETRY_EXC_ERR` (the CM REQ carries it, so both sides of a
/// connection we open use it; the kernel's `rds_ib_retry_count` default,
/// 1 in 6.1). Not 7: rxe (Soft-RoCE) takes 7 as "retry forever", so a
/// peer that went silent would never end the connection.
pub const RETRY_COUNT: u8 = 1;

/// Address and route resolution timeout (`RDS_RDMA_RESOLVE_TIMEOUT_MS`).
pub const RESOLVE_TIMEOUT_MS: i32 = 5000;

pub(crate) fn errno() -> io::Error {
    io::Error::last_os_error()
}

pub(crate) fn err(code: i32, what: &str) -> io::Error {
    let e = io::Error::from_raw_os_error(code);
    io::Error::new(e.kind(), format!("{what}: {e} (errno {code})"))
}

/// A librdmacm/libibverbs call returning -1 and setting errno.
pub(crate) fn check(ret: c_int, what: &str) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        let e = errno();
        Err(err(e.raw_os_error().unwrap_or(libc::EIO), what))
    }
}

pub(crate) fn sockaddr_v4(addr: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(addr).to_be() },
        sin_zero: [0; 8],
    }
}

/// A socket address of either family for the RDMA CM calls (which read the
/// family and the matching structure).
pub(crate) fn sockaddr_ip(addr: IpAddr, port: u16) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        IpAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe { *(&mut ss as *mut _ as *mut libc::sockaddr_in) = sockaddr_v4(a, port) };
        }
        IpAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: as above.
            unsafe { *(&mut ss as *mut _ as *mut libc::sockaddr_in6) = sin6 };
        }
    }
    ss
}
