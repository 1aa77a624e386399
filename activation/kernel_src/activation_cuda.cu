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
// not overlap outputs (they are read through the non-coherent read-only path).
// Builds for sm_75 .. sm_120; bf16 only goes through conversions (emulated on sm_75).
//
// Design (memory-bound ops: the goals are the device-to-device copy bandwidth for large shapes
// and a single short wave for decode-sized ones):
// - One flat index space over (row, vector column), so 1 token x 14336 and 32K tokens x 14336
//   both fill the GPU, and narrow rows leave no thread idle as a block-per-row scheme would.
//   A thread finds its first (row, column) with a host-precomputed 64-bit magic multiplier and
//   then steps by the grid size with two adds and a carry: no 64-bit division in the loop.
// - 16-byte vectors (8 x fp16/bf16, 4 x fp32, 2 x fp64) when every row start of every tensor is
//   16-byte aligned: aligned base pointers, row strides multiple of the vector width, and, for
//   the split layout, d multiple of it (the second half starts at d). When the width is not a
//   multiple of the vector width, the last elements of each row go through a second,
//   element-wise loop, keeping partial-vector code (and its registers) out of the hot loop.
//   Otherwise the same kernel body runs with VEC = 1, still coalesced. Contiguous unary tensors
//   are seen as one long row, so any shape vectorizes.
// - Each thread takes a few vectors per loop step, spaced one grid apart (coalesced), and
//   issues all of their loads before any math. Per-thread work is small (8-16 outputs) so that
//   registers stay under 64 without spills: occupancy, rather than long per-thread batches,
//   keeps 32-64 bytes per thread, ~48 KB per SM, in flight.
// - Grid = one loop step per thread (not a persistent grid): every thread issues its loads at
//   once and the block scheduler refills SMs as blocks retire. A persistent grid of one
//   resident wave, looping one vector per step, reached only 88% of Inductor's bandwidth on an
//   H200. The grid-stride loop remains for shapes beyond the 2^31 - 1 grid limit.
// - Streaming hints: inputs are read once through ld.global.nc.L1::no_allocate (read-only path,
//   no L1 allocation); outputs are written with st.global.cs (evict-first) as this kernel never
//   reads them back.
// - Math: the activation_math.h formulas; fp32/fp64 with precise expf/erff/tanhf and IEEE
//   division, fp16/bf16 with hardware approximations whose error is far below their output
//   rounding (FastFloatMath below says why and by how much).
// - One grid loop for all ops; one kernel per family (unary fwd, unary bwd, gated fwd, gated
//   bwd), templated on the element type, the vector width and the op functor.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "activation_cuda.h"
#include "activation_math.h"
#include "activation_params.h"

namespace activation {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Launch configuration: the only place where the launch heuristics live.
// ---------------------------------------------------------------------------------------------
struct LaunchConfig {
  // 4 warps: a 1-token row of 14336 outputs (1792 bf16 vectors, 1 per thread in the gated
  // forward) spreads over 14 SMs.
  static constexpr int kThreads = 128;
  static constexpr int kVectorBytes = 16;
  // Outputs per thread per loop step, per family; the vector count follows from the vector
  // width, capped at kMaxItems. Gated fwd takes one 16-B vector per operand, as Inductor's
  // kernel does: on an H200 at 8192 x 2*14336 bf16, two vectors per thread cost silu_and_mul
  // 4% (170 vs 163 us); they only paid for erff-bound gelu_and_mul (205 vs 216 us), whose
  // normal CDF is now cheap (FastFloatMath). Fewer outputs per thread also shorten the
  // serial work of a decode-sized launch, where one warp per scheduler hides no latency. The
  // others keep the counts that were spill-free with the precise math.
  static constexpr int kUnaryFwdOutputs = 16;
  static constexpr int kUnaryBwdOutputs = 8;
  static constexpr int kGatedFwdOutputs = 8;
  static constexpr int kGatedBwdOutputs = 4;
  static constexpr int kMaxItems = 4;

