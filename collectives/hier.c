/*
 * hier.c -- node-aware (hierarchical) allreduce and broadcast.
 *
 * With L ranks on each of H hosts, a flat ring sends every byte across the network about
 * twice per rank; the hierarchical schedule crosses the network once per shard and keeps
 * the rest inside the host, where shared memory is many times faster:
 *
 *   host A: a0 a1 a2 a3        1. reduce-scatter inside each host (shm):
 *   host B: b0 b1 b2 b3           local rank k holds shard k of its host's sum
 *                              2. allreduce across hosts among ranks of equal local rank
 *      a0 <-> b0  (shard 0)       (tcp), all L shards in parallel on L different links
 *      a1 <-> b1  (shard 1)    3. allgather inside each host (shm)
 *      ...
 *
 * Every rank moves 2(L-1)/L S through memory and 2(H-1)/H S/L over the network, instead of
 * 2(n-1)/n S over whatever links the ring happens to use. avg is summed throughout and
 * divided by n once, on the shard, before the allgather; shards are finished on one rank
 * and copied, so every rank holds the same bits. Requires the same L on every host.
 *
 * Broadcast: the root's shard of hosts: first across hosts among the ranks with the
 * root's local rank, then inside every host from that rank.
 */
#include "hier.h"

#include "algos.h"
#include "rd.h"
#include "reduce.h"
#include "ring.h"

#include <stdlib.h>
#include <string.h>

static khor_status group_allreduce(coll_comm *g, void *buf, size_t count, khor_dtype dtype,
                                   khor_op op, uint32_t seq, kerr *err)
{
	size_t bytes = count * khor_dtype_size(dtype);

	switch (allreduce_pick(g, (enum allreduce_algo)g->algo, bytes)) {
	case ALGO_RD:
		return rd_allreduce(g, buf, buf, count, dtype, op, seq, COLL_ALLREDUCE, err);
	case ALGO_TREE:
		return dbtree_allreduce(g, buf, buf, count, dtype, op, seq, err);
	case ALGO_HD:
		return hd_allreduce(g, buf, buf, count, dtype, op, seq, err);
	default:
		return ring_allreduce(g, buf, buf, count, dtype, op, seq, COLL_ALLREDUCE, err);
	}
}

khor_status hier_allreduce(coll_comm *node, coll_comm *cross, int world_size,
                           const void *sendbuf, void *recvbuf, size_t count, khor_dtype dtype,
                           khor_op op, uint32_t seq, kerr *err)
{
	const size_t esz = khor_dtype_size(dtype);
	const int L = node->size;
	khor_op inner = op == KHOR_AVG ? KHOR_SUM : op;
	size_t off, len, *counts = NULL, *displs = NULL;
	uint8_t *out = recvbuf;
	khor_status st;

	coll_block(count, L, node->rank, &off, &len);
	if (L > 1) {
		/*
		 * In place this is the reduce-scatter whose output is the caller's own block of
		 * sendbuf, which ring_reduce_scatter supports without a copy.
		 */
		st = ring_reduce_scatter(node, sendbuf, out + off * esz, count, dtype, inner, seq,
		                         err);
	} else {
		if (sendbuf != recvbuf && count > 0)
			memcpy(out, sendbuf, count * esz);
		st = KHOR_SUCCESS;
	}
	if (st == KHOR_SUCCESS && cross->size > 1)
		st = group_allreduce(cross, out + off * esz, len, dtype, inner, seq, err);
	if (st == KHOR_SUCCESS && op == KHOR_AVG && len > 0)
		reduce_avg_finish(out + off * esz, len, dtype, world_size);
	if (st == KHOR_SUCCESS && L > 1) {
		counts = malloc(2 * (size_t)L * sizeof(size_t));
		if (counts == NULL)
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "allreduce seq %u (hierarchical): out "
			                "of memory", seq);
		displs = counts + L;
		for (int k = 0; k < L; k++)
			coll_block(count, L, k, &displs[k], &counts[k]);
		st = ring_allgatherv(node, out + off * esz, out, counts, displs, dtype, seq, err);
		free(counts);
	}
	if (st != KHOR_SUCCESS && strstr(err->text, "hierarchical") == NULL)
		kerr_prefix(err, "allreduce seq %u (hierarchical)", seq);
	return st;
}

khor_status hier_broadcast(coll_comm *node, coll_comm *cross, int root_host_index,
                           int root_local, void *buf, size_t count, khor_dtype dtype,
                           uint32_t seq, kerr *err)
{
	khor_status st = KHOR_SUCCESS;

	/* Across hosts among the ranks with the root's local rank, then inside each host. */
	if (node->rank == root_local && cross->size > 1)
		st = chain_broadcast(cross, buf, count, dtype, root_host_index, seq, err);
	if (st == KHOR_SUCCESS && node->size > 1)
		st = chain_broadcast(node, buf, count, dtype, root_local, seq, err);
	return st;
}
