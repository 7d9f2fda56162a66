//! The C ABI called as a C program would (through the same `extern "C"`
//! functions librds.so exports): results, data and errno. Sockets of one
//! process share one engine, so these datagrams take the loopback
//! transport; tests/example.rs and tests/c_api.rs cross processes.

use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::ptr::{null, null_mut};

use libc::{c_int, c_void, sockaddr, socklen_t};
use rds::*;

mod calls;
use calls::*;

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn send(fd: c_int, data: &[u8], to: &str) -> isize {
    let (s, l) = sa(to);
    rds_sendto(fd, data.as_ptr().cast(), data.len(), 0, (&s as *const libc::sockaddr_storage).cast(), l)
}

fn recv(fd: c_int, buf: &mut [u8], flags: c_int) -> (isize, Option<SocketAddr>) {
    // SAFETY: zeroed plain data.
    let mut from: libc::sockaddr_in = unsafe { zeroed() };
    let mut flen = size_of::<libc::sockaddr_in>() as socklen_t;
    let n = rds_recvfrom(
        fd,
        buf.as_mut_ptr().cast(),
        buf.len(),
        flags,
        (&mut from as *mut libc::sockaddr_in).cast(),
        &mut flen,
    );
    let a = (n >= 0 && flen == 16)
        .then(|| SocketAddr::new(u32::from_be(from.sin_addr.s_addr).to_be_bytes().into(), u16::from_be(from.sin_port)));
    (n, a)
}

