/*
 * test_faults.c -- no silent hang: a killed rank, a rank that never starts and (with the
 * heartbeats' judgement off) a rank that stops participating each make every other rank
 * fail within its deadline, with an error that names the rank at fault; ranks that wait
 * for each other in a cycle are named as the cycle.
 */
#include "tests/harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TEXT 1024

struct shared {
	char err[HARNESS_MAX_RANKS][TEXT];
	double failed_at[HARNESS_MAX_RANKS]; /* CLOCK_MONOTONIC seconds */
	int iterations[HARNESS_MAX_RANKS];
};

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int body_loop(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;
	size_t count = 1 << 20;
	float *buf = calloc(count, sizeof(float));

	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		snprintf(sh->err[rank], TEXT, "init: %s", err);
		return 10;
	}
	double end = mono() + 60;
	while (mono() < end) {
		if (khor_allreduce(comm, buf, buf, count, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS) {
			sh->failed_at[rank] = mono();
			snprintf(sh->err[rank], TEXT, "%s", khor_comm_error(comm));
			khor_finalize(comm);
			return 3;
		}
		sh->iterations[rank]++;
	}
	khor_finalize(comm);
	return 0;
}

static void kill_one(int n, int victim, const char *algo_note)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	/* Every rank must be in the loop by then: slow machines (ASan under the soft-RoCE VM's
	 * emulation, where init alone may take seconds) say how long to wait. */
	const char *after = getenv("KHOR_TEST_KILL_AFTER_S");
	harness_opts o = { .n = n, .timeout = "30s", .deadline_s = 90, .kill_rank = victim,
	                   .kill_after_s = after != NULL ? atof(after) : 2.0 };
	harness_result res;
	double t0 = mono();
	char want[32];

	harness_run(&o, body_loop, sh, &res);
	cr_assert(!res.timed_out, "the job hung after rank %d was killed", victim);
	cr_assert(res.killed_at > 0, "rank %d ended before it was killed", victim);
	cr_expect_eq(res.status[victim], 128 + 9);
	snprintf(want, sizeof(want), "rank %d", victim);
	for (int r = 0; r < n; r++) {
		if (r == victim)
			continue;
		cr_expect_eq(res.status[r], 3, "rank %d exited %d, not with an error", r,
		             res.status[r]);
		cr_expect_gt(sh->iterations[r], 0, "rank %d never ran an allreduce", r);
		double delay = sh->failed_at[r] - (t0 + res.killed_at);
		cr_expect_lt(delay, 5.0, "rank %d noticed only after %.1f s", r, delay);
		cr_expect(strstr(sh->err[r], want) != NULL, "rank %d's error does not name %s: %s", r,
		          want, sh->err[r]);
		fprintf(stderr, "%s rank %d after %.2f s: %s\n", algo_note, r, delay, sh->err[r]);
	}
	harness_shared_free(sh, sizeof(*sh));
}

Test(faults, kill9_rank_in_allreduce_loop_n4, .timeout = 120)
{
	kill_one(4, 2, "n=4");
}

Test(faults, kill9_rank_in_allreduce_loop_n6, .timeout = 120)
{
	kill_one(6, 0, "n=6");
}

static int body_init_only(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;

	khor_config_set(cfg, "KHOR_INIT_TIMEOUT", "2s");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
		sh->failed_at[rank] = mono();
		snprintf(sh->err[rank], TEXT, "%s", err);
		return 3;
	}
	khor_finalize(comm);
	return 0;
}

Test(faults, rank_that_never_starts_is_named_at_init_deadline, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	int skip[] = { 1, 3, -1 };
	harness_opts o = { .n = 5, .deadline_s = 30, .skip_ranks = skip };
	harness_result res;
	double t0 = mono();

	harness_run(&o, body_init_only, sh, &res);
	cr_assert(!res.timed_out);
	for (int r = 0; r < 5; r++) {
		if (r == 1 || r == 3)
			continue;
		cr_expect_eq(res.status[r], 3);
		cr_expect(strstr(sh->err[r], "never came: 1, 3") != NULL, "rank %d: %s", r,
		          sh->err[r]);
		double when = sh->failed_at[r] - t0;
		cr_expect(when > 1.5 && when < 10, "rank %d failed after %.1f s, expected ~2 s", r,
		          when);
	}
	harness_shared_free(sh, sizeof(*sh));
}

