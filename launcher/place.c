/*
 * place.c -- which of the hosts is this one, and which ranks run where: block placement,
 * host by host, with local and cross ranks as Horovod defines them. Also the address of this
 * host on the route to another, which the store listens on when ranks run elsewhere.
 */
#include "hosts.h"

#include "base/err.h"
#include "cli.h"
#include "say.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static bool addr_is_local(const struct sockaddr *sa, const struct ifaddrs *ifs)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa;

		if ((ntohl(a->sin_addr.s_addr) >> 24) == 127)
			return true;
		for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
			if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
			    ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr ==
			            a->sin_addr.s_addr)
				return true;
		}
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)sa;

		if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
			return true;
		for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
			if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET6 &&
			    memcmp(&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr,
			           &a->sin6_addr, sizeof(a->sin6_addr)) == 0)
				return true;
		}
	}
	return false;
}

/*
 * Is `name` this host? localhost, this host's name (with or without its domain) or a name
 * or address that resolves to one of this host's addresses.
 */
static bool is_local_host(const char *name, const char *self, const struct ifaddrs *ifs)
{
	size_t sl = strcspn(self, "."), nl = strcspn(name, ".");
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res, *ai;
	bool local = false;

	if (strcmp(name, "localhost") == 0 || strncmp(name, "localhost.", 10) == 0 ||
	    strcmp(name, "ip6-localhost") == 0 || strcmp(name, self) == 0)
		return true;
	/* "node1" and "node1.cluster" are one host when either is given without a domain. */
	if ((self[sl] == '\0' || name[nl] == '\0') && sl == nl && strncmp(name, self, sl) == 0)
		return true;
	if (getaddrinfo(name, NULL, &hints, &res) != 0)
		return false;
	for (ai = res; ai != NULL && !local; ai = ai->ai_next)
		local = addr_is_local(ai->ai_addr, ifs);
	freeaddrinfo(res);
	return local;
}

bool place_gather_hosts(const struct opts *o, struct hostlist *l, bool *from_slurm_out)
{
	bool bad = false;

	*from_slurm_out = false;
	if (o->nhost_args > 0) {
		for (int i = 0; i < o->nhost_args; i++) {
			if (!hostlist_parse_arg(o->host_args[i], l))
				return false;
		}
	} else if (o->hostfile != NULL) {
		if (!hostlist_parse_file(o->hostfile, l))
			return false;
	} else {
		*from_slurm_out = slurm_hosts(l, &bad);
	}
	return !bad;
}

bool place_host_is_here(const char *name)
{
	struct ifaddrs *ifs = NULL;
	char self[256] = "";
	bool here;

	(void)gethostname(self, sizeof(self) - 1);
	if (getifaddrs(&ifs) != 0)
		ifs = NULL;
	here = is_local_host(name, self, ifs);
	if (ifs != NULL)
		freeifaddrs(ifs);
	return here;
}

