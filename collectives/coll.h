/*
 * coll.h -- what a collective algorithm needs from its communicator, and the shared wait
 * loop. The runtime fills a coll_comm (collectives may not include runtime headers); links
 * are fetched through get_link so they can be made lazily, and check_abort lets a long wait
 * notice that another rank has already failed the job.
 */
#ifndef KHOR_COLL_H
#define KHOR_COLL_H

#include "transport/regcache.h"
#include "transport/transport.h"
#include "mem.h"

#include <stdbool.h>
#include <stddef.h>

/* Every kind of call a comm runs; the number is also the kind byte of a frame's meta. */
enum coll_kind {
	COLL_ALLREDUCE = 0,
	COLL_BROADCAST = 1,
	COLL_BARRIER = 2,
	COLL_REDUCE = 3,
	COLL_ALLGATHER = 4,
	COLL_REDUCESCATTER = 5,
	COLL_ALLTOALL = 6,
	COLL_GATHER = 7,
	COLL_SCATTER = 8,
	COLL_PROBE = 9,  /* the cost model's swaps at init */
	COLL_SPLIT = 10, /* khor_comm_split's exchange on the parent */
	COLL_NEGOTIATE = 11, /* the engine's cycle messages (engine/negotiate.c) */
	COLL_KINDS
};

/* The allreduce schedules; the numbers are also KHOR_ALGO's and coll_meta_sched's. */
enum allreduce_algo { ALGO_AUTO = 0, ALGO_RING, ALGO_RD, ALGO_TREE, ALGO_HD };

/*
 * The top bit of a frame's meta says the sender's buffers are device memory: ranks that
 * mix host and device buffers in one call fail on the first frame (coll_meta_rules), not
 * with a crash or a wrong sum. coll_post sets it; schedules never do.
 */
#define COLL_META_DEVICE 0x80000000u

/* A frame's meta: what both sides must agree on, so a mismatch is an error and not a hang. */
static inline uint32_t coll_meta_make(unsigned coll, unsigned dtype, unsigned op)
{
	return (coll & 0xff) << 16 | (dtype & 0xff) << 8 | (op & 0xff);
}
/*
 * The schedule (enum allreduce_algo) in the top byte: ranks that chose different
 * algorithms for one call fail on the first frame instead of mixing unrelated steps.
 */
static inline uint32_t coll_meta_sched(uint32_t meta, unsigned sched)
{
	return (meta & 0xffffffu) | (sched & 0x7f) << 24;
}
/*
 * The rules the transports apply to metas (transport.h): two frames of one call conflict
 * when both name a schedule and the schedules differ, or when one is from device memory
 * and the other from host memory. Other metas may legitimately differ within one call (a
 * node-aware allreduce runs a reduce-scatter and then an allgather under the same seq),
 * so only those are compared. Described as "allreduce float32 sum, ring on host memory".
 */
extern const tp_meta_rules coll_meta_rules;

#define COLL_MAX_TP 4 /* ib, tcp, shm and one to spare */

/* The choices KHOR_LOG=debug shows once per power-of-two size (allreduce: auto's and forced). */
enum { LOGGED_AUTO, LOGGED_FORCED, LOGGED_BCAST, LOGGED_ALLGATHER, LOGGED_RS, LOGGED_DEVICE_RING,
       COLL_LOGGED_KINDS };

/*
 * The cost model (select.h) that picks schedules: alpha s per message, beta s per byte on a
 * link, gamma s per byte reduced; ring_slice is the ring's pipeline slice (each slice is a
 * message of its own) and cache the bytes of last-level cache one rank can count on keeping
 * a step's data in (0: don't count on any). Valid when alpha > 0. Every rank of a comm holds
 * the same values.
 */
typedef struct cost_model {
	double alpha;
	double beta;
	double gamma;
	double ring_slice;
	double cache;
} cost_model;

/* One transport instance the comm's links come from (ib, tcp, shm). */
typedef struct coll_tp {
	const struct transport_ops *ops;
	tp_ctx *ctx;
	tp_caps caps;
	tp_regcache *cache; /* when caps.needs_reg: the context's, for this instance; else NULL */
} coll_tp;

/*
 * The buffers of the collective call running now, for registration (coll_post): a slice
 * of one of them is registered as the whole buffer, once per call (or once for all calls,
 * scope REGCACHE_KEEP, under KHOR_REG_CACHE_USER=1), so the schedule's slices hit the
 * cache. Temp buffers that are none of these, nor the comm's scratch or big buffer, get
 * REGCACHE_ONESHOT registrations: nobody reports their free. Set by the runtime around
 * each call; scope is REGCACHE_ONESHOT and n 0 outside calls.
 */
