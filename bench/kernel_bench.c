/*
 * kernel_bench.c -- how close the CPU reduction kernels run to memory bandwidth.
 *
 * DESIGN.md promises kernels "near memory bandwidth"; this program is how we check it on a
 * given machine. In one run it times memcpy and, for each dtype, the in-place kernel
 * a = a (op) b (what a ring step does with a received chunk) over a sweep of sizes, keeps the
 * best of several repetitions, and prints bytes/s and the ratio kernel/memcpy.
 *
 * bytes/s counts the bytes of ONE operand, count x sizeof(dtype), per call, as nccl-tests'
 * algbw counts one buffer; memcpy's bytes/s counts the bytes copied. So a kernel call moves
 * three buffers (reads a and b, writes a) where memcpy moves two: a ratio of 0.67 means the
 * kernel already streams as many bytes per second as memcpy does; 1.0 means it beats it.
 * Small sizes live in cache, where the ratio measures arithmetic, not memory.
 *
 * It links only khor_collectives, so it measures the kernels and nothing else.
 */
#define _POSIX_C_SOURCE 200809L

#include "collectives/reduce.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dtype_info {
	khor_dtype dtype;
	const char *name;
	size_t size;
};

/* nccl-tests' dtype names. */
static const struct dtype_info dtypes[] = {
	{ KHOR_FLOAT32, "float", 4 },   { KHOR_FLOAT64, "double", 8 }, { KHOR_FLOAT16, "half", 2 },
	{ KHOR_BFLOAT16, "bfloat16", 2 }, { KHOR_INT8, "int8", 1 },    { KHOR_UINT8, "uint8", 1 },
	{ KHOR_INT32, "int32", 4 },     { KHOR_INT64, "int64", 8 },  { KHOR_INT16, "int16", 2 },
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static const char *const op_names[] = { "sum", "avg", "min", "max", "prod" };

/* Each repetition runs the call enough times to move at least this many operand bytes. */
#define REP_BYTES (32u << 20)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "4K", "64M", "1G" or plain bytes, as nccl-tests reads -b and -e. */
static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s)
		return -1;
	switch (*end) {
	case 'G': case 'g': v <<= 30; end++; break;
	case 'M': case 'm': v <<= 20; end++; break;
	case 'K': case 'k': v <<= 10; end++; break;
	default: break;
	}
	if (*end != '\0' || v == 0)
		return -1;
	*out = (size_t)v;
	return 0;
}

/* One (1.0) in a and zero in b, so repeated a += b keeps a stable and free of subnormals. */
static void fill(khor_dtype dtype, void *a, void *b, size_t bytes)
{
	size_t i;

	memset(b, 0, bytes);
	switch (dtype) {
	case KHOR_FLOAT32: for (i = 0; i < bytes / 4; i++) ((float *)a)[i] = 1.0f; break;
	case KHOR_FLOAT64: for (i = 0; i < bytes / 8; i++) ((double *)a)[i] = 1.0; break;
	case KHOR_FLOAT16: for (i = 0; i < bytes / 2; i++) ((uint16_t *)a)[i] = 0x3c00; break;
	case KHOR_BFLOAT16: for (i = 0; i < bytes / 2; i++) ((uint16_t *)a)[i] = 0x3f80; break;
	case KHOR_INT8: case KHOR_UINT8: memset(a, 1, bytes); break;
	case KHOR_INT32: for (i = 0; i < bytes / 4; i++) ((int32_t *)a)[i] = 1; break;
	case KHOR_INT64: for (i = 0; i < bytes / 8; i++) ((int64_t *)a)[i] = 1; break;
	case KHOR_INT16: for (i = 0; i < bytes / 2; i++) ((int16_t *)a)[i] = 1; break;
	default: memset(a, 0, bytes); break;
	}
}

/* Best (shortest) seconds per call over reps repetitions; fn == NULL times memcpy(a, b). */
static double time_best(reduce_fn fn, void *a, void *b, size_t bytes, size_t count, int reps)
{
	size_t iters = REP_BYTES / bytes > 0 ? REP_BYTES / bytes : 1;
	double best = 1e30;

	if (fn != NULL)
		fn(a, a, b, count); /* warm caches and TLB */
	else
		memcpy(a, b, bytes);
	for (int r = 0; r < reps; r++) {
		double t0 = now_s();
		for (size_t k = 0; k < iters; k++) {
			if (fn != NULL)
				fn(a, a, b, count);
			else
				memcpy(a, b, bytes);
		}
		double t = (now_s() - t0) / (double)iters;
		if (t < best)
			best = t;
	}
	return best;
}

static void cpu_model(char *out, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];

	snprintf(out, len, "unknown CPU");
	if (f == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		char *colon = strchr(line, ':');
		if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
			snprintf(out, len, "%s", colon + 2);
			out[strcspn(out, "\n")] = '\0';
			break;
		}
	}
	fclose(f);
}

static void usage(const char *prog)
{
	fprintf(stderr,
	        "usage: %s [-b minbytes] [-e maxbytes] [-f factor] [-d dtype|all] [-o op] [-r reps] [-p]\n"
	        "  sizes are bytes of one operand (K, M, G suffixes); defaults -b 4K -e 64M -f 2\n"
	        "  -d float, double, half, bfloat16, int8, uint8, int32, int64, int16 or all (default)\n"
	        "  -o sum (default), min, max or prod;  -r repetitions, best kept (default 5)\n"
	        "  -p time the portable kernels instead of the ones dispatched for this CPU\n",
	        prog);
}

