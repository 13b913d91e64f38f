/*
 * tuning.h -- horovodrun's tuning flags and its --config-file: each setting becomes a
 * variable in every rank's environment (KHOR_* where khor has the knob, horovodrun's own
 * HOROVOD_* name otherwise), the command line winning over the file.
 */
#ifndef KHOR_LAUNCHER_TUNING_H
#define KHOR_LAUNCHER_TUNING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct opts;
struct tuning;

/* Is name one of the tuning flags? *takes_value_out: it takes a value (else a switch). */
bool tuning_knows(const char *name, bool *takes_value_out);
/*
 * Records a tuning flag from the command line (val NULL for a switch); false with what it
 * wants in why (the caller says it with the usage: exit 2).
 */
bool tuning_set_flag(struct opts *o, const char *name, const char *val, char *why,
                     size_t whylen);
/*
 * Once the command line is read: reads --config-file (settings the command line did not
 * give) and appends every setting to o->xvars as "VAR=value". false: said, exit 2.
 */
bool tuning_finish(struct opts *o);
/* The help lines of the tuning flags. */
void tuning_usage(FILE *f);
/* Frees what tuning_set_flag and tuning_finish allocated. */
void tuning_free(struct opts *o);

#endif
