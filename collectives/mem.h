/*
 * mem.h -- the memory seam: what kind of memory a buffer is, and the operations the
 * schedules use to copy, reduce and allocate instead of memcpy and the CPU kernels.
 *
 * A buffer is host memory (pageable or pinned: the CPU reaches both) or device memory of
 * one backend. A backend is a table of operations on its memory, all asynchronous on a
 * stream of its own kind, in stream order:
 *
 *   cuda (cuda/mem_cuda.c)   the CUDA driver API, loaded at run time (dlopen libcuda.so.1),
 *                            and khor's CUDA kernels; present when built with nvcc
 *
 * A test adds backends of its own ahead of these (kmem_backend_add): the emulated device
 * (tests/support/mem_emu.c), a pretend device for machines without a GPU, whose memory
 * the process cannot touch and whose streams run on threads of their own, so that a
 * schedule that reads device memory directly crashes and one that forgets to wait for a
 * stream reads stale data. It is a test double: libkhor does not carry it.
 *
 * The kind is found per call (kmem_query): libkhor has no hard CUDA dependency, and on a
 * machine without libcuda every buffer is host memory at the cost of one failed dlopen.
 *
 * Rules every backend keeps (the schedules and the staging in coll.c rely on them):
 * - Operations on one stream run in the order they were enqueued; an event recorded on a
 *   stream completes when everything enqueued before it has.
 * - copy takes any pair of host and device pointers of this backend (either may be host
 *   memory; a host source or destination must stay valid until the copy has run: the
 *   callers only use pinned staging slots and the stream-ordered waits make sure of that).
 *   dst == src does nothing; other overlap is not allowed.
 * - reduce and avg_finish have the CPU kernels' semantics and bits (collectives/reduce.h).
 * - Nothing here blocks the host except sync, which waits for a stream with a deadline.
 * - Errors name the operation and the backend's own message ("cuMemcpyAsync (device to
 *   host, 1048576 B) failed: an illegal memory access was encountered").
 * Thread safety: backends are safe to call from any thread; a stream or event is used by
 * one thread at a time (a comm's collective thread, or the caller of a stream variant).
 */
#ifndef KHOR_MEM_H
#define KHOR_MEM_H

#include "base/clock.h"
#include "base/err.h"
#include "khor.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum kmem_kind {
	KMEM_HOST = 0,   /* pageable host memory, or anything no backend claims */
	KMEM_PINNED = 1, /* page-locked host memory a backend allocated or registered */
	KMEM_DEVICE = 2, /* device memory: only the backend's operations may touch it */
} kmem_kind;

typedef struct kmem_backend kmem_backend;

/* What kmem_query found out about one pointer. */
typedef struct kmem_where {
	kmem_kind kind;
	const kmem_backend *be; /* NULL for KMEM_HOST */
	int device;             /* the device's ordinal (KMEM_DEVICE), else -1 */
	void *ctx;              /* the backend's context for that device (CUcontext), or NULL */
} kmem_where;

struct kmem_backend {
	const char *name; /* "cuda", "emulated device" */
	/*
	 * Claims p or not: true and *out filled when p lies in memory of this backend (device
	 * or pinned host). Fast when the backend has nothing allocated: the host path pays it
	 * on every call.
	 */
	bool (*query)(const void *p, kmem_where *out);
	/* Makes ctx (from query) current on the calling thread, before any other operation. */
	khor_status (*bind)(void *ctx, kerr *err);
	/*
	 * The context current on the calling thread now, and making that one current again
	 * after a call: a thread of the caller's keeps the device it had (a process driving
	 * several GPUs would otherwise find its next CUDA call on another). NULL: nothing to
	 * keep (the pretend device).
	 */
	void *(*current)(void);
	void (*restore)(void *prev);
	/* A stream of the calling thread's bound device; destroy waits for nothing. */
	khor_status (*stream_create)(void **stream_out, kerr *err);
	void (*stream_destroy)(void *stream);

	khor_status (*copy)(void *dst, const void *src, size_t len, void *stream, kerr *err);
	khor_status (*reduce)(void *dst, const void *a, const void *b, size_t count,
	                      khor_dtype dtype, khor_op op, void *stream, kerr *err);
	khor_status (*avg_finish)(void *buf, size_t count, khor_dtype dtype, int n, void *stream,
	                          kerr *err);
	/* buf[i] *= factor for floating dtypes (the engine's pre- and postscale). */
	khor_status (*scale)(void *buf, size_t count, khor_dtype dtype, double factor, void *stream,
	                     kerr *err);
	khor_status (*memset_zero)(void *buf, size_t len, void *stream, kerr *err);

	khor_status (*event_create)(void **ev_out, kerr *err);
	void (*event_destroy)(void *ev);
	khor_status (*event_record)(void *ev, void *stream, kerr *err);
	/* *done: everything before the record has run. Never blocks. */
	khor_status (*event_query)(void *ev, bool *done, kerr *err);
	/* Later work on stream waits for ev, on the device: the host does not wait. */
	khor_status (*stream_wait_event)(void *stream, void *ev, kerr *err);

