/*
 * test_nccl.c -- KHOR_NCCL and the NCCL path for device buffers (runtime/nccl.c), over real
 * ranks and links (harness.h) on pretend hosts (KHOR_HOSTNAME).
 *
 * Suite nccl runs everywhere (CTest test_nccl, label nccl): KHOR_NCCL=bogus is refused at
 * init; on buffers of the emulated device (tests/support/mem_emu.h), which NCCL cannot take,
 * auto runs khor's own schedules and gets every result right, and on fails the call on
 * every rank saying that NCCL needs CUDA device memory.
 *
 * Suite nccl_gpu (test_nccl_gpu, label gpu) needs a GPU and skips saying why elsewhere:
 * n = 2..4 ranks with KHOR_NCCL=on, one per pretend host (NCCL refuses two ranks of one
 * communicator on one GPU, and the device machine has one), so each node communicator is
 * a single rank and khor carries everything across "hosts": allreduce of every dtype NCCL
 * has with every op, broadcast, allgather and reduce_scatter, odd counts, in and out of
 * place, against references computed here; then a dtype NCCL lacks must fail saying so.
 * Inputs are small integers, exact in every dtype, and avg's sums divide exactly, so every
 * result must equal the reference bit for bit whatever order NCCL or khor reduce in.
 *
 * CUDA does not survive fork, and the harness forks the ranks: the parent never touches
 * CUDA. It probes for a GPU in a child of its own; each rank opens the driver (dlopen, so
 * this file builds without CUDA) after it was forked.
 */
#include "tests/harness.h"
#include "tests/values.h"
#include "collectives/mem.h"
#include "tests/support/mem_emu.h"
#include "collectives/reduce.h"
#include "base/dtype.h"
#include "gpu_check.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- device memory the ranks allocate: the emulated device or CUDA ---------------------- */

typedef struct dev_ops {
	const char *name;
	void *(*alloc)(size_t len);
	void (*release)(void *p);
	bool (*put)(void *dev, const void *host, size_t len); /* host -> device, finished */
	bool (*get)(void *host, const void *dev, size_t len); /* device -> host, finished */
} dev_ops;

static void *emu_alloc(size_t len) { return kmem_emu_alloc(len ? len : 1); }
static void emu_release(void *p) { kmem_emu_free(p); }
static bool emu_put(void *d, const void *h, size_t len)
{
	return len == 0 || kmem_emu_copy_sync(d, h, len) == KHOR_SUCCESS;
}
static bool emu_get(void *h, const void *d, size_t len)
{
	return len == 0 || kmem_emu_copy_sync(h, d, len) == KHOR_SUCCESS;
}
static const dev_ops emu_ops = { "emulated device", emu_alloc, emu_release, emu_put, emu_get };

/* The few driver calls the ranks need, declared here: the test builds without CUDA. */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(int *, int);
	CUresult (*PrimaryCtxRetain)(void **, int);
	CUresult (*CtxSetCurrent)(void *);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*DtoH)(void *, CUdeviceptr, size_t);
	CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static const char *cu_str(CUresult r)
{
	const char *s = NULL;
	if (cu.GetErrorString == NULL || cu.GetErrorString(r, &s) != 0 || s == NULL)
		return "unknown CUDA error";
	return s;
}

/* Opens the driver, initialises it and makes device 0's primary context current. */
static bool cu_open(char *why, size_t len)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUresult r;
	int n = 0, dev = 0;
	void *ctx = NULL;

	if (h == NULL) {
		snprintf(why, len, "cannot load the CUDA driver: %s", dlerror());
		return false;
	}
	struct { void **fn; const char *name; } syms[] = {
		{ (void **)&cu.Init, "cuInit" },
		{ (void **)&cu.DeviceGetCount, "cuDeviceGetCount" },
		{ (void **)&cu.DeviceGet, "cuDeviceGet" },
		{ (void **)&cu.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain" },
		{ (void **)&cu.CtxSetCurrent, "cuCtxSetCurrent" },
		{ (void **)&cu.MemAlloc, "cuMemAlloc_v2" },
		{ (void **)&cu.MemFree, "cuMemFree_v2" },
		{ (void **)&cu.HtoD, "cuMemcpyHtoD_v2" },
		{ (void **)&cu.DtoH, "cuMemcpyDtoH_v2" },
		{ (void **)&cu.GetErrorString, "cuGetErrorString" },
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		if ((*syms[i].fn = dlsym(h, syms[i].name)) == NULL) {
			snprintf(why, len, "the CUDA driver has no %s", syms[i].name);
			return false;
		}
	}
	if ((r = cu.Init(0)) != 0) {
		snprintf(why, len, "cuInit failed: %s", cu_str(r));
		return false;
	}
	if ((r = cu.DeviceGetCount(&n)) != 0 || n == 0) {
		snprintf(why, len, "no CUDA device (%s)", r ? cu_str(r) : "cuDeviceGetCount says 0");
		return false;
	}
	if ((r = cu.DeviceGet(&dev, 0)) != 0 || (r = cu.PrimaryCtxRetain(&ctx, dev)) != 0 ||
	    (r = cu.CtxSetCurrent(ctx)) != 0) {
		snprintf(why, len, "device 0's context: %s", cu_str(r));
		return false;
	}
	return true;
}

