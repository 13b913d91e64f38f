/*
 * cuda_reduce_bench.c -- memory traffic of the f32 sum kernel against cudaMemcpy device
 * to device, for issue 18's target (kernel >= 0.8x memcpy at 64 MiB and above).
 *
 * Traffic is bytes read plus written per second: 3 x size for out = a + b, in place or not
 * (two reads, one write), 2 x size for a copy of size bytes, so a kernel that moves bytes as
 * fast as the copy engine's kernel does scores 1.0 whatever it computes. Each length is timed
 * with CUDA events over enough repetitions to take about 100 ms, after a warm-up; the three
 * are timed one after the other at each length, so a clock change hits them alike. The
 * arrays are 3 x size of device memory (3 GiB at 1 GiB), far past the L2 from 64 MiB on.
 *
 * Prints one line per size, then one verdict line for the target, which
 * bench/gpu/device_check.sh copies into its summary:
 *   # target sum/copy >= 0.80 at >= 64 MiB: met (lowest 0.93 at 64 MiB, in place 0.92)
 * Exits 0 after a measurement (met or not: this is a benchmark, the verdict is the line),
 * 77 (a skip) where there is no GPU, 1 when a CUDA call fails, 2 for a bad argument.
 * Usage: cuda_reduce_bench [MiB ...] (default 64 128 256 512 1024).
 */
#include "cuda/reduce_cuda.h"
#include "khor.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define TARGET 0.8
#define TARGET_MIB 64

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
	/* A kernel that faulted leaves its error for the next call: catch it here, at its size. */
	CHECK(cudaGetLastError());
	CHECK(cudaDeviceSynchronize());
	CHECK(cudaEventDestroy(t0));
	CHECK(cudaEventDestroy(t1));
	return ms / 1e3 / reps;
}

/* Fills n floats with small integers, so that the sums are ordinary numbers, not zeros. */
static void fill(float *dev, size_t n, float *host, size_t chunk, float seed)
{
	for (size_t i = 0; i < chunk; i++)
		host[i] = seed + (float)(i % 1021);
	for (size_t done = 0; done < n; done += chunk) {
		size_t m = n - done < chunk ? n - done : chunk;
		CHECK(cudaMemcpy(dev + done, host, m * sizeof(float), cudaMemcpyHostToDevice));
	}
}

int main(int argc, char **argv)
{
	static const size_t dflt[] = {64, 128, 256, 512, 1024};
	size_t nsizes = argc > 1 ? (size_t)(argc - 1) : sizeof dflt / sizeof dflt[0];
	size_t sizes[64];
	int ndev = 0;
	struct cudaDeviceProp prop;
	cudaError_t e;

	if (nsizes > sizeof sizes / sizeof sizes[0]) {
		fprintf(stderr, "cuda_reduce_bench: at most %zu sizes\n",
		        sizeof sizes / sizeof sizes[0]);
		return 2;
	}
	for (size_t s = 0; s < nsizes; s++) {
		char *end;
		errno = 0;
		sizes[s] = argc > 1 ? strtoull(argv[s + 1], &end, 10) : dflt[s];
		if (argc > 1 && (errno || end == argv[s + 1] || *end || sizes[s] == 0 ||
		                 sizes[s] > ((size_t)1 << 20))) {
			fprintf(stderr, "cuda_reduce_bench: bad size '%s': it needs MiB, 1 to "
			                "1048576\nusage: cuda_reduce_bench [MiB ...] (default 64 128 "
			                "256 512 1024)\n", argv[s + 1]);
			return 2;
		}
	}
	if ((e = cudaGetDeviceCount(&ndev)) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "cuda_reduce_bench: no usable CUDA GPU here, skipped (%s)\n",
		        e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
		return 77;
	}
	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("# %s; f32 sum (out = a + b, and in place a += b) against cudaMemcpy device to "
	       "device\n# traffic = bytes read + written per second: 3 x size for a sum, 2 x size "
	       "for a copy; GB = 1e9 B\n", prop.name);
	printf("# %10s %14s %14s %14s %10s %10s\n", "MiB", "sum GB/s", "sum-inpl GB/s",
	       "memcpy GB/s", "sum/copy", "inpl/copy");
	fflush(stdout);

	double low = 0, low_inpl = 0;
	size_t low_mib = 0, counted = 0;
	size_t chunk = (size_t)4 << 20; /* floats per host staging chunk: 16 MiB */
	float *host = malloc(chunk * sizeof(float));
	if (!host) {
		fprintf(stderr, "cuda_reduce_bench: cannot allocate 16 MiB of host memory\n");
		return 1;
	}
	for (size_t s = 0; s < nsizes; s++) {
		size_t mib = sizes[s];
		size_t bytes = mib << 20, n = bytes / sizeof(float);
		float *a, *b, *out;

		CHECK(cudaMalloc((void **)&a, bytes));
		CHECK(cudaMalloc((void **)&b, bytes));
		CHECK(cudaMalloc((void **)&out, bytes));
		fill(a, n, host, chunk, 1.0f);
		fill(b, n, host, chunk, 2.0f);
		CHECK(cudaMemset(out, 0, bytes));
		double ts = time_it(SUM, out, a, b, n);
		double ti = time_it(SUM_INPLACE, out, a, b, n);
		double tc = time_it(MEMCPY, out, a, b, n);
		double gs = 3.0 * bytes / ts / 1e9, gi = 3.0 * bytes / ti / 1e9,
		       gc = 2.0 * bytes / tc / 1e9;

		printf("  %10zu %14.1f %14.1f %14.1f %10.3f %10.3f\n", mib, gs, gi, gc, gs / gc,
		       gi / gc);
		fflush(stdout);
		if (mib >= TARGET_MIB) {
			if (counted == 0 || gs / gc < low) {
				low = gs / gc;
				low_mib = mib;
			}
			if (counted == 0 || gi / gc < low_inpl)
				low_inpl = gi / gc;
			counted++;
		}
		CHECK(cudaFree(a));
		CHECK(cudaFree(b));
		CHECK(cudaFree(out));
	}
	free(host);
	if (counted == 0)
		printf("# target sum/copy >= %.2f at >= %d MiB: no size of %d MiB or more "
		       "measured\n", TARGET, TARGET_MIB, TARGET_MIB);
	else
		printf("# target sum/copy >= %.2f at >= %d MiB: %s (lowest %.3f at %zu MiB, in "
		       "place %.3f)\n", TARGET, TARGET_MIB,
		       low >= TARGET && low_inpl >= TARGET ? "met" : "MISSED", low, low_mib,
		       low_inpl);
	return 0;
}
