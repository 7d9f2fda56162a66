"""Local (single namespace, loopback / loop transport) probes of kernel RDS 6.1.

Run in the vmrig guest after `modprobe rds_tcp`:
    python3 probe_local.py
Our own code; prints one line per check.
"""
import os
import select
import signal
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *  # noqa


def section(t):
    print(f"\n== {t}", flush=True)


section("bind")
s = rds()
show("bind 0.0.0.0:4000", s.bind, ("0.0.0.0", 4000))
show("bind 255.255.255.255:4000", s.bind, ("255.255.255.255", 4000))
show("bind 224.0.0.1:4000", s.bind, ("224.0.0.1", 4000))
show("bind 127.0.0.1:1 (probe port)", s.bind, ("127.0.0.1", 1))
show("bind 10.1.2.3:4000 (not local)", s.bind, ("10.1.2.3", 4000))
show("bind 127.0.0.1:4000", s.bind, ("127.0.0.1", 4000))
show("same socket bind again 127.0.0.1:4001", s.bind, ("127.0.0.1", 4001))
show("same socket bind again 127.0.0.1:4000", s.bind, ("127.0.0.1", 4000))
print("getsockname:", s.getsockname())
print("SO_RDS_TRANSPORT of socket bound to 127.0.0.1:", get_int(s, SOL_RDS, SO_RDS_TRANSPORT))
s2 = rds()
show("other socket bind 127.0.0.1:4000 (in use)", s2.bind, ("127.0.0.1", 4000))
show("other socket bind 127.0.0.2:4000 (same port other addr)", s2.bind, ("127.0.0.2", 4000))
s3 = rds()
s3.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, 2)
print("s3 transport after set TCP:", get_int(s3, SOL_RDS, SO_RDS_TRANSPORT))
show("s3 (TCP set) bind 127.0.0.1:4000 (in use)", s3.bind, ("127.0.0.1", 4000))
print("s3 transport after failed bind (EADDRINUSE clears it?):", get_int(s3, SOL_RDS, SO_RDS_TRANSPORT))
show("s3 set SO_RDS_TRANSPORT again after failed bind", s3.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 2)
s4 = rds()
s4.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, 2)
show("TCP-transport socket bind 127.0.0.1:4010", s4.bind, ("127.0.0.1", 4010))
print("  its SO_RDS_TRANSPORT:", get_int(s4, SOL_RDS, SO_RDS_TRANSPORT))
s5 = rds()
s5.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, 2)
show("TCP-transport socket bind 127.9.9.9:4011 (127/8 not configured)", s5.bind, ("127.9.9.9", 4011))
s6 = rds()
show("default socket bind 127.9.9.9:4011", s6.bind, ("127.9.9.9", 4011))
print("  its SO_RDS_TRANSPORT:", get_int(s6, SOL_RDS, SO_RDS_TRANSPORT))
ports = []
for i in range(16):
    x = rds()
    x.bind(("127.0.0.1", 0))
    ports.append(x.getsockname()[1])
    x.close()
print("port-0 binds picked:", ports)
for x in (s2, s3, s4, s5, s6):
    x.close()

section("SO_RDS_TRANSPORT")
t = rds()
print("fresh get:", get_int(t, SOL_RDS, SO_RDS_TRANSPORT), "(RDS_TRANS_NONE = -1)")
show("get with optlen 2", t.getsockopt, SOL_RDS, SO_RDS_TRANSPORT, 2)
show("set 5", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 5)
show("set 3 (RDS_TRANS_COUNT / LOOP)", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 3)
show("set -1", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, -1)
show("set 1 (GAP/iWARP)", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 1)
show("set with optlen 8", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, struct.pack("q", 2))
show("set 2 (TCP)", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 2)
print("get:", get_int(t, SOL_RDS, SO_RDS_TRANSPORT))
show("set 2 again", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 2)
t.close()
t = rds()
t.bind(("127.0.0.1", 0))
show("set 2 after bind (loop transport picked by bind)", t.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 2)
t.close()

