/*
 * bench_data.h -- the benchmark's dtypes and ops, and the data patterns every peer writes and
 * checks.
 */
#ifndef KHOR_BENCH_BENCH_DATA_H
#define KHOR_BENCH_BENCH_DATA_H

#include "bench.h"

#include <stdint.h>

/* What the benchmark knows of each dtype. */
struct bench_dtype_info {
	const char *name; /* nccl-tests' name, printed in the type column */
	size_t size;
	double limit;    /* every integer 0..limit is exact in it; patterns stay within */
	double sentinel; /* written over outputs; never a right answer */
};
extern const struct bench_dtype_info bench_dtypes[BENCH_NDTYPES];

size_t bench_dtype_size(enum bench_dtype d);

const char *bench_dtype_name(enum bench_dtype d);

const char *bench_op_name(enum bench_op op);

int bench_parse_dtype(const char *s, enum bench_dtype *out);

int bench_parse_op(const char *s, enum bench_op *out);

/*
 * IEEE half and bfloat16 by hand, rounding to nearest even: C11 has neither type, and a
 * peer (mpi-bench) needs the same conversions for its own reduction of them.
 */
uint16_t bench_f32_to_f16(float f);

float bench_f16_to_f32(uint16_t h);

uint16_t bench_f32_to_bf16(float f);

float bench_bf16_to_f32(uint16_t h);

/* All pattern values are small integers, so they convert to and from double exactly. */
void bench_set(void *buf, enum bench_dtype d, size_t i, double v);

double bench_get(const void *buf, enum bench_dtype d, size_t i);

size_t bench_period(enum bench_op op, enum bench_dtype d, int n);

double bench_pattern(enum bench_op op, enum bench_dtype d, int rank, int n, size_t i);

/* The exact reduced value of bench_pattern over n ranks at index i. */
double bench_expected(enum bench_op op, enum bench_dtype d, int n, size_t i);

/* What a moving collective carries: element i of the block that source s owns. */
double bench_value(enum bench_dtype d, size_t s, size_t i);

/*
 * Exact comparison, except avg in floating point: sum/n need not be representable, a library
 * may multiply by 1/n instead of dividing and a half result is rounded once more, so a few
 * ulps of difference are right.
 */
int bench_mismatch(enum bench_op op, enum bench_dtype d, double got, double want);

void bench_fill_sentinel(void *buf, enum bench_dtype d, size_t count);

/* Where rank r's block of a count-element reduce-scatter starts (khor.h's uneven split). */
size_t bench_rs_offset(size_t count, int n, int r);

size_t bench_rs_count(size_t count, int n, int r);

#endif
