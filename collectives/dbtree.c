/* dbtree.c -- double binary tree allreduce (being written). */
#include "algos.h"

khor_status dbtree_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                             khor_dtype dtype, khor_op op, uint32_t seq, kerr *err)
{
	return kerr_set(err, KHOR_ERR_NOT_SUPPORTED, "tree allreduce is not implemented yet");
}