section("socket buffers")
b = rds()
print("wmem_max/wmem_default/rmem_max/rmem_default:",
      [open(f"/proc/sys/net/core/{n}").read().strip() for n in ("wmem_max", "wmem_default", "rmem_max", "rmem_default")])
print("default SO_SNDBUF/SO_RCVBUF:", get_int(b, socket.SOL_SOCKET, socket.SO_SNDBUF),
      get_int(b, socket.SOL_SOCKET, socket.SO_RCVBUF))
b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
print("after set 1MiB:", get_int(b, socket.SOL_SOCKET, socket.SO_SNDBUF),
      get_int(b, socket.SOL_SOCKET, socket.SO_RCVBUF))
b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 0)
b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 0)
print("after set 0:", get_int(b, socket.SOL_SOCKET, socket.SO_SNDBUF),
      get_int(b, socket.SOL_SOCKET, socket.SO_RCVBUF))
b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 10000)
print("after set 10000:", get_int(b, socket.SOL_SOCKET, socket.SO_SNDBUF))
b.close()

section("sendmsg")
u = rds()
show("sendto on unbound socket", u.sendto, b"x", ("127.0.0.1", 4000))
show("send on unbound unconnected socket", u.send, b"x")
show("sendto 0.0.0.0 from unbound", u.sendto, b"x", ("0.0.0.0", 4000))
show("sendto MSG_OOB unbound", u.sendto, b"x", socket.MSG_OOB, ("127.0.0.1", 4000))
u.close()
a = rds()
a.bind(("127.0.0.1", 4020))
r = rds()
r.bind(("127.0.0.1", 4021))
show("sendto 0.0.0.0", a.sendto, b"x", ("0.0.0.0", 4021))
show("sendto 255.255.255.255", a.sendto, b"x", ("255.255.255.255", 4021))
show("sendto 224.0.0.1", a.sendto, b"x", ("224.0.0.1", 4021))
show("send() bound but not connected", a.send, b"x")
for fl in ("MSG_OOB", "MSG_MORE", "MSG_NOSIGNAL", "MSG_EOR", "MSG_CONFIRM", "MSG_DONTROUTE"):
    show(f"sendto with {fl}", a.sendto, b"x", getattr(socket, fl), ("127.0.0.1", 4021))
show("sendto with MSG_DONTWAIT", a.sendto, b"x", socket.MSG_DONTWAIT, ("127.0.0.1", 4021))
show("sendto MSG_ZEROCOPY without SO_ZEROCOPY", a.sendto, b"x", 0x4000000, ("127.0.0.1", 4021))
show("sendto 1MiB+1", a.sendto, bytes((1 << 20) + 1), ("127.0.0.1", 4021))
show("sendto 1MiB (default sndbuf)", a.sendto, bytes(1 << 20), ("127.0.0.1", 4021))
show("sendto 106497 (default rds sndbuf+1)", a.sendto, bytes(106497), ("127.0.0.1", 4021))
show("sendto 106496 (default rds sndbuf)", a.sendto, bytes(106496), ("127.0.0.1", 4021))
a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
show("after SO_SNDBUF=1MiB (capped): sendto 212992", a.sendto, bytes(212992), ("127.0.0.1", 4021))
show("after SO_SNDBUF=1MiB (capped): sendto 212993", a.sendto, bytes(212993), ("127.0.0.1", 4021))
show("sendto 0 bytes", a.sendto, b"", ("127.0.0.1", 4021))
show("sendto port with no socket (127.0.0.1:4999)", a.sendto, b"lost", ("127.0.0.1", 4999))
show("sendto unrelated SOL_SOCKET cmsg", a.sendmsg, [b"x"], [(socket.SOL_SOCKET, 1, b"1234")], 0, ("127.0.0.1", 4021))
show("sendto unknown SOL_RDS cmsg type 99", a.sendmsg, [b"x"], [(SOL_RDS, 99, b"1234")], 0, ("127.0.0.1", 4021))
show("sendto RDS_CMSG_RDMA_ARGS short", a.sendmsg, [b"x"], [(SOL_RDS, 1, b"1234")], 0, ("127.0.0.1", 4021))
rdma_args = struct.pack("QQQQQQQ", 0, 0, 4096, 0, 0, 0, 0)  # nr_local = 0
show("sendto RDS_CMSG_RDMA_ARGS nr_local=0", a.sendmsg, [b"x"], [(SOL_RDS, 1, rdma_args)], 0, ("127.0.0.1", 4021))
buf = bytearray(4096)
iov = struct.pack("QQ", 0x10000, 4096)
rdma_args = struct.pack("QQQQQQQ", 0, 0, 4096, 0, 1, 0, 0)
show("sendto RDS_CMSG_RDMA_DEST cookie 0x1234 (unknown key)", a.sendmsg, [b"x"], [(SOL_RDS, 2, struct.pack("Q", 0x1234))], 0, ("127.0.0.1", 4021))
show("sendto RDS_CMSG_RDMA_MAP (loop transport, no get_mr)", a.sendmsg, [b"x"],
     [(SOL_RDS, 3, struct.pack("QQQQ", 0x10000, 4096, 0, 0))], 0, ("127.0.0.1", 4021))
