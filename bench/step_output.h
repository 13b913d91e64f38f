/*
 * step_output.h -- the step's table and JSON.
 */
#ifndef KHOR_BENCH_STEP_OUTPUT_H
#define KHOR_BENCH_STEP_OUTPUT_H

#include "step.h"

#include <stdio.h>

void step_print_header(const struct step_ctx *x);

void step_print_set(const struct step_ctx *x, const struct step_result *res, int gap_us);

void step_print_sweep(const struct step_result *res, int autotune_steps);

void step_print_summary(const struct step_ctx *x, const struct step_result *res, int nres,
                        const struct step_lat *l);

void step_json(FILE *j, const struct step_ctx *x, const struct step_result *res, int nres,
               const struct step_lat *l, const int *gaps, int ok);

#endif
