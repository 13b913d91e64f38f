/*
 * response_cache.c -- the response cache of a process set (Horovod's): a request run once
 * gets a slot, the same on every rank, since slots are given while applying responses, in
 * order, LRU when full. Later reports of it with the same descriptor name the slot (4 bytes)
 * instead of the descriptor, and when every rank named the slot the response does too, so in
 * steady state a cycle is one small message each way per worker.
 */
#include "response_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int cache_find(const ecache *c, const char *key)
{
	uintptr_t v = (uintptr_t)emap_get(&c->index, key);
	return v == 0 ? -1 : (int)(v - 1);
}

/* The slot a rank may name for h: its key is cached with the same descriptor. */
int response_cache_hit(const ecache *c, const khor_handle *h)
{
	int i = c->cap > 0 ? cache_find(c, h->key) : -1;

	if (i < 0 || c->slot[i].desc_len != h->desc_len ||
	    memcmp(c->slot[i].desc, h->desc, h->desc_len) != 0)
		return -1;
	return i;
}

void response_cache_touch(ecache *c, int i)
{
	c->slot[i].used = ++c->clock;
}

/* Puts (key, desc) in the cache: the same slot on every rank, since every rank applies the
 * same responses in the same order. */
khor_status response_cache_put(ecache *c, const char *key, const uint8_t *desc, size_t len)
{
	int i = cache_find(c, key);
	uint8_t *d = malloc(len);

	if (d == NULL)
		return KHOR_ERR_NO_MEMORY;
	memcpy(d, desc, len);
	if (i < 0) {
		if (c->slot == NULL) {
			c->slot = calloc((size_t)c->cap, sizeof(*c->slot));
			if (c->slot == NULL) {
				free(d);
				return KHOR_ERR_NO_MEMORY;
			}
		}
		if (c->n < c->cap) {
			i = c->n++;
		} else {
			i = 0;
			for (int j = 1; j < c->n; j++)
				if (c->slot[j].used < c->slot[i].used)
					i = j;
			emap_del(&c->index, c->slot[i].key);
			free(c->slot[i].key);
			c->slot[i].key = NULL;
		}
		c->slot[i].key = strdup(key);
		if (c->slot[i].key == NULL ||
		    emap_put(&c->index, key, (void *)(uintptr_t)(i + 1)) != KHOR_SUCCESS) {
			free(d);
			return KHOR_ERR_NO_MEMORY;
		}
	}
	free(c->slot[i].desc);
	c->slot[i].desc = d;
	c->slot[i].desc_len = len;
	response_cache_touch(c, i);
	return KHOR_SUCCESS;
}

bool response_cache_cacheable(int kind)
{
	return kind == EK_ALLREDUCE || kind == EK_BROADCAST || kind == EK_REDUCESCATTER ||
	       kind == EK_BARRIER;
}

void response_cache_free(ecache *c)
{
	for (int i = 0; i < c->n; i++) {
		free(c->slot[i].key);
		free(c->slot[i].desc);
	}
	free(c->slot);
	emap_free(&c->index);
	c->slot = NULL;
	c->n = 0;
}
