//! `batches`: a stream of 8 KiB messages from us to the kernel, written in
//! batches of about 64 KiB (rds-tcp's "Batches of mid-size messages"):
//! several whole messages in one `sendmsg`, so one TCP segment carries
//! many RDS frames. The kernel parses any framing of the byte stream, but
//! the batches are ours to prove: the kernel receives every message,
//! exact and in order (its side, `conform.py`), and our engine's
//! `tcp_tx_batch_full` says the stream was batched.
//!
//! Batching starts only where a transmit costs at least the coalescing
//! window's floor (`rds_tcp::TcpConfig::coalesce`, 20 µs by default);
//! this scenario's engine has a floor of 1 µs, so that it does whatever
//! the guest's speed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rds_sock::{Engine, EngineConfig};

use crate::common::{BIG, Ctx, barrier, engine_counter, errno_name, info, result};
use crate::flows::{flow_id, payload};

/// Our sending socket's port and the kernel's receiving one.
const OUR_PORT: u16 = 5101;
const KERNEL_PORT: u16 = 6101;
/// Messages in the stream, and their size (`conform.py` expects the same).
const COUNT: u64 = 2000;
const SIZE: usize = 8192;

pub fn sc_batches(ctx: &Ctx) {
    let mut cfg = EngineConfig::default();
    cfg.tcp.coalesce = Duration::from_micros(1);
    let engine = Engine::new(cfg).expect("engine");
    let s = engine.socket().expect("socket");
    s.set_send_buffer_size_force(BIG).expect("SO_SNDBUF");
    s.bind(SocketAddr::new(ctx.me, OUR_PORT)).expect("bind");
    let count = |name: &str| engine_counter(&engine, name);
    let batches = || count("tcp_tx_batch_full");
    let flow = flow_id(OUR_PORT, KERNEL_PORT);
    // The messages first, so the stream's pace is the sends'.
    let msgs: Vec<Vec<u8>> = (0..COUNT).map(|i| payload(flow, i, SIZE)).collect();
    barrier("bt-ready", 120);
    // The connection up and idle before the stream: after an earlier
    // scenario's process the kernel may take a while to connect to this
    // one (its address the smaller), and the stream's first sends then
    // wait in the queue, which the reactor writes in long runs once the
    // connection is up (batched too, but not the sends' own batches this
    // scenario counts). One message to a kernel port nobody reads (its TCP
    // acks it, its RDS drops it), acked, and a moment for the multipath
    // handshake.
    let warm = SocketAddr::new(ctx.peer, KERNEL_PORT + 1);
    let warmed = s.send_to(b"warm-up", warm).is_ok() && s.flush(Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let before = batches();
    let coalesced = count("tcp_tx_coalesced");
    let t0 = Instant::now();
    let mut error = None;
    let mut sent = 0;
    for m in &msgs {
        if let Err(e) = s.send_to(m, SocketAddr::new(ctx.peer, KERNEL_PORT)) {
            error = Some(errno_name(&e));
            break;
        }
        sent += 1;
    }
    let acked = s.flush(Duration::from_secs(60));
    let written = batches() - before;
    let secs = t0.elapsed().as_secs_f64();
    info(
        "batches",
        &format!(
            "we sent {sent} messages of {SIZE} B in {secs:.2} s, {written} of them completed a batch, {} were \
             held for one (tcp_tx_coalesced); the warm-up message {}",
            count("tcp_tx_coalesced") - coalesced,
            if warmed { "was acked" } else { "was NOT acked" }
        ),
    );
    result(
        "batches",
        "us->kernel",
        error.is_none() && acked && written > 0,
        &format!(
            "{sent}/{COUNT} messages of {SIZE} B sent and {}, {written} batches of about 64 KiB written \
             (tcp_tx_batch_full){}",
            if acked { "all acked" } else { "NOT all acked" },
            error.map_or(String::new(), |e| format!("; send: {e}"))
        ),
    );
    barrier("bt-done", 180);
}
