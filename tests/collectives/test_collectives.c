/*
 * test_collectives.c -- reduce, reduce_scatter, allgather(v), alltoall(v), gather, scatter,
 * broadcast and barrier over real TCP links, n = 1..8.
 *
 * One job per (n, configuration) runs every case inside its ranks, so the cost of forking
 * and joining is paid once. Inputs are small integers, so every result is exact and is
 * compared byte for byte with a reference computed in double and rounded (or wrapped) to
 * the dtype. Outputs are poisoned first and framed by guard bytes: an element left
 * unwritten, a byte written past either end, into the gaps between v-form blocks or into
 * a non-root's buffer all fail. Two configurations: tiny slices, 2 sockets and
 * KHOR_RD_MAX_BYTES large (binomial broadcast, Bruck allgather, pipelined lanes on small
 * buffers), and 1 socket with KHOR_RD_MAX_BYTES=0 (ring allgather, chain broadcast; one
 * socket keeps frames in strict order, which is where a badly ordered schedule would hang).
 *
 * The dtype table lists what the reduction kernels may support; reductions are skipped for
 * a (dtype, op) that reduce_supported refuses, everything else runs for every dtype.
 */
#include "tests/harness.h"

#include "collectives/reduce.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const khor_dtype dtypes[] = {
	KHOR_FLOAT32, KHOR_FLOAT64, KHOR_INT32, KHOR_INT64,
	KHOR_FLOAT16, KHOR_BFLOAT16, KHOR_INT8, KHOR_UINT8, KHOR_INT16,
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))
static const khor_op ops[] = { KHOR_SUM, KHOR_AVG, KHOR_MIN, KHOR_MAX, KHOR_PROD };
#define NOPS (sizeof(ops) / sizeof(ops[0]))

#define GUARD 64
#define POISON 0xa5

/* ---- values: encode a double into one element of dtype (integers wrap) ------------------- */

static void put(void *buf, khor_dtype dt, size_t i, double v)
{
	int64_t iv = (int64_t)v;
	uint64_t u = (uint64_t)iv;

	switch (dt) {
	case KHOR_FLOAT32: ((float *)buf)[i] = (float)v; break;
	case KHOR_FLOAT64: ((double *)buf)[i] = v; break;
	case KHOR_INT32: ((uint32_t *)buf)[i] = (uint32_t)u; break;
	case KHOR_INT64: ((uint64_t *)buf)[i] = u; break;
	case KHOR_FLOAT16: ((uint16_t *)buf)[i] = reduce_f32_to_f16((float)v); break;
	case KHOR_BFLOAT16: ((uint16_t *)buf)[i] = reduce_f32_to_bf16((float)v); break;
	case KHOR_INT16: ((uint16_t *)buf)[i] = (uint16_t)u; break;
	case KHOR_INT8: case KHOR_UINT8: case KHOR_BOOL: ((uint8_t *)buf)[i] = (uint8_t)u; break;
	}
}

/* Element i of buf holds exactly the encoding of v. */
static bool is(const void *buf, khor_dtype dt, size_t i, double v)
{
	uint8_t want[8];
	size_t esz = khor_dtype_size(dt);

	put(want, dt, 0, v);
	return memcmp((const uint8_t *)buf + i * esz, want, esz) == 0;
}

static bool is_unsigned(khor_dtype dt)
{
	return dt == KHOR_UINT8 || dt == KHOR_BOOL;
}

static bool is_int(khor_dtype dt)
{
	return dt == KHOR_INT32 || dt == KHOR_INT64 || dt == KHOR_INT8 || dt == KHOR_INT16 ||
	       is_unsigned(dt);
}

/* Reduction input of rank r: small integers; for prod only -1, 1, 2 (1, 1, 2 unsigned). */
static double rin(int r, size_t i, khor_op op, unsigned salt, khor_dtype dt)
{
	if (op == KHOR_PROD) {
		int v = (int)(((size_t)r * 7 + i * 3 + salt) % 3);
		return v == 0 ? (is_unsigned(dt) ? 1 : -1) : v;
	}
	double v = (double)(((size_t)r * 131 + i * 7 + (size_t)salt * 17) % 23);
	return is_unsigned(dt) ? v : v - 11;
}

