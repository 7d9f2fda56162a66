#!/usr/bin/env python3
"""Writes docs/perf.md from the "R key value [unit]" lines of
scripts/perf/guest.sh (VM rig), scripts/perf/host.sh (host loopback) and
scripts/perf/scale.sh (scale, host loopback), and OUT.json beside it (the
figures perf-chart draws docs/perf.svg from).

Usage: report.py OUT.md META.txt VM.txt HOST.txt SCALE.txt
META.txt holds "key value" lines: commit, date, nproc, kernel, cpu,
duration, vm_status, chart (the chart's status), and cmd lines (the exact
commands)."""
import json
import os
import statistics
import sys


def load(path):
    vals = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "R":
                    vals.setdefault(parts[1], []).append((parts[2], " ".join(parts[3:])))
    except OSError:
        pass
    return vals


SCALE = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}


def num(vals, key, kind):
    """The best of the rounds' values of key, normalised: bandwidth in MB/s
    (the highest), latency in us (the lowest), rate in messages/s (the
    highest). None when missing or every round failed."""
    xs = [x for x in (one(v, u, kind) for v, u in vals.get(key, [])) if x is not None]
    if not xs:
        return None
    return min(xs) if kind == "lat" else max(xs)


def row_keys(p):
    """The rows issue 14's targets are on, in the tables' order, each with
    the keys of its figures (prefix `p`): ours (qperf, or rds-window for
    the message rate, under the shim), the kernel's, raw TCP's (None: no
    raw TCP run), and their kind."""
    keys = {f"bandwidth {label}": (f"{p}shim_{size}_bw", f"{p}kern_{size}_bw", f"{p}raw_{size}_bw", "bw")
            for size, label in ((1024, "1 KiB"), (8192, "8 KiB"), (65536, "64 KiB"))}
    keys["one-way latency 64 B"] = (f"{p}shim_64_lat", f"{p}kern_64_lat", f"{p}raw_64_lat", "lat")
    # Issue 14's definition: 16 in flight, each answered (rds-window on
    # the kernel's AF_RDS and on ours under the shim; no raw TCP run).
    keys["message rate 64 B, 16 in flight"] = (f"{p}shim_64_w16_rate", f"{p}kern_64_w16_rate", None, "rate")
    return keys


def paired(vals, a, b, kind):
    """The ratio a / b of each round in which both were measured: the
    rounds print every key once each (a run that failed prints FAILED
    under its keys), so the i-th values of two keys come from the same
    round. [] when the keys do not have a value per round each (a run
    whose output held no figure prints nothing)."""
    xa, xb = vals.get(a, []), vals.get(b, [])
    if not xa or len(xa) != len(xb):
        return []
    out = []
    for (va, ua), (vb, ub) in zip(xa, xb):
        p, q = one(va, ua, kind), one(vb, ub, kind)
        if p is not None and q:
            out.append(p / q)
    return out


def first(vals, key):
    return vals.get(key, [("?", "")])[0][0]


def one(v, unit, kind):
    try:
        x = float(v)
    except ValueError:
        return None
    u = unit.split("/")[0]
    if kind == "bw":  # qperf: bytes/sec, KB/sec, MB/sec, GB/sec (decimal)
        p = u[:-1] if u.endswith("B") else u
        return x * SCALE.get(p, 1) / 1e6
    if kind == "lat":
        return x * {"ns": 1e-3, "us": 1, "ms": 1e3, "sec": 1e6, "s": 1e6}.get(u, 1)
    if kind == "rate":
        return x * SCALE.get(u, 1)
    return x


def fmt(x, kind):
    if x is None:
        return "not measured"
    if kind == "bw":
        return f"{x:,.1f} MB/s" if x < 1000 else f"{x / 1000:,.2f} GB/s"
    if kind == "lat":
        return f"{x:,.1f} us"
    if kind == "rate":
        return f"{x / 1000:,.1f} k msg/s"
    return str(x)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fr(r):
    return "-" if r is None else f"{r:.2f}"