#[test]
fn socket_arguments_as_rds_create() {
    set_errno(0);
    assert_eq!(rds_socket(libc::AF_INET, libc::SOCK_SEQPACKET, 0), -1);
    assert_eq!(errno(), libc::EAFNOSUPPORT);
    assert_eq!(rds_socket(AF_RDS, libc::SOCK_DGRAM, 0), -1);
    assert_eq!(errno(), libc::ESOCKTNOSUPPORT);
    assert_eq!(rds_socket(AF_RDS, libc::SOCK_SEQPACKET, 6), -1);
    assert_eq!(errno(), libc::ESOCKTNOSUPPORT);
    let fd = rds_socket(AF_RDS, libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
    assert!(fd >= 0);
    assert_eq!(rds_is_rds_fd(fd), 1);
    assert_eq!(rds_fcntl(fd, libc::F_GETFL, 0) & libc::O_NONBLOCK, libc::O_NONBLOCK);
    assert_eq!(rds_fcntl(fd, libc::F_GETFD, 0), libc::FD_CLOEXEC);
    let mut b = [0u8; 4];
    assert_eq!(recv(fd, &mut b, 0).0, -1, "unbound, non-blocking: nothing to receive");
    assert_eq!(errno(), libc::EAGAIN);
    // errno is left alone on success.
    set_errno(1234);
    assert_eq!(rds_close(fd), 0);
    assert_eq!(errno(), 1234);
    assert_eq!(rds_is_rds_fd(fd), 0);
    assert_eq!(rds_close(fd), -1);
    assert_eq!(errno(), libc::EBADF);
}

#[test]
fn bind_getsockname_sendto_recvfrom() {
    let a = bound("127.0.0.1:4101");
    let b = bound("127.0.0.2:4102");
    // SAFETY: zeroed plain data.
    let mut name: libc::sockaddr_in = unsafe { zeroed() };
    let mut len: socklen_t = 64;
    assert_eq!(rds_getsockname(a, (&mut name as *mut libc::sockaddr_in).cast(), &mut len), 0);
    assert_eq!((len, name.sin_family, u16::from_be(name.sin_port)), (16, libc::AF_INET as u16, 4101));
    assert_eq!(u32::from_be(name.sin_addr.s_addr), 0x7f00_0001);
    for i in 0..50u32 {
        let msg = format!("datagram {i}");
        assert_eq!(send(a, msg.as_bytes(), "127.0.0.2:4102"), msg.len() as isize);
    }
    let mut buf = [0u8; 64];
    for i in 0..50u32 {
        let (n, from) = recv(b, &mut buf, 0);
        assert_eq!(&buf[..n as usize], format!("datagram {i}").as_bytes(), "in order, each once");
        assert_eq!(from, Some("127.0.0.1:4101".parse().unwrap()));
    }
    assert_eq!(recv(b, &mut buf, libc::MSG_DONTWAIT).0, -1, "no 51st datagram");
    assert_eq!(errno(), libc::EAGAIN);
    // A second bind, an unbound getpeername.
    let (s, l) = sa("127.0.0.1:4103");
    assert_eq!(rds_bind(a, (&s as *const libc::sockaddr_storage).cast(), l), -1);
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(rds_getpeername(a, (&mut name as *mut libc::sockaddr_in).cast(), &mut len), -1);
    assert_eq!(errno(), libc::ENOTCONN);
    assert_eq!(rds_close(a), 0);
    assert_eq!(rds_close(b), 0);
}

#[test]
fn unbound_getsockname_is_af_unspec() {
    let fd = sock();
    let mut buf = [0xffu8; 32];
    let mut len: socklen_t = 32;
    assert_eq!(rds_getsockname(fd, buf.as_mut_ptr().cast(), &mut len), 0);
    assert_eq!(len, 16);
    assert_eq!(&buf[..16], &[0u8; 16], "AF_UNSPEC, all zero");
    assert_eq!(buf[16], 0xff, "nothing beyond a sockaddr_in");
    rds_close(fd);
}

#[test]
fn sendmsg_recvmsg_iovecs_trunc_and_peek() {
    let a = bound("127.0.0.1:4111");
    let b = bound("127.0.0.2:4112");
    let (to, tl) = sa("127.0.0.2:4112");
    let (p1, p2) = (b"hello ".to_vec(), b"world".to_vec());
    let mut iov = [
        libc::iovec { iov_base: p1.as_ptr() as *mut c_void, iov_len: p1.len() },
        libc::iovec { iov_base: p2.as_ptr() as *mut c_void, iov_len: p2.len() },
    ];
    // SAFETY: zeroed plain data.
    let mut m: libc::msghdr = unsafe { zeroed() };
    m.msg_name = (&to as *const libc::sockaddr_storage) as *mut c_void;
    m.msg_namelen = tl;
    m.msg_iov = iov.as_mut_ptr();
    m.msg_iovlen = 2;
    assert_eq!(rds_sendmsg(a, &m, 0), 11);
    assert_eq!(rds_sendmsg(a, &m, 0), 11);
    assert_eq!(rds_sendmsg(a, &m, 0), 11);

    // MSG_PEEK leaves it queued; scattered over two iovecs.
    let (mut x, mut y) = ([0u8; 4], [0u8; 16]);
    let mut riov = [
        libc::iovec { iov_base: x.as_mut_ptr().cast(), iov_len: 4 },
        libc::iovec { iov_base: y.as_mut_ptr().cast(), iov_len: 16 },
    ];
    // SAFETY: zeroed plain data.
    let mut from: libc::sockaddr_in = unsafe { zeroed() };
    // SAFETY: zeroed plain data.
    let mut r: libc::msghdr = unsafe { zeroed() };
    r.msg_name = (&mut from as *mut libc::sockaddr_in).cast();
    r.msg_namelen = 16;
    r.msg_iov = riov.as_mut_ptr();
    r.msg_iovlen = 2;
    assert_eq!(rds_recvmsg(b, &mut r, libc::MSG_PEEK), 11);
    assert_eq!((&x, &y[..7]), (b"hell", &b"o world"[..]));
    assert_eq!(r.msg_flags, 0);
    assert_eq!(r.msg_namelen, 16);
    assert_eq!(u16::from_be(from.sin_port), 4111);

    // Short buffer: MSG_TRUNC in msg_flags; with MSG_TRUNC the full length.
    let mut small = [0u8; 5];
    let mut siov = libc::iovec { iov_base: small.as_mut_ptr().cast(), iov_len: 5 };
    r.msg_iov = &mut siov;
    r.msg_iovlen = 1;
    assert_eq!(rds_recvmsg(b, &mut r, 0), 5, "without MSG_TRUNC: the bytes copied");
    assert_eq!(&small, b"hello");
    assert_eq!(r.msg_flags & libc::MSG_TRUNC, libc::MSG_TRUNC);
    assert_eq!(rds_recvmsg(b, &mut r, libc::MSG_TRUNC), 11, "with MSG_TRUNC: the real length");
    assert_eq!(r.msg_flags & libc::MSG_TRUNC, libc::MSG_TRUNC);
    let mut big = [0u8; 32];
    assert_eq!(recv(b, &mut big, 0).0, 11, "the third is whole");
    assert_eq!(recv(b, &mut big, libc::MSG_DONTWAIT).0, -1, "truncated ones were consumed");
    assert_eq!(errno(), libc::EAGAIN);
    rds_close(a);
    rds_close(b);
}

#[test]
fn bad_arguments_give_the_kernels_errno() {
    let fd = bound("127.0.0.1:4121");
    let mut buf = [0u8; 8];
    let mut len: socklen_t = 16;
    // Each call fails with -1 and its errno, checked right after it.
    let check = |what: &str, r: isize, want: c_int| {
        assert_eq!((what, r, errno()), (what, -1, want));
    };
    check("bind NULL", rds_bind(sock(), null(), 16) as isize, libc::EFAULT);
    check("bind short", rds_bind(sock(), buf.as_ptr().cast(), 1) as isize, libc::EINVAL);
    check("bind bad fd", rds_bind(-1, buf.as_ptr().cast(), 16) as isize, libc::EBADF);
    check("bind a file", rds_bind(0, buf.as_ptr().cast(), 16) as isize, libc::ENOTSOCK);
    check("getsockname NULL len", rds_getsockname(fd, buf.as_mut_ptr().cast(), null_mut()) as isize, libc::EFAULT);
    check("getsockname NULL addr", rds_getsockname(fd, null_mut(), &mut len) as isize, libc::EFAULT);
    check("sendmsg NULL", rds_sendmsg(fd, null(), 0), libc::EFAULT);
    check("recvmsg NULL", rds_recvmsg(fd, null_mut(), 0), libc::EFAULT);
    check("sendto NULL buf", rds_sendto(fd, null(), 4, 0, null(), 0), libc::EFAULT);
    check("sendto no destination", rds_sendto(fd, buf.as_ptr().cast(), 4, 0, null(), 0), libc::ENOTCONN);
    check("sendto short addr", rds_sendto(fd, buf.as_ptr().cast(), 4, 0, buf.as_ptr().cast(), 8), libc::EINVAL);
    check("sendto flags", send_flags(fd, libc::MSG_NOSIGNAL), libc::EOPNOTSUPP);
    check(
        "recvfrom NULL buf",
        rds_recvfrom(fd, null_mut(), 4, libc::MSG_DONTWAIT, null_mut(), null_mut()),
        libc::EFAULT,
    );
    check("setsockopt NULL", rds_setsockopt(fd, 276, 5, null(), 4) as isize, libc::EFAULT);
    check("setsockopt short", rds_setsockopt(fd, 276, 5, buf.as_ptr().cast(), 2) as isize, libc::EINVAL);
    check("setsockopt unknown", rds_setsockopt(fd, 276, 99, buf.as_ptr().cast(), 4) as isize, libc::ENOPROTOOPT);
    check(
        "getsockopt NULL len",
        rds_getsockopt(fd, 276, 5, buf.as_mut_ptr().cast(), null_mut()) as isize,
        libc::EFAULT,
    );
    check("ioctl FIONREAD", rds_ioctl(fd, libc::FIONREAD, buf.as_mut_ptr().cast()) as isize, libc::ENOTTY);
    check("ioctl NULL", rds_ioctl(fd, 0x89E1, null_mut()) as isize, libc::EFAULT);
    check("fcntl bad fd", rds_fcntl(99999, libc::F_GETFL, 0) as isize, libc::EBADF);
    check("dup3 same", rds_dup3(fd, fd, 0) as isize, libc::EINVAL);
    rds_close(fd);
}

/// A message gathered from several iovecs above RDS_MAX_MSG_SIZE (1 MiB)
/// is EMSGSIZE, however long the iovecs are (the gather stops one byte
/// past the limit).
#[test]
fn gathered_message_above_1_mib_is_emsgsize() {
    let fd = bound("127.0.0.1:4125");
    let (to, tl) = sa("127.0.0.2:4126");
    let half = vec![7u8; 1 << 19];
    let one = [1u8];
    let send_iov = |parts: &[&[u8]]| {
        let mut iov: Vec<libc::iovec> =
            parts.iter().map(|p| libc::iovec { iov_base: p.as_ptr() as *mut c_void, iov_len: p.len() }).collect();
        // SAFETY: zeroed plain data.
        let mut m: libc::msghdr = unsafe { zeroed() };
        m.msg_name = (&to as *const libc::sockaddr_storage) as *mut c_void;
        m.msg_namelen = tl;
        m.msg_iov = iov.as_mut_ptr();
        m.msg_iovlen = iov.len() as _;
        set_errno(0);
        (rds_sendmsg(fd, &m, libc::MSG_DONTWAIT), errno())
    };
    // Zeroed: mapped lazily, so the test itself does not hold 1 GiB.
    let big = vec![0u8; 1 << 30];
    assert_eq!(send_iov(&[&half, &half, &one]), (-1, libc::EMSGSIZE), "1 MiB + 1 byte");
    assert_eq!(send_iov(&[&half, &big, &big, &half]), (-1, libc::EMSGSIZE), "2 GiB + 1 MiB");
    rds_close(fd);
}

fn send_flags(fd: c_int, flags: c_int) -> isize {
    let (s, l) = sa("127.0.0.1:4121");
    rds_sendto(fd, b"x".as_ptr().cast(), 1, flags, (&s as *const libc::sockaddr_storage).cast::<sockaddr>(), l)
}

#[test]
fn nonblocking_eagain_and_fcntl() {
    let fd = bound("127.0.0.1:4131");
    let mut b = [0u8; 8];
    assert_eq!(rds_fcntl(fd, libc::F_GETFL, 0) & libc::O_NONBLOCK, 0);
    assert_eq!(rds_fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK as libc::c_long), 0);
    assert_eq!(rds_fcntl(fd, libc::F_GETFL, 0) & libc::O_NONBLOCK, libc::O_NONBLOCK);
    assert_eq!(recv(fd, &mut b, 0).0, -1);
    assert_eq!(errno(), libc::EAGAIN);
    // FIONBIO clears it again; MSG_DONTWAIT still does not block.
    let off: c_int = 0;
    assert_eq!(rds_ioctl(fd, libc::FIONBIO, (&off as *const c_int).cast_mut().cast()), 0);
    assert_eq!(rds_fcntl(fd, libc::F_GETFL, 0) & libc::O_NONBLOCK, 0);
    assert_eq!(recv(fd, &mut b, libc::MSG_DONTWAIT).0, -1);
    assert_eq!(errno(), libc::EAGAIN);
    // FD_CLOEXEC is per descriptor.
    assert_eq!(rds_fcntl(fd, libc::F_GETFD, 0), 0);
    assert_eq!(rds_fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long), 0);
    assert_eq!(rds_fcntl(fd, libc::F_GETFD, 0), libc::FD_CLOEXEC);
    rds_close(fd);
}

