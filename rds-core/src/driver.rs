//! Driving a [`Node`]: the one place its outputs are drained and routed,
//! and the one way transport events become calls into it.
//!
//! A node never does anything itself: after every call into it the driver
//! drains [`Node::poll_output`] and carries each [`Output`] out. Every
//! driver (rds-sock's engine, the simulator, the test kit's in-memory net,
//! rds-tcp's test host, the fuzz target) does it through this module:
//!
//! * [`Dispatch`]: one method per output; [`drain`] / [`drain_with`] poll a
//!   node until it is idle and hand each output to it, one at a time (a
//!   handler may call into the node; what that queues is handled in the
//!   same drain, in order). `Vec<Output>` implements it for a driver that
//!   collects under a lock and carries out later, and for tests that look
//!   at the outputs; [`for_each`] hands them to a closure with the node.
//! * [`carry_out`]: an output meant for a transport (Connect, Shutdown,
//!   Kick, RxFlow) handed to the transport of its kind.
//! * [`NodeHost`]: whoever owns a node (behind a lock, say) and carries out
//!   what it asks for; every `NodeHost` is a [`TransportSink`], so the seven
//!   forwarding methods from transport events to node calls exist once.
//!
//! Sans-IO like the rest of the crate: no thread, no clock (a host says what
//! time it is, [`NodeHost::now`]).

use std::convert::Infallible;
use std::net::IpAddr;
use std::time::Instant;

use crate::{
    Accept, DownReason, Node, Output, PathId, PathInfo, RdsTransport, RxMessage, SockId, TransportKind, TransportSink,
    TxMessage,
};

/// What carries out a node's outputs: one method per [`Output`]. An error
/// stops the drain at once (the simulator's broken invariants); a driver
/// that cannot fail uses [`Infallible`].
pub trait Dispatch {
    type Error;
    /// [`Output::Connect`]: open the path's transport connection.
    fn connect(&mut self, path: PathInfo) -> Result<(), Self::Error>;
    /// [`Output::Shutdown`]: close this instance of the path's connection.
    fn shutdown(&mut self, path: PathInfo) -> Result<(), Self::Error>;
    /// [`Output::Kick`]: the path has messages to pull.
    fn kick(&mut self, path: PathInfo) -> Result<(), Self::Error>;
    /// [`Output::RxFlow`]: stop or resume reading the path.
    fn rx_flow(&mut self, path: PathInfo, paused: bool, seq: u64) -> Result<(), Self::Error>;
    /// [`Output::Wake`]: the socket's readiness changed. A dispatcher that
    /// needs the readiness reads [`Node::readiness`] now, before the node
    /// changes again (under the same lock).
    fn wake(&mut self, sock: SockId) -> Result<(), Self::Error>;
}

/// Hands one output to the dispatcher's method for it.
#[inline]
pub fn route<D: Dispatch + ?Sized>(o: Output, d: &mut D) -> Result<(), D::Error> {
    match o {
        Output::Connect(p) => d.connect(p),
        Output::Shutdown(p) => d.shutdown(p),
        Output::Kick(p) => d.kick(p),
        Output::RxFlow { path, paused, seq } => d.rx_flow(path, paused, seq),
        Output::Wake(s) => d.wake(s),
    }
}

/// Drains `node`'s outputs into `d`, one at a time, until it has none;
/// returns how many there were.
#[inline]
pub fn drain<D: Dispatch + ?Sized>(node: &mut Node, d: &mut D) -> Result<usize, D::Error> {
    let mut k = 0;
    while let Some(o) = node.poll_output() {
        k += 1;
        route(o, d)?;
    }
    Ok(k)
}

/// [`drain`] for a dispatcher that holds the node itself (and calls into it
/// while handling an output): `node` finds it in the dispatcher (`None`: the
/// node is gone, nothing to drain).
#[inline]
pub fn drain_with<D: Dispatch + ?Sized>(
    d: &mut D,
    mut node: impl FnMut(&mut D) -> Option<&mut Node>,
) -> Result<usize, D::Error> {
    let mut k = 0;
    while let Some(o) = node(d).and_then(Node::poll_output) {
        k += 1;
        route(o, d)?;
    }
    Ok(k)
}

