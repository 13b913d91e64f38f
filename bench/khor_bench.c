/*
 * khor_bench.c -- khor-bench, khor's collective benchmark in the manner of nccl-tests.
 *
 *   khorrun -np 4 khor-bench allreduce -b 8 -e 64M -f 2
 *   khorrun -np 4 khor-bench allgather --transport shm -d bfloat16 --check --json out.json
 *   khorrun -np 2 khor-bench allreduce --comms 1,2 -b 8 -e 64M -f 8388608
 *
 * It uses only the public API of khor.h, the way a user's program would, so what it measures
 * is what they get. The flags, the sweep, the checks and the output are in bench_common.h,
 * shared with the OpenMPI peer (peers/mpi_bench.c) so the two print comparable columns; this
 * file only joins the job and maps the benchmark's calls onto khor's.
 *
 * Started without khorrun it is a one-rank job (khor_init's rule), which is a quick way to
 * see that the library loads and the reduction kernels are right.
 *
 * --comms K runs every size on K comms at once, each made by khor_comm_split of the world and
 * driven by a thread of its own, to see what comms sharing the links get together (a list,
 * --comms 1,2, compares K values side by side); it also times khor_comm_split +
 * khor_comm_free. The threads and the rows are bench_run_comms'; here are only the split and
 * the free.
 *
 * khor-bench step (bench_step.h) is the other mode: a training step's gradients (ResNet-50's,
 * or 1000 small tensors) handed to the engine by a backprop thread, against one flat
 * khor_allreduce and one per tensor on the same bytes, with the engine's 8-byte latency and
 * negotiation cost and, with --sweep, its fusion threshold, cycle time and autotune.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "khor.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_step.h"

#define PROG "khor-bench"

static khor_dtype to_khor_dtype(enum bench_dtype d)
{
	switch (d) {
	case BENCH_F32: return KHOR_FLOAT32;
	case BENCH_F64: return KHOR_FLOAT64;
	case BENCH_I32: return KHOR_INT32;
	case BENCH_I64: return KHOR_INT64;
	case BENCH_F16: return KHOR_FLOAT16;
	case BENCH_BF16: return KHOR_BFLOAT16;
	case BENCH_I8: return KHOR_INT8;
	case BENCH_U8: return KHOR_UINT8;
	case BENCH_I16: return KHOR_INT16;
	}
	return KHOR_FLOAT32;
}

static khor_op to_khor_op(enum bench_op op)
{
	switch (op) {
	case BENCH_SUM: return KHOR_SUM;
	case BENCH_AVG: return KHOR_AVG;
	case BENCH_MIN: return KHOR_MIN;
	case BENCH_MAX: return KHOR_MAX;
	case BENCH_PROD: return KHOR_PROD;
	}
	return KHOR_SUM;
}

/*
 * The comm's error text is the whole story when the comm has one; a call refused before it
 * touched the comm (a bad argument) may leave it empty, so keep the status too.
 */
struct khor_ctx {
	khor_comm *comm;
	khor_status last;
	char label[64]; /* --comms: "khor-bench comm 1 (id 2)", the prog of a split comm */
};

static int kb_result(struct bench_backend *b, khor_status st)
{
	((struct khor_ctx *)b->ctx)->last = st;
	return st == KHOR_SUCCESS ? 0 : -1;
}

static int kb_allreduce(struct bench_backend *b, const void *sendbuf, void *recvbuf,
                        size_t count, enum bench_dtype dtype, enum bench_op op)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_allreduce(k->comm, sendbuf, recvbuf, count, to_khor_dtype(dtype),
	                                   to_khor_op(op)));
}

static int kb_broadcast(struct bench_backend *b, void *buf, size_t count, enum bench_dtype dtype,
                        int root)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_broadcast(k->comm, buf, count, to_khor_dtype(dtype), root));
}

static int kb_barrier(struct bench_backend *b)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_barrier(k->comm));
}

static int kb_reduce(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                     enum bench_dtype dtype, enum bench_op op, int root)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_reduce(k->comm, sendbuf, recvbuf, count, to_khor_dtype(dtype),
	                                to_khor_op(op), root));
}