#[test]
fn receive_timeout_is_etimedout() {
    let fd = bound("127.0.0.1:4141");
    let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
    let tl = size_of::<libc::timeval>() as socklen_t;
    assert_eq!(rds_setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), tl), 0);
    let mut got = libc::timeval { tv_sec: 9, tv_usec: 9 };
    let mut gl = tl;
    assert_eq!(
        rds_getsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&mut got as *mut libc::timeval).cast(), &mut gl),
        0
    );
    assert_eq!((got.tv_sec, got.tv_usec, gl), (0, 100_000, tl));
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 8];
    assert_eq!(recv(fd, &mut b, 0).0, -1);
    assert_eq!(errno(), libc::ETIMEDOUT, "as the kernel's rds_recvmsg");
    assert!(t0.elapsed() >= std::time::Duration::from_millis(90));
    rds_close(fd);
}

#[test]
fn dup_and_close_keep_the_socket_until_the_last_number() {
    let a = bound("127.0.0.1:4151");
    let b = bound("127.0.0.2:4152");
    let d = rds_dup(b);
    assert!(d >= 0 && d != b);
    assert_eq!(rds_is_rds_fd(d), 1);
    assert_eq!(rds_close(b), 0);
    assert_eq!(rds_is_rds_fd(b), 0);
    assert_eq!(send(a, b"via dup", "127.0.0.2:4152"), 7);
    assert_ne!(poll1(d, libc::POLLIN, 5000) & libc::POLLIN, 0, "the dup polls readable");
    let mut buf = [0u8; 16];
    assert_eq!(recv(d, &mut buf, 0).0, 7);
    assert_eq!(&buf[..7], b"via dup");
    // dup2 onto a number that is ours replaces it; F_DUPFD_CLOEXEC.
    let e = rds_fcntl(d, libc::F_DUPFD_CLOEXEC, 100);
    assert!(e >= 100);
    assert_eq!(rds_fcntl(e, libc::F_GETFD, 0), libc::FD_CLOEXEC);
    assert_eq!(rds_dup2(a, e), e);
    // SAFETY: zeroed plain data.
    let mut name: libc::sockaddr_in = unsafe { zeroed() };
    let mut len: socklen_t = 16;
    assert_eq!(rds_getsockname(e, (&mut name as *mut libc::sockaddr_in).cast(), &mut len), 0);
    assert_eq!(u16::from_be(name.sin_port), 4151, "e is now a's socket");
    for fd in [a, d, e] {
        assert_eq!(rds_close(fd), 0);
    }
    // The port is free again once every number of b is closed.
    let again = bound("127.0.0.2:4152");
    rds_close(again);
}

