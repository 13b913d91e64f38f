/*
 * bench_colls.h -- the table of collectives: nccl-tests' size conventions and bus-bandwidth
 * factors.
 */
#ifndef KHOR_BENCH_BENCH_COLLS_H
#define KHOR_BENCH_BENCH_COLLS_H

#include "bench.h"

/* Every collective the benchmark runs, in the order of its usage text. */
extern const struct bench_coll bench_colls[];
extern const size_t bench_ncolls;

/* "all_reduce", "reduce_scatter", "bcast" (nccl-tests' and MPI's spellings) name ours too. */
const struct bench_coll *bench_find_coll(const char *name);

#endif
