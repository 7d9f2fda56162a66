//! The C ABI's socket calls as the in-process tests make them (api.rs,
//! clock_reads.rs): errno, a socket address from text, a bound socket, a
//! one-descriptor poll.

use std::mem::{size_of, zeroed};
use std::net::SocketAddr;

use libc::{c_int, socklen_t};
use rds::*;

pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

pub fn sa(a: &str) -> (libc::sockaddr_storage, socklen_t) {
    let a: SocketAddr = a.parse().unwrap();
    // SAFETY: zeroed plain data.
    let mut s: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: storage is large enough and aligned.
            unsafe { (&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>().write(sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(_) => unimplemented!(),
    };
    (s, len as socklen_t)
}

pub fn sock() -> c_int {
    let fd = rds_socket(AF_RDS, libc::SOCK_SEQPACKET, 0);
    assert!(fd >= 0, "rds_socket: {}", errno());
    fd
}

pub fn bound(a: &str) -> c_int {
    let fd = sock();
    let (s, l) = sa(a);
    assert_eq!(rds_bind(fd, (&s as *const libc::sockaddr_storage).cast(), l), 0, "bind {a}: {}", errno());
    fd
}

pub fn poll1(fd: c_int, events: libc::c_short, ms: c_int) -> libc::c_short {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(r >= 0);
    p.revents
}
