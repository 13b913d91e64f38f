/*
 * ring.c -- pipelined ring allreduce: reduce-scatter, then allgather, around the ring.
 *
 * The buffer is cut into n chunks (the first count % n chunks get one element more). Rank r
 * sends to r+1 and receives from r-1. With n = 4, chunk c reduced in step s on rank r:
 *
 *   reduce-scatter, step s = 0..n-2:  send chunk (r-s), receive chunk (r-s-1) and reduce it
 *       step 0: r0 sends c0 -> r1 (c0 = x0+x1 there)      r1 sends c1 -> r2 ...
 *       step 1: r1 sends c0 -> r2 (c0 = x0+x1+x2)          ...
 *       step 2: r2 sends c0 -> r3 (c0 complete on r3 = rank (c-1) mod n)
 *   allgather, step t = 0..n-2: send chunk (r+1-t), receive chunk (r-t) into place
 *
 *   time ->   | RS 0 | RS 1 | RS 2 | AG 0 | AG 1 | AG 2 |
 *   lane 0    |==s0==|==s1==|==s2==|==s3==|==s4==|==s5==|
 *   lane 1       |==s0==|==s1==|==s2==|==s3==|==s4==|==s5==|
 *   lane 2          |==s0==|==s1==| ...
 *
 * Pipelining: each chunk is cut into slices of slice_bytes; slice j of every chunk forms
 * "lane" j, an independent 2(n-1)-step pipeline. Up to max_lanes lanes are in flight, so
 * while lane j's slice is being reduced, lanes j+1.. are on the wire. Every rank moves
 * 2(n-1)/n of the buffer.
 *
 * Determinism: chunk c is always combined in the same order, x_{c+k} op (... op (x_{c+1} op
 * x_c)), finishing on rank c-1, and the finished chunk is copied, not recomputed, to every
 * rank, so all ranks hold the same bits, run after run.
 *
 * Every lane sends its message at every step, even when it is empty (count < n, or a short
 * last lane), so ranks that disagree on count or dtype see it in a frame header.
 */
#include "base/dtype.h"
#include "ring.h"

#include <stdio.h>
#include <string.h>

struct lane {
	bool active;
	int step;      /* 0 .. 2(n-1)-1 */
	size_t index;  /* which slice of every chunk */
	uint8_t *scratch;
	coll_xfer x[2]; /* [0] receive, [1] send */
};


static inline int mod(int a, int n)
{
	return ((a % n) + n) % n;
}


