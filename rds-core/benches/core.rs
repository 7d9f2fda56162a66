//! Messages per second through the sans-IO core alone: no I/O, no threads,
//! no clock but the one `Instant` the setup took.
//!
//! Two [`Node`]s (127.0.0.1 and 127.0.0.2, TCP caps, the default
//! `NodeConfig`) with their paths brought up by the test kit's in-memory
//! net, a bound socket on each. Then, by hand, what a transport does in the
//! steady state of a stream, one message of `size` bytes per step:
//!
//! `send` (with the caller's copy into a [`Payload`], as `RdsSocket::send`
//! does) -> drain the sender's outputs ([`driver::drain`]) -> `pull` the
//! kicked path -> `received` on the peer's path -> drain the receiver's
//! outputs -> `recv` on the receiving socket -> `acked` back on the sender
//! -> drain the sender's outputs.
//!
//! `batch16` does the same with 16 messages in flight, as the transport
//! does: 16 sends, one pull, 16 receives, one ack for the highest sequence.
//!
//! Before the timed runs it prints, once per size, the heap allocations per
//! message of each stage (a counting global allocator), so the hot path's
//! allocations can be named.
//!
//! `cargo bench -p rds-core` (under a minute); `-- --save-baseline NAME`
//! and `-- --baseline NAME` compare against an earlier run. On a loaded
//! machine, count instructions instead (see [`fixed_steps`]):
//! `RDS_CORE_BENCH_STEPS=20000 RDS_CORE_BENCH_CASE=stream/64 valgrind
//! --tool=cachegrind --cache-sim=no target/release/deps/core-*`, less the
//! same with 0 steps, over 20000 messages.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use rds_core::driver;
use rds_core::{
    Node, NodeConfig, Output, PathId, Payload, Received, RxMessage, SendOptions, SockId, SockOpt, TransportKind,
};
use rds_testkit::net::{Link, Net};

/// The system allocator, counting allocations (and reallocations).
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; the counter has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which
        // is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`,
        // with this `layout` (the caller's contract).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's, valid
        // for `layout.align()` by the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}

const SIZES: [usize; 3] = [64, 1024, 8192];
const BATCH: usize = 16;
/// The sender's send buffer and the receiver's receive buffer.
const BUF: u32 = 4 << 20;

/// Two nodes with a path up between them and a bound socket on each.
struct Pair {
    nodes: [Node; 2],
    /// Node 0's socket (the sender) and node 1's (the receiver).
    socks: [SockId; 2],
    /// Where node 0 sends: node 1's socket.
    dst: SocketAddr,
    /// Each node's paths: the connection instance and the peer's end.
    links: HashMap<(usize, PathId), Link>,
    /// Reused buffers, as a transport keeps them.
    outs: Vec<Output>,
    tx: Vec<rds_core::TxMessage>,
    /// The payload the sender's application hands in.
    data: Vec<u8>,
    opts: SendOptions,
}

impl Pair {
    fn new(size: usize) -> Pair {
        let cfg = |i: u32| NodeConfig { gen_num: 100 + i, seed: u64::from(i), ..NodeConfig::default() };
        let mut net = Net::with_configs(vec![cfg(0), cfg(1)], TransportKind::Tcp);
        let a = net.bound(0, 4000);
        let b = net.bound(1, 5000);
        let dst = SocketAddr::new(net.addrs[1], 5000);
        // Room for 16 messages of 8 KiB in flight on either side.
        net.nodes[0].setsockopt(a, SockOpt::SndBufForce(BUF)).expect("SO_SNDBUFFORCE");
        net.nodes[1].setsockopt(b, SockOpt::RcvBufForce(BUF)).expect("SO_RCVBUFFORCE");
        // The first message connects: handshake, probes and maps are served
        // by the net until it is quiet.
        net.send(0, a, dst, b"hello").expect("first send");
        net.run();
        match net.nodes[1].recv(b, false) {
            Ok(Received::Data(_)) => {}
            other => panic!("the first message did not arrive: {other:?}"),
        }
        net.run();
        let Net { nodes, links, .. } = net;
        let nodes: [Node; 2] = nodes.try_into().unwrap_or_else(|_| unreachable!("two nodes"));
        Pair {
            nodes,
            socks: [a, b],
            dst,
            links,
            outs: Vec::new(),
            tx: Vec::new(),
            data: vec![0x5a; size],
            opts: SendOptions::default(),
        }
    }

    /// `n` sends on node 0; returns the path kicked.
    fn send(&mut self, n: usize) -> PathId {
        for _ in 0..n {
            let p = Payload::copy_from(&self.data);
            self.nodes[0].send(self.socks[0], Some(self.dst), &p, &self.opts).expect("send");
        }
        self.kicked(0).expect("a send kicks its path")
    }

    /// Drains node `i`'s outputs; returns the last path kicked. Wakes are
    /// what a driver hands its sockets: nothing to do here.
    fn kicked(&mut self, i: usize) -> Option<PathId> {
        self.outs.clear();
        let Ok(_) = driver::drain(&mut self.nodes[i], &mut self.outs);
        let mut kick = None;
        for o in &self.outs {
            match o {
                Output::Kick(p) => kick = Some(p.id),
                Output::Wake(_) => {}
                other => panic!("unexpected output in the steady state: {other:?}"),
            }
        }
        kick
    }

