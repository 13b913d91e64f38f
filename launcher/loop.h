/*
 * loop.h -- the poll loop that khorrun and its helper both sit in while the ranks run, and
 * the sweep after it that leaves nothing running.
 */
#ifndef KHOR_LAUNCHER_LOOP_H
#define KHOR_LAUNCHER_LOOP_H

#include "job.h"

#include <poll.h>

/* What the loop keeps between turns: its poll arrays, and the helper's frames from stdin. */
struct loop {
	struct pollfd *pfd;
	struct stream **who;
	struct rank **whose;
	struct host **whost;
	size_t cap;
	char *hrx;
	size_t hrx_len;
};

/* Forwards output, reaps, stops; returns when everything of the job has ended. */
void loop_run(struct job *j);
/*
 * The same in turns, for a caller that acts between them (the elastic driver): a turn
 * waits up to timeout_ms (at most 1 s) for output, signals, hosts and the caller's extra
 * fds (their revents set on return), handles what came, and returns false once the job
 * has nothing left (see loop.c). loop_open is false when out of memory.
 */
bool loop_open(struct job *j, struct loop *l);
bool loop_turn(struct job *j, struct loop *l, struct pollfd *extra, int nextra,
               int timeout_ms);
void loop_close(struct job *j, struct loop *l);
/* Stops and reaps what the ranks left running after the loop. */
void loop_sweep_leftovers(struct job *j);

#endif
