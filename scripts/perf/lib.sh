# shellcheck shell=bash
# Shared by scripts/perf/guest.sh and scripts/perf/host.sh (sourced, not run).
# Every measurement prints one line "R <key> <value> [unit]" on stdout;
# scripts/perf/report.py turns them into docs/perf.md. Every load loop is
# bounded by a size or a time and by timeout(1).
#
# The caller sets: BIN (directory of our release binaries), ON_A / ON_B
# (arrays: the command prefix running a program on side A / B, may be empty), ADDR_A /
# ADDR_B, QPERF_T (seconds per qperf test), TOTAL_1K / TOTAL_8K /
# TOTAL_64K (bytes rds-gen sends per size), STRESS_T (seconds per
# rds-stress run), PREFIX (key prefix: vm_ or host_).

# cleanup_pids: stops the programs a suite started in the background and
# removes the qperf server's log (qperf_suite shows it first when the
# server said something; the other suites' servers say nothing it needs).
PIDS=()
cleanup_pids() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
    rm -f /tmp/perf-qperf-server.$$
}

now_ns() { date +%s%N; }

QPERF_PID=
qperf_server_start() {
    "${ON_B[@]}" qperf >>/tmp/perf-qperf-server.$$ 2>&1 &
    QPERF_PID=$!
    PIDS+=("$QPERF_PID")
    sleep 1
}
qperf_server_stop() {
    if [ -n "$QPERF_PID" ]; then
        kill "$QPERF_PID" 2>/dev/null || true
        wait "$QPERF_PID" 2>/dev/null || true
        QPERF_PID=
    fi
}

# qperf_run TEST SIZE KEY: one qperf test from A against the qperf server on B.
# An RDS test of qperf's sometimes fails at once with "connect failed:
# Connection refused", whatever the RDS underneath: its server sends the
# client the port of a TCP socket it then listens on (rds.c,
# server_get_hosts: the port is sent before listen()), and a client that
# connects before the listen() is refused; the send wakes the client,
# which often runs first on a machine of two CPUs (under the shim, a few
# tests in twenty in the VM rig and on the host). Up to three attempts, 2 s
# apart, the server restarted before the third. Prints what qperf -v
# reports. QPERF_EXTRA (an array, empty by default) adds options.
QPERF_EXTRA=()
qperf_run() {
    local test=$1 size=$2 key=$3 out try
    for try in 1 2 3; do
        if out=$(timeout $((QPERF_T + 30)) "${ON_A[@]}" qperf -v -t "$QPERF_T" "${QPERF_EXTRA[@]}" -m "$size" "$ADDR_B" "$test" 2>&1); then
            break
        fi
        echo "perf: qperf $test -m $size failed (attempt $try: $(echo "$out" | tr '\n' ' '))" >&2
        if [ "$try" = 3 ]; then
            # Under the keys a success prints, so that the rounds' values
            # of each key stay one per round (report.py pairs them).
            case $test in
                *_lat) echo "R ${PREFIX}${key}_lat FAILED" ;;
                *) echo "R ${PREFIX}${key}_bw FAILED"; echo "R ${PREFIX}${key}_rate FAILED" ;;
            esac
            return 0
        fi
        sleep 2
        if [ "$try" = 2 ]; then
            qperf_server_stop
            qperf_server_start
        fi
    done
    # tcp_lat/rds_lat: the one-way latency; tcp_bw/rds_bw: the bandwidth
    # and the message rate.
    echo "$out" | awk -v k="${PREFIX}${key}" -v t="$test" '
        t ~ /_lat$/ && $1 == "latency" { print "R " k "_lat " $3 " " $4 }
        t ~ /_bw$/ && $1 == "bw" { print "R " k "_bw " $3 " " $4 }
        t ~ /_bw$/ && $1 == "msg_rate" { print "R " k "_rate " $3 " " $4 }'
}

# qperf_server_warm TEST: qperf_server_start, then a short run of TEST
# (64 B, 1 s) from A, not reported: the first test after the server starts
# is several times slower (caches, and under TCG code translation).
qperf_server_warm() {
    qperf_server_start
    timeout 30 "${ON_A[@]}" qperf -t 1 -m 64 "$ADDR_B" "$1" >/dev/null 2>&1 || true
}

