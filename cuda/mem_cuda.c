/*
 * mem_cuda.c -- the cuda backend of the memory seam (collectives/mem.h): device memory,
 * pinned staging slots, streams and events through the CUDA driver API, and khor's own
 * kernels (reduce_cuda.h) for reduce, avg and scale.
 *
 * libkhor must load and run where there is no GPU, so libcuda.so.1 is opened at run time,
 * once, and called through pointers. cuda.h is included for its types only: each pointer
 * has the type of the header's declaration and is looked up under the header's own name
 * for it (cuMemAlloc is cuMemAlloc_v2, cuStreamDestroy is cuStreamDestroy_v2), exactly
 * the entry points a program built against this header would call. The legacy default
 * stream is NULL, as in the header's default (not per-thread) mapping. The kernels go
 * through the static CUDA runtime, which uses the driver context current on the calling
 * thread: bind makes the buffer's context current, and the two APIs then agree.
 *
 * query never calls cuInit. A process that has not initialised the driver can have no
 * CUDA memory, so cuPointerGetAttributes' CUDA_ERROR_NOT_INITIALIZED means "not ours" at
 * the cost of one call. Initialising the driver from a host collective would instead cost
 * a CPU-only job on a GPU machine the driver's start-up, and break CUDA in every child it
 * forks afterwards (CUDA does not survive fork; the multi-rank tests fork their ranks).
 */
#include "mem_cuda.h"

#include "base/dtype.h"
#include "base/log.h"
#include "reduce_cuda.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* The name cuda.h gives f, as a string: CU_NAME(cuMemAlloc) is "cuMemAlloc_v2". */
#define CU_NAME_(f) #f
#define CU_NAME(f) CU_NAME_(f)

/* The driver entry points used here; false: optional (older drivers lack it). */
#define CU_FUNCTIONS(X)                        \
	X(cuInit, true)                        \
	X(cuGetErrorString, true)              \
	X(cuGetErrorName, true)                \
	X(cuDriverGetVersion, true)            \
	X(cuDeviceGet, true)                   \
	X(cuDeviceGetCount, true)              \
	X(cuDevicePrimaryCtxRetain, true)      \
	X(cuDevicePrimaryCtxGetState, true)    \
	X(cuCtxGetCurrent, true)               \
	X(cuCtxSetCurrent, true)               \
	X(cuCtxPushCurrent, true)              \
	X(cuCtxPopCurrent, true)               \
	X(cuCtxGetDevice, true)                \
	X(cuPointerGetAttributes, true)        \
	X(cuStreamCreate, true)                \
	X(cuStreamDestroy, true)               \
	X(cuMemcpyAsync, true)                 \
	X(cuMemsetD8Async, true)               \
	X(cuEventCreate, true)                 \
	X(cuEventDestroy, true)                \
	X(cuEventRecord, true)                 \
	X(cuEventQuery, true)                  \
	X(cuStreamWaitEvent, true)             \
	X(cuMemAlloc, true)                    \
	X(cuMemFree, true)                     \
	X(cuMemHostAlloc, true)                \
	X(cuMemFreeHost, true)                 \
	X(cuMemGetAddressRange, true)          \
	X(cuMemGetHandleForAddressRange, false)

/* Written once by cu_load (under cu_once), read-only afterwards. */
static struct {
#define CU_MEMBER(f, required) __typeof__(f) *f;
	CU_FUNCTIONS(CU_MEMBER)
#undef CU_MEMBER
	bool loaded;
	char why[320]; /* why not loaded */
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static atomic_bool said_why, said_uninit, said_query_error, said_dmabuf;

/* Primary contexts, retained on first use and never released (the driver outlives us). */
#define CU_MAX_DEVICES 256
static _Atomic(CUcontext) primary[CU_MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

static void cu_load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (h == NULL) {
		snprintf(cu.why, sizeof(cu.why), "cannot load the CUDA driver: %s", dlerror());
		return;
	}
#define CU_LOOKUP(f, required)                                                              \
	*(void **)&cu.f = dlsym(h, CU_NAME(f));                                             \
	if (cu.f == NULL && (required)) {                                                   \
		snprintf(cu.why, sizeof(cu.why), "the CUDA driver libcuda.so.1 has no %s: it "  \
		         "is too old for khor (built with CUDA %d.%d); update the driver",      \
		         CU_NAME(f), CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);            \
		return; /* h stays open: the pointers found so far point into it */       \
	}
	CU_FUNCTIONS(CU_LOOKUP)
#undef CU_LOOKUP
	cu.loaded = true;
}

static bool cu_ready(void)
{
	pthread_once(&cu_once, cu_load);
	return cu.loaded;
}

static khor_status cu_status(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY: return KHOR_ERR_NO_MEMORY;
	case CUDA_ERROR_NOT_SUPPORTED: return KHOR_ERR_NOT_SUPPORTED;
	case CUDA_ERROR_INVALID_VALUE: return KHOR_ERR_INVALID_ARG;
	default: return KHOR_ERR_SYSTEM;
	}
}

