"""Cross-namespace probes of kernel RDS-TCP 6.1 (ns1 10.99.0.1 <-> ns2 10.99.0.2).

Run in the vmrig guest:  modprobe rds_tcp; netpair up; python3 probe_ns.py
Sockets are created inside ns1/ns2 by factory.py and passed to us over a unix
socket, so one process drives both ends.  Our own code.
"""
import os
import signal
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *  # noqa


def section(t):
    print(f"\n== {t}", flush=True)


class Alarm(Exception):
    pass


alarm_info = {}


def on_alarm(sig, frm):
    alarm_info["t"] = time.monotonic()
    if alarm_info.get("raise"):
        raise Alarm()


signal.signal(signal.SIGALRM, on_alarm)


def timed_send(s, data, addr, alarm_s, raise_on_alarm):
    alarm_info.clear()
    alarm_info["raise"] = raise_on_alarm
    signal.setitimer(signal.ITIMER_REAL, alarm_s)
    t0 = time.monotonic()
    try:
        r = s.sendto(data, addr)
        res = f"OK {r}"
    except Alarm:
        res = "interrupted by SIGALRM (exception raised from handler)"
    except OSError as e:
        res = ename(e.errno)
    signal.setitimer(signal.ITIMER_REAL, 0)
    el = time.monotonic() - t0
    fired = "t" in alarm_info
    return f"{res} after {el:.2f}s (alarm fired: {fired})"


f1 = Factory("ns1")
f2 = Factory("ns2")
warm = rds()
warm.bind(("127.0.0.1", 0))  # the first bind in the module's life gets the only random rs_hash_initval

section("multipath hash model: probe sent iff jhash_1word(port, 0) & 7 != 0 (c_npaths == 0)")
zero = ports_with_hash(True, 21000, 3)
nonzero = ports_with_hash(False, 21000, 3)
socks = []
for k, port in enumerate([zero[0], nonzero[0], zero[1], nonzero[1], zero[2], nonzero[2]]):
    s = f1.sock()
    s.bind(("10.99.0.1", port))
    s.setblocking(False)
    before = counters()
    r = attempt(s.sendto, b"x", (f"10.99.0.{30 + k}", 4000))
    d = cdiff(before, counters())
    print(f"port {port} hash {mpath_hash(port)}: non-blocking sendto unreachable 10.99.0.{30 + k} -> {r[0]}; "
          f"probe queued (send_pong delta) = {d.get('send_pong', 0)}")
    socks.append(s)
print(rdsinfo("send"))

section("blocking sender waits for the handshake (unreachable peer), SO_SNDTIMEO ignored")
s = f1.sock()
s.bind(("10.99.0.1", nonzero[0] + 1000 if mpath_hash(nonzero[0] + 1000) else ports_with_hash(False, 22000)[0]))
print("port", s.getsockname()[1], "hash", mpath_hash(s.getsockname()[1]))
sndtimeo(s, 1.0)
print("blocking sendto 10.99.0.40 with SO_SNDTIMEO=1s, SIGALRM after 3s (handler returns):",
      timed_send(s, b"x", ("10.99.0.40", 4000), 3.0, False))
print("again (probe already outstanding), SIGALRM after 2s:",
      timed_send(s, b"x", ("10.99.0.40", 4000), 2.0, False))
s0 = f1.sock()
s0.bind(("10.99.0.1", ports_with_hash(True, 22000)[0]))
print("hash-0 port blocking sendto same peer:", timed_send(s0, b"x", ("10.99.0.40", 4000), 3.0, False))
print(rdsinfo("conns"))

section("send queue full / SO_SNDTIMEO / cancel (unreachable peer 10.99.0.41)")
q = f1.sock()
qport = ports_with_hash(True, 23000)[0]
q.bind(("10.99.0.1", qport))
q.setblocking(False)
before = counters()
n = 0
while True:
    r, _ = attempt(q.sendto, bytes(40000), ("10.99.0.41", 5000))
    if r != "OK":
        print(f"accepted {n} x 40000 B (rds sndbuf 106496), then {r}")
        break
    n += 1
