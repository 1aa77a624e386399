// activation_cuda.cu: CUDA kernels and host launchers of the activation ops (activation_cuda.h).
//
// What it computes (formulas: activation_math.h, the same source the CPU path uses):
//   unary fwd   out[r, i]     = act(x[r, i])
//   unary bwd   grad_in[r, i] = g[r, i] * act'(x[r, i])
//     act: silu, gelu (erf), gelu_tanh, gelu_fast, gelu_new (= gelu_tanh), gelu_quick
//   gated fwd   out[r, i]     = op(a, b), i < d
//   gated bwd   grad_in[r, .] = (g * d op/da, g * d op/db), written where a and b were read
//   split layout (all gated ops but swigluoai): a = x[r, i], b = x[r, d + i]
//   interleaved gpt-oss layout (swigluoai):     a = gate = x[r, 2i], b = up = x[r, 2i + 1]
//   act-first ops: op = act(a) * b, grads (g * b * act'(a), g * act(a));
//   mul_and_silu:  op = a * silu(b), grads (g * silu(b), g * a * silu'(b));
//   swigluoai:     op = swigluoai(a, b; alpha, limit), grads g * swigluoai_grad.
// Dtypes: fp32, fp16, bf16 computed in fp32 and rounded once on store; fp64 computed in fp64.
// Layout: every tensor is [rows, width] with unit stride along the width and an arbitrary row
// stride in elements; sizes and offsets are 64-bit (rows * width may exceed 2^32). Inputs must
// not overlap outputs.
// Builds for sm_75 .. sm_120; bf16 only goes through conversions (emulated on sm_75).
//
// Design (memory-bound ops: the goals are the device-to-device copy bandwidth for large shapes
// and the shortest possible launch for decode-sized ones; the measurements behind each choice,
// against Inductor's kernel for the same op, are in benchmarks/NOTES.md):
// - One thread per 16-byte vector (8 x fp16/bf16, 4 x fp32, 2 x fp64), one kernel step: block
//   (x, y) covers vector columns of a row and block rows; no division, no grid-stride loop (it
//   remains only for more than 65535 row blocks). An earlier flat index space (64-bit magic
//   division, grid-stride stepping, a separate tail loop) made decode launches slower and a
//   persistent grid fell short of Inductor's bandwidth (NOTES.md, "Index space").
// - 16-byte vectors when every row start of every tensor is 16-byte aligned: aligned base
//   pointers, row strides multiple of the vector width, and, for the split layout, d multiple of
//   it (the second half starts at d). When the width is not a multiple of the vector width, the
//   threads after a row's last vector take its last elements one each. Otherwise the same
//   kernel body runs with one element per thread, still coalesced. Contiguous unary tensors are
//   seen as one long row, so any shape vectorizes. Forwards of fp16/bf16 small enough for one
//   CTA per SM take 4-byte vectors on the same condition (LaunchConfig::kNarrowVectorBytes).
// - Programmatic dependent launch on sm_90+ only with enable_pdl=True: a call that follows a
//   kernel releasing its dependents then overlaps its launch with that kernel's tail, but after
//   a GEMM it is slower (pdl.cuh; NOTES.md, "Programmatic dependent launch").
// - Math: the activation_math.h formulas; fp32/fp64 with precise expf/erff/tanhf and IEEE
//   division, fp16/bf16 with hardware approximations whose error is far below their output
//   rounding (FastFloatMath below says why and by how much).
// - One kernel per family (unary fwd, unary bwd, gated fwd, gated bwd), templated on the
//   element type, the vector width and the op functor.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "activation_cuda.h"
#include "activation_math.h"
#include "activation_params.h"
#include "dispatch.cuh"
#include "pdl.cuh"

