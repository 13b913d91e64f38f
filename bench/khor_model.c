/*
 * khor_model.c -- khor-model, the allreduce cost model as a tool: what would each schedule
 * cost on a cluster we do not have?
 *
 *   khor-model --alpha 10 --bw 100Gbit/s --gamma 10GB/s --ppn 8 -n 2-4096
 *
 * khor picks an allreduce schedule per call from a cost model (collectives/select.c: alpha
 * per message, beta per byte on a link, gamma per byte reduced). The same functions,
 * called here and not copied, predict the time of ring, double binary tree (tree),
 * recursive doubling (rd), halving-doubling (hd) and the node-aware schedule (hier: ring
 * inside each host of --ppn ranks, then the cheapest flat schedule across hosts on each
 * shard) for any rank count and size. That answers "which algorithm wins where" at scales
 * no test machine has, and, fed with a real link's numbers, lets bench/cluster/model_check.sh
 * compare prediction with measurement.
 *
 * Flat schedules use the inter-host parameters, as comm.c does once a job spans hosts
 * (a flat schedule is only as fast as the slowest link it crosses), as if one rank per host
 * used the host's link at a time: exact for the ring with ranks placed host by host,
 * optimistic for tree, rd and hd when --ppn > 1 (their cross-host steps run on all local
 * ranks at once). hier uses the intra-host parameters inside a host, and across hosts 1/ppn
 * of the host's link per local rank. Output: a map of the winner per (n, size), the size ranges each
 * schedule wins for each n, then one table per n (time in us, busbw of the winner as
 * nccl-tests defines it: algbw x 2(n-1)/n), and all of it as CSV with --csv.
 */
#include "collectives/rd.h"
#include "collectives/select.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PROG "khor-model"
#define MAX_N 64
#define MAX_SIZES 64

enum { M_RING, M_TREE, M_RD, M_HD, M_HIER, M_NALGO };
static const char *const algo_names[M_NALGO] = { "ring", "tree", "rd", "hd", "hier" };
static const int algo_ids[M_NALGO] = { ALGO_RING, ALGO_TREE, ALGO_RD, ALGO_HD, -1 };

struct opts {
	cost_model outer, inner;
	int ppn;
	size_t slice;
	int ns[MAX_N], nn;
	size_t sizes[MAX_SIZES];
	int nsizes;
	bool use[M_NALGO];
	const char *csv;
	bool quiet; /* only the map and the ranges */
};

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: " PROG " [flags]\n"
	        "Predicted allreduce time of each schedule from khor's cost model (alpha, beta,\n"
	        "gamma; collectives/select.c), and which one wins for each rank count and size.\n"
	        "  --alpha US         inter-host time per message in microseconds (default 10)\n"
	        "  --bw RATE          inter-host link bandwidth (default 12.5GB/s)\n"
	        "  --gamma RATE       reduction speed (default 10GB/s)\n"
	        "  --ppn L            ranks per host for the hierarchical schedule (default 8;\n"
	        "                     1 leaves hier out)\n"
	        "  --intra-alpha US   intra-host time per message (default 1)\n"
	        "  --intra-bw RATE    intra-host bandwidth (default 20GB/s)\n"
	        "  --slice SIZE       pipeline slice, KHOR_SLICE_BYTES (default 512K)\n"
	        "  -n LIST            rank counts: 2,3,64 and A-B for the powers of two in between\n"
	        "                     (default 2,3,4,6,8,12,16,32,64,128,256,512,1024,2048,4096)\n"
	        "  -b SIZE, -e SIZE, -f N   sizes from -b to -e, times N each step (default 8, 1G, 8)\n"
	        "  --sizes LIST       explicit sizes instead, e.g. 1M,4M,16M\n"
	        "  --algos LIST       some of ring,tree,rd,hd,hier (default all)\n"
	        "  --csv FILE         also write every prediction as CSV ('-' = stdout only CSV)\n"
	        "  -q                 only the winner map and the ranges, no per-n tables\n"
	        "RATE: a number with GB/s, MB/s, Gbit/s or Mbit/s (decimal units), e.g. 100Gbit/s.\n"
	        "SIZE: bytes with K, M, G (powers of 1024). Times are per call, in microseconds.\n");
}