/* The reduction over ranks 0..n-1, exact in double, then as the kernels round it. */
static double rref(int n, size_t i, khor_op op, unsigned salt, khor_dtype dt)
{
	double acc = rin(0, i, op, salt, dt);

	for (int r = 1; r < n; r++) {
		double x = rin(r, i, op, salt, dt);
		switch (op) {
		case KHOR_SUM: case KHOR_AVG: acc += x; break;
		case KHOR_MIN: acc = x < acc ? x : acc; break;
		case KHOR_MAX: acc = x > acc ? x : acc; break;
		case KHOR_PROD: acc *= x; break;
		}
	}
	if (op == KHOR_AVG)
		acc = is_int(dt) ? trunc(acc / n) : acc / n;
	return acc;
}

/* Data of the moving collectives: element i of the block that `who` owns. */
static double mval(int who, size_t i, unsigned salt)
{
	return (double)(((size_t)who * 37 + i * 11 + salt) % 100);
}

/* Same sequence on every rank: counts all ranks must agree on. */
static uint32_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 11);
}

/* ---- guarded buffers ---------------------------------------------------------------- */

typedef struct gbuf {
	uint8_t *base, *p;
	size_t len;
} gbuf;

static gbuf galloc(size_t len)
{
	gbuf b;

	b.base = malloc(len + 2 * GUARD);
	memset(b.base, POISON, len + 2 * GUARD);
	b.p = b.base + GUARD;
	b.len = len;
	return b;
}

/* Bytes [off, off + len) of the buffer, or its guards, still poisoned. */
static bool untouched(const gbuf *b, size_t off, size_t len)
{
	const uint8_t *p = b->p + off;

	for (size_t i = 0; i < len; i++)
		if (p[i] != POISON)
			return false;
	return true;
}

static bool guards_ok(const gbuf *b)
{
	for (size_t i = 0; i < GUARD; i++)
		if (b->base[i] != POISON || b->p[b->len + i] != POISON)
			return false;
	return true;
}

/* ---- the cases ------------------------------------------------------------------------ */

struct ctx {
	khor_comm *comm;
	int rank, n;
	unsigned salt;
	char where[160];
};

#define FAIL(c, ...)                                                                       \
	do {                                                                               \
		fprintf(stderr, "rank %d: %s: ", (c)->rank, (c)->where);                   \
		fprintf(stderr, __VA_ARGS__);                                              \
		fprintf(stderr, "\n");                                                     \
		return false;                                                              \
	} while (0)

#define CALL(c, expr)                                                                      \
	do {                                                                               \
		if ((expr) != KHOR_SUCCESS)                                                \
			FAIL(c, "failed: %s", khor_comm_error((c)->comm));                 \
	} while (0)

static bool case_reduce(struct ctx *c, khor_dtype dt, khor_op op, size_t count)
{
	size_t esz = khor_dtype_size(dt);
	int root = (int)(c->salt % (unsigned)c->n);
	bool inplace = c->salt % 3 == 0 && c->rank == root;
	gbuf in = galloc(count * esz), out = galloc(count * esz);

	snprintf(c->where, sizeof(c->where), "reduce dt %d op %d count %zu root %d%s", dt, op,
	         count, root, inplace ? " in place" : "");
	for (size_t i = 0; i < count; i++)
		put(inplace ? out.p : in.p, dt, i, rin(c->rank, i, op, c->salt, dt));
	/* A non-root may pass no receive buffer at all; every other case passes a poisoned one. */
	void *rb = c->rank != root && c->salt % 2 ? NULL : out.p;
	CALL(c, khor_reduce(c->comm, inplace ? out.p : in.p, rb, count, dt, op, root));
	for (size_t i = 0; i < count && c->rank == root; i++)
		if (!is(out.p, dt, i, rref(c->n, i, op, c->salt, dt)))
			FAIL(c, "[%zu] wrong (want %g)", i, rref(c->n, i, op, c->salt, dt));
	if (c->rank != root && !untouched(&out, 0, count * esz))
		FAIL(c, "a non-root's receive buffer was written");
	if (!guards_ok(&out) || !guards_ok(&in))
		FAIL(c, "wrote outside the buffer");
	free(in.base);
	free(out.base);
	return true;
}