print("poll:", pollmask(q))
print("counter deltas:", cdiff(before, counters()))
q.setblocking(True)
sndtimeo(q, 0.5)
t0 = time.monotonic()
r = attempt(q.sendto, bytes(100), ("10.99.0.41", 5000))
print(f"blocking sendto with SO_SNDTIMEO=0.5s: {r[0]} after {time.monotonic() - t0:.2f}s")
print(rdsinfo("send"))
q.setsockopt(SOL_RDS, RDS_CANCEL_SENT_TO, sin("10.99.0.41", 5001))
print("after RDS_CANCEL_SENT_TO 10.99.0.41:5001 (wrong port) poll:", pollmask(q))
q.setsockopt(SOL_RDS, RDS_CANCEL_SENT_TO, sin("10.99.0.41", 5000))
print("after RDS_CANCEL_SENT_TO 10.99.0.41:5000 poll:", pollmask(q))
print(rdsinfo("send"))
q2 = f1.sock()
q2.bind(("10.99.0.1", ports_with_hash(True, 23100)[0]))
q2.setblocking(False)
for i in range(2):
    q2.sendto(bytes(1000), ("10.99.0.42", 5000))
q2.sendto(bytes(1000), ("10.99.0.43", 5000))
q2.setsockopt(SOL_RDS, RDS_CANCEL_SENT_TO, sin("10.99.0.42", 5000))
print("cancel to .42 only:")
print(rdsinfo("send"))
q2.close()
print("after close() of the sender (queue dropped?):")
print(rdsinfo("send"))

section("real peer: first contact, handshake, paths")
B = f2.sock()
B.bind(("10.99.0.2", 4000))
A = f1.sock()
aport = ports_with_hash(False, 24000)[0]
A.bind(("10.99.0.1", aport))
print("A port", aport, "hash", mpath_hash(aport))
before = counters()
print("A blocking sendto B:", timed_send(A, b"hello", ("10.99.0.2", 4000), 10.0, False))
rcvtimeo(B, 3)
print("B recvfrom:", attempt(B.recvfrom, 100))
time.sleep(1.5)
print("counter deltas:", cdiff(before, counters()))
print(rdsinfo("conns"))
print(rdsinfo("tcp"))
print("ns1 ss:\n" + f1.sh("ss -tnoe state all '( sport = :16385 or dport = :16385 )'"))
print("ns2 listener:\n" + f2.sh("ss -ltnoe"))
print("ns1 sysctls:\n" + f1.sh("ls /proc/sys/net/rds 2>&1; grep . /proc/sys/net/rds/tcp/* 2>&1"))
print("init ns sysctls:\n" + os.popen("grep . /proc/sys/net/rds/* 2>&1").read())

section("ping over TCP")
rcvtimeo(A, 3)
A.sendto(b"", ("10.99.0.2", 0))
print("A pong:", attempt(A.recvfrom, 100))
before = counters()
A.sendto(b"nobody", ("10.99.0.2", 4999))
time.sleep(0.5)
print("send to port without socket -> counter deltas:", cdiff(before, counters()))

section("echo + reply path")
B.sendto(b"reply", A.getsockname())
print("A got:", attempt(A.recvfrom, 100))

section("congestion (RDS_CONG_MONITOR, ENOBUFS, notification)")
B2 = f2.sock()
B2.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
print("B2 SO_RCVBUF get:", get_int(B2, socket.SOL_SOCKET, socket.SO_RCVBUF), "(rds rcvbuf = half)")
B2.bind(("10.99.0.2", 4100))
A3 = f1.sock()
A3.bind(("10.99.0.1", 4101))
A3.setsockopt(SOL_RDS, RDS_CONG_MONITOR, 1)
A3.setblocking(False)
before = counters()
ok = 0
res = None
for i in range(200):
    res, _ = attempt(A3.sendto, bytes(1500), ("10.99.0.2", 4100))
    if res != "OK":
        break
    ok += 1
    time.sleep(0.02)
