//! Replies written as a batch: which sends leave their write for later,
//! and when this thread's held writes go out ([`rds_tcp::TcpTransport::kick_later`]
//! has the bound, [`rds_tcp::REPLY_BATCH_MAX`]).
//!
//! A send may wait when the thread that makes it is the one that last
//! received a message from the socket ([`received_from`]) and the socket
//! still has received messages queued after the send (counted under the
//! node's lock, with the send): the program is working through a batch of
//! requests and will come back for the next at once. Its kicks of TCP paths
//! are then held ([`hold`]); this thread writes them ([`release`]):
//! - when it holds [`BATCH_SENDS`] sends: the peer starts on those
//!   answers while this thread works through the rest (holding every
//!   answer of a batch until its last left each side idle while the other
//!   worked; writing at the batch's middle instead halved the batches at
//!   every hop, until the answers went one per write again);
//! - with its next send that finds nothing queued (the last answer of the
//!   batch goes out with the ones held before it, in one write);
//! - when it next looks for a message and finds none (a receive that would
//!   block or fails with `EAGAIN`), before any wait on the socket (a
//!   receive's, a blocking send's), and when it closes a socket;
//! - when the thread ends (a program's `exit` included: the held list's
//!   destructor writes them, as the kernel had written them in `sendmsg`);
//! - the reactor writes them otherwise.
//!
//! A send from another thread than the receiving one, and every send of a
//! socket with nothing received queued (a stream, one request in flight),
//! is written at once, as before.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use rds_core::{PathInfo, RdsTransport};
use rds_tcp::TcpTransport;

use crate::engine::SockShared;

/// A thread that holds this many sends writes them (module docs). With 16
/// requests in flight, each answered (`rds-window`, 64 B, VM rig, 3 rounds
/// alternating in one boot), writing every 2 sends reached 12.7-14.0 k
/// answers/s, every 4 14.4-18.5 k, every 8 14.8-19.7 k, and holding a
/// whole batch 13.8-15.6 k.
pub(crate) const BATCH_SENDS: usize = 8;

/// A thread's batch, apart from the kicks it holds ([`HELD`], which has a
/// destructor; these do not, so reading them costs no check of it).
struct State {
    /// The socket this thread last received a message from (its shared
    /// state's address; only compared, never followed).
    receiving: Cell<usize>,
    /// While a send that may wait dispatches its outputs: the messages its
    /// socket still has queued for receive.
    batching: Cell<usize>,
    /// Sends held since this thread last wrote.
    sends: Cell<usize>,
    /// Whether [`HELD`] holds anything.
    holding: Cell<bool>,
}

thread_local! {
    static STATE: State = const {
        State { receiving: Cell::new(0), batching: Cell::new(0), sends: Cell::new(0), holding: Cell::new(false) }
    };
    /// The TCP paths whose kicks this thread holds, with their transport.
    static HELD: RefCell<Held> = const { RefCell::new(Held(Vec::new())) };
}

fn addr(sh: &SockShared) -> usize {
    sh as *const SockShared as usize
}

/// This thread received a message from the socket.
pub(crate) fn received_from(sh: &SockShared) {
    STATE.with(|b| b.receiving.set(addr(sh)));
}

/// Whether this thread last received from the socket (its sends may wait).
pub(crate) fn receiving(sh: &SockShared) -> bool {
    STATE.with(|b| b.receiving.get() == addr(sh))
}

/// The send being dispatched may wait: called under the node's lock with
/// the messages its socket has queued for receive (more than 0).
pub(crate) fn start(queued: usize) {
    STATE.with(|b| b.batching.set(queued));
}

/// Whether the kicks being dispatched may wait.
pub(crate) fn active() -> bool {
    STATE.with(|b| b.batching.get() > 0)
}

/// Kicks held by a thread; what is still held when the thread ends (or
/// the program exits) is written then.
struct Held(Vec<(PathInfo, Arc<TcpTransport>)>);

impl Drop for Held {
    fn drop(&mut self) {
        for (p, t) in self.0.drain(..) {
            t.kick(p);
        }
    }
}

/// Holds a kick that `t` left for later (past the thread's end, when the
/// list is gone, it kicks at once).
pub(crate) fn hold(t: &Arc<TcpTransport>, p: PathInfo) {
    let held = HELD.try_with(|h| {
        let h = &mut h.borrow_mut().0;
        if !h.iter().any(|(q, u)| q.id == p.id && q.inst == p.inst && Arc::ptr_eq(t, u)) {
            h.push((p, t.clone()));
        }
    });
    match held {
        Ok(()) => STATE.with(|b| b.holding.set(true)),
        Err(_) => t.kick(p),
    }
}

