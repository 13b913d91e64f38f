/* coordinator.h -- the coordinator's answer for a cycle (coordinator.c). */
#ifndef KHOR_ENGINE_COORDINATOR_H
#define KHOR_ENGINE_COORDINATOR_H

#include "bbuf.h"
#include "types.h"

/* The cycle's response, from the table, into out; removes what it settles. */
khor_status coordinator_respond(eset *s, bbuf *out, kerr *err);

#endif
