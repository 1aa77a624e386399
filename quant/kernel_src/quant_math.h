// quant_math.h: the rounding rules of the quantize ops and the activations of the scaled GEMM
// epilogue, shared by the CPU and CUDA implementations (host and device; no Torch or CUDA
// headers needed), so both round and activate alike.
//
// The rules are vLLM's (csrc/quantization/{fp8,compressed_tensors}): fp8 e4m3fn saturates, i.e.
// the value is clamped to [-448, 448] before the round-to-nearest-even conversion (NaN stays
// NaN); int8 rounds half to even (PTX cvt.rni, torch.round) and saturates to [-128, 127], NaN
// becoming 0 as cvt.rni.sat does. Only the fp8 conversion itself differs by backend (c10 on
// the CPU, cutlass::float_e4m3_t on the GPU; both round to nearest even).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "scaled_mm_params.h"

#if defined(__CUDACC__)
#define QUANT_HD __host__ __device__ __forceinline__
#else
#define QUANT_HD inline
#endif

namespace quant {
namespace math {

// Largest finite float8_e4m3fn.
constexpr float kFp8Max = 448.0f;
// The float8_e4m3fn NaN every NaN quantizes to (sign dropped: the GPU conversion's result).
constexpr uint8_t kFp8NanBits = 0x7f;
// vLLM's floor of dynamic fp8 scales, 1 / (448 * 512): an all-zero row or tensor gets a finite
// scale (its quantized values are 0) instead of a division by zero.
constexpr float kFp8MinScale = 1.0f / (448.0f * 512.0f);

// x clamped to [lo, hi]; NaN passes through (both comparisons are false).
QUANT_HD float clamp_keep_nan(float x, float lo, float hi) {
  return x > hi ? hi : (x < lo ? lo : x);
}

// round-half-even(v) saturated to [-128, 127]; NaN -> 0 (cvt.rni.sat.s8.f32).
QUANT_HD int8_t int8_rn_sat(float v) {
  if (!(v == v)) return 0;
  const float r = rintf(v);
  return static_cast<int8_t>(r >= 127.0f ? 127.0f : (r <= -128.0f ? -128.0f : r));
}

// sat8(sat32(round-half-even(v)) + azp); NaN -> azp (cvt.rni.sat.s32.f32 gives 0).
QUANT_HD int8_t int8_rn_azp_sat(float v, int32_t azp) {
  int64_t r = 0;
  if (v == v) {
    const float f = rintf(v);
    r = f >= 2147483648.0f ? INT64_C(2147483647)
                           : (f < -2147483648.0f ? INT64_C(-2147483648) : static_cast<int64_t>(f));
  }
  const int64_t q = r + azp;
  return static_cast<int8_t>(q > 127 ? 127 : (q < -128 ? -128 : q));
}

// ---- x / s, correctly rounded, for a divisor shared by a row, group or tensor ----
//
// The IEEE division is a long sequence per element on a GPU. With r = RN(1/s) computed once,
// q0 = RN(x * r) is within about an ulp of x / s, the remainder q0 * s - x is exact in one FMA,
// and one FMA correction rounds to RN(x / s) (Markstein's theorem), provided nothing underflows
// or overflows: s in [kDivFastMin, kDivFastMax] (div_reciprocal gives NaN otherwise) and |q0| in
// the same range, or x == ±0 (the sign comes out right for s > 0). Everything else (zero,
// subnormal, infinite or NaN operands, tiny or huge quotients) takes the IEEE division, so the
// result is always bit for bit x / s. tests/test_quant_division_library.py checks that on the CPU.
constexpr float kDivFastMin = 0x1p-50f;
constexpr float kDivFastMax = 0x1p50f;

// r for div_by_const: RN(1 / s) where the fast path is exact for s, NaN elsewhere.
QUANT_HD float div_reciprocal(float s) {
  return s >= kDivFastMin && s <= kDivFastMax ? 1.0f / s : NAN;
}

// x / s from r = div_reciprocal(s) in three FMA-pipe operations; `exact` is cleared (and the
// result is then meaningless) where that may differ from the IEEE x / s. Kernels test `exact`
// once per vector of elements, div_by_const once per element.
QUANT_HD float div_by_const_fast(float x, float s, float r, bool& exact) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(x, r);  // never contracted into an FMA
#else
  const float q0 = x * r;
#endif
  const float e = fmaf(q0, s, -x);  // q0 * s - x, exact (not x - q0 * s: keeps -0 / s == -0)
  const float a = fabsf(q0);        // NaN when r is (s outside the fast range): not exact
  exact &= (a <= kDivFastMax) & ((a >= kDivFastMin) | (x == 0.0f));
  return fmaf(-e, r, q0);
}

// x / s for the quantize ops where every |x| of the row or group is known to satisfy
// |x| * r <= kDivFastMax (quotients_bounded, checked once on its largest |x|; NaN elements may be
// there too) and r = div_reciprocal(s) is a number: div_by_const_fast without its per-element
// test. Where that test fails, x != 0 and |q0| < kDivFastMin: x / s and the result here are
// both below 2^-49 in magnitude and quantize to 0 in int8, and to the zero of x's sign in fp8
// once the sign of x is copied onto the result (fp8 callers do). Elsewhere the result is x / s
// bit for bit; NaN stays NaN. tests/div_by_const_check.cpp compares the quantized values.
QUANT_HD float div_by_const_bounded(float x, float s, float r) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(x, r);
#else
  const float q0 = x * r;
#endif
  const float e = fmaf(q0, s, -x);
  return fmaf(-e, r, q0);
}

