/*
 * test_cuda_mem.c -- the cuda backend of the memory seam (cuda/mem_cuda.c) against the
 * contract of collectives/mem.h, on a real GPU.
 *
 * What kind query finds for each way CUDA hands out memory (cuMemAlloc, cuMemHostAlloc,
 * cudaMalloc, managed, cudaHostRegister'd, cuMemCreate/cuMemMap, whose context attribute
 * is NULL) and for plain host memory, also from a thread with no current context; copies
 * between every pair of kinds; reduce, avg and scale for every dtype against the CPU's
 * kernels and the engine's scale rule (a NaN made by arithmetic may differ in payload, as
 * in test_cuda_reduce.c); events and stream order (a blocking stream after the legacy
 * default stream, a stream waiting on another's event); kmem_stream_sync's deadline; the
 * device state helpers of collectives/mem.c. Without a GPU (none here: CUDA but no driver)
 * the GPU tests skip and say why; the first test runs everywhere.
 */
#include "base/dtype.h"
#include "collectives/mem.h"
#include "collectives/reduce.h"
#include "cuda/mem_cuda.h"

#include <criterion/criterion.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/mem_check.h"
#include "tests/values.h"
#include "gpu_check.h"

#define NDTYPES 10
#define NOPS 5
#define AVG_N 3

static const kmem_backend *const be = &kmem_cuda_backend;

#define NEED_GPU() GPU_NEED(mem_cuda_usable, "no usable CUDA GPU here")

/*
 * The tests that run khor's kernels also need the CUDA runtime they were built with to
 * accept the driver (as test_cuda_reduce.c checks): an older driver skips them, with why.
 */
#define NEED_KERNELS()                                                                     \
	do {                                                                               \
		NEED_GPU();                                                                \
		GPU_NEED(gpu_cudart_usable, "khor's CUDA kernels cannot run here");       \
	} while (0)

