/*
 * test_device.c -- every collective on device buffers, through the public API, over real
 * tcp and shm links, n = 1..4, on the device KHOR_TEST_DEVICE names: emu (the default: the
 * emulated device of tests/support/mem_emu.c) or cuda (a real GPU, device 0, shared by the
 * ranks; CTest's test_device_gpu). With cuda and no usable GPU every test skips, saying why.
 *
 * Each case runs twice in every rank: on host buffers, then on device buffers with the
 * same input. The device run must leave both buffers, guard bytes and untouched gaps
 * included, byte for byte as the host run left them. Inputs are small integers, so the
 * result is exact whatever schedule the call picks; the allreduce schedules (ring, rd,
 * tree, hd), pinned with KHOR_ALGO, also run on random floats, where only the same order of
 * reductions gives the same bits. Emu memory faults on any CPU access, so a schedule or a
 * staging step that touches a device pointer directly kills its rank.
 *
 * The forms: blocking; blocking after work queued on the default stream; the _stream forms
 * on a stream of their own and on the default stream (NULL), each after a 200 ms delay and
 * a queued copy that fills the input (the collective must start after it) with the result
 * read back by a copy queued after the call (which must wait for it); the i-forms with
 * khor_wait. One job runs with KHOR_MEM_EMU_DELAY_US=50, which makes every emu stream
 * operation sleep first: a missing stream-ordered wait then reads stale data (emu only).
 *
 * Mixing kinds: host buffers on one rank and device buffers on another, or a host send
 * buffer with a device receive buffer on one rank, fail on every rank, quickly, with an
 * error that says which memory was which.
 */
#include "tests/harness.h"
#include "tests/values.h"

#include "tests/support/mem_emu.h"
#include "collectives/reduce.h"
#ifdef KHOR_HAVE_CUDA_KERNELS
#include "cuda/mem_cuda.h"

#include <cuda_runtime_api.h>

#include "tests/cuda/gpu_check.h"
#endif

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const khor_dtype dtypes[] = {
	KHOR_FLOAT32, KHOR_FLOAT64, KHOR_INT32, KHOR_INT64,
	KHOR_FLOAT16, KHOR_BFLOAT16, KHOR_INT8, KHOR_UINT8, KHOR_INT16,
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))
static const khor_op ops[] = { KHOR_SUM, KHOR_AVG, KHOR_MIN, KHOR_MAX, KHOR_PROD };
#define NOPS (sizeof(ops) / sizeof(ops[0]))

#define GUARD 64
#define POISON 0xa5
#define TEXT 1024

/* ---- the device under test ---------------------------------------------------------- */

/*
 * What the test itself does with device memory, beside the backend's own table (be): the
 * test fills and reads device buffers and holds streams back, which mem.h has no call for.
 * Picked in the test process (device_pick), before the ranks fork; start runs in each rank.
 */
typedef struct test_dev {
	const char *name; /* KHOR_TEST_DEVICE's value */
	const kmem_backend *be;
	/* In a rank, before anything else touches the device: false with why when it can't. */
	bool (*start)(char *why, size_t len);
	void *(*alloc)(size_t len); /* device memory, or NULL (the reason is logged) */
	void (*free)(void *p);
	/* A copy between any host and device pointers, waited for (60 s). */
	khor_status (*copy_sync)(void *dst, const void *src, size_t len);
	/* Waits (60 s) for everything enqueued on stream (NULL: the default stream). */
	khor_status (*stream_sync)(void *stream);
	/* Holds stream back us microseconds: what is enqueued after waits for it. */
	khor_status (*delay)(void *stream, unsigned us, kerr *err);
	/*
	 * Host memory for the host ends of the copies the stream cases queue. CUDA may stage a
	 * copy from or to pageable memory by first waiting, on the host, for the stream: the
	 * fill would then be done before the collective is even called, and a collective that
	 * ignored stream order would pass. Pinned memory keeps those copies queued.
	 */
	void *(*host_alloc)(size_t len);
	void (*host_free)(void *p);
} test_dev;

static bool emu_start(char *why, size_t len)
{
	(void)why;
	(void)len;
	return true;
}

static const test_dev emu_dev = {
	.name = "emu",
	.be = &kmem_emu_backend,
	.start = emu_start,
	.alloc = kmem_emu_alloc,
	.free = kmem_emu_free,
	.copy_sync = kmem_emu_copy_sync,
	.stream_sync = kmem_emu_stream_sync,
	.delay = kmem_emu_delay,
	.host_alloc = malloc,
	.host_free = free,
};

#ifdef KHOR_HAVE_CUDA_KERNELS
/* Device 0's primary context, bound on this thread (khor binds its own threads itself). */
static bool cuda_start(char *why, size_t len)
{
	void *ctx = NULL;
	kerr e;

	if (!mem_cuda_usable(why, len))
		return false;
	kerr_clear(&e);
	if (mem_cuda_device_ctx(0, &ctx, &e) != KHOR_SUCCESS ||
	    kmem_cuda_backend.bind(ctx, &e) != KHOR_SUCCESS) {
		snprintf(why, len, "%s", e.text);
		return false;
	}
	return true;
}

static void *cuda_alloc(size_t len)
{
	void *p = NULL;
	kerr e;

	kerr_clear(&e);
	if (kmem_cuda_backend.dev_alloc(len, &p, &e) != KHOR_SUCCESS) {
		fprintf(stderr, "test_device: %s\n", e.text);
		return NULL;
	}
	return p;
}

static void cuda_free(void *p)
{
	if (p != NULL)
		kmem_cuda_backend.dev_free(p);
}

static khor_status cuda_stream_sync(void *stream)
{
	kerr e;

	kerr_clear(&e);
	khor_status st = kmem_stream_sync(&kmem_cuda_backend, stream, kdeadline_in_ms(60000),
	                                  "test_device's stream", &e);
	if (st != KHOR_SUCCESS)
		fprintf(stderr, "test_device: %s\n", e.text);
	return st;
}

static khor_status cuda_copy_sync(void *dst, const void *src, size_t len)
{
	kerr e;

	kerr_clear(&e);
	if (kmem_cuda_backend.copy(dst, src, len, NULL, &e) != KHOR_SUCCESS) {
		fprintf(stderr, "test_device: %s\n", e.text);
		return e.status;
	}
	return cuda_stream_sync(NULL);
}

static void CUDART_CB cuda_sleep(void *arg)
{
	unsigned us = (unsigned)(uintptr_t)arg;
	struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };

	while (nanosleep(&ts, &ts) != 0)
		;
}

/*
 * A host function that sleeps, in stream order: the stream runs nothing after it until it
 * returns, as kmem_emu_delay's sleep does. (A big device-to-device copy would keep an
 * H200 busy for well under a millisecond per 256 MiB, too short to tell a collective that
 * waits for the stream from one that does not.)
 */