/* "<what> failed: <driver's message> (<CUDA_ERROR_NAME>)" into err, for a driver call. */
static khor_status cu_fail(kerr *err, CUresult r, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static khor_status cu_fail(kerr *err, CUresult r, const char *fmt, ...)
{
	const char *msg = NULL, *name = NULL;
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (cu.cuGetErrorString == NULL || cu.cuGetErrorString(r, &msg) != CUDA_SUCCESS)
		msg = NULL;
	if (cu.cuGetErrorName == NULL || cu.cuGetErrorName(r, &name) != CUDA_SUCCESS)
		name = NULL;
	if (msg == NULL || name == NULL) /* the stub library, or a code newer than the driver */
		return kerr_set(err, cu_status(r), "%s failed: CUDA driver error %d", what, (int)r);
	return kerr_set(err, cu_status(r), "%s failed: %s (%s)", what, msg, name);
}

/* The same for khor's kernels, whose calls return cudaError_t values (reduce_cuda.h). */
static khor_status rt_fail(kerr *err, int e, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static khor_status rt_fail(kerr *err, int e, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (e == cudaErrorInsufficientDriver)
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s failed: %s (%s); khor's CUDA "
		                "kernels were built with CUDA %d.%d and need a driver at least as "
		                "new", what, cudaGetErrorString((cudaError_t)e),
		                cudaGetErrorName((cudaError_t)e), CUDART_VERSION / 1000,
		                CUDART_VERSION % 1000 / 10);
	return kerr_set(err, e == cudaErrorMemoryAllocation ? KHOR_ERR_NO_MEMORY : KHOR_ERR_SYSTEM,
	                "%s failed: %s (%s)", what, cudaGetErrorString((cudaError_t)e),
	                cudaGetErrorName((cudaError_t)e));
}

static khor_status not_loaded(kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "cuda: %s", cu.why);
}