static bool case_reduce_scatter(struct ctx *c, khor_dtype dt, khor_op op, size_t count)
{
	size_t esz = khor_dtype_size(dt), n = (size_t)c->n, r = (size_t)c->rank;
	size_t len = count / n + (r < count % n ? 1 : 0);
	size_t off = count / n * r + (r < count % n ? r : count % n);
	int mode = (int)(c->salt % 3); /* 0: separate, 1: recvbuf == sendbuf, 2: own block */
	gbuf in = galloc(count * esz), out = galloc(len * esz);
	uint8_t *rb = mode == 0 ? out.p : mode == 1 ? in.p : in.p + off * esz;

	snprintf(c->where, sizeof(c->where), "reduce_scatter dt %d op %d count %zu mode %d", dt,
	         op, count, mode);
	for (size_t i = 0; i < count; i++)
		put(in.p, dt, i, rin(c->rank, i, op, c->salt, dt));
	CALL(c, khor_reduce_scatter(c->comm, in.p, rb, count, dt, op));
	for (size_t i = 0; i < len; i++)
		if (!is(rb, dt, i, rref(c->n, off + i, op, c->salt, dt)))
			FAIL(c, "[%zu] of block at %zu wrong (want %g)", i, off,
			     rref(c->n, off + i, op, c->salt, dt));
	if (mode == 0 && !guards_ok(&out))
		FAIL(c, "wrote outside the receive buffer");
	if (!guards_ok(&in))
		FAIL(c, "wrote outside the send buffer");
	free(in.base);
	free(out.base);
	return true;
}

/*
 * allgatherv with counts[i] elements of rank i at displs[i]; displs NULL = packed. `gaps`
 * spreads the blocks out: the space between them must stay poisoned.
 */
static bool check_allgather(struct ctx *c, khor_dtype dt, const size_t *counts,
                            const size_t *displs, const gbuf *out)
{
	size_t esz = khor_dtype_size(dt), pos = 0;

	for (int j = 0; j < c->n; j++) {
		size_t d = displs != NULL ? displs[j] : pos;
		if (!untouched(out, pos * esz, (d - pos) * esz))
			FAIL(c, "wrote into the gap before block %d", j);
		for (size_t i = 0; i < counts[j]; i++)
			if (!is(out->p, dt, d + i, mval(j, i, c->salt)))
				FAIL(c, "block %d [%zu] wrong", j, i);
		pos = d + counts[j];
	}
	if (!untouched(out, pos * esz, out->len - pos * esz) || !guards_ok(out))
		FAIL(c, "wrote past the last block");
	return true;
}

static bool case_allgather(struct ctx *c, khor_dtype dt, size_t count)
{
	size_t esz = khor_dtype_size(dt), n = (size_t)c->n, counts[HARNESS_MAX_RANKS];
	bool inplace = c->salt % 2 == 0;
	gbuf in = galloc(count * esz), out = galloc(n * count * esz);
	uint8_t *sb = inplace ? out.p + (size_t)c->rank * count * esz : in.p;

	snprintf(c->where, sizeof(c->where), "allgather dt %d count %zu%s", dt, count,
	         inplace ? " in place" : "");
	for (size_t i = 0; i < count; i++)
		put(sb, dt, i, mval(c->rank, i, c->salt));
	CALL(c, khor_allgather(c->comm, sb, out.p, count, dt));
	for (size_t j = 0; j < n; j++)
		counts[j] = count;
	bool ok = check_allgather(c, dt, counts, NULL, &out) && guards_ok(&in);
	free(in.base);
	free(out.base);
	return ok;
}

