/*
 * tcp_dial.c -- finding a peer's address. A peer publishes every address it listens on;
 * the connector dials them in its own order (those on one of its subnets first), all the
 * link's sockets at once, one address at a time, until one connects or all failed (tcp.c's
 * top comment, "Addresses", says why). Errors name every address tried and why it failed.
 */
#include "tcp_int.h"

#include "base/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* Starts a non-blocking connect to a; 0, or the errno of a failure seen at once. */
static int dial_fd(tp_ctx *ctx, const ksockaddr *a, int *fd_out)
{
	int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	if (fd < 0)
		return errno;
	ksock_tune_stream(fd, ctx->bufsize);
	if (connect(fd, (const struct sockaddr *)&a->ss, a->len) < 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		return e;
	}
	*fd_out = fd;
	return 0;
}

static void dial_unlist(tp_link *l)
{
	klist_del(&l->dial->node);
}

/* Every address failed: the link's error names each one and why. */
static void dial_give_up(tp_link *l)
{
	struct tcp_dial *d = l->dial;
	char list[KERR_TEXT_MAX];
	size_t off = 0;

	for (int i = 0; i < d->n && off < sizeof(list); i++)
		off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s (%s): %s",
		                        i ? "; " : "", d->str[i], d->why[i],
		                        d->fail[i][0] ? d->fail[i] : "not tried before the deadline");
	dial_unlist(l);
	tcp_link_fail(l, KHOR_ERR_REMOTE,
	              "no address of rank %d answered after %d attempt(s) each: "
	              "%s. %s",
	              l->peer, d->round + 1, list,
	              l->ctx->spec_set
	                  ? "KHOR_SOCKET_IFNAME chose these addresses on every host: do "
	                    "the hosts share that network? Unset it to let khor choose, "
	                    "or name another interface or CIDR"
	                  : "Do the hosts share a network? KHOR_SOCKET_IFNAME, an "
	                    "interface name or a CIDR such as 198.19.10.0/24, names the "
	                    "one to use");
	for (int k = 0; k < l->nsocks; k++)
		if (l->socks[k] != NULL)
			tcp_sock_close_fd(l->socks[k]);
}

/*
 * Points every socket of the link at addr[cur]; 0, or the errno of a failure seen at once
 * (then the caller moves on). The sockets keep their objects, and so the requests already
 * queued on them; only the fd is new.
 */
int tcp_dial_start(tp_link *l)
{
	struct tcp_dial *d = l->dial;
	tp_ctx *ctx = l->ctx;
	int64_t ms = (int64_t)TCP_ATTEMPT_MS << (d->round < 8 ? d->round : 8);

	for (int k = 0; k < l->nsocks; k++) {
		struct tsock *s = l->socks[k];
		int fd = -1, e;
		if (s->fd >= 0) {
			epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, s->fd, NULL);
			close(s->fd);
			s->fd = -1;
		}
		s->state = SS_DEAD;
		if ((e = dial_fd(ctx, &d->addr[d->cur], &fd)) != 0)
			return e;
		if (!tcp_sock_attach(s, fd, SS_CONNECTING)) {
			e = errno;
			close(fd);
			return e;
		}
		kstrlcpy(s->peer_str, d->str[d->cur], sizeof(s->peer_str));
	}
	/* One address: all the handshake's time is its own, as before. */
	if (d->n == 1 || kdeadline_left_ms(d->deadline, INT32_MAX) < ms)
		d->attempt_dl = d->deadline;
	else
		d->attempt_dl = kdeadline_in_ms(ms);
	return 0;
}

/* The attempt on addr[cur] failed (why; timed_out: it did not answer): on to the next. */
void tcp_dial_next(tp_link *l, const char *why, bool timed_out)
{
	struct tcp_dial *d = l->dial;
	char buf[96];

	for (;;) {
		kstrlcpy(d->fail[d->cur], why, sizeof(d->fail[d->cur]));
		KLOG_DEBUG("tcp: rank %d at %s: %s", l->peer, d->str[d->cur], why);
		d->soft |= timed_out;
		if (++d->cur == d->n) {
			/* Only a pass with a silent address is worth repeating: a refusal or a missing
			 * route does not change within a job's start. */
			if (!d->soft || kdeadline_passed(d->deadline)) {
				d->cur = d->n - 1;
				dial_give_up(l);
				return;
			}
			d->round++;
			d->cur = 0;
			d->soft = false;
		}
		int e = tcp_dial_start(l);
		if (e == 0)
			return;
		why = kerr_errno_str(e, buf, sizeof(buf));
		timed_out = false;
	}
}

