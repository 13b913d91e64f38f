/* sock.c -- socket chores with deadlines and full error sentences (see sock.h). */
#include "sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

bool ksock_split_hostport(const char *s, char *host_out, size_t host_len, uint16_t *port_out)
{
	const char *colon;
	size_t hl;
	char *end;
	unsigned long port;

	if (s == NULL || *s == '\0')
		return false;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (close == NULL || close[1] != ':')
			return false;
		hl = (size_t)(close - s - 1);
		s++;
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL)
			return false;
		hl = (size_t)(colon - s);
	}
	if (hl == 0 || hl >= host_len)
		return false;
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno != 0 || end == colon + 1 || *end != '\0' || port > 65535)
		return false;
	memcpy(host_out, s, hl);
	host_out[hl] = '\0';
	*port_out = (uint16_t)port;
	return true;
}

khor_status ksock_resolve(const char *host, uint16_t port, ksockaddr *out, kerr *err)
{
	struct addrinfo hints, *res;
	char portstr[8];
	int rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(portstr, sizeof(portstr), "%u", port);
	rc = getaddrinfo(host, portstr, &hints, &res);
	if (rc != 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "cannot resolve host '%s': %s", host,
		                gai_strerror(rc));
	/* Prefer IPv4: namespaces and loopback jobs are configured with v4 addresses. */
	struct addrinfo *pick = res;
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		if (ai->ai_family == AF_INET) {
			pick = ai;
			break;
		}
	}
	memcpy(&out->ss, pick->ai_addr, pick->ai_addrlen);
	out->len = pick->ai_addrlen;
	freeaddrinfo(res);
	return KHOR_SUCCESS;
}

const char *ksock_addr_str(const ksockaddr *a, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (a->ss.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)&a->ss;
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		snprintf(buf, len, "%s:%u", ip, ntohs(in->sin_port));
	} else if (a->ss.ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		snprintf(buf, len, "[%s]:%u", ip, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "(family %d)", a->ss.ss_family);
	}
	return buf;
}

uint16_t ksock_addr_port(const ksockaddr *a)
{
	if (a->ss.ss_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)&a->ss)->sin6_port);
	return ntohs(((const struct sockaddr_in *)&a->ss)->sin_port);
}

void ksock_addr_set_port(ksockaddr *a, uint16_t port)
{
	if (a->ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&a->ss)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)&a->ss)->sin_port = htons(port);
}

bool ksock_addr_is_loopback(const ksockaddr *a)
{
	if (a->ss.ss_family == AF_INET) {
		uint32_t ip = ntohl(((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr);
		return (ip >> 24) == 127;
	}
	if (a->ss.ss_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr);
	return false;
}

khor_status ksock_set_nonblock(int fd, kerr *err)
{
	int flags = fcntl(fd, F_GETFL, 0);
	char eb[128];

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "fcntl(O_NONBLOCK): %s",
		                kerr_errno_str(errno, eb, sizeof(eb)));
	return KHOR_SUCCESS;
}

void ksock_tune_stream(int fd, int bufsize)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (bufsize > 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof(bufsize));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof(bufsize));
	}
}

khor_status ksock_listen(ksockaddr *addr, int backlog, int *fd_out, kerr *err)
{
	char eb[128], as[64];
	int one = 1;
	int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "socket: %s",
		                kerr_errno_str(errno, eb, sizeof(eb)));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&addr->ss, addr->len) < 0) {
		int e = errno;
		close(fd);
		return kerr_set(err, KHOR_ERR_SYSTEM, "bind to %s: %s%s",
		                ksock_addr_str(addr, as, sizeof(as)), kerr_errno_str(e, eb, sizeof(eb)),
		                e == EADDRINUSE ? " (pick another port, or stop the process using it)"
		                                : "");
	}
	if (listen(fd, backlog) < 0) {
		int e = errno;
		close(fd);
		return kerr_set(err, KHOR_ERR_SYSTEM, "listen on %s: %s",
		                ksock_addr_str(addr, as, sizeof(as)), kerr_errno_str(e, eb, sizeof(eb)));
	}
	addr->len = sizeof(addr->ss);
	getsockname(fd, (struct sockaddr *)&addr->ss, &addr->len);
	*fd_out = fd;
	return KHOR_SUCCESS;
}

