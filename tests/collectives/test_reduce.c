/*
 * test_reduce.c -- the CPU reduction kernels against a double-precision reference.
 *
 * Every dtype x op on random data salted with edge values (NaN, +-Inf, -0, subnormals,
 * largest finite values, integer min/max so sums and products wrap), out of place and in
 * place on either input, at lengths that leave every kind of vector tail (0, 1, 7, 33,
 * 1000003) and from misaligned starts. Both the kernels dispatched for this CPU and the
 * portable ones run, so a machine with AVX2/F16C checks the hand-written paths against the
 * same reference as the compiler-vectorised loops.
 *
 * The reference computes in double and rounds f16/bf16 with its own scalar code (frexp and
 * nearbyint), not the kernels' bit tricks. That the kernels, which compute in f32 and round
 * once, must match it bit for bit follows from f32 having more than 2p+2 bits for both half
 * formats (double rounding is then innocuous). NaN results are compared as "is NaN".
 */
#include "collectives/reduce.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const khor_dtype all_dtypes[] = { KHOR_FLOAT32, KHOR_FLOAT64, KHOR_FLOAT16, KHOR_BFLOAT16,
	                                 KHOR_INT8,    KHOR_UINT8,   KHOR_INT16,   KHOR_INT32,
	                                 KHOR_INT64 };
static const khor_op kernel_ops[] = { KHOR_SUM, KHOR_MIN, KHOR_MAX, KHOR_PROD };
static const size_t lengths[] = { 0, 1, 7, 33, 1000003 };

static const char *dtype_name(khor_dtype d)
{
	static const char *const names[] = { "f32", "f64", "i32", "i64", "f16", "bf16", "i8", "u8", "bool", "i16" };
	return (unsigned)d < sizeof(names) / sizeof(names[0]) ? names[d] : "?";
}

static const char *op_name(khor_op op)
{
	static const char *const names[] = { "sum", "avg", "min", "max", "prod" };
	return (unsigned)op < 5 ? names[op] : "?";
}

static size_t esize(khor_dtype d)
{
	switch (d) {
	case KHOR_FLOAT64: case KHOR_INT64: return 8;
	case KHOR_FLOAT32: case KHOR_INT32: return 4;
	case KHOR_FLOAT16: case KHOR_BFLOAT16: case KHOR_INT16: return 2;
	default: return 1;
	}
}

static bool is_float(khor_dtype d)
{
	return d == KHOR_FLOAT32 || d == KHOR_FLOAT64 || d == KHOR_FLOAT16 || d == KHOR_BFLOAT16;
}

/* xorshift64*: reproducible data without depending on the libc's rand. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* Reference half formats: mbits mantissa bits, ebits exponent bits. */

static double ref_half_to_double(uint16_t h, int mbits, int ebits)
{
	int bias = (1 << (ebits - 1)) - 1;
	unsigned e = (h >> mbits) & ((1u << ebits) - 1);
	unsigned m = h & ((1u << mbits) - 1);
	double sign = (h >> (mbits + ebits)) & 1 ? -1.0 : 1.0;

	if (e == (1u << ebits) - 1)
		return m != 0 ? NAN : sign * INFINITY;
	if (e == 0)
		return sign * ldexp((double)m, 1 - bias - mbits);
	return sign * ldexp((double)(m | 1u << mbits), (int)e - bias - mbits);
}

/* Round to nearest even; NaN gives the canonical quiet NaN (callers compare NaN-ness). */
static uint16_t ref_double_to_half(double x, int mbits, int ebits)
{
	int bias = (1 << (ebits - 1)) - 1;
	uint16_t sign = signbit(x) ? (uint16_t)(1u << (mbits + ebits)) : 0;
	uint16_t inf = (uint16_t)(((1u << ebits) - 1) << mbits);
	double ax = fabs(x);

	if (isnan(x))
		return (uint16_t)(inf | 1u << (mbits - 1));
	if (isinf(x))
		return sign | inf;
	if (ax < ldexp(1.0, 1 - bias)) /* subnormal or zero: a multiple of the smallest step */
		return sign | (uint16_t)nearbyint(ldexp(ax, bias - 1 + mbits));
	int e = ilogb(ax);
	double q = nearbyint(ldexp(ax, mbits - e));
	if (q == ldexp(1.0, mbits + 1)) {
		q /= 2;
		e++;
	}
	if (e > bias)
		return sign | inf;
	return sign | (uint16_t)((unsigned)(e + bias) << mbits | ((unsigned)q - (1u << mbits)));
}

