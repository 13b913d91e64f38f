/*
 * exec.c -- running collectives in call order.
 *
 * Ranks must execute a comm's collectives in the same order, so each call takes the next
 * sequence number when it is made. A blocking call with nothing queued runs inline on the
 * caller's thread (no hand-off on the latency path). Non-blocking calls go to the comm's
 * collective thread, started on first use, which runs the queue in order; a blocking call
 * made while the queue is not empty queues too and waits, so order is kept either way.
 * Only one collective runs at a time (`busy`), which is what lets the transport be used
 * without locks.
 */
#include "comm.h"

#include "../base/log.h"
#include "../collectives/rd.h"
#include "../collectives/reduce.h"
#include "../collectives/ring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * After a timeout, find the rank at the end of the waiting chain. Every rank that times
 * out records whom it waited for under "stuck/<rank>"; a rank that waits for someone who
 * is not stuck himself has found the culprit: alive perhaps, but not in the collective.
 * Without this, ranks two hops away would blame their innocent neighbour.
 */
static void blame_timeout(khor_comm *c, kerr *err)
{
	char key[32], val[16], chain[256];
	int cur = err->peer, hops = 0;
	size_t off = 0;
	kerr e;

	snprintf(key, sizeof(key), "stuck/%d", c->rank);
	snprintf(val, sizeof(val), "%d", err->peer);
	if (store_set(c->store, key, val, strlen(val), &e) != KHOR_SUCCESS)
		return;
	/* Let the other ranks, whose deadlines expire about now too, record theirs. */
	struct timespec ts = { 0, 500 * 1000 * 1000 };
	nanosleep(&ts, NULL);
	off += (size_t)snprintf(chain, sizeof(chain), "%d waited for %d", c->rank, cur);
	while (hops++ < c->size) {
		void *v;
		size_t len;
		snprintf(key, sizeof(key), "stuck/%d", cur);
		if (store_get(c->store, key, kdeadline_in_ms(0), &v, &len, &e) != KHOR_SUCCESS)
			break;
		int next = atoi(v);
		free(v);
		if (next < 0 || next >= c->size || next == c->rank)
			break;
		if (off + 32 < sizeof(chain))
			off += (size_t)snprintf(chain + off, sizeof(chain) - off, ", %d for %d", cur,
			                        next);
		cur = next;
	}
	kerr_prefix(err, "rank %d is not taking part (waiting chain: %s)", cur, chain);
}

static khor_status run_one(khor_comm *c, struct khor_request *r)
{
	kerr err;
	khor_status st;

	kerr_clear(&err);
	pthread_mutex_lock(&c->mu);
	st = c->err.status;
	pthread_mutex_unlock(&c->mu);
	if (st != KHOR_SUCCESS)
		return st; /* sticky: fail fast with the first error */
	switch (r->kind) {
	case COLL_ALLREDUCE:
	case COLL_BARRIER:
		if (c->size == 1) {
			if (r->sendbuf != r->recvbuf && r->count > 0)
				memmove(r->recvbuf, r->sendbuf, r->count * khor_dtype_size(r->dtype));
			return KHOR_SUCCESS;
		}
		if (allreduce_pick(&c->cc, (enum allreduce_algo)c->cc.algo,
		                   r->count * khor_dtype_size(r->dtype)) == ALGO_RD)
			st = rd_allreduce(&c->cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->op,
			                  r->seq, r->kind, &err);
		else
			st = ring_allreduce(&c->cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->op,
			                    r->seq, r->kind, &err);
		break;
	case COLL_BROADCAST:
		if (c->size == 1)
			return KHOR_SUCCESS;
		st = chain_broadcast(&c->cc, r->recvbuf, r->count, r->dtype, r->root, r->seq, &err);
		break;
	default:
		st = kerr_set(&err, KHOR_ERR_INTERNAL, "unknown collective kind %u", r->kind);
	}
	if (st == KHOR_ERR_TIMEOUT && err.peer >= 0 && c->store != NULL)
		blame_timeout(c, &err);
	if (st == KHOR_ERR_REMOTE && c->store != NULL &&
	    strstr(err.text, "aborted by another rank") == NULL) {
		/*
		 * A closed or reset link is usually the echo of a failure elsewhere. Give the rank
		 * that failed first a moment to publish its cause, so we report that, not "reset".
		 */
		void *v;
		size_t len;
		kerr e;
		if (store_get(c->store, "abort", kdeadline_in_ms(300), &v, &len, &e) == KHOR_SUCCESS) {
			char mine[KERR_TEXT_MAX];
			kstrlcpy(mine, err.text, sizeof(mine));
			kerr_set(&err, KHOR_ERR_REMOTE, "the job was aborted by another rank: %s "
			         "(seen here as: %s)", (char *)v, mine);
			free(v);
		}
	}
	if (st != KHOR_SUCCESS)
		comm_fail(c, &err);
	return st;
}

