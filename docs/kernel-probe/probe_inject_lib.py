"""RDS-over-TCP framing helpers for the inject probes (our own code)."""
import socket
import struct

from common import ename

HDR = struct.Struct("!QQIHHBB4sH16s")  # 48 bytes


def hdr(seq=0, ack=0, length=0, sport=0, dport=0, flags=0, credit=0, csum=0, ext=b""):
    return HDR.pack(seq, ack, length, sport, dport, flags, credit, b"\0" * 4, csum, ext.ljust(16, b"\0"))


class Peer:
    def __init__(self, rcvbuf=None, label="t"):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.bind(("10.99.0.1", 0))
        self.s.connect(("10.99.0.2", 16385))
        self.buf = b""
        self.label = label
        print(f"[{label}] connected from port {self.s.getsockname()[1]}", flush=True)

    def send(self, h, payload=b""):
        self.s.sendall(h + payload)

    def read(self, timeout=1.0, quiet=False):
        """Read frames until `timeout` passes without data."""
        out = []
        self.s.settimeout(timeout)
        while True:
            while len(self.buf) >= 48:
                f = HDR.unpack(self.buf[:48])
                ln = f[2]
                if len(self.buf) < 48 + ln:
                    break
                payload = self.buf[48:48 + ln]
                self.buf = self.buf[48 + ln:]
                m = dict(seq=f[0], ack=f[1], len=ln, sport=f[3], dport=f[4], flags=f[5],
                         credit=f[6], pad=f[7].hex(), csum=f[8], ext=f[9].hex(),
                         payload_nonzero=sum(1 for b in payload if b), head=payload[:8].hex())
                out.append(m)
                if not quiet:
                    print(f"  [{self.label}] <- {m}", flush=True)
            try:
                d = self.s.recv(1 << 20)
            except socket.timeout:
                break
            except OSError as e:
                print(f"  [{self.label}] recv error {ename(e.errno)}", flush=True)
                break
            if not d:
                print(f"  [{self.label}] EOF", flush=True)
                break
            self.buf += d
        return out


