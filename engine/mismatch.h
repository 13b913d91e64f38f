/* mismatch.h -- whether the ranks agree on a request (mismatch.c). */
#ifndef KHOR_ENGINE_MISMATCH_H
#define KHOR_ENGINE_MISMATCH_H

#include "bbuf.h"
#include "types.h"

/* Compares every reporting rank's descriptor of c; on a difference writes the sentence into
 * msg and returns true. Dim 0 of allgather and alltoall may differ. */
bool mismatch_find(eset *s, centry *c, bbuf *msg);

#endif
