/*
 * fuzz_negotiate.c -- libFuzzer harness for the engine's parsers of bytes from another rank:
 * a tensor descriptor (desc_parse, desc_key), a worker's report as the coordinator merges
 * it (table_merge), the coordinator's answer built from those reports (coordinator_respond,
 * mismatch_find), and a response as every rank applies it (response_parse), which also fills
 * and names the response cache. No links: a process set of 4 is set up by hand with just
 * what the parsers touch, as tests/engine/test_negotiate.c does. Input byte 0 picks the
 * target (mod 3), the rest is the bytes:
 *
 *   0  a descriptor: whatever parses re-encodes (desc_make) to the same bytes, and its key is
 *      its names joined by '\n';
 *   1  reports: records { u8 rank (mod 4), u16 len, len bytes }, each merged as that rank's
 *      report; the coordinator's answer to what was taken must then succeed and be
 *      applied without error by a worker whose cache matches the coordinator's (the cache
 *      slots and the items agree on both);
 *   2  a response, applied by a worker with two reported handles and two cached slots:
 *      malformed ones fail the set (status PROTOCOL), and the cache stays within its
 *      capacity.
 *
 *   clang -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -DKHOR_BUILDING_LIBRARY -Iinclude \
 *         -I. tests/engine/fuzz_negotiate.c engine/desc.c engine/bbuf.c engine/map.c \
 *         engine/table.c engine/response.c engine/response_cache.c engine/coordinator.c \
 *         engine/mismatch.c engine/stall.c engine/queue.c engine/timeline.c base/err.c \
 *         base/clock.c base/log.c base/dtype.c -lpthread -o fuzz_negotiate
 *   ./fuzz_negotiate -max_total_time=60
 */
#include "engine/coordinator.h"
#include "engine/desc.h"
#include "engine/queue.h"
#include "engine/response.h"
#include "engine/response_cache.h"
#include "engine/table.h"

#include "base/log.h"
#include "tests/support/fuzz_split.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

#define NRANKS 4

/* The runtime's word on an elastic job's loss: queue_fail_set asks it only for a set with a
 * context (these have none), so it is never reached here. */
khor_status comm_elastic_verdict(kctx *x, kerr *e)
{
	(void)x;
	(void)e;
	__builtin_trap();
}

/* The runtime's telling of a fixed job's failure: likewise only for a set with a context. */
void comm_job_failure(kctx *x, kerr *e)
{
	(void)x;
	(void)e;
	__builtin_trap();
}

/* A set of NRANKS seen from rank `rank`, an empty cache of capacity 4, no links. */
static eset *bare_set(int rank)
{
	struct khor_engine *e = calloc(1, sizeof(*e));
	eset *s = calloc(1, sizeof(*s));

	CHECK(e != NULL && s != NULL);
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	e->efd = -1;
	s->e = e;
	s->rank = rank;
	s->size = NRANKS;
	klist_init(&s->fresh);
	klist_init(&s->pending);
	klist_init(&s->arrivals);
	klist_init(&s->named);
	s->cache.cap = 4;
	s->joined_r = calloc(NRANKS, sizeof(bool));
	s->stop_r = calloc(NRANKS, sizeof(bool));
	s->stop_told = calloc(NRANKS, sizeof(bool));
	s->peer_stop = calloc(NRANKS, sizeof(bool));
	CHECK(s->joined_r && s->stop_r && s->stop_told && s->peer_stop);
	s->first_stopper = -1;
	s->last_joiner = -1;
	return s;
}

static void bare_free(eset *s)
{
	table_free(s);
	response_cache_free(&s->cache);
	emap_free(&s->keys);
	emap_free(&s->names);
	free(s->peer_stop);
	pthread_mutex_destroy(&s->e->mu);
	pthread_cond_destroy(&s->e->cv);
	free(s->e);
	free(s);
}