static int bad(const char *flag, const char *v, const char *want)
{
	fprintf(stderr, PROG ": %s '%s': expected %s\n", flag, v, want);
	return -1;
}

/* "100Gbit/s" -> bytes per second. */
static int parse_rate(const char *flag, const char *s, double *bps_out)
{
	static const struct { const char *unit; double mult; } units[] = {
		{ "GB/s", 1e9 }, { "MB/s", 1e6 }, { "KB/s", 1e3 }, { "B/s", 1 },
		{ "Gbit/s", 1e9 / 8 }, { "Mbit/s", 1e6 / 8 }, { "Gbit", 1e9 / 8 },
		{ "Mbit", 1e6 / 8 }, { "Gbps", 1e9 / 8 }, { "Mbps", 1e6 / 8 },
	};
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v > 0) || !isfinite(v))
		return bad(flag, s, "a positive rate with a unit, e.g. 12.5GB/s or 100Gbit/s");
	/* Byte units must match exactly (a lower-case "b" often means bits); bit units are
	 * spelled out, so their case does not matter. */
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		bool bits = strstr(units[i].unit, "bit") || strstr(units[i].unit, "bps");
		if (bits ? strcasecmp(end, units[i].unit) == 0 : strcmp(end, units[i].unit) == 0) {
			*bps_out = v * units[i].mult;
			return 0;
		}
	}
	return bad(flag, s, "a unit: GB/s, MB/s, KB/s, Gbit/s or Mbit/s");
}

static int parse_us(const char *flag, const char *s, double *sec_out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end != '\0' || v < 0 || !isfinite(v))
		return bad(flag, s, "microseconds >= 0, e.g. 5 or 0.8");
	*sec_out = v * 1e-6;
	return 0;
}

static int parse_size(const char *flag, const char *s, size_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	unsigned shift = 0;
	if (errno || end == s || *s == '-')
		return bad(flag, s, "a size in bytes, e.g. 4096 or 64M");
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end != '\0' || v > (SIZE_MAX >> shift))
		return bad(flag, s, "a size in bytes, e.g. 4096 or 64M");
	*out = (size_t)v << shift;
	return 0;
}

/* "2,3,8-64": single counts and power-of-two ranges. */
static int parse_ns(const char *s, struct opts *o)
{
	char buf[512], *save = NULL;
	if (strlen(s) >= sizeof(buf))
		return bad("-n", s, "a shorter list");
	strcpy(buf, s);
	o->nn = 0;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *dash = strchr(tok, '-'), *end;
		long lo = strtol(tok, &end, 10), hi = lo;
		if (dash) {
			if (end != dash)
				return bad("-n", s, "counts like 2,3,8-4096");
			hi = strtol(dash + 1, &end, 10);
		}
		if (*end != '\0' || lo < 2 || hi < lo || hi > (1 << 20))
			return bad("-n", s, "counts from 2 to 1048576, like 2,3,8-4096");
		for (long n = lo; n <= hi; n = dash ? (n & (n - 1)) ? n + 1 : n * 2 : hi + 1) {
			if (dash && (n & (n - 1)))
				continue; /* a range lists powers of two only */
			if (o->nn == MAX_N)
				return bad("-n", s, "at most 64 counts");
			o->ns[o->nn++] = (int)n;
		}
	}
	return o->nn > 0 ? 0 : bad("-n", s, "at least one count");
}

static int parse_sizes(const char *s, struct opts *o)
{
	char buf[1024], *save = NULL;
	if (strlen(s) >= sizeof(buf))
		return bad("--sizes", s, "a shorter list");
	strcpy(buf, s);
	o->nsizes = 0;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o->nsizes == MAX_SIZES)
			return bad("--sizes", s, "at most 64 sizes");
		if (parse_size("--sizes", tok, &o->sizes[o->nsizes]))
			return -1;
		if (o->sizes[o->nsizes] == 0)
			return bad("--sizes", tok, "a size above 0");
		o->nsizes++;
	}
	return o->nsizes > 0 ? 0 : bad("--sizes", s, "at least one size");
}

