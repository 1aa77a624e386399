// quant_cuda.cu: CUDA kernels and launchers of the quantize ops (fp16 / bf16 / fp32 input,
// fp8 e4m3fn or int8 output, float32 scales). Memory-bound: every kernel moves the input once
// from DRAM with 16-byte vector loads when the rows allow it (else element by element).
//
//   static fp8 / int8        elementwise, grid-stride over the matrix, scale read on the device
//   dynamic fp8 per tensor   memset + amax reduction (one atomic max per block on the float's
//                            bits, exact: non-negative floats order like their bit patterns),
//                            then the static pass; two kernels, no host synchronization
//   dynamic per token        one block per row; each thread keeps up to kRowCache vectors of the
//                            row in registers between the reduction and the quantize pass
//   group fp8                a power-of-two team of lanes per group, shuffle reduction
//
// The rounding rules are quant_math.h's, shared with the CPU build; fp8 is written through
// cutlass::float_e4m3_t (cvt.rn.satfinite on sm_89+), the CUTLASS dependency of this kernel.
#include "quant_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cutlass/fast_math.h>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

#include "dispatch.cuh"
#include "quant_math.h"

namespace quant {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // elementwise and group kernels
constexpr int kRowCache = 4;   // vectors per thread kept in registers by the per-token kernel
constexpr int kMaxRowThreads = 1024;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// V output bytes (fp8 or int8), stored in one access. For V a multiple of 4, `w` is the same
// bytes as 32-bit words (little-endian: byte i is byte i % 4 of w[i / 4]) for the fp8 path,
// which produces whole words: written byte by byte, the compiler splits and re-merges each.
template <int V, bool kWords = V % 4 == 0>
struct alignas(V) Bytes {
  uint8_t b[V];
};
template <int V>
struct alignas(V) Bytes<V, true> {
  union {
    uint8_t b[V];
    uint32_t w[V / 4];
  };
};

// Vector j (elements j*V .. j*V+V-1) of input row r.
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const Rows& m, int64_t r, int64_t j) {
  const T* row = static_cast<const T*>(m.input) + r * m.input_row_stride;
  return reinterpret_cast<const Vec<T, V>*>(row)[j];
}

template <int V>
__device__ __forceinline__ void store_vec(const Rows& m, int64_t r, int64_t j, const Bytes<V>& b) {
  uint8_t* row = static_cast<uint8_t*>(m.out) + r * m.out_row_stride;
  reinterpret_cast<Bytes<V>*>(row)[j] = b;
}

__device__ __forceinline__ uint8_t fp8_bits(float x) { return cutlass::float_e4m3_t(x).storage; }

// Two fp8 bytes (lo in the low byte) from two already clamped floats. Where CUTLASS converts with
// cvt.rn.satfinite.e4m3x2.f32 (CUDA_PTX_FP8_CVT_ENABLED, from cutlass/float8.h: sm_89+), it
// converts one element per instruction (the other input a dummy 0) in a volatile asm the
// compiler cannot schedule; the same instruction on a real pair halves the conversions (the
// conversion pipe is quarter rate, and with the divisions it bounds the fp8 kernels) and gives
// the same bits. Elsewhere, element by element through CUTLASS as before.
__device__ __forceinline__ uint16_t fp8x2_bits(float lo, float hi) {
#if defined(CUDA_PTX_FP8_CVT_ENABLED)
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint16_t>(fp8_bits(lo) | (static_cast<uint16_t>(fp8_bits(hi)) << 8));
#endif
}

// math::int8_rn_sat in one instruction: cvt.rni.sat.s8.f32 rounds half to even, saturates to
// [-128, 127] and turns NaN into 0, the documented rule. The portable form is rintf (FRND) and a
// float-to-int conversion, two quarter-rate instructions per element.
__device__ __forceinline__ int8_t int8_rn_sat(float v) {
  int32_t r;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(v));
  return static_cast<int8_t>(r);
}

// math::int8_rn_azp_sat with one conversion: cvt.rni.s32.f32 (__float2int_rn) rounds half to even,
// saturates to int32 and gives 0 for NaN, i.e. sat32(rn(v)); the zero point is then added and
// the sum saturated to int8 through math::add_azp_sat (32-bit, bounds from math::azp_clamp), as
// in quant_math.h. The portable form goes through rintf and a 64-bit conversion.
__device__ __forceinline__ int8_t int8_rn_azp_sat(float v, const math::AzpClamp& azp) {
  return math::add_azp_sat(__float2int_rn(v), azp);
}

// ---- element quantizers ----
//
// A quantizer scales an element, scale(x, exact), and finishes the scaled value: the clamped
// float for fp8 (kFp8: quantize() converts pairs of them) or the int8 byte. A division may take
// a fast path that clears `exact` where it could differ from the IEEE quotient; quantize() then
// redoes the whole vector with scale_ieee (rare: zero, subnormal, infinite or NaN operands,
// quotients beyond 2^+-50), so the result is always that of the IEEE division.

