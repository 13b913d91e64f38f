/*
 * select.c -- predicted times of each schedule (see select.h).
 *
 * With p the largest power of two <= n, lp = log2 p, f = 2 extra steps when n != p (the
 * fold-in/fold-out of recursive doubling), D = depth of the binary trees, S the bytes:
 *
 *   ring       2(n-1) k a + 2(n-1)/n S b + (n-1)/n S g  (k = slices per chunk of S/n)
 *   rd         (lp+f) a + (lp+f) S b' + (lp + f/2) S g + spills  (b' = 1.5 b above 32 KiB)
 *   hd         (2lp+f) a + (2(p-1)/p + f) S b + ((p-1)/p + f/2) S g + spills
 *   tree       2D a + 2D s b + c S b + S g   (s = its slice, the pipeline's fill; c = 1 at
 *                                           n = 2, 1.5 at n = 3, 2 above: what a rank sends)
 *   binomial   ceil(log2 n) (a + S b)
 *   chain      (n - 2 + ceil(S/s)) (a + s b)
 *
 * Every slice the ring sends is a message: k a per step. Recursive doubling and halving-
 * doubling receive whole blocks before they fold them; a block of m bytes folded into m of
 * input and m of output needs 3m bytes cached, and above the rank's share of the cache
 * (m->cache) the received bytes go out to memory and come back for the fold: two more
 * passes, 2 m g ("spills"; one pass left the choice to calibration noise: alpha above
 * 21 us at 2 ranks, seen in 2 of 5 inits, turned 16-256 MiB over to hd, 1.02-1.15x). The
 * ring and the tree fold slices as they land and pay neither. At 2 ranks on 2 cores with
 * 16 MiB of cache each, halving-doubling was 0-22% faster than the ring from 2 to 8 MiB (the
 * ring's 4-16 slices) and the ring 10-35% faster from 16 MiB (hd's 8 MiB halves spill).
 *
 * The tree's 2 S b is what one rank sends: half the buffer up one tree, both halves down to
 * two children in the other... it is no cheaper than the ring in bandwidth, but its latency
 * grows with log n instead of n. The model is deliberately simple: its job is to rank the
 * schedules correctly, and the benchmark (khor-bench --algo auto against each fixed
 * algorithm) is what checks it.
 */
#include "select.h"

#include "rd.h"

#include <math.h>

static int ilog2(int n)
{
	int l = 0;
	while ((1 << (l + 1)) <= n)
		l++;
	return l;
}

/* Extra time of folding m received bytes that did not stay cached (see above). */
static double spill(const cost_model *m, double bytes)
{
	return m->cache > 0 && 3 * bytes > m->cache ? 2 * bytes * m->gamma : 0;
}

/* Messages per ring step: the chunk of S/n bytes in slices. */
static double ring_slices(const cost_model *m, int n, double S)
{
	double k = m->ring_slice > 0 ? ceil(S / n / m->ring_slice) : 1;
	return k < 1 ? 1 : k;
}

double cost_allreduce(const cost_model *m, int a, int n, size_t bytes, size_t slice)
{
	double S = (double)bytes, al = m->alpha, b = m->beta, g = m->gamma;
	int lp = ilog2(n), p = 1 << lp, f = n != p ? 2 : 0;
	int D = ilog2(n);

	if (n <= 1)
		return 0;
	switch (a) {
	case ALGO_RD: {
		/*
		 * Each round swaps the whole buffer both ways at once. Above one 32 KiB message
		 * that moved bytes at about 2/3 of the speed of the ring's and halving-doubling's
		 * smaller steps (interleaved on TCP loopback: 1.2-1.5x the ring's time at 2 ranks
		 * from 256 KiB to 1 MiB, where the plain model called them equal).
		 */
		double brd = S > 32768 ? 1.5 * b : b;
		return (lp + f) * al + (lp + f) * S * brd + (lp + f / 2.0) * S * g +
		       (lp + f / 2.0) * spill(m, S);
	}
	case ALGO_HD: {
		double t = (2 * lp + f) * al + (2.0 * (p - 1) / p + f) * S * b +
		           ((double)(p - 1) / p + f / 2.0) * S * g + (f ? spill(m, S) : 0);
		for (int i = 1; i <= lp; i++) /* the reduce-scatter halves */
			t += spill(m, S / (1 << i));
		return t;
	}
	case ALGO_TREE: {
		/* What one rank sends: S at n = 2 (both trees are one edge), 1.5 S at 3, 2 S above. */
		double sent = n == 2 ? S : n == 3 ? 1.5 * S : 2 * S;
		double s = S / 2 < (double)slice ? S / 2 : (double)slice;
		return 2 * D * al + 2 * D * s * b + sent * b + S * g;
	}
	default:
		return 2.0 * (n - 1) * ring_slices(m, n, S) * al + 2.0 * (n - 1) / n * S * b +
		       (double)(n - 1) / n * S * g;
	}
}

