/* fusion.h -- fusion buffers and the fusion plan (fusion.c). */
#ifndef KHOR_ENGINE_FUSION_H
#define KHOR_ENGINE_FUSION_H

#include "types.h"

/* One allreduce tensor of an item (a piece of the fusion plan). */
typedef struct piece {
	eitem *it;
	int ti;
	const kmem_where *dev; /* its device memory, NULL for host memory */
} piece;

/* The runs of a plan: run r is pieces[start[r], start[r + 1]), in execution order. */
typedef struct fusion_plan {
	piece *pieces;
	int *start;
	int nruns;
} fusion_plan;

/*
 * Plans the allreduces of items[0, n) (errors left out) for threshold; a joined rank's
 * ghosts go to ghost_dev (NULL: host memory). False when out of memory.
 */
bool fusion_plan_make(eitem *items, int n, uint64_t threshold, const kmem_where *ghost_dev,
                      fusion_plan *out);
void fusion_plan_free(fusion_plan *p);
/*
 * The fusion buffer of a run's memory (d NULL: host), grown to at least len bytes; NULL
 * when it cannot be had (for device memory, with the backend's reason in err).
 */
void *fusion_buffer(eset *s, edev *d, size_t len, kerr *err);
/* Frees the host fusion buffer (before the set's data comm goes: its registration too). The
 * device one goes with the set's device side (execute.c). */
void fusion_release(eset *s);

#endif
