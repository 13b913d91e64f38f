/*
 * comm_exec.c -- running collectives in call order.
 *
 * Ranks must execute a comm's collectives in the same order, so each call takes the next
 * sequence number when it is made. A blocking call with nothing queued runs inline on the
 * caller's thread (no hand-off on the latency path). Non-blocking calls go to the comm's
 * collective thread, started on first use, which runs the queue in order; a blocking call
 * made while the queue is not empty queues too and waits, so order is kept either way.
 * Only one collective of a comm runs at a time (`busy`), which is what lets its schedules
 * use the comm's scratch and groups without locks; collectives of different comms run at
 * once on the shared, locked transports.
 */
#include "comm.h"

#include "base/dtype.h"

#include "base/log.h"
#include "collectives/algos.h"
#include "collectives/hier.h"
#include "collectives/rd.h"
#include "collectives/select.h"
#include "collectives/reduce.h"
#include "collectives/ring.h"
#include "nccl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * After a timeout, find the rank at the end of the waiting chain. Every rank that times
 * out records whom it waited for under "stuck/<rank>"; a rank that waits for someone who
 * is not stuck himself has found the culprit: alive perhaps, but not in the collective.
 * Without this, ranks two hops away would blame their innocent neighbour. A chain that
 * comes back to a rank already on it is a cycle (0 waits for 1 in one call, 1 for 2 in
 * another, 2 for 0 in a third): nobody is missing, they are in different calls, and the
 * error says so, naming the cycle.
 */
#define CHAIN_MAX 64

static void blame_timeout(khor_comm *c, kerr *err)
{
	char key[32], val[16], chain[256];
	int path[CHAIN_MAX], len = 0, loop_at = -1;
	size_t off = 0;
	kerr e;

	const int me = c->ctx->rank, n = c->ctx->size; /* world ranks: peers are named so */

	snprintf(key, sizeof(key), "stuck/%d", me);
	snprintf(val, sizeof(val), "%d", err->peer);
	if (store_set(c->ctx->store, key, val, strlen(val), &e) != KHOR_SUCCESS)
		return;
	/* Let the other ranks, whose deadlines expire about now too, record theirs. */
	struct timespec ts = { 0, 500 * 1000 * 1000 };
	nanosleep(&ts, NULL);
	path[len++] = me;
	path[len++] = err->peer;
	while (loop_at < 0 && len < CHAIN_MAX && len <= n) {
		void *v;
		size_t vlen;
		snprintf(key, sizeof(key), "stuck/%d", path[len - 1]);
		if (store_get(c->ctx->store, key, kdeadline_in_ms(0), &v, &vlen, &e) != KHOR_SUCCESS)
			break;
		int next = atoi(v);
		free(v);
		if (next < 0 || next >= n)
			break;
		for (int i = 0; i < len; i++)
			if (path[i] == next)
				loop_at = i;
		path[len++] = next;
	}
	for (int i = 0; i + 1 < len && off + 32 < sizeof(chain); i++)
		off += (size_t)snprintf(chain + off, sizeof(chain) - off, i == 0 ? "%d waited for %d"
		                        : ", %d for %d", path[i], path[i + 1]);
	if (loop_at >= 0) {
		char ranks[160];
		size_t k = 0;
		for (int i = loop_at; i + 1 < len && k + 16 < sizeof(ranks); i++)
			k += (size_t)snprintf(ranks + k, sizeof(ranks) - k, "%s%d",
			                      i == loop_at ? "" : i + 2 == len ? " and " : ", ", path[i]);
		kerr_prefix(err, "ranks %s wait for each other in a cycle, each in a call the next "
		            "is not in (waiting chain: %s): a deadlock, the ranks having made their "
		            "calls on different comms or in different orders", ranks, chain);
	} else
		kerr_prefix(err, "rank %d is not taking part (waiting chain: %s)", path[len - 1],
		            chain);
}

/* bytes' power of two: 0 for 0 and 1 B, k for 2^k .. 2^(k+1) - 1. */
static int size_bucket(size_t bytes)
{
	int bucket = 0;

	while (bucket < 63 && (1ull << (bucket + 1)) <= bytes)
		bucket++;
	return bucket;
}

/* True the first time a choice of this kind is logged for bytes' power of two. */
static bool first_at_size(coll_comm *cc, int kind, size_t bytes)
{
	int bucket = size_bucket(bytes);

	if (cc->logged[kind] & (1ull << bucket))
		return false;
	cc->logged[kind] |= 1ull << bucket;
	return true;
}

static const char *const algo_names[] = { "auto", "ring", "rd", "tree", "hd" };

/*
 * KHOR_LOG=debug: the allreduce choice with every prediction, once per power-of-two size;
 * when auto's trials (t) are about to run, the schedules they try.
 */
