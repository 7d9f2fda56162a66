//! Floods to a socket that never reads: held back by receive flow control, never dropped.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rds_core::recv::{RCV_HARD_FLOOR, RCV_MSG_OVERHEAD};
use rds_core::wire::{HEADER_LEN, Header, RDS_TCP_PORT};
use rds_sock::{EngineConfig, RecvFlags};
use rds_tests::*;

use super::bed::*;

/// A flood of valid messages to a socket that never reads: once the
/// socket holds its hard receive cap, the node stops reading the flood's
/// path (the TCP window closes, the writer blocks) instead of dropping
/// what our TCP acked (it used to drop and count `recv_drop_over_limit`);
/// memory stays bounded and the honest peer is served meanwhile. Then the
/// application reads: the path resumes and every message arrives exactly
/// once, in order.
#[test]
fn flood_to_a_socket_that_never_reads_is_held_back_not_dropped() {
    let _g = serial();
    let bed = Bed::new("flood");
    const MSG: usize = 64 << 10;
    const COUNT: u64 = 5120; // 320 MiB
    let cfg = EngineConfig::default();
    let rcvbuf = bed.node.sockets().into_iter().find(|s| s.bound == Some(sa(bed.node_ip, TARGET))).unwrap().rcvbuf;
    let cap = (u64::from(rcvbuf / 2) * u64::from(cfg.node.rcv_hard_factor.max(1))).max(RCV_HARD_FLOOR);
    let per = MSG as u64 + RCV_MSG_OVERHEAD;
    assert!(COUNT * per > cap + (32 << 20), "the flood must exceed the cap");

    let before = bed.counts();
    let rss0 = rss();
    let raw = bed.raw();
    let mut w = raw.s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(120))).unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || -> io::Result<()> {
            let mut batch = Vec::with_capacity(16 * (HEADER_LEN + MSG));
            let mut i = 0;
            while i < COUNT {
                batch.clear();
                for k in i..(i + 16).min(COUNT) {
                    batch.extend_from_slice(&frame(
                        Header::data(SPORT, TARGET, MSG as u32),
                        k + 1,
                        &payload(5, k, MSG),
                    ));
                }
                w.write_all(&batch)?;
                i = (i + 16).min(COUNT);
                written.store(i, Ordering::SeqCst);
            }
            Ok(())
        })
    };
    // The node pauses the path, the writer blocks: the queue stops growing.
    let (queued, bytes) = bed.held_back(&before);
    let held_writer = written.load(Ordering::SeqCst);
    let grew = rss().saturating_sub(rss0);
    let honest0 = bed.traffic.as_ref().unwrap().done.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    let honest = bed.traffic.as_ref().unwrap().done.load(Ordering::SeqCst) - honest0;
    let row = bed.conn_of(raw.local()).expect("the flood's connection");
    println!(
        "flood: paused with {queued} messages of {MSG} bytes queued ({bytes} bytes, hard cap {cap}), the writer blocked \
         after {held_writer} of {COUNT}; memory grew by {} MiB; {honest} honest round trips in 300 ms while paused",
        grew >> 20
    );
    assert!(!writer.is_finished() && held_writer < COUNT, "the writer was never held back");
    assert!(row.detail.split_whitespace().any(|kv| kv == "rx_paused=true"), "{}", row.detail);
    // The cap, plus what the transport had read (one batch: 4 MiB).
    let held = bytes + queued as u64 * RCV_MSG_OVERHEAD;
    assert!(held > cap && held <= cap + (8 << 20), "{held} bytes held, cap {cap}");
    assert_eq!(bytes, queued as u64 * MSG as u64);
    assert!(grew < 400 << 20, "memory grew by {grew} bytes");
    assert!(honest >= 10, "the honest peer was not served while the flood was held ({honest} round trips)");
    // The application reads: everything, once, in order.
    let (got, _) = read_all(&bed.target, sa(bed.hostile, SPORT), 5, 0, COUNT);
    assert_eq!(got, COUNT * MSG as u64);
    writer.join().unwrap().expect("the flood's writer");
    let after = bed.counts();
    assert_eq!(after.delta(&before, "recv_drop_over_limit"), 0);
    assert!(after.delta(&before, "recv_resume") >= 1);
    assert_eq!(after.delta(&before, "conn_reset"), 0, "the flood's connection was reset");
    assert_eq!(after.delta(&before, "recv_drop_bad_frame"), 0);
    assert!(after.delta(&before, "recv_queued") >= COUNT);
    bed.close(raw);
    bed.valid_again(7);
    bed.finish();
}

