/*
 * response.c -- a cycle's response: its records, written by the coordinator and read by
 * every rank, which turns them into the cycle's list of items in order (this rank's handle
 * for each, or a ghost where it has none) and applies the cache, join and tuning records on
 * the way, the same way on every rank.
 *
 *   response := { 'C' u32 slot | 'R' u32 len desc u8 cache [u64 dim0[n * size]]
 *               | 'E' u16 len key u16 len msg | 'D' i32 last_joiner
 *               | 'T' u64 fusion_bytes u64 cycle_us | 'Q' i32 rank | 'X' }*
 *
 * 'Q': that rank has asked to stop (its report's 'S'); sent once per rank, in the cycle
 * the coordinator hears it. Later enqueues on the set fail at once naming it, this rank's
 * join ends with that cause, and this rank stops the set too (coordinator.c).
 */
#include "response.h"

#include "bbuf.h"
#include "desc.h"
#include "queue.h"
#include "response_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void response_put_error(bbuf *out, const char *key, const char *msg, size_t ml)
{
	size_t kl = strlen(key);

	if (ml > 60000)
		ml = 60000;
	bput_u8(out, 'E');
	bput_u16(out, (uint16_t)kl);
	bput(out, key, kl);
	bput_u16(out, (uint16_t)ml);
	bput(out, msg, ml);
}

/* Turns a descriptor into an item: this rank's handle for it, or a ghost (none here). */
static khor_status item_for(eset *s, const uint8_t *d, size_t len, const char *key, eitem *it,
                            kerr *err)
{
	struct khor_engine *e = s->e;
	khor_status st = desc_parse(d, len, it, err);

	if (st != KHOR_SUCCESS)
		return st;
	pthread_mutex_lock(&e->mu);
	khor_handle *h = queue_claim_locked(s, key);
	if (h != NULL) {
		h->t_response = kclock_ns();
		it->h = h;
	}
	pthread_mutex_unlock(&e->mu);
	if (it->h != NULL) {
		/* The handle's own tensors (buffers) replace the parsed ones. */
		desc_free_tensors(it);
		it->t = it->h->t;
		it->n = it->h->n;
	}
	return KHOR_SUCCESS;
}

static void items_free(eitem *items, int n)
{
	for (int i = 0; i < n; i++) {
		if (items[i].h == NULL)
			desc_free_tensors(&items[i]);
		free(items[i].dim0);
		free(items[i].msg);
	}
	free(items);
}

/*
 * Reads a response payload into out (response.h): the cache updates, the join and tuning
 * records are applied as they come; the items are for the set's loop to run.
 */
