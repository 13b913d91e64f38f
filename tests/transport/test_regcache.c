/*
 * test_regcache.c -- the registration cache (transport/regcache.h) over a small
 * registration table of its own that really pins pages (mlock/munlock) and counts calls,
 * since tcp and shm register nothing; verbs registration itself is tested on soft-RoCE.
 * Hits, grows, evictions by count and by bytes, invalidation of entries in use (stale,
 * deregistered at the last put, never hit again) and unused, page rounding, scopes,
 * statistics, an injected registration failure, and two threads at once.
 */
#include "transport/regcache.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

struct tp_mr {
	uintptr_t lo, hi;
	unsigned access;
};

struct tp_ctx {
	pthread_mutex_t mu; /* the transport's own lock, as a real one takes */
	atomic_int regs, deregs, live;
	atomic_size_t locked;
	atomic_int fail_next; /* fail this many reg_mr calls */
};

static khor_status fake_reg(tp_ctx *ctx, const tp_reg_desc *d, tp_mr **mr_out, kerr *err)
{
	tp_mr *m;

	if (atomic_load(&ctx->fail_next) > 0) {
		atomic_fetch_sub(&ctx->fail_next, 1);
		return kerr_set(err, KHOR_ERR_NO_MEMORY,
		                "fake reg_mr of %zu bytes at %p: injected "
		                "failure",
		                d->len, d->buf);
	}
	pthread_mutex_lock(&ctx->mu);
	if (mlock(d->buf, d->len) != 0) {
		struct rlimit rl;
		getrlimit(RLIMIT_MEMLOCK, &rl);
		pthread_mutex_unlock(&ctx->mu);
		return kerr_set(err, KHOR_ERR_NO_MEMORY,
		                "mlock of %zu bytes at %p: %s (max locked "
		                "memory %llu bytes)",
		                d->len, d->buf, strerror(errno), (unsigned long long)rl.rlim_cur);
	}
	m = malloc(sizeof(*m));
	m->lo = (uintptr_t)d->buf;
	m->hi = m->lo + d->len;
	m->access = d->access;
	atomic_fetch_add(&ctx->regs, 1);
	atomic_fetch_add(&ctx->live, 1);
	atomic_fetch_add(&ctx->locked, d->len);
	pthread_mutex_unlock(&ctx->mu);
	*mr_out = m;
	return KHOR_SUCCESS;
}

static void fake_dereg(tp_ctx *ctx, tp_mr *m)
{
	pthread_mutex_lock(&ctx->mu);
	munlock((void *)m->lo, m->hi - m->lo);
	atomic_fetch_add(&ctx->deregs, 1);
	atomic_fetch_sub(&ctx->live, 1);
	atomic_fetch_sub(&ctx->locked, m->hi - m->lo);
	pthread_mutex_unlock(&ctx->mu);
	free(m);
}

static const struct transport_ops fake_ops = {
    .name = "fake",
    .version = TP_VERSION,
    .reg_mr = fake_reg,
    .dereg_mr = fake_dereg,
};

static tp_ctx ctx;
static tp_regcache *cache;
static uint8_t *mem;
static size_t page;
#define PAGES 32

static void teardown(void);

/* Criterion runs the suite's .init and then a test's own: the second one replaces the first. */
static void setup_with(int entries, size_t bytes)
{
	regcache_limits lim = {.max_entries = entries, .max_bytes = bytes};
	kerr e;

	teardown();

	memset(&ctx, 0, sizeof(ctx));
	pthread_mutex_init(&ctx.mu, NULL);
	page = (size_t)sysconf(_SC_PAGESIZE);
	mem = aligned_alloc(page, PAGES * page);
	cr_assert_not_null(mem);
	memset(mem, 1, PAGES * page);
	cr_assert_eq(regcache_create(&fake_ops, &ctx, &lim, &cache, &e), KHOR_SUCCESS, "%s",
	             e.text);
}