double cost_broadcast(const cost_model *m, int a, int n, size_t bytes, size_t slice)
{
	double S = (double)bytes, s = S < (double)slice ? S : (double)slice;

	if (n <= 1)
		return 0;
	if (a == BCAST_BINOMIAL)
		return ceil(log2(n)) * (m->alpha + S * m->beta);
	return (n - 2 + ceil(S / (s > 0 ? s : 1))) * (m->alpha + s * m->beta);
}

double cost_allgather(const cost_model *m, int a, int n, size_t bytes)
{
	double S = (double)bytes;
	int lp = ilog2(n), p = 1 << lp, f = n != p ? 2 : 0;

	if (n <= 1)
		return 0;
	if (a == AG_RD)
		return (lp + f) * m->alpha + ((double)(p - 1) / p + f) * S * m->beta;
	return (n - 1) * m->alpha + (double)(n - 1) / n * S * m->beta;
}

double cost_reduce_scatter(const cost_model *m, int a, int n, size_t bytes)
{
	double S = (double)bytes, t;
	int lp = ilog2(n);

	if (n <= 1)
		return 0;
	switch (a) {
	case RS_RD:
		return cost_allreduce(m, ALGO_RD, n, bytes, 0);
	case RS_HALVING: /* the first half of halving-doubling */
		t = lp * m->alpha + (double)(n - 1) / n * S * (m->beta + m->gamma);
		for (int i = 1; i <= lp; i++)
			t += spill(m, S / (1 << i));
		return t;
	default:
		return (n - 1) * (m->alpha + S / n * m->beta + S / n * m->gamma);
	}
}

/*
 * Recursive halving moves each half whole and folds it after it lands; the ring's slices
 * overlap the fold of one with the transfer of the next, which the model credits to
 * neither. Measured on TCP, 4 ranks, 3 jobs alternating with the build before it (which ran
 * the ring, or rd + copy at the smallest sizes): halving took 0.64-0.95x that time from
 * 8 to 128 KiB, 0.62-1.13x at 512 KiB, 0.83-0.87x at 2 MiB; against the ring at 4 and 8
 * ranks (2 jobs each) 0.96-1.31x at 8 MiB, 1.1-1.8x at 32 MiB, 1.1-1.3x at 128 MiB. So it
 * is a candidate only while its first half (the largest message) fits one ring slice.
 */
int cost_pick_reduce_scatter(const cost_model *m, int n, size_t bytes, size_t slice)
{
	int best = RS_RING;
	double bt = cost_reduce_scatter(m, RS_RING, n, bytes), t;

	if ((t = cost_reduce_scatter(m, RS_RD, n, bytes)) < bt) {
		best = RS_RD;
		bt = t;
	}
	if ((n & (n - 1)) == 0 && bytes / 2 <= slice &&
	    cost_reduce_scatter(m, RS_HALVING, n, bytes) < bt)
		best = RS_HALVING;
	return best;
}

