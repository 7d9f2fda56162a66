#!/bin/sh
# RDS-IB through our engine, in two vmrig guests (vmrig run -n 2).
# Env: PEER_BIN = rds-ib-peer, KSIDE = kernel_side.py (next to this script), KPEER =
# rds-kernel-peer (kernel sockets bound to IPv6: no ctypes in the guests'
# Python), SIZES.
# Phase A: our engine (node1, recv then send, port 4000) with our engine
#   (node2, send then recv, port 5000) over rxe; no rds_rdma anywhere.
# Phase C: the same over IPv6 (the rig's fd99::1 and fd99::2; RDMA CM
#   port 16385, 56-byte private data), ports 4100 and 5100.
# Phase B: node1 loads the kernel's rds_rdma: its sockets (port 4000)
#   receive SIZES from our engine on node2 (port 5001), then send them back.
# Phase D: the same over IPv6 (kernel port 4100, ours 5101).
# Phase E: receive flow control, ours with ours (credit flow control on):
#   node2 (port 5200) streams N_FLOW numbered datagrams without a gap to
#   node1 (port 4200, RCV_BUDGET 1 MiB), which reads nothing for HOLD_S
#   seconds (counters then as "HOLD" lines), then reads them all.
# Phase G: the RDMA CM listener never blocks on one peer: node2 sends a
#   connect request that never completes (rds-ib-peer stall: no QP, our
#   accept never answered) to node1 (port 4400, recv-send), then, while it
#   is pending, its engine sends SIZES from port 5400 ("ACKTIME"); node1
#   stays until the stalled request is released (8 s, past the 5 s
#   deadline) and prints its counters.
# Phase F: the same with the kernel as the sender (node1, port 4300, no
#   credit flow control: RNR) to ours on node2 (port 5300).
set -e
SIZES=${SIZES:-"0 1 4096 65536 1048576"}
N_FLOW=${N_FLOW:-1500}
HOLD_S=${HOLD_S:-4}
flow_recv() {
    RCV_BUDGET=1048576 HOLD_S=$HOLD_S WAIT_S=60 GAP_US=0 BARRIER=$1 "$PEER_BIN" stream-recv "$2" "$3" "$4" "$5" "$N_FLOW"
}
modprobe rdma_rxe
modprobe rdma_ucm
modprobe ib_uverbs
SELF6=fd99::$VMRIG_NODE
PEER6=fd99::$((3 - VMRIG_NODE))
rdma link add rxe0 type rxe netdev eth0
barrier rxe 60
if [ "$VMRIG_NODE" = 1 ]; then
    A_BIN="$PEER_BIN"
    BARRIER=a-bound "$A_BIN" recv-send "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5000 $SIZES | sed 's/^/A /' || st=$?
    barrier a-done 120
    BARRIER=c-bound "$A_BIN" recv-send "$SELF6" 4100 "$PEER6" 5100 $SIZES | sed 's/^/C /' || st=$?
    barrier c-done 120
    flow_recv e-bound "$VMRIG_SELF" 4200 "$VMRIG_PEER" 5200 | sed 's/^/E /' || st=$?
    barrier e-done 180
    END_BARRIER=g-end BARRIER=g-bound "$A_BIN" recv-send "$VMRIG_SELF" 4400 "$VMRIG_PEER" 5400 $SIZES | sed 's/^/G /' || st=$?
    barrier g-done 120
    modprobe rds_rdma
    barrier b-kernel 60
    python3 "$KSIDE" recv "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5001 $SIZES | sed 's/^/B /' || st=$?
    python3 "$KSIDE" send "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5001 $SIZES | sed 's/^/B /' || st=$?
    barrier b-done 120
    BARRIER=bound6 "$KPEER" recv "$SELF6" 4100 "$PEER6" 5101 $SIZES | sed 's/^/D /' || st=$?
    "$KPEER" send "$SELF6" 4100 "$PEER6" 5101 $SIZES | sed 's/^/D /' || st=$?
    barrier d-done 120
    # END_BARRIER: the kernel drops what a closed socket has not sent yet,
    # so the sender stays until the receiver is done.
    GAP_US=0 BARRIER=f-bound END_BARRIER=f-end python3 "$KSIDE" stream-send "$VMRIG_SELF" 4300 "$VMRIG_PEER" 5300 "$N_FLOW" | sed 's/^/F /' || st=$?
    barrier f-done 180
    exit ${st:-0}
else
    BARRIER=a-bound "$PEER_BIN" send-recv "$VMRIG_SELF" 5000 "$VMRIG_PEER" 4000 $SIZES | sed 's/^/A /' || st=$?
    barrier a-done 120
    BARRIER=c-bound "$PEER_BIN" send-recv "$SELF6" 5100 "$PEER6" 4100 $SIZES | sed 's/^/C /' || st=$?
    barrier c-done 120
    GAP_US=0 FLUSH_S=120 BARRIER=e-bound "$PEER_BIN" stream-send "$VMRIG_SELF" 5200 "$VMRIG_PEER" 4200 "$N_FLOW" | sed 's/^/E /' || st=$?
    barrier e-done 180
    barrier g-bound 60
    HOLD_S=8 "$PEER_BIN" stall "$VMRIG_SELF" 0 "$VMRIG_PEER" 0 > /tmp/stall.log 2>&1 &
    i=0
    while ! grep -q '^STALL ' /tmp/stall.log && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    "$PEER_BIN" send-recv "$VMRIG_SELF" 5400 "$VMRIG_PEER" 4400 $SIZES | sed 's/^/G /' || st=$?
    wait
    sed 's/^/G /' /tmp/stall.log
    barrier g-end 180
    barrier g-done 120
    barrier b-kernel 60
    # kernel_side.py recv waits at barrier "bound" for our socket.
    BARRIER=bound "$PEER_BIN" send-recv "$VMRIG_SELF" 5001 "$VMRIG_PEER" 4000 $SIZES | sed 's/^/B /' || st=$?
    barrier b-done 120
    # rds-kernel-peer recv waits at barrier "bound6" for our socket.
    BARRIER=bound6 "$PEER_BIN" send-recv "$SELF6" 5101 "$PEER6" 4100 $SIZES | sed 's/^/D /' || st=$?
    barrier d-done 120
    END_BARRIER=f-end flow_recv f-bound "$VMRIG_SELF" 5300 "$VMRIG_PEER" 4300 | sed 's/^/F /' || st=$?
    barrier f-done 180
    exit ${st:-0}
fi