namespace activation {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Launch configuration: the only place where the launch heuristics live.
// ---------------------------------------------------------------------------------------------
struct LaunchConfig {
  // 128 threads, one 16-B vector (or, off the vector path, one element) each: a 1-token row of
  // 14336 bf16 outputs spreads over 14 SMs. 64 and 256 threads were no faster, and more
  // vectors per thread were slower at 8192 tokens and lengthen the serial work of a decode
  // launch (benchmarks/NOTES.md, "Threads per CTA and vectors per thread").
  static constexpr int kThreads = 128;
  static constexpr int kVectorBytes = 16;
  static constexpr unsigned kMaxGridY = 65535;
  // The unary forward moves only 16 B in and 16 B out per vector: two vectors per thread bring
  // large shapes close to the copy bandwidth. But where one vector per thread fits in the
  // device's resident threads (a single wave), the second vector only lengthens each thread's
  // dependent chain (benchmarks/NOTES.md, "Unary forward").
  static constexpr int kUnaryFwdItems = 2;
  static constexpr int kUnaryFwdItemsOneWave = 1;
  // Decode-sized fp16/bf16 forwards take 4-byte vectors (2 elements) instead of 16-byte ones
  // while that needs at most one CTA per SM: 4x the CTAs, each thread with a quarter of the
  // math (gelu: two polynomials instead of eight in its dependent chain). Beyond one CTA per SM
  // the 16-byte vectors win or tie, and from 64 tokens they win by far (benchmarks/NOTES.md,
  // "Decode-sized fp16/bf16 forwards on 4-byte vectors").
  static constexpr int kNarrowVectorBytes = 4;
  static constexpr int kNarrowMaxCtasPerSm = 1;
};

template <typename T>
constexpr int kVecWidth = LaunchConfig::kVectorBytes / static_cast<int>(sizeof(T));

// ---------------------------------------------------------------------------------------------
// Element types: compute type and conversions.
// ---------------------------------------------------------------------------------------------
template <typename T>
struct ComputeType {
  using type = float;
};
template <>
struct ComputeType<double> {
  using type = double;
};
template <typename T>
using compute_t = typename ComputeType<T>::type;

__device__ __forceinline__ float to_compute(float x) { return x; }
__device__ __forceinline__ double to_compute(double x) { return x; }
__device__ __forceinline__ float to_compute(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_compute(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_compute(compute_t<T> x);
template <>
__device__ __forceinline__ float from_compute<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double from_compute<double>(double x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_compute<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_compute<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// kVec elements of T; 16-byte aligned when kVec = kVecWidth<T>.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Rounds kVec computed values to T (round to nearest even, once). 2-byte types convert pairs:
// one cvt.rn.{f16,bf16}x2.f32 on sm_80+ (two scalar conversions on older targets).
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> round_vec(const compute_t<T> (&c)[kVec]) {
  Vec<T, kVec> out;
  if constexpr (sizeof(T) == 2 && kVec % 2 == 0) {
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      if constexpr (std::is_same<T, __half>::value) {
        const __half2 p = __floats2half2_rn(c[j], c[j + 1]);
        out.v[j] = __low2half(p);
        out.v[j + 1] = __high2half(p);
      } else {
        const __nv_bfloat162 p = __floats2bfloat162_rn(c[j], c[j + 1]);
        out.v[j] = __low2bfloat16(p);
        out.v[j + 1] = __high2bfloat16(p);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) out.v[j] = from_compute<T>(c[j]);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Global memory accesses. Loads are plain (ld.global): ld.global.nc.L1::no_allocate made a
// large silu_and_mul slower (benchmarks/NOTES.md, "Loads"). Stores are st.global.cs
// (evict-first): this kernel never reads its output back (no measurable cost or gain there).
// ---------------------------------------------------------------------------------------------
template <int kBytes>
struct RawBits;
template <>
struct RawBits<2> {
  using type = unsigned short;
};
template <>
struct RawBits<4> {
  using type = unsigned int;
};
template <>
struct RawBits<8> {
  using type = unsigned long long;
};
template <>
struct RawBits<16> {
  using type = uint4;
};

__device__ __forceinline__ void st_raw(void* p, unsigned short v) {
  asm volatile("st.global.cs.b16 [%0], %1;" ::"l"(p), "h"(v));
}
__device__ __forceinline__ void st_raw(void* p, unsigned int v) {
  asm volatile("st.global.cs.b32 [%0], %1;" ::"l"(p), "r"(v));
}
__device__ __forceinline__ void st_raw(void* p, unsigned long long v) {
  asm volatile("st.global.cs.b64 [%0], %1;" ::"l"(p), "l"(v));
}
__device__ __forceinline__ void st_raw(void* p, uint4 v) {
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w));
}

// One access of kVec elements at p, which must be aligned to sizeof(Vec<T, kVec>).
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> load_vec(const T* p) {
  using Bits = typename RawBits<sizeof(Vec<T, kVec>)>::type;
  const Bits bits = *reinterpret_cast<const Bits*>(p);
  Vec<T, kVec> v;
  memcpy(&v, &bits, sizeof(v));
  return v;
}
template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, kVec>& v) {
  typename RawBits<sizeof(v)>::type bits;
  memcpy(&bits, &v, sizeof(v));
  st_raw(p, bits);
}

// ---------------------------------------------------------------------------------------------
// Index space: a 2-D grid of 2-D blocks. Block (tx, ty) covers ty rows and tx vector columns;
// thread column j of a row handles the vector j (elements [j kVec, j kVec + kVec)) when
// j < vecs, else tail element tail_start + (j - vecs) when width % kVec != 0. Narrow rows get
// narrow, tall blocks so that no thread idles; rows beyond the grid's y limit loop.
// ---------------------------------------------------------------------------------------------
struct RowSpace {
  int64_t rows;
  int64_t vecs;        // full vectors per row
  int64_t tail;        // width - vecs * kVec elements after them
  int64_t tail_start;  // vecs * kVec
};

RowSpace make_space(int64_t rows, int64_t width, int vec) {
  const int64_t vecs = width / vec;
  return RowSpace{rows, vecs, width - vecs * vec, vecs * vec};
}

// The family F provides load<V>(row, elem) -> Frag<V> and finish<V>(frag, row, elem) (compute
// and store) for V = kVec and V = 1. A block covers kItems * blockDim.x item columns; thread t
// takes columns t, t + blockDim.x, ... (coalesced), issuing all loads before any math. No
// division and, below 65536 row blocks, no loop: a decode-sized launch is one short dependent
// chain per thread.
template <int kVec, int kItems, typename F>
__device__ __forceinline__ void for_each_item(const F& f, const RowSpace& s) {
  pdl::wait_and_release();
  using Frag = typename F::template Frag<kVec>;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * blockDim.x * kItems + threadIdx.x;
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; row < s.rows;
       row += row_step) {
    Frag frag[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = j0 + k * blockDim.x;
      if (j < s.vecs) frag[k] = f.template load<kVec>(row, j * kVec);
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = j0 + k * blockDim.x;
      if (j < s.vecs) {
        f.template finish<kVec>(frag[k], row, j * kVec);
      } else if constexpr (kVec > 1) {
        const int64_t e = s.tail_start + (j - s.vecs);
        if (j - s.vecs < s.tail) f.template finish<1>(f.template load<1>(row, e), row, e);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Op functors: thin wrappers over activation_math.h, templated on the compute type C.
// ---------------------------------------------------------------------------------------------
// Math policy per element type. fp16/bf16 results are rounded to 11/8 significant bits, so
// their fp32 math may use the hardware approximations: __expf (ex2.approx, ~2 ulp plus the
// rounding of x*log2(e)) and __fdividef (~2 ulp), with tanh(y) = 1 - 2 / (exp(2y) + 1). These
// errors stay below 2^-20 relative to the operands' magnitude, far under half an fp16 ulp
// (2^-12), and cut the silu/tanh ops from ~25-35 to ~10-15 instructions per element: precise
// expf and IEEE division made silu_and_mul issue-bound, slower than fatrelu_and_mul, which has
// no transcendental (benchmarks/NOTES.md, "fp16/bf16 math"). fp32 and fp64 data keep the
// precise policy.
//
// Phi (GELU's normal CDF): h = Phi(-|x|) = 2^q(|x|), q a degree-8 polynomial fitted for this
// file (weighted least squares for the absolute error of h on [0, 5.75]; h = 0 beyond, where
// Phi(-5.75) = 4.5e-9). Evaluated in fp32 it is within 7.7e-8 of Phi everywhere, and within ~1e-6
// relative on the small negative side, against 5.8e-8 absolute (and no relative bound) for
// 0.5 (1 + erff(x / sqrt 2)) in fp32, whose two-branch erff costs ~28 instructions where this is
// ~13. gelu_and_mul was issue-bound with erff (benchmarks/NOTES.md, "fp16/bf16 math").
struct FastFloatMath {
  template <typename T>
  static __device__ __forceinline__ T exp(T x) {
    return __expf(x);
  }
  // 1 + e^x with the flush-to-zero ex2: __expf's handling of subnormal results (a compare and
  // two predicated multiplies per element) cannot change the sum, which rounds to 1 there.
  template <typename T>
  static __device__ __forceinline__ T one_plus_exp(T x) {
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * 1.4426950408889634f));
    return 1.0f + e;
  }
  template <typename T>
  static __device__ __forceinline__ T tanh(T x) {
    return 1.0f - __fdividef(2.0f, one_plus_exp(2.0f * x));  // saturates to +-1, no NaN
  }
  template <typename T>
  static __device__ __forceinline__ T div(T a, T b) {
    return __fdividef(a, b);
  }
  template <typename T>
  static __device__ __forceinline__ T normal_cdf(T x) {
    constexpr float kCutoff = 5.75f;
    const float a = fminf(fabsf(x), kCutoff);
    float q = -2.772198513e-06f;
    q = fmaf(q, a, 3.862227459e-05f);
    q = fmaf(q, a, -1.825537620e-04f);
    q = fmaf(q, a, -1.458576153e-04f);
    q = fmaf(q, a, 7.075458299e-03f);
    q = fmaf(q, a, -5.250502005e-02f);
    q = fmaf(q, a, -4.592049122e-01f);
    q = fmaf(q, a, -1.151105762e+00f);
    q = fmaf(q, a, -1.0f);
    float h;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(h) : "f"(q));
    h = fabsf(x) < kCutoff ? h : 0.0f;  // NaN x: a = kCutoff (fminf), then NaN * Phi below
    return x >= 0.0f ? 1.0f - h : h;
  }
};

template <typename T>
struct MathFor {
  using type = PreciseMath;
};
template <>
struct MathFor<__half> {
  using type = FastFloatMath;
};
template <>
struct MathFor<__nv_bfloat16> {
  using type = FastFloatMath;
};
template <typename T>
using math_for = typename MathFor<T>::type;

struct SiluFn {
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C x) const {
    return silu<C, M>(x);
  }
  template <typename M, typename C>
  __device__ __forceinline__ C grad(C x) const {
    return silu_grad<C, M>(x);
  }
};
struct GeluErfFn {
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C x) const {
    return gelu_erf<C, M>(x);
  }
  template <typename M, typename C>
  __device__ __forceinline__ C grad(C x) const {
    return gelu_erf_grad<C, M>(x);
  }
};
struct GeluTanhFn {
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C x) const {
    return gelu_tanh<C, M>(x);
  }
  template <typename M, typename C>
  __device__ __forceinline__ C grad(C x) const {
    return gelu_tanh_grad<C, M>(x);
  }
};
struct GeluFastFn {
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C x) const {
    return gelu_fast<C, M>(x);
  }
  template <typename M, typename C>
  __device__ __forceinline__ C grad(C x) const {
    return gelu_fast_grad<C, M>(x);
  }
};
struct GeluQuickFn {
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C x) const {
    return gelu_quick<C, M>(x);
  }
  template <typename M, typename C>
  __device__ __forceinline__ C grad(C x) const {
    return gelu_quick_grad<C, M>(x);
  }
};
struct FatreluFn {
  float threshold;
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C x) const {
    return fatrelu<C, M>(x, C(threshold));
  }
  template <typename M, typename C>
  __device__ __forceinline__ C grad(C x) const {
    return fatrelu_grad<C, M>(x, C(threshold));
  }
};

