/*
 * The C ABI from C: readiness (poll, select, epoll level and edge), a
 * blocking receive interrupted by SIGALRM (with and without SA_RESTART),
 * non-blocking sends until EAGAIN, and fork. Run by tests/c_api.rs as
 * `api <scenario> <port> <net>` (addresses 127.0.<net>.x); prints "ok <scenario>" and exits 0, or says
 * what went wrong and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "rds_capi.h"

static int port;
/* The scenario's addresses: 127.0.<net>.1, .2 and .3 (one process serves an address). */
static int net;
static char ip1[32], ip2[32], ip3[32];

#define CHECK(cond)                                                                 \
	do {                                                                        \
		if (!(cond)) {                                                      \
			fprintf(stderr, "%s:%d: %s failed (errno %d %s)\n", __FILE__, \
				__LINE__, #cond, errno, strerror(errno));           \
			exit(1);                                                    \
		}                                                                   \
	} while (0)

static struct sockaddr_in addr(const char *ip, int p)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(p) };

	inet_pton(AF_INET, ip, &sin.sin_addr);
	return sin;
}

static int bound(const char *ip, int p)
{
	struct sockaddr_in sin = addr(ip, p);
	int fd = rds_socket(AF_RDS, SOCK_SEQPACKET, 0);

	CHECK(fd >= 0);
	CHECK(rds_bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0);
	return fd;
}

static void send_to(int fd, const char *msg, const char *ip, int p)
{
	struct sockaddr_in to = addr(ip, p);

	CHECK(rds_sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&to, sizeof(to)) == (ssize_t)strlen(msg));
}

/* Receives one datagram and checks it is `want`. */
static void expect(int fd, const char *want, int flags)
{
	char buf[256];
	ssize_t n = rds_recvfrom(fd, buf, sizeof(buf) - 1, flags, NULL, NULL);

	CHECK(n >= 0);
	buf[n] = 0;
	if (strcmp(buf, want) != 0) {
		fprintf(stderr, "got '%s', wanted '%s'\n", buf, want);
		exit(1);
	}
}

static short poll1(int fd, short events, int ms)
{
	struct pollfd p = { .fd = fd, .events = events };

	CHECK(poll(&p, 1, ms) >= 0);
	return p.revents;
}

static void t_poll(void)
{
	int a = bound(ip1, port), b = bound(ip2, port + 1);

	CHECK(poll1(b, POLLIN | POLLOUT, 0) == POLLOUT);
	send_to(a, "one", ip2, port + 1);
	send_to(a, "two", ip2, port + 1);
	CHECK(poll1(b, POLLIN, 5000) == POLLIN);
	expect(b, "one", 0);
	CHECK(poll1(b, POLLIN, 0) == POLLIN);
	expect(b, "two", 0);
	CHECK(poll1(b, POLLIN, 0) == 0);
	CHECK(rds_close(a) == 0 && rds_close(b) == 0);
}

