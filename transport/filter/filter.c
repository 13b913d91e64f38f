/*
 * filter.c -- the layer of filter.h: a transport table whose ops call another's, checking
 * sums and injecting faults on the way.
 *
 * Locks: the layer's own (ctx->mu) covers its links, requests and counters. It is held
 * around calls into the inner transport that never block (isend, irecv, test, cancel,
 * sever, reg_mr), which take the inner lock after it, and never around the inner
 * progress(), which sleeps: the order is always this lock, then the inner one, and the
 * inner transport never calls back. A stall rule sleeps with no lock held.
 *
 * Requests: each of ours holds the inner requests of its payload and, with checksums over a
 * transport whose frames cannot carry the sum (no isend_sum), of its trailer, and finishes
 * when both have. A send that a delay rule holds sits on its
 * link's queue, oldest first, until its time comes (test and progress post what is due,
 * in order, so frames never overtake each other).
 */
#include "filter.h"

#include "base/checksum.h"
#include "base/clock.h"
#include "base/list.h"
#include "base/log.h"
#include "base/sleeper.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The step bit of a trailer frame: no collective numbers its steps this high. */
#define TRAILER_STEP 0x80000000u
/* What hdr=comm/seq/step flips: far from every call in flight. */
#define HDR_FLIP 0x40000000u
#define SLOTS 4

struct trailer {
	uint64_t sum;
	uint64_t len;
};

struct slot {
	const struct transport_ops *inner;
	struct transport_ops ops;
	filter_rule rules[FILTER_RULES_MAX];
	int nrules;
	bool checksum;
};

static struct slot slots[SLOTS];
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;

/* The inner transport's objects are its own types; here they are only handed back to it. */
struct tp_ctx {
	const struct transport_ops *in;
	tp_ctx *ic;
	kmutex mu;
	int rank;
	bool checksum;
	bool in_frames; /* checksum, carried by the inner transport's headers: no trailers */
	tp_caps caps;
	filter_rule rules[FILTER_RULES_MAX];
	bool fired[FILTER_RULES_MAX];
	int nrules;
	uint64_t nregs;
	klist links;
};

struct tp_link {
	tp_ctx *ctx;
	tp_link *il;
	int peer;
	klist node;           /* on ctx->links */
	uint64_t sent;        /* payload bytes of the frames sent: the AT of the rules */
	uint64_t completions; /* transfers finished either way: the AT of fail */
	int64_t delay_ms;     /* a delay rule fired: every frame from now on waits; -1: none */
	klist delayed;        /* sends waiting for their time, oldest first */
};

enum req_kind { RK_SEND, RK_RECV, RK_FLUSH };

struct tp_req {
	tp_link *l;
	enum req_kind kind;
	bool queued;           /* on l->delayed, not yet given to the inner transport */
	bool counted;          /* a collective's transfer (fail's count), not a flush */
	tp_req *ir, *itr;      /* inner requests of the payload and the trailer; NULL: done */
	khor_status st;        /* a failure to post a queued send, kept for test */
	kerr err;
	void *buf;             /* as posted (a send's may be the damaged copy) */
	size_t len;            /* of the payload frame as it goes */
	size_t user_len;       /* as the caller posted it */
	tp_tag tag, user_tag;
	tp_mr *mr;
	void *copy;            /* data: the damaged copy of a send's payload */
	tp_mr *copy_mr;
	struct trailer tr;
	tp_sum carried;        /* a receive's sum, from the inner transport (in_frames) */
	uint64_t due_ns;
	klist node;            /* on l->delayed */
};

/* ---- rules ---------------------------------------------------------------------------- */

static const char *kind_name(enum filter_kind k)
{
	static const char *const n[] = { "drop", "trunc", "hdr", "data", "delay", "stall",
		                         "regfail", "fail" };
	return n[k];
}

/* Rule i applies to this rank's link to peer (-1: any link, for regfail). */
static bool rule_mine(const tp_ctx *c, int i, int peer)
{
	const filter_rule *r = &c->rules[i];
	return !c->fired[i] && (r->from < 0 || r->from == c->rank) &&
	       (peer < 0 || r->to < 0 || r->to == peer);
}

