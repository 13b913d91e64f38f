/*
 * alltoall.c -- pairwise-exchange alltoall(v).
 *
 * In step k = 1..n-1 rank r sends its block for r+k and receives the block of r-k; its own
 * block is copied locally. Every pair of ranks meets in exactly one step in each direction,
 * so every link carries one message each way. With n = 4:
 *
 *   step 1:  0->1  1->2  2->3  3->0
 *   step 2:  0->2  1->3  2->0  3->1
 *   step 3:  0->3  1->0  2->1  3->2
 *
 * Up to max_lanes steps are in flight at once (a window that slides as steps finish, in
 * any order), so a slow peer does not idle the others. No rank can wait forever on a
 * window: the rank furthest behind always finds its step's partners ready. Messages are
 * never staged; the transport stripes large ones over its sockets. Empty blocks are still
 * sent (zero-length frames) so that ranks that disagree on counts see it in a frame header.
 *
 * In place (sendbuf == recvbuf, with the same layout for both directions) r cannot receive
 * block r-k where block r-k is still waiting to be sent to another rank. Then the pairs
 * exchange symmetrically instead: in round k = 0..n-1 rank r swaps block p = (k - r) mod n
 * with rank p (p == r sits the round out), receiving into a temporary block that replaces
 * its own once both directions have finished. One block in flight per rank, n rounds:
 *
 *   n = 4:   round 0: 1<->3        round 1: 0<->1  2<->3
 *            round 2: 0<->2        round 3: 0<->3  1<->2
 *
 * The temporary block is scratch when it fits, else coll_big.
 */
#include "base/dtype.h"
#include "algos.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define A2A_MAX_WINDOW 32
_Static_assert(A2A_MAX_WINDOW <= COLL_MAX_LANES, "the window is waited on as lanes");

struct slot {
	int step; /* 0 = free */
	coll_xfer x[2]; /* [0] receive, [1] send */
};

static inline int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

static khor_status inplace_alltoallv(coll_comm *cc, uint8_t *buf, const size_t *counts,
                                     const size_t *displs, khor_dtype dtype, uint32_t seq,
                                     coll_wait *w, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t esz = kdtype_size(dtype);
	const uint32_t meta = coll_meta_make(COLL_ALLTOALL, dtype, 0);
	size_t max_bytes = 0;
	uint8_t *tmp;
	khor_status st = KHOR_SUCCESS;

	for (int i = 0; i < n; i++)
		max_bytes = counts[i] * esz > max_bytes ? counts[i] * esz : max_bytes;
	tmp = max_bytes <= cc->scratch_len ? coll_scratch(cc) : coll_big(cc, max_bytes);
	if (tmp == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "%s: out of memory for a %zu-byte block "
		                "(in-place alltoall)", coll_wait_what(w), max_bytes);
	for (int k = 0; k < n && st == KHOR_SUCCESS; k++) {
		const int p = mod(k - r, n);
		uint8_t *blk = buf + displs[p] * esz;
		const size_t bytes = counts[p] * esz;
		tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };

		if (p == r)
			continue;
		st = coll_sendrecv(cc, w, p, blk, bytes, p, tmp, bytes, tag, err);
		if (st == KHOR_SUCCESS)
			st = coll_copy(cc, blk, tmp, bytes, err);
	}
	return st;
}

khor_status pairwise_alltoallv(coll_comm *cc, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, khor_dtype dtype, uint32_t seq, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t esz = kdtype_size(dtype);
	const uint8_t *in = sendbuf;
	uint8_t *out = recvbuf;
	struct slot slots[A2A_MAX_WINDOW];
	int window, next_step = 1, steps_done = 0;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	coll_wait_begin(cc, &w, "alltoall seq %u", seq, -1);
	if (sendcounts[r] != recvcounts[r])
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: rank %d sends itself %zu elements but "
		                "expects %zu from itself", coll_wait_what(&w), r, sendcounts[r], recvcounts[r]);
	if (sendbuf == recvbuf && recvbuf != NULL) {
		for (int i = 0; i < n; i++) {
			if (sendcounts[i] != recvcounts[i] || sdispls[i] != rdispls[i])
				return kerr_set(err, KHOR_ERR_INVALID_ARG, "%s: in place (sendbuf == "
				                "recvbuf) needs the same counts and displacements for "
				                "sending and receiving; rank %d differs", coll_wait_what(&w), i);
		}
		st = inplace_alltoallv(cc, out, recvcounts, rdispls, dtype, seq, &w, err);
		goto out;
	}
	st = coll_copy(cc, out + rdispls[r] * esz, in + sdispls[r] * esz, recvcounts[r] * esz,
	               err);
	if (st != KHOR_SUCCESS)
		goto out;
	window = cc->max_lanes < 1 ? 1 : (cc->max_lanes > A2A_MAX_WINDOW ? A2A_MAX_WINDOW :
	                                  cc->max_lanes);
	if (window > n - 1)
		window = n - 1;
	memset(slots, 0, sizeof(slots));

	const uint32_t meta = coll_meta_make(COLL_ALLTOALL, dtype, 0);
	while (st == KHOR_SUCCESS && steps_done < n - 1) {
		bool moved = false;

		for (int i = 0; i < window && st == KHOR_SUCCESS; i++) {
			struct slot *S = &slots[i];

			if (S->step != 0) {
				bool rd = coll_done(cc, &S->x[0], &st, err);
				bool sd = coll_done(cc, &S->x[1], &st, err);
				if (st != KHOR_SUCCESS || !rd || !sd)
					continue;
				S->step = 0;
				steps_done++;
				moved = true;
			}
			if (next_step >= n)
				continue;
			const int k = next_step++, to = (r + k) % n, from = mod(r - k, n);
			tp_tag tag = { cc->comm_id, seq, (uint32_t)k, meta };
			S->step = k;
			moved = true;
			st = coll_post(cc, &S->x[0], from, false, out + rdispls[from] * esz,
			               recvcounts[from] * esz, tag, w.dl, err);
			if (st == KHOR_SUCCESS)
				st = coll_post(cc, &S->x[1], to, true, (void *)(in + sdispls[to] * esz),
				               sendcounts[to] * esz, tag, w.dl, err);
		}
		if (st != KHOR_SUCCESS || steps_done == n - 1)
			break;
		if (!moved)
			st = COLL_LANES_WAIT(cc, &w, slots, window, err);
	}
	if (st != KHOR_SUCCESS)
		COLL_LANES_DRAIN(cc, slots, window);
out:
	if (st != KHOR_SUCCESS)
		coll_wait_fail(&w, err, " (pairwise%s)", sendbuf == recvbuf ? ", in place" : "");
	return st;
}
