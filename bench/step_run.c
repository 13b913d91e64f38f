/*
 * step_run.c -- a whole khor-bench step run: the sets in turn, the --sweep points and autotune, and
 * the summary, with the engine on a comm of its own.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "step_run.h"
#include "resnet50_sizes.h"
#include "step_bp.h"
#include "step_data.h"
#include "step_modes.h"
#include "step_output.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int64_t step_sweep_fusion[STEP_NFUSION] = {0, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
const double step_sweep_cycle[STEP_NCYCLE] = {0, 1, 5};

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

int step_run(khor_comm *world, const struct step_args *a, const char *library,
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