/* A handle of one tensor `name` (kind, float32 of shape [dim0, 3]) with its descriptor. */
static khor_handle *handle_new(eset *s, int kind, const char *name, int64_t dim0)
{
	khor_handle *h = calloc(1, sizeof(*h));
	kerr err;

	CHECK(h != NULL);
	klist_init(&h->link);
	klist_init(&h->named_link);
	h->set = s;
	h->eng = s->e;
	h->kind = kind;
	h->op = KHOR_SUM;
	h->prescale = h->postscale = 1.0;
	h->n = 1;
	h->t = calloc(1, sizeof(*h->t));
	CHECK(h->t != NULL);
	h->t[0].name = strdup(name);
	h->t[0].dtype = KHOR_FLOAT32;
	h->t[0].ndim = 2;
	h->t[0].dims[0] = dim0;
	h->t[0].dims[1] = 3;
	h->t[0].count = (size_t)dim0 * 3;
	h->key = strdup(name);
	CHECK(h->t[0].name != NULL && h->key != NULL);
	CHECK(desc_make(h, &err) == KHOR_SUCCESS);
	return h;
}

/* Two cache slots, the same on every rank: "c0" (allreduce) and "c1" (broadcast). */
static void fill_cache(eset *s)
{
	khor_handle *a = handle_new(s, EK_ALLREDUCE, "c0", 2);
	khor_handle *b = handle_new(s, EK_BROADCAST, "c1", 5);

	CHECK(response_cache_put(&s->cache, a->key, a->desc, a->desc_len) == KHOR_SUCCESS);
	CHECK(response_cache_put(&s->cache, b->key, b->desc, b->desc_len) == KHOR_SUCCESS);
	queue_handle_free(a);
	queue_handle_free(b);
}

static void check_cache(const ecache *c)
{
	CHECK(c->n >= 0 && c->n <= c->cap);
	for (int i = 0; i < c->n; i++) {
		CHECK(c->slot[i].key != NULL);
		CHECK((uintptr_t)emap_get(&c->index, c->slot[i].key) == (uintptr_t)(i + 1));
	}
}

/* Every item of a response a rank applied makes sense to run. */
static void check_items(const eset *s, const eresp *r)
{
	CHECK(r->n >= 0 && (r->n == 0 || r->items != NULL));
	for (int i = 0; i < r->n; i++) {
		const eitem *it = &r->items[i];
		if (it->error) {
			CHECK(it->h != NULL && it->msg != NULL);
			continue;
		}
		CHECK(it->kind >= 0 && it->kind < EK_KINDS);
		CHECK(it->n >= 1 && it->t != NULL);
		for (int k = 0; k < it->n; k++) {
			CHECK(it->t[k].ndim >= 0 && it->t[k].ndim <= ENG_MAX_DIMS);
			CHECK(it->t[k].name != NULL);
		}
		CHECK(it->kind != EK_ALLGATHER || it->dim0 != NULL);
		(void)s;
	}
}

static void fuzz_desc(const uint8_t *d, size_t n)
{
	eitem it;
	kerr err;
	char *key = desc_key(d, n);

	if (desc_parse(d, n, &it, &err) != KHOR_SUCCESS) {
		CHECK(err.status == KHOR_ERR_PROTOCOL || err.status == KHOR_ERR_NO_MEMORY);
		free(key);
		return;
	}
	/* What parses has a key. */
	CHECK(key != NULL);
	/* desc_parse read each name's length from the bytes; a shorter strlen = a NUL in it. */
	bool nul = false;
	brd r = { d, n, 24, false };
	for (int i = 0; i < it.n; i++) {
		uint16_t nl = bget_u16(&r);
		nul |= strlen(it.t[i].name) != nl;
		r.off += nl + 2u + 8u * (size_t)it.t[i].ndim;
		CHECK(it.t[i].ndim <= ENG_MAX_DIMS);
		for (int k = 0; k < it.t[i].ndim; k++)
			CHECK(it.t[i].dims[k] >= 0);
	}
	CHECK(!r.bad && r.off == n);
	if (!nul) {
		/* The key is the names joined by '\n' ... */
		size_t off = 0;
		for (int i = 0; i < it.n; i++) {
			size_t nl = strlen(it.t[i].name);
			if (i > 0)
				CHECK(key[off++] == '\n');
			CHECK(memcmp(key + off, it.t[i].name, nl) == 0);
			off += nl;
		}
		CHECK(key[off] == '\0');
		/* ... and the item re-encodes to the very bytes. */
		khor_handle h;
		memset(&h, 0, sizeof(h));
		h.kind = it.kind;
		h.op = it.op;
		h.root = it.root;
		h.prescale = it.prescale;
		h.postscale = it.postscale;
		h.n = it.n;
		h.t = it.t;
		CHECK(desc_make(&h, &err) == KHOR_SUCCESS);
		CHECK(h.desc_len == n && memcmp(h.desc, d, n) == 0);
		free(h.desc);
	}
	desc_free_tensors(&it);
	free(key);
}

