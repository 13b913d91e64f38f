/*
 * liveness.h -- whether the peers a wait still needs are alive, judged from their
 * heartbeats in the store (alive.h) on this rank's own monotonic clock.
 *
 * KHOR_TIMEOUT is when a wait starts asking, not when it gives up: a peer whose counter
 * "hb/<rank>" moved within KHOR_HEARTBEAT_TIMEOUT is alive, however long it takes (a
 * ten-minute evaluation on rank 0 while the others wait in an allreduce), and the wait goes
 * on after one warning per KHOR_TIMEOUT; a peer whose counter has not moved for that long
 * is stopped, hung or cut off, and the wait fails naming it. Without a store (one rank) or
 * with KHOR_HEARTBEAT_TIMEOUT < 0 there is nothing to judge by: KHOR_TIMEOUT is final.
 */
#ifndef KHOR_RUNTIME_LIVENESS_H
#define KHOR_RUNTIME_LIVENESS_H

#include "comm.h"

/* Whether waits in x are judged by liveness (a store, and heartbeats that are judged). */
bool liveness_on(const kctx *x);
/*
 * A wait of x passed KHOR_TIMEOUT; it has lasted waited_ms in all and still needs world
 * ranks peers[0..n) (NULL: every other rank of the job). KHOR_SUCCESS: wait on, and ask
 * again in *again_ms (sooner while a peer's heartbeat has not been seen to move yet); once
 * they are all seen alive, a warning names what (NULL: no warning, for a guard behind a
 * wait that warns itself), them and their hosts. Otherwise the error naming the peer that is
 * not alive (KHOR_ERR_REMOTE, err->peer), or why the heartbeats cannot be read.
 */
khor_status liveness_check(kctx *x, const char *what, const int *peers, int n,
                           int64_t waited_ms, int64_t *again_ms, kerr *err);
/* coll.h's check_alive over the context of comm owner; n 0 means the comm's other ranks. */
khor_status liveness_comm_check(void *owner, const char *what, const int *peers, int n,
                                int64_t waited_ms, int64_t *again_ms, kerr *err);
/*
 * store_get of key, which ranks peers[0..n) (NULL: any) are to write: past KHOR_TIMEOUT
 * it waits on while they are alive. KHOR_ERR_TIMEOUT (store_get's) only where liveness
 * is off: the caller says what was missing.
 */
khor_status liveness_store_get(kctx *x, const char *what, const char *key, const int *peers,
                               int n, void **val_out, size_t *len_out, kerr *err);
/* Frees what the checks of x learned (ctx teardown). */
void liveness_free(kctx *x);

#endif
