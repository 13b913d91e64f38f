/*
 * bench_data.c -- the benchmark's dtypes and ops (names, sizes, half and bfloat16 by hand) and the
 * data patterns: small integers that every dtype holds exactly, so a reduction's result is known in
 * any order and the same in khor-bench, mpi-bench and the gloo peer.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_data.h"

#include <string.h>

const struct bench_dtype_info bench_dtypes[BENCH_NDTYPES] = {
	[BENCH_F32] = {"float", 4, 16777216.0, -12345.0},
	[BENCH_F64] = {"double", 8, 9007199254740992.0, -12345.0},
	[BENCH_I32] = {"int32", 4, 2147483647.0, -12345.0},
	[BENCH_I64] = {"int64", 8, 9007199254740992.0, -12345.0},
	[BENCH_F16] = {"half", 2, 2048.0, -12345.0},
	[BENCH_BF16] = {"bfloat16", 2, 256.0, -12345.0},
	[BENCH_I8] = {"int8", 1, 127.0, -128.0},
	[BENCH_U8] = {"uint8", 1, 254.0, 255.0},       /* 255 is kept for the sentinel */
	[BENCH_I16] = {"int16", 2, 32767.0, -12345.0}, /* not in nccl-tests, named like int8 */
};

/* ---- dtypes and ops ----------------------------------------------------------------------- */

size_t bench_dtype_size(enum bench_dtype d)
{
	return bench_dtypes[d].size;
}

const char *bench_dtype_name(enum bench_dtype d)
{
	return bench_dtypes[d].name;
}

const char *bench_op_name(enum bench_op op)
{
	static const char *const names[] = {"sum", "avg", "min", "max", "prod"};
	return names[op];
}

static int bench_is_float(enum bench_dtype d)
{
	return d == BENCH_F32 || d == BENCH_F64 || d == BENCH_F16 || d == BENCH_BF16;
}

int bench_parse_dtype(const char *s, enum bench_dtype *out)
{
	static const struct {
		const char *name;
		enum bench_dtype d;
	} map[] = {
	    {"float", BENCH_F32},     {"float32", BENCH_F32}, {"f32", BENCH_F32},
	    {"double", BENCH_F64},    {"float64", BENCH_F64}, {"f64", BENCH_F64},
	    {"int32", BENCH_I32},     {"i32", BENCH_I32},     {"int", BENCH_I32},
	    {"int64", BENCH_I64},     {"i64", BENCH_I64},     {"half", BENCH_F16},
	    {"float16", BENCH_F16},   {"fp16", BENCH_F16},    {"f16", BENCH_F16},
	    {"bfloat16", BENCH_BF16}, {"bf16", BENCH_BF16},   {"int8", BENCH_I8},
	    {"i8", BENCH_I8},         {"char", BENCH_I8},     {"uint8", BENCH_U8},
	    {"u8", BENCH_U8},         {"int16", BENCH_I16},   {"i16", BENCH_I16},
	    {"short", BENCH_I16},
	};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
		if (strcmp(s, map[i].name) == 0) {
			*out = map[i].d;
			return 0;
		}
	}
	return -1;
}

int bench_parse_op(const char *s, enum bench_op *out)
{
	for (int op = BENCH_SUM; op <= BENCH_PROD; op++) {
		if (strcmp(s, bench_op_name((enum bench_op)op)) == 0) {
			*out = (enum bench_op)op;
			return 0;
		}
	}
	return -1;
}

uint16_t bench_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
	if (exp == 0xff)
		return sign | 0x7c00u | (man ? 0x200u : 0);
	int e = (int)exp - 127 + 15;
	if (e >= 31)
		return sign | 0x7c00u;
	if (e <= 0) { /* a half subnormal: value = h x 2^-24 */
		if (e < -10)
			return sign;
		man |= 0x800000u;
		unsigned shift = (unsigned)(14 - e);
		uint32_t h = man >> shift, rem = man & ((1u << shift) - 1),
		         half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++; /* a carry into the exponent is the right rounding, up to infinity */
	return (uint16_t)(sign | h);
}

float bench_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
	uint32_t x;
	if (exp == 0) {
		float v = (float)man * 5.9604644775390625e-8f; /* 2^-24 */
		return sign ? -v : v;
	}
	if (exp == 31)
		x = sign | 0x7f800000u | (man << 13);
	else
		x = sign | ((exp - 15 + 127) << 23) | (man << 13);
	float f;
	memcpy(&f, &x, sizeof f);
	return f;
}

uint16_t bench_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof x);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* a quiet NaN stays a NaN */
	x += 0x7fffu + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

float bench_bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;
	memcpy(&f, &x, sizeof f);
	return f;
}

void bench_set(void *buf, enum bench_dtype d, size_t i, double v)
{
	switch (d) {
	case BENCH_F32:
		((float *)buf)[i] = (float)v;
		break;
	case BENCH_F64:
		((double *)buf)[i] = v;
		break;
	case BENCH_I32:
		((int32_t *)buf)[i] = (int32_t)v;
		break;
	case BENCH_I64:
		((int64_t *)buf)[i] = (int64_t)v;
		break;
	case BENCH_F16:
		((uint16_t *)buf)[i] = bench_f32_to_f16((float)v);
		break;
	case BENCH_BF16:
		((uint16_t *)buf)[i] = bench_f32_to_bf16((float)v);
		break;
	case BENCH_I8:
		((int8_t *)buf)[i] = (int8_t)v;
		break;
	case BENCH_U8:
		((uint8_t *)buf)[i] = (uint8_t)v;
		break;
	case BENCH_I16:
		((int16_t *)buf)[i] = (int16_t)v;
		break;
	}
}

