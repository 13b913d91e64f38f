/*
 * test_negotiate.c -- the engine's parsers of negotiation bytes against bad input: tensor
 * descriptors (desc_parse, desc_key), a worker's report as the coordinator reads it
 * (table_merge) and a response as a rank applies it (response_parse). Every truncation,
 * out-of-range field and unknown record must be refused with KHOR_ERR_PROTOCOL (a response
 * fails the set), never read past the bytes or index outside the cache.
 *
 * No links: a process set is set up by hand with just what the parsers touch.
 */
#include "engine/desc.h"
#include "engine/queue.h"
#include "engine/response.h"
#include "engine/table.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* A valid descriptor: allreduce sum of "grad/w" float32 [3, 4] and "grad/b" float64 [4]. */
static uint8_t *good_desc(size_t *len)
{
	khor_handle h;
	etensor t[2];
	kerr err;

	memset(&h, 0, sizeof(h));
	memset(t, 0, sizeof(t));
	h.kind = EK_ALLREDUCE;
	h.op = KHOR_SUM;
	h.prescale = h.postscale = 1.0;
	h.n = 2;
	h.t = t;
	t[0].name = "grad/w";
	t[0].dtype = KHOR_FLOAT32;
	t[0].ndim = 2;
	t[0].dims[0] = 3;
	t[0].dims[1] = 4;
	t[1].name = "grad/b";
	t[1].dtype = KHOR_FLOAT64;
	t[1].ndim = 1;
	t[1].dims[0] = 4;
	cr_assert_eq(desc_make(&h, &err), KHOR_SUCCESS);
	*len = h.desc_len;
	return h.desc;
}

static void item_clear(eitem *it)
{
	for (int i = 0; i < it->n; i++)
		free(it->t[i].name);
	free(it->t);
}