static int body_hang(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;
	float x[1000] = { 0 };

	khor_config_set(cfg, "KHOR_TIMEOUT", "2s");
	/* Off, KHOR_TIMEOUT is a deadline again (on, a live rank is waited for: test_liveness). */
	khor_config_set(cfg, "KHOR_HEARTBEAT_TIMEOUT", "-1");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 10;
	if (rank == 1) {
		sleep(8); /* alive, but never joins the collective */
		khor_finalize(comm);
		return 0;
	}
	if (khor_allreduce(comm, x, x, 1000, KHOR_FLOAT32, KHOR_SUM) == KHOR_SUCCESS)
		return 20;
	sh->failed_at[rank] = mono();
	snprintf(sh->err[rank], TEXT, "%s", khor_comm_error(comm));
	khor_finalize(comm);
	return 3;
}

Test(faults, rank_that_stops_participating_times_out_with_names_without_heartbeats,
     .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 4, .deadline_s = 40 };
	harness_result res;

	harness_run(&o, body_hang, sh, &res);
	cr_assert(!res.timed_out);
	/* The neighbours of rank 1 time out naming it; the others learn it from them: their
	 * error is the first one's ("aborted by another rank: rank R on HOST, comm ...: rank 1
	 * ..."), which blames rank 1 first in its turn. */
	for (int r = 0; r < 4; r++) {
		if (r == 1)
			continue;
		cr_expect_eq(res.status[r], 3, "rank %d exited %d", r, res.status[r]);
		const char *why = strstr(sh->err[r], ": ") + 2, *first = strstr(why,
		                                                                 "aborted by another rank: ");
		if (first != NULL && strstr(first + 25, ": ") != NULL)
			why = strstr(first + 25, ": ") + 2;
		cr_expect(strncmp(why, "rank 1 ", 7) == 0, "rank %d does not blame rank 1 first: %s",
		          r, sh->err[r]);
		fprintf(stderr, "hang: rank %d: %s\n", r, sh->err[r]);
	}
	harness_shared_free(sh, sizeof(*sh));
}

/*
 * Without heartbeats, three ranks in a cycle of waits: rank 0 allreduces on {0,1}, rank 1
 * on {1,2}, rank 2 on {2,0}, each one on a comm the next rank is not calling. Nobody is
 * missing, so no rank may be blamed for "not taking part": every rank's error names the
 * cycle and all three in it.
 */
static bool cycle_heartbeats;

static int body_cycle(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *world, *pair[3];
	float x[1000] = { 0 };

	(void)n;
	khor_config_set(cfg, "KHOR_TIMEOUT", "2s");
	if (!cycle_heartbeats)
		khor_config_set(cfg, "KHOR_HEARTBEAT_TIMEOUT", "-1");
	if (khor_init(cfg, err, sizeof(err), &world) != KHOR_SUCCESS)
		return 10;
	/* pair[k] = {k, k+1 mod 3}; each rank is in two of them. */
	for (int k = 0; k < 3; k++) {
		const int list[2] = { k, (k + 1) % 3 };
		pair[k] = NULL;
		if (khor_comm_create_group(world, list, 2, &pair[k]) != KHOR_SUCCESS) {
			snprintf(sh->err[rank], TEXT, "create_group %d: %s", k, khor_comm_error(world));
			return 11;
		}
	}
	if (khor_allreduce(pair[rank], x, x, 1000, KHOR_FLOAT32, KHOR_SUM) == KHOR_SUCCESS)
		return 20;
	sh->failed_at[rank] = mono();
	snprintf(sh->err[rank], TEXT, "%s", khor_comm_error(pair[rank]));
	khor_finalize(world);
	return 3;
}

Test(faults, a_cycle_of_waits_is_named_as_a_cycle_not_a_missing_rank, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 3, .deadline_s = 40 };
	harness_result res;

	cycle_heartbeats = false;
	harness_run(&o, body_cycle, sh, &res);
	cr_assert(!res.timed_out);
	for (int r = 0; r < 3; r++) {
		fprintf(stderr, "cycle: rank %d: %s\n", r, sh->err[r]);
		cr_expect_eq(res.status[r], 3, "rank %d exited %d: %s", r, res.status[r], sh->err[r]);
		cr_expect(strstr(sh->err[r], "wait for each other in a cycle") != NULL &&
		          strstr(sh->err[r], "not taking part") == NULL, "rank %d: %s", r,
		          sh->err[r]);
		for (int k = 0; k < 3; k++) {
			char hop[32], first[32];
			snprintf(hop, sizeof(hop), ", %d for %d", k, (k + 1) % 3);
			snprintf(first, sizeof(first), "chain: %d waited for %d", k, (k + 1) % 3);
			cr_expect(strstr(sh->err[r], k == r ? first : hop) != NULL,
			          "rank %d's cycle lacks '%s': %s", r, k == r ? first : hop, sh->err[r]);
		}
	}
	harness_shared_free(sh, sizeof(*sh));
}

