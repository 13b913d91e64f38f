/*
 * values.h -- what the tests that fill and check buffers of every dtype share: one element
 * to or from a double, the tests' two random generators, random bit patterns, and a
 * comparison of two buffers element by element that may let NaN match NaN.
 *
 * Header only, without Criterion: tsan_mem builds test_mem.c without it and links only
 * khor_collectives. (test_collectives.c, test_allreduce.c, test_engine.c and test_reduce.c
 * still keep copies of their own of put, get and the xorshift64* step.)
 */
#ifndef KHOR_TESTS_VALUES_H
#define KHOR_TESTS_VALUES_H

#include "base/dtype.h"
#include "collectives/reduce.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Element i of buf := v in dtype dt: integers wrap (as two's complement), halves round. */
static inline void values_put(void *buf, khor_dtype dt, size_t i, double v)
{
	int64_t iv = (int64_t)v;
	uint64_t u = (uint64_t)iv;

	switch (dt) {
	case KHOR_FLOAT32:
		((float *)buf)[i] = (float)v;
		break;
	case KHOR_FLOAT64:
		((double *)buf)[i] = v;
		break;
	case KHOR_INT32:
		((uint32_t *)buf)[i] = (uint32_t)u;
		break;
	case KHOR_INT64:
		((uint64_t *)buf)[i] = u;
		break;
	case KHOR_FLOAT16:
		((uint16_t *)buf)[i] = reduce_f32_to_f16((float)v);
		break;
	case KHOR_BFLOAT16:
		((uint16_t *)buf)[i] = reduce_f32_to_bf16((float)v);
		break;
	case KHOR_INT16:
		((uint16_t *)buf)[i] = (uint16_t)u;
		break;
	case KHOR_INT8:
	case KHOR_UINT8:
	case KHOR_BOOL:
		((uint8_t *)buf)[i] = (uint8_t)u;
		break;
	}
}

/* Element i of buf as a double (NaN for an unknown dtype). */
static inline double values_get(const void *buf, khor_dtype dt, size_t i)
{
	switch (dt) {
	case KHOR_FLOAT32:
		return ((const float *)buf)[i];
	case KHOR_FLOAT64:
		return ((const double *)buf)[i];
	case KHOR_INT32:
		return ((const int32_t *)buf)[i];
	case KHOR_INT64:
		return (double)((const int64_t *)buf)[i];
	case KHOR_FLOAT16:
		return reduce_f16_to_f32(((const uint16_t *)buf)[i]);
	case KHOR_BFLOAT16:
		return reduce_bf16_to_f32(((const uint16_t *)buf)[i]);
	case KHOR_INT8:
		return ((const int8_t *)buf)[i];
	case KHOR_UINT8:
		return ((const uint8_t *)buf)[i];
	case KHOR_BOOL:
		return ((const uint8_t *)buf)[i];
	case KHOR_INT16:
		return ((const int16_t *)buf)[i];
	}
	return NAN;
}

/* The bits of element i of buf (its size in dtype dt), for a failure's message. */
static inline uint64_t values_bits(const void *buf, khor_dtype dt, size_t i)
{
	size_t es = kdtype_size(dt);
	uint64_t b = 0;

	memcpy(&b, (const unsigned char *)buf + i * es, es);
	return b;
}

/*
 * Two generators, because each test keeps the sequence it was written and checked
 * against: xorshift64* (test_mem.c, test_device.c's random floats, as test_reduce.c) and
 * the plain xorshift step (test_device.c's counts, the CUDA tests' random bits).
 */
static inline uint64_t values_xorshift64s(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static inline uint64_t values_xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* bytes of random bits (xorshift from *s): every float dtype meets NaN, Inf, -0, subnormals. */
static inline void values_fill_random(unsigned char *p, size_t bytes, uint64_t *s)
{
	for (size_t i = 0; i < bytes; i += 8) {
		uint64_t r = values_xorshift(s);
		memcpy(p + i, &r, bytes - i < 8 ? bytes - i : 8);
	}
}

static inline bool values_is_nan(const void *p, khor_dtype dt)
{
	uint16_t h;
	float f;
	double x;

	switch (dt) {
	case KHOR_FLOAT32:
		memcpy(&f, p, 4);
		return isnan(f);
	case KHOR_FLOAT64:
		memcpy(&x, p, 8);
		return isnan(x);
	case KHOR_FLOAT16:
		memcpy(&h, p, 2);
		return (h & 0x7fff) > 0x7c00;
	case KHOR_BFLOAT16:
		memcpy(&h, p, 2);
		return (h & 0x7fff) > 0x7f80;
	default:
		return false;
	}
}

/* Whether op's result is made by arithmetic, so that a NaN in it may carry any payload. */
static inline bool values_arith(khor_op op)
{
	return op == KHOR_SUM || op == KHOR_AVG || op == KHOR_PROD;
}

/*
 * The first of count elements of dtype dt where got and want differ in any bit, or count
 * when none does. nan_any: a NaN matches any NaN (a GPU's arithmetic may give another
 * payload than the CPU's, reduce_cuda.h).
 */
static inline size_t values_first_mismatch(const void *got, const void *want, size_t count,
                                           khor_dtype dt, bool nan_any)
{
	size_t es = kdtype_size(dt);

	for (size_t i = 0; i < count; i++) {
		const unsigned char *g = (const unsigned char *)got + i * es;
		const unsigned char *w = (const unsigned char *)want + i * es;
		if (memcmp(g, w, es) == 0)
			continue;
		if (nan_any && values_is_nan(g, dt) && values_is_nan(w, dt))
			continue;
		return i;
	}
	return count;
}

#endif