khor_status ksock_connect_deadline(const ksockaddr *addr, kdeadline dl, bool retry_refused,
                                   int *fd_out, kerr *err)
{
	char eb[128], as[64];
	int last_errno = 0;

	for (;;) {
		int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return kerr_set(err, KHOR_ERR_SYSTEM, "socket: %s",
			                kerr_errno_str(errno, eb, sizeof(eb)));
		int rc = connect(fd, (const struct sockaddr *)&addr->ss, addr->len);
		if (rc < 0 && errno == EINPROGRESS) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int pr;
			do {
				pr = poll(&p, 1, kdeadline_left_ms(dl, 1000));
			} while ((pr == 0 && !kdeadline_passed(dl)) || (pr < 0 && errno == EINTR));
			if (pr == 0) {
				close(fd);
				return kerr_set(err, KHOR_ERR_TIMEOUT,
				                "connect to %s: no answer before the deadline",
				                ksock_addr_str(addr, as, sizeof(as)));
			}
			socklen_t sl = sizeof(rc);
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &rc, &sl);
			if (rc != 0) {
				errno = rc;
				rc = -1;
			}
		}
		if (rc == 0) {
			*fd_out = fd;
			return KHOR_SUCCESS;
		}
		last_errno = errno;
		close(fd);
		if (!retry_refused || (last_errno != ECONNREFUSED && last_errno != ECONNRESET &&
		                       last_errno != ETIMEDOUT && last_errno != EHOSTUNREACH &&
		                       last_errno != ENETUNREACH))
			break;
		if (kdeadline_passed(dl))
			break;
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	return kerr_set(err, last_errno == ECONNREFUSED ? KHOR_ERR_TIMEOUT : KHOR_ERR_SYSTEM,
	                "connect to %s: %s%s", ksock_addr_str(addr, as, sizeof(as)),
	                kerr_errno_str(last_errno, eb, sizeof(eb)),
	                retry_refused ? " (kept retrying until the deadline)" : "");
}

/* Moves all len bytes, or (some_out not NULL) returns once some moved, saying how many. */
static khor_status io_all(int fd, void *buf, size_t len, kdeadline dl, const char *what,
                          bool is_write, size_t *some_out, kerr *err)
{
	char eb[128];
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = is_write ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
		if (n > 0 && some_out != NULL) {
			*some_out = (size_t)n;
			return KHOR_SUCCESS;
		}
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return kerr_set(err, KHOR_ERR_REMOTE, "%s: connection closed by the other side",
			                what);
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return kerr_set(err, errno == EPIPE || errno == ECONNRESET ? KHOR_ERR_REMOTE
			                                                            : KHOR_ERR_SYSTEM,
			                "%s: %s", what, kerr_errno_str(errno, eb, sizeof(eb)));
		struct pollfd pf = { .fd = fd, .events = is_write ? POLLOUT : POLLIN };
		int pr = poll(&pf, 1, kdeadline_left_ms(dl, 1000));
		if (pr == 0 && kdeadline_passed(dl))
			return kerr_set(err, KHOR_ERR_TIMEOUT, "%s: timed out", what);
	}
	return KHOR_SUCCESS;
}

khor_status ksock_write_all(int fd, const void *buf, size_t len, kdeadline dl, const char *what,
                            kerr *err)
{
	return io_all(fd, (void *)buf, len, dl, what, true, NULL, err);
}

khor_status ksock_read_all(int fd, void *buf, size_t len, kdeadline dl, const char *what,
                           kerr *err)
{
	return io_all(fd, buf, len, dl, what, false, NULL, err);
}

khor_status ksock_read_some(int fd, void *buf, size_t cap, kdeadline dl, const char *what,
                            size_t *len_out, kerr *err)
{
	return io_all(fd, buf, cap, dl, what, false, len_out, err);
}

/* --- interface selection -------------------------------------------------------------- */

static bool parse_cidr(const char *spec, int *family, uint8_t net[16], int *bits)
{
	char ip[64];
	const char *slash = strchr(spec, '/');
	char *end;
	long b;

	if (slash == NULL || (size_t)(slash - spec) >= sizeof(ip))
		return false;
	memcpy(ip, spec, (size_t)(slash - spec));
	ip[slash - spec] = '\0';
	b = strtol(slash + 1, &end, 10);
	if (*end != '\0' || end == slash + 1 || b < 0)
		return false;
	if (inet_pton(AF_INET, ip, net) == 1 && b <= 32) {
		*family = AF_INET;
	} else if (inet_pton(AF_INET6, ip, net) == 1 && b <= 128) {
		*family = AF_INET6;
	} else {
		return false;
	}
	*bits = (int)b;
	return true;
}

