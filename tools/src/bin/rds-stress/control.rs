//! The control connection, as rds-tools' (TCP to the passive side's port):
//! the active side connects (retrying with `--connect-retries`), sends its
//! options block (the first version, or the second, which starts with a
//! version string and carries the TOS), starts its tasks and trades a byte
//! with the passive side, which accepted, read and checked the block and
//! started its own. Both then go on in [`release_children_and_wait`], which
//! watches this connection for the end of the run.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rds_sock::Engine;
use rds_tools::stress::{OPTIONS_V1_SIZE, OPTIONS_V2_SIZE, VERSION_LEN, WireOptions, is_version_string};
use rds_tools::{STOP, bind_error, errstr};

use crate::flush;
use crate::options::{Local, RDMA_ERROR, check_sizes, die, die_errno};
use crate::report::release_children_and_wait;
use crate::soak::Soak;
use crate::task::start_children;

pub fn active(mut o: WireOptions, local: Local, soak: Option<Soak>) -> i32 {
    if o.show_params != 0 {
        println!("Options:");
        println!("  {:<10} {:<7}", "Tasks", o.nr_tasks);
        println!("  {:<10} {:<7}", "Req size", o.req_size);
        println!("  {:<10} {:<7}", "ACK size", o.ack_size);
        println!("  {:<10} {:<7}", "RDMA size", o.rdma_size);
        let mut opts = Vec::new();
        for (on, name) in
            [(o.rdma_use_once, "use_once"), (o.rdma_use_get_mr, "use_get_mr"), (o.rdma_use_fence, "use_fence")]
        {
            if on != 0 {
                opts.push(name);
            }
        }
        println!("  {:<10} {}", "RDMA opts", if opts.is_empty() { " (defaults)".to_string() } else { opts.join(" ") });
        println!();
    }
    let target = SocketAddrV4::new(o.send_addr, o.starting_port);
    print!("connecting to {target}");
    flush();
    let mut retries = 0u32;
    let mut stream = loop {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
            .unwrap_or_else(|e| die_errno("socket(PF_INET, SOCK_STREAM) failed", &e));
        let _ = s.set_reuse_address(true);
        if let Err(e) = s.bind(&SocketAddr::from(SocketAddrV4::new(o.receive_addr, 0)).into()) {
            println!();
            die_errno("bind() failed", &e);
        }
        match s.connect(&SocketAddr::from(target).into()) {
            Ok(()) => break TcpStream::from(s),
            Err(e) => {
                if retries == 0 {
                    print!(": {}", errstr(&e));
                }
                let retry =
                    matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH));
                if retry && retries < o.connect_retries && !STOP.load(Relaxed) {
                    if retries == 0 {
                        print!(" - retrying");
                    }
                    retries += 1;
                    print!(".");
                    flush();
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
                println!();
                die(&format!("connect({}) failed", o.send_addr));
            }
        }
    };
    println!();
    if o.receive_addr.is_unspecified() {
        o.receive_addr = match stream.local_addr() {
            Ok(SocketAddr::V4(a)) => *a.ip(),
            _ => die("getsockname failed"),
        };
    }
    let _ = stream.set_nodelay(true);
    // No TOS: the first version of the options block, which every passive
    // side understands; else the second, which carries the TOS.
    let block = if o.tos != 0 { o.encode_v2() } else { o.encode_v1().to_vec() };
    peer_send(&mut stream, &block);
    let run = start_children(o, true, local);
    peer_send(&mut stream, &[0u8]);
    let mut ok = [0u8];
    peer_recv(&mut stream, &mut ok);
    println!("negotiated options, tasks will start in 2 seconds");
    release_children_and_wait(run, soak, stream)
}

