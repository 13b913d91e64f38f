/*
 * bench_sweep.c -- the timed sweep over sizes (bench_run): warm-up, timed calls in rounds when
 * comparing, the slowest rank's time, checks, progress lines, and the CSV and JSON files.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_sweep.h"
#include "bench_comms.h"
#include "bench_data.h"
#include "bench_output.h"
#include "bench_stats.h"
#include "bench_bufs.h"

#include <errno.h>
#include <string.h>

/* ---- the sweep ---------------------------------------------------------------------------- */

int bench_fail(struct bench_backend *b, const char *what, size_t bytes)
{
	fprintf(stderr, "%s: rank %d: %s failed at %zu bytes: %s\n", b->prog, b->rank, what, bytes,
	        b->error(b));
	return -1;
}

int bench_fail_call(struct bench_backend *b, const char *what)
{
	fprintf(stderr, "%s: rank %d: %s failed: %s\n", b->prog, b->rank, what, b->error(b));
	return -1;
}

/*
 * Rank 0's note on stderr that a long size is still running, so that a sweep to 1 GiB over
 * a slow link does not look hung: first after progress_s seconds, then every 5 x progress_s.
 */
struct bench_progress {
	double start;
	double next; /* seconds since start of the next line */
};

static void bench_progress_tick(const struct bench_backend *b, const struct bench_args *a,
                                struct bench_progress *p, size_t bytes, int done, int total,
                                int warmup)
{
	bench_thread_beat(b->thread);
	if (b->rank != 0 || a->progress_s <= 0)
		return;
	double elapsed = bench_now() - p->start;
	if (elapsed < p->next)
		return;
	char size[32];
	bench_human_size(size, sizeof size, bytes);
	if (warmup)
		fprintf(stderr, "# [%s] %s: warm-up %d of %d, %.0f s so far\n", b->prog, size, done,
		        total, elapsed);
	else
		fprintf(stderr, "# [%s] %s: %d of %d iterations, %.0f s so far\n", b->prog, size,
		        done, total, elapsed);
	p->next = elapsed + 5 * a->progress_s;
}

/* Comparison mode: switches every rank to algorithm k before its calls. */
static int bench_use_algo(struct bench_backend *b, int k, size_t bytes)
{
	if (!bench_comparing(b))
		return 0;
	if (b->set_algo(b, b->algos[k])) {
		char what[64];
		snprintf(what, sizeof what, "switching to --algo %s", b->algos[k]);
		return bench_fail(b, what, bytes);
	}
	return 0;
}

/*
 * The columns one size is timed in: every compared algorithm (1 without --algo a,b) on every
 * memory kind (1 without --mem both), column v being algorithm v % na on memory kind v / na.
 */
static int bench_nvariants(const struct bench_backend *b)
{
	return (bench_comparing(b) ? b->nalgos : 1) * bench_nmems(b);
}

/*
 * ncalls timed calls on buffers u after a barrier; adds their seconds to *sec. With -c all
 * every call gets fresh inputs and is checked, and only the call itself is timed, after a
 * barrier of its own so that one rank's slower check is not counted as the next call's time.
 */
static int bench_block(struct bench_backend *b, const struct bench_args *a,
                       const struct bench_shape *s, const struct bench_bufs *u, size_t bytes,
                       int ncalls, struct bench_progress *prog, int *done, double *sec,
                       int64_t *wrong)
{
	const struct bench_coll *c = a->coll;
	int check_all = a->check == BENCH_CHECK_ALL && c->fill;
	double t0, mine = 0;

	if (b->barrier(b))
		return bench_fail(b, "barrier before the timed loop", bytes);
	t0 = bench_now();
	for (int i = 0; i < ncalls; i++) {
		if (check_all) {
			if (bench_bufs_fill(b, a, s, u))
				return -1;
			if (b->barrier(b))
				return bench_fail(b, "barrier before a checked call", bytes);
			t0 = bench_now();
		}
		if (c->run(b, a, s, u->send, u->recv))
			return bench_fail(b, c->name, bytes);
		if (check_all) {
			mine += bench_now() - t0;
			if (bench_bufs_check(b, a, s, u, wrong))
				return -1;
		}
		bench_progress_tick(b, a, prog, bytes, ++*done, a->iters * bench_nvariants(b), 0);
	}
	if (!check_all)
		mine = bench_now() - t0;
	*sec += mine;
	return 0;
}