static bool prefix_match(const uint8_t *a, const uint8_t *b, int bits)
{
	int full = bits / 8, rest = bits % 8;

	if (memcmp(a, b, (size_t)full) != 0)
		return false;
	if (rest == 0)
		return true;
	uint8_t mask = (uint8_t)(0xff << (8 - rest));
	return (a[full] & mask) == (b[full] & mask);
}

static const uint8_t *addr_bytes(const struct sockaddr *sa, int *len_out)
{
	if (sa->sa_family == AF_INET) {
		*len_out = 4;
		return (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
	}
	*len_out = 16;
	return (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
}

/* Does the comma-separated name list match ifname? mode: 0 prefix, 1 exact. */
static bool name_in_list(const char *list, const char *ifname, int exact)
{
	char buf[256];
	char *save, *tok;

	kstrlcpy(buf, list, sizeof(buf));
	for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		if (exact ? strcmp(tok, ifname) == 0 : strncmp(tok, ifname, strlen(tok)) == 0)
			return true;
	}
	return false;
}

khor_status ksock_pick_address(const char *spec, const ksockaddr *hint, ksockaddr *out,
                               char *ifname_out, size_t ifname_len, kerr *err)
{
	struct ifaddrs *ifs, *ifa, *best = NULL;
	char eb[128];
	int best_score = -1;
	int cidr_family = 0, cidr_bits = 0;
	uint8_t cidr_net[16];
	bool use_cidr = false;
	char seen[512] = "";
	size_t seen_len = 0;

	if (spec != NULL && *spec == '\0')
		spec = NULL;
	if (spec != NULL && strchr(spec, '/') != NULL) {
		if (!parse_cidr(spec, &cidr_family, cidr_net, &cidr_bits))
			return kerr_set(err, KHOR_ERR_INVALID_ARG,
			                "KHOR_SOCKET_IFNAME='%s' is not a valid CIDR such as "
			                "198.18.0.0/15", spec);
		use_cidr = true;
	}
	if (getifaddrs(&ifs) < 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "getifaddrs: %s",
		                kerr_errno_str(errno, eb, sizeof(eb)));
	for (ifa = ifs; ifa != NULL; ifa = ifa->ifa_next) {
		int score = 0, alen;
		const uint8_t *ab;

		if (ifa->ifa_addr == NULL ||
		    (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6))
			continue;
		if (!(ifa->ifa_flags & IFF_UP))
			continue;
		ab = addr_bytes(ifa->ifa_addr, &alen);
		if (ifa->ifa_addr->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const void *)ab))
			continue;
		if (seen_len + strlen(ifa->ifa_name) + 64 < sizeof(seen)) {
			char ip[INET6_ADDRSTRLEN];
			inet_ntop(ifa->ifa_addr->sa_family, ab, ip, sizeof(ip));
			seen_len += (size_t)snprintf(seen + seen_len, sizeof(seen) - seen_len, "%s%s=%s",
			                             seen_len ? ", " : "", ifa->ifa_name, ip);
		}
		bool loop = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
		if (use_cidr) {
			if (ifa->ifa_addr->sa_family != cidr_family ||
			    !prefix_match(ab, cidr_net, cidr_bits))
				continue;
			score = 10;
		} else if (spec != NULL) {
			bool hit;
			/* NCCL_SOCKET_IFNAME's forms, "^=docker0" (exclude exact names) too. */
			if (spec[0] == '^' && spec[1] == '=')
				hit = !name_in_list(spec + 2, ifa->ifa_name, 1);
			else if (spec[0] == '^')
				hit = !name_in_list(spec + 1, ifa->ifa_name, 0);
			else if (spec[0] == '=')
				hit = name_in_list(spec + 1, ifa->ifa_name, 1);
			else
				hit = name_in_list(spec, ifa->ifa_name, 0);
			if (!hit)
				continue;
			score = 10 - (loop ? 5 : 0);
		} else {
			bool hint_loop = hint != NULL && ksock_addr_is_loopback(hint);
			score = loop ? (hint_loop ? 20 : 1) : 5;
			if (hint != NULL && !hint_loop && ifa->ifa_netmask != NULL &&
			    hint->ss.ss_family == ifa->ifa_addr->sa_family) {
				int hl, ml;
				const uint8_t *hb = addr_bytes((const struct sockaddr *)&hint->ss, &hl);
				const uint8_t *mb = addr_bytes(ifa->ifa_netmask, &ml);
				bool same = true;
				for (int i = 0; i < alen; i++)
					same = same && ((hb[i] & mb[i]) == (ab[i] & mb[i]));
				if (same)
					score = 30;
			}
		}
		if (ifa->ifa_addr->sa_family == AF_INET)
			score += 1; /* prefer v4 on the same interface */
		if (score > best_score) {
			best_score = score;
			best = ifa;
		}
	}
	if (best == NULL) {
		kerr_set(err, KHOR_ERR_INVALID_ARG,
		         "no network interface matches KHOR_SOCKET_IFNAME='%s'; interfaces that are "
		         "up: %s",
		         spec ? spec : "", seen_len ? seen : "(none)");
		freeifaddrs(ifs);
		return KHOR_ERR_INVALID_ARG;
	}
	memset(out, 0, sizeof(*out));
	out->len = best->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
	                                                : sizeof(struct sockaddr_in6);
	memcpy(&out->ss, best->ifa_addr, out->len);
	ksock_addr_set_port(out, 0);
	if (ifname_out != NULL)
		kstrlcpy(ifname_out, best->ifa_name, ifname_len);
	freeifaddrs(ifs);
	return KHOR_SUCCESS;
}

