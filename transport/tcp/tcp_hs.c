/*
 * tcp_hs.c -- the handshake every TCP socket runs before it carries frames: the shared one
 * of handshake.h (HELLO, CHALLENGE, PROOF, RESULT), non-blocking, over the stream. The
 * HELLO's aux words name the socket's index and the link's socket count, which the
 * acceptor checks itself; a stranger is refused and logged, and the listener goes on.
 */
#include "tcp_int.h"

#include "base/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void tcp_hs_expect(struct tsock *s, uint32_t n)
{
	s->hs_in_need = n;
	s->hs_in_got = 0;
}

static void hs_queue(struct tsock *s, const void *p, uint32_t n)
{
	memcpy(s->hs_out, p, n);
	s->hs_out_len = n;
	s->hs_out_off = 0;
}

static void link_sock_ready(tp_link *l, struct tsock *s)
{
	s->state = SS_DATA;
	s->rd_ready = true;
	s->wr_ready = true;
	l->nready++;
	if (l->nready == l->nsocks)
		KLOG_DEBUG("link to rank %d (%s) ready with %d socket(s)", l->peer, l->peer_addr,
		           l->nsocks);
}

/* Best effort: a refused peer hears why (or a connector's failed proof is seen), then goes. */
static void hs_send_last(struct tsock *s, const void *msg, size_t len)
{
	if (send(s->fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		/* nothing more to do for a refused peer */
	}
}

/* Acceptor got a complete HELLO: check it (handshake.h, then our aux words). */
static void hs_acc_hello(struct tsock *s)
{
	tp_ctx *ctx = s->ctx;
	hs_hello *h = &s->hello;
	hs_challenge c;
	uint32_t status;

	memcpy(h, s->hs_in, sizeof(*h));
	status = hs_hello_check(&ctx->hs, h);
	if (status == HS_NOT_KHOR) {
		KLOG_WARN("refused connection from %s: bad magic 0x%08x (not a khor peer)",
		          s->peer_str, h->magic);
		tcp_sock_close_fd(s);
		return;
	}
	if (status == HS_OK &&
	    (h->aux[TCP_AUX_NSOCKS] < 1 || h->aux[TCP_AUX_NSOCKS] > TCP_MAX_SOCKS ||
	     h->aux[TCP_AUX_SOCK_IDX] >= h->aux[TCP_AUX_NSOCKS]))
		status = HS_BAD_PARAMS;
	if (status != HS_OK) {
		KLOG_WARN("refused connection from %s (claims rank %d of job '%s', protocol %u): %s",
		          s->peer_str, h->from_rank, h->job_id, h->version,
		          status == HS_BAD_PARAMS ? "impossible socket index or count"
		                                  : hs_status_str(status));
		hs_refusal(status, &c);
		hs_send_last(s, &c, sizeof(c));
		tcp_sock_close_fd(s);
		return;
	}
	hs_challenge_make(&ctx->hs, h, 0, s->nonce_s, &c);
	hs_queue(s, &c, sizeof(c));
	tcp_hs_expect(s, sizeof(hs_proof));
	s->hs_phase = 1;
}

/* Acceptor got the PROOF: check it and attach the socket to the peer's link. */
static void hs_acc_proof(struct tsock *s)
{
	tp_ctx *ctx = s->ctx;
	hs_hello *h = &s->hello;
	int nsocks = (int)h->aux[TCP_AUX_NSOCKS], idx = (int)h->aux[TCP_AUX_SOCK_IDX];
	hs_proof p;
	hs_result r;
	tp_link *l;

	memcpy(&p, s->hs_in, sizeof(p));
	if (!hs_proof_check(&ctx->hs, h, s->nonce_s, &p)) {
		KLOG_WARN("refused connection from %s (claims rank %d of job '%s'): it failed the "
		          "job secret check (a stranger, or its KHOR_SECRET differs)",
		          s->peer_str, h->from_rank, h->job_id);
		hs_result_make(HS_BAD_AUTH, 0, &r);
		hs_send_last(s, &r, sizeof(r));
		tcp_sock_close_fd(s);
		return;
	}
	l = ctx->incoming[h->from_rank];
	if (l == NULL) {
		l = calloc(1, sizeof(*l));
		if (l == NULL) {
			tcp_sock_close_fd(s);
			return;
		}
		l->ctx = ctx;
		l->peer = h->from_rank;
		l->nsocks = nsocks;
		kstrlcpy(l->peer_addr, s->peer_str, sizeof(l->peer_addr));
		ctx->incoming[h->from_rank] = l;
	}
	if (nsocks != l->nsocks || l->socks[idx] != NULL) {
		KLOG_WARN("refused connection from %s (rank %d, socket %d): duplicate or "
		          "inconsistent socket count", s->peer_str, h->from_rank, idx);
		hs_result_make(HS_DUPLICATE, 0, &r);
		hs_send_last(s, &r, sizeof(r));
		tcp_sock_close_fd(s);
		return;
	}
	s->link = l;
	s->idx = idx;
	l->socks[s->idx] = s;
	hs_result_make(HS_OK, 0, &r);
	hs_queue(s, &r, sizeof(r));
	s->hs_phase = 2; /* finish sending RESULT, then data */
	tcp_hs_expect(s, 0);
}

static void hs_conn_challenge(struct tsock *s)
{
	hs_challenge c;
	hs_proof p;
	kerr e;
	khor_status st;

	memcpy(&c, s->hs_in, sizeof(c));
	st = hs_challenge_check(&s->ctx->hs, &s->hello, &c, 0, &p, &e);
	if (st != KHOR_SUCCESS) {
		/* An acceptor that failed to prove the secret gets a proof that cannot pass, so
		 * that it logs a secret mismatch rather than a connection that went away. */
		if (c.magic == HS_MAGIC && c.status == HS_OK)
			hs_send_last(s, &p, sizeof(p));
		tcp_sock_fail(s, st, "%s", e.text);
		return;
	}
	hs_queue(s, &p, sizeof(p));
	tcp_hs_expect(s, sizeof(hs_result));
	s->hs_phase = 1;
}

static void hs_conn_result(struct tsock *s)
{
	hs_result r;
	kerr e;
	khor_status st;

	memcpy(&r, s->hs_in, sizeof(r));
	st = hs_result_check(&r, &e);
	if (st != KHOR_SUCCESS) {
		tcp_sock_fail(s, st, "%s", e.text);
		return;
	}
	link_sock_ready(s->link, s);
}

/* Moves handshake bytes; returns true if the socket changed state or moved bytes. */
bool tcp_hs_drive(struct tsock *s)
{
	bool moved = false;

	if (s->state == SS_CONNECTING) {
		int e = 0;
		socklen_t sl = sizeof(e);
		if (!s->wr_ready)
			return false;
		getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &e, &sl);
		if (e == EINPROGRESS || e == EALREADY)
			return false;
		if (e == 0 && !tcp_sock_connected(s)) {
			s->wr_ready = false; /* still connecting */
			return false;
		}
		if (e != 0) {
			if (s->link->dial != NULL && !s->link->dial->chosen)
				tcp_dial_next(s->link, tcp_errstr(e), false);
			else
				tcp_sock_fail(s, KHOR_ERR_REMOTE, "connect: %s", tcp_errstr(e));
			return true;
		}
		if (s->link->dial != NULL && !s->link->dial->chosen)
			tcp_dial_chosen(s->link);
		s->state = SS_HS_CONN;
		hs_queue(s, &s->hello, sizeof(s->hello));
		tcp_hs_expect(s, sizeof(hs_challenge));
		s->hs_phase = 0;
		moved = true;
	}
	for (;;) {
		if (s->state != SS_HS_CONN && s->state != SS_HS_ACC)
			return moved;
		if (s->hs_out_off < s->hs_out_len) {
			ssize_t n = send(s->fd, s->hs_out + s->hs_out_off, s->hs_out_len - s->hs_out_off,
			                 MSG_NOSIGNAL);
			if (n < 0) {
				if (errno == EAGAIN || errno == EINTR) {
					s->wr_ready = errno == EINTR;
					return moved;
				}
				if (s->state == SS_HS_ACC && s->link == NULL) {
					KLOG_WARN("dropped connection from %s during handshake: %s",
					          s->peer_str, tcp_errstr(errno));
					tcp_sock_close_fd(s);
				} else {
					tcp_sock_fail(s, KHOR_ERR_REMOTE, "handshake send: %s",
					              tcp_errstr(errno));
				}
				return true;
			}
			s->hs_out_off += (uint32_t)n;
			moved = true;
			continue;
		}
		if (s->state == SS_HS_ACC && s->hs_phase == 2) {
			link_sock_ready(s->link, s);
			return true;
		}
		if (s->hs_in_got < s->hs_in_need) {
			ssize_t n = recv(s->fd, s->hs_in + s->hs_in_got, s->hs_in_need - s->hs_in_got, 0);
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
				const char *why = n == 0 ? "connection closed" : tcp_errstr(errno);
				if (s->state == SS_HS_ACC && s->link == NULL) {
					KLOG_WARN("dropped connection from %s during handshake: %s",
					          s->peer_str, why);
					tcp_sock_close_fd(s);
				} else {
					tcp_sock_fail(s, KHOR_ERR_REMOTE, "handshake: %s", why);
				}
				return true;
			}
			if (n < 0) {
				s->rd_ready = errno == EINTR;
				return moved;
			}
			s->hs_in_got += (uint32_t)n;
			moved = true;
			if (s->hs_in_got < s->hs_in_need)
				continue;
		}
		if (s->state == SS_HS_ACC)
			s->hs_phase == 0 ? hs_acc_hello(s) : hs_acc_proof(s);
		else
			s->hs_phase == 0 ? hs_conn_challenge(s) : hs_conn_result(s);
		moved = true;
	}
}