struct MulByScale {  // x * m: one rounding, no fast path needed
  float m;
  __device__ float scale(float x, bool&) const { return x * m; }
  __device__ float scale_ieee(float x) const { return x * m; }
};

// x / s, bit for bit, at FMA cost: math::div_by_const_fast with r = math::div_reciprocal(s),
// computed once per quantizer (per row, group or thread), instead of an IEEE division sequence
// (a reciprocal on the quarter-rate MUFU pipe, FCHK and five FMAs) per element. kBounded: the
// row or group passed math::quotients_bounded, so math::div_by_const_bounded needs no
// per-element test (three FMA-pipe operations); the quantized values are those of x / s, for
// fp8 (kFp8) once the sign of x is copied onto the quotient (the sign of a zero result).
template <bool kBounded, bool kFp8>
struct DivByScale {
  float s, r;
  __device__ explicit DivByScale(float scale) : s(scale), r(math::div_reciprocal(scale)) {}
  __device__ float scale(float x, bool& exact) const {
    if constexpr (kBounded) {
      const float q = math::div_by_const_bounded(x, s, r);
      return kFp8 ? copysignf(q, x) : q;
    }
    return math::div_by_const_fast(x, s, r, exact);
  }
  __device__ float scale_ieee(float x) const { return x / s; }
};

// y clamped to [-448, 448] for the fp8 conversion. Where every fp8 conversion here is
// cvt.rn.satfinite (CUDA_PTX_FP8_CVT_ENABLED: fp8x2_bits, and CUTLASS's for single elements),
// the conversion saturates by itself (beyond +-448, infinities included: +-448; NaN stays NaN),
// so the clamp is left to it: three instructions per element fewer, the same bits.
__device__ __forceinline__ float fp8_range(float y) {
#if defined(CUDA_PTX_FP8_CVT_ENABLED)
  return y;
#else
  return math::clamp_keep_nan(y, -math::kFp8Max, math::kFp8Max);
#endif
}

struct Fp8Mul : MulByScale {  // static and dynamic per tensor: x * (1 / scale)
  static constexpr bool kFp8 = true;
  __device__ explicit Fp8Mul(float inv) : MulByScale{inv} {}
  __device__ float finish(float y) const { return fp8_range(y); }
};
// Per token, and per group over the full range ([fp8_min, fp8_max] = [-448, 448]): x / scale,
// clamped to [-448, 448].
template <bool kBounded>
struct Fp8DivFullRange : DivByScale<kBounded, true> {
  static constexpr bool kFp8 = true;
  using DivByScale<kBounded, true>::DivByScale;
  __device__ float finish(float y) const { return fp8_range(y); }
};
template <bool kBounded>
struct Fp8Div : DivByScale<kBounded, true> {  // per group: x / scale, clamped to [fp8_min, fp8_max]
  static constexpr bool kFp8 = true;
  float lo, hi;
  __device__ Fp8Div(float scale, float lo_, float hi_)
      : DivByScale<kBounded, true>(scale), lo(lo_), hi(hi_) {}
  __device__ float finish(float y) const { return math::clamp_keep_nan(y, lo, hi); }
};
// Static int8, symmetric and with a zero point as two types (it was one with a runtime flag, so
// both paths were compiled into the loop).
struct Int8DivSym : DivByScale<false, false> {  // static: x / scale
  static constexpr bool kFp8 = false, kFinish4 = false;
  using DivByScale::DivByScale;
  __device__ uint8_t finish(float y) const { return static_cast<uint8_t>(int8_rn_sat(y)); }
};
template <bool kBounded = false>
struct Int8DivAzp : DivByScale<kBounded, false> {  // static: x / scale + azp
  static constexpr bool kFp8 = false, kFinish4 = false;
  math::AzpClamp azp;
  __device__ Int8DivAzp(float scale, int32_t zero_point)
      : DivByScale<kBounded, false>(scale), azp(math::azp_clamp(zero_point)) {}
  __device__ uint8_t finish(float y) const { return static_cast<uint8_t>(int8_rn_azp_sat(y, azp)); }
};
struct Int8Mul : MulByScale {  // dynamic symmetric: x * (127 / amax)
  static constexpr bool kFp8 = false, kFinish4 = false;
  __device__ explicit Int8Mul(float mul) : MulByScale{mul} {}
  __device__ uint8_t finish(float y) const { return static_cast<uint8_t>(int8_rn_sat(y)); }
};
// Dynamic asymmetric: x / s + azp; s == 0 (all-zero row): azp. A bounded row has s != 0 (its
// reciprocal is a number), so that test is left out there.
template <bool kBounded>
struct Int8Azp : Int8DivAzp<kBounded> {
  using Int8DivAzp<kBounded>::Int8DivAzp;
  __device__ uint8_t finish(float y) const {
    if constexpr (kBounded) return Int8DivAzp<kBounded>::finish(y);
    return this->s == 0.0f ? static_cast<uint8_t>(static_cast<int8_t>(this->azp.azp))
                           : Int8DivAzp<kBounded>::finish(y);
  }
};