/// A flood of tiny messages (8 bytes: their index) to a socket that never
/// reads. Each queued message costs about 200 bytes of memory for 56 on
/// the wire; the hard receive cap counts a per-message overhead
/// (`rds_core::recv::RCV_MSG_OVERHEAD`) besides payload bytes, so the node
/// pauses the path at about a million messages queued, and resumes it as
/// the application reads: all 1.5 million arrive, once, in order (they
/// used to be dropped beyond the cap). The 6.1 kernel bounds nothing on
/// receive (docs/kernel-facts.md §8).
#[test]
fn flood_of_tiny_messages_is_held_back_not_dropped() {
    let _g = serial();
    let bed = Bed::new("tiny flood");
    const COUNT: u64 = 1_500_000;
    const BATCH: u64 = 4096;
    let before = bed.counts();
    let rss0 = rss();
    let raw = bed.raw();
    let mut w = raw.s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(120))).unwrap();
    let writer = std::thread::spawn(move || -> io::Result<()> {
        let mut batch = Vec::with_capacity(BATCH as usize * (HEADER_LEN + 8));
        let mut i = 0;
        while i < COUNT {
            batch.clear();
            for k in i..(i + BATCH).min(COUNT) {
                batch.extend_from_slice(&frame(Header::data(SPORT, TARGET, 8), k + 1, &k.to_le_bytes()));
            }
            w.write_all(&batch)?;
            i = (i + BATCH).min(COUNT);
        }
        Ok(())
    });
    let (queued, bytes) = bed.held_back(&before);
    let grew = rss().saturating_sub(rss0);
    println!(
        "tiny flood: paused with {queued} messages queued ({bytes} payload bytes); memory grew by {} MiB",
        grew >> 20
    );
    let cap = RCV_HARD_FLOOR / (8 + RCV_MSG_OVERHEAD);
    assert!((queued as u64) > cap && (queued as u64) < cap + 2 * 4096 + 1024, "{queued} queued, cap {cap} messages");
    assert!((queued as u64) < COUNT && !writer.is_finished(), "the writer was never held back");
    assert!(grew < 600 << 20, "memory grew by {} MiB for {queued} messages queued", grew >> 20);
    // Everything, once, in order.
    bed.target.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 64];
    for i in 0..COUNT {
        let m = bed.target.recv_msg(&mut buf, RecvFlags::default()).unwrap_or_else(|e| panic!("message {i}: {e}"));
        assert_eq!((m.len, u64::from_le_bytes(buf[..8].try_into().unwrap())), (8, i), "message {i}");
    }
    let more = bed.target.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() });
    assert_eq!(more.map(|m| m.len).unwrap_err().raw_os_error(), Some(libc::EAGAIN), "more messages than sent");
    writer.join().unwrap().expect("the flood's writer");
    let after = bed.counts();
    assert_eq!(after.delta(&before, "recv_drop_over_limit"), 0);
    assert_eq!(after.delta(&before, "conn_reset"), 0, "the flood's connection was reset");
    bed.close(raw);
    bed.valid_again(8);
    bed.finish();
}

/// A flood held back by a paused path, then the flooding peer resets its
/// connection: the node still notices (the reset comes as an error event,
/// which reads even a paused path to its end), delivers everything its TCP
/// had taken, once and in order, and reports the connection down.
#[test]
fn a_paused_path_still_sees_the_peers_reset() {
    let _g = serial();
    let bed = Bed::new("reset while paused");
    const MSG: usize = 64 << 10;
    const COUNT: u64 = 5120;
    let before = bed.counts();
    // No reader: what the node sends stays unread, so our close resets.
    let s = tcp_from(bed.hostile, sa(bed.node_ip, RDS_TCP_PORT), false).unwrap();
    s.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut s = s;
            let until = Instant::now() + Duration::from_secs(120);
            let mut k = 0;
            let mut pending: Vec<u8> = Vec::new();
            let mut off = 0;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                if off == pending.len() {
                    if k == COUNT {
                        break;
                    }
                    pending = frame(Header::data(SPORT, TARGET, MSG as u32), k + 1, &payload(6, k, MSG));
                    off = 0;
                    k += 1;
                }
                match s.write(&pending[off..]) {
                    Ok(n) => off += n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                        ) => {}
                    Err(e) => panic!("writer: {e}"),
                }
                if off == pending.len() {
                    written.store(k, Ordering::SeqCst);
                }
            }
            let linger = libc::linger { l_onoff: 1, l_linger: 0 };
            let len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
            // SAFETY: `linger` is a struct linger of `len` bytes; the
            // descriptor is `s`'s, open here.
            let r = unsafe {
                libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, (&raw const linger).cast(), len)
            };
            assert_eq!(r, 0, "SO_LINGER");
            drop(s);
        })
    };
    let paused = wait_until(Duration::from_secs(60), || bed.counts().delta(&before, "recv_pause") >= 1);
    assert!(paused, "the node never paused the flood's path ({:?} queued)", bed.queued(TARGET));
    assert!(wait_until(Duration::from_secs(30), || {
        let w = written.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
        w == written.load(Ordering::SeqCst)
    }));
    let (queued, _) = bed.queued(TARGET);
    let sent = written.load(Ordering::SeqCst);
    assert!(sent < COUNT, "the writer was never held back");
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let seen = wait_delta(&bed.node, &before, "conn_reset", 1);
    assert_eq!(seen, 1, "the paused path did not notice the peer's reset");
    // Everything the node's TCP took: a prefix of what was written, once
    // and in order (the partial message at the reset is discarded).
    let (n, _) = bed.queued(TARGET);
    println!("reset while paused: {queued} queued when paused, {sent} messages written, {n} delivered after the reset");
    assert!(n >= queued && (n as u64) <= sent, "{n} delivered, {queued} queued at the pause, {sent} written");
    read_all(&bed.target, sa(bed.hostile, SPORT), 6, 0, n as u64);
    let after = bed.counts();
    assert_eq!(after.delta(&before, "recv_drop_over_limit"), 0);
    assert_eq!(after.delta(&before, "recv_drop_bad_frame"), 0);
    bed.valid_again(10);
    bed.finish();
}
