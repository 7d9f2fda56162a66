"""Talk RDS-over-TCP by hand to the 6.1 kernel: inject crafted headers, read what it sends.

Run in the vmrig guest:
    modprobe rds_tcp; netpair up; ip netns exec ns1 python3 probe_inject.py
We are a plain TCP client in ns1 (10.99.0.1, the smaller address) connecting to
the kernel's RDS-TCP listener in ns2 (10.99.0.2:16385).  RDS sockets in ns2 come
from factory.py.  Nothing in ns1 uses kernel RDS sockets.  Our own code.
"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *  # noqa

from probe_inject_lib import HDR, hdr, Peer  # noqa


def expect_recv(B, what):
    # No control buffer: on 6.1 put_cmsg() of an RDMA_DEST cookie from a TCP-received
    # message hits the hardened-usercopy BUG (see probe_usercopy.py).  MSG_CTRUNC (0x8)
    # in the flags shows that a cmsg would have been delivered.
    r = attempt(B.recvmsg, 1 << 21, 0, socket.MSG_DONTWAIT)
    if r[0] == "OK":
        data, anc, fl, addr = r[1]
        anc = [(l, t, d.hex()) for l, t, d in anc]
        print(f"  {what}: B got {len(data)} bytes {data[:16]!r} from {addr} flags {fl:#x} cmsgs {anc}", flush=True)
    else:
        print(f"  {what}: B recv -> {r[0]}", flush=True)


def conninfo():
    for line in rdsinfo("conns").splitlines():
        if "10.99.0.2 -> 10.99.0.1" in line:
            print("  " + line.strip(), flush=True)


f2 = Factory("ns2")
B = f2.sock()
B.bind(("10.99.0.2", 4000))
B2 = f2.sock()
B2.bind(("10.99.0.2", 4001))
B2.setblocking(False)

print("\n== 1. connect; what the kernel sends first")
before = counters()
t1 = Peer(rcvbuf=4096, label="t1")
first = t1.read(1.5)
conninfo()

print("\n== 2. answer the probe as a legacy peer (pong sport 0 -> dport 1, no extension), our seq 1")
t1.send(hdr(seq=1, sport=0, dport=1))
time.sleep(0.3)
conninfo()

print("\n== 3. sequence rules (data to B = 10.99.0.2:4000 from our port 5000)")
cases = [
    ("seq 2 new", dict(seq=2)),
    ("seq 2 again, no RETRANSMITTED flag", dict(seq=2)),
    ("seq 2 again, RETRANSMITTED (0x04)", dict(seq=2, flags=4)),
    ("seq 10 (skip forward)", dict(seq=10)),
    ("seq 5 RETRANSMITTED (< next_rx 11)", dict(seq=5, flags=4)),
    ("seq 5 no flag (goes backwards)", dict(seq=5)),
    ("seq 7 RETRANSMITTED (>= next_rx 6 now)", dict(seq=7, flags=4)),
    ("seq 11 RETRANSMITTED (== next_rx 8? no: > )", dict(seq=11, flags=4)),
    ("seq 0 no flag", dict(seq=0)),
    ("seq 20 with bogus h_csum 0x1234, h_ack 99, credit 7, pad", dict(seq=20, csum=0x1234, ack=99, credit=7)),
    ("seq 21 flags ACK_REQUIRED 0x02", dict(seq=21, flags=2)),
    ("seq 22 flags 0x80 (unknown)", dict(seq=22, flags=0x80)),
]
for label, kw in cases:
    c0 = counters()
    payload = label.encode()[:20]
    t1.send(hdr(length=len(payload), sport=5000, dport=4000, **kw), payload)
    time.sleep(0.2)
    expect_recv(B, label)
    d = cdiff(c0, counters())
    print(f"    counters: { {k: v for k, v in d.items() if k.startswith('recv')} }")
conninfo()

print("\n== 4. pings")
t1.send(hdr(seq=30, sport=5000, dport=0))
print(" ping sport 5000 -> dport 0:")
t1.read(0.5)
t1.send(hdr(seq=31, sport=0, dport=0))
print(" ping sport 0 -> dport 0 (should be ignored):")
t1.read(0.5)
t1.send(hdr(seq=32, length=5, sport=5000, dport=0), b"abcde")
print(" ping with 5-byte payload:")
t1.read(0.5)
t1.send(hdr(seq=33, sport=1, dport=0))
print(" probe ping (sport 1) with no extension:")
t1.read(0.5)
conninfo()

print("\n== 5. extension headers on data messages (MSG_CTRUNC = an RDS_CMSG_RDMA_DEST cookie was produced)")
ext_dest = bytes([3]) + struct.pack("!II", 0x11223344, 0x55667788)
t1.send(hdr(seq=40, length=3, sport=5000, dport=4000, ext=ext_dest), b"e1 ")
time.sleep(0.2)
expect_recv(B, "ext [RDMA_DEST]")
ext_two = bytes([1]) + struct.pack("!I", 0x0301) + ext_dest
t1.send(hdr(seq=41, length=3, sport=5000, dport=4000, ext=ext_two), b"e2 ")
time.sleep(0.2)
expect_recv(B, "ext [VERSION][RDMA_DEST] (two extensions)")
ext_t4 = bytes([4]) + ext_dest
t1.send(hdr(seq=42, length=3, sport=5000, dport=4000, ext=ext_t4), b"e3 ")
time.sleep(0.2)
expect_recv(B, "ext [type 4 (size 0 in 6.1 table)][RDMA_DEST]")
ext_bad = bytes([3]) + b"\x01" * 8 + bytes([3]) + b"\x02" * 6  # second one overruns
t1.send(hdr(seq=43, length=3, sport=5000, dport=4000, ext=ext_bad), b"e4 ")
time.sleep(0.2)
expect_recv(B, "ext [RDMA_DEST][RDMA_DEST overrunning 16 bytes]")
t1.send(hdr(seq=44, length=3, sport=5000, dport=4000, ext=bytes([17]) + ext_dest), b"e5 ")
time.sleep(0.2)
expect_recv(B, "ext [type 17 >= 16][RDMA_DEST]")

print("\n== 6. congestion map from the peer")
m = bytearray(8192)
t1.send(hdr(length=100, flags=1), bytes(100))
print(" cong map with h_len 100 (should be ignored, stream stays in sync):")
t1.send(hdr(seq=45, length=4, sport=5000, dport=4000), b"sync")
time.sleep(0.2)
expect_recv(B, "message after short cong map")
m[5000 // 8] |= 1 << (5000 % 8)
m[40000 // 8] |= 1 << (40000 % 8)
c0 = counters()
t1.send(hdr(length=8192, flags=1), bytes(m))
time.sleep(0.3)
print(" map with ports 5000 and 40000 set; counters:", cdiff(c0, counters()))
for port in (5000, 5001, 40000, 4999, 5008):
    print(f"  B2 non-blocking sendto 10.99.0.1:{port}:", attempt(B2.sendto, b"c", ("10.99.0.1", port))[0])
t1.read(0.5)
t1.send(hdr(length=8192, flags=1 | 4), bytes(8192))
time.sleep(0.2)
print(" map with flags 0x05 (not == 0x01) is treated as an ordinary message; B2 ->5000:",
      attempt(B2.sendto, b"c", ("10.99.0.1", 5000))[0])
t1.send(hdr(length=8192, flags=1), bytes(8192))
time.sleep(0.3)
print(" after an all-zero map: B2 -> 5000:", attempt(B2.sendto, b"c", ("10.99.0.1", 5000))[0])
t1.read(0.5)

print("\n== 7. oversize message from the peer (1.5 MiB > RDS_MAX_MSG_SIZE) to B")
big = bytes(range(256)) * (1536 * 4)
c0 = counters()
t1.send(hdr(seq=50, length=len(big), sport=5000, dport=4000), big)
time.sleep(1.0)
expect_recv(B, "1.5 MiB message")
print("  counters:", {k: v for k, v in cdiff(c0, counters()).items() if 'recv' in k or 'cong' in k})
t1.read(0.5)

print("\n== 8. second TCP connection while path 0 is up and c_npaths == 1")
t2 = Peer(label="t2")
t2.read(1.0)
try:
    t2.s.send(hdr(seq=1, sport=5000, dport=4000))
    time.sleep(0.2)
    t2.s.send(hdr(seq=2, sport=5000, dport=4000))
    print("  t2 sends ok")
except OSError as e:
    print("  t2 send error", ename(e.errno))
t2.read(0.5)

print("\n== 9. probe ping with [NPATHS=2][GEN_NUM=0x1111] (two extensions)")
ext = bytes([5]) + struct.pack("!H", 2) + bytes([6]) + struct.pack("!I", 0x1111)
t1.send(hdr(seq=60, sport=1, dport=0, ext=ext))
t1.read(0.5)
conninfo()
t3 = Peer(label="t3")
t3.read(1.0)
conninfo()
print(" kernel -> us from ns2 ports with hash&1 == 0 and == 1:")
p0 = next(p for p in range(30000, 31000) if mpath_hash(p, 2) == 0)
p1 = next(p for p in range(30000, 31000) if mpath_hash(p, 2) == 1)
for port in (p0, p1):
    bs = f2.sock()
    bs.bind(("10.99.0.2", port))
    print(f"  ns2 port {port} (jhash&1 = {mpath_hash(port, 2)}) sends to 10.99.0.1:5001")
    bs.sendto(b"path?", ("10.99.0.1", 5001))
    time.sleep(0.2)
    t1.read(0.3)
    t3.read(0.3)
    bs.close()

print("\n== 10. probe with a different GEN_NUM (peer restart detection)")
ext = bytes([6]) + struct.pack("!I", 0x2222)
t1.send(hdr(seq=61, sport=1, dport=0, ext=ext))
t1.read(0.5)
conninfo()
B2.sendto(b"after-gen", ("10.99.0.1", 5001))
time.sleep(0.2)
t1.read(0.3)
t3.read(0.3)

print("\n== 11. retransmission after the TCP connection dies (t1 has a tiny receive buffer)")
bz = f2.sock()
bz.bind(("10.99.0.2", next(p for p in range(31000, 32000) if mpath_hash(p, 2) == 0)))  # path 0 with npaths 2
bz.setblocking(False)
sent = 0
for i in range(40):
    if attempt(bz.sendto, struct.pack("!I", i) + bytes(1996), ("10.99.0.1", 5001))[0] == "OK":
        sent += 1
print(f"  queued {sent} x 2000 B to us on path 0 without us reading")
time.sleep(1.0)
print(" ", rdsinfo("len", 10004).strip(), "(retrans queue)")
print(" ", rdsinfo("len", 10003).strip(), "(send queue)")
# do not read t1 at all: what sits in our socket buffer is TCP-acked, the rest is not
t1.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
t1.s.close()
time.sleep(1.0)
print("  after RST:", rdsinfo("len", 10003).strip(), "(send queue)", rdsinfo("len", 10004).strip(), "(retrans)")
conninfo()
t4 = Peer(label="t4")
got = t4.read(1.5, quiet=True)
print(f"  t4 received {len(got)} frames (messages that were TCP-acked but unread by us are lost):")
for g in got:
    print(f"    seq {g['seq']} len {g['len']} sport {g['sport']} dport {g['dport']} flags {g['flags']:#x} "
          f"head {g['head'][:8]}")
print("  counters since start:", {k: v for k, v in cdiff(before, counters()).items()})
f2.close()
print("done", flush=True)
