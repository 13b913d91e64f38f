/*
 * step_args.c -- the flags of khor-bench step: its usage text and their parsing.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "step_args.h"
#include "bench_args.h"
#include "bench_data.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- flags -------------------------------------------------------------------------------- */

void step_usage(FILE *f)
{
	fprintf(f,
	        "usage: " STEP_PROG " step [flags]\n"
	        "One training step's gradients handed to the engine by a backprop thread (last\n"
	        "layer first, khor_enqueue_allreduce in place, names grad/<layer>), the main\n"
	        "thread waiting for every handle; against the direct API on the same bytes: one\n"
	        "flat khor_allreduce of all of them and one khor_allreduce per tensor; then a\n"
	        "lone 8-byte tensor, direct and through the engine, and the engine's negotiation\n"
	        "cost.\n"
	        "      --set S           resnet50 (ResNet-50's 161 float32 tensors, 25557032\n"
	        "                        parameters), small (1000 tensors of 4 KiB) or both\n"
	        "                        (default both)\n"
	        "  -n, --steps N         timed steps of each mode (default 10)\n"
	        "  -w, --warmup N        untimed steps before them (default 2; they also warm the\n"
	        "                        engine's response cache)\n"
	        "      --gap-us G        compute between two hand-overs, in us (default 50 for\n"
	        "                        resnet50, 0 for small); slept, against absolute\n"
	        "                        deadlines so that a late wake-up does not add up\n"
	        "      --spin            busy-wait the gaps instead of sleeping (takes a core)\n"
	        "  -o, --op OP           sum or avg (default avg, as Horovod's optimizer)\n"
	        "      --transport T     khor's links: tcp, shm, ib or auto (KHOR_TRANSPORT)\n"
	        "      --algo A          khor's allreduce algorithm (KHOR_ALGO), for every comm\n"
	        "      --fusion BYTES    the engine's KHOR_FUSION_THRESHOLD (K, M, G suffixes;\n"
	        "                        0 = no fusion; default: the environment, then 64M)\n"
	        "      --cycle-ms MS     the engine's KHOR_CYCLE_TIME in ms (default: the\n"
	        "                        environment, then 0)\n"
	        "      --sweep           also run the engine step for every fusion threshold of\n"
	        "                        0, 1M, 4M, 16M, 64M with every cycle time of 0, 1, 5 ms\n"
	        "                        (the engine restarted for each), and once with\n"
	        "                        KHOR_AUTOTUNE=1: its tuned values and step time\n"
	        "                        against the best fixed point\n"
	        "      --autotune-steps N\n"
	        "                        steps the autotuner gets before the timed ones, with\n"
	        "                        --sweep (default 100)\n"
	        "      --lat-reps N      calls of the 8-byte latency rows and steps of the tiny\n"
	        "                        set (%d tensors of 8 B) (default 200)\n"
	        "      --check           refill before every step and verify every element\n"
	        "                        after it (exact for sum; avg within float rounding)\n"
	        "      --json FILE       also write the run as JSON to FILE (rank 0)\n"
	        "  -q, --quiet           no table on stdout (with --json)\n"
	        "  -h, --help            this text\n"
	        "Columns: compute = first to last hand-over (the backprop thread's span); step =\n"
	        "first hand-over to last completion; exposed = last hand-over to last completion\n"
	        "(flat and per-tensor: their step, nothing overlaps them); GB/s = bytes / step;\n"
	        "vs flat = step / flat's; negot, cycles = the engine's negotiation time and\n"
	        "cycles per step (khor_engine_stats). Each is the slowest rank's per step, then\n"
	        "the median of the timed steps. The engine runs on a comm split from the world;\n"
	        "flat and per-tensor run on the world while no engine runs; the latency rows\n"
	        "interleave direct and engine calls in 5 rounds.\n"
	        "Exit status: 0 all right, 1 a failed call or a wrong result, 2 a bad flag.\n",
	        STEP_TINY_TENSORS);
}

static int step_bad(const char *what, const char *value, const char *need)
{
	fprintf(stderr, STEP_PROG " step: bad value '%s' for %s: it needs %s\n", value, what, need);
	step_usage(stderr);
	return 2;
}

