/*
 * mem_emu.c -- the emulated device, a test double of the memory seam (collectives/mem.h):
 * memory this process cannot touch and streams that run their operations on threads of
 * their own, so that a machine without a GPU tests the device paths of the schedules and of
 * the staging in collectives/coll.c. It lives in the tests, never in libkhor: a test that
 * links it (khor_mem_emu) gets the backend added ahead of the built-in ones by a
 * constructor (kmem_backend_add), before any thread of the test can ask the seam.
 *
 *   dev_alloc:  memfd --+-- PROT_NONE mapping      the "device pointer" handed out
 *                       +-- PROT_READ|WRITE mapping the alias the stream workers use
 *
 * A schedule that reads or writes a device pointer directly faults on the first byte. The
 * registry (sorted by address, under reg_mu) maps a device address to its alias; its size is
 * also kept in an atomic so that query, which runs on every collective call of every
 * program, is one load while nothing is allocated. Pinned host memory is recorded there too.
 *
 * A stream is a worker thread and a FIFO of operations. Each operation gets the stream's
 * next sequence number; after running it the worker publishes that number in the stream's
 * timeline. An event is (timeline, number) and is complete once the timeline has reached
 * it. Timelines are reference counted so that an event outlives its stream, as a CUDA
 * event does. The default stream (NULL) behaves as CUDA's legacy default stream towards
 * the others, which are all blocking streams (see enqueue).
 *
 * Pointers are translated when an operation is enqueued, so bad ones fail the call (as
 * CUDA's argument checks do) rather than the worker, and every device region an operation
 * uses is held until it has run: a dev_free with work still queued on the memory unmaps it
 * after that work (cuMemFree synchronizes; this is the emulation's equivalent).
 *
 * KHOR_MEM_EMU_DELAY_US=N (read once): every operation first sleeps a pseudo-random
 * 0..N us, so that a schedule that forgets a stream-ordered wait reads stale data instead
 * of getting lucky. It is this test double's own knob, not a setting of the library (which
 * knows nothing of the emulated device): runtime/config's table does not list it.
 *
 * fork: the child keeps the mappings (MAP_SHARED: the parent's and the child's device
 * memory are the same pages, unlike CUDA's) but not the worker threads; the default stream
 * is made afresh in the child. Streams made before the fork are unusable in the child, as
 * CUDA's are.
 */
#include "mem_emu.h"

#include "base/dtype.h"
#include "base/log.h"
#include "collectives/reduce.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EMU_NAME "emulated device"
/* A stream that has waited this long for another stream's event says so (and keeps waiting). */
#define EMU_WAIT_WARN_NS (60ull * 1000000000ull)

/* ---- the registry of allocations ------------------------------------------------------ */

typedef struct emu_region {
	uintptr_t dev;  /* the address handed out */
	size_t len;     /* as asked for */
	size_t maplen;  /* of the alias (and of the memfd): len rounded up to pages, at least one */
	size_t span;    /* of the range claimed: maplen, and a guard page for device memory */
	char *alias;    /* the read-write mapping (== dev for pinned memory) */
	kmem_kind kind; /* KMEM_DEVICE or KMEM_PINNED */
	int refs;       /* queued operations that use it (under reg_mu) */
	bool freed;     /* freed while refs > 0: the last operation unmaps it */
} emu_region;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static emu_region **regs; /* sorted by dev */
static size_t nregs, capregs;
static atomic_size_t reg_count; /* nregs, readable without reg_mu */
static char emu_ctx;            /* the one device's "context": query hands out its address */