/* The frame [sent, sent + len) reaches byte at (a frame of no bytes reaches its start). */
static bool reaches(uint64_t sent, size_t len, uint64_t at)
{
	return sent + (len > 0 ? len : 1) > at;
}

static void sleep_ms(int64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0) {
	}
}

/* ---- requests ------------------------------------------------------------------------- */

static void req_free(tp_ctx *c, tp_req *r)
{
	if (r->copy_mr != NULL)
		c->in->dereg_mr(c->ic, r->copy_mr);
	free(r->copy);
	free(r);
}

/* Gives a send to the inner transport: the payload frame, then its trailer. */
static khor_status post_send(tp_link *l, tp_req *r, kerr *err)
{
	tp_ctx *c = l->ctx;
	tp_mr *mr = r->copy != NULL ? r->copy_mr : r->mr;
	if (c->in_frames)
		return c->in->isend_sum(l->il, r->buf, r->len, r->tag, mr, r->tr.sum, &r->ir, err);
	khor_status st = c->in->isend(l->il, r->buf, r->len, r->tag, mr, &r->ir, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (c->checksum) {
		tp_tag t = r->user_tag;
		t.step |= TRAILER_STEP;
		if ((st = c->in->isend(l->il, &r->tr, sizeof(r->tr), t, NULL, &r->itr, err))) {
			c->in->cancel(r->ir);
			r->ir = NULL;
			return st;
		}
	}
	return KHOR_SUCCESS;
}

/* Posts the link's queued sends whose time has come, in order; true if one went. */
static bool post_due(tp_link *l, uint64_t now)
{
	bool moved = false;
	while (!klist_empty(&l->delayed)) {
		tp_req *r = KLIST_ENTRY(l->delayed.next, tp_req, node);
		if (r->due_ns > now)
			break;
		klist_del(&r->node);
		r->queued = false;
		r->st = post_send(l, r, &r->err);
		moved = true;
	}
	return moved;
}

/* Applies this rank's rules to a frame about to go; may cut the link, damage the frame (in
 * r), start a delay, or ask for a stall (*stall_ms). */
static khor_status apply_send_rules(tp_link *l, tp_req *r, int64_t *stall_ms, kerr *err)
{
	tp_ctx *c = l->ctx;
	char why[160];

	for (int i = 0; i < c->nrules; i++) {
		const filter_rule *f = &c->rules[i];
		if (!rule_mine(c, i, l->peer) || f->kind == FK_REGFAIL || f->kind == FK_FAIL ||
		    !reaches(l->sent, r->user_len, f->at))
			continue;
		if ((f->kind == FK_TRUNC || f->kind == FK_DATA) && r->user_len == 0)
			continue; /* nothing to cut or flip: the next frame with bytes */
		if (f->kind == FK_DELAY && l->delay_ms >= 0)
			continue; /* this link's frames wait already */
		c->fired[i] = f->kind != FK_DELAY; /* a delay: once on every link it names */
		KLOG_INFO("KHOR_FAULTS rule %d (%s) fires on the frame to rank %d at byte %llu "
		          "(comm %u seq %u step %u, %zu bytes)", i, kind_name(f->kind), l->peer,
		          (unsigned long long)l->sent, r->tag.comm, r->tag.seq, r->tag.step,
		          r->user_len);
		switch (f->kind) {
		case FK_DROP:
			snprintf(why, sizeof(why), "the connection was lost (KHOR_FAULTS rule %d: "
			         "cut after %llu bytes)", i, (unsigned long long)l->sent);
			c->in->sever(l->il, why);
			break;
		case FK_TRUNC:
			r->len = r->user_len / 2;
			break;
		case FK_HDR:
			switch (f->field) {
			case FF_COMM: r->tag.comm ^= HDR_FLIP; break;
			case FF_SEQ: r->tag.seq ^= HDR_FLIP; break;
			case FF_STEP: r->tag.step ^= HDR_FLIP; break;
			case FF_META: r->tag.meta ^= 1u; break;
			case FF_LEN: r->len = r->user_len > 0 ? r->user_len - 1 : 1; break;
			}
			if (f->field == FF_LEN && r->user_len == 0) {
				/* one byte more than posted: a copy to send it from */
				if ((r->copy = calloc(1, 1)) == NULL)
					return kerr_set(err, KHOR_ERR_NO_MEMORY, "KHOR_FAULTS: no memory");
				r->buf = r->copy;
			}
			break;
		case FK_DATA: {
			uint64_t off = f->at > l->sent ? f->at - l->sent : 0;
			if ((r->copy = malloc(r->user_len)) == NULL)
				return kerr_set(err, KHOR_ERR_NO_MEMORY, "KHOR_FAULTS: no memory for a "
				                "copy of %zu bytes", r->user_len);
			memcpy(r->copy, r->buf, r->user_len);
			((unsigned char *)r->copy)[off] ^= 0x10;
			if (c->caps.needs_reg && r->user_len > c->caps.reg_min) {
				tp_reg_desc d = { .buf = r->copy, .len = r->user_len,
					          .kind = TP_MEM_HOST, .access = 0, .dmabuf_fd = -1 };
				khor_status st = c->in->reg_mr(c->ic, &d, &r->copy_mr, err);
				if (st != KHOR_SUCCESS)
					return st;
			}
			r->buf = r->copy;
			break;
		}
		case FK_DELAY:
			l->delay_ms = f->ms;
			break;
		case FK_STALL:
			*stall_ms = f->ms;
			break;
		case FK_REGFAIL:
		case FK_FAIL:
			break;
		}
	}
	return KHOR_SUCCESS;
}

/* ---- the ops -------------------------------------------------------------------------- */

static khor_status f_create(int slot, const tp_options *opt, tp_ctx **ctx_out, kerr *err)
{
	tp_ctx *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory for the filter layer");
	pthread_mutex_lock(&slots_mu);
	const struct slot *s = &slots[slot];
	c->in = s->inner;
	c->checksum = s->checksum;
	c->in_frames = s->checksum && s->inner->isend_sum != NULL && s->inner->irecv_sum != NULL;
	c->nrules = s->nrules;
	memcpy(c->rules, s->rules, sizeof(c->rules));
	pthread_mutex_unlock(&slots_mu);
	c->rank = opt->rank;
	kmutex_init(&c->mu);
	klist_init(&c->links);
	khor_status st = c->in->create(opt, &c->ic, err);
	if (st != KHOR_SUCCESS) {
		free(c);
		return st;
	}
	if (c->in->caps != NULL)
		c->in->caps(c->ic, &c->caps);
	*ctx_out = c;
	return KHOR_SUCCESS;
}

#define CREATE_THUNK(i)                                                                        \
	static khor_status f_create##i(const tp_options *o, tp_ctx **c, kerr *e)              \
	{                                                                                      \
		return f_create(i, o, c, e);                                                   \
	}
CREATE_THUNK(0)
CREATE_THUNK(1)
CREATE_THUNK(2)
CREATE_THUNK(3)
static khor_status (*const creates[SLOTS])(const tp_options *, tp_ctx **, kerr *) = {
	f_create0, f_create1, f_create2, f_create3,
};

static const char *f_address(const tp_ctx *c)
{
	return c->in->address(c->ic);
}

static void f_caps(const tp_ctx *c, tp_caps *out)
{
	*out = c->caps;
}

/* Our link over the inner one (made once, found again by accept). */
static tp_link *link_for(tp_ctx *c, tp_link *il, int peer, kerr *err)
{
	for (klist *n = c->links.next; n != &c->links; n = n->next) {
		tp_link *l = KLIST_ENTRY(n, tp_link, node);
		if (l->il == il)
			return l;
	}
	tp_link *l = calloc(1, sizeof(*l));
	if (l == NULL) {
		kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory for the filter's link to rank %d",
		         peer);
		return NULL;
	}
	l->ctx = c;
	l->il = il;
	l->peer = peer;
	l->delay_ms = -1;
	klist_init(&l->delayed);
	klist_add_tail(&c->links, &l->node);
	return l;
}