# qperf_suite KIND TCP|RDS: raw TCP (tcp_*) or kernel RDS (rds_*) with qperf.
qperf_suite() {
    local kind=$1 proto=$2 s
    rm -f /tmp/perf-qperf-server.$$
    qperf_server_warm "${proto}_lat"
    qperf_run "${proto}_lat" 64 "${kind}_64"
    qperf_run "${proto}_bw" 64 "${kind}_64"
    for s in 1024 8192 65536; do
        qperf_run "${proto}_bw" "$s" "${kind}_${s}"
    done
    qperf_server_stop
    if [ -s /tmp/perf-qperf-server.$$ ]; then
        echo "perf: the qperf server said:" >&2
        cat /tmp/perf-qperf-server.$$ >&2
    fi
    cleanup_pids
}

# under_shim CMD [ARGS...]: runs CMD with both sides' programs under
# LD_PRELOAD=$SHIM (appended to ON_A / ON_B, which are restored after).
under_shim() {
    local save_a=("${ON_A[@]}") save_b=("${ON_B[@]}")
    ON_A=("${save_a[@]}" env LD_PRELOAD="$SHIM")
    ON_B=("${save_b[@]}" env LD_PRELOAD="$SHIM")
    "$@"
    ON_A=("${save_a[@]}")
    ON_B=("${save_b[@]}")
}

# shim_suite: ours through the same qperf as the kernel's (rds_lat, rds_bw),
# server and client both under LD_PRELOAD=$SHIM (librdspreload.so), keys
# shim_*. Skipped, with a line on stderr, when the shim was not built.
shim_suite() {
    if [ -z "${SHIM:-}" ] || [ ! -f "$SHIM" ]; then
        echo "perf: no librdspreload.so: ours through qperf not measured" >&2
        return 0
    fi
    under_shim qperf_suite shim rds
}

# window_run KIND: the 64 B message rate with 16 in flight, each answered
# (issue 14's definition), with rds-window (scripts/perf/rds_window.c) on
# the AF_RDS of ON_A / ON_B (the kernel's, or ours under the shim): a
# server on B answers every message, the client on A keeps 16 in flight for
# QPERF_T seconds after a warm-up. Keys ${PREFIX}KIND_64_w16_{rate,rtt}.
# Skipped, with a line on stderr, without the binary.
window_run() {
    local kind=$1 window=${2:-16} flag=${3:-} key=${4:-w16} out srv
    if [ ! -x "$BIN/rds-window" ]; then
        echo "perf: no rds-window: the message rate with $window in flight not measured" >&2
        return 0
    fi
    "${ON_B[@]}" "$BIN/rds-window" $flag serve "$ADDR_B" 5000 $((QPERF_T + 20)) &
    srv=$!
    PIDS+=("$srv")
    sleep 1
    if out=$(timeout $((QPERF_T + 20)) "${ON_A[@]}" "$BIN/rds-window" $flag run "$ADDR_A" 5001 "$ADDR_B" 5000 "$window" "$QPERF_T" 2>&1); then
        echo "$out" | awk -v k="${PREFIX}${kind}_64_${key}" '$1 == "window" {
            for (i = 1; i <= NF; i++) { if ($i == "msg/s,") r = $(i - 1); if ($i == "trip") t = $(i + 1) }
            print "R " k "_rate " r " msg/s"; print "R " k "_rtt " t " us" }'
    else
        echo "perf: rds-window $flag ($kind) failed: $(echo "$out" | tr '\n' ' ')" >&2
        echo "R ${PREFIX}${kind}_64_${key}_rate FAILED"
        echo "R ${PREFIX}${kind}_64_${key}_rtt FAILED"
    fi
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    cleanup_pids
}

# window_poll_run KIND: rds-window -p with one message in flight, both
# sides waiting in poll(POLLIN) and receiving with MSG_DONTWAIT (as
# rds-tools' rds-stress and event loops do); keys KIND_64_w1p_{rate,rtt}.
window_poll_run() {
    window_run "$1" 1 -p w1p
}

