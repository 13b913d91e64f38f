/*
 * khor_bench.c -- khor-bench, khor's collective benchmark in the manner of nccl-tests.
 *
 *   khorrun -np 4 khor-bench allreduce -b 8 -e 64M -f 2
 *   khorrun -np 4 khor-bench allgather --transport shm -d bfloat16 --check --json out.json
 *   khorrun -np 2 khor-bench allreduce --comms 1,2 -b 8 -e 64M -f 8388608
 *
 * It uses only the public API of khor.h, the way a user's program would, so what it measures
 * is what they get. The flags, the sweep, the checks and the output are in bench_*.c (bench.h),
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
 * khor-bench step (step.h) is the other mode: a training step's gradients (ResNet-50's,
 * or 1000 small tensors) handed to the engine by a backprop thread, against one flat
 * khor_allreduce and one per tensor on the same bytes, with the engine's 8-byte latency and
 * negotiation cost and, with --sweep, its fusion threshold, cycle time and autotune.
 *
 * --mem cuda puts the buffers on the GPU (device = local rank % device count), --mem both
 * times host and device buffers side by side, in alternating rounds at every size, with the
 * ratio of their busbw: on a shared machine only a ratio measured that way means anything.
 * The patterns are written and checked on the CPU and copied, outside the timed calls
 * (bench_bufs.c).
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "khor.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_args.h"
#include "bench_comms.h"
#include "bench_sweep.h"
#include "step_args.h"
#include "step_run.h"

#define PROG "khor-bench"
/* --mem cuda|both where no GPU is usable: a skip, as CTest and automake count one. */
#define EXIT_NO_GPU 77

/*
 * ---- --mem cuda: device buffers through the CUDA driver, loaded at run time ----------------
 *
 * khor-bench links no CUDA: it must build without a toolkit and run where there is no
 * driver, and a host run must not pay for CUDA's start-up. So libcuda.so.1 is opened only for
 * --mem cuda|both, and the few types its calls take are declared here as the driver's ABI
 * has them (cuda.h is not on this program's include path): CUresult and CUdevice are ints,
 * CUdeviceptr is 64 bits, CUcontext a pointer. Each symbol is the entry point that cuda.h
 * maps the call to (cuMemAlloc is cuMemAlloc_v2), as libkhor's own loader does. The buffers
 * are plain cuMemAlloc memory in the device's primary context, which is what cudaMalloc and
 * torch give a user, and what libkhor finds by itself for every call.
 */
typedef int cu_result; /* CUresult; 0 is CUDA_SUCCESS */
typedef int cu_device;
typedef struct cu_ctx_st *cu_context;
typedef unsigned long long cu_deviceptr;

static struct cu_driver {
	cu_result (*init)(unsigned flags);
	cu_result (*device_get_count)(int *count);
	cu_result (*device_get)(cu_device *dev, int ordinal);
	cu_result (*device_get_name)(char *name, int len, cu_device dev);
	cu_result (*primary_ctx_retain)(cu_context *ctx, cu_device dev);
	cu_result (*ctx_set_current)(cu_context ctx);
	cu_result (*mem_alloc)(cu_deviceptr *p, size_t bytes);
	cu_result (*mem_free)(cu_deviceptr p);
	cu_result (*memcpy_htod)(cu_deviceptr dst, const void *src, size_t bytes);
	cu_result (*memcpy_dtoh)(void *dst, cu_deviceptr src, size_t bytes);
	cu_result (*get_error_string)(cu_result r, const char **text);
	int count;          /* devices, once cuda_probe succeeded */
	cu_context ctx;     /* this rank's device's primary context; NULL: see why */
	char why[400];      /* why this rank has no device (cuda_open failed) */
	char where[160];    /* the header's words: "cuda device 0 (NVIDIA H200)" */
} cu;

/* The driver's message for r, or its number where the driver has none. */
static const char *cu_text(cu_result r)
{
	static _Thread_local char num[48];
	const char *text = NULL;

	if (cu.get_error_string && cu.get_error_string(r, &text) == 0 && text)
		return text;
	snprintf(num, sizeof num, "CUDA driver error %d", r);
	return num;
}

/*
 * Before khor_init: can this process use a GPU at all? 0, or -1 with the reason in why.
 * Every rank asks for itself, so a job without a GPU stops before it joins (exit 77) instead
 * of failing in its first collective.
 */
