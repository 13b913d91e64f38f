/*
 * tree.c -- binomial trees rooted anywhere: broadcast, reduce, gather, scatter.
 *
 * Ranks are renumbered relative to the root, v = (rank - root) mod n. The parent of v is v
 * with its lowest set bit cleared; the children of v are v + 2^k for every 2^k below that
 * bit (every 2^k < n for the root). Subtree v holds the relative ranks [v, v + min(lowbit(v),
 * n - v)). With n = 7:
 *
 *            0                     round 1: 0 -> 4
 *         /  |  \                  round 2: 0 -> 2, 4 -> 6
 *        4   2   1                 round 3: 0 -> 1, 2 -> 3, 4 -> 5
 *       / \   \
 *      6   5   3
 *
 * ceil(log2 n) rounds, the fewest any schedule needs, which is why these serve small
 * messages (large broadcasts take the chain in bcast.c; large reductions the ring).
 *
 * broadcast: slices of slice_bytes go down the tree, max_lanes of them in flight; a rank
 * forwards slice k to all its children as soon as it has it, in slice order.
 *
 * reduce: the reverse. Slices are combined as own op child(v+1) op child(v+2) op
 * child(v+4) ..., i.e. always (lower relative ranks) op (higher), so the bits depend only
 * on n, the root and the data. Partial sums live in scratch (two slots per lane: the
 * running sum and the child's slice); the root sums straight into recvbuf, leaves send
 * straight from sendbuf. Non-root recvbufs are never touched.
 *
 * gather / scatter: a subtree's blocks travel as one run in relative order; an inner rank
 * keeps them in a temp of its subtree's size: coll_tmp, of the call's memory kind, and not
 * coll_big, which a caller may be holding across the call. At the root relative order is
 * rotated by root, so a subtree's run may wrap past block n-1 of the root's buffer: such an
 * edge carries its run as two messages (up to block n-1, then from block 0), and the root's
 * buffer is read or written in place with no rotation copy. Every other edge carries one.
 * Both ends know from (n, root, subtree) alone which edges wrap.
 *
 * Every edge carries its first message even when it is empty (count 0), so ranks that
 * disagree on count see it in a frame header.
 */
#include "base/dtype.h"
#include "algos.h"

#include "reduce.h"

#include <stdio.h>
#include <string.h>

#define TREE_MAX_LANES 32
#define TREE_MAX_CHILDREN 32

/* A rank's place in the binomial tree rooted at root. */
struct node {
	int v;        /* relative rank */
	int parent;   /* absolute rank, -1 at the root */
	int subtree;  /* relative ranks [v, v + subtree) below and including v */
	int nch;
	int child[TREE_MAX_CHILDREN]; /* relative ranks, increasing (smallest subtree first) */
};

static inline int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

static void node_init(struct node *t, int n, int rank, int root)
{
	int low;

	t->v = mod(rank - root, n);
	if (t->v == 0) {
		low = 1;
		while (low < n)
			low <<= 1;
		t->parent = -1;
	} else {
		low = t->v & -t->v;
		t->parent = ((t->v - low) + root) % n;
	}
	t->subtree = low < n - t->v ? low : n - t->v;
	t->nch = 0;
	for (int mask = 1; mask < low && t->v + mask < n; mask <<= 1)
		t->child[t->nch++] = t->v + mask;
}

static inline int absolute(int v, int n, int root)
{
	return (v + root) % n;
}

/*
 * How the run of relative blocks [v, v + s) travels between v and its parent: whole
 * (len1 = 0: one message), unless the parent is the root and the run wraps past block n-1
 * there (two messages). len0 >= 1 always, so the first message is never skipped.
 */
static void edge_split(int v, int s, int n, int root, int *len0, int *len1)
{
	int a = absolute(v, n, root);

	*len0 = s;
	if ((v & (v - 1)) == 0 && a + s > n) /* v's parent is the root */
		*len0 = n - a;
	*len1 = s - *len0;
}

