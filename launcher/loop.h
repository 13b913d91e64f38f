/*
 * loop.h -- the poll loop that khorrun and its helper both sit in while the ranks run, and
 * the sweep after it that leaves nothing running.
 */
#ifndef KHOR_LAUNCHER_LOOP_H
#define KHOR_LAUNCHER_LOOP_H

#include "job.h"

/* Forwards output, reaps, stops; returns when everything of the job has ended. */
void loop_run(struct job *j);
/* Stops and reaps what the ranks left running after the loop. */
void loop_sweep_leftovers(struct job *j);

#endif
