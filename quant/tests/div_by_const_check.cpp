// div_by_const_check.cpp: quant_math.h's div_by_const against the IEEE division, bit for bit,
// and the int8 / fp8 values quantized from both; div_by_const_bounded likewise wherever the
// kernels use it (bit for bit in the fast range, the same quantized values below it); and
// add_azp_sat (the kernels' 32-bit zero point add) against int8_rn_azp_sat, the reference rule.
// Built and run by test_quant_division_library.py (g++ -O2 -ffp-contract=off, so the compiler
// adds no FMA of its own and fmaf is a true FMA).
//
//   div_by_const_check [scales] [random pairs] [x mantissas]
//
// Divisors: the scales the ops compute (amax / 448, amax / 127, (max - min) / 255, group scales
// with eps, the 1 / (448 * 512) floor, powers of two), random ones, the edges of the fast range
// and special values. Dividends: every bfloat16 and every float16 value (the real inputs), every
// float32 mantissa of one binade for a few divisors (within the fast range every step scales
// exactly with x, so the result for x * 2^k is the result for x times 2^k), random float32 bit
// patterns and special values. Exit status 1 on the first mismatches (printed), 0 otherwise.
// Built with -DCHECK_NAIVE_RECIPROCAL it checks RN(x * r) instead, which must fail (the checker
// can see an ulp).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "quant_math.h"

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// float16 bits -> float (exact).
float half_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

// float8_e4m3fn of an already clamped float: round to nearest even among the finite values
// (|v| <= 448 here), NaN -> 0x7f, the sign kept (also on zero).
uint8_t fp8_e4m3fn(float v) {
  // Code c in 0..126 has value c < 8 ? c * 2^-9 : (8 + c % 8) * 2^(c / 8 - 10), increasing with c.
  static const std::vector<double> values = [] {
    std::vector<double> t;
    for (int c = 0; c <= 126; ++c)
      t.push_back(c < 8 ? std::ldexp(c, -9) : std::ldexp(8 + c % 8, c / 8 - 10));
    return t;
  }();
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(v));
  const size_t hi = std::lower_bound(values.begin(), values.end(), a) - values.begin();
  if (hi == values.size()) return sign | 126;
  if (hi == 0) return sign;
  const double d_hi = values[hi] - a, d_lo = a - values[hi - 1];
  const size_t c = d_lo < d_hi ? hi - 1 : (d_hi < d_lo ? hi : (hi % 2 == 0 ? hi : hi - 1));
  return static_cast<uint8_t>(sign | c);
}

struct Checker {
  long checked = 0, fast = 0, mismatches = 0, quant_checked = 0, bounded_checked = 0,
       bounded_tiny = 0;

  void pair(float x, float s, float r) {
    const float want = x / s;
#if defined(CHECK_NAIVE_RECIPROCAL)
    const float got = r == r ? x * r : x / s;
#else
    const float got = quant::math::div_by_const(x, s, r);
#endif
    ++checked;
    const float a = std::fabs(x * r);
    if (a <= quant::math::kDivFastMax && (a >= quant::math::kDivFastMin || x == 0.0f)) ++fast;
    const bool same = to_bits(got) == to_bits(want) || (std::isnan(got) && std::isnan(want));
    if (!same && mismatches++ < 20) {
      std::printf("MISMATCH x=%a s=%a r=%a: div_by_const %a (0x%08x), x / s %a (0x%08x)\n", x, s, r,
                  got, to_bits(got), want, to_bits(want));
    }
    if (r == r && (std::isnan(x) || quant::math::quotients_bounded(std::fabs(x), r))) {
      bounded(x, s, r, a >= quant::math::kDivFastMin || x == 0.0f);
    }
  }

  // div_by_const_bounded where the kernels use it (x in a row or group whose largest |x| passes
  // quotients_bounded): x / s bit for bit where div_by_const_fast's test passes (`exact`), and
  // the same int8, int8 + zero point and fp8 values (sign of zero included) everywhere.
  void bounded(float x, float s, float r, bool exact) {
    const float want = x / s;
    const float got = quant::math::div_by_const_bounded(x, s, r);
    ++bounded_checked;
    const bool same = to_bits(got) == to_bits(want) || (std::isnan(got) && std::isnan(want));
    if (exact && !same && mismatches++ < 20) {
      std::printf("BOUNDED MISMATCH x=%a s=%a: %a, x / s %a\n", x, s, got, want);
    }
    if (!exact) {  // int8 from the result as it is, fp8 from it with the sign of x (as the kernels)
      ++bounded_tiny;
      quantized_pair(x, s, got, want, std::copysign(got, x), "BOUNDED");
    }
  }

