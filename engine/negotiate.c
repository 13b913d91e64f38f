/*
 * negotiate.c -- one cycle of a process set's negotiation: which tensors are ready on every
 * member, in which order they run, and which fail (mismatch, stall, join, stop).
 *
 * The coordinator is the set's rank 0. A cycle k is started by whoever has news: a worker
 * with new tensors sends its report (REQ) at once; the coordinator, once it has news of its
 * own or a report, asks the workers that have not reported yet (GO), collects every report,
 * and answers each worker with the cycle's responses (RESP). Every rank then applies the
 * same responses in the same order, which keeps the response cache and the fusion plan
 * identical everywhere. Messages per cycle, worker w and coordinator c:
 *
 *   w has news:   w --REQ(k)--> c          c --RESP(k), step 0--> w
 *   w had none:   c --GO(k), step 0--> w   w --REQ(k)--> c   c --RESP(k), step 2--> w
 *
 * A worker learns from the first message of the cycle (step 0) whether the RESP is that
 * message or comes later (step 2), so no receive is ever left posted for a message that
 * will not come. Each message is a 256-byte header carrying up to 240 bytes of payload; a
 * longer payload follows as a second frame (step + 1) of the length the header gives.
 * Between cycles nobody sends anything: an idle set sleeps in the transport, and an enqueue
 * wakes it (transport wake).
 *
 * The response cache: a tensor run once gets a slot, the same on every rank (slots are
 * given while applying responses, in order, LRU when full). Later reports of it with the
 * same descriptor name the slot (4 bytes) instead of the descriptor, and when every rank
 * named the slot the response does too, so in steady state a cycle is one small message
 * each way per worker.
 *
 * Every rank's report is kept by the coordinator per key with when it came, so a tensor
 * missing on some ranks is visible: the stall inspector names the missing ranks and what
 * they submitted instead.
 */
#include "engine.h"

#include "base/dtype.h"
#include "base/log.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_MAGIC 0x4b4e4547u /* "KNEG" */
#define MSG_INLINE 240
#define MSG_MAX (256u << 20) /* a report or response: 4-byte slots or descriptors, far less */

enum { M_REQ = 1, M_GO, M_RESP, M_ABORT };

typedef struct msg_hdr {
	uint32_t magic;
	uint8_t type;
	uint8_t pad[3];
	uint32_t cycle;
	uint32_t len;
	uint8_t data[MSG_INLINE];
} msg_hdr;

_Static_assert(sizeof(msg_hdr) == 256, "the header is one fixed-size frame");

/* ---- byte buffers ----------------------------------------------------------------------- */

typedef struct bbuf {
	uint8_t *p;
	size_t len, cap;
	bool oom;
} bbuf;

static void bput(bbuf *b, const void *v, size_t n)
{
	if (b->oom || n == 0)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap < 256 ? 256 : b->cap;
		while (cap < b->len + n)
			cap *= 2;
		uint8_t *p = realloc(b->p, cap);
		if (p == NULL) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, v, n);
	b->len += n;
}

static void bput_u8(bbuf *b, uint8_t v) { bput(b, &v, 1); }
static void bput_u16(bbuf *b, uint16_t v) { bput(b, &v, 2); }
static void bput_u32(bbuf *b, uint32_t v) { bput(b, &v, 4); }
static void bput_i32(bbuf *b, int32_t v) { bput(b, &v, 4); }
static void bput_u64(bbuf *b, uint64_t v) { bput(b, &v, 8); }
static void bput_f64(bbuf *b, double v) { bput(b, &v, 8); }

typedef struct brd {
	const uint8_t *p;
	size_t len, off;
	bool bad;
} brd;

static bool bget(brd *r, void *v, size_t n)
{
	if (r->bad || r->off + n > r->len) {
		r->bad = true;
		memset(v, 0, n);
		return false;
	}
	memcpy(v, r->p + r->off, n);
	r->off += n;
	return true;
}

static uint8_t bget_u8(brd *r) { uint8_t v; bget(r, &v, 1); return v; }
static uint16_t bget_u16(brd *r) { uint16_t v; bget(r, &v, 2); return v; }
static uint32_t bget_u32(brd *r) { uint32_t v; bget(r, &v, 4); return v; }
static int32_t bget_i32(brd *r) { int32_t v; bget(r, &v, 4); return v; }
static uint64_t bget_u64(brd *r) { uint64_t v; bget(r, &v, 8); return v; }
static double bget_f64(brd *r) { double v; bget(r, &v, 8); return v; }

/* ---- descriptors -------------------------------------------------------------------------
 * u8 kind, u8 op, u16 n, i32 root, f64 prescale, f64 postscale, then per tensor: u16 name
 * length, the name, u8 dtype, u8 ndim, i64 dims[ndim]. What every rank must agree on (dim 0
 * of allgather and alltoall excepted), and all a rank without the tensor needs to take part.
 */

khor_status desc_make(khor_handle *h, kerr *err)
{
	bbuf b = { 0 };

	bput_u8(&b, (uint8_t)h->kind);
	bput_u8(&b, (uint8_t)h->op);
	bput_u16(&b, (uint16_t)h->n);
	bput_i32(&b, h->root);
	bput_f64(&b, h->prescale);
	bput_f64(&b, h->postscale);
	for (int i = 0; i < h->n; i++) {
		size_t nl = strlen(h->t[i].name);
		bput_u16(&b, (uint16_t)nl);
		bput(&b, h->t[i].name, nl);
		bput_u8(&b, (uint8_t)h->t[i].dtype);
		bput_u8(&b, (uint8_t)h->t[i].ndim);
		for (int d = 0; d < h->t[i].ndim; d++)
			bput_u64(&b, (uint64_t)h->t[i].dims[d]);
	}
	if (b.oom) {
		free(b.p);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "enqueue: out of memory");
	}
	h->desc = b.p;
	h->desc_len = b.len;
	return KHOR_SUCCESS;
}

static void item_free_tensors(eitem *it)
{
	for (int i = 0; i < it->n; i++)
		free(it->t[i].name);
	free(it->t);
	it->t = NULL;
}