/* Waits until every transfer in x has finished (or one failed). */
static khor_status wait_all(coll_comm *cc, coll_wait *w, coll_xfer *x, int nx, kerr *err)
{
	khor_status st = KHOR_SUCCESS;

	for (;;) {
		bool done = true;
		for (int i = 0; i < nx; i++)
			done &= coll_done(cc, &x[i], &st, err);
		if (st != KHOR_SUCCESS || done)
			return st;
		st = coll_wait_step(cc, w, x, nx, err);
		if (st != KHOR_SUCCESS)
			return st;
	}
}

static void tree_fail(coll_comm *cc, coll_xfer *x, int nx, const char *what, const char *algo,
                      kerr *err)
{
	coll_drain(cc, x, nx);
	if (strncmp(err->text, what, strlen(what)) != 0)
		kerr_prefix(err, "%s (%s)", what, algo);
}

khor_status binomial_broadcast(coll_comm *cc, void *buf, size_t count, khor_dtype dtype,
                               int root, uint32_t seq, kerr *err)
{
	const int n = cc->size;
	const size_t bytes = count * kdtype_size(dtype);
	const uint32_t meta = coll_meta_make(COLL_BROADCAST, dtype, 0);
	struct node t;
	size_t slice = cc->slice_bytes ? cc->slice_bytes : 1 << 20, nslices;
	size_t recv_posted, recv_done, fwd, retired;
	int window = cc->max_lanes < 1 ? 1 : (cc->max_lanes > TREE_MAX_LANES ? TREE_MAX_LANES :
	                                      cc->max_lanes);
	/* Per window slot: [0] the receive from the parent, [1 + i] the send to child i. */
	coll_xfer x[TREE_MAX_LANES][1 + TREE_MAX_CHILDREN];
	uint8_t *p = buf;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1)
		return KHOR_SUCCESS;
	node_init(&t, n, cc->rank, root);
	nslices = bytes == 0 ? 1 : (bytes + slice - 1) / slice;
	while (nslices >= UINT32_MAX) {
		slice *= 2;
		nslices = (bytes + slice - 1) / slice;
	}
	memset(x, 0, sizeof(x));
	coll_wait_begin(cc, &w, "broadcast seq %u (root %d)", seq, root);
	recv_posted = recv_done = t.parent < 0 ? nslices : 0; /* the root has every slice */
	fwd = retired = 0;

	/*
	 * recv_done <= recv_posted, fwd <= recv_done: slices are received and forwarded in
	 * order (a link delivers frames in the order they were posted, so forwarding out of
	 * order could park a frame the child has no receive for yet in front of one it waits
	 * for). Slot k % window is free again once slice k - window is retired.
	 */
	while (st == KHOR_SUCCESS && retired < nslices) {
		bool moved = false;

		while (st == KHOR_SUCCESS && recv_posted < nslices && recv_posted - retired <
		       (size_t)window) {
			size_t k = recv_posted, off = k * slice;
			size_t len = bytes - off < slice ? bytes - off : slice;
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			st = coll_post(cc, &x[k % (size_t)window][0], t.parent, false, p + off, len, tag,
			               w.dl, err);
			recv_posted++;
			moved = true;
		}
		while (st == KHOR_SUCCESS && recv_done < recv_posted &&
		       coll_done(cc, &x[recv_done % (size_t)window][0], &st, err) &&
		       st == KHOR_SUCCESS) {
			recv_done++;
			moved = true;
		}
		while (st == KHOR_SUCCESS && fwd < recv_done && fwd - retired < (size_t)window) {
			size_t k = fwd, off = k * slice;
			size_t len = bytes - off < slice ? bytes - off : slice;
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			/* The largest subtree (last child) first: it has the longest way to go. */
			for (int i = t.nch - 1; i >= 0 && st == KHOR_SUCCESS; i--)
				st = coll_post(cc, &x[k % (size_t)window][1 + i], absolute(t.child[i], n, root),
				               true, p + off, len, tag, w.dl, err);
			fwd++;
			moved = true;
		}
		while (st == KHOR_SUCCESS && retired < fwd) {
			bool done = true;
			for (int i = 0; i < t.nch; i++)
				done &= coll_done(cc, &x[retired % (size_t)window][1 + i], &st, err);
			if (!done || st != KHOR_SUCCESS)
				break;
			retired++;
			moved = true;
		}
		if (st == KHOR_SUCCESS && !moved && retired < nslices)
			st = coll_wait_step(cc, &w, &x[0][0], window * (1 + TREE_MAX_CHILDREN), err);
	}
	if (st != KHOR_SUCCESS)
		tree_fail(cc, &x[0][0], window * (1 + TREE_MAX_CHILDREN), coll_wait_what(&w), "binomial tree", err);
	return st;
}

