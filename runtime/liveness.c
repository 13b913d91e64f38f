/*
 * liveness.c -- judging the peers of a wait past KHOR_TIMEOUT by their heartbeats
 * (liveness.h).
 *
 * A heartbeat is a counter in the store that its rank's thread adds 1 to every
 * KHOR_HEARTBEAT_INTERVAL. Its value says nothing about when it moved: only this rank's
 * reads of it, timed on this rank's monotonic clock (never a wall clock, which another host
 * may have set differently), do. For each peer the context keeps the last value read, the
 * read that first saw it and the read before that one, so the beat that made it came
 * between those two. Then
 *   - not alive: unchanged for KHOR_HEARTBEAT_TIMEOUT of reads (silent at least that long);
 *   - alive: it changed since a read less than KHOR_HEARTBEAT_TIMEOUT ago;
 *   - neither yet (the first read of it, or the last one long ago): read again after an
 *     interval, which decides within one beat for a live peer.
 * The table lives as long as the context, so a later wait starts from what earlier ones saw.
 * Reads are gets of one key each, made only by waits that passed KHOR_TIMEOUT.
 */
#include "liveness.h"

#include "base/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct seen {
	int64_t count;      /* the value last read; -1: the key was absent */
	uint64_t moved_ns;  /* the first read that saw count; 0: never read */
	uint64_t before_ns; /* the read before that one (the beat came after it); 0: none */
	uint64_t read_ns;   /* the last read */
	char host[64];      /* "" until read from "host/<rank>" */
};

struct liveness {
	pthread_mutex_t mu; /* over the table and the reads that fill it */
	int n;
	struct seen r[];
};

enum verdict { UNKNOWN, ALIVE, DEAD };

bool liveness_on(const kctx *x)
{
	return x->store != NULL && x->size > 1 && x->cfg.hb_timeout_ms > 0;
}

/* The context's table, made by the first check that needs it. */
static struct liveness *table(kctx *x)
{
	struct liveness *l = atomic_load_explicit(&x->live, memory_order_acquire);
	struct liveness *none = NULL;

	if (l != NULL)
		return l;
	l = calloc(1, sizeof(*l) + (size_t)x->size * sizeof(l->r[0]));
	if (l == NULL)
		return NULL;
	pthread_mutex_init(&l->mu, NULL);
	l->n = x->size;
	if (!atomic_compare_exchange_strong(&x->live, &none, l)) {
		pthread_mutex_destroy(&l->mu);
		free(l);
		l = none;
	}
	return l;
}

void liveness_free(kctx *x)
{
	struct liveness *l = atomic_exchange(&x->live, NULL);

	if (l == NULL)
		return;
	pthread_mutex_destroy(&l->mu);
	free(l);
}

/* Reads peer's counter into its entry (under l->mu). */
static khor_status observe(kctx *x, struct seen *p, int peer, kerr *err)
{
	char key[32];
	void *v;
	size_t len;
	int64_t count = -1;
	khor_status st;

	snprintf(key, sizeof(key), "hb/%d", peer);
	st = store_get(x->store, key, kdeadline_in_ms(0), &v, &len, err);
	if (st == KHOR_SUCCESS) {
		count = strtoll(v, NULL, 10);
		free(v);
	} else if (st != KHOR_ERR_TIMEOUT) {
		return st;
	}
	uint64_t now = kclock_ns();
	if (p->moved_ns == 0 || count != p->count) {
		p->before_ns = p->moved_ns != 0 ? p->read_ns : 0;
		p->moved_ns = now;
		p->count = count;
	}
	p->read_ns = now;
	if (p->host[0] == '\0') {
		snprintf(key, sizeof(key), "host/%d", peer);
		if (store_get(x->store, key, kdeadline_in_ms(0), &v, &len, err) == KHOR_SUCCESS) {
			snprintf(p->host, sizeof(p->host), "%.*s", (int)strcspn(v, "\t"), (char *)v);
			free(v);
		}
	}
	return KHOR_SUCCESS;
}

/*
 * What the reads of p say at now. *age_ns: for DEAD how long it has been silent at least,
 * for ALIVE how long ago its last beat was at most.
 */
static enum verdict judge(const struct seen *p, uint64_t now, uint64_t hb_ns, uint64_t *age_ns)
{
	if (now - p->moved_ns >= hb_ns) {
		*age_ns = now - p->moved_ns;
		return DEAD;
	}
	if (p->before_ns != 0 && now - p->before_ns < hb_ns) {
		*age_ns = now - p->before_ns;
		return ALIVE;
	}
	return UNKNOWN;
}

/* "rank 1 on node2, rank 3 on node4 and 12 more" for a warning. */
static void name_ranks(const struct liveness *l, const int *peers, int n, char *buf,
                       size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < n && i < 4 && off < len; i++) {
		const struct seen *p = &l->r[peers[i]];
		off += (size_t)snprintf(buf + off, len - off, "%srank %d on %s", i ? ", " : "",
		                        peers[i], p->host[0] ? p->host : "?");
	}
	if (n > 4 && off < len)
		snprintf(buf + off, len - off, " and %d more", n - 4);
}

