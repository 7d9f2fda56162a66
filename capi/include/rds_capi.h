/*
 * rds_capi.h - the C ABI of userspace RDS (librds.so / librds.a, crate
 * rds-capi).
 *
 * The kernel's AF_RDS socket calls under rds_ names, with libc's
 * signatures: they return -1 with errno set as the kernel's AF_RDS would
 * and leave errno alone on success. Option numbers, cmsg types and
 * structs are the kernel's: include <linux/rds.h> for them.
 *
 * An RDS descriptor is a real descriptor, readable and writable exactly
 * when the RDS socket is: poll, select and epoll work on it directly. Use
 * rds_close (not close) and rds_dup* (not dup*) on it; read and write on it
 * do nothing useful (use rds_recv* / rds_send*).
 *
 * Environment (read by the first rds_socket): RDS_TCP_PORT, RDS_NPATHS,
 * RDS_TRANSPORT (tcp | ib), RDS_INFO_DIR, RDS_IB_PSK_FILE, RDS_IB_PSK_TCP.
 *
 * After fork, the child's copies of RDS descriptors fail with EBADF (but
 * rds_close); sockets the child opens work. Link with -lrds.
 */
#ifndef RDS_CAPI_H
#define RDS_CAPI_H

#include <sys/types.h>
#include <poll.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef AF_RDS
#define AF_RDS 21
#endif
#ifndef PF_RDS
#define PF_RDS AF_RDS
#endif
#ifndef SOL_RDS
#define SOL_RDS 276
#endif

int rds_socket(int domain, int type, int protocol);
int rds_bind(int fd, const struct sockaddr *addr, socklen_t addrlen);
int rds_getsockname(int fd, struct sockaddr *addr, socklen_t *addrlen);
int rds_connect(int fd, const struct sockaddr *addr, socklen_t addrlen);
int rds_getpeername(int fd, struct sockaddr *addr, socklen_t *addrlen);
ssize_t rds_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t rds_sendto(int fd, const void *buf, size_t len, int flags,
		   const struct sockaddr *dest, socklen_t addrlen);
ssize_t rds_recvmsg(int fd, struct msghdr *msg, int flags);
ssize_t rds_recvfrom(int fd, void *buf, size_t len, int flags,
		     struct sockaddr *src, socklen_t *addrlen);
int rds_setsockopt(int fd, int level, int optname, const void *optval,
		   socklen_t optlen);
int rds_getsockopt(int fd, int level, int optname, void *optval,
		   socklen_t *optlen);
/* SIOCRDSSETTOS / SIOCRDSGETTOS, FIONBIO, FIOCLEX / FIONCLEX; else ENOTTY. */
int rds_ioctl(int fd, unsigned long request, void *arg);
/* F_GETFL / F_SETFL (O_NONBLOCK), F_GETFD / F_SETFD, F_DUPFD(_CLOEXEC). */
int rds_fcntl(int fd, int cmd, long arg);
int rds_close(int fd);
/* poll(2); when exactly one entry is an RDS descriptor asking for POLLIN,
 * the wait also reads that socket's TCP connections in this thread. */
int rds_poll(struct pollfd *fds, nfds_t nfds, int timeout);
int rds_dup(int fd);
int rds_dup2(int oldfd, int newfd);
int rds_dup3(int oldfd, int newfd, int flags);
/* 1 if fd is an RDS descriptor of this library, else 0; lock-free. */
int rds_is_rds_fd(int fd);
/* In a child after fork (the library also runs it from pthread_atfork). */
void rds_fork_child(void);

#ifdef __cplusplus
}
#endif

#endif /* RDS_CAPI_H */
