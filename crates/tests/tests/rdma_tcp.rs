//! RDMA through the socket API on a socket that is not bound over IB (TCP
//! here): the kernel's errno values, and nothing of a refused send goes out.
//! (RDMA itself is tested over Soft-RoCE in rds-sock's `ib_vm_rdma`.)

use rds_core::message::rdma_flags;
use rds_core::RdmaOp;
use rds_sock::{SendFlags, TransportKind};
use rds_tests::*;

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("expected an error").raw_os_error().expect("an errno")
}

fn op(buf: &[u8]) -> RdmaOp {
    RdmaOp {
        remote_cookie: 0x64_0000_1234,
        remote_addr: 0,
        remote_len: buf.len() as u64,
        local: vec![(buf.as_ptr() as u64, buf.len() as u64)],
        flags: rdma_flags::READWRITE | rdma_flags::NOTIFY_ME,
        user_token: 7,
    }
}

#[test]
fn get_mr_free_mr_and_rdma_sends_over_tcp() {
    let ip = addr_block(50);
    let (e1, e2) = (engine(), engine());
    let a = e1.socket().unwrap();
    let b = e2.socket().unwrap();
    let mut buf = vec![0u8; 8192];
    let addr = buf.as_mut_ptr() as u64;

    // Unbound: ENOTCONN (`__rds_rdma_map`); FREE_MR without a transport: EINVAL.
    // SAFETY: nothing is registered (the calls fail).
    assert_eq!(errno(unsafe { a.get_mr(addr, 4096, 0) }), libc::ENOTCONN);
    assert_eq!(errno(a.free_mr(0, 0)), libc::EINVAL);

    a.bind(sa(ip(1), 4000)).unwrap();
    b.bind(sa(ip(2), 4000)).unwrap();
    assert_eq!(a.transport_raw().unwrap(), TransportKind::Tcp.uapi());
    // TCP has no get_mr: EOPNOTSUPP, for every flavour.
    // SAFETY: as above.
    unsafe {
        assert_eq!(errno(a.get_mr(addr, 4096, 0)), libc::EOPNOTSUPP);
        assert_eq!(errno(a.get_mr(addr + 100, 1, rdma_flags::USE_ONCE)), libc::EOPNOTSUPP);
        assert_eq!(errno(a.get_mr_for_dest(sa(ip(2), 4000), addr, 4096, 0)), libc::EOPNOTSUPP);
        assert_eq!(
            errno(a.send_rdma_map(b"map", Some(sa(ip(2), 4000)), addr, 4096, 0, &SendFlags::default())),
            libc::EOPNOTSUPP
        );
    }
    // No key of this socket, no flush_mrs: EINVAL.
    assert_eq!(errno(a.free_mr(0x64_0000_1234, 0)), libc::EINVAL);
    assert_eq!(errno(a.free_mr(0, 0)), libc::EINVAL);

    // RDMA_ARGS over TCP: EOPNOTSUPP; RDMA_DEST: EINVAL (no MR can exist).
    let dst = sa(ip(2), 4000);
    let rdma = SendFlags { rdma: Some(op(&buf[..4096])), ..SendFlags::default() };
    assert_eq!(errno(a.send_msg(b"with an op", Some(dst), &rdma)), libc::EOPNOTSUPP);
    let dest = SendFlags { rdma_dest: Some(0x64_0000_1234), ..SendFlags::default() };
    assert_eq!(errno(a.send_msg(b"with a cookie", Some(dst), &dest)), libc::EINVAL);

    // Nothing of the refused sends went out, and no notification is queued.
    a.send_to(b"plain", dst).unwrap();
    b.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let mut rx = [0u8; 64];
    let m = b.recv_msg(&mut rx, rds_sock::RecvFlags::default()).unwrap();
    assert_eq!((&rx[..m.len], m.from, m.rdma_dest), (&b"plain"[..], Some(sa(ip(1), 4000)), None));
    assert!(a.flush(std::time::Duration::from_secs(20)), "acked");
    let f = rds_sock::RecvFlags { dontwait: true, ..Default::default() };
    assert_eq!(errno(a.recv_msg(&mut rx, f)), libc::EAGAIN, "no RDMA status queued");
    assert_eq!(errno(b.recv_msg(&mut rx, f)), libc::EAGAIN, "only the plain message");
}