static bool case_allgatherv(struct ctx *c, khor_dtype dt, bool gaps)
{
	size_t esz = khor_dtype_size(dt), counts[HARNESS_MAX_RANKS], displs[HARNESS_MAX_RANKS];
	size_t total = 0, r = (size_t)c->rank;
	uint64_t s = 0x9e3779b97f4a7c15ull + c->salt;

	for (int j = 0; j < c->n; j++) {
		uint32_t k = rnd(&s);
		total += gaps ? k % 5 : 0;
		counts[j] = k % 4 == 0 ? 0 : (k >> 8) % (k % 3 == 0 ? 700 : 40);
		displs[j] = total;
		total += counts[j];
	}
	total += gaps ? 3 : 0;
	gbuf in = galloc(counts[r] * esz), out = galloc(total * esz);
	snprintf(c->where, sizeof(c->where), "allgatherv dt %d mine %zu total %zu%s", dt,
	         counts[r], total, gaps ? " with gaps" : "");
	for (size_t i = 0; i < counts[r]; i++)
		put(in.p, dt, i, mval(c->rank, i, c->salt));
	CALL(c, khor_allgatherv(c->comm, in.p, counts[r], out.p, counts, gaps ? displs : NULL, dt));
	bool ok = check_allgather(c, dt, counts, gaps ? displs : NULL, &out) && guards_ok(&in);
	free(in.base);
	free(out.base);
	return ok;
}

/* alltoall(v): rank i sends m[i][j] elements to rank j, valued mval(i * n + j, k). */
static bool case_alltoallv(struct ctx *c, khor_dtype dt, size_t count, bool v, bool gaps)
{
	size_t esz = khor_dtype_size(dt), n = (size_t)c->n, r = (size_t)c->rank;
	size_t m[HARNESS_MAX_RANKS][HARNESS_MAX_RANKS], sc[HARNESS_MAX_RANKS];
	size_t sd[HARNESS_MAX_RANKS], rc[HARNESS_MAX_RANKS], rd[HARNESS_MAX_RANKS];
	size_t stotal = 0, rtotal = 0;
	uint64_t s = 0x243f6a8885a308d3ull + c->salt;
	bool inplace = !v && c->salt % 2 == 1;

	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++) {
			uint32_t k = rnd(&s);
			m[i][j] = !v ? count : k % 3 == 0 ? 0 : (k >> 8) % 300;
		}
	for (size_t j = 0; j < n; j++) {
		sc[j] = m[r][j];
		rc[j] = m[j][r];
		stotal += gaps ? j % 3 : 0;
		rtotal += gaps ? (j + 1) % 2 : 0;
		sd[j] = stotal;
		rd[j] = rtotal;
		stotal += sc[j];
		rtotal += rc[j];
	}
	gbuf in = galloc(stotal * esz), out = galloc(rtotal * esz);
	uint8_t *sb = inplace ? out.p : in.p;
	snprintf(c->where, sizeof(c->where), "alltoall%s dt %d count %zu%s%s", v ? "v" : "", dt,
	         count, gaps ? " with gaps" : "", inplace ? " in place" : "");
	for (size_t j = 0; j < n; j++)
		for (size_t k = 0; k < sc[j]; k++)
			put(sb, dt, sd[j] + k, mval((int)(r * n + j), k, c->salt));
	if (v)
		CALL(c, khor_alltoallv(c->comm, sb, sc, gaps ? sd : NULL, out.p, rc,
		                       gaps ? rd : NULL, dt));
	else
		CALL(c, khor_alltoall(c->comm, sb, out.p, count, dt));
	size_t pos = 0;
	for (size_t j = 0; j < n; j++) {
		if (!untouched(&out, pos * esz, (rd[j] - pos) * esz))
			FAIL(c, "wrote into the gap before block %zu", j);
		for (size_t k = 0; k < rc[j]; k++)
			if (!is(out.p, dt, rd[j] + k, mval((int)(j * n + r), k, c->salt)))
				FAIL(c, "block from %zu [%zu] wrong", j, k);
		pos = rd[j] + rc[j];
	}
	if (!guards_ok(&out) || !guards_ok(&in))
		FAIL(c, "wrote outside the buffers");
	free(in.base);
	free(out.base);
	return true;
}