// act(a) * b.
template <typename Act>
struct ActAndMulOp {
  Act act;
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C a, C b) const {
    return act.template fwd<M>(a) * b;
  }
  template <typename M, typename C>
  __device__ __forceinline__ void bwd(C g, C a, C b, C& da, C& db) const {
    da = g * b * act.template grad<M>(a);
    db = g * act.template fwd<M>(a);
  }
};

// a * silu(b).
struct MulAndSiluOp {
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C a, C b) const {
    return a * silu<C, M>(b);
  }
  template <typename M, typename C>
  __device__ __forceinline__ void bwd(C g, C a, C b, C& da, C& db) const {
    da = g * silu<C, M>(b);
    db = g * a * silu_grad<C, M>(b);
  }
};

// swigluoai(gate = a, up = b; alpha, limit).
struct SwigluOaiOp {
  float alpha;
  float limit;
  template <typename M, typename C>
  __device__ __forceinline__ C fwd(C a, C b) const {
    return swigluoai<C, M>(a, b, C(alpha), C(limit));
  }
  template <typename M, typename C>
  __device__ __forceinline__ void bwd(C g, C a, C b, C& da, C& db) const {
    C d_gate, d_up;
    swigluoai_grad<C, M>(a, b, C(alpha), C(limit), &d_gate, &d_up);
    da = g * d_gate;
    db = g * d_up;
  }
};

