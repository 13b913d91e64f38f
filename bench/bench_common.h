/*
 * bench_common.h -- the body of khor-bench and of its OpenMPI peer, mpi-bench.
 *
 * Both programs must print exactly the same columns, parse exactly the same flags and check
 * results the same way, or comparing them means nothing. So everything but the library calls
 * lives here: flag parsing (nccl-tests' flags), the table of collectives with nccl-tests'
 * size conventions and bus-bandwidth factors, the data patterns and their checks, the timed
 * sweep, progress lines and the table, CSV and JSON output. A program supplies a
 * bench_backend (its rank, size and collectives) and calls bench_run(). The gloo peer
 * (peers/gloo_bench.py) cannot include C; it follows the same rules and prints the same
 * columns, so a change to the patterns or the columns here must be made there too.
 *
 * This header includes neither khor.h nor mpi.h: khor-bench may use only khor's public API
 * and mpi-bench must never see khor at all. Every function is static inline so that a
 * program that does not use one does not trip -Wunused-function under -Werror. Programs
 * define _POSIX_C_SOURCE 200809L (clock_gettime, posix_memalign) before any include.
 *
 * Sizes follow nccl-tests: "size" is the bytes of the largest buffer of one rank, so for
 * allgather and gather it is the gathered result, for reducescatter and scatter the full
 * input, for alltoall each rank's whole send buffer. algbw = size / time and
 * busbw = algbw x factor (allreduce 2(n-1)/n; allgather, reducescatter, alltoall, gather,
 * scatter (n-1)/n; broadcast and reduce 1), so busbw compares with the link speed whatever
 * the collective.
 *
 * Output, on rank 0 only (nccl-tests' layout):
 *
 *   # khor-bench allreduce: 4 ranks, dtype float, op sum, iters 20, warmup 5, check 1
 *   # library: khor 0.1.0 (transport auto, algo auto)
 *   #
 *   #       size         count      type   redop     time   algbw   busbw  #wrong
 *   #        (B)    (elements)                       (us)  (GB/s)  (GB/s)
 *              8             2     float     sum    41.20    0.00    0.00       0
 *   ...
 *   # Out of bounds values : 0 OK
 *   # Avg bus bandwidth    : 1.234
 *
 * Several comms at once (khor-bench --comms 1,2): bench_run_comms() runs each size on K comms
 * over the same ranks, one thread each, for every K of the list in turn, and prints a row per
 * size and K with each comm's time and busbw and their sum. It needs the backend's dup and
 * free_comm, and pthreads; a program that never calls it needs neither.
 *
 * Device buffers (khor-bench --mem cuda|both): a program may give bench_run() memory kinds
 * other than host memory (struct bench_mem). The patterns are still written and checked by
 * the CPU, in host copies of the buffers, moved to and from the device outside the timed
 * calls. With two kinds (host and cuda) each size is timed on both, interleaved in rounds as
 * the algorithms of --algo a,b are, and the row shows both and the ratio of their busbw. A
 * run on host memory alone prints what it always did; the mem column of the CSV and JSON is
 * there only when a run has device buffers.
 */
#ifndef KHOR_BENCH_COMMON_H
#define KHOR_BENCH_COMMON_H

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The benchmark's own dtype and op names; each backend maps them onto its library's. */
enum bench_dtype {
	BENCH_F32, BENCH_F64, BENCH_I32, BENCH_I64, BENCH_F16, BENCH_BF16, BENCH_I8, BENCH_U8,
	BENCH_I16
};
#define BENCH_NDTYPES 9
enum bench_op { BENCH_SUM, BENCH_AVG, BENCH_MIN, BENCH_MAX, BENCH_PROD };
#define BENCH_MAX_ALGOS 8
/* In comparison mode the timed calls run in this many rounds, each algorithm in turn. */
#define BENCH_ROUNDS 5
#define BENCH_MAX_MEMS 2

/*
 * A kind of memory other than the host's, for the buffers the collectives get (a program's
 * device memory). The benchmark never touches it directly: it fills and checks host copies
 * and moves them with put and get, which return when the copy is done. alloc returns NULL,
 * and put and get -1, with the reason written to why (len bytes). Called from any of the
 * benchmark's threads (--comms), so each op makes whatever state it needs current itself.
 */
struct bench_mem {
	const char *name;  /* "cuda": the mem column and the table's column names */
	const char *where; /* the header's words for it: "cuda device 0 of 1 (NVIDIA H200)" */
	void *ctx;
	void *(*alloc)(const struct bench_mem *m, size_t bytes, char *why, size_t len);
	void (*free)(const struct bench_mem *m, void *p);
	int (*put)(const struct bench_mem *m, void *dst, const void *src, size_t bytes, char *why,
	           size_t len);
	int (*get)(const struct bench_mem *m, void *dst, const void *src, size_t bytes, char *why,
	           size_t len);
};

/*
 * What a program gives bench_run(). Each collective returns 0 on success and -1 on failure,
 * after which error() returns text that says why (khor_comm_error, MPI_Error_string). A
 * library that lacks a collective leaves its pointer NULL and bench_run() says so. Counts
 * are in elements and mean what khor.h says for the khor call of the same name.
 */
struct bench_backend {
	const char *prog;      /* "khor-bench": the header's first word */
	const char *library;   /* "khor 0.1.0", printed in the header */
	const char *transport; /* as asked for: "auto", "shm"; MPI: "ob1/tcp,self" */
	const char *algo;      /* the algorithm asked for: "auto", "ring", "default" */
	/*
	 * Comparison mode (khor-bench --algo ring,tree,auto): nalgos > 1 algorithms, switched
	 * with set_algo on every rank between calls. nalgos 0 or 1: one algorithm, as algo says.
	 */
	int nalgos;
	const char *algos[BENCH_MAX_ALGOS];
	int (*set_algo)(struct bench_backend *b, const char *algo);
	int rank;
	int size;
	void *ctx;
	int (*allreduce)(struct bench_backend *b, const void *sendbuf, void *recvbuf,
	                 size_t count, enum bench_dtype dtype, enum bench_op op);
	int (*broadcast)(struct bench_backend *b, void *buf, size_t count,
	                 enum bench_dtype dtype, int root);
	int (*barrier)(struct bench_backend *b);
	int (*reduce)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	              enum bench_dtype dtype, enum bench_op op, int root);
	/* count: elements each rank contributes */
	int (*allgather)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	                 enum bench_dtype dtype);
	/* count: the whole input; rank r gets count/n elements, one more when r < count%n */
	int (*reduce_scatter)(struct bench_backend *b, const void *sendbuf, void *recvbuf,
	                      size_t count, enum bench_dtype dtype, enum bench_op op);
	/* count: elements per block, n blocks each way */
	int (*alltoall)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	                enum bench_dtype dtype);
	int (*gather)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	              enum bench_dtype dtype, int root);
	int (*scatter)(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
	               enum bench_dtype dtype, int root);
	const char *(*error)(struct bench_backend *b);
	/*
	 * Several comms at once (bench_run_comms), NULL in a program without that mode. dup is a
	 * collective on b: every rank calls it, and each gets in *out a copy of b for a new comm
	 * over the same ranks, with its own ctx and, in prog, a label naming that comm (index is
	 * its place among the comms of the run; -1 for one made only to be timed). On failure it
	 * returns -1 and b's error() says why. free_comm undoes dup; as the comm and its error
	 * text go with it, it says why itself on stderr when it fails. The output names the two
	 * calls dup_name and free_name.
	 */
	int (*dup)(struct bench_backend *b, int index, struct bench_backend *out);
	int (*free_comm)(struct bench_backend *b);
	const char *dup_name;  /* "khor_comm_split" */
	const char *free_name; /* "khor_comm_free" */
	/* Set by bench_run_comms while a thread of its own drives this backend; else NULL. */
	struct bench_thread *thread;
	/*
	 * Where the buffers live: nmems kinds, a NULL entry for host memory; nmems 0 is host
	 * memory alone. Two kinds are timed side by side (bench_run only, one algorithm).
	 */
	int nmems;
	const struct bench_mem *mems[BENCH_MAX_MEMS];
};

/* -c: nccl-tests' 0 and 1, and "all" (--check): every iteration, warm-up included. */
enum bench_check { BENCH_CHECK_NONE = 0, BENCH_CHECK_ONCE = 1, BENCH_CHECK_ALL = 2 };

struct bench_args {
	const struct bench_coll *coll;
	size_t minbytes;
	size_t maxbytes;
	size_t stepfactor; /* used when stepbytes is 0 */
	size_t stepbytes;
	int iters;
	int warmup;
	enum bench_check check;
	enum bench_dtype dtype;
	enum bench_op op;
	int root;
	int quiet;          /* no table on stdout (CSV or JSON only) */
	double progress_s;  /* a progress line once a size has run this long; 0: never */
	size_t offset;      /* buffers start this many bytes past a page boundary */
	const char *csv;
	const char *json;
};

/*
 * The element counts of one row. total is nccl-tests' count (size / element size, rounded
 * down to what the collective can split evenly); param is the count the library call takes;
 * send and recv are the elements each rank's buffers hold.
 */
struct bench_shape {
	size_t total;
	size_t param;
	size_t send;
	size_t recv;
};

/*
 * One collective of the sweep. shape() turns a total element count into the call's counts;
 * fill() writes the inputs of a checked iteration and a sentinel over the outputs, check()
 * counts wrong output elements on this rank, run() is one call of the collective.
 */
#define BENCH_USES_OP 1u   /* the header and rows print the op */
#define BENCH_USES_ROOT 2u /* -r applies */
#define BENCH_NO_DATA 4u   /* barrier: one row, no sizes, no data */

struct bench_coll {
	const char *name;
	unsigned flags;
	int (*available)(const struct bench_backend *b); /* does the library have it? */
	double (*busbw_factor)(int nranks);
	void (*shape)(size_t total, int nranks, struct bench_shape *s);
	int (*run)(struct bench_backend *b, const struct bench_args *a, const struct bench_shape *s,
	           void *sendbuf, void *recvbuf);
	void (*fill)(const struct bench_backend *b, const struct bench_args *a,
	             const struct bench_shape *s, void *sendbuf, void *recvbuf);
	int64_t (*check)(const struct bench_backend *b, const struct bench_args *a,
	                 const struct bench_shape *s, const void *recvbuf);
};

/* ---- dtypes and ops ----------------------------------------------------------------------- */

static const struct {
	const char *name; /* nccl-tests' name, printed in the type column */
	size_t size;
	double limit;     /* every integer 0..limit is exact in it; patterns stay within */
	double sentinel;  /* written over outputs; never a right answer */
} bench_dtypes[BENCH_NDTYPES] = {
	[BENCH_F32] = {"float", 4, 16777216.0, -12345.0},
	[BENCH_F64] = {"double", 8, 9007199254740992.0, -12345.0},
	[BENCH_I32] = {"int32", 4, 2147483647.0, -12345.0},
	[BENCH_I64] = {"int64", 8, 9007199254740992.0, -12345.0},
	[BENCH_F16] = {"half", 2, 2048.0, -12345.0},
	[BENCH_BF16] = {"bfloat16", 2, 256.0, -12345.0},
	[BENCH_I8] = {"int8", 1, 127.0, -128.0},
	[BENCH_U8] = {"uint8", 1, 254.0, 255.0}, /* 255 is kept for the sentinel */
	[BENCH_I16] = {"int16", 2, 32767.0, -12345.0}, /* not in nccl-tests, named like int8 */
};

static inline size_t bench_dtype_size(enum bench_dtype d)
{
	return bench_dtypes[d].size;
}

static inline const char *bench_dtype_name(enum bench_dtype d)
{
	return bench_dtypes[d].name;
}

static inline const char *bench_op_name(enum bench_op op)
{
	static const char *const names[] = {"sum", "avg", "min", "max", "prod"};
	return names[op];
}

static inline int bench_is_float(enum bench_dtype d)
{
	return d == BENCH_F32 || d == BENCH_F64 || d == BENCH_F16 || d == BENCH_BF16;
}

static inline int bench_parse_dtype(const char *s, enum bench_dtype *out)
{
	static const struct { const char *name; enum bench_dtype d; } map[] = {
		{"float", BENCH_F32}, {"float32", BENCH_F32}, {"f32", BENCH_F32},
		{"double", BENCH_F64}, {"float64", BENCH_F64}, {"f64", BENCH_F64},
		{"int32", BENCH_I32}, {"i32", BENCH_I32}, {"int", BENCH_I32},
		{"int64", BENCH_I64}, {"i64", BENCH_I64},
		{"half", BENCH_F16}, {"float16", BENCH_F16}, {"fp16", BENCH_F16}, {"f16", BENCH_F16},
		{"bfloat16", BENCH_BF16}, {"bf16", BENCH_BF16},
		{"int8", BENCH_I8}, {"i8", BENCH_I8}, {"char", BENCH_I8},
		{"uint8", BENCH_U8}, {"u8", BENCH_U8},
		{"int16", BENCH_I16}, {"i16", BENCH_I16}, {"short", BENCH_I16},
	};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
		if (strcmp(s, map[i].name) == 0) {
			*out = map[i].d;
			return 0;
		}
	}
	return -1;
}

