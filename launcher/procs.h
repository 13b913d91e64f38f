/*
 * procs.h -- the ranks as processes: which child is whose, the signals that stop them in
 * steps (--grace apart), what they leave behind, and what a rank's end means for the job.
 */
#ifndef KHOR_LAUNCHER_PROCS_H
#define KHOR_LAUNCHER_PROCS_H

#include "job.h"

/*
 * Blocks the signals we handle, opens the signalfd and makes us a subreaper. Returns false
 * with the reason said; *old_mask is the mask to give the ranks and to restore.
 */
bool procs_setup_signals(struct job *j, sigset_t *old_mask);
struct rank *procs_rank_of_pid(struct job *j, pid_t pid);
struct host *procs_host_of_ssh(struct job *j, pid_t pid);
/* The children of khorrun that are not running ranks nor ssh: what the ranks left behind. */
size_t procs_find_orphans(struct job *j, pid_t *pids, size_t cap, size_t *live_out);
/* sig to every running rank's process group, every other host and every leftover. */
void procs_signal_all(struct job *j, int sig);
/* sig to one rank (its process group; on another host, through its helper). */
void procs_signal_rank(struct job *j, struct rank *rk, int sig);
/* Starts the stop: first_sig now, then SIGTERM and SIGKILL, --grace apart. */
void procs_begin_stop(struct job *j, int first_sig);
/* The grace period passed: send the next signal, or stop waiting after SIGKILL. */
void procs_escalate(struct job *j);
/*
 * Rank rk stopped answering (its heartbeat, silent for silent_ms): SIGKILL to it, here or
 * through its host's helper, which also ends a stopped process. It is the job's failure
 * unless one came first; the stop of the others begins --grace later.
 */
void procs_fence(struct job *j, struct rank *rk, int64_t silent_ms);
/* Rank rk ended with wait status st (the first failure stops the job). */
void procs_rank_ended(struct job *j, struct rank *rk, int st);

#endif
