//! # rds-testkit: what every test layer shares (dev-only)
//!
//! Not part of the public API: the tests of `rds-core`, `rds-tcp`,
//! `rds-ib`, `rds-sock`, `tools` and `tests`, the simulator and the fuzz
//! targets use it as a dev-dependency.
//!
//! * [`rig`]: finding the VM rig (`../shared/vmrig`) and whether it is set
//!   up, for the tests against the kernel; the reading of `[nodeN]` lines
//!   its guests print.

pub mod rig;