static CUresult primary_ctx(int ordinal, CUcontext *out)
{
	if (ordinal < 0 || ordinal >= CU_MAX_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	CUcontext c = atomic_load_explicit(&primary[ordinal], memory_order_acquire);
	CUresult r = CUDA_SUCCESS;

	if (c == NULL) {
		pthread_mutex_lock(&primary_lock);
		c = atomic_load_explicit(&primary[ordinal], memory_order_relaxed);
		if (c == NULL) {
			CUdevice dev;
			r = cu.cuDeviceGet(&dev, ordinal);
			if (r == CUDA_SUCCESS)
				r = cu.cuDevicePrimaryCtxRetain(&c, dev);
			if (r == CUDA_SUCCESS)
				atomic_store_explicit(&primary[ordinal], c, memory_order_release);
		}
		pthread_mutex_unlock(&primary_lock);
	}
	if (r == CUDA_SUCCESS)
		*out = c;
	return r;
}

bool mem_cuda_usable(char *why, size_t len)
{
	CUresult r;
	int n = 0, version = 0;

	if (!cu_ready()) {
		snprintf(why, len, "%s", cu.why);
		return false;
	}
	if ((r = cu.cuInit(0)) != CUDA_SUCCESS) {
		kerr e;
		cu_fail(&e, r, "cuInit");
		if (cu.cuDriverGetVersion(&version) == CUDA_SUCCESS && version > 0)
			snprintf(why, len, "%s (driver for CUDA %d.%d)", e.text, version / 1000,
			         version % 1000 / 10);
		else
			snprintf(why, len, "%s", e.text);
		return false;
	}
	if ((r = cu.cuDeviceGetCount(&n)) != CUDA_SUCCESS) {
		kerr e;
		cu_fail(&e, r, "cuDeviceGetCount");
		snprintf(why, len, "%s", e.text);
		return false;
	}
	if (n <= 0) {
		snprintf(why, len, "the CUDA driver found no device");
		return false;
	}
	return true;
}

khor_status mem_cuda_device_ctx(int ordinal, void **ctx_out, kerr *err)
{
	CUcontext c;
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	if ((r = primary_ctx(ordinal, &c)) != CUDA_SUCCESS)
		return cu_fail(err, r, "retaining the primary context of cuda device %d", ordinal);
	*ctx_out = c;
	return KHOR_SUCCESS;
}

static void say_once(atomic_bool *said, enum klog_level level, const char *what, CUresult r)
{
	if (atomic_load_explicit(said, memory_order_relaxed) || atomic_exchange(said, true))
		return;
	if (r == CUDA_SUCCESS) {
		KLOG(level, "cuda: %s", what);
	} else {
		kerr e;
		cu_fail(&e, r, "%s", what);
		KLOG(level, "cuda: %s", e.text);
	}
}

/* A primary context some device already has active (retained), for pointer queries. */
static bool any_active_primary(CUcontext *out)
{
	int n = 0;

	if (cu.cuDeviceGetCount(&n) != CUDA_SUCCESS)
		return false;
	for (int i = 0; i < n && i < CU_MAX_DEVICES; i++) {
		CUdevice dev;
		unsigned flags = 0;
		int active = 0;
		if (cu.cuDeviceGet(&dev, i) == CUDA_SUCCESS &&
		    cu.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active &&
		    primary_ctx(i, out) == CUDA_SUCCESS)
			return true;
	}
	return false;
}

/*
 * The attributes of p. With unified addressing they need no context, but some drivers
 * answer CUDA_ERROR_INVALID_CONTEXT on a thread that has none current (as khor's own
 * threads have), so there the query is retried inside an active primary context, pushed
 * and popped so that the thread's state is left as it was.
 */
static CUresult pointer_attrs(const void *p, unsigned n, CUpointer_attribute *attrs,
                              void **data)
{
	CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)p;
	CUresult r = cu.cuPointerGetAttributes(n, attrs, data, ptr);
	CUcontext cur = NULL, any;

	if (r != CUDA_ERROR_INVALID_CONTEXT)
		return r;
	if (cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != NULL || !any_active_primary(&any))
		return r;
	if (cu.cuCtxPushCurrent(any) != CUDA_SUCCESS)
		return r;
	r = cu.cuPointerGetAttributes(n, attrs, data, ptr);
	(void)cu.cuCtxPopCurrent(&cur);
	return r;
}

/*
 * Every collective calls this on its buffers, host memory too: one cuPointerGetAttributes,
 * and the primary context's cache for memory whose context attribute is NULL
 * (cuMemCreate/cuMemMap, stream-ordered allocations).
 */
static bool cuda_query(const void *p, kmem_where *out)
{
	/* Zeroed 64-bit slots: the driver writes 4 bytes for the memory type and the managed
	 * flag, and whatever it writes reads right (and unknown pointers read 0). */
	unsigned long long type = 0, managed = 0;
	int ordinal = -1;
	CUcontext ctx = NULL;
	CUpointer_attribute attrs[4] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
	                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	                                 CU_POINTER_ATTRIBUTE_CONTEXT,
	                                 CU_POINTER_ATTRIBUTE_IS_MANAGED };
	void *data[4] = { &type, &ordinal, &ctx, &managed };

	if (!cu_ready()) {
		if (!atomic_load_explicit(&said_why, memory_order_relaxed) &&
		    !atomic_exchange(&said_why, true))
			KLOG_INFO("cuda: every buffer is host memory: %s", cu.why);
		return false;
	}
	CUresult r = pointer_attrs(p, 4, attrs, data);
	if (r == CUDA_ERROR_NOT_INITIALIZED) {
		say_once(&said_uninit, KLOG_DEBUG, "the driver is not initialised in this process: "
		         "no buffer is CUDA memory yet", CUDA_SUCCESS);
		return false;
	}
	if (r != CUDA_SUCCESS) {
		say_once(&said_query_error, KLOG_DEBUG, "cuPointerGetAttributes (taking the buffer "
		         "for host memory)", r);
		return false;
	}
	if (managed != 0 || type == CU_MEMORYTYPE_DEVICE) {
		if (ordinal < 0)
			ordinal = 0; /* defensive: the driver reports the allocating device */
		if (ctx == NULL && primary_ctx(ordinal, &ctx) != CUDA_SUCCESS)
			ctx = NULL; /* bind then uses the thread's current context, or says why not */
		out->kind = KMEM_DEVICE;
		out->device = ordinal;
		out->ctx = ctx;
	} else if (type == CU_MEMORYTYPE_HOST) {
		out->kind = KMEM_PINNED;
		out->device = -1;
		out->ctx = NULL;
	} else {
		return false;
	}
	out->be = &kmem_cuda_backend;
	return true;
}

