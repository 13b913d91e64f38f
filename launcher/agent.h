/*
 * agent.h -- khorrun as one host's agent of an elastic job that meets in etcd
 * (--rdzv-backend etcd --rdzv-endpoint HOST:PORT --rdzv-id JOB), as torchrun runs one agent
 * per node: no khorrun is the job's, any agent may lead it, and etcd is its store.
 */
#ifndef KHOR_LAUNCHER_AGENT_H
#define KHOR_LAUNCHER_AGENT_H

#include "job.h"

#include <signal.h>

/* What main hands the agent. */
struct agent_env {
	const char *cwd;
	const sigset_t *child_mask;
	int local_cpus; /* KHOR_LOCAL_CPUS for the ranks here; 0: unknown */
};

/*
 * Runs this host's part of the job to its end (signals set up by procs_setup_signals).
 * Returns khorrun's exit status: the job's, as its leader decided it, or -1 when this
 * agent was interrupted or could not start its ranks (j->cause: main reports it).
 */
int agent_run(struct job *j, const struct agent_env *env);

#endif
