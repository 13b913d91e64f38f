/*
 * regcache.c -- the registration cache (regcache.h). Entries sit in one list, most
 * recently used first; lookups walk it from the front and evictions from the back. The
 * limits are small (tens of entries by default), so a list beats a tree here: a hit is
 * found in the first few entries, since a schedule posts slices of the same buffers.
 */
#include "regcache.h"

#include "base/list.h"
#include "base/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct regcache_entry {
	klist node; /* on the cache's lru */
	uintptr_t lo, hi; /* the registered range */
	tp_mem_kind kind;
	unsigned access;
	uint64_t scope;
	int refs;
	bool stale; /* never hits again; deregistered at its last put */
	bool merge; /* taken into the entry a get is growing (only inside that get) */
	tp_mr *mr;
};

struct tp_regcache {
	pthread_mutex_t mu;
	const struct transport_ops *ops;
	tp_ctx *ctx;
	regcache_limits lim;
	uintptr_t page;
	klist lru; /* the entries, most recently used first */
	regcache_stats st;
};

khor_status regcache_create(const struct transport_ops *ops, tp_ctx *ctx,
                            const regcache_limits *lim, tp_regcache **cache_out, kerr *err)
{
	tp_regcache *c;
	long page = sysconf(_SC_PAGESIZE);

	if (ops->reg_mr == NULL || ops->dereg_mr == NULL)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "registration cache: transport '%s' "
		                "registers no memory",
		                ops->name);
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "registration cache of %s: out of memory",
		                ops->name);
	pthread_mutex_init(&c->mu, NULL);
	c->ops = ops;
	c->ctx = ctx;
	c->lim = *lim;
	c->page = page > 0 ? (uintptr_t)page : 4096;
	klist_init(&c->lru);
	*cache_out = c;
	return KHOR_SUCCESS;
}

#define ENTRY(n) KLIST_ENTRY(n, regcache_entry, node)

/* Every node of the lru from the least recently used on; the body may drop `n`'s entry. */
#define FOREACH_FROM_BACK(n, p, c)                                                           \
	for ((n) = (c)->lru.prev, (p) = (n)->prev; (n) != &(c)->lru; (n) = (p), (p) = (n)->prev)

static void to_front(tp_regcache *c, regcache_entry *e)
{
	klist_del(&e->node);
	klist_add_head(&c->lru, &e->node);
}

static void drop(tp_regcache *c, regcache_entry *e)
{
	klist_del(&e->node);
	c->ops->dereg_mr(c->ctx, e->mr);
	c->st.deregs++;
	c->st.bytes -= e->hi - e->lo;
	c->st.entries--;
	free(e);
}

/* Evicts unused entries from the back until the limits hold (or nothing unused is left). */
static void evict(tp_regcache *c)
{
	klist *n, *p;

	FOREACH_FROM_BACK(n, p, c) {
		regcache_entry *e = ENTRY(n);
		if (c->st.entries <= c->lim.max_entries && c->st.bytes <= c->lim.max_bytes)
			break;
		if (e->refs == 0) {
			drop(c, e);
			c->st.evictions++;
		}
	}
}

void regcache_destroy(tp_regcache *c)
{
	if (c == NULL)
		return;
	if (c->st.in_use > 0)
		KLOG_WARN("registration cache of %s destroyed with %d entries still in use",
		          c->ops->name, c->st.in_use);
	KLOG_DEBUG("registration cache of %s: %llu hits, %llu misses (%llu grows), %llu "
	           "evictions, %llu invalidations, %llu reg_mr calls, %.1f MiB at most",
	           c->ops->name, (unsigned long long)c->st.hits, (unsigned long long)c->st.misses,
	           (unsigned long long)c->st.grows, (unsigned long long)c->st.evictions,
	           (unsigned long long)c->st.invalidations, (unsigned long long)c->st.regs,
	           (double)c->st.peak_bytes / (1 << 20));
	while (!klist_empty(&c->lru))
		drop(c, ENTRY(klist_first(&c->lru)));
	pthread_mutex_destroy(&c->mu);
	free(c);
}

static khor_status reg(tp_regcache *c, const tp_reg_desc *d, uintptr_t lo, uintptr_t hi,
                       unsigned access, uint64_t scope, regcache_entry **ent_out, kerr *err)
{
	regcache_entry *e = calloc(1, sizeof(*e));
	tp_reg_desc r = *d;
	khor_status st;

	if (e == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "registration cache of %s: out of memory",
		                c->ops->name);
	r.buf = (void *)lo;
	r.len = hi - lo;
	r.access = access;
	if (d->kind == TP_MEM_CUDA)
		r.dmabuf_offset = d->dmabuf_offset - ((uintptr_t)d->buf - lo);
	st = c->ops->reg_mr(c->ctx, &r, &e->mr, err);
	if (st != KHOR_SUCCESS) {
		free(e);
		return st;
	}
	c->st.regs++;
	e->lo = lo;
	e->hi = hi;
	e->kind = d->kind;
	e->access = access;
	e->scope = scope;
	c->st.bytes += hi - lo;
	if (c->st.bytes > c->st.peak_bytes)
		c->st.peak_bytes = c->st.bytes;
	c->st.entries++;
	klist_add_head(&c->lru, &e->node);
	*ent_out = e;
	return KHOR_SUCCESS;
}

