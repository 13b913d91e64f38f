/*
 * test_comms.c -- comms that share the world's links: khor_comm_split and
 * khor_comm_create_group, their ranks, ids and world ranks, every collective on them, two
 * comms driven from two threads at once over tcp and over shm, a comm freed while another
 * one runs, split/free cycles that must not grow memory, fds or threads, a rank killed
 * while several comms are busy, inconsistent calls that must fail rather than hang,
 * khor_request_error, and khor_comm_free refusing the world.
 *
 * Real ranks (forked by the harness) and real links; values are small integers so every
 * result is exact and checked element by element (comms_load.h). Under AddressSanitizer
 * each rank that ends normally runs LeakSanitizer itself after khor_finalize, since the
 * harness ends ranks with _exit, which skips LSan's own check at exit.
 */
#include "tests/harness.h"
#include "comms_load.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef UNDER_ASAN
#include <sanitizer/lsan_interface.h>
#endif

#define TEXT 2048
#define NSPLITS 5
#define NCOMMS 3

struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	/* split: each rank's new comm's id and its expected group (-1: none) per split */
	int64_t ids[NSPLITS][HARNESS_MAX_RANKS];
	int group[NSPLITS][HARNESS_MAX_RANKS];
	/* kill and inconsistent calls: per rank and comm */
	int iterations[HARNESS_MAX_RANKS][NCOMMS];
	int status[HARNESS_MAX_RANKS][NCOMMS];
	double failed_at[HARNESS_MAX_RANKS][NCOMMS]; /* CLOCK_MONOTONIC seconds */
	double started_at[HARNESS_MAX_RANKS];
	int64_t comm_id[HARNESS_MAX_RANKS][NCOMMS];
	char cerr[HARNESS_MAX_RANKS][NCOMMS][TEXT];
	/* split/free cycles */
	long long heap_growth[HARNESS_MAX_RANKS], rss_growth[HARNESS_MAX_RANKS];
	int fds[HARNESS_MAX_RANKS][2], threads[HARNESS_MAX_RANKS][2];
	double seconds[HARNESS_MAX_RANKS];
	/* the call each of two threads is in (or the main thread's step), for a hang's report */
	int progress[HARNESS_MAX_RANKS][2];
};

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int fail(struct shared *sh, int rank, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Records why rank failed (for the parent's message) and returns code as its exit status. */
static int fail(struct shared *sh, int rank, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(sh->err[rank], TEXT, fmt, ap);
	va_end(ap);
	fprintf(stderr, "rank %d: %s\n", rank, sh->err[rank]);
	return code;
}

/* After khor_finalize: under ASan, fails the rank when LeakSanitizer finds a leak. */
static int leak_check(struct shared *sh, int rank)
{
#ifdef UNDER_ASAN
	if (__lsan_do_recoverable_leak_check() != 0)
		return fail(sh, rank, 90, "LeakSanitizer found leaks after khor_finalize (report "
		            "above)");
#else
	(void)sh;
	(void)rank;
#endif
	return 0;
}

static int init(struct shared *sh, int rank, khor_config *cfg, khor_comm **world)
{
	char err[TEXT];

	if (khor_init(cfg, err, sizeof(err), world) != KHOR_SUCCESS)
		return fail(sh, rank, 10, "init: %s", err);
	return 0;
}

/* Checks that every started rank exited 0 and nothing hung. */
static void expect_all_ok(const struct shared *sh, const harness_result *res, int n,
                          const char *what)
{
	if (res->timed_out)
		for (int r = 0; r < n; r++)
			fprintf(stderr, "%s: hung: rank %d was at calls %d and %d of its two threads "
			        "(or main-thread step %d)\n", what, r, sh->progress[r][0],
			        sh->progress[r][1], sh->progress[r][0]);
	cr_assert(!res->timed_out, "%s: the job hung (killed at the deadline)", what);
	for (int r = 0; r < n; r++)
		cr_expect_eq(res->status[r], 0, "%s: rank %d exited %d: %s", what, r, res->status[r],
		             sh->err[r]);
}

/* ---- 1. split: ranks by key then parent rank, ids, every collective ---------------------- */

/* A key in -3..3 from seed and parent rank p: ties on purpose, same on every rank. */
static int key_of(unsigned seed, int p)
{
	uint32_t h = seed * 2654435761u ^ (uint32_t)(p + 1) * 40503u;
	h ^= h >> 13;
	h *= 0x5bd1e995u;
	h ^= h >> 15;
	return (int)(h % 7) - 3;
}

/*
 * MPI_Comm_split's rule on a parent of m ranks whose world ranks are pw[]: the members of
 * me's color, ordered by key then parent rank. Writes their world ranks to out_w and
 * returns how many, or 0 when me's color is negative.
 */
static int expect_split(int m, const int *pw, const int *color, const int *key, int me,
                        int *out_w)
{
	int idx[HARNESS_MAX_RANKS], k = 0;

	if (color[me] < 0)
		return 0;
	for (int p = 0; p < m; p++)
		if (color[p] == color[me])
			idx[k++] = p;
	for (int i = 1; i < k; i++) /* insertion sort: stable, so parent rank breaks ties */
		for (int j = i; j > 0 && key[idx[j]] < key[idx[j - 1]]; j--) {
			int t = idx[j];
			idx[j] = idx[j - 1];
			idx[j - 1] = t;
		}
	for (int i = 0; i < k; i++)
		out_w[i] = pw[idx[i]];
	return k;
}

/* The color of parent rank p of m in split s (see body_split). */
static int color_of(int s, int p, int m)
{
	switch (s) {
	case 0: return p % 2;                       /* even / odd */
	case 1: return p < m / 2 ? 0 : 1;           /* halves */
	case 2: return p == m - 1 ? -1 : 3;         /* the last rank in no comm */
	case 3: return p < m / 2 ? 7 : 8;           /* halves of split 0's comm */
	default: return 0;                          /* everyone, same key */
	}
}

static int split_key(int s, int n, int p)
{
	if (s == 3)
		return -p; /* reversed */
	if (s == 4)
		return 5;
	return key_of(1000u * (unsigned)s + (unsigned)n, p);
}

/* Comm c must have rank, size, world ranks, local and cross ranks as want_w says. */
static int check_shape(khor_comm *c, const int *want_w, int k, int world_rank, char *err,
                       size_t len)
{
	int me = -1;

	for (int i = 0; i < k; i++)
		if (want_w[i] == world_rank)
			me = i;
	if (khor_size(c) != k)
		return load_fail(err, len, "khor_size = %d, want %d", khor_size(c), k);
	if (khor_rank(c) != me)
		return load_fail(err, len, "khor_rank = %d, want %d", khor_rank(c), me);
	for (int i = 0; i < k; i++)
		if (khor_comm_world_rank(c, i) != want_w[i])
			return load_fail(err, len, "khor_comm_world_rank(%d) = %d, want %d", i,
			                 khor_comm_world_rank(c, i), want_w[i]);
	if (khor_comm_world_rank(c, k) != -1 || khor_comm_world_rank(c, -1) != -1)
		return load_fail(err, len, "khor_comm_world_rank out of range = %d / %d, want -1",
		                 khor_comm_world_rank(c, k), khor_comm_world_rank(c, -1));
	/* every rank runs on this host: the local ranks are the comm's own ranks */
	if (khor_local_rank(c) != me || khor_local_size(c) != k || khor_cross_rank(c) != 0 ||
	    khor_cross_size(c) != 1)
		return load_fail(err, len, "local %d/%d cross %d/%d, want %d/%d and 0/1",
		                 khor_local_rank(c), khor_local_size(c), khor_cross_rank(c),
		                 khor_cross_size(c), me, k);
	return 0;
}

/*
 * Splits 0-2 and 4 of the world, 3 of split 0's comm; all of them stay alive while every
 * collective runs on each in turn (and on the world between them), then they are freed in
 * an order other than creation.
 */
static int body_split(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *nc[NSPLITS] = { NULL };
	char why[1024];
	int rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	if (khor_comm_id(world) != 0)
		return fail(sh, rank, 11, "khor_comm_id(world) = %lld, want 0",
		            (long long)khor_comm_id(world));
	if (khor_comm_id(NULL) != -1)
		return fail(sh, rank, 11, "khor_comm_id(NULL) = %lld, want -1",
		            (long long)khor_comm_id(NULL));
	int ww[HARNESS_MAX_RANKS];
	for (int r = 0; r < n; r++)
		ww[r] = r;
	if (check_shape(world, ww, n, rank, why, sizeof(why)) != 0)
		return fail(sh, rank, 12, "world: %s", why);

	int exp_w[NSPLITS][HARNESS_MAX_RANKS], exp_k[NSPLITS];
	for (int s = 0; s < NSPLITS; s++) {
		khor_comm *parent = s == 3 ? nc[0] : world;
		int m = s == 3 ? exp_k[0] : n, me = s == 3 ? khor_rank(nc[0]) : rank;
		const int *pw = s == 3 ? exp_w[0] : ww;
		int color[HARNESS_MAX_RANKS], key[HARNESS_MAX_RANKS];

		for (int p = 0; p < m; p++) {
			color[p] = color_of(s, p, m);
			key[p] = split_key(s, n, p);
		}
		exp_k[s] = expect_split(m, pw, color, key, me, exp_w[s]);
		/* the group's name: which parent group and which color */
		sh->group[s][rank] = color[me] < 0 ? -1 : (s == 3 ? color_of(0, rank, n) : 0) * 100 +
		                                                   color[me];
		khor_comm *c = (khor_comm *)&sh; /* a sentinel: must become NULL or a comm */
		khor_status st = khor_comm_split(parent, color[me], key[me], &c);
		if (st != KHOR_SUCCESS)
			return fail(sh, rank, 13, "split %d (color %d key %d): status %d: %s", s,
			            color[me], key[me], st, khor_comm_error(parent));
		if (color[me] < 0) {
			if (c != NULL)
				return fail(sh, rank, 14, "split %d: negative color gave %p, not NULL", s,
				            (void *)c);
			sh->ids[s][rank] = -1;
			continue;
		}
		if (c == NULL || c == (khor_comm *)&sh)
			return fail(sh, rank, 14, "split %d: color %d gave no comm", s, color[me]);
		nc[s] = c;
		if (check_shape(c, exp_w[s], exp_k[s], rank, why, sizeof(why)) != 0)
			return fail(sh, rank, 15, "split %d (color %d key %d): %s", s, color[me],
			            key[me], why);
		sh->ids[s][rank] = khor_comm_id(c);
		if (khor_comm_id(c) == khor_comm_id(parent) || khor_comm_id(c) <= 0)
			return fail(sh, rank, 16, "split %d: id %lld (parent's: %lld)", s,
			            (long long)khor_comm_id(c), (long long)khor_comm_id(parent));
		if (strcmp(khor_comm_error(c), "") != 0)
			return fail(sh, rank, 16, "split %d: a new comm has an error: %s", s,
			            khor_comm_error(c));
	}
	for (int s = 0; s < NSPLITS; s++)
		for (int t = 0; t < s; t++)
			if (nc[s] != NULL && nc[t] != NULL && khor_comm_id(nc[s]) == khor_comm_id(nc[t]))
				return fail(sh, rank, 17, "splits %d and %d have the same id %lld on this "
				            "rank", t, s, (long long)khor_comm_id(nc[s]));
	for (int round = 0; round < 2; round++) {
		for (int s = 0; s < NSPLITS; s++) {
			if (nc[s] != NULL && load_check_all(nc[s], s * 10 + round, why, sizeof(why)))
				return fail(sh, rank, 18, "split %d (size %d, my rank %d): %s", s,
				            khor_size(nc[s]), khor_rank(nc[s]), why);
			if (load_check_all(world, s, why, sizeof(why)) != 0)
				return fail(sh, rank, 19, "world between splits: %s", why);
		}
	}
	const int order[NSPLITS] = { 3, 1, 0, 4, 2 }; /* 3 before its parent 0 */
	for (int i = 0; i < NSPLITS; i++)
		if (nc[order[i]] != NULL && khor_comm_free(nc[order[i]]) != KHOR_SUCCESS)
			return fail(sh, rank, 20, "khor_comm_free of split %d failed", order[i]);
	if (load_check_all(world, 99, why, sizeof(why)) != 0)
		return fail(sh, rank, 21, "world after the frees: %s", why);
	khor_finalize(world);
	return leak_check(sh, rank);
}

static void run_split(int n)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = n, .timeout = "30s", .deadline_s = 90 };
	harness_result res;
	char what[32];

	snprintf(what, sizeof(what), "split n=%d", n);
	harness_run(&o, body_split, sh, &res);
	expect_all_ok(sh, &res, n, what);
	/* the members of one new comm agree on its id */
	for (int s = 0; s < NSPLITS; s++)
		for (int a = 0; a < n; a++)
			for (int b = 0; b < a; b++)
				if (res.status[a] == 0 && res.status[b] == 0 && sh->group[s][a] >= 0 &&
				    sh->group[s][a] == sh->group[s][b])
					cr_expect_eq(sh->ids[s][a], sh->ids[s][b], "%s split %d: ranks %d "
					             "and %d share a comm but see ids %lld and %lld", what, s,
					             b, a, (long long)sh->ids[s][b], (long long)sh->ids[s][a]);
	harness_shared_free(sh, sizeof(*sh));
}

