/*
 * coordinator.c -- the coordinator's answer for a cycle (set rank 0): from the table of every
 * rank's reports, what is ready everywhere (or on every rank that has not joined, for an
 * allreduce), in arrival order; what fails (a mismatch, a collective other than allreduce
 * during a join, a stall past its shutdown time, a stop); the join's end and the stop. The
 * answer is the response every rank then applies (response.c).
 *
 * The stop is negotiated (every member calls khor_engine_stop, then 'X' ends the set's
 * thread everywhere), but one rank's stop is news at once: 'Q' tells every rank, which
 * fails later enqueues, and what the stopped rank never submitted fails now (Horovod, where
 * one rank's shutdown ends every rank's loop, fails those with "Horovod has been shut
 * down"). A rank that never stops is bounded by the stopping rank's KHOR_TIMEOUT
 * (negotiate.c), after which its stop returns the error naming it.
 */
#include "coordinator.h"

#include "bbuf.h"
#include "desc.h"
#include "mismatch.h"
#include "response.h"
#include "response_cache.h"
#include "stall.h"
#include "table.h"
#include "timeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a stopped rank did, for the sentences: set 0 is the engine's own comm. */
static const char *stopped_what(const eset *s)
{
	return s->id == 0 ? "stopped its engine (khor_engine_stop, Horovod's shutdown)"
	                  : "stopped its engine or removed this process set";
}

/*
 * A rank asked to stop (its report's 'S'): every rank hears it at once ('Q'), and its joins
 * end, because a stopped rank never joins. Then a request that a stopped rank has not
 * submitted can never run: it fails on every rank that has it, naming the rank, instead of
 * waiting (stall warnings, a barrier in tearDown) until the others stop too.
 */
static void tell_stops(eset *s, bbuf *out)
{
	for (int r = 0; r < s->size; r++) {
		if (!s->stop_r[r] || s->stop_told[r])
			continue;
		s->stop_told[r] = true;
		bput_u8(out, 'Q');
		bput_i32(out, r);
		memset(s->joined_r, 0, sizeof(bool) * (size_t)s->size);
		s->njoined = 0;
	}
}

/* c lacks a stopped rank: the error for every rank that has it. True when it did. */
static bool fail_if_stopped(eset *s, centry *c, int kind, bbuf *out)
{
	int stopped = -1, nw = 0;
	int *waiting = malloc(sizeof(int) * (size_t)s->size);
	bbuf m = { 0 };

	for (int r = 0; r < s->size; r++) {
		if (c->desc[r] == NULL && s->stop_r[r] && stopped < 0)
			stopped = r;
		if (c->desc[r] != NULL && waiting != NULL)
			waiting[nw++] = r;
	}
	if (stopped < 0) {
		free(waiting);
		return false;
	}
	bbuf_printf(&m, "rank %d %s before submitting %s '%s' on set %d, which %s ", stopped,
	            stopped_what(s), eng_kind_name(kind), c->key, s->id,
	            nw > 1 ? "ranks" : "rank");
	bbuf_rank_list(&m, waiting, nw);
	bbuf_printf(&m, " %s for: it can never run (Horovod: \"Horovod has been shut down\")",
	            nw > 1 ? "wait" : "waits");
	response_put_error(out, c->key, (const char *)m.p, m.len);
	free(m.p);
	free(waiting);
	table_remove(s, c);
	return true;
}

