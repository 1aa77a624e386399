// activation_cpu.cpp: CPU implementation of the activation ops declared in activation_cpu.h.
//
// Computes every forward and backward activation of activation_params.h on row-strided 2-D views
// (unit stride along the last dimension, any row stride). Data types: fp32, fp16 and bf16 (math in
// fp32, each result rounded once to the data type) and fp64 (math in fp64, so that float64
// gradcheck tests the same code). The formulas come from activation_math.h, shared with CUDA.
//
// Work split: each row is cut into chunks of kChunk elements and the (row, chunk) pairs are spread
// over ATen's thread pool (at::parallel_for, so torch.set_num_threads applies), which keeps all
// threads busy both for many short rows (decode) and for a few very long rows. Inside a chunk,
// three flat loops run over contiguous buffers: convert to the compute type, apply the formula,
// convert back; the conversion loops vectorize, and so does the formula loop wherever the
// compiler has vector versions of the libm calls.
//
// Limits: input and output must not overlap (checked by the caller in torch-ext/).

#include "activation_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "activation_math.h"

namespace activation {
namespace cpu {
namespace {

// Elements per chunk: three compute-type buffers of this size (6 KiB for fp32) stay in L1.
constexpr int64_t kChunk = 512;
// Minimum number of elements one thread-pool task processes, so that tiny calls stay serial.
constexpr int64_t kGrainElems = 32768;

// fp64 data is computed in fp64; every other type in fp32.
template <typename scalar_t>
using compute_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// Calls f(scalar_t{}) for the element type of `dtype`.
template <typename F>
void dispatch_dtype(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      return;
    case DType::kFloat16:
      f(c10::Half{});
      return;
    case DType::kBFloat16:
      f(c10::BFloat16{});
      return;
    case DType::kFloat64:
      f(double{});
      return;
    default:
      TORCH_CHECK(false, op, ": unsupported DType value ", static_cast<int>(dtype));
  }
}

// ---- activation functors: each bundles the forward formula and its derivative ----

struct SiluFn {
  template <typename C>
  C fwd(C x) const {
    return silu(x);
  }
  template <typename C>
  C grad(C x) const {
    return silu_grad(x);
  }
};
struct GeluFn {
  template <typename C>
  C fwd(C x) const {
    return gelu_erf(x);
  }
  template <typename C>
  C grad(C x) const {
    return gelu_erf_grad(x);
  }
};
struct GeluTanhFn {  // also gelu_new: the same formula
  template <typename C>
  C fwd(C x) const {
    return gelu_tanh(x);
  }
  template <typename C>
  C grad(C x) const {
    return gelu_tanh_grad(x);
  }
};
struct GeluFastFn {
  template <typename C>
  C fwd(C x) const {
    return gelu_fast(x);
  }
  template <typename C>
  C grad(C x) const {
    return gelu_fast_grad(x);
  }
};
struct GeluQuickFn {
  template <typename C>
  C fwd(C x) const {
    return gelu_quick(x);
  }
  template <typename C>
  C grad(C x) const {
    return gelu_quick_grad(x);
  }
};

// Calls f(Fn{}) with the functor of `act`.
template <typename F>
void dispatch_unary(const char* op, UnaryAct act, F&& f) {
  switch (act) {
    case UnaryAct::kSilu:
      f(SiluFn{});
      return;
    case UnaryAct::kGelu:
      f(GeluFn{});
      return;
    case UnaryAct::kGeluTanh:
    case UnaryAct::kGeluNew:
      f(GeluTanhFn{});
      return;
    case UnaryAct::kGeluFast:
      f(GeluFastFn{});
      return;
    case UnaryAct::kGeluQuick:
      f(GeluQuickFn{});
      return;
    default:
      TORCH_CHECK(false, op, ": unsupported UnaryAct value ", static_cast<int>(act));
  }
}

// Gated functors see one (a, b) pair: for the split layout a = x[i], b = x[d + i]; for the
// interleaved layout (kInterleaved) a = x[2i], b = x[2i + 1]. bwd() returns both partial
// derivatives already multiplied by the incoming gradient g.
template <typename Act>
struct ActAndMulFn {  // act(a) * b
  static constexpr bool kInterleaved = false;
  template <typename C>
  C fwd(C a, C b) const {
    return Act{}.fwd(a) * b;
  }
  template <typename C>
  void bwd(C a, C b, C g, C* da, C* db) const {
    *da = g * Act{}.grad(a) * b;
    *db = g * Act{}.fwd(a);
  }
};
struct MulAndSiluFn {  // a * silu(b)
  static constexpr bool kInterleaved = false;
  template <typename C>
  C fwd(C a, C b) const {
    return a * silu(b);
  }
  template <typename C>
  void bwd(C a, C b, C g, C* da, C* db) const {
    *da = g * silu(b);
    *db = g * a * silu_grad(b);
  }
};
struct FatreluAndMulFn {  // fatrelu(a, threshold) * b
  static constexpr bool kInterleaved = false;
  float threshold;
  template <typename C>
  C fwd(C a, C b) const {
    return fatrelu(a, C(threshold)) * b;
  }
  template <typename C>
  void bwd(C a, C b, C g, C* da, C* db) const {
    *da = g * fatrelu_grad(a, C(threshold)) * b;
    *db = g * fatrelu(a, C(threshold));
  }
};
struct SwigluOaiAndMulFn {  // swigluoai(gate = a, up = b; alpha, limit), interleaved
  static constexpr bool kInterleaved = true;
  float alpha;
  float limit;
  template <typename C>
  C fwd(C a, C b) const {
    return swigluoai(a, b, C(alpha), C(limit));
  }
  template <typename C>
  void bwd(C a, C b, C g, C* da, C* db) const {
    C dgate, dup;
    swigluoai_grad(a, b, C(alpha), C(limit), &dgate, &dup);
    *da = g * dgate;
    *db = g * dup;
  }
};

// Calls f(Fn) with the functor of `act`, carrying the scalars it reads.
template <typename F>
void dispatch_gated(const char* op, GatedAct act, const GatedActScalars& s, F&& f) {
  switch (act) {
    case GatedAct::kSiluAndMul:
      f(ActAndMulFn<SiluFn>{});
      return;
    case GatedAct::kMulAndSilu:
      f(MulAndSiluFn{});
      return;
    case GatedAct::kGeluAndMul:
      f(ActAndMulFn<GeluFn>{});
      return;
    case GatedAct::kGeluTanhAndMul:
      f(ActAndMulFn<GeluTanhFn>{});
      return;
    case GatedAct::kFatreluAndMul:
      f(FatreluAndMulFn{s.threshold});
      return;
    case GatedAct::kSwigluOaiAndMul:
      f(SwigluOaiAndMulFn{s.alpha, s.limit});
      return;
    default:
      TORCH_CHECK(false, op, ": unsupported GatedAct value ", static_cast<int>(act));
  }
}

// ---- work split ----

// Runs body(row, begin, len) over every chunk [begin, begin + len) of every row of a
// rows x width problem, in parallel over (row, chunk) pairs.
template <typename Body>
void for_each_chunk(int64_t rows, int64_t width, const Body& body) {
  if (rows <= 0 || width <= 0) {
    return;
  }
  const int64_t chunks_per_row = (width + kChunk - 1) / kChunk;
  const int64_t chunk_elems = std::min(width, kChunk);
  const int64_t grain = std::max<int64_t>(1, kGrainElems / chunk_elems);
  at::parallel_for(0, rows * chunks_per_row, grain, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t row = t / chunks_per_row;
      const int64_t begin = (t % chunks_per_row) * kChunk;
      body(row, begin, std::min(kChunk, width - begin));
    }
  });
}