static double ref_f16(uint16_t h) { return ref_half_to_double(h, 10, 5); }
static double ref_bf16(uint16_t h) { return ref_half_to_double(h, 7, 8); }
static uint16_t ref_to_f16(double x) { return ref_double_to_half(x, 10, 5); }
static uint16_t ref_to_bf16(double x) { return ref_double_to_half(x, 7, 8); }

/* Element access by dtype. */

static uint64_t bits_at(const void *p, size_t i, khor_dtype d)
{
	uint64_t v = 0;
	memcpy(&v, (const char *)p + i * esize(d), esize(d)); /* little-endian x86/arm */
	return v;
}

static void set_bits(void *p, size_t i, khor_dtype d, uint64_t v)
{
	memcpy((char *)p + i * esize(d), &v, esize(d));
}

/* Float value of element bits (floats and halves only). */
static double fvalue(uint64_t bits, khor_dtype d)
{
	switch (d) {
	case KHOR_FLOAT32: { float f; uint32_t u = (uint32_t)bits; memcpy(&f, &u, 4); return f; }
	case KHOR_FLOAT64: { double f; memcpy(&f, &bits, 8); return f; }
	case KHOR_FLOAT16: return ref_f16((uint16_t)bits);
	case KHOR_BFLOAT16: return ref_bf16((uint16_t)bits);
	default: return 0;
	}
}

/* Bits of a double value rounded to dtype d (floats and halves). */
static uint64_t fbits(double x, khor_dtype d)
{
	switch (d) {
	case KHOR_FLOAT32: { float f = (float)x; uint32_t u; memcpy(&u, &f, 4); return u; }
	case KHOR_FLOAT64: { uint64_t u; memcpy(&u, &x, 8); return u; }
	case KHOR_FLOAT16: return ref_to_f16(x);
	case KHOR_BFLOAT16: return ref_to_bf16(x);
	default: return 0;
	}
}

static bool bits_are_nan(uint64_t bits, khor_dtype d)
{
	return is_float(d) && isnan(fvalue(bits, d));
}

static int64_t sext(uint64_t bits, khor_dtype d)
{
	switch (d) {
	case KHOR_INT8: return (int8_t)bits;
	case KHOR_INT16: return (int16_t)bits;
	case KHOR_INT32: return (int32_t)bits;
	case KHOR_INT64: return (int64_t)bits;
	default: return (int64_t)bits; /* u8: already zero-extended */
	}
}

static uint64_t width_mask(khor_dtype d)
{
	return esize(d) == 8 ? ~0ull : (1ull << (8 * esize(d))) - 1;
}

/* The expected bits of a (op) b. */
static uint64_t expect(uint64_t xa, uint64_t xb, khor_dtype d, khor_op op)
{
	if (is_float(d)) {
		double x = fvalue(xa, d), y = fvalue(xb, d), r;
		switch (op) {
		case KHOR_SUM: r = x + y; break;
		case KHOR_PROD: r = x * y; break;
		case KHOR_MIN: r = (y < x || isnan(y)) ? y : x; break;
		default: r = (y > x || isnan(y)) ? y : x; break;
		}
		return fbits(r, d);
	}
	int64_t x = sext(xa, d), y = sext(xb, d);
	switch (op) {
	case KHOR_SUM: return (xa + xb) & width_mask(d);
	case KHOR_PROD: return (xa * xb) & width_mask(d);
	case KHOR_MIN: return (uint64_t)(y < x ? y : x) & width_mask(d);
	default: return (uint64_t)(y > x ? y : x) & width_mask(d);
	}
}

