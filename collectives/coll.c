/* coll.c -- posting, testing and the deadline-bounded wait shared by all algorithms. */
#include "coll.h"

#include "../base/dtype.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <stdarg.h>
#include <string.h>

/* Whether [p, p + len) lies inside [lo, lo + n). */
static bool inside(uintptr_t p, size_t len, const void *lo, size_t n)
{
	return lo != NULL && p >= (uintptr_t)lo && p - (uintptr_t)lo <= n &&
	       len <= n - (p - (uintptr_t)lo);
}

/*
 * The registration for a message of len bytes at buf on transport t: the whole buffer it
 * is a slice of (coll.h: coll_reg_call), so that the other slices hit; the slice alone,
 * once, when the buffer is a temp of the schedule's. Every buffer gets the same access:
 * a receive buffer of one step is the send buffer of the next.
 */
static khor_status post_reg(coll_comm *cc, const coll_tp *t, void *buf, size_t len,
                            regcache_entry **reg_out, kerr *err)
{
	const uintptr_t p = (uintptr_t)buf;
	tp_reg_desc d = {
		.buf = buf, .len = len, .kind = TP_MEM_HOST, .dmabuf_fd = -1,
		.access = TP_ACCESS_LOCAL_WRITE | TP_ACCESS_REMOTE_WRITE | TP_ACCESS_REMOTE_READ,
	};
	uint64_t scope = REGCACHE_ONESHOT;
	const coll_reg_call *rc = cc->reg_call;

	if (inside(p, len, cc->scratch, cc->scratch_len)) {
		d.buf = cc->scratch;
		d.len = cc->scratch_len;
		scope = REGCACHE_KEEP;
	} else if (cc->big != NULL && inside(p, len, *cc->big, *cc->big_len)) {
		d.buf = *cc->big;
		d.len = *cc->big_len;
		scope = REGCACHE_KEEP;
	} else {
		for (int i = 0; rc != NULL && i < rc->n; i++) {
			if (inside(p, len, (const void *)rc->buf[i].lo, rc->buf[i].len)) {
				d.buf = (void *)rc->buf[i].lo;
				d.len = rc->buf[i].len;
				scope = rc->buf[i].scope;
				break;
			}
		}
	}
	khor_status st = regcache_get(t->cache, &d, scope, reg_out, err);
	if (st != KHOR_SUCCESS && d.buf != buf) {
		/* The whole buffer would not register (beyond what this rank may lock?): try the
		 * message alone, which is all this post needs. */
		kerr ignore;
		d.buf = buf;
		d.len = len;
		if (regcache_get(t->cache, &d, REGCACHE_ONESHOT, reg_out, &ignore) == KHOR_SUCCESS)
			st = KHOR_SUCCESS;
	}
	return st;
}

khor_status coll_post(coll_comm *cc, coll_xfer *x, int peer, bool is_send, void *buf,
                      size_t len, tp_tag tag, kdeadline dl, kerr *err)
{
	tp_link *link;
	khor_status st;
	int tpi;
	tp_mr *mr = NULL;

	if (cc->map != NULL)
		peer = cc->map[peer]; /* links belong to the world comm; groups share them */
	st = cc->get_link(cc->owner, peer, dl, &link, &tpi, err);
	if (st != KHOR_SUCCESS)
		return st;
	x->peer = peer;
	x->is_send = is_send;
	x->tpi = tpi;
	x->reg = NULL;
	const coll_tp *t = &cc->tps[tpi];
	if (t->cache != NULL && len > t->caps.reg_min) {
		st = post_reg(cc, t, buf, len, &x->reg, err);
		if (st != KHOR_SUCCESS) {
			kerr_prefix(err, "%s %zu B %s rank %d (comm %u, seq %u, step %u) over %s",
			            is_send ? "sending" : "receiving", len, is_send ? "to" : "from", peer,
			            tag.comm, tag.seq, tag.step, t->ops->name);
			return st;
		}
		mr = regcache_mr(x->reg);
	}
	if (is_send)
		st = t->ops->isend(link, buf, len, tag, mr, &x->req, err);
	else
		st = t->ops->irecv(link, buf, len, tag, mr, &x->req, err);
	if (st != KHOR_SUCCESS && x->reg != NULL) {
		regcache_put(t->cache, x->reg);
		x->reg = NULL;
	}
	return st;
}

bool coll_done(coll_comm *cc, coll_xfer *x, khor_status *st, kerr *err)
{
	bool done = false;
	khor_status s;

	if (x->req == NULL)
		return true;
	s = cc->tps[x->tpi].ops->test(x->req, &done, err);
	if (done) {
		x->req = NULL;
		if (x->reg != NULL) {
			regcache_put(cc->tps[x->tpi].cache, x->reg);
			x->reg = NULL;
		}
	}
	if (s != KHOR_SUCCESS && *st == KHOR_SUCCESS)
		*st = s;
	return done;
}

