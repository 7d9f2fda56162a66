//! What every scenario uses: the context (our address, the kernel's), the
//! RESULT / INFO lines, the rig's barriers, shell commands, our sockets and
//! counters.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rds_sock::RdsSocket;

pub const SIZES: [usize; 5] = [0, 1, 4096, 65536, 1 << 20];
pub const BIG: usize = 4 << 20;

pub struct Ctx {
    pub me: IpAddr,
    pub peer: IpAddr,
}

impl Ctx {
    /// Whether we have the larger address: the side that kills single
    /// connections (`kill_one_when_all_up`; conform.py's `larger_side`).
    pub fn larger(&self) -> bool {
        self.me > self.peer
    }
}

pub fn result(scenario: &str, dir: &str, ok: bool, note: &str) {
    println!("RESULT {scenario} {dir} {} {note}", if ok { "PASS" } else { "FAIL" });
}

pub fn info(scenario: &str, text: &str) {
    println!("INFO {scenario} {text}");
}

/// Both guests reached `name` (the rig's barrier files in /vmrig/sync), or
/// false after `secs` or once the other side gave up on the scenario (the
/// run script writes `ABORT.<scenario>` when a side ends early).
pub fn barrier(name: &str, secs: u32) -> bool {
    let d = "/vmrig/sync";
    let me = std::env::var("VMRIG_NODE").unwrap_or_else(|_| "1".into());
    let nodes: u32 = std::env::var("VMRIG_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let sc = std::env::var("CONFORM_SC").unwrap_or_else(|_| "none".into());
    let _ = std::fs::write(format!("{d}/{name}.{me}"), b"");
    let end = Instant::now() + Duration::from_secs(u64::from(secs));
    while Instant::now() < end {
        if (1..=nodes).all(|k| std::path::Path::new(&format!("{d}/{name}.{k}")).exists()) {
            return true;
        }
        if std::path::Path::new(&format!("{d}/ABORT.{sc}")).exists() {
            info("barrier", &format!("{name}: the other side gave up"));
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    info("barrier", &format!("{name} timed out"));
    false
}

pub fn sh(cmd: &str) -> String {
    match Command::new("sh").arg("-c").arg(cmd).output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("sh: {e}"),
    }
}

pub fn errno_name(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

pub fn sock(ctx: &Ctx, port: u16, sndbuf: Option<usize>, rcvbuf: Option<usize>) -> io::Result<Arc<RdsSocket>> {
    let s = RdsSocket::new()?;
    if let Some(b) = sndbuf {
        s.set_send_buffer_size_force(b)?;
    }
    if let Some(b) = rcvbuf {
        s.set_recv_buffer_size_force(b)?;
    }
    s.bind(SocketAddr::new(ctx.me, port))?;
    Ok(Arc::new(s))
}

pub fn socks(ctx: &Ctx, ports: &[u16], buf: usize) -> Vec<Arc<RdsSocket>> {
    ports.iter().map(|p| sock(ctx, *p, Some(buf), Some(buf)).unwrap_or_else(|e| panic!("bind {p}: {e}"))).collect()
}

/// Waits until every socket's messages were acked by the kernel.
pub fn flush_all(socks: &[Arc<RdsSocket>], secs: u64) -> bool {
    socks.iter().all(|s| s.flush(Duration::from_secs(secs)))
}

/// A counter of the process's default engine (0 when it has none).
pub fn counter(name: &str) -> u64 {
    RdsSocket::new().map(|s| engine_counter(s.engine(), name)).unwrap_or(0)
}

/// A counter of `engine` by its `rds-info -c` name (0 when it has none).
pub fn engine_counter(engine: &rds_sock::Engine, name: &str) -> u64 {
    engine.counters().into_iter().find(|(k, _)| k == name).map_or(0, |(_, v)| v)
}
