#!/usr/bin/env python3
"""A kernel-API program on our RDS: run under LD_PRELOAD=librdspreload.so by
preload/tests/python.rs. Python's socket, select, fcntl, os and signal
modules, unmodified, on AF_RDS sockets. Prints `OK <check>` or
`FAIL <check>: <why>` per check, then `DONE`; the test wants every check
OK, in this order."""
import ctypes
import errno
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

from checks import check, fail, ok

AF_RDS = 21
A = ("127.0.0.1", 4000)
B = ("127.0.0.1", 4001)
C = ("127.0.0.1", 4002)
CHILD = ("127.0.0.2", 5000)


def errno_of(f):
    try:
        f()
    except OSError as e:
        return e.errno
    return 0


def rds(addr=None):
    s = socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    if addr:
        s.bind(addr)
    return s


def wait_readable(s, secs=3.0):
    r, _, _ = select.select([s], [], [], secs)
    return bool(r)


def payload(i, n):
    return bytes((i * 7 + k) & 0xFF for k in range(n))


class Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class Msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(Iovec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", Msghdr), ("msg_len", ctypes.c_uint)]


def sockaddr_in(addr):
    return struct.pack("<H", socket.AF_INET) + struct.pack(">H", addr[1]) + socket.inet_aton(addr[0]) + bytes(8)


def calls():
    """The calls Python's socket methods do not make, through os, fcntl and
    ctypes (libc's symbols resolve to the shim's first)."""
    libc = ctypes.CDLL(None, use_errno=True)
    p, q = rds(("127.0.0.1", 4100)), rds(("127.0.0.1", 4101))
    Q = ("127.0.0.1", 4101)
    check("writev_eopnotsupp", errno_of(lambda: os.writev(p.fileno(), [b"x"])) == errno.EOPNOTSUPP)
    check("shutdown_eopnotsupp", errno_of(lambda: p.shutdown(socket.SHUT_RDWR)) == errno.EOPNOTSUPP)
    check("accept_eopnotsupp", errno_of(p._accept) == errno.EOPNOTSUPP)
    check("socketpair_eopnotsupp",
          errno_of(lambda: socket.socketpair(AF_RDS, socket.SOCK_SEQPACKET, 0)) == errno.EOPNOTSUPP)
    t0 = time.time()
    check("read_zero", os.read(q.fileno(), 0) == b"" and time.time() - t0 < 1.0)
    p.sendto(b"datagram", Q)
    bufs = [bytearray(3), bytearray(10)]
    n = os.readv(q.fileno(), bufs) if wait_readable(q) else -1
    check("readv", n == 8 and bytes(bufs[0]) + bytes(bufs[1][:5]) == b"datagram", repr((n, bufs)))
    hi = fcntl.fcntl(q.fileno(), fcntl.F_DUPFD, 100)
    p.sendto(b"dupfd", Q)
    check("fcntl_f_dupfd", hi >= 100 and wait_readable(q) and os.read(hi, 100) == b"dupfd", repr(hi))
    os.close(hi)

    # sendmmsg: three datagrams in one call, each to Q; recvmmsg takes them
    name = ctypes.create_string_buffer(sockaddr_in(Q), 16)
    payloads = [b"m0", b"m11", b"m222"]
    keep = []
    msgs = (Mmsghdr * 3)()
    for i, d in enumerate(payloads):
        buf = ctypes.create_string_buffer(d, len(d))
        iov = Iovec(ctypes.cast(buf, ctypes.c_void_p), len(d))
        keep += [buf, iov]
        msgs[i].msg_hdr.msg_name = ctypes.cast(name, ctypes.c_void_p)
        msgs[i].msg_hdr.msg_namelen = 16
        msgs[i].msg_hdr.msg_iov = ctypes.pointer(iov)
        msgs[i].msg_hdr.msg_iovlen = 1
    sent = libc.sendmmsg(p.fileno(), msgs, 3, 0)
    check("sendmmsg", sent == 3 and [msgs[i].msg_len for i in range(3)] == [2, 3, 4],
          f"{sent} errno {ctypes.get_errno()}")
    time.sleep(0.2)
    rmsgs = (Mmsghdr * 4)()
    rbufs = [ctypes.create_string_buffer(16) for _ in range(4)]
    riovs = [Iovec(ctypes.cast(b, ctypes.c_void_p), 16) for b in rbufs]
    for i in range(4):
        rmsgs[i].msg_hdr.msg_iov = ctypes.pointer(riovs[i])
        rmsgs[i].msg_hdr.msg_iovlen = 1
    got = libc.recvmmsg(q.fileno(), rmsgs, 4, 0x10000, None)  # MSG_WAITFORONE
    check("recvmmsg", got == 3 and [rbufs[i].raw[:rmsgs[i].msg_len] for i in range(3)] == payloads,
          f"{got} errno {ctypes.get_errno()}")

    # glibc's fortified read
    p.sendto(b"chk", Q)
    cbuf = ctypes.create_string_buffer(8)
    n = libc.__read_chk(q.fileno(), cbuf, 8, 8) if wait_readable(q) else -1
    check("read_chk", n == 3 and cbuf.raw[:3] == b"chk", repr(n))

    # dup2 onto an RDS socket's number: the number becomes the pipe's, the
    # RDS socket is forgotten (closed with its last number)
    r = rds(("127.0.0.1", 4102))
    rfd = r.detach()
    pr, pw = os.pipe()
    os.dup2(pr, rfd)
    os.write(pw, b"pipe")
    check("dup2_onto_rds", os.read(rfd, 10) == b"pipe")
    check("dup2_rds_port_free", rds(("127.0.0.1", 4102)).getsockname() == ("127.0.0.1", 4102))
    for fd in (rfd, pr, pw):
        os.close(fd)
    p.close()
    q.close()


def main():
    # errno as the kernel
    check("socket_dgram_esocktnosupport",
          errno_of(lambda: socket.socket(AF_RDS, socket.SOCK_DGRAM, 0)) == errno.ESOCKTNOSUPPORT)
    u = rds()
    check("sendto_unbound_enotconn", errno_of(lambda: u.sendto(b"x", B)) == errno.ENOTCONN)
    u.close()
    a, b = rds(A), rds(B)
    check("getsockname", a.getsockname() == A, repr(a.getsockname()))
    check("getpeername_unconnected_enotconn", errno_of(a.getpeername) == errno.ENOTCONN)
    check("send_unconnected_enotconn", errno_of(lambda: a.send(b"x")) == errno.ENOTCONN)
    check("listen_eopnotsupp", errno_of(lambda: a.listen(1)) == errno.EOPNOTSUPP)
    check("write_eopnotsupp", errno_of(lambda: os.write(a.fileno(), b"x")) == errno.EOPNOTSUPP)

    # poll / select / epoll, level: nothing yet, then a datagram, then drained
    p = select.poll()
    p.register(b, select.POLLIN)
    check("poll_empty", p.poll(0) == [], repr(p.poll(0)))
    po = select.poll()
    po.register(a, select.POLLOUT)
    check("poll_pollout", po.poll(0) == [(a.fileno(), select.POLLOUT)], repr(po.poll(0)))
    ep = select.epoll()
    ep.register(b.fileno(), select.EPOLLIN)
    et = select.epoll()
    et.register(b.fileno(), select.EPOLLIN | select.EPOLLET)
    check("epoll_empty", ep.poll(0) == [] and et.poll(0) == [])
    a.sendto(b"one", B)
    check("poll_pollin", p.poll(3000) == [(b.fileno(), select.POLLIN)])
    r, _, _ = select.select([b], [], [], 3)
    check("select_readable", r == [b])
    check("epoll_level", ep.poll(1) != [] and ep.poll(0) != [], "level-triggered must repeat")
    check("epoll_edge_once", et.poll(1) != [] and et.poll(0) == [], "edge-triggered must not repeat")
    a.sendto(b"two", B)
    time.sleep(0.2)
    data, frm = b.recvfrom(100)
    check("recvfrom", (data, frm) == (b"one", A), repr((data, frm)))
    check("read", os.read(b.fileno(), 100) == b"two")
    check("poll_drained", p.poll(0) == [] and ep.poll(0) == [], repr(p.poll(0)))
    # Drained, then a datagram: a new edge. (The kernel also signals an edge
    # for each datagram that arrives while the socket is already readable;
    # this RDS signals the change to readable only.)
    a.sendto(b"three", B)
    check("epoll_edge_after_drain", et.poll(3) != [] and et.poll(0) == [], "drained then readable is a new edge")
    check("recv", b.recv(100) == b"three")

    # non-blocking
    check("msg_dontwait_eagain", errno_of(lambda: b.recv(10, socket.MSG_DONTWAIT)) == errno.EAGAIN)
    b.setblocking(False)
    try:
        b.recv(10)
        fail("nonblocking_blockingioerror", "recv returned")
    except BlockingIOError:
        ok("nonblocking_blockingioerror")
    b.setblocking(True)
    fl = fcntl.fcntl(b.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(b.fileno(), fcntl.F_SETFL, fl | os.O_NONBLOCK)
    check("fcntl_o_nonblock", errno_of(lambda: os.read(b.fileno(), 10)) == errno.EAGAIN)
    fcntl.fcntl(b.fileno(), fcntl.F_SETFL, fl)
    check("fcntl_getfl", fcntl.fcntl(b.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK == 0)

    # MSG_TRUNC: cut datagram flagged; with MSG_TRUNC in flags the full length
    a.sendto(payload(1, 100), B)
    data, _anc, flags, frm = b.recvmsg(10)
    check("msg_trunc_flag", data == payload(1, 100)[:10] and flags & socket.MSG_TRUNC and frm == A,
          repr((data, flags, frm)))
    a.sendto(payload(2, 100), B)
    buf = bytearray(10)
    n = b.recv_into(buf, 10, socket.MSG_TRUNC)
    check("msg_trunc_length", n == 100 and bytes(buf) == payload(2, 100)[:10], repr((n, bytes(buf))))

    # connect: send / write-less default destination, getpeername
    a.connect(B)
    check("getpeername", a.getpeername() == B, repr(a.getpeername()))
    a.send(b"connected")
    check("send_connected", wait_readable(b) and b.recv(100) == b"connected")

    # dup: the copy is the same socket; closing one keeps the other
    d = os.dup(b.fileno())
    a.send(b"via dup")
    check("dup_read", wait_readable(b) and os.read(d, 100) == b"via dup")
    b2 = socket.socket(fileno=os.dup(b.fileno()))
    b.close()
    a.send(b"after close")
    check("dup_survives_close", wait_readable(b2) and b2.recv(100) == b"after close")
    os.close(d)

    # EINTR: SIGALRM's handler raises while recv blocks (no SA_RESTART in Python)
    class Alarm(Exception):
        pass

    def on_alarm(_sig, _frm):
        raise Alarm()

    signal.signal(signal.SIGALRM, on_alarm)
    rescue = threading.Timer(5.0, lambda: a.send(b"rescue"))
    rescue.start()
    t0 = time.time()
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        got = b2.recv(100)
        fail("eintr", f"recv returned {got!r} after {time.time() - t0:.1f} s")
    except Alarm:
        check("eintr", time.time() - t0 < 4.0, f"after {time.time() - t0:.1f} s")
    rescue.cancel()
    signal.setitimer(signal.ITIMER_REAL, 0)

    # fork: the child opens its own RDS socket (another address, its own
    # node) and sends to the parent over RDS-TCP; every datagram once, in order
    c = rds(C)
    count = 200
    pid = os.fork()
    if pid == 0:
        try:
            s = rds(CHILD)
            for i in range(count):
                while True:
                    try:
                        s.sendto(payload(i, 1 + (i * 37) % 3000), C)
                        break
                    except OSError as e:
                        if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                            raise
                        time.sleep(0.01)
            s.sendto(b"END", C)
            time.sleep(1.0)
            os._exit(0)
        except BaseException as e:
            print(f"FAIL fork_child: {e!r}", flush=True)
            os._exit(1)
    got = []
    end = False
    deadline = time.time() + 30
    while time.time() < deadline and not end:
        if not wait_readable(c, 1):
            continue
        data, frm = c.recvfrom(65536)
        if data == b"END":
            end = True
        else:
            got.append((data, frm))
    _, status = os.waitpid(pid, 0)
    want = [(payload(i, 1 + (i * 37) % 3000), CHILD) for i in range(count)]
    check("fork_child_exit", status == 0, f"status {status}")
    check("fork_exchange", end and got == want,
          f"end {end}, {len(got)} of {count}, first difference at "
          f"{next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)}")

    calls()

    # an ordinary socket next to them is untouched by the shim
    x, y = socket.socketpair()
    x.send(b"plain")
    check("passthrough_socketpair", y.recv(10) == b"plain")
    print("DONE", flush=True)


main()