static int parse_algos(const char *s, struct opts *o)
{
	char buf[128], *save = NULL;
	if (strlen(s) >= sizeof(buf))
		return bad("--algos", s, "some of ring,tree,rd,hd,hier");
	strcpy(buf, s);
	memset(o->use, 0, sizeof(o->use));
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int a;
		for (a = 0; a < M_NALGO && strcmp(tok, algo_names[a]) != 0; a++)
			;
		if (a == M_NALGO)
			return bad("--algos", tok, "one of ring,tree,rd,hd,hier");
		o->use[a] = true;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	size_t b = 8, e = (size_t)1 << 30, f = 8;
	bool explicit_sizes = false;
	double bps;

	*o = (struct opts){
		.outer = { .alpha = 10e-6, .beta = 1 / 12.5e9, .gamma = 1 / 10e9 },
		.inner = { .alpha = 1e-6, .beta = 1 / 20e9, .gamma = 1 / 10e9 },
		.ppn = 8,
		.slice = 512 << 10,
	};
	for (int a = 0; a < M_NALGO; a++)
		o->use[a] = true;
	if (parse_ns("2,3,4,6,8,12,16,32,64,128,256,512,1024,2048,4096", o))
		return -1;
	for (int i = 1; i < argc; i++) {
		const char *fl = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int rc = 0;
		if (strcmp(fl, "-h") == 0 || strcmp(fl, "--help") == 0) {
			usage(stdout);
			return 1;
		}
		if (strcmp(fl, "-q") == 0) {
			o->quiet = true;
			continue;
		}
		if (v == NULL) {
			fprintf(stderr, PROG ": %s needs a value (or is unknown; see --help)\n", fl);
			return -1;
		}
		i++;
		if (strcmp(fl, "--alpha") == 0)
			rc = parse_us(fl, v, &o->outer.alpha);
		else if (strcmp(fl, "--intra-alpha") == 0)
			rc = parse_us(fl, v, &o->inner.alpha);
		else if (strcmp(fl, "--bw") == 0 && (rc = parse_rate(fl, v, &bps)) == 0)
			o->outer.beta = 1 / bps;
		else if (strcmp(fl, "--intra-bw") == 0 && (rc = parse_rate(fl, v, &bps)) == 0)
			o->inner.beta = 1 / bps;
		else if (strcmp(fl, "--gamma") == 0 && (rc = parse_rate(fl, v, &bps)) == 0)
			o->outer.gamma = o->inner.gamma = 1 / bps;
		else if (strcmp(fl, "--ppn") == 0) {
			char *end;
			long p = strtol(v, &end, 10);
			if (*end != '\0' || p < 1 || p > 1024)
				rc = bad(fl, v, "ranks per host from 1 to 1024");
			o->ppn = (int)p;
		} else if (strcmp(fl, "--slice") == 0) {
			rc = parse_size(fl, v, &o->slice);
			if (rc == 0 && o->slice == 0)
				rc = bad(fl, v, "a slice above 0");
		} else if (strcmp(fl, "-n") == 0)
			rc = parse_ns(v, o);
		else if (strcmp(fl, "-b") == 0)
			rc = parse_size(fl, v, &b);
		else if (strcmp(fl, "-e") == 0)
			rc = parse_size(fl, v, &e);
		else if (strcmp(fl, "-f") == 0) {
			char *end;
			long x = strtol(v, &end, 10);
			if (*end != '\0' || x < 2 || x > 1024)
				rc = bad(fl, v, "a factor from 2 to 1024");
			f = (size_t)x;
		} else if (strcmp(fl, "--sizes") == 0) {
			rc = parse_sizes(v, o);
			explicit_sizes = true;
		} else if (strcmp(fl, "--algos") == 0)
			rc = parse_algos(v, o);
		else if (strcmp(fl, "--csv") == 0)
			o->csv = v;
		else {
			fprintf(stderr, PROG ": unknown flag '%s' (see --help)\n", fl);
			return -1;
		}
		if (rc)
			return -1;
	}
	if (!explicit_sizes) {
		if (b == 0 || b > e) {
			fprintf(stderr, PROG ": need 0 < -b <= -e\n");
			return -1;
		}
		o->nsizes = 0;
		for (size_t s = b; s <= e && o->nsizes < MAX_SIZES; s *= f) {
			o->sizes[o->nsizes++] = s;
			if (s > SIZE_MAX / f)
				break;
		}
	}
	if (o->ppn < 2)
		o->use[M_HIER] = false;
	/* As the runtime: each ring slice is a message. No cache term: hosts unknown here. */
	o->outer.ring_slice = o->inner.ring_slice = (double)o->slice;
	return 0;
}

