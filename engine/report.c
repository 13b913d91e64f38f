/*
 * report.c -- this rank's report for a cycle (REQ): what it has enqueued since the last one.
 * Each new request is one record: F + its descriptor, or, when the response cache holds it
 * with the same descriptor, its slot among the H records; J for a join and S for a stop.
 * Reporting moves the handles from the fresh list to the pending one.
 *
 *   report := { 'F' u32 len desc | 'J' | 'S' }* [ 'H' u32 n u32 slot[n] ]
 */
#include "report.h"

#include "queue.h"
#include "response_cache.h"
#include "timeline.h"

#include <stdio.h>
#include <stdlib.h>

bool report_build(eset *s, bbuf *b)
{
	struct khor_engine *e = s->e;
	bbuf hits = { 0 };
	uint32_t nhits = 0;
	bool news = false;

	pthread_mutex_lock(&e->mu);
	klist *n, *tmp;
	KLIST_FOREACH_SAFE(n, tmp, &s->fresh) {
		if (s->caller && s->dev_seen)
			break; /* a device tensor came: the set thread reports it (engine.c) */
		khor_handle *h = KLIST_ENTRY(n, khor_handle, link);
		news = true;
		queue_report_locked(s, h);
		if (h->kind == EK_JOIN) {
			bput_u8(b, 'J');
			continue;
		}
		int slot = response_cache_hit(&s->cache, h);
		if (slot >= 0) {
			bput_u32(&hits, (uint32_t)slot);
			nhits++;
		} else {
			bput_u8(b, 'F');
			bput_u32(b, (uint32_t)h->desc_len);
			bput(b, h->desc, h->desc_len);
		}
		if (s->rank != 0 && timeline_on(e)) {
			/* A worker's own timeline knows only its own readiness; the coordinator's
			 * has every rank's. */
			char what[32];
			snprintf(what, sizeof(what), "rank %d ready", s->rank);
			uint64_t now = kclock_ns();
			for (int i = 0; i < h->n; i++)
				timeline_instant(e, h->t[i].name, what, now);
		}
	}
	if (s->stop && !s->stop_sent) {
		bput_u8(b, 'S');
		s->stop_sent = true;
		news = true;
	}
	pthread_mutex_unlock(&e->mu);
	if (nhits > 0) {
		bput_u8(b, 'H');
		bput_u32(b, nhits);
		bput(b, hits.p, hits.len);
	}
	free(hits.p);
	return news;
}

bool report_has_news(eset *s)
{
	bool news;

	pthread_mutex_lock(&s->e->mu);
	news = (!klist_empty(&s->fresh) && !(s->caller && s->dev_seen)) ||
	       (s->stop && !s->stop_sent);
	pthread_mutex_unlock(&s->e->mu);
	return news;
}