/// A kick of `p` went out on `t`: it need not be held any more.
pub(crate) fn kicked(t: &Arc<TcpTransport>, p: &PathInfo) {
    if !STATE.with(|b| b.holding.get()) {
        return;
    }
    // `try_with`: the list may be gone (its destructor kicks through here).
    let _ = HELD.try_with(|h| {
        if let Ok(mut h) = h.try_borrow_mut() {
            h.0.retain(|(q, u)| q.id != p.id || !Arc::ptr_eq(t, u));
            if h.0.is_empty() {
                STATE.with(|b| b.holding.set(false));
            }
        }
    });
}

/// After a send's dispatch: writes what this thread holds unless the send
/// was one that may wait, or when it holds [`BATCH_SENDS`] (module docs).
pub(crate) fn sent() {
    let write = STATE.with(|b| {
        let (write, sends) = after_send(b.batching.replace(0), b.sends.get());
        b.sends.set(sends);
        write && b.holding.get()
    });
    if write {
        kick_held();
    }
}

/// The rule of [`sent`]: given the messages the send's socket still has
/// queued (0: the send did not wait) and the sends held before it, whether
/// to write now and the sends held after it.
fn after_send(queued: usize, held: usize) -> (bool, usize) {
    if queued == 0 || held + 1 >= BATCH_SENDS { (true, 0) } else { (false, held + 1) }
}

/// Writes every path this thread holds: its batch is over.
pub(crate) fn release() {
    let holding = STATE.with(|b| {
        b.sends.set(0);
        b.holding.get()
    });
    if holding {
        kick_held();
    }
}

fn kick_held() {
    STATE.with(|b| b.holding.set(false));
    let held = HELD.try_with(|h| std::mem::take(&mut h.borrow_mut().0)).unwrap_or_default();
    for (p, t) in held {
        t.kick(p);
    }
}

/// In the child of a fork ([`crate::Engine::forget_after_fork`]): forgets
/// the kicks this thread held without writing them or dropping their
/// transports. They name the parent's connections, whose TCP sockets the
/// child shares: a write from the child would go into the parent's
/// streams.
pub(crate) fn forget_after_fork() {
    STATE.with(|b| {
        b.receiving.set(0);
        b.batching.set(0);
        b.sends.set(0);
        b.holding.set(false);
    });
    let _ = HELD.try_with(|h| {
        if let Ok(mut h) = h.try_borrow_mut() {
            std::mem::forget(std::mem::take(&mut h.0));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a thread held before a fork is forgotten in the child: not
    /// held any more, and no kick of it is left for a later write or the
    /// thread's end.
    #[test]
    fn a_fork_child_forgets_the_held_kicks() {
        let engine = crate::Engine::new(crate::EngineConfig { info_dir: None, ..Default::default() }).unwrap();
        let p = PathInfo {
            id: rds_core::PathId { conn: rds_core::ConnId(7), index: 3 },
            inst: 1,
            laddr: std::net::Ipv4Addr::LOCALHOST.into(),
            faddr: std::net::Ipv4Addr::new(127, 0, 0, 2).into(),
            kind: rds_core::TransportKind::Tcp,
            tos: 0,
            npaths: 8,
            taken: true,
        };
        let tcp = engine.inner.tcp_transport();
        hold(&tcp, p);
        hold(&tcp, p);
        assert!(STATE.with(|b| b.holding.get()));
        assert_eq!(HELD.with(|h| h.borrow().0.len()), 1, "held once");
        let refs = Arc::strong_count(&tcp);
        forget_after_fork();
        assert!(!STATE.with(|b| b.holding.get()));
        assert_eq!(HELD.with(|h| h.borrow().0.len()), 0);
        assert_eq!(Arc::strong_count(&tcp), refs, "the transport was forgotten, not dropped");
    }

    /// A batch of 20 requests answered one by one: the 8th and the 16th
    /// answers write the ones held, the last (none queued) the rest: 3
    /// writes. The next batch starts afresh.
    #[test]
    fn a_batch_is_written_every_batch_sends_and_at_its_end() {
        let mut held = 0;
        let mut writes = Vec::new();
        for k in 1..=20usize {
            let (write, next) = after_send(20 - k, held);
            held = next;
            if write {
                writes.push(k);
            }
        }
        assert_eq!(writes, vec![8, 16, 20]);
        assert_eq!(held, 0);
        // A batch of 2: the first answer is held, the second writes both.
        assert_eq!(after_send(1, 0), (false, 1));
        assert_eq!(after_send(0, 1), (true, 0));
    }
}
