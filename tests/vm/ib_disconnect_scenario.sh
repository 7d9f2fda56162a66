#!/bin/sh
# RDS-IB with the connection forcibly broken mid-stream, in two vmrig
# guests (vmrig run -n 2). Env: MODE (psk, default, or cm), PEER_BIN =
# rds-ib-peer, KSIDE = kernel_side.py (cm; found next to this
# script by default), N, GAP_US, KILLS (psk), CUT_S (cm).
#
# MODE=psk: the verbs-only setup (TCP side channel, pre-shared key; no
# RDMA CM) with the side channel killed mid-stream.
# node1 receives (port 4000), node2 streams N numbered datagrams (port
# 5000) and meanwhile kills the established side channel connection KILLS
# times (`ss -K`, which aborts the local socket and sends the peer a RST),
# each 1.0 .. 2.5 s (random) after it was (re-)established (a kill that
# finds none, between two connections, is retried and not counted).
#
# MODE=cm: the RDMA CM setup (port 18634, what the kernel speaks), three
# phases, each a stream of N datagrams during which the sending guest
# drops every incoming RoCE v2 packet (UDP 4791, a tc ingress filter on
# eth0) from 1.0 .. 2.0 s (random) into the stream, or once one of its RC
# QPs is up (RTS) if none was by then, for at least CUT_S
# seconds, and on until one of the RC QPs that were up (RTS) when the cut
# began has left RTS, at most CUT_MAX_S seconds in all: the sender's RC QP
# gets no acks, exhausts its retries (IBV_WC_RETRY_EXC_ERR), its
# connection goes down and its DREQ (outgoing traffic still passes) takes
# the receiver's down too; reconnects fail until the filter is gone. A
# cut of a fixed length did not always break the connection: in a CI run
# the sender's QP sent next to nothing during the 4 s (1 packet dropped)
# and carried on unharmed afterwards. Lines are prefixed with the phase.
#   A: our engine (node2, port 5000) to our engine (node1, port 4000);
#   B: our engine (node2, port 5001) to the kernel's rds_rdma (node1, now
#      loaded, port 4000, kernel_side.py stream-recv);
#   C: the kernel (node1, port 4001, kernel_side.py stream-send) to our
#      engine (node2, port 6000); node1 cuts.
# Then node1 prints the kernel's RDS/IB log lines (KLOG).
set -e
MODE=${MODE:-psk}
N=${N:-3000}
GAP_US=${GAP_US:-3000}
KILLS=${KILLS:-3}
CUT_S=${CUT_S:-6}
CUT_MAX_S=${CUT_MAX_S:-30}
KSIDE=${KSIDE:-$(cd "$(dirname "$0")" && pwd)/kernel_side.py}
modprobe rdma_rxe
modprobe ib_uverbs
rdma link add rxe0 type rxe netdev eth0
if [ "$MODE" = cm ]; then
    modprobe rdma_ucm
    # The filter's modules now, so that adding it later takes effect at once.
    modprobe sch_ingress
    modprobe cls_flower
    modprobe act_gact
    tc qdisc add dev eth0 ingress
    barrier rxe 60
    # cutter PHASE: 1.0 .. 2.0 s after the phase's start barrier, drop
    # incoming RoCE v2 for CUT_S seconds and on until a connection broke
    # (at most CUT_MAX_S seconds); "CUTEND ... broke QPN" or "broke none".
    cs() { cut -d' ' -f1 /proc/uptime | tr -d .; } # uptime in 1/100 s
    secs() { echo "$(($1 / 100)).$(printf %02d $(($1 % 100)))"; }
    # The numbers of this guest's RC QPs in state RTS, one line.
    rts_qps() {
        rdma res show qp 2>/dev/null |
            awk '/ type RC / && / state RTS / { for (i = 1; i < NF; i++) if ($i == "lqpn") printf "%s ", $(i + 1) }'
    }
    cutter() {
        barrier "$1-bound" 60 || return 0
        t0=$(cs)
        r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
        ms=$((1000 + r % 1000))
        sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
        # Not before a connection is up: a cut that began while the RDMA
        # CM was still connecting (no RC QP in RTS at 2.05 s, once, in a
        # clean-clone suite on 2026-12-01) broke nothing, only delayed the
        # connect until it ended. At most until 30 s after the barrier.
        while [ -z "$(rts_qps)" ] && [ $(($(cs) - t0)) -lt 3000 ]; do sleep 0.1; done
        tc filter add dev eth0 ingress protocol ip prio 1 flower ip_proto udp dst_port 4791 action drop
        t1=$(cs)
        up=$(rts_qps); up=${up% }
        echo "$1 CUT at $(secs $((t1 - t0))) s for at least ${CUT_S} s, RC QPs up: ${up:-none}"
        sleep "$CUT_S"
        broke=none
        while [ -n "$up" ]; do
            now=" $(rts_qps)"
            for q in $up; do
                case "$now" in *" $q "*) ;; *) broke=$q ;; esac
            done
            [ "$broke" = none ] && [ $(($(cs) - t1)) -lt $((CUT_MAX_S * 100)) ] || break
            sleep 0.2
        done
        held=$(($(cs) - t1))
        d=$(tc -s filter show dev eth0 ingress | sed -n 's/.*(dropped \([0-9]*\).*/\1/p' | head -1)
        tc filter del dev eth0 ingress prio 1
        echo "$1 CUTEND dropped ${d:-0} held $(secs "$held") s broke $broke"
    }
    # ours / kside PHASE ARGS...: rds-ib-peer / kernel_side.py with the
    # phase's barriers, their lines prefixed with the phase, a failure
    # shown as "PHASE EXIT status" (the test asserts on the lines).
    prefix() { while IFS= read -r l; do echo "$1 $l"; done; }
    ours() {
        ph=$1; shift
        { FLUSH_S=90 WAIT_S=60 BARRIER=$ph-bound END_BARRIER=$ph-end GAP_US=$GAP_US "$PEER_BIN" "$@" 2>&1 || echo "EXIT $?"; } | prefix "$ph"
    }
    kside() {
        ph=$1; shift
        { WAIT_S=60 BARRIER=$ph-bound END_BARRIER=$ph-end GAP_US=$GAP_US python3 "$KSIDE" "$@" 2>&1 || echo "EXIT $?"; } | prefix "$ph"
    }
    has() { case " ${PHASES:-A B C} " in *" $1 "*) return 0 ;; esac; return 1; }
    if [ "$VMRIG_NODE" = 1 ]; then
        if has A; then ours A stream-recv "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5000 "$N"; fi
        modprobe rds_rdma
        if has B; then kside B stream-recv "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5001 "$N"; fi
        if has C; then
            cutter C > /tmp/cut-C.log 2>&1 &
            kside C stream-send "$VMRIG_SELF" 4001 "$VMRIG_PEER" 6000 "$N"
            wait
            cat /tmp/cut-C.log
        fi
        dmesg | grep 'RDS/IB' | sed 's/^\[[ 0-9.]*\] /KLOG /' || true
    else
        for ph in A B; do
            has $ph || continue
            cutter $ph > /tmp/cut-$ph.log 2>&1 &
            if [ $ph = A ]; then
                ours A stream-send "$VMRIG_SELF" 5000 "$VMRIG_PEER" 4000 "$N"
            else
                ours B stream-send "$VMRIG_SELF" 5001 "$VMRIG_PEER" 4000 "$N"
            fi
            wait
            cat /tmp/cut-$ph.log
        done
        if has C; then ours C stream-recv "$VMRIG_SELF" 6000 "$VMRIG_PEER" 4001 "$N"; fi
    fi
    exit 0
