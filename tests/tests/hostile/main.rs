//! A hostile peer against our node over real TCP (issues "Reliability under
//! faults" and "Hardened against hostile peers"): an `h_len` above 1 MiB, a
//! truncated header or payload, a partial message that stalls (reset after
//! `rx_frame_timeout`), 1 MiB headers trickled a byte at a time during a
//! legitimate transfer, garbage extension headers, congestion maps of the
//! wrong length, and floods to a socket that never reads (held back by
//! receive flow control, never dropped; a reset still reaches the paused
//! path).
//!
//! Every test has the same bed: our node (an engine serving 127.48.n.2),
//! an honest peer (another engine on 127.48.n.3) that plays ping-pong with
//! the node the whole time, and the hostile peer, a raw TCP client bound to
//! 127.48.n.1 (the smaller address, which is the side that connects) that
//! writes bytes of its choice to 127.48.n.2:16385. The node must reset (or
//! close) the hostile connection where the protocol says so, count it,
//! keep its memory bounded, keep serving the honest peer (every round trip
//! exact and in order; the longest one is printed), and afterwards accept a
//! valid connection from the same address and deliver its message exactly
//! once.
//!
//! Where we differ from the 6.1 kernel (docs/kernel-facts.md §8): the
//! kernel buffers any `h_len` up to 4 GiB and skips a congestion map of
//! the wrong length; we reset the connection for the first and shut it
//! down for the second, and count both in `recv_drop_bad_frame`.
//!
//! The tests run one at a time (they measure the process's memory).

//!
//! Files: `bed.rs` the bed (node, honest peer, hostile connections) and the
//! helpers, `malformed.rs` malformed frames and byte streams, `slow.rs` slow
//! peers (trickled headers, a stalled message), `floods.rs` floods to a
//! socket that never reads.

mod bed;
mod floods;
mod malformed;
mod slow;