/*
 * The same cycle with heartbeats on: every rank is alive, so no wait may fail for a silent
 * rank, and none waits for a rank that waits for it in turn; each follows the others' wait
 * records around the cycle back to itself, and all three fail naming it, instead of
 * warning for ever.
 */
Test(faults, a_cycle_of_waits_between_live_ranks_fails_naming_the_cycle, .timeout = 60)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 3, .deadline_s = 40 };
	harness_result res;

	cycle_heartbeats = true;
	harness_run(&o, body_cycle, sh, &res);
	cr_assert(!res.timed_out, "the cycle hung until the deadline");
	for (int r = 0; r < 3; r++) {
		fprintf(stderr, "live cycle: rank %d: %s\n", r, sh->err[r]);
		cr_expect_eq(res.status[r], 3, "rank %d exited %d: %s", r, res.status[r], sh->err[r]);
		/* The first to see it fails; the others get its error as the abort's cause. */
		cr_expect(strstr(sh->err[r], " wait for each other in a cycle (this rank for ") !=
		          NULL && strstr(sh->err[r], "not alive") == NULL, "rank %d: %s", r,
		          sh->err[r]);
	}
	harness_shared_free(sh, sizeof(*sh));
}

/*
 * A job that finalizes and initializes again (Horovod's shutdown() then init(), or a rank
 * script that runs two programs in turn) meets in a fresh generation of the store: the
 * second init must not read the first one's addresses or its abort notice. Rank 1 re-inits
 * late, so a stale address of rank 1 would be read by rank 0 if generations were shared.
 */
static int body_reinit(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];

	(void)n;
	for (int round = 0; round < 3; round++) {
		khor_comm *comm;
		float v = (float)(rank + 1), sum = 0;

		if (rank == 1 && round > 0)
			usleep(300 * 1000);
		if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS) {
			snprintf(sh->err[rank], TEXT, "init %d: %s", round, err);
			return 10 + round;
		}
		if (khor_allreduce(comm, &v, &sum, 1, KHOR_FLOAT32, KHOR_SUM) != KHOR_SUCCESS) {
			snprintf(sh->err[rank], TEXT, "allreduce %d: %s", round, khor_comm_error(comm));
			khor_finalize(comm);
			return 20 + round;
		}
		/* One round fails on purpose: its abort notice must not leak into the next. */
		if (round == 1) {
			float big[4] = { 0 };
			size_t count = rank == 0 ? 4 : 2;
			(void)khor_allreduce(comm, big, big, count, KHOR_FLOAT32, KHOR_SUM);
		}
		khor_finalize(comm);
		if (sum != 3.0f) {
			snprintf(sh->err[rank], TEXT, "round %d: sum %g, want 3", round, (double)sum);
			return 30 + round;
		}
	}
	return 0;
}

/* Runs body on 2 ranks; both must exit 0 within deadline_s. The caller frees the result. */
static struct shared *run_pair(harness_body body, double deadline_s)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	harness_opts o = { .n = 2, .timeout = "10s", .deadline_s = deadline_s };
	harness_result res;

	harness_run(&o, body, sh, &res);
	cr_assert(!res.timed_out, "hung");
	for (int r = 0; r < 2; r++)
		cr_assert_eq(res.status[r], 0, "rank %d exited %d: %s", r, res.status[r], sh->err[r]);
	return sh;
}

Test(faults, finalize_then_init_again_meets_in_a_fresh_generation, .timeout = 120)
{
	harness_shared_free(run_pair(body_reinit, 90), sizeof(struct shared));
}

/* Rank 0 inits a second time, rank 1 does not: rank 0 is told who is missing and why. */
static int body_reinit_alone(int rank, int n, khor_config *cfg, void *arg)
{
	struct shared *sh = arg;
	char err[TEXT];
	khor_comm *comm;

	(void)n;
	khor_config_set(cfg, "KHOR_INIT_TIMEOUT", "2s");
	if (khor_init(cfg, err, sizeof(err), &comm) != KHOR_SUCCESS)
		return 10;
	khor_finalize(comm);
	if (rank == 1)
		return 0;
	if (khor_init(cfg, err, sizeof(err), &comm) == KHOR_SUCCESS) {
		khor_finalize(comm);
		return 11; /* nobody to meet: must not succeed */
	}
	snprintf(sh->err[rank], TEXT, "%s", err);
	return 0;
}

Test(faults, init_again_without_the_others_names_them, .timeout = 60)
{
	struct shared *sh = run_pair(body_reinit_alone, 40);

	cr_expect_not_null(strstr(sh->err[0], "ranks that never came: 1"), "%s", sh->err[0]);
	cr_expect_not_null(strstr(sh->err[0], "init number 2"), "%s", sh->err[0]);
	harness_shared_free(sh, sizeof(*sh));
}