// The asymmetric int8 quantizer of a row whose quotients stay below kInt8PackBound in magnitude:
// then rn(y) + azp fits in int32 (|azp| is at most about as large), so sat8(rn(y) + azp) is
// cvt.rni, a 32-bit add and cvt.pack.sat.s8 (which saturates two results and packs them into
// bytes in one instruction), instead of two IMNMX, an add and a byte permute per element.
constexpr float kInt8PackBound = 0x1p30f;
struct Int8AzpPacked : Int8Azp<true> {
  static constexpr bool kFinish4 = true;
  using Int8Azp<true>::Int8Azp;
  // Four int8 results as one little-endian word.
  __device__ uint32_t finish4(float y0, float y1, float y2, float y3) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 720
    const int32_t k0 = __float2int_rn(y0) + azp.azp, k1 = __float2int_rn(y1) + azp.azp;
    const int32_t k2 = __float2int_rn(y2) + azp.azp, k3 = __float2int_rn(y3) + azp.azp;
    uint32_t hi, w;  // cvt.pack.sat d, a, b, c: d = c << 16 | sat8(a) << 8 | sat8(b)
    asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, 0;" : "=r"(hi) : "r"(k3), "r"(k2));
    asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(w) : "r"(k1), "r"(k0), "r"(hi));
    return w;
#else
    return uint32_t{finish(y0)} | uint32_t{finish(y1)} << 8 | uint32_t{finish(y2)} << 16 |
           uint32_t{finish(y3)} << 24;
#endif
  }
};