static int kb_allgather(struct bench_backend *b, const void *sendbuf, void *recvbuf,
                        size_t count, enum bench_dtype dtype)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_allgather(k->comm, sendbuf, recvbuf, count, to_khor_dtype(dtype)));
}

static int kb_reduce_scatter(struct bench_backend *b, const void *sendbuf, void *recvbuf,
                             size_t count, enum bench_dtype dtype, enum bench_op op)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_reduce_scatter(k->comm, sendbuf, recvbuf, count,
	                                        to_khor_dtype(dtype), to_khor_op(op)));
}

static int kb_alltoall(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                       enum bench_dtype dtype)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_alltoall(k->comm, sendbuf, recvbuf, count, to_khor_dtype(dtype)));
}

static int kb_gather(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                     enum bench_dtype dtype, int root)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_gather(k->comm, sendbuf, recvbuf, count, to_khor_dtype(dtype),
	                                root));
}

static int kb_scatter(struct bench_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                      enum bench_dtype dtype, int root)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_scatter(k->comm, sendbuf, recvbuf, count, to_khor_dtype(dtype),
	                                 root));
}

static const char *kb_error(struct bench_backend *b)
{
	struct khor_ctx *k = b->ctx;
	const char *text = khor_comm_error(k->comm);
	return text && *text ? text : khor_strerror(k->last);
}

#define KHOR_USAGE                                                                          \
	"      --transport T     khor's links: tcp, shm, ib or auto (KHOR_TRANSPORT)\n"          \
	"      --algo A          khor's algorithm: ring, tree, rd, hd or auto (KHOR_ALGO);\n"    \
	"                        a list (ring,tree,rd,hd,auto) compares them in one job,\n"      \
	"                        their calls interleaved in rounds, one time column\n"           \
	"                        each (the median of the rounds)\n"                              \
	"      --comms K         run every size on K comms at once (1-64), each split from\n"    \
	"                        the world (K = 1: the world itself) and driven by a thread\n"   \
	"                        of its own: each comm's time and busbw and their sum; a\n"      \
	"                        list (1,2,4) runs each K in turn, side by side. Also times\n"   \
	"                        khor_comm_split + khor_comm_free (median of 21)\n"          \
	"  " PROG " step [flags]: a training step's gradients through the engine against\n"     \
	"                        the direct API (" PROG " step --help)\n"

static int kb_set_algo(struct bench_backend *b, const char *algo)
{
	struct khor_ctx *k = b->ctx;
	return kb_result(b, khor_comm_set(k->comm, "KHOR_ALGO", algo));
}

/*
 * --comms: a new comm over the same ranks in the same order, so that a pattern and a check
 * are the same on it as on the world. The label names it in every error line of its thread.
 */
static int kb_dup(struct bench_backend *b, int index, struct bench_backend *out)
{
	struct khor_ctx *k = b->ctx, *n = calloc(1, sizeof(*n));
	khor_comm *comm;

	if (n == NULL)
		return kb_result(b, KHOR_ERR_NO_MEMORY);
	khor_status st = khor_comm_split(k->comm, 0, b->rank, &comm);
	if (st != KHOR_SUCCESS) {
		free(n);
		return kb_result(b, st);
	}
	n->comm = comm;
	snprintf(n->label, sizeof(n->label), PROG " comm %d (id %lld)", index,
	         (long long)khor_comm_id(comm));
	*out = *b;
	out->ctx = n;
	out->prog = n->label;
	out->rank = khor_rank(comm);
	out->size = khor_size(comm);
	return 0;
}

static int kb_free_comm(struct bench_backend *b)
{
	struct khor_ctx *k = b->ctx;
	khor_status st = khor_comm_free(k->comm);

	if (st != KHOR_SUCCESS)
		fprintf(stderr, "%s: rank %d: khor_comm_free failed: %s\n", b->prog, b->rank,
		        khor_strerror(st));
	free(k);
	return st == KHOR_SUCCESS ? 0 : -1;
}

/* --comms K or a list of K: the comm counts to run, in order. */
static int comm_counts[BENCH_MAX_KS], comm_count_n;

