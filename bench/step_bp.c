/*
 * step_bp.c -- the backprop thread, as Horovod's DistributedOptimizer sees backward: it hands a
 * set's gradients to the engine last layer first, a compute gap apart, against absolute deadlines.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "step_bp.h"
#include "step_data.h"
#include "bench_stats.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int step_bp_start(struct step_ctx *x, int max_tensors)
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

void step_bp_stop(struct step_ctx *x)
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

void step_bp_run(struct step_ctx *x, khor_engine *e, const struct step_set *s, int gap_us)
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
