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
//! rds-ib-peer and `tests/vm/kernel_side.py` write them), in order. `send`
//! sends them. Prints `KBOUND`, `KRX`/`KTX` and `KRESULT ok|FAIL` lines, as
//! `kernel_side.py` does; the exit status is 0 only for ok.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, ExitCode};

use socket2::SockAddr;

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
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &v as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as u32,
        )
    };
    cvt(r, "setsockopt").map(drop)
}

fn run(a: &[String]) -> Result<usize, String> {
    let sa = |ip: &str, port: &str| -> Result<SocketAddr, String> {
        let ip: IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
        Ok(SocketAddr::new(ip, port.parse().map_err(|e| format!("{port}: {e}"))?))
    };
    let local = sa(&a[1], &a[2])?;
    let peer = sa(&a[3], &a[4])?;
    let sizes: Vec<usize> =
        a[5..].iter().map(|s| s.parse().map_err(|_| format!("bad size {s}"))).collect::<Result<_, _>>()?;
    // SAFETY: plain socket(2) call.
    let fd = cvt(unsafe { libc::socket(AF_RDS, libc::SOCK_SEQPACKET, 0) }, "socket(AF_RDS)")?;
    // SAFETY: fd was just returned by socket(2) and is owned here only.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    setopt(&fd, SOL_RDS, SO_RDS_TRANSPORT, RDS_TRANS_IB)?;
    setopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 8 << 20)?;
    setopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20)?;
    let sa = SockAddr::from(local);
    // SAFETY: sa holds a valid socket address of its length.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), sa.as_ptr(), sa.len()) }, "bind")?;
    println!("KBOUND {local} transport ib");
    let mut bad = 0;
    if a[0] == "recv" {
        let tv = libc::timeval { tv_sec: 60, tv_usec: 0 };
        // SAFETY: fd is open; tv lives across the call.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                size_of::<libc::timeval>() as u32,
            )
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
            // SAFETY: buf is valid for its length; try_init hands recvfrom
            // storage and a length for the sender's address.
            let (got, from) = unsafe {
                SockAddr::try_init(|ss, len| {
                    let r = libc::recvfrom(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr() as *mut libc::c_void,
                        buf.len(),
                        0,
                        ss.cast(),
                        len,
                    );
                    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) }
                })
            }
            .map_err(|e| format!("recvfrom {k}: {e}"))?;
            let who = from.as_socket();
            let ok = buf[..got] == pattern(k, n)[..] && who == Some(peer);
            bad += usize::from(!ok);
            let who = who.map_or("?".to_string(), |w| w.to_string());
            println!("KRX {k} len {got} from {who} {}", if ok { "ok" } else { "BAD" });
        }
    } else {
        let to = SockAddr::from(peer);
        for (k, &n) in sizes.iter().enumerate() {
            let m = pattern(k, n);
            // SAFETY: m and to are valid for their lengths for the call.
            let r = unsafe {
                libc::sendto(fd.as_raw_fd(), m.as_ptr() as *const libc::c_void, m.len(), 0, to.as_ptr(), to.len())
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