static khor_status f_connect(tp_ctx *c, int peer, const char *addr, tp_link **link_out,
                             kerr *err)
{
	tp_link *il;
	khor_status st = c->in->connect(c->ic, peer, addr, &il, err);
	if (st != KHOR_SUCCESS)
		return st;
	kmutex_lock(&c->mu);
	*link_out = link_for(c, il, peer, err);
	kmutex_unlock(&c->mu);
	return *link_out != NULL ? KHOR_SUCCESS : KHOR_ERR_NO_MEMORY;
}

static khor_status f_accept(tp_ctx *c, int peer, tp_link **link_out, kerr *err)
{
	tp_link *il;
	khor_status st = c->in->accept(c->ic, peer, &il, err);
	*link_out = NULL;
	if (st != KHOR_SUCCESS || il == NULL)
		return st;
	kmutex_lock(&c->mu);
	*link_out = link_for(c, il, peer, err);
	kmutex_unlock(&c->mu);
	return *link_out != NULL ? KHOR_SUCCESS : KHOR_ERR_NO_MEMORY;
}

static bool f_link_ready(const tp_link *l)
{
	return l->ctx->in->link_ready(l->il);
}

static void f_describe(const tp_link *l, char *buf, size_t len)
{
	l->ctx->in->describe(l->il, buf, len);
}

