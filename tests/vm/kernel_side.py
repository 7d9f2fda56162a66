#!/usr/bin/env python3
"""Kernel side of the rds-ib verbs scenario (runs in the vmrig guest that
loads rds_rdma). AF_RDS = 21, SOCK_SEQPACKET, SOL_RDS = 276,
SO_RDS_TRANSPORT = 8 with RDS_TRANS_IB = 0.

  kernel_side.py recv BIND_IP PORT PEER_IP PEER_SPORT SIZE...
      receive one message per SIZE, check sender, length and contents
      (byte i of message k is (i + k) % 251), in order
  kernel_side.py send BIND_IP PORT PEER_IP PEER_PORT SIZE...
      send one message per SIZE with the same pattern
  kernel_side.py stream-send BIND_IP PORT PEER_IP PEER_PORT N
      send N numbered datagrams of mixed sizes (64 B .. 64 KiB, the same
      as rds-ib-peer's stream mode: 8-byte big-endian index, then the
      pattern), sleeping GAP_US (default 3000) microseconds after each and
      retrying ENOBUFS / EAGAIN (a full send buffer while the connection is
      down) for up to 60 s per datagram
  kernel_side.py stream-recv BIND_IP PORT PEER_IP PEER_PORT N
      receive until datagram N-1 arrived (WAIT_S, default 60, without
      anything ends it), then STRAGGLE_S (default 3) more seconds for late
      duplicates; each is checked against the next expected index (sender,
      length, every byte): KRXSTAT received r inorder o dup d lost l bad b
Both stream modes run `barrier $BARRIER 60` after binding when BARRIER is
set and `barrier $END_BARRIER 180` before closing the socket when
END_BARRIER is set (the kernel drops a closed socket's unacked messages).
Prints KRX / KTX lines and KRESULT ok|FAIL; exit status 0 only for ok.
"""
import errno, os, socket, struct, subprocess, sys, time

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


M64 = (1 << 64) - 1


def stream_len(k):
    """rds-ib-peer's stream_len: 64 B .. 64 KiB, mostly small."""
    h = (k * 0x9E3779B97F4A7C15) & M64
    h = ((h << 29) | (h >> 35)) & M64
    h = (h * 0xBF58476D1CE4E5B9) & M64
    h ^= h >> 31
    r = h % 8
    if r == 0:
        return 65536
    if r == 1:
        return 64
    if r in (2, 3):
        return 64 + (h >> 8) % (65536 - 64 + 1)
    return 64 + (h >> 8) % 4033


def stream_msg(k):
    return k.to_bytes(8, 'big') + pattern(k, stream_len(k))[8:]


def barrier(env):
    name = os.environ.get(env)
    if name:
        subprocess.run(['barrier', name, '180' if env == 'END_BARRIER' else '60'], check=(env == 'BARRIER'))


def stream(mode, s, peer, pport, n):
    barrier('BARRIER')
    t0 = time.monotonic()
    ok = True
    if mode == 'stream-send':
        gap = int(os.environ.get('GAP_US', '3000')) / 1e6
        total = 0
        for k in range(n):
            m = stream_msg(k)
            deadline = time.monotonic() + 60
            while True:
                try:
                    s.sendto(m, (peer, pport))
                    break
                except OSError as e:
                    if e.errno in (errno.ENOBUFS, errno.EAGAIN) and time.monotonic() < deadline:
                        time.sleep(0.002)
                        continue
                    print(f"KSEND {k} failed: {e}", flush=True)
                    ok = False
                    break
            if not ok:
                break
            total += len(m)
            if k % 500 == 0:
                print(f"KPROGRESS {k} at {time.monotonic() - t0:.2f} s", flush=True)
            time.sleep(gap)
        if ok:
            print(f"KSENT {n} bytes {total} in {time.monotonic() - t0:.2f} s", flush=True)
    else:
        received = inorder = dup = lost = bad = 0
        anomalies = 0
        nxt = 0

        def note(what):
            nonlocal anomalies
            anomalies += 1
            if anomalies <= 20:
                print(f"KANOMALY {what}", flush=True)

        s.settimeout(float(os.environ.get('WAIT_S', '60')))
        straggling = False
        while True:
            try:
                data, addr = s.recvfrom(1 << 17)
            except socket.timeout:
                break
            received += 1
            k = int.from_bytes(data[:8], 'big') if len(data) >= 8 else -1
            if addr != (peer, pport) or not 0 <= k < n or data != stream_msg(k):
                bad += 1
                note(f"bad message #{received} len {len(data)} from {addr} k {k}")
            elif k < nxt:
                dup += 1
                note(f"duplicate k {k} (expected {nxt})")
            else:
                if k > nxt:
                    lost += k - nxt
                    note(f"gap: k {k} while expecting {nxt}")
                else:
                    inorder += 1
                nxt = k + 1
            if nxt == n and not straggling:
                print(f"KLAST at {time.monotonic() - t0:.2f} s", flush=True)
                straggling = True
                s.settimeout(float(os.environ.get('STRAGGLE_S', '3')))
        lost += n - nxt
        print(f"KRXSTAT received {received} inorder {inorder} dup {dup} lost {lost} bad {bad}", flush=True)
        ok = inorder == n and received == n and dup + lost + bad == 0
    barrier('END_BARRIER')
    return ok


def main():
    mode, ip, port, peer, pport = sys.argv[1:6]
    if mode.startswith('stream-'):
        s = sock(ip, int(port))
        tr = struct.unpack('i', s.getsockopt(SOL_RDS, SO_RDS_TRANSPORT, 4))[0]
        print(f"KBOUND {ip}:{port} transport {tr}", flush=True)
        ok = stream(mode, s, peer, int(pport), int(sys.argv[6]))
        print("KRESULT ok" if ok else "KRESULT FAIL", flush=True)
        sys.exit(0 if ok else 1)
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