/* Index of the region that holds p, or -1. Under reg_mu. */
static ptrdiff_t reg_find(uintptr_t p)
{
	size_t lo = 0, hi = nregs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (regs[mid]->dev <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return -1;
	return p - regs[lo - 1]->dev < regs[lo - 1]->span ? (ptrdiff_t)(lo - 1) : -1;
}

static khor_status reg_add(emu_region *r, kerr *err)
{
	pthread_mutex_lock(&reg_mu);
	if (nregs == capregs) {
		size_t cap = capregs == 0 ? 64 : capregs * 2;
		emu_region **g = realloc(regs, cap * sizeof(*g));
		if (g == NULL) {
			pthread_mutex_unlock(&reg_mu);
			return kerr_set(err, KHOR_ERR_NO_MEMORY, EMU_NAME ": out of memory for the "
			                "registry of allocations");
		}
		regs = g;
		capregs = cap;
	}
	size_t i = nregs;
	while (i > 0 && regs[i - 1]->dev > r->dev) {
		regs[i] = regs[i - 1];
		i--;
	}
	regs[i] = r;
	nregs++;
	atomic_store_explicit(&reg_count, nregs, memory_order_release);
	pthread_mutex_unlock(&reg_mu);
	return KHOR_SUCCESS;
}

static void region_unmap(emu_region *r)
{
	munmap((void *)r->dev, r->span);
	if (r->kind == KMEM_DEVICE)
		munmap(r->alias, r->maplen);
	free(r);
}

/* Takes the region based at p of kind out of the registry; unmaps it unless still in use. */
static void reg_free(void *p, kmem_kind kind, const char *fn)
{
	emu_region *r = NULL;
	bool found = false;

	if (p == NULL)
		return;
	pthread_mutex_lock(&reg_mu);
	ptrdiff_t i = reg_find((uintptr_t)p);
	if (i >= 0 && regs[i]->dev == (uintptr_t)p && regs[i]->kind == kind) {
		found = true;
		r = regs[i];
		memmove(&regs[i], &regs[i + 1], (nregs - (size_t)i - 1) * sizeof(*regs));
		nregs--;
		atomic_store_explicit(&reg_count, nregs, memory_order_release);
		if (r->refs > 0) {
			r->freed = true; /* release_holds unmaps it */
			r = NULL;
		}
	}
	pthread_mutex_unlock(&reg_mu);
	if (r != NULL)
		region_unmap(r);
	if (!found)
		KLOG_ERR(EMU_NAME ": %s(%p): not the start of an allocation of that kind (freed "
		         "twice, or never allocated here)", fn, p);
}

/* ---- streams, timelines and events ---------------------------------------------------- */

typedef struct emu_timeline {
	atomic_int refs;
	atomic_uint_fast64_t done; /* the last sequence number completed */
	pthread_mutex_t mu;        /* with cv: workers of other streams wait for done here */
	pthread_cond_t cv;
} emu_timeline;

enum emu_opkind { OP_COPY, OP_REDUCE, OP_AVG, OP_SCALE, OP_ZERO, OP_MARK, OP_WAIT, OP_DELAY };

/* An operation runs once tl->done >= seq (it holds a reference to tl). */
typedef struct emu_wait {
	emu_timeline *tl;
	uint64_t seq;
} emu_wait;

typedef struct emu_op {
	struct emu_op *next;
	enum emu_opkind kind;
	uint64_t seq;
	void *dst; /* translated pointers */
	const void *a, *b;
	size_t count; /* bytes for copy and zero, elements otherwise */
	khor_dtype dtype;
	reduce_fn fn;
	int n;
	double factor;
	emu_region *hold[3]; /* device regions in use until the operation has run */
	emu_wait *waits;     /* before it runs: stream_wait_event's, the legacy stream's */
	int nwaits, capwaits;
	emu_wait one;        /* waits' storage while there is only one */
	unsigned us;         /* OP_DELAY */
} emu_op;

typedef struct emu_stream {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* work was queued, or closing */
	emu_op *head, *tail;
	atomic_uint_fast64_t seq; /* the last sequence number handed out (changed under mu) */
	bool closing;
	emu_timeline *tl;
	pthread_t thread;
	uint64_t rng; /* the worker's, for the delay knob */
	struct emu_stream *live_prev, *live_next; /* every stream (under streams_mu) */
} emu_stream;

typedef struct emu_event {
	emu_timeline *tl; /* NULL: never recorded (complete, as in CUDA) */
	uint64_t seq;
} emu_event;

static pthread_once_t emu_once = PTHREAD_ONCE_INIT;
static unsigned emu_delay_max; /* KHOR_MEM_EMU_DELAY_US; written once under emu_once */
static pthread_condattr_t emu_condattr;
static pthread_mutex_t default_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(emu_stream *) default_stream;
static emu_stream *abandoned_default; /* the parent's, in a forked child: kept reachable */
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static emu_stream *live_streams, *abandoned_streams;

static void atfork_prepare(void)
{
	pthread_mutex_lock(&default_mu);
	pthread_mutex_lock(&streams_mu);
	pthread_mutex_lock(&reg_mu);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&reg_mu);
	pthread_mutex_unlock(&streams_mu);
	pthread_mutex_unlock(&default_mu);
}

static void atfork_child(void)
{
	pthread_mutex_unlock(&reg_mu);
	/*
	 * The worker threads are not in the child: the next use makes a new default stream,
	 * and the parent's streams (unusable here) are no longer waited for.
	 */
	if (live_streams != NULL)
		abandoned_streams = live_streams;
	live_streams = NULL;
	pthread_mutex_unlock(&streams_mu);
	emu_stream *s = atomic_load(&default_stream);
	if (s != NULL)
		abandoned_default = s;
	atomic_store(&default_stream, NULL);
	pthread_mutex_unlock(&default_mu);
}

