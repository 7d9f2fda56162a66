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
use std::sync::{Arc, Mutex, Weak};

use crate::conn::PathInfo;
use crate::message::RxMessage;
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
        *self.sink.lock().unwrap() = Some(sink);
    }

    fn sink(&self) -> Option<Arc<dyn TransportSink>> {
        self.sink.lock().unwrap().as_ref()?.upgrade()
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
            sink.path_down(path.id, path.inst, crate::conn::DownReason::ShutdownDone);
        }
    }

    fn kick(&self, path: PathInfo) {
        let Some(sink) = self.sink() else { return };
        {
            let mut st = self.state.lock().unwrap();
            if st.paused(path.id) {
                // The resume kicks it.
                return;
            }
            if !st.busy.insert(path.id) {
                st.again.insert(path.id);
                return;
            }
        }
        let mut out = Vec::new();
        let mut rx = Vec::new();
        loop {
            out.clear();
            let more = sink.pull(path.id, path.inst, BUDGET, &mut out);
            let last = out.iter().filter(|m| !m.is_cong_map()).map(|m| m.header.sequence).max();
            rx.extend(out.drain(..).map(|m| RxMessage { header: m.header, payload: m.payload, rx_time_ns: None }));
            if !rx.is_empty() {
                sink.received(path.id, path.inst, &mut rx);
                rx.clear();
            }
            if let Some(seq) = last {
                sink.acked(path.id, path.inst, seq);
            }
            let mut st = self.state.lock().unwrap();
            if st.paused(path.id) || (!more && !st.again.remove(&path.id)) {
                st.again.remove(&path.id);
                st.busy.remove(&path.id);
                break;
            }
        }
    }

    fn rx_flow(&self, path: PathInfo, paused: bool, seq: u64) {
        {
            let mut st = self.state.lock().unwrap();
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
