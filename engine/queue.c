/*
 * queue.c -- the tensor queue of a process set: its named requests from enqueue to
 * completion. A handle is pushed onto the set's fresh list (with its names and key in the
 * set's maps, so a name is in flight once), moves to the pending list when this rank reports
 * it, is claimed by the response that runs it, and completes here: status, error text,
 * callback, the engine's fd. A failed set fails everything still queued.
 *
 * A name stays taken after its handle completes, until the owner has seen the completion
 * (khor_handle_wait or khor_handle_test returning the status, or the callback) or freed the
 * handle (queue_release_locked). Were it freed at completion, a second enqueue of the name
 * would succeed or fail by how fast the first ran (Horovod's test_torch.py
 * *_duplicate_name_error tests: the first completes on a fast engine before Python makes
 * the second call). Horovod frees it once the op runs, which its slower loop makes late.
 *
 * Everything here runs under the engine's mu (the _locked functions), except queue_fail_set,
 * which takes it.
 */
#include "queue.h"

#include "base/log.h"

#include <stdlib.h>
#include <unistd.h>

void queue_handle_free(khor_handle *h)
{
	for (int i = 0; i < h->n; i++) {
		free(h->t[i].name);
		free(h->t[i].owned_out);
		free(h->t[i].splits);
		free(h->t[i].rsplits);
	}
	free(h->t);
	free(h->key);
	free(h->desc);
	free(h);
}

/* Unlinks h from what routes responses to it (its key, the set's join). Under mu. */
static void unroute_locked(khor_handle *h)
{
	eset *s = h->set;

	if (emap_get(&s->keys, h->key) == h)
		emap_del(&s->keys, h->key);
	if (s->join == h)
		s->join = NULL;
}

void queue_release_locked(khor_handle *h)
{
	eset *s = h->set;

	if (!h->named)
		return;
	for (int i = 0; i < h->n; i++)
		if (h->t[i].name != NULL && emap_get(&s->names, h->t[i].name) == h)
			emap_del(&s->names, h->t[i].name);
	klist_del(&h->named_link);
	h->named = false;
}

void queue_release_all_locked(eset *s)
{
	klist *n;

	while ((n = klist_first(&s->named)) != NULL) {
		khor_handle *h = KLIST_ENTRY(n, khor_handle, named_link);
		klist_del(&h->named_link);
		h->named = false;
	}
}

khor_status queue_push_locked(eset *s, khor_handle *h)
{
	klist_add_tail(&s->named, &h->named_link);
	h->named = true;
	for (int i = 0; i < h->n; i++) {
		if (emap_put(&s->names, h->t[i].name, h) != KHOR_SUCCESS) {
			queue_release_locked(h);
			return KHOR_ERR_NO_MEMORY;
		}
	}
	if (emap_put(&s->keys, h->key, h) != KHOR_SUCCESS) {
		queue_release_locked(h);
		unroute_locked(h);
		return KHOR_ERR_NO_MEMORY;
	}
	if (h->kind == EK_JOIN)
		s->join = h;
	klist_add_tail(&s->fresh, &h->link);
	return KHOR_SUCCESS;
}

void queue_report_locked(eset *s, khor_handle *h)
{
	klist_del(&h->link);
	/* A join waits in s->join, in neither list: only the coordinator's 'D' ends it. */
	if (h->kind == EK_JOIN)
		return;
	klist_add_head(&s->pending, &h->link);
	h->reported = true;
}

khor_handle *queue_claim_locked(eset *s, const char *key)
{
	khor_handle *h = emap_get(&s->keys, key);

	/* Only what this rank reported: a handle still in the fresh list is not in this
	 * response (a joined rank has none; an error for a key this rank has not reported yet
	 * meets its report in a later cycle). */
	if (h == NULL || h->kind == EK_JOIN || h->done || !h->reported)
		return NULL;
	klist_del(&h->link);
	h->in_cycle = true;
	return h;
}

void queue_complete_locked(struct khor_engine *e, khor_handle *h, khor_status st,
                           const char *msg)
{
	if (h->done)
		return;
	unroute_locked(h);
	h->status = st;
	/* Every caller passes its sentence; the fallback only keeps the text from being empty
	 * (khor_strerror lives in the bindings, above this layer). */
	if (st != KHOR_SUCCESS)
		kerr_set(&h->err, st, "%s", msg != NULL ? msg : "failed");
	h->done = true;
	atomic_store_explicit(&h->done_flag, true, memory_order_release);
	/* Waiters and the fd hear once per batch of completions (queue_signal_locked). */
	e->signal_pending = true;
	if (h->cb != NULL) {
		khor_done_fn cb = h->cb;
		h->cb = NULL;
		queue_release_locked(h); /* the owner hears of it now */
		/* done is published: the owner may free h while mu is let go for the callback
		 * (found by TSan: a read of h->detached after such a free). It only detaches it
		 * then, and the free happens below. */
		h->in_cb = true;
		pthread_mutex_unlock(&e->mu);
		cb(h->cb_arg, h, st);
		pthread_mutex_lock(&e->mu);
		h->in_cb = false;
	}
	if (h->detached) {
		queue_release_locked(h);
		/* The engine's own reference lasts until engine_stop has failed every handle, so
		 * this one is never the last. */
		queue_handle_free(h);
		e->refs--;
	}
}

void queue_signal_locked(struct khor_engine *e)
{
	uint64_t one = 1;

	if (!e->signal_pending)
		return;
	e->signal_pending = false;
	pthread_cond_broadcast(&e->cv);
	if (write(e->efd, &one, sizeof(one)) < 0) {
		/* the counter is full: the fd is readable anyway */
	}
}

void queue_fail_set(eset *s, const kerr *cause)
{
	struct khor_engine *e = s->e;
	kctx *x = s->user != NULL ? s->user->ctx : NULL;
	kerr verdict;

	/* Elastic: a loss fails every handle with the driver's word on it, as the comms do. */
	if (x != NULL && x->cfg.elastic && cause->status != KHOR_ERR_INVALID_ARG &&
	    cause->status != KHOR_ERR_MEMBERSHIP) {
		verdict = *cause;
		comm_elastic_verdict(x, &verdict);
		cause = &verdict;
	}
	/* Fixed jobs: the other ranks are told, or this rank takes the first failure's words
	 * (a negotiation message is not a collective: no comm told them). */
	if (x != NULL && !x->cfg.elastic && cause->status != KHOR_ERR_INVALID_ARG) {
		verdict = *cause;
		comm_job_failure(x, &verdict);
		cause = &verdict;
	}
	pthread_mutex_lock(&e->mu);
	if (!s->failed) {
		s->failed = true;
		s->err = *cause;
		KLOG_ERR("engine set %d: %s", s->id, cause->text);
	}
	for (;;) {
		klist *n = klist_first(&s->pending);
		if (n == NULL)
			n = klist_first(&s->fresh);
		if (n == NULL)
			break;
		khor_handle *h = KLIST_ENTRY(n, khor_handle, link);
		klist_del(&h->link);
		queue_complete_locked(e, h, s->err.status, s->err.text);
	}
	/* A reported join waits in s->join alone, in neither list. */
	if (s->join != NULL)
		queue_complete_locked(e, s->join, s->err.status, s->err.text);
	queue_signal_locked(e);
	pthread_mutex_unlock(&e->mu);
}
