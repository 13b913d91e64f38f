/*
 * bench_comms.c -- several comms at once (bench_run_comms): each size on K comms over the same
 * ranks, each driven by a thread of its own behind a shared gate, and the time of a dup and free of
 * a comm.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_comms.h"
#include "bench_data.h"
#include "bench_output.h"
#include "bench_stats.h"
#include "bench_bufs.h"
#include "bench_sweep.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- threads of a multi-comm run ---------------------------------------------------------- */

#define BENCH_SPLIT_REPS 21

/* After a thread failed, the others may finish the size: they are given up on (and the
 * process exits) once none of them has finished a call for this long. */
#define BENCH_STALL_S 30

/*
 * What the threads of one phase (one size on K comms) share. The gate lines them up after
 * the warm-up, so that the K timed loops run at the same time, and again after the timed
 * calls, so that no comm's check runs beside another's timing. A thread that fails leaves the
 * gate for good instead of breaking it: the others carry on with the same calls as their
 * peers on the other ranks, so a healthy comm is never left waiting for a rank that gave up,
 * and the sweep stops after the phase.
 */
struct bench_phase {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int parties; /* threads the gate waits for: the phase's, less those that failed */
	int arrived;
	unsigned long generation;
	int finished; /* threads done, failed or not */
	int failed;   /* index + 1 of the first comm that failed; 0: none */
};

/* Wakes the gate's waiters when the last of its parties has come. Holds phase->mu. */
static void bench_gate_open_locked(struct bench_phase *p)
{
	if (p->arrived > 0 && p->arrived >= p->parties) {
		p->arrived = 0;
		p->generation++;
		pthread_cond_broadcast(&p->cv);
	}
}