static bool same(uint64_t want, uint64_t got, khor_dtype d)
{
	return want == got || (bits_are_nan(want, d) && bits_are_nan(got, d));
}

/* Test data. */

static uint64_t edge_value(khor_dtype d)
{
	static const uint16_t f16[] = { 0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff,
		                        0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01, 0x3c00, 0x3c01, 0x1000,
		                        0x1400, 0x0200 };
	static const uint16_t bf16[] = { 0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f,
		                         0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff, 0x3f80, 0x3f81, 0x3b80,
		                         0x3b00, 0x0040 };
	static const uint32_t f32[] = { 0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00800000,
		                        0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000,
		                        0x7f800001, 0xffffffff, 0x3f800000, 0x3f800001, 0x33800000,
		                        0x34000000, 0x00400000 };
	static const uint64_t f64[] = { 0, 0x8000000000000000ull, 1, 0x800fffffffffffffull,
		                        0x0010000000000000ull, 0x7fefffffffffffffull, 0xffefffffffffffffull,
		                        0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull,
		                        0x7ff0000000000001ull, 0x3ff0000000000000ull, 0x3ca0000000000000ull };
	static const int64_t ints[] = { 0, 1, -1, 2, -2, INT64_MIN, INT64_MAX, INT32_MIN, INT32_MAX,
		                        INT16_MIN, INT16_MAX, INT8_MIN, INT8_MAX, 255, 0x10000, 3 };
	uint64_t r = rng();

	switch (d) {
	case KHOR_FLOAT16: return f16[r % (sizeof(f16) / sizeof(f16[0]))];
	case KHOR_BFLOAT16: return bf16[r % (sizeof(bf16) / sizeof(bf16[0]))];
	case KHOR_FLOAT32: return f32[r % (sizeof(f32) / sizeof(f32[0]))];
	case KHOR_FLOAT64: return f64[r % (sizeof(f64) / sizeof(f64[0]))];
	default: return (uint64_t)ints[r % (sizeof(ints) / sizeof(ints[0]))] & width_mask(d);
	}
}

/*
 * A third random bit patterns (every class, NaN payloads included), a third edge values,
 * a third values of a few neighbouring magnitudes so that sums and products round often
 * instead of one operand swamping the other.
 */
static uint64_t random_value(khor_dtype d)
{
	uint64_t r = rng();

	switch (r % 3) {
	case 0: return r >> 2 & width_mask(d);
	case 1: return edge_value(d);
	default:
		if (!is_float(d))
			return (uint64_t)((int64_t)(r >> 40 & 0xff) - 128) & width_mask(d);
		double m = (double)(r >> 11 & 0xffffff) / 0x1p24 + 0.5;
		return fbits(ldexp((r >> 10 & 1) ? -m : m, (int)(r >> 4 & 7) - 3), d);
	}
}

static void *alloc_elems(size_t n, khor_dtype d)
{
	void *p = malloc((n + 4) * esize(d));
	cr_assert_not_null(p);
	return p;
}

static void fill_random(void *p, size_t n, khor_dtype d)
{
	for (size_t i = 0; i < n; i++)
		set_bits(p, i, d, random_value(d));
}

/* The kernel check. */

enum alias { OUT_OF_PLACE, DST_IS_A, DST_IS_B };