typedef struct coll_reg_call {
	uint64_t scope;
	int n;
	struct {
		uintptr_t lo;
		size_t len;
		uint64_t scope;
	} buf[2];
} coll_reg_call;

/* What a wait past its deadline asks the liveness hook (coll_comm.check_alive). */
typedef struct coll_alive_ask {
	const char *what;  /* "allreduce seq 7"; NULL: judge quietly, for a guard behind a wait
	                    * that warns itself */
	const int *peers;  /* the world ranks it still needs; NULL: every other rank of the comm */
	int n;
	int64_t waited_ms; /* since the wait began */
	uint64_t progress; /* moves whenever the wait gets on (completed transfers); the same
	                    * value while it is stuck */
	bool quiet;        /* judge, publish the wait and look for deadlocks, but warn not: a
	                    * wait that may last as long as the application likes (an engine
	                    * worker's for its coordinator's answer) */
} coll_alive_ask;

typedef struct coll_comm {
	int rank, size;
	uint32_t comm_id;
	coll_tp tps[COLL_MAX_TP];
	int ntps;
	const int *map; /* a sub-group (node, cross): group rank -> world rank; NULL = world */
	void *owner; /* the runtime's comm, passed back to the callbacks */
	/*
	 * A ready link to peer, made or accepted on first use, and the index in tps[] of the
	 * transport it belongs to; waits up to dl.
	 */
	khor_status (*get_link)(void *owner, int peer, kdeadline dl, tp_link **link_out,
	                        int *tp_out, kerr *err);
	/* KHOR_SUCCESS, or the error another rank published for the whole job. */
	khor_status (*check_abort)(void *owner, kerr *err);
	/*
	 * Set when the job's abort has been seen by a thread that watches for it: then waits
	 * call check_abort at once instead of once a second. NULL: no such thread.
	 */
	const _Atomic bool *aborted;
	size_t slice_bytes;   /* pipeline slice */
	int max_lanes;        /* slices in flight per collective */
	int64_t timeout_ms;   /* per collective; < 0 = none */
	/*
	 * A wait passed timeout_ms (q says what it is and whom it still needs): KHOR_SUCCESS
	 * while they are alive, and the wait goes on for *again_ms more; else the error naming
	 * the one that is not, or that waits for this rank in turn. NULL: no heartbeats to
	 * judge by, and timeout_ms is final.
	 */
	khor_status (*check_alive)(void *owner, const coll_alive_ask *q, int64_t *again_ms,
	                           kerr *err);
	uint64_t completed;   /* transfers completed (coll_done): a wait that adds none is stuck */
	size_t rd_max_bytes;  /* auto: recursive doubling up to this many bytes */
	int algo;             /* enum allreduce_algo forced by KHOR_ALGO */
	uint64_t spin_ns;     /* busy-poll this long before sleeping in epoll */
	bool spin_yield;      /* more ranks than cores here: yield the core while spinning */
	/*
	 * Threads of this process spinning in a wait now (shared by the context's comms), and
	 * how many may: the cores of this machine over its ranks, at least 1. The others go
	 * straight to the transport's sleep, where whoever moves their bytes wakes them.
	 * Spinning threads beyond the cores only steal them from the ranks they wait for.
	 * Measured with khor-bench --comms 1,2 on 2 ranks and 2 cores: 8-byte calls of 2
	 * comms at once took 20-30 us with one spinner per rank (the other comm pays a
	 * wake-up) and 4-31 us with two, against 3.4 us for one comm. NULL: every wait spins.
	 */
	_Atomic int *spinning;
	int max_spinners;
	cost_model model;     /* select.h */
	uint64_t logged[COLL_LOGGED_KINDS]; /* sizes (log2) whose choice KHOR_LOG=debug showed */
	unsigned poll_count;     /* coll_progress calls, to poll idle transports now and then */
	size_t pick_cache_bytes; /* allreduce_pick's last size + 1 (0 = none) and its answer */
	int pick_cache_algo;
	void *scratch;        /* reusable, max_lanes * slice_bytes */
	size_t scratch_len;
	void **big;           /* grow-only temp buffer shared by the comm's groups (coll_big) */
	size_t *big_len;
	void **tmp;           /* and the second one (coll_tmp) */
	size_t *tmp_len;
	coll_reg_call *reg_call; /* shared by the comm's groups; NULL when nothing registers */
	/*
	 * The device side (mem.h), shared by the comm's groups: mem->be is set for the length
	 * of a call on device memory, and then every buffer a schedule touches is device memory
	 * (the user's and coll_scratch, coll_big and coll_tmp, which follow the call's kind).
	 * NULL: this comm only ever sees host memory (tests of the schedules alone).
	 */
	kmem_state *mem;
} coll_comm;

