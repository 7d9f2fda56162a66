#!/bin/sh
# RDS-IB verbs-only setup (TCP side channel, pre-shared key; no RDMA CM)
# with the side channel killed mid-stream, in two vmrig guests
# (vmrig run -n 2). Env: PEER_BIN = rds-ib-peer, N, GAP_US, KILLS.
# node1 receives (port 4000), node2 streams N numbered datagrams (port
# 5000) and meanwhile kills the established side channel connection KILLS
# times (`ss -K`, which aborts the local socket and sends the peer a RST),
# each 1.0 .. 2.5 s (random) after it was (re-)established (a kill that
# finds none, between two connections, is retried and not counted).
set -e
N=${N:-3000}
GAP_US=${GAP_US:-3000}
KILLS=${KILLS:-3}
modprobe rdma_rxe
modprobe ib_uverbs
rdma link add rxe0 type rxe netdev eth0
printf 'rds-ib verbs-only test key 0001\n' > /tmp/psk
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
