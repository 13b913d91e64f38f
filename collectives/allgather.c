/*
 * allgather.c -- allgather: a pipelined ring for any block sizes, Bruck's dissemination
 * for small equal blocks.
 *
 * Ring (ring_allgatherv). Rank r sends to r+1 and receives from r-1; in step s = 0..n-2 it
 * forwards block (r-s), which it owns (s = 0) or received in step s-1, and receives block
 * (r-s-1) straight into its place in recvbuf. With n = 4:
 *
 *   step 0:  r0 -> r1: b0    r1 -> r2: b1    r2 -> r3: b2    r3 -> r0: b3
 *   step 1:  r0 -> r1: b3    r1 -> r2: b0    r2 -> r3: b1    r3 -> r0: b2
 *   step 2:  r0 -> r1: b2    r1 -> r2: b3    r2 -> r3: b0    r3 -> r0: b1
 *
 * Blocks are cut into slices of slice_bytes; slice j of every block is lane j, an
 * independent (n-1)-step pipeline, and up to max_lanes lanes are in flight, as in ring.c.
 * Every lane sends at every step even when its slice of the block is empty (uneven or zero
 * counts), so ranks that disagree on a count see it in a frame header. Nothing is staged:
 * data moves between the wire and recvbuf.
 *
 * Bruck (rd_allgather). ceil(log2 n) rounds for any n, no final rotation and no scratch.
 * Before round k rank r holds the d = 2^k blocks r, r+1, .., r+d-1 (mod n); it sends the
 * first m = min(d, n-d) of them to r-d and receives blocks r+d .. r+d+m-1 from r+d. With
 * n = 6 (rank 0's view; "x" = held):
 *
 *   blocks       0 1 2 3 4 5
 *   start        x . . . . .
 *   round 0 d=1  x x . . . .      got 1     from rank 1
 *   round 1 d=2  x x x x . .      got 2,3   from rank 2
 *   round 2 d=4  x x x x x x      got 4,5   from rank 4 (m = min(4, 2) = 2)
 *
 * Blocks are kept at their final places in recvbuf, so a run of blocks that wraps past
 * block n-1 travels as two messages, any other run as one. Each rank
 * receives n-1 blocks in total, like recursive doubling, but n need not be a power of two
 * and no rank sits out (the fold-in/fold-out fix would cost two extra steps and a whole
 * extra copy of the data for the folded ranks).
 *
 * Both: sendbuf is copied into its place first (coll_copy, skipped when it already is
 * there), so sendbuf may lie anywhere inside recvbuf.
 */
#include "base/dtype.h"
#include "algos.h"

#include <stdio.h>
#include <string.h>

#define AG_MAX_LANES COLL_MAX_LANES

struct lane {
	bool active;
	int step;      /* 0 .. n-2 */
	size_t index;  /* which slice of every block */
	coll_xfer x[2]; /* [0] receive, [1] send */
};

static inline int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

/* Byte range of recvbuf that lane `index` covers in block b. */
static void lane_bytes(const size_t *counts, const size_t *displs, int b, size_t index,
                       size_t slice_el, size_t esz, size_t *off, size_t *len)
{
	size_t lo = index * slice_el, hi = lo + slice_el;

	if (lo > counts[b])
		lo = counts[b];
	if (hi > counts[b])
		hi = counts[b];
	*off = (displs[b] + lo) * esz;
	*len = (hi - lo) * esz;
}

