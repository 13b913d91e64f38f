/*
 * reduce.c -- the CPU reduction kernels (semantics in reduce.h).
 *
 * One macro writes each (type, op) loop so that every kernel has the same shape, and the
 * vectoriser sees a simple loop it can vectorise although dst may alias an input (GCC's
 * runtime alias check accepts dst == a, an element-wise loop has no carried dependency).
 * Each kernel is cloned for AVX-512, AVX2 and the x86-64 baseline; the dynamic loader picks
 * one by CPU. Clones are off under ASan/TSan, whose runtimes are not ready when the loader
 * runs the clones' ifunc resolvers.
 *
 * f16 and bf16 are converted with integer bit tricks written without branches, so that the
 * conversions vectorise too (bf16 is a truncated f32, its conversions cost a shift and an
 * add). The f16 ones are exhaustively bit-identical to x86's F16C instructions. But GCC 12
 * neither vectorises _Float16 conversions nor generates good code for the bit tricks
 * (f16 ~1.4 GB/s against ~17 GB/s with F16C in L1; bf16 ~4.5 against ~13), so both have
 * a hand-written AVX2 path (F16C for f16) chosen at run time; the portable loops stay for
 * other CPUs and as the tests' reference, and give the same bits.
 *
 * Float min/max select with compares rather than fminf: fminf drops NaN, and we want NaN
 * to propagate and the same answer from every ISA.
 */
#include "reduce.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define KERNEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define HAVE_CLONES 1
#else
#define KERNEL_CLONES
#define HAVE_CLONES 0
#endif

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
/*
 * Integer product: 1u first so that types narrower than int multiply as unsigned int; plain
 * uint16_t operands would be promoted to int, and 65535 * 65535 overflows it (undefined).
 */
#define OP_WPROD(x, y) (1u * (x) * (y))
#define OP_MIN(x, y) ((y) < (x) ? (y) : (x))
#define OP_MAX(x, y) ((y) > (x) ? (y) : (x))
/* b when it is smaller or NaN, else a: NaN from either side wins. `|` keeps it branch-free. */
/* A bitwise | on purpose: no branch, so the loops vectorise (the int casts tell clang so). */
#define OP_FMIN(x, y) ((((int)((y) < (x))) | ((int)((y) != (y)))) ? (y) : (x))
#define OP_FMAX(x, y) ((((int)((y) > (x))) | ((int)((y) != (y)))) ? (y) : (x))

static inline uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* All ones where c is true: a branch-free select the vectoriser keeps as a blend. */
static inline uint32_t select_u32(uint32_t c, uint32_t yes, uint32_t no)
{
	uint32_t m = -c;

	return (yes & m) | (no & ~m);
}

/*
 * f16 -> f32. Shifting exponent and mantissa into place and multiplying by 2^112 rebiases
 * normals and normalises subnormals in one exact multiply; Inf/NaN then get the all-ones
 * exponent back, and NaN its quiet bit (as vcvtph2ps does).
 */
static inline float f16_widen(uint16_t h)
{
	uint32_t mag = (uint32_t)(h & 0x7fff);
	uint32_t u = f32_bits(bits_f32(mag << 13) * 0x1p112f);

	u |= select_u32(mag >= 0x7c00, 0x7f800000u, 0);
	u |= select_u32(mag > 0x7c00, 0x00400000u, 0);
	return bits_f32(u | (uint32_t)(h & 0x8000) << 16);
}

/*
 * f32 -> f16, round to nearest even. Normals: rebias and add half an ulp minus one plus the
 * kept mantissa's lowest bit, then truncate (the classic integer RNE). Results below 2^-14
 * come out subnormal: adding 0.5f puts the f16 subnormal ulp (2^-24) at the last bit of
 * the f32 mantissa, and the FPU's own rounding is RNE. Overflow becomes Inf; NaN keeps its
 * top payload bits and is quietened, as vcvtps2ph does.
 */