static void log_choice(coll_comm *cc, size_t bytes, const trial_slot *t)
{
	const cost_model *m = &cc->model;
	char tried[128] = "";

	/* Auto's choices and forced ones apart: khor-bench --algo ring,auto forces the ring
	 * first at every size, and auto's pick would never be shown. */
	if (!first_at_size(cc, cc->algo != ALGO_AUTO ? LOGGED_FORCED : LOGGED_AUTO, bytes))
		return;
	enum allreduce_algo a = allreduce_pick(cc, (enum allreduce_algo)cc->algo, bytes);
	if (t != NULL && t->state == TRIAL_RUNNING && t->calls == 0) {
		size_t off = (size_t)snprintf(tried, sizeof(tried), "; trying");
		for (int i = 0; i < t->ncand; i++)
			off += (size_t)snprintf(tried + off, sizeof(tried) - off, "%s %s",
			                        i ? "," : "", algo_names[t->cand[i]]);
		snprintf(tried + off, sizeof(tried) - off, " (%u blocks of %u calls each)", t->rounds,
		         t->block);
	}
	KLOG_DEBUG("allreduce %zu B on %d ranks: %s%s (predicted us: ring %.1f, tree %.1f, rd %.1f, "
	           "hd %.1f)%s", bytes, cc->size, algo_names[a],
	           cc->algo ? " (forced: KHOR_ALGO or khor_comm_set)" : "",
	           cost_allreduce(m, ALGO_RING, cc->size, bytes, dbtree_slice_bytes(cc)) * 1e6,
	           cost_allreduce(m, ALGO_TREE, cc->size, bytes, dbtree_slice_bytes(cc)) * 1e6,
	           cost_allreduce(m, ALGO_RD, cc->size, bytes, dbtree_slice_bytes(cc)) * 1e6,
	           cost_allreduce(m, ALGO_HD, cc->size, bytes, dbtree_slice_bytes(cc)) * 1e6, tried);
}

/*
 * The trial slot of an allreduce under auto (select.h: trial_slot), begun at its size's
 * first call; NULL when trials are off or cannot help (no model, an empty call).
 */
static trial_slot *trial_of(khor_comm *c, size_t bytes)
{
	coll_comm *cc = &c->cc;

	if (c->ctx->cfg.auto_trials == 0 || cc->algo != ALGO_AUTO || cc->model.alpha <= 0 ||
	    bytes == 0)
		return NULL;
	trial_slot *t = &c->trials[size_bucket(bytes)];
	/*
	 * How far off the model can be: with more ranks than cores on a host it over-predicted
	 * the tree 2.3x (8 ranks, 64 KiB); with a core per rank its picks measured within 1.26x
	 * of the best schedule. Agreed at init, like everything else that picks candidates.
	 */
	if (t->state == TRIAL_NEW)
		trial_begin(t, &cc->model, cc->size, bytes, dbtree_slice_bytes(cc),
		            c->ctx->crowded_any ? 3.0 : 1.5, (unsigned)c->ctx->cfg.auto_trials);
	return t;
}

static khor_status run_allreduce(coll_comm *cc, struct khor_request *r, int algo, kerr *err)
{
	switch (algo) {
	case ALGO_RD:
		return rd_allreduce(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->op, r->seq,
		                    r->kind, err);
	case ALGO_TREE:
		return dbtree_allreduce(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->op, r->seq,
		                        err);
	case ALGO_HD:
		return hd_allreduce(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->op, r->seq,
		                    err);
	default:
		return ring_allreduce(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->op, r->seq,
		                      r->kind, err);
	}
}

/*
 * Auto's trials (select.h: trial_slot) for the size of call r, run before it: the
 * candidates' calls on buffers of the same size, dtype, op and form (in place or not), then
 * an allreduce(max) of the factors, so that every rank holds the same ones. Each trial call
 * and the agreement run under the comm's trial id, each with a sequence number of its own,
 * so their messages can never meet another call's, nor each other's. The first call of a size takes
 * longer (select.h says how much); that call and every later one of its size run one
 * schedule, so no result depends on where in the trials it fell.
 */