#define SPLIT_TEST(N)                                                                          \
	Test(comms, split_ranks_ids_and_collectives_n##N, .timeout = 120)                      \
	{                                                                                      \
		run_split(N);                                                                  \
	}
SPLIT_TEST(2)
SPLIT_TEST(3)
SPLIT_TEST(4)
SPLIT_TEST(5)
SPLIT_TEST(6)
SPLIT_TEST(7)
SPLIT_TEST(8)

/* ---- 2. create_group: list order, non-members, bad lists ---------------------------------- */

/*
 * n = 5. World ranks 4, 2, 1 make a comm in that order; rank 3 is not listed but calls
 * (gets NULL), rank 0 does not call at all. Then comm ranks 2 and 0 of the new comm (world
 * 1 and 4) make a comm of it without its rank 1. Lists that repeat a rank or name one out
 * of range are refused on every rank and leave the world working.
 */
static int body_group(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *g = NULL, *g2 = NULL, *c;
	const int list[] = { 4, 2, 1 }, list2[] = { 2, 0 }, want2[] = { 1, 4 };
	char why[1024];
	int rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	const int twice[] = { 1, 0, 1 }, outside[] = { 0, n };
	c = (khor_comm *)&sh;
	if (khor_comm_create_group(world, twice, 3, &c) != KHOR_ERR_INVALID_ARG)
		return fail(sh, rank, 11, "a list with rank 1 twice was not refused");
	if (khor_comm_create_group(world, outside, 2, &c) != KHOR_ERR_INVALID_ARG)
		return fail(sh, rank, 11, "a list with rank %d (of %d) was not refused", n, n);
	if (c != (khor_comm *)&sh)
		return fail(sh, rank, 11, "a refused create_group wrote *newcomm_out");
	if (load_check_all(world, 1, why, sizeof(why)) != 0)
		return fail(sh, rank, 12, "world after refused lists: %s", why);

	if (rank != 0) {
		g = (khor_comm *)&sh;
		khor_status st = khor_comm_create_group(world, list, 3, &g);
		if (st != KHOR_SUCCESS)
			return fail(sh, rank, 13, "create_group {4,2,1}: status %d: %s", st,
			            khor_comm_error(world));
		if (rank == 3 && g != NULL)
			return fail(sh, rank, 14, "rank 3 is not listed but got a comm");
		if (rank != 3) {
			if (g == NULL || g == (khor_comm *)&sh)
				return fail(sh, rank, 14, "listed, but got no comm");
			if (check_shape(g, list, 3, rank, why, sizeof(why)) != 0)
				return fail(sh, rank, 15, "create_group {4,2,1}: %s", why);
			if (khor_comm_id(g) <= 0)
				return fail(sh, rank, 15, "id %lld", (long long)khor_comm_id(g));
			sh->comm_id[rank][0] = khor_comm_id(g);
			if (load_check_all(g, 3, why, sizeof(why)) != 0)
				return fail(sh, rank, 16, "on {4,2,1}: %s", why);
		} else {
			g = NULL;
		}
	}
	if (g != NULL && khor_rank(g) != 1) {
		khor_status st = khor_comm_create_group(g, list2, 2, &g2);
		if (st != KHOR_SUCCESS)
			return fail(sh, rank, 17, "create_group {2,0} of {4,2,1}: status %d: %s", st,
			            khor_comm_error(g));
		if (check_shape(g2, want2, 2, rank, why, sizeof(why)) != 0)
			return fail(sh, rank, 18, "create_group {2,0} of {4,2,1}: %s", why);
		if (khor_comm_id(g2) == khor_comm_id(g) || khor_comm_id(g2) <= 0)
			return fail(sh, rank, 18, "ids %lld and its parent's %lld",
			            (long long)khor_comm_id(g2), (long long)khor_comm_id(g));
		sh->comm_id[rank][1] = khor_comm_id(g2);
		if (load_check_all(g2, 4, why, sizeof(why)) != 0)
			return fail(sh, rank, 19, "on {1,4}: %s", why);
	}
	/* the world must still be in step, with ranks 0 and 3 having made different calls */
	if (load_check_all(world, 5, why, sizeof(why)) != 0)
		return fail(sh, rank, 20, "world after create_group: %s", why);
	if (g != NULL && load_check_all(g, 6, why, sizeof(why)) != 0)
		return fail(sh, rank, 21, "on {4,2,1} again: %s", why);
	if (g2 != NULL && khor_comm_free(g2) != KHOR_SUCCESS)
		return fail(sh, rank, 22, "free of {1,4} failed");
	if (g != NULL && khor_comm_free(g) != KHOR_SUCCESS)
		return fail(sh, rank, 22, "free of {4,2,1} failed");
	khor_finalize(world);
	return leak_check(sh, rank);
}

Test(comms, create_group_list_order_non_members_and_bad_lists, .timeout = 120)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 5, .timeout = "30s", .deadline_s = 90 };
	harness_result res;

	harness_run(&o, body_group, sh, &res);
	expect_all_ok(sh, &res, 5, "create_group");
	cr_expect_eq(sh->comm_id[4][0], sh->comm_id[2][0], "ids of {4,2,1} differ: %lld %lld",
	             (long long)sh->comm_id[4][0], (long long)sh->comm_id[2][0]);
	cr_expect_eq(sh->comm_id[4][0], sh->comm_id[1][0], "ids of {4,2,1} differ: %lld %lld",
	             (long long)sh->comm_id[4][0], (long long)sh->comm_id[1][0]);
	cr_expect_eq(sh->comm_id[4][1], sh->comm_id[1][1], "ids of {1,4} differ: %lld %lld",
	             (long long)sh->comm_id[4][1], (long long)sh->comm_id[1][1]);
	harness_shared_free(sh, sizeof(*sh));
}

