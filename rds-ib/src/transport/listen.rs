//! The listener threads of [`IbTransport`](super::IbTransport): one per
//! served address, asking the core ([`rds_core::TransportSink::accept`]) about every
//! request before it is accepted, in either setup mode.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rds_core::{Accept, DownReason, PathInfo, TransportKind};

use crate::verbs::{Listener, SideEvent, SideListener};

use super::{Cmd, Shared, lock};

/// The listener of either setup mode.
pub(super) enum AnyListener {
    Cm(Listener<PathInfo>),
    Side(SideListener<PathInfo>),
}

pub(super) fn listen_loop(l: &mut AnyListener, stop: &AtomicBool, shared: &Arc<Shared>) {
    match l {
        AnyListener::Cm(l) => cm_listen_loop(l, stop, shared),
        AnyListener::Side(l) => side_listen_loop(l, stop, shared),
    }
}

/// The admission check of an accepting listener: the core's path, or
/// `None` (counted in `refused`).
fn admit(shared: &Shared, local: IpAddr, peer: IpAddr, refused: &mut u64) -> Option<PathInfo> {
    // Crossed connects: the smaller address's own connect wins.
    if rds_core::addr_cmp(&local, &peer).is_lt() && lock(&shared.connecting_pairs).contains(&(local, peer)) {
        *refused += 1;
        return None;
    }
    let sink = shared.sink()?;
    match sink.accept(TransportKind::Ib, local, peer, 0) {
        Accept::Path(info) => Some(info),
        _ => {
            *refused += 1;
            None
        }
    }
}

/// A path the core gave a connection that did not come up.
fn taken_but_failed(shared: &Shared, info: PathInfo) {
    if let Some(sink) = shared.sink() {
        sink.path_down(info.id, info.inst, DownReason::ConnectFailed);
    }
}

fn cm_listen_loop(l: &mut Listener<PathInfo>, stop: &AtomicBool, shared: &Arc<Shared>) {
    // The listener's counts already added: refusals (the core's, crossed
    // connects and the pending limits) and failed setups.
    let mut seen = (l.refused, l.establish_failed);
    while !stop.load(Ordering::Acquire) {
        let deadline = Instant::now() + Duration::from_millis(200);
        // The listener counts admit's refusals itself.
        let res = l.accept_with(deadline, &mut |local, peer| admit(shared, local, peer, &mut 0));
        {
            let mut c = lock(&shared.counters);
            c.refused += l.refused - seen.0;
            c.establish_failed += l.establish_failed - seen.1;
            seen = (l.refused, l.establish_failed);
        }
        listener_outcome(shared, res);
    }
}

/// What one accept of either listener produced: an established
/// connection goes to the event thread; one the core took but that did not
/// come up is reported down; after an error the listener pauses briefly.
fn listener_outcome(shared: &Arc<Shared>, res: io::Result<Option<SideEvent<PathInfo>>>) {
    match res {
        Ok(Some(SideEvent::Up(conn, info))) => {
            lock(&shared.counters).accepted += 1;
            shared.push(Cmd::Accepted(info, *conn));
        }
        Ok(Some(SideEvent::Failed(_, info))) => taken_but_failed(shared, info),
        Ok(None) => {}
        Err(_) => std::thread::sleep(Duration::from_millis(50)),
    }
}

/// The verbs-only listener: it only accepts, counts and admits; every
/// connection's handshake and setup runs on a thread of its own, whose
/// outcome comes back here with the path the core gave it.
fn side_listen_loop(l: &mut SideListener<PathInfo>, stop: &AtomicBool, shared: &Arc<Shared>) {
    let mut seen = (0, 0);
    while !stop.load(Ordering::Acquire) {
        let mut refused = 0;
        let deadline = Instant::now() + Duration::from_millis(200);
        let res = l
            .accept_with(deadline, &mut |local, peer| admit(shared, IpAddr::V4(local), IpAddr::V4(peer), &mut refused));
        {
            let mut c = lock(&shared.counters);
            c.refused += refused;
            c.side_auth_failed += l.auth_failed - seen.0;
            c.side_bad_handshake += l.bad_handshake - seen.1;
            seen = (l.auth_failed, l.bad_handshake);
        }
        listener_outcome(shared, res);
    }
}