static khor_status run_trials(khor_comm *c, const struct khor_request *r, trial_slot *t,
                              size_t bytes, kerr *err)
{
	/* The trial buffers sit at the user's offsets into a page: measured, a payload's
	 * alignment moved the loopback copies' speed by up to 1.9x before the TCP framing kept
	 * it fixed, and a trial should time what the user's calls will get. */
	const size_t page = 4096, so = (uintptr_t)r->sendbuf & (page - 1),
	             ro = (uintptr_t)r->recvbuf & (page - 1);
	const bool in_place = r->sendbuf == r->recvbuf;
	const size_t send_pages = in_place ? 0 : (so + bytes + page - 1) & ~(page - 1);
	const size_t len = (send_pages + ro + bytes + page - 1) & ~(page - 1);
	coll_comm g = c->cc;
	struct khor_request x = *r;
	uint32_t i = 0;

	/*
	 * The trials run on host buffers even for a call on device memory: every rank must
	 * take the same decisions whatever its buffers are (ranks that disagree on the kind
	 * then fail on the call's first frame, instead of waiting in different trials), and
	 * the choice between schedules is about the wire, which both kinds share.
	 */
	g.mem = NULL;
	khor_status st = KHOR_SUCCESS;
	bool done = false;
	int a = ALGO_RING;
	uint8_t *buf = aligned_alloc(page, len ? len : page);

	if (buf == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "auto's timed trials at %zu B: cannot "
		                "allocate %zu bytes of trial buffers", bytes, len);
	memset(buf, 0, len);
	x.recvbuf = buf + send_pages + ro;
	x.sendbuf = in_place ? x.recvbuf : buf + so;
	/* The trials' own comm id (the comm's third after its own, comm.h: COMM_IDS), with
	 * sequence numbers of their own that every rank counts alike. */
	g.comm_id = c->id + 3;
	while (!done) {
		i++;
		x.seq = c->trial_seq++;
		a = trial_algo(t);
		uint64_t t0 = kclock_ns();
		if ((st = run_allreduce(&g, &x, a, err)) != KHOR_SUCCESS)
			break;
		done = trial_record(t, (double)(kclock_ns() - t0) * 1e-9,
		                    cost_allreduce(&g.model, a, c->size, bytes, dbtree_slice_bytes(&g)));
	}
	free(buf);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "auto's timed trial %u at %zu B (%s)", i, bytes, algo_names[a]);
		*t = (trial_slot){ 0 }; /* the comm has failed; were it ever reused, start over */
		return st;
	}
	/* The slowest rank's factors: a collective is as fast as its slowest member. */
	double v[TRIAL_MAX_CAND];
	memcpy(v, t->factor, sizeof(v));
	st = rd_allreduce(&g, v, v, (size_t)t->ncand, KHOR_FLOAT64, KHOR_MAX, c->trial_seq++,
	                  COLL_ALLREDUCE, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "agreeing on auto's timed trials at %zu B", bytes);
		*t = (trial_slot){ 0 };
		return st;
	}
	memcpy(t->factor, v, sizeof(v));
	t->state = TRIAL_DONE;
	if (klog_threshold >= KLOG_DEBUG) {
		char f[128];
		size_t off = 0;
		for (int k = 0; k < t->ncand; k++)
			off += (size_t)snprintf(f + off, sizeof(f) - off, "%s%s %.3g", k ? ", " : "",
			                        algo_names[t->cand[k]], t->factor[k]);
		KLOG_DEBUG("allreduce %zu B on %d ranks: %s after trials (%u calls; measured / "
		           "predicted: %s; the model alone: %s)", bytes, c->size,
		           algo_names[trial_pick(t, &g.model, c->size, bytes, dbtree_slice_bytes(&g))],
		           i, f, algo_names[t->cand[0]]);
	}
	return KHOR_SUCCESS;
}

/* A flat allreduce (or barrier): the forced schedule, the model's, or the one auto's trials
 * for this size chose. */
static khor_status flat_allreduce(khor_comm *c, struct khor_request *r, size_t bytes, kerr *err)
{
	coll_comm *cc = &c->cc;
	trial_slot *t = r->kind == COLL_ALLREDUCE ? trial_of(c, bytes) : NULL;
	khor_status st;

	if (klog_threshold >= KLOG_DEBUG)
		log_choice(cc, bytes, t);
	if (t != NULL && t->state == TRIAL_RUNNING &&
	    (st = run_trials(c, r, t, bytes, err)) != KHOR_SUCCESS)
		return st;
	int a = t != NULL && t->state == TRIAL_DONE
	        ? trial_pick(t, &cc->model, c->size, bytes, dbtree_slice_bytes(cc))
	        : (int)allreduce_pick(cc, (enum allreduce_algo)cc->algo, bytes);
	/*
	 * Device memory staged through host memory pays a copy per message before the wire:
	 * recursive doubling and halving-doubling send large halves whole, so that copy can't
	 * overlap anything, where the ring's lanes overlap one slice's copy with another's
	 * send. Auto takes the ring for them from a few slices up (the model knows no copies;
	 * every rank of a call has the same kind, or the call fails anyway).
	 */
	if (coll_on_device(cc) && cc->algo == ALGO_AUTO && (a == ALGO_RD || a == ALGO_HD) &&
	    bytes >= 4 * cc->slice_bytes) {
		if (klog_threshold >= KLOG_DEBUG && first_at_size(cc, LOGGED_DEVICE_RING, bytes))
			KLOG_DEBUG("allreduce %zu B on device memory: ring instead of %s (its lanes "
			           "overlap the staging copies)", bytes, algo_names[a]);
		a = ALGO_RING;
	}
	c->last_sched = algo_names[a];
	return run_allreduce(cc, r, a, err);
}

/*
 * KHOR_LOG=debug: broadcast's or allgather's choice between its latency schedule (binomial,
 * Bruck) and its bandwidth one (chain, ring), once per power-of-two size, with both
 * predictions, or the KHOR_RD_MAX_BYTES threshold that decided it.
 */
static void log_pick(coll_comm *cc, int kind, const char *what, size_t bytes, bool latency,
                     const char *lat_name, double t_lat, const char *bw_name, double t_bw,
                     bool by_threshold)
{
	if (!first_at_size(cc, kind, bytes))
		return;
	if (by_threshold)
		KLOG_DEBUG("%s %zu B on %d ranks: %s (KHOR_RD_MAX_BYTES %zu)", what, bytes, cc->size,
		           latency ? lat_name : bw_name, cc->rd_max_bytes);
	else
		KLOG_DEBUG("%s %zu B on %d ranks: %s (predicted us: %s %.1f, %s %.1f)", what, bytes,
		           cc->size, latency ? lat_name : bw_name, lat_name, t_lat * 1e6, bw_name,
		           t_bw * 1e6);
}