static khor_status check_locked(kctx *x, struct liveness *l, const char *what, const int *peers,
                                int n, int64_t waited_ms, int64_t *again_ms, kerr *err)
{
	const uint64_t hb_ns = (uint64_t)x->cfg.hb_timeout_ms * 1000000ull;
	uint64_t oldest = 0;
	int worst = -1, unknown = 0;
	khor_status st;
	kerr e;

	for (int i = 0; i < n; i++) {
		int r = peers[i];
		if (r < 0 || r >= l->n || r == x->rank)
			continue;
		if ((st = observe(x, &l->r[r], r, &e)) != KHOR_SUCCESS) {
			kerr_set(err, KHOR_ERR_REMOTE, "%s: waited %lld ms (KHOR_TIMEOUT %lld ms) and "
			         "cannot read the heartbeats of the ranks it waits for: %s",
			         what != NULL ? what : "a wait", (long long)waited_ms,
			         (long long)x->cfg.timeout_ms, e.text);
			return KHOR_ERR_REMOTE;
		}
		uint64_t age, now = kclock_ns();
		enum verdict v = judge(&l->r[r], now, hb_ns, &age);
		if (v == DEAD) {
			const struct seen *p = &l->r[r];
			kerr_set(err, KHOR_ERR_REMOTE, "%s: rank %d on %s is not alive: no heartbeat for "
			         "%.1f s (stopped, hung or cut off%s); waited %.1f s for it (KHOR_TIMEOUT "
			         "%.1f s, KHOR_HEARTBEAT_TIMEOUT %.1f s)", what != NULL ? what : "a wait",
			         r, p->host[0] ? p->host : "?", (double)age / 1e9,
			         p->count < 0 ? "; it never beat, or it left with khor_finalize" : "",
			         (double)waited_ms / 1e3, (double)x->cfg.timeout_ms / 1e3,
			         (double)x->cfg.hb_timeout_ms / 1e3);
			err->peer = r;
			return KHOR_ERR_REMOTE;
		}
		if (v == UNKNOWN)
			unknown++;
		else if (age > oldest || worst < 0) {
			oldest = age;
			worst = r;
		}
	}
	if (unknown > 0 || worst < 0) {
		*again_ms = x->cfg.hb_interval_ms;
		return KHOR_SUCCESS;
	}
	*again_ms = x->cfg.timeout_ms;
	if (what != NULL) {
		char names[400];
		name_ranks(l, peers, n, names, sizeof(names));
		KLOG_WARN("%s: waited %.1f s (KHOR_TIMEOUT %.1f s) on %s: alive (heartbeat %lld ms "
		          "ago%s); waiting on: a slow rank is not killed, only one silent for "
		          "KHOR_HEARTBEAT_TIMEOUT (%.1f s)", what, (double)waited_ms / 1e3,
		          (double)x->cfg.timeout_ms / 1e3, names, (long long)(oldest / 1000000),
		          n > 1 ? ", the oldest of them" : "", (double)x->cfg.hb_timeout_ms / 1e3);
	}
	return KHOR_SUCCESS;
}

khor_status liveness_check(kctx *x, const char *what, const int *peers, int n,
                           int64_t waited_ms, int64_t *again_ms, kerr *err)
{
	struct liveness *l;
	int *all = NULL;
	khor_status st;

	if (!liveness_on(x))
		return kerr_set(err, KHOR_ERR_INTERNAL, "%s: no heartbeats to judge by",
		                what != NULL ? what : "a wait");
	if ((l = table(x)) == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory for the heartbeats",
		                what != NULL ? what : "a wait");
	if (peers == NULL) {
		if ((all = malloc((size_t)x->size * sizeof(int))) == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory",
			                what != NULL ? what : "a wait");
		n = 0;
		for (int r = 0; r < x->size; r++)
			if (r != x->rank)
				all[n++] = r;
		peers = all;
	}
	pthread_mutex_lock(&l->mu);
	st = check_locked(x, l, what, peers, n, waited_ms, again_ms, err);
	pthread_mutex_unlock(&l->mu);
	free(all);
	return st;
}

khor_status liveness_comm_check(void *owner, const char *what, const int *peers, int n,
                                int64_t waited_ms, int64_t *again_ms, kerr *err)
{
	khor_comm *c = owner;
	int *members = NULL;
	khor_status st;

	if (n == 0 && c->world_ranks != NULL) {
		if ((members = malloc((size_t)c->size * sizeof(int))) == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory",
			                what != NULL ? what : "a wait");
		for (int r = 0; r < c->size; r++)
			if (c->world_ranks[r] != c->ctx->rank)
				members[n++] = c->world_ranks[r];
		peers = members;
	} else if (n == 0) {
		peers = NULL; /* the world */
	}
	st = liveness_check(c->ctx, what, peers, n, waited_ms, again_ms, err);
	free(members);
	return st;
}

khor_status liveness_store_get(kctx *x, const char *what, const char *key, const int *peers,
                               int n, void **val_out, size_t *len_out, kerr *err)
{
	const uint64_t t0 = kclock_ns();
	kdeadline dl = kdeadline_in_ms(x->cfg.timeout_ms);

	for (;;) {
		khor_status st = store_get(x->store, key, dl, val_out, len_out, err);
		if (st != KHOR_ERR_TIMEOUT || !liveness_on(x))
			return st;
		int64_t again;
		kerr_clear(err);
		st = liveness_check(x, what, peers, n, (int64_t)((kclock_ns() - t0) / 1000000),
		                    &again, err);
		if (st != KHOR_SUCCESS)
			return st;
		dl = kdeadline_in_ms(again);
	}
}
