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
 * An optional seventh argument, comma-separated, adds more of ours, or
 * work that shows what code costs where this runs (each per message and
 * side, after the read):
 *   writev     the record written as an RDS header and its payload (48 +
 *              64 bytes, one writev), as ours writes it;
 *   clock      a clock read before each write and after each read (ours
 *              reads the clock about that often: a system call where the
 *              clocksource has no vDSO support, as the VM rig's hpet);
 *   loop=N     N iterations of a dependent multiply-add (about 4N
 *              instructions of a hot loop);
 *   calls=N    N calls through a function pointer;
 *   pages=N    a byte of each of N distinct 4 KiB pages changed.
 *
 * Build: cc -O2 -o tcp_pingpong scripts/perf/tcp_pingpong.c
 * Run (the VM rig's two namespaces, `netpair up`):
 *   ip netns exec ns2 ./tcp_pingpong server 0 17000 8000 POLL TWO &
 *   ip netns exec ns1 ./tcp_pingpong client 10.99.0.2 17000 8000 POLL TWO
 *   ip netns exec ns1 ./tcp_pingpong client 10.99.0.2 17000 8000 1 0 writev,clock
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
#include <sys/uio.h>
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

/* The optional extras (see the top). */
static int x_writev, x_clock;
static long x_loop, x_calls, x_pages;
static char *x_region;
static volatile long x_sink;

__attribute__((noinline)) static long x_leaf(long v)
{
	return v * 3 + 1;
}
static long (*volatile x_leafp)(long) = x_leaf;

static void clock_read(void)
{
	struct timespec t;

	if (x_clock)
		clock_gettime(CLOCK_MONOTONIC, &t);
}

static void work(void)
{
	long v = x_sink;

	for (long i = 0; i < x_loop; i++) {
		v = v * 7 + i;
		__asm__ volatile("" : "+r"(v));
	}
	for (long i = 0; i < x_calls; i++)
		v = x_leafp(v);
	for (long i = 0; i < x_pages; i++)
		v += x_region[i * 4096 + (i * 64) % 4096]++;
	x_sink = v;
}

static void extras(const char *spec)
{
	char *copy = strdup(spec), *tok, *save = NULL;

	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcmp(tok, "writev"))
			x_writev = 1;
		else if (!strcmp(tok, "clock"))
			x_clock = 1;
		else if (!strncmp(tok, "loop=", 5))
			x_loop = atol(tok + 5);
		else if (!strncmp(tok, "calls=", 6))
			x_calls = atol(tok + 6);
		else if (!strncmp(tok, "pages=", 6))
			x_pages = atol(tok + 6);
		else {
			fprintf(stderr, "unknown extra: %s\n", tok);
			exit(2);
		}
	}
	free(copy);
	if (x_pages > 0 && !(x_region = calloc(x_pages, 4096)))
		die("calloc");
}

static void write_record(int s, char *buf)
{
	clock_read();
	if (x_writev) {
		struct iovec iov[2] = { { buf, 48 }, { buf + 48, RECORD - 48 } };

		if (writev(s, iov, 2) != RECORD)
			die("writev");
	} else if (send(s, buf, RECORD, 0) != RECORD)
		die("send");
}

int main(int argc, char **argv)
{
	if (argc < 7 || argc > 8 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: %s server|client ADDR PORT N POLL(0|1) TWO(0|1) [EXTRAS]\n", argv[0]);
		return 2;
	}
	if (argc == 8)
		extras(argv[7]);
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
			clock_read();
			work();
			write_record(ans, buf);
		} else {
			write_record(req, buf);
			read_record(ans, ev, buf, use_poll);
			clock_read();
			work();
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (!server) {
		double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n;

		printf("poll=%d two=%d extras=%s round trip %.1f us, one way %.1f us\n", use_poll, two,
		       argc == 8 ? argv[7] : "-", us, us / 2);
	}
	return 0;
}
