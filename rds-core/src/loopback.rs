//! The loopback transport (`net/rds/loop.c`): messages between addresses
//! served by the same node never leave the process. A message pulled from
//! the path (a -> b) is handed straight back to the node as received, and
//! acked at once; the node delivers it on (b -> a).
//!
//! Receive flow control ([`RdsTransport::rx_flow`]) pauses pulling from the
//! path: messages stay on the sender's queue (bounded by its send buffer)
//! until the receiver read enough; nothing is dropped.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::message::RxMessage;
use crate::path::PathInfo;
use crate::transport::{RdsTransport, TransportCaps, TransportSink};
use crate::types::PathId;

/// Bytes pulled per round; bounds how long one kick holds a path.
const BUDGET: usize = 1 << 20;

#[derive(Default)]
struct State {
    /// Paths being transmitted right now (`RDS_IN_XMIT`).
    busy: HashSet<PathId>,
    /// Paths kicked while busy: go around once more.
    again: HashSet<PathId>,
    /// Receive flow control per path: (paused, seq of the last RxFlow).
    flow: HashMap<PathId, (bool, u64)>,
}

impl State {
    fn paused(&self, p: PathId) -> bool {
        self.flow.get(&p).is_some_and(|f| f.0)
    }
}

/// Locks `m` even when a thread panicked while holding it: the state
/// behind these locks (a sink handle, sets and a map of path ids) is valid after
/// any single operation on it, so a panic elsewhere must not turn every
/// later send into a panic too.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Clears a path's transmit claim when [`LoopTransport::kick`] ends in any
/// way, a panic of the sink included, so that the path is never left
/// marked busy with nobody transmitting (every later kick would then only
/// set `again` and nothing would ever be sent on it).
struct Claim<'a> {
    state: &'a Mutex<State>,
    path: PathId,
    held: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.held {
            let mut st = lock(self.state);
            st.busy.remove(&self.path);
            st.again.remove(&self.path);
        }
    }
}

/// The loopback transport.
pub struct LoopTransport {
    sink: Mutex<Option<Weak<dyn TransportSink>>>,
    state: Mutex<State>,
}

impl Default for LoopTransport {
    fn default() -> Self {
        LoopTransport { sink: Mutex::new(None), state: Mutex::new(State::default()) }
    }
}

impl LoopTransport {
    pub fn new() -> Arc<LoopTransport> {
        Arc::new(LoopTransport::default())
    }

    /// Where received messages and acks go.
    pub fn set_sink(&self, sink: Weak<dyn TransportSink>) {
        *lock(&self.sink) = Some(sink);
    }

    fn sink(&self) -> Option<Arc<dyn TransportSink>> {
        lock(&self.sink).as_ref()?.upgrade()
    }
}

impl RdsTransport for LoopTransport {
    fn caps(&self) -> TransportCaps {
        TransportCaps::loopback()
    }

    fn laddr_check(&self, _addr: IpAddr) -> io::Result<()> {
        Ok(())
    }

    fn start_local(&self, _addr: IpAddr) -> io::Result<()> {
        Ok(())
    }

    fn stop_local(&self, _addr: IpAddr) {}

    fn connect(&self, path: PathInfo) {
        if let Some(sink) = self.sink() {
            sink.path_up(path.id, path.inst);
        }
    }

    fn shutdown(&self, path: PathInfo) {
        if let Some(sink) = self.sink() {
            sink.path_down(path.id, path.inst, crate::path::DownReason::ShutdownDone);
        }
    }

    fn kick(&self, path: PathInfo) {
        let Some(sink) = self.sink() else { return };
        {
            let mut st = lock(&self.state);
            if st.paused(path.id) {
                // The resume kicks it.
                return;
            }
            if !st.busy.insert(path.id) {
                st.again.insert(path.id);
                return;
            }
        }
        let mut claim = Claim { state: &self.state, path: path.id, held: true };
        let mut out = Vec::new();
        let mut rx = Vec::new();
        loop {
            out.clear();
            let more = sink.pull(path.id, path.inst, BUDGET, &mut out);
            let last = out.iter().filter(|m| !m.is_cong_map()).map(|m| m.header.sequence).max();
            rx.extend(out.drain(..).map(|m| RxMessage::new(m.header, m.payload)));
            if !rx.is_empty() {
                sink.received(path.id, path.inst, &mut rx);
                rx.clear();
            }
            if let Some(seq) = last {
                sink.acked(path.id, path.inst, seq);
            }
            let mut st = lock(&self.state);
            if st.paused(path.id) || (!more && !st.again.remove(&path.id)) {
                st.again.remove(&path.id);
                st.busy.remove(&path.id);
                claim.held = false;
                break;
            }
        }
    }

