/*
 * engine.h -- the named-tensor engine (Horovod's model) behind khor_engine_* and
 * khor_enqueue_*: its objects and the pieces its files share.
 *
 *   application threads          set thread (one per process set)
 *   -------------------          ---------------------------------
 *   khor_enqueue_* -> handle --> fresh list --> cycle k: report what is new to the
 *                      ^                        coordinator (set rank 0), get back the
 *                      |                        responses, run them (fused), complete
 *                      +--- completion <------- handles; sleep until work or a message
 *
 * engine.c owns the lifecycle, the handles and the set threads; negotiate.c the cycle's
 * messages, the coordinator's table, the response cache, mismatch and stall messages;
 * execute.c runs a cycle's responses (fusion, scale factors, joined ranks' zeros, on host
 * or device memory, with the inputs' ready events);
 * timeline.c writes the Chrome trace; autotune.c tunes fusion and cycle time.
 */
#ifndef KHOR_RUNTIME_ENGINE_H
#define KHOR_RUNTIME_ENGINE_H

#include "runtime/comm.h"

#include <pthread.h>
#include <stdatomic.h>

#define ENG_MAX_DIMS 8

/* What a handle asks for; also the kind byte of a descriptor. */
enum eng_kind {
	EK_ALLREDUCE = 0,
	EK_ALLGATHER,
	EK_BROADCAST,
	EK_ALLTOALL,
	EK_REDUCESCATTER,
	EK_BARRIER,
	EK_JOIN,
	EK_KINDS
};

const char *eng_kind_name(int kind);  /* "allreduce" */
const char *eng_kind_upper(int kind); /* "ALLREDUCE", the timeline's */

/* Settings of an engine, from its config, KHOR_* and HOROVOD_* (settings.c). */
typedef struct eng_settings {
	uint64_t fusion_bytes;
	double cycle_ms;
	int cache_capacity;
	char timeline[512];
	bool mark_cycles;
	double stall_check_s;     /* 0 = off */
	double stall_shutdown_s;  /* 0 = off */
	bool autotune;
	char autotune_log[512];
	int warmup_samples, steps_per_sample;
	bool fusion_set, cycle_set; /* given by the user: autotune leaves them alone */
} eng_settings;

typedef struct etensor {
	char *name;
	const void *in;
	void *out;
	khor_dtype dtype;
	int ndim;
	int64_t dims[ENG_MAX_DIMS];
	size_t count;            /* elements of the input */
	void *owned_out;         /* an output the engine allocated (freed with the handle) */
	int out_ndim;
	int64_t out_dims[ENG_MAX_DIMS];
	int64_t *splits;         /* alltoall: rows to each rank, NULL = even (owned) */
	int64_t *rsplits;        /* alltoall: rows from each rank (owned) */
	/*
	 * What memory the tensor's buffers are (kmem_query at enqueue; input and output agree):
	 * host (or pinned host) memory runs as it always has, device memory through its
	 * backend on the set's stream (execute.c). A ghost tensor (a joined rank's) is host.
	 */
	kmem_where mem;
	/* The caller's event (not owned): the input is ready once it completes; NULL = now.
	 * Cleared once the set thread has waited for it. */
	void *ready;
} etensor;

struct eset;
struct khor_engine;

struct khor_handle {
	struct eset *set;
	struct khor_engine *eng;
	struct khor_handle *next; /* in the set's fresh list, then its pending list */
	struct khor_handle *prev;
	int kind;
	khor_op op;
	int root;
	double prescale, postscale;
	int n;
	etensor *t;
	char *key;               /* the names, joined by '\n': what the ranks match */
	uint8_t *desc;           /* the descriptor: what every rank must agree on */
	size_t desc_len;
	khor_alloc_fn alloc;
	void *alloc_arg;
	uint64_t t_enqueue, t_response; /* ns, for the timeline */
	/* Completion, under the engine's mu. */
	bool done, detached, in_cycle;
	bool in_cb;            /* its callback runs now, with mu let go: a free waits for it */
	bool reported;            /* sent to the coordinator (set thread only) */
	uint64_t t_negotiate;     /* coordinator: when the first rank was ready, if earlier */
	atomic_bool done_flag;    /* done, for a lock-free spin */
	khor_status status;
	kerr err;
	khor_done_fn cb;
	void *cb_arg;
	int join_rank;
	int set_rank, set_size;  /* this rank in the set, its size (the set may be gone) */
};