/*
 * Within COST_RING_TIE of the best prediction, the ring wins. The model counts messages and
 * bytes; where another schedule moves the same bytes in about as many messages, the model
 * cannot rank them, and the measurements can: on rate-limited links between hosts the
 * ring's fixed-neighbour streams held 93-95% of the link bound at 2, 4 and 8 hosts, while
 * halving-doubling, whose partners change every step and whose steps wait for the slowest
 * pair, held 87-92%, 72-76% and 56-70% (PERFORMANCE 7), with predictions 0.05% apart. On
 * loopback the smallest margin by which the model prefers hd to the ring is 2.5% (2 ranks,
 * 4 MiB), so those picks stay as they were.
 */
#define COST_RING_TIE 0.02

int cost_pick_allreduce(const cost_model *m, int n, size_t bytes, size_t slice, double *t_out)
{
	static const int algos[] = { ALGO_RING, ALGO_RD, ALGO_HD, ALGO_TREE };
	int best = ALGO_RING;
	double bt = INFINITY, ring = INFINITY;

	for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
		double t = cost_allreduce(m, algos[i], n, bytes, slice);
		if (algos[i] == ALGO_RING)
			ring = t;
		if (t < bt) {
			bt = t;
			best = algos[i];
		}
	}
	if (best != ALGO_RING && ring <= bt * (1 + COST_RING_TIE)) {
		best = ALGO_RING;
		bt = ring;
	}
	if (t_out != NULL)
		*t_out = bt;
	return best;
}

void trial_begin(trial_slot *t, const cost_model *m, int n, size_t bytes, size_t slice,
                 double spread, unsigned rounds)
{
	static const int algos[] = { ALGO_RING, ALGO_RD, ALGO_HD, ALGO_TREE };
	double pred[4], cp[TRIAL_MAX_CAND], best;

	*t = (trial_slot){ .state = TRIAL_MODEL,
	                   .rounds = rounds < TRIAL_MAX_ROUNDS ? rounds : TRIAL_MAX_ROUNDS };
	best = INFINITY;
	for (int i = 0; i < 4; i++) {
		pred[i] = cost_allreduce(m, algos[i], n, bytes, slice);
		best = pred[i] < best ? pred[i] : best;
	}
	/* Candidates best predicted first (insertion by prediction; ties keep algos' order). */
	for (int i = 0; i < 4; i++) {
		if (!(pred[i] <= spread * best))
			continue;
		int j = t->ncand++;
		while (j > 0 && cp[j - 1] > pred[i]) {
			t->cand[j] = t->cand[j - 1];
			cp[j] = cp[j - 1];
			j--;
		}
		t->cand[j] = algos[i];
		cp[j] = pred[i];
	}
	t->block = best > 0 && best * TRIAL_BLOCK_MAX > TRIAL_BLOCK_S
	               ? (unsigned)ceil(TRIAL_BLOCK_S / best) : TRIAL_BLOCK_MAX;
	if (t->ncand > 1 && t->rounds > 0 && t->block >= TRIAL_BLOCK_MIN)
		t->state = TRIAL_RUNNING;
}

/*
 * Round k runs every candidate once, starting k candidates later, and odd rounds backwards:
 * a schedule that always ran right after the same other one would inherit its leftovers
 * (socket buffers, cache, a rank still finishing).
 */
int trial_algo(const trial_slot *t)
{
	unsigned b = t->calls / t->block; /* the block's number */
	unsigned k = b / (unsigned)t->ncand, i = b % (unsigned)t->ncand;
	unsigned j = (i + k) % (unsigned)t->ncand;

	if (k % 2)
		j = (unsigned)t->ncand - 1 - j;
	return t->cand[j];
}