khor_status regcache_get(tp_regcache *c, const tp_reg_desc *d, uint64_t scope,
                         regcache_entry **ent_out, kerr *err)
{
	uintptr_t lo = (uintptr_t)d->buf, hi = lo + d->len;
	regcache_entry *e, *got = NULL;
	klist *n, *t;
	khor_status st = KHOR_SUCCESS;
	unsigned access = d->access;

	if (d->len == 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "registration cache of %s: empty range "
		                "at %p",
		                c->ops->name, d->buf);
	pthread_mutex_lock(&c->mu);
	KLIST_FOREACH_SAFE(n, t, &c->lru) {
		e = ENTRY(n);
		if (!e->stale && e->kind == d->kind && (e->access & access) == access &&
		    e->lo <= lo && hi <= e->hi) {
			c->st.hits++;
			to_front(c, e);
			goto take;
		}
	}
	c->st.misses++;
	if (d->kind == TP_MEM_HOST) {
		lo &= ~(c->page - 1);
		hi = (hi + c->page - 1) & ~(c->page - 1);
	}
	/*
	 * Grow: unused entries of this scope that overlap or touch the range are merged into
	 * it (repeatedly, as the union may reach further ones), so a buffer posted piece by
	 * piece ends up as one registration instead of one per piece. ONESHOT entries are
	 * never unused, and device memory is registered exactly as given.
	 */
	bool grew = false;
	for (bool more = d->kind == TP_MEM_HOST && scope != REGCACHE_ONESHOT; more;) {
		more = false;
		KLIST_FOREACH_SAFE(n, t, &c->lru) {
			e = ENTRY(n);
			if (e->merge || e->stale || e->refs > 0 || e->scope != scope ||
			    e->kind != d->kind || e->hi < lo || e->lo > hi)
				continue;
			e->merge = grew = true;
			more |= e->lo < lo || e->hi > hi;
			lo = e->lo < lo ? e->lo : lo;
			hi = e->hi > hi ? e->hi : hi;
			access |= e->access;
		}
	}
	st = reg(c, d, lo, hi, access, scope, &got, err);
	if (st != KHOR_SUCCESS && grew) {
		/* The union may be what failed (the locked-memory limit): try the range alone. */
		kerr ignore;
		lo = (uintptr_t)d->buf & ~(c->page - 1);
		hi = ((uintptr_t)d->buf + d->len + c->page - 1) & ~(c->page - 1);
		grew = false;
		if (reg(c, d, lo, hi, d->access, scope, &got, &ignore) == KHOR_SUCCESS)
			st = KHOR_SUCCESS;
	}
	KLIST_FOREACH_SAFE(n, t, &c->lru) {
		e = ENTRY(n);
		if (e->merge && grew)
			drop(c, e);
		else
			e->merge = false;
	}
	if (st != KHOR_SUCCESS) {
		/* Out of lockable memory, perhaps: let go of every unused entry and try once more.
		 */
		int freed = 0;
		FOREACH_FROM_BACK(n, t, c) {
			e = ENTRY(n);
			if (e->refs == 0 && !e->stale) {
				drop(c, e);
				c->st.evictions++;
				freed++;
			}
		}
		kerr again;
		lo = (uintptr_t)d->buf;
		hi = lo + d->len;
		if (d->kind == TP_MEM_HOST) {
			lo &= ~(c->page - 1);
			hi = (hi + c->page - 1) & ~(c->page - 1);
		}
		if (freed == 0 ||
		    reg(c, d, lo, hi, d->access, scope, &got, &again) != KHOR_SUCCESS) {
			pthread_mutex_unlock(&c->mu);
			return st;
		}
		st = KHOR_SUCCESS;
	}
	if (grew)
		c->st.grows++;
	e = got;
take:
	if (e->refs++ == 0)
		c->st.in_use++;
	evict(c);
	pthread_mutex_unlock(&c->mu);
	*ent_out = e;
	return KHOR_SUCCESS;
}

tp_mr *regcache_mr(const regcache_entry *e)
{
	return e->mr;
}

void regcache_put(tp_regcache *c, regcache_entry *e)
{
	pthread_mutex_lock(&c->mu);
	if (--e->refs == 0) {
		c->st.in_use--;
		if (e->stale || e->scope == REGCACHE_ONESHOT) {
			drop(c, e);
		} else {
			to_front(c, e);
			evict(c);
		}
	}
	pthread_mutex_unlock(&c->mu);
}

/* Makes e stale (under mu): deregistered now when unused, else at its last put. */
static void invalidate_entry(tp_regcache *c, regcache_entry *e)
{
	c->st.invalidations++;
	if (e->refs == 0)
		drop(c, e);
	else
		e->stale = true;
}

int regcache_invalidate(tp_regcache *c, const void *buf, size_t len)
{
	uintptr_t lo = (uintptr_t)buf, hi = lo + len;
	int count = 0;
	klist *n, *t;

	if (c == NULL || buf == NULL || len == 0)
		return 0;
	pthread_mutex_lock(&c->mu);
	KLIST_FOREACH_SAFE(n, t, &c->lru) {
		regcache_entry *e = ENTRY(n);
		if (!e->stale && e->lo < hi && lo < e->hi) {
			invalidate_entry(c, e);
			count++;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return count;
}

int regcache_invalidate_scope(tp_regcache *c, uint64_t scope)
{
	int count = 0;
	klist *n, *t;

	if (c == NULL || scope == REGCACHE_KEEP || scope == REGCACHE_ONESHOT)
		return 0;
	pthread_mutex_lock(&c->mu);
	KLIST_FOREACH_SAFE(n, t, &c->lru) {
		regcache_entry *e = ENTRY(n);
		if (!e->stale && e->scope == scope) {
			invalidate_entry(c, e);
			count++;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return count;
}

void regcache_stats_get(tp_regcache *c, regcache_stats *out)
{
	pthread_mutex_lock(&c->mu);
	*out = c->st;
	pthread_mutex_unlock(&c->mu);
}