static int cuda_probe(char *why, size_t len)
{
	static const struct { const char *name; size_t offset; } syms[] = {
		{"cuInit", offsetof(struct cu_driver, init)},
		{"cuDeviceGetCount", offsetof(struct cu_driver, device_get_count)},
		{"cuDeviceGet", offsetof(struct cu_driver, device_get)},
		{"cuDeviceGetName", offsetof(struct cu_driver, device_get_name)},
		{"cuDevicePrimaryCtxRetain", offsetof(struct cu_driver, primary_ctx_retain)},
		{"cuCtxSetCurrent", offsetof(struct cu_driver, ctx_set_current)},
		{"cuMemAlloc_v2", offsetof(struct cu_driver, mem_alloc)},
		{"cuMemFree_v2", offsetof(struct cu_driver, mem_free)},
		{"cuMemcpyHtoD_v2", offsetof(struct cu_driver, memcpy_htod)},
		{"cuMemcpyDtoH_v2", offsetof(struct cu_driver, memcpy_dtoh)},
		{"cuGetErrorString", offsetof(struct cu_driver, get_error_string)},
	};
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	cu_result r;

	if (!h) {
		snprintf(why, len, "cannot load the CUDA driver: %s", dlerror());
		return -1;
	}
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		void *f = dlsym(h, syms[i].name);
		if (!f) {
			snprintf(why, len, "the CUDA driver libcuda.so.1 has no %s; update the "
			         "driver", syms[i].name);
			return -1; /* h stays open: it is this process's driver either way */
		}
		memcpy((char *)&cu + syms[i].offset, &f, sizeof f);
	}
	if ((r = cu.init(0)) != 0) {
		snprintf(why, len, "cuInit failed: %s", cu_text(r));
		return -1;
	}
	if ((r = cu.device_get_count(&cu.count)) != 0) {
		snprintf(why, len, "cuDeviceGetCount failed: %s", cu_text(r));
		return -1;
	}
	if (cu.count < 1) {
		snprintf(why, len, "the CUDA driver sees no device");
		return -1;
	}
	return 0;
}

/*
 * After khor_init: this rank's device (local rank % count) and its primary context, current
 * on this thread. A failure is kept in cu.why and reported by the first allocation, which
 * bench_run makes on every rank together, so the job stops as one.
 */
static void cuda_open(int local_rank)
{
	int ordinal = local_rank % cu.count;
	const char *call = "cuDeviceGet";
	char name[96] = "";
	cu_device dev;
	cu_result r;

	if ((r = cu.device_get(&dev, ordinal)) != 0)
		call = "cuDeviceGet";
	else if ((r = cu.primary_ctx_retain(&cu.ctx, dev)) != 0)
		call = "cuDevicePrimaryCtxRetain";
	else if ((r = cu.ctx_set_current(cu.ctx)) != 0)
		call = "cuCtxSetCurrent";
	if (r != 0) {
		snprintf(cu.why, sizeof cu.why, "%s for cuda device %d of %d failed: %s", call,
		         ordinal, cu.count, cu_text(r));
		cu.ctx = NULL;
		return;
	}
	if (cu.device_get_name(name, (int)sizeof name, dev) != 0)
		strcpy(name, "unnamed");
	if (cu.count == 1)
		snprintf(cu.where, sizeof cu.where, "cuda device 0 (%s)", name);
	else
		snprintf(cu.where, sizeof cu.where,
		         "cuda devices, local rank %% %d (rank 0's: %d, %s)", cu.count, ordinal,
		         name);
}

/* The memory ops of bench.h (struct bench_mem). Each makes the context current: --comms calls them from
 * threads of its own. */
static int cu_current(char *why, size_t len)
{
	cu_result r;

	if (!cu.ctx) {
		snprintf(why, len, "%s", cu.why);
		return -1;
	}
	if ((r = cu.ctx_set_current(cu.ctx)) != 0) {
		snprintf(why, len, "cuCtxSetCurrent failed: %s", cu_text(r));
		return -1;
	}
	return 0;
}

static void *cu_alloc(const struct bench_mem *m, size_t bytes, char *why, size_t len)
{
	cu_deviceptr p = 0;
	cu_result r;

	(void)m;
	if (cu_current(why, len))
		return NULL;
	if ((r = cu.mem_alloc(&p, bytes)) != 0) {
		snprintf(why, len, "cuMemAlloc (%zu B) failed: %s; lower -e", bytes, cu_text(r));
		return NULL;
	}
	return (void *)(uintptr_t)p;
}

static void cu_free(const struct bench_mem *m, void *p)
{
	char why[400];

	(void)m;
	if (cu_current(why, sizeof why) == 0)
		cu.mem_free((cu_deviceptr)(uintptr_t)p);
}