static khor_status f_reg_mr(tp_ctx *c, const tp_reg_desc *d, tp_mr **mr_out, kerr *err)
{
	kmutex_lock(&c->mu);
	uint64_t k = c->nregs++;
	for (int i = 0; i < c->nrules; i++) {
		if (c->rules[i].kind != FK_REGFAIL || !rule_mine(c, i, -1) || c->rules[i].at != k)
			continue;
		c->fired[i] = true;
		kmutex_unlock(&c->mu);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "registering %zu bytes at %p failed: "
		                "Cannot allocate memory (KHOR_FAULTS rule %d: registration %llu "
		                "refused, as under a locked-memory limit, ulimit -l)", d->len, d->buf,
		                i, (unsigned long long)k);
	}
	kmutex_unlock(&c->mu);
	return c->in->reg_mr(c->ic, d, mr_out, err);
}

static void f_dereg_mr(tp_ctx *c, tp_mr *mr)
{
	c->in->dereg_mr(c->ic, mr);
}

static void f_mr_key(const tp_mr *mr, tp_rkey *out);

/* A collective's transfer of len bytes at buf with tag, as posted; NULL without memory. */
static tp_req *req_new(tp_link *l, enum req_kind kind, void *buf, size_t len, tp_tag tag,
                       tp_mr *mr, kerr *err)
{
	tp_req *r = calloc(1, sizeof(*r));
	if (r == NULL) {
		kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory for a %s rank %d",
		         kind == RK_SEND ? "send to" : "receive from", l->peer);
		return NULL;
	}
	r->l = l;
	r->kind = kind;
	r->counted = true;
	r->buf = buf;
	r->len = r->user_len = len;
	r->tag = r->user_tag = tag;
	r->mr = mr;
	return r;
}

static khor_status f_isend(tp_link *l, const void *buf, size_t len, tp_tag tag, tp_mr *mr,
                           tp_req **req_out, kerr *err)
{
	tp_ctx *c = l->ctx;
	int64_t stall_ms = 0;
	khor_status st;

	if (c->checksum && (tag.step & TRAILER_STEP) != 0)
		return kerr_set(err, KHOR_ERR_INTERNAL, "send to rank %d: step 0x%08x has the bit "
		                "KHOR_CHECKSUM's trailers use", l->peer, tag.step);
	tp_req *r = req_new(l, RK_SEND, (void *)buf, len, tag, mr, err);
	if (r == NULL)
		return KHOR_ERR_NO_MEMORY;
	if (c->checksum) {
		r->tr.sum = kchecksum(buf, len); /* of the bytes as the caller meant them */
		r->tr.len = len;
	}
	kmutex_lock(&c->mu);
	if ((st = apply_send_rules(l, r, &stall_ms, err)) != KHOR_SUCCESS) {
		kmutex_unlock(&c->mu);
		req_free(c, r);
		return st;
	}
	l->sent += len;
	kmutex_unlock(&c->mu);
	if (stall_ms > 0)
		sleep_ms(stall_ms);
	kmutex_lock(&c->mu);
	if (l->delay_ms >= 0 || !klist_empty(&l->delayed)) {
		r->queued = true;
		r->due_ns = kclock_ns() + (uint64_t)(l->delay_ms > 0 ? l->delay_ms : 0) * 1000000u;
		klist_add_tail(&l->delayed, &r->node);
		post_due(l, kclock_ns());
		st = KHOR_SUCCESS;
	} else {
		st = post_send(l, r, err);
	}
	kmutex_unlock(&c->mu);
	if (st != KHOR_SUCCESS) {
		req_free(c, r);
		return st;
	}
	*req_out = r;
	return KHOR_SUCCESS;
}