/* Whether the call running now is on device memory. */
static inline bool coll_on_device(const coll_comm *cc)
{
	return cc->mem != NULL && cc->mem->be != NULL;
}

/*
 * The memory operations of the schedules (mem.h): memmove and the CPU kernels on host
 * calls, the backend's stream-ordered operations on device calls. A device operation is
 * only enqueued when these return; the stream order and coll_post's staging make sure
 * that what a later send reads, or a later receive overwrites, is in place first, so
 * schedules never wait for them. The host versions never fail.
 */
khor_status coll_copy(coll_comm *cc, void *dst, const void *src, size_t bytes, kerr *err);
/* dst = a (op) b, count elements (reduce.h's semantics; avg sums). */
khor_status coll_reduce(coll_comm *cc, void *dst, const void *a, const void *b, size_t count,
                        khor_dtype dtype, khor_op op, kerr *err);
/* avg's last step: divide count elements by n in place. */
khor_status coll_avg_finish(coll_comm *cc, void *buf, size_t count, khor_dtype dtype, int n,
                            kerr *err);
/* The comm's scratch (scratch_len bytes) of the call's kind. */
void *coll_scratch(coll_comm *cc);

/* One in-flight transfer a collective is waiting for, kept for progress and timeouts. */
typedef struct coll_xfer {
	tp_req *req;
	int peer;     /* world rank, for messages */
	int tpi;      /* which of cc->tps the request belongs to */
	bool is_send;
	regcache_entry *reg; /* the registration req uses (put when it is done), or NULL */
	/*
	 * Device memory (coll.c: staging): the step the transfer is at when it is not simply
	 * on the wire, the pinned slot it goes through, the event it waits for, and what a
	 * deferred post needs.
	 */
	uint8_t stage;
	int slot;
	void *ev;
	void *buf;
	size_t len;
	tp_link *link;
	tp_tag tag;
} coll_xfer;

/* Whether x is still in progress (posted and not yet done, or between staging steps). */
static inline bool coll_pending(const coll_xfer *x)
{
	return x->req != NULL || x->stage != 0;
}

/*
 * A temp buffer of at least len bytes that lives as long as the comm: large temp buffers
 * allocated per call cost a page fault per 4 KiB, which at 64 MiB is milliseconds. Its
 * registrations are kept (REGCACHE_KEEP) and invalidated when it grows.
 */
void *coll_big(coll_comm *cc, size_t len);
/*
 * A second grow-only buffer like coll_big, for a schedule that needs a temp while another
 * it calls uses coll_big (tree gather and scatter, rd reduce-scatter). Of the call's kind.
 */
void *coll_tmp(coll_comm *cc, size_t len);

/*
 * Drives every transport once; *moved tells whether anything happened. A wait sleeps in
 * the transport that carries what we wait for (sleep_mask: bit i = cc->tps[i]); when that
 * is several, it sleeps in short slices in turn.
 */
khor_status coll_progress(coll_comm *cc, int timeout_ms, unsigned sleep_mask, bool *moved,
                          kerr *err);

/*
 * Posts a send/receive and records it in x (req NULL means "nothing pending"). On a
 * transport that registers memory (coll_tp.cache), a message above caps.reg_min goes with
 * an mr from the cache, held in x until coll_done or coll_drain.
 */
khor_status coll_post(coll_comm *cc, coll_xfer *x, int peer, bool is_send, void *buf,
                      size_t len, tp_tag tag, kdeadline dl, kerr *err);
/* Tests x; true when it has completed (x->req becomes NULL). Errors come back in *st. */
bool coll_done(coll_comm *cc, coll_xfer *x, khor_status *st, kerr *err);

