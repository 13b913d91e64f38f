/*
 * bench_colls.c -- the table of collectives: per collective its counts from a size (nccl-tests'
 * conventions), its bus-bandwidth factor, one call of it, and the fill and check of its data.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_colls.h"
#include "bench_data.h"

#include <stdint.h>
#include <string.h>

/* ---- the collectives ---------------------------------------------------------------------- */

static double bench_factor_allreduce(int n)
{
	return n > 1 ? 2.0 * (n - 1) / n : 0.0;
}

static double bench_factor_spread(int n)
{
	return n > 1 ? (double)(n - 1) / n : 0.0;
}

static double bench_factor_one(int n)
{
	(void)n;
	return 1.0;
}

static double bench_factor_zero(int n)
{
	(void)n;
	return 0.0;
}

/* allreduce, reduce, broadcast: every buffer holds the whole count. */
static void bench_shape_same(size_t total, int n, struct bench_shape *s)
{
	(void)n;
	*s = (struct bench_shape){total, total, total, total};
}

/* allgather, gather: each rank sends total/n; the root (everyone) gets all of it. */
static void bench_shape_gather(size_t total, int n, struct bench_shape *s)
{
	size_t per = total / (size_t)n;
	*s = (struct bench_shape){per * n, per, per, per * n};
}

/* scatter: the root sends n blocks, each rank gets one. */
static void bench_shape_scatter(size_t total, int n, struct bench_shape *s)
{
	size_t per = total / (size_t)n;
	*s = (struct bench_shape){per * n, per, per * n, per};
}

/* reducescatter: uneven blocks, so no rounding: the buffer is exactly size bytes. */
static void bench_shape_rs(size_t total, int n, struct bench_shape *s)
{
	*s = (struct bench_shape){total, total, total, bench_rs_count(total, n, 0)};
}

/* alltoall: a whole buffer each way, n blocks of total/n. */
static void bench_shape_alltoall(size_t total, int n, struct bench_shape *s)
{
	size_t per = total / (size_t)n;
	*s = (struct bench_shape){per * n, per, per * n, per * n};
}

static void bench_shape_none(size_t total, int n, struct bench_shape *s)
{
	(void)total, (void)n;
	*s = (struct bench_shape){0, 0, 0, 0};
}

/* Out of place everywhere, as nccl-tests' default: the input stays valid for every call. */
static int bench_run_allreduce(struct bench_backend *b, const struct bench_args *a,
                               const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->allreduce(b, sendbuf, recvbuf, s->param, a->dtype, a->op);
}

static int bench_run_reduce(struct bench_backend *b, const struct bench_args *a,
                            const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->reduce(b, sendbuf, recvbuf, s->param, a->dtype, a->op, a->root);
}

/* Broadcast is in place on recvbuf: the root's data in it, every other rank's overwritten. */
static int bench_run_broadcast(struct bench_backend *b, const struct bench_args *a,
                               const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	(void)sendbuf;
	return b->broadcast(b, recvbuf, s->param, a->dtype, a->root);
}

static int bench_run_allgather(struct bench_backend *b, const struct bench_args *a,
                               const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->allgather(b, sendbuf, recvbuf, s->param, a->dtype);
}

static int bench_run_rs(struct bench_backend *b, const struct bench_args *a,
                        const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->reduce_scatter(b, sendbuf, recvbuf, s->param, a->dtype, a->op);
}

static int bench_run_alltoall(struct bench_backend *b, const struct bench_args *a,
                              const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->alltoall(b, sendbuf, recvbuf, s->param, a->dtype);
}

static int bench_run_gather(struct bench_backend *b, const struct bench_args *a,
                            const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->gather(b, sendbuf, recvbuf, s->param, a->dtype, a->root);
}

static int bench_run_scatter(struct bench_backend *b, const struct bench_args *a,
                             const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->scatter(b, sendbuf, recvbuf, s->param, a->dtype, a->root);
}

static int bench_run_barrier(struct bench_backend *b, const struct bench_args *a,
                             const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	(void)a, (void)s, (void)sendbuf, (void)recvbuf;
	return b->barrier(b);
}

