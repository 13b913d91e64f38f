/*
 * helper.h -- `khorrun --remote-helper`: the far side of one ssh connection.
 */
#ifndef KHOR_LAUNCHER_HELPER_H
#define KHOR_LAUNCHER_HELPER_H

/* Runs this host's ranks for the khorrun on stdin; returns the helper's exit status. */
int helper_main(void);

#endif