static khor_status cuda_delay(void *stream, unsigned us, kerr *err)
{
	cudaError_t r = cudaLaunchHostFunc((cudaStream_t)stream, cuda_sleep, (void *)(uintptr_t)us);

	if (r != cudaSuccess)
		return kerr_set(err, KHOR_ERR_INTERNAL, "cudaLaunchHostFunc (a %u us sleep): %s",
		                us, cudaGetErrorString(r));
	return KHOR_SUCCESS;
}

static void *cuda_host_alloc(size_t len)
{
	void *p = NULL;
	kerr e;

	kerr_clear(&e);
	if (kmem_cuda_backend.host_alloc(len, &p, &e) != KHOR_SUCCESS) {
		fprintf(stderr, "test_device: %s\n", e.text);
		return NULL;
	}
	return p;
}

static void cuda_host_free(void *p)
{
	if (p != NULL)
		kmem_cuda_backend.host_free(p);
}

static const test_dev cuda_dev = {
	.name = "cuda",
	.be = &kmem_cuda_backend,
	.start = cuda_start,
	.alloc = cuda_alloc,
	.free = cuda_free,
	.copy_sync = cuda_copy_sync,
	.stream_sync = cuda_stream_sync,
	.delay = cuda_delay,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
};

/*
 * Whether the ranks will have a GPU, and whether the CUDA runtime khor's kernels were built
 * with accepts the driver (as test_cuda_mem.c checks). device_pick asks in a child process:
 * cuInit here would leave CUDA unusable in every rank forked after it.
 */
static bool cuda_usable(char *why, size_t len)
{
	char cause[512];

	if (!mem_cuda_usable(cause, sizeof(cause))) {
		snprintf(why, len, "no usable CUDA GPU here: %s", cause);
		return false;
	}
	if (!gpu_cudart_usable(cause, sizeof(cause))) {
		snprintf(why, len, "khor's CUDA kernels cannot run here: %s", cause);
		return false;
	}
	return true;
}
#endif

static const test_dev *dev = &emu_dev;

/* Sets dev from KHOR_TEST_DEVICE: false, with why, when that device is not usable here. */
static bool device_pick(char *why, size_t len)
{
	const char *v = getenv("KHOR_TEST_DEVICE");

	if (v == NULL || *v == '\0' || strcmp(v, "emu") == 0) {
		dev = &emu_dev;
		return true;
	}
	if (strcmp(v, "cuda") != 0)
		cr_assert_fail("KHOR_TEST_DEVICE='%s': expected emu or cuda", v);
#ifdef KHOR_HAVE_CUDA_KERNELS
	dev = &cuda_dev;
	if (gpu_probe_in_child(cuda_usable, why, len))
		return true;
	char cause[TEXT];
	snprintf(cause, sizeof(cause), "%s", why);
	snprintf(why, len, "KHOR_TEST_DEVICE=cuda: %s", cause);
	return false;
#else
	snprintf(why, len, "KHOR_TEST_DEVICE=cuda: this build has no cuda backend (no nvcc at "
	         "configure time)");
	return false;
#endif
}

#define NEED_DEVICE()                                                                      \
	do {                                                                               \
		char why_[TEXT];                                                           \
		if (!device_pick(why_, sizeof(why_)))                                      \
			cr_skip_test("%s", why_);                                          \
	} while (0)

/* ---- values ------------------------------------------------------------------------ */

static bool is_unsigned(khor_dtype dt)
{
	return dt == KHOR_UINT8 || dt == KHOR_BOOL;
}