/* --- several addresses per rank ------------------------------------------------------- */

static int mask_bits(const struct sockaddr *mask)
{
	int len, bits = 0;
	const uint8_t *b;

	if (mask == NULL || (mask->sa_family != AF_INET && mask->sa_family != AF_INET6))
		return -1;
	b = addr_bytes(mask, &len);
	for (int i = 0; i < len; i++)
		for (int k = 7; k >= 0 && (b[i] >> k & 1); k--)
			bits++;
	return bits;
}

khor_status ksock_list_ifaces(ksock_iface *out, int max, int *n_out, kerr *err)
{
	struct ifaddrs *ifs;
	char eb[128];
	int n = 0;

	if (getifaddrs(&ifs) < 0)
		return kerr_set(err, KHOR_ERR_SYSTEM, "getifaddrs: %s",
		                kerr_errno_str(errno, eb, sizeof(eb)));
	for (struct ifaddrs *ifa = ifs; ifa != NULL && n < max; ifa = ifa->ifa_next) {
		int alen;
		if (ifa->ifa_addr == NULL ||
		    (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6) ||
		    !(ifa->ifa_flags & IFF_UP))
			continue;
		const uint8_t *ab = addr_bytes(ifa->ifa_addr, &alen);
		if (ifa->ifa_addr->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const void *)ab))
			continue;
		ksock_iface *f = &out[n++];
		memset(f, 0, sizeof(*f));
		kstrlcpy(f->name, ifa->ifa_name, sizeof(f->name));
		f->addr.len = ifa->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
		                                                  : sizeof(struct sockaddr_in6);
		memcpy(&f->addr.ss, ifa->ifa_addr, f->addr.len);
		ksock_addr_set_port(&f->addr, 0);
		f->prefix = mask_bits(ifa->ifa_netmask);
		f->loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0 || ksock_addr_is_loopback(&f->addr);
		f->running = (ifa->ifa_flags & IFF_RUNNING) != 0;
	}
	freeifaddrs(ifs);
	*n_out = n;
	return KHOR_SUCCESS;
}

bool ksock_is_virtual_ifname(const char *name)
{
	static const char *const virt[] = { "docker", "br-", "virbr", "lxcbr", "lxdbr", "veth",
		                            "cni", "flannel", "cali", "vxlan", "kube-", "podman" };

	for (size_t i = 0; i < sizeof(virt) / sizeof(virt[0]); i++)
		if (strncmp(name, virt[i], strlen(virt[i])) == 0)
			return true;
	return false;
}

bool ksock_same_subnet(const ksockaddr *a, const ksockaddr *b, int prefix)
{
	int la, lb;

	if (a->ss.ss_family != b->ss.ss_family ||
	    (a->ss.ss_family != AF_INET && a->ss.ss_family != AF_INET6) || prefix < 0)
		return false;
	const uint8_t *pa = addr_bytes((const struct sockaddr *)&a->ss, &la);
	const uint8_t *pb = addr_bytes((const struct sockaddr *)&b->ss, &lb);
	if (prefix > la * 8)
		prefix = la * 8;
	return prefix_match(pa, pb, prefix);
}