int bench_time(struct bench_backend *b, const struct bench_args *a, const struct bench_shape *s,
               const struct bench_bufs *bufs, size_t bytes, double *sec_out, int64_t *wrong)
{
	const struct bench_coll *c = a->coll;
	struct bench_progress prog = {bench_now(), a->progress_s};
	int check_all = a->check == BENCH_CHECK_ALL && c->fill;
	int na = bench_comparing(b) ? b->nalgos : 1, nv = bench_nvariants(b);
	int rounds = nv > 1 ? bench_rounds(a) : 1, done = 0;
	double mine[BENCH_MAX_ALGOS * BENCH_ROUNDS] = {0}, all[BENCH_MAX_ALGOS * BENCH_ROUNDS];
	if (nv > BENCH_MAX_ALGOS) { /* bench_can_run refuses this; a guard for the arrays */
		fprintf(stderr, "%s: %d columns to time; at most %d\n", b->prog, nv,
		        BENCH_MAX_ALGOS);
		return -1;
	}
	/* Warm-up at every size, not once at the largest as nccl-tests does: khor picks its
	 * algorithm per size and a first call may set up links or buffers for that choice. */
	for (int v = 0; v < nv; v++) {
		const struct bench_bufs *u = &bufs[v / na];
		if (bench_use_algo(b, v % na, bytes))
			return -1;
		for (int i = 0; i < a->warmup; i++) {
			if (check_all && bench_bufs_fill(b, a, s, u))
				return -1;
			if (c->run(b, a, s, u->send, u->recv))
				return bench_fail(b, c->name, bytes);
			if (check_all && bench_bufs_check(b, a, s, u, &wrong[v / na]))
				return -1;
			bench_progress_tick(b, a, &prog, bytes, v * a->warmup + i + 1,
			                    nv * a->warmup, 1);
		}
	}
	bench_thread_sync(b->thread); /* --comms: every comm's timed loop at once */
	for (int r = 0; r < rounds; r++) {
		/* iters split as evenly as it goes: the first iters % rounds rounds get one more */
		int ncalls = a->iters / rounds + (r < a->iters % rounds);
		for (int j = 0; j < nv; j++) {
			int v = ((r % 2 == 0 ? j : nv - 1 - j) + r) % nv;
			double *sec = &mine[v * rounds + r];
			if (bench_use_algo(b, v % na, bytes) ||
			    bench_block(b, a, s, &bufs[v / na], bytes, ncalls, &prog, &done, sec,
			                &wrong[v / na]))
				return -1;
			*sec /= ncalls > 0 ? ncalls : 1;
		}
	}
	bench_thread_sync(b->thread);
	if (b->allreduce(b, mine, all, (size_t)(nv * rounds), BENCH_F64, BENCH_MAX))
		return bench_fail(b, "allreduce of the times", bytes);
	for (int v = 0; v < nv; v++)
		sec_out[v] = bench_median(&all[v * rounds], rounds);
	return 0;
}

int bench_verify(struct bench_backend *b, const struct bench_args *a, const struct bench_shape *s,
                 const struct bench_bufs *bufs, size_t bytes, int64_t *wrong)
{
	const struct bench_coll *c = a->coll;
	int na = bench_comparing(b) ? b->nalgos : 1;
	if (!c->fill)
		return 0;
	for (int v = 0; v < bench_nvariants(b); v++) {
		const struct bench_bufs *u = &bufs[v / na];
		if (bench_use_algo(b, v % na, bytes) || bench_bufs_fill(b, a, s, u))
			return -1;
		if (c->run(b, a, s, u->send, u->recv))
			return bench_fail(b, c->name, bytes);
		if (bench_bufs_check(b, a, s, u, &wrong[v / na]))
			return -1;
	}
	return 0;
}