/*
 * create_group cleans up after itself: a job that makes 30 groups (and frees them) leaves
 * as many keys in the store as one that makes one. The list's first rank is the world's
 * last, so the keys' owner is not rank 0.
 */
static int group_cycles;

static int body_group_cycles(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	const int list[] = { 2, 0, 1 };
	khor_comm *world, *g;
	char why[1024];
	int rc;

	(void)n;
	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	for (int i = 0; i < group_cycles; i++) {
		khor_status st = khor_comm_create_group(world, list, 3, &g);
		if (st != KHOR_SUCCESS)
			return fail(sh, rank, 11, "create_group %d: status %d: %s", i, st,
			            khor_comm_error(world));
		if (load_check_all(g, 1, why, sizeof(why)) != 0)
			return fail(sh, rank, 12, "on group %d: %s", i, why);
		if (khor_comm_free(g) != KHOR_SUCCESS)
			return fail(sh, rank, 13, "free of group %d failed", i);
	}
	khor_finalize(world);
	return leak_check(sh, rank);
}

Test(comms, create_group_leaves_no_keys_in_the_store, .timeout = 120)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 3, .timeout = "30s", .deadline_s = 90 };
	harness_result one, many;

	group_cycles = 1;
	harness_run(&o, body_group_cycles, sh, &one);
	expect_all_ok(sh, &one, 3, "one create_group");
	group_cycles = 30;
	harness_run(&o, body_group_cycles, sh, &many);
	expect_all_ok(sh, &many, 3, "30 create_groups");
	cr_assert(one.store_values > 0, "the store held no keys at all: the count is not read");
	cr_assert_eq(many.store_values, one.store_values,
	             "the store held %zu keys after 30 groups and %zu after one",
	             many.store_values, one.store_values);
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- 3. two threads per rank, two comms, one transport ------------------------------------ */