static bool is_float(khor_dtype dt)
{
	return dt == KHOR_FLOAT32 || dt == KHOR_FLOAT64 || dt == KHOR_FLOAT16 ||
	       dt == KHOR_BFLOAT16;
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

/* Data of the moving collectives: element i of the block that `who` owns. */
static double mval(int who, size_t i, unsigned salt)
{
	return (double)(((size_t)who * 37 + i * 11 + salt) % 100);
}

/* Same sequence on every rank: counts all ranks must agree on. */
static uint32_t rnd(uint64_t *s)
{
	return (uint32_t)(values_xorshift(s) >> 11);
}

/* ---- cases ------------------------------------------------------------------------- */

enum kind {
	K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_ALLGATHERV, K_REDUCE_SCATTER,
	K_ALLTOALL, K_ALLTOALLV, K_GATHER, K_SCATTER,
};
static const char *const kind_names[] = { "allreduce", "broadcast", "reduce", "allgather",
	                                  "allgatherv", "reduce_scatter", "alltoall",
	                                  "alltoallv", "gather", "scatter" };

/* How a case is called. */
enum how {
	H_BLOCK,        /* the plain form on buffers filled (and read) synchronously */
	H_AFTER_QUEUE,  /* the plain form after a delay and the fill queued on the default stream */
	H_STREAM,       /* the _stream form on a stream of the rank's, fill and read-back queued */
	H_STREAM_NULL,  /* the same on the default stream */
	H_NONBLOCKING,  /* the i-form, then khor_wait */
};
static const char *const how_names[] = { "blocking", "blocking after queued work",
	                                 "stream", "stream NULL", "i-form + wait" };

/*
 * One call. mode: 0 out of place, 1 in place; 2: reduce_scatter into its own block of the
 * send buffer, reduce/gather with no receive buffer at non-roots, scatter with no send
 * buffer at non-roots; allgatherv/alltoallv: 1 means displacements with gaps.
 */
typedef struct dcase {
	enum kind kind;
	khor_dtype dt;
	khor_op op;
	size_t count;
	int root;
	int mode;
	bool random; /* random floats instead of small integers */
	unsigned salt;
} dcase;

struct ctx {
	khor_comm *comm;
	int rank, n;
	enum how how;
	void *stream; /* H_STREAM's */
	char where[256];
	char *report; /* the first failure, for the parent (shared memory) */
	unsigned passed;
};

#define FAIL(c, ...)                                                                       \
	do {                                                                               \
		char m_[TEXT];                                                             \
		snprintf(m_, sizeof(m_), __VA_ARGS__);                                     \
		fprintf(stderr, "rank %d: %s: %s\n", (c)->rank, (c)->where, m_);           \
		if ((c)->report != NULL && (c)->report[0] == '\0')                         \
			snprintf((c)->report, TEXT, "rank %d: %s: %s", (c)->rank,          \
			         (c)->where, m_);                                          \
		return false;                                                              \
	} while (0)

/* What a case's buffers hold, per rank: counts and displacements of the v forms too. */
typedef struct layout {
	size_t alen, blen; /* bytes of buffer A (send) and B (receive) */
	size_t counts[HARNESS_MAX_RANKS], displs[HARNESS_MAX_RANKS]; /* allgatherv */
	size_t sc[HARNESS_MAX_RANKS], sd[HARNESS_MAX_RANKS];          /* alltoallv */
	size_t rc[HARNESS_MAX_RANKS], rd[HARNESS_MAX_RANKS];
	size_t off, len; /* reduce_scatter: this rank's block, in elements */
} layout;

static void make_layout(const struct ctx *c, const dcase *d, layout *l)
{
	size_t esz = khor_dtype_size(d->dt), n = (size_t)c->n, r = (size_t)c->rank;
	size_t count = d->count;

	memset(l, 0, sizeof(*l));
	switch (d->kind) {
	case K_ALLREDUCE: case K_REDUCE:
		l->alen = l->blen = count * esz;
		break;
	case K_BROADCAST:
		l->blen = count * esz;
		break;
	case K_ALLGATHER: case K_GATHER:
		l->alen = count * esz;
		l->blen = n * count * esz;
		break;
	case K_SCATTER:
		l->alen = n * count * esz;
		l->blen = count * esz;
		break;
	case K_ALLTOALL:
		l->alen = l->blen = n * count * esz;
		break;
	case K_REDUCE_SCATTER:
		l->len = count / n + (r < count % n ? 1 : 0);
		l->off = count / n * r + (r < count % n ? r : count % n);
		l->alen = count * esz;
		l->blen = l->len * esz;
		break;
	case K_ALLGATHERV: {
		uint64_t s = 0x9e3779b97f4a7c15ull + d->salt;
		size_t total = 0;
		for (size_t j = 0; j < n; j++) {
			uint32_t k = rnd(&s);
			total += d->mode ? k % 5 : 0;
			l->counts[j] = k % 4 == 0 ? 0 : (k >> 8) % (k % 3 == 0 ? 700 : 40);
			l->displs[j] = total;
			total += l->counts[j];
		}
		total += d->mode ? 3 : 0;
		l->alen = l->counts[r] * esz;
		l->blen = total * esz;
		break;
	}
	case K_ALLTOALLV: {
		uint64_t s = 0x243f6a8885a308d3ull + d->salt;
		size_t m[HARNESS_MAX_RANKS][HARNESS_MAX_RANKS], stotal = 0, rtotal = 0;
		for (size_t i = 0; i < n; i++)
			for (size_t j = 0; j < n; j++) {
				uint32_t k = rnd(&s);
				m[i][j] = k % 3 == 0 ? 0 : (k >> 8) % 300;
			}
		for (size_t j = 0; j < n; j++) {
			l->sc[j] = m[r][j];
			l->rc[j] = m[j][r];
			stotal += d->mode ? j % 3 : 0;
			rtotal += d->mode ? (j + 1) % 2 : 0;
			l->sd[j] = stotal;
			l->rd[j] = rtotal;
			stotal += l->sc[j];
			rtotal += l->rc[j];
		}
		l->alen = stotal * esz;
		l->blen = rtotal * esz;
		break;
	}
	}
}

static uint64_t rng_state;

static double random_value(khor_dtype dt)
{
	uint64_t r = values_xorshift64s(&rng_state);
	double m = (double)(r >> 11 & 0xffffff) / 0x1p24 + 0.5;
	return ldexp((r >> 10 & 1) ? -m : m, (int)(r >> 4 & 7) - 3 + (dt == KHOR_FLOAT16 ? 0 : 2));
}

/* The inputs, into the poisoned A and B of this rank (host memory). */
static void fill_case(const struct ctx *c, const dcase *d, const layout *l, uint8_t *a,
                      uint8_t *b)
{
	size_t esz = khor_dtype_size(d->dt), n = (size_t)c->n, r = (size_t)c->rank;
	size_t count = d->count;
	bool root = c->rank == d->root;

	rng_state = 0x9e3779b97f4a7c15ull ^ ((uint64_t)d->salt << 20) ^ (uint64_t)(c->rank + 1);
	switch (d->kind) {
	case K_ALLREDUCE: case K_REDUCE: {
		bool inplace = d->mode == 1 && (d->kind == K_ALLREDUCE || root);
		for (size_t i = 0; i < count; i++)
			values_put(inplace ? b : a, d->dt, i,
			           d->random && is_float(d->dt)
			               ? random_value(d->dt)
			               : rin(c->rank, i, d->op, d->salt, d->dt));
		break;
	}
	case K_REDUCE_SCATTER:
		for (size_t i = 0; i < count; i++)
			values_put(a, d->dt, i, rin(c->rank, i, d->op, d->salt, d->dt));
		break;
	case K_BROADCAST:
		for (size_t i = 0; i < count && root; i++)
			values_put(b, d->dt, i, mval(d->root, i, d->salt));
		break;
	case K_ALLGATHER: case K_GATHER: {
		bool inplace = d->mode == 1 && (d->kind == K_ALLGATHER || root);
		uint8_t *sb = inplace ? b + r * count * esz : a;
		for (size_t i = 0; i < count; i++)
			values_put(sb, d->dt, i, mval(c->rank, i, d->salt));
		break;
	}
	case K_SCATTER:
		for (size_t j = 0; j < n && root; j++)
			for (size_t i = 0; i < count; i++)
				values_put(a, d->dt, j * count + i, mval((int)j, i, d->salt));
		break;
	case K_ALLTOALL: {
		uint8_t *sb = d->mode == 1 ? b : a;
		for (size_t j = 0; j < n; j++)
			for (size_t k = 0; k < count; k++)
				values_put(sb, d->dt, j * count + k,
				           mval((int)(r * n + j), k, d->salt));
		break;
	}
	case K_ALLGATHERV:
		for (size_t i = 0; i < l->counts[r]; i++)
			values_put(a, d->dt, i, mval(c->rank, i, d->salt));
		break;
	case K_ALLTOALLV:
		for (size_t j = 0; j < n; j++)
			for (size_t k = 0; k < l->sc[j]; k++)
				values_put(a, d->dt, l->sd[j] + k,
				           mval((int)(r * n + j), k, d->salt));
		break;
	}
}

/* Issues the case on buffers a and b (host or device) in the way c->how says. */
static khor_status issue(struct ctx *c, const dcase *d, const layout *l, uint8_t *a, uint8_t *b)
{
	size_t esz = khor_dtype_size(d->dt), count = d->count, r = (size_t)c->rank;
	bool root = c->rank == d->root;
	khor_comm *comm = c->comm;
	khor_dtype dt = d->dt;
	bool st_form = c->how == H_STREAM || c->how == H_STREAM_NULL;
	bool nb = c->how == H_NONBLOCKING;
	void *s = c->how == H_STREAM ? c->stream : NULL;
	khor_request *req = NULL;
	khor_status st = KHOR_ERR_INTERNAL;

	switch (d->kind) {
	case K_ALLREDUCE: {
		const void *sb = d->mode == 1 ? b : a;
		st = st_form ? khor_allreduce_stream(comm, sb, b, count, dt, d->op, s)
		     : nb    ? khor_iallreduce(comm, sb, b, count, dt, d->op, &req)
		             : khor_allreduce(comm, sb, b, count, dt, d->op);
		break;
	}
	case K_BROADCAST:
		st = st_form ? khor_broadcast_stream(comm, b, count, dt, d->root, s)
		     : nb    ? khor_ibroadcast(comm, b, count, dt, d->root, &req)
		             : khor_broadcast(comm, b, count, dt, d->root);
		break;
	case K_REDUCE: {
		const void *sb = d->mode == 1 && root ? b : a;
		void *rb = d->mode == 2 && !root ? NULL : b;
		st = st_form ? khor_reduce_stream(comm, sb, rb, count, dt, d->op, d->root, s)
		     : nb    ? khor_ireduce(comm, sb, rb, count, dt, d->op, d->root, &req)
		             : khor_reduce(comm, sb, rb, count, dt, d->op, d->root);
		break;
	}
	case K_ALLGATHER: {
		const void *sb = d->mode == 1 ? b + r * count * esz : a;
		st = st_form ? khor_allgather_stream(comm, sb, b, count, dt, s)
		     : nb    ? khor_iallgather(comm, sb, b, count, dt, &req)
		             : khor_allgather(comm, sb, b, count, dt);
		break;
	}
	case K_REDUCE_SCATTER: {
		void *rb = d->mode == 0 ? b : d->mode == 1 ? a : a + l->off * esz;
		st = st_form ? khor_reduce_scatter_stream(comm, a, rb, count, dt, d->op, s)
		     : nb    ? khor_ireduce_scatter(comm, a, rb, count, dt, d->op, &req)
		             : khor_reduce_scatter(comm, a, rb, count, dt, d->op);
		break;
	}
	case K_ALLTOALL: {
		const void *sb = d->mode == 1 ? b : a;
		st = st_form ? khor_alltoall_stream(comm, sb, b, count, dt, s)
		     : nb    ? khor_ialltoall(comm, sb, b, count, dt, &req)
		             : khor_alltoall(comm, sb, b, count, dt);
		break;
	}
	case K_ALLGATHERV: {
		const size_t *displs = d->mode ? l->displs : NULL;
		st = nb ? khor_iallgatherv(comm, a, l->counts[r], b, l->counts, displs, dt, &req)
		        : khor_allgatherv(comm, a, l->counts[r], b, l->counts, displs, dt);
		break;
	}
	case K_ALLTOALLV: {
		const size_t *sd = d->mode ? l->sd : NULL, *rd = d->mode ? l->rd : NULL;
		st = nb ? khor_ialltoallv(comm, a, l->sc, sd, b, l->rc, rd, dt, &req)
		        : khor_alltoallv(comm, a, l->sc, sd, b, l->rc, rd, dt);
		break;
	}
	case K_GATHER: {
		const void *sb = d->mode == 1 && root ? b + (size_t)d->root * count * esz : a;
		void *rb = d->mode == 2 && !root ? NULL : b;
		st = nb ? khor_igather(comm, sb, rb, count, dt, d->root, &req)
		        : khor_gather(comm, sb, rb, count, dt, d->root);
		break;
	}
	case K_SCATTER: {
		const void *sb = d->mode == 2 && !root ? NULL : a;
		void *rb = d->mode == 1 && root ? a + (size_t)d->root * count * esz : b;
		st = nb ? khor_iscatter(comm, sb, rb, count, dt, d->root, &req)
		        : khor_scatter(comm, sb, rb, count, dt, d->root);
		break;
	}
	}
	if (nb && st == KHOR_SUCCESS) {
		st = khor_wait(req);
		khor_request_free(req);
	}
	return st;
}

static bool has_stream_form(enum kind k)
{
	return k == K_ALLREDUCE || k == K_BROADCAST || k == K_REDUCE || k == K_ALLGATHER ||
	       k == K_REDUCE_SCATTER || k == K_ALLTOALL;
}

/* Offset and place of the first differing byte, for the message. */
static void describe_diff(const uint8_t *want, const uint8_t *got, size_t len, size_t esz,
                          char *out, size_t outlen)
{
	size_t i = 0;

	while (i < len && want[i] == got[i])
		i++;
	if (i < GUARD || i >= len - GUARD)
		snprintf(out, outlen, "guard byte %zu written (%#x, host left %#x)", i, got[i],
		         want[i]);
	else
		snprintf(out, outlen, "byte %zu (element %zu): device %#x, host %#x", i - GUARD,
		         (i - GUARD) / esz, got[i], want[i]);
}

/* A device buffer of len bytes and its guards, holding what host[0 .. len + 2 GUARD) holds. */
static uint8_t *dev_copy_of(const uint8_t *host, size_t len)
{
	uint8_t *d = dev->alloc(len + 2 * GUARD);

	if (d != NULL && dev->copy_sync(d, host, len + 2 * GUARD) != KHOR_SUCCESS) {
		dev->free(d);
		return NULL;
	}
	return d;
}

static bool run_case(struct ctx *c, const dcase *d)
{
	size_t esz = khor_dtype_size(d->dt);
	layout l;
	bool ok = false;
	char diff[200];

	if (c->how >= H_STREAM && c->how <= H_STREAM_NULL && !has_stream_form(d->kind))
		return true;
	make_layout(c, d, &l);
	snprintf(c->where, sizeof(c->where), "%s (%s) dtype %d op %d count %zu root %d mode %d "
	         "salt %u%s", kind_names[d->kind], how_names[c->how], d->dt, d->op, d->count,
	         d->root, d->mode, d->salt, d->random ? " random floats" : "");
	size_t alen = l.alen + 2 * GUARD, blen = l.blen + 2 * GUARD;
	/* a0, b0 (the inputs) and ta, tb (the device run's results): ends of queued copies. */
	bool queued = c->how == H_AFTER_QUEUE || c->how == H_STREAM || c->how == H_STREAM_NULL;
	void *(*halloc)(size_t) = queued ? dev->host_alloc : malloc;
	void (*hfree)(void *) = queued ? dev->host_free : free;
	uint8_t *ha = malloc(alen), *hb = malloc(blen), *a0 = halloc(alen), *b0 = halloc(blen);
	uint8_t *ta = halloc(alen), *tb = halloc(blen), *da = NULL, *db = NULL;
	if (a0 == NULL || b0 == NULL || ta == NULL || tb == NULL) {
		snprintf(diff, sizeof(diff), "no pinned host memory (%zu B)", alen + blen);
		goto out;
	}
	memset(ha, POISON, alen);
	memset(hb, POISON, blen);
	fill_case(c, d, &l, ha + GUARD, hb + GUARD);
	memcpy(a0, ha, alen);
	memcpy(b0, hb, blen);

	/* The reference: the same call on host buffers. */
	enum how how = c->how;
	c->how = how == H_AFTER_QUEUE ? H_BLOCK : how;
	khor_status st = issue(c, d, &l, ha + GUARD, hb + GUARD);
	c->how = how;
	if (st != KHOR_SUCCESS) {
		snprintf(diff, sizeof(diff), "the host call failed: %s", khor_comm_error(c->comm));
		goto out;
	}

	if (how == H_BLOCK || how == H_NONBLOCKING) {
		da = dev_copy_of(a0, l.alen);
		db = dev_copy_of(b0, l.blen);
		if (da == NULL || db == NULL) {
			snprintf(diff, sizeof(diff), "%s alloc or upload failed", dev->name);
			goto out;
		}
		st = issue(c, d, &l, da + GUARD, db + GUARD);
	} else {
		/*
		 * The buffers start as garbage; the real inputs arrive by copies queued after a
		 * 200 ms delay, and the results leave by copies queued after the call.
		 */
		void *s = how == H_STREAM ? c->stream : NULL;
		kerr e;
		memset(ta, 0x3c, alen);
		memset(tb, 0x3c, blen);
		da = dev_copy_of(ta, l.alen);
		db = dev_copy_of(tb, l.blen);
		if (da == NULL || db == NULL) {
			snprintf(diff, sizeof(diff), "%s alloc or upload failed", dev->name);
			goto out;
		}
		kerr_clear(&e);
		if (dev->delay(s, 200000, &e) != KHOR_SUCCESS ||
		    dev->be->copy(da, a0, alen, s, &e) != KHOR_SUCCESS ||
		    dev->be->copy(db, b0, blen, s, &e) != KHOR_SUCCESS) {
			snprintf(diff, sizeof(diff), "queueing the inputs: %s", e.text);
			goto out;
		}
		st = issue(c, d, &l, da + GUARD, db + GUARD);
		if (st == KHOR_SUCCESS && how != H_AFTER_QUEUE &&
		    (dev->be->copy(ta, da, alen, s, &e) != KHOR_SUCCESS ||
		     dev->be->copy(tb, db, blen, s, &e) != KHOR_SUCCESS)) {
			snprintf(diff, sizeof(diff), "queueing the read-back: %s", e.text);
			goto out;
		}
		if (dev->stream_sync(s) != KHOR_SUCCESS) {
			snprintf(diff, sizeof(diff), "the stream did not finish in 60 s");
			goto out;
		}
	}
	if (st != KHOR_SUCCESS) {
		snprintf(diff, sizeof(diff), "the device call failed (status %d): %s", st,
		         khor_comm_error(c->comm));
		goto out;
	}
	if (how == H_BLOCK || how == H_NONBLOCKING || how == H_AFTER_QUEUE) {
		if (dev->copy_sync(ta, da, alen) != KHOR_SUCCESS ||
		    dev->copy_sync(tb, db, blen) != KHOR_SUCCESS) {
			snprintf(diff, sizeof(diff), "reading the device buffers back failed");
			goto out;
		}
	}
	if (memcmp(tb, hb, blen) != 0) {
		char m[160];
		describe_diff(hb, tb, blen, esz, m, sizeof(m));
		snprintf(diff, sizeof(diff), "receive buffer differs from the host call's: %s", m);
		goto out;
	}
	if (memcmp(ta, ha, alen) != 0) {
		char m[160];
		describe_diff(ha, ta, alen, esz, m, sizeof(m));
		snprintf(diff, sizeof(diff), "send buffer differs from the host call's: %s", m);
		goto out;
	}
	ok = true;
	c->passed++;
out:
	dev->free(da);
	dev->free(db);
	free(ha);
	free(hb);
	hfree(a0);
	hfree(b0);
	hfree(ta);
	hfree(tb);
	if (!ok)
		FAIL(c, "%s", diff);
	return true;
}

/* Every kind x dtype (x op where it reduces) x count, modes and roots cycling with the salt. */
static bool run_all_kinds(struct ctx *c, const size_t *counts, size_t ncounts, unsigned *salt)
{
	static const enum kind moving[] = { K_BROADCAST, K_ALLGATHER, K_ALLTOALL, K_GATHER,
		                            K_SCATTER };
	static const enum kind reducing[] = { K_ALLREDUCE, K_REDUCE, K_REDUCE_SCATTER };

	for (size_t t = 0; t < NDTYPES; t++) {
		khor_dtype dt = dtypes[t];
		for (size_t k = 0; k < ncounts; k++) {
			for (size_t o = 0; o < NOPS; o++) {
				if (!reduce_supported(dt, ops[o]))
					continue;
				for (size_t j = 0; j < 3; j++) {
					unsigned s = ++*salt;
					int root = (int)(s % (unsigned)c->n);
					dcase d = { reducing[j], dt, ops[o], counts[k],
						    root, (int)(s % 3), false, s };
					if (reducing[j] == K_ALLREDUCE)
						d.mode = (int)(s % 2);
					if (!run_case(c, &d))
						return false;
				}
			}
			for (size_t j = 0; j < sizeof(moving) / sizeof(moving[0]); j++) {
				unsigned s = ++*salt, nmodes = moving[j] == K_BROADCAST ? 1 : 3;
				if (moving[j] == K_ALLGATHER || moving[j] == K_ALLTOALL)
					nmodes = 2;
				int root = (int)((s / 3) % (unsigned)c->n);
				dcase d = { moving[j], dt, KHOR_SUM, counts[k],
					    root, (int)(s % nmodes), false, s };
				if (!run_case(c, &d))
					return false;
			}
		}
		for (int g = 0; g < 2; g++) {
			unsigned s = ++*salt;
			dcase v1 = { K_ALLGATHERV, dt, KHOR_SUM, 0, 0, g, false, s };
			dcase v2 = { K_ALLTOALLV, dt, KHOR_SUM, 0, 0, g, false, s };
			if (!run_case(c, &v1) || !run_case(c, &v2))
				return false;
		}
	}
	return true;
}

/* A few MiB per kind: pipelines of many slices. */
static bool run_large(struct ctx *c, unsigned *salt)
{
	const size_t mib3 = 3u << 20, per = mib3 / (size_t)c->n;
	const dcase big[] = {
		{ K_ALLREDUCE, KHOR_FLOAT32, KHOR_SUM, mib3 / 4 + 3, 0, 0, false, 0 },
		{ K_ALLREDUCE, KHOR_BFLOAT16, KHOR_AVG, mib3 / 2 + 1, 0, 1, false, 0 },
		{ K_REDUCE, KHOR_INT32, KHOR_MAX, mib3 / 4 + 1, 1, 0, false, 0 },
		{ K_REDUCE_SCATTER, KHOR_FLOAT32, KHOR_SUM, mib3 / 4 + 7, 0, 0, false, 0 },
		{ K_BROADCAST, KHOR_UINT8, KHOR_SUM, mib3 + 1, 1, 0, false, 0 },
		{ K_ALLGATHER, KHOR_FLOAT64, KHOR_SUM, per / 8 + 1, 0, 1, false, 0 },
		{ K_ALLTOALL, KHOR_INT32, KHOR_SUM, per / 4 + 1, 0, 0, false, 0 },
		{ K_GATHER, KHOR_FLOAT32, KHOR_SUM, per / 4 + 1, 0, 0, false, 0 },
		{ K_SCATTER, KHOR_FLOAT32, KHOR_SUM, per / 4 + 1, 0, 0, false, 0 },
	};

	for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
		dcase d = big[i];
		d.salt = ++*salt;
		d.root %= c->n;
		if (!run_case(c, &d))
			return false;
	}
	return true;
}

