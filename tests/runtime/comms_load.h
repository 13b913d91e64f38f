/*
 * comms_load.h -- the collective workloads that test_comms.c and tsan_comms.c drive on
 * comms made by khor_comm_split and khor_comm_create_group.
 *
 * load_check_all runs every collective once on a comm and checks each result element by
 * element. Every value a rank contributes is a function of its world rank (learnt from
 * khor_comm_world_rank), so a comm whose collectives order its members differently from
 * what its ranks report fails. load_mixed is the long mixed sequence that two threads run
 * on two comms at once: its values also carry the comm's tag and the call's index, so a
 * frame delivered to the wrong comm or to the wrong call fails too.
 *
 * Header-only (static functions) so the Criterion test and the standalone ThreadSanitizer
 * program share one copy without a library of their own.
 */
#ifndef KHOR_TESTS_COMMS_LOAD_H
#define KHOR_TESTS_COMMS_LOAD_H

#include "khor.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOAD_MAX_RANKS 16
#define LOAD_BIG 65536 /* floats: the 256 KiB allreduces of the mixed sequence */

static int load_fail(char *err, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int load_fail(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return 1;
}

/* Fills w[k] with the world rank of comm rank k; fails on -1 or a size out of range. */
static int load_world_map(khor_comm *c, int *w, char *err, size_t len)
{
	int n = khor_size(c);

	if (n < 1 || n > LOAD_MAX_RANKS)
		return load_fail(err, len, "khor_size = %d", n);
	for (int k = 0; k < n; k++) {
		w[k] = khor_comm_world_rank(c, k);
		if (w[k] < 0)
			return load_fail(err, len, "khor_comm_world_rank(c, %d) = %d", k, w[k]);
	}
	return 0;
}

/* Element j of world rank w's contribution; small, so every sum is exact. */
static int32_t load_v(int w, size_t j, int salt)
{
	return (int32_t)((w + 1) * 100 + (int)(j % 97) + salt % 13);
}

/* Element j of the block world rank w sends to comm rank d in alltoall(v). */
static int32_t load_a(int w, int d, size_t j, int salt)
{
	return (int32_t)(w * 100000 + d * 1000 + (int)(j % 500) + salt % 7);
}

#define LOAD_CALL(call, what)                                                                  \
	do {                                                                                   \
		khor_status st_ = (call);                                                      \
		if (st_ != KHOR_SUCCESS) {                                                     \
			rc = load_fail(err, len, "%s failed (%d): %s", what, (int)st_,         \
			               khor_comm_error(c));                                    \
			goto out;                                                              \
		}                                                                              \
	} while (0)

#define LOAD_EXPECT(cond, ...)                                                                 \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			rc = load_fail(err, len, __VA_ARGS__);                                 \
			goto out;                                                              \
		}                                                                              \
	} while (0)

/*
 * All eleven collectives once on c, each checked in full; outputs are poisoned first, and
 * the gaps that allgatherv's displacements leave must stay poisoned. salt varies the
 * values between calls. Returns 0, or 1 with the reason in err.
 */
