/*
 * reduce.h -- element-wise reduction kernels: dst[i] = a[i] (op) b[i].
 *
 * Every collective that reduces calls these on each chunk it receives, so they run near
 * memory bandwidth: plain loops that the compiler vectorises, built once per ISA
 * (target_clones) and picked at load time, so the shipped library needs no -march.
 *
 * Semantics, the same on every CPU so that every rank computes the same bits:
 * - dst may be a or b (in place); partial overlap is not allowed.
 * - f16 and bf16 are widened to f32, reduced, and rounded once to nearest even per call
 *   (NaN stays NaN, with its payload's top bits kept and the quiet bit set; Inf, -0 and
 *   subnormals are exact). Since f32 carries more than 2p+2 bits, this equals the correctly
 *   rounded result of the exact operation for sum, prod and avg's division.
 * - min and max of floats propagate NaN (as torch.minimum does); of two equal values
 *   (-0 and +0) they return a's.
 * - Integer sum and prod wrap around (two's complement, computed unsigned so it is defined).
 * - avg is sum followed by reduce_avg_finish: floats divide exactly rounded; integers
 *   truncate toward zero (C division) after the wrapping sum, so a sum that overflowed
 *   averages to garbage: int8/uint8/int16 avg is only meaningful while the sum fits.
 */
#ifndef KHOR_REDUCE_H
#define KHOR_REDUCE_H

#include "khor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef void (*reduce_fn)(void *dst, const void *a, const void *b, size_t count);

/* The kernel for dtype and op (avg uses sum; finish with reduce_avg_finish). NULL if unsupported. */
reduce_fn reduce_kernel(khor_dtype dtype, khor_op op);
/* Divides count elements by n (>= 1; n == 1 does nothing) in place, as described above. */
void reduce_avg_finish(void *buf, size_t count, khor_dtype dtype, int n);
bool reduce_supported(khor_dtype dtype, khor_op op);
/*
 * buf[i] *= factor for the floating dtypes, in place (the engine's pre- and postscale):
 * f32 multiplies by (float)factor, f64 by factor, f16 and bf16 widen to f32, multiply by
 * (float)factor and round once to nearest even. Integers and bool: nothing. The device
 * backends' scale gives the same bits.
 */
void reduce_scale(void *buf, size_t count, khor_dtype dtype, double factor);

/*
 * The same kernel without hand-written SIMD paths (only compiler-vectorised loops), which
 * every CPU runs. It gives the same bits as reduce_kernel (NaN payloads aside); tests use
 * it to check both paths on a machine that has the faster one.
 */
reduce_fn reduce_kernel_portable(khor_dtype dtype, khor_op op);

/* Which code the kernels run on this CPU, for benchmark headers: "avx2 clones, f16: ...". */
void reduce_isa(char *out, size_t len);

/* Scalar conversions with exactly the kernels' rounding, for tests and data preparation. */
float reduce_f16_to_f32(uint16_t h);
uint16_t reduce_f32_to_f16(float f);
float reduce_bf16_to_f32(uint16_t h);
uint16_t reduce_f32_to_bf16(float f);

#endif