static bool case_gather(struct ctx *c, khor_dtype dt, size_t count)
{
	size_t esz = khor_dtype_size(dt), n = (size_t)c->n;
	int root = (int)((c->salt / 2) % n);
	bool inplace = c->rank == root && c->salt % 4 == 1;
	gbuf in = galloc(count * esz), out = galloc(n * count * esz);
	uint8_t *sb = inplace ? out.p + (size_t)root * count * esz : in.p;

	snprintf(c->where, sizeof(c->where), "gather dt %d count %zu root %d%s", dt, count, root,
	         inplace ? " in place" : "");
	for (size_t i = 0; i < count; i++)
		put(sb, dt, i, mval(c->rank, i, c->salt));
	void *rb = c->rank != root && c->salt % 2 ? NULL : out.p;
	CALL(c, khor_gather(c->comm, sb, rb, count, dt, root));
	if (c->rank == root) {
		size_t counts[HARNESS_MAX_RANKS];
		for (size_t j = 0; j < n; j++)
			counts[j] = count;
		if (!check_allgather(c, dt, counts, NULL, &out))
			return false;
	} else if (!untouched(&out, 0, out.len) || !guards_ok(&out)) {
		FAIL(c, "a non-root's receive buffer was written");
	}
	if (!guards_ok(&in))
		FAIL(c, "wrote into the send buffer's guards");
	free(in.base);
	free(out.base);
	return true;
}

static bool case_scatter(struct ctx *c, khor_dtype dt, size_t count)
{
	size_t esz = khor_dtype_size(dt), n = (size_t)c->n;
	int root = (int)((c->salt / 3) % n);
	bool inplace = c->rank == root && c->salt % 4 == 2;
	gbuf in = galloc(n * count * esz), out = galloc(count * esz);
	uint8_t *rb = inplace ? in.p + (size_t)root * count * esz : out.p;

	snprintf(c->where, sizeof(c->where), "scatter dt %d count %zu root %d%s", dt, count, root,
	         inplace ? " in place" : "");
	for (size_t j = 0; j < n && c->rank == root; j++)
		for (size_t i = 0; i < count; i++)
			put(in.p, dt, j * count + i, mval((int)j, i, c->salt));
	/* Non-roots pass no send buffer: it must not be read. */
	CALL(c, khor_scatter(c->comm, c->rank == root ? in.p : NULL, rb, count, dt, root));
	for (size_t i = 0; i < count; i++)
		if (!is(rb, dt, i, mval(c->rank, i, c->salt)))
			FAIL(c, "[%zu] wrong", i);
	if (!guards_ok(&in) || !guards_ok(&out))
		FAIL(c, "wrote outside the buffers");
	free(in.base);
	free(out.base);
	return true;
}

static bool case_broadcast(struct ctx *c, khor_dtype dt, size_t count)
{
	size_t esz = khor_dtype_size(dt);
	int root = (int)((c->salt / 5) % (unsigned)c->n);
	gbuf b = galloc(count * esz);

	snprintf(c->where, sizeof(c->where), "broadcast dt %d count %zu root %d", dt, count, root);
	for (size_t i = 0; i < count && c->rank == root; i++)
		put(b.p, dt, i, mval(root, i, c->salt));
	CALL(c, khor_broadcast(c->comm, b.p, count, dt, root));
	for (size_t i = 0; i < count; i++)
		if (!is(b.p, dt, i, mval(root, i, c->salt)))
			FAIL(c, "[%zu] wrong", i);
	if (!guards_ok(&b))
		FAIL(c, "wrote outside the buffer");
	free(b.base);
	return true;
}

struct job {
	const char *slice, *depth, *nsocks, *stripe, *rd_max;
};