struct job {
	struct shared *sh;
	const char *transport;
	int ops;
};

/*
 * A = every rank in world order, B = every rank in reverse order (so comm ranks differ
 * from world ranks); 1000 mixed calls on each from its own thread, then every collective
 * on A, B and the world from the main thread.
 */
static int body_threads(int rank, int n, khor_config *cfg, void *arg)
{
	const struct job *j = arg;
	struct shared *sh = j->sh;
	khor_comm *world, *a, *b;
	char why[TEXT];
	int rc;

	khor_config_set(cfg, "KHOR_TRANSPORT", j->transport);
	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	if (khor_comm_split(world, 0, rank, &a) != KHOR_SUCCESS ||
	    khor_comm_split(world, 0, n - rank, &b) != KHOR_SUCCESS)
		return fail(sh, rank, 11, "split: %s", khor_comm_error(world));
	if (a == NULL || b == NULL || khor_rank(b) != n - 1 - rank)
		return fail(sh, rank, 12, "split gave %p %p, rank in B %d", (void *)a, (void *)b,
		            b ? khor_rank(b) : -1);
	double t0 = mono();
	if (load_two_threads(a, b, rank, j->ops, sh->progress[rank], why, sizeof(why)) != 0)
		return fail(sh, rank, 13, "%s over %s: %s", "two threads", j->transport, why);
	sh->seconds[rank] = mono() - t0;
	if (load_check_all(a, 1, why, sizeof(why)) != 0 ||
	    load_check_all(b, 2, why, sizeof(why)) != 0 ||
	    load_check_all(world, 3, why, sizeof(why)) != 0)
		return fail(sh, rank, 14, "after the threads: %s", why);
	if (khor_comm_free(a) != KHOR_SUCCESS || khor_comm_free(b) != KHOR_SUCCESS)
		return fail(sh, rank, 15, "khor_comm_free failed");
	khor_finalize(world);
	return leak_check(sh, rank);
}

static void run_threads(const char *transport, int n)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	struct job j = { .sh = sh, .transport = transport, .ops = 1000 };
	harness_opts o = { .n = n, .timeout = "30s", .deadline_s = 100 };
	harness_result res;
	char what[64];

	snprintf(what, sizeof(what), "two threads over %s, n=%d", transport, n);
	harness_run(&o, body_threads, &j, &res);
	expect_all_ok(sh, &res, n, what);
	fprintf(stderr, "%s: 2 x %d calls in %.2f s on rank 0\n", what, j.ops, sh->seconds[0]);
	harness_shared_free(sh, sizeof(*sh));
}

Test(comms, two_threads_two_comms_over_tcp, .timeout = 300)
{
	run_threads("tcp", 2);
	run_threads("tcp", 4);
}

Test(comms, two_threads_two_comms_over_shm, .timeout = 300)
{
	run_threads("shm", 2);
	run_threads("shm", 4);
}

/* ---- 4. a comm freed while another one runs ----------------------------------------------- */

/*
 * n = 4. A thread runs 400 mixed calls on B while the main thread uses A, frees it, then
 * makes, uses and frees five more comms of the world (splits and a create_group), all
 * during B's calls; B and the world must still give right results after.
 */
static int body_free_while_busy(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *a, *b;
	struct load_thread t = { .tag = 2, .ops = 400 };
	pthread_t th;
	char why[1024];
	int rc, all_rev[HARNESS_MAX_RANKS];

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	if (khor_comm_split(world, 0, rank, &a) != KHOR_SUCCESS ||
	    khor_comm_split(world, 0, -rank, &b) != KHOR_SUCCESS || a == NULL || b == NULL)
		return fail(sh, rank, 11, "split: %s", khor_comm_error(world));
	t.comm = b;
	t.progress = &sh->progress[rank][1];
	if (pthread_create(&th, NULL, load_thread_main, &t) != 0)
		return fail(sh, rank, 12, "pthread_create failed");
	if (load_check_all(a, 0, why, sizeof(why)) != 0)
		return fail(sh, rank, 13, "on A: %s", why);
	if (khor_comm_free(a) != KHOR_SUCCESS)
		return fail(sh, rank, 14, "khor_comm_free(A) failed");
	for (int k = 0; k < n; k++)
		all_rev[k] = n - 1 - k;
	for (int i = 0; i < 6; i++) {
		khor_comm *c = NULL;
		sh->progress[rank][0] = i + 1;
		khor_status st = i == 5 ? khor_comm_create_group(world, all_rev, n, &c)
		                        : khor_comm_split(world, (rank + i) % 2, i * rank, &c);
		if (st != KHOR_SUCCESS || c == NULL)
			return fail(sh, rank, 15, "comm %d made while B runs: status %d: %s", i, st,
			            khor_comm_error(world));
		if (load_check_all(c, i, why, sizeof(why)) != 0)
			return fail(sh, rank, 16, "comm %d made while B runs: %s", i, why);
		if (khor_comm_free(c) != KHOR_SUCCESS)
			return fail(sh, rank, 17, "khor_comm_free of comm %d failed", i);
	}
	sh->progress[rank][0] = 7;
	pthread_join(th, NULL);
	if (t.rc != 0)
		return fail(sh, rank, 18, "B's thread: %s", t.err);
	if (load_check_all(b, 7, why, sizeof(why)) != 0)
		return fail(sh, rank, 19, "B after: %s", why);
	if (load_check_all(world, 8, why, sizeof(why)) != 0)
		return fail(sh, rank, 20, "world after: %s", why);
	if (khor_comm_free(b) != KHOR_SUCCESS)
		return fail(sh, rank, 21, "khor_comm_free(B) failed");
	khor_finalize(world);
	return leak_check(sh, rank);
}