/* A string -> pointer table (engine.c): names in flight, handles by key, the coordinator's. */
typedef struct emap {
	struct emap_node **b;
	size_t nb, n;
} emap;
void *emap_get(const emap *m, const char *k);
khor_status emap_put(emap *m, const char *k, void *v); /* k is copied */
void *emap_del(emap *m, const char *k);
void emap_free(emap *m);

/* One response cache slot: same index, key and descriptor on every rank of the set. */
typedef struct ecache_slot {
	char *key;
	uint8_t *desc;
	size_t desc_len;
	uint64_t used;  /* cycle of last use, for LRU */
} ecache_slot;

typedef struct ecache {
	int cap, n;
	ecache_slot *slot;
	emap index;     /* key -> slot + 1 */
	uint64_t clock;
} ecache;

/* The coordinator's view of one key (negotiate.c). */
typedef struct centry {
	char *key;
	struct centry *next, *prev; /* arrival order */
	uint8_t **desc;  /* per rank, NULL until it reported */
	size_t *desc_len;
	uint64_t *ready_ns;
	int have;
	uint64_t first_ns;
	uint64_t warned_ns;
	bool from_cache_all; /* every report so far was a cache hit */
	int slot;            /* the cache slot the hits named, -1 */
} centry;

/* One item of a cycle's work list, in response order (negotiate.c -> execute.c). */
typedef struct eitem {
	khor_handle *h;      /* NULL: this rank has none (joined): it contributes zeros */
	int kind;
	khor_op op;
	int root;
	double prescale, postscale;
	int n;
	etensor *t;          /* h's tensors, or the descriptor's (ghost) */
	int64_t *dim0;       /* allgather: every rank's dim 0 per tensor [tensor * size + r] */
	bool error;
	char *msg;           /* error: the coordinator's sentence */
} eitem;

/*
 * The device side of a set (execute.c), for one device at a time, made on the set thread
 * at its first device tensor and freed when that thread ends: the engine's own stream,
 * which every copy, scale and collective of a device tensor goes to in order, and the
 * device fusion buffer (grow-only, like the host one).
 */
typedef struct edev {
	const kmem_backend *be; /* NULL: no device tensor ran yet */
	void *ctx;
	int device;
	void *stream;
	void *fusion;
	size_t fusion_len;
} edev;

typedef struct eset {
	struct khor_engine *e;
	int id;
	khor_comm *user;      /* the comm given */
	khor_comm *data;      /* a split of it: the collectives */
	khor_comm *ctl;       /* another split: the cycle's messages */
	int rank, size;
	pthread_t thread;
	bool started;
	/* Under e->mu. */
	khor_handle *fresh, *fresh_tail;  /* enqueued, not reported yet */
	khor_handle *pending;             /* reported, waiting for a response */
	emap names;                       /* tensor names in flight -> handle */
	emap keys;                        /* keys in flight -> handle */
	khor_handle *join;                /* this rank's join, while it waits */
	bool stop;                        /* khor_engine_stop was called */
	bool failed;
	kerr err;                         /* the set's sticky failure */
	/* The set thread's own. */
	atomic_bool woken;
	pthread_cond_t cv;                /* one-rank sets sleep here */
	uint32_t cycle;
	ecache cache;
	bool stop_sent;
	uint8_t *fusion;
	size_t fusion_len;
	edev dev;
	/*
	 * Device-ness is not negotiated: a joined rank contributes its zeros in the memory of
	 * the last allreduce it ran itself (device memory of dev when this is set), so that
	 * its fusion plan and its calls' kind match the others' in the usual all-GPU job.
	 */
	bool join_on_dev;
	uint64_t last_cycle_ns;
	/* The coordinator's (rank 0). */
	emap table;
	centry *first, *last;
	bool *joined_r, *stop_r;
	int njoined, nstop, last_joiner;
	uint64_t next_stall_check_ns;
	/* Statistics, for khor-bench and autotune. */
	_Atomic uint64_t cycles, negotiate_ns, bytes_done; /* written by the set thread only */
} eset;

struct timeline;
struct autotune;

struct khor_engine {
	khor_comm *comm;
	eng_settings s;
	pthread_mutex_t mu;
	pthread_cond_t cv;       /* a handle completed */
	int efd;                 /* eventfd: readable after a completion */
	eset **sets;
	int nsets, cap;
	kerr last;               /* the last failed call */
	struct timeline *tl;     /* under tl's own lock */
	pthread_mutex_t tl_mu;
	atomic_bool tl_on;       /* tl != NULL, for a lock-free look on the hot path */
	struct autotune *at;
	_Atomic uint64_t fusion_bytes; /* the values in force (autotune may change them) */
	_Atomic uint64_t cycle_us;
	int refs;                /* its own until stop, and one per handle not freed (under mu) */
	bool signal_pending;     /* a completion since efd was last rung (under mu) */
	bool stopped;
};