static void *worker_main(void *arg)
{
	khor_comm *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (!c->worker_stop && (c->q_head == NULL || c->busy))
			pthread_cond_wait(&c->cv, &c->mu);
		if (c->q_head == NULL && c->worker_stop)
			break;
		if (c->q_head == NULL || c->busy)
			continue;
		struct khor_request *r = c->q_head;
		c->q_head = r->next;
		if (c->q_head == NULL)
			c->q_tail = NULL;
		c->busy = true;
		pthread_mutex_unlock(&c->mu);
		khor_status st = run_one(c, r);
		pthread_mutex_lock(&c->mu);
		r->status = st;
		r->done = true;
		c->busy = false;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

static void enqueue_locked(khor_comm *c, struct khor_request *r)
{
	r->next = NULL;
	if (c->q_tail != NULL)
		c->q_tail->next = r;
	else
		c->q_head = r;
	c->q_tail = r;
}

static khor_status start_worker_locked(khor_comm *c)
{
	if (c->worker_started)
		return KHOR_SUCCESS;
	if (pthread_create(&c->worker, NULL, worker_main, c) != 0)
		return KHOR_ERR_SYSTEM;
	c->worker_started = true;
	return KHOR_SUCCESS;
}

khor_status comm_submit(khor_comm *c, struct khor_request *r)
{
	khor_status st;

	pthread_mutex_lock(&c->mu);
	st = start_worker_locked(c);
	if (st == KHOR_SUCCESS) {
		r->comm = c;
		r->seq = c->next_seq++;
		r->done = false;
		enqueue_locked(c, r);
		pthread_cond_broadcast(&c->cv);
	} else {
		kerr_set(&c->last, st, "rank %d: cannot start the collective thread", c->rank);
	}
	pthread_mutex_unlock(&c->mu);
	return st;
}

khor_status comm_wait(khor_comm *c, struct khor_request *r)
{
	/*
	 * The collective enforces KHOR_TIMEOUT itself; this wait adds a margin for the
	 * collectives queued before it, each with its own deadline, and never waits forever.
	 */
	int64_t t = c->cfg.timeout_ms;
	kdeadline dl = kdeadline_in_ms(t < 0 ? -1 : t * 4 + 10000);
	khor_status st;

	pthread_mutex_lock(&c->mu);
	while (!r->done) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		if (!r->done && kdeadline_passed(dl)) {
			pthread_mutex_unlock(&c->mu);
			kerr e;
			kerr_set(&e, KHOR_ERR_TIMEOUT, "collective seq %u did not complete within the "
			         "wait deadline (KHOR_TIMEOUT x 4 + 10 s)", r->seq);
			comm_fail(c, &e);
			return KHOR_ERR_TIMEOUT;
		}
	}
	st = r->status;
	pthread_mutex_unlock(&c->mu);
	return st;
}

khor_status comm_run(khor_comm *c, struct khor_request *r)
{
	bool inline_run;

	pthread_mutex_lock(&c->mu);
	r->comm = c;
	r->seq = c->next_seq++;
	r->done = false;
	inline_run = c->q_head == NULL && !c->busy;
	if (inline_run) {
		c->busy = true;
	} else {
		/* Another thread is running one: queue behind it for the collective thread. */
		if (start_worker_locked(c) != KHOR_SUCCESS) {
			pthread_mutex_unlock(&c->mu);
			return kerr_set(&c->last, KHOR_ERR_SYSTEM, "rank %d: cannot start the "
			                "collective thread", c->rank);
		}
		enqueue_locked(c, r);
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	if (!inline_run)
		return comm_wait(c, r);
	khor_status st = run_one(c, r);
	pthread_mutex_lock(&c->mu);
	r->status = st;
	r->done = true;
	c->busy = false;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	return st;
}
