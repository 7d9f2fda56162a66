#!/usr/bin/env python3
"""pcap_lanes.py FILE.pcap [TRACE.log]

Diagnostic for the multipath slot hazard: reassembles the kernel's RDS-TCP
streams in a capture taken on our guest, and prints per TCP connection the
kernel lanes its data messages came from (a 6.1 kernel sends a socket's
messages on path jhash_1word(port, 0) & 7), their sequence numbers and
RETRANSMITTED flags. With the `TRACE path <i> <local port>` lines that
rds-conform prints under CONFORM_TRACE=1, a connection whose kernel lane
differs from our path index shows the kernel and us disagreeing on which
path a connection is.
"""
import struct
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conform import jhash_1word  # noqa: E402


def packets(path):
    data = open(path, "rb").read()
    end = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    off = 24
    while off + 16 <= len(data):
        ts, tus, incl, _ = struct.unpack(end + "IIII", data[off:off + 16])
        off += 16
        yield ts + tus / 1e6, data[off:off + incl]
        off += incl


def main():
    trace = {}
    if len(sys.argv) > 2:
        for line in open(sys.argv[2]):
            p = line.split()
            if len(p) >= 4 and p[0] == "TRACE" and p[1] == "path":
                trace.setdefault(int(p[3]), set()).add(int(p[2]))
    streams = {}
    events = []
    t_first = None
    for ts, f in packets(sys.argv[1]):
        if len(f) < 34 or f[12:14] != b"\x08\x00":
            continue
        ip = f[14:]
        ihl = (ip[0] & 15) * 4
        if ip[9] != 6:
            continue
        total = struct.unpack("!H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sp, dp, seq = struct.unpack("!HHI", tcp[:8])
        flags = tcp[13]
        doff = (tcp[12] >> 4) * 4
        pay = tcp[doff:]
        if sp != 16385 and dp != 16385:
            continue
        t_first = t_first or ts
        if flags & 0x07:  # FIN, SYN, RST: the connection timeline
            names = "".join(n for b, n in ((2, "S"), (1, "F"), (4, "R"), (16, ".")) if flags & b)
            events.append(f"t+{ts - t_first:7.3f} {sp}->{dp} {names}")
        key = (sp, dp)
        st = streams.setdefault(key, {"isn": None, "segs": {}, "t": ts})
        if flags & 2:  # SYN
            st["isn"] = seq + 1
            st["segs"] = {}
            st["t"] = ts
            continue
        if pay and st["isn"] is not None:
            st["segs"].setdefault((seq - st["isn"]) & 0xFFFFFFFF, pay)
    for e in events:
        print("EV " + e)
    for (sp, dp), st in sorted(streams.items(), key=lambda kv: kv[1]["t"]):
        buf = bytearray()
        for off in sorted(st["segs"]):
            p = st["segs"][off]
            if off > len(buf):
                break
            buf += p[len(buf) - off:]
        msgs = []
        o = 0
        while o + 48 <= len(buf):
            seq, _ack, ln, s, d, fl = struct.unpack("!QQIHHB", buf[o:o + 25])
            if o + 48 + ln > len(buf):
                break
            msgs.append((seq, ln, s, d, fl))
            o += 48 + ln
        data = [m for m in msgs if m[4] != 1 and m[2] > 1]
        lanes = sorted({jhash_1word(m[2]) & 7 for m in data})
        our_port = dp if sp == 16385 else sp
        paths = sorted(trace.get(our_port, []))
        rt = sum(1 for m in data if m[4] & 4)
        seqs = f"{data[0][0]}..{data[-1][0]}" if data else "-"
        flag = " MISMATCH" if paths and lanes and set(lanes) != set(paths) else ""
        print(f"t+{st['t'] - (t_first or st['t']):7.2f} {sp}->{dp} our path {paths} kernel lanes {lanes}"
              f" msgs {len(data)} seq {seqs} retransmitted {rt}{flag}")


if __name__ == "__main__":
    main()
