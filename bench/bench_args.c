/*
 * bench_args.c -- the benchmark's flags: nccl-tests' flags and sizes, parsed the same way for every
 * peer so that the same command line means the same run.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_args.h"
#include "bench_colls.h"
#include "bench_data.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- flags -------------------------------------------------------------------------------- */

void bench_usage(FILE *f, const char *prog, const char *extra)
{
	fprintf(f,
	        "usage: %s <collective> [flags]\n"
	        "collectives:",
	        prog);
	for (size_t i = 0; i < bench_ncolls; i++)
		fprintf(f, " %s", bench_colls[i].name);
	fprintf(f,
	        "\n"
	        "  -b, --minbytes SIZE   smallest message (default 8)\n"
	        "  -e, --maxbytes SIZE   largest message (default 64M)\n"
	        "  -f, --stepfactor N    multiply the size by N each step (default 2)\n"
	        "  -i, --stepbytes SIZE  add SIZE each step instead of -f\n"
	        "  -n, --iters N         timed iterations per size (default 20)\n"
	        "  -w, --warmup_iters N  untimed iterations before them (default 5)\n"
	        "  -c, --check 0|1|all   verify results: 0 never, 1 in one extra call after the\n"
	        "                        timed ones (default), all in every call\n"
	        "      --check           the same as -c all (only the call itself is timed)\n"
	        "  -d, --datatype T      float, double, int32, int64, half, bfloat16, int8,\n"
	        "                        uint8, int16 (default float)\n"
	        "  -o, --op OP           sum, avg, min, max, prod (default sum)\n"
	        "  -r, --root R          root of broadcast, reduce, gather, scatter (default 0)\n"
	        "      --csv FILE        also write the rows as CSV to FILE (rank 0)\n"
	        "      --json FILE       also write the run as JSON to FILE (rank 0)\n"
	        "      --progress SEC    a line on stderr while a size runs past SEC (default 2;\n"
	        "                        0: never)\n"
	        "      --offset BYTES    start the buffers BYTES past a page boundary (default 0;\n"
	        "                        0-4095), as a framework's tensors often do: PyTorch\n"
	        "                        aligns CPU tensors to 64 bytes, NumPy arrays to 16\n"
	        "  -q, --quiet           no table on stdout (with --csv or --json)\n"
	        "%s"
	        "  -h, --help            this text\n"
	        "SIZE takes a K, M or G suffix (powers of 1024), e.g. 64M. As in nccl-tests, a\n"
	        "size is the bytes of one rank's largest buffer: the gathered result of\n"
	        "allgather and gather, the whole input of reducescatter and scatter, the whole\n"
	        "send buffer of alltoall. Time is the slowest rank's average per call;\n"
	        "algbw = size / time; busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n\n"
	        "(allgather, reducescatter, alltoall, gather, scatter), x 1 (broadcast, reduce).\n"
	        "#wrong: wrong elements, summed over the ranks and the checked calls.\n"
	        "Exit status: 0 all right, 1 a failed call or a wrong result, 2 a bad flag.\n",
	        extra ? extra : "");
}

int bench_parse_size(const char *s, size_t *out)
{
	char *end;
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	unsigned shift = 0;
	switch (*end) {
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end != '\0' || v > (SIZE_MAX >> shift))
		return -1;
	*out = (size_t)v << shift;
	return 0;
}

int bench_parse_int(const char *s, int min, int max, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end != '\0' || v < min || v > max)
		return -1;
	*out = (int)v;
	return 0;
}

static int bench_parse_check(const char *s, enum bench_check *out)
{
	if (strcmp(s, "0") == 0)
		*out = BENCH_CHECK_NONE;
	else if (strcmp(s, "1") == 0)
		*out = BENCH_CHECK_ONCE;
	else if (strcmp(s, "all") == 0 || strcmp(s, "2") == 0)
		*out = BENCH_CHECK_ALL;
	else
		return -1;
	return 0;
}

/* Says why on stderr, then the usage; the caller exits with status 2. */
static int bench_bad_flag(const char *prog, const char *extra, const char *why, const char *what)
{
	fprintf(stderr, "%s: %s%s\n", prog, why, what ? what : "");
	bench_usage(stderr, prog, extra);
	return 2;
}

