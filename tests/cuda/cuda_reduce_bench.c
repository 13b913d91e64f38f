/*
 * cuda_reduce_bench.c -- memory traffic of the f32 sum kernel against cudaMemcpy device
 * to device, for issue 18's target (kernel >= 0.8x memcpy at 64 MiB and above).
 *
 * Traffic is bytes read plus written per second: 3 x size for out = a + b, in place or not
 * (two reads, one write), 2 x size for a copy of size bytes. Each length is timed with CUDA events
 * over enough repetitions to take about 100 ms, after a warm-up. Prints one line per size and exits
 * 77 (a skip) where there is no GPU. Usage: cuda_reduce_bench [MiB ...] (default 64 256 1024).
 */
#include "cuda/reduce_cuda.h"
#include "khor.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                                \
	do {                                                                                       \
		cudaError_t e_ = (cudaError_t)(call);                                              \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
			        cudaGetErrorString(e_));                                           \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

enum what { SUM, SUM_INPLACE, MEMCPY };

static void once(enum what w, float *out, float *a, float *b, size_t n)
{
	if (w == MEMCPY)
		CHECK(cudaMemcpyAsync(out, a, n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
	else
		CHECK(khor_cuda_reduce(w == SUM ? out : a, a, b, n, KHOR_FLOAT32, KHOR_SUM, NULL));
}

/* Seconds per call. */
static double time_it(enum what w, float *out, float *a, float *b, size_t n)
{
	cudaEvent_t t0, t1;
	float ms = 0;
	int reps = 1;

	CHECK(cudaEventCreate(&t0));
	CHECK(cudaEventCreate(&t1));
	for (int i = 0; i < 3; i++)
		once(w, out, a, b, n);
	for (;;) {
		CHECK(cudaEventRecord(t0, 0));
		for (int i = 0; i < reps; i++)
			once(w, out, a, b, n);
		CHECK(cudaEventRecord(t1, 0));
		CHECK(cudaEventSynchronize(t1));
		CHECK(cudaEventElapsedTime(&ms, t0, t1));
		if (ms >= 100.0f || reps >= 1 << 16)
			break;
		reps = ms > 1.0f ? (int)(reps * 110.0f / ms) + 1 : reps * 16;
	}
	CHECK(cudaEventDestroy(t0));
	CHECK(cudaEventDestroy(t1));
	return ms / 1e3 / reps;
}

int main(int argc, char **argv)
{
	static const size_t dflt[] = {64, 256, 1024};
	size_t nsizes = argc > 1 ? (size_t)(argc - 1) : 3;
	int ndev = 0;
	struct cudaDeviceProp prop;

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "cuda_reduce_bench: no usable CUDA GPU here, skipped\n");
		return 77;
	}
	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("# %s; traffic = bytes read + written per second; GB = 1e9 B\n", prop.name);
	printf("# %10s %14s %14s %14s %10s %10s\n", "MiB", "sum GB/s", "sum-inpl GB/s",
	       "memcpy GB/s", "sum/copy", "inpl/copy");
	for (size_t s = 0; s < nsizes; s++) {
		size_t mib = argc > 1 ? strtoull(argv[s + 1], NULL, 10) : dflt[s];
		size_t bytes = mib << 20, n = bytes / sizeof(float);
		float *a, *b, *out;

		CHECK(cudaMalloc((void **)&a, bytes));
		CHECK(cudaMalloc((void **)&b, bytes));
		CHECK(cudaMalloc((void **)&out, bytes));
		CHECK(cudaMemset(a, 0, bytes));
		CHECK(cudaMemset(b, 0, bytes));
		double ts = time_it(SUM, out, a, b, n);
		double ti = time_it(SUM_INPLACE, out, a, b, n);
		double tc = time_it(MEMCPY, out, a, b, n);
		double gs = 3.0 * bytes / ts / 1e9, gi = 3.0 * bytes / ti / 1e9,
		       gc = 2.0 * bytes / tc / 1e9;

		printf("  %10zu %14.1f %14.1f %14.1f %10.3f %10.3f\n", mib, gs, gi, gc, gs / gc,
		       gi / gc);
		fflush(stdout);
		CHECK(cudaFree(a));
		CHECK(cudaFree(b));
		CHECK(cudaFree(out));
	}
	return 0;
}
