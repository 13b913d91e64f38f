/*
 * comm.h -- the communicator: ranks, topology, links, the sticky error and the collective
 * execution order. The exported khor_* functions in bindings/capi.c are thin wrappers over
 * these.
 */
#ifndef KHOR_RUNTIME_COMM_H
#define KHOR_RUNTIME_COMM_H

#include "collectives/coll.h"
#include "collectives/select.h"
#include "config.h"
#include "rendezvous/store.h"
#include "base/list.h"

#include <pthread.h>

/*
 * How long the registrations of a call's buffers last, on transports that register memory
 * (ib). A user may free a buffer and get the same address back on other pages, where a
 * kept registration would move the old pages' bytes; so by default they end with the call.
 */
enum comm_reg_policy {
	REG_POLICY_USER = 0, /* KHOR_REG_CACHE_USER decides: kept across calls when 1 */
	REG_POLICY_CALL,     /* ended with the call whatever the setting (the engine's tensors) */
	REG_POLICY_KEEP,     /* kept: the runtime owns the buffer and invalidates it when it
	                      * frees it (the engine's fusion buffer) */
};

/* One collective call, as queued for the comm's collective thread or run inline. */
struct khor_request {
	struct khor_request *next;
	khor_comm *comm;
	unsigned kind;       /* enum coll_kind */
	const void *sendbuf;
	void *recvbuf;
	size_t count;
	khor_dtype dtype;
	khor_op op;
	int root;
	/* v forms: per-rank counts and displacements in elements (owned when heap) */
	size_t *scounts, *sdispls, *rcounts, *rdispls;
	uint32_t seq;
	int8_t algo, hier;   /* the comm's KHOR_ALGO and KHOR_HIER when the call was made */
	int color, key;      /* COLL_SPLIT: this rank's arguments */
	khor_comm *newcomm;  /* COLL_SPLIT: the result */
	uint8_t reg_policy;  /* enum comm_reg_policy: how long its buffers stay registered */
	void *stream;        /* the stream variants' stream (device memory), when has_stream */
	bool has_stream;
	bool done;
	bool heap;           /* made by an i* call; freed by khor_request_free */
	khor_status status;
	kerr err;            /* the request's own error text, once it failed */
};

/*
 * The context: one per khor_init. It owns what every comm of the job shares: the settings,
 * the store connection, the transports and their links (one per peer, made on first use
 * by any comm), the host of every world rank and the measured cost model. Fixed after
 * init except the links (under link_mu) and the list of comms (under comms_mu).
 */
typedef struct kctx {
	settings cfg;
	int rank, size;       /* in the world */
	store_server *server; /* when this rank serves the store */
	store *store;         /* thread-safe (store.h) */
	char store_addr[300];
	int generation; /* this init's store generation: the rank's count of inits in the job */
	coll_tp tps[COLL_MAX_TP]; /* every transport this rank created (transport_list order) */
	int ntps;
	char tp_names[32];    /* their names joined by '+' ("ib+tcp+shm"), for the timeline */
	int ncaches;          /* of tps with a registration cache (tps[i].cache) */
	_Atomic uint64_t reg_scopes; /* the last regcache scope given to a call (comm_reg_begin) */
	pthread_mutex_t link_mu;
	tp_link **links;      /* per world peer, once made */
	int8_t *link_tp;      /* per world peer: index in tps, -1 = not chosen yet */
	_Atomic(tp_link *) *ready; /* per world peer: the link once ready (read without link_mu) */
	int *host_of;         /* per world rank: its host's number (hosts by lowest rank) */
	int nhosts;
	int on_machine;       /* ranks sharing this machine (same boot id) */
	bool crowded_any;     /* some host has more ranks than cores (agreed at init) */
	_Atomic int spinning; /* a thread spins in a collective's wait (coll.h) */
	cost_model inner, outer; /* intra-host and inter-host links */
	pthread_mutex_t comms_mu;
	klist comms;          /* every comm made by split or create_group and not freed */
	khor_comm *world;
	uint32_t local_ids;   /* comm ids of a one-rank job, which has no store */
	struct cg_count *cg;  /* create_group calls per (parent, list) so far (split.c) */
	int ncg, cg_cap;
	struct alive *alive;  /* the heartbeat thread (alive.h), once started */
	_Atomic bool aborted; /* the generation's abort key was seen; then abort_text is set */
	_Atomic bool abort_mine; /* this rank wrote the abort key: its failure is the job's */
	char abort_text[KERR_TEXT_MAX];
	_Atomic int hosts_updated; /* elastic: the driver's host change (bits: 1 added, 2 removed) */
	char tp_job[80];      /* the transports' job id: "g<generation>/<job>" when elastic */
	_Atomic(struct liveness *) live; /* the peers' heartbeats as waits here read them */
} kctx;