bool trial_record(trial_slot *t, double measured, double predicted)
{
	int a = trial_algo(t);

	/* A block's first call is not counted: it inherits the previous schedule's leftovers. */
	if (t->calls % t->block != 0)
		t->sum += predicted > 0 ? measured / predicted : INFINITY;
	if (++t->calls % t->block == 0) {
		unsigned k = (t->calls / t->block - 1) / (unsigned)t->ncand; /* the round */
		for (int i = 0; i < t->ncand; i++)
			if (t->cand[i] == a)
				t->blocks[i][k] = t->sum / (t->block - 1);
		t->sum = 0;
	}
	if (t->calls < t->rounds * (unsigned)t->ncand * t->block)
		return false;
	/* the median of each candidate's blocks (the lower middle one of an even count) */
	for (int i = 0; i < t->ncand; i++) {
		double *v = t->blocks[i];
		unsigned nb = t->rounds;
		for (unsigned x = 1; x < nb; x++)
			for (unsigned y = x; y > 0 && v[y - 1] > v[y]; y--) {
				double tmp = v[y];
				v[y] = v[y - 1];
				v[y - 1] = tmp;
			}
		t->factor[i] = v[(nb - 1) / 2];
	}
	return true;
}

int trial_pick(trial_slot *t, const cost_model *m, int n, size_t bytes, size_t slice)
{
	double bt = INFINITY;
	int best = t->cand[0];

	if (t->last_bytes == bytes + 1)
		return t->last_pick;
	for (int i = 0; i < t->ncand; i++) {
		double x = t->factor[i] * cost_allreduce(m, t->cand[i], n, bytes, slice);
		if (x < bt) {
			bt = x;
			best = t->cand[i];
		}
	}
	t->last_bytes = bytes + 1;
	t->last_pick = best;
	return best;
}

int cost_pick_broadcast(const cost_model *m, int n, size_t bytes, size_t slice)
{
	return cost_broadcast(m, BCAST_BINOMIAL, n, bytes, slice) <=
	               cost_broadcast(m, BCAST_CHAIN, n, bytes, slice)
	           ? BCAST_BINOMIAL
	           : BCAST_CHAIN;
}

int cost_pick_allgather(const cost_model *m, int n, size_t bytes)
{
	return cost_allgather(m, AG_RD, n, bytes) <= cost_allgather(m, AG_RING, n, bytes) ? AG_RD
	                                                                                 : AG_RING;
}

/*
 * Calibration. Neighbours r and r^1 swap 8 bytes a few times (alpha) and 1 MiB a few times
 * (beta) in both directions at once, the way the schedules use links; gamma is one local
 * kernel run. Ranks without a partner contribute zeros, and an allreduce(max) makes every
 * rank hold the same, most pessimistic, model.
 */
#include "reduce.h"

#include <stdlib.h>
#include <string.h>

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

/*
 * A batch's alpha: its median, or, with a core per rank, at most 1.5x its 10th percentile.
 * The median was 1.2-1.3x the 10th percentile in 18 of 20 inits at 2 ranks; in the other 2
 * (both ranks on one core while they swapped, the other core busy) it was 8x, 75-80 us
 * against 9 us, and that model sent 16 MiB to the tree (1.4x the ring). With more ranks
 * than cores sharing a core is the steady state (medians 4-10x the 10th percentile at 4 and
 * 8 ranks on 2 cores) and the median is what the collectives will see.
 */
uint64_t cost_batch_alpha(const uint64_t *sorted, int k, bool own_cores)
{
	uint64_t med = sorted[k / 2], cap = sorted[k / 10] * 3 / 2;

	return own_cores && med > cap ? cap : med;
}