/* Allreduce under each schedule, random floats included: same order, same bits. */
static bool run_algos(struct ctx *c, unsigned *salt)
{
	static const char *const algos[] = { "ring", "rd", "tree", "hd" };
	const size_t counts[] = { 1, 1031, (3u << 20) / 4 + 5 };

	for (size_t a = 0; a < 4; a++) {
		if (khor_comm_set(c->comm, "KHOR_ALGO", algos[a]) != KHOR_SUCCESS) {
			snprintf(c->report, TEXT, "rank %d: KHOR_ALGO=%s: %s", c->rank, algos[a],
			         khor_comm_error(c->comm));
			return false;
		}
		for (size_t t = 0; t < NDTYPES; t++) {
			for (size_t o = 0; o < NOPS; o++) {
				khor_dtype dt = dtypes[t];
				/* The large size for sum and avg, and every op of float32. */
				for (size_t k = 0; k < (o < 2 || t == 0 ? 3u : 2u); k++) {
					if (!reduce_supported(dt, ops[o]))
						continue;
					unsigned s = ++*salt;
					dcase d = { K_ALLREDUCE, dt, ops[o], counts[k],
						    0, (int)(s % 2), is_float(dt), s };
					if (!run_case(c, &d)) {
						size_t l = strlen(c->report);
						snprintf(c->report + l, TEXT - l, " (KHOR_ALGO=%s)",
						         algos[a]);
						return false;
					}
				}
			}
		}
	}
	return true;
}

