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
 *
 * Alive is not enough when the live peer waits for this rank in turn: two ranks in
 * different calls (one in a split, the other in an allreduce; create_group lists that
 * differ) wait for each other for ever. So a wait judged alive also publishes what it is
 * under "waits/<rank>": how often it has done so, how long it has got nowhere (no transfer
 * completed, by this rank's clock) and whom it waits for. A peer that published again since
 * this rank last looked, still waits for this rank and has got nowhere for KHOR_TIMEOUT,
 * while this wait got nowhere for as long, is deadlocked with it: the two fail. So do the
 * ranks of a longer cycle (0 waits for 1, 1 for 2, 2 for 0), found by following the
 * records of those stuck as long from the ranks this wait needs back to this rank. The one
 * thing that looks the same is a single transfer that takes longer than KHOR_TIMEOUT to
 * complete, or a link that carries nothing any more, which is worth an error too.
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
	int64_t wcount;     /* its wait record's count when last read; -1: never read */
	bool left;          /* its counter was there and is gone: it left with khor_finalize */
};

struct liveness {
	pthread_mutex_t mu; /* over the table and the reads that fill it */
	int n;
	/* This rank's wait as it last published it; one at a time (threads take turns). */
	uint64_t token;     /* what it is and how far it got */
	uint64_t token_ns;  /* the first check that saw token: stuck since then at least */
	int64_t count;      /* how often "waits/<rank>" was written */
	int64_t warned_ms;  /* the wait's length at its last warning */
	struct seen r[];
};

/* A peer's wait record, as published by publish(). */
#define RECORD_PEERS 32 /* a wait publishes at most this many of whom it waits for */

struct record {
	int64_t count, stuck_ms;
	bool lists_me;
	int npeers;
	int peers[RECORD_PEERS];
	char what[96];
};

enum verdict { UNKNOWN, ALIVE, DEAD, LEFT };

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
	for (int r = 0; r < l->n; r++)
		l->r[r].wcount = -1;
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
	/* alive_stop removes the counter, and a context's rank never beats again. */
	p->left = p->left || (p->moved_ns != 0 && p->count >= 0 && count < 0);
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
	if (p->left)
		return LEFT;
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