static void emu_init(void)
{
	const char *v = getenv("KHOR_MEM_EMU_DELAY_US");

	if (v != NULL && *v != '\0') {
		char *end;
		errno = 0;
		unsigned long us = strtoul(v, &end, 10);
		if (errno != 0 || *end != '\0' || us > 10000000ul)
			KLOG_WARN("KHOR_MEM_EMU_DELAY_US=%s is not a number of microseconds up to "
			          "10000000: ignored", v);
		else
			emu_delay_max = (unsigned)us;
	}
	pthread_condattr_init(&emu_condattr);
	pthread_condattr_setclock(&emu_condattr, CLOCK_MONOTONIC);
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static struct timespec abs_in_ns(uint64_t ns)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ns += (uint64_t)ts.tv_nsec;
	ts.tv_sec += (time_t)(ns / 1000000000ull);
	ts.tv_nsec = (long)(ns % 1000000000ull);
	return ts;
}

static emu_timeline *tl_new(void)
{
	emu_timeline *tl = calloc(1, sizeof(*tl));

	if (tl == NULL)
		return NULL;
	atomic_init(&tl->refs, 1);
	atomic_init(&tl->done, 0);
	pthread_mutex_init(&tl->mu, NULL);
	pthread_cond_init(&tl->cv, &emu_condattr);
	return tl;
}

static emu_timeline *tl_ref(emu_timeline *tl)
{
	atomic_fetch_add_explicit(&tl->refs, 1, memory_order_relaxed);
	return tl;
}

static void tl_unref(emu_timeline *tl)
{
	if (tl == NULL || atomic_fetch_sub_explicit(&tl->refs, 1, memory_order_acq_rel) != 1)
		return;
	pthread_mutex_destroy(&tl->mu);
	pthread_cond_destroy(&tl->cv);
	free(tl);
}

static void tl_publish(emu_timeline *tl, uint64_t seq)
{
	pthread_mutex_lock(&tl->mu);
	atomic_store_explicit(&tl->done, seq, memory_order_release);
	pthread_cond_broadcast(&tl->cv);
	pthread_mutex_unlock(&tl->mu);
}

static void release_holds(emu_op *op)
{
	emu_region *gone[3];
	int ngone = 0;

	if (op->hold[0] == NULL && op->hold[1] == NULL && op->hold[2] == NULL)
		return;
	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < 3; i++) {
		emu_region *r = op->hold[i];
		if (r != NULL && --r->refs == 0 && r->freed)
			gone[ngone++] = r;
		op->hold[i] = NULL;
	}
	pthread_mutex_unlock(&reg_mu);
	for (int i = 0; i < ngone; i++)
		region_unmap(gone[i]);
}

static void op_free(emu_op *op)
{
	release_holds(op);
	for (int i = 0; i < op->nwaits; i++)
		tl_unref(op->waits[i].tl);
	if (op->waits != &op->one)
		free(op->waits);
	free(op);
}

/* op waits for tl to reach seq before it runs. */
static bool add_wait(emu_op *op, emu_timeline *tl, uint64_t seq)
{
	if (op->nwaits == op->capwaits) {
		int cap = op->capwaits == 0 ? 1 : op->capwaits * 2;
		emu_wait *w = &op->one;
		if (cap > 1) {
			if ((w = malloc((size_t)cap * sizeof(*w))) == NULL)
				return false;
			memcpy(w, op->waits, (size_t)op->nwaits * sizeof(*w));
			if (op->waits != &op->one)
				free(op->waits);
		}
		op->waits = w;
		op->capwaits = cap;
	}
	op->waits[op->nwaits].tl = tl_ref(tl);
	op->waits[op->nwaits++].seq = seq;
	return true;
}


static void wait_for(const emu_wait *w)
{
	emu_timeline *tl = w->tl;
	uint64_t start = kclock_ns();
	bool said = false;

	if (atomic_load_explicit(&tl->done, memory_order_acquire) >= w->seq)
		return;
	pthread_mutex_lock(&tl->mu);
	while (atomic_load_explicit(&tl->done, memory_order_acquire) < w->seq) {
		struct timespec ts = abs_in_ns(1000000000ull);
		pthread_cond_timedwait(&tl->cv, &tl->mu, &ts);
		if (!said && kclock_ns() - start >= EMU_WAIT_WARN_NS) {
			said = true;
			KLOG_ERR(EMU_NAME ": a stream has waited %llu s for another stream (an "
			         "event of stream_wait_event, or the legacy default stream's "
			         "ordering) and still waits: that stream is blocked, or waits for "
			         "this one", (unsigned long long)(EMU_WAIT_WARN_NS / 1000000000u));
		}
	}
	pthread_mutex_unlock(&tl->mu);
}

/* A delay op sleeps on the stream's own condvar, so stream_destroy can cut it short. */
static void op_delay(emu_stream *s, unsigned us)
{
	struct timespec ts = abs_in_ns((uint64_t)us * 1000ull);
	uint64_t until = kclock_ns() + (uint64_t)us * 1000ull;

	pthread_mutex_lock(&s->mu);
	while (!s->closing && kclock_ns() < until)
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	pthread_mutex_unlock(&s->mu);
}

