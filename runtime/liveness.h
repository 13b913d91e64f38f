/*
 * liveness.h -- whether the peers a wait still needs are alive, judged from their
 * heartbeats in the store (alive.h) on this rank's own monotonic clock.
 *
 * KHOR_TIMEOUT is when a wait starts asking, not when it gives up: a peer whose counter
 * "hb/<rank>" moved within KHOR_HEARTBEAT_TIMEOUT is alive, however long it takes (a
 * ten-minute evaluation on rank 0 while the others wait in an allreduce), and the wait goes
 * on after one warning per KHOR_TIMEOUT; a peer whose counter has not moved for that long
 * is stopped, hung or cut off, and the wait fails naming it. So does a wait on a live peer
 * that waits for this rank in turn, neither getting on for KHOR_TIMEOUT: a deadlock (two
 * ranks in different calls), which no amount of waiting ends. Without a store (one rank)
 * or with KHOR_HEARTBEAT_TIMEOUT < 0 there is nothing to judge by: KHOR_TIMEOUT is final.
 */
#ifndef KHOR_RUNTIME_LIVENESS_H
#define KHOR_RUNTIME_LIVENESS_H

#include "comm.h"

/* Whether waits in x are judged by liveness (a store, and heartbeats that are judged). */
bool liveness_on(const kctx *x);
/*
 * A wait of x passed KHOR_TIMEOUT (q: what it is, whom it needs; peers NULL: every other
 * rank of the job). KHOR_SUCCESS: wait on, and ask again in *again_ms (sooner while a
 * peer's heartbeat has not been seen to move yet, or while a peer waits for this rank
 * too); once they are all seen alive, a warning (unless q->what is NULL) names what, them
 * and their hosts, once per KHOR_TIMEOUT. Otherwise the error (KHOR_ERR_REMOTE, err->peer)
 * naming the peer that is not alive or that is deadlocked with this wait, or why the
 * heartbeats cannot be read.
 */
khor_status liveness_check(kctx *x, const coll_alive_ask *q, int64_t *again_ms, kerr *err);
/* coll.h's check_alive over the context of comm owner; peers NULL: the comm's other ranks. */
khor_status liveness_comm_check(void *owner, const coll_alive_ask *q, int64_t *again_ms,
                                kerr *err);
/*
 * store_get of key, which ranks peers[0..n) (NULL: any) are to write (what: the call that
 * waits, for messages): past KHOR_TIMEOUT it waits on while they are alive. KHOR_ERR_TIMEOUT
 * (store_get's) only where liveness is off: the caller says what was missing.
 */
khor_status liveness_store_get(kctx *x, const char *what, const char *key, const int *peers,
                               int n, void **val_out, size_t *len_out, kerr *err);
/* Frees what the checks of x learned (ctx teardown). */
void liveness_free(kctx *x);

#endif
