/* hier.h -- node-aware collectives over a node group and a cross-node group (hier.c). */
#ifndef KHOR_HIER_H
#define KHOR_HIER_H

#include "coll.h"

khor_status hier_allreduce(coll_comm *node, coll_comm *cross, int world_size,
                           const void *sendbuf, void *recvbuf, size_t count, khor_dtype dtype,
                           khor_op op, uint32_t seq, kerr *err);
/* root_host_index: the root's rank in its cross group; root_local: its node rank. */
khor_status hier_broadcast(coll_comm *node, coll_comm *cross, int root_host_index,
                           int root_local, void *buf, size_t count, khor_dtype dtype,
                           uint32_t seq, kerr *err);

/* Ranks must be numbered host by host (rank = host * L + local rank). */
khor_status hier_allgather(coll_comm *node, coll_comm *cross, const void *sendbuf,
                           void *recvbuf, size_t count, khor_dtype dtype, uint32_t seq,
                           kerr *err);

/* An allreduce of buf in place on group g, with the schedule the group's model picks. */
khor_status hier_group_allreduce(coll_comm *g, void *buf, size_t count, khor_dtype dtype,
                                 khor_op op, uint32_t seq, kerr *err);

#endif