static void *cuda_alloc(size_t len)
{
	CUdeviceptr p = 0;
	return cu.MemAlloc(&p, len ? len : 1) == 0 ? (void *)(uintptr_t)p : NULL;
}
static void cuda_release(void *p) { (void)cu.MemFree((CUdeviceptr)(uintptr_t)p); }
static bool cuda_put(void *d, const void *h, size_t len)
{
	return len == 0 || cu.HtoD((CUdeviceptr)(uintptr_t)d, h, len) == 0;
}
static bool cuda_get(void *h, const void *d, size_t len)
{
	return len == 0 || cu.DtoH(h, (CUdeviceptr)(uintptr_t)d, len) == 0;
}
static const dev_ops cuda_ops = { "cuda", cuda_alloc, cuda_release, cuda_put, cuda_get };

/*
 * Whether the ranks will have a GPU that khor sees as CUDA memory: a build with the cuda
 * backend, and a driver and device, probed in a child so that this process stays clean.
 */
static bool gpu_here(char *why, size_t len)
{
	bool backend = false;

	for (int i = 0; kmem_backends[i] != NULL; i++)
		backend = backend || strcmp(kmem_backends[i]->name, "cuda") == 0;
	if (!backend) {
		snprintf(why, len, "this build has no cuda backend (no nvcc at configure time)");
		return false;
	}
	return gpu_probe_in_child(cu_open, why, len);
}

#define NEED_GPU() GPU_NEED(gpu_here, "no usable CUDA GPU here")

/* ---- values: small integers, exact in every dtype --------------------------------------- */

/*
 * Rank r's element i. Sums: a base of at least n-1 plus 2r-(n-1), whose sum over ranks is
 * 0, so the sum is n x base and avg is base exactly, never negative for uint8. Products:
 * 1, 2 and (signed types) -1, at most 2^4 over 4 ranks.
 */
static double input(khor_dtype d, khor_op op, int n, int r, size_t i)
{
	if (op == KHOR_PROD) {
		int k = (int)((i + (size_t)r) % 3);
		return k == 0 ? (d == KHOR_UINT8 ? 1 : -1) : k;
	}
	return (double)(i % 7) + (n - 1) + (2 * r - (n - 1));
}

static double reference(khor_dtype d, khor_op op, int n, size_t i)
{
	double v = input(d, op, n, 0, i);
	for (int r = 1; r < n; r++) {
		double x = input(d, op, n, r, i);
		v = op == KHOR_MIN ? fmin(v, x) : op == KHOR_MAX ? fmax(v, x)
		    : op == KHOR_PROD ? v * x : v + x;
	}
	return op == KHOR_AVG ? v / n : v;
}

/* ---- one rank's checks ------------------------------------------------------------------ */

#define FAIL(code, ...)                                                                    \
	do {                                                                               \
		fprintf(stderr, "rank %d: ", rank);                                        \
		fprintf(stderr, __VA_ARGS__);                                              \
		fprintf(stderr, "\n");                                                     \
		return code;                                                               \
	} while (0)

