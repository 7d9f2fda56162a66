//! The sans-IO half of the IB transport: pure state machines and codecs that
//! take bytes and events and return what to post. No device, verbs
//! library, RDMA CM, socket, file or clock is involved, and every module
//! has its unit tests (`cargo test -p rds-ib`).
//!
//! * [`private`]: the RDMA CM private data and the version negotiation;
//! * [`frag`]: fragments with header copies, the ack-only frame, reassembly;
//! * [`credits`]: the glue between the IB header and the general layer's
//!   credit rule ([`rds_core::credits`]): acks piggybacked in `h_ack`,
//!   ack-only frames, credits granted in `h_credit`, the counters, receive
//!   flow control of the receive ring;
//! * [`sidechannel`]: the verbs-only side channel's frames and its
//!   challenge-response handshake (its OS half, randomness and the key
//!   file, is [`crate::secrets`]).

pub mod credits;
pub mod frag;
pub mod private;
pub mod sidechannel;