static int split_comm_counts(const char *v)
{
	char list[256], *save = NULL;

	if (strlen(v) >= sizeof(list)) {
		fprintf(stderr, PROG ": --comms %s: too long\n", v);
		return -1;
	}
	strcpy(list, v);
	comm_count_n = 0;
	for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int k;
		if (comm_count_n == BENCH_MAX_KS) {
			fprintf(stderr, PROG ": --comms: at most %d counts\n", BENCH_MAX_KS);
			return -1;
		}
		if (bench_parse_int(t, 1, BENCH_MAX_COMMS, &k)) {
			fprintf(stderr, PROG ": bad value '%s' for --comms: it needs counts of 1 to %d, "
			        "like 2 or 1,2,4\n", t, BENCH_MAX_COMMS);
			return -1;
		}
		comm_counts[comm_count_n++] = k;
	}
	if (comm_count_n == 0) {
		fprintf(stderr, PROG ": --comms %s: no count in it\n", v);
		return -1;
	}
	return 0;
}

/* --algo a,b,c: the list to compare (nalgos > 1), or nothing for a single name. */
static char algo_list[256], algo_spec[256]; /* split in place; as given */
static const char *algo_names[BENCH_MAX_ALGOS];
static int algo_count;

/* Splits a comma list into algo_names; -1 after a usage error. */
static int split_algos(const char *v)
{
	if (strlen(v) >= sizeof(algo_list)) {
		fprintf(stderr, PROG ": --algo %s: too long\n", v);
		return -1;
	}
	strcpy(algo_list, v);
	strcpy(algo_spec, v);
	algo_count = 0;
	for (char *save = NULL, *t = strtok_r(algo_list, ",", &save); t;
	     t = strtok_r(NULL, ",", &save)) {
		if (algo_count == BENCH_MAX_ALGOS) {
			fprintf(stderr, PROG ": --algo: at most %d algorithms\n", BENCH_MAX_ALGOS);
			return -1;
		}
		algo_names[algo_count++] = t;
	}
	if (algo_count < 2) {
		fprintf(stderr, PROG ": --algo %s: a list needs two or more names\n", v);
		return -1;
	}
	return 0;
}

/*
 * khor's own flags, --algo NAME and --transport NAME, become KHOR_ALGO and KHOR_TRANSPORT
 * before init and are taken out of argv, so the shared parser (and mpi-bench) never see
 * them. Their values are checked by khor_init, the one place that knows them. --comms is
 * khor-bench's alone too (mpi-bench has no comm split): it is parsed here. Returns the new
 * argc, or -1 after printing a usage error.
 */
static int take_khor_flags(int argc, char **argv)
{
	static const struct { const char *flag, *var; } flags[] = {
		{ "--algo", "KHOR_ALGO" }, { "--transport", "KHOR_TRANSPORT" }, { "--comms", NULL },
	};
	int out = 1;

	for (int i = 1; i < argc; i++) {
		bool taken = false;
		for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]) && !taken; f++) {
			size_t fl = strlen(flags[f].flag);
			if (strncmp(argv[i], flags[f].flag, fl) != 0)
				continue;
			const char *v = NULL;
			if (argv[i][fl] == '=')
				v = argv[i] + fl + 1;
			else if (argv[i][fl] == '\0' && i + 1 < argc)
				v = argv[++i];
			else if (argv[i][fl] != '\0')
				continue;
			if (v == NULL || *v == '\0') {
				fprintf(stderr, PROG ": %s needs a value\n", flags[f].flag);
				bench_usage(stderr, PROG, KHOR_USAGE);
				return -1;
			}
			if (f == 2 || (f == 0 && strchr(v, ','))) {
				if (f == 2 ? split_comm_counts(v) : split_algos(v)) {
					bench_usage(stderr, PROG, KHOR_USAGE);
					return -1;
				}
			} else {
				setenv(flags[f].var, v, 1);
			}
			taken = true;
		}
		if (!taken)
			argv[out++] = argv[i];
	}
	argv[out] = NULL;
	return out;
}