#[test]
fn socket_options() {
    let fd = bound("127.0.0.1:4161");
    let get_int = |level, name| {
        let mut v: c_int = -7;
        let mut l = 4 as socklen_t;
        assert_eq!(rds_getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut l), 0, "{level}/{name}");
        assert_eq!(l, 4);
        v
    };
    assert_eq!(get_int(libc::SOL_SOCKET, libc::SO_TYPE), libc::SOCK_SEQPACKET);
    assert_eq!(get_int(libc::SOL_SOCKET, libc::SO_DOMAIN), 21);
    assert_eq!(get_int(276, 8), 2, "SO_RDS_TRANSPORT after a bind over TCP/loopback");
    let one: c_int = 1;
    let p = (&one as *const c_int).cast();
    assert_eq!(rds_setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, p, 4), 0);
    assert_eq!(get_int(libc::SOL_SOCKET, libc::SO_REUSEADDR), 1);
    assert_eq!(rds_setsockopt(fd, 276, 5, p, 4), 0);
    assert_eq!(get_int(276, 5), 1, "RDS_RECVERR");
    let big: c_int = 1 << 20;
    assert_eq!(rds_setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&big as *const c_int).cast(), 4), 0);
    assert!(get_int(libc::SOL_SOCKET, libc::SO_SNDBUF) > 0);
    assert_eq!(rds_setsockopt(fd, 276, 8, p, 4), -1, "SO_RDS_TRANSPORT after bind");
    assert_eq!(errno(), libc::EOPNOTSUPP);
    // TOS through the ioctls.
    let mut tos: u8 = 9;
    assert_eq!(rds_ioctl(fd, 0x89E1, (&mut tos as *mut u8).cast()), 0);
    assert_eq!(tos, 0);
    rds_close(fd);
}