Test(comms, free_one_comm_while_another_runs, .timeout = 120)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 4, .timeout = "30s", .deadline_s = 90 };
	harness_result res;

	harness_run(&o, body_free_while_busy, sh, &res);
	expect_all_ok(sh, &res, 4, "free while busy");
	harness_shared_free(sh, sizeof(*sh));
}

/*
 * khor_comm_free waits for the comm's queued non-blocking calls: their results are in
 * place when it returns, and the requests can still be freed after it.
 */
static int body_free_waits(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *a;
	khor_request *req[3];
	const size_t count = LOAD_BIG;
	float *x = malloc(count * sizeof(float));
	int32_t y[1000], z[64];
	int rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	if (khor_comm_split(world, 0, rank, &a) != KHOR_SUCCESS || a == NULL)
		return fail(sh, rank, 11, "split: %s", khor_comm_error(world));
	for (size_t j = 0; j < count; j++)
		x[j] = (float)(rank + 1 + (int)(j % 5));
	for (size_t j = 0; j < 1000; j++)
		y[j] = rank == 0 ? (int32_t)j : -1;
	if (rank == 1)
		usleep(200 * 1000); /* rank 0's calls are still queued when it frees */
	if (khor_iallreduce(a, x, x, count, KHOR_FLOAT32, KHOR_SUM, &req[0]) != KHOR_SUCCESS ||
	    khor_ibroadcast(a, y, 1000, KHOR_INT32, 0, &req[1]) != KHOR_SUCCESS ||
	    khor_iallgather(a, &rank, z, 1, KHOR_INT32, &req[2]) != KHOR_SUCCESS)
		return fail(sh, rank, 12, "i* call refused: %s", khor_comm_error(a));
	if (khor_comm_free(a) != KHOR_SUCCESS)
		return fail(sh, rank, 13, "khor_comm_free with queued calls failed");
	for (size_t j = 0; j < count; j++)
		if (x[j] != (float)(n * (n + 1) / 2 + n * (int)(j % 5)))
			return fail(sh, rank, 14, "iallreduce[%zu] = %g after khor_comm_free", j,
			            (double)x[j]);
	for (size_t j = 0; j < 1000; j++)
		if (y[j] != (int32_t)j)
			return fail(sh, rank, 15, "ibroadcast[%zu] = %d after khor_comm_free", j, y[j]);
	for (int k = 0; k < n; k++)
		if (z[k] != k)
			return fail(sh, rank, 16, "iallgather[%d] = %d after khor_comm_free", k, z[k]);
	for (int i = 0; i < 3; i++)
		khor_request_free(req[i]);
	free(x);
	khor_finalize(world);
	return leak_check(sh, rank);
}

Test(comms, free_waits_for_queued_nonblocking_calls, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 2, .timeout = "30s", .deadline_s = 40 };
	harness_result res;

	harness_run(&o, body_free_waits, sh, &res);
	expect_all_ok(sh, &res, 2, "free waits");
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- 5. split/free cycles: memory, fds and threads stay flat ------------------------------ */

#define CYCLES 200
#define WARM 20

/*
 * 200 cycles of split, a blocking and a non-blocking allreduce on the new comm (so its
 * collective thread starts), then free of the previous cycle's comm (two are alive at a
 * time). Between cycle 20 and cycle 200 the fds and threads must not change and the heap
 * in use and the RSS must stay within a few MiB (not checked under ASan, whose quarantine
 * holds freed memory; LeakSanitizer runs there instead).
 */