/*
 * A comm: a group of ranks of the context with its own id, sequence numbers, scratch,
 * tuning, collective thread and sticky error. The world is one too (id 0, map NULL).
 * Ids come from the store's "comm_ids" counter, COMM_IDS at a time: the comm's own, its
 * node group's, its cross group's and its trials' (comm_exec.c).
 */
#define COMM_IDS 4

struct khor_comm {
	kctx *ctx;
	int rank, size;
	int *world_ranks;     /* comm rank -> world rank; NULL for the world */
	uint32_t id;
	char name[96];        /* "comm 8 (world ranks 0, 2, 4, 6)", for error texts */
	klist in_ctx;         /* in ctx->comms */
	int local_rank, local_size, cross_rank, cross_size;
	coll_comm cc;
	/* node-aware collectives: the ranks on this host, and those with my local index */
	int nhosts;           /* hosts this comm spans */
	bool hier_ok;         /* every host has the same number (> 1) of ranks, > 1 host */
	bool hier_blocked;    /* ... and ranks are numbered host by host */
	int run_hier;         /* KHOR_HIER of the collective running now */
	int *node_map, node_n, node_me;   /* node_map, cross_map: world ranks */
	int *cross_map, cross_n, cross_me;
	int *host_ranks;      /* [host * node_n + k]: k-th comm rank of each host (when hier_ok) */
	coll_comm node_cc, cross_cc;
	trial_slot trials[64]; /* auto's trials per power-of-two allreduce size (comm_exec.c) */
	uint32_t trial_seq;    /* sequence numbers of trial calls, under the trial comm id */
	void *big;            /* coll_big's buffer, shared by cc, node_cc and cross_cc */
	size_t big_len;
	void *tmp;            /* coll_tmp's, likewise */
	size_t tmp_len;
	kmem_state mem;       /* the device side of calls on device memory (cc.mem) */
	void *nccl;           /* runtime/nccl.c's node communicator, made on first use */
	/*
	 * Frees c->nccl; set by nccl.c with it. A hook, so that comm.c (below nccl.c) never
	 * calls up into the layer that uses it.
	 */
	void (*nccl_free)(khor_comm *c);
	coll_reg_call reg_call; /* the running call's buffers (coll.h), for cc.reg_call */

	/* Execution order: seq numbers are given at call time; one collective runs at a time. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct khor_request *q_head, *q_tail;
	bool busy;
	bool worker_started, worker_stop;
	pthread_t worker;
	uint32_t next_seq;
	/* khor_comm_set's KHOR_ALGO and KHOR_HIER, copied into each request at its call, so a
	 * change never reaches a collective that was already queued. Under mu. */
	int tune_algo, tune_hier;
	/* HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER (settings): -1 = tune_hier; a
	 * khor_comm_set of KHOR_HIER clears them, as a given KHOR_HIER does at init. Under mu. */
	int tune_hier_allreduce, tune_hier_allgather;

	const char *last_sched; /* the schedule of the last allreduce ("ring"), for the timeline */
	int refs;            /* the handle + i* requests not freed yet (under mu) */
	kerr err;            /* sticky: the first failure of a collective (under mu) */
	kerr last;           /* the last failed call, e.g. a bad argument (under mu) */
};

/*
 * Joins the job: a fixed one, or an elastic job's newest generation (docs/ELASTIC.md), in
 * which case a failed attempt (the generation ended before every rank came) is retried in
 * the next one until KHOR_ELASTIC_TIMEOUT.
 */
khor_status comm_init(const struct khor_config *cfg, khor_comm **comm_out, kerr *err);
/* The generation the context joined; whether its driver announced a host change; whether
 * the job is elastic. */
