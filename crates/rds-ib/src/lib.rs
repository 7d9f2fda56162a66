//! # rds-ib: RDS over InfiniBand / RoCE verbs (not implemented yet)
//!
//! This crate will hold the IB transport behind [`rds_core::RdsTransport`]:
//! device discovery, RC queue pairs set up through RDMA CM (wire-compatible
//! with the kernel's `rds_rdma`) or a verbs-only side channel, 4 KiB
//! fragments with header copies, piggybacked and ack-only frames, credit flow
//! control and RDMA operations. How each of these maps onto the transport
//! interface is written down in `rds_core::transport`.
//!
//! For now it only names the transport's capabilities, so that code can be
//! written against it; [`IbTransport` does not exist yet and the socket layer
//! answers `SO_RDS_TRANSPORT = RDS_TRANS_IB` with ENOPROTOOPT, as the kernel
//! does when `rds_rdma` is not loaded.

use rds_core::TransportCaps;

/// What the IB transport will be able to do (RDMA, no multipath).
pub const CAPS: TransportCaps = TransportCaps::ib();