/* The cycle's responses, from the table; removes what they settle. */
khor_status coordinator_respond(eset *s, bbuf *out, kerr *err)
{
	struct khor_engine *e = s->e;
	uint64_t now = kclock_ns();
	bbuf msg = { 0 };

	tell_stops(s, out);
	klist *node, *tmp;
	KLIST_FOREACH_SAFE(node, tmp, &s->arrivals) {
		centry *c = KLIST_ENTRY(node, centry, link);
		int ref = -1;
		for (int r = 0; r < s->size && ref < 0; r++)
			if (c->desc[r] != NULL)
				ref = r;
		int kind = c->desc[ref][0];
		int lacking = 0, lacking_joined = 0;
		for (int r = 0; r < s->size; r++) {
			if (c->desc[r] == NULL) {
				lacking++;
				lacking_joined += s->joined_r[r];
			}
		}
		if (lacking > 0 && s->nstop > 0 && fail_if_stopped(s, c, kind, out))
			continue;
		if (lacking > 0 && lacking_joined > 0 && kind != EK_ALLREDUCE) {
			int *j = malloc(sizeof(int) * (size_t)s->size), nj = 0;
			for (int r = 0; j != NULL && r < s->size; r++)
				if (s->joined_r[r])
					j[nj++] = r;
			msg.len = 0;
			bbuf_printf(&msg, "%s '%s' cannot run while %s ", eng_kind_name(kind), c->key,
			            nj > 1 ? "ranks" : "rank");
			bbuf_rank_list(&msg, j, nj);
			bbuf_printf(&msg, " %s joined: only allreduce takes part in a join (the joined "
			            "ranks contribute zeros)", nj > 1 ? "have" : "has");
			free(j);
			response_put_error(out, c->key, (const char *)msg.p, msg.len);
			table_remove(s, c);
			continue;
		}
		if (lacking > lacking_joined)
			continue;
		msg.len = 0;
		if (mismatch_find(s, c, &msg)) {
			response_put_error(out, c->key, (const char *)msg.p, msg.len);
			table_remove(s, c);
			continue;
		}
		if (c->from_cache_all && s->njoined == 0 && c->slot >= 0 && c->slot < s->cache.n &&
		    strcmp(s->cache.slot[c->slot].key, c->key) == 0) {
			bput_u8(out, 'C');
			bput_u32(out, (uint32_t)c->slot);
		} else {
			bput_u8(out, 'R');
			bput_u32(out, (uint32_t)c->desc_len[ref]);
			bput(out, c->desc[ref], c->desc_len[ref]);
			bput_u8(out, response_cache_cacheable(kind) && s->njoined == 0 ? 1 : 0);
			if (kind == EK_ALLGATHER) {
				/* tensor-major: [tensor * size + r] */
				eitem *all = calloc((size_t)s->size, sizeof(*all));
				if (all == NULL) {
					free(msg.p);
					return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
				}
				for (int r = 0; r < s->size; r++) {
					if (desc_parse(c->desc[r], c->desc_len[r], &all[r], err) != KHOR_SUCCESS) {
						for (int q = 0; q < r; q++)
							desc_free_tensors(&all[q]);
						free(all);
						free(msg.p);
						return err->status;
					}
				}
				for (int i = 0; i < all[ref].n; i++)
					for (int r = 0; r < s->size; r++)
						bput_u64(out, (uint64_t)all[r].t[i].dims[0]);
				for (int r = 0; r < s->size; r++)
					desc_free_tensors(&all[r]);
				free(all);
			}
		}
		/* The timeline: when each rank became ready (the coordinator's clock), on every
		 * tensor's lane; this rank's own handle starts its negotiation span at the first. */
		if (timeline_on(e)) {
			char what[32];
			pthread_mutex_lock(&e->mu);
			khor_handle *mine = emap_get(&s->keys, c->key);
			if (mine != NULL && c->first_ns < mine->t_enqueue)
				mine->t_negotiate = c->first_ns;
			pthread_mutex_unlock(&e->mu);
			for (const char *k = c->key; k != NULL;) {
				const char *nl = strchr(k, '\n');
				char name[1024];
				snprintf(name, sizeof(name), "%.*s", nl != NULL ? (int)(nl - k) : (int)strlen(k),
				         k);
				for (int r = 0; r < s->size; r++) {
					if (c->desc[r] == NULL)
						continue;
					snprintf(what, sizeof(what), "rank %d ready", r);
					timeline_instant(e, name, what, c->ready_ns[r]);
				}
				k = nl != NULL ? nl + 1 : NULL;
			}
		}
		table_remove(s, c);
	}
	stall_inspect(s, now, out);
	free(msg.p);
	if (s->njoined == s->size) {
		bput_u8(out, 'D');
		bput_i32(out, s->last_joiner);
		memset(s->joined_r, 0, sizeof(bool) * (size_t)s->size);
		s->njoined = 0;
	}
	if (s->nstop == s->size) {
		KLIST_FOREACH_SAFE(node, tmp, &s->arrivals) {
			centry *c = KLIST_ENTRY(node, centry, link);
			bbuf m = { 0 };
			int *miss = malloc(sizeof(int) * (size_t)s->size);
			int nm = miss != NULL ? table_missing(s, c, miss) : 0;
			bbuf_printf(&m, "'%s': the engine was stopped on every rank before %s ", c->key,
			            nm > 1 ? "ranks" : "rank");
			bbuf_rank_list(&m, miss, nm);
			bbuf_printf(&m, " submitted it");
			response_put_error(out, c->key, (const char *)m.p, m.len);
			free(m.p);
			free(miss);
			table_remove(s, c);
		}
		bput_u8(out, 'X');
	}
	return out->oom ? kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory")
	                : KHOR_SUCCESS;
}