static khor_status f_irecv(tp_link *l, void *buf, size_t len, tp_tag tag, tp_mr *mr,
                           tp_req **req_out, kerr *err)
{
	tp_ctx *c = l->ctx;
	khor_status st;

	tp_req *r = req_new(l, RK_RECV, buf, len, tag, mr, err);
	if (r == NULL)
		return KHOR_ERR_NO_MEMORY;
	kmutex_lock(&c->mu);
	if (c->in_frames)
		st = c->in->irecv_sum(l->il, buf, len, tag, mr, &r->carried, &r->ir, err);
	else
		st = c->in->irecv(l->il, buf, len, tag, mr, &r->ir, err);
	if (st == KHOR_SUCCESS && c->checksum && !c->in_frames) {
		tp_tag t = tag;
		t.step |= TRAILER_STEP;
		if ((st = c->in->irecv(l->il, &r->tr, sizeof(r->tr), t, NULL, &r->itr, err))) {
			c->in->cancel(r->ir);
			r->ir = NULL;
		}
	}
	kmutex_unlock(&c->mu);
	if (st != KHOR_SUCCESS) {
		free(r);
		return st;
	}
	*req_out = r;
	return KHOR_SUCCESS;
}

static khor_status f_flush(tp_link *l, void *buf, size_t len, tp_mr *mr, tp_req **req_out,
                           kerr *err)
{
	tp_ctx *c = l->ctx;
	tp_req *ir = NULL;

	*req_out = NULL;
	khor_status st = c->in->flush(l->il, buf, len, mr, &ir, err);
	if (st != KHOR_SUCCESS || ir == NULL)
		return st;
	tp_req *r = calloc(1, sizeof(*r));
	if (r == NULL) {
		c->in->cancel(ir);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory for a flush");
	}
	r->l = l;
	r->kind = RK_FLUSH;
	r->ir = ir;
	*req_out = r;
	return KHOR_SUCCESS;
}

/* Gives up what of r is still with the inner transport and frees r; the lock is held and
 * let go here. */
static void req_abandon(tp_ctx *c, tp_req *r)
{
	if (r->ir != NULL)
		c->in->cancel(r->ir);
	if (r->itr != NULL)
		c->in->cancel(r->itr);
	kmutex_unlock(&c->mu);
	req_free(c, r);
}

/* Tests one inner request; *ir becomes NULL when it finished (well or not). */
static khor_status test_inner(tp_ctx *c, tp_req **ir, kerr *err)
{
	bool done = false;
	if (*ir == NULL)
		return KHOR_SUCCESS;
	khor_status st = c->in->test(*ir, &done, err);
	if (done)
		*ir = NULL;
	return st;
}