static void op_run(emu_stream *s, emu_op *op)
{
	switch (op->kind) {
	case OP_COPY:
		memcpy(op->dst, op->a, op->count);
		break;
	case OP_REDUCE:
		op->fn(op->dst, op->a, op->b, op->count);
		break;
	case OP_AVG:
		reduce_avg_finish(op->dst, op->count, op->dtype, op->n);
		break;
	case OP_SCALE:
		reduce_scale(op->dst, op->count, op->dtype, op->factor);
		break;
	case OP_ZERO:
		memset(op->dst, 0, op->count);
		break;
	case OP_DELAY:
		op_delay(s, op->us);
		break;
	case OP_MARK: case OP_WAIT:
		break;
	}
}

static void *emu_worker(void *arg)
{
	emu_stream *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (s->head == NULL && !s->closing)
			pthread_cond_wait(&s->cv, &s->mu);
		emu_op *op = s->head;
		if (op == NULL)
			break; /* closing, and drained */
		s->head = op->next;
		if (s->head == NULL)
			s->tail = NULL;
		pthread_mutex_unlock(&s->mu);
		if (emu_delay_max > 0) {
			s->rng ^= s->rng << 13;
			s->rng ^= s->rng >> 7;
			s->rng ^= s->rng << 17;
			uint64_t ns = (s->rng % ((uint64_t)emu_delay_max + 1)) * 1000ull;
			struct timespec ts = { (time_t)(ns / 1000000000ull),
				               (long)(ns % 1000000000ull) };
			nanosleep(&ts, NULL);
		}
		for (int i = 0; i < op->nwaits; i++)
			wait_for(&op->waits[i]);
		op_run(s, op);
		uint64_t seq = op->seq;
		op_free(op);
		tl_publish(s->tl, seq);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static khor_status stream_new(emu_stream **out, kerr *err)
{
	emu_stream *s = calloc(1, sizeof(*s));
	char eb[128];
	int rc;

	pthread_once(&emu_once, emu_init);
	if (s == NULL || (s->tl = tl_new()) == NULL) {
		free(s);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, EMU_NAME ": stream_create: out of memory");
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, &emu_condattr);
	atomic_init(&s->seq, 0);
	s->rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)s ^ kclock_ns();
	if ((rc = pthread_create(&s->thread, NULL, emu_worker, s)) != 0) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		tl_unref(s->tl);
		free(s);
		return kerr_set(err, KHOR_ERR_SYSTEM, EMU_NAME ": stream_create: pthread_create "
		                "failed: %s", kerr_errno_str(rc, eb, sizeof(eb)));
	}
	pthread_mutex_lock(&streams_mu);
	s->live_next = live_streams;
	if (live_streams != NULL)
		live_streams->live_prev = s;
	live_streams = s;
	pthread_mutex_unlock(&streams_mu);
	*out = s;
	return KHOR_SUCCESS;
}

/* The stream an operation goes to: stream, or the process's default stream for NULL. */
static khor_status stream_of(void *stream, emu_stream **out, kerr *err)
{
	emu_stream *s = stream;

	if (s == NULL &&
	    (s = atomic_load_explicit(&default_stream, memory_order_acquire)) == NULL) {
		khor_status st = KHOR_SUCCESS;
		pthread_mutex_lock(&default_mu);
		if ((s = atomic_load(&default_stream)) == NULL &&
		    (st = stream_new(&s, err)) == KHOR_SUCCESS)
			atomic_store_explicit(&default_stream, s, memory_order_release);
		pthread_mutex_unlock(&default_mu);
		if (st != KHOR_SUCCESS)
			return st;
	}
	*out = s;
	return KHOR_SUCCESS;
}

/*
 * Queues op on s (or frees it, on failure), with CUDA's legacy default stream semantics:
 * every stream here is a blocking one (as cuda_stream_create's are), so an operation on
 * the default stream waits for the work queued before it on every other stream, and an
 * operation on another stream waits for the work queued before it on the default stream.
 * That is what lets a blocking collective, which runs on the comm's own stream, order
 * itself after what its caller queued on the default stream.
 *
 * No cycle of waits: each side reads the other's last sequence number (seq_cst) before
 * taking its own, so two concurrent enqueues cannot each see the other's.
 */