/* An allreduce on device buffers (in or out of place) against the reference. */
static int check_allreduce(khor_comm *comm, const dev_ops *m, int rank, int n, khor_dtype d,
                           khor_op op, size_t count, bool inplace)
{
	const size_t esz = kdtype_size(d), bytes = count * esz;
	unsigned char *h = malloc(bytes + 1);
	void *in = m->alloc(bytes), *out = inplace ? in : m->alloc(bytes);
	int rc = 0;

	if (h == NULL || in == NULL || out == NULL)
		FAIL(20, "out of %s memory for %zu bytes", m->name, bytes);
	for (size_t i = 0; i < count; i++)
		values_put(h, d, i, input(d, op, n, rank, i));
	if (!m->put(in, h, bytes))
		FAIL(21, "copy to %s memory failed", m->name);
	if (khor_allreduce(comm, in, out, count, d, op) != KHOR_SUCCESS)
		FAIL(22, "allreduce %s %s count %zu%s: %s", kdtype_name(d), kop_name(op), count,
		     inplace ? " in place" : "", khor_comm_error(comm));
	memset(h, 0xa5, bytes);
	if (!m->get(h, out, bytes))
		FAIL(23, "copy from %s memory failed", m->name);
	for (size_t i = 0; i < count && rc == 0; i++) {
		double want = reference(d, op, n, i), got = values_get(h, d, i);
		if (got != want) {
			fprintf(stderr, "rank %d: allreduce %s %s count %zu%s [%zu]: %g, want %g\n",
			        rank, kdtype_name(d), kop_name(op), count, inplace ? " in place" : "",
			        i, got, want);
			rc = 24;
		}
	}
	m->release(in);
	if (out != in)
		m->release(out);
	free(h);
	return rc;
}

static int check_broadcast(khor_comm *comm, const dev_ops *m, int rank, int n, size_t count)
{
	int32_t *h = malloc(count * 4 + 4);
	void *b = m->alloc(count * 4);

	if (h == NULL || b == NULL)
		FAIL(30, "out of memory");
	for (int root = 0; root < n; root++) {
		for (size_t i = 0; i < count; i++)
			h[i] = rank == root ? (int32_t)(i * 7 + (size_t)root) : -5;
		if (!m->put(b, h, count * 4))
			FAIL(31, "copy to %s memory failed", m->name);
		if (khor_broadcast(comm, b, count, KHOR_INT32, root) != KHOR_SUCCESS)
			FAIL(32, "broadcast root %d count %zu: %s", root, count, khor_comm_error(comm));
		if (!m->get(h, b, count * 4))
			FAIL(33, "copy from %s memory failed", m->name);
		for (size_t i = 0; i < count; i++)
			if (h[i] != (int32_t)(i * 7 + (size_t)root))
				FAIL(34, "broadcast root %d [%zu]: %d", root, i, h[i]);
	}
	m->release(b);
	free(h);
	return 0;
}

static int check_allgather(khor_comm *comm, const dev_ops *m, int rank, int n, size_t count)
{
	const size_t all = count * (size_t)n;
	int64_t *h = malloc(all * 8 + 8);
	void *mine = m->alloc(count * 8), *out = m->alloc(all * 8);

	if (h == NULL || mine == NULL || out == NULL)
		FAIL(40, "out of memory");
	for (size_t i = 0; i < count; i++)
		h[i] = rank * 100000 + (int64_t)i;
	if (!m->put(mine, h, count * 8))
		FAIL(41, "copy to %s memory failed", m->name);
	if (khor_allgather(comm, mine, out, count, KHOR_INT64) != KHOR_SUCCESS)
		FAIL(42, "allgather count %zu: %s", count, khor_comm_error(comm));
	if (!m->get(h, out, all * 8))
		FAIL(43, "copy from %s memory failed", m->name);
	for (int r = 0; r < n; r++)
		for (size_t i = 0; i < count; i++)
			if (h[(size_t)r * count + i] != r * 100000 + (int64_t)i)
				FAIL(44, "allgather count %zu: block %d [%zu] is %lld", count, r, i,
				     (long long)h[(size_t)r * count + i]);
	m->release(mine);
	m->release(out);
	free(h);
	return 0;
}

