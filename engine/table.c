/*
 * table.c -- the coordinator's table: every rank's report, kept per key with when it came
 * (a centry), until the key is settled. A request missing on some ranks stays visible here:
 * the stall inspector names the missing ranks and what they submitted instead. Reports are
 * read here (report.c writes them).
 */
#include "table.h"

#include "bbuf.h"
#include "desc.h"

#include <stdlib.h>
#include <string.h>

static void centry_free(eset *s, centry *c)
{
	for (int r = 0; r < s->size; r++)
		free(c->desc[r]);
	free(c->desc);
	free(c->desc_len);
	free(c->ready_ns);
	free(c->key);
	free(c);
}

void table_remove(eset *s, centry *c)
{
	emap_del(&s->table, c->key);
	klist_del(&c->link);
	centry_free(s, c);
}

void table_free(eset *s)
{
	klist *n;
	while ((n = klist_first(&s->arrivals)) != NULL)
		table_remove(s, KLIST_ENTRY(n, centry, link));
	emap_free(&s->table);
	free(s->joined_r);
	free(s->stop_r);
	free(s->stop_told);
	s->joined_r = s->stop_r = s->stop_told = NULL;
}

/* Records that rank r has key ready with descriptor d (copied). */
static khor_status table_add(eset *s, int r, const char *key, const uint8_t *d, size_t len,
                             int slot, uint64_t now)
{
	centry *c = emap_get(&s->table, key);

	if (c == NULL) {
		c = calloc(1, sizeof(*c));
		if (c == NULL)
			return KHOR_ERR_NO_MEMORY;
		c->desc = calloc((size_t)s->size, sizeof(*c->desc));
		c->desc_len = calloc((size_t)s->size, sizeof(*c->desc_len));
		c->ready_ns = calloc((size_t)s->size, sizeof(*c->ready_ns));
		c->key = strdup(key);
		if (c->desc == NULL || c->desc_len == NULL || c->ready_ns == NULL || c->key == NULL ||
		    emap_put(&s->table, key, c) != KHOR_SUCCESS) {
			free(c->desc);
			free(c->desc_len);
			free(c->ready_ns);
			free(c->key);
			free(c);
			return KHOR_ERR_NO_MEMORY;
		}
		c->first_ns = now;
		c->from_cache_all = true;
		c->slot = slot;
		klist_add_tail(&s->arrivals, &c->link);
	}
	if (c->desc[r] != NULL)
		return KHOR_SUCCESS; /* reported twice: cannot happen, names are unique in flight */
	c->desc[r] = malloc(len);
	if (c->desc[r] == NULL)
		return KHOR_ERR_NO_MEMORY;
	memcpy(c->desc[r], d, len);
	c->desc_len[r] = len;
	c->ready_ns[r] = now;
	c->have++;
	if (slot < 0 || slot != c->slot)
		c->from_cache_all = false;
	return KHOR_SUCCESS;
}

/* Takes in rank r's report. */
khor_status table_merge(eset *s, int r, const uint8_t *p, size_t len, kerr *err)
{
	brd b = { p, len, 0, false };
	uint64_t now = kclock_ns();

	while (b.off < b.len && !b.bad) {
		uint8_t rec = bget_u8(&b);
		if (rec == 'F') {
			uint32_t dl = bget_u32(&b);
			if (b.bad || b.off + dl > b.len)
				break;
			/*
			 * Checked whole here, where the sender is known: one that only had a key
			 * would reach the answer when every rank sent it alike (mismatch_find
			 * compares bytes), and fail the coordinator (an allgather's dims) or every
			 * rank's reading of the response, naming nobody.
			 */
			eitem it;
			kerr derr;
			if (desc_parse(p + b.off, dl, &it, &derr) != KHOR_SUCCESS) {
				if (derr.status == KHOR_ERR_NO_MEMORY)
					return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
				return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: rank %d "
				                "reports a malformed tensor descriptor (%u bytes)",
				                s->cycle, r, dl);
			}
			desc_free_tensors(&it);
			char *key = desc_key(p + b.off, dl);
			if (key == NULL)
				break;
			khor_status st = table_add(s, r, key, p + b.off, dl, -1, now);
			free(key);
			if (st != KHOR_SUCCESS)
				return kerr_set(err, st, "negotiation: out of memory");
			b.off += dl;
		} else if (rec == 'H') {
			uint32_t nh = bget_u32(&b);
			for (uint32_t i = 0; i < nh && !b.bad; i++) {
				uint32_t slot = bget_u32(&b);
				if (b.bad || slot >= (uint32_t)s->cache.n) {
					b.bad = true;
					break;
				}
				ecache_slot *cs = &s->cache.slot[slot];
				if (table_add(s, r, cs->key, cs->desc, cs->desc_len, (int)slot, now) !=
				    KHOR_SUCCESS)
					return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
			}
		} else if (rec == 'J') {
			if (!s->joined_r[r]) {
				s->joined_r[r] = true;
				s->njoined++;
			}
			s->last_joiner = r;
		} else if (rec == 'S') {
			if (!s->stop_r[r]) {
				s->stop_r[r] = true;
				s->nstop++;
			}
		} else {
			b.bad = true;
		}
	}
	if (b.bad || b.off != b.len)
		return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation cycle %u: a malformed report "
		                "from rank %d", s->cycle, r);
	return KHOR_SUCCESS;
}

/* The ranks that have not reported c (and are not joined, when skip_joined). */
int table_missing(const eset *s, const centry *c, int *out)
{
	int m = 0;
	for (int r = 0; r < s->size; r++)
		if (c->desc[r] == NULL)
			out[m++] = r;
	return m;
}