int place_ranks(struct job *j)
{
	struct hostlist l = { 0 };
	struct ifaddrs *ifs = NULL;
	char self[256] = "";
	long long total = 0;
	int left, local_at = -1, nh = 0;
	int *seen = NULL, *count = NULL;
	bool from_slurm = false;

	if (!place_gather_hosts(&j->o, &l, &from_slurm))
		goto fail_usage;
	if (l.n == 0) {
		/* No hosts: -np ranks here, as always. */
		if (j->o.np == 0) {
			hostlist_free(&l);
			return cli_bad_usage("-np N is required");
		}
		if (!hostlist_add(&l, "localhost", 9, j->o.np))
			goto fail;
		l.h[0].local = true;
	} else {
		(void)gethostname(self, sizeof(self) - 1);
		if (getifaddrs(&ifs) != 0)
			ifs = NULL;
		for (int i = 0; i < l.n; i++) {
			if (!is_local_host(l.h[i].name, self, ifs))
				continue;
			if (local_at < 0) {
				local_at = i;
				l.h[i].local = true;
			} else {
				/* Another name of this host: its slots join the first one's. */
				l.h[local_at].slots = l.h[local_at].slots + l.h[i].slots > MAX_RANKS
				                              ? MAX_RANKS
				                              : l.h[local_at].slots + l.h[i].slots;
				l.h[i].slots = 0;
			}
		}
		if (ifs != NULL)
			freeifaddrs(ifs);
	}
	for (int i = 0; i < l.n; i++)
		total += l.h[i].slots;
	if (j->o.np == 0)
		j->o.np = total > MAX_RANKS ? MAX_RANKS : (int)total;
	if (j->o.np > total) {
		char list[512];
		size_t off = 0;
		int shown = 0;

		list[0] = '\0';
		for (int i = 0; i < l.n && off < sizeof(list); i++) {
			if (l.h[i].slots == 0)
				continue;
			if (shown++ == 8) {
				snprintf(list + off, sizeof(list) - off, ", ...");
				break;
			}
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s:%d",
			                        shown > 1 ? ", " : "", l.h[i].name, l.h[i].slots);
		}
		say("-np %d but the hosts give %lld slot%s: %s%s", j->o.np, total, total == 1 ? "" : "s",
		    list, from_slurm ? " (from the Slurm allocation; -H localhost:N runs here only)"
		                     : "");
		hostlist_free(&l);
		return 2;
	}

	/* Block placement: fill each host's slots in turn; hosts left without ranks drop out. */
	j->ranks = calloc((size_t)j->o.np, sizeof(*j->ranks));
	j->hosts = calloc((size_t)l.n, sizeof(*j->hosts));
	seen = calloc((size_t)j->o.np, sizeof(int));
	count = calloc((size_t)j->o.np, sizeof(int));
	if (j->ranks == NULL || j->hosts == NULL || seen == NULL || count == NULL) {
		say("out of memory placing %d ranks", j->o.np);
		goto fail;
	}
	left = j->o.np;
	for (int i = 0; i < l.n && left > 0; i++) {
		struct host *h = &j->hosts[nh];
		int n = l.h[i].slots < left ? l.h[i].slots : left;

		if (n == 0)
			continue;
		*h = l.h[i];
		l.h[i].name = NULL; /* now the job's */
		h->first = j->o.np - left;
		h->n = n;
		h->ssh_pid = -1;
		h->to_fd = h->from_fd = h->err_fd = -1;
		for (int k = 0; k < n; k++)
			count[k]++;
		left -= n;
		nh++;
	}
	j->nhosts = nh;
	j->multi = nh > 1;
	/*
	 * Cross rank: among the ranks with the same local rank k, the order of their hosts;
	 * cross size: how many hosts have a local rank k (Horovod's definition, which holds
	 * for uneven hosts too).
	 */
	for (int hi = 0; hi < nh; hi++) {
		struct host *h = &j->hosts[hi];

		for (int k = 0; k < h->n; k++) {
			struct rank *rk = &j->ranks[h->first + k];

			rk->host = hi;
			rk->lrank = k;
			rk->lsize = h->n;
			rk->xrank = seen[k]++;
			rk->xsize = count[k];
		}
		if (!h->local)
			j->nremote++;
	}
	free(seen);
	free(count);
	hostlist_free(&l);
	return -1;

fail_usage:
	hostlist_free(&l);
	return 2;
fail:
	free(seen);
	free(count);
	hostlist_free(&l);
	return 1;
}

/*
 * The address of this host that `host` reaches it by: the source address of the route to
 * it, which connect() on a UDP socket picks without sending anything (what `ip route get`
 * prints). Returns false with the reason in why.
 */
bool place_route_source(const char *host, char *out, size_t len, char *why, size_t wlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM };
	struct addrinfo *res, *ai;
	char ebuf[128];
	int rc = getaddrinfo(host, "9", &hints, &res);

	if (rc != 0) {
		snprintf(why, wlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
		return false;
	}
	snprintf(why, wlen, "no address of '%s' can be routed to", host);
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			continue;
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
		    getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
			snprintf(why, wlen, "no route to '%s': %s", host,
			         kerr_errno_str(errno, ebuf, sizeof(ebuf)));
			close(fd);
			continue;
		}
		close(fd);
		if (getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)len, NULL, 0,
		                NI_NUMERICHOST) == 0) {
			char *pct = strchr(out, '%'); /* a link-local scope is not for others */

			if (pct != NULL)
				*pct = '\0';
			freeaddrinfo(res);
			return true;
		}
	}
	freeaddrinfo(res);
	return false;
}

/* "4-7" or "4" */
void place_rank_range(const struct host *h, char *buf, size_t len)
{
	if (h->n == 1)
		snprintf(buf, len, "rank %d", h->first);
	else
		snprintf(buf, len, "ranks %d-%d", h->first, h->first + h->n - 1);
}