int bench_parse_args(int argc, char **argv, const char *prog, const char *extra,
                     struct bench_args *a)
{
	enum { OPT_CSV = 256, OPT_JSON, OPT_CHECK_ALL, OPT_PROGRESS, OPT_OFFSET };
	static const struct option longopts[] = {
	    {"minbytes", required_argument, NULL, 'b'},
	    {"maxbytes", required_argument, NULL, 'e'},
	    {"stepfactor", required_argument, NULL, 'f'},
	    {"stepbytes", required_argument, NULL, 'i'},
	    {"iters", required_argument, NULL, 'n'},
	    {"warmup_iters", required_argument, NULL, 'w'},
	    /* --check alone checks every call; --check=0|1|all is -c */
	    {"check", optional_argument, NULL, OPT_CHECK_ALL},
	    {"datatype", required_argument, NULL, 'd'},
	    {"op", required_argument, NULL, 'o'},
	    {"root", required_argument, NULL, 'r'},
	    {"csv", required_argument, NULL, OPT_CSV},
	    {"json", required_argument, NULL, OPT_JSON},
	    {"progress", required_argument, NULL, OPT_PROGRESS},
	    {"offset", required_argument, NULL, OPT_OFFSET},
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	*a = (struct bench_args){
	    .minbytes = 8,
	    .maxbytes = 64u << 20,
	    .stepfactor = 2,
	    .iters = 20,
	    .warmup = 5,
	    .check = BENCH_CHECK_ONCE,
	    .dtype = BENCH_F32,
	    .op = BENCH_SUM,
	    .progress_s = 2,
	};
	int op_given = 0, root_given = 0, dtype_given = 0, c;
	opterr = 0; /* we name the bad flag ourselves, with the usage after it */
	optind = 1;
	int longidx = -1; /* set by getopt_long when a long option matched */
	while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:r:qh", longopts, &longidx)) != -1) {
		const char *need = NULL; /* set when the value is bad: what the flag wants */
		int f = 2;
		switch (c) {
		case 'b':
			if (bench_parse_size(optarg, &a->minbytes))
				need = "a size like 8, 4K or 64M";
			break;
		case 'e':
			if (bench_parse_size(optarg, &a->maxbytes))
				need = "a size like 8, 4K or 64M";
			break;
		case 'f':
			if (bench_parse_int(optarg, 2, INT_MAX, &f))
				need = "an integer factor of 2 or more";
			a->stepfactor = (size_t)f;
			a->stepbytes = 0; /* the last of -f and -i wins */
			break;
		case 'i':
			if (bench_parse_size(optarg, &a->stepbytes) || a->stepbytes == 0)
				need = "a positive size like 1M";
			break;
		case 'n':
			if (bench_parse_int(optarg, 1, INT_MAX, &a->iters))
				need = "an integer of 1 or more";
			break;
		case 'w':
			if (bench_parse_int(optarg, 0, INT_MAX, &a->warmup))
				need = "an integer of 0 or more";
			break;
		case 'c':
			if (bench_parse_check(optarg, &a->check))
				need = "0, 1 or all";
			break;
		case OPT_CHECK_ALL:
			if (!optarg)
				a->check = BENCH_CHECK_ALL;
			else if (bench_parse_check(optarg, &a->check))
				need = "0, 1 or all";
			break;
		case 'd':
			dtype_given = 1;
			if (bench_parse_dtype(optarg, &a->dtype))
				need = "float, double, int32, int64, half, bfloat16, int8, uint8 "
				       "or int16";
			break;
		case 'o':
			op_given = 1;
			if (bench_parse_op(optarg, &a->op))
				need = "sum, avg, min, max or prod";
			break;
		case 'r':
			root_given = 1;
			if (bench_parse_int(optarg, 0, INT_MAX, &a->root))
				need = "a rank of 0 or more";
			break;
		case OPT_CSV:
			a->csv = optarg;
			break;
		case OPT_JSON:
			a->json = optarg;
			break;
		case OPT_PROGRESS: {
			int sec = 0;
			if (bench_parse_int(optarg, 0, 86400, &sec))
				need = "whole seconds, 0 for never";
			a->progress_s = sec;
			break;
		}
		case OPT_OFFSET: {
			int off = 0;
			if (bench_parse_int(optarg, 0, 4095, &off))
				need = "a byte count from 0 to 4095";
			a->offset = (size_t)off;
			break;
		}
		case 'q':
			a->quiet = 1;
			break;
		case 'h':
			bench_usage(stdout, prog, extra);
			return 1;
		case ':':
			return bench_bad_flag(prog, extra,
			                      "this flag needs a value: ", argv[optind - 1]);
		default:
			if (optopt > 0 && optopt < 256) {
				char flag[3] = {'-', (char)optopt, '\0'};
				return bench_bad_flag(prog, extra, "unknown flag ", flag);
			}
			return bench_bad_flag(prog, extra, "unknown flag ", argv[optind - 1]);
		}
		if (need) {
			/* Name the flag as written: -d for short options, --datatype for long ones.
			 */
			const char *name = longidx >= 0 ? longopts[longidx].name : NULL;
			if (name)
				fprintf(stderr, "%s: bad value '%s' for --%s: it needs %s\n", prog,
				        optarg, name, need);
			else
				fprintf(stderr, "%s: bad value '%s' for -%c: it needs %s\n", prog,
				        optarg, c, need);
			bench_usage(stderr, prog, extra);
			return 2;
		}
		longidx = -1;
	}
	if (optind != argc - 1)
		return bench_bad_flag(prog, extra,
		                      optind >= argc ? "which collective? name one"
		                                     : "name exactly one collective, not ",
		                      optind >= argc ? NULL : argv[optind + 1]);
	a->coll = bench_find_coll(argv[optind]);
	if (!a->coll)
		return bench_bad_flag(prog, extra, "unknown collective ", argv[optind]);
	if (a->minbytes > a->maxbytes) {
		fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", prog, a->minbytes,
		        a->maxbytes);
		bench_usage(stderr, prog, extra);
		return 2;
	}
	if (a->quiet && !a->csv && !a->json)
		return bench_bad_flag(prog, extra, "-q without --csv or --json would print nothing",
		                      NULL);
	/* Refuse flags that would be silently ignored: a user who wrote -o max on a broadcast
	 * believes they measured something they did not. */
	if (op_given && !(a->coll->flags & BENCH_USES_OP))
		return bench_bad_flag(prog, extra, "-o does not apply to ", a->coll->name);
	if (root_given && !(a->coll->flags & BENCH_USES_ROOT))
		return bench_bad_flag(prog, extra, "-r does not apply to ", a->coll->name);
	if (dtype_given && (a->coll->flags & BENCH_NO_DATA))
		return bench_bad_flag(prog, extra, "-d does not apply to ", a->coll->name);
	return 0;
}
