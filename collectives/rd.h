/* rd.h -- recursive-doubling allreduce (rd.c) and the allreduce algorithm choice. */
#ifndef KHOR_RD_H
#define KHOR_RD_H

#include "coll.h"

khor_status rd_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, khor_op op, uint32_t seq, unsigned kind, kerr *err);

/*
 * Which schedule runs an allreduce of `bytes` on this comm: the forced one, or for AUTO the
 * cheapest by the cost model (select.h); without a model (KHOR_RD_MAX_BYTES set), rd up to
 * rd_max_bytes and the ring above.
 */
enum allreduce_algo allreduce_pick(const coll_comm *cc, enum allreduce_algo forced, size_t bytes);

#endif
