/*
 * reduce.h -- element-wise reduction kernels: dst[i] = a[i] (op) b[i].
 *
 * dst may alias a or b. Kernels are plain loops that the compiler vectorises, built once per
 * ISA (target_clones) and picked at load time, so the shipped library needs no -march.
 * Integer sum/prod wrap around (two's complement, computed unsigned so it is defined).
 */
#ifndef KHOR_REDUCE_H
#define KHOR_REDUCE_H

#include "khor.h"

#include <stdbool.h>
#include <stddef.h>

typedef void (*reduce_fn)(void *dst, const void *a, const void *b, size_t count);

/* The kernel for dtype and op (avg uses sum; finish with reduce_avg_finish). NULL if unsupported. */
reduce_fn reduce_kernel(khor_dtype dtype, khor_op op);
/* Divides count elements by n in place (true division for floats; ints truncate toward zero). */
void reduce_avg_finish(void *buf, size_t count, khor_dtype dtype, int n);
bool reduce_supported(khor_dtype dtype, khor_op op);

#endif