#[test]
fn rds_info_sockets_lists_ours() {
    let fd = bound("127.0.0.1:4171");
    let mut len: socklen_t = 0;
    assert_eq!(rds_getsockopt(fd, 276, 10006, null_mut(), &mut len), -1, "RDS_INFO_SOCKETS without room");
    assert_eq!(errno(), libc::ENOSPC);
    assert!(len > 0, "the needed length comes back");
    let mut buf = vec![0u8; len as usize + 256];
    let mut l2 = buf.len() as socklen_t;
    let each = rds_getsockopt(fd, 276, 10006, buf.as_mut_ptr().cast(), &mut l2);
    assert!(each > 0, "returns the size of one record");
    assert_eq!(l2 as usize % each as usize, 0);
    rds_close(fd);
}

/// A msghdr sending `data` to `to` with one control message.
fn send_cmsg(fd: c_int, data: &[u8], to: &str, level: c_int, ty: c_int, payload: &[u8]) -> isize {
    let (s, l) = sa(to);
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut c_void, iov_len: data.len() };
    let mut ctl = [0u64; 16];
    // SAFETY: CMSG_LEN is pure arithmetic.
    let clen = unsafe { libc::CMSG_LEN(payload.len() as u32) } as usize;
    // SAFETY: zeroed plain data.
    let mut m: libc::msghdr = unsafe { zeroed() };
    m.msg_name = (&s as *const libc::sockaddr_storage) as *mut c_void;
    m.msg_namelen = l;
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is pure arithmetic.
    m.msg_controllen = unsafe { libc::CMSG_SPACE(payload.len() as u32) } as usize;
    // SAFETY: the control buffer holds CMSG_SPACE(len) bytes.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&m);
        (*h).cmsg_len = clen as _;
        (*h).cmsg_level = level;
        (*h).cmsg_type = ty;
        std::ptr::copy_nonoverlapping(payload.as_ptr(), libc::CMSG_DATA(h), payload.len());
    }
    rds_sendmsg(fd, &m, 0)
}

