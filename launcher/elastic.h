/*
 * elastic.h -- khorrun's elastic driver (docs/ELASTIC.md, "The driver"): it keeps the
 * hosts (discovery), plans each generation into khorrun's own store as a client, starts
 * and fences the workers, and ends a generation when one is lost. The rules it applies are
 * elastic_plan.c's; the processes are started by batch.c and watched by loop.c.
 */
#ifndef KHOR_LAUNCHER_ELASTIC_H
#define KHOR_LAUNCHER_ELASTIC_H

#include "job.h"

#include <stddef.h>
#include <stdint.h>

struct elastic;

/* What main hands the driver: how to start ranks, and how to reach the store. */
struct elastic_env {
	char *const *common; /* every rank's environment (store, secret, job id, ...) */
	size_t ncommon;
	int local_cpus;        /* KHOR_LOCAL_CPUS for the ranks here; 0: unknown */
	const char *self_path; /* khorrun on the other hosts */
	const char *cwd;       /* the ranks' working directory there */
	const sigset_t *child_mask;
	const char *store_host; /* as the ranks reach it */
	uint16_t store_port;
	bool store_loopback; /* only this host reaches it */
	const char *secret;
	const char *job_id;
};

/*
 * Before the store: checks the settings the driver reads (KHOR_HEARTBEAT_TIMEOUT, ...),
 * takes the hosts (-H, --hostfile, Slurm, localhost) or runs the discovery script the first
 * time. Returns -1 to go on with *out, else khorrun's exit status (the reason said). Needs
 * khorrun's signal handling set up (procs_setup_signals).
 */
int elastic_prepare(struct job *j, const sigset_t *child_mask, struct elastic **out);
/* The first host of the job that is not this one, for the store's address; NULL: none. */
const char *elastic_remote_host(const struct elastic *e);
/*
 * Runs the job to its end. Returns khorrun's exit status, or -1 when the job ended by an
 * interrupt or a failed start (j->cause: main reports it as for a fixed job).
 */
int elastic_run(struct elastic *e, const struct elastic_env *env);
void elastic_free(struct elastic *e);

#endif
