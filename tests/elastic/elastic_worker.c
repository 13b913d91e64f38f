/*
 * elastic_worker.c -- a real elastic worker for the driver's tests, written against the
 * public C API only (include/khor.h), as a training script would be: khor_init, then steps
 * of allreduce whose results it checks; on KHOR_ERR_MEMBERSHIP (a rank lost, or the hosts
 * changed at its check) it finalizes and calls khor_init again, keeping its step count in
 * memory; on KHOR_ERR_REMOVED it exits 0. After a join every rank takes the largest step
 * count of the generation (a fresh worker starts where the survivors are), so all finish
 * together.
 *
 * usage: elastic_worker STEPS STEP_MS
 * EW_EXIT=WORKER@STEP: that worker exits 1 when it reaches STEP.
 * EW_STOP=FILE: once FILE exists on any rank's host, every rank finishes at the same step
 * (so a test ends the job when it has seen what it came for).
 * EW_STOP_REJOIN=WORKER: that worker stops itself (SIGSTOP) the first time it has left a
 * generation that failed, before its khor_init for the next one.
 *
 * It prints one line per event, each with its worker id, for the tests to read:
 *   up W pid P rank R size S host H elastic E | join W gen G rank R size S local L/LS step K
 *   lost W gen G: TEXT
 *   hosts W gen G updated F | removed W: TEXT | done W gen G rank R size S steps N
 * and "FAIL W ..." (exit 2) when something is wrong that the tests must see.
 */
#include "khor.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N 256

static const char *id;

static void nap(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* A failed call: a membership change is expected (go round again), anything else is not. */
static int failed(khor_comm *c, khor_status st, const char *what)
{
	if (st == KHOR_ERR_MEMBERSHIP) {
		printf("lost %s gen %d: %s\n", id, khor_generation(c), khor_comm_error(c));
		return 0;
	}
	printf("FAIL %s gen %d: %s: %s: %s\n", id, khor_generation(c), what, khor_strerror(st),
	       khor_comm_error(c));
	exit(2);
}

int main(int argc, char **argv)
{
	const char *ex = getenv("EW_EXIT"), *stop = getenv("EW_STOP");
	const char *stop_rejoin = getenv("EW_STOP_REJOIN");
	long steps = argc > 1 ? atol(argv[1]) : 100, exit_at = -1;
	int step_ms = argc > 2 ? atoi(argv[2]) : 10;
	int64_t step = 0;
	char err[1024];

	setvbuf(stdout, NULL, _IOLBF, 0);
	id = getenv("KHOR_WORKER_ID");
	if (id == NULL) {
		printf("FAIL no KHOR_WORKER_ID\n");
		return 2;
	}
	if (ex != NULL && strncmp(ex, id, strlen(id)) == 0 && ex[strlen(id)] == '@')
		exit_at = atol(ex + strlen(id) + 1);
	/* What it was started with, as horovodrun's scripts read it. */
	printf("up %s pid %d rank %s size %s host %s elastic %s\n", id, (int)getpid(),
	       getenv("HOROVOD_RANK"), getenv("HOROVOD_SIZE"), getenv("HOROVOD_HOSTNAME"),
	       getenv("HOROVOD_ELASTIC"));
	for (;;) {
		khor_comm *c;
		khor_status st = khor_init(NULL, err, sizeof(err), &c);
		int64_t got;
		int rank, size;

		if (st == KHOR_ERR_REMOVED) {
			printf("removed %s: %s\n", id, err);
			return 0;
		}
		if (st != KHOR_SUCCESS) {
			printf("FAIL %s init: %s: %s\n", id, khor_strerror(st), err);
			return 2;
		}
		rank = khor_rank(c);
		size = khor_size(c);
		st = khor_allreduce(c, &step, &got, 1, KHOR_INT64, KHOR_MAX);
		if (st != KHOR_SUCCESS) {
			failed(c, st, "step sync");
			khor_finalize(c);
			continue;
		}
		step = got;
		printf("join %s gen %d rank %d size %d local %d/%d step %lld\n", id,
		       khor_generation(c), rank, size, khor_local_rank(c), khor_local_size(c),
		       (long long)step);
		while (step < steps) {
			float send[N], recv[N];
			int32_t flags = khor_hosts_updated(c), any;

			if (stop != NULL && access(stop, F_OK) == 0)
				flags |= 256;
			/* The commit's check: every rank learns of a host change at one step. */
			st = khor_allreduce(c, &flags, &any, 1, KHOR_INT32, KHOR_MAX);
			if (st != KHOR_SUCCESS)
				break;
			if (any & 256) {
				steps = step;
				break;
			}
			if (any != 0) {
				printf("hosts %s gen %d updated %d\n", id, khor_generation(c),
				       (int)any);
				break;
			}
			for (int i = 0; i < N; i++)
				send[i] = (float)(rank + 1 + i);
			st = khor_allreduce(c, send, recv, N, KHOR_FLOAT32, KHOR_SUM);
			if (st != KHOR_SUCCESS)
				break;
			for (int i = 0; i < N; i++) {
				float want = (float)size * (float)(size + 1) / 2.0f +
				             (float)size * (float)i;

				if (recv[i] != want) {
					printf("FAIL %s gen %d step %lld: element %d is %g, "
					       "not %g\n", id, khor_generation(c), (long long)step, i,
					       recv[i], want);
					return 2;
				}
			}
			step++;
			if (step == exit_at) {
				printf("exit1 %s gen %d step %lld\n", id, khor_generation(c),
				       (long long)step);
				return 1;
			}
			nap(step_ms);
		}
		if (step < steps) {
			if (st != KHOR_SUCCESS)
				failed(c, st, "allreduce");
			khor_finalize(c);
			if (stop_rejoin != NULL && strcmp(stop_rejoin, id) == 0) {
				stop_rejoin = NULL;
				printf("between %s: stopping\n", id);
				raise(SIGSTOP);
			}
			continue;
		}
		printf("done %s gen %d rank %d size %d steps %lld\n", id, khor_generation(c), rank,
		       size, (long long)step);
		khor_finalize(c);
		return 0;
	}
}