template <typename T, int V, typename Q>
__device__ __forceinline__ Bytes<V> quantize(const Vec<T, V>& v, const Q& q) {
  float y[V];
  bool exact = true;
#pragma unroll
  for (int i = 0; i < V; ++i) y[i] = q.scale(to_float(v.v[i]), exact);
  if (!exact) {  // one test per vector: the fast path's checks cost no branch per element
#pragma unroll
    for (int i = 0; i < V; ++i) y[i] = q.scale_ieee(to_float(v.v[i]));
  }
  Bytes<V> out;
  if constexpr (Q::kFp8 && V % 4 == 0) {
    // Two converted pairs per 32-bit word: one byte permute per 4 elements instead of a mask,
    // shift and byte insert per element.
#pragma unroll
    for (int i = 0; i < V; i += 4) {
      const uint32_t lo = fp8x2_bits(q.finish(y[i]), q.finish(y[i + 1]));
      const uint32_t hi = fp8x2_bits(q.finish(y[i + 2]), q.finish(y[i + 3]));
      out.w[i / 4] = lo | (hi << 16);
    }
  } else if constexpr (Q::kFp8 && V % 2 == 0) {
#pragma unroll
    for (int i = 0; i < V; i += 2) {
      const uint16_t b = fp8x2_bits(q.finish(y[i]), q.finish(y[i + 1]));
      out.b[i] = static_cast<uint8_t>(b & 0xffu);
      out.b[i + 1] = static_cast<uint8_t>(b >> 8);
    }
  } else if constexpr (Q::kFp8) {
#pragma unroll
    for (int i = 0; i < V; ++i) out.b[i] = fp8_bits(q.finish(y[i]));
  } else if constexpr (Q::kFinish4 && V % 4 == 0) {
#pragma unroll
    for (int i = 0; i < V; i += 4) out.w[i / 4] = q.finish4(y[i], y[i + 1], y[i + 2], y[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out.b[i] = q.finish(y[i]);
  }
  return out;
}

// ---- statistics of a row or group ----

template <typename T>
struct PackedPair {
  using type = float;  // float32 elements are reduced one by one
};
template <>
struct PackedPair<__half> {
  using type = __half2;
};
template <>
struct PackedPair<__nv_bfloat16> {
  using type = __nv_bfloat162;
};

__device__ __forceinline__ __half2 splat(float x, __half2) { return __float2half2_rn(x); }
__device__ __forceinline__ __nv_bfloat162 splat(float x, __nv_bfloat162) {
  return __float2bfloat162_rn(x);
}
__device__ __forceinline__ float splat(float x, float) { return x; }

// The largest |x| (kMinMax false) or the minimum and the maximum (true) of the elements added, NaN
// skipped as by fmaxf / fminf. Pairs of 16-bit elements stay in their format: max.f16x2 /
// max.bf16x2 (and min) skip NaN the same way, and max and min are exact in any format, so the
// result is the same with one instruction per two elements and no conversion (the float path
// took a conversion and one or two FMNMX per element).
template <typename T, int V, bool kMinMax>
struct Stats {
  static constexpr bool kPacked = !std::is_same_v<T, float> && V % 2 == 0;
  using Acc = std::conditional_t<kPacked, typename PackedPair<T>::type, float>;
  Acc lo = splat(INFINITY, Acc{}), hi = splat(kMinMax ? -INFINITY : 0.0f, Acc{});

  __device__ void add(const Vec<T, V>& v) {
    if constexpr (kPacked) {
      const auto* pairs = reinterpret_cast<const Acc*>(v.v);
#pragma unroll
      for (int i = 0; i < V / 2; ++i) {
        if constexpr (kMinMax) {
          lo = __hmin2(lo, pairs[i]);
          hi = __hmax2(hi, pairs[i]);
        } else {
          hi = __hmax2(hi, __habs2(pairs[i]));
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float x = to_float(v.v[i]);
        if constexpr (kMinMax) {
          lo = fminf(lo, x);
          hi = fmaxf(hi, x);
        } else {
          hi = fmaxf(hi, fabsf(x));
        }
      }
    }
  }
  // The largest |x| (kMinMax false), or the maximum.
  __device__ float max() const {
    if constexpr (kPacked) {
      return fmaxf(__low2float(hi), __high2float(hi));
    } else {
      return hi;
    }
  }
  __device__ float min() const {
    if constexpr (kPacked) {
      return fminf(__low2float(lo), __high2float(lo));
    } else {
      return lo;
    }
  }
};

// ---- reductions ----

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The reduction of `v` over the block (blockDim.x a multiple of 32), returned to every thread.
template <typename Op>
__device__ float block_reduce(float v, Op op, float identity) {
  __shared__ float warp_vals[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // a previous call may still read warp_vals
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? warp_vals[lane] : identity;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Minimum and maximum over the block together (asymmetric int8): one pass through shared memory
// and one pair of barriers for both, instead of two block_reduce calls.
__device__ void block_min_max(float& lo, float& hi) {
  __shared__ float2 warp_vals[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_vals[warp] = make_float2(lo, hi);
  __syncthreads();
  const float2 w =
      lane < static_cast<int>(blockDim.x >> 5) ? warp_vals[lane] : make_float2(INFINITY, -INFINITY);
  lo = w.x;
  hi = w.y;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
}

// ---- kernels ----

// Reads the scale on the device (it may have been written by the previous kernel).
struct StaticFp8 {
  const float* scale;
  __device__ Fp8Mul operator()() const { return Fp8Mul(1.0f / *scale); }
};
struct StaticInt8Sym {
  const float* scale;
  __device__ Int8DivSym operator()() const { return Int8DivSym(*scale); }
};
struct StaticInt8Azp {
  const float* scale;
  const int32_t* azp;
  __device__ Int8DivAzp<> operator()() const { return Int8DivAzp<>(*scale, *azp); }
};

// f(v, store) for every input vector v of the matrix, grid-stride (consecutive threads take
// consecutive vectors: coalesced); store(bytes) writes the output vector at v's place. kFlat
// (contiguous input and output, fewer than 2^31 elements): vector idx sits at idx in both, 32-bit
// index math. Otherwise (row, column) from a 64-bit index: a 64-bit division per vector, which
// costs about as many instructions as quantizing its elements.
template <typename T, int V, bool kFlat, typename F>
__device__ __forceinline__ void for_each_vector(const Rows& m, F&& f) {
  if constexpr (kFlat) {
    const auto* in = static_cast<const Vec<T, V>*>(m.input);
    auto* out = static_cast<Bytes<V>*>(m.out);
    const uint32_t total = static_cast<uint32_t>(m.rows * (m.hidden / V));
    for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += gridDim.x * blockDim.x) {
      const Vec<T, V> v = in[idx];  // one 16-byte load (by reference, f would read elements)
      f(v, [&](const Bytes<V>& b) { out[idx] = b; });
    }
  } else {
    const int64_t nvec = m.hidden / V;
    const int64_t total = m.rows * nvec;
    for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t r = idx / nvec, j = idx - r * nvec;
      f(load_vec<T, V>(m, r, j), [&](const Bytes<V>& b) { store_vec<V>(m, r, j, b); });
    }
  }
}

// One vector per thread per iteration: 4 (all loads issued before the first is used) was
// measured slower on an H200 (fp8 static 4096 x 4096 bf16: 23.4 against 15.0 us,
// benchmarks/NOTES.md): the grid shrinks by 4 and the SMs hold fewer loads in flight.
template <typename T, int V, bool kFlat, typename MakeQ>
__global__ void __launch_bounds__(kThreads) static_quant_kernel(const Rows m, const MakeQ make) {
  const auto q = make();
  for_each_vector<T, V, kFlat>(
      m, [&](const Vec<T, V>& v, const auto& store) { store(quantize(v, q)); });
}

// scale[0] = max over blocks of max(block amax / 448, min scale); scale[0] is zeroed before.
template <typename T, int V, bool kFlat>
__global__ void __launch_bounds__(kThreads) tensor_amax_kernel(const Rows m, float* scale) {
  float a = 0.0f;
  for_each_vector<T, V, kFlat>(m, [&](const Vec<T, V>& v, const auto&) {
#pragma unroll
    for (int i = 0; i < V; ++i) a = fmaxf(a, fabsf(to_float(v.v[i])));
  });
  a = block_reduce(a, Max{}, 0.0f);
  if (threadIdx.x == 0) {
    const float s = fmaxf(a / math::kFp8Max, math::kFp8MinScale);
    atomicMax(reinterpret_cast<int*>(scale), __float_as_int(s));
  }
}

// Dynamic per-tensor fp8 of a small tensor (at most kSmallTensor elements, decode batches) in
// one block: the amax, the scale, then the quantize pass over the same elements (read again from
// L1 / L2). One launch instead of a memset and two kernels, which at these sizes cost more than
// the data (1 x 4096 bf16: 4.7 us against 2.0 for torch.compile's one kernel). The same scale and
// bits as the large-tensor path: max(amax / 448, floor), then x * (1 / scale).
constexpr int kSmallThreads = 1024;
constexpr int64_t kSmallTensor = 65536;

template <typename T, int V, bool kFlat>
__global__ void __launch_bounds__(kSmallThreads)
    small_tensor_quant_kernel(const Rows m, float* scale) {
  float a = 0.0f;
  for_each_vector<T, V, kFlat>(m, [&](const Vec<T, V>& v, const auto&) {
#pragma unroll
    for (int i = 0; i < V; ++i) a = fmaxf(a, fabsf(to_float(v.v[i])));
  });
  a = block_reduce(a, Max{}, 0.0f);
  const float s = fmaxf(a / math::kFp8Max, math::kFp8MinScale);
  if (threadIdx.x == 0) *scale = s;
  const Fp8Mul q(1.0f / s);
  for_each_vector<T, V, kFlat>(
      m, [&](const Vec<T, V>& v, const auto& store) { store(quantize(v, q)); });
}

enum class RowMode { kFp8PerToken, kInt8Sym, kInt8Asym };

// One block per row: statistics, block reduction, scale, quantize. Vectors j = tid + k * blockDim
// for k < kRowCache stay in registers; longer rows are read again for the quantize pass.
template <typename T, int V, RowMode kMode>
__global__ void __launch_bounds__(kMaxRowThreads)
    row_quant_kernel(const Rows m, float* scale, int32_t* azp, const float* scale_ub) {
  const int64_t r = blockIdx.x;
  const int64_t nvec = m.hidden / V;
  Vec<T, V> cache[kRowCache];
  Stats<T, V, kMode == RowMode::kInt8Asym> stats;
#pragma unroll
  for (int k = 0; k < kRowCache; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (j < nvec) {
      cache[k] = load_vec<T, V>(m, r, j);
      stats.add(cache[k]);
    }
  }
  for (int64_t j = threadIdx.x + static_cast<int64_t>(kRowCache) * blockDim.x; j < nvec;
       j += blockDim.x) {
    stats.add(load_vec<T, V>(m, r, j));
  }
  const auto emit = [&](const auto& q) {
#pragma unroll
    for (int k = 0; k < kRowCache; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (j < nvec) store_vec<V>(m, r, j, quantize(cache[k], q));
    }
    for (int64_t j = threadIdx.x + static_cast<int64_t>(kRowCache) * blockDim.x; j < nvec;
         j += blockDim.x) {
      store_vec<V>(m, r, j, quantize(load_vec<T, V>(m, r, j), q));
    }
  };
  // The bounded division where the row allows it (math::quotients_bounded, the same for the
  // whole block): the common case, all but rows clipped far below their amax by scale_ub or
  // holding an infinity.
  if constexpr (kMode == RowMode::kFp8PerToken) {
    const float a = block_reduce(stats.max(), Max{}, 0.0f);
    const float s = math::per_token_fp8_scale(a, scale_ub);
    if (threadIdx.x == 0) scale[r] = s;
    if (math::quotients_bounded(a, math::div_reciprocal(s))) {
      emit(Fp8DivFullRange<true>(s));
    } else {
      emit(Fp8DivFullRange<false>(s));
    }
  } else if constexpr (kMode == RowMode::kInt8Sym) {
    const float a = block_reduce(stats.max(), Max{}, 0.0f);
    if (threadIdx.x == 0) scale[r] = a / 127.0f;
    emit(Int8Mul(a == 0.0f ? 0.0f : 127.0f / a));
  } else {
    float lo = stats.min(), hi = stats.max();
    block_min_max(lo, hi);
    const math::AzpParams p = math::int8_azp_params(lo, hi);
    if (threadIdx.x == 0) {
      scale[r] = p.scale;
      azp[r] = p.azp;
    }
    const float bound = fmaxf(fabsf(lo), fabsf(hi)) * math::div_reciprocal(p.scale);
    if (bound <= kInt8PackBound) {  // (NaN when the row has no scale: not taken)
      emit(Int8AzpPacked(p.scale, p.azp));
    } else if (bound <= math::kDivFastMax) {  // math::quotients_bounded
      emit(Int8Azp<true>(p.scale, p.azp));
    } else {
      emit(Int8Azp<false>(p.scale, p.azp));
    }
  }
}

// Vectors per lane of the group kernel kept in registers, all loaded before the reduction: 4
// lanes per 128-element bf16 group, each with 64 bytes in flight and the per-group work (index
// math, shuffles, the scale) spread over 32 elements. Fastest of 1, 2, 4, 8 and 16 on an H200
// (benchmarks/NOTES.md); 8 and more cost more in occupancy than they gain.
constexpr int kGroupCache = 4;

// The group kernel's work, worked out once on the host: integer divisions by runtime values are
// routines of dozens of instructions on the GPU, which every thread would otherwise run.
struct GroupLayout {
  int64_t total_groups;
  int64_t groups_per_row;
  int64_t nvec;   // vectors per group
  int lane_bits;  // lanes per group: 2^lane_bits
  // g -> (row, group within the row) as a multiply and a shift (valid for 32-bit group indices)
  cutlass::FastDivmod row_of;
};

// A team of 2^lane_bits threads (at most 32, so teams never straddle a warp) per group. Index:
// uint32_t when every thread index fits in 31 bits (the launcher checks), so the row of a group
// comes from row_of; int64_t otherwise. kFullRange: [fp8_min, fp8_max] is [-448, 448] (the
// default), whose clamp the fp8 conversion does by itself (fp8_range). kLanes > 0: the group is
// exactly kLanes * kGroupCache vectors (128 bf16 / fp16 elements: 4 lanes; 128 float32: 8), so
// the lane count, every loop bound and the shuffle steps are compile-time and no lane tests a
// vector index; 0: any group size, read from the layout.
template <typename T, int V, typename Index, bool kFullRange, int kLanes>
__global__ void __launch_bounds__(kThreads)
    group_quant_kernel(const Rows m, const GroupFp8Params p, const GroupLayout layout) {
  constexpr bool kExact = kLanes > 0;
  const int lane_bits = kExact ? __builtin_ctz(kLanes) : layout.lane_bits;
  const int lanes = 1 << lane_bits;
  const int64_t nvec = kExact ? int64_t{kLanes} * kGroupCache : layout.nvec;
  const Index t = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x;
  const Index g = t >> lane_bits;
  const int lane = static_cast<int>(t & (lanes - 1));
  const bool active = g < static_cast<Index>(layout.total_groups);
  int64_t r = 0, gi = 0;
  if (active) {
    if constexpr (std::is_same_v<Index, uint32_t>) {
      int row, group;
      layout.row_of(row, group, static_cast<int>(g));
      r = row;
      gi = group;
    } else {
      r = g / layout.groups_per_row;
      gi = g - r * layout.groups_per_row;
    }
  }
  const int64_t base = gi * nvec;
  // Vectors j = lane + k * lanes, k < kGroupCache, are loaded together (kGroupCache loads in
  // flight per lane) and kept in registers for the quantize pass; a group longer than
  // 32 * kGroupCache vectors reads the rest again (from L1).
  const auto cached = [&](int k) { return kExact || lane + int64_t{k} * lanes < nvec; };
  Vec<T, V> cache[kGroupCache];
  Stats<T, V, false> stats;
  if (active) {
#pragma unroll
    for (int k = 0; k < kGroupCache; ++k) {
      if (cached(k)) cache[k] = load_vec<T, V>(m, r, base + lane + int64_t{k} * lanes);
    }
#pragma unroll
    for (int k = 0; k < kGroupCache; ++k) {
      if (cached(k)) stats.add(cache[k]);
    }
    if constexpr (!kExact) {
      for (int64_t j = lane + int64_t{kGroupCache} * lanes; j < nvec; j += lanes) {
        stats.add(load_vec<T, V>(m, r, base + j));
      }
    }
  }
  float a = stats.max();
  for (int o = lanes >> 1; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  if (!active) return;
  const float s = math::group_fp8_scale(a, p.eps, p.fp8_max, p.scale_ue8m0);
  if (lane == 0) p.scale[r * p.scale_row_stride + gi * p.scale_group_stride] = s;
  const auto emit = [&](const auto& q) {
#pragma unroll
    for (int k = 0; k < kGroupCache; ++k) {
      const int64_t j = lane + int64_t{k} * lanes;
      if (cached(k)) store_vec<V>(m, r, base + j, quantize(cache[k], q));
    }
    if constexpr (!kExact) {
      for (int64_t j = lane + int64_t{kGroupCache} * lanes; j < nvec; j += lanes) {
        store_vec<V>(m, r, base + j, quantize(load_vec<T, V>(m, r, base + j), q));
      }
    }
  };
  // The bounded division for every group whose quotients stay in range (all but groups with an
  // infinity, or a scale far from amax / fp8_max).
  const bool bounded = math::quotients_bounded(a, math::div_reciprocal(s));
  if constexpr (kFullRange) {
    if (bounded) {
      emit(Fp8DivFullRange<true>(s));
    } else {
      emit(Fp8DivFullRange<false>(s));
    }
  } else if (bounded) {
    emit(Fp8Div<true>(s, p.fp8_min, p.fp8_max));
  } else {
    emit(Fp8Div<false>(s, p.fp8_min, p.fp8_max));
  }
}

// ---- launch helpers ----

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Streaming multiprocessors of the current device.
int sm_count() {
  int device = 0, sms = 132;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

// Blocks of a grid-stride kernel: enough to fill the device, no more than the work.
int grid_blocks(int64_t work_items) {
  const int sms = sm_count();
  const int64_t want = ceil_div(work_items, kThreads);
  const int64_t cap = static_cast<int64_t>(sms) * 8;
  return static_cast<int>(want < cap ? (want < 1 ? 1 : want) : cap);
}

// 16-byte vectors (16 / sizeof(T) elements) when every row start of input and output is
// aligned to them and `divisor` (hidden, or the group size) is a multiple; else 1.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
bool vectorizable(const Rows& m, int64_t divisor) {
  constexpr int v = kVec<T>;
  return divisor % v == 0 && m.input_row_stride % v == 0 && m.out_row_stride % v == 0 &&
         reinterpret_cast<uintptr_t>(m.input) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(m.out) % v == 0;
}

// f(TypeTag<T>, std::integral_constant<int, V>) with the input type and vector width.
template <typename F>
cudaError_t dispatch_vec(DType dtype, const Rows& m, int64_t divisor, F&& f) {
  return dispatch::floats(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if (vectorizable<T>(m, divisor)) return f(tag, std::integral_constant<int, kVec<T>>{});
    return f(tag, std::integral_constant<int, 1>{});
  });
}

// Input and output rows back to back, fewer than 2^31 elements: the elementwise kernels index
// the matrix as one flat array with 32-bit math (for_each_vector's kFlat).
bool flat_32bit(const Rows& m) {
  const bool packed =
      m.rows == 1 || (m.input_row_stride == m.hidden && m.out_row_stride == m.hidden);
  return packed && m.rows * m.hidden <= INT32_MAX;
}

// f(TypeTag<T>, integral_constant<int, V>, bool_constant<kFlat>) for the elementwise kernels.
template <typename F>
cudaError_t dispatch_elementwise(DType dtype, const Rows& m, F&& f) {
  return dispatch_vec(dtype, m, m.hidden, [&](auto tag, auto vec) -> cudaError_t {
    if (flat_32bit(m)) return f(tag, vec, std::true_type{});
    return f(tag, vec, std::false_type{});
  });
}

template <typename MakeQ>
cudaError_t launch_static(DType dtype, const Rows& m, const MakeQ& make, cudaStream_t stream) {
  return dispatch_elementwise(dtype, m, [&](auto tag, auto vec, auto flat) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int V = decltype(vec)::value;
    static_quant_kernel<T, V, decltype(flat)::value, MakeQ>
        <<<grid_blocks(m.rows * (m.hidden / V)), kThreads, 0, stream>>>(m, make);
    return cudaGetLastError();
  });
}

template <RowMode kMode>
cudaError_t launch_rows(DType dtype, const Rows& m, float* scale, int32_t* azp,
                        const float* scale_ub, cudaStream_t stream) {
  return dispatch_vec(dtype, m, m.hidden, [&](auto tag, auto vec) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int V = decltype(vec)::value;
    // Enough threads that the row fits the register cache, in whole warps, at most 1024. With
    // fewer rows than SMs every block has an SM to itself and the call lasts as long as one
    // block's dependent chain (loads, max, the IEEE divisions of the quantize pass): one vector
    // per thread then, so that chain is kRowCache times shorter (hidden 4096 bf16 at M = 1: 512
    // threads instead of 128). Same loads, reduction and rounding, so the same bits.
    const int64_t nvec = m.hidden / V;
    const int64_t per_thread = m.rows < sm_count() ? 1 : kRowCache;
    const int64_t want = ceil_div(ceil_div(nvec, per_thread), 32) * 32;
    const int threads =
        static_cast<int>(want < 32 ? 32 : (want > kMaxRowThreads ? kMaxRowThreads : want));
    row_quant_kernel<T, V, kMode>
        <<<static_cast<unsigned>(m.rows), threads, 0, stream>>>(m, scale, azp, scale_ub);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t static_scaled_fp8_quant(DType dtype, const StaticFp8Params& p, cudaStream_t stream) {
  if (p.m.rows == 0 || p.m.hidden == 0) return cudaSuccess;
  return launch_static(dtype, p.m, StaticFp8{p.scale}, stream);
}

cudaError_t dynamic_scaled_fp8_quant(DType dtype, const DynamicFp8Params& p, cudaStream_t stream) {
  // An empty input still gets its scale (the floor), as on the CPU.
  if (p.m.rows * p.m.hidden <= kSmallTensor) {
    return dispatch_elementwise(dtype, p.m, [&](auto tag, auto vec, auto flat) -> cudaError_t {
      using T = typename decltype(tag)::type;
      constexpr int V = decltype(vec)::value;
      small_tensor_quant_kernel<T, V, decltype(flat)::value>
          <<<1, kSmallThreads, 0, stream>>>(p.m, p.scale);
      return cudaGetLastError();
    });
  }
  cudaError_t err = cudaMemsetAsync(p.scale, 0, sizeof(float), stream);
  if (err != cudaSuccess) return err;
  err = dispatch_elementwise(dtype, p.m, [&](auto tag, auto vec, auto flat) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int V = decltype(vec)::value;
    tensor_amax_kernel<T, V, decltype(flat)::value>
        <<<grid_blocks(p.m.rows * (p.m.hidden / V)), kThreads, 0, stream>>>(p.m, p.scale);
    return cudaGetLastError();
  });
  if (err != cudaSuccess || p.m.rows == 0 || p.m.hidden == 0) return err;
  return launch_static(dtype, p.m, StaticFp8{p.scale}, stream);
}

cudaError_t dynamic_per_token_scaled_fp8_quant(DType dtype, const PerTokenFp8Params& p,
                                               cudaStream_t stream) {
  if (p.m.rows == 0) return cudaSuccess;
  return launch_rows<RowMode::kFp8PerToken>(dtype, p.m, p.scale, nullptr, p.scale_ub, stream);
}

cudaError_t static_scaled_int8_quant(DType dtype, const StaticInt8Params& p, cudaStream_t stream) {
  if (p.m.rows == 0 || p.m.hidden == 0) return cudaSuccess;
  if (p.azp != nullptr) return launch_static(dtype, p.m, StaticInt8Azp{p.scale, p.azp}, stream);
  return launch_static(dtype, p.m, StaticInt8Sym{p.scale}, stream);
}

cudaError_t dynamic_scaled_int8_quant(DType dtype, const DynamicInt8Params& p,
                                      cudaStream_t stream) {
  if (p.m.rows == 0) return cudaSuccess;
  if (p.azp != nullptr) {
    return launch_rows<RowMode::kInt8Asym>(dtype, p.m, p.scale, p.azp, nullptr, stream);
  }
  return launch_rows<RowMode::kInt8Sym>(dtype, p.m, p.scale, nullptr, nullptr, stream);
}

cudaError_t per_token_group_fp8_quant(DType dtype, const GroupFp8Params& p, cudaStream_t stream) {
  if (p.m.rows == 0 || p.m.hidden == 0) return cudaSuccess;
  return dispatch_vec(dtype, p.m, p.group_size, [&](auto tag, auto vec) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int V = decltype(vec)::value;
    GroupLayout layout{};
    layout.groups_per_row = p.m.hidden / p.group_size;
    layout.total_groups = p.m.rows * layout.groups_per_row;
    layout.nvec = p.group_size / V;
    // The fewest lanes (a power of two, at most 32) that hold the group at kGroupCache vectors
    // each: 4 for 128 bf16 / fp16 elements, 8 for 128 float32.
    while (layout.lane_bits < 5 && (int64_t{kGroupCache} << layout.lane_bits) < layout.nvec) {
      ++layout.lane_bits;
    }
    const int64_t threads = layout.total_groups << layout.lane_bits;
    const bool small = threads <= INT32_MAX;
    if (small) layout.row_of = cutlass::FastDivmod(static_cast<int>(layout.groups_per_row));
    const bool full_range = p.fp8_min == -math::kFp8Max && p.fp8_max == math::kFp8Max;
    // The kernel for an index type and a lane count (0: any), with or without the clamp.
    const auto launch = [&](auto index, auto lanes) -> cudaError_t {
      using Index = decltype(index);
      constexpr int kLanes = decltype(lanes)::value;
      auto* kernel = full_range ? group_quant_kernel<T, V, Index, true, kLanes>
                                : group_quant_kernel<T, V, Index, false, kLanes>;
      kernel<<<static_cast<unsigned>(ceil_div(threads, kThreads)), kThreads, 0, stream>>>(p.m, p,
                                                                                          layout);
      return cudaGetLastError();
    };
    // The exact-fit kernels for the usual group of 128 (vectorized rows, 32-bit indices).
    if constexpr (V == kVec<T>) {
      if (small && layout.nvec == int64_t{kGroupCache} << layout.lane_bits) {
        if (layout.lane_bits == 2) return launch(uint32_t{}, std::integral_constant<int, 4>{});
        if (layout.lane_bits == 3) return launch(uint32_t{}, std::integral_constant<int, 8>{});
      }
    }
    if (small) return launch(uint32_t{}, std::integral_constant<int, 0>{});
    return launch(int64_t{}, std::integral_constant<int, 0>{});
  });
}

}  // namespace cuda
}  // namespace quant
