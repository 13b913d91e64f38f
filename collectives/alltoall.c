/* alltoall.c -- pairwise-exchange alltoall (being written). */
#include "algos.h"

khor_status pairwise_alltoallv(coll_comm *cc, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, khor_dtype dtype, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "alltoall is not implemented yet");
}