int main(int argc, char **argv)
{
	size_t minbytes = 4 << 10, maxbytes = 64 << 20, factor = 2;
	int reps = 5, portable = 0, op = KHOR_SUM, opt;
	const struct dtype_info *sel[NDTYPES];
	size_t nsel = 0;
	const char *dname = "all";

	while ((opt = getopt(argc, argv, "b:e:f:d:o:r:ph")) != -1) {
		switch (opt) {
		case 'b': if (parse_size(optarg, &minbytes) != 0) goto bad_arg; break;
		case 'e': if (parse_size(optarg, &maxbytes) != 0) goto bad_arg; break;
		case 'f': if (parse_size(optarg, &factor) != 0 || factor < 2) goto bad_arg; break;
		case 'd': dname = optarg; break;
		case 'o':
			for (op = 0; op <= KHOR_PROD; op++)
				if (op != KHOR_AVG && strcmp(optarg, op_names[op]) == 0)
					break;
			if (op > KHOR_PROD)
				goto bad_arg;
			break;
		case 'r': reps = atoi(optarg); if (reps < 1) goto bad_arg; break;
		case 'p': portable = 1; break;
		default: usage(argv[0]); return opt == 'h' ? 0 : 2;
		}
	}
	if (optind != argc || minbytes > maxbytes)
		goto bad_arg;
	for (size_t i = 0; i < NDTYPES; i++)
		if (strcmp(dname, "all") == 0 || strcmp(dname, dtypes[i].name) == 0)
			sel[nsel++] = &dtypes[i];
	if (nsel == 0)
		goto bad_arg;

	void *a = NULL, *b = NULL;
	if (posix_memalign(&a, 64, maxbytes) != 0 || posix_memalign(&b, 64, maxbytes) != 0) {
		fprintf(stderr, "kernel-bench: cannot allocate 2 x %zu bytes\n", maxbytes);
		free(a);
		return 1;
	}
	memset(a, 0, maxbytes);
	memset(b, 0, maxbytes);

	size_t nsizes = 0;
	for (size_t s = minbytes; s <= maxbytes; s *= factor) {
		nsizes++;
		if (s > maxbytes / factor)
			break;
	}
	double *gbps = calloc(nsizes * (nsel + 1), sizeof(double));
	if (gbps == NULL) {
		fprintf(stderr, "kernel-bench: out of memory\n");
		free(a);
		free(b);
		return 1;
	}

	/* Column 0 is memcpy; then one column per dtype. Sizes are the outer loop per column so
	 * that each column sees the same cache state on its way up. */
	for (size_t c = 0; c <= nsel; c++) {
		reduce_fn fn = NULL;
		if (c > 0) {
			fn = portable ? reduce_kernel_portable(sel[c - 1]->dtype, (khor_op)op)
			              : reduce_kernel(sel[c - 1]->dtype, (khor_op)op);
			fill(sel[c - 1]->dtype, a, b, maxbytes);
		}
		size_t s = minbytes;
		for (size_t k = 0; k < nsizes; k++, s *= factor) {
			size_t esz = c > 0 ? sel[c - 1]->size : 1;
			size_t bytes = s / esz * esz;
			double t = bytes > 0 ? time_best(fn, a, b, bytes, bytes / esz, reps) : 0;
			gbps[k * (nsel + 1) + c] = t > 0 ? (double)bytes / t / 1e9 : 0;
		}
	}

	char cpu[128], isa[128];
	cpu_model(cpu, sizeof(cpu));
	reduce_isa(isa, sizeof(isa));
	printf("# kernel-bench:");
	for (int i = 0; i < argc; i++)
		printf(" %s", argv[i]);
	printf("\n# cpu: %s; kernels: %s\n", cpu, portable ? "portable only (-p)" : isa);
	printf("# op %s, in place a = a %s b, one thread, best of %d repetitions (>= %u MiB each)\n",
	       op_names[op], op_names[op], reps, REP_BYTES >> 20);
	printf("# GB/s = 1e9 x bytes of ONE operand (count x sizeof(dtype)) / seconds per call;\n"
	       "#   a call reads a and b and writes a (3 buffers). memcpy: bytes copied / seconds\n"
	       "#   (reads 1, writes 1 buffer). ratio = kernel GB/s / memcpy GB/s at the same size;\n"
	       "#   0.67 means the kernel streams memory as fast as memcpy does.\n#\n");
	for (int table = 0; table < 2; table++) {
		printf("# %s\n# %10s %9s", table == 0 ? "GB/s" : "ratio to memcpy", "size(B)",
		       table == 0 ? "memcpy" : "");
		for (size_t c = 0; c < nsel; c++)
			printf(" %9s", sel[c]->name);
		printf("\n");
		size_t s = minbytes;
		for (size_t k = 0; k < nsizes; k++, s *= factor) {
			const double *row = &gbps[k * (nsel + 1)];
			printf("  %10zu", s);
			if (table == 0)
				printf(" %9.2f", row[0]);
			else
				printf(" %9s", "");
			for (size_t c = 1; c <= nsel; c++)
				printf(" %9.2f", table == 0 ? row[c] : (row[0] > 0 ? row[c] / row[0] : 0));
			printf("\n");
		}
		printf("#\n");
	}
	free(gbps);
	free(a);
	free(b);
	return 0;

bad_arg:
	usage(argv[0]);
	return 2;
}