/* Both halves done and well: the checks of a finished transfer. */
static khor_status finish_checks(tp_link *l, tp_req *r, kerr *err)
{
	tp_ctx *c = l->ctx;
	char why[KERR_TEXT_MAX];

	if (r->kind == RK_RECV && c->checksum) {
		uint64_t sum = kchecksum(r->buf, r->user_len);
		if (c->in_frames && !r->carried.carried) {
			snprintf(why, sizeof(why), "KHOR_CHECKSUM: the frame from rank %d (comm %u seq "
			         "%u step %u, %zu bytes) carried no sum: set KHOR_CHECKSUM=1 on every "
			         "rank or on none", l->peer, r->user_tag.comm, r->user_tag.seq,
			         r->user_tag.step, r->user_len);
			c->in->sever(l->il, why);
			return kerr_set(err, KHOR_ERR_PROTOCOL, "%s", why);
		}
		if (c->in_frames) {
			r->tr.sum = r->carried.value;
			r->tr.len = r->user_len; /* the inner transport checked the lengths */
		}
		if (sum != r->tr.sum || r->tr.len != r->user_len) {
			snprintf(why, sizeof(why), "KHOR_CHECKSUM: the frame from rank %d (comm %u seq "
			         "%u step %u, %zu bytes) arrived damaged: its sum is 0x%016llx, the "
			         "sender's 0x%016llx for %llu bytes", l->peer, r->user_tag.comm,
			         r->user_tag.seq, r->user_tag.step, r->user_len,
			         (unsigned long long)sum, (unsigned long long)r->tr.sum,
			         (unsigned long long)r->tr.len);
			c->in->sever(l->il, why);
			return kerr_set(err, KHOR_ERR_PROTOCOL, "%s", why);
		}
	}
	if (!r->counted)
		return KHOR_SUCCESS;
	uint64_t k = l->completions++;
	for (int i = 0; i < c->nrules; i++) {
		if (c->rules[i].kind != FK_FAIL || !rule_mine(c, i, l->peer) || c->rules[i].at != k)
			continue;
		c->fired[i] = true;
		snprintf(why, sizeof(why), "a %s of %zu bytes with rank %d completed with an error "
		         "(KHOR_FAULTS rule %d: completion %llu failed)",
		         r->kind == RK_SEND ? "send" : "receive", r->user_len, l->peer, i,
		         (unsigned long long)k);
		c->in->sever(l->il, why);
		return kerr_set(err, KHOR_ERR_SYSTEM, "%s", why);
	}
	return KHOR_SUCCESS;
}

static khor_status f_test(tp_req *r, bool *done_out, kerr *err)
{
	tp_link *l = r->l;
	tp_ctx *c = l->ctx;
	khor_status st = KHOR_SUCCESS;

	*done_out = false;
	kmutex_lock(&c->mu);
	if (r->queued)
		post_due(l, kclock_ns());
	if (r->queued) {
		kmutex_unlock(&c->mu);
		return KHOR_SUCCESS;
	}
	if (r->st != KHOR_SUCCESS) {
		st = r->st;
		*err = r->err;
	}
	if (st == KHOR_SUCCESS)
		st = test_inner(c, &r->ir, err);
	if (st == KHOR_SUCCESS)
		st = test_inner(c, &r->itr, err);
	if (st == KHOR_SUCCESS && (r->ir != NULL || r->itr != NULL)) {
		kmutex_unlock(&c->mu);
		return KHOR_SUCCESS;
	}
	if (st == KHOR_SUCCESS)
		st = finish_checks(l, r, err);
	/* On an error, the half still out is abandoned (which breaks the link if it started). */
	req_abandon(c, r);
	*done_out = true;
	return st;
}

static khor_status f_progress(tp_ctx *c, int timeout_ms, bool *moved_out, kerr *err)
{
	uint64_t now = kclock_ns(), next = UINT64_MAX;
	bool posted = false, moved = false;

	kmutex_lock(&c->mu);
	for (klist *n = c->links.next; n != &c->links; n = n->next) {
		tp_link *l = KLIST_ENTRY(n, tp_link, node);
		posted |= post_due(l, now);
		if (!klist_empty(&l->delayed)) {
			uint64_t d = KLIST_ENTRY(l->delayed.next, tp_req, node)->due_ns;
			next = d < next ? d : next;
		}
	}
	kmutex_unlock(&c->mu);
	if (posted)
		timeout_ms = 0;
	else if (next != UINT64_MAX) {
		int until = (int)((next - now + 999999) / 1000000);
		if (timeout_ms < 0 || until < timeout_ms)
			timeout_ms = until;
	}
	khor_status st = c->in->progress(c->ic, timeout_ms, &moved, err);
	if (moved_out != NULL)
		*moved_out = moved || posted;
	return st;
}

