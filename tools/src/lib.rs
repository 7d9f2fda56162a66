//! Shared pieces of the tools: a getopt-style option parser (the tools take
//! the original rds-tools options), size and interval parsing.

use std::time::Duration;

pub mod stress;

/// Puts SIGPIPE back to its default, as C tools have it: output into a
/// closed pipe (`rds-info | head`) ends the tool quietly instead of a
/// panic in `println!` (Rust programs start with SIGPIPE ignored). The RDS
/// stack itself never raises it: its sockets send with `MSG_NOSIGNAL`.
pub fn default_sigpipe() {
    // SAFETY: sets the disposition of one signal to its default; no
    // handler runs in Rust code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// A parsed command line: short options with or without values, long
/// options (`--name` or `--name=value` or `--name value`), and operands.
pub struct Args {
    pub opts: Vec<(String, Option<String>)>,
    pub operands: Vec<String>,
}

/// `--transport tcp|ib`: SO_RDS_TRANSPORT on a socket before its bind.
/// Without it the kernel's rule chooses (an address of an RDMA device uses
/// IB, any other TCP). IB needs the tools built with `--features ib`;
/// otherwise the bind fails with ENOPROTOOPT, as on a kernel without
/// rds_rdma.
pub fn apply_transport(sock: &rds_sock::RdsSocket, v: Option<&str>) -> Result<(), String> {
    let kind = match v {
        None => return Ok(()),
        Some("tcp") => rds_core::TransportKind::Tcp,
        Some("ib") => rds_core::TransportKind::Ib,
        Some(o) => return Err(format!("--transport: tcp or ib, not '{o}'")),
    };
    sock.set_transport(kind).map_err(|e| format!("--transport {}: {}", v.unwrap_or(""), errstr(&e)))
}

/// Parses `argv` (without the program name). `with_value` lists the short
/// option letters and long names that take a value.
pub fn parse(argv: impl IntoIterator<Item = String>, with_value: &[&str]) -> Result<Args, String> {
    let mut opts = Vec::new();
    let mut operands = Vec::new();
    let mut it = argv.into_iter().peekable();
    while let Some(a) = it.next() {
        if a == "--" {
            operands.extend(it.by_ref());
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (name, val) = match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            };
            let val = if val.is_none() && with_value.contains(&name.as_str()) {
                Some(it.next().ok_or_else(|| format!("option --{name} needs a value"))?)
            } else {
                val
            };
            opts.push((name, val));
        } else if a.len() > 1 && a.starts_with('-') {
            let chars: Vec<char> = a[1..].chars().collect();
            let mut i = 0;
            while i < chars.len() {
                let c = chars[i].to_string();
                if with_value.contains(&c.as_str()) {
                    let rest: String = chars[i + 1..].iter().collect();
                    let v = if rest.is_empty() {
                        it.next().ok_or_else(|| format!("option -{c} needs a value"))?
                    } else {
                        rest
                    };
                    opts.push((c, Some(v)));
                    break;
                }
                opts.push((c, None));
                i += 1;
            }
        } else {
            operands.push(a);
        }
    }
    Ok(Args { opts, operands })
}

impl Args {
    pub fn has(&self, name: &str) -> bool {
        self.opts.iter().any(|(n, _)| n == name)
    }

    /// The last value given for `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.opts.iter().rev().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    /// Rejects options not in `known`.
    pub fn check(&self, known: &[&str]) -> Result<(), String> {
        for (n, _) in &self.opts {
            if !known.contains(&n.as_str()) {
                let dash = if n.len() == 1 { "-" } else { "--" };
                return Err(format!("unknown option {dash}{n}"));
            }
        }
        Ok(())
    }
}

/// Sizes with K/M/G suffixes (powers of 1024), as rds-stress accepts them.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().map(|n| n * mult).map_err(|_| format!("bad size '{s}'"))
}

/// Intervals as rds-ping accepts them: seconds (fractions allowed), or a
/// number with an `msec`/`ms` or `usec`/`us` suffix.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("bad interval '{s}'");
    if let Some(n) = s.strip_suffix("msec").or_else(|| s.strip_suffix("ms")) {
        return n.trim().parse::<f64>().map(|v| Duration::from_secs_f64(v / 1e3)).map_err(|_| bad());
    }
    if let Some(n) = s.strip_suffix("usec").or_else(|| s.strip_suffix("us")) {
        return n.trim().parse::<f64>().map(|v| Duration::from_secs_f64(v / 1e6)).map_err(|_| bad());
    }
    let v = s.strip_suffix('s').unwrap_or(s).parse::<f64>().map_err(|_| bad())?;
    if !(0.0..1e9).contains(&v) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(v))
}