/* Every form on two dtypes and sizes: the _stream forms, after queued work, the i-forms. */
static bool run_forms(struct ctx *c, unsigned *salt)
{
	static const enum how hows[] = { H_STREAM, H_STREAM_NULL, H_AFTER_QUEUE, H_NONBLOCKING };
	const size_t counts[] = { 1, 100003 };

	for (size_t h = 0; h < sizeof(hows) / sizeof(hows[0]); h++) {
		c->how = hows[h];
		for (int k = K_ALLREDUCE; k <= K_SCATTER; k++) {
			for (size_t m = 0; m < 2; m++) {
				unsigned s = ++*salt;
				dcase d = { (enum kind)k, m == 0 ? KHOR_FLOAT32 : KHOR_INT16,
					    m == 0 ? KHOR_SUM : KHOR_MAX, counts[m],
					    (int)(s % (unsigned)c->n), (int)(s % 2), false, s };
				if (!run_case(c, &d))
					return false;
			}
		}
	}
	return true;
}

/*
 * Back-to-back calls that switch streams, with no sync between them: with slow stream
 * operations (KHOR_MEM_EMU_DELAY_US) a call's last device work is still queued when the
 * next call, on another stream, starts reusing the comm's device scratch and staging.
 * Every result is read only at the end. On a GPU the streams are fast and that window
 * short: there the case checks the results of stream switches, and catches a race only
 * when it happens to land.
 */