static int body_cycles(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *prev = NULL;
	long long heap0 = 0, rss0 = 0;
	int rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	for (int i = 0; i < CYCLES; i++) {
		khor_comm *c = NULL;
		int color = i % 3 == 0 ? 0 : rank % 2, key = (i % 2) ? rank : -rank;
		if (khor_comm_split(world, color, key, &c) != KHOR_SUCCESS || c == NULL)
			return fail(sh, rank, 11, "cycle %d: split: %s", i, khor_comm_error(world));
		int32_t v[16], want = 0;
		for (int k = 0; k < khor_size(c); k++)
			want += khor_comm_world_rank(c, k) + i;
		for (int j = 0; j < 16; j++)
			v[j] = rank + i;
		if (khor_allreduce(c, v, v, 16, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS)
			return fail(sh, rank, 12, "cycle %d: allreduce: %s", i, khor_comm_error(c));
		if (v[0] != want || v[15] != want)
			return fail(sh, rank, 13, "cycle %d: allreduce %d, want %d", i, v[0], want);
		khor_request *req;
		for (int j = 0; j < 16; j++)
			v[j] = rank + i;
		if (khor_iallreduce(c, v, v, 16, KHOR_INT32, KHOR_SUM, &req) != KHOR_SUCCESS)
			return fail(sh, rank, 14, "cycle %d: iallreduce: %s", i, khor_comm_error(c));
		if (khor_wait(req) != KHOR_SUCCESS || v[7] != want)
			return fail(sh, rank, 15, "cycle %d: iallreduce %d, want %d: %s", i, v[7], want,
			            khor_request_error(req));
		khor_request_free(req);
		if (prev != NULL && khor_comm_free(prev) != KHOR_SUCCESS)
			return fail(sh, rank, 16, "cycle %d: khor_comm_free failed", i);
		prev = c;
		if (i == WARM || i == CYCLES - 1) {
			int at = i == WARM ? 0 : 1;
			malloc_trim(0);
			sh->fds[rank][at] = harness_count_fds();
			sh->threads[rank][at] = harness_count_threads();
			if (at == 0) {
				heap0 = harness_heap_bytes();
				rss0 = harness_rss_bytes();
			} else {
				sh->heap_growth[rank] = harness_heap_bytes() - heap0;
				sh->rss_growth[rank] = harness_rss_bytes() - rss0;
			}
		}
	}
	if (khor_comm_free(prev) != KHOR_SUCCESS)
		return fail(sh, rank, 17, "last khor_comm_free failed");
	int32_t one = 1;
	if (khor_allreduce(world, &one, &one, 1, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS || one != n)
		return fail(sh, rank, 18, "world after the cycles: %d: %s", one,
		            khor_comm_error(world));
	khor_finalize(world);
	return leak_check(sh, rank);
}

Test(comms, split_free_cycles_keep_memory_fds_and_threads_flat, .timeout = 180)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 4, .timeout = "30s", .deadline_s = 150 };
	harness_result res;

	harness_run(&o, body_cycles, sh, &res);
	expect_all_ok(sh, &res, 4, "split/free cycles");
	for (int r = 0; r < 4; r++) {
		fprintf(stderr, "cycles: rank %d: heap %+lld B, rss %+lld B, fds %d -> %d, threads "
		        "%d -> %d\n", r, sh->heap_growth[r], sh->rss_growth[r], sh->fds[r][0],
		        sh->fds[r][1], sh->threads[r][0], sh->threads[r][1]);
		cr_expect_eq(sh->fds[r][1], sh->fds[r][0], "rank %d: %d fds after cycle %d, %d after "
		             "cycle %d", r, sh->fds[r][0], WARM, sh->fds[r][1], CYCLES - 1);
		cr_expect_eq(sh->threads[r][1], sh->threads[r][0], "rank %d: %d threads after cycle "
		             "%d, %d after cycle %d", r, sh->threads[r][0], WARM, sh->threads[r][1],
		             CYCLES - 1);
#ifndef UNDER_ASAN
		cr_expect_lt(sh->heap_growth[r], 4ll << 20, "rank %d: the heap grew %lld bytes over "
		             "%d split/free cycles", r, sh->heap_growth[r], CYCLES - WARM);
		cr_expect_lt(sh->rss_growth[r], 8ll << 20, "rank %d: RSS grew %lld bytes over %d "
		             "split/free cycles", r, sh->rss_growth[r], CYCLES - WARM);
#endif
	}
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- 6. kill -9 while several comms are busy in several threads --------------------------- */

struct busy {
	struct shared *sh;
	khor_comm *comm;
	int rank, slot;
};

/* Allreduces on one comm until one fails; records when, and the comm's error. */
static void *busy_main(void *p)
{
	struct busy *b = p;
	struct shared *sh = b->sh;
	const size_t count = 4096;
	int32_t *x = malloc(count * sizeof(int32_t));
	int n = khor_size(b->comm);
	double end = mono() + 60;

	sh->comm_id[b->rank][b->slot] = khor_comm_id(b->comm);
	while (mono() < end) {
		int it = sh->iterations[b->rank][b->slot];
		for (size_t j = 0; j < count; j++)
			x[j] = b->rank + it + (int32_t)(j % 3);
		khor_status st = khor_allreduce(b->comm, x, x, count, KHOR_INT32, KHOR_SUM);
		if (st != KHOR_SUCCESS) {
			sh->failed_at[b->rank][b->slot] = mono();
			sh->status[b->rank][b->slot] = st;
			snprintf(sh->cerr[b->rank][b->slot], TEXT, "%s", khor_comm_error(b->comm));
			break;
		}
		if (x[count - 1] != n * (n - 1) / 2 + n * (it + (int32_t)((count - 1) % 3))) {
			snprintf(sh->cerr[b->rank][b->slot], TEXT, "wrong sum %d at iteration %d",
			         x[count - 1], it);
			sh->status[b->rank][b->slot] = -1;
			break;
		}
		sh->iterations[b->rank][b->slot]++;
	}
	free(x);
	return NULL;
}

/* World, A (world order) and B (reversed) each busy in a thread until the victim dies. */
static int body_kill(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *comms[NCOMMS];
	struct busy b[NCOMMS];
	pthread_t th[NCOMMS];
	int rc, failed = 0;

	/* auto's timed trials would make the first calls of 12 threads on 2 cores slow */
	khor_config_set(cfg, "KHOR_ALGO", "ring");
	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	comms[0] = world;
	if (khor_comm_split(world, 0, rank, &comms[1]) != KHOR_SUCCESS ||
	    khor_comm_split(world, 0, -rank, &comms[2]) != KHOR_SUCCESS)
		return fail(sh, rank, 11, "split: %s", khor_comm_error(world));
	sh->started_at[rank] = mono();
	for (int k = 0; k < NCOMMS; k++) {
		b[k] = (struct busy){ .sh = sh, .comm = comms[k], .rank = rank, .slot = k };
		pthread_create(&th[k], NULL, busy_main, &b[k]);
	}
	for (int k = 0; k < NCOMMS; k++) {
		pthread_join(th[k], NULL);
		failed += sh->status[rank][k] > 0;
	}
	khor_comm_free(comms[1]);
	khor_comm_free(comms[2]);
	khor_finalize(world);
	return failed == NCOMMS ? 3 : 4;
}

Test(comms, kill9_fails_every_busy_comm_naming_rank_and_comm, .timeout = 120)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	const int n = 4, victim = 1;
	const double timeout_s = 10;
	harness_opts o = { .n = n, .timeout = "10s", .deadline_s = 60, .kill_rank = victim,
	                   .kill_after_s = 5.0 };
	harness_result res;
	double t0 = mono();
	char want_rank[32];
	static const char *names[NCOMMS] = { "world", "A (world order)", "B (reversed)" };

	harness_run(&o, body_kill, sh, &res);
	cr_assert(!res.timed_out, "the job hung after rank %d was killed", victim);
	cr_assert(res.killed_at > 0, "rank %d ended before it was killed: %s", victim,
	          sh->err[victim]);
	cr_expect_eq(res.status[victim], 128 + 9);
	snprintf(want_rank, sizeof(want_rank), "rank %d", victim);
	for (int r = 0; r < n; r++) {
		if (r == victim)
			continue;
		cr_expect_eq(res.status[r], 3, "rank %d exited %d, not with every comm failed: %s", r,
		             res.status[r], sh->err[r]);
		for (int k = 0; k < NCOMMS; k++) {
			const char *e = sh->cerr[r][k];
			double delay = sh->failed_at[r][k] - (t0 + res.killed_at);
			cr_expect_gt(sh->iterations[r][k], 0, "rank %d never ran a call on %s", r,
			             names[k]);
			cr_expect_gt(sh->status[r][k], 0, "rank %d, %s: no failure (%d): %s", r,
			             names[k], sh->status[r][k], e);
			cr_expect(delay > 0 && delay < timeout_s + 2, "rank %d, %s failed %.1f s after "
			          "the kill", r, names[k], delay);
			cr_expect(strstr(e, want_rank) != NULL, "rank %d, %s: the error does not name "
			          "%s: %s", r, names[k], want_rank, e);
			cr_expect(strstr(e, "comm ") != NULL, "rank %d, %s (id %lld): the error does not "
			          "name the comm: %s", r, names[k], (long long)sh->comm_id[r][k], e);
			fprintf(stderr, "kill: rank %d %s (id %lld) after %.2f s: %s\n", r, names[k],
			        (long long)sh->comm_id[r][k], delay, e);
		}
	}
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- 7. inconsistent calls fail, never hang ---------------------------------------------- */

struct mismatch {
	struct shared *sh;
	int variant; /* 0: same members, other order; 1: other members */
};

/*
 * n = 4, KHOR_TIMEOUT 3s, rank 3 not involved. Variant 0: ranks 0 and 1 list {2,1,0},
 * rank 2 lists {0,1,2}. Variant 1: rank 0 lists {0,1}, ranks 1 and 2 list {0,1,2}. A
 * member that sees the difference must fail within twice the timeout (the members are
 * alive: they fail once they have waited for each other for a timeout, runtime/liveness.c)
 * and a margin, with a text and without a comm. One that cannot see it (in variant 1 rank 0 is its list's first and
 * publishes without waiting for the others) may get a comm, but then its first collective
 * on it must fail the same way, not hang: the others never join it.
 */
static int body_group_mismatch(int rank, int n, khor_config *cfg, void *arg)
{
	const struct mismatch *m = arg;
	struct shared *sh = m->sh;
	khor_comm *world, *g;
	static const int l_rev[] = { 2, 1, 0 }, l_fwd[] = { 0, 1, 2 }, l_two[] = { 0, 1 };
	const int *list;
	int nl = 3, rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	if (khor_barrier(world) != KHOR_SUCCESS)
		return fail(sh, rank, 11, "barrier: %s", khor_comm_error(world));
	if (rank == 3) {
		sleep(1);
		khor_finalize(world);
		return 0;
	}
	if (m->variant == 0) {
		list = rank == 2 ? l_fwd : l_rev;
	} else {
		list = rank == 0 ? l_two : l_fwd;
		nl = rank == 0 ? 2 : 3;
	}
	g = (khor_comm *)&sh;
	double t0 = mono();
	khor_status st = khor_comm_create_group(world, list, nl, &g);
	sh->failed_at[rank][0] = mono() - t0;
	sh->status[rank][0] = st;
	snprintf(sh->cerr[rank][0], TEXT, "%s", khor_comm_error(world));
	if (st == KHOR_SUCCESS) {
		if (g == NULL || g == (khor_comm *)&sh)
			return fail(sh, rank, 12, "a listed rank's create_group succeeded without a "
			            "comm");
		int32_t x[100] = { 0 };
		t0 = mono();
		st = khor_allreduce(g, x, x, 100, KHOR_INT32, KHOR_SUM);
		sh->failed_at[rank][1] = mono() - t0;
		sh->status[rank][1] = st;
		snprintf(sh->cerr[rank][1], TEXT, "%s", khor_comm_error(g));
		khor_comm_free(g);
		khor_finalize(world);
		if (st == KHOR_SUCCESS)
			return fail(sh, rank, 13, "an allreduce on a comm whose other members made "
			            "another one succeeded");
		return 0;
	}
	if (g != (khor_comm *)&sh)
		return fail(sh, rank, 14, "a failed create_group wrote *newcomm_out");
	khor_finalize(world);
	return 0;
}

static void run_group_mismatch(int variant)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	struct mismatch m = { .sh = sh, .variant = variant };
	harness_opts o = { .n = 4, .timeout = "3s", .deadline_s = 40 };
	harness_result res;
	char what[64];
	int errors = 0;

	snprintf(what, sizeof(what), "create_group mismatch variant %d", variant);
	harness_run(&o, body_group_mismatch, &m, &res);
	expect_all_ok(sh, &res, 4, what);
	for (int r = 0; r < 3; r++) {
		int k = sh->status[r][0] == KHOR_SUCCESS ? 1 : 0; /* where it failed */
		errors += k == 0;
		cr_expect_neq(sh->status[r][k], KHOR_SUCCESS, "%s: rank %d got no error", what, r);
		/* KHOR_TIMEOUT, then as long getting nowhere while alive (a deadlock), + a margin. */
		cr_expect_lt(sh->failed_at[r][k], 2 * 3.0 + 4.0, "%s: rank %d's %s took %.1f s", what,
		             r, k ? "allreduce" : "create_group", sh->failed_at[r][k]);
		cr_expect(sh->cerr[r][k][0] != '\0', "%s: rank %d: status %d but no error text",
		          what, r, sh->status[r][k]);
		fprintf(stderr, "%s: rank %d: %s failed (status %d) after %.2f s: %s\n", what, r,
		        k ? "create_group succeeded, then its first allreduce" : "create_group",
		        sh->status[r][k], sh->failed_at[r][k], sh->cerr[r][k]);
	}
	cr_expect_gt(errors, 0, "%s: no member saw the lists differ", what);
	harness_shared_free(sh, sizeof(*sh));
}

