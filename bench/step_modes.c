/*
 * step_modes.c -- the timed modes of a step: through the engine, one flat allreduce, one allreduce
 * per tensor, and the 8-byte latency and negotiation rows, each reduced to the slowest rank.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "step_modes.h"
#include "step_bp.h"
#include "step_data.h"
#include "bench_stats.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int step_engine_mode(struct step_ctx *x, struct step_set *s, int gap_us, int64_t fusion,
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

int step_direct_mode(struct step_ctx *x, struct step_set *s, int per_tensor, struct step_row *r)
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

int step_latency(struct step_ctx *x, struct step_lat *l)
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
