/*
 * split.c -- comms made from comms: khor_comm_split and khor_comm_create_group.
 *
 * A new comm is only a list of world ranks, an id and its own state: it borrows the
 * context's links, so making one opens no socket. What the members must agree on is who
 * is in it, in which order, and its id, which must differ from every other comm's that
 * shares a link with it: ids come from one counter in the store ("comm_ids"), COMM_IDS at a
 * time (comm.h), so they are unique in the job and have no limit short of 2^32.
 *
 * split, on the parent's order of calls (it takes two of its sequence numbers):
 *   1. an allreduce(sum) over the parent of an n x 2 table in which each rank fills its
 *      own row with (color, key): everyone learns every rank's color and key;
 *   2. parent rank 0 counts the colors and takes COMM_IDS ids per color from the store in
 *      one round trip, and a second allreduce gives everyone the first of them;
 *   3. each rank makes its comm: the ranks of its color by key, then parent rank, and the
 *      id of its color's place among the colors.
 * One store round trip in all, on one rank. Both exchanges carry the kind COLL_SPLIT in
 * their frames, so a rank that splits while the others run another collective on the
 * parent fails on the first frame instead of mixing data.
 *
 * create_group, called only by the listed ranks, so it cannot use the parent's order:
 * they meet in the store under "cg/<parent id>/<hash of the list>/<k>" (the k-th such call
 * with that list on that parent, counted by each rank). The list's first rank takes the
 * ids and publishes them with its list; each other member reads it (one round trip),
 * checks that the lists are the same and counts itself in "<key>/ok"; the member that
 * completes the count sets "<key>/all", which the first rank waits for before it returns,
 * and then deletes the three keys (every member is past reading them).
 * A member whose list differs meets nobody, or meets a different list: past KHOR_TIMEOUT
 * it warns, naming the member it waits for, and fails once that one is not alive
 * (liveness.h) or, without heartbeats to judge by, at KHOR_TIMEOUT with the reason; so
 * does the first rank then.
 */
#include "comm.h"
#include "liveness.h"

#include "base/log.h"
#include "collectives/rd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* count ids in a row from the job's counter; the first is COMM_IDS past the world's. */
static khor_status take_ids(kctx *x, uint32_t count, uint32_t *first_out, kerr *err)
{
	int64_t v;
	khor_status st;

	if (x->store == NULL) {
		*first_out = COMM_IDS + x->local_ids;
		x->local_ids += count;
		return KHOR_SUCCESS;
	}
	st = store_add(x->store, "comm_ids", count, &v, err);
	if (st != KHOR_SUCCESS)
		return st;
	if (v < (int64_t)count || v > (int64_t)UINT32_MAX - 2 * COMM_IDS)
		return kerr_set(err, KHOR_ERR_INTERNAL, "the job has used up its comm ids (%" PRId64
		                ")", v);
	*first_out = COMM_IDS + (uint32_t)(v - count);
	return KHOR_SUCCESS;
}

/* Registers c with its context, for khor_finalize. */
static void ctx_add(kctx *x, khor_comm *c)
{
	pthread_mutex_lock(&x->comms_mu);
	klist_add_head(&x->comms, &c->in_ctx);
	pthread_mutex_unlock(&x->comms_mu);
}

struct member {
	int64_t key;
	int rank; /* in the parent */
};

static int by_key(const void *a, const void *b)
{
	const struct member *p = a, *q = b;

	if (p->key != q->key)
		return p->key < q->key ? -1 : 1;
	return p->rank - q->rank;
}

static int by_value(const void *a, const void *b)
{
	int64_t p = *(const int64_t *)a, q = *(const int64_t *)b;

	return p < q ? -1 : p > q;
}