// Whether div_by_const_bounded serves a row or group whose largest |x| is amax (false when r is
// NaN, i.e. s is outside the fast range, or amax is infinite).
QUANT_HD bool quotients_bounded(float amax, float r) { return amax * r <= kDivFastMax; }

// x / s (IEEE, round to nearest even) given r = div_reciprocal(s).
QUANT_HD float div_by_const(float x, float s, float r) {
  bool exact = true;
  const float q = div_by_const_fast(x, s, r, exact);
  return exact ? q : x / s;
}

// sat8(r + azp) for an int32 r, as clamp(r, lo, hi) + azp with lo = -128 - azp and hi = 127 - azp
// (clamping commutes with the shift) brought into int32 once per zero point: two 32-bit min/max
// and an add per element instead of a 64-bit add and clamp. The sum is in [-128, 127], so the
// wrapping 32-bit add is exact.
struct AzpClamp {
  int32_t lo, hi, azp;
};
QUANT_HD AzpClamp azp_clamp(int32_t azp) {
  const int64_t lo = -128 - static_cast<int64_t>(azp), hi = 127 - static_cast<int64_t>(azp);
  return {static_cast<int32_t>(lo < INT32_MIN ? INT32_MIN : lo),
          static_cast<int32_t>(hi > INT32_MAX ? INT32_MAX : hi), azp};
}
QUANT_HD int8_t add_azp_sat(int32_t r, const AzpClamp& c) {
  // max, then min (lo <= hi): two integer min / max instructions on the GPU.
  const int32_t floor = r < c.lo ? c.lo : r;
  const int32_t k = floor > c.hi ? c.hi : floor;
  return static_cast<int8_t>(static_cast<uint32_t>(k) + static_cast<uint32_t>(c.azp));
}

// The smallest power of two >= max(s, 1e-10): vLLM's exp2(ceil(log2(s))) for UE8M0 scales,
// exact through the float's bits (s > 0 and finite).
QUANT_HD float pow2_ceil(float s) {
  s = s > 1e-10f ? s : 1e-10f;
  uint32_t bits;
  memcpy(&bits, &s, sizeof(bits));
  if (bits & 0x007fffffu) bits = (bits & 0x7f800000u) + 0x00800000u;
  float r;
  memcpy(&r, &bits, sizeof(r));
  return r;
}

// Scale of dynamic per-token fp8: max(min(amax, *scale_ub) / 448, kFp8MinScale).
QUANT_HD float per_token_fp8_scale(float amax, const float* scale_ub) {
  const float a = scale_ub != nullptr ? fminf(amax, *scale_ub) : amax;
  return fmaxf(a / kFp8Max, kFp8MinScale);
}

// Scale of one fp8 group: max(amax, eps) / fp8_max, a power of two with ue8m0.
QUANT_HD float group_fp8_scale(float amax, float eps, float fp8_max, bool ue8m0) {
  const float s = fmaxf(amax, eps) / fp8_max;
  return ue8m0 ? pow2_ceil(s) : s;
}

// Asymmetric int8 parameters of a row with minimum mn and maximum mx. vLLM's rule,
// s = (mx - mn) / 255 and azp = rn(-128 - mn / s); a constant row (mx == mn) widens its range
// to include 0, and an all-zero row (or one without a number) gets s = 0 with azp = -128 (its
// values are all azp).
struct AzpParams {
  float scale;
  int32_t azp;
};
QUANT_HD AzpParams int8_azp_params(float mn, float mx) {
  if (!(mn <= mx)) {  // a row without a number (empty, or all NaN) quantizes like a zero row
    mn = 0.0f;
    mx = 0.0f;
  }
  if (mx == mn) {
    mn = fminf(mn, 0.0f);
    mx = fmaxf(mx, 0.0f);
  }
  const float s = (mx - mn) / 255.0f;
  if (s == 0.0f) return {0.0f, -128};
  const float z = rintf(-128.0f - mn / s);
  // A row far from 0 has a zero point outside int32: saturate it (NaN, from infinities, -> 0).
  const int64_t zi = !(z == z)            ? 0
                     : z >= 2147483648.0f ? INT64_C(2147483647)
                     : z < -2147483648.0f ? INT64_C(-2147483648)
                                          : static_cast<int64_t>(z);
  return {s, static_cast<int32_t>(zi)};
}

// ---- activations of the scaled GEMM epilogue (scaled_mm_params.h, Activation) ----
//
// The formulas of PyTorch's GELU (approximate="none" and "tanh") and SiLU, in float32.

// 0.5 * x * (1 + erf(x / sqrt(2)))
QUANT_HD float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
QUANT_HD float gelu_tanh(float x) {
  const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

// x / (1 + exp(-x)): x * sigmoid(x)
QUANT_HD float silu(float x) { return x / (1.0f + expf(-x)); }

QUANT_HD float activate(Activation activation, float x) {
  switch (activation) {
    case Activation::kGelu:
      return gelu_erf(x);
    case Activation::kGeluTanh:
      return gelu_tanh(x);
    case Activation::kSilu:
      return silu(x);
    case Activation::kNone:
    default:
      return x;
  }
}

}  // namespace math
}  // namespace quant
