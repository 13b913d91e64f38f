/*
 * step_modes.h -- the timed modes of a step: engine, flat and per-tensor, and the latency rows.
 */
#ifndef KHOR_BENCH_STEP_MODES_H
#define KHOR_BENCH_STEP_MODES_H

#include "step.h"

#include <stdint.h>

/*
 * The engine step of set s: an engine with these settings (-1: its own), warm-up steps,
 * pre untimed steps more (the autotuner's), then the timed ones. *fusion_out and *cycle_out
 * get what khor_engine_tuning says after the timed steps.
 */
int step_engine_mode(struct step_ctx *x, struct step_set *s, int gap_us, int64_t fusion,
                     double cycle_ms, int autotune, int pre, struct step_row *r,
                     int64_t *fusion_out, double *cycle_out);

/* flat (per_tensor 0): one allreduce of the whole buffer; else one per tensor, last first. */
int step_direct_mode(struct step_ctx *x, struct step_set *s, int per_tensor, struct step_row *r);

#define STEP_LAT_ROUNDS 5

/*
 * (c) and (d): every kind of step_lat_call, lat_reps timed calls each after STEP_LAT_WARMUP
 * (which also warm the engine's response cache for the tiny set), the engine with the run's
 * settings; each kind's median over its calls of the slowest rank's time.
 */
int step_latency(struct step_ctx *x, struct step_lat *l);

#endif
