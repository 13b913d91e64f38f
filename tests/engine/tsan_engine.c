/*
 * tsan_engine.c -- the engine fed from several threads at once, as a plain program for
 * ThreadSanitizer (Criterion's runner does not work under it). Build with
 * -DKHOR_SANITIZE=thread and run build/tests/tsan_engine [allreduces per thread]
 * [transport...].
 *
 * For each transport (default: tcp and shm) it forks 2 ranks through the test harness; in
 * each rank 3 threads enqueue named allreduces on one engine concurrently (names
 * t<thread>/<i>, a window of 8 in flight per thread, so the engine negotiates and fuses
 * tensors of all threads together), some waited for with khor_handle_wait, some through a
 * completion callback, and check every result element by element. Exits 0 when every rank
 * of every job exited 0; otherwise prints what failed and exits 1. Under TSan a race report
 * ends the reporting process (halt_on_error), so a race in any rank fails the run.
 */
#include "tests/harness.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

#ifdef UNDER_TSAN
/* Read by TSan at start-up; TSAN_OPTIONS in the environment still wins. */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
	return "halt_on_error=1:second_deadlock_stack=1";
}
#endif

#define TEXT 2048
#define NTHREADS 3
#define WINDOW 8

struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	int progress[HARNESS_MAX_RANKS][NTHREADS]; /* the tensor each thread is at */
};

struct job {
	struct shared *sh;
	const char *transport;
	int ops;
};

struct slot {
	khor_handle *h;
	float *buf;
	size_t count;
	int i;
	int done; /* set by the callback (atomically) */
	khor_status status;
};

struct worker {
	khor_engine *eng;
	int rank, n, t, ops, rc;
	int *progress;
	char err[TEXT];
};

static void done_cb(void *arg, khor_handle *h, khor_status st)
{
	struct slot *s = arg;

	s->status = st;
	__atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
}

/* Element j of tensor i of thread t on rank r: small integers, exact sums. */
static float value(int r, int t, int i, size_t j)
{
	return (float)(r * 3 + t + i % 11 + (int)(j % 13));
}

static int finish(struct worker *w, struct slot *s)
{
	khor_status st;

	if (s->i % 2 == 0) {
		st = khor_handle_wait(s->h);
	} else {
		struct timespec ts = {0, 200 * 1000};
		time_t end = time(NULL) + 60;
		while (!__atomic_load_n(&s->done, __ATOMIC_ACQUIRE) && time(NULL) < end)
			nanosleep(&ts, NULL);
		if (!__atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) {
			snprintf(w->err, TEXT, "thread %d: t%d/%d: the callback never ran", w->t,
			         w->t, s->i);
			return -1;
		}
		st = s->status;
	}
	if (st != KHOR_SUCCESS) {
		snprintf(w->err, TEXT, "thread %d: t%d/%d: status %d: %s", w->t, w->t, s->i, st,
		         khor_handle_error(s->h));
		return -1;
	}
	for (size_t j = 0; j < s->count; j++) {
		float want = 0;
		for (int r = 0; r < w->n; r++)
			want += value(r, w->t, s->i, j);
		if (s->buf[j] != want) {
			snprintf(w->err, TEXT, "thread %d: t%d/%d[%zu] = %g, want %g", w->t, w->t,
			         s->i, j, (double)s->buf[j], (double)want);
			return -1;
		}
	}
	khor_handle_free(s->h);
	free(s->buf);
	memset(s, 0, sizeof(*s));
	return 0;
}

static void *worker_main(void *p)
{
	struct worker *w = p;
	struct slot slots[WINDOW];

	memset(slots, 0, sizeof(slots));
	for (int i = 0; i < w->ops + WINDOW; i++) {
		struct slot *s = &slots[i % WINDOW];
		if (s->h != NULL && finish(w, s) != 0) {
			w->rc = 1;
			return NULL;
		}
		if (i >= w->ops)
			continue;
		__atomic_store_n(w->progress, i, __ATOMIC_RELAXED);
		char name[32];
		s->i = i;
		s->count = (size_t)1 << (i % 12); /* 1 .. 2048 floats */
		s->buf = malloc(s->count * sizeof(float));
		for (size_t j = 0; j < s->count; j++)
			s->buf[j] = value(w->rank, w->t, i, j);
		snprintf(name, sizeof(name), "t%d/%d", w->t, i);
		int64_t dims[1] = {(int64_t)s->count};
		khor_status st =
		    khor_enqueue_allreduce(w->eng, 0, name, s->buf, s->buf, KHOR_FLOAT32, 1, dims,
		                           KHOR_SUM, 1.0, 1.0, &s->h);
		if (st != KHOR_SUCCESS) {
			snprintf(w->err, TEXT, "thread %d: %s refused (%d): %s", w->t, name, st,
			         khor_engine_error(w->eng));
			w->rc = 1;
			return NULL;
		}
		if (i % 2 == 1 && khor_handle_set_callback(s->h, done_cb, s) != KHOR_SUCCESS) {
			snprintf(w->err, TEXT, "thread %d: set_callback on %s refused", w->t, name);
			w->rc = 1;
			return NULL;
		}
	}
	return NULL;
}

