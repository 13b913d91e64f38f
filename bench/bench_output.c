/*
 * bench_output.c -- the benchmark's output on rank 0: the title and column header, a row per size
 * (one column per algorithm or memory kind when comparing), and the quoting of CSV and JSON fields.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_output.h"
#include "bench_data.h"

#include <string.h>

/* ---- timing and printing ------------------------------------------------------------------ */

const char *bench_check_name(enum bench_check c)
{
	return c == BENCH_CHECK_ALL ? "all" : c == BENCH_CHECK_ONCE ? "1" : "0";
}

int bench_comparing(const struct bench_backend *b)
{
	return b->nalgos > 1;
}

const char *bench_mem_name(const struct bench_mem *m)
{
	return m ? m->name : "host";
}

int bench_mem_shown(const struct bench_backend *b)
{
	for (int m = 0; m < b->nmems; m++)
		if (b->mems[m])
			return 1;
	return 0;
}

int bench_nmems(const struct bench_backend *b)
{
	return b->nmems > 1 ? b->nmems : 1;
}

int bench_rounds(const struct bench_args *a)
{
	return a->iters < BENCH_ROUNDS ? a->iters : BENCH_ROUNDS;
}

/* The index of "auto" among the compared algorithms when there is also a fixed one; else -1. */
static int bench_auto_index(const struct bench_backend *b)
{
	if (!bench_comparing(b))
		return -1;
	for (int k = 0; k < b->nalgos; k++)
		if (strcmp(b->algos[k], "auto") == 0)
			return k;
	return -1;
}

/* The fastest algorithm other than auto (sec: per algorithm); -1 when there is none. */
static int bench_best_fixed(const struct bench_backend *b, const double *sec)
{
	int best = -1, au = bench_auto_index(b);
	for (int k = 0; k < b->nalgos; k++)
		if (k != au && (best < 0 || sec[k] < sec[best]))
			best = k;
	return best;
}

void bench_print_title(const struct bench_backend *b, const struct bench_args *a)
{
	printf("# %s %s: %d rank%s, ", b->prog, a->coll->name, b->size, b->size == 1 ? "" : "s");
	if (!(a->coll->flags & BENCH_NO_DATA))
		printf("dtype %s, ", bench_dtype_name(a->dtype));
	if (a->coll->flags & BENCH_USES_OP)
		printf("op %s, ", bench_op_name(a->op));
	if (a->coll->flags & BENCH_USES_ROOT)
		printf("root %d, ", a->root);
	printf("iters %d, warmup %d, check %s", a->iters, a->warmup, bench_check_name(a->check));
	if (a->offset)
		printf(", buffers at page + %zu B", a->offset);
	printf("\n");
	printf("# library: %s (transport %s, algo %s)\n", b->library, b->transport, b->algo);
	if (!bench_mem_shown(b))
		return;
	printf("# memory:");
	for (int m = 0; m < bench_nmems(b); m++)
		printf("%s %s", m ? " and" : "", b->mems[m] ? b->mems[m]->where : "host");
	if (bench_nmems(b) > 1)
		printf(", side by side");
	printf("; patterns written and checked in host copies, moved outside the timed calls\n");
}

