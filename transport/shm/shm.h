/*
 * shm.h -- the shared-memory transport (shm.c): links between ranks of one host through a
 * memory segment both processes map, behind the ops table of transport.h. Its address blob
 * names the host's boot and an abstract Unix socket, so a peer on another host (or in
 * another network namespace) is refused with a clear error instead of reaching a stranger.
 */
#ifndef KHOR_TRANSPORT_SHM_H
#define KHOR_TRANSPORT_SHM_H

#include "transport/transport.h"

extern const struct transport_ops shm_transport_ops;

#endif
