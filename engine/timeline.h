/* timeline.h -- the engine's Chrome-trace timeline (timeline.c). */
#ifndef KHOR_ENGINE_TIMELINE_H
#define KHOR_ENGINE_TIMELINE_H

#include "types.h"

struct timeline *timeline_open(const char *path, int rank, bool mark_cycles, kerr *err);
void timeline_close(struct timeline *t);
void timeline_begin(struct khor_engine *e, const char *tensor, const char *phase, uint64_t ns,
                    const char *args_json);
void timeline_end(struct khor_engine *e, const char *tensor, uint64_t ns);
void timeline_instant(struct khor_engine *e, const char *tensor, const char *what, uint64_t ns);
void timeline_cycle(struct khor_engine *e, int set, uint32_t cycle, uint64_t ns);
bool timeline_on(struct khor_engine *e);

#endif