#define OK(call)                                                                           \
	do {                                                                               \
		kerr e_;                                                                   \
		kerr_clear(&e_);                                                           \
		khor_status s_ = (call);                                                   \
		cr_assert_eq(s_, KHOR_SUCCESS, "%s: %d: %s", #call, (int)s_, e_.text);     \
	} while (0)
/* OK's own kerr, for the call inside it. */
#define ERR (&e_)

#define CUDART_OK(call)                                                                    \
	do {                                                                               \
		cudaError_t c_ = (call);                                                   \
		cr_assert_eq(c_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(c_));    \
	} while (0)

/* Device 0's primary context, bound on this thread: the state every GPU test starts in. */
static void *bind_device0(void)
{
	void *ctx = NULL;

	OK(mem_cuda_device_ctx(0, &ctx, ERR));
	OK(be->bind(ctx, ERR));
	return ctx;
}

static khor_status sync_stream(void *stream, kerr *err)
{
	return kmem_stream_sync(be, stream, kdeadline_in_ms(30000), "test", err);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static void fill_random(unsigned char *p, size_t bytes)
{
	values_fill_random(p, bytes, &rng_state);
}

Test(cuda_mem, without_a_gpu_every_buffer_is_host_memory)
{
	char why[512];
	int x = 0;
	void *heap = malloc(64);
	kmem_where w;
	bool listed = false;

	cr_assert(heap != NULL);
	for (int i = 0; kmem_backends[i] != NULL; i++)
		listed |= kmem_backends[i] == be;
	cr_expect(listed, "kmem_backends lists the cuda backend");
	cr_expect_str_eq(be->name, "cuda");
	kmem_query(heap, &w);
	cr_expect_eq(w.kind, KMEM_HOST, "malloc'd memory is host memory");
	cr_expect_null(w.be);
	kmem_query(&x, &w);
	cr_expect_eq(w.kind, KMEM_HOST, "the stack is host memory");
	cr_expect(!be->query(heap, &w), "the cuda backend does not claim malloc'd memory");
	if (!mem_cuda_usable(why, sizeof(why))) {
		void *s = NULL;
		kerr e;
		kerr_clear(&e);
		cr_log_info("no usable GPU: %s", why);
		cr_expect_neq(why[0], '\0', "the reason is said");
		cr_expect_neq(be->stream_create(&s, &e), KHOR_SUCCESS,
		              "no stream without a GPU");
		cr_expect_neq(e.text[0], '\0', "and the error says why");
		cr_expect_eq(be->dmabuf_fd(heap, 64, &(uint64_t){ 0 }), -1);
	}
	free(heap);
}

/* The driver entry points only this test needs (VMM memory), loaded as mem_cuda.c does. */
static struct {
	__typeof__(cuMemGetAllocationGranularity) *granularity;
	__typeof__(cuMemCreate) *create;
	__typeof__(cuMemAddressReserve) *reserve;
	__typeof__(cuMemMap) *map;
	__typeof__(cuMemSetAccess) *set_access;
	__typeof__(cuMemUnmap) *unmap;
	__typeof__(cuMemAddressFree) *address_free;
	__typeof__(cuMemRelease) *release;
} vmm;

static bool vmm_load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (h == NULL)
		return false;
	*(void **)&vmm.granularity = dlsym(h, "cuMemGetAllocationGranularity");
	*(void **)&vmm.create = dlsym(h, "cuMemCreate");
	*(void **)&vmm.reserve = dlsym(h, "cuMemAddressReserve");
	*(void **)&vmm.map = dlsym(h, "cuMemMap");
	*(void **)&vmm.set_access = dlsym(h, "cuMemSetAccess");
	*(void **)&vmm.unmap = dlsym(h, "cuMemUnmap");
	*(void **)&vmm.address_free = dlsym(h, "cuMemAddressFree");
	*(void **)&vmm.release = dlsym(h, "cuMemRelease");
	return vmm.granularity && vmm.create && vmm.reserve && vmm.map && vmm.set_access &&
	       vmm.unmap && vmm.address_free && vmm.release;
}

static void expect_kind(const void *p, kmem_kind kind, const char *what)
{
	kmem_where w;
	char buf[128];

	kmem_query(p, &w);
	cr_expect_eq(w.kind, kind, "%s: %s", what, kmem_describe(&w, buf, sizeof(buf)));
	if (kind == KMEM_HOST) {
		cr_expect_null(w.be, "%s", what);
		return;
	}
	cr_expect_eq(w.be, be, "%s is the cuda backend's", what);
	if (kind == KMEM_DEVICE) {
		cr_expect_eq(w.device, 0, "%s is on device 0", what);
		cr_expect_not_null(w.ctx, "%s has a context to bind", what);
	} else {
		cr_expect_eq(w.device, -1, "%s", what);
	}
}

Test(cuda_mem, query_finds_the_kind_of_every_allocation, .timeout = 120)
{
	NEED_GPU();
	void *ctx = bind_device0(), *dev, *pinned, *rt_dev = NULL, *managed = NULL;
	size_t len = 1 << 20;
	char *heap = malloc(len), *registered = malloc(len);
	kmem_where w;
	char buf[128];

	cr_assert(heap && registered);
	OK(be->dev_alloc(len, &dev, ERR));
	OK(be->host_alloc(len, &pinned, ERR));
	expect_kind(dev, KMEM_DEVICE, "cuMemAlloc'd memory");
	expect_kind((char *)dev + len - 1, KMEM_DEVICE, "the last byte of cuMemAlloc'd memory");
	kmem_query(dev, &w);
	cr_expect_eq(w.ctx, ctx, "cuMemAlloc'd memory belongs to the bound context");
	cr_expect_str_eq(kmem_describe(&w, buf, sizeof(buf)), "cuda device 0 memory");
	expect_kind(pinned, KMEM_PINNED, "cuMemHostAlloc'd memory");
	expect_kind(heap, KMEM_HOST, "malloc'd memory");
	expect_kind(&len, KMEM_HOST, "the stack");

	char why[512];
	bool rt = gpu_cudart_usable(why, sizeof(why));
	if (rt) {
		CUDART_OK(cudaMalloc(&rt_dev, len));
		expect_kind(rt_dev, KMEM_DEVICE, "cudaMalloc'd memory");
		CUDART_OK(cudaMallocManaged(&managed, len, cudaMemAttachGlobal));
		expect_kind(managed, KMEM_DEVICE, "managed memory");
		CUDART_OK(cudaHostRegister(registered, len, cudaHostRegisterDefault));
		expect_kind(registered, KMEM_PINNED, "cudaHostRegister'd memory");
		CUDART_OK(cudaHostUnregister(registered));
		expect_kind(registered, KMEM_HOST, "unregistered memory");
	} else {
		cr_log_warn("the CUDA runtime is unusable (%s): cudaMalloc'd, managed and "
		            "registered memory not checked", why);
	}

	/* cuMemCreate + cuMemMap: no context attribute; query must give the primary's. */
	if (vmm_load()) {
		CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
		                             .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE,
		                                           .id = 0 } };
		CUmemAccessDesc access = { .location = prop.location,
		                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		size_t gran = 0;
		CUmemGenericAllocationHandle hdl;
		CUdeviceptr va;
		cr_assert_eq(vmm.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), 0);
		cr_assert_eq(vmm.create(&hdl, gran, &prop, 0), 0);
		cr_assert_eq(vmm.reserve(&va, gran, 0, 0, 0), 0);
		cr_assert_eq(vmm.map(va, gran, 0, hdl, 0), 0);
		cr_assert_eq(vmm.set_access(va, gran, &access, 1), 0);
		expect_kind((void *)(uintptr_t)va, KMEM_DEVICE, "cuMemCreate'd memory");
		kmem_query((void *)(uintptr_t)va, &w);
		cr_expect_eq(w.ctx, ctx, "VMM memory is bound through the primary context");
		vmm.unmap(va, gran);
		vmm.address_free(va, gran);
		vmm.release(hdl);
	} else {
		cr_log_warn("the driver lacks the VMM calls: cuMemCreate'd memory not checked");
	}
	if (rt) {
		CUDART_OK(cudaFree(managed));
		CUDART_OK(cudaFree(rt_dev));
	}
	be->host_free(pinned);
	be->dev_free(dev);
	free(heap);
	free(registered);
}

