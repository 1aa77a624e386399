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
// * fp8, bfloat16, float16: the tile's rows of A and columns of B are decoded to float32 once
//   (fp8 by a 256-entry table; all exact), then multiplied and summed in float32 with kLanes independent partial sums, which
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

template <typename T>
void widen(const T* src, int64_t ld, int64_t count, int64_t k, float* dst) {
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < k; ++j) dst[i * k + j] = static_cast<float>(src[i * ld + j]);
  }
}

// Decodes `count` vectors of k elements of type `operand` (fp8 or 16-bit), the i-th at
// src + i * ld, into dst (packed, float32: exact for all three types).
void decode(GemmOperand operand, const void* src, int64_t ld, int64_t count, int64_t k,
            float* dst) {
  switch (operand) {
    case GemmOperand::kBFloat16:
      return widen(static_cast<const c10::BFloat16*>(src), ld, count, k, dst);
    case GemmOperand::kFloat16:
      return widen(static_cast<const c10::Half*>(src), ld, count, k, dst);
    default:
      break;
  }
  const float* table = fp8_table();
  const uint8_t* bytes = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t j = 0; j < k; ++j) dst[i * k + j] = table[bytes[i * ld + j]];
  }
}

// Vectors first..last of an operand (rows of A or columns of B) decoded to float32, each packed
// along K, read back by their index in the operand.
class DecodedVectors {
 public:
  DecodedVectors(GemmOperand operand, const void* base, int64_t ld, int64_t first, int64_t last,
                 int64_t k)
      : data_((last - first) * k), first_(first), k_(k) {
    const int64_t bytes = operand == GemmOperand::kFp8E4m3 ? 1 : 2;
    decode(operand, static_cast<const char*>(base) + first * ld * bytes, ld, last - first, k,
           data_.data());
  }
  // Vector i, from K offset `from`.
  const float* at(int64_t i, int64_t from = 0) const { return &data_[(i - first_) * k_ + from]; }

 private:
  std::vector<float> data_;
  int64_t first_, k_;
};

// Bias[n] widened to float32 (0 without a bias).
float bias_at(const void* bias, DType out_dtype, int64_t n) {
  if (bias == nullptr) return 0.0f;
  return out_dtype == DType::kFloat16
             ? static_cast<float>(static_cast<const c10::Half*>(bias)[n])
             : static_cast<float>(static_cast<const c10::BFloat16*>(bias)[n]);
}

// x rounded once to the output dtype, stored at d[m * ldd + n].
void store(void* d, DType out_dtype, int64_t ldd, int64_t m, int64_t n, float x) {
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

// scale_a[m] * scale_b[col] * (dot - zp) + bias[col] for column `col` of B (scaled_mm_params.h;
// a null scale reads as 1).
float scaled_value(const ScaledMmParams& p, int64_t m, int64_t col, float dot_minus_zp) {
  const float sa = p.scale_a == nullptr ? 1.0f : p.scale_a[p.scale_a_per_row ? m : 0];
  const float sb = p.scale_b == nullptr ? 1.0f : p.scale_b[p.scale_b_per_col ? col : 0];
  return sa * sb * dot_minus_zp + bias_at(p.bias, p.out_dtype, col);
}

// Column of the packed B holding the gate of output column n; its up is kGateBlock further.
int64_t gate_column(int64_t n) { return (n / kGateBlock) * 2 * kGateBlock + n % kGateBlock; }

// D[m, n] from the products of row m of A with the B column(s) of output column n: one column
// (dot_of(n)), or for the gated form the gate and up columns, act(g) * u.
template <typename DotOf>
void epilogue(const ScaledMmParams& p, int64_t m, int64_t n, const DotOf& dot_of) {
  float x;
  if (p.gated) {
    const int64_t gate = gate_column(n), up = gate + kGateBlock;
    x = math::activate(p.activation, scaled_value(p, m, gate, dot_of(gate))) *
        scaled_value(p, m, up, dot_of(up));
  } else {
    x = math::activate(p.activation, scaled_value(p, m, n, dot_of(n)));
  }
  store(p.d, p.out_dtype, p.ldd, m, n, x);
}

void scaled_mm_int8(const ScaledMmParams& p) {
  const int8_t* a = static_cast<const int8_t*>(p.a);
  const int8_t* b = static_cast<const int8_t*>(p.b);
  for_each_tile(p.m, p.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = n0; j < n1; ++j) {
        // The difference is exact in int64 and rounded once to float32.
        epilogue(p, i, j, [&](int64_t col) {
          const int64_t dot = dot_int8(a + i * p.lda, b + col * p.ldb, p.k);
          int64_t zp = 0;
          if (p.azp_adj != nullptr) {
            zp = p.azp != nullptr ? int64_t(p.azp[i]) * p.azp_adj[col] : int64_t(p.azp_adj[col]);
          }
          return static_cast<float>(dot - zp);
        });
      }
    }
  });
}

// fp8, bfloat16 and float16: the tile's rows of A and the B columns it reads decoded to float32
// once. A tile's output columns lie in one gate block (kTileN divides kGateBlock), so the gated
// form reads two runs of B columns, the gates and the ups.
void scaled_mm_float(const ScaledMmParams& p) {
  static_assert(kGateBlock % kTileN == 0, "a CPU tile must not straddle two gate blocks");
  for_each_tile(p.m, p.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const DecodedVectors a(p.operand, p.a, p.lda, m0, m1, p.k);
    const int64_t first = p.gated ? gate_column(n0) : n0;
    const int64_t last = p.gated ? gate_column(n1 - 1) + kGateBlock + 1 : n1;
    const DecodedVectors b(p.operand, p.b, p.ldb, first, last, p.k);
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = n0; j < n1; ++j) {
        epilogue(p, i, j, [&](int64_t col) { return dot_f32(a.at(i), b.at(col), p.k); });
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
    case GemmOperand::kBFloat16:
    case GemmOperand::kFloat16:
      return scaled_mm_float(p);
  }
  TORCH_CHECK(false, "cutlass_scaled_mm (cpu): unknown operand type ", static_cast<int>(p.operand));
}

void block_scaled_mm(const BlockScaledMmParams& p) {
  const int64_t kb_count = p.k / kBlock;
  for_each_tile(p.m, p.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const DecodedVectors a(GemmOperand::kFp8E4m3, p.a, p.lda, m0, m1, p.k);
    const DecodedVectors b(GemmOperand::kFp8E4m3, p.b, p.ldb, n0, n1, p.k);
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = n0; j < n1; ++j) {
        const float* scale_b = p.scale_b + (j / kBlock) * kb_count;
        float acc = 0.0f;
        for (int64_t kb = 0; kb < kb_count; ++kb) {
          const float dot = dot_f32(a.at(i, kb * kBlock), b.at(j, kb * kBlock), kBlock);
          acc += p.scale_a[kb * p.scale_a_ld + i] * scale_b[kb] * dot;
        }
        const float x = math::activate(p.activation, acc + bias_at(p.bias, p.out_dtype, j));
        store(p.d, p.out_dtype, p.ldd, i, j, x);
      }
    }
  });
}

}  // namespace cpu
}  // namespace quant