bool response_parse(eset *s, const uint8_t *p, size_t len, eresp *out)
{
	struct khor_engine *e = s->e;
	brd r = { p, len, 0, false };
	eitem *items = NULL;
	int n = 0, cap = 0;
	bool stop = false;
	kerr err;

	kerr_clear(&err);
	while (r.off < r.len && !r.bad) {
		uint8_t rec = bget_u8(&r);
		if (rec == 'C' || rec == 'R' || rec == 'E') {
			if (n == cap) {
				cap = cap == 0 ? 16 : cap * 2;
				eitem *v = realloc(items, sizeof(*v) * (size_t)cap);
				if (v == NULL) {
					kerr_set(&err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
					break;
				}
				items = v;
			}
		}
		if (rec == 'C') {
			uint32_t slot = bget_u32(&r);
			if (r.bad || slot >= (uint32_t)s->cache.n) {
				kerr_set(&err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: the response "
				         "names cache slot %u of %d", s->cycle, slot, s->cache.n);
				break;
			}
			ecache_slot *cs = &s->cache.slot[slot];
			response_cache_touch(&s->cache, (int)slot);
			if (item_for(s, cs->desc, cs->desc_len, cs->key, &items[n], &err) != KHOR_SUCCESS)
				break;
			n++;
		} else if (rec == 'R') {
			uint32_t dl = bget_u32(&r);
			if (r.bad || r.off + dl > r.len) {
				r.bad = true;
				break;
			}
			const uint8_t *d = p + r.off;
			r.off += dl;
			uint8_t flags = bget_u8(&r);
			char *key = desc_key(d, dl);
			if (key == NULL) {
				r.bad = true;
				break;
			}
			if (item_for(s, d, dl, key, &items[n], &err) != KHOR_SUCCESS) {
				free(key);
				break;
			}
			eitem *it = &items[n++];
			if (it->kind == EK_ALLGATHER) {
				size_t cnt = (size_t)it->n * (size_t)s->size;
				/* Bounded before allocating: the dims must be in the bytes. */
				if (cnt > (r.len - r.off) / 8) {
					free(key);
					r.bad = true;
					break;
				}
				it->dim0 = malloc(sizeof(int64_t) * cnt);
				if (it->dim0 == NULL) {
					free(key);
					kerr_set(&err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
					break;
				}
				for (size_t i = 0; i < cnt; i++)
					it->dim0[i] = (int64_t)bget_u64(&r);
			}
			if ((flags & 1) && s->cache.cap > 0 &&
			    response_cache_put(&s->cache, key, d, dl) != KHOR_SUCCESS)
				kerr_set(&err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
			free(key);
			if (err.status != KHOR_SUCCESS)
				break;
		} else if (rec == 'E') {
			uint16_t kl = bget_u16(&r);
			if (r.bad || r.off + kl > r.len) {
				r.bad = true;
				break;
			}
			char *key = strndup((const char *)p + r.off, kl);
			r.off += kl;
			uint16_t ml = bget_u16(&r);
			if (key == NULL || r.bad || r.off + ml > r.len) {
				free(key);
				r.bad = true;
				break;
			}
			eitem *it = &items[n];
			memset(it, 0, sizeof(*it));
			it->error = true;
			it->msg = strndup((const char *)p + r.off, ml);
			/* The stop records come first in a response (coordinator.c), so a stop that
			 * caused this error is known here already. */
			it->status = s->first_stopper >= 0 ? KHOR_ERR_REMOTE : KHOR_ERR_INVALID_ARG;
			r.off += ml;
			pthread_mutex_lock(&e->mu);
			khor_handle *h = queue_claim_locked(s, key);
			if (h != NULL) {
				it->h = h;
				it->kind = h->kind;
			}
			pthread_mutex_unlock(&e->mu);
			free(key);
			if (it->h != NULL)
				n++;
			else
				free(it->msg);
		} else if (rec == 'D') {
			int last = bget_i32(&r);
			pthread_mutex_lock(&e->mu);
			khor_handle *j = s->join;
			if (j != NULL) {
				j->join_rank = last;
				queue_complete_locked(e, j, KHOR_SUCCESS, NULL);
				queue_signal_locked(e);
			}
			pthread_mutex_unlock(&e->mu);
		} else if (rec == 'T') {
			uint64_t fb = bget_u64(&r), cu = bget_u64(&r);
			atomic_store(&e->fusion_bytes, fb);
			atomic_store(&e->cycle_us, cu);
		} else if (rec == 'Q') {
			int who = bget_i32(&r);
			if (r.bad || who < 0 || who >= s->size || s->peer_stop == NULL) {
				r.bad = true;
				break;
			}
			pthread_mutex_lock(&e->mu);
			if (!s->peer_stop[who] && who != s->rank) {
				s->peer_stop[who] = true;
				if (s->first_stopper < 0)
					s->first_stopper = who;
				/*
				 * Nothing more can run on the set: this rank stops it too (its next report
				 * says 'S'), as Horovod's loop ends at one rank's shutdown. Its own later
				 * khor_engine_stop then finds the thread ended; the rank that stopped
				 * first is not kept waiting for it.
				 */
				set_stop_locked(s);
				khor_handle *j = s->join;
				if (j != NULL) {
					char m[256];
					snprintf(m, sizeof(m), "rank %d, engine set %d: rank %d stopped %s "
					         "while this rank waits in join: the join can never complete "
					         "(Horovod: \"Horovod has been shut down\")", s->user->ctx->rank,
					         s->id, who, s->id == 0 ? "its engine (khor_engine_stop, "
					         "Horovod's shutdown)" : "its engine or removed the set");
					/* A join not reported yet is still in the fresh list: out of it
					 * first, or the next report would walk a completed (maybe freed)
					 * handle. */
					if (klist_linked(&j->link))
						klist_del(&j->link);
					queue_complete_locked(e, j, KHOR_ERR_REMOTE, m);
					queue_signal_locked(e);
				}
			}
			pthread_mutex_unlock(&e->mu);
		} else if (rec == 'X') {
			stop = true;
		} else {
			r.bad = true;
		}
	}
	if (r.bad && err.status == KHOR_SUCCESS)
		kerr_set(&err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: a malformed response",
		         s->cycle);
	if (err.status != KHOR_SUCCESS) {
		/* The handles taken out of pending above still belong to items: fail them too. */
		pthread_mutex_lock(&e->mu);
		for (int i = 0; i < n; i++)
			if (items[i].h != NULL)
				queue_complete_locked(e, items[i].h, err.status, err.text);
		queue_signal_locked(e);
		pthread_mutex_unlock(&e->mu);
		items_free(items, n);
		queue_fail_set(s, &err);
		return false;
	}
	out->items = items;
	out->n = n;
	out->stop = stop;
	return true;
}

void response_free(eresp *r)
{
	items_free(r->items, r->n);
	memset(r, 0, sizeof(*r));
}
