/*
 * bench_common.h -- the body of khor-bench and of its OpenMPI peer, mpi-bench.
 *
 * Both programs must print exactly the same columns, parse exactly the same flags and check
 * results the same way, or comparing them means nothing. So everything but the library calls
 * lives here: flag parsing (nccl-tests' flags), the table of collectives, the data patterns
 * and their checks, the timed sweep and the printing. A program supplies a bench_backend
 * (its rank, size and three collectives) and calls bench_run().
 *
 * This header includes neither khor.h nor mpi.h: khor-bench may use only khor's public API
 * and mpi-bench must never see khor at all. Every function is static inline so that a
 * program that does not use one does not trip -Wunused-function under -Werror. Programs
 * define _POSIX_C_SOURCE 200809L (clock_gettime, posix_memalign) before any include.
 *
 * Output, on rank 0 only (nccl-tests' layout):
 *
 *   # khor-bench allreduce: 4 ranks, dtype float, op sum, iters 20, warmup 5, check 1
 *   #
 *   #       size         count      type   redop     time   algbw   busbw  #wrong
 *   #        (B)    (elements)                       (us)  (GB/s)  (GB/s)
 *              8             2     float     sum    41.20    0.00    0.00       0
 *   ...
 *   # Out of bounds values : 0 OK
 *   # Avg bus bandwidth    : 1.234
 */
#ifndef KHOR_BENCH_COMMON_H
#define KHOR_BENCH_COMMON_H

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The benchmark's own dtype and op names; each backend maps them onto its library's. */
enum bench_dtype { BENCH_F32, BENCH_F64, BENCH_I32, BENCH_I64 };
enum bench_op { BENCH_SUM, BENCH_AVG, BENCH_MIN, BENCH_MAX, BENCH_PROD };

/*
 * What a program gives bench_run(). Each collective returns 0 on success and -1 on failure,
 * after which error() returns text that says why (khor_comm_error, MPI_Error_string). A
 * library that lacks a collective leaves its pointer NULL and bench_run() says so.
 */
struct bench_backend {
	const char *prog;    /* "khor-bench": the header's first word */
	const char *library; /* "khor 0.1.0", printed in the header */
	int rank;
	int size;
	void *ctx;
	int (*allreduce)(struct bench_backend *b, const void *sendbuf, void *recvbuf,
	                 size_t count, enum bench_dtype dtype, enum bench_op op);
	int (*broadcast)(struct bench_backend *b, void *buf, size_t count,
	                 enum bench_dtype dtype, int root);
	int (*barrier)(struct bench_backend *b);
	const char *(*error)(struct bench_backend *b);
};

struct bench_args {
	const struct bench_coll *coll;
	size_t minbytes;
	size_t maxbytes;
	size_t stepfactor; /* used when stepbytes is 0 */
	size_t stepbytes;
	int iters;
	int warmup;
	int check;
	enum bench_dtype dtype;
	enum bench_op op;
	int root;
	const char *csv;
};

/*
 * One collective of the sweep. fill() writes the inputs of the checked iteration, check()
 * counts wrong output elements on this rank, run() is one call of the collective; all three
 * get the same count, which is elements per rank as nccl-tests defines it for that
 * collective. available() says whether the backend provides the call. Today send and
 * receive buffers hold count elements each; allgather will need a receive buffer n times
 * larger, which is the field to add to this struct when it comes.
 * reducescatter, reduce, allgather and alltoall slot in as new rows of bench_colls[].
 */
#define BENCH_USES_OP 1u   /* the header and rows print the op */
#define BENCH_USES_ROOT 2u /* -r applies */
#define BENCH_NO_DATA 4u   /* barrier: one row, no sizes, no data */

