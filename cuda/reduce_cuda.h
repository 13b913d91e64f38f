/*
 * reduce_cuda.h -- the CUDA reduction kernels: out[i] = a[i] (op) b[i] on device memory.
 *
 * The device twin of collectives/reduce.h, with the same semantics and the same bits:
 * f16 and bf16 widened to f32 and rounded once to nearest even with the CPU's own integer
 * rounding, NaN-propagating float min/max that return a's value of two equal ones, wrapping
 * integer sum and prod, avg as sum then khor_cuda_avg_finish. The one difference is the
 * payload of a NaN made by arithmetic (sum, prod, avg): the GPU's is the canonical NaN,
 * x86's the first operand's, quietened; it is NaN either way (min and max copy theirs).
 * Bool is not reduced. Pointers must be aligned to the element size (cudaMalloc's and
 * torch's are); 16-byte alignment is not needed, only faster. Everything is asynchronous
 * on the given stream (a cudaStream_t passed as void *, NULL for the legacy default
 * stream); nothing synchronises the host.
 * Returns are cudaError_t values: 0 on success, cudaErrorInvalidValue (1) for an
 * unsupported dtype/op, or the launch's error.
 */
#ifndef KHOR_CUDA_REDUCE_CUDA_H
#define KHOR_CUDA_REDUCE_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out may be a or b (in place); partial overlap is not allowed. dtype is a khor_dtype, op a
 * khor_op. */
int khor_cuda_reduce(void *out, const void *a, const void *b, size_t count, int dtype, int op,
                     void *stream);
/* Divides count elements by n in place, as reduce_avg_finish does (n <= 1 does nothing). */
int khor_cuda_avg_finish(void *buf, size_t count, int dtype, int n, void *stream);
/*
 * buf[i] *= factor in place, as collectives/reduce.c's reduce_scale (the engine's pre- and
 * postscale): f32 multiplies by (float)factor, f64 by factor, f16 and bf16 widen, multiply
 * by (float)factor and round once to nearest even. Integers and bool, and a factor of 1,
 * do nothing.
 */
int khor_cuda_scale(void *buf, size_t count, int dtype, double factor, void *stream);
/* 1 where khor_cuda_reduce takes dtype and op (exactly where reduce_supported is true), else 0. */
int khor_cuda_reduce_supported(int dtype, int op);
/* Loads every kernel into the current context now (not at its first launch): 0 or the
 * first cudaError_t. */
int khor_cuda_preload(void);

#ifdef __cplusplus
}
#endif

#endif