int step_parse_args(int argc, char **argv, struct step_args *a)
{
	enum {
		OPT_SET = 256,
		OPT_GAP,
		OPT_SPIN,
		OPT_FUSION,
		OPT_CYCLE,
		OPT_SWEEP,
		OPT_AUTO,
		OPT_LAT,
		OPT_CHECK,
		OPT_JSON
	};
	static const struct option longopts[] = {
	    {"set", required_argument, NULL, OPT_SET},
	    {"steps", required_argument, NULL, 'n'},
	    {"warmup", required_argument, NULL, 'w'},
	    {"gap-us", required_argument, NULL, OPT_GAP},
	    {"spin", no_argument, NULL, OPT_SPIN},
	    {"op", required_argument, NULL, 'o'},
	    {"fusion", required_argument, NULL, OPT_FUSION},
	    {"cycle-ms", required_argument, NULL, OPT_CYCLE},
	    {"sweep", no_argument, NULL, OPT_SWEEP},
	    {"autotune-steps", required_argument, NULL, OPT_AUTO},
	    {"lat-reps", required_argument, NULL, OPT_LAT},
	    {"check", no_argument, NULL, OPT_CHECK},
	    {"json", required_argument, NULL, OPT_JSON},
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	*a = (struct step_args){
	    .sets = 3,
	    .steps = 10,
	    .warmup = 2,
	    .gap_us = -1,
	    .op = BENCH_AVG,
	    .fusion = -1,
	    .cycle_ms = -1,
	    .autotune_steps = 100,
	    .lat_reps = 200,
	};
	int c;
	opterr = 0;
	optind = 2; /* past "step" */
	while ((c = getopt_long(argc, argv, ":n:w:o:qh", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_SET:
			if (strcmp(optarg, "both") == 0)
				a->sets = 3;
			else if (strcmp(optarg, "resnet50") == 0)
				a->sets = 1;
			else if (strcmp(optarg, "small") == 0)
				a->sets = 2;
			else
				return step_bad("--set", optarg, "resnet50, small or both");
			break;
		case 'n':
			if (bench_parse_int(optarg, 1, 100000, &a->steps))
				return step_bad("--steps", optarg, "an integer from 1 to 100000");
			break;
		case 'w':
			if (bench_parse_int(optarg, 0, 100000, &a->warmup))
				return step_bad("--warmup", optarg, "an integer from 0 to 100000");
			break;
		case OPT_GAP:
			if (bench_parse_int(optarg, 0, 1000000, &a->gap_us))
				return step_bad("--gap-us", optarg,
				                "microseconds from 0 to 1000000");
			break;
		case OPT_SPIN:
			a->spin = 1;
			break;
		case 'o':
			if (bench_parse_op(optarg, &a->op) ||
			    (a->op != BENCH_SUM && a->op != BENCH_AVG))
				return step_bad("--op", optarg, "sum or avg");
			break;
		case OPT_FUSION: {
			size_t v;
			if (bench_parse_size(optarg, &v) || v > (size_t)INT64_MAX)
				return step_bad("--fusion", optarg, "a size like 0, 4M or 64M");
			a->fusion = (int64_t)v;
			break;
		}
		case OPT_CYCLE: {
			char *end;
			errno = 0;
			double v = strtod(optarg, &end);
			if (errno || end == optarg || *end != '\0' || !(v >= 0 && v <= 60000))
				return step_bad("--cycle-ms", optarg,
				                "milliseconds from 0 to 60000");
			a->cycle_ms = v;
			break;
		}
		case OPT_SWEEP:
			a->sweep = 1;
			break;
		case OPT_AUTO:
			if (bench_parse_int(optarg, 0, 1000000, &a->autotune_steps))
				return step_bad("--autotune-steps", optarg,
				                "an integer of 0 or more");
			break;
		case OPT_LAT:
			if (bench_parse_int(optarg, 1, 1000000, &a->lat_reps))
				return step_bad("--lat-reps", optarg, "an integer of 1 or more");
			break;
		case OPT_CHECK:
			a->check = 1;
			break;
		case OPT_JSON:
			a->json = optarg;
			break;
		case 'q':
			a->quiet = 1;
			break;
		case 'h':
			step_usage(stdout);
			return 1;
		case ':':
			fprintf(stderr, STEP_PROG " step: this flag needs a value: %s\n",
			        argv[optind - 1]);
			step_usage(stderr);
			return 2;
		default:
			fprintf(stderr, STEP_PROG " step: unknown flag %s\n", argv[optind - 1]);
			step_usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, STEP_PROG " step: unexpected argument %s\n", argv[optind]);
		step_usage(stderr);
		return 2;
	}
	if (a->quiet && !a->json) {
		fprintf(stderr, STEP_PROG " step: -q without --json would print nothing\n");
		step_usage(stderr);
		return 2;
	}
	return 0;
}