#[test]
fn rdma_over_tcp_fails_as_the_kernels() {
    let fd = bound("127.0.0.1:4181");
    let b = bound("127.0.0.2:4182");
    let mem = [0u8; 64];
    let mut cookie: u64 = 7;
    // struct rds_get_mr_args { rds_iovec vec; u64 cookie_addr; u64 flags; }
    let args: [u64; 4] = [mem.as_ptr() as u64, 64, (&mut cookie as *mut u64) as u64, 0];
    let p = args.as_ptr().cast();
    assert_eq!(rds_setsockopt(fd, 276, 2, p, 31), -1, "GET_MR with a short length");
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(rds_setsockopt(fd, 276, 2, p, 32), -1, "GET_MR over TCP");
    assert_eq!(errno(), libc::EOPNOTSUPP);
    assert_eq!(cookie, 7, "no cookie written");
    let unbound = sock();
    assert_eq!(rds_setsockopt(unbound, 276, 2, p, 32), -1);
    assert_eq!(errno(), libc::ENOTCONN, "GET_MR unbound");
    let free: [u64; 2] = [0x1234, 0];
    assert_eq!(rds_setsockopt(fd, 276, 3, free.as_ptr().cast(), 16), -1, "FREE_MR of no MR");
    assert_eq!(errno(), libc::EINVAL);
    // cmsgs: RDMA_ARGS and RDMA_MAP over TCP, atomics, unknown types.
    let iov: [u64; 2] = [mem.as_ptr() as u64, 64];
    let rargs: [u64; 7] = [1, 0, 64, iov.as_ptr() as u64, 1, 0, 0];
    // SAFETY: plain u64s viewed as bytes.
    let rbytes = unsafe { std::slice::from_raw_parts(rargs.as_ptr().cast::<u8>(), 56) };
    assert_eq!(send_cmsg(fd, b"x", "127.0.0.2:4182", 276, 1, rbytes), -1, "RDMA_ARGS over TCP");
    assert_eq!(errno(), libc::EOPNOTSUPP);
    // SAFETY: as above.
    let mbytes = unsafe { std::slice::from_raw_parts(args.as_ptr().cast::<u8>(), 32) };
    assert_eq!(send_cmsg(fd, b"x", "127.0.0.2:4182", 276, 3, mbytes), -1, "RDMA_MAP over TCP");
    assert_eq!(errno(), libc::EOPNOTSUPP);
    assert_eq!(send_cmsg(fd, b"x", "127.0.0.2:4182", 276, 6, &[0u8; 40]), -1, "atomic");
    assert_eq!(errno(), libc::EOPNOTSUPP);
    assert_eq!(send_cmsg(fd, b"x", "127.0.0.2:4182", 276, 99, &[0u8; 8]), -1, "unknown SOL_RDS cmsg");
    assert_eq!(errno(), libc::EINVAL);
    // A cmsg of another level is skipped, as rds_cmsg_send does.
    assert_eq!(send_cmsg(fd, b"other level", "127.0.0.2:4182", libc::SOL_SOCKET, 1, &[0u8; 4]), 11);
    let mut buf = [0u8; 32];
    assert_eq!(recv(b, &mut buf, 0).0, 11);
    assert_eq!(&buf[..11], b"other level");
    assert_eq!(recv(b, &mut buf, libc::MSG_DONTWAIT).0, -1, "the refused sends sent nothing");
    for f in [fd, b, unbound] {
        rds_close(f);
    }
}