FILE *bench_open_out(const struct bench_backend *b, const char *flag, const char *path,
                     int64_t *bad)
{
	if (b->rank != 0 || !path)
		return NULL;
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "%s: cannot open %s %s: %s\n", b->prog, flag, path,
		        strerror(errno));
		(*bad)++;
	}
	return f;
}

int bench_close_out(const struct bench_backend *b, const char *flag, const char *path, FILE *f)
{
	if (f && fclose(f)) {
		fprintf(stderr, "%s: writing %s %s: %s\n", b->prog, flag, path, strerror(errno));
		return -1;
	}
	return 0;
}

void bench_json_head(FILE *j, const struct bench_backend *b, const struct bench_args *a)
{
	fprintf(j, "{\"program\": ");
	bench_json_string(j, b->prog);
	fprintf(j, ", \"library\": ");
	bench_json_string(j, b->library);
	fprintf(j, ", \"transport\": ");
	bench_json_string(j, b->transport);
	fprintf(j, ", \"algo\": ");
	bench_json_string(j, b->algo);
	fprintf(j,
	        ",\n \"collective\": \"%s\", \"nranks\": %d, \"type\": \"%s\", \"redop\": \"%s\", "
	        "\"root\": %d, \"iters\": %d, \"warmup\": %d, \"check\": \"%s\", "
	        "\"offset\": %zu",
	        a->coll->name, b->size, bench_row_type(a), bench_row_redop(a),
	        a->coll->flags & BENCH_USES_ROOT ? a->root : -1, a->iters, a->warmup,
	        bench_check_name(a->check), a->offset);
	if (!bench_mem_shown(b))
		return;
	fprintf(j, ", \"mem\": [");
	for (int m = 0; m < bench_nmems(b); m++) {
		fprintf(j, "%s", m ? ", " : "");
		bench_json_string(j, bench_mem_name(b->mems[m]));
	}
	fprintf(j, "]");
}

int bench_can_run(const struct bench_backend *b, const struct bench_args *a)
{
	const struct bench_coll *c = a->coll;
	int rank0 = b->rank == 0;
	/* Every sweep needs barrier and allreduce for its timing, whatever it measures. */
	if (!c->available(b) || !b->barrier || !b->allreduce) {
		if (rank0)
			fprintf(stderr, "%s: %s does not provide %s\n", b->prog, b->library,
			        c->name);
		return 2;
	}
	if (bench_nmems(b) > 1 && bench_comparing(b)) {
		if (rank0)
			fprintf(stderr,
			        "%s: two memory kinds and a list of algorithms cannot be "
			        "timed side by side; give one of them\n",
			        b->prog);
		return 2;
	}
	if ((c->flags & BENCH_USES_ROOT) && a->root >= b->size) {
		if (rank0)
			fprintf(stderr, "%s: -r %d is not a rank of this %d-rank job\n", b->prog,
			        a->root, b->size);
		return 2;
	}
	return 0;
}

size_t bench_next_size(const struct bench_args *a, size_t size)
{
	size_t next = a->stepbytes ? size + a->stepbytes : size * a->stepfactor;
	if (size == 0 && !a->stepbytes)
		next = 1; /* -b 0 with a factor would loop forever on 0 */
	if (next <= size || next > a->maxbytes)
		return 0;
	return next;
}