void bench_print_header(const struct bench_backend *b, const struct bench_args *a)
{
	bench_print_title(b, a);
	if (bench_comparing(b)) {
		printf(
		    "# algorithms interleaved: %d rounds, each runs every algorithm's share of the "
		    "iterations in turn (starting one later each round, every other round in "
		    "reverse); time in us per call, median of the rounds\n#\n",
		    bench_rounds(a));
		printf("#%11s  %12s  %8s  %6s", "size", "count", "type", "redop");
		for (int k = 0; k < b->nalgos; k++)
			printf("  %8s", b->algos[k]);
		if (bench_auto_index(b) >= 0)
			printf("  %6s  %9s", "best", "auto/best");
		printf("  %6s\n", "#wrong");
		fflush(stdout);
		return;
	}
	if (bench_nmems(b) > 1) {
		char col[2][2][32], ratio[32];
		for (int m = 0; m < 2; m++) {
			const char *name = bench_mem_name(b->mems[m]);
			snprintf(col[m][0], sizeof col[m][0], "%s time", name);
			snprintf(col[m][1], sizeof col[m][1], "%s busbw", name);
		}
		snprintf(ratio, sizeof ratio, "%s/%s", bench_mem_name(b->mems[1]),
		         bench_mem_name(b->mems[0]));
		printf("# interleaved: %d rounds, each runs both kinds' share of the iterations in "
		       "turn; time per call, median of the rounds; %s: the ratio of their "
		       "busbw\n#\n",
		       bench_rounds(a), ratio);
		printf("#%11s  %12s  %8s  %6s  %10s  %10s  %10s  %10s  %9s  %6s\n", "size", "count",
		       "type", "redop", col[0][0], col[0][1], col[1][0], col[1][1], ratio,
		       "#wrong");
		printf("#%11s  %12s  %8s  %6s  %10s  %10s  %10s  %10s\n", "(B)", "(elements)", "",
		       "", "(us)", "(GB/s)", "(us)", "(GB/s)");
		fflush(stdout);
		return;
	}
	printf("#\n");
	printf("#%11s  %12s  %8s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
	       "time", "algbw", "busbw", "#wrong");
	printf("#%11s  %12s  %8s  %6s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "(us)",
	       "(GB/s)", "(GB/s)");
	fflush(stdout);
}

void bench_format_time(char *out, size_t len, double us)
{
	snprintf(out, len, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

const char *bench_row_type(const struct bench_args *a)
{
	return a->coll->flags & BENCH_NO_DATA ? "none" : bench_dtype_name(a->dtype);
}

const char *bench_row_redop(const struct bench_args *a)
{
	return a->coll->flags & BENCH_USES_OP ? bench_op_name(a->op) : "none";
}

void bench_print_row(const struct bench_args *a, size_t bytes, size_t count, double us,
                     double algbw, double busbw, int64_t wrong)
{
	char t[32], w[32];
	bench_format_time(t, sizeof t, us);
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6s\n", bytes, count, bench_row_type(a),
	       bench_row_redop(a), t, algbw, busbw, w);
	fflush(stdout); /* one line per size is the progress report of a long sweep */
}

void bench_print_compare_row(const struct bench_backend *b, const struct bench_args *a,
                             size_t bytes, size_t count, const double *sec, int64_t wrong)
{
	char t[32], w[32];
	printf("%12zu  %12zu  %8s  %6s", bytes, count, bench_row_type(a), bench_row_redop(a));
	for (int k = 0; k < b->nalgos; k++) {
		bench_format_time(t, sizeof t, sec[k] * 1e6);
		printf("  %8s", t);
	}
	int au = bench_auto_index(b), best = bench_best_fixed(b, sec);
	if (au >= 0 && best >= 0)
		printf("  %6s  %9.2f", b->algos[best], sec[best] > 0 ? sec[au] / sec[best] : 0.0);
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("  %6s\n", w);
	fflush(stdout);
}

void bench_print_mems_row(const struct bench_args *a, size_t bytes, size_t count, const double *sec,
                          const double *busbw, int64_t wrong)
{
	char t[2][32], w[32], r[32];
	for (int m = 0; m < 2; m++)
		bench_format_time(t[m], sizeof t[m], sec[m] * 1e6);
	if (busbw[0] > 0)
		snprintf(r, sizeof r, "%9.2f", busbw[1] / busbw[0]);
	else
		snprintf(r, sizeof r, "%9s", "-");
	if (a->check)
		snprintf(w, sizeof w, "%6lld", (long long)wrong);
	else
		snprintf(w, sizeof w, "%6s", "N/A");
	printf("%12zu  %12zu  %8s  %6s  %10s  %10.2f  %10s  %10.2f  %9s  %6s\n", bytes, count,
	       bench_row_type(a), bench_row_redop(a), t[0], busbw[0], t[1], busbw[1], r, w);
	fflush(stdout);
}

void bench_human_size(char *out, size_t len, size_t bytes)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(out, len, v == (double)(size_t)v ? "%.0f %s" : "%.1f %s", v, units[u]);
}

void bench_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

void bench_csv_field(FILE *f, const char *s)
{
	if (!strpbrk(s, ",\"\n")) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"')
			fputc('"', f);
		fputc(*s, f);
	}
	fputc('"', f);
}