#define NSWITCH 12

static bool run_switch(struct ctx *c, unsigned *salt)
{
	/* Mostly reductions: their last device steps read the comm's device scratch. */
	static const enum kind kinds[] = { K_REDUCE, K_ALLREDUCE, K_REDUCE_SCATTER, K_REDUCE,
		                           K_ALLGATHER, K_ALLREDUCE };
	/* Each call on another stream than the one before: s0, s1, own, s1, NULL, s0. */
	static const enum how hows[] = { H_STREAM, H_STREAM,      H_BLOCK,
		                         H_STREAM, H_STREAM_NULL, H_STREAM };
	static const int which[] = { 0, 1, 0, 1, 0, 0 };
	void *streams[2] = { c->stream, NULL };
	struct one {
		dcase d;
		layout l;
		uint8_t *ha, *hb, *da, *db, *ta, *tb;
	} calls[NSWITCH];
	kerr e;
	bool ok = true;

	kerr_clear(&e);
	if (dev->be->stream_create(&streams[1], &e) != KHOR_SUCCESS)
		FAIL(c, "stream_create: %s", e.text);
	memset(calls, 0, sizeof(calls));
	for (int i = 0; i < NSWITCH && ok; i++) {
		struct one *o = &calls[i];
		unsigned s = ++*salt;
		o->d = (dcase){ kinds[i % 6], i % 2 ? KHOR_INT32 : KHOR_FLOAT32, KHOR_SUM,
			        300001 + (size_t)i, (int)(s % (unsigned)c->n), 0, false, s };
		make_layout(c, &o->d, &o->l);
		size_t alen = o->l.alen + 2 * GUARD, blen = o->l.blen + 2 * GUARD;
		o->ha = malloc(alen);
		o->hb = malloc(blen);
		o->ta = malloc(alen);
		o->tb = malloc(blen);
		memset(o->ha, POISON, alen);
		memset(o->hb, POISON, blen);
		fill_case(c, &o->d, &o->l, o->ha + GUARD, o->hb + GUARD);
		o->da = dev_copy_of(o->ha, o->l.alen);
		o->db = dev_copy_of(o->hb, o->l.blen);
		c->how = H_BLOCK;
		snprintf(c->where, sizeof(c->where), "stream switch %d: %s (host)", i,
		         kind_names[o->d.kind]);
		if (o->da == NULL || o->db == NULL)
			ok = false;
		else if (issue(c, &o->d, &o->l, o->ha + GUARD, o->hb + GUARD) != KHOR_SUCCESS)
			ok = false;
	}
	for (int i = 0; i < NSWITCH && ok; i++) {
		struct one *o = &calls[i];
		c->how = hows[i % 6];
		c->stream = streams[which[i % 6]];
		snprintf(c->where, sizeof(c->where), "stream switch %d: %s (%s, stream %d)", i,
		         kind_names[o->d.kind], how_names[c->how], which[i % 6]);
		if (issue(c, &o->d, &o->l, o->da + GUARD, o->db + GUARD) != KHOR_SUCCESS)
			ok = false;
	}
	c->stream = streams[0];
	c->how = H_BLOCK;
	if (!ok)
		FAIL(c, "failed: %s", khor_comm_error(c->comm));
	if (dev->stream_sync(streams[0]) != KHOR_SUCCESS ||
	    dev->stream_sync(streams[1]) != KHOR_SUCCESS ||
	    dev->stream_sync(NULL) != KHOR_SUCCESS)
		FAIL(c, "the streams did not finish in 60 s");
	dev->be->stream_destroy(streams[1]);
	for (int i = 0; i < NSWITCH; i++) {
		struct one *o = &calls[i];
		size_t alen = o->l.alen + 2 * GUARD, blen = o->l.blen + 2 * GUARD;
		snprintf(c->where, sizeof(c->where), "stream switch %d: %s (%s, stream %d)", i,
		         kind_names[o->d.kind], how_names[hows[i % 6]], which[i % 6]);
		if (dev->copy_sync(o->ta, o->da, alen) != KHOR_SUCCESS ||
		    dev->copy_sync(o->tb, o->db, blen) != KHOR_SUCCESS)
			FAIL(c, "reading back failed");
		if (memcmp(o->ta, o->ha, alen) != 0 || memcmp(o->tb, o->hb, blen) != 0) {
			char m[160];
			bool inb = memcmp(o->tb, o->hb, blen) != 0;
			describe_diff(inb ? o->hb : o->ha, inb ? o->tb : o->ta, inb ? blen : alen,
			              khor_dtype_size(o->d.dt), m, sizeof(m));
			FAIL(c, "%s buffer differs from the host call's: %s", inb ? "receive" : "send",
			     m);
		}
		dev->free(o->da);
		dev->free(o->db);
		free(o->ha);
		free(o->hb);
		free(o->ta);
		free(o->tb);
		c->passed++;
	}
	return true;
}