def main():
    out, meta_path, vm_path, host_path, scale_path = sys.argv[1:6]
    meta = {}
    cmds = []
    with open(meta_path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition(" ")
            if k == "cmd":
                cmds.append(v)
            else:
                meta[k] = v
    vm = load(vm_path)
    host = load(host_path)
    scale = load(scale_path)

    def vm_rows(p, vals, with_kernel):
        """(name, kind, raw TCP, kernel, ours, ours with our tools, which):
        ours is qperf under the LD_PRELOAD shim where measured (the same
        program as raw TCP's and the kernel's), else our tools' figure;
        `which` says which."""
        rows = []

        def row(name, kind, raw, kern, shim, tools):
            ours, which = (shim, "qperf") if shim is not None else (tools, "tools")
            rows.append((name, kind, raw, kern if with_kernel else None, ours, tools, which))

        rtt = num(vals, f"{p}ours_64_d1_rtt", "lat")
        tools = {"bandwidth 1 KiB": num(vals, f"{p}ours_1024_bw", "bw"),
                 "bandwidth 8 KiB": num(vals, f"{p}ours_8192_bw", "bw"),
                 "bandwidth 64 KiB": num(vals, f"{p}ours_65536_bw", "bw"),
                 "one-way latency 64 B": None if rtt is None else rtt / 2,
                 "message rate 64 B, 16 in flight": num(vals, f"{p}ours_64_d16_rate", "rate")}
        for name, (ko, kk, kr, kind) in row_keys(p).items():
            row(name, kind, kr and num(vals, kr, kind), num(vals, kk, kind), num(vals, ko, kind), tools[name])
        # A program that waits in poll and receives with MSG_DONTWAIT
        # (rds-window -p, one in flight; the kernel's AF_RDS and ours under
        # the shim): round trip / 2.
        kw, sw = num(vals, f"{p}kern_64_w1p_rtt", "lat"), num(vals, f"{p}shim_64_w1p_rtt", "lat")
        row("one-way latency 64 B, waiting in poll", "lat", None, None if kw is None else kw / 2,
            None if sw is None else sw / 2, None)
        # qperf's stream: no limit in flight, nothing answered.
        row("message rate 64 B, stream", "rate", num(vals, f"{p}raw_64_rate", "rate"),
            num(vals, f"{p}kern_64_rate", "rate"), num(vals, f"{p}shim_64_rate", "rate"), None)
        return rows

    L = []
    w = L.append
    w("# Performance, side by side with the kernel's RDS-TCP")
    w("")
    w("Generated by `scripts/perf.sh` (do not edit by hand; run it again).")
    w("")
    w(f"- commit: `{meta.get('commit', '?')}`")
    w(f"- date: {meta.get('date', '?')}")
    w(f"- machine: {meta.get('nproc', '?')} CPUs ({meta.get('cpu', '?')}), "
      f"kernel {meta.get('kernel', '?')}; the host is shared, figures vary between runs")
    w(f"- VM rig: {meta.get('vm_status', '?')}; guest kernel "
      f"{first(vm, 'vm_kernel')}, {first(vm, 'vm_nproc')} vCPUs, "
      f"accel {meta.get('vm_accel', '?')}")
    w(f"- the whole run took {meta.get('duration', '?')} s; every figure is the best of "
      f"{meta.get('rounds', '?')} rounds, every target the median of the rounds' ratios (the machine is shared: load average "
      f"{meta.get('load_start', '?')} at the start, {meta.get('load_end', '?')} at the end)")
    try:
        # The load at the start: the run's own processes raise the end figure.
        busy = float(meta.get("load_start", "0").split()[0]) > 0.5 * float(meta.get("nproc", "1"))
    except ValueError:
        busy = False
    if busy:
        w("- WARNING: the machine was busy during this run (load average above half its "
          "CPUs, from other work): the VM guest runs under emulation (TCG) and its "
          "latencies grow several times under load; compare only ratios of one run, "
          "and figures between runs only at a similar load")
    svg = os.path.splitext(os.path.basename(out))[0] + ".svg"
    chart = meta.get("chart", "drawn")
    if chart == "drawn":
        w(f"- the chart: [`{svg}`]({svg}) (bandwidth by message size in the VM rig, "
          "one-way latency of 64 B in the VM rig and on the host loopback), drawn by "
          "`perf-chart` from the figures of this page")
    else:
        w(f"- the chart `{svg}` is missing: {chart}")
    w("")
    w("## VM rig: one guest, two network namespaces joined by veth, one boot")
    w("")
    w("Raw TCP: qperf `tcp_bw` / `tcp_lat`. Kernel: qperf `rds_bw` / `rds_lat` on the "
      "kernel's RDS-TCP (`modprobe rds_tcp`). Ours: the same unmodified qperf `rds_bw` / "
      "`rds_lat`, server and client both under `LD_PRELOAD=librdspreload.so` (built with "
      "`cargo rustc --profile dist -p rds-preload --lib --crate-type cdylib`: the whole stack optimised as one unit), on RDS-TCP "
      "port 16386 (`RDS_TCP_PORT`) beside the kernel's module; the ratios and the targets "
      "use these figures. The message rate with 16 in flight: `rds-window` "
      "(`scripts/perf/rds_window.c`, a C program on plain AF_RDS sockets, as qperf; "
      "qperf cannot limit what is in flight) sends 64 B messages from A and keeps 16 "
      "in flight, B answers each with 64 B; the same binary on the kernel's RDS-TCP and "
      "on ours under the shim; messages answered per second. The latency waiting in poll: "
      "`rds-window -p` with one message in flight, both sides waiting in `poll(POLLIN)` and "
      "receiving with `MSG_DONTWAIT` (as rds-tools' rds-stress and event loops do), round trip / 2, "
      "the kernel's and ours under the shim (whose `poll` reads the socket's connection "
      "itself while it waits, as its blocking receive does). The stream row is qperf's "
      "`rds_bw -m 64` msg_rate (no limit in flight, nothing answered). Each round runs "
      "raw TCP, ours and the kernel one after the other, so that the shared machine's "
      "load moves them together. Ours with our tools, for comparison: bandwidth = `rds-gen --no-digest` -> `rds-sink`, the whole "
      "transfer timed (connection set-up included, until everything is acknowledged); "
      "latency = `rds-stress -t 1 -d 1 -q 64 -a 64` round trip / 2; message rate = "
      "requests per second of `rds-stress -t 1 -d 16 -q 64 -a 64 -o` (16 in flight, one "
      "way, each answered by a 64 B ack).")
    w("")
    w("| | raw TCP | kernel RDS-TCP | ours (qperf, shim) | ours / kernel | ours / raw TCP | ours (our tools) |")
    w("|---|---|---|---|---|---|---|")
    vrows = vm_rows("vm_", vm, True)
    for name, kind, raw, kern, ours, tools, which in vrows:
        mark = "" if which == "qperf" or ours is None else " (our tools: qperf under the shim not measured)"
        w(f"| {name} | {fmt(raw, kind)} | {fmt(kern, kind)} | {fmt(ours, kind)}{mark} | "
          f"{fr(ratio(ours, kern))} | {fr(ratio(ours, raw))} | {fmt(tools, kind)} |")
    w("")
    w("For latency a ratio below 1 is better; for bandwidth and message rate above 1. "
      f"Ours with our tools, round trip 64 B: {fmt(num(vm, 'vm_ours_64_d1_rtt', 'lat'), 'lat')}, "
      f"{fmt(num(vm, 'vm_ours_64_d1_txcall', 'lat'), 'lat')} per send call; with 16 in "
      f"flight: round trip {fmt(num(vm, 'vm_ours_64_d16_rtt', 'lat'), 'lat')}.")
    w("")
    why_section(w, vm)
    w("## Host loopback (no kernel RDS on the host)")
    w("")
    if "host_noqperf" in host:
        w("qperf is not installed on the host: no raw TCP column.")
    else:
        w("Raw TCP: qperf `tcp_bw` / `tcp_lat` on 127.0.0.1 (one send call per "
          "message). Ours: qperf `rds_bw` / `rds_lat` under the shim and our tools, as in "
          "the VM, 127.0.0.1 -> 127.0.0.2.")
    w("")
    w("| | raw TCP | ours (qperf, shim) | ours / raw TCP | ours (our tools) |")
    w("|---|---|---|---|---|")
    for name, kind, raw, _kern, ours, tools, which in vm_rows("host_", host, False):
        mark = "" if which == "qperf" or ours is None else " (our tools)"
        w(f"| {name} | {fmt(raw, kind)} | {fmt(ours, kind)}{mark} | {fr(ratio(ours, raw))} | {fmt(tools, kind)} |")
    w("")
    w(f"Ours with our tools, round trip 64 B: {fmt(num(host, 'host_ours_64_d1_rtt', 'lat'), 'lat')}, "
      f"{fmt(num(host, 'host_ours_64_d1_txcall', 'lat'), 'lat')} per send call; with 16 "
      f"in flight: round trip {fmt(num(host, 'host_ours_64_d16_rtt', 'lat'), 'lat')}.")
    w("")
    instr_section(w, host)
    w("## Issue 14's targets (ratios from this run: VM rig; scale on the host loopback)")
    w("")
    w("Each VM target takes the median of the rounds' ratios, ours over the baseline measured "
      "in the same round (minutes apart; the baselines run before ours in odd rounds and after "
      "it in even ones), as the scale target below does: on this shared machine one side's "
      "figure moves by up to 1.6x between rounds of one boot, and the best of each side "
      "over all rounds pairs figures measured at different loads. The best against the best "
      "(the tables above) is shown beside it.")
    w("")
    by = {r[0]: r for r in vrows}

    keys = row_keys("vm_")

    def target(text, row, base, cmp, bound):
        _n, _k, raw, kern, ours, _tools, which = by[row]
        best = ratio(ours, kern if base == "kernel" else raw)
        ko, kk, kr, kind = keys[row]
        rs = paired(vm, ko, kk if base == "kernel" else kr, kind) if which == "qperf" else []
        if rs:
            r = statistics.median(rs)
            how = (f"the median of the rounds' ratios ({', '.join(f'{x:.2f}' for x in rs)}); "
                   f"best against best {fr(best)}")
        else:
            r, how = best, "best against best (the rounds' figures could not be paired)"
        if r is None:
            w(f"- [ ] {text}: not measured")
            return
        met = r >= bound if cmp == ">=" else r <= bound
        w(f"- [{'x' if met else ' '}] {text}: {r:.2f}, {how} ({'met' if met else 'not met'})")
        if not met:
            why = gap_cause(vm, row, base, raw, kern)
            if why:
                w(f"  - measured cause: {why}")

    target("bandwidth 1 KiB >= 1.5x the kernel's", "bandwidth 1 KiB", "kernel", ">=", 1.5)
    target("bandwidth 8 KiB >= 1.5x the kernel's", "bandwidth 8 KiB", "kernel", ">=", 1.5)
    target("bandwidth 64 KiB >= the kernel's", "bandwidth 64 KiB", "kernel", ">=", 1.0)
    target("bandwidth 64 KiB >= 0.9x raw TCP's", "bandwidth 64 KiB", "raw", ">=", 0.9)
    target("one-way latency 64 B <= the kernel's", "one-way latency 64 B", "kernel", "<=", 1.0)
    target("one-way latency 64 B <= 1.3x raw TCP's", "one-way latency 64 B", "raw", "<=", 1.3)
    target("message rate 64 B with 16 in flight >= 2x the kernel's", "message rate 64 B, 16 in flight",
           "kernel", ">=", 2.0)
    checks = scale_checks(scale)
    for text, state, detail in checks:
        w(f"- [{'x' if state == 'met' else ' '}] {text}: {detail} ({state})")
    w("")
    scale_section(w, scale, meta)
    w("## Commands")
    w("")
    w("```")
    w("scripts/perf.sh")
    w("```")
    w("")
    w("runs, on the host in a private network namespace (`unshare -n "
      "scripts/perf/scale.sh`), the scale part:")
    w("")
    w("```")
    w("rds-scale serve -s 127.0.0.1:4000 --sockets 8 --threads 2 -t 300 &")
    w(f"rds-scale peers -d 127.0.0.1:4000 --peers {first(scale, 'scale_peers')} --rounds {first(scale, 'scale_rounds')}"
      "      # -m 8K -l 1G by default")
    w(f"rds-scale paths -d 127.0.0.1:4000 -s 127.0.0.18:6000 --npaths 8 -T {meta.get('stress_t', '4')}")
    w(f"rds-scale paths -d 127.0.0.1:4000 -s 127.0.0.11:6000 --npaths 1 -T {meta.get('stress_t', '4')}")
    w("```")
    w("")
    w("and, in the VM rig (`vmrig run -- scripts/perf/guest.sh`; A = `ip netns exec ns1`, "
      "10.99.0.1; B = `ip netns exec ns2`, 10.99.0.2) and on the host "
      "(`unshare -n scripts/perf/host.sh`; A = 127.0.0.1, B = 127.0.0.2):")
    w("")
    w("```")
    for c in cmds:
        w(c)
    w("```")
    w("")
    with open(out, "w") as f:
        f.write("\n".join(L))
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump(chart_figures(meta, vrows, vm_rows("host_", host, False)), f, indent=1)
        f.write("\n")


def instr_section(w, host):
    """User-space instructions per 64 B round trip (host.sh's instr_suite:
    callgrind), raw TCP against ours."""
    def n(k):
        v = host.get(f"host_instr_{k}")
        try:
            return int(v[0][0]) if v else None
        except ValueError:
            return None
    raw, ours, recv, send = (n(k) for k in ("raw", "shim", "shim_recv", "shim_send"))
    def c(x):
        return "not measured" if x is None else f"{x:,}"
    if ours is None:
        w("No instruction counts (valgrind or qperf is not installed, or the counted runs failed: see the output of perf.sh).")
        w("")
        return
    w(f"User-space instructions per 64 B round trip of qperf's latency client process, every "
      f"thread, counted by callgrind (valgrind; a 3 s run minus a 1 s run, so start-up is not "
      f"counted): raw TCP (`tcp_lat`) {c(raw)}, ours "
      f"(`rds_lat` under the shim) {c(ours)}: the receive call {c(recv)}, the send call {c(send)}, "
      f"the rest the engine's reactor and timer threads and qperf itself. The count does not "
      f"depend on the machine's load, where the timings above do. In the VM rig every one "
      f"of these instructions is emulated (TCG), which is why ours spends so much more user "
      f"time per round trip there than the kernel's qperf, whose RDS runs inside its two "
      f"system calls.")
    w("")


def why_section(w, vm):
    """Where a round trip's time goes in the VM rig (guest.sh's why_lat):
    one more qperf latency run each for raw TCP, ours under the shim and
    the kernel, measured over 2 s in its middle."""
    kinds = [("raw", "raw TCP (`tcp_lat`)"), ("kern", "kernel RDS-TCP (`rds_lat`)"),
             ("shim", "ours (`rds_lat`, shim)")]
    if not any(f"vm_why_{k}_lat" in vm for k, _ in kinds):
        return
    w("### Where a round trip's time goes (VM rig)")
    w("")
    w("One more qperf 64 B latency run of each, 6 s; over 2 s in its middle, the share "
      "of the guest's CPU time that was idle (`/proc/stat`), and the CPU time and the "
      "context switches of the two qperf processes, every thread of each and of the "
      "server's forked child (`/proc/PID/task/*`), per round trip, and the TCP segments "
      "the two namespaces sent (`/proc/PID/net/snmp`: data and acks, both ways). The "
      "kernel's RDS works inside qperf's system calls and in softirq, which is counted "
      "only when it runs in qperf's context; ours works in qperf's thread and in the "
      "engine's threads (reactor, timer), shown apart.")
    w("")
    why_table(w, vm, [(f"vm_why_{k}", n) for k, n in kinds], ("lat", "one-way latency in this run"),
              "round trip")
    w("Ours under the shim: qperf's blocking receive polls the TCP connections its "
      "last message came over beside its socket's descriptor and reads and delivers "
      "what arrives itself (`rds_tcp::RxAssist`), so a message wakes the receiver once, "
      "as the kernel's RDS does from its TCP receive callback. While it waits, the "
      "connection its last message came on is off the reactor's epoll registration for "
      "readable events, and writable events are registered only while a write waits for "
      "room (each acknowledged segment woke the reactor before), so the answer does not "
      "wake the engine's reactor thread through epoll; its timer still does, about once "
      "per 10 ms while the receive lingers on its lane (`rds_tcp::ASSIST_LINGER`: the "
      "timer ends lingers and polls the watched acks as it goes; two engines at one per "
      "10 ms make about 0.2 wake-ups per round trip of 900 us). The engine's threads still count the wake-ups in the table (a "
      "wake-up is a voluntary context switch: any sleep, in epoll_wait or on a lock, ours "
      "or the kernel's socket lock that every read, write and ioctl of a TCP socket "
      "takes); this run does not break them down, and a count of the client's reactor's "
      "system calls over 2 s (perf stat, tracepoints) found about one epoll_wait per four "
      "round trips. A program that polls the descriptor (our rds-stress above) gets every "
      "message from the reactor. The rest of the gap is CPU time in qperf's own threads: "
      "the user-space code of the shim and the engine per message (the row above; the "
      "kernel's qperf spends almost none there) and more system calls per message and "
      "side than the kernel's recvmsg and sendmsg, where the kernel's RDS works inside "
      "those two calls and in softirq. Counted with `strace -f -c` of the client in the "
      "rig (2026-11-30), per round trip: one `sendmsg`, one `poll`, one `recvfrom`, 3.2 "
      "`clock_gettime` (a system call in this guest, whose hpet clock has no vDSO read: "
      "2.5 us each) and under 0.5 each of `epoll_wait`, `read`, `timerfd_settime`, `ioctl` "
      "and `sched_yield`. The `poll` before each read is not what costs: a C ping-pong of "
      "64 B over the same veth measured 165-227 us one way with blocking reads and 175-223 "
      "us with a `poll` of the socket and an eventfd before each (three rounds, one boot); "
      "the rest of the guest's kernel time per round trip above (ours against the "
      "kernel's) was not broken down further.")
    w("")
    bw_why_section(w, vm)
    sb_section(w, vm)
    window_why_section(w, vm)


def why_val(vm, key):
    """A figure of the why runs as a float, None when not measured."""
    v = vm.get(key)
    try:
        return float(v[0][0]) if v else None
    except ValueError:
        return None


def gap_cause(vm, row, base, raw, kern):
    """What this run measured of an unmet VM target's gap: the why runs'
    CPU time and context switches of ours against the kernel's."""
    def figs(prefix):
        return {x: why_val(vm, f"{prefix}_{x}") for x in ("cpu", "user", "server", "engine", "wakes", "switches", "idle")}

    def per(size, k):
        return figs(f"vm_why_bw{size}_{k}" if size else f"vm_why_{k}")
    sizes = {"bandwidth 1 KiB": 1024, "bandwidth 8 KiB": 8192, "bandwidth 64 KiB": 65536}
    if row == "message rate 64 B, 16 in flight" and base == "kernel":
        o, k = figs("vm_why_w16_shim"), figs("vm_why_w16_kern")
        if o["cpu"] is None or k["cpu"] is None:
            return None
        s = (f"with 16 in flight the guest's CPUs are busy ({o['idle']:.0f}% idle against "
             f"the kernel's {k['idle']:.0f}%), so the rate is the CPU time per answered "
             f"message: the two rds-window processes spent {o['cpu']:.0f} us against the "
             f"kernel's {k['cpu']:.0f} us, of it {o['user']:.0f} us in user space against "
             f"{k['user']:.0f} (the shim's and the engine's code for a send and a receive, "
             f"each instruction emulated) and {o['engine']:.0f} us in our engine's threads "
             f"({o['wakes']:.2f} wake-ups per message; {o['switches']:.2f} context switches "
             f"against {k['switches']:.2f}) (\"Where a message's time goes with 16 in flight\")")
        if o["wakes"] is not None and o["wakes"] >= 0.5:
            s += ("; a message that arrives while no receive waits for it is read by our "
                  "reactor and handed to the program's thread, two threads woken per message, "
                  "where the kernel's RDS delivers it from its TCP receive callback")
        else:
            s += ("; the program's own receive reads its answers (`rds_tcp::ASSIST_LINGER`) "
                  "and the answers to messages still queued go out up to 8 per write "
                  "(`rds_sock`'s batch, `tcp_tx_batched`), so what is left is the user-space "
                  "code per message (the instructions per round trip counted on the host, above)")
        return s
    if row in sizes and base == "kernel":
        size = sizes[row]
        o, k = per(size, "shim"), per(size, "kern")
        if o["cpu"] is None or k["cpu"] is None:
            return None
        s = (f"the two qperf processes spent {o['cpu']:.0f} us of CPU per message against the "
             f"kernel's {k['cpu']:.0f} us ({o['user']:.0f} us in user space against "
             f"{k['user']:.0f}, {o['engine']:.0f} us in our engine's threads; "
             f"{o['switches']:.2f} context switches against {k['switches']:.2f}), with the "
             f"guest's two vCPUs {o['idle']:.0f}% idle against {k['idle']:.0f}%")
        if o["server"] is not None and k["server"] is not None:
            s += (f"; of it the receiving process (qperf's server) {o['server']:.0f} us against "
                  f"the kernel's {k['server']:.0f}, the sending one {o['cpu'] - o['server']:.0f} "
                  f"against {k['cpu'] - k['server']:.0f} (over veth the sender's CPU also "
                  "carries much of TCP's receive processing, in softirq)")
        s += " (one more run of each: \"Where a message's time goes in a stream\")"
        if size >= 8192:
            s += ("; ours copies each payload twice more than the kernel's RDS (a pooled buffer "
                  "on each side) and reads the stream in the reactor's thread")
            s += (" (both copies in user space with an AVX2 loop, `rds_sock`'s `copy_bytes`: "
                  "about 26 us a 64 KiB copy in the guest, where glibc's `memcpy` takes 186 us "
                  "with `rep movsb`, which the rig's emulation runs a byte at a time)")
        sb = sb_figures(vm) if size == 65536 else None
        if sb is not None:
            f = sb["bw"]
            s += (f"; and the default send buffer lets {sb['def']:,} bytes of a socket's messages "
                  "await their TCP ack, one 64 KiB message and part of the next: with qperf "
                  f"`-sb 1m` ({sb['1m']:,} bytes) ours ran at {f[('shim', '1m')]:.0f} MB/s "
                  f"against the kernel's {f[('kern', '1m')]:.0f} "
                  f"({f[('shim', '1m')] / f[('kern', '1m')]:.2f}x; at the default "
                  f"{f[('shim', 'def')]:.0f} against {f[('kern', 'def')]:.0f})"
                  + (": ours waits longer for each ack" if sb["ours_waits"] else "")
                  + " (\"What bounds a 64 KiB stream\")")
        else:
            s += ("; what is left per message is the user-space code of the shim and the "
                  "engine and the sender's system calls (the user-space instructions counted on the host, above)")
        return s
    if row == "bandwidth 64 KiB" and base == "raw":
        if raw and kern:
            return (f"raw TCP copies each payload once per side with one system call per "
                    f"64 KiB; RDS adds a header, acks and its own buffering: the kernel's "
                    f"RDS-TCP reaches {kern / raw:.2f}x raw TCP in this run, ours the ratio above")
        return None
    if row == "one-way latency 64 B":
        o, k, r = per(None, "shim"), per(None, "kern"), per(None, "raw")
        if o["cpu"] is None or k["cpu"] is None:
            return None
        if base == "raw":
            return ("as for the kernel's target above: CPU time per round trip, ours "
                    f"{o['cpu']:.0f} us against raw TCP's "
                    + (f"{r['cpu']:.0f} us" if r["cpu"] is not None else "(not measured)"))
        return (f"a round trip is serial (one message in flight) and its time is the CPU time "
                f"of the two processes: ours {o['cpu']:.0f} us per round trip, of it "
                f"{o['user']:.0f} us in user space, against the kernel's {k['cpu']:.0f} us"
                + (f" and raw TCP's {r['cpu']:.0f} us" if r["cpu"] is not None else "")
                + f"; ours spends {o['cpu'] - o['user']:.0f} us in the guest's kernel (its "
                "system calls: three per side where the kernel's RDS makes two, plus clock "
                "reads, which are system calls in this guest, and the engine threads' few), "
                "where the kernel's RDS works inside two system calls and softirq; the user "
                "space's share is the shim's and the engine's code, each instruction emulated "
                "(\"Where a round trip's time goes\")")
    return None


def why_table(w, vm, cols, first, per, app="qperf"):
    """A table of where the time goes (guest.sh's why_lat, why_bw): one
    column per measured run, (key prefix, header); `first` is the run's own
    figure, (key, label); `per` names the unit of the other rows."""
    w("| | " + " | ".join(n for _, n in cols) + " |")
    w("|---|" + "---|" * len(cols))
    for key, label in (first, ("idle", "guest CPUs idle"),
                       ("cpu", f"CPU time of both processes per {per}"),
                       ("user", "of which in user space"),
                       ("server", "of which in the server's process (a stream's receiver)" if app == "qperf"
                        else "of which in the answering process"),
                       ("engine", f"of which in threads other than {app}'s (our engine's)"),
                       ("switches", f"context switches per {per}"),
                       ("wakes", f"wake-ups of threads other than {app}'s per {per}"),
                       ("segs", f"TCP segments per {per}, both ways (`OutSegs` of both namespaces)")):
        cells = []
        for c, _ in cols:
            v = vm.get(f"{c}_{key}")
            cells.append(f"{v[0][0]} {v[0][1]}".replace(" /unit", "").strip() if v else "not measured")
        w(f"| {label} | " + " | ".join(cells) + " |")
    w("")


def bw_why_section(w, vm):
    """Where a stream message's time goes in the VM rig (guest.sh's
    why_bw): one more qperf rds_bw run of each size, ours under the shim
    and the kernel, per message."""
    cols = [(f"vm_why_bw{size}_{k}", f"{name}, {label}")
            for size, label in ((64, "64 B"), (1024, "1 KiB"), (8192, "8 KiB"), (65536, "64 KiB"))
            for k, name in (("kern", "kernel"), ("shim", "ours (shim)"))]
    if not any(f"{c}_rate" in vm for c, _ in cols):
        return
    w("### Where a message's time goes in a stream (VM rig)")
    w("")
    w("One more qperf `rds_bw` run of 64 B, 1 KiB, 8 KiB and 64 KiB messages, the kernel's "
      "RDS-TCP and ours under the shim, measured as above, per message.")
    w("")
    why_table(w, vm, cols, ("rate", "messages per second in this run"), "message")
    w("Ours copies each payload four times where the kernel's RDS copies it twice: the "
      "send copies the caller's bytes into a pooled buffer, kept until TCP acknowledges "
      "them (the copy that survives a reconnect; the kernel keeps its own pages and hands "
      "them to TCP without copying), and `sendmsg` copies that buffer into the socket; the "
      "receive reads the socket into a pooled buffer and copies from there into "
      "qperf's (the kernel's RDS keeps TCP's buffers and copies once, into the caller's). "
      "From 8 KiB the payload is read straight into that buffer, header and payload in one "
      "`readv` when the message has the length of the last one; a smaller one goes through "
      "a 256 KiB read buffer, one more copy. "
      "The two extra copies are user-space CPU time, in the row above, made with an AVX2 "
      "loop from 4 KiB (`rds_sock`'s `copy_bytes`; glibc's `memcpy` would use `rep movsb`, "
      "which the rig's emulation runs a byte at a time: in the guest 186 us a 64 KiB copy "
      "against 26 us); the rest is system "
      "calls (the sender's `sendmsg`, the receiver's reads, the descriptor's bookkeeping) "
      "and the engine's reactor thread, which reads a stream in its own thread, ahead of "
      "the receiver (a receiver that read more than one message in a wait leaves the "
      "next waits to it). On two vCPUs under emulation that CPU time is the bandwidth.")
    w("")


def sb_figures(vm):
    """guest.sh's sb_suite, None when not measured: `bw`, the best 64 KiB
    qperf rds_bw of each (ours under the shim, the kernel's) with the
    default send buffer and with qperf -sb 1m; the buffer sysctls
    (`wdef`, `wmax`); the bytes of a socket's messages that may await
    their acks with each (`def`, `1m`: qperf sets 1,000,000, both cap it
    at wmem_max); each side's gain from the larger buffer (`gain_kern`,
    `gain_shim`) and whether ours gained more (`ours_waits`)."""
    bw = {(k, b): num(vm, f"vm_sb_{k}_{b}_bw", "bw") for k in ("shim", "kern") for b in ("def", "1m")}
    if any(v is None for v in bw.values()):
        return None
    try:
        wdef = int(first(vm, "vm_sb_wmem_default"))
        wmax = int(first(vm, "vm_sb_wmem_max"))
    except ValueError:
        return None
    gk, go = bw[("kern", "1m")] / bw[("kern", "def")], bw[("shim", "1m")] / bw[("shim", "def")]
    return {"bw": bw, "wdef": wdef, "wmax": wmax, "def": wdef // 2, "1m": min(1_000_000, wmax),
            "gain_kern": gk, "gain_shim": go, "ours_waits": go > gk * 1.03}


def sb_section(w, vm):
    """What bounds a 64 KiB stream (guest.sh's sb_suite): the send buffer's
    bytes in flight, ours and the kernel's."""
    sb = sb_figures(vm)
    if sb is None:
        return
    f, wdef, wmax = sb["bw"], sb["wdef"], sb["wmax"]
    inflight_def, inflight_1m = sb["def"], sb["1m"]
    w("### What bounds a 64 KiB stream (VM rig)")
    w("")
    w("qperf `rds_bw -m 65536`, ours under the shim and the kernel's RDS-TCP, in turns: with "
      "the send buffer an RDS socket gets by default (`net.core.wmem_default`, "
      f"{wdef:,} bytes here; half of it may be bytes of messages awaiting their TCP ack: "
      f"{inflight_def:,}, one 64 KiB message and part of the next) and with qperf's `-sb 1m` "
      "(SO_SNDBUF and SO_RCVBUF of 1,000,000 bytes, which both cap at `net.core.wmem_max`, "
      f"{wmax:,} here, and double: {inflight_1m:,} bytes in flight). The best of "
      f"{len(vm.get('vm_sb_shim_def_bw', []))} rounds each.")
    w("")
    w("| | kernel RDS-TCP | ours (qperf, shim) | ours / kernel |")
    w("|---|---|---|---|")
    for b, label in (("def", f"default send buffer ({inflight_def:,} bytes in flight)"),
                     ("1m", f"`qperf -sb 1m` ({inflight_1m:,} bytes in flight)")):
        k, o = f[("kern", b)], f[("shim", b)]
        w(f"| {label} | {k:.0f} MB/s | {o:.0f} MB/s | {o / k:.2f} |")
    gk, go = sb["gain_kern"], sb["gain_shim"]
    w(f"| the larger buffer's gain | {gk:.2f}x | {go:.2f}x | |")
    w("")
    w("A message leaves the sending socket's buffer when TCP has acknowledged its last byte, "
      "in both (the kernel's RDS-TCP learns of the ack in TCP's write-space callback, ours polls "
      "`SIOCOUTQ`: `rds_tcp`'s docs, \"Acks\"), so at the default size the sender holds one "
      "64 KiB message and part of the next and then waits for an ack before it may queue more.")
    if sb["ours_waits"]:
        w(f"The larger buffer gains ours more than the kernel's ({go:.2f}x against {gk:.2f}x): "
          "ours waits longer for each ack. Polling for it every 5 to 10 us instead of from "
          "50 us (`rds_sock`'s `ACK_NAP_MIN`) measured the same (5 alternating rounds, "
          "2026-11-29), so the time is in the ack's coming back (the receiving side's TCP and "
          "its threads on two vCPUs), not in seeing it.")
    else:
        w(f"In this run the larger buffer gained ours no more than the kernel's ({go:.2f}x "
          f"against {gk:.2f}x): the wait for acks is not what held ours back here.")
    w("")


def window_why_section(w, vm):
    """Where a message's time goes with 16 in flight (guest.sh's
    why_window): one more rds-window run, the kernel's and ours."""
    cols = [("vm_why_w16_kern", "kernel RDS-TCP"), ("vm_why_w16_shim", "ours (shim)")]
    if not any(f"{c}_rate" in vm for c, _ in cols):
        return
    w("### Where a message's time goes with 16 in flight (VM rig)")
    w("")
    w("One more `rds-window` run of each (64 B, 16 in flight, each answered), 6 s; over "
      "2 s in its middle, measured as above for both rds-window processes, per answered "
      "message.")
    w("")
    why_table(w, vm, cols, ("rate", "messages answered per second in this run"), "message", "rds-window")
    locks, wait = num(vm, "vm_why_w16_shim_locks", ""), num(vm, "vm_why_w16_shim_lockwait", "")
    if locks is not None and wait is not None:
        w(f"Our two engines took their node locks {locks:.1f} times per answered message in "
          f"one more such run (`rds-info -c`: `engine_node_lock_taken`, both processes; every call "
          f"into a node takes its lock once: a send, which also pulls the messages of its own "
          f"write, a receive, a transport's read, which also hands a blocking receive that read "
          f"it the message it waits for, a transport's write or ack), and {wait:.2f}% of those "
          f"acquisitions found the lock held by another "
          + ("thread: the one lock per node does not hold this exchange back"
             if wait < 1 else "thread: worth a closer look")
          + " (\"The node lock\" under Scale).")
        w("")


def pct(v):
    """'44%' -> 44.0."""
    try:
        return float(v.rstrip("%"))
    except ValueError:
        return None


def tasks(vals, key):
    """'rds-tcp-0:44%,scale-rx-0:4%' -> [('rds-tcp-0', 44.0), ...]."""
    w = first(vals, key)
    return [(n, pct(p)) for n, _, p in (t.rpartition(":") for t in w.split(",")) if n and pct(p) is not None]


def paired_ratios(sc):
    """Each round's throughput with every peer active over that with one,
    measured next to it in the same round (one peer first in every other
    round, all first in the others): a pair shares the machine's load of
    its moment, where the best of each over all rounds does not (the
    one-peer figure moves by up to 2x between rounds)."""
    ones = [one(v, u, "bw") for v, u in sc.get("scale_bw_1", [])]
    alls = [one(v, u, "bw") for v, u in sc.get("scale_bw_n", [])]
    return [n / o for o, n in zip(ones, alls) if o and n]


def scale_checks(sc):
    """Issue 14's scale targets: (text, 'met' | 'not met' | 'not measured', detail)."""
    out = []
    per = num(sc, "scale_rss_per_peer", "")
    peers = first(sc, "scale_peers")
    if per is None:
        out.append(("idle memory per peer <= 64 KiB", "not measured", "-"))
    else:
        out.append((f"idle memory per peer <= 64 KiB ({peers} peers)",
                    "met" if per <= 64 else "not met", f"{per:.1f} KiB RSS"))
    rs = paired_ratios(sc)
    if not rs:
        out.append(("aggregate throughput, 256 active peers >= 0.8x one", "not measured", "-"))
    else:
        r = statistics.median(rs)
        out.append((f"aggregate throughput, {peers} active peers >= 0.8x one",
                    "met" if r >= 0.8 else "not met",
                    f"{r:.2f}, the median of the rounds' ratios ({', '.join(f'{x:.2f}' for x in rs)})"))
    used = num(sc, "scale_mp8_paths_used", "")
    cores = num(sc, "scale_mp8_cores", "")
    reactors = [p for n, p in tasks(sc, "scale_mp8_server_tasks") if n.startswith("rds-tcp-")]
    if used is None or cores is None:
        out.append(("a multipath run: 8 paths using both cores", "not measured", "-"))
    else:
        # Both cores used by the paths: 8 paths carried messages, the two
        # nodes together used more than one core, and the receiving node's
        # reactor threads (which read the paths) both worked, the less busy
        # at least a quarter of the busier.
        spread = len(reactors) >= 2 and sorted(reactors)[-2] >= 0.25 * max(reactors)
        met = used >= 8 and cores > 1.0 and spread
        out.append(("a multipath run: 8 paths using both cores", "met" if met else "not met",
                    f"{used:.0f} paths carried messages, the two nodes used {cores:.2f} cores; "
                    f"the serving node's reactor threads: "
                    + (", ".join(f"{p:.0f}%" for p in reactors) or "none busy")))
    return out


def node_lock_note(sc, peers):
    """What the node-lock counts of the scale runs say."""
    def share(k):
        xs = [pct(v) for v, _ in sc.get(k, [])]
        xs = [x for x in xs if x is not None]
        return f"{max(xs):.2f}%" if xs else "?"
    cores = first(sc, "scale_mp8_cores")
    busy = num(sc, "scale_mp8_cores", "")
    verdict = (f"Yet the two nodes of the 8-path run kept {cores} of the 2 cores busy: waiting "
               "on the lock did not leave a core idle on this machine."
               if busy is not None and busy >= 1.8 else
               f"The two nodes of the 8-path run kept {cores} of the 2 cores busy: this run "
               "does not rule out that waiting on the lock left a core idle.")
    return (
        "The node lock. An engine keeps its node (connections, sockets, congestion map, "
        "timers) behind one lock, which every call into the node takes once: a socket's "
        "send (which also pulls the messages of its own write) or receive, a transport's "
        "event, the timer (`rds_sock::Engine`; issue 14's "
        "item 1 asks for per-connection locks instead, and they are not built). Counted "
        "here (`Engine::node_lock_stats`; `rds-info -c`: `engine_node_lock_*`): at most "
        f"{share('scale_bw_1_server_lock_waited')} of the serving node's acquisitions in a "
        f"round with one peer found it held, {share('scale_bw_n_server_lock_waited')} with "
        f"{peers}; in the 8-path run {share('scale_mp8_client_lock_waited')} of the sending "
        "node's (8 sending threads and 2 reactors on one lock) and "
        f"{share('scale_mp8_server_lock_waited')} of the serving node's. The summed wait is "
        "large where threads outnumber the 2 cores: a thread that sleeps on the lock then "
        f"also waits for a core, and its wait counts both. {verdict} Whether the one lock "
        "bounds a node on more cores is not measured here.")


def scale_section(w, sc, meta):
    w("## Scale (host loopback)")
    w("")
    if "scale_done" not in sc:
        w(f"Not complete ({meta.get('scale_status', 'scripts/perf/scale.sh did not finish')}); "
          f"failed steps: {', '.join(v for v, _ in sc.get('scale_failed', [])) or 'none reported'}.")
        w("")
    peers = first(sc, "scale_peers")
    shared = first(sc, "scale_peer_engines") == "1"
    how = ("a socket per peer, each bound to its own address, all on one shared Engine with one "
           "reactor thread" if shared else "an Engine per peer, one reactor thread each")
    w(f"One serving node, its own process (`rds-scale serve`: an rds-sock Engine with "
      f"`TcpConfig::threads` = 2 reactor threads, 8 receiving sockets with a thread each, "
      f"the default 8 paths per peer), and {peers} peer nodes in another process "
      f"(`rds-scale peers`: {how}, at 127.0.1.1, "
      f"127.0.1.2, ... in a private network namespace; each peer connects all "
      f"{first(sc, 'scale_npaths')} paths, as the kernel does).")
    if shared:
        w("")
        w("The serving node sees the same either way: one peer node per address, an RDS "
          "connection and its paths each. The shared engine keeps the load generator's own "
          "threads off the 2 cores the serving node runs on; with an Engine per peer "
          "(`rds-scale peers --engine-per-peer`, what this page measured until 2026-11-28: "
          "256 reactor and 256 timer threads), the peers' process used up to 112% of a core "
          "for 1.2 GB/s and the 256-peer rounds reached 0.49-0.61x one peer "
          "(docs/perf.md at 3bfb360); alternating the two harnesses on this machine "
          "(2026-11-28, 2 runs of 2 rounds each), the 256-peer rounds reached 0.44-0.82x "
          "one peer with an Engine per peer and 0.69-0.94x with the shared one.")
    w("")
    w("| | measured |")
    w("|---|---|")
    w(f"| serving node's threads (`/proc/PID/status`) | {first(sc, 'scale_server_threads_before')} with "
      f"one peer, {first(sc, 'scale_server_threads')} with {peers} "
      f"(`/proc/{first(sc, 'scale_server_pid')}/status` after the run: "
      f"{first(sc, 'scale_server_threads_proc')}) |")
    w(f"| its TCP connections / RDS connections / paths up, {peers} peers idle | "
      f"{first(sc, 'scale_server_tcp_conns')} / {first(sc, 'scale_server_conns')} / "
      f"{first(sc, 'scale_server_paths_up')} |")
    w(f"| its RSS before (one control peer) / with {peers} peers idle | "
      f"{first(sc, 'scale_rss_before')} kB / {first(sc, 'scale_rss_idle')} kB |")
    w(f"| its PSS before / idle | {first(sc, 'scale_pss_before')} kB / {first(sc, 'scale_pss_idle')} kB |")
    w(f"| **idle memory per peer** (RSS, PSS; idle minus before, / {peers}) | "
      f"**{first(sc, 'scale_rss_per_peer')} KiB**, {first(sc, 'scale_pss_per_peer')} KiB |")
    w(f"| connecting {peers} peers (each sends one message, all acknowledged) | "
      f"{first(sc, 'scale_setup')} s |")
    size = first(sc, "scale_msg_size")
    total = first(sc, "scale_total")
    b1, bn = num(sc, "scale_bw_1", "bw"), num(sc, "scale_bw_n", "bw")
    w(f"| aggregate throughput, 1 active peer ({size} B messages, {total} bytes) | {fmt(b1, 'bw')} |")
    rs = paired_ratios(sc)
    w(f"| **aggregate throughput, {peers} active peers** (the same bytes shared; one thread "
      f"sends for all, up to {first(sc, 'scale_burst')} messages to a peer before the next) | "
      f"**{fmt(bn, 'bw')}** (best against best: {fr(ratio(bn, b1))}x one) |")
    w(f"| **each round's ratio**, {peers} peers / 1 peer of the same round (the target uses their "
      f"median) | " + (", ".join(f"{x:.2f}" for x in rs) or "-") +
      (f" (median **{statistics.median(rs):.2f}**)" if rs else "") + " |")

    def cpus(k, unit="%"):
        return ", ".join(f"{v}{unit}" for v, _ in sc.get(k, [])) or "-"
    w(f"| CPU per round, 1 peer: serving node / peers' process (% of a core) | "
      f"{cpus('scale_bw_1_server_cpu')} / {cpus('scale_bw_1_peers_cpu')} |")
    w(f"| CPU per round, {peers} peers: serving node / peers' process | "
      f"{cpus('scale_bw_n_server_cpu')} / {cpus('scale_bw_n_peers_cpu')} |")
    w(f"| the sending thread (sends for every peer): CPU per round, 1 peer / {peers} peers | "
      f"{cpus('scale_bw_1_sender_cpu')} / {cpus('scale_bw_n_sender_cpu')} |")
    w(f"| its time waiting for a socket to take more (all full), ms per round, 1 peer / {peers} peers | "
      f"{cpus('scale_bw_1_sender_waited', '')} / {cpus('scale_bw_n_sender_waited', '')} |")
    w(f"| its CPU time per message, us per round, 1 peer / {peers} peers | "
      f"{cpus('scale_bw_1_sender_us_per_msg', '')} / {cpus('scale_bw_n_sender_us_per_msg', '')} |")
    w(f"| sends left to a batched write (`tcp_tx_coalesced` of the active peers), per round, "
      f"1 peer / {peers} peers | "
      f"{cpus('scale_bw_1_coalesced')} / {cpus('scale_bw_n_coalesced')} |")
    w(f"| the serving node's node lock: acquisitions that found it held, per round, 1 peer / {peers} peers | "
      f"{cpus('scale_bw_1_server_lock_waited')} / {cpus('scale_bw_n_server_lock_waited')} |")
    w(f"| their summed wait, ms per second of the round, 1 peer / {peers} peers | "
      f"{cpus('scale_bw_1_server_lock_wait', '')} / {cpus('scale_bw_n_server_lock_wait', '')} |")
    w(f"| rounds (each figure the best; measured throughput of every round, 1 / {peers}) | "
      f"{len(sc.get('scale_bw_1', []))}: "
      f"{', '.join(fmt(one(v, u, 'bw'), 'bw') for v, u in sc.get('scale_bw_1', []))} / "
      f"{', '.join(fmt(one(v, u, 'bw'), 'bw') for v, u in sc.get('scale_bw_n', []))} |")
    w(f"| messages sent / received once in order / duplicates / gaps | "
      f"{first(sc, 'scale_msgs_sent')} / {first(sc, 'scale_msgs_received')} / "
      f"{first(sc, 'scale_dups')} / {first(sc, 'scale_gaps')} |")
    w("")
    w("The throughput ratio moves between runs on this shared 2-CPU machine (the serving "
      "node, the peers and other work share the cores; see the load average above): "
      "compare it with the rounds' figures before reading much into a small margin. "
      "The target takes the median of the rounds' paired ratios, not the best figure of "
      "each side: the one-peer figure moves by up to 2x from round to round at the same "
      "CPU of its sending thread (on the host, 0.7 to 1.3 GB/s in three rounds of one "
      "run), so the best of several one-peer rounds is an outlier the other side never "
      "gets to meet. The two sides of a round run in turns (one peer first in every other "
      "round, all first in the others), so neither always runs in the other's wake.")
    w("")
    w("Multipath: one node (`rds-scale paths`, 2 reactor threads) sends for "
      f"{meta.get('stress_t', '4')} s from 8 sockets (ports 6000..6007: one path each, "
      "`port % npaths`), a blocking sending thread each, to the serving node's 8 sockets; "
      "then the same over one path. CPU in % of one core over the run.")
    w("")
    w("| | 8 paths | 1 path |")
    w("|---|---|---|")
    for label, key, kind in (("paths negotiated / TCP connections of the serving node", None, None),
                             ("per path: how far its receive sequence number moved (serving node's next_rx_seq)",
                              "path_msgs", "raw"),
                             ("throughput", "bw", "bw"),
                             ("cores used (both processes)", "cores", "raw"),
                             ("serving node's CPU", "server_cpu", "raw"),
                             ("serving node's busiest threads", "server_tasks", "raw"),
                             ("sending node's CPU", "client_cpu", "raw"),
                             ("its 8 sending threads (%)", "client_senders", "raw"),
                             ("its reactor threads", "client_tasks", "raw"),
                             ("sending node's node lock: acquisitions / share that found it held / "
                              "summed wait", "client_lock", None),
                             ("serving node's node lock: the same", "server_lock", None),
                             ("messages sent / received / dups / gaps", "msgs", None)):
        cells = []
        for np in (8, 1):
            k = f"scale_mp{np}_"
            if key is None and label.startswith("paths"):
                cells.append(f"{first(sc, k + 'npaths')} / {first(sc, k + 'tcp_conns')}")
            elif key in ("client_lock", "server_lock"):
                cells.append(" / ".join(" ".join(x for x in sc.get(k + key + sfx, [("?", "")])[0] if x)
                                        for sfx in ("_taken", "_waited", "_wait")))
            elif key == "msgs":
                cells.append(" / ".join(first(sc, k + x) for x in
                                        ("msgs_sent", "msgs_received", "dups", "gaps")))
            elif kind == "bw":
                cells.append(fmt(num(sc, k + key, "bw"), "bw"))
            else:
                v = " ".join(f"{a} {u}".strip() for a, u in sc.get(k + key, [])[:1]) or "?"
                if key.endswith("tasks"):
                    v = ", ".join(v.split(",")[:4])
                cells.append(v)
        w(f"| {label} | {cells[0]} | {cells[1]} |")
    w("")
    w("Targets (issue 14, item 4; also in the list above):")
    w("")
    for text, state, detail in scale_checks(sc):
        w(f"- [{'x' if state == 'met' else ' '}] {text}: {detail} ({state})")
    w("")
    checks = {t.split(":")[0].split(" (")[0]: st for t, st, _ in scale_checks(sc)}
    notes = [node_lock_note(sc, peers)]
    if any(st == "not met" and t.startswith("aggregate") for t, st in checks.items()):
        def rounds(k):
            """Every round's figure of `k` that parses, as numbers."""
            return [x for x in (pct(v) for v, _ in sc.get(k, [])) if x is not None]

        def best_cpu(k):
            xs = rounds(k)
            return f"{max(xs):.0f}%" if xs else "?"
        sc_cpu = rounds("scale_bw_n_sender_cpu")
        waited = rounds("scale_bw_n_sender_waited")
        srv_cpu, peers_cpu = rounds("scale_bw_n_server_cpu"), rounds("scale_bw_n_peers_cpu")
        if sc_cpu and waited and max(sc_cpu) >= 85:
            notes.append(
                f"With {peers} peers the sending thread never waited for room in a round "
                f"(waited {', '.join(f'{x:.0f}' for x in waited)} ms) and was busy "
                f"{', '.join(f'{x:.0f}%' for x in sc_cpu)} of a core: the load generator's one "
                f"thread, which sends for all {peers} peers and also carries the "
                "loopback's TCP receive processing (softirq in the sender's context), is the "
                "limit of that phase, not the serving node.")
        elif sc_cpu and waited and srv_cpu and peers_cpu:
            notes.append(
                f"With {peers} peers the sending thread waited "
                f"{', '.join(f'{x:.0f}' for x in waited)} ms for room in the rounds and was busy "
                f"{', '.join(f'{x:.0f}%' for x in sc_cpu)} of a core, the serving node "
                f"{', '.join(f'{x:.0f}%' for x in srv_cpu)}, the peers' process "
                f"{', '.join(f'{x:.0f}%' for x in peers_cpu)}: no thread measured here used a "
                "whole core, and the two processes left part of the machine's 2 cores to "
                "each other and to the shared machine's other work; this run does not show "
                "what limits that phase.")
        us1, usn = rounds("scale_bw_1_sender_us_per_msg"), rounds("scale_bw_n_sender_us_per_msg")
        co1, con = rounds("scale_bw_1_coalesced"), rounds("scale_bw_n_coalesced")
        if us1 and usn and co1 and con:
            notes.append(
                f"What a message costs that thread: {statistics.median(usn):.1f} us of CPU with "
                f"{peers} peers against {statistics.median(us1):.1f} us with one (medians of the "
                f"rounds). Batching: {statistics.median(con):.0f}% of its sends with "
                f"{peers} peers left their message to a batched write against "
                f"{statistics.median(co1):.0f}% with one: a visit to a peer (up to "
                f"{first(sc, 'scale_burst')} messages) writes its first message at once and "
                "leaves the others to batched writes, the thread's run of sends carrying from "
                "one connection to the next (`rds-tcp/src/coalesce.rs`, `THREAD_RUN`; until "
                "2026-11-29 each visit started its connection's run anew and wrote its first 16 "
                "messages one `sendmsg` each). The rest, seen in a `perf record` "
                "of the sending thread (host, 2026-11-28, an Engine per peer): each of those writes goes to another "
                "TCP connection, and the loopback's receive processing in the same system call "
                "wakes one of the serving node's two reactors far more often than with one peer "
                "(`sock_def_readable`; with one peer its one reactor is mostly busy already), "
                "and each visit re-arms that peer engine's ack timer (`timerfd_settime`).")
        notes.append(
            f"Throughput with {peers} peers: the serving node used up to "
            f"{best_cpu('scale_bw_n_server_cpu')} of a core (with one peer "
            f"{best_cpu('scale_bw_1_server_cpu')}), the peers' process up to "
            f"{best_cpu('scale_bw_n_peers_cpu')} (with one peer {best_cpu('scale_bw_1_peers_cpu')}): "
            + (f"the peers' engine (a reactor and a timer thread) and the sending thread share the "
               if shared else
               f"the {peers} peer engines, a reactor thread and a timer thread each, share the ")
            + "machine's 2 cores with the serving node, so this measures both sides; the serving "
            "node alone is not shown to be the limit.")
    if any(st == "not met" and t.startswith("a multipath") for t, st in checks.items()):
        notes.append(
            "Multipath: rds-tcp spreads the paths of one address pair over its reactor threads "
            "(`reactor_of`: path i on reactor (hash of the pair + i) % threads), so the serving "
            "node's two reactors should each read four of the 8 paths; see their CPU above "
            "and the messages per path.")
    for n in notes:
        w(n)
        w("")


def chart_figures(meta, vrows, hrows):
    """What perf-chart draws (see perf-chart/src/main.rs): bandwidth in MB/s
    by size (VM rig: raw TCP, kernel, ours), one-way latency of 64 B in us
    (VM rig: raw TCP, kernel, ours; host loopback: raw TCP, ours); None
    where not measured."""
    bw = [r for r in vrows if r[0].startswith("bandwidth ")]
    lat_vm = next(r for r in vrows if r[0].startswith("one-way latency"))
    lat_host = next(r for r in hrows if r[0].startswith("one-way latency"))
    return {
        "caption": f"rds-rs scripts/perf.sh at {meta.get('commit', '?')}, {meta.get('date', '?')} "
                   f"(VM rig: one guest, two netns, accel {meta.get('vm_accel', '?')})",
        "bandwidth": {
            "title": "Bandwidth by message size, VM rig (MB/s, higher is better)",
            "sizes": [r[0][len("bandwidth "):] for r in bw],
            "series": [
                {"name": "raw TCP (qperf)", "values": [r[2] for r in bw]},
                {"name": "kernel RDS-TCP (qperf)", "values": [r[3] for r in bw]},
                {"name": "ours (qperf, LD_PRELOAD shim)", "values": [r[4] for r in bw]},
                {"name": "ours (our tools: rds-gen)", "values": [r[5] for r in bw]},
            ],
        },
        "latency": {
            "title": "One-way latency, 64 B (us, lower is better)",
            "bars": [
                {"group": "VM rig", "name": "raw TCP", "value": lat_vm[2]},
                {"group": "VM rig", "name": "kernel", "value": lat_vm[3]},
                {"group": "VM rig", "name": "ours (qperf)", "value": lat_vm[4]},
                {"group": "VM rig", "name": "ours (tools)", "value": lat_vm[5]},
                {"group": "host loopback", "name": "raw TCP", "value": lat_host[2]},
                {"group": "host loopback", "name": "ours (qperf)", "value": lat_host[4]},
                {"group": "host loopback", "name": "ours (tools)", "value": lat_host[5]},
            ],
        },
    }


if __name__ == "__main__":
    main()