void bench_thread_sync(struct bench_thread *t)
{
	if (!t)
		return;
	struct bench_phase *p = t->phase;
	pthread_mutex_lock(&p->mu);
	unsigned long gen = p->generation;
	p->arrived++;
	bench_gate_open_locked(p);
	while (gen == p->generation)
		pthread_cond_wait(&p->cv, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

void bench_thread_beat(struct bench_thread *t)
{
	if (t)
		atomic_fetch_add_explicit(&t->beats, 1, memory_order_relaxed);
}

/* ---- several comms at once ---------------------------------------------------------------- */

/* Marks t finished (failed when status is not 0) and wakes whoever waits on the phase. */
static void bench_thread_end(struct bench_thread *t, int status)
{
	struct bench_phase *p = t->phase;
	pthread_mutex_lock(&p->mu);
	t->status = status;
	t->done = 1;
	if (status) {
		p->parties--; /* leave the gate: the others must not wait for this one */
		bench_gate_open_locked(p);
		if (!p->failed)
			p->failed = t->comm + 1;
	}
	p->finished++;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* One comm's part of a phase: the size's calls and their check, as bench_run makes them. */
static void bench_thread_run(struct bench_thread *t)
{
	struct bench_backend *b = t->b;
	const struct bench_args *a = &t->a;
	int64_t mine = 0;
	int status = 0;
	if (bench_time(b, a, t->s, t->bufs, t->bytes, &t->sec, &mine) ||
	    (a->check == BENCH_CHECK_ONCE && bench_verify(b, a, t->s, t->bufs, t->bytes, &mine)))
		status = -1;
	else if (a->check && b->allreduce(b, &mine, &t->wrong, 1, BENCH_I64, BENCH_SUM))
		status = bench_fail(b, "allreduce of #wrong", t->bytes);
	bench_thread_end(t, status);
}

static void *bench_thread_main(void *arg)
{
	bench_thread_run(arg);
	return NULL;
}

/*
 * Waits until the phase's k threads have finished: 0. After one failed, the others may still
 * finish their calls, since their peers on the other ranks make them too; -1 when none of
 * them has finished a call for BENCH_STALL_S, so that a failure never turns into a hang.
 */
static int bench_phase_wait(struct bench_phase *p, struct bench_thread *th, int k)
{
	unsigned long seen = 0;
	double quiet_since = 0;
	int watching = 0;
	pthread_mutex_lock(&p->mu);
	while (p->finished < k) {
		if (p->failed) {
			unsigned long beats = 0;
			for (int i = 0; i < k; i++)
				if (!th[i].done)
					beats += atomic_load_explicit(&th[i].beats,
					                              memory_order_relaxed);
			double now = bench_now();
			if (!watching || beats != seen) {
				watching = 1;
				seen = beats;
				quiet_since = now;
			} else if (now - quiet_since > BENCH_STALL_S) {
				pthread_mutex_unlock(&p->mu);
				return -1;
			}
		}
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&p->cv, &p->mu, &ts);
	}
	pthread_mutex_unlock(&p->mu);
	return 0;
}

/*
 * One size on comms[0..k-1] at once, a thread each (k == 1: this thread), comm i on buffers
 * bufs[i]; th gets each comm's result. Returns 0, or the index + 1 of the first
 * comm that failed (its thread said why). A thread still stuck in a call BENCH_STALL_S after
 * another failed is not waited for: neither its comm nor the library could be freed under it,
 * so this names it and ends the process.
 */
static int bench_phase_run(struct bench_backend *const *comms, int k, const struct bench_args *a,
                           const struct bench_shape *s, size_t bytes, const struct bench_bufs *bufs,
                           struct bench_thread *th)
{
	struct bench_phase p = {.parties = k};
	int started[BENCH_MAX_COMMS] = {0};
	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.cv, NULL);
	for (int i = 0; i < k; i++) {
		struct bench_thread *t = &th[i];
		atomic_init(&t->beats, 0);
		t->phase = &p;
		t->comm = i;
		t->b = comms[i];
		t->a = *a;
		if (i > 0)
			t->a.progress_s = 0; /* one progress line at a time: comm 0's */
		t->s = s;
		t->bufs = &bufs[i];
		t->bytes = bytes;
		t->sec = 0;
		t->wrong = 0;
		t->status = 0;
		t->done = 0;
		comms[i]->thread = t;
	}
	if (k == 1) {
		bench_thread_run(&th[0]);
	} else {
		for (int i = 0; i < k; i++) {
			int e = pthread_create(&th[i].tid, NULL, bench_thread_main, &th[i]);
			if (e) {
				fprintf(stderr,
				        "%s: rank %d: cannot start a thread for comm %d: %s\n",
				        comms[i]->prog, comms[i]->rank, i, strerror(e));
				bench_thread_end(&th[i], -1);
				continue;
			}
			started[i] = 1;
		}
		if (bench_phase_wait(&p, th, k)) {
			for (int i = 0; i < k; i++)
				if (!th[i].done)
					fprintf(
					    stderr,
					    "%s: rank %d: still inside a call at %zu bytes %d s "
					    "after comm %d failed, with no call finished since; "
					    "exiting without freeing the comms\n",
					    comms[i]->prog, comms[i]->rank, bytes, BENCH_STALL_S,
					    p.failed - 1);
			fflush(NULL);
			_exit(1);
		}
		for (int i = 0; i < k; i++)
			if (started[i])
				pthread_join(th[i].tid, NULL);
	}
	for (int i = 0; i < k; i++)
		comms[i]->thread = NULL;
	pthread_cond_destroy(&p.cv);
	pthread_mutex_destroy(&p.mu);
	return p.failed;
}

/* What a comm costs to make: the slowest rank's dup + free, and dup alone, in seconds. */
struct bench_dup_time {
	double median, min, max; /* dup + free */
	double dup_median;
};

/* BENCH_SPLIT_REPS dup + free pairs on b after an untimed one, each after a barrier. */
static int bench_time_dup(struct bench_backend *b, struct bench_dup_time *out)
{
	double mine[2 * BENCH_SPLIT_REPS], all[2 * BENCH_SPLIT_REPS];
	for (int i = -1; i < BENCH_SPLIT_REPS; i++) {
		struct bench_backend d;
		if (b->barrier(b))
			return bench_fail_call(b, "barrier before a timed comm split");
		double t0 = bench_now();
		if (b->dup(b, -1, &d))
			return bench_fail_call(b, b->dup_name);
		double t1 = bench_now();
		if (d.free_comm(&d))
			return -1;
		double t2 = bench_now();
		if (i >= 0) {
			mine[i] = t2 - t0;
			mine[BENCH_SPLIT_REPS + i] = t1 - t0;
		}
	}
	if (b->allreduce(b, mine, all, 2 * BENCH_SPLIT_REPS, BENCH_F64, BENCH_MAX))
		return bench_fail_call(b, "allreduce of the split times");
	out->min = out->max = all[0];
	for (int i = 1; i < BENCH_SPLIT_REPS; i++) {
		out->min = all[i] < out->min ? all[i] : out->min;
		out->max = all[i] > out->max ? all[i] : out->max;
	}
	out->median = bench_median(all, BENCH_SPLIT_REPS);
	out->dup_median = bench_median(&all[BENCH_SPLIT_REPS], BENCH_SPLIT_REPS);
	return 0;
}

static void bench_print_comms_header(const struct bench_backend *b, const struct bench_args *a,
                                     const int *ks, int nks, int maxk,
                                     const struct bench_dup_time *dt)
{
	bench_print_title(b, a);
	printf("# comms");
	for (int j = 0; j < nks; j++)
		printf("%c%d", j ? ',' : ' ', ks[j]);
	printf(
	    ": each size runs on K comms at once, a thread each, for every K in turn\n"
	    "# (K = 1: the job's comm; K > 1: comms over the same ranks made by %s of it)\n"
	    "# time ci, busbw ci: comm i's (its slowest rank's average per call); sum busbw: the\n"
	    "# K comms' busbw added",
	    b->dup_name);
	if (nks > 1)
		printf("; vs K=%d: sum busbw / K = %d's at the same size", ks[0], ks[0]);
	printf("\n# %s + %s on %d rank%s: median %.3f ms (%s alone %.3f ms), min %.3f,\n"
	       "# max %.3f, of %d, each the slowest rank's\n#\n",
	       b->dup_name, b->free_name, b->size, b->size == 1 ? "" : "s", dt->median * 1e3,
	       b->dup_name, dt->dup_median * 1e3, dt->min * 1e3, dt->max * 1e3, BENCH_SPLIT_REPS);
	char vs[24];
	snprintf(vs, sizeof vs, "vs K=%d", ks[0]);
	printf("#%11s  %12s  %8s  %6s  %3s  %9s", "size", "count", "type", "redop", "K",
	       "sum busbw");
	if (nks > 1)
		printf("  %7s", vs);
	printf("  %6s", "#wrong");
	for (int i = 0; i < maxk; i++) {
		char t[24], bw[24];
		snprintf(t, sizeof t, "time c%d", i);
		snprintf(bw, sizeof bw, "busbw c%d", i);
		printf("  %8s  %9s", t, bw);
	}
	printf("\n#%11s  %12s  %8s  %6s  %3s  %9s", "(B)", "(elements)", "", "", "", "(GB/s)");
	if (nks > 1)
		printf("  %7s", "");
	printf("  %6s", "");
	for (int i = 0; i < maxk; i++)
		printf("  %8s  %9s", "(us)", "(GB/s)");
	printf("\n");
	fflush(stdout);
}

/* vs < 0: no ratio column (one K); vs == 0 where there is nothing to compare (barrier). */
static void bench_print_comms_row(const struct bench_args *a, size_t bytes, size_t count, int k,
                                  double sum, double vs, int64_t wrong, const double *sec,
                                  const double *busbw)
{
	char t[32], w[32];
	printf("%12zu  %12zu  %8s  %6s  %3d  %9.2f", bytes, count, bench_row_type(a),
	       bench_row_redop(a), k, sum);
	if (vs > 0)
		printf("  %7.2f", vs);
	else if (vs == 0)
		printf("  %7s", "-");
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("  %6s", w);
	for (int i = 0; i < k; i++) {
		bench_format_time(t, sizeof t, sec[i] * 1e6);
		printf("  %8s  %9.2f", t, busbw[i]);
	}
	printf("\n");
	fflush(stdout);
}

int bench_run_comms(struct bench_backend *b, const struct bench_args *a, const int *ks, int nks)
{
	const struct bench_coll *c = a->coll;
	int rank0 = b->rank == 0;
	int refused = bench_can_run(b, a);
	if (refused)
		return refused;
	if (!b->dup || !b->free_comm) {
		if (rank0)
			fprintf(stderr, "%s: %s cannot make comms of its own\n", b->prog,
			        b->library);
		return 2;
	}
	if (bench_nmems(b) > 1) {
		if (rank0)
			fprintf(stderr,
			        "%s: several comms run on one memory kind at a time; give "
			        "one\n",
			        b->prog);
		return 2;
	}
	const struct bench_mem *mem = b->nmems ? b->mems[0] : NULL;
	int maxk = 1;
	for (int j = 0; j < nks; j++)
		maxk = ks[j] > maxk ? ks[j] : maxk;
	int nsplit = maxk > 1 ? maxk : 0;

	int64_t bad[2] = {0, 0}, bad_all[2]; /* as in bench_run */
	FILE *csv = bench_open_out(b, "--csv", a->csv, &bad[1]);
	FILE *json = bench_open_out(b, "--json", a->json, &bad[1]);
	size_t esize = bench_dtype_size(a->dtype);
	struct bench_shape max;
	c->shape(c->flags & BENCH_NO_DATA ? 0 : a->maxbytes / esize, b->size, &max);
	struct bench_bufs bufs[BENCH_MAX_COMMS] = {0};
	for (int i = 0; i < maxk; i++) {
		if (bench_bufs_alloc(b, mem, max.send * esize, max.recv * esize, a->offset,
		                     &bufs[i])) {
			fprintf(stderr,
			        "%s: rank %d: (those were the buffers of comm %d of %d; "
			        "lower -e or --comms)\n",
			        b->prog, b->rank, i, maxk);
			bad[0] = 1;
			break;
		}
	}
	struct bench_backend split[BENCH_MAX_COMMS];
	struct bench_thread th[BENCH_MAX_COMMS];
	struct bench_dup_time dt = {0};
	int nmade = 0, status = 0;
	if (b->allreduce(b, bad, bad_all, 2, BENCH_I64, BENCH_SUM)) {
		bench_fail(b, "allreduce at start", 0);
		status = 1;
		goto out_free;
	}
	if (bad_all[0] || bad_all[1]) {
		status = bad_all[0] ? 1 : 2;
		goto out_free;
	}
	for (int i = 0; i < maxk && c->fill; i++) {
		if (bench_bufs_fill(b, a, &max, &bufs[i])) {
			status = 1;
			goto out_free;
		}
	}
	if (bench_time_dup(b, &dt)) {
		status = 1;
		goto out_free;
	}
	for (; nmade < nsplit; nmade++) {
		if (b->dup(b, nmade, &split[nmade])) {
			bench_fail_call(b, b->dup_name);
			status = 1;
			goto out_comms;
		}
	}

	if (rank0 && !a->quiet)
		bench_print_comms_header(b, a, ks, nks, maxk, &dt);
	if (csv)
		fprintf(csv,
		        "collective,library,transport,algo,nranks,comms,comm,size,count,type,"
		        "redop,time_us,algbw_gbs,busbw_gbs,sum_busbw_gbs,wrong%s\n",
		        bench_mem_shown(b) ? ",mem" : "");
	if (json) {
		bench_json_head(json, b, a);
		fprintf(json, ",\n \"comms\": [");
		for (int j = 0; j < nks; j++)
			fprintf(json, "%s%d", j ? ", " : "", ks[j]);
		fprintf(json, "],\n \"comm_create\": {\"create\": ");
		bench_json_string(json, b->dup_name);
		fprintf(json, ", \"free\": ");
		bench_json_string(json, b->free_name);
		fprintf(json,
		        ", \"reps\": %d, \"median_ms\": %.6g, \"create_median_ms\": %.6g, "
		        "\"min_ms\": %.6g, \"max_ms\": %.6g},\n \"rows\": [",
		        BENCH_SPLIT_REPS, dt.median * 1e3, dt.dup_median * 1e3, dt.min * 1e3,
		        dt.max * 1e3);
	}

	int64_t wrong_total = 0;
	double busbw_sum[BENCH_MAX_KS] = {0};
	int rows = 0, nsizes = 0;
	for (size_t size = a->minbytes;;) {
		struct bench_shape s;
		c->shape(c->flags & BENCH_NO_DATA ? 0 : size / esize, b->size, &s);
		size_t bytes = s.total * esize;
		if (s.total > 0 || (c->flags & BENCH_NO_DATA)) {
			double first = 0;
			for (int j = 0; j < nks; j++) {
				int k = ks[j];
				struct bench_backend *comms[BENCH_MAX_COMMS];
				for (int i = 0; i < k; i++)
					comms[i] = k == 1 ? b : &split[i];
				/* Every rank starts the K threads together. */
				if (b->barrier(b)) {
					bench_fail(b, "barrier before the comms start", bytes);
					status = 1;
					goto sweep_done;
				}
				int failed = bench_phase_run(comms, k, a, &s, bytes, bufs, th);
				if (failed) {
					fprintf(
					    stderr,
					    "%s: rank %d: stopping the sweep: comm %d of the %d "
					    "failed at %zu bytes\n",
					    b->prog, b->rank, failed - 1, k, bytes);
					status = 1;
					goto sweep_done;
				}
				double sec[BENCH_MAX_COMMS], algbw[BENCH_MAX_COMMS],
				    busbw[BENCH_MAX_COMMS];
				double sum = 0;
				int64_t wrong = 0;
				for (int i = 0; i < k; i++) {
					sec[i] = th[i].sec;
					algbw[i] = sec[i] > 0 ? (double)bytes / sec[i] / 1e9 : 0;
					busbw[i] = algbw[i] * c->busbw_factor(b->size);
					sum += busbw[i];
					wrong += th[i].wrong;
				}
				if (j == 0)
					first = sum;
				wrong_total += wrong;
				busbw_sum[j] += sum;
				for (int i = 0; csv && i < k; i++) {
					fprintf(csv, "%s,", c->name);
					bench_csv_field(csv, b->library);
					fputc(',', csv);
					bench_csv_field(csv, b->transport);
					fputc(',', csv);
					bench_csv_field(csv, b->algo);
					fprintf(
					    csv, ",%d,%d,%d,%zu,%zu,%s,%s,%.6g,%.6g,%.6g,%.6g,%lld",
					    b->size, k, i, bytes, s.total, bench_row_type(a),
					    bench_row_redop(a), sec[i] * 1e6, algbw[i], busbw[i],
					    sum, a->check ? (long long)th[i].wrong : -1LL);
					if (bench_mem_shown(b))
						fprintf(csv, ",%s", bench_mem_name(mem));
					fputc('\n', csv);
				}
				if (rank0 && !a->quiet)
					bench_print_comms_row(a, bytes, s.total, k, sum,
					                      nks < 2     ? -1
					                      : first > 0 ? sum / first
					                                  : 0,
					                      wrong, sec, busbw);
				if (json) {
					fprintf(
					    json,
					    "%s\n  {\"size\": %zu, \"count\": %zu, \"comms\": %d, "
					    "\"sum_busbw_gbs\": %.6g, \"wrong\": %lld, "
					    "\"per_comm\": [",
					    rows ? "," : "", bytes, s.total, k, sum,
					    a->check ? (long long)wrong : -1LL);
					for (int i = 0; i < k; i++)
						fprintf(json,
						        "%s{\"comm\": %d, \"time_us\": %.6g, "
						        "\"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, "
						        "\"wrong\": %lld}",
						        i ? ", " : "", i, sec[i] * 1e6, algbw[i],
						        busbw[i],
						        a->check ? (long long)th[i].wrong : -1LL);
					fprintf(json, "]}");
				}
				rows++;
			}
			nsizes++;
		}
		if (c->flags & BENCH_NO_DATA)
			break;
		size_t next = bench_next_size(a, size);
		if (!next)
			break;
		size = next;
	}
sweep_done:
	if (rank0 && !a->quiet && status == 0) {
		printf("# Out of bounds values : %lld %s\n", (long long)wrong_total,
		       wrong_total ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    :");
		for (int j = 0; j < nks; j++)
			printf(" K=%d %g%s", ks[j], nsizes ? busbw_sum[j] / nsizes : 0.0,
			       j + 1 < nks ? "," : " (the sum over the K comms)\n");
		printf("#\n");
	}
	if (wrong_total)
		status = 1;
	if (json) {
		fprintf(json, "\n ],\n \"wrong_total\": %lld, \"avg_sum_busbw_gbs\": [",
		        a->check ? (long long)wrong_total : -1LL);
		for (int j = 0; j < nks; j++)
			fprintf(json, "%s%.6g", j ? ", " : "",
			        nsizes ? busbw_sum[j] / nsizes : 0.0);
		fprintf(json, "], \"ok\": %s}\n", status == 0 ? "true" : "false");
	}
out_comms:
	for (int i = 0; i < nmade; i++)
		if (split[i].free_comm(&split[i]) && status == 0)
			status = 1;
out_free:
	if (bench_close_out(b, "--csv", a->csv, csv) && status == 0)
		status = 1;
	if (bench_close_out(b, "--json", a->json, json) && status == 0)
		status = 1;
	for (int i = 0; i < maxk; i++)
		bench_bufs_free(&bufs[i]);
	return status;
}
