/*
 * step_output.c -- the step's table on stdout and its JSON, on rank 0.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "step_output.h"
#include "step_modes.h"
#include "bench_data.h"
#include "bench_output.h"

#include <stdint.h>

/* ---- output ------------------------------------------------------------------------------- */

static double step_gbs(size_t bytes, double sec)
{
	return sec > 0 ? (double)bytes / sec / 1e9 : 0;
}

void step_print_header(const struct step_ctx *x)
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

void step_print_set(const struct step_ctx *x, const struct step_result *res, int gap_us)
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

void step_print_sweep(const struct step_result *res, int autotune_steps)
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

void step_print_summary(const struct step_ctx *x, const struct step_result *res, int nres,
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

void step_json(FILE *j, const struct step_ctx *x, const struct step_result *res, int nres,
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
