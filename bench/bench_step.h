/*
 * bench_step.h -- khor-bench step: one training step's gradients through the engine, timed
 * against the direct API on the same ranks and bytes.
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
 * Data: every gradient buffer holds bench_common.h's sum/avg pattern over its global element
 * index (small integers in float32, so a sum is exact in any order); --check refills before
 * every step and verifies every element after it, engine and baselines alike. Without
 * --check an in-place sum is refilled every STEP_REFILL steps, untimed, so that repeated
 * sums never reach infinity.
 *
 * Included by khor_bench.c after khor.h and bench_common.h; uses the public API only.
 */
#ifndef KHOR_BENCH_STEP_H
#define KHOR_BENCH_STEP_H

#include "resnet50_sizes.h"

#define STEP_PROG "khor-bench"
#define STEP_SMALL_TENSORS 1000
#define STEP_SMALL_COUNT 1024 /* 4 KiB of float32 */
#define STEP_TINY_TENSORS 64
#define STEP_TINY_COUNT 2 /* 8 B of float32 */
#define STEP_REFILL 16
#define STEP_LAT_WARMUP 20
#define STEP_NSETS 2
#define STEP_MAX_POINTS 16

static const int64_t step_sweep_fusion[] = {0, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
static const double step_sweep_cycle[] = {0, 1, 5};
#define STEP_NFUSION (int)(sizeof step_sweep_fusion / sizeof step_sweep_fusion[0])
#define STEP_NCYCLE (int)(sizeof step_sweep_cycle / sizeof step_sweep_cycle[0])
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

static const char *const step_set_names[STEP_NSETS] = {"resnet50", "small"};
static const int step_set_gap_us[STEP_NSETS] = {50, 0};

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

/* ---- flags -------------------------------------------------------------------------------- */

static void step_usage(FILE *f)
{
	fprintf(f,
	        "usage: " STEP_PROG " step [flags]\n"
	        "One training step's gradients handed to the engine by a backprop thread (last\n"
	        "layer first, khor_enqueue_allreduce in place, names grad/<layer>), the main\n"
	        "thread waiting for every handle; against the direct API on the same bytes: one\n"
	        "flat khor_allreduce of all of them and one khor_allreduce per tensor; then a\n"
	        "lone 8-byte tensor, direct and through the engine, and the engine's negotiation\n"
	        "cost.\n"
	        "      --set S           resnet50 (ResNet-50's 161 float32 tensors, 25557032\n"
	        "                        parameters), small (1000 tensors of 4 KiB) or both\n"
	        "                        (default both)\n"
	        "  -n, --steps N         timed steps of each mode (default 10)\n"
	        "  -w, --warmup N        untimed steps before them (default 2; they also warm the\n"
	        "                        engine's response cache)\n"
	        "      --gap-us G        compute between two hand-overs, in us (default 50 for\n"
	        "                        resnet50, 0 for small); slept, against absolute\n"
	        "                        deadlines so that a late wake-up does not add up\n"
	        "      --spin            busy-wait the gaps instead of sleeping (takes a core)\n"
	        "  -o, --op OP           sum or avg (default avg, as Horovod's optimizer)\n"
	        "      --transport T     khor's links: tcp, shm, ib or auto (KHOR_TRANSPORT)\n"
	        "      --algo A          khor's allreduce algorithm (KHOR_ALGO), for every comm\n"
	        "      --fusion BYTES    the engine's KHOR_FUSION_THRESHOLD (K, M, G suffixes;\n"
	        "                        0 = no fusion; default: the environment, then 64M)\n"
	        "      --cycle-ms MS     the engine's KHOR_CYCLE_TIME in ms (default: the\n"
	        "                        environment, then 0)\n"
	        "      --sweep           also run the engine step for every fusion threshold of\n"
	        "                        0, 1M, 4M, 16M, 64M with every cycle time of 0, 1, 5 ms\n"
	        "                        (the engine restarted for each), and once with\n"
	        "                        KHOR_AUTOTUNE=1: its tuned values and step time\n"
	        "                        against the best fixed point\n"
	        "      --autotune-steps N\n"
	        "                        steps the autotuner gets before the timed ones, with\n"
	        "                        --sweep (default 100)\n"
	        "      --lat-reps N      calls of the 8-byte latency rows and steps of the tiny\n"
	        "                        set (%d tensors of 8 B) (default 200)\n"
	        "      --check           refill before every step and verify every element\n"
	        "                        after it (exact for sum; avg within float rounding)\n"
	        "      --json FILE       also write the run as JSON to FILE (rank 0)\n"
	        "  -q, --quiet           no table on stdout (with --json)\n"
	        "  -h, --help            this text\n"
	        "Columns: compute = first to last hand-over (the backprop thread's span); step =\n"
	        "first hand-over to last completion; exposed = last hand-over to last completion\n"
	        "(flat and per-tensor: their step, nothing overlaps them); GB/s = bytes / step;\n"
	        "vs flat = step / flat's; negot, cycles = the engine's negotiation time and\n"
	        "cycles per step (khor_engine_stats). Each is the slowest rank's per step, then\n"
	        "the median of the timed steps. The engine runs on a comm split from the world;\n"
	        "flat and per-tensor run on the world while no engine runs; the latency rows\n"
	        "interleave direct and engine calls in 5 rounds.\n"
	        "Exit status: 0 all right, 1 a failed call or a wrong result, 2 a bad flag.\n",
	        STEP_TINY_TENSORS);
}

static int step_bad(const char *what, const char *value, const char *need)
{
	fprintf(stderr, STEP_PROG " step: bad value '%s' for %s: it needs %s\n", value, what, need);
	step_usage(stderr);
	return 2;
}

/* argv[1] is "step". 0 to run, 1 after --help, 2 after a usage error. */
static int step_parse_args(int argc, char **argv, struct step_args *a)
{
	enum {
		OPT_SET = 256,
		OPT_GAP,
		OPT_SPIN,
		OPT_FUSION,
		OPT_CYCLE,
		OPT_SWEEP,
		OPT_AUTO,
		OPT_LAT,
		OPT_CHECK,
		OPT_JSON
	};
	static const struct option longopts[] = {
	    {"set", required_argument, NULL, OPT_SET},
	    {"steps", required_argument, NULL, 'n'},
	    {"warmup", required_argument, NULL, 'w'},
	    {"gap-us", required_argument, NULL, OPT_GAP},
	    {"spin", no_argument, NULL, OPT_SPIN},
	    {"op", required_argument, NULL, 'o'},
	    {"fusion", required_argument, NULL, OPT_FUSION},
	    {"cycle-ms", required_argument, NULL, OPT_CYCLE},
	    {"sweep", no_argument, NULL, OPT_SWEEP},
	    {"autotune-steps", required_argument, NULL, OPT_AUTO},
	    {"lat-reps", required_argument, NULL, OPT_LAT},
	    {"check", no_argument, NULL, OPT_CHECK},
	    {"json", required_argument, NULL, OPT_JSON},
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	*a = (struct step_args){
	    .sets = 3,
	    .steps = 10,
	    .warmup = 2,
	    .gap_us = -1,
	    .op = BENCH_AVG,
	    .fusion = -1,
	    .cycle_ms = -1,
	    .autotune_steps = 100,
	    .lat_reps = 200,
	};
	int c;
	opterr = 0;
	optind = 2; /* past "step" */
	while ((c = getopt_long(argc, argv, ":n:w:o:qh", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_SET:
			if (strcmp(optarg, "both") == 0)
				a->sets = 3;
			else if (strcmp(optarg, "resnet50") == 0)
				a->sets = 1;
			else if (strcmp(optarg, "small") == 0)
				a->sets = 2;
			else
				return step_bad("--set", optarg, "resnet50, small or both");
			break;
		case 'n':
			if (bench_parse_int(optarg, 1, 100000, &a->steps))
				return step_bad("--steps", optarg, "an integer from 1 to 100000");
			break;
		case 'w':
			if (bench_parse_int(optarg, 0, 100000, &a->warmup))
				return step_bad("--warmup", optarg, "an integer from 0 to 100000");
			break;
		case OPT_GAP:
			if (bench_parse_int(optarg, 0, 1000000, &a->gap_us))
				return step_bad("--gap-us", optarg,
				                "microseconds from 0 to 1000000");
			break;
		case OPT_SPIN:
			a->spin = 1;
			break;
		case 'o':
			if (bench_parse_op(optarg, &a->op) ||
			    (a->op != BENCH_SUM && a->op != BENCH_AVG))
				return step_bad("--op", optarg, "sum or avg");
			break;
		case OPT_FUSION: {
			size_t v;
			if (bench_parse_size(optarg, &v) || v > (size_t)INT64_MAX)
				return step_bad("--fusion", optarg, "a size like 0, 4M or 64M");
			a->fusion = (int64_t)v;
			break;
		}
		case OPT_CYCLE: {
			char *end;
			errno = 0;
			double v = strtod(optarg, &end);
			if (errno || end == optarg || *end != '\0' || !(v >= 0 && v <= 60000))
				return step_bad("--cycle-ms", optarg,
				                "milliseconds from 0 to 60000");
			a->cycle_ms = v;
			break;
		}
		case OPT_SWEEP:
			a->sweep = 1;
			break;
		case OPT_AUTO:
			if (bench_parse_int(optarg, 0, 1000000, &a->autotune_steps))
				return step_bad("--autotune-steps", optarg,
				                "an integer of 0 or more");
			break;
		case OPT_LAT:
			if (bench_parse_int(optarg, 1, 1000000, &a->lat_reps))
				return step_bad("--lat-reps", optarg, "an integer of 1 or more");
			break;
		case OPT_CHECK:
			a->check = 1;
			break;
		case OPT_JSON:
			a->json = optarg;
			break;
		case 'q':
			a->quiet = 1;
			break;
		case 'h':
			step_usage(stdout);
			return 1;
		case ':':
			fprintf(stderr, STEP_PROG " step: this flag needs a value: %s\n",
			        argv[optind - 1]);
			step_usage(stderr);
			return 2;
		default:
			fprintf(stderr, STEP_PROG " step: unknown flag %s\n", argv[optind - 1]);
			step_usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, STEP_PROG " step: unexpected argument %s\n", argv[optind]);
		step_usage(stderr);
		return 2;
	}
	if (a->quiet && !a->json) {
		fprintf(stderr, STEP_PROG " step: -q without --json would print nothing\n");
		step_usage(stderr);
		return 2;
	}
	return 0;
}

/* ---- gradient sets and their data --------------------------------------------------------- */

static void step_set_free(struct step_set *s)
{
	free(s->ndim);
	free(s->dims);
	free(s->count);
	free(s->offset);
	free(s->names);
	free(s->base);
	memset(s, 0, sizeof(*s));
}

/* kind: 0 resnet50, 1 small, 2 tiny (the negotiation set). -1 when out of memory. */
static int step_set_make(struct step_set *s, int kind)
{
	static const char *const names[] = {"resnet50", "small", "tiny"};
	int n = kind == 0 ? RESNET50_NTENSORS : kind == 1 ? STEP_SMALL_TENSORS : STEP_TINY_TENSORS;

	memset(s, 0, sizeof(*s));
	s->name = names[kind];
	s->n = n;
	s->gap_us = kind < STEP_NSETS ? step_set_gap_us[kind] : 0;
	s->ndim = calloc((size_t)n, sizeof(*s->ndim));
	s->dims = calloc((size_t)n, sizeof(*s->dims));
	s->count = calloc((size_t)n, sizeof(*s->count));
	s->offset = calloc((size_t)n, sizeof(*s->offset));
	s->names = calloc((size_t)n, sizeof(*s->names));
	if (!s->ndim || !s->dims || !s->count || !s->offset || !s->names)
		goto fail_free;
	for (int i = 0; i < n; i++) {
		if (kind == 0) {
			s->ndim[i] = resnet50_tensors[i].ndim;
			memcpy(s->dims[i], resnet50_tensors[i].dims, sizeof(s->dims[i]));
		} else {
			s->ndim[i] = 1;
			s->dims[i][0] = kind == 1 ? STEP_SMALL_COUNT : STEP_TINY_COUNT;
		}
		size_t count = 1;
		for (int d = 0; d < s->ndim[i]; d++)
			count *= (size_t)s->dims[i][d];
		s->count[i] = count;
		s->offset[i] = s->total;
		s->total += count;
		snprintf(s->names[i], sizeof(s->names[i]), "grad/%d", i);
	}
	s->buf = bench_alloc(s->total * sizeof(float), 0, &s->base);
	if (!s->buf)
		goto fail_free;
	return 0;
fail_free:
	step_set_free(s);
	return -1;
}

/* The pattern depends on the element index modulo the period only: tables of one period. */
static int step_tables(struct step_ctx *x)
{
	x->period = bench_period(x->a->op, BENCH_F32, x->size);
	x->fill_tab = malloc(x->period * sizeof(float));
	x->want_tab = malloc(x->period * sizeof(double));
	if (!x->fill_tab || !x->want_tab)
		return -1;
	for (size_t k = 0; k < x->period; k++) {
		x->fill_tab[k] = (float)bench_pattern(x->a->op, BENCH_F32, x->rank, x->size, k);
		x->want_tab[k] = bench_expected(x->a->op, BENCH_F32, x->size, k);
	}
	return 0;
}

static void step_fill(const struct step_ctx *x, float *buf, size_t count)
{
	for (size_t i = 0, k = 0; i < count; i++) {
		buf[i] = x->fill_tab[k];
		if (++k == x->period)
			k = 0;
	}
}

static int64_t step_check(const struct step_ctx *x, const float *buf, size_t count)
{
	int64_t wrong = 0;
	for (size_t i = 0, k = 0; i < count; i++) {
		wrong += bench_mismatch(x->a->op, BENCH_F32, buf[i], x->want_tab[k]);
		if (++k == x->period)
			k = 0;
	}
	return wrong;
}

/*
 * Before step it of a mode (warm-up included): a fresh pattern when checking, else for sum at
 * the mode's start and every STEP_REFILL steps (an in-place avg keeps its values).
 */
static void step_refill(const struct step_ctx *x, float *buf, size_t count, int it)
{
	if (x->a->check || (x->a->op == BENCH_SUM && it % STEP_REFILL == 0))
		step_fill(x, buf, count);
}

/* ---- errors ------------------------------------------------------------------------------- */

static int step_fail(const struct step_ctx *x, const char *what, const char *why)
{
	fprintf(stderr, STEP_PROG ": rank %d: %s failed: %s\n", x->rank, what, why);
	return -1;
}

static int step_fail_comm(const struct step_ctx *x, const char *what, khor_comm *comm,
                          khor_status st)
{
	const char *text = khor_comm_error(comm);
	return step_fail(x, what, text && *text ? text : khor_strerror(st));
}

static int step_fail_engine(const struct step_ctx *x, const char *what, const khor_engine *e,
                            khor_status st)
{
	const char *text = e ? khor_engine_error(e) : NULL;
	return step_fail(x, what, text && *text ? text : khor_strerror(st));
}

static int step_barrier(const struct step_ctx *x)
{
	khor_status st = khor_barrier(x->world);
	return st == KHOR_SUCCESS ? 0 : step_fail_comm(x, "barrier before a step", x->world, st);
}

/* ---- the backprop thread ------------------------------------------------------------------ */

static void step_wait_until(double deadline, int spin)
{
	if (spin) {
		while (bench_now() < deadline)
			;
		return;
	}
	/* bench_now is CLOCK_MONOTONIC seconds, so the deadline converts back exactly enough. */
	struct timespec ts;
	ts.tv_sec = (time_t)deadline;
	ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* One hand-over: every tensor of the set, last layer first, the k-th at t_first + k x gap. */
static void step_bp_handover(struct step_bp *bp)
{
	const struct step_set *s = bp->set;
	double gap = bp->gap_us * 1e-6;

	bp->nhandles = 0;
	bp->st = KHOR_SUCCESS;
	bp->err[0] = '\0';
	bp->t_first = bench_now();
	for (int k = 0; k < s->n; k++) {
		int i = s->n - 1 - k;
		if (k > 0 && gap > 0)
			step_wait_until(bp->t_first + k * gap, bp->spin);
		float *p = s->buf + s->offset[i];
		khor_handle *h = NULL;
		khor_status st =
		    khor_enqueue_allreduce(bp->engine, 0, s->names[i], p, p, KHOR_FLOAT32,
		                           s->ndim[i], s->dims[i], bp->op, 1.0, 1.0, &h);
		if (st != KHOR_SUCCESS) {
			const char *text = khor_engine_error(bp->engine);
			bp->st = st;
			snprintf(bp->err, sizeof bp->err, "khor_enqueue_allreduce of %s: %s",
			         s->names[i], text && *text ? text : khor_strerror(st));
			break;
		}
		bp->handles[bp->nhandles++] = h;
	}
	bp->t_last = bench_now();
}

static void *step_bp_main(void *arg)
{
	struct step_bp *bp = arg;
	pthread_mutex_lock(&bp->mu);
	for (;;) {
		while (bp->asked == bp->done && !bp->quit)
			pthread_cond_wait(&bp->cv, &bp->mu);
		if (bp->quit)
			break;
		pthread_mutex_unlock(&bp->mu);
		step_bp_handover(bp);
		pthread_mutex_lock(&bp->mu);
		bp->done = bp->asked;
		pthread_cond_broadcast(&bp->cv);
	}
	pthread_mutex_unlock(&bp->mu);
	return NULL;
}

/* handles: room for the largest set's tensors. */
static int step_bp_start(struct step_ctx *x, int max_tensors)
{
	struct step_bp *bp = &x->bp;
	bp->handles = calloc((size_t)max_tensors, sizeof(*bp->handles));
	if (!bp->handles)
		return step_fail(x, "allocating the handle table", strerror(ENOMEM));
	pthread_mutex_init(&bp->mu, NULL);
	pthread_cond_init(&bp->cv, NULL);
	int e = pthread_create(&bp->tid, NULL, step_bp_main, bp);
	if (e) {
		pthread_cond_destroy(&bp->cv);
		pthread_mutex_destroy(&bp->mu);
		return step_fail(x, "starting the backprop thread", strerror(e));
	}
	bp->started = 1;
	return 0;
}

static void step_bp_stop(struct step_ctx *x)
{
	struct step_bp *bp = &x->bp;
	if (bp->started) {
		pthread_mutex_lock(&bp->mu);
		bp->quit = 1;
		pthread_cond_broadcast(&bp->cv);
		pthread_mutex_unlock(&bp->mu);
		pthread_join(bp->tid, NULL);
		pthread_cond_destroy(&bp->cv);
		pthread_mutex_destroy(&bp->mu);
		bp->started = 0;
	}
	free(bp->handles);
	bp->handles = NULL;
}

/* Has the backprop thread hand the set over and waits until it has enqueued the last one. */
static void step_bp_run(struct step_ctx *x, khor_engine *e, const struct step_set *s, int gap_us)
{
	struct step_bp *bp = &x->bp;
	pthread_mutex_lock(&bp->mu);
	bp->engine = e;
	bp->set = s;
	bp->gap_us = gap_us;
	bp->spin = x->a->spin;
	bp->op = x->op;
	bp->asked++;
	pthread_cond_broadcast(&bp->cv);
	while (bp->done != bp->asked)
		pthread_cond_wait(&bp->cv, &bp->mu);
	pthread_mutex_unlock(&bp->mu);
}

/* ---- timing ------------------------------------------------------------------------------- */

/* Room for n timings on this rank (x->mine) and their maximum over the ranks (x->all). */
static int step_slots(struct step_ctx *x, int n)
{
	if (n <= x->nslots)
		return 0;
	double *m = realloc(x->mine, (size_t)n * sizeof(double));
	if (m)
		x->mine = m;
	double *al = m ? realloc(x->all, (size_t)n * sizeof(double)) : NULL;
	if (!m || !al)
		return step_fail(x, "allocating the timing table", strerror(ENOMEM));
	x->all = al;
	x->nslots = n;
	return 0;
}

/*
 * x->mine holds nsteps x STEP_NT values of this rank (step, exposed, compute, negot, cycles);
 * the row gets, for each, the median over the steps of the slowest rank's value, and the
 * wrong elements of all ranks. Collective over the world.
 */
static int step_reduce(struct step_ctx *x, int nsteps, int64_t wrong, struct step_row *r)
{
	khor_status st = khor_allreduce(x->world, x->mine, x->all, (size_t)nsteps * STEP_NT,
	                                KHOR_FLOAT64, KHOR_MAX);
	if (st != KHOR_SUCCESS)
		return step_fail_comm(x, "allreduce of the step times", x->world, st);
	int64_t total = 0;
	st = khor_allreduce(x->world, &wrong, &total, 1, KHOR_INT64, KHOR_SUM);
	if (st != KHOR_SUCCESS)
		return step_fail_comm(x, "allreduce of #wrong", x->world, st);
	double *v = x->mine; /* free again: sort each column here */
	double *med[STEP_NT] = {&r->step, &r->exposed, &r->compute, &r->negot, &r->cycles};
	for (int c = 0; c < STEP_NT; c++) {
		for (int i = 0; i < nsteps; i++)
			v[i] = x->all[i * STEP_NT + c];
		*med[c] = bench_median(v, nsteps);
	}
	r->wrong = x->a->check ? total : -1;
	return 0;
}

/* ---- the modes ---------------------------------------------------------------------------- */

/* The engine's counters of set 0: cycles and nanoseconds spent negotiating, on this rank. */
static int step_stats(struct step_ctx *x, khor_engine *e, uint64_t *cycles, uint64_t *ns)
{
	khor_status st = khor_engine_stats(e, 0, cycles, ns, NULL);
	return st == KHOR_SUCCESS ? 0 : step_fail_engine(x, "khor_engine_stats", e, st);
}

/* One step through engine e; t gets its STEP_NT values (step_row's, in seconds). */
static int step_engine_once(struct step_ctx *x, khor_engine *e, struct step_set *s, int gap_us,
                            int it, double *t, int64_t *wrong)
{
	uint64_t c0, ns0, c1, ns1;
	step_refill(x, s->buf, s->total, it);
	if (step_stats(x, e, &c0, &ns0) || step_barrier(x))
		return -1;
	step_bp_run(x, e, s, gap_us);
	struct step_bp *bp = &x->bp;
	int status = 0;
	if (bp->st != KHOR_SUCCESS)
		status = step_fail(x, "a step through the engine", bp->err);
	for (int k = 0; k < bp->nhandles; k++) {
		khor_handle *h = bp->handles[k];
		khor_status st = khor_handle_wait(h);
		if (st != KHOR_SUCCESS && status == 0) {
			char what[64];
			snprintf(what, sizeof what, "khor_handle_wait of %s",
			         s->names[s->n - 1 - k]);
			const char *text = khor_handle_error(h);
			status = step_fail(x, what, text && *text ? text : khor_strerror(st));
		}
		khor_handle_free(h); /* detaches one still pending: khor_engine_stop fails it */
	}
	double end = bench_now();
	t[0] = end - bp->t_first;
	t[1] = end - bp->t_last;
	t[2] = bp->t_last - bp->t_first;
	/* Read after the last completion: the step's negotiation ended before its collectives. */
	if (status == 0 && step_stats(x, e, &c1, &ns1))
		status = -1;
	t[3] = status == 0 ? (double)(ns1 - ns0) * 1e-9 : 0;
	t[4] = status == 0 ? (double)(c1 - c0) : 0;
	if (status == 0 && x->a->check)
		*wrong += step_check(x, s->buf, s->total);
	return status;
}

/* A config holding the given settings (NULL when none is given: the engine's own). */
static int step_config(struct step_ctx *x, int64_t fusion, double cycle_ms, int autotune,
                       khor_config **out)
{
	khor_config *cfg = NULL;
	char v[64];
	*out = NULL;
	if (fusion < 0 && cycle_ms < 0 && !autotune)
		return 0;
	khor_status st = khor_config_create(&cfg);
	if (st != KHOR_SUCCESS)
		return step_fail(x, "khor_config_create", khor_strerror(st));
	if (fusion >= 0) {
		snprintf(v, sizeof v, "%lld", (long long)fusion);
		st = khor_config_set(cfg, "KHOR_FUSION_THRESHOLD", v);
	}
	if (st == KHOR_SUCCESS && cycle_ms >= 0) {
		snprintf(v, sizeof v, "%g", cycle_ms);
		st = khor_config_set(cfg, "KHOR_CYCLE_TIME", v);
	}
	if (st == KHOR_SUCCESS && autotune)
		st = khor_config_set(cfg, "KHOR_AUTOTUNE", "1");
	if (st != KHOR_SUCCESS) {
		khor_config_destroy(cfg);
		return step_fail(x, "khor_config_set of the engine's settings", khor_strerror(st));
	}
	*out = cfg;
	return 0;
}

static int step_engine_start(struct step_ctx *x, int64_t fusion, double cycle_ms, int autotune,
                             khor_engine **out)
{
	khor_config *cfg;
	if (step_config(x, fusion, cycle_ms, autotune, &cfg))
		return -1;
	khor_status st = khor_engine_start(x->ecomm, cfg, out);
	khor_config_destroy(cfg);
	if (st != KHOR_SUCCESS)
		return step_fail_comm(x, "khor_engine_start", x->ecomm, st);
	return 0;
}

static int step_engine_stop(struct step_ctx *x, khor_engine *e)
{
	khor_status st = khor_engine_stop(e);
	if (st != KHOR_SUCCESS)
		return step_fail(x, "khor_engine_stop", khor_strerror(st));
	return 0;
}

/*
 * The engine step of set s: an engine with these settings (-1: its own), warm-up steps,
 * pre untimed steps more (the autotuner's), then the timed ones. *fusion_out and *cycle_out
 * get what khor_engine_tuning says after the timed steps.
 */
static int step_engine_mode(struct step_ctx *x, struct step_set *s, int gap_us, int64_t fusion,
                            double cycle_ms, int autotune, int pre, struct step_row *r,
                            int64_t *fusion_out, double *cycle_out)
{
	const struct step_args *a = x->a;
	khor_engine *e;
	int64_t wrong = 0;
	int status = 0;

	if (step_slots(x, a->steps * STEP_NT) ||
	    step_engine_start(x, fusion, cycle_ms, autotune, &e))
		return -1;
	for (int it = 0; it < a->warmup + pre + a->steps && status == 0; it++) {
		int timed = it - a->warmup - pre;
		double t[STEP_NT];
		status = step_engine_once(x, e, s, gap_us, it, t, &wrong);
		if (timed >= 0)
			memcpy(&x->mine[timed * STEP_NT], t, sizeof t);
	}
	if (status == 0) {
		khor_status st = khor_engine_tuning(e, fusion_out, cycle_out);
		if (st != KHOR_SUCCESS)
			status = step_fail_engine(x, "khor_engine_tuning", e, st);
	}
	if (step_engine_stop(x, e))
		status = -1;
	if (status)
		return -1;
	return step_reduce(x, a->steps, wrong, r);
}

/* flat (per_tensor 0): one allreduce of the whole buffer; else one per tensor, last first. */
static int step_direct_mode(struct step_ctx *x, struct step_set *s, int per_tensor,
                            struct step_row *r)
{
	const struct step_args *a = x->a;
	int64_t wrong = 0;

	if (step_slots(x, a->steps * STEP_NT))
		return -1;
	for (int it = 0; it < a->warmup + a->steps; it++) {
		step_refill(x, s->buf, s->total, it);
		if (step_barrier(x))
			return -1;
		double t0 = bench_now();
		khor_status st = KHOR_SUCCESS;
		if (!per_tensor) {
			st =
			    khor_allreduce(x->world, s->buf, s->buf, s->total, KHOR_FLOAT32, x->op);
		} else {
			for (int i = s->n - 1; i >= 0 && st == KHOR_SUCCESS; i--) {
				float *p = s->buf + s->offset[i];
				st = khor_allreduce(x->world, p, p, s->count[i], KHOR_FLOAT32,
				                    x->op);
			}
		}
		double t = bench_now() - t0;
		if (st != KHOR_SUCCESS)
			return step_fail_comm(x,
			                      per_tensor ? "khor_allreduce of a tensor"
			                                 : "khor_allreduce of the flat buffer",
			                      x->world, st);
		if (a->check)
			wrong += step_check(x, s->buf, s->total);
		if (it >= a->warmup) {
			double *m = &x->mine[(it - a->warmup) * STEP_NT];
			m[0] = m[1] = t;
			m[2] = m[3] = m[4] = 0;
		}
	}
	return step_reduce(x, a->steps, wrong, r);
}

/*
 * The latency rows, each call timed alone: a direct allreduce of 8 B and of the tiny set's
 * bytes, a lone 8 B tensor through the engine (enqueue + wait) and a step of the tiny set
 * through it. They run interleaved in rounds, as bench_time compares algorithms, because a
 * direct 8 B call on a small machine was seen at 0.5 us in one job and at 22-43 us in the
 * next, or for seconds within one, engine or not: a state that lasts then hits every kind
 * alike. The engine is started (idle but for its own rows) during the direct calls.
 */
enum { STEP_LAT_DIRECT8, STEP_LAT_ENGINE8, STEP_LAT_DIRECT_TINY, STEP_LAT_TINY, STEP_LAT_N };
#define STEP_LAT_ROUNDS 5

/*
 * One call of latency kind k on the tiny set's buffer; t[0] gets its seconds, t[1] and t[2]
 * the engine's negotiation seconds and cycles in it (0 for a direct call).
 */
static int step_lat_call(struct step_ctx *x, khor_engine *e, struct step_set *tiny, int k, int it,
                         double *t, int64_t *wrong)
{
	static const int64_t dims[1] = {STEP_TINY_COUNT};
	size_t count = k == STEP_LAT_DIRECT_TINY ? tiny->total : STEP_TINY_COUNT;
	khor_status st;

	t[1] = t[2] = 0;
	if (k == STEP_LAT_TINY) {
		double s[STEP_NT];
		int rc = step_engine_once(x, e, tiny, 0, it, s, wrong);
		t[0] = s[0];
		t[1] = s[3];
		t[2] = s[4];
		return rc;
	}
	/* fresh inputs every call: an in-place sum repeated would overflow */
	step_fill(x, tiny->buf, count);
	uint64_t c0 = 0, ns0 = 0, c1, ns1;
	if (k == STEP_LAT_ENGINE8 && step_stats(x, e, &c0, &ns0))
		return -1;
	double t0 = bench_now();
	if (k == STEP_LAT_ENGINE8) {
		khor_handle *h = NULL;
		st = khor_enqueue_allreduce(e, 0, "lat/8", tiny->buf, tiny->buf, KHOR_FLOAT32, 1,
		                            dims, x->op, 1.0, 1.0, &h);
		if (st != KHOR_SUCCESS)
			return step_fail_engine(x, "khor_enqueue_allreduce of lat/8", e, st);
		st = khor_handle_wait(h);
		t[0] = bench_now() - t0;
		if (st != KHOR_SUCCESS) {
			const char *text = khor_handle_error(h);
			step_fail(x, "khor_handle_wait of lat/8",
			          text && *text ? text : khor_strerror(st));
		}
		khor_handle_free(h);
		if (st != KHOR_SUCCESS || step_stats(x, e, &c1, &ns1))
			return -1;
		t[1] = (double)(ns1 - ns0) * 1e-9;
		t[2] = (double)(c1 - c0);
	} else {
		st = khor_allreduce(x->world, tiny->buf, tiny->buf, count, KHOR_FLOAT32, x->op);
		t[0] = bench_now() - t0;
		if (st != KHOR_SUCCESS)
			return step_fail_comm(x, "khor_allreduce of a latency row", x->world, st);
	}
	if (x->a->check)
		*wrong += step_check(x, tiny->buf, count);
	return 0;
}

/*
 * (c) and (d): every kind of step_lat_call, lat_reps timed calls each after STEP_LAT_WARMUP
 * (which also warm the engine's response cache for the tiny set), the engine with the run's
 * settings; each kind's median over its calls of the slowest rank's time.
 */
static int step_latency(struct step_ctx *x, struct step_lat *l)
{
	const struct step_args *a = x->a;
	int reps = a->lat_reps, rounds = reps < STEP_LAT_ROUNDS ? reps : STEP_LAT_ROUNDS;
	int done[STEP_LAT_N] = {0};
	struct step_set tiny;
	int64_t wrong = 0;
	khor_engine *e;
	int status = 0;

	if (step_set_make(&tiny, 2))
		return step_fail(x, "allocating the tiny set", strerror(ENOMEM));
	if (step_slots(x, 3 * STEP_LAT_N * reps) ||
	    step_engine_start(x, a->fusion, a->cycle_ms, 0, &e)) {
		step_set_free(&tiny);
		return -1;
	}
	for (int k = 0; k < STEP_LAT_N && status == 0; k++)
		for (int it = 0; it < STEP_LAT_WARMUP && status == 0; it++) {
			double t[3];
			status = step_lat_call(x, e, &tiny, k, it, t, &wrong);
		}
	for (int r = 0; r < rounds && status == 0; r++) {
		/* reps split as evenly as it goes; each round starts one kind later, every other
		 * round in reverse, so that no kind always follows the same other one */
		int ncalls = reps / rounds + (r < reps % rounds);
		for (int j = 0; j < STEP_LAT_N && status == 0; j++) {
			int k = ((r % 2 == 0 ? j : STEP_LAT_N - 1 - j) + r) % STEP_LAT_N;
			for (int i = 0; i < ncalls && status == 0; i++) {
				double t[3] = {0, 0, 0};
				status = step_lat_call(x, e, &tiny, k, STEP_LAT_WARMUP + done[k], t,
				                       &wrong);
				for (int v = 0; v < 3; v++)
					x->mine[(k * 3 + v) * reps + done[k]] = t[v];
				done[k]++;
			}
		}
	}
	if (step_engine_stop(x, e))
		status = -1;
	step_set_free(&tiny);
	if (status)
		return -1;
	khor_status st = khor_allreduce(x->world, x->mine, x->all, (size_t)(3 * STEP_LAT_N * reps),
	                                KHOR_FLOAT64, KHOR_MAX);
	if (st != KHOR_SUCCESS)
		return step_fail_comm(x, "allreduce of the latencies", x->world, st);
	double *med[STEP_LAT_N][3] = {
	    [STEP_LAT_DIRECT8] = {&l->direct8, NULL, NULL},
	    [STEP_LAT_ENGINE8] = {&l->engine8, &l->engine8_negot, &l->engine8_cycles},
	    [STEP_LAT_DIRECT_TINY] = {&l->direct_tiny, NULL, NULL},
	    [STEP_LAT_TINY] = {&l->tiny, &l->tiny_negot, &l->tiny_cycles},
	};
	for (int k = 0; k < STEP_LAT_N; k++)
		for (int v = 0; v < 3; v++)
			if (med[k][v])
				*med[k][v] = bench_median(&x->all[(k * 3 + v) * reps], reps);
	int64_t total = 0;
	st = khor_allreduce(x->world, &wrong, &total, 1, KHOR_INT64, KHOR_SUM);
	if (st != KHOR_SUCCESS)
		return step_fail_comm(x, "allreduce of #wrong", x->world, st);
	l->wrong = a->check ? total : -1;
	l->ran = 1;
	return 0;
}

/* ---- output ------------------------------------------------------------------------------- */

static double step_gbs(size_t bytes, double sec)
{
	return sec > 0 ? (double)bytes / sec / 1e9 : 0;
}

static void step_print_header(const struct step_ctx *x)
{
	const struct step_args *a = x->a;
	printf("# %s step: %d rank%s, dtype float, op %s, steps %d, warmup %d, check %d, sets",
	       STEP_PROG, x->size, x->size == 1 ? "" : "s", bench_op_name(a->op), a->steps,
	       a->warmup, a->check);
	for (int k = 0; k < STEP_NSETS; k++)
		if (a->sets & (1 << k))
			printf(" %s", step_set_names[k]);
	printf("\n# library: %s (transport %s, algo %s); engine on a comm split from the world,\n"
	       "# baselines on the world with no engine running; times: the slowest rank's per\n"
	       "# step, median of the timed steps; negot and cycles: the engine's own count\n"
	       "# (khor_engine_stats) of negotiation time and cycles per step\n#\n",
	       x->library, x->transport, x->algo);
	printf("#%9s  %10s  %7s  %11s  %8s  %8s  %8s  %8s  %6s  %7s  %7s  %6s\n", "set", "mode",
	       "tensors", "bytes", "compute", "step", "exposed", "negot", "cycles", "GB/s",
	       "vs flat", "#wrong");
	printf("#%9s  %10s  %7s  %11s  %8s  %8s  %8s  %8s  %6s  %7s  %7s  %6s\n", "", "", "", "(B)",
	       "(ms)", "(ms)", "(ms)", "(ms)", "", "", "", "");
	fflush(stdout);
}

static void step_format_wrong(char *out, size_t len, int64_t wrong)
{
	if (wrong < 0)
		snprintf(out, len, "%6s", "N/A");
	else
		snprintf(out, len, "%6lld", (long long)wrong);
}

/* compute, negot and cycles of an engine row; "-" for a direct one (engine 0). */
static void step_format_engine(char *out, size_t len, const struct step_row *r, int engine)
{
	if (engine)
		snprintf(out, len, "%8.2f  %8.2f  %8.2f  %8.3f  %6.1f", r->compute * 1e3,
		         r->step * 1e3, r->exposed * 1e3, r->negot * 1e3, r->cycles);
	else
		snprintf(out, len, "%8s  %8.2f  %8.2f  %8s  %6s", "-", r->step * 1e3,
		         r->exposed * 1e3, "-", "-");
}

static void step_print_row(const struct step_result *res, const char *mode, int tensors,
                           const struct step_row *r, int engine)
{
	char w[32], times[128];
	step_format_wrong(w, sizeof w, r->wrong);
	step_format_engine(times, sizeof times, r, engine);
	printf("%10s  %10s  %7d  %11zu  %s  %7.2f  %7.2f  %6s\n", res->name, mode, tensors,
	       res->bytes, times, step_gbs(res->bytes, r->step),
	       res->flat.step > 0 ? r->step / res->flat.step : 0.0, w);
}

static void step_print_set(const struct step_ctx *x, const struct step_result *res, int gap_us)
{
	printf("# %s: %d tensors, %zu B, gap %d us%s; engine: fusion %lld B, cycle %g ms\n",
	       res->name, res->tensors, res->bytes, gap_us, x->a->spin ? " (spun)" : "",
	       (long long)res->engine_fusion, res->engine_cycle);
	step_print_row(res, "engine", res->tensors, &res->engine, 1);
	step_print_row(res, "flat", 1, &res->flat, 0);
	step_print_row(res, "per-tensor", res->tensors, &res->per, 0);
	fflush(stdout);
}

static void step_print_point(const struct step_result *res, const char *fusion, const char *cycle,
                             const struct step_row *r, int best_mark)
{
	const struct step_point *best = &res->sweep[res->best];
	char w[32], times[128];
	step_format_wrong(w, sizeof w, r->wrong);
	step_format_engine(times, sizeof times, r, 1);
	printf("%12s  %7s  %s  %7.2f  %7.2f  %6s%s\n", fusion, cycle, times,
	       step_gbs(res->bytes, r->step), best->r.step > 0 ? r->step / best->r.step : 0.0, w,
	       best_mark ? " *" : "");
}

static void step_print_sweep(const struct step_result *res, int autotune_steps)
{
	printf("#\n# sweep %s: the engine step for each fusion threshold and cycle time (* the "
	       "best)\n",
	       res->name);
	printf("#%11s  %7s  %8s  %8s  %8s  %8s  %6s  %7s  %7s  %6s\n", "fusion", "cycle", "compute",
	       "step", "exposed", "negot", "cycles", "GB/s", "vs best", "#wrong");
	printf("#%11s  %7s  %8s  %8s  %8s  %8s  %6s  %7s  %7s  %6s\n", "(B)", "(ms)", "(ms)",
	       "(ms)", "(ms)", "(ms)", "", "", "", "");
	for (int p = 0; p < res->nsweep; p++) {
		const struct step_point *pt = &res->sweep[p];
		char f[32], c[32];
		snprintf(f, sizeof f, "%lld", (long long)pt->fusion);
		snprintf(c, sizeof c, "%.2f", pt->cycle_ms);
		step_print_point(res, f, c, &pt->r, p == res->best);
	}
	if (res->have_auto) {
		const struct step_point *au = &res->autotuned;
		printf(
		    "# autotune: KHOR_AUTOTUNE=1, %d steps to tune, then the timed ones; tuned:\n"
		    "# fusion %lld B, cycle %g ms (khor_engine_tuning after the timed steps)\n",
		    autotune_steps, (long long)au->fusion, au->cycle_ms);
		step_print_point(res, "autotune", "-", &au->r, 0);
	}
	printf("#\n");
	fflush(stdout);
}

static void step_print_summary(const struct step_ctx *x, const struct step_result *res, int nres,
                               const struct step_lat *l)
{
	printf("%s# ratios\n", x->a->sweep ? "" : "#\n"); /* a sweep ends with its own "#" */
	for (int k = 0; k < nres; k++) {
		const struct step_result *r = &res[k];
		printf("# %-8s engine step / flat %.2f, engine exposed / flat %.2f, per-tensor / "
		       "engine %.2f\n",
		       r->name, r->flat.step > 0 ? r->engine.step / r->flat.step : 0.0,
		       r->flat.step > 0 ? r->engine.exposed / r->flat.step : 0.0,
		       r->engine.step > 0 ? r->per.step / r->engine.step : 0.0);
	}
	if (!l->ran) {
		fflush(stdout);
		return;
	}
	char w[32];
	if (l->wrong < 0)
		snprintf(w, sizeof w, "N/A");
	else
		snprintf(w, sizeof w, "%lld", (long long)l->wrong);
	printf("# 8 B      direct %.1f us, engine %.1f us (enqueue + wait; negotiation %.1f us in\n"
	       "#          %.1f cycles): engine 8 B / direct 8 B %.2f\n",
	       l->direct8 * 1e6, l->engine8 * 1e6, l->engine8_negot * 1e6, l->engine8_cycles,
	       l->direct8 > 0 ? l->engine8 / l->direct8 : 0.0);
	printf(
	    "# tiny     %d tensors of 8 B through the engine, warm cache: step %.1f us = %.2f x\n"
	    "#          direct 8 B; negotiation %.1f us in %.1f cycles; the step less a direct\n"
	    "#          allreduce of its %d B (%.1f us): %.1f us\n"
	    "# latency: medians of %d calls each, in %d interleaved rounds; #wrong %s\n",
	    STEP_TINY_TENSORS, l->tiny * 1e6, l->direct8 > 0 ? l->tiny / l->direct8 : 0.0,
	    l->tiny_negot * 1e6, l->tiny_cycles,
	    (int)(STEP_TINY_TENSORS * STEP_TINY_COUNT * sizeof(float)), l->direct_tiny * 1e6,
	    (l->tiny - l->direct_tiny) * 1e6, x->a->lat_reps,
	    x->a->lat_reps < STEP_LAT_ROUNDS ? x->a->lat_reps : STEP_LAT_ROUNDS, w);
	fflush(stdout);
}

/* The times of a row or point, as JSON members (no braces). */
static void step_json_times(FILE *j, size_t bytes, const struct step_row *r)
{
	fprintf(j,
	        "\"compute_ms\": %.6g, \"step_ms\": %.6g, \"exposed_ms\": %.6g, "
	        "\"negot_ms\": %.6g, \"cycles\": %.6g, \"gbs\": %.6g, \"wrong\": %lld",
	        r->compute * 1e3, r->step * 1e3, r->exposed * 1e3, r->negot * 1e3, r->cycles,
	        step_gbs(bytes, r->step), (long long)r->wrong);
}

static void step_json_row(FILE *j, const struct step_result *res, const char *mode, int tensors,
                          const struct step_row *r, const char *sep)
{
	fprintf(j, "%s\n    {\"mode\": \"%s\", \"tensors\": %d, ", sep, mode, tensors);
	step_json_times(j, res->bytes, r);
	fprintf(j, ", \"vs_flat\": %.6g}", res->flat.step > 0 ? r->step / res->flat.step : 0.0);
}

static void step_json_point(FILE *j, const struct step_result *res, const struct step_point *p)
{
	const struct step_point *best = &res->sweep[res->best];
	fprintf(j, "{\"fusion_bytes\": %lld, \"cycle_ms\": %.6g, ", (long long)p->fusion,
	        p->cycle_ms);
	step_json_times(j, res->bytes, &p->r);
	fprintf(j, ", \"vs_best\": %.6g}", best->r.step > 0 ? p->r.step / best->r.step : 0.0);
}

static void step_json(FILE *j, const struct step_ctx *x, const struct step_result *res, int nres,
                      const struct step_lat *l, const int *gaps, int ok)
{
	const struct step_args *a = x->a;
	fprintf(j, "{\"program\": \"%s\", \"mode\": \"step\", \"library\": ", STEP_PROG);
	bench_json_string(j, x->library);
	fprintf(j, ", \"transport\": ");
	bench_json_string(j, x->transport);
	fprintf(j, ", \"algo\": ");
	bench_json_string(j, x->algo);
	fprintf(j,
	        ",\n \"nranks\": %d, \"type\": \"float\", \"redop\": \"%s\", \"steps\": %d, "
	        "\"warmup\": %d, \"check\": %d, \"spin\": %d, \"fusion_arg\": %lld, "
	        "\"cycle_ms_arg\": %.6g,\n \"sets\": [",
	        x->size, bench_op_name(a->op), a->steps, a->warmup, a->check, a->spin,
	        (long long)a->fusion, a->cycle_ms);
	for (int k = 0; k < nres; k++) {
		const struct step_result *r = &res[k];
		fprintf(j,
		        "%s\n  {\"set\": \"%s\", \"tensors\": %d, \"bytes\": %zu, \"gap_us\": %d, "
		        "\"engine_fusion_bytes\": %lld, \"engine_cycle_ms\": %.6g, \"rows\": [",
		        k ? "," : "", r->name, r->tensors, r->bytes, gaps[k],
		        (long long)r->engine_fusion, r->engine_cycle);
		step_json_row(j, r, "engine", r->tensors, &r->engine, "");
		step_json_row(j, r, "flat", 1, &r->flat, ",");
		step_json_row(j, r, "per-tensor", r->tensors, &r->per, ",");
		fprintf(
		    j,
		    "],\n   \"engine_step_over_flat\": %.6g, \"engine_exposed_over_flat\": %.6g, "
		    "\"per_tensor_over_engine\": %.6g",
		    r->flat.step > 0 ? r->engine.step / r->flat.step : 0.0,
		    r->flat.step > 0 ? r->engine.exposed / r->flat.step : 0.0,
		    r->engine.step > 0 ? r->per.step / r->engine.step : 0.0);
		if (r->nsweep > 0) {
			fprintf(j, ",\n   \"sweep\": [");
			for (int p = 0; p < r->nsweep; p++) {
				fprintf(j, "%s\n    ", p ? "," : "");
				step_json_point(j, r, &r->sweep[p]);
			}
			fprintf(j, "],\n   \"best\": %d", r->best);
		}
		if (r->have_auto) {
			fprintf(j, ",\n   \"autotune\": {\"steps_to_tune\": %d, \"tuned\": ",
			        a->autotune_steps);
			step_json_point(j, r, &r->autotuned);
			fprintf(j, "}");
		}
		fprintf(j, "}");
	}
	fprintf(j, "]");
	if (l->ran)
		fprintf(j,
		        ",\n \"latency\": {\"reps\": %d, \"direct_8b_us\": %.6g, \"engine_8b_us\": "
		        "%.6g, "
		        "\"engine_8b_negot_us\": %.6g, \"engine_8b_cycles\": %.6g, "
		        "\"engine_over_direct_8b\": %.6g,\n  \"tiny_tensors\": %d, "
		        "\"tiny_tensor_bytes\": %d, \"engine_tiny_step_us\": %.6g, "
		        "\"engine_tiny_negot_us\": %.6g, \"engine_tiny_cycles\": %.6g, "
		        "\"direct_tiny_bytes_us\": %.6g, \"tiny_over_direct_8b\": %.6g, "
		        "\"tiny_less_direct_us\": %.6g, \"wrong\": %lld}",
		        a->lat_reps, l->direct8 * 1e6, l->engine8 * 1e6, l->engine8_negot * 1e6,
		        l->engine8_cycles, l->direct8 > 0 ? l->engine8 / l->direct8 : 0.0,
		        STEP_TINY_TENSORS, (int)(STEP_TINY_COUNT * sizeof(float)), l->tiny * 1e6,
		        l->tiny_negot * 1e6, l->tiny_cycles, l->direct_tiny * 1e6,
		        l->direct8 > 0 ? l->tiny / l->direct8 : 0.0,
		        (l->tiny - l->direct_tiny) * 1e6, (long long)l->wrong);
	fprintf(j, ",\n \"ok\": %s}\n", ok ? "true" : "false");
}

/* ---- the run ------------------------------------------------------------------------------ */

/* Did any mode of the set see a wrong element? */
static int step_result_wrong(const struct step_result *r)
{
	int64_t w = 0;
	w |= r->engine.wrong > 0 || r->flat.wrong > 0 || r->per.wrong > 0;
	for (int p = 0; p < r->nsweep; p++)
		w |= r->sweep[p].r.wrong > 0;
	if (r->have_auto)
		w |= r->autotuned.r.wrong > 0;
	return w != 0;
}

/* One set: baselines, the engine step, and with --sweep the grid and autotune. */
static int step_run_set(struct step_ctx *x, struct step_set *s, int gap_us, struct step_result *res)
{
	const struct step_args *a = x->a;
	memset(res, 0, sizeof(*res));
	res->name = s->name;
	res->tensors = s->n;
	res->bytes = s->total * sizeof(float);
	step_fill(x, s->buf, s->total);
	if (step_direct_mode(x, s, 0, &res->flat) || step_direct_mode(x, s, 1, &res->per) ||
	    step_engine_mode(x, s, gap_us, a->fusion, a->cycle_ms, 0, 0, &res->engine,
	                     &res->engine_fusion, &res->engine_cycle))
		return -1;
	if (x->rank == 0 && !a->quiet)
		step_print_set(x, res, gap_us);
	if (!a->sweep)
		return 0;
	for (int f = 0; f < STEP_NFUSION; f++) {
		for (int c = 0; c < STEP_NCYCLE; c++) {
			struct step_point *p = &res->sweep[res->nsweep];
			int64_t fusion;
			double cycle;
			p->fusion = step_sweep_fusion[f];
			p->cycle_ms = step_sweep_cycle[c];
			if (step_engine_mode(x, s, gap_us, p->fusion, p->cycle_ms, 0, 0, &p->r,
			                     &fusion, &cycle))
				return -1;
			/* A point the engine did not take as given would mislabel its row. */
			double dc = cycle - p->cycle_ms;
			if (x->rank == 0 && (fusion != p->fusion || dc > 1e-9 || dc < -1e-9))
				fprintf(
				    stderr,
				    STEP_PROG ": note: asked for fusion %lld B, cycle %g ms, the "
				              "engine reports %lld B, %g ms (khor_engine_tuning)\n",
				    (long long)p->fusion, p->cycle_ms, (long long)fusion, cycle);
			if (res->nsweep == 0 || p->r.step < res->sweep[res->best].r.step)
				res->best = res->nsweep;
			res->nsweep++;
		}
	}
	/* Autotune starts from the run's settings, as a user's job would. */
	struct step_point *au = &res->autotuned;
	if (step_engine_mode(x, s, gap_us, a->fusion, a->cycle_ms, 1, a->autotune_steps, &au->r,
	                     &au->fusion, &au->cycle_ms))
		return -1;
	res->have_auto = 1;
	if (x->rank == 0 && !a->quiet)
		step_print_sweep(res, a->autotune_steps);
	return 0;
}

/*
 * khor-bench step on the joined world comm. Returns the exit status: 0 all right, 1 a failed
 * call or a wrong result, 2 an output file that cannot be opened.
 */
static int step_run(khor_comm *world, const struct step_args *a, const char *library,
                    const char *transport, const char *algo)
{
	struct step_ctx x = {
	    .world = world,
	    .rank = khor_rank(world),
	    .size = khor_size(world),
	    .a = a,
	    .op = a->op == BENCH_SUM ? KHOR_SUM : KHOR_AVG,
	    .library = library,
	    .transport = transport,
	    .algo = algo,
	};
	struct step_result res[STEP_NSETS];
	struct step_lat lat = {0};
	int gaps[STEP_NSETS], nres = 0, status = 0;
	int64_t bad[2] = {0, 0}, bad_all[2];

	FILE *json = NULL;
	if (x.rank == 0 && a->json && !(json = fopen(a->json, "w"))) {
		fprintf(stderr, STEP_PROG ": cannot open --json %s: %s\n", a->json,
		        strerror(errno));
		bad[1] = 1;
	}
	if (step_tables(&x)) {
		fprintf(stderr, STEP_PROG ": rank %d: out of memory for the pattern tables\n",
		        x.rank);
		bad[0] = 1;
	}
	/* Every rank decides together whether to start, as bench_run does. */
	khor_status st = khor_allreduce(world, bad, bad_all, 2, KHOR_INT64, KHOR_SUM);
	if (st != KHOR_SUCCESS) {
		step_fail_comm(&x, "allreduce at start", world, st);
		status = 1;
		goto out_free;
	}
	if (bad_all[0] || bad_all[1]) {
		status = bad_all[0] ? 1 : 2;
		goto out_free;
	}
	st = khor_comm_split(world, 0, x.rank, &x.ecomm);
	if (st != KHOR_SUCCESS) {
		step_fail_comm(&x, "khor_comm_split for the engine's comm", world, st);
		status = 1;
		goto out_free;
	}
	int max_tensors =
	    STEP_SMALL_TENSORS > RESNET50_NTENSORS ? STEP_SMALL_TENSORS : RESNET50_NTENSORS;
	if (step_bp_start(&x, max_tensors)) {
		status = 1;
		goto out_comm;
	}
	if (x.rank == 0 && !a->quiet)
		step_print_header(&x);
	for (int k = 0; k < STEP_NSETS && status == 0; k++) {
		if (!(a->sets & (1 << k)))
			continue;
		struct step_set s;
		int64_t nomem = step_set_make(&s, k) ? 1 : 0, nomem_all = 0;
		if (nomem)
			fprintf(stderr, STEP_PROG ": rank %d: cannot allocate the %s set\n", x.rank,
			        step_set_names[k]);
		st = khor_allreduce(world, &nomem, &nomem_all, 1, KHOR_INT64, KHOR_SUM);
		if (st != KHOR_SUCCESS || nomem_all) {
			if (st != KHOR_SUCCESS)
				step_fail_comm(&x, "allreduce before a set", world, st);
			if (!nomem)
				step_set_free(&s);
			status = 1;
			break;
		}
		gaps[nres] = a->gap_us >= 0 ? a->gap_us : s.gap_us;
		if (step_run_set(&x, &s, gaps[nres], &res[nres]))
			status = 1;
		step_set_free(&s); /* the result keeps only the set's static name */
		if (status == 0)
			nres++;
	}
	if (status == 0 && step_latency(&x, &lat))
		status = 1;
	for (int k = 0; k < nres; k++)
		if (step_result_wrong(&res[k]))
			status = 1;
	if (lat.wrong > 0)
		status = 1;
	if (x.rank == 0 && !a->quiet && nres > 0)
		step_print_summary(&x, res, nres, &lat);
	if (json)
		step_json(json, &x, res, nres, &lat, gaps, status == 0);
	step_bp_stop(&x);
out_comm:
	st = khor_comm_free(x.ecomm);
	if (st != KHOR_SUCCESS) {
		step_fail(&x, "khor_comm_free of the engine's comm", khor_strerror(st));
		if (status == 0)
			status = 1;
	}
out_free:
	if (json && fclose(json) && status == 0) {
		fprintf(stderr, STEP_PROG ": writing --json %s: %s\n", a->json, strerror(errno));
		status = 1;
	}
	free(x.fill_tab);
	free(x.want_tab);
	free(x.mine);
	free(x.all);
	return status;
}

#endif /* KHOR_BENCH_STEP_H */
