/*
 * tsan_comms.c -- the two-threads-per-rank workload of test_comms.c as a plain program, for
 * ThreadSanitizer (Criterion's runner does not work under it). Build with
 * -DKHOR_SANITIZE=thread and run build/tests/tsan_comms [calls per thread] [transport...].
 *
 * For each transport (default: tcp and shm) and n = 2 and 4 it forks the ranks through the
 * test harness; in each rank two threads drive two comms that both hold every rank (one in
 * world order, one reversed) with the mixed collectives of comms_load.h, every result
 * checked. Exits 0 when every rank of every job exited 0; otherwise prints what failed and
 * exits 1. Under TSan a race report ends the reporting process (halt_on_error), so a race
 * in any rank, or in the store thread of this process, fails the run.
 */
#include "tests/harness.h"
#include "comms_load.h"

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

struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	int progress[HARNESS_MAX_RANKS][2]; /* the call each thread is in */
};

struct job {
	struct shared *sh;
	const char *transport;
	int ops;
};

static int body(int rank, int n, khor_config *cfg, void *arg)
{
	const struct job *j = arg;
	char *out = j->sh->err[rank], err[TEXT];
	khor_comm *world, *a = NULL, *b = NULL;

	khor_config_set(cfg, "KHOR_TRANSPORT", j->transport);
	if (khor_init(cfg, err, sizeof(err), &world) != KHOR_SUCCESS) {
		snprintf(out, TEXT, "init: %s", err);
		return 10;
	}
	if (khor_comm_split(world, 0, rank, &a) != KHOR_SUCCESS ||
	    khor_comm_split(world, 0, n - rank, &b) != KHOR_SUCCESS || a == NULL || b == NULL) {
		snprintf(out, TEXT, "split: %s", khor_comm_error(world));
		return 11;
	}
	if (load_two_threads(a, b, rank, j->ops, j->sh->progress[rank], err, sizeof(err)) != 0) {
		snprintf(out, TEXT, "%s", err);
		return 12;
	}
	if (load_check_all(a, 1, err, sizeof(err)) != 0 ||
	    load_check_all(b, 2, err, sizeof(err)) != 0 ||
	    load_check_all(world, 3, err, sizeof(err)) != 0) {
		snprintf(out, TEXT, "after the threads: %s", err);
		return 13;
	}
	if (khor_comm_free(a) != KHOR_SUCCESS || khor_comm_free(b) != KHOR_SUCCESS) {
		snprintf(out, TEXT, "khor_comm_free failed");
		return 14;
	}
	khor_finalize(world);
	return 0;
}

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	static const char *dflt[] = { "tcp", "shm" };
	const char **tps = dflt;
	int ntps = 2, ops = 300, bad = 0;

	if (argc > 1) {
		ops = atoi(argv[1]);
		if (ops < 1) {
			fprintf(stderr, "usage: %s [calls per thread] [tcp|shm|auto ...]\n", argv[0]);
			return 2;
		}
	}
	if (argc > 2) {
		tps = (const char **)&argv[2];
		ntps = argc - 2;
	}
	struct shared *sh = harness_shared(sizeof(*sh));
	if (sh == NULL) {
		fprintf(stderr, "tsan_comms: no shared memory\n");
		return 1;
	}
	for (int t = 0; t < ntps; t++) {
		for (int n = 2; n <= 4; n += 2) {
			struct job j = { .sh = sh, .transport = tps[t], .ops = ops };
			harness_opts o = { .n = n, .timeout = "60s", .deadline_s = 300 };
			harness_result res;
			double t0 = mono();

			memset(sh, 0, sizeof(*sh));
			bool ok = harness_run(&o, body, &j, &res);
			printf("tsan_comms: %s n=%d, 2 threads x %d calls: %s in %.1f s\n", tps[t], n,
			       ops, ok ? "ok" : "FAILED", mono() - t0);
			if (res.timed_out) {
				printf("  the job hung and was killed after %.0f s\n", o.deadline_s);
				for (int r = 0; r < n; r++)
					printf("  rank %d's threads were at calls %d and %d of %d\n", r,
					       sh->progress[r][0], sh->progress[r][1], ops);
			}
			for (int r = 0; r < n; r++)
				if (res.status[r] != 0)
					printf("  rank %d exited %d%s: %s\n", r, res.status[r],
					       res.status[r] == 66 ? " (a sanitizer report, above)" : "",
					       sh->err[r][0] ? sh->err[r] : "(no message)");
			bad += !ok;
		}
	}
	harness_shared_free(sh, sizeof(*sh));
	printf("tsan_comms: %s\n", bad ? "FAILED" : "all jobs passed");
	return bad ? 1 : 0;
}