double bench_get(const void *buf, enum bench_dtype d, size_t i)
{
	switch (d) {
	case BENCH_F32:
		return ((const float *)buf)[i];
	case BENCH_F64:
		return ((const double *)buf)[i];
	case BENCH_I32:
		return ((const int32_t *)buf)[i];
	case BENCH_I64:
		return (double)((const int64_t *)buf)[i];
	case BENCH_F16:
		return bench_f16_to_f32(((const uint16_t *)buf)[i]);
	case BENCH_BF16:
		return bench_bf16_to_f32(((const uint16_t *)buf)[i]);
	case BENCH_I8:
		return ((const int8_t *)buf)[i];
	case BENCH_U8:
		return ((const uint8_t *)buf)[i];
	case BENCH_I16:
		return ((const int16_t *)buf)[i];
	}
	return 0;
}

/* ---- data patterns ------------------------------------------------------------------------ */

/*
 * Every input, partial result and final result is a small integer within the dtype's exact
 * range (bench_dtypes[].limit), so a reduction is exact in any order and in any dtype, int8
 * and bfloat16 included. The period P of the index term shrinks with the dtype and the rank
 * count to keep the largest result within that range (1021 in float for n=4, 31 in int8):
 *
 *   sum, avg  rank r, index i: (i + r) % P + 1     never 0, so a missing rank always shows
 *   min, max  i % P + (i + r) % n
 *   prod      mostly 1; rank i%n gives i%7+2 and, when signed and n > 1, rank (i+1)%n -1
 *   moves     source s, index i: (i + 7s) % P     broadcast, allgather, alltoall, gather...
 */
#define BENCH_PERIOD 1021

size_t bench_period(enum bench_op op, enum bench_dtype d, int n)
{
	double limit = bench_dtypes[d].limit, p;
	if (op == BENCH_MIN || op == BENCH_MAX)
		p = limit - n + 2;
	else
		p = limit / n; /* the sum is at most n x P */
	return p < 1 ? 1 : p > BENCH_PERIOD ? BENCH_PERIOD : (size_t)p;
}

double bench_pattern(enum bench_op op, enum bench_dtype d, int rank, int n, size_t i)
{
	size_t p = bench_period(op, d, n);
	switch (op) {
	case BENCH_SUM:
	case BENCH_AVG:
		return (double)((i + (size_t)rank) % p + 1);
	case BENCH_MIN:
	case BENCH_MAX:
		return (double)(i % p + (i + (size_t)rank) % (size_t)n);
	case BENCH_PROD:
		if ((size_t)rank == i % (size_t)n)
			return (double)(i % 7 + 2);
		if (d != BENCH_U8 && n > 1 && (size_t)rank == (i + 1) % (size_t)n)
			return -1;
		return 1;
	}
	return 0;
}

/* sum over j < m of (k + j) % p, for k < p and m <= p, without a loop. */
static double bench_wrapped_sum(size_t k, size_t m, size_t p)
{
	if (k + m <= p)
		return (double)m * k + (double)m * (m - 1) / 2;
	size_t head = p - k, tail = m - head; /* k..p-1, then 0..tail-1 */
	return (double)head * (k + p - 1) / 2 + (double)tail * (tail - 1) / 2;
}

double bench_expected(enum bench_op op, enum bench_dtype d, int n, size_t i)
{
	size_t p = bench_period(op, d, n), k = i % p, q = (size_t)n / p, m = (size_t)n % p;
	double sum = n + (double)q * p * (p - 1) / 2 + bench_wrapped_sum(k, m, p);
	switch (op) {
	case BENCH_SUM:
		return sum;
	case BENCH_AVG:
		/* khor.h: integer avg is the sum divided by n, truncated toward zero. */
		if (!bench_is_float(d))
			return (double)((int64_t)sum / n);
		return sum / n;
	case BENCH_MIN:
		return (double)k;
	case BENCH_MAX:
		return (double)k + n - 1;
	case BENCH_PROD:
		return d != BENCH_U8 && n > 1 ? -(double)(i % 7 + 2) : (double)(i % 7 + 2);
	}
	return 0;
}

double bench_value(enum bench_dtype d, size_t s, size_t i)
{
	double limit = bench_dtypes[d].limit;
	size_t p = limit + 1 < BENCH_PERIOD ? (size_t)limit + 1 : BENCH_PERIOD;
	return (double)((i + 7 * s) % p);
}

int bench_mismatch(enum bench_op op, enum bench_dtype d, double got, double want)
{
	/* Written without libm so that neither program needs -lm. */
	if (op == BENCH_AVG && bench_is_float(d)) {
		double rel = d == BENCH_F32   ? 1e-6
		             : d == BENCH_F64 ? 1e-14
		             : d == BENCH_F16 ? 1.0 / 1024
		                              : 1.0 / 128;
		double mag = want < 0 ? -want : want, diff = got - want;
		double tol = rel * (mag > 1.0 ? mag : 1.0);
		return !(diff <= tol && -diff <= tol); /* a NaN is a mismatch too */
	}
	return got != want;
}

void bench_fill_sentinel(void *buf, enum bench_dtype d, size_t count)
{
	for (size_t i = 0; i < count; i++)
		bench_set(buf, d, i, bench_dtypes[d].sentinel);
}

size_t bench_rs_offset(size_t count, int n, int r)
{
	size_t base = count / (size_t)n, extra = count % (size_t)n, rr = (size_t)r;
	return rr * base + (rr < extra ? rr : extra);
}

size_t bench_rs_count(size_t count, int n, int r)
{
	return count / (size_t)n + ((size_t)r < count % (size_t)n ? 1 : 0);
}
