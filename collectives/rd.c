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
#include "base/dtype.h"
#include "rd.h"
#include "algos.h"

#include "select.h"

#include <stdio.h>
#include <string.h>

/*
 * A round of more than RD_PIECE and at most RD_PIECE x RD_MAX_PIECES bytes moves in pieces,
 * each folded in as it lands: the reduction of one overlaps the transfer of the next, and
 * every message fits one 64 KiB loopback segment. Measured with 2 ranks on TCP loopback,
 * interleaved: at 64-128 KiB a whole swap took 1.3x the ring's time, in 32 KiB pieces
 * 1.0-1.1x; at 256 KiB and above the pieces' per-message cost outweighed that (1.3x against
 * 1.2x whole), so larger rounds stay whole. Pieces of round `step` are tagged
 * step << 8 | piece, above every unpieced step number.
 */
#define RD_PIECE (32u << 10)
#define RD_MAX_PIECES 4

static khor_status rd_round(coll_comm *cc, coll_wait *w, int peer, const uint8_t *cur,
                            uint8_t *out, uint8_t *tmp, size_t count, khor_dtype dtype,
                            khor_op op, bool peer_is_lower, uint32_t seq, uint32_t step,
                            uint32_t meta, kerr *err)
{
	const size_t esz = kdtype_size(dtype), bytes = count * esz;
	size_t np = (bytes + RD_PIECE - 1) / RD_PIECE, piece_el;
	coll_xfer xs[2 * RD_MAX_PIECES];
	khor_status st = KHOR_SUCCESS;

	piece_el = (count + np - 1) / np;
	np = (count + piece_el - 1) / piece_el;
	memset(xs, 0, sizeof(xs));
	for (size_t j = 0; j < np && st == KHOR_SUCCESS; j++) {
		size_t off = j * piece_el, len = count - off < piece_el ? count - off : piece_el;
		tp_tag tag = { cc->comm_id, seq, step << 8 | (uint32_t)j, meta };
		st = coll_post(cc, &xs[2 * j], peer, false, tmp + off * esz, len * esz, tag, w->dl,
		               err);
		if (st == KHOR_SUCCESS)
			st = coll_post(cc, &xs[2 * j + 1], peer, true, (void *)(cur + off * esz),
			               len * esz, tag, w->dl, err);
	}
	/*
	 * Piece j is folded into out once it has arrived and its own send has gone (cur may be
	 * out), so the peer receives this rank's values from before the round.
	 */
	for (size_t next = 0; st == KHOR_SUCCESS && next < np;) {
		bool moved = false;
		for (size_t j = next; j < np; j++)
			coll_done(cc, &xs[2 * j + 1], &st, err);
		while (st == KHOR_SUCCESS && next < np && coll_done(cc, &xs[2 * next], &st, err) &&
		       !coll_pending(&xs[2 * next + 1])) {
			size_t off = next * piece_el, len = count - off < piece_el ? count - off : piece_el;
			const uint8_t *mine = cur + off * esz, *theirs = tmp + off * esz;
			st = coll_reduce(cc, out + off * esz, peer_is_lower ? theirs : mine,
			                 peer_is_lower ? mine : theirs, len, dtype, op, err);
			next++;
			moved = true;
		}
		if (st == KHOR_SUCCESS && next < np && !moved)
			st = coll_wait_step(cc, w, xs + 2 * next, (int)(2 * (np - next)), err);
	}
	if (st != KHOR_SUCCESS)
		coll_drain(cc, xs, (int)(2 * np));
	return st;
}

