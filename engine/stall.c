/*
 * stall.c -- the stall inspector (Horovod's): a request ready on some ranks but not on others
 * for KHOR_STALL_CHECK_TIME is warned about, naming who has it, who does not and what those
 * submitted instead; after KHOR_STALL_SHUTDOWN_TIME it fails on every rank.
 */
#include "stall.h"

#include "bbuf.h"
#include "response.h"
#include "table.h"

#include "base/log.h"

#include <stdlib.h>

/* The stall message: who has c, who does not, and what those submitted instead. */
static void stall_msg(eset *s, centry *c, uint64_t now, bbuf *msg)
{
	int *miss = malloc(sizeof(int) * (size_t)s->size);
	int *have = malloc(sizeof(int) * (size_t)s->size);
	int nm, nh = 0;

	if (miss == NULL || have == NULL) {
		free(miss);
		free(have);
		bbuf_printf(msg, "tensor '%s' is stalled", c->key);
		return;
	}
	nm = table_missing(s, c, miss);
	for (int r = 0; r < s->size; r++)
		if (c->desc[r] != NULL)
			have[nh++] = r;
	bbuf_printf(msg, "tensor '%s' on process set %d has been ready on %s ", c->key, s->id,
	            nh > 1 ? "ranks" : "rank");
	bbuf_rank_list(msg, have, nh);
	bbuf_printf(msg, " for %.0f s, but %s ", (double)(now - c->first_ns) / 1e9,
	            nm > 1 ? "ranks" : "rank");
	bbuf_rank_list(msg, miss, nm);
	bbuf_printf(msg, " %s not submitted it", nm > 1 ? "have" : "has");
	/* What the missing ranks wait on instead: the names they did submit. */
	bbuf_printf(msg, "; instead, ");
	for (int i = 0; i < nm; i++) {
		int r = miss[i], shown = 0, total = 0;
		bbuf_printf(msg, "%srank %d %s", i > 0 ? "; " : "", r,
		            s->joined_r[r] ? "has joined" : "submitted ");
		if (s->joined_r[r])
			continue;
		klist *n;
		for (n = s->arrivals.next; n != &s->arrivals; n = n->next) {
			centry *o = KLIST_ENTRY(n, centry, link);
			if (o == c || o->desc[r] == NULL)
				continue;
			if (shown < 5)
				bbuf_printf(msg, "%s'%s'", shown > 0 ? ", " : "", o->key);
			shown += shown < 5;
			total++;
		}
		if (total == 0)
			bbuf_printf(msg, "nothing (it may be busy elsewhere, or have run out of data: "
			            "see join)");
		else if (total > shown)
			bbuf_printf(msg, " and %d more", total - shown);
	}
	free(miss);
	free(have);
}

void stall_inspect(eset *s, uint64_t now, bbuf *out)
{
	if (s->e->s.stall_check_s <= 0 || now < s->next_stall_check_ns)
		return;
	uint64_t check = (uint64_t)(s->e->s.stall_check_s * 1e9);
	uint64_t shut = (uint64_t)(s->e->s.stall_shutdown_s * 1e9);
	bbuf msg = { 0 };
	klist *node, *tmp;

	s->next_stall_check_ns = now + check / 4 + 1;
	KLIST_FOREACH_SAFE(node, tmp, &s->arrivals) {
		centry *c = KLIST_ENTRY(node, centry, link);
		if (now - c->first_ns < check)
			continue;
		msg.len = 0;
		stall_msg(s, c, now, &msg);
		bput_u8(&msg, 0);
		if (shut > 0 && now - c->first_ns >= shut) {
			KLOG_ERR("engine: %s; failing it on every rank (KHOR_STALL_SHUTDOWN_TIME "
			         "%.0f s)", (const char *)msg.p, s->e->s.stall_shutdown_s);
			bbuf m2 = { 0 };
			bbuf_printf(&m2, "stalled for %.0f s (KHOR_STALL_SHUTDOWN_TIME): %s",
			            (double)(now - c->first_ns) / 1e9, (const char *)msg.p);
			response_put_error(out, c->key, (const char *)m2.p, m2.len);
			free(m2.p);
			table_remove(s, c);
			continue;
		}
		if (c->warned_ns == 0 || now - c->warned_ns >= check) {
			KLOG_WARN("engine stall: %s (KHOR_STALL_CHECK_TIME %.0f s)", (const char *)msg.p,
			          s->e->s.stall_check_s);
			c->warned_ns = now;
		}
	}
	free(msg.p);
}
