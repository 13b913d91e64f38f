/*
 * bench_output.h -- the benchmark's table, its rows and the pieces of its CSV and JSON output.
 */
#ifndef KHOR_BENCH_BENCH_OUTPUT_H
#define KHOR_BENCH_BENCH_OUTPUT_H

#include "bench.h"

#include <stdint.h>
#include <stdio.h>

const char *bench_check_name(enum bench_check c);

int bench_comparing(const struct bench_backend *b);

const char *bench_mem_name(const struct bench_mem *m);

/* Does the run name its memory (a device kind among its buffers)? Else it prints as always. */
int bench_mem_shown(const struct bench_backend *b);

int bench_nmems(const struct bench_backend *b);

int bench_rounds(const struct bench_args *a);

/* The header's first two lines: what runs, and on what. */
void bench_print_title(const struct bench_backend *b, const struct bench_args *a);

void bench_print_header(const struct bench_backend *b, const struct bench_args *a);

/* nccl-tests' precision rule: fewer decimals as the time grows, so the column stays 7 wide. */
void bench_format_time(char *out, size_t len, double us);

const char *bench_row_type(const struct bench_args *a);

const char *bench_row_redop(const struct bench_args *a);

void bench_print_row(const struct bench_args *a, size_t bytes, size_t count, double us,
                     double algbw, double busbw, int64_t wrong);

void bench_print_compare_row(const struct bench_backend *b, const struct bench_args *a,
                             size_t bytes, size_t count, const double *sec, int64_t wrong);

/* --mem both: each kind's time and busbw, and the second's busbw over the first's. */
void bench_print_mems_row(const struct bench_args *a, size_t bytes, size_t count, const double *sec,
                          const double *busbw, int64_t wrong);

/* "64 MiB", "1.5 KiB", "8 B": sizes in progress lines, for people. */
void bench_human_size(char *out, size_t len, size_t bytes);

/* A JSON string literal; the names printed here are plain ASCII, but paths need not be. */
void bench_json_string(FILE *f, const char *s);

/* A CSV field, quoted when it holds a comma or a quote (MPI's transport is "tcp,self"). */
void bench_csv_field(FILE *f, const char *s);

#endif