    /// One pull of node 0's path, every message received on node 1 and
    /// read from its socket, then one ack back for the highest sequence.
    fn carry(&mut self, p: PathId, n: usize) {
        let link = self.links[&(0, p)];
        self.tx.clear();
        let more = self.nodes[0].pull(p, link.inst, 1 << 20, &mut self.tx);
        assert!(!more && self.tx.len() == n, "one pull takes the {n} messages");
        let mut last = 0;
        for m in self.tx.drain(..) {
            last = m.header.sequence;
            let rx = RxMessage::new(m.header, m.payload);
            black_box(self.nodes[1].received(link.peer_path, link.peer_inst, rx));
        }
        assert!(self.kicked(1).is_none(), "the receiver has nothing to send");
        for _ in 0..n {
            match self.nodes[1].recv(self.socks[1], false) {
                Ok(Received::Data(d)) => {
                    black_box(d);
                }
                other => panic!("expected data, got {other:?}"),
            }
        }
        self.nodes[0].acked(p, link.inst, last);
        assert!(self.kicked(0).is_none(), "nothing left to send");
    }

    /// One step of the stream: `n` messages from node 0 to node 1's socket.
    fn step(&mut self, n: usize) {
        let p = self.send(n);
        self.carry(p, n);
    }

    /// Allocations per message of each stage over `steps` steps of `n`.
    fn count_allocs(&mut self, n: usize, steps: usize) -> [f64; 6] {
        let mut c = [0u64; 6];
        let link = |s: &Pair, p: PathId| s.links[&(0, p)];
        for _ in 0..steps {
            for _ in 0..n {
                let t = allocs();
                let p = Payload::copy_from(&self.data);
                let u = allocs();
                c[0] += u - t;
                self.nodes[0].send(self.socks[0], Some(self.dst), &p, &self.opts).expect("send");
                c[1] += allocs() - u;
            }
            let u = allocs();
            let p = self.kicked(0).expect("kicked");
            let l = link(self, p);
            self.tx.clear();
            self.nodes[0].pull(p, l.inst, 1 << 20, &mut self.tx);
            c[2] += allocs() - u;
            let u = allocs();
            let mut last = 0;
            for m in self.tx.drain(..) {
                last = m.header.sequence;
                let rx = RxMessage::new(m.header, m.payload);
                self.nodes[1].received(l.peer_path, l.peer_inst, rx);
            }
            self.kicked(1);
            c[3] += allocs() - u;
            let u = allocs();
            for _ in 0..n {
                black_box(self.nodes[1].recv(self.socks[1], false).expect("recv"));
            }
            c[4] += allocs() - u;
            let u = allocs();
            self.nodes[0].acked(p, l.inst, last);
            self.kicked(0);
            c[5] += allocs() - u;
        }
        c.map(|x| x as f64 / (n * steps) as f64)
    }
}

/// Prints the allocations per message, once per size and mode.
fn report_allocs() {
    const STAGES: [&str; 6] = ["copy", "send", "pull", "received", "recv", "acked"];
    for size in SIZES {
        for n in [1, BATCH] {
            let mut pair = Pair::new(size);
            // Warm up: queues and maps reach their steady capacity.
            for _ in 0..1000 {
                pair.step(n);
            }
            let per = pair.count_allocs(n, 10_000 / n);
            let total: f64 = per.iter().sum();
            let stages: Vec<String> = STAGES.iter().zip(per).map(|(s, a)| format!("{s} {a:.2}")).collect();
            println!("allocs/msg size {size} x{n}: {total:.2} ({})", stages.join(", "));
        }
    }
}

fn bench(c: &mut Criterion) {
    report_allocs();
    for (name, n) in [("stream", 1), ("batch16", BATCH)] {
        let mut g = c.benchmark_group(name);
        g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
        for size in SIZES {
            g.throughput(Throughput::Elements(n as u64));
            let mut pair = Pair::new(size);
            g.bench_with_input(BenchmarkId::from_parameter(size), &n, |b, &n| b.iter(|| pair.step(n)));
        }
        g.finish();
    }
}

/// `RDS_CORE_BENCH_STEPS=N [RDS_CORE_BENCH_CASE=stream/64]`: no
/// criterion, `N` steps of each case (or of the one named) after the
/// warm-up, for a count of instructions that the machine's load does not
/// change: `valgrind --tool=cachegrind --cache-sim=no` of two runs, with N
/// and with 0 steps; the difference over the messages sent is the
/// instructions per message.
fn fixed_steps(steps: usize, case: Option<&str>) {
    for (name, n) in [("stream", 1), ("batch16", BATCH)] {
        for size in SIZES {
            if case.is_some_and(|c| c != format!("{name}/{size}")) {
                continue;
            }
            let mut pair = Pair::new(size);
            for _ in 0..1000 {
                pair.step(n);
            }
            for _ in 0..steps {
                pair.step(n);
            }
            println!("{name}/{size}: {} messages after the warm-up", steps * n);
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    if let Some(steps) = std::env::var("RDS_CORE_BENCH_STEPS").ok().and_then(|s| s.parse().ok()) {
        fixed_steps(steps, std::env::var("RDS_CORE_BENCH_CASE").ok().as_deref());
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
