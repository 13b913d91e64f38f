/*
 * checksum.c -- kchecksum (checksum.h). The lanes are GCC/Clang vector extensions: the
 * same loop is compiled twice, for AVX2 and for the baseline (two SSE2 adds a step), and
 * the first call picks one by the CPU.
 */
#include "checksum.h"

#include <string.h>

typedef uint64_t kv4 __attribute__((vector_size(32)));

#define LANES_BODY                                                                            \
	kv4 a = *s1, b = *s2;                                                                 \
	for (size_t i = 0; i < n; i++) {                                                      \
		kv4 w;                                                                        \
		memcpy(&w, p + 32 * i, sizeof(w));                                            \
		a += w;                                                                       \
		b += a;                                                                       \
	}                                                                                     \
	*s1 = a;                                                                              \
	*s2 = b;

static void lanes_base(const unsigned char *p, size_t n, kv4 *s1, kv4 *s2)
{
	LANES_BODY
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static void lanes_avx2(const unsigned char *p, size_t n,
                                                       kv4 *s1, kv4 *s2)
{
	LANES_BODY
}
#endif

typedef void (*lanes_fn)(const unsigned char *, size_t, kv4 *, kv4 *);

static lanes_fn pick(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2"))
		return lanes_avx2;
#endif
	return lanes_base;
}

/* A bijection of 64-bit words (the finaliser of MurmurHash3's 64-bit variant, a fact). */
static uint64_t mix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

uint64_t kchecksum(const void *buf, size_t len)
{
	static lanes_fn lanes; /* a race here writes the same pointer twice */
	const unsigned char *p = buf;
	kv4 s1 = { 1, 2, 3, 4 }, s2 = { 0, 0, 0, 0 };
	size_t n = len / 32;

	lanes_fn f = __atomic_load_n(&lanes, __ATOMIC_RELAXED);
	if (f == NULL) {
		f = pick();
		__atomic_store_n(&lanes, f, __ATOMIC_RELAXED);
	}
	if (n > 0)
		f(p, n, &s1, &s2);
	if (len % 32 != 0) {
		unsigned char tail[32] = { 0 };
		memcpy(tail, p + 32 * n, len % 32);
		lanes_base(tail, 1, &s1, &s2);
	}
	uint64_t h = mix(len);
	for (int i = 0; i < 4; i++)
		h = mix(h ^ s1[i]) + s2[i];
	return mix(h);
}
