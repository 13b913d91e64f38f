/* queue.h -- the tensor queue of a process set (queue.c). */
#ifndef KHOR_ENGINE_QUEUE_H
#define KHOR_ENGINE_QUEUE_H

#include "types.h"

/* Pushes h onto s's fresh list, its names and key into s's maps (under mu); no memory: it is
 * in no list or map then. */
khor_status queue_push_locked(eset *s, khor_handle *h);
/* The owner has seen h complete, or freed it: its names may be enqueued again (under mu). */
void queue_release_locked(khor_handle *h);
/* The set ends: its handles that outlive it hold no names (under mu). */
void queue_release_all_locked(eset *s);
/* h is reported: from the fresh list to the pending one (under mu). */
void queue_report_locked(eset *s, khor_handle *h);
/* The handle of key in s that this rank reported and a response now runs: out of pending,
 * marked in its cycle; NULL when there is none such (under mu). */
khor_handle *queue_claim_locked(eset *s, const char *key);
/* Completes h (under e->mu): status, error text, callbacks; the fd is rung by
 * queue_signal_locked, once per batch of completions. */
void queue_complete_locked(struct khor_engine *e, khor_handle *h, khor_status st,
                           const char *msg);
void queue_signal_locked(struct khor_engine *e);
/* The set failed: every handle of it fails with the cause, now and at every later enqueue. */
void queue_fail_set(eset *s, const kerr *cause);
/* Frees h's memory: a handle that completed (and is out of every list and map), or one
 * never queued. */
void queue_handle_free(khor_handle *h);

#endif
