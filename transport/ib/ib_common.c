/*
 * ib_common.c -- what every phase of the verbs transport calls and which calls none of
 * them back: requests (made, finished, released, taken off their list) and the failure of
 * a link, which stops its QPs, tells the peer why, and fails every request on it.
 */
#include "ib_int.h"

#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

const char *ib_errstr(int e)
{
	static __thread char buf[256];
	return kerr_errno_str(e, buf, sizeof(buf));
}

/* ---- requests ------------------------------------------------------------------------ */

tp_req *ib_req_new(tp_link *l)
{
	tp_req *r = tp_skel_req_get(&l->ctx->sk, sizeof(*r));

	if (r == NULL)
		return NULL;
	memset(r, 0, sizeof(*r));
	klist_init(&r->node);
	r->link = l;
	l->pending++;
	return r;
}

void ib_req_release(tp_req *r)
{
	tp_ctx *ctx = r->link->ctx;

	if (r->own_mr != NULL)
		ctx->api->dereg_mr(r->own_mr);
	r->link->pending--;
	klist_del(&r->node);
	tp_skel_req_put(&ctx->sk, r);
}

void ib_req_finish(tp_req *r, khor_status st)
{
	if (r->done)
		return;
	r->done = true;
	r->st = st;
	tp_skel_completed(&r->link->ctx->sk);
	if (r->orphan && r->wr_out == 0)
		ib_req_release(r);
}

/* Takes r off the link's list that holds it; true if one did. */
bool ib_req_unlink(tp_req *r)
{
	bool was = klist_linked(&r->node);

	klist_del(&r->node);
	return was;
}

/* ---- failure ------------------------------------------------------------------------- */

/* Moves every QP to the error state: the HCA stops writing into our buffers and flushes
 * what is posted, so the requests can be released. */
static void qps_to_error(tp_link *l)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	for (int q = 0; q < l->nqp; q++)
		if (l->qps[q].qp != NULL)
			l->ctx->api->modify_qp(l->qps[q].qp, &a, IBV_QP_STATE);
}

/* Empties a list of the link; fails its requests with st unless st is KHOR_SUCCESS. */
static void fail_list(klist *list, khor_status st)
{
	klist *n, *next;

	KLIST_FOREACH_SAFE(n, next, list) {
		klist_del(n);
		if (st != KHOR_SUCCESS)
			ib_req_finish(IB_REQ(n), st);
	}
}

void ib_link_fail(tp_link *l, khor_status st, const char *fmt, ...)
{
	char what[KERR_TEXT_MAX], who[TP_ADDR_MAX + 64];
	va_list ap;

	if (l->err.status != KHOR_SUCCESS)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap); /* the peer is told these words, unprefixed */
	va_end(ap);
	if (l->peer >= 0)
		snprintf(who, sizeof(who), "ib link to peer rank %d (%s)", l->peer,
		         l->peer_addr[0] ? l->peer_addr : "address unknown");
	else
		snprintf(who, sizeof(who), "ib link from %s", l->peer_addr);
	tp_skel_fail(&l->err, st, who, "%s", what);
	bool was_ready = l->state == LS_READY;
	if ((l->state == LS_READY || l->state == LS_READY_WAIT) && l->fd >= 0 && !l->peer_failed) {
		struct ib_abort a = { .magic = HS_MAGIC, .status = (uint32_t)st };
		kstrlcpy(a.text, what, sizeof(a.text));
		if (send(l->fd, &a, sizeof(a), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
			/* the peer learns from the closed connection instead */
		}
		shutdown(l->fd, SHUT_WR);
	}
	l->state = LS_DEAD;
	if (was_ready)
		qps_to_error(l);
	/* Every request on the link fails now; those whose buffers the HCA may still touch
	 * stay allocated (orphans) until their work requests are flushed. */
	fail_list(&l->recvs, st);
	fail_list(&l->sends_eager, st);
	fail_list(&l->sends_rdv, st);
	fail_list(&l->ctl_q, KHOR_SUCCESS); /* failed below, through rdv[], where they all are */
	for (int i = 0; i < IB_RDV_MAX; i++)
		if (l->rdv[i] != NULL)
			ib_req_finish(l->rdv[i], st);
	memset(l->rdv, 0, sizeof(l->rdv));
	tp_skel_completed(&l->ctx->sk);
}
