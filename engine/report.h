/* report.h -- this rank's report for a cycle (report.c). */
#ifndef KHOR_ENGINE_REPORT_H
#define KHOR_ENGINE_REPORT_H

#include "bbuf.h"
#include "types.h"

/* Moves the fresh handles to pending and writes what this rank has to say this cycle into b;
 * false when it has nothing to say. */
bool report_build(eset *s, bbuf *b);
/* Whether this rank has something to report (a new request, or its stop). */
bool report_has_news(eset *s);

#endif