// ---------------------------------------------------------------------------------------------
// Op families: where a vector of V outputs reads its operands and writes its results.
// ---------------------------------------------------------------------------------------------
template <typename T, typename Op>
struct UnaryFwd {
  T* out;      // [rows, n]
  const T* x;  // [rows, n]
  int64_t out_stride;
  int64_t x_stride;
  Op op;

  template <int V>
  struct Frag {
    Vec<T, V> x;
  };
  template <int V>
  __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
    return Frag<V>{load_vec<T, V>(x + row * x_stride + e)};
  }
  template <int V>
  __device__ __forceinline__ void finish(const Frag<V>& f, int64_t row, int64_t e) const {
    compute_t<T> y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = op.template fwd<math_for<T>>(to_compute(f.x.v[j]));
    store_vec(out + row * out_stride + e, round_vec<T, V>(y));
  }
};

template <typename T, typename Op>
struct UnaryBwd {
  T* grad_in;         // [rows, n]
  const T* grad_out;  // [rows, n]
  const T* x;         // [rows, n]
  int64_t grad_in_stride;
  int64_t grad_out_stride;
  int64_t x_stride;
  Op op;

  template <int V>
  struct Frag {
    Vec<T, V> g, x;
  };
  template <int V>
  __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
    return Frag<V>{load_vec<T, V>(grad_out + row * grad_out_stride + e),
                   load_vec<T, V>(x + row * x_stride + e)};
  }
  template <int V>
  __device__ __forceinline__ void finish(const Frag<V>& f, int64_t row, int64_t e) const {
    compute_t<T> y[V];
#pragma unroll
    for (int j = 0; j < V; ++j)
      y[j] = to_compute(f.g.v[j]) * op.template grad<math_for<T>>(to_compute(f.x.v[j]));
    store_vec(grad_in + row * grad_in_stride + e, round_vec<T, V>(y));
  }
};

