/*
 * test_cuda_reduce.c -- the CUDA reduction kernels against the CPU ones, bit for bit.
 *
 * Every dtype x op, counts that exercise the empty call, the scalar tail and the vector
 * loop (0, 1, 7, 1023, 2^20 + 3), and pointer layouts that exercise the peel (all three
 * equally misaligned), the scalar fallback (misaligned differently) and in-place calls.
 * Inputs are random bit patterns, so f16/bf16/f32/f64 include NaN, Inf, -0 and
 * subnormals. The reference is collectives/reduce.c; a NaN made by arithmetic may carry
 * another payload on the GPU (reduce_cuda.h), so there both NaN is what must agree.
 * Without a GPU (none here: CUDA but no driver) the device tests skip and say why; the
 * table test runs everywhere.
 */
#include "collectives/reduce.h"
#include "cuda/reduce_cuda.h"
#include "base/dtype.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/values.h"
#include "gpu_check.h"

#define NDTYPES 10
#define NOPS 5
#define AVG_N 3

#define NEED_GPU() GPU_NEED(gpu_cudart_usable, "no usable CUDA GPU here")

#define CUDA_OK(call)                                                                              \
	do {                                                                                       \
		cudaError_t e_ = (cudaError_t)(call);                                              \
		cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));            \
	} while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

enum layout { ALIGNED, PEEL, SKEWED, INPLACE_A, INPLACE_B, NLAYOUTS };
static const char *layout_name[] = {"aligned", "equally misaligned", "misaligned differently",
                                    "in place (out = a)", "in place (out = b)"};

/* One call on the GPU compared with the CPU; offsets are in elements. */
static void check_one(khor_dtype d, khor_op op, size_t count, enum layout lay)
{
	size_t es = kdtype_size(d), bytes = count * es, pad = 64;
	size_t oo = 0, oa = 0, ob = 0;
	unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
	unsigned char *want = malloc(bytes + 1), *got = malloc(bytes + 1);
	unsigned char *da, *db, *dout;

	cr_assert(a && b && want && got);
	if (lay == PEEL)
		oo = oa = ob = 1;
	else if (lay == SKEWED)
		oo = 3, oa = 1, ob = 2;
	else if (lay == INPLACE_A || lay == INPLACE_B)
		oa = ob = 5;
	values_fill_random(a, bytes, &rng_state);
	values_fill_random(b, bytes, &rng_state);
	reduce_kernel_portable(d, op)(want, a, b, count);
	if (op == KHOR_AVG)
		reduce_avg_finish(want, count, d, AVG_N);

	CUDA_OK(cudaMalloc((void **)&da, bytes + pad));
	CUDA_OK(cudaMalloc((void **)&db, bytes + pad));
	CUDA_OK(cudaMalloc((void **)&dout, bytes + pad));
	da += oa * es;
	db += ob * es;
	dout += oo * es;
	if (bytes) {
		CUDA_OK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
		CUDA_OK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
	}
	unsigned char *out = lay == INPLACE_A ? da : lay == INPLACE_B ? db : dout;

	CUDA_OK(khor_cuda_reduce(out, da, db, count, d, op, NULL));
	if (op == KHOR_AVG)
		CUDA_OK(khor_cuda_avg_finish(out, count, d, AVG_N, NULL));
	CUDA_OK(cudaDeviceSynchronize());
	if (bytes)
		CUDA_OK(cudaMemcpy(got, out, bytes, cudaMemcpyDeviceToHost));

	size_t bad = values_first_mismatch(got, want, count, d, values_arith(op));
	if (bad < count)
		cr_assert_fail("%s %s, count %zu, %s: element %zu: gpu 0x%llx, cpu 0x%llx (a "
		               "0x%llx, b 0x%llx)",
		               kdtype_name(d), kop_name(op), count, layout_name[lay], bad,
		               (unsigned long long)values_bits(got, d, bad),
		               (unsigned long long)values_bits(want, d, bad),
		               (unsigned long long)values_bits(a, d, bad),
		               (unsigned long long)values_bits(b, d, bad));
	CUDA_OK(cudaFree(da - oa * es));
	CUDA_OK(cudaFree(db - ob * es));
	CUDA_OK(cudaFree(dout - oo * es));
	free(a);
	free(b);
	free(want);
	free(got);
}