bool ksock_same_ip(const ksockaddr *a, const ksockaddr *b)
{
	return ksock_same_subnet(a, b, a->ss.ss_family == AF_INET6 ? 128 : 32);
}

const char *ksock_subnet_str(const ksockaddr *a, int prefix, char *buf, size_t len)
{
	uint8_t net[16] = { 0 };
	char ip[INET6_ADDRSTRLEN] = "?";
	int al;

	if (a->ss.ss_family != AF_INET && a->ss.ss_family != AF_INET6) {
		snprintf(buf, len, "(family %d)", a->ss.ss_family);
		return buf;
	}
	const uint8_t *ab = addr_bytes((const struct sockaddr *)&a->ss, &al);
	if (prefix < 0 || prefix > al * 8)
		prefix = al * 8;
	for (int i = 0; i < al; i++) {
		int keep = prefix - i * 8;
		net[i] = keep >= 8 ? ab[i] : keep <= 0 ? 0 : (uint8_t)(ab[i] & (0xff << (8 - keep)));
	}
	inet_ntop(a->ss.ss_family, net, ip, sizeof(ip));
	snprintf(buf, len, "%s/%d", ip, prefix);
	return buf;
}

/* Appends ifs[i] to idx_out unless its address is there already. */
static int add_unique(const ksock_iface *ifs, int i, int *idx_out, int n, int max)
{
	for (int k = 0; k < n; k++)
		if (ksock_same_ip(&ifs[idx_out[k]].addr, &ifs[i].addr))
			return n;
	if (n < max)
		idx_out[n++] = i;
	return n;
}

static int order_family(const ksock_iface *ifs, int n, const ksockaddr *hint, int family,
                        int *idx_out, int max)
{
	int k = 0;

	if (hint != NULL && ksock_addr_is_loopback(hint)) {
		for (int i = 0; i < n && k == 0; i++)
			if (ifs[i].loopback && ifs[i].addr.ss.ss_family == family)
				k = add_unique(ifs, i, idx_out, k, max);
		return k;
	}
	if (hint != NULL)
		for (int i = 0; i < n; i++)
			if (!ifs[i].loopback && ifs[i].addr.ss.ss_family == family &&
			    ksock_same_subnet(&ifs[i].addr, hint, ifs[i].prefix))
				k = add_unique(ifs, i, idx_out, k, max);
	for (int i = 0; i < n; i++)
		if (!ifs[i].loopback && ifs[i].addr.ss.ss_family == family && ifs[i].running &&
		    !ksock_is_virtual_ifname(ifs[i].name))
			k = add_unique(ifs, i, idx_out, k, max);
	for (int i = 0; i < n && k == 0; i++)
		if (!ifs[i].loopback && ifs[i].addr.ss.ss_family == family)
			k = add_unique(ifs, i, idx_out, k, max);
	for (int i = 0; i < n && k == 0; i++)
		if (ifs[i].loopback && ifs[i].addr.ss.ss_family == family)
			k = add_unique(ifs, i, idx_out, k, max);
	return k;
}

int ksock_order_candidates(const ksock_iface *ifs, int n, const ksockaddr *hint, int *idx_out,
                           int max)
{
	int family = hint != NULL ? hint->ss.ss_family : AF_INET;
	int k = order_family(ifs, n, hint, family, idx_out, max);

	/* A store of the other family (a v6 store on a v4 host and so on): any address beats
	 * none, and the connector's own checks decide what is reachable. */
	if (k == 0)
		k = order_family(ifs, n, NULL, family == AF_INET ? AF_INET6 : AF_INET, idx_out, max);
	return k;
}

bool ksock_store_is_local_only(const char *host, const ksockaddr *addr)
{
	uint8_t buf[16];

	if (!ksock_addr_is_loopback(addr))
		return false;
	return strcmp(host, "localhost") == 0 || inet_pton(AF_INET, host, buf) == 1 ||
	       inet_pton(AF_INET6, host, buf) == 1;
}