  // Vectors of kVec elements per thread per step. fp64: one 16-B vector (two scalars on the
  // element-wise path); its math is several times longer and calls out-of-line division slow
  // paths, around which ptxas spilled when more values were live.
  template <typename T, int kVec> static constexpr int items(int outputs) {
    if (sizeof(T) == 8) return kVec == 1 ? 2 : 1;
    const int n = outputs / kVec;
    return n < 1 ? 1 : (n > kMaxItems ? kMaxItems : n);
  }
};

template <typename T>
constexpr int kVecWidth = LaunchConfig::kVectorBytes / static_cast<int>(sizeof(T));

// ---------------------------------------------------------------------------------------------
// Element types: compute type and conversions.
// ---------------------------------------------------------------------------------------------
template <typename T> struct ComputeType { using type = float; };
template <> struct ComputeType<double> { using type = double; };
template <typename T> using compute_t = typename ComputeType<T>::type;

__device__ __forceinline__ float to_compute(float x) { return x; }
__device__ __forceinline__ double to_compute(double x) { return x; }
__device__ __forceinline__ float to_compute(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_compute(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_compute(compute_t<T> x);
template <> __device__ __forceinline__ float from_compute<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_compute<double>(double x) { return x; }
template <> __device__ __forceinline__ __half from_compute<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_compute<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// kVec elements of T; 16-byte aligned when kVec = kVecWidth<T>.
template <typename T, int kVec> struct alignas(sizeof(T) * kVec) Vec {
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
// Global memory accesses with streaming hints. Inputs never alias outputs (launcher contract),
// so the read-only (.nc) path is valid, and the loads are not volatile so the compiler may
// schedule them early.
// ---------------------------------------------------------------------------------------------
template <int kBytes> struct RawBits;
template <> struct RawBits<2> { using type = unsigned short; };
template <> struct RawBits<4> { using type = unsigned int; };
template <> struct RawBits<8> { using type = unsigned long long; };
template <> struct RawBits<16> { using type = uint4; };

__device__ __forceinline__ void ld_raw(unsigned short& r, const void* p) {
  asm("ld.global.nc.L1::no_allocate.b16 %0, [%1];" : "=h"(r) : "l"(p));
}
__device__ __forceinline__ void ld_raw(unsigned int& r, const void* p) {
  asm("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(r) : "l"(p));
}
__device__ __forceinline__ void ld_raw(unsigned long long& r, const void* p) {
  asm("ld.global.nc.L1::no_allocate.b64 %0, [%1];" : "=l"(r) : "l"(p));
}
__device__ __forceinline__ void ld_raw(uint4& r, const void* p) {
  asm("ld.global.nc.L1::no_allocate.v4.b32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
}
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
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}

// One access of kVec elements at p, which must be aligned to sizeof(Vec<T, kVec>).
template <typename T, int kVec> __device__ __forceinline__ Vec<T, kVec> load_vec(const T* p) {
  using V = Vec<T, kVec>;
  typename RawBits<sizeof(V)>::type bits;
  ld_raw(bits, p);
  V v;
  memcpy(&v, &bits, sizeof(V));
  return v;
}
template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, kVec>& v) {
  typename RawBits<sizeof(v)>::type bits;
  memcpy(&bits, &v, sizeof(v));
  st_raw(p, bits);
}

// ---------------------------------------------------------------------------------------------
// Index space. Vector item i = row * vecs + col covers elements [col * kVec, col * kVec + kVec)
// of its row; tail item j = row * tail + t covers element tail_start + t (width % kVec != 0).
// ---------------------------------------------------------------------------------------------

// n / divisor for n < 2^63 with one 64-bit multiply-high: magic = floor(2^64 (2^s - d) / d) + 1,
// s = ceil(log2 d), q = (umulhi(n, magic) + n) >> s. This is the (N+1)-bit magic 2^64 + magic
// of Granlund & Montgomery (1994), exact for every n < 2^64; the sum cannot overflow for
// n < 2^63.
struct FastDiv64 {
  uint64_t divisor;
  uint64_t magic;
  unsigned shift;

  __device__ __forceinline__ uint64_t div(uint64_t n) const {
    return (__umul64hi(n, magic) + n) >> shift;
  }
};

FastDiv64 make_fast_div(uint64_t d) {  // 1 <= d < 2^62 here
  unsigned s = 0;
  while ((uint64_t(1) << s) < d) ++s;
  const unsigned __int128 num = static_cast<unsigned __int128>((uint64_t(1) << s) - d) << 64;
  return FastDiv64{d, static_cast<uint64_t>(num / d) + 1, s};
}

struct Space {
  int64_t rows;
  int64_t vecs;            // full vectors per row (may be 0)
  FastDiv64 vecs_div;      // divides by max(vecs, 1): a thread's first (row, col)
  // One grid-stride step of S = gridDim.x * kThreads items in (row, col): S / vecs rows and
  // S % vecs columns, set by launch() once the grid is known. Stepping costs a few adds where a
  // division per item would cost ~20 instructions (these kernels are near the issue limit for
  // the erf/tanh ops on an H200).
  int64_t step_rows;
  int64_t step_cols;
  uint64_t tail_total;     // rows * tail
  FastDiv64 tail_div;      // divides by max(tail, 1)
  int64_t tail_start;      // vecs * kVec
};

Space make_space(int64_t rows, int64_t width, int vec) {
  const int64_t vecs = width / vec;
  const int64_t tail = width - vecs * vec;
  Space s{};
  s.rows = rows;
  s.vecs = vecs;
  s.vecs_div = make_fast_div(static_cast<uint64_t>(vecs > 0 ? vecs : 1));
  s.tail_total = static_cast<uint64_t>(rows) * static_cast<uint64_t>(tail);
  s.tail_div = make_fast_div(static_cast<uint64_t>(tail > 0 ? tail : 1));
  s.tail_start = vecs * vec;
  return s;
}

// Items of the vector loop (full vectors) and of the tail loop (single elements).
uint64_t vector_items(const Space& s) {
  return static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(s.vecs);
}

struct Pos {
  int64_t row;
  int64_t col;
};

__device__ __forceinline__ Pos advance(Pos p, const Space& s) {
  p.row += s.step_rows;
  p.col += s.step_cols;
  if (p.col >= s.vecs) {
    p.col -= s.vecs;
    ++p.row;
  }
  return p;
}

// Thread t of S = gridDim.x * kThreads handles vector items t, t + S, t + 2S, ... (coalesced
// across the warp), kItems per step with all loads of a step issued before its math, then the
// tail elements t, t + S, ... The family F provides load<V>(row, elem) -> Frag<V> and
// finish<V>(frag, row, elem) (compute and store) for V = kVec and V = 1.
// Programmatic dependent launch (sm_90+; no-ops when the launch did not ask for it, and not
// compiled for older targets). The wait comes before any global memory access: a grid launched
// early by its predecessor must see all of the predecessor's writes, and must not overwrite
// what the predecessor may still read. Releasing dependents right after lets the next kernel
// (if it was launched with PDL too) get its blocks resident while this one runs, instead of
// paying its launch latency after this grid drains.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void release_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

template <int kVec, int kItems, typename F>
__device__ __forceinline__ void grid_loop(const F& f, const Space& s) {
  using Frag = typename F::template Frag<kVec>;
  wait_for_prerequisite_grid();
  release_dependent_grid();
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * LaunchConfig::kThreads + threadIdx.x;
  if (s.vecs > 0) {
    const int64_t row0 = static_cast<int64_t>(s.vecs_div.div(tid));
    Pos p{row0, static_cast<int64_t>(tid) - row0 * s.vecs};
    while (p.row < s.rows) {
      Frag frag[kItems];
      Pos at[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        at[k] = p;
        if (p.row < s.rows) frag[k] = f.template load<kVec>(p.row, p.col * kVec);
        p = advance(p, s);
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        if (at[k].row < s.rows) f.template finish<kVec>(frag[k], at[k].row, at[k].col * kVec);
      }
    }
  }
  if constexpr (kVec > 1) {
    const uint64_t stride = static_cast<uint64_t>(gridDim.x) * LaunchConfig::kThreads;
    for (uint64_t idx = tid; idx < s.tail_total; idx += stride) {
      const uint64_t r = s.tail_div.div(idx);
      const int64_t row = static_cast<int64_t>(r);
      const int64_t elem = s.tail_start + static_cast<int64_t>(idx - r * s.tail_div.divisor);
      f.template finish<1>(f.template load<1>(row, elem), row, elem);
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
// expf and IEEE division made silu_and_mul issue-bound on an H200 (190 us vs 168 us for
// fatrelu_and_mul, which has no transcendental, at 8192 x 2*14336 bf16). fp32 and fp64 data keep
// the precise policy.
//
// Phi (GELU's normal CDF): h = Phi(-|x|) = 2^q(|x|), q a degree-8 polynomial fitted for this
// file (weighted least squares for the absolute error of h on [0, 5.75]; h = 0 beyond, where
// Phi(-5.75) = 4.5e-9). Evaluated in fp32 it is within 7.7e-8 of Phi everywhere, and within ~1e-6
// relative on the small negative side, against 5.8e-8 absolute (and no relative bound) for
// 0.5 (1 + erff(x / sqrt 2)) in fp32, whose two-branch erff costs ~28 instructions where this is
// ~13. gelu_and_mul was issue-bound with erff (SM 70%, DRAM 65%, 82% of the copy bandwidth on an
// H200).
struct FastFloatMath {
  template <typename T> static __device__ __forceinline__ T exp(T x) { return __expf(x); }
  template <typename T> static __device__ __forceinline__ T tanh(T x) {
    return 1.0f - __fdividef(2.0f, __expf(2.0f * x) + 1.0f);  // saturates to +-1, no NaN
  }
  template <typename T> static __device__ __forceinline__ T div(T a, T b) { return __fdividef(a, b); }
  template <typename T> static __device__ __forceinline__ T normal_cdf(T x) {
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

template <typename T> struct MathFor { using type = PreciseMath; };
template <> struct MathFor<__half> { using type = FastFloatMath; };
template <> struct MathFor<__nv_bfloat16> { using type = FastFloatMath; };
template <typename T> using math_for = typename MathFor<T>::type;

struct SiluFn {
  template <typename M, typename C> __device__ __forceinline__ C fwd(C x) const { return silu<C, M>(x); }
  template <typename M, typename C> __device__ __forceinline__ C grad(C x) const { return silu_grad<C, M>(x); }
};
struct GeluErfFn {
  template <typename M, typename C> __device__ __forceinline__ C fwd(C x) const { return gelu_erf<C, M>(x); }
  template <typename M, typename C> __device__ __forceinline__ C grad(C x) const { return gelu_erf_grad<C, M>(x); }
};
struct GeluTanhFn {
  template <typename M, typename C> __device__ __forceinline__ C fwd(C x) const { return gelu_tanh<C, M>(x); }
  template <typename M, typename C> __device__ __forceinline__ C grad(C x) const { return gelu_tanh_grad<C, M>(x); }
};
struct GeluFastFn {
  template <typename M, typename C> __device__ __forceinline__ C fwd(C x) const { return gelu_fast<C, M>(x); }
  template <typename M, typename C> __device__ __forceinline__ C grad(C x) const { return gelu_fast_grad<C, M>(x); }
};
struct GeluQuickFn {
  template <typename M, typename C> __device__ __forceinline__ C fwd(C x) const { return gelu_quick<C, M>(x); }
  template <typename M, typename C> __device__ __forceinline__ C grad(C x) const { return gelu_quick_grad<C, M>(x); }
};
struct FatreluFn {
  float threshold;
  template <typename M, typename C> __device__ __forceinline__ C fwd(C x) const {
    return fatrelu<C, M>(x, C(threshold));
  }
  template <typename M, typename C> __device__ __forceinline__ C grad(C x) const {
    return fatrelu_grad<C, M>(x, C(threshold));
  }
};

// act(a) * b.
template <typename Act> struct ActAndMulOp {
  Act act;
  template <typename M, typename C> __device__ __forceinline__ C fwd(C a, C b) const {
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
  template <typename M, typename C> __device__ __forceinline__ C fwd(C a, C b) const {
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
  template <typename M, typename C> __device__ __forceinline__ C fwd(C a, C b) const {
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
template <typename T, typename Op> struct UnaryFwd {
  T* out;          // [rows, n]
  const T* x;      // [rows, n]
  int64_t out_stride;
  int64_t x_stride;
  Op op;

  template <int V> struct Frag {
    Vec<T, V> x;
  };
  template <int V> __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
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

template <typename T, typename Op> struct UnaryBwd {
  T* grad_in;          // [rows, n]
  const T* grad_out;   // [rows, n]
  const T* x;          // [rows, n]
  int64_t grad_in_stride;
  int64_t grad_out_stride;
  int64_t x_stride;
  Op op;

  template <int V> struct Frag {
    Vec<T, V> g, x;
  };
  template <int V> __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
    return Frag<V>{load_vec<T, V>(grad_out + row * grad_out_stride + e),
                   load_vec<T, V>(x + row * x_stride + e)};
  }
  template <int V>
  __device__ __forceinline__ void finish(const Frag<V>& f, int64_t row, int64_t e) const {
    compute_t<T> y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = to_compute(f.g.v[j]) * op.template grad<math_for<T>>(to_compute(f.x.v[j]));
    store_vec(grad_in + row * grad_in_stride + e, round_vec<T, V>(y));
  }
};

// Operands of V consecutive outputs starting at output element e, inside a [rows, 2d] row:
// split: a = [e, e + V), b = [d + e, d + e + V); interleaved: the 2V elements from 2e, the first
// V in vector A and the next V in vector B, pairs (gate, up) alternating across them.
template <bool kInterleaved, int V> struct GatedLayout {
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

template <typename T, typename Op, bool kInterleaved> struct GatedFwd {
  T* out;          // [rows, d]
  const T* in;     // [rows, 2d]
  int64_t out_stride;
  int64_t in_stride;
  int64_t d;
  Op op;

  template <int V> struct Frag {
    Vec<T, V> a, b;
  };
  template <int V> __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
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

template <typename T, typename Op, bool kInterleaved> struct GatedBwd {
  T* grad_in;          // [rows, 2d], same layout as in
  const T* grad_out;   // [rows, d]
  const T* in;         // [rows, 2d]
  int64_t grad_in_stride;
  int64_t grad_out_stride;
  int64_t in_stride;
  int64_t d;
  Op op;

  template <int V> struct Frag {
    Vec<T, V> g, a, b;
  };
  template <int V> __device__ __forceinline__ Frag<V> load(int64_t row, int64_t e) const {
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
    unary_act_fwd_kernel(const UnaryFwd<T, Op> f, const Space s) {
  grid_loop<kVec, kItems>(f, s);
}

template <int kVec, int kItems, typename T, typename Op>
__global__ void __launch_bounds__(LaunchConfig::kThreads)
    unary_act_bwd_kernel(const UnaryBwd<T, Op> f, const Space s) {
  grid_loop<kVec, kItems>(f, s);
}

template <int kVec, int kItems, typename T, typename Op, bool kInterleaved>
__global__ void __launch_bounds__(LaunchConfig::kThreads)
    gated_act_fwd_kernel(const GatedFwd<T, Op, kInterleaved> f, const Space s) {
  grid_loop<kVec, kItems>(f, s);
}

template <int kVec, int kItems, typename T, typename Op, bool kInterleaved>
__global__ void __launch_bounds__(LaunchConfig::kThreads)
    gated_act_bwd_kernel(const GatedBwd<T, Op, kInterleaved> f, const Space s) {
  grid_loop<kVec, kItems>(f, s);
}

// ---------------------------------------------------------------------------------------------
// Host side: alignment checks, grid sizing and dispatch.
// ---------------------------------------------------------------------------------------------

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % LaunchConfig::kVectorBytes == 0;
}

// A row stride keeps every row start aligned; irrelevant for a single row.
bool stride_ok(int64_t stride, int64_t rows, int vec) { return rows == 1 || stride % vec == 0; }

// Grid: one loop step per thread (kItems vectors), i.e. no persistent grid. Measured on an
// H200 (8192 x 2*14336 bf16 silu_and_mul): a persistent grid of SMs x resident blocks looping
// one vector per step reached 3.82 TB/s, against 4.35 TB/s for Inductor's one-tile-per-block
// kernel; with every thread issuing its loads at once, new blocks take over as old ones retire.
// The grid-stride loop remains for shapes beyond the grid limit.
constexpr uint64_t kMaxGrid = (uint64_t(1) << 31) - 1;

// Launch with programmatic dependent launch (PDL) on sm_90+ devices, unless the environment sets
// ACTIVATION_PDL=0 (read once per process). With PDL a decode-sized launch that follows another
// PDL kernel (ours, or e.g. flashinfer's) overlaps its launch with the predecessor's tail; after
// any other kernel it behaves as a plain launch. The capability is cached per device.
bool use_pdl() {
  static const bool enabled = [] {
    const char* env = std::getenv("ACTIVATION_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!enabled) return false;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> major_of[kMaxDevices] = {};  // 0: not queried yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  int major = major_of[device].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return false;
    major_of[device].store(major, std::memory_order_relaxed);
  }
  return major >= 9;
}

template <auto kKernel, int kItems, typename F>
cudaError_t launch(const F& family, Space space, cudaStream_t stream) {
  const uint64_t vec_items = vector_items(space);
  const uint64_t items = vec_items > space.tail_total ? vec_items : space.tail_total;
  const uint64_t per_block = static_cast<uint64_t>(LaunchConfig::kThreads) * kItems;
  const uint64_t wanted = (items + per_block - 1) / per_block;
  const uint64_t grid = wanted < kMaxGrid ? wanted : kMaxGrid;
  if (space.vecs > 0) {
    const int64_t stride = static_cast<int64_t>(grid) * LaunchConfig::kThreads;
    space.step_rows = stride / space.vecs;
    space.step_cols = stride % space.vecs;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(LaunchConfig::kThreads);
  config.stream = stream;
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  if (use_pdl()) {
    config.attrs = pdl;
    config.numAttrs = 1;
  }
  const cudaError_t err = cudaLaunchKernelEx(&config, kKernel, family, space);
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <typename T> struct TypeTag { using type = T; };

template <typename F> cudaError_t dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    case DType::kFloat64: return f(TypeTag<double>{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename F> cudaError_t dispatch_unary(UnaryAct act, F&& f) {
  switch (act) {
    case UnaryAct::kSilu: return f(SiluFn{});
    case UnaryAct::kGelu: return f(GeluErfFn{});
    case UnaryAct::kGeluTanh: return f(GeluTanhFn{});
    case UnaryAct::kGeluFast: return f(GeluFastFn{});
    case UnaryAct::kGeluNew: return f(GeluTanhFn{});  // transformers NewGELU: the tanh formula
    case UnaryAct::kGeluQuick: return f(GeluQuickFn{});
    default: return cudaErrorInvalidValue;
  }
}

// Calls f(op, std::bool_constant<interleaved>).
template <typename F>
cudaError_t dispatch_gated(GatedAct act, const GatedActScalars& s, F&& f) {
  using Split = std::false_type;
  using Interleaved = std::true_type;
  switch (act) {
    case GatedAct::kSiluAndMul: return f(ActAndMulOp<SiluFn>{}, Split{});
    case GatedAct::kMulAndSilu: return f(MulAndSiluOp{}, Split{});
    case GatedAct::kGeluAndMul: return f(ActAndMulOp<GeluErfFn>{}, Split{});
    case GatedAct::kGeluTanhAndMul: return f(ActAndMulOp<GeluTanhFn>{}, Split{});
    case GatedAct::kFatreluAndMul:
      return f(ActAndMulOp<FatreluFn>{FatreluFn{s.threshold}}, Split{});
    case GatedAct::kSwigluOaiAndMul: return f(SwigluOaiOp{s.alpha, s.limit}, Interleaved{});
    default: return cudaErrorInvalidValue;
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
  constexpr int kVecItems = LaunchConfig::items<T, V>(LaunchConfig::kUnaryFwdOutputs);
  constexpr int kScalarItems = LaunchConfig::items<T, 1>(LaunchConfig::kUnaryFwdOutputs);
  const UnaryFwd<T, Op> f{static_cast<T*>(p.out), static_cast<const T*>(p.input),
                          p.out_row_stride, p.input_row_stride, op};
  if (all_aligned({p.out, p.input}) &&
      all_strides_ok({p.out_row_stride, p.input_row_stride}, rows, V)) {
    return launch<unary_act_fwd_kernel<V, kVecItems, T, Op>, kVecItems>(
        f, make_space(rows, n, V), stream);
  }
  return launch<unary_act_fwd_kernel<1, kScalarItems, T, Op>, kScalarItems>(
      f, make_space(rows, n, 1), stream);
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
  constexpr int kVecItems = LaunchConfig::items<T, V>(LaunchConfig::kUnaryBwdOutputs);
  constexpr int kScalarItems = LaunchConfig::items<T, 1>(LaunchConfig::kUnaryBwdOutputs);
  const UnaryBwd<T, Op> f{static_cast<T*>(p.grad_input), static_cast<const T*>(p.grad_out),
                          static_cast<const T*>(p.input), p.grad_input_row_stride,
                          p.grad_out_row_stride, p.input_row_stride, op};
  if (all_aligned({p.grad_input, p.grad_out, p.input}) &&
      all_strides_ok({p.grad_input_row_stride, p.grad_out_row_stride, p.input_row_stride}, rows,
                     V)) {
    return launch<unary_act_bwd_kernel<V, kVecItems, T, Op>, kVecItems>(
        f, make_space(rows, n, V), stream);
  }
  return launch<unary_act_bwd_kernel<1, kScalarItems, T, Op>, kScalarItems>(
      f, make_space(rows, n, 1), stream);
}

// Split layout: the second half of a row starts at d, so d must keep it aligned as well.
// Interleaved layout: output vector e reads input [2e, 2e + 2V), aligned for any d.
template <typename T, bool kInterleaved> bool gated_d_ok(int64_t d) {
  return kInterleaved || d % kVecWidth<T> == 0;
}

template <typename T, bool kInterleaved, typename Op>
cudaError_t run_gated_fwd(const Op& op, const GatedActFwdParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.d < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.d == 0) return cudaSuccess;
  constexpr int V = kVecWidth<T>;
  constexpr int kVecItems = LaunchConfig::items<T, V>(LaunchConfig::kGatedFwdOutputs);
  constexpr int kScalarItems = LaunchConfig::items<T, 1>(LaunchConfig::kGatedFwdOutputs);
  const GatedFwd<T, Op, kInterleaved> f{static_cast<T*>(p.out), static_cast<const T*>(p.input),
                                        p.out_row_stride, p.input_row_stride, p.d, op};
  if (gated_d_ok<T, kInterleaved>(p.d) && all_aligned({p.out, p.input}) &&
      all_strides_ok({p.out_row_stride, p.input_row_stride}, p.rows, V)) {
    return launch<gated_act_fwd_kernel<V, kVecItems, T, Op, kInterleaved>, kVecItems>(
        f, make_space(p.rows, p.d, V), stream);
  }
  return launch<gated_act_fwd_kernel<1, kScalarItems, T, Op, kInterleaved>, kScalarItems>(
      f, make_space(p.rows, p.d, 1), stream);
}

template <typename T, bool kInterleaved, typename Op>
cudaError_t run_gated_bwd(const Op& op, const GatedActBwdParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.d < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.d == 0) return cudaSuccess;
  constexpr int V = kVecWidth<T>;
  constexpr int kVecItems = LaunchConfig::items<T, V>(LaunchConfig::kGatedBwdOutputs);
  constexpr int kScalarItems = LaunchConfig::items<T, 1>(LaunchConfig::kGatedBwdOutputs);
  const GatedBwd<T, Op, kInterleaved> f{
      static_cast<T*>(p.grad_input), static_cast<const T*>(p.grad_out),
      static_cast<const T*>(p.input), p.grad_input_row_stride, p.grad_out_row_stride,
      p.input_row_stride, p.d, op};
  if (gated_d_ok<T, kInterleaved>(p.d) && all_aligned({p.grad_input, p.grad_out, p.input}) &&
      all_strides_ok({p.grad_input_row_stride, p.grad_out_row_stride, p.input_row_stride},
                     p.rows, V)) {
    return launch<gated_act_bwd_kernel<V, kVecItems, T, Op, kInterleaved>, kVecItems>(
        f, make_space(p.rows, p.d, V), stream);
  }
  return launch<gated_act_bwd_kernel<1, kScalarItems, T, Op, kInterleaved>, kScalarItems>(
      f, make_space(p.rows, p.d, 1), stream);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public launchers (activation_cuda.h). The dtype and the op are dispatched before the
// empty-shape check, so a bad enum value is reported even for an empty tensor.
// ---------------------------------------------------------------------------------------------
cudaError_t unary_act_fwd(UnaryAct act, DType dtype, const UnaryActFwdParams& params,
                          cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_unary(act, [&](auto op) { return run_unary_fwd<T>(op, params, stream); });
  });
}

cudaError_t unary_act_bwd(UnaryAct act, DType dtype, const UnaryActBwdParams& params,
                          cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_unary(act, [&](auto op) { return run_unary_bwd<T>(op, params, stream); });
  });
}

cudaError_t gated_act_fwd(GatedAct act, DType dtype, const GatedActFwdParams& params,
                          cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_gated(act, params.scalars, [&](auto op, auto interleaved) {
      return run_gated_fwd<T, decltype(interleaved)::value>(op, params, stream);
    });
  });
}

cudaError_t gated_act_bwd(GatedAct act, DType dtype, const GatedActBwdParams& params,
                          cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return dispatch_gated(act, params.scalars, [&](auto op, auto interleaved) {
      return run_gated_bwd<T, decltype(interleaved)::value>(op, params, stream);
    });
  });
}

}  // namespace cuda
}  // namespace activation
