//! Shared helpers of the integration tests: nodes on private loopback
//! addresses, deterministic payloads, and flow bookkeeping.

pub mod sim;

use std::net::{IpAddr, SocketAddr};

use rds_core::wire::Header;
use rds_sock::{Engine, RdsSocket};
use socket2::{Domain, SockAddr, Socket, Type};

/// Socket fixtures (from the test kit): address blocks, engines, a pair of
/// engines with a bound socket each, a mesh of engines with bound sockets.
pub use rds_testkit::sock::{Pair, addr_block, engine, mesh, pair, sa};

/// The value of an engine's counter `name`; panics naming an unknown one.
pub fn counter(e: &Engine, name: &str) -> u64 {
    e.counters().into_iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no counter {name}")).1
}

/// Polls `f` every 5 ms for at most `within`; returns whether it held.
pub fn wait_until(within: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Resident memory of a process (`"self"` or a pid), bytes; 0 once it is
/// gone.
pub fn rss_of(pid: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// Resident memory of this process, bytes.
pub fn rss() -> u64 {
    let r = rss_of("self");
    assert!(r > 0, "no VmRSS in /proc/self/status");
    r
}

/// One message as a hand-made peer frames it on an RDS-TCP stream: the
/// header with sequence `seq`, then the payload.
pub fn frame(mut h: Header, seq: u64, payload: &[u8]) -> Vec<u8> {
    h.sequence = seq;
    let mut v = h.to_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

/// A raw TCP connection from address `from` (any port) to `to`, as a
/// hostile or hand-made peer makes it. With `nonblocking` the socket is
/// non-blocking and the connect may still be under way (a flood does not
/// wait for each handshake); otherwise it is established.
pub fn tcp_from(from: IpAddr, to: SocketAddr, nonblocking: bool) -> std::io::Result<std::net::TcpStream> {
    let s = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    s.bind(&SockAddr::from(SocketAddr::new(from, 0)))?;
    s.set_nonblocking(nonblocking)?;
    loop {
        match s.connect(&SockAddr::from(to)) {
            Ok(()) => break,
            Err(e) if nonblocking && e.raw_os_error() == Some(libc::EINPROGRESS) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(s.into())
}

/// The one seeded RNG of the test layers (rds-core's, through the test
/// kit): payload filler, message sizes, random test inputs.
pub use rds_testkit::Rng;

/// Fills `buf` with bytes determined by `seed`.
pub fn fill(seed: u64, buf: &mut [u8]) {
    let mut s = Rng::new(seed);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&s.next_u64().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = s.next_u64().to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// A payload that names its flow and index, then deterministic filler:
/// `[flow u32][index u64][len u32][filler]`. Payloads under 16 bytes are
/// pure filler (their flow is checked by source address and order).
pub fn payload(flow: u32, index: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let seed = (u64::from(flow) << 40) ^ index;
    if len >= 16 {
        v[..4].copy_from_slice(&flow.to_le_bytes());
        v[4..12].copy_from_slice(&index.to_le_bytes());
        v[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        fill(seed, &mut v[16..]);
    } else {
        fill(seed, &mut v);
    }
    v
}

/// Checks a received payload against what `payload(flow, index, len)` sent.
pub fn check_payload(flow: u32, index: u64, got: &[u8]) -> Result<(), String> {
    let want = payload(flow, index, got.len());
    if got.len() >= 16 {
        let f = u32::from_le_bytes(got[..4].try_into().unwrap());
        let i = u64::from_le_bytes(got[4..12].try_into().unwrap());
        let l = u32::from_le_bytes(got[12..16].try_into().unwrap());
        if (f, i, l as usize) != (flow, index, got.len()) {
            return Err(format!(
                "flow {flow}: expected index {index} len {}, got flow {f} index {i} len {l}",
                got.len()
            ));
        }
    }
    if got != want.as_slice() {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("flow {flow} index {index}: payload differs at byte {at} of {}", got.len()));
    }
    Ok(())
}

/// Message sizes for the stress tests, 0 B to `max` (1 MiB): log-uniform up
/// to 64 KiB for most messages, 1 in 100 uniform between 64 KiB and `max`,
/// and the edges (0, 1, 48, 4096, `max`) forced regularly. Every order of
/// magnitude is exercised; the mean stays near 12 KB, so 100,000 messages
/// are about 1.2 GB.
pub fn size(s: &mut Rng, max: usize) -> usize {
    match s.below(100) {
        0 => 0,
        1 => 1,
        2 => 48,
        3 => 4096,
        4 => max,
        5 => (64 << 10) + s.below((max - (64 << 10)) as u64 + 1) as usize,
        _ => {
            let bits = s.below(17) as u32; // 2^0 .. 2^16
            s.below((1u64 << bits) + 1) as usize
        }
    }
}

/// The all-to-all plan of `socks` sockets: the `k`-th datagram of socket
/// `src` goes round robin to the other sockets; returns its destination and
/// its index in the flow `src -> dst`.
pub fn all_to_all_plan(socks: usize, src: usize, k: usize) -> (usize, u64) {
    let dst = (src + 1 + k % (socks - 1)) % socks;
    (dst, (k / (socks - 1)) as u64)
}

/// How many datagrams each socket gets from each other socket when every
/// one sends `per_sock` by [`all_to_all_plan`]: `[dst][src]`.
pub fn all_to_all_counts(socks: usize, per_sock: usize) -> Vec<Vec<u64>> {
    let mut expect = vec![vec![0u64; socks]; socks];
    for src in 0..socks {
        for k in 0..per_sock {
            expect[all_to_all_plan(socks, src, k).0][src] += 1;
        }
    }
    expect
}

/// What the all-to-all tests set on every socket: 1 MiB datagrams need a
/// send buffer above 2 MiB (half of it counts), and 60 s timeouts.
pub fn set_up_for_1mib(s: &RdsSocket) {
    s.set_send_buffer_size_force(4 << 20).unwrap();
    s.set_recv_buffer_size_force(4 << 20).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    s.set_write_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
}

/// Asserts that no socket has unacked messages left after `within` and that
/// nothing arrives late (a non-blocking receive finds EAGAIN).
pub fn assert_drained(socks: &[std::sync::Arc<RdsSocket>], within: std::time::Duration) {
    for s in socks {
        assert!(s.flush(within), "unacked messages left");
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(s.recv_from(&mut b).unwrap_err().raw_os_error(), Some(libc::EAGAIN));
    }
}

/// How a test peer in the VM ends (the scenarios and the tests read it):
/// `RESULT ok` or `RESULT FAIL <why>` on stdout, and the exit status (0
/// only for ok).
pub fn report_result(res: Result<(), String>) -> std::process::ExitCode {
    match res {
        Ok(()) => {
            println!("RESULT ok");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            println!("RESULT FAIL {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