/* khor's blocks: count / n each, one more on the first count % n ranks. */
static int check_reduce_scatter(khor_comm *comm, const dev_ops *m, int rank, int n, size_t count)
{
	const size_t base = count / (size_t)n, rem = count % (size_t)n;
	const size_t len = base + ((size_t)rank < rem), off = base * (size_t)rank +
	                   ((size_t)rank < rem ? (size_t)rank : rem);
	float *h = malloc(count * 4 + 4);
	void *in = m->alloc(count * 4), *out = m->alloc(len * 4);

	if (h == NULL || in == NULL || out == NULL)
		FAIL(50, "out of memory");
	for (size_t i = 0; i < count; i++)
		h[i] = (float)input(KHOR_FLOAT32, KHOR_SUM, n, rank, i);
	if (!m->put(in, h, count * 4))
		FAIL(51, "copy to %s memory failed", m->name);
	if (khor_reduce_scatter(comm, in, out, count, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS)
		FAIL(52, "reduce_scatter count %zu: %s", count, khor_comm_error(comm));
	if (!m->get(h, out, len * 4))
		FAIL(53, "copy from %s memory failed", m->name);
	for (size_t i = 0; i < len; i++)
		if (h[i] != (float)reference(KHOR_FLOAT32, KHOR_SUM, n, off + i))
			FAIL(54, "reduce_scatter count %zu [%zu]: %g", count, off + i, h[i]);
	m->release(in);
	m->release(out);
	free(h);
	return 0;
}

/* ---- the jobs ---------------------------------------------------------------------------- */

typedef struct job {
	int per_host;     /* ranks per pretend host */
	const char *nccl; /* KHOR_NCCL */
} job;

static khor_comm *start(int rank, khor_config *cfg, const job *j, char *err, size_t len)
{
	char host[32];
	khor_comm *comm = NULL;

	snprintf(host, sizeof(host), "pretend-%d", rank / j->per_host);
	khor_config_set(cfg, "KHOR_HOSTNAME", host);
	khor_config_set(cfg, "KHOR_NCCL", j->nccl);
	khor_config_set(cfg, "KHOR_SLICE_BYTES", "4K");
	if (khor_init(cfg, err, len, &comm) != KHOR_SUCCESS)
		return NULL;
	return comm;
}

static const khor_dtype nccl_dtypes[] = { KHOR_FLOAT32, KHOR_FLOAT64, KHOR_INT32, KHOR_INT64,
                                          KHOR_FLOAT16, KHOR_BFLOAT16, KHOR_INT8, KHOR_UINT8 };
static const khor_op all_ops[] = { KHOR_SUM, KHOR_AVG, KHOR_MIN, KHOR_MAX, KHOR_PROD };

/* Emulated device, KHOR_NCCL=auto: khor's own schedules, every result right. */
static int emu_auto_body(int rank, int n, khor_config *cfg, void *arg)
{
	const size_t counts[] = { 1, 7, 1001 };
	char err[1024];
	khor_comm *comm = start(rank, cfg, arg, err, sizeof(err));
	int rc;

	if (comm == NULL)
		FAIL(10, "init: %s", err);
	static const khor_dtype dts[] = { KHOR_FLOAT32, KHOR_INT32, KHOR_FLOAT16, KHOR_INT16 };
	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
		for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++)
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
				if (reduce_supported(dts[d], all_ops[o]) &&
				    (rc = check_allreduce(comm, &emu_ops, rank, n, dts[d], all_ops[o],
				                          counts[c], c % 2 == 1)) != 0)
					return rc;
	if ((rc = check_broadcast(comm, &emu_ops, rank, n, 3001)) != 0 ||
	    (rc = check_allgather(comm, &emu_ops, rank, n, 513)) != 0 ||
	    (rc = check_reduce_scatter(comm, &emu_ops, rank, n, 1003)) != 0 ||
	    (rc = check_reduce_scatter(comm, &emu_ops, rank, n, (size_t)n * 250)) != 0)
		return rc;
	khor_finalize(comm);
	return 0;
}

