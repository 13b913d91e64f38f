/*
 * step_run.h -- a whole khor-bench step run: every set, the sweep and the summary.
 */
#ifndef KHOR_BENCH_STEP_RUN_H
#define KHOR_BENCH_STEP_RUN_H

#include "step.h"

/*
 * khor-bench step on the joined world comm. Returns the exit status: 0 all right, 1 a failed
 * call or a wrong result, 2 an output file that cannot be opened.
 */
int step_run(khor_comm *world, const struct step_args *a, const char *library,
             const char *transport, const char *algo);

#endif
