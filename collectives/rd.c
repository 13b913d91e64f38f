/*
 * rd.c -- recursive-doubling allreduce, the latency-optimal schedule for small messages.
 *
 * With p = n a power of two, log2(p) rounds; in round k rank r swaps its whole buffer with
 * r XOR 2^k and combines:
 *
 *   round 0:  0<->1   2<->3   4<->5   6<->7      each now holds a pair's sum
 *   round 1:  0<->2   1<->3   4<->6   5<->7      ... a quad's sum
 *   round 2:  0<->4   1<->5   2<->6   3<->7      ... everything
 *
 * n not a power of two (the standard fix): with p the largest power of two below n and
 * rem = n - p, the first 2*rem ranks pair up; each even one sends its buffer to its odd
 * neighbour and sits out; the p survivors run the rounds above; then every odd one sends
 * the result back to its even neighbour. That costs two extra steps, only when needed.
 *
 *   n = 6:  pre: 0->1  2->3     rounds among {1,3,4,5}     post: 1->0  3->2
 *
 * Determinism: the two halves are always combined as (lower group) op (higher group), so
 * both partners compute the same expression and every rank ends with identical bits.
 * Latency: log2(p) (+2) steps; bandwidth: every step moves the whole buffer, which is
 * why the ring takes over for large messages.
 */
#include "rd.h"
#include "algos.h"

#include "reduce.h"

#include <stdio.h>
#include <string.h>

/* One exchange (send and/or receive) with the deadline loop around it. */
static khor_status exchange(coll_comm *cc, coll_wait *w, int peer_send, const void *sbuf,
                            int peer_recv, void *rbuf, size_t bytes, tp_tag tag, kerr *err)
{
	coll_xfer x[2];
	khor_status st = KHOR_SUCCESS;

	memset(x, 0, sizeof(x));
	if (peer_recv >= 0)
		st = coll_post(cc, &x[0], peer_recv, false, rbuf, bytes, tag, w->dl, err);
	if (st == KHOR_SUCCESS && peer_send >= 0)
		st = coll_post(cc, &x[1], peer_send, true, (void *)sbuf, bytes, tag, w->dl, err);
	while (st == KHOR_SUCCESS) {
		bool a = coll_done(cc, &x[0], &st, err);
		bool b = coll_done(cc, &x[1], &st, err);
		if (st != KHOR_SUCCESS || (a && b))
			break;
		st = coll_wait_step(cc, w, x, 2, err);
	}
	if (st != KHOR_SUCCESS)
		coll_drain(cc, x, 2);
	return st;
}

khor_status rd_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, khor_op op, uint32_t seq, unsigned kind, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t esz = khor_dtype_size(dtype), bytes = count * esz;
	reduce_fn fn = reduce_kernel(dtype, op);
	const uint32_t meta = tp_meta_make(kind, dtype, op);
	uint8_t *out = recvbuf, *tmp = cc->scratch;
	int p = 1, rem, vr;
	uint32_t step = 0;
	coll_wait w;
	char what[64];
	khor_status st = KHOR_SUCCESS;

	if (bytes > cc->scratch_len)
		return kerr_set(err, KHOR_ERR_INTERNAL, "recursive doubling: %zu bytes exceed the "
		                "%zu-byte scratch buffer", bytes, cc->scratch_len);
	if (sendbuf != recvbuf && bytes > 0)
		memcpy(out, sendbuf, bytes);
	if (n == 1)
		return KHOR_SUCCESS;
	while (p * 2 <= n)
		p *= 2;
	rem = n - p;
	snprintf(what, sizeof(what), "%s seq %u", kind == COLL_BARRIER ? "barrier" : "allreduce",
	         seq);
	coll_wait_init(cc, &w, what);

	/* Fold the first 2*rem ranks in pairs: even -> odd. */
	if (r < 2 * rem) {
		tp_tag tag = { cc->comm_id, seq, step, meta };
		if (r % 2 == 0) {
			st = exchange(cc, &w, r + 1, out, -1, NULL, bytes, tag, err);
			vr = -1;
		} else {
			st = exchange(cc, &w, -1, NULL, r - 1, tmp, bytes, tag, err);
			if (st == KHOR_SUCCESS && count > 0)
				fn(out, tmp, out, count); /* (lower rank) op (higher rank) */
			vr = r / 2;
		}
	} else {
		vr = r - rem;
	}
	step++;

	/* Rounds among the p survivors, numbered vr. */
	for (int mask = 1; st == KHOR_SUCCESS && mask < p; mask <<= 1, step++) {
		if (vr < 0)
			continue;
		int vpeer = vr ^ mask;
		int peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
		tp_tag tag = { cc->comm_id, seq, step, meta };
		st = exchange(cc, &w, peer, out, peer, tmp, bytes, tag, err);
		if (st == KHOR_SUCCESS && count > 0) {
			if (vpeer < vr)
				fn(out, tmp, out, count);
			else
				fn(out, out, tmp, count);
		}
	}

	/* Hand the result back to the ranks that sat out. */
	if (st == KHOR_SUCCESS && r < 2 * rem) {
		tp_tag tag = { cc->comm_id, seq, step, meta };
		if (r % 2 == 1)
			st = exchange(cc, &w, r - 1, out, -1, NULL, bytes, tag, err);
		else
			st = exchange(cc, &w, -1, NULL, r + 1, out, bytes, tag, err);
	}
	if (st == KHOR_SUCCESS && op == KHOR_AVG && count > 0)
		reduce_avg_finish(out, count, dtype, n);
	if (st != KHOR_SUCCESS && strncmp(err->text, what, strlen(what)) != 0)
		kerr_prefix(err, "%s (recursive doubling, step %u)", what, step);
	return st;
}

enum allreduce_algo allreduce_pick(const coll_comm *cc, enum allreduce_algo forced, size_t bytes)
{
	if (forced == ALGO_RD && bytes <= cc->scratch_len)
		return ALGO_RD;
	if (forced == ALGO_TREE || forced == ALGO_HD)
		return forced;
	if (forced != ALGO_AUTO)
		return ALGO_RING;
	return bytes <= cc->rd_max_bytes && bytes <= cc->scratch_len ? ALGO_RD : ALGO_RING;
}

khor_status hd_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, khor_op op, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "halving-doubling is not implemented yet");
}