# shim_window: window_run and window_poll_run with both sides under
# LD_PRELOAD=$SHIM, keys shim_64_w16_* and shim_64_w1p_*; skipped like
# shim_suite without the shim.
shim_window() {
    [ -n "${SHIM:-}" ] && [ -f "$SHIM" ] || return 0
    under_shim window_run shim
    under_shim window_poll_run shim
}

# ours_bw SIZE TOTAL PORT: rds-gen on A -> rds-sink on B, the whole transfer
# (connection set-up included) timed from rds-gen's start to its exit, which
# waits until the peer acknowledged everything. --no-digest: no SHA-256 of
# the payloads is charged to ours (qperf computes none either).
ours_bw() {
    local size=$1 total=$2 port=$3 count t0 t1 sink_pid ok=1
    count=$(( (total + size - 1) / size ))
    timeout 120 "${ON_B[@]}" "$BIN/rds-sink" -s "$ADDR_B:$port" -l "$count" -t 20 >/tmp/perf-sink.$$ 2>&1 &
    sink_pid=$!
    PIDS+=("$sink_pid")
    sleep 0.5
    t0=$(now_ns)
    timeout 120 "${ON_A[@]}" "$BIN/rds-gen" -s "$ADDR_A:$port" -d "$ADDR_B:$port" -m "$size" -l "$total" --no-digest >/tmp/perf-gen.$$ 2>&1 || ok=0
    t1=$(now_ns)
    wait "$sink_pid" || ok=0
    PIDS=()
    if [ $ok = 1 ]; then
        awk -v b="$total" -v t0="$t0" -v t1="$t1" -v k="${PREFIX}ours_${size}_bw" \
            'BEGIN { printf "R %s %.2f MB/sec\n", k, b / ((t1 - t0) / 1e9) / 1e6 }'
    else
        echo "perf: rds-gen/rds-sink -m $size failed:" >&2
        cat /tmp/perf-gen.$$ /tmp/perf-sink.$$ >&2
        echo "R ${PREFIX}ours_${size}_bw FAILED"
    fi
    rm -f /tmp/perf-gen.$$ /tmp/perf-sink.$$
}

# ours_stress DEPTH KEY PORT [-o]: rds-stress -t 1 -d DEPTH -q 64 -a 64 for
# STRESS_T seconds; prints the average line's round trip (us), the
# requests the active side sent per second and its microseconds per send
# call.
ours_stress() {
    local depth=$1 key=$2 port=$3 out
    shift 3
    timeout $((STRESS_T + 40)) "${ON_B[@]}" "$BIN/rds-stress" -r "$ADDR_B" -p "$port" >/dev/null 2>&1 &
    PIDS+=($!)
    sleep 0.5
    out=$(timeout $((STRESS_T + 40)) "${ON_A[@]}" "$BIN/rds-stress" -r "$ADDR_A" -s "$ADDR_B" -p "$port" \
        -t 1 -d "$depth" -q 64 -a 64 -T "$STRESS_T" -z --connect-retries 10 "$@" 2>&1) || {
        echo "perf: rds-stress -d $depth failed: $out" >&2
        echo "R ${PREFIX}${key} FAILED"
        cleanup_pids
        return 0
    }
    cleanup_pids
    echo "$out" | awk -v k="${PREFIX}${key}" '
        /\(average\)/ { print "R " k "_rtt " $8 " us"; print "R " k "_rate " $2 " /sec"; print "R " k "_txcall " $7 " us" }'
}

ours_suite() {
    ours_stress 1 ours_64_d1 4000
    ours_stress 16 ours_64_d16 4100 -o
    ours_bw 1024 "$TOTAL_1K" 4201
    ours_bw 8192 "$TOTAL_8K" 4202
    ours_bw 65536 "$TOTAL_64K" 4203
}