  // The quantized values from both quotients: what the ops store.
  void quantized(float x, float s, float r) {
    const float got = quant::math::div_by_const(x, s, r);
    quantized_pair(x, s, got, x / s, got, "QUANTIZED");
  }

  // int8 and int8 + zero point from `got`, fp8 from `got_fp8`, against the same from `want`.
  void quantized_pair(float x, float s, float got, float want, float got_fp8, const char* what) {
    const int8_t i_want = quant::math::int8_rn_sat(want), i_got = quant::math::int8_rn_sat(got);
    const int8_t z_want = quant::math::int8_rn_azp_sat(want, -7);
    const int8_t z_got = quant::math::int8_rn_azp_sat(got, -7);
    const float lo = -quant::math::kFp8Max, hi = quant::math::kFp8Max;
    const uint8_t f_want = fp8_e4m3fn(quant::math::clamp_keep_nan(want, lo, hi));
    const uint8_t f_got = fp8_e4m3fn(quant::math::clamp_keep_nan(got_fp8, lo, hi));
    ++quant_checked;
    if ((i_want != i_got || z_want != z_got || f_want != f_got) && mismatches++ < 20) {
      std::printf("%s MISMATCH x=%a s=%a: int8 %d/%d azp %d/%d fp8 0x%02x/0x%02x\n", what, x, s,
                  i_got, i_want, z_got, z_want, f_got, f_want);
    }
  }
};

// cvt.rni.s32.f32 (__float2int_rn): round half even, saturate to int32, NaN -> 0.
int32_t sat32_rn(float v) {
  if (std::isnan(v)) return 0;
  const float f = std::nearbyint(v);
  return f >= 2147483648.0f ? INT32_MAX
                            : (f < -2147483648.0f ? INT32_MIN : static_cast<int32_t>(f));
}

// add_azp_sat(sat32_rn(v), azp_clamp(azp)), the kernels' int8 rounding with a zero point, against
// quant_math.h's reference rule int8_rn_azp_sat(v, azp), for zero points up to the int32 limits.
long check_azp_clamp(const std::vector<float>& values) {
  const int32_t azps[] = {INT32_MIN,
                          INT32_MIN + 1,
                          INT32_MIN + 127,
                          INT32_MIN + 128,
                          -1000,
                          -129,
                          -128,
                          -127,
                          -3,
                          0,
                          1,
                          127,
                          128,
                          1000,
                          INT32_MAX - 128,
                          INT32_MAX - 127,
                          INT32_MAX - 1,
                          INT32_MAX};
  long bad = 0;
  for (const int32_t azp : azps) {
    const quant::math::AzpClamp c = quant::math::azp_clamp(azp);
    for (const float v : values) {
      const int8_t got = quant::math::add_azp_sat(sat32_rn(v), c);
      const int8_t want = quant::math::int8_rn_azp_sat(v, azp);
      if (got != want && bad++ < 20) {
        std::printf("AZP MISMATCH v=%a azp=%d: %d, want %d\n", v, azp, got, want);
      }
    }
  }
  return bad;
}

std::vector<float> scales(std::mt19937_64& rng, int count) {
  using quant::math::kFp8Max;
  std::vector<float> s = {quant::math::kFp8MinScale, 1.0f, 1.5f, 3.0f, 7.0f, 127.0f, 255.0f, 448.0f,
                          1.0f / 127.0f, 1.0f / 255.0f, 1.0f / 448.0f, std::nextafter(1.0f, 2.0f),
                          std::nextafter(2.0f, 1.0f), std::nextafter(1.0f, 0.0f),
                          quant::math::kDivFastMin, quant::math::kDivFastMax,
                          std::nextafter(quant::math::kDivFastMin, 0.0f),
                          std::nextafter(quant::math::kDivFastMax, INFINITY),
                          std::nextafter(quant::math::kDivFastMin, 1.0f),
                          std::nextafter(quant::math::kDivFastMax, 0.0f), 1e-10f / kFp8Max,
                          // Outside the fast range: the IEEE division must be taken.
                          0.0f, -0.0f, -1.0f, -0.01f, 1e-40f, FLT_MIN, FLT_MAX, 1e30f, 1e-30f,
                          INFINITY, -INFINITY, NAN};
  for (int k = -60; k <= 60; k += 3) s.push_back(std::ldexp(1.0f, k));
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int i = 0; i < count; ++i) {
    // amax of bf16-ish activations: a float rounded to 8 significant bits, spread over decades.
    const float amax = from_bits(to_bits(std::ldexp(1.0f + unit(rng), -20 + i % 40)) & 0xffff0000u);
    const float mn = -amax * unit(rng);
    s.push_back(amax / kFp8Max);
    s.push_back(amax / 127.0f);
    s.push_back((amax - mn) / 255.0f);
    s.push_back(quant::math::per_token_fp8_scale(amax, nullptr));
    s.push_back(quant::math::group_fp8_scale(amax, 1e-10f, kFp8Max, false));
    s.push_back(quant::math::group_fp8_scale(amax, 1e-10f, kFp8Max, true));
    // A random positive normal float in the fast range.
    s.push_back(std::ldexp(from_bits(0x3f800000u | (bits(rng) & 0x7fffffu)), -50 + i % 100));
  }
  return s;
}