struct bench_coll {
	const char *name;
	unsigned flags;
	int (*available)(const struct bench_backend *b); /* does the library have it? */
	double (*busbw_factor)(int nranks);
	int (*run)(struct bench_backend *b, const struct bench_args *a, void *sendbuf,
	           void *recvbuf, size_t count);
	void (*fill)(const struct bench_backend *b, const struct bench_args *a, void *sendbuf,
	             void *recvbuf, size_t count);
	int64_t (*check)(const struct bench_backend *b, const struct bench_args *a,
	                 const void *recvbuf, size_t count);
};

/* ---- dtypes and ops ----------------------------------------------------------------------- */

static inline size_t bench_dtype_size(enum bench_dtype d)
{
	return d == BENCH_F32 || d == BENCH_I32 ? 4 : 8;
}

static inline const char *bench_dtype_name(enum bench_dtype d)
{
	static const char *const names[] = {"float", "double", "int32", "int64"};
	return names[d];
}

static inline const char *bench_op_name(enum bench_op op)
{
	static const char *const names[] = {"sum", "avg", "min", "max", "prod"};
	return names[op];
}

static inline int bench_parse_dtype(const char *s, enum bench_dtype *out)
{
	static const struct { const char *name; enum bench_dtype d; } map[] = {
		{"float", BENCH_F32}, {"float32", BENCH_F32}, {"f32", BENCH_F32},
		{"double", BENCH_F64}, {"float64", BENCH_F64}, {"f64", BENCH_F64},
		{"int32", BENCH_I32}, {"i32", BENCH_I32}, {"int", BENCH_I32},
		{"int64", BENCH_I64}, {"i64", BENCH_I64},
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

/* All pattern values are small integers, so they convert to and from double exactly. */
static inline void bench_set(void *buf, enum bench_dtype d, size_t i, double v)
{
	switch (d) {
	case BENCH_F32: ((float *)buf)[i] = (float)v; break;
	case BENCH_F64: ((double *)buf)[i] = v; break;
	case BENCH_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case BENCH_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
	}
}

static inline double bench_get(const void *buf, enum bench_dtype d, size_t i)
{
	switch (d) {
	case BENCH_F32: return ((const float *)buf)[i];
	case BENCH_F64: return ((const double *)buf)[i];
	case BENCH_I32: return ((const int32_t *)buf)[i];
	case BENCH_I64: return (double)((const int64_t *)buf)[i];
	}
	return 0;
}

/* ---- data patterns ------------------------------------------------------------------------ */

/*
 * The patterns keep every input, partial result and final result a small integer, so a sum in
 * float is exact in any reduction order: with period P = 1021 a sum over n ranks is at most
 * n(n+1)/2 + n*P, below 2^24 for n up to ~4000. The index term catches misplaced chunks; the
 * rank term catches a rank whose data went missing or was counted twice.
 */
#define BENCH_PERIOD 1021
#define BENCH_SENTINEL (-12345.0) /* written to outputs first; no pattern ever produces it */

static inline double bench_pattern(enum bench_op op, int rank, int n, size_t i)
{
	double k = (double)(i % BENCH_PERIOD);
	switch (op) {
	case BENCH_SUM:
	case BENCH_AVG:
		return k + rank + 1;
	case BENCH_MIN:
	case BENCH_MAX:
		return k + (double)((rank + i) % (size_t)n);
	case BENCH_PROD:
		/* Mostly ones, so the product cannot overflow: one rank per index contributes a
		 * small factor and, with two ranks or more, another contributes -1. */
		if ((size_t)rank == i % (size_t)n)
			return (double)(i % 7 + 2);
		if (n > 1 && (size_t)rank == (i + 1) % (size_t)n)
			return -1;
		return 1;
	}
	return 0;
}

/* The exact reduced value of bench_pattern over n ranks at index i. */
static inline double bench_expected(enum bench_op op, enum bench_dtype d, int n, size_t i)
{
	double k = (double)(i % BENCH_PERIOD);
	double sum = (double)n * k + (double)n * (n + 1) / 2;
	switch (op) {
	case BENCH_SUM: return sum;
	case BENCH_AVG:
		/* khor.h: integer avg is the sum divided by n, truncated toward zero. */
		if (d == BENCH_I32 || d == BENCH_I64)
			return (double)((int64_t)sum / n);
		return sum / n;
	case BENCH_MIN: return k;
	case BENCH_MAX: return k + n - 1;
	case BENCH_PROD: return n > 1 ? -(double)(i % 7 + 2) : (double)(i % 7 + 2);
	}
	return 0;
}

/*
 * Exact comparison, except avg in floating point: sum/n need not be representable and a
 * library may multiply by 1/n instead of dividing, so a few ulps of difference are right.
 */
static inline int bench_mismatch(enum bench_op op, enum bench_dtype d, double got, double want)
{
	/* Written without libm so that neither program needs -lm. */
	if (op == BENCH_AVG && (d == BENCH_F32 || d == BENCH_F64)) {
		double mag = want < 0 ? -want : want, diff = got - want;
		double tol = (d == BENCH_F32 ? 1e-6 : 1e-14) * (mag > 1.0 ? mag : 1.0);
		return !(diff <= tol && -diff <= tol); /* a NaN is a mismatch too */
	}
	return got != want;
}

static inline void bench_fill_sentinel(void *buf, enum bench_dtype d, size_t count)
{
	for (size_t i = 0; i < count; i++)
		bench_set(buf, d, i, BENCH_SENTINEL);
}

/* ---- the collectives ---------------------------------------------------------------------- */

static inline double bench_factor_allreduce(int n)
{
	return n > 1 ? 2.0 * (n - 1) / n : 0.0;
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

static inline int bench_run_allreduce(struct bench_backend *b, const struct bench_args *a,
                                      void *sendbuf, void *recvbuf, size_t count)
{
	/* Out of place, as nccl-tests' default: the input stays valid for every iteration. */
	return b->allreduce(b, sendbuf, recvbuf, count, a->dtype, a->op);
}

static inline void bench_fill_allreduce(const struct bench_backend *b,
                                        const struct bench_args *a, void *sendbuf,
                                        void *recvbuf, size_t count)
{
	for (size_t i = 0; i < count; i++)
		bench_set(sendbuf, a->dtype, i, bench_pattern(a->op, b->rank, b->size, i));
	bench_fill_sentinel(recvbuf, a->dtype, count);
}

static inline int64_t bench_check_allreduce(const struct bench_backend *b,
                                            const struct bench_args *a, const void *recvbuf,
                                            size_t count)
{
	int64_t wrong = 0;
	for (size_t i = 0; i < count; i++) {
		double want = bench_expected(a->op, a->dtype, b->size, i);
		wrong += bench_mismatch(a->op, a->dtype, bench_get(recvbuf, a->dtype, i), want);
	}
	return wrong;
}

/* Broadcast is in place on recvbuf: the root's data in it, every other rank's overwritten. */
static inline int bench_run_broadcast(struct bench_backend *b, const struct bench_args *a,
                                      void *sendbuf, void *recvbuf, size_t count)
{
	(void)sendbuf;
	return b->broadcast(b, recvbuf, count, a->dtype, a->root);
}

static inline double bench_bcast_value(int root, size_t i)
{
	return (double)((i * 7) % BENCH_PERIOD) + root;
}

static inline void bench_fill_broadcast(const struct bench_backend *b,
                                        const struct bench_args *a, void *sendbuf,
                                        void *recvbuf, size_t count)
{
	(void)sendbuf;
	if (b->rank != a->root) {
		bench_fill_sentinel(recvbuf, a->dtype, count);
		return;
	}
	for (size_t i = 0; i < count; i++)
		bench_set(recvbuf, a->dtype, i, bench_bcast_value(a->root, i));
}

static inline int64_t bench_check_broadcast(const struct bench_backend *b,
                                            const struct bench_args *a, const void *recvbuf,
                                            size_t count)
{
	(void)b;
	int64_t wrong = 0;
	for (size_t i = 0; i < count; i++)
		wrong += bench_get(recvbuf, a->dtype, i) != bench_bcast_value(a->root, i);
	return wrong;
}

static inline int bench_run_barrier(struct bench_backend *b, const struct bench_args *a,
                                    void *sendbuf, void *recvbuf, size_t count)
{
	(void)a, (void)sendbuf, (void)recvbuf, (void)count;
	return b->barrier(b);
}

static inline int bench_has_allreduce(const struct bench_backend *b)
{
	return b->allreduce != NULL;
}

static inline int bench_has_broadcast(const struct bench_backend *b)
{
	return b->broadcast != NULL;
}

static inline int bench_has_barrier(const struct bench_backend *b)
{
	return b->barrier != NULL;
}

static const struct bench_coll bench_colls[] = {
	{"allreduce", BENCH_USES_OP, bench_has_allreduce, bench_factor_allreduce,
	 bench_run_allreduce, bench_fill_allreduce, bench_check_allreduce},
	{"broadcast", BENCH_USES_ROOT, bench_has_broadcast, bench_factor_one, bench_run_broadcast,
	 bench_fill_broadcast, bench_check_broadcast},
	{"barrier", BENCH_NO_DATA, bench_has_barrier, bench_factor_zero, bench_run_barrier, NULL,
	 NULL},
};
#define BENCH_NCOLLS (sizeof bench_colls / sizeof bench_colls[0])

/* ---- flags -------------------------------------------------------------------------------- */

static inline void bench_usage(FILE *f, const char *prog)
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
	           "  -c, --check 0|1       verify results in one extra iteration (default 1)\n"
	           "  -d, --datatype T      float|float32|f32, double|float64|f64, int32, int64\n"
	           "                        (default float)\n"
	           "  -o, --op OP           sum, avg, min, max, prod (default sum)\n"
	           "  -r, --root R          broadcast root (default 0)\n"
	           "      --csv FILE        also write the rows as CSV to FILE (rank 0)\n"
	           "  -h, --help            this text\n"
	           "SIZE takes a K, M or G suffix (powers of 1024), e.g. 64M.\n"
	           "Sizes are in bytes per rank and rounded down to whole elements; time is\n"
	           "the slowest rank's average per iteration, busbw as in nccl-tests.\n");
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

/*
 * Fills *a from argv. Returns 0 to run, 1 when -h printed the usage (exit 0), 2 on a bad
 * command line after saying why and printing the usage on stderr (exit 2). Runs before the
 * job is joined, so a typo never leaves the other ranks waiting.
 */
static inline int bench_parse_args(int argc, char **argv, const char *prog,
                                   struct bench_args *a)
{
	static const struct option longopts[] = {
		{"minbytes", required_argument, NULL, 'b'},
		{"maxbytes", required_argument, NULL, 'e'},
		{"stepfactor", required_argument, NULL, 'f'},
		{"stepbytes", required_argument, NULL, 'i'},
		{"iters", required_argument, NULL, 'n'},
		{"warmup_iters", required_argument, NULL, 'w'},
		{"check", required_argument, NULL, 'c'},
		{"datatype", required_argument, NULL, 'd'},
		{"op", required_argument, NULL, 'o'},
		{"root", required_argument, NULL, 'r'},
		{"csv", required_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	*a = (struct bench_args){
		.minbytes = 8, .maxbytes = 64u << 20, .stepfactor = 2, .iters = 20, .warmup = 5,
		.check = 1, .dtype = BENCH_F32, .op = BENCH_SUM,
	};
	int op_given = 0, root_given = 0, c;
	opterr = 0; /* we name the bad flag ourselves, with the usage after it */
	while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:r:h", longopts, NULL)) != -1) {
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
			if (bench_parse_int(optarg, 0, 1, &a->check))
				need = "0 or 1";
			break;
		case 'd':
			if (bench_parse_dtype(optarg, &a->dtype))
				need = "float, double, int32 or int64";
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
		case 'C':
			a->csv = optarg;
			break;
		case 'h':
			bench_usage(stdout, prog);
			return 1;
		case ':':
			fprintf(stderr, "%s: %s needs a value\n", prog, argv[optind - 1]);
			bench_usage(stderr, prog);
			return 2;
		default:
			if (optopt)
				fprintf(stderr, "%s: unknown flag -%c\n", prog, optopt);
			else
				fprintf(stderr, "%s: unknown flag %s\n", prog, argv[optind - 1]);
			bench_usage(stderr, prog);
			return 2;
		}
		if (need) {
			fprintf(stderr, "%s: bad value '%s' for -%c: it needs %s\n", prog, optarg, c,
			        need);
			bench_usage(stderr, prog);
			return 2;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr, "%s: %s\n", prog,
		        optind >= argc ? "which collective? name one" : "name exactly one collective");
		bench_usage(stderr, prog);
		return 2;
	}
	for (size_t i = 0; i < BENCH_NCOLLS; i++)
		if (strcmp(argv[optind], bench_colls[i].name) == 0)
			a->coll = &bench_colls[i];
	if (!a->coll) {
		fprintf(stderr, "%s: unknown collective '%s'\n", prog, argv[optind]);
		bench_usage(stderr, prog);
		return 2;
	}
	if (a->minbytes > a->maxbytes) {
		fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", prog, a->minbytes, a->maxbytes);
		bench_usage(stderr, prog);
		return 2;
	}
	/* Refuse flags that would be silently ignored: a user who wrote -o max on a broadcast
	 * believes they measured something they did not. */
	if (op_given && !(a->coll->flags & BENCH_USES_OP)) {
		fprintf(stderr, "%s: -o does not apply to %s\n", prog, a->coll->name);
		bench_usage(stderr, prog);
		return 2;
	}
	if (root_given && !(a->coll->flags & BENCH_USES_ROOT)) {
		fprintf(stderr, "%s: -r does not apply to %s\n", prog, a->coll->name);
		bench_usage(stderr, prog);
		return 2;
	}
	return 0;
}

/* ---- timing and printing ------------------------------------------------------------------ */

static inline double bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void bench_print_header(const struct bench_backend *b, const struct bench_args *a)
{
	printf("# %s %s: %d rank%s, ", b->prog, a->coll->name, b->size, b->size == 1 ? "" : "s");
	if (!(a->coll->flags & BENCH_NO_DATA))
		printf("dtype %s, ", bench_dtype_name(a->dtype));
	if (a->coll->flags & BENCH_USES_OP)
		printf("op %s, ", bench_op_name(a->op));
	if (a->coll->flags & BENCH_USES_ROOT)
		printf("root %d, ", a->root);
	printf("iters %d, warmup %d, check %d\n", a->iters, a->warmup, a->check);
	printf("# library: %s\n", b->library);
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

static inline void bench_print_row(const struct bench_args *a, size_t bytes, size_t count,
                                   double us, double algbw, double busbw, int64_t wrong)
{
	const char *type = a->coll->flags & BENCH_NO_DATA ? "none" : bench_dtype_name(a->dtype);
	const char *redop = a->coll->flags & BENCH_USES_OP ? bench_op_name(a->op) : "none";
	char t[32], w[32];
	bench_format_time(t, sizeof t, us);
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6s\n", bytes, count, type, redop, t,
	       algbw, busbw, w);
	fflush(stdout); /* one line per size is the progress report of a long sweep */
}

/* ---- the sweep ---------------------------------------------------------------------------- */

/* Says which call failed and why, on the rank that saw it. */
static inline int bench_fail(struct bench_backend *b, const char *what, size_t bytes)
{
	fprintf(stderr, "%s: rank %d: %s failed at %zu bytes: %s\n", b->prog, b->rank, what, bytes,
	        b->error(b));
	return -1;
}

/*
 * Times iters calls after warmup calls. Returns the slowest rank's average seconds per call,
 * as nccl-tests does: a barrier lines the ranks up, each times its own loop, and the maximum
 * over ranks is what a synchronous training step would see.
 */
static inline int bench_time(struct bench_backend *b, const struct bench_args *a, void *sendbuf,
                             void *recvbuf, size_t count, size_t bytes, double *sec_out)
{
	const struct bench_coll *c = a->coll;
	/* Warm-up at every size, not once at the largest as nccl-tests does: khor picks its
	 * algorithm per size and a first call may set up links or buffers for that choice. */
	for (int i = 0; i < a->warmup; i++)
		if (c->run(b, a, sendbuf, recvbuf, count))
			return bench_fail(b, c->name, bytes);
	if (b->barrier(b))
		return bench_fail(b, "barrier before the timed loop", bytes);
	double t0 = bench_now();
	for (int i = 0; i < a->iters; i++)
		if (c->run(b, a, sendbuf, recvbuf, count))
			return bench_fail(b, c->name, bytes);
	double mine = (bench_now() - t0) / a->iters, slowest;
	if (b->allreduce(b, &mine, &slowest, 1, BENCH_F64, BENCH_MAX))
		return bench_fail(b, "allreduce of the times", bytes);
	*sec_out = slowest;
	return 0;
}

/* One checked call after the timed loop; returns the number of wrong elements on all ranks. */
static inline int bench_verify(struct bench_backend *b, const struct bench_args *a,
                               void *sendbuf, void *recvbuf, size_t count, size_t bytes,
                               int64_t *wrong_out)
{
	const struct bench_coll *c = a->coll;
	int64_t mine = 0, total;
	if (c->fill) {
		c->fill(b, a, sendbuf, recvbuf, count);
		if (c->run(b, a, sendbuf, recvbuf, count))
			return bench_fail(b, c->name, bytes);
		mine = c->check(b, a, recvbuf, count);
	}
	if (b->allreduce(b, &mine, &total, 1, BENCH_I64, BENCH_SUM))
		return bench_fail(b, "allreduce of #wrong", bytes);
	*wrong_out = total;
	return 0;
}

static inline void *bench_alloc(size_t bytes)
{
	void *p = NULL;
	/* Page-aligned, like the buffers a framework hands over; at least one page so that a
	 * zero-size run still has valid pointers. */
	if (posix_memalign(&p, 4096, bytes ? bytes : 4096))
		return NULL;
	memset(p, 0, bytes); /* fault every page in now, not inside the first timed loop */
	return p;
}

/*
 * Runs the whole sweep and prints it on rank 0. Returns the process exit status: 0 when every
 * call succeeded and every result was right, 1 otherwise, 2 for a bad flag that only the
 * joined job can detect (a root outside the job, a CSV file that cannot be opened).
 */
static inline int bench_run(struct bench_backend *b, const struct bench_args *a)
{
	const struct bench_coll *c = a->coll;
	int rank0 = b->rank == 0;
	/* Every sweep needs barrier and allreduce for its timing, whatever it measures. */
	if (!c->available(b) || !b->barrier || !b->allreduce) {
		if (rank0)
			fprintf(stderr, "%s: %s does not provide %s\n", b->prog, b->library, c->name);
		return 2;
	}
	if ((c->flags & BENCH_USES_ROOT) && a->root >= b->size) {
		if (rank0)
			fprintf(stderr, "%s: -r %d is not a rank of this %d-rank job\n", b->prog,
			        a->root, b->size);
		return 2;
	}
	/* Every rank decides together whether to start, so that a rank whose buffers or CSV
	 * file failed does not leave the others blocked in the first collective. */
	FILE *csv = NULL;
	int64_t bad[2] = {0, 0}, bad_all[2]; /* ranks without buffers, a CSV file that failed */
	if (rank0 && a->csv) {
		csv = fopen(a->csv, "w");
		if (!csv) {
			fprintf(stderr, "%s: cannot open --csv %s: %s\n", b->prog, a->csv, strerror(errno));
			bad[1] = 1;
		}
	}
	size_t esize = bench_dtype_size(a->dtype);
	size_t maxbytes = c->flags & BENCH_NO_DATA ? 0 : a->maxbytes / esize * esize;
	void *sendbuf = bench_alloc(maxbytes), *recvbuf = bench_alloc(maxbytes);
	if (!sendbuf || !recvbuf) {
		fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes; lower -e\n", b->prog,
		        b->rank, maxbytes);
		bad[0] = 1;
	}
	int status = 0;
	if (b->allreduce(b, bad, bad_all, 2, BENCH_I64, BENCH_SUM)) {
		bench_fail(b, "allreduce at start", 0);
		status = 1;
		goto out_free;
	}
	if (bad_all[0] || bad_all[1]) {
		status = bad_all[0] ? 1 : 2; /* a CSV path is a flag; memory is not */
		goto out_free;
	}
	if (csv)
		fprintf(csv, "collective,library,nranks,size,count,type,redop,time_us,algbw_gbs,"
		             "busbw_gbs,wrong\n");

	/* The timed loop reads whatever the send buffer holds: give it the pattern, so that no
	 * run is timed on denormals or NaNs, which are slow on some CPUs. */
	if (c->fill)
		c->fill(b, a, sendbuf, recvbuf, maxbytes / esize);

	if (rank0)
		bench_print_header(b, a);
	int64_t wrong_total = 0;
	double busbw_sum = 0;
	int rows = 0;
	for (size_t size = a->minbytes;;) {
		size_t count = c->flags & BENCH_NO_DATA ? 0 : size / esize;
		size_t bytes = count * esize;
		/* A size below one element would time nothing: skip it (-b 2 with float). */
		if (count > 0 || (c->flags & BENCH_NO_DATA)) {
			double sec;
			int64_t wrong = 0;
			if (bench_time(b, a, sendbuf, recvbuf, count, bytes, &sec) ||
			    (a->check && bench_verify(b, a, sendbuf, recvbuf, count, bytes, &wrong))) {
				status = 1;
				break;
			}
			double algbw = sec > 0 ? (double)bytes / sec / 1e9 : 0;
			double busbw = algbw * c->busbw_factor(b->size);
			wrong_total += wrong;
			busbw_sum += busbw;
			rows++;
			if (rank0) {
				bench_print_row(a, bytes, count, sec * 1e6, algbw, busbw, wrong);
				if (csv)
					fprintf(csv, "%s,%s,%d,%zu,%zu,%s,%s,%.6g,%.6g,%.6g,%lld\n", c->name,
					        b->library, b->size, bytes, count,
					        c->flags & BENCH_NO_DATA ? "none" : bench_dtype_name(a->dtype),
					        c->flags & BENCH_USES_OP ? bench_op_name(a->op) : "none",
					        sec * 1e6, algbw, busbw, a->check ? (long long)wrong : -1LL);
			}
		}
		if (c->flags & BENCH_NO_DATA)
			break;
		/* Stop before the next size would pass -e or overflow. */
		size_t next = a->stepbytes ? size + a->stepbytes : size * a->stepfactor;
		if (size == 0 && !a->stepbytes)
			next = 1; /* -b 0 with a factor would loop forever on 0 */
		if (next <= size || next > a->maxbytes)
			break;
		size = next;
	}
	if (rank0 && status == 0) {
		printf("# Out of bounds values : %lld %s\n", (long long)wrong_total,
		       wrong_total ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    : %g\n", rows ? busbw_sum / rows : 0.0);
		printf("#\n");
	}
	if (wrong_total)
		status = 1;
out_free:
	if (csv && fclose(csv)) {
		fprintf(stderr, "%s: writing --csv %s: %s\n", b->prog, a->csv, strerror(errno));
		status = 1;
	}
	free(sendbuf);
	free(recvbuf);
	return status;
}

#endif /* KHOR_BENCH_COMMON_H */
