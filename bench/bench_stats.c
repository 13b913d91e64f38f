/*
 * bench_stats.c -- the clock and the medians of the benchmark's timings.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_stats.h"

#include <stdlib.h>
#include <time.h>

double bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* qsort, not the insertion sort it was: khor-bench step's 20000 latency samples took 42% of
 * a rank's time in it. */
double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
