/*
 * alive.c -- the heartbeat thread (alive.h).
 */
#include "alive.h"

#include "base/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct alive {
	kctx *x;
	store *st;
	pthread_t thread;
	_Atomic bool stop;
};

/* How long one wait on the abort key lasts, so that a stop is seen this soon. */
#define ALIVE_SLICE_MS 100

/* The abort's text reached us: every comm of the context fails at its next check. */
static void alive_abort(kctx *x, const void *text, size_t len)
{
	if (len >= sizeof(x->abort_text))
		len = sizeof(x->abort_text) - 1;
	memcpy(x->abort_text, text, len);
	x->abort_text[len] = '\0';
	atomic_store_explicit(&x->aborted, true, memory_order_release);
	for (int i = 0; i < x->ntps; i++)
		if (x->tps[i].ops->wake != NULL)
			x->tps[i].ops->wake(x->tps[i].ctx);
}

static void check_update(struct alive *a)
{
	kctx *x = a->x;
	char key[48];
	void *v;
	size_t len;
	kerr e;

	store_set_prefix(a->st, x->cfg.job_id, 0);
	snprintf(key, sizeof(key), "el/update/%d", x->generation);
	if (store_get(a->st, key, kdeadline_in_ms(0), &v, &len, &e) == KHOR_SUCCESS) {
		int bits = (strstr(v, "added") ? 1 : 0) | (strstr(v, "removed") ? 2 : 0);
		atomic_store_explicit(&x->hosts_updated, bits ? bits : 3, memory_order_release);
		free(v);
	}
	store_set_prefix(a->st, x->cfg.job_id, x->generation);
}

static void *alive_main(void *arg)
{
	struct alive *a = arg;
	kctx *x = a->x;
	char key[32];
	bool warned = false;

	snprintf(key, sizeof(key), "hb/%d", x->rank);
	while (!atomic_load_explicit(&a->stop, memory_order_acquire)) {
		int64_t n;
		kerr e;
		if (store_add(a->st, key, 1, &n, &e) != KHOR_SUCCESS && !warned &&
		    !atomic_load(&a->stop)) {
			KLOG_WARN("heartbeat: %s (the others may take this rank for dead)", e.text);
			warned = true;
		}
		if (x->cfg.elastic && atomic_load(&x->hosts_updated) == 0)
			check_update(a);
		kdeadline next = kdeadline_in_ms(x->cfg.hb_interval_ms);
		while (!kdeadline_passed(next) && !atomic_load(&a->stop)) {
			int64_t slice = kdeadline_left_ms(next, ALIVE_SLICE_MS);
			void *v;
			size_t len;
			/* Once the abort is seen, or while the store is gone, only the beat goes on. */
			khor_status st = KHOR_ERR_SYSTEM;
			if (!atomic_load_explicit(&x->aborted, memory_order_relaxed))
				st = store_get(a->st, "abort", kdeadline_in_ms(slice), &v, &len, &e);
			if (st == KHOR_SUCCESS) {
				alive_abort(x, v, len);
				free(v);
			} else if (st != KHOR_ERR_TIMEOUT && !atomic_load(&a->stop)) {
				struct timespec ts = { 0, slice * 1000000 };
				nanosleep(&ts, NULL);
			}
		}
	}
	return NULL;
}

khor_status alive_start(kctx *x, kerr *err)
{
	const settings *s = &x->cfg;
	struct alive *a = calloc(1, sizeof(*a));
	khor_status st;

	if (a == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "heartbeat: out of memory");
	a->x = x;
	st = store_connect(x->store_addr, s->secret, s->job_id, kdeadline_in_ms(s->init_timeout_ms),
	                   &a->st, err);
	if (st != KHOR_SUCCESS) {
		free(a);
		kerr_prefix(err, "heartbeat");
		return st;
	}
	store_set_prefix(a->st, s->job_id, x->generation);
	/* The first beat before init returns: a rank stopped right after it (SIGSTOP, a
	 * debugger) has a counter that stands still, which khorrun's watch judges; one that
	 * never beat counts as still starting there, and only the waiting ranks would judge it
	 * (seen under ASan: 20 allreduces ran before the thread's first beat). */
	char key[32];
	int64_t n;
	snprintf(key, sizeof(key), "hb/%d", x->rank);
	if ((st = store_add(a->st, key, 1, &n, err)) != KHOR_SUCCESS) {
		store_close(a->st);
		free(a);
		kerr_prefix(err, "heartbeat");
		return st;
	}
	int rc = pthread_create(&a->thread, NULL, alive_main, a);
	if (rc != 0) {
		store_close(a->st);
		free(a);
		return kerr_set(err, KHOR_ERR_SYSTEM, "heartbeat: pthread_create: %s", strerror(rc));
	}
	x->alive = a;
	return KHOR_SUCCESS;
}

void alive_stop(kctx *x)
{
	struct alive *a = x->alive;

	if (a == NULL)
		return;
	atomic_store_explicit(&a->stop, true, memory_order_release);
	/*
	 * The thread is most likely parked in its long get of the abort key: cut it short
	 * rather than wait out the slice, which every finalize (and every elastic reset) would
	 * pay. Its connection is then dead, so the counter below goes through the context's.
	 */
	store *via = a->st;
	if (x->store != NULL) {
		store_interrupt(a->st);
		via = x->store;
		store_set_prefix(via, x->cfg.job_id, x->generation);
	}
	pthread_join(a->thread, NULL);
	/*
	 * A rank that left beats no more: its counter goes with it, so that a launcher's
	 * watcher (launcher/watch.c) does not take a process that goes on after khor_finalize,
	 * or an elastic worker between two generations, for one that stopped answering.
	 */
	char key[32];
	kerr e;
	snprintf(key, sizeof(key), "hb/%d", x->rank);
	(void)store_del(via, key, &e);
	store_close(a->st);
	free(a);
	x->alive = NULL;
}
