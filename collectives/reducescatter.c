/* reducescatter.c -- ring reduce-scatter (being written). */
#include "algos.h"

khor_status ring_reduce_scatter(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                                khor_dtype dtype, khor_op op, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "reduce-scatter is not implemented yet");
}
