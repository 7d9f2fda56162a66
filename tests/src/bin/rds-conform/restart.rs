//! `restart-a` / `restart-b`: a node restarted under the same address; the
//! new one must never see a message sent to the old one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Ctx, barrier, counter, errno_name, info, result, sock};
use crate::flows::{FlowChecker, flow_id, index_of, payload, receive_all};

const RS_EPOCH2: u64 = 100_000;

fn rs_size(_: u32, _: u64) -> usize {
    1024
}

/// The first process of the restart scenario: exchanges 100 messages each
/// way with the kernel, then stops itself (SIGSTOP) so that the kernel's
/// next messages pile up unacked; the run script kills it (SIGKILL).
pub fn sc_restart_a(ctx: &Ctx) {
    let rx = sock(ctx, 7100, None, None).expect("bind");
    let tx = sock(ctx, 7101, None, None).expect("bind");
    let (f_in, f_out) = (flow_id(7200, 7100), flow_id(7101, 7201));
    barrier("rs-1", 120);
    for i in 0..100 {
        tx.send_to(&payload(f_out, i, 1024), SocketAddr::new(ctx.peer, 7201)).expect("send");
    }
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, rs_size)));
    let expect: HashMap<u32, u64> = [(f_in, 100)].into();
    let e2 = expect.clone();
    receive_all(
        std::slice::from_ref(&rx),
        &checker,
        move |c| c.complete(&e2),
        Instant::now() + Duration::from_secs(60),
    );
    let acked = tx.flush(Duration::from_secs(30));
    let (ok, note) = checker.lock().unwrap().verdict(&[f_in], Some(&expect));
    info(
        "restart",
        &format!("first process: epoch 1 received {} ({note}), sent all acked: {acked}", if ok { "ok" } else { "BAD" }),
    );
    barrier("rs-2", 60);
    // Stop: our TCP stops reading, the kernel's next burst stays unacked.
    // SAFETY: raise() with a valid signal number.
    unsafe { libc::raise(libc::SIGSTOP) };
    // Never continued: the run script kills us.
    std::thread::sleep(Duration::from_secs(600));
}

/// The restarted process: must never see a message sent to the first one.
pub fn sc_restart_b(ctx: &Ctx) {
    let rx = sock(ctx, 7100, None, None).expect("bind");
    let tx = sock(ctx, 7101, None, None).expect("bind");
    let (f_in, f_out) = (flow_id(7200, 7100), flow_id(7101, 7201));
    barrier("rs-6", 120);
    let sender = {
        let (tx, peer) = (tx.clone(), ctx.peer);
        std::thread::spawn(move || -> Result<(), String> {
            for k in 0..100 {
                tx.send_to(&payload(f_out, RS_EPOCH2 + k, 1024), SocketAddr::new(peer, 7201))
                    .map_err(|e| errno_name(&e))?;
            }
            Ok(())
        })
    };
    let stale = Arc::new(AtomicU64::new(0));
    let mut checker = FlowChecker::new(ctx.peer, rs_size);
    checker.next.insert(f_in, RS_EPOCH2);
    let checker = Arc::new(Mutex::new(checker));
    rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = vec![0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut done_at = None;
    let mut stale_idx = Vec::new();
    while Instant::now() < deadline && done_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(2)) {
        match rx.recv_from(&mut buf) {
            Ok((n, from)) => {
                let d = &buf[..n];
                if index_of(d).is_some_and(|i| i < RS_EPOCH2) {
                    stale.fetch_add(1, SeqCst);
                    if stale_idx.len() < 5 {
                        stale_idx.push(index_of(d).unwrap());
                    }
                    continue;
                }
                let mut c = checker.lock().unwrap();
                c.add(from, 7100, d);
                if c.next.get(&f_in).copied() == Some(RS_EPOCH2 + 100) && done_at.is_none() {
                    done_at = Some(Instant::now());
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {}
            Err(e) => {
                checker.lock().unwrap().err(format!("recv: {}", errno_name(&e)));
                break;
            }
        }
    }
    let sent = sender.join().unwrap_or_else(|_| Err("panic".into()));
    let acked = tx.flush(Duration::from_secs(30));
    let expect: HashMap<u32, u64> = [(f_in, RS_EPOCH2 + 100)].into();
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&[f_in], Some(&expect));
    let n_stale = stale.load(SeqCst);
    let dropped = counter("recv_drop_stale");
    result(
        "restart",
        "kernel->us",
        ok && n_stale == 0,
        &format!(
            "restarted process: {}/100 new messages exact and in order, {n_stale} stale messages delivered{} \
             (our recv_drop_stale {dropped}, recv_drop_old_seq {}){}",
            c.count,
            if stale_idx.is_empty() { String::new() } else { format!(" (indexes {stale_idx:?})") },
            counter("recv_drop_old_seq"),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    result(
        "restart",
        "us->kernel",
        sent.is_ok() && acked,
        &format!(
            "restarted process sent 100, {}{}",
            if acked { "all acked" } else { "NOT all acked" },
            sent.err().map(|e| format!("; {e}")).unwrap_or_default()
        ),
    );
    barrier("rs-7", 120);
}