khor_status ring_allgatherv(coll_comm *cc, const void *sendbuf, void *recvbuf,
                            const size_t *counts, const size_t *displs, khor_dtype dtype,
                            uint32_t seq, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const int right = (r + 1) % n, left = (r - 1 + n) % n;
	const int nsteps = n - 1;
	const size_t esz = kdtype_size(dtype);
	uint8_t *out = recvbuf;
	size_t slice_el, max_count = 0, nlanes, next_lane = 0, lanes_done = 0;
	int nactive;
	struct lane lanes[AG_MAX_LANES];
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	st = coll_copy(cc, out + displs[r] * esz, sendbuf, counts[r] * esz, err);
	if (st != KHOR_SUCCESS || n == 1)
		return st;
	coll_wait_begin(cc, &w, "allgather seq %u", seq, -1);
	for (int i = 0; i < n; i++)
		max_count = counts[i] > max_count ? counts[i] : max_count;
	slice_el = cc->slice_bytes / esz;
	if (slice_el == 0)
		slice_el = 1;
	nlanes = max_count == 0 ? 1 : (max_count + slice_el - 1) / slice_el;
	/* The tag's step field holds lane * nsteps + step; widen slices if that would overflow. */
	while (nlanes > (UINT32_MAX - 1) / (size_t)nsteps) {
		slice_el *= 2;
		nlanes = (max_count + slice_el - 1) / slice_el;
	}
	nactive = cc->max_lanes < 1 ? 1 : (cc->max_lanes > AG_MAX_LANES ? AG_MAX_LANES :
	                                   cc->max_lanes);
	if ((size_t)nactive > nlanes)
		nactive = (int)nlanes;
	memset(lanes, 0, sizeof(lanes));

	const uint32_t meta = coll_meta_make(COLL_ALLGATHER, dtype, 0);
	while (st == KHOR_SUCCESS && lanes_done < nlanes) {
		bool moved = false;

		for (int li = 0; li < nactive && st == KHOR_SUCCESS; li++) {
			struct lane *L = &lanes[li];

			if (!L->active) {
				if (next_lane >= nlanes)
					continue;
				L->active = true;
				L->index = next_lane++;
				L->step = -1;
			} else {
				bool rd = coll_done(cc, &L->x[0], &st, err);
				bool sd = coll_done(cc, &L->x[1], &st, err);
				if (st != KHOR_SUCCESS || !rd || !sd)
					continue;
				if (L->step == nsteps - 1) {
					L->active = false;
					lanes_done++;
					li--; /* reuse this slot for the next lane right away */
					moved = true;
					continue;
				}
			}
			moved = true;
			L->step++;
			const int s = L->step;
			size_t soff, slen, roff, rlen;
			lane_bytes(counts, displs, mod(r - s, n), L->index, slice_el, esz, &soff, &slen);
			lane_bytes(counts, displs, mod(r - s - 1, n), L->index, slice_el, esz, &roff,
			           &rlen);
			tp_tag tag = { cc->comm_id, seq, (uint32_t)(L->index * (size_t)nsteps + (size_t)s),
			               meta };
			st = coll_post(cc, &L->x[0], left, false, out + roff, rlen, tag, w.dl, err);
			if (st == KHOR_SUCCESS)
				st = coll_post(cc, &L->x[1], right, true, out + soff, slen, tag, w.dl, err);
		}
		if (st != KHOR_SUCCESS || lanes_done == nlanes)
			break;
		if (!moved)
			st = COLL_LANES_WAIT(cc, &w, lanes, nactive, err);
	}
	if (st != KHOR_SUCCESS) {
		COLL_LANES_DRAIN(cc, lanes, nactive);
		coll_wait_fail(&w, err, " (ring, step %d of %d)", lanes[0].step, nsteps);
	}
	return st;
}

/*
 * Blocks first .. first+m-1 (mod n) as two runs of whole blocks: [first, first+len0) and
 * [0, len1), len1 = 0 unless the run wraps past block n-1.
 */
static void wrap_split(int first, int m, int n, int *len0, int *len1)
{
	*len0 = first + m <= n ? m : n - first;
	*len1 = m - *len0;
}

khor_status rd_allgather(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, uint32_t seq, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t bsz = count * kdtype_size(dtype);
	const uint32_t meta = coll_meta_make(COLL_ALLGATHER, dtype, 0);
	uint8_t *out = recvbuf;
	coll_xfer x[4];
	coll_wait w;
	uint32_t round = 0;
	khor_status st = KHOR_SUCCESS;

	st = coll_copy(cc, out + (size_t)r * bsz, sendbuf, bsz, err);
	if (st != KHOR_SUCCESS || n == 1)
		return st;
	coll_wait_begin(cc, &w, "allgather seq %u", seq, -1);
	memset(x, 0, sizeof(x));

	for (int d = 1; st == KHOR_SUCCESS && d < n; d *= 2, round++) {
		const int m = d < n - d ? d : n - d;
		const int to = mod(r - d, n), from = (r + d) % n;
		int s0, s1, r0, r1;

		wrap_split(r, m, n, &s0, &s1);
		wrap_split(from, m, n, &r0, &r1);
		/* Post all four (two runs each way) before waiting: one round trip per round. */
		for (int k = 0; k < 2 && st == KHOR_SUCCESS; k++) {
			tp_tag tag = { cc->comm_id, seq, 2 * round + (uint32_t)k, meta };
			size_t rfirst = k == 0 ? (size_t)from : 0, sfirst = k == 0 ? (size_t)r : 0;
			size_t rlen = (size_t)(k == 0 ? r0 : r1), slen = (size_t)(k == 0 ? s0 : s1);
			/* A run that does not wrap is one message; both ends of it know that. */
			if (k == 0 || rlen > 0)
				st = coll_post(cc, &x[2 * k], from, false, out + rfirst * bsz, rlen * bsz,
				               tag, w.dl, err);
			if (st == KHOR_SUCCESS && (k == 0 || slen > 0))
				st = coll_post(cc, &x[2 * k + 1], to, true, out + sfirst * bsz, slen * bsz,
				               tag, w.dl, err);
		}
		while (st == KHOR_SUCCESS) {
			bool done = true;
			for (int i = 0; i < 4; i++)
				done &= coll_done(cc, &x[i], &st, err);
			if (st != KHOR_SUCCESS || done)
				break;
			st = coll_wait_step(cc, &w, x, 4, err);
		}
	}
	if (st != KHOR_SUCCESS) {
		coll_drain(cc, x, 4);
		coll_wait_fail(&w, err, " (Bruck, round %u)", round);
	}
	return st;
}