khor_status rd_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, khor_op op, uint32_t seq, unsigned kind, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t esz = kdtype_size(dtype), bytes = count * esz;
	const uint32_t meta = coll_meta_sched(coll_meta_make(kind, dtype, op), ALGO_RD);
	uint8_t *out = recvbuf, *tmp;
	/* This rank's values so far: the input until the first fold writes out. Reading the
	 * input in place of a first copy into out saves a pass over the buffer. */
	const uint8_t *cur = sendbuf;
	int p = 1, rem, vr;
	uint32_t step = 0;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1)
		return coll_copy(cc, out, sendbuf, bytes, err);
	tmp = bytes > cc->scratch_len ? coll_big(cc, bytes) : coll_scratch(cc);
	if (tmp == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "allreduce seq %u (recursive doubling): no "
		                "memory for a %zu-byte temp buffer", seq, bytes);
	while (p * 2 <= n)
		p *= 2;
	rem = n - p;
	coll_wait_begin(cc, &w, kind == COLL_BARRIER ? "barrier seq %u" : kind == COLL_REDUCESCATTER ? "reduce_scatter seq %u" : "allreduce seq %u", seq, -1);

	/* Fold the first 2*rem ranks in pairs: even -> odd. */
	if (r < 2 * rem) {
		tp_tag tag = { cc->comm_id, seq, step, meta };
		if (r % 2 == 0) {
			st = coll_sendrecv(cc, &w, r + 1, cur, bytes, -1, NULL, bytes, tag, err);
			vr = -1;
		} else {
			st = coll_sendrecv(cc, &w, -1, NULL, bytes, r - 1, tmp, bytes, tag, err);
			if (st == KHOR_SUCCESS) /* (lower rank) op (higher rank) */
				st = coll_reduce(cc, out, tmp, cur, count, dtype, op, err);
			cur = out;
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
		if (bytes > RD_PIECE && bytes <= (size_t)RD_PIECE * RD_MAX_PIECES) {
			st = rd_round(cc, &w, peer, cur, out, tmp, count, dtype, op, vpeer < vr,
			              seq, step, meta, err);
			cur = out;
			continue;
		}
		st = coll_sendrecv(cc, &w, peer, cur, bytes, peer, tmp, bytes, tag, err);
		if (st == KHOR_SUCCESS)
			st = coll_reduce(cc, out, vpeer < vr ? tmp : cur, vpeer < vr ? cur : tmp,
			                 count, dtype, op, err);
		cur = out;
	}

	/* Hand the result back to the ranks that sat out. */
	if (st == KHOR_SUCCESS && r < 2 * rem) {
		tp_tag tag = { cc->comm_id, seq, step, meta };
		if (r % 2 == 1)
			st = coll_sendrecv(cc, &w, r - 1, out, bytes, -1, NULL, bytes, tag, err);
		else
			st = coll_sendrecv(cc, &w, -1, NULL, bytes, r + 1, out, bytes, tag, err);
	}
	if (st == KHOR_SUCCESS && op == KHOR_AVG)
		st = coll_avg_finish(cc, out, count, dtype, n, err);
	if (st != KHOR_SUCCESS)
		coll_wait_fail(&w, err, " (recursive doubling, step %u)", step);
	return st;
}

enum allreduce_algo allreduce_pick(const coll_comm *cc, enum allreduce_algo forced, size_t bytes)
{
	if (forced == ALGO_RD || forced == ALGO_TREE || forced == ALGO_HD)
		return forced;
	if (forced != ALGO_AUTO)
		return ALGO_RING;
	if (cc->model.alpha > 0) {
		/* The choice depends only on the size: remember it per exact size seen last. */
		if (cc->pick_cache_bytes == bytes + 1)
			return (enum allreduce_algo)cc->pick_cache_algo;
		double t;
		int a = cost_pick_allreduce(&cc->model, cc->size, bytes, dbtree_slice_bytes(cc), &t);
		((coll_comm *)cc)->pick_cache_bytes = bytes + 1;
		((coll_comm *)cc)->pick_cache_algo = a;
		return (enum allreduce_algo)a;
	}
	return bytes <= cc->rd_max_bytes && bytes <= cc->scratch_len ? ALGO_RD : ALGO_RING;
}

/*
 * Halving-doubling (Rabenseifner): a reduce-scatter by recursive halving, then an allgather
 * by recursive doubling, among the p = 2^k ranks left after the same fold as above.
 *
 *   p = 4, buffer [A B C D]:
 *   halve 1 (mask 2): 0<->2, 1<->3   0,1 keep [A B] summed over pairs; 2,3 keep [C D]
 *   halve 2 (mask 1): 0<->1, 2<->3   each rank keeps one quarter, fully reduced
 *   double 1 (mask 1), double 2 (mask 2): the quarters travel back, as in rd_allgather
 *
 * It moves 2(p-1)/p of the buffer like the ring but in 2 log2(p) steps, which makes it the
 * medium-size choice. Each quarter is finished on one rank and copied to the others, so
 * every rank holds the same bits.
 */
