// scaled_mm_cpu.cpp: the scaled GEMMs on the CPU (scaled_mm_cpu.h), the formulas of
// scaled_mm_params.h evaluated directly: the reference CPU users and CI run, fast enough for
// tests and small models (a 1024^3 int8 GEMM takes a fraction of a second).
//
// Work split: the output is cut into kTileM x kTileN tiles handed to at::parallel_for, which
// spreads them over ATen's OpenMP pool when this file is compiled with OpenMP and runs them in
// order otherwise (scripts/build.py passes no -fopenmp: 0.2 s for 1024^3 on one core). Each
// output element is one dot product
// of a row of A and a column of B, both contiguous along K:
// * int8: exact int32 products and sums (the loop vectorizes; K * 128 * 128 fits int32 for every
//   K below 2^17);
// * fp8: the tile's rows of A and columns of B are decoded to float32 once (a 256-entry table,
//   exact), then multiplied and summed in float32 with kLanes independent partial sums, which
//   the compiler vectorizes without reassociating anything.
// The epilogue (scales, zero points, bias, activation) runs in float32 in the documented order
// and rounds once to the output dtype.
#include "scaled_mm_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "quant_math.h"

namespace quant {
namespace cpu {
namespace {

// Output tile of one task: 32 rows of A and 32 columns of B (decoded to float32 for fp8:
// 256 * K bytes, 1 MiB for K = 4096) stay in L2 while the tile's 1024 dot products reread them.
constexpr int64_t kTileM = 32;
constexpr int64_t kTileN = 32;
// Independent float32 partial sums of an fp8 dot product (K is a multiple of 16).
constexpr int64_t kLanes = 16;
// Scale block of blockwise fp8 along K and N.
constexpr int64_t kBlock = 128;

// float8_e4m3fn bits -> float32, exact (NaN stays NaN).
const float* fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int bits = 0; bits < 256; ++bits) {
      t[bits] = static_cast<float>(
          c10::Float8_e4m3fn(static_cast<uint8_t>(bits), c10::Float8_e4m3fn::from_bits()));
    }
    return t;
  }();
  return table.data();
}

int32_t dot_int8(const int8_t* a, const int8_t* b, int64_t k) {
  int32_t sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
  return sum;
}

// sum_i a[i] * b[i] over k (a multiple of kLanes) in kLanes float32 partial sums.
float dot_f32(const float* a, const float* b, int64_t k) {
  float lanes[kLanes] = {};
  for (int64_t i = 0; i < k; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// Decodes `count` fp8 vectors of k elements, the i-th at src + i * ld, into dst (packed).
void decode_fp8(const uint8_t* src, int64_t ld, int64_t count, int64_t k, float* dst) {
  const float* table = fp8_table();
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < k; ++j) dst[i * k + j] = table[src[i * ld + j]];
  }
}

// Rows m0..m1 of A and columns n0..n1 of B (fp8) decoded to float32, each packed along K.
struct DecodedTile {
  std::vector<float> a_rows, b_cols;
  int64_t m0, n0, k;

  template <typename Params>
  DecodedTile(const Params& p, int64_t m0_, int64_t m1, int64_t n0_, int64_t n1)
      : a_rows((m1 - m0_) * p.k), b_cols((n1 - n0_) * p.k), m0(m0_), n0(n0_), k(p.k) {
    decode_fp8(static_cast<const uint8_t*>(p.a) + m0 * p.lda, p.lda, m1 - m0, k, a_rows.data());
    decode_fp8(static_cast<const uint8_t*>(p.b) + n0 * p.ldb, p.ldb, n1 - n0, k, b_cols.data());
  }
  // Row i of A and column j of B (output coordinates), from K offset `from`.
  const float* a(int64_t i, int64_t from = 0) const { return &a_rows[(i - m0) * k + from]; }
  const float* b(int64_t j, int64_t from = 0) const { return &b_cols[(j - n0) * k + from]; }
};

// Bias[n] widened to float32 (0 without a bias).
float bias_at(const void* bias, DType out_dtype, int64_t n) {
  if (bias == nullptr) return 0.0f;
  return out_dtype == DType::kFloat16
             ? static_cast<float>(static_cast<const c10::Half*>(bias)[n])
             : static_cast<float>(static_cast<const c10::BFloat16*>(bias)[n]);
}

