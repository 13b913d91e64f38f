/*
 * step_args.h -- the flags of khor-bench step.
 */
#ifndef KHOR_BENCH_STEP_ARGS_H
#define KHOR_BENCH_STEP_ARGS_H

#include "step.h"

#include <stdio.h>

void step_usage(FILE *f);

/* argv[1] is "step". 0 to run, 1 after --help, 2 after a usage error. */
int step_parse_args(int argc, char **argv, struct step_args *a);

#endif
