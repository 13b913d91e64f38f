/*
 * mem_check.h -- a memory backend's reduce (collectives/mem.h) against the CPU kernels, as
 * test_mem.c (the emulated device) and test_cuda_mem.c (a GPU) both check it.
 *
 * The caller fills a and b, runs mem_check_reduce for each op and layout, and compares got
 * with want its own way: bit for bit on the emulated device, which runs the CPU kernels;
 * NaN against any NaN on a GPU (values_first_mismatch). Header only, without Criterion
 * (tsan_mem builds test_mem.c without it).
 */
#ifndef KHOR_TESTS_MEM_CHECK_H
#define KHOR_TESTS_MEM_CHECK_H

#include "collectives/mem.h"
#include "collectives/reduce.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct mem_check {
	const kmem_backend *be;
	size_t bytes;
	void *da, *db, *dout;              /* device memory, bytes each */
	unsigned char *a, *b, *want, *got; /* host memory, bytes (+ 1) each */
} mem_check;

static inline void mem_check_free(mem_check *m)
{
	if (m->da != NULL)
		m->be->dev_free(m->da);
	if (m->db != NULL)
		m->be->dev_free(m->db);
	if (m->dout != NULL)
		m->be->dev_free(m->dout);
	free(m->a);
	free(m->b);
	free(m->want);
	free(m->got);
	memset(m, 0, sizeof(*m));
}

/* Buffers of bytes each, on be's device and on the host; on failure, none and why in err. */
static inline khor_status mem_check_alloc(mem_check *m, const kmem_backend *be, size_t bytes,
                                          kerr *err)
{
	khor_status st;

	memset(m, 0, sizeof(*m));
	m->be = be;
	m->bytes = bytes;
	m->a = malloc(bytes + 1);
	m->b = malloc(bytes + 1);
	m->want = malloc(bytes + 1);
	m->got = malloc(bytes + 1);
	if (m->a == NULL || m->b == NULL || m->want == NULL || m->got == NULL) {
		mem_check_free(m);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "malloc of 4 x %zu B failed", bytes);
	}
	if ((st = be->dev_alloc(bytes, &m->da, err)) != KHOR_SUCCESS ||
	    (st = be->dev_alloc(bytes, &m->db, err)) != KHOR_SUCCESS ||
	    (st = be->dev_alloc(bytes, &m->dout, err)) != KHOR_SUCCESS)
		mem_check_free(m);
	return st;
}

/*
 * want := op of a and b (count elements of dtype d) by the CPU kernels, then avg's
 * division by avg_n; got := the same by the backend on stream s, a and b copied to da and
 * db, the result in da (in_place) or in dout (zeroed first, so a stale result shows), read
 * back. The status of the first call that failed, with why in err.
 */
static inline khor_status mem_check_reduce(mem_check *m, void *s, size_t count, khor_dtype d,
                                           khor_op op, bool in_place, int avg_n, kerr *err)
{
	const kmem_backend *be = m->be;
	size_t bytes = count * kdtype_size(d);
	void *out = in_place ? m->da : m->dout;
	khor_status st;

	reduce_kernel(d, op)(m->want, m->a, m->b, count);
	if (op == KHOR_AVG)
		reduce_avg_finish(m->want, count, d, avg_n);
	if ((st = be->copy(m->da, m->a, bytes, s, err)) != KHOR_SUCCESS ||
	    (st = be->copy(m->db, m->b, bytes, s, err)) != KHOR_SUCCESS ||
	    (st = be->memset_zero(m->dout, bytes, s, err)) != KHOR_SUCCESS ||
	    (st = be->reduce(out, m->da, m->db, count, d, op, s, err)) != KHOR_SUCCESS)
		return st;
	if (op == KHOR_AVG && (st = be->avg_finish(out, count, d, avg_n, s, err)) != KHOR_SUCCESS)
		return st;
	if ((st = be->copy(m->got, out, bytes, s, err)) != KHOR_SUCCESS)
		return st;
	return kmem_stream_sync(be, s, kdeadline_in_ms(30000), "mem_check_reduce", err);
}

#endif
