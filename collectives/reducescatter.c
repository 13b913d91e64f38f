/*
 * reducescatter.c -- pipelined ring reduce-scatter: the first half of ring.c's allreduce,
 * arranged so that the last step of every chunk lands on its owner.
 *
 * Block b (coll_block: the first count % n blocks get one element more) ends on rank b.
 * Rank r sends to r+1 and receives from r-1; in step s = 0..n-2 it sends its partial sum of
 * block (r-s-1) and receives the partial of block (r-s-2), which it combines with its own
 * contribution. With n = 4 and block 3 (x_k is rank k's contribution):
 *
 *   step 0:  r0 sends x0          -> r1 computes x1 op x0
 *   step 1:  r1 sends x1 op x0    -> r2 computes x2 op (x1 op x0)
 *   step 2:  r2 sends ...         -> r3 computes x3 op (x2 op (x1 op x0)) into recvbuf
 *
 * recvbuf holds one block only, so partial sums live in scratch. Every block is cut into
 * slices; slice j of every block forms lane j, an independent (n-1)-step pipeline, and up to
 * max_lanes lanes are in flight. Each lane owns two scratch slots, A and B: in step s it
 * receives into one while it sends the partial it reduced in place in the other in step
 * s-1 (step 0 sends straight from sendbuf; the last step reduces into recvbuf):
 *
 *   lane j    step 0            step 1             step 2
 *   recv      -> A              -> B               -> A
 *   reduce    A = x op A        B = x op B         recvbuf = x op A
 *   send      x from sendbuf    A                  B
 *
 *   time ->   | step 0 | step 1 | step 2 |
 *   lane 0    |==s0====|==s1====|==s2====|
 *   lane 1       |==s0====|==s1====|==s2====|
 *
 * So slices are scratch_len / (2 * lanes) bytes, half the configured slice, and nothing is
 * copied that is not reduced.
 *
 * Determinism: block b is always combined in the order above, whatever the slicing, so
 * every run gives the same bits. avg divides once, on the owner, at the end.
 *
 * recvbuf may be sendbuf (result at its start, as MPI's in-place form) or sendbuf's own
 * block r (NCCL's in-place form); every other overlap is undefined. Both work without a
 * copy: in the first, recvbuf covers only the front of block 0 (the largest block), and
 * lane j reads its slice of block 0 in an earlier step than the one in which it writes
 * the same range of recvbuf; in the second, the only read of block r is the final reduce
 * that overwrites it element by element. Every lane sends its
 * message at every step, even when it is empty, so ranks that disagree on count see it in
 * a frame header.
 *
 * halving_reduce_scatter: recursive halving, for n a power of two, log2(n) steps instead of
 * n-1. Each rank starts with all n blocks; in the step with mask m it keeps the half of its
 * current blocks on its own side of bit m, sends the other half to r XOR m and folds the
 * partner's copy of the kept half in. Halves are cut at block boundaries (coll_block), so
 * uneven counts land as the ring lands them. n = 4, blocks [0 1 2 3]:
 *
 *   step 1 (m = 2): 0<->2, 1<->3   0,1 keep [0 1] (summed over the pair), 2,3 keep [2 3]
 *   step 2 (m = 1): 0<->1, 2<->3   rank r keeps block r, summed over all four
 *
 * It moves (n-1)/n of the buffer, as the ring does, in fewer and larger messages: the
 * small- and medium-size choice. Partial sums live in a temp of half the buffer (coll_big),
 * the last step folds straight into recvbuf, and sendbuf is read only in the first step,
 * so the two in-place forms above hold. The pair always combines (lower half of the
 * group) op (upper half), so every run gives the same bits.
 */
#include "base/dtype.h"
#include "algos.h"

#include "reduce.h"

#include <stdio.h>
#include <string.h>

#define RS_MAX_LANES COLL_MAX_LANES

struct lane {
	bool active;
	int step;       /* 0 .. n-2 */
	size_t index;   /* which slice of every block */
	uint8_t *slot[2];
	coll_xfer x[2]; /* [0] receive, [1] send */
};