khor_status hd_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, khor_op op, uint32_t seq, kerr *err)
{
	const int n = cc->size, r = cc->rank;
	const size_t esz = kdtype_size(dtype), bytes = count * esz;
	const uint32_t meta = coll_meta_sched(coll_meta_make(COLL_ALLREDUCE, dtype, op), ALGO_HD);
	uint8_t *out = recvbuf, *tmp;
	const uint8_t *cur = sendbuf; /* as in rd_allreduce: the input until a fold writes out */
	int p = 1, rem, vr, levels = 0;
	size_t lo[32], hi[32];
	uint32_t step = 0;
	coll_wait w;
	khor_status st = KHOR_SUCCESS;

	if (n == 1)
		return coll_copy(cc, out, sendbuf, bytes, err);
	/* The fold needs a whole buffer of temp, the halving half of one. */
	tmp = bytes > cc->scratch_len ? coll_big(cc, bytes) : coll_scratch(cc);
	if (tmp == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "allreduce seq %u (halving-doubling): "
		                "no memory for a %zu-byte temp buffer", seq, bytes);
	while (p * 2 <= n)
		p *= 2;
	rem = n - p;
	coll_wait_begin(cc, &w, "allreduce seq %u (halving-doubling)", seq, -1);

	if (r < 2 * rem) {
		tp_tag tag = { cc->comm_id, seq, step, meta };
		if (r % 2 == 0) {
			st = coll_sendrecv(cc, &w, r + 1, cur, bytes, -1, NULL, bytes, tag, err);
			vr = -1;
		} else {
			st = coll_sendrecv(cc, &w, -1, NULL, bytes, r - 1, tmp, bytes, tag, err);
			if (st == KHOR_SUCCESS)
				st = coll_reduce(cc, out, tmp, cur, count, dtype, op, err);
			cur = out;
			vr = r / 2;
		}
	} else {
		vr = r - rem;
	}
	step++;

	lo[0] = 0;
	hi[0] = count;
	for (int mask = p / 2; mask >= 1; mask /= 2)
		levels++;
	/* Recursive halving: keep the half that matches our bit, hand the other to the partner. */
	for (int mask = p / 2, l = 0; st == KHOR_SUCCESS && mask >= 1; mask /= 2, l++, step++) {
		size_t mid = lo[l] + (hi[l] - lo[l]) / 2;
		if (vr < 0) {
			lo[l + 1] = lo[l];
			hi[l + 1] = hi[l];
			continue;
		}
		int vpeer = vr ^ mask, peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
		bool low = (vr & mask) == 0;
		size_t keep_lo = low ? lo[l] : mid, keep_hi = low ? mid : hi[l];
		size_t give_lo = low ? mid : lo[l], give_hi = low ? hi[l] : mid;
		tp_tag tag = { cc->comm_id, seq, step, meta };
		/* Both sides agree on lengths: what I give is what the partner keeps. */
		st = coll_sendrecv(cc, &w, peer, cur + give_lo * esz, (give_hi - give_lo) * esz, peer,
		                   tmp, (keep_hi - keep_lo) * esz, tag, err);
		if (st == KHOR_SUCCESS) {
			const uint8_t *c = cur + keep_lo * esz;
			st = coll_reduce(cc, out + keep_lo * esz, low ? c : tmp, low ? tmp : c,
			                 keep_hi - keep_lo, dtype, op, err);
		}
		/* out now holds the kept half; what was given away is not read again */
		cur = out;
		lo[l + 1] = keep_lo;
		hi[l + 1] = keep_hi;
	}
	if (st == KHOR_SUCCESS && vr >= 0 && op == KHOR_AVG)
		st = coll_avg_finish(cc, out + lo[levels] * esz, hi[levels] - lo[levels], dtype, n,
		                     err);
	/* Recursive doubling back: swap finished segments, in the reverse order. */
	for (int mask = 1, l = levels; st == KHOR_SUCCESS && mask < p; mask *= 2, l--, step++) {
		if (vr < 0)
			continue;
		int vpeer = vr ^ mask, peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
		/* My segment at level l is one half of level l-1; the partner holds the other. */
		size_t mine_lo = lo[l], mine_hi = hi[l];
		size_t other_lo = mine_lo == lo[l - 1] ? mine_hi : lo[l - 1];
		size_t other_hi = mine_lo == lo[l - 1] ? hi[l - 1] : mine_lo;
		tp_tag tag = { cc->comm_id, seq, step, meta };
		st = coll_sendrecv(cc, &w, peer, out + mine_lo * esz, (mine_hi - mine_lo) * esz, peer, out + other_lo * esz, (other_hi - other_lo) * esz, tag, err);
	}
	step = 2 * (uint32_t)levels + 1;
	if (st == KHOR_SUCCESS && r < 2 * rem) {
		tp_tag tag = { cc->comm_id, seq, step, meta };
		if (r % 2 == 1)
			st = coll_sendrecv(cc, &w, r - 1, out, bytes, -1, NULL, bytes, tag, err);
		else
			st = coll_sendrecv(cc, &w, -1, NULL, bytes, r + 1, out, bytes, tag, err);
	}
	if (st != KHOR_SUCCESS)
		coll_wait_fail(&w, err, " step %u", step);
	return st;
}