    fn rx_flow(&self, path: PathInfo, paused: bool, seq: u64) {
        {
            let mut st = lock(&self.state);
            let f = st.flow.entry(path.id).or_insert((false, 0));
            if seq <= f.1 {
                return;
            }
            *f = (paused, seq);
        }
        if !paused {
            self.kick(path);
        }
    }

    fn close(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::TxMessage;
    use crate::path::DownReason;
    use crate::transport::Accept;
    use crate::types::{ConnId, Payload, TransportKind};
    use crate::wire::Header;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A sink with one message per pull; its first `panics` pulls panic.
    #[derive(Default)]
    struct Sink {
        panics: AtomicUsize,
        pulls: AtomicUsize,
        received: AtomicUsize,
    }

    impl TransportSink for Sink {
        fn accept(&self, _: TransportKind, _: IpAddr, _: IpAddr, _: u16) -> Accept {
            Accept::Reject
        }
        fn path_up(&self, _: PathId, _: u64) {}
        fn path_down(&self, _: PathId, _: u64, _: DownReason) {}
        fn received(&self, _: PathId, _: u64, msgs: &mut Vec<RxMessage>) {
            self.received.fetch_add(msgs.len(), Ordering::SeqCst);
        }
        fn acked(&self, _: PathId, _: u64, _: u64) {}
        fn pull(&self, _: PathId, _: u64, _: usize, out: &mut Vec<crate::message::TxMessage>) -> bool {
            self.pulls.fetch_add(1, Ordering::SeqCst);
            if self.panics.load(Ordering::SeqCst) > 0 {
                self.panics.fetch_sub(1, Ordering::SeqCst);
                panic!("sink failure");
            }
            let mut header = Header::data(1, 2, 1);
            header.sequence = 1;
            out.push(TxMessage { header, payload: Payload::copy_from(b"x"), ack_required: false, rdma: None });
            false
        }
    }

    fn setup(panics: usize) -> (Arc<LoopTransport>, Arc<Sink>, PathInfo) {
        let t = LoopTransport::new();
        let sink = Arc::new(Sink::default());
        sink.panics.store(panics, Ordering::SeqCst);
        let dyn_sink: Arc<dyn TransportSink> = sink.clone();
        t.set_sink(Arc::downgrade(&dyn_sink));
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let info = PathInfo {
            id: PathId { conn: ConnId(0), index: 0 },
            inst: 1,
            laddr: a,
            faddr: a,
            kind: TransportKind::Loop,
            tos: 0,
            npaths: 1,
            taken: true,
        };
        (t, sink, info)
    }

    /// A sink that panicked in the middle of a transmit does not leave the
    /// path claimed: the next kick transmits.
    #[test]
    fn a_panic_during_a_kick_does_not_wedge_the_path() {
        let (t, sink, info) = setup(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.kick(info)));
        assert!(r.is_err(), "the sink panicked");
        t.kick(info);
        assert_eq!(sink.pulls.load(Ordering::SeqCst), 2, "the second kick pulled");
        assert_eq!(sink.received.load(Ordering::SeqCst), 1, "and delivered its message");
    }

    /// A lock poisoned by a thread that panicked while holding it does not
    /// make the transport panic.
    #[test]
    fn poisoned_locks_are_recovered() {
        let (t, sink, info) = setup(0);
        let t2 = t.clone();
        let _ = std::thread::spawn(move || {
            let _st = t2.state.lock().unwrap();
            let _sk = t2.sink.lock().unwrap();
            panic!("poison both locks");
        })
        .join();
        assert!(t.state.is_poisoned() && t.sink.is_poisoned());
        t.kick(info);
        t.connect(info);
        assert_eq!(sink.received.load(Ordering::SeqCst), 1);
    }
}