static int load_check_all(khor_comm *c, int salt, char *err, size_t len)
{
	const int32_t poison = -7777777;
	int n = khor_size(c), r = khor_rank(c), rc = 0;
	int w[LOAD_MAX_RANKS];
	size_t cap = 4096 + 64 * LOAD_MAX_RANKS;
	int32_t *s = NULL, *d = NULL;
	size_t counts[LOAD_MAX_RANKS], displs[LOAD_MAX_RANKS], rcounts[LOAD_MAX_RANKS];

	if (load_world_map(c, w, err, len) != 0)
		return 1;
	if (r < 0 || r >= n)
		return load_fail(err, len, "khor_rank = %d with khor_size = %d", r, n);
	s = malloc(cap * sizeof(int32_t));
	d = malloc(cap * sizeof(int32_t));
	if (s == NULL || d == NULL) {
		rc = load_fail(err, len, "out of memory");
		goto out;
	}
#define POISON_D()                                                                             \
	for (size_t i_ = 0; i_ < cap; i_++)                                                    \
		d[i_] = poison

	/* allreduce, sum, out of place */
	size_t cnt = 1031;
	for (size_t j = 0; j < cnt; j++)
		s[j] = load_v(w[r], j, salt);
	POISON_D();
	LOAD_CALL(khor_allreduce(c, s, d, cnt, KHOR_INT32, KHOR_SUM), "allreduce");
	for (size_t j = 0; j < cnt; j++) {
		int32_t want = 0;
		for (int k = 0; k < n; k++)
			want += load_v(w[k], j, salt);
		LOAD_EXPECT(d[j] == want, "allreduce[%zu] = %d, want %d", j, d[j], want);
	}
	LOAD_EXPECT(d[cnt] == poison, "allreduce wrote past its end");

	/* allreduce, max, in place, float */
	{
		float f[33];
		for (size_t j = 0; j < 33; j++)
			f[j] = (float)load_v(w[r], j * 5, salt);
		LOAD_CALL(khor_allreduce(c, f, f, 33, KHOR_FLOAT32, KHOR_MAX), "allreduce max");
		for (size_t j = 0; j < 33; j++) {
			int32_t want = load_v(w[0], j * 5, salt);
			for (int k = 1; k < n; k++)
				if (load_v(w[k], j * 5, salt) > want)
					want = load_v(w[k], j * 5, salt);
			LOAD_EXPECT(f[j] == (float)want, "allreduce max[%zu] = %g, want %d", j,
			            (double)f[j], want);
		}
	}

	/* broadcast from the last rank */
	int root = n - 1;
	cnt = 301;
	for (size_t j = 0; j < cnt; j++)
		d[j] = r == root ? load_v(w[r], j, salt) : poison;
	LOAD_CALL(khor_broadcast(c, d, cnt, KHOR_INT32, root), "broadcast");
	for (size_t j = 0; j < cnt; j++)
		LOAD_EXPECT(d[j] == load_v(w[root], j, salt), "broadcast[%zu] = %d, want %d", j,
		            d[j], load_v(w[root], j, salt));

	LOAD_CALL(khor_barrier(c), "barrier");

	/* reduce to the middle rank */
	root = n / 2;
	cnt = 77;
	for (size_t j = 0; j < cnt; j++)
		s[j] = load_v(w[r], j + 3, salt);
	POISON_D();
	LOAD_CALL(khor_reduce(c, s, d, cnt, KHOR_INT32, KHOR_SUM, root), "reduce");
	if (r == root) {
		for (size_t j = 0; j < cnt; j++) {
			int32_t want = 0;
			for (int k = 0; k < n; k++)
				want += load_v(w[k], j + 3, salt);
			LOAD_EXPECT(d[j] == want, "reduce[%zu] = %d at root %d, want %d", j, d[j],
			            root, want);
		}
	}

	/* allgather: block k from comm rank k */
	cnt = 5;
	for (size_t j = 0; j < cnt; j++)
		s[j] = load_v(w[r], j, salt + 1);
	POISON_D();
	LOAD_CALL(khor_allgather(c, s, d, cnt, KHOR_INT32), "allgather");
	for (int k = 0; k < n; k++)
		for (size_t j = 0; j < cnt; j++)
			LOAD_EXPECT(d[(size_t)k * cnt + j] == load_v(w[k], j, salt + 1),
			            "allgather block %d [%zu] = %d, want %d (from world rank %d)", k,
			            j, d[(size_t)k * cnt + j], load_v(w[k], j, salt + 1), w[k]);
	LOAD_EXPECT(d[(size_t)n * cnt] == poison, "allgather wrote past its end");

	/* allgatherv: rank k sends k + 1 elements, packed, then with 2-element gaps */
	for (int gaps = 0; gaps < 2; gaps++) {
		size_t off = 0;
		for (int k = 0; k < n; k++) {
			rcounts[k] = (size_t)k + 1;
			displs[k] = off;
			off += rcounts[k] + (gaps ? 2 : 0);
		}
		for (size_t j = 0; j <= (size_t)r; j++)
			s[j] = load_v(w[r], j, salt + 2);
		POISON_D();
		LOAD_CALL(khor_allgatherv(c, s, (size_t)r + 1, d, rcounts, gaps ? displs : NULL,
		                          KHOR_INT32),
		          gaps ? "allgatherv (gaps)" : "allgatherv (packed)");
		for (int k = 0; k < n; k++) {
			for (size_t j = 0; j < rcounts[k]; j++)
				LOAD_EXPECT(d[displs[k] + j] == load_v(w[k], j, salt + 2),
				            "allgatherv gaps=%d block %d [%zu] = %d, want %d", gaps, k,
				            j, d[displs[k] + j], load_v(w[k], j, salt + 2));
			if (gaps)
				LOAD_EXPECT(d[displs[k] + rcounts[k]] == poison &&
				                    d[displs[k] + rcounts[k] + 1] == poison,
				            "allgatherv wrote into the gap after block %d", k);
		}
	}

	/* reduce_scatter: count % n ranks get one more */
	cnt = 3 * (size_t)n + 2;
	for (size_t j = 0; j < cnt; j++)
		s[j] = load_v(w[r], j, salt + 3);
	POISON_D();
	LOAD_CALL(khor_reduce_scatter(c, s, d, cnt, KHOR_INT32, KHOR_SUM), "reduce_scatter");
	{
		size_t base = cnt / (size_t)n, rem = cnt % (size_t)n;
		size_t mine = base + ((size_t)r < rem), off = (size_t)r * base +
		              ((size_t)r < rem ? (size_t)r : rem);
		for (size_t j = 0; j < mine; j++) {
			int32_t want = 0;
			for (int k = 0; k < n; k++)
				want += load_v(w[k], off + j, salt + 3);
			LOAD_EXPECT(d[j] == want, "reduce_scatter[%zu] = %d, want %d", j, d[j], want);
		}
		LOAD_EXPECT(d[mine] == poison, "reduce_scatter wrote past its block");
	}

	/* alltoall */
	cnt = 3;
	for (int dst = 0; dst < n; dst++)
		for (size_t j = 0; j < cnt; j++)
			s[(size_t)dst * cnt + j] = load_a(w[r], dst, j, salt);
	POISON_D();
	LOAD_CALL(khor_alltoall(c, s, d, cnt, KHOR_INT32), "alltoall");
	for (int k = 0; k < n; k++)
		for (size_t j = 0; j < cnt; j++)
			LOAD_EXPECT(d[(size_t)k * cnt + j] == load_a(w[k], r, j, salt),
			            "alltoall block %d [%zu] = %d, want %d", k, j,
			            d[(size_t)k * cnt + j], load_a(w[k], r, j, salt));

	/* alltoallv: (sender + receiver) % 3 elements, zero included, packed */
	{
		size_t so = 0, ro = 0;
		for (int k = 0; k < n; k++) {
			counts[k] = (size_t)((r + k) % 3);
			rcounts[k] = (size_t)((k + r) % 3);
			for (size_t j = 0; j < counts[k]; j++)
				s[so + j] = load_a(w[r], k, j, salt + 1);
			so += counts[k];
		}
		POISON_D();
		LOAD_CALL(khor_alltoallv(c, s, counts, NULL, d, rcounts, NULL, KHOR_INT32),
		          "alltoallv");
		for (int k = 0; k < n; k++) {
			for (size_t j = 0; j < rcounts[k]; j++)
				LOAD_EXPECT(d[ro + j] == load_a(w[k], r, j, salt + 1),
				            "alltoallv block %d [%zu] = %d, want %d", k, j, d[ro + j],
				            load_a(w[k], r, j, salt + 1));
			ro += rcounts[k];
		}
		LOAD_EXPECT(d[ro] == poison, "alltoallv wrote past its end");
	}

	/* gather to rank 0 */
	cnt = 4;
	for (size_t j = 0; j < cnt; j++)
		s[j] = load_v(w[r], j, salt + 4);
	POISON_D();
	LOAD_CALL(khor_gather(c, s, d, cnt, KHOR_INT32, 0), "gather");
	if (r == 0)
		for (int k = 0; k < n; k++)
			for (size_t j = 0; j < cnt; j++)
				LOAD_EXPECT(d[(size_t)k * cnt + j] == load_v(w[k], j, salt + 4),
				            "gather block %d [%zu] = %d, want %d", k, j,
				            d[(size_t)k * cnt + j], load_v(w[k], j, salt + 4));

	/* scatter from the last rank */
	root = n - 1;
	cnt = 4;
	for (int k = 0; k < n; k++)
		for (size_t j = 0; j < cnt; j++)
			s[(size_t)k * cnt + j] = r == root ? load_a(w[root], k, j, salt + 2) : poison;
	POISON_D();
	LOAD_CALL(khor_scatter(c, s, d, cnt, KHOR_INT32, root), "scatter");
	for (size_t j = 0; j < cnt; j++)
		LOAD_EXPECT(d[j] == load_a(w[root], r, j, salt + 2), "scatter[%zu] = %d, want %d", j,
		            d[j], load_a(w[root], r, j, salt + 2));
	LOAD_EXPECT(d[cnt] == poison, "scatter wrote past its block");
#undef POISON_D
out:
	free(s);
	free(d);
	return rc;
}

