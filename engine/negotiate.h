/* negotiate.h -- one cycle of a process set's negotiation (negotiate.c). */
#ifndef KHOR_ENGINE_NEGOTIATE_H
#define KHOR_ENGINE_NEGOTIATE_H

#include "types.h"

/*
 * One cycle on the coordinator (set rank 0) or on a worker: waits for news, exchanges the
 * reports and the response, and hands the response's items back in out for the set's loop
 * to run. False when the set failed (the handles have failed; out is empty).
 */
bool negotiate_coord_cycle(eset *s, eresp *out);
bool negotiate_worker_cycle(eset *s, eresp *out);

#endif