static void f_cancel(tp_req *r)
{
	tp_ctx *c = r->l->ctx;

	kmutex_lock(&c->mu);
	if (r->queued)
		klist_del(&r->node);
	req_abandon(c, r);
}

static khor_status f_link_error(tp_link *l, kerr *err_out)
{
	return l->ctx->in->link_error(l->il, err_out);
}

static void f_wake(tp_ctx *c)
{
	c->in->wake(c->ic);
}

static void f_sever(tp_link *l, const char *why)
{
	l->ctx->in->sever(l->il, why);
}

static void f_destroy(tp_ctx *c)
{
	c->in->destroy(c->ic);
	while (!klist_empty(&c->links)) {
		tp_link *l = KLIST_ENTRY(c->links.next, tp_link, node);
		while (!klist_empty(&l->delayed)) {
			tp_req *r = KLIST_ENTRY(l->delayed.next, tp_req, node);
			klist_del(&r->node);
			free(r->copy); /* its mr went with the inner instance */
			free(r);
		}
		klist_del(&l->node);
		free(l);
	}
	free(c);
}

/* The layer's mrs are the inner transport's own. */
static const struct transport_ops *mr_owner;

static void f_mr_key(const tp_mr *mr, tp_rkey *out)
{
	mr_owner->mr_key(mr, out);
}

khor_status filter_wrap(const struct transport_ops *inner, const char *spec, bool checksum,
                        const struct transport_ops **out, kerr *err)
{
	filter_rule rules[FILTER_RULES_MAX];
	int n;
	khor_status st = filter_parse(spec, rules, &n, err);
	if (st != KHOR_SUCCESS)
		return st;
	for (int i = 0; i < n; i++) {
		bool cuts = rules[i].kind == FK_DROP || rules[i].kind == FK_FAIL;
		if (cuts && inner->sever == NULL)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule %d (%s): the %s "
			                "transport cannot cut a link (no sever op)", i,
			                kind_name(rules[i].kind), inner->name);
		if (rules[i].kind == FK_REGFAIL && inner->reg_mr == NULL)
			return kerr_set(err, KHOR_ERR_INVALID_ARG, "KHOR_FAULTS rule %d (regfail): the "
			                "%s transport registers no memory", i, inner->name);
	}
	pthread_mutex_lock(&slots_mu);
	int k = 0;
	while (k < SLOTS && slots[k].inner != NULL && slots[k].inner != inner)
		k++;
	if (k == SLOTS) {
		pthread_mutex_unlock(&slots_mu);
		return kerr_set(err, KHOR_ERR_INTERNAL, "the filter layer wraps at most %d "
		                "transports", SLOTS);
	}
	struct slot *s = &slots[k];
	s->inner = inner;
	s->nrules = n;
	memcpy(s->rules, rules, sizeof(rules));
	s->checksum = checksum;
	s->ops = (struct transport_ops){
		.name = inner->name, /* the store's keys and KHOR_TRANSPORT's words stay the same */
		.version = TP_VERSION,
		.create = creates[k],
		.address = f_address,
		.caps = f_caps,
		.connect = f_connect,
		.accept = f_accept,
		.link_ready = f_link_ready,
		.describe = f_describe,
		.reg_mr = inner->reg_mr != NULL ? f_reg_mr : NULL,
		.dereg_mr = inner->dereg_mr != NULL ? f_dereg_mr : NULL,
		.mr_key = inner->mr_key != NULL ? f_mr_key : NULL,
		.isend = f_isend,
		.irecv = f_irecv,
		.flush = inner->flush != NULL ? f_flush : NULL,
		.test = f_test,
		.progress = f_progress,
		.cancel = f_cancel,
		.link_error = f_link_error,
		.wake = f_wake,
		.sever = inner->sever != NULL ? f_sever : NULL,
		.destroy = f_destroy,
	};
	if (inner->mr_key != NULL)
		mr_owner = inner;
	*out = &s->ops;
	pthread_mutex_unlock(&slots_mu);
	return KHOR_SUCCESS;
}
