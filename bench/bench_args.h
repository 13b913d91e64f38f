/*
 * bench_args.h -- the benchmark's flags (nccl-tests' own), shared by khor-bench and mpi-bench.
 */
#ifndef KHOR_BENCH_BENCH_ARGS_H
#define KHOR_BENCH_BENCH_ARGS_H

#include "bench.h"

#include <stdio.h>

void bench_usage(FILE *f, const char *prog, const char *extra);

/* "64M" -> 67108864. K, M, G are powers of 1024 (as nccl-tests); a trailing B is allowed. */
int bench_parse_size(const char *s, size_t *out);

int bench_parse_int(const char *s, int min, int max, int *out);

/*
 * Fills *a from argv. Returns 0 to run, 1 when -h printed the usage (exit 0), 2 on a bad
 * command line after saying why and printing the usage on stderr (exit 2). Runs before the
 * job is joined, so a typo never leaves the other ranks waiting. extra is the program's own
 * lines for the usage text (khor-bench's --transport and --algo), or NULL.
 */
int bench_parse_args(int argc, char **argv, const char *prog, const char *extra,
                     struct bench_args *a);

#endif
