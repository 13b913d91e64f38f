/*
 * step_data.h -- the gradient sets of a step, their data and the model's error reports.
 */
#ifndef KHOR_BENCH_STEP_DATA_H
#define KHOR_BENCH_STEP_DATA_H

#include "step.h"

#include <stdint.h>

void step_set_free(struct step_set *s);

/* kind: 0 resnet50, 1 small, 2 tiny (the negotiation set). -1 when out of memory. */
int step_set_make(struct step_set *s, int kind);

/* The pattern depends on the element index modulo the period only: tables of one period. */
int step_tables(struct step_ctx *x);

void step_fill(const struct step_ctx *x, float *buf, size_t count);

int64_t step_check(const struct step_ctx *x, const float *buf, size_t count);

/*
 * Before step it of a mode (warm-up included): a fresh pattern when checking, else for sum at
 * the mode's start and every STEP_REFILL steps (an in-place avg keeps its values).
 */
void step_refill(const struct step_ctx *x, float *buf, size_t count, int it);

int step_fail(const struct step_ctx *x, const char *what, const char *why);

int step_fail_comm(const struct step_ctx *x, const char *what, khor_comm *comm, khor_status st);

int step_fail_engine(const struct step_ctx *x, const char *what, const khor_engine *e,
                     khor_status st);

int step_barrier(const struct step_ctx *x);

#endif