/* What a thread that has never touched CUDA sees, and does once it binds. */
struct fresh {
	void *dev, *ctx;
	kmem_where w, host;
	khor_status before, bind, alloc, copy, sync;
	void *p;
	int value;
	char text[KERR_TEXT_MAX];
};

static void *fresh_thread(void *arg)
{
	struct fresh *f = arg;
	kerr e;
	void *s = NULL;

	kerr_clear(&e);
	kmem_query(f->dev, &f->w);
	kmem_query(&e, &f->host);
	f->before = be->stream_create(&s, &e); /* no context yet */
	if (f->before == KHOR_SUCCESS)
		be->stream_destroy(s);
	f->bind = be->bind(f->w.ctx, &e);
	if (f->bind == KHOR_SUCCESS)
		f->alloc = be->dev_alloc(4096, &f->p, &e);
	if (f->bind == KHOR_SUCCESS && f->alloc == KHOR_SUCCESS) {
		f->copy = be->copy(f->p, f->dev, sizeof(int), NULL, &e);
		if (f->copy == KHOR_SUCCESS)
			f->copy = be->copy(&f->value, f->p, sizeof(int), NULL, &e);
		f->sync = sync_stream(NULL, &e);
		be->dev_free(f->p);
	}
	snprintf(f->text, sizeof(f->text), "%s", e.text);
	return NULL;
}

Test(cuda_mem, a_thread_without_a_context_queries_and_binds, .timeout = 60)
{
	NEED_GPU();
	void *ctx = bind_device0();
	struct fresh f = { .alloc = -1, .copy = -1, .sync = -1 };
	int v = 1234;
	pthread_t t;

	OK(be->dev_alloc(4096, &f.dev, ERR));
	OK(be->copy(f.dev, &v, sizeof(v), NULL, ERR));
	OK(sync_stream(NULL, ERR));
	cr_assert_eq(pthread_create(&t, NULL, fresh_thread, &f), 0);
	pthread_join(t, NULL);
	cr_expect_eq(f.w.kind, KMEM_DEVICE, "query needs no current context");
	cr_expect_eq(f.w.ctx, ctx);
	cr_expect_eq(f.host.kind, KMEM_HOST, "and finds host memory there too");
	cr_expect_neq(f.before, KHOR_SUCCESS, "the queries left the thread without a context");
	cr_expect_eq(f.bind, KHOR_SUCCESS, "%s", f.text);
	cr_expect_eq(f.alloc, KHOR_SUCCESS, "%s", f.text);
	cr_expect_eq(f.copy, KHOR_SUCCESS, "%s", f.text);
	cr_expect_eq(f.sync, KHOR_SUCCESS, "%s", f.text);
	cr_expect_eq(f.value, 1234, "the fresh thread read the device's value");
	be->dev_free(f.dev);
}