struct rlane {
	bool active;
	int phase;     /* c < nch: receiving child c; nch: sending to the parent */
	size_t index;  /* which slice */
	uint8_t *acc;  /* running result (scratch, or recvbuf at the root) */
	uint8_t *got;  /* the child's slice */
	coll_xfer x;
};

khor_status binomial_reduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                            khor_dtype dtype, khor_op op, int root, uint32_t seq, kerr *err)
{
	const int n = cc->size;
	const size_t esz = kdtype_size(dtype);
	const uint32_t meta = coll_meta_make(COLL_REDUCE, dtype, op);
	const uint8_t *in = sendbuf;
	uint8_t *out = recvbuf;
	struct node t;
	struct rlane lanes[TREE_MAX_LANES];
	size_t slice_el, nlanes, next_lane = 0, lanes_done = 0;
	int nactive;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	coll_wait_begin(cc, &w, "reduce seq %u (root %d)", seq, root);
	if (n == 1)
		return coll_copy(cc, out, in, count * esz, err);
	if (!reduce_supported(dtype, op))
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s: op %d is not supported for dtype %d",
		                coll_wait_what(&w), (int)op, (int)dtype);
	node_init(&t, n, cc->rank, root);
	nactive = cc->max_lanes < 1 ? 1 : (cc->max_lanes > TREE_MAX_LANES ? TREE_MAX_LANES :
	                                   cc->max_lanes);
	while (nactive > 1 && cc->scratch_len / (2 * (size_t)nactive * esz) == 0)
		nactive /= 2;
	slice_el = cc->scratch_len / (2 * (size_t)nactive * esz);
	if (slice_el == 0)
		return kerr_set(err, KHOR_ERR_INTERNAL, "%s: scratch of %zu bytes cannot hold two "
		                "%zu-byte elements", coll_wait_what(&w), cc->scratch_len, esz);
	nlanes = count == 0 ? 1 : (count + slice_el - 1) / slice_el;
	if (nlanes >= UINT32_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: %zu slices of %zu bytes are too many "
		                "to tag; raise KHOR_SLICE_BYTES", coll_wait_what(&w), nlanes, slice_el * esz);
	if ((size_t)nactive > nlanes)
		nactive = (int)nlanes;
	memset(lanes, 0, sizeof(lanes));

	uint8_t *const scratch0 = coll_scratch(cc);
	while (st == KHOR_SUCCESS && lanes_done < nlanes) {
		bool moved = false;

		for (int li = 0; li < nactive && st == KHOR_SUCCESS; li++) {
			struct rlane *L = &lanes[li];
			uint8_t *scratch = scratch0 + (size_t)(2 * li) * slice_el * esz;
			size_t off, len;

			if (!L->active) {
				if (next_lane >= nlanes)
					continue;
				L->active = true;
				L->index = next_lane++;
				L->phase = -1;
				L->got = scratch;
				off = L->index * slice_el;
				L->acc = t.parent < 0 ? out + off * esz : scratch + slice_el * esz;
			} else {
				bool done = coll_done(cc, &L->x, &st, err);
				if (st != KHOR_SUCCESS || !done)
					continue;
			}
			moved = true;
			off = L->index * slice_el;
			len = count - off < slice_el ? count - off : slice_el;
			tp_tag tag = { cc->comm_id, seq, (uint32_t)L->index, meta };
			if (L->phase >= 0 && L->phase < t.nch) {
				/* Child phase's slice is in: fold it in, lower relative ranks first. */
				const uint8_t *a = L->phase == 0 ? in + off * esz : L->acc;
				st = coll_reduce(cc, L->acc, a, L->got, len, dtype, op, err);
				if (st != KHOR_SUCCESS)
					break;
			}
			if (L->phase == t.nch || (L->phase == t.nch - 1 && t.parent < 0)) {
				if (t.parent < 0 && op == KHOR_AVG)
					st = coll_avg_finish(cc, L->acc, len, dtype, n, err);
				if (st == KHOR_SUCCESS && t.parent < 0 && t.nch == 0)
					st = coll_copy(cc, L->acc, in + off * esz, len * esz, err);
				if (st != KHOR_SUCCESS)
					break;
				L->active = false;
				lanes_done++;
				li--; /* reuse this slot for the next lane right away */
				continue;
			}
			L->phase++;
			if (L->phase < t.nch) {
				st = coll_post(cc, &L->x, absolute(t.child[L->phase], n, root), false, L->got,
				               len * esz, tag, w.dl, err);
			} else {
				/* A leaf sends its own data; an inner rank its running result. */
				const uint8_t *src = t.nch == 0 ? in + off * esz : L->acc;
				st = coll_post(cc, &L->x, t.parent, true, (void *)src, len * esz, tag, w.dl,
				               err);
			}
		}
		if (st != KHOR_SUCCESS || lanes_done == nlanes)
			break;
		if (!moved) {
			coll_xfer xs[TREE_MAX_LANES];
			for (int li = 0; li < nactive; li++)
				xs[li] = lanes[li].x;
			st = coll_wait_step(cc, &w, xs, nactive, err);
		}
	}
	if (st != KHOR_SUCCESS) {
		coll_xfer xs[TREE_MAX_LANES];
		for (int li = 0; li < nactive; li++)
			xs[li] = lanes[li].x;
		tree_fail(cc, xs, nactive, coll_wait_what(&w), "binomial tree", err);
	}
	return st;
}