static khor_status enqueue(emu_stream *s, emu_op *op, uint64_t *seq_out, kerr *err)
{
	emu_stream *dflt = atomic_load(&default_stream);
	bool ok = true;

	if (s == dflt) {
		pthread_mutex_lock(&streams_mu);
		for (emu_stream *o = live_streams; o != NULL && ok; o = o->live_next) {
			uint64_t k = atomic_load(&o->seq);
			if (o != s && atomic_load(&o->tl->done) < k)
				ok = add_wait(op, o->tl, k);
		}
		pthread_mutex_unlock(&streams_mu);
	} else if (dflt != NULL) {
		uint64_t k = atomic_load(&dflt->seq);
		if (atomic_load(&dflt->tl->done) < k)
			ok = add_wait(op, dflt->tl, k);
	}
	if (!ok) {
		op_free(op);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, EMU_NAME ": out of memory queueing an "
		                "operation");
	}
	pthread_mutex_lock(&s->mu);
	uint64_t seq = op->seq = atomic_fetch_add(&s->seq, 1) + 1;
	if (s->tail != NULL)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (seq_out != NULL)
		*seq_out = seq;
	return KHOR_SUCCESS;
}

static emu_op *op_new(enum emu_opkind kind, const char *what, kerr *err)
{
	emu_op *op = calloc(1, sizeof(*op));

	if (op == NULL)
		kerr_set(err, KHOR_ERR_NO_MEMORY, EMU_NAME " %s: out of memory", what);
	else
		op->kind = kind;
	return op;
}

/*
 * The pointer the worker uses for [p, p + len): the alias when p is emu device memory
 * (held in op->hold[i] until the operation has run), else p itself (host memory).
 */
static khor_status translate(emu_op *op, int i, const void *p, size_t len, const char *what,
                             void **out, kerr *err)
{
	*out = (void *)p;
	if (len == 0 || atomic_load_explicit(&reg_count, memory_order_acquire) == 0)
		return KHOR_SUCCESS;
	pthread_mutex_lock(&reg_mu);
	ptrdiff_t k = reg_find((uintptr_t)p);
	if (k < 0 || regs[k]->kind != KMEM_DEVICE) {
		pthread_mutex_unlock(&reg_mu);
		return KHOR_SUCCESS;
	}
	emu_region *r = regs[k];
	size_t off = (uintptr_t)p - r->dev;
	if (len > r->len - off) {
		size_t rlen = r->len;
		pthread_mutex_unlock(&reg_mu);
		return kerr_set(err, KHOR_ERR_INVALID_ARG, EMU_NAME " %s: %zu B at offset %zu run "
		                "past the end of the %zu B allocation at %p", what, len, off, rlen,
		                (void *)r->dev);
	}
	r->refs++;
	op->hold[i] = r;
	*out = r->alias + off;
	pthread_mutex_unlock(&reg_mu);
	return KHOR_SUCCESS;
}

static bool is_device(const void *p)
{
	kmem_where w;

	return kmem_emu_backend.query(p, &w) && w.kind == KMEM_DEVICE;
}

/* ---- the backend's operations --------------------------------------------------------- */

static bool emu_query(const void *p, kmem_where *out)
{
	if (atomic_load_explicit(&reg_count, memory_order_acquire) == 0)
		return false;
	pthread_mutex_lock(&reg_mu);
	ptrdiff_t k = reg_find((uintptr_t)p);
	kmem_kind kind = k >= 0 ? regs[k]->kind : KMEM_HOST;
	pthread_mutex_unlock(&reg_mu);
	if (k < 0)
		return false;
	out->kind = kind;
	out->be = &kmem_emu_backend;
	out->device = kind == KMEM_DEVICE ? 0 : -1;
	out->ctx = kind == KMEM_DEVICE ? (void *)&emu_ctx : NULL;
	return true;
}

static khor_status emu_bind(void *ctx, kerr *err)
{
	return KHOR_SUCCESS;
}

static khor_status emu_stream_create(void **stream_out, kerr *err)
{
	emu_stream *s;
	khor_status st = stream_new(&s, err);

	if (st == KHOR_SUCCESS)
		*stream_out = s;
	return st;
}

/* Runs what is queued (a delay is cut short) and joins the worker. The default stream stays. */
static void emu_stream_destroy(void *stream)
{
	emu_stream *s = stream;

	if (s == NULL || s == atomic_load(&default_stream))
		return;
	pthread_mutex_lock(&streams_mu);
	if (s->live_prev != NULL)
		s->live_prev->live_next = s->live_next;
	else if (live_streams == s)
		live_streams = s->live_next;
	if (s->live_next != NULL)
		s->live_next->live_prev = s->live_prev;
	pthread_mutex_unlock(&streams_mu);
	pthread_mutex_lock(&s->mu);
	s->closing = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	tl_unref(s->tl);
	free(s);
}

/* Enqueues op, or frees it (and what it holds) when an earlier step failed. */
static khor_status submit(emu_stream *s, emu_op *op, khor_status st, kerr *err)
{
	if (st != KHOR_SUCCESS) {
		op_free(op);
		return st;
	}
	return enqueue(s, op, NULL, err);
}

