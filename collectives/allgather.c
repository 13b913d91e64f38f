/* allgather.c -- ring and recursive-doubling allgather (being written). */
#include "algos.h"

khor_status ring_allgatherv(coll_comm *cc, const void *sendbuf, void *recvbuf,
                            const size_t *counts, const size_t *displs, khor_dtype dtype,
                            uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "allgather is not implemented yet");
}

khor_status rd_allgather(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "allgather is not implemented yet");
}