/* Runs fn over (a, b) in the given aliasing and compares every element with want. */
static void check_kernel(reduce_fn fn, const char *path, khor_dtype d, khor_op op, size_t n,
                         const void *a0, const void *b0, const uint64_t *want, enum alias mode)
{
	size_t sz = esize(d);
	char *abuf = alloc_elems(n, d), *bbuf = alloc_elems(n, d), *obuf = alloc_elems(n, d);
	/* Misaligned starts: a at element 1, b at element 3, a separate dst at element 2. */
	char *a = abuf + sz, *b = bbuf + 3 * sz, *dst;

	memcpy(a, a0, n * sz);
	memcpy(b, b0, n * sz);
	dst = mode == DST_IS_A ? a : mode == DST_IS_B ? b : obuf + 2 * sz;
	if (mode == OUT_OF_PLACE)
		memset(dst, 0x5a, n * sz); /* poison: an unwritten element fails */

	fn(dst, a, b, n);

	for (size_t i = 0; i < n; i++) {
		uint64_t got = bits_at(dst, i, d);
		if (!same(want[i], got, d)) {
			cr_expect_fail("%s %s %s n=%zu %s: element %zu: a=%#llx b=%#llx want %#llx got %#llx",
			        path, dtype_name(d), op_name(op), n,
			        mode == OUT_OF_PLACE ? "out of place" : mode == DST_IS_A ? "dst=a" : "dst=b",
			        i, (unsigned long long)bits_at(a0, i, d), (unsigned long long)bits_at(b0, i, d),
			        (unsigned long long)want[i], (unsigned long long)got);
			break;
		}
	}
	if (mode != DST_IS_B) /* the other input must be untouched */
		cr_expect(memcmp(b, b0, n * sz) == 0, "%s %s %s: b was modified", path, dtype_name(d),
		          op_name(op));
	free(abuf);
	free(bbuf);
	free(obuf);
}

static void check_dtype(khor_dtype d)
{
	for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++) {
		size_t n = lengths[l];
		void *a = alloc_elems(n, d), *b = alloc_elems(n, d);
		uint64_t *want = malloc((n + 1) * sizeof(*want));

		cr_assert_not_null(want);
		fill_random(a, n, d);
		fill_random(b, n, d);
		for (size_t o = 0; o < sizeof(kernel_ops) / sizeof(kernel_ops[0]); o++) {
			khor_op op = kernel_ops[o];
			for (size_t i = 0; i < n; i++)
				want[i] = expect(bits_at(a, i, d), bits_at(b, i, d), d, op);
			for (int m = OUT_OF_PLACE; m <= DST_IS_B; m++) {
				check_kernel(reduce_kernel(d, op), "dispatched", d, op, n, a, b, want,
				             (enum alias)m);
				check_kernel(reduce_kernel_portable(d, op), "portable", d, op, n, a, b, want,
				             (enum alias)m);
			}
		}
		/* avg runs the sum kernel; reduce_avg_finish is checked on its own below. */
		cr_expect(reduce_kernel(d, KHOR_AVG) == reduce_kernel(d, KHOR_SUM));
		free(a);
		free(b);
		free(want);
	}
}

Test(reduce, f32) { check_dtype(KHOR_FLOAT32); }
Test(reduce, f64) { check_dtype(KHOR_FLOAT64); }
Test(reduce, f16) { check_dtype(KHOR_FLOAT16); }
Test(reduce, bf16) { check_dtype(KHOR_BFLOAT16); }
Test(reduce, i8) { check_dtype(KHOR_INT8); }
Test(reduce, u8) { check_dtype(KHOR_UINT8); }
Test(reduce, i16) { check_dtype(KHOR_INT16); }
Test(reduce, i32) { check_dtype(KHOR_INT32); }
Test(reduce, i64) { check_dtype(KHOR_INT64); }

/* avg finish. */

static uint64_t expect_avg(uint64_t x, khor_dtype d, int n)
{
	if (is_float(d))
		return fbits(fvalue(x, d) / n, d);
	if (d == KHOR_UINT8)
		return (x / (uint64_t)n) & width_mask(d);
	return (uint64_t)(sext(x, d) / n) & width_mask(d); /* C division truncates toward zero */
}