/* Parses d into it (kind, op, ...; tensors with names and shapes, no buffers). */
khor_status desc_parse(const uint8_t *d, size_t len, eitem *it, kerr *err)
{
	brd r = { d, len, 0, false };

	memset(it, 0, sizeof(*it));
	it->kind = bget_u8(&r);
	it->op = (khor_op)bget_u8(&r);
	it->n = bget_u16(&r);
	it->root = bget_i32(&r);
	it->prescale = bget_f64(&r);
	it->postscale = bget_f64(&r);
	if (r.bad || it->kind >= EK_KINDS || it->n < 1)
		goto bad;
	it->t = calloc((size_t)it->n, sizeof(*it->t));
	if (it->t == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
	for (int i = 0; i < it->n; i++) {
		etensor *t = &it->t[i];
		uint16_t nl = bget_u16(&r);
		if (r.bad || r.off + nl > len)
			goto bad_free;
		t->name = malloc((size_t)nl + 1);
		if (t->name == NULL) {
			item_free_tensors(it);
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
		}
		memcpy(t->name, d + r.off, nl);
		t->name[nl] = '\0';
		r.off += nl;
		t->dtype = (khor_dtype)bget_u8(&r);
		t->ndim = bget_u8(&r);
		size_t esz = kdtype_size(t->dtype);
		if (t->ndim > ENG_MAX_DIMS || esz == 0)
			goto bad_free;
		t->count = 1;
		for (int k = 0; k < t->ndim; k++) {
			t->dims[k] = (int64_t)bget_u64(&r);
			/* In bytes too: the count sizes buffers. */
			if (t->dims[k] < 0 || (t->dims[k] > 0 &&
			                       t->count > SIZE_MAX / esz / (size_t)t->dims[k]))
				goto bad_free;
			t->count *= (size_t)t->dims[k];
		}
	}
	if (r.bad || r.off != len)
		goto bad_free;
	return KHOR_SUCCESS;
bad_free:
	item_free_tensors(it);
bad:
	return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation: a malformed tensor descriptor");
}

/* The key (names joined by '\n') of a descriptor, malloc'd; NULL when malformed. */
char *desc_key(const uint8_t *d, size_t len)
{
	brd r = { d, len, 0, false };
	bbuf k = { 0 };

	bget_u8(&r);
	bget_u8(&r);
	uint16_t n = bget_u16(&r);
	r.off += 4 + 16;
	for (int i = 0; i < n && !r.bad; i++) {
		uint16_t nl = bget_u16(&r);
		if (r.off + nl > len) {
			r.bad = true;
			break;
		}
		if (i > 0)
			bput_u8(&k, '\n');
		bput(&k, d + r.off, nl);
		r.off += nl;
		bget_u8(&r);
		uint8_t nd = bget_u8(&r);
		r.off += 8u * nd;
	}
	bput_u8(&k, 0);
	if (r.bad || k.oom || r.off > len) {
		free(k.p);
		return NULL;
	}
	return (char *)k.p;
}

/* ---- the response cache ---------------------------------------------------------------- */

static int cache_find(const ecache *c, const char *key)
{
	uintptr_t v = (uintptr_t)emap_get(&c->index, key);
	return v == 0 ? -1 : (int)(v - 1);
}

/* The slot a rank may name for h: its key is cached with the same descriptor. */
static int cache_hit(const ecache *c, const khor_handle *h)
{
	int i = c->cap > 0 ? cache_find(c, h->key) : -1;

	if (i < 0 || c->slot[i].desc_len != h->desc_len ||
	    memcmp(c->slot[i].desc, h->desc, h->desc_len) != 0)
		return -1;
	return i;
}

static void cache_touch(ecache *c, int i)
{
	c->slot[i].used = ++c->clock;
}

/* Puts (key, desc) in the cache: the same slot on every rank, since every rank applies the
 * same responses in the same order. */
static khor_status cache_put(ecache *c, const char *key, const uint8_t *desc, size_t len)
{
	int i = cache_find(c, key);
	uint8_t *d = malloc(len);

	if (d == NULL)
		return KHOR_ERR_NO_MEMORY;
	memcpy(d, desc, len);
	if (i < 0) {
		if (c->slot == NULL) {
			c->slot = calloc((size_t)c->cap, sizeof(*c->slot));
			if (c->slot == NULL) {
				free(d);
				return KHOR_ERR_NO_MEMORY;
			}
		}
		if (c->n < c->cap) {
			i = c->n++;
		} else {
			i = 0;
			for (int j = 1; j < c->n; j++)
				if (c->slot[j].used < c->slot[i].used)
					i = j;
			emap_del(&c->index, c->slot[i].key);
			free(c->slot[i].key);
			c->slot[i].key = NULL;
		}
		c->slot[i].key = strdup(key);
		if (c->slot[i].key == NULL ||
		    emap_put(&c->index, key, (void *)(uintptr_t)(i + 1)) != KHOR_SUCCESS) {
			free(d);
			return KHOR_ERR_NO_MEMORY;
		}
	}
	free(c->slot[i].desc);
	c->slot[i].desc = d;
	c->slot[i].desc_len = len;
	cache_touch(c, i);
	return KHOR_SUCCESS;
}

static bool cacheable(int kind)
{
	return kind == EK_ALLREDUCE || kind == EK_BROADCAST || kind == EK_REDUCESCATTER ||
	       kind == EK_BARRIER;
}

/* ---- waiting ----------------------------------------------------------------------------- */

/*
 * Waits until one of xs completes (*which = its index), or, with wake_ok, this set is woken
 * by an enqueue or a stop (*which = -1), or dl passes. Spins for the comm's spin time first
 * when the wait is expected to be short. Link errors come back with the peer named by the
 * transport.
 */
static khor_status ctl_wait(eset *s, coll_xfer *xs, int nxs, bool wake_ok, kdeadline dl,
                            bool spin, int idle_ms, int *which, kerr *err)
{
	coll_comm *cc = &s->ctl->cc;
	uint64_t t0 = kclock_ns(), last_abort = t0;
	unsigned mask = 0;

	for (int i = 0; i < nxs; i++)
		if (xs[i].req != NULL)
			mask |= 1u << xs[i].tpi;
	if (mask == 0)
		mask = (1u << cc->ntps) - 1;
	for (;;) {
		for (int i = 0; i < nxs; i++) {
			khor_status st = KHOR_SUCCESS;
			if (xs[i].req != NULL && coll_done(cc, &xs[i], &st, err)) {
				*which = i;
				return st;
			}
		}
		if (wake_ok && atomic_exchange(&s->woken, false)) {
			*which = -1;
			return KHOR_SUCCESS;
		}
		uint64_t now = kclock_ns();
		if (kdeadline_passed(dl))
			return kerr_set(err, KHOR_ERR_TIMEOUT, "timed out");
		if (idle_ms > 0 && now - t0 > (uint64_t)idle_ms * 1000000ull) {
			*which = -2; /* the caller's timer */
			return KHOR_SUCCESS;
		}
		if (dl.at_ns != UINT64_MAX && now - last_abort > 1000000000ull) {
			last_abort = now;
			khor_status st = cc->check_abort(cc->owner, err);
			if (st != KHOR_SUCCESS)
				return st;
		}
		bool fast = spin && now - t0 < cc->spin_ns;
		/* Sleep in slices, never past the caller's timer or deadline. */
		int t = fast ? 0 : kdeadline_left_ms(dl, 200);
		if (!fast && idle_ms > 0) {
			int64_t left = (int64_t)idle_ms - (int64_t)((now - t0) / 1000000ull);
			if (left < t)
				t = left < 1 ? 1 : (int)left;
		}
		khor_status st = coll_progress(cc, t, mask, NULL, err);
		if (st != KHOR_SUCCESS)
			return st;
		/*
		 * The application's threads share the cores with this one: a spinning engine
		 * thread that never yields keeps them off the CPU until the scheduler's tick
		 * (measured: 4 ms per lone allreduce instead of 0.2 ms on 2 cores, 2 ranks).
		 */
		if (fast)
			sched_yield();
	}
}

static tp_tag ctl_tag(const eset *s, uint32_t step)
{
	tp_tag t = { s->ctl->cc.comm_id, s->cycle, step, coll_meta_make(COLL_NEGOTIATE, 0, 0) };
	return t;
}

/* Sends a header (+ payload frame) to peer; the transfers go into xs[0..1]. */
static khor_status ctl_send(eset *s, int peer, uint8_t type, uint32_t step, const bbuf *pl,
                            msg_hdr *hdr, coll_xfer *xs, kerr *err)
{
	coll_comm *cc = &s->ctl->cc;
	kdeadline dl = kdeadline_in_ms(cc->timeout_ms);
	khor_status st;

	memset(hdr, 0, sizeof(*hdr));
	hdr->magic = MSG_MAGIC;
	hdr->type = type;
	hdr->cycle = s->cycle;
	hdr->len = pl != NULL ? (uint32_t)pl->len : 0;
	if (hdr->len <= MSG_INLINE && hdr->len > 0)
		memcpy(hdr->data, pl->p, hdr->len);
	xs[0].req = xs[1].req = NULL;
	st = coll_post(cc, &xs[0], peer, true, hdr, sizeof(*hdr), ctl_tag(s, step), dl, err);
	if (st == KHOR_SUCCESS && hdr->len > MSG_INLINE)
		st = coll_post(cc, &xs[1], peer, true, pl->p, pl->len, ctl_tag(s, step + 1), dl, err);
	return st;
}

/* Waits for sends to finish (bounded). */
static khor_status ctl_flush(eset *s, coll_xfer *xs, int nxs, kerr *err)
{
	kdeadline dl = kdeadline_in_ms(s->ctl->cc.timeout_ms);
	int which;

	for (;;) {
		bool left = false;
		for (int i = 0; i < nxs; i++)
			left |= xs[i].req != NULL;
		if (!left)
			return KHOR_SUCCESS;
		khor_status st = ctl_wait(s, xs, nxs, false, dl, true, 0, &which, err);
		if (st != KHOR_SUCCESS)
			return st;
	}
}

static void ctl_drain(eset *s, coll_xfer *xs, int nxs)
{
	coll_drain(&s->ctl->cc, xs, nxs);
}

/* Receives the payload that follows hdr (when it did not fit), into *out (malloc'd). */
static khor_status ctl_payload(eset *s, int peer, const msg_hdr *hdr, uint32_t step,
                               uint8_t **out, kerr *err)
{
	coll_comm *cc = &s->ctl->cc;
	uint8_t *p = malloc(hdr->len + 1u);
	coll_xfer x = { 0 };
	khor_status st;
	int which;

	if (p == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
	if (hdr->len <= MSG_INLINE) {
		memcpy(p, hdr->data, hdr->len);
		*out = p;
		return KHOR_SUCCESS;
	}
	kdeadline dl = kdeadline_in_ms(cc->timeout_ms);
	st = coll_post(cc, &x, peer, false, p, hdr->len, ctl_tag(s, step + 1), dl, err);
	if (st == KHOR_SUCCESS)
		st = ctl_wait(s, &x, 1, false, dl, true, 0, &which, err);
	if (st != KHOR_SUCCESS) {
		ctl_drain(s, &x, 1);
		free(p);
		return st;
	}
	*out = p;
	return KHOR_SUCCESS;
}

static khor_status check_hdr(const eset *s, const msg_hdr *h, int peer, kerr *err)
{
	if (h->magic != MSG_MAGIC || h->cycle != s->cycle || h->type < M_REQ || h->type > M_ABORT)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: a malformed message "
		                "from rank %d (type %u, cycle %u)", s->cycle, peer, h->type, h->cycle);
	if (h->len > MSG_MAX)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: rank %d announces a "
		                "%u-byte message (at most %u)", s->cycle, peer, h->len, MSG_MAX);
	return KHOR_SUCCESS;
}