static void setup(void)
{
	setup_with(64, 1 << 30);
}

static void setup_2_entries(void)
{
	setup_with(2, 1 << 30);
}

static void setup_3_pages(void)
{
	setup_with(64, 3 * (size_t)sysconf(_SC_PAGESIZE));
}

static void setup_for_threads(void)
{
	setup_with(6, 8 * (size_t)sysconf(_SC_PAGESIZE));
}

static void teardown(void)
{
	if (cache == NULL)
		return; /* not set up, or already torn down (suite and test .fini both run) */
	regcache_destroy(cache);
	cache = NULL;
	cr_expect_eq(atomic_load(&ctx.live), 0, "%d registrations left after destroy",
	             atomic_load(&ctx.live));
	cr_expect_eq(atomic_load(&ctx.locked), 0);
	free(mem);
}

static const unsigned ALL = TP_ACCESS_LOCAL_WRITE | TP_ACCESS_REMOTE_WRITE | TP_ACCESS_REMOTE_READ;

static regcache_entry *get_acc(size_t off, size_t len, uint64_t scope, unsigned access)
{
	tp_reg_desc d = {
	    .buf = mem + off, .len = len, .kind = TP_MEM_HOST, .access = access, .dmabuf_fd = -1};
	regcache_entry *e = NULL;
	kerr err;

	cr_assert_eq(regcache_get(cache, &d, scope, &e, &err), KHOR_SUCCESS, "%s", err.text);
	tp_mr *m = regcache_mr(e);
	cr_assert(m->lo <= (uintptr_t)d.buf && (uintptr_t)d.buf + len <= m->hi,
	          "the mr does not cover [%zu, +%zu)", off, len);
	cr_assert_eq(m->access & access, access);
	return e;
}

static regcache_entry *get(size_t off, size_t len, uint64_t scope)
{
	return get_acc(off, len, scope, ALL);
}

static regcache_stats stats(void)
{
	regcache_stats s;
	regcache_stats_get(cache, &s);
	return s;
}

TestSuite(regcache, .init = setup, .fini = teardown, .timeout = 60);

Test(regcache, a_covered_range_hits_and_ranges_round_to_pages)
{
	regcache_entry *a = get(page - 10, 20, REGCACHE_KEEP);
	tp_mr *m = regcache_mr(a);
	cr_expect_eq(m->lo, (uintptr_t)mem, "rounded down to its page");
	cr_expect_eq(m->hi, (uintptr_t)mem + 2 * page, "rounded up to the next page");
	regcache_entry *b = get(100, page, REGCACHE_KEEP);
	cr_expect_eq(a, b, "the same entry covers it");
	regcache_stats s = stats();
	cr_expect_eq(s.hits, 1);
	cr_expect_eq(s.misses, 1);
	cr_expect_eq(s.bytes, 2 * page);
	cr_expect_eq(s.in_use, 1);
	cr_expect_eq(atomic_load(&ctx.regs), 1);
	regcache_put(cache, a);
	regcache_put(cache, b);
	s = stats();
	cr_expect_eq(s.in_use, 0);
	cr_expect_eq(s.entries, 1, "an unused entry stays registered");
	regcache_put(cache, get(0, 2 * page, REGCACHE_KEEP));
	cr_expect_eq(stats().hits, 2);
	cr_expect_eq(atomic_load(&ctx.regs), 1);
}

Test(regcache, unused_neighbours_grow_into_one_entry)
{
	regcache_put(cache, get(0, page, REGCACHE_KEEP));
	regcache_put(cache, get(2 * page, page, REGCACHE_KEEP));
	/* Page 1 touches both: one registration of pages 0-2 replaces the two. */
	regcache_entry *e = get(page, page, REGCACHE_KEEP);
	tp_mr *m = regcache_mr(e);
	cr_expect_eq(m->lo, (uintptr_t)mem);
	cr_expect_eq(m->hi, (uintptr_t)mem + 3 * page);
	regcache_stats s = stats();
	cr_expect_eq(s.grows, 1);
	cr_expect_eq(s.entries, 1);
	cr_expect_eq(s.bytes, 3 * page);
	cr_expect_eq(atomic_load(&ctx.deregs), 2);
	regcache_put(cache, e);
	regcache_put(cache, get(10, 3 * page - 20, REGCACHE_KEEP));
	cr_expect_eq(stats().hits, 1);
}