pub fn passive(mut addr: Ipv4Addr, port: u16, local: Local, soak: Option<Soak>) -> i32 {
    if !addr.is_unspecified() {
        // Serve the address now: a waiting passive side answers rds-ping.
        let engine = Engine::global().unwrap_or_else(|e| die_errno("starting the RDS engine failed", &e));
        if let Err(e) = engine.serve(IpAddr::V4(addr)) {
            die(&bind_error(SocketAddr::new(IpAddr::V4(addr), port), &e));
        }
    }
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .unwrap_or_else(|e| die_errno("socket(PF_INET, SOCK_STREAM) failed", &e));
    let _ = l.set_reuse_address(true);
    if let Err(e) = l.bind(&SocketAddr::from(SocketAddrV4::new(addr, port)).into()) {
        die_errno("bind() failed", &e);
    }
    println!("waiting for incoming connection on {addr}:{port}");
    if let Err(e) = l.listen(255) {
        die_errno("listen() failed", &e);
    }
    // Wait in slices so SIGINT/SIGTERM end the wait.
    loop {
        if STOP.load(Relaxed) {
            die("interrupted while waiting for the active side");
        }
        if poll_in(l.as_raw_fd(), 200) {
            break;
        }
    }
    let (s, from) = l.accept().unwrap_or_else(|e| die_errno("accept() failed", &e));
    drop(l);
    let mut stream = TcpStream::from(s);
    let _ = stream.set_nodelay(true);
    print!("accepted connection from {}", from.as_socket().map_or("?".into(), |a| a.to_string()));
    if addr.is_unspecified() {
        match stream.local_addr() {
            Ok(SocketAddr::V4(a)) => {
                print!(" on {a}");
                addr = *a.ip();
            }
            _ => die("getsockname failed"),
        }
    }
    println!();
    // The options block: V2 starts with a version string, V1 with the depth.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut first = [0u8; VERSION_LEN];
    peer_recv(&mut stream, &mut first);
    let mut o = if is_version_string(&first) {
        let mut rest = [0u8; OPTIONS_V2_SIZE - VERSION_LEN];
        peer_recv(&mut stream, &mut rest);
        let mut v1 = [0u8; OPTIONS_V1_SIZE];
        v1.copy_from_slice(&rest[..OPTIONS_V1_SIZE]);
        let mut o = WireOptions::decode_v1(&v1);
        o.tos = rest[OPTIONS_V1_SIZE];
        o.async_send = rest[OPTIONS_V1_SIZE + 1];
        o
    } else {
        let mut v1 = [0u8; OPTIONS_V1_SIZE];
        v1[..VERSION_LEN].copy_from_slice(&first);
        peer_recv(&mut stream, &mut v1[VERSION_LEN..]);
        WireOptions::decode_v1(&v1)
    };
    if o.rdma_size != 0 && !cfg!(feature = "ib") {
        die(&format!("the active side asked for RDMA (-D {}): {RDMA_ERROR}", o.rdma_size));
    }
    if o.async_send != 0 {
        die("the active side asked for --async, which this userspace RDS does not have");
    }
    check_sizes(&o);
    // The sender gave us its send and receive addresses: swap them.
    o.send_addr = o.receive_addr;
    o.receive_addr = addr;
    let mut ok = [0u8];
    peer_recv(&mut stream, &mut ok);
    let run = start_children(o, false, local);
    peer_send(&mut stream, &[0u8]);
    let _ = stream.set_read_timeout(None);
    println!("negotiated options, tasks will start in 2 seconds");
    release_children_and_wait(run, soak, stream)
}

fn peer_send(s: &mut TcpStream, b: &[u8]) {
    if let Err(e) = s.write_all(b) {
        die_errno("Cannot send to peer", &e);
    }
}

fn peer_recv(s: &mut TcpStream, b: &mut [u8]) {
    if let Err(e) = s.read_exact(b) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            die("Peer unexpectedly closed connection");
        }
        die_errno("Cannot recv from peer", &e);
    }
}

/// Whether `fd` became readable (or hung up) within `ms`.
pub fn poll_in(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0 && p.revents != 0
}
