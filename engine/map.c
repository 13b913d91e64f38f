/* map.c -- the engine's string -> pointer map (map.h): chained, FNV-1a, doubling. */
#include "map.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct emap_node {
	struct emap_node *next;
	void *v;
	char k[];
};

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s != '\0'; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

void *emap_get(const emap *m, const char *k)
{
	if (m->nb == 0)
		return NULL;
	for (struct emap_node *n = m->b[hash_str(k) % m->nb]; n != NULL; n = n->next)
		if (strcmp(n->k, k) == 0)
			return n->v;
	return NULL;
}

static khor_status emap_grow(emap *m)
{
	size_t nb = m->nb == 0 ? 64 : m->nb * 2;
	struct emap_node **b = calloc(nb, sizeof(*b));

	if (b == NULL)
		return KHOR_ERR_NO_MEMORY;
	for (size_t i = 0; i < m->nb; i++) {
		struct emap_node *n = m->b[i], *next;
		for (; n != NULL; n = next) {
			next = n->next;
			size_t j = hash_str(n->k) % nb;
			n->next = b[j];
			b[j] = n;
		}
	}
	free(m->b);
	m->b = b;
	m->nb = nb;
	return KHOR_SUCCESS;
}

khor_status emap_put(emap *m, const char *k, void *v)
{
	size_t len = strlen(k);
	struct emap_node *n;

	if (m->n >= m->nb && emap_grow(m) != KHOR_SUCCESS)
		return KHOR_ERR_NO_MEMORY;
	n = malloc(sizeof(*n) + len + 1);
	if (n == NULL)
		return KHOR_ERR_NO_MEMORY;
	memcpy(n->k, k, len + 1);
	n->v = v;
	size_t j = hash_str(k) % m->nb;
	n->next = m->b[j];
	m->b[j] = n;
	m->n++;
	return KHOR_SUCCESS;
}

void *emap_del(emap *m, const char *k)
{
	if (m->nb == 0)
		return NULL;
	for (struct emap_node **pp = &m->b[hash_str(k) % m->nb]; *pp != NULL; pp = &(*pp)->next) {
		if (strcmp((*pp)->k, k) == 0) {
			struct emap_node *n = *pp;
			void *v = n->v;
			*pp = n->next;
			free(n);
			m->n--;
			return v;
		}
	}
	return NULL;
}

void emap_free(emap *m)
{
	for (size_t i = 0; i < m->nb; i++) {
		struct emap_node *n = m->b[i], *next;
		for (; n != NULL; n = next) {
			next = n->next;
			free(n);
		}
	}
	free(m->b);
	memset(m, 0, sizeof(*m));
}
