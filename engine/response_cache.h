/* response_cache.h -- a set's response cache (response_cache.c). */
#ifndef KHOR_ENGINE_RESPONSE_CACHE_H
#define KHOR_ENGINE_RESPONSE_CACHE_H

#include "types.h"

/* The slot a rank may name for h: its key is cached with the same descriptor; else -1. */
int response_cache_hit(const ecache *c, const khor_handle *h);
/* Slot i was used now (LRU). */
void response_cache_touch(ecache *c, int i);
/* Puts (key, desc) in the cache: the same slot on every rank, since every rank applies the
 * same responses in the same order. */
khor_status response_cache_put(ecache *c, const char *key, const uint8_t *desc, size_t len);
/* Whether responses of this kind are cached (those whose descriptor is all they need). */
bool response_cache_cacheable(int kind);
void response_cache_free(ecache *c);

#endif