static void t_select(void)
{
	int a = bound(ip1, port), b = bound(ip2, port + 1);
	fd_set r, w;
	struct timeval tv = { 0, 0 };

	FD_ZERO(&r);
	FD_SET(b, &r);
	CHECK(select(b + 1, &r, NULL, NULL, &tv) == 0);
	FD_ZERO(&w);
	FD_SET(b, &w);
	CHECK(select(b + 1, NULL, &w, NULL, &tv) == 1 && FD_ISSET(b, &w));
	send_to(a, "sel", ip2, port + 1);
	tv.tv_sec = 5;
	FD_ZERO(&r);
	FD_SET(b, &r);
	CHECK(select(b + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(b, &r));
	expect(b, "sel", 0);
	tv.tv_sec = 0;
	FD_ZERO(&r);
	FD_SET(b, &r);
	CHECK(select(b + 1, &r, NULL, NULL, &tv) == 0);
	CHECK(rds_close(a) == 0 && rds_close(b) == 0);
}

static int wait_ep(int ep, int ms)
{
	struct epoll_event ev[4];
	int n = epoll_wait(ep, ev, 4, ms);

	CHECK(n >= 0);
	return n;
}

static void t_epoll(int edge)
{
	int a = bound(ip1, port), b = bound(ip2, port + 1);
	int ep = epoll_create1(0);
	struct epoll_event ev = { .events = EPOLLIN | (edge ? EPOLLET : 0), .data.fd = b };
	char buf[16];

	CHECK(ep >= 0);
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) == 0);
	CHECK(wait_ep(ep, 0) == 0);
	send_to(a, "e1", ip2, port + 1);
	send_to(a, "e2", ip2, port + 1);
	CHECK(wait_ep(ep, 5000) == 1);
	if (edge) {
		/* The edge was reported once: no event until a new one. */
		CHECK(wait_ep(ep, 100) == 0);
		expect(b, "e1", 0);
		expect(b, "e2", 0);
		CHECK(rds_recvfrom(b, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL) == -1 && errno == EAGAIN);
		send_to(a, "e3", ip2, port + 1);
		CHECK(wait_ep(ep, 5000) == 1);
		CHECK(wait_ep(ep, 100) == 0);
		expect(b, "e3", 0);
	} else {
		/* Level: reported while anything is queued. */
		CHECK(wait_ep(ep, 0) == 1);
		expect(b, "e1", 0);
		CHECK(wait_ep(ep, 0) == 1);
		expect(b, "e2", 0);
		CHECK(wait_ep(ep, 100) == 0);
	}
	/* EPOLLOUT on a socket with room. */
	ev.events = EPOLLOUT | (edge ? EPOLLET : 0);
	CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, b, &ev) == 0);
	CHECK(wait_ep(ep, 1000) == 1);
	close(ep);
	CHECK(rds_close(a) == 0 && rds_close(b) == 0);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void arm(int restart, int ms)
{
	struct sigaction sa;
	struct itimerval it = { .it_value = { ms / 1000, (ms % 1000) * 1000 } };

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = restart ? SA_RESTART : 0;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
}

static void *late_sender(void *arg)
{
	int a = *(int *)arg;

	usleep(600 * 1000);
	send_to(a, "late", ip2, port + 1);
	return NULL;
}

static void t_eintr(void)
{
	int a = bound(ip1, port), b = bound(ip2, port + 1);
	char buf[16];
	pthread_t t;

	/* Without SA_RESTART a blocking receive fails with EINTR. */
	arm(0, 200);
	errno = 0;
	CHECK(rds_recvfrom(b, buf, sizeof(buf), 0, NULL, NULL) == -1);
	CHECK(errno == EINTR && alarms == 1);
	/* With SA_RESTART it goes on waiting, and gets the late datagram. */
	arm(1, 200);
	CHECK(pthread_create(&t, NULL, late_sender, &a) == 0);
	expect(b, "late", 0);
	CHECK(alarms == 2);
	pthread_join(t, NULL);
	/* recvmsg too, and a send blocked on a full buffer (always EINTR). */
	arm(0, 200);
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	CHECK(rds_recvmsg(b, &m, 0) == -1 && errno == EINTR && alarms == 3);
	CHECK(rds_close(a) == 0 && rds_close(b) == 0);
}

/* Sends to an address nobody serves until the send buffer is full. */
static void t_eagain(void)
{
	int a = bound(ip1, port);
	int sndbuf = 16384, n = 0;
	char big[4096];
	struct sockaddr_in to = addr(ip3, port);

	memset(big, 'x', sizeof(big));
	CHECK(rds_setsockopt(a, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)) == 0);
	CHECK(rds_fcntl(a, F_SETFL, O_NONBLOCK) == 0);
	for (;;) {
		ssize_t r = rds_sendto(a, big, sizeof(big), 0, (struct sockaddr *)&to, sizeof(to));

		if (r < 0)
			break;
		CHECK(r == (ssize_t)sizeof(big));
		CHECK(++n < 10000);
	}
	CHECK(errno == EAGAIN || errno == ENOBUFS);
	CHECK(n > 0);
	/* Not writable while full. */
	CHECK((poll1(a, POLLOUT, 0) & POLLOUT) == 0);
	/* A blocking send with SO_SNDTIMEO times out. */
	struct timeval tv = { 0, 200000 };
	CHECK(rds_setsockopt(a, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0);
	CHECK(rds_fcntl(a, F_SETFL, 0) == 0);
	CHECK(rds_sendto(a, big, sizeof(big), 0, (struct sockaddr *)&to, sizeof(to)) == -1);
	CHECK(errno == ETIMEDOUT);
	printf("sent %d before EAGAIN\n", n);
	CHECK(rds_close(a) == 0);
}