/*
 * The mixed sequence: ops calls of allreduce (1..4000 int32, and a 256 KiB float one every
 * 125 calls), broadcast from a moving root, allgather, barrier, reduce_scatter and alltoall.
 * Every rank of c must run it with the same tag and ops. Returns 0, or 1 with the call's
 * index and the reason in err.
 */
struct load_bufs {
	float *big;
	int32_t *s, *d;
};

#define LOAD_SMALL 8192 /* int32 elements of s and d */

static int load_bufs_init(struct load_bufs *b)
{
	b->big = malloc(LOAD_BIG * sizeof(float));
	b->s = malloc(LOAD_SMALL * sizeof(int32_t));
	b->d = malloc(LOAD_SMALL * sizeof(int32_t));
	return b->big != NULL && b->s != NULL && b->d != NULL ? 0 : -1;
}

static void load_bufs_free(struct load_bufs *b)
{
	free(b->big);
	free(b->s);
	free(b->d);
}

/* Element j of call i on the comm tagged tag, from world rank w. */
static int32_t load_m(int w, int tag, int i, size_t j)
{
	return (int32_t)((w + 1) * 16 + (int)((j + (size_t)i * 3 + (size_t)tag * 5) % 11));
}

static int load_one(khor_comm *c, const int *w, int tag, int i, struct load_bufs *b, char *err,
                    size_t len)
{
	int n = khor_size(c), r = khor_rank(c), rc = 0;
	int32_t *s = b->s, *d = b->d;
	size_t cnt;
	int kind = i % 8;

	if (i % 125 == 60)
		kind = 100;
	switch (kind) {
	case 100: /* 256 KiB of float32, in place */
		for (size_t j = 0; j < LOAD_BIG; j++)
			b->big[j] = (float)load_m(w[r], tag, i, j);
		LOAD_CALL(khor_allreduce(c, b->big, b->big, LOAD_BIG, KHOR_FLOAT32, KHOR_SUM),
		          "allreduce 256 KiB");
		for (size_t j = 0; j < LOAD_BIG; j++) {
			int32_t want = 0;
			for (int k = 0; k < n; k++)
				want += load_m(w[k], tag, i, j);
			LOAD_EXPECT(b->big[j] == (float)want, "allreduce 256 KiB [%zu] = %g, want %d",
			            j, (double)b->big[j], want);
		}
		break;
	case 0:
	case 4:
	case 6:
		cnt = 1 + ((size_t)i * 131) % 4000;
		for (size_t j = 0; j < cnt; j++)
			s[j] = load_m(w[r], tag, i, j);
		LOAD_CALL(khor_allreduce(c, s, d, cnt, KHOR_INT32, KHOR_SUM), "allreduce");
		for (size_t j = 0; j < cnt; j++) {
			int32_t want = 0;
			for (int k = 0; k < n; k++)
				want += load_m(w[k], tag, i, j);
			LOAD_EXPECT(d[j] == want, "allreduce of %zu [%zu] = %d, want %d", cnt, j, d[j],
			            want);
		}
		break;
	case 1: {
		int root = i % n;
		cnt = 1 + ((size_t)i * 37) % 1000;
		for (size_t j = 0; j < cnt; j++)
			d[j] = r == root ? load_m(w[r], tag, i, j) : -1;
		LOAD_CALL(khor_broadcast(c, d, cnt, KHOR_INT32, root), "broadcast");
		for (size_t j = 0; j < cnt; j++)
			LOAD_EXPECT(d[j] == load_m(w[root], tag, i, j),
			            "broadcast of %zu from %d [%zu] = %d, want %d", cnt, root, j, d[j],
			            load_m(w[root], tag, i, j));
		break;
	}
	case 2:
		cnt = 1 + (size_t)i % 64;
		for (size_t j = 0; j < cnt; j++)
			s[j] = load_m(w[r], tag, i, j);
		LOAD_CALL(khor_allgather(c, s, d, cnt, KHOR_INT32), "allgather");
		for (int k = 0; k < n; k++)
			for (size_t j = 0; j < cnt; j++)
				LOAD_EXPECT(d[(size_t)k * cnt + j] == load_m(w[k], tag, i, j),
				            "allgather of %zu block %d [%zu] = %d, want %d", cnt, k, j,
				            d[(size_t)k * cnt + j], load_m(w[k], tag, i, j));
		break;
	case 3:
		LOAD_CALL(khor_barrier(c), "barrier");
		break;
	case 5: {
		cnt = (size_t)n * (1 + (size_t)i % 5) + (size_t)i % 3;
		for (size_t j = 0; j < cnt; j++)
			s[j] = load_m(w[r], tag, i, j);
		LOAD_CALL(khor_reduce_scatter(c, s, d, cnt, KHOR_INT32, KHOR_SUM), "reduce_scatter");
		size_t base = cnt / (size_t)n, rem = cnt % (size_t)n;
		size_t mine = base + ((size_t)r < rem);
		size_t off = (size_t)r * base + ((size_t)r < rem ? (size_t)r : rem);
		for (size_t j = 0; j < mine; j++) {
			int32_t want = 0;
			for (int k = 0; k < n; k++)
				want += load_m(w[k], tag, i, off + j);
			LOAD_EXPECT(d[j] == want, "reduce_scatter of %zu [%zu] = %d, want %d", cnt, j,
			            d[j], want);
		}
		break;
	}
	case 7:
		cnt = 1 + (size_t)i % 4;
		for (int dst = 0; dst < n; dst++)
			for (size_t j = 0; j < cnt; j++)
				s[(size_t)dst * cnt + j] = load_m(w[r], tag, i, j + (size_t)dst * 7);
		LOAD_CALL(khor_alltoall(c, s, d, cnt, KHOR_INT32), "alltoall");
		for (int k = 0; k < n; k++)
			for (size_t j = 0; j < cnt; j++)
				LOAD_EXPECT(d[(size_t)k * cnt + j] ==
				                    load_m(w[k], tag, i, j + (size_t)r * 7),
				            "alltoall block %d [%zu] = %d, want %d", k, j,
				            d[(size_t)k * cnt + j],
				            load_m(w[k], tag, i, j + (size_t)r * 7));
		break;
	}
out:
	return rc;
}