static inline int bench_parse_op(const char *s, enum bench_op *out)
{
	for (int op = BENCH_SUM; op <= BENCH_PROD; op++) {
		if (strcmp(s, bench_op_name((enum bench_op)op)) == 0) {
			*out = (enum bench_op)op;
			return 0;
		}
	}
	return -1;
}

/*
 * IEEE half and bfloat16 by hand, rounding to nearest even: C11 has neither type, and a
 * peer (mpi-bench) needs the same conversions for its own reduction of them.
 */
static inline uint16_t bench_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
	if (exp == 0xff)
		return sign | 0x7c00u | (man ? 0x200u : 0);
	int e = (int)exp - 127 + 15;
	if (e >= 31)
		return sign | 0x7c00u;
	if (e <= 0) { /* a half subnormal: value = h x 2^-24 */
		if (e < -10)
			return sign;
		man |= 0x800000u;
		unsigned shift = (unsigned)(14 - e);
		uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++; /* a carry into the exponent is the right rounding, up to infinity */
	return (uint16_t)(sign | h);
}

static inline float bench_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
	uint32_t x;
	if (exp == 0) {
		float v = (float)man * 5.9604644775390625e-8f; /* 2^-24 */
		return sign ? -v : v;
	}
	if (exp == 31)
		x = sign | 0x7f800000u | (man << 13);
	else
		x = sign | ((exp - 15 + 127) << 23) | (man << 13);
	float f;
	memcpy(&f, &x, sizeof f);
	return f;
}

static inline uint16_t bench_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* a quiet NaN stays a NaN */
	x += 0x7fffu + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

static inline float bench_bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;
	memcpy(&f, &x, sizeof f);
	return f;
}

/* All pattern values are small integers, so they convert to and from double exactly. */
static inline void bench_set(void *buf, enum bench_dtype d, size_t i, double v)
{
	switch (d) {
	case BENCH_F32: ((float *)buf)[i] = (float)v; break;
	case BENCH_F64: ((double *)buf)[i] = v; break;
	case BENCH_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case BENCH_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
	case BENCH_F16: ((uint16_t *)buf)[i] = bench_f32_to_f16((float)v); break;
	case BENCH_BF16: ((uint16_t *)buf)[i] = bench_f32_to_bf16((float)v); break;
	case BENCH_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
	case BENCH_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
	case BENCH_I16: ((int16_t *)buf)[i] = (int16_t)v; break;
	}
}

static inline double bench_get(const void *buf, enum bench_dtype d, size_t i)
{
	switch (d) {
	case BENCH_F32: return ((const float *)buf)[i];
	case BENCH_F64: return ((const double *)buf)[i];
	case BENCH_I32: return ((const int32_t *)buf)[i];
	case BENCH_I64: return (double)((const int64_t *)buf)[i];
	case BENCH_F16: return bench_f16_to_f32(((const uint16_t *)buf)[i]);
	case BENCH_BF16: return bench_bf16_to_f32(((const uint16_t *)buf)[i]);
	case BENCH_I8: return ((const int8_t *)buf)[i];
	case BENCH_U8: return ((const uint8_t *)buf)[i];
	case BENCH_I16: return ((const int16_t *)buf)[i];
	}
	return 0;
}

/* ---- data patterns ------------------------------------------------------------------------ */

/*
 * Every input, partial result and final result is a small integer within the dtype's exact
 * range (bench_dtypes[].limit), so a reduction is exact in any order and in any dtype, int8
 * and bfloat16 included. The period P of the index term shrinks with the dtype and the rank
 * count to keep the largest result within that range (1021 in float for n=4, 31 in int8):
 *
 *   sum, avg  rank r, index i: (i + r) % P + 1     never 0, so a missing rank always shows
 *   min, max  i % P + (i + r) % n
 *   prod      mostly 1; rank i%n gives i%7+2 and, when signed and n > 1, rank (i+1)%n -1
 *   moves     source s, index i: (i + 7s) % P     broadcast, allgather, alltoall, gather...
 */
#define BENCH_PERIOD 1021

static inline size_t bench_period(enum bench_op op, enum bench_dtype d, int n)
{
	double limit = bench_dtypes[d].limit, p;
	if (op == BENCH_MIN || op == BENCH_MAX)
		p = limit - n + 2;
	else
		p = limit / n; /* the sum is at most n x P */
	return p < 1 ? 1 : p > BENCH_PERIOD ? BENCH_PERIOD : (size_t)p;
}

static inline double bench_pattern(enum bench_op op, enum bench_dtype d, int rank, int n,
                                   size_t i)
{
	size_t p = bench_period(op, d, n);
	switch (op) {
	case BENCH_SUM:
	case BENCH_AVG:
		return (double)((i + (size_t)rank) % p + 1);
	case BENCH_MIN:
	case BENCH_MAX:
		return (double)(i % p + (i + (size_t)rank) % (size_t)n);
	case BENCH_PROD:
		if ((size_t)rank == i % (size_t)n)
			return (double)(i % 7 + 2);
		if (d != BENCH_U8 && n > 1 && (size_t)rank == (i + 1) % (size_t)n)
			return -1;
		return 1;
	}
	return 0;
}

/* sum over j < m of (k + j) % p, for k < p and m <= p, without a loop. */
static inline double bench_wrapped_sum(size_t k, size_t m, size_t p)
{
	if (k + m <= p)
		return (double)m * k + (double)m * (m - 1) / 2;
	size_t head = p - k, tail = m - head; /* k..p-1, then 0..tail-1 */
	return (double)head * (k + p - 1) / 2 + (double)tail * (tail - 1) / 2;
}

/* The exact reduced value of bench_pattern over n ranks at index i. */
static inline double bench_expected(enum bench_op op, enum bench_dtype d, int n, size_t i)
{
	size_t p = bench_period(op, d, n), k = i % p, q = (size_t)n / p, m = (size_t)n % p;
	double sum = n + (double)q * p * (p - 1) / 2 + bench_wrapped_sum(k, m, p);
	switch (op) {
	case BENCH_SUM: return sum;
	case BENCH_AVG:
		/* khor.h: integer avg is the sum divided by n, truncated toward zero. */
		if (!bench_is_float(d))
			return (double)((int64_t)sum / n);
		return sum / n;
	case BENCH_MIN: return (double)k;
	case BENCH_MAX: return (double)k + n - 1;
	case BENCH_PROD:
		return d != BENCH_U8 && n > 1 ? -(double)(i % 7 + 2) : (double)(i % 7 + 2);
	}
	return 0;
}

/* What a moving collective carries: element i of the block that source s owns. */
static inline double bench_value(enum bench_dtype d, size_t s, size_t i)
{
	double limit = bench_dtypes[d].limit;
	size_t p = limit + 1 < BENCH_PERIOD ? (size_t)limit + 1 : BENCH_PERIOD;
	return (double)((i + 7 * s) % p);
}

/*
 * Exact comparison, except avg in floating point: sum/n need not be representable, a library
 * may multiply by 1/n instead of dividing and a half result is rounded once more, so a few
 * ulps of difference are right.
 */
static inline int bench_mismatch(enum bench_op op, enum bench_dtype d, double got, double want)
{
	/* Written without libm so that neither program needs -lm. */
	if (op == BENCH_AVG && bench_is_float(d)) {
		double rel = d == BENCH_F32 ? 1e-6 : d == BENCH_F64 ? 1e-14
		           : d == BENCH_F16 ? 1.0 / 1024 : 1.0 / 128;
		double mag = want < 0 ? -want : want, diff = got - want;
		double tol = rel * (mag > 1.0 ? mag : 1.0);
		return !(diff <= tol && -diff <= tol); /* a NaN is a mismatch too */
	}
	return got != want;
}

static inline void bench_fill_sentinel(void *buf, enum bench_dtype d, size_t count)
{
	for (size_t i = 0; i < count; i++)
		bench_set(buf, d, i, bench_dtypes[d].sentinel);
}

/* Where rank r's block of a count-element reduce-scatter starts (khor.h's uneven split). */
static inline size_t bench_rs_offset(size_t count, int n, int r)
{
	size_t base = count / (size_t)n, extra = count % (size_t)n, rr = (size_t)r;
	return rr * base + (rr < extra ? rr : extra);
}

static inline size_t bench_rs_count(size_t count, int n, int r)
{
	return count / (size_t)n + ((size_t)r < count % (size_t)n ? 1 : 0);
}

/* ---- the collectives ---------------------------------------------------------------------- */

static inline double bench_factor_allreduce(int n)
{
	return n > 1 ? 2.0 * (n - 1) / n : 0.0;
}

static inline double bench_factor_spread(int n)
{
	return n > 1 ? (double)(n - 1) / n : 0.0;
}

static inline double bench_factor_one(int n)
{
	(void)n;
	return 1.0;
}

static inline double bench_factor_zero(int n)
{
	(void)n;
	return 0.0;
}

/* allreduce, reduce, broadcast: every buffer holds the whole count. */
static inline void bench_shape_same(size_t total, int n, struct bench_shape *s)
{
	(void)n;
	*s = (struct bench_shape){total, total, total, total};
}

/* allgather, gather: each rank sends total/n; the root (everyone) gets all of it. */
static inline void bench_shape_gather(size_t total, int n, struct bench_shape *s)
{
	size_t per = total / (size_t)n;
	*s = (struct bench_shape){per * n, per, per, per * n};
}

/* scatter: the root sends n blocks, each rank gets one. */
static inline void bench_shape_scatter(size_t total, int n, struct bench_shape *s)
{
	size_t per = total / (size_t)n;
	*s = (struct bench_shape){per * n, per, per * n, per};
}

/* reducescatter: uneven blocks, so no rounding: the buffer is exactly size bytes. */
static inline void bench_shape_rs(size_t total, int n, struct bench_shape *s)
{
	*s = (struct bench_shape){total, total, total, bench_rs_count(total, n, 0)};
}

/* alltoall: a whole buffer each way, n blocks of total/n. */
static inline void bench_shape_alltoall(size_t total, int n, struct bench_shape *s)
{
	size_t per = total / (size_t)n;
	*s = (struct bench_shape){per * n, per, per * n, per * n};
}

static inline void bench_shape_none(size_t total, int n, struct bench_shape *s)
{
	(void)total, (void)n;
	*s = (struct bench_shape){0, 0, 0, 0};
}

/* Out of place everywhere, as nccl-tests' default: the input stays valid for every call. */
static inline int bench_run_allreduce(struct bench_backend *b, const struct bench_args *a,
                                      const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->allreduce(b, sendbuf, recvbuf, s->param, a->dtype, a->op);
}

static inline int bench_run_reduce(struct bench_backend *b, const struct bench_args *a,
                                   const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->reduce(b, sendbuf, recvbuf, s->param, a->dtype, a->op, a->root);
}

/* Broadcast is in place on recvbuf: the root's data in it, every other rank's overwritten. */
static inline int bench_run_broadcast(struct bench_backend *b, const struct bench_args *a,
                                      const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	(void)sendbuf;
	return b->broadcast(b, recvbuf, s->param, a->dtype, a->root);
}

static inline int bench_run_allgather(struct bench_backend *b, const struct bench_args *a,
                                      const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->allgather(b, sendbuf, recvbuf, s->param, a->dtype);
}

static inline int bench_run_rs(struct bench_backend *b, const struct bench_args *a,
                               const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->reduce_scatter(b, sendbuf, recvbuf, s->param, a->dtype, a->op);
}

static inline int bench_run_alltoall(struct bench_backend *b, const struct bench_args *a,
                                     const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->alltoall(b, sendbuf, recvbuf, s->param, a->dtype);
}

static inline int bench_run_gather(struct bench_backend *b, const struct bench_args *a,
                                   const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->gather(b, sendbuf, recvbuf, s->param, a->dtype, a->root);
}

static inline int bench_run_scatter(struct bench_backend *b, const struct bench_args *a,
                                    const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	return b->scatter(b, sendbuf, recvbuf, s->param, a->dtype, a->root);
}