# drain r
r.setblocking(False)
n = 0
while True:
    try:
        d, fr = r.recvfrom(1 << 21)
        n += 1
    except BlockingIOError:
        break
print("receiver got", n, "messages")
r.setblocking(True)

section("connect")
c = rds()
show("getpeername before connect", c.getpeername)
show("connect 0.0.0.0", c.connect, ("0.0.0.0", 4021))
show("connect 255.255.255.255", c.connect, ("255.255.255.255", 4021))
show("connect 127.0.0.1:4021 (unbound socket)", c.connect, ("127.0.0.1", 4021))
show("getpeername", c.getpeername)
show("getsockname (unbound, connected)", c.getsockname)
show("send() connected but unbound", c.send, b"x")
c.bind(("127.0.0.1", 4022))
show("send() connected+bound", c.send, b"conn")
show("connect again to 127.0.0.1:4023 (re-connect allowed?)", c.connect, ("127.0.0.1", 4023))
show("getpeername", c.getpeername)
print("receiver got:", r.recvfrom(100))
c.close()

section("recvmsg")
r.setblocking(False)
show("non-blocking recv, empty queue", r.recv, 100)
r.setblocking(True)
show("recv MSG_DONTWAIT, empty queue", r.recv, 100, socket.MSG_DONTWAIT)
rcvtimeo(r, 0.5)
t0 = time.monotonic()
res = attempt(r.recv, 100)
print(f"recv with SO_RCVTIMEO=0.5s, empty: {res[0]} after {time.monotonic() - t0:.2f}s")
rcvtimeo(r, 0)
t0 = time.monotonic()
res = attempt(r.recv, 100, socket.MSG_OOB)
print(f"recv MSG_OOB (blocking, empty): {res[0]} -> {res[1]!r} after {time.monotonic() - t0:.2f}s")
a.sendto(bytes(range(100)), ("127.0.0.1", 4021))
buf = bytearray(10)
print("recvmsg_into 10-byte buf, MSG_PEEK:", r.recvmsg_into([buf], 0, socket.MSG_PEEK))
print("recvmsg_into 10-byte buf, MSG_PEEK|MSG_TRUNC:", r.recvmsg_into([buf], 0, socket.MSG_PEEK | socket.MSG_TRUNC))
print("recvmsg_into 10-byte buf, MSG_TRUNC:", r.recvmsg_into([buf], 0, socket.MSG_TRUNC))
r.setblocking(False)
show("message gone after truncated read? recv", r.recv, 100)
r.setblocking(True)
a.sendto(bytes(range(100)), ("127.0.0.1", 4021))
print("recvmsg_into 10-byte buf, no flags:", r.recvmsg_into([buf], 0, 0))
a.sendto(b"", ("127.0.0.1", 4021))
print("recvmsg of 0-byte msg:", r.recvmsg(100, 0, 0))
show("getsockopt unknown SOL_RDS 99", r.getsockopt, SOL_RDS, 99, 4)
show("setsockopt unknown SOL_RDS 99", r.setsockopt, SOL_RDS, 99, 1)
show("setsockopt SOL_RDS 4 (RDS_BARRIER, removed)", r.setsockopt, SOL_RDS, 4, 1)
show("getsockopt RDS_CONG_MONITOR (not gettable)", r.getsockopt, SOL_RDS, RDS_CONG_MONITOR, 4)
print("RDS_RECVERR default:", get_int(r, SOL_RDS, RDS_RECVERR))
show("set RDS_RECVERR 7", r.setsockopt, SOL_RDS, RDS_RECVERR, 7)
print("RDS_RECVERR now:", get_int(r, SOL_RDS, RDS_RECVERR))
show("set RDS_RECVERR optlen 2", r.setsockopt, SOL_RDS, RDS_RECVERR, b"\x01\x00")
show("get RDS_RECVERR optlen 2", r.getsockopt, SOL_RDS, RDS_RECVERR, 2)
show("set RDS_CONG_MONITOR 1", r.setsockopt, SOL_RDS, RDS_CONG_MONITOR, 1)
show("set RDS_CONG_MONITOR optlen 1", r.setsockopt, SOL_RDS, RDS_CONG_MONITOR, b"\x01")
show("set SOL_RDS SO_TIMESTAMP(29) optlen 8", r.setsockopt, SOL_RDS, SO_TIMESTAMP_OLD, struct.pack("q", 1))
show("set SOL_RDS SO_TIMESTAMP(29)=1", r.setsockopt, SOL_RDS, SO_TIMESTAMP_OLD, 1)
t_before = time.time()
a.sendto(b"ts", ("127.0.0.1", 4021))
time.sleep(0.3)
data, anc, fl, addr = r.recvmsg(100, 1024)
t_after = time.time()
for lvl, typ, d in anc:
    if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMP_OLD:
        sec, usec = struct.unpack("qq", d)
        ts = sec + usec / 1e6
        print(f"timestamp cmsg level SOL_SOCKET type {typ} len {len(d)}: {ts - t_before:.3f}s after send, "
              f"{t_after - ts:.3f}s before recvmsg (=> taken at enqueue)")
    else:
        print("other cmsg", lvl, typ, d.hex())
