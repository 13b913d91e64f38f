/* autotune.h -- KHOR_AUTOTUNE's search (autotune.c). */
#ifndef KHOR_ENGINE_AUTOTUNE_H
#define KHOR_ENGINE_AUTOTUNE_H

#include "types.h"

struct autotune *autotune_create(const eng_settings *s, int rank, kerr *err);
void autotune_free(struct autotune *a);
/* After each cycle with work (set 0's coordinator): maybe new values to agree on. */
bool autotune_cycle(struct autotune *a, uint64_t bytes, uint64_t *fusion, double *cycle_ms);

#endif