int comm_generation(const khor_comm *c);
int comm_hosts_updated(const khor_comm *c);
khor_status comm_elastic_state(khor_comm *c, bool hold, int64_t *held_out, kerr *err);
bool comm_is_elastic(const khor_comm *c);
void comm_finalize(khor_comm *c);

/* Runs req in order (inline when nothing is queued); blocks until done. */
khor_status comm_run(khor_comm *c, struct khor_request *req);
/* Queues req for the collective thread; returns at once. */
khor_status comm_submit(khor_comm *c, struct khor_request *req);
khor_status comm_wait(khor_comm *c, struct khor_request *req);
/* khor_comm_set: KHOR_ALGO or KHOR_HIER for the calls made after it. */
khor_status comm_set(khor_comm *c, const char *key, const char *value, kerr *err);
/* Records a failure as the comm's sticky error and tells the other ranks through the store. */
void comm_fail(khor_comm *c, const kerr *e);
/* The root's index in its cross group (its host's number) and in its node group (hier). */
void comm_root_position(const khor_comm *c, int root, int *host_out, int *local_out);
/*
 * The same, telling the other ranks (or not) whatever the status: comm_fail keeps a bad
 * argument to itself, since only this rank made it; a bad argument found once the other
 * ranks are already in the call (buffers of mixed memory kinds) is their business too.
 */
void comm_fail_tell(khor_comm *c, const kerr *e, bool tell);
/*
 * Elastic: e (a failed collective) as a membership error, with the driver's verdict on the
 * loss when it comes within a second (docs/ELASTIC.md); returns KHOR_ERR_MEMBERSHIP.
 */
khor_status comm_elastic_verdict(kctx *x, kerr *e);
/*
 * A fixed job's failure seen here (e already names this rank): the other ranks are told
 * (the store's abort key) when this rank is the first to fail; when another was first, e
 * becomes that rank's cause with this rank's view after it, so that every rank reports the
 * same one. Nothing for an elastic job (the driver decides), a remote abort, a rank that
 * already wrote the key, or a job without a store.
 */
void comm_job_failure(kctx *x, kerr *e);
/* e as this comm's error text: "rank R on HOST, comm 8 (world ranks ...): cause". */
void comm_name_error(const khor_comm *c, const kerr *e, kerr *out);
/* Records a bad call (not sticky) in c->last, under the comm's lock. */
void comm_set_last(khor_comm *c, const kerr *e);

/*
 * A new comm over ctx's links: members[i] is the world rank of its rank i (copied; NULL
 * with n == ctx->size for the world), me this rank's index, id its first of COMM_IDS ids.
 * Sets up its groups, scratch and tuning (a copy of parent's, when given).
 */
khor_status comm_create(kctx *ctx, const khor_comm *parent, const int *members, int n, int me,
                        uint32_t id, khor_comm **comm_out, kerr *err);
/* Drops a reference (a freed request, or the handle when the comm is freed). */
void comm_release(khor_comm *c);
/* The world rank of comm rank r. */
int comm_world_rank(const khor_comm *c, int r);
/* Frees a comm (not the world): waits for its queued calls, stops its thread. */
void comm_destroy(khor_comm *c);
/* split.c: khor_comm_split's and khor_comm_create_group's work; run on parent's order. */
khor_status comm_split_run(khor_comm *parent, struct khor_request *r, kerr *err);
khor_status comm_create_group(khor_comm *parent, const int *ranks, int nranks,
                              khor_comm **newcomm_out, kerr *err);
/* khor_comm_free's work: takes c out of its context's list and destroys it. */
void comm_free(khor_comm *c);

/* The index in ctx->tps of the transport called name; -1 when this rank has none. */
int comm_tp_index(const kctx *x, const char *name);
/*
 * Registration of a call's buffers (coll.h: coll_reg_call): begin before the call's schedule
 * runs, end after it returned, on the thread that runs it. End drops the call's own
 * registrations. Nothing is done when no transport of the context registers memory.
 */
void comm_reg_begin(khor_comm *c, const struct khor_request *r);
void comm_reg_end(khor_comm *c);
/* The memory [buf, buf + len) is about to be freed: drops its registrations everywhere. */
void comm_reg_invalidate(kctx *x, const void *buf, size_t len);

#endif