/* Predicted seconds of algorithm a, or NAN where it does not apply (hier needs whole hosts). */
static double predict(const struct opts *o, int a, int n, size_t bytes)
{
	if (a != M_HIER)
		return cost_allreduce(&o->outer, algo_ids[a], n, bytes, o->slice);
	if (o->ppn < 2 || n % o->ppn != 0 || n / o->ppn < 2)
		return NAN;
	/* The L cross-host allreduces of hier run at once, one per local rank, and share the
	 * host's link: each gets 1/L of it. cost_hier_allreduce takes the per-rank share as
	 * its outer beta (which is what comm.c's calibration measures, all cross pairs
	 * swapping together), while --bw is the host's link. */
	cost_model share = o->outer;
	share.beta *= o->ppn;
	return cost_hier_allreduce(&o->inner, &share, o->ppn, n / o->ppn, bytes, o->slice);
}

static int winner(const struct opts *o, int n, size_t bytes, double *t_out)
{
	int best = -1;
	double bt = INFINITY;
	for (int a = 0; a < M_NALGO; a++) {
		double t = o->use[a] ? predict(o, a, n, bytes) : NAN;
		if (!isnan(t) && t < bt) {
			bt = t;
			best = a;
		}
	}
	if (t_out)
		*t_out = bt;
	return best;
}

static const char *human(size_t b, char *buf, size_t len)
{
	if (b >= (1u << 30) && b % (1u << 30) == 0)
		snprintf(buf, len, "%zuG", b >> 30);
	else if (b >= (1u << 20) && b % (1u << 20) == 0)
		snprintf(buf, len, "%zuM", b >> 20);
	else if (b >= 1024 && b % 1024 == 0)
		snprintf(buf, len, "%zuK", b >> 10);
	else
		snprintf(buf, len, "%zu", b);
	return buf;
}

static double busbw(int n, size_t bytes, double t)
{
	return t > 0 ? (double)bytes / t * 2.0 * (n - 1) / n : 0;
}

static void print_params(const struct opts *o)
{
	printf("# " PROG ": allreduce cost model of collectives/select.c\n");
	printf("# inter-host: alpha %.2f us, link %.3f GB/s (%.2f Gbit/s); reduce %.2f GB/s\n",
	       o->outer.alpha * 1e6, 1e-9 / o->outer.beta, 8e-9 / o->outer.beta,
	       1e-9 / o->outer.gamma);
	if (o->use[M_HIER])
		printf("# intra-host: alpha %.2f us, link %.3f GB/s; %d ranks per host (hier)\n",
		       o->inner.alpha * 1e6, 1e-9 / o->inner.beta, o->ppn);
	printf("# slice %zu B; flat schedules run over inter-host links\n#\n", o->slice);
}

static void print_map(const struct opts *o)
{
	char b[32];
	printf("# winner per rank count (rows) and size (columns)\n%6s", "n");
	for (int s = 0; s < o->nsizes; s++)
		printf(" %5s", human(o->sizes[s], b, sizeof b));
	printf("\n");
	for (int i = 0; i < o->nn; i++) {
		printf("%6d", o->ns[i]);
		for (int s = 0; s < o->nsizes; s++) {
			int w = winner(o, o->ns[i], o->sizes[s], NULL);
			printf(" %5s", w < 0 ? "-" : algo_names[w]);
		}
		printf("\n");
	}
	printf("#\n");
}

