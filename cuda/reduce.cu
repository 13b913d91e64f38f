/*
 * reduce.cu -- the CUDA reduction and scaling kernels (semantics in reduce_cuda.h and
 * collectives/reduce.h).
 *
 * One kernel template serves every (type, op): each thread walks a grid-stride loop of
 * 16-byte vectors (uint4 loads and stores, unpacked into lanes of the element type), then
 * the same threads walk the scalar elements left over: a head peeled until the pointers
 * are 16-byte aligned and the tail after the last whole vector. When out, a and b are not
 * equally misaligned no peel can align them all, and every element goes the scalar way.
 * The loop is memory bound by design: one load per input, one store, a few ALU ops.
 *
 * f16 and bf16 use the CPU's branch-free integer conversions, copied from reduce.c,
 * rather than __half2float/__float2half_rn: those round the same way for numbers but
 * not for NaN (CUDA returns a canonical NaN, the CPU keeps the payload's top bits), and
 * every rank must compute the same bits whichever kind of memory it reduces in. The
 * float arithmetic in them (a multiply by 2^112, an add of 0.5f) is exact only with
 * subnormals kept, so this file must not be built with -ftz or --use_fast_math; --fmad=false
 * keeps nvcc from contracting anything into an FMA the CPU doesn't do.
 */
#include "reduce_cuda.h"

#include "khor.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 256;
constexpr int MAX_BLOCKS = 4096;
constexpr size_t VEC = 16;

__device__ __forceinline__ uint32_t f32_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float bits_f32(uint32_t u) { return __uint_as_float(u); }

__device__ __forceinline__ uint32_t select_u32(uint32_t c, uint32_t yes, uint32_t no)
{
	uint32_t m = 0u - c;

	return (yes & m) | (no & ~m);
}

/* reduce.c's f16_widen: exact, NaN quietened with its payload kept. */
__device__ __forceinline__ float f16_widen(uint16_t h)
{
	uint32_t mag = (uint32_t)(h & 0x7fff);
	uint32_t u = f32_bits(__fmul_rn(bits_f32(mag << 13), 0x1p112f));

	u |= select_u32(mag >= 0x7c00, 0x7f800000u, 0);
	u |= select_u32(mag > 0x7c00, 0x00400000u, 0);
	return bits_f32(u | (uint32_t)(h & 0x8000) << 16);
}

/* reduce.c's f16_round: nearest even, subnormals through the FPU's own rounding. */
__device__ __forceinline__ uint16_t f16_round(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t sign = (u >> 16) & 0x8000;
	uint32_t a = u & 0x7fffffffu;
	uint32_t sub = f32_bits(__fadd_rn(bits_f32(a), 0.5f)) - 0x3f000000u;
	uint32_t nrm = (a + 0xc8000fffu + ((a >> 13) & 1)) >> 13;
	uint32_t big = select_u32(a > 0x7f800000u, 0x7e00 | ((a >> 13) & 0x3ff), 0x7c00);
	uint32_t o = select_u32(a < 0x38800000u, sub, nrm);

	o = select_u32(a >= 0x47800000u, big, o);
	return (uint16_t)(o | sign);
}