Test(reduce, avg_finish)
{
	static const int ranks[] = { 1, 2, 3, 7, 1000 };

	for (size_t t = 0; t < sizeof(all_dtypes) / sizeof(all_dtypes[0]); t++) {
		khor_dtype d = all_dtypes[t];
		for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++) {
			size_t n = lengths[l];
			char *buf = alloc_elems(n, d), *orig = alloc_elems(n, d);
			for (size_t r = 0; r < sizeof(ranks) / sizeof(ranks[0]); r++) {
				char *p = buf + esize(d); /* misaligned start */
				fill_random(orig, n, d);
				memcpy(p, orig, n * esize(d));
				reduce_avg_finish(p, n, d, ranks[r]);
				for (size_t i = 0; i < n; i++) {
					uint64_t x = bits_at(orig, i, d), got = bits_at(p, i, d);
					uint64_t want = ranks[r] == 1 ? x : expect_avg(x, d, ranks[r]);
					if (!same(want, got, d)) {
						cr_expect_fail("avg %s n=%zu ranks=%d: element %zu: %#llx -> "
						               "want %#llx got %#llx",
						        dtype_name(d), n, ranks[r], i, (unsigned long long)x,
						        (unsigned long long)want, (unsigned long long)got);
						break;
					}
				}
			}
			free(buf);
			free(orig);
		}
	}
}

/* Conversions and rounding, bit for bit. */

