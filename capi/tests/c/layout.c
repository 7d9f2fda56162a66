/*
 * The header against <linux/rds.h> and libc: the numbers the C ABI uses
 * are the kernel's, and the header's prototypes are libc's (a mismatch is
 * a compile error). Built by tests/header.rs; prints "ok" when run.
 */
#include <stddef.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/rds.h>

#include "rds_capi.h"

_Static_assert(AF_RDS == 21, "AF_RDS");
_Static_assert(PF_RDS == AF_RDS, "PF_RDS");
_Static_assert(SOL_RDS == 276, "SOL_RDS");
/* The numbers capi/src/opts.rs and msg.rs hard-code. */
_Static_assert(RDS_CANCEL_SENT_TO == 1, "RDS_CANCEL_SENT_TO");
_Static_assert(RDS_GET_MR == 2, "RDS_GET_MR");
_Static_assert(RDS_FREE_MR == 3, "RDS_FREE_MR");
_Static_assert(RDS_RECVERR == 5, "RDS_RECVERR");
_Static_assert(RDS_CONG_MONITOR == 6, "RDS_CONG_MONITOR");
_Static_assert(RDS_GET_MR_FOR_DEST == 7, "RDS_GET_MR_FOR_DEST");
_Static_assert(SO_RDS_TRANSPORT == 8, "SO_RDS_TRANSPORT");
_Static_assert(RDS_TRANS_IB == 0 && RDS_TRANS_TCP == 2, "RDS_TRANS_*");
_Static_assert(RDS_INFO_FIRST == 10000 && RDS_INFO_LAST == 10017, "RDS_INFO_*");
_Static_assert(SIOCRDSSETTOS == 0x89E0 && SIOCRDSGETTOS == 0x89E1, "SIOCRDS*TOS");
_Static_assert(RDS_CMSG_RDMA_ARGS == 1 && RDS_CMSG_RDMA_DEST == 2 && RDS_CMSG_RDMA_MAP == 3, "RDS_CMSG_RDMA_*");
_Static_assert(RDS_CMSG_RDMA_STATUS == 4 && RDS_CMSG_CONG_UPDATE == 5, "RDS_CMSG_*");
_Static_assert(RDS_CMSG_ATOMIC_FADD == 6 && RDS_CMSG_MASKED_ATOMIC_CSWP == 9, "RDS_CMSG_ATOMIC_*");
/* struct rds_rdma_notify as RDS_CMSG_RDMA_STATUS carries it (msg.rs). */
_Static_assert(sizeof(struct rds_rdma_notify) == 16, "rds_rdma_notify");
_Static_assert(offsetof(struct rds_rdma_notify, status) == 8, "rds_rdma_notify.status");
_Static_assert(sizeof(rds_rdma_cookie_t) == 8, "rds_rdma_cookie_t");
_Static_assert(sizeof(struct timeval) == 16, "SCM_TIMESTAMP payload");
_Static_assert(SO_TIMESTAMP == 29, "SO_TIMESTAMP (old)");

/* The prototypes are libc's: these assignments only compile if they match. */
static int (*const p_socket)(int, int, int) = rds_socket;
static int (*const p_bind)(int, const struct sockaddr *, socklen_t) = rds_bind;
static int (*const p_getsockname)(int, struct sockaddr *, socklen_t *) = rds_getsockname;
static int (*const p_connect)(int, const struct sockaddr *, socklen_t) = rds_connect;
static int (*const p_getpeername)(int, struct sockaddr *, socklen_t *) = rds_getpeername;
static ssize_t (*const p_sendmsg)(int, const struct msghdr *, int) = rds_sendmsg;
static ssize_t (*const p_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t) = rds_sendto;
static ssize_t (*const p_recvmsg)(int, struct msghdr *, int) = rds_recvmsg;
static ssize_t (*const p_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *) = rds_recvfrom;
static int (*const p_setsockopt)(int, int, int, const void *, socklen_t) = rds_setsockopt;
static int (*const p_getsockopt)(int, int, int, void *, socklen_t *) = rds_getsockopt;
static int (*const p_close)(int) = rds_close;
static int (*const p_dup)(int) = rds_dup;
static int (*const p_dup2)(int, int) = rds_dup2;
static int (*const p_dup3)(int, int, int) = rds_dup3;
static int (*const p_is)(int) = rds_is_rds_fd;
static void (*const p_fork)(void) = rds_fork_child;
static int (*const p_ioctl)(int, unsigned long, void *) = rds_ioctl;
static int (*const p_fcntl)(int, int, long) = rds_fcntl;

int main(void)
{
	/* A descriptor that is not ours: 0, and errno's EBADF for a closed one. */
	int ok = p_is(0) == 0 && p_is(-1) == 0 && p_close(-1) == -1;

	(void)p_socket; (void)p_bind; (void)p_getsockname; (void)p_connect; (void)p_getpeername;
	(void)p_sendmsg; (void)p_sendto; (void)p_recvmsg; (void)p_recvfrom; (void)p_setsockopt;
	(void)p_getsockopt; (void)p_dup; (void)p_dup2; (void)p_dup3; (void)p_fork; (void)p_ioctl; (void)p_fcntl;
	puts(ok ? "ok" : "FAIL");
	return ok ? 0 : 1;
}
