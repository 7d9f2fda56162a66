#!/bin/sh
# The rds-ib verbs scenario in two vmrig guests (vmrig run -n 2 -- sh kernel_ib_scenario.sh).
# Node 1 runs the kernel's rds_rdma (and AF_RDS sockets via kernel_side.py);
# node 2 runs ib-probe (our verbs path) and must not load rds_rdma, which
# would take port 18634. Env: IB_PROBE = path of the ib-probe binary.
# Phase 1: we connect (RDMA CM active), ping, send SIZES to the kernel's
# socket on port 4000 from port 5000, wait for its acks, disconnect.
# Phase 2: the kernel sends SIZES from port 4001 to our port 6000; it has to
# connect to our listener (its connection from phase 1 is gone).
set -e
here=$(cd "$(dirname "$0")" && pwd)
SIZES=${SIZES:-"0 1 4096 65536 1048576"}
modprobe rdma_rxe
rdma link add rxe0 type rxe netdev eth0
if [ "$VMRIG_NODE" = 1 ]; then
    modprobe rds_rdma
    barrier rxe
    python3 "$here/kernel_side.py" recv "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5000 $SIZES || st=$?
    barrier phase1 90
    python3 "$here/kernel_side.py" send "$VMRIG_SELF" 4001 "$VMRIG_PEER" 6000 $SIZES || st=$?
    barrier phase2 90
    dmesg | grep -E 'RDS/IB' | sed 's/^\[[ 0-9.]*\] /KLOG /' || true
    exit ${st:-0}
else
    modprobe rdma_ucm
    modprobe ib_uverbs
    barrier rxe
    "$IB_PROBE" devices
    "$IB_PROBE" passive "$VMRIG_SELF" 6000 $SIZES > /tmp/passive.log 2>&1 &
    pid=$!
    barrier bound 60
    "$IB_PROBE" active "$VMRIG_SELF" "$VMRIG_PEER" 5000 4000 $SIZES || st=$?
    barrier phase1 90
    wait $pid || st=$?
    sed 's/^/P /' /tmp/passive.log
    barrier phase2 90
    dmesg | grep -iE 'rdma|rxe|infiniband' | sed 's/^\[[ 0-9.]*\] /LOG /' || true
    exit ${st:-0}
fi
