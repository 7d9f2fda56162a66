/*
 * tcp_pingpong: the structure of an RDS-TCP round trip, on plain TCP.
 *
 * A client sends a 112-byte record (an RDS header and 64 bytes) and waits
 * for the server's answer of the same size, N times. Two switches add what
 * an RDS round trip adds to raw TCP's:
 *   POLL  1: each read is preceded by a poll() of two descriptors, the
 *            connection and an eventfd (ours polls the socket's readiness
 *            descriptor beside the TCP connection it reads);
 *   TWO   1: requests go on one TCP connection and answers on another (RDS
 *            sends each on the lane of its socket's port, and a client's
 *            and a server's port seldom share one: each connection then
 *            carries data one way and needs TCP's own ack).
 * With both, what is left of an RDS round trip is the RDS code itself.
 *
 * Build: cc -O2 -o tcp_pingpong scripts/perf/tcp_pingpong.c
 * Run (the VM rig's two namespaces, `netpair up`):
 *   ip netns exec ns2 ./tcp_pingpong server 0 17000 8000 POLL TWO &
 *   ip netns exec ns1 ./tcp_pingpong client 10.99.0.2 17000 8000 POLL TWO
 * The client prints the round trip and one-way time in microseconds.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RECORD (48 + 64)

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static int listener(int port)
{
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

	if (s < 0)
		die("socket");
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 4))
		die("bind/listen");
	return s;
}

/* Connects, retrying for up to 10 s while the server starts. */
static int connect_to(const char *addr, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1)
		die("address");
	for (int tries = 0; tries < 100; tries++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);

		if (s < 0)
			die("socket");
		if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0)
			return s;
		close(s);
		usleep(100000);
	}
	die("connect");
	return -1;
}

/* Reads one record, with a poll of (s, ev) before each read if asked. */
static void read_record(int s, int ev, char *buf, int use_poll)
{
	int got = 0;

	while (got < RECORD) {
		if (use_poll) {
			struct pollfd p[2] = { { s, POLLIN, 0 }, { ev, POLLIN, 0 } };

			if (poll(p, 2, 10000) <= 0)
				die("poll");
		}
		ssize_t r = recv(s, buf + got, RECORD - got, 0);

		if (r <= 0)
			die("recv");
		got += r;
	}
}

static void write_record(int s, const char *buf)
{
	if (send(s, buf, RECORD, 0) != RECORD)
		die("send");
}

int main(int argc, char **argv)
{
	if (argc != 7 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: %s server|client ADDR PORT N POLL(0|1) TWO(0|1)\n", argv[0]);
		return 2;
	}
	int server = !strcmp(argv[1], "server"), port = atoi(argv[3]);
	long n = atol(argv[4]);
	int use_poll = atoi(argv[5]), two = atoi(argv[6]), one = 1;
	int ev = eventfd(0, 0), req, ans;
	char buf[RECORD] = { 0 };
	struct timespec t0, t1;

	if (ev < 0)
		die("eventfd");
	if (server) {
		int l = listener(port);

		req = accept(l, NULL, NULL);
		ans = two ? accept(l, NULL, NULL) : req;
		if (req < 0 || ans < 0)
			die("accept");
	} else {
		req = connect_to(argv[2], port);
		ans = two ? connect_to(argv[2], port) : req;
	}
	setsockopt(req, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(ans, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++) {
		if (server) {
			read_record(req, ev, buf, use_poll);
			write_record(ans, buf);
		} else {
			write_record(req, buf);
			read_record(ans, ev, buf, use_poll);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (!server) {
		double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n;

		printf("poll=%d two=%d round trip %.1f us, one way %.1f us\n", use_poll, two, us, us / 2);
	}
	return 0;
}