/* progress, when not NULL, is kept at the index of the call running now (for a hang's report). */
static int load_mixed(khor_comm *c, int tag, int ops, volatile int *progress, char *err,
                      size_t len)
{
	struct load_bufs b;
	int w[LOAD_MAX_RANKS], rc = 0;
	char why[768];

	if (load_world_map(c, w, err, len) != 0)
		return 1;
	if (load_bufs_init(&b) != 0) {
		load_bufs_free(&b);
		return load_fail(err, len, "out of memory");
	}
	for (int i = 0; i < ops && rc == 0; i++) {
		if (progress != NULL)
			*progress = i;
		if (load_one(c, w, tag, i, &b, why, sizeof(why)) != 0)
			rc = load_fail(err, len, "comm tag %d, call %d of %d: %s", tag, i, ops, why);
	}
	if (progress != NULL && rc == 0)
		*progress = ops;
	load_bufs_free(&b);
	return rc;
}

/*
 * Two threads, each running load_mixed on its own comm at once. Even ranks start a's
 * thread first, odd ranks b's, and on odd ranks the thread started first waits 20 ms
 * before its first call, so the ranks enter the two comms' calls in different orders and
 * each comm's frames arrive while the other comm's call is the one being driven. progress,
 * when not NULL, holds two ints: the index of the call each thread is in.
 */