Test(comms, create_group_with_lists_that_differ_fails_not_hangs, .timeout = 120)
{
	run_group_mismatch(0);
	run_group_mismatch(1);
}

/* n = 3, KHOR_TIMEOUT 3s: rank 0 splits the world while ranks 1 and 2 allreduce on it. */
static int body_split_vs_allreduce(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *c;
	int32_t x[1000];
	khor_status st;
	int rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	if (khor_barrier(world) != KHOR_SUCCESS)
		return fail(sh, rank, 11, "barrier: %s", khor_comm_error(world));
	for (int j = 0; j < 1000; j++)
		x[j] = rank;
	c = (khor_comm *)&sh;
	double t0 = mono();
	if (rank == 0)
		st = khor_comm_split(world, 0, rank, &c);
	else
		st = khor_allreduce(world, x, x, 1000, KHOR_INT32, KHOR_SUM);
	sh->failed_at[rank][0] = mono() - t0;
	sh->status[rank][0] = st;
	snprintf(sh->cerr[rank][0], TEXT, "%s", khor_comm_error(world));
	if (st == KHOR_SUCCESS) {
		rc = fail(sh, rank, 12, "%s succeeded although the others called %s (x[0] = %d)",
		          rank == 0 ? "split" : "allreduce", rank == 0 ? "allreduce" : "something "
		          "else", x[0]);
		if (rank == 0 && c != NULL && c != (khor_comm *)&sh)
			khor_comm_free(c);
		khor_finalize(world);
		return rc;
	}
	if (rank == 0 && c != (khor_comm *)&sh)
		return fail(sh, rank, 13, "a failed split wrote *newcomm_out");
	khor_finalize(world);
	return 0;
}