static int body_all(int rank, int n, khor_config *cfg, void *arg)
{
	const struct job *j = arg;
	char err[1024];
	struct ctx c = { .rank = rank, .n = n, .salt = 1 };
	size_t counts[] = { 0, 1, (size_t)(n > 2 ? n - 1 : 2), 13, 97, 1031 };

	khor_config_set(cfg, "KHOR_SLICE_BYTES", j->slice);
	khor_config_set(cfg, "KHOR_PIPELINE_DEPTH", j->depth);
	khor_config_set(cfg, "KHOR_SOCKET_NSOCKS", j->nsocks);
	khor_config_set(cfg, "KHOR_MIN_STRIPE", j->stripe);
	khor_config_set(cfg, "KHOR_RD_MAX_BYTES", j->rd_max);
	if (khor_init(cfg, err, sizeof(err), &c.comm) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: init: %s\n", rank, err);
		return 10;
	}
	for (size_t d = 0; d < NDTYPES; d++) {
		khor_dtype dt = dtypes[d];
		if (khor_dtype_size(dt) == 0)
			continue;
		for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
			size_t count = counts[k];
			for (size_t o = 0; o < NOPS; o++) {
				if (!reduce_supported(dt, ops[o]))
					continue;
				c.salt++;
				if (!case_reduce(&c, dt, ops[o], count))
					return 20;
				if (!case_reduce_scatter(&c, dt, ops[o], count))
					return 21;
				if (!case_reduce_scatter(&c, dt, ops[o], count * (size_t)n))
					return 22;
			}
			c.salt++;
			if (!case_allgather(&c, dt, count) || !case_alltoallv(&c, dt, count, false, false))
				return 23;
			if (!case_gather(&c, dt, count) || !case_scatter(&c, dt, count))
				return 24;
			if (!case_broadcast(&c, dt, count))
				return 25;
		}
		for (int g = 0; g < 2; g++) {
			c.salt++;
			if (!case_allgatherv(&c, dt, g) || !case_alltoallv(&c, dt, 0, true, g))
				return 26;
		}
	}
	/* One larger case each, so that the default-sized slices pipeline too. */
	c.salt++;
	if (!case_reduce_scatter(&c, KHOR_FLOAT32, KHOR_SUM, 300007) ||
	    !case_reduce(&c, KHOR_INT32, KHOR_MAX, 200003) ||
	    !case_allgather(&c, KHOR_FLOAT64, 40009) || !case_broadcast(&c, KHOR_INT64, 150001))
		return 27;
	if (khor_barrier(c.comm) != KHOR_SUCCESS)
		return 28;
	khor_finalize(c.comm);
	return 0;
}

static void run_all(int n, struct job *j)
{
	harness_opts o = { .n = n, .timeout = "30s", .deadline_s = 150 };
	harness_result res;
	bool ok = harness_run(&o, body_all, j, &res);

	for (int r = 0; r < n; r++)
		cr_expect_eq(res.status[r], 0, "n=%d slice=%s rd_max=%s: rank %d exited %d", n,
		             j->slice, j->rd_max, r, res.status[r]);
	cr_assert(ok && !res.timed_out, "n=%d slice=%s failed", n, j->slice);
}