khor_status cost_measure(coll_comm *cc, uint32_t seq, bool own_cores, double v[3], kerr *err)
{
	enum { SMALL_ITERS = 30, BIG_ITERS = 4, BIG = 1 << 20 };
	int peer = cc->rank ^ 1;
	uint8_t *a = malloc(BIG), *b = malloc(BIG);
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	v[0] = v[1] = v[2] = 0;
	if (a == NULL || b == NULL) {
		free(a);
		free(b);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "cost model calibration: out of memory");
	}
	memset(a, 1, BIG);
	memset(b, 2, BIG);
	coll_wait_init(cc, &w, "cost model calibration");
	if (peer < cc->size) {
		const uint32_t meta = coll_meta_make(COLL_PROBE, KHOR_UINT8, 0);
		uint64_t small[2][SMALL_ITERS], big = UINT64_MAX, t0;
		/*
		 * Per-swap times: alpha is the lower of two batches' alphas (cost_batch_alpha: the
		 * median, capped with a core per rank), one batch before and one after the big
		 * swaps, beta the fastest big swap. A mean moved
		 * 3-10x from run to run whenever one swap in 30 was preempted for a few ms (ranks
		 * outnumbering cores, a shared machine), and a whole batch can land in a slow
		 * moment; every allreduce choice moved with it.
		 */
		for (int i = 0; i < SMALL_ITERS + 2 && st == KHOR_SUCCESS; i++) {
			tp_tag tag = { cc->comm_id, seq, (uint32_t)i, meta };
			t0 = kclock_ns();
			st = coll_sendrecv(cc, &w, peer, a, 8, peer, b, 8, tag, err);
			if (i >= 2) /* the first swaps also make the link */
				small[0][i - 2] = kclock_ns() - t0;
		}
		/* Two untimed big swaps first: TCP's congestion window and buffers grow there. */
		for (int i = 0; i < BIG_ITERS + 2 && st == KHOR_SUCCESS; i++) {
			tp_tag tag = { cc->comm_id, seq, (uint32_t)(100 + i), meta };
			t0 = kclock_ns();
			st = coll_sendrecv(cc, &w, peer, a, BIG, peer, b, BIG, tag, err);
			uint64_t t = kclock_ns() - t0;
			if (i >= 2 && t < big)
				big = t;
		}
		for (int i = 0; i < SMALL_ITERS && st == KHOR_SUCCESS; i++) {
			tp_tag tag = { cc->comm_id, seq, (uint32_t)(200 + i), meta };
			t0 = kclock_ns();
			st = coll_sendrecv(cc, &w, peer, a, 8, peer, b, 8, tag, err);
			small[1][i] = kclock_ns() - t0;
		}
		if (st == KHOR_SUCCESS) {
			qsort(small[0], SMALL_ITERS, sizeof(small[0][0]), cmp_u64);
			qsort(small[1], SMALL_ITERS, sizeof(small[1][0]), cmp_u64);
			uint64_t m0 = cost_batch_alpha(small[0], SMALL_ITERS, own_cores);
			uint64_t m1 = cost_batch_alpha(small[1], SMALL_ITERS, own_cores);
			v[0] = (double)(m0 < m1 ? m0 : m1) / 1e9;
			v[1] = ((double)big / 1e9 - v[0]) / BIG;
		}
		if (v[1] < 1e-12)
			v[1] = 1e-12;
	}
	if (st == KHOR_SUCCESS) {
		reduce_fn fn = reduce_kernel(KHOR_FLOAT32, KHOR_SUM);
		uint64_t best = UINT64_MAX;
		for (int i = 0; i < 3; i++) {
			uint64_t t0 = kclock_ns();
			fn(a, a, b, BIG / 4);
			uint64_t t = kclock_ns() - t0;
			best = t < best ? t : best;
		}
		v[2] = (double)best / 1e9 / BIG;
	}
	free(a);
	free(b);
	if (st != KHOR_SUCCESS)
		kerr_prefix(err, "cost model calibration");
	return st;
}

double cost_hier_allreduce(const cost_model *inner, const cost_model *outer, int L, int H,
                           size_t bytes, size_t slice)
{
	double S = (double)bytes, t = 0, cross;

	if (L > 1) /* reduce-scatter and allgather halves of a ring inside the host */
		t = 2.0 * (L - 1) * ring_slices(inner, L, S) * inner->alpha +
		    2.0 * (L - 1) / L * S * inner->beta +
		    (double)(L - 1) / L * S * inner->gamma;
	cost_pick_allreduce(outer, H, bytes / (size_t)(L > 0 ? L : 1), slice, &cross);
	return t + cross;
}