Test(cuda_reduce, supports_exactly_what_the_cpu_does)
{
	for (int d = 0; d < NDTYPES + 2; d++)
		for (int op = 0; op < NOPS + 2; op++)
			cr_expect_eq(khor_cuda_reduce_supported(d, op) != 0,
			             reduce_supported((khor_dtype)d, (khor_op)op), "dtype %d op %d",
			             d, op);
	cr_expect_eq(khor_cuda_reduce(NULL, NULL, NULL, 1, KHOR_BOOL, KHOR_SUM, NULL),
	             cudaErrorInvalidValue, "bool is not reduced");
	cr_expect_eq(khor_cuda_reduce(NULL, NULL, NULL, 1, KHOR_FLOAT32, 9, NULL),
	             cudaErrorInvalidValue, "an unknown op is refused before any launch");
}

Test(cuda_reduce, every_dtype_and_op_matches_the_cpu_bit_for_bit, .timeout = 600)
{
	static const size_t counts[] = {0, 1, 7, 1023, (1u << 20) + 3};

	NEED_GPU();
	for (int d = 0; d < NDTYPES; d++)
		for (int op = 0; op < NOPS; op++) {
			if (!reduce_supported((khor_dtype)d, (khor_op)op))
				continue;
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
				for (int lay = 0; lay < NLAYOUTS; lay++)
					check_one((khor_dtype)d, (khor_op)op, counts[c],
					          (enum layout)lay);
		}
}

/* Hand-picked f16/bf16 values around rounding ties, overflow and the subnormal edge. */
Test(cuda_reduce, half_rounding_edges_match_the_cpu, .timeout = 120)
{
	NEED_GPU();
	for (int d = KHOR_FLOAT16; d <= KHOR_BFLOAT16; d++) {
		/* every 16-bit pattern against a few partners: all inputs, exhaustively */
		size_t count = 65536 * 4;
		uint16_t *a = malloc(count * 2), *b = malloc(count * 2), *want = malloc(count * 2),
		         *got = malloc(count * 2);
		static const uint16_t partner16[] = {0x0001, 0x3c00, 0x8400, 0x7bff};
		static const uint16_t partnerbf[] = {0x0001, 0x3f80, 0x8080, 0x7f7f};
		void *da, *db;

		cr_assert(a && b && want && got);
		for (size_t i = 0; i < count; i++) {
			a[i] = (uint16_t)(i & 0xffff);
			b[i] = d == KHOR_FLOAT16 ? partner16[i >> 16] : partnerbf[i >> 16];
		}
		CUDA_OK(cudaMalloc(&da, count * 2));
		CUDA_OK(cudaMalloc(&db, count * 2));
		for (int op = 0; op < NOPS; op++) {
			reduce_kernel_portable((khor_dtype)d, (khor_op)op)(want, a, b, count);
			if (op == KHOR_AVG)
				reduce_avg_finish(want, count, (khor_dtype)d, 7);
			CUDA_OK(cudaMemcpy(da, a, count * 2, cudaMemcpyHostToDevice));
			CUDA_OK(cudaMemcpy(db, b, count * 2, cudaMemcpyHostToDevice));
			CUDA_OK(khor_cuda_reduce(da, da, db, count, d, op, NULL));
			if (op == KHOR_AVG)
				CUDA_OK(khor_cuda_avg_finish(da, count, d, 7, NULL));
			CUDA_OK(cudaMemcpy(got, da, count * 2, cudaMemcpyDeviceToHost));
			size_t bad = values_first_mismatch(got, want, count, (khor_dtype)d,
			                                   values_arith((khor_op)op));
			cr_expect_eq(
			    bad, count,
			    "%s %s: element %zu (a 0x%04x b 0x%04x): gpu 0x%04x cpu 0x%04x",
			    kdtype_name(d), kop_name(op), bad, bad < count ? a[bad] : 0,
			    bad < count ? b[bad] : 0, bad < count ? got[bad] : 0,
			    bad < count ? want[bad] : 0);
		}
		CUDA_OK(cudaFree(da));
		CUDA_OK(cudaFree(db));
		free(a);
		free(b);
		free(want);
		free(got);
	}
}