Test(cuda_mem, copies_between_every_kind, .timeout = 120)
{
	NEED_GPU();
	bind_device0();
	size_t len = (4 << 20) + 13;
	unsigned char *src = malloc(len), *back = malloc(len);
	void *d1, *d2, *pin, *s;

	cr_assert(src && back);
	fill_random(src, len);
	OK(be->dev_alloc(len, &d1, ERR));
	OK(be->dev_alloc(len, &d2, ERR));
	OK(be->host_alloc(len, &pin, ERR));
	OK(be->stream_create(&s, ERR));
	/* pageable -> device -> device -> pinned -> pageable, on a stream of our own */
	OK(be->copy(d1, src, len, s, ERR));
	OK(be->copy(d2, d1, len, s, ERR));
	OK(be->copy(pin, d2, len, s, ERR));
	OK(sync_stream(s, ERR));
	memcpy(back, pin, len);
	cr_expect_eq(memcmp(back, src, len), 0, "host -> device -> device -> pinned");
	/* pinned -> device at an odd offset, and back, on the legacy default stream */
	memset(pin, 0x5a, len);
	OK(be->copy((char *)d1 + 3, pin, len - 3, NULL, ERR));
	OK(be->copy(back, (char *)d1 + 3, len - 3, NULL, ERR));
	OK(sync_stream(NULL, ERR));
	for (size_t i = 0; i < len - 3; i++)
		if (back[i] != 0x5a)
			cr_assert_fail("byte %zu after pinned -> device -> host: 0x%02x", i, back[i]);
	/* dst == src and empty copies do nothing */
	OK(be->copy(d1, d1, len, s, ERR));
	OK(be->copy(d1, d2, 0, s, ERR));
	/* memset_zero */
	OK(be->memset_zero((char *)d2 + 1, 1000, s, ERR));
	OK(be->copy(back, d2, 1002, s, ERR));
	OK(sync_stream(s, ERR));
	cr_expect_eq(back[0], src[0]);
	for (size_t i = 1; i <= 1000; i++)
		if (back[i] != 0)
			cr_assert_fail("memset_zero left byte %zu at 0x%02x", i, back[i]);
	cr_expect_eq(back[1001], src[1001]);
	be->stream_destroy(s);
	be->host_free(pin);
	be->dev_free(d2);
	be->dev_free(d1);
	free(src);
	free(back);
}

/* One backend reduce (and avg) against the CPU kernels; out = a when in_place. */
static void check_reduce(void *s, khor_dtype d, khor_op op, size_t count, bool in_place)
{
	mem_check m;

	OK(mem_check_alloc(&m, be, count * kdtype_size(d), ERR));
	fill_random(m.a, m.bytes);
	fill_random(m.b, m.bytes);
	OK(mem_check_reduce(&m, s, count, d, op, in_place, AVG_N, ERR));
	size_t bad = values_first_mismatch(m.got, m.want, count, d, values_arith(op));
	if (bad < count)
		cr_assert_fail("%s %s, count %zu%s: element %zu: gpu 0x%llx, cpu 0x%llx",
		               kdtype_name(d), kop_name(op), count, in_place ? ", in place" : "",
		               bad, (unsigned long long)values_bits(m.got, d, bad),
		               (unsigned long long)values_bits(m.want, d, bad));
	mem_check_free(&m);
}