// act(v + bias[n]) rounded once to the output dtype, stored at d[m * ldd + n].
void store(void* d, DType out_dtype, int64_t ldd, int64_t m, int64_t n, float v, const void* bias,
           Activation activation) {
  const float x = math::activate(activation, v + bias_at(bias, out_dtype, n));
  if (out_dtype == DType::kFloat16) {
    static_cast<c10::Half*>(d)[m * ldd + n] = c10::Half(x);
  } else {
    static_cast<c10::BFloat16*>(d)[m * ldd + n] = c10::BFloat16(x);
  }
}

// Runs tile(m0, m1, n0, n1) for every output tile, spread over the thread pool.
template <typename Tile>
void for_each_tile(int64_t m, int64_t n, const Tile& tile) {
  const int64_t tiles_m = (m + kTileM - 1) / kTileM;
  const int64_t tiles_n = (n + kTileN - 1) / kTileN;
  at::parallel_for(0, tiles_m * tiles_n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t m0 = (t / tiles_n) * kTileM, n0 = (t % tiles_n) * kTileN;
      tile(m0, std::min(m0 + kTileM, m), n0, std::min(n0 + kTileN, n));
    }
  });
}

// scale_a[m] * scale_b[n] * (dot - zp[m, n]) + bias[n] for one element (scaled_mm_params.h).
float scaled_value(const ScaledMmParams& p, int64_t m, int64_t n, float dot_minus_zp) {
  const float sa = p.scale_a[p.scale_a_per_row ? m : 0];
  const float sb = p.scale_b[p.scale_b_per_col ? n : 0];
  return sa * sb * dot_minus_zp;
}

void scaled_mm_int8(const ScaledMmParams& p) {
  const int8_t* a = static_cast<const int8_t*>(p.a);
  const int8_t* b = static_cast<const int8_t*>(p.b);
  for_each_tile(p.m, p.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = n0; j < n1; ++j) {
        const int64_t dot = dot_int8(a + i * p.lda, b + j * p.ldb, p.k);
        int64_t zp = 0;
        if (p.azp_adj != nullptr) {
          zp = p.azp != nullptr ? int64_t(p.azp[i]) * p.azp_adj[j] : int64_t(p.azp_adj[j]);
        }
        // The difference is exact in int64 and rounded once to float32.
        const float v = scaled_value(p, i, j, static_cast<float>(dot - zp));
        store(p.d, p.out_dtype, p.ldd, i, j, v, p.bias, p.activation);
      }
    }
  });
}

void scaled_mm_fp8(const ScaledMmParams& p) {
  for_each_tile(p.m, p.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const DecodedTile tile(p, m0, m1, n0, n1);
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = n0; j < n1; ++j) {
        const float dot = dot_f32(tile.a(i), tile.b(j), p.k);
        store(p.d, p.out_dtype, p.ldd, i, j, scaled_value(p, i, j, dot), p.bias, p.activation);
      }
    }
  });
}

}  // namespace

void scaled_mm(const ScaledMmParams& p) {
  switch (p.operand) {
    case GemmOperand::kInt8:
      return scaled_mm_int8(p);
    case GemmOperand::kFp8E4m3:
      return scaled_mm_fp8(p);
  }
  TORCH_CHECK(false, "cutlass_scaled_mm (cpu): unknown operand type ", static_cast<int>(p.operand));
}

void block_scaled_mm(const BlockScaledMmParams& p) {
  const int64_t kb_count = p.k / kBlock;
  for_each_tile(p.m, p.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const DecodedTile tile(p, m0, m1, n0, n1);
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = n0; j < n1; ++j) {
        const float* scale_b = p.scale_b + (j / kBlock) * kb_count;
        float acc = 0.0f;
        for (int64_t kb = 0; kb < kb_count; ++kb) {
          const float dot = dot_f32(tile.a(i, kb * kBlock), tile.b(j, kb * kBlock), kBlock);
          acc += p.scale_a[kb * p.m + i] * scale_b[kb] * dot;
        }
        store(p.d, p.out_dtype, p.ldd, i, j, acc, p.bias, p.activation);
      }
    }
  });
}

}  // namespace cpu
}  // namespace quant