static inline uint16_t f16_round(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t sign = (u >> 16) & 0x8000;
	uint32_t a = u & 0x7fffffffu;
	uint32_t sub = f32_bits(bits_f32(a) + 0.5f) - 0x3f000000u;
	uint32_t nrm = (a + 0xc8000fffu + ((a >> 13) & 1)) >> 13;
	uint32_t big = select_u32(a > 0x7f800000u, 0x7e00 | ((a >> 13) & 0x3ff), 0x7c00);
	uint32_t o = select_u32(a < 0x38800000u, sub, nrm);

	o = select_u32(a >= 0x47800000u, big, o);
	return (uint16_t)(o | sign);
}

static inline float bf16_widen(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

/* f32 -> bf16, round to nearest even; NaN is truncated and quietened so it stays NaN. */
static inline uint16_t bf16_round(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
	uint32_t nan = (u >> 16) | 0x0040;

	return (uint16_t)select_u32((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

float reduce_f16_to_f32(uint16_t h) { return f16_widen(h); }
uint16_t reduce_f32_to_f16(float f) { return f16_round(f); }
float reduce_bf16_to_f32(uint16_t h) { return bf16_widen(h); }
uint16_t reduce_f32_to_bf16(float f) { return bf16_round(f); }

#define DEFINE_KERNEL(name, T, OP)                                              \
	KERNEL_CLONES static void name(void *dst, const void *a, const void *b, \
	                               size_t count)                             \
	{                                                                       \
		T *d = dst;                                                     \
		const T *x = a, *y = b;                                         \
		for (size_t i = 0; i < count; i++)                              \
			d[i] = OP(x[i], y[i]);                                  \
	}

#define DEFINE_HALF_KERNEL(name, WIDEN, ROUND, OP)                              \
	KERNEL_CLONES static void name(void *dst, const void *a, const void *b, \
	                               size_t count)                             \
	{                                                                       \
		uint16_t *d = dst;                                              \
		const uint16_t *x = a, *y = b;                                  \
		for (size_t i = 0; i < count; i++) {                            \
			float xf = WIDEN(x[i]), yf = WIDEN(y[i]);               \
			d[i] = ROUND(OP(xf, yf));                               \
		}                                                               \
	}

/* Integer sum and product wrap: do them on the unsigned twin so overflow is defined. */
#define DEFINE_INT_TYPE(sfx, T, UT)             \
	DEFINE_KERNEL(sum_##sfx, UT, OP_SUM)    \
	DEFINE_KERNEL(prod_##sfx, UT, OP_WPROD) \
	DEFINE_KERNEL(min_##sfx, T, OP_MIN)     \
	DEFINE_KERNEL(max_##sfx, T, OP_MAX)

#define DEFINE_FLOAT_TYPE(sfx, T)               \
	DEFINE_KERNEL(sum_##sfx, T, OP_SUM)     \
	DEFINE_KERNEL(prod_##sfx, T, OP_PROD)   \
	DEFINE_KERNEL(min_##sfx, T, OP_FMIN)    \
	DEFINE_KERNEL(max_##sfx, T, OP_FMAX)

#define DEFINE_HALF_TYPE(sfx, WIDEN, ROUND)                      \
	DEFINE_HALF_KERNEL(sum_##sfx, WIDEN, ROUND, OP_SUM)      \
	DEFINE_HALF_KERNEL(prod_##sfx, WIDEN, ROUND, OP_PROD)    \
	DEFINE_HALF_KERNEL(min_##sfx, WIDEN, ROUND, OP_FMIN)     \
	DEFINE_HALF_KERNEL(max_##sfx, WIDEN, ROUND, OP_FMAX)

DEFINE_FLOAT_TYPE(f32, float)
DEFINE_FLOAT_TYPE(f64, double)
DEFINE_HALF_TYPE(f16, f16_widen, f16_round)
DEFINE_HALF_TYPE(bf16, bf16_widen, bf16_round)
DEFINE_INT_TYPE(i8, int8_t, uint8_t)
DEFINE_INT_TYPE(u8, uint8_t, uint8_t)
DEFINE_INT_TYPE(i16, int16_t, uint16_t)
DEFINE_INT_TYPE(i32, int32_t, uint32_t)
DEFINE_INT_TYPE(i64, int64_t, uint64_t)

#define ROW(sfx) { sum_##sfx, sum_##sfx, min_##sfx, max_##sfx, prod_##sfx }

/* Indexed by khor_dtype then khor_op (sum, avg, min, max, prod). Bool is not reduced. */
static const reduce_fn portable[][5] = {
	[KHOR_FLOAT32] = ROW(f32),
	[KHOR_FLOAT64] = ROW(f64),
	[KHOR_INT32] = ROW(i32),
	[KHOR_INT64] = ROW(i64),
	[KHOR_FLOAT16] = ROW(f16),
	[KHOR_BFLOAT16] = ROW(bf16),
	[KHOR_INT8] = ROW(i8),
	[KHOR_UINT8] = ROW(u8),
	[KHOR_INT16] = ROW(i16),
};

#if defined(__x86_64__)
/*
 * The AVX2+F16C path for f16: eight lanes per conversion instruction, two vectors per
 * iteration for the load ports; the tail uses the scalar conversions, which give the same
 * bits. Rounding comes from the immediate (nearest even), not from MXCSR.
 */
#define AVX2_TARGET __attribute__((target("avx2")))
#define F16C_TARGET __attribute__((target("avx2,f16c")))

AVX2_TARGET static inline __m256 v_sum(__m256 x, __m256 y) { return _mm256_add_ps(x, y); }
AVX2_TARGET static inline __m256 v_prod(__m256 x, __m256 y) { return _mm256_mul_ps(x, y); }

/* Same selection as OP_FMIN/OP_FMAX: take y where y is smaller (larger) or NaN. */
AVX2_TARGET static inline __m256 v_min(__m256 x, __m256 y)
{
	__m256 take_y = _mm256_or_ps(_mm256_cmp_ps(y, x, _CMP_LT_OQ), _mm256_cmp_ps(y, y, _CMP_UNORD_Q));

	return _mm256_blendv_ps(x, y, take_y);
}

AVX2_TARGET static inline __m256 v_max(__m256 x, __m256 y)
{
	__m256 take_y = _mm256_or_ps(_mm256_cmp_ps(y, x, _CMP_GT_OQ), _mm256_cmp_ps(y, y, _CMP_UNORD_Q));

	return _mm256_blendv_ps(x, y, take_y);
}

F16C_TARGET static inline __m256 load_f16x8(const uint16_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

F16C_TARGET static inline void store_f16x8(uint16_t *p, __m256 v)
{
	_mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

#define DEFINE_F16C_KERNEL(name, VOP, OP)                                            \
	F16C_TARGET static void name(void *dst, const void *a, const void *b,        \
	                             size_t count)                                    \
	{                                                                            \
		uint16_t *d = dst;                                                   \
		const uint16_t *x = a, *y = b;                                       \
		size_t i = 0;                                                        \
		for (; i + 16 <= count; i += 16) {                                   \
			__m256 lo = VOP(load_f16x8(x + i), load_f16x8(y + i));       \
			__m256 hi = VOP(load_f16x8(x + i + 8), load_f16x8(y + i + 8)); \
			store_f16x8(d + i, lo);                                      \
			store_f16x8(d + i + 8, hi);                                  \
		}                                                                    \
		for (; i < count; i++)                                               \
			d[i] = f16_round(OP(f16_widen(x[i]), f16_widen(y[i])));      \
	}

DEFINE_F16C_KERNEL(sum_f16c, v_sum, OP_SUM)
DEFINE_F16C_KERNEL(prod_f16c, v_prod, OP_PROD)
DEFINE_F16C_KERNEL(min_f16c, v_min, OP_FMIN)
DEFINE_F16C_KERNEL(max_f16c, v_max, OP_FMAX)

static const reduce_fn f16c_row[5] = ROW(f16c);

/*
 * The AVX2 path for bf16. Interleaving zero words below each bf16 (unpack) widens sixteen
 * values in two instructions, and packing the rounded top halves back (packus) undoes the
 * unpack's in-lane order, so no cross-lane shuffle is needed; GCC's own code for the
 * portable loop zero-extends, shifts and permutes, at about a third of the speed.
 */
AVX2_TARGET static inline __m256i bf16_round_v(__m256 v)
{
	__m256i u = _mm256_castps_si256(v);
	__m256i top = _mm256_srli_epi32(u, 16);
	__m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
	__m256i rounded = _mm256_srli_epi32(
		_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
	__m256i nan = _mm256_or_si256(top, _mm256_set1_epi32(0x0040));

	return _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

#define DEFINE_BF16_AVX2_KERNEL(name, VOP, OP)                                         \
	AVX2_TARGET static void name(void *dst, const void *a, const void *b,          \
	                             size_t count)                                      \
	{                                                                              \
		uint16_t *d = dst;                                                     \
		const uint16_t *x = a, *y = b;                                         \
		const __m256i zero = _mm256_setzero_si256();                           \
		size_t i = 0;                                                          \
		for (; i + 16 <= count; i += 16) {                                     \
			__m256i vx = _mm256_loadu_si256((const __m256i *)(x + i));     \
			__m256i vy = _mm256_loadu_si256((const __m256i *)(y + i));     \
			__m256 lo = VOP(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vx)), \
			                _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vy))); \
			__m256 hi = VOP(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vx)), \
			                _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vy))); \
			_mm256_storeu_si256((__m256i *)(d + i),                        \
			                    _mm256_packus_epi32(bf16_round_v(lo), bf16_round_v(hi))); \
		}                                                                      \
		for (; i < count; i++)                                                 \
			d[i] = bf16_round(OP(bf16_widen(x[i]), bf16_widen(y[i])));     \
	}

DEFINE_BF16_AVX2_KERNEL(sum_bf16avx2, v_sum, OP_SUM)
DEFINE_BF16_AVX2_KERNEL(prod_bf16avx2, v_prod, OP_PROD)
DEFINE_BF16_AVX2_KERNEL(min_bf16avx2, v_min, OP_FMIN)
DEFINE_BF16_AVX2_KERNEL(max_bf16avx2, v_max, OP_FMAX)

static const reduce_fn bf16avx2_row[5] = ROW(bf16avx2);

AVX2_TARGET static void avg_finish_bf16avx2(uint16_t *p, size_t count, float n)
{
	const __m256i zero = _mm256_setzero_si256();
	__m256 vn = _mm256_set1_ps(n);
	size_t i = 0;

	for (; i + 16 <= count; i += 16) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(p + i));
		__m256 lo = _mm256_div_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)), vn);
		__m256 hi = _mm256_div_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)), vn);
		__m256i packed = _mm256_packus_epi32(bf16_round_v(lo), bf16_round_v(hi));
		_mm256_storeu_si256((__m256i *)(p + i), packed);
	}
	for (; i < count; i++)
		p[i] = bf16_round(bf16_widen(p[i]) / n);
}

F16C_TARGET static void avg_finish_f16c(uint16_t *p, size_t count, float n)
{
	__m256 vn = _mm256_set1_ps(n);
	size_t i = 0;

	for (; i + 8 <= count; i += 8)
		store_f16x8(p + i, _mm256_div_ps(load_f16x8(p + i), vn));
	for (; i < count; i++)
		p[i] = f16_round(f16_widen(p[i]) / n);
}

static bool cpu_has_avx2(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
}

/* CPUID leaf 1, ECX bit 29: clang 14's __builtin_cpu_supports does not know "f16c". */
static bool cpu_has_f16c(void)
{
	unsigned a, b, c, d;
	return cpu_has_avx2() && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#else
static bool cpu_has_avx2(void)
{
	return false;
}

static bool cpu_has_f16c(void)
{
	return false;
}
#endif

reduce_fn reduce_kernel_portable(khor_dtype dtype, khor_op op)
{
	if ((unsigned)dtype >= sizeof(portable) / sizeof(portable[0]) || (unsigned)op > KHOR_PROD)
		return NULL;
	return portable[dtype][op];
}

reduce_fn reduce_kernel(khor_dtype dtype, khor_op op)
{
#if defined(__x86_64__)
	if (dtype == KHOR_FLOAT16 && (unsigned)op <= KHOR_PROD && cpu_has_f16c())
		return f16c_row[op];
	if (dtype == KHOR_BFLOAT16 && (unsigned)op <= KHOR_PROD && cpu_has_avx2())
		return bf16avx2_row[op];
#endif
	return reduce_kernel_portable(dtype, op);
}

bool reduce_supported(khor_dtype dtype, khor_op op)
{
	return reduce_kernel(dtype, op) != NULL;
}

void reduce_isa(char *out, size_t len)
{
	const char *clones = "no clones (sanitizer or non-x86 build)";
	const char *halves = cpu_has_f16c() ? "f16: avx2+f16c, bf16: avx2"
	                     : cpu_has_avx2() ? "f16: portable, bf16: avx2"
	                                      : "f16 and bf16: portable";

#if HAVE_CLONES
	__builtin_cpu_init();
	clones = __builtin_cpu_supports("avx512f") ? "avx512f clones"
	         : __builtin_cpu_supports("avx2") ? "avx2 clones"
	                                          : "baseline clones";
#endif
	snprintf(out, len, "%s, %s", clones, halves);
}

#define DEFINE_AVG_FINISH(name, T, DIV_T)                        \
	KERNEL_CLONES static void name(T *p, size_t count, int n) \
	{                                                         \
		DIV_T div = (DIV_T)n;                             \
		for (size_t i = 0; i < count; i++)                \
			p[i] = (T)(p[i] / div);                   \
	}

#define DEFINE_HALF_AVG_FINISH(name, WIDEN, ROUND)                      \
	KERNEL_CLONES static void name(uint16_t *p, size_t count, int n) \
	{                                                                \
		float div = (float)n;                                    \
		for (size_t i = 0; i < count; i++)                       \
			p[i] = ROUND(WIDEN(p[i]) / div);                 \
	}

DEFINE_AVG_FINISH(avg_f32, float, float)
DEFINE_AVG_FINISH(avg_f64, double, double)
DEFINE_AVG_FINISH(avg_i32, int32_t, int32_t)
DEFINE_AVG_FINISH(avg_i64, int64_t, int64_t)
DEFINE_AVG_FINISH(avg_i8, int8_t, int32_t)
DEFINE_AVG_FINISH(avg_u8, uint8_t, int32_t)
DEFINE_AVG_FINISH(avg_i16, int16_t, int32_t)
DEFINE_HALF_AVG_FINISH(avg_f16, f16_widen, f16_round)
DEFINE_HALF_AVG_FINISH(avg_bf16, bf16_widen, bf16_round)

void reduce_avg_finish(void *buf, size_t count, khor_dtype dtype, int n)
{
	if (n <= 1)
		return;
	switch (dtype) {
	case KHOR_FLOAT32: avg_f32(buf, count, n); break;
	case KHOR_FLOAT64: avg_f64(buf, count, n); break;
	case KHOR_INT32: avg_i32(buf, count, n); break;
	case KHOR_INT64: avg_i64(buf, count, n); break;
	case KHOR_INT8: avg_i8(buf, count, n); break;
	case KHOR_UINT8: avg_u8(buf, count, n); break;
	case KHOR_INT16: avg_i16(buf, count, n); break;
	case KHOR_BFLOAT16:
#if defined(__x86_64__)
		if (cpu_has_avx2()) {
			avg_finish_bf16avx2(buf, count, (float)n);
			break;
		}
#endif
		avg_bf16(buf, count, n);
		break;
	case KHOR_FLOAT16:
#if defined(__x86_64__)
		if (cpu_has_f16c()) {
			avg_finish_f16c(buf, count, (float)n);
			break;
		}
#endif
		avg_f16(buf, count, n);
		break;
	case KHOR_BOOL:
		break;
	}
}

void reduce_scale(void *p, size_t count, khor_dtype dt, double f)
{
	if (f == 1.0 || count == 0)
		return;
	switch (dt) {
	case KHOR_FLOAT32: {
		float *v = p, g = (float)f;
		for (size_t i = 0; i < count; i++)
			v[i] *= g;
		break;
	}
	case KHOR_FLOAT64: {
		double *v = p;
		for (size_t i = 0; i < count; i++)
			v[i] *= f;
		break;
	}
	case KHOR_FLOAT16: {
		uint16_t *v = p;
		for (size_t i = 0; i < count; i++)
			v[i] = reduce_f32_to_f16(reduce_f16_to_f32(v[i]) * (float)f);
		break;
	}
	case KHOR_BFLOAT16: {
		uint16_t *v = p;
		for (size_t i = 0; i < count; i++)
			v[i] = reduce_f32_to_bf16(reduce_bf16_to_f32(v[i]) * (float)f);
		break;
	}
	default:
		break; /* integers and bool: the engine refuses scale factors for them */
	}
}