Test(cuda_mem, reduce_and_avg_match_the_cpu_kernels, .timeout = 300)
{
	static const size_t counts[] = { 0, 1, 7, 1023, 65536 + 3 };
	void *s;

	NEED_KERNELS();
	bind_device0();
	OK(be->stream_create(&s, ERR));
	for (int d = 0; d < NDTYPES; d++)
		for (int op = 0; op < NOPS; op++) {
			if (!reduce_supported((khor_dtype)d, (khor_op)op))
				continue;
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
				for (int ip = 0; ip < 2; ip++)
					check_reduce(s, (khor_dtype)d, (khor_op)op, counts[c], ip);
		}
	kerr e;
	kerr_clear(&e);
	cr_expect_eq(be->reduce(NULL, NULL, NULL, 1, KHOR_BOOL, KHOR_SUM, s, &e),
	             KHOR_ERR_INVALID_ARG, "bool is not reduced");
	cr_expect(strstr(e.text, "bool") != NULL, "the error names the dtype: %s", e.text);
	be->stream_destroy(s);
}

Test(cuda_mem, scale_matches_the_engines_rule, .timeout = 120)
{
	static const double factors[] = { 0.5, 1.0 / 3.0, 3.0, 1e-3, -2.5, 1.0, 1e30, 0.0 };
	size_t count = 65536 + 5;
	void *s, *dv;

	NEED_KERNELS();
	bind_device0();
	OK(be->stream_create(&s, ERR));
	OK(be->dev_alloc(count * 8, &dv, ERR));
	for (int d = 0; d < NDTYPES; d++) {
		khor_dtype dt = (khor_dtype)d;
		size_t es = kdtype_size(dt), bytes = count * es;
		unsigned char *v = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
		cr_assert(v && want && got);
		for (size_t f = 0; f < sizeof(factors) / sizeof(factors[0]); f++) {
			fill_random(v, bytes);
			memcpy(want, v, bytes);
			reduce_scale(want, count, dt, factors[f]);
			OK(be->copy(dv, v, bytes, s, ERR));
			OK(be->scale(dv, count, dt, factors[f], s, ERR));
			OK(be->copy(got, dv, bytes, s, ERR));
			OK(sync_stream(s, ERR));
			/* factor 1 (and integers) leave every bit, NaN payloads too */
			size_t bad = values_first_mismatch(got, want, count, dt, factors[f] != 1.0);
			if (bad < count)
				cr_assert_fail("%s * %g: element %zu (0x%llx): gpu 0x%llx, cpu 0x%llx",
				               kdtype_name(d), factors[f], bad,
				               (unsigned long long)values_bits(v, dt, bad),
				               (unsigned long long)values_bits(got, dt, bad),
				               (unsigned long long)values_bits(want, dt, bad));
		}
		free(v);
		free(want);
		free(got);
	}
	be->dev_free(dv);
	be->stream_destroy(s);
}

/* reps times x += one on stream: about reps * 3 * n * 4 bytes of memory traffic. */
static void queue_work(void *stream, void *x, void *one, size_t n, int reps)
{
	for (int i = 0; i < reps; i++)
		OK(be->reduce(x, x, one, n, KHOR_FLOAT32, KHOR_SUM, stream, ERR));
}

/* n floats of 1.0f on the device. */
static void *ones(size_t n)
{
	float *h = malloc(n * sizeof(float));
	void *d;

	cr_assert(h != NULL);
	for (size_t i = 0; i < n; i++)
		h[i] = 1.0f;
	OK(be->dev_alloc(n * sizeof(float), &d, ERR));
	OK(be->copy(d, h, n * sizeof(float), NULL, ERR));
	OK(sync_stream(NULL, ERR));
	free(h);
	return d;
}

static void expect_all(const float *h, size_t n, float v, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (h[i] != v)
			cr_assert_fail("%s: element %zu is %g, not %g", what, i, h[i], v);
}

