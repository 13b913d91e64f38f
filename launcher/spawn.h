/*
 * spawn.h -- starting the ranks of this host: the program found before anything starts,
 * enough file descriptors, each rank in its own process group on its own pipes.
 */
#ifndef KHOR_LAUNCHER_SPAWN_H
#define KHOR_LAUNCHER_SPAWN_H

#include "env.h"
#include "job.h"

/*
 * Finds prog the way a shell would. Returns 0 with *path_out malloc'd, or a shell's exit
 * status: 127 when not found, 126 when found but not runnable (the reason said).
 */
int spawn_resolve_program(const char *prog, char **path_out);
/* Raises the soft fd limit for np ranks; false with the reason said. */
bool spawn_ensure_fd_limit(int np);
/*
 * Starts ranks first .. first+count-1 (in the helper: all of its ranks, whose identities
 * khorrun sent in hslots); on a failure stops those already running and records why.
 */
void spawn_all(struct job *j, const char *path, char **fixed, size_t nfixed,
               const sigset_t *child_mask, const cpubind_cpus *cpus, int first, int count,
               char (*hslots)[NSLOTS][SLOT_LEN]);

#endif
