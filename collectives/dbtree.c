/*
 * dbtree.c -- double binary tree allreduce (Sanders, Speck and Traeff 2009; NCCL's trees).
 *
 * A binary tree reduces up to its root and broadcasts back down in 2 log2(n) latency steps,
 * but a single tree leaves the leaves' upload links idle and the root's links doubly used.
 * Two trees, where every leaf of one is an inner node of the other, each carrying half of
 * the buffer, keep every rank sending and receiving about one buffer's worth: bandwidth
 * close to the ring's, with log2(n) instead of n steps.
 *
 * Tree A is the in-order binary tree over v = rank + 1 in 1..n: node v with lowest set bit
 * b has children v - b/2 and the largest v + c <= n (c a power of two <= b/2); its parent
 * is whichever of v +- b has lowest bit 2b (v - b when v + b is past n). Odd v are leaves.
 * Tree B is A over shifted ranks: mirrored (v -> n + 1 - v) when n is even, rotated by
 * one when n is odd, so that A's leaves (odd v) are B's inner nodes.
 *
 *   n = 8, tree A (ranks):            tree B (mirrored):
 *               7                             0
 *           3       -                     4       -
 *         1   5                         6   2
 *        0 2 4 6                       7 5 3 1
 *
 * Each half is cut into slices and pipelined: slice k goes up (receive the children's
 * partial sums, fold them in, send to the parent) while slice k-1 comes down (receive the
 * finished slice from the parent, pass it to the children). Up to `window` slices per
 * half are in flight.
 *
 * Determinism: an inner node folds (left child op self) op right child, always in that
 * order, and every rank receives the root's finished bits, so all ranks agree bit for bit.
 */
#include "base/dtype.h"
#include "algos.h"

#include <stdio.h>
#include <string.h>

struct tnode {
	int parent;    /* rank, -1 for the root */
	int child[2];  /* ranks, -1 when absent */
};

static int lowbit(int v)
{
	return v & -v;
}

/* In-order binary tree over virtual ids 1..n; results are virtual ids (0 = none). */
static void btree(int n, int v, int *parent, int *left, int *right)
{
	int b = lowbit(v);

	*left = b >= 2 ? v - b / 2 : 0;
	*right = 0;
	for (int c = b / 2; c >= 1; c /= 2) {
		if (v + c <= n) {
			*right = v + c;
			break;
		}
	}
	if (v + b <= n && lowbit(v + b) == 2 * b)
		*parent = v + b;
	else
		*parent = v - b; /* 0 for the root */
}

/* Rank <-> virtual id of tree t (0: identity + 1; 1: mirrored or rotated). */
static int to_v(int n, int t, int r)
{
	if (t == 0)
		return r + 1;
	return n % 2 == 0 ? n - r : (r + 1) % n + 1;
}

static int to_rank(int n, int t, int v)
{
	if (v == 0)
		return -1;
	if (t == 0)
		return v - 1;
	return n % 2 == 0 ? n - v : (v - 2 + n) % n;
}

static void tree_of(int n, int t, int r, struct tnode *out)
{
	int p, l, rr;

	btree(n, to_v(n, t, r), &p, &l, &rr);
	out->parent = to_rank(n, t, p);
	out->child[0] = to_rank(n, t, l);
	out->child[1] = to_rank(n, t, rr);
}

enum phase { P_IDLE, P_UP, P_UPSEND, P_DOWN, P_DOWNSEND, P_DONE };

struct job {
	enum phase ph;
	size_t k;          /* slice index within its half */
	size_t off, len;   /* elements */
	uint8_t *tmp[2];   /* children's partial sums */
	coll_xfer x[3];    /* receives from children or parent; sends */
};

static size_t tree_window(const coll_comm *cc)
{
	size_t window = cc->max_lanes < 1 ? 1 : (size_t)cc->max_lanes;
	return window > 16 ? 16 : window;
}

size_t dbtree_slice_bytes(const coll_comm *cc)
{
	size_t s = cc->scratch_len / (2 * 2 * tree_window(cc));
	return s < cc->slice_bytes ? s : cc->slice_bytes;
}