# sb_suite KIND: what bounds a stream of 64 KiB messages. qperf rds_bw
# -m 65536 from A to B (ON_A / ON_B), in turns with the send buffer an RDS
# socket gets by default (net.core.wmem_default; half of it may be bytes
# of messages awaiting their TCP ack: 106,496 with Linux's default of
# 212,992, one 64 KiB message and part of the next) and with qperf -sb 1m
# (SO_SNDBUF and SO_RCVBUF of 1,000,000, which the kernel's RDS and ours cap
# at net.core.wmem_max and double: with the default maximum of 212,992,
# that many bytes in flight), PERF_ROUNDS times. Keys
# ${PREFIX}sb_KIND_{def,1m}_{bw,rate}, ${PREFIX}sb_wmem_{default,max}.
sb_suite() {
    local kind=$1
    echo "R ${PREFIX}sb_wmem_default $(cat /proc/sys/net/core/wmem_default) bytes"
    echo "R ${PREFIX}sb_wmem_max $(cat /proc/sys/net/core/wmem_max) bytes"
    qperf_server_warm rds_lat
    for _ in $(seq "$ROUNDS"); do
        qperf_run rds_bw 65536 "sb_${kind}_def"
        QPERF_EXTRA=(-sb 1m)
        qperf_run rds_bw 65536 "sb_${kind}_1m"
        QPERF_EXTRA=()
    done
    qperf_server_stop
    cleanup_pids
}

# why_snap CLIENT SERVER FILE: the guest's idle and total CPU ticks now
# (/proc/stat) on stdout, "idle total"; and in FILE one line per thread of
# the two PIDs and of SERVER's child processes (qperf's server forks one
# per test), "tid cpu switches user engine wakes server kid": its CPU ticks
# (utime + stime), context switches (voluntary + involuntary), user-space
# CPU ticks, the CPU ticks and voluntary context switches (wake-ups) of a
# thread not named qperf (ours: the engine's reactor and timer threads),
# the CPU ticks of one of SERVER's process or its children, and 1 for a
# thread of SERVER's children (else 0).
# One awk reads every file: under the rig's emulation each process started
# costs tens of ms, and a snapshot that started a few per thread (as this
# did until 2026-11-30) took seconds, long enough for the second one of a
# 6 s run to come after qperf's server child had ended.
why_snap() {
    local p t kids tasks=()
    kids=$(why_children "$2")
    for p in "$1" "$2" $kids; do
        for t in /proc/"$p"/task/*; do
            [ -d "$t" ] && tasks+=("$p $t")
        done
    done
    : >"$3"
    awk -v client="$1" -v server="$2" -v app="${APP_COMM:-qperf}" -v out="$3" '
        function first(f, line) {
            line = ""
            if ((getline line < f) <= 0) line = ""
            close(f)
            return line
        }
        BEGIN {
            n = split(first("/proc/stat"), f, " ")
            total = 0
            for (i = 2; i <= n; i++) total += f[i]
            for (a = 1; a < ARGC; a++) {
                split(ARGV[a], pt, " "); p = pt[1]; t = pt[2]
                # A thread that ended since the glob (an exiting server
                # child'"'"'s engine threads) has no figures left: skipped.
                st = first(t "/stat"); comm = first(t "/comm")
                if (st == "" || comm == "") continue
                sub(/.*\) /, "", st)
                split(st, g, " ")
                if (g[12] !~ /^[0-9]+$/ || g[13] !~ /^[0-9]+$/) continue
                vol = 0; inv = 0
                while ((getline l < (t "/status")) > 0) {
                    split(l, h, " ")
                    if (h[1] == "voluntary_ctxt_switches:") vol = h[2]
                    if (h[1] == "nonvoluntary_ctxt_switches:") inv = h[2]
                }
                close(t "/status")
                c = g[12] + g[13]; e = 0; w = 0; sv = 0
                if (comm != app) { e = c; w = vol }
                if (p != client) sv = c
                tid = t; sub(/.*\//, "", tid)
                print tid, c, vol + inv, g[12], e, w, sv, (p != client && p != server) > out
            }
            # TCP segments sent from the network namespaces of the two
            # processes (/proc/PID/net/snmp shows the namespace of PID: ns1
            # and ns2), so both directions of the exchange: OutSegs summed.
            segs = outsegs("/proc/" client "/net/snmp") + outsegs("/proc/" server "/net/snmp")
            print f[5] + f[6], total, segs
            exit
        }
        function outsegs(f, line, h, v, n, i, hdr) {
            hdr = 0
            while ((getline line < f) > 0) {
                if (line !~ /^Tcp: /) continue
                if (!hdr) { n = split(line, h, " "); hdr = 1; continue }
                split(line, v, " ")
                for (i = 2; i <= n; i++) if (h[i] == "OutSegs") { close(f); return v[i] }
            }
            close(f)
            return 0
        }' "${tasks[@]}"
}

# why_pair CLIENT SERVER: two why_snap snapshots 2 s apart, printed as
# why_emit's "SNAPS": the guest's idle and total CPU ticks at each, then
# the threads' cpu switches user engine wakes server over the interval,
# then the two times (ns), then the TCP segments the two processes'
# network namespaces sent over the interval (both directions of the
# exchange), then how many threads of SERVER's children were in both
# (qperf's server forks one per test, which does the work: a run where it
# was in neither or only one snapshot measured nothing of the receiving
# side). The threads' figures are differences summed over the
# threads present in both snapshots: one that started or ended between
# them (an engine's thread, a server's child) would count its whole life
# or subtract it.
why_pair() {
    local fa=/tmp/perf-why-a.$$ fb=/tmp/perf-why-b.$$ a b t0 t1 d
    a=$(why_snap "$1" "$2" "$fa"); t0=$(now_ns)
    sleep 2
    b=$(why_snap "$1" "$2" "$fb"); t1=$(now_ns)
    d=$(awk 'NR == FNR { for (i = 2; i <= 7; i++) v[$1, i] = $i; seen[$1] = 1; next }
        $1 in seen { for (i = 2; i <= 7; i++) s[i] += $i - v[$1, i]; kids += $8 }
        END { printf "%d %d %d %d %d %d %d", s[2], s[3], s[4], s[5], s[6], s[7], kids }' "$fa" "$fb")
    rm -f "$fa" "$fb"
    # a and b: idle, total CPU ticks and TCP segments (why_snap).
    set -- $a $b
    echo "$1 $2 $4 $5 ${d% *} $t0 $t1 $(($6 - $3)) ${d##* }"
}

# why_children PID...: the PIDs of their child processes (from /proc, as
# the guest has no pgrep).
why_children() {
    local p
    for p in "$@"; do
        awk -v p="$p" '$4 == p { print $1 }' /proc/[0-9]*/stat 2>/dev/null
    done
}

