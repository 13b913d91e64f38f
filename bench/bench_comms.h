/*
 * bench_comms.h -- several comms at once (bench_run_comms): each size on K comms, a thread each.
 */
#ifndef KHOR_BENCH_BENCH_COMMS_H
#define KHOR_BENCH_BENCH_COMMS_H

#include "bench.h"
#include "bench_bufs.h"
#include "bench_sweep.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define BENCH_MAX_COMMS 64 /* comms of one K, each with a thread and its own buffers */

#define BENCH_MAX_KS 8 /* K values in one --comms list */

/* One comm's share of a phase: what it runs, with what, and what came of it. */
struct bench_thread {
	atomic_ulong beats; /* calls finished: the main thread's sign of life */
	struct bench_phase *phase;
	int comm; /* its index among the phase's comms */
	struct bench_backend *b;
	struct bench_args a;
	const struct bench_shape *s;
	const struct bench_bufs *bufs;
	size_t bytes;
	double sec;    /* the comm's slowest rank's seconds per call */
	int64_t wrong; /* wrong elements, summed over the comm's ranks */
	int status;    /* 0, or -1 after a failure it reported */
	int done;
	pthread_t tid;
};

/* The gate: waits for every other thread of the phase that has not failed. No-op alone. */
void bench_thread_sync(struct bench_thread *t);

void bench_thread_beat(struct bench_thread *t);

/*
 * --comms: bench_run's sweep, each size run for every K of ks in turn on K comms at once, a
 * thread each: K = 1 is b itself, K > 1 the first K of max(ks) comms that b->dup makes before
 * the sweep, each with buffers of its own. Every comm's calls are timed and checked as
 * bench_run does it; a row (table, CSV, JSON) has each comm's time and busbw and their sum.
 * Also times the making of a comm (BENCH_SPLIT_REPS dup + free). Exit status as bench_run's.
 */
int bench_run_comms(struct bench_backend *b, const struct bench_args *a, const int *ks, int nks);

#endif