/* Equal-block allgather through the v schedule: counts all equal, packed in rank order. */
static khor_status ring_allgather_equal(coll_comm *cc, const void *sendbuf, void *recvbuf,
                                       size_t count, khor_dtype dtype, uint32_t seq, kerr *err)
{
	size_t n = (size_t)cc->size, *a = malloc(2 * n * sizeof(size_t));
	khor_status st;

	if (a == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "allgather seq %u: out of memory", seq);
	for (size_t i = 0; i < n; i++) {
		a[i] = count;
		a[n + i] = count * i;
	}
	st = ring_allgatherv(cc, sendbuf, recvbuf, a, a + n, dtype, seq, err);
	free(a);
	return st;
}

static khor_status alltoall_run(coll_comm *cc, struct khor_request *r, kerr *err)
{
	size_t n = (size_t)cc->size, *a;
	khor_status st;

	if (r->scounts != NULL)
		return pairwise_alltoallv(cc, r->sendbuf, r->scounts, r->sdispls, r->recvbuf,
		                          r->rcounts, r->rdispls, r->dtype, r->seq, err);
	a = malloc(2 * n * sizeof(size_t));
	if (a == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "alltoall seq %u: out of memory", r->seq);
	for (size_t i = 0; i < n; i++) {
		a[i] = r->count;
		a[n + i] = r->count * i;
	}
	st = pairwise_alltoallv(cc, r->sendbuf, a, a + n, r->recvbuf, a, a + n, r->dtype, r->seq,
	                        err);
	free(a);
	return st;
}

/* Local-only semantics of each collective on a one-rank comm. */
static khor_status run_single(coll_comm *cc, struct khor_request *r, kerr *err)
{
	size_t esz = kdtype_size(r->dtype), bytes = r->count * esz;

	switch (r->kind) {
	case COLL_ALLREDUCE: case COLL_REDUCE: case COLL_ALLGATHER: case COLL_REDUCESCATTER:
	case COLL_GATHER: case COLL_SCATTER:
		if (r->kind == COLL_ALLGATHER && r->rcounts != NULL)
			return coll_copy(cc, (char *)r->recvbuf + r->rdispls[0] * esz, r->sendbuf,
			                 r->rcounts[0] * esz, err);
		return coll_copy(cc, r->recvbuf, r->sendbuf, bytes, err);
	case COLL_ALLTOALL:
		if (r->scounts != NULL) {
			if (r->scounts[0] != r->rcounts[0])
				return kerr_set(err, KHOR_ERR_INVALID_ARG, "alltoallv seq %u: this rank sends "
				                "itself %zu elements but expects %zu", r->seq, r->scounts[0],
				                r->rcounts[0]);
			return coll_copy(cc, (char *)r->recvbuf + r->rdispls[0] * esz,
			                 (const char *)r->sendbuf + r->sdispls[0] * esz,
			                 r->scounts[0] * esz, err);
		}
		return coll_copy(cc, r->recvbuf, r->sendbuf, bytes, err);
	default:
		return KHOR_SUCCESS;
	}
}

/*
 * Node-aware or flat? KHOR_HIER=on/off decides; auto asks the cost model, with intra-host
 * links for the node phases and inter-host links for the rest. Same inputs on every rank,
 * so the same answer everywhere.
 */
static bool use_hier(khor_comm *c, size_t bytes)
{
	if (!c->hier_ok || c->run_hier == 0)
		return false;
	if (c->run_hier == 1)
		return true;
	double flat;
	cost_pick_allreduce(&c->ctx->outer, c->size, bytes, dbtree_slice_bytes(&c->cc), &flat);
	double hier = cost_hier_allreduce(&c->ctx->inner, &c->ctx->outer, c->node_n, c->nhosts, bytes,
	                                  dbtree_slice_bytes(&c->cc));
	KLOG_DEBUG("allreduce %zu B: node-aware %.1f us vs flat %.1f us", bytes, hier * 1e6,
	           flat * 1e6);
	return hier < flat;
}

/*
 * Reduce-scatter's schedule: with KHOR_RD_MAX_BYTES set, recursive halving (recursive
 * doubling and a copy when n is not a power of two) up to it and the ring above; else the
 * cost model's pick. At 2 ranks every schedule is the same one swap: the ring.
 */
static int rs_pick(const khor_comm *c, const coll_comm *cc, size_t bytes)
{
	const int n = cc->size;
	const bool pow2 = (n & (n - 1)) == 0;

	if (n <= 2)
		return RS_RING;
	if (c->ctx->cfg.rd_max_set)
		return bytes > cc->rd_max_bytes ? RS_RING : pow2 ? RS_HALVING : RS_RD;
	if (cc->model.alpha <= 0)
		return RS_RING;
	return cost_pick_reduce_scatter(&cc->model, n, bytes, cc->slice_bytes);
}