// Operands of V consecutive outputs starting at output element e, inside a [rows, 2d] row:
// split: a = [e, e + V), b = [d + e, d + e + V); interleaved: the 2V elements from 2e, the first
// V in vector A and the next V in vector B, pairs (gate, up) alternating across them.
template <bool kInterleaved, int V>
struct GatedLayout {
  static __device__ __forceinline__ int64_t a_off(int64_t e, int64_t) {
    return kInterleaved ? 2 * e : e;
  }
  static __device__ __forceinline__ int64_t b_off(int64_t e, int64_t d) {
    return kInterleaved ? 2 * e + V : d + e;
  }
  // Position of operand a (which = 0) or b (which = 1) of output j: vector (0: A, 1: B), lane.
  static constexpr __host__ __device__ int vec_of(int j, int which) {
    return kInterleaved ? (2 * j + which) / V : which;
  }
  static constexpr __host__ __device__ int lane_of(int j, int which) {
    return kInterleaved ? (2 * j + which) % V : j;
  }
};

template <typename T, int V>
__device__ __forceinline__ T lane(const Vec<T, V>& a, const Vec<T, V>& b, int which_vec, int i) {
  return which_vec == 0 ? a.v[i] : b.v[i];  // constant indices after unrolling
}

template <typename T, typename Op, bool kInterleaved>
struct GatedFwd {
  T* out;       // [rows, d]
  const T* in;  // [rows, 2d]
  int64_t out_stride;
  int64_t in_stride;
  int64_t d;
  Op op;

  template <int V>
  struct Frag {
    Vec<T, V> a, b;
  };
  template <int V>
  __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
    using L = GatedLayout<kInterleaved, V>;
    const T* p = in + row * in_stride;
    return Frag<V>{load_vec<T, V>(p + L::a_off(e, d)), load_vec<T, V>(p + L::b_off(e, d))};
  }
  template <int V>
  __device__ __forceinline__ void finish(const Frag<V>& f, int64_t row, int64_t e) const {
    using L = GatedLayout<kInterleaved, V>;
    compute_t<T> y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const T a = lane(f.a, f.b, L::vec_of(j, 0), L::lane_of(j, 0));
      const T b = lane(f.a, f.b, L::vec_of(j, 1), L::lane_of(j, 1));
      y[j] = op.template fwd<math_for<T>>(to_compute(a), to_compute(b));
    }
    store_vec(out + row * out_stride + e, round_vec<T, V>(y));
  }
};

template <typename T, typename Op, bool kInterleaved>
struct GatedBwd {
  T* grad_in;         // [rows, 2d], same layout as in
  const T* grad_out;  // [rows, d]
  const T* in;        // [rows, 2d]
  int64_t grad_in_stride;
  int64_t grad_out_stride;
  int64_t in_stride;
  int64_t d;
  Op op;

  template <int V>
  struct Frag {
    Vec<T, V> g, a, b;
  };
  template <int V>
  __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
    using L = GatedLayout<kInterleaved, V>;
    const T* p = in + row * in_stride;
    return Frag<V>{load_vec<T, V>(grad_out + row * grad_out_stride + e),
                   load_vec<T, V>(p + L::a_off(e, d)), load_vec<T, V>(p + L::b_off(e, d))};
  }
  template <int V>
  __device__ __forceinline__ void finish(const Frag<V>& f, int64_t row, int64_t e) const {
    using L = GatedLayout<kInterleaved, V>;
    using C = compute_t<T>;
    C ga[V], gb[V];  // gradients laid out like the loaded vectors A and B
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const T a = lane(f.a, f.b, L::vec_of(j, 0), L::lane_of(j, 0));
      const T b = lane(f.a, f.b, L::vec_of(j, 1), L::lane_of(j, 1));
      C da, db;
      op.template bwd<math_for<T>>(to_compute(f.g.v[j]), to_compute(a), to_compute(b), da, db);
      (L::vec_of(j, 0) == 0 ? ga : gb)[L::lane_of(j, 0)] = da;
      (L::vec_of(j, 1) == 0 ? ga : gb)[L::lane_of(j, 1)] = db;
    }
    T* p = grad_in + row * grad_in_stride;
    store_vec(p + L::a_off(e, d), round_vec<T, V>(ga));
    store_vec(p + L::b_off(e, d), round_vec<T, V>(gb));
  }
};

// ---------------------------------------------------------------------------------------------
// Kernels: one per family, all running the same grid loop.
// ---------------------------------------------------------------------------------------------
template <int kVec, int kItems, typename T, typename Op>
__global__ void __launch_bounds__(LaunchConfig::kThreads)
    unary_act_fwd_kernel(const UnaryFwd<T, Op> f, const RowSpace s) {
  for_each_item<kVec, kItems>(f, s);
}