struct load_thread {
	khor_comm *comm;
	int tag, ops, delay_us, rc;
	volatile int *progress; /* may be NULL */
	char err[1024];
};

static void *load_thread_main(void *p)
{
	struct load_thread *t = p;

	if (t->delay_us > 0)
		usleep((useconds_t)t->delay_us);
	t->rc = load_mixed(t->comm, t->tag, t->ops, t->progress, t->err, sizeof(t->err));
	return NULL;
}

static int load_two_threads(khor_comm *a, khor_comm *b, int world_rank, int ops,
                            volatile int *progress, char *err, size_t len)
{
	struct load_thread t[2] = { { .comm = a, .tag = 1, .ops = ops },
	                            { .comm = b, .tag = 2, .ops = ops } };
	pthread_t th[2];
	int first = world_rank % 2, rc = 0;

	if (progress != NULL) {
		t[0].progress = &progress[0];
		t[1].progress = &progress[1];
	}
	if (world_rank % 2 == 1)
		t[first].delay_us = 20000;
	if (pthread_create(&th[first], NULL, load_thread_main, &t[first]) != 0)
		return load_fail(err, len, "pthread_create failed");
	if (pthread_create(&th[1 - first], NULL, load_thread_main, &t[1 - first]) != 0) {
		pthread_join(th[first], NULL);
		return load_fail(err, len, "pthread_create failed");
	}
	pthread_join(th[0], NULL);
	pthread_join(th[1], NULL);
	for (int k = 0; k < 2 && rc == 0; k++)
		if (t[k].rc != 0)
			rc = load_fail(err, len, "thread of comm %lld: %s",
			               (long long)khor_comm_id(t[k].comm), t[k].err);
	return rc;
}

#endif