std::vector<float> specials() {
  return {0.0f,       -0.0f,    INFINITY, -INFINITY,      NAN,     -NAN,     FLT_MIN,   -FLT_MIN,
          FLT_MAX,    -FLT_MAX, 1e-45f,   -1e-45f,        1e-40f,  -1e-40f,  1e38f,     -1e38f,
          1e-38f,     0.5f,     -0.5f,    448.0f,         -448.0f, 127.5f,   -128.5f,   1e20f,
          -1e20f,     1e-20f,   -1e-20f,  0x1p-50f,       0x1p50f, -0x1p50f, 0x1p-100f, 0x1p100f,
          -0x1p-100f, 0x1p127f, 3.0f,     0x1.fffffep127f};
}

}  // namespace

int main(int argc, char** argv) {
  const int n_scales = argc > 1 ? std::atoi(argv[1]) : 40;
  const long n_random = argc > 2 ? std::atol(argv[2]) : 2000000;
  const int n_mantissa_scales = argc > 3 ? std::atoi(argv[3]) : 4;
  std::mt19937_64 rng(20261127);
  const std::vector<float> ss = scales(rng, n_scales);
  const std::vector<float> xs_special = specials();
  Checker c;

  std::vector<float> inputs;  // every bfloat16 and every float16 value, and the specials
  for (uint32_t h = 0; h < 0x10000u; ++h) inputs.push_back(from_bits(h << 16));
  for (uint32_t h = 0; h < 0x10000u; ++h) inputs.push_back(half_to_float(static_cast<uint16_t>(h)));
  inputs.insert(inputs.end(), xs_special.begin(), xs_special.end());
  for (const float s : ss) {
    const float r = quant::math::div_reciprocal(s);
    for (const float x : inputs) c.pair(x, s, r);
    for (uint32_t h = 0; h < 0x10000u; h += 7) c.quantized(from_bits(h << 16), s, r);
  }

  // Every float32 mantissa in [1, 2) against the divisors most likely to be hard: r exact
  // (powers of two), r rounded down or up by most (mantissas of s just above 1 and just below 2),
  // and the real scales at the front of the list.
  std::vector<float> hard = {1.0f, std::nextafter(1.0f, 2.0f), std::nextafter(2.0f, 1.0f), 3.0f,
                             1.0f / 448.0f};
  for (int i = 0; i < n_mantissa_scales && i < static_cast<int>(ss.size()); ++i) {
    hard.push_back(ss[i]);
  }
  for (const float s : hard) {
    const float r = quant::math::div_reciprocal(s);
    for (uint32_t m = 0; m < 0x800000u; ++m) c.pair(from_bits(0x3f800000u | m), s, r);
  }

  // Random float32 dividends (any bit pattern, and normal ones near 1) over random divisors.
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  std::uniform_int_distribution<size_t> pick(0, ss.size() - 1);
  for (long i = 0; i < n_random; ++i) {
    const float s = ss[pick(rng)];
    const float r = quant::math::div_reciprocal(s);
    const uint32_t b = bits(rng);
    c.pair(from_bits(b), s, r);
    c.pair(from_bits((b & 0x807fffffu) | ((100u + (b >> 23) % 56u) << 23)), s, r);
  }

  // Values around every int8 result and the int32 limits, and the specials.
  std::vector<float> azp_values = xs_special;
  for (int k = -300; k <= 300; ++k) azp_values.push_back(0.5f * static_cast<float>(k));
  for (const float big : {2147483520.0f, 2147483648.0f, 4294967296.0f, 3e9f, 1e10f}) {
    for (const float sign : {1.0f, -1.0f}) {
      for (const float x : {big, std::nextafter(big, 0.0f), std::nextafter(big, INFINITY)}) {
        azp_values.push_back(sign * x);
        azp_values.push_back(sign * x - 1e5f);
      }
    }
  }
  c.mismatches += check_azp_clamp(azp_values);

  std::printf(
      "div_by_const: %ld quotients (%ld on the fast path), %ld quantized, %ld bounded (%ld below "
      "the fast range), %zu divisors, %ld mismatches\n",
      c.checked, c.fast, c.quant_checked, c.bounded_checked, c.bounded_tiny, ss.size(),
      c.mismatches);
  return c.mismatches == 0 ? 0 : 1;
}