/* Tiny slices, 2 sockets: binomial broadcast and Bruck allgather for every size. */
#define N_TEST(N)                                                                          \
	Test(collectives, small_slices_tree_n##N, .timeout = 200)                          \
	{                                                                                  \
		struct job j = { "256", "3", "2", "64", "1G" };                            \
		run_all(N, &j);                                                            \
	}                                                                                  \
	Test(collectives, one_socket_ring_chain_n##N, .timeout = 200)                      \
	{                                                                                  \
		struct job j = { "1K", "2", "1", "64", "0" };                              \
		run_all(N, &j);                                                            \
	}

N_TEST(1)
N_TEST(2)
N_TEST(3)
N_TEST(4)
N_TEST(5)
N_TEST(7)
N_TEST(8)

/*
 * Default slices (512K) with messages of megabytes on one socket: sends stall until the
 * peer has posted its receive, so a schedule that orders its frames badly hangs here.
 */
static int body_large(int rank, int n, khor_config *cfg, void *arg)
{
	char err[1024];
	struct ctx c = { .rank = rank, .n = n, .salt = 7 };

	khor_config_set(cfg, "KHOR_SOCKET_NSOCKS", "1");
	khor_config_set(cfg, "KHOR_RD_MAX_BYTES", arg != NULL ? "1G" : "0");
	if (khor_init(cfg, err, sizeof(err), &c.comm) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: init: %s\n", rank, err); /* a flake says why */
		return 10;
	}
	for (; c.salt < 8; c.salt++) {
		if (!case_reduce_scatter(&c, KHOR_FLOAT32, KHOR_SUM, 3000017) ||
		    !case_reduce(&c, KHOR_FLOAT64, KHOR_MIN, 1000003))
			return 20;
		if (!case_allgather(&c, KHOR_INT32, 400009) ||
		    !case_alltoallv(&c, KHOR_INT32, 300007, false, false))
			return 21;
		if (!case_gather(&c, KHOR_FLOAT32, 300007) || !case_scatter(&c, KHOR_FLOAT32, 300007) ||
		    !case_broadcast(&c, KHOR_UINT8, 4000037))
			return 22;
	}
	khor_finalize(c.comm);
	return 0;
}

Test(collectives, large_messages_one_socket, .timeout = 200)
{
	for (int n = 4; n <= 5; n++) {
		for (int tree = 0; tree < 2; tree++) {
			harness_opts o = { .n = n, .timeout = "30s", .deadline_s = 90 };
			harness_result res;
			bool ok = harness_run(&o, body_large, tree ? &o : NULL, &res);
			for (int r = 0; r < n; r++)
				cr_expect_eq(res.status[r], 0, "n=%d tree=%d: rank %d exited %d", n, tree, r,
				             res.status[r]);
			cr_assert(ok && !res.timed_out, "n=%d tree=%d failed", n, tree);
		}
	}
}

/*
 * Random floats: the reductions must give the same bits on every rank (what every rank
 * holds after reduce_scatter + allgather) and from run to run (reduce at every root too).
 */
struct bits {
	uint64_t h[2][HARNESS_MAX_RANKS][4]; /* [dtype][rank][what] */
};

static int body_bits(int rank, int n, khor_config *cfg, void *arg)
{
	struct bits *b = arg;
	char err[1024];
	khor_comm *comm;
	size_t count = 50021;

	khor_config_set(cfg, "KHOR_SLICE_BYTES", "4K");
	/*
	 * Pin the cost model: measured at init it may differ between the two runs and pick
	 * another schedule near a crossover, and another schedule means another order of sums.
	 */
	khor_config_set(cfg, "KHOR_COST_ALPHA_US", "20");
	khor_config_set(cfg, "KHOR_COST_BETA_GBPS", "1");
	khor_config_set(cfg, "KHOR_COST_GAMMA_GBPS", "10");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: init: %s\n", rank, err); /* a flake says why */
		return 10;
	}
	for (int d = 0; d < 2; d++) {
		khor_dtype dt = d == 0 ? KHOR_FLOAT32 : KHOR_FLOAT64;
		size_t esz = khor_dtype_size(dt), r = (size_t)rank, nn = (size_t)n;
		size_t len = count / nn + (r < count % nn ? 1 : 0);
		size_t off = count / nn * r + (r < count % nn ? r : count % nn);
		uint8_t *in = malloc(count * esz), *out = malloc(count * esz);
		size_t *counts = malloc(nn * sizeof(size_t));
		srand(99u + (unsigned)rank);
		for (size_t i = 0; i < count; i++)
			put(in, dt, i, (double)rand() / RAND_MAX * 2.0 - 1.0);
		for (size_t j = 0; j < nn; j++)
			counts[j] = count / nn + (j < count % nn ? 1 : 0);
		if (khor_reduce_scatter(comm, in, out + off * esz, count, dt, KHOR_SUM) != KHOR_SUCCESS ||
		    khor_allgatherv(comm, out + off * esz, len, out, counts, NULL, dt) != KHOR_SUCCESS)
			return 11;
		b->h[d][rank][0] = harness_hash(out, count * esz);
		for (int root = 0; root < n; root++) {
			if (khor_reduce(comm, in, out, count, dt, KHOR_AVG, root) != KHOR_SUCCESS)
				return 12;
			if (rank == root)
				b->h[d][rank][1] = harness_hash(out, count * esz);
		}
		free(in);
		free(out);
		free(counts);
	}
	khor_finalize(comm);
	return 0;
}

Test(collectives, identical_bits_across_ranks_and_runs, .timeout = 120)
{
	for (int n = 3; n <= 8; n += 5) {
		struct bits *b1 = harness_shared(sizeof(struct bits));
		struct bits *b2 = harness_shared(sizeof(struct bits));
		harness_opts o = { .n = n, .deadline_s = 60 };
		harness_result res;
		cr_assert(harness_run(&o, body_bits, b1, &res), "n=%d: first run failed", n);
		cr_assert(harness_run(&o, body_bits, b2, &res), "n=%d: second run failed", n);
		for (int d = 0; d < 2; d++) {
			for (int r = 0; r < n; r++) {
				cr_expect_eq(b1->h[d][r][0], b1->h[d][0][0], "n=%d dtype %d: reduce_scatter "
				             "result on rank %d differs from rank 0", n, d, r);
				cr_expect_eq(b1->h[d][r][0], b2->h[d][r][0], "n=%d dtype %d: reduce_scatter "
				             "result on rank %d differs between runs", n, d, r);
				cr_expect_eq(b1->h[d][r][1], b2->h[d][r][1], "n=%d dtype %d: reduce to root "
				             "%d differs between runs", n, d, r);
			}
		}
		harness_shared_free(b1, sizeof(struct bits));
		harness_shared_free(b2, sizeof(struct bits));
	}
}

/* Ranks that disagree on count get an error: not a hang, not a write past their buffer. */
enum { MM_ALLGATHER_RING, MM_ALLGATHER_BRUCK, MM_ALLTOALL, MM_GATHER, MM_SCATTER };

struct mm_case {
	int kind, n, root, odd; /* rank odd has 40 elements, the others 32 */
	unsigned must_fail;     /* ranks that receive from a rank that disagrees (bit per rank) */
};

static int body_mismatch(int rank, int n, khor_config *cfg, void *arg)
{
	const struct mm_case *mc = arg;
	char err[1024];
	khor_comm *comm;
	size_t count = rank == mc->odd ? 40 : 32;
	gbuf in = galloc((size_t)n * count * 4), out = galloc((size_t)n * count * 4);
	khor_status st;

	khor_config_set(cfg, "KHOR_RD_MAX_BYTES", mc->kind == MM_ALLGATHER_BRUCK ? "1G" : "0");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		fprintf(stderr, "rank %d: init: %s\n", rank, err); /* a flake says why */
		return 10;
	}
	if (mc->kind == MM_ALLTOALL)
		st = khor_alltoall(comm, in.p, out.p, count, KHOR_FLOAT32);
	else if (mc->kind == MM_GATHER)
		st = khor_gather(comm, in.p, out.p, count, KHOR_FLOAT32, mc->root);
	else if (mc->kind == MM_SCATTER)
		st = khor_scatter(comm, in.p, out.p, count, KHOR_FLOAT32, mc->root);
	else
		st = khor_allgather(comm, in.p, out.p, count, KHOR_FLOAT32);
	if (!guards_ok(&out) || !guards_ok(&in))
		return 22;
	/*
	 * Gather and scatter move data one way: a rank that only sends, or only talks to ranks
	 * that agree with it, may finish.
	 */
	if (st == KHOR_SUCCESS)
		return mc->must_fail & (1u << rank) ? 20 : 0;
	if (st == KHOR_ERR_TIMEOUT)
		return 21; /* must be detected, not waited out */
	fprintf(stderr, "mismatch %d (n %d, root %d): rank %d saw: %s\n", mc->kind, n, mc->root,
	        rank, khor_comm_error(comm));
	khor_finalize(comm);
	return 0;
}

