//! Socket fixtures (feature `sock`): engines on private 127.x addresses with
//! bound sockets, for the tests over real TCP (`tests`, `tools`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use rds_sock::{Engine, EngineConfig, RdsSocket};

/// A fresh 127.x.y.0/24 block per call, so tests in one binary can run in
/// parallel without sharing addresses. `group` separates test binaries.
pub fn addr_block(group: u8) -> impl Fn(u8) -> IpAddr + Copy + Send + 'static {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    move |host| IpAddr::V4(Ipv4Addr::new(127, group, n, host))
}

/// An engine with default settings.
pub fn engine() -> Engine {
    Engine::new(EngineConfig::default()).expect("engine")
}

pub fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Two engines, a socket on each: `a` bound to `ip(1):port` on `e1`, `b`
/// to `ip(2):port` on `e2`.
pub struct Pair {
    pub e1: Engine,
    pub e2: Engine,
    pub a: RdsSocket,
    pub b: RdsSocket,
}

/// A [`Pair`] with default settings.
pub fn pair(ip: impl Fn(u8) -> IpAddr, port: u16) -> Pair {
    let (e1, e2) = (engine(), engine());
    let a = e1.socket().unwrap();
    let b = e2.socket().unwrap();
    a.bind(sa(ip(1), port)).unwrap();
    b.bind(sa(ip(2), port)).unwrap();
    Pair { e1, e2, a, b }
}

/// Every engine `n` of `engines` serves `ip(n + 1)` with `per_node` sockets
/// bound to ports `port`, `port + 1`, ..., each set up by `setup` once
/// bound; the sockets and their addresses, engine by engine.
pub fn mesh(
    engines: &[Engine],
    ip: impl Fn(u8) -> IpAddr,
    per_node: usize,
    port: u16,
    setup: impl Fn(&RdsSocket),
) -> (Vec<Arc<RdsSocket>>, Vec<SocketAddr>) {
    let mut socks = Vec::new();
    let mut addrs = Vec::new();
    for (n, e) in engines.iter().enumerate() {
        for k in 0..per_node {
            let s = e.socket().unwrap();
            let a = sa(ip(n as u8 + 1), port + k as u16);
            s.bind(a).unwrap();
            setup(&s);
            socks.push(Arc::new(s));
            addrs.push(a);
        }
    }
    (socks, addrs)
}