/* One tensor's arguments to an enqueue. */
typedef struct eng_targ {
	const char *name;
	const void *in;
	void *out;
	khor_dtype dtype;
	int ndim;
	const int64_t *dims;
	const int64_t *splits;
	void *ready;             /* the input's ready event (a _event form), or NULL */
} eng_targ;

/* Every enqueue: checks the arguments, makes the handle and hands it to the set thread. */
khor_status engine_enqueue(struct khor_engine *e, int set, int kind, int n, const eng_targ *ta,
                           khor_op op, double prescale, double postscale, int root,
                           khor_alloc_fn alloc, void *alloc_arg, khor_handle **out, kerr *err);
khor_status engine_start(khor_comm *comm, const khor_config *cfg, struct khor_engine **out,
                         kerr *err);
khor_status engine_add_set(struct khor_engine *e, khor_comm *comm, int *id_out, kerr *err);
khor_status engine_stop(struct khor_engine *e, kerr *err);
khor_status engine_remove_set(struct khor_engine *e, int id, kerr *err);
khor_status engine_wait(khor_handle *h);
/* Timeline to path from now (NULL: stop it). */
khor_status engine_timeline(struct khor_engine *e, const char *path, bool mark, kerr *err);
void engine_handle_free(khor_handle *h);
khor_status engine_set_callback(khor_handle *h, khor_done_fn fn, void *arg);

khor_status engine_settings(const khor_config *cfg, eng_settings *s, kerr *err);

/* Completes h (under e->mu): status, error text, callbacks; the fd is rung by
 * engine_signal_locked, once per batch of completions. */
void engine_complete_locked(struct khor_engine *e, khor_handle *h, khor_status st,
                            const char *msg);
void engine_signal_locked(struct khor_engine *e);

/* negotiate.c: one cycle of the set's protocol; false when the thread should end. */
bool negotiate_worker_cycle(eset *s);
bool negotiate_coord_cycle(eset *s);
void negotiate_free(eset *s);
/* The descriptor of a handle (what every rank must agree on) and its parse. */
khor_status desc_make(khor_handle *h, kerr *err);
khor_status desc_parse(const uint8_t *d, size_t len, eitem *it, kerr *err);
/* The key (names joined by '\n') of a descriptor, malloc'd; NULL when malformed. */
char *desc_key(const uint8_t *d, size_t len);
/* The parsers of the cycle's two payloads, exposed for tests/engine/test_negotiate.c:
 * rank r's report into the coordinator's table, and a response applied on this rank
 * (false when the set is to end, e.g. on malformed bytes, which fail the set). */
khor_status coord_merge(eset *s, int r, const uint8_t *p, size_t len, kerr *err);
bool apply_response(eset *s, const uint8_t *p, size_t len);

/* execute.c: runs a cycle's items in order (fusing allreduces); completes the handles. */
void execute_items(eset *s, eitem *items, int n);
/* execute.c: frees the set's device side (edev), on the set thread when it ends. */
void execute_dev_release(eset *s);
/* The set failed: every handle of it fails with s->err, now and at every later enqueue. */
void engine_fail_set(eset *s, const kerr *e);

/* timeline.c */
struct timeline *timeline_open(const char *path, int rank, bool mark_cycles, kerr *err);
void timeline_close(struct timeline *t);
void timeline_begin(struct khor_engine *e, const char *tensor, const char *phase, uint64_t ns,
                    const char *args_json);
void timeline_end(struct khor_engine *e, const char *tensor, uint64_t ns);
void timeline_instant(struct khor_engine *e, const char *tensor, const char *what, uint64_t ns);
void timeline_cycle(struct khor_engine *e, int set, uint32_t cycle, uint64_t ns);
bool timeline_on(struct khor_engine *e);

/* autotune.c */
struct autotune *autotune_create(const eng_settings *s, int rank, kerr *err);
void autotune_free(struct autotune *a);
/* After each cycle with work (set 0's coordinator): maybe new values to agree on. */
bool autotune_cycle(struct autotune *a, uint64_t bytes, uint64_t *fusion, double *cycle_ms);

#endif