/* A socket connected to addr[cur]: that is the link's address from now on. */
void tcp_dial_chosen(tp_link *l)
{
	struct tcp_dial *d = l->dial;

	d->chosen = true;
	kstrlcpy(l->peer_addr, d->str[d->cur], sizeof(l->peer_addr));
	dial_unlist(l);
}

/* Whether a connecting socket has really connected (a stale epoll event of the socket's
 * earlier fd may say it is writable). */
bool tcp_sock_connected(const struct tsock *s)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	return getpeername(s->fd, (struct sockaddr *)&ss, &sl) == 0;
}

/* Gives the address being tried its time: when it is up, the next one gets its turn. */
void tcp_dial_tick(tp_ctx *ctx)
{
	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, &ctx->dialing) {
		struct tcp_dial *d = KLIST_ENTRY(n, struct tcp_dial, node);
		tp_link *l = d->link;
		char why[96];
		if (!kdeadline_passed(d->attempt_dl))
			continue;
		bool up = false;
		for (int k = 0; k < l->nsocks && !up; k++)
			if (l->socks[k]->state == SS_CONNECTING &&
			    tcp_sock_connected(l->socks[k])) {
				l->socks[k]->wr_ready = true; /* hs_drive takes it from here */
				up = true;
			}
		if (up)
			continue;
		snprintf(why, sizeof(why), "no answer within %lld ms",
		         (long long)((int64_t)TCP_ATTEMPT_MS << (d->round < 8 ? d->round : 8)));
		if (d->n == 1 || kdeadline_passed(d->deadline))
			snprintf(why, sizeof(why), "no answer within %lld ms (the handshake timeout)",
			         (long long)ctx->hs_timeout_ms);
		tcp_dial_next(l, why, true);
	}
}

/* "198.19.10.1" of an address, without its port. */
static const char *ip_str(const ksockaddr *a, char *buf, size_t len)
{
	char sub[64];

	ksock_subnet_str(a, -1, sub, sizeof(sub)); /* the whole address: "ip/32" */
	sub[strcspn(sub, "/")] = '\0';
	kstrlcpy(buf, sub, len);
	return buf;
}

/* The peer's addresses, in the order to dial them, each with why it is there. */
khor_status tcp_dial_plan(tp_ctx *ctx, int peer, const char *peer_addr, struct tcp_dial *d,
                          kerr *err)
{
	ksockaddr got[KSOCK_MAX_CANDS];
	int order[KSOCK_MAX_CANDS], via[KSOCK_MAX_CANDS];
	enum ksock_reach kind[KSOCK_MAX_CANDS];
	int n = ksock_parse_addr_list(peer_addr, got, KSOCK_MAX_CANDS);

	if (n < 0) {
		/* Not a list of numeric addresses: one "host:port" (a caller's own blob). */
		char host[256];
		uint16_t port;
		if (!ksock_split_hostport(peer_addr, host, sizeof(host), &port))
			return kerr_set(err, KHOR_ERR_PROTOCOL,
			                "peer rank %d published a malformed address '%.64s'", peer,
			                peer_addr);
		khor_status st = ksock_resolve(host, port, &got[0], err);
		if (st != KHOR_SUCCESS)
			return st;
		n = 1;
	}
	ksock_order_peer(got, n, ctx->mine, ctx->nmine, order, kind, via);
	d->n = n;
	for (int i = 0; i < n; i++) {
		char ip[64];
		const ksock_iface *m = via[i] >= 0 ? &ctx->mine[via[i]] : NULL;
		d->addr[i] = got[order[i]];
		ksock_addr_str(&d->addr[i], d->str[i], sizeof(d->str[i]));
		switch (kind[i]) {
		case KSOCK_REACH_LOCAL:
			snprintf(d->why[i], sizeof(d->why[i]), "an address of this host");
			break;
		case KSOCK_REACH_SUBNET:
			snprintf(d->why[i], sizeof(d->why[i]), "same subnet as %s/%d on %s",
			         ip_str(&m->addr, ip, sizeof(ip)), m->prefix, m->name);
			break;
		case KSOCK_REACH_ROUTED:
			snprintf(d->why[i], sizeof(d->why[i]), "on none of this host's subnets");
			break;
		case KSOCK_REACH_OWN:
			snprintf(d->why[i], sizeof(d->why[i]), "also this host's own address on %s, "
			         "tried last", m != NULL ? m->name : "?");
			break;
		}
	}
	return KHOR_SUCCESS;
}
