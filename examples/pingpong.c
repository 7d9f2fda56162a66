/*
 * pingpong.c - two processes exchange RDS datagrams through librds.so.
 *
 *   cc -I capi/include examples/pingpong.c -L target/release -lrds \
 *      -Wl,-rpath,$PWD/target/release -o pingpong
 *   ./pingpong server 127.0.0.2 4000 100 &
 *   ./pingpong client 127.0.0.1 127.0.0.2 4000 100
 *
 * The client sends "ping <i>" for i in 0..count and waits (poll on the RDS
 * descriptor) for "pong <i>" after each; the server answers each ping with
 * its pong (it prints "ready" once bound), checking that they come in order and from the client. Both
 * print "ok <count>" and exit 0 when every datagram was as expected.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/rds.h>

#include "rds_capi.h"

static int fail(const char *what)
{
	fprintf(stderr, "pingpong: %s: %s\n", what, strerror(errno));
	return 1;
}

static int open_bound(const char *ip, int port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = rds_socket(AF_RDS, SOCK_SEQPACKET, 0);

	if (fd < 0)
		return -1;
	if (inet_pton(AF_INET, ip, &sin.sin_addr) != 1) {
		errno = EINVAL;
		return -1;
	}
	if (rds_bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
		return -1;
	return fd;
}

static int server(const char *ip, int port, int count)
{
	int fd = open_bound(ip, port);
	char buf[256], want[64];

	if (fd < 0)
		return fail("server socket");
	printf("ready\n");
	fflush(stdout);
	for (int i = 0; i < count; i++) {
		struct sockaddr_in from;
		socklen_t flen = sizeof(from);
		ssize_t n = rds_recvfrom(fd, buf, sizeof(buf) - 1, 0, (struct sockaddr *)&from, &flen);

		if (n < 0)
			return fail("recvfrom");
		buf[n] = 0;
		snprintf(want, sizeof(want), "ping %d", i);
		if (strcmp(buf, want) != 0 || flen != sizeof(from) || from.sin_family != AF_INET) {
			fprintf(stderr, "pingpong: server got '%s' (len %u), wanted '%s'\n", buf, flen, want);
			return 1;
		}
		snprintf(buf, sizeof(buf), "pong %d", i);
		if (rds_sendto(fd, buf, strlen(buf), 0, (struct sockaddr *)&from, flen) != (ssize_t)strlen(buf))
			return fail("sendto");
	}
	printf("ok %d\n", count);
	fflush(stdout);
	/* Let the last pong be acknowledged before the engine goes away. */
	struct pollfd p = { .fd = fd, .events = POLLIN };
	poll(&p, 1, 500);
	return rds_close(fd) == 0 ? 0 : fail("close");
}

static int client(const char *ip, const char *peer, int port, int count)
{
	int fd = open_bound(ip, port);
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port) };
	char buf[256], want[64];

	if (fd < 0)
		return fail("client socket");
	inet_pton(AF_INET, peer, &to.sin_addr);
	for (int i = 0; i < count; i++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) - 1 };
		struct sockaddr_in from;
		struct msghdr m = { .msg_name = &from, .msg_namelen = sizeof(from), .msg_iov = &iov, .msg_iovlen = 1 };
		int len = snprintf(buf, sizeof(buf), "ping %d", i);
		ssize_t n;

		/* The server may not be bound yet: the first pings are retried. */
		if (rds_sendto(fd, buf, len, 0, (struct sockaddr *)&to, sizeof(to)) != len)
			return fail("sendto");
		if (poll(&p, 1, 30000) != 1)
			return fail("poll (no pong in 30 s)");
		n = rds_recvmsg(fd, &m, MSG_DONTWAIT);
		if (n < 0)
			return fail("recvmsg");
		buf[n] = 0;
		snprintf(want, sizeof(want), "pong %d", i);
		if (strcmp(buf, want) != 0 || from.sin_addr.s_addr != to.sin_addr.s_addr || from.sin_port != to.sin_port) {
			fprintf(stderr, "pingpong: client got '%s', wanted '%s'\n", buf, want);
			return 1;
		}
	}
	printf("ok %d\n", count);
	return rds_close(fd) == 0 ? 0 : fail("close");
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "server") == 0)
		return server(argv[2], atoi(argv[3]), atoi(argv[4]));
	if (argc == 6 && strcmp(argv[1], "client") == 0)
		return client(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
	fprintf(stderr, "usage: pingpong server ADDR PORT COUNT | client ADDR PEER PORT COUNT\n");
	return 2;
}