/* The waiting state of one collective: its deadline and when it last checked for aborts. */
typedef struct coll_wait {
	kdeadline dl;
	uint64_t started_ns;
	uint64_t last_abort_check_ns;
	unsigned moves;   /* steps that returned on progress: every 16th looks at the deadline */
	const char *what; /* "allreduce seq 12" for messages, made on first use */
	const char *fmt;  /* printf format of what: takes seq (%u) then root (%d) */
	uint32_t seq;
	int root;
	char buf[80];
} coll_wait;

void coll_wait_init(coll_comm *cc, coll_wait *w, const char *what);
/*
 * Starts the wait of one collective. The sentence naming it ("broadcast seq 7 (root 2)") is
 * only formatted when an error needs it: on the latency path a snprintf per call is a
 * measurable share of a shared-memory allreduce.
 */
void coll_wait_begin(coll_comm *cc, coll_wait *w, const char *fmt, uint32_t seq, int root);
const char *coll_wait_what(coll_wait *w);
/*
 * A collective failed: prefix err with what it was ("allreduce seq 7") and detail (a
 * printf format, e.g. " (ring, step 3 of 6)"), unless an inner wait already did.
 */
void coll_wait_fail(coll_wait *w, kerr *err, const char *detail, ...)
	__attribute__((format(printf, 3, 4)));
/*
 * Nothing could advance: drive the transport once (blocking briefly), then, past the
 * deadline, ask whether the peers of the transfers still on the wire are alive (the wait
 * goes on while they are; coll_wait_alive), else fail naming them; and poll for a job
 * abort once a second.
 */
khor_status coll_wait_step(coll_comm *cc, coll_wait *w, const coll_xfer *xs, int nxs, kerr *err);
/*
 * A wait on xs passed *dl, started_ns being when it began: with cc->check_alive and
 * transfers on the wire, KHOR_SUCCESS and a later *dl while their peers are alive, or the
 * error naming one that is not. KHOR_ERR_TIMEOUT with err untouched when the deadline
 * stands (no liveness, or only the device is waited for): the caller says why.
 */
khor_status coll_wait_alive(coll_comm *cc, const char *what, const coll_xfer *xs, int nxs,
                            uint64_t started_ns, kdeadline *dl, kerr *err);
/* The same, without the warning (coll_alive_ask.quiet). */
khor_status coll_wait_alive_quiet(coll_comm *cc, const char *what, const coll_xfer *xs,
                                  int nxs, uint64_t started_ns, kdeadline *dl, kerr *err);
/*
 * One blocking exchange inside a collective: sends slen bytes to send_peer and receives
 * rlen bytes from recv_peer (either may be -1 for none; they may be the same rank), with
 * the receive posted first, through coll_wait_step's deadline and abort checks.
 */
khor_status coll_sendrecv(coll_comm *cc, coll_wait *w, int send_peer, const void *sbuf,
                          size_t slen, int recv_peer, void *rbuf, size_t rlen, tp_tag tag,
                          kerr *err);

/* Elements [*off, *off + *len) that pipeline lane `index` (slices of slice_el) covers in
 * block b of a count split over n ranks (coll_block); empty when the block is shorter. */
void coll_lane_range(size_t count, int n, int b, size_t index, size_t slice_el, size_t *off,
                     size_t *len);

/* Finishes every pending transfer in xs after an error (so no request dangles). */
void coll_drain(coll_comm *cc, coll_xfer *xs, int nxs);

/*
 * The lanes of a pipelined schedule (ring.c, allgather.c, reducescatter.c, and alltoall.c's
 * window of steps): each lane is a struct of the schedule's own whose member x is the pair
 * of its step in flight, [0] the receive and [1] the send. A pass over the lanes tests and
 * advances them; when no lane moved, COLL_LANES_WAIT waits on every pair until one can
 * (coll_wait_step: its deadline and abort checks); after an error COLL_LANES_DRAIN
 * finishes all of them. At most COLL_MAX_LANES lanes.
 */
#define COLL_MAX_LANES 64
khor_status coll_lanes_wait(coll_comm *cc, coll_wait *w, const coll_xfer *first, size_t stride,
                            int nlanes, kerr *err);
void coll_lanes_drain(coll_comm *cc, coll_xfer *first, size_t stride, int nlanes);
#define COLL_LANES_WAIT(cc, w, lanes, nlanes, err) \
	coll_lanes_wait((cc), (w), (lanes)[0].x, sizeof((lanes)[0]), (nlanes), (err))
#define COLL_LANES_DRAIN(cc, lanes, nlanes) \
	coll_lanes_drain((cc), (lanes)[0].x, sizeof((lanes)[0]), (nlanes))

#endif
