/* desc.h -- a request's descriptor, what every rank must agree on (desc.c). */
#ifndef KHOR_ENGINE_DESC_H
#define KHOR_ENGINE_DESC_H

#include "types.h"

/* The descriptor of h, into h->desc. */
khor_status desc_make(khor_handle *h, kerr *err);
/* Parses d into it (kind, op, ...; tensors with names and shapes, no buffers). */
khor_status desc_parse(const uint8_t *d, size_t len, eitem *it, kerr *err);
/* The key (names joined by '\n') of a descriptor, malloc'd; NULL when malformed. */
char *desc_key(const uint8_t *d, size_t len);
/* Frees the tensors desc_parse made for it. */
void desc_free_tensors(eitem *it);

#endif