fi
# Key files must be private to their owner (mode 600): umask 077.
(umask 077; printf 'rds-ib verbs-only test key 0001\n' > /tmp/psk)
if lsmod | grep -q '^rdma_ucm'; then echo "RDMA_UCM loaded"; else echo "RDMA_UCM absent"; fi
barrier rxe 60
F='( sport = :18635 or dport = :18635 )'
established() { ss -Htn state established "$F" | grep -c . || true; }
killer() {
    barrier s-bound 60 || return 0
    i=1
    while [ "$i" -le "$KILLS" ]; do
        t=0
        while [ "$(established)" -eq 0 ]; do
            sleep 0.05; t=$((t+1))
            [ "$t" -lt 600 ] || { echo "KILL $i no side channel connection to kill"; return 0; }
        done
        r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
        ms=$((1000 + r % 1500))
        sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
        if [ -e /tmp/stream-done ]; then echo "KILL $i too late (stream over)"; return 0; fi
        n=$(ss -HtnK state established "$F" | grep -c . || true)
        if [ "$n" -eq 0 ]; then
            # The side channel was being replaced at that instant (both
            # sides reconnect at once after a kill): wait for the next one.
            echo "KILLRETRY $i after ${ms} ms: no established side channel"
            continue
        fi
        echo "KILL $i after ${ms} ms killed $n"
        i=$((i+1))
    done
}
if [ "$VMRIG_NODE" = 1 ]; then
    RDS_IB_PSK_FILE=/tmp/psk FLUSH_S=${FLUSH_S:-120} BARRIER=s-bound END_BARRIER=s-end WAIT_S=60 "$PEER_BIN" stream-recv "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5000 "$N" || st=$?
    exit ${st:-0}
else
    killer &
    kp=$!
    RDS_IB_PSK_FILE=/tmp/psk FLUSH_S=${FLUSH_S:-120} BARRIER=s-bound END_BARRIER=s-end GAP_US=$GAP_US "$PEER_BIN" stream-send "$VMRIG_SELF" 5000 "$VMRIG_PEER" 4000 "$N" || st=$?
    : > /tmp/stream-done
    wait "$kp" || true
    exit ${st:-0}
fi