	/* Device memory of the bound device, and page-locked host memory (staging slots). */
	khor_status (*dev_alloc)(size_t len, void **p_out, kerr *err);
	void (*dev_free)(void *p);
	khor_status (*host_alloc)(size_t len, void **p_out, kerr *err);
	void (*host_free)(void *p);
	/* The dmabuf fd and offset of device memory for GPUDirect registration (-1: none). */
	int (*dmabuf_fd)(const void *p, size_t len, uint64_t *offset_out);
};

/*
 * Every backend, NULL-terminated: those a test added, then those built in (cuda when built
 * with it). The first whose query claims a pointer owns it.
 */
extern const kmem_backend *kmem_backends[];

/*
 * Puts be first in kmem_backends: the seam's way in for a test double, so that libkhor
 * itself carries none. Internal (not exported from libkhor.so; the tests link the static
 * layers). Not thread-safe against kmem_query: call it before any thread can ask the seam,
 * from a constructor. False when the room for added backends is used up.
 */
bool kmem_backend_add(const kmem_backend *be);

/* The kind of p (never fails: unknown pointers are host memory). */
void kmem_query(const void *p, kmem_where *out);

/* "host memory", "pinned host memory", "cuda device 0 memory", for messages. */
const char *kmem_describe(const kmem_where *w, char *buf, size_t len);

/*
 * Waits on the host until ev has completed, up to dl; polls, yielding the core. The error
 * names what: "waiting for the cuda stream (allreduce seq 4)".
 */
khor_status kmem_event_wait(const kmem_backend *be, void *ev, kdeadline dl, const char *what,
                            kerr *err);
/* Records a fresh event on stream and waits for it (kmem_event_wait): all of it has run. */
khor_status kmem_stream_sync(const kmem_backend *be, void *stream, kdeadline dl,
                             const char *what, kerr *err);

/*
 * The device side of one comm (shared by its groups, as coll_reg_call is): set for the
 * length of one call on device memory, with its own stream and grow-only scratch that
 * live as long as the comm. The runtime owns it (runtime/comm.c); coll.c's helpers read it.
 *   be == NULL between calls and during calls on host memory.
 */
typedef struct kmem_pool_slot {
	void *p;
	size_t len;
	bool busy;
	void *after; /* busy until this event completes (a copy out of the slot is queued) */
} kmem_pool_slot;

#define KMEM_POOL_SLOTS 256
#define KMEM_EVENTS 128

typedef struct kmem_state {
	/* This call: */
	const kmem_backend *be; /* NULL: host call */
	void *stream;           /* where the call's device work goes: the caller's or own_stream */
	/* Kept across calls, for the device they were made on (dev_be, dev_ctx): */
	const kmem_backend *dev_be;
	void *dev_ctx;
	int device;
	void *own_stream;
	void *scratch; /* device twins of coll_comm's scratch, big and tmp buffers */
	size_t scratch_len;
	void *big;
	size_t big_len;
	void *tmp;
	size_t tmp_len;
	kmem_pool_slot pool[KMEM_POOL_SLOTS]; /* pinned staging slots, by size */
	void *events[KMEM_EVENTS];            /* free events of dev_be */
	int nevents;
	/* Bit i: coll_comm.tps[i] can't take device memory (staged); bit 16 + i: said so. */
	unsigned no_direct;
	/*
	 * Recorded on the last call's stream at its end: a call on another stream waits for it
	 * (on the device) before it touches the scratch the last one may still be using.
	 */
	void *last_ev;
	void *last_stream;
	bool last_set;
	void *prev_ctx; /* the calling thread's context before this call (backend current) */
} kmem_state;

/*
 * Makes st ready for a call on memory where (KMEM_DEVICE): on the caller's stream when
 * given (which may be NULL, the backend's default stream), else on the comm's own stream,
 * made on first use. Binds the context and, when the device changed since the last call,
 * frees what belonged to the old one. scratch_len is the host scratch's size, which the
 * device scratch matches.
 */
khor_status kmem_state_begin(kmem_state *st, const kmem_where *where, bool given,
                             void *stream, size_t scratch_len, kerr *err);
/* Ends the call: st->be becomes NULL (the buffers stay for the next call). */
void kmem_state_end(kmem_state *st);
/* Frees everything (the comm is destroyed); waits for its own stream first, up to 5 s. */
void kmem_state_destroy(kmem_state *st);

/* Grow-only device buffers of st (0: big, 1: tmp), kept across calls; NULL when out of memory. */
void *kmem_state_buffer(kmem_state *st, int which, size_t len, kerr *err);

/* A pinned staging slot of at least len bytes (*slot_out its index), or an error. */
khor_status kmem_pool_get(kmem_state *st, size_t len, int *slot_out, kerr *err);
void kmem_pool_put(kmem_state *st, int slot);
/* Gives slot back once ev (recorded after the last copy out of it) has completed; ev too. */
void kmem_pool_put_after(kmem_state *st, int slot, void *ev);

/* A free event of st's backend (from the pool, or a new one); put gives it back. */
khor_status kmem_event_get(kmem_state *st, void **ev_out, kerr *err);
void kmem_event_put(kmem_state *st, void *ev);

#endif
