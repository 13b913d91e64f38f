/*
 * bench_stats.h -- the clock and the medians of the benchmark's timings.
 */
#ifndef KHOR_BENCH_BENCH_STATS_H
#define KHOR_BENCH_BENCH_STATS_H

#include "bench.h"

double bench_now(void);

/* Median of n values (n >= 1); sorts them in place. */
double bench_median(double *v, int n);

#endif