static khor_status emu_copy(void *dst, const void *src, size_t len, void *stream, kerr *err)
{
	char what[64];
	emu_stream *s;
	emu_op *op;
	void *d, *a;
	khor_status st;

	if (len == 0 || dst == src)
		return KHOR_SUCCESS;
	snprintf(what, sizeof(what), "copy (%s to %s, %zu B)", is_device(src) ? "device" : "host",
	         is_device(dst) ? "device" : "host", len);
	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS)
		return st;
	if ((op = op_new(OP_COPY, what, err)) == NULL)
		return KHOR_ERR_NO_MEMORY;
	if ((st = translate(op, 0, dst, len, what, &d, err)) == KHOR_SUCCESS &&
	    (st = translate(op, 1, src, len, what, &a, err)) == KHOR_SUCCESS) {
		uintptr_t x = (uintptr_t)d, y = (uintptr_t)a;
		if (x < y + len && y < x + len)
			st = kerr_set(err, KHOR_ERR_INVALID_ARG, EMU_NAME " %s: source and "
			              "destination overlap", what);
		op->dst = d;
		op->a = a;
		op->count = len;
	}
	return submit(s, op, st, err);
}

static khor_status emu_reduce(void *dst, const void *a, const void *b, size_t count,
                              khor_dtype dtype, khor_op op, void *stream, kerr *err)
{
	reduce_fn fn = reduce_kernel(dtype, op);
	size_t bytes = count * kdtype_size(dtype);
	char what[64];
	emu_stream *s;
	emu_op *o;
	void *d, *x, *y;
	khor_status st;

	if (fn == NULL)
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, EMU_NAME " reduce: %s of %s is not "
		                "supported", kop_name(op), kdtype_name(dtype));
	if (count == 0)
		return KHOR_SUCCESS;
	snprintf(what, sizeof(what), "reduce (%s %s, %zu elements)", kdtype_name(dtype),
	         kop_name(op), count);
	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS)
		return st;
	if ((o = op_new(OP_REDUCE, what, err)) == NULL)
		return KHOR_ERR_NO_MEMORY;
	if ((st = translate(o, 0, dst, bytes, what, &d, err)) == KHOR_SUCCESS &&
	    (st = translate(o, 1, a, bytes, what, &x, err)) == KHOR_SUCCESS &&
	    (st = translate(o, 2, b, bytes, what, &y, err)) == KHOR_SUCCESS) {
		o->dst = d;
		o->a = x;
		o->b = y;
		o->count = count;
		o->fn = fn;
	}
	return submit(s, o, st, err);
}

/* The operation on one buffer, in place (avg_finish, scale, memset_zero), not yet queued. */
static khor_status one_buffer(enum emu_opkind kind, void *buf, size_t bytes, const char *what,
                              emu_op **op_out, kerr *err)
{
	emu_op *op;
	void *d;
	khor_status st;

	if ((op = op_new(kind, what, err)) == NULL)
		return KHOR_ERR_NO_MEMORY;
	if ((st = translate(op, 0, buf, bytes, what, &d, err)) != KHOR_SUCCESS) {
		op_free(op);
		return st;
	}
	op->dst = d;
	op->count = bytes;
	*op_out = op;
	return KHOR_SUCCESS;
}

static khor_status emu_avg_finish(void *buf, size_t count, khor_dtype dtype, int n, void *stream,
                                  kerr *err)
{
	char what[64];
	emu_stream *s;
	emu_op *op;
	khor_status st;

	if (kdtype_size(dtype) == 0 || n < 1)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, EMU_NAME " avg_finish: dtype %d, n %d: "
		                "not a dtype, or n < 1", (int)dtype, n);
	if (count == 0 || n == 1)
		return KHOR_SUCCESS;
	snprintf(what, sizeof(what), "avg_finish (%s, %zu elements)", kdtype_name(dtype), count);
	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS ||
	    (st = one_buffer(OP_AVG, buf, count * kdtype_size(dtype), what, &op, err)) !=
	            KHOR_SUCCESS)
		return st;
	op->count = count;
	op->dtype = dtype;
	op->n = n;
	return enqueue(s, op, NULL, err);
}

static khor_status emu_scale(void *buf, size_t count, khor_dtype dtype, double factor,
                             void *stream, kerr *err)
{
	char what[64];
	emu_stream *s;
	emu_op *op;
	khor_status st;
	bool floating = dtype == KHOR_FLOAT32 || dtype == KHOR_FLOAT64 || dtype == KHOR_FLOAT16 ||
	                dtype == KHOR_BFLOAT16;

	/* Integers are left alone, as in execute.c: the engine refuses their scale factors. */
	if (factor == 1.0 || count == 0 || !floating)
		return KHOR_SUCCESS;
	snprintf(what, sizeof(what), "scale (%s, %zu elements)", kdtype_name(dtype), count);
	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS ||
	    (st = one_buffer(OP_SCALE, buf, count * kdtype_size(dtype), what, &op, err)) !=
	            KHOR_SUCCESS)
		return st;
	op->count = count;
	op->dtype = dtype;
	op->factor = factor;
	return enqueue(s, op, NULL, err);
}