/* FNV-1a of what, with the wait's progress folded in. */
static uint64_t wait_token(const coll_alive_ask *q)
{
	uint64_t h = 1469598103934665603ull;

	for (const char *p = q->what; *p != '\0'; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	return h ^ (q->progress * 0x9e3779b97f4a7c15ull);
}

/* Writes this rank's wait as "<count> <stuck ms> <peer,peer,...> <what>". */
static void publish(kctx *x, struct liveness *l, const coll_alive_ask *q, int64_t stuck_ms)
{
	char v[512], key[32];
	size_t off;
	kerr e;

	off = (size_t)snprintf(v, sizeof(v), "%lld %lld ", (long long)++l->count,
	                       (long long)stuck_ms);
	for (int i = 0; i < q->n && i < RECORD_PEERS && off < sizeof(v) - 120; i++)
		off += (size_t)snprintf(v + off, sizeof(v) - off, "%s%d", i ? "," : "", q->peers[i]);
	snprintf(v + off, sizeof(v) - off, " %.96s", q->what);
	snprintf(key, sizeof(key), "waits/%d", x->rank);
	(void)store_set(x->store, key, v, strlen(v), &e);
}

/* Peer's wait record; false when it has none (or it does not parse). */
static bool read_record(kctx *x, int peer, struct record *rec)
{
	char key[32];
	void *v;
	size_t len;
	int used = 0;
	long long count, stuck;
	kerr e;

	snprintf(key, sizeof(key), "waits/%d", peer);
	if (store_get(x->store, key, kdeadline_in_ms(0), &v, &len, &e) != KHOR_SUCCESS)
		return false;
	bool ok = sscanf(v, "%lld %lld %n", &count, &stuck, &used) == 2 && used > 0;
	if (ok) {
		const char *p = (const char *)v + used, *end = p + strcspn(p, " ");
		rec->count = count;
		rec->stuck_ms = stuck;
		rec->lists_me = false;
		rec->npeers = 0;
		while (p < end) {
			int r = atoi(p);
			if (r == x->rank)
				rec->lists_me = true;
			if (rec->npeers < RECORD_PEERS && r >= 0 && r < x->size)
				rec->peers[rec->npeers++] = r;
			p += strcspn(p, ",");
			p += *p == ',';
		}
		snprintf(rec->what, sizeof(rec->what), "%s", *end == ' ' ? end + 1 : "?");
	}
	free(v);
	return ok;
}

/* A rank's wait record as one look at the records saw it: read once per look, so its
 * freshness (published again since the last look) is judged once. */
struct look {
	int rank;
	bool has, fresh;
	struct record rec;
};

#define LOOK_MAX 64   /* records one look reads at most */
#define CYCLE_MAX 16  /* the longest cycle of waits it follows */

static struct look *look_at(kctx *x, struct liveness *l, struct look *seen, int *nseen, int r)
{
	for (int i = 0; i < *nseen; i++)
		if (seen[i].rank == r)
			return &seen[i];
	if (*nseen == LOOK_MAX)
		return NULL;
	struct look *k = &seen[(*nseen)++];
	struct seen *p = &l->r[r];
	k->rank = r;
	k->has = read_record(x, r, &k->rec);
	k->fresh = k->has && p->wcount >= 0 && k->rec.count > p->wcount;
	if (k->has)
		p->wcount = k->rec.count;
	return k;
}

/*
 * A cycle of stuck waits through this rank longer than two: a path of ranks from one this
 * wait needs, each waiting (for at least t) for the next, back to this rank. Depth first
 * over the records; path[0..*len) are the ranks after this one. True when found.
 */
static bool find_cycle(kctx *x, struct liveness *l, const coll_alive_ask *q, int64_t t,
                       struct look *seen, int *nseen, struct look **path, int *len)
{
	int next[CYCLE_MAX];

	for (int i = 0; i < q->n; i++) {
		int r = q->peers[i];
		if (r < 0 || r >= l->n || r == x->rank)
			continue;
		struct look *k = look_at(x, l, seen, nseen, r);
		if (k == NULL || !k->has || k->rec.stuck_ms < t)
			continue;
		int depth = 0;
		path[0] = k;
		next[0] = 0;
		while (depth >= 0) {
			struct look *at = path[depth];
			if (next[depth] >= at->rec.npeers) {
				depth--;
				continue;
			}
			int v = at->rec.peers[next[depth]++];
			if (v == x->rank) {
				if (depth >= 1) { /* two ranks: the direct look's case */
					*len = depth + 1;
					return true;
				}
				continue;
			}
			bool on_path = false;
			for (int j = 0; j <= depth; j++)
				on_path |= path[j]->rank == v;
			if (on_path || depth + 1 == CYCLE_MAX)
				continue;
			struct look *w = look_at(x, l, seen, nseen, v);
			if (w == NULL || !w->has || w->rec.stuck_ms < t)
				continue;
			path[++depth] = w;
			next[depth] = 0;
		}
	}
	return false;
}

/*
 * This wait, judged alive, publishes itself and looks at its peers' records: the peer
 * deadlocked with it (KHOR_ERR_REMOTE), or a longer cycle of waits through it, or
 * KHOR_SUCCESS and *mutual when some peer waits for this rank too, directly or around a
 * cycle not yet confirmed (then both look again soon).
 */
static khor_status look_for_deadlock(kctx *x, struct liveness *l, const coll_alive_ask *q,
                                     bool *mutual, kerr *err)
{
	const uint64_t now = kclock_ns(), token = wait_token(q);
	const int64_t t = x->cfg.timeout_ms;
	struct look *seen = malloc(LOOK_MAX * sizeof(*seen)), *path[CYCLE_MAX];
	int nseen = 0, len = 0;

	if (seen == NULL)
		return KHOR_SUCCESS; /* no look this time; the wait goes on and looks again */
	if (token != l->token) {
		l->token = token;
		l->token_ns = now;
	}
	int64_t stuck_ms = (int64_t)((now - l->token_ns) / 1000000);
	publish(x, l, q, stuck_ms);
	for (int i = 0; i < q->n; i++) {
		int r = q->peers[i];
		struct seen *p = &l->r[r];
		if (r < 0 || r >= l->n || r == x->rank)
			continue;
		struct look *k = look_at(x, l, seen, &nseen, r);
		if (k == NULL || !k->has || !k->rec.lists_me)
			continue;
		*mutual = true;
		if (k->fresh && k->rec.stuck_ms >= t && stuck_ms >= t) {
			kerr_set(err, KHOR_ERR_REMOTE, "%s: rank %d on %s waits for this rank in turn (in "
			         "%s), and neither has got on for %.1f s (KHOR_TIMEOUT %.1f s): a "
			         "deadlock, the two being in different calls (another collective or "
			         "comm, another order, create_group lists that differ), or a link "
			         "between them that carries nothing", q->what, r,
			         p->host[0] ? p->host : "?", k->rec.what,
			         (double)(stuck_ms < k->rec.stuck_ms ? stuck_ms : k->rec.stuck_ms) / 1e3,
			         (double)t / 1e3);
			err->peer = r;
			free(seen);
			return KHOR_ERR_REMOTE;
		}
	}
	if (stuck_ms >= t && find_cycle(x, l, q, t, seen, &nseen, path, &len)) {
		bool fresh = true;
		for (int i = 0; i < len; i++)
			fresh &= path[i]->fresh;
		*mutual = true;
		if (fresh) {
			char who[160], chain[600];
			size_t w = (size_t)snprintf(who, sizeof(who), "%d", x->rank);
			size_t c = (size_t)snprintf(chain, sizeof(chain), "this rank for %d",
			                            path[0]->rank);
			for (int i = 0; i < len; i++) {
				if (w < sizeof(who))
					w += (size_t)snprintf(who + w, sizeof(who) - w, "%s%d",
					                      i + 1 == len ? " and " : ", ", path[i]->rank);
				if (c < sizeof(chain))
					c += (size_t)snprintf(chain + c, sizeof(chain) - c, ", %d for %d (in %.60s)",
					                      path[i]->rank,
					                      i + 1 == len ? x->rank : path[i + 1]->rank,
					                      path[i]->rec.what);
			}
			kerr_set(err, KHOR_ERR_REMOTE, "%s: ranks %s wait for each other in a cycle (%s), "
			         "and none has got on for %.1f s (KHOR_TIMEOUT %.1f s): a deadlock, the "
			         "ranks being in different calls (another collective or comm, another "
			         "order, create_group lists that differ)", q->what, who, chain,
			         (double)stuck_ms / 1e3, (double)t / 1e3);
			err->peer = path[0]->rank;
			free(seen);
			return KHOR_ERR_REMOTE;
		}
	}
	free(seen);
	return KHOR_SUCCESS;
}

/* known: the wait named whom it needs (not the whole job or comm): it may be deadlocked. */
static khor_status check_locked(kctx *x, struct liveness *l, const coll_alive_ask *q,
                                bool known, int64_t *again_ms, kerr *err)
{
	const uint64_t hb_ns = (uint64_t)x->cfg.hb_timeout_ms * 1000000ull;
	const char *what = q->what != NULL ? q->what : "a wait";
	uint64_t oldest = 0;
	int worst = -1, unknown = 0;
	bool mutual = false;
	khor_status st;
	kerr e;

	for (int i = 0; i < q->n; i++) {
		int r = q->peers[i];
		if (r < 0 || r >= l->n || r == x->rank)
			continue;
		if ((st = observe(x, &l->r[r], r, &e)) != KHOR_SUCCESS) {
			kerr_set(err, KHOR_ERR_REMOTE, "%s: waited %lld ms (KHOR_TIMEOUT %lld ms) and "
			         "cannot read the heartbeats of the ranks it waits for: %s", what,
			         (long long)q->waited_ms, (long long)x->cfg.timeout_ms, e.text);
			return KHOR_ERR_REMOTE;
		}
		uint64_t age, now = kclock_ns();
		enum verdict v = judge(&l->r[r], now, hb_ns, &age);
		if (v == DEAD) {
			const struct seen *p = &l->r[r];
			kerr_set(err, KHOR_ERR_REMOTE, "%s: rank %d on %s is not alive: no heartbeat for "
			         "%.1f s (stopped, hung or cut off%s); waited %.1f s for it (KHOR_TIMEOUT "
			         "%.1f s, KHOR_HEARTBEAT_TIMEOUT %.1f s)", what, r,
			         p->host[0] ? p->host : "?", (double)age / 1e9,
			         p->count < 0 ? "; it never beat, or it left with khor_finalize" : "",
			         (double)q->waited_ms / 1e3, (double)x->cfg.timeout_ms / 1e3,
			         (double)x->cfg.hb_timeout_ms / 1e3);
			err->peer = r;
			return KHOR_ERR_REMOTE;
		}
		if (v == LEFT) {
			kerr_set(err, KHOR_ERR_REMOTE, "%s: rank %d on %s left the job (khor_finalize) "
			         "while this rank waits for it, %.1f s so far: it did not make the same "
			         "calls", what, r, l->r[r].host[0] ? l->r[r].host : "?",
			         (double)q->waited_ms / 1e3);
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
	if (known && q->what != NULL &&
	    (st = look_for_deadlock(x, l, q, &mutual, err)) != KHOR_SUCCESS)
		return st;
	*again_ms = mutual ? x->cfg.hb_interval_ms : x->cfg.timeout_ms;
	if (q->what != NULL && !q->quiet &&
	    (q->waited_ms < l->warned_ms || q->waited_ms - l->warned_ms >= x->cfg.timeout_ms)) {
		char names[400];
		l->warned_ms = q->waited_ms;
		name_ranks(l, q->peers, q->n, names, sizeof(names));
		KLOG_WARN("%s: waited %.1f s (KHOR_TIMEOUT %.1f s) on %s: alive (heartbeat %lld ms "
		          "ago%s); waiting on: a slow rank is not killed, only one silent for "
		          "KHOR_HEARTBEAT_TIMEOUT (%.1f s)", what, (double)q->waited_ms / 1e3,
		          (double)x->cfg.timeout_ms / 1e3, names, (long long)(oldest / 1000000),
		          q->n > 1 ? ", the oldest of them" : "", (double)x->cfg.hb_timeout_ms / 1e3);
	}
	return KHOR_SUCCESS;
}

/* liveness_check, with whom the wait needs made explicit: known as above. */
static khor_status check(kctx *x, const coll_alive_ask *q, bool known, int64_t *again_ms,
                         kerr *err)
{
	const char *what = q->what != NULL ? q->what : "a wait";
	coll_alive_ask all = *q;
	struct liveness *l;
	int *every = NULL;
	khor_status st;

	if (!liveness_on(x))
		return kerr_set(err, KHOR_ERR_INTERNAL, "%s: no heartbeats to judge by", what);
	if ((l = table(x)) == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory for the heartbeats", what);
	if (q->peers == NULL) {
		if ((every = malloc((size_t)x->size * sizeof(int))) == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory", what);
		all.n = 0;
		for (int r = 0; r < x->size; r++)
			if (r != x->rank)
				every[all.n++] = r;
		all.peers = every;
	}
	pthread_mutex_lock(&l->mu);
	st = check_locked(x, l, &all, known, again_ms, err);
	pthread_mutex_unlock(&l->mu);
	free(every);
	return st;
}

khor_status liveness_check(kctx *x, const coll_alive_ask *q, int64_t *again_ms, kerr *err)
{
	return check(x, q, q->peers != NULL, again_ms, err);
}

khor_status liveness_comm_check(void *owner, const coll_alive_ask *q, int64_t *again_ms,
                                kerr *err)
{
	khor_comm *c = owner;
	coll_alive_ask mine = *q;
	int *members = NULL;
	khor_status st;

	if (q->peers == NULL && c->world_ranks != NULL) {
		if ((members = malloc((size_t)c->size * sizeof(int))) == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory",
			                q->what != NULL ? q->what : "a wait");
		mine.n = 0;
		for (int r = 0; r < c->size; r++)
			if (c->world_ranks[r] != c->ctx->rank)
				members[mine.n++] = c->world_ranks[r];
		mine.peers = members;
	}
	st = check(c->ctx, &mine, q->peers != NULL, again_ms, err);
	free(members);
	return st;
}

khor_status liveness_store_get(kctx *x, const char *what, const char *key, const int *peers,
                               int n, void **val_out, size_t *len_out, kerr *err)
{
	const uint64_t t0 = kclock_ns();
	kdeadline dl = kdeadline_in_ms(x->cfg.timeout_ms);
	char call[128];

	/* The key in the wait's name: another call of the same kind is another wait. */
	snprintf(call, sizeof(call), "%s (waiting for %s)", what, key);
	for (;;) {
		khor_status st = store_get(x->store, key, dl, val_out, len_out, err);
		if (st != KHOR_ERR_TIMEOUT || !liveness_on(x))
			return st;
		int64_t again;
		coll_alive_ask q = { .what = call, .peers = peers, .n = n,
		                     .waited_ms = (int64_t)((kclock_ns() - t0) / 1000000) };
		kerr_clear(err);
		if ((st = liveness_check(x, &q, &again, err)) != KHOR_SUCCESS)
			return st;
		/* Waiting on past KHOR_TIMEOUT, look for the job's end as a collective does. */
		khor_comm *w = x->world;
		if (w != NULL && w->cc.check_abort != NULL &&
		    (st = w->cc.check_abort(w, err)) != KHOR_SUCCESS)
			return st;
		dl = kdeadline_in_ms(again < 1000 ? again : 1000);
	}
}