khor_status dbtree_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                             khor_dtype dtype, khor_op op, uint32_t seq, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t esz = kdtype_size(dtype);
	const uint32_t meta = coll_meta_sched(coll_meta_make(COLL_ALLREDUCE, dtype, op), ALGO_TREE);
	const uint8_t *in = sendbuf;
	uint8_t *out = recvbuf;
	struct tnode tn[2];
	size_t half_off[2], half_len[2], nslices[2], next[2] = { 0, 0 }, done[2] = { 0, 0 };
	size_t slice_el, window;
	struct job jobs[2][16];
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	/* Partial sums are built in place in recvbuf. */
	st = coll_copy(cc, out, in, count * esz, err);
	if (st != KHOR_SUCCESS || n == 1)
		return st;
	tree_of(n, 0, r, &tn[0]);
	tree_of(n, 1, r, &tn[1]);
	coll_block(count, 2, 0, &half_off[0], &half_len[0]);
	coll_block(count, 2, 1, &half_off[1], &half_len[1]);

	/* Scratch holds two child slices per job: size slices so that 2 halves x window fit. */
	window = tree_window(cc);
	slice_el = dbtree_slice_bytes(cc) / esz;
	if (slice_el == 0)
		slice_el = 1;
	for (int h = 0; h < 2; h++) {
		nslices[h] = half_len[h] == 0 ? 1 : (half_len[h] + slice_el - 1) / slice_el;
		while (nslices[h] * 4 >= UINT32_MAX / 2) {
			/* keep step ids in 32 bits for absurdly large buffers */
			slice_el *= 2;
			nslices[h] = (half_len[h] + slice_el - 1) / slice_el;
		}
	}
	if (2 * 2 * window * slice_el * esz > cc->scratch_len)
		window = cc->scratch_len / (4 * slice_el * esz) ? cc->scratch_len / (4 * slice_el * esz)
		                                                  : 1;
	if (4 * window * slice_el * esz > cc->scratch_len)
		return kerr_set(err, KHOR_ERR_INTERNAL, "tree allreduce: scratch too small");
	memset(jobs, 0, sizeof(jobs));
	for (int h = 0; h < 2; h++)
		for (size_t j = 0; j < window; j++)
			for (int c = 0; c < 2; c++)
				jobs[h][j].tmp[c] = (uint8_t *)coll_scratch(cc) +
				                    (((size_t)h * window + j) * 2 + (size_t)c) * slice_el * esz;

	coll_wait_begin(cc, &w, "allreduce seq %u (tree)", seq, -1);
	while (st == KHOR_SUCCESS && (done[0] < nslices[0] || done[1] < nslices[1])) {
		bool moved = false;

		for (int h = 0; h < 2 && st == KHOR_SUCCESS; h++) {
			const struct tnode *t = &tn[h];
			for (size_t j = 0; j < window && st == KHOR_SUCCESS; j++) {
				struct job *J = &jobs[h][j];
				bool d0, d1, d2;
				tp_tag tag = { cc->comm_id, seq, 0, meta };

				if (J->ph == P_IDLE || J->ph == P_DONE) {
					if (next[h] >= nslices[h])
						continue;
					J->k = next[h]++;
					J->off = half_off[h] + J->k * slice_el;
					J->len = J->k * slice_el >= half_len[h] ? 0 : half_len[h] - J->k * slice_el;
					if (J->len > slice_el)
						J->len = slice_el;
					J->ph = P_UP;
					tag.step = (uint32_t)((J->k * 2 + (size_t)h) * 2);
					for (int c = 0; c < 2 && st == KHOR_SUCCESS; c++)
						if (t->child[c] >= 0)
							st = coll_post(cc, &J->x[c], t->child[c], false, J->tmp[c],
							               J->len * esz, tag, w.dl, err);
					moved = true;
					continue;
				}
				d0 = coll_done(cc, &J->x[0], &st, err);
				d1 = coll_done(cc, &J->x[1], &st, err);
				d2 = coll_done(cc, &J->x[2], &st, err);
				if (st != KHOR_SUCCESS || !d0 || !d1 || !d2)
					continue;
				moved = true;
				uint8_t *o = out + J->off * esz;
				switch (J->ph) {
				case P_UP:
					/* (left op self) op right, in this order on every run. */
					if (t->child[0] >= 0)
						st = coll_reduce(cc, o, J->tmp[0], o, J->len, dtype,
						                 op, err);
					if (st == KHOR_SUCCESS && t->child[1] >= 0)
						st = coll_reduce(cc, o, o, J->tmp[1], J->len, dtype,
						                 op, err);
					if (st != KHOR_SUCCESS)
						break;
					if (t->parent >= 0) {
						tag.step = (uint32_t)((J->k * 2 + (size_t)h) * 2);
						st = coll_post(cc, &J->x[2], t->parent, true, o, J->len * esz, tag,
						               w.dl, err);
						J->ph = P_UPSEND;
						break;
					}
					if (op == KHOR_AVG)
						st = coll_avg_finish(cc, o, J->len, dtype, n, err);
					if (st != KHOR_SUCCESS)
						break;
					J->ph = P_DOWN; /* the root has the result: go straight down */
					goto down_send;
				case P_UPSEND:
					tag.step = (uint32_t)((J->k * 2 + (size_t)h) * 2 + 1);
					st = coll_post(cc, &J->x[2], t->parent, false, o, J->len * esz, tag, w.dl,
					               err);
					J->ph = P_DOWN;
					break;
				case P_DOWN:
				down_send:
					tag.step = (uint32_t)((J->k * 2 + (size_t)h) * 2 + 1);
					for (int c = 0; c < 2 && st == KHOR_SUCCESS; c++)
						if (t->child[c] >= 0)
							st = coll_post(cc, &J->x[c], t->child[c], true, o, J->len * esz,
							               tag, w.dl, err);
					J->ph = P_DOWNSEND;
					break;
				case P_DOWNSEND:
					J->ph = P_DONE;
					done[h]++;
					break;
				default:
					break;
				}
			}
		}
		if (st != KHOR_SUCCESS || (done[0] == nslices[0] && done[1] == nslices[1]))
			break;
		if (!moved) {
			coll_xfer xs[2 * 16 * 3];
			int nx = 0;
			for (int h = 0; h < 2; h++)
				for (size_t j = 0; j < window; j++)
					for (int c = 0; c < 3; c++)
						xs[nx++] = jobs[h][j].x[c];
			st = coll_wait_step(cc, &w, xs, nx, err);
		}
	}
	if (st != KHOR_SUCCESS) {
		for (int h = 0; h < 2; h++)
			for (size_t j = 0; j < window; j++)
				coll_drain(cc, jobs[h][j].x, 3);
		coll_wait_fail(&w, err, ", %zu slices in flight per tree", window);
	}
	return st;
}