template <int kVec, int kItems, typename T, typename Op>
__global__ void __launch_bounds__(LaunchConfig::kThreads)
    unary_act_bwd_kernel(const UnaryBwd<T, Op> f, const RowSpace s) {
  for_each_item<kVec, kItems>(f, s);
}

template <int kVec, int kItems, typename T, typename Op, bool kInterleaved>
__global__ void __launch_bounds__(LaunchConfig::kThreads)
    gated_act_fwd_kernel(const GatedFwd<T, Op, kInterleaved> f, const RowSpace s) {
  for_each_item<kVec, kItems>(f, s);
}

template <int kVec, int kItems, typename T, typename Op, bool kInterleaved>
__global__ void __launch_bounds__(LaunchConfig::kThreads)
    gated_act_bwd_kernel(const GatedBwd<T, Op, kInterleaved> f, const RowSpace s) {
  for_each_item<kVec, kItems>(f, s);
}

// ---------------------------------------------------------------------------------------------
// Host side: alignment checks, grid sizing and dispatch.
// ---------------------------------------------------------------------------------------------

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % LaunchConfig::kVectorBytes == 0;
}

// A row stride keeps every row start aligned; irrelevant for a single row.
bool stride_ok(int64_t stride, int64_t rows, int vec) { return rows == 1 || stride % vec == 0; }

// Block shape: 128 threads, as wide as the row's items need (a power of two) and as tall as
// that leaves; grid: enough blocks across for the row, and down for the rows up to the y limit.
// An activation call is one kernel, launched with programmatic dependent launch only when the
// caller asks for it (pdl::Request::kOn; pdl.cuh says when that pays).
template <auto kKernel, int kItems, typename F>
cudaError_t launch(const F& family, const RowSpace& space, pdl::Request pdl_request,
                   cudaStream_t stream) {
  const int64_t items = space.vecs + space.tail;  // per row, > 0
  unsigned tx = LaunchConfig::kThreads;
  while (tx > 1 && static_cast<int64_t>(tx / 2) * kItems >= items) tx /= 2;
  const unsigned ty = LaunchConfig::kThreads / tx;
  const int64_t per_block = static_cast<int64_t>(tx) * kItems;
  const int64_t blocks_x = (items + per_block - 1) / per_block;
  const int64_t blocks_y = (space.rows + ty - 1) / ty;
  if (blocks_x > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks_x),
                  static_cast<unsigned>(std::min<int64_t>(blocks_y, LaunchConfig::kMaxGridY)));
  return pdl::launch(pdl_request, pdl::ByDefault::kPlain, kKernel, grid, dim3(tx, ty), 0, stream,
                     family, space);
}

template <typename F>
cudaError_t dispatch_unary(UnaryAct act, F&& f) {
  switch (act) {
    case UnaryAct::kSilu:
      return f(SiluFn{});
    case UnaryAct::kGelu:
      return f(GeluErfFn{});
    case UnaryAct::kGeluTanh:
      return f(GeluTanhFn{});
    case UnaryAct::kGeluFast:
      return f(GeluFastFn{});
    case UnaryAct::kGeluNew:
      return f(GeluTanhFn{});  // transformers NewGELU: the tanh formula
    case UnaryAct::kGeluQuick:
      return f(GeluQuickFn{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Calls f(op, std::bool_constant<interleaved>).
template <typename F>
cudaError_t dispatch_gated(GatedAct act, const GatedActScalars& s, F&& f) {
  using Split = std::false_type;
  using Interleaved = std::true_type;
  switch (act) {
    case GatedAct::kSiluAndMul:
      return f(ActAndMulOp<SiluFn>{}, Split{});
    case GatedAct::kMulAndSilu:
      return f(MulAndSiluOp{}, Split{});
    case GatedAct::kGeluAndMul:
      return f(ActAndMulOp<GeluErfFn>{}, Split{});
    case GatedAct::kGeluTanhAndMul:
      return f(ActAndMulOp<GeluTanhFn>{}, Split{});
    case GatedAct::kFatreluAndMul:
      return f(ActAndMulOp<FatreluFn>{FatreluFn{s.threshold}}, Split{});
    case GatedAct::kSwigluOaiAndMul:
      return f(SwigluOaiOp{s.alpha, s.limit}, Interleaved{});
    default:
      return cudaErrorInvalidValue;
  }
}

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (!aligned16(p)) return false;
  }
  return true;
}
bool all_strides_ok(std::initializer_list<int64_t> strides, int64_t rows, int vec) {
  for (int64_t s : strides) {
    if (!stride_ok(s, rows, vec)) return false;
  }
  return true;
}

// SM count and threads per SM of the current device, cached per device; zeros if the device
// cannot be queried (then neither resident_threads nor narrow_fits enables anything).
struct DeviceShape {
  int32_t sms;
  int32_t threads_per_sm;
};
DeviceShape device_shape() {
  constexpr int kMaxDevices = 64;
  static std::atomic<DeviceShape> cached[kMaxDevices] = {};  // {0, 0}: not queried yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return {};
  DeviceShape shape = cached[device].load(std::memory_order_relaxed);
  if (shape.sms == 0) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device) !=
            cudaSuccess) {
      return {};
    }
    shape = DeviceShape{sms, per_sm};
    cached[device].store(shape, std::memory_order_relaxed);
  }
  return shape;
}