Test(regcache, entries_in_use_or_of_another_scope_do_not_grow)
{
	regcache_entry *held = get(0, page, REGCACHE_KEEP);
	regcache_entry *next = get(page, page, REGCACHE_KEEP);
	cr_expect_neq(held, next);
	cr_expect_eq(stats().grows, 0, "an entry in use is never replaced");
	regcache_put(cache, held);
	regcache_put(cache, next);
	regcache_put(cache, get(4 * page, page, 7));
	regcache_put(cache, get(5 * page, page, REGCACHE_KEEP));
	cr_expect_eq(stats().grows, 0, "a kept entry never takes in a call's pages");
	cr_expect_eq(stats().entries, 4);
}

Test(regcache, a_wider_access_is_a_miss_that_grows)
{
	regcache_put(cache, get_acc(0, page, REGCACHE_KEEP, TP_ACCESS_LOCAL_WRITE));
	regcache_entry *e = get_acc(0, page, REGCACHE_KEEP, TP_ACCESS_REMOTE_READ);
	cr_expect_eq(regcache_mr(e)->access, TP_ACCESS_LOCAL_WRITE | TP_ACCESS_REMOTE_READ);
	cr_expect_eq(stats().misses, 2);
	cr_expect_eq(stats().entries, 1);
	regcache_put(cache, e);
}

Test(regcache, least_recently_used_is_evicted_beyond_the_count, .init = setup_2_entries,
     .fini = teardown)
{
	regcache_put(cache, get(0, page, REGCACHE_KEEP));
	regcache_put(cache, get(2 * page, page, REGCACHE_KEEP));
	regcache_put(cache, get(0, page, REGCACHE_KEEP)); /* page 0 is now the most recent */
	regcache_put(cache, get(4 * page, page, REGCACHE_KEEP));
	regcache_stats s = stats();
	cr_expect_eq(s.evictions, 1);
	cr_expect_eq(s.entries, 2);
	regcache_put(cache, get(0, page, REGCACHE_KEEP));
	cr_expect_eq(stats().hits, 2, "page 0 stayed");
	regcache_put(cache, get(2 * page, page, REGCACHE_KEEP));
	cr_expect_eq(stats().misses, 4, "page 2 was evicted");
	/* Entries in use are never evicted; the excess goes when they are put. */
	regcache_entry *e[4];
	for (int i = 0; i < 4; i++)
		e[i] = get((size_t)(8 + 2 * i) * page, page, REGCACHE_KEEP);
	cr_expect_eq(stats().entries, 4);
	for (int i = 0; i < 4; i++)
		regcache_put(cache, e[i]);
	cr_expect_eq(stats().entries, 2);
	cr_expect_eq(atomic_load(&ctx.live), 2);
}

Test(regcache, least_recently_used_is_evicted_beyond_the_bytes, .init = setup_3_pages,
     .fini = teardown)
{
	regcache_put(cache, get(0, page, REGCACHE_KEEP));
	regcache_put(cache, get(2 * page, 2 * page, REGCACHE_KEEP));
	cr_expect_eq(stats().evictions, 0, "3 pages fit");
	regcache_put(cache, get(6 * page, page, REGCACHE_KEEP));
	regcache_stats s = stats();
	cr_expect_eq(s.evictions, 1);
	cr_expect_eq(s.bytes, 3 * page, "page 0 went, the oldest");
	cr_expect_eq(s.peak_bytes, 4 * page);
	cr_expect_eq(atomic_load(&ctx.locked), 3 * page);
}