print(f"A3 sent {ok} x 1500 B before {res}")
time.sleep(0.3)
print("A3 poll right after ENOBUFS:", pollmask(A3))
print("B2 queued:", rdsinfo("len", 10005).strip())
A3b = f1.sock()
A3b.bind(("10.99.0.1", 4102))
A3b.setblocking(False)
print("other (non-monitoring) socket sendto congested port:", attempt(A3b.sendto, b"x", ("10.99.0.2", 4100))[0])
print("  and to an uncongested port of the same peer:", attempt(A3b.sendto, b"x", ("10.99.0.2", 4000))[0])
A4 = f1.sock()
A4.bind(("10.99.0.1", 4103))
sndtimeo(A4, 0.5)
print("blocking sendto congested port, SO_SNDTIMEO=0.5s, SIGALRM(raise) after 2s:",
      timed_send(A4, b"x", ("10.99.0.2", 4100), 2.0, True))
print("counter deltas:", cdiff(before, counters()))
B.sendto(b"data-for-A3", ("10.99.0.1", 4101))
time.sleep(0.3)
B2.setblocking(False)
drained = 0
while True:
    try:
        B2.recv(1 << 20)
        drained += 1
    except BlockingIOError:
        break
print("B2 drained", drained)
time.sleep(0.5)
print("A3 poll after drain:", pollmask(A3))
A3.setblocking(True)
for k in range(3):
    r = attempt(A3.recvmsg, 100, 1024, socket.MSG_DONTWAIT)
    if r[0] == "OK":
        data, anc, fl, addr = r[1]
        print(f"A3 recvmsg #{k}: data={data!r} flags={fl:#x} addr={addr} cmsgs=" +
              str([(l, t, d.hex(), struct.unpack('Q', d)[0] if len(d) == 8 else None) for l, t, d in anc]))
    else:
        print(f"A3 recvmsg #{k}: {r[0]}")
print(f"expected mask 1<<(4100%64) = {1 << (4100 % 64):#x}")
print("A3b poll (non-monitoring, had ENOBUFS):", pollmask(A3b), "then", pollmask(A3b))
A5 = f1.sock()
A5.bind(("10.99.0.1", 4104))
A5.setsockopt(SOL_RDS, RDS_CONG_MONITOR, 1)
print("cong notify without msg_control: ")
# re-congest, and let A5 record the port, then drain and read without a control buffer
ok = 0
A5.setblocking(False)
for i in range(200):
    res, _ = attempt(A5.sendto, bytes(1500), ("10.99.0.2", 4100))
    if res != "OK":
        break
    ok += 1
    time.sleep(0.02)
print(f"  A5 sent {ok} before {res}")
while True:
    try:
        B2.recv(1 << 20)
    except BlockingIOError:
        break
time.sleep(0.5)
r = attempt(A5.recvmsg, 100, 0, socket.MSG_DONTWAIT)
print("  A5 recvmsg(controllen 0):", r[0], (r[1][0], hex(r[1][2])) if r[0] == "OK" else "")
print("  A5 poll after:", pollmask(A5))

section("retransmit queue settles")
time.sleep(0.5)
print(rdsinfo("len", 10004).strip())

section("per-netns tcp sysctl write resets connections")
before = counters()
print(f1.sh("echo 65536 > /proc/sys/net/rds/tcp/rds_tcp_sndbuf; cat /proc/sys/net/rds/tcp/rds_tcp_sndbuf"))
time.sleep(1.5)
print("counter deltas:", cdiff(before, counters()))
print(rdsinfo("len", 10007).strip())
A.sendto(b"after-reset", ("10.99.0.2", 4000))
print("B got:", attempt(B.recvfrom, 100))
print(f1.sh("echo 100 > /proc/sys/net/rds/tcp/rds_tcp_sndbuf; echo rc=$?; cat /proc/sys/net/rds/tcp/rds_tcp_sndbuf"))

section("RDS_INFO_SOCKETS is global (all netns)")
print(rdsinfo("sockets"))
f1.close()
f2.close()
print("done", flush=True)
