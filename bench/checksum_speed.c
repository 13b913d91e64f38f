/*
 * checksum_speed.c -- kchecksum's speed (base/checksum.h, KHOR_CHECKSUM's sum) on one
 * buffer, summed over and over: a 512 KiB slice (KHOR_SLICE_BYTES, in L2) and 64 MiB (from
 * memory). A hand tool, not built by CMake:
 *
 *   gcc -O2 -I. -Iinclude bench/checksum_speed.c base/checksum.c -o /tmp/checksum_speed
 *   /tmp/checksum_speed
 */
#include "base/checksum.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(void)
{
	const size_t sizes[] = { 512u << 10, 64u << 20 };
	const int iters[] = { 2000, 20 };

	for (int k = 0; k < 2; k++) {
		unsigned char *b = malloc(sizes[k]);
		if (b == NULL)
			return 1;
		memset(b, 1, sizes[k]);
		volatile uint64_t sink = 0;
		double t0 = now();
		for (int i = 0; i < iters[k]; i++)
			sink += kchecksum(b, sizes[k]);
		double dt = now() - t0;
		printf("%zu bytes: %.2f GB/s\n", sizes[k], (double)sizes[k] * iters[k] / dt / 1e9);
		free(b);
	}
	return 0;
}
