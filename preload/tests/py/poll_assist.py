#!/usr/bin/env python3
"""A program that waits with poll() on its AF_RDS socket and then receives
without blocking, as rds-tools' rds-stress does: run under
LD_PRELOAD=librdspreload.so by preload/tests/python.rs. A forked child
echoes every datagram with blocking receives; the parent sends, polls its
socket beside a pipe, and receives with MSG_DONTWAIT. Prints `OK <check>` or
`FAIL <check>: <why>` per check, then `DONE`."""
import ctypes
import os
import select
import socket
import struct
import time

from checks import check, fail, ok

AF_RDS = 21
SOL_RDS = 276
RDS_INFO_COUNTERS = 10000
P = ("127.0.0.1", 4100)
Q = ("127.0.0.2", 4101)
N = 300


def rds(addr):
    s = socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    s.bind(addr)
    return s


def payload(i):
    return bytes((i * 13 + k) & 0xFF for k in range(1 + (i * 53) % 2000))


def counters(s):
    """RDS_INFO_COUNTERS: struct rds_info_counter { u8 name[32]; u64 value; }
    (through libc: Python's getsockopt takes at most 1024 bytes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(32768)
    n = ctypes.c_uint32(len(buf))
    if libc.getsockopt(s.fileno(), SOL_RDS, RDS_INFO_COUNTERS, buf, ctypes.byref(n)) < 0:
        raise OSError(ctypes.get_errno(), "getsockopt RDS_INFO_COUNTERS")
    buf = buf.raw[:n.value]
    out = {}
    for off in range(0, len(buf) - 39, 40):
        name = buf[off:off + 32].split(b"\0", 1)[0].decode()
        out[name] = struct.unpack_from("=Q", buf, off + 32)[0]
    return out


def echo_child():
    try:
        s = rds(Q)
        # Not forever: a parent that failed leaves the child a timeout
        # (Python then waits in poll, the shim's, before each receive).
        s.settimeout(20)
        while True:
            data, frm = s.recvfrom(65536)
            s.sendto(data, frm)
            if data == b"END":
                break
        time.sleep(0.5)
        os._exit(0)
    except BaseException as e:
        print(f"FAIL echo_child: {e!r}", flush=True)
        os._exit(1)


def poll_for(p, fd, ms):
    """Polls until `fd` is readable or `ms` passed; what the last poll said."""
    end = time.time() + ms / 1000
    while True:
        ev = p.poll(max(0, int((end - time.time()) * 1000)))
        if (fd, select.POLLIN) in ev or time.time() >= end:
            return ev


def main():
    a = rds(P)
    pid = os.fork()
    if pid == 0:
        echo_child()
    r, w = os.pipe()
    p = select.poll()
    p.register(a, select.POLLIN)
    p.register(r, select.POLLIN)
    c0 = counters(a)
    before = c0.get("tcp_rx_assist_reads")
    check("counter_listed", before is not None, "tcp_rx_assist_reads not in RDS_INFO_COUNTERS")
    before = before or 0
    before_fd = {k: c0.get(k, 0) for k in ("engine_fd_owed", "engine_fd_raised")}

    # Ping-pong: send, poll, receive without blocking; every answer once,
    # in order, intact.
    bad = []
    for i in range(N):
        a.sendto(payload(i), Q)
        ev = poll_for(p, a.fileno(), 10000)
        if (a.fileno(), select.POLLIN) not in ev:
            bad.append((i, "poll", ev))
            break
        data, frm = a.recvfrom(65536, socket.MSG_DONTWAIT)
        if data != payload(i) or frm != Q:
            bad.append((i, len(data), frm))
    check("echo_in_order", not bad, repr(bad[:3]))
    try:
        extra = a.recvfrom(65536, socket.MSG_DONTWAIT)
        fail("nothing_left", f"an extra datagram: {extra!r}")
    except BlockingIOError:
        ok("nothing_left")

    # The parent never blocks in a receive: assisted reads are its polls'.
    c = counters(a)
    reads = c.get("tcp_rx_assist_reads", 0) - before
    check("poll_read_the_connection", reads >= N // 2, f"{reads} assisted reads for {N} answers")
    print(f"assisted reads: {reads} for {N} answers", flush=True)
    # The answers the polls read themselves did not raise the descriptor
    # (a send and a recv on its socket pair per message): the receive
    # that followed each took it (engine/owed.rs in rds-sock).
    owed = c.get("engine_fd_owed", 0) - before_fd["engine_fd_owed"]
    raised = c.get("engine_fd_raised", 0) - before_fd["engine_fd_raised"]
    print(f"descriptor: {raised} raises, {owed} updates left for later, for {N} answers", flush=True)
    check("poll_left_the_descriptor", owed >= N // 2 and raised <= N // 2, f"{owed} left, {raised} raised")

    # A message a poll reported while its descriptor stayed behind is seen
    # by a wait that is not the shim's (epoll is not interposed) within the
    # linger (10 ms; 2 s allowed), and then by a second poll without a
    # receive at once. Repeated until one poll left the update for the linger tick.
    ep = select.epoll()
    ep.register(a.fileno(), select.EPOLLIN)
    bad, ticked, i = [], 0, 0
    while i < 50 and not ticked and not bad:
        i += 1
        t0 = counters(a)
        msg = b"late-%d" % i
        a.sendto(msg, Q)
        ev = poll_for(p, a.fileno(), 10000)
        if (a.fileno(), select.POLLIN) not in ev:
            bad.append((i, "poll", ev))
            break
        t1 = time.time()
        if not ep.poll(2.0):
            bad.append((i, "epoll", time.time() - t1))
        if (a.fileno(), select.POLLIN) not in p.poll(0):
            bad.append((i, "second poll"))
        data = a.recv(65536, socket.MSG_DONTWAIT)
        if data != msg:
            bad.append((i, data))
        if ep.poll(0):
            bad.append((i, "epoll after the receive"))
        ticked = counters(a).get("engine_fd_owed_ticked", 0) - t0.get("engine_fd_owed_ticked", 0)
    ep.close()
    check("owed_descriptor_catches_up", not bad and ticked > 0, f"{bad[:3]} after {i} tries, {ticked} ticked")

    # Another descriptor of the set ends the wait with its own events only.
    os.write(w, b"x")
    t0 = time.time()
    ev = p.poll(5000)
    check("pipe_in_the_set", ev == [(r, select.POLLIN)] and time.time() - t0 < 2, repr(ev))
    os.read(r, 1)

    # Nothing coming: the timeout.
    t0 = time.time()
    ev = p.poll(200)
    dt = time.time() - t0
    check("timeout", ev == [] and 0.15 <= dt < 3, f"{ev!r} after {dt:.3f} s")

    # A zero timeout finds an answer that came while nobody waited.
    a.sendto(b"END", Q)
    end = time.time() + 10
    seen = False
    while time.time() < end and not seen:
        seen = (a.fileno(), select.POLLIN) in p.poll(0)
        if not seen:
            time.sleep(0.001)
    check("poll_zero", seen and a.recv(65536, socket.MSG_DONTWAIT) == b"END")

    _, status = os.waitpid(pid, 0)
    check("child_exit", status == 0, f"status {status}")
    print("DONE", flush=True)


main()
