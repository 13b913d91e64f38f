/*
 * algos.h -- the collective schedules beyond allreduce, one file each. All follow the same
 * contract as ring.c: every rank calls with the same arguments (except buffers), tags are
 * (cc->comm_id, seq, step, coll_meta_make(kind, dtype, op)), every send has a matching
 * receive of the same length (even when empty, so that ranks which disagree on counts get
 * an error from the frame header instead of a hang), waits go through coll_wait_step
 * (deadline, abort check), errors are prefixed with "<collective> seq N" and pending
 * transfers are cancelled with coll_drain before returning an error.
 *
 * Receive order: the TCP transport leaves a frame that has no posted receive in the kernel
 * until a receive is posted on its socket (then it is read aside into a bounded queue), so
 * a schedule should post its receives on a link in the order the peer sends on it (per
 * socket): out of order, each such frame costs a copy, and past the bound the link waits.
 *
 * Counts are in elements of dtype. "v" forms take per-rank counts and displacements in
 * elements; displs == NULL means blocks packed in rank order.
 */
#ifndef KHOR_ALGOS_H
#define KHOR_ALGOS_H

#include "coll.h"

/* Block r of a count split over n ranks: the first count % n blocks get one more element. */
static inline void coll_block(size_t count, int n, int r, size_t *off, size_t *len)
{
	size_t base = count / (size_t)n, rem = count % (size_t)n;

	*len = base + ((size_t)r < rem ? 1 : 0);
	*off = base * (size_t)r + ((size_t)r < rem ? (size_t)r : rem);
}

/* reducescatter.c: ring; rank r receives block r (coll_block) of the reduced sendbuf. */
khor_status ring_reduce_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                                khor_dtype dtype, khor_op op, uint32_t seq, kerr *err);
/* The same result by recursive halving in log2(n) steps; n must be a power of two. */
khor_status halving_reduce_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf,
                                   size_t count, khor_dtype dtype, khor_op op, uint32_t seq,
                                   kerr *err);

/* allgather.c: rank r's sendbuf (counts[r] elements) lands at recvbuf + displs[r] everywhere. */
khor_status ring_allgatherv(coll_comm *cc, const void *sendbuf, void *recvbuf,
                            const size_t *counts, const size_t *displs, khor_dtype dtype,
                            uint32_t seq, kerr *err);
/* Bruck's dissemination allgather, equal blocks, any n, ceil(log2 n) rounds, in place. */
khor_status rd_allgather(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, uint32_t seq, kerr *err);

/* alltoall.c: pairwise exchange; step k sends to r+k and receives from r-k. */
khor_status pairwise_alltoallv(coll_comm *cc, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, khor_dtype dtype, uint32_t seq, kerr *err);

/* tree.c: binomial-tree broadcast (latency), reduce to root, gather and scatter. */
khor_status binomial_broadcast(coll_comm *cc, void *buf, size_t count, khor_dtype dtype,
                               int root, uint32_t seq, kerr *err);
khor_status binomial_reduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                            khor_dtype dtype, khor_op op, int root, uint32_t seq, kerr *err);
khor_status binomial_gather(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                            khor_dtype dtype, int root, uint32_t seq, kerr *err);
khor_status binomial_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                             khor_dtype dtype, int root, uint32_t seq, kerr *err);

/* The slice the tree pipelines with on this comm (scratch holds 2 halves x window x 2). */
size_t dbtree_slice_bytes(const coll_comm *cc);
/* dbtree.c: double binary tree allreduce (two complementary trees, each half the data). */
khor_status dbtree_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                             khor_dtype dtype, khor_op op, uint32_t seq, kerr *err);
/* rd.c: halving-doubling (Rabenseifner) allreduce for medium sizes. */
khor_status hd_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, khor_op op, uint32_t seq, kerr *err);

#endif
