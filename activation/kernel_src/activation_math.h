// activation_math.h: scalar forward and derivative formulas of every activation in this kernel.
//
// One source of truth for the CPU and the CUDA implementation: each formula is written once,
// templated on the compute type T (float for fp32/fp16/bf16 data, double for fp64 data), and
// callable from host and device code. No Torch and no CUDA runtime headers.
//
// Formulas match the PyTorch / transformers definitions they replace:
//   silu(x)       = x * sigmoid(x)                                  (torch.nn.functional.silu)
//   gelu(x)       = 0.5 x (1 + erf(x / sqrt(2)))                    (F.gelu, approximate="none")
//   gelu_tanh(x)  = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (F.gelu, approximate="tanh")
//   gelu_new(x)   = same formula as gelu_tanh                        (transformers NewGELUActivation)
//   gelu_fast(x)  = 0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))  (FastGELUActivation)
//   gelu_quick(x) = x * sigmoid(1.702 x)                             (QuickGELUActivation)
//   fatrelu(x, t) = x > t ? x : 0                                    (MiniCPM-S, vLLM FatreluAndMul)
//   swigluoai(g, u; alpha, limit) = (clamp(u, -limit, limit) + 1) * gc * sigmoid(alpha * gc),
//                                   gc = min(g, limit)               (gpt-oss, vLLM SwigluOAIAndMul)
#pragma once

#include <math.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ACT_HD __host__ __device__ __forceinline__
#else
#define ACT_HD inline
#endif

namespace activation {

// Constants as written by PyTorch / transformers.
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kInvSqrt2 = 0.7071067811865476;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;   // 1 / sqrt(2 pi)
constexpr double kGeluCubic = 0.044715;
constexpr double kGeluFastScale = 0.7978845608;  // transformers FastGELUActivation literal
constexpr double kQuickGeluAlpha = 1.702;

// ---- precise math, overloaded for float and double (valid in host and device code) ----
ACT_HD float act_exp(float x) { return expf(x); }
ACT_HD double act_exp(double x) { return exp(x); }
ACT_HD float act_tanh(float x) { return tanhf(x); }
ACT_HD double act_tanh(double x) { return tanh(x); }
ACT_HD float act_erf(float x) { return erff(x); }
ACT_HD double act_erf(double x) { return erf(x); }

// Math policy: the primitive functions every formula below is written in. PreciseMath is the
// libm-accurate one (host and device). CUDA code may pass a faster policy for fp16/bf16 data,
// whose fp32 results are rounded to 8 or 11 significant bits anyway (activation_cuda.cu).
struct PreciseMath {
  template <typename T>
  static ACT_HD T exp(T x) {
    return act_exp(x);
  }
  // 1 + e^x, the denominator of the sigmoid (a fast policy may flush a subnormal e^x to zero:
  // the sum rounds to 1 either way).
  template <typename T>
  static ACT_HD T one_plus_exp(T x) {
    return T(1) + act_exp(x);
  }
  template <typename T>
  static ACT_HD T tanh(T x) {
    return act_tanh(x);
  }
  template <typename T>
  static ACT_HD T div(T a, T b) {
    return a / b;
  }
  // Standard normal CDF, Phi(x) = P(N(0, 1) <= x), PyTorch's way: 0.5 (1 + erf(x / sqrt 2)).
  template <typename T>
  static ACT_HD T normal_cdf(T x) {
    return T(0.5) * (T(1) + act_erf(x * T(kInvSqrt2)));
  }
};

template <typename T, typename M = PreciseMath>
ACT_HD T sigmoid(T x) {
  return M::div(T(1), M::one_plus_exp(-x));
}

// ---- forward formulas ----
template <typename T, typename M = PreciseMath>
ACT_HD T silu(T x) {
  return M::div(x, M::one_plus_exp(-x));
}

// x * Phi(x); with PreciseMath the same as 0.5 x (1 + erf(x / sqrt 2)): scaling by 0.5 is exact
// (short of subnormal results).
template <typename T, typename M = PreciseMath>
ACT_HD T gelu_erf(T x) {
  return x * M::normal_cdf(x);
}

template <typename T, typename M = PreciseMath>
ACT_HD T gelu_tanh(T x) {
  const T inner = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
  return T(0.5) * x * (T(1) + M::tanh(inner));
}

template <typename T, typename M = PreciseMath>
ACT_HD T gelu_fast(T x) {
  const T inner = T(kGeluFastScale) * x * (T(1) + T(kGeluCubic) * x * x);
  return T(0.5) * x * (T(1) + M::tanh(inner));
}

template <typename T, typename M = PreciseMath>
ACT_HD T gelu_quick(T x) {
  return x * sigmoid<T, M>(T(kQuickGeluAlpha) * x);
}

template <typename T, typename M = PreciseMath>
ACT_HD T fatrelu(T x, T threshold) {
  return x > threshold ? x : T(0);
}

template <typename T, typename M = PreciseMath>
ACT_HD T swigluoai(T gate, T up, T alpha, T limit) {
  const T g = gate < limit ? gate : limit;
  const T u = up < -limit ? -limit : (up > limit ? limit : up);
  return (u + T(1)) * g * sigmoid<T, M>(alpha * g);
}

// ---- derivatives d act / d x ----
template <typename T, typename M = PreciseMath>
ACT_HD T silu_grad(T x) {
  const T s = sigmoid<T, M>(x);
  return s * (T(1) + x * (T(1) - s));
}

template <typename T, typename M = PreciseMath>
ACT_HD T gelu_erf_grad(T x) {
  const T cdf = M::normal_cdf(x);
  const T pdf = T(kInvSqrt2Pi) * M::exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

template <typename T, typename M = PreciseMath>
ACT_HD T gelu_tanh_grad(T x) {
  const T x2 = x * x;
  const T t = M::tanh(T(kSqrt2OverPi) * (x + T(kGeluCubic) * x2 * x));
  const T dinner = T(kSqrt2OverPi) * (T(1) + T(3.0 * kGeluCubic) * x2);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner;
}

template <typename T, typename M = PreciseMath>
ACT_HD T gelu_fast_grad(T x) {
  const T x2 = x * x;
  const T t = M::tanh(T(kGeluFastScale) * x * (T(1) + T(kGeluCubic) * x2));
  const T dinner = T(kGeluFastScale) * (T(1) + T(3.0 * kGeluCubic) * x2);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner;
}

template <typename T, typename M = PreciseMath>
ACT_HD T gelu_quick_grad(T x) {
  const T s = sigmoid<T, M>(T(kQuickGeluAlpha) * x);
  return s + T(kQuickGeluAlpha) * x * s * (T(1) - s);
}

template <typename T, typename M = PreciseMath>
ACT_HD T fatrelu_grad(T x, T threshold) {
  return x > threshold ? T(1) : T(0);
}

// Partial derivatives of swigluoai. Clamp passes the gradient on the closed interval, as
// torch.clamp's backward does (gate <= limit; -limit <= up <= limit).
template <typename T, typename M = PreciseMath>
ACT_HD void swigluoai_grad(T gate, T up, T alpha, T limit, T* d_gate, T* d_up) {
  const T g = gate < limit ? gate : limit;
  const T u = up < -limit ? -limit : (up > limit ? limit : up);
  const T s = sigmoid<T, M>(alpha * g);
  const T glu = g * s;
  *d_gate = gate <= limit ? (u + T(1)) * (s + alpha * g * s * (T(1) - s)) : T(0);
  *d_up = (up >= -limit && up <= limit) ? glu : T(0);
}

}  // namespace activation
