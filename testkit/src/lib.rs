//! # rds-testkit: what every test layer shares (dev-only)
//!
//! Not part of the public API: the tests of `rds-core`, `rds-tcp`,
//! `rds-ib`, `rds-sock`, `tools` and `tests`, the simulator and the fuzz
//! targets use it as a dev-dependency.
//!
//! * [`Rng`]: the one seeded RNG of every test layer (rds-core's
//!   [`rds_core::types::Rng`], the node's own);
//! * [`faults`]: fault injection as a wrapper around a link, in the manner
//!   of smoltcp's `phy::FaultInjector` ([`faults::FaultInjector`]: drops,
//!   delays, duplicates, reorders across paths, cuts, by a seeded
//!   schedule);
//! * [`net`]: nodes joined by an ideal in-memory link ([`net::Net`]),
//!   driven by rds-core's driver, recording everything that crosses it
//!   (rds-core's integration tests);
//! * `sock` (feature `sock`): socket fixtures: engines on private 127.x
//!   addresses with bound sockets (`pair`, `mesh`), address blocks;
//! * [`rig`]: finding the VM rig (`../shared/vmrig`) and whether it is set
//!   up, for the tests against the kernel; the reading of `[nodeN]` lines
//!   its guests print.

pub mod faults;
pub mod net;
pub mod rig;
#[cfg(feature = "sock")]
pub mod sock;

pub use rds_core::types::Rng;
