/*
 * output.h -- the ranks' stdout and stderr: read from their pipes (or, for a rank on another
 * host, fed from its helper's frames), cut into whole lines, prefixed "[rank] " and written
 * to khorrun's own, and with --output-filename to a file per rank.
 */
#ifndef KHOR_LAUNCHER_OUTPUT_H
#define KHOR_LAUNCHER_OUTPUT_H

#include "job.h"

/* Line buffers, prefixes and, with --output-filename, the files of all j->nstarted ranks. */
bool output_init_ranks(struct job *j);
/* The same for one rank started later (the elastic driver's); the directory exists. */
bool output_init_rank(struct job *j, struct rank *rk);
/* Frees the buffers and closes the files of a rank whose streams have both ended. */
void output_release_rank(struct rank *rk);
/* Frees what output_init_ranks allocated and closes what the ranks left open. */
void output_free_ranks(struct job *j);
/* Prints the complete lines in s (at EOF also the rest) and keeps what is left. */
void output_emit(struct job *j, struct rank *rk, struct stream *s, bool eof);
/* The stream's pipe is at its end: prints what is left and closes it. */
void output_close(struct job *j, struct rank *rk, struct stream *s);
/* Output of a rank on another host, as its helper sent it: cut into lines as here. */
void output_feed(struct job *j, struct rank *rk, struct stream *s, const char *p, size_t n);
/* One read of a rank's pipe (in the helper: sent on to khorrun as it is). */
void output_read(struct job *j, struct rank *rk, struct stream *s);

#endif