Test(collectives, count_mismatch_is_an_error, .timeout = 180)
{
	/*
	 * At 4 ranks with root 1 the edge from rank 3 (relative 2, subtree {3, 0}) to the root
	 * wraps past the last block: the one edge that carries two messages.
	 */
	static const struct mm_case cases[] = {
		{ MM_ALLGATHER_RING, 3, 0, 1, 7 }, { MM_ALLGATHER_BRUCK, 3, 0, 1, 7 },
		{ MM_ALLTOALL, 3, 0, 1, 7 },       { MM_GATHER, 3, 0, 1, 1 << 0 },
		{ MM_SCATTER, 3, 0, 1, 1 << 1 },   { MM_GATHER, 4, 1, 3, (1 << 1) | (1 << 3) },
		{ MM_SCATTER, 4, 1, 3, (1 << 3) | (1 << 0) },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct mm_case *mc = &cases[i];
		harness_opts o = { .n = mc->n, .timeout = "20s", .deadline_s = 40 };
		harness_result res;
		harness_run(&o, body_mismatch, (void *)mc, &res);
		cr_expect(!res.timed_out, "mismatch case %zu hung", i);
		for (int r = 0; r < mc->n; r++)
			cr_expect_eq(res.status[r], 0, "mismatch case %zu (kind %d, n %d, root %d): "
			             "rank %d exited %d", i, mc->kind, mc->n, mc->root, r, res.status[r]);
	}
}
