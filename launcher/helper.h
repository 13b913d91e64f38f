/*
 * helper.h -- `khorrun --remote-helper`: the far side of one ssh connection.
 */
#ifndef KHOR_LAUNCHER_HELPER_H
#define KHOR_LAUNCHER_HELPER_H

#include "env.h"

#include <stdbool.h>
#include <stddef.h>

/* What khorrun's start-up frames have said so far (helper_take). */
struct helper_start {
	bool proto_ok, go;
	char *cwd;
	char **argv;                     /* NULL-terminated once it has one */
	size_t nargv;
	char **env;                      /* 'V': "NAME=value", put in the environment at "go" */
	size_t nenv;
	char (*hslots)[NSLOTS][SLOT_LEN]; /* per rank: its environment slots */
	int *ids;                        /* per rank: its id in khorrun's frames */
	int nranks;
	long long grace;                 /* ms */
	int bindm;                       /* 1: bind the ranks to this host's CPUs */
	char why[256];                   /* when helper_take fails: what to say ("" = nothing) */
};

void helper_start_init(struct helper_start *hs);
/*
 * Takes one start-up frame (type, payload buf of n bytes, NUL-terminated as frame_read
 * leaves it): 1 at "go", 0 for more, -1 when the start cannot go on (why says why, or is
 * empty when there is nothing to say: out of memory where saying would need memory too).
 */
int helper_take(struct helper_start *hs, char type, const char *buf, size_t n);
void helper_start_free(struct helper_start *hs);

/* Runs this host's ranks for the khorrun on stdin; returns the helper's exit status. */
int helper_main(void);

#endif
