/*
 * reduce.c -- the CPU reduction kernels (see reduce.h).
 *
 * One macro writes each (type, op) loop so that every kernel has the same shape and the
 * vectoriser sees a simple restrict-free loop it can still vectorise (dst may alias an
 * input, which is fine for an element-wise loop with no carried dependency). Each kernel is
 * cloned for AVX-512, AVX2 and the x86-64 baseline; the dynamic loader picks one by CPU.
 */
#include "reduce.h"

#include <stdint.h>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define KERNEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL_CLONES
#endif

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y) ((y) < (x) ? (y) : (x))
#define OP_MAX(x, y) ((y) > (x) ? (y) : (x))

#define DEFINE_KERNEL(name, T, OP)                                                 \
	KERNEL_CLONES static void name(void *dst, const void *a, const void *b,    \
	                               size_t count)                                \
	{                                                                          \
		T *d = dst;                                                        \
		const T *x = a, *y = b;                                            \
		for (size_t i = 0; i < count; i++)                                 \
			d[i] = OP(x[i], y[i]);                                     \
	}

/* Integer sum and product wrap: do them on the unsigned twin so overflow is defined. */
#define DEFINE_TYPE(sfx, T, UT)                                \
	DEFINE_KERNEL(sum_##sfx, UT, OP_SUM)                   \
	DEFINE_KERNEL(prod_##sfx, UT, OP_PROD)                 \
	DEFINE_KERNEL(min_##sfx, T, OP_MIN)                    \
	DEFINE_KERNEL(max_##sfx, T, OP_MAX)

DEFINE_TYPE(f32, float, float)
DEFINE_TYPE(f64, double, double)
DEFINE_TYPE(i32, int32_t, uint32_t)
DEFINE_TYPE(i64, int64_t, uint64_t)

#define ROW(sfx) { sum_##sfx, sum_##sfx, min_##sfx, max_##sfx, prod_##sfx }

/* Indexed by khor_dtype then khor_op (sum, avg, min, max, prod). */
static const reduce_fn kernels[][5] = {
	[KHOR_FLOAT32] = ROW(f32),
	[KHOR_FLOAT64] = ROW(f64),
	[KHOR_INT32] = ROW(i32),
	[KHOR_INT64] = ROW(i64),
};

reduce_fn reduce_kernel(khor_dtype dtype, khor_op op)
{
	if ((unsigned)dtype >= sizeof(kernels) / sizeof(kernels[0]) || (unsigned)op > KHOR_PROD)
		return NULL;
	return kernels[dtype][op];
}

bool reduce_supported(khor_dtype dtype, khor_op op)
{
	return reduce_kernel(dtype, op) != NULL;
}

void reduce_avg_finish(void *buf, size_t count, khor_dtype dtype, int n)
{
	switch (dtype) {
	case KHOR_FLOAT32: {
		float *p = buf;
		for (size_t i = 0; i < count; i++)
			p[i] /= (float)n;
		break;
	}
	case KHOR_FLOAT64: {
		double *p = buf;
		for (size_t i = 0; i < count; i++)
			p[i] /= (double)n;
		break;
	}
	case KHOR_INT32: {
		int32_t *p = buf;
		for (size_t i = 0; i < count; i++)
			p[i] /= n;
		break;
	}
	case KHOR_INT64: {
		int64_t *p = buf;
		for (size_t i = 0; i < count; i++)
			p[i] /= n;
		break;
	}
	default:
		break;
	}
}