/// Drains `node`'s outputs one at a time into `f`, which gets the node too
/// (a test serving a path by hand: pull, deliver, ack); returns how many
/// there were.
pub fn for_each(node: &mut Node, mut f: impl FnMut(&mut Node, Output)) -> usize {
    let mut k = 0;
    while let Some(o) = node.poll_output() {
        k += 1;
        f(node, o);
    }
    k
}

/// Every output the node has now, in order (for tests that look at them).
pub fn outputs(node: &mut Node) -> Vec<Output> {
    let mut v = Vec::new();
    let Ok(_) = drain(node, &mut v);
    v
}

/// Collects the outputs as they are (a driver that carries them out after
/// releasing the node's lock, a test that looks at them).
impl Dispatch for Vec<Output> {
    type Error = Infallible;
    fn connect(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.push(Output::Connect(path));
        Ok(())
    }
    fn shutdown(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.push(Output::Shutdown(path));
        Ok(())
    }
    fn kick(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.push(Output::Kick(path));
        Ok(())
    }
    fn rx_flow(&mut self, path: PathInfo, paused: bool, seq: u64) -> Result<(), Infallible> {
        self.push(Output::RxFlow { path, paused, seq });
        Ok(())
    }
    fn wake(&mut self, sock: SockId) -> Result<(), Infallible> {
        self.push(Output::Wake(sock));
        Ok(())
    }
}

/// Carries out an output meant for a transport on `transport(kind)` (the
/// path's kind): Connect, Shutdown, Kick, RxFlow. A Wake is for the
/// driver's sockets, not a transport: it is returned.
#[inline]
pub fn carry_out<'t>(o: Output, transport: impl FnOnce(TransportKind) -> &'t dyn RdsTransport) -> Option<SockId> {
    match o {
        Output::Connect(p) => transport(p.kind).connect(p),
        Output::Shutdown(p) => transport(p.kind).shutdown(p),
        Output::Kick(p) => transport(p.kind).kick(p),
        Output::RxFlow { path, paused, seq } => transport(path.kind).rx_flow(path, paused, seq),
        Output::Wake(s) => return Some(s),
    }
    None
}

/// Whoever owns a node and carries out its outputs: runs a call on it
/// ([`NodeHost::with_node`]: lock, call, drain, unlock, carry out). Every
/// `NodeHost` is a [`TransportSink`]: transport events become these calls.
pub trait NodeHost: Send + Sync {
    /// Runs `f` on the node, then carries out what it asked for.
    fn with_node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R;
    /// The time a `path_up` or `path_down` is reported at (the confirm
    /// probe's delay and the reconnect backoff start there).
    fn now(&self) -> Instant;
}

impl<H: NodeHost> TransportSink for H {
    fn accept(&self, kind: TransportKind, laddr: IpAddr, faddr: IpAddr, peer_port: u16) -> Accept {
        self.with_node(|n| n.accept(kind, laddr, faddr, peer_port, self.now()))
    }

    fn path_up(&self, path: PathId, inst: u64) {
        self.with_node(|n| n.path_up(path, inst, self.now()))
    }

    fn path_down(&self, path: PathId, inst: u64, reason: DownReason) {
        self.with_node(|n| n.path_down(path, inst, reason, self.now()))
    }

    fn received(&self, path: PathId, inst: u64, msgs: &mut Vec<RxMessage>) {
        self.with_node(|n| {
            for m in msgs.drain(..) {
                n.received(path, inst, m);
            }
        })
    }

    fn acked(&self, path: PathId, inst: u64, seq: u64) {
        self.with_node(|n| n.acked(path, inst, seq))
    }

    fn pull(&self, path: PathId, inst: u64, budget: usize, out: &mut Vec<TxMessage>) -> bool {
        self.with_node(|n| n.pull(path, inst, budget, out))
    }

    fn rdma_complete(&self, path: PathId, inst: u64, seq: u64, status: i32) {
        self.with_node(|n| n.rdma_complete(path, inst, seq, status))
    }
}
