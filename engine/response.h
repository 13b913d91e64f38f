/* response.h -- a cycle's response: written by the coordinator, read by all (response.c). */
#ifndef KHOR_ENGINE_RESPONSE_H
#define KHOR_ENGINE_RESPONSE_H

#include "bbuf.h"
#include "types.h"

/* An error record: key fails on every rank with msg. */
void response_put_error(bbuf *out, const char *key, const char *msg, size_t ml);
/*
 * Reads a response into out (the items in order, stop), applying its cache, join and
 * tuning records on the way. False when it is malformed: then the set has failed (and so
 * have the handles it named) and out is empty. Exposed for tests/engine/test_negotiate.c.
 */
bool response_parse(eset *s, const uint8_t *p, size_t len, eresp *out);
void response_free(eresp *r);

#endif