/// The source address the host would use to reach `dst` (what rds-ping
/// does: connect a UDP socket and read its local address).
pub fn source_for(dst: std::net::IpAddr) -> std::io::Result<std::net::IpAddr> {
    let any: std::net::SocketAddr =
        if dst.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
    let u = std::net::UdpSocket::bind(any)?;
    u.connect(std::net::SocketAddr::new(dst, 9))?;
    Ok(u.local_addr()?.ip())
}

/// Explains an error of `bind` the way an operator needs it.
pub fn bind_error(addr: std::net::SocketAddr, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EADDRINUSE) => format!(
            "bind {addr}: {e} (another RDS node of this host serves {} or the port is taken; \
             use another local address)",
            addr.ip()
        ),
        Some(libc::EADDRNOTAVAIL) => format!("bind {addr}: {e} (this host has no address {})", addr.ip()),
        _ => format!("bind {addr}: {e}"),
    }
}

/// Set by SIGINT/SIGTERM once [`catch_signals`] ran.
pub static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The signal that set [`STOP`] (0: none yet).
pub static STOP_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, std::sync::atomic::Ordering::SeqCst);
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// The name of the signal that stopped the program, if one did.
pub fn stop_signal() -> Option<&'static str> {
    match STOP_SIGNAL.load(std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        _ => Some("a signal"),
    }
}

/// Makes SIGINT and SIGTERM set [`STOP`] instead of killing the process.
pub fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only stores to an atomic.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Running digest of what one flow carried, as rds-gen/rds-sink print it.
pub struct FlowDigest {
    pub messages: u64,
    pub bytes: u64,
    hash: Option<sha2::Sha256>,
}

impl FlowDigest {
    pub fn new(digest: bool) -> FlowDigest {
        use sha2::Digest;
        FlowDigest { messages: 0, bytes: 0, hash: digest.then(sha2::Sha256::new) }
    }

    pub fn add(&mut self, payload: &[u8]) {
        use sha2::Digest;
        self.messages += 1;
        self.bytes += payload.len() as u64;
        if let Some(h) = &mut self.hash {
            h.update(payload);
        }
    }

    /// `<addr>:<port> <messages> <bytes> <sha256 or ->`
    pub fn line(&self, who: std::net::SocketAddr) -> String {
        use sha2::Digest;
        let hex = match &self.hash {
            Some(h) => h.clone().finalize().iter().map(|b| format!("{b:02x}")).collect(),
            None => "-".to_string(),
        };
        format!("{who} {} {} {hex}", self.messages, self.bytes)
    }
}

/// An error as strerror() words it, without Rust's " (os error N)".
pub fn errstr(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn getopt_forms() {
        let a =
            parse(v(&["-c5", "-i", "0.2", "-vz", "--show-histogram", "--port=9", "dst"]), &["c", "i", "port"]).unwrap();
        assert_eq!(a.get("c"), Some("5"));
        assert_eq!(a.get("i"), Some("0.2"));
        assert!(a.has("v") && a.has("z") && a.has("show-histogram"));
        assert_eq!(a.get("port"), Some("9"));
        assert_eq!(a.operands, vec!["dst"]);
        assert!(a.check(&["c", "i", "v", "z", "show-histogram", "port"]).is_ok());
        assert!(a.check(&["c"]).is_err());
        assert!(parse(v(&["-c"]), &["c"]).is_err());
    }

    #[test]
    fn sizes_and_intervals() {
        assert_eq!(parse_size("8K").unwrap(), 8192);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert_eq!(parse_size("63").unwrap(), 63);
        assert!(parse_size("x").is_err());
        assert_eq!(parse_interval("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_interval("20msec").unwrap(), Duration::from_millis(20));
        assert_eq!(parse_interval("100us").unwrap(), Duration::from_micros(100));
        assert!(parse_interval("-1").is_err());
    }
}
