"""Minimal reproducer: RDS-TCP message carrying an RDMA_DEST extension header, then
recvmsg() with a control buffer on the receiving socket (6.1 kernel).  Our own code.
Run: modprobe rds_tcp; netpair up; ip netns exec ns1 python3 probe_usercopy.py [noctl]
"""
import os, socket, struct, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *  # noqa
from probe_inject_lib import hdr, Peer

f2 = Factory("ns2")
B = f2.sock()
B.bind(("10.99.0.2", 4000))
t = Peer(label="t")
t.read(1.0, quiet=True)
t.send(hdr(seq=1, sport=0, dport=1))
ext = bytes([3]) + struct.pack("!II", 0x11223344, 0x55667788)
t.send(hdr(seq=2, length=3, sport=5000, dport=4000, ext=ext), b"abc")
time.sleep(0.3)
noctl = len(sys.argv) > 1
print("recvmsg with", "no control buffer" if noctl else "a 64-byte control buffer", flush=True)
r = B.recvmsg(100, 0 if noctl else 64)
print("got", r, flush=True)
f2.close()