// Loads len elements src[0], src[step], ... into the compute buffer dst.
template <typename C, typename S>
inline void load(C* __restrict dst, const S* __restrict src, int64_t len, int64_t step) {
  if (step == 1) {
    for (int64_t k = 0; k < len; ++k) dst[k] = static_cast<C>(src[k]);
  } else {
    for (int64_t k = 0; k < len; ++k) dst[k] = static_cast<C>(src[k * step]);
  }
}

// Stores len compute values to dst[0], dst[step], ..., rounding once to S.
template <typename S, typename C>
inline void store(S* __restrict dst, const C* __restrict src, int64_t len, int64_t step) {
  if (step == 1) {
    for (int64_t k = 0; k < len; ++k) dst[k] = static_cast<S>(src[k]);
  } else {
    for (int64_t k = 0; k < len; ++k) dst[k * step] = static_cast<S>(src[k]);
  }
}

// ---- kernels ----

template <typename S, typename Fn>
void unary_fwd_kernel(const UnaryActFwdParams& p, Fn fn) {
  using C = compute_t<S>;
  auto* out = static_cast<S*>(p.out);
  const auto* in = static_cast<const S*>(p.input);
  for_each_chunk(p.rows, p.n, [&](int64_t row, int64_t begin, int64_t len) {
    C x[kChunk];
    load(x, in + row * p.input_row_stride + begin, len, 1);
    for (int64_t k = 0; k < len; ++k) x[k] = fn.fwd(x[k]);
    store(out + row * p.out_row_stride + begin, x, len, 1);
  });
}

