/* tree.c -- binomial trees: broadcast, reduce, gather, scatter (being written). */
#include "algos.h"

khor_status binomial_broadcast(coll_comm *cc, void *buf, size_t count, khor_dtype dtype,
                               int root, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "binomial broadcast is not implemented yet");
}

khor_status binomial_reduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                            khor_dtype dtype, khor_op op, int root, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "reduce is not implemented yet");
}

khor_status binomial_gather(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                            khor_dtype dtype, int root, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "gather is not implemented yet");
}

khor_status binomial_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                             khor_dtype dtype, int root, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "scatter is not implemented yet");
}
