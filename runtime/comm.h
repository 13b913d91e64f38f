/*
 * comm.h -- the communicator: ranks, topology, links, the sticky error and the collective
 * execution order. The exported khor_* functions in bindings/capi.c are thin wrappers over
 * these.
 */
#ifndef KHOR_RUNTIME_COMM_H
#define KHOR_RUNTIME_COMM_H

#include "../collectives/coll.h"
#include "../collectives/select.h"
#include "config.h"
#include "store.h"

#include <pthread.h>

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
	bool done;
	bool heap;           /* made by an i* call; freed by khor_request_free */
	khor_status status;
};

struct khor_comm {
	settings cfg;
	int rank, size;
	int local_rank, local_size, cross_rank, cross_size;
	store_server *server; /* when this rank serves the store */
	store *store;
	char store_addr[300];
	int generation; /* this init's store generation: the rank's count of inits in the job */
	int tcp_i, shm_i;    /* index of each transport in cc.tps, -1 when not used */
	tp_link **links;     /* per peer, once made */
	int8_t *link_tp;     /* per peer: index in cc.tps, -1 = not chosen yet */
	coll_comm cc;
	/* node-aware collectives: the ranks on this host, and those with my local index */
	int nhosts;
	int on_machine;       /* ranks sharing this machine (same boot id) */
	bool hier_ok;         /* every host has the same number (> 1) of ranks, > 1 host */
	bool hier_blocked;    /* ... and ranks are numbered host by host */
	int run_hier;         /* KHOR_HIER of the collective running now */
	int *node_map, node_n, node_me;
	int *cross_map, cross_n, cross_me;
	int *host_ranks;      /* [host * node_n + k]: k-th rank of each host (when hier_ok) */
	coll_comm node_cc, cross_cc;
	trial_slot trials[64]; /* auto's trials per power-of-two allreduce size (exec.c) */
	bool crowded_any;      /* some host has more ranks than cores (agreed at init) */
	cost_model inner, outer; /* intra-host and inter-host links */
	void *big;            /* coll_big's buffer, shared by cc, node_cc and cross_cc */
	size_t big_len;

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

	kerr err;            /* sticky: the first failure of a collective */
	kerr last;           /* the last failed call, e.g. a bad argument */
};

khor_status comm_init(const struct khor_config *cfg, khor_comm **comm_out, kerr *err);
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

#endif
