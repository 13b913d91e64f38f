/*
 * alive.h -- a rank's heartbeat thread.
 *
 * Every rank of a job with a store runs one, on a store connection of its own: it adds 1
 * to "hb/<rank>" (in its generation) every KHOR_HEARTBEAT_INTERVAL, so that khorrun, an
 * elastic driver or a waiting peer can tell a rank that is alive but slow from one that is
 * stopped or cut off. Between beats it waits on the generation's "abort" key, so a job's
 * abort (or, in an elastic job, the driver's end of a generation) reaches the context at
 * once: it sets ctx->aborted and wakes the transports' sleepers. In an elastic job it also
 * watches "el/update/<generation>" for the driver's host changes (ctx->hosts_updated).
 */
#ifndef KHOR_RUNTIME_ALIVE_H
#define KHOR_RUNTIME_ALIVE_H

#include "comm.h"

/* Starts x's heartbeat thread (x->alive); needs x->store and x->generation set. */
khor_status alive_start(kctx *x, kerr *err);
/* Stops and joins it; before the transports go. Nothing when none was started. */
void alive_stop(kctx *x);

#endif