int bench_run(struct bench_backend *b, const struct bench_args *a)
{
	const struct bench_coll *c = a->coll;
	int rank0 = b->rank == 0;
	int refused = bench_can_run(b, a);
	if (refused)
		return refused;
	/* Every rank decides together whether to start, so that a rank whose buffers or output
	 * file failed does not leave the others blocked in the first collective. */
	int64_t bad[2] = {0, 0}, bad_all[2]; /* ranks without buffers, output files that failed */
	FILE *csv = bench_open_out(b, "--csv", a->csv, &bad[1]);
	FILE *json = bench_open_out(b, "--json", a->json, &bad[1]);
	size_t esize = bench_dtype_size(a->dtype);
	struct bench_shape max;
	c->shape(c->flags & BENCH_NO_DATA ? 0 : a->maxbytes / esize, b->size, &max);
	int nm = bench_nmems(b), mem_shown = bench_mem_shown(b);
	struct bench_bufs bufs[BENCH_MAX_MEMS] = {0};
	for (int m = 0; m < nm && !bad[0]; m++)
		if (bench_bufs_alloc(b, b->nmems ? b->mems[m] : NULL, max.send * esize,
		                     max.recv * esize, a->offset, &bufs[m]))
			bad[0] = 1;
	int status = 0;
	if (b->allreduce(b, bad, bad_all, 2, BENCH_I64, BENCH_SUM)) {
		bench_fail(b, "allreduce at start", 0);
		status = 1;
		goto out_free;
	}
	if (bad_all[0] || bad_all[1]) {
		status = bad_all[0] ? 1 : 2; /* an output path is a flag; memory is not */
		goto out_free;
	}
	if (csv)
		fprintf(csv,
		        "collective,library,transport,algo,nranks,size,count,type,redop,time_us,"
		        "algbw_gbs,busbw_gbs,wrong%s\n",
		        mem_shown ? ",mem" : "");
	if (json) {
		bench_json_head(json, b, a);
		fprintf(json, ",\n \"rows\": [");
	}

	/* The timed loop reads whatever the send buffer holds: give it the pattern, so that no
	 * run is timed on denormals or NaNs, which are slow on some CPUs. */
	for (int m = 0; m < nm && c->fill; m++) {
		if (bench_bufs_fill(b, a, &max, &bufs[m])) {
			status = 1;
			goto out_free;
		}
	}

	if (rank0 && !a->quiet)
		bench_print_header(b, a);
	int64_t wrong_total = 0, wrong_mem[BENCH_MAX_MEMS] = {0};
	double busbw_sum[BENCH_MAX_ALGOS] = {0};
	int rows = 0, nsizes = 0; /* rows: one per size and column */
	for (size_t size = a->minbytes;;) {
		struct bench_shape s;
		c->shape(c->flags & BENCH_NO_DATA ? 0 : size / esize, b->size, &s);
		size_t bytes = s.total * esize;
		/* A size below what the collective can split would time nothing: skip it (-b 2 with
		 * float, or allgather of 8 bytes over 4 ranks). */
		if (s.total > 0 || (c->flags & BENCH_NO_DATA)) {
			double sec[BENCH_MAX_ALGOS], busbws[BENCH_MAX_ALGOS];
			/* wrong elements per memory kind, then summed over the ranks */
			int64_t mine[BENCH_MAX_MEMS] = {0}, wrongs[BENCH_MAX_MEMS] = {0}, wrong = 0;
			if (bench_time(b, a, &s, bufs, bytes, sec, mine) ||
			    (a->check == BENCH_CHECK_ONCE &&
			     bench_verify(b, a, &s, bufs, bytes, mine))) {
				status = 1;
				break;
			}
			if (a->check &&
			    b->allreduce(b, mine, wrongs, (size_t)nm, BENCH_I64, BENCH_SUM)) {
				bench_fail(b, "allreduce of #wrong", bytes);
				status = 1;
				break;
			}
			for (int m = 0; m < nm; m++) {
				wrong += wrongs[m];
				wrong_mem[m] += wrongs[m];
			}
			wrong_total += wrong;
			int na = bench_comparing(b) ? b->nalgos : 1;
			for (int k = 0; k < bench_nvariants(b); k++) {
				const char *algo = bench_comparing(b) ? b->algos[k % na] : b->algo;
				const char *mem = bench_mem_name(b->nmems ? b->mems[k / na] : NULL);
				double algbw = sec[k] > 0 ? (double)bytes / sec[k] / 1e9 : 0;
				double busbw = algbw * c->busbw_factor(b->size);
				busbw_sum[k] += busbw;
				busbws[k] = busbw;
				/* a CSV or JSON row of one kind counts what was wrong in that kind
				 */
				int64_t row_wrong = nm > 1 ? wrongs[k / na] : wrong;
				if (rank0 && !a->quiet && !bench_comparing(b) && nm == 1)
					bench_print_row(a, bytes, s.total, sec[k] * 1e6, algbw,
					                busbw, wrong);
				if (csv) {
					fprintf(csv, "%s,", c->name);
					bench_csv_field(csv, b->library);
					fputc(',', csv);
					bench_csv_field(csv, b->transport);
					fputc(',', csv);
					bench_csv_field(csv, algo);
					fprintf(csv, ",%d,%zu,%zu,%s,%s,%.6g,%.6g,%.6g,%lld",
					        b->size, bytes, s.total, bench_row_type(a),
					        bench_row_redop(a), sec[k] * 1e6, algbw, busbw,
					        a->check ? (long long)row_wrong : -1LL);
					if (mem_shown)
						fprintf(csv, ",%s", mem);
					fputc('\n', csv);
				}
				if (json) {
					fprintf(json, "%s\n  {", rows ? "," : "");
					if (bench_comparing(b)) {
						fprintf(json, "\"algo\": ");
						bench_json_string(json, algo);
						fprintf(json, ", ");
					}
					if (mem_shown) {
						fprintf(json, "\"mem\": ");
						bench_json_string(json, mem);
						fprintf(json, ", ");
					}
					fprintf(json,
					        "\"size\": %zu, \"count\": %zu, \"time_us\": %.6g, "
					        "\"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, "
					        "\"wrong\": %lld}",
					        bytes, s.total, sec[k] * 1e6, algbw, busbw,
					        a->check ? (long long)row_wrong : -1LL);
				}
				rows++;
			}
			if (rank0 && !a->quiet && bench_comparing(b))
				bench_print_compare_row(b, a, bytes, s.total, sec, wrong);
			else if (rank0 && !a->quiet && nm > 1)
				bench_print_mems_row(a, bytes, s.total, sec, busbws, wrong);
			nsizes++;
		}
		if (c->flags & BENCH_NO_DATA)
			break;
		size_t next = bench_next_size(a, size);
		if (!next)
			break;
		size = next;
	}
	double avg_busbw = nsizes ? busbw_sum[0] / nsizes : 0.0;
	if (rank0 && !a->quiet && status == 0) {
		printf("# Out of bounds values : %lld %s", (long long)wrong_total,
		       wrong_total ? "FAILED" : "OK");
		for (int m = 0; nm > 1 && m < nm; m++)
			printf("%s%s %lld%s", m ? ", " : " (", bench_mem_name(b->mems[m]),
			       (long long)wrong_mem[m], m + 1 < nm ? "" : ")");
		printf("\n");
		if (bench_comparing(b)) {
			printf("# Avg bus bandwidth    :");
			for (int k = 0; k < b->nalgos; k++)
				printf(" %s %g%s", b->algos[k],
				       nsizes ? busbw_sum[k] / nsizes : 0.0,
				       k + 1 < b->nalgos ? "," : "\n");
		} else if (nm > 1) {
			printf("# Avg bus bandwidth    :");
			for (int m = 0; m < nm; m++)
				printf(" %s %g%s", bench_mem_name(b->mems[m]),
				       nsizes ? busbw_sum[m] / nsizes : 0.0,
				       m + 1 < nm ? "," : "\n");
		} else {
			printf("# Avg bus bandwidth    : %g\n", avg_busbw);
		}
		printf("#\n");
	}
	if (wrong_total)
		status = 1;
	if (json)
		fprintf(json,
		        "\n ],\n \"wrong_total\": %lld, \"avg_busbw_gbs\": %.6g, \"ok\": %s}\n",
		        a->check ? (long long)wrong_total : -1LL, avg_busbw,
		        status == 0 ? "true" : "false");
out_free:
	if (bench_close_out(b, "--csv", a->csv, csv) && status == 0)
		status = 1;
	if (bench_close_out(b, "--json", a->json, json) && status == 0)
		status = 1;
	for (int m = 0; m < nm; m++)
		bench_bufs_free(&bufs[m]);
	return status;
}