void *coll_big(coll_comm *cc, size_t len)
{
	if (*cc->big_len < len) {
		void *p = malloc(len);
		if (p == NULL)
			return NULL;
		for (int i = 0; i < cc->ntps; i++)
			regcache_invalidate(cc->tps[i].cache, *cc->big, *cc->big_len);
		free(*cc->big);
		*cc->big = p;
		*cc->big_len = len;
	}
	return *cc->big;
}

khor_status coll_progress(coll_comm *cc, int timeout_ms, unsigned sleep_mask, bool *moved,
                          kerr *err)
{
	bool any = false;
	int sleeper = -1, nsleep = 0;

	if (cc->ntps == 1)
		return cc->tps[0].ops->progress(cc->tps[0].ctx, timeout_ms, moved, err);
	for (int i = 0; i < cc->ntps; i++) {
		if (sleep_mask & (1u << i)) {
			sleeper = sleeper < 0 ? i : sleeper;
			nsleep++;
		}
	}
	/*
	 * Poll the others without sleeping, then sleep where the awaited traffic will land.
	 * Transports nobody waits on are only looked at every 64th call (they may hold a
	 * peer's connection handshake): an idle epoll_wait would cost more than a shared-memory
	 * round trip.
	 */
	cc->poll_count++;
	for (int i = 0; i < cc->ntps; i++) {
		if (i == sleeper && nsleep == 1)
			continue;
		if (!(sleep_mask & (1u << i)) && (cc->poll_count & 63) != 0 && timeout_ms == 0)
			continue;
		bool m = false;
		khor_status st = cc->tps[i].ops->progress(cc->tps[i].ctx, 0, &m, err);
		if (st != KHOR_SUCCESS)
			return st;
		any |= m;
	}
	if (sleeper >= 0 && (nsleep == 1 || !any)) {
		/* Several transports awaited: a 1 ms slice each, so neither waits long on the other. */
		int t = any ? 0 : (nsleep == 1 ? timeout_ms : (timeout_ms < 1 ? timeout_ms : 1));
		bool m = false;
		khor_status st = cc->tps[sleeper].ops->progress(cc->tps[sleeper].ctx, t, &m, err);
		if (st != KHOR_SUCCESS)
			return st;
		any |= m;
	}
	if (moved != NULL)
		*moved = any;
	return KHOR_SUCCESS;
}

void coll_wait_init(coll_comm *cc, coll_wait *w, const char *what)
{
	w->dl = kdeadline_in_ms(cc->timeout_ms);
	w->started_ns = kclock_ns();
	w->last_abort_check_ns = w->started_ns;
	w->what = what;
	w->fmt = NULL;
}

void coll_wait_begin(coll_comm *cc, coll_wait *w, const char *fmt, uint32_t seq, int root)
{
	coll_wait_init(cc, w, NULL);
	w->fmt = fmt;
	w->seq = seq;
	w->root = root;
}

const char *coll_wait_what(coll_wait *w)
{
	if (w->what == NULL) {
		snprintf(w->buf, sizeof(w->buf), w->fmt != NULL ? w->fmt : "collective seq %u",
		         w->seq, w->root);
		w->what = w->buf;
	}
	return w->what;
}

void coll_wait_fail(coll_wait *w, kerr *err, const char *detail, ...)
{
	const char *what = coll_wait_what(w);
	char buf[128];
	va_list ap;

	if (err->text[0] == '\0' || strncmp(err->text, what, strlen(what)) == 0)
		return;
	va_start(ap, detail);
	vsnprintf(buf, sizeof(buf), detail, ap);
	va_end(ap);
	kerr_prefix(err, "%s%s", what, buf);
}

/* How long a wait spins before it starts to yield the core now and then. */
#define SPIN_PURE_NS 20000

