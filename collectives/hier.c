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
#include "base/dtype.h"
#include "hier.h"

#include "algos.h"
#include "rd.h"
#include "ring.h"

#include <stdlib.h>
#include <string.h>

khor_status hier_group_allreduce(coll_comm *g, void *buf, size_t count, khor_dtype dtype,
                                  khor_op op, uint32_t seq, kerr *err)
{
	size_t bytes = count * kdtype_size(dtype);

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
	const size_t esz = kdtype_size(dtype);
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
		st = coll_copy(node, out, sendbuf, count * esz, err);
	}
	if (st == KHOR_SUCCESS && cross->size > 1)
		st = hier_group_allreduce(cross, out + off * esz, len, dtype, inner, seq, err);
	if (st == KHOR_SUCCESS && op == KHOR_AVG)
		st = coll_avg_finish(node, out + off * esz, len, dtype, world_size, err);
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

/*
 * Node-aware allgather, for ranks numbered host by host (rank = host * L + local rank, as
 * khorrun and Slurm's block distribution give):
 *
 *   1. allgather inside each host: every rank holds its host's L blocks, a contiguous
 *      region of the output
 *   2. local rank 0 of each host allgathers the host regions across hosts (tcp): each
 *      region crosses the network once per destination host, not once per rank
 *   3. local rank 0 broadcasts the whole output inside its host (shm)
 *
 * Other numberings would need a packed copy; they use the flat schedules instead.
 */
khor_status hier_allgather(coll_comm *node, coll_comm *cross, const void *sendbuf,
                           void *recvbuf, size_t count, khor_dtype dtype, uint32_t seq,
                           kerr *err)
{
	const int L = node->size, H = cross->size, me_host = cross->rank;
	const size_t esz = kdtype_size(dtype);
	size_t *a = malloc(2 * (size_t)(L > H ? L : H) * sizeof(size_t));
	uint8_t *out = recvbuf;
	khor_status st = KHOR_SUCCESS;

	if (a == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "allgather seq %u (hierarchical): out of "
		                "memory", seq);
	size_t *counts = a, *displs = a + (L > H ? L : H);
	for (int k = 0; k < L; k++) {
		counts[k] = count;
		displs[k] = ((size_t)me_host * (size_t)L + (size_t)k) * count;
	}
	st = ring_allgatherv(node, sendbuf, out, counts, displs, dtype, seq, err);
	if (st == KHOR_SUCCESS && node->rank == 0 && H > 1) {
		for (int h = 0; h < H; h++) {
			counts[h] = (size_t)L * count;
			displs[h] = (size_t)h * (size_t)L * count;
		}
		st = ring_allgatherv(cross, out + displs[me_host] * esz, out, counts, displs, dtype,
		                     seq, err);
	}
	free(a);
	if (st == KHOR_SUCCESS && H > 1)
		st = chain_broadcast(node, out, (size_t)L * (size_t)H * count, dtype, 0, seq, err);
	if (st != KHOR_SUCCESS && strstr(err->text, "hierarchical") == NULL)
		kerr_prefix(err, "allgather seq %u (hierarchical)", seq);
	return st;
}
