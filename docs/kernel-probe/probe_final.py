"""Remaining kernel RDS 6.1 checks (our own code).  modprobe rds_tcp; netpair up; python3 probe_final.py"""
import fcntl
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *  # noqa

f1, f2 = Factory("ns1"), Factory("ns2")
warm = rds()
warm.bind(("127.0.0.1", 0))

print("== sendmsg check order")
u = rds()
show("unbound socket, 2 MiB sendto", u.sendto, bytes(2 << 20), ("127.0.0.1", 4000))
u.close()

print("== send to own non-127 address in ns1 -> loop transport; congestion applies to TCP-bound sockets")
R = f1.sock()
R.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
R.bind(("10.99.0.1", 4200))
S = f1.sock()
S.bind(("10.99.0.1", 4201))
S.setblocking(False)
print("  R transport:", get_int(R, SOL_RDS, SO_RDS_TRANSPORT))
n = 0
while n < 50:
    r, _ = attempt(S.sendto, bytes(1500), ("10.99.0.1", 4200))
    if r != "OK":
        break
    n += 1
print(f"  sent {n} x 1500 B to a non-reading 10.99.0.1 socket (rds rcvbuf 4096), then {r}")
for line in rdsinfo("conns").splitlines():
    if "10.99.0.1 -> 10.99.0.1" in line:
        print("  " + line.strip())

print("== plain TCP connection to the RDS listener from a local address (same netns)")
print("  " + f1.sh("python3 " + os.path.join(HERE, "tcpclient.py") + " 10.99.0.1").replace("\n", "\n  "))

print("== SO_TIMESTAMPNS at SOL_SOCKET")
T = rds()
T.bind(("127.0.0.1", 4300))
T.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS_OLD
T.sendto(b"x", ("127.0.0.1", 4300))
d, anc, fl, a = T.recvmsg(10, 256)
print("  cmsgs:", [(l, t, len(x)) for l, t, x in anc], "(SO_TIMESTAMP_OLD=29, SO_TIMESTAMPNS_OLD=35)")

print("== SIOCRDSSETTOS after the socket has a connection")
X = f1.sock()
X.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, 2)
X.bind(("10.99.0.1", 4400))
X.setblocking(False)
X.sendto(b"x", ("10.99.0.77", 4000))
show("  SIOCRDSSETTOS", fcntl.ioctl, X, 0x89E0, b"\x00")

print("== RDS_INFO_SOCKETS count quirk (needed length counts unbound and IPv6 sockets too)")
extra = [rds() for _ in range(3)]
print(" ", rdsinfo("len", 10006).strip())
print(" ", rdsinfo("get", 10006, 28).strip())
print(" ", rdsinfo("get", 10006, 4096).strip())

print("== IPv6-flavoured info item sizes with live data")
B = f2.sock()
B.bind(("10.99.0.2", 4500))
A = f1.sock()
A.bind(("10.99.0.1", 4501))
A.sendto(b"hello", ("10.99.0.2", 4500))
time.sleep(1.0)
for opt in range(10011, 10017):
    print(" ", rdsinfo("get", opt, 65536).strip())
for opt in (10003, 10004, 10005, 10007):
    print(" ", rdsinfo("get", opt, 65536).strip())
print(rdsinfo("recv"))
f1.close()
f2.close()
print("done")