/* The coordinator takes reports; its answer must then apply cleanly on a worker. */
static void fuzz_reports(const uint8_t *d, size_t n)
{
	eset *c = bare_set(0), *w = bare_set(1);
	brd r = { d, n, 0, false };
	bbuf out = { 0 };
	kerr err;

	fill_cache(c);
	fill_cache(w);
	while (r.off < r.len) {
		int from = bget_u8(&r) % NRANKS;
		uint16_t len = bget_u16(&r);
		if (r.bad || len > r.len - r.off)
			break;
		/* An exact-size heap copy, so ASan sees any read past the report's end. */
		uint8_t *p = malloc(len ? len : 1);
		CHECK(p != NULL);
		memcpy(p, d + r.off, len);
		r.off += len;
		kerr_clear(&err);
		khor_status st = table_merge(c, from, p, len, &err);
		free(p);
		CHECK(st == KHOR_SUCCESS || st == KHOR_ERR_PROTOCOL || st == KHOR_ERR_NO_MEMORY);
		if (st != KHOR_SUCCESS)
			CHECK(strstr(err.text, "rank") != NULL); /* names who sent it */
	}
	/* Every entry of the table holds descriptors of reporting ranks only. */
	for (klist *k = c->arrivals.next; k != &c->arrivals; k = k->next) {
		centry *e = KLIST_ENTRY(k, centry, link);
		CHECK(e->have >= 1 && e->have <= NRANKS);
	}
	kerr_clear(&err);
	khor_status st = coordinator_respond(c, &out, &err);
	CHECK(st == KHOR_SUCCESS || st == KHOR_ERR_NO_MEMORY);
	if (st == KHOR_SUCCESS) {
		/* What the coordinator writes, every rank reads: the same cache, no error. */
		eresp rw, rc;
		bool okw = response_parse(w, out.p, out.len, &rw);
		bool okc = response_parse(c, out.p, out.len, &rc);
		CHECK(okw && okc);
		check_items(w, &rw);
		CHECK(rw.n == rc.n);
		CHECK(w->cache.n == c->cache.n);
		for (int i = 0; i < w->cache.n; i++)
			CHECK(strcmp(w->cache.slot[i].key, c->cache.slot[i].key) == 0 &&
			      w->cache.slot[i].desc_len == c->cache.slot[i].desc_len);
		check_cache(&w->cache);
		response_free(&rw);
		response_free(&rc);
	}
	free(out.p);
	bare_free(c);
	bare_free(w);
}

/* A response from the coordinator, as a worker with two reported handles applies it. */
static void fuzz_response(const uint8_t *d, size_t n)
{
	eset *s = bare_set(1);
	khor_handle *h[2];
	eresp out;

	fill_cache(s);
	h[0] = handle_new(s, EK_ALLREDUCE, "c0", 2);
	h[1] = handle_new(s, EK_ALLGATHER, "g", 4);
	pthread_mutex_lock(&s->e->mu);
	for (int i = 0; i < 2; i++) {
		CHECK(queue_push_locked(s, h[i]) == KHOR_SUCCESS);
		queue_report_locked(s, h[i]);
	}
	pthread_mutex_unlock(&s->e->mu);
	if (response_parse(s, d, n, &out)) {
		CHECK(!s->failed);
		check_items(s, &out);
		response_free(&out);
	} else {
		CHECK(s->failed);
		CHECK(s->err.status == KHOR_ERR_PROTOCOL || s->err.status == KHOR_ERR_NO_MEMORY);
	}
	check_cache(&s->cache);
	pthread_mutex_lock(&s->e->mu);
	for (int i = 0; i < 2; i++) {
		queue_release_locked(h[i]);
		klist_del(&h[i]->link);
	}
	pthread_mutex_unlock(&s->e->mu);
	for (int i = 0; i < 2; i++)
		queue_handle_free(h[i]);
	bare_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const fuzz_part parts[] = { fuzz_desc, fuzz_reports, fuzz_response };

	klog_threshold = -1; /* a failed set logs at ERR: keep the fuzzer's output clean */
	fuzz_split(data, size, 65536, parts, sizeof(parts) / sizeof(parts[0]));
	return 0;
}