/* ---- the report (REQ) --------------------------------------------------------------------- */

/* Moves the fresh handles to pending and writes what this rank has to say this cycle. */
static bool build_report(eset *s, bbuf *b)
{
	struct khor_engine *e = s->e;
	bbuf hits = { 0 };
	uint32_t nhits = 0;
	bool news = false;

	pthread_mutex_lock(&e->mu);
	for (khor_handle *h = s->fresh, *next; h != NULL; h = next) {
		next = h->next;
		news = true;
		if (h->kind == EK_JOIN) {
			h->next = NULL;
			bput_u8(b, 'J');
			continue;
		}
		int slot = cache_hit(&s->cache, h);
		if (slot >= 0) {
			bput_u32(&hits, (uint32_t)slot);
			nhits++;
		} else {
			bput_u8(b, 'F');
			bput_u32(b, (uint32_t)h->desc_len);
			bput(b, h->desc, h->desc_len);
		}
		h->prev = NULL;
		h->next = s->pending;
		if (s->pending != NULL)
			s->pending->prev = h;
		s->pending = h;
		h->reported = true;
		if (s->rank != 0 && timeline_on(e)) {
			/* A worker's own timeline knows only its own readiness; the coordinator's
			 * has every rank's. */
			char what[32];
			snprintf(what, sizeof(what), "rank %d ready", s->rank);
			uint64_t now = kclock_ns();
			for (int i = 0; i < h->n; i++)
				timeline_instant(e, h->t[i].name, what, now);
		}
	}
	s->fresh = s->fresh_tail = NULL;
	if (s->stop && !s->stop_sent) {
		bput_u8(b, 'S');
		s->stop_sent = true;
		news = true;
	}
	pthread_mutex_unlock(&e->mu);
	if (nhits > 0) {
		bput_u8(b, 'H');
		bput_u32(b, nhits);
		bput(b, hits.p, hits.len);
	}
	free(hits.p);
	return news;
}

static bool has_news(eset *s)
{
	bool news;

	pthread_mutex_lock(&s->e->mu);
	news = s->fresh != NULL || (s->stop && !s->stop_sent);
	pthread_mutex_unlock(&s->e->mu);
	return news;
}

/* ---- applying a response -------------------------------------------------------------------- */

static void unlink_pending_locked(eset *s, khor_handle *h)
{
	if (h->prev != NULL)
		h->prev->next = h->next;
	else if (s->pending == h)
		s->pending = h->next;
	if (h->next != NULL)
		h->next->prev = h->prev;
	h->next = h->prev = NULL;
}

/* Turns a descriptor into an item: this rank's handle for it, or a ghost (none here). */
static khor_status item_for(eset *s, const uint8_t *d, size_t len, const char *key, eitem *it,
                            kerr *err)
{
	struct khor_engine *e = s->e;
	khor_status st = desc_parse(d, len, it, err);

	if (st != KHOR_SUCCESS)
		return st;
	pthread_mutex_lock(&e->mu);
	khor_handle *h = emap_get(&s->keys, key);
	/* Only what this rank reported: a handle still in the fresh list is not in this
	 * response (a joined rank has none; an error for a key this rank has not reported yet
	 * meets its report in a later cycle). */
	if (h != NULL && h->kind != EK_JOIN && !h->done && h->reported) {
		unlink_pending_locked(s, h);
		h->in_cycle = true;
		h->t_response = kclock_ns();
		it->h = h;
	}
	pthread_mutex_unlock(&e->mu);
	if (it->h != NULL) {
		/* The handle's own tensors (buffers) replace the parsed ones. */
		item_free_tensors(it);
		it->t = it->h->t;
		it->n = it->h->n;
	}
	return KHOR_SUCCESS;
}

static void items_free(eitem *items, int n)
{
	for (int i = 0; i < n; i++) {
		if (items[i].h == NULL)
			item_free_tensors(&items[i]);
		free(items[i].dim0);
		free(items[i].msg);
	}
	free(items);
}

/*
 * Applies a response payload: the cache updates, the join and tuning records, then runs
 * the items in order. Returns false when the set is to stop (every rank asked to).
 */
