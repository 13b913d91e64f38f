/*
 * step_bp.h -- the backprop thread: hands a set's gradients to the engine, a compute gap apart.
 */
#ifndef KHOR_BENCH_STEP_BP_H
#define KHOR_BENCH_STEP_BP_H

#include "step.h"

/* handles: room for the largest set's tensors. */
int step_bp_start(struct step_ctx *x, int max_tensors);

void step_bp_stop(struct step_ctx *x);

/* Has the backprop thread hand the set over and waits until it has enqueued the last one. */
void step_bp_run(struct step_ctx *x, khor_engine *e, const struct step_set *s, int gap_us);

#endif