/*
 * The parent's socket is dead in the child; the child's own works (the
 * parent's engine is running at fork: its idle timer thread waits in
 * parking_lot's queue, which the child must clear, see
 * Engine::forget_after_fork).
 */
static void t_fork(void)
{
	int a = bound(ip1, port);
	char buf[64];
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		rds_fork_child(); /* the atfork handler already ran: a no-op */
		CHECK(rds_is_rds_fd(a) == 1);
		CHECK(rds_recvfrom(a, buf, sizeof(buf), MSG_DONTWAIT, NULL, NULL) == -1 && errno == EBADF);
		CHECK(rds_close(a) == 0);
		CHECK(rds_is_rds_fd(a) == 0);
		int c = bound(ip2, port + 1);
		send_to(c, "from child", ip1, port);
		CHECK(poll1(c, POLLIN, 20000) == POLLIN);
		expect(c, "to child", 0);
		CHECK(rds_close(c) == 0);
		exit(0);
	}
	struct sockaddr_in from;
	socklen_t flen = sizeof(from);
	CHECK(poll1(a, POLLIN, 20000) == POLLIN);
	ssize_t n = rds_recvfrom(a, buf, sizeof(buf) - 1, 0, (struct sockaddr *)&from, &flen);
	CHECK(n == 10 && memcmp(buf, "from child", 10) == 0);
	CHECK(flen == sizeof(from) && ntohs(from.sin_port) == port + 1);
	CHECK(rds_sendto(a, "to child", 8, 0, (struct sockaddr *)&from, flen) == 8);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(rds_close(a) == 0);
}

/* qperf's server: fork per test before any RDS socket; both sides open theirs after. */
static void t_fork_fresh(void)
{
	char buf[64];
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		int c = bound(ip2, port + 1);

		send_to(c, "child hello", ip1, port);
		CHECK(poll1(c, POLLIN, 20000) == POLLIN);
		expect(c, "parent hello", 0);
		CHECK(rds_close(c) == 0);
		exit(0);
	}
	int a = bound(ip1, port);
	struct sockaddr_in from;
	socklen_t flen = sizeof(from);
	CHECK(poll1(a, POLLIN, 20000) == POLLIN);
	ssize_t n = rds_recvfrom(a, buf, sizeof(buf) - 1, 0, (struct sockaddr *)&from, &flen);
	CHECK(n == 11 && memcmp(buf, "child hello", 11) == 0);
	CHECK(rds_sendto(a, "parent hello", 12, 0, (struct sockaddr *)&from, flen) == 12);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(rds_close(a) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	port = atoi(argv[2]);
	net = atoi(argv[3]);
	snprintf(ip1, sizeof(ip1), "127.0.%d.1", net);
	snprintf(ip2, sizeof(ip2), "127.0.%d.2", net);
	snprintf(ip3, sizeof(ip3), "127.0.%d.3", net);
	if (strcmp(argv[1], "poll") == 0)
		t_poll();
	else if (strcmp(argv[1], "select") == 0)
		t_select();
	else if (strcmp(argv[1], "epoll-lt") == 0)
		t_epoll(0);
	else if (strcmp(argv[1], "epoll-et") == 0)
		t_epoll(1);
	else if (strcmp(argv[1], "eintr") == 0)
		t_eintr();
	else if (strcmp(argv[1], "eagain") == 0)
		t_eagain();
	else if (strcmp(argv[1], "fork") == 0)
		t_fork();
	else if (strcmp(argv[1], "fork-fresh") == 0)
		t_fork_fresh();
	else
		return 2;
	printf("ok %s\n", argv[1]);
	return 0;
}