# why_lat KIND TEST: why a latency is what it is. One more qperf TEST
# (tcp_lat or rds_lat, 64 B, 6 s) from A against a qperf server on B; over
# 2 s in its middle: the share of the guest's CPU time that was idle, and
# the CPU time and context switches of both qperf processes (all their
# threads, the server's forked child included) per round trip. Keys
# ${PREFIX}why_KIND_{lat,idle,cpu,user,engine,wakes,switches}.
why_lat() {
    why_run "$1" "$2" 64 "why_$1"
}

# why_bw KIND SIZE: the same for a qperf rds_bw stream of SIZE-byte
# messages, per message. Keys ${PREFIX}why_bwSIZE_KIND_{rate,idle,cpu,...}.
why_bw() {
    why_run "$1" rds_bw "$2" "why_bw$2_$1"
}

why_run() {
    local kind=$1 test=$2 size=$3 key=$4 try
    # An RDS test of qperf's sometimes fails at once with "Connection
    # refused" (qperf_run's comment): up to three attempts, the server
    # restarted for each.
    for try in 1 2 3; do
        why_once "$kind" "$test" "$size" "$key" && return 0
        echo "perf: why $key: attempt $try failed" >&2
        sleep 2
    done
    return 0
}

# why_window KIND: the same for rds-window's 64 B exchange with 16 in
# flight (window_run), per answered message; the client runs 6 s, the
# snapshots 2 s apart in its middle. Keys ${PREFIX}why_w16_KIND_*; for
# ours also _locks and _lockwait (window_locks).
why_window() {
    local kind=$1 key="why_w16_$1" srv client snaps segs out per hz=100
    [ -x "$BIN/rds-window" ] || return 0
    "${ON_B[@]}" "$BIN/rds-window" serve "$ADDR_B" 5000 30 &
    srv=$!
    PIDS+=("$srv")
    sleep 1
    "${ON_A[@]}" "$BIN/rds-window" run "$ADDR_A" 5001 "$ADDR_B" 5000 16 6 >/tmp/perf-why.$$ 2>&1 &
    client=$!
    PIDS+=("$client")
    sleep 2.5
    snaps=$(APP_COMM=rds-window why_pair "$client" "$srv")
    snaps=${snaps% *} # (rds-window's server works in its own process)
    segs=${snaps##* }
    snaps=${snaps% *}
    wait "$client" || true
    cleanup_pids
    out=$(cat /tmp/perf-why.$$); rm -f /tmp/perf-why.$$
    per=$(echo "$out" | awk '$1 == "window" { for (i = 1; i <= NF; i++) if ($i == "msg/s,") v = $(i - 1)
        if (v > 0) printf "%s rate %.2f k/s\n", 1e6 / v, v / 1e3 }')
    if [ -z "$per" ]; then
        echo "perf: why $key: rds-window failed: $(echo "$out" | tr '\n' ' ')" >&2
        return 0
    fi
    why_emit "$key" "$snaps $per $hz $segs"
    [ "$kind" = shim ] && window_locks "$key"
    return 0
}

# window_locks KEY: one more rds-window run (16 in flight), ours: the node-
# lock counts of both engines (lock_counts) 2 s apart in its middle, apart
# from the why run (rds-info's own work and time would disturb its
# figures). Keys ${PREFIX}KEY_locks: acquisitions of the two engines' node
# locks per answered message (each is delivered twice: the request, then
# its answer); ${PREFIX}KEY_lockwait: the share that found the lock held.
window_locks() {
    local srv client l0 l1
    [ -x "$BIN/rds-info" ] || return 0
    "${ON_B[@]}" "$BIN/rds-window" serve "$ADDR_B" 5000 30 &
    srv=$!
    PIDS+=("$srv")
    sleep 1
    "${ON_A[@]}" "$BIN/rds-window" run "$ADDR_A" 5001 "$ADDR_B" 5000 16 8 >/dev/null 2>&1 &
    client=$!
    PIDS+=("$client")
    sleep 2.5
    l0=$(lock_counts "$client" "$srv")
    sleep 2
    l1=$(lock_counts "$client" "$srv")
    wait "$client" || true
    cleanup_pids
    if [ -n "${l0:-}" ] && [ -n "${l1:-}" ]; then
        echo "$l0 $l1" | awk -v k="${PREFIX}$1" '{
            t = $4 - $1; w = $5 - $2; d = $6 - $3
            if (d > 0 && t > 0) {
                printf "R %s_locks %.2f /unit\n", k, t / (d / 2)
                printf "R %s_lockwait %.2f %%\n", k, 100 * w / t
            }
        }'
    fi
}

