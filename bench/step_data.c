/*
 * step_data.c -- the gradient sets of a step (ResNet-50's tensors, small ones, the tiny negotiation
 * set), their pattern and its check, and the error reports every mode shares.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "resnet50_sizes.h"
#include "step_data.h"
#include "bench_bufs.h"
#include "bench_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const step_set_names[STEP_NSETS] = {"resnet50", "small"};
const int step_set_gap_us[STEP_NSETS] = {50, 0};

/* ---- gradient sets and their data --------------------------------------------------------- */

void step_set_free(struct step_set *s)
{
	free(s->ndim);
	free(s->dims);
	free(s->count);
	free(s->offset);
	free(s->names);
	free(s->base);
	memset(s, 0, sizeof(*s));
}

int step_set_make(struct step_set *s, int kind)
{
	static const char *const names[] = {"resnet50", "small", "tiny"};
	int n = kind == 0 ? RESNET50_NTENSORS : kind == 1 ? STEP_SMALL_TENSORS : STEP_TINY_TENSORS;

	memset(s, 0, sizeof(*s));
	s->name = names[kind];
	s->n = n;
	s->gap_us = kind < STEP_NSETS ? step_set_gap_us[kind] : 0;
	s->ndim = calloc((size_t)n, sizeof(*s->ndim));
	s->dims = calloc((size_t)n, sizeof(*s->dims));
	s->count = calloc((size_t)n, sizeof(*s->count));
	s->offset = calloc((size_t)n, sizeof(*s->offset));
	s->names = calloc((size_t)n, sizeof(*s->names));
	if (!s->ndim || !s->dims || !s->count || !s->offset || !s->names)
		goto fail_free;
	for (int i = 0; i < n; i++) {
		if (kind == 0) {
			s->ndim[i] = resnet50_tensors[i].ndim;
			memcpy(s->dims[i], resnet50_tensors[i].dims, sizeof(s->dims[i]));
		} else {
			s->ndim[i] = 1;
			s->dims[i][0] = kind == 1 ? STEP_SMALL_COUNT : STEP_TINY_COUNT;
		}
		size_t count = 1;
		for (int d = 0; d < s->ndim[i]; d++)
			count *= (size_t)s->dims[i][d];
		s->count[i] = count;
		s->offset[i] = s->total;
		s->total += count;
		snprintf(s->names[i], sizeof(s->names[i]), "grad/%d", i);
	}
	s->buf = bench_alloc(s->total * sizeof(float), 0, &s->base);
	if (!s->buf)
		goto fail_free;
	return 0;
fail_free:
	step_set_free(s);
	return -1;
}

int step_tables(struct step_ctx *x)
{
	x->period = bench_period(x->a->op, BENCH_F32, x->size);
	x->fill_tab = malloc(x->period * sizeof(float));
	x->want_tab = malloc(x->period * sizeof(double));
	if (!x->fill_tab || !x->want_tab)
		return -1;
	for (size_t k = 0; k < x->period; k++) {
		x->fill_tab[k] = (float)bench_pattern(x->a->op, BENCH_F32, x->rank, x->size, k);
		x->want_tab[k] = bench_expected(x->a->op, BENCH_F32, x->size, k);
	}
	return 0;
}

void step_fill(const struct step_ctx *x, float *buf, size_t count)
{
	for (size_t i = 0, k = 0; i < count; i++) {
		buf[i] = x->fill_tab[k];
		if (++k == x->period)
			k = 0;
	}
}

int64_t step_check(const struct step_ctx *x, const float *buf, size_t count)
{
	int64_t wrong = 0;
	for (size_t i = 0, k = 0; i < count; i++) {
		wrong += bench_mismatch(x->a->op, BENCH_F32, buf[i], x->want_tab[k]);
		if (++k == x->period)
			k = 0;
	}
	return wrong;
}

void step_refill(const struct step_ctx *x, float *buf, size_t count, int it)
{
	if (x->a->check || (x->a->op == BENCH_SUM && it % STEP_REFILL == 0))
		step_fill(x, buf, count);
}

/* ---- errors ------------------------------------------------------------------------------- */

int step_fail(const struct step_ctx *x, const char *what, const char *why)
{
	fprintf(stderr, STEP_PROG ": rank %d: %s failed: %s\n", x->rank, what, why);
	return -1;
}

int step_fail_comm(const struct step_ctx *x, const char *what, khor_comm *comm, khor_status st)
{
	const char *text = khor_comm_error(comm);
	return step_fail(x, what, text && *text ? text : khor_strerror(st));
}

int step_fail_engine(const struct step_ctx *x, const char *what, const khor_engine *e,
                     khor_status st)
{
	const char *text = e ? khor_engine_error(e) : NULL;
	return step_fail(x, what, text && *text ? text : khor_strerror(st));
}

int step_barrier(const struct step_ctx *x)
{
	khor_status st = khor_barrier(x->world);
	return st == KHOR_SUCCESS ? 0 : step_fail_comm(x, "barrier before a step", x->world, st);
}