bool apply_response(eset *s, const uint8_t *p, size_t len)
{
	struct khor_engine *e = s->e;
	brd r = { p, len, 0, false };
	eitem *items = NULL;
	int n = 0, cap = 0;
	bool stop = false;
	kerr err;

	kerr_clear(&err);
	while (r.off < r.len && !r.bad) {
		uint8_t rec = bget_u8(&r);
		if (rec == 'C' || rec == 'R' || rec == 'E') {
			if (n == cap) {
				cap = cap == 0 ? 16 : cap * 2;
				eitem *v = realloc(items, sizeof(*v) * (size_t)cap);
				if (v == NULL) {
					kerr_set(&err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
					break;
				}
				items = v;
			}
		}
		if (rec == 'C') {
			uint32_t slot = bget_u32(&r);
			if (r.bad || slot >= (uint32_t)s->cache.n) {
				kerr_set(&err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: the response "
				         "names cache slot %u of %d", s->cycle, slot, s->cache.n);
				break;
			}
			ecache_slot *cs = &s->cache.slot[slot];
			cache_touch(&s->cache, (int)slot);
			if (item_for(s, cs->desc, cs->desc_len, cs->key, &items[n], &err) != KHOR_SUCCESS)
				break;
			n++;
		} else if (rec == 'R') {
			uint32_t dl = bget_u32(&r);
			if (r.bad || r.off + dl > r.len) {
				r.bad = true;
				break;
			}
			const uint8_t *d = p + r.off;
			r.off += dl;
			uint8_t flags = bget_u8(&r);
			char *key = desc_key(d, dl);
			if (key == NULL) {
				r.bad = true;
				break;
			}
			if (item_for(s, d, dl, key, &items[n], &err) != KHOR_SUCCESS) {
				free(key);
				break;
			}
			eitem *it = &items[n++];
			if (it->kind == EK_ALLGATHER) {
				size_t cnt = (size_t)it->n * (size_t)s->size;
				it->dim0 = malloc(sizeof(int64_t) * cnt);
				if (it->dim0 == NULL) {
					free(key);
					kerr_set(&err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
					break;
				}
				for (size_t i = 0; i < cnt; i++)
					it->dim0[i] = (int64_t)bget_u64(&r);
			}
			if ((flags & 1) && s->cache.cap > 0 &&
			    cache_put(&s->cache, key, d, dl) != KHOR_SUCCESS)
				kerr_set(&err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
			free(key);
			if (err.status != KHOR_SUCCESS)
				break;
		} else if (rec == 'E') {
			uint16_t kl = bget_u16(&r);
			if (r.bad || r.off + kl > r.len) {
				r.bad = true;
				break;
			}
			char *key = strndup((const char *)p + r.off, kl);
			r.off += kl;
			uint16_t ml = bget_u16(&r);
			if (key == NULL || r.bad || r.off + ml > r.len) {
				free(key);
				r.bad = true;
				break;
			}
			eitem *it = &items[n];
			memset(it, 0, sizeof(*it));
			it->error = true;
			it->msg = strndup((const char *)p + r.off, ml);
			r.off += ml;
			pthread_mutex_lock(&e->mu);
			khor_handle *h = emap_get(&s->keys, key);
			if (h != NULL && !h->done && h->kind != EK_JOIN && h->reported) {
				unlink_pending_locked(s, h);
				h->in_cycle = true;
				it->h = h;
				it->kind = h->kind;
			}
			pthread_mutex_unlock(&e->mu);
			free(key);
			if (it->h != NULL)
				n++;
			else
				free(it->msg);
		} else if (rec == 'D') {
			int last = bget_i32(&r);
			pthread_mutex_lock(&e->mu);
			khor_handle *j = s->join;
			if (j != NULL) {
				j->join_rank = last;
				engine_complete_locked(e, j, KHOR_SUCCESS, NULL);
				engine_signal_locked(e);
			}
			pthread_mutex_unlock(&e->mu);
		} else if (rec == 'T') {
			uint64_t fb = bget_u64(&r), cu = bget_u64(&r);
			atomic_store(&e->fusion_bytes, fb);
			atomic_store(&e->cycle_us, cu);
		} else if (rec == 'X') {
			stop = true;
		} else {
			r.bad = true;
		}
	}
	if (r.bad && err.status == KHOR_SUCCESS)
		kerr_set(&err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: a malformed response",
		         s->cycle);
	if (err.status != KHOR_SUCCESS) {
		/* The handles taken out of pending above still belong to items: fail them too. */
		pthread_mutex_lock(&e->mu);
		for (int i = 0; i < n; i++)
			if (items[i].h != NULL)
				engine_complete_locked(e, items[i].h, err.status, err.text);
		engine_signal_locked(e);
		pthread_mutex_unlock(&e->mu);
		items_free(items, n);
		engine_fail_set(s, &err);
		return false;
	}
	if (n > 0)
		execute_items(s, items, n);
	items_free(items, n);
	s->cycles++;
	pthread_mutex_lock(&e->mu);
	bool failed = s->failed;
	pthread_mutex_unlock(&e->mu);
	return !stop && !failed;
}

/* ---- the worker ------------------------------------------------------------------------------ */

static void fail_with(eset *s, khor_status st, kerr *err, const char *what)
{
	kerr e2;

	if (err->status == KHOR_SUCCESS)
		kerr_set(err, st, "failed");
	kerr_set(&e2, err->status, "rank %d on %s, engine set %d, negotiation cycle %u: %s: %s",
	         s->ctl->ctx->rank, s->ctl->ctx->cfg.hostname, s->id, s->cycle, what, err->text);
	engine_fail_set(s, &e2);
}

/* Builds this rank's report into b and sends it to the coordinator (xs: its transfers). */
static khor_status send_report(eset *s, bbuf *b, msg_hdr *hdr, coll_xfer *xs, kerr *err)
{
	b->len = 0;
	build_report(s, b);
	if (b->oom)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "out of memory");
	return ctl_send(s, 0, M_REQ, 0, b, hdr, xs, err);
}

/* The coordinator's ABORT: its cause, as this rank's error. */
static void coordinator_failed(const msg_hdr *in, kerr *err)
{
	kerr_set(err, KHOR_ERR_REMOTE, "the coordinator (rank 0) failed: %.*s",
	         (int)(in->len < MSG_INLINE ? in->len : MSG_INLINE), (const char *)in->data);
}

bool negotiate_worker_cycle(eset *s)
{
	msg_hdr in, out;
	coll_xfer rx = { 0 }, tx[2] = { { 0 }, { 0 } };
	bbuf rep = { 0 };
	bool sent = false, ok = false;
	uint8_t *payload = NULL;
	khor_status st;
	kerr err;
	int which;
	uint64_t t_neg = 0;
	coll_comm *cc = &s->ctl->cc;
	kdeadline never = kdeadline_in_ms(-1), stop_dl = kdeadline_in_ms(cc->timeout_ms);

	kerr_clear(&err);
	st = coll_post(cc, &rx, 0, false, &in, sizeof(in), ctl_tag(s, 0),
	               kdeadline_in_ms(cc->timeout_ms), &err);
	if (st != KHOR_SUCCESS) {
		fail_with(s, st, &err, "waiting for the coordinator (rank 0)");
		return false;
	}
	/* Until the coordinator speaks: report news as soon as there is some. */
	bool spin = true;
	for (;;) {
		if (!sent && has_news(s)) {
			if ((st = send_report(s, &rep, &out, tx, &err)) != KHOR_SUCCESS)
				goto fail;
			sent = true;
			t_neg = kclock_ns();
		}
		/* Once this rank has asked to stop, the others have KHOR_TIMEOUT to do the same. */
		st = ctl_wait(s, &rx, 1, !sent, s->stop_sent ? stop_dl : never, spin, 0, &which,
		              &err);
		if (st == KHOR_ERR_TIMEOUT)
			kerr_set(&err, st, "the other ranks did not call khor_engine_stop within "
			         "KHOR_TIMEOUT (%lld ms) of this one", (long long)cc->timeout_ms);
		if (st != KHOR_SUCCESS)
			goto fail;
		spin = false;
		if (which == 0)
			break;
	}
	if ((st = check_hdr(s, &in, 0, &err)) != KHOR_SUCCESS)
		goto fail;
	if (t_neg == 0)
		t_neg = kclock_ns();
	if (in.type == M_ABORT)
		goto aborted;
	uint32_t step = 0;
	if (in.type == M_GO) {
		if (!sent) {
			if ((st = send_report(s, &rep, &out, tx, &err)) != KHOR_SUCCESS)
				goto fail;
			sent = true;
		}
		step = 2;
		st = coll_post(cc, &rx, 0, false, &in, sizeof(in), ctl_tag(s, 2),
		               kdeadline_in_ms(cc->timeout_ms), &err);
		if (st == KHOR_SUCCESS)
			st = ctl_wait(s, &rx, 1, false, kdeadline_in_ms(cc->timeout_ms * 2 + 5000),
			              true, 0, &which, &err);
		if (st != KHOR_SUCCESS)
			goto fail;
		if ((st = check_hdr(s, &in, 0, &err)) != KHOR_SUCCESS)
			goto fail;
		if (in.type == M_ABORT)
			goto aborted;
	}
	if (in.type != M_RESP) {
		st = kerr_set(&err, KHOR_ERR_PROTOCOL, "expected a response from rank 0, got type %u",
		              in.type);
		goto fail;
	}
	if ((st = ctl_payload(s, 0, &in, step, &payload, &err)) != KHOR_SUCCESS)
		goto fail;
	if ((st = ctl_flush(s, tx, 2, &err)) != KHOR_SUCCESS)
		goto fail;
	s->negotiate_ns += kclock_ns() - t_neg;
	free(rep.p);
	ok = apply_response(s, payload, in.len);
	free(payload);
	s->cycle++;
	return ok;
aborted:
	/* The coordinator's cause, as it is: it already names rank, host and cycle. */
	coordinator_failed(&in, &err);
	ctl_drain(s, tx, 2);
	free(rep.p);
	engine_fail_set(s, &err);
	return false;
fail:
	ctl_drain(s, &rx, 1);
	ctl_drain(s, tx, 2);
	free(rep.p);
	free(payload);
	fail_with(s, st, &err, "talking to the coordinator (rank 0)");
	return false;
}

/* ---- the coordinator ------------------------------------------------------------------------- */

static void centry_free(eset *s, centry *c)
{
	for (int r = 0; r < s->size; r++)
		free(c->desc[r]);
	free(c->desc);
	free(c->desc_len);
	free(c->ready_ns);
	free(c->key);
	free(c);
}

static void centry_remove(eset *s, centry *c)
{
	emap_del(&s->table, c->key);
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		s->first = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	else
		s->last = c->prev;
	centry_free(s, c);
}

void negotiate_free(eset *s)
{
	while (s->first != NULL)
		centry_remove(s, s->first);
	emap_free(&s->table);
	free(s->joined_r);
	free(s->stop_r);
	s->joined_r = s->stop_r = NULL;
}

/* Records that rank r has key ready with descriptor d (copied). */
static khor_status coord_add(eset *s, int r, const char *key, const uint8_t *d, size_t len,
                             int slot, uint64_t now)
{
	centry *c = emap_get(&s->table, key);

	if (c == NULL) {
		c = calloc(1, sizeof(*c));
		if (c == NULL)
			return KHOR_ERR_NO_MEMORY;
		c->desc = calloc((size_t)s->size, sizeof(*c->desc));
		c->desc_len = calloc((size_t)s->size, sizeof(*c->desc_len));
		c->ready_ns = calloc((size_t)s->size, sizeof(*c->ready_ns));
		c->key = strdup(key);
		if (c->desc == NULL || c->desc_len == NULL || c->ready_ns == NULL || c->key == NULL ||
		    emap_put(&s->table, key, c) != KHOR_SUCCESS) {
			free(c->desc);
			free(c->desc_len);
			free(c->ready_ns);
			free(c->key);
			free(c);
			return KHOR_ERR_NO_MEMORY;
		}
		c->first_ns = now;
		c->from_cache_all = true;
		c->slot = slot;
		c->prev = s->last;
		if (s->last != NULL)
			s->last->next = c;
		else
			s->first = c;
		s->last = c;
	}
	if (c->desc[r] != NULL)
		return KHOR_SUCCESS; /* reported twice: cannot happen, names are unique in flight */
	c->desc[r] = malloc(len);
	if (c->desc[r] == NULL)
		return KHOR_ERR_NO_MEMORY;
	memcpy(c->desc[r], d, len);
	c->desc_len[r] = len;
	c->ready_ns[r] = now;
	c->have++;
	if (slot < 0 || slot != c->slot)
		c->from_cache_all = false;
	return KHOR_SUCCESS;
}

/* Takes in rank r's report. */
khor_status coord_merge(eset *s, int r, const uint8_t *p, size_t len, kerr *err)
{
	brd b = { p, len, 0, false };
	uint64_t now = kclock_ns();

	while (b.off < b.len && !b.bad) {
		uint8_t rec = bget_u8(&b);
		if (rec == 'F') {
			uint32_t dl = bget_u32(&b);
			if (b.bad || b.off + dl > b.len)
				break;
			char *key = desc_key(p + b.off, dl);
			if (key == NULL)
				break;
			khor_status st = coord_add(s, r, key, p + b.off, dl, -1, now);
			free(key);
			if (st != KHOR_SUCCESS)
				return kerr_set(err, st, "negotiation: out of memory");
			b.off += dl;
		} else if (rec == 'H') {
			uint32_t nh = bget_u32(&b);
			for (uint32_t i = 0; i < nh && !b.bad; i++) {
				uint32_t slot = bget_u32(&b);
				if (b.bad || slot >= (uint32_t)s->cache.n) {
					b.bad = true;
					break;
				}
				ecache_slot *cs = &s->cache.slot[slot];
				if (coord_add(s, r, cs->key, cs->desc, cs->desc_len, (int)slot, now) !=
				    KHOR_SUCCESS)
					return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
			}
		} else if (rec == 'J') {
			if (!s->joined_r[r]) {
				s->joined_r[r] = true;
				s->njoined++;
			}
			s->last_joiner = r;
		} else if (rec == 'S') {
			if (!s->stop_r[r]) {
				s->stop_r[r] = true;
				s->nstop++;
			}
		} else {
			b.bad = true;
		}
	}
	if (b.bad || b.off != b.len)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: a malformed report "
		                "from rank %d", s->cycle, r);
	return KHOR_SUCCESS;
}

/* "0, 1, 3" */
static void rank_list(bbuf *b, const int *ranks, int n)
{
	char tmp[16];

	for (int i = 0; i < n; i++) {
		int l = snprintf(tmp, sizeof(tmp), "%s%d", i > 0 ? ", " : "", ranks[i]);
		bput(b, tmp, (size_t)l);
	}
}

static void bprintf(bbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void bprintf(bbuf *b, const char *fmt, ...)
{
	char tmp[1024];
	va_list ap;

	va_start(ap, fmt);
	int l = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (l > 0)
		bput(b, tmp, (size_t)(l < (int)sizeof(tmp) ? l : (int)sizeof(tmp) - 1));
}

static void shape_str(const etensor *t, char *out, size_t len)
{
	size_t o = 0;

	o += (size_t)snprintf(out + o, len - o, "[");
	for (int d = 0; d < t->ndim && o < len; d++)
		o += (size_t)snprintf(out + o, len - o, "%s%lld", d > 0 ? ", " : "",
		                      (long long)t->dims[d]);
	if (o < len)
		snprintf(out + o, len - o, "]");
}

/*
 * "grad/fc1: rank 2 has shape [128, 64], ranks 0, 1, 3 have [128, 32]": the groups of
 * ranks by value of the first attribute that differs, smallest group first.
 */
static bool differ_msg(eset *s, const char *name, const char *label, char (*vals)[160],
                       const bool *has, bbuf *msg)
{
	int n = s->size, first = -1;
	bool differ = false;

	for (int r = 0; r < n; r++) {
		if (!has[r])
			continue;
		if (first < 0)
			first = r;
		else if (strcmp(vals[r], vals[first]) != 0)
			differ = true;
	}
	if (!differ)
		return false;
	int *group = malloc(sizeof(int) * (size_t)n), *members = malloc(sizeof(int) * (size_t)n);
	bool *done = calloc((size_t)n, sizeof(bool));
	if (group == NULL || members == NULL || done == NULL) {
		free(group);
		free(members);
		free(done);
		bprintf(msg, "%s: ranks disagree on %s", name, label);
		return true;
	}
	/* The groups, by value. */
	int ng = 0;
	for (int r = 0; r < n; r++) {
		if (!has[r] || done[r])
			continue;
		group[ng++] = r;
		for (int q = r; q < n; q++)
			if (has[q] && strcmp(vals[q], vals[r]) == 0)
				done[q] = true;
	}
	/* Smallest group first (ties: lowest rank), so the odd one out leads. */
	int *size = calloc((size_t)ng, sizeof(int));
	for (int g = 0; size != NULL && g < ng; g++)
		for (int q = 0; q < n; q++)
			if (has[q] && strcmp(vals[q], vals[group[g]]) == 0)
				size[g]++;
	for (int a = 0; size != NULL && a < ng; a++) {
		for (int b = a + 1; b < ng; b++) {
			if (size[b] < size[a]) {
				int t = size[a]; size[a] = size[b]; size[b] = t;
				t = group[a]; group[a] = group[b]; group[b] = t;
			}
		}
	}
	bprintf(msg, "%s: ", name);
	for (int g = 0; g < ng; g++) {
		int m = 0;
		for (int q = 0; q < n; q++)
			if (has[q] && strcmp(vals[q], vals[group[g]]) == 0)
				members[m++] = q;
		bprintf(msg, "%s%s ", g > 0 ? ", " : "", m > 1 ? "ranks" : "rank");
		rank_list(msg, members, m);
		bprintf(msg, " %s %s%s%s", m > 1 ? "have" : "has", g == 0 ? label : "",
		        g == 0 && label[0] != '\0' ? " " : "", vals[group[g]]);
	}
	free(size);
	free(group);
	free(members);
	free(done);
	return true;
}

static bool coord_mismatch_slow(eset *s, centry *c, bbuf *msg);

/*
 * Compares every reporting rank's descriptor of c; on a difference writes the message and
 * returns true. Dim 0 of allgather and alltoall may differ.
 */
static bool coord_mismatch(eset *s, centry *c, bbuf *msg)
{
	/* The usual case, and the cheap one: every rank sent the very same descriptor. */
	int first = -1;
	bool same = true;
	for (int r = 0; r < s->size && same; r++) {
		if (c->desc[r] == NULL)
			continue;
		if (first < 0)
			first = r;
		else if (c->desc_len[r] != c->desc_len[first] ||
		         memcmp(c->desc[r], c->desc[first], c->desc_len[r]) != 0)
			same = false;
	}
	if (same)
		return false;
	return coord_mismatch_slow(s, c, msg);
}

static bool coord_mismatch_slow(eset *s, centry *c, bbuf *msg)
{
	int n = s->size;
	size_t nz = (size_t)(unsigned)n;
	eitem *it = calloc(nz, sizeof(*it));
	char (*vals)[160] = calloc(nz, sizeof(*vals));
	bool *has = calloc(nz, sizeof(bool));
	bool found = false;
	kerr err;

	if (it == NULL || vals == NULL || has == NULL) {
		free(it);
		free(vals);
		free(has);
		return false;
	}
	int ref = -1;
	for (int r = 0; r < n; r++) {
		if (c->desc[r] == NULL)
			continue;
		if (desc_parse(c->desc[r], c->desc_len[r], &it[r], &err) != KHOR_SUCCESS) {
			bprintf(msg, "%s: rank %d sent a malformed descriptor", c->key, r);
			found = true;
			goto out;
		}
		has[r] = true;
		if (ref < 0)
			ref = r;
	}
	const char *name0 = it[ref].t[0].name;
#define CMP(label, fmt, expr, nm)                                                       \
	do {                                                                            \
		for (int r = 0; r < n; r++)                                             \
			if (has[r])                                                     \
				snprintf(vals[r], sizeof(vals[r]), fmt, expr);          \
		if (differ_msg(s, nm, label, vals, has, msg)) {                         \
			found = true;                                                   \
			goto out;                                                       \
		}                                                                       \
	} while (0)
	CMP("", "%s", eng_kind_name(it[r].kind), name0);
	CMP("group size", "%d", it[r].n, name0);
	if (it[ref].kind == EK_ALLREDUCE || it[ref].kind == EK_REDUCESCATTER)
		CMP("op", "%s", kop_name(it[r].op), name0);
	if (it[ref].kind == EK_BROADCAST)
		CMP("root", "%d", it[r].root, name0);
	if (it[ref].kind == EK_ALLREDUCE || it[ref].kind == EK_REDUCESCATTER) {
		CMP("prescale", "%g", it[r].prescale, name0);
		CMP("postscale", "%g", it[r].postscale, name0);
	}
	for (int i = 0; i < it[ref].n; i++) {
		const char *nm = it[ref].t[i].name;
		CMP("dtype", "%s", kdtype_name(it[r].t[i].dtype), nm);
		bool skip0 = it[ref].kind == EK_ALLGATHER || it[ref].kind == EK_ALLTOALL;
		for (int r = 0; r < n; r++) {
			if (!has[r])
				continue;
			shape_str(&it[r].t[i], vals[r], sizeof(vals[r]));
		}
		if (skip0) {
			/* Compare the shapes without dim 0, show them whole. */
			char (*tails)[160] = calloc((size_t)n, sizeof(*tails));
			bool differ = false;
			for (int r = 0; tails != NULL && r < n; r++) {
				if (!has[r])
					continue;
				etensor t = it[r].t[i];
				if (t.ndim > 0)
					t.dims[0] = 0;
				shape_str(&t, tails[r], sizeof(tails[r]));
				if (strcmp(tails[r], tails[ref]) != 0)
					differ = true;
			}
			free(tails);
			if (differ && differ_msg(s, nm, "shape", vals, has, msg)) {
				bprintf(msg, " (only dim 0 may differ in %s)", eng_kind_name(it[ref].kind));
				found = true;
				goto out;
			}
		} else if (differ_msg(s, nm, "shape", vals, has, msg)) {
			found = true;
			goto out;
		}
	}
#undef CMP
out:
	for (int r = 0; r < n; r++)
		if (has[r])
			item_free_tensors(&it[r]);
	free(it);
	free(vals);
	free(has);
	return found;
}

static void put_error(bbuf *out, const char *key, const char *msg, size_t ml)
{
	size_t kl = strlen(key);

	if (ml > 60000)
		ml = 60000;
	bput_u8(out, 'E');
	bput_u16(out, (uint16_t)kl);
	bput(out, key, kl);
	bput_u16(out, (uint16_t)ml);
	bput(out, msg, ml);
}

/* The ranks that have not reported c (and are not joined, when skip_joined). */
static int missing_ranks(const eset *s, const centry *c, int *out)
{
	int m = 0;
	for (int r = 0; r < s->size; r++)
		if (c->desc[r] == NULL)
			out[m++] = r;
	return m;
}

/* The stall message: who has c, who does not, and what those submitted instead. */
static void stall_msg(eset *s, centry *c, uint64_t now, bbuf *msg)
{
	int *miss = malloc(sizeof(int) * (size_t)s->size);
	int *have = malloc(sizeof(int) * (size_t)s->size);
	int nm, nh = 0;

	if (miss == NULL || have == NULL) {
		free(miss);
		free(have);
		bprintf(msg, "tensor '%s' is stalled", c->key);
		return;
	}
	nm = missing_ranks(s, c, miss);
	for (int r = 0; r < s->size; r++)
		if (c->desc[r] != NULL)
			have[nh++] = r;
	bprintf(msg, "tensor '%s' on process set %d has been ready on %s ", c->key, s->id,
	        nh > 1 ? "ranks" : "rank");
	rank_list(msg, have, nh);
	bprintf(msg, " for %.0f s, but %s ", (double)(now - c->first_ns) / 1e9,
	        nm > 1 ? "ranks" : "rank");
	rank_list(msg, miss, nm);
	bprintf(msg, " %s not submitted it", nm > 1 ? "have" : "has");
	/* What the missing ranks wait on instead: the names they did submit. */
	bprintf(msg, "; instead, ");
	for (int i = 0; i < nm; i++) {
		int r = miss[i], shown = 0, total = 0;
		bprintf(msg, "%srank %d %s", i > 0 ? "; " : "", r,
		        s->joined_r[r] ? "has joined" : "submitted ");
		if (s->joined_r[r])
			continue;
		for (centry *o = s->first; o != NULL; o = o->next) {
			if (o == c || o->desc[r] == NULL)
				continue;
			if (shown < 5)
				bprintf(msg, "%s'%s'", shown > 0 ? ", " : "", o->key);
			shown += shown < 5;
			total++;
		}
		if (total == 0)
			bprintf(msg, "nothing (it may be busy elsewhere, or have run out of data: "
			        "see join)");
		else if (total > shown)
			bprintf(msg, " and %d more", total - shown);
	}
	free(miss);
	free(have);
}

/* The cycle's responses, from the table; removes what they settle. */
static khor_status coord_respond(eset *s, bbuf *out, kerr *err)
{
	struct khor_engine *e = s->e;
	uint64_t now = kclock_ns();
	bbuf msg = { 0 };

	for (centry *c = s->first, *next; c != NULL; c = next) {
		next = c->next;
		int ref = -1;
		for (int r = 0; r < s->size && ref < 0; r++)
			if (c->desc[r] != NULL)
				ref = r;
		int kind = c->desc[ref][0];
		int lacking = 0, lacking_joined = 0;
		for (int r = 0; r < s->size; r++) {
			if (c->desc[r] == NULL) {
				lacking++;
				lacking_joined += s->joined_r[r];
			}
		}
		if (lacking > 0 && lacking_joined > 0 && kind != EK_ALLREDUCE) {
			int *j = malloc(sizeof(int) * (size_t)s->size), nj = 0;
			for (int r = 0; j != NULL && r < s->size; r++)
				if (s->joined_r[r])
					j[nj++] = r;
			msg.len = 0;
			bprintf(&msg, "%s '%s' cannot run while %s ", eng_kind_name(kind), c->key,
			        nj > 1 ? "ranks" : "rank");
			rank_list(&msg, j, nj);
			bprintf(&msg, " %s joined: only allreduce takes part in a join (the joined "
			        "ranks contribute zeros)", nj > 1 ? "have" : "has");
			free(j);
			put_error(out, c->key, (const char *)msg.p, msg.len);
			centry_remove(s, c);
			continue;
		}
		if (lacking > lacking_joined)
			continue;
		msg.len = 0;
		if (coord_mismatch(s, c, &msg)) {
			put_error(out, c->key, (const char *)msg.p, msg.len);
			centry_remove(s, c);
			continue;
		}
		if (c->from_cache_all && s->njoined == 0 && c->slot >= 0 && c->slot < s->cache.n &&
		    strcmp(s->cache.slot[c->slot].key, c->key) == 0) {
			bput_u8(out, 'C');
			bput_u32(out, (uint32_t)c->slot);
		} else {
			bput_u8(out, 'R');
			bput_u32(out, (uint32_t)c->desc_len[ref]);
			bput(out, c->desc[ref], c->desc_len[ref]);
			bput_u8(out, cacheable(kind) && s->njoined == 0 ? 1 : 0);
			if (kind == EK_ALLGATHER) {
				/* tensor-major: [tensor * size + r] */
				eitem *all = calloc((size_t)s->size, sizeof(*all));
				if (all == NULL) {
					free(msg.p);
					return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
				}
				for (int r = 0; r < s->size; r++) {
					if (desc_parse(c->desc[r], c->desc_len[r], &all[r], err) != KHOR_SUCCESS) {
						for (int q = 0; q < r; q++)
							item_free_tensors(&all[q]);
						free(all);
						free(msg.p);
						return err->status;
					}
				}
				for (int i = 0; i < all[ref].n; i++)
					for (int r = 0; r < s->size; r++)
						bput_u64(out, (uint64_t)all[r].t[i].dims[0]);
				for (int r = 0; r < s->size; r++)
					item_free_tensors(&all[r]);
				free(all);
			}
		}
		/* The timeline: when each rank became ready (the coordinator's clock), on every
		 * tensor's lane; this rank's own handle starts its negotiation span at the first. */
		if (timeline_on(e)) {
			char what[32];
			pthread_mutex_lock(&e->mu);
			khor_handle *mine = emap_get(&s->keys, c->key);
			if (mine != NULL && c->first_ns < mine->t_enqueue)
				mine->t_negotiate = c->first_ns;
			pthread_mutex_unlock(&e->mu);
			for (const char *k = c->key; k != NULL;) {
				const char *nl = strchr(k, '\n');
				char name[1024];
				snprintf(name, sizeof(name), "%.*s", nl != NULL ? (int)(nl - k) : (int)strlen(k),
				         k);
				for (int r = 0; r < s->size; r++) {
					if (c->desc[r] == NULL)
						continue;
					snprintf(what, sizeof(what), "rank %d ready", r);
					timeline_instant(e, name, what, c->ready_ns[r]);
				}
				k = nl != NULL ? nl + 1 : NULL;
			}
		}
		centry_remove(s, c);
	}
	/* The stall inspector. */
	if (s->e->s.stall_check_s > 0 && now >= s->next_stall_check_ns) {
		uint64_t check = (uint64_t)(s->e->s.stall_check_s * 1e9);
		uint64_t shut = (uint64_t)(s->e->s.stall_shutdown_s * 1e9);
		s->next_stall_check_ns = now + check / 4 + 1;
		for (centry *c = s->first, *next; c != NULL; c = next) {
			next = c->next;
			if (now - c->first_ns < check)
				continue;
			msg.len = 0;
			stall_msg(s, c, now, &msg);
			bput_u8(&msg, 0);
			if (shut > 0 && now - c->first_ns >= shut) {
				KLOG_ERR("engine: %s; failing it on every rank (KHOR_STALL_SHUTDOWN_TIME "
				         "%.0f s)", (const char *)msg.p, s->e->s.stall_shutdown_s);
				bbuf m2 = { 0 };
				bprintf(&m2, "stalled for %.0f s (KHOR_STALL_SHUTDOWN_TIME): %s",
				        (double)(now - c->first_ns) / 1e9, (const char *)msg.p);
				put_error(out, c->key, (const char *)m2.p, m2.len);
				free(m2.p);
				centry_remove(s, c);
				continue;
			}
			if (c->warned_ns == 0 || now - c->warned_ns >= check) {
				KLOG_WARN("engine stall: %s (KHOR_STALL_CHECK_TIME %.0f s)",
				          (const char *)msg.p, s->e->s.stall_check_s);
				c->warned_ns = now;
			}
		}
	}
	free(msg.p);
	if (s->njoined == s->size) {
		bput_u8(out, 'D');
		bput_i32(out, s->last_joiner);
		memset(s->joined_r, 0, sizeof(bool) * (size_t)s->size);
		s->njoined = 0;
	}
	if (s->nstop == s->size) {
		for (centry *c = s->first, *next; c != NULL; c = next) {
			next = c->next;
			bbuf m = { 0 };
			int *miss = malloc(sizeof(int) * (size_t)s->size);
			int nm = miss != NULL ? missing_ranks(s, c, miss) : 0;
			bprintf(&m, "'%s': the engine was stopped on every rank before %s ", c->key,
			        nm > 1 ? "ranks" : "rank");
			rank_list(&m, miss, nm);
			bprintf(&m, " submitted it");
			put_error(out, c->key, (const char *)m.p, m.len);
			free(m.p);
			free(miss);
			centry_remove(s, c);
		}
		bput_u8(out, 'X');
	}
	return out->oom ? kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory")
	                : KHOR_SUCCESS;
}

/* Tells every worker the set failed (best effort: a short wait, then give up). */
static void coord_abort(eset *s, const bool *go_sent, const kerr *cause)
{
	coll_comm *cc = &s->ctl->cc;
	int nw = s->size - 1;
	msg_hdr *h = calloc((size_t)nw, sizeof(*h));
	coll_xfer *xs = calloc((size_t)nw, sizeof(*xs));
	kerr err;

	if (h == NULL || xs == NULL) {
		free(h);
		free(xs);
		return;
	}
	for (int w = 1; w < s->size; w++) {
		msg_hdr *m = &h[w - 1];
		m->magic = MSG_MAGIC;
		m->type = M_ABORT;
		m->cycle = s->cycle;
		size_t l = strlen(cause->text);
		m->len = (uint32_t)(l < MSG_INLINE ? l : MSG_INLINE);
		memcpy(m->data, cause->text, m->len);
		if (coll_post(cc, &xs[w - 1], w, true, m, sizeof(*m),
		              ctl_tag(s, go_sent != NULL && go_sent[w] ? 2 : 0), kdeadline_in_ms(100),
		              &err) != KHOR_SUCCESS)
			xs[w - 1].req = NULL;
	}
	kdeadline dl = kdeadline_in_ms(200);
	for (;;) {
		bool left = false;
		for (int i = 0; i < nw; i++) {
			khor_status st = KHOR_SUCCESS;
			if (xs[i].req != NULL && !coll_done(cc, &xs[i], &st, &err))
				left = true;
		}
		if (!left || kdeadline_passed(dl))
			break;
		coll_progress(cc, 1, (1u << cc->ntps) - 1, NULL, &err);
	}
	coll_drain(cc, xs, nw);
	free(h);
	free(xs);
}

bool negotiate_coord_cycle(eset *s)
{
	struct khor_engine *e = s->e;
	coll_comm *cc = &s->ctl->cc;
	int n = s->size, nw = n - 1;
	msg_hdr *in = calloc((size_t)n, sizeof(*in));
	msg_hdr *out = calloc((size_t)n, sizeof(*out)), *go = calloc((size_t)n, sizeof(*go));
	coll_xfer *rx = calloc((size_t)n, sizeof(*rx));
	/* Per worker: its GO, then its RESP (header and payload). */
	coll_xfer *tx = calloc((size_t)n * 3, sizeof(*tx));
	bool *got = calloc((size_t)n, sizeof(bool)), *go_sent = calloc((size_t)n, sizeof(bool));
	uint8_t **payload = calloc((size_t)n, sizeof(*payload));
	bbuf mine = { 0 }, resp = { 0 };
	khor_status st = KHOR_SUCCESS;
	kerr err;
	int which, ngot = 0;
	bool ok = false;
	kdeadline never = kdeadline_in_ms(-1), stop_dl = kdeadline_in_ms(cc->timeout_ms);
	const char *doing = "waiting for reports";

	kerr_clear(&err);
	if (in == NULL || out == NULL || go == NULL || rx == NULL || tx == NULL || got == NULL ||
	    go_sent == NULL || payload == NULL) {
		st = kerr_set(&err, KHOR_ERR_NO_MEMORY, "out of memory");
		goto fail;
	}
	for (int w = 1; w < n; w++) {
		st = coll_post(cc, &rx[w - 1], w, false, &in[w], sizeof(in[w]), ctl_tag(s, 0),
		               kdeadline_in_ms(cc->timeout_ms), &err);
		if (st != KHOR_SUCCESS)
			goto fail;
	}
	/* Idle until there is news: ours, a worker's report, or a stall to look at. */
	bool spin = true;
	for (;;) {
		if (has_news(s) || ngot > 0)
			break;
		int idle = 0;
		if (s->first != NULL && e->s.stall_check_s > 0) {
			int64_t left = (int64_t)(s->next_stall_check_ns - kclock_ns()) / 1000000;
			idle = left < 1 ? 1 : left > 1000 ? 1000 : (int)left;
		}
		st = ctl_wait(s, rx, nw, true, s->stop_sent ? stop_dl : never, spin, idle, &which,
		              &err);
		spin = false;
		if (st == KHOR_ERR_TIMEOUT) {
			bbuf m = { 0 };
			int *late = malloc(sizeof(int) * (size_t)n), nl = 0;
			for (int r = 0; late != NULL && r < n; r++)
				if (!s->stop_r[r])
					late[nl++] = r;
			rank_list(&m, late, nl);
			bput_u8(&m, 0);
			kerr_set(&err, st, "rank(s) %s did not call khor_engine_stop within KHOR_TIMEOUT "
			         "(%lld ms) of this one", m.p != NULL ? (const char *)m.p : "?",
			         (long long)cc->timeout_ms);
			free(m.p);
			free(late);
		}
		if (st != KHOR_SUCCESS) {
			doing = "waiting for reports";
			goto fail;
		}
		if (which >= 0) {
			got[which + 1] = true;
			ngot++;
		} else if (which == -2 && s->first != NULL) {
			/* A stall check is due: a cycle of its own, so that shutdowns go out. */
			if (kclock_ns() >= s->next_stall_check_ns)
				break;
		}
	}
	/* KHOR_CYCLE_TIME: at most one cycle per period; what arrives meanwhile joins it. */
	uint64_t cyc_ns = atomic_load(&e->cycle_us) * 1000ull;
	if (cyc_ns > 0) {
		uint64_t start_at = s->last_cycle_ns + cyc_ns;
		while (kclock_ns() < start_at) {
			int ms = (int)((start_at - kclock_ns()) / 1000000) + 1;
			st = ctl_wait(s, rx, nw, false, never, false, ms, &which, &err);
			if (st != KHOR_SUCCESS)
				goto fail;
			if (which >= 0) {
				got[which + 1] = true;
				ngot++;
			}
		}
	}
	uint64_t t_neg = kclock_ns();
	s->last_cycle_ns = t_neg;
	if (timeline_on(e) && e->s.mark_cycles)
		timeline_cycle(e, s->id, s->cycle, t_neg);
	/* Ask the workers that have not reported. */
	doing = "asking for reports";
	for (int w = 1; w < n; w++) {
		if (got[w])
			continue;
		memset(&go[w], 0, sizeof(go[w]));
		go[w].magic = MSG_MAGIC;
		go[w].type = M_GO;
		go[w].cycle = s->cycle;
		st = coll_post(cc, &tx[3 * w], w, true, &go[w], sizeof(go[w]), ctl_tag(s, 0),
		               kdeadline_in_ms(cc->timeout_ms), &err);
		if (st != KHOR_SUCCESS)
			goto fail;
		go_sent[w] = true;
	}
	/* Our own report goes through the same merge as theirs. */
	build_report(s, &mine);
	if (mine.oom) {
		st = kerr_set(&err, KHOR_ERR_NO_MEMORY, "out of memory");
		goto fail;
	}
	if ((st = coord_merge(s, 0, mine.p, mine.len, &err)) != KHOR_SUCCESS)
		goto fail;
	doing = "collecting reports";
	kdeadline dl = kdeadline_in_ms(cc->timeout_ms);
	while (ngot < nw) {
		st = ctl_wait(s, rx, nw, false, dl, true, 0, &which, &err);
		if (st == KHOR_ERR_TIMEOUT) {
			int *late = malloc(sizeof(int) * (size_t)n), nl = 0;
			bbuf m = { 0 };
			for (int w = 1; late != NULL && w < n; w++)
				if (!got[w])
					late[nl++] = w;
			bprintf(&m, "%s ", nl > 1 ? "ranks" : "rank");
			rank_list(&m, late, nl);
			bput_u8(&m, 0);
			kerr_set(&err, KHOR_ERR_TIMEOUT, "%s did not report within KHOR_TIMEOUT "
			         "(%lld ms); the coordinator asked every rank at the cycle's start",
			         m.p != NULL ? (const char *)m.p : "some ranks", (long long)cc->timeout_ms);
			free(m.p);
			free(late);
			goto fail;
		}
		if (st != KHOR_SUCCESS)
			goto fail;
		got[which + 1] = true;
		ngot++;
	}
	for (int w = 1; w < n; w++) {
		if ((st = check_hdr(s, &in[w], w, &err)) != KHOR_SUCCESS)
			goto fail;
		if (in[w].type != M_REQ) {
			st = kerr_set(&err, KHOR_ERR_PROTOCOL, "rank %d sent message type %u, not a "
			              "report", w, in[w].type);
			goto fail;
		}
		if ((st = ctl_payload(s, w, &in[w], 0, &payload[w], &err)) != KHOR_SUCCESS)
			goto fail;
		if ((st = coord_merge(s, w, payload[w], in[w].len, &err)) != KHOR_SUCCESS)
			goto fail;
	}
	/* Autotune's agreed values ride on the response. */
	if (e->at != NULL && s->id == 0 && s->cycles > 0) {
		uint64_t fb;
		double cm;
		if (autotune_cycle(e->at, s->bytes_done, &fb, &cm)) {
			bput_u8(&resp, 'T');
			bput_u64(&resp, fb);
			bput_u64(&resp, (uint64_t)(cm * 1000.0));
		}
	}
	doing = "answering";
	if ((st = coord_respond(s, &resp, &err)) != KHOR_SUCCESS)
		goto fail;
	for (int w = 1; w < n; w++) {
		st = ctl_send(s, w, M_RESP, go_sent[w] ? 2 : 0, &resp, &out[w], &tx[3 * w + 1], &err);
		if (st != KHOR_SUCCESS)
			goto fail;
	}
	if ((st = ctl_flush(s, tx, 3 * n, &err)) != KHOR_SUCCESS)
		goto fail;
	s->negotiate_ns += kclock_ns() - t_neg;
	ok = apply_response(s, resp.p, resp.len);
	s->cycle++;
	goto out;
fail:
	coll_drain(cc, rx, nw);
	coll_drain(cc, tx, 3 * n);
	{
		kerr e2;
		kerr_set(&e2, err.status != KHOR_SUCCESS ? err.status : st,
		         "rank %d on %s, engine set %d, negotiation cycle %u (coordinator), %s: %s",
		         s->ctl->ctx->rank, s->ctl->ctx->cfg.hostname, s->id, s->cycle, doing,
		         err.text);
		if (go_sent != NULL)
			coord_abort(s, go_sent, &e2);
		engine_fail_set(s, &e2);
	}
out:
	for (int w = 0; payload != NULL && w < n; w++)
		free(payload[w]);
	free(payload);
	free(in);
	free(out);
	free(go);
	free(rx);
	free(tx);
	free(got);
	free(go_sent);
	free(mine.p);
	free(resp.p);
	return ok;
}