#[test]
fn so_timestamp_cmsg_and_ctrunc() {
    // The sender is another engine (rds-sock's Rust API on 127.0.0.3), so
    // the datagrams come over TCP: rds-core's loopback transport does not
    // stamp receive times.
    let cfg = rds_sock::EngineConfig { info_dir: None, ..Default::default() };
    let other = rds_sock::Engine::new(cfg).unwrap();
    let a = other.socket().unwrap();
    a.bind("127.0.0.3:4191".parse().unwrap()).unwrap();
    let b = bound("127.0.0.2:4192");
    let one: c_int = 1;
    assert_eq!(rds_setsockopt(b, libc::SOL_SOCKET, libc::SO_TIMESTAMP, (&one as *const c_int).cast(), 4), 0);
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    a.send_to(b"stamped", "127.0.0.2:4192".parse().unwrap()).unwrap();
    a.send_to(b"stamped", "127.0.0.2:4192".parse().unwrap()).unwrap();
    let mut data = [0u8; 16];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: 16 };
    let mut ctl = [0u64; 8];
    // SAFETY: zeroed plain data.
    let mut m: libc::msghdr = unsafe { zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.as_mut_ptr().cast();
    m.msg_controllen = 64;
    assert_eq!(rds_recvmsg(b, &mut m, 0), 7);
    // SAFETY: CMSG_SPACE is arithmetic.
    assert_eq!(m.msg_controllen, unsafe { libc::CMSG_SPACE(16) } as usize, "one SCM_TIMESTAMP");
    assert_eq!(m.msg_flags, 0);
    // SAFETY: the control buffer holds the cmsg the call wrote.
    let (level, ty, tv) = unsafe {
        let h = libc::CMSG_FIRSTHDR(&m);
        ((*h).cmsg_level, (*h).cmsg_type, libc::CMSG_DATA(h).cast::<libc::timeval>().read_unaligned())
    };
    assert_eq!((level, ty), (libc::SOL_SOCKET, libc::SCM_TIMESTAMP));
    assert!(tv.tv_sec >= before && tv.tv_sec <= before + 60, "a time of now: {}", tv.tv_sec);
    assert!((0..1_000_000).contains(&tv.tv_usec));
    // No room for it: MSG_CTRUNC, nothing written.
    m.msg_controllen = 8;
    assert_eq!(rds_recvmsg(b, &mut m, 0), 7);
    assert_eq!(m.msg_flags & libc::MSG_CTRUNC, libc::MSG_CTRUNC);
    assert_eq!(m.msg_controllen, 0);
    rds_close(b);
    drop(a);
    other.shutdown(std::time::Duration::from_secs(1));
}

#[test]
fn ipv6_addresses() {
    let fd = sock();
    // SAFETY: zeroed plain data.
    let mut sin6: libc::sockaddr_in6 = unsafe { zeroed() };
    sin6.sin6_family = libc::AF_INET6 as u16;
    sin6.sin6_port = 4201u16.to_be();
    sin6.sin6_addr.s6_addr[15] = 1;
    let p = (&sin6 as *const libc::sockaddr_in6).cast::<sockaddr>();
    assert_eq!(rds_bind(fd, p, 27), -1, "a short sockaddr_in6");
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(rds_bind(fd, p, 28), 0, "bind [::1]:4201: {}", errno());
    // SAFETY: zeroed plain data.
    let mut out: libc::sockaddr_in6 = unsafe { zeroed() };
    let mut len: socklen_t = 28;
    assert_eq!(rds_getsockname(fd, (&mut out as *mut libc::sockaddr_in6).cast(), &mut len), 0);
    assert_eq!((len, out.sin6_family, u16::from_be(out.sin6_port)), (28, libc::AF_INET6 as u16, 4201));
    assert_eq!(out.sin6_addr.s6_addr, sin6.sin6_addr.s6_addr);
    // A datagram to itself over IPv6, the sender as a sockaddr_in6.
    let msg = b"six";
    assert_eq!(rds_sendto(fd, msg.as_ptr().cast(), 3, 0, p, 28), 3);
    let mut buf = [0u8; 8];
    // SAFETY: zeroed plain data.
    let mut from: libc::sockaddr_in6 = unsafe { zeroed() };
    let mut flen: socklen_t = 28;
    let n = rds_recvfrom(fd, buf.as_mut_ptr().cast(), 8, 0, (&mut from as *mut libc::sockaddr_in6).cast(), &mut flen);
    assert_eq!((n, &buf[..3], flen), (3, &msg[..], 28));
    assert_eq!(u16::from_be(from.sin6_port), 4201);
    rds_close(fd);
}