static uint32_t f32bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bitsf32(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* A NaN result must be NaN, quiet, with the input's sign. */
static bool half_nan_ok(uint16_t r, uint32_t in, int mbits)
{
	uint16_t expo = (uint16_t)(0x7fff & ~((1u << mbits) - 1));
	return (r & expo) == expo && (r & 1u << (mbits - 1)) != 0 && (r >> 15) == (in >> 31);
}

Test(reduce, widen_every_half)
{
	for (uint32_t h = 0; h < 0x10000; h++) {
		double f16 = ref_f16((uint16_t)h), bf16 = ref_bf16((uint16_t)h);
		float k16 = reduce_f16_to_f32((uint16_t)h), kb16 = reduce_bf16_to_f32((uint16_t)h);
		if (isnan(f16))
			cr_expect(isnan(k16) && (f32bits(k16) & 0x00400000), "f16 %#x: want quiet NaN", h);
		else
			cr_expect(f32bits(k16) == f32bits((float)f16), "f16 %#x: want %a got %a", h, f16, k16);
		if (isnan(bf16))
			cr_expect(isnan(kb16), "bf16 %#x: want NaN", h);
		else
			cr_expect(f32bits(kb16) == f32bits((float)bf16), "bf16 %#x: want %a got %a", h, bf16,
			          kb16);
	}
}

/*
 * Every sign/exponent/kept-mantissa prefix of an f32, combined with the dropped bits that
 * decide rounding: zero, the smallest, just below half, exactly half, just above half, all.
 */
static void check_rounding(int mbits, uint16_t (*kernel)(float), uint16_t (*ref)(double),
                           const char *name)
{
	int drop = 23 - mbits;
	uint32_t half = 1u << (drop - 1), all = (1u << drop) - 1;
	uint32_t lows[] = { 0, 1, half - 1, half, half + 1, all };
	int bad = 0;

	for (uint32_t prefix = 0; prefix < 1u << (32 - drop) && bad < 10; prefix++) {
		for (size_t k = 0; k < sizeof(lows) / sizeof(lows[0]); k++) {
			uint32_t u = prefix << drop | lows[k];
			float f = bitsf32(u);
			uint16_t got = kernel(f);
			bool ok = isnan(f) ? half_nan_ok(got, u, mbits) : got == ref((double)f);
			if (!ok && bad++ < 10)
				cr_expect_fail("%s(%#010x = %a): want %#06x got %#06x", name, u, (double)f,
				        isnan(f) ? 0 : ref((double)f), got);
		}
	}
}

Test(reduce, round_to_f16) { check_rounding(10, reduce_f32_to_f16, ref_to_f16, "f32->f16"); }
Test(reduce, round_to_bf16) { check_rounding(7, reduce_f32_to_bf16, ref_to_bf16, "f32->bf16"); }

/* The rounding cases a reader would check by hand, through the kernels themselves. */
Test(reduce, half_rounding_by_hand)
{
	static const struct { khor_dtype d; khor_op op; uint16_t a, b, want; } cases[] = {
		{ KHOR_FLOAT16, KHOR_SUM, 0x3c00, 0x1000, 0x3c00 },  /* 1 + 2^-11: tie to even 1 */
		{ KHOR_FLOAT16, KHOR_SUM, 0x3c01, 0x1000, 0x3c02 },  /* tie, odd: rounds up */
		{ KHOR_FLOAT16, KHOR_SUM, 0x7bff, 0x4c00, 0x7c00 },  /* 65504 + 16 = 65520: tie -> Inf */
		{ KHOR_FLOAT16, KHOR_SUM, 0x7bff, 0x4800, 0x7bff },  /* 65504 + 8: below the tie */
		{ KHOR_FLOAT16, KHOR_PROD, 0x0001, 0x3800, 0x0000 }, /* 2^-24 * 0.5: tie to 0 */
		{ KHOR_FLOAT16, KHOR_PROD, 0x0003, 0x3800, 0x0002 }, /* 1.5 ulps: tie to even 2 */
		{ KHOR_FLOAT16, KHOR_SUM, 0x8000, 0x0000, 0x0000 },  /* -0 + +0 = +0 */
		{ KHOR_FLOAT16, KHOR_SUM, 0x8000, 0x8000, 0x8000 },  /* -0 + -0 = -0 */
		{ KHOR_FLOAT16, KHOR_SUM, 0x7c00, 0xfc00, 0x7e00 },  /* Inf - Inf = NaN */
		{ KHOR_FLOAT16, KHOR_MIN, 0x3c00, 0x7e00, 0x7e00 },  /* NaN propagates */
		{ KHOR_FLOAT16, KHOR_MAX, 0x7e00, 0x3c00, 0x7e00 },
		{ KHOR_BFLOAT16, KHOR_SUM, 0x3f80, 0x3b80, 0x3f80 }, /* 1 + 2^-8: tie to even 1 */
		{ KHOR_BFLOAT16, KHOR_SUM, 0x3f81, 0x3b80, 0x3f82 },
		{ KHOR_BFLOAT16, KHOR_SUM, 0x7f7f, 0x7f7f, 0x7f80 }, /* overflow -> Inf */
		{ KHOR_BFLOAT16, KHOR_MIN, 0x7fff, 0x3f80, 0x7fff }, /* NaN with all payload bits */
		{ KHOR_BFLOAT16, KHOR_SUM, 0xffff, 0x3f80, 0xffff },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		for (int portable = 0; portable < 2; portable++) {
			reduce_fn fn = portable ? reduce_kernel_portable(cases[i].d, cases[i].op)
			                        : reduce_kernel(cases[i].d, cases[i].op);
			/* 17 copies so the vector body runs, not only the scalar tail. */
			uint16_t a[17], b[17], out[17];
			for (int k = 0; k < 17; k++) {
				a[k] = cases[i].a;
				b[k] = cases[i].b;
			}
			fn(out, a, b, 17);
			for (int k = 0; k < 17; k += 16) {
				bool nan = bits_are_nan(cases[i].want, cases[i].d);
				cr_expect(nan ? bits_are_nan(out[k], cases[i].d) : out[k] == cases[i].want,
				          "case %zu (%s, element %d): %#06x %s %#06x: want %#06x got %#06x", i,
				          portable ? "portable" : "dispatched", k, cases[i].a,
				          op_name(cases[i].op), cases[i].b, cases[i].want, out[k]);
			}
		}
	}
}

Test(reduce, supported)
{
	for (size_t t = 0; t < sizeof(all_dtypes) / sizeof(all_dtypes[0]); t++)
		for (int op = KHOR_SUM; op <= KHOR_PROD; op++)
			cr_expect(reduce_supported(all_dtypes[t], (khor_op)op), "%s %s", dtype_name(all_dtypes[t]),
			          op_name((khor_op)op));
	cr_expect(!reduce_supported(KHOR_BOOL, KHOR_SUM));
	cr_expect(!reduce_supported(KHOR_FLOAT32, (khor_op)5));
	cr_expect(!reduce_supported((khor_dtype)99, KHOR_SUM));
	cr_expect(reduce_kernel_portable((khor_dtype)-1, KHOR_SUM) == NULL);
}
