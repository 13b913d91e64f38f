/* negotiate.h -- one turn of a process set's negotiation (negotiate.c). */
#ifndef KHOR_ENGINE_NEGOTIATE_H
#define KHOR_ENGINE_NEGOTIATE_H

#include "ctl.h"
#include "types.h"

enum { NEG_RAN, NEG_IDLE, NEG_END };

/*
 * One turn of the set's cycle, on the coordinator (set rank 0) or on a worker, by the holder
 * of the set's baton: waits for news, exchanges the reports and the response, and hands the
 * response's items back in out for the holder to run (NEG_RAN). With y, a turn that has
 * nothing to do once its spin is over returns NEG_IDLE instead of going to sleep: the
 * cycle's first receives stay posted for the next turn, whoever holds the baton then, and y
 * says how long and where to sleep (ctl_sleep). Waits that are part of a cycle under way
 * never yield, and neither does a wait bounded by the set's stop. NEG_END: the set failed
 * (its handles have failed; out is empty).
 */
int negotiate_turn(eset *s, ctl_yield *y, eresp *out);
/* The idle wait's receives and memory, once the set's loop has ended. */
void negotiate_release(eset *s);

#endif
