/*
 * step.h -- khor-bench step: one training step's gradients through the engine, timed
 * against the direct API on the same ranks and bytes; the types the step_*.c files share.
 *
 *   khorrun -np 4 khor-bench step --set resnet50 --steps 20
 *   khorrun -np 2 khor-bench step --set small --transport shm --sweep --json step.json
 *
 * A step is what Horovod's DistributedOptimizer does during backward: a second thread (the
 * "backprop" thread) hands the gradients over one by one, last layer first, with
 * khor_enqueue_allreduce (name grad/<layer>, in place), a compute gap apart, while the engine
 * negotiates, fuses and reduces the ones already handed over; then the main thread waits for
 * every handle, as optimizer.step() does. Per step:
 *
 *   compute  first hand-over -> last hand-over          (the backprop thread's span)
 *   step     first hand-over -> last handle complete
 *   exposed  last hand-over  -> last handle complete    (communication the gaps did not hide)
 *   GB/s     the set's bytes / step
 *
 *   first hand-over                    last hand-over
 *   |--gap--|--gap--|--gap-- ... --gap--|        backprop thread: grad/160, grad/159 ... grad/0
 *      [negotiate, reduce] [negotiate, reduce] ... [reduce the rest]   engine thread
 *   |<------------------------- step ------------------------------>|
 *                                       |<-------- exposed -------->|
 *
 * Baselines, in the same job, on the same bytes, with the engine stopped: "flat", one
 * khor_allreduce of the whole gradient buffer (the lower bound: one call, no negotiation),
 * and "per-tensor", one khor_allreduce per gradient through the direct API; both have
 * nothing to overlap with, so their exposed time is their step time. Then the latency of a
 * lone 8-byte tensor, direct and through the engine, and the negotiation cost: a step of
 * tiny tensors through the engine once its response cache is warm, against one direct 8 B
 * allreduce; these four interleave in rounds, with an engine started. Every engine row also
 * has the engine's own count of negotiation time and cycles per step (khor_engine_stats,
 * read before and after each step, outside the timed part); the tiny step less a direct
 * allreduce of its bytes is printed beside it as a cross-check.
 *
 * Comms: the engine runs on a comm split from the world (same ranks, same links); the world
 * carries the barrier before each step, the reductions of the timings and the baselines, so
 * that no direct call ever shares a comm with the engine's thread. A row's time is, per
 * step, the slowest rank's, and then the median over the timed steps.
 *
 * Data: every gradient buffer holds bench_data.c's sum/avg pattern over its global element
 * index (small integers in float32, so a sum is exact in any order); --check refills before
 * every step and verifies every element after it, engine and baselines alike. Without
 * --check an in-place sum is refilled every STEP_REFILL steps, untimed, so that repeated
 * sums never reach infinity.
 *
 * The model is cut by concern: its flags (step_args), the gradient sets and their data
 * (step_data), the backprop thread (step_bp), the timed modes (step_modes), the table and
 * JSON (step_output) and the run over sets and sweep points (step_run). khor-bench links them
 * as the static library khor_bench_step; they use khor's public API only.
 */
#ifndef KHOR_BENCH_STEP_H
#define KHOR_BENCH_STEP_H

#include "bench.h"
#include "khor.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define STEP_PROG "khor-bench"
#define STEP_SMALL_TENSORS 1000
#define STEP_SMALL_COUNT 1024 /* 4 KiB of float32 */
#define STEP_TINY_TENSORS 64
#define STEP_TINY_COUNT 2 /* 8 B of float32 */
#define STEP_REFILL 16
#define STEP_LAT_WARMUP 20
#define STEP_NSETS 2
#define STEP_MAX_POINTS 16

/* The points of --sweep (step_run.c): every fusion threshold with every cycle time. */
#define STEP_NFUSION 5
#define STEP_NCYCLE 3
extern const int64_t step_sweep_fusion[STEP_NFUSION];
extern const double step_sweep_cycle[STEP_NCYCLE];
_Static_assert(STEP_NFUSION *STEP_NCYCLE <= STEP_MAX_POINTS, "the sweep needs more points");

struct step_args {
	int sets; /* bit k: step_set_names[k] */
	int steps;
	int warmup;
	int gap_us; /* -1: each set's default */
	int spin;   /* busy-wait the gaps instead of sleeping */
	enum bench_op op;
	int64_t fusion;  /* -1: the engine's own (environment, then its default) */
	double cycle_ms; /* < 0: the engine's own */
	int sweep;
	int autotune_steps;
	int lat_reps;
	int check;
	int quiet;
	const char *json;
};

/* The gradient sets (step_data.c): their names and default compute gaps. */
extern const char *const step_set_names[STEP_NSETS];
extern const int step_set_gap_us[STEP_NSETS];

/* One set of gradients: tensor i (grad/<i>) is count[i] floats at offset[i] of buf. */
struct step_set {
	const char *name;
	int n;
	int gap_us;
	int *ndim;
	int64_t (*dims)[4];
	size_t *count;
	size_t *offset;
	char (*names)[16];
	size_t total; /* elements */
	float *buf;
	void *base;
};

/*
 * What one mode measured: medians over the timed steps of the slowest rank, in seconds;
 * negot and cycles are the engine's own count (khor_engine_stats) per step, 0 for the direct
 * modes. The STEP_NT values of one step, in this order, are what a step writes.
 */
#define STEP_NT 5
struct step_row {
	double step, exposed, compute, negot, cycles;
	int64_t wrong; /* over the ranks and checked steps; -1: not checked */
};

struct step_point {
	int64_t fusion;
	double cycle_ms;
	struct step_row r;
};

struct step_result {
	const char *name; /* the set's */
	int tensors;
	size_t bytes;
	struct step_row engine, flat, per;
	int64_t engine_fusion; /* what the engine said it used (khor_engine_tuning) */
	double engine_cycle;
	struct step_point sweep[STEP_MAX_POINTS];
	int nsweep, best;
	int have_auto;
	struct step_point autotuned;
};

struct step_lat {
	int ran;
	double direct8, engine8;  /* seconds per call */
	double tiny, direct_tiny; /* engine step of the tiny set; a direct allreduce of its bytes */
	double engine8_negot, engine8_cycles; /* the engine's own count, in those calls */
	double tiny_negot, tiny_cycles;
	int64_t wrong;
};

/* The backprop thread: runs one hand-over of a set each time the main thread asks. */
struct step_bp {
	pthread_t tid;
	int started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned long asked, done; /* generations: main asks, the thread answers */
	int quit;
	/* the job of generation `asked` */
	khor_engine *engine;
	const struct step_set *set;
	int gap_us, spin;
	khor_op op;
	/* its outcome */
	khor_handle **handles; /* in hand-over order */
	int nhandles;
	khor_status st;
	char err[512];
	double t_first, t_last;
};

struct step_ctx {
	khor_comm *world; /* control and baselines */
	khor_comm *ecomm; /* the engine's */
	int rank, size;
	const struct step_args *a;
	khor_op op;
	const char *library, *transport, *algo;
	size_t period;
	float *fill_tab;  /* this rank's pattern over one period */
	double *want_tab; /* the reduced pattern over one period */
	struct step_bp bp;
	double *mine, *all; /* per-step timings, 3 per step */
	int nslots;
};

#endif
