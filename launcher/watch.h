/*
 * watch.h -- the ranks' heartbeats as a launcher sees them: khorrun for a fixed job, the
 * elastic driver for a generation. Each rank's heartbeat thread adds 1 to "hb/<rank>" in
 * its generation every KHOR_HEARTBEAT_INTERVAL; a rank whose counter this process has not
 * seen move for KHOR_HEARTBEAT_TIMEOUT (on its own monotonic clock) is stopped, hung or cut
 * off, and is reported once. A rank with no counter (not beating yet, or gone with
 * khor_finalize, which removes it) is not watched.
 */
#ifndef KHOR_LAUNCHER_WATCH_H
#define KHOR_LAUNCHER_WATCH_H

#include "rendezvous/store.h"

#include <stdint.h>

struct watch;

/* A rank that stopped answering. */
struct watch_silent {
	int rank;
	int gen;           /* the generation its heartbeat was in */
	int64_t silent_ms; /* for at least this long */
	char host[64];     /* as the rank published it ("host/<rank>"); "" if unknown */
};

/*
 * Watches ranks 0..n-1 of job_id through st, a client of the job's store that the watcher
 * then uses alone (and closes). gen > 0: every rank's heartbeat is in generation gen (an
 * elastic generation); 0: each rank's own, its count of inits in "<job>/0/inits/<rank>",
 * as a fixed job numbers them. NULL when out of memory.
 */
struct watch *watch_new(store *st, const char *job_id, int gen, int n, int64_t timeout_ms,
                        int64_t interval_ms);
/* Milliseconds until the next read is due (for poll's timeout). */
int watch_due_ms(const struct watch *w);
/*
 * When due, reads the counters and puts the ranks that have just gone silent for the
 * timeout into out (at most cap); returns how many, each rank once, 0 when not due. A
 * store that cannot be read says so once (in *why, when given) and watches nothing more.
 */
int watch_poll(struct watch *w, struct watch_silent *out, int cap, const char **why);
/* Rank r ended: watch it no more. */
void watch_forget(struct watch *w, int r);
/*
 * Ends generation gen for every rank, with text as the cause ("<job>/<gen>/abort"), unless
 * a rank failed first and already did (the first writer wins, as among the ranks).
 */
void watch_abort(struct watch *w, int gen, const char *text);
void watch_free(struct watch *w);

#endif