khor_status coll_wait_step(coll_comm *cc, coll_wait *w, const coll_xfer *xs, int nxs, kerr *err)
{
	khor_status st;
	uint64_t now, spin_start, spin_end;
	bool moved = false;

	/*
	 * Spin first: a reply on loopback or a fast network comes back in a few microseconds,
	 * far sooner than a sleeping process is woken. When ranks outnumber cores, sched_yield
	 * hands the core to the rank we are waiting for instead of burning its time slice.
	 */
	unsigned mask = 0;
	for (int i = 0; i < nxs; i++)
		if (xs[i].req != NULL)
			mask |= 1u << xs[i].tpi;
	if (mask == 0)
		mask = (1u << cc->ntps) - 1;
	/* Take a spinner's place if one is free (coll.h: max_spinners); else go to sleep. */
	const bool spin = cc->spinning == NULL ||
	                  atomic_fetch_add(cc->spinning, 1) < cc->max_spinners;
	st = KHOR_SUCCESS;
	spin_start = kclock_ns();
	spin_end = spin_start + cc->spin_ns;
	for (unsigned i = 1; spin; i++) {
		st = coll_progress(cc, 0, mask, &moved, err);
		if (st != KHOR_SUCCESS || moved)
			break;
		if (cc->spin_yield)
			sched_yield();
		/* Reading the clock costs as much as a poll of shared memory: do it now and then. */
		if ((i & 15) == 0) {
			now = kclock_ns();
			if (now >= spin_end)
				break;
			/*
			 * Past the first microseconds, yield now and then even with a core per rank:
			 * a peer that the scheduler (or a taskset) put on our core would otherwise wait
			 * out our whole spin for every message, 300 us for a 10 us swap. With nothing
			 * else to run, sched_yield returns at once.
			 */
			if (!cc->spin_yield && now - spin_start >= SPIN_PURE_NS)
				sched_yield();
		}
	}
	if (cc->spinning != NULL)
		atomic_fetch_sub(cc->spinning, 1); /* our place, or the one we found taken */
	if (st != KHOR_SUCCESS || moved)
		return st;
	st = coll_progress(cc, kdeadline_left_ms(w->dl, 200), mask, NULL, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (kdeadline_passed(w->dl)) {
		char peers[256] = "";
		size_t off = 0;
		int first = -1;
		for (int i = 0; i < nxs && off + 32 < sizeof(peers); i++) {
			if (xs[i].req == NULL)
				continue;
			if (first < 0 || !xs[i].is_send)
				first = first < 0 || !xs[i].is_send ? xs[i].peer : first;
			off += (size_t)snprintf(peers + off, sizeof(peers) - off, "%s%s rank %d",
			                        off ? "," : "", xs[i].is_send ? " sending to" : " receiving from",
			                        xs[i].peer);
		}
		kerr_set(err, KHOR_ERR_TIMEOUT,
		         "%s: timed out after %lld ms (KHOR_TIMEOUT), still waiting on:%s; "
		         "that rank is hung, slow, or did not call the same collective",
		         coll_wait_what(w), (long long)cc->timeout_ms, off ? peers : " (nothing?)");
		err->peer = first;
		return KHOR_ERR_TIMEOUT;
	}
	now = kclock_ns();
	if (cc->check_abort != NULL && now - w->last_abort_check_ns > 1000000000ull) {
		w->last_abort_check_ns = now;
		return cc->check_abort(cc->owner, err);
	}
	return KHOR_SUCCESS;
}

void coll_drain(coll_comm *cc, coll_xfer *xs, int nxs)
{
	for (int i = 0; i < nxs; i++) {
		if (xs[i].req != NULL) {
			cc->tps[xs[i].tpi].ops->cancel(xs[i].req);
			xs[i].req = NULL;
			if (xs[i].reg != NULL) {
				regcache_put(cc->tps[xs[i].tpi].cache, xs[i].reg);
				xs[i].reg = NULL;
			}
		}
	}
}

khor_status coll_sendrecv(coll_comm *cc, coll_wait *w, int send_peer, const void *sbuf,
                          size_t slen, int recv_peer, void *rbuf, size_t rlen, tp_tag tag,
                          kerr *err)
{
	coll_xfer x[2];
	khor_status st = KHOR_SUCCESS;

	memset(x, 0, sizeof(x));
	if (recv_peer >= 0)
		st = coll_post(cc, &x[0], recv_peer, false, rbuf, rlen, tag, w->dl, err);
	if (st == KHOR_SUCCESS && send_peer >= 0)
		st = coll_post(cc, &x[1], send_peer, true, (void *)sbuf, slen, tag, w->dl, err);
	while (st == KHOR_SUCCESS) {
		bool a = coll_done(cc, &x[0], &st, err);
		bool b = coll_done(cc, &x[1], &st, err);
		if (st != KHOR_SUCCESS || (a && b))
			break;
		st = coll_wait_step(cc, w, x, 2, err);
	}
	if (st != KHOR_SUCCESS)
		coll_drain(cc, x, 2);
	return st;
}

void coll_lane_range(size_t count, int n, int b, size_t index, size_t slice_el, size_t *off,
                     size_t *len)
{
	size_t base = count / (size_t)n, rem = count % (size_t)n;
	size_t blen = base + ((size_t)b < rem ? 1 : 0);
	size_t boff = base * (size_t)b + ((size_t)b < rem ? (size_t)b : rem);
	size_t lo = index * slice_el, hi = lo + slice_el;

	if (lo > blen)
		lo = blen;
	if (hi > blen)
		hi = blen;
	*off = boff + lo;
	*len = hi - lo;
}

static bool meta_conflict(uint32_t a, uint32_t b)
{
	return (a >> 24) != 0 && (b >> 24) != 0 && a != b;
}

static const char *meta_describe(uint32_t meta, char *buf, size_t len)
{
	static const char *const colls[COLL_KINDS] = {
		"allreduce", "broadcast", "barrier", "reduce", "allgather", "reducescatter",
		"alltoall", "gather", "scatter", "probe", "comm split", "engine negotiation",
	};
	static const char *const scheds[] = { "", ", ring", ", recursive doubling",
	                                      ", double binary tree", ", halving-doubling" };
	unsigned c = meta >> 16 & 0xff, d = meta >> 8 & 0xff, o = meta & 0xff, s = meta >> 24;

	snprintf(buf, len, "%s %s %s%s", c < COLL_KINDS ? colls[c] : "?", kdtype_name(d),
	         kop_name(o), s < 5 ? scheds[s] : ", ?");
	return buf;
}

const tp_meta_rules coll_meta_rules = { .conflict = meta_conflict, .describe = meta_describe };