// Threads resident on the current device at once (SMs x threads per SM).
int64_t resident_threads() {
  const DeviceShape shape = device_shape();
  return static_cast<int64_t>(shape.sms) * shape.threads_per_sm;
}

// Whether `items` thread items (vectors plus tail elements, all rows) of a narrow-vector launch
// take at most LaunchConfig::kNarrowMaxCtasPerSm CTAs per SM.
bool narrow_fits(int64_t items) {
  return items <= static_cast<int64_t>(device_shape().sms) * LaunchConfig::kThreads *
                      LaunchConfig::kNarrowMaxCtasPerSm;
}

// Elements per narrow vector (LaunchConfig::kNarrowVectorBytes) for 16-bit types; 0 for others,
// which always take 16-byte vectors.
template <typename T>
constexpr int kNarrowWidth =
    sizeof(T) == 2 ? LaunchConfig::kNarrowVectorBytes / static_cast<int>(sizeof(T)) : 0;

template <typename T, typename Op>
cudaError_t run_unary_fwd(const Op& op, const UnaryActFwdParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.n < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.n == 0) return cudaSuccess;
  int64_t rows = p.rows, n = p.n;
  if (rows > 1 && p.out_row_stride == n && p.input_row_stride == n) {
    n *= rows;  // both contiguous: one long row, so any width takes the vector path
    rows = 1;
  }
  constexpr int V = kVecWidth<T>;
  // fp64 keeps one vector: its long precise math spilled with two in flight.
  constexpr int kItems = sizeof(T) == 8 ? 1 : LaunchConfig::kUnaryFwdItems;
  const UnaryFwd<T, Op> f{static_cast<T*>(p.out), static_cast<const T*>(p.input), p.out_row_stride,
                          p.input_row_stride, op};
  if (all_aligned({p.out, p.input}) &&
      all_strides_ok({p.out_row_stride, p.input_row_stride}, rows, V)) {
    if constexpr (kNarrowWidth<T> > 0) {
      constexpr int kNarrow = kNarrowWidth<T>;
      const RowSpace narrow = make_space(rows, n, kNarrow);
      if (narrow_fits(rows * (narrow.vecs + narrow.tail))) {
        return launch<unary_act_fwd_kernel<kNarrow, 1, T, Op>, 1>(f, narrow, p.pdl_request, stream);
      }
    }
    const RowSpace space = make_space(rows, n, V);
    if constexpr (kItems != LaunchConfig::kUnaryFwdItemsOneWave) {
      if (rows * (space.vecs + space.tail) <= resident_threads()) {
        constexpr int kOne = LaunchConfig::kUnaryFwdItemsOneWave;
        return launch<unary_act_fwd_kernel<V, kOne, T, Op>, kOne>(f, space, p.pdl_request, stream);
      }
    }
    return launch<unary_act_fwd_kernel<V, kItems, T, Op>, kItems>(f, space, p.pdl_request, stream);
  }
  return launch<unary_act_fwd_kernel<1, kItems, T, Op>, kItems>(f, make_space(rows, n, 1),
                                                                p.pdl_request, stream);
}

template <typename T, typename Op>
cudaError_t run_unary_bwd(const Op& op, const UnaryActBwdParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.n < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.n == 0) return cudaSuccess;
  int64_t rows = p.rows, n = p.n;
  if (rows > 1 && p.grad_input_row_stride == n && p.grad_out_row_stride == n &&
      p.input_row_stride == n) {
    n *= rows;
    rows = 1;
  }
  constexpr int V = kVecWidth<T>;
  const UnaryBwd<T, Op> f{static_cast<T*>(p.grad_input),
                          static_cast<const T*>(p.grad_out),
                          static_cast<const T*>(p.input),
                          p.grad_input_row_stride,
                          p.grad_out_row_stride,
                          p.input_row_stride,
                          op};
  if (all_aligned({p.grad_input, p.grad_out, p.input}) &&
      all_strides_ok({p.grad_input_row_stride, p.grad_out_row_stride, p.input_row_stride}, rows,
                     V)) {
    return launch<unary_act_bwd_kernel<V, 1, T, Op>, 1>(f, make_space(rows, n, V), p.pdl_request,
                                                        stream);
  }
  return launch<unary_act_bwd_kernel<1, 1, T, Op>, 1>(f, make_space(rows, n, 1), p.pdl_request,
                                                      stream);
}

