#!/usr/bin/env python3
"""Kernel side of the rds-ib verbs scenario (runs in the vmrig guest that
loads rds_rdma). AF_RDS = 21, SOCK_SEQPACKET, SOL_RDS = 276,
SO_RDS_TRANSPORT = 8 with RDS_TRANS_IB = 0.

  kernel_side.py recv BIND_IP PORT PEER_IP PEER_SPORT SIZE...
      receive one message per SIZE, check sender, length and contents
      (byte i of message k is (i + k) % 251), in order
  kernel_side.py send BIND_IP PORT PEER_IP PEER_PORT SIZE...
      send one message per SIZE with the same pattern
Prints KRX / KTX lines and KRESULT ok|FAIL; exit status 0 only for ok.
"""
import socket, struct, subprocess, sys

AF_RDS, SOL_RDS, SO_RDS_TRANSPORT, RDS_TRANS_IB = 21, 276, 8, 0
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33
BASE = bytes(range(251)) * ((1 << 20) // 251 + 2)


def pattern(k, n):
    return BASE[k % 251:k % 251 + n]


def sock(ip, port):
    s = socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)
    s.setsockopt(SOL_RDS, SO_RDS_TRANSPORT, struct.pack('i', RDS_TRANS_IB))
    s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    s.bind((ip, port))
    return s


def main():
    mode, ip, port, peer, pport = sys.argv[1:6]
    sizes = [int(x) for x in sys.argv[6:]]
    s = sock(ip, int(port))
    tr = struct.unpack('i', s.getsockopt(SOL_RDS, SO_RDS_TRANSPORT, 4))[0]
    print(f"KBOUND {ip}:{port} transport {tr}", flush=True)
    bad = 0
    if mode == 'recv':
        # The sender starts only once this socket is bound (the kernel drops
        # messages to unbound ports, acking them all the same).
        subprocess.run(['barrier', 'bound', '60'], check=True)
        s.settimeout(60)
        for k, n in enumerate(sizes):
            data, addr = s.recvfrom(2 << 20)
            ok = data == pattern(k, n) and addr == (peer, int(pport))
            bad += not ok
            print(f"KRX {k} len {len(data)} from {addr[0]}:{addr[1]} {'ok' if ok else 'BAD'}", flush=True)
    else:
        for k, n in enumerate(sizes):
            s.sendto(pattern(k, n), (peer, int(pport)))
            print(f"KTX {k} len {n}", flush=True)
    print("KRESULT ok" if not bad else f"KRESULT FAIL {bad} bad", flush=True)
    sys.exit(1 if bad else 0)


main()