/* Reductions (allreduce, reduce, reducescatter): the whole input holds the pattern. */
static void bench_fill_reduction(const struct bench_backend *b, const struct bench_args *a,
                                 const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	for (size_t i = 0; i < s->send; i++)
		bench_set(sendbuf, a->dtype, i,
		          bench_pattern(a->op, a->dtype, b->rank, b->size, i));
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

/* recvbuf[j] must be the reduction at index first + j. */
static int64_t bench_check_reduced(const struct bench_backend *b, const struct bench_args *a,
                                   const void *recvbuf, size_t first, size_t count)
{
	int64_t wrong = 0;
	for (size_t j = 0; j < count; j++) {
		double want = bench_expected(a->op, a->dtype, b->size, first + j);
		wrong += bench_mismatch(a->op, a->dtype, bench_get(recvbuf, a->dtype, j), want);
	}
	return wrong;
}

static int64_t bench_check_allreduce(const struct bench_backend *b, const struct bench_args *a,
                                     const struct bench_shape *s, const void *recvbuf)
{
	return bench_check_reduced(b, a, recvbuf, 0, s->recv);
}

static int64_t bench_check_reduce(const struct bench_backend *b, const struct bench_args *a,
                                  const struct bench_shape *s, const void *recvbuf)
{
	return b->rank == a->root ? bench_check_reduced(b, a, recvbuf, 0, s->recv) : 0;
}

static int64_t bench_check_rs(const struct bench_backend *b, const struct bench_args *a,
                              const struct bench_shape *s, const void *recvbuf)
{
	int64_t wrong =
	    bench_check_reduced(b, a, recvbuf, bench_rs_offset(s->total, b->size, b->rank),
	                        bench_rs_count(s->total, b->size, b->rank));
	/* A rank with the short block must not have been written past it: those elements still
	 * hold the sentinel, as the dtype stores it. */
	double stored; /* 8 bytes, aligned for every dtype */
	bench_set(&stored, a->dtype, 0, bench_dtypes[a->dtype].sentinel);
	double sentinel = bench_get(&stored, a->dtype, 0);
	for (size_t j = bench_rs_count(s->total, b->size, b->rank); j < s->recv; j++)
		wrong += bench_get(recvbuf, a->dtype, j) != sentinel;
	return wrong;
}

/* n blocks of count elements, block k from source first + k * stride. */
static void bench_fill_blocks(void *buf, enum bench_dtype d, size_t nblocks, size_t count,
                              size_t first, size_t stride)
{
	for (size_t k = 0; k < nblocks; k++)
		for (size_t j = 0; j < count; j++)
			bench_set(buf, d, k * count + j, bench_value(d, first + k * stride, j));
}

static int64_t bench_check_blocks(const void *buf, enum bench_dtype d, size_t nblocks, size_t count,
                                  size_t first, size_t stride)
{
	int64_t wrong = 0;
	for (size_t k = 0; k < nblocks; k++)
		for (size_t j = 0; j < count; j++)
			wrong += bench_get(buf, d, k * count + j) !=
			         bench_value(d, first + k * stride, j);
	return wrong;
}

static void bench_fill_broadcast(const struct bench_backend *b, const struct bench_args *a,
                                 const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	(void)sendbuf;
	if (b->rank == a->root)
		bench_fill_blocks(recvbuf, a->dtype, 1, s->recv, (size_t)a->root, 0);
	else
		bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static int64_t bench_check_broadcast(const struct bench_backend *b, const struct bench_args *a,
                                     const struct bench_shape *s, const void *recvbuf)
{
	(void)b;
	return bench_check_blocks(recvbuf, a->dtype, 1, s->recv, (size_t)a->root, 0);
}

/* allgather and gather: rank r sends the block of source r. */
static void bench_fill_gather(const struct bench_backend *b, const struct bench_args *a,
                              const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	bench_fill_blocks(sendbuf, a->dtype, 1, s->send, (size_t)b->rank, 0);
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static int64_t bench_check_allgather(const struct bench_backend *b, const struct bench_args *a,
                                     const struct bench_shape *s, const void *recvbuf)
{
	return bench_check_blocks(recvbuf, a->dtype, (size_t)b->size, s->param, 0, 1);
}

static int64_t bench_check_gather(const struct bench_backend *b, const struct bench_args *a,
                                  const struct bench_shape *s, const void *recvbuf)
{
	return b->rank == a->root ? bench_check_allgather(b, a, s, recvbuf) : 0;
}

/* scatter: the root's block k is source k's. */
static void bench_fill_scatter(const struct bench_backend *b, const struct bench_args *a,
                               const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	if (b->rank == a->root)
		bench_fill_blocks(sendbuf, a->dtype, (size_t)b->size, s->param, 0, 1);
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static int64_t bench_check_scatter(const struct bench_backend *b, const struct bench_args *a,
                                   const struct bench_shape *s, const void *recvbuf)
{
	return bench_check_blocks(recvbuf, a->dtype, 1, s->recv, (size_t)b->rank, 0);
}

/* alltoall: the block that rank i sends to rank j belongs to source i*n + j. */
static void bench_fill_alltoall(const struct bench_backend *b, const struct bench_args *a,
                                const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	size_t n = (size_t)b->size;
	bench_fill_blocks(sendbuf, a->dtype, n, s->param, (size_t)b->rank * n, 1);
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static int64_t bench_check_alltoall(const struct bench_backend *b, const struct bench_args *a,
                                    const struct bench_shape *s, const void *recvbuf)
{
	size_t n = (size_t)b->size;
	return bench_check_blocks(recvbuf, a->dtype, n, s->param, (size_t)b->rank, n);
}

#define BENCH_HAS(call)                                                                            \
	static int bench_has_##call(const struct bench_backend *b)                                 \
	{                                                                                          \
		return b->call != NULL;                                                            \
	}

BENCH_HAS(allreduce)
BENCH_HAS(reduce)
BENCH_HAS(broadcast)
BENCH_HAS(allgather)
BENCH_HAS(reduce_scatter)
BENCH_HAS(alltoall)
BENCH_HAS(gather)
BENCH_HAS(scatter)
BENCH_HAS(barrier)
#undef BENCH_HAS

const struct bench_coll bench_colls[] = {
	{"allreduce", BENCH_USES_OP, bench_has_allreduce, bench_factor_allreduce, bench_shape_same,
	 bench_run_allreduce, bench_fill_reduction, bench_check_allreduce},
	{"reduce", BENCH_USES_OP | BENCH_USES_ROOT, bench_has_reduce, bench_factor_one,
	 bench_shape_same, bench_run_reduce, bench_fill_reduction, bench_check_reduce},
	{"broadcast", BENCH_USES_ROOT, bench_has_broadcast, bench_factor_one, bench_shape_same,
	 bench_run_broadcast, bench_fill_broadcast, bench_check_broadcast},
	{"allgather", 0, bench_has_allgather, bench_factor_spread, bench_shape_gather,
	 bench_run_allgather, bench_fill_gather, bench_check_allgather},
	{"reducescatter", BENCH_USES_OP, bench_has_reduce_scatter, bench_factor_spread, bench_shape_rs,
	 bench_run_rs, bench_fill_reduction, bench_check_rs},
	{"alltoall", 0, bench_has_alltoall, bench_factor_spread, bench_shape_alltoall,
	 bench_run_alltoall, bench_fill_alltoall, bench_check_alltoall},
	{"gather", BENCH_USES_ROOT, bench_has_gather, bench_factor_spread, bench_shape_gather,
	 bench_run_gather, bench_fill_gather, bench_check_gather},
	{"scatter", BENCH_USES_ROOT, bench_has_scatter, bench_factor_spread, bench_shape_scatter,
	 bench_run_scatter, bench_fill_scatter, bench_check_scatter},
	{"barrier", BENCH_NO_DATA, bench_has_barrier, bench_factor_zero, bench_shape_none,
	 bench_run_barrier, NULL, NULL},
};

const size_t bench_ncolls = sizeof bench_colls / sizeof bench_colls[0];

const struct bench_coll *bench_find_coll(const char *name)
{
	char plain[32];
	size_t len = 0;
	for (const char *p = name; *p && len + 1 < sizeof plain; p++)
		if (*p != '_' && *p != '-')
			plain[len++] = *p;
	plain[len] = '\0';
	if (strcmp(plain, "bcast") == 0)
		return &bench_colls[2];
	for (size_t i = 0; i < bench_ncolls; i++)
		if (strcmp(plain, bench_colls[i].name) == 0)
			return &bench_colls[i];
	return NULL;
}