static inline int mod(int a, int n)
{
	return ((a % n) + n) % n;
}


khor_status ring_reduce_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                                khor_dtype dtype, khor_op op, uint32_t seq, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const int right = (r + 1) % n, left = (r - 1 + n) % n;
	const int nsteps = n - 1;
	const size_t esz = kdtype_size(dtype);
	const uint8_t *in = sendbuf;
	uint8_t *out = recvbuf;
	size_t my_off, my_len, slice_el, max_block, nlanes, next_lane = 0, lanes_done = 0;
	int nactive;
	struct lane lanes[RS_MAX_LANES];
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	coll_wait_begin(cc, &w, "reduce_scatter seq %u", seq, -1);
	coll_block(count, n, r, &my_off, &my_len);
	if (n == 1)
		return coll_copy(cc, out, in, my_len * esz, err);
	if (!reduce_supported(dtype, op))
		return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "%s: op %d is not supported for dtype %d",
		                coll_wait_what(&w), (int)op, (int)dtype);
	/* Two slots per lane must fit in scratch; give up lanes before shrinking to nothing. */
	nactive = cc->max_lanes < 1 ? 1 : (cc->max_lanes > RS_MAX_LANES ? RS_MAX_LANES :
	                                   cc->max_lanes);
	while (nactive > 1 && cc->scratch_len / (2 * (size_t)nactive * esz) == 0)
		nactive /= 2;
	slice_el = cc->scratch_len / (2 * (size_t)nactive * esz);
	if (slice_el == 0)
		return kerr_set(err, KHOR_ERR_INTERNAL, "%s: scratch of %zu bytes cannot hold two "
		                "%zu-byte elements", coll_wait_what(&w), cc->scratch_len, esz);
	max_block = count / (size_t)n + (count % (size_t)n ? 1 : 0);
	nlanes = max_block == 0 ? 1 : (max_block + slice_el - 1) / slice_el;
	if (nlanes > (UINT32_MAX - 1) / (size_t)nsteps)
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: %zu slices of %zu bytes per block are "
		                "too many to tag; raise KHOR_SLICE_BYTES", coll_wait_what(&w), nlanes, slice_el * esz);
	if ((size_t)nactive > nlanes)
		nactive = (int)nlanes;
	memset(lanes, 0, sizeof(lanes));
	for (int i = 0; i < nactive; i++) {
		lanes[i].slot[0] = (uint8_t *)coll_scratch(cc) + (size_t)(2 * i) * slice_el * esz;
		lanes[i].slot[1] = lanes[i].slot[0] + slice_el * esz;
	}

	const uint32_t meta = coll_meta_make(COLL_REDUCESCATTER, dtype, op);
	while (st == KHOR_SUCCESS && lanes_done < nlanes) {
		bool moved = false;

		for (int li = 0; li < nactive && st == KHOR_SUCCESS; li++) {
			struct lane *L = &lanes[li];
			size_t off, len;

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
				/* Step done: fold our own contribution into what came from the left. */
				int b = mod(r - L->step - 2, n);
				uint8_t *got = L->slot[L->step % 2];
				coll_lane_range(count, n, b, L->index, slice_el, &off, &len);
				if (L->step < nsteps - 1) {
					st = coll_reduce(cc, got, in + off * esz, got, len, dtype,
					                 op, err);
					if (st != KHOR_SUCCESS)
						break;
				} else {
					/* b == r: the finished slice goes to its place in recvbuf. */
					uint8_t *dst = out + (off - my_off) * esz;
					st = coll_reduce(cc, dst, in + off * esz, got, len, dtype,
					                 op, err);
					if (st == KHOR_SUCCESS && op == KHOR_AVG)
						st = coll_avg_finish(cc, dst, len, dtype, n, err);
					if (st != KHOR_SUCCESS)
						break;
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
			const uint8_t *sbuf;
			size_t soff, slen, roff, rlen;
			coll_lane_range(count, n, mod(r - s - 1, n), L->index, slice_el, &soff, &slen);
			coll_lane_range(count, n, mod(r - s - 2, n), L->index, slice_el, &roff, &rlen);
			sbuf = s == 0 ? in + soff * esz : L->slot[(s - 1) % 2];
			tp_tag tag = { cc->comm_id, seq, (uint32_t)(L->index * (size_t)nsteps + (size_t)s),
			               meta };
			st = coll_post(cc, &L->x[0], left, false, L->slot[s % 2], rlen * esz, tag, w.dl,
			               err);
			if (st == KHOR_SUCCESS)
				st = coll_post(cc, &L->x[1], right, true, (void *)sbuf, slen * esz, tag, w.dl,
				               err);
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

/* Element range of blocks [b_lo, b_hi) of a count split over n (coll_block). */
static void block_range(size_t count, int n, int b_lo, int b_hi, size_t *lo, size_t *hi)
{
	size_t off, len;

	coll_block(count, n, b_lo, &off, &len);
	*lo = off;
	coll_block(count, n, b_hi - 1, &off, &len);
	*hi = off + len;
}

khor_status halving_reduce_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf,
                                   size_t count, khor_dtype dtype, khor_op op, uint32_t seq,
                                   kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t esz = kdtype_size(dtype);
	const uint32_t meta = coll_meta_sched(coll_meta_make(COLL_REDUCESCATTER, dtype, op), ALGO_HD);
	const uint8_t *cur = sendbuf; /* the current blocks' partial sums, from element base */
	size_t base = 0, half;
	uint8_t *acc, *got;
	int b_lo = 0, b_hi = n;
	uint32_t step = 0;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1) /* one rank is a copy, which the ring does */
		return ring_reduce_scatter(cc, sendbuf, recvbuf, count, dtype, op, seq, err);
	/* The larger half of the first step bounds every kept and every received range. */
	block_range(count, n, 0, n / 2, &base, &half);
	/* got must start on an element boundary: the spare byte (for count 0) goes last. */
	half *= esz;
	acc = coll_big(cc, 2 * half + 1);
	if (acc == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "reduce_scatter seq %u (recursive halving): "
		                "no memory for a %zu-byte temp buffer", seq, 2 * half + 1);
	got = acc + half;
	base = 0;
	coll_wait_begin(cc, &w, "reduce_scatter seq %u (recursive halving)", seq, -1);
	for (int m = n / 2; st == KHOR_SUCCESS && m >= 1; m /= 2, step++) {
		const int mid = b_lo + (b_hi - b_lo) / 2, peer = r ^ m;
		const bool low = (r & m) == 0;
		const int k_lo = low ? b_lo : mid, k_hi = low ? mid : b_hi;
		const int g_lo = low ? mid : b_lo, g_hi = low ? b_hi : mid;
		size_t klo, khi, glo, ghi;
		tp_tag tag = { cc->comm_id, seq, step, meta };

		block_range(count, n, k_lo, k_hi, &klo, &khi);
		block_range(count, n, g_lo, g_hi, &glo, &ghi);
		st = coll_sendrecv(cc, &w, peer, cur + (glo - base) * esz, (ghi - glo) * esz, peer,
		                   got, (khi - klo) * esz, tag, err);
		if (st == KHOR_SUCCESS) {
			/* The last step folds into recvbuf; earlier ones into the front of acc. */
			uint8_t *o = m == 1 ? recvbuf : acc;
			const uint8_t *c = cur + (klo - base) * esz;
			st = coll_reduce(cc, o, low ? c : got, low ? got : c, khi - klo, dtype, op,
			                 err);
		}
		cur = acc;
		base = klo;
		b_lo = k_lo;
		b_hi = k_hi;
	}
	if (st == KHOR_SUCCESS && op == KHOR_AVG) {
		size_t off, len;
		coll_block(count, n, r, &off, &len);
		st = coll_avg_finish(cc, recvbuf, len, dtype, n, err);
	}
	if (st != KHOR_SUCCESS)
		coll_wait_fail(&w, err, " step %u", step);
	return st;
}