khor_status comm_split_run(khor_comm *p, struct khor_request *r, kerr *err)
{
	kctx *x = p->ctx;
	const int n = p->size;
	int64_t *t = calloc((size_t)n * 2 + 1, sizeof(int64_t));
	int64_t *colors = calloc((size_t)n, sizeof(int64_t));
	struct member *m = calloc((size_t)n, sizeof(*m));
	int *world = calloc((size_t)n, sizeof(int));
	khor_status st = KHOR_SUCCESS;
	int ncolors = 0, place = -1, count = 0, me = -1;
	uint32_t first = 0;

	r->newcomm = NULL;
	if (t == NULL || colors == NULL || m == NULL || world == NULL) {
		st = kerr_set(err, KHOR_ERR_NO_MEMORY, "khor_comm_split seq %u: out of memory for %d "
		              "ranks", r->seq, n);
		goto out;
	}
	t[2 * p->rank] = r->color;
	t[2 * p->rank + 1] = r->key;
	if (n > 1 && (st = rd_allreduce(&p->cc, t, t, (size_t)n * 2, KHOR_INT64, KHOR_SUM, r->seq,
	                                COLL_SPLIT, err)) != KHOR_SUCCESS)
		goto fail;
	/* The distinct colors >= 0, in order: a color's place gives its comm's id. */
	for (int i = 0; i < n; i++)
		if (t[2 * i] >= 0)
			colors[ncolors++] = t[2 * i];
	qsort(colors, (size_t)ncolors, sizeof(int64_t), by_value);
	int k = 0;
	for (int i = 0; i < ncolors; i++)
		if (i == 0 || colors[i] != colors[i - 1])
			colors[k++] = colors[i];
	ncolors = k;
	int64_t base = 0;
	if (p->rank == 0 && ncolors > 0) {
		if ((st = take_ids(x, (uint32_t)ncolors * COMM_IDS, &first, err)) != KHOR_SUCCESS)
			goto fail;
		base = first;
	}
	if (n > 1 && (st = rd_allreduce(&p->cc, &base, &base, 1, KHOR_INT64, KHOR_SUM, r->seq + 1,
	                                COLL_SPLIT, err)) != KHOR_SUCCESS)
		goto fail;
	if (r->color < 0)
		goto out;
	for (int i = 0; i < ncolors; i++)
		if (colors[i] == r->color)
			place = i;
	for (int i = 0; i < n; i++)
		if (t[2 * i] == r->color)
			m[count++] = (struct member){ .key = t[2 * i + 1], .rank = i };
	qsort(m, (size_t)count, sizeof(*m), by_key);
	for (int i = 0; i < count; i++) {
		world[i] = comm_world_rank(p, m[i].rank);
		if (m[i].rank == p->rank)
			me = i;
	}
	if (place < 0 || me < 0) {
		st = kerr_set(err, KHOR_ERR_INTERNAL, "khor_comm_split seq %u: color %d lost in the "
		              "exchange", r->seq, r->color);
		goto fail;
	}
	st = comm_create(x, p, world, count, me, (uint32_t)base + (uint32_t)place * COMM_IDS,
	                 &r->newcomm, err);
	if (st != KHOR_SUCCESS)
		goto fail;
	ctx_add(x, r->newcomm);
	KLOG_DEBUG("split of %s (color %d, key %d): %s, rank %d of %d", p->name, r->color, r->key,
	           r->newcomm->name, me, count);
	goto out;
fail:
	kerr_prefix(err, "khor_comm_split seq %u (color %d, key %d)", r->seq, r->color, r->key);
out:
	free(t);
	free(colors);
	free(m);
	free(world);
	return st;
}

/* One (parent, list) pair's count of create_group calls so far. */
struct cg_count {
	uint32_t parent;
	uint64_t hash;
	uint32_t calls;
};

/* The k of "the k-th create_group with this list on this parent", counted here. */
static khor_status cg_next(kctx *x, uint32_t parent, uint64_t hash, uint32_t *k_out, kerr *err)
{
	khor_status st = KHOR_SUCCESS;

	pthread_mutex_lock(&x->comms_mu);
	for (int i = 0; i < x->ncg; i++) {
		if (x->cg[i].parent == parent && x->cg[i].hash == hash) {
			*k_out = x->cg[i].calls++;
			goto out;
		}
	}
	if (x->ncg == x->cg_cap) {
		int cap = x->cg_cap ? 2 * x->cg_cap : 16;
		struct cg_count *c = realloc(x->cg, (size_t)cap * sizeof(*c));
		if (c == NULL) {
			st = kerr_set(err, KHOR_ERR_NO_MEMORY, "khor_comm_create_group: out of memory");
			goto out;
		}
		x->cg = c;
		x->cg_cap = cap;
	}
	x->cg[x->ncg++] = (struct cg_count){ .parent = parent, .hash = hash, .calls = 1 };
	*k_out = 0;
out:
	pthread_mutex_unlock(&x->comms_mu);
	return st;
}

/* "<id> <n> <r0> <r1> ...": the group as its first rank publishes it (world ranks). */
static char *group_text(uint32_t id, const int *world, int n)
{
	size_t len = 32 + (size_t)n * 12, off;
	char *s = malloc(len);

	if (s == NULL)
		return NULL;
	off = (size_t)snprintf(s, len, "%u %d", id, n);
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(s + off, len - off, " %d", world[i]);
	return s;
}