Test(cuda_mem, events_and_stream_order, .timeout = 120)
{
	NEED_KERNELS();
	bind_device0();
	const size_t n = (size_t)64 << 20; /* 256 MiB of floats: some milliseconds a pass */
	const int reps = 32;
	void *x, *one = ones(n), *a, *b, *ev, *host;
	bool done = false;

	OK(be->dev_alloc(n * sizeof(float), &x, ERR));
	OK(be->host_alloc(n * sizeof(float), &host, ERR));
	OK(be->stream_create(&a, ERR));
	OK(be->stream_create(&b, ERR));
	OK(be->event_create(&ev, ERR));
	OK(be->event_query(ev, &done, ERR));
	cr_expect(done, "an event never recorded has completed");

	/* b waits for a's event, on the device: b's copy sees all of a's passes. */
	OK(be->memset_zero(x, n * sizeof(float), a, ERR));
	queue_work(a, x, one, n, reps);
	OK(be->event_record(ev, a, ERR));
	uint64_t t0 = kclock_ns();
	OK(be->event_query(ev, &done, ERR));
	cr_expect_lt(kclock_ns() - t0, 100000000ull, "event_query does not block");
	OK(be->stream_wait_event(b, ev, ERR));
	OK(be->copy(host, x, n * sizeof(float), b, ERR));
	OK(sync_stream(b, ERR));
	expect_all(host, n, (float)reps, "after b waited for a's event");
	OK(be->event_query(ev, &done, ERR));
	cr_expect(done, "a's event has completed once b, which waited for it, has");

	/* a blocking stream orders after the legacy default stream */
	OK(be->memset_zero(x, n * sizeof(float), NULL, ERR));
	queue_work(NULL, x, one, n, reps);
	OK(be->copy(host, x, n * sizeof(float), a, ERR));
	OK(sync_stream(a, ERR));
	expect_all(host, n, (float)reps, "a's copy after work on the legacy default stream");

	/* kmem_stream_sync keeps its deadline, then still drains */
	queue_work(a, x, one, n, 2 * reps);
	kerr e;
	kerr_clear(&e);
	cr_expect_eq(kmem_stream_sync(be, a, kdeadline_in_ms(0), "deadline test", &e),
	             KHOR_ERR_TIMEOUT, "a passed deadline while the stream still works");
	cr_expect(strstr(e.text, "cuda stream (deadline test)") != NULL, "%s", e.text);
	OK(sync_stream(a, ERR));

	be->event_destroy(ev);
	be->stream_destroy(b);
	be->stream_destroy(a);
	be->host_free(host);
	be->dev_free(one);
	be->dev_free(x);
}

Test(cuda_mem, errors_name_the_call_and_the_drivers_reason, .timeout = 60)
{
	NEED_GPU();
	bind_device0();
	void *p = NULL;
	kerr e;

	kerr_clear(&e);
	khor_status st = be->dev_alloc((size_t)1 << 60, &p, &e);
	cr_log_info("1 EiB: %s", e.text);
	cr_expect_neq(st, KHOR_SUCCESS);
	cr_expect(strstr(e.text, "cuMemAlloc (1152921504606846976 B on cuda device 0) failed: ") !=
	              NULL, "%s", e.text);
	cr_expect(strstr(e.text, "(CUDA_ERROR_") != NULL, "the driver's name for it: %s", e.text);
	if (strstr(e.text, "CUDA_ERROR_OUT_OF_MEMORY") != NULL)
		cr_expect_eq(st, KHOR_ERR_NO_MEMORY, "out of memory is KHOR_ERR_NO_MEMORY");
	cr_expect_null(p, "no pointer on failure");
	/* the context is still good */
	OK(be->dev_alloc(64, &p, ERR));
	be->dev_free(p);
}

Test(cuda_mem, dmabuf_fd_of_device_memory, .timeout = 60)
{
	NEED_GPU();
	bind_device0();
	size_t len = 4 << 20;
	long page = sysconf(_SC_PAGESIZE);
	void *d;
	uint64_t off = 99;
	char *heap = malloc(4096);

	cr_assert(heap != NULL);
	OK(be->dev_alloc(len, &d, ERR));
	char *p = (char *)d + page + 12;
	int fd = be->dmabuf_fd(p, 1000, &off);
	if (fd < 0) {
		cr_log_warn("this driver or GPU exports no dmabuf (the ib path then uses "
		            "nvidia-peermem or staging)");
	} else {
		cr_expect_eq(off, (uintptr_t)p % (uintptr_t)page, "offset %llu",
		             (unsigned long long)off);
		cr_expect_eq(((uintptr_t)p - off) % (uintptr_t)page, 0, "the range starts on a page");
		close(fd);
	}
	cr_expect_eq(be->dmabuf_fd(heap, 4096, &off), -1, "host memory has no dmabuf");
	be->dev_free(d);
	free(heap);
}