static khor_status emu_memset_zero(void *buf, size_t len, void *stream, kerr *err)
{
	char what[64];
	emu_stream *s;
	emu_op *op;
	khor_status st;

	if (len == 0)
		return KHOR_SUCCESS;
	snprintf(what, sizeof(what), "memset_zero (%zu B)", len);
	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS ||
	    (st = one_buffer(OP_ZERO, buf, len, what, &op, err)) != KHOR_SUCCESS)
		return st;
	return enqueue(s, op, NULL, err);
}

static khor_status emu_event_create(void **ev_out, kerr *err)
{
	emu_event *ev = calloc(1, sizeof(*ev));

	if (ev == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, EMU_NAME " event_create: out of memory");
	*ev_out = ev;
	return KHOR_SUCCESS;
}

static void emu_event_destroy(void *p)
{
	emu_event *ev = p;

	if (ev == NULL)
		return;
	tl_unref(ev->tl);
	free(ev);
}

static khor_status emu_event_record(void *p, void *stream, kerr *err)
{
	emu_event *ev = p;
	emu_stream *s;
	emu_op *op;
	khor_status st;

	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS)
		return st;
	if ((op = op_new(OP_MARK, "event_record", err)) == NULL)
		return KHOR_ERR_NO_MEMORY;
	uint64_t seq;
	if ((st = enqueue(s, op, &seq, err)) != KHOR_SUCCESS)
		return st;
	if (ev->tl != s->tl) {
		tl_unref(ev->tl);
		ev->tl = tl_ref(s->tl);
	}
	ev->seq = seq;
	return KHOR_SUCCESS;
}

static khor_status emu_event_query(void *p, bool *done, kerr *err)
{
	const emu_event *ev = p;

	*done = ev->tl == NULL ||
	        atomic_load_explicit(&ev->tl->done, memory_order_acquire) >= ev->seq;
	return KHOR_SUCCESS;
}

static khor_status emu_stream_wait_event(void *stream, void *p, kerr *err)
{
	const emu_event *ev = p;
	emu_stream *s;
	emu_op *op;
	khor_status st;

	if (ev->tl == NULL)
		return KHOR_SUCCESS; /* never recorded: nothing to wait for */
	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS)
		return st;
	if ((op = op_new(OP_WAIT, "stream_wait_event", err)) == NULL)
		return KHOR_ERR_NO_MEMORY;
	if (!add_wait(op, ev->tl, ev->seq)) {
		op_free(op);
		return kerr_set(err, KHOR_ERR_NO_MEMORY,
		                EMU_NAME " stream_wait_event: out of memory");
	}
	return enqueue(s, op, NULL, err);
}

/* Bytes of each mapping for len: whole pages, at least one; 0 on overflow. */
static size_t map_len(size_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	if (len > SIZE_MAX / 2)
		return 0;
	return len == 0 ? page : (len + page - 1) / page * page;
}

static khor_status map_error(kerr *err, const char *what, size_t len, int e)
{
	char eb[128];

	return kerr_set(err, e == ENOMEM ? KHOR_ERR_NO_MEMORY : KHOR_ERR_SYSTEM,
	                EMU_NAME " %s (%zu B) failed: %s", what, len,
	                kerr_errno_str(e, eb, sizeof(eb)));
}