# lock_counts PID...: the node-lock counts of our engines in those
# processes (rds-info -c), summed: "taken waited delivered" (0 0 0
# without rds-info or an engine).
lock_counts() {
    local p
    for p in "$@"; do
        [ -x "$BIN/rds-info" ] && "$BIN/rds-info" -c --pid "$p" 2>/dev/null
    done | awk '$1 == "engine_node_lock_taken" { t += $2 } $1 == "engine_node_lock_waited" { w += $2 }
        $1 == "recv_delivered" { d += $2 } END { print t + 0, w + 0, d + 0 }'
}

why_once() {
    local kind=$1 test=$2 size=$3 key=$4 client snaps segs kids out per hz
    hz=100 # USER_HZ: /proc reports CPU time in 1/100 s on Linux
    qperf_server_warm "$test"
    # The warm-up's server child must be gone before the snapshots (up to
    # 5 s): under the shim it takes a while to end (its engine's threads),
    # and the CPU it spends ending is not the measured run's.
    for _ in $(seq 50); do
        [ -z "$(why_children "$QPERF_PID")" ] && break
        sleep 0.1
    done
    "${ON_A[@]}" qperf -v -t 6 -m "$size" "$ADDR_B" "$test" >/tmp/perf-why.$$ 2>&1 &
    client=$!
    PIDS+=("$client")
    sleep 2
    snaps=$(why_pair "$client" "$QPERF_PID")
    kids=${snaps##* }
    snaps=${snaps% *}
    segs=${snaps##* }
    snaps=${snaps% *}
    wait "$client" || true
    qperf_server_stop
    cleanup_pids
    out=$(cat /tmp/perf-why.$$); rm -f /tmp/perf-why.$$
    # The time per unit in us (a round trip; a message of a stream), what
    # the run reported and its unit.
    # (qperf -v reports a msg_rate for latency tests too: the latency
    # counts for *_lat, the message rate for *_bw.)
    per=$(echo "$out" | awk -v lat="$([ "${test%_lat}" != "$test" ] && echo 1)" '
        lat && $1 == "latency" { v = $3; u = $4; if (u == "ms") v *= 1000; if (u == "ns") v /= 1000; if (v > 0) print 2 * v, "lat", v, "us" }
        !lat && $1 == "msg_rate" { v = $3; u = $4; if (u ~ /^K/) v *= 1e3; if (u ~ /^M/) v *= 1e6; if (v > 0) print 1e6 / v, "rate", v / 1e3, "k/s" }' | head -1)
    if [ -z "$per" ]; then
        echo "perf: why $key: qperf $test failed: $(echo "$out" | tr '\n' ' ')" >&2
        return 1
    fi
    # The server's child must have been in both snapshots and worked
    # (its CPU, the 10th figure), else the run measured nothing of the
    # server's side: tried again.
    if [ "$kids" = 0 ] || [ "$(echo "$snaps" | awk '{ print $10 }')" = 0 ]; then
        echo "perf: why $key: the qperf server's child was not in both snapshots, or did nothing between them" >&2
        return 1
    fi
    # snaps (why_pair): idle total before and after ($1-$4), cpu
    # switches user engine wakes server over the interval ($5-$10), t0 t1
    # ($11 $12); per: us per unit, what, value, unit ($13-$16); hz ($17);
    # the TCP segments over the interval ($18).
    why_emit "$key" "$snaps $per $hz $segs"
}

# why_emit KEY "SNAPS PER HZ SEGS": the R lines of a why run from its
# snapshots (why_pair, without its last two figures), the time per unit,
# USER_HZ and the TCP segments of the interval.
why_emit() {
    echo "$2" | awk -v k="${PREFIX}$1" '{
        n = ($12 - $11) / 1000 / $13
        tick = 1e6 / $17 / n
        printf "R %s_%s %s %s\n", k, $14, $15, $16
        printf "R %s_idle %.0f %%\n", k, 100 * ($3 - $1) / ($4 - $2)
        printf "R %s_cpu %.0f us\n", k, $5 * tick
        printf "R %s_user %.0f us\n", k, $7 * tick
        printf "R %s_server %.0f us\n", k, $10 * tick
        printf "R %s_engine %.0f us\n", k, $8 * tick
        printf "R %s_wakes %.2f /unit\n", k, $9 / n
        printf "R %s_switches %.2f /unit\n", k, $6 / n
        printf "R %s_segs %.2f /unit\n", k, $18 / n
    }'
}

# instr_suite: user-space instructions per 64 B round trip of qperf's
# latency client (every thread of its process: for ours, qperf's own code,
# the shim and the engine), counted by callgrind (valgrind) on the host
# loopback: raw TCP (tcp_lat) and ours (rds_lat, both sides under the
# shim; the server runs natively). Each is run for 1 s and for 3 s and the
# difference taken, so start-up is not counted. For ours also the receive
# and send calls alone (callgrind_annotate, inclusive). Keys host_instr_*.
# Deterministic where timings are not; the VM rig emulates every such
# instruction (TCG). Skipped, with a line on stderr, without valgrind.
instr_suite() {
    if ! command -v valgrind >/dev/null 2>&1 || ! command -v callgrind_annotate >/dev/null 2>&1; then
        echo "perf: valgrind is not installed: no instruction counts" >&2
        return 0
    fi
    instr_pair raw tcp 127.0.0.1 ""
    if [ -n "${SHIM:-}" ] && [ -f "$SHIM" ]; then
        instr_pair shim rds "$ADDR_B" "$SHIM"
    fi
}

# instr_pair KIND PROTO ADDR SHIM: prints R host_instr_KIND (and, for the
# shim, _recv and _send) from a 1 s and a 3 s run.
instr_pair() {
    local kind=$1 proto=$2 addr=$3 shim=$4 t a b
    local -A tot=() n=() rd=() sd=()
    for t in 1 3; do
        instr_run "$proto" "$addr" "$shim" "$t" || { echo "perf: callgrind run ($kind, ${t} s) failed" >&2; return 0; }
        read -r n[$t] tot[$t] rd[$t] sd[$t] <<<"$INSTR_OUT"
    done
    if [ "${n[3]:-0}" -le "${n[1]:-0}" ]; then
        echo "perf: callgrind runs ($kind) counted no more round trips in 3 s than in 1 s" >&2
        return 0
    fi
    a=$(( n[3] - n[1] ))
    echo "R host_instr_${kind} $(( (tot[3] - tot[1]) / a )) instr"
    if [ -n "$shim" ]; then
        echo "R host_instr_${kind}_recv $(( (rd[3] - rd[1]) / a )) instr"
        echo "R host_instr_${kind}_send $(( (sd[3] - sd[1]) / a )) instr"
    fi
}

# instr_run PROTO ADDR SHIM T: one callgrind-counted qperf PROTO_lat client
# of T seconds; sets INSTR_OUT to "round-trips total recv send".
instr_run() {
    local proto=$1 addr=$2 shim=$3 t=$4 dir out f n tot
    dir=$(mktemp -d /tmp/perf-cg.XXXXXX)
    local pre=()
    [ -n "$shim" ] && pre=(env LD_PRELOAD="$shim")
    local save_b=("${ON_B[@]}")
    ON_B=("${save_b[@]}" "${pre[@]}")
    qperf_server_start
    ON_B=("${save_b[@]}")
    out=$(timeout $((t + 60)) "${ON_A[@]}" valgrind --tool=callgrind --trace-children=yes \
        --callgrind-out-file="$dir/cg.%p" "${pre[@]}" qperf -vv -t "$t" -m 64 "$addr" "${proto}_lat" 2>&1) || true
    qperf_server_stop
    n=$(echo "$out" | awk '$1 == "loc_recv_msgs" { gsub(",", "", $3); print $3 }')
    f=$(ls -S "$dir"/cg.* 2>/dev/null | head -1)
    if [ -z "$n" ] || [ -z "$f" ]; then
        rm -rf "$dir"
        return 1
    fi
    callgrind_annotate --inclusive=yes "$f" >"$dir/a.txt" 2>/dev/null
    # The "PROGRAM TOTALS" line, and the inclusive counts of the shim's
    # read (qperf's receive) and sendto (its send) entry points.
    tot=$(instr_of "$dir/a.txt" 'PROGRAM TOTALS')
    INSTR_OUT="$n $tot $(instr_of "$dir/a.txt" 'preload/src/io.rs:read ') $(instr_of "$dir/a.txt" 'preload/src/io.rs:sendto ')"
    rm -rf "$dir"
}

# instr_of FILE TEXT: the count of callgrind_annotate's first line holding
# TEXT (0 when none).
instr_of() {
    awk -v pat="$2" 'index($0, pat) { gsub(",", "", $1); print $1; found = 1; exit } END { if (!found) print 0 }' "$1"
}