/* KHOR_LOG=debug: reduce-scatter's choice, once per power-of-two size, as log_pick does. */
static void log_rs_pick(const khor_comm *c, coll_comm *cc, size_t bytes, int rs)
{
	static const char *const names[] = { "ring", "rd + copy", "recursive halving" };
	const cost_model *m = &cc->model;

	if (!first_at_size(cc, LOGGED_RS, bytes))
		return;
	if (c->ctx->cfg.rd_max_set || cc->size <= 2 || m->alpha <= 0)
		KLOG_DEBUG("reduce_scatter %zu B on %d ranks: %s (%s)", bytes, cc->size, names[rs],
		           cc->size <= 2 ? "2 ranks" : c->ctx->cfg.rd_max_set ? "KHOR_RD_MAX_BYTES" : "no model");
	else
		KLOG_DEBUG("reduce_scatter %zu B on %d ranks: %s (predicted us: ring %.1f, rd + copy "
		           "%.1f, recursive halving %.1f%s)", bytes, cc->size, names[rs],
		           cost_reduce_scatter(m, RS_RING, cc->size, bytes) * 1e6,
		           cost_reduce_scatter(m, RS_RD, cc->size, bytes) * 1e6,
		           cost_reduce_scatter(m, RS_HALVING, cc->size, bytes) * 1e6,
		           (cc->size & (cc->size - 1)) ? ", not a power of two" : "");
}

/*
 * Small reduce-scatters are latency-bound: reduce everything with recursive doubling into a
 * temp buffer and keep this rank's block (the extra bytes cost less than the steps they
 * save, at n not a power of two where recursive halving does not apply).
 */
static khor_status rd_reduce_scatter(coll_comm *cc, struct khor_request *r, kerr *err)
{
	size_t esz = kdtype_size(r->dtype), off, len;
	/* Small by construction; not coll_big, which rd_allreduce may use for its own temp. */
	uint8_t *tmp = coll_tmp(cc, r->count * esz + 1);
	khor_status st;

	if (tmp == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "reduce_scatter seq %u: out of memory",
		                r->seq);
	st = rd_allreduce(cc, r->sendbuf, tmp, r->count, r->dtype, r->op, r->seq,
	                  COLL_REDUCESCATTER, err);
	coll_block(r->count, cc->size, cc->rank, &off, &len);
	if (st == KHOR_SUCCESS && len > 0)
		st = coll_copy(cc, r->recvbuf, tmp + off * esz, len * esz, err);
	return st;
}

/* Picks the schedule for one collective and runs it. */
static khor_status dispatch(khor_comm *c, struct khor_request *r, const kmem_where *where,
                            kerr *err)
{
	coll_comm *cc = &c->cc;
	size_t esz = kdtype_size(r->dtype), bytes = r->count * esz;
	bool binomial, bruck;
	int rs;

	if (coll_on_device(cc) && c->size > 1) {
		bool handled = false;
		khor_status st = nccl_run(c, r, where, &handled, err);
		if (handled)
			return st;
	}
	if (c->size == 1 && r->kind != COLL_SPLIT)
		return run_single(cc, r, err);
	switch (r->kind) {
	case COLL_ALLREDUCE:
		if (use_hier(c, bytes)) {
			c->last_sched = "hierarchical";
			return hier_allreduce(&c->node_cc, &c->cross_cc, c->size, r->sendbuf, r->recvbuf,
			                      r->count, r->dtype, r->op, r->seq, err);
		}
		/* fall through */
	case COLL_BARRIER:
		return flat_allreduce(c, r, bytes, err);
	case COLL_BROADCAST:
		if (use_hier(c, bytes)) {
			int host, local;
			comm_root_position(c, r->root, &host, &local);
			return hier_broadcast(&c->node_cc, &c->cross_cc, host, local, r->recvbuf,
			                      r->count, r->dtype, r->seq, err);
		}
		binomial = c->ctx->cfg.rd_max_set ? bytes <= cc->rd_max_bytes
		                             : cost_pick_broadcast(&cc->model, c->size, bytes,
		                                                   cc->slice_bytes) == BCAST_BINOMIAL;
		if (klog_threshold >= KLOG_DEBUG)
			log_pick(cc, LOGGED_BCAST, "broadcast", bytes, binomial, "binomial",
			         cost_broadcast(&cc->model, BCAST_BINOMIAL, c->size, bytes, cc->slice_bytes),
			         "chain",
			         cost_broadcast(&cc->model, BCAST_CHAIN, c->size, bytes, cc->slice_bytes),
			         c->ctx->cfg.rd_max_set);
		if (binomial)
			return binomial_broadcast(cc, r->recvbuf, r->count, r->dtype, r->root, r->seq, err);
		return chain_broadcast(cc, r->recvbuf, r->count, r->dtype, r->root, r->seq, err);
	case COLL_REDUCE:
		return binomial_reduce(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->op, r->root,
		                       r->seq, err);
	case COLL_ALLGATHER:
		if (r->rcounts == NULL && c->hier_blocked && use_hier(c, bytes * (size_t)c->size))
			return hier_allgather(&c->node_cc, &c->cross_cc, r->sendbuf, r->recvbuf, r->count,
			                      r->dtype, r->seq, err);
		if (r->rcounts != NULL)
			return ring_allgatherv(cc, r->sendbuf, r->recvbuf, r->rcounts, r->rdispls,
			                       r->dtype, r->seq, err);
		bruck = c->ctx->cfg.rd_max_set ? bytes * (size_t)c->size <= cc->rd_max_bytes
		                          : cost_pick_allgather(&cc->model, c->size,
		                                                bytes * (size_t)c->size) == AG_RD;
		if (klog_threshold >= KLOG_DEBUG)
			log_pick(cc, LOGGED_ALLGATHER, "allgather", bytes * (size_t)c->size, bruck,
			         "Bruck", cost_allgather(&cc->model, AG_RD, c->size, bytes * (size_t)c->size),
			         "ring", cost_allgather(&cc->model, AG_RING, c->size, bytes * (size_t)c->size),
			         c->ctx->cfg.rd_max_set);
		if (bruck)
			return rd_allgather(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->seq, err);
		return ring_allgather_equal(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->seq,
		                            err);
	case COLL_REDUCESCATTER:
		rs = rs_pick(c, cc, bytes);
		if (klog_threshold >= KLOG_DEBUG)
			log_rs_pick(c, cc, bytes, rs);
		switch (rs) {
		case RS_RD:
			return rd_reduce_scatter(cc, r, err);
		case RS_HALVING:
			return halving_reduce_scatter(cc, r->sendbuf, r->recvbuf, r->count, r->dtype,
			                              r->op, r->seq, err);
		default:
			return ring_reduce_scatter(cc, r->sendbuf, r->recvbuf, r->count, r->dtype,
			                           r->op, r->seq, err);
		}
	case COLL_ALLTOALL:
		return alltoall_run(cc, r, err);
	case COLL_GATHER:
		return binomial_gather(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->root, r->seq,
		                       err);
	case COLL_SCATTER:
		return binomial_scatter(cc, r->sendbuf, r->recvbuf, r->count, r->dtype, r->root,
		                        r->seq, err);
	case COLL_SPLIT:
		return comm_split_run(c, r, err);
	default:
		return kerr_set(err, KHOR_ERR_INTERNAL, "unknown collective kind %u", r->kind);
	}
}

