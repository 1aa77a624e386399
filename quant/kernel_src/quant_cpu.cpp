// quant_cpu.cpp: the quantize ops on the CPU, one row at a time (scalar code: the CPU backend is
// the reference users and CI run, not a fast path).
//
// Every element is widened to fp32 exactly and goes through the rules of quant_math.h; fp8 is
// written with c10::Float8_e4m3fn (round to nearest even, what Tensor.to(float8_e4m3fn) uses).
#include "quant_cpu.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>

#include "quant_math.h"

namespace quant {
namespace cpu {
namespace {

// Element `i` of row `r` of the input, widened to fp32 (exact).
template <typename T>
float load(const Rows& m, int64_t r, int64_t i) {
  return static_cast<float>(static_cast<const T*>(m.input)[r * m.input_row_stride + i]);
}

// NaN becomes the positive fp8 NaN whatever its sign, as the GPUs' cvt.rn.satfinite gives it.
uint8_t fp8_bits(float v) { return v == v ? c10::Float8_e4m3fn(v).x : math::kFp8NanBits; }

uint8_t* out_row(const Rows& m, int64_t r) {
  return static_cast<uint8_t*>(m.out) + r * m.out_row_stride;
}

// Runs f(TypeTag) with the element type of `dtype`.
template <typename T>
struct Tag {
  using type = T;
};
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(Tag<float>{});
    case DType::kFloat16:
      return f(Tag<c10::Half>{});
    case DType::kBFloat16:
      return f(Tag<c10::BFloat16>{});
  }
  TORCH_CHECK(false, "quant (cpu): unknown input dtype ", static_cast<int>(dtype));
}

// max |x| over [begin, end) of row r; NaN is skipped (fmax), as on the GPU.
template <typename T>
float amax(const Rows& m, int64_t r, int64_t begin, int64_t end) {
  float a = 0.0f;
  for (int64_t i = begin; i < end; ++i) a = std::fmax(a, std::fabs(load<T>(m, r, i)));
  return a;
}

}  // namespace

void static_scaled_fp8_quant(DType dtype, const StaticFp8Params& p) {
  const float inv = 1.0f / *p.scale;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t r = 0; r < p.m.rows; ++r) {
      uint8_t* out = out_row(p.m, r);
      for (int64_t i = 0; i < p.m.hidden; ++i) {
        const float x = load<T>(p.m, r, i) * inv;
        out[i] = fp8_bits(math::clamp_keep_nan(x, -math::kFp8Max, math::kFp8Max));
      }
    }
  });
}

void dynamic_scaled_fp8_quant(DType dtype, const DynamicFp8Params& p) {
  float a = 0.0f;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t r = 0; r < p.m.rows; ++r) a = std::fmax(a, amax<T>(p.m, r, 0, p.m.hidden));
  });
  *p.scale = std::fmax(a / math::kFp8Max, math::kFp8MinScale);
  static_scaled_fp8_quant(dtype, StaticFp8Params{p.m, p.scale});
}

void dynamic_per_token_scaled_fp8_quant(DType dtype, const PerTokenFp8Params& p) {
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t r = 0; r < p.m.rows; ++r) {
      const float s = math::per_token_fp8_scale(amax<T>(p.m, r, 0, p.m.hidden), p.scale_ub);
      p.scale[r] = s;
      uint8_t* out = out_row(p.m, r);
      for (int64_t i = 0; i < p.m.hidden; ++i) {
        const float x = load<T>(p.m, r, i) / s;
        out[i] = fp8_bits(math::clamp_keep_nan(x, -math::kFp8Max, math::kFp8Max));
      }
    }
  });
}

void static_scaled_int8_quant(DType dtype, const StaticInt8Params& p) {
  const float s = *p.scale;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t r = 0; r < p.m.rows; ++r) {
      int8_t* out = reinterpret_cast<int8_t*>(out_row(p.m, r));
      for (int64_t i = 0; i < p.m.hidden; ++i) {
        const float x = load<T>(p.m, r, i) / s;
        out[i] = p.azp != nullptr ? math::int8_rn_azp_sat(x, *p.azp) : math::int8_rn_sat(x);
      }
    }
  });
}

void dynamic_scaled_int8_quant(DType dtype, const DynamicInt8Params& p) {
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t r = 0; r < p.m.rows; ++r) {
      int8_t* out = reinterpret_cast<int8_t*>(out_row(p.m, r));
      if (p.azp == nullptr) {
        const float a = amax<T>(p.m, r, 0, p.m.hidden);
        p.scale[r] = a / 127.0f;
        // vLLM multiplies by 127 / amax; an all-zero row (inf * 0) quantizes to 0.
        const float mul = a == 0.0f ? 0.0f : 127.0f / a;
        for (int64_t i = 0; i < p.m.hidden; ++i) {
          out[i] = math::int8_rn_sat(load<T>(p.m, r, i) * mul);
        }
      } else {
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t i = 0; i < p.m.hidden; ++i) {
          const float x = load<T>(p.m, r, i);
          mn = std::fmin(mn, x);
          mx = std::fmax(mx, x);
        }
        const math::AzpParams q = math::int8_azp_params(mn, mx);
        p.scale[r] = q.scale;
        p.azp[r] = q.azp;
        for (int64_t i = 0; i < p.m.hidden; ++i) {
          out[i] = q.scale == 0.0f ? static_cast<int8_t>(q.azp)
                                   : math::int8_rn_azp_sat(load<T>(p.m, r, i) / q.scale, q.azp);
        }
      }
    }
  });
}

void per_token_group_fp8_quant(DType dtype, const GroupFp8Params& p) {
  const int64_t groups = p.m.hidden / p.group_size;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t r = 0; r < p.m.rows; ++r) {
      uint8_t* out = out_row(p.m, r);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = g * p.group_size, end = begin + p.group_size;
        const float s =
            math::group_fp8_scale(amax<T>(p.m, r, begin, end), p.eps, p.fp8_max, p.scale_ue8m0);
        p.scale[r * p.scale_row_stride + g * p.scale_group_stride] = s;
        for (int64_t i = begin; i < end; ++i) {
          out[i] = fp8_bits(math::clamp_keep_nan(load<T>(p.m, r, i) / s, p.fp8_min, p.fp8_max));
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace quant
