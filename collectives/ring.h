/* ring.h -- the ring and chain algorithms (ring.c, bcast.c). */
#ifndef KHOR_RING_H
#define KHOR_RING_H

#include "coll.h"

/* kind is COLL_ALLREDUCE or COLL_BARRIER (a zero-count allreduce with its own tag). */
khor_status ring_allreduce(coll_comm *cc, const void *sendbuf, void *recvbuf, size_t count,
                           khor_dtype dtype, khor_op op, uint32_t seq, unsigned kind, kerr *err);
khor_status chain_broadcast(coll_comm *cc, void *buf, size_t count, khor_dtype dtype, int root,
                            uint32_t seq, kerr *err);

#endif
