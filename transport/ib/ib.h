/*
 * ib.h -- the InfiniBand verbs transport (ib.c): reliable-connected queue pairs on an HCA
 * (or soft-RoCE), behind the ops table of transport.h. Built when infiniband/verbs.h is
 * available; libibverbs is loaded at run time, so create() fails with
 * KHOR_ERR_NOT_SUPPORTED and the reason on machines without rdma-core or an active port.
 */
#ifndef KHOR_TRANSPORT_IB_H
#define KHOR_TRANSPORT_IB_H

#include "transport/transport.h"

#ifdef KHOR_HAVE_IB
extern const struct transport_ops ib_transport_ops;
#endif

#endif