khor_status binomial_gather(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                            khor_dtype dtype, int root, uint32_t seq, kerr *err)
{
	const int n = cc->size;
	const size_t bsz = count * kdtype_size(dtype);
	const uint32_t meta = coll_meta_make(COLL_GATHER, dtype, 0);
	uint8_t *out = recvbuf, *tmp = NULL;
	coll_xfer x[2 * TREE_MAX_CHILDREN + 2];
	struct node t;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1)
		return coll_copy(cc, out, sendbuf, bsz, err);
	node_init(&t, n, cc->rank, root);
	coll_wait_begin(cc, &w, "gather seq %u (root %d)", seq, root);
	memset(x, 0, sizeof(x));
	if (t.parent < 0) {
		/* Before anything arrives: sendbuf may lie inside recvbuf. */
		st = coll_copy(cc, out + (size_t)cc->rank * bsz, sendbuf, bsz, err);
	} else if (t.nch > 0) {
		tmp = coll_tmp(cc, (size_t)t.subtree * bsz + 1);
		if (tmp == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory for the %d blocks "
			                "of %zu bytes of this rank's subtree", coll_wait_what(&w), t.subtree, bsz);
		st = coll_copy(cc, tmp, sendbuf, bsz, err);
	}
	/* Every child's run, straight into its place. */
	for (int i = 0; i < t.nch && st == KHOR_SUCCESS; i++) {
		int c = t.child[i], s = i + 1 < t.nch ? t.child[i + 1] - c : t.v + t.subtree - c;
		int len[2];
		uint8_t *dst[2];
		edge_split(c, s, n, root, &len[0], &len[1]);
		if (t.parent < 0) {
			dst[0] = out + (size_t)absolute(c, n, root) * bsz;
			dst[1] = out;
		} else {
			dst[0] = tmp + (size_t)(c - t.v) * bsz;
			dst[1] = dst[0] + (size_t)len[0] * bsz;
		}
		for (int k = 0; k < (len[1] > 0 ? 2 : 1) && st == KHOR_SUCCESS; k++) {
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			st = coll_post(cc, &x[2 * i + k], absolute(c, n, root), false, dst[k],
			               (size_t)len[k] * bsz, tag, w.dl, err);
		}
	}
	if (st == KHOR_SUCCESS)
		st = wait_all(cc, &w, x, 2 * t.nch, err);
	/* Then our whole subtree up to the parent. */
	if (st == KHOR_SUCCESS && t.parent >= 0) {
		const uint8_t *src = t.nch > 0 ? tmp : sendbuf;
		int len[2];
		edge_split(t.v, t.subtree, n, root, &len[0], &len[1]);
		for (int k = 0; k < (len[1] > 0 ? 2 : 1) && st == KHOR_SUCCESS; k++) {
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			st = coll_post(cc, &x[k], t.parent, true,
			               (void *)(src + (k == 0 ? 0 : (size_t)len[0] * bsz)),
			               (size_t)len[k] * bsz, tag, w.dl, err);
		}
		if (st == KHOR_SUCCESS)
			st = wait_all(cc, &w, x, 2, err);
	}
	if (st != KHOR_SUCCESS)
		tree_fail(cc, x, 2 * TREE_MAX_CHILDREN + 2, coll_wait_what(&w), "binomial tree", err);
	return st;
}