Test(regcache, invalidated_in_use_goes_stale_and_is_deregistered_at_its_last_put)
{
	regcache_entry *a = get(0, 2 * page, REGCACHE_KEEP);
	regcache_entry *a2 = get(0, page, REGCACHE_KEEP);
	cr_expect_eq(regcache_invalidate(cache, mem + page + 5, 1), 1);
	cr_expect_eq(atomic_load(&ctx.deregs), 0, "still in use: still registered");
	regcache_entry *b = get(0, page, REGCACHE_KEEP);
	cr_expect_neq(a, b, "a stale entry never hits");
	cr_expect_eq(stats().grows, 0, "nor grows");
	regcache_put(cache, a);
	cr_expect_eq(atomic_load(&ctx.deregs), 0);
	regcache_put(cache, a2);
	cr_expect_eq(atomic_load(&ctx.deregs), 1, "deregistered at its last put");
	regcache_put(cache, b);
	regcache_stats s = stats();
	cr_expect_eq(s.invalidations, 1);
	cr_expect_eq(s.entries, 1, "the fresh entry is cached as usual");
	cr_expect_eq(s.bytes, page);
	cr_expect_eq(regcache_invalidate(cache, mem + page, page), 0, "no overlap");
}

Test(regcache, invalidated_unused_is_deregistered_at_once)
{
	regcache_put(cache, get(0, page, REGCACHE_KEEP));
	regcache_put(cache, get(4 * page, page, REGCACHE_KEEP));
	cr_expect_eq(regcache_invalidate(cache, mem, 8 * page), 2);
	cr_expect_eq(atomic_load(&ctx.deregs), 2);
	regcache_stats s = stats();
	cr_expect_eq(s.entries, 0);
	cr_expect_eq(s.bytes, 0);
	cr_expect_eq(s.invalidations, 2);
	regcache_put(cache, get(0, page, REGCACHE_KEEP));
	cr_expect_eq(stats().misses, 3, "registered again, from scratch");
}

Test(regcache, scopes_end_with_their_call_or_their_last_put)
{
	regcache_entry *one = get(0, page, REGCACHE_ONESHOT);
	regcache_entry *hit = get(0, 10, REGCACHE_ONESHOT);
	cr_expect_eq(one, hit, "a oneshot entry in use still hits");
	regcache_put(cache, one);
	regcache_put(cache, hit);
	cr_expect_eq(atomic_load(&ctx.deregs), 1, "oneshot: gone at its last put");
	regcache_put(cache, get(2 * page, page, 5));
	regcache_put(cache, get(4 * page, page, 6));
	regcache_put(cache, get(6 * page, page, REGCACHE_KEEP));
	cr_expect_eq(regcache_invalidate_scope(cache, 5), 1);
	cr_expect_eq(regcache_invalidate_scope(cache, REGCACHE_KEEP), 0, "kept ones stay");
	cr_expect_eq(stats().entries, 2);
	regcache_entry *kept = get(6 * page, 8, 6);
	cr_expect_eq(stats().hits, 2, "any scope hits any live entry");
	regcache_put(cache, kept);
}

