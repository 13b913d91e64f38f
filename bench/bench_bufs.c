/*
 * bench_bufs.c -- the buffers of one memory kind (host, or a program's device memory): allocated at
 * an offset past a page boundary, filled and checked through host copies outside the timed calls.
 */
/* clock_gettime and posix_memalign, also under a strict -std=c11. */
#define _POSIX_C_SOURCE 200809L

#include "bench_bufs.h"
#include "bench_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *bench_alloc(size_t bytes, size_t offset, void **base)
{
	size_t len = bytes + offset > 4096 ? bytes + offset : 4096;
	void *p = NULL;

	*base = NULL;
	if (posix_memalign(&p, 4096, len))
		return NULL;
	*base = p;
	memset(p, 0, len); /* fault every page in now, not in the first timed loop */
	return (char *)p + offset;
}

/* ---- buffers of one memory kind ---------------------------------------------------------- */

void bench_bufs_free(struct bench_bufs *u)
{
	for (int i = 0; i < 2; i++) {
		if (u->mem && u->dev_base[i])
			u->mem->free(u->mem, u->dev_base[i]);
		free(u->host_base[i]);
		u->dev_base[i] = u->host_base[i] = NULL;
	}
}

int bench_bufs_alloc(const struct bench_backend *b, const struct bench_mem *mem, size_t send_bytes,
                     size_t recv_bytes, size_t offset, struct bench_bufs *u)
{
	*u = (struct bench_bufs){.mem = mem, .send_bytes = send_bytes, .recv_bytes = recv_bytes};
	u->hsend = bench_alloc(send_bytes, offset, &u->host_base[0]);
	u->hrecv = bench_alloc(recv_bytes, offset, &u->host_base[1]);
	if (!u->hsend || !u->hrecv) {
		fprintf(stderr,
		        "%s: rank %d: cannot allocate %zu + %zu bytes of host memory; lower "
		        "-e\n",
		        b->prog, b->rank, send_bytes, recv_bytes);
		return -1;
	}
	if (!mem) {
		u->send = u->hsend;
		u->recv = u->hrecv;
		return 0;
	}
	char why[512] = "";
	for (int i = 0; i < 2; i++) {
		size_t bytes = i ? recv_bytes : send_bytes;
		size_t len = bytes + offset > 4096 ? bytes + offset : 4096;
		u->dev_base[i] = mem->alloc(mem, len, why, sizeof why);
		if (!u->dev_base[i]) {
			fprintf(stderr, "%s: rank %d: cannot allocate %zu bytes of %s memory: %s\n",
			        b->prog, b->rank, len, mem->name, why);
			return -1;
		}
	}
	u->send = (char *)u->dev_base[0] + offset;
	u->recv = (char *)u->dev_base[1] + offset;
	return 0;
}

int bench_bufs_fill(const struct bench_backend *b, const struct bench_args *a,
                    const struct bench_shape *s, const struct bench_bufs *u)
{
	char why[512] = "";
	size_t esize = bench_dtype_size(a->dtype);

	a->coll->fill(b, a, s, u->hsend, u->hrecv);
	if (!u->mem)
		return 0;
	if (u->mem->put(u->mem, u->send, u->hsend, s->send * esize, why, sizeof why) ||
	    u->mem->put(u->mem, u->recv, u->hrecv, s->recv * esize, why, sizeof why)) {
		fprintf(stderr, "%s: rank %d: copying the inputs to %s memory failed: %s\n",
		        b->prog, b->rank, u->mem->name, why);
		return -1;
	}
	return 0;
}

int bench_bufs_check(const struct bench_backend *b, const struct bench_args *a,
                     const struct bench_shape *s, const struct bench_bufs *u, int64_t *wrong)
{
	char why[512] = "";

	if (u->mem && u->mem->get(u->mem, u->hrecv, u->recv, s->recv * bench_dtype_size(a->dtype),
	                          why, sizeof why)) {
		fprintf(stderr, "%s: rank %d: copying the result from %s memory failed: %s\n",
		        b->prog, b->rank, u->mem->name, why);
		return -1;
	}
	*wrong += a->coll->check(b, a, s, u->hrecv);
	return 0;
}
