// scaled_mm_sm90_activation.cuh: the activations of the Hopper epilogues (ScaledMmParams'
// `activation`, a run-time argument).
//
// The kind is switched on once per fragment, each case a branch-free loop, and SiLU and the tanh
// GELU use the hardware exp2 and reciprocal (a few float ulps off, far below the bf16 / fp16
// output's rounding); exact GELU keeps erff. The earlier form, expf, an IEEE division and a
// switch per element, made the fused epilogue 1.5-3x slower than the GEMM alone (H200,
// benchmarks/NOTES.md).
#pragma once

#include <type_traits>

#include "quant_math.h"
#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm90 {

// x * sigmoid(x). For x < -87 the exponential overflows and the quotient is -0.
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

// 0.5 * x * (1 + tanh(u)) written as x * sigmoid(2u), u = sqrt(2 / pi) * (x + 0.044715 x^3):
// the same function without the cancellation of 1 + tanh(u) for negative x.
__device__ __forceinline__ float gelu_tanh_fast(float x) {
  const float two_u = 1.5957691216057308f * (x + 0.044715f * x * x * x);
  return __fdividef(x, 1.0f + __expf(-two_u));
}

template <Activation kKind>
using ActivationTag = std::integral_constant<Activation, kKind>;

template <Activation kKind>
__device__ __forceinline__ float activate(ActivationTag<kKind>, float x) {
  if constexpr (kKind == Activation::kSilu) {
    return silu_fast(x);
  } else if constexpr (kKind == Activation::kGeluTanh) {
    return gelu_tanh_fast(x);
  } else if constexpr (kKind == Activation::kGelu) {
    return math::gelu_erf(x);
  } else {
    return x;
  }
}

// Calls f(ActivationTag<kind>{}): one branch per kind around the caller's whole loop (in an
// epilogue), or one kernel instance per kind (in a launcher).
#pragma nv_exec_check_disable
template <class Fn>
__host__ __device__ __forceinline__ void with_activation(Activation kind, Fn&& f) {
  switch (kind) {
    case Activation::kSilu:
      f(ActivationTag<Activation::kSilu>{});
      break;
    case Activation::kGeluTanh:
      f(ActivationTag<Activation::kGeluTanh>{});
      break;
    case Activation::kGelu:
      f(ActivationTag<Activation::kGelu>{});
      break;
    default:
      f(ActivationTag<Activation::kNone>{});
      break;
  }
}

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