static khor_status emu_dev_alloc(size_t len, void **p_out, kerr *err)
{
	size_t maplen = map_len(len), span = maplen + (size_t)sysconf(_SC_PAGESIZE);
	emu_region *r;
	void *dev, *alias;
	int fd, e;
	khor_status st;

	pthread_once(&emu_once, emu_init);
	if (maplen == 0)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, EMU_NAME " dev_alloc (%zu B): too large",
		                len);
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return map_error(err, "dev_alloc", len, ENOMEM);
	if ((fd = memfd_create("khor-emu-device", MFD_CLOEXEC)) < 0) {
		e = errno;
		st = map_error(err, "dev_alloc: memfd_create", len, e);
		goto fail_free_region;
	}
	if (ftruncate(fd, (off_t)maplen) != 0) {
		e = errno;
		st = map_error(err, "dev_alloc: ftruncate", len, e);
		goto fail_close_fd;
	}
	/*
	 * The device range runs a page past the memory: a pointer just past the end is still
	 * this allocation's, so an operation on it fails the bounds check instead of being
	 * taken for host memory.
	 */
	if ((dev = mmap(NULL, span, PROT_NONE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		e = errno;
		st = map_error(err, "dev_alloc: mmap", len, e);
		goto fail_close_fd;
	}
	alias = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (alias == MAP_FAILED) {
		e = errno;
		st = map_error(err, "dev_alloc: mmap", len, e);
		goto fail_unmap_dev;
	}
	close(fd); /* the mappings keep the memory */
	r->dev = (uintptr_t)dev;
	r->len = len;
	r->maplen = maplen;
	r->span = span;
	r->alias = alias;
	r->kind = KMEM_DEVICE;
	if ((st = reg_add(r, err)) != KHOR_SUCCESS) {
		region_unmap(r);
		return st;
	}
	*p_out = dev;
	return KHOR_SUCCESS;

fail_unmap_dev:
	munmap(dev, span);
fail_close_fd:
	close(fd);
fail_free_region:
	free(r);
	return st;
}

static void emu_dev_free(void *p)
{
	reg_free(p, KMEM_DEVICE, "dev_free");
}

static khor_status emu_host_alloc(size_t len, void **p_out, kerr *err)
{
	size_t maplen = map_len(len);
	emu_region *r;
	void *p;
	khor_status st;

	pthread_once(&emu_once, emu_init);
	if (maplen == 0)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, EMU_NAME " host_alloc (%zu B): too large",
		                len);
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return map_error(err, "host_alloc", len, ENOMEM);
	p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		free(r);
		return map_error(err, "host_alloc: mmap", len, e);
	}
	r->dev = (uintptr_t)p;
	r->len = len;
	r->maplen = maplen;
	r->span = maplen;
	r->alias = p;
	r->kind = KMEM_PINNED;
	if ((st = reg_add(r, err)) != KHOR_SUCCESS) {
		region_unmap(r);
		return st;
	}
	*p_out = p;
	return KHOR_SUCCESS;
}

static void emu_host_free(void *p)
{
	reg_free(p, KMEM_PINNED, "host_free");
}

static int emu_dmabuf_fd(const void *p, size_t len, uint64_t *offset_out)
{
	return -1;
}

const kmem_backend kmem_emu_backend = {
	.name = EMU_NAME,
	.query = emu_query,
	.bind = emu_bind,
	.stream_create = emu_stream_create,
	.stream_destroy = emu_stream_destroy,
	.copy = emu_copy,
	.reduce = emu_reduce,
	.avg_finish = emu_avg_finish,
	.scale = emu_scale,
	.memset_zero = emu_memset_zero,
	.event_create = emu_event_create,
	.event_destroy = emu_event_destroy,
	.event_record = emu_event_record,
	.event_query = emu_event_query,
	.stream_wait_event = emu_stream_wait_event,
	.dev_alloc = emu_dev_alloc,
	.dev_free = emu_dev_free,
	.host_alloc = emu_host_alloc,
	.host_free = emu_host_free,
	.dmabuf_fd = emu_dmabuf_fd,
};

/*
 * Linking this file into a test is what puts the emulated device into the seam: first in
 * the table, as it was when libkhor carried it, so that its one-load query answers before
 * a real backend's. Before main, so no thread of the test can be querying yet.
 */
__attribute__((constructor)) static void emu_register(void)
{
	if (!kmem_backend_add(&kmem_emu_backend))
		KLOG_ERR("the emulated device could not be added to the memory seam: its backend "
		         "table is full");
}

/* ---- test-only extras (mem_emu.h) ----------------------------------------------------- */

khor_status kmem_emu_delay(void *stream, unsigned us, kerr *err)
{
	emu_stream *s;
	emu_op *op;
	khor_status st;

	if ((st = stream_of(stream, &s, err)) != KHOR_SUCCESS)
		return st;
	if ((op = op_new(OP_DELAY, "delay", err)) == NULL)
		return KHOR_ERR_NO_MEMORY;
	op->us = us;
	return enqueue(s, op, NULL, err);
}

void *kmem_emu_alloc(size_t len)
{
	void *p;
	kerr e;

	kerr_clear(&e);
	if (emu_dev_alloc(len, &p, &e) != KHOR_SUCCESS) {
		KLOG_ERR("%s", e.text);
		return NULL;
	}
	return p;
}

void kmem_emu_free(void *p)
{
	emu_dev_free(p);
}

khor_status kmem_emu_stream_sync(void *stream)
{
	kerr e;
	khor_status st;

	kerr_clear(&e);
	st = kmem_stream_sync(&kmem_emu_backend, stream, kdeadline_in_ms(60000),
	                      "kmem_emu_stream_sync", &e);
	if (st != KHOR_SUCCESS)
		KLOG_ERR("%s", e.text);
	return st;
}

khor_status kmem_emu_copy_sync(void *dst, const void *src, size_t len)
{
	kerr e;
	khor_status st;

	kerr_clear(&e);
	if ((st = emu_copy(dst, src, len, NULL, &e)) != KHOR_SUCCESS) {
		KLOG_ERR("%s", e.text);
		return st;
	}
	return kmem_emu_stream_sync(NULL);
}
