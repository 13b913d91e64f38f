/*
 * types.h -- the objects every file of the engine shares (engine.h draws how they move):
 * the handle and its tensors, a process set, the engine, a cycle's response list. It sits
 * below every engine file and calls nothing; the name map (map.h) and byte buffers
 * (bbuf.h) sit beside it.
 */
#ifndef KHOR_ENGINE_TYPES_H
#define KHOR_ENGINE_TYPES_H

#include "map.h"

#include "base/list.h"
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

static inline const char *eng_kind_name(int kind) /* "allreduce" */
{
	static const char *const names[EK_KINDS] = {
		"allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join"
	};
	return kind >= 0 && kind < EK_KINDS ? names[kind] : "?";
}

static inline const char *eng_kind_upper(int kind) /* "ALLREDUCE", the timeline's */
{
	static const char *const names[EK_KINDS] = {
		"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN"
	};
	return kind >= 0 && kind < EK_KINDS ? names[kind] : "?";
}

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
	klist link;              /* in the set's fresh list, then its pending list (under mu) */
	/*
	 * Its names are in the set's names map, and it is in the set's named list (under mu),
	 * from enqueue until its owner has seen it complete (a wait or test that returns its
	 * status, its callback) or freed it: a name is taken that long (queue.c says why).
	 */
	klist named_link;
	bool named;
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

/* The coordinator's view of one key (table.c). */
typedef struct centry {
	char *key;
	klist link;      /* in the set's table, in arrival order */
	uint8_t **desc;  /* per rank, NULL until it reported */
	size_t *desc_len;
	uint64_t *ready_ns;
	int have;
	uint64_t first_ns;
	uint64_t warned_ns;
	bool from_cache_all; /* every report so far was a cache hit */
	int slot;            /* the cache slot the hits named, -1 */
} centry;

/* One item of a cycle's work list, in response order (response.c -> execute.c). */
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
	/* error: KHOR_ERR_REMOTE once a peer has stopped (the error is the stop's doing, which
	 * an elastic job's reset cures), else KHOR_ERR_INVALID_ARG (the ranks' tensors
	 * disagree). */
	khor_status status;
} eitem;

/* A cycle's responses, as negotiation hands them to the set's loop to run (response.c). */
typedef struct eresp {
	eitem *items;
	int n;
	bool stop; /* every rank asked to stop: the set's thread ends after these */
} eresp;

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
	klist fresh;                      /* enqueued, not reported yet (queue.c) */
	klist pending;                    /* reported, waiting for a response */
	emap names;                       /* tensor names taken -> handle (queue.c) */
	klist named;                      /* the handles holding them, for the set's end */
	emap keys;                        /* keys in flight -> handle */
	khor_handle *join;                /* this rank's join, while it waits */
	bool stop;                        /* khor_engine_stop was called */
	bool failed;
	kerr err;                         /* the set's sticky failure */
	/*
	 * Peers that have stopped (khor_engine_stop, or removed the set), as the coordinator's
	 * 'Q' records tell every rank: nothing more can run on the set, so an enqueue fails at
	 * once and a join ends, with the first one's name (the cause). size > 1 only.
	 */
	bool *peer_stop;
	int first_stopper;                /* -1: none */
	bool stop_failed;                 /* the set failed while stopping (its err says why) */
	/*
	 * The baton: whoever holds it runs the set's turns (engine.c), and everything below
	 * marked the baton's is its holder's alone. The set thread holds it for a turn and
	 * lets go while it sleeps; a thread waiting for a handle (engine_wait) may take it
	 * meanwhile and run the cycle itself, with no hand-off to the set thread and back.
	 */
	pthread_mutex_t drive;
	bool caller;                      /* the holder is a waiting caller (the baton's) */
	bool over;                        /* the set's loop has ended (the baton's) */
	bool dev_seen;                    /* a tensor of non-host memory was enqueued (mu) */
	struct nidle *idle;               /* a turn's idle wait, kept between turns (the
	                                   * baton's; negotiate.c) */
	/* The baton's (the set thread's, or a waiting caller's). */
	atomic_bool woken;
	pthread_cond_t cv;                /* one-rank sets sleep here */
	uint32_t cycle;
	ecache cache;
	bool stop_sent;
	/* From when this rank asked to stop (set_stop_locked), the others have KHOR_TIMEOUT to
	 * do the same: one deadline for the whole stop, never moved by cycles or by the peers
	 * being alive, and running also while a cycle begun before the request waits. */
	kdeadline stop_dl;
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
	klist arrivals;                   /* its centries, in arrival order */
	bool *joined_r, *stop_r;
	bool *stop_told;                  /* stop_r[r] sent to every rank (a 'Q' record) */
	int njoined, nstop, last_joiner;
	uint64_t next_stall_check_ns;
	/* Statistics, for khor-bench and autotune. */
	_Atomic uint64_t cycles, negotiate_ns, bytes_done; /* written by the set thread only */
} eset;

/*
 * This rank asks set s to stop (under the engine's mu): its next report says 'S', and the
 * stop's deadline starts now, also for a cycle already waiting. Asking again keeps it.
 */
static inline void set_stop_locked(eset *s)
{
	if (!s->stop) {
		s->stop = true;
		s->stop_dl = kdeadline_in_ms(s->ctl != NULL ? s->ctl->cc.timeout_ms : 0);
	}
}

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

#endif
