/*
 * regcache.h -- the registration cache: memory registrations (tp_mr) of one transport
 * instance kept for reuse, above the transports (transport.h: reg_mr, dereg_mr).
 *
 * Pinning memory costs tens of microseconds per megabyte and a syscall, so a schedule that
 * posts one buffer slice by slice must not register each slice: it gets an entry that
 * covers the slice, from the cache. Like UCX's rcache and Open MPI's leave_pinned:
 *   - get: an entry of the same memory kind whose range covers [buf, buf + len) and whose
 *     access includes the wanted one is a hit (its count of users goes up). Else unused
 *     entries of the same scope that overlap or touch the range are merged with it into one
 *     registration ("grow"), or a new one is made. Host ranges are rounded out to pages
 *     (every page of the rounded range holds a byte of the buffer, so it is mapped); device
 *     ranges are registered as given.
 *   - put: the user is done with the entry. An unused entry stays registered, least recently
 *     used first out once more than max_entries entries or max_bytes bytes are registered.
 *   - invalidate(buf, len): the memory is about to be freed or reused for other pages. Every
 *     entry overlapping it stops hitting at once ("stale"); an unused one is deregistered now,
 *     one in use at its last put. The owner of a buffer that may be cached must call it
 *     before freeing the buffer: a registration pins the pages it was made on, and a later
 *     buffer at the same address (after free and malloc) lives on other pages. A hit on
 *     that entry would move the old pages' bytes: silent corruption.
 *   - scopes say how long an entry may outlive its users. REGCACHE_KEEP (0): until evicted
 *     or invalidated (buffers whose owner invalidates them: the runtime's scratch, its
 *     temp buffers, user buffers under KHOR_REG_CACHE_USER=1). REGCACHE_ONESHOT:
 *     deregistered at its last put (buffers whose free nobody reports). Any other value:
 *     until regcache_invalidate_scope of that value (one collective call's user buffers,
 *     valid until the call returns). A hit may come from an entry of any scope: whoever
 *     holds a reference keeps its memory valid; grows only merge entries of one scope, so a
 *     kept entry never takes in the pages of a buffer that is about to go away.
 *
 * Threads, locks and ownership: every function may be called from any thread; each takes
 * the cache's own mutex. reg_mr and dereg_mr of the transport are called under it (they take
 * the transport's lock; a transport never calls back into its caller, so the order is always
 * cache then transport). The creator owns the cache and destroys it, after every entry was
 * put and before the transport instance is destroyed. An entry belongs to the cache; a
 * caller holds it from get to put and must not use its mr after the put.
 */
#ifndef KHOR_TRANSPORT_REGCACHE_H
#define KHOR_TRANSPORT_REGCACHE_H

#include "transport.h"

#include <stdint.h>

typedef struct tp_regcache tp_regcache;
typedef struct regcache_entry regcache_entry;

#define REGCACHE_KEEP ((uint64_t)0)
#define REGCACHE_ONESHOT UINT64_MAX

typedef struct regcache_limits {
	int max_entries;  /* unused entries are evicted beyond this many entries (0: keep none) */
	size_t max_bytes; /* ... or beyond this many registered bytes */
} regcache_limits;

typedef struct regcache_stats {
	uint64_t hits;          /* gets served by an existing entry */
	uint64_t misses;        /* gets that registered (a grow included) */
	uint64_t grows;         /* misses that merged unused entries into a larger one */
	uint64_t evictions;     /* unused entries dropped for the limits */
	uint64_t invalidations; /* entries dropped by invalidate or invalidate_scope */
	uint64_t regs, deregs;  /* reg_mr and dereg_mr calls */
	uint64_t bytes;         /* registered now */
	uint64_t peak_bytes;    /* the most registered at once */
	int entries;            /* registered now (stale ones in use included) */
	int in_use;             /* of which held by a caller */
} regcache_stats;

/* A cache over the transport instance ctx, whose ops have reg_mr and dereg_mr. */
khor_status regcache_create(const struct transport_ops *ops, tp_ctx *ctx,
                            const regcache_limits *lim, tp_regcache **cache_out, kerr *err);
/* Deregisters every entry. All must have been put (one still held is deregistered anyway,
 * with a warning). NULL is fine. */
void regcache_destroy(tp_regcache *c);

/*
 * An entry covering d (d->len > 0), registered with at least d->access, in scope (above).
 * A failed registration returns the transport's status and text (which names the buffer,
 * its size and the locked-memory limit).
 */
khor_status regcache_get(tp_regcache *c, const tp_reg_desc *d, uint64_t scope,
                         regcache_entry **ent_out, kerr *err);
/* The registration to pass to isend/irecv; valid until the entry's put. Lock-free. */
tp_mr *regcache_mr(const regcache_entry *e);
void regcache_put(tp_regcache *c, regcache_entry *e);

/* Drops every entry overlapping [buf, buf + len); see above. Returns how many. */
int regcache_invalidate(tp_regcache *c, const void *buf, size_t len);
/* Drops every entry of scope (not KEEP nor ONESHOT). Returns how many. */
int regcache_invalidate_scope(tp_regcache *c, uint64_t scope);

void regcache_stats_get(tp_regcache *c, regcache_stats *out);

#endif
