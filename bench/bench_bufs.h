/*
 * bench_bufs.h -- the buffers of one memory kind: page-offset allocation, fill and check through
 * host copies.
 */
#ifndef KHOR_BENCH_BENCH_BUFS_H
#define KHOR_BENCH_BENCH_BUFS_H

#include "bench.h"

#include <stdint.h>

/*
 * A buffer of bytes starting offset bytes past a page boundary (--offset); *base gets what
 * to free. At least one page, so that a zero-size run still has valid pointers.
 */
void *bench_alloc(size_t bytes, size_t offset, void **base);

/*
 * A send and a receive buffer of one kind: send and recv are what the calls get; hsend and
 * hrecv are where the CPU writes and reads the patterns (the same buffers for host memory,
 * host copies for a device kind).
 */
struct bench_bufs {
	const struct bench_mem *mem; /* NULL: host memory */
	void *send, *recv;
	void *hsend, *hrecv;
	size_t send_bytes, recv_bytes;
	void *dev_base[2], *host_base[2]; /* what to free */
};

void bench_bufs_free(struct bench_bufs *u);

/* 0, or -1 after saying why on stderr (bench_bufs_free undoes what was done either way). */
int bench_bufs_alloc(const struct bench_backend *b, const struct bench_mem *mem, size_t send_bytes,
                     size_t recv_bytes, size_t offset, struct bench_bufs *u);

/* The collective's fill, then the inputs and the sentinels copied to the device: 0 or -1. */
int bench_bufs_fill(const struct bench_backend *b, const struct bench_args *a,
                    const struct bench_shape *s, const struct bench_bufs *u);

/* The output copied back and checked: adds the wrong elements to *wrong; 0 or -1. */
int bench_bufs_check(const struct bench_backend *b, const struct bench_args *a,
                     const struct bench_shape *s, const struct bench_bufs *u, int64_t *wrong);

#endif