/* "device", "pinned host" or "host", for copy's error message. */
static const char *side(const void *p)
{
	kmem_where w = { .kind = KMEM_HOST };

	if (!cuda_query(p, &w))
		return "host";
	return w.kind == KMEM_DEVICE ? "device" : "pinned host";
}

static int current_device(void)
{
	CUdevice d = -1;

	if (cu.cuCtxGetDevice(&d) != CUDA_SUCCESS)
		return -1;
	return (int)d;
}

/*
 * khor_cuda_preload once per context (reduce_cuda.h says why): the contexts done so far.
 * A failure is not an error here: the first launch then says what is wrong.
 */
static void preload(CUcontext ctx)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static CUcontext done[32];
	static int ndone;
	bool found = false;

	pthread_mutex_lock(&mu);
	for (int i = 0; i < ndone && !found; i++)
		found = done[i] == ctx;
	if (!found) {
		int r = khor_cuda_preload();
		if (r != 0)
			KLOG_DEBUG("cuda: loading the reduction kernels up front failed (CUDA runtime "
			           "error %d); they load at their first launch", r);
		if (ndone < 32)
			done[ndone++] = ctx;
	}
	pthread_mutex_unlock(&mu);
}

static khor_status cuda_bind(void *ctx, kerr *err)
{
	CUcontext cur = NULL;
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	if ((r = cu.cuCtxGetCurrent(&cur)) != CUDA_SUCCESS)
		return cu_fail(err, r, "cuCtxGetCurrent");
	if (ctx == NULL) {
		if (cur != NULL) {
			preload(cur);
			return KHOR_SUCCESS;
		}
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "cuda: the buffer's device has no "
		                "context khor could bind, and none is current on this thread; "
		                "make one current (cudaSetDevice) before the call");
	}
	if (cur != (CUcontext)ctx && (r = cu.cuCtxSetCurrent((CUcontext)ctx)) != CUDA_SUCCESS)
		return cu_fail(err, r, "cuCtxSetCurrent");
	preload((CUcontext)ctx);
	return KHOR_SUCCESS;
}

static void *cuda_current(void)
{
	CUcontext cur = NULL;

	if (!cu_ready() || cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
		return NULL;
	return cur;
}

static void cuda_restore(void *prev)
{
	if (cu_ready())
		(void)cu.cuCtxSetCurrent((CUcontext)prev); /* NULL unbinds, as it was */
}

static khor_status cuda_stream_create(void **stream_out, kerr *err)
{
	CUstream s;
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	/* Blocking (not CU_STREAM_NON_BLOCKING): work on it orders after the legacy default
	 * stream, where callers without a stream of their own put theirs. */
	if ((r = cu.cuStreamCreate(&s, CU_STREAM_DEFAULT)) != CUDA_SUCCESS)
		return cu_fail(err, r, "cuStreamCreate (cuda device %d)", current_device());
	*stream_out = s;
	return KHOR_SUCCESS;
}

static void cuda_stream_destroy(void *stream)
{
	if (stream != NULL && cu_ready())
		(void)cu.cuStreamDestroy((CUstream)stream);
}

static khor_status cuda_copy(void *dst, const void *src, size_t len, void *stream, kerr *err)
{
	CUresult r;

	if (len == 0 || dst == src)
		return KHOR_SUCCESS;
	if (!cu_ready())
		return not_loaded(err);
	r = cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len,
	                     (CUstream)stream);
	if (r != CUDA_SUCCESS)
		return cu_fail(err, r, "cuMemcpyAsync (%s to %s, %zu B)", side(src), side(dst), len);
	return KHOR_SUCCESS;
}

