/*
 * cli.h -- khorrun's command line: the options into struct opts, and the one way to reject
 * a bad one (the reason, the usage, exit status 2).
 */
#ifndef KHOR_LAUNCHER_CLI_H
#define KHOR_LAUNCHER_CLI_H

#include "job.h"

/*
 * Parses argv into o. Returns -1 to go on, or the exit status to exit with (0 after --help
 * or --version, 2 after a bad command line, which it has explained on stderr).
 */
int cli_parse(int argc, char **argv, struct opts *o);
/* Says what is wrong, prints the usage on stderr and returns 2, the status to exit with. */
int cli_bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