khor_status binomial_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                             khor_dtype dtype, int root, uint32_t seq, kerr *err)
{
	const int n = cc->size;
	const size_t bsz = count * kdtype_size(dtype);
	const uint32_t meta = coll_meta_make(COLL_SCATTER, dtype, 0);
	const uint8_t *in = sendbuf;
	uint8_t *out = recvbuf, *tmp = NULL;
	coll_xfer x[2 * TREE_MAX_CHILDREN + 2];
	struct node t;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1)
		return coll_copy(cc, out, in, bsz, err);
	node_init(&t, n, cc->rank, root);
	coll_wait_begin(cc, &w, "scatter seq %u (root %d)", seq, root);
	memset(x, 0, sizeof(x));
	/* Our subtree's run from the parent: into recvbuf for a leaf, else into tmp. */
	if (t.parent >= 0) {
		int len[2];
		uint8_t *dst = out;
		if (t.nch > 0) {
			tmp = coll_tmp(cc, (size_t)t.subtree * bsz + 1);
			if (tmp == NULL)
				return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory for the %d "
				                "blocks of %zu bytes of this rank's subtree", coll_wait_what(&w), t.subtree,
				                bsz);
			dst = tmp;
			in = tmp;
		}
		edge_split(t.v, t.subtree, n, root, &len[0], &len[1]);
		for (int k = 0; k < (len[1] > 0 ? 2 : 1) && st == KHOR_SUCCESS; k++) {
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			st = coll_post(cc, &x[k], t.parent, false,
			               dst + (k == 0 ? 0 : (size_t)len[0] * bsz), (size_t)len[k] * bsz,
			               tag, w.dl, err);
		}
		if (st == KHOR_SUCCESS)
			st = wait_all(cc, &w, x, 2, err);
	}
	/* Each child its run, the largest subtree first. */
	for (int i = t.nch - 1; i >= 0 && st == KHOR_SUCCESS; i--) {
		int c = t.child[i], s = i + 1 < t.nch ? t.child[i + 1] - c : t.v + t.subtree - c;
		int len[2];
		const uint8_t *src[2];
		edge_split(c, s, n, root, &len[0], &len[1]);
		if (t.parent < 0) {
			src[0] = in + (size_t)absolute(c, n, root) * bsz;
			src[1] = in;
		} else {
			src[0] = in + (size_t)(c - t.v) * bsz;
			src[1] = src[0] + (size_t)len[0] * bsz;
		}
		for (int k = 0; k < (len[1] > 0 ? 2 : 1) && st == KHOR_SUCCESS; k++) {
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			st = coll_post(cc, &x[2 * i + k], absolute(c, n, root), true, (void *)src[k],
			               (size_t)len[k] * bsz, tag, w.dl, err);
		}
	}
	if (st == KHOR_SUCCESS)
		st = wait_all(cc, &w, x, 2 * t.nch, err);
	/* Our own block last: at the root recvbuf may overlap blocks still being sent. */
	if (st == KHOR_SUCCESS) {
		if (t.parent < 0)
			st = coll_copy(cc, out, in + (size_t)cc->rank * bsz, bsz, err);
		else if (t.nch > 0)
			st = coll_copy(cc, out, tmp, bsz, err);
	}
	if (st != KHOR_SUCCESS)
		tree_fail(cc, x, 2 * TREE_MAX_CHILDREN + 2, coll_wait_what(&w), "binomial tree", err);
	return st;
}