static khor_status cuda_reduce(void *dst, const void *a, const void *b, size_t count,
                               khor_dtype dtype, khor_op op, void *stream, kerr *err)
{
	if (!khor_cuda_reduce_supported((int)dtype, (int)op))
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "cuda: %s %s is not a reduction khor "
		                "has", kdtype_name(dtype), kop_name(op));
	int e = khor_cuda_reduce(dst, a, b, count, (int)dtype, (int)op, stream);
	if (e != 0)
		return rt_fail(err, e, "khor_cuda_reduce (%s %s, %zu elements)", kdtype_name(dtype),
		               kop_name(op), count);
	return KHOR_SUCCESS;
}

static khor_status cuda_avg_finish(void *buf, size_t count, khor_dtype dtype, int n,
                                   void *stream, kerr *err)
{
	int e = khor_cuda_avg_finish(buf, count, (int)dtype, n, stream);

	if (e != 0)
		return rt_fail(err, e, "khor_cuda_avg_finish (%s, %zu elements, / %d)",
		               kdtype_name(dtype), count, n);
	return KHOR_SUCCESS;
}

static khor_status cuda_scale(void *buf, size_t count, khor_dtype dtype, double factor,
                              void *stream, kerr *err)
{
	int e = khor_cuda_scale(buf, count, (int)dtype, factor, stream);

	if (e != 0)
		return rt_fail(err, e, "khor_cuda_scale (%s, %zu elements, * %g)", kdtype_name(dtype),
		               count, factor);
	return KHOR_SUCCESS;
}

static khor_status cuda_memset_zero(void *buf, size_t len, void *stream, kerr *err)
{
	CUresult r;

	if (len == 0)
		return KHOR_SUCCESS;
	if (!cu_ready())
		return not_loaded(err);
	r = cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)buf, 0, len, (CUstream)stream);
	if (r != CUDA_SUCCESS)
		return cu_fail(err, r, "cuMemsetD8Async (%zu B at %p)", len, buf);
	return KHOR_SUCCESS;
}

