/*
 * bbuf.h -- growable byte buffers and bounded readers: what the cycle's messages, descriptors
 * and error sentences are written with and read back from. A writer that runs out of memory
 * only marks itself (oom), a reader that runs past its end marks itself (bad) and reads
 * zeros, so a caller checks once at the end.
 */
#ifndef KHOR_ENGINE_BBUF_H
#define KHOR_ENGINE_BBUF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


typedef struct bbuf {
	uint8_t *p;
	size_t len, cap;
	bool oom;
} bbuf;

static inline void bput(bbuf *b, const void *v, size_t n)
{
	if (b->oom || n == 0)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap < 256 ? 256 : b->cap;
		while (cap < b->len + n)
			cap *= 2;
		uint8_t *p = realloc(b->p, cap);
		if (p == NULL) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, v, n);
	b->len += n;
}

static inline void bput_u8(bbuf *b, uint8_t v) { bput(b, &v, 1); }
static inline void bput_u16(bbuf *b, uint16_t v) { bput(b, &v, 2); }
static inline void bput_u32(bbuf *b, uint32_t v) { bput(b, &v, 4); }
static inline void bput_i32(bbuf *b, int32_t v) { bput(b, &v, 4); }
static inline void bput_u64(bbuf *b, uint64_t v) { bput(b, &v, 8); }
static inline void bput_f64(bbuf *b, double v) { bput(b, &v, 8); }

typedef struct brd {
	const uint8_t *p;
	size_t len, off;
	bool bad;
} brd;

static inline bool bget(brd *r, void *v, size_t n)
{
	if (r->bad || r->off + n > r->len) {
		r->bad = true;
		memset(v, 0, n);
		return false;
	}
	memcpy(v, r->p + r->off, n);
	r->off += n;
	return true;
}

static inline uint8_t bget_u8(brd *r) { uint8_t v; bget(r, &v, 1); return v; }
static inline uint16_t bget_u16(brd *r) { uint16_t v; bget(r, &v, 2); return v; }
static inline uint32_t bget_u32(brd *r) { uint32_t v; bget(r, &v, 4); return v; }
static inline int32_t bget_i32(brd *r) { int32_t v; bget(r, &v, 4); return v; }
static inline uint64_t bget_u64(brd *r) { uint64_t v; bget(r, &v, 8); return v; }
static inline double bget_f64(brd *r) { double v; bget(r, &v, 8); return v; }

/* printf onto b (one piece of at most 1 KiB). */
void bbuf_printf(bbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "0, 1, 3" */
void bbuf_rank_list(bbuf *b, const int *ranks, int n);

#endif
