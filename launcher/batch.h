/*
 * batch.h -- starting ranks on one host while the job runs: the elastic driver's new
 * workers of a generation, host by host. Each batch gets room in job.ranks and a host entry
 * of its own (for another host: its own ssh connection and helper, which supervise just
 * these ranks), then starts like the ranks of a fixed job (spawn_all here, ssh_start there).
 */
#ifndef KHOR_LAUNCHER_BATCH_H
#define KHOR_LAUNCHER_BATCH_H

#include "job.h"

/* One rank to start: its numbers in the generation it starts in, and its slot. */
struct batch_rank {
	int rank, lrank, lsize, xrank, xsize;
	int slot;
};

struct batch {
	const char *host; /* the name as given */
	bool here;        /* this host: no ssh */
	const struct batch_rank *r;
	int n;
	/* Every rank's environment; the first ncommon go to another host's helper, which adds
	 * KHOR_HOSTNAME and HOROVOD_HOSTNAME itself. */
	char **fixed;
	size_t nfixed, ncommon;
	const char *path;      /* the program here (here only) */
	const char *self_path; /* khorrun there (other hosts) */
	const char *cwd;
	const sigset_t *child_mask;
};

/*
 * Starts b's ranks, each named HOST:SLOT (its worker id, prefix and KHOR_WORKER_ID).
 * Returns the index in j->ranks of the first, or -1 when they could not even be set up
 * (the reason said). A start that fails here ends the job as spawn_all says; over ssh its
 * ranks end as lost, for the driver to see.
 */
int batch_start(struct job *j, const struct batch *b);

#endif
