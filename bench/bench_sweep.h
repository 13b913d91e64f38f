/*
 * bench_sweep.h -- the timed sweep over sizes: bench_run, and the pieces the multi-comm run reuses.
 */
#ifndef KHOR_BENCH_BENCH_SWEEP_H
#define KHOR_BENCH_BENCH_SWEEP_H

#include "bench.h"
#include "bench_bufs.h"

#include <stdint.h>
#include <stdio.h>

/* Says which call failed and why, on the rank that saw it. */
int bench_fail(struct bench_backend *b, const char *what, size_t bytes);

/* The same for a call outside the sweep's sizes. */
int bench_fail_call(struct bench_backend *b, const char *what);

/*
 * Times iters calls after warmup calls, on buffers bufs[m] for each memory kind m. Writes the
 * slowest rank's average seconds per call to sec_out (one per column: bench_nvariants), as
 * nccl-tests does: a barrier lines the ranks up,
 * each times its own loop, and the maximum over ranks is what a synchronous training step
 * would see. In comparison mode the iterations run in rounds, each round a block of calls
 * of every algorithm in turn, so that a slow second on a shared machine hits them alike;
 * each round starts one algorithm later than the one before, and every other round runs
 * them in reverse order, so that no algorithm always runs right after the same other one
 * (a rotation alone keeps the cyclic order), and an algorithm's time is the median over the
 * rounds of the slowest rank's time per call in that round: one block that a preemption
 * stretched 2x moved the mean of five by 20%, and the median not at all. Host and device
 * buffers (--mem both) are two more columns of the same rounds, for the same reason.
 * Adds this rank's wrong elements to wrong[m], m the memory kind they were found in.
 */
int bench_time(struct bench_backend *b, const struct bench_args *a, const struct bench_shape *s,
               const struct bench_bufs *bufs, size_t bytes, double *sec_out, int64_t *wrong);

/* -c 1: one checked call per column after the timed loop; adds this rank's wrong elements
 * to wrong[m], m the memory kind. */
int bench_verify(struct bench_backend *b, const struct bench_args *a, const struct bench_shape *s,
                 const struct bench_bufs *bufs, size_t bytes, int64_t *wrong);

/* Opens --csv or --json on rank 0; says why not and counts the failure in *bad. */
FILE *bench_open_out(const struct bench_backend *b, const char *flag, const char *path,
                     int64_t *bad);

int bench_close_out(const struct bench_backend *b, const char *flag, const char *path, FILE *f);

void bench_json_head(FILE *j, const struct bench_backend *b, const struct bench_args *a);

/* What can be refused before the sweep: 0 to go on, else the exit status (2). */
int bench_can_run(const struct bench_backend *b, const struct bench_args *a);

/* The size after size, or 0 when the sweep ends there (it would pass -e or overflow). */
size_t bench_next_size(const struct bench_args *a, size_t size);

/*
 * Runs the whole sweep and prints it on rank 0. Returns the process exit status: 0 when every
 * call succeeded and every result was right, 1 otherwise, 2 for a bad flag that only the
 * joined job can detect (a root outside the job, an output file that cannot be opened).
 */
int bench_run(struct bench_backend *b, const struct bench_args *a);

#endif