khor_status comm_create_group(khor_comm *p, const int *ranks, int nranks,
                              khor_comm **newcomm_out, kerr *err)
{
	kctx *x = p->ctx;
	int *world = NULL, me = -1;
	char key[96], *mine = NULL;
	void *v = NULL;
	size_t vl;
	uint64_t h = 1469598103934665603ull;
	uint32_t k = 0, id = 0;
	khor_status st;

	if (ranks == NULL || nranks < 1 || nranks > p->size)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "khor_comm_create_group: %d ranks listed "
		                "(%s), for a parent of %d", nranks, ranks == NULL ? "NULL list" :
		                "must be 1 to the parent's size", p->size);
	world = malloc((size_t)nranks * sizeof(int));
	if (world == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "khor_comm_create_group: out of memory");
	for (int i = 0; i < nranks; i++) {
		if (ranks[i] < 0 || ranks[i] >= p->size) {
			st = kerr_set(err, KHOR_ERR_INVALID_ARG, "khor_comm_create_group: ranks[%d] = %d "
			              "is not a rank of %s", i, ranks[i], p->name);
			goto out;
		}
		for (int j = 0; j < i; j++) {
			if (ranks[j] == ranks[i]) {
				st = kerr_set(err, KHOR_ERR_INVALID_ARG, "khor_comm_create_group: rank %d "
				              "is listed twice (at %d and %d)", ranks[i], j, i);
				goto out;
			}
		}
		if (ranks[i] == p->rank)
			me = i;
		world[i] = comm_world_rank(p, ranks[i]);
		for (int b = 0; b < 4; b++)
			h = (h ^ (uint8_t)((unsigned)world[i] >> (8 * b))) * 1099511628211ull;
	}
	if (me < 0) {
		*newcomm_out = NULL; /* not in the group: nothing to make */
		st = KHOR_SUCCESS;
		goto out;
	}
	if ((st = cg_next(x, p->id, h, &k, err)) != KHOR_SUCCESS)
		goto out;
	snprintf(key, sizeof(key), "cg/%u/%016" PRIx64 "/%u", p->id, h, k);
	if (nranks > 1 && x->store == NULL) {
		st = kerr_set(err, KHOR_ERR_INTERNAL, "khor_comm_create_group: no store");
		goto out;
	}
	if (me == 0) {
		if ((st = take_ids(x, COMM_IDS, &id, err)) != KHOR_SUCCESS)
			goto out;
		mine = group_text(id, world, nranks);
		if (mine == NULL) {
			st = kerr_set(err, KHOR_ERR_NO_MEMORY, "khor_comm_create_group: out of memory");
			goto out;
		}
		if (nranks > 1 && (st = store_set(x->store, key, mine, strlen(mine), err)))
			goto out;
		char all[128];
		snprintf(all, sizeof(all), "%s/all", key);
		if (nranks > 1) {
			st = liveness_store_get(x, "khor_comm_create_group", all, world + 1,
			                        nranks - 1, &v, &vl, err);
			if (st == KHOR_ERR_TIMEOUT) {
				st = kerr_set(err, KHOR_ERR_TIMEOUT, "khor_comm_create_group: timed out "
				              "after %lld ms (KHOR_TIMEOUT) waiting for the other %d listed "
				              "ranks to join: did every listed rank call it with the same "
				              "list, in the same order?", (long long)x->cfg.timeout_ms,
				              nranks - 1);
				goto out;
			}
			if (st != KHOR_SUCCESS)
				goto out;
			/* Every member has read the group and counted itself: its keys are done
			 * with, and a job that makes groups all day must not grow the store. */
			char ok[128];
			snprintf(ok, sizeof(ok), "%s/ok", key);
			const char *done[] = { key, ok, all };
			for (int i = 0; i < 3; i++) {
				if ((st = store_del(x->store, done[i], err)) != KHOR_SUCCESS)
					goto out;
			}
		}
	} else {
		st = liveness_store_get(x, "khor_comm_create_group", key, world, 1, &v, &vl, err);
		if (st == KHOR_ERR_TIMEOUT) {
			st = kerr_set(err, KHOR_ERR_TIMEOUT, "khor_comm_create_group: timed out after "
			              "%lld ms (KHOR_TIMEOUT) waiting for world rank %d, the list's first, "
			              "to publish the group: did every listed rank call it with the same "
			              "list, in the same order?", (long long)x->cfg.timeout_ms, world[0]);
			err->peer = world[0];
			goto out;
		}
		if (st != KHOR_SUCCESS)
			goto out;
		id = (uint32_t)strtoul(v, NULL, 10);
		mine = group_text(id, world, nranks);
		if (mine == NULL) {
			st = kerr_set(err, KHOR_ERR_NO_MEMORY, "khor_comm_create_group: out of memory");
			goto out;
		}
		if (strcmp(mine, v) != 0) {
			st = kerr_set(err, KHOR_ERR_INVALID_ARG, "khor_comm_create_group: world rank %d "
			              "made the group '%.200s' (id, size, world ranks) but this rank "
			              "listed '%.200s': every listed rank must pass the same list",
			              world[0], (char *)v, strchr(mine, ' ') + 1);
			goto out;
		}
		char ok[128];
		int64_t joined;
		snprintf(ok, sizeof(ok), "%s/ok", key);
		if ((st = store_add(x->store, ok, 1, &joined, err)) != KHOR_SUCCESS)
			goto out;
		snprintf(ok, sizeof(ok), "%s/all", key);
		if (joined == nranks - 1 && (st = store_set(x->store, ok, "1", 1, err)))
			goto out;
	}
	st = comm_create(x, p, world, nranks, me, id, newcomm_out, err);
	if (st == KHOR_SUCCESS)
		ctx_add(x, *newcomm_out);
out:
	free(v);
	free(mine);
	free(world);
	return st;
}

void comm_free(khor_comm *c)
{
	kctx *x = c->ctx;

	pthread_mutex_lock(&x->comms_mu);
	klist_del(&c->in_ctx);
	pthread_mutex_unlock(&x->comms_mu);
	comm_destroy(c);
}