/* ---- jobs -------------------------------------------------------------------------- */

enum what { W_ALL, W_ALGOS, W_FORMS, W_SWITCH };

struct job {
	const char *transport;
	const char *delay_us; /* KHOR_MEM_EMU_DELAY_US, or NULL */
	enum what what;
	char (*report)[TEXT]; /* [rank], shared with the parent */
};

static int body(int rank, int n, khor_config *cfg, void *arg)
{
	const struct job *j = arg;
	struct ctx c = { .rank = rank, .n = n, .how = H_BLOCK, .report = j->report[rank] };
	unsigned salt = 0;
	char err[TEXT];
	kerr e;

	/* The emu backend reads its knob once, at its first use: this process's. */
	if (j->delay_us != NULL)
		setenv("KHOR_MEM_EMU_DELAY_US", j->delay_us, 1);
	if (!dev->start(err, sizeof(err))) {
		snprintf(c.report, TEXT, "rank %d: %s: %s", rank, dev->name, err);
		return 9;
	}
	khor_config_set(cfg, "KHOR_TRANSPORT", j->transport);
	/*
	 * khor's own schedules are what is under test: KHOR_NCCL=auto would hand CUDA memory to
	 * NCCL inside the node (which refuses ranks that share one GPU).
	 */
	khor_config_set(cfg, "KHOR_NCCL", "off");
	if (khor_init(cfg, err, sizeof(err), &c.comm) != KHOR_SUCCESS) {
		snprintf(c.report, TEXT, "rank %d: init: %s", rank, err);
		return 10;
	}
	kerr_clear(&e);
	if (dev->be->stream_create(&c.stream, &e) != KHOR_SUCCESS) {
		snprintf(c.report, TEXT, "rank %d: stream_create: %s", rank, e.text);
		return 11;
	}
	if (j->what == W_ALL) {
		const size_t counts[] = { 0, 1, 13, 1031 };
		if (!run_all_kinds(&c, counts, 4, &salt))
			return 20;
		if (!run_large(&c, &salt))
			return 21;
	} else if (j->what == W_ALGOS) {
		if (!run_algos(&c, &salt))
			return 30;
	} else if (j->what == W_FORMS) {
		if (!run_forms(&c, &salt))
			return 40;
	} else {
		for (int round = 0; round < 3; round++)
			if (!run_switch(&c, &salt))
				return 45;
	}
	dev->be->stream_destroy(c.stream);
	if (khor_barrier(c.comm) != KHOR_SUCCESS)
		return 50;
	if (rank == 0)
		fprintf(stderr, "%s %s n=%d%s%s: %u cases gave the host calls' bytes\n", dev->name,
		        j->transport, n, j->delay_us != NULL ? " KHOR_MEM_EMU_DELAY_US=" : "",
		        j->delay_us != NULL ? j->delay_us : "", c.passed);
	khor_finalize(c.comm);
	return 0;
}

static void run_job(int n, const char *transport, const char *delay, enum what what,
                    double deadline_s)
{
	/* KHOR_TEST_DEVICE_MAX_N: the sanitizer build's CTest runs the jobs of 2 ranks and fewer
	 * (tests.cmake), the plain build all of them. */
	const char *max = getenv("KHOR_TEST_DEVICE_MAX_N");
	if (max != NULL && *max != '\0' && n > atoi(max)) {
		fprintf(stderr, "%s n=%d %s: not run (KHOR_TEST_DEVICE_MAX_N=%s)\n", dev->name, n,
		        transport, max);
		return;
	}
	struct job j = { transport, delay, what, harness_shared(HARNESS_MAX_RANKS * TEXT) };
	harness_opts o = { .n = n, .timeout = "30s", .deadline_s = deadline_s };
	harness_result res;
	bool ok = harness_run(&o, body, &j, &res);

	for (int r = 0; r < n; r++)
		cr_expect_eq(res.status[r], 0, "%s n=%d %s%s%s: rank %d exited %d%s%s", dev->name,
		             n, transport, delay ? " delay " : "", delay ? delay : "", r,
		             res.status[r], j.report[r][0] ? ": " : "", j.report[r]);
	cr_assert(ok && !res.timed_out, "%s n=%d %s: failed%s", dev->name, n, transport,
	          res.timed_out ? " (timed out)" : "");
	harness_shared_free(j.report, HARNESS_MAX_RANKS * TEXT);
}

