/* coll.c -- posting, testing and the deadline-bounded wait shared by all algorithms. */
#include "coll.h"

#include "base/dtype.h"
#include "base/log.h"
#include "reduce.h"

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
                            tp_mem_kind kind, regcache_entry **reg_out, kerr *err)
{
	const uintptr_t p = (uintptr_t)buf;
	tp_reg_desc d = {
		.buf = buf, .len = len, .kind = kind, .dmabuf_fd = -1,
		.access = TP_ACCESS_LOCAL_WRITE | TP_ACCESS_REMOTE_WRITE | TP_ACCESS_REMOTE_READ,
	};
	uint64_t scope = REGCACHE_ONESHOT;
	const coll_reg_call *rc = cc->reg_call;

	if (coll_on_device(cc)) {
		/* The device scratch and temps are freed by mem.c, which knows no registration
		 * caches: they go one-shot; the call's own buffers as the runtime says (below). */
	} else if (inside(p, len, cc->scratch, cc->scratch_len)) {
		d.buf = cc->scratch;
		d.len = cc->scratch_len;
		scope = REGCACHE_KEEP;
	} else if (cc->big != NULL && inside(p, len, *cc->big, *cc->big_len)) {
		d.buf = *cc->big;
		d.len = *cc->big_len;
		scope = REGCACHE_KEEP;
	}
	if (scope == REGCACHE_ONESHOT) {
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

/*
 * Device memory, per transfer (coll_xfer.stage). A transport that can't take device
 * memory (tcp, shm; ib where GPUDirect registration fails) gets it through a pinned slot:
 *
 *   send:  copy device -> slot on the stream ... STAGE_D2H ... isend(slot) ... STAGE_NET
 *   recv:  irecv(slot) ... STAGE_NET ... copy slot -> device on the stream; done (the slot
 *          goes back to the pool once that copy has run: kmem_pool_put_after)
 *
 * so a schedule's lanes overlap the copy of one slice with the wire of another, and what
 * a stream-ordered kernel wrote before a send is what goes out. A transport that takes
 * device memory (caps.device_mem, and the registration worked) gets the buffer itself
 * once the stream has reached the post (STAGE_PRE: what a kernel writes must be there
 * before the wire reads it, and what one reads must be read before a receive overwrites
 * it), and a receive is flushed (caps.needs_flush) before it counts as done (STAGE_FLUSH).
 */
enum {
	STAGE_NONE = 0,
	STAGE_PRE,   /* direct: waiting for the stream before posting */
	STAGE_D2H,   /* staged send: waiting for the copy into the slot */
	STAGE_NET,   /* staged: on the wire through the slot */
	STAGE_FLUSH, /* direct receive: its flush is in flight */
};

static khor_status post_plain(coll_comm *cc, coll_xfer *x, const coll_tp *t, void *buf,
                              size_t len, tp_mem_kind kind, kerr *err)
{
	tp_mr *mr = NULL;
	khor_status st;

	if (x->reg != NULL) {
		mr = regcache_mr(x->reg); /* taken before (device_direct) */
	} else if (t->cache != NULL && len > t->caps.reg_min) {
		st = post_reg(cc, t, buf, len, kind, &x->reg, err);
		if (st != KHOR_SUCCESS) {
			kerr_prefix(err, "%s %zu B %s rank %d (comm %u, seq %u, step %u) over %s",
			            x->is_send ? "sending" : "receiving", len, x->is_send ? "to" : "from",
			            x->peer, x->tag.comm, x->tag.seq, x->tag.step, t->ops->name);
			return st;
		}
		mr = regcache_mr(x->reg);
	}
	if (x->is_send)
		st = t->ops->isend(x->link, buf, len, x->tag, mr, &x->req, err);
	else
		st = t->ops->irecv(x->link, buf, len, x->tag, mr, &x->req, err);
	if (st != KHOR_SUCCESS && x->reg != NULL) {
		regcache_put(t->cache, x->reg);
		x->reg = NULL;
	}
	return st;
}

/*
 * Whether t takes the device buffer buf itself, with the registration it will post with
 * (*reg_out); says once per comm why not, when it can't. Messages the transport copies
 * into its own memory (up to caps.reg_min: ib's eager slots) are staged: that copy is
 * the CPU's.
 */
static bool device_direct(coll_comm *cc, const coll_tp *t, void *buf, size_t len,
                          regcache_entry **reg_out)
{
	const unsigned bit = 1u << (t - cc->tps), said = bit << 16;
	kmem_state *m = cc->mem;
	kerr e;

	if (!t->caps.device_mem || t->cache == NULL || len <= t->caps.reg_min ||
	    (m->no_direct & bit))
		return false;
	kerr_clear(&e);
	if (post_reg(cc, t, buf, len, TP_MEM_CUDA, reg_out, &e) == KHOR_SUCCESS)
		return true;
	if (!(m->no_direct & said))
		KLOG_INFO("%s can't take %s memory directly (%s): device buffers go through pinned "
		          "host memory instead", t->ops->name, m->be->name, e.text);
	m->no_direct |= said;
	/* It can't at all (no GPUDirect here): stop asking it, post after post. */
	if (e.status == KHOR_ERR_NOT_SUPPORTED)
		m->no_direct |= bit;
	return false;
}

static khor_status post_device(coll_comm *cc, coll_xfer *x, const coll_tp *t, void *buf,
                               size_t len, kerr *err)
{
	kmem_state *m = cc->mem;
	const kmem_backend *be = m->be;
	khor_status st;

	x->buf = buf;
	x->len = len;
	if (device_direct(cc, t, buf, len, &x->reg)) {
		/* x->reg is the post's registration now (post_plain uses it, coll_done puts it). */
		if ((st = kmem_event_get(m, &x->ev, err)) == KHOR_SUCCESS &&
		    (st = be->event_record(x->ev, m->stream, err)) == KHOR_SUCCESS) {
			x->stage = STAGE_PRE;
			return KHOR_SUCCESS;
		}
		kmem_event_put(m, x->ev);
		x->ev = NULL;
		regcache_put(t->cache, x->reg);
		x->reg = NULL;
		return st;
	}
	if ((st = kmem_pool_get(m, len, &x->slot, err)) != KHOR_SUCCESS)
		return st;
	void *slot = m->pool[x->slot].p;
	if (!x->is_send) {
		st = post_plain(cc, x, t, slot, len, TP_MEM_HOST, err);
		if (st != KHOR_SUCCESS) {
			kmem_pool_put(m, x->slot);
			x->slot = -1;
			return st;
		}
		x->stage = STAGE_NET;
		return KHOR_SUCCESS;
	}
	if ((st = kmem_event_get(m, &x->ev, err)) == KHOR_SUCCESS &&
	    (st = be->copy(slot, buf, len, m->stream, err)) == KHOR_SUCCESS &&
	    (st = be->event_record(x->ev, m->stream, err)) == KHOR_SUCCESS) {
		x->stage = STAGE_D2H;
		return KHOR_SUCCESS;
	}
	/* The stream failed: the device is in error and the comm fails with it. The slot
	 * stays busy rather than be reused under a copy that might still run. */
	kmem_event_put(m, x->ev);
	x->ev = NULL;
	x->slot = -1;
	return st;
}

khor_status coll_post(coll_comm *cc, coll_xfer *x, int peer, bool is_send, void *buf,
                      size_t len, tp_tag tag, kdeadline dl, kerr *err)
{
	tp_link *link;
	khor_status st;
	int tpi;

	if (cc->map != NULL)
		peer = cc->map[peer]; /* links belong to the world comm; groups share them */
	st = cc->get_link(cc->owner, peer, dl, &link, &tpi, err);
	if (st != KHOR_SUCCESS)
		return st;
	x->peer = peer;
	x->is_send = is_send;
	x->tpi = tpi;
	x->reg = NULL;
	x->req = NULL;
	x->stage = STAGE_NONE;
	x->slot = -1;
	x->ev = NULL;
	x->buf = buf;
	x->len = len;
	x->link = link;
	x->tag = tag;
	const coll_tp *t = &cc->tps[tpi];
	if (!coll_on_device(cc))
		return post_plain(cc, x, t, buf, len, TP_MEM_HOST, err);
	x->tag.meta |= COLL_META_DEVICE;
	if (len == 0)
		return post_plain(cc, x, t, buf, 0, TP_MEM_HOST, err);
	st = post_device(cc, x, t, buf, len, err);
	if (st != KHOR_SUCCESS)
		kerr_prefix(err, "%s %zu B of %s memory %s rank %d (comm %u, seq %u, step %u)",
		            is_send ? "sending" : "receiving", len, cc->mem->be->name,
		            is_send ? "to" : "from", peer, tag.comm, tag.seq, tag.step);
	return st;
}

/* A transfer's registration, once nothing of it uses it any more. */
static void put_reg(coll_comm *cc, coll_xfer *x)
{
	if (x->reg != NULL) {
		regcache_put(cc->tps[x->tpi].cache, x->reg);
		x->reg = NULL;
	}
}

/* Moves a device transfer on by one stage when it can; true when it is done. */
static bool device_step(coll_comm *cc, coll_xfer *x, khor_status *st, kerr *err)
{
	kmem_state *m = cc->mem;
	const coll_tp *t = &cc->tps[x->tpi];
	bool done = false;
	khor_status s = KHOR_SUCCESS;

	switch (x->stage) {
	case STAGE_PRE:
	case STAGE_D2H:
		s = m->be->event_query(x->ev, &done, err);
		if (s != KHOR_SUCCESS || !done)
			break;
		done = false;
		kmem_event_put(m, x->ev);
		x->ev = NULL;
		if (x->stage == STAGE_PRE) {
			x->stage = STAGE_NONE; /* a plain transfer of the device buffer from now on */
			s = post_plain(cc, x, t, x->buf, x->len, TP_MEM_CUDA, err);
			break;
		}
		s = post_plain(cc, x, t, m->pool[x->slot].p, x->len, TP_MEM_HOST, err);
		if (s != KHOR_SUCCESS) {
			kmem_pool_put(m, x->slot);
			x->slot = -1;
			x->stage = STAGE_NONE;
			break;
		}
		x->stage = STAGE_NET;
		break;
	case STAGE_NET: {
		s = t->ops->test(x->req, &done, err);
		if (!done)
			break;
		x->req = NULL;
		cc->completed++;
		put_reg(cc, x);
		x->stage = STAGE_NONE;
		if (x->is_send || s != KHOR_SUCCESS) {
			kmem_pool_put(m, x->slot);
			x->slot = -1;
			break;
		}
		void *ev = NULL;
		khor_status c = kmem_event_get(m, &ev, err);
		if (c == KHOR_SUCCESS)
			c = m->be->copy(x->buf, m->pool[x->slot].p, x->len, m->stream, err);
		if (c == KHOR_SUCCESS)
			c = m->be->event_record(ev, m->stream, err);
		if (c == KHOR_SUCCESS)
			kmem_pool_put_after(m, x->slot, ev); /* free once the copy has run */
		else
			kmem_event_put(m, ev); /* the slot stays busy: a copy may still read it */
		x->slot = -1;
		s = c;
		break;
	}
	case STAGE_FLUSH:
		s = t->ops->test(x->req, &done, err);
		if (done) {
			x->req = NULL;
			x->stage = STAGE_NONE;
			put_reg(cc, x);
		}
		break;
	}
	if (s != KHOR_SUCCESS && *st == KHOR_SUCCESS)
		*st = s;
	return done && x->stage == STAGE_NONE;
}

/* Once a direct receive into device memory is complete, flush it where the transport needs
 * that before a kernel may read it; true when nothing more is to wait for. */
static bool flush_after(coll_comm *cc, coll_xfer *x, khor_status *s, kerr *err)
{
	const coll_tp *t = &cc->tps[x->tpi];
	tp_req *fr = NULL;

	/* x->reg, the receive's own registration, is the flush's too; put once it is done. */
	if (!coll_on_device(cc) || x->is_send || x->len == 0 || !t->caps.needs_flush ||
	    t->ops->flush == NULL || x->reg == NULL)
		return true;
	*s = t->ops->flush(x->link, x->buf, x->len, regcache_mr(x->reg), &fr, err);
	if (*s != KHOR_SUCCESS || fr == NULL)
		return true;
	x->req = fr;
	x->stage = STAGE_FLUSH;
	return false;
}

bool coll_done(coll_comm *cc, coll_xfer *x, khor_status *st, kerr *err)
{
	bool done = false;
	khor_status s;

	if (x->stage != STAGE_NONE)
		return device_step(cc, x, st, err);
	if (x->req == NULL)
		return true;
	s = cc->tps[x->tpi].ops->test(x->req, &done, err);
	if (done) {
		x->req = NULL;
		cc->completed++;
		if (s == KHOR_SUCCESS)
			done = flush_after(cc, x, &s, err);
		if (done)
			put_reg(cc, x);
	}
	if (s != KHOR_SUCCESS && *st == KHOR_SUCCESS)
		*st = s;
	return done;
}

khor_status coll_copy(coll_comm *cc, void *dst, const void *src, size_t bytes, kerr *err)
{
	if (dst == src || bytes == 0)
		return KHOR_SUCCESS;
	if (!coll_on_device(cc)) {
		memmove(dst, src, bytes);
		return KHOR_SUCCESS;
	}
	const kmem_backend *be = cc->mem->be;
	uint8_t *d = dst;
	const uint8_t *s = src;
	if (d + bytes <= s || s + bytes <= d)
		return be->copy(dst, src, bytes, cc->mem->stream, err);
	/*
	 * Overlap (a block that is already near its place: allgather's sendbuf inside
	 * recvbuf). Device copies don't take it, so move pieces no longer than the distance,
	 * in the order memmove would: each piece's source is read before anything lands on it.
	 */
	const size_t gap = d < s ? (size_t)(s - d) : (size_t)(d - s);
	for (size_t done = 0; done < bytes;) {
		size_t n = bytes - done < gap ? bytes - done : gap;
		size_t off = d < s ? done : bytes - done - n;
		khor_status st = be->copy(d + off, s + off, n, cc->mem->stream, err);
		if (st != KHOR_SUCCESS)
			return st;
		done += n;
	}
	return KHOR_SUCCESS;
}

khor_status coll_reduce(coll_comm *cc, void *dst, const void *a, const void *b, size_t count,
                        khor_dtype dtype, khor_op op, kerr *err)
{
	if (count == 0)
		return KHOR_SUCCESS;
	if (!coll_on_device(cc)) {
		reduce_kernel(dtype, op)(dst, a, b, count);
		return KHOR_SUCCESS;
	}
	return cc->mem->be->reduce(dst, a, b, count, dtype, op, cc->mem->stream, err);
}

khor_status coll_avg_finish(coll_comm *cc, void *buf, size_t count, khor_dtype dtype, int n,
                            kerr *err)
{
	if (count == 0 || n <= 1)
		return KHOR_SUCCESS;
	if (!coll_on_device(cc)) {
		reduce_avg_finish(buf, count, dtype, n);
		return KHOR_SUCCESS;
	}
	return cc->mem->be->avg_finish(buf, count, dtype, n, cc->mem->stream, err);
}

void *coll_scratch(coll_comm *cc)
{
	if (!coll_on_device(cc))
		return cc->scratch;
	return cc->mem->scratch;
}

/*
 * The host half of coll_big and coll_tmp: *buf grown to len bytes, its registrations
 * dropped when it moves. A device call's buffers are mem.c's (slot 0 big, 1 tmp); its
 * errors go to the log, since these callers report "out of memory" of their own.
 */
static void *grow(coll_comm *cc, void **buf, size_t *buf_len, int slot, size_t len)
{
	if (coll_on_device(cc)) {
		kerr e;
		kerr_clear(&e);
		void *p = kmem_state_buffer(cc->mem, slot, len, &e);
		if (p == NULL && e.text[0] != '\0')
			KLOG_WARN("a %zu B device temp buffer: %s", len, e.text);
		return p;
	}
	if (*buf_len < len) {
		void *p = malloc(len);
		if (p == NULL)
			return NULL;
		for (int i = 0; i < cc->ntps; i++)
			regcache_invalidate(cc->tps[i].cache, *buf, *buf_len);
		free(*buf);
		*buf = p;
		*buf_len = len;
	}
	return *buf;
}

void *coll_tmp(coll_comm *cc, size_t len)
{
	return grow(cc, cc->tmp, cc->tmp_len, 1, len);
}

void *coll_big(coll_comm *cc, size_t len)
{
	return grow(cc, cc->big, cc->big_len, 0, len);
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
	/* The tick clock: this runs on every call, and a deadline a tick late does no harm. */
	w->dl = kdeadline_in_ms_coarse(cc->timeout_ms, &w->started_ns);
	w->last_abort_check_ns = w->started_ns;
	w->moves = 0;
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
	bool device = false; /* a transfer waits for the device, not the wire */
	for (int i = 0; i < nxs; i++) {
		if (xs[i].req != NULL)
			mask |= 1u << xs[i].tpi;
		device |= xs[i].stage == STAGE_PRE || xs[i].stage == STAGE_D2H;
	}
	if (mask == 0)
		mask = (1u << cc->ntps) - 1;
	if (device) {
		/* No sleep in a transport: nothing would wake it when the copy is done. */
		st = coll_progress(cc, 0, mask, &moved, err);
		if (st != KHOR_SUCCESS || (moved && (++w->moves & 15) != 0))
			return st;
		if (!moved)
			sched_yield();
		goto deadline;
	}
	/* Take a spinner's place if one is free (coll.h: max_spinners); else go to sleep. */
	const bool spin = cc->spinning == NULL ||
	                  atomic_fetch_add(cc->spinning, 1) < cc->max_spinners;
	st = KHOR_SUCCESS;
	spin_start = spin_end = 0; /* from the first look at the clock: most waits end before */
	for (unsigned i = 1; spin; i++) {
		st = coll_progress(cc, 0, mask, &moved, err);
		if (st != KHOR_SUCCESS || moved)
			break;
		if (cc->spin_yield)
			sched_yield();
		/* Reading the clock costs as much as a poll of shared memory: do it now and then. */
		if ((i & 15) == 0) {
			now = kclock_ns();
			if (spin_end == 0) {
				spin_start = now;
				spin_end = now + cc->spin_ns;
			}
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
	/*
	 * Progress of the transport is not this wait's: another comm's traffic on the same
	 * links, or a transport that reports movement it did not make, would otherwise keep
	 * a wait whose own transfers never complete from ever looking at its deadline.
	 */
	if (st != KHOR_SUCCESS || (moved && (++w->moves & 15) != 0))
		return st;
	if (moved)
		goto deadline;
	st = coll_progress(cc, kdeadline_left_ms(w->dl, 200), mask, NULL, err);
	if (st != KHOR_SUCCESS)
		return st;
deadline:
	if (kdeadline_passed(w->dl)) {
		st = coll_wait_alive(cc, coll_wait_what(w), xs, nxs, w->started_ns, &w->dl, err);
		if (st != KHOR_ERR_TIMEOUT)
			return st;
		char peers[256] = "";
		size_t off = 0;
		int first = -1;
		for (int i = 0; i < nxs && off + 48 < sizeof(peers); i++) {
			if (!coll_pending(&xs[i]))
				continue;
			if (first < 0 || !xs[i].is_send)
				first = first < 0 || !xs[i].is_send ? xs[i].peer : first;
			off += (size_t)snprintf(peers + off, sizeof(peers) - off, "%s%s rank %d%s",
			                        off ? "," : "", xs[i].is_send ? " sending to" : " receiving from",
			                        xs[i].peer, xs[i].stage == STAGE_PRE ||
			                        xs[i].stage == STAGE_D2H ? " (waiting for the device)" : "");
		}
		kerr_set(err, KHOR_ERR_TIMEOUT,
		         "%s: timed out after %lld ms (KHOR_TIMEOUT), still waiting on:%s; "
		         "that rank is hung, slow, or did not call the same collective",
		         coll_wait_what(w), (long long)cc->timeout_ms, off ? peers : " (nothing?)");
		err->peer = first;
		return KHOR_ERR_TIMEOUT;
	}
	now = kclock_ns();
	if (cc->check_abort != NULL &&
	    ((cc->aborted != NULL && atomic_load_explicit(cc->aborted, memory_order_relaxed)) ||
	     now - w->last_abort_check_ns > 1000000000ull)) {
		w->last_abort_check_ns = now;
		return cc->check_abort(cc->owner, err);
	}
	return KHOR_SUCCESS;
}

/* Whether x waits for its peer, not for this rank's device. */
static bool on_wire(const coll_xfer *x)
{
	return x->req != NULL && x->stage != STAGE_PRE && x->stage != STAGE_D2H &&
	       x->stage != STAGE_FLUSH;
}

static khor_status wait_alive(coll_comm *cc, const char *what, bool quiet, const coll_xfer *xs,
                              int nxs, uint64_t started_ns, kdeadline *dl, kerr *err)
{
	int few[32], *peers = few, n = 0;
	int64_t again;
	khor_status st;

	if (cc->check_alive == NULL)
		return KHOR_ERR_TIMEOUT;
	if (nxs > 32 && (peers = malloc((size_t)nxs * sizeof(int))) == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory", what);
	for (int i = 0; i < nxs; i++) {
		int k = 0;
		if (!on_wire(&xs[i]))
			continue;
		while (k < n && peers[k] != xs[i].peer)
			k++;
		if (k == n)
			peers[n++] = xs[i].peer;
	}
	st = KHOR_ERR_TIMEOUT;
	if (n > 0) {
		coll_alive_ask q = { .what = what, .peers = peers, .n = n,
		                     .waited_ms = (int64_t)((kclock_ns() - started_ns) / 1000000),
		                     .progress = cc->completed, .quiet = quiet };
		st = cc->check_alive(cc->owner, &q, &again, err);
		if (st == KHOR_SUCCESS)
			*dl = kdeadline_in_ms(again);
	}
	if (peers != few)
		free(peers);
	return st;
}

khor_status coll_wait_alive(coll_comm *cc, const char *what, const coll_xfer *xs, int nxs,
                            uint64_t started_ns, kdeadline *dl, kerr *err)
{
	return wait_alive(cc, what, false, xs, nxs, started_ns, dl, err);
}

khor_status coll_wait_alive_quiet(coll_comm *cc, const char *what, const coll_xfer *xs,
                                  int nxs, uint64_t started_ns, kdeadline *dl, kerr *err)
{
	return wait_alive(cc, what, true, xs, nxs, started_ns, dl, err);
}

void coll_drain(coll_comm *cc, coll_xfer *xs, int nxs)
{
	for (int i = 0; i < nxs; i++) {
		coll_xfer *x = &xs[i];
		if (x->req != NULL) {
			cc->tps[x->tpi].ops->cancel(x->req);
			x->req = NULL;
		}
		put_reg(cc, x);
		if (x->stage != STAGE_NONE && x->slot >= 0 && cc->mem != NULL) {
			/* A copy into the slot may still be queued (STAGE_D2H): free it after that. */
			if (x->ev != NULL)
				kmem_pool_put_after(cc->mem, x->slot, x->ev);
			else
				kmem_pool_put(cc->mem, x->slot);
			x->ev = NULL;
			x->slot = -1;
		}
		if (x->stage != STAGE_NONE && x->ev != NULL && cc->mem != NULL)
			kmem_event_put(cc->mem, x->ev);
		x->ev = NULL;
		x->stage = STAGE_NONE;
	}
}

/* The pair of lane i of an array of lanes whose pairs lie stride bytes apart. */
static inline coll_xfer *lane_pair(const coll_xfer *first, size_t stride, int i)
{
	return (coll_xfer *)((const char *)first + (size_t)i * stride);
}

khor_status coll_lanes_wait(coll_comm *cc, coll_wait *w, const coll_xfer *first, size_t stride,
                            int nlanes, kerr *err)
{
	coll_xfer xs[2 * COLL_MAX_LANES];

	if (nlanes > COLL_MAX_LANES)
		return kerr_set(err, KHOR_ERR_INTERNAL, "%s: %d lanes, more than the %d a wait "
		                "takes", coll_wait_what(w), nlanes, COLL_MAX_LANES);
	for (int i = 0; i < nlanes; i++) {
		const coll_xfer *x = lane_pair(first, stride, i);
		xs[2 * i] = x[0];
		xs[2 * i + 1] = x[1];
	}
	return coll_wait_step(cc, w, xs, 2 * nlanes, err);
}

void coll_lanes_drain(coll_comm *cc, coll_xfer *first, size_t stride, int nlanes)
{
	for (int i = 0; i < nlanes; i++)
		coll_drain(cc, lane_pair(first, stride, i), 2);
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
	const uint32_t sa = a >> 24 & 0x7f, sb = b >> 24 & 0x7f;

	if ((a ^ b) & COLL_META_DEVICE)
		return true; /* one side's buffers are device memory, the other's host memory */
	return sa != 0 && sb != 0 && a != b;
}

static const char *meta_describe(uint32_t meta, char *buf, size_t len)
{
	static const char *const colls[COLL_KINDS] = {
		"allreduce", "broadcast", "barrier", "reduce", "allgather", "reducescatter",
		"alltoall", "gather", "scatter", "probe", "comm split", "engine negotiation",
	};
	static const char *const scheds[] = { "", ", ring", ", recursive doubling",
	                                      ", double binary tree", ", halving-doubling" };
	unsigned c = meta >> 16 & 0xff, d = meta >> 8 & 0xff, o = meta & 0xff, s = meta >> 24 & 0x7f;

	snprintf(buf, len, "%s %s %s%s%s", c < COLL_KINDS ? colls[c] : "?", kdtype_name(d),
	         kop_name(o), s < 5 ? scheds[s] : ", ?",
	         meta & COLL_META_DEVICE ? " on device memory" : " on host memory");
	return buf;
}

const tp_meta_rules coll_meta_rules = { .conflict = meta_conflict, .describe = meta_describe };
