/*
 * rds-window: the 64 B message rate with a fixed number of messages in
 * flight, each answered, over plain AF_RDS sockets (issue 14's "64 B
 * message rate with 16 in flight"). A C program of the kind the kernel's
 * RDS serves, so that the kernel and ours (the same binary under
 * LD_PRELOAD=librdspreload.so) run the very same code; qperf cannot limit
 * what is in flight.
 *
 *   rds-window serve ADDR PORT SECS
 *       answers every message with a 64 B message to its sender, for at
 *       most SECS seconds (then exits 0)
 *   rds-window run ADDR PORT PEER_ADDR PEER_PORT WINDOW SECS
 *       sends WINDOW 64 B messages, then one more for each answer, so
 *       that WINDOW are always in flight; after 0.5 s of warm-up counts
 *       the answers over SECS seconds and prints
 *       "window W: N answers in T s: R msg/s, round trip U us"
 *
 * With -p first (both forms), every receive waits in poll(POLLIN) and then
 * takes the message with MSG_DONTWAIT, as rds-tools' rds-stress and other
 * event-loop programs do, instead of blocking in recvfrom.
 *
 * Exits 1 with a message on any error, and when nothing arrives for 5 s
 * (SO_RCVTIMEO, or poll's timeout with -p): every run is bounded in time.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define AF_RDS_ 21
#define MSG 64

/* -p: wait in poll, then receive without blocking. */
static int use_poll;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	fprintf(stderr, "rds-window: %s: %s\n", what, strerror(errno));
	exit(1);
}

static struct sockaddr_in addr_of(const char *a, const char *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(port)) };
	if (inet_pton(AF_INET, a, &sa.sin_addr) != 1) {
		fprintf(stderr, "rds-window: not an IPv4 address: %s\n", a);
		exit(1);
	}
	return sa;
}

static int bound_socket(const char *a, const char *port)
{
	struct sockaddr_in sa = addr_of(a, port);
	struct timeval tv = { .tv_sec = 5 };
	int s = socket(AF_RDS_, SOCK_SEQPACKET, 0);
	if (s < 0)
		die("socket(AF_RDS)");
	if (bind(s, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("bind");
	if (setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0)
		die("SO_RCVTIMEO");
	return s;
}

/* One 64 B message to `to`; a full send buffer (EAGAIN) or a congested
 * port (ENOBUFS) waits for room, at most 5 s in all. */
static void send_one(int s, const struct sockaddr_in *to, const char *buf)
{
	double give_up = now() + 5;
	for (;;) {
		if (sendto(s, buf, MSG, 0, (const struct sockaddr *)to, sizeof *to) == MSG)
			return;
		if ((errno != EAGAIN && errno != ENOBUFS && errno != EINTR) || now() > give_up)
			die("sendto");
		struct pollfd p = { .fd = s, .events = POLLOUT };
		poll(&p, 1, 10);
	}
}

/* One message into `buf`: >= 0, or -1 with errno (EAGAIN: nothing for
 * 5 s). With -p, poll(POLLIN) first, then MSG_DONTWAIT; a readable
 * descriptor with nothing to take (another thread's, a spurious wake-up)
 * waits again. */
static int recv_wait(int s, char *buf, struct sockaddr_in *from)
{
	socklen_t fl = sizeof *from;
	if (!use_poll)
		return recvfrom(s, buf, MSG, 0, (struct sockaddr *)from, &fl);
	double give_up = now() + 5;
	for (;;) {
		struct pollfd p = { .fd = s, .events = POLLIN };
		int r = poll(&p, 1, 5000);
		if (r < 0)
			return -1;
		if (r > 0) {
			fl = sizeof *from;
			int n = recvfrom(s, buf, MSG, MSG_DONTWAIT, (struct sockaddr *)from, &fl);
			if (n >= 0 || errno != EAGAIN)
				return n;
		}
		if (now() > give_up) {
			errno = EAGAIN;
			return -1;
		}
	}
}

static void recv_one(int s, char *buf, struct sockaddr_in *from)
{
	for (;;) {
		if (recv_wait(s, buf, from) >= 0)
			return;
		if (errno != EINTR)
			die(errno == EAGAIN ? "recvfrom (nothing for 5 s)" : "recvfrom");
	}
}

int main(int argc, char **argv)
{
	char buf[MSG] = { 0 };
	struct sockaddr_in from;
	if (argc > 1 && strcmp(argv[1], "-p") == 0) {
		use_poll = 1;
		argv++;
		argc--;
	}
	if (argc == 5 && strcmp(argv[1], "serve") == 0) {
		int s = bound_socket(argv[2], argv[3]);
		double end = now() + atof(argv[4]);
		while (now() < end) {
			if (recv_wait(s, buf, &from) < 0) {
				if (errno == EINTR || errno == EAGAIN)
					continue;
				die("recvfrom");
			}
			send_one(s, &from, buf);
		}
		return 0;
	}
	if (argc != 8 || strcmp(argv[1], "run") != 0) {
		fprintf(stderr, "usage: rds-window [-p] serve ADDR PORT SECS\n"
				"       rds-window [-p] run ADDR PORT PEER_ADDR PEER_PORT WINDOW SECS\n");
		return 2;
	}
	int s = bound_socket(argv[2], argv[3]);
	struct sockaddr_in to = addr_of(argv[4], argv[5]);
	int window = atoi(argv[6]);
	double secs = atof(argv[7]);
	if (window < 1 || window > 1024 || !(secs > 0 && secs <= 600)) {
		fprintf(stderr, "rds-window: WINDOW 1..1024, SECS 0..600\n");
		return 2;
	}
	for (int i = 0; i < window; i++)
		send_one(s, &to, buf);
	long answers = 0, base = 0;
	double warm = now() + 0.5, start = 0, t = 0;
	for (;;) {
		recv_one(s, buf, &from);
		answers++;
		t = now();
		if (start == 0 && t >= warm) {
			start = t;
			base = answers;
		}
		if (start != 0 && t - start >= secs)
			break;
		send_one(s, &to, buf);
	}
	long n = answers - base;
	if (n <= 0) {
		fprintf(stderr, "rds-window: no answer after the warm-up\n");
		return 1;
	}
	printf("window %d: %ld answers in %.2f s: %.0f msg/s, round trip %.1f us\n", window, n, t - start,
	       n / (t - start), (t - start) / n * window * 1e6);
	return 0;
}
