/*
 * ib_p2p.c -- moving messages on a ready ib link: eager sends through registered slots,
 * credits, the receiver-driven rendezvous (CTS, then RDMA writes with immediates), the
 * matching of arrivals to posted receives, and the completions that drive it all
 * (ib.c's top comment has the protocol).
 */
#include "ib_int.h"

#include "base/log.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

/* ---- posting ------------------------------------------------------------------------- */

/* Receives may be (re)posted: from our RTR on, until the link fails. */
static inline bool live(const tp_link *l)
{
	return l->state == LS_READY || l->state == LS_READY_WAIT;
}

static inline bool credit_ok(const struct qp *q)
{
	return (int32_t)(q->peer_posted - q->tx_used) > 0;
}

static inline bool sq_ok(const struct qp *q)
{
	return q->sq_out < IB_SQ_DEPTH;
}

bool ib_post_recv_slot(tp_link *l, struct slot *s)
{
	struct ibv_sge sge = { (uint64_t)(uintptr_t)s->mem, IB_SLOT_BYTES, l->mem_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = WR_ID(s, WR_RSLOT), .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;
	int rc = ibv_post_recv(l->qps[0].qp, &wr, &bad);

	if (rc != 0) {
		ib_link_fail(l, KHOR_ERR_SYSTEM, "ibv_post_recv on QP 0: %s", ib_errstr(rc));
		return false;
	}
	l->qps[0].rx_posted++;
	return true;
}

bool ib_post_recv_imm(struct qp *q)
{
	struct ibv_recv_wr wr = { .wr_id = WR_ID(q, WR_RIMM), .sg_list = NULL, .num_sge = 0 };
	struct ibv_recv_wr *bad;
	int rc = ibv_post_recv(q->qp, &wr, &bad);

	if (rc != 0) {
		ib_link_fail(q->link, KHOR_ERR_SYSTEM, "ibv_post_recv on QP %d: %s", q->idx,
		             ib_errstr(rc));
		return false;
	}
	q->rx_posted++;
	return true;
}

static void hdr_credits(tp_link *l, struct msg_hdr *h)
{
	h->nqp = (uint32_t)l->nqp;
	for (int q = 0; q < l->nqp; q++) {
		h->posted[q] = l->qps[q].rx_posted;
		l->qps[q].rx_told = l->qps[q].rx_posted;
	}
}

static void take_credits(tp_link *l, const uint32_t *posted, uint32_t n)
{
	for (uint32_t q = 0; q < n && q < (uint32_t)l->nqp; q++)
		if ((int32_t)(posted[q] - l->qps[q].peer_posted) > 0)
			l->qps[q].peer_posted = posted[q];
}

/*
 * Sends a header (and len payload bytes from src) through a send slot on QP 0. False when
 * there is no slot, credit or room now (nothing done).
 */
static bool post_msg(tp_link *l, struct msg_hdr *h, const void *src, size_t len)
{
	struct qp *q = &l->qps[0];
	struct slot *s = l->sfree;

	if (s == NULL || !credit_ok(q) || !sq_ok(q))
		return false;
	l->sfree = s->next;
	hdr_credits(l, h);
	memcpy(s->mem, h, sizeof(*h));
	if (len > 0)
		memcpy(s->mem + IB_HDR_BYTES, src, len);
	struct ibv_sge sge = { (uint64_t)(uintptr_t)s->mem, (uint32_t)(IB_HDR_BYTES + len),
	                       l->mem_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = WR_ID(s, WR_SSLOT), .sg_list = &sge, .num_sge = 1,
	                          .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(q->qp, &wr, &bad);
	if (rc != 0) {
		s->next = l->sfree;
		l->sfree = s;
		ib_link_fail(l, KHOR_ERR_SYSTEM, "ibv_post_send on QP 0: %s", ib_errstr(rc));
		return false;
	}
	q->tx_used++;
	q->sq_out++;
	return true;
}

/* Our posted counts into the peer's credit words, when it has not heard of enough of them. */
static void maybe_write_credits(tp_link *l)
{
	struct qp *q0 = &l->qps[0];
	bool need = false;

	if (l->credit_busy || l->state != LS_READY || !sq_ok(q0))
		return;
	for (int q = 0; q < l->nqp; q++) {
		uint32_t unsaid = l->qps[q].rx_posted - l->qps[q].rx_told;
		uint32_t half = (q == 0 ? IB_SLOTS : IB_IMM_WQES) / 2;
		if (unsaid >= half)
			need = true;
	}
	if (!need)
		return;
	for (int q = 0; q < l->nqp; q++) {
		l->credit_out[q] = l->qps[q].rx_posted;
		l->qps[q].rx_told = l->qps[q].rx_posted;
	}
	struct ibv_sge sge = { (uint64_t)(uintptr_t)l->credit_out,
	                       (uint32_t)(sizeof(uint32_t) * (size_t)l->nqp), l->mem_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = WR_ID(l, WR_CREDIT), .sg_list = &sge, .num_sge = 1,
	                          .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = l->peer_info.credit_addr;
	wr.wr.rdma.rkey = l->peer_info.credit_rkey;
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(q0->qp, &wr, &bad);
	if (rc != 0) {
		ib_link_fail(l, KHOR_ERR_SYSTEM, "ibv_post_send (credits) on QP 0: %s",
		             ib_errstr(rc));
		return;
	}
	q0->sq_out++;
	l->credit_busy = true;
}

/* Parts of a large message: identical on both sides. */
static int rdv_parts(const tp_link *l, uint64_t len)
{
	uint64_t n = len / IB_MIN_STRIPE;

	if (n < 1)
		n = 1;
	if (n > (uint64_t)l->nqp)
		n = (uint64_t)l->nqp;
	return (int)n;
}

static void part_range(uint64_t len, int nparts, int i, uint64_t *off, uint64_t *plen)
{
	uint64_t per = (len / (uint64_t)nparts) & ~(uint64_t)63;

	*off = per * (uint64_t)i;
	*plen = i == nparts - 1 ? len - per * (uint64_t)(nparts - 1) : per;
}

/* Posts as many writes of an active rendezvous send as the QPs take. */
static void rdv_push(tp_link *l, tp_req *r)
{
	for (int p = 0; p < r->nparts; p++) {
		struct qp *q = &l->qps[p];
		uint64_t off, plen;

		part_range(r->len, r->nparts, p, &off, &plen);
		while (r->part_done[p] < plen) {
			uint64_t left = plen - r->part_done[p];
			uint64_t n = left < l->max_wr_bytes ? left : l->max_wr_bytes;
			bool last = n == left;
			if (!sq_ok(q) || (last && !credit_ok(q)))
				break;
			struct ibv_sge sge = { (uint64_t)(uintptr_t)(r->buf + off + r->part_done[p]),
			                       (uint32_t)n, r->lkey };
			struct ibv_send_wr wr = {
				.wr_id = WR_ID(r, WR_RDV), .sg_list = &sge, .num_sge = 1,
				.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED,
			};
			if (last)
				wr.imm_data = htonl(r->rdv_id);
			wr.wr.rdma.remote_addr = r->raddr + off + r->part_done[p];
			wr.wr.rdma.rkey = r->rrkey;
			struct ibv_send_wr *bad;
			int rc = ibv_post_send(q->qp, &wr, &bad);
			if (rc != 0) {
				ib_link_fail(l, KHOR_ERR_SYSTEM,
				             "ibv_post_send (RDMA write) on QP %d: %s", p,
				             ib_errstr(rc));
				return;
			}
			q->sq_out++;
			r->wr_out++;
			if (last)
				q->tx_used++;
			r->part_done[p] += n;
		}
	}
}

static bool rdv_fully_posted(const tp_req *r)
{
	for (int p = 0; p < r->nparts; p++) {
		uint64_t off, plen;
		part_range(r->len, r->nparts, p, &off, &plen);
		if (r->part_done[p] < plen)
			return false;
	}
	return true;
}

static void send_cts(tp_link *l, tp_req *r, bool *sent)
{
	struct msg_hdr h = {
		.kind = MSG_CTS, .comm = r->tag.comm, .seq = r->tag.seq, .step = r->tag.step,
		.meta = r->tag.meta, .rdv_id = r->rdv_id, .len = r->len,
		.addr = (uint64_t)(uintptr_t)r->buf, .rkey = r->rkey,
	};
	*sent = post_msg(l, &h, NULL, 0);
	if (*sent)
		r->cts_sent = true;
}

/* Everything that waits for a slot, a credit or send-queue room, in order. */
bool ib_link_push(tp_link *l)
{
	bool moved = false;

	if (l->state != LS_READY)
		return false;
	while (!klist_empty(&l->ctl_q)) {
		bool sent;
		tp_req *r = IB_REQ(l->ctl_q.next);
		send_cts(l, r, &sent);
		if (!sent)
			break;
		klist_del(&r->node);
		moved = true;
	}
	while (!klist_empty(&l->sends_eager) && l->state == LS_READY) {
		tp_req *r = IB_REQ(l->sends_eager.next);
		struct msg_hdr h = { .kind = MSG_EAGER, .comm = r->tag.comm, .seq = r->tag.seq,
		                     .step = r->tag.step, .meta = r->tag.meta, .len = r->len };
		if (!post_msg(l, &h, r->buf, r->len))
			break;
		klist_del(&r->node);
		ib_req_finish(r, KHOR_SUCCESS); /* copied into the slot: the buffer is free */
		moved = true;
	}
	for (klist *n = l->sends_rdv.next; n != &l->sends_rdv && l->state == LS_READY;
	     n = n->next) {
		tp_req *r = IB_REQ(n);
		if (!r->active || rdv_fully_posted(r))
			continue;
		int before = r->wr_out;
		rdv_push(l, r);
		moved |= r->wr_out != before;
	}
	maybe_write_credits(l);
	return moved;
}

/* ---- matching ------------------------------------------------------------------------ */

static bool tag_is(const struct msg_hdr *h, tp_tag t)
{
	return h->comm == t.comm && h->seq == t.seq && h->step == t.step;
}

static const char *meta_words(const tp_ctx *ctx, uint32_t meta, char *buf, size_t len)
{
	return tp_meta_describe(ctx->meta, meta, buf, len);
}

/* A message or CTS of r's tag: false (and the link failed) when meta or length differ. */
static bool check_match(tp_link *l, tp_req *r, const struct msg_hdr *h, const char *what)
{
	char a[96], b[96];

	if (h->meta != r->tag.meta) {
		ib_link_fail(
		    l, KHOR_ERR_PROTOCOL,
		    "comm %u call %u step %u: the peer's %s is for %s, "
		    "this rank's %s is for %s (the ranks are not running the same collective)",
		    h->comm, h->seq, h->step, what, meta_words(l->ctx, h->meta, a, sizeof(a)),
		    r->is_send ? "send" : "receive", meta_words(l->ctx, r->tag.meta, b, sizeof(b)));
		return false;
	}
	if (h->len != r->len) {
		ib_link_fail(
		    l, KHOR_ERR_PROTOCOL,
		    "comm %u call %u step %u: the peer's %s has %llu "
		    "bytes, this rank's %s %llu bytes (the ranks disagree on a count or dtype)",
		    h->comm, h->seq, h->step, what, (unsigned long long)h->len,
		    r->is_send ? "send" : "receive", (unsigned long long)r->len);
		return false;
	}
	return true;
}

/* A CTS for send r: start writing. */
static void rdv_start(tp_link *l, tp_req *r, const struct msg_hdr *h)
{
	if (!check_match(l, r, h, "receive")) {
		return;
	}
	r->raddr = h->addr;
	r->rrkey = h->rkey;
	r->rdv_id = h->rdv_id;
	r->nparts = rdv_parts(l, r->len);
	r->active = true;
	rdv_push(l, r);
}

static void on_cts(tp_link *l, const struct msg_hdr *h)
{
	for (klist *n = l->sends_rdv.next; n != &l->sends_rdv; n = n->next) {
		tp_req *r = IB_REQ(n);
		if (!r->active && tag_is(h, r->tag)) {
			rdv_start(l, r, h);
			return;
		}
	}
	if (l->ncts_early >= IB_CTS_EARLY_MAX) {
		ib_link_fail(l, KHOR_ERR_PROTOCOL,
		             "more than %d CTSs for sends this rank has not posted (the newest for "
		             "comm %u call %u step %u): the ranks are not running the same calls",
		             IB_CTS_EARLY_MAX, h->comm, h->seq, h->step);
		return;
	}
	if (l->ncts_early == l->cts_early_cap) {
		int cap = l->cts_early_cap ? 2 * l->cts_early_cap : 8;
		struct msg_hdr *p = realloc(l->cts_early, (size_t)cap * sizeof(*p));
		if (p == NULL) {
			ib_link_fail(l, KHOR_ERR_NO_MEMORY, "out of memory keeping an early CTS");
			return;
		}
		l->cts_early = p;
		l->cts_early_cap = cap;
	}
	l->cts_early[l->ncts_early++] = *h;
}

/* An eager message for receive r (data: its payload). */
static void eager_deliver(tp_link *l, tp_req *r, const struct msg_hdr *h, const uint8_t *data)
{
	ib_req_unlink(r);
	if (!check_match(l, r, h, "message")) {
		ib_req_finish(r, l->err.status);
		return;
	}
	if (h->len > 0)
		memcpy(r->buf, data, h->len);
	ib_req_finish(r, KHOR_SUCCESS);
}

/* What an early message copied aside takes of IB_UNEXPECTED_MAX: its bytes and its record. */
#define UNEXP_COST(len) ((len) + sizeof(struct unexp))

static void on_eager(tp_link *l, struct slot *s, const struct msg_hdr *h, bool *keep_slot)
{
	*keep_slot = false;
	if (h->len > IB_EAGER_MAX) {
		ib_link_fail(l, KHOR_ERR_PROTOCOL,
		             "an eager message announces %llu bytes (at most %u)",
		             (unsigned long long)h->len, IB_EAGER_MAX);
		return;
	}
	for (klist *n = l->recvs.next; n != &l->recvs; n = n->next) {
		tp_req *r = IB_REQ(n);
		if (tag_is(h, r->tag)) {
			eager_deliver(l, r, h, s->mem + IB_HDR_BYTES);
			return;
		}
	}
	for (int i = 0; i < IB_RDV_MAX; i++) {
		tp_req *r = l->rdv[i];
		if (r != NULL && tag_is(h, r->tag)) {
			/* We expect a large message, the sender sent a small one. */
			check_match(l, r, h, "message");
			return;
		}
	}
	struct unexp *u = calloc(1, sizeof(*u));
	if (u == NULL) {
		ib_link_fail(l, KHOR_ERR_NO_MEMORY, "out of memory keeping an early message");
		return;
	}
	u->hdr = *h;
	/* Each copy counts with its record, so that empty messages are bounded too. */
	if (l->ubytes + UNEXP_COST(h->len) <= IB_UNEXPECTED_MAX &&
	    (h->len == 0 || (u->data = malloc(h->len)))) {
		if (h->len > 0)
			memcpy(u->data, s->mem + IB_HDR_BYTES, h->len);
		l->ubytes += UNEXP_COST(h->len);
	} else {
		u->held = s; /* the slot stays ours until a receive takes it: back-pressure */
		*keep_slot = true;
	}
	klist_add_tail(&l->uq, &u->node);
}

static void on_recv_slot(tp_link *l, struct slot *s, uint32_t byte_len, bool with_imm,
                         uint32_t imm);

static void on_imm(tp_link *l, uint32_t imm)
{
	uint32_t idx = imm & (IB_RDV_MAX - 1);
	tp_req *r = l->rdv[idx];

	if (r == NULL || r->rdv_id != imm) {
		ib_link_fail(l, KHOR_ERR_PROTOCOL,
		             "an RDMA write completed for rendezvous %u, which "
		             "this rank is not waiting for",
		             imm);
		return;
	}
	if (++r->imm_seen < rdv_parts(l, r->len))
		return;
	l->rdv[idx] = NULL;
	ib_req_finish(r, KHOR_SUCCESS);
}

static void on_recv_slot(tp_link *l, struct slot *s, uint32_t byte_len, bool with_imm,
                         uint32_t imm)
{
	bool keep = false;

	if (with_imm) {
		on_imm(l, imm);
	} else if (byte_len < IB_HDR_BYTES) {
		ib_link_fail(l, KHOR_ERR_PROTOCOL,
		             "a message of %u bytes is shorter than its header", byte_len);
	} else {
		struct msg_hdr h;
		memcpy(&h, s->mem, sizeof(h));
		take_credits(l, h.posted, h.nqp);
		if (h.kind == MSG_EAGER && byte_len == IB_HDR_BYTES + h.len)
			on_eager(l, s, &h, &keep);
		else if (h.kind == MSG_CTS)
			on_cts(l, &h);
		else
			ib_link_fail(l, KHOR_ERR_PROTOCOL,
			             "a message of kind %u and %u bytes makes no "
			             "sense",
			             h.kind, byte_len);
	}
	if (!keep && live(l))
		ib_post_recv_slot(l, s);
}

/* ---- completions --------------------------------------------------------------------- */

static tp_link *link_of_qpn(tp_link *l, uint32_t qpn, int *idx)
{
	for (int q = 0; q < l->nqp; q++)
		if (l->qps[q].qp->qp_num == qpn) {
			*idx = q;
			return l;
		}
	*idx = -1;
	return l;
}

static void wc_error(tp_link *l, const struct ibv_wc *wc)
{
	int q;

	link_of_qpn(l, wc->qp_num, &q);
	if (l->err.status != KHOR_SUCCESS)
		return; /* flushes after the first error say nothing new */
	const char *hint = "";
	switch (wc->status) {
	case IBV_WC_RETRY_EXC_ERR:
		hint = " (the peer stopped answering: it died, or the network between us is down)";
		break;
	case IBV_WC_REM_ACCESS_ERR:
		hint = " (the peer refused our RDMA write: a stale or wrong key)";
		break;
	case IBV_WC_RNR_RETRY_EXC_ERR:
		hint = " (the peer had no receive posted)";
		break;
	default:
		break;
	}
	ib_link_fail(l, KHOR_ERR_REMOTE,
	             "work completion with error on QP %d: %s (status %d, vendor "
	             "error 0x%x)%s",
	             q, l->ctx->api->wc_status_str(wc->status), (int)wc->status, wc->vendor_err,
	             hint);
}

static void on_wc(tp_link *l, const struct ibv_wc *wc)
{
	void *p = WR_PTR(wc->wr_id);
	int type = WR_TYPE(wc->wr_id);

	switch (type) {
	case WR_RSLOT:
		if (wc->status == IBV_WC_SUCCESS)
			on_recv_slot(l, p, wc->byte_len, wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM,
			             (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0);
		else
			wc_error(l, wc);
		return;
	case WR_RIMM: {
		struct qp *q = p;
		if (wc->status != IBV_WC_SUCCESS) {
			wc_error(l, wc);
			return;
		}
		on_imm(l, ntohl(wc->imm_data));
		if (live(l))
			ib_post_recv_imm(q);
		return;
	}
	case WR_SSLOT: {
		struct slot *s = p;
		l->qps[0].sq_out--;
		s->next = l->sfree;
		l->sfree = s;
		if (wc->status != IBV_WC_SUCCESS)
			wc_error(l, wc);
		return;
	}
	case WR_CREDIT:
		l->qps[0].sq_out--;
		l->credit_busy = false;
		if (wc->status != IBV_WC_SUCCESS)
			wc_error(l, wc);
		return;
	case WR_RDV: {
		tp_req *r = p;
		int q;
		link_of_qpn(l, wc->qp_num, &q);
		if (q >= 0)
			l->qps[q].sq_out--;
		r->wr_out--;
		if (wc->status != IBV_WC_SUCCESS)
			wc_error(l, wc);
		if (r->orphan) {
			if (r->wr_out == 0 && r->done)
				ib_req_release(r);
			return;
		}
		if (r->wr_out == 0 && !r->done && rdv_fully_posted(r)) {
			ib_req_unlink(r);
			ib_req_finish(r, KHOR_SUCCESS);
		}
		return;
	}
	default:
		ib_link_fail(l, KHOR_ERR_PROTOCOL, "a completion of unknown kind %d", type);
	}
}

bool ib_poll_link(tp_link *l)
{
	struct ibv_wc wcs[32];
	bool moved = false;
	int n;

	if (l->cq == NULL)
		return false;
	while ((n = ibv_poll_cq(l->cq, 32, wcs)) > 0) {
		for (int i = 0; i < n; i++)
			on_wc(l, &wcs[i]);
		moved = true;
	}
	if (n < 0)
		ib_link_fail(l, KHOR_ERR_SYSTEM, "ibv_poll_cq failed");
	if (l->state == LS_READY) {
		/* The peer may have written new credit words. */
		uint32_t c[IB_MAX_QPS] = { 0 }; /* all set below; gcc -O3 cannot see that */
		for (int q = 0; q < l->nqp; q++)
			c[q] = l->credit_in[q];
		take_credits(l, c, (uint32_t)l->nqp);
		moved |= ib_link_push(l);
	}
	return moved;
}

/* ---- posting a request --------------------------------------------------------------- */

khor_status ib_isend_locked(tp_link *l, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
                            tp_req **req_out, kerr *err)
{
	tp_ctx *ctx = l->ctx;
	khor_status st = KHOR_SUCCESS;

	if (l->err.status != KHOR_SUCCESS) {
		st = l->err.status;
		*err = l->err;
		goto out;
	}
	tp_req *r = ib_req_new(l);
	if (r == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "ib send: out of memory");
		goto out;
	}
	r->is_send = true;
	r->buf = (uint8_t *)buf;
	r->len = len;
	r->tag = tag;
	if (len <= IB_EAGER_MAX) {
		klist_add_tail(&l->sends_eager, &r->node);
	} else {
		r->rdv = true;
		if ((st = ib_req_keys(r, mr, 0, err)) != KHOR_SUCCESS) {
			ib_req_release(r);
			goto out;
		}
		klist_add_head(&l->sends_rdv, &r->node);
		for (int i = 0; i < l->ncts_early; i++) {
			if (tag_is(&l->cts_early[i], tag)) {
				struct msg_hdr h = l->cts_early[i];
				l->cts_early[i] = l->cts_early[--l->ncts_early];
				rdv_start(l, r, &h);
				break;
			}
		}
	}
	*req_out = r;
	if (ib_link_push(l))
		tp_skel_moved(&ctx->sk);
out:
	return st;
}

khor_status ib_irecv_locked(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,
                            tp_req **req_out, kerr *err)
{
	tp_ctx *ctx = l->ctx;
	khor_status st = KHOR_SUCCESS;

	tp_req *r = ib_req_new(l);
	if (r == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "ib receive: out of memory");
		goto out;
	}
	r->buf = buf;
	r->len = len;
	r->tag = tag;
	*req_out = r;
	/* A message that came early is delivered even when the link died since. */
	for (klist *n = l->uq.next; n != &l->uq; n = n->next) {
		struct unexp *u = KLIST_ENTRY(n, struct unexp, node);
		if (!tag_is(&u->hdr, tag))
			continue;
		klist_del(n);
		if (len > IB_EAGER_MAX) {
			r->rdv = true;
			check_match(l, r, &u->hdr, "message");
			ib_req_finish(r, l->err.status ? l->err.status : KHOR_ERR_PROTOCOL);
		} else if (check_match(l, r, &u->hdr, "message")) {
			const uint8_t *data = u->held ? u->held->mem + IB_HDR_BYTES : u->data;
			if (len > 0)
				memcpy(buf, data, len);
			ib_req_finish(r, KHOR_SUCCESS);
		} else {
			ib_req_finish(r, l->err.status);
		}
		if (u->held != NULL) {
			if (live(l))
				ib_post_recv_slot(l, u->held);
		} else {
			l->ubytes -= UNEXP_COST(u->hdr.len);
			free(u->data);
		}
		free(u);
		goto pushed;
	}
	if (l->err.status != KHOR_SUCCESS) {
		ib_req_finish(r, l->err.status);
		goto out;
	}
	if (len > IB_EAGER_MAX) {
		r->rdv = true;
		if ((st = ib_req_keys(r, mr, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		                      err)) != KHOR_SUCCESS) {
			ib_req_release(r);
			goto out;
		}
		/* A rendezvous id names this receive in the sender's immediates. */
		int idx = -1;
		for (int i = 0; i < IB_RDV_MAX; i++)
			if (l->rdv[i] == NULL) {
				idx = i;
				break;
			}
		if (idx < 0) {
			ib_req_release(r);
			st = kerr_set(err, KHOR_ERR_INTERNAL, "ib link to peer rank %d: more than %d large "
			              "receives in flight", l->peer, IB_RDV_MAX);
			goto out;
		}
		l->rdv_gen++;
		r->rdv_id = (uint32_t)idx | (l->rdv_gen << 6);
		l->rdv[idx] = r;
		klist_add_tail(&l->ctl_q, &r->node);
	}
	/* Eager receives wait in recvs, in posting order; rendezvous ones are found through
	 * l->rdv (their node serves ctl_q until the CTS is out). */
	if (!r->rdv)
		klist_add_tail(&l->recvs, &r->node);
pushed:
	if (ib_link_push(l))
		tp_skel_moved(&ctx->sk);
out:
	return st;
}