Test(comms, split_against_allreduce_fails_not_hangs, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 3, .timeout = "3s", .deadline_s = 40 };
	harness_result res;

	harness_run(&o, body_split_vs_allreduce, sh, &res);
	expect_all_ok(sh, &res, 3, "split against allreduce");
	for (int r = 0; r < 3; r++) {
		cr_expect_neq(sh->status[r][0], KHOR_SUCCESS, "rank %d got no error", r);
		cr_expect_lt(sh->failed_at[r][0], 2 * 3.0 + 4.0, "rank %d's call took %.1f s", r,
		             sh->failed_at[r][0]);
		fprintf(stderr, "split vs allreduce: rank %d: status %d after %.2f s: %s\n", r,
		        sh->status[r][0], sh->failed_at[r][0], sh->cerr[r][0]);
	}
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- 8. khor_request_error --------------------------------------------------------------- */

/*
 * n = 2, KHOR_TIMEOUT 2s, on a split comm. Request 1 succeeds (rank 1 joins it late, so
 * rank 0 sees it in progress first): "" before and after. Rank 1 never joins request 2:
 * rank 0's fails with its own text naming rank 1 and the comm, and request 1's text stays
 * "". A request made after the failure fails too, with a text.
 */
static int body_request_error(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world, *c;
	khor_request *r1, *r2, *r3 = NULL;
	float x[256], y[256];
	int rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	if (khor_comm_split(world, 0, rank, &c) != KHOR_SUCCESS || c == NULL)
		return fail(sh, rank, 11, "split: %s", khor_comm_error(world));
	for (int j = 0; j < 256; j++)
		x[j] = (float)(rank + j);
	if (rank == 1)
		usleep(300 * 1000);
	if (khor_iallreduce(c, x, y, 256, KHOR_FLOAT32, KHOR_SUM, &r1) != KHOR_SUCCESS)
		return fail(sh, rank, 12, "iallreduce 1 refused: %s", khor_comm_error(c));
	if (rank == 0) {
		khor_status t = khor_test(r1);
		if (t != KHOR_IN_PROGRESS && t != KHOR_SUCCESS)
			return fail(sh, rank, 13, "khor_test of request 1 = %d", t);
		if (strcmp(khor_request_error(r1), "") != 0)
			return fail(sh, rank, 13, "request 1 in progress has an error: %s",
			            khor_request_error(r1));
	}
	if (khor_wait(r1) != KHOR_SUCCESS)
		return fail(sh, rank, 14, "request 1: %s", khor_request_error(r1));
	if (strcmp(khor_request_error(r1), "") != 0)
		return fail(sh, rank, 15, "request 1 succeeded with an error text: %s",
		            khor_request_error(r1));
	for (int j = 0; j < 256; j++)
		if (y[j] != (float)(1 + 2 * j))
			return fail(sh, rank, 16, "request 1 [%d] = %g", j, (double)y[j]);
	if (rank == 1) {
		sleep(4); /* alive past rank 0's timeout, never joining request 2 */
		khor_request_free(r1);
		khor_comm_free(c);
		khor_finalize(world);
		return 0;
	}
	if (khor_iallreduce(c, x, y, 256, KHOR_FLOAT32, KHOR_SUM, &r2) != KHOR_SUCCESS)
		return fail(sh, rank, 17, "iallreduce 2 refused: %s", khor_comm_error(c));
	khor_status st = khor_wait(r2);
	snprintf(sh->cerr[0][0], TEXT, "%s", khor_request_error(r2));
	if (st == KHOR_SUCCESS)
		return fail(sh, rank, 18, "request 2 succeeded without rank 1");
	if (khor_test(r2) != st)
		return fail(sh, rank, 19, "khor_test of failed request 2 = %d, khor_wait said %d",
		            khor_test(r2), st);
	const char *e2 = khor_request_error(r2);
	if (strstr(e2, "rank 1") == NULL || strstr(e2, "comm ") == NULL)
		return fail(sh, rank, 20, "request 2's error does not name rank 1 and the comm: "
		            "'%s'", e2);
	if (strcmp(khor_request_error(r1), "") != 0)
		return fail(sh, rank, 21, "request 1's text changed after request 2 failed: %s",
		            khor_request_error(r1));
	khor_status st3 = khor_iallreduce(c, x, y, 256, KHOR_FLOAT32, KHOR_SUM, &r3);
	if (st3 == KHOR_SUCCESS) {
		if (khor_wait(r3) == KHOR_SUCCESS)
			return fail(sh, rank, 22, "request 3 succeeded on a failed comm");
		if (strcmp(khor_request_error(r3), "") == 0)
			return fail(sh, rank, 23, "failed request 3 has no error text");
		snprintf(sh->cerr[0][1], TEXT, "%s", khor_request_error(r3));
		khor_request_free(r3);
	}
	khor_request_free(r1);
	khor_request_free(r2);
	khor_comm_free(c);
	khor_finalize(world);
	return leak_check(sh, rank);
}

Test(comms, request_error_is_the_requests_own, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 2, .timeout = "2s", .deadline_s = 40 };
	harness_result res;

	harness_run(&o, body_request_error, sh, &res);
	expect_all_ok(sh, &res, 2, "request_error");
	fprintf(stderr, "request 2's error: %s\nrequest 3's error: %s\n", sh->cerr[0][0],
	        sh->cerr[0][1]);
	harness_shared_free(sh, sizeof(*sh));
}

/* ---- 9. the world cannot be freed --------------------------------------------------------- */

static int body_free_world(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	khor_comm *world;
	int32_t x = rank + 1;
	int rc;

	if ((rc = init(sh, rank, cfg, &world)) != 0)
		return rc;
	khor_status st = khor_comm_free(world);
	if (st != KHOR_ERR_INVALID_ARG)
		return fail(sh, rank, 11, "khor_comm_free(world) = %d, want %d", st,
		            KHOR_ERR_INVALID_ARG);
	if (strcmp(khor_comm_error(world), "") == 0)
		return fail(sh, rank, 12, "khor_comm_free(world) refused without a reason");
	if (khor_allreduce(world, &x, &x, 1, KHOR_INT32, KHOR_SUM) != KHOR_SUCCESS ||
	    x != n * (n + 1) / 2)
		return fail(sh, rank, 13, "world after the refused free: %d: %s", x,
		            khor_comm_error(world));
	khor_finalize(world);
	return leak_check(sh, rank);
}

Test(comms, free_of_world_is_refused, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 2, .timeout = "30s", .deadline_s = 40 };
	harness_result res;

	harness_run(&o, body_free_world, sh, &res);
	expect_all_ok(sh, &res, 2, "free world");
	harness_shared_free(sh, sizeof(*sh));
}