static khor_status cuda_event_create(void **ev_out, kerr *err)
{
	CUevent ev;
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	if ((r = cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
		return cu_fail(err, r, "cuEventCreate (cuda device %d)", current_device());
	*ev_out = ev;
	return KHOR_SUCCESS;
}

static void cuda_event_destroy(void *ev)
{
	if (ev != NULL && cu_ready())
		(void)cu.cuEventDestroy((CUevent)ev);
}

static khor_status cuda_event_record(void *ev, void *stream, kerr *err)
{
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	if ((r = cu.cuEventRecord((CUevent)ev, (CUstream)stream)) != CUDA_SUCCESS)
		return cu_fail(err, r, "cuEventRecord");
	return KHOR_SUCCESS;
}

static khor_status cuda_event_query(void *ev, bool *done, kerr *err)
{
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	r = cu.cuEventQuery((CUevent)ev);
	if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY) {
		*done = r == CUDA_SUCCESS;
		return KHOR_SUCCESS;
	}
	/* The stream's own failure (a kernel's illegal address) surfaces here. */
	return cu_fail(err, r, "cuEventQuery");
}

static khor_status cuda_stream_wait_event(void *stream, void *ev, kerr *err)
{
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	if ((r = cu.cuStreamWaitEvent((CUstream)stream, (CUevent)ev, 0)) != CUDA_SUCCESS)
		return cu_fail(err, r, "cuStreamWaitEvent");
	return KHOR_SUCCESS;
}

static khor_status cuda_dev_alloc(size_t len, void **p_out, kerr *err)
{
	CUdeviceptr d;
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	/* cuMemAlloc refuses 0 bytes; callers may ask for an empty scratch. */
	if ((r = cu.cuMemAlloc(&d, len > 0 ? len : 1)) != CUDA_SUCCESS)
		return cu_fail(err, r, "cuMemAlloc (%zu B on cuda device %d)", len, current_device());
	*p_out = (void *)(uintptr_t)d;
	return KHOR_SUCCESS;
}

static void cuda_dev_free(void *p)
{
	CUresult r;

	if (p == NULL || !cu_ready())
		return;
	if ((r = cu.cuMemFree((CUdeviceptr)(uintptr_t)p)) != CUDA_SUCCESS &&
	    r != CUDA_ERROR_DEINITIALIZED) {
		kerr e;
		cu_fail(&e, r, "cuMemFree (%p)", p);
		KLOG_DEBUG("cuda: %s", e.text);
	}
}

static khor_status cuda_host_alloc(size_t len, void **p_out, kerr *err)
{
	void *p;
	CUresult r;

	if (!cu_ready())
		return not_loaded(err);
	/* Portable: a staging slot may serve a copy of another context's device. */
	if ((r = cu.cuMemHostAlloc(&p, len > 0 ? len : 1, CU_MEMHOSTALLOC_PORTABLE)) !=
	    CUDA_SUCCESS)
		return cu_fail(err, r, "cuMemHostAlloc (%zu B of pinned host memory)", len);
	*p_out = p;
	return KHOR_SUCCESS;
}

static void cuda_host_free(void *p)
{
	CUresult r;

	if (p == NULL || !cu_ready())
		return;
	if ((r = cu.cuMemFreeHost(p)) != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
		kerr e;
		cu_fail(&e, r, "cuMemFreeHost (%p)", p);
		KLOG_DEBUG("cuda: %s", e.text);
	}
}

/*
 * The driver exports whole host pages: [p, p + len) rounded out to pages, kept inside the
 * allocation's own pages. The caller owns (and closes) the fd.
 */
static int cuda_dmabuf_fd(const void *p, size_t len, uint64_t *offset_out)
{
	CUdeviceptr base = 0, ptr = (CUdeviceptr)(uintptr_t)p;
	size_t size = 0;
	long pg = sysconf(_SC_PAGESIZE);
	int fd = -1;

	if (!cu_ready() || cu.cuMemGetHandleForAddressRange == NULL || pg <= 0)
		return -1;
	if (cu.cuMemGetAddressRange(&base, &size, ptr) != CUDA_SUCCESS || size == 0)
		return -1;
	CUdeviceptr page = (CUdeviceptr)pg;
	CUdeviceptr lo = base & ~(page - 1), hi = (base + size + page - 1) & ~(page - 1);
	CUdeviceptr start = ptr & ~(page - 1);
	CUdeviceptr end = (ptr + (len > 0 ? len : 1) + page - 1) & ~(page - 1);

	if (start < lo)
		start = lo;
	if (end > hi)
		end = hi;
	if (end <= start)
		return -1;
	CUresult r = cu.cuMemGetHandleForAddressRange(&fd, start, (size_t)(end - start),
	                                              CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (r != CUDA_SUCCESS || fd < 0) {
		say_once(&said_dmabuf, KLOG_DEBUG, "cuMemGetHandleForAddressRange (dmabuf)", r);
		return -1;
	}
	*offset_out = (uint64_t)(ptr - start);
	return fd;
}

const kmem_backend kmem_cuda_backend = {
	.name = "cuda",
	.query = cuda_query,
	.bind = cuda_bind,
	.current = cuda_current,
	.restore = cuda_restore,
	.stream_create = cuda_stream_create,
	.stream_destroy = cuda_stream_destroy,
	.copy = cuda_copy,
	.reduce = cuda_reduce,
	.avg_finish = cuda_avg_finish,
	.scale = cuda_scale,
	.memset_zero = cuda_memset_zero,
	.event_create = cuda_event_create,
	.event_destroy = cuda_event_destroy,
	.event_record = cuda_event_record,
	.event_query = cuda_event_query,
	.stream_wait_event = cuda_stream_wait_event,
	.dev_alloc = cuda_dev_alloc,
	.dev_free = cuda_dev_free,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.dmabuf_fd = cuda_dmabuf_fd,
};