/* Emulated device, KHOR_NCCL=on: host calls still run; a device call fails on every rank. */
static int emu_on_body(int rank, int n, khor_config *cfg, void *arg)
{
	char err[1024];
	khor_comm *comm = start(rank, cfg, arg, err, sizeof(err));
	float x = (float)rank;

	if (comm == NULL)
		FAIL(10, "init: %s", err);
	if (khor_allreduce(comm, &x, &x, 1, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS ||
	    x != (float)(n * (n - 1) / 2))
		FAIL(11, "host allreduce under KHOR_NCCL=on: %s", khor_comm_error(comm));
	float h[64] = { 0 };
	void *b = kmem_emu_alloc(sizeof(h));
	if (b == NULL || !emu_put(b, h, sizeof(h)))
		FAIL(12, "emulated device memory");
	khor_status st = khor_allreduce(comm, b, b, 64, KHOR_FLOAT32, KHOR_SUM);
	const char *e = khor_comm_error(comm);
	if (st == KHOR_SUCCESS)
		FAIL(13, "KHOR_NCCL=on ran an allreduce on emulated device memory");
	if (e == NULL || strstr(e, "NCCL needs CUDA device memory") == NULL ||
	    strstr(e, "emulated device") == NULL)
		FAIL(14, "the error does not say NCCL needs CUDA memory: %s", e ? e : "(none)");
	kmem_emu_free(b);
	khor_finalize(comm);
	return 0;
}

static int bogus_body(int rank, int n, khor_config *cfg, void *arg)
{
	char err[1024] = "";
	khor_comm *comm = NULL;

	(void)n;
	(void)arg;
	khor_config_set(cfg, "KHOR_NCCL", "bogus");
	if (khor_init(cfg, err, sizeof(err), &comm) == KHOR_SUCCESS)
		FAIL(10, "KHOR_NCCL=bogus was accepted");
	if (strstr(err, "KHOR_NCCL") == NULL || strstr(err, "bogus") == NULL)
		FAIL(11, "the refusal does not name KHOR_NCCL='bogus': %s", err);
	return 0;
}

/* GPU, KHOR_NCCL=on, one rank per pretend host. */
static int gpu_body(int rank, int n, khor_config *cfg, void *arg)
{
	const size_t counts[] = { 1, 7, 1001, 65537 };
	char err[1024], why[256];
	int rc;

	if (!cu_open(why, sizeof(why)))
		FAIL(9, "%s", why);
	khor_comm *comm = start(rank, cfg, arg, err, sizeof(err));
	if (comm == NULL)
		FAIL(10, "init: %s", err);
	for (size_t d = 0; d < sizeof(nccl_dtypes) / sizeof(nccl_dtypes[0]); d++)
		for (size_t o = 0; o < sizeof(all_ops) / sizeof(all_ops[0]); o++)
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
				if (reduce_supported(nccl_dtypes[d], all_ops[o]) &&
				    (rc = check_allreduce(comm, &cuda_ops, rank, n, nccl_dtypes[d],
				                          all_ops[o], counts[c], (c + o) % 2 == 1)) != 0)
					return rc;
	if ((rc = check_broadcast(comm, &cuda_ops, rank, n, 1)) != 0 ||
	    (rc = check_broadcast(comm, &cuda_ops, rank, n, 100003)) != 0 ||
	    (rc = check_allgather(comm, &cuda_ops, rank, n, 1)) != 0 ||
	    (rc = check_allgather(comm, &cuda_ops, rank, n, 4099)) != 0 ||
	    (rc = check_reduce_scatter(comm, &cuda_ops, rank, n, 1003)) != 0)
		return rc;
	/* Last: the failure is the comm's sticky error. */
	void *b = cuda_alloc(64);
	if (b == NULL)
		FAIL(60, "cuMemAlloc");
	if (khor_allreduce(comm, b, b, 32, KHOR_INT16, KHOR_SUM) == KHOR_SUCCESS)
		FAIL(61, "KHOR_NCCL=on reduced int16, which NCCL has no type for");
	if (strstr(khor_comm_error(comm), "NCCL has no int16 type") == NULL)
		FAIL(62, "the int16 refusal does not say why: %s", khor_comm_error(comm));
	cuda_release(b);
	khor_finalize(comm);
	return 0;
}

static void run(int n, harness_body body, job *j, double deadline_s)
{
	harness_opts o = { .n = n, .timeout = "60s", .deadline_s = deadline_s };
	harness_result res;
	bool ok = harness_run(&o, body, j, &res);

	for (int r = 0; r < n; r++)
		cr_expect_eq(res.status[r], 0, "n=%d KHOR_NCCL=%s: rank %d exited %d", n, j->nccl, r,
		             res.status[r]);
	cr_assert(ok && !res.timed_out, "n=%d KHOR_NCCL=%s failed or timed out", n, j->nccl);
}

Test(nccl, bogus_value_refused_at_init, .timeout = 60)
{
	run(2, bogus_body, &(job){ 1, "bogus" }, 30);
}

Test(nccl, auto_on_emulated_device_two_hosts_of_two, .timeout = 200)
{
	run(4, emu_auto_body, &(job){ 2, "auto" }, 180);
}

Test(nccl, auto_on_emulated_device_one_host_of_three, .timeout = 200)
{
	run(3, emu_auto_body, &(job){ 3, "auto" }, 180);
}

Test(nccl, on_refuses_emulated_device, .timeout = 60)
{
	run(4, emu_on_body, &(job){ 2, "on" }, 45);
}

Test(nccl_gpu, on_n2, .timeout = 300)
{
	NEED_GPU();
	run(2, gpu_body, &(job){ 1, "on" }, 280);
}

Test(nccl_gpu, on_n3, .timeout = 300)
{
	NEED_GPU();
	run(3, gpu_body, &(job){ 1, "on" }, 280);
}

Test(nccl_gpu, on_n4, .timeout = 300)
{
	NEED_GPU();
	run(4, gpu_body, &(job){ 1, "on" }, 280);
}