r.setsockopt(SOL_RDS, SO_TIMESTAMP_OLD, 0)
r.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP_NEW, 1)
a.sendto(b"ts", ("127.0.0.1", 4021))
data, anc, fl, addr = r.recvmsg(100, 1024)
print("with SOL_SOCKET SO_TIMESTAMP_NEW:", [(l, t_, len(d)) for l, t_, d in anc])
r.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP_NEW, 0)
show("SO_RDS_MSG_RXPATH_LATENCY optlen 2", r.setsockopt, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, b"\x01\x00")
show("SO_RDS_MSG_RXPATH_LATENCY {1,[0,0,0]}", r.setsockopt, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, b"\x01\x00\x00\x00")
show("SO_RDS_MSG_RXPATH_LATENCY {4,...}", r.setsockopt, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, b"\x04\x00\x00\x00")
a.sendto(b"lat", ("127.0.0.1", 4021))
data, anc, fl, addr = r.recvmsg(100, 1024)
print("with RXPATH_LATENCY:", [(l, t_, d.hex()) for l, t_, d in anc])
r.setsockopt(SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, b"\x00\x00\x00\x00")

section("cancel / MR options")
x = rds()
show("RDS_CANCEL_SENT_TO unbound", x.setsockopt, SOL_RDS, RDS_CANCEL_SENT_TO, sin("127.0.0.1", 4021))
x.bind(("127.0.0.1", 0))
show("RDS_CANCEL_SENT_TO optlen 8", x.setsockopt, SOL_RDS, RDS_CANCEL_SENT_TO, sin("127.0.0.1", 4021)[:8])
show("RDS_CANCEL_SENT_TO sockaddr_in", x.setsockopt, SOL_RDS, RDS_CANCEL_SENT_TO, sin("127.0.0.1", 4021))
show("RDS_GET_MR bad optlen", x.setsockopt, SOL_RDS, RDS_GET_MR, b"\0" * 8)
show("RDS_GET_MR (loop transport)", x.setsockopt, SOL_RDS, RDS_GET_MR, struct.pack("QQQQ", 0x10000, 4096, 0, 0))
show("RDS_FREE_MR cookie 0 (flush)", x.setsockopt, SOL_RDS, RDS_FREE_MR, struct.pack("QQ", 0, 0))
show("RDS_FREE_MR cookie 5", x.setsockopt, SOL_RDS, RDS_FREE_MR, struct.pack("QQ", 5, 0))
y = rds()
show("RDS_GET_MR unbound", y.setsockopt, SOL_RDS, RDS_GET_MR, struct.pack("QQQQ", 0x10000, 4096, 0, 0))
y.close()
try:
    import fcntl
    SIOCRDSSETTOS = 0x89E0
    SIOCRDSGETTOS = 0x89E1
    show("SIOCRDSGETTOS (loop-bound)", fcntl.ioctl, x, SIOCRDSGETTOS, b"\0")
    show("SIOCRDSSETTOS 3 (loop-bound: no get_tos_map)", fcntl.ioctl, x, SIOCRDSSETTOS, b"\x03")
    z = rds()
    show("SIOCRDSSETTOS 3 (unbound)", fcntl.ioctl, z, SIOCRDSSETTOS, b"\x03")
    z.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, 2)
    show("SIOCRDSSETTOS 3 (TCP transport set)", fcntl.ioctl, z, SIOCRDSSETTOS, b"\x03")
    show("SIOCRDSGETTOS (TCP maps everything to 0)", fcntl.ioctl, z, SIOCRDSGETTOS, b"\x09")
    show("SIOCRDSSETTOS 3 again", fcntl.ioctl, z, SIOCRDSSETTOS, b"\x03")
    z.close()