static const char *const kind_names[COLL_KINDS] = {
	"allreduce", "broadcast", "barrier", "reduce", "allgather", "reduce_scatter",
	"alltoall", "gather", "scatter", "probe", "comm split", "negotiation",
};

/*
 * The buffers r reads or writes on this rank, with their names for messages: a rank
 * that is not the root of a reduce or gather has no recvbuf, nor of a scatter a sendbuf.
 */
static int call_buffers(const khor_comm *c, const struct khor_request *r, const void *b[2],
                        const char *names[2])
{
	names[0] = "sendbuf";
	names[1] = "recvbuf";
	b[0] = r->sendbuf;
	b[1] = r->recvbuf;
	switch (r->kind) {
	case COLL_BROADCAST:
		names[0] = "buf";
		b[0] = r->recvbuf;
		return 1;
	case COLL_REDUCE:
	case COLL_GATHER:
		if (c->rank != r->root)
			b[1] = NULL;
		return 2;
	case COLL_SCATTER:
		if (c->rank != r->root)
			b[0] = NULL;
		return 2;
	case COLL_ALLREDUCE: case COLL_ALLGATHER: case COLL_REDUCESCATTER: case COLL_ALLTOALL:
		return 2;
	default:
		return 0;
	}
}

/*
 * Finds what memory r's buffers are (mem.h) and, for device memory, readies the comm's
 * device state on the call's stream. Both buffers must be of one kind: host and pinned
 * host memory count as one, device memory as another.
 */
static khor_status mem_begin(khor_comm *c, struct khor_request *r, kmem_where *where,
                             kerr *err)
{
	const void *b[2];
	const char *names[2];
	kmem_where w[2];
	int n = call_buffers(c, r, b, names), dev = -1, host = -1;

	where->kind = KMEM_HOST;
	where->be = NULL;
	where->device = -1;
	where->ctx = NULL;
	for (int i = 0; i < n; i++) {
		if (b[i] == NULL)
			continue;
		kmem_query(b[i], &w[i]);
		if (w[i].kind == KMEM_DEVICE) {
			if (dev >= 0 && (w[i].be != w[dev].be || w[i].device != w[dev].device))
				return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s seq %u: %s and %s are on "
				                "different devices (%s device %d, %s device %d): a call "
				                "runs on one", kind_names[r->kind], r->seq, names[dev],
				                names[i], w[dev].be->name, w[dev].device, w[i].be->name,
				                w[i].device);
			dev = i;
		} else {
			host = i;
		}
	}
	if (dev < 0)
		return KHOR_SUCCESS;
	if (host >= 0) {
		char a[64], d[64];
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s seq %u: %s is %s but %s is %s: both "
		                "buffers of a call must be host memory or both device memory",
		                kind_names[r->kind], r->seq, names[host],
		                kmem_describe(&w[host], a, sizeof(a)), names[dev],
		                kmem_describe(&w[dev], d, sizeof(d)));
	}
	*where = w[dev];
	khor_status st = kmem_state_begin(&c->mem, where, r->has_stream, r->stream,
	                                  c->cc.scratch_len, err);
	if (st != KHOR_SUCCESS)
		kerr_prefix(err, "%s seq %u on %s device %d", kind_names[r->kind], r->seq,
		            where->be->name, where->device);
	return st;
}