static inline int bench_run_barrier(struct bench_backend *b, const struct bench_args *a,
                                    const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	(void)a, (void)s, (void)sendbuf, (void)recvbuf;
	return b->barrier(b);
}

/* Reductions (allreduce, reduce, reducescatter): the whole input holds the pattern. */
static inline void bench_fill_reduction(const struct bench_backend *b,
                                        const struct bench_args *a,
                                        const struct bench_shape *s, void *sendbuf,
                                        void *recvbuf)
{
	for (size_t i = 0; i < s->send; i++)
		bench_set(sendbuf, a->dtype, i, bench_pattern(a->op, a->dtype, b->rank, b->size, i));
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

/* recvbuf[j] must be the reduction at index first + j. */
static inline int64_t bench_check_reduced(const struct bench_backend *b,
                                          const struct bench_args *a, const void *recvbuf,
                                          size_t first, size_t count)
{
	int64_t wrong = 0;
	for (size_t j = 0; j < count; j++) {
		double want = bench_expected(a->op, a->dtype, b->size, first + j);
		wrong += bench_mismatch(a->op, a->dtype, bench_get(recvbuf, a->dtype, j), want);
	}
	return wrong;
}

static inline int64_t bench_check_allreduce(const struct bench_backend *b,
                                            const struct bench_args *a,
                                            const struct bench_shape *s, const void *recvbuf)
{
	return bench_check_reduced(b, a, recvbuf, 0, s->recv);
}

static inline int64_t bench_check_reduce(const struct bench_backend *b,
                                         const struct bench_args *a,
                                         const struct bench_shape *s, const void *recvbuf)
{
	return b->rank == a->root ? bench_check_reduced(b, a, recvbuf, 0, s->recv) : 0;
}

static inline int64_t bench_check_rs(const struct bench_backend *b, const struct bench_args *a,
                                     const struct bench_shape *s, const void *recvbuf)
{
	int64_t wrong = bench_check_reduced(b, a, recvbuf, bench_rs_offset(s->total, b->size, b->rank),
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
static inline void bench_fill_blocks(void *buf, enum bench_dtype d, size_t nblocks,
                                     size_t count, size_t first, size_t stride)
{
	for (size_t k = 0; k < nblocks; k++)
		for (size_t j = 0; j < count; j++)
			bench_set(buf, d, k * count + j, bench_value(d, first + k * stride, j));
}

static inline int64_t bench_check_blocks(const void *buf, enum bench_dtype d, size_t nblocks,
                                         size_t count, size_t first, size_t stride)
{
	int64_t wrong = 0;
	for (size_t k = 0; k < nblocks; k++)
		for (size_t j = 0; j < count; j++)
			wrong += bench_get(buf, d, k * count + j) != bench_value(d, first + k * stride, j);
	return wrong;
}

static inline void bench_fill_broadcast(const struct bench_backend *b,
                                        const struct bench_args *a,
                                        const struct bench_shape *s, void *sendbuf,
                                        void *recvbuf)
{
	(void)sendbuf;
	if (b->rank == a->root)
		bench_fill_blocks(recvbuf, a->dtype, 1, s->recv, (size_t)a->root, 0);
	else
		bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static inline int64_t bench_check_broadcast(const struct bench_backend *b,
                                            const struct bench_args *a,
                                            const struct bench_shape *s, const void *recvbuf)
{
	(void)b;
	return bench_check_blocks(recvbuf, a->dtype, 1, s->recv, (size_t)a->root, 0);
}

/* allgather and gather: rank r sends the block of source r. */
static inline void bench_fill_gather(const struct bench_backend *b, const struct bench_args *a,
                                     const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	bench_fill_blocks(sendbuf, a->dtype, 1, s->send, (size_t)b->rank, 0);
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static inline int64_t bench_check_allgather(const struct bench_backend *b,
                                            const struct bench_args *a,
                                            const struct bench_shape *s, const void *recvbuf)
{
	return bench_check_blocks(recvbuf, a->dtype, (size_t)b->size, s->param, 0, 1);
}

static inline int64_t bench_check_gather(const struct bench_backend *b,
                                         const struct bench_args *a,
                                         const struct bench_shape *s, const void *recvbuf)
{
	return b->rank == a->root ? bench_check_allgather(b, a, s, recvbuf) : 0;
}

/* scatter: the root's block k is source k's. */
static inline void bench_fill_scatter(const struct bench_backend *b, const struct bench_args *a,
                                      const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	if (b->rank == a->root)
		bench_fill_blocks(sendbuf, a->dtype, (size_t)b->size, s->param, 0, 1);
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static inline int64_t bench_check_scatter(const struct bench_backend *b,
                                          const struct bench_args *a,
                                          const struct bench_shape *s, const void *recvbuf)
{
	return bench_check_blocks(recvbuf, a->dtype, 1, s->recv, (size_t)b->rank, 0);
}

/* alltoall: the block that rank i sends to rank j belongs to source i*n + j. */
static inline void bench_fill_alltoall(const struct bench_backend *b, const struct bench_args *a,
                                       const struct bench_shape *s, void *sendbuf, void *recvbuf)
{
	size_t n = (size_t)b->size;
	bench_fill_blocks(sendbuf, a->dtype, n, s->param, (size_t)b->rank * n, 1);
	bench_fill_sentinel(recvbuf, a->dtype, s->recv);
}

static inline int64_t bench_check_alltoall(const struct bench_backend *b,
                                           const struct bench_args *a,
                                           const struct bench_shape *s, const void *recvbuf)
{
	size_t n = (size_t)b->size;
	return bench_check_blocks(recvbuf, a->dtype, n, s->param, (size_t)b->rank, n);
}

#define BENCH_HAS(call)                                                 \
	static inline int bench_has_##call(const struct bench_backend *b) \
	{                                                                 \
		return b->call != NULL;                                       \
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

static const struct bench_coll bench_colls[] = {
	{"allreduce", BENCH_USES_OP, bench_has_allreduce, bench_factor_allreduce, bench_shape_same,
	 bench_run_allreduce, bench_fill_reduction, bench_check_allreduce},
	{"reduce", BENCH_USES_OP | BENCH_USES_ROOT, bench_has_reduce, bench_factor_one,
	 bench_shape_same, bench_run_reduce, bench_fill_reduction, bench_check_reduce},
	{"broadcast", BENCH_USES_ROOT, bench_has_broadcast, bench_factor_one, bench_shape_same,
	 bench_run_broadcast, bench_fill_broadcast, bench_check_broadcast},
	{"allgather", 0, bench_has_allgather, bench_factor_spread, bench_shape_gather,
	 bench_run_allgather, bench_fill_gather, bench_check_allgather},
	{"reducescatter", BENCH_USES_OP, bench_has_reduce_scatter, bench_factor_spread,
	 bench_shape_rs, bench_run_rs, bench_fill_reduction, bench_check_rs},
	{"alltoall", 0, bench_has_alltoall, bench_factor_spread, bench_shape_alltoall,
	 bench_run_alltoall, bench_fill_alltoall, bench_check_alltoall},
	{"gather", BENCH_USES_ROOT, bench_has_gather, bench_factor_spread, bench_shape_gather,
	 bench_run_gather, bench_fill_gather, bench_check_gather},
	{"scatter", BENCH_USES_ROOT, bench_has_scatter, bench_factor_spread, bench_shape_scatter,
	 bench_run_scatter, bench_fill_scatter, bench_check_scatter},
	{"barrier", BENCH_NO_DATA, bench_has_barrier, bench_factor_zero, bench_shape_none,
	 bench_run_barrier, NULL, NULL},
};
#define BENCH_NCOLLS (sizeof bench_colls / sizeof bench_colls[0])

/* "all_reduce", "reduce_scatter", "bcast" (nccl-tests' and MPI's spellings) name ours too. */
static inline const struct bench_coll *bench_find_coll(const char *name)
{
	char plain[32];
	size_t len = 0;
	for (const char *p = name; *p && len + 1 < sizeof plain; p++)
		if (*p != '_' && *p != '-')
			plain[len++] = *p;
	plain[len] = '\0';
	if (strcmp(plain, "bcast") == 0)
		return &bench_colls[2];
	for (size_t i = 0; i < BENCH_NCOLLS; i++)
		if (strcmp(plain, bench_colls[i].name) == 0)
			return &bench_colls[i];
	return NULL;
}

/* ---- flags -------------------------------------------------------------------------------- */

static inline void bench_usage(FILE *f, const char *prog, const char *extra)
{
	fprintf(f, "usage: %s <collective> [flags]\n"
	           "collectives:", prog);
	for (size_t i = 0; i < BENCH_NCOLLS; i++)
		fprintf(f, " %s", bench_colls[i].name);
	fprintf(f, "\n"
	           "  -b, --minbytes SIZE   smallest message (default 8)\n"
	           "  -e, --maxbytes SIZE   largest message (default 64M)\n"
	           "  -f, --stepfactor N    multiply the size by N each step (default 2)\n"
	           "  -i, --stepbytes SIZE  add SIZE each step instead of -f\n"
	           "  -n, --iters N         timed iterations per size (default 20)\n"
	           "  -w, --warmup_iters N  untimed iterations before them (default 5)\n"
	           "  -c, --check 0|1|all   verify results: 0 never, 1 in one extra call after the\n"
	           "                        timed ones (default), all in every call\n"
	           "      --check           the same as -c all (only the call itself is timed)\n"
	           "  -d, --datatype T      float, double, int32, int64, half, bfloat16, int8,\n"
	           "                        uint8, int16 (default float)\n"
	           "  -o, --op OP           sum, avg, min, max, prod (default sum)\n"
	           "  -r, --root R          root of broadcast, reduce, gather, scatter (default 0)\n"
	           "      --csv FILE        also write the rows as CSV to FILE (rank 0)\n"
	           "      --json FILE       also write the run as JSON to FILE (rank 0)\n"
	           "      --progress SEC    a line on stderr while a size runs past SEC (default 2;\n"
	           "                        0: never)\n"
	           "      --offset BYTES    start the buffers BYTES past a page boundary (default 0;\n"
	           "                        0-4095), as a framework's tensors often do: PyTorch\n"
	           "                        aligns CPU tensors to 64 bytes, NumPy arrays to 16\n"
	           "  -q, --quiet           no table on stdout (with --csv or --json)\n"
	           "%s"
	           "  -h, --help            this text\n"
	           "SIZE takes a K, M or G suffix (powers of 1024), e.g. 64M. As in nccl-tests, a\n"
	           "size is the bytes of one rank's largest buffer: the gathered result of\n"
	           "allgather and gather, the whole input of reducescatter and scatter, the whole\n"
	           "send buffer of alltoall. Time is the slowest rank's average per call;\n"
	           "algbw = size / time; busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n\n"
	           "(allgather, reducescatter, alltoall, gather, scatter), x 1 (broadcast, reduce).\n"
	           "#wrong: wrong elements, summed over the ranks and the checked calls.\n"
	           "Exit status: 0 all right, 1 a failed call or a wrong result, 2 a bad flag.\n",
	        extra ? extra : "");
}

/* "64M" -> 67108864. K, M, G are powers of 1024 (as nccl-tests); a trailing B is allowed. */
static inline int bench_parse_size(const char *s, size_t *out)
{
	char *end;
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	unsigned shift = 0;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end != '\0' || v > (SIZE_MAX >> shift))
		return -1;
	*out = (size_t)v << shift;
	return 0;
}

static inline int bench_parse_int(const char *s, int min, int max, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end != '\0' || v < min || v > max)
		return -1;
	*out = (int)v;
	return 0;
}

static inline int bench_parse_check(const char *s, enum bench_check *out)
{
	if (strcmp(s, "0") == 0)
		*out = BENCH_CHECK_NONE;
	else if (strcmp(s, "1") == 0)
		*out = BENCH_CHECK_ONCE;
	else if (strcmp(s, "all") == 0 || strcmp(s, "2") == 0)
		*out = BENCH_CHECK_ALL;
	else
		return -1;
	return 0;
}

/* Says why on stderr, then the usage; the caller exits with status 2. */
static inline int bench_bad_flag(const char *prog, const char *extra, const char *why,
                                 const char *what)
{
	fprintf(stderr, "%s: %s%s\n", prog, why, what ? what : "");
	bench_usage(stderr, prog, extra);
	return 2;
}

/*
 * Fills *a from argv. Returns 0 to run, 1 when -h printed the usage (exit 0), 2 on a bad
 * command line after saying why and printing the usage on stderr (exit 2). Runs before the
 * job is joined, so a typo never leaves the other ranks waiting. extra is the program's own
 * lines for the usage text (khor-bench's --transport and --algo), or NULL.
 */
static inline int bench_parse_args(int argc, char **argv, const char *prog, const char *extra,
                                   struct bench_args *a)
{
	enum { OPT_CSV = 256, OPT_JSON, OPT_CHECK_ALL, OPT_PROGRESS, OPT_OFFSET };
	static const struct option longopts[] = {
		{"minbytes", required_argument, NULL, 'b'},
		{"maxbytes", required_argument, NULL, 'e'},
		{"stepfactor", required_argument, NULL, 'f'},
		{"stepbytes", required_argument, NULL, 'i'},
		{"iters", required_argument, NULL, 'n'},
		{"warmup_iters", required_argument, NULL, 'w'},
		/* --check alone checks every call; --check=0|1|all is -c */
		{"check", optional_argument, NULL, OPT_CHECK_ALL},
		{"datatype", required_argument, NULL, 'd'},
		{"op", required_argument, NULL, 'o'},
		{"root", required_argument, NULL, 'r'},
		{"csv", required_argument, NULL, OPT_CSV},
		{"json", required_argument, NULL, OPT_JSON},
		{"progress", required_argument, NULL, OPT_PROGRESS},
		{"offset", required_argument, NULL, OPT_OFFSET},
		{"quiet", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	*a = (struct bench_args){
		.minbytes = 8, .maxbytes = 64u << 20, .stepfactor = 2, .iters = 20, .warmup = 5,
		.check = BENCH_CHECK_ONCE, .dtype = BENCH_F32, .op = BENCH_SUM, .progress_s = 2,
	};
	int op_given = 0, root_given = 0, dtype_given = 0, c;
	opterr = 0; /* we name the bad flag ourselves, with the usage after it */
	optind = 1;
	int longidx = -1; /* set by getopt_long when a long option matched */
	while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:r:qh", longopts, &longidx)) != -1) {
		const char *need = NULL; /* set when the value is bad: what the flag wants */
		int f = 2;
		switch (c) {
		case 'b':
			if (bench_parse_size(optarg, &a->minbytes))
				need = "a size like 8, 4K or 64M";
			break;
		case 'e':
			if (bench_parse_size(optarg, &a->maxbytes))
				need = "a size like 8, 4K or 64M";
			break;
		case 'f':
			if (bench_parse_int(optarg, 2, INT_MAX, &f))
				need = "an integer factor of 2 or more";
			a->stepfactor = (size_t)f;
			a->stepbytes = 0; /* the last of -f and -i wins */
			break;
		case 'i':
			if (bench_parse_size(optarg, &a->stepbytes) || a->stepbytes == 0)
				need = "a positive size like 1M";
			break;
		case 'n':
			if (bench_parse_int(optarg, 1, INT_MAX, &a->iters))
				need = "an integer of 1 or more";
			break;
		case 'w':
			if (bench_parse_int(optarg, 0, INT_MAX, &a->warmup))
				need = "an integer of 0 or more";
			break;
		case 'c':
			if (bench_parse_check(optarg, &a->check))
				need = "0, 1 or all";
			break;
		case OPT_CHECK_ALL:
			if (!optarg)
				a->check = BENCH_CHECK_ALL;
			else if (bench_parse_check(optarg, &a->check))
				need = "0, 1 or all";
			break;
		case 'd':
			dtype_given = 1;
			if (bench_parse_dtype(optarg, &a->dtype))
				need = "float, double, int32, int64, half, bfloat16, int8, uint8 or int16";
			break;
		case 'o':
			op_given = 1;
			if (bench_parse_op(optarg, &a->op))
				need = "sum, avg, min, max or prod";
			break;
		case 'r':
			root_given = 1;
			if (bench_parse_int(optarg, 0, INT_MAX, &a->root))
				need = "a rank of 0 or more";
			break;
		case OPT_CSV:
			a->csv = optarg;
			break;
		case OPT_JSON:
			a->json = optarg;
			break;
		case OPT_PROGRESS: {
			int sec;
			if (bench_parse_int(optarg, 0, 86400, &sec))
				need = "whole seconds, 0 for never";
			a->progress_s = sec;
			break;
		}
		case OPT_OFFSET: {
			int off;
			if (bench_parse_int(optarg, 0, 4095, &off))
				need = "a byte count from 0 to 4095";
			a->offset = (size_t)off;
			break;
		}
		case 'q':
			a->quiet = 1;
			break;
		case 'h':
			bench_usage(stdout, prog, extra);
			return 1;
		case ':':
			return bench_bad_flag(prog, extra, "this flag needs a value: ", argv[optind - 1]);
		default:
			if (optopt > 0 && optopt < 256) {
				char flag[3] = {'-', (char)optopt, '\0'};
				return bench_bad_flag(prog, extra, "unknown flag ", flag);
			}
			return bench_bad_flag(prog, extra, "unknown flag ", argv[optind - 1]);
		}
		if (need) {
			/* Name the flag as written: -d for short options, --datatype for long ones. */
			const char *name = longidx >= 0 ? longopts[longidx].name : NULL;
			if (name)
				fprintf(stderr, "%s: bad value '%s' for --%s: it needs %s\n", prog, optarg,
				        name, need);
			else
				fprintf(stderr, "%s: bad value '%s' for -%c: it needs %s\n", prog, optarg,
				        c, need);
			bench_usage(stderr, prog, extra);
			return 2;
		}
		longidx = -1;
	}
	if (optind != argc - 1)
		return bench_bad_flag(prog, extra, optind >= argc ? "which collective? name one"
		                                                  : "name exactly one collective, not ",
		                      optind >= argc ? NULL : argv[optind + 1]);
	a->coll = bench_find_coll(argv[optind]);
	if (!a->coll)
		return bench_bad_flag(prog, extra, "unknown collective ", argv[optind]);
	if (a->minbytes > a->maxbytes) {
		fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", prog, a->minbytes, a->maxbytes);
		bench_usage(stderr, prog, extra);
		return 2;
	}
	if (a->quiet && !a->csv && !a->json)
		return bench_bad_flag(prog, extra, "-q without --csv or --json would print nothing",
		                      NULL);
	/* Refuse flags that would be silently ignored: a user who wrote -o max on a broadcast
	 * believes they measured something they did not. */
	if (op_given && !(a->coll->flags & BENCH_USES_OP))
		return bench_bad_flag(prog, extra, "-o does not apply to ", a->coll->name);
	if (root_given && !(a->coll->flags & BENCH_USES_ROOT))
		return bench_bad_flag(prog, extra, "-r does not apply to ", a->coll->name);
	if (dtype_given && (a->coll->flags & BENCH_NO_DATA))
		return bench_bad_flag(prog, extra, "-d does not apply to ", a->coll->name);
	return 0;
}

/* ---- timing and printing ------------------------------------------------------------------ */

static inline double bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline const char *bench_check_name(enum bench_check c)
{
	return c == BENCH_CHECK_ALL ? "all" : c == BENCH_CHECK_ONCE ? "1" : "0";
}

static inline int bench_comparing(const struct bench_backend *b)
{
	return b->nalgos > 1;
}

static inline const char *bench_mem_name(const struct bench_mem *m)
{
	return m ? m->name : "host";
}

/* Does the run name its memory (a device kind among its buffers)? Else it prints as always. */
static inline int bench_mem_shown(const struct bench_backend *b)
{
	for (int m = 0; m < b->nmems; m++)
		if (b->mems[m])
			return 1;
	return 0;
}

static inline int bench_nmems(const struct bench_backend *b)
{
	return b->nmems > 1 ? b->nmems : 1;
}

static inline int bench_rounds(const struct bench_args *a)
{
	return a->iters < BENCH_ROUNDS ? a->iters : BENCH_ROUNDS;
}

/* The index of "auto" among the compared algorithms when there is also a fixed one; else -1. */
static inline int bench_auto_index(const struct bench_backend *b)
{
	if (!bench_comparing(b))
		return -1;
	for (int k = 0; k < b->nalgos; k++)
		if (strcmp(b->algos[k], "auto") == 0)
			return k;
	return -1;
}

/* The fastest algorithm other than auto (sec: per algorithm); -1 when there is none. */
static inline int bench_best_fixed(const struct bench_backend *b, const double *sec)
{
	int best = -1, au = bench_auto_index(b);
	for (int k = 0; k < b->nalgos; k++)
		if (k != au && (best < 0 || sec[k] < sec[best]))
			best = k;
	return best;
}

/* The header's first two lines: what runs, and on what. */
static inline void bench_print_title(const struct bench_backend *b, const struct bench_args *a)
{
	printf("# %s %s: %d rank%s, ", b->prog, a->coll->name, b->size, b->size == 1 ? "" : "s");
	if (!(a->coll->flags & BENCH_NO_DATA))
		printf("dtype %s, ", bench_dtype_name(a->dtype));
	if (a->coll->flags & BENCH_USES_OP)
		printf("op %s, ", bench_op_name(a->op));
	if (a->coll->flags & BENCH_USES_ROOT)
		printf("root %d, ", a->root);
	printf("iters %d, warmup %d, check %s", a->iters, a->warmup, bench_check_name(a->check));
	if (a->offset)
		printf(", buffers at page + %zu B", a->offset);
	printf("\n");
	printf("# library: %s (transport %s, algo %s)\n", b->library, b->transport, b->algo);
	if (!bench_mem_shown(b))
		return;
	printf("# memory:");
	for (int m = 0; m < bench_nmems(b); m++)
		printf("%s %s", m ? " and" : "", b->mems[m] ? b->mems[m]->where : "host");
	if (bench_nmems(b) > 1)
		printf(", side by side");
	printf("; patterns written and checked in host copies, moved outside the timed calls\n");
}

static inline void bench_print_header(const struct bench_backend *b, const struct bench_args *a)
{
	bench_print_title(b, a);
	if (bench_comparing(b)) {
		printf("# algorithms interleaved: %d rounds, each runs every algorithm's share of the "
		       "iterations in turn (starting one later each round, every other round in "
		       "reverse); time in us per call, median of the rounds\n#\n", bench_rounds(a));
		printf("#%11s  %12s  %8s  %6s", "size", "count", "type", "redop");
		for (int k = 0; k < b->nalgos; k++)
			printf("  %8s", b->algos[k]);
		if (bench_auto_index(b) >= 0)
			printf("  %6s  %9s", "best", "auto/best");
		printf("  %6s\n", "#wrong");
		fflush(stdout);
		return;
	}
	if (bench_nmems(b) > 1) {
		char col[2][2][32], ratio[32];
		for (int m = 0; m < 2; m++) {
			const char *name = bench_mem_name(b->mems[m]);
			snprintf(col[m][0], sizeof col[m][0], "%s time", name);
			snprintf(col[m][1], sizeof col[m][1], "%s busbw", name);
		}
		snprintf(ratio, sizeof ratio, "%s/%s", bench_mem_name(b->mems[1]),
		         bench_mem_name(b->mems[0]));
		printf("# interleaved: %d rounds, each runs both kinds' share of the iterations in "
		       "turn; time per call, median of the rounds; %s: the ratio of their "
		       "busbw\n#\n", bench_rounds(a), ratio);
		printf("#%11s  %12s  %8s  %6s  %10s  %10s  %10s  %10s  %9s  %6s\n", "size", "count",
		       "type", "redop", col[0][0], col[0][1], col[1][0], col[1][1], ratio, "#wrong");
		printf("#%11s  %12s  %8s  %6s  %10s  %10s  %10s  %10s\n", "(B)", "(elements)", "",
		       "", "(us)", "(GB/s)", "(us)", "(GB/s)");
		fflush(stdout);
		return;
	}
	printf("#\n");
	printf("#%11s  %12s  %8s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
	       "time", "algbw", "busbw", "#wrong");
	printf("#%11s  %12s  %8s  %6s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "(us)",
	       "(GB/s)", "(GB/s)");
	fflush(stdout);
}

/* nccl-tests' precision rule: fewer decimals as the time grows, so the column stays 7 wide. */
static inline void bench_format_time(char *out, size_t len, double us)
{
	snprintf(out, len, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

static inline const char *bench_row_type(const struct bench_args *a)
{
	return a->coll->flags & BENCH_NO_DATA ? "none" : bench_dtype_name(a->dtype);
}

static inline const char *bench_row_redop(const struct bench_args *a)
{
	return a->coll->flags & BENCH_USES_OP ? bench_op_name(a->op) : "none";
}

static inline void bench_print_row(const struct bench_args *a, size_t bytes, size_t count,
                                   double us, double algbw, double busbw, int64_t wrong)
{
	char t[32], w[32];
	bench_format_time(t, sizeof t, us);
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6s\n", bytes, count, bench_row_type(a),
	       bench_row_redop(a), t, algbw, busbw, w);
	fflush(stdout); /* one line per size is the progress report of a long sweep */
}

static inline void bench_print_compare_row(const struct bench_backend *b,
                                           const struct bench_args *a, size_t bytes,
                                           size_t count, const double *sec, int64_t wrong)
{
	char t[32], w[32];
	printf("%12zu  %12zu  %8s  %6s", bytes, count, bench_row_type(a), bench_row_redop(a));
	for (int k = 0; k < b->nalgos; k++) {
		bench_format_time(t, sizeof t, sec[k] * 1e6);
		printf("  %8s", t);
	}
	int au = bench_auto_index(b), best = bench_best_fixed(b, sec);
	if (au >= 0 && best >= 0)
		printf("  %6s  %9.2f", b->algos[best], sec[best] > 0 ? sec[au] / sec[best] : 0.0);
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("  %6s\n", w);
	fflush(stdout);
}

/* --mem both: each kind's time and busbw, and the second's busbw over the first's. */
static inline void bench_print_mems_row(const struct bench_args *a, size_t bytes, size_t count,
                                        const double *sec, const double *busbw, int64_t wrong)
{
	char t[2][32], w[32], r[32];
	for (int m = 0; m < 2; m++)
		bench_format_time(t[m], sizeof t[m], sec[m] * 1e6);
	if (busbw[0] > 0)
		snprintf(r, sizeof r, "%9.2f", busbw[1] / busbw[0]);
	else
		snprintf(r, sizeof r, "%9s", "-");
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("%12zu  %12zu  %8s  %6s  %10s  %10.2f  %10s  %10.2f  %9s  %6s\n", bytes, count,
	       bench_row_type(a), bench_row_redop(a), t[0], busbw[0], t[1], busbw[1], r, w);
	fflush(stdout);
}

/* "64 MiB", "1.5 KiB", "8 B": sizes in progress lines, for people. */
static inline void bench_human_size(char *out, size_t len, size_t bytes)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(out, len, v == (double)(size_t)v ? "%.0f %s" : "%.1f %s", v, units[u]);
}

/* A JSON string literal; the names printed here are plain ASCII, but paths need not be. */
static inline void bench_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

/* A CSV field, quoted when it holds a comma or a quote (MPI's transport is "tcp,self"). */
static inline void bench_csv_field(FILE *f, const char *s)
{
	if (!strpbrk(s, ",\"\n")) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"')
			fputc('"', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

/* ---- threads of a multi-comm run ---------------------------------------------------------- */

#define BENCH_MAX_COMMS 64 /* comms of one K, each with a thread and its own buffers */
#define BENCH_MAX_KS 8     /* K values in one --comms list */
#define BENCH_SPLIT_REPS 21
/* After a thread failed, the others may finish the size: they are given up on (and the
 * process exits) once none of them has finished a call for this long. */
#define BENCH_STALL_S 30

/*
 * What the threads of one phase (one size on K comms) share. The gate lines them up after
 * the warm-up, so that the K timed loops run at the same time, and again after the timed
 * calls, so that no comm's check runs beside another's timing. A thread that fails leaves the
 * gate for good instead of breaking it: the others carry on with the same calls as their
 * peers on the other ranks, so a healthy comm is never left waiting for a rank that gave up,
 * and the sweep stops after the phase.
 */
struct bench_phase {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int parties;  /* threads the gate waits for: the phase's, less those that failed */
	int arrived;
	unsigned long generation;
	int finished; /* threads done, failed or not */
	int failed;   /* index + 1 of the first comm that failed; 0: none */
};

/* One comm's share of a phase: what it runs, with what, and what came of it. */
struct bench_thread {
	atomic_ulong beats; /* calls finished: the main thread's sign of life */
	struct bench_phase *phase;
	int comm;           /* its index among the phase's comms */
	struct bench_backend *b;
	struct bench_args a;
	const struct bench_shape *s;
	const struct bench_bufs *bufs;
	size_t bytes;
	double sec;         /* the comm's slowest rank's seconds per call */
	int64_t wrong;      /* wrong elements, summed over the comm's ranks */
	int status;         /* 0, or -1 after a failure it reported */
	int done;
	pthread_t tid;
};

/* Wakes the gate's waiters when the last of its parties has come. Holds phase->mu. */
static inline void bench_gate_open_locked(struct bench_phase *p)
{
	if (p->arrived > 0 && p->arrived >= p->parties) {
		p->arrived = 0;
		p->generation++;
		pthread_cond_broadcast(&p->cv);
	}
}

/* The gate: waits for every other thread of the phase that has not failed. No-op alone. */
static inline void bench_thread_sync(struct bench_thread *t)
{
	if (!t)
		return;
	struct bench_phase *p = t->phase;
	pthread_mutex_lock(&p->mu);
	unsigned long gen = p->generation;
	p->arrived++;
	bench_gate_open_locked(p);
	while (gen == p->generation)
		pthread_cond_wait(&p->cv, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

static inline void bench_thread_beat(struct bench_thread *t)
{
	if (t)
		atomic_fetch_add_explicit(&t->beats, 1, memory_order_relaxed);
}

/*
 * A buffer of bytes starting offset bytes past a page boundary (--offset); *base gets what
 * to free. At least one page, so that a zero-size run still has valid pointers.
 */
static inline void *bench_alloc(size_t bytes, size_t offset, void **base)
{
	size_t len = bytes + offset > 4096 ? bytes + offset : 4096;
	void *p = NULL;

	*base = NULL;
	if (posix_memalign(&p, 4096, len))
		return NULL;
	*base = p;
	memset(p, 0, len); /* fault every page in now, not in the first timed loop */
	return (char *)p + offset;
}

/* ---- buffers of one memory kind ---------------------------------------------------------- */

/*
 * A send and a receive buffer of one kind: send and recv are what the calls get; hsend and
 * hrecv are where the CPU writes and reads the patterns (the same buffers for host memory,
 * host copies for a device kind).
 */
struct bench_bufs {
	const struct bench_mem *mem; /* NULL: host memory */
	void *send, *recv;
	void *hsend, *hrecv;
	size_t send_bytes, recv_bytes;
	void *dev_base[2], *host_base[2]; /* what to free */
};

static inline void bench_bufs_free(struct bench_bufs *u)
{
	for (int i = 0; i < 2; i++) {
		if (u->mem && u->dev_base[i])
			u->mem->free(u->mem, u->dev_base[i]);
		free(u->host_base[i]);
		u->dev_base[i] = u->host_base[i] = NULL;
	}
}

/* 0, or -1 after saying why on stderr (bench_bufs_free undoes what was done either way). */
static inline int bench_bufs_alloc(const struct bench_backend *b, const struct bench_mem *mem,
                                   size_t send_bytes, size_t recv_bytes, size_t offset,
                                   struct bench_bufs *u)
{
	*u = (struct bench_bufs){.mem = mem, .send_bytes = send_bytes, .recv_bytes = recv_bytes};
	u->hsend = bench_alloc(send_bytes, offset, &u->host_base[0]);
	u->hrecv = bench_alloc(recv_bytes, offset, &u->host_base[1]);
	if (!u->hsend || !u->hrecv) {
		fprintf(stderr, "%s: rank %d: cannot allocate %zu + %zu bytes of host memory; lower "
		                "-e\n", b->prog, b->rank, send_bytes, recv_bytes);
		return -1;
	}
	if (!mem) {
		u->send = u->hsend;
		u->recv = u->hrecv;
		return 0;
	}
	char why[512] = "";
	for (int i = 0; i < 2; i++) {
		size_t bytes = i ? recv_bytes : send_bytes;
		size_t len = bytes + offset > 4096 ? bytes + offset : 4096;
		u->dev_base[i] = mem->alloc(mem, len, why, sizeof why);
		if (!u->dev_base[i]) {
			fprintf(stderr, "%s: rank %d: cannot allocate %zu bytes of %s memory: %s\n",
			        b->prog, b->rank, len, mem->name, why);
			return -1;
		}
	}
	u->send = (char *)u->dev_base[0] + offset;
	u->recv = (char *)u->dev_base[1] + offset;
	return 0;
}

/* The collective's fill, then the inputs and the sentinels copied to the device: 0 or -1. */
static inline int bench_bufs_fill(const struct bench_backend *b, const struct bench_args *a,
                                  const struct bench_shape *s, const struct bench_bufs *u)
{
	char why[512] = "";
	size_t esize = bench_dtype_size(a->dtype);

	a->coll->fill(b, a, s, u->hsend, u->hrecv);
	if (!u->mem)
		return 0;
	if (u->mem->put(u->mem, u->send, u->hsend, s->send * esize, why, sizeof why) ||
	    u->mem->put(u->mem, u->recv, u->hrecv, s->recv * esize, why, sizeof why)) {
		fprintf(stderr, "%s: rank %d: copying the inputs to %s memory failed: %s\n",
		        b->prog, b->rank, u->mem->name, why);
		return -1;
	}
	return 0;
}

/* The output copied back and checked: adds the wrong elements to *wrong; 0 or -1. */
static inline int bench_bufs_check(const struct bench_backend *b, const struct bench_args *a,
                                   const struct bench_shape *s, const struct bench_bufs *u,
                                   int64_t *wrong)
{
	char why[512] = "";

	if (u->mem && u->mem->get(u->mem, u->hrecv, u->recv, s->recv * bench_dtype_size(a->dtype),
	                          why, sizeof why)) {
		fprintf(stderr, "%s: rank %d: copying the result from %s memory failed: %s\n",
		        b->prog, b->rank, u->mem->name, why);
		return -1;
	}
	*wrong += a->coll->check(b, a, s, u->hrecv);
	return 0;
}

/* ---- the sweep ---------------------------------------------------------------------------- */

/* Says which call failed and why, on the rank that saw it. */
static inline int bench_fail(struct bench_backend *b, const char *what, size_t bytes)
{
	fprintf(stderr, "%s: rank %d: %s failed at %zu bytes: %s\n", b->prog, b->rank, what, bytes,
	        b->error(b));
	return -1;
}

/* The same for a call outside the sweep's sizes. */
static inline int bench_fail_call(struct bench_backend *b, const char *what)
{
	fprintf(stderr, "%s: rank %d: %s failed: %s\n", b->prog, b->rank, what, b->error(b));
	return -1;
}

/*
 * Rank 0's note on stderr that a long size is still running, so that a sweep to 1 GiB over
 * a slow link does not look hung: first after progress_s seconds, then every 5 x progress_s.
 */
struct bench_progress {
	double start;
	double next; /* seconds since start of the next line */
};

static inline void bench_progress_tick(const struct bench_backend *b, const struct bench_args *a,
                                       struct bench_progress *p, size_t bytes, int done,
                                       int total, int warmup)
{
	bench_thread_beat(b->thread);
	if (b->rank != 0 || a->progress_s <= 0)
		return;
	double elapsed = bench_now() - p->start;
	if (elapsed < p->next)
		return;
	char size[32];
	bench_human_size(size, sizeof size, bytes);
	if (warmup)
		fprintf(stderr, "# [%s] %s: warm-up %d of %d, %.0f s so far\n", b->prog, size, done,
		        total, elapsed);
	else
		fprintf(stderr, "# [%s] %s: %d of %d iterations, %.0f s so far\n", b->prog, size, done,
		        total, elapsed);
	p->next = elapsed + 5 * a->progress_s;
}

/* Median of n values (a few: insertion sort); sorts them in place. */
static inline double bench_median(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Comparison mode: switches every rank to algorithm k before its calls. */
static inline int bench_use_algo(struct bench_backend *b, int k, size_t bytes)
{
	if (!bench_comparing(b))
		return 0;
	if (b->set_algo(b, b->algos[k])) {
		char what[64];
		snprintf(what, sizeof what, "switching to --algo %s", b->algos[k]);
		return bench_fail(b, what, bytes);
	}
	return 0;
}

/*
 * The columns one size is timed in: every compared algorithm (1 without --algo a,b) on every
 * memory kind (1 without --mem both), column v being algorithm v % na on memory kind v / na.
 */
static inline int bench_nvariants(const struct bench_backend *b)
{
	return (bench_comparing(b) ? b->nalgos : 1) * bench_nmems(b);
}

/*
 * ncalls timed calls on buffers u after a barrier; adds their seconds to *sec. With -c all
 * every call gets fresh inputs and is checked, and only the call itself is timed, after a
 * barrier of its own so that one rank's slower check is not counted as the next call's time.
 */
static inline int bench_block(struct bench_backend *b, const struct bench_args *a,
                              const struct bench_shape *s, const struct bench_bufs *u,
                              size_t bytes, int ncalls, struct bench_progress *prog, int *done,
                              double *sec, int64_t *wrong)
{
	const struct bench_coll *c = a->coll;
	int check_all = a->check == BENCH_CHECK_ALL && c->fill;
	double t0, mine = 0;

	if (b->barrier(b))
		return bench_fail(b, "barrier before the timed loop", bytes);
	t0 = bench_now();
	for (int i = 0; i < ncalls; i++) {
		if (check_all) {
			if (bench_bufs_fill(b, a, s, u))
				return -1;
			if (b->barrier(b))
				return bench_fail(b, "barrier before a checked call", bytes);
			t0 = bench_now();
		}
		if (c->run(b, a, s, u->send, u->recv))
			return bench_fail(b, c->name, bytes);
		if (check_all) {
			mine += bench_now() - t0;
			if (bench_bufs_check(b, a, s, u, wrong))
				return -1;
		}
		bench_progress_tick(b, a, prog, bytes, ++*done, a->iters * bench_nvariants(b), 0);
	}
	if (!check_all)
		mine = bench_now() - t0;
	*sec += mine;
	return 0;
}

/*
 * Times iters calls after warmup calls, on buffers bufs[m] for each memory kind m. Writes the
 * slowest rank's average seconds per call to sec_out (one per column: bench_nvariants), as
 * nccl-tests does: a barrier lines the ranks up,
 * each times its own loop, and the maximum over ranks is what a synchronous training step
 * would see. In comparison mode the iterations run in rounds, each round a block of calls
 * of every algorithm in turn, so that a slow second on a shared machine hits them alike;
 * each round starts one algorithm later than the one before, and every other round runs
 * them in reverse order, so that no algorithm always runs right after the same other one
 * (a rotation alone keeps the cyclic order), and an algorithm's time is the median over the
 * rounds of the slowest rank's time per call in that round: one block that a preemption
 * stretched 2x moved the mean of five by 20%, and the median not at all. Host and device
 * buffers (--mem both) are two more columns of the same rounds, for the same reason.
 * Adds this rank's wrong elements to wrong[m], m the memory kind they were found in.
 */
static inline int bench_time(struct bench_backend *b, const struct bench_args *a,
                             const struct bench_shape *s, const struct bench_bufs *bufs,
                             size_t bytes, double *sec_out, int64_t *wrong)
{
	const struct bench_coll *c = a->coll;
	struct bench_progress prog = {bench_now(), a->progress_s};
	int check_all = a->check == BENCH_CHECK_ALL && c->fill;
	int na = bench_comparing(b) ? b->nalgos : 1, nv = bench_nvariants(b);
	int rounds = nv > 1 ? bench_rounds(a) : 1, done = 0;
	double mine[BENCH_MAX_ALGOS * BENCH_ROUNDS] = {0}, all[BENCH_MAX_ALGOS * BENCH_ROUNDS];
	if (nv > BENCH_MAX_ALGOS) { /* bench_can_run refuses this; a guard for the arrays */
		fprintf(stderr, "%s: %d columns to time; at most %d\n", b->prog, nv,
		        BENCH_MAX_ALGOS);
		return -1;
	}
	/* Warm-up at every size, not once at the largest as nccl-tests does: khor picks its
	 * algorithm per size and a first call may set up links or buffers for that choice. */
	for (int v = 0; v < nv; v++) {
		const struct bench_bufs *u = &bufs[v / na];
		if (bench_use_algo(b, v % na, bytes))
			return -1;
		for (int i = 0; i < a->warmup; i++) {
			if (check_all && bench_bufs_fill(b, a, s, u))
				return -1;
			if (c->run(b, a, s, u->send, u->recv))
				return bench_fail(b, c->name, bytes);
			if (check_all && bench_bufs_check(b, a, s, u, &wrong[v / na]))
				return -1;
			bench_progress_tick(b, a, &prog, bytes, v * a->warmup + i + 1,
			                    nv * a->warmup, 1);
		}
	}
	bench_thread_sync(b->thread); /* --comms: every comm's timed loop at once */
	for (int r = 0; r < rounds; r++) {
		/* iters split as evenly as it goes: the first iters % rounds rounds get one more */
		int ncalls = a->iters / rounds + (r < a->iters % rounds);
		for (int j = 0; j < nv; j++) {
			int v = ((r % 2 == 0 ? j : nv - 1 - j) + r) % nv;
			double *sec = &mine[v * rounds + r];
			if (bench_use_algo(b, v % na, bytes) ||
			    bench_block(b, a, s, &bufs[v / na], bytes, ncalls, &prog, &done, sec,
			                &wrong[v / na]))
				return -1;
			*sec /= ncalls > 0 ? ncalls : 1;
		}
	}
	bench_thread_sync(b->thread);
	if (b->allreduce(b, mine, all, (size_t)(nv * rounds), BENCH_F64, BENCH_MAX))
		return bench_fail(b, "allreduce of the times", bytes);
	for (int v = 0; v < nv; v++)
		sec_out[v] = bench_median(&all[v * rounds], rounds);
	return 0;
}

/* -c 1: one checked call per column after the timed loop; adds this rank's wrong elements
 * to wrong[m], m the memory kind. */
static inline int bench_verify(struct bench_backend *b, const struct bench_args *a,
                               const struct bench_shape *s, const struct bench_bufs *bufs,
                               size_t bytes, int64_t *wrong)
{
	const struct bench_coll *c = a->coll;
	int na = bench_comparing(b) ? b->nalgos : 1;
	if (!c->fill)
		return 0;
	for (int v = 0; v < bench_nvariants(b); v++) {
		const struct bench_bufs *u = &bufs[v / na];
		if (bench_use_algo(b, v % na, bytes) || bench_bufs_fill(b, a, s, u))
			return -1;
		if (c->run(b, a, s, u->send, u->recv))
			return bench_fail(b, c->name, bytes);
		if (bench_bufs_check(b, a, s, u, &wrong[v / na]))
			return -1;
	}
	return 0;
}

/* Opens --csv or --json on rank 0; says why not and counts the failure in *bad. */
static inline FILE *bench_open_out(const struct bench_backend *b, const char *flag,
                                   const char *path, int64_t *bad)
{
	if (b->rank != 0 || !path)
		return NULL;
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "%s: cannot open %s %s: %s\n", b->prog, flag, path, strerror(errno));
		(*bad)++;
	}
	return f;
}

static inline int bench_close_out(const struct bench_backend *b, const char *flag,
                                  const char *path, FILE *f)
{
	if (f && fclose(f)) {
		fprintf(stderr, "%s: writing %s %s: %s\n", b->prog, flag, path, strerror(errno));
		return -1;
	}
	return 0;
}

static inline void bench_json_head(FILE *j, const struct bench_backend *b,
                                   const struct bench_args *a)
{
	fprintf(j, "{\"program\": ");
	bench_json_string(j, b->prog);
	fprintf(j, ", \"library\": ");
	bench_json_string(j, b->library);
	fprintf(j, ", \"transport\": ");
	bench_json_string(j, b->transport);
	fprintf(j, ", \"algo\": ");
	bench_json_string(j, b->algo);
	fprintf(j, ",\n \"collective\": \"%s\", \"nranks\": %d, \"type\": \"%s\", \"redop\": \"%s\", "
	           "\"root\": %d, \"iters\": %d, \"warmup\": %d, \"check\": \"%s\", "
	           "\"offset\": %zu",
	        a->coll->name, b->size, bench_row_type(a), bench_row_redop(a),
	        a->coll->flags & BENCH_USES_ROOT ? a->root : -1, a->iters, a->warmup,
	        bench_check_name(a->check), a->offset);
	if (!bench_mem_shown(b))
		return;
	fprintf(j, ", \"mem\": [");
	for (int m = 0; m < bench_nmems(b); m++) {
		fprintf(j, "%s", m ? ", " : "");
		bench_json_string(j, bench_mem_name(b->mems[m]));
	}
	fprintf(j, "]");
}

/* What can be refused before the sweep: 0 to go on, else the exit status (2). */
static inline int bench_can_run(const struct bench_backend *b, const struct bench_args *a)
{
	const struct bench_coll *c = a->coll;
	int rank0 = b->rank == 0;
	/* Every sweep needs barrier and allreduce for its timing, whatever it measures. */
	if (!c->available(b) || !b->barrier || !b->allreduce) {
		if (rank0)
			fprintf(stderr, "%s: %s does not provide %s\n", b->prog, b->library, c->name);
		return 2;
	}
	if (bench_nmems(b) > 1 && bench_comparing(b)) {
		if (rank0)
			fprintf(stderr, "%s: two memory kinds and a list of algorithms cannot be "
			                "timed side by side; give one of them\n", b->prog);
		return 2;
	}
	if ((c->flags & BENCH_USES_ROOT) && a->root >= b->size) {
		if (rank0)
			fprintf(stderr, "%s: -r %d is not a rank of this %d-rank job\n", b->prog,
			        a->root, b->size);
		return 2;
	}
	return 0;
}

/* The size after size, or 0 when the sweep ends there (it would pass -e or overflow). */
static inline size_t bench_next_size(const struct bench_args *a, size_t size)
{
	size_t next = a->stepbytes ? size + a->stepbytes : size * a->stepfactor;
	if (size == 0 && !a->stepbytes)
		next = 1; /* -b 0 with a factor would loop forever on 0 */
	if (next <= size || next > a->maxbytes)
		return 0;
	return next;
}

/*
 * Runs the whole sweep and prints it on rank 0. Returns the process exit status: 0 when every
 * call succeeded and every result was right, 1 otherwise, 2 for a bad flag that only the
 * joined job can detect (a root outside the job, an output file that cannot be opened).
 */
static inline int bench_run(struct bench_backend *b, const struct bench_args *a)
{
	const struct bench_coll *c = a->coll;
	int rank0 = b->rank == 0;
	int refused = bench_can_run(b, a);
	if (refused)
		return refused;
	/* Every rank decides together whether to start, so that a rank whose buffers or output
	 * file failed does not leave the others blocked in the first collective. */
	int64_t bad[2] = {0, 0}, bad_all[2]; /* ranks without buffers, output files that failed */
	FILE *csv = bench_open_out(b, "--csv", a->csv, &bad[1]);
	FILE *json = bench_open_out(b, "--json", a->json, &bad[1]);
	size_t esize = bench_dtype_size(a->dtype);
	struct bench_shape max;
	c->shape(c->flags & BENCH_NO_DATA ? 0 : a->maxbytes / esize, b->size, &max);
	int nm = bench_nmems(b), mem_shown = bench_mem_shown(b);
	struct bench_bufs bufs[BENCH_MAX_MEMS] = {0};
	for (int m = 0; m < nm && !bad[0]; m++)
		if (bench_bufs_alloc(b, b->nmems ? b->mems[m] : NULL, max.send * esize,
		                     max.recv * esize, a->offset, &bufs[m]))
			bad[0] = 1;
	int status = 0;
	if (b->allreduce(b, bad, bad_all, 2, BENCH_I64, BENCH_SUM)) {
		bench_fail(b, "allreduce at start", 0);
		status = 1;
		goto out_free;
	}
	if (bad_all[0] || bad_all[1]) {
		status = bad_all[0] ? 1 : 2; /* an output path is a flag; memory is not */
		goto out_free;
	}
	if (csv)
		fprintf(csv, "collective,library,transport,algo,nranks,size,count,type,redop,time_us,"
		             "algbw_gbs,busbw_gbs,wrong%s\n", mem_shown ? ",mem" : "");
	if (json) {
		bench_json_head(json, b, a);
		fprintf(json, ",\n \"rows\": [");
	}

	/* The timed loop reads whatever the send buffer holds: give it the pattern, so that no
	 * run is timed on denormals or NaNs, which are slow on some CPUs. */
	for (int m = 0; m < nm && c->fill; m++) {
		if (bench_bufs_fill(b, a, &max, &bufs[m])) {
			status = 1;
			goto out_free;
		}
	}

	if (rank0 && !a->quiet)
		bench_print_header(b, a);
	int64_t wrong_total = 0, wrong_mem[BENCH_MAX_MEMS] = {0};
	double busbw_sum[BENCH_MAX_ALGOS] = {0};
	int rows = 0, nsizes = 0; /* rows: one per size and column */
	for (size_t size = a->minbytes;;) {
		struct bench_shape s;
		c->shape(c->flags & BENCH_NO_DATA ? 0 : size / esize, b->size, &s);
		size_t bytes = s.total * esize;
		/* A size below what the collective can split would time nothing: skip it (-b 2 with
		 * float, or allgather of 8 bytes over 4 ranks). */
		if (s.total > 0 || (c->flags & BENCH_NO_DATA)) {
			double sec[BENCH_MAX_ALGOS], busbws[BENCH_MAX_ALGOS];
			/* wrong elements per memory kind, then summed over the ranks */
			int64_t mine[BENCH_MAX_MEMS] = {0}, wrongs[BENCH_MAX_MEMS] = {0}, wrong = 0;
			if (bench_time(b, a, &s, bufs, bytes, sec, mine) ||
			    (a->check == BENCH_CHECK_ONCE &&
			     bench_verify(b, a, &s, bufs, bytes, mine))) {
				status = 1;
				break;
			}
			if (a->check &&
			    b->allreduce(b, mine, wrongs, (size_t)nm, BENCH_I64, BENCH_SUM)) {
				bench_fail(b, "allreduce of #wrong", bytes);
				status = 1;
				break;
			}
			for (int m = 0; m < nm; m++) {
				wrong += wrongs[m];
				wrong_mem[m] += wrongs[m];
			}
			wrong_total += wrong;
			int na = bench_comparing(b) ? b->nalgos : 1;
			for (int k = 0; k < bench_nvariants(b); k++) {
				const char *algo = bench_comparing(b) ? b->algos[k % na] : b->algo;
				const char *mem = bench_mem_name(b->nmems ? b->mems[k / na] : NULL);
				double algbw = sec[k] > 0 ? (double)bytes / sec[k] / 1e9 : 0;
				double busbw = algbw * c->busbw_factor(b->size);
				busbw_sum[k] += busbw;
				busbws[k] = busbw;
				/* a CSV or JSON row of one kind counts what was wrong in that kind */
				int64_t row_wrong = nm > 1 ? wrongs[k / na] : wrong;
				if (rank0 && !a->quiet && !bench_comparing(b) && nm == 1)
					bench_print_row(a, bytes, s.total, sec[k] * 1e6, algbw, busbw, wrong);
				if (csv) {
					fprintf(csv, "%s,", c->name);
					bench_csv_field(csv, b->library);
					fputc(',', csv);
					bench_csv_field(csv, b->transport);
					fputc(',', csv);
					bench_csv_field(csv, algo);
					fprintf(csv, ",%d,%zu,%zu,%s,%s,%.6g,%.6g,%.6g,%lld", b->size, bytes,
					        s.total, bench_row_type(a), bench_row_redop(a), sec[k] * 1e6,
					        algbw, busbw, a->check ? (long long)row_wrong : -1LL);
					if (mem_shown)
						fprintf(csv, ",%s", mem);
					fputc('\n', csv);
				}
				if (json) {
					fprintf(json, "%s\n  {", rows ? "," : "");
					if (bench_comparing(b)) {
						fprintf(json, "\"algo\": ");
						bench_json_string(json, algo);
						fprintf(json, ", ");
					}
					if (mem_shown) {
						fprintf(json, "\"mem\": ");
						bench_json_string(json, mem);
						fprintf(json, ", ");
					}
					fprintf(json, "\"size\": %zu, \"count\": %zu, \"time_us\": %.6g, "
					              "\"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, \"wrong\": %lld}",
					        bytes, s.total, sec[k] * 1e6, algbw, busbw,
					        a->check ? (long long)row_wrong : -1LL);
				}
				rows++;
			}
			if (rank0 && !a->quiet && bench_comparing(b))
				bench_print_compare_row(b, a, bytes, s.total, sec, wrong);
			else if (rank0 && !a->quiet && nm > 1)
				bench_print_mems_row(a, bytes, s.total, sec, busbws, wrong);
			nsizes++;
		}
		if (c->flags & BENCH_NO_DATA)
			break;
		size_t next = bench_next_size(a, size);
		if (!next)
			break;
		size = next;
	}
	double avg_busbw = nsizes ? busbw_sum[0] / nsizes : 0.0;
	if (rank0 && !a->quiet && status == 0) {
		printf("# Out of bounds values : %lld %s", (long long)wrong_total,
		       wrong_total ? "FAILED" : "OK");
		for (int m = 0; nm > 1 && m < nm; m++)
			printf("%s%s %lld%s", m ? ", " : " (", bench_mem_name(b->mems[m]),
			       (long long)wrong_mem[m], m + 1 < nm ? "" : ")");
		printf("\n");
		if (bench_comparing(b)) {
			printf("# Avg bus bandwidth    :");
			for (int k = 0; k < b->nalgos; k++)
				printf(" %s %g%s", b->algos[k], nsizes ? busbw_sum[k] / nsizes : 0.0,
				       k + 1 < b->nalgos ? "," : "\n");
		} else if (nm > 1) {
			printf("# Avg bus bandwidth    :");
			for (int m = 0; m < nm; m++)
				printf(" %s %g%s", bench_mem_name(b->mems[m]),
				       nsizes ? busbw_sum[m] / nsizes : 0.0,
				       m + 1 < nm ? "," : "\n");
		} else {
			printf("# Avg bus bandwidth    : %g\n", avg_busbw);
		}
		printf("#\n");
	}
	if (wrong_total)
		status = 1;
	if (json)
		fprintf(json, "\n ],\n \"wrong_total\": %lld, \"avg_busbw_gbs\": %.6g, \"ok\": %s}\n",
		        a->check ? (long long)wrong_total : -1LL, avg_busbw,
		        status == 0 ? "true" : "false");
out_free:
	if (bench_close_out(b, "--csv", a->csv, csv) && status == 0)
		status = 1;
	if (bench_close_out(b, "--json", a->json, json) && status == 0)
		status = 1;
	for (int m = 0; m < nm; m++)
		bench_bufs_free(&bufs[m]);
	return status;
}

/* ---- several comms at once ---------------------------------------------------------------- */

/* Marks t finished (failed when status is not 0) and wakes whoever waits on the phase. */
static inline void bench_thread_end(struct bench_thread *t, int status)
{
	struct bench_phase *p = t->phase;
	pthread_mutex_lock(&p->mu);
	t->status = status;
	t->done = 1;
	if (status) {
		p->parties--; /* leave the gate: the others must not wait for this one */
		bench_gate_open_locked(p);
		if (!p->failed)
			p->failed = t->comm + 1;
	}
	p->finished++;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* One comm's part of a phase: the size's calls and their check, as bench_run makes them. */
static inline void bench_thread_run(struct bench_thread *t)
{
	struct bench_backend *b = t->b;
	const struct bench_args *a = &t->a;
	int64_t mine = 0;
	int status = 0;
	if (bench_time(b, a, t->s, t->bufs, t->bytes, &t->sec, &mine) ||
	    (a->check == BENCH_CHECK_ONCE && bench_verify(b, a, t->s, t->bufs, t->bytes, &mine)))
		status = -1;
	else if (a->check && b->allreduce(b, &mine, &t->wrong, 1, BENCH_I64, BENCH_SUM))
		status = bench_fail(b, "allreduce of #wrong", t->bytes);
	bench_thread_end(t, status);
}

static inline void *bench_thread_main(void *arg)
{
	bench_thread_run(arg);
	return NULL;
}

/*
 * Waits until the phase's k threads have finished: 0. After one failed, the others may still
 * finish their calls, since their peers on the other ranks make them too; -1 when none of
 * them has finished a call for BENCH_STALL_S, so that a failure never turns into a hang.
 */
static inline int bench_phase_wait(struct bench_phase *p, struct bench_thread *th, int k)
{
	unsigned long seen = 0;
	double quiet_since = 0;
	int watching = 0;
	pthread_mutex_lock(&p->mu);
	while (p->finished < k) {
		if (p->failed) {
			unsigned long beats = 0;
			for (int i = 0; i < k; i++)
				if (!th[i].done)
					beats += atomic_load_explicit(&th[i].beats, memory_order_relaxed);
			double now = bench_now();
			if (!watching || beats != seen) {
				watching = 1;
				seen = beats;
				quiet_since = now;
			} else if (now - quiet_since > BENCH_STALL_S) {
				pthread_mutex_unlock(&p->mu);
				return -1;
			}
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&p->cv, &p->mu, &ts);
	}
	pthread_mutex_unlock(&p->mu);
	return 0;
}

/*
 * One size on comms[0..k-1] at once, a thread each (k == 1: this thread), comm i on buffers
 * bufs[i]; th gets each comm's result. Returns 0, or the index + 1 of the first
 * comm that failed (its thread said why). A thread still stuck in a call BENCH_STALL_S after
 * another failed is not waited for: neither its comm nor the library could be freed under it,
 * so this names it and ends the process.
 */
static inline int bench_phase_run(struct bench_backend *const *comms, int k,
                                  const struct bench_args *a, const struct bench_shape *s,
                                  size_t bytes, const struct bench_bufs *bufs,
                                  struct bench_thread *th)
{
	struct bench_phase p = {.parties = k};
	int started[BENCH_MAX_COMMS] = {0};
	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.cv, NULL);
	for (int i = 0; i < k; i++) {
		struct bench_thread *t = &th[i];
		atomic_init(&t->beats, 0);
		t->phase = &p;
		t->comm = i;
		t->b = comms[i];
		t->a = *a;
		if (i > 0)
			t->a.progress_s = 0; /* one progress line at a time: comm 0's */
		t->s = s;
		t->bufs = &bufs[i];
		t->bytes = bytes;
		t->sec = 0;
		t->wrong = 0;
		t->status = 0;
		t->done = 0;
		comms[i]->thread = t;
	}
	if (k == 1) {
		bench_thread_run(&th[0]);
	} else {
		for (int i = 0; i < k; i++) {
			int e = pthread_create(&th[i].tid, NULL, bench_thread_main, &th[i]);
			if (e) {
				fprintf(stderr, "%s: rank %d: cannot start a thread for comm %d: %s\n",
				        comms[i]->prog, comms[i]->rank, i, strerror(e));
				bench_thread_end(&th[i], -1);
				continue;
			}
			started[i] = 1;
		}
		if (bench_phase_wait(&p, th, k)) {
			for (int i = 0; i < k; i++)
				if (!th[i].done)
					fprintf(stderr, "%s: rank %d: still inside a call at %zu bytes %d s "
					                "after comm %d failed, with no call finished since; "
					                "exiting without freeing the comms\n",
					        comms[i]->prog, comms[i]->rank, bytes, BENCH_STALL_S,
					        p.failed - 1);
			fflush(NULL);
			_exit(1);
		}
		for (int i = 0; i < k; i++)
			if (started[i])
				pthread_join(th[i].tid, NULL);
	}
	for (int i = 0; i < k; i++)
		comms[i]->thread = NULL;
	pthread_cond_destroy(&p.cv);
	pthread_mutex_destroy(&p.mu);
	return p.failed;
}

/* What a comm costs to make: the slowest rank's dup + free, and dup alone, in seconds. */
struct bench_dup_time {
	double median, min, max; /* dup + free */
	double dup_median;
};

/* BENCH_SPLIT_REPS dup + free pairs on b after an untimed one, each after a barrier. */
static inline int bench_time_dup(struct bench_backend *b, struct bench_dup_time *out)
{
	double mine[2 * BENCH_SPLIT_REPS], all[2 * BENCH_SPLIT_REPS];
	for (int i = -1; i < BENCH_SPLIT_REPS; i++) {
		struct bench_backend d;
		if (b->barrier(b))
			return bench_fail_call(b, "barrier before a timed comm split");
		double t0 = bench_now();
		if (b->dup(b, -1, &d))
			return bench_fail_call(b, b->dup_name);
		double t1 = bench_now();
		if (d.free_comm(&d))
			return -1;
		double t2 = bench_now();
		if (i >= 0) {
			mine[i] = t2 - t0;
			mine[BENCH_SPLIT_REPS + i] = t1 - t0;
		}
	}
	if (b->allreduce(b, mine, all, 2 * BENCH_SPLIT_REPS, BENCH_F64, BENCH_MAX))
		return bench_fail_call(b, "allreduce of the split times");
	out->min = out->max = all[0];
	for (int i = 1; i < BENCH_SPLIT_REPS; i++) {
		out->min = all[i] < out->min ? all[i] : out->min;
		out->max = all[i] > out->max ? all[i] : out->max;
	}
	out->median = bench_median(all, BENCH_SPLIT_REPS);
	out->dup_median = bench_median(&all[BENCH_SPLIT_REPS], BENCH_SPLIT_REPS);
	return 0;
}

static inline void bench_print_comms_header(const struct bench_backend *b,
                                            const struct bench_args *a, const int *ks, int nks,
                                            int maxk, const struct bench_dup_time *dt)
{
	bench_print_title(b, a);
	printf("# comms");
	for (int j = 0; j < nks; j++)
		printf("%c%d", j ? ',' : ' ', ks[j]);
	printf(": each size runs on K comms at once, a thread each, for every K in turn\n"
	       "# (K = 1: the job's comm; K > 1: comms over the same ranks made by %s of it)\n"
	       "# time ci, busbw ci: comm i's (its slowest rank's average per call); sum busbw: the\n"
	       "# K comms' busbw added", b->dup_name);
	if (nks > 1)
		printf("; vs K=%d: sum busbw / K = %d's at the same size", ks[0], ks[0]);
	printf("\n# %s + %s on %d rank%s: median %.3f ms (%s alone %.3f ms), min %.3f,\n"
	       "# max %.3f, of %d, each the slowest rank's\n#\n", b->dup_name, b->free_name,
	       b->size, b->size == 1 ? "" : "s", dt->median * 1e3, b->dup_name,
	       dt->dup_median * 1e3, dt->min * 1e3, dt->max * 1e3, BENCH_SPLIT_REPS);
	char vs[24];
	snprintf(vs, sizeof vs, "vs K=%d", ks[0]);
	printf("#%11s  %12s  %8s  %6s  %3s  %9s", "size", "count", "type", "redop", "K", "sum busbw");
	if (nks > 1)
		printf("  %7s", vs);
	printf("  %6s", "#wrong");
	for (int i = 0; i < maxk; i++) {
		char t[24], bw[24];
		snprintf(t, sizeof t, "time c%d", i);
		snprintf(bw, sizeof bw, "busbw c%d", i);
		printf("  %8s  %9s", t, bw);
	}
	printf("\n#%11s  %12s  %8s  %6s  %3s  %9s", "(B)", "(elements)", "", "", "", "(GB/s)");
	if (nks > 1)
		printf("  %7s", "");
	printf("  %6s", "");
	for (int i = 0; i < maxk; i++)
		printf("  %8s  %9s", "(us)", "(GB/s)");
	printf("\n");
	fflush(stdout);
}

/* vs < 0: no ratio column (one K); vs == 0 where there is nothing to compare (barrier). */
static inline void bench_print_comms_row(const struct bench_args *a, size_t bytes, size_t count,
                                         int k, double sum, double vs, int64_t wrong,
                                         const double *sec, const double *busbw)
{
	char t[32], w[32];
	printf("%12zu  %12zu  %8s  %6s  %3d  %9.2f", bytes, count, bench_row_type(a),
	       bench_row_redop(a), k, sum);
	if (vs > 0)
		printf("  %7.2f", vs);
	else if (vs == 0)
		printf("  %7s", "-");
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("  %6s", w);
	for (int i = 0; i < k; i++) {
		bench_format_time(t, sizeof t, sec[i] * 1e6);
		printf("  %8s  %9.2f", t, busbw[i]);
	}
	printf("\n");
	fflush(stdout);
}

/*
 * --comms: bench_run's sweep, each size run for every K of ks in turn on K comms at once, a
 * thread each: K = 1 is b itself, K > 1 the first K of max(ks) comms that b->dup makes before
 * the sweep, each with buffers of its own. Every comm's calls are timed and checked as
 * bench_run does it; a row (table, CSV, JSON) has each comm's time and busbw and their sum.
 * Also times the making of a comm (BENCH_SPLIT_REPS dup + free). Exit status as bench_run's.
 */
static inline int bench_run_comms(struct bench_backend *b, const struct bench_args *a,
                                  const int *ks, int nks)
{
	const struct bench_coll *c = a->coll;
	int rank0 = b->rank == 0;
	int refused = bench_can_run(b, a);
	if (refused)
		return refused;
	if (!b->dup || !b->free_comm) {
		if (rank0)
			fprintf(stderr, "%s: %s cannot make comms of its own\n", b->prog, b->library);
		return 2;
	}
	if (bench_nmems(b) > 1) {
		if (rank0)
			fprintf(stderr, "%s: several comms run on one memory kind at a time; give "
			                "one\n", b->prog);
		return 2;
	}
	const struct bench_mem *mem = b->nmems ? b->mems[0] : NULL;
	int maxk = 1;
	for (int j = 0; j < nks; j++)
		maxk = ks[j] > maxk ? ks[j] : maxk;
	int nsplit = maxk > 1 ? maxk : 0;

	int64_t bad[2] = {0, 0}, bad_all[2]; /* as in bench_run */
	FILE *csv = bench_open_out(b, "--csv", a->csv, &bad[1]);
	FILE *json = bench_open_out(b, "--json", a->json, &bad[1]);
	size_t esize = bench_dtype_size(a->dtype);
	struct bench_shape max;
	c->shape(c->flags & BENCH_NO_DATA ? 0 : a->maxbytes / esize, b->size, &max);
	struct bench_bufs bufs[BENCH_MAX_COMMS] = {0};
	for (int i = 0; i < maxk; i++) {
		if (bench_bufs_alloc(b, mem, max.send * esize, max.recv * esize, a->offset,
		                     &bufs[i])) {
			fprintf(stderr, "%s: rank %d: (those were the buffers of comm %d of %d; "
			                "lower -e or --comms)\n", b->prog, b->rank, i, maxk);
			bad[0] = 1;
			break;
		}
	}
	struct bench_backend split[BENCH_MAX_COMMS];
	struct bench_thread th[BENCH_MAX_COMMS];
	struct bench_dup_time dt = {0};
	int nmade = 0, status = 0;
	if (b->allreduce(b, bad, bad_all, 2, BENCH_I64, BENCH_SUM)) {
		bench_fail(b, "allreduce at start", 0);
		status = 1;
		goto out_free;
	}
	if (bad_all[0] || bad_all[1]) {
		status = bad_all[0] ? 1 : 2;
		goto out_free;
	}
	for (int i = 0; i < maxk && c->fill; i++) {
		if (bench_bufs_fill(b, a, &max, &bufs[i])) {
			status = 1;
			goto out_free;
		}
	}
	if (bench_time_dup(b, &dt)) {
		status = 1;
		goto out_free;
	}
	for (; nmade < nsplit; nmade++) {
		if (b->dup(b, nmade, &split[nmade])) {
			bench_fail_call(b, b->dup_name);
			status = 1;
			goto out_comms;
		}
	}

	if (rank0 && !a->quiet)
		bench_print_comms_header(b, a, ks, nks, maxk, &dt);
	if (csv)
		fprintf(csv, "collective,library,transport,algo,nranks,comms,comm,size,count,type,"
		             "redop,time_us,algbw_gbs,busbw_gbs,sum_busbw_gbs,wrong%s\n",
		        bench_mem_shown(b) ? ",mem" : "");
	if (json) {
		bench_json_head(json, b, a);
		fprintf(json, ",\n \"comms\": [");
		for (int j = 0; j < nks; j++)
			fprintf(json, "%s%d", j ? ", " : "", ks[j]);
		fprintf(json, "],\n \"comm_create\": {\"create\": ");
		bench_json_string(json, b->dup_name);
		fprintf(json, ", \"free\": ");
		bench_json_string(json, b->free_name);
		fprintf(json, ", \"reps\": %d, \"median_ms\": %.6g, \"create_median_ms\": %.6g, "
		              "\"min_ms\": %.6g, \"max_ms\": %.6g},\n \"rows\": [",
		        BENCH_SPLIT_REPS, dt.median * 1e3, dt.dup_median * 1e3, dt.min * 1e3,
		        dt.max * 1e3);
	}

	int64_t wrong_total = 0;
	double busbw_sum[BENCH_MAX_KS] = {0};
	int rows = 0, nsizes = 0;
	for (size_t size = a->minbytes;;) {
		struct bench_shape s;
		c->shape(c->flags & BENCH_NO_DATA ? 0 : size / esize, b->size, &s);
		size_t bytes = s.total * esize;
		if (s.total > 0 || (c->flags & BENCH_NO_DATA)) {
			double first = 0;
			for (int j = 0; j < nks; j++) {
				int k = ks[j];
				struct bench_backend *comms[BENCH_MAX_COMMS];
				for (int i = 0; i < k; i++)
					comms[i] = k == 1 ? b : &split[i];
				/* Every rank starts the K threads together. */
				if (b->barrier(b)) {
					bench_fail(b, "barrier before the comms start", bytes);
					status = 1;
					goto sweep_done;
				}
				int failed = bench_phase_run(comms, k, a, &s, bytes, bufs, th);
				if (failed) {
					fprintf(stderr, "%s: rank %d: stopping the sweep: comm %d of the %d "
					                "failed at %zu bytes\n", b->prog, b->rank, failed - 1, k,
					        bytes);
					status = 1;
					goto sweep_done;
				}
				double sec[BENCH_MAX_COMMS], algbw[BENCH_MAX_COMMS], busbw[BENCH_MAX_COMMS];
				double sum = 0;
				int64_t wrong = 0;
				for (int i = 0; i < k; i++) {
					sec[i] = th[i].sec;
					algbw[i] = sec[i] > 0 ? (double)bytes / sec[i] / 1e9 : 0;
					busbw[i] = algbw[i] * c->busbw_factor(b->size);
					sum += busbw[i];
					wrong += th[i].wrong;
				}
				if (j == 0)
					first = sum;
				wrong_total += wrong;
				busbw_sum[j] += sum;
				for (int i = 0; csv && i < k; i++) {
					fprintf(csv, "%s,", c->name);
					bench_csv_field(csv, b->library);
					fputc(',', csv);
					bench_csv_field(csv, b->transport);
					fputc(',', csv);
					bench_csv_field(csv, b->algo);
					fprintf(csv, ",%d,%d,%d,%zu,%zu,%s,%s,%.6g,%.6g,%.6g,%.6g,%lld",
					        b->size, k, i, bytes, s.total, bench_row_type(a),
					        bench_row_redop(a), sec[i] * 1e6, algbw[i], busbw[i], sum,
					        a->check ? (long long)th[i].wrong : -1LL);
					if (bench_mem_shown(b))
						fprintf(csv, ",%s", bench_mem_name(mem));
					fputc('\n', csv);
				}
				if (rank0 && !a->quiet)
					bench_print_comms_row(a, bytes, s.total, k, sum,
					                      nks < 2 ? -1 : first > 0 ? sum / first : 0,
					                      wrong, sec, busbw);
				if (json) {
					fprintf(json, "%s\n  {\"size\": %zu, \"count\": %zu, \"comms\": %d, "
					              "\"sum_busbw_gbs\": %.6g, \"wrong\": %lld, \"per_comm\": [",
					        rows ? "," : "", bytes, s.total, k, sum,
					        a->check ? (long long)wrong : -1LL);
					for (int i = 0; i < k; i++)
						fprintf(json, "%s{\"comm\": %d, \"time_us\": %.6g, "
						              "\"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, "
						              "\"wrong\": %lld}",
						        i ? ", " : "", i, sec[i] * 1e6, algbw[i], busbw[i],
						        a->check ? (long long)th[i].wrong : -1LL);
					fprintf(json, "]}");
				}
				rows++;
			}
			nsizes++;
		}
		if (c->flags & BENCH_NO_DATA)
			break;
		size_t next = bench_next_size(a, size);
		if (!next)
			break;
		size = next;
	}
sweep_done:
	if (rank0 && !a->quiet && status == 0) {
		printf("# Out of bounds values : %lld %s\n", (long long)wrong_total,
		       wrong_total ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    :");
		for (int j = 0; j < nks; j++)
			printf(" K=%d %g%s", ks[j], nsizes ? busbw_sum[j] / nsizes : 0.0,
			       j + 1 < nks ? "," : " (the sum over the K comms)\n");
		printf("#\n");
	}
	if (wrong_total)
		status = 1;
	if (json) {
		fprintf(json, "\n ],\n \"wrong_total\": %lld, \"avg_sum_busbw_gbs\": [",
		        a->check ? (long long)wrong_total : -1LL);
		for (int j = 0; j < nks; j++)
			fprintf(json, "%s%.6g", j ? ", " : "", nsizes ? busbw_sum[j] / nsizes : 0.0);
		fprintf(json, "], \"ok\": %s}\n", status == 0 ? "true" : "false");
	}
out_comms:
	for (int i = 0; i < nmade; i++)
		if (split[i].free_comm(&split[i]) && status == 0)
			status = 1;
out_free:
	if (bench_close_out(b, "--csv", a->csv, csv) && status == 0)
		status = 1;
	if (bench_close_out(b, "--json", a->json, json) && status == 0)
		status = 1;
	for (int i = 0; i < maxk; i++)
		bench_bufs_free(&bufs[i]);
	return status;
}

#endif /* KHOR_BENCH_COMMON_H */