except ImportError:
    print("no fcntl module")
x.close()

section("ping over loopback")
p = rds()
p.bind(("127.0.0.1", 0))
before = counters()
p.sendto(b"", ("127.0.0.1", 0))
rcvtimeo(p, 1.0)
print("pong (0-byte ping):", attempt(p.recvfrom, 100))
p.sendto(b"payload", ("127.0.0.1", 0))
print("pong (7-byte ping):", attempt(p.recvfrom, 100))
print("counter deltas:", cdiff(before, counters()))
p.close()

section("loopback transport has no receive-side congestion")
lr = rds()
lr.bind(("127.0.0.1", 4030))
ls = rds()
ls.bind(("127.0.0.1", 4031))
ls.setblocking(False)
ok = 0
errs = {}
for i in range(100):
    res, _ = attempt(ls.sendto, bytes(60000), ("127.0.0.1", 4030))
    if res == "OK":
        ok += 1
    else:
        errs[res] = errs.get(res, 0) + 1
print(f"100 x 60000 B non-blocking to a non-reading 127.0.0.1 socket (rcvbuf 106496): ok={ok} errs={errs}")
print("receiver poll:", pollmask(lr), " RDS_INFO_RECV_MESSAGES:", rdsinfo("len", 10005).strip())
lr.close()
ls.close()

section("poll")
q = rds()
print("unbound fresh socket poll:", pollmask(q))
q.bind(("127.0.0.1", 4040))
print("bound, idle:", pollmask(q))
print("bound, idle (again):", pollmask(q))
a.sendto(b"x", ("127.0.0.1", 4040))
print("with 1 queued message:", pollmask(q))
q.recv(10)
print("after reading it:", pollmask(q))
q.close()

section("RDS_INFO via python getsockopt (buflen <= 1024)")
i = rds()
for opt in (10001, 10003, 10004, 10005, 10006, 10007, 10011, 10015, 10016):
    show(f"getsockopt {opt} buflen 1024", lambda o=opt: len(i.getsockopt(SOL_RDS, o, 1024)))
print(rdsinfo("sockets"))
print(rdsinfo("conns"))
i.close()
print("done", flush=True)
