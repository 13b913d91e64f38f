/*
 * elastic.h -- a worker's side of an elastic job (docs/ELASTIC.md): reading the driver's
 * plan of a generation and finding this worker's place in it.
 *
 * The plan's text is parsed by a pure function so that the tests and the fuzzer can feed
 * it anything; elastic_join does the store round trips.
 */
#ifndef KHOR_RUNTIME_ELASTIC_H
#define KHOR_RUNTIME_ELASTIC_H

#include "config.h"
#include "rendezvous/store.h"

#define ELASTIC_PLAN_MAGIC "khor-plan 1"

/* Where a worker stands in one generation's plan. */
struct el_place {
	int gen;
	enum { EL_IN, EL_DROPPED, EL_ABSENT } what;
	int rank, size, local_rank, local_size, cross_rank, cross_size;
	char host[256];
};

/*
 * Reads plan text (len bytes, not necessarily NUL-terminated) for worker id. KHOR_SUCCESS
 * with out->what saying whether it is in, dropped or absent; KHOR_ERR_PROTOCOL naming the
 * line when the text is not a plan.
 */
khor_status elastic_plan_find(const char *text, size_t len, const char *id,
                              struct el_place *out, kerr *err);

/*
 * The newest generation after `after` that has a place for this worker (s->worker_id):
 * first tells the driver that this worker left generation `after` (when > 0) and why,
 * then waits for plans until dl. KHOR_ERR_REMOVED when the worker was dropped or the job
 * is over. st's prefix is left on generation 0.
 */
khor_status elastic_join(store *st, const settings *s, int after, const char *why,
                         kdeadline dl, struct el_place *out, kerr *err);

#endif
