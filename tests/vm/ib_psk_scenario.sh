#!/bin/sh
# RDS-IB verbs-only setup (no RDMA CM; TCP side channel with a pre-shared
# key) through our engine, in two vmrig guests (vmrig run -n 2).
# Env: PEER_BIN = rds-ib-peer, SIZES.
# rdma_ucm is never loaded: nothing can use RDMA CM.
# Phase A: both engines with the same key: node1 (recv then send, port
#   4000) with node2 (send then recv, port 5000).
# Phase B: node1 (fresh engine, the right key, port 4001) expects nothing;
#   node2 runs a rogue side channel client (a well-formed CLIENT_PARAMS with
#   a MAC under a wrong key), then an engine with the wrong key sending to
#   node1:4001. node1 must have created no QP and received nothing.
# Phase C: node1 (the right key, port 4002) serves its address by IB
#   alone: node2's raw TCP connection to port 16385 is refused (CP), an
#   engine sending from a TCP socket (CT: wrong key, RDS_IB_PSK_TCP=1 so
#   that TCP serves node2's address) gets nothing acked, and the keyed
#   engine's messages (CI, port 5003) arrive, nothing else.
# Phase D: node1 with RDS_IB_PSK_TCP=1 (port 4003): TCP serves its address
#   too; the TCP socket's messages (DT, port 5004) reach the node (acked)
#   but not the IB socket (recv_drop_no_sock); the keyed engine's (DI,
#   port 5005) arrive, nothing else.
# Phase K (node1, first): a key file of mode 0644 is refused, naming it.
set -e
SIZES=${SIZES:-"0 1 4096 65536 1048576"}
modprobe rdma_rxe
modprobe ib_uverbs
rdma link add rxe0 type rxe netdev eth0
# Key files must be private to their owner (mode 600): umask 077.
(umask 077; printf 'rds-ib verbs-only test key 0001\n' > /tmp/psk)
(umask 077; printf 'not the key of this test at all 02\n' > /tmp/badkey)
if lsmod | grep -q '^rdma_ucm'; then echo "RDMA_UCM loaded"; else echo "RDMA_UCM absent"; fi
echo "GID $(rxe-gid-index rxe0 "$VMRIG_SELF")"
if [ "$VMRIG_NODE" = 1 ]; then
    cp /tmp/psk /tmp/psk644
    chmod 644 /tmp/psk644
    RDS_IB_PSK_FILE=/tmp/psk644 WAIT_S=1 "$PEER_BIN" recv-none "$VMRIG_SELF" 4009 "$VMRIG_PEER" 5009 2>&1 | sed 's/^/K /' || true
fi
barrier rxe 60
if [ "$VMRIG_NODE" = 1 ]; then
    RDS_IB_DEBUG=1 RDS_IB_PSK_FILE=/tmp/psk BARRIER=a-bound "$PEER_BIN" recv-send "$VMRIG_SELF" 4000 "$VMRIG_PEER" 5000 $SIZES 2>&1 | sed 's/^/A /' || st=$?
    barrier a-done 120
    RDS_IB_PSK_FILE=/tmp/psk BARRIER=b-bound WAIT_S=30 "$PEER_BIN" recv-none "$VMRIG_SELF" 4001 "$VMRIG_PEER" 5001 | sed 's/^/B /' || st=$?
    barrier b-done 120
    RDS_IB_PSK_FILE=/tmp/psk BARRIER=c-bound WAIT_S=5 "$PEER_BIN" recv-then-none "$VMRIG_SELF" 4002 "$VMRIG_PEER" 5003 $SIZES | sed 's/^/C /' || st=$?
    barrier c-done 120
    RDS_IB_PSK_TCP=1 RDS_IB_PSK_FILE=/tmp/psk BARRIER=d-bound WAIT_S=5 "$PEER_BIN" recv-then-none "$VMRIG_SELF" 4003 "$VMRIG_PEER" 5005 $SIZES | sed 's/^/D /' || st=$?
    barrier d-done 120
    exit ${st:-0}
else
    RDS_IB_DEBUG=1 RDS_IB_PSK_FILE=/tmp/psk BARRIER=a-bound "$PEER_BIN" send-recv "$VMRIG_SELF" 5000 "$VMRIG_PEER" 4000 $SIZES 2>&1 | sed 's/^/A /' || st=$?
    barrier a-done 120
    barrier b-bound 60
    RDS_IB_PSK_FILE=/tmp/badkey "$PEER_BIN" rogue "$VMRIG_SELF" 5001 "$VMRIG_PEER" 4001 | sed 's/^/B /' || st=$?
    RDS_IB_PSK_FILE=/tmp/badkey FLUSH_S=15 "$PEER_BIN" send-unacked "$VMRIG_SELF" 5001 "$VMRIG_PEER" 4001 $SIZES | sed 's/^/B /' || st=$?
    barrier b-done 120
    barrier c-bound 60
    "$PEER_BIN" tcp-probe "$VMRIG_SELF" 5002 "$VMRIG_PEER" 4002 | sed 's/^/CP /' || st=$?
    RDS_IB_PSK_TCP=1 RDS_IB_PSK_FILE=/tmp/badkey FLUSH_S=5 "$PEER_BIN" tcp-send "$VMRIG_SELF" 5002 "$VMRIG_PEER" 4002 $SIZES | sed 's/^/CT /' || st=$?
    RDS_IB_PSK_FILE=/tmp/psk "$PEER_BIN" send-unacked "$VMRIG_SELF" 5003 "$VMRIG_PEER" 4002 $SIZES | sed 's/^/CI /' || st=$?
    barrier c-done 120
    barrier d-bound 60
    RDS_IB_PSK_TCP=1 RDS_IB_PSK_FILE=/tmp/badkey FLUSH_S=20 "$PEER_BIN" tcp-send "$VMRIG_SELF" 5004 "$VMRIG_PEER" 4003 $SIZES | sed 's/^/DT /' || st=$?
    RDS_IB_PSK_FILE=/tmp/psk "$PEER_BIN" send-unacked "$VMRIG_SELF" 5005 "$VMRIG_PEER" 4003 $SIZES | sed 's/^/DI /' || st=$?
    barrier d-done 120
    exit ${st:-0}
fi
