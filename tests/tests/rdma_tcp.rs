//! RDMA through the socket API on a socket that is not bound over IB (TCP
//! here): the kernel's errno values, and nothing of a refused send goes out.
//! (RDMA itself is tested over Soft-RoCE in rds-sock's `ib_vm_rdma`.)

use rds_core::message::rdma_flags;
use rds_sock::{RdmaBuf, RdmaOp, RdmaSeg, SendFlags, TransportKind};
use rds_tests::*;

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("expected an error").raw_os_error().expect("an errno")
}

fn op(seg: RdmaSeg) -> RdmaOp {
    RdmaOp {
        remote_cookie: 0x64_0000_1234,
        remote_addr: 0,
        remote_len: seg.len() as u64,
        local: vec![seg],
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
    let buf = RdmaBuf::new(8192);
    let page = buf.seg(0, 4096).unwrap();

    // Unbound: ENOTCONN (`__rds_rdma_map`); FREE_MR without a transport: EINVAL.
    assert_eq!(errno(a.get_mr(&page, 0)), libc::ENOTCONN);
    assert_eq!(errno(a.free_mr(0, 0)), libc::EINVAL);

    a.bind(sa(ip(1), 4000)).unwrap();
    b.bind(sa(ip(2), 4000)).unwrap();
    assert_eq!(a.transport_raw().unwrap(), TransportKind::Tcp.uapi());
    // TCP has no get_mr: EOPNOTSUPP, for every flavour.
    assert_eq!(errno(a.get_mr(&page, 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(a.get_mr(&buf.seg(100, 1).unwrap(), rdma_flags::USE_ONCE)), libc::EOPNOTSUPP);
    assert_eq!(errno(a.get_mr_for_dest(sa(ip(2), 4000), &page, 0)), libc::EOPNOTSUPP);
    assert_eq!(
        errno(a.send_rdma_map(b"map", Some(sa(ip(2), 4000)), &page, 0, &SendFlags::default())),
        libc::EOPNOTSUPP
    );
    // SAFETY: nothing is registered (the call fails) and `buf` outlives it.
    assert_eq!(errno(unsafe { a.get_mr_raw(buf.addr(), 4096, 0) }), libc::EOPNOTSUPP);
    // A range beyond the buffer cannot even be formed (EINVAL, as the
    // kernel for a bad vector).
    assert_eq!(buf.seg(4097, 4096).unwrap_err(), rds_sock::Errno::EINVAL);
    assert_eq!(buf.seg(usize::MAX, 2).unwrap_err(), rds_sock::Errno::EINVAL);
    // Nothing kept a handle to the buffer.
    drop(page);
    assert_eq!(buf.handles(), 1);
    // No key of this socket, no flush_mrs: EINVAL.
    assert_eq!(errno(a.free_mr(0x64_0000_1234, 0)), libc::EINVAL);
    assert_eq!(errno(a.free_mr(0, 0)), libc::EINVAL);

    // RDMA_ARGS over TCP: EOPNOTSUPP; RDMA_DEST: EINVAL (no MR can exist).
    let dst = sa(ip(2), 4000);
    let rdma = SendFlags { rdma: Some(op(buf.seg(0, 4096).unwrap())), ..SendFlags::default() };
    assert_eq!(errno(a.send_msg(b"with an op", Some(dst), &rdma)), libc::EOPNOTSUPP);
    drop(rdma);
    assert_eq!(buf.handles(), 1, "a refused op keeps no handle");
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
