#!/usr/bin/env python3
"""A kernel-API program on our RDS: run under LD_PRELOAD=librdspreload.so by
preload/tests/python.rs. Python's socket, select, fcntl, os and signal
modules, unmodified, on AF_RDS sockets. Prints `OK <check>` or
`FAIL <check>: <why>` per check, then `DONE`; the test wants every check
OK, in this order."""
import errno
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

AF_RDS = 21
A = ("127.0.0.1", 4000)
B = ("127.0.0.1", 4001)
C = ("127.0.0.1", 4002)
CHILD = ("127.0.0.2", 5000)


def ok(name):
    print(f"OK {name}", flush=True)


def fail(name, why):
    print(f"FAIL {name}: {why}", flush=True)


def check(name, cond, why=""):
    if cond:
        ok(name)
    else:
        fail(name, why)


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
    import fcntl
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

    # an ordinary socket next to them is untouched by the shim
    x, y = socket.socketpair()
    x.send(b"plain")
    check("passthrough_socketpair", y.recv(10) == b"plain")
    print("DONE", flush=True)


main()