/*
 * Waits on the host for everything queued on the call's stream so far, up to the comm's
 * timeout, looking once a second whether another rank has failed the job (work queued
 * on the device, an NCCL kernel, may wait for a rank that will never come).
 */
static khor_status stream_wait(khor_comm *c, const char *what, int64_t timeout_ms, kerr *err)
{
	kmem_state *m = &c->mem;
	const kdeadline dl = kdeadline_in_ms(timeout_ms);
	void *ev = NULL;
	khor_status st = kmem_event_get(m, &ev, err);

	if (st == KHOR_SUCCESS)
		st = m->be->event_record(ev, m->stream, err);
	while (st == KHOR_SUCCESS) {
		kdeadline slice = kdeadline_in_ms(1000);
		if (kdeadline_left_ms(dl, 1000) < 1000)
			slice = dl;
		st = kmem_event_wait(m->be, ev, slice, what, err);
		if (st != KHOR_ERR_TIMEOUT || kdeadline_passed(dl))
			break;
		kerr_clear(err);
		if (c->cc.check_abort != NULL &&
		    (st = c->cc.check_abort(c->cc.owner, err)) != KHOR_SUCCESS)
			break;
		st = KHOR_SUCCESS;
	}
	if (ev != NULL && st == KHOR_SUCCESS)
		kmem_event_put(m, ev);
	else if (ev != NULL)
		m->be->event_destroy(ev); /* it may still be pending: not for reuse */
	return st;
}

/*
 * Ends a call's device side: a blocking call (no stream of the caller's) returns once the
 * result is in place, so it waits for the stream here, up to the comm's timeout; a stream
 * form leaves that to the stream. After an error the stream is waited for too (briefly),
 * so that nothing queued still writes into the comm's scratch under the next call.
 */
static khor_status mem_end(khor_comm *c, struct khor_request *r, khor_status st, kerr *err)
{
	kmem_state *m = &c->mem;
	char what[64];
	kerr e;

	if (m->be == NULL)
		return st;
	snprintf(what, sizeof(what), "%s seq %u", kind_names[r->kind], r->seq);
	if (st != KHOR_SUCCESS) {
		/* Free what may still wait inside NCCL, then let the stream drain a moment. */
		nccl_comm_abort(c);
		(void)stream_wait(c, what, 2000, &e);
	} else if (!r->has_stream) {
		st = stream_wait(c, what, c->cc.timeout_ms, err);
		if (st != KHOR_SUCCESS)
			nccl_comm_abort(c);
	}
	kmem_state_end(m);
	return st;
}

