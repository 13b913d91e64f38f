/* stall.h -- the stall inspector (stall.c). */
#ifndef KHOR_ENGINE_STALL_H
#define KHOR_ENGINE_STALL_H

#include "bbuf.h"
#include "types.h"

/* When a check is due, warns of every stalled request and writes an error record into out
 * for each stalled past the shutdown time, which leaves the table. */
void stall_inspect(eset *s, uint64_t now, bbuf *out);

#endif
