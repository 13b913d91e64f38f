/*
 * engine.h -- the named-tensor engine (Horovod's model) behind khor_engine_* and
 * khor_enqueue_*: what bindings/capi_engine.c calls (engine.c). types.h holds the objects.
 *
 *   application threads          set thread (one per process set)
 *   -------------------          ---------------------------------
 *   khor_enqueue_* -> handle --> fresh list --> cycle k: report what is new to the
 *                      ^                        coordinator (set rank 0), get back the
 *                      |                        responses, run them (fused), complete
 *                      +--- completion <------- handles; sleep until work or a message
 *
 * One concept per file, and calls go one way, down this list (a file calls only files
 * below it; nothing calls back up):
 *
 *   engine.c      lifecycle, process sets and their threads (the cycle loop), enqueue,
 *                 handles: negotiation returns a cycle's response list, the loop runs it
 *   negotiate.c   one cycle's message exchange, coordinator's side and worker's
 *   coordinator.c the coordinator's answer: what is ready everywhere, what fails
 *   stall.c       the stall inspector;  mismatch.c  the ranks-disagree sentences
 *   report.c      this rank's report;  table.c  the coordinator's table of every report
 *   response.c    the response's records, read into the list of items
 *   ctl.c         the cycle's messages on the set's control comm
 *   execute.c     runs a response list on the set's data comm (host or device memory)
 *   fusion.c      fusion buffers and the grouping of allreduces into fused runs
 *   queue.c       the tensor queue: a set's named requests, enqueue to completion
 *   desc.c        a request's descriptor;  response_cache.c  the response cache
 *   timeline.c    the Chrome trace;  autotune.c  fusion and cycle time by throughput
 *   settings.c    the settings, from runtime/config.c's table
 *   map.c, bbuf.c the name map and byte buffers, under types.h, below everything
 */
#ifndef KHOR_ENGINE_ENGINE_H
#define KHOR_ENGINE_ENGINE_H

#include "types.h"

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
/* khor_handle_test: the status once complete (the owner has seen it: its names are free). */
khor_status engine_test(khor_handle *h);
/* Timeline to path from now (NULL: stop it). */
khor_status engine_timeline(struct khor_engine *e, const char *path, bool mark, kerr *err);
void engine_handle_free(khor_handle *h);
khor_status engine_set_callback(khor_handle *h, khor_done_fn fn, void *arg);

#endif