static khor_status run_one(khor_comm *c, struct khor_request *r)
{
	kerr err;
	khor_status st;

	kerr_clear(&err);
	pthread_mutex_lock(&c->mu);
	st = c->err.status;
	if (st != KHOR_SUCCESS)
		r->err = c->err;
	pthread_mutex_unlock(&c->mu);
	if (st != KHOR_SUCCESS)
		return st; /* sticky: fail fast with the first error */
	/* One collective runs at a time, so the groups can take this call's settings. */
	c->cc.algo = c->node_cc.algo = c->cross_cc.algo = r->algo;
	c->run_hier = r->hier;
	/* The memory the call runs on (mem.h), then its buffers' registration (comm.h:
	 * comm_reg_policy), begin and end here. */
	kmem_where where;
	st = mem_begin(c, r, &where, &err);
	/* The others are in this call already and wait for this rank: tell them why not. */
	const bool tell = st != KHOR_SUCCESS;
	if (st == KHOR_SUCCESS) {
		comm_reg_begin(c, r);
		st = dispatch(c, r, &where, &err);
		comm_reg_end(c);
		st = mem_end(c, r, st, &err);
	}
	if (st == KHOR_ERR_TIMEOUT && err.peer >= 0 && c->ctx->store != NULL)
		blame_timeout(c, &err);
	if (st != KHOR_SUCCESS && c->ctx->cfg.elastic &&
	    (tell || err.status != KHOR_ERR_INVALID_ARG))
		st = comm_elastic_verdict(c->ctx, &err); /* the driver's word on the loss */
	else if (st == KHOR_ERR_REMOTE && c->ctx->store != NULL &&
	         strstr(err.text, "aborted by another rank") == NULL) {
		/*
		 * A closed or reset link is usually the echo of a failure elsewhere. Give the rank
		 * that failed first a moment to publish its cause, so we report that, not "reset".
		 */
		void *v;
		size_t len;
		kerr e;
		/*
		 * A peer that closed its link after an error of its own is an echo by construction,
		 * and the rank that failed first may itself wait these 300 ms before it publishes:
		 * wait longer for it (seen under load: a rank gave up just before the cause came).
		 */
		int64_t wait_ms = strstr(err.text, "after an error on its side") != NULL ? 1500 : 300;
		if (store_get(c->ctx->store, "abort", kdeadline_in_ms(wait_ms), &v, &len, &e) ==
		    KHOR_SUCCESS) {
			char mine[KERR_TEXT_MAX];
			kstrlcpy(mine, err.text, sizeof(mine));
			kerr_set(&err, KHOR_ERR_REMOTE, "the job was aborted by another rank: %s "
			         "(seen here as: %s)", (char *)v, mine);
			free(v);
		}
	}
	if (st != KHOR_SUCCESS) {
		comm_fail_tell(c, &err, tell || err.status != KHOR_ERR_INVALID_ARG);
		comm_name_error(c, &err, &r->err); /* the request's own text */
	}
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

/* The node-aware mode of a call of this kind: Horovod's per-collective switch if set. */
static int8_t hier_for_locked(const khor_comm *c, unsigned kind)
{
	if (kind == COLL_ALLREDUCE && c->tune_hier_allreduce >= 0)
		return (int8_t)c->tune_hier_allreduce;
	if (kind == COLL_ALLGATHER && c->tune_hier_allgather >= 0)
		return (int8_t)c->tune_hier_allgather;
	return (int8_t)c->tune_hier;
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
		c->refs++; /* dropped by khor_request_free */
		r->comm = c;
		r->seq = c->next_seq++;
		if (r->kind == COLL_SPLIT)
			c->next_seq++; /* its second exchange (split.c) */
		r->algo = (int8_t)c->tune_algo;
		r->hier = hier_for_locked(c, r->kind);
		r->done = false;
		kerr_clear(&r->err);
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
	 * The collective enforces KHOR_TIMEOUT itself (past it, the liveness of the peers it
	 * waits for); this wait adds a margin for the collectives queued before it, each with
	 * its own deadline, and never waits forever: past the margin it waits on only while
	 * the comm's ranks are alive (the collectives warn; this guard does not).
	 */
	khor_status st;

	pthread_mutex_lock(&c->mu);
	if (r->done) {
		/* Its comm may be freed already (comm_release keeps only the lock alive). */
		st = r->status;
		pthread_mutex_unlock(&c->mu);
		return st;
	}
	int64_t t = c->ctx->cfg.timeout_ms;
	kdeadline dl = kdeadline_in_ms(t < 0 ? -1 : t * 4 + 10000);
	const uint64_t t0 = kclock_ns();
	while (!r->done) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		if (!r->done && kdeadline_passed(dl)) {
			const uint32_t seq = r->seq;
			int64_t again;
			kerr e;
			pthread_mutex_unlock(&c->mu);
			st = KHOR_ERR_TIMEOUT;
			coll_alive_ask q = { .waited_ms = (int64_t)((kclock_ns() - t0) / 1000000) };
			if (c->cc.check_alive != NULL)
				st = c->cc.check_alive(c, &q, &again, &e);
			pthread_mutex_lock(&c->mu);
			if (st == KHOR_SUCCESS || r->done) {
				if (st == KHOR_SUCCESS)
					dl = kdeadline_in_ms(again);
				continue;
			}
			pthread_mutex_unlock(&c->mu);
			if (st == KHOR_ERR_TIMEOUT)
				kerr_set(&e, KHOR_ERR_TIMEOUT, "collective seq %u did not complete within "
				         "the wait deadline (KHOR_TIMEOUT x 4 + 10 s)", seq);
			else
				kerr_prefix(&e, "khor_wait on collective seq %u", seq);
			comm_fail(c, &e);
			return st;
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
	if (r->kind == COLL_SPLIT)
		c->next_seq++; /* its second exchange (split.c) */
	r->algo = (int8_t)c->tune_algo;
	r->hier = hier_for_locked(c, r->kind);
	r->done = false;
	kerr_clear(&r->err);
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

khor_status comm_set(khor_comm *c, const char *key, const char *value, kerr *err)
{
	int v;
	khor_status st;
	bool algo = strcmp(key, "KHOR_ALGO") == 0;

	if (!algo && strcmp(key, "KHOR_HIER") != 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "rank %d: khor_comm_set: %s cannot be "
		                "changed after init (only KHOR_ALGO and KHOR_HIER can)", c->rank, key);
	st = algo ? config_parse_algo(value, &v, err) : config_parse_hier(value, &v, err);
	if (st != KHOR_SUCCESS) {
		kerr_prefix(err, "rank %d: khor_comm_set", c->rank);
		return st;
	}
	pthread_mutex_lock(&c->mu);
	if (algo) {
		c->tune_algo = v;
	} else {
		c->tune_hier = v;
		c->tune_hier_allreduce = c->tune_hier_allgather = -1;
	}
	pthread_mutex_unlock(&c->mu);
	return KHOR_SUCCESS;
}