Test(regcache, a_failed_registration_reports_the_transport_text_and_leaks_nothing)
{
	tp_reg_desc d = {
	    .buf = mem, .len = page, .kind = TP_MEM_HOST, .access = ALL, .dmabuf_fd = -1};
	regcache_entry *e = NULL;
	kerr err;

	atomic_store(&ctx.fail_next, 1);
	cr_expect_eq(regcache_get(cache, &d, REGCACHE_KEEP, &e, &err), KHOR_ERR_NO_MEMORY);
	cr_expect(strstr(err.text, "injected failure") != NULL, "%s", err.text);
	cr_expect_null(e);
	cr_expect_eq(stats().entries, 0);
	/* A grow whose union fails falls back to the range alone. */
	regcache_put(cache, get(0, page, REGCACHE_KEEP));
	atomic_store(&ctx.fail_next, 1);
	e = get(page, page, REGCACHE_KEEP);
	cr_expect_eq(regcache_mr(e)->lo, (uintptr_t)mem + page);
	cr_expect_eq(stats().grows, 0);
	cr_expect_eq(stats().entries, 2, "the old entry was kept");
	regcache_put(cache, e);
	/* A failure with unused entries around: they are let go of, and it tries again. */
	atomic_store(&ctx.fail_next, 1);
	e = get(8 * page, page, REGCACHE_KEEP);
	cr_expect_eq(stats().evictions, 2);
	cr_expect_eq(stats().entries, 1);
	regcache_put(cache, e);
}

Test(regcache, a_real_pin_beyond_the_locked_memory_limit_names_it)
{
	struct rlimit rl;
	getrlimit(RLIMIT_MEMLOCK, &rl);
	if (geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (64u << 20))
		cr_skip_test("mlock is not limited here (root, or ulimit -l above 64 MiB)");
	size_t len = ((size_t)rl.rlim_cur + 2 * page) & ~(page - 1);
	void *big = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(big, MAP_FAILED);
	tp_reg_desc d = {
	    .buf = big, .len = len, .kind = TP_MEM_HOST, .access = ALL, .dmabuf_fd = -1};
	regcache_entry *e = NULL;
	kerr err;
	cr_expect_eq(regcache_get(cache, &d, REGCACHE_KEEP, &e, &err), KHOR_ERR_NO_MEMORY);
	cr_expect(strstr(err.text, "max locked memory") != NULL, "%s", err.text);
	munmap(big, len);
}

struct worker {
	unsigned seed;
	int gets;
};

static void *hammer(void *arg)
{
	struct worker *w = arg;
	regcache_entry *held[4] = {0};

	for (int i = 0; i < 20000; i++) {
		int k = (int)(rand_r(&w->seed) % 4);
		if (held[k] != NULL) {
			regcache_put(cache, held[k]);
			held[k] = NULL;
		}
		size_t off = (size_t)(rand_r(&w->seed) % (PAGES * page - 1));
		size_t len = 1 + (size_t)(rand_r(&w->seed) % (3 * page));
		if (off + len > PAGES * page)
			len = PAGES * page - off;
		int what = (int)(rand_r(&w->seed) % 16);
		if (what == 0) {
			regcache_invalidate(cache, mem + off, len);
			continue;
		}
		uint64_t scope = what == 1 ? REGCACHE_ONESHOT : what == 2 ? 9 : REGCACHE_KEEP;
		held[k] = get(off, len, scope);
		if (what == 3)
			regcache_invalidate_scope(cache, 9);
		w->gets++;
	}
	for (int k = 0; k < 4; k++)
		if (held[k] != NULL)
			regcache_put(cache, held[k]);
	return NULL;
}

Test(regcache, two_threads_at_once_keep_the_books_straight, .init = setup_for_threads,
     .fini = teardown)
{
	struct worker w[2] = {{.seed = 1}, {.seed = 2}};
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, hammer, &w[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	regcache_stats s = stats();
	cr_expect_eq(s.in_use, 0);
	cr_expect_eq(s.hits + s.misses, (uint64_t)(w[0].gets + w[1].gets));
	cr_expect_eq(s.regs, (uint64_t)atomic_load(&ctx.regs));
	cr_expect_eq(s.regs - s.deregs, (uint64_t)s.entries);
	cr_expect_eq((int)s.entries, atomic_load(&ctx.live));
	cr_expect_eq(s.bytes, atomic_load(&ctx.locked));
	cr_expect_leq(s.entries, 6);
	cr_expect_leq(s.bytes, 8 * page);
	cr_expect_gt(s.hits, 0);
}
