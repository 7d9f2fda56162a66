"""Extra kernel RDS 6.1 probes, one mode per fresh guest (our own code).

  python3 probe_misc.py ib       SO_RDS_TRANSPORT=IB without rds_rdma loaded (init ns and ns1)
  python3 probe_misc.py noping   net.rds.ping_enable=0: loopback ping, TCP handshake
  python3 probe_misc.py larger   the larger address (ns2) sends first; who connects
Needs: modprobe rds_tcp; netpair up (for noping/larger/ib-in-ns).
"""
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *  # noqa

mode = sys.argv[1]


def alarm_send(s, data, addr, secs):
    fired = {}
    signal.signal(signal.SIGALRM, lambda *a: fired.setdefault("t", 1))
    signal.setitimer(signal.ITIMER_REAL, secs)
    t0 = time.monotonic()
    r = attempt(s.sendto, data, addr)
    signal.setitimer(signal.ITIMER_REAL, 0)
    return f"{r[0]} after {time.monotonic() - t0:.2f}s (alarm fired {bool(fired)})"


if mode == "ib":
    print("lsmod rds*:", os.popen("lsmod | grep -o '^rds[a-z_]*' | tr '\\n' ' '").read())
    s = rds()
    show("SO_RDS_TRANSPORT=0 (IB) in init ns, rds_rdma not loaded", s.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 0)
    print("lsmod rds* now:", os.popen("lsmod | grep -o '^rds[a-z_]*' | tr '\\n' ' '").read())
    print("get:", get_int(s, SOL_RDS, SO_RDS_TRANSPORT))
    show("bind 127.0.0.1:4000 with IB transport", s.bind, ("127.0.0.1", 4000))
    print("get after failed bind:", get_int(s, SOL_RDS, SO_RDS_TRANSPORT))
    s.close()
    f1 = Factory("ns1")
    s = f1.sock()
    show("SO_RDS_TRANSPORT=0 (IB) in ns1", s.setsockopt, SOL_RDS, SO_RDS_TRANSPORT, 0)
    show("bind 10.99.0.1:4000 with IB transport in ns1", s.bind, ("10.99.0.1", 4000))
    s2 = f1.sock()
    show("default bind 10.99.0.1:4001 in ns1 (rds_rdma now loaded)", s2.bind, ("10.99.0.1", 4001))
    print("  transport:", get_int(s2, SOL_RDS, SO_RDS_TRANSPORT))
    print(rdsinfo("len", 10000).strip(), "(counters incl. IB)")
    print(rdsinfo("len", 10008).strip(), "(RDS_INFO_IB_CONNECTIONS)")
    print(rdsinfo("len", 10017).strip(), "(RDS6_INFO_IB_CONNECTIONS)")
    f1.close()

elif mode == "noping":
    with open("/proc/sys/net/rds/ping_enable", "w") as f:
        f.write("0\n")
    p = rds()
    p.bind(("127.0.0.1", 0))
    before = counters()
    p.sendto(b"", ("127.0.0.1", 0))
    rcvtimeo(p, 1.0)
    print("loopback ping with ping_enable=0:", attempt(p.recvfrom, 100)[0])
    print("  counters:", cdiff(before, counters()))
    f1, f2 = Factory("ns1"), Factory("ns2")
    B = f2.sock()
    B.bind(("10.99.0.2", 4000))
    A = f1.sock()
    ap = ports_with_hash(False, 25000)[0]
    A.bind(("10.99.0.1", ap))
    print(f"blocking send from hash!=0 port {ap}, SIGALRM after 3s:", alarm_send(A, b"hi", ("10.99.0.2", 4000), 3))
    rcvtimeo(B, 2)
    print("B got:", attempt(B.recvfrom, 100))
    time.sleep(1)
    print(rdsinfo("tcp"))
    print(rdsinfo("conns"))
    print("second blocking send (probe outstanding), SIGALRM after 2s:",
          alarm_send(A, b"hi2", ("10.99.0.2", 4000), 2))
    print("B got:", attempt(B.recvfrom, 100))
    f1.close()
    f2.close()

elif mode == "larger":
    f1, f2 = Factory("ns1"), Factory("ns2")
    A = f1.sock()
    A.bind(("10.99.0.1", 4000))
    B = f2.sock()
    bp = ports_with_hash(True, 26000)[0]
    B.bind(("10.99.0.2", bp))
    before = counters()
    t0 = time.monotonic()
    B.sendto(b"from-larger", ("10.99.0.1", 4000))
    rcvtimeo(A, 5)
    r = attempt(A.recvfrom, 100)
    print(f"A (smaller) got {r} {time.monotonic() - t0:.2f}s after the larger side's first send")
    time.sleep(1.5)
    print("counters:", cdiff(before, counters()))
    print(rdsinfo("tcp"))
    print("ns1 ss:\n" + f1.sh("ss -tn 2>/dev/null"))
    # a plain TCP client in ns2 (larger) connecting to ns1's RDS listener
    out = f2.sh("python3 " + os.path.join(os.path.dirname(os.path.abspath(__file__)), "tcpclient.py") + " 10.99.0.1")
    print("plain TCP connect from the larger address to the smaller's listener (conn already up):", out)
    f1.close()
    f2.close()
print("done", flush=True)
