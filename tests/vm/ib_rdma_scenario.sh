#!/bin/sh
# RDMA READ / WRITE through the socket API over RDS-IB, in two vmrig guests
# (vmrig run -n 2). Env: PEER_BIN = rds-rdma-peer, N = bytes of the MR.
# Phase A: ours (node1, target) with ours (node2, initiator); no rds_rdma.
#   The initiator ends with a WRITE to a wrong rkey (BADKEY=1): one
#   REMOTE_ERROR, the connection breaks and comes back for "DONE".
# Phase B: node1 loads the kernel's rds_rdma: a kernel socket is the target
#   (RDMA_MAP), ours on node2 the initiator.
# Phase C: the kernel on node1 is the initiator, ours on node2 the target.
# No BADKEY against the kernel: after the QP error the kernel's connection
# shutdown (rds_ib_conn_path_shutdown) waits until no FRWR MR registered on
# that connection is in use, i.e. until the target socket frees its MRs or
# closes; in trial runs nothing reconnected until the kernel target gave up
# (90 s) and closed its socket.
set -e
N=${N:-70000}
modprobe rdma_rxe
modprobe rdma_ucm
modprobe ib_uverbs
rdma link add rxe0 type rxe netdev eth0
barrier rxe 60
if [ "$VMRIG_NODE" = 1 ]; then
    BARRIER=a-bound "$PEER_BIN" target "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5000 $N | sed 's/^/A /' || st=$?
    barrier a-done 180
    modprobe rds_rdma
    barrier b-kernel 60
    BARRIER=b-bound "$PEER_BIN" --kernel target "$VMRIG_SELF" 4001 "$VMRIG_PEER" 5001 $N | sed 's/^/B /' || st=$?
    barrier b-done 180
    BARRIER=c-bound "$PEER_BIN" --kernel initiator "$VMRIG_SELF" 4002 "$VMRIG_PEER" 5002 $N | sed 's/^/C /' || st=$?
    barrier c-done 180
    exit ${st:-0}
else
    BADKEY=1 BARRIER=a-bound "$PEER_BIN" initiator "$VMRIG_SELF" 5000 "$VMRIG_PEER" 4000 $N | sed 's/^/A /' || st=$?
    barrier a-done 180
    barrier b-kernel 60
    BARRIER=b-bound "$PEER_BIN" initiator "$VMRIG_SELF" 5001 "$VMRIG_PEER" 4001 $N | sed 's/^/B /' || st=$?
    barrier b-done 180
    BARRIER=c-bound "$PEER_BIN" target "$VMRIG_SELF" 5002 "$VMRIG_PEER" 4002 $N | sed 's/^/C /' || st=$?
    barrier c-done 180
    exit ${st:-0}
fi
