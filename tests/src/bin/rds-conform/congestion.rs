//! `congestion`: congestion maps both ways (a receiver that does not read
//! makes the sender's port congested until it drains).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Ctx, barrier, counter, errno_name, result, sock};
use crate::flows::{FlowChecker, end_msg, flow_id, payload, receive_all};

fn cong_size(_: u32, _: u64) -> usize {
    4096
}

pub fn sc_congestion(ctx: &Ctx) {
    // A: we send to a kernel socket that does not read.
    let us = sock(ctx, 7002, None, None).expect("bind");
    let dst = SocketAddr::new(ctx.peer, 7001);
    let flow = flow_id(7002, 7001);
    barrier("cong-a-ready", 60);
    us.set_nonblocking(true).unwrap();
    let (mut i, mut saw) = (0u64, false);
    let reordered_start = counter("cong_update_reordered");
    let stale_start = counter("cong_update_stale");
    let t0 = Instant::now();
    let mut other = None;
    while t0.elapsed() < Duration::from_secs(30) && i < 20000 {
        match us.send_to(&payload(flow, i, 4096), dst) {
            Ok(_) => i += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                saw = true;
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                other = Some(errno_name(&e));
                break;
            }
        }
    }
    let n_nonblock = i;
    // A kernel sends each map update on whichever path transmits first; we
    // apply them in the order they arrived where the receive times say it,
    // and drop one that arrived before the map applied last
    // (`cong_update_stale`); two close together on two paths whose times
    // do not order them keep a port congested only if both say so
    // (`Node::map_order`, `cong_update_reordered`): printed, as such a pair
    // can leave the port uncongested here while the reader stalls.
    let reordered_before = counter("cong_update_reordered");
    let stale_before = counter("cong_update_stale");
    us.set_nonblocking(false).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let us = us.clone();
        std::thread::spawn(move || {
            let r = us.send_to(&payload(flow, n_nonblock, 4096), dst);
            let _ = tx.send((r.map_err(|e| errno_name(&e)), Instant::now()));
        });
    }
    std::thread::sleep(Duration::from_millis(1500));
    // What the send returned before the reader drained, if it returned.
    let early = rx.try_recv();
    let blocked = matches!(early, Err(std::sync::mpsc::TryRecvError::Empty));
    let reordered = counter("cong_update_reordered") - reordered_before;
    let stale = counter("cong_update_stale") - stale_before;
    let t_drain = Instant::now();
    barrier("cong-a-drain", 90);
    let done = match early {
        Ok(v) => Ok(v),
        Err(_) => rx.recv_timeout(Duration::from_secs(60)),
    };
    let completed = matches!(done, Ok((Ok(_), _)));
    let after = done.as_ref().map(|(_, t)| t.saturating_duration_since(t_drain).as_secs_f64()).unwrap_or(0.0);
    let sent = n_nonblock + u64::from(completed);
    let end_ok = completed && us.send_to(&end_msg(sent), dst).is_ok();
    let acked = us.flush(Duration::from_secs(30));
    let reorders = format!(
        "; our cong_update_reordered +{} and cong_update_stale +{} during the non-blocking sends, +{reordered} and +{stale} while the blocking one waited",
        reordered_before - reordered_start,
        stale_before - stale_start
    );
    result(
        "congestion",
        "us->kernel",
        saw && blocked && completed && end_ok && acked,
        &format!(
            "our sender: {}; {}{}{}",
            if saw {
                format!("ENOBUFS after {n_nonblock} x 4 KiB non-blocking")
            } else {
                format!("no ENOBUFS ({})", other.unwrap_or_else(|| "timeout".into()))
            },
            if blocked { "blocking send blocked >= 1.5 s" } else { "blocking send did NOT block" },
            if completed && blocked {
                format!(", completed {after:.2} s after the reader started draining")
            } else if completed {
                ", completed before the reader drained".to_string()
            } else {
                format!(", did not complete ({done:?})")
            },
            reorders
        ),
    );
    barrier("cong-a-done", 90);

    // B: the kernel sends to our socket that does not read.
    let ur = sock(ctx, 7011, None, None).expect("bind");
    ur.set_recv_buffer_size(16384).unwrap();
    let flow = flow_id(7012, 7011);
    barrier("cong-b-ready", 60);
    let rcv_before = counter("cong_update_queued");
    barrier("cong-b-drain", 90);
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, cong_size)));
    receive_all(
        std::slice::from_ref(&ur),
        &checker,
        move |c| c.ended(&[flow]),
        Instant::now() + Duration::from_secs(60),
    );
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&[flow], None);
    let maps = counter("cong_update_queued") - rcv_before;
    result(
        "congestion",
        "kernel->us",
        ok,
        &format!(
            "our reader (SO_RCVBUF 16 KiB) drained {} messages after the stall, exact and in order ({maps} map updates queued while draining){}",
            c.count,
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    barrier("cong-b-done", 90);
}