Test(cuda_mem, the_device_state_helpers_run_on_cuda, .timeout = 120)
{
	NEED_KERNELS();
	bind_device0();
	kmem_state st;
	kmem_where w, got;
	void *user, *big, *ev;
	int slot, again;
	kerr e;

	kerr_clear(&e);
	memset(&st, 0, sizeof(st));
	OK(be->dev_alloc(1 << 20, &user, ERR));
	kmem_query(user, &w);
	cr_assert_eq(w.kind, KMEM_DEVICE);

	OK(kmem_state_begin(&st, &w, false, NULL, 1 << 16, ERR));
	cr_expect_eq(st.be, be);
	cr_expect_not_null(st.own_stream, "the comm's own stream is made on first use");
	cr_expect_eq(st.stream, st.own_stream);
	kmem_query(st.scratch, &got);
	cr_expect_eq(got.kind, KMEM_DEVICE, "the scratch is device memory");
	cr_expect_geq(st.scratch_len, 1 << 16);

	big = kmem_state_buffer(&st, 0, 1 << 20, &e);
	cr_assert_not_null(big, "%s", e.text);
	kmem_query(big, &got);
	cr_expect_eq(got.kind, KMEM_DEVICE, "the big buffer is device memory");
	cr_expect_eq(kmem_state_buffer(&st, 0, 1000, &e), big, "a smaller ask keeps it");
	void *bigger = kmem_state_buffer(&st, 0, 8 << 20, &e);
	cr_assert_not_null(bigger, "%s", e.text);
	cr_expect_geq(st.big_len, (size_t)8 << 20);
	void *tmp = kmem_state_buffer(&st, 1, 4096, &e);
	cr_assert_not_null(tmp, "%s", e.text);
	cr_expect_neq(tmp, bigger);

	OK(kmem_pool_get(&st, 100, &slot, ERR));
	kmem_query(st.pool[slot].p, &got);
	cr_expect_eq(got.kind, KMEM_PINNED, "a staging slot is pinned host memory");
	cr_expect_geq(st.pool[slot].len, 65536);
	/* the slot goes back once a copy out of it has run (queued behind milliseconds of
	 * work, so that it has not when the pool is asked again) */
	const size_t n = (size_t)32 << 20;
	void *x, *one = ones(n);
	OK(be->dev_alloc(n * sizeof(float), &x, ERR));
	OK(be->memset_zero(x, n * sizeof(float), st.stream, ERR));
	queue_work(st.stream, x, one, n, 16);
	memset(st.pool[slot].p, 7, 100);
	OK(be->copy(user, st.pool[slot].p, 100, st.stream, ERR));
	OK(kmem_event_get(&st, &ev, ERR));
	OK(be->event_record(ev, st.stream, ERR));
	kmem_pool_put_after(&st, slot, ev);
	OK(kmem_pool_get(&st, 100, &again, ERR));
	cr_expect_neq(again, slot, "a slot still being copied out of is not handed out");
	kmem_pool_put(&st, again);
	OK(sync_stream(st.stream, ERR));
	be->dev_free(x);
	be->dev_free(one);
	OK(kmem_pool_get(&st, 100, &again, ERR));
	cr_expect_eq(again, slot, "the copied-out slot is reused");
	kmem_pool_put(&st, again);
	kmem_state_end(&st);
	cr_expect_null(st.be);

	/* a call on the caller's (legacy default) stream keeps the buffers */
	OK(kmem_state_begin(&st, &w, true, NULL, 1 << 16, ERR));
	cr_expect_null(st.stream, "the caller's stream, NULL, is used as given");
	cr_expect_eq(kmem_state_buffer(&st, 0, 1 << 20, &e), bigger);
	unsigned char back[100];
	OK(be->copy(back, user, sizeof(back), st.stream, ERR));
	OK(sync_stream(st.stream, ERR));
	for (size_t i = 0; i < sizeof(back); i++)
		cr_assert_eq(back[i], 7, "byte %zu of what the slot held", i);
	kmem_state_end(&st);
	kmem_state_destroy(&st);
	cr_expect_null(st.dev_be, "destroy forgets the device");
	cr_expect_null(st.own_stream);
	be->dev_free(user);
}