khor_status ring_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                           khor_dtype dtype, khor_op op, uint32_t seq, unsigned kind, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const int right = (r + 1) % n, left = (r - 1 + n) % n;
	const size_t esz = kdtype_size(dtype);
	const int nsteps = 2 * (n - 1);
	const uint8_t *in = sendbuf;
	uint8_t *out = recvbuf;
	size_t slice_el, max_chunk, nlanes, next_lane = 0, lanes_done = 0;
	int nactive;
	struct lane lanes[COLL_MAX_LANES];
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1)
		return coll_copy(cc, recvbuf, sendbuf, count * esz, err);
	slice_el = cc->slice_bytes / esz;
	if (slice_el == 0)
		slice_el = 1;
	max_chunk = count / (size_t)n + (count % (size_t)n ? 1 : 0);
	nlanes = max_chunk == 0 ? 1 : (max_chunk + slice_el - 1) / slice_el;
	/* The tag's step field holds lane * nsteps + step; widen slices if that would overflow. */
	while (nlanes * (size_t)nsteps >= UINT32_MAX) {
		slice_el *= 2;
		nlanes = (max_chunk + slice_el - 1) / slice_el;
	}
	nactive = cc->max_lanes < COLL_MAX_LANES ? cc->max_lanes : COLL_MAX_LANES;
	if (nactive < 1)
		nactive = 1;
	if ((size_t)nactive > nlanes)
		nactive = (int)nlanes;
	if (cc->scratch_len < (size_t)nactive * slice_el * esz) {
		/* The runtime sizes scratch for max_lanes slices; a tiny slice_el keeps us inside. */
		return kerr_set(err, KHOR_ERR_INTERNAL, "ring allreduce: scratch of %zu bytes is too "
		                "small for %d lanes of %zu bytes", cc->scratch_len, nactive,
		                slice_el * esz);
	}
	coll_wait_begin(cc, &w, kind == COLL_BARRIER ? "barrier seq %u" : "allreduce seq %u", seq, -1);
	memset(lanes, 0, sizeof(lanes));
	for (int i = 0; i < nactive; i++)
		lanes[i].scratch = (uint8_t *)coll_scratch(cc) + (size_t)i * slice_el * esz;

	const uint32_t meta = coll_meta_sched(coll_meta_make(kind, dtype, op), ALGO_RING);
	while (lanes_done < nlanes && st == KHOR_SUCCESS) {
		bool moved = false;

		for (int li = 0; li < nactive && st == KHOR_SUCCESS; li++) {
			struct lane *L = &lanes[li];

			if (!L->active) {
				if (next_lane >= nlanes)
					continue;
				L->active = true;
				L->index = next_lane++;
				L->step = -1;
				moved = true;
			} else {
				bool rd = coll_done(cc, &L->x[0], &st, err);
				bool sd = coll_done(cc, &L->x[1], &st, err);
				if (st != KHOR_SUCCESS || !rd || !sd)
					continue;
				/* Step finished: fold the received slice in during reduce-scatter. */
				if (L->step < n - 1) {
					size_t off, len;
					int c = mod(r - L->step - 1, n);
					coll_lane_range(count, n, c, L->index, slice_el, &off, &len);
					uint8_t *o = out + off * esz;
					st = coll_reduce(cc, o, in + off * esz, L->scratch, len,
					                 dtype, op, err);
					if (st == KHOR_SUCCESS && op == KHOR_AVG &&
					    L->step == n - 2)
						st = coll_avg_finish(cc, o, len, dtype, n, err);
					if (st != KHOR_SUCCESS)
						break;
				}
				moved = true;
			}
			if (L->step + 1 == nsteps) {
				L->active = false;
				lanes_done++;
				li--; /* reuse this slot for the next lane right away */
				continue;
			}
			L->step++;
			int s = L->step, sc, rc;
			const uint8_t *sbase;
			uint8_t *rbuf;
			size_t soff, slen, roff, rlen;
			if (s < n - 1) {
				sc = mod(r - s, n);
				rc = mod(r - s - 1, n);
				sbase = s == 0 ? in : out;
			} else {
				int t = s - (n - 1);
				sc = mod(r + 1 - t, n);
				rc = mod(r - t, n);
				sbase = out;
			}
			coll_lane_range(count, n, sc, L->index, slice_el, &soff, &slen);
			coll_lane_range(count, n, rc, L->index, slice_el, &roff, &rlen);
			rbuf = s < n - 1 ? L->scratch : out + roff * esz;
			tp_tag tag = { cc->comm_id, seq, (uint32_t)(L->index * (size_t)nsteps + (size_t)s),
			               meta };
			st = coll_post(cc, &L->x[0], left, false, rbuf, rlen * esz, tag, w.dl, err);
			if (st == KHOR_SUCCESS)
				st = coll_post(cc, &L->x[1], right, true, (void *)(sbase + soff * esz),
				               slen * esz, tag, w.dl, err);
		}
		if (st != KHOR_SUCCESS || lanes_done == nlanes)
			break;
		if (!moved)
			st = COLL_LANES_WAIT(cc, &w, lanes, nactive, err);
	}
	if (st != KHOR_SUCCESS) {
		COLL_LANES_DRAIN(cc, lanes, nactive);
		coll_wait_fail(&w, err, " (step %d of %d)", lanes[0].step, nsteps);
	}
	return st;
}