template <typename S, typename Fn>
void unary_bwd_kernel(const UnaryActBwdParams& p, Fn fn) {
  using C = compute_t<S>;
  auto* grad_in = static_cast<S*>(p.grad_input);
  const auto* grad_out = static_cast<const S*>(p.grad_out);
  const auto* in = static_cast<const S*>(p.input);
  for_each_chunk(p.rows, p.n, [&](int64_t row, int64_t begin, int64_t len) {
    C x[kChunk];
    C g[kChunk];
    load(x, in + row * p.input_row_stride + begin, len, 1);
    load(g, grad_out + row * p.grad_out_row_stride + begin, len, 1);
    for (int64_t k = 0; k < len; ++k) x[k] = g[k] * fn.grad(x[k]);
    store(grad_in + row * p.grad_input_row_stride + begin, x, len, 1);
  });
}

// Offsets of the first a and b element of output column `begin`, and the step between
// consecutive columns, in an input row of width 2 * d.
template <typename Fn>
struct GatedLayout {
  int64_t a, b, step;
  GatedLayout(int64_t d, int64_t begin)
      : a(Fn::kInterleaved ? 2 * begin : begin),
        b(Fn::kInterleaved ? 2 * begin + 1 : d + begin),
        step(Fn::kInterleaved ? 2 : 1) {}
};

template <typename S, typename Fn>
void gated_fwd_kernel(const GatedActFwdParams& p, Fn fn) {
  using C = compute_t<S>;
  auto* out = static_cast<S*>(p.out);
  const auto* in = static_cast<const S*>(p.input);
  for_each_chunk(p.rows, p.d, [&](int64_t row, int64_t begin, int64_t len) {
    const GatedLayout<Fn> lay(p.d, begin);
    const S* x = in + row * p.input_row_stride;
    C a[kChunk];
    C b[kChunk];
    load(a, x + lay.a, len, lay.step);
    load(b, x + lay.b, len, lay.step);
    for (int64_t k = 0; k < len; ++k) a[k] = fn.fwd(a[k], b[k]);
    store(out + row * p.out_row_stride + begin, a, len, 1);
  });
}

template <typename S, typename Fn>
void gated_bwd_kernel(const GatedActBwdParams& p, Fn fn) {
  using C = compute_t<S>;
  auto* grad_in = static_cast<S*>(p.grad_input);
  const auto* grad_out = static_cast<const S*>(p.grad_out);
  const auto* in = static_cast<const S*>(p.input);
  for_each_chunk(p.rows, p.d, [&](int64_t row, int64_t begin, int64_t len) {
    const GatedLayout<Fn> lay(p.d, begin);
    const S* x = in + row * p.input_row_stride;
    S* gx = grad_in + row * p.grad_input_row_stride;
    C a[kChunk];
    C b[kChunk];
    C g[kChunk];
    load(a, x + lay.a, len, lay.step);
    load(b, x + lay.b, len, lay.step);
    load(g, grad_out + row * p.grad_out_row_stride + begin, len, 1);
    for (int64_t k = 0; k < len; ++k) {
      C da, db;
      fn.bwd(a[k], b[k], g[k], &da, &db);
      a[k] = da;
      b[k] = db;
    }
    store(gx + lay.a, a, len, lay.step);
    store(gx + lay.b, b, len, lay.step);
  });
}

}  // namespace

void unary_act_fwd(UnaryAct act, DType dtype, const UnaryActFwdParams& params) {
  constexpr const char* op = "activation::cpu::unary_act_fwd";
  dispatch_dtype(op, dtype, [&](auto tag) {
    using S = decltype(tag);
    dispatch_unary(op, act, [&](auto fn) { unary_fwd_kernel<S>(params, fn); });
  });
}

void unary_act_bwd(UnaryAct act, DType dtype, const UnaryActBwdParams& params) {
  constexpr const char* op = "activation::cpu::unary_act_bwd";
  dispatch_dtype(op, dtype, [&](auto tag) {
    using S = decltype(tag);
    dispatch_unary(op, act, [&](auto fn) { unary_bwd_kernel<S>(params, fn); });
  });
}

void gated_act_fwd(GatedAct act, DType dtype, const GatedActFwdParams& params) {
  constexpr const char* op = "activation::cpu::gated_act_fwd";
  dispatch_dtype(op, dtype, [&](auto tag) {
    using S = decltype(tag);
    dispatch_gated(op, act, params.scalars, [&](auto fn) { gated_fwd_kernel<S>(params, fn); });
  });
}

void gated_act_bwd(GatedAct act, DType dtype, const GatedActBwdParams& params) {
  constexpr const char* op = "activation::cpu::gated_act_bwd";
  dispatch_dtype(op, dtype, [&](auto tag) {
    using S = decltype(tag);
    dispatch_gated(op, act, params.scalars, [&](auto fn) { gated_bwd_kernel<S>(params, fn); });
  });
}

}  // namespace cpu
}  // namespace activation
