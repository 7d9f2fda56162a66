//! Deterministic payloads (the same function as conform.py's) and their
//! checking per flow (source port, destination port): index order, size,
//! exact content, END counts, lost and duplicated messages.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rds_sock::{RdsSocket, RecvFlags};
use sha2::{Digest, Sha256};

use crate::common::{BIG, errno_name};

pub fn flow_id(sport: u16, dport: u16) -> u32 {
    (u32::from(sport) << 16) | u32::from(dport)
}

/// 32 bytes of sha256("flow:i"), a 16-byte header [flow u32][i u64][n u32]
/// (little-endian), then the hash repeated; cut to `n` bytes.
pub fn payload(flow: u32, i: u64, n: usize) -> Vec<u8> {
    let unit: [u8; 32] = Sha256::digest(format!("{flow}:{i}").as_bytes()).into();
    let mut v = Vec::with_capacity(n.max(48));
    v.extend_from_slice(&unit);
    v.extend_from_slice(&flow.to_le_bytes());
    v.extend_from_slice(&i.to_le_bytes());
    v.extend_from_slice(&(n as u32).to_le_bytes());
    while v.len() < n {
        v.extend_from_slice(&unit);
    }
    v.truncate(n);
    v
}

pub fn end_msg(count: u64) -> Vec<u8> {
    let mut v = b"END".to_vec();
    v.extend_from_slice(&count.to_le_bytes());
    v
}

fn is_end(d: &[u8]) -> Option<u64> {
    (d.len() == 11 && &d[..3] == b"END").then(|| u64::from_le_bytes(d[3..].try_into().unwrap()))
}

/// The index a payload of at least 48 bytes carries.
pub fn index_of(d: &[u8]) -> Option<u64> {
    (d.len() >= 48).then(|| u64::from_le_bytes(d[36..44].try_into().unwrap()))
}

/// Checks messages per flow: index order, size, exact content.
pub struct FlowChecker {
    peer: IpAddr,
    size_of: fn(u32, u64) -> usize,
    pub next: HashMap<u32, u64>,
    ends: HashMap<u32, u64>,
    errors: Vec<String>,
    pub count: u64,
    pub lost: u64,
    pub dup: u64,
    /// The first few losses and duplicates (kept apart from `errors`).
    gap_notes: Vec<String>,
}

impl FlowChecker {
    pub fn new(peer: IpAddr, size_of: fn(u32, u64) -> usize) -> FlowChecker {
        FlowChecker {
            peer,
            size_of,
            next: HashMap::new(),
            ends: HashMap::new(),
            errors: Vec::new(),
            count: 0,
            lost: 0,
            dup: 0,
            gap_notes: Vec::new(),
        }
    }

    pub fn err(&mut self, e: String) {
        if self.errors.len() < 5 {
            self.errors.push(e);
        } else if self.errors.len() == 5 {
            self.errors.push("...".into());
        }
    }

    fn gap(&mut self, e: String) {
        if self.gap_notes.len() < 4 {
            self.gap_notes.push(e);
        }
    }

    pub fn add(&mut self, from: SocketAddr, dport: u16, data: &[u8]) {
        if from.port() == 0 {
            // A pong (our node's pings set up the paths).
            return;
        }
        if from.ip() != self.peer {
            self.err(format!("message from unexpected {from}"));
            return;
        }
        let flow = flow_id(from.port(), dport);
        if let Some(n) = is_end(data) {
            self.ends.insert(flow, n);
            return;
        }
        let mut i = *self.next.get(&flow).unwrap_or(&0);
        // Messages of 48 bytes and more carry their index: a gap (lost
        // messages) or a step back (a duplicate) is counted and the check
        // goes on from there, instead of failing every later message.
        if let Some(g) = index_of(data).filter(|&g| g != i && data == payload(flow, g, data.len()).as_slice()) {
            if g < i {
                self.dup += 1;
                self.gap(format!("flow {}->{dport} message {g} again after {}", from.port(), i - 1));
                return;
            }
            self.lost += g - i;
            self.gap(format!("flow {}->{dport} messages {i}..{} lost", from.port(), g - 1));
            i = g;
        }
        let n = (self.size_of)(flow, i);
        if data != payload(flow, i, n).as_slice() {
            self.err(format!(
                "flow {}->{dport} message {i}: got {} B (index {:?}), want {n} B",
                from.port(),
                data.len(),
                index_of(data)
            ));
        }
        self.next.insert(flow, i + 1);
        self.count += 1;
    }

    pub fn complete(&self, expect: &HashMap<u32, u64>) -> bool {
        expect.iter().all(|(f, n)| self.next.get(f).copied().unwrap_or(0) >= *n)
    }

    pub fn ended(&self, flows: &[u32]) -> bool {
        // A flow's END comes after all its messages (per-flow order).
        flows.iter().all(|f| self.ends.contains_key(f))
    }

    /// Against fixed counts (`expect`) or the senders' END counts.
    pub fn verdict(&self, flows: &[u32], expect: Option<&HashMap<u32, u64>>) -> (bool, String) {
        self.verdict_gaps(flows, expect, false)
    }

    /// `allow_gaps`: lost and duplicated messages are counted but do not
    /// fail (a 6.1 peer cannot avoid them after whole-connection resets);
    /// wrong content, a missing END or counts that do not add up still do.
    pub fn verdict_gaps(&self, flows: &[u32], expect: Option<&HashMap<u32, u64>>, allow_gaps: bool) -> (bool, String) {
        let mut errs = self.errors.clone();
        if !allow_gaps {
            errs.extend(self.gap_notes.iter().cloned());
        }
        for f in flows {
            let got = self.next.get(f).copied().unwrap_or(0);
            let want = match expect {
                Some(e) => e.get(f).copied(),
                None => self.ends.get(f).copied(),
            };
            match want {
                None => errs.push(format!("flow {}->{}: no END after {got}", f >> 16, f & 0xffff)),
                // The last messages of a flow lost: the END tells.
                Some(w) if allow_gaps && got < w => {}
                Some(w) if w != got => {
                    errs.push(format!("flow {}->{}: {got} messages, sender sent {w}", f >> 16, f & 0xffff))
                }
                _ => {}
            }
        }
        errs.truncate(6);
        (errs.is_empty(), errs.join("; "))
    }
}

/// Receives on every socket (a thread each) into the checker until `done`
/// holds or the deadline passes.
pub fn receive_all(
    socks: &[Arc<RdsSocket>],
    checker: &Arc<Mutex<FlowChecker>>,
    done: impl Fn(&FlowChecker) -> bool + Send + Sync + 'static,
    deadline: Instant,
) {
    let done = Arc::new(done);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for s in socks {
        let (s, checker, done, stop) = (s.clone(), checker.clone(), done.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let port = s.local_addr().unwrap().port();
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut buf = vec![0u8; BIG];
            while !stop.load(SeqCst) && Instant::now() < deadline {
                if done(&checker.lock().unwrap()) {
                    stop.store(true, SeqCst);
                    break;
                }
                match s.recv_msg(&mut buf, RecvFlags::default()) {
                    Ok(m) => {
                        if let Some(from) = m.from {
                            let mut c = checker.lock().unwrap();
                            c.add(from, port, &buf[..m.len]);
                            if done(&c) {
                                stop.store(true, SeqCst);
                            }
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {}
                    Err(e) => {
                        checker.lock().unwrap().err(format!("recv on {port}: {}", errno_name(&e)));
                        break;
                    }
                }
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
}