__device__ __forceinline__ float bf16_widen(uint16_t h) { return bits_f32((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t bf16_round(float f)
{
	uint32_t u = f32_bits(f);
	uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
	uint32_t nan = (u >> 16) | 0x0040;

	return (uint16_t)select_u32((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

/* The ops on values, as reduce.c's OP_* macros; the _rn intrinsics pin the rounding. */
struct Sum {
	template <typename T> __device__ T operator()(T x, T y) const { return (T)(x + y); }
	__device__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
	__device__ double operator()(double x, double y) const { return __dadd_rn(x, y); }
};
struct Prod {
	/* Unsigned twins only (as OP_WPROD): 1u first so narrow types multiply unsigned. */
	template <typename T> __device__ T operator()(T x, T y) const { return (T)(1u * x * y); }
	__device__ float operator()(float x, float y) const { return __fmul_rn(x, y); }
	__device__ double operator()(double x, double y) const { return __dmul_rn(x, y); }
};
struct Min {
	template <typename T> __device__ T operator()(T x, T y) const { return y < x ? y : x; }
	__device__ float operator()(float x, float y) const { return ((y < x) | (y != y)) ? y : x; }
	__device__ double operator()(double x, double y) const { return ((y < x) | (y != y)) ? y : x; }
};
struct Max {
	template <typename T> __device__ T operator()(T x, T y) const { return y > x ? y : x; }
	__device__ float operator()(float x, float y) const { return ((y > x) | (y != y)) ? y : x; }
	__device__ double operator()(double x, double y) const { return ((y > x) | (y != y)) ? y : x; }
};

/* Element functors: T is the storage type the kernel moves. */
template <typename T, typename Op> struct Plain {
	typedef T type;
	__device__ T operator()(T x, T y) const { return Op()(x, y); }
};
template <typename Op> struct F16 {
	typedef uint16_t type;
	__device__ uint16_t operator()(uint16_t x, uint16_t y) const
	{
		return f16_round(Op()(f16_widen(x), f16_widen(y)));
	}
};
template <typename Op> struct BF16 {
	typedef uint16_t type;
	__device__ uint16_t operator()(uint16_t x, uint16_t y) const
	{
		return bf16_round(Op()(bf16_widen(x), bf16_widen(y)));
	}
};

/* avg's division, unary (y is ignored): Div is the type reduce_avg_finish divides in. */
template <typename T, typename Div> struct AvgInt {
	typedef T type;
	Div n;
	__device__ T operator()(T x, T) const { return (T)((Div)x / n); }
};
struct AvgF32 {
	typedef float type;
	float n;
	__device__ float operator()(float x, float) const { return __fdiv_rn(x, n); }
};
struct AvgF64 {
	typedef double type;
	double n;
	__device__ double operator()(double x, double) const { return __ddiv_rn(x, n); }
};
struct AvgF16 {
	typedef uint16_t type;
	float n;
	__device__ uint16_t operator()(uint16_t x, uint16_t) const { return f16_round(__fdiv_rn(f16_widen(x), n)); }
};
struct AvgBF16 {
	typedef uint16_t type;
	float n;
	__device__ uint16_t operator()(uint16_t x, uint16_t) const { return bf16_round(__fdiv_rn(bf16_widen(x), n)); }
};

/* The engine's pre- and postscale, unary like avg: reduce.c's reduce_scale, bit for bit. */
struct ScaleF32 {
	typedef float type;
	float f;
	__device__ float operator()(float x, float) const { return __fmul_rn(x, f); }
};
struct ScaleF64 {
	typedef double type;
	double f;
	__device__ double operator()(double x, double) const { return __dmul_rn(x, f); }
};
struct ScaleF16 {
	typedef uint16_t type;
	float f;
	__device__ uint16_t operator()(uint16_t x, uint16_t) const { return f16_round(__fmul_rn(f16_widen(x), f)); }
};
struct ScaleBF16 {
	typedef uint16_t type;
	float f;
	__device__ uint16_t operator()(uint16_t x, uint16_t) const { return bf16_round(__fmul_rn(bf16_widen(x), f)); }
};

template <typename T> union Vec {
	uint4 raw;
	T lane[VEC / sizeof(T)];
};

/*
 * Elements [head, head + nvec * lanes) go as vectors; [0, head) and the rest as scalars.
 * UNARY kernels (avg's division) do not read b.
 */
template <typename F, bool UNARY>
__global__ void __launch_bounds__(THREADS)
reduce_kernel(typename F::type *out, const typename F::type *a, const typename F::type *b,
              size_t count, size_t head, size_t nvec, F f)
{
	typedef typename F::type T;
	constexpr size_t lanes = VEC / sizeof(T);
	size_t stride = (size_t)gridDim.x * blockDim.x;
	size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint4 *vo = reinterpret_cast<uint4 *>(out + head);
	const uint4 *va = reinterpret_cast<const uint4 *>(a + head);
	const uint4 *vb = reinterpret_cast<const uint4 *>(b + head);

	for (size_t v = tid; v < nvec; v += stride) {
		Vec<T> x, y, r;

		x.raw = va[v];
		if (!UNARY)
			y.raw = vb[v];
#pragma unroll
		for (size_t k = 0; k < lanes; k++)
			r.lane[k] = f(x.lane[k], UNARY ? x.lane[k] : y.lane[k]);
		vo[v] = r.raw;
	}

	size_t tail = head + nvec * lanes;
	size_t nscalar = head + (count - tail);

	for (size_t s = tid; s < nscalar; s += stride) {
		size_t i = s < head ? s : tail + (s - head);

		out[i] = f(a[i], UNARY ? a[i] : b[i]);
	}
}

/* Set while khor_cuda_preload walks every kernel: launch loads instead of launching. */
thread_local bool preloading;

template <typename F, bool UNARY>
int launch(void *out, const void *a, const void *b, size_t count, F f, void *stream)
{
	typedef typename F::type T;
	constexpr size_t lanes = VEC / sizeof(T);
	uintptr_t po = (uintptr_t)out, pa = (uintptr_t)a, pb = UNARY ? pa : (uintptr_t)b;
	size_t mis = po % VEC, head = count, nvec = 0;

	if (preloading) {
		cudaFuncAttributes attr;
		return (int)cudaFuncGetAttributes(&attr, reduce_kernel<F, UNARY>);
	}
	if (count == 0)
		return cudaSuccess;
	if (pa % VEC == mis && pb % VEC == mis && mis % sizeof(T) == 0) {
		head = mis == 0 ? 0 : (VEC - mis) / sizeof(T);
		if (head > count)
			head = count;
		nvec = (count - head) / lanes;
	}

	size_t work = nvec > 0 ? nvec : count;
	size_t blocks = (work + THREADS - 1) / THREADS;

	if (blocks > MAX_BLOCKS)
		blocks = MAX_BLOCKS;
	reduce_kernel<F, UNARY><<<(unsigned)blocks, THREADS, 0, (cudaStream_t)stream>>>(
		(T *)out, (const T *)a, (const T *)(UNARY ? a : b), count, head, nvec, f);
	return (int)cudaGetLastError();
}

/* Integer types: sum and prod on the unsigned twin (defined wrap), min and max signed. */
template <typename T, typename UT>
int reduce_int(void *out, const void *a, const void *b, size_t count, int op, void *s)
{
	switch (op) {
	case KHOR_SUM:
	case KHOR_AVG: return launch<Plain<UT, Sum>, false>(out, a, b, count, Plain<UT, Sum>(), s);
	case KHOR_PROD: return launch<Plain<UT, Prod>, false>(out, a, b, count, Plain<UT, Prod>(), s);
	case KHOR_MIN: return launch<Plain<T, Min>, false>(out, a, b, count, Plain<T, Min>(), s);
	case KHOR_MAX: return launch<Plain<T, Max>, false>(out, a, b, count, Plain<T, Max>(), s);
	}
	return cudaErrorInvalidValue;
}

template <template <typename> class W>
int reduce_wrapped(void *out, const void *a, const void *b, size_t count, int op, void *s)
{
	switch (op) {
	case KHOR_SUM:
	case KHOR_AVG: return launch<W<Sum>, false>(out, a, b, count, W<Sum>(), s);
	case KHOR_PROD: return launch<W<Prod>, false>(out, a, b, count, W<Prod>(), s);
	case KHOR_MIN: return launch<W<Min>, false>(out, a, b, count, W<Min>(), s);
	case KHOR_MAX: return launch<W<Max>, false>(out, a, b, count, W<Max>(), s);
	}
	return cudaErrorInvalidValue;
}

template <typename Op> using F32 = Plain<float, Op>;
template <typename Op> using F64 = Plain<double, Op>;

} // namespace

extern "C" int khor_cuda_reduce_supported(int dtype, int op)
{
	if (op < KHOR_SUM || op > KHOR_PROD)
		return 0;
	switch (dtype) {
	case KHOR_FLOAT32: case KHOR_FLOAT64: case KHOR_FLOAT16: case KHOR_BFLOAT16:
	case KHOR_INT8: case KHOR_UINT8: case KHOR_INT16: case KHOR_INT32: case KHOR_INT64:
		return 1;
	}
	return 0;
}

extern "C" int khor_cuda_reduce(void *out, const void *a, const void *b, size_t count, int dtype,
                                int op, void *stream)
{
	if (!khor_cuda_reduce_supported(dtype, op))
		return cudaErrorInvalidValue;
	switch (dtype) {
	case KHOR_FLOAT32: return reduce_wrapped<F32>(out, a, b, count, op, stream);
	case KHOR_FLOAT64: return reduce_wrapped<F64>(out, a, b, count, op, stream);
	case KHOR_FLOAT16: return reduce_wrapped<F16>(out, a, b, count, op, stream);
	case KHOR_BFLOAT16: return reduce_wrapped<BF16>(out, a, b, count, op, stream);
	case KHOR_INT8: return reduce_int<int8_t, uint8_t>(out, a, b, count, op, stream);
	case KHOR_UINT8: return reduce_int<uint8_t, uint8_t>(out, a, b, count, op, stream);
	case KHOR_INT16: return reduce_int<int16_t, uint16_t>(out, a, b, count, op, stream);
	case KHOR_INT32: return reduce_int<int32_t, uint32_t>(out, a, b, count, op, stream);
	case KHOR_INT64: return reduce_int<int64_t, uint64_t>(out, a, b, count, op, stream);
	}
	return cudaErrorInvalidValue;
}

extern "C" int khor_cuda_avg_finish(void *buf, size_t count, int dtype, int n, void *stream)
{
	if (n <= 1)
		return cudaSuccess;
	switch (dtype) {
	case KHOR_FLOAT32: return launch<AvgF32, true>(buf, buf, buf, count, AvgF32{(float)n}, stream);
	case KHOR_FLOAT64: return launch<AvgF64, true>(buf, buf, buf, count, AvgF64{(double)n}, stream);
	case KHOR_FLOAT16: return launch<AvgF16, true>(buf, buf, buf, count, AvgF16{(float)n}, stream);
	case KHOR_BFLOAT16: return launch<AvgBF16, true>(buf, buf, buf, count, AvgBF16{(float)n}, stream);
	case KHOR_INT8: return launch<AvgInt<int8_t, int32_t>, true>(buf, buf, buf, count, AvgInt<int8_t, int32_t>{n}, stream);
	case KHOR_UINT8: return launch<AvgInt<uint8_t, int32_t>, true>(buf, buf, buf, count, AvgInt<uint8_t, int32_t>{n}, stream);
	case KHOR_INT16: return launch<AvgInt<int16_t, int32_t>, true>(buf, buf, buf, count, AvgInt<int16_t, int32_t>{n}, stream);
	case KHOR_INT32: return launch<AvgInt<int32_t, int32_t>, true>(buf, buf, buf, count, AvgInt<int32_t, int32_t>{n}, stream);
	case KHOR_INT64: return launch<AvgInt<int64_t, int64_t>, true>(buf, buf, buf, count, AvgInt<int64_t, int64_t>{(int64_t)n}, stream);
	case KHOR_BOOL: return cudaSuccess;
	}
	return cudaErrorInvalidValue;
}

extern "C" int khor_cuda_scale(void *buf, size_t count, int dtype, double factor, void *stream)
{
	/* As scale() on the CPU: a factor of 1 touches nothing (not even a NaN's payload). */
	if (factor == 1.0 || count == 0)
		return cudaSuccess;
	switch (dtype) {
	case KHOR_FLOAT32: return launch<ScaleF32, true>(buf, buf, buf, count, ScaleF32{(float)factor}, stream);
	case KHOR_FLOAT64: return launch<ScaleF64, true>(buf, buf, buf, count, ScaleF64{factor}, stream);
	case KHOR_FLOAT16: return launch<ScaleF16, true>(buf, buf, buf, count, ScaleF16{(float)factor}, stream);
	case KHOR_BFLOAT16: return launch<ScaleBF16, true>(buf, buf, buf, count, ScaleBF16{(float)factor}, stream);
	case KHOR_INT8: case KHOR_UINT8: case KHOR_INT16: case KHOR_INT32: case KHOR_INT64:
	case KHOR_BOOL:
		return cudaSuccess;
	}
	return cudaErrorInvalidValue;
}

/*
 * With lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) a kernel is
 * loaded at its first launch, which may wait for the whole context: behind an NCCL kernel
 * of another comm that waits for a peer, that is a deadlock. Loading them all up front,
 * once per context, takes that wait out of the collectives.
 */
extern "C" int khor_cuda_preload(void)
{
	int first = 0;

	preloading = true;
	for (int d = KHOR_FLOAT32; d <= KHOR_INT16 && first == 0; d++) {
		for (int op = KHOR_SUM; op <= KHOR_PROD && first == 0; op++)
			if (khor_cuda_reduce_supported(d, op))
				first = khor_cuda_reduce(NULL, NULL, NULL, 1, d, op, NULL);
		if (first == 0)
			first = khor_cuda_avg_finish(NULL, 1, d, 2, NULL);
		if (first == 0)
			first = khor_cuda_scale(NULL, 1, d, 2.0, NULL);
	}
	preloading = false;
	return first;
}