static int body(int rank, int n, khor_config *cfg, void *arg)
{
	const struct job *j = arg;
	char *out = j->sh->err[rank], err[TEXT];
	khor_comm *world;
	khor_engine *eng;
	struct worker w[NTHREADS];
	pthread_t th[NTHREADS];
	int rc = 0;

	khor_config_set(cfg, "KHOR_TRANSPORT", j->transport);
	if (khor_init(cfg, err, sizeof(err), &world) != KHOR_SUCCESS) {
		snprintf(out, TEXT, "init: %s", err);
		return 10;
	}
	if (khor_engine_start(world, NULL, &eng) != KHOR_SUCCESS) {
		snprintf(out, TEXT, "khor_engine_start: %s", khor_comm_error(world));
		return 11;
	}
	for (int t = 0; t < NTHREADS; t++) {
		w[t] = (struct worker){.eng = eng,
		                       .rank = rank,
		                       .n = n,
		                       .t = t,
		                       .ops = j->ops,
		                       .progress = &j->sh->progress[rank][t]};
		if (pthread_create(&th[t], NULL, worker_main, &w[t]) != 0) {
			snprintf(out, TEXT, "pthread_create failed");
			return 12;
		}
	}
	for (int t = 0; t < NTHREADS; t++) {
		pthread_join(th[t], NULL);
		if (w[t].rc != 0 && rc == 0) {
			snprintf(out, TEXT, "%s", w[t].err);
			rc = 13;
		}
	}
	if (khor_engine_stop(eng) != KHOR_SUCCESS && rc == 0) {
		snprintf(out, TEXT, "khor_engine_stop failed");
		rc = 14;
	}
	khor_finalize(world);
	return rc;
}

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	static const char *dflt[] = {"tcp", "shm"};
	const char **tps = dflt;
	int ntps = 2, ops = 300, bad = 0;
	const int n = 2;

	if (argc > 1) {
		ops = atoi(argv[1]);
		if (ops < 1) {
			fprintf(stderr, "usage: %s [allreduces per thread] [tcp|shm|auto ...]\n",
			        argv[0]);
			return 2;
		}
	}
	if (argc > 2) {
		tps = (const char **)&argv[2];
		ntps = argc - 2;
	}
	struct shared *sh = harness_shared(sizeof(*sh));
	if (sh == NULL) {
		fprintf(stderr, "tsan_engine: no shared memory\n");
		return 1;
	}
	for (int t = 0; t < ntps; t++) {
		struct job j = {.sh = sh, .transport = tps[t], .ops = ops};
		harness_opts o = {.n = n, .timeout = "60s", .deadline_s = 300};
		harness_result res;
		double t0 = mono();

		memset(sh, 0, sizeof(*sh));
		bool ok = harness_run(&o, body, &j, &res);
		printf("tsan_engine: %s n=%d, %d threads x %d allreduces: %s in %.1f s\n", tps[t],
		       n, NTHREADS, ops, ok ? "ok" : "FAILED", mono() - t0);
		if (res.timed_out) {
			printf("  the job hung and was killed after %.0f s\n", o.deadline_s);
			for (int r = 0; r < n; r++)
				printf("  rank %d's threads were at tensors %d, %d and %d of %d\n",
				       r, sh->progress[r][0], sh->progress[r][1],
				       sh->progress[r][2], ops);
		}
		for (int r = 0; r < n; r++)
			if (res.status[r] != 0)
				printf("  rank %d exited %d%s: %s\n", r, res.status[r],
				       res.status[r] == 66 ? " (a sanitizer report, above)" : "",
				       sh->err[r][0] ? sh->err[r] : "(no message)");
		bad += !ok;
	}
	harness_shared_free(sh, sizeof(*sh));
	printf("tsan_engine: %s\n", bad ? "FAILED" : "all jobs passed");
	return bad ? 1 : 0;
}
