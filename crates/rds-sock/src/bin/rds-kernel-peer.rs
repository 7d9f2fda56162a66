//! The kernel's side of the IB VM scenarios where Python cannot serve: an
//! AF_RDS socket of the guest's kernel (`rds_rdma` loaded) bound to an IPv4
//! or IPv6 address. (The guests' Python has no `ctypes`, and its `socket`
//! module takes only IPv4 addresses for AF_RDS.)
//!
//! ```text
//! rds-kernel-peer recv|send BIND_IP PORT PEER_IP PEER_PORT SIZE...
//! ```
//!
//! `recv` binds, waits at the rig's barrier `$BARRIER` (if set) so that the
//! sender starts only then, and receives one message per SIZE, checking
//! sender, length and contents (byte i of message k is (i + k) % 251, as
//! rds-ib-peer and rds-ib's `kernel_side.py` write them), in order. `send`
//! sends them. Prints `KBOUND`, `KRX`/`KTX` and `KRESULT ok|FAIL` lines, as
//! `kernel_side.py` does; the exit status is 0 only for ok.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, ExitCode};

const AF_RDS: libc::c_int = 21;
const SOL_RDS: libc::c_int = 276;
const SO_RDS_TRANSPORT: libc::c_int = 8;
const RDS_TRANS_IB: libc::c_int = 0;

fn pattern(k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i + k) % 251) as u8).collect()
}

fn cvt(ret: libc::c_int, what: &str) -> Result<libc::c_int, String> {
    if ret < 0 { Err(format!("{what}: {}", io::Error::last_os_error())) } else { Ok(ret) }
}

fn setopt(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> Result<(), String> {
    // SAFETY: fd is open; the option value is a c_int that lives across the call.
    let r = unsafe {
        libc::setsockopt(fd.as_raw_fd(), level, name, &v as *const _ as *const libc::c_void, size_of::<libc::c_int>() as u32)
    };
    cvt(r, "setsockopt").map(drop)
}

/// `addr` as a sockaddr_in or sockaddr_in6 in a sockaddr_storage.
fn raw(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe { *(&mut ss as *mut _ as *mut libc::sockaddr_in) = sin };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: as above.
            unsafe { *(&mut ss as *mut _ as *mut libc::sockaddr_in6) = sin6 };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_raw(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::new(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::new(IpAddr::from(sin6.sin6_addr.s6_addr), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

fn run(a: &[String]) -> Result<usize, String> {
    let sa = |ip: &str, port: &str| -> Result<SocketAddr, String> {
        let ip: IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
        Ok(SocketAddr::new(ip, port.parse().map_err(|e| format!("{port}: {e}"))?))
    };
    let local = sa(&a[1], &a[2])?;
    let peer = sa(&a[3], &a[4])?;
    let sizes: Vec<usize> = a[5..].iter().map(|s| s.parse().map_err(|_| format!("bad size {s}"))).collect::<Result<_, _>>()?;
    // SAFETY: plain socket(2) call.
    let fd = cvt(unsafe { libc::socket(AF_RDS, libc::SOCK_SEQPACKET, 0) }, "socket(AF_RDS)")?;
    // SAFETY: fd was just returned by socket(2) and is owned here only.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    setopt(&fd, SOL_RDS, SO_RDS_TRANSPORT, RDS_TRANS_IB)?;
    setopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 8 << 20)?;
    setopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20)?;
    let (ss, len) = raw(local);
    // SAFETY: ss holds a valid socket address of length len.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), &ss as *const _ as *const libc::sockaddr, len) }, "bind")?;
    println!("KBOUND {local} transport ib");
    let mut bad = 0;
    if a[0] == "recv" {
        let tv = libc::timeval { tv_sec: 60, tv_usec: 0 };
        // SAFETY: fd is open; tv lives across the call.
        let r = unsafe {
            libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv as *const _ as *const libc::c_void, size_of::<libc::timeval>() as u32)
        };
        cvt(r, "SO_RCVTIMEO")?;
        if let Ok(b) = std::env::var("BARRIER") {
            let st = Command::new("barrier").arg(&b).arg("60").status().map_err(|e| format!("barrier {b}: {e}"))?;
            if !st.success() {
                return Err(format!("barrier {b} failed"));
            }
        }
        let mut buf = vec![0u8; 2 << 20];
        for (k, &n) in sizes.iter().enumerate() {
            // SAFETY: sockaddr_storage is plain data; all-zero is valid.
            let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut flen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: buf and from are valid for their lengths for the call.
            let got = unsafe {
                libc::recvfrom(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0, &mut from as *mut _ as *mut libc::sockaddr, &mut flen)
            };
            if got < 0 {
                return Err(format!("recvfrom {k}: {}", io::Error::last_os_error()));
            }
            let got = got as usize;
            let who = from_raw(&from);
            let ok = buf[..got] == pattern(k, n)[..] && who == Some(peer);
            bad += usize::from(!ok);
            let who = who.map_or("?".to_string(), |w| w.to_string());
            println!("KRX {k} len {got} from {who} {}", if ok { "ok" } else { "BAD" });
        }
    } else {
        let (to, tlen) = raw(peer);
        for (k, &n) in sizes.iter().enumerate() {
            let m = pattern(k, n);
            // SAFETY: m and to are valid for their lengths for the call.
            let r = unsafe {
                libc::sendto(fd.as_raw_fd(), m.as_ptr() as *const libc::c_void, m.len(), 0, &to as *const _ as *const libc::sockaddr, tlen)
            };
            if r < 0 {
                return Err(format!("sendto {k}: {}", io::Error::last_os_error()));
            }
            println!("KTX {k} len {n}");
        }
    }
    Ok(bad)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 || !matches!(args[0].as_str(), "recv" | "send") {
        eprintln!("usage: rds-kernel-peer recv|send BIND_IP PORT PEER_IP PEER_PORT SIZE...");
        return ExitCode::from(2);
    }
    match run(&args) {
        Ok(0) => {
            println!("KRESULT ok");
            ExitCode::SUCCESS
        }
        Ok(bad) => {
            println!("KRESULT FAIL {bad} bad");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("KRESULT FAIL {e}");
            ExitCode::FAILURE
        }
    }
}
