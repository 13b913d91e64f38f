/*
 * discover.h -- running --host-discovery-script: one run at a time, as a child of khorrun
 * in its own process group, its stdout gathered through a pipe the caller polls, its end
 * seen by the loop's reaping (job.script_pid), and each run bounded by a timeout after
 * which its whole group is killed. Nothing here blocks: the driver starts a run, passes
 * the pipe's revents after each turn of the loop, and takes the output once the run is over.
 */
#ifndef KHOR_LAUNCHER_DISCOVER_H
#define KHOR_LAUNCHER_DISCOVER_H

#include "job.h"

struct discover {
	const char *cmd;
	int64_t timeout_ms;
	int fd;       /* read end of its stdout; -1 once at EOF (or no run) */
	bool running; /* started, and its end not yet taken */
	bool killed;  /* ran past its timeout */
	kdeadline dl;
	char *out;
	size_t len, cap;
};

void discover_init(struct discover *d, const char *cmd, int64_t timeout_ms);
/* Starts a run; false with the reason in why. */
bool discover_start(struct job *j, struct discover *d, const sigset_t *child_mask, char *why,
                    size_t wlen);
/*
 * Reads what came (revents of d->fd from the loop's turn) and checks the timeout. Returns
 * true once the run is over: *ok with its output in d->out/d->len (NUL-terminated), or not
 * with the reason in why.
 */
bool discover_step(struct job *j, struct discover *d, short revents, bool *ok, char *why,
                   size_t wlen);
/* ms until d's deadline (at most cap), for the loop's timeout. */
int discover_wait_ms(const struct discover *d, int cap);
void discover_free(struct discover *d);

#endif