/* For each n, the size ranges (on a power-of-two grid from 8 B to 1 GiB) each schedule wins. */
static void print_ranges(const struct opts *o)
{
	char lo[32], hi[32];
	printf("# where each schedule wins (sizes 8 B to 1 GiB, powers of two)\n");
	for (int i = 0; i < o->nn; i++) {
		int n = o->ns[i], cur = -2;
		size_t start = 8, prev = 8;
		printf("n=%-5d", n);
		for (size_t s = 8; s <= ((size_t)1 << 30); s *= 2) {
			int w = winner(o, n, s, NULL);
			if (w != cur) {
				if (cur != -2)
					printf(" %s %s-%s,", cur < 0 ? "-" : algo_names[cur],
					       human(start, lo, sizeof lo), human(prev, hi, sizeof hi));
				cur = w;
				start = s;
			}
			prev = s;
		}
		printf(" %s %s-%s\n", cur < 0 ? "-" : algo_names[cur], human(start, lo, sizeof lo),
		       human(prev, hi, sizeof hi));
	}
	printf("#\n");
}

static void print_tables(const struct opts *o)
{
	char b[32];
	for (int i = 0; i < o->nn; i++) {
		int n = o->ns[i];
		printf("# n = %d\n#%11s", n, "size");
		for (int a = 0; a < M_NALGO; a++)
			if (o->use[a])
				printf(" %11s", algo_names[a]);
		printf("  %6s %11s\n#%11s", "best", "busbw", "(B)");
		for (int a = 0; a < M_NALGO; a++)
			if (o->use[a])
				printf(" %11s", "(us)");
		printf("  %6s %11s\n", "", "(GB/s)");
		for (int s = 0; s < o->nsizes; s++) {
			size_t bytes = o->sizes[s];
			double bt;
			int w = winner(o, n, bytes, &bt);
			printf("%12s", human(bytes, b, sizeof b));
			for (int a = 0; a < M_NALGO; a++) {
				if (!o->use[a])
					continue;
				double t = predict(o, a, n, bytes);
				if (isnan(t))
					printf(" %11s", "-");
				else
					printf(" %11.4g", t * 1e6);
			}
			printf("  %6s %11.4g\n", w < 0 ? "-" : algo_names[w],
			       w < 0 ? 0 : busbw(n, bytes, bt) / 1e9);
		}
		printf("\n");
	}
}

static int write_csv(const struct opts *o, FILE *f)
{
	fprintf(f, "n,ppn,size,algo,time_us,algbw_gbs,busbw_gbs,best\n");
	for (int i = 0; i < o->nn; i++) {
		for (int s = 0; s < o->nsizes; s++) {
			int n = o->ns[i];
			size_t bytes = o->sizes[s];
			int w = winner(o, n, bytes, NULL);
			for (int a = 0; a < M_NALGO; a++) {
				double t = o->use[a] ? predict(o, a, n, bytes) : NAN;
				if (isnan(t))
					continue;
				fprintf(f, "%d,%d,%zu,%s,%.6g,%.6g,%.6g,%d\n", n,
				        a == M_HIER ? o->ppn : 1, bytes, algo_names[a], t * 1e6,
				        (double)bytes / t / 1e9, busbw(n, bytes, t) / 1e9, a == w);
			}
		}
	}
	return ferror(f) ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc > 0 ? 0 : 2;

	if (o.csv && strcmp(o.csv, "-") == 0)
		return write_csv(&o, stdout) ? 1 : 0;
	print_params(&o);
	print_map(&o);
	print_ranges(&o);
	if (!o.quiet)
		print_tables(&o);
	if (o.csv) {
		FILE *f = fopen(o.csv, "w");
		if (f == NULL) {
			fprintf(stderr, PROG ": cannot open --csv %s: %s\n", o.csv, strerror(errno));
			return 1;
		}
		int bad_write = write_csv(&o, f);
		if (fclose(f) || bad_write) {
			fprintf(stderr, PROG ": writing --csv %s failed: %s\n", o.csv, strerror(errno));
			return 1;
		}
		fprintf(stderr, PROG ": wrote %s\n", o.csv);
	}
	return 0;
}