#define ALL_TEST(T, N)                                                                     \
	Test(device, every_collective_##T##_n##N, .timeout = 300)                          \
	{                                                                                  \
		NEED_DEVICE();                                                             \
		run_job(N, #T, NULL, W_ALL, 280);                                          \
	}

ALL_TEST(tcp, 1)
ALL_TEST(tcp, 2)
ALL_TEST(tcp, 3)
ALL_TEST(tcp, 4)
ALL_TEST(shm, 2)
ALL_TEST(shm, 3)
ALL_TEST(shm, 4)

Test(device, every_collective_with_stream_delays_tcp_n3, .timeout = 300)
{
	NEED_DEVICE();
	if (dev != &emu_dev)
		cr_skip_test("KHOR_MEM_EMU_DELAY_US slows the emulated device's streams only: "
		             "on %s this would repeat every_collective_tcp_n3", dev->name);
	run_job(3, "tcp", "50", W_ALL, 280);
}

Test(device, allreduce_schedules_random_floats, .timeout = 300)
{
	NEED_DEVICE();
	run_job(2, "shm", NULL, W_ALGOS, 90);
	run_job(3, "tcp", NULL, W_ALGOS, 90);
	run_job(4, "shm", NULL, W_ALGOS, 90);
}

Test(device, stream_forms_and_nonblocking, .timeout = 300)
{
	NEED_DEVICE();
	run_job(1, "tcp", NULL, W_FORMS, 60);
	run_job(2, "tcp", NULL, W_FORMS, 100);
	run_job(3, "shm", "50", W_FORMS, 100);
	run_job(4, "tcp", "50", W_FORMS, 100);
}

Test(device, calls_that_switch_streams_back_to_back, .timeout = 200)
{
	NEED_DEVICE();
	run_job(2, "tcp", "2000", W_SWITCH, 90);
	run_job(3, "shm", "2000", W_SWITCH, 90);
}

/* ---- mixing host and device memory -------------------------------------------------- */

enum mix { MIX_ALLREDUCE, MIX_BROADCAST, MIX_BROADCAST_FROM_HOST, MIX_LOCAL_ALL, MIX_LOCAL_ONE };
static const char *const mix_names[] = {
	"allreduce, rank 0 host buffers, the others device",
	"broadcast from rank 1 (device), rank 0 host buffer",
	"broadcast from rank 0 (host buffer), the others device",
	"allreduce, every rank a host send buffer and a device receive buffer",
	"allreduce, rank 1 a host send buffer and a device receive buffer, the others device",
};

struct mixjob {
	enum mix mix;
	const char *transport;
	char (*report)[TEXT];
};

static int body_mix(int rank, int n, khor_config *cfg, void *arg)
{
	const struct mixjob *m = arg;
	char *out = m->report[rank], err[TEXT];
	const size_t count = 4099, len = count * 4;
	khor_comm *comm;

	if (!dev->start(err, sizeof(err))) {
		snprintf(out, TEXT, "%s: %s", dev->name, err);
		return 9;
	}
	khor_config_set(cfg, "KHOR_TRANSPORT", m->transport);
	khor_config_set(cfg, "KHOR_NCCL", "off"); /* as in body */
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		snprintf(out, TEXT, "init: %s", err);
		return 10;
	}
	float *hs = calloc(count, 4), *hr = calloc(count, 4);
	void *ds = dev->alloc(len), *dr = dev->alloc(len);
	if (ds == NULL || dr == NULL || dev->copy_sync(ds, hs, len) != KHOR_SUCCESS) {
		snprintf(out, TEXT, "%s alloc or upload failed", dev->name);
		return 11;
	}
	bool host = rank == 0 && m->mix <= MIX_BROADCAST_FROM_HOST;
	const void *sb = host ? (void *)hs : ds;
	void *rb = host ? (void *)hr : dr;
	if (m->mix == MIX_LOCAL_ALL || (m->mix == MIX_LOCAL_ONE && rank == 1))
		sb = hs;
	uint64_t t0 = kclock_ns();
	khor_status st = m->mix == MIX_BROADCAST ? khor_broadcast(comm, rb, count, KHOR_FLOAT32, 1)
	                 : m->mix == MIX_BROADCAST_FROM_HOST
	                         ? khor_broadcast(comm, rb, count, KHOR_FLOAT32, 0)
	                         : khor_allreduce(comm, sb, rb, count, KHOR_FLOAT32, KHOR_SUM);
	/*
	 * A broadcast is one-way: a rank that only sends (the root), or only receives from
	 * ranks of its own kind, sees no frame of the other kind, and its part succeeds. The
	 * ranks that do see one fail the job; those learn it at their next call, which must
	 * then fail with the cause (khor.h).
	 */
	if (st == KHOR_SUCCESS && (m->mix == MIX_BROADCAST || m->mix == MIX_BROADCAST_FROM_HOST))
		st = khor_barrier(comm);
	double secs = (double)(kclock_ns() - t0) / 1e9;
	const char *text = khor_comm_error(comm);
	int rc = 0;
	if (st == KHOR_SUCCESS) {
		snprintf(out, TEXT, "the call succeeded");
		rc = 20;
	} else if (st == KHOR_ERR_TIMEOUT || secs > 5.0) {
		snprintf(out, TEXT, "status %d after %.1f s (must be found, not waited out): %s",
		         st, secs, text);
		rc = 21;
	} else if (strstr(text, "device") == NULL || strstr(text, "host") == NULL) {
		snprintf(out, TEXT, "status %d, the error does not say device/host memory: %s", st,
		         text);
		rc = 22;
	} else {
		snprintf(out, TEXT, "status %d after %.2f s: %s", st, secs, text);
	}
	dev->free(ds);
	dev->free(dr);
	free(hs);
	free(hr);
	khor_finalize(comm);
	return rc;
}

Test(device, mixed_host_and_device_memory_is_an_error_on_every_rank, .timeout = 200)
{
	NEED_DEVICE();
	static const struct {
		enum mix mix;
		int n;
		const char *tp;
	} runs[] = {
		{ MIX_ALLREDUCE, 2, "tcp" },           { MIX_ALLREDUCE, 3, "shm" },
		{ MIX_BROADCAST, 2, "tcp" },           { MIX_BROADCAST, 3, "tcp" },
		{ MIX_BROADCAST_FROM_HOST, 3, "shm" }, { MIX_LOCAL_ALL, 2, "tcp" },
		{ MIX_LOCAL_ONE, 3, "tcp" },
	};
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		struct mixjob m = { runs[i].mix, runs[i].tp,
			            harness_shared(HARNESS_MAX_RANKS * TEXT) };
		harness_opts o = { .n = runs[i].n, .timeout = "30s", .deadline_s = 25 };
		harness_result res;
		harness_run(&o, body_mix, &m, &res);
		cr_expect(!res.timed_out, "%s (n %d, %s): hung", mix_names[m.mix], runs[i].n,
		          runs[i].tp);
		for (int r = 0; r < runs[i].n; r++) {
			cr_expect_eq(res.status[r], 0, "%s (n %d, %s): rank %d exited %d: %s",
			             mix_names[m.mix], runs[i].n, runs[i].tp, r, res.status[r],
			             m.report[r]);
			if (res.status[r] == 0)
				cr_log_info("%s (n %d): rank %d: %s", mix_names[m.mix], runs[i].n,
				            r, m.report[r]);
		}
		harness_shared_free(m.report, HARNESS_MAX_RANKS * TEXT);
	}
}