Test(negotiate, descriptor_round_trip)
{
	size_t len;
	uint8_t *d = good_desc(&len);
	eitem it;
	kerr err;

	cr_assert_eq(desc_parse(d, len, &it, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_eq(it.kind, EK_ALLREDUCE);
	cr_expect_eq(it.n, 2);
	cr_expect_str_eq(it.t[0].name, "grad/w");
	cr_expect_eq(it.t[0].count, 12);
	cr_expect_eq(it.t[1].dtype, KHOR_FLOAT64);
	item_clear(&it);
	char *key = desc_key(d, len);
	cr_assert_not_null(key);
	cr_expect_str_eq(key, "grad/w\ngrad/b");
	free(key);
	free(d);
}

Test(negotiate, every_truncated_descriptor_is_refused)
{
	size_t len;
	uint8_t *d = good_desc(&len);
	eitem it;
	kerr err;

	for (size_t l = 0; l < len; l++) {
		uint8_t *copy = malloc(l + 1); /* exactly l bytes readable: ASan sees overreads */
		memcpy(copy, d, l);
		cr_expect_eq(desc_parse(copy, l, &it, &err), KHOR_ERR_PROTOCOL,
		             "a descriptor cut to %zu of %zu bytes was accepted", l, len);
		char *key = desc_key(copy, l);
		cr_expect_null(key, "desc_key accepted a descriptor cut to %zu of %zu bytes", l, len);
		free(key);
		free(copy);
	}
	/* One byte too many is refused too. */
	uint8_t *longer = malloc(len + 1);
	memcpy(longer, d, len);
	longer[len] = 0;
	cr_expect_eq(desc_parse(longer, len + 1, &it, &err), KHOR_ERR_PROTOCOL);
	free(longer);
	free(d);
}

/* Offsets in good_desc's bytes: kind 0, op 1, n 2-3, root 4, scales 8 and 16, name length
 * 24-25, "grad/w" 26-31, dtype 32, ndim 33, dims 34-49. */
Test(negotiate, out_of_range_descriptor_fields_are_refused)
{
	size_t len;
	uint8_t *d = good_desc(&len);
	eitem it;
	kerr err;
	struct {
		size_t at;
		uint8_t v[8];
		size_t n;
		const char *what;
	} bad[] = {
		{ 0, { EK_KINDS }, 1, "an unknown kind" },
		{ 2, { 0, 0 }, 2, "no tensors" },
		{ 2, { 0xff, 0xff }, 2, "more tensors than bytes" },
		{ 24, { 0xff, 0xff }, 2, "a name longer than the bytes" },
		{ 32, { 99 }, 1, "an unknown dtype" },
		{ 33, { ENG_MAX_DIMS + 1 }, 1, "too many dims" },
		{ 34, { 0, 0, 0, 0, 0, 0, 0, 0x80 }, 8, "a negative dim" },
		{ 34, { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f }, 8, "an overflowing shape" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint8_t *copy = malloc(len);
		memcpy(copy, d, len);
		memcpy(copy + bad[i].at, bad[i].v, bad[i].n);
		cr_expect_eq(desc_parse(copy, len, &it, &err), KHOR_ERR_PROTOCOL,
		             "%s was accepted", bad[i].what);
		free(copy);
	}
	free(d);
}

/* A coordinator's set of size n with an empty cache of capacity 4, no links. */
static eset *bare_set(int n)
{
	struct khor_engine *e = calloc(1, sizeof(*e));
	eset *s = calloc(1, sizeof(*s));

	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	e->efd = -1;
	s->e = e;
	s->size = n;
	klist_init(&s->fresh);
	klist_init(&s->pending);
	klist_init(&s->arrivals);
	s->cache.cap = 4;
	klist_init(&s->named);
	s->joined_r = calloc((size_t)n, sizeof(bool));
	s->stop_r = calloc((size_t)n, sizeof(bool));
	s->stop_told = calloc((size_t)n, sizeof(bool));
	s->peer_stop = calloc((size_t)n, sizeof(bool));
	s->first_stopper = -1;
	return s;
}

static void bare_free(eset *s)
{
	table_free(s);
	emap_free(&s->keys);
	emap_free(&s->names);
	free(s->peer_stop);
	pthread_mutex_destroy(&s->e->mu);
	pthread_cond_destroy(&s->e->cv);
	free(s->e);
	free(s);
}

typedef struct rec {
	uint8_t b[256];
	size_t n;
} rec;

static void put(rec *r, const void *v, size_t n)
{
	memcpy(r->b + r->n, v, n);
	r->n += n;
}

static void put_u8(rec *r, uint8_t v) { put(r, &v, 1); }
static void put_u32(rec *r, uint32_t v) { put(r, &v, 4); }

Test(negotiate, malformed_reports_are_refused)
{
	size_t len;
	uint8_t *d = good_desc(&len);
	rec r[6];
	const char *what[6] = { "an unknown record", "a descriptor longer than the report",
	                        "a malformed descriptor", "a cache slot of an empty cache",
	                        "cache slot 0xffffffff", "more slots than bytes" };

	memset(r, 0, sizeof(r));
	put_u8(&r[0], 'Z');
	put_u8(&r[1], 'F');
	put_u32(&r[1], (uint32_t)len + 1);
	put(&r[1], d, len);
	put_u8(&r[2], 'F');
	put_u32(&r[2], 3);
	put(&r[2], "abc", 3);
	put_u8(&r[3], 'H');
	put_u32(&r[3], 1);
	put_u32(&r[3], 0);
	put_u8(&r[4], 'H');
	put_u32(&r[4], 1);
	put_u32(&r[4], 0xffffffffu);
	put_u8(&r[5], 'H');
	put_u32(&r[5], 1000);
	put_u32(&r[5], 0);
	for (int i = 0; i < 6; i++) {
		eset *s = bare_set(2);
		kerr err;
		kerr_clear(&err);
		cr_expect_eq(table_merge(s, 1, r[i].b, r[i].n, &err), KHOR_ERR_PROTOCOL,
		             "a report with %s was accepted", what[i]);
		bare_free(s);
	}
	/* And a good one is taken. */
	rec ok = { .n = 0 };
	put_u8(&ok, 'F');
	put_u32(&ok, (uint32_t)len);
	put(&ok, d, len);
	eset *s = bare_set(2);
	kerr err;
	cr_expect_eq(table_merge(s, 1, ok.b, ok.n, &err), KHOR_SUCCESS, "%s", err.text);
	cr_expect_not_null(emap_get(&s->table, "grad/w\ngrad/b"));
	bare_free(s);
	free(d);
}

/*
 * A descriptor with a key but not a valid one (an allgather of no tensors; an unknown kind)
 * is refused at the merge, naming its sender. Found by tests/engine/fuzz_negotiate.c: it
 * used to be taken, and when every rank sent it alike (mismatch_find compares bytes) the
 * coordinator's answer failed (the allgather's dims) or every rank's reading of the
 * response did, naming nobody. The fuzzer's inputs are in tests/engine/fuzz_corpus.
 */
Test(negotiate, a_malformed_descriptor_is_refused_at_the_merge_naming_the_rank)
{
	uint8_t kinds[2] = { EK_ALLGATHER, EK_KINDS + 2 };

	for (int i = 0; i < 2; i++) {
		uint8_t d[24] = { kinds[i], 0, 0, 0 }; /* n = 0 tensors */
		rec r = { .n = 0 };
		eset *s = bare_set(4);
		kerr err;
		put_u8(&r, 'F');
		put_u32(&r, sizeof(d));
		put(&r, d, sizeof(d));
		kerr_clear(&err);
		cr_expect_eq(table_merge(s, 2, r.b, r.n, &err), KHOR_ERR_PROTOCOL,
		             "a descriptor of kind %u and no tensors was taken", kinds[i]);
		cr_expect(strstr(err.text, "rank 2") != NULL, "the error does not name rank 2: %s",
		          err.text);
		cr_expect_null(emap_get(&s->table, ""), "the table holds the malformed request");
		bare_free(s);
	}
}

Test(negotiate, malformed_responses_fail_the_set)
{
	size_t len;
	uint8_t *d = good_desc(&len);
	rec r[8];
	const char *what[8] = { "an unknown record", "a slot of an empty cache",
	                        "cache slot 0xffffffff", "a descriptor longer than the response",
	                        "an error key longer than the response", "a truncated join record",
	                        "a stop of rank 5 of 2", "a truncated stop record" };

	memset(r, 0, sizeof(r));
	put_u8(&r[0], 'Z');
	put_u8(&r[1], 'C');
	put_u32(&r[1], 0);
	put_u8(&r[2], 'C');
	put_u32(&r[2], 0xffffffffu);
	put_u8(&r[3], 'R');
	put_u32(&r[3], (uint32_t)len + 5);
	put(&r[3], d, len);
	put_u8(&r[4], 'E');
	put(&r[4], (uint16_t[]){ 200 }, 2);
	put(&r[4], "key", 3);
	put_u8(&r[5], 'D');
	put(&r[5], "\1\0", 2);
	put_u8(&r[6], 'Q');
	put_u32(&r[6], 5);
	put_u8(&r[7], 'Q');
	put(&r[7], "\1", 1);
	for (int i = 0; i < 8; i++) {
		eset *s = bare_set(2);
		eresp out;
		cr_expect_not(response_parse(s, r[i].b, r[i].n, &out), "a response with %s was "
		              "applied", what[i]);
		cr_expect(s->failed, "a response with %s did not fail the set", what[i]);
		cr_expect_eq(s->err.status, KHOR_ERR_PROTOCOL, "%s: status %d: %s", what[i],
		             s->err.status, s->err.text);
		bare_free(s);
	}
	free(d);
	/* A good stop record: rank 1 has stopped, which this rank (0 here) now knows. */
	eset *s = bare_set(2);
	eresp out;
	rec q = { .n = 0 };
	put_u8(&q, 'Q');
	put_u32(&q, 1);
	cr_expect(response_parse(s, q.b, q.n, &out), "a stop record was refused: %s", s->err.text);
	cr_expect(s->peer_stop[1] && s->first_stopper == 1, "rank 1's stop was not recorded");
	response_free(&out);
	bare_free(s);
}

/*
 * A join this rank has enqueued but not reported yet (it is still in the fresh list) when a
 * peer's stop record arrives: it fails with the stop's cause and leaves the fresh list, so
 * the next report does not walk a completed handle (found in review: freed there when its
 * owner had let go of it).
 */
Test(negotiate, a_stop_fails_a_join_not_yet_reported_and_unlinks_it)
{
	eset *s = bare_set(2);
	kctx *x = calloc(1, sizeof(*x));
	khor_comm *u = calloc(1, sizeof(*u));
	khor_handle *h = calloc(1, sizeof(*h));
	eresp out;
	rec q = { .n = 0 };

	cr_assert(x != NULL && u != NULL && h != NULL);
	u->ctx = x;
	s->user = u;
	s->rank = 1;
	klist_init(&h->link);
	klist_init(&h->named_link);
	h->set = s;
	h->eng = s->e;
	h->kind = EK_JOIN;
	h->key = strdup("join");
	pthread_mutex_lock(&s->e->mu);
	cr_assert_eq(queue_push_locked(s, h), KHOR_SUCCESS);
	pthread_mutex_unlock(&s->e->mu);
	put_u8(&q, 'Q');
	put_u32(&q, 0);
	cr_expect(response_parse(s, q.b, q.n, &out), "a stop record was refused: %s", s->err.text);
	cr_expect(h->done && h->status == KHOR_ERR_REMOTE, "the join did not fail (done %d, "
	          "status %d)", h->done, h->status);
	cr_expect(klist_empty(&s->fresh), "the failed join is still in the fresh list");
	response_free(&out);
	queue_handle_free(h);
	free(u);
	free(x);
	bare_free(s);
}