// Split layout: the second half of a row starts at d, so d must keep it aligned as well.
// Interleaved layout: output vector e reads input [2e, 2e + 2V), aligned for any d.
template <typename T, bool kInterleaved>
bool gated_d_ok(int64_t d) {
  return kInterleaved || d % kVecWidth<T> == 0;
}

template <typename T, bool kInterleaved, typename Op>
cudaError_t run_gated_fwd(const Op& op, const GatedActFwdParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.d < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.d == 0) return cudaSuccess;
  constexpr int V = kVecWidth<T>;
  const GatedFwd<T, Op, kInterleaved> f{static_cast<T*>(p.out),
                                        static_cast<const T*>(p.input),
                                        p.out_row_stride,
                                        p.input_row_stride,
                                        p.d,
                                        op};
  if (gated_d_ok<T, kInterleaved>(p.d) && all_aligned({p.out, p.input}) &&
      all_strides_ok({p.out_row_stride, p.input_row_stride}, p.rows, V)) {
    // 16-byte aligned rows and d are aligned for the narrow vectors as well.
    if constexpr (kNarrowWidth<T> > 0) {
      constexpr int kNarrow = kNarrowWidth<T>;
      const RowSpace narrow = make_space(p.rows, p.d, kNarrow);
      if (narrow_fits(p.rows * (narrow.vecs + narrow.tail))) {
        return launch<gated_act_fwd_kernel<kNarrow, 1, T, Op, kInterleaved>, 1>(
            f, narrow, p.pdl_request, stream);
      }
    }
    return launch<gated_act_fwd_kernel<V, 1, T, Op, kInterleaved>, 1>(f, make_space(p.rows, p.d, V),
                                                                      p.pdl_request, stream);
  }
  return launch<gated_act_fwd_kernel<1, 1, T, Op, kInterleaved>, 1>(f, make_space(p.rows, p.d, 1),
                                                                    p.pdl_request, stream);
}

template <typename T, bool kInterleaved, typename Op>
cudaError_t run_gated_bwd(const Op& op, const GatedActBwdParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.d < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.d == 0) return cudaSuccess;
  constexpr int V = kVecWidth<T>;
  const GatedBwd<T, Op, kInterleaved> f{static_cast<T*>(p.grad_input),
                                        static_cast<const T*>(p.grad_out),
                                        static_cast<const T*>(p.input),
                                        p.grad_input_row_stride,
                                        p.grad_out_row_stride,
                                        p.input_row_stride,
                                        p.d,
                                        op};
  if (gated_d_ok<T, kInterleaved>(p.d) && all_aligned({p.grad_input, p.grad_out, p.input}) &&
      all_strides_ok({p.grad_input_row_stride, p.grad_out_row_stride, p.input_row_stride}, p.rows,
                     V)) {
    return launch<gated_act_bwd_kernel<V, 1, T, Op, kInterleaved>, 1>(f, make_space(p.rows, p.d, V),
                                                                      p.pdl_request, stream);
  }
  return launch<gated_act_bwd_kernel<1, 1, T, Op, kInterleaved>, 1>(f, make_space(p.rows, p.d, 1),
                                                                    p.pdl_request, stream);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public launchers (activation_cuda.h). The dtype and the op are dispatched before the
// empty-shape check, so a bad enum value is reported even for an empty tensor.
// ---------------------------------------------------------------------------------------------
cudaError_t unary_act_fwd(UnaryAct act, DType dtype, const UnaryActFwdParams& params,
                          cudaStream_t stream) {
  return dispatch::floats_and_double(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_unary(act, [&](auto op) { return run_unary_fwd<T>(op, params, stream); });
  });
}

cudaError_t unary_act_bwd(UnaryAct act, DType dtype, const UnaryActBwdParams& params,
                          cudaStream_t stream) {
  return dispatch::floats_and_double(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_unary(act, [&](auto op) { return run_unary_bwd<T>(op, params, stream); });
  });
}

cudaError_t gated_act_fwd(GatedAct act, DType dtype, const GatedActFwdParams& params,
                          cudaStream_t stream) {
  return dispatch::floats_and_double(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_gated(act, params.scalars, [&](auto op, auto interleaved) {
      return run_gated_fwd<T, decltype(interleaved)::value>(op, params, stream);
    });
  });
}

cudaError_t gated_act_bwd(GatedAct act, DType dtype, const GatedActBwdParams& params,
                          cudaStream_t stream) {
  return dispatch::floats_and_double(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_gated(act, params.scalars, [&](auto op, auto interleaved) {
      return run_gated_bwd<T, decltype(interleaved)::value>(op, params, stream);
    });
  });
}

}  // namespace cuda
}  // namespace activation
