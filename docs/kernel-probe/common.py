"""Shared helpers for the kernel-facts probes (our own code, run in the vmrig guest)."""
import errno
import os
import select
import socket
import struct
import subprocess
import time

AF_RDS = 21
SOL_RDS = 276
RDS_CANCEL_SENT_TO = 1
RDS_GET_MR = 2
RDS_FREE_MR = 3
RDS_RECVERR = 5
RDS_CONG_MONITOR = 6
SO_RDS_TRANSPORT = 8
SO_RDS_MSG_RXPATH_LATENCY = 10
RDS_CMSG_CONG_UPDATE = 5
SO_TIMESTAMP_OLD = 29
SO_TIMESTAMP_NEW = 63
HERE = os.path.dirname(os.path.abspath(__file__))
RDSINFO = os.environ.get("RDSINFO", os.path.join(HERE, "rdsinfo"))

M32 = 0xFFFFFFFF


def rol32(x, k):
    return ((x << k) | (x >> (32 - k))) & M32


def jhash_1word(a, initval):
    iv = (initval + 0xDEADBEEF + 4) & M32
    a = (a + iv) & M32
    b = iv
    c = iv
    c ^= b; c = (c - rol32(b, 14)) & M32
    a ^= c; a = (a - rol32(c, 11)) & M32
    b ^= a; b = (b - rol32(a, 25)) & M32
    c ^= b; c = (c - rol32(b, 16)) & M32
    a ^= c; a = (a - rol32(c, 4)) & M32
    b ^= a; b = (b - rol32(a, 14)) & M32
    c ^= b; c = (c - rol32(b, 24)) & M32
    return c


def mpath_hash(port, npaths=8, initval=0):
    """RDS_MPATH_HASH as in 6.1 (host-order port, per-socket initval)."""
    return jhash_1word(port, initval) & (npaths - 1)


def ports_with_hash(want_zero, start=20000, count=1):
    out = []
    p = start
    while len(out) < count:
        if (mpath_hash(p) == 0) == want_zero:
            out.append(p)
        p += 1
    return out


def ename(e):
    return errno.errorcode.get(e, str(e))


def rds(sock_factory=None):
    if sock_factory:
        return sock_factory()
    return socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0)


def attempt(fn, *a, **kw):
    """Run fn; return ('OK', result) or (ERRNAME, None)."""
    try:
        return "OK", fn(*a, **kw)
    except OSError as e:
        return ename(e.errno) if e.errno is not None else repr(e), None


def show(label, fn, *a, **kw):
    r, v = attempt(fn, *a, **kw)
    print(f"{label}: {r}" + (f" -> {v!r}" if r == "OK" and v is not None else ""), flush=True)
    return r, v


def pollmask(s, timeout_ms=0):
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLOUT | select.POLLRDNORM | select.POLLWRNORM |
               select.POLLWRBAND | select.POLLPRI | select.POLLERR)
    ev = p.poll(timeout_ms)
    m = ev[0][1] if ev else 0
    names = [n for n in ("POLLIN", "POLLPRI", "POLLOUT", "POLLERR", "POLLHUP", "POLLRDNORM",
                         "POLLRDBAND", "POLLWRNORM", "POLLWRBAND")
             if m & getattr(select, n)]
    return "|".join(names) or "0"


def rdsinfo(*args):
    out = subprocess.run([RDSINFO, *map(str, args)], capture_output=True, text=True)
    return out.stdout + out.stderr


def counters():
    d = {}
    for line in rdsinfo("counters").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            d[parts[0]] = int(parts[1])
    return d


def cdiff(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def get_int(s, level, opt):
    return struct.unpack("i", s.getsockopt(level, opt, 4))[0]


def sndtimeo(s, seconds):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                 struct.pack("ll", int(seconds), int((seconds % 1) * 1e6)))


def rcvtimeo(s, seconds):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                 struct.pack("ll", int(seconds), int((seconds % 1) * 1e6)))


def sin(ip, port):
    """struct sockaddr_in as bytes (for RDS_CANCEL_SENT_TO)."""
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(ip) + bytes(8)


class Factory:
    """Creates AF_RDS sockets inside a network namespace and passes the fds to us.

    Runs `ip netns exec NS python3 factory.py PATH` and talks over a unix socket
    bound to a filesystem path (path-based unix sockets work across netns).
    """

    def __init__(self, ns):
        self.ns = ns
        self.path = f"/tmp/rdsfactory-{ns}.sock"
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, "python3",
                                      os.path.join(HERE, "factory.py"), self.path])
        for _ in range(200):
            if os.path.exists(self.path):
                break
            time.sleep(0.05)
        self.c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.c.connect(self.path)
        self.f = self.c.makefile("rwb", buffering=0)

    def sock(self):
        self.c.sendall(b"sock\n")
        msg, fds, flags, addr = socket.recv_fds(self.c, 16, 1)
        return socket.socket(AF_RDS, socket.SOCK_SEQPACKET, 0, fileno=fds[0])

    def sh(self, cmd):
        data = ("sh " + cmd + "\n").encode()
        self.c.sendall(data)
        n = int(self.f.readline())
        return self.f.read(n).decode() if n else ""

    def close(self):
        try:
            self.c.sendall(b"quit\n")
        except OSError:
            pass
        self.proc.wait(timeout=5)
