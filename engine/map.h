/*
 * map.h -- a string -> pointer hash map (map.c): the names and keys in flight, the response
 * cache's index, the coordinator's table, the timeline's lanes.
 */
#ifndef KHOR_ENGINE_MAP_H
#define KHOR_ENGINE_MAP_H

#include "khor.h"

#include <stddef.h>

typedef struct emap {
	struct emap_node **b;
	size_t nb, n;
} emap;

void *emap_get(const emap *m, const char *k);
khor_status emap_put(emap *m, const char *k, void *v); /* k is copied */
void *emap_del(emap *m, const char *k);
void emap_free(emap *m);

#endif
