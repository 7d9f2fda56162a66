#!/bin/sh
# RDS-IB through our engine, in two vmrig guests (vmrig run -n 2).
# Env: PEER_BIN = rds-ib-peer, KSIDE = kernel_side.py of rds-ib, SIZES.
# Phase A: our engine (node1, recv then send, port 4000) with our engine
#   (node2, send then recv, port 5000) over rxe; no rds_rdma anywhere.
# Phase B: node1 loads the kernel's rds_rdma: its sockets (port 4000)
#   receive SIZES from our engine on node2 (port 5001), then send them back.
set -e
SIZES=${SIZES:-"0 1 4096 65536 1048576"}
modprobe rdma_rxe
modprobe rdma_ucm
modprobe ib_uverbs
rdma link add rxe0 type rxe netdev eth0
barrier rxe 60
if [ "$VMRIG_NODE" = 1 ]; then
    A_BIN="$PEER_BIN"
    BARRIER=a-bound "$A_BIN" recv-send "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5000 $SIZES | sed 's/^/A /' || st=$?
    barrier a-done 120
    modprobe rds_rdma
    barrier b-kernel 60
    python3 "$KSIDE" recv "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5001 $SIZES | sed 's/^/B /' || st=$?
    python3 "$KSIDE" send "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5001 $SIZES | sed 's/^/B /' || st=$?
    barrier b-done 120
    exit ${st:-0}
else
    BARRIER=a-bound "$PEER_BIN" send-recv "$VMRIG_SELF" 5000 "$VMRIG_PEER" 4000 $SIZES | sed 's/^/A /' || st=$?
    barrier a-done 120
    barrier b-kernel 60
    # kernel_side.py recv waits at barrier "bound" for our socket.
    BARRIER=bound "$PEER_BIN" send-recv "$VMRIG_SELF" 5001 "$VMRIG_PEER" 4000 $SIZES | sed 's/^/B /' || st=$?
    barrier b-done 120
    exit ${st:-0}
fi