static int cu_put(const struct bench_mem *m, void *dst, const void *src, size_t bytes, char *why,
                  size_t len)
{
	cu_result r;

	(void)m;
	if (bytes == 0)
		return 0;
	if (cu_current(why, len))
		return -1;
	if ((r = cu.memcpy_htod((cu_deviceptr)(uintptr_t)dst, src, bytes)) != 0) {
		snprintf(why, len, "cuMemcpyHtoD (%zu B) failed: %s", bytes, cu_text(r));
		return -1;
	}
	return 0;
}

static int cu_get(const struct bench_mem *m, void *dst, const void *src, size_t bytes, char *why,
                  size_t len)
{
	cu_result r;

	(void)m;
	if (bytes == 0)
		return 0;
	if (cu_current(why, len))
		return -1;
	if ((r = cu.memcpy_dtoh(dst, (cu_deviceptr)(uintptr_t)src, bytes)) != 0) {
		snprintf(why, len, "cuMemcpyDtoH (%zu B) failed: %s", bytes, cu_text(r));
		return -1;
	}
	return 0;
}

static const struct bench_mem cuda_mem = {
	.name = "cuda",
	.where = cu.where,
	.alloc = cu_alloc,
	.free = cu_free,
	.put = cu_put,
	.get = cu_get,
};

/* --mem: host (the default), cuda or both. */
enum kb_mem { MEM_HOST, MEM_CUDA, MEM_BOTH };
static enum kb_mem mem_mode = MEM_HOST;
static const char *mem_spec; /* as given, NULL when --mem was not */

static int parse_mem(const char *v)
{
	static const char *const names[] = {"host", "cuda", "both"};
	for (int m = 0; m < 3; m++) {
		if (strcmp(v, names[m]) == 0) {
			mem_mode = (enum kb_mem)m;
			mem_spec = names[m];
			return 0;
		}
	}
	fprintf(stderr, PROG ": bad value '%s' for --mem: it needs host, cuda or both\n", v);
	return -1;
}

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
	"      --mem M           where the buffers are: host (default), cuda (on the GPU\n"     \
	"                        of local rank % devices, filled and checked through host\n"    \
	"                        copies outside the timed calls) or both (host and cuda\n"     \
	"                        timed side by side, alternating in rounds at every size,\n"   \
	"                        with the ratio cuda/host of their busbw). Exit status 77\n"   \
	"                        (a skip) where no GPU is usable, with the reason\n"           \
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
 * them. Their values are checked by khor_init, the one place that knows them. --comms and
 * --mem are khor-bench's alone too (mpi-bench has no comm split and no device buffers):
 * they are parsed here. Returns the new
 * argc, or -1 after printing a usage error.
 */
static int take_khor_flags(int argc, char **argv)
{
	static const struct { const char *flag, *var; } flags[] = {
		{ "--algo", "KHOR_ALGO" }, { "--transport", "KHOR_TRANSPORT" }, { "--comms", NULL },
		{ "--mem", NULL },
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
			if (f == 3) {
				if (parse_mem(v)) {
					bench_usage(stderr, PROG, KHOR_USAGE);
					return -1;
				}
			} else if (f == 2 || (f == 0 && strchr(v, ','))) {
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

/* khor-bench step (step.h): its own flags, one run on the world comm. */
static int step_main(int argc, char **argv)
{
	struct step_args args;
	int rc = step_parse_args(argc, argv, &args);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (comm_count_n > 0 || algo_count > 1 || mem_spec) {
		fprintf(stderr, PROG " step: --comms, --mem and a list of --algo do not apply to "
		        "step\n");
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
	if (mem_mode == MEM_BOTH && (comm_count_n > 0 || algo_count > 1)) {
		/* Either already interleaves its columns in rounds; both at once would be a table
		 * of algorithms x kinds that nobody reads. */
		fprintf(stderr, PROG ": --mem both cannot be combined with --comms or a list of "
		        "--algo; give --mem host or cuda, or one algorithm\n");
		bench_usage(stderr, PROG, KHOR_USAGE);
		return 2;
	}
	if (mem_mode != MEM_HOST) {
		char why[512] = "";
		if (cuda_probe(why, sizeof why)) {
			fprintf(stderr, PROG ": --mem %s: no usable GPU here: %s\n", mem_spec, why);
			return EXIT_NO_GPU;
		}
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
	if (mem_mode != MEM_HOST) {
		cuda_open(khor_local_rank(ctx.comm));
		b.nmems = mem_mode == MEM_BOTH ? 2 : 1;
		b.mems[b.nmems - 1] = &cuda_mem; /* both: host first, so the ratio is cuda/host */
	}
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
