/* rd.h -- recursive-doubling allreduce (rd.c) and the allreduce algorithm choice. */
#ifndef KHOR_RD_H
#define KHOR_RD_H

#include "coll.h"

khor_status rd_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                         khor_dtype dtype, khor_op op, uint32_t seq, unsigned kind, kerr *err);

enum allreduce_algo { ALGO_AUTO = 0, ALGO_RING, ALGO_RD, ALGO_TREE, ALGO_HD };

/*
 * Which schedule runs an allreduce of `bytes` on this comm: the forced one, or for AUTO a
 * size threshold (rd up to rd_max_bytes, else ring). The cost-model selection replaces this
 * threshold later; the switch point was measured with khor-bench (docs/PERFORMANCE.md).
 */
enum allreduce_algo allreduce_pick(const coll_comm *cc, enum allreduce_algo forced, size_t bytes);

#endif