/* khor-bench step (bench_step.h): its own flags, one run on the world comm. */
static int step_main(int argc, char **argv)
{
	struct step_args args;
	int rc = step_parse_args(argc, argv, &args);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (comm_count_n > 0 || algo_count > 1) {
		fprintf(stderr, PROG " step: --comms and a list of --algo do not apply to step\n");
		step_usage(stderr);
		return 2;
	}
	char err[1024] = "";
	khor_comm *world;
	khor_status st = khor_init(NULL, err, sizeof err, &world);
	if (st != KHOR_SUCCESS) {
		fprintf(stderr, PROG ": khor_init failed (%s): %s\n", khor_strerror(st),
		        *err ? err : "no detail");
		return st == KHOR_ERR_INVALID_ARG ? 2 : 1;
	}
	char library[64];
	snprintf(library, sizeof library, "khor %s", khor_version());
	int rank = khor_rank(world);
	rc = step_run(world, &args, library,
	              getenv("KHOR_TRANSPORT") ? getenv("KHOR_TRANSPORT") : "auto",
	              getenv("KHOR_ALGO") ? getenv("KHOR_ALGO") : "auto");
	st = khor_finalize(world);
	if (st != KHOR_SUCCESS) {
		fprintf(stderr, PROG ": rank %d: khor_finalize failed: %s\n", rank, khor_strerror(st));
		if (rc == 0)
			rc = 1;
	}
	return rc;
}

int main(int argc, char **argv)
{
	struct bench_args args;
	argc = take_khor_flags(argc, argv);
	if (argc < 0)
		return 2;
	if (argc >= 2 && strcmp(argv[1], "step") == 0)
		return step_main(argc, argv);
	int rc = bench_parse_args(argc, argv, PROG, KHOR_USAGE, &args);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (comm_count_n > 0 && algo_count > 1) {
		/* Each comm would switch algorithms in rounds of its own, out of step with the
		 * others: the rows would compare nothing. */
		fprintf(stderr, PROG ": --comms and a list of --algo cannot be combined; give one "
		        "algorithm\n");
		bench_usage(stderr, PROG, KHOR_USAGE);
		return 2;
	}

	char err[1024] = "";
	struct khor_ctx ctx = {0};
	khor_status st = khor_init(NULL, err, sizeof err, &ctx.comm);
	if (st != KHOR_SUCCESS) {
		fprintf(stderr, PROG ": khor_init failed (%s): %s\n", khor_strerror(st),
		        *err ? err : "no detail");
		/* A bad --transport or --algo value is refused here: a bad flag, so status 2. */
		return st == KHOR_ERR_INVALID_ARG ? 2 : 1;
	}
	char library[64];
	snprintf(library, sizeof library, "khor %s", khor_version());
	struct bench_backend b = {
		.prog = PROG,
		.library = library,
		.rank = khor_rank(ctx.comm),
		.size = khor_size(ctx.comm),
		.ctx = &ctx,
		.transport = getenv("KHOR_TRANSPORT") ? getenv("KHOR_TRANSPORT") : "auto",
		.algo = algo_count > 1 ? algo_spec : getenv("KHOR_ALGO") ? getenv("KHOR_ALGO") : "auto",
		.nalgos = algo_count,
		.set_algo = kb_set_algo,
		.allreduce = kb_allreduce,
		.broadcast = kb_broadcast,
		.barrier = kb_barrier,
		.reduce = kb_reduce,
		.allgather = kb_allgather,
		.reduce_scatter = kb_reduce_scatter,
		.alltoall = kb_alltoall,
		.gather = kb_gather,
		.scatter = kb_scatter,
		.error = kb_error,
		.dup = kb_dup,
		.free_comm = kb_free_comm,
		.dup_name = "khor_comm_split",
		.free_name = "khor_comm_free",
	};
	for (int k = 0; k < algo_count; k++) {
		b.algos[k] = algo_names[k];
		/* A bad name is a bad flag: refuse it before the sweep (every rank sees the same). */
		if (kb_set_algo(&b, algo_names[k])) {
			if (b.rank == 0)
				fprintf(stderr, PROG ": --algo: %s\n", kb_error(&b));
			khor_finalize(ctx.comm);
			return 2;
		}
	}
	rc = comm_count_n > 0 ? bench_run_comms(&b, &args, comm_counts, comm_count_n)
	                      : bench_run(&b, &args);
	st = khor_finalize(ctx.comm);
	if (st != KHOR_SUCCESS) {
		/* The comm is gone, so only the status is left to report. */
		fprintf(stderr, PROG ": rank %d: khor_finalize failed: %s\n", b.rank,
		        khor_strerror(st));
		if (rc == 0)
			rc = 1;
	}
	return rc;
}
