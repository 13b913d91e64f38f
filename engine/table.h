/* table.h -- the coordinator's table of every rank's reports (table.c). */
#ifndef KHOR_ENGINE_TABLE_H
#define KHOR_ENGINE_TABLE_H

#include "types.h"

/* Takes in rank r's report (exposed for tests/engine/test_negotiate.c). */
khor_status table_merge(eset *s, int r, const uint8_t *p, size_t len, kerr *err);
/* c is settled: out of the table, freed. */
void table_remove(eset *s, centry *c);
/* The ranks that have not reported c, into out (s->size entries); their number. */
int table_missing(const eset *s, const centry *c, int *out);
/* Frees the table and the coordinator's per-rank records. */
void table_free(eset *s);

#endif