khor_status ksock_pick_candidates(const char *spec, const ksockaddr *hint, ksock_iface *out,
                                  int max, int *n_out, kerr *err)
{
	ksock_iface *ifs;
	int nifs = 0, idx[KSOCK_MAX_CANDS], k;
	khor_status st;

	if (spec != NULL && *spec != '\0') {
		memset(&out[0], 0, sizeof(out[0]));
		st = ksock_pick_address(spec, hint, &out[0].addr, out[0].name, sizeof(out[0].name),
		                        err);
		if (st != KHOR_SUCCESS)
			return st;
		out[0].prefix = -1;
		out[0].loopback = ksock_addr_is_loopback(&out[0].addr);
		*n_out = 1;
		return KHOR_SUCCESS;
	}
	ifs = malloc(KSOCK_MAX_IFACES * sizeof(*ifs));
	if (ifs == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory listing interfaces");
	st = ksock_list_ifaces(ifs, KSOCK_MAX_IFACES, &nifs, err);
	if (st != KHOR_SUCCESS) {
		free(ifs);
		return st;
	}
	k = ksock_order_candidates(ifs, nifs, hint, idx, max < KSOCK_MAX_CANDS ? max
	                                                                      : KSOCK_MAX_CANDS);
	for (int i = 0; i < k; i++)
		out[i] = ifs[idx[i]];
	free(ifs);
	if (k == 0) {
		/* No usable address at all: ksock_pick_address writes the sentence that lists
		 * what exists. */
		memset(&out[0], 0, sizeof(out[0]));
		st = ksock_pick_address(NULL, hint, &out[0].addr, out[0].name, sizeof(out[0].name),
		                        err);
		if (st != KHOR_SUCCESS)
			return st;
		out[0].prefix = -1;
		k = 1;
	}
	*n_out = k;
	return KHOR_SUCCESS;
}

int ksock_parse_addr_list(const char *s, ksockaddr *out, int max)
{
	int n = 0;

	if (s == NULL || *s == '\0')
		return -1;
	for (;;) {
		char item[128], host[256];
		uint16_t port;
		size_t len = strcspn(s, ",");
		ksockaddr a;

		if (len == 0 || len >= sizeof(item))
			return -1;
		memcpy(item, s, len);
		item[len] = '\0';
		if (!ksock_split_hostport(item, host, sizeof(host), &port) || port == 0)
			return -1;
		memset(&a, 0, sizeof(a));
		struct sockaddr_in *in = (struct sockaddr_in *)&a.ss;
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a.ss;
		if (item[0] != '[' && inet_pton(AF_INET, host, &in->sin_addr) == 1) {
			in->sin_family = AF_INET;
			a.len = sizeof(*in);
		} else if (item[0] == '[' && inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
			in6->sin6_family = AF_INET6;
			a.len = sizeof(*in6);
		} else {
			return -1;
		}
		ksock_addr_set_port(&a, port);
		if (n < max)
			out[n++] = a;
		s += len;
		if (*s == '\0')
			return n;
		s++;
	}
}

void ksock_order_peer(const ksockaddr *peer, int n, const ksock_iface *mine, int nmine,
                      int *order_out, enum ksock_reach *kind_out, int *via_out)
{
	enum ksock_reach kind[KSOCK_MAX_CANDS];
	int via[KSOCK_MAX_CANDS], k = 0;
	bool all_own = n > 0;

	if (n > KSOCK_MAX_CANDS)
		n = KSOCK_MAX_CANDS;
	for (int i = 0; i < n; i++) {
		bool own = false;
		via[i] = -1;
		for (int j = 0; j < nmine; j++) {
			if (ksock_same_ip(&peer[i], &mine[j].addr)) {
				own = true;
				via[i] = j;
				break;
			}
		}
		all_own = all_own && own;
		kind[i] = own ? KSOCK_REACH_OWN : KSOCK_REACH_ROUTED;
		/* The narrowest of our subnets that holds it says most about the path. */
		for (int j = 0; j < nmine && !own; j++) {
			if (ksock_same_subnet(&peer[i], &mine[j].addr, mine[j].prefix) &&
			    (via[i] < 0 || mine[j].prefix > mine[via[i]].prefix)) {
				kind[i] = KSOCK_REACH_SUBNET;
				via[i] = j;
			}
		}
	}
	if (all_own)
		for (int i = 0; i < n; i++)
			kind[i] = KSOCK_REACH_LOCAL;
	for (int want = KSOCK_REACH_LOCAL; want <= KSOCK_REACH_OWN; want++) {
		for (int i = 0; i < n; i++) {
			if ((int)kind[i] != want)
				continue;
			order_out[k] = i;
			kind_out[k] = kind[i];
			via_out[k] = via[i];
			k++;
		}
	}
}
