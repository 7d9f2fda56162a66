/* rdsinfo: tiny helper for the kernel-facts probes (our own code).
 *
 * Python's socket.getsockopt() cannot pass a zero-length buffer, cannot use
 * buffers > 1024 bytes and hides the positive return value, and its AF_RDS
 * address handling only knows sockaddr_in.  This helper covers those cases.
 *
 *   rdsinfo len OPT            getsockopt(SOL_RDS, OPT) with optlen 0
 *   rdsinfo get OPT [BUFLEN]   getsockopt with a buffer; prints ret/errno/optlen
 *   rdsinfo counters           RDS_INFO_COUNTERS as name=value lines
 *   rdsinfo conns|tcp|send|retrans|recv|sockets   decoded IPv4 info items
 *   rdsinfo addrtests          bind/sendto/connect with odd lengths/families, IPv6
 *
 * Build: gcc -static -O2 -Wall -o rdsinfo rdsinfo.c
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define AF_RDS_ 21
#define SOL_RDS_ 276

static int rds_socket(void)
{
	int fd = socket(AF_RDS_, SOCK_SEQPACKET, 0);
	if (fd < 0) {
		perror("socket(AF_RDS)");
		exit(2);
	}
	return fd;
}

static const char *ename(int e)
{
	switch (e) {
	case 0: return "OK";
	case EINVAL: return "EINVAL";
	case ENOSPC: return "ENOSPC";
	case EFAULT: return "EFAULT";
	case ENOPROTOOPT: return "ENOPROTOOPT";
	case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
	case EADDRINUSE: return "EADDRINUSE";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EAFNOSUPPORT: return "EAFNOSUPPORT";
	case EPROTOTYPE: return "EPROTOTYPE";
	case ENOTCONN: return "ENOTCONN";
	case EDESTADDRREQ: return "EDESTADDRREQ";
	case EMSGSIZE: return "EMSGSIZE";
	case EAGAIN: return "EAGAIN";
	case ESOCKTNOSUPPORT: return "ESOCKTNOSUPPORT";
	case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
	default: return strerror(e);
	}
}

static int do_get(int opt, int buflen, unsigned char **out, int *outlen)
{
	int fd = rds_socket();
	unsigned char *buf = buflen ? calloc(1, buflen) : NULL;
	socklen_t len = buflen;
	int ret = getsockopt(fd, SOL_RDS_, opt, buf, &len);
	int e = ret < 0 ? errno : 0;
	printf("getsockopt(SOL_RDS, %d, buflen=%d) -> ret=%d errno=%s optlen=%u\n",
	       opt, buflen, ret, ename(e), (unsigned)len);
	if (out) {
		*out = buf;
		*outlen = ret < 0 ? 0 : (int)len;
	} else {
		free(buf);
	}
	close(fd);
	return ret;
}

static uint64_t u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint16_t be16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static const char *ip4(const unsigned char *p, char *b)
{
	inet_ntop(AF_INET, p, b, 32);
	return b;
}

static void dump_items(int opt, int bufsize, const char *what)
{
	unsigned char *buf;
	int n, ret;
	char a[32], b[32];

	ret = do_get(opt, bufsize, &buf, &n);
	if (ret <= 0)
		return;
	printf("item size %d, %d items\n", ret, n / ret);
	for (int off = 0; off + ret <= n; off += ret) {
		unsigned char *p = buf + off;
		if (!strcmp(what, "conns"))
			printf("  conn %s -> %s next_tx %llu next_rx %llu trans '%.16s' flags 0x%x tos %u\n",
			       ip4(p + 16, a), ip4(p + 20, b),
			       (unsigned long long)u64(p), (unsigned long long)u64(p + 8),
			       (char *)p + 24, p[40], p[41]);
		else if (!strcmp(what, "msgs"))
			printf("  msg seq %llu len %u %s:%u -> %s:%u flags 0x%x tos %u\n",
			       (unsigned long long)u64(p), u32(p + 8), ip4(p + 12, a),
			       be16(p + 20), ip4(p + 16, b), be16(p + 22), p[24], p[25]);
		else if (!strcmp(what, "tcp"))
			printf("  tcp %s:%u -> %s:%u hdr_rem %llu data_rem %llu sent_nxt %u exp_una %u seen_una %u tos %u\n",
			       ip4(p, a), be16(p + 4), ip4(p + 6, b), be16(p + 10),
			       (unsigned long long)u64(p + 12), (unsigned long long)u64(p + 20),
			       u32(p + 28), u32(p + 32), u32(p + 36), p[40]);
		else if (!strcmp(what, "sockets"))
			printf("  sock sndbuf %u bound %s:%u conn %s:%u rcvbuf %u inum %llu\n",
			       u32(p), ip4(p + 4, a), be16(p + 12), ip4(p + 8, b),
			       be16(p + 14), u32(p + 16), (unsigned long long)u64(p + 20));
	}
	free(buf);
}

static void try_bind(const char *label, const void *sa, socklen_t len)
{
	int fd = rds_socket();
	int r = bind(fd, sa, len);
	printf("bind %-40s -> %s\n", label, r ? ename(errno) : "OK");
	close(fd);
}

static void addrtests(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(4100) };
	struct sockaddr_in6 s6 = { .sin6_family = AF_INET6, .sin6_port = htons(4101) };
	struct sockaddr sa = { .sa_family = AF_INET };
	int fd, r;

	inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
	try_bind("addrlen 1", &sin, 1);
	try_bind("AF_INET addrlen 2", &sin, 2);
	try_bind("AF_INET addrlen 15", &sin, 15);
	try_bind("AF_INET addrlen 16 127.0.0.1", &sin, 16);
	sa.sa_family = AF_UNSPEC;
	try_bind("AF_UNSPEC len 16", &sa, 16);
	sa.sa_family = AF_UNIX;
	try_bind("AF_UNIX len 16", &sa, 16);
	inet_pton(AF_INET, "127.9.8.7", &sin.sin_addr);
	try_bind("127.9.8.7 (not configured, 127/8)", &sin, 16);
	inet_pton(AF_INET6, "::1", &s6.sin6_addr);
	try_bind("AF_INET6 len 24 ::1", &s6, 24);
	try_bind("AF_INET6 ::1", &s6, sizeof s6);
	inet_pton(AF_INET6, "::", &s6.sin6_addr);
	try_bind("AF_INET6 ::", &s6, sizeof s6);
	inet_pton(AF_INET6, "::ffff:127.0.0.1", &s6.sin6_addr);
	try_bind("AF_INET6 ::ffff:127.0.0.1", &s6, sizeof s6);
	inet_pton(AF_INET6, "::ffff:0.0.0.0", &s6.sin6_addr);
	try_bind("AF_INET6 ::ffff:0.0.0.0", &s6, sizeof s6);
	inet_pton(AF_INET6, "ff02::1", &s6.sin6_addr);
	try_bind("AF_INET6 ff02::1", &s6, sizeof s6);
	inet_pton(AF_INET6, "fe80::1", &s6.sin6_addr);
	try_bind("AF_INET6 fe80::1 scope 0", &s6, sizeof s6);
	s6.sin6_scope_id = 1;
	try_bind("AF_INET6 fe80::1 scope 1 (lo)", &s6, sizeof s6);
	s6.sin6_scope_id = 0;
	inet_pton(AF_INET6, "2001:db8::1", &s6.sin6_addr);
	try_bind("AF_INET6 2001:db8::1 (not local)", &s6, sizeof s6);

	/* sendto with odd names from a socket bound to 127.0.0.1 */
	fd = rds_socket();
	inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
	sin.sin_port = htons(4102);
	r = bind(fd, (void *)&sin, sizeof sin);
	printf("bind 127.0.0.1:4102 -> %s\n", r ? ename(errno) : "OK");
	r = sendto(fd, "x", 1, 0, (void *)&sin, 8);
	printf("sendto namelen 8 -> %s\n", r < 0 ? ename(errno) : "OK");
	r = sendto(fd, "x", 1, 0, (void *)&sin, 16);
	printf("sendto namelen 16 self -> %s\n", r < 0 ? ename(errno) : "OK");
	sa.sa_family = AF_UNIX;
	r = sendto(fd, "x", 1, 0, &sa, 16);
	printf("sendto AF_UNIX -> %s\n", r < 0 ? ename(errno) : "OK");
	s6.sin6_family = AF_INET6;
	inet_pton(AF_INET6, "::1", &s6.sin6_addr);
	r = sendto(fd, "x", 1, 0, (void *)&s6, 16);
	printf("sendto AF_INET6 namelen 16 -> %s\n", r < 0 ? ename(errno) : "OK");
	r = sendto(fd, "x", 1, 0, (void *)&s6, sizeof s6);
	printf("sendto AF_INET6 ::1 from v4-bound -> %s\n", r < 0 ? ename(errno) : "OK");
	inet_pton(AF_INET6, "ff02::1", &s6.sin6_addr);
	r = sendto(fd, "x", 1, 0, (void *)&s6, sizeof s6);
	printf("sendto AF_INET6 ff02::1 -> %s\n", r < 0 ? ename(errno) : "OK");
	/* connect variants */
	sa.sa_family = AF_UNSPEC;
	r = connect(fd, &sa, sizeof sa);
	printf("connect AF_UNSPEC -> %s\n", r ? ename(errno) : "OK");
	r = connect(fd, &sa, 1);
	printf("connect addrlen 1 -> %s\n", r ? ename(errno) : "OK");
	r = connect(fd, (void *)&s6, sizeof s6);
	printf("connect AF_INET6 ff02::1 -> %s\n", r ? ename(errno) : "OK");
	inet_pton(AF_INET6, "::", &s6.sin6_addr);
	r = connect(fd, (void *)&s6, sizeof s6);
	printf("connect AF_INET6 :: -> %s\n", r ? ename(errno) : "OK");
	close(fd);

	/* protocol / type checks */
	r = socket(AF_RDS_, SOCK_DGRAM, 0);
	printf("socket(AF_RDS, SOCK_DGRAM, 0) -> %s\n", r < 0 ? ename(errno) : "OK");
	r = socket(AF_RDS_, SOCK_SEQPACKET, 1);
	printf("socket(AF_RDS, SOCK_SEQPACKET, 1) -> %s\n", r < 0 ? ename(errno) : "OK");

	/* IPv6 loopback socket, ping itself */
	fd = rds_socket();
	memset(&s6, 0, sizeof s6);
	s6.sin6_family = AF_INET6;
	s6.sin6_port = htons(4103);
	inet_pton(AF_INET6, "::1", &s6.sin6_addr);
	r = bind(fd, (void *)&s6, sizeof s6);
	printf("bind [::1]:4103 -> %s\n", r ? ename(errno) : "OK");
	{
		int t = -2;
		socklen_t tl = sizeof t;
		getsockopt(fd, SOL_RDS_, 8, &t, &tl);
		printf("[::1] socket SO_RDS_TRANSPORT = %d\n", t);
	}
	inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
	r = sendto(fd, "x", 1, 0, (void *)&sin, sizeof sin);
	printf("sendto v4 from v6-bound -> %s\n", r < 0 ? ename(errno) : "OK");
	r = sendto(fd, "hello6", 6, 0, (void *)&s6, sizeof s6);
	printf("sendto [::1]:4103 self -> %s\n", r < 0 ? ename(errno) : "OK");
	{
		char buf[64];
		struct sockaddr_in6 from;
		socklen_t fl = sizeof from;
		r = recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, (void *)&from, &fl);
		char a[64];
		inet_ntop(AF_INET6, &from.sin6_addr, a, sizeof a);
		printf("recvfrom -> %d from family %d [%s]:%u namelen %u\n", r,
		       from.sin6_family, a, ntohs(from.sin6_port), (unsigned)fl);
		struct sockaddr_in6 me;
		socklen_t ml = sizeof me;
		getsockname(fd, (void *)&me, &ml);
		printf("getsockname len %u family %d\n", (unsigned)ml, me.sin6_family);
	}
	close(fd);

	/* getsockname on unbound socket */
	fd = rds_socket();
	{
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		memset(&ss, 0xaa, sizeof ss);
		r = getsockname(fd, (void *)&ss, &sl);
		printf("getsockname unbound -> %s len %u family %d\n", r ? ename(errno) : "OK",
		       (unsigned)sl, ss.ss_family);
		sl = sizeof ss;
		r = getpeername(fd, (void *)&ss, &sl);
		printf("getpeername unconnected -> %s\n", r ? ename(errno) : "OK");
	}
	close(fd);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: see source\n");
		return 2;
	}
	if (!strcmp(argv[1], "len") && argc > 2) {
		do_get(atoi(argv[2]), 0, NULL, NULL);
	} else if (!strcmp(argv[1], "get") && argc > 2) {
		do_get(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 65536, NULL, NULL);
	} else if (!strcmp(argv[1], "counters")) {
		unsigned char *buf;
		int n, ret = do_get(10000, 65536, &buf, &n);
		for (int off = 0; ret > 0 && off + 40 <= n; off += 40)
			printf("  %-32.32s %llu\n", (char *)buf + off,
			       (unsigned long long)u64(buf + off + 32));
	} else if (!strcmp(argv[1], "conns")) {
		dump_items(10001, 65536, "conns");
	} else if (!strcmp(argv[1], "send")) {
		dump_items(10003, 65536, "msgs");
	} else if (!strcmp(argv[1], "retrans")) {
		dump_items(10004, 65536, "msgs");
	} else if (!strcmp(argv[1], "recv")) {
		dump_items(10005, 65536, "msgs");
	} else if (!strcmp(argv[1], "sockets")) {
		dump_items(10006, 65536, "sockets");
	} else if (!strcmp(argv[1], "tcp")) {
		dump_items(10007, 65536, "tcp");
	} else if (!strcmp(argv[1], "addrtests")) {
		addrtests();
	} else {
		fprintf(stderr, "unknown command\n");
		return 2;
	}
	return 0;
}