#[test]
fn cancel_sent_to_drops_what_is_queued() {
    let unbound = sock();
    let (to, _) = sa("127.0.0.3:4211");
    let p = (&to as *const libc::sockaddr_storage).cast::<c_void>();
    assert_eq!(rds_setsockopt(unbound, 276, 1, p, 16), -1);
    assert_eq!(errno(), libc::ENOTCONN, "unbound");
    let fd = bound("127.0.0.1:4212");
    assert_eq!(rds_setsockopt(fd, 276, 1, p, 15), -1);
    assert_eq!(errno(), libc::EINVAL, "shorter than a sockaddr_in");
    // Nobody serves 127.0.0.3: the datagrams wait in the send queue.
    assert_eq!(rds_fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK as libc::c_long), 0);
    let mut sent = 0;
    while send(fd, &[7u8; 1000], "127.0.0.3:4211") == 1000 {
        sent += 1;
        assert!(sent < 10_000);
    }
    assert!(sent > 0);
    assert_eq!(poll1(fd, libc::POLLOUT, 0) & libc::POLLOUT, 0, "full");
    assert_eq!(rds_setsockopt(fd, 276, 1, p, 16), 0);
    assert_ne!(poll1(fd, libc::POLLOUT, 5000) & libc::POLLOUT, 0, "room again once they are dropped");
    assert_eq!(send(fd, &[7u8; 1000], "127.0.0.3:4211"), 1000);
    rds_close(fd);
    rds_close(unbound);
}

#[test]
fn connect_sets_the_default_destination_and_tos() {
    let a = bound("127.0.0.1:4221");
    let b = bound("127.0.0.2:4222");
    let mut tos: u8 = 3;
    assert_eq!(rds_ioctl(a, 0x89E0, (&mut tos as *mut u8).cast()), 0, "SIOCRDSSETTOS before any connection");
    let mut got: u8 = 9;
    assert_eq!(rds_ioctl(a, 0x89E1, (&mut got as *mut u8).cast()), 0);
    assert_eq!(got, 0, "TCP maps every TOS to 0, as rds_tcp_get_tos_map");
    let unbound = sock();
    assert_eq!(rds_ioctl(unbound, 0x89E0, (&mut tos as *mut u8).cast()), -1);
    assert_eq!(errno(), libc::ENOTTY, "no transport yet: no TOS map");
    rds_close(unbound);
    let (any, l) = sa("0.0.0.0:4222");
    assert_eq!(rds_connect(a, (&any as *const libc::sockaddr_storage).cast(), l), -1);
    assert_eq!(errno(), libc::EDESTADDRREQ);
    let mut unix = any;
    unix.ss_family = libc::AF_UNIX as u16;
    assert_eq!(rds_connect(a, (&unix as *const libc::sockaddr_storage).cast(), l), -1);
    assert_eq!(errno(), libc::EAFNOSUPPORT);
    let (to, l) = sa("127.0.0.2:4222");
    assert_eq!(rds_connect(a, (&to as *const libc::sockaddr_storage).cast(), l), 0);
    // SAFETY: zeroed plain data.
    let mut peer: libc::sockaddr_in = unsafe { zeroed() };
    let mut plen: socklen_t = 16;
    assert_eq!(rds_getpeername(a, (&mut peer as *mut libc::sockaddr_in).cast(), &mut plen), 0);
    assert_eq!((plen, u16::from_be(peer.sin_port)), (16, 4222));
    for i in 0..3u8 {
        assert_eq!(rds_sendto(a, [i].as_ptr().cast(), 1, 0, null(), 0), 1, "no address: the connected one");
    }
    let mut buf = [9u8; 4];
    for i in 0..3u8 {
        let (n, from) = recv(b, &mut buf, 0);
        assert_eq!((n, buf[0], from), (1, i, Some("127.0.0.1:4221".parse().unwrap())));
    }
    rds_close(a);
    rds_close(b);
}
